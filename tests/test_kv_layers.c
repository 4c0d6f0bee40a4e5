/*
 * test_kv_layers.c - an engine's flat KV buffer list turned into per-layer
 * descriptors (kvs_kv_layers_from_ptrs, src/kv_layers.c): the K buffers
 * then the V buffers, with their lengths and the bytes of one page, as
 * sglang's KVArgs carries them. Every refusal names the layer, K or V and
 * the field, and writes nothing to out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include <kvstage/kvstage.h>

#define LAYERS 3
#define PAGE 16
#define HEADS 4
#define DIM 128
#define ITEM ((uint64_t)PAGE * HEADS * DIM * 2) /* bf16 */
#define PAGES 10

typedef struct args {
    uint64_t ptrs[2 * LAYERS], lens[2 * LAYERS], items[2 * LAYERS];
    kvs_kv_layer_t out[LAYERS];
} args_t;

static args_t good(void)
{
    args_t a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < 2 * LAYERS; i++) {
        a.ptrs[i] = 0x10000000u + (uint64_t)i * 0x1000000u;
        a.lens[i] = PAGES * ITEM;
        a.items[i] = ITEM;
    }
    memset(a.out, 0x5A, sizeof a.out);
    return a;
}

static int convert(args_t *a, int64_t n, kvs_error_t *err)
{
    return kvs_kv_layers_from_ptrs(a->ptrs, a->lens, a->items, n, PAGE, HEADS, DIM,
                                   KVS_DTYPE_BF16, a->out, LAYERS, err);
}

static void test_kv_layers_from_ptrs_converts(void **state)
{
    (void)state;
    args_t a = good();
    kvs_error_t err = {.status = KVS_EBUSY};
    assert_int_equal(convert(&a, 2 * LAYERS, &err), KVS_OK);
    assert_int_equal(err.status, KVS_OK);
    for (int l = 0; l < LAYERS; l++) {
        assert_int_equal(a.out[l].k_addr, a.ptrs[l]);
        assert_int_equal(a.out[l].v_addr, a.ptrs[LAYERS + l]);
        assert_int_equal(a.out[l].tokens, PAGES * PAGE);
        assert_int_equal(a.out[l].token_stride_bytes, HEADS * DIM * 2);
        assert_int_equal(a.out[l].head_stride_bytes, DIM * 2);
        assert_int_equal(a.out[l].elem_stride_bytes, 2);
    }
    /* Fewer layers than out holds. */
    a = good();
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 2, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, NULL),
                     KVS_OK);
    assert_int_equal(a.out[0].v_addr, a.ptrs[1]);
}

static void expect_refused(args_t *a, int64_t n, const char *says)
{
    kvs_kv_layer_t before[LAYERS];
    memcpy(before, a->out, sizeof before);
    kvs_error_t err = {0};
    assert_int_equal(convert(a, n, &err), KVS_EINVAL);
    assert_int_equal(err.status, KVS_EINVAL);
    if (strstr(err.msg, says) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", err.msg, says);
    assert_memory_equal(a->out, before, sizeof before);
}

static void test_kv_layers_from_ptrs_refusals(void **state)
{
    (void)state;
    args_t a = good();
    expect_refused(&a, 5, "n_ptrs 5 must be 2 x the layers");
    expect_refused(&a, 0, "n_ptrs 0");
    expect_refused(&a, 8, "out must hold n_ptrs / 2 = 4 layers (out_cap 3)");
    a = good();
    a.items[4] = ITEM / 2; /* V of layer 1 */
    expect_refused(&a, 6, "layer 1 V: item size 8192 bytes, but a page of 16 tokens x 4 heads "
                          "x head dim 128 x 2 bytes is 16384");
    a = good();
    a.ptrs[2] = 0;
    expect_refused(&a, 6, "layer 2 K: address 0x0 and length");
    a = good();
    a.lens[0] = ITEM * 3 + 1;
    expect_refused(&a, 6, "layer 0 K: address 0x10000000 and length 49153 must be non-zero "
                          "and the length a whole number of 16384-byte pages");
    a = good();
    a.lens[3] = 0;
    expect_refused(&a, 6, "layer 0 V");
    a = good();
    a.lens[5] = ITEM * 4;
    expect_refused(&a, 6, "layer 2: its K buffer has 163840 bytes and its V buffer 65536");
    /* The geometry itself. */
    a = good();
    kvs_error_t err = {0};
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, PAGE, 0, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "page_size, local_heads and head_dim must be > 0"));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, PAGE, HEADS, DIM,
                                             (kvs_dtype_t)42, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "dtype known (got 16, 4, 128, 42)"));
    assert_int_equal(kvs_kv_layers_from_ptrs(NULL, a.lens, a.items, 6, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "must not be NULL"));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, NULL, LAYERS, NULL),
                     KVS_EINVAL);
    /* Each argument on its own. */
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, NULL, a.items, 6, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "ptrs, lens, item_lens and out must not be NULL"));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, NULL, 6, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "must not be NULL"));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, 0, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "(got 0, 4, 128, "));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, PAGE, HEADS, -1,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "(got 16, 4, -1, "));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_layers_from_ptrs_converts),
        cmocka_unit_test(test_kv_layers_from_ptrs_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
