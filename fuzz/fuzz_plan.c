/*
 * fuzz_plan.c - libFuzzer target for the layout planner and the chunk grid
 * (spec §3-§5, src/layout.c, src/grid.c).
 *
 * The input becomes kvs_layout_params_t fields, each drawn from small
 * values, powers of two, zero, negatives, 2^31..2^62, INT64_MIN/MAX or any
 * 64-bit pattern. Properties, each an abort() when violated:
 * - kvs_layout_init returns KVS_OK exactly when no rule of the spec is
 *   broken; otherwise a documented code (EINVAL, EDTYPE, EHEADS, EHEAD_SPLIT,
 *   EPP_SPLIT, ECHUNK, ERANGE) of a rule that IS broken, with err.msg set
 *   (ERANGE also for layers over KVS_MAX_LAYERS or a TP or PP over
 *   KVS_MAX_PARALLEL: the plan walks them, and 2^35 stages once held the
 *   fuzzer in one loop for minutes);
 * - a plan's derived sizes follow spec §2-§3 (G = max(1, C/ps)*ps, F*ps = G,
 *   src/dst heads, writers, arrivals, targets, path);
 * - kvs_pp_stage_layers on any (layers, pp, stage): EINVAL / ERANGE exactly
 *   for bad input; otherwise stages are contiguous from layer 0, end at the
 *   last layer, hold base = layers / pp or base + 1 layers, the last
 *   layers % pp stages the larger count (spec §4: uneven splits);
 *   kvs_layout_stage_layers agrees with it for both sides of a plan;
 * - for every decode rank d and writer i (when D * W <= 4096) at a decode
 *   stage e drawn from the input (and the last stage, which holds the most
 *   layers): the writer exists, offsets are contiguous, lengths are
 *   T*nh*(hd*s + scale bytes)*Lx*2 with Lx the layers of stage e (scale
 *   planes drawn last: none, per-token, per-block of any block, or an
 *   unknown kind, refused as the rules say), the region
 *   is the last offset + len, the head ranges lie inside [0, src_heads) and
 *   [0, dst_heads), copy the same global heads on both sides (heads of a
 *   rank counted by integer division when replicated), and together cover
 *   all of d's heads; kvs_layout_writer_index(r, d) == i, kvs_layout_target
 *   of r includes d, and a rank that is not a writer of d gets KVS_ENOENT;
 * - kvs_grid_send / kvs_grid_chunk / kvs_grid_num_chunks on base, start and
 *   end derived from the input (huge ones included): non-final sends end on
 *   the grid, final sends end at end with >= 1 chunk, consecutive sends
 *   number their chunks without gaps, chunks tile the suffix;
 * - prefill context parallelism (src/context_parallel.c), on the same plan
 *   with a CP size drawn last (negative: KVS_EINVAL naming prefill_cp): for
 *   a request length drawn from the input, the CP ranges are contiguous,
 *   tile [0, total) in rank order, start on cp_align_tokens and are equal
 *   but for the last non-empty one; for chunks of a suffix [base, total),
 *   the parts of the CP ranks kvs_layout_cp_writers names tile the chunk
 *   in token order, each at (its start - the chunk's) region bytes per
 *   token, its rows at its start - its range's, and every other CP rank
 *   gets KVS_ENOENT; the arrivals are those CP ranks x expected_arrivals;
 * - hybrid layers (src/hybrid.c), on the same plan with a layer pattern
 *   drawn last: refused exactly by its rules; otherwise each writer's
 *   slots and state part tile its block in layer order, window slots hold
 *   the chunk's rows inside the page-aligned window, the state rides in the
 *   request's last chunk only, and no region exceeds the largest; with a
 *   prefill CP size drawn, the CP parts (each the hybrid region of its
 *   tokens) tile the region, the state in the part ending the request;
 * - a draft model's layers (src/draft.c), drawn last: refused by its rules,
 *   or every writer's block grows by exactly the draft part, its writer,
 *   heads and offsets otherwise those of the plan without a draft.
 */
#include <kvstage/kvstage.h>

#include "fuzz_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PAIRS 4096  /* decode ranks x writers walked per input */
#define MAX_TARGET_WALK 16384

typedef __int128 i128;

/* Two's complement without implementation-defined conversions. */
static int64_t as_i64(uint64_t u)
{
    return u <= (uint64_t)INT64_MAX ? (int64_t)u : -(int64_t)(~u) - 1;
}

/* A field value: mostly small, sometimes an edge. */
static int64_t pick(input_t *in, int64_t small_max)
{
    switch (in_u8(in) % 16u) {
    case 0:
        return 0;
    case 1:
        return -1 - (int64_t)in_u8(in);
    case 2:
        return INT64_MIN;
    case 3:
        return INT64_MAX;
    case 4:
        return (int64_t)1 << (31u + in_u8(in) % 32u); /* 2^31 .. 2^62 */
    case 5:
        return as_i64(in_u64(in));
    case 6:
    case 7:
    case 8:
        return (int64_t)1 << (in_u8(in) % 7u); /* 1 .. 64 */
    default:
        return 1 + (int64_t)(in_u16(in) % (uint64_t)small_max);
    }
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* a and b (both > 0) divide one another. */
static bool nested(int64_t a, int64_t b) { return a >= b ? a % b == 0 : b % a == 0; }

/* ceil(a / b) for a >= 0, b > 0, without overflow. */
static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* x * y saturated at 2^100 (inputs >= 0): no 128-bit overflow. */
static i128 sat_mul(i128 x, i128 y)
{
    const i128 cap = (i128)1 << 100;
    if (x == 0 || y == 0)
        return 0;
    if (x > cap / y)
        return cap;
    return x * y;
}

/* ---- the rules of spec §2-§4 as classes of error -------------------------- */

enum {
    V_EINVAL = 1 << 0,
    V_EDTYPE = 1 << 1,
    V_EHEADS = 1 << 2,
    V_EHEAD_SPLIT = 1 << 3,
    V_EPP_SPLIT = 1 << 4,
    V_ECHUNK = 1 << 5,
    V_ERANGE = 1 << 6,
};

static int violation_of(int status)
{
    switch (status) {
    case KVS_EINVAL:
        return V_EINVAL;
    case KVS_EDTYPE:
        return V_EDTYPE;
    case KVS_EHEADS:
        return V_EHEADS;
    case KVS_EHEAD_SPLIT:
        return V_EHEAD_SPLIT;
    case KVS_EPP_SPLIT:
        return V_EPP_SPLIT;
    case KVS_ECHUNK:
        return V_ECHUNK;
    case KVS_ERANGE:
        return V_ERANGE;
    default:
        return 0; /* not a documented code of kvs_layout_init */
    }
}

/* Bytes of one head's scales in a token row (0 without scale planes), for
 * params whose scales are valid. */
static int64_t scale_bytes_of(const kvs_layout_params_t *p)
{
    if (p->kv_scales == KVS_KV_SCALES_PER_TOKEN)
        return 4; /* fp32 */
    if (p->kv_scales == KVS_KV_SCALES_PER_BLOCK)
        return p->head_dim / (p->scale_block > 0 ? p->scale_block : 32); /* e8m0 */
    return 0;
}

/* Every rule p breaks; a rule is only judged when what it needs is valid.
 * *heads gets H when it resolves. */
static int violations(const kvs_layout_params_t *p, int64_t *heads)
{
    int v = 0;
    const bool sizes_ok = p->head_dim > 0 && p->layers > 0 && p->page_size > 0 &&
                          p->prefill_tp > 0 && p->decode_tp > 0;
    if (!sizes_ok || p->prefill_pp < 0 || p->decode_pp < 0 || p->total_heads < 0 ||
        p->heads_per_rank < 0 || p->heads_per_rank_tp < 0)
        v |= V_EINVAL;
    const int64_t elem = kvs_dtype_bytes(p->dtype);
    if (p->dtype < KVS_DTYPE_BF16 || p->dtype > KVS_DTYPE_FP32)
        v |= V_EDTYPE;
    if (p->chunk_tokens < 0)
        v |= V_ECHUNK;
    /* Scale planes (docs/kinds/fp8-scales.md): a known kind, fp8 only, and
     * with per-block a block dividing the head. */
    if (p->kv_scales != KVS_KV_SCALES_NONE) {
        if (p->kv_scales != KVS_KV_SCALES_PER_TOKEN && p->kv_scales != KVS_KV_SCALES_PER_BLOCK)
            v |= V_EINVAL;
        else if (p->dtype != KVS_DTYPE_FP8)
            v |= V_EDTYPE;
        else if (p->scale_block < 0 ||
                 (p->kv_scales == KVS_KV_SCALES_PER_BLOCK &&
                  (p->head_dim <= 0 ||
                   p->head_dim % (p->scale_block > 0 ? p->scale_block : 32) != 0)))
            v |= V_EINVAL;
    }

    /* H: the model's total, else per-rank heads x that TP (both bounded to
     * 32 bits by kvs_heads_resolve), else unresolvable. */
    *heads = 0;
    const int64_t tp = p->heads_per_rank_tp > 0 ? p->heads_per_rank_tp : p->prefill_tp;
    if (p->total_heads > 0)
        *heads = p->total_heads;
    else if (p->heads_per_rank > 0 && tp > 0 && p->heads_per_rank <= INT32_MAX &&
             tp <= INT32_MAX)
        *heads = p->heads_per_rank * tp;
    else if (p->total_heads >= 0 && p->heads_per_rank >= 0 && p->heads_per_rank_tp >= 0)
        v |= V_EHEADS;

    const int64_t H = *heads, P = p->prefill_tp, D = p->decode_tp;
    if (H > 0 && P > 0 && D > 0 &&
        (!nested(P, D) || !nested(H, P) || !nested(H, D)))
        v |= V_EHEAD_SPLIT;

    /* Bounds of the model and the deployment (kvstage.h). */
    if (p->layers > KVS_MAX_LAYERS || p->prefill_tp > KVS_MAX_PARALLEL ||
        p->decode_tp > KVS_MAX_PARALLEL || p->prefill_pp > KVS_MAX_PARALLEL ||
        p->decode_pp > KVS_MAX_PARALLEL)
        v |= V_ERANGE;

    if (p->layers > 0 && p->prefill_pp >= 0 && p->decode_pp >= 0) {
        const int64_t pp = p->prefill_pp ? p->prefill_pp : 1;
        const int64_t dp = p->decode_pp ? p->decode_pp : 1;
        /* Stages need not split evenly; each holds a layer (spec §4). */
        if ((dp != 1 && dp != pp) || p->layers < pp || p->layers < dp)
            v |= V_EPP_SPLIT;
    }

    if (v == 0 && elem > 0) {
        /* The largest region, W writers of G tokens, must fit int64. */
        const int64_t C = p->chunk_tokens ? p->chunk_tokens : KVS_DEFAULT_CHUNK_TOKENS;
        const int64_t G = max64(1, C / p->page_size) * p->page_size;
        const int64_t nh = P > D ? max64(1, H / P) : max64(1, H / D);
        /* one writer per distinct head of a decode rank's P / D sources */
        const int64_t W = P > D ? min64(P / D, max64(1, H / D)) : 1;
        const int64_t dp = p->decode_pp ? p->decode_pp : 1;
        i128 bytes = G;
        bytes = sat_mul(bytes, nh);
        /* a head's row and its scales */
        bytes = sat_mul(bytes, (i128)p->head_dim * elem + scale_bytes_of(p));
        bytes = sat_mul(bytes, ceil_div(p->layers, dp)); /* the largest stage */
        bytes = sat_mul(bytes, 2);
        bytes = sat_mul(bytes, W);
        if (bytes > INT64_MAX)
            v |= V_ERANGE;
    }
    return v;
}

/* ---- spec §3: which global head a local head of a rank is ----------------- */

static int64_t global_head(int64_t H, int64_t tp, int64_t rank, int64_t local)
{
    if (H >= tp)
        return rank * (H / tp) + local;
    return rank / (tp / H); /* replicated: ranks sharing a head, by division */
}

typedef struct span {
    int64_t start, len;
} span_t;

static int span_cmp(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* ---- pipeline stages (spec §4) -------------------------------------------- */

/* First layer of stage e of `layers` over pp stages, from the spec's words:
 * stages before pp - rem hold base layers, every later one a layer more. */
static i128 stage_first(int64_t layers, int64_t pp, int64_t e)
{
    const int64_t base = layers / pp, rem = layers % pp;
    return (i128)e * base + max64(0, e - (pp - rem));
}

/* kvs_pp_stage_layers on one stage against the model; returns the count. */
static int64_t check_stage(int64_t layers, int64_t pp, int64_t e)
{
    int64_t first = -7, n = -7;
    CHECK(kvs_pp_stage_layers(layers, pp, e, &first, &n) == KVS_OK);
    CHECK((i128)first == stage_first(layers, pp, e));
    CHECK((i128)first + n == stage_first(layers, pp, e + 1));
    CHECK(n == layers / pp + (e >= pp - layers % pp));
    CHECK(first >= 0 && n >= 0 && (i128)first + n <= layers);
    return n;
}

/* Any raw (layers, pp, stage): refusals, then the split's shape. */
static void check_pp_split(int64_t layers, int64_t pp, input_t *in)
{
    int64_t first = -7, n = -7;
    const int64_t e = in_u8(in) % 4u == 0 ? as_i64(in_u64(in))
                                          : (pp > 0 ? (int64_t)(in_u64(in) % (uint64_t)pp) : 0);
    const int rc = kvs_pp_stage_layers(layers, pp, e, &first, &n);
    CHECK(kvs_pp_stage_layers(layers, pp, e, NULL, &n) == KVS_EINVAL);
    CHECK(kvs_pp_stage_layers(layers, pp, e, &first, NULL) == KVS_EINVAL);
    if (layers <= 0 || pp <= 0) {
        CHECK(rc == KVS_EINVAL && first == -7 && n == -7);
        return;
    }
    if (e < 0 || e >= pp) {
        CHECK(rc == KVS_ERANGE && first == -7 && n == -7);
        return;
    }
    check_stage(layers, pp, e);
    if (pp > 4096)
        return;
    /* The whole split: contiguous, all of it, rem stages of base + 1 last. */
    int64_t at = 0, bigger = 0, prev = 0;
    for (int64_t s = 0; s < pp; s++) {
        CHECK(kvs_pp_stage_layers(layers, pp, s, &first, &n) == KVS_OK);
        CHECK(first == at && n >= prev && n - layers / pp <= 1);
        bigger += n > layers / pp;
        at += n;
        prev = n;
    }
    CHECK(at == layers && bigger == layers % pp);
}

/* Both sides of a plan against kvs_pp_stage_layers; the largest stage
 * holds prefill_layers / decode_layers. */
static void check_layout_stages(const kvs_layout_t *l)
{
    int64_t first, n;
    for (int side = 0; side < 2; side++) {
        const kvs_role_t role = side ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
        const int64_t pp = side ? l->decode_pp : l->prefill_pp;
        CHECK(kvs_layout_stage_layers(l, role, pp, &first, &n) == KVS_ERANGE);
        CHECK(kvs_layout_stage_layers(l, role, -1, &first, &n) == KVS_ERANGE);
        CHECK(kvs_layout_stage_layers(NULL, role, 0, &first, &n) == KVS_EINVAL);
        CHECK(check_stage(l->layers, pp, 0) >= 1); /* every stage holds a layer */
        CHECK(check_stage(l->layers, pp, pp - 1) ==
              (side ? l->decode_layers : l->prefill_layers));
        CHECK(kvs_layout_stage_layers(l, role, pp - 1, &first, &n) == KVS_OK &&
              (i128)first == stage_first(l->layers, pp, pp - 1) &&
              n == (side ? l->decode_layers : l->prefill_layers));
    }
    CHECK(kvs_layout_stage_layers(l, (kvs_role_t)2, 0, &first, &n) == KVS_EINVAL);
}

/* ---- the writers of every decode rank ------------------------------------- */

static void check_writers(const kvs_layout_t *l, input_t *in)
{
    const int64_t D = l->decode_tp, P = l->prefill_tp, W = l->tp_writers;
    const int64_t G = l->grid_tokens, H = l->total_heads, Dp = l->decode_pp;
    /* A decode stage to walk, and its layer slots Lx (spec §4). */
    const int64_t e = (int64_t)(in_u64(in) % (uint64_t)Dp);
    const int64_t Lx = check_stage(l->layers, Dp, e);

    /* T tokens: a full chunk, an empty one, or anything in between. */
    int64_t T;
    switch (in_u8(in) % 4u) {
    case 0:
        T = G;
        break;
    case 1:
        T = 0;
        break;
    default:
        T = 1 + (int64_t)(in_u64(in) % (uint64_t)G);
        break;
    }

    kvs_writer_t w;
    int64_t out;
    CHECK(kvs_layout_writer(l, D, e, 0, T, &w) == KVS_ERANGE);
    CHECK(kvs_layout_writer(l, -1, e, 0, T, &w) == KVS_ERANGE);
    CHECK(kvs_layout_writer(l, 0, Dp, 0, T, &w) == KVS_ERANGE);
    CHECK(kvs_layout_writer(l, 0, -1, 0, T, &w) == KVS_ERANGE);
    CHECK(kvs_layout_writer(l, 0, e, W, T, &w) == KVS_ERANGE);
    CHECK(kvs_layout_writer(l, 0, e, -1, T, &w) == KVS_ERANGE);
    CHECK(kvs_layout_writer(l, 0, e, 0, -1, &w) == KVS_ERANGE);
    if (G < INT64_MAX)
        CHECK(kvs_layout_writer(l, 0, e, 0, G + 1, &w) == KVS_ERANGE);
    CHECK(kvs_layout_writer(l, 0, e, 0, T, NULL) == KVS_EINVAL);
    CHECK(kvs_layout_region_bytes(l, D, e, T, &out) == KVS_ERANGE);
    CHECK(kvs_layout_region_bytes(l, 0, Dp, T, &out) == KVS_ERANGE);
    CHECK(kvs_layout_region_bytes(l, 0, e, T, NULL) == KVS_EINVAL);
    CHECK(kvs_layout_target(l, P, 0, &out) == KVS_ERANGE);
    CHECK(kvs_layout_target(l, 0, l->targets_per_prefill, &out) == KVS_ERANGE);
    CHECK(kvs_layout_target(l, -1, 0, &out) == KVS_ERANGE);
    CHECK(kvs_layout_writer_index(l, P, 0, &out) == KVS_ERANGE);
    CHECK(kvs_layout_writer_index(l, 0, D, &out) == KVS_ERANGE);
    CHECK(kvs_layout_writer_index(l, -1, 0, &out) == KVS_ERANGE);

    if (D > MAX_PAIRS || W > MAX_PAIRS || D * W > MAX_PAIRS)
        return;
    const bool walk_targets = D * l->targets_per_prefill <= MAX_TARGET_WALK;
    const int64_t nh_want = P > D ? l->src_heads : l->dst_heads;

    span_t *spans = malloc(sizeof(span_t) * (size_t)W);
    int64_t *ranks = malloc(sizeof(int64_t) * (size_t)W);
    CHECK(spans != NULL && ranks != NULL);
    int64_t max_full = 0;
    for (int64_t d = 0; d < D; d++) {
        int64_t sum = 0;
        for (int64_t i = 0; i < W; i++) {
            CHECK(kvs_layout_writer(l, d, e, i, T, &w) == KVS_OK);
            CHECK(w.writer_index == i);
            CHECK(w.offset_bytes == sum); /* contiguous */
            const int64_t nh = w.heads.num_heads;
            CHECK(nh == nh_want);
            const i128 len =
                (i128)T * nh * (l->head_dim * l->elem_bytes + l->scale_bytes) * Lx * 2;
            CHECK((i128)w.len_bytes == len);
            CHECK(kvs_layout_layer_block_bytes(l, T, nh) * Lx * 2 == w.len_bytes);
            CHECK(w.heads.src_start >= 0 && w.heads.src_start + nh <= l->src_heads);
            CHECK(w.heads.dst_start >= 0 && w.heads.dst_start + nh <= l->dst_heads);

            /* The same global heads on both sides (first and last). */
            const int64_t r = w.prefill_rank;
            CHECK(r >= 0 && r < P);
            CHECK(global_head(H, P, r, w.heads.src_start) ==
                  global_head(H, D, d, w.heads.dst_start));
            CHECK(global_head(H, P, r, w.heads.src_start + nh - 1) ==
                  global_head(H, D, d, w.heads.dst_start + nh - 1));

            CHECK(kvs_layout_writer_index(l, r, d, &out) == KVS_OK && out == i);
            if (walk_targets) {
                bool found = false;
                for (int64_t j = 0; j < l->targets_per_prefill && !found; j++) {
                    int64_t t = -1;
                    CHECK(kvs_layout_target(l, r, j, &t) == KVS_OK);
                    CHECK(t >= 0 && t < D);
                    found = t == d;
                }
                CHECK(found);
            }
            spans[i] = (span_t){.start = w.heads.dst_start, .len = nh};
            ranks[i] = r;
            sum += w.len_bytes;
        }
        int64_t region = -1;
        CHECK(kvs_layout_region_bytes(l, d, e, T, &region) == KVS_OK && region == sum);
        CHECK(sum == T * W * nh_want * (l->head_dim * l->elem_bytes + l->scale_bytes) * Lx * 2);

        /* The writers cover every head of d, each once (a replicated head
         * is written by one of the ranks holding it): the sorted spans
         * tile [0, dst_heads). */
        qsort(spans, (size_t)W, sizeof spans[0], span_cmp);
        int64_t covered = 0;
        for (int64_t i = 0; i < W; i++) {
            CHECK(spans[i].start == covered); /* no gap, no head twice */
            covered = spans[i].start + spans[i].len;
        }
        CHECK(covered == l->dst_heads);

        /* Distinct writer ranks; any other prefill rank is no writer of d. */
        for (int64_t i = 0; i < W; i++)
            for (int64_t j = i + 1; j < W && W <= 64; j++)
                CHECK(ranks[i] != ranks[j]);
        const int64_t other = (int64_t)(in_u64(in) % (uint64_t)P);
        bool is_writer = false;
        for (int64_t i = 0; i < W; i++)
            is_writer = is_writer || ranks[i] == other;
        const int rc = kvs_layout_writer_index(l, other, d, &out);
        CHECK(is_writer ? rc == KVS_OK : rc == KVS_ENOENT);
        /* a source of d that writes nothing only reports: its index is past
         * the writers', and maps back to it */
        int64_t si = -1, back = -1;
        if (!is_writer && kvs_layout_source_index(l, other, d, &si) == KVS_OK) {
            CHECK(si >= W && si < l->tp_sources);
            CHECK(kvs_layout_source_rank(l, d, si, &back) == KVS_OK && back == other);
        }

        /* The last decode stage holds the most layers: its regions are the
         * largest (the lower bound: no stage's region is larger). */
        int64_t full = 0, last = 0;
        CHECK(kvs_layout_region_bytes(l, d, e, G, &full) == KVS_OK && full >= 0);
        CHECK(kvs_layout_region_bytes(l, d, Dp - 1, G, &last) == KVS_OK && last >= full);
        max_full = max64(max_full, last);
    }
    CHECK(kvs_layout_max_region_bytes(l) == max_full);
    free(spans);
    free(ranks);
}

/* ---- the chunk grid -------------------------------------------------------- */

/* Chunk idx of the suffix [base, end) against spec §5. */
static void check_chunk(const kvs_layout_t *l, int64_t base, int64_t end, int64_t idx)
{
    const int64_t F = l->chunk_pages, G = l->grid_tokens, ps = l->page_size;
    const int64_t pages = ceil_div(end - base, ps);
    kvs_chunk_t c;
    CHECK(kvs_grid_chunk(l, base, end, idx, &c) == KVS_OK);
    CHECK(c.index == idx);
    CHECK((i128)c.page_start == (i128)idx * F);
    CHECK((i128)c.token_start == (i128)base + (i128)idx * G);
    CHECK(c.token_start <= end);
    CHECK((i128)c.token_end == ((i128)c.token_start + G < end ? (i128)c.token_start + G : end));
    CHECK(c.num_pages == min64(F, pages - c.page_start));
    CHECK(c.num_pages >= 0 && (i128)c.num_pages * ps >= c.token_end - c.token_start);
}

static void check_grid(const kvs_layout_t *l, input_t *in)
{
    const int64_t G = l->grid_tokens, ps = l->page_size, F = l->chunk_pages;

    /* kvs_grid_num_chunks: ceil(pages / F), at least 1. */
    const int64_t pg = as_i64(in_u64(in));
    CHECK(kvs_grid_num_chunks(l, pg) == (pg <= 0 ? 1 : ceil_div(pg, F)));

    /* base = kb * ps: 0, small, or near INT64_MAX. */
    int64_t kb;
    switch (in_u8(in) % 4u) {
    case 0:
        kb = 0;
        break;
    case 1:
        kb = INT64_MAX / ps - in_u8(in);
        break;
    default:
        kb = in_u16(in);
        break;
    }
    int64_t base;
    if (kb < 0 || __builtin_mul_overflow(kb, ps, &base))
        return;

    /* Refusals: unaligned base, a start off the grid, end before start. */
    kvs_send_t s;
    if (ps > 1 && base < INT64_MAX)
        CHECK(kvs_grid_send(l, base + 1, base + 1, base + 1, true, &s) == KVS_EPREFIX_ALIGN);
    if (G > 1 && base < INT64_MAX)
        CHECK(kvs_grid_send(l, base, base + 1, base + 1, false, &s) == KVS_EINVAL);
    if (base > 0)
        CHECK(kvs_grid_send(l, base, base, base - 1, true, &s) == KVS_EINVAL);
    CHECK(kvs_grid_send(l, -ps, 0, 0, true, &s) == KVS_EINVAL);
    kvs_chunk_t c;
    if (ps > 1 && base < INT64_MAX)
        CHECK(kvs_grid_chunk(l, base + 1, base + 1, 0, &c) == KVS_EPREFIX_ALIGN);
    if (base > 0)
        CHECK(kvs_grid_chunk(l, base, base - 1, 0, &c) == KVS_EINVAL);
    CHECK(kvs_grid_chunk(l, base, base, 0, NULL) == KVS_EINVAL);
    CHECK(kvs_grid_send(l, base, base, base, true, NULL) == KVS_EINVAL);

    /* A request: up to 4 non-final sends, then the final one. */
    int64_t start = base, next_chunk = 0;
    for (unsigned k = 0; k < 5u; k++) {
        const bool final = k == 4u || (in_u8(in) & 3u) == 0;
        int64_t delta;
        switch (in_u8(in) % 6u) {
        case 0:
            delta = 0;
            break;
        case 1:
            delta = G;
            break;
        case 2:
            delta = INT64_MAX - start; /* up to the largest end */
            break;
        case 3:
            delta = as_i64(in_u64(in) & (uint64_t)INT64_MAX);
            break;
        default:
            delta = (int64_t)(in_u16(in) % 4096u) * (1 + (int64_t)(in_u8(in) % 4u));
            break;
        }
        int64_t end;
        if (__builtin_add_overflow(start, delta, &end))
            end = INT64_MAX;

        CHECK(kvs_grid_send(l, base, start, end, final, &s) == KVS_OK);
        CHECK(s.first_chunk == (start - base) / G);
        CHECK(s.first_chunk == next_chunk); /* chunk ids without gaps */
        if (final) {
            CHECK(s.sent_end == end);
            CHECK(s.num_chunks >= 1);
            CHECK(s.num_chunks == max64(1, ceil_div(end - start, G)));
        } else {
            CHECK((s.sent_end - base) % G == 0); /* on the grid */
            CHECK(s.sent_end >= start && s.sent_end <= end && end - s.sent_end < G);
            CHECK(s.num_chunks == (s.sent_end - start) / G);
        }
        if (final) {
            /* Chunks of the whole suffix [base, end): first, last, past. */
            const int64_t pages = ceil_div(end - base, ps);
            const int64_t total = kvs_grid_num_chunks(l, pages);
            if (end > start) {
                CHECK(s.first_chunk + s.num_chunks == total);
            } else {
                /* An empty final send is one metadata-only chunk; after
                 * non-final sends that ended exactly on the grid its id is
                 * one past the suffix's last chunk (kvs_grid_chunk refuses
                 * that id). The handlers do not use kvs_grid_send. */
                CHECK(s.num_chunks == 1 &&
                      s.first_chunk == (start == base ? 0 : total));
            }
            const i128 picks[4] = {s.first_chunk, (i128)s.first_chunk + s.num_chunks / 2,
                                   (i128)s.first_chunk + s.num_chunks - 1, (i128)total - 1};
            for (unsigned i = 0; i < 4u; i++)
                if (picks[i] >= 0 && picks[i] < total)
                    check_chunk(l, base, end, (int64_t)picks[i]);
            CHECK(kvs_grid_chunk(l, base, end, total, &c) == KVS_ERANGE);
            CHECK(kvs_grid_chunk(l, base, end, -1, &c) == KVS_ERANGE);
            break;
        }
        next_chunk = s.first_chunk + s.num_chunks;
        start = s.sent_end;
    }
}

/* Context parallelism on plan *base_lay with a CP size from the input. */
static void check_cp(const kvs_layout_params_t *params, const kvs_layout_t *base_lay,
                     input_t *in)
{
    kvs_layout_params_t p = *params;
    p.prefill_cp = pick(in, 16);
    kvs_layout_t l;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    const int rc = kvs_layout_init(&l, &p, &err);
    if (p.prefill_cp < 0) {
        CHECK(rc == KVS_EINVAL && strstr(err.msg, "prefill_cp") != NULL);
        return;
    }
    CHECK(rc == KVS_OK);
    const int64_t CP = p.prefill_cp ? p.prefill_cp : 1, A = l.cp_align_tokens;
    CHECK(l.prefill_cp == CP && base_lay->prefill_cp == 1 && A == base_lay->cp_align_tokens);
    CHECK(A % l.page_size == 0 && A % l.decode_page_size == 0 && l.grid_tokens % A == 0);
    /* The rest of the plan does not depend on CP. */
    CHECK(l.grid_tokens == base_lay->grid_tokens && l.tp_writers == base_lay->tp_writers &&
          l.expected_arrivals == base_lay->expected_arrivals &&
          kvs_layout_max_region_bytes(&l) == kvs_layout_max_region_bytes(base_lay));

    int64_t total;
    switch (in_u8(in) % 4u) {
    case 0:
        total = 0;
        break;
    case 1:
        total = INT64_MAX - in_u8(in);
        break;
    default:
        total = (int64_t)in_u16(in) * (1 + in_u8(in) % 8u);
        break;
    }
    /* The ranges, for the first and last ranks and a few between. */
    int64_t s = 0, e = 0, per = -1;
    const int64_t walk = CP <= 64 ? CP : 64;
    for (int64_t k = 0; k < walk; k++) {
        const int64_t c = k < walk - 1 ? k : CP - 1;
        CHECK(kvs_layout_cp_range(&l, total, c, &s, &e) == KVS_OK);
        CHECK(0 <= s && s <= e && e <= total);
        if (s < total)
            CHECK(s % A == 0);
        if (c == 0)
            CHECK(s == 0);
        if (c == 0 && e < total)
            per = e;
        if (c == CP - 1 && total > 0)
            CHECK(e == total); /* the ranges reach the end */
        if (per > 0 && s < total && c <= INT64_MAX / per)
            CHECK(s == c * per && (e == total || e - s == per));
    }
    CHECK(kvs_layout_cp_range(&l, total, CP, &s, &e) == KVS_ERANGE);
    CHECK(kvs_layout_cp_range(&l, -1, 0, &s, &e) == KVS_EINVAL);

    /* Chunks of a suffix from a prefix aligned to both page sizes. */
    int64_t base = 0;
    if (total > 0 && __builtin_mul_overflow((int64_t)(in_u16(in) % 4u), A, &base))
        return;
    if (base > total || base % l.page_size != 0 || base % l.decode_page_size != 0)
        return;
    int64_t per_token = 0;
    CHECK(kvs_layout_region_bytes(&l, 0, 0, 1, &per_token) == KVS_OK);
    const int64_t pages = ceil_div(total - base, l.decode_page_size);
    const int64_t nchunks = kvs_grid_num_chunks(&l, pages);
    const int64_t picks[3] = {0, in_u16(in) % nchunks, nchunks - 1};
    for (unsigned k = 0; k < 3u; k++) {
        kvs_chunk_t ch;
        CHECK(kvs_grid_chunk(&l, base, total, picks[k], &ch) == KVS_OK);
        int64_t first = -1, count = 0;
        CHECK(kvs_layout_cp_writers(&l, total, &ch, &first, &count) == KVS_OK);
        CHECK(first >= 0 && count >= 1 && first <= CP - count);
        CHECK(kvs_layout_chunk_arrivals(&l, total, &ch) == count * l.expected_arrivals);
        int64_t at = ch.token_start;
        for (int64_t c = first; c - first < count && c - first < 64; c++) {
            kvs_cp_part_t part;
            CHECK(kvs_layout_cp_part(&l, 0, 0, total, &ch, c, &part) == KVS_OK);
            CHECK(part.cp_rank == c && part.token_start == at);
            CHECK(part.token_end > part.token_start || ch.token_end == ch.token_start);
            CHECK(part.offset_bytes == (part.token_start - ch.token_start) * per_token);
            CHECK(part.len_bytes == (part.token_end - part.token_start) * per_token);
            CHECK(kvs_layout_cp_range(&l, total, c, &s, &e) == KVS_OK);
            if (part.token_end > part.token_start)
                CHECK(part.local_token_start == part.token_start - s &&
                      part.token_start >= s && part.token_end <= e);
            at = part.token_end;
        }
        if (count <= 64)
            CHECK(at == ch.token_end); /* the parts tile the chunk */
        kvs_cp_part_t none;
        if (first > 0)
            CHECK(kvs_layout_cp_part(&l, 0, 0, total, &ch, first - 1, &none) == KVS_ENOENT);
        if (first + count < CP)
            CHECK(kvs_layout_cp_part(&l, 0, 0, total, &ch, first + count, &none) ==
                  KVS_ENOENT);
    }
}

/* What kvs_layout_init must say of a layer pattern on a plan that is
 * otherwise good: KVS_OK, or the code of the rule it breaks (ERANGE, the
 * size bound, is checked apart). */
static int hybrid_expected(const kvs_layout_params_t *p, const kvs_layout_t *l)
{
    const bool fields = p->other_layers != KVS_LAYER_FULL || p->window_tokens != 0 ||
                        p->state_heads != 0 || p->state_conv_bytes != 0 ||
                        p->state_ssm_bytes != 0;
    if (p->full_attn_every < 0)
        return KVS_EINVAL;
    if (p->full_attn_every <= 1)
        return fields ? KVS_EINVAL : KVS_OK;
    if (p->other_layers == KVS_LAYER_WINDOW)
        return p->window_tokens <= 0 || p->state_heads != 0 || p->state_conv_bytes != 0 ||
                       p->state_ssm_bytes != 0
                   ? KVS_EINVAL
                   : KVS_OK;
    if (p->other_layers != KVS_LAYER_STATE || p->window_tokens != 0 || p->state_heads <= 0 ||
        p->state_conv_bytes < 0 || p->state_ssm_bytes < 0 ||
        (i128)p->state_conv_bytes + p->state_ssm_bytes <= 0 ||
        (i128)p->state_conv_bytes + p->state_ssm_bytes > INT64_MAX)
        return KVS_EINVAL;
    if (!nested(p->state_heads, l->prefill_tp) || !nested(p->state_heads, l->decode_tp))
        return KVS_EHEAD_SPLIT;
    return KVS_OK;
}

/* The same hybrid pattern with a prefill CP size of 2..5 drawn: the
 * layout is accepted with the same largest region; for the chunks picked,
 * the parts of the CP ranks kvs_layout_cp_writers names tile the CP 1
 * region (same bytes) in token order, each the hybrid region of its own
 * tokens (its TP writers' blocks of them), the state in the part ending
 * at the request's end alone; every other CP rank gets KVS_ENOENT. */
static void check_hybrid_cp(const kvs_layout_params_t *params, const kvs_layout_t *one,
                            int64_t total, int64_t d, int64_t e, const int64_t picks[3],
                            input_t *in)
{
    kvs_layout_params_t p = *params;
    p.prefill_cp = 2 + in_u8(in) % 4u;
    kvs_layout_t l;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    CHECK(kvs_layout_init(&l, &p, &err) == KVS_OK);
    CHECK(kvs_layout_max_region_bytes(&l) == kvs_layout_max_region_bytes(one));
    for (unsigned k = 0; k < 3u; k++) {
        kvs_chunk_t ch;
        kvs_hybrid_writer_t whole;
        CHECK(kvs_grid_chunk(&l, 0, total, picks[k], &ch) == KVS_OK);
        kvs_hybrid_writer_t w0; /* writer 0 writes state in a chunk that carries it */
        CHECK(kvs_layout_hybrid_writer(one, d, e, one->tp_writers - 1, total, &ch, &whole) ==
              KVS_OK);
        CHECK(kvs_layout_hybrid_writer(one, d, e, 0, total, &ch, &w0) == KVS_OK);
        const int64_t region = whole.w.offset_bytes + whole.w.len_bytes;
        int64_t first = -1, count = 0, at = 0, tok = ch.token_start, states = 0;
        CHECK(kvs_layout_cp_writers(&l, total, &ch, &first, &count) == KVS_OK);
        CHECK(first >= 0 && count >= 1 && first + count <= l.prefill_cp);
        CHECK(kvs_layout_chunk_arrivals(&l, total, &ch) == count * l.expected_arrivals);
        for (int64_t c = 0; c < l.prefill_cp; c++) {
            kvs_cp_part_t part;
            const int rc = kvs_layout_cp_part(&l, d, e, total, &ch, c, &part);
            if (c < first || c >= first + count) {
                CHECK(rc == KVS_ENOENT);
                continue;
            }
            CHECK(rc == KVS_OK && part.cp_rank == c && part.token_start == tok &&
                  part.offset_bytes == at);
            const kvs_chunk_t pc = {.token_start = part.token_start,
                                    .token_end = part.token_end};
            int64_t bytes = 0;
            for (int64_t i = 0; i < l.tp_writers && l.tp_writers <= 64; i++) {
                kvs_hybrid_writer_t w;
                CHECK(kvs_layout_hybrid_writer(&l, d, e, i, total, &pc, &w) == KVS_OK);
                CHECK(w.w.offset_bytes == bytes);
                CHECK(w.state_bytes == 0 || part.token_end == total);
                states += i == 0 && w.state_bytes > 0;
                bytes += w.w.len_bytes;
            }
            if (l.tp_writers <= 64)
                CHECK(part.len_bytes == bytes);
            at += part.len_bytes;
            tok = part.token_end;
        }
        CHECK(tok == ch.token_end && at == region); /* the parts tile the region */
        /* (the writers are walked only up to 64 of them) */
        CHECK(states <= 1 && (l.tp_writers > 64 || (w0.state_bytes > 0) == (states == 1)));
    }
}

/* Hybrid layers (src/hybrid.c) on plan *base_lay with a layer pattern
 * drawn last: refused exactly by the rules; otherwise, for chunks of a
 * request drawn from the input, each writer's slots and state part tile
 * its block in layer order, window slots hold the chunk's rows inside the
 * page-aligned window, the state rides in the last chunk only, writers are
 * contiguous and no region exceeds kvs_layout_max_region_bytes. */
static void check_hybrid(const kvs_layout_params_t *params, const kvs_layout_t *base_lay,
                         input_t *in)
{
    if (base_lay->kind != KVS_KV_GQA)
        return;
    kvs_layout_params_t p = *params;
    p.full_attn_every = pick(in, 8);
    p.other_layers = (kvs_layer_kind_t)(in_u8(in) % 4u); /* 3: unknown */
    if (in_u8(in) % 2u)
        p.window_tokens = pick(in, 1000);
    if (in_u8(in) % 2u) {
        p.state_heads = pick(in, 64);
        p.state_conv_bytes = pick(in, 4096);
        p.state_ssm_bytes = pick(in, 70000);
    }
    /* a draft beside the layer pattern (Qwen3-Next's MTP layer), where the
     * plan has no scale planes (a draft with them is refused: check_draft) */
    if (base_lay->kv_scales == KVS_KV_SCALES_NONE && in_u8(in) % 3u == 0) {
        p.draft_layers = 1 + in_u8(in) % 3u; /* a good draft: check_draft draws bad ones */
        p.draft_head_dim = in_u8(in) % 2u ? 1 + in_u8(in) % 512u : 0;
        p.draft_kv_heads = 0;
    }
    kvs_layout_t l;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    const int rc = kvs_layout_init(&l, &p, &err);
    const int want = hybrid_expected(&p, base_lay);
    if (want != KVS_OK || rc != KVS_OK) {
        CHECK(rc == want || (want == KVS_OK && rc == KVS_ERANGE));
        CHECK(err.status == rc && err.msg[0] != '\0');
        return;
    }
    const bool hybrid = p.full_attn_every > 1;
    CHECK(l.full_attn_every == (hybrid ? p.full_attn_every : 0));
    /* The writers of KV are the base plan's (one per distinct KV head);
     * with state layers the first holder of each distinct state head
     * writes it too, those not KV writers their state alone: as many
     * writers as distinct holders of either (offsets in a decode rank's
     * sources that are multiples of S / K or of S / SW). */
    const bool states = hybrid && p.other_layers == KVS_LAYER_STATE;
    const int64_t kvw = base_lay->tp_writers;
    int64_t holders = kvw;
    if (states && l.tp_sources <= 4096) {
        const int64_t S = l.tp_sources;
        const int64_t sw = min64(S, max64(1, l.state_heads / l.decode_tp));
        holders = 0;
        for (int64_t o = 0; o < S; o++)
            holders += o % (S / kvw) == 0 || o % (S / sw) == 0;
    }
    CHECK(l.grid_tokens == base_lay->grid_tokens &&
          (l.tp_sources > 4096 || l.tp_writers == holders));
    const int64_t max_region = kvs_layout_max_region_bytes(&l);
    CHECK(max_region > 0);
    if (!hybrid)
        return;
    kvs_writer_t old;
    CHECK(kvs_layout_writer(&l, 0, 0, 0, 1, &old) == KVS_ENOTSUP);

    const int64_t total = (int64_t)in_u16(in) * (1 + in_u8(in) % 4u);
    const int64_t pages = ceil_div(total, l.decode_page_size);
    const int64_t nchunks = kvs_grid_num_chunks(&l, pages);
    const int64_t picks[3] = {0, in_u16(in) % nchunks, nchunks - 1};
    const int64_t e = in_u8(in) % l.decode_pp, d = in_u8(in) % l.decode_tp;
    int64_t first = 0, n = 0;
    CHECK(kvs_layout_stage_layers(&l, KVS_ROLE_DECODE, e, &first, &n) == KVS_OK);
    if (n > 256) /* a stage of 2^40 layers fits a 1-token grid: walk small ones */
        return;
    for (unsigned k = 0; k < 3u; k++) {
        kvs_chunk_t ch;
        CHECK(kvs_grid_chunk(&l, 0, total, picks[k], &ch) == KVS_OK);
        const bool last = ch.token_end == total;
        int64_t at = 0, nss = 0;
        span_t sspans[64];
        for (int64_t i = 0; i < l.tp_writers && i < 64; i++) {
            kvs_hybrid_writer_t w;
            CHECK(kvs_layout_hybrid_writer(&l, d, e, i, total, &ch, &w) == KVS_OK);
            CHECK(w.w.offset_bytes == at &&
                  w.w.len_bytes == w.kv_bytes + w.state_bytes + w.draft_bytes);
            CHECK(w.state_bytes == 0 || last);
            /* a draft's part ends a KV writer's block in the last decode stage */
            const int64_t dpb =
                e == l.decode_pp - 1 && i < kvw
                    ? kvs_layout_draft_part_bytes(&l, ch.token_end - ch.token_start,
                                                  w.w.heads.num_heads)
                    : 0;
            CHECK(w.draft_bytes == dpb &&
                  (dpb == 0 || w.draft_offset_bytes == w.w.len_bytes - dpb));
            if (i < kvw)
                CHECK(w.w.heads.num_heads >= 1 &&
                      w.w.heads.src_start + w.w.heads.num_heads <= l.src_heads);
            else /* a replica of a KV head already written: its state alone */
                CHECK(w.w.heads.num_heads == 0 && w.kv_bytes == 0 && w.full_slots == 0);
            at += w.w.len_bytes;
            /* the parts of the prefill stages tile the block in stage order
             * (one, the whole block, unless prefill PP goes into a decode of
             * PP 1); in each, the slots tile each plane, then the state */
            int64_t part_at = 0, layer_at = first, kv_sum = 0, st_sum = 0;
            bool first_part = true;
            for (int64_t s = 0; s < l.prefill_pp && s < 256; s++) {
                kvs_hybrid_part_t hp;
                const int prc = kvs_layout_hybrid_part(&l, &w, e, s, &hp);
                if (prc == KVS_ENOENT) {
                    CHECK(l.decode_pp > 1 && s != e);
                    continue;
                }
                CHECK(prc == KVS_OK && hp.prefill_stage == s && hp.offset_bytes == part_at);
                CHECK(hp.first_layer == layer_at && hp.num_layers >= 1);
                CHECK(hp.len_bytes == hp.kv_bytes + hp.state_bytes + hp.draft_bytes);
                CHECK(hp.draft_bytes == (s == l.prefill_pp - 1 ? w.draft_bytes : 0));
                if (first_part) /* the first part's state (its slots may be empty) */
                    CHECK(w.state_offset_bytes == hp.kv_bytes);
                first_part = false;
                int64_t kv_at = part_at, st_at = part_at + hp.kv_bytes;
                for (int64_t q = 0; q < l.planes; q++) {
                    for (int64_t layer = hp.first_layer;
                         layer < hp.first_layer + hp.num_layers; layer++) {
                        kvs_hybrid_slot_t sl;
                        const int src = kvs_layout_hybrid_slot(&l, &w, e, layer, q, &sl);
                        kvs_layer_kind_t kind;
                        int64_t ws, we;
                        CHECK(kvs_layout_layer_kind(&l, layer, &kind) == KVS_OK);
                        CHECK(kvs_layout_layer_tokens(&l, layer, total, &ws, &we) == KVS_OK);
                        CHECK(we == total && ws <= we);
                        if (kind == KVS_LAYER_STATE) {
                            CHECK(ws == total);
                            if (src == KVS_ENOENT) {
                                /* V, a chunk before the last, or a KV writer
                                 * whose state heads another one writes */
                                CHECK(q > 0 || !last ||
                                      (i < kvw && w.state_heads.num_heads == 0 &&
                                       w.state_bytes == 0));
                                continue;
                            }
                            CHECK(src == KVS_OK && q == 0 && sl.offset_bytes == st_at);
                            CHECK(sl.len_bytes == w.state_heads.num_heads * l.state_head_bytes);
                            st_at += sl.len_bytes;
                            continue;
                        }
                        const int64_t a = max64(ch.token_start, ws);
                        if (i >= kvw) {
                            CHECK(src == KVS_ENOENT);
                            continue;
                        }
                        if (src == KVS_ENOENT) {
                            CHECK(kind == KVS_LAYER_WINDOW && a >= ch.token_end);
                            continue;
                        }
                        CHECK(src == KVS_OK && sl.kind == kind && sl.offset_bytes == kv_at);
                        CHECK(sl.token_start == (kind == KVS_LAYER_FULL ? ch.token_start : a));
                        CHECK(sl.token_start + sl.rows == ch.token_end);
                        if (kind == KVS_LAYER_WINDOW && ws > 0) /* page-aligned window */
                            CHECK(ws % l.cp_align_tokens == 0 &&
                                  ws <= total - l.window_tokens &&
                                  total - l.window_tokens - ws < l.cp_align_tokens);
                        kv_at += sl.len_bytes;
                    }
                }
                CHECK(kv_at == part_at + hp.kv_bytes &&
                      st_at == part_at + hp.kv_bytes + hp.state_bytes);
                kv_sum += hp.kv_bytes;
                st_sum += hp.state_bytes;
                part_at += hp.len_bytes;
                layer_at += hp.num_layers;
            }
            if (l.prefill_pp <= 256)
                CHECK(part_at == w.w.len_bytes && layer_at == first + n &&
                      kv_sum == w.kv_bytes && st_sum == w.state_bytes);
            /* a writer of state holds the next of the decode rank's state
             * heads: in the last chunk they tile them, each once */
            if (w.state_layers > 0 && l.tp_writers <= 64) {
                CHECK(w.state_heads.num_heads >= 1);
                sspans[nss++] = (span_t){w.state_heads.dst_start, w.state_heads.num_heads};
            }
        }
        if (l.tp_writers <= 64)
            CHECK(at <= max_region);
        if (states && last && l.tp_writers <= 64 && n > 0) {
            int64_t other_l = 0; /* does the stage hold a state layer? */
            for (int64_t layer = first; layer < first + n; layer++) {
                kvs_layer_kind_t kind;
                CHECK(kvs_layout_layer_kind(&l, layer, &kind) == KVS_OK);
                other_l += kind == KVS_LAYER_STATE;
            }
            qsort(sspans, (size_t)nss, sizeof sspans[0], span_cmp);
            int64_t covered = 0;
            for (int64_t k2 = 0; k2 < nss; k2++) {
                CHECK(sspans[k2].start == covered); /* no gap, no state head twice */
                covered = sspans[k2].start + sspans[k2].len;
            }
            CHECK(covered == (other_l > 0 ? l.state_dst_heads : 0));
        }
    }
    check_hybrid_cp(&p, &l, total, d, e, picks, in);
}

/* What kvs_layout_init must say of a draft on a plan that is otherwise
 * good (src/draft.c): KVS_OK, or a code of a rule it breaks. *alt gets a
 * second code when two rules are broken (the order of the checks is the
 * file's to choose). The size bound (ERANGE) is judged by the caller. */
static int draft_expected(const kvs_layout_params_t *p, const kvs_layout_t *l, int *alt)
{
    *alt = -1;
    if (p->draft_layers < 0 || p->draft_head_dim < 0 || p->draft_kv_heads < 0)
        return KVS_EINVAL;
    if (p->draft_layers == 0)
        return p->draft_head_dim != 0 || p->draft_kv_heads != 0 ? KVS_EINVAL : KVS_OK;
    if (p->draft_layers > KVS_MAX_LAYERS)
        return KVS_ERANGE;
    if ((p->draft_kv_heads != 0 && p->draft_kv_heads != l->total_heads) ||
        l->kv_scales != KVS_KV_SCALES_NONE)
        return KVS_ENOTSUP;
    *alt = KVS_ERANGE; /* a good draft may still overflow the region */
    return KVS_OK;
}

/* A draft model's layers on plan *base_lay, drawn last (docs/kinds/draft.md):
 * refused by its rules, or each writer's block grows by exactly
 * T * nh * draft_head_dim * s * draft_layers * planes, the writers, heads
 * and offsets staying contiguous and the region the largest's. */
static void check_draft(const kvs_layout_params_t *params, const kvs_layout_t *base_lay,
                        input_t *in)
{
    kvs_layout_params_t p = *params;
    p.draft_layers = pick(in, 8);
    if (in_u8(in) % 2u)
        p.draft_head_dim = pick(in, 1024);
    if (in_u8(in) % 2u)
        p.draft_kv_heads = in_u8(in) % 2u ? base_lay->total_heads : pick(in, 64);
    kvs_layout_t l;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    const int rc = kvs_layout_init(&l, &p, &err);
    int alt;
    const int want = draft_expected(&p, base_lay, &alt);
    if (rc != KVS_OK) {
        CHECK(rc == want || rc == alt);
        CHECK(err.status == rc && err.msg[0] != '\0');
        return;
    }
    CHECK(want == KVS_OK);
    const int64_t dl = p.draft_layers;
    const int64_t dhd = dl > 0 ? (p.draft_head_dim > 0 ? p.draft_head_dim : l.head_dim) : 0;
    CHECK(l.draft_layers == dl && l.draft_head_dim == dhd);
    /* Nothing else of the plan depends on the draft. */
    CHECK(l.grid_tokens == base_lay->grid_tokens && l.tp_writers == base_lay->tp_writers &&
          l.expected_arrivals == base_lay->expected_arrivals &&
          l.src_heads == base_lay->src_heads && l.dst_heads == base_lay->dst_heads);
    const int64_t nh = l.prefill_tp > l.decode_tp ? l.src_heads : l.dst_heads;
    const int64_t G = l.grid_tokens;
    const int64_t part = G * nh * dhd * l.elem_bytes * dl * l.planes;
    CHECK(kvs_layout_draft_part_bytes(&l, G, nh) == part);
    CHECK(kvs_layout_max_region_bytes(&l) ==
          kvs_layout_max_region_bytes(base_lay) + part * l.tp_writers);
    const int64_t tokens = 1 + (int64_t)in_u16(in) % G;
    const int64_t d = in_u8(in) % l.decode_tp;
    /* With PP the last stage of each side holds the draft: the blocks of
     * the last decode stage grow, those of a stage before it do not. */
    const int64_t last = l.decode_pp - 1;
    CHECK(kvs_layout_draft_stage(&l, KVS_ROLE_DECODE) == (dl > 0 ? last : -1));
    CHECK(kvs_layout_draft_stage(&l, KVS_ROLE_PREFILL) == (dl > 0 ? l.prefill_pp - 1 : -1));
    for (int64_t e = 0; e <= last; e += last > 0 ? last : 1) {
        int64_t at = 0;
        for (int64_t i = 0; i < l.tp_writers && i < 64; i++) {
            kvs_writer_t w, b;
            CHECK(kvs_layout_writer(&l, d, e, i, tokens, &w) == KVS_OK);
            CHECK(kvs_layout_writer(base_lay, d, e, i, tokens, &b) == KVS_OK);
            CHECK(w.prefill_rank == b.prefill_rank && w.heads.src_start == b.heads.src_start &&
                  w.heads.dst_start == b.heads.dst_start &&
                  w.heads.num_heads == b.heads.num_heads);
            const int64_t dp = tokens * w.heads.num_heads * dhd * l.elem_bytes * dl * l.planes;
            CHECK(kvs_layout_draft_part_bytes(&l, tokens, w.heads.num_heads) == dp);
            CHECK(w.len_bytes == b.len_bytes + (e == last ? dp : 0) && w.offset_bytes == at);
            at += w.len_bytes;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_t in = {.p = data, .left = size};
    kvs_layout_params_t p;
    memset(&p, 0, sizeof p);
    p.total_heads = pick(&in, 128);
    p.heads_per_rank = pick(&in, 64);
    p.heads_per_rank_tp = pick(&in, 64);
    p.head_dim = pick(&in, 512);
    p.dtype = (kvs_dtype_t)((int)(in_u8(&in) % 6u) - 1); /* -1 .. 4 */
    p.layers = pick(&in, 128);
    p.page_size = pick(&in, 64);
    p.prefill_tp = pick(&in, 64);
    p.decode_tp = pick(&in, 64);
    p.prefill_pp = pick(&in, 8);
    p.decode_pp = pick(&in, 8);
    p.chunk_tokens = pick(&in, 70000);
    /* Last, so inputs of before scale planes read as none. */
    p.kv_scales = (kvs_kv_scales_t)(in_u8(&in) % 4u); /* 3: unknown */
    p.scale_block = p.kv_scales == KVS_KV_SCALES_PER_BLOCK ? pick(&in, 256) : 0;

    int64_t H = 0;
    const int broken = violations(&p, &H);
    check_pp_split(p.layers, p.prefill_pp, &in);

    kvs_layout_t l;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    const int rc = kvs_layout_init(&l, &p, &err);
    CHECK(kvs_layout_init(NULL, &p, NULL) == KVS_EINVAL);
    kvs_layout_t scratch;
    CHECK(kvs_layout_init(&scratch, NULL, NULL) == KVS_EINVAL);
    if (rc != KVS_OK) {
        CHECK(violation_of(rc) != 0);           /* a documented code */
        CHECK((broken & violation_of(rc)) != 0); /* of a rule that is broken */
        CHECK(err.status == rc && err.msg[0] != '\0');
        return 0;
    }
    CHECK(broken == 0);

    /* Derived sizes (spec §2-§3). */
    const int64_t C = p.chunk_tokens ? p.chunk_tokens : KVS_DEFAULT_CHUNK_TOKENS;
    const int64_t P = p.prefill_tp, D = p.decode_tp;
    const int64_t Pp = p.prefill_pp ? p.prefill_pp : 1, Dp = p.decode_pp ? p.decode_pp : 1;
    CHECK(l.total_heads == H && l.head_dim == p.head_dim && l.dtype == p.dtype);
    CHECK(l.elem_bytes == kvs_dtype_bytes(p.dtype) && l.layers == p.layers);
    CHECK(l.kv_scales == p.kv_scales && l.scale_bytes == scale_bytes_of(&p));
    CHECK(l.page_size == p.page_size && l.prefill_tp == P && l.decode_tp == D);
    CHECK(l.prefill_pp == Pp && l.decode_pp == Dp && l.chunk_tokens == C);
    CHECK(l.grid_tokens == max64(1, C / p.page_size) * p.page_size);
    CHECK(l.chunk_pages >= 1 && l.chunk_pages * l.page_size == l.grid_tokens);
    CHECK(l.src_heads == max64(1, H / P) && l.dst_heads == max64(1, H / D));
    /* The most layers one stage holds (spec §4: splits may be uneven). */
    CHECK(l.decode_layers == ceil_div(p.layers, Dp) &&
          l.prefill_layers == ceil_div(p.layers, Pp));
    /* P / D sources, one writer per distinct head among them: with fewer
     * heads than prefill ranks the replicas only report */
    CHECK(l.tp_sources == (P > D ? P / D : 1));
    CHECK(l.tp_writers == (P > D ? min64(P / D, max64(1, H / D)) : 1));
    CHECK(l.targets_per_prefill == (D > P ? D / P : 1));
    CHECK(l.expected_arrivals == l.tp_writers * (Dp == 1 ? Pp : 1));
    CHECK(l.path == (P == D ? KVS_PATH_DIRECT : KVS_PATH_STAGING));

    check_layout_stages(&l);
    check_writers(&l, &in);
    check_grid(&l, &in);
    check_cp(&p, &l, &in);
    check_hybrid(&p, &l, &in);
    check_draft(&p, &l, &in);
    return 0;
}
