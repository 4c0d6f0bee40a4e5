/*
 * hw_ofi.h (internal) - the types shared by the files of the ofi fabric
 * (hw/ofi/): the fabric instance, its connections, registrations, requests
 * and receive buffers, and the cross-file hw_ofi_ functions.
 *
 * Files: lib.c (libfabric, opened at create), fabric.c (provider choice,
 * the ops table, create, destroy),
 * boot.c (the TCP bootstrap: listener, HELLO, liveness, connection states),
 * conn.c (its side of hw/net's connection table: sockets, deaths),
 * mr.c (registration, split pieces, key tables and their KEYS/DROP
 * messages), grant.c (region-scoped keys: key_grant, key_revoke), post.c (write, send, the queue of requests the provider
 * refused for now), poll.c (completions, deaths, wait_arm).
 *
 * Every message on the endpoint opens with an 8-byte header: kind (u8),
 * version (u8), 0 (u16), the receiver's connection token (u32). A token is
 * slot | generation << 16, so a message or write for a connection that has
 * since been replaced is dropped.
 *
 * The immediate of a write reaches the peer one of two ways, chosen at
 * create by the provider's remote CQ data (kvs_ofi_info_t.cq_data_bytes):
 * - 8 bytes or more (tcp, shm): the write's remote CQ data is token << 32
 *   | imm, so the completion of the write itself names the connection.
 * - fewer (verbs;ofi_rxm and efa carry 4, iWARP verbs 0): an IMM message,
 *   posted once every piece of the write completed (delivery complete),
 *   carries the immediate; its header names the connection. Not the
 *   source address of the completion (FI_SOURCE): ofi_rxm writes its
 *   remote-write completions without one, and fi_cq_readfrom then hands
 *   out whatever address its queue slot held before (fabric.c).
 * A receiver takes both, whichever way it sends.
 */
#ifndef KVS_HW_OFI_H
#define KVS_HW_OFI_H

#include <kvstage/ofi.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "conn_table.h"
#include "handles.h"
#include "mr_table.h"
#include "net_util.h"
#include "rkeys.h"
#include "waitset.h"

#define HW_OFI_WIRE_VERSION 2u /* 2: IMM messages */
#define HW_OFI_HDR_BYTES 8u
#define HW_OFI_MSG_BYTES (HW_OFI_HDR_BYTES + KVS_CONTROL_MSG_MAX_BYTES)
#define HW_OFI_NAME_MAX 256u        /* endpoint address bytes (fi_getname) */
#define HW_OFI_WHY_BYTES 200
#define HW_OFI_GRACE_NS 200000000u  /* a peer's socket ended: wait this long for its BYE */
#define HW_OFI_DRAIN_NS 200000000u  /* destroy waits at most this long for its BYEs */
#define HW_OFI_MAX_SLOTS 65535u
/* The keys of the fds in the fabric's wait set (waits): the boot set's, the CQ's. */
#define HW_OFI_WAIT_BOOT 0u
#define HW_OFI_WAIT_CQ 1u

/* ---- libfabric itself (lib.c) ------------------------------------------ */

/* The libfabric functions the fabric calls, from libfabric.so.1 opened at
 * create (lib.c says why it is not linked). */
typedef struct hw_ofi_lib {
    int (*getinfo)(uint32_t version, const char *node, const char *service, uint64_t flags,
                   const struct fi_info *hints, struct fi_info **info);
    void (*freeinfo)(struct fi_info *info);
    struct fi_info *(*dupinfo)(const struct fi_info *info);
    int (*fabric)(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
    const char *(*strerror)(int errnum);
} hw_ofi_lib_t;

/* Opens libfabric (once per process it loads; later opens find it) and
 * fills lib. KVS_EBACKEND with `why` saying what to install otherwise. */
int hw_ofi_lib_open(hw_ofi_lib_t *lib, char *why, size_t why_bytes);

/* Kinds of message on the endpoint. */
enum hw_ofi_kind {
    HW_OFI_MSG_USER = 0, /* the user's control message */
    HW_OFI_MSG_KEYS = 1, /* some piece keys of a registration */
    HW_OFI_MSG_DROP = 2, /* a registration was deregistered */
    HW_OFI_MSG_BYE = 3,  /* the sender disconnects on purpose */
    HW_OFI_MSG_IMM = 4   /* the immediate of a write whose bytes all landed (u32) */
};

typedef struct hw_ofi_fabric hw_ofi_fabric_t;

/* ---- registrations (mr.c) ------------------------------------------------- */

/* net.id is the handle peers name it by; net.grants counts the live
 * grants inside it (grant.c). */
struct kvs_mr {
    hw_net_mr_t net;        /* first: the table's part (hw/net/mr_table.h) */
    struct fid_mr **pieces;
    void **descs;           /* fi_mr_desc of each piece */
    uint64_t *keys;         /* fi_mr_key of each piece */
    bool sealed;            /* mr_register_sealed: no FI_REMOTE_WRITE, keys never sent */
};

int hw_ofi_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                       uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);
int hw_ofi_mr_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                              uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);
int hw_ofi_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr);
void hw_ofi_mr_free_all(hw_ofi_fabric_t *f);
/* Registers a buffer of the fabric's own (send and receive rings) in one
 * piece; *desc NULL when the provider needs no local descriptors. */
int hw_ofi_mr_own(hw_ofi_fabric_t *f, void *buf, size_t len, uint64_t access,
                  struct fid_mr **out, void **desc, char *why, size_t why_bytes);
/* One fi_mr_reg (and bind, enable) with the modes the provider asked for;
 * a negative libfabric code on failure. */
int hw_ofi_mr_reg_one(hw_ofi_fabric_t *f, void *buf, size_t len, uint64_t access,
                      struct fid_mr **out);
/* Sends the KEYS messages of r (piece i's key: key_of(ctx, i)) on conn. */
int hw_ofi_keys_send(kvs_conn_t *conn, const hw_rkeys_reg_t *r, hw_rkeys_key_fn key_of,
                     const void *ctx);
/* Sends DROP of registration or grant id on conn (best effort: ids are
 * never reused, so a DROP lost leaves an entry that opens nothing). */
void hw_ofi_drop_send(kvs_conn_t *conn, uint32_t id);
/* A KEYS or DROP message of the peer. */
void hw_ofi_keys_recv(kvs_conn_t *conn, uint32_t kind, const uint8_t *msg,
                      uint32_t len_bytes);
/* Sends the key tables of every live registration on conn. */
int hw_ofi_keys_push_all(kvs_conn_t *conn);
/* Send slots pushing every live registration to one peer takes. */
uint32_t hw_ofi_keys_msgs_all(hw_ofi_fabric_t *f);

/* ---- region-scoped keys (grant.c) ---------------------------------------- */

/* A grant: its own registration of exactly [addr, addr + len_bytes) inside
 * mr, whose key went to conn's peer only. */
struct kvs_grant {
    struct fid_mr *fmr;
    kvs_mr_t *mr;           /* the registration it lies in (mr->grants counts it) */
    kvs_conn_t *conn;       /* whose peer holds the key */
    uint32_t conn_gen;      /* conn's generation then: DROP only to that peer */
    uint32_t id;            /* the kvstage rkey handed out, in KEYS and DROP */
    uint64_t addr;
    uint64_t len_bytes;
    bool live;
};

int hw_ofi_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                     uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey);
int hw_ofi_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant);
/* At create: whether the provider's MR checks were verified to refuse a
 * write outside a registration and after its fi_close; says once (log)
 * when not, and key_grant then answers KVS_ENOTSUP. */
void hw_ofi_grant_check(hw_ofi_fabric_t *f);
/* Closes every live grant (fabric teardown). */
void hw_ofi_grant_free_all(hw_ofi_fabric_t *f);

/* ---- connections (boot.c) ------------------------------------------------- */

/* A connection's states beyond the shared FREE, UP and DEAD (conn_table.h). */
typedef enum hw_ofi_conn_state {
    HW_OFI_CONN_HELLO = HW_NET_CONN_OWN, /* passive: accepted, reading the peer's HELLO */
    HW_OFI_CONN_CONNECTING  /* active: HELLO sent, waiting for the answer */
} hw_ofi_conn_state_t;

/* HELLO on the bootstrap socket, both ways: magic, version, status (0 or
 * a refusal, then `name` holds the reason), token, name length (u32 each),
 * the provider (32 bytes, NUL-padded), the endpoint address. */
#define HW_OFI_HELLO_MAGIC 0x4f53564bu /* "KVSO" little-endian */
#define HW_OFI_PROV_BYTES 32u
#define HW_OFI_HELLO_BYTES (20u + HW_OFI_PROV_BYTES + HW_OFI_NAME_MAX)

/* The slot, generation, state, reason of a failure and the peer's name
 * are the table's (net); the rest is the bootstrap's and the keys'. */
struct kvs_conn {
    hw_net_conn_t net;        /* first: the table's part (hw/net/conn_table.h) */
    hw_ofi_fabric_t *fab;
    bool peer_gone;           /* its socket ended: DEAD at gone_ns unless BYE first */
    bool in_av;               /* peer_addr is in the address vector */
    int sock;                 /* bootstrap socket, -1: none */
    uint32_t peer_token;      /* the peer's token for this connection */
    fi_addr_t peer_addr;
    uint64_t gone_ns;         /* peer_gone: when to give up waiting for its BYE */
    uint8_t hello[HW_OFI_HELLO_BYTES]; /* HELLO: bytes read so far */
    uint32_t hello_got;
    hw_rkeys_t rkeys;         /* the peer's registrations (rkeys.h) */
};
_Static_assert(offsetof(struct kvs_conn, net) == 0, "the table's part comes first");

int hw_ofi_listen(hw_ofi_fabric_t *f, char *why, size_t why_bytes);
int hw_ofi_connect(kvs_fabric_t *fab, const char *peer, kvs_conn_t **out);
void hw_ofi_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn);
/* Accepts peers, reads HELLOs and notices sockets that ended, without
 * blocking (the drain of the boot wait set). */
void hw_ofi_boot_progress(hw_ofi_fabric_t *f);
/* ---- the connection table (conn.c, over hw/net/conn_table.h) ---------- */

/* A FREE slot made a new connection in `state` (next generation, no
 * socket), or NULL when every slot is taken. */
kvs_conn_t *hw_ofi_conn_alloc(hw_ofi_fabric_t *f, hw_ofi_conn_state_t state);
/* Closes conn's bootstrap socket, if it has one, and stops watching it. */
void hw_ofi_conn_sock_close(kvs_conn_t *conn);
/* Fails conn for good: `status` and the reason for later posts; poll
 * reports its pending operations and then DISCONNECT. */
void hw_ofi_conn_fail(kvs_conn_t *conn, int status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Frees what conn holds (socket, address, key tables); the slot is FREE. */
void hw_ofi_conn_free(kvs_conn_t *conn);
/* Peers whose socket ended and whose grace passed become DEAD. */
void hw_ofi_conn_tick(hw_ofi_fabric_t *f, uint64_t now);

/* ---- requests and posting (post.c) --------------------------------------- */

typedef enum hw_ofi_req_kind {
    HW_OFI_REQ_FREE = 0,
    HW_OFI_REQ_WRITE,       /* a piece of a write */
    HW_OFI_REQ_SEND         /* a message from a send slot */
} hw_ofi_req_kind_t;

/* One operation of the user (a write or a send) or a fabric-internal send. */
typedef struct hw_ofi_op {
    uint64_t wr_id;
    kvs_conn_t *conn;
    uint32_t conn_gen;
    uint32_t outstanding;   /* its requests not completed yet */
    int32_t deferred;       /* request posted once the others completed, -1: none */
    int status;             /* first error among its requests */
    uint8_t kind;           /* KVS_COMPLETION_WRITE or _SEND */
    bool internal;          /* no user completion */
    bool reported;          /* completed to the user (EPEER for a dead conn) */
    bool live;
} hw_ofi_op_t;

/* One request to the provider. The context comes first: providers that
 * want FI_CONTEXT / FI_CONTEXT2 use it. */
typedef struct hw_ofi_req {
    struct fi_context2 ctx;
    uint32_t op;            /* index into ops */
    uint8_t kind;           /* hw_ofi_req_kind_t */
    bool with_data;
    uint32_t slot;          /* SEND: its send slot */
    uint32_t next;          /* WRITE: the op's next request, UINT32_MAX: last */
    uint32_t len;
    uint64_t laddr;
    void *desc;
    uint64_t raddr, rkey, data;
} hw_ofi_req_t;

int hw_ofi_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc);
int hw_ofi_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                uint64_t wr_id);
/* A fabric-internal message (KEYS, DROP, BYE) on conn. */
int hw_ofi_send_internal(kvs_conn_t *conn, uint32_t kind, const void *msg,
                         uint32_t len_bytes);
/* Posts what waits in the queue, in order, until the provider refuses. */
void hw_ofi_backlog_flush(hw_ofi_fabric_t *f);
/* A request completed (status KVS_OK or an error): frees it; when it was
 * its op's last, the op goes on the done queue (poll reports it). */
void hw_ofi_req_done(hw_ofi_fabric_t *f, uint32_t req, int status);
void hw_ofi_op_free(hw_ofi_fabric_t *f, uint32_t op);
/* Checks that conn can take operations; KVS_EPEER / KVS_EINVAL with the
 * fabric's message set otherwise. */
int hw_ofi_check_conn(hw_ofi_fabric_t *f, kvs_conn_t *conn, const char *op);

/* ---- completions (poll.c) ------------------------------------------------- */

int hw_ofi_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max);
int hw_ofi_wait_arm(kvs_fabric_t *fab, int *out_fd, uint64_t *out_wake_ns);
/* Posts receive buffer i again. */
int hw_ofi_post_recv(hw_ofi_fabric_t *f, uint32_t i);
/* Before the endpoint closes: polls (reporting nothing) until no request
 * of ours is in flight and two looks in a row found nothing, or until
 * deadline_ns. So the BYEs just sent go out, and the provider takes in
 * what its peers did meanwhile before it tears its connections down
 * (ofi_rxm over verbs crashes in fi_close on a message left unread:
 * fabric.c, hw_ofi_check_rxm_verbs). */
void hw_ofi_drain(hw_ofi_fabric_t *f, uint64_t deadline_ns);

/* ---- the fabric (fabric.c) ------------------------------------------------ */

typedef struct hw_ofi_rx {
    struct fi_context2 ctx; /* first */
    uint32_t index;
} hw_ofi_rx_t;

struct hw_ofi_fabric {
    kvs_fabric_t base;       /* first: recovered with KVS_CONTAINER_OF */
    kvs_ofi_config_t cfg;    /* copied; strings point into the owned copies below */
    char provider_want[32];
    char bind_addr[64];
    char name[80];           /* "ofi:tcp;ofi_rxm" for messages */
    char address[80];        /* "IP:port" of the bootstrap listener */
    hw_ofi_lib_t lib;        /* libfabric's functions (lib.c) */
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    uint64_t mr_mode;
    uint32_t cq_data_bytes;
    bool imm_in_msg;         /* immediates travel in IMM messages (cq_data_bytes < 8) */
    uint64_t max_write_bytes;
    uint64_t max_mr_bytes;
    uint8_t ep_name[HW_OFI_NAME_MAX];
    size_t ep_name_len;
    int cq_fd;               /* fi_control FI_GETWAIT, -1: none */
    hw_net_waitset_t boot;   /* the listener and connection sockets (boot.c's keys) */
    hw_net_waitset_t waits;  /* cq_fd and boot's fd (wait_arm); zeroed: none yet */
    int listen_fd;
    kvs_conn_t *conns;       /* max_conns */
    hw_net_conns_t connt;    /* the table over conns */
    uint32_t deaths;         /* DEAD connections not yet told (poll) */
    kvs_mr_t *mrs;           /* max_mrs */
    hw_net_mrs_t mrt;        /* the table over mrs (ids: grants' too) */
    kvs_grant_t *grants;     /* max_grants */
    uint32_t live_grants;
    bool grants_ok;          /* the provider's MR checks were verified (grant.c) */
    uint64_t next_key;       /* requested keys without FI_MR_PROV_KEY */
    /* operations and requests: tx_depth each, free lists as stacks */
    hw_ofi_op_t *ops;
    uint32_t *op_free;
    uint32_t op_nfree;
    hw_ofi_req_t *reqs;
    uint32_t *req_free;
    uint32_t req_nfree;
    uint32_t *backlog;       /* ring of request indices the provider refused for now */
    uint32_t bl_head, bl_used;
    uint32_t *done;          /* ring of ops whose requests all completed */
    uint32_t done_head, done_used;
    /* control messages: send slots of HW_OFI_MSG_BYTES, one registration */
    uint8_t *sbuf;
    struct fid_mr *smr;
    void *sdesc;
    uint32_t *slot_free;
    uint32_t slot_nfree;
    /* receives */
    uint8_t *rbuf;
    struct fid_mr *rmr;
    void *rdesc;
    hw_ofi_rx_t *rx;
};

/* The ops table's entries are called with this backend's fabric only:
 * they recover it without a check (public calls taking any kvs_fabric_t
 * check first: hw_ofi_try in fabric.c). Inline, so the files under
 * fabric.c do not call back up into it. */
static inline hw_ofi_fabric_t *hw_ofi_of(kvs_fabric_t *fab)
{
    return KVS_CONTAINER_OF(fab, hw_ofi_fabric_t, base);
}
/* The piece of a registration an address falls in: inline
 * (hw/net/handles.h), so every file of the fabric uses it without calling
 * the others (connections: hw_net_conns_of; registrations: hw_net_mrs_of). */
/* Local descriptor and bytes left in the piece holding addr (inside mr). */
static inline void hw_ofi_mr_piece(const kvs_mr_t *mr, uint64_t addr, void **desc,
                                   uint64_t *left)
{
    *desc = mr->descs[hw_piece_at(addr - mr->net.addr, mr->net.piece_bytes, mr->net.npieces,
                                  mr->net.len_bytes, left)];
}
/* libfabric's negative return as a kvstage status (status.c). */
int hw_ofi_status(int fi_rc);

#endif
