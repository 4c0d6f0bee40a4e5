/*
 * hybrid.h (internal) - what src/layout.c asks of src/hybrid.c: checking a
 * hybrid model's layer pattern into a layout, and the largest region of one.
 */
#ifndef KVS_SRC_HYBRID_H
#define KVS_SRC_HYBRID_H

#include <kvstage/kvstage.h>

/* Checks p's layer pattern against the rest of *l (heads, TPs, kind and
 * grid already set) and fills l's hybrid fields; on error its code with
 * err naming the field to change. */
int kvs__hybrid_init(kvs_layout_t *l, const kvs_layout_params_t *p, kvs_error_t *err);

/* The sources of a decode rank that write its KV rows, one per distinct
 * head (src/layout.c); the first of the sources. A hybrid layout with
 * state layers has tp_writers = tp_sources, the others writing state. */
int64_t kvs__layout_kv_writers(const kvs_layout_t *l);

/* True for a layout with window or state layers. */
static inline int kvs__hybrid(const kvs_layout_t *lay) { return lay->full_attn_every > 1; }

/* The kind of global layer `layer` of a pattern (full_attn_every > 1:
 * every full_attn_every-th layer full, the others `other`; else every
 * layer full). The one place the rule lives: layouts (src/hybrid.c) and
 * a pool's layers before any layout (src/kv_layers.c) both ask it. */
static inline kvs_layer_kind_t kvs__layer_kind_of(int64_t full_attn_every,
                                                  kvs_layer_kind_t other, int64_t layer)
{
    if (full_attn_every <= 1 || (layer + 1) % full_attn_every == 0)
        return KVS_LAYER_FULL;
    return other;
}

/* kvs_layout_max_region_bytes of a hybrid layout (checked to fit by
 * kvs__hybrid_init). */
int64_t kvs__hybrid_max_region_bytes(const kvs_layout_t *lay);

/* The most bytes prefill stage `prefill_stage` of writer `writer` (0 <=
 * writer < tp_writers) of a hybrid layout writes into one region: its part
 * of a full chunk's block (kvs_layout_hybrid_part) at the largest decode
 * stage. */
int64_t kvs__hybrid_max_part_bytes(const kvs_layout_t *lay, int64_t writer,
                                   int64_t prefill_stage);

#endif
