/*
 * test_layout.c - the layout planner against hand-worked cases of spec §3-§4:
 * head slices for P > D, P < D, replicated heads both ways and P == D; rank
 * mapping; region layout; PP arrivals and pipeline stages, even and uneven
 * (spec §4); every validation error.
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
    assert_int_equal(kvs_head_slice(8, 2, 2, 0, -1, &s), KVS_EINVAL);
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
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 2, 8192, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 6);
    assert_int_equal(w.heads.dst_start, 2);
    assert_int_equal(w.len_bytes, 320ll << 20);
    assert_int_equal(w.offset_bytes, 640ll << 20);
    int64_t region;
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 0, 8192, &region), KVS_OK);
    assert_int_equal(region, 1280ll << 20);
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 0, 100, &region), KVS_OK);
    assert_int_equal(region, 4ll * 100 * 128 * 2 * 80 * 2);
    assert_int_equal(kvs_layout_layer_block_bytes(&l, 100, 1), 100 * 128 * 2);
}

/* FP8 KV with scale planes: each layer slot holds its KV rows, then one
 * scale row per (token, head): 4 bytes (per-token fp32) or head_dim / 32
 * (MXFP8 e8m0). The heads, writers and offsets are the KV's. */
static void test_layout_fp8_scales(void **state)
{
    kvs_kv_scales_t sc;
    int64_t block = -1;
    assert_int_equal(kvs_kv_scales_parse("none", &sc, &block), KVS_OK);
    assert_int_equal(sc, KVS_KV_SCALES_NONE);
    assert_int_equal(block, 0);
    assert_int_equal(kvs_kv_scales_parse("per-token", &sc, &block), KVS_OK);
    assert_int_equal(sc, KVS_KV_SCALES_PER_TOKEN);
    assert_int_equal(kvs_kv_scales_parse("per-block", &sc, &block), KVS_OK);
    assert_int_equal(sc, KVS_KV_SCALES_PER_BLOCK);
    assert_int_equal(block, 32);
    assert_int_equal(kvs_kv_scales_parse("per-block:16", &sc, &block), KVS_OK);
    assert_int_equal(block, 16);
    const char *bad[] = {"per-block:", "per-block:0", "per-block:x", "per-block16",
                         "per-token:4", "per-block:99999999999", "", "fp8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(kvs_kv_scales_parse(bad[i], &sc, &block), KVS_EINVAL);
    assert_int_equal(kvs_kv_scales_parse(NULL, &sc, &block), KVS_EINVAL);
    assert_string_equal(kvs_kv_scales_name(KVS_KV_SCALES_PER_BLOCK), "per-block");
    assert_string_equal(kvs_kv_scales_name((kvs_kv_scales_t)7), "unknown");
    assert_int_equal(kvs_kv_scales_head_bytes(KVS_KV_SCALES_NONE, 0, 128), 0);
    assert_int_equal(kvs_kv_scales_head_bytes(KVS_KV_SCALES_PER_TOKEN, 0, 128), 4);
    assert_int_equal(kvs_kv_scales_head_bytes(KVS_KV_SCALES_PER_BLOCK, 0, 128), 4);
    assert_int_equal(kvs_kv_scales_head_bytes(KVS_KV_SCALES_PER_BLOCK, 16, 128), 8);
    assert_int_equal(kvs_kv_scales_head_bytes(KVS_KV_SCALES_PER_BLOCK, 48, 128), 0);

    /* Llama-3-70B in fp8, P8 -> D2, per-token scales: a writer's layer
     * block is 8192 tokens x 1 head x (128 + 4) bytes. */
    kvs_layout_params_t prm = llama70b(8, 2);
    prm.dtype = KVS_DTYPE_FP8;
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    const int64_t plain = kvs_layout_max_region_bytes(&l);
    prm.kv_scales = KVS_KV_SCALES_PER_TOKEN;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.scale_bytes, 4);
    assert_int_equal(l.scale_block, 0);
    assert_int_equal(kvs_layout_layer_block_bytes(&l, 8192, 1), 8192 * 132);
    kvs_writer_t w;
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 2, 8192, &w), KVS_OK);
    assert_int_equal(w.heads.dst_start, 2); /* the heads do not change */
    assert_int_equal(w.len_bytes, 8192ll * 132 * 80 * 2);
    assert_int_equal(w.offset_bytes, 2 * w.len_bytes);
    assert_int_equal(kvs_layout_max_region_bytes(&l), plain / 128 * 132);
    int64_t region;
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 0, 100, &region), KVS_OK);
    assert_int_equal(region, 4ll * 100 * 132 * 80 * 2);

    /* MXFP8: one e8m0 byte per 32 elements, 4 a head of 128; per 16, 8. */
    prm.kv_scales = KVS_KV_SCALES_PER_BLOCK;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.scale_block, 32);
    assert_int_equal(l.scale_bytes, 4);
    prm.scale_block = 16;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.scale_bytes, 8);
    assert_int_equal(kvs_layout_layer_block_bytes(&l, 10, 2), 10 * 2 * 136);

    /* Refusals, naming what to change. */
    kvs_error_t err;
    prm.scale_block = 48;
    assert_int_equal(kvs_layout_init(&l, &prm, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "scale_block 48 must divide head_dim 128"));
    assert_non_null(strstr(err.msg, "--kv-scales per-block:N"));
    prm.scale_block = -1;
    assert_int_equal(kvs_layout_init(&l, &prm, &err), KVS_EINVAL);
    prm.scale_block = 0;
    prm.dtype = KVS_DTYPE_BF16;
    assert_int_equal(kvs_layout_init(&l, &prm, &err), KVS_EDTYPE);
    assert_non_null(strstr(err.msg, "kv_scales per-block needs dtype fp8 (got bf16)"));
    prm.dtype = KVS_DTYPE_FP8;
    prm.kv_scales = (kvs_kv_scales_t)9;
    assert_int_equal(kvs_layout_init(&l, &prm, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "kv_scales 9 unknown"));
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
            assert_int_equal(kvs_layout_writer(&l, dr, 0, i, 16, &w), KVS_OK);
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
    assert_int_equal(kvs_layout_writer(&l, 5, 0, 0, 8192, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 1);
    assert_int_equal(w.heads.src_start, 1);
    assert_int_equal(w.heads.num_heads, 1);
    assert_int_equal(kvs_layout_writer(&l, 5, 0, 1, 8192, &w), KVS_ERANGE);
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

/* Fewer KV heads than prefill ranks (H < P, P > D): the P / H ranks in a
 * row that hold one head send it once. H4 P16 -> D2: decode 1's sources
 * are prefill 8..15, holding heads 2,2,2,2,3,3,3,3; its writers are 8 and
 * 12 (W = H / D = 2), the other six only report. */
static void test_layout_replicated_heads_written_once(void **state)
{
    (void)state;
    kvs_layout_params_t prm = llama70b(16, 2);
    prm.total_heads = 4;
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.tp_sources, 8);
    assert_int_equal(l.tp_writers, 2);
    assert_int_equal(l.expected_arrivals, 2);
    kvs_writer_t w;
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 0, 16, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 8);
    assert_int_equal(w.heads.dst_start, 0);
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 1, 16, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 12);
    assert_int_equal(w.heads.dst_start, 1);
    assert_int_equal(w.heads.num_heads, 1);
    assert_int_equal(w.offset_bytes, w.len_bytes);
    int64_t region = 0;
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 0, 16, &region), KVS_OK);
    /* the decode rank's two heads, once: 16 tokens x 2 heads x 128 x bf16 x 80 x K, V */
    assert_int_equal(region, 16LL * 2 * 128 * 2 * 80 * 2);
    /* sources: writers first, then the reporters in rank order; each maps
     * back to its index, and every rank of the run is a source once */
    static const int64_t want[8] = {8, 12, 9, 10, 11, 13, 14, 15};
    int seen[16] = {0};
    for (int64_t i = 0; i < 8; i++) {
        int64_t r = -1, idx = -1;
        assert_int_equal(kvs_layout_source_rank(&l, 1, i, &r), KVS_OK);
        assert_int_equal(r, want[i]);
        assert_int_equal(kvs_layout_source_index(&l, r, 1, &idx), KVS_OK);
        assert_int_equal(idx, i);
        assert_int_equal(kvs_layout_writer_index(&l, r, 1, &idx), i < 2 ? KVS_OK : KVS_ENOENT);
        seen[r]++;
    }
    for (int64_t r = 8; r < 16; r++)
        assert_int_equal(seen[r], 1);
    /* H1 over P4 -> D2: one writer, the first of each run, as MLA's */
    prm = llama70b(4, 2);
    prm.total_heads = 1;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.tp_writers, 1);
    int64_t r = -1;
    assert_int_equal(kvs_layout_source_rank(&l, 1, 0, &r), KVS_OK);
    assert_int_equal(r, 2);
    assert_int_equal(kvs_layout_source_rank(&l, 1, 1, &r), KVS_OK);
    assert_int_equal(r, 3);
    /* H >= P: every source writes, in rank order, as before */
    prm = llama70b(8, 2);
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.tp_writers, 4);
    assert_int_equal(kvs_layout_source_rank(&l, 1, 3, &r), KVS_OK);
    assert_int_equal(r, 7);
}

/* DeepSeek-V3's shape: one 576-element latent per token and layer. */
static kvs_layout_params_t mla(int64_t p, int64_t d)
{
    kvs_layout_params_t prm = {.head_dim = 576, .dtype = KVS_DTYPE_BF16, .layers = 61,
                               .page_size = 64, .prefill_tp = p, .decode_tp = d,
                               .chunk_tokens = 8192, .kind = KVS_KV_MLA};
    return prm;
}

static void test_layout_mla_one_writer_spread_over_prefill(void **state)
{
    (void)state;
    kvs_layout_params_t prm = mla(8, 2);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.kind, KVS_KV_MLA);
    assert_int_equal(l.planes, 1);
    assert_int_equal(l.total_heads, 1);
    assert_int_equal(l.src_heads, 1);
    assert_int_equal(l.dst_heads, 1);
    assert_int_equal(l.tp_writers, 1);
    assert_int_equal(l.tp_sources, 4);
    assert_int_equal(l.expected_arrivals, 1);
    /* decode d takes its latent from prefill d * P / D, once: no V, one
     * writer, the whole latent. */
    for (int64_t d = 0; d < 2; d++) {
        kvs_writer_t w;
        assert_int_equal(kvs_layout_writer(&l, d, 0, 0, 8192, &w), KVS_OK);
        assert_int_equal(w.prefill_rank, d * 4);
        assert_int_equal(w.heads.src_start, 0);
        assert_int_equal(w.heads.num_heads, 1);
        assert_int_equal(w.heads.dst_start, 0);
        assert_int_equal(w.offset_bytes, 0);
        assert_int_equal(w.len_bytes, 8192LL * 576 * 2 * 61);
        assert_int_equal(kvs_layout_writer(&l, d, 0, 1, 8192, &w), KVS_ERANGE);
    }
    assert_int_equal(kvs_layout_max_region_bytes(&l), 8192LL * 576 * 2 * 61);
    /* Prefill 5 takes part in decode 1's rooms (source 1) but writes
     * nothing; prefill 4 is its writer. */
    int64_t idx = -1, d = -1;
    assert_int_equal(kvs_layout_source_index(&l, 5, 1, &idx), KVS_OK);
    assert_int_equal(idx, 1);
    assert_int_equal(kvs_layout_writer_index(&l, 5, 1, &idx), KVS_ENOENT);
    assert_int_equal(kvs_layout_writer_index(&l, 4, 1, &idx), KVS_OK);
    assert_int_equal(idx, 0);
    assert_int_equal(kvs_layout_source_index(&l, 5, 0, &idx), KVS_ENOENT);
    assert_int_equal(kvs_layout_source_index(&l, 8, 0, &idx), KVS_ERANGE);
    assert_int_equal(kvs_layout_target(&l, 5, 0, &d), KVS_OK);
    assert_int_equal(d, 1);
    /* Each argument of the source lookups on its own. */
    assert_int_equal(kvs_layout_source_index(NULL, 5, 1, &idx), KVS_EINVAL);
    assert_int_equal(kvs_layout_source_index(&l, 5, 1, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_source_index(&l, -1, 1, &idx), KVS_ERANGE);
    assert_int_equal(kvs_layout_source_index(&l, 5, -1, &idx), KVS_ERANGE);
    assert_int_equal(kvs_layout_source_index(&l, 5, 2, &idx), KVS_ERANGE);
    int64_t p = -1;
    assert_int_equal(kvs_layout_source_rank(&l, 1, 1, &p), KVS_OK);
    assert_int_equal(p, 5);
    assert_int_equal(kvs_layout_source_rank(NULL, 1, 1, &p), KVS_EINVAL);
    assert_int_equal(kvs_layout_source_rank(&l, 1, 1, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_source_rank(&l, -1, 1, &p), KVS_ERANGE);
    assert_int_equal(kvs_layout_source_rank(&l, 2, 1, &p), KVS_ERANGE);
    assert_int_equal(kvs_layout_source_rank(&l, 1, -1, &p), KVS_ERANGE);
    assert_int_equal(kvs_layout_source_rank(&l, 1, l.tp_sources, &p), KVS_ERANGE);
}

static void test_layout_mla_p_lt_d_and_equal(void **state)
{
    (void)state;
    kvs_layout_params_t prm = mla(2, 8);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.tp_writers, 1);
    assert_int_equal(l.tp_sources, 1);
    assert_int_equal(l.targets_per_prefill, 4);
    assert_int_equal(l.path, KVS_PATH_STAGING);
    for (int64_t d = 0; d < 8; d++) {
        kvs_writer_t w;
        assert_int_equal(kvs_layout_writer(&l, d, 0, 0, 64, &w), KVS_OK);
        assert_int_equal(w.prefill_rank, d / 4); /* = d * P / D */
        assert_int_equal(w.len_bytes, 64LL * 576 * 2 * 61);
    }
    prm = mla(4, 4);
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.path, KVS_PATH_DIRECT);
    int64_t idx;
    assert_int_equal(kvs_layout_writer_index(&l, 3, 3, &idx), KVS_OK);
    assert_int_equal(kvs_layout_source_index(&l, 2, 3, &idx), KVS_ENOENT);
}

static void test_layout_mla_pp_and_fp8(void **state)
{
    (void)state;
    kvs_layout_params_t prm = mla(4, 2);
    prm.prefill_pp = 2; /* 61 layers: 30 / 31 */
    prm.dtype = KVS_DTYPE_FP8;
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.expected_arrivals, 2); /* one writer x 2 stages */
    assert_int_equal(l.decode_layers, 61);
    kvs_writer_t w;
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 0, 128, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 2);
    assert_int_equal(w.len_bytes, 128LL * 576 * 1 * 61);
}

static void test_layout_mla_rejects_heads(void **state)
{
    (void)state;
    kvs_layout_params_t prm = mla(8, 2);
    kvs_layout_t l;
    kvs_error_t err = {0};
    prm.total_heads = 128; /* DeepSeek's attention heads are not KV heads */
    assert_int_equal(kvs_layout_init(&l, &prm, &err), KVS_EMLA);
    assert_non_null(strstr(err.msg, "total_heads"));
    prm.total_heads = 1;
    prm.heads_per_rank = 2;
    assert_int_equal(kvs_layout_init(&l, &prm, &err), KVS_EMLA);
    assert_non_null(strstr(err.msg, "heads_per_rank"));
    prm.heads_per_rank = 1;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    prm.kind = (kvs_kv_kind_t)7;
    assert_int_equal(kvs_layout_init(&l, &prm, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "kind"));
}

static void test_layout_kind_names_round_trip(void **state)
{
    (void)state;
    kvs_kv_kind_t k;
    assert_int_equal(kvs_kv_kind_parse("mla", &k), KVS_OK);
    assert_int_equal(k, KVS_KV_MLA);
    assert_string_equal(kvs_kv_kind_name(k), "mla");
    assert_int_equal(kvs_kv_kind_parse("gqa", &k), KVS_OK);
    assert_int_equal(k, KVS_KV_GQA);
    assert_int_equal(kvs_kv_kind_planes(KVS_KV_GQA), 2);
    assert_int_equal(kvs_kv_kind_planes(KVS_KV_MLA), 1);
    assert_int_equal(kvs_kv_kind_planes((kvs_kv_kind_t)9), 0);
    assert_string_equal(kvs_kv_kind_name((kvs_kv_kind_t)9), "unknown");
    assert_int_equal(kvs_kv_kind_parse("MLA", &k), KVS_EINVAL);
    assert_int_equal(kvs_kv_kind_parse(NULL, &k), KVS_EINVAL);
    assert_int_equal(kvs_kv_kind_parse("mla", NULL), KVS_EINVAL);
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
    assert_int_equal(kvs_layout_writer(&l, 0, 0, 1, 10, &w), KVS_OK);
    assert_int_equal(w.len_bytes, 10ll * 2 * 128 * 2 * 40 * 2); /* nh = H/P = 2 */
}

/* spec §4: L layers over Pp stages, base = L / Pp, rem = L % Pp, the last
 * rem stages hold base + 1, contiguous from layer 0. */
static void test_layout_pp_stage_layers_split(void **state)
{
    static const struct {
        int64_t layers, pp, stage, first, count;
    } c[] = {
        {80, 3, 0, 0, 26}, {80, 3, 1, 26, 27}, {80, 3, 2, 53, 27}, /* 26 / 27 / 27 */
        {81, 2, 0, 0, 40}, {81, 2, 1, 40, 41},
        {10, 4, 0, 0, 2}, {10, 4, 1, 2, 2}, {10, 4, 2, 4, 3}, {10, 4, 3, 7, 3},
        {80, 2, 1, 40, 40},                   /* even: unchanged */
        {4, 4, 0, 0, 1}, {4, 4, 3, 3, 1},     /* L == Pp: one layer per stage */
        {5, 4, 0, 0, 1}, {5, 4, 3, 3, 2},     /* one layer, the last stage two */
        {80, 1, 0, 0, 80},
        {2, 3, 0, 0, 0}, {2, 3, 1, 0, 1}, {2, 3, 2, 1, 1}, /* L < Pp: a stage of none */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int64_t first = -1, count = -1;
        assert_int_equal(kvs_pp_stage_layers(c[i].layers, c[i].pp, c[i].stage, &first, &count),
                         KVS_OK);
        if (first != c[i].first || count != c[i].count)
            fail_msg("%lld layers over %lld, stage %lld: got %lld+%lld, want %lld+%lld",
                     (long long)c[i].layers, (long long)c[i].pp, (long long)c[i].stage,
                     (long long)first, (long long)count, (long long)c[i].first,
                     (long long)c[i].count);
    }
    int64_t first = 7, count = 7;
    assert_int_equal(kvs_pp_stage_layers(80, 3, 3, &first, &count), KVS_ERANGE);
    assert_int_equal(kvs_pp_stage_layers(80, 3, -1, &first, &count), KVS_ERANGE);
    assert_int_equal(kvs_pp_stage_layers(0, 3, 0, &first, &count), KVS_EINVAL);
    assert_int_equal(kvs_pp_stage_layers(80, 0, 0, &first, &count), KVS_EINVAL);
    assert_int_equal(kvs_pp_stage_layers(-80, 3, 0, &first, &count), KVS_EINVAL);
    assert_int_equal(kvs_pp_stage_layers(80, -3, 0, &first, &count), KVS_EINVAL);
    assert_int_equal(kvs_pp_stage_layers(80, 3, 0, NULL, &count), KVS_EINVAL);
    assert_int_equal(kvs_pp_stage_layers(80, 3, 0, &first, NULL), KVS_EINVAL);
    assert_int_equal(first, 7); /* left alone on error */
    assert_int_equal(count, 7);
    assert_int_equal(kvs_pp_stage_layers(INT64_MAX, 3, 2, &first, &count), KVS_OK);
    assert_int_equal(first + count, INT64_MAX); /* the last stage ends at the last layer */

    /* A layout refuses a split that leaves a stage without layers. */
    kvs_layout_params_t prm = llama70b(8, 2);
    prm.layers = 2;
    prm.prefill_pp = 3;
    kvs_layout_t l;
    kvs_error_t e = {0};
    assert_int_equal(kvs_layout_init(&l, &prm, &e), KVS_EPP_SPLIT);
    assert_non_null(strstr(e.msg, "every pipeline stage needs at least one layer"));
    prm.layers = 3; /* L == Pp */
    prm.decode_pp = 3;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.prefill_layers, 1);
    assert_int_equal(l.decode_layers, 1);
}

/* 80 layers, prefill TP 8 x PP 3 (26 / 27 / 27) -> decode TP 2 x PP 1: the
 * decode's regions hold all 80 layer slots; a chunk waits for 4 TP writers
 * x 3 stages. */
static void test_layout_uneven_pp_to_decode_pp1(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    prm.prefill_pp = 3;
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.prefill_layers, 27); /* the most one stage holds */
    assert_int_equal(l.decode_layers, 80);
    assert_int_equal(l.expected_arrivals, 12);
    int64_t first, count;
    const int64_t want[3][2] = {{0, 26}, {26, 27}, {53, 27}};
    for (int64_t s = 0; s < 3; s++) {
        assert_int_equal(kvs_layout_stage_layers(&l, KVS_ROLE_PREFILL, s, &first, &count),
                         KVS_OK);
        assert_int_equal(first, want[s][0]);
        assert_int_equal(count, want[s][1]);
    }
    assert_int_equal(kvs_layout_stage_layers(&l, KVS_ROLE_PREFILL, 3, &first, &count),
                     KVS_ERANGE);
    assert_int_equal(kvs_layout_stage_layers(&l, KVS_ROLE_DECODE, 0, &first, &count), KVS_OK);
    assert_int_equal(first, 0);
    assert_int_equal(count, 80);
    assert_int_equal(kvs_layout_stage_layers(&l, KVS_ROLE_DECODE, 1, &first, &count),
                     KVS_ERANGE);
    assert_int_equal(kvs_layout_stage_layers(&l, (kvs_role_t)7, 0, &first, &count),
                     KVS_EINVAL);
    assert_int_equal(kvs_layout_stage_layers(NULL, KVS_ROLE_DECODE, 0, &first, &count),
                     KVS_EINVAL);
    /* writer 3 of decode rank 1 is prefill rank 7: 100 tokens x 1 head x
     * 128 x 2 B x 80 slots x 2 (K, V), after 3 such blocks */
    kvs_writer_t w;
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 3, 100, &w), KVS_OK);
    assert_int_equal(w.prefill_rank, 7);
    assert_int_equal(w.len_bytes, 100ll * 128 * 2 * 80 * 2);
    assert_int_equal(w.offset_bytes, 3 * w.len_bytes);
    assert_int_equal(kvs_layout_writer(&l, 1, 1, 3, 100, &w), KVS_ERANGE);
    int64_t region;
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 0, 8192, &region), KVS_OK);
    assert_int_equal(region, 1280ll << 20);
    assert_int_equal(kvs_layout_max_region_bytes(&l), region);
    assert_int_equal(kvs_layout_region_bytes(&l, 1, 1, 8192, &region), KVS_ERANGE);
}

/* The same with decode PP 3: decode stage e's regions hold its own 26 or
 * 27 layers, filled by prefill stage e alone. */
static void test_layout_uneven_pp_to_equal_decode_pp(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    prm.prefill_pp = 3;
    prm.decode_pp = 3;
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.prefill_layers, 27);
    assert_int_equal(l.decode_layers, 27);
    assert_int_equal(l.expected_arrivals, 4);
    const int64_t slots[3] = {26, 27, 27};
    for (int64_t e = 0; e < 3; e++) {
        int64_t pf, pn, df, dn;
        assert_int_equal(kvs_layout_stage_layers(&l, KVS_ROLE_PREFILL, e, &pf, &pn), KVS_OK);
        assert_int_equal(kvs_layout_stage_layers(&l, KVS_ROLE_DECODE, e, &df, &dn), KVS_OK);
        assert_int_equal(pf, df); /* the same split: slot 0 of its own stage */
        assert_int_equal(pn, dn);
        assert_int_equal(dn, slots[e]);
        for (int64_t d = 0; d < 2; d++) {
            int64_t sum = 0;
            for (int64_t i = 0; i < 4; i++) {
                kvs_writer_t w;
                assert_int_equal(kvs_layout_writer(&l, d, e, i, 64, &w), KVS_OK);
                assert_int_equal(w.offset_bytes, sum);
                assert_int_equal(w.len_bytes, 64ll * 1 * 128 * 2 * slots[e] * 2);
                sum += w.len_bytes;
            }
            int64_t region;
            assert_int_equal(kvs_layout_region_bytes(&l, d, e, 64, &region), KVS_OK);
            assert_int_equal(region, sum);
        }
    }
    kvs_writer_t w;
    int64_t region;
    assert_int_equal(kvs_layout_writer(&l, 0, 3, 0, 64, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, -1, 0, 64, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_region_bytes(&l, 0, 3, 64, &region), KVS_ERANGE);
    /* The largest region is a 27-layer stage's. */
    assert_int_equal(kvs_layout_region_bytes(&l, 0, 2, 8192, &region), KVS_OK);
    assert_int_equal(kvs_layout_max_region_bytes(&l), region);
    assert_int_equal(region, 4ll * 8192 * 128 * 2 * 27 * 2);
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
    /* A product that could overflow is refused, not wrapped. */
    h = -7;
    assert_int_equal(kvs_heads_resolve(0, (int64_t)INT32_MAX + 1, 4, &h), KVS_EHEADS);
    assert_int_equal(kvs_heads_resolve(0, 4, (int64_t)INT32_MAX + 1, &h), KVS_EHEADS);
    assert_int_equal(h, -7);
    assert_int_equal(kvs_heads_resolve(0, INT32_MAX, INT32_MAX, &h), KVS_OK);
    assert_int_equal(h, (int64_t)INT32_MAX * INT32_MAX);
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
    const char *names; /* what the error message must say */
} bad_case_t;

static void test_layout_rejects_invalid_params(void **state)
{
    const kvs_layout_params_t ok = llama70b(8, 2);
    bad_case_t cases[] = {
        {"head_dim", ok, KVS_EINVAL, "head_dim must be > 0 (got 0)"},
        {"layers", ok, KVS_EINVAL, "layers must be > 0 (got -1)"},
        {"page_size", ok, KVS_EINVAL, "page_size must be > 0"},
        {"prefill_tp", ok, KVS_EINVAL, "prefill_tp must be > 0"},
        {"decode_tp", ok, KVS_EINVAL, "decode_tp must be > 0 (got -2)"},
        {"prefill_pp", ok, KVS_EINVAL, "prefill_pp"},
        {"total_heads", ok, KVS_EINVAL, "total_heads"},
        {"dtype", ok, KVS_EDTYPE, "dtype 9 unknown"},
        {"tp ratio", ok, KVS_EHEAD_SPLIT, "prefill TP 3 and decode TP 2"},
        {"heads vs tp", ok, KVS_EHEAD_SPLIT, "6 KV heads do not split"},
        {"heads vs decode tp", ok, KVS_EHEAD_SPLIT, "3 KV heads do not split"},
        {"decode_pp", ok, KVS_EPP_SPLIT, "decode PP 2 must be 1 or equal to prefill PP 4"},
        {"layers vs pp", ok, KVS_EPP_SPLIT, "2 layers cannot fill 3 prefill stages"},
        {"chunk negative", ok, KVS_ECHUNK, "chunk_tokens -16"},
        {"overflow", ok, KVS_ERANGE, "overflows 64 bits"},
        {"decode_pp negative", ok, KVS_EINVAL, "decode_pp"},
        {"heads_per_rank negative", ok, KVS_EINVAL, "heads_per_rank"},
        {"heads_per_rank_tp negative", ok, KVS_EINVAL, "heads_per_rank_tp"},
        {"layers vs pp, both pp", ok, KVS_EPP_SPLIT, "at most 3"},
        {"layers over the bound", ok, KVS_ERANGE, "at most 65536 (KVS_MAX_LAYERS)"},
        {"prefill_tp over the bound", ok, KVS_ERANGE, "prefill_tp 131072: at most 65536"},
        {"decode_tp over the bound", ok, KVS_ERANGE, "decode_tp"},
        {"prefill_pp over the bound", ok, KVS_ERANGE, "prefill_pp"},
        /* What fuzz_plan found: 2^35 layers, stages and ranks, accepted,
         * then walked stage by stage (minutes in one call). */
        {"2^35 of everything", ok, KVS_ERANGE, "KVS_MAX_LAYERS"},
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
    cases[12].p.prefill_pp = 3; /* 80 over 3 splits unevenly (fine); 2 cannot */
    cases[12].p.layers = 2;
    cases[13].p.chunk_tokens = -16;
    cases[14].p.head_dim = INT64_MAX / 4;
    cases[15].p.decode_pp = -1;
    cases[16].p.heads_per_rank = -1;
    cases[17].p.heads_per_rank_tp = -4;
    cases[18].p.layers = 3;
    cases[18].p.prefill_pp = 4;
    cases[18].p.decode_pp = 4;
    cases[19].p.layers = KVS_MAX_LAYERS + 1;
    cases[20].p.prefill_tp = 2 * KVS_MAX_PARALLEL;
    cases[20].p.decode_tp = 2; /* nested: only the bound is broken */
    cases[20].p.total_heads = 8;
    cases[21].p.decode_tp = 2 * KVS_MAX_PARALLEL;
    cases[22].p.layers = KVS_MAX_LAYERS;
    cases[22].p.prefill_pp = KVS_MAX_PARALLEL + 1;
    cases[23].p.layers = (int64_t)1 << 35;
    cases[23].p.prefill_tp = cases[23].p.decode_tp = (int64_t)1 << 35;
    cases[23].p.prefill_pp = cases[23].p.decode_pp = (int64_t)1 << 35;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvs_layout_t l;
        kvs_error_t e = {0};
        int rc = kvs_layout_init(&l, &cases[i].p, &e);
        if (rc != cases[i].status)
            fail_msg("%s: got %s, want %s", cases[i].what, kvs_status_name(rc),
                     kvs_status_name(cases[i].status));
        assert_int_equal(e.status, rc);
        if (strstr(e.msg, cases[i].names) == NULL)
            fail_msg("%s: message \"%s\" does not say \"%s\"", cases[i].what, e.msg,
                     cases[i].names);
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

/* Different page sizes (docs/kinds/page-sizes.md): G is a multiple of
 * lcm(prefill ps, decode ps), F counts decode pages, and chunk i starts on
 * a page boundary of both sides. */
static void test_layout_grid_two_page_sizes(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    kvs_layout_t l;
    prm.page_size = 16; /* prefill 16 -> decode 64 */
    prm.decode_page_size = 64;
    prm.chunk_tokens = 200; /* floored to lcm 64: 3 x 64 */
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.page_size, 16);
    assert_int_equal(l.decode_page_size, 64);
    assert_int_equal(l.grid_tokens, 192);
    assert_int_equal(l.chunk_pages, 3);
    prm.page_size = 64; /* 64 -> 16: the same grid, F of 16-token pages */
    prm.decode_page_size = 16;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.grid_tokens, 192);
    assert_int_equal(l.chunk_pages, 12);
    prm.page_size = 6; /* neither divides the other: lcm 24 */
    prm.decode_page_size = 8;
    prm.chunk_tokens = 10; /* under one lcm: one lcm */
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    assert_int_equal(l.grid_tokens, 24);
    assert_int_equal(l.chunk_pages, 3);
    /* the grid: base aligned to both; pages are the decode's */
    kvs_chunk_t ch;
    assert_int_equal(kvs_grid_chunk(&l, 24, 24 + 50, 1, &ch), KVS_OK);
    assert_int_equal(ch.page_start, 3);
    assert_int_equal(ch.num_pages, 3);
    assert_int_equal(ch.token_start, 48);
    assert_int_equal(ch.token_end, 72);
    assert_int_equal(kvs_grid_num_chunks(&l, 7), 3); /* 50 tokens: 7 pages of 8 */
    assert_int_equal(kvs_grid_chunk(&l, 8, 100, 0, &ch), KVS_EPREFIX_ALIGN); /* not of 6 */
    assert_int_equal(kvs_grid_chunk(&l, 6, 100, 0, &ch), KVS_EPREFIX_ALIGN); /* not of 8 */
    kvs_send_t snd;
    assert_int_equal(kvs_grid_send(&l, 12, 12, 100, false, &snd), KVS_EPREFIX_ALIGN);
    /* equal sizes: 0 and the same size give the same plan */
    kvs_layout_t a, b;
    prm = llama70b(8, 2);
    assert_int_equal(kvs_layout_init(&a, &prm, NULL), KVS_OK);
    prm.decode_page_size = prm.page_size;
    assert_int_equal(kvs_layout_init(&b, &prm, NULL), KVS_OK);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(a.decode_page_size, a.page_size);
    prm.decode_page_size = -1;
    assert_int_equal(kvs_layout_init(&a, &prm, NULL), KVS_EINVAL);
    prm.page_size = INT64_MAX / 2; /* lcm overflows */
    prm.decode_page_size = INT64_MAX / 2 - 1;
    assert_int_equal(kvs_layout_init(&a, &prm, NULL), KVS_ERANGE);
}

static void test_layout_writer_rejects_out_of_range(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    kvs_writer_t w;
    int64_t b;
    assert_int_equal(kvs_layout_writer(&l, 2, 0, 0, 16, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, 0, 4, 16, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, 0, 0, 8193, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, 0, 0, -1, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(NULL, 0, 0, 0, 1, &w), KVS_EINVAL);
    assert_int_equal(kvs_layout_region_bytes(&l, 0, 0, 1, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_region_bytes(NULL, 0, 0, 1, &b), KVS_EINVAL);
    assert_int_equal(kvs_layout_target(NULL, 0, 0, &b), KVS_EINVAL);
    assert_int_equal(kvs_layout_writer_index(NULL, 0, 0, &b), KVS_EINVAL);
}

/* The largest region G * nh * hd * s * Lx * 2 * W must fit in int64: an
 * overflow at any factor is refused (a product that wrapped would size a
 * ring region smaller than what the writers send). */
static void test_layout_region_overflow_at_each_factor(void **state)
{
    const int64_t big = INT64_MAX / 2 + 1; /* 2^62 */
    struct {
        const char *factor;
        int64_t chunk, heads, head_dim, layers, p, d;
        kvs_dtype_t dtype;
    } c[] = {
        /* G = 2^62 tokens, nh 4: overflows at nh */
        {"heads", big, 8, 1, 1, 1, 2, KVS_DTYPE_FP8},
        /* G * nh fits, * hd does not */
        {"head_dim", 4, 1, big, 1, 1, 1, KVS_DTYPE_FP8},
        /* G * nh * hd = 2^62 fits, * 4 bytes does not */
        {"dtype bytes", 1, 1, big, 1, 1, 1, KVS_DTYPE_FP32},
        /* 2^61 * 1 B fits, * 4 layers does not */
        {"layers", 1, 1, big / 2, 4, 1, 1, KVS_DTYPE_FP8},
        /* 2^62 * 1 B * 1 layer fits, * 2 (K and V) does not */
        {"K and V", 1, 1, big, 1, 1, 1, KVS_DTYPE_FP8},
        /* 2^61 * 2 = 2^62 fits, * W = 2 writers does not */
        {"writers", 1, 2, big / 2, 1, 2, 1, KVS_DTYPE_FP8},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        kvs_layout_params_t prm = {.total_heads = c[i].heads, .head_dim = c[i].head_dim,
                                   .dtype = c[i].dtype, .layers = c[i].layers,
                                   .page_size = 1, .prefill_tp = c[i].p,
                                   .decode_tp = c[i].d, .chunk_tokens = c[i].chunk};
        kvs_layout_t l;
        kvs_error_t e = {0};
        int rc = kvs_layout_init(&l, &prm, &e);
        if (rc != KVS_ERANGE)
            fail_msg("overflow at %s: got %s", c[i].factor, kvs_status_name(rc));
        assert_non_null(strstr(e.msg, "lower chunk_tokens, head_dim or layers"));
        /* The same shape 16 times smaller fits. */
        if (prm.head_dim > 16)
            prm.head_dim /= 16;
        else
            prm.chunk_tokens /= 16;
        assert_int_equal(kvs_layout_init(&l, &prm, &e), KVS_OK);
        assert_true(kvs_layout_max_region_bytes(&l) > 0);
    }
}

/* The largest region equals the region of every decode rank (they all hold
 * W writers of the same head count), for P > D, P < D, P == D, replicated
 * heads and PP. */
static void test_layout_max_region_is_every_ranks_region(void **state)
{
    const int64_t shapes[][5] = {
        /* H, P, D, Pp, Dp */
        {8, 8, 2, 1, 1}, {8, 2, 8, 1, 1}, {4, 4, 4, 1, 1}, {2, 8, 2, 1, 1},
        {2, 2, 8, 1, 1}, {8, 4, 2, 2, 1}, {8, 4, 2, 2, 2}, {1, 1, 4, 1, 1},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        kvs_layout_params_t prm = llama70b(shapes[i][1], shapes[i][2]);
        prm.total_heads = shapes[i][0];
        prm.prefill_pp = shapes[i][3];
        prm.decode_pp = shapes[i][4];
        prm.chunk_tokens = 64;
        kvs_layout_t l;
        assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
        const int64_t max = kvs_layout_max_region_bytes(&l);
        for (int64_t d = 0; d < l.decode_tp; d++) {
            int64_t bytes = 0;
            assert_int_equal(kvs_layout_region_bytes(&l, d, 0, l.grid_tokens, &bytes), KVS_OK);
            if (bytes != max)
                fail_msg("shape %zu decode rank %lld: region %lld, max %lld", i, (long long)d,
                         (long long)bytes, (long long)max);
        }
        /* and by hand: G * nh * hd * s * Lx * 2 * W */
        const int64_t nh = l.prefill_tp > l.decode_tp ? l.src_heads : l.dst_heads;
        assert_int_equal(max, 64 * nh * 128 * 2 * l.decode_layers * 2 * l.tp_writers);
    }
}

/* Every argument of the writer / target / writer-index lookups is range
 * checked on its own: NULL out is EINVAL, each index below 0 or past its
 * size is ERANGE (these index arrays in the handlers). */
static void test_layout_lookups_check_each_argument(void **state)
{
    kvs_layout_params_t prm = llama70b(8, 2);
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &prm, NULL), KVS_OK);
    kvs_writer_t w;
    int64_t v = 42;
    assert_int_equal(kvs_layout_writer(&l, 0, 0, 0, 16, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_writer(&l, -1, 0, 0, 16, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, 0, -1, 16, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 3, l.grid_tokens, &w), KVS_OK);
    assert_int_equal(kvs_layout_writer(&l, 1, 0, 3, 0, &w), KVS_OK);
    assert_int_equal(w.len_bytes, 0);
    assert_int_equal(kvs_layout_region_bytes(&l, 2, 0, 16, &v), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer(&l, 0, 1, 0, 16, &w), KVS_ERANGE); /* decode PP 1 */
    assert_int_equal(kvs_layout_writer(&l, 0, -1, 0, 16, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_region_bytes(&l, 0, 1, 16, &v), KVS_ERANGE);

    assert_int_equal(kvs_layout_target(&l, 0, 0, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_target(&l, -1, 0, &v), KVS_ERANGE);
    assert_int_equal(kvs_layout_target(&l, 8, 0, &v), KVS_ERANGE);
    assert_int_equal(kvs_layout_target(&l, 0, -1, &v), KVS_ERANGE);
    assert_int_equal(kvs_layout_target(&l, 0, 1, &v), KVS_ERANGE);
    assert_int_equal(v, 42);
    assert_int_equal(kvs_layout_target(&l, 7, 0, &v), KVS_OK);
    assert_int_equal(v, 1);

    assert_int_equal(kvs_layout_writer_index(&l, 0, 0, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_writer_index(&l, -1, 0, &v), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer_index(&l, 8, 0, &v), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer_index(&l, 0, -1, &v), KVS_ERANGE);
    assert_int_equal(kvs_layout_writer_index(&l, 0, 2, &v), KVS_ERANGE);
    assert_int_equal(v, 1);
    assert_int_equal(kvs_layout_writer_index(&l, 7, 1, &v), KVS_OK);
    assert_int_equal(v, 3);
}

static void test_layout_path_names_round_trip(void **state)
{
    static const struct { const char *name; kvs_path_t path; } p[] = {
        {"auto", KVS_PATH_AUTO}, {"staging", KVS_PATH_STAGING},
        {"direct", KVS_PATH_DIRECT}, {"slice", KVS_PATH_SLICE}};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        kvs_path_t got = (kvs_path_t)-1;
        assert_int_equal(kvs_path_parse(p[i].name, &got), KVS_OK);
        assert_int_equal(got, p[i].path);
        assert_string_equal(kvs_path_name(p[i].path), p[i].name);
    }
    kvs_path_t got = KVS_PATH_SLICE;
    assert_int_equal(kvs_path_parse("Staging", &got), KVS_EINVAL);
    assert_int_equal(kvs_path_parse("", &got), KVS_EINVAL);
    assert_int_equal(kvs_path_parse("unknown", &got), KVS_EINVAL);
    assert_int_equal(got, KVS_PATH_SLICE);
    assert_int_equal(kvs_path_parse(NULL, &got), KVS_EINVAL);
    assert_int_equal(kvs_path_parse("auto", NULL), KVS_EINVAL);
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
    assert_int_equal(kvs_dtype_parse("fp8", NULL), KVS_EINVAL);
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
        cmocka_unit_test(test_layout_replicated_heads_written_once),
        cmocka_unit_test(test_layout_equal_tp_is_direct),
        cmocka_unit_test(test_layout_mla_one_writer_spread_over_prefill),
        cmocka_unit_test(test_layout_mla_p_lt_d_and_equal),
        cmocka_unit_test(test_layout_mla_pp_and_fp8),
        cmocka_unit_test(test_layout_mla_rejects_heads),
        cmocka_unit_test(test_layout_kind_names_round_trip),
        cmocka_unit_test(test_layout_pp_arrivals_and_layers),
        cmocka_unit_test(test_layout_pp_stage_layers_split),
        cmocka_unit_test(test_layout_uneven_pp_to_decode_pp1),
        cmocka_unit_test(test_layout_uneven_pp_to_equal_decode_pp),
        cmocka_unit_test(test_layout_heads_resolution),
        cmocka_unit_test(test_layout_rejects_invalid_params),
        cmocka_unit_test(test_layout_default_chunk_with_odd_page),
        cmocka_unit_test(test_layout_grid_floors_chunk_to_pages),
        cmocka_unit_test(test_layout_grid_two_page_sizes),
        cmocka_unit_test(test_layout_writer_rejects_out_of_range),
        cmocka_unit_test(test_layout_region_overflow_at_each_factor),
        cmocka_unit_test(test_layout_max_region_is_every_ranks_region),
        cmocka_unit_test(test_layout_lookups_check_each_argument),
        cmocka_unit_test(test_layout_path_names_round_trip),
        cmocka_unit_test(test_layout_dtypes),
        cmocka_unit_test(test_layout_fp8_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
