/*
 * chunk.h (internal) - the one chunk plan both handlers use: where chunk i
 * of a request's transferred suffix lies on the grid (spec §5) and how big
 * its region is in the ring of a given decode rank (spec §4).
 */
#ifndef KVS_SRC_CHUNK_H
#define KVS_SRC_CHUNK_H

#include <kvstage/kvstage.h>

typedef struct kvs__chunk_plan {
    int64_t tokens;              /* token_end - token_start */
    int64_t token_start, token_end;
    int64_t page_start, num_pages; /* of the suffix's pages */
    int64_t region_bytes;        /* 0 for the metadata-only chunk of an empty range */
} kvs__chunk_plan_t;

/* Chunk `index` of the suffix [base, total) bound for decode rank
 * (decode_tp, decode_stage) of layout lay. KVS_EPREFIX_ALIGN, KVS_ERANGE
 * (no such chunk) or the layout's error. */
int kvs__chunk_plan(const kvs_layout_t *lay, int64_t decode_tp, int64_t decode_stage,
                    int64_t base, int64_t total, int64_t index, kvs__chunk_plan_t *out);

#endif
