/*
 * test_hw_alloc_table.c - the allocation table of hw/common/alloc_table.c,
 * against which the host and CUDA backends validate every range: entries
 * kept in address order with their payload, lookups that accept exactly
 * the ranges inside one allocation (an empty range up to one past its end)
 * and nothing straddling, a full table and a free of an address that
 * starts no allocation refused with KVS_EFULL / KVS_ENOENT and the
 * backends' messages on the device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "alloc_table.h"
#include "fake_backend.h"
#include "xorshift.h"

/* A table of cap entries on a fake device (its name starts the messages). */
typedef struct fx {
    fake_device_t dev;
    hw_alloc_table_t t;
} fx_t;

static void fx_open(fx_t *f, uint32_t cap)
{
    fake_device_setup(&f->dev);
    assert_true(hw_alloc_table_init(&f->t, cap));
}

/* Inserts [addr, addr + len) with a payload derived from addr. */
static void put(fx_t *f, uint64_t addr, uint64_t len)
{
    assert_int_equal(hw_alloc_table_room(&f->t, &f->dev.base), KVS_OK);
    const hw_alloc_t a = {.addr = addr,
                          .len_bytes = len,
                          .base = (void *)(uintptr_t)(addr - 0x10),
                          .base_bytes = len + 0x10};
    hw_alloc_table_insert(&f->t, &a);
}

/* The table holds exactly the entries starting at want[0..n), in order,
 * each with the payload put() gave it. */
static void expect_order(const fx_t *f, const uint64_t *want, uint32_t n)
{
    assert_int_equal(f->t.count, n);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(f->t.entries[i].addr, want[i]);
        assert_ptr_equal(f->t.entries[i].base, (void *)(uintptr_t)(want[i] - 0x10));
        assert_int_equal(f->t.entries[i].base_bytes, f->t.entries[i].len_bytes + 0x10);
    }
}

static const hw_alloc_t *look(const fx_t *f, uint64_t addr, uint64_t len)
{
    return hw_alloc_table_lookup(&f->t, addr, len);
}

/* Where the allocation holding [addr, addr + len) starts; NONE if none. */
#define NONE UINT64_MAX
static uint64_t start_of(const fx_t *f, uint64_t addr, uint64_t len)
{
    const hw_alloc_t *a = look(f, addr, len);
    return a != NULL ? a->addr : NONE;
}

static void test_hw_alloc_table_insert_keeps_address_order(void **state)
{
    fx_t f;
    fx_open(&f, 8);
    put(&f, 0x5000, 0x100);
    put(&f, 0x1000, 0x100);
    put(&f, 0x9000, 0x100);
    put(&f, 0x3000, 0x100);
    put(&f, 0x0100, 0x100);
    const uint64_t want[] = {0x0100, 0x1000, 0x3000, 0x5000, 0x9000};
    expect_order(&f, want, 5);
    hw_alloc_table_fini(&f.t);
}

static void test_hw_alloc_table_lookup_inside_only(void **state)
{
    fx_t f;
    fx_open(&f, 4);
    /* [0x1000, 0x1100) and [0x1100, 0x1180) touch; a gap up to 0x2000. */
    put(&f, 0x1000, 0x100);
    put(&f, 0x1100, 0x80);
    put(&f, 0x2000, 0x40);

    /* Inside: whole, a start, a middle, an end. */
    assert_int_equal(start_of(&f, 0x1000, 0x100), 0x1000);
    assert_int_equal(start_of(&f, 0x1000, 1), 0x1000);
    assert_int_equal(start_of(&f, 0x1010, 0x20), 0x1000);
    assert_int_equal(start_of(&f, 0x10ff, 1), 0x1000);
    assert_int_equal(start_of(&f, 0x1100, 0x80), 0x1100);
    assert_int_equal(start_of(&f, 0x2000, 0x40), 0x2000);

    /* Straddling: into the touching neighbour, past the end into the gap,
     * longer than the allocation, a length that wraps 64 bits. */
    assert_null(look(&f, 0x10f0, 0x20));
    assert_null(look(&f, 0x1100, 0x81));
    assert_null(look(&f, 0x1000, 0x101));
    assert_null(look(&f, 0x2001, UINT64_MAX));

    /* One past the end: an empty range is the allocation's (a one-past
     * pointer), a byte is not; where a neighbour starts there, it is the
     * neighbour's. */
    assert_int_equal(start_of(&f, 0x2040, 0), 0x2000);
    assert_null(look(&f, 0x2040, 1));
    assert_int_equal(start_of(&f, 0x1100, 0), 0x1100);

    /* Outside any: below the first, in the gap, far above. */
    assert_null(look(&f, 0x0fff, 1));
    assert_null(look(&f, 0x0fff, 0));
    assert_null(look(&f, 0x1800, 0));
    assert_null(look(&f, 0x1181, 1));
    assert_null(look(&f, UINT64_MAX, 0));

    /* The kvs_copy_mem_fn the backends hand kvs_copy_desc_check. */
    assert_true(hw_alloc_table_holds(&f.t, 0x1010, 0x20));
    assert_false(hw_alloc_table_holds(&f.t, 0x10f0, 0x20));
    hw_alloc_table_fini(&f.t);
}

static void test_hw_alloc_table_empty_table_holds_nothing(void **state)
{
    fx_t f;
    fx_open(&f, 2);
    assert_null(look(&f, 0, 0));
    assert_null(look(&f, 0x1000, 1));
    assert_false(hw_alloc_table_holds(&f.t, 0x1000, 0));
    hw_alloc_t out = {.addr = 7};
    assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, 0, &out), KVS_ENOENT);
    assert_int_equal(out.addr, 7); /* untouched */
    hw_alloc_table_fini(&f.t);
}

static void test_hw_alloc_table_full_is_refused_with_what_to_raise(void **state)
{
    fx_t f;
    fx_open(&f, 2);
    put(&f, 0x2000, 0x10);
    put(&f, 0x1000, 0x10);
    assert_int_equal(hw_alloc_table_room(&f.t, &f.dev.base), KVS_EFULL);
    assert_string_equal(f.dev.base.last_backend_msg,
                        "allocation table of fake-device full: 2 live allocations; free "
                        "some or raise max_allocs");
    /* One freed: room for one, then full again. */
    hw_alloc_t out;
    assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, 0x2000, &out), KVS_OK);
    put(&f, 0x3000, 0x10);
    assert_int_equal(hw_alloc_table_room(&f.t, &f.dev.base), KVS_EFULL);
    hw_alloc_table_fini(&f.t);

    /* A table of none is full from the start. */
    fx_open(&f, 0);
    assert_int_equal(hw_alloc_table_room(&f.t, &f.dev.base), KVS_EFULL);
    hw_alloc_table_fini(&f.t);
    hw_alloc_table_fini(&f.t); /* harmless, as on a zeroed table */
    hw_alloc_table_t zero = {0};
    hw_alloc_table_fini(&zero);
}

static void test_hw_alloc_table_remove_needs_the_start_address(void **state)
{
    fx_t f;
    fx_open(&f, 4);
    put(&f, 0x1000, 0x100);
    put(&f, 0x3000, 0x100);
    const uint64_t not_starts[] = {0x1001, 0x10ff, 0x1100, 0x0fff, 0x2000, 0x3080, 0};
    for (size_t k = 0; k < sizeof not_starts / sizeof not_starts[0]; k++) {
        hw_alloc_t out = {.addr = 7};
        assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, not_starts[k], &out),
                         KVS_ENOENT);
        assert_int_equal(out.addr, 7);
    }
    assert_string_equal(f.dev.base.last_backend_msg,
                        "mem_free on fake-device: 0x0 is not the start of a live allocation "
                        "(never allocated or already freed)");
    assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, 0x1001, &(hw_alloc_t){0}),
                     KVS_ENOENT);
    assert_non_null(strstr(f.dev.base.last_backend_msg, "0x1001 is not the start"));
    const uint64_t want[] = {0x1000, 0x3000};
    expect_order(&f, want, 2);

    /* Freed once: a second free is refused the same way. */
    hw_alloc_t out;
    assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, 0x3000, &out), KVS_OK);
    assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, 0x3000, &out), KVS_ENOENT);
    hw_alloc_table_fini(&f.t);
}

/* The application's memory: attached entries sit among allocations, never
 * overlap one, refuse mem_free and leave only through detach. */
static void test_hw_alloc_table_attach_and_detach(void **state)
{
    fx_t f;
    fx_open(&f, 3);
    put(&f, 0x1000, 0x100);
    kvs_device_t *d = &f.dev.base;
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", 0x2000, 0x100, NULL), KVS_OK);
    assert_true(f.t.entries[1].attached);
    assert_null(f.t.entries[1].base);
    assert_int_equal(start_of(&f, 0x2010, 0x10), 0x2000);
    /* Overlaps, either side, of either kind, are refused by name. */
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", 0x10ff, 0x10, NULL), KVS_EINVAL);
    assert_non_null(strstr(d->last_backend_msg, "overlaps the live device allocation "
                                                "[0x1000, +256)"));
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", 0x1f00, 0x101, NULL), KVS_EINVAL);
    assert_non_null(strstr(d->last_backend_msg, "overlaps the live attached range [0x2000"));
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", 0x2000, 0x100, NULL), KVS_EINVAL);
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", 0x5000, 0, NULL), KVS_EINVAL);
    assert_non_null(strstr(d->last_backend_msg, "is not a memory range"));
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", 0, 0x10, NULL), KVS_EINVAL);
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", UINT64_MAX - 4, 0x10, NULL), KVS_EINVAL);
    /* Touching ranges are fine; then the table is full. */
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", 0x1f00, 0x100, NULL), KVS_OK);
    assert_int_equal(hw_alloc_table_attach(&f.t, d, "attach", 0x3000, 0x100, NULL), KVS_EFULL);
    /* mem_free refuses the application's memory; detach refuses the device's. */
    hw_alloc_t out = {.addr = 7};
    assert_int_equal(hw_alloc_table_remove(&f.t, d, 0x2000, &out), KVS_EINVAL);
    assert_non_null(strstr(d->last_backend_msg, "the application's memory, attached"));
    assert_int_equal(out.addr, 7);
    assert_int_equal(hw_alloc_table_detach(&f.t, d, "detach", 0x1000, NULL), KVS_ENOENT);
    assert_non_null(strstr(d->last_backend_msg,
                           "detach on fake-device: 0x1000 is not the start of an attached"));
    assert_int_equal(hw_alloc_table_detach(&f.t, d, "detach", 0x2010, NULL), KVS_ENOENT);
    assert_int_equal(f.t.count, 3);
    assert_int_equal(hw_alloc_table_detach(&f.t, d, "detach", 0x2000, NULL), KVS_OK);
    assert_int_equal(hw_alloc_table_detach(&f.t, d, "detach", 0x2000, NULL), KVS_ENOENT);
    assert_int_equal(start_of(&f, 0x2010, 0x10), NONE);
    assert_int_equal(hw_alloc_table_detach(&f.t, d, "detach", 0x1f00, NULL), KVS_OK);
    const uint64_t want[] = {0x1000};
    expect_order(&f, want, 1);
    hw_alloc_table_fini(&f.t);
}

static void test_hw_alloc_table_remove_in_the_middle_keeps_order(void **state)
{
    fx_t f;
    fx_open(&f, 8);
    for (uint64_t a = 0x1000; a <= 0x5000; a += 0x1000)
        put(&f, a, 0x200 + a / 0x100);
    hw_alloc_t out;
    assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, 0x3000, &out), KVS_OK);
    /* What the backend frees: the whole entry, payload included. */
    assert_int_equal(out.addr, 0x3000);
    assert_int_equal(out.len_bytes, 0x230);
    assert_ptr_equal(out.base, (void *)(uintptr_t)0x2ff0);
    assert_int_equal(out.base_bytes, 0x240);
    const uint64_t want1[] = {0x1000, 0x2000, 0x4000, 0x5000};
    expect_order(&f, want1, 4);
    assert_null(look(&f, 0x3000, 0));
    assert_int_equal(start_of(&f, 0x4000, 0x240), 0x4000);

    /* The ends too. */
    assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, 0x5000, &out), KVS_OK);
    assert_int_equal(hw_alloc_table_remove(&f.t, &f.dev.base, 0x1000, &out), KVS_OK);
    const uint64_t want2[] = {0x2000, 0x4000};
    expect_order(&f, want2, 2);
    put(&f, 0x3000, 0x10);
    const uint64_t want3[] = {0x2000, 0x3000, 0x4000};
    expect_order(&f, want3, 3);
    hw_alloc_table_fini(&f.t);
}

/* Random inserts and removes against a plain list of what is live: every
 * lookup and remove answers as the list does, and the order holds. */
static void test_hw_alloc_table_matches_a_model(void **state)
{
    enum { CAP = 32, SLOTS = 64 };
    fx_t f;
    fx_open(&f, CAP);
    bool live[SLOTS] = {false}; /* slot k: [0x10000 * (k + 1), +0x100 + k) */
    uint32_t n_live = 0;
    uint64_t seed = 88172645463325252ull; /* a fixed sequence */
    for (int round = 0; round < 4000; round++) {
        const uint64_t x = xorshift64(&seed);
        const uint32_t k = (uint32_t)(x >> 40) % SLOTS;
        const uint64_t addr = 0x10000ull * (k + 1), len = 0x100 + k;
        const uint64_t off = (x >> 8) % (len + 2); /* sometimes past the end */
        switch (x % 3) {
        case 0:
            if (live[k])
                break;
            if (n_live == CAP) {
                assert_int_equal(hw_alloc_table_room(&f.t, &f.dev.base), KVS_EFULL);
                break;
            }
            put(&f, addr, len);
            live[k] = true;
            n_live++;
            break;
        case 1: {
            hw_alloc_t out = {0};
            const int rc = hw_alloc_table_remove(&f.t, &f.dev.base, addr + (off & 1), &out);
            const bool ok = live[k] && (off & 1) == 0;
            assert_int_equal(rc, ok ? KVS_OK : KVS_ENOENT);
            if (ok) {
                assert_int_equal(out.addr, addr);
                assert_int_equal(out.len_bytes, len);
                live[k] = false;
                n_live--;
            }
            break;
        }
        default: {
            const hw_alloc_t *a = look(&f, addr + off, 1);
            if (live[k] && off < len)
                assert_true(a != NULL && a->addr == addr);
            else
                assert_null(a);
            break;
        }
        }
        assert_int_equal(f.t.count, n_live);
        for (uint32_t i = 1; i < f.t.count; i++)
            assert_true(f.t.entries[i - 1].addr < f.t.entries[i].addr);
    }
    hw_alloc_table_fini(&f.t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hw_alloc_table_insert_keeps_address_order),
        cmocka_unit_test(test_hw_alloc_table_lookup_inside_only),
        cmocka_unit_test(test_hw_alloc_table_empty_table_holds_nothing),
        cmocka_unit_test(test_hw_alloc_table_full_is_refused_with_what_to_raise),
        cmocka_unit_test(test_hw_alloc_table_remove_needs_the_start_address),
        cmocka_unit_test(test_hw_alloc_table_attach_and_detach),
        cmocka_unit_test(test_hw_alloc_table_remove_in_the_middle_keeps_order),
        cmocka_unit_test(test_hw_alloc_table_matches_a_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
