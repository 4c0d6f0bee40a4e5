/*
 * kv_compare.c - kvc_compare of kv_compare.h. Each side gets its own
 * allocations (addresses differ between backends), the same bytes and the
 * same page list; nothing here assumes device memory is host-visible.
 */
#include "kv_compare.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xorshift.h"

typedef struct kvc_pool {
    uint64_t k[KVC_MAX_LAYERS], v[KVC_MAX_LAYERS];
    uint64_t ks[KVC_MAX_LAYERS], vs[KVC_MAX_LAYERS]; /* scale buffers, or 0 */
    uint64_t stg;
} kvc_pool_t;

static int kvc_fail(char *msg, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int kvc_fail(char *msg, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, n, fmt, ap);
    va_end(ap);
    return -1;
}

kvc_shape_t kvc_random_shape(uint64_t *rng, int64_t max_pool_pages)
{
    static const int64_t page_sizes[] = {1, 3, 16, 32};
    static const int64_t head_dims[] = {1, 3, 36, 64, 100, 128};
    static const int64_t elems[] = {1, 2, 4};
    kvc_shape_t s;
    memset(&s, 0, sizeof s);
    s.page_size = page_sizes[xorshift_range(rng, 0, 3)];
    s.head_dim = head_dims[xorshift_range(rng, 0, 5)];
    s.elem_bytes = elems[xorshift_range(rng, 0, 2)];
    s.local_heads = xorshift_range(rng, 1, 8);
    s.num_heads = xorshift_range(rng, 1, s.local_heads);
    s.head_start = xorshift_range(rng, 0, s.local_heads - s.num_heads);
    s.pool_pages = xorshift_range(rng, 1, max_pool_pages);
    s.tokens = xorshift_range(rng, 0, s.pool_pages * s.page_size);
    s.pool_layers = xorshift_range(rng, 1, 4);
    s.layer_begin = xorshift_range(rng, 0, s.pool_layers - 1);
    s.layer_count = xorshift_range(rng, 0, s.pool_layers - s.layer_begin);
    s.slot_begin = xorshift_range(rng, 0, 2);
    s.slots = s.slot_begin + s.layer_count + xorshift_range(rng, 0, 2);
    s.parts = xorshift_range(rng, 0, 2) == 0 ? xorshift_range(rng, 1, s.num_heads) : 0;
    static const int64_t scales[] = {0, 0, 1, 4, 3};
    s.scale_bytes = scales[xorshift_range(rng, 0, 4)];
    return s;
}

static uint64_t kvc_head_bytes(const kvc_shape_t *sh)
{
    return (uint64_t)(sh->head_dim * sh->elem_bytes);
}

static uint64_t kvc_layer_bytes(const kvc_shape_t *sh)
{
    return (uint64_t)(sh->pool_pages * sh->page_size * sh->local_heads) * kvc_head_bytes(sh);
}

/* Bytes of one scale buffer (0 without scales). */
static uint64_t kvc_scale_layer_bytes(const kvc_shape_t *sh)
{
    return (uint64_t)(sh->pool_pages * sh->page_size * sh->local_heads * sh->scale_bytes);
}

/* A staging block: every slot's KV rows and, with scales, their scale rows. */
static uint64_t kvc_stg_bytes(const kvc_shape_t *sh)
{
    return (uint64_t)(sh->tokens * sh->num_heads * sh->slots * 2) *
           (kvc_head_bytes(sh) + (uint64_t)sh->scale_bytes);
}

static void kvc_pool_free(const kvc_side_t *s, const kvc_shape_t *sh, kvc_pool_t *p)
{
    for (int64_t l = 0; l < sh->pool_layers; l++) {
        if (p->k[l] != 0)
            (void)s->dev->ops.mem_free(s->dev, p->k[l]);
        if (p->v[l] != 0)
            (void)s->dev->ops.mem_free(s->dev, p->v[l]);
        if (p->ks[l] != 0)
            (void)s->dev->ops.mem_free(s->dev, p->ks[l]);
        if (p->vs[l] != 0)
            (void)s->dev->ops.mem_free(s->dev, p->vs[l]);
    }
    if (p->stg != 0)
        (void)s->dev->ops.mem_free(s->dev, p->stg);
    memset(p, 0, sizeof *p);
}

/* Allocates one side's pool and staging block and writes the same bytes
 * (layers from `layers`: K and V of layer l at 2l and 2l + 1, their scale
 * buffers at 2 * pool_layers + 2l and + 1; staging from `stg`). */
static int kvc_pool_make(const kvc_side_t *s, const kvc_shape_t *sh, kvc_pool_t *p,
                         uint8_t *const *layers, const uint8_t *stg, char *msg, size_t n)
{
    memset(p, 0, sizeof *p);
    kvs_device_t *d = s->dev;
    const uint64_t lb = kvc_layer_bytes(sh), sb = kvc_stg_bytes(sh);
    const uint64_t slb = kvc_scale_layer_bytes(sh);
    for (int64_t l = 0; l < sh->pool_layers; l++)
        for (int kv = 0; kv < (slb > 0 ? 4 : 2); kv++) {
            uint64_t *a = kv == 0 ? &p->k[l] : kv == 1 ? &p->v[l] : kv == 2 ? &p->ks[l]
                                                                          : &p->vs[l];
            const uint64_t len = kv < 2 ? lb : slb;
            int rc = d->ops.mem_alloc(d, len, a);
            if (rc == KVS_OK)
                rc = d->ops.mem_write(d, *a,
                                      layers[kv < 2 ? 2 * l + kv
                                                    : 2 * sh->pool_layers + 2 * l + kv - 2],
                                      len);
            if (rc != KVS_OK)
                return kvc_fail(msg, n, "%s: pool setup failed: %s (%s)", d->name,
                                kvs_status_name(rc), d->last_backend_msg);
        }
    int rc = d->ops.mem_alloc(d, sb > 0 ? sb : 1, &p->stg);
    if (rc == KVS_OK)
        rc = d->ops.mem_write(d, p->stg, stg, sb);
    if (rc != KVS_OK)
        return kvc_fail(msg, n, "%s: staging setup failed: %s (%s)", d->name,
                        kvs_status_name(rc), d->last_backend_msg);
    return 0;
}

static kvs_copy_desc_t kvc_desc(const kvc_shape_t *sh, const kvc_pool_t *p,
                                const int64_t *pages)
{
    return (kvs_copy_desc_t){
        .k_base = p->k,
        .v_base = sh->planes == 1 ? NULL : p->v, /* one plane: never read */
        .local_heads = sh->local_heads,
        .head_dim = sh->head_dim,
        .elem_bytes = sh->elem_bytes,
        .page_size = sh->page_size,
        .pages = pages,
        .num_pages = (sh->tokens + sh->page_size - 1) / sh->page_size,
        .tokens = sh->tokens,
        .head_start = sh->head_start,
        .num_heads = sh->num_heads,
        .layer_begin = sh->layer_begin,
        .layer_count = sh->layer_count,
        .staging_slot_begin = sh->slot_begin,
        .staging_layer_slots = sh->slots,
        .staging_addr = p->stg,
        .planes = sh->planes,
        .ks_base = sh->scale_bytes > 0 ? p->ks : NULL,
        .vs_base = sh->scale_bytes > 0 && sh->planes != 1 ? p->vs : NULL,
        .scale_bytes = sh->scale_bytes,
    };
}

/* The fused copy of sh->parts parts: part k holds heads [head_start + k *
 * num_heads / n, head_start + (k + 1) * num_heads / n) and the slice of the
 * staging block after the parts before it; listed last first when `reverse`. */
static int64_t kvc_parts(const kvc_shape_t *sh, const kvs_copy_desc_t *d, int reverse,
                         kvs_copy_part_t *out)
{
    const int64_t n = sh->parts, hb = (int64_t)kvc_head_bytes(sh);
    uint64_t off = 0;
    for (int64_t k = 0; k < n; k++) {
        const int64_t lo = sh->num_heads * k / n, hi = sh->num_heads * (k + 1) / n;
        out[reverse ? n - 1 - k : k] = (kvs_copy_part_t){
            .head_start = sh->head_start + lo, .num_heads = hi - lo,
            .staging_addr = d->staging_addr + off};
        off += (uint64_t)(sh->tokens * (hi - lo) * sh->slots * 2 * (hb + sh->scale_bytes));
    }
    return n;
}

/* Runs one copy (or the fused copy of sh->parts parts) on a side and waits
 * for it. */
static int kvc_run(const kvc_side_t *s, const kvc_shape_t *sh, const kvs_copy_desc_t *d,
                   int scatter, int reverse, char *msg, size_t n)
{
    kvs_device_t *dev = s->dev;
    kvs_event_t *ev = NULL;
    kvs_copy_part_t parts[KVC_MAX_PARTS];
    int rc;
    if (sh->parts > 0) {
        const int64_t np = kvc_parts(sh, d, reverse, parts);
        rc = scatter ? dev->ops.scatter_parts(dev, s->stream, d, parts, np)
                     : dev->ops.gather_parts(dev, s->stream, d, parts, np);
    } else {
        rc = scatter ? dev->ops.scatter(dev, s->stream, d) : dev->ops.gather(dev, s->stream, d);
    }
    if (rc == KVS_OK)
        rc = dev->ops.event_record(dev, s->stream, &ev);
    if (rc == KVS_OK)
        rc = s->wait(s->wait_ctx, dev, ev);
    if (ev != NULL)
        dev->ops.event_destroy(dev, ev);
    if (rc != KVS_OK)
        return kvc_fail(msg, n, "%s: %s%s failed: %s (%s)", dev->name,
                        scatter ? "scatter" : "gather", sh->parts > 0 ? "_parts" : "",
                        kvs_status_name(rc),
                        dev->last_backend_msg);
    return 0;
}

/* Reads [addr, +len) of both sides and compares; names the first byte that
 * differs. */
static int kvc_same(const kvc_side_t *a, uint64_t aa, const kvc_side_t *b, uint64_t ba,
                    uint64_t len, uint8_t *buf_a, uint8_t *buf_b, const char *what,
                    char *msg, size_t n)
{
    int rc = a->dev->ops.mem_read(a->dev, aa, buf_a, len);
    if (rc == KVS_OK)
        rc = b->dev->ops.mem_read(b->dev, ba, buf_b, len);
    if (rc != KVS_OK)
        return kvc_fail(msg, n, "reading back %s failed: %s", what, kvs_status_name(rc));
    if (len == 0 || memcmp(buf_a, buf_b, len) == 0)
        return 0;
    for (uint64_t i = 0; i < len; i++)
        if (buf_a[i] != buf_b[i])
            return kvc_fail(msg, n, "%s differs at byte %llu of %llu: %s has 0x%02x, %s 0x%02x",
                            what, (unsigned long long)i, (unsigned long long)len,
                            a->dev->name, buf_a[i], b->dev->name, buf_b[i]);
    return 0;
}

int kvc_compare(const kvc_side_t *a, const kvc_side_t *b, const kvc_shape_t *sh,
                uint64_t seed, char *msg, size_t msg_bytes)
{
    if (sh->pool_layers > KVC_MAX_LAYERS)
        return kvc_fail(msg, msg_bytes, "shape has %lld pool layers, at most %d",
                        (long long)sh->pool_layers, KVC_MAX_LAYERS);
    if (sh->parts < 0 || sh->parts > KVC_MAX_PARTS || sh->parts > sh->num_heads)
        return kvc_fail(msg, msg_bytes, "shape has %lld parts for %lld heads, at most %d",
                        (long long)sh->parts, (long long)sh->num_heads, KVC_MAX_PARTS);
    const int reverse = (int)(seed & 1);
    uint64_t rng = seed | 1;
    const uint64_t lb = kvc_layer_bytes(sh), sb = kvc_stg_bytes(sh);
    const uint64_t slb = kvc_scale_layer_bytes(sh);
    const int64_t num_pages = (sh->tokens + sh->page_size - 1) / sh->page_size;
    int ret = -1;
    uint8_t *layers[4 * KVC_MAX_LAYERS] = {0};
    const uint64_t most = lb > sb ? (lb > slb ? lb : slb) : (sb > slb ? sb : slb);
    uint8_t *stg = malloc(sb + 1), *buf_a = malloc(most + 1), *buf_b = malloc(most + 1);
    int64_t *perm = malloc((size_t)sh->pool_pages * sizeof *perm);
    kvc_pool_t pa, pb;
    memset(&pa, 0, sizeof pa);
    memset(&pb, 0, sizeof pb);
    if (stg == NULL || buf_a == NULL || buf_b == NULL || perm == NULL) {
        kvc_fail(msg, msg_bytes, "out of host memory");
        goto out;
    }
    for (int64_t i = 0; i < (slb > 0 ? 4 : 2) * sh->pool_layers; i++) {
        const uint64_t len = i < 2 * sh->pool_layers ? lb : slb;
        if ((layers[i] = malloc(len + 1)) == NULL) {
            kvc_fail(msg, msg_bytes, "out of host memory");
            goto out;
        }
        xorshift_fill(layers[i], len, &rng);
    }
    xorshift_fill(stg, sb, &rng);
    for (int64_t i = 0; i < sh->pool_pages; i++)
        perm[i] = i;
    for (int64_t i = sh->pool_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)(xorshift64(&rng) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    /* Every other shape keeps page ids ascending, so page runs merge. */
    if (seed & 2)
        for (int64_t i = 0; i < num_pages; i++)
            perm[i] = i;

    if (kvc_pool_make(a, sh, &pa, layers, stg, msg, msg_bytes) != 0 ||
        kvc_pool_make(b, sh, &pb, layers, stg, msg, msg_bytes) != 0)
        goto out;
    /* Gather: staging blocks must agree (untouched slots included). */
    kvs_copy_desc_t da = kvc_desc(sh, &pa, perm), db = kvc_desc(sh, &pb, perm);
    if (kvc_run(a, sh, &da, 0, reverse, msg, msg_bytes) != 0 ||
        kvc_run(b, sh, &db, 0, reverse, msg, msg_bytes) != 0 ||
        kvc_same(a, pa.stg, b, pb.stg, sb, buf_a, buf_b, "staging block after gather", msg,
                 msg_bytes) != 0)
        goto out;
    /* Scatter fresh random staging bytes into both pools. */
    xorshift_fill(stg, sb, &rng);
    if (a->dev->ops.mem_write(a->dev, pa.stg, stg, sb) != KVS_OK ||
        b->dev->ops.mem_write(b->dev, pb.stg, stg, sb) != KVS_OK) {
        kvc_fail(msg, msg_bytes, "writing the scatter's staging block failed");
        goto out;
    }
    if (kvc_run(a, sh, &da, 1, reverse, msg, msg_bytes) != 0 ||
        kvc_run(b, sh, &db, 1, reverse, msg, msg_bytes) != 0)
        goto out;
    for (int64_t l = 0; l < sh->pool_layers; l++)
        for (int kv = 0; kv < (slb > 0 ? 4 : 2); kv++) {
            static const char *const names[] = {"K", "V", "K scale", "V scale"};
            char what[64];
            snprintf(what, sizeof what, "%s buffer of layer %lld after scatter", names[kv],
                     (long long)l);
            const uint64_t ua = kv == 0 ? pa.k[l] : kv == 1 ? pa.v[l] : kv == 2 ? pa.ks[l]
                                                                                : pa.vs[l];
            const uint64_t ub = kv == 0 ? pb.k[l] : kv == 1 ? pb.v[l] : kv == 2 ? pb.ks[l]
                                                                                : pb.vs[l];
            if (kvc_same(a, ua, b, ub, kv < 2 ? lb : slb, buf_a, buf_b, what, msg,
                         msg_bytes) != 0)
                goto out;
        }
    ret = 0;
out:
    kvc_pool_free(a, sh, &pa);
    kvc_pool_free(b, sh, &pb);
    for (int64_t i = 0; i < 4 * KVC_MAX_LAYERS; i++)
        free(layers[i]);
    free(perm);
    free(buf_b);
    free(buf_a);
    free(stg);
    return ret;
}

/* page, tokens, local, start, num, dim, elem, pool layers, begin, count,
 * slots, slot begin, pool pages, parts, planes, scale bytes */
const kvc_named_shape_t kvc_named_shapes[] = {
    {"70b P8->D2 prefill: whole rows, 16 B", {16, 1000, 1, 0, 1, 128, 2, 4, 0, 4, 4, 0, 80, 0, 0, 0}},
    {"70b P8->D2 decode: 1 of 4 heads, 16 B", {16, 1000, 4, 1, 1, 128, 2, 4, 0, 4, 4, 0, 80, 0, 0, 0}},
    {"head 100 bf16: 200 B rows, 8 B", {16, 777, 3, 1, 1, 100, 2, 3, 1, 2, 3, 1, 64, 0, 0, 0}},
    {"head 3 fp32: 12 B rows, 4 B", {3, 500, 4, 1, 1, 3, 4, 2, 0, 2, 2, 0, 200, 0, 0, 0}},
    {"head 33 fp16: 66 B, 2 B", {32, 300, 2, 1, 1, 33, 2, 2, 0, 2, 2, 0, 12, 0, 0, 0}},
    {"head 3 fp8: 3 B rows, 1 B", {1, 257, 5, 2, 2, 3, 1, 2, 1, 1, 3, 2, 300, 0, 0, 0}},
    {"no tokens", {16, 0, 2, 0, 2, 128, 2, 2, 0, 2, 2, 0, 4, 0, 0, 0}},
    /* Fused copies, as the engine calls them (gather_parts, scatter_parts);
     * odd seeds (0x600 + index) list the parts last first. */
    {"70b P8->D2 decode, fused: 4 writers of 1 head",
     {16, 1000, 4, 0, 4, 128, 2, 4, 0, 4, 4, 0, 80, 4, 0, 0}},
    {"70b P2->D8 prefill, fused: 4 ranks of 1 head",
     {16, 999, 4, 0, 4, 128, 2, 4, 0, 4, 4, 0, 80, 4, 0, 0}},
    {"P4->D2 decode, fused: 2 writers of 2 heads",
     {16, 1000, 4, 0, 4, 128, 2, 2, 0, 2, 2, 0, 80, 2, 0, 0}},
    /* One plane per layer: MLA's 576-element bf16 latent, K only (V must
     * stay untouched on both sides). */
    {"MLA latent 576 bf16: 1152 B rows, one plane", {64, 1000, 1, 0, 1, 576, 2, 3, 0, 3, 3, 0, 20, 0, 1, 0}},
    {"MLA latent fp8, fused: 1 part, one plane", {16, 333, 1, 0, 1, 576, 1, 2, 1, 1, 2, 1, 30, 1, 1, 0}},
    /* FP8 KV with scale planes (docs/kinds/fp8-scales.md): per-token fp32
     * (4 B a head) and MXFP8 e8m0 per 32 elements (head 128: 4 B a head). */
    {"fp8 per-token scales P8->D2 decode: 1 of 4 heads",
     {16, 1000, 4, 1, 1, 128, 1, 4, 0, 4, 4, 0, 80, 0, 0, 4}},
    {"fp8 per-token scales, fused: 4 writers of 1 head",
     {16, 999, 4, 0, 4, 128, 1, 4, 0, 4, 4, 0, 80, 4, 0, 4}},
    {"fp8 MXFP8 head 64: 2 B of scales, 3 of 5 heads",
     {3, 500, 5, 2, 3, 64, 1, 2, 1, 1, 3, 2, 200, 0, 0, 2}},
    {"fp8 latent with scales, one plane", {16, 333, 1, 0, 1, 576, 1, 2, 1, 1, 2, 1, 30, 1, 1, 18}},
};
const size_t kvc_named_shape_count = sizeof kvc_named_shapes / sizeof kvc_named_shapes[0];
