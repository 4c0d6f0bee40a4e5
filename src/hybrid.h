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
 * state layers has more writers: kvs__writers_t. */
int64_t kvs__layout_kv_writers(const kvs_layout_t *l);

/* Who among a decode rank's S sources (P > D; S = 1 else) writes: with
 * fewer heads than prefill ranks each head (KV or state) is held by a run
 * of ranks, and its first rank alone writes it. Sources are numbered
 * writers of KV first (K of them, the first of each run of rk = S / K),
 * then writers of their state alone (state_alone: the first of each run
 * of rs = S / SW holding the same state heads, SW = min(S, max(1, state
 * heads / D)), not a KV writer), then those that only report. KV writer j
 * writes its state too when j % state_every == 0. Without state layers rs
 * = rk: no state-alone writers. */
typedef struct kvs__writers {
    int64_t sources;     /* S */
    int64_t kv;          /* K */
    int64_t state_alone; /* writers of their state alone */
    int64_t kv_run;      /* rk */
    int64_t state_run;   /* rs */
    int64_t state_every; /* lcm(rk, rs) / rk */
} kvs__writers_t;

void kvs__layout_writers(const kvs_layout_t *l, kvs__writers_t *out);

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
