/*
 * test_prefill_direct.c - the prefill's direct and slice paths
 * (src/prefill_direct.c) on the simulated cluster: a failed write on either
 * path (no byte lands in the decode's KV pool after it ended the room), and
 * the decode's LAYERS, PAGES, ROOM and REGISTER fields the direct path
 * trusts, each out of range in turn (counted and dropped, the room failed
 * before any write, or the registration refused); and prefill context
 * parallelism on both paths, every byte (each CP rank writes its own range;
 * the decode waits for every CP rank, an empty range's too).
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

/* ---- the direct and slice paths fail cleanly -------------------------------- */

/* Fails the first write of p0 on a room, checks it fails everywhere, that
 * the decode ended it only after every writer was done and no byte landed in
 * its KV pool after that, then that the next room moves. */
static void edge_direct_write_error(edge_cluster_t *cl)
{
    edge_node_t *d = edge_decode(cl, 0);
    edge_snap_t snap = {.room = 1, .node = d, .mem = d->pool_host, .len = (size_t)d->pool_bytes,
                        .copy = malloc((size_t)d->pool_bytes)};
    assert_non_null(snap.copy);
    cl->on_result = edge_snap_on_result;
    cl->on_result_ctx = &snap;
    sim_nic_fail_next_writes(edge_prefill(cl, 0)->nic, 1);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_all(cl, 1, KVS_EREMOTE);
    edge_expect_decode_last(cl, 1);
    const size_t changed = edge_snap_changed(&snap);
    if (changed != 0)
        EDGE_FAIL("%zu bytes of the decode's KV pool were written after it ended room 1",
                  changed);
    cl->on_result = NULL;
    free(snap.copy);
    edge_transfer(cl, 2, 4, 44);
    edge_expect_ok(cl, 2, 4, 44);
}

static void test_prefill_direct_direct_write_error(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.prefill_tp = 1;
    o.staging = false;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    assert_int_equal(kvs_manager_path(edge_decode(cl, 0)->m), KVS_PATH_DIRECT);
    assert_null(kvs_manager_ring(edge_decode(cl, 0)->m));
    edge_transfer(cl, 5, 0, 40);
    edge_expect_ok(cl, 5, 0, 40);
    /* Two page runs on the decode side x 2 layers x K/V. */
    assert_int_equal(edge_expect(edge_prefill(cl, 0), 5, KVS_OK)->rdma_writes, 8);
    edge_direct_write_error(cl);
    edge_destroy(cl);
}

static void test_prefill_direct_slice_write_error(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.staging = false;
    o.path = KVS_PATH_SLICE;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    assert_int_equal(kvs_manager_path(edge_decode(cl, 0)->m), KVS_PATH_SLICE);
    edge_transfer(cl, 5, 0, 12);
    edge_expect_ok(cl, 5, 0, 12);
    /* Heads are sliced: one write per token x layer x K/V. */
    assert_int_equal(edge_expect(edge_prefill(cl, 1), 5, KVS_OK)->rdma_writes, 12 * 2 * 2);
    edge_direct_write_error(cl);
    edge_destroy(cl);
}

/* The direct path trusts the decode's LAYERS (remote addresses and keys)
 * and PAGES (decode page ids). From the decode's own session: LAYERS out of
 * order or past the registered count, PAGES out of order or past the room's
 * page count are counted and dropped; a page id outside the pool the decode
 * registered fails the room (ERANGE) before any write; a layer key the
 * decode never registered makes the writes fail at the fabric (EREMOTE). */
static void test_prefill_direct_hostile_direct_fields(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.prefill_tp = 1;
    o.staging = false;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    edge_node_t *p = edge_prefill(cl, 0);
    kvs_fabric_t *dfab = sim_nic_fabric(d->nic);
    kvs_conn_t *dc = edge_conn(dfab, "p0");
    const uint64_t ds = EDGE_DECODE_SESSION;

    /* LAYERS after all arrived: starts past what was received, or overruns
     * the count REGISTER announced. */
    kvs_handler_stats_t before = edge_stats(p);
    kvs_msg_t m = {.type = KVS_MSG_LAYERS};
    m.session = ds;
    m.u.layers = (kvs_msg_layers_t){.first = 2, .count = 1};
    edge_send(cl, dfab, dc, &m);
    m.session = ds;
    m.u.layers = (kvs_msg_layers_t){.first = 0, .count = 1};
    edge_send(cl, dfab, dc, &m); /* layers_got is 2 already */
    m.session = ds;
    m.u.layers = (kvs_msg_layers_t){.first = -1, .count = 3};
    edge_send(cl, dfab, dc, &m);
    /* A room only the forged messages announce, 12 tokens = 3 pages. */
    m = (kvs_msg_t){.type = KVS_MSG_ROOM};
    m.session = ds;
    m.u.room = (kvs_msg_room_t){.room = 7, .total_tokens = 12, .num_pages = 3};
    edge_send(cl, dfab, dc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_PAGES};
    m.session = ds;
    m.u.pages = (kvs_msg_pages_t){.room = 7, .first = 1, .count = 1};
    edge_send(cl, dfab, dc, &m); /* out of order */
    m.session = ds;
    m.u.pages = (kvs_msg_pages_t){.room = 7, .first = 0, .count = 4};
    edge_send(cl, dfab, dc, &m); /* more than 3 pages */
    m.session = ds;
    m.u.pages = (kvs_msg_pages_t){.room = 404, .first = 0, .count = 1};
    edge_send(cl, dfab, dc, &m); /* unknown room */
    m.session = ds;
    m.u.pages = (kvs_msg_pages_t){.room = 7, .first = 0, .count = 3,
                                  .ids = {0, EDGE_POOL_PAGES, 1}};
    edge_send(cl, dfab, dc, &m); /* page 96 is past the 96-page pool */
    edge_run(cl);
    assert_int_equal(edge_stats(p).msgs_rejected - before.msgs_rejected, 7);
    edge_open_prefill(cl, 0, 7, 12);
    edge_computed(cl, 7, 12, true);
    edge_run(cl);
    edge_expect(p, 7, KVS_ERANGE);
    assert_int_equal(edge_expect(p, 7, KVS_ERANGE)->rdma_writes, 0);
    assert_int_equal(edge_stats(p).rdma_writes, before.rdma_writes);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);

    /* A K layer key the decode never registered (a new registration of the
     * same session with its real geometry): the fabric refuses the writes. */
    kvs_msg_t reg = {.type = KVS_MSG_REGISTER};
    reg.session = ds;
    reg.u.reg = (kvs_msg_register_t){.tp_rank = 0, .tp_size = 1, .pp_rank = 0,
                                     .pp_size = 1, .local_heads = d->heads,
                                     .num_pages = EDGE_POOL_PAGES,
                                     .layers_total = d->layers};
    kvs__fingerprint(kvs_manager_layout(d->m), kvs_manager_path(d->m), &edge_fp_cfg, &reg.u.reg.fp);
    edge_send(cl, dfab, dc, &reg);
    kvs_msg_t lm = {.type = KVS_MSG_LAYERS};
    lm.session = ds;
    lm.u.layers = (kvs_msg_layers_t){.first = 0, .count = (uint32_t)d->layers};
    for (int64_t l = 0; l < d->layers; l++)
        lm.u.layers.entries[l] = (kvs_layer_entry_t){.k_addr = d->k_base[l], .k_rkey = 0x5a5a,
                                                     .v_addr = d->v_base[l], .v_rkey = 0x5a5b};
    edge_send(cl, dfab, dc, &lm);
    edge_run(cl);
    const uint8_t *pool = d->pool_host;
    uint8_t *copy = malloc((size_t)d->pool_bytes);
    assert_non_null(copy);
    memcpy(copy, pool, (size_t)d->pool_bytes);
    edge_transfer(cl, 2, 0, 40);
    edge_expect_all(cl, 2, KVS_EREMOTE);
    if (memcmp(copy, pool, (size_t)d->pool_bytes) != 0)
        EDGE_FAIL("a write with a layer key the decode never registered changed its KV pool");
    free(copy);
    edge_destroy(cl);
}

/* Direct path: a registration whose KV geometry is not the layout's (head
 * count, an empty pool) is refused; a ROOM with a negative prefix or an end
 * before it is counted and dropped; a decode page id below 0 fails the room
 * before any write; the writes of a room wait for every decode page id; an
 * empty room moves with no write; STAGING_REQ (a staging message) is
 * answered ENOENT and counted. */
static void test_prefill_direct_hostile_direct_geometry(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.prefill_tp = 1;
    o.staging = false;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    edge_node_t *p = edge_prefill(cl, 0);
    const uint64_t ds = EDGE_DECODE_SESSION;

    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_conn_t *xc = edge_conn(x.fab, "p0");
    kvs_msg_t reg = {.type = KVS_MSG_REGISTER};
    reg.session = 0xbad5e55u;
    reg.u.reg = (kvs_msg_register_t){.tp_rank = 0, .tp_size = 1,
                                     .pp_rank = 0, .pp_size = 1, .local_heads = d->heads,
                                     .num_pages = EDGE_POOL_PAGES, .layers_total = d->layers};
    kvs__fingerprint(kvs_manager_layout(d->m), kvs_manager_path(d->m), &edge_fp_cfg, &reg.u.reg.fp);
    kvs_msg_t bad = reg;
    bad.u.reg.local_heads = d->heads / 2;
    edge_send(cl, x.fab, xc, &bad);
    bad = reg;
    bad.u.reg.num_pages = 0;
    edge_send(cl, x.fab, xc, &bad);
    edge_run(cl);
    kvs_msg_t got[4];
    assert_int_equal(edge_intruder_recv(cl, &x, got, 4), 2);
    assert_int_equal(got[0].u.ack.status, KVS_EPROTO);
    assert_int_equal(got[1].u.ack.status, KVS_EPROTO);
    edge_intruder_destroy(&x);

    kvs_fabric_t *dfab = sim_nic_fabric(d->nic);
    kvs_conn_t *dc = edge_conn(dfab, "p0");
    kvs_handler_stats_t before = edge_stats(p);
    kvs_msg_t m = {.type = KVS_MSG_ROOM};
    m.session = ds;
    m.u.room = (kvs_msg_room_t){.room = 5, .base_tokens = -4, .total_tokens = 8,
                                .num_pages = 3};
    edge_send(cl, dfab, dc, &m);
    m.session = ds;
    m.u.room = (kvs_msg_room_t){.room = 5, .base_tokens = 8, .total_tokens = 4,
                                .num_pages = 0};
    edge_send(cl, dfab, dc, &m);
    /* room 6: a page id below 0 */
    m.session = ds;
    m.u.room = (kvs_msg_room_t){.room = 6, .total_tokens = 12, .num_pages = 3};
    edge_send(cl, dfab, dc, &m);
    kvs_msg_t pg = {.type = KVS_MSG_PAGES};
    pg.session = ds;
    pg.u.pages = (kvs_msg_pages_t){.room = 6, .first = 0, .count = 3,
                                   .ids = {0, -1, 1}};
    edge_send(cl, dfab, dc, &pg);
    /* room 7: announced, its page ids come later */
    m.session = ds;
    m.u.room = (kvs_msg_room_t){.room = 7, .total_tokens = 12, .num_pages = 3};
    edge_send(cl, dfab, dc, &m);
    edge_run(cl);
    assert_int_equal(edge_stats(p).msgs_rejected - before.msgs_rejected, 3);
    edge_open_prefill(cl, 0, 6, 12);
    edge_open_prefill(cl, 0, 7, 12);
    edge_computed(cl, 6, 12, true);
    edge_computed(cl, 7, 12, true);
    edge_run(cl);
    edge_expect(p, 6, KVS_ERANGE);
    assert_null(edge_result(p, 7));
    assert_int_equal(edge_stats(p).rdma_writes, before.rdma_writes);
    pg.session = ds;
    pg.u.pages = (kvs_msg_pages_t){.room = 7, .first = 0, .count = 3,
                                   .ids = {60, 61, 62}};
    edge_send(cl, dfab, dc, &pg);
    edge_run(cl);
    edge_expect(p, 7, KVS_OK);
    assert_true(edge_stats(p).rdma_writes > before.rdma_writes);

    /* A staging request on the direct path: answered ENOENT, counted. */
    kvs_fabric_t *p0fab = sim_nic_fabric(p->nic);
    kvs_conn_t *pc = edge_conn(p0fab, "d0");
    const kvs_handler_stats_t d_before = edge_stats(d);
    edge_open_decode(cl, 1, 0, 40);
    m = (kvs_msg_t){.type = KVS_MSG_STAGING_REQ};
    m.session = EDGE_PREFILL_SESSION;
    m.u.req = (kvs_msg_staging_req_t){.room = 1, .chunk = 0,
                                      .pages = 4, .tokens = 16};
    edge_send(cl, p0fab, pc, &m);
    edge_run(cl);
    assert_int_equal(edge_stats(d).msgs_rejected - d_before.msgs_rejected, 1);
    edge_open_prefill(cl, 0, 1, 40);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);

    /* An empty room, with no page lists at all. */
    assert_int_equal(kvs_decode_room_open(d->dec, 2, 0, 0, NULL, 0), KVS_OK);
    edge_wake(d);
    assert_int_equal(kvs_prefill_room_open(p->pre, 2, 0, NULL, 0), KVS_OK);
    edge_computed(cl, 2, 0, true);
    edge_run(cl);
    edge_expect_all(cl, 2, KVS_OK);
    assert_int_equal(edge_expect(p, 2, KVS_OK)->rdma_writes, 0);
    edge_destroy(cl);
}

/* Issue 4 item 7: on the direct path the prefill allocates a room's decode
 * page list when the decode's ROOM arrives, sized num_pages * 8 bytes in
 * size_t: a ROOM of INT64_MAX tokens (2^61 pages of 4 tokens) wraps that
 * to malloc(0), and the PAGES that follow are written past it (a heap
 * overflow ASan reports). A ROOM with more pages than the decode registered
 * in its pool must be counted and dropped, and its PAGES with it. */
static void test_prefill_direct_hostile_direct_room_pages_overflow(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.prefill_tp = 1;
    o.staging = false;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *p = edge_prefill(cl, 0);
    kvs_fabric_t *dfab = sim_nic_fabric(edge_decode(cl, 0)->nic);
    kvs_conn_t *dc = edge_conn(dfab, "p0");
    const kvs_handler_stats_t before = edge_stats(p);
    kvs_msg_t m = {.type = KVS_MSG_ROOM};
    m.session = EDGE_DECODE_SESSION;
    m.u.room = (kvs_msg_room_t){.room = 7,
                                .total_tokens = INT64_MAX,
                                .num_pages = INT64_MAX / 4 + 1};
    edge_send(cl, dfab, dc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_PAGES};
    m.session = EDGE_DECODE_SESSION;
    m.u.pages = (kvs_msg_pages_t){.room = 7, .first = 0,
                                  .count = 64};
    edge_send(cl, dfab, dc, &m);
    edge_run(cl);
    assert_int_equal(edge_stats(p).msgs_rejected - before.msgs_rejected, 2);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_destroy(cl);
}

/* ---- prefill context parallelism on the direct and slice paths --------------- */

/* A cluster whose instance 1 is TP ptp x CP cp, staging off, path `path`
 * (auto: direct with equal TP, slice otherwise), into decode TP dtp; the
 * default instance (unused) pairs with the decode on the same path. */
static edge_cluster_t *cp_direct_cluster(kvs_path_t path, int64_t ptp, int64_t dtp, int64_t cp,
                                         bool mla)
{
    edge_opts_t o = edge_defaults();
    o.mla = mla;
    o.staging = false;
    o.path = path;
    o.prefill_tp = path == KVS_PATH_DIRECT ? dtp : 1;
    o.decode_tp = dtp;
    o.instances = 2;
    o.inst_tp[1] = ptp;
    o.inst_cp[1] = cp;
    o.max_aux_bytes = 64;
    edge_cluster_t *cl = edge_create(&o);
    const kvs_path_t want = ptp == dtp && path != KVS_PATH_SLICE ? KVS_PATH_DIRECT
                                                                 : KVS_PATH_SLICE;
    for (int64_t t = 0; t < ptp; t++)
        assert_int_equal(kvs_manager_path(edge_group_node(cl, 1, 0, t)->m), want);
    return cl;
}

/* Every CP rank writes its own range's tokens straight into the decode's
 * pages, read from its own pages; each CP rank's pool holds its range
 * only (the rest zero), so a rank that wrote another range, or read its
 * rows from the wrong place, leaves wrong bytes; every byte of every
 * decode rank is checked, and the bytes each decode counts. */
static void cp_direct_case_of(kvs_path_t path, int64_t ptp, int64_t dtp, int64_t cp,
                              int64_t base, int64_t total, bool mla)
{
    edge_cluster_t *cl = cp_direct_cluster(path, ptp, dtp, cp, mla);
    const uint64_t room = 5;
    const char aux[] = "cp-aux";
    edge_cp_transfer(cl, 1, room, base, total, aux, sizeof aux);
    char what[96];
    snprintf(what, sizeof what, "%s%s P%lld CP%lld -> D%lld",
             kvs_manager_path(edge_group_node(cl, 1, 0, 0)->m) == KVS_PATH_DIRECT ? "direct"
                                                                                : "slice",
             mla ? " MLA" : "", (long long)ptp, (long long)cp, (long long)dtp);
    edge_cp_expect_ok(cl, 1, room, base, total, aux, sizeof aux, what);
    /* the CP ranks wrote their ranges once: the bytes posted add up to the
     * room's (each decode rank's heads once per token and layer) */
    uint64_t posted = 0, want = 0;
    for (int64_t c = 0; c < cp; c++)
        for (int64_t t = 0; t < ptp; t++)
            posted += edge_result(edge_group_node(cl, 1, (int)c, t), room)->bytes;
    for (int d = 0; d < cl->ndecode; d++)
        want += edge_result(edge_decode(cl, d), room)->bytes;
    if (posted != want)
        EDGE_FAIL("%s: the CP ranks wrote %llu bytes, the decode ranks hold %llu", what,
                  (unsigned long long)posted, (unsigned long long)want);
    edge_destroy(cl);
}

static void cp_direct_case(kvs_path_t path, int64_t ptp, int64_t dtp, int64_t cp, int64_t base,
                           int64_t total)
{
    cp_direct_case_of(path, ptp, dtp, cp, base, total, false);
}

static void test_prefill_direct_cp_every_byte(void **state)
{
    (void)state;
    cp_direct_case(KVS_PATH_DIRECT, 2, 2, 2, 0, 40);  /* ranges [0,20) [20,40) */
    cp_direct_case(KVS_PATH_DIRECT, 2, 2, 2, 0, 72);  /* [0,36) [36,72) */
    cp_direct_case(KVS_PATH_SLICE, 4, 2, 2, 0, 40);   /* heads sliced, a write a token */
    cp_direct_case(KVS_PATH_SLICE, 2, 1, 2, 0, 72);
    cp_direct_case(KVS_PATH_AUTO, 2, 2, 2, 16, 40);   /* a prefix: CP rank 0 writes [16,20) */
    cp_direct_case(KVS_PATH_AUTO, 2, 2, 2, 24, 40);   /* CP rank 0's range all cached */
    cp_direct_case(KVS_PATH_AUTO, 4, 2, 2, 16, 40);   /* slice with a prefix */
    cp_direct_case(KVS_PATH_AUTO, 1, 1, 4, 0, 10);    /* [0,4) [4,8) [8,10), rank 3 nothing */
    cp_direct_case(KVS_PATH_AUTO, 1, 1, 4, 0, 3);     /* ranks 1 to 3 nothing */
    /* MLA: each decode rank's latent from one source per CP rank, the
     * others silent (they only report) */
    cp_direct_case_of(KVS_PATH_DIRECT, 2, 2, 2, 0, 40, true);
    cp_direct_case_of(KVS_PATH_SLICE, 4, 2, 2, 16, 40, true);
}

/* The decode counts a CP room done only once every CP rank reported: one
 * whose range holds tokens, and one whose range is empty, each computed
 * last, keep the room open on every decode rank until they are. */
static void test_prefill_direct_cp_waits_for_every_rank(void **state)
{
    (void)state;
    for (int64_t last = 1; last <= 3; last += 2) { /* CP rank 1 holds [4,8), 3 nothing */
        edge_cluster_t *cl = cp_direct_cluster(KVS_PATH_AUTO, 1, 1, 4, false);
        const uint64_t room = 6;
        const int64_t total = 10;
        edge_open_group(cl, 1, 0, room, 0, total);
        for (int64_t c = 0; c < 4; c++) {
            edge_node_t *n = edge_group_node(cl, 1, (int)c, 0);
            int64_t pages[EDGE_ROOM_SLOT_PAGES];
            const int64_t np = (total + n->page_size - 1) / n->page_size;
            for (int64_t k = 0; k < np; k++)
                pages[k] = edge_page(room, k, false);
            if (c > 0)
                assert_int_equal(kvs_prefill_room_open(n->pre, room, total, pages, np), KVS_OK);
            int64_t cs, ce;
            memset(n->pool_host, 0, n->pool_bytes);
            assert_int_equal(kvs_layout_cp_range(kvs_manager_layout(n->m), total, c, &cs, &ce),
                             KVS_OK);
            edge_fill_range(n, room, cs, ce);
            if (c != last)
                assert_int_equal(kvs_prefill_room_computed(n->pre, room, total, true), KVS_OK);
            edge_wake(n);
        }
        edge_run(cl);
        edge_node_t *d = edge_decode(cl, 0);
        if (edge_result(d, room) != NULL)
            EDGE_FAIL("the decode ended room %llu before CP rank %lld (of %s) reported",
                      (unsigned long long)room, (long long)last,
                      last == 3 ? "an empty range" : "tokens [4,8)");
        kvs_room_state_t st;
        assert_int_equal(kvs_decode_room_state(d->dec, room, &st), KVS_OK);
        assert_int_equal(st, KVS_ROOM_TRANSFERRING);
        edge_node_t *n = edge_group_node(cl, 1, (int)last, 0);
        assert_int_equal(kvs_prefill_room_computed(n->pre, room, total, true), KVS_OK);
        edge_wake(n);
        edge_run(cl);
        edge_cp_expect_ok(cl, 1, room, 0, total, NULL, 0, "direct P1 CP4 -> D1");
        edge_destroy(cl);
    }
}

int main(void)
{
    print_message("test_prefill_direct: seed %llu\n", (unsigned long long)EDGE_SEED);
    /* KVS_EDGE_TEST=<glob> runs only the matching tests (replay one). */
    if (getenv("KVS_EDGE_TEST") != NULL)
        cmocka_set_test_filter(getenv("KVS_EDGE_TEST"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_direct_direct_write_error),
        cmocka_unit_test(test_prefill_direct_slice_write_error),
        cmocka_unit_test(test_prefill_direct_hostile_direct_fields),
        cmocka_unit_test(test_prefill_direct_hostile_direct_geometry),
        cmocka_unit_test(test_prefill_direct_hostile_direct_room_pages_overflow),
        cmocka_unit_test(test_prefill_direct_cp_every_byte),
        cmocka_unit_test(test_prefill_direct_cp_waits_for_every_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
