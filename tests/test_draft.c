/*
 * test_draft.c - the layout of a draft model's KV (src/draft.c,
 * docs/kinds/draft.md): writer blocks worked by hand (GQA P > D, P < D, MLA,
 * a draft head dim of its own); a byte model of whole requests (gather by
 * the planner's writers, one block per writer, scatter by the formula the
 * doc gives) that checks every byte of the model's and the draft's layers
 * on every decode rank and that every region byte is written once, at
 * P > D, P < D, P = D, replicated heads, MLA and prefill context
 * parallelism, with a planted bug (the draft part at the block's start)
 * caught; every refusal by name; and a layout without a draft unchanged.
 * With pipeline parallelism (the draft on the last stage of both sides):
 * blocks by hand at Pp = Dp = 2 and Pp 2 -> Dp 1 (the other stage's bytes
 * where they are without a draft), and a byte model that gathers each
 * prefill stage's staging block by the doc, writes it by the planner's
 * spans and scatters each decode stage's region by the doc, with a draft
 * gathered by the first stage instead of the last caught.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <kvstage/kvstage.h>

#include "chunk.h"

static kvs_layout_params_t llama(int64_t p, int64_t d, int64_t draft_layers)
{
    return (kvs_layout_params_t){.total_heads = 8, .head_dim = 128, .layers = 32,
                                 .page_size = 16, .prefill_tp = p, .decode_tp = d,
                                 .chunk_tokens = 64, .draft_layers = draft_layers};
}

static kvs_layout_t init_ok(const kvs_layout_params_t *p)
{
    kvs_layout_t l;
    kvs_error_t err = {0};
    const int rc = kvs_layout_init(&l, p, &err);
    if (rc != KVS_OK)
        fail_msg("kvs_layout_init: %s (%s)", err.msg, kvs_status_name(rc));
    return l;
}

/* Writer blocks by hand: the model's slots as before, then the draft's. */
static void test_draft_writer_blocks_by_hand(void **state)
{
    (void)state;
    /* Llama 3.1 8B + EAGLE (one layer of the model's shape), P4 -> D2, 16
     * tokens: 2 heads a writer; model 16 x 2 x 128 x 2 B x 32 layers x K,V =
     * 524288 B, draft 16 x 2 x 128 x 2 x 1 x 2 = 16384 B. */
    kvs_layout_params_t p = llama(4, 2, 1);
    kvs_layout_t l = init_ok(&p);
    assert_int_equal(l.draft_layers, 1);
    assert_int_equal(l.draft_head_dim, 128);
    assert_int_equal(kvs_layout_draft_part_bytes(&l, 16, 2), 16384);
    kvs_writer_t w;
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 1, 16, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 3);
    assert_int_equal(w.len_bytes, 524288 + 16384);
    assert_int_equal(w.offset_bytes, 524288 + 16384);
    int64_t region;
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 0, 16, &region), KVS_OK);
    assert_int_equal(region, 2 * (524288 + 16384));
    /* A full chunk of 64 tokens: the largest region counts the draft. */
    assert_int_equal(kvs_layout_max_region_bytes(&l), 4 * 2 * (524288 + 16384));

    /* A standalone draft of its own head dim (64) and 16 layers, P1 -> D2:
     * 4 heads a writer, 16 x 4 x 64 x 2 x 16 x 2 = 262144 B of draft. */
    p = llama(1, 2, 16);
    p.draft_head_dim = 64;
    p.draft_kv_heads = 8;
    l = init_ok(&p);
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 0, 16, &w), KVS_OK);
    assert_int_equal(w.heads.src_start, 4);
    assert_int_equal(w.len_bytes, 16 * 4 * 128 * 2 * 32 * 2 + 262144);

    /* MLA (DeepSeek-V3 + its MTP layer): one latent, one writer. */
    p = (kvs_layout_params_t){.head_dim = 576, .layers = 61, .page_size = 64,
                              .prefill_tp = 8, .decode_tp = 4, .chunk_tokens = 64,
                              .kind = KVS_KV_MLA, .draft_layers = 1};
    l = init_ok(&p);
    assert_int_equal(l.tp_writers, 1);
    assert_int_equal(kvs_layout_draft_part_bytes(&l, 64, 1), 64 * 576 * 2);
    assert_int_equal(kvs_layout_writer(&l, 3, 0, 0, 64, &w), KVS_OK);
    assert_int_equal(w.len_bytes, 64 * 576 * 2 * 61 + 64 * 576 * 2);

    /* Without a draft nothing changes, and the draft part is 0. */
    p = llama(4, 2, 0);
    l = init_ok(&p);
    assert_int_equal(kvs_layout_draft_part_bytes(&l, 16, 2), 0);
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 1, 16, &w), KVS_OK);
    assert_int_equal(w.len_bytes, 524288);
    assert_int_equal(kvs_layout_draft_part_bytes(NULL, 16, 2), 0);
}

/* ---- the byte model ------------------------------------------------------ */

/* One byte of (draft or model, layer, plane, global head, token, byte). */
static uint8_t value(int draft, int64_t layer, int64_t plane, int64_t head, int64_t token,
                     int64_t b)
{
    uint64_t v = (uint64_t)draft * 0x9e3779b97f4a7c15ull ^ (uint64_t)layer * 1000003u ^
                 (uint64_t)plane * 7919u ^ (uint64_t)head * 104729u ^
                 (uint64_t)token * 15485863u ^ (uint64_t)b * 2654435761u;
    v ^= v >> 29;
    return (uint8_t)(v * 0xbf58476d1ce4e5b9ull >> 56);
}

/* The global head of local head j on a rank of a side of tp ranks. */
static int64_t global_head(const kvs_layout_t *l, int64_t tp, int64_t rank, int64_t j)
{
    if (l->total_heads >= tp)
        return rank * (l->total_heads / tp) + j;
    return rank / (tp / l->total_heads);
}

typedef struct {
    const kvs_layout_t *l;
    uint8_t *region;   /* one chunk's region of one decode rank */
    int64_t bytes;
    uint8_t *written;  /* how many times each region byte was written */
    int planted;       /* gather the draft part at the block's start */
} model_t;

/* Writer w's block of a region part of `tokens` tokens from token t0, as the
 * planner places it: the model's slots, then the draft part at len minus
 * kvs_layout_draft_part_bytes. */
static void gather(model_t *m, int64_t base, const kvs_writer_t *w, int64_t t0, int64_t tokens)
{
    const kvs_layout_t *l = m->l;
    const int64_t nh = w->heads.num_heads, s = l->elem_bytes;
    const int64_t src = w->prefill_rank;
    int64_t at = base + w->offset_bytes;
    const int64_t draft_at = base + w->offset_bytes + w->len_bytes -
                             kvs_layout_draft_part_bytes(l, tokens, nh);
    for (int draft = 0; draft < 2; draft++) {
        const int64_t layers = draft ? l->draft_layers : l->layers;
        const int64_t hd = draft ? l->draft_head_dim : l->head_dim;
        if (draft)
            at = m->planted ? base + w->offset_bytes : draft_at;
        for (int64_t p = 0; p < l->planes; p++)
            for (int64_t layer = 0; layer < layers; layer++)
                for (int64_t t = 0; t < tokens; t++)
                    for (int64_t j = 0; j < nh; j++) {
                        const int64_t h =
                            global_head(l, l->prefill_tp, src, w->heads.src_start + j);
                        for (int64_t b = 0; b < hd * s; b++, at++) {
                            assert_true(at >= 0 && at < m->bytes);
                            m->region[at] = value(draft, layer, p, h, t0 + t, b);
                            m->written[at]++;
                        }
                    }
    }
}

/* Decode rank d's pools: [draft][plane][layer][token][local head][hd * s]. */
typedef struct {
    uint8_t *pool[2];
    int64_t heads, tokens;
} pools_t;

static int64_t pool_at(const kvs_layout_t *l, const pools_t *pl, int draft, int64_t p,
                       int64_t layer, int64_t t, int64_t j)
{
    const int64_t layers = draft ? l->draft_layers : l->layers;
    const int64_t hb = (draft ? l->draft_head_dim : l->head_dim) * l->elem_bytes;
    return (((p * layers + layer) * pl->tokens + t) * pl->heads + j) * hb;
}

/* The doc's formula, written apart from the planner's: writer i's block at
 * i x blk, blk = T nh (hd s L + dhd s Ld) planes; the model's slot of
 * (plane p, layer l) at (p L + l) T nh hd s; the draft's at the model's
 * bytes + (p Ld + l) T nh dhd s. */
static void scatter(const model_t *m, int64_t base, int64_t d, int64_t t0, int64_t tokens,
                    pools_t *pl)
{
    const kvs_layout_t *l = m->l;
    const int64_t s = l->elem_bytes;
    for (int64_t i = 0; i < l->tp_writers; i++) {
        kvs_writer_t w;
        assert_int_equal(kvs_layout_writer(l, d, 0, i, tokens, &w), KVS_OK);
        const int64_t nh = w.heads.num_heads;
        const int64_t model = tokens * nh * l->head_dim * s * l->layers * l->planes;
        const int64_t blk = model + tokens * nh * l->draft_head_dim * s * l->draft_layers *
                                        l->planes;
        for (int draft = 0; draft < 2; draft++) {
            const int64_t layers = draft ? l->draft_layers : l->layers;
            const int64_t hd = draft ? l->draft_head_dim : l->head_dim;
            for (int64_t p = 0; p < l->planes; p++)
                for (int64_t layer = 0; layer < layers; layer++)
                    for (int64_t t = 0; t < tokens; t++)
                        for (int64_t j = 0; j < nh; j++) {
                            const int64_t from = base + i * blk + (draft ? model : 0) +
                                                 ((p * layers + layer) * tokens * nh +
                                                  t * nh + j) * hd * s;
                            memcpy(pl->pool[draft] + pool_at(l, pl, draft, p, layer, t0 + t,
                                                             w.heads.dst_start + j),
                                   m->region + from, (size_t)(hd * s));
                        }
        }
    }
}

/* Moves a request of `total` tokens to every decode rank, chunk by chunk
 * and CP part by CP part; returns the bytes that differ from the values
 * (0: every byte of both pools right) and checks that every region byte is
 * written once. */
static int64_t move_request(const kvs_layout_t *l, int64_t total, int planted)
{
    int64_t bad = 0;
    const int64_t dheads = l->dst_heads;
    for (int64_t d = 0; d < l->decode_tp; d++) {
        pools_t pl = {.heads = dheads, .tokens = total};
        for (int draft = 0; draft < 2; draft++) {
            const int64_t layers = draft ? l->draft_layers : l->layers;
            const int64_t hd = draft ? l->draft_head_dim : l->head_dim;
            pl.pool[draft] = calloc((size_t)(l->planes * layers * total * dheads * hd *
                                             l->elem_bytes) + 1, 1);
            assert_non_null(pl.pool[draft]);
        }
        for (int64_t t0 = 0; t0 < total; t0 += l->grid_tokens) {
            const kvs_chunk_t ch = {.token_start = t0,
                                    .token_end = t0 + l->grid_tokens < total
                                                     ? t0 + l->grid_tokens : total};
            int64_t bytes;
            assert_int_equal(kvs_layout_region_bytes(l, d, 0, ch.token_end - ch.token_start,
                                                     &bytes), KVS_OK);
            model_t m = {.l = l, .region = calloc((size_t)bytes + 1, 1), .bytes = bytes,
                         .written = calloc((size_t)bytes + 1, 1), .planted = planted};
            assert_non_null(m.region);
            assert_non_null(m.written);
            for (int64_t c = 0; c < l->prefill_cp; c++) {
                kvs_cp_part_t part;
                const int rc = kvs_layout_cp_part(l, d, 0, total, &ch, c, &part);
                if (rc == KVS_ENOENT)
                    continue;
                assert_int_equal(rc, KVS_OK);
                const int64_t n = part.token_end - part.token_start;
                for (int64_t i = 0; i < l->tp_writers; i++) {
                    kvs_writer_t w;
                    assert_int_equal(kvs_layout_writer(l, d, 0, i, n, &w), KVS_OK);
                    gather(&m, part.offset_bytes, &w, part.token_start, n);
                }
            }
            for (int64_t b = 0; b < bytes && !planted; b++)
                if (m.written[b] != 1)
                    fail_msg("decode rank %lld, chunk at %lld: region byte %lld written %d "
                             "times", (long long)d, (long long)t0, (long long)b,
                             m.written[b]);
            for (int64_t c = 0; c < l->prefill_cp; c++) {
                kvs_cp_part_t part;
                if (kvs_layout_cp_part(l, d, 0, total, &ch, c, &part) != KVS_OK)
                    continue;
                scatter(&m, part.offset_bytes, d, part.token_start,
                        part.token_end - part.token_start, &pl);
            }
            free(m.region);
            free(m.written);
        }
        for (int draft = 0; draft < 2; draft++) {
            const int64_t layers = draft ? l->draft_layers : l->layers;
            const int64_t hb = (draft ? l->draft_head_dim : l->head_dim) * l->elem_bytes;
            for (int64_t p = 0; p < l->planes; p++)
                for (int64_t layer = 0; layer < layers; layer++)
                    for (int64_t t = 0; t < total; t++)
                        for (int64_t j = 0; j < dheads; j++) {
                            const int64_t h = global_head(l, l->decode_tp, d, j);
                            const uint8_t *got =
                                pl.pool[draft] + pool_at(l, &pl, draft, p, layer, t, j);
                            for (int64_t b = 0; b < hb; b++)
                                bad += got[b] != value(draft, layer, p, h, t, b);
                        }
            free(pl.pool[draft]);
        }
    }
    return bad;
}

static void test_draft_byte_model_moves_every_byte(void **state)
{
    (void)state;
    static const struct {
        int64_t heads, p, d, cp, dhd, dlayers;
        kvs_kv_kind_t kind;
    } cases[] = {
        {4, 4, 2, 1, 0, 1, KVS_KV_GQA},   /* P > D, EAGLE-like */
        {4, 1, 2, 1, 8, 3, KVS_KV_GQA},   /* P < D, a draft head dim of its own */
        {4, 2, 2, 1, 0, 2, KVS_KV_GQA},   /* P = D (planned; the direct path) */
        {2, 4, 2, 1, 16, 1, KVS_KV_GQA},  /* heads replicated on the prefill */
        {2, 2, 4, 1, 0, 1, KVS_KV_GQA},   /* heads replicated on the decode */
        {1, 4, 2, 1, 12, 1, KVS_KV_MLA},  /* MLA + an MTP layer */
        {4, 2, 1, 2, 0, 1, KVS_KV_GQA},   /* prefill CP 2 */
        {4, 1, 2, 3, 8, 2, KVS_KV_GQA},   /* prefill CP 3, P < D */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const kvs_layout_params_t p = {
            .total_heads = cases[k].kind == KVS_KV_MLA ? 0 : cases[k].heads,
            .head_dim = cases[k].kind == KVS_KV_MLA ? 20 : 8, .dtype = KVS_DTYPE_BF16,
            .layers = 3, .page_size = 4, .prefill_tp = cases[k].p, .decode_tp = cases[k].d,
            .chunk_tokens = 8, .kind = cases[k].kind, .prefill_cp = cases[k].cp,
            .draft_layers = cases[k].dlayers, .draft_head_dim = cases[k].dhd};
        const kvs_layout_t l = init_ok(&p);
        for (int64_t total = 1; total <= 21; total += 5) {
            const int64_t bad = move_request(&l, total, 0);
            if (bad != 0)
                fail_msg("case %zu, %lld tokens: %lld bytes wrong", k, (long long)total,
                         (long long)bad);
        }
        /* The planted bug: the draft part gathered at its block's start
         * (over the model's first slots) is caught. */
        assert_true(move_request(&l, 13, 1) > 0);
    }
}

/* Every refusal names its field; a layout stays untouched. */
/* The writes a prefill rank makes (kvs__writer_spans, and per CP part
 * kvs__part_spans) carry each writer's whole block, its draft part with
 * it: one span of len_bytes at the writer's offset. (A span of the
 * model's slots alone would leave each block's draft part unsent.) */
static void test_draft_writes_carry_the_draft_part(void **state)
{
    (void)state;
    kvs_layout_params_t mla = {.total_heads = 1, .head_dim = 576, .layers = 61,
                               .page_size = 64, .prefill_tp = 4, .decode_tp = 2,
                               .chunk_tokens = 256, .kind = KVS_KV_MLA, .draft_layers = 1};
    kvs_layout_params_t cp = llama(2, 4, 2);
    cp.draft_head_dim = 64;
    cp.prefill_cp = 2;
    const kvs_layout_params_t shapes[] = {llama(4, 2, 1), llama(2, 4, 3), mla, cp};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const kvs_layout_t l = init_ok(&shapes[i]);
        const int64_t total = 3 * l.grid_tokens + 5;
        for (int64_t d = 0; d < l.decode_tp; d++)
            for (int64_t j = 0; j < l.tp_writers; j++)
                for (int64_t n = 1; n <= l.grid_tokens; n += l.grid_tokens - 1) {
                    kvs_writer_t w;
                    kvs__span_t span[2];
                    int ns = 0;
                    assert_int_equal(kvs_layout_writer(&l, d, 0, j, n, &w), KVS_OK);
                    assert_int_equal(kvs__writer_spans(&l, d, 0, j, 0, n, span, &ns), KVS_OK);
                    assert_int_equal(ns, 1);
                    assert_int_equal(span[0].remote_off, w.offset_bytes);
                    assert_int_equal(span[0].len_bytes, w.len_bytes);
                    assert_true(w.len_bytes >
                                kvs_layout_draft_part_bytes(&l, n, w.heads.num_heads));
                    const kvs_chunk_t ch = {.index = 1, .token_start = l.grid_tokens,
                                            .token_end = 2 * l.grid_tokens};
                    for (int64_t c = 0; c < l.prefill_cp; c++) {
                        kvs_cp_part_t part;
                        if (kvs_layout_cp_part(&l, d, 0, total, &ch, c, &part) != KVS_OK)
                            continue;
                        kvs_writer_t pw;
                        assert_int_equal(kvs_layout_writer(&l, d, 0, j,
                                                           part.token_end - part.token_start,
                                                           &pw), KVS_OK);
                        assert_int_equal(kvs__part_spans(&l, d, 0, j, 0, total, &part, span,
                                                         &ns), KVS_OK);
                        assert_int_equal(ns, 1);
                        assert_int_equal(span[0].remote_off,
                                         part.offset_bytes + pw.offset_bytes);
                        assert_int_equal(span[0].len_bytes, pw.len_bytes);
                    }
                }
    }
}

static void test_draft_refusals(void **state)
{
    (void)state;
    static const struct {
        int64_t draft_layers, draft_head_dim, draft_kv_heads, pp;
        kvs_kv_scales_t scales;
        int status;
        const char *needle;
    } cases[] = {
        {-1, 0, 0, 1, KVS_KV_SCALES_NONE, KVS_EINVAL, "must be >= 0"},
        {0, 64, 0, 1, KVS_KV_SCALES_NONE, KVS_EINVAL, "but draft_layers is 0"},
        {0, 0, 8, 1, KVS_KV_SCALES_NONE, KVS_EINVAL, "--draft-layers N"},
        {KVS_MAX_LAYERS + 1, 0, 0, 1, KVS_KV_SCALES_NONE, KVS_ERANGE, "KVS_MAX_LAYERS"},
        {1, 0, 4, 1, KVS_KV_SCALES_NONE, KVS_ENOTSUP, "give 8 or 0 (--draft-kv-heads)"},
        {1, 0, 0, 1, KVS_KV_SCALES_PER_TOKEN, KVS_ENOTSUP, "kv_scales per-token"},
        {1, 0, 0, 2, KVS_KV_SCALES_PER_TOKEN, KVS_ENOTSUP, "kv_scales per-token"},
        {1, INT64_MAX / 4, 0, 1, KVS_KV_SCALES_NONE, KVS_ERANGE, "overflows 64 bits"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        kvs_layout_params_t p = llama(4, 2, cases[k].draft_layers);
        p.draft_head_dim = cases[k].draft_head_dim;
        p.draft_kv_heads = cases[k].draft_kv_heads;
        p.prefill_pp = p.decode_pp = cases[k].pp;
        p.kv_scales = cases[k].scales;
        if (cases[k].scales != KVS_KV_SCALES_NONE)
            p.dtype = KVS_DTYPE_FP8;
        kvs_layout_t l;
        memset(&l, 0xab, sizeof l);
        const kvs_layout_t before = l;
        kvs_error_t err = {0};
        const int rc = kvs_layout_init(&l, &p, &err);
        if (rc != cases[k].status || strstr(err.msg, cases[k].needle) == NULL)
            fail_msg("case %zu: %s '%s', want %s naming '%s'", k, kvs_status_name(rc), err.msg,
                     kvs_status_name(cases[k].status), cases[k].needle);
        assert_memory_equal(&l, &before, sizeof l);
    }
}

/* ---- pipeline parallelism ------------------------------------------------ */

/* With PP the draft is the last stage's on both sides: Llama 3.1 8B +
 * EAGLE, P4 -> D2, 16 tokens (2 heads a writer: a layer slot of 8192 B, a
 * draft part of 16384 B), 16 layers a stage. Dp = Pp = 2: stage 0's regions are
 * those without a draft, byte for byte; stage 1's blocks end with the
 * draft part. Dp = 1: the block is [K 32 | V 32 | draft]; stage 0 writes
 * its K and V layers where it did without a draft (from the block's
 * start), stage 1 its own and, in its V span, the draft part. */
static void test_draft_pp_blocks_by_hand(void **state)
{
    (void)state;
    const int64_t slot = 16 * 2 * 128 * 2, draft = 16384; /* a layer slot, the part */
    kvs_layout_params_t p = llama(4, 2, 1), none = llama(4, 2, 0);
    p.prefill_pp = p.decode_pp = none.prefill_pp = none.decode_pp = 2;
    kvs_layout_t l = init_ok(&p), l0 = init_ok(&none);
    assert_int_equal(kvs_layout_draft_stage(&l, KVS_ROLE_PREFILL), 1);
    assert_int_equal(kvs_layout_draft_stage(&l, KVS_ROLE_DECODE), 1);
    assert_int_equal(kvs_layout_draft_stage(&l0, KVS_ROLE_DECODE), -1);
    assert_int_equal(kvs_layout_draft_stage(NULL, KVS_ROLE_DECODE), -1);
    kvs_writer_t w, w0;
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 1, 16, &w), KVS_OK);
    assert_int_equal(kvs_layout_writer(&l0, 1, 0, 1, 16, &w0), KVS_OK);
    assert_memory_equal(&w, &w0, sizeof w);
    assert_int_equal(w.len_bytes, 16 * 2 * slot);
    assert_int_equal(kvs_layout_writer(&l, 1, 1, 1, 16, &w), KVS_OK);
    assert_int_equal(w.len_bytes, 16 * 2 * slot + draft);
    assert_int_equal(w.offset_bytes, 16 * 2 * slot + draft);
    kvs__span_t sp[2], sp0[2];
    int n = 0, n0 = 0;
    assert_int_equal(kvs__writer_spans(&l, 1, 0, 1, 0, 16, sp, &n), KVS_OK);
    assert_int_equal(kvs__writer_spans(&l0, 1, 0, 1, 0, 16, sp0, &n0), KVS_OK);
    assert_int_equal(n, 1);
    assert_memory_equal(sp, sp0, sizeof sp[0]);
    assert_int_equal(kvs__writer_spans(&l, 1, 1, 1, 1, 16, sp, &n), KVS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(sp[0].len_bytes, 16 * 2 * slot + draft);
    /* a full chunk (64 tokens) of the last stage, draft part included */
    assert_int_equal(kvs_layout_max_region_bytes(&l), 2 * (4 * 16 * 2 * slot + 4 * draft));

    p.decode_pp = none.decode_pp = 1;
    l = init_ok(&p);
    l0 = init_ok(&none);
    assert_int_equal(kvs_layout_draft_stage(&l, KVS_ROLE_DECODE), 0);
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 1, 16, &w), KVS_OK);
    assert_int_equal(w.len_bytes, 32 * 2 * slot + draft);
    assert_int_equal(w.offset_bytes, w.len_bytes);
    /* stage 0: K layers 0..15 at the block's start, V at slot 32 */
    assert_int_equal(kvs__writer_spans(&l, 1, 0, 1, 0, 16, sp, &n), KVS_OK);
    assert_int_equal(kvs__writer_spans(&l0, 1, 0, 1, 0, 16, sp0, &n0), KVS_OK);
    assert_int_equal(n, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sp[i].local_off, sp0[i].local_off);
        assert_int_equal(sp[i].len_bytes, sp0[i].len_bytes);
        assert_int_equal(sp[i].remote_off - (uint64_t)w.offset_bytes,
                         sp0[i].remote_off - (uint64_t)(32 * 2 * slot));
    }
    assert_int_equal(sp[1].remote_off, w.offset_bytes + 32 * slot);
    /* stage 1: K layers 16..31 at slot 16, V at slot 48 and the draft on */
    assert_int_equal(kvs__writer_spans(&l, 1, 0, 1, 1, 16, sp, &n), KVS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(sp[0].remote_off, w.offset_bytes + 16 * slot);
    assert_int_equal(sp[0].len_bytes, 16 * slot);
    assert_int_equal(sp[1].local_off, 16 * slot);
    assert_int_equal(sp[1].remote_off, w.offset_bytes + 48 * slot);
    assert_int_equal(sp[1].len_bytes, 16 * slot + draft);
    assert_int_equal(sp[1].remote_off + sp[1].len_bytes, w.offset_bytes + w.len_bytes);
}

/* The byte model with PP: each prefill stage gathers a staging block of its
 * own layers, [K | V] of its layers, then (the last stage alone) the draft
 * part, laid out by the doc apart from the planner; its writes are the
 * planner's spans (kvs__part_spans); each decode stage scatters its
 * region by the doc's formula (writer i at i blocks, a block [K Lx | V Lx]
 * and, on the last stage, the draft part). Every region byte must be
 * written once and every pool byte right. planted: the draft part gathered
 * by stage 0 instead of the last. */
typedef struct {
    uint8_t *pool[2]; /* [plane][stage layer][token][local head][hd s], draft too */
    int64_t heads, tokens, first, layers;
} stage_pools_t;

static int64_t stage_pool_at(const kvs_layout_t *l, const stage_pools_t *pl, int draft,
                             int64_t p, int64_t layer, int64_t t, int64_t j)
{
    const int64_t layers = draft ? l->draft_layers : pl->layers;
    const int64_t hb = (draft ? l->draft_head_dim : l->head_dim) * l->elem_bytes;
    return (((p * layers + layer) * pl->tokens + t) * pl->heads + j) * hb;
}

static int64_t move_request_pp(const kvs_layout_t *l, int64_t total, int planted)
{
    int64_t bad = 0;
    const int64_t s = l->elem_bytes, dheads = l->dst_heads;
    const int64_t draft_stage = planted ? 0 : l->prefill_pp - 1;
    for (int64_t d = 0; d < l->decode_tp; d++)
        for (int64_t e = 0; e < l->decode_pp; e++) {
            stage_pools_t pl = {.heads = dheads, .tokens = total};
            assert_int_equal(kvs_layout_stage_layers(l, KVS_ROLE_DECODE, e, &pl.first,
                                                     &pl.layers), KVS_OK);
            const bool last = e == l->decode_pp - 1;
            for (int draft = 0; draft < 2; draft++) {
                const int64_t layers = draft ? l->draft_layers : pl.layers;
                const int64_t hd = draft ? l->draft_head_dim : l->head_dim;
                pl.pool[draft] = calloc((size_t)(l->planes * layers * total * dheads * hd * s) + 1,
                                        1);
                assert_non_null(pl.pool[draft]);
            }
            for (int64_t t0 = 0; t0 < total; t0 += l->grid_tokens) {
                const kvs_chunk_t ch = {.token_start = t0,
                                        .token_end = t0 + l->grid_tokens < total
                                                         ? t0 + l->grid_tokens : total};
                int64_t bytes;
                assert_int_equal(kvs_layout_region_bytes(l, d, e, ch.token_end - ch.token_start,
                                                         &bytes), KVS_OK);
                uint8_t *region = calloc((size_t)bytes + 1, 1), *written = calloc((size_t)bytes + 1, 1);
                assert_non_null(region);
                assert_non_null(written);
                for (int64_t c = 0; c < l->prefill_cp; c++) {
                    kvs_cp_part_t part;
                    const int rc = kvs_layout_cp_part(l, d, e, total, &ch, c, &part);
                    if (rc == KVS_ENOENT)
                        continue;
                    assert_int_equal(rc, KVS_OK);
                    const int64_t n = part.token_end - part.token_start;
                    for (int64_t ps = 0; ps < l->prefill_pp; ps++) {
                        if (l->decode_pp > 1 && ps != e)
                            continue; /* Dp = Pp: stage e writes stage e's region */
                        int64_t pfirst, plen;
                        assert_int_equal(kvs_layout_stage_layers(l, KVS_ROLE_PREFILL, ps,
                                                                 &pfirst, &plen), KVS_OK);
                        for (int64_t i = 0; i < l->tp_writers; i++) {
                            kvs_writer_t w;
                            assert_int_equal(kvs_layout_writer(l, d, e, i, n, &w), KVS_OK);
                            const int64_t nh = w.heads.num_heads;
                            /* the stage's staging block, by the doc */
                            const int64_t model = n * nh * l->head_dim * s * plen * l->planes;
                            const int64_t blen = model + (ps == draft_stage
                                                              ? kvs_layout_draft_part_bytes(l, n, nh)
                                                              : 0);
                            const int64_t cap = model + kvs_layout_draft_part_bytes(l, n, nh);
                            uint8_t *blk = calloc((size_t)cap + 1, 1);
                            assert_non_null(blk);
                            int64_t at = 0;
                            for (int draft = 0; draft < 2; draft++) {
                                if (draft && ps != draft_stage)
                                    break;
                                const int64_t layers = draft ? l->draft_layers : plen;
                                const int64_t hd = draft ? l->draft_head_dim : l->head_dim;
                                for (int64_t p = 0; p < l->planes; p++)
                                    for (int64_t layer = 0; layer < layers; layer++)
                                        for (int64_t t = 0; t < n; t++)
                                            for (int64_t j = 0; j < nh; j++) {
                                                const int64_t h = global_head(
                                                    l, l->prefill_tp, w.prefill_rank,
                                                    w.heads.src_start + j);
                                                for (int64_t b = 0; b < hd * s; b++)
                                                    blk[at++] = value(draft,
                                                                      draft ? layer : pfirst + layer,
                                                                      p, h, part.token_start + t, b);
                                            }
                            }
                            assert_int_equal(at, blen);
                            kvs__span_t span[2];
                            int ns = 0;
                            assert_int_equal(kvs__part_spans(l, d, e, i, ps, total, &part, span,
                                                             &ns), KVS_OK);
                            for (int k = 0; k < ns; k++) {
                                assert_true(span[k].local_off + span[k].len_bytes <= (uint64_t)cap);
                                assert_true(span[k].remote_off + span[k].len_bytes <=
                                            (uint64_t)bytes);
                                memcpy(region + span[k].remote_off, blk + span[k].local_off,
                                       span[k].len_bytes);
                                for (uint64_t b = 0; b < span[k].len_bytes; b++)
                                    written[span[k].remote_off + b]++;
                            }
                            free(blk);
                        }
                    }
                }
                for (int64_t b = 0; b < bytes && !planted; b++)
                    if (written[b] != 1)
                        fail_msg("decode rank %lld stage %lld, chunk at %lld: region byte "
                                 "%lld written %d times", (long long)d, (long long)e,
                                 (long long)t0, (long long)b, written[b]);
                /* the decode stage's scatter, by the doc's formula */
                for (int64_t c = 0; c < l->prefill_cp; c++) {
                    kvs_cp_part_t part;
                    if (kvs_layout_cp_part(l, d, e, total, &ch, c, &part) != KVS_OK)
                        continue;
                    const int64_t n = part.token_end - part.token_start;
                    for (int64_t i = 0; i < l->tp_writers; i++) {
                        kvs_writer_t w;
                        assert_int_equal(kvs_layout_writer(l, d, e, i, n, &w), KVS_OK);
                        const int64_t nh = w.heads.num_heads;
                        const int64_t model = n * nh * l->head_dim * s * pl.layers * l->planes;
                        const int64_t blk = model + (last ? n * nh * l->draft_head_dim * s *
                                                                l->draft_layers * l->planes
                                                          : 0);
                        for (int draft = 0; draft < 2 && (draft == 0 || last); draft++) {
                            const int64_t layers = draft ? l->draft_layers : pl.layers;
                            const int64_t hd = draft ? l->draft_head_dim : l->head_dim;
                            for (int64_t p = 0; p < l->planes; p++)
                                for (int64_t layer = 0; layer < layers; layer++)
                                    for (int64_t t = 0; t < n; t++)
                                        for (int64_t j = 0; j < nh; j++) {
                                            const int64_t from =
                                                part.offset_bytes + i * blk + (draft ? model : 0) +
                                                ((p * layers + layer) * n * nh + t * nh + j) * hd * s;
                                            memcpy(pl.pool[draft] +
                                                       stage_pool_at(l, &pl, draft, p, layer,
                                                                     part.token_start + t,
                                                                     w.heads.dst_start + j),
                                                   region + from, (size_t)(hd * s));
                                        }
                        }
                    }
                }
                free(region);
                free(written);
            }
            for (int draft = 0; draft < 2; draft++) {
                const int64_t layers = draft ? l->draft_layers : pl.layers;
                const int64_t hb = (draft ? l->draft_head_dim : l->head_dim) * s;
                for (int64_t p = 0; p < l->planes && (draft == 0 || last); p++)
                    for (int64_t layer = 0; layer < layers; layer++)
                        for (int64_t t = 0; t < total; t++)
                            for (int64_t j = 0; j < dheads; j++) {
                                const int64_t h = global_head(l, l->decode_tp, d, j);
                                const uint8_t *got = pl.pool[draft] +
                                                     stage_pool_at(l, &pl, draft, p, layer, t, j);
                                for (int64_t b = 0; b < hb; b++)
                                    bad += got[b] != value(draft, draft ? layer : pl.first + layer,
                                                           p, h, t, b);
                            }
                free(pl.pool[draft]);
            }
        }
    return bad;
}

static void test_draft_pp_byte_model_moves_every_byte(void **state)
{
    (void)state;
    static const struct {
        int64_t heads, p, d, cp, pp, dpp, layers, dhd, dlayers;
        kvs_kv_kind_t kind;
    } cases[] = {
        {4, 4, 2, 1, 2, 2, 3, 0, 1, KVS_KV_GQA},  /* Pp = Dp = 2, P > D, layers 1 + 2 */
        {4, 4, 2, 1, 2, 1, 3, 0, 1, KVS_KV_GQA},  /* Pp 2 -> Dp 1, P > D */
        {4, 1, 2, 1, 2, 2, 4, 8, 3, KVS_KV_GQA},  /* Pp = Dp = 2, P < D, own head dim */
        {4, 1, 2, 1, 2, 1, 5, 8, 2, KVS_KV_GQA},  /* Pp 2 -> Dp 1, P < D */
        {4, 2, 1, 2, 2, 2, 3, 0, 1, KVS_KV_GQA},  /* Pp = Dp = 2, prefill CP 2 */
        {4, 2, 1, 2, 2, 1, 3, 16, 2, KVS_KV_GQA}, /* Pp 2 -> Dp 1, prefill CP 2 */
        {4, 2, 4, 2, 3, 1, 4, 0, 1, KVS_KV_GQA},  /* Pp 3 -> Dp 1, CP 2, P < D */
        {1, 4, 2, 1, 2, 1, 3, 12, 1, KVS_KV_MLA}, /* MLA + MTP, Pp 2 -> Dp 1 */
        {1, 4, 2, 2, 2, 2, 3, 0, 1, KVS_KV_MLA},  /* MLA + MTP, Pp = Dp = 2, CP 2 */
        {4, 2, 2, 1, 1, 1, 3, 0, 2, KVS_KV_GQA},  /* PP 1: the model agrees */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const kvs_layout_params_t p = {
            .total_heads = cases[k].kind == KVS_KV_MLA ? 0 : cases[k].heads,
            .head_dim = cases[k].kind == KVS_KV_MLA ? 20 : 8, .dtype = KVS_DTYPE_BF16,
            .layers = cases[k].layers, .page_size = 4, .prefill_tp = cases[k].p,
            .decode_tp = cases[k].d, .prefill_pp = cases[k].pp, .decode_pp = cases[k].dpp,
            .chunk_tokens = 8, .kind = cases[k].kind, .prefill_cp = cases[k].cp,
            .draft_layers = cases[k].dlayers, .draft_head_dim = cases[k].dhd};
        const kvs_layout_t l = init_ok(&p);
        for (int64_t total = 1; total <= 21; total += 5) {
            const int64_t bad = move_request_pp(&l, total, 0);
            if (bad != 0)
                fail_msg("case %zu, %lld tokens: %lld bytes wrong", k, (long long)total,
                         (long long)bad);
        }
        /* The planted bug: the draft part gathered by the first prefill
         * stage instead of the last is caught (with PP 1 they are one). */
        if (cases[k].pp > 1)
            assert_true(move_request_pp(&l, 13, 1) > 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_writer_blocks_by_hand),
        cmocka_unit_test(test_draft_byte_model_moves_every_byte),
        cmocka_unit_test(test_draft_writes_carry_the_draft_part),
        cmocka_unit_test(test_draft_refusals),
        cmocka_unit_test(test_draft_pp_blocks_by_hand),
        cmocka_unit_test(test_draft_pp_byte_model_moves_every_byte),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
