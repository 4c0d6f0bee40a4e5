/*
 * hybrid_copy.h (internal) - the staging copies of a hybrid layout
 * (docs/kinds/hybrid.md): a writer block of slots and a state part,
 * gathered on a prefill rank and scattered on a decode rank with the
 * device's existing copies, one fused copy per layer slot and plane.
 */
#ifndef KVS_SRC_HYBRID_COPY_H
#define KVS_SRC_HYBRID_COPY_H

#include "manager.h"

/* One writer block of a hybrid copy: writer `writer` of decode rank
 * decode_tp's region, at device address block_addr (a prefill staging
 * buffer, or the block's place in a decode ring region). */
typedef struct kvs__hyb_block {
    int64_t decode_tp;
    int64_t writer;
    uint64_t block_addr;
} kvs__hyb_block_t;

/* What a hybrid copy reads or writes on this rank, for `chunk` of a
 * request of `total` tokens at decode stage `stage`: the pool's pages for
 * the chunk's tokens (prefill: the request's pages from token 0; decode:
 * the chunk's first page on), and the request's state slot (-1: none
 * given; a copy that needs it is refused with KVS_EINVAL). */
typedef struct kvs__hyb_copy {
    kvs_role_t role;
    const kvs_layout_t *lay;
    int64_t stage;
    int64_t total;
    kvs_chunk_t chunk;
    const int64_t *pages;
    int64_t state_slot;
} kvs__hyb_copy_t;

/* Copies the n blocks between this rank's pool and their staging places:
 * gathers them (prefill) or scatters them (decode), one fused copy of
 * every block per layer slot and plane and per state layer, using `parts`
 * (room for cap > 0 parts) as scratch. On decode, blocks that replicate a
 * head (or a state head) write the same bytes: the last of them is
 * scattered. The device's status, or the layout's. */
int kvs__hybrid_copy(kvs_device_t *dev, kvs_stream_t *stream, const kvs_manager_t *m,
                     const kvs__hyb_copy_t *c, const kvs__hyb_block_t *blocks, int64_t n,
                     kvs_copy_part_t *parts, int64_t cap);

#endif
