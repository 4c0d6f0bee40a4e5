/*
 * test_hybrid.c - the layout of hybrid models (src/hybrid.c) against
 * hand-worked cases: layer kinds of gpt-oss and Qwen3-Next; the window's
 * tokens, page-aligned; each writer's slots, state part and offsets for
 * P > D, P < D, P = D and with PP; the state heads' split over TP checked
 * head by head against the global heads each rank holds; a byte model of
 * whole transfers (gather, one block per writer, scatter) that checks
 * every KV slot and state byte, with planted bugs (state of the wrong head
 * or request slot, a window row from out of the window) caught; the same
 * with prefill context parallelism (CP 2 and 3: parts tiling each region,
 * the state from the CP rank of the last token, planted bugs caught);
 * every refusal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <kvstage/kvstage.h>

static kvs_layout_params_t gpt_oss(int64_t layers, int64_t p, int64_t d)
{
    return (kvs_layout_params_t){.total_heads = 8, .head_dim = 64, .layers = layers,
                                 .page_size = 16, .prefill_tp = p, .decode_tp = d,
                                 .chunk_tokens = 2048, .full_attn_every = 2,
                                 .other_layers = KVS_LAYER_WINDOW, .window_tokens = 128};
}

static kvs_layout_params_t qwen3_next(int64_t p, int64_t d)
{
    return (kvs_layout_params_t){.total_heads = 2, .head_dim = 256, .layers = 48,
                                 .page_size = 16, .prefill_tp = p, .decode_tp = d,
                                 .chunk_tokens = 8192, .full_attn_every = 4,
                                 .other_layers = KVS_LAYER_STATE, .state_heads = 16,
                                 .state_conv_bytes = 3072, .state_ssm_bytes = 65536};
}

static void test_hybrid_layer_kinds(void **state)
{
    (void)state;
    kvs_layout_t lay;
    kvs_layer_kind_t k;
    kvs_layout_params_t p = gpt_oss(36, 4, 2);
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    /* gpt-oss: layer 0 a window layer, layer 1 full, alternating */
    for (int64_t l = 0; l < 36; l++) {
        assert_int_equal(kvs_layout_layer_kind(&lay, l, &k), KVS_OK);
        assert_int_equal(k, l % 2 == 1 ? KVS_LAYER_FULL : KVS_LAYER_WINDOW);
    }
    assert_int_equal(kvs_layout_layer_kind(&lay, 36, &k), KVS_ERANGE);
    assert_int_equal(kvs_layout_layer_kind(&lay, -1, &k), KVS_ERANGE);
    assert_int_equal(kvs_layout_layer_kind(NULL, 0, &k), KVS_EINVAL);
    p = qwen3_next(8, 2);
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    /* Qwen3-Next: layers 3, 7, ..., 47 full, the others state */
    int64_t full = 0;
    for (int64_t l = 0; l < 48; l++) {
        assert_int_equal(kvs_layout_layer_kind(&lay, l, &k), KVS_OK);
        assert_int_equal(k, l % 4 == 3 ? KVS_LAYER_FULL : KVS_LAYER_STATE);
        full += k == KVS_LAYER_FULL;
    }
    assert_int_equal(full, 12);
    /* a layout of full layers alone */
    p = (kvs_layout_params_t){.total_heads = 8, .head_dim = 128, .layers = 4, .page_size = 16,
                              .prefill_tp = 2, .decode_tp = 1};
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(kvs_layout_layer_kind(&lay, 2, &k), KVS_OK);
    assert_int_equal(k, KVS_LAYER_FULL);
    /* names */
    assert_string_equal(kvs_layer_kind_name(KVS_LAYER_WINDOW), "window");
    assert_string_equal(kvs_layer_kind_name((kvs_layer_kind_t)9), "unknown");
    assert_int_equal(kvs_layer_kind_parse("state", &k), KVS_OK);
    assert_int_equal(k, KVS_LAYER_STATE);
    assert_int_equal(kvs_layer_kind_parse("mamba", &k), KVS_EINVAL);
}

static void test_hybrid_window_tokens_are_page_aligned(void **state)
{
    (void)state;
    kvs_layout_t lay;
    kvs_layout_params_t p = gpt_oss(24, 2, 2);
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    int64_t s, e;
    /* 10000 - 128 = 9872 = 617 pages of 16: already on a page */
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, 10000, &s, &e), KVS_OK);
    assert_int_equal(s, 9872);
    assert_int_equal(e, 10000);
    /* 1000 - 128 = 872 -> page 54 starts at 864: the page holding token 872 */
    assert_int_equal(kvs_layout_layer_tokens(&lay, 2, 1000, &s, &e), KVS_OK);
    assert_int_equal(s, 864);
    /* a request shorter than the window: all of it */
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, 100, &s, &e), KVS_OK);
    assert_int_equal(s, 0);
    assert_int_equal(e, 100);
    /* a full layer: all of it */
    assert_int_equal(kvs_layout_layer_tokens(&lay, 1, 1000, &s, &e), KVS_OK);
    assert_int_equal(s, 0);
    /* two page sizes: the unit is their lcm (16 and 48: 48) */
    p.decode_page_size = 48;
    p.chunk_tokens = 2304;
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, 1000, &s, &e), KVS_OK);
    assert_int_equal(s, 864); /* 872 / 48 = 18 -> 864 */
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, 1010, &s, &e), KVS_OK);
    assert_int_equal(s, 864); /* 882 / 48 = 18 */
    /* a state layer has no pages */
    p = qwen3_next(2, 2);
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, 1000, &s, &e), KVS_OK);
    assert_int_equal(s, 1000);
    assert_int_equal(e, 1000);
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, -1, &s, &e), KVS_EINVAL);
}

/* gpt-oss-120b P4 -> D8, page 16, G 2048, a request of 10000 tokens:
 * 1 head of 64 x 2 bytes = 128 bytes a row; 18 full + 18 window layers. */
static void test_hybrid_window_writer(void **state)
{
    (void)state;
    kvs_layout_t lay;
    kvs_layout_params_t p = gpt_oss(36, 4, 8);
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    kvs_hybrid_writer_t w;
    /* the last chunk, [8192, 10000): 1808 rows in every full slot, the
     * window's 128 (9872..) in every window slot */
    kvs_chunk_t c = {.index = 4, .token_start = 8192, .token_end = 10000};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 3, 0, 0, 10000, &c, &w), KVS_OK);
    assert_int_equal(w.w.prefill_rank, 1);
    assert_int_equal(w.w.heads.src_start, 1);
    assert_int_equal(w.full_slots, 18);
    assert_int_equal(w.window_slots, 18);
    assert_int_equal(w.window_token_start, 9872);
    assert_int_equal(w.window_tokens, 128);
    assert_int_equal(w.kv_bytes, (18 * 1808 + 18 * 128) * 128 * 2);
    assert_int_equal(w.state_bytes, 0);
    assert_int_equal(w.w.len_bytes, 8921088);
    /* an earlier chunk: no window slot at all */
    c = (kvs_chunk_t){.index = 3, .token_start = 6144, .token_end = 8192};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 3, 0, 0, 10000, &c, &w), KVS_OK);
    assert_int_equal(w.window_slots, 0);
    assert_int_equal(w.window_tokens, 0);
    assert_int_equal(w.w.len_bytes, 18 * 2048 * 128 * 2);
    /* a window across two chunks: 8200 tokens, window [8064, 8200) */
    c = (kvs_chunk_t){.index = 3, .token_start = 6144, .token_end = 8192};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 8200, &c, &w), KVS_OK);
    assert_int_equal(w.window_token_start, 8064);
    assert_int_equal(w.window_tokens, 128);
    c = (kvs_chunk_t){.index = 4, .token_start = 8192, .token_end = 8200};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 8200, &c, &w), KVS_OK);
    assert_int_equal(w.window_token_start, 8192);
    assert_int_equal(w.window_tokens, 8);
    assert_int_equal(w.w.len_bytes, (18 * 8 + 18 * 8) * 128 * 2);
    /* the largest region bounds every chunk's: 36 slots of G rows */
    assert_int_equal(kvs_layout_max_region_bytes(&lay), 36 * 2048 * 128 * 2);
    /* a hybrid layout's blocks need the chunk: the old call refuses */
    kvs_writer_t old;
    int64_t bytes;
    assert_int_equal(kvs_layout_writer(&lay, 0, 0, 0, 16, &old), KVS_ENOTSUP);
    assert_int_equal(kvs_layout_region_bytes(&lay, 0, 0, 16, &bytes), KVS_ENOTSUP);
    /* a chunk not inside the request */
    c = (kvs_chunk_t){.token_start = 9000, .token_end = 10001};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 10000, &c, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 10000, NULL, &w), KVS_EINVAL);
}

/* Qwen3-Next P8 -> D2, one 8192-token chunk that is the whole request:
 * 12 full layers of 1 head x 256 x 2 bytes, 36 state layers of 2 state
 * heads (16 / 8) of 68608 bytes. */
static void test_hybrid_state_writer(void **state)
{
    (void)state;
    kvs_layout_t lay;
    kvs_layout_params_t p = qwen3_next(8, 2);
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(lay.state_src_heads, 2);
    assert_int_equal(lay.state_dst_heads, 8);
    assert_int_equal(lay.state_head_bytes, 68608);
    /* decode 1's sources, prefill 4..7, all hold KV head 1: prefill 4
     * writes it with its state (writer 0); 5, 6, 7 write their state alone
     * (writers 1, 2, 3), after writer 0's block */
    assert_int_equal(lay.tp_writers, 4);
    kvs_hybrid_writer_t w;
    kvs_chunk_t c = {.token_start = 0, .token_end = 8192};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 1, 0, 0, 8192, &c, &w), KVS_OK);
    assert_int_equal(w.w.prefill_rank, 4);
    assert_int_equal(w.w.heads.num_heads, 1);
    assert_int_equal(w.full_slots, 12);
    assert_int_equal(w.kv_bytes, 12 * 8192 * 512 * 2);
    assert_int_equal(w.state_offset_bytes, w.kv_bytes);
    assert_int_equal(w.state_bytes, 36 * 2 * 68608);
    assert_int_equal(w.w.len_bytes, 105603072);
    assert_int_equal(w.w.offset_bytes, 0);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 1, 0, 3, 8192, &c, &w), KVS_OK);
    assert_int_equal(w.w.prefill_rank, 7);
    /* prefill 7 holds state heads 14, 15 = decode 1's local 6, 7 */
    assert_int_equal(w.state_heads.src_start, 0);
    assert_int_equal(w.state_heads.num_heads, 2);
    assert_int_equal(w.state_heads.dst_start, 6);
    assert_int_equal(w.w.heads.num_heads, 0);
    assert_int_equal(w.full_slots, 0);
    assert_int_equal(w.kv_bytes, 0);
    assert_int_equal(w.state_layers, 36);
    assert_int_equal(w.state_offset_bytes, 0);
    assert_int_equal(w.state_bytes, 36 * 2 * 68608);
    assert_int_equal(w.w.len_bytes, 36 * 2 * 68608);
    assert_int_equal(w.w.offset_bytes, 105603072 + 2 * 36 * 2 * 68608);
    /* its block has no KV slot, only its state slots */
    kvs_hybrid_slot_t sl;
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, 3, 0, &sl), KVS_ENOENT);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, 0, 0, &sl), KVS_OK);
    assert_int_equal(sl.offset_bytes, 0);
    /* the region: one KV head and 8 state heads, each once */
    int64_t region = 0;
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 1, 0, 3, 8192, &c, &w), KVS_OK);
    region = w.w.offset_bytes + w.w.len_bytes;
    assert_int_equal(region, 12 * 8192 * 512 * 2 + 36 * 8 * 68608);
    assert_int_equal(kvs_layout_max_region_bytes(&lay), region);
    /* a chunk that is not the last carries no state: writer 3 writes nothing */
    kvs_chunk_t first = {.token_start = 0, .token_end = 8192};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 1, 0, 3, 9000, &first, &w), KVS_OK);
    assert_int_equal(w.w.len_bytes, 0);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 1, 0, 0, 9000, &first, &w), KVS_OK);
    assert_int_equal(w.state_bytes, 0);
    assert_int_equal(w.w.len_bytes, 12 * 8192 * 512 * 2);
    /* the state slots: 36 layers x the side's state heads */
    int64_t bytes;
    assert_int_equal(kvs_layout_state_slot_bytes(&lay, KVS_ROLE_DECODE, 0, &bytes), KVS_OK);
    assert_int_equal(bytes, 36 * 8 * 68608);
    assert_int_equal(kvs_layout_state_slot_bytes(&lay, KVS_ROLE_PREFILL, 0, &bytes), KVS_OK);
    assert_int_equal(bytes, 36 * 2 * 68608);
    /* the largest region: the KV head once, 8 state heads (4 x 105603072 before) */
    assert_int_equal(kvs_layout_max_region_bytes(&lay), 105603072 + 3 * 36 * 2 * 68608);

    /* P2 -> D4: decode 3 holds state heads 12..15 = prefill 1's local 4..7 */
    p = qwen3_next(2, 4);
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 3, 0, 0, 100, &(kvs_chunk_t){0, 0, 7, 0, 100},
                                              &w), KVS_OK);
    assert_int_equal(w.w.prefill_rank, 1);
    assert_int_equal(w.state_heads.src_start, 4);
    assert_int_equal(w.state_heads.num_heads, 4);
    assert_int_equal(w.state_heads.dst_start, 0);

    /* PP 3 = 3: decode stage 1 holds layers 16..31: full 19, 23, 27, 31 */
    p = qwen3_next(2, 2);
    p.prefill_pp = p.decode_pp = 3;
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 1, 0, 100, &(kvs_chunk_t){0, 0, 7, 0, 100},
                                              &w), KVS_OK);
    assert_int_equal(w.full_slots, 4);
    assert_int_equal(w.state_layers, 12);
    assert_int_equal(w.state_bytes, 12 * 8 * 68608);
    assert_int_equal(w.kv_bytes, 4 * 100 * 2 * 256 * 2);
}

/* State heads fewer than prefill ranks are written once, by hand: H6 KV
 * heads and 4 state heads over P12 -> D2. A decode rank's six sources
 * hold KV heads in runs of 2 (KV writers at offsets 0, 2, 4) and state
 * heads in runs of 3 (state holders at offsets 0 and 3): offset 0 writes
 * KV and state, 2 and 4 KV alone, 3 its state alone, 1 and 5 only report.
 * Decode 1's sources in order: prefill 6, 8, 10 (KV), 9 (state), 7, 11. */
static void test_hybrid_state_replicas_written_once(void **state)
{
    (void)state;
    kvs_layout_params_t p = {.total_heads = 6, .head_dim = 2, .dtype = KVS_DTYPE_BF16,
                             .layers = 4, .page_size = 2, .prefill_tp = 12, .decode_tp = 2,
                             .chunk_tokens = 10, .full_attn_every = 2,
                             .other_layers = KVS_LAYER_STATE, .state_heads = 4,
                             .state_conv_bytes = 3, .state_ssm_bytes = 5};
    kvs_layout_t lay;
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(lay.tp_sources, 6);
    assert_int_equal(lay.tp_writers, 4);
    assert_int_equal(lay.expected_arrivals, 4);
    static const int64_t ranks[] = {6, 8, 10, 9, 7, 11};
    for (int64_t i = 0; i < 6; i++) {
        int64_t r = -1, back = -1;
        assert_int_equal(kvs_layout_source_rank(&lay, 1, i, &r), KVS_OK);
        assert_int_equal(r, ranks[i]);
        assert_int_equal(kvs_layout_source_index(&lay, r, 1, &back), KVS_OK);
        assert_int_equal(back, i);
    }
    int64_t wi = -1;
    assert_int_equal(kvs_layout_writer_index(&lay, 7, 1, &wi), KVS_ENOENT);
    assert_int_equal(kvs_layout_writer_index(&lay, 9, 1, &wi), KVS_OK);
    assert_int_equal(wi, 3);
    /* the last chunk of a 10-token request: 2 full layers of 10 rows x 1
     * head x 4 bytes per plane = 160 bytes of KV a writer; 2 state layers
     * x 1 state head (of 2 a decode rank holds) x 8 bytes = 16 of state */
    const kvs_chunk_t c = {.token_start = 0, .token_end = 10};
    static const struct {
        int64_t offset, len, state_bytes, state_dst;
    } want[] = {{0, 176, 16, 0}, {176, 160, 0, -1}, {336, 160, 0, -1}, {496, 16, 16, 1}};
    for (int64_t i = 0; i < 4; i++) {
        kvs_hybrid_writer_t w;
        assert_int_equal(kvs_layout_hybrid_writer(&lay, 1, 0, i, 10, &c, &w), KVS_OK);
        assert_int_equal(w.w.prefill_rank, ranks[i]);
        assert_int_equal(w.w.offset_bytes, want[i].offset);
        assert_int_equal(w.w.len_bytes, want[i].len);
        assert_int_equal(w.state_bytes, want[i].state_bytes);
        if (want[i].state_dst >= 0)
            assert_int_equal(w.state_heads.dst_start, want[i].state_dst);
        else
            assert_int_equal(w.state_heads.num_heads, 0);
    }
    assert_int_equal(kvs_layout_max_region_bytes(&lay), 512);
}

/* Prefill PP 2 into a decode of PP 1, worked out by hand: 4 KV heads of
 * head dim 2 in bf16 (4 bytes a head), P2 -> D1 (writers 0 and 1, two
 * heads each: 8 bytes a token row), 8 layers with full layers 3 and 7, the
 * others state layers of 4 state heads of 3 + 5 bytes (two heads, 16 bytes
 * a layer, per writer). Stage 0 holds layers 0..3, stage 1 layers 4..7:
 * each writer block is stage 0's part then stage 1's, each [K slot | V
 * slot | 3 states], so each stage writes one span. */
static void test_hybrid_parts_by_hand(void **state)
{
    (void)state;
    kvs_layout_params_t p = {.total_heads = 4, .head_dim = 2, .dtype = KVS_DTYPE_BF16,
                             .layers = 8, .page_size = 2, .prefill_tp = 2, .decode_tp = 1,
                             .prefill_pp = 2, .decode_pp = 1, .chunk_tokens = 10,
                             .full_attn_every = 4, .other_layers = KVS_LAYER_STATE,
                             .state_heads = 4, .state_conv_bytes = 3, .state_ssm_bytes = 5};
    kvs_layout_t lay;
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(lay.tp_writers, 2);
    assert_int_equal(lay.expected_arrivals, 4);
    kvs_hybrid_writer_t w;
    kvs_hybrid_part_t hp;
    kvs_hybrid_slot_t sl;
    /* the request's last chunk, tokens [0, 10): 80 bytes of a K slot */
    kvs_chunk_t c = {.token_start = 0, .token_end = 10};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 1, 10, &c, &w), KVS_OK);
    assert_int_equal(w.w.len_bytes, 416);
    assert_int_equal(w.w.offset_bytes, 416);
    assert_int_equal(w.state_offset_bytes, 160);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 0, 0, &hp), KVS_OK);
    assert_int_equal(hp.first_layer, 0);
    assert_int_equal(hp.num_layers, 4);
    assert_int_equal(hp.offset_bytes, 0);
    assert_int_equal(hp.kv_bytes, 160);
    assert_int_equal(hp.state_bytes, 48);
    assert_int_equal(hp.len_bytes, 208);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 0, 1, &hp), KVS_OK);
    assert_int_equal(hp.first_layer, 4);
    assert_int_equal(hp.offset_bytes, 208);
    assert_int_equal(hp.len_bytes, 208);
    static const struct {
        int64_t layer, plane, offset, len;
    } slots[] = {{3, 0, 0, 80},   {3, 1, 80, 80},   {0, 0, 160, 16}, {1, 0, 176, 16},
                 {2, 0, 192, 16}, {7, 0, 208, 80},  {7, 1, 288, 80}, {4, 0, 368, 16},
                 {5, 0, 384, 16}, {6, 0, 400, 16}};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, slots[i].layer, slots[i].plane,
                                                &sl), KVS_OK);
        assert_int_equal(sl.offset_bytes, slots[i].offset);
        assert_int_equal(sl.len_bytes, slots[i].len);
    }
    /* a chunk before the last: no state, stage 1's part right after stage
     * 0's K and V slots */
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 20, &c, &w), KVS_OK);
    assert_int_equal(w.w.len_bytes, 320);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 0, 1, &hp), KVS_OK);
    assert_int_equal(hp.offset_bytes, 160);
    assert_int_equal(hp.state_bytes, 0);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, 7, 1, &sl), KVS_OK);
    assert_int_equal(sl.offset_bytes, 240);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, 4, 0, &sl), KVS_ENOENT);
    /* arguments */
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 0, 2, &hp), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 1, 0, &hp), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_part(&lay, NULL, 0, 0, &hp), KVS_EINVAL);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 0, 0, NULL), KVS_EINVAL);
    /* a draft of 1 layer (Qwen3-Next's MTP) ends the last prefill stage's
     * part: 10 rows x 2 heads x 4 bytes, K and V, after its state */
    p.draft_layers = 1;
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    c = (kvs_chunk_t){.token_start = 0, .token_end = 10};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 1, 10, &c, &w), KVS_OK);
    assert_int_equal(w.draft_bytes, 160);
    assert_int_equal(w.w.len_bytes, 576);
    assert_int_equal(w.w.offset_bytes, 576);
    assert_int_equal(w.draft_offset_bytes, 416);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 0, 0, &hp), KVS_OK);
    assert_int_equal(hp.draft_bytes, 0);
    assert_int_equal(hp.len_bytes, 208);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 0, 1, &hp), KVS_OK);
    assert_int_equal(hp.draft_bytes, 160);
    assert_int_equal(hp.len_bytes, 368);
    assert_int_equal(kvs_layout_max_region_bytes(&lay), 2 * 576);
    p.draft_layers = 0;
    /* with the same PP on both sides a stage's part is the whole block */
    p.decode_pp = 2;
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 1, 0, 10, &c, &w), KVS_OK);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 1, 1, &hp), KVS_OK);
    assert_int_equal(hp.offset_bytes, 0);
    assert_int_equal(hp.len_bytes, w.w.len_bytes);
    assert_int_equal(kvs_layout_hybrid_part(&lay, &w, 1, 0, &hp), KVS_ENOENT);
}

/* Checks that decode rank d's writers give each of its state heads exactly
 * once, from a prefill rank holding that same global head; shift (a planted
 * bug) moves one writer's heads by one. Returns the number of wrong heads. */
static int check_state_cover(const kvs_layout_t *lay, int64_t d, int shift)
{
    int wrong = 0;
    int seen[64] = {0};
    const int64_t h = lay->state_heads;
    for (int64_t i = 0; i < lay->tp_writers; i++) {
        kvs_hybrid_writer_t w;
        if (kvs_layout_hybrid_writer(lay, d, 0, i, 16, &(kvs_chunk_t){0, 0, 1, 0, 16}, &w) !=
            KVS_OK)
            return 1000;
        const int64_t r = w.w.prefill_rank;
        if (shift && i == lay->tp_writers - 1)
            w.state_heads.dst_start = (w.state_heads.dst_start + 1) % lay->state_dst_heads;
        for (int64_t j = 0; j < w.state_heads.num_heads; j++) {
            /* global heads: rank r holds [r * n / rep ...) with replication */
            const int64_t src_global =
                h >= lay->prefill_tp ? r * lay->state_src_heads + w.state_heads.src_start + j
                                     : r / (lay->prefill_tp / h);
            const int64_t dst_global =
                h >= lay->decode_tp ? d * lay->state_dst_heads + w.state_heads.dst_start + j
                                    : d / (lay->decode_tp / h);
            const int64_t local = w.state_heads.dst_start + j;
            if (src_global != dst_global || local >= lay->state_dst_heads)
                wrong++;
            else
                seen[local]++;
        }
    }
    for (int64_t j = 0; j < lay->state_dst_heads; j++)
        wrong += seen[j] != 1 && h >= lay->prefill_tp;
    return wrong;
}

static void test_hybrid_state_heads_cover_every_decode_head(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        /* state heads, P, D */
        {16, 8, 2}, {16, 2, 8}, {16, 4, 4}, {16, 16, 1}, {16, 1, 16}, {4, 8, 2}, {4, 2, 8},
        {8, 4, 2}, {32, 8, 1},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        kvs_layout_params_t p = qwen3_next(shapes[s][1], shapes[s][2]);
        p.total_heads = 16;
        p.state_heads = shapes[s][0];
        kvs_layout_t lay;
        assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
        for (int64_t d = 0; d < lay.decode_tp; d++) {
            if (check_state_cover(&lay, d, 0) != 0)
                fail_msg("state heads %lld P%lld D%lld: decode %lld gets a wrong head",
                         (long long)shapes[s][0], (long long)shapes[s][1],
                         (long long)shapes[s][2], (long long)d);
        }
        /* the planted wrong head is caught wherever a decode rank holds
         * more than one state head */
        if (lay.state_dst_heads > 1 && lay.state_heads >= lay.prefill_tp)
            assert_true(check_state_cover(&lay, 0, 1) > 0);
    }
}

/* A byte model of a hybrid transfer, on the planner alone: every prefill
 * stage of every prefill rank gathers each chunk's rows and (last chunk)
 * state of its layers into a staging buffer of its part of the writer block
 * (kvs_layout_hybrid_part), at the slot's place less the part's offset, and
 * writes the part at its offset; the parts must tile the block. Every
 * decode rank scatters its region into its KV pool and into the request's
 * state slot; then every KV slot of a full layer, every in-window slot of a
 * window layer (and none out of it) and every state byte is checked. A bug
 * planted in the model's scatter or gather must be caught (BUG_PART_OFFSET:
 * a stage gathers at the slot's offset in the whole block, the part's
 * offset not taken off; the bytes past its buffer are lost). */
enum { BUG_NONE, BUG_STATE_HEAD, BUG_STATE_SLOT, BUG_WINDOW_ROW, BUG_PART_OFFSET };

#define M_TOKENS 200
#define M_SLOTS 4

static uint8_t kv_value(int64_t req, int64_t layer, int64_t plane, int64_t head, int64_t t,
                        int64_t b)
{
    return (uint8_t)(1 + (req * 131 + layer * 31 + plane * 17 + head * 7 + t * 3 + b) % 251);
}

static uint8_t state_value(int64_t req, int64_t layer, int64_t head, int64_t b)
{
    return (uint8_t)(1 + (req * 101 + layer * 29 + head * 13 + b * 5 + 77) % 251);
}

/* Global head of local head j on a rank of a side with `tp` ranks holding
 * `per` heads each of `heads` (replicated when heads < tp). */
static int64_t global_head(int64_t heads, int64_t tp, int64_t per, int64_t rank, int64_t j)
{
    return heads >= tp ? rank * per + j : rank / (tp / heads);
}

/* Runs requests of the given token counts through the model; returns the
 * wrong bytes found. */
static int64_t run_model(const kvs_layout_t *lay, const int64_t *totals, int64_t nreq, int bug)
{
    const int64_t hb = lay->head_dim * lay->elem_bytes;
    const int64_t nh = lay->dst_heads, snh = lay->state_dst_heads;
    const int64_t kv_bytes = lay->decode_tp * lay->layers * lay->planes * M_TOKENS * nh * hb;
    const int64_t st_bytes = lay->decode_tp * M_SLOTS * lay->layers * (snh > 0 ? snh : 1) *
                             (lay->state_head_bytes > 0 ? lay->state_head_bytes : 1);
    uint8_t *kv = test_malloc((size_t)kv_bytes);
    uint8_t *st = test_malloc((size_t)st_bytes);
    int64_t wrong = 0;
#define KV_AT(d, l, q, t, k) \
    (kv + ((((((d) * lay->layers + (l)) * lay->planes + (q)) * M_TOKENS + (t)) * nh + (k)) * hb))
#define ST_AT(d, slot, l, k) \
    (st + (((((d) * M_SLOTS + (slot)) * lay->layers + (l)) * snh + (k)) * lay->state_head_bytes))
    for (int64_t req = 0; req < nreq; req++) {
        const int64_t total = totals[req], slot = (req * 3 + 1) % M_SLOTS;
        memset(kv, 0, (size_t)kv_bytes);
        memset(st, 0, (size_t)st_bytes);
        const int64_t pages = (total + lay->decode_page_size - 1) / lay->decode_page_size;
        const int64_t nchunks = kvs_grid_num_chunks(lay, pages);
        for (int64_t c = 0; c < nchunks; c++) {
            kvs_chunk_t ch;
            assert_int_equal(kvs_grid_chunk(lay, 0, total, c, &ch), KVS_OK);
            for (int64_t d = 0; d < lay->decode_tp; d++) {
                for (int64_t e = 0; e < lay->decode_pp; e++) {
                    int64_t first, n;
                    assert_int_equal(kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, e, &first,
                                                             &n), KVS_OK);
                    for (int64_t i = 0; i < lay->tp_writers; i++) {
                        kvs_hybrid_writer_t w;
                        assert_int_equal(kvs_layout_hybrid_writer(lay, d, e, i, total, &ch, &w),
                                         KVS_OK);
                        uint8_t *blk = test_calloc(1, (size_t)w.w.len_bytes + 1);
                        const int64_t r = w.w.prefill_rank;
                        /* gather: each prefill stage, the rows and state of
                         * its layers into its part, written at the part's
                         * offset; the parts tile the block in stage order */
                        int64_t part_at = 0, layer_at = first;
                        for (int64_t s = 0; s < lay->prefill_pp; s++) {
                            kvs_hybrid_part_t hp;
                            const int prc = kvs_layout_hybrid_part(lay, &w, e, s, &hp);
                            if (prc == KVS_ENOENT)
                                continue;
                            assert_int_equal(prc, KVS_OK);
                            assert_int_equal(hp.offset_bytes, part_at);
                            assert_int_equal(hp.first_layer, layer_at);
                            assert_int_equal(hp.len_bytes, hp.kv_bytes + hp.state_bytes);
                            part_at += hp.len_bytes;
                            layer_at += hp.num_layers;
                            uint8_t *buf = test_calloc(1, (size_t)hp.len_bytes + 1);
                            const int64_t shift = bug == BUG_PART_OFFSET ? 0 : hp.offset_bytes;
                            for (int64_t l = hp.first_layer; l < hp.first_layer + hp.num_layers;
                                 l++) {
                                for (int64_t q = 0; q < lay->planes; q++) {
                                    kvs_hybrid_slot_t sl;
                                    const int rc = kvs_layout_hybrid_slot(lay, &w, e, l, q, &sl);
                                    if (rc == KVS_ENOENT)
                                        continue;
                                    assert_int_equal(rc, KVS_OK);
                                    assert_true(sl.offset_bytes >= hp.offset_bytes &&
                                                sl.offset_bytes + sl.len_bytes <=
                                                    hp.offset_bytes + hp.len_bytes);
                                    const int64_t at = sl.offset_bytes - shift;
                                    if (at + sl.len_bytes > hp.len_bytes)
                                        continue; /* past the stage's buffer: lost */
                                    if (sl.kind == KVS_LAYER_STATE) {
                                        for (int64_t j = 0; j < w.state_heads.num_heads; j++) {
                                            const int64_t g = global_head(
                                                lay->state_heads, lay->prefill_tp,
                                                lay->state_src_heads, r,
                                                w.state_heads.src_start + j);
                                            for (int64_t b = 0; b < lay->state_head_bytes; b++)
                                                buf[at + j * lay->state_head_bytes + b] =
                                                    state_value(req, l, g, b);
                                        }
                                        continue;
                                    }
                                    for (int64_t t = 0; t < sl.rows; t++) {
                                        int64_t tok = sl.token_start + t;
                                        if (bug == BUG_WINDOW_ROW &&
                                            sl.kind == KVS_LAYER_WINDOW && t == 0 &&
                                            tok >= lay->window_tokens)
                                            tok -= lay->window_tokens; /* out of the window */
                                        for (int64_t j = 0; j < w.w.heads.num_heads; j++) {
                                            const int64_t g = global_head(
                                                lay->total_heads, lay->prefill_tp,
                                                lay->src_heads, r, w.w.heads.src_start + j);
                                            for (int64_t b = 0; b < hb; b++)
                                                buf[at + (t * w.w.heads.num_heads + j) * hb + b] =
                                                    kv_value(req, l, q, g, tok, b);
                                        }
                                    }
                                }
                            }
                            memcpy(blk + hp.offset_bytes, buf, (size_t)hp.len_bytes);
                            test_free(buf);
                        }
                        assert_int_equal(part_at, w.w.len_bytes);
                        assert_int_equal(layer_at, first + n);
                        /* scatter: into the decode's pool and state slot */
                        for (int64_t l = first; l < first + n; l++) {
                            for (int64_t q = 0; q < lay->planes; q++) {
                                kvs_hybrid_slot_t sl;
                                if (kvs_layout_hybrid_slot(lay, &w, e, l, q, &sl) != KVS_OK)
                                    continue;
                                if (sl.kind == KVS_LAYER_STATE) {
                                    const int64_t to = bug == BUG_STATE_SLOT
                                                           ? (slot + 1) % M_SLOTS : slot;
                                    for (int64_t j = 0; j < w.state_heads.num_heads; j++) {
                                        int64_t k = w.state_heads.dst_start + j;
                                        if (bug == BUG_STATE_HEAD)
                                            k = (k + 1) % snh;
                                        memcpy(ST_AT(d, to, l, k),
                                               blk + sl.offset_bytes +
                                                   j * lay->state_head_bytes,
                                               (size_t)lay->state_head_bytes);
                                    }
                                    continue;
                                }
                                for (int64_t t = 0; t < sl.rows; t++)
                                    for (int64_t j = 0; j < w.w.heads.num_heads; j++)
                                        memcpy(KV_AT(d, l, q, sl.token_start + t,
                                                     w.w.heads.dst_start + j),
                                               blk + sl.offset_bytes +
                                                   (t * w.w.heads.num_heads + j) * hb,
                                               (size_t)hb);
                            }
                        }
                        test_free(blk);
                    }
                }
            }
        }
        /* check every decode rank's pool and its state slot */
        for (int64_t d = 0; d < lay->decode_tp; d++) {
            for (int64_t l = 0; l < lay->layers; l++) {
                kvs_layer_kind_t kind;
                int64_t ws, we;
                assert_int_equal(kvs_layout_layer_kind(lay, l, &kind), KVS_OK);
                assert_int_equal(kvs_layout_layer_tokens(lay, l, total, &ws, &we), KVS_OK);
                if (kind == KVS_LAYER_STATE) {
                    for (int64_t k = 0; k < snh; k++) {
                        const int64_t g = global_head(lay->state_heads, lay->decode_tp,
                                                      lay->state_dst_heads, d, k);
                        for (int64_t b = 0; b < lay->state_head_bytes; b++)
                            wrong += ST_AT(d, slot, l, k)[b] != state_value(req, l, g, b);
                    }
                    continue;
                }
                for (int64_t q = 0; q < lay->planes; q++)
                    for (int64_t t = 0; t < total; t++)
                        for (int64_t k = 0; k < nh; k++) {
                            const int64_t g = global_head(lay->total_heads, lay->decode_tp,
                                                          lay->dst_heads, d, k);
                            for (int64_t b = 0; b < hb; b++) {
                                const uint8_t want =
                                    t >= ws ? kv_value(req, l, q, g, t, b) : 0;
                                wrong += KV_AT(d, l, q, t, k)[b] != want;
                            }
                        }
            }
        }
    }
#undef KV_AT
#undef ST_AT
    test_free(kv);
    test_free(st);
    return wrong;
}

static void test_hybrid_byte_model_moves_every_slot_and_state_byte(void **state)
{
    (void)state;
    /* P > D, P < D, P = D, replicated heads, PP (Dp 1 and Dp = Pp), two
     * page sizes; window and state layers */
    static const struct {
        int64_t p, d, pp, dp, every, window, sheads, ps, dps;
    } shapes[] = {
        {4, 2, 1, 1, 2, 12, 0, 4, 0},  {2, 4, 1, 1, 2, 12, 0, 4, 0},
        {2, 2, 1, 1, 3, 20, 0, 4, 0},  {4, 2, 2, 1, 2, 12, 0, 4, 0},
        {2, 4, 2, 2, 2, 12, 0, 4, 8},  {8, 2, 1, 1, 2, 12, 0, 4, 0},
        {4, 2, 1, 1, 4, 0, 8, 4, 0},   {2, 4, 1, 1, 4, 0, 8, 4, 0},
        {2, 2, 1, 1, 4, 0, 8, 4, 0},   {4, 2, 2, 2, 4, 0, 8, 4, 0},
        {2, 4, 2, 1, 3, 0, 2, 4, 8},   {8, 1, 1, 1, 2, 0, 4, 4, 0},
        /* prefill PP into a decode of PP 1: a part per prefill stage,
         * uneven stages, stages without a full layer (no bytes before the
         * last chunk), replicated KV and state heads */
        {2, 1, 3, 1, 4, 0, 8, 4, 0},   {8, 1, 4, 1, 4, 0, 4, 4, 0},
        {4, 2, 4, 1, 3, 0, 2, 4, 8},   {2, 4, 3, 1, 2, 12, 0, 4, 8},
        {8, 2, 2, 1, 4, 0, 8, 8, 4},
    };
    static const int64_t totals[] = {5, 37, 64, 150};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        kvs_layout_params_t p = {.total_heads = 4, .head_dim = 2, .dtype = KVS_DTYPE_BF16,
                                 .layers = 8, .page_size = shapes[s].ps,
                                 .decode_page_size = shapes[s].dps,
                                 .prefill_tp = shapes[s].p, .decode_tp = shapes[s].d,
                                 .prefill_pp = shapes[s].pp, .decode_pp = shapes[s].dp,
                                 .chunk_tokens = 32, .full_attn_every = shapes[s].every};
        if (shapes[s].window > 0) {
            p.other_layers = KVS_LAYER_WINDOW;
            p.window_tokens = shapes[s].window;
        } else {
            p.other_layers = KVS_LAYER_STATE;
            p.state_heads = shapes[s].sheads;
            p.state_conv_bytes = 3;
            p.state_ssm_bytes = 5;
        }
        kvs_layout_t lay;
        assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
        const int64_t bad = run_model(&lay, totals, 4, BUG_NONE);
        if (bad != 0)
            fail_msg("shape %zu: %lld wrong bytes", s, (long long)bad);
        /* the planted bugs of this kind of layer are caught */
        if (lay.prefill_pp > 1 && lay.decode_pp == 1)
            assert_true(run_model(&lay, totals, 4, BUG_PART_OFFSET) > 0);
        if (shapes[s].window > 0) {
            assert_true(run_model(&lay, totals, 4, BUG_WINDOW_ROW) > 0);
        } else {
            if (lay.state_dst_heads > 1)
                assert_true(run_model(&lay, totals, 4, BUG_STATE_HEAD) > 0);
            assert_true(run_model(&lay, totals, 4, BUG_STATE_SLOT) > 0);
        }
    }
}

/* The same transfer with prefill context parallelism, whole requests on
 * the planner alone: CP rank c's pool holds the rows of its range only
 * (zeros elsewhere) and a state that is final only on the CP rank whose
 * range holds the request's last token (the others hold the partial state
 * of their range, LASP-style). Every (CP rank, TP writer) gathers its rows
 * of its part into the region where kvs_layout_cp_part and
 * kvs_layout_hybrid_slot say; the decode scatters each part. Every region
 * byte must be written exactly once (parts, blocks and slots tile it),
 * every decode slot in the window and every state byte right, a KV slot
 * (heads not replicated) written once, and a decode rank's state carried
 * by exactly one part of the request. Planted bugs: the state gathered
 * from the next CP rank, a part's window rows counted from the chunk's
 * start instead of the part's. */
enum { CPBUG_NONE, CPBUG_STATE_RANK, CPBUG_WINDOW_SHIFT };

/* The state byte CP rank c holds: the final state on the owner, a partial
 * one (another byte) elsewhere. */
static uint8_t cp_state_value(int64_t req, int64_t layer, int64_t head, int64_t b, bool owner)
{
    const uint8_t v = state_value(req, layer, head, b);
    return owner ? v : (uint8_t)(v % 250 + 2);
}

static int64_t run_cp_model(const kvs_layout_t *lay, const int64_t *totals, int64_t nreq,
                            int bug)
{
    const int64_t hb = lay->head_dim * lay->elem_bytes, cp = lay->prefill_cp;
    const int64_t nh = lay->dst_heads, snh = lay->state_dst_heads > 0 ? lay->state_dst_heads : 1;
    const int64_t shb = lay->state_head_bytes > 0 ? lay->state_head_bytes : 1;
    const int64_t kv_bytes = lay->decode_tp * lay->layers * lay->planes * M_TOKENS * nh * hb;
    const int64_t st_bytes = lay->decode_tp * lay->layers * snh * shb;
    const bool once = lay->prefill_tp <= lay->total_heads; /* no replicated KV head */
    uint8_t *kv = test_malloc((size_t)kv_bytes), *kvn = test_malloc((size_t)kv_bytes);
    uint8_t *st = test_malloc((size_t)st_bytes);
    int64_t wrong = 0;
#define KV_OFF(d, l, q, t, k) \
    (((((((d) * lay->layers + (l)) * lay->planes + (q)) * M_TOKENS + (t)) * nh + (k)) * hb))
#define ST_AT(d, l, k) (st + ((((d) * lay->layers + (l)) * snh + (k)) * shb))
    for (int64_t req = 0; req < nreq; req++) {
        const int64_t total = totals[req];
        int64_t owner = 0, cs = 0, ce = 0;
        for (int64_t c = 0; c < cp; c++) {
            assert_int_equal(kvs_layout_cp_range(lay, total, c, &cs, &ce), KVS_OK);
            if (cs < ce && ce == total)
                owner = c;
        }
        memset(kv, 0, (size_t)kv_bytes);
        memset(kvn, 0, (size_t)kv_bytes);
        memset(st, 0, (size_t)st_bytes);
        const int64_t pages = (total + lay->decode_page_size - 1) / lay->decode_page_size;
        const int64_t nchunks = kvs_grid_num_chunks(lay, pages);
        for (int64_t d = 0; d < lay->decode_tp; d++) {
            for (int64_t e = 0; e < lay->decode_pp; e++) {
                int64_t first, n, state_parts = 0;
                assert_int_equal(kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, e, &first, &n),
                                 KVS_OK);
                for (int64_t ci = 0; ci < nchunks; ci++) {
                    kvs_chunk_t ch;
                    kvs_hybrid_writer_t whole;
                    assert_int_equal(kvs_grid_chunk(lay, 0, total, ci, &ch), KVS_OK);
                    /* the region: as without CP, the same bytes */
                    assert_int_equal(kvs_layout_hybrid_writer(lay, d, e, lay->tp_writers - 1,
                                                              total, &ch, &whole), KVS_OK);
                    const int64_t region = whole.w.offset_bytes + whole.w.len_bytes;
                    uint8_t *reg = test_calloc(1, (size_t)region + 1);
                    uint8_t *cnt = test_calloc(1, (size_t)region + 1);
                    int64_t parts = 0;
                    kvs_cp_part_t part[8];
                    for (int64_t c = 0; c < cp; c++) {
                        kvs_cp_part_t pt;
                        const int rc = kvs_layout_cp_part(lay, d, e, total, &ch, c, &pt);
                        if (rc == KVS_ENOENT)
                            continue;
                        assert_int_equal(rc, KVS_OK);
                        assert_true(pt.offset_bytes + pt.len_bytes <= region);
                        part[parts++] = pt;
                        assert_int_equal(kvs_layout_cp_range(lay, total, c, &cs, &ce), KVS_OK);
                        for (int64_t i = 0; i < lay->tp_writers; i++) {
                            kvs_hybrid_writer_t w;
                            const kvs_chunk_t pc = {.token_start = pt.token_start,
                                                    .token_end = pt.token_end};
                            assert_int_equal(kvs_layout_hybrid_writer(lay, d, e, i, total, &pc,
                                                                      &w), KVS_OK);
                            assert_true(w.w.offset_bytes + w.w.len_bytes <= pt.len_bytes);
                            uint8_t *blk = reg + pt.offset_bytes + w.w.offset_bytes;
                            uint8_t *bcnt = cnt + pt.offset_bytes + w.w.offset_bytes;
                            const int64_t r = w.w.prefill_rank;
                            for (int64_t l = first; l < first + n; l++)
                                for (int64_t q = 0; q < lay->planes; q++) {
                                    kvs_hybrid_slot_t sl;
                                    const int src = kvs_layout_hybrid_slot(lay, &w, e, l, q, &sl);
                                    if (src == KVS_ENOENT)
                                        continue;
                                    assert_int_equal(src, KVS_OK);
                                    assert_true(sl.offset_bytes + sl.len_bytes <= w.w.len_bytes);
                                    for (int64_t k = 0; k < sl.len_bytes; k++)
                                        bcnt[sl.offset_bytes + k]++;
                                    if (sl.kind == KVS_LAYER_STATE) {
                                        /* from the CP rank's own state (LASP: final on
                                         * the owner alone) */
                                        const int64_t from = bug == CPBUG_STATE_RANK
                                                                 ? (c + 1) % cp : c;
                                        for (int64_t j = 0; j < w.state_heads.num_heads; j++) {
                                            const int64_t g = global_head(
                                                lay->state_heads, lay->prefill_tp,
                                                lay->state_src_heads, r,
                                                w.state_heads.src_start + j);
                                            for (int64_t b = 0; b < lay->state_head_bytes; b++)
                                                blk[sl.offset_bytes +
                                                    j * lay->state_head_bytes + b] =
                                                    cp_state_value(req, l, g, b, from == owner);
                                        }
                                        continue;
                                    }
                                    for (int64_t t = 0; t < sl.rows; t++) {
                                        int64_t tok = sl.token_start + t;
                                        if (bug == CPBUG_WINDOW_SHIFT &&
                                            sl.kind == KVS_LAYER_WINDOW)
                                            tok -= pt.token_start - ch.token_start;
                                        for (int64_t j = 0; j < w.w.heads.num_heads; j++) {
                                            const int64_t g = global_head(
                                                lay->total_heads, lay->prefill_tp,
                                                lay->src_heads, r, w.w.heads.src_start + j);
                                            /* CP rank c's pool: its range's rows only */
                                            for (int64_t b = 0; b < hb; b++)
                                                blk[sl.offset_bytes +
                                                    (t * w.w.heads.num_heads + j) * hb + b] =
                                                    tok >= cs && tok < ce
                                                        ? kv_value(req, l, q, g, tok, b) : 0;
                                        }
                                    }
                                }
                        }
                    }
                    /* the parts' count is what the decode waits for */
                    int64_t fcp = -1, ncp = 0;
                    assert_int_equal(kvs_layout_cp_writers(lay, total, &ch, &fcp, &ncp), KVS_OK);
                    assert_int_equal(ncp, parts);
                    assert_int_equal(fcp, part[0].cp_rank);
                    assert_int_equal(kvs_layout_chunk_arrivals(lay, total, &ch),
                                     parts * lay->expected_arrivals);
                    for (int64_t k = 0; k < region; k++)
                        wrong += cnt[k] != 1; /* the parts tile the region */
                    /* scatter: each part's writer blocks, from its offset */
                    for (int64_t pi = 0; pi < parts; pi++) {
                        const kvs_chunk_t pc = {.token_start = part[pi].token_start,
                                                .token_end = part[pi].token_end};
                        bool has_state = false;
                        for (int64_t i = 0; i < lay->tp_writers; i++) {
                            kvs_hybrid_writer_t w;
                            assert_int_equal(kvs_layout_hybrid_writer(lay, d, e, i, total, &pc,
                                                                      &w), KVS_OK);
                            const uint8_t *blk = reg + part[pi].offset_bytes + w.w.offset_bytes;
                            has_state = has_state || w.state_bytes > 0;
                            for (int64_t l = first; l < first + n; l++)
                                for (int64_t q = 0; q < lay->planes; q++) {
                                    kvs_hybrid_slot_t sl;
                                    if (kvs_layout_hybrid_slot(lay, &w, e, l, q, &sl) != KVS_OK)
                                        continue;
                                    if (sl.kind == KVS_LAYER_STATE) {
                                        for (int64_t j = 0; j < w.state_heads.num_heads; j++)
                                            memcpy(ST_AT(d, l, w.state_heads.dst_start + j),
                                                   blk + sl.offset_bytes +
                                                       j * lay->state_head_bytes,
                                                   (size_t)lay->state_head_bytes);
                                        continue;
                                    }
                                    for (int64_t t = 0; t < sl.rows; t++)
                                        for (int64_t j = 0; j < w.w.heads.num_heads; j++) {
                                            const int64_t o =
                                                KV_OFF(d, l, q, sl.token_start + t,
                                                       w.w.heads.dst_start + j);
                                            memcpy(kv + o,
                                                   blk + sl.offset_bytes +
                                                       (t * w.w.heads.num_heads + j) * hb,
                                                   (size_t)hb);
                                            kvn[o]++;
                                        }
                                }
                        }
                        state_parts += has_state;
                    }
                    test_free(reg);
                    test_free(cnt);
                }
                int64_t sfirst = 0, scount = 0;
                (void)kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, e, &sfirst, &scount);
                int64_t st_layers = 0;
                for (int64_t l = sfirst; l < sfirst + scount; l++) {
                    kvs_layer_kind_t kind;
                    assert_int_equal(kvs_layout_layer_kind(lay, l, &kind), KVS_OK);
                    st_layers += kind == KVS_LAYER_STATE;
                }
                wrong += state_parts != (st_layers > 0 ? 1 : 0); /* the state once */
            }
        }
        /* check every decode rank's pool and state */
        for (int64_t d = 0; d < lay->decode_tp; d++)
            for (int64_t l = 0; l < lay->layers; l++) {
                kvs_layer_kind_t kind;
                int64_t ws, we;
                assert_int_equal(kvs_layout_layer_kind(lay, l, &kind), KVS_OK);
                assert_int_equal(kvs_layout_layer_tokens(lay, l, total, &ws, &we), KVS_OK);
                if (kind == KVS_LAYER_STATE) {
                    for (int64_t k = 0; k < lay->state_dst_heads; k++) {
                        const int64_t g = global_head(lay->state_heads, lay->decode_tp,
                                                      lay->state_dst_heads, d, k);
                        for (int64_t b = 0; b < lay->state_head_bytes; b++)
                            wrong += ST_AT(d, l, k)[b] != state_value(req, l, g, b);
                    }
                    continue;
                }
                for (int64_t q = 0; q < lay->planes; q++)
                    for (int64_t t = 0; t < total; t++)
                        for (int64_t k = 0; k < nh; k++) {
                            const int64_t g = global_head(lay->total_heads, lay->decode_tp,
                                                          lay->dst_heads, d, k);
                            const int64_t o = KV_OFF(d, l, q, t, k);
                            if (once)
                                wrong += kvn[o] != (t >= ws ? 1 : 0);
                            for (int64_t b = 0; b < hb; b++)
                                wrong += kv[o + b] !=
                                         (t >= ws ? kv_value(req, l, q, g, t, b) : 0);
                        }
            }
    }
#undef KV_OFF
#undef ST_AT
    test_free(kv);
    test_free(kvn);
    test_free(st);
    return wrong;
}

static void test_hybrid_cp_byte_model_moves_every_byte_once(void **state)
{
    (void)state;
    /* CP 2 and 3; P > D, P < D, P = D; PP 2 -> 2; two page sizes; window
     * and state layers; requests shorter than a CP range (5 tokens: some
     * CP rank holds nothing) and ranges straddling chunks */
    static const struct {
        int64_t cp, p, d, pp, every, window, sheads, ps, dps;
    } shapes[] = {
        {2, 4, 2, 1, 2, 40, 0, 4, 0}, {3, 2, 4, 1, 2, 40, 0, 4, 0},
        {3, 2, 2, 1, 3, 20, 0, 4, 0}, {2, 2, 2, 2, 2, 40, 0, 4, 8},
        {2, 4, 2, 1, 4, 0, 8, 4, 0},  {3, 2, 4, 1, 4, 0, 8, 4, 0},
        {3, 2, 2, 1, 4, 0, 8, 4, 0},  {2, 2, 2, 2, 3, 0, 2, 4, 8},
        {3, 8, 2, 1, 4, 0, 8, 4, 0},
    };
    static const int64_t totals[] = {5, 37, 64, 100, 150};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        kvs_layout_params_t p = {.total_heads = 4, .head_dim = 2, .dtype = KVS_DTYPE_BF16,
                                 .layers = 8, .page_size = shapes[s].ps,
                                 .decode_page_size = shapes[s].dps,
                                 .prefill_tp = shapes[s].p, .decode_tp = shapes[s].d,
                                 .prefill_pp = shapes[s].pp, .decode_pp = shapes[s].pp,
                                 .prefill_cp = shapes[s].cp, .chunk_tokens = 32,
                                 .full_attn_every = shapes[s].every};
        if (shapes[s].window > 0) {
            p.other_layers = KVS_LAYER_WINDOW;
            p.window_tokens = shapes[s].window;
        } else {
            p.other_layers = KVS_LAYER_STATE;
            p.state_heads = shapes[s].sheads;
            p.state_conv_bytes = 3;
            p.state_ssm_bytes = 5;
        }
        kvs_layout_t lay;
        assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
        const int64_t bad = run_cp_model(&lay, totals, 5, CPBUG_NONE);
        if (bad != 0)
            fail_msg("CP shape %zu: %lld wrong bytes", s, (long long)bad);
        if (shapes[s].window > 0)
            assert_true(run_cp_model(&lay, totals, 5, CPBUG_WINDOW_SHIFT) > 0);
        else
            assert_true(run_cp_model(&lay, totals, 5, CPBUG_STATE_RANK) > 0);
    }
}

/* With CP 1 a hybrid chunk's one part is the whole region, at offset 0
 * (the layout without CP, byte for byte); with CP the empty chunk of a
 * request wholly cached is the state owner's, carrying the state. */
static void test_hybrid_cp_parts_by_hand(void **state)
{
    (void)state;
    kvs_layout_t lay;
    kvs_layout_params_t p = qwen3_next(2, 2);
    p.chunk_tokens = 64;
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    kvs_chunk_t ch = {.token_start = 64, .token_end = 100};
    kvs_hybrid_writer_t w;
    kvs_cp_part_t pt;
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 1, 0, 0, 100, &ch, &w), KVS_OK);
    assert_int_equal(kvs_layout_cp_part(&lay, 1, 0, 100, &ch, 0, &pt), KVS_OK);
    assert_int_equal(pt.offset_bytes, 0);
    assert_int_equal(pt.len_bytes, w.w.len_bytes * lay.tp_writers);
    assert_int_equal(pt.token_start, 64);
    assert_int_equal(pt.token_end, 100);
    /* CP 2, 100 tokens, 16-token pages: ranges [0, 64), [64, 100); a
     * chunk of 64 tokens [32, 96) straddles them */
    p.prefill_cp = 2;
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    ch = (kvs_chunk_t){.token_start = 32, .token_end = 96};
    /* 12 full layers, 1 head of 256 bf16 per writer, K and V: 1024 bytes a
     * token a writer, two writers (P = D = 2: one each) */
    assert_int_equal(kvs_layout_cp_part(&lay, 0, 0, 100, &ch, 0, &pt), KVS_OK);
    assert_int_equal(pt.token_start, 32);
    assert_int_equal(pt.token_end, 64);
    assert_int_equal(pt.offset_bytes, 0);
    assert_int_equal(pt.len_bytes, 32 * 12 * 1024);
    assert_int_equal(kvs_layout_cp_part(&lay, 0, 0, 100, &ch, 1, &pt), KVS_OK);
    assert_int_equal(pt.offset_bytes, 32 * 12 * 1024);
    assert_int_equal(pt.local_token_start, 0);
    assert_int_equal(pt.len_bytes, 32 * 12 * 1024);
    /* the last chunk [96, 100): CP rank 1's, with the state: 36 layers x
     * 8 state heads x 68608 bytes */
    ch = (kvs_chunk_t){.token_start = 96, .token_end = 100};
    assert_int_equal(kvs_layout_cp_part(&lay, 0, 0, 100, &ch, 0, &pt), KVS_ENOENT);
    assert_int_equal(kvs_layout_cp_part(&lay, 0, 0, 100, &ch, 1, &pt), KVS_OK);
    assert_int_equal(pt.len_bytes, 4 * 12 * 1024 + 36 * 8 * 68608);
    /* an empty chunk (all cached): the owner of token 99, CP rank 1 */
    ch = (kvs_chunk_t){.token_start = 100, .token_end = 100};
    int64_t first = -1, count = 0;
    assert_int_equal(kvs_layout_cp_writers(&lay, 100, &ch, &first, &count), KVS_OK);
    assert_int_equal(first, 1);
    assert_int_equal(count, 1);
    assert_int_equal(kvs_layout_cp_part(&lay, 0, 0, 100, &ch, 0, &pt), KVS_ENOENT);
    assert_int_equal(kvs_layout_cp_part(&lay, 0, 0, 100, &ch, 1, &pt), KVS_OK);
    assert_int_equal(pt.len_bytes, 36 * 8 * 68608);
}

/* Every argument of the hybrid calls checked: NULLs are KVS_EINVAL,
 * numbers outside the layout KVS_ERANGE, and a layout without the pattern
 * has no state slot (0 bytes) and full layers only. */
static void test_hybrid_arguments(void **state)
{
    (void)state;
    kvs_layout_t lay;
    kvs_layout_params_t p = gpt_oss(24, 2, 2);
    assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
    kvs_layer_kind_t k;
    assert_int_equal(kvs_layer_kind_parse(NULL, &k), KVS_EINVAL);
    assert_int_equal(kvs_layer_kind_parse("window", NULL), KVS_EINVAL);
    int64_t a, b;
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, 100, NULL, &b), KVS_EINVAL);
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, 100, &a, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, -1, &a, &b), KVS_EINVAL);
    assert_int_equal(kvs_layout_layer_tokens(&lay, 24, 100, &a, &b), KVS_ERANGE);
    assert_int_equal(kvs_layout_layer_tokens(NULL, 0, 100, &a, &b), KVS_EINVAL);
    assert_int_equal(kvs_layout_layer_kind(&lay, 0, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_layer_kind(&lay, -1, &k), KVS_ERANGE);

    kvs_hybrid_writer_t w;
    kvs_chunk_t c = {.index = 0, .token_start = 0, .token_end = 100};
    assert_int_equal(kvs_layout_hybrid_writer(NULL, 0, 0, 0, 100, &c, &w), KVS_EINVAL);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 100, &c, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, -1, 0, 0, 100, &c, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 2, 0, 0, 100, &c, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, -1, 100, &c, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 1, 100, &c, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, -1, &c, &w), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 1, 0, 100, &c, &w), KVS_ERANGE);
    c.token_start = -1; /* before the request */
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 100, &c, &w), KVS_ERANGE);
    c = (kvs_chunk_t){.token_start = 50, .token_end = 40}; /* backwards */
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 100, &c, &w), KVS_ERANGE);
    c = (kvs_chunk_t){.token_start = 0, .token_end = 4096}; /* longer than the grid */
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 5000, &c, &w), KVS_ERANGE);

    c = (kvs_chunk_t){.token_start = 0, .token_end = 100};
    assert_int_equal(kvs_layout_hybrid_writer(&lay, 0, 0, 0, 100, &c, &w), KVS_OK);
    kvs_hybrid_slot_t slot;
    assert_int_equal(kvs_layout_hybrid_slot(NULL, &w, 0, 0, 0, &slot), KVS_EINVAL);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, NULL, 0, 0, 0, &slot), KVS_EINVAL);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, 0, 0, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 1, 0, 0, &slot), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, -1, 0, &slot), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, 24, 0, &slot), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, 0, -1, &slot), KVS_ERANGE);
    assert_int_equal(kvs_layout_hybrid_slot(&lay, &w, 0, 0, 2, &slot), KVS_ERANGE);

    int64_t bytes = -1;
    assert_int_equal(kvs_layout_state_slot_bytes(&lay, KVS_ROLE_DECODE, 0, NULL), KVS_EINVAL);
    assert_int_equal(kvs_layout_state_slot_bytes(&lay, KVS_ROLE_DECODE, 1, &bytes),
                     KVS_ERANGE);
    /* window layers, and a dense layout: no state slot */
    assert_int_equal(kvs_layout_state_slot_bytes(&lay, KVS_ROLE_DECODE, 0, &bytes), KVS_OK);
    assert_int_equal(bytes, 0);
    kvs_layout_t dense;
    p = gpt_oss(24, 2, 2);
    p.full_attn_every = 0;
    p.other_layers = KVS_LAYER_FULL;
    p.window_tokens = 0;
    assert_int_equal(kvs_layout_init(&dense, &p, NULL), KVS_OK);
    bytes = -1;
    assert_int_equal(kvs_layout_state_slot_bytes(&dense, KVS_ROLE_PREFILL, 0, &bytes), KVS_OK);
    assert_int_equal(bytes, 0);
    assert_int_equal(kvs_layout_layer_kind(&dense, 23, &k), KVS_OK);
    assert_int_equal(k, KVS_LAYER_FULL);
    assert_int_equal(kvs_layout_layer_tokens(&dense, 5, 1000, &a, &b), KVS_OK);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1000);
}

static void test_hybrid_refusals(void **state)
{
    (void)state;
    kvs_layout_t lay;
    kvs_error_t err;
    kvs_layout_params_t p = gpt_oss(24, 2, 2);
    p.window_tokens = 0;
    memset(&err, 0, sizeof err);
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "--window"));
    /* a window without a pattern */
    p = gpt_oss(24, 2, 2);
    p.full_attn_every = 0;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "full_attn_every"));
    p.full_attn_every = -1;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    /* both kinds at once */
    p = gpt_oss(24, 2, 2);
    p.state_heads = 4;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    p = qwen3_next(2, 2);
    p.window_tokens = 4;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    /* other layers of kind full */
    p = qwen3_next(2, 2);
    p.other_layers = KVS_LAYER_FULL;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    /* state without bytes or heads */
    p = qwen3_next(2, 2);
    p.state_conv_bytes = p.state_ssm_bytes = 0;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "--state-bytes"));
    p = qwen3_next(2, 2);
    p.state_heads = 0;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    /* state heads that do not split over TP */
    p = qwen3_next(4, 2);
    p.state_heads = 6;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EHEAD_SPLIT);
    assert_non_null(strstr(err.msg, "--state-heads"));
    /* MLA is not planned with hybrid layers */
    p = qwen3_next(2, 2);
    p.kind = KVS_KV_MLA;
    p.total_heads = 1;
    p.head_dim = 576;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "gqa"));
    /* a region that overflows */
    p = qwen3_next(2, 2);
    p.state_ssm_bytes = INT64_MAX / 2;
    assert_int_equal(kvs_layout_init(&lay, &p, &err), KVS_ERANGE);
}

static void test_hybrid_models(void **state)
{
    (void)state;
    const kvs_model_t *m = kvs_model_find("gpt-oss-120b");
    assert_non_null(m);
    assert_int_equal(m->layers, 36);
    assert_int_equal(m->full_attn_every, 2);
    assert_int_equal(m->other_layers, KVS_LAYER_WINDOW);
    assert_int_equal(m->window_tokens, 128);
    m = kvs_model_find("gpt-oss-20b");
    assert_non_null(m);
    assert_int_equal(m->layers, 24);
    m = kvs_model_find("Qwen3-Next-80B-A3B");
    assert_non_null(m);
    assert_int_equal(m->total_heads, 2);
    assert_int_equal(m->head_dim, 256);
    assert_int_equal(m->full_attn_every, 4);
    assert_int_equal(m->state_heads, 16);
    assert_int_equal(m->state_conv_bytes + m->state_ssm_bytes, 68608);
    /* a model of full layers alone has no pattern */
    m = kvs_model_find("llama-3.1-8b");
    assert_int_equal(m->full_attn_every, 0);
    assert_int_equal(m->window_tokens, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hybrid_layer_kinds),
        cmocka_unit_test(test_hybrid_window_tokens_are_page_aligned),
        cmocka_unit_test(test_hybrid_window_writer),
        cmocka_unit_test(test_hybrid_state_writer),
        cmocka_unit_test(test_hybrid_parts_by_hand),
        cmocka_unit_test(test_hybrid_state_replicas_written_once),
        cmocka_unit_test(test_hybrid_state_heads_cover_every_decode_head),
        cmocka_unit_test(test_hybrid_byte_model_moves_every_slot_and_state_byte),
        cmocka_unit_test(test_hybrid_cp_byte_model_moves_every_byte_once),
        cmocka_unit_test(test_hybrid_cp_parts_by_hand),
        cmocka_unit_test(test_hybrid_arguments),
        cmocka_unit_test(test_hybrid_refusals),
        cmocka_unit_test(test_hybrid_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
