/*
 * copy_desc.c - kvs_copy_desc_check and kvs_copy_parts_check of backend.h:
 * the one check of a gather/scatter descriptor (kvs_copy_desc_t), and of a
 * fused copy's parts, that every device backend runs (sim/gpu.c, hw/host,
 * hw/cuda, the core's default fused copy), so a descriptor one backend
 * accepts every backend accepts, and a refused one gets the same status and
 * wording on all.
 *
 * Every size is computed with overflow checks; the page list is read only up
 * to the pages the tokens use; whether memory is live is the backend's
 * answer (the in_mem callback), asked only when the copy moves bytes. It
 * copies nothing and keeps no state.
 */
#include "backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool kvs__copy_mul(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static bool kvs__copy_add(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* Byte offset of token slot `slot` (page * page_size + t) in a buffer of
 * token_bytes a slot, at the first copied head (head_off). */
static bool kvs__copy_pool_off(uint64_t token_bytes, uint64_t head_off, uint64_t slot,
                               uint64_t *out)
{
    uint64_t off;
    return kvs__copy_mul(slot, token_bytes, &off) && kvs__copy_add(off, head_off, out);
}

/* Writes "<what> on <dev>: <detail>" into msg, clears the shape (after the
 * message, which may read it) and returns status: every refusal of
 * kvs_copy_desc_check goes through here. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 7, 8)))
#endif
static int kvs__copy_bad(int status, kvs_copy_shape_t *sh, char *msg, size_t msg_bytes,
                         const char *what, const char *dev_name, const char *fmt, ...)
{
    const int n = snprintf(msg, msg_bytes, "%s on %s: ", what, dev_name);
    if ((size_t)n < msg_bytes) { /* (a negative n: nothing after the prefix) */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg + n, msg_bytes - (size_t)n, fmt, ap);
        va_end(ap);
    }
    memset(sh, 0, sizeof *sh);
    return status;
}

int kvs_copy_desc_check(const kvs_copy_desc_t *d, const char *what, const char *dev_name,
                        kvs_copy_mem_fn in_mem, void *ctx, kvs_copy_shape_t *sh, char *msg,
                        size_t msg_bytes)
{
    memset(sh, 0, sizeof *sh);
#define KVS__COPY_BAD(status, ...)                                              \
    return kvs__copy_bad((status), sh, msg, msg_bytes, what, dev_name, __VA_ARGS__)
    if (d == NULL)
        KVS__COPY_BAD(KVS_EINVAL, "descriptor is NULL");
    if (d->local_heads <= 0 || d->head_dim <= 0 || d->elem_bytes <= 0 || d->page_size <= 0)
        KVS__COPY_BAD(KVS_EINVAL,
                      "local_heads %lld, head_dim %lld, elem_bytes %lld and page_size %lld "
                      "must all be positive",
                      (long long)d->local_heads, (long long)d->head_dim,
                      (long long)d->elem_bytes, (long long)d->page_size);
    if (d->num_pages < 0 || d->tokens < 0 || d->layer_begin < 0 || d->layer_count < 0 ||
        d->staging_slot_begin < 0 || d->staging_layer_slots < 0)
        KVS__COPY_BAD(KVS_EINVAL,
                      "num_pages %lld, tokens %lld, layer_begin %lld, layer_count %lld, "
                      "staging_slot_begin %lld and staging_layer_slots %lld must not be "
                      "negative",
                      (long long)d->num_pages, (long long)d->tokens,
                      (long long)d->layer_begin, (long long)d->layer_count,
                      (long long)d->staging_slot_begin, (long long)d->staging_layer_slots);
    if (d->num_heads <= 0 || d->head_start < 0 || d->num_heads > d->local_heads ||
        d->head_start > d->local_heads - d->num_heads)
        KVS__COPY_BAD(KVS_ERANGE,
                      "heads [%lld, +%lld) outside the %lld local heads of the KV pool",
                      (long long)d->head_start, (long long)d->num_heads,
                      (long long)d->local_heads);
    uint64_t cap_tokens;
    if (kvs__copy_mul((uint64_t)d->num_pages, (uint64_t)d->page_size, &cap_tokens) &&
        (uint64_t)d->tokens > cap_tokens)
        KVS__COPY_BAD(KVS_ERANGE, "%lld tokens do not fit in %lld pages of %lld tokens",
                      (long long)d->tokens, (long long)d->num_pages,
                      (long long)d->page_size);
    if (d->layer_count > INT64_MAX - d->layer_begin)
        KVS__COPY_BAD(KVS_ERANGE, "layer range [%lld, +%lld) overflows",
                      (long long)d->layer_begin, (long long)d->layer_count);
    if (d->staging_slot_begin > d->staging_layer_slots ||
        d->layer_count > d->staging_layer_slots - d->staging_slot_begin)
        KVS__COPY_BAD(KVS_ERANGE,
                      "layer slots [%lld, +%lld) outside the %lld slots of the staging block",
                      (long long)d->staging_slot_begin, (long long)d->layer_count,
                      (long long)d->staging_layer_slots);
    if (d->planes < 0 || d->planes > 2)
        KVS__COPY_BAD(KVS_EINVAL, "planes %lld must be 1 (K only), 2 (K and V) or 0 (2)",
                      (long long)d->planes);
    const uint64_t planes = d->planes == 1 ? 1 : 2;
    if (d->layer_count > 0 && (d->k_base == NULL || (planes == 2 && d->v_base == NULL)))
        KVS__COPY_BAD(KVS_EINVAL, planes == 2 ? "k_base or v_base is NULL"
                                              : "k_base is NULL");
    if (d->tokens > 0 && d->pages == NULL)
        KVS__COPY_BAD(KVS_EINVAL, "pages is NULL");
    if (d->scale_bytes < 0)
        KVS__COPY_BAD(KVS_EINVAL, "scale_bytes %lld must not be negative (0: no scale planes)",
                      (long long)d->scale_bytes);
    const bool scales = d->scale_bytes > 0;
    if (scales && d->layer_count > 0 &&
        (d->ks_base == NULL || (planes == 2 && d->vs_base == NULL)))
        KVS__COPY_BAD(KVS_EINVAL, planes == 2 ? "scale_bytes %lld but ks_base or vs_base is "
                                                "NULL: pass the scale buffers of K and V"
                                              : "scale_bytes %lld but ks_base is NULL: pass "
                                                "the scale buffers",
                      (long long)d->scale_bytes);

    uint64_t head_bytes;
    if (!kvs__copy_mul((uint64_t)d->head_dim, (uint64_t)d->elem_bytes, &head_bytes) ||
        !kvs__copy_mul(head_bytes, (uint64_t)d->num_heads, &sh->row_bytes) ||
        !kvs__copy_mul(head_bytes, (uint64_t)d->local_heads, &sh->token_bytes) ||
        !kvs__copy_mul(head_bytes, (uint64_t)d->head_start, &sh->head_off) ||
        !kvs__copy_mul((uint64_t)d->scale_bytes, (uint64_t)d->num_heads,
                       &sh->scale_row_bytes) ||
        !kvs__copy_mul((uint64_t)d->scale_bytes, (uint64_t)d->local_heads,
                       &sh->scale_token_bytes) ||
        !kvs__copy_mul((uint64_t)d->scale_bytes, (uint64_t)d->head_start,
                       &sh->scale_head_off) ||
        !kvs__copy_mul(sh->row_bytes, (uint64_t)d->tokens, &sh->scale_off) ||
        !kvs__copy_add(sh->row_bytes, sh->scale_row_bytes, &sh->slot_bytes) ||
        !kvs__copy_mul(sh->slot_bytes, (uint64_t)d->tokens, &sh->slot_bytes) ||
        !kvs__copy_mul(sh->slot_bytes, (uint64_t)d->layer_count, &sh->payload_bytes) ||
        !kvs__copy_mul(sh->payload_bytes, planes, &sh->payload_bytes) ||
        !kvs__copy_mul(sh->slot_bytes, (uint64_t)d->staging_layer_slots, &sh->block_bytes) ||
        !kvs__copy_mul(sh->block_bytes, planes, &sh->block_bytes))
        KVS__COPY_BAD(KVS_ERANGE,
                      "sizes overflow 64 bits; lower head_dim, elem_bytes, scale_bytes, "
                      "local_heads, tokens, layer_count or staging_layer_slots");
    sh->planes = planes;
    const uint64_t ps = (uint64_t)d->page_size, tokens = (uint64_t)d->tokens;
    sh->pages_used = tokens / ps + (tokens % ps != 0);

    /* The byte range every layer buffer must hold: from the lowest first
     * slot to the highest last slot of the pages used. */
    sh->pool_lo = sh->scale_pool_lo = UINT64_MAX;
    sh->pool_hi = sh->scale_pool_hi = 0;
    for (uint64_t i = 0; i < sh->pages_used; i++) {
        const int64_t p = d->pages[i];
        const uint64_t in_page = tokens - i * ps < ps ? tokens - i * ps : ps;
        uint64_t first, last, lo, hi, slo = 0, shi = 0;
        if (p < 0 || !kvs__copy_mul((uint64_t)p, ps, &first) ||
            !kvs__copy_add(first, in_page - 1, &last) ||
            !kvs__copy_pool_off(sh->token_bytes, sh->head_off, first, &lo) ||
            !kvs__copy_pool_off(sh->token_bytes, sh->head_off, last, &hi) ||
            !kvs__copy_add(hi, sh->row_bytes, &hi) ||
            !kvs__copy_pool_off(sh->scale_token_bytes, sh->scale_head_off, first, &slo) ||
            !kvs__copy_pool_off(sh->scale_token_bytes, sh->scale_head_off, last, &shi) ||
            !kvs__copy_add(shi, sh->scale_row_bytes, &shi))
            KVS__COPY_BAD(KVS_ERANGE, "page id %lld (entry %llu) is out of range",
                          (long long)p, (unsigned long long)i);
        if (lo < sh->pool_lo)
            sh->pool_lo = lo;
        if (hi > sh->pool_hi)
            sh->pool_hi = hi;
        if (slo < sh->scale_pool_lo)
            sh->scale_pool_lo = slo;
        if (shi > sh->scale_pool_hi)
            sh->scale_pool_hi = shi;
    }
    if (sh->pages_used == 0)
        sh->pool_lo = 0;
    if (sh->pages_used == 0 || !scales)
        sh->scale_pool_lo = sh->scale_pool_hi = 0;

    if (sh->payload_bytes != 0) {
        for (int64_t j = 0; j < d->layer_count; j++) {
            const int64_t l = d->layer_begin + j;
            /* each plane's buffer, then (kv_scales) its scale buffer */
            for (uint64_t q = 0; q < planes * (scales ? 2u : 1u); q++) {
                const uint64_t kv = scales ? q / 2 : q;
                const bool sc = scales && q % 2 == 1;
                const uint64_t base = sc ? (kv == 0 ? d->ks_base[l] : d->vs_base[l])
                                         : (kv == 0 ? d->k_base[l] : d->v_base[l]);
                const uint64_t plo = sc ? sh->scale_pool_lo : sh->pool_lo;
                const uint64_t phi = sc ? sh->scale_pool_hi : sh->pool_hi;
                uint64_t lo;
                if (!kvs__copy_add(base, plo, &lo) || base > UINT64_MAX - phi ||
                    !in_mem(ctx, lo, phi - plo))
                    KVS__COPY_BAD(KVS_ERANGE,
                                  "%s%s buffer of local layer %lld (0x%llx) does not hold "
                                  "bytes [%llu, %llu) of the pages copied: not allocated, "
                                  "freed or too small",
                                  kv == 0 ? "K" : "V", sc ? " scale" : "", (long long)l,
                                  (unsigned long long)base, (unsigned long long)plo,
                                  (unsigned long long)phi);
            }
        }
        if (!in_mem(ctx, d->staging_addr, sh->block_bytes))
            KVS__COPY_BAD(KVS_ERANGE,
                          "staging block [0x%llx, +%llu) (%lld slots of %llu bytes, %s) "
                          "is not inside one live allocation",
                          (unsigned long long)d->staging_addr,
                          (unsigned long long)sh->block_bytes,
                          (long long)d->staging_layer_slots,
                          (unsigned long long)sh->slot_bytes,
                          planes == 2 ? "K and V" : "one plane");
    }
#undef KVS__COPY_BAD
    return KVS_OK;
}

/* Staging block bytes of a part that passed kvs_copy_desc_check (so none of
 * these products overflows). */
static uint64_t kvs__copy_block_bytes(const kvs_copy_desc_t *d, int64_t num_heads)
{
    return ((uint64_t)d->head_dim * (uint64_t)d->elem_bytes + (uint64_t)d->scale_bytes) *
           (uint64_t)num_heads * (uint64_t)d->tokens * (uint64_t)d->staging_layer_slots *
           (d->planes == 1 ? 1u : 2u);
}

int kvs_copy_parts_check(const kvs_copy_desc_t *d, const kvs_copy_part_t *parts, int64_t nparts,
                         bool scatter, const char *what, const char *dev_name,
                         kvs_copy_mem_fn in_mem, void *ctx, kvs_copy_shape_t *sh, char *msg,
                         size_t msg_bytes)
{
    if (d == NULL || parts == NULL || nparts < 1 || nparts > KVS_COPY_PARTS_MAX) {
        snprintf(msg, msg_bytes, "%s on %s: %s; pass 1 to %d parts", what, dev_name,
                 d == NULL       ? "descriptor is NULL"
                 : parts == NULL ? "parts is NULL"
                                 : "part count out of range",
                 KVS_COPY_PARTS_MAX);
        /* sh holds nparts shapes; a count out of range says nothing. */
        if (sh != NULL && nparts >= 1 && nparts <= KVS_COPY_PARTS_MAX)
            memset(sh, 0, (size_t)nparts * sizeof *sh);
        return KVS_EINVAL;
    }
    for (int64_t i = 0; i < nparts; i++) {
        const kvs_copy_desc_t one = kvs__copy_part_desc(d, &parts[i]);
        char part_what[64];
        snprintf(part_what, sizeof part_what, "%s part %lld", what, (long long)i);
        kvs_copy_shape_t local;
        const int rc = kvs_copy_desc_check(&one, part_what, dev_name, in_mem, ctx,
                                           sh != NULL ? &sh[i] : &local, msg, msg_bytes);
        if (rc != KVS_OK) {
            if (sh != NULL)
                memset(sh, 0, (size_t)nparts * sizeof *sh);
            return rc;
        }
    }
    /* What the copy writes must not overlap, or the result would depend on
     * the order the parts run in. */
    for (int64_t i = 0; i < nparts; i++) {
        for (int64_t j = 0; j < i; j++) {
            const kvs_copy_part_t *a = &parts[j], *b = &parts[i];
            const uint64_t la = kvs__copy_block_bytes(d, a->num_heads);
            const uint64_t lb = kvs__copy_block_bytes(d, b->num_heads);
            const bool overlap =
                scatter ? a->head_start < b->head_start + b->num_heads &&
                              b->head_start < a->head_start + a->num_heads
                        : la > 0 && lb > 0 &&
                              (a->staging_addr >= b->staging_addr
                                   ? a->staging_addr - b->staging_addr < lb
                                   : b->staging_addr - a->staging_addr < la);
            if (!overlap)
                continue;
            if (scatter)
                snprintf(msg, msg_bytes,
                         "%s on %s: parts %lld and %lld both write heads of [%lld, +%lld) "
                         "and [%lld, +%lld); give each part its own heads",
                         what, dev_name, (long long)j, (long long)i, (long long)a->head_start,
                         (long long)a->num_heads, (long long)b->head_start,
                         (long long)b->num_heads);
            else
                snprintf(msg, msg_bytes,
                         "%s on %s: parts %lld and %lld write overlapping staging blocks "
                         "[0x%llx, +%llu) and [0x%llx, +%llu); give each part its own block",
                         what, dev_name, (long long)j, (long long)i,
                         (unsigned long long)a->staging_addr, (unsigned long long)la,
                         (unsigned long long)b->staging_addr, (unsigned long long)lb);
            if (sh != NULL)
                memset(sh, 0, (size_t)nparts * sizeof *sh);
            return KVS_ERANGE;
        }
    }
    return KVS_OK;
}
