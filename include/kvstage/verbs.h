/*
 * verbs.h - the RDMA fabric backend of kvstage on libibverbs + librdmacm
 * (library kvstage_verbs, built where both are installed).
 *
 * A verbs fabric is a kvs_fabric_t: one RDMA device port and GID, one
 * protection domain, one completion queue, an rdma_cm listener, and one RC
 * queue pair per connection. What each ops slot does on verbs:
 * - mr_register: host memory with ibv_reg_mr; device (GPU) memory through a
 *   dma-buf (ibv_reg_dmabuf_mr) when the dma-buf exporter says it is device
 *   memory. A range larger than max_mr_bytes is split into several MRs; its
 *   remote key is then a handle the fabric resolves itself (the pieces' keys
 *   travel to every connected peer over the connection, before any message
 *   sent after the registration).
 * - connect(peer "IPv4:port", "[IPv6]:port" or "host:port"): rdma_cm,
 *   blocking until the connection is up or connect_timeout_ms passed. Both
 *   sides agree on the path MTU (the smaller of the two ports' and the
 *   route's). The peer must run a verbs fabric listening on that port.
 *   Connections made by peers are accepted inside poll/connect/wait; the
 *   first RECV or IMM completion of such a connection hands it to the user.
 * - write: RDMA WRITE (WITH IMM when asked), split into several work
 *   requests at max_write_bytes and at MR piece boundaries; one completion
 *   for the whole write. The IMM lands after all of the write's bytes.
 * - send: a control message of at most KVS_CONTROL_MSG_MAX_BYTES, copied at
 *   send() (the buffer can be reused at once), delivered in order on the
 *   connection into pre-posted receives.
 * - poll: never blocks; completions of writes and sends carry their status.
 *   An error completion (a wrong key or range at the peer) fails that
 *   operation (KVS_EREMOTE) and nothing else: RC moves both sides' queue
 *   pairs to the error state, so the fabric sets up new ones for the same
 *   kvs_conn_t (the connecting side reconnects, the accepting side takes
 *   it back) and posts again, in order, what the old ones flushed or what
 *   was posted meanwhile. Across such a recovery a message may arrive twice
 *   and a write may land twice (same bytes). A peer that is gone, or that
 *   does not come back within connect_timeout_ms, fails the connection for
 *   good: what is pending completes with KVS_EPEER, later posts return
 *   KVS_EPEER, and then poll reports one KVS_COMPLETION_DISCONNECT for the
 *   connection (disconnect it to free its slot). A disconnect tells the
 *   peer (BYE), whose side then fails at once. Other connections are never
 *   touched.
 * - now_ns: CLOCK_MONOTONIC.
 * - wait_arm: takes a completion event that already fired, arms the
 *   completion queue and gives one epoll fd, readable when the completion
 *   channel or the rdma_cm channel is, and as wake time the earliest timer
 *   of a recovering or closing connection (now when poll has something to
 *   report already: completions left over when out was full, a connection's
 *   death). Poll once more after arming before sleeping on it (backend.h).
 *
 * Threads: a fabric is used by one thread at a time (no locks inside);
 * different fabrics are independent.
 */
#ifndef KVSTAGE_VERBS_H
#define KVSTAGE_VERBS_H

#include <kvstage/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Exports [addr, addr + len_bytes) of device memory as a dma-buf for
 * registration: *out_fd (the fabric closes it after registering) and
 * *out_offset, the offset of addr inside that dma-buf. Returns KVS_OK,
 * KVS_ENOTSUP when addr is not device memory (the fabric then registers it
 * as host memory), or another status on failure (with a message in err_msg
 * of err_bytes).
 */
typedef int (*kvs_verbs_dmabuf_fn)(void *ctx, kvs_device_t *dev, uint64_t addr,
                                   uint64_t len_bytes, int *out_fd, uint64_t *out_offset,
                                   char *err_msg, size_t err_bytes);

#define KVS_VERBS_GID_AUTO (-1)

typedef struct kvs_verbs_config {
    /* RDMA device as ibv_devices lists it; NULL: the one closest to near_pci
     * when that is set, else the first device with an active port and a
     * usable GID. A name overrides near_pci. */
    const char *device;
    /* 1-based port; 0: the device's first active port. */
    int port;
    /* GID table index; KVS_VERBS_GID_AUTO: the first RoCE v2 GID that is
     * neither zero nor link-local, IPv4 first (IB ports: index 0). */
    int gid_index;
    /* Local IP address for rdma_cm; NULL: the address in the chosen GID
     * (RoCE). InfiniBand ports need it (the IPoIB address). */
    const char *bind_addr;
    /* TCP-like rdma_cm port to accept connections on; 0: any free port
     * (kvs_verbs_fabric_address tells which). */
    uint16_t listen_port;
    /* Bounds; 0 takes the default in brackets. */
    uint32_t max_conns;           /* connections, both directions [16] */
    uint32_t sq_depth;            /* work requests in flight per connection [1024] */
    uint32_t recv_depth;          /* pre-posted receives per connection [128] */
    uint32_t send_buf_bytes;      /* control bytes in flight per connection [256 KiB] */
    uint32_t max_mrs;             /* registrations [1024] */
    uint32_t max_mr_pieces;       /* MRs one registration may be split into [4096] */
    uint64_t max_mr_bytes;        /* largest MR [the device's max_mr_size] */
    uint64_t max_write_bytes;     /* largest work request [the port's max_msg_sz] */
    uint32_t max_mtu_bytes;       /* cap on the agreed path MTU, 256..4096 [the port's] */
    uint32_t connect_timeout_ms;  /* connect() gives up after this [10000] */
    /* Device memory exporter; NULL: CUDA through libcuda.so.1 when it loads
     * and knows the address, else every address is host memory. */
    kvs_verbs_dmabuf_fn dmabuf;
    void *dmabuf_ctx;
    /* PCI bus id of the device this fabric's data comes from (the rank's
     * GPU) as cudaDeviceGetPCIBusId or nvidia-smi give it ("0000:3b:00.0",
     * "00000000:3B:00.0"; "3b:00.0" is domain 0). With device NULL, the
     * fabric takes the RDMA device closest to it on PCIe, read from sysfs:
     * the longest shared chain of PCI bridges (the same PCIe switch, then
     * the same root complex), else the same NUMA node (numa_node), else any;
     * devices without a PCI device (soft-RoCE) never; ties go to the first
     * by name that is usable, never to a farther device. NULL: no topology
     * (a bus id that is not in sysfs is refused). */
    const char *near_pci;
    /* Where sysfs is mounted; NULL: "/sys". For tests (a fake tree). */
    const char *sysfs_root;
    /* Sink of the fabric's log: the device chosen and why, at
     * KVS_LOG_INFO. fn NULL and level 0: stderr at KVS_LOG_LEVEL's level. */
    kvs_log_t log;
    /* Region-scoped keys (key_grant) live at once, each a type-2 memory
     * window [1024]. */
    uint32_t max_grants;
} kvs_verbs_config_t;

/* Fills cfg with the defaults (gid_index = KVS_VERBS_GID_AUTO, all else 0).
 * Start every config from it. */
KVS_API void kvs_verbs_config_init(kvs_verbs_config_t *cfg);

/*
 * Opens the device, selects port and GID, makes the PD, CQ and listener.
 * On failure returns a status with err (if not NULL) saying what to change
 * (no device, port down, bad GID index, address in use...) and leaves
 * nothing to free. cfg and its strings are copied. *out is owned by the
 * caller until kvs_verbs_fabric_destroy.
 */
KVS_API int kvs_verbs_fabric_create(const kvs_verbs_config_t *cfg, kvs_fabric_t **out,
                                    kvs_error_t *err);
/* Closes every connection and frees the fabric. KVS_EBUSY (and nothing
 * freed) while registrations are live: deregister them first. NULL is a
 * no-op. */
KVS_API int kvs_verbs_fabric_destroy(kvs_fabric_t *fab);

/* What a fabric chose. */
typedef struct kvs_verbs_info {
    char device[64];
    int port;
    int gid_index;
    char gid[48];          /* textual GID */
    char address[80];      /* "IP:port" peers connect to */
    uint32_t mtu_bytes;    /* this side's MTU cap (the port's active MTU) */
    uint64_t max_mr_bytes; /* MRs larger than this are split */
    uint64_t max_write_bytes;
    /* Why this device: "named by the caller", "first usable device", or
     * "closest to PCI 0000:3b:00.0: same PCIe switch (below 0000:3a:00.0)"
     * (same PCIe root complex, same NUMA node, ...). */
    char device_reason[160];
} kvs_verbs_info_t;

/* KVS_EINVAL when fab is not a verbs fabric. */
KVS_API int kvs_verbs_fabric_info(kvs_fabric_t *fab, kvs_verbs_info_t *out);

/* Path MTU agreed on a connection (bytes), 0 if conn is not a live
 * connection of fab. */
KVS_API uint32_t kvs_verbs_conn_mtu(kvs_fabric_t *fab, kvs_conn_t *conn);

/* Whether conn is a connection of fab that can still carry operations
 * (connected or recovering; not failed for good, not disconnected). */
KVS_API bool kvs_verbs_conn_alive(kvs_fabric_t *fab, kvs_conn_t *conn);

/* How many times the fabric replaced conn's failed queue pair (0 if conn
 * is not a live connection of fab). For logs and tests. */
KVS_API uint32_t kvs_verbs_conn_recoveries(kvs_fabric_t *fab, kvs_conn_t *conn);

/* Sleeps until a completion or a connection event may be ready, at most
 * timeout_ms (-1: no limit). Returns KVS_OK (then call poll), KVS_EAGAIN on
 * time-out, or an error. Lets a progress loop sleep instead of spinning. */
KVS_API int kvs_verbs_fabric_wait(kvs_fabric_t *fab, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* KVSTAGE_VERBS_H */
