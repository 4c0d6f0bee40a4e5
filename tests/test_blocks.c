/*
 * test_blocks.c - unit tests of the handler's block cache (src/blocks.c):
 * best fit, zeroing, the bound on cached blocks (keeping the larger), fit's
 * reuse without copying, alignment, and the NULL-cache plain allocation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "blocks.h"

static void test_blocks_get_is_zeroed_and_aligned(void **state)
{
    (void)state;
    kvs__blocks_t c;
    assert_int_equal(kvs__blocks_init(&c, 4), 0);
    uint8_t *p = kvs__blocks_get(&c, 100);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % _Alignof(max_align_t), 0);
    assert_true(kvs__blocks_cap(p) >= 100);
    for (int i = 0; i < 100; i++)
        assert_int_equal(p[i], 0);
    memset(p, 0xab, 100);
    kvs__blocks_put(&c, p);
    /* The same block again, cleared over the bytes asked for. */
    uint8_t *q = kvs__blocks_get(&c, 60);
    assert_ptr_equal(q, p);
    for (int i = 0; i < 60; i++)
        assert_int_equal(q[i], 0);
    assert_int_equal(c.hits, 1);
    assert_int_equal(c.misses, 1);
    kvs__blocks_put(&c, q);
    kvs__blocks_fini(&c);
    assert_null(c.v);
    assert_int_equal(c.count, 0);
}

static void test_blocks_best_fit(void **state)
{
    (void)state;
    kvs__blocks_t c;
    assert_int_equal(kvs__blocks_init(&c, 8), 0);
    void *big = kvs__blocks_get(&c, 4096);
    void *mid = kvs__blocks_get(&c, 512);
    void *small = kvs__blocks_get(&c, 64);
    kvs__blocks_put(&c, big);
    kvs__blocks_put(&c, small);
    kvs__blocks_put(&c, mid);
    assert_ptr_equal(kvs__blocks_get(&c, 100), mid);   /* not big */
    assert_ptr_equal(kvs__blocks_get(&c, 64), small);  /* exact */
    void *fresh = kvs__blocks_get(&c, 8192);            /* none fits */
    assert_ptr_not_equal(fresh, big);
    assert_int_equal(c.misses, 4);
    assert_int_equal(c.count, 1);
    kvs__blocks_put(&c, fresh);
    kvs__blocks_put(&c, mid);
    kvs__blocks_put(&c, small);
    kvs__blocks_fini(&c);
}

/* A full cache keeps the larger block: memory held stays bounded by max
 * of the largest seen, and large rooms keep finding theirs. */
static void test_blocks_full_keeps_larger(void **state)
{
    (void)state;
    kvs__blocks_t c;
    assert_int_equal(kvs__blocks_init(&c, 2), 0);
    void *a = kvs__blocks_get(&c, 100);
    void *b = kvs__blocks_get(&c, 200);
    void *d = kvs__blocks_get(&c, 300);
    void *e = kvs__blocks_get(&c, 50);
    kvs__blocks_put(&c, a);
    kvs__blocks_put(&c, b);
    kvs__blocks_put(&c, d); /* replaces a */
    kvs__blocks_put(&c, e); /* smaller than both: freed */
    assert_int_equal(c.count, 2);
    assert_ptr_equal(kvs__blocks_get(&c, 1), b);
    assert_ptr_equal(kvs__blocks_get(&c, 1), d);
    assert_int_equal(c.count, 0);
    kvs__blocks_put(&c, b);
    kvs__blocks_put(&c, d);
    kvs__blocks_fini(&c);
}

static void test_blocks_fit_reuses_or_replaces(void **state)
{
    (void)state;
    kvs__blocks_t c;
    assert_int_equal(kvs__blocks_init(&c, 4), 0);
    uint8_t *p = kvs__blocks_fit(&c, NULL, 16);
    assert_non_null(p);
    memcpy(p, "0123456789abcdef", 16);
    assert_ptr_equal(kvs__blocks_fit(&c, p, 8), p); /* holds them: kept */
    assert_memory_equal(p, "01234567", 8);          /* and not cleared */
    uint8_t *q = kvs__blocks_fit(&c, p, 32);
    assert_ptr_not_equal(q, p);
    assert_int_equal(c.count, 1); /* p went back */
    assert_ptr_equal(kvs__blocks_fit(&c, q, 0), q);
    assert_ptr_equal(kvs__blocks_get(&c, 16), p);
    kvs__blocks_put(&c, p);
    kvs__blocks_put(&c, q);
    kvs__blocks_put(&c, NULL); /* a no-op */
    kvs__blocks_fini(&c);
}

/* Without a cache (or with max 0) every block is a plain allocation. */
static void test_blocks_without_cache(void **state)
{
    (void)state;
    void *p = kvs__blocks_get(NULL, 0);
    assert_non_null(p);
    assert_true(kvs__blocks_cap(p) >= 1);
    kvs__blocks_put(NULL, p);
    kvs__blocks_t c;
    assert_int_equal(kvs__blocks_init(&c, 0), 0);
    p = kvs__blocks_get(&c, 10);
    kvs__blocks_put(&c, p);
    assert_int_equal(c.count, 0);
    assert_null(kvs__blocks_get(&c, SIZE_MAX)); /* too large: NULL, no wrap */
    kvs__blocks_fini(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_get_is_zeroed_and_aligned),
        cmocka_unit_test(test_blocks_best_fit),
        cmocka_unit_test(test_blocks_full_keeps_larger),
        cmocka_unit_test(test_blocks_fit_reuses_or_replaces),
        cmocka_unit_test(test_blocks_without_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
