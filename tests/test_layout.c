/*
 * test_layout.c - the layout planner against hand-worked cases of spec §3-§4:
 * head slices for P > D, P < D, replicated heads both ways and P == D; rank
 * mapping; region layout; PP arrivals; every validation error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <kvstage/kvstage.h>

typedef struct slice_case {
    int64_t h, p, d, src, dst;
    int64_t src_start, nh, dst_start;
} slice_case_t;

/* Expected values worked by hand from spec §3 (comments give the ranks'
 * real heads so each row can be checked without the formula). */
static const slice_case_t slice_cases[] = {
    /* H8 P8 D2: prefill r holds head r; decode 1 holds heads 4..7 */
    {8, 8, 2, 5, 1, 0, 1, 1},
    {8, 8, 2, 0, 0, 0, 1, 0},
    {8, 8, 2, 3, 0, 0, 1, 3},
    /* H8 P4 D2: prefill 1 holds heads 2,3 -> decode 0 local 2,3 */
    {8, 4, 2, 1, 0, 0, 2, 2},
    {8, 4, 2, 2, 1, 0, 2, 0},
    /* H2 P8 D2 (replicated on prefill): prefill 5 holds head 1 = decode 1 local 0 */
    {2, 8, 2, 5, 1, 0, 1, 0},
    /* H4 P8 D2: prefill 2k,2k+1 hold head k; decode 1 holds heads 2,3 */
    {4, 8, 2, 5, 1, 0, 1, 0},
    {4, 8, 2, 7, 1, 0, 1, 1},
    {4, 8, 2, 2, 0, 0, 1, 1},
    /* H8 P2 D4: decode 1 holds heads 2,3 = prefill 0 local 2,3 */
    {8, 2, 4, 0, 1, 2, 2, 0},
    {8, 2, 4, 1, 3, 2, 2, 0},
    {8, 2, 4, 1, 2, 0, 2, 0},
    /* H2 P2 D8 (replicated on decode): every rank one head, local 0 */
    {2, 2, 8, 0, 3, 0, 1, 0},
    /* H4 P2 D8: decode 2k,2k+1 hold head k; prefill 0 holds 0,1, prefill 1 holds 2,3.
     * Integer division, not modulo: decode 1 shares head 0 with decode 0. */
    {4, 2, 8, 0, 1, 0, 1, 0},
    {4, 2, 8, 0, 2, 1, 1, 0},
    {4, 2, 8, 1, 5, 0, 1, 0},
    {4, 2, 8, 1, 7, 1, 1, 0},
    /* H8 P1 D8: decode 5 holds head 5 = prefill 0 local 5 */
    {8, 1, 8, 0, 5, 5, 1, 0},
    /* H16 P16 D1: prefill 9 holds head 9 = decode local 9 */
    {16, 16, 1, 9, 0, 0, 1, 9},
    /* H1 P1 D4: a single head everywhere */
    {1, 1, 4, 0, 3, 0, 1, 0},
    /* H8 P4 D4 (equal TP): rank to rank, all local heads */
    {8, 4, 4, 3, 3, 0, 2, 0},
    /* ranks are taken modulo their TP */
    {8, 8, 2, 13, 3, 0, 1, 1},
};

static void test_layout_head_slices_table(void **state)
{
    for (size_t i = 0; i < sizeof slice_cases / sizeof slice_cases[0]; i++) {
        const slice_case_t *c = &slice_cases[i];
        kvs_head_slice_t s;
        assert_int_equal(kvs_head_slice(c->h, c->p, c->d, c->src, c->dst, &s), KVS_OK);
        if (s.src_start != c->src_start || s.num_heads != c->nh || s.dst_start != c->dst_start)
            fail_msg("case %zu (H%lld P%lld D%lld src %lld dst %lld): got (%lld,%lld,%lld)", i,
                     (long long)c->h, (long long)c->p, (long long)c->d, (long long)c->src,
                     (long long)c->dst, (long long)s.src_start, (long long)s.num_heads,
                     (long long)s.dst_start);
    }
}

static void test_layout_head_slice_rejects_bad_sizes(void **state)
{
    kvs_head_slice_t s;
    assert_int_equal(kvs_head_slice(0, 2, 2, 0, 0, &s), KVS_EINVAL);
    assert_int_equal(kvs_head_slice(8, 0, 2, 0, 0, &s), KVS_EINVAL);
    assert_int_equal(kvs_head_slice(8, 2, 0, 0, 0, &s), KVS_EINVAL);
    assert_int_equal(kvs_head_slice(8, 2, 2, -1, 0, &s), KVS_EINVAL);
    assert_int_equal(kvs_head_slice(8, 2, 2, 0, 0, NULL), KVS_EINVAL);
}

static kvs_layout_params_t llama70b(int64_t p, int64_t d)
{
    kvs_layout_params_t prm = {.total_heads = 8, .head_dim = 128, .dtype = KVS_DTYPE_BF16,
                               .layers = 80, .page_size = 16, .prefill_tp = p,
                               .decode_tp = d};
    return prm;
}

static void test_layout_llama70b_p8_d2(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.grid_tokens, 8192);
    assert_int_equal(l.chunk_pages, 512);
    assert_int_equal(l.tp_writers, 4);
    assert_int_equal(l.expected_arrivals, 4);
    assert_int_equal(l.path, KVS_PATH_STAGING);
    /* writer bytes: 8192 tokens * 1 head * 128 * 2 B * 80 layers * 2 = 320 MiB */
    kvs_writer_t w;
    assert_int_equal(kvs_layout_writer(&l, 1, 2, 8192, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 6);
    assert_int_equal(w.heads.dst_start, 2);
    assert_int_equal(w.len_bytes, 320ll << 20);
    assert_int_equal(w.offset_bytes, 640ll << 20);
    int64_t region;
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 8192, &region), KVS_OK);
    assert_int_equal(region, 1280ll << 20);
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 100, &region), KVS_OK);
    assert_int_equal(region, 4ll * 100 * 128 * 2 * 80 * 2);
    assert_int_equal(kvs_layout_layer_block_bytes(&l, 100, 1), 100 * 128 * 2);
}

static void test_layout_spec_chunk_size_decode_tp1(void **state)
{
    /* spec §11: Llama-3-70B, decode TP1, 8192 tokens = 2.5 GiB */
    kvs_layout_params_t prm = llama70b(8, 1);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(kvs_layout_max_region_bytes(&l), 2560ll << 20);
}

static void test_layout_rank_mapping_p_gt_d(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.targets_per_prefill, 1);
    int64_t d, idx;
    assert_int_equal(kvs_layout_target(&l, 5, 0, &d), KVS_OK);
    assert_int_equal(d, 1);
    assert_int_equal(kvs_layout_target(&l, 5, 1, &d), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer_index(&l, 5, 1, &idx), KVS_OK);
    assert_int_equal(idx, 1);
    assert_int_equal(kvs_layout_writer_index(&l, 5, 0, &idx), KVS_ENOENT);
    assert_int_equal(kvs_layout_writer_index(&l, 8, 0, &idx), KVS_ERANGE);
    /* every writer of every decode rank maps back to its index */
    for (int64_t dr = 0; dr < 2; dr++)
        for (int64_t i = 0; i < l.tp_writers; i++) {
            kvs_writer_t w;
            assert_int_equal(kvs_layout_writer(&l, dr, i, 16, &w), KVS_OK);
            assert_int_equal(kvs_layout_writer_index(&l, w.prefill_rank, dr, &idx), KVS_OK);
            assert_int_equal(idx, i);
            assert_int_equal(kvs_layout_target(&l, w.prefill_rank, 0, &d), KVS_OK);
            assert_int_equal(d, dr);
        }
}

static void test_layout_rank_mapping_p_lt_d(void **state)
{
    kvs_layout_params_t prm = llama70b(2, 8);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.tp_writers, 1);
    assert_int_equal(l.targets_per_prefill, 4);
    int64_t d, idx;
    for (int64_t i = 0; i < 4; i++) {
        assert_int_equal(kvs_layout_target(&l, 1, i, &d), KVS_OK);
        assert_int_equal(d, 4 + i);
    }
    assert_int_equal(kvs_layout_writer_index(&l, 1, 5, &idx), KVS_OK);
    assert_int_equal(idx, 0);
    assert_int_equal(kvs_layout_writer_index(&l, 0, 5, &idx), KVS_ENOENT);
    kvs_writer_t w;
    assert_int_equal(kvs_layout_writer(&l, 5, 0, 8192, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 1);
    assert_int_equal(w.heads.src_start, 1);
    assert_int_equal(w.heads.num_heads, 1);
    assert_int_equal(kvs_layout_writer(&l, 5, 1, 8192, &w), KVS_ERANGE);
}

static void test_layout_equal_tp_is_direct(void **state)
{
    kvs_layout_params_t prm = llama70b(4, 4);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.path, KVS_PATH_DIRECT);
    assert_string_equal(kvs_path_name(l.path), "direct");
    int64_t idx;
    assert_int_equal(kvs_layout_writer_index(&l, 3, 3, &idx), KVS_OK);
    assert_int_equal(kvs_layout_writer_index(&l, 2, 3, &idx), KVS_ENOENT);
}

static void test_layout_pp_arrivals_and_layers(void **state)
{
    kvs_layout_params_t prm = llama70b(4, 2);
    prm.prefill_pp = 2;
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.decode_layers, 80);
    assert_int_equal(l.prefill_layers, 40);
    assert_int_equal(l.expected_arrivals, 4);
    prm.decode_pp = 2;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.decode_layers, 40);
    assert_int_equal(l.expected_arrivals, 2);
    kvs_writer_t w;
    assert_int_equal(kvs_layout_writer(&l, 0, 1, 10, &w), KVS_OK);
    assert_int_equal(w.len_bytes, 10ll * 2 * 128 * 2 * 40 * 2); /* nh = H/P = 2 */
}

static void test_layout_heads_resolution(void **state)
{
    int64_t h;
    assert_int_equal(kvs_heads_resolve(8, 3, 4, &h), KVS_OK);
    assert_int_equal(h, 8);
    assert_int_equal(kvs_heads_resolve(0, 2, 4, &h), KVS_OK);
    assert_int_equal(h, 8);
    assert_int_equal(kvs_heads_resolve(0, 0, 4, &h), KVS_EHEADS);
    assert_int_equal(kvs_heads_resolve(0, 2, 0, &h), KVS_EHEADS);
    assert_int_equal(kvs_heads_resolve(8, 0, 0, NULL), KVS_EINVAL);
    kvs_layout_params_t prm = llama70b(4, 2);
    prm.total_heads = 0;
    prm.heads_per_rank = 2; /* per prefill rank by default */
    kvs_layout_t l;
    kvs_error_t e = {0};
    assert_int_equal(kvs_layout_init(&l, &prm, &e), KVS_OK);
    assert_int_equal(l.total_heads, 8);
    prm.heads_per_rank_tp = 2; /* given per decode rank instead */
    prm.heads_per_rank = 4;
    assert_int_equal(kvs_layout_init(&l, &prm, &e), KVS_OK);
    assert_int_equal(l.total_heads, 8);
    prm.heads_per_rank = 0;
    assert_int_equal(kvs_layout_init(&l, &prm, &e), KVS_EHEADS);
    assert_non_null(strstr(e.msg, "total_heads"));
}

typedef struct bad_case {
    const char *what;
    kvs_layout_params_t p;
    int status;
} bad_case_t;

static void test_layout_rejects_invalid_params(void **state)
{
    const kvs_layout_params_t ok = llama70b(8, 2);
    bad_case_t cases[] = {
        {"head_dim", ok, KVS_EINVAL}, {"layers", ok, KVS_EINVAL},
        {"page_size", ok, KVS_EINVAL}, {"prefill_tp", ok, KVS_EINVAL},
        {"decode_tp", ok, KVS_EINVAL}, {"prefill_pp", ok, KVS_EINVAL},
        {"total_heads", ok, KVS_EINVAL}, {"dtype", ok, KVS_EDTYPE},
        {"tp ratio", ok, KVS_EHEAD_SPLIT}, {"heads vs tp", ok, KVS_EHEAD_SPLIT},
        {"heads vs decode tp", ok, KVS_EHEAD_SPLIT}, {"decode_pp", ok, KVS_EPP_SPLIT},
        {"layers vs pp", ok, KVS_EPP_SPLIT}, {"chunk negative", ok, KVS_ECHUNK},
        {"overflow", ok, KVS_ERANGE},
    };
    cases[0].p.head_dim = 0;
    cases[1].p.layers = -1;
    cases[2].p.page_size = 0;
    cases[3].p.prefill_tp = 0;
    cases[4].p.decode_tp = -2;
    cases[5].p.prefill_pp = -1;
    cases[6].p.total_heads = -8;
    cases[7].p.dtype = (kvs_dtype_t)9;
    cases[8].p.prefill_tp = 3;
    cases[9].p.total_heads = 6; /* 6 heads over P 8 */
    cases[10].p = llama70b(1, 2);
    cases[10].p.total_heads = 3;
    cases[11].p.prefill_pp = 4;
    cases[11].p.decode_pp = 2;
    cases[12].p.prefill_pp = 3;
    cases[12].p.layers = 80;
    cases[13].p.chunk_tokens = -16;
    cases[14].p.head_dim = INT64_MAX / 4;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvs_layout_t l;
        kvs_error_t e = {0};
        int rc = kvs_layout_init(&l, &cases[i].p, &e);
        if (rc != cases[i].status)
            fail_msg("%s: got %s, want %s", cases[i].what, kvs_status_name(rc),
                     kvs_status_name(cases[i].status));
        assert_int_equal(e.status, rc);
        assert_true(strlen(e.msg) > 10);
    }
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(NULL, &ok, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_init(&l, NULL, NULL), KVS_EINVAL);
}

static void test_layout_default_chunk_with_odd_page(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    prm.page_size = 3; /* C = 0 means 8192: G = 2730 pages * 3 */
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.chunk_pages, 2730);
    assert_int_equal(l.grid_tokens, 8190);
    prm.page_size = 16384; /* one page larger than C: F = max(1, C/ps) = 1 */
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.chunk_pages, 1);
    assert_int_equal(l.grid_tokens, 16384);
}

static void test_layout_grid_floors_chunk_to_pages(void **state)
{
    /* spec §2: G = max(1, C / ps) * ps */
    kvs_layout_params_t prm = llama70b(8, 2);
    kvs_layout_t l;
    prm.chunk_tokens = 100; /* 6 whole pages of 16 */
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.chunk_pages, 6);
    assert_int_equal(l.grid_tokens, 96);
    prm.chunk_tokens = 8; /* less than a page: one page */
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.chunk_pages, 1);
    assert_int_equal(l.grid_tokens, 16);
}

static void test_layout_writer_rejects_out_of_range(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    kvs_writer_t w;
    int64_t b;
    assert_int_equal(kvs_layout_writer(&l, 2, 0, 16, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, 4, 16, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, 0, 8193, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, 0, -1, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(NULL, 0, 0, 1, &w), KVS_EINVAL);
    assert_int_equal(kvs_layout_region_bytes(&l, 0, 1, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_region_bytes(NULL, 0, 1, &b), KVS_EINVAL);
    assert_int_equal(kvs_layout_target(NULL, 0, 0, &b), KVS_EINVAL);
    assert_int_equal(kvs_layout_writer_index(NULL, 0, 0, &b), KVS_EINVAL);
}

static void test_layout_dtypes(void **state)
{
    static const struct { const char *name; int64_t bytes; } d[] = {
        {"bf16", 2}, {"fp16", 2}, {"fp8", 1}, {"fp32", 4}};
    for (size_t i = 0; i < 4; i++) {
        kvs_dtype_t t;
        assert_int_equal(kvs_dtype_parse(d[i].name, &t), KVS_OK);
        assert_int_equal(kvs_dtype_bytes(t), d[i].bytes);
        assert_string_equal(kvs_dtype_name(t), d[i].name);
    }
    kvs_dtype_t t;
    assert_int_equal(kvs_dtype_parse("bf1", &t), KVS_EDTYPE);
    assert_int_equal(kvs_dtype_parse("bf16x", &t), KVS_EDTYPE);
    assert_int_equal(kvs_dtype_parse(NULL, &t), KVS_EINVAL);
    assert_int_equal(kvs_dtype_bytes((kvs_dtype_t)77), 0);
    assert_string_equal(kvs_dtype_name((kvs_dtype_t)77), "unknown");
    assert_string_equal(kvs_path_name(KVS_PATH_SLICE), "slice");
    assert_string_equal(kvs_path_name((kvs_path_t)9), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_head_slices_table),
        cmocka_unit_test(test_layout_head_slice_rejects_bad_sizes),
        cmocka_unit_test(test_layout_llama70b_p8_d2),
        cmocka_unit_test(test_layout_spec_chunk_size_decode_tp1),
        cmocka_unit_test(test_layout_rank_mapping_p_gt_d),
        cmocka_unit_test(test_layout_rank_mapping_p_lt_d),
        cmocka_unit_test(test_layout_equal_tp_is_direct),
        cmocka_unit_test(test_layout_pp_arrivals_and_layers),
        cmocka_unit_test(test_layout_heads_resolution),
        cmocka_unit_test(test_layout_rejects_invalid_params),
        cmocka_unit_test(test_layout_default_chunk_with_odd_page),
        cmocka_unit_test(test_layout_grid_floors_chunk_to_pages),
        cmocka_unit_test(test_layout_writer_rejects_out_of_range),
        cmocka_unit_test(test_layout_dtypes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
