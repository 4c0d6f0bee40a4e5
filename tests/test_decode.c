/*
 * test_decode.c - the decode handler (src/decode.c) on the simulated
 * cluster: the baseline transfer, a region larger than the ring, the ring's
 * live-allocation and wanted/scatter queue bounds, argument and state errors
 * of kvs_decode_*, empty rooms, a decode handler that goes away and comes
 * back (same session, new session), a failure while a scatter runs,
 * teardown at any point, a misaligned cached prefix, the decode's error of a
 * refused registration, and hostile CHUNK_READY / STAGING_REQ / ABORT
 * messages from a prefill session (counted and dropped, never used to
 * address memory).
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

/* ---- the baseline --------------------------------------------------------- */

static void test_decode_happy_path(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    assert_int_equal(kvs_manager_path(edge_decode(cl, 0)->m), KVS_PATH_STAGING);
    const int64_t full = edge_region_bytes(cl, 16);
    assert_int_equal(full, 8192);

    /* Three concurrent rooms: 40 tokens (chunks of 16, 16, 8), 44 tokens
     * after an 8-token cached prefix (16, 16, 4), and 3 tokens (one partial
     * page). Room 1 is computed in two steps (chunked prefill), so the rooms
     * opened after it end before it. */
    edge_open(cl, 1, 0, 40);
    edge_open(cl, 2, 8, 44);
    edge_open(cl, 3, 0, 3);
    edge_computed(cl, 1, 16, false);
    edge_computed(cl, 2, 44, true);
    edge_computed(cl, 3, 3, true);
    edge_run(cl);
    for (int i = 0; i < edge_nnodes(cl); i++)
        assert_null(edge_result(&cl->nodes[i], 1));
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ok(cl, 2, 8, 44);
    edge_expect_ok(cl, 3, 0, 3);
    edge_expect_ring_empty(cl);
    assert_int_equal(edge_prefill(cl, 0)->res[2].room, 1);

    const kvs_room_result_t *r = edge_expect(edge_decode(cl, 0), 1, KVS_OK);
    assert_int_equal(r->chunks, 3);
    assert_int_equal(r->bytes, 2 * full + edge_region_bytes(cl, 8));
    assert_true(r->done_ns > r->open_ns);
    for (int i = 0; i < 2; i++) {
        r = edge_expect(edge_prefill(cl, i), 1, KVS_OK);
        assert_int_equal(r->chunks, 3);
        assert_int_equal(r->rdma_writes, 3); /* one write per chunk */
        assert_int_equal(r->bytes, (2 * full + edge_region_bytes(cl, 8)) / 2);
    }
    const kvs_handler_stats_t ds = edge_stats(edge_decode(cl, 0));
    assert_int_equal(ds.rooms_ok, 3);
    assert_int_equal(ds.rooms_failed, 0);
    assert_int_equal(ds.msgs_rejected, 0);
    assert_int_equal(ds.copies, 7); /* one scatter per chunk */
    for (int i = 0; i < 2; i++) {
        const kvs_handler_stats_t ps = edge_stats(edge_prefill(cl, i));
        assert_int_equal(ps.rooms_ok, 3);
        assert_int_equal(ps.msgs_rejected, 0);
        assert_int_equal(ps.rdma_writes, 7); /* one write per chunk */
        assert_int_equal(ps.copies, 7);      /* one gather per chunk */
        assert_int_equal(ps.watermark_waits, 0);
    }
    edge_destroy(cl);
}

/* ---- a region larger than the ring ---------------------------------------- */

static void test_decode_oversized(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.ring_bytes = 4096; /* a full chunk region is 8 KiB; 8 tokens is 4 KiB */
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);

    edge_transfer(cl, 1, 0, 40);
    edge_expect_all(cl, 1, KVS_EOVERSIZED);
    edge_expect_ring_empty(cl);
    assert_int_equal(edge_stats(edge_decode(cl, 0)).rooms_failed, 1);
    for (int i = 0; i < 2; i++)
        assert_int_equal(edge_stats(edge_prefill(cl, i)).rdma_writes, 0);

    /* The same handlers still move a room whose region fits exactly. */
    edge_transfer(cl, 2, 0, 8);
    edge_expect_ok(cl, 2, 0, 8);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* ---- the ring's live-allocation bound ------------------------------------ */

static void test_decode_ring_live_bound(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.ring_max_live = 1; /* one region at a time: the rest waits in the queue */
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    const edge_room_t rooms[] = {{1, 0, 40}, {2, 4, 48}, {3, 0, 33}};
    edge_transfer_ok(cl, rooms, 3);
    const kvs_handler_stats_t ds = edge_stats(edge_decode(cl, 0));
    assert_int_equal(ds.ring_peak_bytes, edge_region_bytes(cl, 16));
    assert_int_equal(ds.ring_live_bytes, 0);
    assert_int_equal(ds.copies, 9);
    assert_int_equal(ds.rooms_ok, 3);
    edge_destroy(cl);
}

/* ---- argument and state errors of the public calls -------------------------- */

static void test_decode_args(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.no_connect = true;
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    kvs_decode_t *dec = d->dec;
    const kvs_error_t *err = kvs_manager_last_error(d->m);
    int64_t pages[EDGE_ROOM_SLOT_PAGES];
    for (int i = 0; i < EDGE_ROOM_SLOT_PAGES; i++)
        pages[i] = i;

    /* connect: only this rank's writers, once each; the fabric's error passes
     * through with its detail. */
    assert_int_equal(kvs_decode_connect(dec, "p2", 2, 0), KVS_EINVAL);
    assert_int_equal(kvs_decode_connect(dec, "p0", -1, 0), KVS_EINVAL);
    assert_int_equal(kvs_decode_connect(dec, "p0", 0, 1), KVS_EINVAL);
    assert_non_null(strstr(err->msg, "takes no part in the rooms of decode rank"));
    assert_int_equal(kvs_decode_connect(dec, "p0", 0, 0), KVS_OK);
    assert_int_equal(kvs_decode_room_open(dec, 1, 0, 8, pages, 2), KVS_ESTATE);
    assert_int_equal(kvs_decode_connect(dec, "p0", 0, 0), KVS_EALREADY);
    assert_int_equal(kvs_decode_connect(dec, "nobody", 1, 0), KVS_ENOENT);
    assert_non_null(strstr(err->msg, "nobody"));
    assert_non_null(strstr(err->msg, "keeps trying"));
    /* The handler keeps trying that address; meanwhile a room fails at once
     * (and is reported), naming the peer that is away. */
    assert_int_equal(kvs_decode_room_open(dec, 99, 0, 8, pages, 2), KVS_EPEER);
    assert_non_null(strstr(err->msg, "unreachable"));
    kvs_room_result_t gone[2];
    assert_int_equal(kvs_decode_poll_rooms(dec, gone, 2), 1);
    assert_int_equal(gone[0].status, KVS_EPEER);
    /* Connecting again with the right address replaces the wrong one. */
    assert_int_equal(kvs_decode_connect(dec, "p1", 1, 0), KVS_OK);
    assert_int_equal(kvs_decode_peers_ready(dec), 0);
    edge_wake(d);
    edge_run(cl);
    edge_assert_registered(cl);

    /* room_open */
    assert_int_equal(kvs_decode_room_open(dec, 1, 0, 8, pages, 3), KVS_EINVAL); /* 2 pages */
    assert_int_equal(kvs_decode_room_open(dec, 1, 0, 8, pages, 1), KVS_EINVAL);
    assert_int_equal(kvs_decode_room_open(dec, 1, 0, 8, NULL, 2), KVS_EINVAL);
    assert_int_equal(kvs_decode_room_open(dec, 1, -4, 8, pages, 3), KVS_EINVAL);
    assert_int_equal(kvs_decode_room_open(dec, 1, 12, 8, pages, 0), KVS_EINVAL);
    int64_t bad[2] = {0, EDGE_POOL_PAGES};
    assert_int_equal(kvs_decode_room_open(dec, 1, 0, 8, bad, 2), KVS_ERANGE);
    bad[1] = -1;
    assert_int_equal(kvs_decode_room_open(dec, 1, 0, 8, bad, 2), KVS_ERANGE);
    assert_int_equal(kvs_decode_poll_rooms(dec, d->res, EDGE_MAX_RESULTS), 0); /* none failed */
    /* A misaligned cached prefix fails that request (a result), not the rank. */
    assert_int_equal(kvs_decode_room_open(dec, 7, 2, 10, pages, 2), KVS_EPREFIX_ALIGN);
    assert_non_null(strstr(err->msg, "not a multiple of the page size"));
    kvs_room_result_t res[4];
    assert_int_equal(kvs_decode_poll_rooms(dec, res, 4), 1);
    assert_int_equal(res[0].room, 7);
    assert_int_equal(res[0].status, KVS_EPREFIX_ALIGN);
    assert_int_equal(kvs_decode_poll_rooms(dec, res, 0), 0);
    kvs_handler_stats_t st;
    kvs_decode_stats(dec, &st);
    assert_int_equal(st.rooms_failed, 2); /* this one, and the one while p1 was away */

    edge_transfer(cl, 1, 0, 8);
    edge_expect_ok(cl, 1, 0, 8);
    edge_open_decode(cl, 2, 0, 8);
    assert_int_equal(kvs_decode_room_open(dec, 2, 0, 8, pages, 2), KVS_EALREADY);
    for (int i = 0; i < 2; i++)
        edge_open_prefill(cl, i, 2, 8);
    edge_computed(cl, 2, 8, true);
    edge_run(cl);
    edge_expect_ok(cl, 2, 0, 8);
    edge_expect_ring_empty(cl);

    /* NULL handler and out arguments */
    assert_int_equal(kvs_decode_connect(NULL, "p0", 0, 0), KVS_EINVAL);
    assert_int_equal(kvs_decode_connect(dec, NULL, 0, 0), KVS_EINVAL);
    assert_int_equal(kvs_decode_room_open(NULL, 3, 0, 8, pages, 2), KVS_EINVAL);
    assert_int_equal(kvs_decode_progress(NULL), KVS_EINVAL);
    assert_int_equal(kvs_decode_poll_rooms(NULL, res, 4), KVS_EINVAL);
    assert_int_equal(kvs_decode_poll_rooms(dec, NULL, 4), KVS_EINVAL);
    assert_int_equal(kvs_decode_poll_rooms(dec, res, -1), KVS_EINVAL);
    assert_int_equal(kvs_decode_peers_ready(NULL), 0);
    assert_true(kvs_decode_next_deadline_ns(dec) == UINT64_MAX);
    assert_true(kvs_decode_next_deadline_ns(NULL) == UINT64_MAX);

    /* stats: a copy; NULL on either side changes nothing */
    kvs_handler_stats_t a, b;
    memset(&a, 0xab, sizeof a);
    b = a;
    kvs_decode_stats(NULL, &a);
    assert_memory_equal(&a, &b, sizeof a);
    kvs_decode_stats(dec, NULL);
    kvs_decode_stats(dec, &a);
    assert_int_equal(a.rooms_ok, 2);
    assert_int_equal(a.rooms_failed, 2);
    assert_int_equal(a.copies, 2);
    assert_int_equal(a.msgs_rejected, 0);
    a.rooms_ok = 99; /* the handler's own counters are not shared */
    kvs_decode_stats(dec, &b);
    assert_int_equal(b.rooms_ok, 2);

    /* creation guards */
    kvs_decode_t *other = NULL;
    assert_int_equal(kvs_decode_create(d->m, &other), KVS_EALREADY);
    assert_null(other);
    assert_int_equal(kvs_decode_create(edge_prefill(cl, 0)->m, &other), KVS_ESTATE);
    assert_int_equal(kvs_decode_create(NULL, &other), KVS_EINVAL);
    assert_int_equal(kvs_decode_create(d->m, NULL), KVS_EINVAL);
    assert_int_equal(kvs_manager_destroy(d->m), KVS_EBUSY);
    kvs_decode_destroy(NULL);
    edge_destroy(cl);
}

/* ---- hostile and stale control messages -------------------------------------- */

static void test_decode_hostile_to_decode(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_conn_t *xc = edge_conn(x.fab, "d0");
    /* p0's NIC speaks on the very connection the decode registered with:
     * what a confused or compromised prefill could send. */
    kvs_fabric_t *p0fab = sim_nic_fabric(edge_prefill(cl, 0)->nic);
    kvs_conn_t *pc = edge_conn(p0fab, "d0");
    const uint64_t p0s = EDGE_PREFILL_SESSION + 0;

    edge_open(cl, 1, 0, 40);
    const kvs_handler_stats_t before = edge_stats(d);
    const kvs_handler_stats_t p0_before = edge_stats(edge_prefill(cl, 0));

    /* From an unknown connection: malformed or well formed, all dropped. */
    const uint8_t junk[16] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    edge_send_raw(x.fab, xc, junk, sizeof junk);
    edge_send_raw(x.fab, xc, NULL, 0);
    kvs_msg_t m = {.type = KVS_MSG_STAGING_REQ};
    m.session = p0s;
    m.u.req = (kvs_msg_staging_req_t){.room = 1, .chunk = 0, .pages = 4,
                                      .tokens = 16, .writer = 0};
    edge_send(cl, x.fab, xc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_CHUNK_READY};
    m.session = p0s;
    m.u.ready = (kvs_msg_chunk_ready_t){.room = 1, .chunk = 0, .pages = 4};
    edge_send(cl, x.fab, xc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_STATUS};
    m.session = p0s;
    m.u.status = (kvs_msg_status_t){.room = 1, .status = KVS_OK, .chunks = 3};
    edge_send(cl, x.fab, xc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_ABORT};
    m.session = p0s;
    m.u.abort = (kvs_msg_abort_t){.room = 1, .status = KVS_EPEER};
    edge_send(cl, x.fab, xc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_REGISTER_ACK};
    m.u.ack = (kvs_msg_register_ack_t){.echo = EDGE_DECODE_SESSION, .status = KVS_EINVAL};
    edge_send(cl, x.fab, xc, &m);
    const uint64_t from_intruder = 7;

    /* From p0's connection: malformed, stale session, out of range. */
    uint8_t bad_magic[KVS_WIRE_HEADER_BYTES] = {0};
    edge_send_raw(p0fab, pc, bad_magic, sizeof bad_magic);
    m = (kvs_msg_t){.type = KVS_MSG_STAGING_REQ};
    m.session = p0s + 1;
    m.u.req = (kvs_msg_staging_req_t){.room = 1, .chunk = 0, .pages = 4,
                                      .tokens = 16};
    edge_send(cl, p0fab, pc, &m); /* stale session */
    m = (kvs_msg_t){.type = KVS_MSG_CHUNK_READY};
    m.session = p0s;
    m.u.ready = (kvs_msg_chunk_ready_t){.room = 1, .chunk = 99, .pages = 4};
    edge_send(cl, p0fab, pc, &m); /* chunk out of range */
    m.session = p0s;
    m.u.ready = (kvs_msg_chunk_ready_t){.room = 1, .chunk = 0, .pages = 4,
                                        .writer = 1};
    edge_send(cl, p0fab, pc, &m); /* p0 is writer 0 */
    m.session = p0s;
    m.u.ready = (kvs_msg_chunk_ready_t){.room = 1, .chunk = 0, .pages = 4,
                                        .stage = 3};
    edge_send(cl, p0fab, pc, &m); /* no such stage */
    m.session = p0s;
    m.u.ready = (kvs_msg_chunk_ready_t){.room = 404, .chunk = 0, .pages = 4};
    edge_send(cl, p0fab, pc, &m); /* unknown room */
    m = (kvs_msg_t){.type = KVS_MSG_STATUS};
    m.session = p0s;
    m.u.status = (kvs_msg_status_t){.room = 404, .status = KVS_OK};
    edge_send(cl, p0fab, pc, &m); /* unknown room */
    m = (kvs_msg_t){.type = KVS_MSG_ABORT};
    m.session = p0s;
    m.u.abort = (kvs_msg_abort_t){.room = 404, .status = KVS_EPEER};
    edge_send(cl, p0fab, pc, &m); /* unknown room */
    m = (kvs_msg_t){.type = KVS_MSG_WATERMARK};
    m.session = p0s;
    m.u.wm = (kvs_msg_watermark_t){.round = 9};
    edge_send(cl, p0fab, pc, &m); /* a decode -> prefill message */
    m = (kvs_msg_t){.type = KVS_MSG_REGISTER_ACK};
    m.u.ack = (kvs_msg_register_ack_t){.echo = EDGE_DECODE_SESSION + 5, .status = KVS_OK};
    edge_send(cl, p0fab, pc, &m); /* acknowledges another session */
    m = (kvs_msg_t){.type = KVS_MSG_STAGING_REQ};
    m.session = p0s;
    m.u.req = (kvs_msg_staging_req_t){.room = 404, .chunk = 0, .pages = 4,
                                      .tokens = 16};
    edge_send(cl, p0fab, pc, &m); /* unknown room: answered ENOENT, which p0 drops */
    const uint64_t from_p0 = 11;

    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);
    const kvs_handler_stats_t after = edge_stats(d);
    assert_int_equal(after.msgs_rejected - before.msgs_rejected, from_intruder + from_p0);
    assert_int_equal(after.rooms_failed, 0);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 2);
    /* The ENOENT answer is the only thing p0 saw of it, and it dropped it. */
    const kvs_handler_stats_t p0_after = edge_stats(edge_prefill(cl, 0));
    assert_int_equal(p0_after.msgs_rejected - p0_before.msgs_rejected, 1);
    kvs_msg_t got[4];
    assert_int_equal(edge_intruder_recv(cl, &x, got, 4), 0); /* never answered */

    /* A stale STAGING_REQ for a live room that does not match its chunk
     * fails that room (EPROTO), and only that room. */
    edge_open(cl, 2, 0, 40);
    m = (kvs_msg_t){.type = KVS_MSG_STAGING_REQ};
    m.session = p0s;
    m.u.req = (kvs_msg_staging_req_t){.room = 2, .chunk = 0, .pages = 3,
                                      .tokens = 12};
    edge_send(cl, p0fab, pc, &m);
    edge_computed(cl, 2, 40, true);
    edge_run(cl);
    edge_expect_all(cl, 2, KVS_EPROTO);
    edge_expect_ring_empty(cl);
    edge_transfer(cl, 3, 0, 40);
    edge_expect_ok(cl, 3, 0, 40);
    edge_expect_ring_empty(cl);

    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* ---- empty transfers -------------------------------------------------------- */

static void test_decode_empty_request(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_transfer(cl, 1, 0, 0);  /* an empty prompt */
    edge_transfer(cl, 2, 8, 8);  /* everything was in the decode's prefix cache */
    for (uint64_t room = 1; room <= 2; room++) {
        edge_expect_all(cl, room, KVS_OK);
        const kvs_room_result_t *r = edge_expect(edge_decode(cl, 0), room, KVS_OK);
        assert_int_equal(r->chunks, 1); /* one metadata-only chunk */
        assert_int_equal(r->bytes, 0);
        for (int i = 0; i < 2; i++) {
            r = edge_expect(edge_prefill(cl, i), room, KVS_OK);
            assert_int_equal(r->chunks, 1);
            assert_int_equal(r->rdma_writes, 0);
            assert_int_equal(r->bytes, 0);
        }
    }
    edge_expect_ring_empty(cl);
    const kvs_handler_stats_t ds = edge_stats(edge_decode(cl, 0));
    assert_int_equal(ds.ring_peak_bytes, 0);
    assert_int_equal(ds.msgs_rejected, 0);
    assert_int_equal(edge_stats(edge_prefill(cl, 0)).copies, 0);
    edge_transfer(cl, 3, 4, 5); /* and then one token */
    edge_expect_ok(cl, 3, 4, 5);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* ---- a decode handler that goes away, and comes back ------------------------ */

/* Recreates the decode handler of decode rank 0 on its manager and
 * reconnects it. */
static void edge_decode_recreate(edge_cluster_t *cl)
{
    edge_node_t *d = edge_decode(cl, 0);
    kvs_rank_t *rank = NULL;
    assert_int_equal(kvs_rank_create_on(d->m, &rank), KVS_OK);
    edge_attach(d, rank);
    edge_connect(cl, 0);
    edge_run(cl);
    edge_assert_registered(cl);
}

static void test_decode_restart(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.ring_bytes = 40u << 10; /* 5 full chunk regions: rooms below wrap it */
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);

    /* Room 1 is half way (chunk 0 moved, chunks 1 and 2 hold regions) when
     * the decode handler is destroyed. */
    edge_open(cl, 1, 0, 40);
    edge_computed(cl, 1, 16, false);
    edge_run(cl);
    assert_int_equal(edge_stats(d).copies, 1);
    edge_rank_drop(d);
    /* The ring belongs to the manager and outlives the handler: the regions
     * the handler held must have gone back with it. */
    edge_expect_ring_empty(cl);

    /* The prefill ranks find the connection dead when they go on: the room
     * fails there (EPEER), their failure reports cannot be sent, nothing
     * hangs. */
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    for (int i = 0; i < 2; i++) {
        edge_expect(edge_prefill(cl, i), 1, KVS_EPEER);
        assert_true(edge_prefill(cl, i)->log_warnings >= 1);
    }

    /* A new handler on the same manager (same session) registers again and
     * the ring serves many rooms, wrapping several times. */
    edge_decode_recreate(cl);
    for (uint64_t room = 2; room < 8; room++) {
        edge_transfer(cl, room, 0, 40);
        edge_expect_ok(cl, room, 0, 40);
        edge_expect_ring_empty(cl);
    }
    edge_destroy(cl);
}

/* Rebuilds decode rank 0 as a new incarnation: handler and manager
 * destroyed, a new manager with `session` on the same GPU and NIC. */
static void edge_decode_rebuild(edge_cluster_t *cl, uint64_t session)
{
    edge_node_t *d = edge_decode(cl, 0);
    edge_rank_drop(d);
    assert_int_equal(kvs_manager_destroy(d->m), KVS_OK);
    d->m = NULL;
    assert_int_equal(edge_node_manager(cl, d, session), KVS_OK);
    edge_connect(cl, 0);
    edge_run(cl);
    edge_assert_registered(cl);
}

/* spec §9 "decode restarts with the same session id; prefill keeps a stale
 * high watermark and overwrites live data". Room 1 is half way on the
 * prefill ranks when the decode handler restarts (same manager, same
 * session): what the prefill ranks still hold of it belongs to the old
 * incarnation and must not be written into the new one's ring. */
static void test_decode_restart_mid_room(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    edge_open(cl, 1, 0, 40);
    edge_computed(cl, 1, 16, false);
    edge_run(cl);
    assert_int_equal(edge_stats(d).copies, 1); /* chunk 0 moved; 1 and 2 hold regions */
    edge_rank_drop(d);
    edge_decode_recreate(cl);
    edge_expect_ring_empty(cl);
    /* Re-registration voided room 1 on the prefill ranks (nothing of it was
     * in flight, so it ended there and then). */
    for (int i = 0; i < 2; i++) {
        edge_expect(edge_prefill(cl, i), 1, KVS_EPEER);
        assert_int_equal(kvs_prefill_room_computed(edge_prefill(cl, i)->pre, 1, 40, true),
                         KVS_ENOENT);
    }
    assert_null(edge_result(d, 1));

    /* Room 2 of the new incarnation gets the ring offsets room 1 had, and
     * its bytes stay its own. */
    edge_open(cl, 2, 0, 40);
    edge_computed_on(cl, 0, 2, 32, false);
    edge_run(cl);
    edge_computed_on(cl, 0, 2, 40, true);
    edge_computed_on(cl, 1, 2, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* A decode that comes back as a new incarnation (a new manager, a new
 * session) replaces its old registration; the prefill ranks say so. */
static void test_decode_new_session(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_decode_rebuild(cl, EDGE_DECODE_SESSION + 100);
    /* The old decode's connections died with it (the prefills saw them go)
     * before the new one registered. */
    for (int i = 0; i < 2; i++) {
        edge_node_t *p = edge_prefill(cl, i);
        assert_int_equal(p->log_warnings, 1);
        /* ... saying why, in the fabric's words */
        assert_non_null(strstr(p->log_last, "unreachable (its connection died: the fabric "
                                            "reported it dead: NIC "));
        assert_non_null(strstr(p->log_last, "the peer closed the connection"));
        assert_int_equal(edge_stats(p).peers_lost, 1);
    }
    for (uint64_t room = 2; room < 6; room++) {
        edge_transfer(cl, room, 0, 40);
        edge_expect_ok(cl, room, 0, 40);
    }
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* ---- bounded tables ---------------------------------------------------------- */

static void test_decode_room_tables_full(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.max_rooms = 2;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    int64_t pages[2] = {40, 41};
    edge_open(cl, 1, 0, 8);
    edge_open(cl, 2, 0, 8);
    assert_int_equal(kvs_decode_room_open(d->dec, 3, 0, 8, pages, 2), KVS_EFULL);
    assert_non_null(strstr(kvs_manager_last_error(d->m)->msg, "room table full"));
    for (int i = 0; i < 2; i++)
        assert_int_equal(kvs_prefill_room_open(edge_prefill(cl, i)->pre, 3, 8, pages, 2),
                         KVS_EFULL);
    edge_computed(cl, 1, 8, true);
    edge_computed(cl, 2, 8, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 8);
    edge_expect_ok(cl, 2, 0, 8);
    edge_transfer(cl, 3, 0, 8); /* room again */
    edge_expect_ok(cl, 3, 0, 8);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* The wanted queue and the scatter queue hold one entry per waiting or
 * scattering chunk. With two live regions and two rooms, an empty room's
 * metadata-only chunk scatters next to two full ones: three in flight. */
static void test_decode_scatter_queue_bound(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.max_rooms = 2;
    o.ring_max_live = 2;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    sim_gpu_set_scatter_slowdown(d->gpu, 1000);
    edge_open(cl, 1, 0, 32);
    edge_computed(cl, 1, 32, true);
    while (edge_stats(d).copies < 2) /* both regions of room 1 scattering */
        assert_int_equal(sim_engine_step(cl->eng), 1);
    edge_open(cl, 2, 8, 8);
    edge_computed(cl, 2, 8, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 32);
    edge_expect_ok(cl, 2, 8, 8);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* ---- a failure while a scatter is still running ---------------------------------- */

static void test_decode_fail_during_scatter(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    sim_gpu_set_scatter_slowdown(d->gpu, 100000); /* a scatter takes ~1 s */
    edge_open(cl, 1, 0, 40);
    edge_computed(cl, 1, 16, false);
    while (edge_stats(d).copies == 0)
        assert_int_equal(sim_engine_step(cl->eng), 1);
    const uint64_t scatter_start_ns = sim_engine_now_ns(cl->eng);
    /* Chunk 0 is scattering; p0's write of chunk 1 fails. */
    sim_nic_fail_next_writes(edge_prefill(cl, 0)->nic, 1);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    /* p1 wrote chunks 1 and 2 and reported before the failure reached it. */
    edge_expect(d, 1, KVS_EREMOTE);
    edge_expect(edge_prefill(cl, 0), 1, KVS_EREMOTE);
    edge_expect(edge_prefill(cl, 1), 1, KVS_OK);
    edge_expect_decode_last(cl, 1);
    edge_expect_ring_empty(cl);
    /* The decode ended the room only once the scatter had finished with
     * the region. */
    const kvs_room_result_t *r = edge_result(d, 1);
    assert_true(r->done_ns - scatter_start_ns > 500000000ull);
    for (int i = 0; i < 2; i++)
        assert_true(edge_result(edge_prefill(cl, i), 1)->done_ns - scatter_start_ns < 1000000ull);
    sim_gpu_set_scatter_slowdown(d->gpu, 1);
    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_destroy(cl);
}

/* ---- teardown at any point -------------------------------------------------------- */

/* Destroys the cluster after k engine events of two concurrent rooms, for
 * k across the whole transfer: whatever is in flight (requests, gathers,
 * writes, scatters), destroy releases it (ASan checks) and the decode hands
 * its ring regions back. */
static void test_decode_teardown_anywhere(void **state)
{
    (void)state;
    uint64_t total = 0;
    {
        edge_opts_t o = edge_defaults();
        edge_cluster_t *cl = edge_create(&o);
        const uint64_t before = sim_engine_events_run(cl->eng);
        edge_open(cl, 1, 0, 40);
        edge_open(cl, 2, 4, 36);
        edge_computed(cl, 1, 40, true);
        edge_computed(cl, 2, 36, true);
        edge_run(cl);
        edge_expect_ok(cl, 1, 0, 40);
        for (int i = 0; i < edge_nnodes(cl); i++) /* every message was acknowledged */
            assert_int_equal(edge_stats(&cl->nodes[i]).msgs_unacked, 0);
        total = sim_engine_events_run(cl->eng) - before;
        edge_destroy(cl);
    }
    assert_true(total > 20);
    int seen_live = 0, seen_unacked = 0;
    for (uint64_t k = 0; k < total; k += 1 + total / 14) {
        edge_opts_t o = edge_defaults();
        edge_cluster_t *cl = edge_create(&o);
        edge_open(cl, 1, 0, 40);
        edge_open(cl, 2, 4, 36);
        edge_computed(cl, 1, 40, true);
        edge_computed(cl, 2, 36, true);
        if (k > 0)
            sim_engine_run(cl->eng, UINT64_MAX, k);
        edge_node_t *d = edge_decode(cl, 0);
        /* The rank's stats tell what its ring holds at every point. */
        const uint64_t live = kvs_ring_live_bytes(kvs_manager_ring(d->m));
        assert_int_equal(edge_stats(d).ring_live_bytes, live);
        seen_live += live > 0;
        seen_unacked += edge_stats(d).msgs_unacked > 0;
        edge_rank_drop(d);
        if (edge_ring_live_bytes(cl) != 0)
            EDGE_FAIL("after %llu events: the destroyed decode handler left %llu ring bytes",
                      (unsigned long long)k, (unsigned long long)edge_ring_live_bytes(cl));
        edge_destroy(cl);
    }
    assert_true(seen_live > 0);
    assert_true(seen_unacked > 0); /* a rank closed there would lose messages */
}

/* CHUNK_READY fields from p0's accepted session while every chunk of the
 * room holds its region: a chunk index below 0 or past the last, a writer or
 * stage that is not p0's, a page range that is not the chunk's, an unknown
 * room. Each is counted once and none counts as an arrival: the decode
 * scatters nothing early and the room moves every byte. STAGING_REQ chunk
 * indexes below 0 or past the last fail their room (EPROTO) and only it. */
static void test_decode_hostile_chunk_fields_to_decode(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    kvs_fabric_t *p0fab = sim_nic_fabric(edge_prefill(cl, 0)->nic);
    kvs_conn_t *pc = edge_conn(p0fab, "d0");
    const uint64_t p0s = EDGE_PREFILL_SESSION + 0;

    edge_open(cl, 1, 0, 40); /* chunks of 4, 4 and 2 pages */
    edge_run(cl);            /* requested and allocated; nothing computed */
    assert_int_equal(kvs_ring_live_count(kvs_manager_ring(d->m)), 3);
    const kvs_msg_chunk_ready_t good = {.room = 1, .chunk = 2, .page_start = 8, .pages = 2};
    kvs_msg_chunk_ready_t lies[] = {good, good, good, good, good, good, good, good, good, good};
    lies[0].chunk = -1;
    lies[1].chunk = 3;
    lies[2].chunk = INT64_MIN;
    lies[3].writer = -1;
    lies[4].writer = 1; /* p1's */
    lies[5].stage = -1;
    lies[6].stage = 1;
    lies[7].page_start = 9;
    lies[8].pages = 3;
    lies[9].room = 404;
    const kvs_handler_stats_t before = edge_stats(d);
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        kvs_msg_t m = {.type = KVS_MSG_CHUNK_READY, .session = p0s};
        m.u.ready = lies[i];
        edge_send(cl, p0fab, pc, &m);
    }
    edge_run(cl);
    const kvs_handler_stats_t after = edge_stats(d);
    assert_int_equal(after.msgs_rejected - before.msgs_rejected, 10);
    assert_int_equal(after.copies, before.copies); /* no arrival was counted */
    assert_null(edge_result(d, 1));
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);

    /* chunk index, and then a page count that is not chunk 0's */
    const int64_t bad_chunks[] = {-1, 3, INT64_MAX, 0};
    for (size_t i = 0; i < 4; i++) {
        const uint64_t room = 2 + i;
        edge_open(cl, room, 0, 40);
        const uint64_t rejected = edge_stats(d).msgs_rejected;
        kvs_msg_t m = {.type = KVS_MSG_STAGING_REQ};
        m.session = p0s;
        m.u.req = (kvs_msg_staging_req_t){.room = room, .chunk = bad_chunks[i],
                                          .pages = i == 3 ? 3 : 4, .tokens = 16};
        edge_send(cl, p0fab, pc, &m);
        edge_computed(cl, room, 40, true);
        edge_run(cl);
        edge_expect_all(cl, room, KVS_EPROTO);
        assert_true(edge_stats(d).msgs_rejected > rejected);
        edge_expect_ring_empty(cl);
    }
    edge_transfer(cl, 9, 0, 40);
    edge_expect_ok(cl, 9, 0, 40);
    edge_destroy(cl);
}

/* An ABORT with no status from a prefill session fails the room with EPEER.
 * Here p1 has written every chunk and reported before it comes, and p0 (the
 * peer that "told") is not told back: p0 writes every chunk and ends its
 * part ok, so each chunk completes its arrivals on a failed room and is not
 * scattered. The regions go back once both prefill ranks reported. */
static void test_decode_abort_without_status(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    kvs_fabric_t *p0fab = sim_nic_fabric(edge_prefill(cl, 0)->nic);
    kvs_conn_t *pc = edge_conn(p0fab, "d0");
    edge_open(cl, 1, 0, 40);
    edge_computed_on(cl, 1, 1, 40, true);
    edge_run(cl);
    edge_expect(edge_prefill(cl, 1), 1, KVS_OK);
    kvs_msg_t m = {.type = KVS_MSG_ABORT};
    m.session = EDGE_PREFILL_SESSION;
    m.u.abort = (kvs_msg_abort_t){.room = 1, .status = KVS_OK};
    edge_send(cl, p0fab, pc, &m);
    edge_run(cl);
    assert_null(edge_result(d, 1)); /* p0 has not reported */
    edge_computed_on(cl, 0, 1, 40, true);
    edge_run(cl);
    edge_expect(edge_prefill(cl, 0), 1, KVS_OK);
    edge_expect(d, 1, KVS_EPEER);
    assert_int_equal(edge_stats(d).copies, 0);
    edge_expect_ring_empty(cl);
    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_destroy(cl);
}

/* One region live at a time (ring_max_live 1): chunks wait for ring space
 * in a queue sized at room open. A second room opened while chunks of the
 * first wait grows the queue and keeps their order; a room that fails
 * while its chunks wait (p0's first write fails) drops them from the queue
 * and releases everything. */
static void test_decode_waiting_chunks(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.ring_max_live = 1;
    o.max_rooms = 2;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_open(cl, 1, 0, 40);
    edge_run(cl); /* chunk 0 holds the ring; chunks 1 and 2 wait */
    assert_int_equal(kvs_ring_live_count(kvs_manager_ring(edge_decode(cl, 0)->m)), 1);
    edge_open(cl, 2, 0, 40);
    edge_computed(cl, 1, 40, true);
    edge_computed(cl, 2, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);

    sim_nic_fail_next_writes(edge_prefill(cl, 0)->nic, 1);
    edge_transfer(cl, 3, 0, 40);
    edge_expect_all(cl, 3, KVS_EREMOTE);
    edge_expect_ring_empty(cl);
    edge_transfer(cl, 4, 0, 40);
    edge_expect_ok(cl, 4, 0, 40);
    edge_destroy(cl);
}

/* The wanted queue holds one entry per chunk waiting for a ring slot: one
 * room of 3 chunks with ring_max_live = max_rooms = 1 goes through one
 * region at a time instead of failing with EFULL. */
static void test_decode_wanted_queue_holds_every_chunk(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.ring_max_live = 1;
    o.max_rooms = 1;
    edge_cluster_t *cl = edge_create(&o);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_destroy(cl);
}

/* The decode's error of a refused registration names the field: the
 * refusal carries the prefill's fingerprint (it once carried only the
 * status, and only the prefill side could tell which field differed). */
static void test_decode_refused_decode_names_field(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.odd_rank = 1;
    o.odd_page_size = 8;
    edge_cluster_t *cl = edge_create(&o);
    const char *msg = kvs_manager_last_error(edge_decode(cl, 0)->m)->msg;
    /* kvs_strerror's generic text lists "page size" among the causes: look
     * for the field and its two values, as the prefill side gives them. */
    if (strstr(msg, "page size differs") == NULL)
        EDGE_FAIL("decode error does not name the page size: %s", msg);
    edge_destroy(cl);
}

/* spec §8 "decode cached prefix not page-aligned (fails that request)": the
 * decode refuses the room locally but never tells the prefill ranks, whose
 * rooms (opened by their caller) wait forever. */
static void test_decode_misaligned_prefix_told_to_prefill(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    int64_t pages[3] = {0, 1, 2};
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(kvs_decode_room_open(d->dec, 1, 2, 12, pages, 3), KVS_EPREFIX_ALIGN);
    edge_open_prefill(cl, 0, 1, 12);
    edge_open_prefill(cl, 1, 1, 12);
    edge_computed(cl, 1, 12, true);
    edge_run(cl);
    for (int i = 0; i < 2; i++)
        edge_expect(edge_prefill(cl, i), 1, KVS_EPREFIX_ALIGN);
    edge_destroy(cl);
}

/* Issue 4 item 7: CHUNK_READY's writer and stage are combined into a peer
 * index with signed arithmetic before they are range checked:
 * writer * stages + (stage - first_stage) overflows int64 (undefined
 * behaviour; UBSan aborts the process) for a writer near INT64_MAX. A
 * hostile prefill session must get it counted and dropped like writer 1. */
static void test_decode_hostile_chunk_ready_writer_overflow(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    kvs_fabric_t *p0fab = sim_nic_fabric(edge_prefill(cl, 0)->nic);
    kvs_conn_t *pc = edge_conn(p0fab, "d0");
    edge_open(cl, 1, 0, 40);
    edge_run(cl);
    const kvs_handler_stats_t before = edge_stats(d);
    kvs_msg_t m = {.type = KVS_MSG_CHUNK_READY};
    m.session = EDGE_PREFILL_SESSION;
    m.u.ready = (kvs_msg_chunk_ready_t){.room = 1, .chunk = 2,
                                        .page_start = 8, .pages = 2, .writer = INT64_MAX,
                                        .stage = 1};
    edge_send(cl, p0fab, pc, &m);
    m.u.ready.writer = INT64_MIN;
    m.u.ready.stage = -1;
    edge_send(cl, p0fab, pc, &m);
    edge_run(cl);
    assert_int_equal(edge_stats(d).msgs_rejected - before.msgs_rejected, 2);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    edge_destroy(cl);
}

int main(void)
{
    print_message("test_decode: seed %llu\n", (unsigned long long)EDGE_SEED);
    /* KVS_EDGE_TEST=<glob> runs only the matching tests (replay one). */
    if (getenv("KVS_EDGE_TEST") != NULL)
        cmocka_set_test_filter(getenv("KVS_EDGE_TEST"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_happy_path),
        cmocka_unit_test(test_decode_oversized),
        cmocka_unit_test(test_decode_ring_live_bound),
        cmocka_unit_test(test_decode_args),
        cmocka_unit_test(test_decode_hostile_to_decode),
        cmocka_unit_test(test_decode_empty_request),
        cmocka_unit_test(test_decode_restart),
        cmocka_unit_test(test_decode_restart_mid_room),
        cmocka_unit_test(test_decode_new_session),
        cmocka_unit_test(test_decode_room_tables_full),
        cmocka_unit_test(test_decode_scatter_queue_bound),
        cmocka_unit_test(test_decode_fail_during_scatter),
        cmocka_unit_test(test_decode_teardown_anywhere),
        cmocka_unit_test(test_decode_wanted_queue_holds_every_chunk),
        cmocka_unit_test(test_decode_refused_decode_names_field),
        cmocka_unit_test(test_decode_misaligned_prefix_told_to_prefill),
        cmocka_unit_test(test_decode_hostile_chunk_fields_to_decode),
        cmocka_unit_test(test_decode_abort_without_status),
        cmocka_unit_test(test_decode_waiting_chunks),
        cmocka_unit_test(test_decode_hostile_chunk_ready_writer_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
