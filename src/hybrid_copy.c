/*
 * hybrid_copy.c - the staging copies of a hybrid layout (hybrid_copy.h,
 * docs/kinds/hybrid.md). A writer block is a slot per layer and plane
 * (full layers: the chunk's rows; window layers: its rows inside the
 * window, or none) and, in the request's last chunk, a state part per
 * state layer. Each is one fused copy of the existing device ops:
 *
 * - a slot is a descriptor of one layer and one plane (planes 1,
 *   layer_count 1, the plane's buffer as k_base), its page list starting
 *   at the slot's first token (a page of both sides: window starts are on
 *   the grid unit), its staging block at the slot's offset;
 * - a state part is a descriptor over the state buffer as a pool of
 *   one-token pages of the side's state heads, head_dim the bytes of one
 *   state head and elem_bytes 1: page list { state slot }, one token.
 *
 * The parts of one copy are the blocks, each with its own heads (or state
 * heads) and its slot's address in its block. A prefill stage's staging
 * buffer holds its part of a block alone (kvs_layout_hybrid_part: with
 * prefill PP into a decode of PP 1, the layers it holds). A draft model's
 * layers end the last stage's part: one more fused copy.
 */
#include "hybrid_copy.h"

#include "arith.h"
#include "backend.h"

/* The stage of the layers this rank's pool holds, its first layer. */
static int64_t kvs__pool_first_layer(const kvs_manager_t *m, const kvs_layout_t *lay)
{
    int64_t first = 0, count = 0;
    (void)kvs_layout_stage_layers(lay, m->cfg.role, m->cfg.pp_rank, &first, &count);
    return first;
}

/* One fused copy of desc over parts[0, n). */
static int kvs__hyb_run(kvs_device_t *dev, kvs_stream_t *stream, bool gather,
                        const kvs_copy_desc_t *desc, const kvs_copy_part_t *parts, int64_t n)
{
    if (n == 0)
        return KVS_OK;
    return gather ? kvs__dev_gather_parts(dev, stream, desc, parts, n)
                  : kvs__dev_scatter_parts(dev, stream, desc, parts, n);
}

/* The descriptor of global layer `layer`, plane `plane` (kind: its kind)
 * of this rank's pool for the slot's rows. state_slot: the state's page. */
static kvs_copy_desc_t kvs__hyb_desc(const kvs_manager_t *m, const kvs__hyb_copy_t *c,
                                     kvs_layer_kind_t kind, int64_t layer, int64_t plane,
                                     const kvs_hybrid_slot_t *sl)
{
    const kvs_layout_t *lay = c->lay;
    const int64_t local = layer - kvs__pool_first_layer(m, lay);
    const bool decode = c->role == KVS_ROLE_DECODE;
    if (kind == KVS_LAYER_STATE)
        return (kvs_copy_desc_t){
            .k_base = m->state_base + local,
            .local_heads = decode ? lay->state_dst_heads : lay->state_src_heads,
            .head_dim = lay->state_head_bytes, .elem_bytes = 1, .page_size = 1,
            .pages = &c->state_slot, .num_pages = 1, .tokens = 1, .layer_count = 1,
            .staging_layer_slots = 1, .planes = 1};
    const int64_t ps = decode ? lay->decode_page_size : lay->page_size;
    /* prefill pages are the request's from token 0; decode's the chunk's */
    const int64_t first_page = (sl->token_start - (decode ? c->chunk.token_start : 0)) / ps;
    const uint64_t *scales = plane == 0 ? m->ks_base : m->vs_base;
    return (kvs_copy_desc_t){
        .k_base = (plane == 0 ? m->k_base : m->v_base) + local,
        .local_heads = m->kv.local_heads, .head_dim = lay->head_dim,
        .elem_bytes = lay->elem_bytes, .page_size = ps, .pages = c->pages + first_page,
        .num_pages = kvs__ceil_div(sl->rows, ps), .tokens = sl->rows, .layer_count = 1,
        .staging_layer_slots = 1, .planes = 1,
        .ks_base = scales != NULL ? scales + local : NULL, .scale_bytes = lay->scale_bytes};
}

/* A draft's part of each block (docs/kinds/draft.md): the chunk's rows of
 * every draft layer, K layers then V layers, one fused copy over the
 * draft's buffers and the model's pages, on the last stage of each side
 * alone (kvs_layout_draft_stage). */
static int kvs__hyb_draft(kvs_device_t *dev, kvs_stream_t *stream, const kvs_manager_t *m,
                          const kvs__hyb_copy_t *c, const kvs__hyb_block_t *blocks, int64_t n,
                          kvs_copy_part_t *parts, int64_t cap)
{
    const kvs_layout_t *lay = c->lay;
    const bool gather = c->role == KVS_ROLE_PREFILL;
    if (lay->draft_layers == 0 || m->cfg.pp_rank != kvs_layout_draft_stage(lay, c->role))
        return KVS_OK;
    const int64_t ps = gather ? lay->page_size : lay->decode_page_size;
    const int64_t rows = c->chunk.token_end - c->chunk.token_start;
    const kvs_copy_desc_t desc = {
        .k_base = m->draft_k_base, .v_base = m->draft_v_base,
        .local_heads = m->kv.local_heads, .head_dim = lay->draft_head_dim,
        .elem_bytes = lay->elem_bytes, .page_size = ps,
        .pages = c->pages + (gather ? c->chunk.token_start / ps : 0),
        .num_pages = kvs__ceil_div(rows, ps), .tokens = rows, .layer_count = lay->draft_layers,
        .staging_layer_slots = lay->draft_layers, .planes = lay->planes};
    int64_t np = 0;
    int rc = KVS_OK;
    for (int64_t i = 0; i < n && rc == KVS_OK; i++) {
        kvs_hybrid_writer_t hw;
        kvs_hybrid_part_t hp = {0};
        rc = kvs_layout_hybrid_writer(lay, blocks[i].decode_tp, c->stage, blocks[i].writer,
                                      c->total, &c->chunk, &hw);
        if (rc == KVS_OK && gather)
            rc = kvs_layout_hybrid_part(lay, &hw, c->stage, m->cfg.pp_rank, &hp);
        if (rc != KVS_OK || hw.draft_bytes == 0)
            continue; /* a writer of its state alone, or an empty chunk */
        if (np == cap) {
            rc = kvs__hyb_run(dev, stream, gather, &desc, parts, np);
            np = 0;
        }
        parts[np++] = (kvs_copy_part_t){
            .head_start = gather ? hw.w.heads.src_start : hw.w.heads.dst_start,
            .num_heads = hw.w.heads.num_heads,
            .staging_addr = blocks[i].block_addr +
                            (uint64_t)(hw.draft_offset_bytes - hp.offset_bytes)};
    }
    return rc == KVS_OK ? kvs__hyb_run(dev, stream, gather, &desc, parts, np) : rc;
}

int kvs__hybrid_copy(kvs_device_t *dev, kvs_stream_t *stream, const kvs_manager_t *m,
                     const kvs__hyb_copy_t *c, const kvs__hyb_block_t *blocks, int64_t n,
                     kvs_copy_part_t *parts, int64_t cap)
{
    const kvs_layout_t *lay = c->lay;
    const bool gather = c->role == KVS_ROLE_PREFILL;
    int64_t first = 0, count = 0, pf = 0, pn = 0;
    int rc = kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, c->stage, &first, &count);
    if (rc == KVS_OK && gather) {
        /* a prefill stage gathers its part of each block (kvs_layout_hybrid_part):
         * the decode stage's layers it holds */
        rc = kvs_layout_stage_layers(lay, KVS_ROLE_PREFILL, m->cfg.pp_rank, &pf, &pn);
        const int64_t end = kvs__min_i64(first + count, pf + pn);
        first = first > pf ? first : pf;
        count = end > first ? end - first : 0;
    }
    for (int64_t layer = first; layer < first + count && rc == KVS_OK; layer++) {
        kvs_layer_kind_t kind = KVS_LAYER_FULL;
        rc = kvs_layout_layer_kind(lay, layer, &kind);
        const int64_t planes = kind == KVS_LAYER_STATE ? 1 : lay->planes;
        for (int64_t plane = 0; plane < planes && rc == KVS_OK; plane++) {
            kvs_copy_desc_t desc = {0};
            int64_t np = 0;
            for (int64_t i = 0; i < n && rc == KVS_OK; i++) {
                kvs_hybrid_writer_t hw;
                kvs_hybrid_slot_t sl;
                kvs_hybrid_part_t hp = {0}; /* a staging buffer holds the stage's part */
                rc = kvs_layout_hybrid_writer(lay, blocks[i].decode_tp, c->stage,
                                              blocks[i].writer, c->total, &c->chunk, &hw);
                if (rc == KVS_OK && gather)
                    rc = kvs_layout_hybrid_part(lay, &hw, c->stage, m->cfg.pp_rank, &hp);
                if (rc == KVS_OK)
                    rc = kvs_layout_hybrid_slot(lay, &hw, c->stage, layer, plane, &sl);
                if (rc == KVS_ENOENT) { /* no bytes of this layer in this block (none in
                                           the chunk, or a writer of its state alone) */
                    rc = KVS_OK;
                    continue;
                }
                if (rc != KVS_OK)
                    break;
                if (kind == KVS_LAYER_STATE && c->state_slot < 0) {
                    rc = KVS_EINVAL; /* the room's state slot was never given */
                    break;
                }
                if (np == 0)
                    desc = kvs__hyb_desc(m, c, kind, layer, plane, &sl);
                const kvs_head_slice_t *hs = kind == KVS_LAYER_STATE ? &hw.state_heads
                                                                     : &hw.w.heads;
                const kvs_copy_part_t part = {
                    .head_start = gather ? hs->src_start : hs->dst_start,
                    .num_heads = hs->num_heads,
                    .staging_addr = blocks[i].block_addr +
                                    (uint64_t)(sl.offset_bytes - hp.offset_bytes)};
                /* a replica of a part's heads: the last one is scattered (the
                 * writers holding one head need not be next to each other:
                 * a state replica of a writer of its state alone comes
                 * after the writers of KV) */
                int64_t same = -1;
                for (int64_t j = 0; !gather && j < np && same < 0; j++)
                    if (parts[j].head_start == part.head_start)
                        same = j;
                if (same >= 0) {
                    parts[same] = part;
                    continue;
                }
                if (np == cap) {
                    rc = kvs__hyb_run(dev, stream, gather, &desc, parts, np);
                    np = 0;
                }
                parts[np++] = part;
            }
            if (rc == KVS_OK)
                rc = kvs__hyb_run(dev, stream, gather, &desc, parts, np);
        }
    }
    return rc == KVS_OK ? kvs__hyb_draft(dev, stream, m, c, blocks, n, parts, cap) : rc;
}
