/*
 * test_hw_fault_fabric.c - hw/net/fault_fabric.c, the fault-injecting
 * wrapper fabric (<kvstage/fault_fabric.h>), over a recording fake fabric:
 * each kind spoils exactly the write it is told to and no other (write-
 * error's key, hostile-write's address by a fixed shift or the write's own
 * length), the owner's pick skips writes, a write the inner fabric refuses
 * at the post spoils nothing unless it was caught there (KVS_EREMOTE),
 * stale-write reposts the kept write once armed (its completion taken
 * out, its status kept) or redirects a later write once due,
 * replay-registration sends what the first connection sent again on
 * a new one, the wrapper says which write it is spoiling while the inner
 * fabric has it, every other op goes through with the inner's error
 * detail, and a slot the inner fabric leaves to its default stays one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include <kvstage/fault_fabric.h>

#define REC_MAX 32

struct kvs_conn {
    int id;
};

/* A fabric that records what it is given and answers as told. */
typedef struct rec_fabric {
    kvs_fabric_t base;
    kvs_conn_t conns[4];
    int nconns;
    char peers[4][32];
    int disconnects;
    kvs_conn_t *disconnected;
    kvs_write_desc_t writes[REC_MAX];
    kvs_conn_t *write_conns[REC_MAX];
    kvs_fault_post_t posting[REC_MAX]; /* the wrapper's, as each write arrived */
    int nwrites;
    int refuse_write; /* refuse the Nth write (1-based), 0: none */
    int refuse_status; /* ... with this status */
    struct {
        kvs_conn_t *conn;
        uint8_t b[8];
        uint32_t len;
        uint64_t wr_id;
    } sends[REC_MAX];
    int nsends;
    kvs_completion_t cq[8]; /* what the next poll returns */
    int ncq;
    const kvs_fault_fabric_t *watch;
} rec_fabric_t;

static rec_fabric_t *rec(kvs_fabric_t *fab) { return KVS_CONTAINER_OF(fab, rec_fabric_t, base); }

static int rec_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                           uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    if (addr == 0)
        return kvs_fabric_fail(fab, KVS_EINVAL, 42, "rec: addr 0");
    *out = (kvs_mr_t *)(uintptr_t)addr;
    *out_rkey = 0x1234;
    return KVS_OK;
}

static int rec_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr) { return KVS_OK; }

static int rec_connect(kvs_fabric_t *fab, const char *peer, kvs_conn_t **out)
{
    rec_fabric_t *r = rec(fab);
    if (r->nconns == 4)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "rec: no more connections");
    snprintf(r->peers[r->nconns], sizeof r->peers[0], "%s", peer);
    r->conns[r->nconns].id = r->nconns;
    *out = &r->conns[r->nconns++];
    return KVS_OK;
}

static void rec_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    rec(fab)->disconnects++;
    rec(fab)->disconnected = conn;
}

static int rec_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    rec_fabric_t *r = rec(fab);
    assert_true(r->nwrites < REC_MAX);
    if (r->nwrites + 1 == r->refuse_write) {
        r->refuse_write = 0;
        return kvs_fabric_fail(fab, r->refuse_status, 11, "rec: refused");
    }
    r->posting[r->nwrites] = r->watch != NULL ? kvs_fault_fabric_posting(r->watch)
                                              : KVS_FAULT_POST_NONE;
    r->write_conns[r->nwrites] = conn;
    r->writes[r->nwrites++] = *desc;
    return KVS_OK;
}

static int rec_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                    uint64_t wr_id)
{
    rec_fabric_t *r = rec(fab);
    assert_true(r->nsends < REC_MAX && len_bytes <= sizeof r->sends[0].b);
    r->sends[r->nsends].conn = conn;
    memcpy(r->sends[r->nsends].b, msg, len_bytes);
    r->sends[r->nsends].len = len_bytes;
    r->sends[r->nsends++].wr_id = wr_id;
    return KVS_OK;
}

static int rec_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max)
{
    rec_fabric_t *r = rec(fab);
    const int n = r->ncq < max ? r->ncq : max;
    memcpy(out, r->cq, (size_t)n * sizeof out[0]);
    r->ncq = 0;
    return n;
}

static uint64_t rec_now_ns(kvs_fabric_t *fab) { return 777; }
static uint64_t rec_max_write_bytes(kvs_fabric_t *fab) { return 4096; }

static int rec_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes)
{
    snprintf(buf, bytes, "%s", rec(fab)->peers[conn->id]);
    return KVS_OK;
}

static int rec_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                         uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey)
{
    return kvs_fabric_fail(fab, KVS_EINVAL, 7, "rec: no grants today");
}

static const kvs_fabric_ops_t rec_ops = {
    .version = KVS_FABRIC_OPS_VERSION, .size = sizeof(kvs_fabric_ops_t), .name = "rec",
    .caps = KVS_FABRIC_CAP_RELIABLE_SEND,
    .mr_register = rec_mr_register, .mr_deregister = rec_mr_deregister,
    .connect = rec_connect, .disconnect = rec_disconnect, .write = rec_write,
    .send = rec_send, .poll = rec_poll, .now_ns = rec_now_ns, .peer_addr = rec_peer_addr,
    .max_write_bytes = rec_max_write_bytes};

static void rec_setup(rec_fabric_t *r, bool grants)
{
    memset(r, 0, sizeof *r);
    kvs_fabric_ops_t ops = rec_ops;
    if (grants)
        ops.key_grant = rec_key_grant;
    assert_int_equal(kvs_fabric_init(&r->base, &ops, "rec"), KVS_OK);
}

/* The wrapper over r, r told to watch it. */
static kvs_fault_fabric_t *wrap(rec_fabric_t *r, const kvs_fault_fabric_config_t *cfg)
{
    kvs_fault_fabric_t *w = NULL;
    assert_int_equal(kvs_fault_fabric_create(&r->base, cfg, &w), KVS_OK);
    r->watch = w;
    return w;
}

/* r set up (no grants) and wrapped, one connection made through it. */
static kvs_fault_fabric_t *open_wrap(rec_fabric_t *r, const kvs_fault_fabric_config_t *cfg,
                                     kvs_fabric_t **fab, kvs_conn_t **c)
{
    rec_setup(r, false);
    kvs_fault_fabric_t *w = wrap(r, cfg);
    *fab = kvs_fault_fabric(w);
    assert_int_equal((*fab)->ops.connect(*fab, "10.0.0.1:1", c), KVS_OK);
    return w;
}

static kvs_write_desc_t desc_n(uint64_t i)
{
    return (kvs_write_desc_t){.local_addr = 0x1000 * i, .len_bytes = 100 + i,
                              .remote_addr = 0x100000 + 0x1000 * i, .rkey = 0x50000 + i,
                              .wr_id = i};
}

/* Writes 1..n through fab on conn; each must be taken. */
static void write_n(kvs_fabric_t *fab, kvs_conn_t *conn, uint64_t from, uint64_t n)
{
    for (uint64_t i = from; i < from + n; i++) {
        const kvs_write_desc_t d = desc_n(i);
        assert_int_equal(fab->ops.write(fab, conn, &d), KVS_OK);
    }
}

/* Field by field (a struct's padding is no part of it). */
static void assert_desc(const kvs_write_desc_t *a, const kvs_write_desc_t *b)
{
    assert_int_equal(a->local_addr, b->local_addr);
    assert_ptr_equal(a->local_mr, b->local_mr);
    assert_int_equal(a->len_bytes, b->len_bytes);
    assert_int_equal(a->remote_addr, b->remote_addr);
    assert_int_equal(a->rkey, b->rkey);
    assert_int_equal(a->with_imm, b->with_imm);
    assert_int_equal(a->imm, b->imm);
    assert_int_equal(a->wr_id, b->wr_id);
}

/* Write k (0-based in r's record) arrived as desc_n(k + 1): unchanged. */
static void assert_plain(const rec_fabric_t *r, int k)
{
    const kvs_write_desc_t d = desc_n((uint64_t)k + 1);
    assert_desc(&r->writes[k], &d);
    assert_int_equal(r->posting[k], KVS_FAULT_POST_NONE);
}

static void test_hw_fault_fabric_write_error_spoils_nth(void **state)
{
    (void)state;
    for (uint64_t nth = 1; nth <= 4; nth++) {
        rec_fabric_t r;
        const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_WRITE_ERROR, .fail_write = nth};
        kvs_fabric_t *fab = NULL;
        kvs_conn_t *c = NULL;
        kvs_fault_fabric_t *w = open_wrap(&r, &cfg, &fab, &c);
        write_n(fab, c, 1, 6);
        assert_int_equal(r.nwrites, 6);
        for (int k = 0; k < 6; k++) {
            if ((uint64_t)k + 1 != nth) {
                assert_plain(&r, k);
                continue;
            }
            kvs_write_desc_t d = desc_n(nth);
            d.rkey ^= 0xffffu; /* a key no registration has; the rest as given */
            assert_desc(&r.writes[k], &d);
            assert_int_equal(r.posting[k], KVS_FAULT_POST_SPOILED);
        }
        assert_int_equal(kvs_fault_fabric_spoiled(w), 1);
        assert_true(kvs_fault_fabric_settled(w));
        assert_int_equal(kvs_fault_fabric_posting(w), KVS_FAULT_POST_NONE);
        kvs_fault_fabric_destroy(w);
    }
}

static void test_hw_fault_fabric_hostile_write_moves(void **state)
{
    (void)state;
    const uint64_t shifts[] = {256u << 10, 0};
    for (size_t s = 0; s < 2; s++) {
        rec_fabric_t r;
        const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_HOSTILE_WRITE, .fail_write = 3,
                                               .hostile_shift_bytes = shifts[s]};
        kvs_fabric_t *fab = NULL;
        kvs_conn_t *c = NULL;
        kvs_fault_fabric_t *w = open_wrap(&r, &cfg, &fab, &c);
        write_n(fab, c, 1, 5);
        kvs_write_desc_t d = desc_n(3);
        d.remote_addr += shifts[s] != 0 ? shifts[s] : d.len_bytes; /* its key, elsewhere */
        assert_desc(&r.writes[2], &d);
        assert_int_equal(r.posting[2], KVS_FAULT_POST_SPOILED);
        for (int k = 0; k < 5; k++)
            if (k != 2)
                assert_plain(&r, k);
        assert_int_equal(kvs_fault_fabric_spoiled(w), 1);
        kvs_fault_fabric_destroy(w);
    }
}

/* Writes pick turns down (odd wr_ids here) are never the one, and count. */
static bool pick_even(void *ctx, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    (*(int *)ctx)++;
    return desc->wr_id % 2 == 0;
}

static void test_hw_fault_fabric_pick_and_refusal(void **state)
{
    (void)state;
    rec_fabric_t r;
    rec_setup(&r, false);
    int asked = 0;
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_WRITE_ERROR, .fail_write = 3,
                                           .pick = pick_even, .ctx = &asked};
    kvs_fault_fabric_t *w = wrap(&r, &cfg);
    kvs_fabric_t *fab = kvs_fault_fabric(w);
    kvs_conn_t *c = NULL;
    assert_int_equal(fab->ops.connect(fab, "10.0.0.1:1", &c), KVS_OK);
    write_n(fab, c, 1, 3); /* 1, 2: before the 3rd; 3: odd */
    assert_int_equal(asked, 1);
    /* write 4 (the first even from the 3rd on) is refused at the post: it
     * spoils nothing, and the refusal's detail is the inner fabric's */
    r.refuse_write = 4;
    r.refuse_status = KVS_EAGAIN;
    kvs_write_desc_t d4 = desc_n(4);
    assert_int_equal(fab->ops.write(fab, c, &d4), KVS_EAGAIN);
    assert_int_equal(fab->last_backend_code, 11);
    assert_string_equal(fab->last_backend_msg, "rec: refused");
    assert_int_equal(kvs_fault_fabric_spoiled(w), 0);
    assert_int_equal(kvs_fault_fabric_posting(w), KVS_FAULT_POST_NONE);
    /* posted again, it is the one */
    assert_int_equal(fab->ops.write(fab, c, &d4), KVS_OK);
    assert_int_equal(kvs_fault_fabric_spoiled(w), 1);
    assert_int_equal(r.nwrites, 4);
    assert_int_equal(r.writes[3].rkey, d4.rkey ^ 0xffffu);
    assert_int_equal(r.posting[3], KVS_FAULT_POST_SPOILED);
    write_n(fab, c, 5, 3); /* after it: all plain, pick not asked */
    assert_int_equal(asked, 3);
    for (int k = 4; k < 7; k++)
        assert_int_equal(r.writes[k].rkey, desc_n((uint64_t)k + 1).rkey);
    kvs_fault_fabric_destroy(w);
}

/* A spoiled write the inner fabric refuses at the post with KVS_EREMOTE
 * (its key or range checked there, as hw/ofi does) was caught: the fault
 * is spent, the next write goes as given. */
static void test_hw_fault_fabric_caught_at_post(void **state)
{
    (void)state;
    rec_fabric_t r;
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_HOSTILE_WRITE, .fail_write = 2};
    kvs_fabric_t *fab = NULL;
    kvs_conn_t *c = NULL;
    kvs_fault_fabric_t *w = open_wrap(&r, &cfg, &fab, &c);
    r.refuse_write = 2;
    r.refuse_status = KVS_EREMOTE;
    write_n(fab, c, 1, 1);
    const kvs_write_desc_t d2 = desc_n(2);
    assert_int_equal(fab->ops.write(fab, c, &d2), KVS_EREMOTE);
    assert_int_equal(kvs_fault_fabric_spoiled(w), 1);
    write_n(fab, c, 3, 2);
    assert_int_equal(r.nwrites, 3);
    assert_plain(&r, 0);
    for (int k = 1; k < 3; k++) {
        const kvs_write_desc_t d = desc_n((uint64_t)k + 2);
        assert_desc(&r.writes[k], &d);
    }
    kvs_fault_fabric_destroy(w);
}

static void test_hw_fault_fabric_stale_repost(void **state)
{
    (void)state;
    rec_fabric_t r;
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_STALE_WRITE, .fail_write = 2,
                                           .stale = KVS_FAULT_STALE_REPOST};
    kvs_fabric_t *fab = NULL;
    kvs_conn_t *c = NULL;
    kvs_fault_fabric_t *w = open_wrap(&r, &cfg, &fab, &c);
    write_n(fab, c, 1, 3);
    assert_plain(&r, 0);
    assert_int_equal(r.posting[1], KVS_FAULT_POST_KEPT); /* goes as given */
    const kvs_write_desc_t kept = desc_n(2);
    assert_desc(&r.writes[1], &kept);
    assert_plain(&r, 2);
    assert_false(kvs_fault_fabric_settled(w));
    kvs_completion_t out[4];
    assert_int_equal(fab->ops.poll(fab, out, 4), 0);
    assert_int_equal(r.nwrites, 3); /* not armed: nothing again */
    kvs_fault_fabric_arm(w);
    r.cq[0] = (kvs_completion_t){.kind = KVS_COMPLETION_WRITE, .wr_id = 3, .conn = c};
    r.ncq = 1;
    assert_int_equal(fab->ops.poll(fab, out, 4), 1);
    assert_int_equal(r.nwrites, 4);
    kvs_write_desc_t again = desc_n(2);
    again.wr_id = KVS_FAULT_STALE_WR_ID; /* the same write, its own completion */
    assert_desc(&r.writes[3], &again);
    assert_ptr_equal(r.write_conns[3], c);
    assert_int_equal(r.posting[3], KVS_FAULT_POST_SPOILED);
    assert_int_equal(kvs_fault_fabric_spoiled(w), 1);
    assert_false(kvs_fault_fabric_settled(w));
    assert_int_equal(kvs_fault_fabric_stale_status(w), 1);
    /* its completion is the wrapper's; the core's stays */
    r.cq[0] = (kvs_completion_t){.kind = KVS_COMPLETION_WRITE, .wr_id = 9, .conn = c};
    r.cq[1] = (kvs_completion_t){.kind = KVS_COMPLETION_WRITE, .status = KVS_EREMOTE,
                                 .wr_id = KVS_FAULT_STALE_WR_ID, .conn = c};
    r.cq[2] = (kvs_completion_t){.kind = KVS_COMPLETION_WRITE, .wr_id = 10, .conn = c};
    r.ncq = 3;
    assert_int_equal(fab->ops.poll(fab, out, 4), 2);
    assert_int_equal(out[0].wr_id, 9);
    assert_int_equal(out[1].wr_id, 10);
    assert_int_equal(kvs_fault_fabric_stale_status(w), KVS_EREMOTE);
    assert_true(kvs_fault_fabric_settled(w));
    assert_int_equal(fab->ops.poll(fab, out, 4), 0);
    assert_int_equal(r.nwrites, 4); /* once only */
    kvs_fault_fabric_destroy(w);
}

static void test_hw_fault_fabric_stale_repost_after_disconnect(void **state)
{
    (void)state;
    rec_fabric_t r;
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_STALE_WRITE, .fail_write = 1};
    kvs_fabric_t *fab = NULL;
    kvs_conn_t *c = NULL;
    kvs_fault_fabric_t *w = open_wrap(&r, &cfg, &fab, &c);
    write_n(fab, c, 1, 1);
    fab->ops.disconnect(fab, c);
    assert_int_equal(r.disconnects, 1);
    kvs_fault_fabric_arm(w);
    kvs_completion_t out[2];
    assert_int_equal(fab->ops.poll(fab, out, 2), 0);
    assert_int_equal(r.nwrites, 1); /* its connection is gone: no repost */
    assert_int_equal(kvs_fault_fabric_stale_status(w), KVS_EPEER);
    assert_true(kvs_fault_fabric_settled(w));
    kvs_fault_fabric_destroy(w);
}

typedef struct due_ctx {
    bool due;
    int asked;
} due_ctx_t;

static bool due_when_told(void *ctx, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    due_ctx_t *d = ctx;
    d->asked++;
    return d->due;
}

static bool pick_conn0(void *ctx, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    return conn->id == 0;
}

static void test_hw_fault_fabric_stale_redirect(void **state)
{
    (void)state;
    rec_fabric_t r;
    rec_setup(&r, false);
    due_ctx_t dc = {0};
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_STALE_WRITE, .fail_write = 2,
                                           .stale = KVS_FAULT_STALE_REDIRECT,
                                           .pick = pick_conn0, .due = due_when_told,
                                           .ctx = &dc};
    kvs_fault_fabric_t *w = wrap(&r, &cfg);
    kvs_fabric_t *fab = kvs_fault_fabric(w);
    kvs_conn_t *c0 = NULL, *c1 = NULL;
    assert_int_equal(fab->ops.connect(fab, "10.0.0.1:1", &c0), KVS_OK);
    assert_int_equal(fab->ops.connect(fab, "10.0.0.2:1", &c1), KVS_OK);
    write_n(fab, c0, 1, 2); /* the 2nd is kept, going as given */
    assert_int_equal(r.posting[1], KVS_FAULT_POST_KEPT);
    assert_int_equal(dc.asked, 0);
    write_n(fab, c0, 3, 1); /* not due */
    assert_int_equal(dc.asked, 1);
    dc.due = true;
    write_n(fab, c1, 4, 1); /* due, but not picked */
    assert_int_equal(dc.asked, 1);
    assert_false(kvs_fault_fabric_settled(w));
    write_n(fab, c0, 5, 2); /* the 5th strikes: its source and length, the 2nd's target */
    for (int k = 0; k < 6; k++) {
        if (k == 1 || k == 4)
            continue;
        assert_plain(&r, k);
    }
    kvs_write_desc_t d = desc_n(5);
    d.remote_addr = desc_n(2).remote_addr;
    d.rkey = desc_n(2).rkey;
    assert_desc(&r.writes[4], &d);
    assert_int_equal(r.posting[4], KVS_FAULT_POST_SPOILED);
    assert_int_equal(dc.asked, 2);
    assert_int_equal(kvs_fault_fabric_spoiled(w), 1);
    assert_true(kvs_fault_fabric_settled(w));
    kvs_completion_t out[2];
    assert_int_equal(fab->ops.poll(fab, out, 2), 0);
    assert_int_equal(r.nwrites, 6); /* nothing reposted */
    kvs_fault_fabric_destroy(w);
}

/* Without due, a redirect waits for the arm. */
static void test_hw_fault_fabric_stale_redirect_armed(void **state)
{
    (void)state;
    rec_fabric_t r;
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_STALE_WRITE, .fail_write = 1,
                                           .stale = KVS_FAULT_STALE_REDIRECT};
    kvs_fabric_t *fab = NULL;
    kvs_conn_t *c = NULL;
    kvs_fault_fabric_t *w = open_wrap(&r, &cfg, &fab, &c);
    write_n(fab, c, 1, 2);
    assert_plain(&r, 1);
    kvs_fault_fabric_arm(w);
    write_n(fab, c, 3, 1);
    assert_int_equal(r.writes[2].remote_addr, desc_n(1).remote_addr);
    assert_int_equal(r.writes[2].rkey, desc_n(1).rkey);
    assert_int_equal(r.writes[2].len_bytes, desc_n(3).len_bytes);
    assert_int_equal(kvs_fault_fabric_spoiled(w), 1);
    kvs_fault_fabric_destroy(w);
}

static void test_hw_fault_fabric_replay_registration(void **state)
{
    (void)state;
    rec_fabric_t r;
    rec_setup(&r, false);
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_REPLAY_REGISTRATION};
    kvs_fault_fabric_t *w = wrap(&r, &cfg);
    kvs_fabric_t *fab = kvs_fault_fabric(w);
    kvs_conn_t *c = NULL, *other = NULL;
    assert_int_equal(fab->ops.connect(fab, "10.0.0.1:7", &c), KVS_OK);
    assert_int_equal(fab->ops.connect(fab, "10.0.0.2:7", &other), KVS_OK);
    assert_int_equal(fab->ops.send(fab, c, "HELLO", 5, 101), KVS_OK);
    assert_int_equal(fab->ops.send(fab, other, "ELSE", 4, 102), KVS_OK); /* not kept */
    assert_int_equal(fab->ops.send(fab, c, "REG", 3, 103), KVS_OK);
    kvs_fault_fabric_registered(w);
    assert_int_equal(fab->ops.send(fab, c, "LATER", 5, 104), KVS_OK); /* not kept */
    write_n(fab, c, 1, 3);
    for (int k = 0; k < 3; k++)
        assert_plain(&r, k); /* no write fault */
    assert_true(kvs_fault_fabric_settled(w));
    kvs_completion_t out[4];
    assert_int_equal(fab->ops.poll(fab, out, 4), 0);
    assert_int_equal(r.nconns, 2); /* not armed: no replay */
    kvs_fault_fabric_arm(w);
    assert_false(kvs_fault_fabric_settled(w));
    assert_int_equal(fab->ops.poll(fab, out, 4), 0);
    assert_int_equal(r.nconns, 3);
    assert_string_equal(r.peers[2], "10.0.0.1:7");
    kvs_conn_t *replay = &r.conns[2];
    assert_int_equal(r.nsends, 6);
    assert_ptr_equal(r.sends[4].conn, replay);
    assert_memory_equal(r.sends[4].b, "HELLO", 5);
    assert_int_equal(r.sends[4].wr_id, 101);
    assert_ptr_equal(r.sends[5].conn, replay);
    assert_memory_equal(r.sends[5].b, "REG", 3);
    int status = 1;
    uint32_t answers = 9;
    assert_int_equal(kvs_fault_fabric_replayed(w, &status, &answers), 2);
    assert_int_equal(status, KVS_OK);
    assert_int_equal(answers, 0);
    /* the peer's answers on the replay's connection are the wrapper's */
    r.cq[0] = (kvs_completion_t){.kind = KVS_COMPLETION_SEND, .wr_id = 101, .conn = replay};
    r.cq[1] = (kvs_completion_t){.kind = KVS_COMPLETION_RECV, .conn = c};
    r.cq[2] = (kvs_completion_t){.kind = KVS_COMPLETION_RECV, .conn = replay};
    r.ncq = 3;
    assert_int_equal(fab->ops.poll(fab, out, 4), 1);
    assert_ptr_equal(out[0].conn, c);
    (void)kvs_fault_fabric_replayed(w, &status, &answers);
    assert_int_equal(answers, 1);
    assert_true(kvs_fault_fabric_settled(w));
    assert_int_equal(kvs_fault_fabric_spoiled(w), 0);
    kvs_fault_fabric_destroy(w); /* closes the replay's connection */
    assert_ptr_equal(r.disconnected, replay);
}

static void test_hw_fault_fabric_replay_nothing_kept(void **state)
{
    (void)state;
    rec_fabric_t r;
    rec_setup(&r, false);
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_REPLAY_REGISTRATION};
    kvs_fault_fabric_t *w = wrap(&r, &cfg);
    kvs_fabric_t *fab = kvs_fault_fabric(w);
    kvs_fault_fabric_arm(w);
    kvs_completion_t out[2];
    assert_int_equal(fab->ops.poll(fab, out, 2), 0);
    int status = 0;
    uint32_t answers = 0;
    assert_int_equal(kvs_fault_fabric_replayed(w, &status, &answers), 0);
    assert_int_equal(status, KVS_ENOENT); /* it never connected */
    assert_true(kvs_fault_fabric_settled(w));
    kvs_fault_fabric_destroy(w);
    assert_int_equal(r.disconnects, 0);
}

static void test_hw_fault_fabric_passes_through(void **state)
{
    (void)state;
    rec_fabric_t r;
    rec_setup(&r, true);
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_WRITE_ERROR, .fail_write = 0};
    kvs_fault_fabric_t *w = wrap(&r, &cfg);
    kvs_fabric_t *fab = kvs_fault_fabric(w);
    assert_int_equal(fab->ops.caps, KVS_FABRIC_CAP_RELIABLE_SEND);
    kvs_mr_t *mr = NULL;
    uint64_t rkey = 0;
    assert_int_equal(fab->ops.mr_register(fab, NULL, 0x4000, 64, &mr, &rkey), KVS_OK);
    assert_int_equal(rkey, 0x1234);
    assert_int_equal(fab->ops.mr_register(fab, NULL, 0, 64, &mr, &rkey), KVS_EINVAL);
    assert_int_equal(fab->last_backend_code, 42);
    assert_string_equal(fab->last_backend_msg, "rec: addr 0");
    assert_int_equal(fab->ops.mr_deregister(fab, mr), KVS_OK);
    assert_int_equal(fab->ops.now_ns(fab), 777);
    assert_int_equal(fab->ops.max_write_bytes(fab), 4096);
    kvs_conn_t *c = NULL;
    assert_int_equal(fab->ops.connect(fab, "10.0.0.9:3", &c), KVS_OK);
    char peer[32];
    assert_int_equal(fab->ops.peer_addr(fab, c, peer, sizeof peer), KVS_OK);
    assert_string_equal(peer, "10.0.0.9:3");
    kvs_grant_t *g = NULL;
    assert_int_equal(fab->ops.key_grant(fab, c, mr, 0x4000, 8, &g, &rkey), KVS_EINVAL);
    assert_int_equal(fab->last_backend_code, 7);
    write_n(fab, c, 1, 8); /* fail_write 0: nothing spoiled */
    for (int k = 0; k < 8; k++)
        assert_plain(&r, k);
    assert_int_equal(kvs_fault_fabric_spoiled(w), 0);
    assert_true(kvs_fault_fabric_settled(w));
    assert_int_equal(kvs_fault_fabric_stale_status(w), 1);
    kvs_fault_fabric_destroy(w);
}

/* A slot the inner fabric leaves to its default stays the default: the
 * core asks whether a fabric can grant by key_grant's presence. */
static void test_hw_fault_fabric_defaults_stay(void **state)
{
    (void)state;
    rec_fabric_t plain, granting;
    rec_setup(&plain, false);
    rec_setup(&granting, true);
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_HOSTILE_WRITE, .fail_write = 1};
    kvs_fault_fabric_t *w = wrap(&plain, &cfg), *g = wrap(&granting, &cfg);
    const kvs_fabric_t *wf = kvs_fault_fabric(w), *gf = kvs_fault_fabric(g);
    assert_ptr_equal(wf->ops.key_grant, plain.base.ops.key_grant);
    assert_ptr_equal(wf->ops.key_revoke, plain.base.ops.key_revoke);
    assert_ptr_equal(wf->ops.mr_register_sealed, plain.base.ops.mr_register_sealed);
    assert_ptr_equal(wf->ops.wait_arm, plain.base.ops.wait_arm);
    assert_ptr_not_equal(gf->ops.key_grant, granting.base.ops.key_grant); /* forwarded */
    assert_ptr_not_equal(gf->ops.key_grant, wf->ops.key_grant);
    assert_ptr_not_equal(wf->ops.write, plain.base.ops.write);
    kvs_fault_fabric_destroy(w);
    kvs_fault_fabric_destroy(g);
}

/* A new inner fabric under the wrapper (a restarted simulated rank): what
 * was spoiled stays spoiled. */
static void test_hw_fault_fabric_rebind_keeps_state(void **state)
{
    (void)state;
    rec_fabric_t a, b;
    rec_setup(&a, false);
    rec_setup(&b, false);
    const kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_HOSTILE_WRITE, .fail_write = 2};
    kvs_fault_fabric_t *w = wrap(&a, &cfg);
    kvs_fabric_t *fab = kvs_fault_fabric(w);
    kvs_conn_t *c = NULL;
    assert_int_equal(fab->ops.connect(fab, "10.0.0.1:1", &c), KVS_OK);
    write_n(fab, c, 1, 2);
    assert_int_equal(kvs_fault_fabric_spoiled(w), 1);
    kvs_fault_fabric_rebind(w, &b.base);
    b.watch = w;
    assert_int_equal(fab->ops.connect(fab, "10.0.0.1:1", &c), KVS_OK);
    write_n(fab, c, 1, 4);
    assert_int_equal(a.nwrites, 2);
    assert_int_equal(b.nwrites, 4);
    for (int k = 0; k < 4; k++)
        assert_plain(&b, k);
    kvs_fault_fabric_destroy(w);
}

static void test_hw_fault_fabric_create_refusals(void **state)
{
    (void)state;
    rec_fabric_t r;
    rec_setup(&r, false);
    kvs_fault_fabric_t *w = (kvs_fault_fabric_t *)&r; /* untouched on failure */
    kvs_fault_fabric_config_t cfg = {.kind = KVS_FAULT_WRITE_ERROR, .fail_write = 1};
    assert_int_equal(kvs_fault_fabric_create(NULL, &cfg, &w), KVS_EINVAL);
    assert_int_equal(kvs_fault_fabric_create(&r.base, NULL, &w), KVS_EINVAL);
    assert_int_equal(kvs_fault_fabric_create(&r.base, &cfg, NULL), KVS_EINVAL);
    cfg.kind = (kvs_fault_kind_t)(KVS_FAULT_REPLAY_REGISTRATION + 1);
    assert_int_equal(kvs_fault_fabric_create(&r.base, &cfg, &w), KVS_EINVAL);
    cfg.kind = KVS_FAULT_STALE_WRITE;
    cfg.stale = (kvs_fault_stale_t)(KVS_FAULT_STALE_REDIRECT + 1);
    assert_int_equal(kvs_fault_fabric_create(&r.base, &cfg, &w), KVS_EINVAL);
    assert_ptr_equal(w, (kvs_fault_fabric_t *)&r);
    kvs_fault_fabric_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hw_fault_fabric_write_error_spoils_nth),
        cmocka_unit_test(test_hw_fault_fabric_hostile_write_moves),
        cmocka_unit_test(test_hw_fault_fabric_pick_and_refusal),
        cmocka_unit_test(test_hw_fault_fabric_caught_at_post),
        cmocka_unit_test(test_hw_fault_fabric_stale_repost),
        cmocka_unit_test(test_hw_fault_fabric_stale_repost_after_disconnect),
        cmocka_unit_test(test_hw_fault_fabric_stale_redirect),
        cmocka_unit_test(test_hw_fault_fabric_stale_redirect_armed),
        cmocka_unit_test(test_hw_fault_fabric_replay_registration),
        cmocka_unit_test(test_hw_fault_fabric_replay_nothing_kept),
        cmocka_unit_test(test_hw_fault_fabric_passes_through),
        cmocka_unit_test(test_hw_fault_fabric_defaults_stay),
        cmocka_unit_test(test_hw_fault_fabric_rebind_keeps_state),
        cmocka_unit_test(test_hw_fault_fabric_create_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
