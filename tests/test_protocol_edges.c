/*
 * test_protocol_edges.c - failure and edge behaviour of the decode and
 * prefill handlers (src/decode.c, src/prefill.c) on the tiny simulated
 * cluster of edge_cluster.h, not through sim/scenario.c.
 *
 * Each test asserts the exact outcome: which rooms end with which status on
 * which rank, that every rank reports every room once, that the staging
 * ring holds no live byte afterwards, and, for rooms that succeed, that
 * every received byte is right.
 *
 * Several tests watch for the failure modes of spec §9: memory written after
 * the decode ended a room (a snapshot taken when its result appears),
 * regions leaked across a handler restart, a restarted decode's ring
 * written with its previous incarnation's regions, spurious failures from
 * bounded queues. The hostile_* tests send what a confused or compromised
 * peer could (each reproduced a defect, since fixed).
 * KVS_EDGE_TEST=<glob> runs only the matching tests.
 *
 * Nothing here is random except the sim fabric's remote keys, drawn from the
 * engine seed; the seed is printed at start and in every failure message.
 */
#include "edge_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "instance.h"
#include "kvdata.h"
#include "link.h"


/* Send queues of one work request per connection: the fabric refuses most
 * posts (KVS_EAGAIN), and every refused one goes out as soon as a
 * completion makes room, without waiting for a retransmission timeout
 * (nothing is sent again) or being overtaken by a later message (which the
 * peer would drop as following a loss). Refused control messages once
 * waited for the retransmission timeout, and a later one posted ahead of
 * them was dropped by the peer. */
static void test_protocol_edges_sq_depth_one(void **state)
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

static void test_protocol_edges_reliable_fabric_backstop(void **state)
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
static void test_protocol_edges_hostile_ack_of_unsent(void **state)
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
    print_message("test_protocol_edges: seed %llu\n", (unsigned long long)EDGE_SEED);
    /* KVS_EDGE_TEST=<glob> runs only the matching tests (replay one). */
    if (getenv("KVS_EDGE_TEST") != NULL)
        cmocka_set_test_filter(getenv("KVS_EDGE_TEST"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_protocol_edges_sq_depth_one),
        cmocka_unit_test(test_protocol_edges_reliable_fabric_backstop),
        cmocka_unit_test(test_protocol_edges_hostile_ack_of_unsent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
