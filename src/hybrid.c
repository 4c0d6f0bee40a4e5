/*
 * hybrid.c - the layout of hybrid models (docs/kinds/hybrid.md): which
 * layers are full attention, sliding-window attention or state layers
 * (linear attention / SSM), which tokens of each move, and where a writer's
 * rows and per-request state go in a decode rank's region.
 *
 * Pure functions over a validated kvs_layout_t: no allocation, no state.
 * The layer pattern is a period: layer l is full attention when
 * (l + 1) % full_attn_every == 0, of kind other_layers otherwise (gpt-oss
 * alternates window and full from a window layer 0; Qwen3-Next has three
 * Gated DeltaNet layers, then a full one). A layout of full layers alone
 * (full_attn_every 0 or 1) is spec §4's, byte for byte.
 *
 * A writer block of a hybrid region is spec §4's with the empty slots left
 * out, in parts: one per prefill stage holding layers of the decode stage
 * (one part, the whole block, when both sides have the same PP or the
 * prefill has PP 1; a part per prefill stage with prefill PP into a decode
 * of PP 1). A part holds, per plane, the slots of its layers that have rows
 * in the chunk, then (in the last chunk of the request alone) its state
 * layers' states, so a prefill stage still writes one span per chunk. State
 * heads split over TP with the KV heads' formula (spec §3) applied to
 * state_heads.
 *
 * With prefill context parallelism (src/context_parallel.c) each CP part
 * of a chunk is a hybrid region of its own tokens: a writer block of
 * tokens [a, b) holds their full rows, their rows inside the window, and
 * the state only when b is the request's end (the CP rank holding the
 * last token has the final state).
 */
#include "hybrid.h"

#include "arith.h"
#include "error.h"

#include <string.h>

static const struct {
    const char *name;
    kvs_layer_kind_t kind;
} kvs__layer_kinds[] = {
    {"full", KVS_LAYER_FULL},
    {"window", KVS_LAYER_WINDOW},
    {"state", KVS_LAYER_STATE},
};

int kvs_layer_kind_parse(const char *name, kvs_layer_kind_t *out)
{
    if (name == NULL || out == NULL)
        return KVS_EINVAL;
    for (size_t i = 0; i < sizeof kvs__layer_kinds / sizeof kvs__layer_kinds[0]; i++) {
        if (strcmp(name, kvs__layer_kinds[i].name) == 0) {
            *out = kvs__layer_kinds[i].kind;
            return KVS_OK;
        }
    }
    return KVS_EINVAL;
}

const char *kvs_layer_kind_name(kvs_layer_kind_t kind)
{
    for (size_t i = 0; i < sizeof kvs__layer_kinds / sizeof kvs__layer_kinds[0]; i++) {
        if (kvs__layer_kinds[i].kind == kind)
            return kvs__layer_kinds[i].name;
    }
    return "unknown";
}

/* a and b divide one another (both > 0). */
static int kvs__divides(int64_t a, int64_t b)
{
    return a >= b ? a % b == 0 : b % a == 0;
}

static int64_t kvs__max(int64_t a, int64_t b) { return a > b ? a : b; }

/* The kind of layer l of a validated layout. */
static kvs_layer_kind_t kvs__kind_of(const kvs_layout_t *lay, int64_t l)
{
    return kvs__layer_kind_of(lay->full_attn_every, lay->other_layers, l);
}

/* Layers of each kind among [first, first + n). */
static void kvs__count(const kvs_layout_t *lay, int64_t first, int64_t n, int64_t *full,
                       int64_t *other)
{
    *full = 0;
    *other = 0;
    if (!kvs__hybrid(lay)) {
        *full = n;
        return;
    }
    /* full layers in [0, x): floor(x / k) */
    const int64_t k = lay->full_attn_every;
    *full = (first + n) / k - first / k;
    *other = n - *full;
}

int kvs__hybrid_init(kvs_layout_t *l, const kvs_layout_params_t *p, kvs_error_t *err)
{
    const int hybrid = p->full_attn_every > 1;
    if (p->full_attn_every < 0)
        return KVS__FAIL(err, KVS_EINVAL, "full_attn_every %lld must be >= 0 (0 or 1: every "
                         "layer full attention; k: every k-th, --full-attn-every)",
                         (long long)p->full_attn_every);
    if (!hybrid) {
        if (p->other_layers != KVS_LAYER_FULL || p->window_tokens != 0 ||
            p->state_heads != 0 || p->state_conv_bytes != 0 || p->state_ssm_bytes != 0)
            return KVS__FAIL(err, KVS_EINVAL, "window_tokens / state_heads / state bytes given "
                             "with every layer full attention: set full_attn_every > 1 "
                             "(--full-attn-every) or drop them");
        return KVS_OK;
    }
    if (l->kind != KVS_KV_GQA)
        return KVS__FAIL(err, KVS_EINVAL, "full_attn_every %lld: hybrid layers need kind gqa "
                         "(got %s): drop --full-attn-every or the MLA model",
                         (long long)p->full_attn_every, kvs_kv_kind_name(l->kind));
    l->full_attn_every = p->full_attn_every;
    l->other_layers = p->other_layers;
    if (p->other_layers == KVS_LAYER_WINDOW) {
        if (p->window_tokens <= 0)
            return KVS__FAIL(err, KVS_EINVAL, "window_tokens %lld must be > 0 for window "
                             "layers (--window)", (long long)p->window_tokens);
        if (p->state_heads != 0 || p->state_conv_bytes != 0 || p->state_ssm_bytes != 0)
            return KVS__FAIL(err, KVS_EINVAL, "state_heads / state bytes given with window "
                             "layers: a layer pattern has one other kind (--window or "
                             "--state-heads, not both)");
        l->window_tokens = p->window_tokens;
    } else if (p->other_layers == KVS_LAYER_STATE) {
        if (p->window_tokens != 0)
            return KVS__FAIL(err, KVS_EINVAL, "window_tokens given with state layers: a "
                             "layer pattern has one other kind (--window or --state-heads, "
                             "not both)");
        if (p->state_heads <= 0 || p->state_conv_bytes < 0 || p->state_ssm_bytes < 0 ||
            __builtin_add_overflow(p->state_conv_bytes, p->state_ssm_bytes,
                                   &l->state_head_bytes) ||
            l->state_head_bytes <= 0)
            return KVS__FAIL(err, KVS_EINVAL, "state layers need state_heads > 0 and state "
                             "bytes per head (conv + ssm) > 0 (--state-heads, --state-bytes)");
        if (!kvs__divides(p->state_heads, l->prefill_tp) ||
            !kvs__divides(p->state_heads, l->decode_tp))
            return KVS__FAIL(err, KVS_EHEAD_SPLIT, "%lld state heads do not split over "
                             "prefill TP %lld and decode TP %lld: state heads must be a "
                             "multiple or a divisor of each TP (--state-heads)",
                             (long long)p->state_heads, (long long)l->prefill_tp,
                             (long long)l->decode_tp);
        l->state_heads = p->state_heads;
        l->state_conv_bytes = p->state_conv_bytes;
        l->state_ssm_bytes = p->state_ssm_bytes;
        l->state_src_heads = kvs__max(1, p->state_heads / l->prefill_tp);
        l->state_dst_heads = kvs__max(1, p->state_heads / l->decode_tp);
        /* state heads split over TP on their own: the first source of each
         * run holding a state head writes it, those not KV writers their
         * state alone (kvs__writers_t) */
        kvs__writers_t w;
        kvs__layout_writers(l, &w);
        l->tp_writers = w.kv + w.state_alone;
    } else {
        return KVS__FAIL(err, KVS_EINVAL, "other_layers %d: use KVS_LAYER_WINDOW (--window) "
                         "or KVS_LAYER_STATE (--state-heads) for the layers that are not "
                         "full attention", (int)p->other_layers);
    }
    /* The largest region must fit in int64: every slot of G rows plus the
     * state part, bounded by all layers of the model. */
    const int64_t nh = l->prefill_tp > l->decode_tp ? l->src_heads : l->dst_heads;
    const int64_t snh = l->prefill_tp > l->decode_tp ? l->state_src_heads : l->state_dst_heads;
    int64_t row = l->head_dim, kv = l->grid_tokens, st = snh, total = 0;
    if (__builtin_mul_overflow(row, l->elem_bytes, &row) ||
        __builtin_add_overflow(row, l->scale_bytes, &row) ||
        __builtin_mul_overflow(kv, nh, &kv) || __builtin_mul_overflow(kv, row, &kv) ||
        __builtin_mul_overflow(kv, l->planes, &kv) ||
        __builtin_mul_overflow(kv, l->layers, &kv) ||
        __builtin_mul_overflow(st, l->state_head_bytes, &st) ||
        __builtin_mul_overflow(st, l->layers, &st) ||
        __builtin_add_overflow(kv, st, &total) ||
        __builtin_mul_overflow(total, l->tp_writers, &total))
        return KVS__FAIL(err, KVS_ERANGE, "a hybrid chunk region overflows 64 bits: lower "
                         "chunk_tokens, state bytes or layers");
    return KVS_OK;
}

int kvs_layout_layer_kind(const kvs_layout_t *lay, int64_t layer, kvs_layer_kind_t *out)
{
    if (lay == NULL || out == NULL)
        return KVS_EINVAL;
    if (layer < 0 || layer >= lay->layers)
        return KVS_ERANGE;
    *out = kvs__kind_of(lay, layer);
    return KVS_OK;
}

/* First token of the window of a request of `total` tokens: the last W
 * tokens' first, floored to the grid unit (a page on both sides). */
static int64_t kvs__window_start(const kvs_layout_t *lay, int64_t total)
{
    const int64_t first = total > lay->window_tokens ? total - lay->window_tokens : 0;
    return first / lay->cp_align_tokens * lay->cp_align_tokens;
}

int kvs_layout_layer_tokens(const kvs_layout_t *lay, int64_t layer, int64_t total_tokens,
                            int64_t *out_start, int64_t *out_end)
{
    kvs_layer_kind_t kind;
    if (out_start == NULL || out_end == NULL || total_tokens < 0)
        return KVS_EINVAL;
    const int rc = kvs_layout_layer_kind(lay, layer, &kind);
    if (rc != KVS_OK)
        return rc;
    *out_end = total_tokens;
    if (kind == KVS_LAYER_FULL)
        *out_start = 0;
    else if (kind == KVS_LAYER_WINDOW)
        *out_start = kvs__window_start(lay, total_tokens);
    else
        *out_start = total_tokens;
    return KVS_OK;
}

/* The spec §3 slice for `heads` heads (KV heads, or state heads): the
 * layout's own kvs_head_slice; its arguments are checked by the callers
 * (heads and TPs > 0 by kvs_layout_init, ranks by the range checks). */
static void kvs__slice(const kvs_layout_t *lay, int64_t heads, int64_t src, int64_t dst,
                       kvs_head_slice_t *out)
{
    (void)kvs_head_slice(heads, lay->prefill_tp, lay->decode_tp, src, dst, out);
}

/* The layers of prefill stage s that decode stage e holds, [*first, +*n)
 * (*n 0: none); both stages in range. */
static void kvs__part_layers(const kvs_layout_t *lay, int64_t e, int64_t s, int64_t *first,
                             int64_t *n)
{
    int64_t pf = 0, pn = 0, df = 0, dn = 0;
    (void)kvs_layout_stage_layers(lay, KVS_ROLE_PREFILL, s, &pf, &pn);
    (void)kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, e, &df, &dn);
    *first = kvs__max(pf, df);
    const int64_t end = pf + pn < df + dn ? pf + pn : df + dn;
    *n = end > *first ? end - *first : 0;
}

/* The bytes in block hw of the layers [first, +n): their slots (every
 * plane) and their state. */
static void kvs__part_bytes(const kvs_layout_t *lay, const kvs_hybrid_writer_t *hw,
                            int64_t first, int64_t n, int64_t *kv, int64_t *state)
{
    int64_t full, other;
    kvs__count(lay, first, n, &full, &other);
    const int64_t row = kvs_layout_layer_block_bytes(lay, 1, hw->w.heads.num_heads);
    *kv = (full * hw->tokens + (hw->window_slots > 0 ? other * hw->window_tokens : 0)) * row *
          lay->planes;
    *state = hw->state_layers > 0 ? other * hw->state_heads.num_heads * lay->state_head_bytes
                                  : 0;
}

/* The part of block hw (decode stage e, in range) that prefill stage s
 * writes; with `layer` >= 0 instead the part holding that layer (s
 * ignored). KVS_ENOENT when there is none. */
static int kvs__part(const kvs_layout_t *lay, const kvs_hybrid_writer_t *hw, int64_t e,
                     int64_t s, int64_t layer, kvs_hybrid_part_t *out)
{
    /* the prefill stages holding stage e's layers: every one into a decode
     * of PP 1, else stage e alone (kvs_layout_init: Dp is 1 or Pp) */
    const int64_t q0 = lay->decode_pp == 1 ? 0 : e;
    const int64_t q1 = lay->decode_pp == 1 ? lay->prefill_pp : e + 1;
    int64_t at = 0;
    for (int64_t q = q0; q < q1; q++) {
        int64_t first, n, kv, state;
        kvs__part_layers(lay, e, q, &first, &n);
        if (n == 0)
            continue;
        kvs__part_bytes(lay, hw, first, n, &kv, &state);
        /* a draft's part ends the last prefill stage's (src/draft.c) */
        const int64_t draft = q == lay->prefill_pp - 1 ? hw->draft_bytes : 0;
        if (layer >= 0 ? layer >= first && layer < first + n : q == s) {
            *out = (kvs_hybrid_part_t){.prefill_stage = q, .first_layer = first,
                                       .num_layers = n, .offset_bytes = at,
                                       .len_bytes = kv + state + draft, .kv_bytes = kv,
                                       .state_bytes = state, .draft_bytes = draft};
            return KVS_OK;
        }
        at += kv + state + draft;
    }
    return KVS_ENOENT;
}

int kvs_layout_hybrid_writer(const kvs_layout_t *lay, int64_t decode_rank,
                             int64_t decode_stage, int64_t writer_index,
                             int64_t total_tokens, const kvs_chunk_t *chunk,
                             kvs_hybrid_writer_t *out)
{
    if (lay == NULL || chunk == NULL || out == NULL)
        return KVS_EINVAL;
    int64_t first, slots;
    const int64_t ts = chunk->token_start, te = chunk->token_end;
    if (decode_rank < 0 || decode_rank >= lay->decode_tp || writer_index < 0 ||
        writer_index >= lay->tp_writers || total_tokens < 0 || ts < 0 || te < ts ||
        te > total_tokens || te - ts > lay->grid_tokens ||
        kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, decode_stage, &first, &slots) != KVS_OK)
        return KVS_ERANGE;
    memset(out, 0, sizeof *out);
    int64_t r = 0; /* in range: checked above */
    (void)kvs_layout_source_rank(lay, decode_rank, writer_index, &r);
    kvs__slice(lay, lay->total_heads, r % lay->prefill_tp, decode_rank, &out->w.heads);
    out->w.writer_index = writer_index;
    out->w.prefill_rank = r;
    out->token_start = ts;
    out->tokens = te - ts;

    int64_t full, other;
    kvs__count(lay, first, slots, &full, &other);
    out->full_slots = full;
    const int64_t t = te - ts;
    const int64_t row = kvs_layout_layer_block_bytes(lay, 1, out->w.heads.num_heads);
    out->kv_bytes = full * t * row;
    if (kvs__hybrid(lay) && lay->other_layers == KVS_LAYER_WINDOW && other > 0) {
        const int64_t ws = kvs__max(ts, kvs__window_start(lay, total_tokens));
        if (ws < te) {
            out->window_slots = other;
            out->window_token_start = ws;
            out->window_tokens = te - ws;
            out->kv_bytes += other * (te - ws) * row;
        }
    }
    out->kv_bytes *= lay->planes;
    /* The KV writers (kvs__writers_t, one per distinct KV head) come
     * first, each block its rows and, when it is the first holder of its
     * state heads, its state; then the writers of their state alone (a
     * replica of a KV head already written). Every block of a kind is as
     * long as any other of that kind. */
    kvs__writers_t wr;
    kvs__layout_writers(lay, &wr);
    int64_t st = 0; /* a state block's bytes, in this chunk */
    if (kvs__hybrid(lay) && lay->other_layers == KVS_LAYER_STATE) {
        kvs__slice(lay, lay->state_heads, r % lay->prefill_tp, decode_rank, &out->state_heads);
        if (te == total_tokens) /* the last chunk carries the state */
            st = other * out->state_heads.num_heads * lay->state_head_bytes;
        if (writer_index >= wr.kv || writer_index % wr.state_every == 0) {
            out->state_layers = te == total_tokens ? other : 0;
            out->state_bytes = st;
        } else { /* a replica of a state head another KV writer writes */
            out->state_heads.num_heads = 0;
        }
    }
    /* A draft's layers (src/draft.c): the chunk's rows of the writer's
     * heads, at the end of its block in the last decode stage's regions
     * (the last prefill stage's part) */
    const int64_t draft =
        decode_stage == kvs_layout_draft_stage(lay, KVS_ROLE_DECODE)
            ? kvs_layout_draft_part_bytes(lay, t, out->w.heads.num_heads)
            : 0;
    /* KV writers before this one that write their state */
    const int64_t with_state = kvs__ceil_div(kvs__min_i64(writer_index, wr.kv), wr.state_every);
    const int64_t kvd = out->kv_bytes + draft; /* a KV writer's bytes besides its state */
    kvs_hybrid_part_t part0 = {0};
    if (writer_index < wr.kv) {
        out->draft_bytes = draft;
        out->w.len_bytes = kvd + out->state_bytes;
        out->draft_offset_bytes = out->w.len_bytes - draft;
        out->w.offset_bytes = writer_index * kvd + with_state * st;
    } else {
        out->w.offset_bytes = wr.kv * kvd + with_state * st + (writer_index - wr.kv) * st;
        out->w.heads.num_heads = 0;
        out->full_slots = out->window_slots = 0;
        out->window_tokens = 0;
        out->kv_bytes = 0;
        out->w.len_bytes = out->state_bytes;
    }
    /* the first part's state follows its slots (with one part: kv_bytes) */
    (void)kvs__part(lay, out, decode_stage, 0, first, &part0);
    out->state_offset_bytes = part0.offset_bytes + part0.kv_bytes;
    return KVS_OK;
}

int kvs_layout_hybrid_part(const kvs_layout_t *lay, const kvs_hybrid_writer_t *hw,
                           int64_t decode_stage, int64_t prefill_stage,
                           kvs_hybrid_part_t *out)
{
    int64_t first, n;
    if (lay == NULL || hw == NULL || out == NULL)
        return KVS_EINVAL;
    if (kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, decode_stage, &first, &n) != KVS_OK ||
        kvs_layout_stage_layers(lay, KVS_ROLE_PREFILL, prefill_stage, &first, &n) != KVS_OK)
        return KVS_ERANGE;
    memset(out, 0, sizeof *out);
    return kvs__part(lay, hw, decode_stage, prefill_stage, -1, out);
}

int kvs_layout_hybrid_slot(const kvs_layout_t *lay, const kvs_hybrid_writer_t *hw,
                           int64_t decode_stage, int64_t layer, int64_t plane,
                           kvs_hybrid_slot_t *out)
{
    int64_t first, n, full, other;
    kvs_hybrid_part_t part;
    if (lay == NULL || hw == NULL || out == NULL)
        return KVS_EINVAL;
    if (kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, decode_stage, &first, &n) != KVS_OK ||
        layer < first || layer >= first + n || plane < 0 || plane >= lay->planes)
        return KVS_ERANGE;
    const kvs_layer_kind_t kind = kvs__kind_of(lay, layer);
    memset(out, 0, sizeof *out);
    out->kind = kind;
    /* the part holding the layer (one exists: every layer is on some
     * prefill stage), and its layers before this one, by kind */
    (void)kvs__part(lay, hw, decode_stage, 0, layer, &part);
    kvs__count(lay, part.first_layer, layer - part.first_layer, &full, &other);
    if (kind == KVS_LAYER_STATE) {
        if (plane != 0 || hw->state_layers == 0) /* one state, no V */
            return KVS_ENOENT;
        out->len_bytes = hw->state_heads.num_heads * lay->state_head_bytes;
        out->offset_bytes = part.offset_bytes + part.kv_bytes + other * out->len_bytes;
        return KVS_OK;
    }
    if (hw->w.heads.num_heads == 0) /* a writer of its state alone */
        return KVS_ENOENT;
    const int64_t row = kvs_layout_layer_block_bytes(lay, 1, hw->w.heads.num_heads);
    /* per plane: the part's slots of the layers before this one (window
     * slots only where the window meets the chunk), planes one after
     * another */
    const int64_t windows_before = hw->window_slots > 0 ? other : 0;
    out->offset_bytes = part.offset_bytes + plane * (part.kv_bytes / lay->planes) +
                        (full * hw->tokens + windows_before * hw->window_tokens) * row;
    if (kind == KVS_LAYER_WINDOW) {
        if (hw->window_slots == 0)
            return KVS_ENOENT;
        out->token_start = hw->window_token_start;
        out->rows = hw->window_tokens;
    } else {
        out->token_start = hw->token_start;
        out->rows = hw->tokens;
    }
    out->len_bytes = out->rows * row;
    return KVS_OK;
}

int kvs_layout_state_slot_bytes(const kvs_layout_t *lay, kvs_role_t role, int64_t stage,
                                int64_t *out_bytes)
{
    int64_t first, n, full, other;
    if (out_bytes == NULL)
        return KVS_EINVAL;
    const int rc = kvs_layout_stage_layers(lay, role, stage, &first, &n);
    if (rc != KVS_OK)
        return rc;
    *out_bytes = 0;
    if (!kvs__hybrid(lay) || lay->other_layers != KVS_LAYER_STATE)
        return KVS_OK;
    kvs__count(lay, first, n, &full, &other);
    const int64_t heads = role == KVS_ROLE_PREFILL ? lay->state_src_heads : lay->state_dst_heads;
    *out_bytes = other * heads * lay->state_head_bytes;
    return KVS_OK;
}

/* The largest block writer w (or, with w < 0, the largest region) of a
 * full chunk takes, over the decode stages: a KV writer's slots of G rows
 * and state part, a later writer's state part alone (kvs_layout_hybrid_writer);
 * with prefill stage s >= 0 (and w >= 0), that stage's part of the block. */
static int64_t kvs__hybrid_most_bytes(const kvs_layout_t *lay, int64_t w, int64_t s)
{
    const int64_t nh = lay->prefill_tp > lay->decode_tp ? lay->src_heads : lay->dst_heads;
    const int64_t snh = lay->prefill_tp > lay->decode_tp ? lay->state_src_heads
                                                         : lay->state_dst_heads;
    kvs__writers_t wr;
    kvs__layout_writers(lay, &wr);
    const int64_t kw = wr.kv, with_state = kw / wr.state_every; /* state_every divides K */
    int64_t best = 0;
    for (int64_t e = 0; e < lay->decode_pp; e++) {
        int64_t first, n, full, other;
        if (kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, e, &first, &n) != KVS_OK)
            continue;
        if (s >= 0)
            kvs__part_layers(lay, e, s, &first, &n);
        kvs__count(lay, first, n, &full, &other);
        const int64_t window_rows =
            lay->other_layers == KVS_LAYER_WINDOW ? other * lay->grid_tokens : 0;
        const int64_t kv = (full * lay->grid_tokens + window_rows) * lay->planes *
                           kvs_layout_layer_block_bytes(lay, 1, nh);
        const int64_t st =
            lay->other_layers == KVS_LAYER_STATE ? other * snh * lay->state_head_bytes : 0;
        const int64_t draft = e == kvs_layout_draft_stage(lay, KVS_ROLE_DECODE) &&
                                      (s < 0 || s == lay->prefill_pp - 1)
                                  ? kvs_layout_draft_part_bytes(lay, lay->grid_tokens, nh)
                                  : 0;
        const int64_t bytes =
            w < 0 ? (kv + draft) * kw + st * (with_state + lay->tp_writers - kw)
                  : (w < kw ? kv + draft + (w % wr.state_every == 0 ? st : 0) : st);
        best = kvs__max(best, bytes);
    }
    return best;
}

int64_t kvs__hybrid_max_region_bytes(const kvs_layout_t *lay)
{
    return kvs__hybrid_most_bytes(lay, -1, -1);
}

int64_t kvs__hybrid_max_part_bytes(const kvs_layout_t *lay, int64_t writer,
                                   int64_t prefill_stage)
{
    return kvs__hybrid_most_bytes(lay, writer, prefill_stage);
}
