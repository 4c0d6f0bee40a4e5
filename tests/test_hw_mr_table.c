/*
 * test_hw_mr_table.c - hw/net/mr_table.c, the registration table both
 * network fabrics keep: a range is one piece when it fits in max_mr_bytes,
 * else whole-page pieces (at least a page); too many pieces, a full table
 * and bad arguments are refused with what to change; ids are never 0;
 * deregistering needs a live handle without grants; a write's source lies
 * inside its registration. Driven on a fabric base with no ops: the table
 * only records refusals on it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "mr_table.h"

struct kvs_mr {
    hw_net_mr_t net;
    uint64_t own; /* a fabric's fields after the base */
};

typedef struct fixture {
    kvs_fabric_t fab;
    kvs_mr_t mrs[2];
    hw_net_mrs_t t;
} fixture_t;

static void fixture_init(fixture_t *x)
{
    memset(x, 0, sizeof *x);
    hw_net_mrs_init(&x->t, &x->fab, "test", x->mrs, sizeof x->mrs[0], 2, 4096);
}

/* Registers [addr, +len) as a fabric would: plan, then open. */
static kvs_mr_t *reg(fixture_t *x, uint64_t addr, uint64_t len)
{
    kvs_mr_t *m = NULL;
    hw_net_mr_t plan;
    assert_int_equal(hw_net_mr_plan(&x->t, true, addr, len, UINT64_MAX, 4, "", &m, &plan),
                     KVS_OK);
    *m = (kvs_mr_t){.net = plan};
    hw_net_mr_open(&x->t, &m->net);
    return m;
}

static void test_hw_mr_table_pieces(void **state)
{
    (void)state;
    fixture_t x;
    fixture_init(&x);
    const struct {
        uint64_t len, max, piece, n;
    } cases[] = {
        {5000, 6000, 5000, 1},  /* fits: one piece, not cut at a page */
        {4096, 4096, 4096, 1},
        {10000, 6000, 4096, 3}, /* larger: whole pages */
        {10000, 100, 4096, 3},  /* a limit below a page: a page */
        {8192, 4096, 4096, 2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        kvs_mr_t *m = NULL;
        hw_net_mr_t plan;
        assert_int_equal(hw_net_mr_plan(&x.t, true, 0x10000, cases[k].len, cases[k].max, 8, "",
                                        &m, &plan),
                         KVS_OK);
        assert_ptr_equal(m, &x.mrs[0]);
        assert_int_equal(plan.piece_bytes, cases[k].piece);
        assert_int_equal(plan.npieces, cases[k].n);
        assert_int_equal(plan.addr, 0x10000);
        assert_int_equal(plan.len_bytes, cases[k].len);
    }
    kvs_mr_t *m = NULL;
    hw_net_mr_t plan;
    assert_int_equal(hw_net_mr_plan(&x.t, true, 0x10000, 5 * 4096, 4096, 4, "raise it", &m,
                                    &plan),
                     KVS_EINVAL);
    assert_non_null(strstr(x.fab.last_backend_msg, "raise it"));
    assert_int_equal(hw_net_mr_plan(&x.t, false, 0x10000, 1, 4096, 4, "", &m, &plan),
                     KVS_EINVAL);
    assert_int_equal(hw_net_mr_plan(&x.t, true, 0x10000, 0, 4096, 4, "", &m, &plan),
                     KVS_EINVAL);
    assert_int_equal(hw_net_mr_plan(&x.t, true, UINT64_MAX - 1, 4, 4096, 4, "", &m, &plan),
                     KVS_EINVAL);
}

static void test_hw_mr_table_full_and_ids(void **state)
{
    (void)state;
    fixture_t x;
    fixture_init(&x);
    x.t.next_id = 0x7fffffffu; /* the next but one wraps past 0 */
    kvs_mr_t *a = reg(&x, 0x1000, 100);
    kvs_mr_t *b = reg(&x, 0x2000, 100);
    assert_int_equal(a->net.id, 0x7fffffffu);
    assert_int_not_equal(b->net.id, 0);
    assert_int_equal(x.t.live, 2);
    kvs_mr_t *m = NULL;
    hw_net_mr_t plan;
    assert_int_equal(hw_net_mr_plan(&x.t, true, 0x3000, 1, 4096, 4, "", &m, &plan), KVS_EFULL);
    assert_non_null(strstr(x.fab.last_backend_msg, "raise max_mrs"));

    a->net.grants = 1;
    assert_int_equal(hw_net_mr_close_check(&x.t, a), KVS_EBUSY);
    a->net.grants = 0;
    assert_int_equal(hw_net_mr_close_check(&x.t, a), KVS_OK);
    hw_net_mr_close(&x.t, &a->net);
    assert_int_equal(x.t.live, 1);
    assert_int_equal(hw_net_mr_close_check(&x.t, a), KVS_ENOENT); /* no longer live */
    assert_int_equal(hw_net_mr_close_check(&x.t, (kvs_mr_t *)((char *)b + 8)), KVS_ENOENT);
    assert_ptr_equal(reg(&x, 0x3000, 1), a); /* the freed slot is taken again */
}

static void test_hw_mr_table_write_check(void **state)
{
    (void)state;
    fixture_t x;
    fixture_init(&x);
    kvs_mr_t *a = reg(&x, 0x1000, 100);
    kvs_mr_t *mr = NULL;
    kvs_write_desc_t d = {.local_addr = 0x1000, .local_mr = a, .len_bytes = 100,
                          .remote_addr = 0x9000};
    assert_int_equal(hw_net_write_check(&x.t, &d, &mr), KVS_OK);
    assert_ptr_equal(mr, a);
    d.local_addr = 0x1001; /* one byte past its end */
    assert_int_equal(hw_net_write_check(&x.t, &d, &mr), KVS_EINVAL);
    d.local_addr = 0x1000;
    d.remote_addr = UINT64_MAX - 10; /* wraps */
    assert_int_equal(hw_net_write_check(&x.t, &d, &mr), KVS_EINVAL);
    d.remote_addr = 0x9000;
    d.len_bytes = 0;
    assert_int_equal(hw_net_write_check(&x.t, &d, &mr), KVS_EINVAL);
    d.len_bytes = 100;
    d.local_mr = &x.mrs[1]; /* a slot, not live */
    assert_int_equal(hw_net_write_check(&x.t, &d, &mr), KVS_EINVAL);
    assert_int_equal(hw_net_write_check(&x.t, NULL, &mr), KVS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hw_mr_table_pieces),
        cmocka_unit_test(test_hw_mr_table_full_and_ids),
        cmocka_unit_test(test_hw_mr_table_write_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
