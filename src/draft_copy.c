/*
 * draft_copy.c - the staging copies of a draft model's KV (draft_copy.h,
 * docs/kinds/draft.md). A writer block is [model slots | draft slots]; the
 * draft's slots are laid out as the model's (K slots, then V slots, each
 * [row][writer's heads][draft_head_dim]), so the draft part is one more
 * fused copy of the existing device ops: the model's descriptor with the
 * draft's buffers, head dim and layer count, each part moved past its
 * block's model slots. The draft's heads split as the model's and its
 * pages are the model's, so the head parts and the page list serve both.
 * With PP only the last stage of each side copies a draft part (its
 * layers live there: kvs_layout_draft_stage); the others copy none.
 */
#include "draft_copy.h"

#include "backend.h"

int kvs__draft_copy(kvs_device_t *dev, kvs_stream_t *stream, const kvs_manager_t *m,
                    const kvs_layout_t *lay, bool gather, const kvs_copy_desc_t *model,
                    kvs_copy_part_t *parts, int64_t n)
{
    /* With PP only the last stage holds the draft (src/draft.c): the last
     * prefill stage gathers it, the last decode stage's regions hold it. */
    const kvs_role_t role = gather ? KVS_ROLE_PREFILL : KVS_ROLE_DECODE;
    if (lay->draft_layers == 0 || n == 0 ||
        m->cfg.pp_rank != kvs_layout_draft_stage(lay, role))
        return KVS_OK;
    /* The model part of a block of num_heads heads: its layer slots, each
     * plane (bounded with the block by kvs_layout_init). */
    for (int64_t i = 0; i < n; i++)
        parts[i].staging_addr +=
            (uint64_t)(kvs_layout_layer_block_bytes(lay, model->tokens, parts[i].num_heads) *
                       model->staging_layer_slots * lay->planes);
    kvs_copy_desc_t desc = *model;
    desc.k_base = m->draft_k_base;
    desc.v_base = m->draft_v_base;
    desc.head_dim = lay->draft_head_dim;
    desc.layer_begin = 0;
    desc.layer_count = lay->draft_layers;
    desc.staging_slot_begin = 0;
    desc.staging_layer_slots = lay->draft_layers;
    desc.ks_base = desc.vs_base = NULL; /* a draft has no scale planes (draft.c) */
    desc.scale_bytes = 0;
    return gather ? kvs__dev_gather_parts(dev, stream, &desc, parts, n)
                  : kvs__dev_scatter_parts(dev, stream, &desc, parts, n);
}
