/*
 * grid.c - the chunk grid of spec §5. The transferred suffix of a request
 * starts at the decode's cached prefix `base` (page aligned) and is cut at
 * base + k*G; chunk i covers pages [i*F, (i+1)*F) of the suffix. Non-final
 * sends are floored to the grid so chunk ids are stable even when a
 * prefix-cache hit makes the first send larger than G.
 *
 * With different page sizes on the two sides (docs/kinds/page-sizes.md)
 * the grid's pages are the decode's (F = G / decode_page_size) and G is a
 * multiple of both sizes; base must then be aligned to both, so every chunk
 * starts on a page boundary of each side.
 *
 * Pure functions over a validated kvs_layout_t; kvs__chunk_plan (chunk.h)
 * adds the chunk's region size, and kvs__writer_spans the bytes of it each
 * writer writes, for the handlers (kvs__part_spans: those of one CP part's
 * writer, with prefill context parallelism).
 */
#include "arith.h"
#include "chunk.h"
#include "error.h"
#include "hybrid.h"

#include <kvstage/kvstage.h>

#include <assert.h>

/* ceil(a / b) for a >= 0, b > 0; no a + b - 1, which overflows near INT64_MAX. */

int64_t kvs_grid_num_chunks(const kvs_layout_t *lay, int64_t pages)
{
    if (pages <= 0)
        return 1; /* an empty range still makes one metadata-only send */
    return kvs__ceil_div(pages, lay->chunk_pages);
}

int kvs_grid_send(const kvs_layout_t *lay, int64_t base, int64_t start,
                  int64_t end, bool final, kvs_send_t *out)
{
    if (lay == NULL || out == NULL || base < 0 || start < base || end < start)
        return KVS_EINVAL;
    if (base % lay->page_size != 0 || base % lay->decode_page_size != 0)
        return KVS_EPREFIX_ALIGN;
    const int64_t g = lay->grid_tokens;
    if ((start - base) % g != 0)
        return KVS_EINVAL; /* a send starts where the previous one ended */
    const int64_t sent_end = final ? end : base + ((end - base) / g) * g;
    out->sent_end = sent_end;
    out->first_chunk = (start - base) / g;
    out->num_chunks = kvs__ceil_div(sent_end - start, g);
    if (final && out->num_chunks == 0)
        out->num_chunks = 1;
    return KVS_OK;
}

int kvs_grid_chunk(const kvs_layout_t *lay, int64_t base, int64_t total_end,
                   int64_t index, kvs_chunk_t *out)
{
    if (lay == NULL || out == NULL || base < 0 || total_end < base)
        return KVS_EINVAL;
    if (base % lay->page_size != 0 || base % lay->decode_page_size != 0)
        return KVS_EPREFIX_ALIGN;
    const int64_t pages = kvs__ceil_div(total_end - base, lay->decode_page_size);
    if (index < 0 || index >= kvs_grid_num_chunks(lay, pages))
        return KVS_ERANGE;
    const int64_t f = lay->chunk_pages, g = lay->grid_tokens;
    out->index = index;
    out->page_start = index * f;
    out->num_pages = pages - out->page_start < f ? pages - out->page_start : f;
    out->token_start = base + index * g;
    out->token_end = total_end - out->token_start > g ? out->token_start + g : total_end;
    return KVS_OK;
}

int kvs__chunk_plan(const kvs_layout_t *lay, int64_t decode_tp, int64_t decode_stage,
                    int64_t base, int64_t total, int64_t index, kvs__chunk_plan_t *out)
{
    kvs_chunk_t ch;
    int rc = kvs_grid_chunk(lay, base, total, index, &ch);
    if (rc != KVS_OK)
        return rc;
    out->tokens = ch.token_end - ch.token_start;
    out->token_start = ch.token_start;
    out->token_end = ch.token_end;
    out->page_start = ch.page_start;
    out->num_pages = ch.num_pages;
    if (kvs__hybrid(lay)) { /* writer blocks of the chunk's place in the request */
        kvs_hybrid_writer_t last;
        rc = kvs_layout_hybrid_writer(lay, decode_tp, decode_stage, lay->tp_writers - 1, total,
                                      &ch, &last);
        out->region_bytes = last.w.offset_bytes + last.w.len_bytes;
        return rc;
    }
    return kvs_layout_region_bytes(lay, decode_tp, decode_stage, out->tokens,
                                   &out->region_bytes);
}

/* Hybrid: a prefill stage writes its part of the writer block, one span
 * (kvs_layout_hybrid_part: the whole block when both sides have the same
 * PP or the prefill PP 1); for a chunk of tokens (grid_tokens: the
 * largest part, sized for the largest region, kvs__hybrid_max_part_bytes). */
static int kvs__hybrid_span(const kvs_layout_t *lay, int64_t decode_tp, int64_t decode_stage,
                            int64_t writer, int64_t prefill_stage, int64_t total,
                            const kvs_cp_part_t *part, kvs__span_t out[2], int *n)
{
    int64_t first = 0, count = 0;
    int rc = kvs_layout_stage_layers(lay, KVS_ROLE_PREFILL, prefill_stage, &first, &count);
    if (rc == KVS_OK)
        rc = kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, decode_stage, &first, &count);
    if (rc != KVS_OK)
        return rc;
    if (part == NULL) { /* the writer's largest part: its length is what counts */
        const int64_t most = kvs__hybrid_max_part_bytes(lay, writer, prefill_stage);
        out[0] = (kvs__span_t){0, 0, (uint64_t)most};
        *n = 1;
        return KVS_OK;
    }
    const kvs_chunk_t ch = {.token_start = part->token_start, .token_end = part->token_end};
    kvs_hybrid_writer_t hw;
    kvs_hybrid_part_t hp;
    rc = kvs_layout_hybrid_writer(lay, decode_tp, decode_stage, writer, total, &ch, &hw);
    if (rc == KVS_OK)
        rc = kvs_layout_hybrid_part(lay, &hw, decode_stage, prefill_stage, &hp);
    if (rc != KVS_OK)
        return rc == KVS_ENOENT ? KVS_ENOTSUP : rc; /* a stage with none of its layers */
    out[0] = (kvs__span_t){0,
                           (uint64_t)(part->offset_bytes + hw.w.offset_bytes + hp.offset_bytes),
                           (uint64_t)hp.len_bytes};
    *n = 1;
    return KVS_OK;
}

int kvs__writer_spans(const kvs_layout_t *lay, int64_t decode_tp, int64_t decode_stage,
                      int64_t writer, int64_t prefill_stage, int64_t tokens,
                      kvs__span_t out[2], int *n)
{
    if (kvs__hybrid(lay))
        return tokens == lay->grid_tokens
                   ? kvs__hybrid_span(lay, decode_tp, decode_stage, writer, prefill_stage, 0,
                                      NULL, out, n)
                   : KVS_ENOTSUP; /* a block's size depends on its place: part_spans */
    kvs_writer_t w;
    int64_t first = 0, count = 0, dfirst = 0, dcount = 0;
    int rc = kvs_layout_writer(lay, decode_tp, decode_stage, writer, tokens, &w);
    if (rc == KVS_OK)
        rc = kvs_layout_stage_layers(lay, KVS_ROLE_PREFILL, prefill_stage, &first, &count);
    if (rc == KVS_OK)
        rc = kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, decode_stage, &dfirst, &dcount);
    if (rc != KVS_OK)
        return rc;
    const uint64_t blk = (uint64_t)kvs_layout_layer_block_bytes(lay, tokens, w.heads.num_heads);
    const uint64_t at = (uint64_t)w.offset_bytes, lp = (uint64_t)count;
    /* A draft's part (src/draft.c) ends the blocks of the last prefill
     * stage, and of the last decode stage's regions: written by that
     * prefill stage alone, right after its last layer's slots on both
     * sides. */
    const uint64_t draft =
        prefill_stage == kvs_layout_draft_stage(lay, KVS_ROLE_PREFILL)
            ? (uint64_t)kvs_layout_draft_part_bytes(lay, tokens, w.heads.num_heads)
            : 0;
    if (first == dfirst && count == dcount) { /* the whole block, with its draft part
                                                 (Dp = Pp: the same stage on both sides) */
        out[0] = (kvs__span_t){0, at, (uint64_t)lay->planes * lp * blk + draft};
        *n = 1;
        return KVS_OK;
    }
    /* Prefill PP into a decode of PP 1: this stage's layer slots of the
     * region's block [K slots | V slots | draft part]. The last stage's
     * layers are the block's last slots (first + count = layers), so its
     * last span runs on into the draft part, which its staging block
     * [K | V | draft] holds right after its V layers as well. */
    const uint64_t slot = (uint64_t)(first - dfirst), lx = (uint64_t)dcount;
    assert(draft == 0 || slot + lp == lx);
    if (lay->planes == 1) { /* one plane (MLA): its layers' slots, one range */
        out[0] = (kvs__span_t){0, at + slot * blk, lp * blk + draft};
        *n = 1;
        return KVS_OK;
    }
    out[0] = (kvs__span_t){0, at + slot * blk, lp * blk};                     /* K layers */
    out[1] = (kvs__span_t){lp * blk, at + (lx + slot) * blk, lp * blk + draft}; /* V layers */
    *n = 2;
    return KVS_OK;
}

int kvs__part_spans(const kvs_layout_t *lay, int64_t decode_tp, int64_t decode_stage,
                    int64_t writer, int64_t prefill_stage, int64_t total,
                    const kvs_cp_part_t *part, kvs__span_t out[2], int *n)
{
    if (part->offset_bytes < 0 || part->token_end < part->token_start)
        return KVS_ERANGE;
    if (kvs__hybrid(lay))
        return kvs__hybrid_span(lay, decode_tp, decode_stage, writer, prefill_stage, total,
                                part, out, n);
    int rc = kvs__writer_spans(lay, decode_tp, decode_stage, writer, prefill_stage,
                               part->token_end - part->token_start, out, n);
    if (rc != KVS_OK)
        return rc;
    /* The part's region lies whole inside the chunk's (kvs_layout_cp_part):
     * its offset plus any span end stays below the chunk's region bytes. */
    for (int i = 0; i < *n; i++)
        out[i].remote_off += (uint64_t)part->offset_bytes;
    return KVS_OK;
}
