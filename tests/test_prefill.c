/*
 * test_prefill.c - the prefill handler's own part (src/prefill.c) on the
 * simulated cluster: the registration check (kvs__check_register: every
 * fingerprint field that differs refused by name, bf16 against fp16, a
 * pipeline stage the rank does not serve, hostile geometry that would size
 * an allocation or overflow an address), argument and state errors of
 * kvs_prefill_*, hostile and stale messages to a prefill rank, the two
 * sides disagreeing on a prompt length, and an ABORT before the caller
 * opened the room.
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

/* ---- incompatible peers --------------------------------------------------- */

static void edge_expect_refused(edge_cluster_t *cl, int64_t ready, int odd, const char *field)
{
    edge_run(cl);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(kvs_decode_peers_ready(d->dec), ready);
    const kvs_error_t *de = kvs_manager_last_error(d->m);
    assert_int_equal(de->status, KVS_EFINGERPRINT);
    if (strstr(de->msg, "refused the registration") == NULL)
        EDGE_FAIL("decode error does not say the registration was refused: %s", de->msg);
    assert_true(d->log_errors >= 1);
    for (int i = 0; i < cl->nprefill; i++) {
        if (odd >= 0 && i != odd)
            continue;
        const kvs_error_t *pe = kvs_manager_last_error(edge_prefill(cl, i)->m);
        assert_int_equal(pe->status, KVS_EFINGERPRINT);
        if (strstr(pe->msg, field) == NULL)
            EDGE_FAIL("p%d error does not name '%s': %s", i, field, pe->msg);
        assert_int_equal(edge_prefill(cl, i)->log_errors, 1);
    }
}

static void test_prefill_fingerprint_mismatch(void **state)
{
    (void)state;
    /* p1 pages of 8 tokens against the decode's 4. */
    edge_opts_t o = edge_defaults();
    o.odd_rank = 1;
    o.odd_page_size = 8;
    edge_cluster_t *cl = edge_create(&o);
    edge_expect_refused(cl, 1, 1, "page size differs: this side 8, peer 4");
    assert_int_equal(kvs_manager_last_error(edge_prefill(cl, 0)->m)->status, KVS_OK);
    /* With a peer that refused, no request can ever complete: refused at
     * once instead of waiting forever. */
    int64_t pages[2] = {0, 1};
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(kvs_decode_room_open(d->dec, 1, 0, 8, pages, 2), KVS_EFINGERPRINT);
    edge_run(cl);
    assert_null(edge_result(d, 1));
    edge_expect_ring_empty(cl);
    edge_destroy(cl);

    /* A room opened right after connecting, before the refusal arrived: it
     * fails when the refusal comes (p0 is told and ends it too) instead of
     * waiting forever for a rank that will never take part. */
    o.no_connect = true;
    cl = edge_create(&o);
    d = edge_decode(cl, 0);
    edge_connect(cl, 0);
    edge_open_decode(cl, 1, 0, 40);
    edge_open_prefill(cl, 0, 1, 40);
    edge_computed_on(cl, 0, 1, 40, true);
    edge_expect_refused(cl, 1, 1, "page size");
    edge_expect(d, 1, KVS_EFINGERPRINT);
    edge_expect(edge_prefill(cl, 0), 1, KVS_EFINGERPRINT);
    edge_expect_ring_empty(cl);
    edge_expect_decode_last(cl, 1);
    edge_destroy(cl);

    /* p1 an MLA rank (one latent per layer) against a GQA decode: the
     * kind is named, before the heads that differ as well. */
    o = edge_defaults();
    o.odd_rank = 1;
    o.odd_mla = true;
    cl = edge_create(&o);
    edge_expect_refused(cl, 1, 1, "KV kind (0 gqa: K and V per layer, 1 mla: one latent per "
                                  "layer; kv_kind, --model / --mla-latent-dim) differs: this "
                                  "side 1, peer 0");
    edge_destroy(cl);

    /* p1 an FP8 rank with per-token scale planes against an FP8 decode
     * without: the scales would never arrive, so the flag is named. */
    o = edge_defaults();
    o.dtype = KVS_DTYPE_FP8;
    o.odd_rank = 1;
    o.odd_scales = true;
    cl = edge_create(&o);
    edge_expect_refused(cl, 1, 1, "KV scales (0 none, 1 per-token, 2 per-block; kv_scales, "
                                  "--kv-scales) differs: this side 1, peer 0");
    edge_destroy(cl);

    /* p1 in fp32 against bf16. */
    o = edge_defaults();
    o.odd_rank = 1;
    o.odd_dtype = KVS_DTYPE_FP32;
    o.odd_dtype_set = true;
    cl = edge_create(&o);
    edge_expect_refused(cl, 1, 1, "dtype");
    edge_destroy(cl);

    /* Staging on one side, the slice path on the other: every writer refuses. */
    o = edge_defaults();
    o.odd_rank = -2;
    o.odd_slice = true;
    cl = edge_create(&o);
    edge_expect_refused(cl, 0, -1, "transfer path (staging on/off, --path) differs: this "
                                   "side 3, peer 1");
    assert_int_equal(kvs_decode_room_open(edge_decode(cl, 0)->dec, 1, 0, 8, pages, 2),
                     KVS_EFINGERPRINT);
    edge_destroy(cl);

    /* The layout: both sides must agree on every TP and PP size. Prefill
     * ranks that believe they are stage 0 of PP 2 used to be accepted (same
     * model layers, writer found) and wrote half the layers of a chunk the
     * decode then called complete. */
    o = edge_defaults();
    o.odd_rank = -2;
    o.odd_pp = 2;
    cl = edge_create(&o);
    edge_expect_refused(cl, 0, -1, "prefill PP size (--prefill-pp) differs: this side 2, "
                                   "peer 1");
    assert_non_null(strstr(kvs_manager_last_error(edge_decode(cl, 0)->m)->msg,
                           "prefill PP size (--prefill-pp) differs: this side 1, peer 2"));
    edge_destroy(cl);

    /* p1 believes in decode TP 4. */
    o = edge_defaults();
    o.odd_rank = 1;
    o.odd_decode_tp = 4;
    cl = edge_create(&o);
    edge_expect_refused(cl, 1, 1, "decode TP size (--decode-tp) differs: this side 4, peer 1");
    edge_destroy(cl);

    /* Same shape, another application tag (kvstage serve: other workload
     * flags): refused by name on both sides instead of failing requests. */
    o = edge_defaults();
    o.odd_rank = -2;
    o.odd_app_tag = 0xfeed;
    cl = edge_create(&o);
    edge_expect_refused(cl, 0, -1, "application tag (app_tag; serve: --seed/--requests/"
                                   "--prompt-tokens) differs: this side 65261, peer 0; run "
                                   "both sides with the same setting");
    assert_non_null(strstr(kvs_manager_last_error(edge_decode(cl, 0)->m)->msg,
                           "application tag (app_tag; serve: --seed/--requests/"
                           "--prompt-tokens) differs: this side 0, peer 65261; run both "
                           "sides with the same setting"));
    edge_destroy(cl);
}

static void test_prefill_args(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *p = edge_prefill(cl, 0);
    kvs_prefill_t *pre = p->pre;
    int64_t pages[EDGE_ROOM_SLOT_PAGES];
    for (int i = 0; i < EDGE_ROOM_SLOT_PAGES; i++)
        pages[i] = i;

    assert_int_equal(kvs_prefill_room_open(pre, 1, 8, pages, 3), KVS_EINVAL);
    assert_int_equal(kvs_prefill_room_open(pre, 1, 8, pages, 1), KVS_EINVAL);
    assert_int_equal(kvs_prefill_room_open(pre, 1, -1, pages, 0), KVS_EINVAL);
    assert_int_equal(kvs_prefill_room_open(pre, 1, 8, NULL, 2), KVS_EINVAL);
    int64_t bad[2] = {0, EDGE_POOL_PAGES};
    assert_int_equal(kvs_prefill_room_open(pre, 1, 8, bad, 2), KVS_ERANGE);
    bad[0] = -3;
    assert_int_equal(kvs_prefill_room_open(pre, 1, 8, bad, 2), KVS_ERANGE);
    assert_int_equal(kvs_prefill_room_computed(pre, 1, 8, true), KVS_ENOENT);

    /* A room the decode announced but this rank has not opened yet. */
    edge_open_decode(cl, 1, 0, 40);
    edge_run(cl);
    assert_int_equal(kvs_prefill_room_computed(pre, 1, 8, false), KVS_ENOENT);
    edge_open_prefill(cl, 0, 1, 40);
    assert_int_equal(kvs_prefill_room_open(pre, 1, 40, pages, 10), KVS_EALREADY);
    assert_int_equal(kvs_prefill_room_computed(pre, 1, 41, false), KVS_EINVAL);
    assert_int_equal(kvs_prefill_room_computed(pre, 1, 16, false), KVS_OK);
    assert_int_equal(kvs_prefill_room_computed(pre, 1, 12, false), KVS_EINVAL); /* shrinks */
    assert_int_equal(kvs_prefill_room_computed(pre, 1, 32, true), KVS_EINVAL);  /* final early */
    assert_non_null(strstr(kvs_manager_last_error(p->m)->msg, "must grow"));
    assert_int_equal(kvs_prefill_room_computed(pre, 1, 16, false), KVS_OK); /* same end again */
    edge_open_prefill(cl, 1, 1, 40);
    edge_computed_on(cl, 1, 1, 40, true);
    edge_run(cl);
    assert_null(edge_result(p, 1)); /* p0 still waits for its last 24 tokens */
    edge_computed_on(cl, 0, 1, 32, false);
    edge_computed_on(cl, 0, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);

    /* NULL arguments */
    kvs_room_result_t res[2];
    assert_int_equal(kvs_prefill_room_open(NULL, 2, 8, pages, 2), KVS_EINVAL);
    assert_int_equal(kvs_prefill_room_computed(NULL, 2, 8, true), KVS_EINVAL);
    assert_int_equal(kvs_prefill_progress(NULL), KVS_EINVAL);
    assert_int_equal(kvs_prefill_poll_rooms(NULL, res, 2), KVS_EINVAL);
    assert_int_equal(kvs_prefill_poll_rooms(pre, NULL, 2), KVS_EINVAL);
    assert_int_equal(kvs_prefill_poll_rooms(pre, res, -1), KVS_EINVAL);
    assert_int_equal(kvs_prefill_poll_rooms(pre, res, 2), 0);
    assert_true(kvs_prefill_next_deadline_ns(pre) == UINT64_MAX);
    assert_true(kvs_prefill_next_deadline_ns(NULL) == UINT64_MAX);
    kvs_handler_stats_t a, b;
    memset(&a, 0x5a, sizeof a);
    b = a;
    kvs_prefill_stats(NULL, &a);
    assert_memory_equal(&a, &b, sizeof a);
    kvs_prefill_stats(pre, NULL);
    kvs_prefill_stats(pre, &a);
    assert_int_equal(a.rooms_ok, 1);
    assert_int_equal(a.rdma_writes, 3);
    assert_int_equal(a.watermark_waits, 0);

    kvs_prefill_t *other = NULL;
    assert_int_equal(kvs_prefill_create(p->m, &other), KVS_EALREADY);
    assert_int_equal(kvs_prefill_create(edge_decode(cl, 0)->m, &other), KVS_ESTATE);
    assert_int_equal(kvs_prefill_create(NULL, &other), KVS_EINVAL);
    assert_int_equal(kvs_prefill_create(p->m, NULL), KVS_EINVAL);
    assert_null(other);
    kvs_prefill_destroy(NULL);
    edge_destroy(cl);
}

static void test_prefill_hostile_to_prefill(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *p = edge_prefill(cl, 0);
    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_conn_t *xc = edge_conn(x.fab, "p0");
    const kvs_handler_stats_t before = edge_stats(p);
    kvs_msg_t got[8];

    /* A REGISTER whose fingerprint differs: refused, the refusal names the
     * field, and the answer goes back to the sender only. */
    kvs_msg_t m = edge_register_msg(cl);
    m.u.reg.fp.head_dim = 32;
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    assert_int_equal(got[0].type, KVS_MSG_REGISTER_ACK);
    assert_int_equal(got[0].u.ack.status, KVS_EFINGERPRINT);
    assert_int_equal(got[0].u.ack.echo, 0xbad5e55u);
    assert_int_equal(got[0].u.ack.tp_rank, 0);
    const kvs_error_t *err = kvs_manager_last_error(p->m);
    assert_int_equal(err->status, KVS_EFINGERPRINT);
    assert_non_null(strstr(err->msg, "head dim (MLA: the latent dim, --mla-latent-dim) "
                                     "differs: this side 16, peer 32"));
    assert_int_equal(p->log_errors, 1);
    /* A decode expecting a prefill of 2 CP ranks: refused naming the CP
     * size, and the answer says which CP rank of how many this one is. */
    m = edge_register_msg(cl);
    m.u.reg.fp.prefill_cp = 2;
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    assert_int_equal(got[0].u.ack.status, KVS_EFINGERPRINT);
    assert_int_equal(got[0].u.ack.fp.prefill_cp, 1);
    assert_int_equal(got[0].u.ack.cp_rank, 0);
    assert_int_equal(got[0].u.ack.cp_size, 1);
    assert_non_null(strstr(err->msg, "prefill CP size (context_parallel, "
                                     "kvs_instance_desc_t.cp_size; --prefill-cp) differs: "
                                     "this side 1, peer 2"));
    assert_int_equal(p->log_errors, 2);

    /* A good fingerprint from a decode rank this prefill does not serve. */
    m = edge_register_msg(cl);
    m.u.reg.tp_rank = 1;
    edge_send(cl, x.fab, xc, &m);
    /* Its own target, but with no ring to write into. */
    m = edge_register_msg(cl);
    m.u.reg.ring_bytes = 0;
    edge_send(cl, x.fab, xc, &m);
    m.u.reg.ring_bytes = 64;
    m.u.reg.ring_addr = UINT64_MAX - 8; /* wraps around the address space */
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 3);
    assert_int_equal(got[0].u.ack.status, KVS_EINVAL);
    assert_int_equal(got[1].u.ack.status, KVS_EPROTO);
    assert_int_equal(got[2].u.ack.status, KVS_EPROTO);
    assert_int_equal(err->status, KVS_EPROTO);
    assert_non_null(strstr(err->msg, "geometry is inconsistent"));

    /* Everything else from an unknown connection, or garbage, is dropped. */
    const uint8_t junk[5] = {'K', 'V', 'S', 'T', 0};
    edge_send_raw(x.fab, xc, junk, sizeof junk);
    m = (kvs_msg_t){.type = KVS_MSG_ROOM};
    m.session = EDGE_DECODE_SESSION;
    m.u.room = (kvs_msg_room_t){.room = 1, .total_tokens = 40,
                                .num_pages = 10};
    edge_send(cl, x.fab, xc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_WATERMARK};
    m.session = EDGE_DECODE_SESSION;
    m.u.wm = (kvs_msg_watermark_t){.round = 77};
    edge_send(cl, x.fab, xc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_STAGING_RSP};
    m.session = EDGE_DECODE_SESSION;
    m.u.rsp = (kvs_msg_staging_rsp_t){.room = 1,
                                      .status = KVS_EOVERSIZED};
    edge_send(cl, x.fab, xc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_ABORT};
    m.session = EDGE_DECODE_SESSION;
    m.u.abort = (kvs_msg_abort_t){.room = 1};
    edge_send(cl, x.fab, xc, &m);

    /* The real decode's registration is untouched: a room still moves. */
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);
    const kvs_handler_stats_t after = edge_stats(p);
    assert_int_equal(after.msgs_rejected - before.msgs_rejected, 5);
    assert_int_equal(after.rooms_failed, 0);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 0);

    /* From the decode's own connection: stale session, chunk out of range,
     * duplicates and messages only a prefill sends. */
    kvs_fabric_t *dfab = sim_nic_fabric(edge_decode(cl, 0)->nic);
    kvs_conn_t *dc = edge_conn(dfab, "p0");
    edge_open(cl, 2, 0, 40);
    m = (kvs_msg_t){.type = KVS_MSG_ROOM};
    m.session = EDGE_DECODE_SESSION;
    m.u.room = (kvs_msg_room_t){.room = 2, .total_tokens = 40,
                                .num_pages = 10};
    edge_send(cl, dfab, dc, &m); /* duplicate ROOM */
    m.u.room.room = 3;
    m.u.room.base_tokens = 2; /* misaligned prefix */
    edge_send(cl, dfab, dc, &m);
    m.session = EDGE_DECODE_SESSION;
    m.u.room = (kvs_msg_room_t){.room = 3, .total_tokens = 40,
                                .num_pages = 3};
    edge_send(cl, dfab, dc, &m); /* wrong page count */
    m = (kvs_msg_t){.type = KVS_MSG_STAGING_RSP};
    m.session = EDGE_DECODE_SESSION;
    m.u.rsp = (kvs_msg_staging_rsp_t){.room = 2, .chunk = 7};
    edge_send(cl, dfab, dc, &m); /* chunk out of range */
    m.session = EDGE_DECODE_SESSION + 1;
    edge_send(cl, dfab, dc, &m); /* stale session */
    m = (kvs_msg_t){.type = KVS_MSG_STATUS};
    m.session = EDGE_DECODE_SESSION;
    m.u.status = (kvs_msg_status_t){.room = 2};
    edge_send(cl, dfab, dc, &m); /* a prefill -> decode message */
    m = (kvs_msg_t){.type = KVS_MSG_PAGES};
    m.session = EDGE_DECODE_SESSION;
    m.u.pages = (kvs_msg_pages_t){.room = 2, .count = 1};
    edge_send(cl, dfab, dc, &m); /* no pages on the staging path */
    m = (kvs_msg_t){.type = KVS_MSG_LAYERS};
    m.session = EDGE_DECODE_SESSION;
    m.u.layers = (kvs_msg_layers_t){.count = 1};
    edge_send(cl, dfab, dc, &m); /* no layers on the staging path */
    edge_computed(cl, 2, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    assert_int_equal(edge_stats(p).msgs_rejected - after.msgs_rejected, 8);

    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* ---- the two sides disagree on a request ----------------------------------- */

static void test_prefill_prompt_length_mismatch(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    /* The decode's ROOM (40 tokens) arrives before p0 opens 36 tokens. */
    edge_open_decode(cl, 1, 0, 40);
    edge_run(cl);
    edge_open_prefill(cl, 0, 1, 36);
    edge_open_prefill(cl, 1, 1, 40);
    edge_computed_on(cl, 0, 1, 36, true);
    edge_computed_on(cl, 1, 1, 40, true);
    edge_run(cl);
    edge_expect_all(cl, 1, KVS_EPROTO);
    edge_expect_ring_empty(cl);
    /* p1 opened 44 tokens before the decode's ROOM (40 tokens) arrived. */
    edge_open_prefill(cl, 0, 2, 40);
    edge_open_prefill(cl, 1, 2, 44);
    edge_open_decode(cl, 2, 0, 40);
    edge_computed_on(cl, 0, 2, 40, true);
    edge_computed_on(cl, 1, 2, 44, true);
    edge_run(cl);
    edge_expect_all(cl, 2, KVS_EPROTO);
    edge_expect_ring_empty(cl);
    edge_transfer(cl, 3, 0, 40);
    edge_expect_ok(cl, 3, 0, 40);
    edge_destroy(cl);
}

/* A registration that names a pipeline stage the prefill rank does not
 * serve is refused and names the rank; messages from a connected peer that
 * has not acknowledged the registration yet are counted and dropped. */
static void test_prefill_register_stage_and_early_messages(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.no_connect = true;
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    edge_node_t *p0 = edge_prefill(cl, 0);
    assert_int_equal(kvs_decode_connect(d->dec, "p0", 0, -1), KVS_EINVAL);
    assert_int_equal(kvs_decode_connect(d->dec, "p0", 0, 0), KVS_OK);
    assert_int_equal(kvs_decode_connect(d->dec, "p1", 1, 0), KVS_OK);
    /* p0 speaks before its acknowledgement reaches the decode. */
    kvs_fabric_t *p0fab = sim_nic_fabric(p0->nic);
    kvs_conn_t *pc = edge_conn(p0fab, "d0");
    kvs_msg_t m = {.type = KVS_MSG_STATUS};
    m.session = EDGE_PREFILL_SESSION;
    m.u.status = (kvs_msg_status_t){.room = 1};
    edge_send(cl, p0fab, pc, &m);
    edge_wake(d);
    edge_run(cl);
    edge_assert_registered(cl);
    assert_int_equal(edge_stats(d).msgs_rejected, 1);

    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_conn_t *xc = edge_conn(x.fab, "p0");
    m = edge_register_msg(cl);
    m.u.reg.pp_rank = 1;
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    kvs_msg_t got[2];
    assert_int_equal(edge_intruder_recv(cl, &x, got, 2), 1);
    assert_int_equal(got[0].u.ack.status, KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(p0->m)->msg,
                           "decode rank tp 0 pp 1 is not a target of prefill rank 0"));
    edge_intruder_destroy(&x);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_destroy(cl);
}

/* spec §7.1/§9: dtype is part of the fingerprint: bf16 and fp16 (both 2
 * bytes) must be told apart, or fp16 bits would be read as bf16. */
static void test_prefill_bf16_fp16_refused(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.odd_rank = -2;
    o.odd_dtype = KVS_DTYPE_FP16;
    o.odd_dtype_set = true;
    edge_cluster_t *cl = edge_create(&o);
    edge_expect_refused(cl, 0, -1, "dtype");
    edge_destroy(cl);
}

/* A prefill rank that has not opened a room yet when the decode aborts it
 * (here: OVERSIZED caused by p0's request) ends it anyway: it reports a
 * result for a room its caller never opened, forgets it, and the caller's
 * later kvs_prefill_room_open makes a fresh room that waits forever. */
static void test_prefill_abort_before_open(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.ring_bytes = 4096;
    edge_cluster_t *cl = edge_create(&o);
    edge_open_decode(cl, 1, 0, 40);
    edge_open_prefill(cl, 0, 1, 40);
    edge_computed_on(cl, 0, 1, 40, true);
    edge_run(cl);
    edge_expect(edge_decode(cl, 0), 1, KVS_EOVERSIZED);
    assert_null(edge_result(edge_prefill(cl, 1), 1)); /* p1 never opened it */
    edge_open_prefill(cl, 1, 1, 40);
    edge_computed_on(cl, 1, 1, 40, true);
    edge_run(cl);
    edge_expect(edge_prefill(cl, 1), 1, KVS_EOVERSIZED);
    edge_destroy(cl);
}

/* Issue 4 item 7: a REGISTER on the staging path may announce any
 * layers_total (a staging decode sends 0), and the prefill allocates
 * layers_total entries for it: a peer picks the size of a host
 * allocation (2^20 entries here, 32 MiB; near 2^58 calloc fails, or ASan
 * aborts the process). It must be refused as inconsistent geometry. */
static void test_prefill_hostile_register_layers_on_staging(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_conn_t *xc = edge_conn(x.fab, "p0");
    kvs_msg_t m = edge_register_msg(cl);
    m.u.reg.layers_total = 1 << 20;
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    kvs_msg_t got[4];
    assert_int_equal(edge_intruder_recv(cl, &x, got, 4), 1);
    assert_int_equal(got[0].type, KVS_MSG_REGISTER_ACK);
    if (got[0].u.ack.status != KVS_EPROTO)
        EDGE_FAIL("REGISTER with layers_total 2^20 on the staging path: answered %s, "
                  "expected KVS_EPROTO", kvs_status_name(got[0].u.ack.status));
    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* Issue 4 item 7: a direct-path REGISTER may announce a pool of any size
 * (num_pages > 0 is all that is checked); the prefill then computes remote
 * addresses page * page_size * heads * head bytes in int64 for page ids
 * below it, which overflows (undefined behaviour) for a pool of INT64_MAX
 * pages. A pool whose layer size does not fit in 64 bits cannot exist: the
 * registration must be refused as inconsistent geometry. */
static void test_prefill_hostile_register_pool_overflow(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.prefill_tp = 1;
    o.staging = false;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_conn_t *xc = edge_conn(x.fab, "p0");
    kvs_msg_t m = {.type = KVS_MSG_REGISTER};
    m.session = 0xbad5e55u;
    m.u.reg = (kvs_msg_register_t){.tp_rank = 0, .tp_size = 1,
                                   .pp_rank = 0, .pp_size = 1, .local_heads = d->heads,
                                   .num_pages = INT64_MAX, .layers_total = d->layers};
    kvs__fingerprint(kvs_manager_layout(d->m), kvs_manager_path(d->m), &edge_fp_cfg, &m.u.reg.fp);
    edge_send(cl, x.fab, xc, &m);
    edge_run(cl);
    kvs_msg_t got[4];
    assert_int_equal(edge_intruder_recv(cl, &x, got, 4), 1);
    assert_int_equal(got[0].type, KVS_MSG_REGISTER_ACK);
    if (got[0].u.ack.status != KVS_EPROTO)
        EDGE_FAIL("REGISTER of an INT64_MAX-page pool: answered %s, expected KVS_EPROTO",
                  kvs_status_name(got[0].u.ack.status));
    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

int main(void)
{
    print_message("test_prefill: seed %llu\n", (unsigned long long)EDGE_SEED);
    /* KVS_EDGE_TEST=<glob> runs only the matching tests (replay one). */
    if (getenv("KVS_EDGE_TEST") != NULL)
        cmocka_set_test_filter(getenv("KVS_EDGE_TEST"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_fingerprint_mismatch),
        cmocka_unit_test(test_prefill_args),
        cmocka_unit_test(test_prefill_hostile_to_prefill),
        cmocka_unit_test(test_prefill_prompt_length_mismatch),
        cmocka_unit_test(test_prefill_bf16_fp16_refused),
        cmocka_unit_test(test_prefill_abort_before_open),
        cmocka_unit_test(test_prefill_register_stage_and_early_messages),
        cmocka_unit_test(test_prefill_hostile_register_layers_on_staging),
        cmocka_unit_test(test_prefill_hostile_register_pool_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
