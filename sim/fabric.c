/*
 * fabric.c - the simulated RDMA fabric of fabric.h: a network of NICs on the
 * engine's virtual clock, each NIC a kvstage fabric backend ("sim-nic").
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
 * 1. write() validates the local side (connection, local MR, range) and
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
 * Connections come in pairs: connect(A, "B") creates A's conn to B and B's
 * conn back to A (the reverse), so a RECV or IMM at B carries B's conn to A
 * and B can reply on it. Disconnecting one side (or destroying its NIC)
 * marks the other dead and gives its owner a DISCONNECT completion: posts on
 * a dead conn fail with KVS_EPEER; disconnect it and connect again.
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
 *
 * Grants (key_grant / key_revoke, fabric ops version 4): a grant is one
 * range of one of the NIC's MRs opened to the peer of one of its
 * connections (the NIC's side of it, named by pointer and generation, so a
 * connection disconnected meanwhile matches no write), with a key drawn
 * from the rkey stream like an MR's: 32 bits, non-zero, unique among the
 * live MRs and grants of the net. A grant costs no event and no work
 * request: granting and revoking are table updates (a verbs memory window
 * bind is a work request on the send queue; its cost is for the real
 * fabric to measure). An MR with live grants cannot be deregistered
 * (KVS_EBUSY), as verbs refuses to deregister an MR with bound windows.
 *
 * Bounds: at most SIM_NET_MAX_NICS NICs, max_mrs MRs, max_conns conns and
 * max_grants grants per NIC (grants in pages allocated as used),
 * cq_entries completions per NIC (storage grows by doubling up to it),
 * and the per-net pools of writes, messages and event records grow by
 * doubling up to fixed caps: no malloc per operation in steady state.
 *
 * Send queues: every write and send accepted on a connection holds one
 * slot of its send queue until its completion is polled (as a verbs send
 * queue keeps each request until it is reported); a completion that is
 * never pushed (the NIC is gone or in error) frees nothing, and a conn
 * that is disconnected starts again empty. With sq_depth > 0 a post that
 * finds sq_depth slots held is refused with KVS_EAGAIN before anything is
 * queued, naming the knob, and counted (sim_nic_posts_refused); the
 * caller polls and posts again. Slots are counted with sq_depth 0 too
 * (unlimited: nothing is refused), so the bookkeeping is checked in every
 * run. No event, no draw: a limit changes only what the core does.
 *
 * Write size: with max_write_bytes set (fabric ops version 6), a write of
 * more bytes is refused at post (KVS_EINVAL), as a NIC refuses a message
 * over its port's max_msg_sz, and the slot reports the limit so the core
 * posts pieces; 0 (the default) takes any length.
 *
 * Counters: sim_nic_writes / sim_nic_write_bytes count writes of this NIC
 * that completed successfully and their bytes; sim_nic_msgs counts control
 * messages accepted by send(); sim_nic_posts_refused counts the posts a
 * full send queue refused.
 */
#include "fabric.h"

#include <assert.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_NET_MAX_NICS 1024u
#define SIM_NIL UINT32_MAX
#define SIM_NET_RKEY_COMPONENT UINT64_C(0x46414252) /* "FABR": the rkey stream */
#define SIM_NET_FAULT_COMPONENT UINT64_C(0x46415554) /* "FAUT": the fault stream */
#define SIM_NET_NONCE_COMPONENT UINT64_C(0x4E4F4E43) /* "NONC": registration nonces */
#define SIM_NET_RKEY_TRIES 64
#define SIM_NET_RECS_MAX (UINT32_C(1) << 24) /* pending fabric events */
#define SIM_NET_WRS_MAX (UINT32_C(1) << 22)  /* writes in flight */
#define SIM_NET_MSGS_MAX (UINT32_C(1) << 16) /* messages in flight or unpolled */
/* Messages (4 KiB of payload room each) come in pages of this many, never
 * moved: growing by realloc copied every message in flight, which was the
 * largest cost of a small run. */
#define SIM_NET_MSG_PAGE 64u
#define SIM_NET_POOL_INITIAL 64u
#define SIM_NIC_CQ_INITIAL 64u
#define SIM_NIC_GRANT_PAGE 64u /* grants per page, never moved */

/* ------------------------------------------------------------------------ */
/* Types                                                                     */
/* ------------------------------------------------------------------------ */

/* A memory registration; lives in its NIC's table (max_mrs slots). */
struct kvs_mr {
    sim_nic_t *nic;
    uint64_t addr;
    uint64_t len_bytes;
    uint64_t rkey;
    bool live;
    bool sealed;         /* mr_register_sealed: rkey opens nothing remote */
};

/* A region-scoped key (key_grant); lives in its NIC's grant pages. */
struct kvs_grant {
    kvs_mr_t *mr;        /* the MR of this NIC it opens a range of */
    kvs_conn_t *conn;    /* this NIC's side of the connection its peer writes on */
    uint32_t conn_gen;   /* conn's generation at the grant */
    uint32_t next;       /* free list link */
    uint64_t addr, len_bytes, rkey;
    bool live;
};

/* One side of a connection; lives in its NIC's table (max_conns slots). */
struct kvs_conn {
    sim_nic_t *local;
    sim_nic_t *peer;     /* NULL once dead */
    kvs_conn_t *reverse; /* the peer's conn back to local; NULL once dead */
    uint64_t send_seq;   /* messages sent on this conn */
    uint64_t recv_seq;   /* next sequence number expected on this conn */
    uint64_t last_deliver_ns; /* a delayed message holds back later ones */
    uint32_t sq_used;    /* send queue: posts whose completion is not polled */
    uint32_t gen;        /* bumped when the slot is freed */
    bool live;           /* slot in use */
    bool dead;           /* the peer disconnected or was destroyed */
};

/* A completion as stored in a CQ: compact; a RECV's payload stays in the
 * message pool until polled. */
typedef struct sim_cqe {
    kvs_conn_t *conn;
    uint32_t conn_gen; /* WRITE, SEND: the conn's gen when pushed (its slot) */
    uint64_t wr_id;
    int32_t status;
    uint32_t imm;
    uint32_t len_bytes;
    uint32_t msg; /* RECV: message pool index */
    uint8_t kind; /* kvs_completion_kind_t */
} sim_cqe_t;

struct sim_nic {
    kvs_fabric_t base; /* first: recovered with KVS_CONTAINER_OF */
    sim_net_t *net;
    sim_gpu_t *gpu;    /* borrowed; must outlive the NIC */
    char *name;        /* owned copy */
    uint32_t slot;     /* in net->nics */
    uint32_t gen;      /* == net->nic_gen[slot] while alive */
    kvs_mr_t *mrs;     /* max_mrs */
    uint32_t mr_hwm;   /* one past the highest slot ever used */
    kvs_conn_t *conns; /* max_conns */
    kvs_grant_t **grant_pages; /* [ceil(max_grants / SIM_NIC_GRANT_PAGE)], NULL until used */
    uint32_t grants_fresh;     /* slots [0, grants_fresh) were used once */
    uint32_t grants_free;      /* free list of used slots, SIM_NIL at its end */
    uint32_t grants_live;
    uint64_t grants_made, grants_revoked;
    sim_cqe_t *cq;     /* ring, cq_cap <= cfg.cq_entries */
    uint32_t cq_cap, cq_head, cq_len;
    int fatal;         /* 0, or the status every later call returns */
    char fatal_msg[KVS_ERROR_MSG_BYTES];
    /* TX port: round-robin list of writes through sim_wr_t.next */
    uint32_t tx_head, tx_tail;
    uint32_t tx_rec;   /* record of the pending TX event, SIM_NIL if idle */
    /* RX port */
    uint64_t rx_busy_until_ns;
    bool link_up;
    uint32_t fail_next_writes;
    uint32_t write_error_num, write_error_den;
    sim_msg_filter_fn msg_filter;
    void *msg_filter_ctx;
    sim_nic_write_hook_fn write_hook; /* test-only: planted bugs */
    void *write_hook_ctx;
    sim_nic_wake_fn wake;
    void *wake_ctx;
    sim_span_fn span;
    void *span_ctx;
    uint64_t writes, write_bytes, msgs, posts_refused;
    uint64_t planted_landed_bytes;
};

/* A write in flight. Freed when refs (TX list membership + pending events
 * naming it) drops to 0. */
typedef struct sim_wr {
    uint64_t local_addr, remote_addr, len_bytes, rkey, wr_id;
    uint64_t sent_bytes, landed_bytes;
    uint64_t post_ns;
    kvs_conn_t *src_conn, *dst_conn;
    uint32_t src_conn_gen, dst_conn_gen;
    uint32_t src_slot, src_gen, dst_slot, dst_gen;
    uint32_t imm;
    uint32_t refs;
    uint32_t next; /* TX list link, or free list link */
    int status;
    bool with_imm, force_fail, failed, in_tx, in_use;
    bool planted;  /* the write hook marked it (a hostile writer's) */
} sim_wr_t;

/* A control message in flight, or delivered and waiting in a CQ. */
typedef struct sim_msg {
    kvs_conn_t *src_conn, *dst_conn;
    uint32_t src_conn_gen, dst_conn_gen;
    uint32_t src_slot, src_gen, dst_slot, dst_gen;
    uint64_t wr_id, seq;
    uint32_t len_bytes;
    uint32_t next; /* free list link */
    bool dropped, in_use;
    bool dup;      /* the second copy of a duplicated message */
    uint8_t data[KVS_CONTROL_MSG_MAX_BYTES];
} sim_msg_t;

enum sim_rec_kind {
    REC_FREE = 0,
    REC_TX,     /* a = write, b = offset, c = bytes: segment left TX */
    REC_ARRIVE, /* same: segment reached the receiver */
    REC_LAND,   /* same: segment leaves the RX port into memory */
    REC_WDONE,  /* a = write: the sender's WRITE completion */
    REC_MSG     /* a = message: delivery */
};

/* Every event the fabric schedules, so sim_net_destroy can cancel it. */
typedef struct sim_rec {
    uint64_t ev_id;
    uint64_t a, b, c;
    uint32_t next; /* free list link */
    uint8_t kind;  /* enum sim_rec_kind */
} sim_rec_t;

struct sim_net {
    sim_engine_t *eng; /* borrowed; must outlive the net */
    sim_net_config_t cfg;
    sim_rng_t rkey_rng;
    sim_rng_t fault_rng;
    sim_rng_t nonce_rng; /* random_bytes: deterministic, so a run replays */
    sim_nic_t *nics[SIM_NET_MAX_NICS];
    uint32_t nic_gen[SIM_NET_MAX_NICS];
    uint32_t nic_count;
    sim_rec_t *recs;
    uint32_t recs_cap, recs_free;
    sim_wr_t *wrs;
    uint32_t wrs_cap, wrs_free;
    sim_msg_t *msg_pages[SIM_NET_MSGS_MAX / SIM_NET_MSG_PAGE]; /* NULL until used */
    uint32_t msgs_cap, msgs_free;
    uint32_t msgs_fresh; /* [msgs_fresh, msgs_cap) never used: not linked */
};

static void sim_net_on_event(sim_engine_t *eng, void *ctx, uint64_t arg);

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static uint64_t sim_add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sim_net_now(const sim_net_t *net) { return sim_engine_now_ns(net->eng); }

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

static sim_nic_t *sim_net_nic(const sim_net_t *net, uint32_t slot, uint32_t gen)
{
    if (slot >= SIM_NET_MAX_NICS || net->nics[slot] == NULL || net->nic_gen[slot] != gen)
        return NULL;
    return net->nics[slot];
}

/* The connection if its NIC is alive and the slot was not freed since. */
static kvs_conn_t *sim_net_conn(const sim_net_t *net, uint32_t slot, uint32_t gen,
                                kvs_conn_t *conn, uint32_t conn_gen)
{
    if (conn == NULL || sim_net_nic(net, slot, gen) == NULL)
        return NULL;
    return conn->live && conn->gen == conn_gen ? conn : NULL;
}

static bool sim_nic_owns(const void *base, size_t elem_bytes, uint32_t count, const void *p)
{
    const uintptr_t b = (uintptr_t)base, q = (uintptr_t)p;
    if (p == NULL || q < b)
        return false;
    const uintptr_t off = q - b;
    return off % elem_bytes == 0 && off / elem_bytes < count;
}

static kvs_conn_t *sim_nic_conn_of(const sim_nic_t *nic, kvs_conn_t *conn)
{
    if (!sim_nic_owns(nic->conns, sizeof *conn, nic->net->cfg.max_conns, conn) || !conn->live)
        return NULL;
    return conn;
}

static kvs_mr_t *sim_nic_mr_of(const sim_nic_t *nic, kvs_mr_t *mr)
{
    if (!sim_nic_owns(nic->mrs, sizeof *mr, nic->net->cfg.max_mrs, mr) || !mr->live)
        return NULL;
    return mr;
}

static kvs_grant_t *sim_nic_grant_at(const sim_nic_t *nic, uint32_t i)
{
    assert(i < nic->grants_fresh);
    return &nic->grant_pages[i / SIM_NIC_GRANT_PAGE][i % SIM_NIC_GRANT_PAGE];
}

/* The slot of g among this NIC's grants, SIM_NIL when it is none of them. */
static uint32_t sim_nic_grant_index(const sim_nic_t *nic, const kvs_grant_t *g)
{
    const uint32_t pages = (nic->grants_fresh + SIM_NIC_GRANT_PAGE - 1) / SIM_NIC_GRANT_PAGE;
    for (uint32_t p = 0; p < pages; p++)
        if (sim_nic_owns(nic->grant_pages[p], sizeof *g, SIM_NIC_GRANT_PAGE, g))
            return p * SIM_NIC_GRANT_PAGE +
                   (uint32_t)(g - nic->grant_pages[p]);
    return SIM_NIL;
}

/* The live grant of this NIC with key rkey, or NULL. */
static const kvs_grant_t *sim_nic_grant_by_key(const sim_nic_t *nic, uint64_t rkey)
{
    for (uint32_t i = 0; i < nic->grants_fresh; i++) {
        const kvs_grant_t *g = sim_nic_grant_at(nic, i);
        if (g->live && g->rkey == rkey)
            return g;
    }
    return NULL;
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

static void sim_rec_free(sim_net_t *net, uint32_t r)
{
    assert(r < net->recs_cap && net->recs[r].kind != REC_FREE);
    net->recs[r].kind = REC_FREE;
    net->recs[r].next = net->recs_free;
    net->recs_free = r;
}

static int sim_wr_alloc(sim_net_t *net, uint32_t *out)
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
static void sim_wr_release(sim_net_t *net, uint32_t w)
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

static sim_msg_t *sim_msg_at(sim_net_t *net, uint32_t m)
{
    assert(m < net->msgs_cap);
    return &net->msg_pages[m / SIM_NET_MSG_PAGE][m % SIM_NET_MSG_PAGE];
}

static int sim_msg_alloc(sim_net_t *net, uint32_t *out)
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

static void sim_msg_free(sim_net_t *net, uint32_t m)
{
    sim_msg_t *msg = sim_msg_at(net, m);
    assert(msg->in_use);
    msg->in_use = false;
    msg->next = net->msgs_free;
    net->msgs_free = m;
}

/* Schedules a fabric event of `kind` at at_ns; *out_rec (may be NULL) gets
 * its record. */
static int sim_net_schedule(sim_net_t *net, uint64_t at_ns, uint8_t kind, uint64_t a,
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
static bool sim_nic_push(sim_nic_t *nic, const sim_cqe_t *e)
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

static void sim_nic_wake(sim_nic_t *nic)
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
static void sim_nic_tx_kick(sim_nic_t *nic)
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

/* ------------------------------------------------------------------------ */
/* The ops table                                                             */
/* ------------------------------------------------------------------------ */

static int sim_nic_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                               uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);

static sim_nic_t *sim_nic_of(kvs_fabric_t *fab)
{
    sim_nic_t *nic = sim_nic_from_fabric(fab);
    assert(nic != NULL);
    return nic;
}

/* A key of a live MR or grant anywhere on the net. */
static bool sim_net_rkey_live(const sim_net_t *net, uint64_t rkey)
{
    for (uint32_t s = 0; s < SIM_NET_MAX_NICS; s++) {
        const sim_nic_t *n = net->nics[s];
        if (n == NULL)
            continue;
        for (uint32_t i = 0; i < n->mr_hwm; i++)
            if (n->mrs[i].live && n->mrs[i].rkey == rkey)
                return true;
        if (sim_nic_grant_by_key(n, rkey) != NULL)
            return true;
    }
    return false;
}

/* 32-bit keys as in verbs, drawn from the net's stream: non-sequential,
 * non-zero, unique among the live MRs and grants of the net; 0 when
 * SIM_NET_RKEY_TRIES draws found none free. */
static uint64_t sim_net_draw_rkey(sim_net_t *net)
{
    uint64_t rkey = 0;
    for (int t = 0; t < SIM_NET_RKEY_TRIES && rkey == 0; t++) {
        rkey = sim_rng_next(&net->rkey_rng) & UINT32_MAX;
        if (rkey != 0 && sim_net_rkey_live(net, rkey))
            rkey = 0;
    }
    return rkey;
}

static int sim_nic_mr_register_as(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                  uint64_t len_bytes, bool sealed, kvs_mr_t **out,
                                  uint64_t *out_rkey)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (out == NULL || out_rkey == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "mr_register on %s: out and out_rkey "
                                                   "must not be NULL", nic->name);
    sim_gpu_t *gpu = dev != NULL ? sim_gpu_from_device(dev) : NULL;
    if (gpu == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "mr_register on %s: the device is not a "
                                                   "simulated GPU", nic->name);
    if (gpu != nic->gpu)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "mr_register on %s: GPU %u is not the GPU of this NIC (GPU "
                               "%u)", nic->name, sim_gpu_id(gpu), sim_gpu_id(nic->gpu));
    if (len_bytes == 0 || !sim_gpu_in_mem(gpu, addr, len_bytes))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "mr_register on %s: [0x%llx, +%llu bytes) is not inside one "
                               "live allocation of GPU %u",
                               nic->name, (unsigned long long)addr,
                               (unsigned long long)len_bytes, sim_gpu_id(gpu));
    uint32_t slot = SIM_NIL;
    for (uint32_t i = 0; i < net->cfg.max_mrs; i++) {
        if (!nic->mrs[i].live) {
            slot = i;
            break;
        }
    }
    if (slot == SIM_NIL)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "mr_register on %s: all %u MR slots are "
                                                  "in use; deregister some or raise max_mrs",
                               nic->name, net->cfg.max_mrs);
    const uint64_t rkey = sim_net_draw_rkey(net);
    if (rkey == 0)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "mr_register on %s: no free remote key "
                                                  "found", nic->name);
    kvs_mr_t *mr = &nic->mrs[slot];
    *mr = (kvs_mr_t){.nic = nic, .addr = addr, .len_bytes = len_bytes, .rkey = rkey,
                     .live = true, .sealed = sealed};
    if (slot + 1 > nic->mr_hwm)
        nic->mr_hwm = slot + 1;
    *out = mr;
    *out_rkey = rkey;
    return KVS_OK;
}

static int sim_nic_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                               uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    return sim_nic_mr_register_as(fab, dev, addr, len_bytes, false, out, out_rkey);
}

/* Fabric ops version 5: its key draws from the same stream, so a run's
 * keys (and digest) do not depend on which registrations are sealed. */
static int sim_nic_mr_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                      uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    return sim_nic_mr_register_as(fab, dev, addr, len_bytes, true, out, out_rkey);
}

static int sim_nic_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr)
{
    sim_nic_t *nic = sim_nic_of(fab);
    if (sim_nic_mr_of(nic, mr) == NULL)
        return kvs_fabric_fail(fab, KVS_ENOENT, 0, "mr_deregister on %s: not a live MR of "
                                                   "this NIC", nic->name);
    for (uint32_t i = 0; i < nic->grants_fresh; i++)
        if (sim_nic_grant_at(nic, i)->live && sim_nic_grant_at(nic, i)->mr == mr)
            return kvs_fabric_fail(fab, KVS_EBUSY, 0, "mr_deregister on %s: grants "
                                   "(key_grant) of this MR are live: revoke them first",
                                   nic->name);
    mr->live = false;
    while (nic->mr_hwm > 0 && !nic->mrs[nic->mr_hwm - 1].live)
        nic->mr_hwm--;
    return KVS_OK;
}

static sim_nic_t *sim_net_find(const sim_net_t *net, const char *name)
{
    for (uint32_t s = 0; s < SIM_NET_MAX_NICS; s++)
        if (net->nics[s] != NULL && strcmp(net->nics[s]->name, name) == 0)
            return net->nics[s];
    return NULL;
}

static kvs_conn_t *sim_nic_conn_free_slot(const sim_nic_t *nic)
{
    for (uint32_t i = 0; i < nic->net->cfg.max_conns; i++)
        if (!nic->conns[i].live)
            return &nic->conns[i];
    return NULL;
}

static int sim_nic_connect(kvs_fabric_t *fab, const char *peer_name, kvs_conn_t **out)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (peer_name == NULL || out == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "connect on %s: peer and out must not be "
                                                   "NULL", nic->name);
    sim_nic_t *peer = sim_net_find(net, peer_name);
    if (peer == NULL)
        return kvs_fabric_fail(fab, KVS_ENOENT, 0, "connect on %s: no NIC named '%s' on this "
                                                   "network", nic->name, peer_name);
    for (uint32_t i = 0; i < net->cfg.max_conns; i++) {
        kvs_conn_t *c = &nic->conns[i];
        if (c->live && !c->dead && c->peer == peer) {
            *out = c;
            return KVS_OK;
        }
    }
    kvs_conn_t *mine = sim_nic_conn_free_slot(nic);
    kvs_conn_t *theirs = peer == nic ? mine : sim_nic_conn_free_slot(peer);
    if (mine == NULL || theirs == NULL)
        return kvs_fabric_fail(fab, KVS_EFULL, 0,
                               "connect %s -> %s: connection table of %s is full (%u); "
                               "disconnect some or raise max_conns",
                               nic->name, peer->name, mine == NULL ? nic->name : peer->name,
                               net->cfg.max_conns);
    *mine = (kvs_conn_t){.local = nic, .peer = peer, .reverse = theirs, .gen = mine->gen,
                         .live = true};
    if (theirs != mine)
        *theirs = (kvs_conn_t){.local = peer, .peer = nic, .reverse = mine,
                               .gen = theirs->gen, .live = true};
    *out = mine;
    return KVS_OK;
}

/* The peer of c went away: c is dead, and its owner hears of it with a
 * DISCONNECT completion (as rdma_cm's DISCONNECTED event tells a verbs
 * backend). */
static void sim_conn_kill(kvs_conn_t *c)
{
    c->peer = NULL;
    c->reverse = NULL;
    c->dead = true;
    sim_nic_t *owner = c->local;
    const sim_cqe_t e = {.kind = KVS_COMPLETION_DISCONNECT, .conn = c, .status = KVS_EPEER};
    if (sim_nic_push(owner, &e))
        sim_nic_wake(owner);
}

static void sim_nic_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    sim_nic_t *nic = sim_nic_of(fab);
    if (sim_nic_conn_of(nic, conn) == NULL)
        return;
    kvs_conn_t *rev = conn->reverse;
    if (rev != NULL && rev != conn)
        sim_conn_kill(rev);
    /* A DISCONNECT still queued for this conn must not reach a later conn
     * in the same slot: drop it. */
    uint32_t kept = 0;
    for (uint32_t i = 0; i < nic->cq_len; i++) {
        const sim_cqe_t e = nic->cq[(nic->cq_head + i) % nic->cq_cap];
        if (e.kind == KVS_COMPLETION_DISCONNECT && e.conn == conn)
            continue;
        nic->cq[(nic->cq_head + kept) % nic->cq_cap] = e;
        kept++;
    }
    nic->cq_len = kept;
    *conn = (kvs_conn_t){.gen = conn->gen + 1};
}

/* Validates a conn for posting: ours, live, not dead. */
static int sim_nic_check_conn(sim_nic_t *nic, kvs_conn_t *conn, const char *op)
{
    if (sim_nic_conn_of(nic, conn) == NULL)
        return kvs_fabric_fail(&nic->base, KVS_EINVAL, 0, "%s on %s: the connection is not a "
                                                          "live connection of this NIC", op,
                               nic->name);
    if (conn->dead)
        return kvs_fabric_fail(&nic->base, KVS_EPEER, 0,
                               "%s on %s: the peer disconnected or was destroyed; disconnect "
                               "and connect again", op, nic->name);
    assert(conn->peer != NULL && conn->reverse != NULL); /* live and not dead */
    return KVS_OK;
}

/* A free slot in conn's send queue, else KVS_EAGAIN (counted). */
static int sim_nic_check_sq(sim_nic_t *nic, kvs_conn_t *conn, const char *op)
{
    const uint32_t depth = nic->net->cfg.sq_depth;
    if (depth == 0 || conn->sq_used < depth)
        return KVS_OK;
    nic->posts_refused++;
    return kvs_fabric_fail(&nic->base, KVS_EAGAIN, 0,
                           "%s on %s: %u work requests in flight fill the send queue to %s "
                           "(sq_depth %u): poll completions, then retry, or raise sq_depth",
                           op, nic->name, conn->sq_used, conn->peer->name, depth);
}

/* A WRITE or SEND completion polled: its send queue slot is free again,
 * unless its conn was disconnected meanwhile (a new conn starts empty). */
static void sim_nic_sq_release(const sim_cqe_t *e)
{
    if ((e->kind != KVS_COMPLETION_WRITE && e->kind != KVS_COMPLETION_SEND) || e->conn == NULL ||
        !e->conn->live || e->conn->gen != e->conn_gen)
        return;
    assert(e->conn->sq_used > 0);
    e->conn->sq_used--;
}

static int sim_nic_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (nic->fatal != KVS_OK)
        return kvs_fabric_fail(fab, nic->fatal, 0, "%s", nic->fatal_msg);
    int rc = sim_nic_check_conn(nic, conn, "write");
    if (rc != KVS_OK)
        return rc;
    if (desc == NULL || desc->len_bytes == 0)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: %s", nic->name,
                               desc == NULL ? "desc is NULL" : "len_bytes is 0");
    const kvs_mr_t *mr = sim_nic_mr_of(nic, desc->local_mr);
    if (mr == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: local_mr is not a live MR of "
                                                   "this NIC", nic->name);
    if (desc->local_addr < mr->addr || desc->len_bytes > mr->len_bytes ||
        desc->local_addr - mr->addr > mr->len_bytes - desc->len_bytes)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "write on %s: source [0x%llx, +%llu bytes) is outside its MR "
                               "[0x%llx, +%llu bytes)",
                               nic->name, (unsigned long long)desc->local_addr,
                               (unsigned long long)desc->len_bytes,
                               (unsigned long long)mr->addr,
                               (unsigned long long)mr->len_bytes);
    if (net->cfg.max_write_bytes != 0 && desc->len_bytes > net->cfg.max_write_bytes)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "write on %s: %llu bytes, more than the %llu one write takes "
                               "(max_write_bytes): write it in pieces",
                               nic->name, (unsigned long long)desc->len_bytes,
                               (unsigned long long)net->cfg.max_write_bytes);
    rc = sim_nic_check_sq(nic, conn, "write");
    if (rc != KVS_OK)
        return rc;
    uint32_t w;
    rc = sim_wr_alloc(net, &w);
    if (rc != KVS_OK)
        return kvs_fabric_fail(fab, rc, 0, "write on %s: %u writes in flight on the network, "
                                           "no room for another", nic->name, net->wrs_cap);
    sim_wr_t *wr = &net->wrs[w];
    sim_nic_t *peer = conn->peer;
    wr->local_addr = desc->local_addr;
    wr->remote_addr = desc->remote_addr;
    wr->rkey = desc->rkey;
    if (nic->write_hook != NULL)
        wr->planted = nic->write_hook(nic->write_hook_ctx, nic->name, peer->name,
                                      &wr->remote_addr, &wr->rkey, desc->len_bytes);
    wr->len_bytes = desc->len_bytes;
    wr->wr_id = desc->wr_id;
    wr->post_ns = sim_engine_now_ns(net->eng);
    wr->with_imm = desc->with_imm;
    wr->imm = desc->imm;
    wr->src_conn = conn;
    wr->src_conn_gen = conn->gen;
    wr->dst_conn = conn->reverse;
    wr->dst_conn_gen = conn->reverse->gen;
    wr->src_slot = nic->slot;
    wr->src_gen = nic->gen;
    wr->dst_slot = peer->slot;
    wr->dst_gen = peer->gen;
    wr->status = KVS_OK;
    if (nic->fail_next_writes > 0) {
        nic->fail_next_writes--;
        wr->force_fail = true;
    } else if (nic->write_error_den > 0 &&
               sim_rng_chance(&net->fault_rng, nic->write_error_num, nic->write_error_den)) {
        wr->force_fail = true;
    }
    wr->in_tx = true;
    wr->refs = 1;
    conn->sq_used++;
    if (nic->tx_tail == SIM_NIL)
        nic->tx_head = w;
    else
        net->wrs[nic->tx_tail].next = w;
    nic->tx_tail = w;
    sim_nic_tx_kick(nic);
    if (nic->fatal != KVS_OK)
        return kvs_fabric_fail(fab, nic->fatal, 0, "%s", nic->fatal_msg);
    return KVS_OK;
}

static int sim_nic_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg,
                        uint32_t len_bytes, uint64_t wr_id)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (nic->fatal != KVS_OK)
        return kvs_fabric_fail(fab, nic->fatal, 0, "%s", nic->fatal_msg);
    int rc = sim_nic_check_conn(nic, conn, "send");
    if (rc != KVS_OK)
        return rc;
    if (len_bytes > KVS_CONTROL_MSG_MAX_BYTES || (msg == NULL && len_bytes > 0))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "send on %s: %u bytes (at most %u, and msg must not be NULL)",
                               nic->name, len_bytes, KVS_CONTROL_MSG_MAX_BYTES);
    rc = sim_nic_check_sq(nic, conn, "send");
    if (rc != KVS_OK)
        return rc;
    uint32_t m;
    rc = sim_msg_alloc(net, &m);
    if (rc != KVS_OK)
        return kvs_fabric_fail(fab, rc, 0, "send on %s: %u control messages in flight or "
                                           "unpolled on the network, no room for another",
                               nic->name, net->msgs_cap);
    sim_msg_t *mm = sim_msg_at(net, m);
    mm->src_conn = conn;
    mm->src_conn_gen = conn->gen;
    mm->dst_conn = conn->reverse;
    mm->dst_conn_gen = conn->reverse->gen;
    mm->src_slot = nic->slot;
    mm->src_gen = nic->gen;
    mm->dst_slot = conn->peer->slot;
    mm->dst_gen = conn->peer->gen;
    mm->wr_id = wr_id;
    mm->seq = conn->send_seq;
    mm->len_bytes = len_bytes;
    mm->dropped = !nic->link_up; /* leaving a NIC whose link is down */
    mm->dup = false;
    if (len_bytes > 0)
        memcpy(mm->data, msg, len_bytes);
    uint64_t delay_ns = 0;
    const sim_msg_fate_t fate = nic->msg_filter != NULL
                                    ? nic->msg_filter(nic->msg_filter_ctx, mm->data, len_bytes,
                                                      &delay_ns)
                                    : SIM_MSG_DELIVER;
    if (fate == SIM_MSG_DROP)
        mm->dropped = true;
    uint64_t at = sim_add_sat(sim_net_now(net), net->cfg.ctrl_latency_ns);
    if (fate == SIM_MSG_DELAY)
        at = sim_add_sat(at, delay_ns);
    if (at < conn->last_deliver_ns)
        at = conn->last_deliver_ns; /* behind a delayed one: order is kept */
    conn->last_deliver_ns = at;
    rc = sim_net_schedule(net, at, REC_MSG, m, 0, 0, NULL);
    if (rc != KVS_OK) {
        sim_msg_free(net, m);
        return kvs_fabric_fail(fab, rc, 0, "send on %s: could not schedule the delivery",
                               nic->name);
    }
    uint32_t m2;
    if (fate == SIM_MSG_DUP && sim_msg_alloc(net, &m2) == KVS_OK) {
        sim_msg_t *copy = sim_msg_at(net, m2);
        *copy = *mm;
        copy->dup = true;
        if (sim_net_schedule(net, at, REC_MSG, m2, 0, 0, NULL) != KVS_OK)
            sim_msg_free(net, m2);
    }
    conn->send_seq++;
    conn->sq_used++;
    nic->msgs++;
    return KVS_OK;
}

static int sim_nic_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (nic->fatal != KVS_OK)
        return kvs_fabric_fail(fab, nic->fatal, 0, "%s", nic->fatal_msg);
    if (max < 0 || (out == NULL && max > 0))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "poll on %s: max %d, out %s", nic->name,
                               max, out == NULL ? "NULL" : "set");
    int n = 0;
    while (n < max && nic->cq_len > 0) {
        const sim_cqe_t e = nic->cq[nic->cq_head];
        nic->cq_head = (nic->cq_head + 1) % nic->cq_cap;
        nic->cq_len--;
        sim_nic_sq_release(&e);
        kvs_completion_t *c = &out[n++];
        c->kind = (kvs_completion_kind_t)e.kind;
        c->status = e.status;
        c->wr_id = e.wr_id;
        c->conn = e.conn;
        c->imm = e.imm;
        c->len_bytes = e.len_bytes;
        if (e.kind == KVS_COMPLETION_RECV) {
            memcpy(c->msg, sim_msg_at(net, e.msg)->data, e.len_bytes);
            sim_msg_free(net, e.msg);
        }
    }
    return n;
}

static uint64_t sim_nic_now_ns(kvs_fabric_t *fab)
{
    return sim_net_now(sim_nic_of(fab)->net);
}

/* The nonces of authenticated registration: the net's own stream (its
 * component id keeps the other streams as they were), so they are
 * unpredictable to nobody but the seed's holder, and a run replays. */
static int sim_nic_random_bytes(kvs_fabric_t *fab, void *buf, size_t len_bytes)
{
    sim_rng_t *rng = &sim_nic_of(fab)->net->nonce_rng;
    uint8_t *out = buf;
    for (size_t i = 0; i < len_bytes; i += 8) {
        const uint64_t w = sim_rng_next(rng);
        for (size_t k = 0; k < 8 && i + k < len_bytes; k++)
            out[i + k] = (uint8_t)(w >> (8u * k));
    }
    return KVS_OK;
}

static int sim_nic_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes)
{
    (void)fab;
    if (conn == NULL || conn->peer == NULL)
        return KVS_ENOENT;
    snprintf(buf, bytes, "%s", conn->peer->name);
    return KVS_OK;
}

/* A free grant slot of nic (its page allocated on first use), or SIM_NIL
 * when max_grants are live or a page cannot be allocated (*why says). */
static uint32_t sim_nic_grant_slot(sim_nic_t *nic, int *why)
{
    if (nic->grants_free != SIM_NIL) {
        const uint32_t i = nic->grants_free;
        nic->grants_free = sim_nic_grant_at(nic, i)->next;
        return i;
    }
    *why = KVS_EFULL;
    if (nic->grants_fresh >= nic->net->cfg.max_grants)
        return SIM_NIL;
    kvs_grant_t **page = &nic->grant_pages[nic->grants_fresh / SIM_NIC_GRANT_PAGE];
    if (*page == NULL && (*page = calloc(SIM_NIC_GRANT_PAGE, sizeof **page)) == NULL) {
        *why = KVS_ENOMEM;
        return SIM_NIL;
    }
    return nic->grants_fresh++;
}

static int sim_nic_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                             uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (out == NULL || out_rkey == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: out and out_rkey must "
                                                   "not be NULL", nic->name);
    if (sim_nic_mr_of(nic, mr) == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: mr is not a live MR of "
                                                   "this NIC", nic->name);
    int rc = sim_nic_check_conn(nic, conn, "key_grant");
    if (rc != KVS_OK)
        return rc;
    if (len_bytes == 0 || addr < mr->addr || len_bytes > mr->len_bytes ||
        addr - mr->addr > mr->len_bytes - len_bytes)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "key_grant on %s: [0x%llx, +%llu bytes) is not a non-empty "
                               "range inside its MR [0x%llx, +%llu bytes)",
                               nic->name, (unsigned long long)addr,
                               (unsigned long long)len_bytes, (unsigned long long)mr->addr,
                               (unsigned long long)mr->len_bytes);
    const uint64_t rkey = sim_net_draw_rkey(net);
    if (rkey == 0)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "key_grant on %s: no free remote key "
                                                  "found", nic->name);
    const uint32_t i = sim_nic_grant_slot(nic, &rc);
    if (i == SIM_NIL)
        return kvs_fabric_fail(fab, rc, 0, rc == KVS_EFULL
                                               ? "key_grant on %s: all %u grants are live: "
                                                 "revoke some, or raise max_grants"
                                               : "key_grant on %s: no memory for grants "
                                                 "(%u at most)",
                               nic->name, net->cfg.max_grants);
    kvs_grant_t *g = sim_nic_grant_at(nic, i);
    *g = (kvs_grant_t){.mr = mr, .conn = conn, .conn_gen = conn->gen, .next = SIM_NIL,
                       .addr = addr, .len_bytes = len_bytes, .rkey = rkey, .live = true};
    nic->grants_live++;
    nic->grants_made++;
    *out = g;
    *out_rkey = rkey;
    return KVS_OK;
}

static int sim_nic_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant)
{
    sim_nic_t *nic = sim_nic_of(fab);
    const uint32_t i = sim_nic_grant_index(nic, grant);
    if (i == SIM_NIL || !grant->live)
        return kvs_fabric_fail(fab, KVS_ENOENT, 0, "key_revoke on %s: not a live grant of "
                                                   "this NIC", nic->name);
    *grant = (kvs_grant_t){.next = nic->grants_free, .live = false};
    nic->grants_free = i;
    nic->grants_live--;
    nic->grants_revoked++;
    return KVS_OK;
}

/* Every slot but the grants, shared by both tables below. */
#define SIM_NIC_OPS_SLOTS                                                      \
    .name = "sim-nic",                                                         \
    .caps = KVS_FABRIC_CAP_WRITE_IMM | KVS_FABRIC_CAP_PER_LAYER_WRITES,        \
    .mr_register = sim_nic_mr_register, .mr_deregister = sim_nic_mr_deregister, \
    .connect = sim_nic_connect, .disconnect = sim_nic_disconnect,              \
    .write = sim_nic_write, .send = sim_nic_send, .poll = sim_nic_poll,        \
    .now_ns = sim_nic_now_ns, .random_bytes = sim_nic_random_bytes,            \
    .peer_addr = sim_nic_peer_addr

static uint64_t sim_nic_max_write_bytes(kvs_fabric_t *fab)
{
    const uint64_t n = sim_nic_of(fab)->net->cfg.max_write_bytes;
    return n != 0 ? n : UINT64_MAX;
}

static const kvs_fabric_ops_t sim_nic_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    SIM_NIC_OPS_SLOTS,
    .key_grant = sim_nic_key_grant,
    .key_revoke = sim_nic_key_revoke,
    .mr_register_sealed = sim_nic_mr_register_sealed,
    .max_write_bytes = sim_nic_max_write_bytes,
};

/* sim_net_config_t.no_key_grant: the table of a fabric without grants, of
 * version 3 (it ends at peer_addr). */
static const kvs_fabric_ops_t sim_nic_ops_v3 = {
    .version = 3,
    .size = offsetof(kvs_fabric_ops_t, key_grant),
    SIM_NIC_OPS_SLOTS,
};

/* ------------------------------------------------------------------------ */
/* Network and NIC lifetime                                                  */
/* ------------------------------------------------------------------------ */

int sim_net_create(sim_engine_t *eng, const sim_net_config_t *cfg, sim_net_t **out)
{
    if (eng == NULL || out == NULL)
        return KVS_EINVAL;
    sim_net_t *net = calloc(1, sizeof *net);
    if (net == NULL)
        return KVS_ENOMEM;
    net->eng = eng;
    if (cfg != NULL)
        net->cfg = *cfg;
    sim_net_config_t *c = &net->cfg;
    if (c->link_bytes_per_s == 0)
        c->link_bytes_per_s = UINT64_C(50000000000);
    if (c->latency_ns == 0)
        c->latency_ns = 2000;
    if (c->mtu_bytes == 0)
        c->mtu_bytes = 4096;
    if (c->header_bytes == 0)
        c->header_bytes = 58;
    if (c->per_op_ns == 0)
        c->per_op_ns = 3700;
    if (c->segment_bytes == 0)
        c->segment_bytes = UINT64_C(1) << 20;
    if (c->ctrl_latency_ns == 0)
        c->ctrl_latency_ns = 20000;
    if (c->cq_entries == 0)
        c->cq_entries = 65536;
    if (c->max_mrs == 0)
        c->max_mrs = 1024;
    if (c->max_conns == 0)
        c->max_conns = 256;
    if (c->max_grants == 0)
        c->max_grants = 65536;
    sim_engine_rng(eng, SIM_NET_RKEY_COMPONENT, &net->rkey_rng);
    sim_engine_rng(eng, SIM_NET_FAULT_COMPONENT, &net->fault_rng);
    sim_engine_rng(eng, SIM_NET_NONCE_COMPONENT, &net->nonce_rng);
    net->recs_free = SIM_NIL;
    net->wrs_free = SIM_NIL;
    net->msgs_free = SIM_NIL;
    *out = net;
    return KVS_OK;
}

int sim_net_destroy(sim_net_t *net)
{
    if (net == NULL)
        return KVS_OK;
    if (net->nic_count > 0)
        return KVS_EBUSY;
    for (uint32_t r = 0; r < net->recs_cap; r++)
        if (net->recs[r].kind != REC_FREE)
            (void)sim_engine_cancel(net->eng, net->recs[r].ev_id);
    free(net->recs);
    free(net->wrs);
    for (uint32_t p = 0; p < net->msgs_cap / SIM_NET_MSG_PAGE; p++)
        free(net->msg_pages[p]);
    free(net);
    return KVS_OK;
}

int sim_nic_create(sim_net_t *net, const char *name, sim_gpu_t *gpu, sim_nic_t **out)
{
    if (net == NULL || name == NULL || name[0] == '\0' || gpu == NULL || out == NULL)
        return KVS_EINVAL;
    if (sim_net_find(net, name) != NULL)
        return KVS_EINVAL; /* names are unique: connect finds NICs by name */
    uint32_t slot = SIM_NIL;
    for (uint32_t s = 0; s < SIM_NET_MAX_NICS; s++) {
        if (net->nics[s] == NULL) {
            slot = s;
            break;
        }
    }
    if (slot == SIM_NIL)
        return KVS_EFULL;
    sim_nic_t *nic = calloc(1, sizeof *nic);
    if (nic == NULL)
        return KVS_ENOMEM;
    const size_t name_len = strlen(name);
    nic->name = malloc(name_len + 1);
    nic->mrs = calloc(net->cfg.max_mrs, sizeof *nic->mrs);
    nic->conns = calloc(net->cfg.max_conns, sizeof *nic->conns);
    nic->grant_pages = calloc((net->cfg.max_grants + SIM_NIC_GRANT_PAGE - 1) / SIM_NIC_GRANT_PAGE,
                              sizeof *nic->grant_pages);
    nic->cq_cap = net->cfg.cq_entries < SIM_NIC_CQ_INITIAL ? net->cfg.cq_entries
                                                            : SIM_NIC_CQ_INITIAL;
    nic->cq = malloc((size_t)nic->cq_cap * sizeof *nic->cq);
    if (nic->name == NULL || nic->mrs == NULL || nic->conns == NULL ||
        nic->grant_pages == NULL || nic->cq == NULL)
        goto fail;
    memcpy(nic->name, name, name_len + 1);
    int rc = kvs_fabric_init(&nic->base, net->cfg.no_key_grant ? &sim_nic_ops_v3 : &sim_nic_ops,
                             nic->name);
    assert(rc == KVS_OK);
    (void)rc;
    nic->net = net;
    nic->gpu = gpu;
    nic->slot = slot;
    nic->gen = net->nic_gen[slot];
    nic->tx_head = nic->tx_tail = nic->tx_rec = SIM_NIL;
    nic->grants_free = SIM_NIL;
    nic->link_up = true;
    net->nics[slot] = nic;
    net->nic_count++;
    *out = nic;
    return KVS_OK;
fail:
    free(nic->cq);
    free(nic->grant_pages);
    free(nic->conns);
    free(nic->mrs);
    free(nic->name);
    free(nic);
    return KVS_ENOMEM;
}

void sim_nic_destroy(sim_nic_t *nic)
{
    if (nic == NULL)
        return;
    sim_net_t *net = nic->net;
    /* TX: cancel the turn in progress, drop the queued writes. Their
     * segments already on the wire find the sender gone and stop. */
    if (nic->tx_rec != SIM_NIL) {
        const sim_rec_t rec = net->recs[nic->tx_rec];
        assert(rec.kind == REC_TX);
        (void)sim_engine_cancel(net->eng, rec.ev_id);
        sim_rec_free(net, nic->tx_rec);
        nic->tx_rec = SIM_NIL;
        net->wrs[rec.a].failed = true;
        sim_wr_release(net, (uint32_t)rec.a);
    }
    while (nic->tx_head != SIM_NIL) {
        const uint32_t w = nic->tx_head;
        nic->tx_head = net->wrs[w].next;
        net->wrs[w].next = SIM_NIL;
        net->wrs[w].in_tx = false;
        net->wrs[w].failed = true;
        sim_wr_release(net, w);
    }
    nic->tx_tail = SIM_NIL;
    /* Unpolled messages go back to the pool. */
    for (uint32_t i = 0; i < nic->cq_len; i++) {
        const sim_cqe_t *e = &nic->cq[(nic->cq_head + i) % nic->cq_cap];
        if (e->kind == KVS_COMPLETION_RECV)
            sim_msg_free(net, e->msg);
    }
    /* Peers' connections to it die: later posts on them fail with KVS_EPEER. */
    for (uint32_t s = 0; s < SIM_NET_MAX_NICS; s++) {
        sim_nic_t *other = net->nics[s];
        if (other == NULL || other == nic)
            continue;
        for (uint32_t i = 0; i < net->cfg.max_conns; i++) {
            kvs_conn_t *c = &other->conns[i];
            if (c->live && c->peer == nic)
                sim_conn_kill(c);
        }
    }
    net->nics[nic->slot] = NULL;
    net->nic_gen[nic->slot]++;
    net->nic_count--;
    free(nic->cq);
    for (uint32_t p = 0; p * SIM_NIC_GRANT_PAGE < net->cfg.max_grants; p++)
        free(nic->grant_pages[p]); /* live grants go with their NIC, as its MRs */
    free(nic->grant_pages);
    free(nic->conns);
    free(nic->mrs);
    free(nic->name);
    free(nic);
}

kvs_fabric_t *sim_nic_fabric(sim_nic_t *nic) { return nic != NULL ? &nic->base : NULL; }

sim_nic_t *sim_nic_from_fabric(kvs_fabric_t *fab)
{
    if (fab == NULL || fab->ops.mr_register != sim_nic_mr_register)
        return NULL;
    return KVS_CONTAINER_OF(fab, sim_nic_t, base);
}

void sim_nic_set_span(sim_nic_t *nic, sim_span_fn fn, void *ctx)
{
    nic->span = fn;
    nic->span_ctx = ctx;
}

void sim_nic_set_wake(sim_nic_t *nic, sim_nic_wake_fn fn, void *ctx)
{
    nic->wake = fn;
    nic->wake_ctx = ctx;
}

uint64_t sim_nic_writes(const sim_nic_t *nic) { return nic->writes; }

uint64_t sim_nic_write_bytes(const sim_nic_t *nic) { return nic->write_bytes; }

uint64_t sim_nic_msgs(const sim_nic_t *nic) { return nic->msgs; }

uint64_t sim_nic_posts_refused(const sim_nic_t *nic) { return nic->posts_refused; }

uint32_t sim_nic_grants_live(const sim_nic_t *nic) { return nic->grants_live; }

uint64_t sim_nic_grants_made(const sim_nic_t *nic) { return nic->grants_made; }

uint64_t sim_nic_grants_revoked(const sim_nic_t *nic) { return nic->grants_revoked; }

uint64_t sim_nic_planted_landed_bytes(const sim_nic_t *nic)
{
    return nic->planted_landed_bytes;
}

void sim_nic_set_link_up(sim_nic_t *nic, bool up) { nic->link_up = up; }

void sim_nic_set_write_error(sim_nic_t *nic, uint32_t num, uint32_t den)
{
    nic->write_error_num = num;
    nic->write_error_den = den;
}

void sim_nic_set_msg_filter(sim_nic_t *nic, sim_msg_filter_fn fn, void *ctx)
{
    nic->msg_filter = fn;
    nic->msg_filter_ctx = ctx;
}

sim_rng_t *sim_net_fault_rng(sim_net_t *net) { return &net->fault_rng; }

void sim_nic_fail_next_writes(sim_nic_t *nic, uint32_t count)
{
    nic->fail_next_writes = count;
}

void sim_nic_set_write_hook(sim_nic_t *nic, sim_nic_write_hook_fn fn, void *ctx)
{
    nic->write_hook = fn;
    nic->write_hook_ctx = ctx;
}
