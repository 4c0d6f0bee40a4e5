/*
 * chunk.h (internal) - the one chunk plan both handlers use: where chunk i
 * of a request's transferred suffix lies on the grid (spec §5), how big
 * its region is in the ring of a given decode rank (spec §4), and the
 * bytes of that region each writer writes (the prefill posts those writes,
 * the decode grants exactly those bytes when it scopes keys).
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

/* One write of a writer into a region: bytes [local_off, + len_bytes) of
 * its staging block go to [remote_off, + len_bytes) of the region. */
typedef struct kvs__span {
    uint64_t local_off, remote_off, len_bytes;
} kvs__span_t;

/* The writes prefill stage `prefill_stage`, TP writer `writer` of a chunk
 * of `tokens` tokens, makes into the region of decode rank (decode_tp,
 * decode_stage) (spec §4): one, its whole block, when the stage holds the
 * region's layers; else two, its K layers then its V layers, at their
 * global layer slots (prefill PP into a decode of PP 1); one with one
 * plane per layer (MLA: its layers' slots are one range). *n gets 1 or 2.
 * The layout's KVS_ERANGE for an index out of range. A hybrid layout's
 * blocks depend on the chunk's place: only tokens grid_tokens is answered,
 * with the largest block (kvs__part_spans gives each chunk's). */
int kvs__writer_spans(const kvs_layout_t *lay, int64_t decode_tp, int64_t decode_stage,
                      int64_t writer, int64_t prefill_stage, int64_t tokens,
                      kvs__span_t out[2], int *n);

/* The same writes for one CP part of a chunk (prefill context parallelism,
 * docs/kinds/context-parallel.md): TP writer `writer` of the part's CP rank
 * writes its block of a region of the part's tokens, placed at the part's
 * offset in the chunk's region. Its staging block holds the part's tokens
 * only (local offsets from 0); with CP 1 the one part is the chunk and the
 * spans are kvs__writer_spans'. A hybrid layout's block depends on the
 * chunk's place in the request of `total` tokens (kvs_layout_hybrid_writer:
 * one span, the whole block; KVS_ENOTSUP for a prefill stage that does not
 * hold the decode stage's layers). Errors as kvs__writer_spans. */
int kvs__part_spans(const kvs_layout_t *lay, int64_t decode_tp, int64_t decode_stage,
                    int64_t writer, int64_t prefill_stage, int64_t total,
                    const kvs_cp_part_t *part, kvs__span_t out[2], int *n);

#endif
