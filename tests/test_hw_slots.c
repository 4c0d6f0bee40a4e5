/*
 * test_hw_slots.c - the free-slot table of hw/common/slots.c, through which
 * the host and CUDA backends hand out stream and event slots: low indices
 * first, the last one given back out next, every index once until given
 * back, and a full table refused with KVS_EFULL and a message on the device
 * that says what to raise.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "fake_backend.h"
#include "slots.h"

/* A table of cap slots on a fake device (its name starts the messages). */
typedef struct fx {
    fake_device_t dev;
    hw_slots_t t;
} fx_t;

static void fx_open(fx_t *f, uint32_t cap, const char *full)
{
    fake_device_setup(&f->dev);
    assert_true(hw_slots_init(&f->t, cap, full));
}

static int take(fx_t *f, uint32_t *i) { return hw_slots_take(&f->t, &f->dev.base, i); }

/* Takes n slots from a fresh table: they come out 0, 1, ..., n - 1. */
static void take_fresh(fx_t *f, uint32_t n)
{
    for (uint32_t want = 0; want < n; want++) {
        uint32_t i = 99;
        assert_int_equal(take(f, &i), KVS_OK);
        assert_int_equal(i, want);
    }
}

static void test_hw_slots_hands_out_low_indices_first(void **state)
{
    fx_t f;
    fx_open(&f, 3, HW_SLOTS_FULL_STREAMS);
    take_fresh(&f, 3);
    hw_slots_fini(&f.t);
}

static void test_hw_slots_full_table_is_refused_with_what_to_raise(void **state)
{
    fx_t f;
    fx_open(&f, 2, HW_SLOTS_FULL_EVENTS);
    take_fresh(&f, 2);
    uint32_t i = 77;
    assert_int_equal(take(&f, &i), KVS_EFULL);
    assert_int_equal(i, 77); /* untouched */
    assert_string_equal(f.dev.base.last_backend_msg,
                        "fake-device: all 2 events live; destroy completed events or "
                        "raise max_events");
    /* One given back: taken again, then full again. */
    hw_slots_put(&f.t, 1);
    assert_int_equal(take(&f, &i), KVS_OK);
    assert_int_equal(i, 1);
    assert_int_equal(take(&f, &i), KVS_EFULL);
    hw_slots_fini(&f.t);
}

static void test_hw_slots_last_given_back_goes_out_next(void **state)
{
    fx_t f;
    fx_open(&f, 4, HW_SLOTS_FULL_STREAMS);
    take_fresh(&f, 4);
    hw_slots_put(&f.t, 2);
    hw_slots_put(&f.t, 0);
    uint32_t i;
    assert_int_equal(take(&f, &i), KVS_OK);
    assert_int_equal(i, 0);
    assert_int_equal(take(&f, &i), KVS_OK);
    assert_int_equal(i, 2);
    assert_int_equal(take(&f, &i), KVS_EFULL);
    hw_slots_fini(&f.t);
}

/* Every index exactly once until given back, over many take/put rounds. */
static void test_hw_slots_never_hands_out_a_taken_index(void **state)
{
    enum { CAP = 16 };
    fx_t f;
    fx_open(&f, CAP, HW_SLOTS_FULL_STREAMS);
    bool taken[CAP] = {false};
    uint32_t n_taken = 0;
    uint64_t x = 88172645463325252ull; /* xorshift64: a fixed sequence */
    for (int round = 0; round < 2000; round++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (x % 3 != 0) {
            uint32_t i;
            const int rc = take(&f, &i);
            if (n_taken == CAP) {
                assert_int_equal(rc, KVS_EFULL);
                continue;
            }
            assert_int_equal(rc, KVS_OK);
            assert_true(i < CAP);
            assert_false(taken[i]);
            taken[i] = true;
            n_taken++;
        } else if (n_taken > 0) {
            uint32_t i = (uint32_t)(x >> 32) % CAP;
            while (!taken[i])
                i = (i + 1) % CAP;
            taken[i] = false;
            n_taken--;
            hw_slots_put(&f.t, i);
        }
    }
    hw_slots_fini(&f.t);
}

static void test_hw_slots_empty_table_and_fini_twice(void **state)
{
    fx_t f;
    fx_open(&f, 0, HW_SLOTS_FULL_STREAMS);
    uint32_t i;
    assert_int_equal(take(&f, &i), KVS_EFULL);
    assert_non_null(strstr(f.dev.base.last_backend_msg, "all 0 streams in use"));
    hw_slots_fini(&f.t);
    hw_slots_fini(&f.t); /* harmless, as on a zeroed table */
    hw_slots_t zero = {0};
    hw_slots_fini(&zero);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hw_slots_hands_out_low_indices_first),
        cmocka_unit_test(test_hw_slots_full_table_is_refused_with_what_to_raise),
        cmocka_unit_test(test_hw_slots_last_given_back_goes_out_next),
        cmocka_unit_test(test_hw_slots_never_hands_out_a_taken_index),
        cmocka_unit_test(test_hw_slots_empty_table_and_fini_twice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
