/*
 * fabric.h - a simulated RDMA fabric: one network of NICs, one NIC per GPU,
 * each NIC a kvstage fabric backend (kvs_fabric_t).
 *
 * Model (defaults documented in docs/ with their sources):
 * - full-duplex links of link_bytes_per_s each way; a write is cut into
 *   segments that pass the sender's TX port then the receiver's RX port, each
 *   a FIFO server, so concurrent transfers share a NIC's bandwidth and incast
 *   on one receiver queues;
 * - each work request costs per_op_ns of sender NIC time before its first
 *   segment (why many small writes are slow), and each MTU packet carries
 *   header_bytes on the wire;
 * - one-way latency latency_ns; the data of a segment lands in the target
 *   GPU's memory when the segment arrives;
 * - memory registration hands out remote keys; a write whose key or range
 *   matches no registration on the target completes with KVS_EREMOTE and
 *   writes nothing;
 * - key_grant (fabric ops version 4) hands out region-scoped keys: one
 *   range of an MR, for the peer of one connection, until key_revoke; a
 *   write under a grant's key that reaches outside its range, comes on
 *   another connection or lands after the revoke completes with
 *   KVS_EREMOTE and writes nothing (no_key_grant binds a version-3 table
 *   instead, a fabric without grants);
 * - mr_register_sealed (version 5) registers memory whose own key opens
 *   nothing remote: a write under it completes with KVS_EREMOTE, and only
 *   grants open the memory;
 * - control messages (SEND/RECV) use their own channel with ctrl_latency_ns
 *   and arrive in order per connection;
 * - completions go to the NIC's bounded completion queue and wake its owner;
 * - with sq_depth set, each connection's send queue holds that many work
 *   requests (writes and sends) from post until their completion is polled:
 *   a post beyond it is refused with KVS_EAGAIN, as verbs refuses one.
 */
#ifndef KVS_SIM_FABRIC_H
#define KVS_SIM_FABRIC_H

#include <kvstage/backend.h>

#include "engine.h"
#include "gpu.h"

typedef struct sim_net sim_net_t;
typedef struct sim_nic sim_nic_t;

typedef struct sim_net_config {
    uint64_t link_bytes_per_s;   /* 0 -> 50e9 (400 Gb/s) */
    uint64_t latency_ns;         /* 0 -> 2000 */
    uint32_t mtu_bytes;          /* 0 -> 4096 */
    uint32_t header_bytes;       /* per packet, 0 -> 58 (RoCEv2) */
    uint64_t per_op_ns;          /* 0 -> 3700 (see nic_model.c) */
    uint64_t segment_bytes;      /* scheduling granularity, 0 -> 1 MiB */
    uint64_t ctrl_latency_ns;    /* 0 -> 20000 */
    uint32_t cq_entries;         /* per NIC, 0 -> 65536 */
    uint32_t max_mrs;            /* per NIC, 0 -> 1024 */
    uint32_t max_conns;          /* per NIC, 0 -> 256 */
    uint32_t sq_depth;           /* work requests outstanding per connection
                                    (posted, completion not yet polled);
                                    0 = unlimited */
    uint32_t max_grants;         /* live key_grant grants per NIC, 0 -> 65536 */
    bool no_key_grant;           /* NICs bind a version-3 ops table, without
                                    key_grant / key_revoke: a decode falls back
                                    to the key of its whole ring */
    uint64_t max_write_bytes;    /* the most bytes one write takes (the ops
                                    table's max_write_bytes): a longer one is
                                    refused (KVS_EINVAL), as a NIC refuses a
                                    message over its port's max_msg_sz;
                                    0 = no limit */
} sim_net_config_t;

typedef void (*sim_nic_wake_fn)(void *ctx);

int sim_net_create(sim_engine_t *eng, const sim_net_config_t *cfg, sim_net_t **out);
/* Destroys the network; every NIC must have been destroyed (else KVS_EBUSY). */
int sim_net_destroy(sim_net_t *net);

/* A NIC named `name` (unique, copied) attached to `gpu`, whose memory it
 * reads and writes. */
int sim_nic_create(sim_net_t *net, const char *name, sim_gpu_t *gpu, sim_nic_t **out);
void sim_nic_destroy(sim_nic_t *nic);
kvs_fabric_t *sim_nic_fabric(sim_nic_t *nic);
sim_nic_t *sim_nic_from_fabric(kvs_fabric_t *fab);
void sim_nic_set_wake(sim_nic_t *nic, sim_nic_wake_fn fn, void *ctx);
/* Reports every completed write (post to ack) as a span on thread "nic". */
void sim_nic_set_span(sim_nic_t *nic, sim_span_fn fn, void *ctx);
/* Counters for reports. */
uint64_t sim_nic_writes(const sim_nic_t *nic);
uint64_t sim_nic_write_bytes(const sim_nic_t *nic);
uint64_t sim_nic_msgs(const sim_nic_t *nic);
/* Posts (writes and sends) refused with KVS_EAGAIN because the
 * connection's send queue was full (sq_depth). */
uint64_t sim_nic_posts_refused(const sim_nic_t *nic);
/* Grants of this NIC's memory (key_grant) live now, made and revoked so
 * far: what a run leaves live is a leak. */
uint32_t sim_nic_grants_live(const sim_nic_t *nic);
uint64_t sim_nic_grants_made(const sim_nic_t *nic);
uint64_t sim_nic_grants_revoked(const sim_nic_t *nic);
/* Bytes of planted writes (those a write hook marked) that landed in a
 * target's memory: with scoped keys a hostile writer's must stay 0. */
uint64_t sim_nic_planted_landed_bytes(const sim_nic_t *nic);
/* Fault hooks: a link that is down drops segments and messages (writes then
 * complete with KVS_EPEER); a failed write completes with KVS_EREMOTE. */
void sim_nic_set_link_up(sim_nic_t *nic, bool up);
void sim_nic_fail_next_writes(sim_nic_t *nic, uint32_t count);
/* Each write posted on this NIC fails (KVS_EREMOTE, nothing lands) with
 * probability num/den, drawn from the network's fault stream. */
void sim_nic_set_write_error(sim_nic_t *nic, uint32_t num, uint32_t den);

/* What becomes of a control message leaving a NIC (fault injection). */
typedef enum sim_msg_fate {
    SIM_MSG_DELIVER = 0,
    SIM_MSG_DROP = 1,  /* lost: the sender still sees its SEND complete */
    SIM_MSG_DUP = 2,   /* delivered twice, back to back */
    SIM_MSG_DELAY = 3  /* delivered *delay_ns later; later messages of the
                          connection wait behind it (order is kept) */
} sim_msg_fate_t;
/* fn sees every message this NIC sends and decides its fate. */
typedef sim_msg_fate_t (*sim_msg_filter_fn)(void *ctx, const uint8_t *msg, uint32_t len_bytes,
                                            uint64_t *delay_ns);
void sim_nic_set_msg_filter(sim_nic_t *nic, sim_msg_filter_fn fn, void *ctx);
/* Test hook (planted bugs, hostile writers): sees every write posted on
 * this NIC (its name, the target NIC's, the length) and may change its
 * remote address and key. Returns true to mark the write planted: the
 * bytes of it that land count in sim_nic_planted_landed_bytes. */
typedef bool (*sim_nic_write_hook_fn)(void *ctx, const char *nic_name, const char *peer_name,
                                      uint64_t *remote_addr, uint64_t *rkey,
                                      uint64_t len_bytes);
void sim_nic_set_write_hook(sim_nic_t *nic, sim_nic_write_hook_fn fn, void *ctx);
/* The network's fault stream, for filters that draw (deterministic per seed). */
sim_rng_t *sim_net_fault_rng(sim_net_t *net);

#endif
