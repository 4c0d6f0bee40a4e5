/*
 * context_parallel.c - prefill context parallelism in the layout planner
 * (docs/kinds/context-parallel.md): which token range of a request each
 * prefill CP rank holds, which CP ranks write a chunk's region, and where
 * each one's rows go in it.
 *
 * Pure functions over a validated kvs_layout_t: no allocation, no state.
 *
 * The split: contiguous ranges of `per` = ceil(total / CP) tokens rounded
 * up to cp_align_tokens (the lcm of the two page sizes), CP rank c holding
 * [c * per, (c + 1) * per) clipped to the request. A range thus starts a
 * page on both sides, as a chunk does (the cached prefix is aligned to both
 * sizes), so every CP part of a chunk starts a prefill page of its CP rank
 * and a decode page of the region.
 *
 * The region: a chunk's CP parts in token order, each laid out as a whole
 * region of its own tokens (spec §4: TP writers, then layers, token-major).
 * A region's bytes are linear in its tokens, so the part of tokens [a, b)
 * of a chunk [ts, te) starts (a - ts) region-bytes-per-token in and the
 * parts tile the region exactly; with CP 1 the one part is the spec §4
 * region. Each (CP rank, TP writer) of a chunk makes ONE write: its TP
 * writer's block of its part.
 *
 * A hybrid layout (src/hybrid.c) is not linear in its tokens: a part's
 * window rows are those of its tokens inside the window, and the state
 * (linear attention / SSM passed from CP rank to CP rank, LASP-style) is
 * final on the CP rank holding the request's last token, so only the part
 * ending at the request's end carries it. Each part is the hybrid region
 * of its own tokens (kvs_layout_hybrid_writer over [a, b)) and starts
 * after the bytes of the parts before it. The parts still tile the
 * region: full and window rows split by token, the state in one part. An
 * empty chunk of a hybrid layout is the state owner's (rank of the last
 * token), where it carries the state.
 */
#include "arith.h"
#include "hybrid.h"

#include <kvstage/kvstage.h>

/* `per` of the split; 0 for an empty request. */
static int64_t kvs__cp_per(const kvs_layout_t *lay, int64_t total)
{
    if (total <= 0)
        return 0;
    const int64_t align = lay->cp_align_tokens;
    const int64_t units = kvs__ceil_div(kvs__ceil_div(total, lay->prefill_cp), align);
    if (units > INT64_MAX / align)
        return INT64_MAX; /* only near INT64_MAX tokens: rank 0 holds them all */
    return units * align;
}

int kvs_layout_cp_range(const kvs_layout_t *lay, int64_t total_tokens, int64_t cp_rank,
                        int64_t *out_start, int64_t *out_end)
{
    if (lay == NULL || out_start == NULL || out_end == NULL || total_tokens < 0)
        return KVS_EINVAL;
    if (cp_rank < 0 || cp_rank >= lay->prefill_cp)
        return KVS_ERANGE;
    const int64_t per = kvs__cp_per(lay, total_tokens);
    if (per == 0 || cp_rank >= kvs__ceil_div(total_tokens, per)) {
        *out_start = *out_end = total_tokens; /* nothing of this request */
        return KVS_OK;
    }
    /* cp_rank < ceil(total / per): cp_rank * per < total, no overflow. */
    const int64_t start = cp_rank * per;
    *out_start = start;
    *out_end = total_tokens - start > per ? start + per : total_tokens;
    return KVS_OK;
}

/* The CP rank whose range holds the request's last token (0 for an empty
 * request): the one with the final state of a state layer. */
static int64_t kvs__cp_last_rank(const kvs_layout_t *lay, int64_t total)
{
    const int64_t per = kvs__cp_per(lay, total);
    return per == 0 ? 0 : (total - 1) / per;
}

/* The bytes of all TP writers' hybrid blocks of tokens [a, b) of a request
 * of `total` tokens (writer blocks are equal: the last one's end). */
static int kvs__cp_hybrid_bytes(const kvs_layout_t *lay, int64_t decode_rank,
                                int64_t decode_stage, int64_t total, int64_t a, int64_t b,
                                int64_t *out)
{
    const kvs_chunk_t ch = {.token_start = a, .token_end = b};
    kvs_hybrid_writer_t last;
    if (kvs_layout_hybrid_writer(lay, decode_rank, decode_stage, lay->tp_writers - 1, total,
                                 &ch, &last) != KVS_OK)
        return KVS_ERANGE;
    *out = last.w.offset_bytes + last.w.len_bytes;
    return KVS_OK;
}

/* A chunk of [0, total) no longer than the grid. */
static bool kvs__cp_chunk_ok(const kvs_layout_t *lay, int64_t total, const kvs_chunk_t *ch)
{
    return total >= 0 && ch->token_start >= 0 && ch->token_end >= ch->token_start &&
           ch->token_end <= total && ch->token_end - ch->token_start <= lay->grid_tokens;
}

/* kvs_layout_cp_part of a hybrid layout: the part of CP rank c is the
 * hybrid region of its tokens of the chunk, after the parts of the CP
 * ranks before it (their bytes summed: not linear in tokens). */
static int kvs__cp_hybrid_part(const kvs_layout_t *lay, int64_t decode_rank,
                               int64_t decode_stage, int64_t total, const kvs_chunk_t *chunk,
                               int64_t cp_rank, kvs_cp_part_t *out)
{
    const int64_t ts = chunk->token_start, te = chunk->token_end;
    int64_t cs = 0, ce = 0, off = 0, len = 0;
    if (ts == te) { /* the empty chunk: the state owner's (its state, if any) */
        if (cp_rank != kvs__cp_last_rank(lay, total))
            return KVS_ENOENT;
        if (kvs__cp_hybrid_bytes(lay, decode_rank, decode_stage, total, ts, te, &len) != KVS_OK)
            return KVS_ERANGE;
        *out = (kvs_cp_part_t){.cp_rank = cp_rank, .token_start = ts, .token_end = te,
                               .len_bytes = len};
        (void)kvs_layout_cp_range(lay, total, cp_rank, &cs, &ce);
        out->local_token_start = ts > cs ? ts - cs : 0;
        return KVS_OK;
    }
    (void)kvs_layout_cp_range(lay, total, cp_rank, &cs, &ce);
    const int64_t a = ts > cs ? ts : cs, b = te < ce ? te : ce;
    if (a >= b)
        return KVS_ENOENT;
    /* the parts before it tile [ts, a) (ranges are contiguous): one
     * hybrid region of those tokens has their bytes, none of them
     * carrying a state (they end before a <= total - 1) */
    if (kvs__cp_hybrid_bytes(lay, decode_rank, decode_stage, total, ts, a, &off) != KVS_OK ||
        kvs__cp_hybrid_bytes(lay, decode_rank, decode_stage, total, a, b, &len) != KVS_OK)
        return KVS_ERANGE;
    *out = (kvs_cp_part_t){.cp_rank = cp_rank, .token_start = a, .token_end = b,
                           .local_token_start = a - cs, .offset_bytes = off,
                           .len_bytes = len};
    return KVS_OK;
}

int kvs_layout_cp_part(const kvs_layout_t *lay, int64_t decode_rank, int64_t decode_stage,
                       int64_t total_tokens, const kvs_chunk_t *chunk, int64_t cp_rank,
                       kvs_cp_part_t *out)
{
    if (lay == NULL || chunk == NULL || out == NULL)
        return KVS_EINVAL;
    int64_t per_token = 0, cs = 0, ce = 0;
    if (!kvs__cp_chunk_ok(lay, total_tokens, chunk) || cp_rank < 0 ||
        cp_rank >= lay->prefill_cp)
        return KVS_ERANGE;
    if (kvs__hybrid(lay))
        return kvs__cp_hybrid_part(lay, decode_rank, decode_stage, total_tokens, chunk,
                                   cp_rank, out);
    if (kvs_layout_region_bytes(lay, decode_rank, decode_stage, 1, &per_token) != KVS_OK)
        return KVS_ERANGE;
    (void)kvs_layout_cp_range(lay, total_tokens, cp_rank, &cs, &ce);
    const int64_t ts = chunk->token_start, te = chunk->token_end;
    if (ts == te) { /* the metadata-only send: CP rank 0 reports it */
        if (cp_rank != 0)
            return KVS_ENOENT;
        *out = (kvs_cp_part_t){.cp_rank = 0, .token_start = ts, .token_end = ts};
        return KVS_OK;
    }
    const int64_t a = ts > cs ? ts : cs, b = te < ce ? te : ce;
    if (a >= b)
        return KVS_ENOENT;
    /* (a - ts) and (b - a) are at most G: the region of G tokens fits int64
     * (kvs_layout_init), so neither product overflows. */
    *out = (kvs_cp_part_t){.cp_rank = cp_rank, .token_start = a, .token_end = b,
                           .local_token_start = a - cs,
                           .offset_bytes = (a - ts) * per_token,
                           .len_bytes = (b - a) * per_token};
    return KVS_OK;
}

int kvs_layout_cp_writers(const kvs_layout_t *lay, int64_t total_tokens,
                          const kvs_chunk_t *chunk, int64_t *out_first_cp, int64_t *out_count)
{
    if (lay == NULL || chunk == NULL || out_first_cp == NULL || out_count == NULL)
        return KVS_EINVAL;
    if (!kvs__cp_chunk_ok(lay, total_tokens, chunk))
        return KVS_ERANGE;
    if (chunk->token_start == chunk->token_end) { /* hybrid: the state owner's */
        *out_first_cp = kvs__hybrid(lay) ? kvs__cp_last_rank(lay, total_tokens) : 0;
        *out_count = 1;
        return KVS_OK;
    }
    /* per * CP >= total > token_end - 1: both quotients are CP ranks. */
    const int64_t per = kvs__cp_per(lay, total_tokens);
    const int64_t first = chunk->token_start / per, last = (chunk->token_end - 1) / per;
    *out_first_cp = first;
    *out_count = last - first + 1;
    return KVS_OK;
}

int64_t kvs_layout_chunk_arrivals(const kvs_layout_t *lay, int64_t total_tokens,
                                  const kvs_chunk_t *chunk)
{
    int64_t first = 0, count = 0;
    if (kvs_layout_cp_writers(lay, total_tokens, chunk, &first, &count) != KVS_OK)
        return 0;
    /* count <= G / cp_align_tokens + 1, so this stays below the region
     * bound of kvs_layout_init (tp_writers x Pp x G). */
    return count * lay->expected_arrivals;
}
