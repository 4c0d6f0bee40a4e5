/*
 * backend.h - the backend author's API of kvstage (as driver.h is to verbs.h).
 *
 * A backend plugs into the staging core through two ops tables: device ops
 * (memory, streams, events, gather/scatter kernels) and fabric ops (memory
 * registration, connections, one-sided writes, control messages, completion
 * polling, the clock). Each table is one `static const` struct per backend
 * opening with version, size and name; the core validates it at bind time and
 * fills optional slots with defaults that return KVS_ENOTSUP, so a missing
 * slot is never a NULL call. Instances embed kvs_device_t / kvs_fabric_t as
 * their FIRST member and recover themselves with KVS_CONTAINER_OF.
 *
 * Device addresses are uint64_t: they may not be dereferenceable by the host
 * (CUDA); only the backend turns them into memory.
 *
 * Add fields at the END of a table only, and bump its version.
 */
#ifndef KVSTAGE_BACKEND_H
#define KVSTAGE_BACKEND_H

#include <kvstage/kvstage.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_CONTAINER_OF(ptr, type, member)                                    \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

typedef struct kvs_stream kvs_stream_t; /* backend-defined */
typedef struct kvs_event kvs_event_t;   /* backend-defined */
typedef struct kvs_mr kvs_mr_t;         /* backend-defined */
typedef struct kvs_conn kvs_conn_t;     /* backend-defined */
typedef struct kvs_grant kvs_grant_t;   /* backend-defined */

/* ------------------------------------------------------------------------ */
/* Device                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * One gather or scatter: copies heads [head_start, head_start + num_heads) of
 * `tokens` tokens held in `pages` (page i covers token slots
 * [pages[i]*ps, pages[i]*ps + ps); the last page may be partial) for local
 * layers [layer_begin, layer_begin + layer_count) between the KV pool and a
 * staging block laid out
 *     [K slot 0 | ... | K slot S-1 | V slot 0 | ... | V slot S-1]
 * with S = staging_layer_slots, each slot tokens * num_heads * head_dim *
 * elem_bytes bytes, token-major [token][head][dim]. Local layer
 * layer_begin + j goes to slot staging_slot_begin + j. With planes 1 (one
 * buffer per layer: MLA's latent, kvs_kv_kind_t) the layer has no V: the
 * block is [K slot 0 | ... | K slot S-1] and v_base is not read (may be
 * NULL). A backend reads `planes` only from device ops version 4 on; the
 * core never hands a planes-1 copy to an older backend (KVS_ENOTSUP).
 *
 * Scale planes (FP8 KV with scales, docs/kinds/fp8-scales.md): with
 * scale_bytes > 0 each plane of a layer has a scale buffer beside it
 * (ks_base for K, vs_base for V), laid out [token_slot][local_head]
 * [scale_bytes], and the copy moves the scales of the same heads and
 * tokens with their rows: a staging slot is then tokens * num_heads *
 * head_dim * elem_bytes bytes of KV rows followed by tokens * num_heads *
 * scale_bytes bytes of their scale rows, token-major [token][head]
 * [scale_bytes]. A backend reads the scale fields only from device ops
 * version 5 on; the core never hands a copy with scales to an older one
 * (KVS_ENOTSUP).
 */
typedef struct kvs_copy_desc {
    const uint64_t *k_base;      /* per local layer, device addresses */
    const uint64_t *v_base;
    int64_t local_heads;         /* heads per token slot in the KV pool */
    int64_t head_dim;
    int64_t elem_bytes;
    int64_t page_size;
    const int64_t *pages;        /* page ids, host memory */
    int64_t num_pages;
    int64_t tokens;              /* <= num_pages * page_size */
    int64_t head_start;          /* in the KV pool */
    int64_t num_heads;
    int64_t layer_begin;         /* local layer index */
    int64_t layer_count;
    int64_t staging_slot_begin;
    int64_t staging_layer_slots; /* S */
    uint64_t staging_addr;       /* device address of the staging block */
    int64_t planes;              /* buffers per layer: 2 (K and V) or 1 (K
                                    only); 0 means 2 (descriptors made
                                    before the field existed) */
    /* device ops version 5: scale planes (0 / NULL: none) */
    const uint64_t *ks_base;     /* per local layer: K's scale buffer */
    const uint64_t *vs_base;     /* per local layer: V's (not read with planes 1) */
    int64_t scale_bytes;         /* one head's scales in one token row; 0: none */
} kvs_copy_desc_t;

/*
 * The geometry of a descriptor kvs_copy_desc_check accepted, in bytes unless
 * named: what a backend needs to run the copy without recomputing (and
 * re-checking) any product.
 */
typedef struct kvs_copy_shape {
    uint64_t pages_used;    /* ceil(tokens / page_size): entries of pages[] read */
    uint64_t row_bytes;     /* num_heads * head_dim * elem_bytes: one token's copy */
    uint64_t token_bytes;   /* local_heads * head_dim * elem_bytes: one pool slot */
    uint64_t head_off;      /* head_start * head_dim * elem_bytes */
    uint64_t slot_bytes;    /* tokens * (row_bytes + scale_row_bytes): one
                               staging layer slot, its KV rows then their
                               scale rows */
    uint64_t block_bytes;   /* slot_bytes * staging_layer_slots * planes: the block */
    uint64_t pool_lo;       /* bytes [pool_lo, pool_hi) of every layer buffer */
    uint64_t pool_hi;       /*   copied: the pages used, first copied head on */
    uint64_t payload_bytes; /* slot_bytes * layer_count * planes: bytes copied */
    uint64_t planes;        /* 1 or 2 (desc's planes, 0 taken as 2): plane kv
                               of layer j is k_base (kv 0) or v_base (kv 1)
                               and staging slot kv * S + slot_begin + j */
    /* Scale planes (desc scale_bytes > 0; all 0 without): the same tokens
     * and heads of ks_base / vs_base, at scale_off in each staging slot. */
    uint64_t scale_row_bytes;   /* num_heads * scale_bytes: one token's scales */
    uint64_t scale_token_bytes; /* local_heads * scale_bytes: one scale slot */
    uint64_t scale_head_off;    /* head_start * scale_bytes */
    uint64_t scale_off;         /* tokens * row_bytes: where a slot's scale rows start */
    uint64_t scale_pool_lo;     /* bytes [lo, hi) of every scale buffer */
    uint64_t scale_pool_hi;     /*   copied */
} kvs_copy_shape_t;

/* The backend's answer to "does [addr, addr + len_bytes) lie inside one live
 * allocation?" (an empty range may sit one past the end). ctx is the
 * backend's, passed through. */
typedef bool (*kvs_copy_mem_fn)(void *ctx, uint64_t addr, uint64_t len_bytes);

/*
 * The descriptor check every device backend runs on a gather or scatter
 * before it touches memory, so all backends refuse exactly the same
 * descriptors with the same status and wording. It checks the shape (signs,
 * head range, tokens against pages, layer and staging slot ranges, 64-bit
 * overflow of every size, page ids) and, when the copy moves bytes, asks
 * in_mem whether each layer buffer holds the bytes the pages touch and
 * whether the whole staging block (all staging_layer_slots slots, K and V)
 * is live memory. pages[] is read only up to the pages the tokens use.
 *
 * On success returns KVS_OK and fills *sh. On failure returns KVS_EINVAL (a
 * NULL pointer, a non-positive size, a negative count) or KVS_ERANGE (a
 * range outside its object, an overflow) and writes into msg (msg_bytes
 * bytes, NUL-terminated when msg_bytes > 0) "<what> on <dev_name>: " and
 * what to change; *sh is then zeroed. sh and in_mem must not be NULL. Copies
 * nothing, keeps no state; d, sh, msg and ctx are borrowed for the call.
 */
KVS_API int kvs_copy_desc_check(const kvs_copy_desc_t *d, const char *what,
                                const char *dev_name, kvs_copy_mem_fn in_mem, void *ctx,
                                kvs_copy_shape_t *sh, char *msg, size_t msg_bytes);

/*
 * One part of a fused copy (gather_parts / scatter_parts): a head range of
 * the KV pool and the staging block it moves to or from. A fused copy runs
 * the parts of one descriptor in a single pass over the pool, so the pool
 * side reads (gather) or writes (scatter) every token's row once, whole,
 * where one copy per part would touch each row once per part: the decode
 * side of P8->D2 scatters four writers' one-head blocks into 4-head rows.
 */
typedef struct kvs_copy_part {
    int64_t head_start;    /* in the KV pool */
    int64_t num_heads;
    uint64_t staging_addr; /* device address of this part's staging block */
} kvs_copy_part_t;

/* The most parts one fused copy takes (a TP group's writers or readers). */
#define KVS_COPY_PARTS_MAX 1024

/*
 * The check of a fused copy: desc with each part's head_start, num_heads
 * and staging_addr in place of its own (those three fields of desc are not
 * read) must pass kvs_copy_desc_check (what "<what> part <i>"), and what
 * the copy writes must not overlap: a scatter's parts hold disjoint head
 * ranges, a gather's parts disjoint staging blocks. 1 <= nparts <=
 * KVS_COPY_PARTS_MAX. On success fills sh[0..nparts) (the shape of each
 * part; sh may be NULL) and returns KVS_OK; on failure returns KVS_EINVAL
 * or KVS_ERANGE with the message as kvs_copy_desc_check writes it, naming
 * the part, and zeroes sh (not when nparts is out of range: then sh is not
 * touched). Copies nothing, keeps no state.
 */
KVS_API int kvs_copy_parts_check(const kvs_copy_desc_t *d, const kvs_copy_part_t *parts,
                                 int64_t nparts, bool scatter, const char *what,
                                 const char *dev_name, kvs_copy_mem_fn in_mem, void *ctx,
                                 kvs_copy_shape_t *sh, char *msg, size_t msg_bytes);

typedef struct kvs_device kvs_device_t;

typedef struct kvs_device_ops {
    uint32_t version;            /* KVS_DEVICE_OPS_VERSION */
    uint32_t size;               /* sizeof(kvs_device_ops_t) */
    const char *name;
    /* required */
    int (*mem_alloc)(kvs_device_t *dev, uint64_t len_bytes, uint64_t *out_addr);
    int (*mem_free)(kvs_device_t *dev, uint64_t addr);
    /* optional (default: KVS_ENOTSUP) */
    int (*stream_create)(kvs_device_t *dev, kvs_stream_t **out);
    void (*stream_destroy)(kvs_device_t *dev, kvs_stream_t *stream);
    /* enqueue a copy; refuse desc as kvs_copy_desc_check does, first */
    int (*gather)(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *desc);
    int (*scatter)(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *desc);
    int (*event_record)(kvs_device_t *dev, kvs_stream_t *stream, kvs_event_t **out);
    /* KVS_OK when complete, KVS_EAGAIN while pending, an error if it failed */
    int (*event_query)(kvs_device_t *dev, kvs_event_t *event);
    void (*event_destroy)(kvs_device_t *dev, kvs_event_t *event);
    /* host <-> device copies, for tests and verification */
    int (*mem_write)(kvs_device_t *dev, uint64_t addr, const void *src, uint64_t len_bytes);
    int (*mem_read)(kvs_device_t *dev, uint64_t addr, void *dst, uint64_t len_bytes);
    /* version 2: fused copies of nparts parts in one op (kvs_copy_part_t);
     * refuse them as kvs_copy_parts_check does, first, and enqueue all or
     * nothing. Optional: the default enqueues one gather / scatter per part,
     * in order, after a shape check of them all (a backend error on a later
     * part may leave earlier parts enqueued; its message is the backend's,
     * after "<gather_parts|scatter_parts> part <i>: "). */
    int (*gather_parts)(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *desc,
                        const kvs_copy_part_t *parts, int64_t nparts);
    int (*scatter_parts)(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *desc,
                         const kvs_copy_part_t *parts, int64_t nparts);
    /* version 3: blocking waits (see "Waiting for completions" below).
     * Arms the device's completion notification and gives in *out_fd a
     * file descriptor that becomes readable (POLLIN) when an op enqueued
     * on any of dev's streams completes after this call. Optional: the
     * default returns KVS_ENOTSUP (a driver then wakes on a timer). */
    int (*wait_arm)(kvs_device_t *dev, int *out_fd);
} kvs_device_ops_t;

/* Version 2 added gather_parts and scatter_parts, version 3 wait_arm;
 * tables of versions 1 (which end at mem_read) and 2 (at scatter_parts)
 * still bind and get the defaults. Version 4 adds no slot: it says the
 * copies read kvs_copy_desc_t.planes (layers of one buffer, MLA); a table
 * of an older version binds, and a manager of a one-plane kind refuses it
 * (KVS_ENOTSUP). Version 5 adds no slot either: the copies read the scale
 * planes (kvs_copy_desc_t.scale_bytes, ks_base, vs_base); a manager with
 * scale planes refuses an older table (KVS_ENOTSUP). */
#define KVS_DEVICE_OPS_VERSION 5u

/* The base every device instance embeds first. */
struct kvs_device {
    kvs_device_ops_t ops; /* filled copy: optional slots hold defaults */
    const char *name;   /* instance name for messages, static or owned by the backend */
    int last_backend_code; /* backend's own code of its last failure */
    char last_backend_msg[KVS_ERROR_MSG_BYTES];
};

/* ------------------------------------------------------------------------ */
/* Fabric                                                                    */
/* ------------------------------------------------------------------------ */

#define KVS_FABRIC_CAP_WRITE_IMM (1u << 0)      /* RDMA WRITE WITH IMM */
#define KVS_FABRIC_CAP_PER_LAYER_WRITES (1u << 1) /* many writes per region (PP) */
/* A SEND the fabric accepted reaches the peer once and in order unless the
 * connection fails, and a failure is reported (KVS_EPEER, or a DISCONNECT
 * completion): a reliable connection (verbs RC; libfabric's reliable
 * endpoints). The core's control links then retransmit only as a backstop,
 * after at least KVS_RELIABLE_RETRY_TIMEOUT_NS (kvstage.h), so a peer
 * that answers late is not sent every message twice. A fabric that may
 * lose or duplicate messages (the simulator's) leaves it clear. */
#define KVS_FABRIC_CAP_RELIABLE_SEND (1u << 2)

typedef struct kvs_write_desc {
    uint64_t local_addr;
    kvs_mr_t *local_mr;
    uint64_t len_bytes;
    uint64_t remote_addr;
    uint64_t rkey;
    bool with_imm;
    uint32_t imm;
    uint64_t wr_id;     /* returned in the completion */
} kvs_write_desc_t;

typedef enum kvs_completion_kind {
    KVS_COMPLETION_WRITE = 0,   /* a local write finished */
    KVS_COMPLETION_SEND = 1,    /* a local control send finished */
    KVS_COMPLETION_RECV = 2,    /* a control message arrived */
    KVS_COMPLETION_IMM = 3,     /* a remote write with immediate landed here */
    KVS_COMPLETION_DISCONNECT = 4 /* conn's peer went away (crashed, restarted,
                                   disconnected): conn is dead; disconnect it.
                                   msg may say why: len_bytes > 0 bytes of
                                   text, NUL-terminated (0: nothing said) */
} kvs_completion_kind_t;

#define KVS_CONTROL_MSG_MAX_BYTES 4096u

typedef struct kvs_completion {
    kvs_completion_kind_t kind;
    int status;                 /* KVS_OK or an error for this operation */
    uint64_t wr_id;
    kvs_conn_t *conn;
    uint32_t imm;
    uint32_t len_bytes;         /* RECV: message length */
    uint8_t msg[KVS_CONTROL_MSG_MAX_BYTES]; /* RECV: the message */
} kvs_completion_t;

typedef struct kvs_fabric kvs_fabric_t;

typedef struct kvs_fabric_ops {
    uint32_t version;           /* KVS_FABRIC_OPS_VERSION */
    uint32_t size;              /* sizeof(kvs_fabric_ops_t) */
    const char *name;
    uint32_t caps;              /* KVS_FABRIC_CAP_* */
    /* required */
    int (*mr_register)(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                       uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);
    int (*mr_deregister)(kvs_fabric_t *fab, kvs_mr_t *mr);
    /* optional (default: KVS_ENOTSUP; now_ns defaults to 0) */
    int (*connect)(kvs_fabric_t *fab, const char *peer, kvs_conn_t **out);
    void (*disconnect)(kvs_fabric_t *fab, kvs_conn_t *conn);
    int (*write)(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc);
    int (*send)(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg,
                uint32_t len_bytes, uint64_t wr_id);
    /* Returns how many completions it wrote (0..max) or a negative status. */
    int (*poll)(kvs_fabric_t *fab, kvs_completion_t *out, int max);
    uint64_t (*now_ns)(kvs_fabric_t *fab);
    /* version 2: blocking waits (see "Waiting for completions" below).
     * Arms the fabric's notification and gives in *out_fd a file
     * descriptor that becomes readable (POLLIN) when a completion or a
     * connection event arrives after this call, and in *out_wake_ns the
     * time (now_ns's clock) by which poll must run again even if the fd
     * stays quiet (the fabric's own timers: reconnects, close timeouts;
     * UINT64_MAX: none; now or earlier: something is ready, do not sleep).
     * Optional: the default returns KVS_ENOTSUP. */
    int (*wait_arm)(kvs_fabric_t *fab, int *out_fd, uint64_t *out_wake_ns);
    /* version 3: authenticated registration (docs/security.md).
     * Fills buf with len_bytes unpredictable bytes (the nonces): a real
     * fabric reads the kernel's generator (getrandom(2)); the simulator
     * draws from its seeded stream, so a run replays. Optional: the
     * default returns KVS_ENOTSUP, and a rank given a cluster secret on
     * such a fabric is refused at create. */
    int (*random_bytes)(kvs_fabric_t *fab, void *buf, size_t len_bytes);
    /* Writes conn's peer address as text ("10.0.0.7:7000", a simulated
     * NIC's name) into buf (bytes, NUL-terminated), for the log line of a
     * refused peer. Optional: the default returns KVS_ENOTSUP. */
    int (*peer_addr)(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes);
    /* version 4: region-scoped remote keys (docs/security.md). Optional:
     * the defaults return KVS_ENOTSUP, and a decode then hands every
     * writer the key of its whole staging ring, as before.
     *
     * key_grant gives the peer of conn, and only it, remote write access
     * to exactly [addr, addr + len_bytes) of mr (a registration of this
     * fabric, of which the range must be part; len_bytes > 0) until the
     * grant is revoked, like a verbs type-2 memory window bound to conn's
     * queue pair. *out_rkey gets the key the peer writes with (as
     * kvs_write_desc_t.rkey) and *out the grant, the fabric's until
     * key_revoke. A write under that key
     *   - outside the range (any byte of it),
     *   - posted on any other connection (of this peer or another), or
     *   - landing after key_revoke returned
     * fails at the writer with KVS_EREMOTE and changes no byte of the
     * target: write() returns it when the writer's fabric refuses the
     * write itself (a key it never received on that connection, a range
     * outside what it was told), else the write's KVS_COMPLETION_WRITE
     * carries it (the target's NIC or provider refused). A grant is not
     * touched by mr_register, and mr_deregister of an mr with live
     * grants fails (KVS_EBUSY): revoke first. Errors: KVS_EINVAL (a NULL
     * pointer, an empty range or one outside mr, a conn that is not this
     * fabric's), KVS_EPEER (conn's peer is gone), KVS_EFULL (no grant
     * left: revoke some, or raise the fabric's bound), with the detail
     * recorded by kvs_fabric_fail. */
    int (*key_grant)(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                     uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey);
    /* Revokes grant (from key_grant of this fabric; the pointer is dead
     * after the call): from its return on, no write under its key lands.
     * Also valid after grant's connection died. KVS_ENOENT for a grant
     * that is not live. */
    int (*key_revoke)(kvs_fabric_t *fab, kvs_grant_t *grant);
    /* version 5: sealed registrations (docs/security.md). Registers
     * [addr, addr + len_bytes) like mr_register, except that the
     * registration's own key opens nothing to a remote writer: a write
     * under it fails at the writer with KVS_EREMOTE and changes no byte,
     * and only key_grant grants into the registration open it (verbs: an
     * MR without remote write access, windows bound over it). *out_rkey
     * gets that key all the same (local use, logs, tests). A decode
     * registers its staging ring so when the fabric grants keys, so that
     * no key to the whole ring exists at all. Optional: the default
     * returns KVS_ENOTSUP, as should a fabric whose key_grant would answer
     * KVS_ENOTSUP (a registration no grant can open is no use); the
     * decode then registers with mr_register. */
    int (*mr_register_sealed)(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                              uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);
    /* version 6: the most bytes one write() takes (a port's max_msg_sz, a
     * provider's max_msg_size, a simulated NIC's limit), constant for the
     * fabric's life; write() of more may be refused. The prefill then posts
     * a writer's block as the fewest writes of at most this many bytes,
     * each a piece of its region under the same key, and its CHUNK_READY
     * goes once every piece completed. A fabric that cuts a long write
     * into work requests itself (verbs, ofi) need not have the slot.
     * Optional: the default returns UINT64_MAX (no limit: one write per
     * block, as before); 0 means the same. */
    uint64_t (*max_write_bytes)(kvs_fabric_t *fab);
} kvs_fabric_ops_t;

/* Version 2 added wait_arm, version 3 random_bytes and peer_addr, version
 * 4 key_grant and key_revoke, version 5 mr_register_sealed, version 6
 * max_write_bytes; tables of versions 1 (which end at now_ns), 2 (at
 * wait_arm), 3 (at peer_addr), 4 (at key_revoke) and 5 (at
 * mr_register_sealed) still bind and get the defaults. */
#define KVS_FABRIC_OPS_VERSION 6u

/*
 * Waiting for completions (wait_arm, both tables). A loop that must sleep
 * until a backend has news, instead of spinning on poll and event_query,
 * follows one rule: arm, then look once more, then sleep.
 *   1. wait_arm(): from now on any new completion makes the fd readable.
 *   2. one more poll / event_query (a step of the rank): what completed
 *      before the arm raised no notification but is found here.
 *   3. nothing found: poll(2) / epoll the fds until one is readable or the
 *      earliest deadline (the rank's, the fabric's wake_ns) passes.
 * The fd belongs to the backend: it stays the same for the instance's life,
 * the caller must not read, write or close it, and the next wait_arm
 * consumes its readiness (a readable fd stays readable until then, so a
 * wake-up is never lost; it may be spurious). wait_arm is called like the
 * backend's other slots: on a fabric, by the one thread that uses it at a
 * time. A backend with no such fd (the simulator, test fakes) keeps the
 * default; a driver then sleeps for a bounded interval at most.
 */

struct kvs_fabric {
    kvs_fabric_ops_t ops; /* filled copy: optional slots hold defaults */
    const char *name;
    int last_backend_code;
    char last_backend_msg[KVS_ERROR_MSG_BYTES];
};

/* Validates a table and initialises the base of an instance with a copy of
 * it whose missing optional slots return KVS_ENOTSUP: KVS_EVERSION for an
 * unknown version or a size outside [size of version 1, sizeof(table)],
 * KVS_EINVAL when a required slot is NULL. name is borrowed (static). */
KVS_API int kvs_device_init(kvs_device_t *dev, const kvs_device_ops_t *ops,
                            const char *name);
KVS_API int kvs_fabric_init(kvs_fabric_t *fab, const kvs_fabric_ops_t *ops,
                            const char *name);

/* Records the backend's own failure detail on the instance (for the core's
 * error detail) and returns status. */
KVS_API int kvs_device_fail(kvs_device_t *dev, int status, int backend_code,
                            const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
KVS_API int kvs_fabric_fail(kvs_fabric_t *fab, int status, int backend_code,
                            const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Fills a caller's kvs_error_t, as a backend's create function does when it
 * made nothing (there is no instance yet to record on): status,
 * backend_code (errno, cudaError_t, ... or 0), file (kept, not copied:
 * static storage such as __FILE__), line and the message from fmt, which
 * says what to change (truncated to KVS_ERROR_MSG_BYTES - 1 bytes; NULL:
 * kvs_strerror(status)). err may be NULL: nothing is filled. Returns
 * status. KVS_ERROR_SET passes the caller's file and line. */
KVS_API int kvs_error_set(kvs_error_t *err, int status, int backend_code, const char *file,
                          int line, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
#define KVS_ERROR_SET(err, status, backend_code, ...)                          \
    kvs_error_set((err), (status), (backend_code), __FILE__, __LINE__, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif /* KVSTAGE_BACKEND_H */
