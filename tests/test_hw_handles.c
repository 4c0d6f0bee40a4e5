/*
 * test_hw_handles.c - hw/net/handles.h, the arithmetic both network
 * fabrics check handles and split registrations with: a pointer is a
 * handle only at an element's start inside the table (never NULL, below,
 * between two elements or past the end); every byte of a split
 * registration falls in exactly one piece, with the bytes to that piece's
 * end, the last piece ending at the registration's end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "handles.h"

typedef struct elem {
    uint64_t a, b, c; /* 24 bytes: not a power of two */
} elem_t;

static void test_in_table(void **state)
{
    (void)state;
    elem_t t[4];
    const char *base = (const char *)t;
    for (uint32_t i = 0; i < 4; i++)
        assert_true(hw_in_table(t, &t[i], sizeof *t, 4));
    assert_false(hw_in_table(t, NULL, sizeof *t, 4));
    assert_false(hw_in_table(t, &t[3], sizeof *t, 3)); /* past n */
    assert_false(hw_in_table(t, base + 8, sizeof *t, 4)); /* inside an element */
    assert_false(hw_in_table(t, base + sizeof t, sizeof *t, 4)); /* one past the end */
    assert_false(hw_in_table(&t[1], &t[0], sizeof *t, 3)); /* below the table */
    assert_false(hw_in_table(t, &t[0], sizeof *t, 0)); /* an empty table */
}

/* Every offset of registrations split unevenly and evenly, against a
 * walk of the pieces. */
static void test_piece_at(void **state)
{
    (void)state;
    const struct {
        uint64_t len, piece;
    } cases[] = {{10, 4}, {12, 4}, {1, 4}, {4, 4}, {4097, 4096}, {7, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const uint64_t len = cases[k].len, pb = cases[k].piece;
        const uint32_t n = (uint32_t)((len + pb - 1) / pb);
        for (uint64_t off = 0; off < len; off++) {
            uint64_t left = 0;
            const uint32_t i = hw_piece_at(off, pb, n, len, &left);
            const uint64_t start = (uint64_t)i * pb;
            const uint64_t end = i + 1 == n ? len : start + pb;
            assert_true(i < n);
            assert_true(start <= off && off < end);
            assert_int_equal(left, end - off);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_table),
        cmocka_unit_test(test_piece_at),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
