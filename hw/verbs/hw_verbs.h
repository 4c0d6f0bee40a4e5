/*
 * hw_verbs.h (internal) - the types shared by the files of the verbs fabric
 * (hw/verbs/): the fabric instance, its connections, registrations and
 * send-queue bookkeeping, and the cross-file hw_verbs_ functions.
 *
 * Files: select.c (device, port, GID choice), topology.c (where devices
 * sit on PCIe, read from sysfs), status.c (verbs codes to
 * kvstage codes), dmabuf.c (CUDA memory as dma-buf), mr.c (registration,
 * split MRs and their key tables), conn.c (rdma_cm, queue pairs, MTU
 * agreement, recovery), conn_fail.c (a connection broken or failed),
 * post.c (write, send), sq.c (the send queue), poll.c (completions, wait),
 * grant.c (region-scoped keys as type-2 memory windows), fabric.c (the ops
 * table, create, destroy).
 *
 * Work request ids: bit 63 set for receives; bits 16..47 the connection's
 * token (hw/net/conn_table.h: its slot, and in bits 32..47 the generation
 * of its current queue pair), 0..15 the send-queue ring index or receive
 * buffer. A completion whose token names no current queue pair is dropped.
 */
#ifndef KVS_HW_VERBS_H
#define KVS_HW_VERBS_H

#include <kvstage/verbs.h>

#include "conn_table.h"
#include "handles.h"
#include "mr_table.h"
#include "net_util.h"
#include "rkeys.h"
#include "waitset.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HW_VERBS_MAGIC 0x5653564bu /* "KVSV" little-endian */
#define HW_VERBS_WIRE_VERSION 1u
#define HW_VERBS_MAX_SLOTS 65535u  /* connections, send and receive slots */
#define HW_VERBS_STASH 16
/* The keys of the wait set's fds: the completion channel, rdma_cm's. */
#define HW_VERBS_WAIT_CQ 0u
#define HW_VERBS_WAIT_CM 1u

/* Fabric-internal messages: SEND WITH IMM, the immediate says which. */
enum hw_verbs_ctrl {
    HW_VERBS_CTRL_KEYS = 1, /* some piece keys of a split registration */
    HW_VERBS_CTRL_DROP = 2, /* a split registration was deregistered */
    HW_VERBS_CTRL_BYE = 3   /* the sender disconnects on purpose */
};

/* Remote keys of a split registration: bit 63, the registration id in
 * bits 32..62, the first piece's key in 0..31 (for messages). */
#define HW_VERBS_RKEY_SPLIT (UINT64_C(1) << 63)

typedef struct hw_verbs_fabric hw_verbs_fabric_t;

/* ---- selection (select.c): pure, over a snapshot of the devices ---------- */

typedef struct hw_verbs_gid {
    uint8_t raw[16];
    int index;
    int type; /* IBV_GID_TYPE_IB, _ROCE_V1, _ROCE_V2 */
} hw_verbs_gid_t;

typedef struct hw_verbs_port_info {
    int state;      /* enum ibv_port_state */
    int link_layer; /* IBV_LINK_LAYER_* */
    int active_mtu; /* enum ibv_mtu */
    int gid_tbl_len;
    const hw_verbs_gid_t *gids; /* the valid entries */
    int ngids;
} hw_verbs_port_info_t;

/* Where a device sits on PCIe: its path below <sysfs>/devices from the host
 * bridge down ("pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/
 * 0000:1b:00.0"), and its NUMA node. */
typedef struct hw_verbs_pci {
    const char *path; /* NULL: no PCI device (soft-RoCE's rxe, siw) */
    int numa_node;    /* -1: unknown */
} hw_verbs_pci_t;

typedef struct hw_verbs_dev_info {
    const char *name;
    const hw_verbs_port_info_t *ports; /* ports[0] is port 1 */
    int nports;
    hw_verbs_pci_t pci; /* read only when a choice needs it (topology.c) */
} hw_verbs_dev_info_t;

/* The PCI device (a GPU) the RDMA device should be closest to. */
typedef struct hw_verbs_near {
    const char *bus_id; /* canonical, "0000:3b:00.0", for messages */
    hw_verbs_pci_t pci; /* path not NULL */
} hw_verbs_near_t;

#define HW_VERBS_REASON_BYTES 160

typedef struct hw_verbs_choice {
    int dev;           /* index into the snapshot */
    int port;          /* 1-based */
    int gid_index;
    char gid[48];      /* textual */
    char addr[48];     /* IP in the GID, "" when it holds none */
    /* why this device: "named by the caller", "first usable device",
     * "closest to PCI 0000:3b:00.0: same PCIe switch (below ...)" */
    char reason[HW_VERBS_REASON_BYTES];
} hw_verbs_choice_t;

/* Picks device, port and GID (rules in kvs_verbs_config_t). The device: the
 * named one (want_dev not NULL nor ""), else with near the closest to
 * near->pci (the longest shared chain of PCI bridges: the same switch before
 * the same root complex before the same NUMA node before any other; devices
 * without a PCI device never; ties to the first by name, the next of the
 * same closeness when the first is not usable, never a farther one), else
 * the first usable one. Returns KVS_OK with out->reason saying which rule
 * chose, or KVS_EBACKEND (nothing usable: no device, ports down, no usable
 * GID, no device on PCI) / KVS_EINVAL (a named device, port or GID index
 * that is wrong) with `why` saying what to change. */
int hw_verbs_select(const hw_verbs_dev_info_t *devs, int ndevs, const char *want_dev,
                    const hw_verbs_near_t *near, int want_port, int want_gid,
                    hw_verbs_choice_t *out, char *why, size_t why_bytes);

/* ---- PCI topology (topology.c): reads sysfs, decides nothing --------------- */

#define HW_VERBS_BUS_ID_BYTES 24

/* "0000:3b:00.0", "3B:00.0" (domain 0), "00000000:3B:00.0" (nvidia-smi)
 * into the sysfs form "0000:3b:00.0"; false when text is none of them. */
bool hw_verbs_bus_id_parse(const char *text, char *out, size_t out_bytes);

/* What topology.c read. near points into it: do not copy it. */
typedef struct hw_verbs_topo {
    char bus_id[HW_VERBS_BUS_ID_BYTES];
    hw_verbs_near_t near;
    char **paths; /* owned: the devices' and near's PCI paths */
    int npaths;
} hw_verbs_topo_t;

/* Reads from sysfs (sysfs_root; NULL: "/sys") where PCI device bus_id sits
 * (t->near) and where each of devs[0..ndevs) sits (devs[d].pci: path NULL
 * when it has no PCI device). The strings belong to t until
 * hw_verbs_topo_free (also after a failure). KVS_EINVAL when bus_id is no
 * bus id or not in sysfs, KVS_EBACKEND when the root cannot be read, with
 * `why` saying what to change. */
int hw_verbs_topo_read(const char *sysfs_root, const char *bus_id, hw_verbs_dev_info_t *devs,
                       int ndevs, hw_verbs_topo_t *t, char *why, size_t why_bytes);
void hw_verbs_topo_free(hw_verbs_topo_t *t);
/* The GID as IPv6 text. */
void hw_verbs_gid_text(const uint8_t raw[16], char *text, size_t text_bytes);
/* The IP address a RoCE GID holds: dotted IPv4 for an IPv4-mapped GID,
 * else IPv6 text; false (and "") for a zero GID. */
bool hw_verbs_gid_addr(const uint8_t raw[16], char *addr, size_t addr_bytes);
uint32_t hw_verbs_mtu_bytes(int ibv_mtu);
int hw_verbs_mtu_enum(uint32_t bytes); /* largest enum ibv_mtu <= bytes; 0 below 256 */

/* ---- status translation (status.c) --------------------------------------- */

int hw_verbs_wc_status(enum ibv_wc_status st);
const char *hw_verbs_wc_advice(enum ibv_wc_status st);
int hw_verbs_errno_status(int err);

/* ---- registrations (mr.c) ------------------------------------------------- */

/* net.id names a split registration in its rkey; net.grants counts the
 * live grants (grant.c) into it. */
struct kvs_mr {
    hw_net_mr_t net;       /* first: the table's part (hw/net/mr_table.h) */
    uint64_t rkey;         /* what the peer writes with */
    struct ibv_mr **pieces;
    bool dmabuf;
};

/* sealed: without remote access of its own, only memory windows open it
 * (mr_register_sealed); never split into pieces. */
int hw_verbs_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                         uint64_t len_bytes, bool sealed, kvs_mr_t **out, uint64_t *out_rkey);
int hw_verbs_mr_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);
int hw_verbs_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr);
void hw_verbs_mr_free_all(hw_verbs_fabric_t *f);
/* Handles a KEYS or DROP message of the peer. A message the connection
 * cannot go on after (an unknown kind, a malformed or overfull table)
 * returns its status with why filled; the caller fails the connection. */
int hw_verbs_keys_recv(hw_verbs_fabric_t *f, kvs_conn_t *conn, uint32_t kind,
                       const uint8_t *msg, uint32_t len_bytes, char *why, size_t why_bytes);
/* Sends the key tables of every live split registration on conn. */
int hw_verbs_keys_push_all(hw_verbs_fabric_t *f, kvs_conn_t *conn);

/* ---- dma-buf (dmabuf.c) ---------------------------------------------------- */

typedef struct hw_verbs_cuda hw_verbs_cuda_t;
/* Loads libcuda.so.1 if present; NULL when it is not (no error). */
hw_verbs_cuda_t *hw_verbs_cuda_open(void);
void hw_verbs_cuda_close(hw_verbs_cuda_t *cuda);
/* A kvs_verbs_dmabuf_fn; ctx is a hw_verbs_cuda_t (or NULL: KVS_ENOTSUP). */
int hw_verbs_cuda_dmabuf(void *ctx, kvs_device_t *dev, uint64_t addr, uint64_t len_bytes,
                         int *out_fd, uint64_t *out_offset, char *err_msg, size_t err_bytes);

/* ---- connections (conn.c) -------------------------------------------------- */

/* A connection's states beyond the shared FREE, UP and DEAD (conn_table.h). */
typedef enum hw_verbs_conn_state {
    HW_CONN_RESOLVING = HW_NET_CONN_OWN, /* active: address and route */
    HW_CONN_CONNECTING,  /* active: request sent */
    HW_CONN_ACCEPTING,   /* passive: accepted, waiting for ESTABLISHED */
    HW_CONN_RECOVERING,  /* its QP failed: a new one is being set up (conn.c) */
    HW_CONN_CLOSING      /* disconnected by the user: reaping its requests */
} hw_verbs_conn_state_t;

typedef enum hw_verbs_op_kind {
    HW_OP_WRITE = 0,
    HW_OP_SEND = 1,
    HW_OP_INTERNAL = 2, /* fabric-internal send: no user completion */
    HW_OP_BIND = 3,     /* a memory window bound (grant.c): no user completion */
    HW_OP_INVAL = 4     /* a memory window invalidated before a rebind (grant.c) */
} hw_verbs_op_kind_t;

/* Whether requests of this kind end in a completion the user sees. */
static inline bool hw_verbs_op_reported(uint8_t kind)
{
    return kind == HW_OP_WRITE || kind == HW_OP_SEND;
}

typedef enum hw_verbs_sqe_state {
    HW_SQE_FREE = 0,
    HW_SQE_QUEUED,  /* accepted, not posted yet (the QP is being replaced) */
    HW_SQE_POSTED,  /* on the current QP */
    HW_SQE_REPOST,  /* flushed by a failed QP: goes again on the next one */
    HW_SQE_DONE     /* completed with `status`, waiting to be reported in order */
} hw_verbs_sqe_state_t;

/* One work request of the send queue, kept until reported so that it can
 * be posted again on a replacement QP. */
typedef struct hw_verbs_sqe {
    uint64_t wr_id;        /* the user's */
    uint64_t laddr;        /* source bytes (write: user memory; send: the ring) */
    uint64_t raddr;
    uint32_t len, lkey, rkey, imm;
    uint32_t send_end;     /* send ring head after this one's bytes */
    uint32_t send_bytes;   /* ring bytes it holds (with any skipped tail), 0 for writes */
    kvs_grant_t *grant;    /* HW_OP_BIND, HW_OP_INVAL: its grant; NULL once revoked */
    int status;            /* DONE: its result */
    uint8_t kind;          /* hw_verbs_op_kind_t */
    uint8_t opcode;        /* enum ibv_wr_opcode */
    uint8_t state;         /* hw_verbs_sqe_state_t */
    bool last;             /* the last work request of its operation */
} hw_verbs_sqe_t;

/* The slot, state, reason of a failure and the peer's name are the
 * table's (net); its generation moves on with each QP. */
struct kvs_conn {
    hw_net_conn_t net;       /* first: the table's part (hw/net/conn_table.h) */
    hw_verbs_fabric_t *fab;
    struct rdma_cm_id *id;
    struct ibv_qp *qp;
    /* a replaced QP that memory windows are still bound to: destroyed once
     * they are bound to the new one (rxe waits for a QP's last reference
     * when it is destroyed; a bound window is one) */
    struct ibv_qp *stale_qp;
    bool keys_pushed;
    bool recovering;         /* RESOLVING/CONNECTING/ACCEPTING again after a failure */
    bool peer_bye;           /* the peer disconnected on purpose: no recovery */
    bool bye_sent;           /* CLOSING: our BYE is on its way */
    uint64_t token;          /* names the connection in a reconnect request */
    uint32_t recoveries;     /* QPs replaced after a failure */
    uint64_t broken_ns;      /* when the current failure began (hw_net_now_ns) */
    int op_status;           /* first error among the current operation's requests */
    struct sockaddr_storage dst; /* active: the peer's address, for reconnects */
    int mtu;                 /* enum ibv_mtu agreed */
    uint64_t deadline_ns;    /* connect, recovery or close */
    uint64_t retry_ns;       /* recovery: next reconnect attempt */
    /* send queue: a ring in posting order */
    hw_verbs_sqe_t *sq;
    uint32_t sq_head, sq_used;
    uint32_t sq_posted;      /* on the current QP */
    /* control bytes in flight: a ring, freed in completion order */
    uint8_t *sbuf;
    struct ibv_mr *smr;
    uint32_t s_head, s_tail, s_used;
    /* receives */
    uint8_t *rbuf;
    struct ibv_mr *rmr;
    uint32_t rq_posted;
    /* the receive buffers of the replaced QP, for its completions still in
     * the CQ (generation prev_gen): nothing received is lost to a recovery */
    uint8_t *prev_rbuf;
    struct ibv_mr *prev_rmr;
    uint32_t prev_gen;
    hw_rkeys_t rkeys;           /* the peer's split registrations (rkeys.h) */
};
_Static_assert(offsetof(struct kvs_conn, net) == 0, "the table's part comes first");

/* Processes every pending rdma_cm event without blocking. */
int hw_verbs_cm_drain(hw_verbs_fabric_t *f);
int hw_verbs_connect(kvs_fabric_t *fab, const char *peer, kvs_conn_t **out);
void hw_verbs_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn);
/* Frees a conn and everything it holds. */
void hw_verbs_conn_free(kvs_conn_t *conn);
int hw_verbs_listen(hw_verbs_fabric_t *f, char *why, size_t why_bytes);
int hw_verbs_post_recv(kvs_conn_t *conn, uint32_t index);
/* Recovery and close timers, reconnect attempts; called by poll. */
void hw_verbs_conn_tick(hw_verbs_fabric_t *f);

/* ---- failing a connection (conn_fail.c) ------------------------------------ */

#define HW_VERBS_FLUSH_WAIT_NS 200000000u /* for the old QP's flushes before replacing it */
#define HW_VERBS_RETRY_WAIT_NS 200000000u /* between reconnect attempts */

/* Moves conn's QP, if it has one, to the error state: its requests flush. */
void hw_verbs_qp_error(kvs_conn_t *conn);
/* The connection's QP failed (an error completion, the peer's disconnect):
 * RECOVERING, a new QP replaces it and the flushed requests go again; the
 * first reason is kept for messages. Connections that cannot recover (still
 * connecting, closing, the peer said BYE) fail for good instead. */
void hw_verbs_conn_broken(kvs_conn_t *conn, int status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Fails conn for good: everything not yet completed completes with
 * `status`, later posts return KVS_EPEER with the reason. */
void hw_verbs_conn_fail(kvs_conn_t *conn, int status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* A BYE from the peer: it disconnected on purpose. */
void hw_verbs_conn_bye(kvs_conn_t *conn);

/* ---- write and send (post.c) ------------------------------------------------ */

int hw_verbs_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc);
int hw_verbs_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                  uint64_t wr_id);
/* Checks that conn can take operations; KVS_EPEER / KVS_EINVAL with the
 * fabric's message set otherwise. */
int hw_verbs_check_conn(hw_verbs_fabric_t *f, kvs_conn_t *conn, const char *op);

/* ---- the send queue (sq.c) ------------------------------------------------- */

/* One SEND of msg (len bytes, copied into the send buffer), SEND WITH IMM
 * `imm` when kind is HW_OP_INTERNAL; KVS_EAGAIN when the ring or the
 * buffer is full. */
int hw_verbs_post_msg(kvs_conn_t *conn, hw_verbs_op_kind_t kind, uint32_t imm,
                      const void *msg, uint32_t len, uint64_t wr_id);
/* Free entries of conn's ring. */
uint32_t hw_verbs_sq_room(const kvs_conn_t *conn);
/* Posts a fabric-internal message (KEYS, DROP, BYE) on conn. */
int hw_verbs_send_internal(kvs_conn_t *conn, uint32_t kind, const void *msg,
                           uint32_t len_bytes);
/* Whether requests go to the QP now (else they wait in the ring). */
bool hw_verbs_conn_ready(const kvs_conn_t *conn);
/* Posts every QUEUED and REPOST request in ring order (after a new QP is
 * up). */
void hw_verbs_sq_flush(kvs_conn_t *conn);
/* Appends a QUEUED request to conn's ring (the caller checked the room);
 * *index its ring index. */
hw_verbs_sqe_t *hw_verbs_sq_push(kvs_conn_t *conn, uint32_t *index);
/* Posts ring entries [first, first + count) that wait (QUEUED, REPOST). */
void hw_verbs_sq_post(kvs_conn_t *conn, uint32_t first, uint32_t count);
/* Ring index i of conn as a work request id. */
uint64_t hw_verbs_sq_wr_id(const kvs_conn_t *c, uint32_t i);
/* ---- completions (poll.c) ---------------------------------------------------- */

int hw_verbs_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max);
/* Takes what the CQ holds without reporting anything: send-queue
 * completions are marked in their rings, receives are kept (the stash) for
 * poll, in order; stops when the stash is full. How many it took, or a
 * negative status. */
int hw_verbs_cq_take_sends(hw_verbs_fabric_t *f);
int hw_verbs_wait(hw_verbs_fabric_t *f, int timeout_ms);
/* The ops table's wait_arm: consumes a pending completion event, arms the
 * CQ, and gives the wait set's fd over both channels and the earliest
 * timer of a recovering or closing connection (now when poll has
 * something to report already). */
int hw_verbs_wait_arm(kvs_fabric_t *fab, int *out_fd, uint64_t *out_wake_ns);

/* ---- region-scoped keys (grant.c) ------------------------------------------------ */

/* A grant: a type-2 memory window over [addr, addr + len_bytes) of one MR
 * piece, bound to its connection's queue pair. */
struct kvs_grant {
    struct ibv_mw *mw;     /* NULL once its connection was freed (deallocated then) */
    struct ibv_mr *own_mr; /* soft-RoCE: an MR of exactly the range (grant.c), or NULL */
    kvs_conn_t *conn;      /* NULL once freed */
    kvs_mr_t *mr;
    struct ibv_mr *piece;  /* the MR of mr holding the range */
    uint64_t addr, len_bytes;
    uint32_t rkey;         /* the key handed out */
    uint32_t mw_rkey;      /* the window's key in the device after the last bind that ran */
    bool live;
    bool bound;            /* a bind of it ran (on the current QP or a replaced one) */
    bool broken;           /* a bind or rebind failed: its key opens nothing */
};

int hw_verbs_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                       uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey);
int hw_verbs_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant);
/* conn's new QP is in RTS: its bound windows are invalidated and bound to
 * it again with the same keys, posted at once, ahead of everything waiting
 * in its ring (conn.c, before the peer learns that the QP is up). */
void hw_verbs_grants_rebind(kvs_conn_t *conn);
/* Whether a window is bound to conn's current QP (or may be). */
bool hw_verbs_grants_hold(const kvs_conn_t *conn);
/* conn is being freed: its windows are deallocated, its grants stay for
 * key_revoke (conn.c). */
void hw_verbs_grants_conn_gone(kvs_conn_t *conn);
/* Every window, at destroy. */
void hw_verbs_grants_free_all(hw_verbs_fabric_t *f);

/* ---- the fabric (fabric.c) --------------------------------------------------- */

struct hw_verbs_fabric {
    kvs_fabric_t base; /* first: recovered with KVS_CONTAINER_OF */
    kvs_verbs_config_t cfg; /* copied; strings point into the owned copies below */
    char device_name[64];
    char device_reason[HW_VERBS_REASON_BYTES]; /* why this device (select.c) */
    char near_pci[HW_VERBS_BUS_ID_BYTES];      /* canonical, when given with a name */
    char bind_addr[64];
    char address[80];        /* "IP:port" of the listener */
    char gid_text[48];
    int port;
    int gid_index;
    int port_mtu;            /* enum ibv_mtu: this side's cap */
    uint64_t max_mr_bytes;
    uint64_t max_write_bytes;
    struct ibv_context **devices; /* rdma_get_devices, freed at destroy */
    struct ibv_context *ctx;      /* the chosen one, borrowed from devices */
    struct ibv_pd *pd;
    struct ibv_comp_channel *cc;
    struct ibv_cq *cq;
    uint32_t cq_entries;
    bool cq_armed;
    struct rdma_event_channel *ch;
    hw_net_waitset_t waits;  /* cc->fd and ch->fd (wait_arm); zeroed: none yet */
    struct rdma_cm_id *listener;
    kvs_conn_t *conns;       /* max_conns */
    hw_net_conns_t connt;    /* the table over conns */
    kvs_mr_t *mrs;           /* max_mrs */
    hw_net_mrs_t mrt;        /* the table over mrs */
    kvs_grant_t *grants;     /* max_grants */
    uint32_t live_grants;
    bool mw_type2;           /* the device binds type-2 memory windows (device_cap_flags) */
    bool mw_own_mr;          /* its windows do not check their range: one MR per grant */
    struct ibv_send_wr *wrs; /* scratch for one operation: sq_depth */
    struct ibv_sge *sges;
    struct ibv_wc stash[HW_VERBS_STASH]; /* polled by wait, reported by poll */
    int nstash;
    hw_verbs_cuda_t *cuda;
};

/* The ops table's entries are called with this backend's fabric only:
 * they recover it without a check (public calls taking any kvs_fabric_t
 * check first: hw_verbs_try in fabric.c). Inline, so the files under
 * fabric.c do not call back up into it. */
static inline hw_verbs_fabric_t *hw_verbs_of(kvs_fabric_t *fab)
{
    return KVS_CONTAINER_OF(fab, hw_verbs_fabric_t, base);
}
uint64_t hw_verbs_now_ns(kvs_fabric_t *fab);

/* The piece of a registration an address falls in: inline
 * (hw/net/handles.h), so every file of the fabric uses it without calling
 * the others (connections: hw_net_conns_of; registrations: hw_net_mrs_of). */
/* Local key and bytes left in the piece holding addr (inside mr). */
static inline void hw_verbs_mr_piece(const kvs_mr_t *mr, uint64_t addr, uint32_t *lkey,
                                     uint64_t *left)
{
    *lkey = mr->pieces[hw_piece_at(addr - mr->net.addr, mr->net.piece_bytes, mr->net.npieces,
                                   mr->net.len_bytes, left)]->lkey;
}

#endif
