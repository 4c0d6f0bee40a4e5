/*
 * test_handler.c - the base of both handlers (src/handler.c) on the
 * simulated cluster: handler creation failures of the backends (streams,
 * memory registrations), links down for a short and a long time (stall
 * timeouts, reconnecting, registering again), and a lost peer of one prefill
 * instance failing exactly the rooms paired with it.
 *
 * Each test asserts the exact outcome on the tiny simulated cluster of
 * edge_cluster.h (real core, simulated GPUs and NICs, driven step by step):
 * which rooms end with which status on which rank, that every rank reports
 * every room once, that the staging ring holds no live byte afterwards, and,
 * for rooms that succeed, that every received byte is right.
 * KVS_EDGE_TEST=<glob> runs only the matching tests. Nothing here is random
 * except the sim fabric's remote keys, drawn from the engine seed; the seed
 * is printed at start and in every failure message.
 */
#include "edge_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "instance.h"
#include "kvdata.h"
#include "link.h"

/* ---- handler creation failures of the backends ------------------------------- */

static void test_handler_create_failures(void **state)
{
    (void)state;
    /* Every stream of the GPUs is taken: no gather or scatter stream. */
    edge_opts_t o = edge_defaults();
    o.no_handlers = true;
    o.gpu.max_streams = 1;
    edge_cluster_t *cl = edge_create(&o);
    for (int i = 0; i < edge_nnodes(cl); i++) {
        edge_node_t *n = &cl->nodes[i];
        kvs_device_t *dev = sim_gpu_device(n->gpu);
        kvs_stream_t *taken = NULL;
        assert_int_equal(dev->ops.stream_create(dev, &taken), KVS_OK);
        const bool decode = n->role == KVS_ROLE_DECODE;
        kvs_rank_t *rank = NULL;
        int rc = kvs_rank_create_on(n->m, &rank);
        assert_int_not_equal(rc, KVS_OK);
        assert_null(rank);
        assert_int_equal(kvs_manager_last_error(n->m)->status, rc);
        assert_non_null(strstr(kvs_manager_last_error(n->m)->msg,
                               decode ? "could not create the scatter stream"
                                      : "could not create the gather stream"));
        dev->ops.stream_destroy(dev, taken);
        assert_int_equal(kvs_rank_create_on(n->m, &rank), KVS_OK);
        edge_attach(n, rank);
    }
    edge_connect(cl, 0);
    edge_run(cl);
    edge_assert_registered(cl);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_destroy(cl);

    /* Direct path: the KV layers cannot all be registered with the NIC. */
    o = edge_defaults();
    o.prefill_tp = 1;
    o.staging = false;
    o.no_handlers = true;
    o.net.max_mrs = 3; /* 2 layers x K/V need 4 */
    cl = edge_create(&o);
    for (int i = 0; i < edge_nnodes(cl); i++) {
        edge_node_t *n = &cl->nodes[i];
        kvs_rank_t *rank = NULL;
        int rc = kvs_rank_create_on(n->m, &rank);
        assert_int_equal(rc, KVS_EBACKEND);
        assert_null(rank);
        assert_non_null(strstr(kvs_manager_last_error(n->m)->msg, "could not register KV layer 1"));
        assert_int_equal(kvs_manager_path(n->m), KVS_PATH_AUTO); /* no handler */
    }
    edge_destroy(cl);
}

/* ---- links down: a short and a long outage ------------------------------------ */

/* A link down for 5 ms while a room opens: the ROOM to p1 is lost and sent
 * again once the link is back; the room does not notice. */
static void test_handler_short_outage_recovered(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    sim_nic_set_link_up(edge_prefill(cl, 1)->nic, false);
    edge_open(cl, 1, 0, 40);
    sim_engine_run(cl->eng, sim_engine_now_ns(cl->eng) + 5000000, EDGE_EVENT_BUDGET);
    assert_null(edge_result(d, 1));
    sim_nic_set_link_up(edge_prefill(cl, 1)->nic, true);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);
    assert_true(edge_stats(d).msgs_retransmitted >= 1);
    assert_int_equal(edge_stats(d).peers_lost, 0);
    edge_destroy(cl);
}

/* A link down for longer than the stall timeout: the decode gives up on p1
 * (its ROOM was never acknowledged) and the room fails; p1 times out; once
 * the link is back it reconnects, registers again and the next room moves. */
static void test_handler_long_outage_fails_then_recovers(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    sim_nic_set_link_up(edge_prefill(cl, 1)->nic, false);
    edge_open(cl, 1, 0, 40);
    edge_computed(cl, 1, 40, true);
    /* (edge_run_past_timeouts would never end: the decode keeps trying to
     * reach p1, at a bounded rate, for as long as it is away) */
    sim_engine_run(cl->eng, sim_engine_now_ns(cl->eng) + 40000000000ull, EDGE_EVENT_BUDGET);
    /* p0's chunks kept the room alive; the ROOM to p1 went unacknowledged
     * for a stall timeout, so the decode gave up on p1 first. */
    edge_expect(d, 1, KVS_EPEER);
    /* ... and its log says why: the link's own give-up */
    assert_non_null(strstr(d->log_last, "is unreachable (its connection died: 4 message(s) "
                                        "unacknowledged for 30000 ms: the peer stopped"));
    edge_expect(edge_prefill(cl, 0), 1, KVS_OK); /* its own part landed */
    edge_expect(edge_prefill(cl, 1), 1, KVS_ETIMEDOUT);
    assert_int_equal(edge_stats(d).peers_lost, 1);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 1);
    /* While p1 is away, a new room fails at once, with a reason. */
    int64_t pages[10] = {0};
    assert_int_equal(kvs_decode_room_open(d->dec, 9, 0, 40, pages, 10), KVS_EPEER);
    assert_non_null(strstr(kvs_manager_last_error(d->m)->msg, "unreachable"));
    edge_run(cl);
    edge_expect(d, 9, KVS_EPEER);
    edge_expect_ring_empty(cl);
    /* The link comes back: reconnected and registered again. */
    sim_nic_set_link_up(edge_prefill(cl, 1)->nic, true);
    edge_run_past_timeouts(cl);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 2);
    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* One of three prefill instances loses a rank mid-run: exactly the rooms
 * paired with that instance fail, on the decode and on the instance's
 * surviving rank, with KVS_EPEER and a log line naming the lost rank; the
 * other instances' rooms succeed, every byte right, and nobody else hears
 * of the failed rooms. While the rank is away a room naming its instance
 * fails at once; once it is back, the decode connects to it again and its
 * rooms succeed. */
static void test_handler_crashed_instance_fails_only_its_rooms(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.instances = 3;
    o.inst_tp[1] = 4;
    o.inst_tp[2] = 2;
    o.ring_bytes = 256u << 10;
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 2 + 4 + 2);
    edge_open_inst(cl, 0, 1, 0, 40);
    edge_open_inst(cl, 1, 2, 0, 40);
    edge_open_inst(cl, 2, 3, 0, 40);
    edge_open_inst(cl, 2, 4, 0, 24);
    edge_run(cl);
    edge_computed_inst(cl, 0, 1, 40);
    edge_computed_inst(cl, 2, 3, 40); /* its writes are on the way ... */
    edge_crash(edge_inst_node(cl, 2, 1)); /* ... when one of its ranks dies */
    edge_computed_inst(cl, 1, 2, 40);
    edge_run(cl);
    edge_expect_inst_ok(cl, 0, 1, 0, 40);
    edge_expect_inst_ok(cl, 1, 2, 0, 40);
    for (uint64_t room = 3; room <= 4; room++) {
        edge_expect(d, room, KVS_EPEER);
        edge_expect(edge_inst_node(cl, 2, 0), room, KVS_EPEER);
        for (int i = 0; i < edge_nnodes(cl); i++)
            if (cl->nodes[i].role == KVS_ROLE_PREFILL && cl->nodes[i].inst != 2)
                assert_null(edge_result(&cl->nodes[i], room));
    }
    assert_non_null(strstr(d->log_last, "prefill instance 2 rank tp 1 pp 0 is unreachable"));
    assert_int_equal(edge_stats(d).rooms_ok, 2);
    assert_int_equal(edge_stats(d).rooms_failed, 2);
    edge_expect_ring_empty(cl);
    /* While it is away, a room naming its instance fails at once ... */
    int64_t pages[4] = {0, 1, 3, 4};
    assert_int_equal(kvs_decode_room_open_peer(d->dec, 5, (kvs_peer_t){2, 0}, 0, 16, pages, 4),
                     KVS_EPEER);
    assert_non_null(strstr(kvs_manager_last_error(d->m)->msg, "instance 2 rank tp 1"));
    edge_run(cl);
    edge_expect(d, 5, KVS_EPEER);
    /* ... others go on ... */
    edge_open_inst(cl, 1, 6, 0, 16);
    edge_computed_inst(cl, 1, 6, 16);
    edge_run(cl);
    edge_expect_inst(cl, 1, 6, KVS_OK);
    /* ... and once it is back, the decode connects to it again (its retries
     * wait at most stall_timeout / 32 apart) and rooms naming it succeed. */
    edge_restart(cl, edge_inst_node(cl, 2, 1));
    edge_run_past_timeouts(cl);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 2 + 4 + 2);
    edge_open_inst(cl, 2, 7, 0, 40);
    edge_computed_inst(cl, 2, 7, 40);
    edge_run(cl);
    edge_expect_inst_ok(cl, 2, 7, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

int main(void)
{
    print_message("test_handler: seed %llu\n", (unsigned long long)EDGE_SEED);
    /* KVS_EDGE_TEST=<glob> runs only the matching tests (replay one). */
    if (getenv("KVS_EDGE_TEST") != NULL)
        cmocka_set_test_filter(getenv("KVS_EDGE_TEST"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handler_crashed_instance_fails_only_its_rooms),
        cmocka_unit_test(test_handler_create_failures),
        cmocka_unit_test(test_handler_short_outage_recovered),
        cmocka_unit_test(test_handler_long_outage_fails_then_recovers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
