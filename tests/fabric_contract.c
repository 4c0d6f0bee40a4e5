/*
 * fabric_contract.c - the fabric contract's tests (see fabric_contract.h),
 * run by each fabric backend's test file on its own pair. Every wait is
 * bounded (fabric_pair.h's deadline); random bytes come from fixed seeds.
 */
#include "fabric_contract.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xorshift.h"

static const fc_backend_t *fc_open(void **state, fp_pair_t *p)
{
    const fc_backend_t *b = *state;
    memset(p, 0, sizeof *p);
    if (!b->open(b->ctx, p))
        skip();
    return b;
}

/* A send, retried while the fabric says KVS_EAGAIN (poll, then retry). */
static void fc_send(fp_pair_t *p, fp_side_t *s, kvs_conn_t *c, const void *msg,
                    uint32_t len, uint64_t wr_id)
{
    const uint64_t until = fp_deadline_ns();
    int rc;
    while ((rc = s->fab->ops.send(s->fab, c, msg, len, wr_id)) == KVS_EAGAIN &&
           fp_now_ns() < until)
        fp_pair_pump(p);
    if (rc != KVS_OK)
        fail_msg("send of %u bytes on %s: %s: %s", len, p->name, kvs_status_name(rc),
                 s->fab->last_backend_msg);
}

/* A write from b to a, retried while KVS_EAGAIN; the post's status. */
static int fc_write(fp_pair_t *p, const kvs_write_desc_t *w)
{
    const uint64_t until = fp_deadline_ns();
    int rc;
    while ((rc = p->b.fab->ops.write(p->b.fab, p->ab, w)) == KVS_EAGAIN &&
           fp_now_ns() < until)
        fp_pair_pump(p);
    return rc;
}

static kvs_write_desc_t fc_desc(const fp_region_t *src, uint64_t src_off,
                                const fp_region_t *dst, uint64_t dst_off, uint64_t len,
                                uint64_t rkey, uint32_t imm, uint64_t wr_id)
{
    return (kvs_write_desc_t){.local_addr = src->addr + src_off, .local_mr = src->mr,
                              .len_bytes = len, .remote_addr = dst->addr + dst_off,
                              .rkey = rkey, .with_imm = true, .imm = imm, .wr_id = wr_id};
}

/* b writes len random bytes to dst at off with imm: every byte is there
 * when a sees the IMM, and b's completion carries the wr_id. */
static void fc_write_lands(fp_pair_t *p, fp_region_t *src, fp_region_t *dst, uint64_t off,
                           uint64_t len, uint32_t imm, uint64_t seed)
{
    uint64_t s = seed;
    for (uint64_t i = 0; i < len; i++)
        src->mem[i] = (uint8_t)(xorshift64(&s) >> 56);
    const kvs_write_desc_t w = fc_desc(src, 0, dst, off, len, dst->rkey, imm, 5000 + imm);
    const int rc = fc_write(p, &w);
    if (rc != KVS_OK)
        fail_msg("write of %llu bytes on %s: %s: %s", (unsigned long long)len, p->name,
                 kvs_status_name(rc), p->b.fab->last_backend_msg);
    kvs_completion_t c = fp_take(p, &p->a, KVS_COMPLETION_IMM, p->ba);
    assert_int_equal(c.status, KVS_OK);
    assert_int_equal(c.imm, imm);
    if (memcmp(dst->mem + off, src->mem, len) != 0)
        fail_msg("write of %llu bytes on %s: the IMM came before every byte landed",
                 (unsigned long long)len, p->name);
    c = fp_take(p, &p->b, KVS_COMPLETION_WRITE, p->ab);
    assert_int_equal(c.status, KVS_OK);
    assert_int_equal(c.wr_id, 5000 + imm);
}

/* a tells b where dst is and its key, in a message b takes: a writer
 * learns a key that way (the core's STAGING_RSP), so a fabric may carry
 * what it needs for the key ahead of that message (ofi's KEYS). */
static void fc_announce(fp_pair_t *p, const fp_region_t *dst)
{
    const uint64_t m[2] = {dst->addr, dst->rkey};
    fc_send(p, &p->a, p->ba, m, sizeof m, 9);
    kvs_completion_t c = fp_take(p, &p->b, KVS_COMPLETION_RECV, p->ab);
    assert_int_equal(c.len_bytes, sizeof m);
    assert_memory_equal(c.msg, m, sizeof m);
    (void)fp_take(p, &p->a, KVS_COMPLETION_SEND, p->ba);
}

/* A message the other side then takes (b -> a or a -> b). */
static void fc_hello(fp_pair_t *p, bool to_a, const char *text)
{
    fp_side_t *from = to_a ? &p->b : &p->a, *to = to_a ? &p->a : &p->b;
    kvs_conn_t *out = to_a ? p->ab : p->ba, *in = to_a ? p->ba : p->ab;
    const uint32_t len = (uint32_t)strlen(text);
    fc_send(p, from, out, text, len, 77);
    kvs_completion_t c = fp_take(p, to, KVS_COMPLETION_RECV, in);
    assert_int_equal(c.status, KVS_OK);
    assert_int_equal(c.len_bytes, len);
    assert_memory_equal(c.msg, text, len);
    (void)fp_take(p, from, KVS_COMPLETION_SEND, out);
}

/* ---- messages ------------------------------------------------------------------ */

static uint32_t fc_msg_len(int i)
{
    return i == 0 ? KVS_CONTROL_MSG_MAX_BYTES : 1 + (uint32_t)(i * 997) % KVS_CONTROL_MSG_MAX_BYTES;
}

static void fc_msg_fill(uint8_t *m, int i, int side, uint32_t len)
{
    for (uint32_t k = 0; k < len; k++)
        m[k] = (uint8_t)(i * 31 + (int)k + side * 101);
}

static void fc_messages_in_order_both_ways(void **state)
{
    fp_pair_t p;
    const fc_backend_t *b = fc_open(state, &p);
    static uint8_t m[KVS_CONTROL_MSG_MAX_BYTES], want[KVS_CONTROL_MSG_MAX_BYTES];
    /* Rounds of 8 each way, interleaved, then everything taken in order. */
    for (int round = 0; round < 3; round++) {
        for (int i = round * 8; i < round * 8 + 8; i++)
            for (int side = 0; side < 2; side++) {
                const uint32_t len = fc_msg_len(i);
                fc_msg_fill(m, i, side, len);
                fc_send(&p, side ? &p.a : &p.b, side ? p.ba : p.ab, m, len, 100 + (uint64_t)i);
            }
        for (int i = round * 8; i < round * 8 + 8; i++)
            for (int side = 0; side < 2; side++) {
                const uint32_t len = fc_msg_len(i);
                fc_msg_fill(want, i, side, len);
                kvs_completion_t c = fp_take(&p, side ? &p.b : &p.a, KVS_COMPLETION_RECV,
                                             side ? p.ab : p.ba);
                assert_int_equal(c.status, KVS_OK);
                if (c.len_bytes != len || memcmp(c.msg, want, len) != 0)
                    fail_msg("on %s, message %d from %s: %u bytes, want %u, or other bytes "
                             "(out of order?)", b->name, i, side ? "a" : "b", c.len_bytes,
                             len);
            }
        /* Each send completes once (in no promised order). */
        for (int side = 0; side < 2; side++) {
            uint8_t seen[8] = {0};
            for (int k = 0; k < 8; k++) {
                kvs_completion_t c = fp_take(&p, side ? &p.a : &p.b, KVS_COMPLETION_SEND,
                                             side ? p.ba : p.ab);
                assert_int_equal(c.status, KVS_OK);
                const uint64_t i = c.wr_id - 100 - (uint64_t)round * 8;
                if (i >= 8 || seen[i]++)
                    fail_msg("on %s: send completion wr_id %llu not one of this round's, or "
                             "twice", b->name, (unsigned long long)c.wr_id);
            }
        }
    }
    /* Many in flight before any poll (each post retried while the fabric
     * says KVS_EAGAIN), taken in order. */
    for (uint32_t i = 0; i < 64; i++)
        fc_send(&p, &p.b, p.ab, &i, sizeof i, 300 + (uint64_t)i);
    for (uint32_t i = 0; i < 64; i++) {
        kvs_completion_t c = fp_take(&p, &p.a, KVS_COMPLETION_RECV, p.ba);
        uint32_t got;
        assert_int_equal(c.len_bytes, sizeof got);
        memcpy(&got, c.msg, sizeof got);
        assert_int_equal(got, i);
    }
    for (uint32_t i = 0; i < 64; i++)
        (void)fp_take(&p, &p.b, KVS_COMPLETION_SEND, p.ab);
    /* An empty message arrives empty; one byte over the largest is refused
     * by name, before anything is sent. */
    fc_send(&p, &p.a, p.ba, NULL, 0, 400);
    assert_int_equal(fp_take(&p, &p.b, KVS_COMPLETION_RECV, p.ab).len_bytes, 0);
    (void)fp_take(&p, &p.a, KVS_COMPLETION_SEND, p.ba);
    static uint8_t big[KVS_CONTROL_MSG_MAX_BYTES + 1];
    assert_int_equal(p.a.fab->ops.send(p.a.fab, p.ba, big, sizeof big, 401), KVS_EINVAL);
    assert_true(p.a.fab->last_backend_msg[0] != '\0');
    fc_hello(&p, true, "still in order");
    b->close(b->ctx, &p);
}

/* ---- writes ---------------------------------------------------------------------- */

static void fc_write_lands_before_its_imm(void **state)
{
    fp_pair_t p;
    const fc_backend_t *b = fc_open(state, &p);
    fp_region_t src = {0}, dst = {0};
    fp_region_reg(&p.b, &src, 1u << 20);
    fp_region_reg(&p.a, &dst, (1u << 20) + (64u << 10));
    fc_announce(&p, &dst);
    uint8_t *want = calloc(1, dst.len);
    assert_non_null(want);
    const uint64_t lens[] = {1, 4096 + 3, 64u << 10, 1u << 20};
    for (uint32_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        const uint64_t off = 4096 * i + i; /* unaligned, overlapping the last */
        fc_write_lands(&p, &src, &dst, off, lens[i], 10 + i, 0xFC00 + i);
        memcpy(want + off, src.mem, lens[i]);
    }
    /* Nothing but the writes' bytes changed. */
    if (memcmp(dst.mem, want, dst.len) != 0)
        fail_msg("on %s: bytes outside the writes changed", b->name);
    free(want);
    fp_region_free(&p.a, &dst);
    fp_region_free(&p.b, &src);
    b->close(b->ctx, &p);
}

static void fc_write_to_a_dropped_registration_fails_only_it(void **state)
{
    fp_pair_t p;
    const fc_backend_t *b = fc_open(state, &p);
    fp_region_t src = {0}, dst = {0}, gone = {0};
    fp_region_reg(&p.b, &src, 64u << 10);
    fp_region_reg(&p.a, &dst, 64u << 10);
    fp_region_reg(&p.a, &gone, 64u << 10);
    fc_announce(&p, &dst);
    fc_announce(&p, &gone);
    /* a deregisters it, then says so: b writes after hearing it, to the
     * address and under the key it was told. */
    assert_int_equal(p.a.fab->ops.mr_deregister(p.a.fab, gone.mr), KVS_OK);
    gone.mr = NULL;
    fc_hello(&p, false, "dropped");
    const kvs_write_desc_t w = fc_desc(&src, 0, &gone, 0, 4096, gone.rkey, 5, 55);
    const int rc = fc_write(&p, &w);
    if (rc == KVS_OK) { /* refused when it reached the peer */
        kvs_completion_t c = fp_take(&p, &p.b, KVS_COMPLETION_WRITE, p.ab);
        assert_int_equal(c.wr_id, 55);
        if (c.status != KVS_EREMOTE)
            fail_msg("on %s: a write to a dropped registration completed with %s, want "
                     "KVS_EREMOTE", b->name, kvs_status_name(c.status));
    } else if (rc != KVS_EREMOTE) {
        fail_msg("on %s: a write to a dropped registration was refused with %s, want "
                 "KVS_EREMOTE", b->name, kvs_status_name(rc));
    }
    /* Only it: the connection carries a good write and messages both ways. */
    fc_write_lands(&p, &src, &dst, 0, 4096, 6, 0xFC10);
    fc_hello(&p, true, "after");
    fc_hello(&p, false, "and back");
    fp_region_free(&p.a, &gone);
    fp_region_free(&p.a, &dst);
    fp_region_free(&p.b, &src);
    b->close(b->ctx, &p);
}

static void fc_bad_local_side_refused(void **state)
{
    fp_pair_t p;
    const fc_backend_t *b = fc_open(state, &p);
    fp_region_t src = {0}, dst = {0};
    fp_region_reg(&p.b, &src, 64u << 10);
    fp_region_reg(&p.a, &dst, 64u << 10);
    fc_announce(&p, &dst);
    kvs_fabric_t *f = p.b.fab;
    /* The source leaves its registration by one byte. */
    kvs_write_desc_t w = fc_desc(&src, 1, &dst, 0, 64u << 10, dst.rkey, 1, 1);
    assert_int_equal(f->ops.write(f, p.ab, &w), KVS_EINVAL);
    assert_true(f->last_backend_msg[0] != '\0');
    assert_int_equal(f->ops.write(f, p.ab, NULL), KVS_EINVAL);
    w = fc_desc(&src, 0, &dst, 0, 0, dst.rkey, 1, 1); /* nothing to write */
    assert_int_equal(f->ops.write(f, p.ab, &w), KVS_EINVAL);
    /* Refused means not posted: the next write is the first to land. */
    fc_write_lands(&p, &src, &dst, 0, 4096, 2, 0xFC20);
    fp_region_free(&p.a, &dst);
    fp_region_free(&p.b, &src);
    b->close(b->ctx, &p);
}

/* ---- disconnect ------------------------------------------------------------------ */

static void fc_disconnect_is_told(void **state)
{
    fp_pair_t p;
    const fc_backend_t *b = fc_open(state, &p);
    p.b.fab->ops.disconnect(p.b.fab, p.ab);
    p.ab = NULL;
    kvs_completion_t c = fp_take(&p, &p.a, KVS_COMPLETION_DISCONNECT, p.ba);
    assert_int_equal(c.status, KVS_EPEER);
    assert_int_equal(p.a.fab->ops.send(p.a.fab, p.ba, "x", 1, 1), KVS_EPEER);
    assert_true(p.a.fab->last_backend_msg[0] != '\0');
    p.a.fab->ops.disconnect(p.a.fab, p.ba);
    p.ba = NULL;
    b->close(b->ctx, &p);
}

/* ---- region-scoped keys ---------------------------------------------------------- */

/* A write by b under key at dst + off, len bytes of `fill`: KVS_OK when it
 * landed, else the refusal (at post or as its completion). */
static int fc_write_status(fp_pair_t *p, fp_region_t *src, fp_region_t *dst, uint64_t off,
                           uint64_t len, uint64_t key, uint8_t fill, uint32_t imm)
{
    memset(src->mem, fill, len);
    const kvs_write_desc_t w = fc_desc(src, 0, dst, off, len, key, imm, 7000 + imm);
    const int rc = fc_write(p, &w);
    if (rc != KVS_OK)
        return rc;
    kvs_completion_t c = fp_take(p, &p->b, KVS_COMPLETION_WRITE, p->ab);
    assert_int_equal(c.wr_id, 7000 + imm);
    if (c.status == KVS_OK) {
        c = fp_take(p, &p->a, KVS_COMPLETION_IMM, p->ba);
        assert_int_equal(c.imm, imm);
    }
    return c.status;
}

static void fc_grant_opens_exactly_its_range(void **state)
{
    fp_pair_t p;
    const fc_backend_t *b = fc_open(state, &p);
    if (b->grants == NULL || !b->grants(b->ctx, &p)) {
        fprintf(stderr, "fabric contract on %s: no region-scoped keys: grant test SKIPPED\n",
                b->name);
        b->close(b->ctx, &p);
        skip();
    }
    fp_region_t src = {0}, dst = {0};
    fp_region_reg(&p.b, &src, 64u << 10);
    const int rc = fp_region_reg_sealed(&p.a, &dst, 64u << 10);
    if (rc != KVS_OK)
        fail_msg("mr_register_sealed on %s: %s: %s", b->name, kvs_status_name(rc),
                 p.a.fab->last_backend_msg);
    const uint64_t off = 8192, len = 4096;
    kvs_grant_t *g = NULL;
    uint64_t key = 0;
    assert_int_equal(p.a.fab->ops.key_grant(p.a.fab, p.ba, dst.mr, dst.addr + off, len, &g,
                                            &key),
                     KVS_OK);
    fc_announce(&p, &dst); /* its own key: b must find it opens nothing */
    const uint64_t grant_msg[2] = {dst.addr + off, key};
    fc_send(&p, &p.a, p.ba, grant_msg, sizeof grant_msg, 10); /* the grant's */
    (void)fp_take(&p, &p.b, KVS_COMPLETION_RECV, p.ab);
    (void)fp_take(&p, &p.a, KVS_COMPLETION_SEND, p.ba);
    /* The sealed registration's own key opens nothing. */
    assert_int_not_equal(fc_write_status(&p, &src, &dst, off, 64, dst.rkey, 0x33, 1), KVS_OK);
    fc_hello(&p, true, "still here");
    /* The grant opens its range, and nothing of the bytes around it. */
    assert_int_equal(fc_write_status(&p, &src, &dst, off, len, key, 0x11, 2), KVS_OK);
    for (uint64_t i = 0; i < dst.len; i++)
        if (dst.mem[i] != (i >= off && i < off + len ? 0x11 : 0))
            fail_msg("on %s: byte %llu of the sealed registration is 0x%02x after a granted "
                     "write of [%llu, +%llu)", b->name, (unsigned long long)i, dst.mem[i],
                     (unsigned long long)off, (unsigned long long)len);
    assert_int_not_equal(fc_write_status(&p, &src, &dst, off + len - 64, 128, key, 0x22, 3),
                         KVS_OK);
    fc_hello(&p, true, "still here");
    assert_int_not_equal(fc_write_status(&p, &src, &dst, off - 1, 1, key, 0x22, 4), KVS_OK);
    fc_hello(&p, true, "still here");
    /* Revoked (and told): the key opens nothing more. */
    assert_int_equal(p.a.fab->ops.key_revoke(p.a.fab, g), KVS_OK);
    fc_hello(&p, false, "revoked");
    assert_int_not_equal(fc_write_status(&p, &src, &dst, off, 64, key, 0x55, 5), KVS_OK);
    for (uint64_t i = 0; i < dst.len; i++)
        if (dst.mem[i] != (i >= off && i < off + len ? 0x11 : 0))
            fail_msg("on %s: byte %llu of the sealed registration changed under a refused "
                     "write", b->name, (unsigned long long)i);
    fc_hello(&p, true, "the end");
    fp_region_free(&p.a, &dst);
    fp_region_free(&p.b, &src);
    b->close(b->ctx, &p);
}

int fc_run(const fc_backend_t *b)
{
    void *state = (void *)(uintptr_t)b;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(fc_messages_in_order_both_ways, state),
        cmocka_unit_test_prestate(fc_write_lands_before_its_imm, state),
        cmocka_unit_test_prestate(fc_write_to_a_dropped_registration_fails_only_it, state),
        cmocka_unit_test_prestate(fc_bad_local_side_refused, state),
        cmocka_unit_test_prestate(fc_disconnect_is_told, state),
        cmocka_unit_test_prestate(fc_grant_opens_exactly_its_range, state),
    };
    char name[96];
    snprintf(name, sizeof name, "fabric contract on %s", b->name);
    return cmocka_run_group_tests_name(name, tests, NULL, NULL);
}
