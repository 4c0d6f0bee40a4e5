/*
 * sim_report_fields.h - the simulator's report described once: every
 * member of kvs_sim_report_t, in its order, as one X-macro list. It
 * generates the public struct (kvstage/sim.h), the scalar fields of the
 * simulator's internal report (sim/scenario.h) and the copy between them
 * (sim/api.c), the JSON keys of `kvstage sim --json` (tools/sim.c), and
 * the table kvs_sim_report_field() returns, from which the Python
 * package builds its ctypes mirror and its simulate() dict.
 *
 * KVS_SIM_REPORT_FIELDS(HEAD, FIELD, ARRAY) calls, in struct order:
 *   HEAD(code, name, meaning)   the library's own words, not a result
 *                               (version, size_bytes, reserved): in the
 *                               public struct only;
 *   FIELD(code, name, json, meaning)  one scalar result; json: the
 *                               decimals `kvstage sim --json` prints a
 *                               double with, 0 for an integer, -1 where the
 *                               CLI writes the key itself (a bool, a
 *                               name, a hex string, a list's count);
 *   ARRAY(elem, name, count, meaning) an array or string: its element
 *                               type and count. The internal report holds
 *                               its own arrays (other element types), so
 *                               the copy and the CLI write these out by
 *                               hand; only the struct takes them from here.
 * code is the scalar's type as u32, i32, u64, i64 or f64
 * (KVS_SIM_REPORT_CTYPE_ turns it into the C type); the Python mirror
 * maps the same codes.
 *
 * ABI: the order and the types are kvs_sim_report_t's since version 1;
 * add members at the end only (tests/test_sim_report_fields.c pins every
 * offset). A comment says where each later group begins: a caller with a
 * shorter size_bytes gets what came before it.
 */
#ifndef KVSTAGE_SIM_REPORT_FIELDS_H
#define KVSTAGE_SIM_REPORT_FIELDS_H

#include <stdint.h>

#define KVS_SIM_REPORT_CTYPE_u32 uint32_t
#define KVS_SIM_REPORT_CTYPE_i32 int32_t
#define KVS_SIM_REPORT_CTYPE_u64 uint64_t
#define KVS_SIM_REPORT_CTYPE_i64 int64_t
#define KVS_SIM_REPORT_CTYPE_f64 double
#define KVS_SIM_REPORT_CTYPE(code) KVS_SIM_REPORT_CTYPE_##code

/* clang-format off */
#define KVS_SIM_REPORT_FIELDS(HEAD, FIELD, ARRAY)                                                   \
    HEAD(u32, version, "written by the library: KVS_SIM_REPORT_VERSION")                            \
    HEAD(u32, size_bytes, "set by the caller: sizeof(kvs_sim_report_t)")                            \
    FIELD(u32, requests_total, 0, "requests of the workload")                                       \
    FIELD(u32, requests_ok, 0, "requests that ended ok on every rank")                              \
    FIELD(u32, requests_failed, 0, "terminal, not ok (hung ones apart)")                            \
    FIELD(u32, hung_requests, 0, "never terminal on every rank")                                    \
    FIELD(u32, unreported_failures, 0,                                                              \
          "a rank learned of a peer's failure only by its own stall timeout")                       \
    FIELD(i32, path, -1, "kvs_path_t the handlers ran")                                             \
    FIELD(u64, bytes_moved, 0, "payload bytes the prefill side wrote")                              \
    FIELD(u64, bytes_verified, 0, "decode bytes compared with the pattern")                         \
    FIELD(u64, corrupt_bytes, 0,                                                                    \
          "of those, wrong (in requests reported ok), plus aux_corrupt_bytes")                      \
    FIELD(u64, ring_leaked_bytes, 0, "live in any ring after the run")                              \
    FIELD(u64, violations, 0,                                                                       \
          "hung + leaked + corrupt + unreported + collateral_failures + "                           \
          "failed_without_faults + keys_leaked + hostile_bytes_landed: ok is violations == 0")     \
    FIELD(u64, rdma_ops, 0, "RDMA writes posted")                                                   \
    FIELD(u64, control_msgs, 0, "control messages sent")                                            \
    FIELD(u64, msgs_rejected, 0, "control messages the handlers refused")                           \
    FIELD(u64, watermark_waits, 0, "times a writer waited for ring space")                          \
    FIELD(u64, ring_peak_bytes, 0, "most ring bytes live on one decode rank")                       \
    FIELD(u64, sim_ns, 0, "first arrival to last completion")                                       \
    FIELD(u64, events, 0, "engine events dispatched")                                               \
    FIELD(u64, digest, -1, "engine event-order digest: one seed, one digest")                       \
    FIELD(i64, prefill_ranks, 0, "simulated GPUs of the prefill side, every instance")              \
    FIELD(i64, decode_ranks, 0, "simulated GPUs of the decode side, every instance")                \
    FIELD(f64, goodput_gbps, 6, "bytes_verified over sim time, Gb/s")                               \
    FIELD(f64, line_rate_gbps, 6, "NIC rate x min(prefill NICs, decode NICs)")                      \
    FIELD(f64, latency_p50_us, 3, "prefill done -> request done, median")                           \
    FIELD(f64, latency_p99_us, 3, "prefill done -> request done, 99th percentile")                  \
    FIELD(f64, e2e_p50_us, 3, "arrival -> request done, median")                                    \
    FIELD(f64, e2e_p99_us, 3, "arrival -> request done, 99th percentile")                           \
    /* After the version 1 prefix. */                                                               \
    FIELD(u64, msgs_retransmitted, 0, "control messages sent again (not acked in time)")            \
    FIELD(u64, msgs_duplicate, 0, "control messages received twice or after a loss: dropped")       \
    FIELD(u64, peers_lost, 0, "connections the handlers found dead")                                \
    FIELD(u32, ranks_crashed, 0, "crash and restart faults that hit a live rank")                   \
    FIELD(u32, ranks_restarted, 0, "ranks restarted after a crash")                                 \
    FIELD(u32, ranks_down_at_start, 0, "ranks that failed their init (hbm-full)")                   \
    HEAD(u32, reserved, "0")                                                                        \
    ARRAY(char, init_error, 384, "the first init failure, as the rank saw it; NUL-terminated")      \
    FIELD(u64, posts_refused, 0,                                                                    \
          "writes and sends refused by a full send queue (net_sq_depth)")                           \
    /* Clusters. */                                                                                 \
    FIELD(u32, collateral_failures, 0,                                                              \
          "requests failed although neither of their instances was faulted (no fault on a "        \
          "rank of either, none of the whole cluster); KVS_EOVERSIZED is not; in violations")                                                         \
    FIELD(u32, instances, -1, "entries of instance[]: prefill instances, then decode ones")         \
    ARRAY(kvs_sim_instance_t, instance, 2 * KVS_SIM_MAX_INSTANCES, "each instance's share")         \
    /* Aux payloads (config max_aux_bytes). */                                                      \
    FIELD(u64, aux_bytes_verified, 0,                                                               \
          "aux payload bytes compared on the decode ranks; not in bytes_verified")                  \
    FIELD(u64, aux_corrupt_bytes, 0,                                                                \
          "of those, wrong, missing or extra; also in corrupt_bytes")                               \
    /* The verdict and why requests failed. */                                                      \
    FIELD(u32, ok, -1,                                                                              \
          "1: the run broke no invariant (violations == 0); the one verdict of kvs_sim_run, "     \
          "Python's simulate() and `kvstage sim` (exit 0)")                           \
    FIELD(u32, failed_without_faults, 0,                                                            \
          "requests failed in a run without faults, not collateral; in violations")                 \
    FIELD(u64, ring_bytes_needed, 0,                                                                \
          "the largest staging region a request can need on one decode rank (0: none stages); "  \
          "a ring_bytes below it is refused before the run (KVS_EOVERSIZED), this still set")     \
    FIELD(u32, failures, -1, "entries of failure[]")                                                \
    FIELD(u32, failures_unlisted, 0,                                                                \
          "requests failed with a status past the first KVS_SIM_MAX_FAILURE_KINDS")                 \
    ARRAY(kvs_sim_failure_t, failure, KVS_SIM_MAX_FAILURE_KINDS,                                    \
          "requests by status, in the order each first happened")                                  \
    /* What operators read: computed from what the run recorded (no event, */                      \
    /* the digest as it was); exact nearest-rank percentiles of ok requests. */                     \
    FIELD(f64, ttft_p50_us, 3, "TTFT (arrival -> KV complete at the decode), median")               \
    FIELD(f64, ttft_p90_us, 3, "TTFT, 90th percentile")                                             \
    FIELD(f64, ttft_p99_us, 3, "TTFT, 99th percentile")                                             \
    FIELD(f64, transfer_p50_us, 3, "first chunk computed -> done, median")                          \
    FIELD(f64, transfer_p99_us, 3, "first chunk computed -> done, 99th percentile")                 \
    FIELD(u64, ring_p99_bytes, 0,                                                                   \
          "time-weighted 99th percentile of bytes live in one decode rank's ring, the "             \
          "largest over ranks")                                                                     \
    FIELD(f64, nic_util_mean, 6,                                                                    \
          "over every rank: payload bytes its NIC carried / (line rate x sim_ns)")                  \
    FIELD(f64, nic_util_max, 6, "the busiest rank's NIC utilisation")                               \
    FIELD(f64, goodput_fraction, 6, "goodput_gbps / line_rate_gbps")                                \
    ARRAY(kvs_sim_instance_metrics_t, instance_metrics, 2 * KVS_SIM_MAX_INSTANCES,                  \
          "each instance's operator metrics, as instance[]")                                        \
    /* The first wrong aux payload. */                                                              \
    ARRAY(char, aux_error, KVS_SIM_AUX_ERROR_BYTES,                                                 \
          "the first wrong aux payload: rank, request, both lengths; \"\" when none")              \
    /* Region-scoped keys and hostile writers (docs/security.md). */                                \
    FIELD(u64, keys_granted, 0, "region-scoped keys the decode ranks granted")                      \
    FIELD(u64, keys_revoked, 0, "... and revoked")                                                  \
    FIELD(u64, keys_leaked, 0, "grants still live after the run; in violations")                    \
    FIELD(u64, hostile_writes, 0, "writes the hostile-write faults sent astray")                    \
    FIELD(u64, hostile_bytes_landed, 0,                                                             \
          "bytes of them that landed in a decode's memory; in violations")
/* clang-format on */

#endif /* KVSTAGE_SIM_REPORT_FIELDS_H */
