/*
 * test_hw_rkeys.c - the remote-key tables of hw/net/rkeys.c that the
 * verbs (4-byte keys) and ofi (8-byte keys) fabrics share: a registration
 * of many pieces travels in as many KEYS messages as fit and resolves, on
 * the receiving side, (id, address) to the right piece key, offset and
 * bytes left; an incomplete or dropped table is unknown; an address outside
 * is out of range; malformed messages and a table past max are refused
 * with a message and change nothing; one sent again starts over.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "net_util.h"
#include "rkeys.h"

#define MSGS_MAX 8

/* What hw_rkeys_send sent, message by message. */
typedef struct wire {
    uint8_t msg[MSGS_MAX][KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t len[MSGS_MAX];
    uint32_t n;
    int fail_at; /* 1-based send that fails, 0: none */
} wire_t;

static int wire_send(void *conn, const uint8_t *msg, uint32_t len_bytes)
{
    wire_t *w = conn;
    assert_true(w->n < MSGS_MAX);
    if (w->fail_at != 0 && (int)w->n + 1 == w->fail_at)
        return KVS_EAGAIN;
    memcpy(w->msg[w->n], msg, len_bytes);
    w->len[w->n++] = len_bytes;
    return KVS_OK;
}

/* Piece i's key: distinct, and wider than 32 bits for 8-byte keys. */
static uint64_t key_of(const void *ctx, uint32_t i)
{
    (void)ctx;
    return UINT64_C(0x1100000000) + 7u * i + 1u;
}

static void check_roundtrip(uint32_t key_bytes)
{
    const uint32_t per = HW_RKEYS_PER_MSG(key_bytes);
    const hw_rkeys_reg_t r = {.id = 5, .npieces = per + 3, .base = 0x10000,
                              .piece_bytes = 4096, .len_bytes = (uint64_t)(per + 2) * 4096 + 100};
    wire_t w = {0};
    assert_int_equal(hw_rkeys_send(&r, key_bytes, key_of, NULL, wire_send, &w), KVS_OK);
    assert_int_equal(w.n, 2);
    assert_int_equal(w.len[0], HW_RKEYS_HDR_BYTES + key_bytes * per);
    assert_int_equal(w.len[1], HW_RKEYS_HDR_BYTES + key_bytes * 3);

    hw_rkeys_t s = {0};
    uint64_t key = 0, off = 0, left = 0;
    const hw_rkeys_entry_t *t;
    char why[128];
    /* Half a table is not usable yet. */
    assert_int_equal(hw_rkeys_recv(&s, 4, key_bytes, 2, w.msg[0], w.len[0], why, sizeof why),
                     KVS_OK);
    assert_int_equal(hw_rkeys_lookup(&s, 5, 0x10000, &key, &off, &left, &t), KVS_ENOENT);
    assert_int_equal(hw_rkeys_recv(&s, 4, key_bytes, 2, w.msg[1], w.len[1], why, sizeof why),
                     KVS_OK);

    const uint64_t mask = key_bytes == 4 ? UINT32_MAX : UINT64_MAX;
    assert_int_equal(hw_rkeys_lookup(&s, 5, 0x10000 + 4096 + 10, &key, &off, &left, &t), KVS_OK);
    assert_int_equal(key, key_of(NULL, 1) & mask);
    assert_int_equal(off, 10);
    assert_int_equal(left, 4096 - 10);
    /* The last piece is short. */
    const uint64_t last = 0x10000 + (uint64_t)(per + 2) * 4096;
    assert_int_equal(hw_rkeys_lookup(&s, 5, last, &key, &off, &left, &t), KVS_OK);
    assert_int_equal(key, key_of(NULL, per + 2) & mask);
    assert_int_equal(left, 100);
    assert_int_equal(hw_rkeys_lookup(&s, 5, last + 100, &key, &off, &left, &t), KVS_ERANGE);
    assert_non_null(t);
    assert_int_equal(hw_rkeys_lookup(&s, 5, 0xffff, &key, &off, &left, &t), KVS_ERANGE);
    assert_int_equal(hw_rkeys_lookup(&s, 6, 0x10000, &key, &off, &left, &t), KVS_ENOENT);

    uint8_t drop[4];
    hw_put32(drop, 5);
    hw_rkeys_drop(&s, drop, sizeof drop);
    assert_int_equal(s.n, 0);
    assert_int_equal(hw_rkeys_lookup(&s, 5, 0x10000, &key, &off, &left, &t), KVS_ENOENT);
    hw_rkeys_free(&s);
}

static void test_hw_rkeys_roundtrip_4_byte_keys(void **state)
{
    (void)state;
    check_roundtrip(4);
}

static void test_hw_rkeys_roundtrip_8_byte_keys(void **state)
{
    (void)state;
    check_roundtrip(8);
}

static void test_hw_rkeys_send_failure_stops(void **state)
{
    (void)state;
    const hw_rkeys_reg_t r = {.id = 1, .npieces = HW_RKEYS_PER_MSG(8) * 2, .base = 4096,
                              .piece_bytes = 4096,
                              .len_bytes = (uint64_t)HW_RKEYS_PER_MSG(8) * 2 * 4096};
    wire_t w = {.fail_at = 2};
    assert_int_equal(hw_rkeys_send(&r, 8, key_of, NULL, wire_send, &w), KVS_EAGAIN);
    assert_int_equal(w.n, 1);
}

/* One small registration's only KEYS message. */
static void one_msg(wire_t *w, uint32_t id, uint32_t npieces)
{
    const hw_rkeys_reg_t r = {.id = id, .npieces = npieces, .base = 4096, .piece_bytes = 4096,
                              .len_bytes = (uint64_t)npieces * 4096};
    *w = (wire_t){0};
    assert_int_equal(hw_rkeys_send(&r, 8, key_of, NULL, wire_send, w), KVS_OK);
    assert_int_equal(w->n, 1);
}

static void test_hw_rkeys_malformed_changes_nothing(void **state)
{
    (void)state;
    hw_rkeys_t s = {0};
    wire_t w;
    char why[128];
    one_msg(&w, 3, 2);
    /* Too short, a length that does not match, a piece size of 0, a total
     * the pieces cannot hold, fewer pieces than the fabric tables. */
    assert_int_equal(hw_rkeys_recv(&s, 4, 8, 1, w.msg[0], 39, why, sizeof why), KVS_EPROTO);
    assert_int_equal(hw_rkeys_recv(&s, 4, 8, 1, w.msg[0], w.len[0] - 1, why, sizeof why),
                     KVS_EPROTO);
    assert_non_null(strstr(why, "incompatible kvstage"));
    uint8_t bad[KVS_CONTROL_MSG_MAX_BYTES];
    memcpy(bad, w.msg[0], w.len[0]);
    hw_put64(bad + 24, 0);
    assert_int_equal(hw_rkeys_recv(&s, 4, 8, 1, bad, w.len[0], why, sizeof why), KVS_EPROTO);
    memcpy(bad, w.msg[0], w.len[0]);
    hw_put64(bad + 32, 3 * 4096);
    assert_int_equal(hw_rkeys_recv(&s, 4, 8, 1, bad, w.len[0], why, sizeof why), KVS_EPROTO);
    assert_int_equal(hw_rkeys_recv(&s, 4, 8, 3, w.msg[0], w.len[0], why, sizeof why),
                     KVS_EPROTO);
    assert_int_equal(s.n, 0);
    hw_rkeys_free(&s);
}

static void test_hw_rkeys_full_and_resend(void **state)
{
    (void)state;
    hw_rkeys_t s = {0};
    wire_t w;
    char why[128];
    for (uint32_t id = 1; id <= 4; id++) {
        one_msg(&w, id, 2);
        assert_int_equal(hw_rkeys_recv(&s, 4, 8, 1, w.msg[0], w.len[0], why, sizeof why),
                         KVS_OK);
    }
    one_msg(&w, 9, 2);
    assert_int_equal(hw_rkeys_recv(&s, 4, 8, 1, w.msg[0], w.len[0], why, sizeof why), KVS_EFULL);
    assert_non_null(strstr(why, "raise max_mrs"));
    assert_int_equal(s.n, 4);
    /* Registration 2 sent again with 3 pieces: it starts over, no slot taken. */
    one_msg(&w, 2, 3);
    assert_int_equal(hw_rkeys_recv(&s, 4, 8, 1, w.msg[0], w.len[0], why, sizeof why), KVS_OK);
    assert_int_equal(s.n, 4);
    uint64_t key, off, left;
    const hw_rkeys_entry_t *t;
    assert_int_equal(hw_rkeys_lookup(&s, 2, 4096 + 2 * 4096, &key, &off, &left, &t), KVS_OK);
    assert_int_equal(key, key_of(NULL, 2));
    assert_int_equal(t->filled, 3);
    hw_rkeys_free(&s);
    assert_int_equal(s.n, 0);
    assert_null(s.e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hw_rkeys_roundtrip_4_byte_keys),
        cmocka_unit_test(test_hw_rkeys_roundtrip_8_byte_keys),
        cmocka_unit_test(test_hw_rkeys_send_failure_stops),
        cmocka_unit_test(test_hw_rkeys_malformed_changes_nothing),
        cmocka_unit_test(test_hw_rkeys_full_and_resend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
