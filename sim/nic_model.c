/*
 * nic_model.c - the simulator's NIC and wire model under fabric.c's ops
 * table (nic_model.h): the pools of writes, messages and event records,
 * each NIC's completion queue, its TX and RX ports, how a write's segments
 * cross the wire and land (checked against the target's MRs and grants),
 * and how control messages are delivered, all on the engine's virtual
 * clock. It calls nothing of the ops table above it.
 *
 * Default numbers and where they come from:
 * - link_bytes_per_s 50e9: a 400 Gb/s RoCE/IB NIC is 50 GB/s line rate
 *   (spec §11). With the per-packet headers below a large write carries
 *   4096 / (4096 + 58) = 98.6% payload, 49.3 GB/s, close to the ~48.5 GB/s
 *   peak of ib_write_bw quoted there.
 * - per_op_ns 3700: spec §11 "64 KB blocks reach ~26% of peak on one
 *   engine". 64 KiB at 50 GB/s is 1.31 us on the wire (1.33 us with
 *   headers); 26% efficiency means ~5.0 us per block, so ~3.7 us of
 *   per-operation cost (descriptor fetch, doorbell, WQE processing).
 *   4096 x 4 KiB writes then run at ~1.1 GB/s against ~49 GB/s for one
 *   large write.
 * - latency_ns 2000: one-way RoCE latency through one switch, typical.
 * - mtu_bytes 4096, header_bytes 58: RoCEv2 per packet = Ethernet 14 +
 *   IPv4 20 + UDP 8 + BTH 12 + ICRC 4 (the RETH of the first packet and
 *   the Ethernet FCS/preamble are left out).
 * - segment_bytes 1 MiB: scheduling granularity only (how finely concurrent
 *   writes interleave), not a wire quantity.
 * - ctrl_latency_ns 20000: a TCP/ZMQ side channel for control messages.
 *
 * The model, per write (an event per step, all on the engine clock):
 * 1. write() (fabric.c) validates the local side (connection, local MR, range) and
 *    queues the write on the sender's TX port. Nothing is queued on error.
 * 2. TX is one FIFO server shared round-robin by the NIC's active writes:
 *    each service turn sends ONE segment (segment_bytes or the rest); a
 *    write's first turn also costs per_op_ns. A segment's wire time is
 *    ceil((bytes + packets * header_bytes) * 1e9 / link_bytes_per_s) with
 *    packets = ceil(bytes / mtu_bytes).
 * 3. A segment that left TX at t has fully arrived at the receiver at
 *    t + latency_ns if the receiver's RX port was free (cut-through: an idle
 *    RX port adds no second wire time); the RX port is a FIFO server, so it
 *    lands at max(t + latency_ns, rx_busy_until + wire time). That is incast:
 *    two senders into one receiver share its RX bandwidth.
 * 4. When a segment lands the target MR is checked (rkey registered on the
 *    target NIC, range inside it). The first failing segment fails the whole
 *    write with KVS_EREMOTE: no further bytes of it land, the target gets
 *    nothing, the sender's WRITE completion comes latency_ns later (the
 *    NAK). A key that is no MR's may be a grant's (key_grant): then the
 *    grant must be live, bound to the connection the write came on, and
 *    hold the WHOLE write, checked at every segment, so a write that
 *    reaches outside its grant changes no byte and one landing after the
 *    revoke stops there. Otherwise the bytes are copied from the sender GPU's memory AT
 *    LAND TIME: the source must stay unchanged until the write completes,
 *    which is the RDMA contract the core must honour anyway.
 * 5. When the last segment lands the target gets an IMM completion (if
 *    with_imm) and the sender a WRITE completion latency_ns later (the ack).
 * A write that has failed sends no more segments (the simulator does not
 * make the sender wait for the NAK before it stops).
 *
 * Control messages are copied at send() into a per-net pool and delivered
 * ctrl_latency_ns later as a RECV at the peer; the engine runs equal times in
 * scheduling order, so messages of one connection arrive in order. The
 * sender's SEND completion is pushed at the same moment (delivery time),
 * even when the message was dropped.
 *
 * Lifetime: NICs are malloc'ed and freed by sim_nic_destroy; the net keeps a
 * generation per NIC slot, and everything in flight (writes, messages, event
 * records) names NICs by (slot, generation) and connections by (pointer,
 * generation), looked up again when an event runs, so an event of a
 * destroyed NIC never touches freed memory. Every event the fabric schedules
 * has a record in a per-net pool; sim_net_destroy cancels the live ones, so
 * destroy the net before the engine.
 *
 * Faults: a NIC whose link is down drops segments and messages leaving or
 * arriving at it; a write that loses a segment completes with KVS_EPEER
 * 2 * latency_ns after the segment left its sender. fail_next_writes makes
 * the next writes posted fail with KVS_EREMOTE when their first segment
 * lands. A completion queue overrun (or an allocation failure inside an
 * event) is fatal for the NIC, as a CQ overrun is in RDMA: from then on
 * poll, write and send return the error.
 */
#include "nic_model.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void sim_net_on_event(sim_engine_t *eng, void *ctx, uint64_t arg);

/* Wire time of one segment, rounded up to a whole ns. */
static uint64_t sim_net_wire_ns(const sim_net_t *net, uint64_t bytes)
{
    const uint64_t mtu = net->cfg.mtu_bytes;
    const uint64_t packets = bytes / mtu + (bytes % mtu != 0);
    const unsigned __int128 wire =
        (unsigned __int128)bytes + (unsigned __int128)packets * net->cfg.header_bytes;
    const unsigned __int128 rate = net->cfg.link_bytes_per_s;
    const unsigned __int128 ns = (wire * 1000000000u + rate - 1) / rate;
    return ns > UINT64_MAX ? UINT64_MAX : (uint64_t)ns;
}

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static void sim_nic_set_fatal(sim_nic_t *nic, int status, const char *fmt, ...)
{
    if (nic->fatal != KVS_OK)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nic->fatal_msg, sizeof nic->fatal_msg, fmt, ap);
    va_end(ap);
    nic->fatal = status;
    kvs_fabric_fail(&nic->base, status, 0, "%s", nic->fatal_msg);
}

/* ------------------------------------------------------------------------ */
/* Pools: event records, writes, messages (indices stay valid on growth)     */
/* ------------------------------------------------------------------------ */

/* Doubles *arr (of *cap entries) up to max entries; new entries zeroed. */
static int sim_pool_grow(void **arr, uint32_t *cap, size_t elem_bytes, uint32_t max)
{
    if (*cap >= max)
        return KVS_EFULL;
    uint32_t ncap = *cap == 0 ? SIM_NET_POOL_INITIAL : *cap * 2;
    if (ncap > max)
        ncap = max;
    void *p = realloc(*arr, (size_t)ncap * elem_bytes);
    if (p == NULL)
        return KVS_ENOMEM;
    memset((char *)p + (size_t)*cap * elem_bytes, 0, (size_t)(ncap - *cap) * elem_bytes);
    *arr = p;
    *cap = ncap;
    return KVS_OK;
}

static int sim_rec_alloc(sim_net_t *net, uint32_t *out)
{
    if (net->recs_free == SIM_NIL) {
        uint32_t old = net->recs_cap;
        int rc = sim_pool_grow((void **)&net->recs, &net->recs_cap, sizeof *net->recs,
                               SIM_NET_RECS_MAX);
        if (rc != KVS_OK)
            return rc;
        for (uint32_t i = net->recs_cap; i-- > old;) {
            net->recs[i].next = net->recs_free;
            net->recs_free = i;
        }
    }
    *out = net->recs_free;
    net->recs_free = net->recs[*out].next;
    return KVS_OK;
}

void sim_rec_free(sim_net_t *net, uint32_t r)
{
    assert(r < net->recs_cap && net->recs[r].kind != REC_FREE);
    net->recs[r].kind = REC_FREE;
    net->recs[r].next = net->recs_free;
    net->recs_free = r;
}

int sim_wr_alloc(sim_net_t *net, uint32_t *out)
{
    if (net->wrs_free == SIM_NIL) {
        uint32_t old = net->wrs_cap;
        int rc = sim_pool_grow((void **)&net->wrs, &net->wrs_cap, sizeof *net->wrs,
                               SIM_NET_WRS_MAX);
        if (rc != KVS_OK)
            return rc;
        for (uint32_t i = net->wrs_cap; i-- > old;) {
            net->wrs[i].next = net->wrs_free;
            net->wrs_free = i;
        }
    }
    uint32_t w = net->wrs_free;
    net->wrs_free = net->wrs[w].next;
    memset(&net->wrs[w], 0, sizeof net->wrs[w]);
    net->wrs[w].in_use = true;
    net->wrs[w].next = SIM_NIL;
    *out = w;
    return KVS_OK;
}

/* Drops one reference; the write is freed with its last. */
void sim_wr_release(sim_net_t *net, uint32_t w)
{
    sim_wr_t *wr = &net->wrs[w];
    assert(w < net->wrs_cap && wr->in_use && wr->refs > 0);
    if (--wr->refs > 0)
        return;
    assert(!wr->in_tx);
    wr->in_use = false;
    wr->next = net->wrs_free;
    net->wrs_free = w;
}


int sim_msg_alloc(sim_net_t *net, uint32_t *out)
{
    /* The last freed first, else the lowest never used. */
    uint32_t m = net->msgs_free;
    if (m != SIM_NIL) {
        net->msgs_free = sim_msg_at(net, m)->next;
    } else {
        if (net->msgs_fresh == net->msgs_cap) {
            if (net->msgs_cap >= SIM_NET_MSGS_MAX)
                return KVS_EFULL;
            sim_msg_t *page = calloc(SIM_NET_MSG_PAGE, sizeof *page);
            if (page == NULL)
                return KVS_ENOMEM;
            net->msg_pages[net->msgs_cap / SIM_NET_MSG_PAGE] = page;
            net->msgs_cap += SIM_NET_MSG_PAGE;
        }
        m = net->msgs_fresh++;
    }
    sim_msg_t *msg = sim_msg_at(net, m);
    msg->in_use = true;
    *out = m;
    return KVS_OK;
}

void sim_msg_free(sim_net_t *net, uint32_t m)
{
    sim_msg_t *msg = sim_msg_at(net, m);
    assert(msg->in_use);
    msg->in_use = false;
    msg->next = net->msgs_free;
    net->msgs_free = m;
}

/* Schedules a fabric event of `kind` at at_ns; *out_rec (may be NULL) gets
 * its record. */
int sim_net_schedule(sim_net_t *net, uint64_t at_ns, uint8_t kind, uint64_t a,
                     uint64_t b, uint64_t c, uint32_t *out_rec)
{
    uint32_t r;
    int rc = sim_rec_alloc(net, &r);
    if (rc != KVS_OK)
        return rc;
    sim_rec_t *rec = &net->recs[r];
    rec->kind = kind;
    rec->a = a;
    rec->b = b;
    rec->c = c;
    rc = sim_engine_at(net->eng, at_ns, sim_net_on_event, net, r, &rec->ev_id);
    if (rc != KVS_OK) {
        sim_rec_free(net, r);
        return rc;
    }
    if (out_rec != NULL)
        *out_rec = r;
    return KVS_OK;
}

/* ------------------------------------------------------------------------ */
/* Completion queue                                                          */
/* ------------------------------------------------------------------------ */

/* Pushes a completion. Returns true when the owner should be woken (the
 * completion was queued, or the NIC just became errored). An overrun is
 * fatal for the NIC; a RECV's message is freed if it was not queued. */
bool sim_nic_push(sim_nic_t *nic, const sim_cqe_t *e)
{
    sim_net_t *net = nic->net;
    const bool was_fatal = nic->fatal != KVS_OK;
    if (!was_fatal && nic->cq_len == nic->cq_cap) {
        if (nic->cq_cap >= net->cfg.cq_entries) {
            sim_nic_set_fatal(nic, KVS_EFULL,
                              "completion queue of NIC %s overran (%u entries): the NIC is "
                              "in error; poll more often or raise cq_entries",
                              nic->name, net->cfg.cq_entries);
        } else {
            uint32_t ncap = nic->cq_cap * 2;
            if (ncap > net->cfg.cq_entries)
                ncap = net->cfg.cq_entries;
            sim_cqe_t *ring = malloc((size_t)ncap * sizeof *ring);
            if (ring == NULL) {
                sim_nic_set_fatal(nic, KVS_ENOMEM,
                                  "NIC %s could not grow its completion queue to %u "
                                  "entries: the NIC is in error",
                                  nic->name, ncap);
            } else {
                for (uint32_t i = 0; i < nic->cq_len; i++)
                    ring[i] = nic->cq[(nic->cq_head + i) % nic->cq_cap];
                free(nic->cq);
                nic->cq = ring;
                nic->cq_cap = ncap;
                nic->cq_head = 0;
            }
        }
    }
    if (nic->fatal != KVS_OK) {
        if (e->kind == KVS_COMPLETION_RECV)
            sim_msg_free(net, e->msg);
        return !was_fatal;
    }
    nic->cq[(nic->cq_head + nic->cq_len) % nic->cq_cap] = *e;
    nic->cq_len++;
    return true;
}

void sim_nic_wake(sim_nic_t *nic)
{
    if (nic != NULL && nic->wake != NULL)
        nic->wake(nic->wake_ctx);
}

/* ------------------------------------------------------------------------ */
/* Writes: TX port, wire, RX port, landing                                   */
/* ------------------------------------------------------------------------ */

static sim_nic_t *sim_wr_src(const sim_net_t *net, const sim_wr_t *w)
{
    return sim_net_nic(net, w->src_slot, w->src_gen);
}

static sim_nic_t *sim_wr_dst(const sim_net_t *net, const sim_wr_t *w)
{
    return sim_net_nic(net, w->dst_slot, w->dst_gen);
}

/* Fails write w (once): no more of it lands; the sender's WRITE completion
 * with `status` comes at at_ns. */
static void sim_wr_fail(sim_net_t *net, uint32_t w, int status, uint64_t at_ns)
{
    sim_wr_t *wr = &net->wrs[w];
    if (wr->failed)
        return;
    wr->failed = true;
    wr->status = status;
    sim_nic_t *src = sim_wr_src(net, wr);
    if (src == NULL)
        return; /* nobody left to tell */
    int rc = sim_net_schedule(net, at_ns, REC_WDONE, w, 0, 0, NULL);
    if (rc != KVS_OK) {
        sim_nic_set_fatal(src, rc, "NIC %s could not schedule a write completion: the NIC "
                                   "is in error", src->name);
        return;
    }
    wr->refs++;
}

/* Starts TX service turns while the port is idle and writes wait. */
void sim_nic_tx_kick(sim_nic_t *nic)
{
    sim_net_t *net = nic->net;
    while (nic->tx_rec == SIM_NIL && nic->tx_head != SIM_NIL) {
        const uint32_t w = nic->tx_head;
        sim_wr_t *wr = &net->wrs[w];
        nic->tx_head = wr->next;
        if (nic->tx_head == SIM_NIL)
            nic->tx_tail = SIM_NIL;
        wr->next = SIM_NIL;
        if (wr->failed) { /* stop sending a failed write */
            wr->in_tx = false;
            sim_wr_release(net, w);
            continue;
        }
        const uint64_t off = wr->sent_bytes;
        uint64_t seg = wr->len_bytes - off;
        if (seg > net->cfg.segment_bytes)
            seg = net->cfg.segment_bytes;
        uint64_t service_ns = sim_net_wire_ns(net, seg);
        if (off == 0)
            service_ns = sim_add_sat(service_ns, net->cfg.per_op_ns);
        uint32_t r;
        int rc = sim_net_schedule(net, sim_add_sat(sim_net_now(net), service_ns), REC_TX, w,
                                  off, seg, &r);
        if (rc != KVS_OK) {
            sim_nic_set_fatal(nic, rc, "NIC %s could not schedule a transmission: the NIC is "
                                       "in error", nic->name);
            wr->failed = true;
            wr->in_tx = false;
            sim_wr_release(net, w);
            continue;
        }
        nic->tx_rec = r;
        wr->sent_bytes += seg;
        wr->refs++; /* the TX event */
        if (wr->sent_bytes < wr->len_bytes) { /* back of the round robin */
            if (nic->tx_tail == SIM_NIL)
                nic->tx_head = w;
            else
                net->wrs[nic->tx_tail].next = w;
            nic->tx_tail = w;
        } else {
            wr->in_tx = false;
            sim_wr_release(net, w); /* the TX event still holds it */
        }
    }
}

static void sim_net_on_tx(sim_net_t *net, uint32_t w, uint64_t off, uint64_t seg)
{
    sim_wr_t *wr = &net->wrs[w];
    sim_nic_t *src = sim_wr_src(net, wr);
    assert(src != NULL); /* sim_nic_destroy cancels its TX event */
    src->tx_rec = SIM_NIL;
    const uint64_t now = sim_net_now(net);
    const uint64_t lat = net->cfg.latency_ns;
    if (!wr->failed) {
        if (!src->link_up) {
            sim_wr_fail(net, w, KVS_EPEER, sim_add_sat(now, 2 * lat));
        } else {
            int rc = sim_net_schedule(net, sim_add_sat(now, lat), REC_ARRIVE, w, off, seg, NULL);
            if (rc == KVS_OK) {
                wr->refs++;
            } else {
                sim_nic_set_fatal(src, rc, "NIC %s could not schedule a segment: the NIC is "
                                           "in error", src->name);
                wr->failed = true;
            }
        }
    }
    sim_wr_release(net, w);
    sim_nic_tx_kick(src);
}

/* Whether write wr, which came on dst's connection dst_conn, may put
 * [raddr, raddr + seg) into dst's memory: its key is an MR's of dst that is
 * not sealed and the segment lies inside that MR, or it is a live grant's of dst, bound
 * to dst_conn, that holds the whole write. */
static bool sim_nic_may_land(const sim_nic_t *dst, const kvs_conn_t *dst_conn,
                             const sim_wr_t *wr, uint64_t raddr, uint64_t seg)
{
    if (raddr < wr->remote_addr || !sim_gpu_in_mem(dst->gpu, raddr, seg))
        return false;
    for (uint32_t i = 0; i < dst->mr_hwm; i++) {
        const kvs_mr_t *mr = &dst->mrs[i];
        if (mr->live && mr->rkey == wr->rkey)
            return !mr->sealed && raddr >= mr->addr && seg <= mr->len_bytes &&
                   raddr - mr->addr <= mr->len_bytes - seg;
    }
    const kvs_grant_t *g = sim_nic_grant_by_key(dst, wr->rkey);
    if (g == NULL || g->conn != dst_conn || g->conn_gen != dst_conn->gen)
        return false;
    return wr->remote_addr >= g->addr && wr->len_bytes <= g->len_bytes &&
           wr->remote_addr - g->addr <= g->len_bytes - wr->len_bytes;
}

/* The segment [off, off + seg) of write w leaves the RX port into memory.
 * Returns the NIC to wake (the target, after an IMM), or NULL. */
static sim_nic_t *sim_net_land(sim_net_t *net, uint32_t w, uint64_t off, uint64_t seg)
{
    sim_wr_t *wr = &net->wrs[w];
    if (wr->failed)
        return NULL;
    const uint64_t now = sim_net_now(net);
    const uint64_t lat = net->cfg.latency_ns;
    sim_nic_t *dst = sim_wr_dst(net, wr);
    kvs_conn_t *dst_conn =
        sim_net_conn(net, wr->dst_slot, wr->dst_gen, wr->dst_conn, wr->dst_conn_gen);
    if (dst == NULL || dst_conn == NULL) { /* the target or its side of the conn went away */
        sim_wr_fail(net, w, KVS_EPEER, sim_add_sat(now, lat));
        return NULL;
    }
    if (wr->force_fail) {
        sim_wr_fail(net, w, KVS_EREMOTE, sim_add_sat(now, lat));
        return NULL;
    }
    const uint64_t raddr = wr->remote_addr + off;
    if (!sim_nic_may_land(dst, dst_conn, wr, raddr, seg)) {
        sim_wr_fail(net, w, KVS_EREMOTE, sim_add_sat(now, lat));
        return NULL;
    }
    sim_nic_t *src = sim_wr_src(net, wr);
    if (src == NULL) { /* the sender is gone: its GPU may be too */
        wr->failed = true;
        wr->status = KVS_EPEER;
        return NULL;
    }
    if (!sim_gpu_in_mem(src->gpu, wr->local_addr + off, seg)) {
        kvs_fabric_fail(&src->base, KVS_EBACKEND, 0,
                        "NIC %s: source of a write (0x%llx + %llu bytes) was freed while "
                        "the write was in flight",
                        src->name, (unsigned long long)(wr->local_addr + off),
                        (unsigned long long)seg);
        sim_wr_fail(net, w, KVS_EBACKEND, sim_add_sat(now, lat));
        return NULL;
    }
    if (sim_gpu_move(dst->gpu, raddr, src->gpu, wr->local_addr + off, seg) != KVS_OK) {
        kvs_fabric_fail(&src->base, KVS_ENOMEM, 0,
                        "NIC %s: out of host memory for the provenance of a write",
                        src->name);
        sim_wr_fail(net, w, KVS_ENOMEM, sim_add_sat(now, lat));
        return NULL;
    }
    wr->landed_bytes += seg;
    if (wr->planted)
        src->planted_landed_bytes += seg;
    if (wr->landed_bytes < wr->len_bytes)
        return NULL;
    /* the last segment: ack to the sender, IMM at the target */
    int rc = sim_net_schedule(net, sim_add_sat(now, lat), REC_WDONE, w, 0, 0, NULL);
    if (rc == KVS_OK)
        wr->refs++;
    else
        sim_nic_set_fatal(src, rc, "NIC %s could not schedule a write completion: the NIC "
                                   "is in error", src->name);
    if (!wr->with_imm)
        return NULL;
    const sim_cqe_t e = {.kind = KVS_COMPLETION_IMM, .status = KVS_OK, .imm = wr->imm,
                         .conn = dst_conn, .msg = SIM_NIL};
    return sim_nic_push(dst, &e) ? dst : NULL;
}

static void sim_net_on_arrive(sim_net_t *net, uint32_t w, uint64_t off, uint64_t seg)
{
    sim_wr_t *wr = &net->wrs[w];
    sim_nic_t *wake = NULL;
    const uint64_t now = sim_net_now(net);
    sim_nic_t *dst = sim_wr_dst(net, wr);
    if (wr->failed) {
        /* dropped: part of a write that already failed */
    } else if (dst == NULL || !dst->link_up) {
        sim_wr_fail(net, w, KVS_EPEER, sim_add_sat(now, net->cfg.latency_ns));
    } else {
        /* RX FIFO: lands when fully arrived and the port finished the one before */
        uint64_t land_ns = sim_add_sat(dst->rx_busy_until_ns, sim_net_wire_ns(net, seg));
        if (land_ns < now)
            land_ns = now;
        dst->rx_busy_until_ns = land_ns;
        if (land_ns == now) {
            wake = sim_net_land(net, w, off, seg);
        } else {
            int rc = sim_net_schedule(net, land_ns, REC_LAND, w, off, seg, NULL);
            if (rc == KVS_OK) {
                wr->refs++;
            } else {
                sim_nic_set_fatal(dst, rc, "NIC %s could not schedule a landing: the NIC is "
                                           "in error", dst->name);
                sim_wr_fail(net, w, KVS_EPEER, sim_add_sat(now, net->cfg.latency_ns));
            }
        }
    }
    sim_wr_release(net, w);
    sim_nic_wake(wake);
}

static void sim_net_on_land(sim_net_t *net, uint32_t w, uint64_t off, uint64_t seg)
{
    sim_nic_t *wake = sim_net_land(net, w, off, seg);
    sim_wr_release(net, w);
    sim_nic_wake(wake);
}

static void sim_net_on_write_done(sim_net_t *net, uint32_t w)
{
    sim_wr_t *wr = &net->wrs[w];
    sim_nic_t *src = sim_wr_src(net, wr);
    bool wake = false;
    if (src != NULL) {
        const int status = wr->failed ? wr->status : KVS_OK;
        const sim_cqe_t e = {
            .kind = KVS_COMPLETION_WRITE,
            .status = status,
            .wr_id = wr->wr_id,
            .conn = sim_net_conn(net, wr->src_slot, wr->src_gen, wr->src_conn,
                                 wr->src_conn_gen),
            .conn_gen = wr->src_conn_gen,
            .msg = SIM_NIL,
        };
        if (status == KVS_OK) {
            src->writes++;
            src->write_bytes += wr->len_bytes;
        }
        if (src->span != NULL)
            src->span(src->span_ctx, status == KVS_OK ? "write" : "write (failed)", "nic",
                      wr->post_ns, sim_engine_now_ns(net->eng));
        wake = sim_nic_push(src, &e);
    }
    sim_wr_release(net, w);
    if (wake)
        sim_nic_wake(src);
}

/* ------------------------------------------------------------------------ */
/* Control messages                                                          */
/* ------------------------------------------------------------------------ */

static void sim_net_on_msg(sim_net_t *net, uint32_t m)
{
    sim_msg_t *msg = sim_msg_at(net, m);
    sim_nic_t *dst = sim_net_nic(net, msg->dst_slot, msg->dst_gen);
    kvs_conn_t *dst_conn =
        sim_net_conn(net, msg->dst_slot, msg->dst_gen, msg->dst_conn, msg->dst_conn_gen);
    const uint32_t src_slot = msg->src_slot, src_gen = msg->src_gen;
    const bool dup = msg->dup; /* one SEND completion per send, not per copy */
    const sim_cqe_t send_done = {
        .kind = KVS_COMPLETION_SEND,
        .status = KVS_OK,
        .wr_id = msg->wr_id,
        .conn = sim_net_conn(net, msg->src_slot, msg->src_gen, msg->src_conn,
                             msg->src_conn_gen),
        .conn_gen = msg->src_conn_gen,
        .msg = SIM_NIL,
    };
    bool wake_dst = false;
    if (!msg->dropped && dst != NULL && dst->link_up && dst_conn != NULL) {
        if (!msg->dup) {
            assert(msg->seq >= dst_conn->recv_seq); /* in order per connection */
            dst_conn->recv_seq = msg->seq + 1;
        }
        const sim_cqe_t e = {.kind = KVS_COMPLETION_RECV, .status = KVS_OK,
                             .conn = dst_conn, .len_bytes = msg->len_bytes, .msg = m};
        wake_dst = sim_nic_push(dst, &e); /* the CQ owns the message now */
    } else {
        sim_msg_free(net, m);
    }
    sim_nic_t *src = sim_net_nic(net, src_slot, src_gen);
    bool wake_src = src != NULL && !dup && sim_nic_push(src, &send_done);
    if (wake_dst)
        sim_nic_wake(dst);
    if (wake_src)
        sim_nic_wake(sim_net_nic(net, src_slot, src_gen)); /* dst's wake may destroy it */
}

/* ------------------------------------------------------------------------ */
/* Event dispatch                                                            */
/* ------------------------------------------------------------------------ */

static void sim_net_on_event(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    (void)eng;
    sim_net_t *net = ctx;
    assert(arg < net->recs_cap);
    const sim_rec_t rec = net->recs[arg];
    sim_rec_free(net, (uint32_t)arg);
    switch (rec.kind) {
    case REC_TX:
        sim_net_on_tx(net, (uint32_t)rec.a, rec.b, rec.c);
        break;
    case REC_ARRIVE:
        sim_net_on_arrive(net, (uint32_t)rec.a, rec.b, rec.c);
        break;
    case REC_LAND:
        sim_net_on_land(net, (uint32_t)rec.a, rec.b, rec.c);
        break;
    case REC_WDONE:
        sim_net_on_write_done(net, (uint32_t)rec.a);
        break;
    case REC_MSG:
        sim_net_on_msg(net, (uint32_t)rec.a);
        break;
    default:
        assert(!"unknown fabric event");
    }
}
