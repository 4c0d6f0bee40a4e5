/*
 * nic_model.h (internal) - the simulated NIC as its two files share it:
 * fabric.c (the kvs_fabric ops table the core calls, and the NIC's and
 * net's lifetime) and nic_model.c (the wire, ports, pools and completion
 * queues under it). Here: the structs of a NIC, its connections, MRs and
 * grants, the writes, messages and event records in flight, the lookups
 * both files use (inline) and what nic_model.c offers the ops table.
 * Calls go one way: fabric.c -> nic_model.c.
 */
#ifndef KVS_SIM_NIC_MODEL_H
#define KVS_SIM_NIC_MODEL_H

#include "fabric.h"

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static inline uint64_t sim_add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static inline uint64_t sim_net_now(const sim_net_t *net) { return sim_engine_now_ns(net->eng); }


static inline sim_nic_t *sim_net_nic(const sim_net_t *net, uint32_t slot, uint32_t gen)
{
    if (slot >= SIM_NET_MAX_NICS || net->nics[slot] == NULL || net->nic_gen[slot] != gen)
        return NULL;
    return net->nics[slot];
}

/* The connection if its NIC is alive and the slot was not freed since. */
static inline kvs_conn_t *sim_net_conn(const sim_net_t *net, uint32_t slot, uint32_t gen,
                                kvs_conn_t *conn, uint32_t conn_gen)
{
    if (conn == NULL || sim_net_nic(net, slot, gen) == NULL)
        return NULL;
    return conn->live && conn->gen == conn_gen ? conn : NULL;
}

static inline bool sim_nic_owns(const void *base, size_t elem_bytes, uint32_t count, const void *p)
{
    const uintptr_t b = (uintptr_t)base, q = (uintptr_t)p;
    if (p == NULL || q < b)
        return false;
    const uintptr_t off = q - b;
    return off % elem_bytes == 0 && off / elem_bytes < count;
}

static inline kvs_conn_t *sim_nic_conn_of(const sim_nic_t *nic, kvs_conn_t *conn)
{
    if (!sim_nic_owns(nic->conns, sizeof *conn, nic->net->cfg.max_conns, conn) || !conn->live)
        return NULL;
    return conn;
}

static inline kvs_mr_t *sim_nic_mr_of(const sim_nic_t *nic, kvs_mr_t *mr)
{
    if (!sim_nic_owns(nic->mrs, sizeof *mr, nic->net->cfg.max_mrs, mr) || !mr->live)
        return NULL;
    return mr;
}

static inline kvs_grant_t *sim_nic_grant_at(const sim_nic_t *nic, uint32_t i)
{
    assert(i < nic->grants_fresh);
    return &nic->grant_pages[i / SIM_NIC_GRANT_PAGE][i % SIM_NIC_GRANT_PAGE];
}

/* The slot of g among this NIC's grants, SIM_NIL when it is none of them. */
static inline uint32_t sim_nic_grant_index(const sim_nic_t *nic, const kvs_grant_t *g)
{
    const uint32_t pages = (nic->grants_fresh + SIM_NIC_GRANT_PAGE - 1) / SIM_NIC_GRANT_PAGE;
    for (uint32_t p = 0; p < pages; p++)
        if (sim_nic_owns(nic->grant_pages[p], sizeof *g, SIM_NIC_GRANT_PAGE, g))
            return p * SIM_NIC_GRANT_PAGE +
                   (uint32_t)(g - nic->grant_pages[p]);
    return SIM_NIL;
}

/* The live grant of this NIC with key rkey, or NULL. */
static inline const kvs_grant_t *sim_nic_grant_by_key(const sim_nic_t *nic, uint64_t rkey)
{
    for (uint32_t i = 0; i < nic->grants_fresh; i++) {
        const kvs_grant_t *g = sim_nic_grant_at(nic, i);
        if (g->live && g->rkey == rkey)
            return g;
    }
    return NULL;
}


static inline sim_msg_t *sim_msg_at(sim_net_t *net, uint32_t m)
{
    assert(m < net->msgs_cap);
    return &net->msg_pages[m / SIM_NET_MSG_PAGE][m % SIM_NET_MSG_PAGE];
}

/* ------------------------------------------------------------------------ */
/* What nic_model.c offers the ops table                                     */
/* ------------------------------------------------------------------------ */

/* The pools (indices stay valid as they grow): event records, writes (a
 * write is freed when its last reference is dropped) and messages. */
void sim_rec_free(sim_net_t *net, uint32_t r);
int sim_wr_alloc(sim_net_t *net, uint32_t *out);
void sim_wr_release(sim_net_t *net, uint32_t w);
int sim_msg_alloc(sim_net_t *net, uint32_t *out);
void sim_msg_free(sim_net_t *net, uint32_t m);
/* Schedules a fabric event of `kind` (enum sim_rec_kind) at at_ns;
 * *out_rec (may be NULL) gets its record. */
int sim_net_schedule(sim_net_t *net, uint64_t at_ns, uint8_t kind, uint64_t a, uint64_t b,
                     uint64_t c, uint32_t *out_rec);
/* Pushes a completion. Returns true when the owner should be woken (the
 * completion was queued, or the NIC just became errored). An overrun is
 * fatal for the NIC; a RECV's message is freed if it was not queued. */
bool sim_nic_push(sim_nic_t *nic, const sim_cqe_t *e);
/* Wakes the NIC's owner (sim_nic_set_wake), if any; nic may be NULL. */
void sim_nic_wake(sim_nic_t *nic);
/* Starts TX service turns while the port is idle and writes wait. */
void sim_nic_tx_kick(sim_nic_t *nic);

#endif
