/*
 * draft.c - the layout of a draft model's KV (speculative decoding,
 * docs/kinds/draft.md): the decode of a PD pair that runs EAGLE, EAGLE3,
 * DeepSeek's MTP or a small standalone draft model needs the draft's KV of
 * the prompt as well as the model's. It moves in the same regions: each
 * writer block ends with the draft's layer slots (K slots, then V slots, as
 * the model's), so a chunk still costs one write per writer and the draft
 * adds no message, key or completion.
 *
 * The draft's KV heads split over TP as the model's do (the drafters
 * engines run beside a model keep its KV heads: Llama 3.1's EAGLE and
 * EAGLE3 heads, gpt-oss's EAGLE3, DeepSeek-V3's MTP latent), so the
 * writers and head slices of spec §3 serve both; only the head dim and the
 * layer count are the draft's own. With pipeline parallelism the draft is
 * the last stage's on both sides (engines put MTP layers and EAGLE heads
 * after the model's last layer, on the last PP rank): the last prefill
 * stage's blocks carry it, into the regions of the last decode stage
 * (kvs_layout_draft_stage); every other stage's blocks are the model's
 * alone, where they were without a draft. Pure functions, no state.
 */
#include "draft.h"

#include "error.h"

/* The refusals name the field and what kvstage moves; each is a draft this
 * version does not lay out, not a wrong one. */
int kvs__draft_init(kvs_layout_t *l, const kvs_layout_params_t *p, kvs_error_t *err)
{
    l->draft_layers = 0;
    l->draft_head_dim = 0;
    if (p->draft_layers < 0 || p->draft_head_dim < 0 || p->draft_kv_heads < 0)
        return KVS__FAIL(err, KVS_EINVAL, "draft_layers %lld, draft_head_dim %lld and "
                         "draft_kv_heads %lld must be >= 0 (--draft-layers, "
                         "--draft-head-dim, --draft-kv-heads)",
                         (long long)p->draft_layers, (long long)p->draft_head_dim,
                         (long long)p->draft_kv_heads);
    if (p->draft_layers == 0) {
        if (p->draft_head_dim != 0 || p->draft_kv_heads != 0)
            return KVS__FAIL(err, KVS_EINVAL, "draft_head_dim %lld and draft_kv_heads %lld "
                             "describe a draft model, but draft_layers is 0: give its "
                             "layers (--draft-layers N) or drop them",
                             (long long)p->draft_head_dim, (long long)p->draft_kv_heads);
        return KVS_OK;
    }
    if (p->draft_layers > KVS_MAX_LAYERS)
        return KVS__FAIL(err, KVS_ERANGE, "draft_layers %lld: at most %d (KVS_MAX_LAYERS); "
                         "pass the draft model's layer count", (long long)p->draft_layers,
                         KVS_MAX_LAYERS);
    if (p->draft_kv_heads != 0 && p->draft_kv_heads != l->total_heads)
        return KVS__FAIL(err, KVS_ENOTSUP, "draft_kv_heads %lld: a draft's KV heads must split "
                         "over TP as the model's %lld do (the drafters engines run keep the "
                         "model's KV heads); give %lld or 0 (--draft-kv-heads)",
                         (long long)p->draft_kv_heads, (long long)l->total_heads,
                         (long long)l->total_heads);
    if (l->kv_scales != KVS_KV_SCALES_NONE)
        return KVS__FAIL(err, KVS_ENOTSUP, "draft layers with kv_scales %s: the draft's scale "
                         "planes are not laid out yet; drop --kv-scales or --draft-layers",
                         kvs_kv_scales_name(l->kv_scales));
    const int64_t dhd = p->draft_head_dim > 0 ? p->draft_head_dim : l->head_dim;
    /* The largest region with the draft part must fit in int64, as the
     * model's alone was checked to (kvs_layout_init). */
    const int64_t heads = l->prefill_tp > l->decode_tp ? l->src_heads : l->dst_heads;
    const int64_t model = kvs_layout_max_region_bytes(l);
    int64_t part = l->grid_tokens, total;
    if (__builtin_mul_overflow(part, heads, &part) ||
        __builtin_mul_overflow(part, dhd, &part) ||
        __builtin_mul_overflow(part, l->elem_bytes, &part) ||
        __builtin_mul_overflow(part, p->draft_layers, &part) ||
        __builtin_mul_overflow(part, l->planes, &part) ||
        __builtin_mul_overflow(part, l->tp_writers, &part) ||
        __builtin_add_overflow(part, model, &total))
        return KVS__FAIL(err, KVS_ERANGE, "a chunk region with the draft's layers overflows "
                         "64 bits: lower chunk_tokens, draft_head_dim or draft_layers");
    l->draft_layers = p->draft_layers;
    l->draft_head_dim = dhd;
    return KVS_OK;
}

int64_t kvs_layout_draft_part_bytes(const kvs_layout_t *lay, int64_t tokens, int64_t num_heads)
{
    if (lay == NULL || lay->draft_layers == 0)
        return 0;
    /* bounded by kvs__draft_init for tokens <= G and the region's heads */
    return tokens * num_heads * lay->draft_head_dim * lay->elem_bytes * lay->draft_layers *
           lay->planes;
}

int64_t kvs_layout_draft_stage(const kvs_layout_t *lay, kvs_role_t role)
{
    if (lay == NULL || lay->draft_layers == 0 ||
        (role != KVS_ROLE_PREFILL && role != KVS_ROLE_DECODE))
        return -1;
    return (role == KVS_ROLE_PREFILL ? lay->prefill_pp : lay->decode_pp) - 1;
}
