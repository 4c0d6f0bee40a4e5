/*
 * draft_copy.h (internal) - the staging copies of a draft model's KV
 * (docs/kinds/draft.md): the draft part that ends each writer block,
 * gathered on a prefill rank and scattered on a decode rank by a second
 * fused copy of the existing device ops, right after the model's.
 */
#ifndef KVS_SRC_DRAFT_COPY_H
#define KVS_SRC_DRAFT_COPY_H

#include "manager.h"

/* After the model's fused copy `model` of parts[0, n) (each part's
 * staging_addr its writer block's start), copies the blocks' draft parts:
 * the same pages, rows and head parts over the draft's buffers, with the
 * draft's head dim and layers, each part at its block's draft offset (the
 * block's model slots skipped). gather: prefill (pool to blocks), else
 * decode (blocks to pool). parts are left at the draft parts. KVS_OK at
 * once without a draft or on a pipeline stage that holds none (every stage
 * but the last, kvs_layout_draft_stage; parts untouched); else the
 * device's status. */
int kvs__draft_copy(kvs_device_t *dev, kvs_stream_t *stream, const kvs_manager_t *m,
                    const kvs_layout_t *lay, bool gather, const kvs_copy_desc_t *model,
                    kvs_copy_part_t *parts, int64_t n);

#endif
