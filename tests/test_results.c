/*
 * test_results.c - unit tests of the finished-request queue (src/results.c):
 * capacity 0 refused, FIFO order, partial pops, a push into a full queue
 * dropping the oldest and counting it, and wraparound over many cycles
 * checked against sequence numbers carried in the items.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "results.h"

/* A result whose fields all derive from n, so a copy is checked whole. */
static kvs_room_result_t result_of(uint64_t n)
{
    kvs_room_result_t r = {.room = n,
                           .status = -(int)(n % 7),
                           .chunks = (int64_t)n * 3,
                           .bytes = n << 12,
                           .rdma_writes = n + 5,
                           .open_ns = n * 1000,
                           .done_ns = n * 1000 + 999};
    return r;
}

static void assert_result_is(const kvs_room_result_t *r, uint64_t n)
{
    kvs_room_result_t want = result_of(n);
    assert_int_equal(r->room, want.room);
    assert_int_equal(r->status, want.status);
    assert_int_equal(r->chunks, want.chunks);
    assert_int_equal(r->bytes, want.bytes);
    assert_int_equal(r->rdma_writes, want.rdma_writes);
    assert_int_equal(r->open_ns, want.open_ns);
    assert_int_equal(r->done_ns, want.done_ns);
}

static void push_n(kvs__results_t *q, uint64_t n)
{
    kvs_room_result_t r = result_of(n);
    kvs__results_push(q, &r, NULL, 0);
}

static void test_results_init_zero_cap_is_invalid(void **state)
{
    kvs__results_t q;
    memset(&q, 0xAB, sizeof q);
    assert_int_equal(kvs__results_init(&q, 0), KVS_EINVAL);
    assert_null(q.items);
    assert_int_equal(q.cap, 0);
    assert_int_equal(q.count, 0);
    kvs__results_fini(&q, NULL); /* nothing to free, still safe */
}

static void test_results_fifo_order(void **state)
{
    kvs__results_t q;
    assert_int_equal(kvs__results_init(&q, 8), KVS_OK);
    kvs_room_result_t out[8];
    assert_int_equal(kvs__results_pop(&q, out, 8), 0); /* empty */
    for (uint64_t n = 1; n <= 5; n++)
        push_n(&q, n);
    assert_int_equal(q.count, 5);
    assert_int_equal(kvs__results_pop(&q, out, 8), 5);
    for (int i = 0; i < 5; i++)
        assert_result_is(&out[i], (uint64_t)i + 1);
    assert_int_equal(q.count, 0);
    assert_int_equal(q.dropped, 0);
    assert_int_equal(kvs__results_pop(&q, out, 8), 0);
    kvs__results_fini(&q, NULL);
    assert_null(q.items);
}

static void test_results_pop_less_than_count(void **state)
{
    kvs__results_t q;
    assert_int_equal(kvs__results_init(&q, 8), KVS_OK);
    for (uint64_t n = 10; n < 16; n++)
        push_n(&q, n);
    kvs_room_result_t out[8];
    memset(out, 0, sizeof out);
    assert_int_equal(kvs__results_pop(&q, out, 0), 0);
    assert_int_equal(kvs__results_pop(&q, out, -3), 0);
    assert_int_equal(q.count, 6);
    assert_int_equal(kvs__results_pop(&q, out, 2), 2);
    assert_result_is(&out[0], 10);
    assert_result_is(&out[1], 11);
    assert_int_equal(out[2].room, 0); /* not written past max */
    assert_int_equal(q.count, 4);
    assert_int_equal(kvs__results_pop(&q, out, 3), 3);
    assert_result_is(&out[0], 12);
    assert_result_is(&out[2], 14);
    assert_int_equal(kvs__results_pop(&q, out, 3), 1);
    assert_result_is(&out[0], 15);
    kvs__results_fini(&q, NULL);
}

static void test_results_full_drops_oldest(void **state)
{
    kvs__results_t q;
    assert_int_equal(kvs__results_init(&q, 3), KVS_OK);
    for (uint64_t n = 1; n <= 3; n++)
        push_n(&q, n);
    assert_int_equal(q.dropped, 0);
    push_n(&q, 4); /* drops 1 */
    assert_int_equal(q.count, 3);
    assert_int_equal(q.dropped, 1);
    push_n(&q, 5); /* drops 2 */
    push_n(&q, 6); /* drops 3 */
    push_n(&q, 7); /* drops 4 */
    assert_int_equal(q.count, 3);
    assert_int_equal(q.dropped, 4);
    kvs_room_result_t out[4];
    assert_int_equal(kvs__results_pop(&q, out, 4), 3);
    assert_result_is(&out[0], 5);
    assert_result_is(&out[1], 6);
    assert_result_is(&out[2], 7);
    assert_int_equal(q.dropped, 4); /* popping does not reset it */
    kvs__results_fini(&q, NULL);
}

static void test_results_capacity_one(void **state)
{
    kvs__results_t q;
    assert_int_equal(kvs__results_init(&q, 1), KVS_OK);
    push_n(&q, 1);
    push_n(&q, 2);
    kvs_room_result_t out[2];
    assert_int_equal(kvs__results_pop(&q, out, 2), 1);
    assert_result_is(&out[0], 2);
    assert_int_equal(q.dropped, 1);
    kvs__results_fini(&q, NULL);
}

#include "xorshift.h"

/* Random batches of pushes and pops over a queue of 5: the head wraps many
 * times; what comes out is always the newest `cap` not yet popped, in order,
 * and `dropped` counts exactly the ones that never came out. */
static void test_results_wraparound_many_cycles(void **state)
{
    const uint64_t seed = 0x9e3779b97f4a7c15ull;
    const uint32_t cap = 5;
    uint64_t rng = seed;
    kvs__results_t q;
    assert_int_equal(kvs__results_init(&q, cap), KVS_OK);
    uint64_t next_push = 0, next_pop = 0, dropped = 0;
    kvs_room_result_t out[8];

    for (uint32_t step = 0; step < 20000; step++) {
        uint64_t r = xorshift64(&rng);
        uint32_t pushes = (uint32_t)(r % 8);
        int max = (int)((r >> 8) % 8);
        for (uint32_t i = 0; i < pushes; i++)
            push_n(&q, next_push++);
        if (next_push - next_pop > cap) {
            dropped += next_push - next_pop - cap;
            next_pop = next_push - cap;
        }
        int want = (int)(next_push - next_pop) < max ? (int)(next_push - next_pop) : max;
        int got = kvs__results_pop(&q, out, max);
        if (got != want || q.dropped != dropped)
            fail_msg("seed %#llx step %u: popped %d of %d, dropped %llu of %llu",
                     (unsigned long long)seed, step, got, want,
                     (unsigned long long)q.dropped, (unsigned long long)dropped);
        for (int i = 0; i < got; i++)
            assert_result_is(&out[i], next_pop++);
        assert_int_equal(q.count, next_push - next_pop);
        assert_true(q.head < cap);
    }
    assert_true(next_push > 10 * cap);
    assert_true(dropped > 0);
    kvs__results_fini(&q, NULL);
}

/* A result with an aux payload takes the room's block and gives the room
 * the slot's old one: the bytes are never copied, a queue that has seen its
 * largest payloads allocates no more, and a failed result carries none. */
static void test_results_aux_swaps_buffers(void **state)
{
    kvs__results_t q;
    assert_int_equal(kvs__results_init(&q, 2), KVS_OK);
    kvs__blocks_t cache;
    assert_int_equal(kvs__blocks_init(&cache, 4), KVS_OK);
    uint8_t *room = kvs__blocks_get(&cache, 8);
    assert_non_null(room);
    memcpy(room, "payload!", 8);
    uint8_t *const first = room;
    kvs_room_result_t r = result_of(1);
    kvs__results_push(&q, &r, &room, 7);
    assert_null(room); /* the slot had none */
    /* No aux: the room keeps its block, the result has none. */
    uint8_t *other = kvs__blocks_get(&cache, 4);
    r = result_of(2);
    kvs__results_push(&q, &r, &other, 0);
    assert_non_null(other);
    kvs_room_result_t out[2];
    assert_int_equal(kvs__results_pop(&q, out, 2), 2);
    assert_ptr_equal(out[0].aux, first);
    assert_int_equal(out[0].aux_bytes, 7);
    assert_memory_equal(out[0].aux, "payload", 7);
    assert_null(out[1].aux);
    assert_int_equal(out[1].aux_bytes, 0);
    /* Slot 0 again: the room gets the first block back to reuse. */
    r = result_of(3);
    kvs__results_push(&q, &r, &other, 3);
    assert_ptr_equal(other, first);
    assert_int_equal(kvs__blocks_cap(other), 8);
    kvs__blocks_put(&cache, other);
    kvs__results_fini(&q, &cache); /* the slots' blocks go to the cache */
    assert_int_equal(cache.count, 2);
    kvs__blocks_fini(&cache);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_results_init_zero_cap_is_invalid),
        cmocka_unit_test(test_results_fifo_order),
        cmocka_unit_test(test_results_pop_less_than_count),
        cmocka_unit_test(test_results_full_drops_oldest),
        cmocka_unit_test(test_results_capacity_one),
        cmocka_unit_test(test_results_wraparound_many_cycles),
        cmocka_unit_test(test_results_aux_swaps_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
