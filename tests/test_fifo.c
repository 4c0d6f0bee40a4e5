/*
 * test_fifo.c - unit tests of the handlers' bounded FIFO (src/fifo.c):
 * order through wrap-around, a full FIFO refusing a push, growth by
 * reserve keeping the order of what is queued (from any head position),
 * and reserve's bound.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <kvstage/kvstage.h>

#include "fifo.h"

static kvs__ref_t ref(uint64_t i) { return (kvs__ref_t){i, (int32_t)(i % 7), (int64_t)i * 3}; }

static void assert_pop(kvs__fifo_t *q, uint64_t i)
{
    assert_true(q->count > 0);
    const kvs__ref_t r = kvs__fifo_head(q);
    assert_int_equal(r.room, i);
    assert_int_equal(r.flow, (int32_t)(i % 7));
    assert_int_equal(r.chunk, (int64_t)i * 3);
    kvs__fifo_pop(q);
}

static void test_fifo_order_through_wraps(void **state)
{
    (void)state;
    kvs__fifo_t q;
    assert_int_equal(kvs__fifo_init(&q, 3), KVS_OK);
    uint64_t in = 0, out = 0;
    for (int round = 0; round < 10; round++) {
        while (kvs__fifo_push(&q, ref(in)))
            in++;
        assert_int_equal(q.count, 3); /* full: the push was refused */
        assert_pop(&q, out++);
        assert_pop(&q, out++);
    }
    while (q.count > 0)
        assert_pop(&q, out++);
    assert_int_equal(in, out);
    kvs__fifo_fini(&q);
    kvs__fifo_fini(&q); /* a second fini is a no-op */
}

static void test_fifo_reserve_keeps_order(void **state)
{
    (void)state;
    kvs__fifo_t q;
    assert_int_equal(kvs__fifo_init(&q, 0), KVS_OK); /* 0 means room for one */
    assert_int_equal(q.cap, 1);
    assert_true(kvs__fifo_push(&q, ref(0)));
    assert_false(kvs__fifo_push(&q, ref(1)));
    assert_int_equal(kvs__fifo_reserve(&q, 1), KVS_OK); /* already enough */
    assert_int_equal(q.cap, 1);
    /* Grow with the head in the middle of the ring, twice. */
    assert_int_equal(kvs__fifo_reserve(&q, 4), KVS_OK);
    assert_int_equal(q.cap, 4);
    for (uint64_t i = 1; i < 4; i++)
        assert_true(kvs__fifo_push(&q, ref(i)));
    assert_pop(&q, 0);
    assert_pop(&q, 1);
    assert_true(kvs__fifo_push(&q, ref(4)));
    assert_true(kvs__fifo_push(&q, ref(5))); /* wrapped: head at 2 */
    assert_int_equal(kvs__fifo_reserve(&q, 5), KVS_OK);
    assert_int_equal(q.cap, 8); /* at least double */
    for (uint64_t i = 6; i < 10; i++)
        assert_true(kvs__fifo_push(&q, ref(i)));
    for (uint64_t i = 2; i < 10; i++)
        assert_pop(&q, i);
    assert_int_equal(kvs__fifo_reserve(&q, (uint64_t)UINT32_MAX / 2 + 1), KVS_EFULL);
    assert_int_equal(q.cap, 8); /* a refused reserve changes nothing */
    kvs__fifo_fini(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_order_through_wraps),
        cmocka_unit_test(test_fifo_reserve_keeps_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
