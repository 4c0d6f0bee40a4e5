/*
 * test_instance.c - prefill instances and the pair plans (src/instance.c)
 * on the simulated cluster (spec §12): several instances sharing one ring
 * and its watermarks, the instance API's errors, attention data
 * parallelism, a prefill learning its decode instance, instances that are
 * misaddressed or hostile, and a decode's peers per prefill CP rank.
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

/* ---- clusters: several prefill instances (spec §12) ----------------------------- */

/* Two prefill instances of different TP (2 and 4) feed one decode rank: one
 * ring holds the regions of rooms from both at the same moment, each region
 * laid out for its own pair (2 writers of 2 heads, 4 writers of 1 head),
 * and every byte of both arrives. */
static void test_instance_two_instances_share_the_ring(void **state)
{
    (void)state;
    edge_opts_t o = edge_two_instances();
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 2 + 4);
    edge_open_inst(cl, 0, 1, 0, 40); /* chunks of 16, 16 and 8 tokens */
    edge_open_inst(cl, 1, 2, 4, 40); /* a cached prefix: 16, 16 and 4 */
    edge_run(cl);                    /* every region assigned; nothing computed */
    kvs_ring_t *ring = kvs_manager_ring(d->m);
    assert_int_equal(kvs_ring_live_count(ring), 6);
    const uint64_t full = (uint64_t)edge_region_bytes(cl, 16);
    assert_int_equal(kvs_ring_live_bytes(ring), 4 * full + full / 2 + full / 4);
    edge_computed_inst(cl, 0, 1, 40);
    edge_computed_inst(cl, 1, 2, 40);
    edge_run(cl);
    edge_expect_inst_ok(cl, 0, 1, 0, 40);
    edge_expect_inst_ok(cl, 1, 2, 4, 40);
    /* instance 1's 4 writers each wrote one head of every chunk */
    for (int64_t t = 0; t < 4; t++)
        assert_int_equal(edge_expect(edge_inst_node(cl, 1, t), 2, KVS_OK)->rdma_writes, 3);
    assert_int_equal(edge_expect(edge_prefill(cl, 0), 1, KVS_OK)->rdma_writes, 3);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* A prefill chunk of instance 0 waiting on the ring is released by the free
 * of a region that instance 1's room held: the watermark goes to every
 * prefill session that writes into the ring, whatever its instance. */
static void test_instance_watermark_releases_another_instance(void **state)
{
    (void)state;
    edge_opts_t o = edge_two_instances();
    o.ring_bytes = 12u << 10; /* one full region (8 KiB) and a half */
    edge_cluster_t *cl = edge_create(&o);
    edge_open_inst(cl, 1, 1, 0, 16); /* [0, 8K) of round 0 */
    edge_run(cl);
    edge_open_inst(cl, 0, 2, 0, 16); /* does not fit behind it: round 1 at 0 */
    edge_computed_inst(cl, 0, 2, 16);
    edge_run(cl);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(edge_stats(edge_prefill(cl, i)).watermark_waits, 1);
        assert_null(edge_result(edge_prefill(cl, i), 2));
    }
    edge_computed_inst(cl, 1, 1, 16);
    edge_run(cl);
    edge_expect_inst_ok(cl, 1, 1, 0, 16);
    edge_expect_inst_ok(cl, 0, 2, 0, 16);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* kvs_decode_add_instance, connect_peer and room_open_peer refuse what
 * cannot be: each error names what to change and adds nothing. */
static void test_instance_api_errors(void **state)
{
    (void)state;
    edge_opts_t o = edge_two_instances();
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    const kvs_error_t *err = kvs_manager_last_error(d->m);
    const char *addrs[12]; /* as many as the largest instance below has ranks */
    for (int i = 0; i < 12; i++)
        addrs[i] = "x";
    kvs_instance_desc_t desc = {.id = 5, .tp_size = 2, .addrs = addrs};
    assert_int_equal(kvs_decode_add_instance(NULL, &desc), KVS_EINVAL);
    assert_int_equal(kvs_decode_add_instance(d->dec, NULL), KVS_EINVAL);
    desc.tp_size = 0;
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EINVAL);
    assert_non_null(strstr(err->msg, "tp_size > 0"));
    desc.tp_size = 2;
    desc.pp_size = -1;
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EINVAL);
    desc.pp_size = 0;
    desc.dp_size = -1;
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EINVAL);
    desc.dp_size = 0;
    desc.addrs = NULL;
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EINVAL);
    desc.addrs = addrs;
    desc.id = 1; /* declared by the harness */
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EALREADY);
    desc.id = 5;
    const char *holes[2] = {"x0", NULL};
    desc.addrs = holes;
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EINVAL);
    assert_non_null(strstr(err->msg, "address 1 is NULL"));
    desc.addrs = addrs;
    desc.tp_size = 3; /* 4 KV heads do not split over TP 3 */
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EHEAD_SPLIT);
    desc.tp_size = 2;
    desc.dp_size = 2;
    desc.pp_size = 3; /* the model's 2 layers cannot fill 3 stages */
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EPP_SPLIT);
    desc.pp_size = 0;
    desc.dp_size = 100; /* more groups than max_instances leaves room for */
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EFULL);
    assert_non_null(strstr(err->msg, "max_instances"));
    /* None of the refused ones was added. */
    for (int g = 0; g < 2; g++)
        assert_int_equal(kvs_decode_connect_peer(d->dec, (kvs_peer_t){5, g}), KVS_ENOENT);
    assert_non_null(strstr(err->msg, "never declared"));
    assert_int_equal(kvs_decode_connect_peer(NULL, (kvs_peer_t){1, 0}), KVS_EINVAL);
    int64_t pages[2] = {0, 1};
    assert_int_equal(kvs_decode_room_open_peer(d->dec, 3, (kvs_peer_t){9, 0}, 0, 8, pages, 2),
                     KVS_ENOENT);
    assert_non_null(strstr(err->msg, "room 3 names prefill instance 9"));
    /* the default instance has no group 1 */
    assert_int_equal(kvs_decode_room_open_peer(d->dec, 3, (kvs_peer_t){0, 1}, 0, 8, pages, 2),
                     KVS_ENOENT);
    /* The declared ones still work, and connecting them again is a no-op. */
    assert_int_equal(kvs_decode_connect_peer(d->dec, (kvs_peer_t){1, 0}), KVS_OK);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 2 + 4);
    edge_open_inst(cl, 1, 1, 0, 24);
    edge_computed_inst(cl, 1, 1, 24);
    edge_run(cl);
    edge_expect_inst_ok(cl, 1, 1, 0, 24);
    edge_destroy(cl);

    /* A prefill rank whose instance table is full refuses a room naming a
     * decode instance it does not know yet. */
    o = edge_defaults();
    o.max_instances = 1; /* the default decode instance fills it */
    cl = edge_create(&o);
    edge_node_t *p = edge_prefill(cl, 0);
    assert_int_equal(kvs_prefill_room_open_peer(p->pre, 1, (kvs_peer_t){4, 0}, 8, pages, 2),
                     KVS_EFULL);
    assert_non_null(strstr(kvs_manager_last_error(p->m)->msg, "max_instances"));
    edge_destroy(cl);
    /* So does a decode whose table the declared instances filled, at the
     * first use of the default instance. */
    o.no_connect = true;
    cl = edge_create(&o);
    d = edge_decode(cl, 0);
    desc = (kvs_instance_desc_t){.id = 8, .tp_size = 2, .addrs = addrs};
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_OK);
    assert_int_equal(kvs_decode_connect(d->dec, "p0", 0, 0), KVS_EFULL);
    edge_destroy(cl);
}

/* A prefill rank that accepts a decode's registration but is another CP
 * rank (or of another CP size) than the address the decode used stands
 * for would write other tokens' rows: the decode takes it as a refusal,
 * naming both CP ranks. An instance of CP ranks that pairs on the direct
 * path is declared (its CP ranks each write their own range:
 * test_prefill_direct_cp_every_byte), and a CP size below 0 is refused. */
static void test_instance_cp_rank_misaddressed(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.no_connect = true;
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    const char *addrs[2] = {"p0", "p1"};
    /* TP 1 x CP 2 into this TP 1 decode: the direct path, which moves CP */
    const kvs_instance_desc_t cp2 = {.id = 3, .tp_size = 1, .addrs = addrs, .cp_size = 2};
    assert_int_equal(kvs_decode_add_instance(d->dec, &cp2), KVS_OK);
    const kvs_instance_desc_t bad = {.id = 4, .tp_size = 2, .addrs = addrs, .cp_size = -1};
    assert_int_equal(kvs_decode_add_instance(d->dec, &bad), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(d->m)->msg, "cp_size >= 0"));

    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    assert_int_equal(kvs_decode_connect(d->dec, "intruder", 0, 0), KVS_OK);
    edge_run(cl);
    kvs_msg_t got[4];
    assert_int_equal(edge_intruder_recv(cl, &x, got, 4), 1);
    assert_int_equal(got[0].type, KVS_MSG_REGISTER);
    kvs_msg_t m = {.type = KVS_MSG_REGISTER_ACK, .session = EDGE_PREFILL_SESSION};
    m.u.ack = (kvs_msg_register_ack_t){.echo = got[0].session, .status = KVS_OK,
                                       .fp = got[0].u.reg.fp, .cp_rank = 1, .cp_size = 1};
    edge_send(cl, x.fab, edge_conn(x.fab, "d0"), &m);
    edge_run(cl);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 0);
    const kvs_error_t *err = kvs_manager_last_error(d->m);
    assert_int_equal(err->status, KVS_EINVAL);
    assert_non_null(strstr(err->msg, "cannot take the registration: its address 'intruder' "
                                     "reaches context-parallel rank 1 of 1, not rank 0 of 1"));
    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* The decode's plan of a prefill instance with CP ranks (the piece every
 * path builds on; kvs_decode_add_instance with cp_size > 1 makes it): one
 * peer per (CP rank, TP source, stage), CP rank c's source j of
 * stage s at (c * tp_sources + j) * stages + s, each named from its CP
 * rank's group of addresses and carrying its cp_rank (kvs__on_ack compares
 * it); the layout's prefill_cp is the instance's. An index that ignored
 * the CP rank would give two CP ranks one peer (seen twice) and name it
 * from the wrong group. */
static void test_instance_cp_decode_peer_plan(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.no_connect = true;
    edge_cluster_t *cl = edge_create(&o);
    kvs_manager_t *m = edge_decode(cl, 0)->m; /* decode TP 1 */
    kvs__insts_t t;
    assert_int_equal(kvs__insts_init(&t, 2), KVS_OK);
    kvs__inst_t *inst = kvs__insts_add(&t, m, (kvs_peer_t){7, 0});
    assert_non_null(inst);
    /* prefill TP 2 x CP 2: 2 writers per CP rank, 4 peers */
    assert_int_equal(kvs__inst_set_geometry(inst, m, 2, 1, 2, true), KVS_OK);
    assert_int_equal(inst->cp_size, 2);
    assert_int_equal(inst->lay.prefill_cp, 2);
    assert_int_equal(inst->npeers, 4);
    const char *addrs[4] = {"c0t0", "c0t1", "c1t0", "c1t1"};
    assert_int_equal(kvs__inst_set_addrs(inst, m, addrs), KVS_OK);
    bool seen[4] = {false, false, false, false};
    for (int64_t c = 0; c < 2; c++)
        for (int64_t tp = 0; tp < 2; tp++) {
            const int64_t i = kvs__inst_writer_peer(inst, 0, c, tp, 0);
            assert_true(i >= 0 && i < 4);
            assert_false(seen[i]); /* one peer per (CP rank, TP rank) */
            seen[i] = true;
            const kvs__peer_t *p = &inst->peers[i];
            assert_int_equal(p->cp_rank, c);
            assert_int_equal(p->tp_rank, tp);
            assert_false(p->silent);
            char want[8];
            snprintf(want, sizeof want, "c%lldt%lld", (long long)c, (long long)tp);
            assert_string_equal(p->name, want);
        }
    assert_int_equal(kvs__inst_writer_peer(inst, 0, 2, 0, 0), -1); /* no CP rank 2 */
    assert_int_equal(kvs__inst_writer_peer(inst, 0, -1, 0, 0), -1);
    kvs__insts_fini(&t);
    edge_destroy(cl);
}

/* A decode that declares an instance with the addresses of another
 * instance's ranks is refused at its connect, naming both: the fabric keeps
 * one connection per address, and handing it to the second would give it
 * the first one's messages. Its rooms naming that instance are refused at
 * the call; the real instance's rooms go on. A REGISTER that names another
 * prefill instance than the one it reaches is refused by that rank, naming
 * both instances. */
static void test_instance_misaddressed(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    const char *addrs[2] = {"p0", "p1"}; /* instance 0's ranks */
    const kvs_instance_desc_t desc = {.id = 3, .tp_size = 2, .addrs = addrs};
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_OK);
    assert_int_equal(kvs_decode_connect_peer(d->dec, (kvs_peer_t){3, 0}), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(d->m)->msg,
                           "instance 3 rank tp 1 pp 0: its address 'p1' is already that of "
                           "instance 0 rank tp 1 pp 0"));
    int64_t pages[2] = {0, 1};
    assert_int_equal(kvs_decode_room_open_peer(d->dec, 7, (kvs_peer_t){3, 0}, 0, 8, pages, 2),
                     KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(d->m)->msg, "refused the registration"));
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);

    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_conn_t *xc = edge_conn(x.fab, "p1");
    kvs_msg_t m = edge_register_msg(cl);
    m.u.reg.tp_rank = 0;
    m.u.reg.peer_instance = 3;
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    kvs_msg_t got[2];
    assert_int_equal(edge_intruder_recv(cl, &x, got, 2), 1);
    assert_int_equal(got[0].u.ack.status, KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(edge_prefill(cl, 1)->m)->msg,
                           "registered for prefill instance 3 group 0, but this is "
                           "instance 0 group 0"));
    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* Attention data parallelism (spec §12): an instance of two attention
 * groups of TP 2 each; a room is served by one group, which behaves as an
 * instance of TP 2, and the other group never hears of it. */
static void test_instance_attention_groups(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.instances = 2;
    o.inst_tp[1] = 2;
    o.inst_dp[1] = 2;
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 2 + 2 * 2);
    edge_open_group(cl, 1, 0, 1, 0, 40);
    edge_open_group(cl, 1, 1, 2, 0, 24);
    edge_computed_group(cl, 1, 0, 1, 40);
    edge_computed_group(cl, 1, 1, 2, 24);
    edge_run(cl);
    edge_expect_group(cl, 1, 0, 1, KVS_OK);
    edge_expect_group(cl, 1, 1, 2, KVS_OK);
    for (int g = 0; g < 2; g++)
        for (int64_t t = 0; t < 2; t++)
            assert_null(edge_result(edge_group_node(cl, 1, g, t), g == 0 ? 2 : 1));
    assert_int_equal(edge_corrupt(cl, 1, 0, 40), 0);
    assert_int_equal(edge_corrupt(cl, 2, 0, 24), 0);
    edge_expect_ring_empty(cl);
    /* A group is a peer of its own: losing a rank of group 1 fails group 1's
     * rooms only, and the log names the group. */
    edge_open_group(cl, 1, 0, 3, 0, 24);
    edge_open_group(cl, 1, 1, 4, 0, 24);
    edge_run(cl);
    edge_crash(edge_group_node(cl, 1, 1, 0));
    edge_computed_group(cl, 1, 0, 3, 24);
    edge_run(cl);
    edge_expect_group(cl, 1, 0, 3, KVS_OK);
    edge_expect(d, 4, KVS_EPEER);
    edge_expect(edge_group_node(cl, 1, 1, 1), 4, KVS_EPEER);
    assert_non_null(strstr(d->log_last, "prefill instance 1 group 1 rank tp 0 pp 0 is "
                                        "unreachable"));
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* A prefill rank that is not told its decode instance's geometry learns it
 * from the first registration: a room opened before that waits for it and
 * then goes through; a room naming a decode instance that never registers
 * fails after the stall timeout, and only that room. */
static void test_instance_prefill_learns_its_decode_instance(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.prefill_learns = true;
    o.no_connect = true;
    edge_cluster_t *cl = edge_create(&o);
    for (int i = 0; i < 2; i++) {
        edge_node_t *p = edge_prefill(cl, i);
        int64_t pages[2] = {(int64_t)(8 + i), 9};
        assert_int_equal(kvs_prefill_room_open_peer(p->pre, 9, (kvs_peer_t){7, 0}, 8, pages, 2),
                         KVS_OK);
        edge_wake(p);
    }
    edge_open_prefill(cl, 0, 1, 40); /* before the decode instance registered */
    edge_open_prefill(cl, 1, 1, 40);
    edge_connect(cl, 0);
    edge_run(cl);
    edge_assert_registered(cl);
    edge_open_decode(cl, 1, 0, 40);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    for (int i = 0; i < 2; i++)
        assert_null(edge_result(edge_prefill(cl, i), 9));
    edge_run_past_timeouts(cl);
    for (int i = 0; i < 2; i++)
        edge_expect(edge_prefill(cl, i), 9, KVS_ETIMEDOUT);
    assert_null(edge_result(edge_decode(cl, 0), 9));
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* Peers of one instance cannot touch another instance's rooms: a prefill
 * rank of instance 1 speaking of a room of instance 0 is dropped by the
 * decode; a decode instance the prefill learned (an intruder registering
 * as instance 5) cannot name instance 0's rooms, and a room the caller
 * opens for instance 0 whose ROOM came from instance 5 fails (misrouted).
 * A known instance registering with another TP is refused naming it, and
 * one instance more than max_instances is refused naming the knob. */
static void test_instance_hostile_instances(void **state)
{
    (void)state;
    edge_opts_t o = edge_two_instances();
    o.max_instances = 2;
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    edge_open_inst(cl, 0, 1, 0, 40);
    edge_run(cl); /* room 1's regions assigned */
    kvs_fabric_t *ifab = sim_nic_fabric(edge_inst_node(cl, 1, 0)->nic);
    kvs_conn_t *ic = edge_conn(ifab, "d0"); /* i1p0's own connection */
    const kvs_handler_stats_t before = edge_stats(d);
    kvs_msg_t m = {.type = KVS_MSG_CHUNK_READY, .session = EDGE_PREFILL_SESSION + 0x100};
    m.u.ready = (kvs_msg_chunk_ready_t){.room = 1, .pages = 4};
    edge_send(cl, ifab, ic, &m);
    m.type = KVS_MSG_STAGING_REQ;
    m.u.req = (kvs_msg_staging_req_t){.room = 1, .pages = 4, .tokens = 16};
    edge_send(cl, ifab, ic, &m);
    m.type = KVS_MSG_STATUS;
    m.u.status = (kvs_msg_status_t){.room = 1, .status = KVS_OK};
    edge_send(cl, ifab, ic, &m);
    m.type = KVS_MSG_ABORT;
    m.u.abort = (kvs_msg_abort_t){.room = 1, .status = KVS_EPEER};
    edge_send(cl, ifab, ic, &m);
    edge_run(cl);
    assert_int_equal(edge_stats(d).msgs_rejected - before.msgs_rejected, 4);
    edge_computed_inst(cl, 0, 1, 40);
    edge_run(cl);
    edge_expect_inst_ok(cl, 0, 1, 0, 40);

    /* The prefill side: an intruder registers as decode instance 5. */
    edge_node_t *p = edge_prefill(cl, 0);
    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_conn_t *xc = edge_conn(x.fab, "p0");
    kvs_msg_t got[4];
    kvs_msg_t g = edge_register_msg(cl);
    g.u.reg.instance = 5;
    edge_send(cl, x.fab, xc, &g);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 4), 1);
    assert_int_equal(got[0].type, KVS_MSG_REGISTER_ACK);
    assert_int_equal(got[0].u.ack.status, KVS_OK);
    /* ... instance 5 cannot speak of instance 0's room 1 (open again: 6) */
    edge_open(cl, 6, 0, 16);
    edge_run(cl);
    const kvs_handler_stats_t pb = edge_stats(p);
    m = (kvs_msg_t){.type = KVS_MSG_ROOM, .session = 0xbad5e55u};
    m.u.room = (kvs_msg_room_t){.room = 6, .total_tokens = 16, .num_pages = 4};
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    assert_int_equal(edge_stats(p).msgs_rejected - pb.msgs_rejected, 1);
    edge_computed(cl, 6, 16, true);
    edge_run(cl);
    edge_expect_inst_ok(cl, 0, 6, 0, 16);
    /* ... and a room it names first that the caller opens for instance 0
     * fails as misrouted, on this rank only. */
    m.u.room.room = 42;
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    int64_t pages[4] = {8, 9, 10, 11};
    assert_int_equal(kvs_prefill_room_open(p->pre, 42, 16, pages, 4), KVS_OK);
    edge_wake(p);
    edge_run(cl);
    edge_expect(p, 42, KVS_EPROTO);
    /* A known instance registering with another TP is refused, naming it. */
    g = edge_register_msg(cl);
    g.u.reg.instance = 5;
    g.u.reg.tp_size = 2;
    g.u.reg.fp.decode_tp = 2;
    edge_send(cl, x.fab, xc, &g);
    edge_run(cl);
    const kvs_error_t *err = kvs_manager_last_error(p->m);
    assert_int_equal(err->status, KVS_EFINGERPRINT);
    assert_non_null(strstr(err->msg, "decode TP size (--decode-tp) differs"));
    /* One instance more than max_instances (0 and 5 are known) is refused. */
    g = edge_register_msg(cl);
    g.u.reg.instance = 6;
    edge_send(cl, x.fab, xc, &g);
    edge_run(cl);
    assert_int_equal(err->status, KVS_EFULL);
    assert_non_null(strstr(err->msg, "max_instances"));
    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* A decode that declares an instance at the addresses of another
 * instance's ranks (and did not connect to those ranks otherwise) is
 * refused by each, and its own error names the instance the address
 * really reaches. */
static void test_instance_decode_names_the_instance_it_reached(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.no_connect = true;
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    const char *addrs[2] = {"p0", "p1"}; /* instance 0's ranks */
    const kvs_instance_desc_t desc = {.id = 3, .tp_size = 2, .addrs = addrs};
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_OK);
    assert_int_equal(kvs_decode_connect_peer(d->dec, (kvs_peer_t){3, 0}), KVS_OK);
    edge_run(cl);
    const kvs_error_t *err = kvs_manager_last_error(d->m);
    assert_int_equal(err->status, KVS_EINVAL);
    assert_non_null(strstr(err->msg, "its address 'p1' reaches prefill instance 0 group 0, not "
                                     "instance 3 group 0"));
    assert_int_equal(kvs_decode_peers_ready(d->dec), 0);
    edge_destroy(cl);
}

int main(void)
{
    print_message("test_instance: seed %llu\n", (unsigned long long)EDGE_SEED);
    /* KVS_EDGE_TEST=<glob> runs only the matching tests (replay one). */
    if (getenv("KVS_EDGE_TEST") != NULL)
        cmocka_set_test_filter(getenv("KVS_EDGE_TEST"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_instance_two_instances_share_the_ring),
        cmocka_unit_test(test_instance_watermark_releases_another_instance),
        cmocka_unit_test(test_instance_api_errors),
        cmocka_unit_test(test_instance_hostile_instances),
        cmocka_unit_test(test_instance_misaddressed),
        cmocka_unit_test(test_instance_decode_names_the_instance_it_reached),
        cmocka_unit_test(test_instance_attention_groups),
        cmocka_unit_test(test_instance_prefill_learns_its_decode_instance),
        cmocka_unit_test(test_instance_cp_rank_misaddressed),
        cmocka_unit_test(test_instance_cp_decode_peer_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
