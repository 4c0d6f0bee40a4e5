/*
 * test_prefill_staging.c - the prefill's staging path (src/prefill_staging.c)
 * on the simulated cluster: failed RDMA writes (with a slow sibling still
 * writing), the bound on writes in flight, forged and duplicate STAGING_RSP
 * answers and every region field out of range, a ring key the decode never
 * registered, fused gather/scatter copies (and one refused part way),
 * fabrics with a write size limit (pieces, a failed piece, a chunk refused
 * at planning), and prefill context parallelism end to end, every byte.
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

/* ---- a failed RDMA write on the staging path -------------------------------- */

static void test_prefill_staging_write_error(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);

    /* Only the first chunk is computed: neither prefill can finish the room
     * before the failure of p0's first write reaches it. */
    sim_nic_fail_next_writes(edge_prefill(cl, 0)->nic, 1);
    edge_open(cl, 1, 0, 40);
    edge_computed(cl, 1, 16, false);
    edge_run(cl);
    edge_expect_all(cl, 1, KVS_EREMOTE);
    edge_expect_ring_empty(cl);
    assert_int_equal(edge_stats(edge_decode(cl, 0)).copies, 0);

    /* The handlers (and p0's staging buffer) survive: the next room is fine. */
    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);

    /* A one-chunk room computed at once, p1's write fails: p0 wrote its
     * slice and reported before it heard of the failure, so p0 ends the room
     * ok (its part is done); the decode and p1 end it failed. */
    sim_nic_fail_next_writes(edge_prefill(cl, 1)->nic, 1);
    edge_transfer(cl, 3, 0, 8);
    edge_expect(edge_decode(cl, 0), 3, KVS_EREMOTE);
    edge_expect(edge_prefill(cl, 0), 3, KVS_OK);
    edge_expect(edge_prefill(cl, 1), 3, KVS_EREMOTE);
    edge_expect_ring_empty(cl);
    edge_transfer(cl, 4, 4, 36);
    edge_expect_ok(cl, 4, 4, 36);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* spec §9 "first error frees blocks while sibling writes are still
 * landing": on a slow link p1's writes are still in flight when the failure
 * of p0's write reaches it; the decode must not free the regions until p1's
 * writes completed. Watched: the decode's ring after it reported the room. */
static void test_prefill_staging_write_error_slow_sibling(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.net.link_bytes_per_s = 50000000; /* 50 MB/s: a 4 KiB slice takes 82 us */
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    uint64_t ring_addr = 0, ring_len = 0;
    assert_int_equal(kvs_manager_staging_buffer(d->m, 0, &ring_addr, &ring_len, NULL), KVS_OK);
    edge_snap_t snap = {.room = 1, .node = d, .mem = sim_gpu_host(d->gpu, ring_addr, ring_len),
                        .len = (size_t)ring_len, .copy = malloc((size_t)ring_len)};
    assert_non_null(snap.mem);
    assert_non_null(snap.copy);
    cl->on_result = edge_snap_on_result;
    cl->on_result_ctx = &snap;

    sim_nic_fail_next_writes(edge_prefill(cl, 0)->nic, 1);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_all(cl, 1, KVS_EREMOTE);
    edge_expect_ring_empty(cl);
    edge_expect_decode_last(cl, 1);
    const size_t changed = edge_snap_changed(&snap);
    if (changed != 0)
        EDGE_FAIL("%zu ring bytes were written after the decode ended room 1 and freed its "
                  "regions", changed);
    cl->on_result = NULL;
    free(snap.copy);

    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* More gathers finish than writes may be in flight (max_inflight_writes
 * below the staging buffers): the extra chunks wait, they do not fail. */
static void test_prefill_staging_inflight_write_bound(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.max_inflight_writes = 1;
    o.transfer_workers = 3;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_transfer(cl, 1, 0, 48);
    edge_expect_ok(cl, 1, 0, 48);
    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* ---- forged answers of a registered decode -------------------------------------- */

static void test_prefill_staging_forged_staging_rsp(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    edge_node_t *p0 = edge_prefill(cl, 0);
    kvs_fabric_t *dfab = sim_nic_fabric(d->nic);
    kvs_conn_t *dc = edge_conn(dfab, "p0");
    kvs_fabric_t *p0fab = sim_nic_fabric(p0->nic);
    kvs_conn_t *pc = edge_conn(p0fab, "d0");

    /* A region outside the ring, answered before the real answer arrives:
     * p0 must not write there; the room fails with ERANGE everywhere. */
    const uint64_t t0 = sim_engine_now_ns(cl->eng);
    edge_open(cl, 1, 0, 40);
    edge_computed(cl, 1, 40, true);
    sim_engine_run(cl->eng, t0 + 25000, 0); /* p0 has sent its requests */
    kvs_msg_t m = {.type = KVS_MSG_STAGING_RSP};
    m.session = EDGE_DECODE_SESSION;
    m.u.rsp = (kvs_msg_staging_rsp_t){.room = 1, .chunk = 0,
                                      .offset = o.ring_bytes, .end = o.ring_bytes + 8192};
    edge_send(cl, dfab, dc, &m);
    edge_run(cl);
    edge_expect_all(cl, 1, KVS_ERANGE);
    edge_expect_ring_empty(cl);
    /* The forged answer, then the three real ones: p0 had already ended
     * the room (nothing in flight) when they came. */
    assert_int_equal(edge_stats(p0).msgs_rejected, 1 + 3);
    assert_int_equal(edge_stats(p0).rdma_writes, 0);

    /* Once a chunk has its region, another answer is dropped and the same
     * answer again is harmless. A second CHUNK_READY of a writer is a
     * duplicate. A refusal after the acceptance is stale. */
    edge_open(cl, 2, 0, 40);
    edge_computed_on(cl, 0, 2, 16, false);
    edge_run(cl);
    const uint64_t rejected = edge_stats(p0).msgs_rejected;
    m.session = EDGE_DECODE_SESSION;
    m.u.rsp = (kvs_msg_staging_rsp_t){.room = 2, .chunk = 2,
                                      .offset = 0, .end = 4096};
    edge_send(cl, dfab, dc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_CHUNK_READY};
    m.session = EDGE_PREFILL_SESSION;
    m.u.ready = (kvs_msg_chunk_ready_t){.room = 2, .chunk = 0,
                                        .page_start = 0, .pages = 4};
    edge_send(cl, p0fab, pc, &m);
    m = (kvs_msg_t){.type = KVS_MSG_REGISTER_ACK};
    m.u.ack = (kvs_msg_register_ack_t){.echo = EDGE_DECODE_SESSION,
                                       .status = KVS_EFINGERPRINT};
    edge_send(cl, p0fab, pc, &m);
    const uint64_t d_rejected = edge_stats(d).msgs_rejected;
    edge_run(cl);
    assert_int_equal(edge_stats(p0).msgs_rejected, rejected + 1);
    assert_int_equal(edge_stats(d).msgs_rejected, d_rejected + 2);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 2);
    edge_computed(cl, 2, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    edge_transfer(cl, 3, 0, 8);
    edge_expect_ok(cl, 3, 0, 8);
    edge_destroy(cl);
}

/* ---- every remote field out of range, one at a time ----------------------------
 * A remote offset, length, key, chunk index, room id or writer id that lies
 * outside what it addresses is rejected and counted (msgs_rejected), never
 * used to address memory: nothing is written where it points, and the
 * handlers move the next room with every byte right. */

/* STAGING_RSP regions that lie about their length, wrap the address space or
 * end past the ring (chunk 0's region is the first answer p0 gets): p0 posts
 * no write, the room fails with ERANGE on every rank, and the lie is counted
 * with the three real answers that find the room gone. */
static void test_prefill_staging_hostile_rsp_region(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *p0 = edge_prefill(cl, 0);
    kvs_fabric_t *dfab = sim_nic_fabric(edge_decode(cl, 0)->nic);
    kvs_conn_t *dc = edge_conn(dfab, "p0");
    const uint64_t full = (uint64_t)edge_region_bytes(cl, 16);
    const struct {
        const char *lie;
        uint64_t offset, end;
    } c[] = {
        {"end is not offset + length", 0, full / 2},
        {"offset + length wraps", UINT64_MAX - full / 2 + 1, full / 2},
        {"region ends past the ring", o.ring_bytes - full / 2, o.ring_bytes + full / 2},
        {"region starts past the ring", 2 * o.ring_bytes, 2 * o.ring_bytes + full},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const uint64_t room = 10 + i;
        const kvs_handler_stats_t before = edge_stats(p0);
        const uint64_t t0 = sim_engine_now_ns(cl->eng);
        edge_open(cl, room, 0, 40);
        edge_computed(cl, room, 40, true);
        sim_engine_run(cl->eng, t0 + 25000, 0); /* p0 has sent its requests */
        kvs_msg_t m = {.type = KVS_MSG_STAGING_RSP};
        m.session = EDGE_DECODE_SESSION;
        m.u.rsp = (kvs_msg_staging_rsp_t){.room = room,
                                          .chunk = 0, .offset = c[i].offset,
                                          .end = c[i].end};
        edge_send(cl, dfab, dc, &m);
        edge_run(cl);
        for (int n = 0; n < edge_nnodes(cl); n++) {
            const kvs_room_result_t *r = edge_result(&cl->nodes[n], room);
            if (r == NULL || r->status != KVS_ERANGE)
                EDGE_FAIL("%s: %s: room %llu ended %s, expected KVS_ERANGE", c[i].lie,
                          cl->nodes[n].name, (unsigned long long)room,
                          r == NULL ? "never" : kvs_status_name(r->status));
        }
        const kvs_handler_stats_t after = edge_stats(p0);
        if (after.rdma_writes != before.rdma_writes)
            EDGE_FAIL("%s: p0 posted %llu writes", c[i].lie,
                      (unsigned long long)(after.rdma_writes - before.rdma_writes));
        assert_int_equal(after.msgs_rejected - before.msgs_rejected, 1 + 3);
        edge_expect_ring_empty(cl);
    }
    edge_transfer(cl, 20, 0, 40);
    edge_expect_ok(cl, 20, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* ---- fused copies ------------------------------------------------------------- */

/* A counting shim over a sim GPU's bound gather_parts / scatter_parts (the
 * filled ops copy in kvs_device_t): how many fused ops the core asked for,
 * with how many parts, then the GPU's own op. One device at a time. */
typedef struct edge_parts_shim {
    kvs_device_t *dev;
    int (*gather_parts)(kvs_device_t *, kvs_stream_t *, const kvs_copy_desc_t *,
                        const kvs_copy_part_t *, int64_t);
    int (*scatter_parts)(kvs_device_t *, kvs_stream_t *, const kvs_copy_desc_t *,
                         const kvs_copy_part_t *, int64_t);
    uint64_t ops, parts, most_parts;
    int refuse_part_way; /* > 0: the next that many ops enqueue their first
                            part only, then fail (a default copy refused
                            at its second part) */
} edge_parts_shim_t;

static edge_parts_shim_t edge_shim; /* test-local: the shim's callbacks get only dev */

static void edge_shim_count(kvs_device_t *dev, int64_t nparts)
{
    assert_ptr_equal(dev, edge_shim.dev);
    edge_shim.ops++;
    edge_shim.parts += (uint64_t)nparts;
    if ((uint64_t)nparts > edge_shim.most_parts)
        edge_shim.most_parts = (uint64_t)nparts;
}

/* The shim's op: the device's, or its first part only and a failure. */
static int edge_shim_run(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                         const kvs_copy_part_t *parts, int64_t nparts, bool scatter)
{
    edge_shim_count(dev, nparts);
    int (*op)(kvs_device_t *, kvs_stream_t *, const kvs_copy_desc_t *,
              const kvs_copy_part_t *, int64_t) =
        scatter ? edge_shim.scatter_parts : edge_shim.gather_parts;
    if (edge_shim.refuse_part_way == 0 || nparts < 2)
        return op(dev, s, d, parts, nparts);
    edge_shim.refuse_part_way--;
    assert_int_equal(op(dev, s, d, parts, 1), KVS_OK);
    return kvs_device_fail(dev, KVS_EBACKEND, 0, "edge shim: part 1 refused");
}

static int edge_shim_gather(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                            const kvs_copy_part_t *parts, int64_t nparts)
{
    return edge_shim_run(dev, s, d, parts, nparts, false);
}

static int edge_shim_scatter(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                             const kvs_copy_part_t *parts, int64_t nparts)
{
    return edge_shim_run(dev, s, d, parts, nparts, true);
}

static void edge_shim_install(kvs_device_t *dev)
{
    edge_shim = (edge_parts_shim_t){.dev = dev, .gather_parts = dev->ops.gather_parts,
                                    .scatter_parts = dev->ops.scatter_parts};
    dev->ops.gather_parts = edge_shim_gather;
    dev->ops.scatter_parts = edge_shim_scatter;
}

/* The shim saw `ops` fused ops of `parts` parts in all, at most `most` in
 * one; `what` names them in the failure. */
static void edge_shim_expect(const char *what, uint64_t ops, uint64_t parts, uint64_t most)
{
    if (edge_shim.ops != ops || edge_shim.parts != parts || edge_shim.most_parts != most)
        EDGE_FAIL("%s: %llu ops of %llu parts (most %llu), want %llu ops of %llu parts "
                  "(most %llu)",
                  what, (unsigned long long)edge_shim.ops, (unsigned long long)edge_shim.parts,
                  (unsigned long long)edge_shim.most_parts, (unsigned long long)ops,
                  (unsigned long long)parts, (unsigned long long)most);
}

/* Fused copies. Prefill TP 1 -> decode TP 2: the prefill rank feeds both
 * decode ranks (two heads each of its four) and gathers a chunk for every
 * decode rank whose region is ready in one op, reading its pool once. The
 * regions are asked for at room open; once they are in, the KV is computed
 * (as chunked prefill runs) and every chunk goes in one op of two parts.
 * Prefill TP 2 -> decode TP 1: the decode rank
 * scatters a chunk's two writers' blocks in one op of two parts, each token
 * row written once. Every byte is checked either way. 40 tokens: chunks of
 * 16, 16 and 8. */
static void test_prefill_staging_fused_copies(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.prefill_tp = 1;
    o.decode_tp = 2;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_shim_install(sim_gpu_device(edge_prefill(cl, 0)->gpu));
    edge_open(cl, 1, 0, 40);
    edge_run(cl); /* both decode ranks assign the three regions */
    assert_int_equal(edge_shim.ops, 0);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);
    edge_shim_expect("P1->D2 gathers", 3, 6, 2);
    assert_int_equal(edge_stats(edge_prefill(cl, 0)).copies, 6);
    edge_destroy(cl);

    o = edge_defaults(); /* prefill TP 2 -> decode TP 1 */
    cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_shim_install(sim_gpu_device(edge_decode(cl, 0)->gpu));
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);
    edge_shim_expect("P2->D1 scatters", 3, 6, 2);
    assert_int_equal(edge_stats(edge_decode(cl, 0)).copies, 3);
    edge_destroy(cl);
}

/* A fused copy refused part-way, its first part already enqueued (the
 * core's default copy on a backend without fused ops does that). Only its
 * room fails: on the decode (the prefill ranks had written everything and
 * end it ok) or, for a gather, on every rank; the buffers it was copying into (prefill) or
 * from (the decode's region) stay held until the enqueued part ran, and are
 * then released: the ring ends empty and the next room moves every byte. */
static void test_prefill_staging_fused_copy_refused_part_way(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults(); /* P2 -> D1: the decode scatters 2 parts */
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    edge_shim_install(sim_gpu_device(d->gpu));
    /* Watched: the decode's KV pool after it ended room 1. A part left
     * running after the room ended would still write room 1's pages, which
     * the caller may have handed to another request by then. */
    edge_snap_t snap = {.room = 1, .node = d, .mem = d->pool_host, .len = d->pool_bytes,
                        .copy = malloc(d->pool_bytes)};
    assert_non_null(snap.copy);
    cl->on_result = edge_snap_on_result;
    cl->on_result_ctx = &snap;
    edge_shim.refuse_part_way = 1;
    sim_gpu_set_scatter_slowdown(d->gpu, 10000); /* the part runs past the reports */
    edge_transfer(cl, 1, 0, 40);
    sim_gpu_set_scatter_slowdown(d->gpu, 1);
    edge_expect(d, 1, KVS_EBACKEND);
    for (int i = 0; i < cl->nprefill; i++)
        edge_expect(edge_prefill(cl, i), 1, KVS_OK);
    edge_expect_ring_empty(cl);
    const size_t changed = edge_snap_changed(&snap);
    if (changed != 0)
        EDGE_FAIL("%zu bytes of the decode's pool were written after it ended room 1", changed);
    cl->on_result = NULL;
    free(snap.copy);
    assert_int_equal(edge_shim.refuse_part_way, 0);
    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);

    o = edge_defaults(); /* P1 -> D2: the prefill gathers 2 parts */
    o.prefill_tp = 1;
    o.decode_tp = 2;
    cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_shim_install(sim_gpu_device(edge_prefill(cl, 0)->gpu));
    edge_shim.refuse_part_way = 1;
    edge_open(cl, 1, 0, 40);
    edge_run(cl);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_all(cl, 1, KVS_EBACKEND);
    edge_expect_ring_empty(cl);
    assert_int_equal(edge_shim.refuse_part_way, 0);
    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* A remote key the decode never registered: a REGISTER of decode rank 0
 * (its session, its connection) that names another ring key. The prefill
 * cannot check a key, the fabric does: p0's writes to d0 fail (EREMOTE),
 * not one byte of d0's ring changes, the room fails and its regions go
 * back. The ring's own key, named the same way (a REGISTER that says the
 * keys are not scoped), opens nothing either: the ring is sealed. With the
 * decode's real registration again (scoped) the next room moves. Prefill
 * TP 1 -> decode TP 2, so p0 is the only writer of d0's ring. */
static void test_prefill_staging_hostile_ring_key(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.prefill_tp = 1;
    o.decode_tp = 2;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    kvs_fabric_t *dfab = sim_nic_fabric(d->nic);
    kvs_conn_t *dc = edge_conn(dfab, "p0");
    kvs_msg_t reg = edge_register_msg(cl);
    reg.session = EDGE_DECODE_SESSION;
    const uint64_t real_key = reg.u.reg.ring_rkey;
    const uint8_t *ring = sim_gpu_host(d->gpu, reg.u.reg.ring_addr, reg.u.reg.ring_bytes);
    assert_non_null(ring);
    uint8_t *copy = malloc((size_t)reg.u.reg.ring_bytes);
    assert_non_null(copy);
    const uint64_t keys[] = {real_key ^ 0x5a5au, real_key};
    for (uint64_t room = 1; room <= 2; room++) {
        reg.u.reg.ring_rkey = keys[room - 1];
        reg.u.reg.scoped_keys = 0;
        edge_send(cl, dfab, dc, &reg);
        edge_run(cl);
        edge_assert_registered(cl);
        memcpy(copy, ring, (size_t)reg.u.reg.ring_bytes);
        edge_transfer(cl, room, 0, 40);
        edge_expect(d, room, KVS_EREMOTE);
        edge_expect(edge_prefill(cl, 0), room, KVS_EREMOTE);
        edge_expect_ring_empty(cl);
        if (memcmp(copy, ring, (size_t)reg.u.reg.ring_bytes) != 0)
            EDGE_FAIL("a write under %s changed the decode's ring",
                      room == 1 ? "a key it never registered" : "its sealed ring's own key");
    }
    free(copy);
    assert_int_equal(edge_stats(d).copies, 0);

    reg.u.reg.ring_rkey = 0;
    reg.u.reg.scoped_keys = 1;
    edge_send(cl, dfab, dc, &reg);
    edge_run(cl);
    edge_transfer(cl, 3, 0, 40);
    edge_expect_ok(cl, 3, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* More answers of a registered decode to a chunk that has its region (a
 * fresh ring: chunk 0 of room 1 is offset 0, round 0, end 8 KiB): the same
 * answer again (the decode's own, to a STAGING_REQ sent again) is
 * harmless; one with the right region but other keys (the decode scopes
 * them: a forger's, or another writer's), one that differs in round or
 * end, and one for chunk -1 are counted. An ABORT without a status fails
 * the room with EPEER. */
static void test_prefill_staging_hostile_rsp_duplicates(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *p0 = edge_prefill(cl, 0);
    kvs_fabric_t *dfab = sim_nic_fabric(edge_decode(cl, 0)->nic);
    kvs_conn_t *dc = edge_conn(dfab, "p0");
    const uint64_t full = (uint64_t)edge_region_bytes(cl, 16);
    edge_open(cl, 1, 0, 40);
    edge_run(cl); /* every chunk has its region; nothing is computed */
    const kvs_handler_stats_t before = edge_stats(p0);
    const kvs_handler_stats_t d_before = edge_stats(edge_decode(cl, 0));
    const kvs_msg_staging_rsp_t real = {.room = 1, .chunk = 0, .offset = 0, .round = 0,
                                        .end = full};
    kvs_msg_staging_rsp_t a[] = {real, real, real, real};
    a[1].round = 1;
    a[2].end = full / 2;
    a[3].chunk = -1;
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        kvs_msg_t m = {.type = KVS_MSG_STAGING_RSP, .session = EDGE_DECODE_SESSION};
        m.u.rsp = a[i];
        edge_send(cl, dfab, dc, &m);
    }
    kvs_fabric_t *pfab = sim_nic_fabric(p0->nic);
    kvs_msg_t again = {.type = KVS_MSG_STAGING_REQ, .session = EDGE_PREFILL_SESSION};
    again.u.req = (kvs_msg_staging_req_t){.room = 1, .chunk = 0, .pages = 4, .tokens = 16,
                                          .writer = 0, .stage = 0};
    edge_send(cl, pfab, edge_conn(pfab, "d0"), &again);
    edge_run(cl);
    assert_int_equal(edge_stats(p0).msgs_rejected - before.msgs_rejected, 4);
    /* the decode answered the request again, with the same keys */
    const kvs_handler_stats_t d_after = edge_stats(edge_decode(cl, 0));
    assert_int_equal(d_after.msgs_rejected, d_before.msgs_rejected);
    assert_int_equal(d_after.keys_granted, d_before.keys_granted);
    assert_int_equal(d_after.msgs_received - d_before.msgs_received, 1);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);

    edge_open(cl, 2, 0, 40);
    kvs_msg_t m = {.type = KVS_MSG_ABORT};
    m.session = EDGE_DECODE_SESSION;
    m.u.abort = (kvs_msg_abort_t){.room = 2, .status = KVS_OK};
    edge_send(cl, dfab, dc, &m);
    edge_computed(cl, 2, 40, true);
    edge_run(cl);
    edge_expect_all(cl, 2, KVS_EPEER);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* ---- fabrics with a write size limit (fabric ops version 6) ------------------ */

/* Every write a prefill NIC posts, as its hook sees it. */
#define EDGE_PIECES_MAX 256
typedef struct edge_pieces {
    int n;
    uint64_t addr[EDGE_PIECES_MAX], len[EDGE_PIECES_MAX];
    int spoil;              /* the write (1-based) whose key is spoiled, 0: none */
    int seen;
} edge_pieces_t;

static bool edge_pieces_hook(void *ctx, const char *nic, const char *peer, uint64_t *remote_addr,
                             uint64_t *rkey, uint64_t len)
{
    edge_pieces_t *w = ctx;
    if (++w->seen == w->spoil)
        *rkey ^= 0x5a5a5a5aull; /* no MR or grant has it: the target NIC refuses */
    if (w->n < EDGE_PIECES_MAX) {
        w->addr[w->n] = *remote_addr;
        w->len[w->n++] = len;
    }
    return false;
}

/* A fabric that takes at most 1000 bytes a write: each prefill rank's
 * 4 KiB block of a full chunk (P2 -> D1: 2 layers x K/V x 16 tokens x 2
 * heads x 16 x 2 bytes) goes as 5 pieces (4 x 1000 + 96), a partial
 * chunk's block as fewer; each piece lands at its place, none overlaps
 * another, together they are the block, and every byte of every room is
 * right (the decode scattered only after the last piece of every writer). */
static void test_prefill_staging_write_pieces(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.net.max_write_bytes = 1000;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_pieces_t seen[2] = {{0}, {0}};
    for (int i = 0; i < 2; i++)
        sim_nic_set_write_hook(edge_prefill(cl, i)->nic, edge_pieces_hook, &seen[i]);
    /* 40 tokens: chunks of 16, 16 and 8 tokens (blocks of 4096, 4096, 2048) */
    const edge_room_t rooms[] = {{1, 0, 40}, {2, 8, 44}};
    edge_transfer_ok(cl, rooms, 2);
    for (int i = 0; i < 2; i++) {
        const kvs_handler_stats_t st = edge_stats(edge_prefill(cl, i));
        /* room 1: 5 + 5 + 3 pieces; room 2 (36 tokens: 16, 16, 4): 5 + 5 + 2 */
        assert_int_equal(st.rdma_writes, 25);
        assert_int_equal(seen[i].n, 25);
        uint64_t bytes = 0;
        for (int a = 0; a < seen[i].n; a++) {
            assert_true(seen[i].len[a] > 0 && seen[i].len[a] <= 1000);
            bytes += seen[i].len[a];
            for (int b = 0; b < a; b++)
                if (seen[i].addr[a] < seen[i].addr[b] + seen[i].len[b] &&
                    seen[i].addr[b] < seen[i].addr[a] + seen[i].len[a] &&
                    (a < 13) == (b < 13)) /* one room's pieces never overlap */
                    EDGE_FAIL("p%d: pieces %d and %d overlap", i, b, a);
        }
        assert_int_equal(bytes, st.rdma_write_bytes);
        assert_int_equal(bytes, (4096 + 4096 + 2048) + (4096 + 4096 + 1024));
    }
    edge_destroy(cl);
}

/* A piece of a writer's block fails (its key spoiled: the target NIC
 * refuses it): the room fails on every rank, cleanly, and the region is
 * freed only after every piece of it completed. On a slow link the other
 * pieces of p0 and p1's block are still in flight when the failure is
 * known; no ring byte may change after the decode ended the room. */
static void test_prefill_staging_write_piece_fails(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.net.max_write_bytes = 1000;
    o.net.link_bytes_per_s = 50000000; /* 50 MB/s: a 1000-byte piece takes 20 us */
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    uint64_t ring_addr = 0, ring_len = 0;
    assert_int_equal(kvs_manager_staging_buffer(d->m, 0, &ring_addr, &ring_len, NULL), KVS_OK);
    edge_snap_t snap = {.room = 1, .node = d, .mem = sim_gpu_host(d->gpu, ring_addr, ring_len),
                        .len = (size_t)ring_len, .copy = malloc((size_t)ring_len)};
    assert_non_null(snap.mem);
    assert_non_null(snap.copy);
    cl->on_result = edge_snap_on_result;
    cl->on_result_ctx = &snap;
    edge_pieces_t seen = {.spoil = 3}; /* the third piece of the first chunk */
    sim_nic_set_write_hook(edge_prefill(cl, 0)->nic, edge_pieces_hook, &seen);

    edge_transfer(cl, 1, 0, 40);
    edge_expect_all(cl, 1, KVS_EREMOTE);
    edge_expect_ring_empty(cl);
    edge_expect_decode_last(cl, 1);
    assert_true(seen.seen >= 5); /* the pieces after the spoiled one went out too */
    const size_t changed = edge_snap_changed(&snap);
    if (changed != 0)
        EDGE_FAIL("%zu ring bytes were written after the decode ended room 1 and freed its "
                  "regions", changed);
    cl->on_result = NULL;
    free(snap.copy);

    /* The handlers and the staging buffers survive: the next room is whole. */
    seen.spoil = 0;
    edge_transfer(cl, 2, 0, 40);
    edge_expect_ok(cl, 2, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* A full chunk whose pieces could never all hold a write slot is refused
 * when the prefill rank plans the pair (its handler's creation here, a
 * decode instance's registration otherwise), before any room opens, with a
 * message that names the limit and the knobs; at the bound it runs. */
static void test_prefill_staging_write_pieces_refused(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.no_handlers = true;
    o.max_inflight_writes = 8;
    o.net.max_write_bytes = 500; /* 4096 bytes: 9 pieces, one slot short */
    edge_cluster_t *cl = edge_create(&o);
    for (int i = 0; i < cl->nprefill; i++) {
        edge_node_t *n = edge_prefill(cl, i);
        kvs_rank_t *rank = NULL;
        assert_int_equal(kvs_rank_create_on(n->m, &rank), KVS_ERANGE);
        assert_null(rank);
        const char *msg = kvs_manager_last_error(n->m)->msg;
        if (strstr(msg, "9 writes of at most 500 bytes") == NULL ||
            strstr(msg, "max_write_bytes") == NULL ||
            strstr(msg, "max_inflight_writes 8: raise max_inflight_writes to 9") == NULL ||
            strstr(msg, "lower chunk_tokens") == NULL)
            EDGE_FAIL("%s: the refusal does not name the limit and the knobs: %s", n->name,
                      msg);
    }
    edge_destroy(cl);

    o = edge_defaults();
    o.max_inflight_writes = 8;
    o.net.max_write_bytes = 512; /* 8 pieces: fits */
    cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_expect_ring_empty(cl);
    assert_int_equal(edge_stats(edge_prefill(cl, 0)).rdma_writes, 8 + 8 + 4);
    edge_destroy(cl);

    /* The direct path cuts page runs at a token: a token's row must fit. */
    o = edge_defaults();
    o.prefill_tp = 1;
    o.staging = false;
    o.no_handlers = true;
    o.net.max_write_bytes = 100; /* a token of 4 heads x 16 x 2 bytes is 128 */
    cl = edge_create(&o);
    kvs_rank_t *rank = NULL;
    assert_int_equal(kvs_rank_create_on(edge_prefill(cl, 0)->m, &rank), KVS_ERANGE);
    assert_non_null(strstr(kvs_manager_last_error(edge_prefill(cl, 0)->m)->msg,
                           "more than one write of fabric"));
    edge_destroy(cl);
    o.no_handlers = false;
    o.net.max_write_bytes = 300; /* runs of 2 tokens */
    cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    edge_destroy(cl);
}

/* Prefill context parallelism end to end on the staging path: instance 1
 * of TP ptp x CP cp into the decode ranks. Each CP rank's pool holds its
 * own range's tokens only (the rest of its pages zero), so a rank that
 * gathered another range's rows, or wrote its part at another offset,
 * leaves wrong bytes on the decode; every byte of every decode rank is
 * checked. Chunks straddle the ranges (16-token chunks, ranges of 20 or
 * 36 tokens), a cached prefix leaves CP rank 0 a part of one chunk only,
 * and the last CP rank of a short prompt holds nothing. Every prefill
 * rank gives the room's aux payload, as the API asks: each decode rank
 * must hear it once, from CP rank 0. */
static void cp_staging_case_of(int64_t ptp, int64_t dtp, int64_t cp, int64_t base,
                               int64_t total, uint64_t ring_bytes, bool mla)
{
    edge_opts_t o = edge_defaults();
    o.mla = mla;
    if (ring_bytes > 0)
        o.ring_bytes = ring_bytes;
    o.prefill_tp = 1; /* the default instance, unused here */
    o.decode_tp = dtp;
    o.path = KVS_PATH_STAGING;
    o.instances = 2;
    o.inst_tp[1] = ptp;
    o.inst_cp[1] = cp;
    o.max_aux_bytes = 64;
    edge_cluster_t *cl = edge_create(&o);
    const uint64_t room = 5;
    const char aux[] = "cp-aux";
    edge_cp_transfer(cl, 1, room, base, total, aux, sizeof aux);
    char what[64];
    snprintf(what, sizeof what, "staging%s P%lld CP%lld -> D%lld", mla ? " MLA" : "",
             (long long)ptp, (long long)cp, (long long)dtp);
    edge_cp_expect_ok(cl, 1, room, base, total, aux, sizeof aux, what);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

static void cp_staging_case(int64_t ptp, int64_t dtp, int64_t cp, int64_t base, int64_t total,
                            uint64_t ring_bytes)
{
    cp_staging_case_of(ptp, dtp, cp, base, total, ring_bytes, false);
}

static void test_prefill_staging_cp_staging_every_byte(void **state)
{
    (void)state;
    cp_staging_case(2, 1, 2, 0, 40, 0);  /* ranges [0,20) [20,40) */
    cp_staging_case(2, 2, 2, 0, 72, 0);  /* ranges [0,36) [36,72) */
    cp_staging_case(2, 1, 2, 16, 40, 0); /* a cached prefix */
    cp_staging_case(4, 2, 2, 0, 40, 0);
    cp_staging_case(1, 1, 4, 0, 10, 0);  /* short: [0,4) [4,8) [8,10), CP rank 3 nothing */
    /* Rings of two full regions (8 KiB each) and of one, for five chunks:
     * CP rank 1 asks for the later chunks while rank 0 still writes the
     * first, and every region is reused; no wait may form a cycle. */
    cp_staging_case(2, 1, 2, 0, 72, 16u << 10);
    cp_staging_case(2, 1, 2, 0, 72, 8u << 10);
    /* MLA (docs/kinds/mla.md): one writer per decode rank, the latent
     * source of that rank in each CP rank's TP group; the other sources
     * only report. */
    cp_staging_case_of(4, 2, 2, 0, 40, 0, true);
    cp_staging_case_of(4, 2, 2, 16, 72, 0, true);
    cp_staging_case_of(2, 1, 4, 0, 10, 0, true); /* CP rank 3 nothing */
}

int main(void)
{
    print_message("test_prefill_staging: seed %llu\n", (unsigned long long)EDGE_SEED);
    /* KVS_EDGE_TEST=<glob> runs only the matching tests (replay one). */
    if (getenv("KVS_EDGE_TEST") != NULL)
        cmocka_set_test_filter(getenv("KVS_EDGE_TEST"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_staging_write_error),
        cmocka_unit_test(test_prefill_staging_write_error_slow_sibling),
        cmocka_unit_test(test_prefill_staging_cp_staging_every_byte),
        cmocka_unit_test(test_prefill_staging_inflight_write_bound),
        cmocka_unit_test(test_prefill_staging_forged_staging_rsp),
        cmocka_unit_test(test_prefill_staging_write_pieces),
        cmocka_unit_test(test_prefill_staging_write_piece_fails),
        cmocka_unit_test(test_prefill_staging_write_pieces_refused),
        cmocka_unit_test(test_prefill_staging_hostile_rsp_region),
        cmocka_unit_test(test_prefill_staging_fused_copies),
        cmocka_unit_test(test_prefill_staging_fused_copy_refused_part_way),
        cmocka_unit_test(test_prefill_staging_hostile_ring_key),
        cmocka_unit_test(test_prefill_staging_hostile_rsp_duplicates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
