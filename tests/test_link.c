/*
 * test_link.c - unit tests of the retransmission timeout of the reliable
 * control link (src/link.c): the round-trip estimator on its own (RFC 6298's
 * first and later samples in integers, the timeout with rto_min as its floor
 * and G, rto_max as its ceiling, no overflow near 2^64), and a link over a
 * tiny fabric with a settable clock that records the sequence numbers it
 * posts: a clean ACK makes a sample and the timeout follows it; a message
 * sent again, or any ACK after a retransmission, gives none (Karn's rule), and ACK progress undoes a doubled
 * timeout; one message is timed at a time; a
 * forgotten link starts again from rto_min; the stats' smoothed round trip.
 * The rest of the link (sequencing, go-back-N, give-up) is checked against a
 * model by fuzz/fuzz_link.c and end to end by the simulator's fault tests.
 *
 * The last tests run the links under the handlers on the simulated cluster
 * of edge_cluster.h: send queues of one work request (refused posts go out
 * in order as completions make room), the timer as a backstop over a fabric
 * that claims reliable sends, and a forged ACK of messages never sent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "edge_cluster.h"
#include "link.h"

#define MS 1000000ull
#define RTO_MIN (2 * MS)
#define RTO_MAX (100 * MS)
#define GIVE_UP (10000 * MS)

/* ---- a fabric with a clock that records what is posted ------------------- */

typedef struct clock_fabric {
    kvs_fabric_t base; /* first */
    uint64_t now_ns;
    uint32_t posts;
    uint32_t last_seq; /* of the last message posted (0: an ACK) */
    char tag;          /* the one connection is its address */
} clock_fabric_t;

static int cf_reg(kvs_fabric_t *f, kvs_device_t *d, uint64_t a, uint64_t n, kvs_mr_t **o,
                  uint64_t *k)
{
    return KVS_ENOTSUP;
}

static int cf_dereg(kvs_fabric_t *f, kvs_mr_t *m) { return KVS_ENOTSUP; }

static int cf_send(kvs_fabric_t *f, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                   uint64_t wr_id)
{
    clock_fabric_t *c = KVS_CONTAINER_OF(f, clock_fabric_t, base);
    kvs_msg_t m;
    assert_int_equal(kvs__wire_decode(msg, len_bytes, &m), KVS_OK);
    c->posts++;
    c->last_seq = m.seq;
    return KVS_OK;
}

static uint64_t cf_now(kvs_fabric_t *f) { return KVS_CONTAINER_OF(f, clock_fabric_t, base)->now_ns; }

static const kvs_fabric_ops_t cf_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    .name = "test-clock",
    .mr_register = cf_reg,
    .mr_deregister = cf_dereg,
    .send = cf_send,
    .now_ns = cf_now,
};

typedef struct fixture {
    clock_fabric_t fab;
    kvs__links_t ls;
    kvs_handler_stats_t stats;
} fixture_t;

static int setup(void **state)
{
    fixture_t *x = calloc(1, sizeof *x);
    assert_non_null(x);
    assert_int_equal(kvs_fabric_init(&x->fab.base, &cf_ops, "clock0"), KVS_OK);
    x->fab.now_ns = 1000 * MS;
    assert_int_equal(kvs__links_init(&x->ls, &x->fab.base, 2, 7, RTO_MIN, RTO_MAX, GIVE_UP,
                                     &x->stats),
                     KVS_OK);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *x = *state;
    kvs__links_fini(&x->ls);
    free(x);
    return 0;
}

static kvs_conn_t *the_conn(fixture_t *x) { return (kvs_conn_t *)(void *)&x->fab.tag; }

static void send_one(fixture_t *x)
{
    const kvs_msg_t m = {.type = KVS_MSG_WATERMARK};
    assert_int_equal(kvs__link_send(&x->ls, the_conn(x), &m), KVS_OK);
}

/* The peer acknowledges everything up to cum, now. */
static void ack(fixture_t *x, uint32_t cum)
{
    kvs_msg_t a = {.type = KVS_MSG_ACK, .session = 9};
    a.u.ack_link.cum = cum;
    kvs_completion_t cqe = {.kind = KVS_COMPLETION_RECV, .conn = the_conn(x)};
    assert_int_equal(kvs__wire_encode(&a, cqe.msg, sizeof cqe.msg, &cqe.len_bytes), KVS_OK);
    kvs_msg_t out;
    assert_int_equal(kvs__link_recv(&x->ls, &cqe, &out), 0);
}

static void advance(fixture_t *x, uint64_t ns)
{
    x->fab.now_ns += ns;
    kvs__links_tick(&x->ls, x->fab.now_ns, NULL, NULL);
}

/* How long from now the queue goes again. */
static uint64_t wait_ns(const fixture_t *x) { return kvs__links_deadline(&x->ls) - x->fab.now_ns; }

static const kvs__link_t *the_link(fixture_t *x) { return &x->ls.v[0]; }

/* ---- the estimator ------------------------------------------------------- */

static void test_rtt_first_sample(void **state)
{
    kvs__rtt_t e = {0};
    assert_int_equal(kvs__rtt_timeout(&e, RTO_MIN, RTO_MAX), RTO_MIN);
    kvs__rtt_sample(&e, 8 * MS);
    assert_int_equal(e.samples, 1);
    assert_int_equal(e.srtt_ns, 8 * MS);
    assert_int_equal(e.rttvar_ns, 4 * MS);
    /* 8 + max(2, 4 * 4) ms */
    assert_int_equal(kvs__rtt_timeout(&e, RTO_MIN, RTO_MAX), 24 * MS);
}

static void test_rtt_later_samples(void **state)
{
    kvs__rtt_t e = {0};
    kvs__rtt_sample(&e, 8 * MS);
    kvs__rtt_sample(&e, 16 * MS);
    /* RTTVAR = 3/4 * 4 + 1/4 * |8 - 16| = 5; SRTT = 7/8 * 8 + 1/8 * 16 = 9 */
    assert_int_equal(e.rttvar_ns, 5 * MS);
    assert_int_equal(e.srtt_ns, 9 * MS);
    assert_int_equal(kvs__rtt_timeout(&e, RTO_MIN, RTO_MAX), 29 * MS);
    /* A steady path: the variation decays and the floor takes over as G. */
    for (int i = 0; i < 200; i++)
        kvs__rtt_sample(&e, 9 * MS);
    assert_int_equal(e.srtt_ns, 9 * MS);
    assert_true(e.rttvar_ns < MS / 100);
    assert_int_equal(kvs__rtt_timeout(&e, RTO_MIN, RTO_MAX), 9 * MS + RTO_MIN);
}

static void test_rtt_floor_and_ceiling(void **state)
{
    kvs__rtt_t fast = {0};
    for (int i = 0; i < 50; i++)
        kvs__rtt_sample(&fast, 20000); /* 20 us: the timeout stays near rto_min */
    assert_int_equal(kvs__rtt_timeout(&fast, RTO_MIN, RTO_MAX), RTO_MIN + 20000);
    kvs__rtt_t zero = {0};
    kvs__rtt_sample(&zero, 0);
    assert_int_equal(kvs__rtt_timeout(&zero, RTO_MIN, RTO_MAX), RTO_MIN);
    kvs__rtt_t slow = {0};
    kvs__rtt_sample(&slow, 3000 * MS);
    assert_int_equal(kvs__rtt_timeout(&slow, RTO_MIN, RTO_MAX), RTO_MAX);
    /* Near 2^64: saturates at the ceiling, never wraps to a short timeout. */
    kvs__rtt_t huge = {0};
    kvs__rtt_sample(&huge, UINT64_MAX);
    kvs__rtt_sample(&huge, UINT64_MAX - 1);
    assert_true(huge.srtt_ns > UINT64_MAX / 2);
    assert_int_equal(kvs__rtt_timeout(&huge, RTO_MIN, UINT64_MAX), UINT64_MAX);
    assert_int_equal(kvs__rtt_timeout(&huge, RTO_MIN, RTO_MAX), RTO_MAX);
}

/* ---- on a link ------------------------------------------------------------ */

static void test_link_first_timeout_is_rto_min(void **state)
{
    fixture_t *x = *state;
    send_one(x);
    assert_int_equal(wait_ns(x), RTO_MIN);
}

static void test_link_clean_ack_sets_timeout(void **state)
{
    fixture_t *x = *state;
    send_one(x);
    x->fab.now_ns += 5 * MS; /* a loaded peer: 5 ms, no tick, no timeout */
    ack(x, 1);
    assert_int_equal(the_link(x)->rtt.samples, 1);
    assert_int_equal(the_link(x)->rtt.srtt_ns, 5 * MS);
    assert_int_equal(the_link(x)->rto_ns, 5 * MS + 4 * (5 * MS / 2));
    send_one(x);
    assert_int_equal(wait_ns(x), 15 * MS); /* a new message waits the learnt timeout */
    assert_int_equal(kvs__links_srtt_max(&x->ls), 5 * MS);
}

static void test_link_karn_no_sample_after_resend(void **state)
{
    fixture_t *x = *state;
    send_one(x);
    advance(x, RTO_MIN); /* no ACK: sent again, timeout doubled */
    assert_int_equal(x->stats.msgs_retransmitted, 1);
    assert_int_equal(wait_ns(x), 2 * RTO_MIN);
    x->fab.now_ns += 1 * MS;
    ack(x, 1); /* answers the first post or the second: no sample */
    assert_int_equal(the_link(x)->rtt.samples, 0);
    /* ... but progress undoes the doubling: back to the estimator's. */
    send_one(x);
    assert_int_equal(wait_ns(x), RTO_MIN);
    /* That one was sent once: its ACK is a sample. */
    x->fab.now_ns += 1 * MS;
    ack(x, 2);
    assert_int_equal(the_link(x)->rtt.samples, 1);
    assert_int_equal(the_link(x)->rtt.srtt_ns, 1 * MS);
    assert_int_equal(the_link(x)->rto_ns, 1 * MS + RTO_MIN);
}

static void test_link_backoff_keeps_doubling_to_ceiling(void **state)
{
    fixture_t *x = *state;
    send_one(x);
    uint64_t want = RTO_MIN;
    for (int i = 0; i < 10; i++) {
        advance(x, wait_ns(x));
        want = 2 * want < RTO_MAX ? 2 * want : RTO_MAX;
        assert_int_equal(wait_ns(x), want);
    }
    assert_int_equal(wait_ns(x), RTO_MAX);
}

static void test_link_times_one_message_at_a_time(void **state)
{
    fixture_t *x = *state;
    send_one(x);       /* seq 1, timed at t0 */
    x->fab.now_ns += MS;
    send_one(x);       /* seq 2: not timed, 1 is */
    x->fab.now_ns += MS;
    ack(x, 1);         /* a 2 ms sample */
    assert_int_equal(the_link(x)->rtt.srtt_ns, 2 * MS);
    assert_int_equal(the_link(x)->timed_seq, 0);
    x->fab.now_ns += MS;
    ack(x, 2);         /* 2 was never timed: no sample */
    assert_int_equal(the_link(x)->rtt.samples, 1);
    send_one(x);       /* seq 3, timed */
    x->fab.now_ns += 3 * MS;
    ack(x, 3);
    assert_int_equal(the_link(x)->rtt.samples, 2);
    /* RTTVAR = 3/4 * 1 + 1/4 * |2 - 3| = 1; SRTT = 7/8 * 2 + 3/8 */
    assert_int_equal(the_link(x)->rtt.rttvar_ns, MS);
    assert_int_equal(the_link(x)->rtt.srtt_ns, 2 * MS + MS / 8);
}

static void test_link_resend_past_timed_message_is_karn(void **state)
{
    fixture_t *x = *state;
    send_one(x);       /* 1, timed */
    send_one(x);       /* 2 */
    ack(x, 1);         /* a 0 ns sample; nothing is timed now */
    send_one(x);       /* 3, timed (2 is out already) */
    assert_int_equal(the_link(x)->timed_seq, 3);
    advance(x, wait_ns(x)); /* 2 and 3 sent again: 3's timing ends */
    assert_int_equal(x->fab.last_seq, 3);
    assert_int_equal(the_link(x)->timed_seq, 0);
    x->fab.now_ns += MS;
    ack(x, 3);
    assert_int_equal(the_link(x)->rtt.samples, 1);
}

static void test_link_ack_past_timed_message_is_no_sample(void **state)
{
    fixture_t *x = *state;
    send_one(x);          /* 1, timed; its ACK is lost */
    x->fab.now_ns += 30 * MS;
    send_one(x);          /* 2, much later */
    x->fab.now_ns += MS;
    ack(x, 2);            /* covers 1, but 30 ms is not its round trip */
    assert_int_equal(the_link(x)->rtt.samples, 0);
    assert_int_equal(the_link(x)->timed_seq, 0);
}

static void test_link_forget_starts_again(void **state)
{
    fixture_t *x = *state;
    send_one(x);
    x->fab.now_ns += 40 * MS;
    ack(x, 1);
    assert_int_equal(kvs__links_srtt_max(&x->ls), 40 * MS);
    kvs__link_forget(&x->ls, the_conn(x));
    assert_int_equal(kvs__links_srtt_max(&x->ls), 0);
    send_one(x); /* a new connection's link: no sample yet */
    assert_int_equal(wait_ns(x), RTO_MIN);
}

/* ---- the links under the handlers, on the simulated cluster ---------------- */

/* Send queues of one work request per connection: the fabric refuses most
 * posts (KVS_EAGAIN), and every refused one goes out as soon as a
 * completion makes room, without waiting for a retransmission timeout
 * (nothing is sent again) or being overtaken by a later message (which the
 * peer would drop as following a loss). Refused control messages once
 * waited for the retransmission timeout, and a later one posted ahead of
 * them was dropped by the peer. */
static void test_link_sq_depth_one(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.net.sq_depth = 1;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    const edge_room_t rooms[] = {{1, 0, 40}, {2, 8, 44}, {3, 0, 3}};
    edge_transfer_ok(cl, rooms, 3);
    uint64_t refused = 0;
    for (int i = 0; i < edge_nnodes(cl); i++) {
        const edge_node_t *n = &cl->nodes[i];
        const kvs_handler_stats_t st = edge_stats(n);
        refused += sim_nic_posts_refused(n->nic);
        if (st.msgs_retransmitted != 0 || st.msgs_duplicate != 0)
            EDGE_FAIL("%s: %llu messages sent again, %llu dropped as duplicates or after "
                      "a gap", n->name, (unsigned long long)st.msgs_retransmitted,
                      (unsigned long long)st.msgs_duplicate);
        if (n->pre != NULL)
            assert_int_equal(st.rdma_writes, 7); /* each chunk once */
    }
    if (refused == 0)
        EDGE_FAIL("no post was refused: the test proves nothing");
    edge_destroy(cl);
}

/* Control messages that take 10 ms each way: over a fabric that may lose
 * them (the simulator's), the links' first timeout (2 ms, before any round
 * trip is measured) sends messages again; over one that claims
 * KVS_FABRIC_CAP_RELIABLE_SEND (RC, libfabric's reliable endpoints) the
 * timer is a backstop of KVS_RELIABLE_RETRY_TIMEOUT_NS, and a clean run
 * sends nothing twice. Both runs move every room whole. */
static uint64_t edge_slow_control_resent(uint32_t extra_caps)
{
    edge_opts_t o = edge_defaults();
    o.net.ctrl_latency_ns = 10000000;
    o.extra_caps = extra_caps;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    const edge_room_t rooms[] = {{1, 0, 40}, {2, 8, 44}, {3, 0, 3}};
    edge_transfer_ok(cl, rooms, 3);
    uint64_t resent = 0;
    for (int i = 0; i < edge_nnodes(cl); i++)
        resent += edge_stats(&cl->nodes[i]).msgs_retransmitted;
    edge_destroy(cl);
    return resent;
}

static void test_link_reliable_fabric_backstop(void **state)
{
    (void)state;
    const uint64_t lossy = edge_slow_control_resent(0);
    if (lossy == 0)
        EDGE_FAIL("a 20 ms round trip against a 2 ms first timeout resent nothing: the "
                  "test proves nothing");
    const uint64_t reliable = edge_slow_control_resent(KVS_FABRIC_CAP_RELIABLE_SEND);
    if (reliable != 0)
        EDGE_FAIL("over a reliable fabric %llu messages were sent again (without the "
                  "capability: %llu)", (unsigned long long)reliable,
                  (unsigned long long)lossy);
}

/* A peer that acknowledges messages it never received (a forged ACK)
 * while some wait unsent behind a full send queue: the link drops them as
 * acknowledged and its count of unsent messages stays within its queue
 * (past it, the next flush would walk off the end of the queue). */
static void test_link_hostile_ack_of_unsent(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.net.sq_depth = 1;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_run(cl);
    edge_node_t *d = edge_decode(cl, 0), *p0 = edge_prefill(cl, 0);
    kvs_conn_t *d_p0 = edge_conn(sim_nic_fabric(d->nic), p0->name);
    kvs_conn_t *p0_d = edge_conn(sim_nic_fabric(p0->nic), d->name);
    kvs__links_t *ls = kvs__decode_links(d->dec);
    const kvs__link_t *l = NULL;
    for (uint32_t i = 0; i < ls->cap && l == NULL; i++)
        if (ls->v[i].conn == d_p0)
            l = &ls->v[i];
    assert_non_null(l);
    assert_int_equal(kvs__link_unacked(ls, d_p0), 0);
    /* p0's side acknowledges the next two messages before they exist... */
    kvs_msg_t ack = {.type = KVS_MSG_ACK};
    ack.u.ack_link.cum = l->next_seq + 1;
    uint8_t buf[64];
    uint32_t len = 0;
    assert_int_equal(kvs__wire_encode(&ack, buf, sizeof buf, &len), KVS_OK);
    edge_send_raw(sim_nic_fabric(p0->nic), p0_d, buf, len);
    /* ... then the decode sends them: the first takes the one slot, the
     * second is refused and waits */
    const uint64_t refused = sim_nic_posts_refused(d->nic);
    kvs_msg_t wm = {.type = KVS_MSG_WATERMARK};
    wm.session = EDGE_DECODE_SESSION;
    assert_int_equal(kvs__link_send(ls, d_p0, &wm), KVS_OK);
    assert_int_equal(kvs__link_send(ls, d_p0, &wm), KVS_OK);
    assert_int_equal(sim_nic_posts_refused(d->nic), refused + 1);
    assert_int_equal(l->q_unsent, 1);
    /* The ACK arrives first: both are dropped, the unsent one too. */
    edge_run(cl);
    assert_int_equal(kvs__link_unacked(ls, d_p0), 0);
    assert_int_equal(l->q_unsent, 0);
    edge_destroy(cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rtt_first_sample),
        cmocka_unit_test(test_rtt_later_samples),
        cmocka_unit_test(test_rtt_floor_and_ceiling),
        cmocka_unit_test_setup_teardown(test_link_first_timeout_is_rto_min, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_clean_ack_sets_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_karn_no_sample_after_resend, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_backoff_keeps_doubling_to_ceiling, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_link_times_one_message_at_a_time, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_resend_past_timed_message_is_karn, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_link_ack_past_timed_message_is_no_sample, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_link_forget_starts_again, setup, teardown),
        cmocka_unit_test(test_link_sq_depth_one),
        cmocka_unit_test(test_link_reliable_fabric_backstop),
        cmocka_unit_test(test_link_hostile_ack_of_unsent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
