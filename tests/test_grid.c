/*
 * test_grid.c - the chunk grid of spec §5: sends cut at base + k*G,
 * non-final sends floored, an empty final send still one chunk, stable chunk
 * ids after a prefix-cache hit, unaligned prefixes refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <kvstage/kvstage.h>

/* page 16, chunk 64 tokens: G = 64, F = 4 */
static kvs_layout_t grid_layout(void)
{
    kvs_layout_params_t p = {.total_heads = 8, .head_dim = 64, .dtype = KVS_DTYPE_FP16,
                             .layers = 4, .page_size = 16, .prefill_tp = 2,
                             .decode_tp = 1, .chunk_tokens = 64};
    kvs_layout_t l;
    assert_int_equal(kvs_layout_init(&l, &p, NULL), KVS_OK);
    assert_int_equal(l.grid_tokens, 64);
    assert_int_equal(l.chunk_pages, 4);
    return l;
}

static void test_grid_non_final_send_is_floored(void **state)
{
    kvs_layout_t l = grid_layout();
    kvs_send_t s;
    assert_int_equal(kvs_grid_send(&l, 32, 32, 32 + 150, false, &s), KVS_OK);
    assert_int_equal(s.sent_end, 32 + 128);
    assert_int_equal(s.first_chunk, 0);
    assert_int_equal(s.num_chunks, 2);
    assert_int_equal(kvs_grid_send(&l, 32, s.sent_end, 182, true, &s), KVS_OK);
    assert_int_equal(s.sent_end, 182);
    assert_int_equal(s.first_chunk, 2);
    assert_int_equal(s.num_chunks, 1);
}

static void test_grid_short_non_final_send_waits(void **state)
{
    kvs_layout_t l = grid_layout();
    kvs_send_t s;
    assert_int_equal(kvs_grid_send(&l, 32, 32, 42, false, &s), KVS_OK);
    assert_int_equal(s.sent_end, 32);
    assert_int_equal(s.num_chunks, 0);
}

static void test_grid_empty_final_send_is_one_chunk(void **state)
{
    kvs_layout_t l = grid_layout();
    kvs_send_t s;
    assert_int_equal(kvs_grid_send(&l, 32, 32, 32, true, &s), KVS_OK);
    assert_int_equal(s.sent_end, 32);
    assert_int_equal(s.first_chunk, 0);
    assert_int_equal(s.num_chunks, 1);
    kvs_chunk_t c;
    assert_int_equal(kvs_grid_chunk(&l, 32, 32, 0, &c), KVS_OK);
    assert_int_equal(c.num_pages, 0);
    assert_int_equal(c.token_start, 32);
    assert_int_equal(c.token_end, 32);
    assert_int_equal(kvs_grid_chunk(&l, 32, 32, 1, &c), KVS_ERANGE);
}

static void test_grid_prefix_hit_keeps_chunk_ids_stable(void **state)
{
    /* A first send larger than G (prefix-cache hit) must not shift ids. */
    kvs_layout_t l = grid_layout();
    kvs_send_t s;
    assert_int_equal(kvs_grid_send(&l, 0, 0, 200, false, &s), KVS_OK);
    assert_int_equal(s.sent_end, 192);
    assert_int_equal(s.first_chunk, 0);
    assert_int_equal(s.num_chunks, 3);
    assert_int_equal(kvs_grid_send(&l, 0, 192, 250, true, &s), KVS_OK);
    assert_int_equal(s.first_chunk, 3);
    assert_int_equal(s.num_chunks, 1);
    kvs_chunk_t c;
    assert_int_equal(kvs_grid_chunk(&l, 0, 250, 3, &c), KVS_OK);
    assert_int_equal(c.page_start, 12);
    assert_int_equal(c.num_pages, 4); /* ceil(250/16) = 16 pages */
    assert_int_equal(c.token_start, 192);
    assert_int_equal(c.token_end, 250);
}

static void test_grid_chunk_pages_of_suffix(void **state)
{
    kvs_layout_t l = grid_layout();
    kvs_chunk_t c;
    /* suffix [32, 182): 150 tokens = 10 pages -> chunks of 4, 4, 2 pages */
    assert_int_equal(kvs_grid_chunk(&l, 32, 182, 0, &c), KVS_OK);
    assert_int_equal(c.page_start, 0);
    assert_int_equal(c.num_pages, 4);
    assert_int_equal(c.token_end, 96);
    assert_int_equal(kvs_grid_chunk(&l, 32, 182, 2, &c), KVS_OK);
    assert_int_equal(c.index, 2);
    assert_int_equal(c.page_start, 8);
    assert_int_equal(c.num_pages, 2);
    assert_int_equal(c.token_start, 160);
    assert_int_equal(c.token_end, 182);
    assert_int_equal(kvs_grid_chunk(&l, 32, 182, 3, &c), KVS_ERANGE);
    assert_int_equal(kvs_grid_chunk(&l, 32, 182, -1, &c), KVS_ERANGE);
}

static void test_grid_num_chunks(void **state)
{
    kvs_layout_t l = grid_layout();
    assert_int_equal(kvs_grid_num_chunks(&l, 0), 1);
    assert_int_equal(kvs_grid_num_chunks(&l, 1), 1);
    assert_int_equal(kvs_grid_num_chunks(&l, 4), 1);
    assert_int_equal(kvs_grid_num_chunks(&l, 5), 2);
    assert_int_equal(kvs_grid_num_chunks(&l, 12), 3);
}

static void test_grid_rejects_bad_sends(void **state)
{
    kvs_layout_t l = grid_layout();
    kvs_send_t s;
    kvs_chunk_t c;
    assert_int_equal(kvs_grid_send(&l, 8, 8, 100, true, &s), KVS_EPREFIX_ALIGN);
    assert_int_equal(kvs_grid_chunk(&l, 8, 100, 0, &c), KVS_EPREFIX_ALIGN);
    assert_int_equal(kvs_grid_send(&l, 32, 40, 100, true, &s), KVS_EINVAL);
    assert_int_equal(kvs_grid_send(&l, 32, 16, 100, true, &s), KVS_EINVAL);
    assert_int_equal(kvs_grid_send(&l, 32, 32, 31, true, &s), KVS_EINVAL);
    assert_int_equal(kvs_grid_send(&l, -16, 0, 10, true, &s), KVS_EINVAL);
    assert_int_equal(kvs_grid_send(NULL, 0, 0, 10, true, &s), KVS_EINVAL);
    assert_int_equal(kvs_grid_send(&l, 0, 0, 10, true, NULL), KVS_EINVAL);
    assert_int_equal(kvs_grid_chunk(&l, 32, 16, 0, &c), KVS_EINVAL);
    assert_int_equal(kvs_grid_chunk(NULL, 0, 16, 0, &c), KVS_EINVAL);
    assert_int_equal(kvs_grid_chunk(&l, 0, 16, 0, NULL), KVS_EINVAL);
    assert_int_equal(kvs_grid_chunk(&l, -16, 16, 0, &c), KVS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_non_final_send_is_floored),
        cmocka_unit_test(test_grid_short_non_final_send_waits),
        cmocka_unit_test(test_grid_empty_final_send_is_one_chunk),
        cmocka_unit_test(test_grid_prefix_hit_keeps_chunk_ids_stable),
        cmocka_unit_test(test_grid_chunk_pages_of_suffix),
        cmocka_unit_test(test_grid_num_chunks),
        cmocka_unit_test(test_grid_rejects_bad_sends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
