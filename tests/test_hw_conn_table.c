/*
 * test_hw_conn_table.c - hw/net/conn_table.c, the connection table both
 * network fabrics keep: a new connection takes the first FREE slot with
 * the next generation and starts zeroed; a token names one use of a slot,
 * so a stale one finds nothing; the handle check refuses what is not a
 * live connection and a DEAD one with its reason; failing keeps the first
 * status and reason; DISCONNECT reports it once; connect's arguments are
 * checked. Driven on a fabric base with no ops: the table only records
 * refusals on it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "conn_table.h"

struct kvs_conn {
    hw_net_conn_t net;
    uint64_t own; /* a fabric's fields after the base */
};

typedef struct fixture {
    kvs_fabric_t fab;
    kvs_conn_t conns[2];
    hw_net_conns_t t;
} fixture_t;

static void fixture_init(fixture_t *x)
{
    memset(x, 0, sizeof *x);
    hw_net_conns_init(&x->t, &x->fab, "test", x->conns, sizeof x->conns[0], 2);
}

static bool conn_fail(kvs_conn_t *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const bool failed = hw_net_conn_vfail(&c->net, status, fmt, ap);
    va_end(ap);
    return failed;
}

static void test_hw_conn_table_slots_and_tokens(void **state)
{
    (void)state;
    fixture_t x;
    fixture_init(&x);
    assert_int_equal(x.conns[1].net.slot, 1);
    x.conns[0].own = 7; /* left over from an earlier use */
    kvs_conn_t *a = hw_net_conn_alloc(&x.t, HW_NET_CONN_OWN);
    kvs_conn_t *b = hw_net_conn_alloc(&x.t, HW_NET_CONN_UP);
    assert_ptr_equal(a, &x.conns[0]);
    assert_ptr_equal(b, &x.conns[1]);
    assert_int_equal(a->own, 0);
    assert_int_equal(a->net.state, HW_NET_CONN_OWN);
    assert_null(hw_net_conn_alloc(&x.t, HW_NET_CONN_UP));
    assert_int_equal(hw_net_conn_full(&x.t), KVS_EFULL);
    assert_non_null(strstr(x.fab.last_backend_msg, "all 2 connections"));

    const uint32_t token = hw_net_conn_token(&a->net);
    assert_int_equal(token, 0u | 1u << 16);
    assert_ptr_equal(hw_net_conn_by_token(&x.t, token), a);
    assert_ptr_equal(hw_net_conn_by_token(&x.t, 1u | 1u << 16), b);
    assert_null(hw_net_conn_by_token(&x.t, 2u | 1u << 16)); /* no such slot */
    hw_net_conn_free(&a->net);
    assert_null(hw_net_conn_by_token(&x.t, token)); /* FREE */
    assert_ptr_equal(hw_net_conn_alloc(&x.t, HW_NET_CONN_UP), a);
    assert_null(hw_net_conn_by_token(&x.t, token)); /* the slot's next use */
    assert_ptr_equal(hw_net_conn_by_token(&x.t, hw_net_conn_token(&a->net)), a);
}

static void test_hw_conn_table_check(void **state)
{
    (void)state;
    fixture_t x;
    fixture_init(&x);
    kvs_conn_t *a = hw_net_conn_alloc(&x.t, HW_NET_CONN_UP);
    kvs_conn_t *out = NULL;
    assert_int_equal(hw_net_conn_check(&x.t, a, "send", &out), KVS_OK);
    assert_ptr_equal(out, a);
    assert_int_equal(hw_net_conn_check(&x.t, &x.conns[1], "send", &out), KVS_EINVAL); /* FREE */
    assert_int_equal(hw_net_conn_check(&x.t, NULL, "send", &out), KVS_EINVAL);
    assert_int_equal(hw_net_conn_check(&x.t, (kvs_conn_t *)((char *)a + 8), "send", &out),
                     KVS_EINVAL);
    assert_non_null(strstr(x.fab.last_backend_msg, "not a live connection"));
    assert_null(hw_net_conns_of(&x.t, &x.conns[1]));

    assert_true(conn_fail(a, KVS_ETIMEDOUT, "peer %s gone", "p"));
    assert_false(conn_fail(a, KVS_EPROTO, "later")); /* the first failure stays */
    assert_false(conn_fail(&x.conns[1], KVS_EPEER, "free")); /* nothing to fail */
    assert_int_equal(hw_net_conn_check(&x.t, a, "write", &out), KVS_EPEER);
    assert_non_null(strstr(x.fab.last_backend_msg, "write on a failed connection: peer p gone"));

    const kvs_completion_t down = hw_net_conn_down(a);
    assert_int_equal(down.kind, KVS_COMPLETION_DISCONNECT);
    assert_int_equal(down.status, KVS_ETIMEDOUT);
    assert_ptr_equal(down.conn, a);
    assert_int_equal(down.len_bytes, strlen("peer p gone"));
    assert_string_equal((const char *)down.msg, "peer p gone"); /* why, for the core's log */
    assert_true(a->net.down_told);
}

static void test_hw_conn_table_peer(void **state)
{
    (void)state;
    fixture_t x;
    fixture_init(&x);
    kvs_conn_t *out = NULL;
    struct sockaddr_storage dst;
    assert_int_equal(hw_net_conn_peer(&x.t, "127.0.0.1:4791", &out, &dst), KVS_OK);
    assert_int_equal(dst.ss_family, AF_INET);
    assert_int_equal(hw_net_conn_peer(&x.t, NULL, &out, &dst), KVS_EINVAL);
    assert_non_null(strstr(x.fab.last_backend_msg, "connect on test: peer and out"));
    assert_int_equal(hw_net_conn_peer(&x.t, "127.0.0.1:4791", NULL, &dst), KVS_EINVAL);
    assert_int_equal(hw_net_conn_peer(&x.t, "no port", &out, &dst), KVS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hw_conn_table_slots_and_tokens),
        cmocka_unit_test(test_hw_conn_table_check),
        cmocka_unit_test(test_hw_conn_table_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
