/*
 * kvdata.c - the pattern of kvdata.h: a splitmix64 stream seeded from the
 * coordinates, 8 bytes per step. Two coordinates that differ in any field
 * give unrelated vectors, so a head or token landing in the wrong slot is
 * caught, not only missing bytes. Scale vectors (kv 2 and 3) take a
 * stream of their own. Aux payloads are vectors of the same
 * stream at layer -1, which no KV vector has. In the provenance mode the
 * origin of a byte stands for it (see kvdata.h).
 */
#include "kvdata.h"

#include <string.h>

static uint64_t sim_kvdata_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t sim_kvdata_seed(const sim_kv_coord_t *c)
{
    uint64_t s = sim_kvdata_mix(c->request + 0x9E3779B97F4A7C15ull);
    s = sim_kvdata_mix(s ^ (uint64_t)c->layer);
    s = sim_kvdata_mix(s ^ ((uint64_t)c->head << 1 | (uint64_t)(c->kv & 1)));
    if (c->kv >= 2) /* a scale vector: unrelated to its K or V row's */
        s = sim_kvdata_mix(s ^ 0x5CA1E5ull);
    return sim_kvdata_mix(s ^ (uint64_t)c->token);
}

void sim_kvdata_fill(uint8_t *dst, size_t len, const sim_kv_coord_t *c)
{
    uint64_t x = sim_kvdata_seed(c);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        x += 0x9E3779B97F4A7C15ull;
        const uint64_t v = sim_kvdata_mix(x);
        memcpy(dst + i, &v, 8);
    }
    if (i < len) {
        x += 0x9E3779B97F4A7C15ull;
        const uint64_t v = sim_kvdata_mix(x);
        memcpy(dst + i, &v, len - i);
    }
}

uint64_t sim_kvdata_check(const uint8_t *src, size_t len, const sim_kv_coord_t *c)
{
    uint8_t want[512];
    uint64_t bad = 0;
    uint64_t x = sim_kvdata_seed(c);
    for (size_t done = 0; done < len;) {
        const size_t n = len - done < sizeof want ? len - done : sizeof want;
        for (size_t i = 0; i < n; i += 8) {
            x += 0x9E3779B97F4A7C15ull;
            const uint64_t v = sim_kvdata_mix(x);
            memcpy(want + i, &v, n - i < 8 ? n - i : 8);
        }
        if (memcmp(src + done, want, n) != 0)
            for (size_t i = 0; i < n; i++)
                bad += src[done + i] != want[i];
        done += n;
    }
    return bad;
}

uint32_t sim_kvdata_aux_bytes(uint64_t request, uint32_t max)
{
    if (max == 0)
        return 0;
    const uint64_t h = sim_kvdata_mix(request ^ 0xA0A0F00DCAFEull);
    const uint32_t small = max < 256 ? max : 256;
    switch (request % 4) {
    case 0:
        return 0;
    case 1:
        return 1 + (uint32_t)(h % small);
    case 2:
        return max - (uint32_t)(h % ((uint64_t)max / 2 + 1));
    default:
        return max;
    }
}

static sim_kv_coord_t sim_kvdata_aux_coord(uint64_t request)
{
    return (sim_kv_coord_t){.request = request, .layer = -1};
}

void sim_kvdata_aux_fill(uint8_t *dst, size_t len, uint64_t request)
{
    const sim_kv_coord_t c = sim_kvdata_aux_coord(request);
    sim_kvdata_fill(dst, len, &c);
}

uint64_t sim_kvdata_aux_verify(uint64_t request, uint32_t max, const void *aux,
                               uint32_t aux_bytes, uint64_t *checked)
{
    const uint32_t want = sim_kvdata_aux_bytes(request, max);
    const uint32_t both = want < aux_bytes ? want : aux_bytes;
    uint64_t wrong = want > aux_bytes ? want - aux_bytes : aux_bytes - want;
    if (both > 0) {
        const sim_kv_coord_t c = sim_kvdata_aux_coord(request);
        wrong += aux != NULL ? sim_kvdata_check(aux, both, &c) : both;
    }
    *checked = want > aux_bytes ? want : aux_bytes;
    return wrong;
}

uint64_t sim_kvdata_prov_key(uint64_t request, int64_t layer, int kv)
{
    /* bit 31 marks scale planes (kv 2, 3); layers stay below 2^30 */
    return request << 32 | (uint64_t)(kv >> 1 & 1) << 31 | (uint64_t)layer << 1 |
           (uint64_t)(kv & 1);
}

sim_prov_run_t sim_kvdata_prov_rows(const sim_kv_coord_t *first, int64_t heads,
                                    int64_t tokens, int64_t total_heads, int64_t head_bytes,
                                    uint64_t addr)
{
    const uint64_t hb = (uint64_t)head_bytes;
    sim_prov_run_t r = {
        .addr = addr,
        .len_bytes = (uint64_t)tokens * (uint64_t)heads * hb,
        .key = sim_kvdata_prov_key(first->request, first->layer, first->kv),
        .off = ((uint64_t)first->token * (uint64_t)total_heads + (uint64_t)first->head) * hb,
        .row_bytes = (uint64_t)heads * hb,
        .stride = (uint64_t)total_heads * hb};
    sim_prov_canon(&r);
    return r;
}
