/*
 * test_table.c - unit tests of the bounded u64 -> pointer hash table
 * (src/table.c): init argument errors, put/get/del, KVS_EALREADY and
 * KVS_EFULL, re-insert after delete, the extreme keys 0 and UINT64_MAX, and
 * a long pseudo-random run checked against a reference array that drives the
 * table through many tombstone rebuilds and checks every live key after each.
 * Rebuilds are seen from outside by the swap of the key array they do.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include <kvstage/kvstage.h>

#include "table.h"

#include "xorshift.h"

static void *val_of(uintptr_t i) { return (void *)(i + 1); }

static void assert_table_zeroed(const kvs__table_t *t)
{
    kvs__table_t zero;
    memset(&zero, 0, sizeof zero);
    assert_memory_equal(t, &zero, sizeof zero);
}

static void test_table_init_rejects_zero_and_too_large(void **state)
{
    kvs__table_t t;
    memset(&t, 0xAB, sizeof t);
    assert_int_equal(kvs__table_init(&t, 0), KVS_EINVAL);
    assert_table_zeroed(&t);
    kvs__table_fini(&t); /* a failed init leaves nothing to free */

    memset(&t, 0xAB, sizeof t);
    assert_int_equal(kvs__table_init(&t, (1u << 28) + 1), KVS_EINVAL);
    assert_table_zeroed(&t);
    assert_int_equal(kvs__table_init(&t, UINT32_MAX), KVS_EINVAL);
    assert_table_zeroed(&t);
    kvs__table_fini(&t);
}

static void test_table_init_sizes_slots(void **state)
{
    kvs__table_t t;
    /* At least 8 slots, a power of two, at least twice max_items. */
    assert_int_equal(kvs__table_init(&t, 1), KVS_OK);
    assert_int_equal(t.mask, 7);
    assert_int_equal(t.max_items, 1);
    assert_int_equal(t.count, 0);
    kvs__table_fini(&t);
    assert_int_equal(kvs__table_init(&t, 64), KVS_OK);
    assert_int_equal(t.mask, 127);
    kvs__table_fini(&t);
    assert_int_equal(kvs__table_init(&t, 65), KVS_OK);
    assert_int_equal(t.mask, 255);
    kvs__table_fini(&t);
}

static void test_table_put_get_del(void **state)
{
    kvs__table_t t;
    assert_int_equal(kvs__table_init(&t, 8), KVS_OK);
    assert_null(kvs__table_get(&t, 42));
    for (uintptr_t k = 1; k <= 8; k++)
        assert_int_equal(kvs__table_put(&t, k * 1000, val_of(k)), KVS_OK);
    assert_int_equal(t.count, 8);
    for (uintptr_t k = 1; k <= 8; k++)
        assert_ptr_equal(kvs__table_get(&t, k * 1000), val_of(k));
    assert_null(kvs__table_get(&t, 1001));

    assert_ptr_equal(kvs__table_del(&t, 3000), val_of(3));
    assert_int_equal(t.count, 7);
    assert_null(kvs__table_get(&t, 3000));
    assert_null(kvs__table_del(&t, 3000)); /* second delete: absent */
    assert_null(kvs__table_del(&t, 99));   /* never present */
    for (uintptr_t k = 1; k <= 8; k++)
        if (k != 3)
            assert_ptr_equal(kvs__table_get(&t, k * 1000), val_of(k));
    kvs__table_fini(&t);
    assert_table_zeroed(&t);
}

static void test_table_duplicate_is_already(void **state)
{
    kvs__table_t t;
    assert_int_equal(kvs__table_init(&t, 4), KVS_OK);
    assert_int_equal(kvs__table_put(&t, 7, val_of(1)), KVS_OK);
    assert_int_equal(kvs__table_put(&t, 7, val_of(2)), KVS_EALREADY);
    assert_ptr_equal(kvs__table_get(&t, 7), val_of(1)); /* unchanged */
    assert_int_equal(t.count, 1);
    kvs__table_fini(&t);
}

static void test_table_full_at_max_items(void **state)
{
    kvs__table_t t;
    assert_int_equal(kvs__table_init(&t, 3), KVS_OK);
    for (uintptr_t k = 0; k < 3; k++)
        assert_int_equal(kvs__table_put(&t, k, val_of(k)), KVS_OK);
    assert_int_equal(kvs__table_put(&t, 3, val_of(3)), KVS_EFULL);
    assert_null(kvs__table_get(&t, 3));
    /* A duplicate is reported as such even when full. */
    assert_int_equal(kvs__table_put(&t, 1, val_of(9)), KVS_EALREADY);
    assert_int_equal(t.count, 3);
    /* A delete makes room again. */
    assert_ptr_equal(kvs__table_del(&t, 1), val_of(1));
    assert_int_equal(kvs__table_put(&t, 3, val_of(3)), KVS_OK);
    assert_int_equal(kvs__table_put(&t, 4, val_of(4)), KVS_EFULL);
    kvs__table_fini(&t);
}

static void test_table_delete_then_reinsert(void **state)
{
    kvs__table_t t;
    assert_int_equal(kvs__table_init(&t, 2), KVS_OK);
    for (uintptr_t round = 0; round < 10; round++) {
        assert_int_equal(kvs__table_put(&t, 5, val_of(round)), KVS_OK);
        assert_ptr_equal(kvs__table_get(&t, 5), val_of(round));
        assert_ptr_equal(kvs__table_del(&t, 5), val_of(round));
        assert_null(kvs__table_get(&t, 5));
    }
    assert_int_equal(t.count, 0);
    kvs__table_fini(&t);
}

static void test_table_extreme_keys(void **state)
{
    kvs__table_t t;
    assert_int_equal(kvs__table_init(&t, 4), KVS_OK);
    /* 0 must not be mistaken for an empty slot's key. */
    assert_null(kvs__table_get(&t, 0));
    assert_null(kvs__table_del(&t, 0));
    assert_int_equal(kvs__table_put(&t, 0, val_of(0)), KVS_OK);
    assert_int_equal(kvs__table_put(&t, UINT64_MAX, val_of(1)), KVS_OK);
    assert_int_equal(kvs__table_put(&t, 0, val_of(2)), KVS_EALREADY);
    assert_int_equal(kvs__table_put(&t, UINT64_MAX, val_of(2)), KVS_EALREADY);
    assert_ptr_equal(kvs__table_get(&t, 0), val_of(0));
    assert_ptr_equal(kvs__table_get(&t, UINT64_MAX), val_of(1));
    assert_ptr_equal(kvs__table_del(&t, 0), val_of(0));
    assert_null(kvs__table_get(&t, 0));
    assert_ptr_equal(kvs__table_get(&t, UINT64_MAX), val_of(1));
    assert_ptr_equal(kvs__table_del(&t, UINT64_MAX), val_of(1));
    assert_int_equal(t.count, 0);
    kvs__table_fini(&t);
}

/* Insert-delete cycles of fresh keys beside two resident ones fill the
 * table with tombstones until a put rebuilds it (4 items over 8 slots
 * rebuild once more than 6 slots are used or tombstoned). */
static void test_table_rebuild_keeps_live_keys(void **state)
{
    kvs__table_t t;
    assert_int_equal(kvs__table_init(&t, 4), KVS_OK);
    assert_int_equal(kvs__table_put(&t, 2, val_of(2)), KVS_OK);
    assert_int_equal(kvs__table_put(&t, 3, val_of(3)), KVS_OK);
    uintptr_t k = 100;
    for (;; k++) {
        assert_true(k < 1100); /* a rebuild comes long before */
        const uint64_t *keys_before = t.keys;
        assert_int_equal(kvs__table_put(&t, k, val_of(k)), KVS_OK);
        if (t.keys != keys_before)
            break;
        assert_ptr_equal(kvs__table_del(&t, k), val_of(k));
    }
    assert_int_equal(t.count, 3);
    assert_int_equal(t.used_or_deleted, 3); /* the tombstones are gone */
    assert_ptr_equal(kvs__table_get(&t, 2), val_of(2));
    assert_ptr_equal(kvs__table_get(&t, 3), val_of(3));
    assert_ptr_equal(kvs__table_get(&t, k), val_of(k));
    for (uintptr_t gone = 100; gone < k; gone++)
        assert_null(kvs__table_get(&t, gone));
    /* The table keeps working on the swapped arrays. */
    assert_int_equal(kvs__table_put(&t, 4, val_of(4)), KVS_OK);
    assert_int_equal(kvs__table_put(&t, 5, val_of(5)), KVS_EFULL);
    assert_ptr_equal(kvs__table_del(&t, 2), val_of(2));
    assert_ptr_equal(kvs__table_get(&t, 4), val_of(4));
    kvs__table_fini(&t);
}

#define RAND_MAX_ITEMS 64u
#define RAND_UNIVERSE 160u
#define RAND_OPS 100000u

/* 100k random put/get/del over a universe of 160 keys (with 0 and
 * UINT64_MAX among them) into a 64-item table, against a reference array. */
static void test_table_random_ops_match_reference(void **state)
{
    const uint64_t seed = 0x2545f4914f6cdd1dull;
    uint64_t rng = seed;
    uint64_t keys[RAND_UNIVERSE];
    bool present[RAND_UNIVERSE] = {false};
    uint32_t live = 0, rebuilds = 0, fulls = 0, already = 0;

    keys[0] = 0;
    keys[1] = UINT64_MAX;
    /* Keys that share low bits, so probes run into each other. */
    for (uint32_t i = 2; i < RAND_UNIVERSE / 2; i++)
        keys[i] = (uint64_t)i << 40;
    for (uint32_t i = RAND_UNIVERSE / 2; i < RAND_UNIVERSE; i++)
        keys[i] = xorshift64(&rng);

    kvs__table_t t;
    assert_int_equal(kvs__table_init(&t, RAND_MAX_ITEMS), KVS_OK);

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond))                                                                \
            fail_msg("seed %#llx step %u: %s", (unsigned long long)seed, step, #cond); \
    } while (0)

    for (uint32_t step = 0; step < RAND_OPS; step++) {
        uint64_t r = xorshift64(&rng);
        uint32_t i = (uint32_t)(r % RAND_UNIVERSE);
        uint32_t op = (uint32_t)((r >> 32) % 8);
        if (op < 4) { /* put */
            const uint64_t *keys_before = t.keys;
            int rc = kvs__table_put(&t, keys[i], val_of(i));
            if (present[i]) {
                CHECK(rc == KVS_EALREADY);
                already++;
            } else if (live == RAND_MAX_ITEMS) {
                CHECK(rc == KVS_EFULL);
                fulls++;
            } else {
                CHECK(rc == KVS_OK);
                present[i] = true;
                live++;
            }
            if (t.keys != keys_before) {
                /* A rebuild: every live key must still be found, no
                 * deleted one may come back. */
                rebuilds++;
                for (uint32_t j = 0; j < RAND_UNIVERSE; j++)
                    CHECK(kvs__table_get(&t, keys[j]) == (present[j] ? val_of(j) : NULL));
            }
        } else if (op < 7) { /* del */
            void *v = kvs__table_del(&t, keys[i]);
            CHECK(v == (present[i] ? val_of(i) : NULL));
            if (present[i])
                live--;
            present[i] = false;
        } else { /* get */
            CHECK(kvs__table_get(&t, keys[i]) == (present[i] ? val_of(i) : NULL));
        }
        CHECK(t.count == live);
        CHECK(t.used_or_deleted <= (t.mask + 1) / 4 * 3);
    }
#undef CHECK

    for (uint32_t j = 0; j < RAND_UNIVERSE; j++)
        assert_ptr_equal(kvs__table_get(&t, keys[j]), present[j] ? val_of(j) : NULL);
    /* The run did what it is for. */
    print_message("table random: %u rebuilds, %u full, %u already\n", rebuilds, fulls,
                  already);
    assert_true(rebuilds >= 100);
    assert_true(fulls > 0);
    assert_true(already > 0);
    kvs__table_fini(&t);
}

/* The probe loop is bounded by the slot count even where no empty slot is
 * left (put's rebuild keeps one, so this state is built by hand). */
static void test_table_find_bounded_without_empty_slot(void **state)
{
    kvs__table_t t;
    assert_int_equal(kvs__table_init(&t, 4), KVS_OK);
    memset(t.state, 2, t.mask + 1);
    assert_null(kvs__table_get(&t, 1));
    assert_null(kvs__table_del(&t, 1));
    kvs__table_fini(&t);
}

static void test_table_fini_zeroed_is_safe(void **state)
{
    kvs__table_t t;
    memset(&t, 0, sizeof t);
    kvs__table_fini(&t);
    assert_table_zeroed(&t);
    assert_int_equal(kvs__table_init(&t, 4), KVS_OK);
    kvs__table_fini(&t);
    kvs__table_fini(&t); /* fini leaves a zeroed table: twice is safe */
    assert_table_zeroed(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_init_rejects_zero_and_too_large),
        cmocka_unit_test(test_table_init_sizes_slots),
        cmocka_unit_test(test_table_put_get_del),
        cmocka_unit_test(test_table_duplicate_is_already),
        cmocka_unit_test(test_table_full_at_max_items),
        cmocka_unit_test(test_table_delete_then_reinsert),
        cmocka_unit_test(test_table_extreme_keys),
        cmocka_unit_test(test_table_rebuild_keeps_live_keys),
        cmocka_unit_test(test_table_random_ops_match_reference),
        cmocka_unit_test(test_table_find_bounded_without_empty_slot),
        cmocka_unit_test(test_table_fini_zeroed_is_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
