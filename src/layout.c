/*
 * layout.c - the layout planner of spec §3-§4: which heads each prefill rank
 * copies into each decode rank, which prefill ranks write a decode rank's
 * region, and where each writer's bytes go in that region.
 *
 * Pure functions over a validated kvs_layout_t: no allocation, no state.
 * Invariants after kvs_layout_init: every size > 0; max(P,D) % min(P,D) == 0;
 * H and each TP size divide one another; layers >= Pp, so every stage holds
 * a layer (the split need not be even: spec §4); Dp is 1 or Pp; the largest
 * region of a full chunk (a decode stage of decode_layers layers) fits in
 * int64.
 *
 * Replicated heads (H < TP) map ranks sharing a head by integer division,
 * never by modulo (spec §3: modulo silently corrupts attention). With H < P
 * (P > D) the P / H prefill ranks in a row that hold one head write it
 * once: the first of them is the writer, the others take part as sources
 * that only report, as MLA's do (kvs__layout_kv_writers); spec §3's P / D
 * writers would send each head P / H times. A hybrid model's state heads
 * follow the same rule (kvs__layout_writers).
 *
 * Kinds (kvs_kv_kind_t): the table below says, per kind, how many planes a
 * layer has and whether its bytes are the same on every TP rank. MLA is
 * replicated: one latent "head", one writer per decode rank (source 0 of
 * its tp_sources, decode d <- prefill d * P / D), the other sources of a
 * room take part without writing (docs/kinds/mla.md).
 *
 * Prefill context parallelism (prefill_cp) changes nothing here: every CP
 * rank has the same heads, TP and PP, so a writer of this file is a TP
 * writer of one CP rank's part of a region; src/context_parallel.c says
 * which tokens each CP rank holds and where its part goes.
 *
 * Scale planes (kvs_kv_scales_t, docs/kinds/fp8-scales.md) ride in the same
 * layer slots: a slot of T tokens and nh heads holds T * nh KV rows, then
 * their T * nh scale rows of scale_bytes a head, so the head slicing, the
 * writer offsets and the PP spans stay those of the KV alone.
 *
 * Hybrid layers (window and state layers, full_attn_every > 1) are
 * src/hybrid.c's: their blocks depend on the chunk's place in the request,
 * so kvs_layout_writer refuses such a layout (kvs_layout_hybrid_writer).
 *
 * A draft model's layers (draft_layers > 0, src/draft.c) end each writer
 * block of the last decode stage's regions (kvs_layout_draft_stage): the
 * same writers and head slices, the draft's own head dim.
 */
#include "arith.h"
#include "draft.h"
#include "error.h"
#include "hybrid.h"

#include <kvstage/kvstage.h>

#include <string.h>

static int64_t kvs__max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Scale planes (kvs_kv_scales_t): the name and the bytes a head's scales
 * take in one token row. Per-token is one fp32 a head; per-block is MXFP8's
 * e8m0, one byte per block of elements. */
int kvs_kv_scales_parse(const char *spec, kvs_kv_scales_t *out, int64_t *out_block)
{
    if (spec == NULL || out == NULL || out_block == NULL)
        return KVS_EINVAL;
    if (strcmp(spec, "none") == 0 || strcmp(spec, "per-token") == 0) {
        *out = spec[0] == 'n' ? KVS_KV_SCALES_NONE : KVS_KV_SCALES_PER_TOKEN;
        *out_block = 0;
        return KVS_OK;
    }
    static const char block[] = "per-block";
    if (strncmp(spec, block, sizeof block - 1) != 0)
        return KVS_EINVAL;
    const char *rest = spec + sizeof block - 1;
    int64_t n = KVS_DEFAULT_SCALE_BLOCK;
    if (*rest == ':') {
        n = 0;
        if (rest[1] == '\0')
            return KVS_EINVAL;
        for (const char *c = rest + 1; *c != '\0'; c++) {
            if (*c < '0' || *c > '9' || n > (INT32_MAX - 9) / 10)
                return KVS_EINVAL;
            n = n * 10 + (*c - '0');
        }
        if (n <= 0)
            return KVS_EINVAL;
    } else if (*rest != '\0') {
        return KVS_EINVAL;
    }
    *out = KVS_KV_SCALES_PER_BLOCK;
    *out_block = n;
    return KVS_OK;
}

const char *kvs_kv_scales_name(kvs_kv_scales_t scales)
{
    switch (scales) {
    case KVS_KV_SCALES_NONE:
        return "none";
    case KVS_KV_SCALES_PER_TOKEN:
        return "per-token";
    case KVS_KV_SCALES_PER_BLOCK:
        return "per-block";
    }
    return "unknown";
}

int64_t kvs_kv_scales_head_bytes(kvs_kv_scales_t scales, int64_t block, int64_t head_dim)
{
    switch (scales) {
    case KVS_KV_SCALES_NONE:
        return 0;
    case KVS_KV_SCALES_PER_TOKEN:
        return 4; /* fp32 */
    case KVS_KV_SCALES_PER_BLOCK: {
        const int64_t b = block > 0 ? block : KVS_DEFAULT_SCALE_BLOCK;
        return head_dim > 0 && head_dim % b == 0 ? head_dim / b : 0; /* e8m0 */
    }
    }
    return 0;
}

int64_t kvs_dtype_bytes(kvs_dtype_t dtype)
{
    switch (dtype) {
    case KVS_DTYPE_BF16:
    case KVS_DTYPE_FP16:
        return 2;
    case KVS_DTYPE_FP8:
        return 1;
    case KVS_DTYPE_FP32:
        return 4;
    }
    return 0;
}

static const struct {
    const char *name;
    kvs_dtype_t dtype;
} kvs__dtypes[] = {{"bf16", KVS_DTYPE_BF16},
                   {"fp16", KVS_DTYPE_FP16},
                   {"fp8", KVS_DTYPE_FP8},
                   {"fp32", KVS_DTYPE_FP32}};

int kvs_dtype_parse(const char *name, kvs_dtype_t *out)
{
    if (name == NULL || out == NULL)
        return KVS_EINVAL;
    for (size_t i = 0; i < sizeof kvs__dtypes / sizeof kvs__dtypes[0]; i++) {
        if (strcmp(kvs__dtypes[i].name, name) == 0) {
            *out = kvs__dtypes[i].dtype;
            return KVS_OK;
        }
    }
    return KVS_EDTYPE;
}

const char *kvs_dtype_name(kvs_dtype_t dtype)
{
    for (size_t i = 0; i < sizeof kvs__dtypes / sizeof kvs__dtypes[0]; i++)
        if (kvs__dtypes[i].dtype == dtype)
            return kvs__dtypes[i].name;
    return "unknown";
}

/* The kinds of KV layer (kvstage.h): what the planner, the copies and the
 * fingerprint need of each. A new kind is a row here. */
static const struct {
    kvs_kv_kind_t kind;
    const char *name;
    int64_t planes;   /* buffers per layer */
    bool replicated;  /* the same bytes on every TP rank: one source each */
} kvs__kinds[] = {{KVS_KV_GQA, "gqa", 2, false}, {KVS_KV_MLA, "mla", 1, true}};

#define KVS__KIND_COUNT (sizeof kvs__kinds / sizeof kvs__kinds[0])

int kvs_kv_kind_parse(const char *name, kvs_kv_kind_t *out)
{
    if (name == NULL || out == NULL)
        return KVS_EINVAL;
    for (size_t i = 0; i < KVS__KIND_COUNT; i++) {
        if (strcmp(kvs__kinds[i].name, name) == 0) {
            *out = kvs__kinds[i].kind;
            return KVS_OK;
        }
    }
    return KVS_EINVAL;
}

const char *kvs_kv_kind_name(kvs_kv_kind_t kind)
{
    for (size_t i = 0; i < KVS__KIND_COUNT; i++)
        if (kvs__kinds[i].kind == kind)
            return kvs__kinds[i].name;
    return "unknown";
}

int64_t kvs_kv_kind_planes(kvs_kv_kind_t kind)
{
    for (size_t i = 0; i < KVS__KIND_COUNT; i++)
        if (kvs__kinds[i].kind == kind)
            return kvs__kinds[i].planes;
    return 0;
}

static bool kvs__kind_replicated(kvs_kv_kind_t kind)
{
    for (size_t i = 0; i < KVS__KIND_COUNT; i++)
        if (kvs__kinds[i].kind == kind)
            return kvs__kinds[i].replicated;
    return false;
}

/* The sources of a decode rank that write its KV rows (P > D): one per
 * distinct head of theirs. Its S = P / D sources hold H / P heads each
 * when H >= P, all distinct (S of them); with fewer heads than prefill
 * ranks each head is held by P / H ranks in a row, and sending it once is
 * enough: max(1, H / D), the heads the decode rank holds. A replicated
 * kind (MLA) has one "head": 1. Before, every replica of a head was
 * written, P / H times the bytes the decode rank holds. */
int64_t kvs__layout_kv_writers(const kvs_layout_t *l)
{
    const int64_t distinct = kvs__max64(1, l->total_heads / l->decode_tp);
    return distinct < l->tp_sources ? distinct : l->tp_sources;
}

int kvs_path_parse(const char *name, kvs_path_t *out)
{
    static const kvs_path_t all[] = {KVS_PATH_AUTO, KVS_PATH_STAGING, KVS_PATH_DIRECT,
                                     KVS_PATH_SLICE};
    if (name == NULL || out == NULL)
        return KVS_EINVAL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(kvs_path_name(all[i]), name) == 0) {
            *out = all[i];
            return KVS_OK;
        }
    }
    return KVS_EINVAL;
}

const char *kvs_path_name(kvs_path_t path)
{
    switch (path) {
    case KVS_PATH_AUTO:
        return "auto";
    case KVS_PATH_STAGING:
        return "staging";
    case KVS_PATH_DIRECT:
        return "direct";
    case KVS_PATH_SLICE:
        return "slice";
    }
    return "unknown";
}

int kvs_heads_resolve(int64_t total_heads, int64_t heads_per_rank, int64_t tp,
                      int64_t *out_heads)
{
    if (out_heads == NULL)
        return KVS_EINVAL;
    if (total_heads > 0) {
        *out_heads = total_heads;
        return KVS_OK;
    }
    /* Overestimates when heads are replicated; the model's total is better. */
    if (heads_per_rank > 0 && tp > 0 && heads_per_rank <= INT32_MAX &&
        tp <= INT32_MAX) {
        *out_heads = heads_per_rank * tp;
        return KVS_OK;
    }
    return KVS_EHEADS;
}

int kvs_pp_stage_layers(int64_t layers, int64_t pp, int64_t stage, int64_t *first_layer,
                        int64_t *num_layers)
{
    if (first_layer == NULL || num_layers == NULL || layers <= 0 || pp <= 0)
        return KVS_EINVAL;
    if (stage < 0 || stage >= pp)
        return KVS_ERANGE;
    /* The first pp - rem stages hold base layers, the last rem base + 1.
     * Every product stays <= layers: no overflow. */
    const int64_t base = layers / pp, short_stages = pp - layers % pp;
    if (stage < short_stages) {
        *first_layer = stage * base;
        *num_layers = base;
    } else {
        *first_layer = short_stages * base + (stage - short_stages) * (base + 1);
        *num_layers = base + 1;
    }
    return KVS_OK;
}

int kvs_layout_stage_layers(const kvs_layout_t *lay, kvs_role_t role, int64_t stage,
                            int64_t *first_layer, int64_t *num_layers)
{
    if (lay == NULL || (role != KVS_ROLE_PREFILL && role != KVS_ROLE_DECODE))
        return KVS_EINVAL;
    return kvs_pp_stage_layers(lay->layers,
                               role == KVS_ROLE_PREFILL ? lay->prefill_pp : lay->decode_pp,
                               stage, first_layer, num_layers);
}

/* The spec §3 formula on sizes > 0 and ranks >= 0 (checked by the callers). */
static void kvs__head_slice(int64_t total_heads, int64_t prefill_tp, int64_t decode_tp,
                            int64_t src, int64_t dst, kvs_head_slice_t *out)
{
    src %= prefill_tp;
    dst %= decode_tp;
    const int64_t src_heads = kvs__max64(1, total_heads / prefill_tp);
    const int64_t dst_heads = kvs__max64(1, total_heads / decode_tp);
    if (prefill_tp > decode_tp) {
        const int64_t rep = kvs__max64(1, prefill_tp / total_heads);
        out->num_heads = src_heads;
        out->src_start = 0;
        out->dst_start = ((src / rep) * src_heads) % dst_heads;
    } else {
        const int64_t rep = kvs__max64(1, decode_tp / total_heads);
        out->num_heads = dst_heads;
        out->dst_start = 0;
        out->src_start = ((dst / rep) * dst_heads) % src_heads;
    }
}

int kvs_head_slice(int64_t total_heads, int64_t prefill_tp, int64_t decode_tp,
                   int64_t src, int64_t dst, kvs_head_slice_t *out)
{
    if (out == NULL || total_heads <= 0 || prefill_tp <= 0 || decode_tp <= 0 ||
        src < 0 || dst < 0)
        return KVS_EINVAL;
    kvs__head_slice(total_heads, prefill_tp, decode_tp, src, dst, out);
    return KVS_OK;
}

/* Heads each writer of a region copies: the same for every writer of every
 * decode rank (spec §3: nh depends on H, P and D only). */
static int64_t kvs__region_heads(const kvs_layout_t *lay)
{
    return lay->prefill_tp > lay->decode_tp ? lay->src_heads : lay->dst_heads;
}

/* a and b divide one another. */
static bool kvs__nested(int64_t a, int64_t b)
{
    return a >= b ? a % b == 0 : b % a == 0;
}

/* *acc *= v with overflow detection. */
static bool kvs__mul(int64_t *acc, int64_t v)
{
    return !__builtin_mul_overflow(*acc, v, acc);
}

static int kvs__check_positive(kvs_error_t *err, int64_t v, const char *what)
{
    if (v > 0)
        return KVS_OK;
    return KVS__FAIL(err, KVS_EINVAL, "%s must be > 0 (got %lld): pass a positive %s",
                     what, (long long)v, what);
}

int kvs_layout_init(kvs_layout_t *out, const kvs_layout_params_t *p, kvs_error_t *err)
{
    if (out == NULL || p == NULL)
        return KVS__FAIL(err, KVS_EINVAL, "layout and params must not be NULL");
    int rc;
    if ((rc = kvs__check_positive(err, p->head_dim, "head_dim")) != KVS_OK ||
        (rc = kvs__check_positive(err, p->layers, "layers")) != KVS_OK ||
        (rc = kvs__check_positive(err, p->page_size, "page_size")) != KVS_OK ||
        (rc = kvs__check_positive(err, p->prefill_tp, "prefill_tp")) != KVS_OK ||
        (rc = kvs__check_positive(err, p->decode_tp, "decode_tp")) != KVS_OK)
        return rc;
    if (p->decode_page_size < 0)
        return KVS__FAIL(err, KVS_EINVAL, "decode_page_size %lld must be >= 0 (0: the same "
                         "as page_size)", (long long)p->decode_page_size);
    if (p->prefill_cp < 0)
        return KVS__FAIL(err, KVS_EINVAL, "prefill_cp %lld must be >= 1 (0 means 1): the "
                         "prefill's context-parallel ranks", (long long)p->prefill_cp);
    if (p->prefill_pp < 0 || p->decode_pp < 0)
        return KVS__FAIL(err, KVS_EINVAL,
                         "prefill_pp and decode_pp must be >= 1 (0 means 1)");
    /* Bounded, because the plan walks layers and stages (a layout of 2^35
     * stages once kept the fuzzer in one loop for minutes). */
    if (p->layers > KVS_MAX_LAYERS)
        return KVS__FAIL(err, KVS_ERANGE, "layers %lld: at most %d (KVS_MAX_LAYERS); pass "
                         "the model's layer count", (long long)p->layers, KVS_MAX_LAYERS);
    const struct {
        const char *name;
        int64_t v;
    } ranks[] = {{"prefill_tp", p->prefill_tp}, {"decode_tp", p->decode_tp},
                 {"prefill_pp", p->prefill_pp}, {"decode_pp", p->decode_pp}};
    for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++)
        if (ranks[i].v > KVS_MAX_PARALLEL)
            return KVS__FAIL(err, KVS_ERANGE, "%s %lld: at most %d ranks (KVS_MAX_PARALLEL); "
                             "pass the deployment's size", ranks[i].name,
                             (long long)ranks[i].v, KVS_MAX_PARALLEL);
    if (p->total_heads < 0 || p->heads_per_rank < 0 || p->heads_per_rank_tp < 0)
        return KVS__FAIL(err, KVS_EINVAL, "total_heads, heads_per_rank and heads_per_rank_tp "
                         "must be >= 0 (0 = unknown)");
    const int64_t elem_bytes = kvs_dtype_bytes(p->dtype);
    if (elem_bytes == 0)
        return KVS__FAIL(err, KVS_EDTYPE, "dtype %d unknown: use bf16, fp16, fp8 or fp32",
                         (int)p->dtype);
    const int64_t planes = kvs_kv_kind_planes(p->kind);
    if (planes == 0)
        return KVS__FAIL(err, KVS_EINVAL, "kind %d unknown: use KVS_KV_GQA (K and V) or "
                         "KVS_KV_MLA (one latent per layer)", (int)p->kind);

    int64_t scale_bytes = 0;
    if (p->kv_scales != KVS_KV_SCALES_NONE) {
        if (p->kv_scales != KVS_KV_SCALES_PER_TOKEN && p->kv_scales != KVS_KV_SCALES_PER_BLOCK)
            return KVS__FAIL(err, KVS_EINVAL, "kv_scales %d unknown: use none, per-token or "
                             "per-block (--kv-scales)", (int)p->kv_scales);
        if (p->dtype != KVS_DTYPE_FP8)
            return KVS__FAIL(err, KVS_EDTYPE, "kv_scales %s needs dtype fp8 (got %s): scale "
                             "planes belong to an FP8 KV cache (--dtype fp8, or --kv-scales "
                             "none)", kvs_kv_scales_name(p->kv_scales),
                             kvs_dtype_name(p->dtype));
        if (p->scale_block < 0 ||
            (p->kv_scales == KVS_KV_SCALES_PER_BLOCK &&
             kvs_kv_scales_head_bytes(p->kv_scales, p->scale_block, p->head_dim) == 0))
            return KVS__FAIL(err, KVS_EINVAL, "scale_block %lld must divide head_dim %lld "
                             "(0 means %d): one e8m0 scale per block of a head "
                             "(--kv-scales per-block:N)", (long long)p->scale_block,
                             (long long)p->head_dim, KVS_DEFAULT_SCALE_BLOCK);
        scale_bytes = kvs_kv_scales_head_bytes(p->kv_scales, p->scale_block, p->head_dim);
    }

    kvs_layout_t l = {0};
    const int64_t heads_tp = p->heads_per_rank_tp > 0 ? p->heads_per_rank_tp : p->prefill_tp;
    if (kvs__kind_replicated(p->kind)) {
        /* One vector per token, the same on every rank: one "head". */
        if (p->total_heads > 1 || p->heads_per_rank > 1)
            return KVS__FAIL(err, KVS_EMLA, "an MLA model keeps one latent per token: "
                             "total_heads %lld and heads_per_rank %lld must be 0 or 1; "
                             "pass the latent dim as head_dim",
                             (long long)p->total_heads, (long long)p->heads_per_rank);
        l.total_heads = 1;
    } else if (kvs_heads_resolve(p->total_heads, p->heads_per_rank, heads_tp,
                                 &l.total_heads) != KVS_OK) {
        return KVS__FAIL(err, KVS_EHEADS,
                         "total KV heads unresolvable: pass total_heads (the "
                         "model's KV heads) or heads_per_rank, either > 0");
    }
    l.kind = p->kind;
    l.planes = planes;

    l.kv_scales = p->kv_scales;
    l.scale_block = p->kv_scales == KVS_KV_SCALES_PER_BLOCK
                        ? (p->scale_block > 0 ? p->scale_block : KVS_DEFAULT_SCALE_BLOCK)
                        : 0;
    l.scale_bytes = scale_bytes;

    l.head_dim = p->head_dim;
    l.elem_bytes = elem_bytes;
    l.dtype = p->dtype;
    l.layers = p->layers;
    l.page_size = p->page_size;
    l.decode_page_size = p->decode_page_size > 0 ? p->decode_page_size : p->page_size;
    l.prefill_tp = p->prefill_tp;
    l.decode_tp = p->decode_tp;
    l.prefill_pp = p->prefill_pp > 0 ? p->prefill_pp : 1;
    l.decode_pp = p->decode_pp > 0 ? p->decode_pp : 1;

    if (!kvs__nested(l.prefill_tp, l.decode_tp))
        return KVS__FAIL(err, KVS_EHEAD_SPLIT,
                         "prefill TP %lld and decode TP %lld: one must be a multiple "
                         "of the other", (long long)l.prefill_tp, (long long)l.decode_tp);
    if (!kvs__nested(l.total_heads, l.prefill_tp) || !kvs__nested(l.total_heads, l.decode_tp))
        return KVS__FAIL(err, KVS_EHEAD_SPLIT,
                         "%lld KV heads do not split over prefill TP %lld and decode "
                         "TP %lld: heads must be a multiple or a divisor of each TP",
                         (long long)l.total_heads, (long long)l.prefill_tp,
                         (long long)l.decode_tp);
    if (l.decode_pp != 1 && l.decode_pp != l.prefill_pp)
        return KVS__FAIL(err, KVS_EPP_SPLIT,
                         "decode PP %lld must be 1 or equal to prefill PP %lld",
                         (long long)l.decode_pp, (long long)l.prefill_pp);
    /* Stages need not split evenly (spec §4), but each holds a layer; Dp is
     * 1 or Pp now, so layers >= Pp covers the decode stages as well. */
    if (l.layers < l.prefill_pp)
        return KVS__FAIL(err, KVS_EPP_SPLIT,
                         "%lld layers cannot fill %lld prefill stages (decode PP "
                         "%lld): every pipeline stage needs at least one layer; use "
                         "a PP size of at most %lld", (long long)l.layers,
                         (long long)l.prefill_pp, (long long)l.decode_pp,
                         (long long)l.layers);

    /* The grid floors C to whole pages (spec §2: G = max(1, C / ps) * ps);
     * the manager's init guard (spec §8) is what refuses a C that is not a
     * multiple of the page size when staging is on. With two page sizes the
     * unit is their lcm, so a chunk covers whole pages on both sides. */
    if (p->chunk_tokens < 0)
        return KVS__FAIL(err, KVS_ECHUNK,
                         "chunk_tokens %lld must be >= 0 (0 means %d)",
                         (long long)p->chunk_tokens, KVS_DEFAULT_CHUNK_TOKENS);
    l.chunk_tokens = p->chunk_tokens > 0 ? p->chunk_tokens : KVS_DEFAULT_CHUNK_TOKENS;
    int64_t unit = l.page_size / kvs__gcd_i64(l.page_size, l.decode_page_size);
    if (!kvs__mul(&unit, l.decode_page_size))
        return KVS__FAIL(err, KVS_ERANGE, "the lcm of page sizes %lld (prefill) and %lld "
                         "(decode) overflows 64 bits: use page sizes that divide one another",
                         (long long)l.page_size, (long long)l.decode_page_size);
    l.grid_tokens = kvs__max64(1, l.chunk_tokens / unit) * unit;
    l.chunk_pages = l.grid_tokens / l.decode_page_size;
    /* Context parallelism: CP ranges start on the grid's unit, so a CP part
     * of a chunk starts a page on both sides (src/context_parallel.c). */
    l.prefill_cp = p->prefill_cp > 0 ? p->prefill_cp : 1;
    l.cp_align_tokens = unit;

    l.src_heads = kvs__max64(1, l.total_heads / l.prefill_tp);
    l.dst_heads = kvs__max64(1, l.total_heads / l.decode_tp);
    /* The most layers a stage holds: the last stage's (spec §4). */
    l.decode_layers = kvs__ceil_div(l.layers, l.decode_pp);
    l.prefill_layers = kvs__ceil_div(l.layers, l.prefill_pp);
    l.tp_sources = l.prefill_tp > l.decode_tp ? l.prefill_tp / l.decode_tp : 1;
    /* W: one writer per distinct head a decode rank takes (a hybrid
     * model's state layers raise it, kvs__hybrid_init) */
    l.tp_writers = kvs__layout_kv_writers(&l);
    l.targets_per_prefill = l.decode_tp > l.prefill_tp ? l.decode_tp / l.prefill_tp : 1;
    l.path = l.prefill_tp == l.decode_tp ? KVS_PATH_DIRECT : KVS_PATH_STAGING; /* auto */

    /* The largest region (a full chunk) must be representable. */
    int64_t max_bytes = l.grid_tokens, head_bytes = l.head_dim;
    if (!kvs__mul(&head_bytes, l.elem_bytes) ||
        __builtin_add_overflow(head_bytes, l.scale_bytes, &head_bytes) ||
        !kvs__mul(&max_bytes, kvs__region_heads(&l)) || !kvs__mul(&max_bytes, head_bytes) ||
        !kvs__mul(&max_bytes, l.decode_layers) ||
        !kvs__mul(&max_bytes, l.planes) || !kvs__mul(&max_bytes, l.tp_writers))
        return KVS__FAIL(err, KVS_ERANGE,
                         "a chunk region overflows 64 bits: lower chunk_tokens, "
                         "head_dim or layers");
    /* Window and state layers (src/hybrid.c), checked against the rest. */
    if ((rc = kvs__hybrid_init(&l, p, err)) != KVS_OK)
        return rc;
    /* A decode stage waits for every TP writer of every prefill stage that
     * holds its layers: all Pp of them when Dp is 1, its own when Dp = Pp.
     * After the checks: Pp <= layers = Lx when Dp is 1, so the count is at
     * most W * Lx, which the region bounds above keep inside int64 (huge
     * PP sizes overflowed here). */
    l.expected_arrivals = l.tp_writers * (l.decode_pp == 1 ? l.prefill_pp : 1);
    /* A draft model's layers (src/draft.c), after the model's are sized. */
    if ((rc = kvs__draft_init(&l, p, err)) != KVS_OK)
        return rc;
    *out = l;
    return KVS_OK;
}

int64_t kvs_layout_layer_block_bytes(const kvs_layout_t *lay, int64_t tokens,
                                     int64_t num_heads)
{
    /* the KV rows, then (with scales) their scale rows */
    return tokens * num_heads * (lay->head_dim * lay->elem_bytes + lay->scale_bytes);
}

void kvs__layout_writers(const kvs_layout_t *l, kvs__writers_t *out)
{
    const int64_t s = l->tp_sources, kw = kvs__layout_kv_writers(l);
    /* state heads split as KV heads do: one writer per distinct one */
    int64_t sw = kw;
    if (l->state_heads > 0) {
        sw = kvs__max64(1, l->state_heads / l->decode_tp);
        sw = sw < s ? sw : s;
    }
    const int64_t rk = s / kw, rs = s / sw;
    const int64_t lcm = rk / kvs__gcd_i64(rk, rs) * rs; /* divides S: rk and rs do */
    *out = (kvs__writers_t){.sources = s, .kv = kw, .kv_run = rk, .state_run = rs,
                            .state_every = lcm / rk,
                            .state_alone = sw - s / lcm};
}

/* Of the first o source offsets of a decode rank, those that write KV or
 * their state. */
static int64_t kvs__writing_below(const kvs__writers_t *w, int64_t o)
{
    const int64_t lcm = w->kv_run * w->state_every;
    return kvs__ceil_div(o, w->kv_run) + kvs__ceil_div(o, w->state_run) -
           kvs__ceil_div(o, lcm);
}

/* Prefill rank of source i of decode rank d (valid i < tp_sources, d):
 * d's sources are the ranks [d * S, + S) when P > D (S = P / D), else the
 * one prefill rank d / (D / P). Sources are numbered writers first
 * (kvs__writers_t): KV writer j (j < K) is the rank at offset j * rk, the
 * first of each run of rk ranks holding the same KV heads; then the
 * writers of their state alone (a hybrid model's first rank of each run
 * of rs holding the same state heads, not already a KV writer), in rank
 * order; then those that only report, in rank order. With every source
 * writing KV (rk = 1) source i is the rank at offset i. With MLA (one
 * writer) decode d thus takes its latent from prefill rank d * P / D
 * either way: spread over the prefill ranks, each feeding as many decode
 * ranks as any other. */
static int64_t kvs__layout_source_rank(const kvs_layout_t *lay, int64_t d, int64_t i)
{
    if (lay->prefill_tp <= lay->decode_tp)
        return d / lay->targets_per_prefill;
    kvs__writers_t w;
    kvs__layout_writers(lay, &w);
    const int64_t base = d * w.sources;
    if (i < w.kv)
        return base + i * w.kv_run;
    const int64_t k = i - w.kv;
    if (k < w.state_alone) { /* the k-th multiple of rs that is not one of rk */
        const int64_t q = w.kv_run * w.state_every / w.state_run; /* > 1 here */
        return base + ((k / (q - 1)) * q + 1 + k % (q - 1)) * w.state_run;
    }
    /* the c-th offset that writes nothing */
    const int64_t c = k - w.state_alone;
    if (w.state_run == w.kv_run) /* run - 1 of them after each KV writer */
        return base + (c / (w.kv_run - 1)) * w.kv_run + 1 + c % (w.kv_run - 1);
    int64_t o = c; /* the smallest o with o + 1 - writing_below(o + 1) = c + 1 */
    while (o + 1 - kvs__writing_below(&w, o + 1) < c + 1)
        o++;
    return base + o;
}

int kvs_layout_writer(const kvs_layout_t *lay, int64_t decode_rank, int64_t decode_stage,
                      int64_t writer_index, int64_t tokens, kvs_writer_t *out)
{
    if (lay == NULL || out == NULL)
        return KVS_EINVAL;
    int64_t first, slots;
    if (decode_rank < 0 || decode_rank >= lay->decode_tp || writer_index < 0 ||
        writer_index >= lay->tp_writers || tokens < 0 || tokens > lay->grid_tokens ||
        kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, decode_stage, &first, &slots) != KVS_OK)
        return KVS_ERANGE;
    if (kvs__hybrid(lay))
        return KVS_ENOTSUP; /* a chunk's blocks: kvs_layout_hybrid_writer */
    const int64_t r = kvs__layout_source_rank(lay, decode_rank, writer_index);
    kvs__head_slice(lay->total_heads, lay->prefill_tp, lay->decode_tp, r, decode_rank,
                    &out->heads);
    out->writer_index = writer_index;
    out->prefill_rank = r;
    /* Every writer of a region copies the same number of heads, so writer
     * i starts after i equal blocks. */
    out->len_bytes = kvs_layout_layer_block_bytes(lay, tokens, out->heads.num_heads) *
                         slots * lay->planes +
                     (decode_stage == kvs_layout_draft_stage(lay, KVS_ROLE_DECODE)
                          ? kvs_layout_draft_part_bytes(lay, tokens, out->heads.num_heads)
                          : 0);
    out->offset_bytes = writer_index * out->len_bytes;
    return KVS_OK;
}

int kvs_layout_region_bytes(const kvs_layout_t *lay, int64_t decode_rank,
                            int64_t decode_stage, int64_t tokens, int64_t *out_bytes)
{
    if (out_bytes == NULL)
        return KVS_EINVAL;
    kvs_writer_t last;
    int rc = kvs_layout_writer(lay, decode_rank, decode_stage, lay ? lay->tp_writers - 1 : 0,
                               tokens, &last);
    if (rc != KVS_OK)
        return rc;
    *out_bytes = last.offset_bytes + last.len_bytes;
    return KVS_OK;
}

int64_t kvs_layout_max_region_bytes(const kvs_layout_t *lay)
{
    /* Every region of a full chunk has W writers of kvs__region_heads heads,
     * whatever the decode rank; the largest is a decode stage's of the most
     * layers (decode_layers): the last stage's, which also holds a draft's
     * part. kvs_layout_init checked it fits in int64. */
    if (kvs__hybrid(lay))
        return kvs__hybrid_max_region_bytes(lay);
    const int64_t heads = kvs__region_heads(lay);
    return (kvs_layout_layer_block_bytes(lay, lay->grid_tokens, heads) * lay->decode_layers *
                lay->planes +
            kvs_layout_draft_part_bytes(lay, lay->grid_tokens, heads)) *
           lay->tp_writers;
}

int kvs_layout_target(const kvs_layout_t *lay, int64_t prefill_rank, int64_t i,
                      int64_t *out_decode_rank)
{
    if (lay == NULL || out_decode_rank == NULL)
        return KVS_EINVAL;
    if (prefill_rank < 0 || prefill_rank >= lay->prefill_tp || i < 0 ||
        i >= lay->targets_per_prefill)
        return KVS_ERANGE;
    if (lay->prefill_tp > lay->decode_tp)
        *out_decode_rank = prefill_rank / lay->tp_sources;
    else
        *out_decode_rank = prefill_rank * lay->targets_per_prefill + i;
    return KVS_OK;
}

int kvs_layout_source_index(const kvs_layout_t *lay, int64_t prefill_rank,
                            int64_t decode_rank, int64_t *out_index)
{
    if (lay == NULL || out_index == NULL)
        return KVS_EINVAL;
    if (prefill_rank < 0 || prefill_rank >= lay->prefill_tp || decode_rank < 0 ||
        decode_rank >= lay->decode_tp)
        return KVS_ERANGE;
    if (lay->prefill_tp <= lay->decode_tp) {
        if (kvs__layout_source_rank(lay, decode_rank, 0) != prefill_rank)
            return KVS_ENOENT;
        *out_index = 0;
        return KVS_OK;
    }
    if (prefill_rank / lay->tp_sources != decode_rank)
        return KVS_ENOENT;
    /* the inverse of kvs__layout_source_rank */
    kvs__writers_t w;
    kvs__layout_writers(lay, &w);
    const int64_t o = prefill_rank % w.sources;
    const int64_t lcm = w.kv_run * w.state_every;
    if (o % w.kv_run == 0)
        *out_index = o / w.kv_run;
    else if (o % w.state_run == 0) /* multiples of rs below o, less those of both */
        *out_index = w.kv + kvs__ceil_div(o, w.state_run) - kvs__ceil_div(o, lcm);
    else
        *out_index = w.kv + w.state_alone + o - kvs__writing_below(&w, o);
    return KVS_OK;
}

int kvs_layout_source_rank(const kvs_layout_t *lay, int64_t decode_rank, int64_t source_index,
                           int64_t *out_prefill_rank)
{
    if (lay == NULL || out_prefill_rank == NULL)
        return KVS_EINVAL;
    if (decode_rank < 0 || decode_rank >= lay->decode_tp || source_index < 0 ||
        source_index >= lay->tp_sources)
        return KVS_ERANGE;
    *out_prefill_rank = kvs__layout_source_rank(lay, decode_rank, source_index);
    return KVS_OK;
}

int kvs_layout_writer_index(const kvs_layout_t *lay, int64_t prefill_rank,
                            int64_t decode_rank, int64_t *out_index)
{
    if (out_index == NULL)
        return KVS_EINVAL;
    int64_t i = 0;
    const int rc = kvs_layout_source_index(lay, prefill_rank, decode_rank, &i);
    if (rc != KVS_OK)
        return rc;
    if (i >= lay->tp_writers) /* a source that only reports (MLA, replicas) */
        return KVS_ENOENT;
    *out_index = i;
    return KVS_OK;
}
