/*
 * ofi.h - the fabric backend of kvstage on libfabric (OFI): TCP and shared
 * memory on every machine, verbs and EFA in clusters (built into
 * libkvstage_hw where libfabric is installed).
 *
 * Tested: tcp and shm anywhere; verbs (verbs;ofi_rxm) on soft-RoCE, where
 * libfabric 1.17 wants FI_OFI_RXM_USE_SRX=1 and, on rxe,
 * FI_UNIVERSE_SIZE=64 in the environment (docs/fabrics.md). efa is taken
 * the way verbs is but has never run (no device).
 *
 * An ofi fabric is a kvs_fabric_t: one libfabric provider chosen by name,
 * one reliable datagram endpoint (FI_EP_RDM: the provider's, or a utility
 * provider's over it, such as "tcp;ofi_rxm"), one address vector, one
 * completion queue with a wait fd, and a small TCP listener for the
 * bootstrap. What each ops slot does on libfabric:
 * - connect(peer "IPv4:port", "[IPv6]:port" or "host:port"): opens a TCP
 *   socket to the peer's bootstrap listener and swaps a HELLO (provider
 *   name, endpoint address, connection token) each way; each side inserts
 *   the other's endpoint address into its address vector. Blocks until the
 *   peer answered or connect_timeout_ms passed. The socket stays open for
 *   the connection's life and carries nothing more: its end is how a side
 *   learns that its peer died. Connections made by peers are accepted
 *   inside poll/connect; the first RECV or IMM completion of such a
 *   connection hands it to the user.
 * - mr_register: host memory with fi_mr_reg, honouring the provider's
 *   FI_MR_LOCAL (descriptors on every local buffer), FI_MR_VIRT_ADDR
 *   (remote addresses are virtual addresses, else offsets into the
 *   registration), FI_MR_PROV_KEY (the provider's key, else one the fabric
 *   picks) and FI_MR_ENDPOINT (bound to the endpoint). A range larger than
 *   max_mr_bytes is split into several registrations. The remote key handed
 *   out is a handle: the registration's base, length and piece keys travel
 *   to every connected peer over the connection (KEYS messages) before any
 *   message sent after the registration, and to later peers at connect.
 * - write: fi_write with FI_DELIVERY_COMPLETE; with_imm, the immediate
 *   reaches the peer as KVS_COMPLETION_IMM after every byte of the write
 *   landed, one of two ways (kvs_ofi_info_t.cq_data_bytes says which):
 *   with 8 bytes of remote CQ data (tcp, shm) the 32-bit immediate and the
 *   receiver's connection token ride as the write's CQ data; with fewer
 *   (verbs, efa: 4) a small fabric message carries the immediate once the
 *   write completed, costing a send slot, a receive at the peer and that
 *   wait. (The completion's source address cannot name the connection:
 *   ofi_rxm reports none for remote writes.) Split at max_write_bytes and
 *   at piece boundaries; what carries the immediate goes last, after the
 *   others completed at the peer. One completion for the whole write.
 * - send: a control message of at most KVS_CONTROL_MSG_MAX_BYTES with
 *   fi_send, copied at send(), delivered in order (FI_ORDER_SAS) into
 *   receives posted on the endpoint.
 * - poll: never blocks. Writes complete on delivery (FI_DELIVERY_COMPLETE),
 *   so an error at the peer comes back as an error completion that fails
 *   that operation (KVS_EREMOTE). A key the peer never announced or has
 *   dropped, or a range outside its registration, is refused by write()
 *   itself (KVS_EREMOTE) before anything goes out. (The tcp provider tears
 *   its connection down after a refused write; later operations then fail
 *   with KVS_EPEER: the fabric does not rebuild it yet.) A peer whose
 *   bootstrap socket ends (it crashed or disconnected) fails the
 *   connection: what is pending completes with KVS_EPEER, later posts
 *   return KVS_EPEER, and then poll reports one KVS_COMPLETION_DISCONNECT
 *   (disconnect it to free its slot). A disconnect tells the peer (BYE, in
 *   order after the messages before it). Other connections are never
 *   touched.
 * - now_ns: CLOCK_MONOTONIC.
 * - wait_arm: fi_trywait on the completion queue and one epoll fd, readable
 *   when the queue's wait fd (fi_control FI_GETWAIT) or a bootstrap socket
 *   is; wake time now when poll has something to report already. shm's
 *   wait fd does not wake for a peer's messages, so on shm (and providers
 *   with no wait fd) the wake time is a millisecond away.
 *
 * Threads: a fabric is used by one thread at a time (no locks inside);
 * different fabrics are independent.
 */
#ifndef KVSTAGE_OFI_H
#define KVSTAGE_OFI_H

#include <kvstage/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_ofi_config {
    /* The libfabric provider by name: "tcp", "shm", "verbs", "efa", ...
     * (fi_info -l); NULL: "tcp". A name that libfabric does not offer here
     * with what the fabric needs is refused with the list of those it does. */
    const char *provider;
    /* Local IP address of the bootstrap listener and, for network
     * providers, of the endpoint; NULL: any address (0.0.0.0) and the
     * provider's first interface. */
    const char *bind_addr;
    /* TCP port of the bootstrap listener; 0: any free port
     * (kvs_ofi_fabric_info tells which). */
    uint16_t listen_port;
    /* Bounds; 0 takes the default in brackets. */
    uint32_t max_conns;          /* connections, both directions [16] */
    uint32_t tx_depth;           /* requests (pieces of writes, sends) in flight [1024] */
    uint32_t recv_depth;         /* receives posted on the endpoint [256] */
    uint32_t send_slots;         /* control messages in flight [512] */
    uint32_t max_mrs;            /* registrations [1024] */
    uint64_t max_mr_bytes;       /* largest registration piece [no cap] */
    uint64_t max_write_bytes;    /* largest request [the endpoint's max_msg_size] */
    uint32_t connect_timeout_ms; /* connect() gives up after this [10000] */
    /* Sink of the fabric's log (provider, address) at KVS_LOG_INFO. fn
     * NULL and level 0: stderr at KVS_LOG_LEVEL's level. */
    kvs_log_t log;
    /* Region-scoped keys live at once (key_grant, hw/ofi/grant.c), and the
     * grants of a peer this side keeps keys of, beyond max_mrs [1024]. */
    uint32_t max_grants;
} kvs_ofi_config_t;

/* Fills cfg with the defaults (all 0). Start every config from it. */
KVS_API void kvs_ofi_config_init(kvs_ofi_config_t *cfg);

/*
 * Opens the provider's fabric, domain, endpoint, address vector and
 * completion queue, posts the receives and opens the bootstrap listener.
 * On failure returns a status with err (if not NULL) saying what to change
 * (an unknown provider, with those offered here; an address in use...)
 * and leaves nothing to free. cfg and its strings are copied. *out is
 * owned by the caller until kvs_ofi_fabric_destroy.
 */
KVS_API int kvs_ofi_fabric_create(const kvs_ofi_config_t *cfg, kvs_fabric_t **out,
                                  kvs_error_t *err);
/* Closes every connection (BYE to the peers still there, polling at most
 * 200 ms for those to go out) and frees the fabric. KVS_EBUSY (and nothing
 * freed) while registrations are live: deregister them first. NULL is a
 * no-op. */
KVS_API int kvs_ofi_fabric_destroy(kvs_fabric_t *fab);

/* What a fabric chose. */
typedef struct kvs_ofi_info {
    char provider[64];     /* as libfabric names it: "tcp;ofi_rxm", "shm" */
    char fabric[64];       /* fabric name: "127.0.0.1/32", "shm" */
    char domain[64];
    char address[80];      /* "IP:port" of the bootstrap listener peers connect to */
    char mr_mode[96];      /* "FI_MR_LOCAL|FI_MR_VIRT_ADDR..." or "none" */
    uint32_t cq_data_bytes; /* remote CQ data: from 8 the immediate rides in it,
                             * below in a message after the write */
    uint64_t max_write_bytes;
    uint64_t max_mr_bytes; /* registrations larger than this are split */
} kvs_ofi_info_t;

/* KVS_EINVAL when fab is not an ofi fabric. */
KVS_API int kvs_ofi_fabric_info(kvs_fabric_t *fab, kvs_ofi_info_t *out);

/* The providers libfabric offers here with what the fabric needs (reliable
 * datagram endpoints, RMA writes, messages), comma-separated by the names
 * kvs_ofi_config_t.provider takes, into buf (NUL-terminated, truncated to
 * buf_bytes). Returns how many. */
KVS_API int kvs_ofi_providers(char *buf, size_t buf_bytes);

/* Whether conn is a connection of fab that can still carry operations. */
KVS_API bool kvs_ofi_conn_alive(kvs_fabric_t *fab, kvs_conn_t *conn);

#ifdef __cplusplus
}
#endif
#endif /* KVSTAGE_OFI_H */
