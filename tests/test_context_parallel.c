/*
 * test_context_parallel.c - prefill context parallelism in the layout
 * planner (src/context_parallel.c): the token range each CP rank holds,
 * worked by hand; the CP ranks, parts and arrivals of a chunk; and a model
 * of the staging path that checks every byte of every region: each
 * (CP rank, prefill stage, TP writer) gathers its rows from its own pages
 * into its place, the decode reads each token back where its scatter
 * would, and every byte must be written exactly once with the right
 * token's bytes. Two planted bugs (a CP rank gathering the wrong token
 * range, one placing its part by its own range instead of the chunk) must
 * be caught. The writers place their blocks with kvs__part_spans, the
 * writes the staging handlers post; the decode reads back by the layout's
 * formulas alone.
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

static kvs_layout_params_t small_gqa(int64_t p, int64_t d, int64_t cp)
{
    kvs_layout_params_t prm = {.total_heads = 8, .head_dim = 2, .dtype = KVS_DTYPE_FP8,
                               .layers = 4, .page_size = 16, .prefill_tp = p,
                               .decode_tp = d, .chunk_tokens = 64, .prefill_cp = cp};
    return prm;
}

static void test_context_parallel_ranges_by_hand(void **state)
{
    (void)state;
    kvs_layout_params_t prm = small_gqa(4, 2, 4);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.prefill_cp, 4);
    assert_int_equal(l.cp_align_tokens, 16);
    int64_t s, e;
    /* 1000 tokens over 4: 250 rounded up to pages of 16 = 256 each */
    static const int64_t want[4][2] = {{0, 256}, {256, 512}, {512, 768}, {768, 1000}};
    for (int64_t c = 0; c < 4; c++) {
        assert_int_equal(kvs_layout_cp_range(&l, 1000, c, &s, &e), KVS_OK);
        assert_int_equal(s, want[c][0]);
        assert_int_equal(e, want[c][1]);
    }
    /* a short prompt: the last ranks hold nothing */
    assert_int_equal(kvs_layout_cp_range(&l, 20, 0, &s, &e), KVS_OK);
    assert_int_equal(e - s, 16);
    assert_int_equal(kvs_layout_cp_range(&l, 20, 1, &s, &e), KVS_OK);
    assert_int_equal(s, 16);
    assert_int_equal(e, 20);
    assert_int_equal(kvs_layout_cp_range(&l, 20, 3, &s, &e), KVS_OK);
    assert_int_equal(s, 20);
    assert_int_equal(e, 20);
    assert_int_equal(kvs_layout_cp_range(&l, 0, 0, &s, &e), KVS_OK);
    assert_int_equal(e - s, 0);
    /* two page sizes: ranges start on their lcm */
    prm.decode_page_size = 64;
    prm.prefill_cp = 2;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.cp_align_tokens, 64);
    assert_int_equal(kvs_layout_cp_range(&l, 1000, 1, &s, &e), KVS_OK);
    assert_int_equal(s, 512);
    assert_int_equal(e, 1000);
    /* a request near INT64_MAX tokens: no overflow, rank 0 takes the rest */
    assert_int_equal(kvs_layout_cp_range(&l, INT64_MAX, 1, &s, &e), KVS_OK);
    assert_true(s >= 0 && s <= e && e == INT64_MAX);
    /* CP 1 (and 0, its default) is one range: the whole request */
    prm = small_gqa(4, 2, 0);
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.prefill_cp, 1);
    assert_int_equal(kvs_layout_cp_range(&l, 999, 0, &s, &e), KVS_OK);
    assert_int_equal(s, 0);
    assert_int_equal(e, 999);
}

static void test_context_parallel_rejects_bad_arguments(void **state)
{
    (void)state;
    kvs_layout_params_t prm = small_gqa(4, 2, -1);
    kvs_layout_t l;
    kvs_error_t err = {0};
    assert_int_equal(kvs_layout_init(&l, &prm, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "prefill_cp"));
    prm.prefill_cp = 2;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    int64_t s, e, first, count;
    assert_int_equal(kvs_layout_cp_range(NULL, 10, 0, &s, &e), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_range(&l, -1, 0, &s, &e), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_range(&l, 10, 0, NULL, &e), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_range(&l, 10, 0, &s, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_range(&l, 10, 2, &s, &e), KVS_ERANGE);
    assert_int_equal(kvs_layout_cp_range(&l, 10, -1, &s, &e), KVS_ERANGE);
    kvs_chunk_t ch = {.token_start = 0, .token_end = 64};
    kvs_cp_part_t part;
    assert_int_equal(kvs_layout_cp_part(&l, 0, 0, 100, &ch, 0, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_part(&l, 0, 0, 100, NULL, 0, &part), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_part(NULL, 0, 0, 100, &ch, 0, &part), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_part(&l, 0, 0, -1, &ch, 0, &part), KVS_ERANGE);
    assert_int_equal(kvs_layout_cp_part(&l, 0, 0, 100, &ch, -1, &part), KVS_ERANGE);
    ch.token_start = -1; /* a chunk starting before the request */
    assert_int_equal(kvs_layout_cp_part(&l, 0, 0, 100, &ch, 0, &part), KVS_ERANGE);
    ch.token_start = 0;
    assert_int_equal(kvs_layout_cp_part(&l, 2, 0, 100, &ch, 0, &part), KVS_ERANGE);
    assert_int_equal(kvs_layout_cp_part(&l, 0, 1, 100, &ch, 0, &part), KVS_ERANGE);
    assert_int_equal(kvs_layout_cp_part(&l, 0, 0, 100, &ch, 2, &part), KVS_ERANGE);
    assert_int_equal(kvs_layout_cp_part(&l, 0, 0, 50, &ch, 0, &part), KVS_ERANGE);
    ch.token_end = 65 + 64; /* longer than the grid */
    assert_int_equal(kvs_layout_cp_writers(&l, 1000, &ch, &first, &count), KVS_ERANGE);
    ch = (kvs_chunk_t){.token_start = 10, .token_end = 5};
    assert_int_equal(kvs_layout_cp_writers(&l, 1000, &ch, &first, &count), KVS_ERANGE);
    assert_int_equal(kvs_layout_cp_writers(&l, 1000, &ch, NULL, &count), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_writers(NULL, 1000, &ch, &first, &count), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_writers(&l, 1000, NULL, &first, &count), KVS_EINVAL);
    assert_int_equal(kvs_layout_cp_writers(&l, 1000, &ch, &first, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_chunk_arrivals(&l, 1000, &ch), 0);
    assert_int_equal(kvs_layout_chunk_arrivals(NULL, 1000, &ch), 0);
}

static void test_context_parallel_chunk_writers_and_arrivals(void **state)
{
    (void)state;
    /* P4 CP2 -> D2, prefill PP 2 into decode PP 1: W 2, 2 stages */
    kvs_layout_params_t prm = small_gqa(4, 2, 2);
    prm.prefill_pp = 2;
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.expected_arrivals, 4);
    /* 200 tokens over 2: 100 -> 112 each: [0,112) [112,200). Chunks of 64
     * from base 32: [32,96) is CP 0's, [96,160) both's, [160,200) CP 1's. */
    const kvs_chunk_t c0 = {.token_start = 32, .token_end = 96};
    const kvs_chunk_t c1 = {.token_start = 96, .token_end = 160};
    const kvs_chunk_t c2 = {.token_start = 160, .token_end = 200};
    const kvs_chunk_t empty = {.token_start = 200, .token_end = 200};
    int64_t first, count;
    assert_int_equal(kvs_layout_cp_writers(&l, 200, &c0, &first, &count), KVS_OK);
    assert_int_equal(first * 10 + count, 1);
    assert_int_equal(kvs_layout_cp_writers(&l, 200, &c1, &first, &count), KVS_OK);
    assert_int_equal(first * 10 + count, 2);
    assert_int_equal(kvs_layout_cp_writers(&l, 200, &c2, &first, &count), KVS_OK);
    assert_int_equal(first * 10 + count, 11);
    assert_int_equal(kvs_layout_cp_writers(&l, 200, &empty, &first, &count), KVS_OK);
    assert_int_equal(first * 10 + count, 1);
    assert_int_equal(kvs_layout_chunk_arrivals(&l, 200, &c0), 4);
    assert_int_equal(kvs_layout_chunk_arrivals(&l, 200, &c1), 8);
    assert_int_equal(kvs_layout_chunk_arrivals(&l, 200, &empty), 4);
    /* the parts of c1: [96,112) from CP 0 at its local row 96, [112,160)
     * from CP 1 at its row 0, 16 region-tokens in */
    int64_t per_token;
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 0, 1, &per_token), KVS_OK);
    /* W 2 x 2 heads x dim 2 x 1 byte x 4 layers x K and V */
    assert_int_equal(per_token, 2 * 2 * 2 * 1 * 4 * 2);
    kvs_cp_part_t a, b;
    assert_int_equal(kvs_layout_cp_part(&l, 1, 0, 200, &c1, 0, &a), KVS_OK);
    assert_int_equal(kvs_layout_cp_part(&l, 1, 0, 200, &c1, 1, &b), KVS_OK);
    assert_int_equal(a.token_start, 96);
    assert_int_equal(a.token_end, 112);
    assert_int_equal(a.local_token_start, 96);
    assert_int_equal(a.offset_bytes, 0);
    assert_int_equal(a.len_bytes, 16 * per_token);
    assert_int_equal(b.token_start, 112);
    assert_int_equal(b.local_token_start, 0);
    assert_int_equal(b.offset_bytes, 16 * per_token);
    assert_int_equal(b.offset_bytes + b.len_bytes, 64 * per_token);
    assert_int_equal(kvs_layout_cp_part(&l, 1, 0, 200, &c0, 1, &b), KVS_ENOENT);
    assert_int_equal(kvs_layout_cp_part(&l, 1, 0, 200, &empty, 1, &b), KVS_ENOENT);
    assert_int_equal(kvs_layout_cp_part(&l, 1, 0, 200, &empty, 0, &b), KVS_OK);
    assert_int_equal(b.len_bytes, 0);
}

/* ---- a model of the staging path, byte by byte ------------------------ */

/* PLANT_ROWS: CP rank 1 gathers its rows counted from the chunk's start,
 * not its range's; PLANT_OFFSET: it places its part counted from its
 * range's start, not the chunk's. */
typedef enum plant { PLANT_NONE, PLANT_ROWS, PLANT_OFFSET } plant_t;

/* The byte a prefill pool holds at (token, plane, layer, head, dim, byte):
 * heads by their global id, so a row from the wrong head shows too. */
static uint8_t kv_byte(int64_t token, int64_t plane, int64_t layer, int64_t head, int64_t x)
{
    uint64_t h = (uint64_t)token * 0x9E3779B97F4A7C15ull ^ (uint64_t)(plane + 1) << 48 ^
                 (uint64_t)(layer + 1) << 40 ^ (uint64_t)(head + 1) << 32 ^ (uint64_t)x;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return (uint8_t)(h >> 56);
}

/* Global id of local head h of TP rank r of tp ranks (spec §3: replicated
 * heads by integer division). */
static int64_t global_head(int64_t heads, int64_t tp, int64_t r, int64_t h)
{
    if (heads >= tp)
        return r * (heads / tp) + h;
    return r / (tp / heads);
}

typedef struct model_case {
    const char *name;
    int64_t p, d, cp, pp, dpp, heads, ps, dps, chunk, base, total;
    kvs_kv_kind_t kind;
} model_case_t;

/* Moves every chunk of one request to every decode rank and stage as the
 * staging path would, with `plant` in the writers; returns the bytes found
 * wrong (written twice or never, or with another token's bytes). */
static int64_t model_run(const model_case_t *mc, plant_t plant, int64_t *verified)
{
    kvs_layout_params_t prm = {.total_heads = mc->kind == KVS_KV_MLA ? 1 : mc->heads,
                               .head_dim = 2, .dtype = KVS_DTYPE_FP8, .layers = 5,
                               .page_size = mc->ps, .decode_page_size = mc->dps,
                               .prefill_tp = mc->p, .decode_tp = mc->d,
                               .prefill_pp = mc->pp, .decode_pp = mc->dpp,
                               .chunk_tokens = mc->chunk, .prefill_cp = mc->cp,
                               .kind = mc->kind};
    kvs_layout_t l;
    kvs_error_t err = {0};
    if (kvs_layout_init(&l, &prm, &err) != KVS_OK)
        fail_msg("%s: %s", mc->name, err.msg);
    const int64_t hd = l.head_dim, H = l.total_heads;
    int64_t bad = 0;
    const int64_t pages = (mc->total - mc->base + l.decode_page_size - 1) / l.decode_page_size;
    const int64_t nchunks = kvs_grid_num_chunks(&l, pages);
    for (int64_t d = 0; d < l.decode_tp; d++) {
        for (int64_t e = 0; e < l.decode_pp; e++) {
            int64_t dfirst, dcount;
            assert_int_equal(kvs_layout_stage_layers(&l, KVS_ROLE_DECODE, e, &dfirst, &dcount),
                             KVS_OK);
            for (int64_t i = 0; i < nchunks; i++) {
                kvs_chunk_t ch;
                assert_int_equal(kvs_grid_chunk(&l, mc->base, mc->total, i, &ch), KVS_OK);
                const int64_t T = ch.token_end - ch.token_start;
                int64_t rbytes;
                assert_int_equal(kvs_layout_region_bytes(&l, d, e, T, &rbytes), KVS_OK);
                uint8_t *region = calloc((size_t)rbytes + 1, 1);
                uint8_t *writes = calloc((size_t)rbytes + 1, 1);
                assert_non_null(region);
                assert_non_null(writes);
                int64_t arrivals = 0;
                /* the writers: every CP rank, prefill stage and TP writer */
                for (int64_t c = 0; c < l.prefill_cp; c++) {
                    kvs_cp_part_t part;
                    int rc = kvs_layout_cp_part(&l, d, e, mc->total, &ch, c, &part);
                    if (rc == KVS_ENOENT)
                        continue;
                    assert_int_equal(rc, KVS_OK);
                    int64_t cs, ce;
                    assert_int_equal(kvs_layout_cp_range(&l, mc->total, c, &cs, &ce), KVS_OK);
                    /* the rows it gathers from its own pages, and where */
                    int64_t local = part.local_token_start;
                    int64_t at = part.offset_bytes;
                    if (plant == PLANT_ROWS && c == 1)
                        local = part.token_start - ch.token_start; /* chunk-relative */
                    const int64_t n = part.token_end - part.token_start;
                    if (plant == PLANT_OFFSET && c == 1 && n > 0) /* counted from its */
                        at = (part.token_start - cs) * (part.len_bytes / n); /* range */
                    for (int64_t s = 0; s < l.prefill_pp; s++) {
                        int64_t first, count;
                        assert_int_equal(
                            kvs_layout_stage_layers(&l, KVS_ROLE_PREFILL, s, &first, &count),
                            KVS_OK);
                        if (first < dfirst || first + count > dfirst + dcount)
                            continue; /* not this decode stage's layers */
                        for (int64_t j = 0; j < l.tp_writers; j++) {
                            kvs_writer_t w;
                            assert_int_equal(kvs_layout_writer(&l, d, e, j, n, &w), KVS_OK);
                            /* where the handlers' writes put its block */
                            kvs__span_t span[2];
                            int ns = 0;
                            assert_int_equal(kvs__part_spans(&l, d, e, j, s, mc->total, &part,
                                                             span, &ns),
                                             KVS_OK);
                            arrivals++;
                            const int64_t nh = w.heads.num_heads;
                            for (int64_t pl = 0; pl < l.planes; pl++)
                                for (int64_t ly = first; ly < first + count; ly++)
                                    for (int64_t k = 0; k < n; k++)
                                        for (int64_t h = 0; h < nh; h++)
                                            for (int64_t x = 0; x < hd; x++) {
                                                /* its byte in its staging block:
                                                 * planes, its layers, token-major */
                                                const uint64_t loc = (uint64_t)(
                                                    (((pl * count + ly - first) * n + k) * nh +
                                                     h) * hd + x);
                                                int64_t o = -1;
                                                for (int q = 0; q < ns; q++)
                                                    if (loc >= span[q].local_off &&
                                                        loc - span[q].local_off <
                                                            span[q].len_bytes)
                                                        o = (int64_t)(span[q].remote_off + loc -
                                                                      span[q].local_off) +
                                                            (at - part.offset_bytes);
                                                if (o < 0 || o >= rbytes) {
                                                    bad++;
                                                    continue;
                                                }
                                                /* its pool: token cs + local row */
                                                const int64_t g = global_head(
                                                    H, l.prefill_tp, w.prefill_rank,
                                                    w.heads.src_start + h);
                                                region[o] = kv_byte(cs + local + k, pl, ly, g, x);
                                                writes[o]++;
                                            }
                        }
                    }
                }
                if (arrivals != kvs_layout_chunk_arrivals(&l, mc->total, &ch))
                    fail_msg("%s: chunk %lld of decode %lld: %lld writes, %lld expected",
                             mc->name, (long long)i, (long long)d, (long long)arrivals,
                             (long long)kvs_layout_chunk_arrivals(&l, mc->total, &ch));
                /* the decode: each CP part of the chunk, read back as the
                 * scatter reads it, into its own heads */
                int64_t first_cp, ncp;
                assert_int_equal(kvs_layout_cp_writers(&l, mc->total, &ch, &first_cp, &ncp),
                                 KVS_OK);
                for (int64_t c = first_cp; c < first_cp + ncp; c++) {
                    kvs_cp_part_t part;
                    assert_int_equal(kvs_layout_cp_part(&l, d, e, mc->total, &ch, c, &part),
                                     KVS_OK);
                    const int64_t n = part.token_end - part.token_start;
                    for (int64_t j = 0; j < l.tp_writers; j++) {
                        kvs_writer_t w;
                        assert_int_equal(kvs_layout_writer(&l, d, e, j, n, &w), KVS_OK);
                        const int64_t nh = w.heads.num_heads;
                        for (int64_t pl = 0; pl < l.planes; pl++)
                            for (int64_t ly = dfirst; ly < dfirst + dcount; ly++)
                                for (int64_t k = 0; k < n; k++)
                                    for (int64_t h = 0; h < nh; h++)
                                        for (int64_t x = 0; x < hd; x++) {
                                            const int64_t o =
                                                part.offset_bytes + w.offset_bytes +
                                                (((pl * dcount + ly - dfirst) * n + k) * nh + h) *
                                                    hd + x;
                                            const int64_t g = global_head(
                                                H, l.decode_tp, d, w.heads.dst_start + h);
                                            const uint8_t want =
                                                kv_byte(part.token_start + k, pl, ly, g, x);
                                            (*verified)++;
                                            if (region[o] != want)
                                                bad++;
                                        }
                    }
                }
                for (int64_t o = 0; o < rbytes; o++)
                    bad += writes[o] != 1;
                free(region);
                free(writes);
            }
        }
    }
    return bad;
}

static const model_case_t model_cases[] = {
    /* name            p  d cp pp dpp H  ps dps chunk base total */
    {"P4 CP2 -> D2", 4, 2, 2, 1, 1, 8, 16, 0, 64, 0, 1000, KVS_KV_GQA},
    {"P2 CP4 -> D4", 2, 4, 4, 1, 1, 8, 16, 0, 64, 0, 777, KVS_KV_GQA},
    {"P2 CP3 -> D2 direct", 2, 2, 3, 1, 1, 8, 16, 0, 48, 0, 500, KVS_KV_GQA},
    {"P4 CP2 PP2 -> D2", 4, 2, 2, 2, 1, 8, 16, 0, 64, 32, 901, KVS_KV_GQA},
    {"P2 CP2 PP2 -> D2 PP2", 2, 2, 2, 2, 2, 8, 16, 0, 64, 0, 333, KVS_KV_GQA},
    {"P8 CP2 -> D2 replicated", 8, 2, 2, 1, 1, 4, 16, 0, 64, 48, 700, KVS_KV_GQA},
    {"P4 CP3 -> D2 cached prefix", 4, 2, 3, 1, 1, 8, 16, 0, 128, 400, 1300, KVS_KV_GQA},
    {"P4 CP2 16 -> 64 pages", 4, 2, 2, 1, 1, 8, 16, 64, 128, 64, 1111, KVS_KV_GQA},
    {"P4 CP4 short prompt", 4, 2, 4, 1, 1, 8, 16, 0, 64, 0, 20, KVS_KV_GQA},
    {"MLA P4 CP2 -> D2", 4, 2, 2, 1, 1, 1, 16, 0, 64, 0, 1000, KVS_KV_MLA},
    {"MLA P2 CP2 PP2 -> D4", 2, 4, 2, 2, 1, 1, 16, 0, 64, 16, 515, KVS_KV_MLA},
};

static void test_context_parallel_model_every_byte(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof model_cases / sizeof model_cases[0]; i++) {
        int64_t verified = 0;
        const int64_t bad = model_run(&model_cases[i], PLANT_NONE, &verified);
        if (bad != 0 || verified == 0)
            fail_msg("%s: %lld bytes wrong of %lld", model_cases[i].name, (long long)bad,
                     (long long)verified);
    }
}

static void test_context_parallel_model_catches_wrong_rows_and_offset(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof model_cases / sizeof model_cases[0]; i++) {
        const model_case_t *mc = &model_cases[i];
        assert_true(mc->cp >= 2); /* every case has a CP rank 1 with rows */
        for (plant_t plant = PLANT_ROWS; plant <= PLANT_OFFSET; plant++) {
            int64_t verified = 0;
            if (model_run(mc, plant, &verified) == 0)
                fail_msg("%s: plant %d not caught", mc->name, (int)plant);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context_parallel_ranges_by_hand),
        cmocka_unit_test(test_context_parallel_rejects_bad_arguments),
        cmocka_unit_test(test_context_parallel_chunk_writers_and_arrivals),
        cmocka_unit_test(test_context_parallel_model_every_byte),
        cmocka_unit_test(test_context_parallel_model_catches_wrong_rows_and_offset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
