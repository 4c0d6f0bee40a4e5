/*
 * fuzz_ring.c - libFuzzer target for the staging ring allocator (spec §6,
 * src/ring.c), checked op by op against a reference model written from the
 * spec in this file.
 *
 * Input: byte 0 picks the mode (bit 7: a ring near 2^64 bytes, so the live
 * byte count can overflow; otherwise 1..4096 bytes from bytes 1-2; bit 6:
 * also check that refused creates leave nothing), byte 3
 * max_live (1..64), then a sequence of ops, one opcode byte each followed by
 * its operands: assign(len), free(k-th live id), free(a stale, forged or
 * random id), ready(round, end) against the current watermark, and calls
 * with NULL arguments. After every op the ring's getters must equal the
 * model's, and the watermark must never decrease (lexicographically).
 *
 * The model: head, round, the live allocations (id, offset, round, len) in
 * assign order, and the watermark of the last restart. assign(n) checks
 * EINVAL (n == 0), EOVERSIZED (n > size), ERING_LIVE (max_live live),
 * ERANGE (live bytes would pass 2^64 - 1) in that order, then takes
 * [head, head+n) or wraps to offset 0 of round + 1. free(id) is KVS_ENOENT
 * unless id is live; the watermark is the oldest live (round, offset), or
 * after the last live one is freed the ring restarts: round + 1, head 0,
 * watermark (round, 0).
 *
 * Overlap: overcommit lets an allocation of round r overlap live ones of
 * older rounds (r - 1, and r - 2 or older too when the ring wraps twice
 * while an old region is held), never one of its own round. What keeps data
 * safe is readiness (kvs_ring_ready): an allocation that overlaps an older
 * live one must not be ready under the current watermark. Readiness only
 * changes when the watermark moves (a free), so the target checks a new
 * allocation against every live one, and after each free every allocation
 * that just became ready.
 */
#include <kvstage/kvstage.h>

#include "fuzz_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIVE 64u
#define STALE_IDS 16u
#define MAX_OPS 2048u

typedef struct model_alloc {
    uint64_t id, offset, round, len;
} model_alloc_t;

typedef struct model {
    uint64_t size, head, round;
    uint32_t max_live;
    kvs_watermark_t restart_wm; /* watermark when nothing is live */
    model_alloc_t live[MAX_LIVE]; /* assign order */
    uint32_t n;
    uint64_t stale[STALE_IDS]; /* ids freed earlier, never live again */
    uint32_t stale_n;
} model_t;

static kvs_watermark_t model_wm(const model_t *m)
{
    if (m->n == 0)
        return m->restart_wm;
    return (kvs_watermark_t){.round = m->live[0].round, .offset = m->live[0].offset};
}

static uint64_t model_live_bytes(const model_t *m)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < m->n; i++)
        sum += m->live[i].len; /* cannot wrap: the ring refuses that (ERANGE) */
    return sum;
}

static int wm_cmp(kvs_watermark_t a, kvs_watermark_t b)
{
    if (a.round != b.round)
        return a.round < b.round ? -1 : 1;
    if (a.offset != b.offset)
        return a.offset < b.offset ? -1 : 1;
    return 0;
}

/* spec §6, written out with the round-0 case first so r-1 never wraps. */
static bool model_ready(kvs_watermark_t wm, uint64_t round, uint64_t end)
{
    if (round == 0)
        return true;
    if (round - 1 < wm.round)
        return true;
    return round - 1 == wm.round && end <= wm.offset;
}

static bool overlaps(const model_alloc_t *a, const model_alloc_t *b)
{
    return a->offset < b->offset + b->len && b->offset < a->offset + a->len;
}

/* Allocation live[j] against every older live one: never the same round;
 * when it overlaps an older round's region it must not be ready. */
static void check_against_older(const model_t *m, uint32_t j)
{
    const model_alloc_t *y = &m->live[j];
    const bool ready = model_ready(model_wm(m), y->round, y->offset + y->len);
    for (uint32_t i = 0; i < j; i++) {
        const model_alloc_t *x = &m->live[i];
        CHECK(x->round <= y->round);
        if (!overlaps(x, y))
            continue;
        CHECK(x->round != y->round); /* never overlaps its own round */
        CHECK(!ready);               /* the prefill may not write over x yet */
    }
}

static void check_state(const kvs_ring_t *ring, const model_t *m, kvs_watermark_t *last_wm)
{
    kvs_watermark_t wm = kvs_ring_watermark(ring);
    kvs_watermark_t want = model_wm(m);
    CHECK(wm.round == want.round && wm.offset == want.offset);
    CHECK(wm_cmp(wm, *last_wm) >= 0); /* never decreases */
    *last_wm = wm;
    CHECK(kvs_ring_live_count(ring) == m->n);
    CHECK(kvs_ring_live_bytes(ring) == model_live_bytes(m));
    CHECK(kvs_ring_size_bytes(ring) == m->size);
}

static void remember_stale(model_t *m, uint64_t id)
{
    m->stale[m->stale_n % STALE_IDS] = id;
    m->stale_n++;
}

static int model_find(const model_t *m, uint64_t id)
{
    for (uint32_t i = 0; i < m->n; i++)
        if (m->live[i].id == id)
            return (int)i;
    return -1;
}

static void op_assign(kvs_ring_t *ring, model_t *m, uint64_t len)
{
    int want = KVS_OK;
    if (len == 0)
        want = KVS_EINVAL;
    else if (len > m->size)
        want = KVS_EOVERSIZED;
    else if (m->n == m->max_live)
        want = KVS_ERING_LIVE;
    else if ((unsigned __int128)model_live_bytes(m) + len > UINT64_MAX)
        want = KVS_ERANGE;

    kvs_ring_alloc_t a;
    memset(&a, 0, sizeof a);
    int rc = kvs_ring_assign(ring, len, &a);
    CHECK(rc == want);
    if (rc != KVS_OK)
        return; /* check_state verifies that nothing changed */

    uint64_t offset = m->head, round = m->round;
    if (len > m->size - m->head) { /* wrap */
        round++;
        offset = 0;
    }
    CHECK(a.offset == offset && a.round == round && a.end == offset + len);
    CHECK(a.end <= m->size);
    CHECK(a.id != 0 && model_find(m, a.id) < 0);
    m->round = round;
    m->head = offset + len;
    m->live[m->n++] = (model_alloc_t){.id = a.id, .offset = offset, .round = round, .len = len};
    check_against_older(m, m->n - 1);
}

/* Frees id: KVS_OK exactly when the model has it live, KVS_ENOENT otherwise. */
static void op_free(kvs_ring_t *ring, model_t *m, uint64_t id, bool want_wm)
{
    const int k = model_find(m, id);
    bool was_ready[MAX_LIVE];
    const kvs_watermark_t wm_before = model_wm(m);
    for (uint32_t i = 0; i < m->n; i++)
        was_ready[i] = model_ready(wm_before, m->live[i].round,
                                   m->live[i].offset + m->live[i].len);

    kvs_watermark_t wm_out = {.round = 0xDEAD, .offset = 0xBEEF};
    int rc = kvs_ring_free(ring, id, want_wm ? &wm_out : NULL);
    if (k < 0) {
        CHECK(rc == KVS_ENOENT);
        return;
    }
    CHECK(rc == KVS_OK);
    for (uint32_t i = (uint32_t)k; i + 1 < m->n; i++) {
        m->live[i] = m->live[i + 1];
        was_ready[i] = was_ready[i + 1];
    }
    m->n--;
    remember_stale(m, id);
    if (m->n == 0) { /* restart */
        m->round++;
        m->head = 0;
        m->restart_wm = (kvs_watermark_t){.round = m->round, .offset = 0};
    }
    const kvs_watermark_t wm = model_wm(m);
    if (want_wm)
        CHECK(wm_out.round == wm.round && wm_out.offset == wm.offset);
    for (uint32_t i = 0; i < m->n; i++) {
        const model_alloc_t *y = &m->live[i];
        if (!was_ready[i] && model_ready(wm, y->round, y->offset + y->len))
            check_against_older(m, i);
    }
}

/* An id that is not live (or, by chance, is: the model decides). */
static uint64_t garbage_id(const model_t *m, input_t *in)
{
    switch (in_u8(in) % 5u) {
    case 0:
        return m->stale_n ? m->stale[in_u8(in) % (m->stale_n < STALE_IDS ? m->stale_n
                                                                          : STALE_IDS)]
                          : 0;
    case 1:
        return 0;
    case 2: /* a live slot with a forged generation */
        if (m->n == 0)
            return in_u64(in);
        return m->live[in_u8(in) % m->n].id ^ ((uint64_t)(1u + in_u8(in)) << 32);
    case 3: /* a slot index past max_live */
        return ((uint64_t)1 << 32) | (m->max_live + (uint64_t)in_u8(in));
    default:
        return in_u64(in);
    }
}

static uint64_t pick_len(const model_t *m, input_t *in, bool huge)
{
    const uint8_t kind = in_u8(in);
    if (huge) {
        switch (kind % 4u) {
        case 0:
            return m->size - in_u16(in); /* near the whole ring */
        case 1:
            return (m->size >> 1) + in_u16(in);
        case 2:
            return in_u64(in);
        default:
            return in_u16(in);
        }
    }
    switch (kind % 8u) {
    case 0:
        return m->size; /* exactly the ring */
    case 1:
        return m->size + 1u + in_u8(in) % 4u; /* oversized */
    case 2:
        return 0;
    case 3:
        return m->size - m->head > 0 ? m->size - m->head : 1; /* exactly fills */
    default:
        return 1u + in_u16(in) % m->size;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_t in = {.p = data, .left = size};
    const uint8_t mode = in_u8(&in);
    const bool huge = (mode & 0x80u) != 0;
    model_t m;
    memset(&m, 0, sizeof m);
    const uint16_t size_bits = in_u16(&in);
    m.size = huge ? UINT64_MAX - size_bits : 1u + size_bits % 4096u;
    m.max_live = 1u + in_u8(&in) % MAX_LIVE;

    kvs_ring_t *ring = (kvs_ring_t *)1;
    if (mode & 0x40u) { /* refused creates leave *out NULL */
        CHECK(kvs_ring_create(0, m.max_live, &ring) == KVS_EINVAL && ring == NULL);
        CHECK(kvs_ring_create(m.size, 0, &ring) == KVS_EINVAL && ring == NULL);
        CHECK(kvs_ring_create(m.size, m.max_live, NULL) == KVS_EINVAL);
        kvs_ring_destroy(NULL);
    }
    CHECK(kvs_ring_create(m.size, m.max_live, &ring) == KVS_OK && ring != NULL);

    kvs_watermark_t last_wm = {0, 0};
    check_state(ring, &m, &last_wm);
    for (unsigned ops = 0; in.left > 0 && ops < MAX_OPS; ops++) {
        const uint8_t op = in_u8(&in);
        switch (op % 8u) {
        case 0:
        case 1:
        case 2:
            op_assign(ring, &m, pick_len(&m, &in, huge));
            break;
        case 3:
        case 4: { /* free the k-th live allocation (oldest first) */
            const uint8_t k = in_u8(&in);
            if (m.n > 0)
                op_free(ring, &m, m.live[k % m.n].id, (k & 0x80u) != 0);
            else
                op_free(ring, &m, garbage_id(&m, &in), true);
            break;
        }
        case 5:
            op_free(ring, &m, garbage_id(&m, &in), (op & 0x80u) != 0);
            break;
        case 6: { /* readiness of a (round, end) near the current state */
            const kvs_watermark_t wm = kvs_ring_watermark(ring);
            const uint8_t dr = in_u8(&in);
            uint64_t round = dr < 0x80u ? wm.round + (dr % 4u) : wm.round - (dr % 4u);
            if (dr == 0xFFu)
                round = in_u64(&in);
            uint64_t end = in_u16(&in);
            if (huge)
                end = m.size - end;
            CHECK(kvs_ring_ready(wm, round, end) == model_ready(wm, round, end));
            /* Monotone: ready now stays ready under any later watermark. */
            const kvs_watermark_t later = {.round = wm.round + (in_u8(&in) % 3u),
                                           .offset = wm.offset};
            if (model_ready(wm, round, end))
                CHECK(kvs_ring_ready(later, round, end));
            break;
        }
        default: { /* NULL arguments change nothing */
            kvs_ring_alloc_t a;
            CHECK(kvs_ring_assign(NULL, 1, &a) == KVS_EINVAL);
            CHECK(kvs_ring_assign(ring, 1, NULL) == KVS_EINVAL);
            CHECK(kvs_ring_free(NULL, m.n ? m.live[0].id : 1, NULL) == KVS_EINVAL);
            break;
        }
        }
        check_state(ring, &m, &last_wm);
    }
    kvs_ring_destroy(ring);
    return 0;
}
