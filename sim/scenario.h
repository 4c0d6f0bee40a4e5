/*
 * scenario.h - one simulated disaggregated-serving run: a cluster of
 * prefill instances (P x Pp GPUs each) and decode instances (D x Dp GPUs
 * each), every GPU with a NIC, running the real kvstage core (managers and
 * handlers) on the simulated device and fabric. By default one instance per
 * side; with several (spec §12) each instance has its own TP and PP, KV
 * page pools and compute queue, and a router pairs every request with one
 * prefill and one decode instance. Requests arrive as a Poisson process,
 * are prefilled (modeled forward time, real KV bytes written by a
 * deterministic pattern), moved by the chosen path, and every byte the
 * decode side received is verified; with max_aux_bytes, so is each
 * request's aux payload on every decode rank.
 *
 * Simulated device memory is real host memory, so a run costs wall time in
 * proportion to the KV bytes it moves and the memory it touches; the
 * defaults keep the main job at a few GB.
 *
 * Deterministic: one seed drives arrivals, prompt lengths and the fabric;
 * the same config gives the same report, bit for bit (wall time aside, which
 * the caller measures).
 */
#ifndef KVS_SIM_SCENARIO_H
#define KVS_SIM_SCENARIO_H

#include <kvstage/kvstage.h>
#include <kvstage/sim_report_fields.h>

#include "fabric.h"
#include "gpu.h"
#include "topology.h"

/* Faults injected into a run (seeded, reproducible). Times are simulated
 * ns from the start; probabilities are num/den. */
typedef enum sim_fault_kind {
    SIM_FAULT_DROP = 0,        /* control messages of msg_type are lost */
    SIM_FAULT_DUP = 1,         /* ... delivered twice */
    SIM_FAULT_DELAY = 2,       /* ... delivered delay_ns late */
    SIM_FAULT_WRITE_ERROR = 3, /* RDMA writes complete with an error */
    SIM_FAULT_LINK_DOWN = 4,   /* rank's link is down in [at_ns, at_ns + for_ns) */
    SIM_FAULT_SLOW_SCATTER = 5,/* rank's scatters take factor times longer */
    SIM_FAULT_CRASH = 6,       /* role's rank dies at at_ns: its memory and
                                  connections vanish */
    SIM_FAULT_RESTART = 7,     /* role's rank dies at at_ns (if alive) and comes
                                  back at once with the same session id */
    SIM_FAULT_HBM_FULL = 8,    /* rank's GPU has no memory beyond its KV pool:
                                  its staging memory cannot be allocated */
    SIM_FAULT_STALL = 9,       /* every rank's stall timeout is for_ns, shorter
                                  than the run's own waits: rooms time out
                                  while their peers still make progress */
    SIM_FAULT_HOSTILE_WRITE = 10 /* a prefill rank's one staged write at or after
                                  at_ns goes astray (hostile, below): a stale
                                  or hostile writer that region-scoped keys
                                  must stop at the fabric */
} sim_fault_kind_t;

/* Where a hostile write goes (SIM_FAULT_HOSTILE_WRITE). */
typedef enum sim_hostile {
    SIM_HOSTILE_STALE = 0,     /* the rank keeps the target and key of its first
                                  staged write at or after at_ns and, once every
                                  request in flight then has ended (that region
                                  freed), writes its next staged write to the
                                  same decode rank there, under that key */
    SIM_HOSTILE_OUTSIDE = 1    /* its first staged write at or after at_ns lands
                                  its own length past its bytes, under its own
                                  key: the next writer's block or region */
} sim_hostile_t;

/* The rank a fault names: the faults of one rank (link-down,
 * slow-scatter, crash, restart, hbm-full) name it by side, instance and
 * index in the instance; message and write faults strike the whole
 * cluster. */
typedef struct sim_fault {
    sim_fault_kind_t kind;
    int msg_type;              /* a KVS_MSG_* type, 0 = any (message faults) */
    uint32_t num, den;         /* probability (message and write faults) */
    uint64_t delay_ns;
    kvs_role_t role;           /* the rank's side */
    uint32_t instance;         /* its instance within the side, 0.. */
    int64_t rank;              /* its index in the instance: (cp * pp_size +
                                  pp) * tp_size + tp, cp its CP rank (0 on a
                                  decode or without CP) */
    uint64_t at_ns, for_ns;
    uint32_t factor;
    sim_hostile_t hostile;     /* hostile-write faults */
} sim_fault_t;

/* The workload's RNG streams (sim_engine_rng components of the root seed):
 * fixed, so adding one never reshuffles the others. Request i's prompt
 * length is the i-th sim_rng_range(min, max) of SIM_STREAM_LENGTHS, which
 * kvs_sim_prompt_tokens draws the same way for programs outside. */
enum { SIM_STREAM_ARRIVALS = 1, SIM_STREAM_LENGTHS = 2, SIM_STREAM_PREFIX = 3 };

#define SIM_MAX_FAULTS 16
/* sim_report_t.aux_error, NUL included. */
#define SIM_AUX_ERROR_BYTES 192
/* Kinds of failure a report lists (sim_report_t.failure): statuses past
 * this many are counted in failures_unlisted. */
#define SIM_MAX_FAILURE_KINDS 8
#define SIM_FAILURE_DETAIL_BYTES 256

/* Requests that ended with one status (their first failure), and what the
 * first of them saw. */
typedef struct sim_failure {
    int32_t status;                /* a KVS_E* code */
    uint32_t count;                /* requests that ended with it */
    char first_detail[SIM_FAILURE_DETAIL_BYTES]; /* the first such request in
                                      simulated time: which, where, when, why */
} sim_failure_t;

/* How a request picks its two instances, one per side, at its arrival. */
typedef enum sim_router {
    SIM_ROUTER_ROUND_ROBIN = 0,    /* each side's instances in turn */
    SIM_ROUTER_LEAST_LOADED = 1    /* fewest requests in flight (arrived, not
                                      ended); ties to the lowest index */
} sim_router_t;

/* What became of one request (sim_scenario_config_t.outcomes). */
typedef struct sim_request_outcome {
    int32_t status;                /* KVS_OK, the first failure, or 1: never ended */
    uint64_t arrival_ns, opened_ns, done_ns; /* opened: its rooms opened */
    uint32_t prefill_instance, decode_instance; /* the router's pick */
    /* Its ranks (those of its two instances) and how each one's result came
     * in: from its own handler, ok or a lost peer (KVS_EPEER) or another
     * failure, or from the simulator for a rank that was down or crashed. */
    uint32_t ranks, ranks_ok, ranks_peer, ranks_other, ranks_down;
} sim_request_outcome_t;

typedef struct sim_scenario_config {
    kvs_layout_params_t shape;     /* model shape, TP/PP sizes, chunk size */
    uint32_t requests;             /* 0 -> 16 */
    int64_t prompt_min_tokens;     /* 0 -> 256 */
    int64_t prompt_max_tokens;     /* 0 -> 1536 */
    uint64_t rate_milli_per_s;     /* mean arrivals per 1000 s; 0 -> all at t=0 */
    int64_t prefix_max_tokens;     /* decode cached prefix drawn in [0, this],
                                      page aligned; 0 = none */
    uint64_t ring_bytes;           /* decode staging ring, 0 -> 4096 MiB */
    kvs_path_t path;               /* AUTO, STAGING, DIRECT or SLICE */
    bool staging;                  /* staging enabled on both sides; AUTO uses it */
    uint64_t prefill_tokens_per_s; /* forward speed of each prefill instance,
                                      0 -> 16384 */
    uint32_t max_inflight;         /* requests admitted at once by each
                                      instance, 0 -> 4 */
    uint32_t transfer_workers;     /* prefill staging buffers, 0 -> 4 */
    uint64_t seed;
    sim_gpu_config_t gpu;          /* zero fields take the H200 defaults;
                                      data_mode: bytes (every byte moved and
                                      checked) or provenance (where each byte
                                      came from: the same events, checks of
                                      every slot, no KV bytes in memory) */
    sim_net_config_t net;          /* zero fields take the 400 Gb/s defaults;
                                      sq_depth 0: send queues unlimited */
    uint64_t max_events;           /* safety bound, 0 -> 2^40 */
    sim_fault_t faults[SIM_MAX_FAULTS];
    uint32_t nfaults;
    uint64_t stall_timeout_ns;     /* handlers' stall timeout, 0 -> 30 s */
    const char *trace_path;        /* Chrome trace-event JSON, NULL = none */
    sim_request_outcome_t *outcomes; /* caller's array of `requests` entries,
                                      filled at the end; NULL = not wanted */
    sim_topology_t topo;           /* zero: one instance per side */
    sim_router_t router;
    uint32_t max_aux_bytes;        /* every rank's manager max_aux_bytes, at most
                                      KVS_AUX_BYTES_MAX; request i carries an
                                      aux payload of sim_kvdata_aux_bytes(i,
                                      this) bytes (sim/kvdata.h), checked on
                                      every decode rank's ok result; 0 = none */
    /* Test hooks (planted bugs), installed on every GPU and NIC; NULL =
     * none. They see and may change copies and writes (sim/gpu.h,
     * sim/fabric.h). */
    sim_gpu_copy_hook_fn copy_hook;
    sim_nic_write_hook_fn write_hook;
    void *hook_ctx;
    /* Called every ~1/64 of the requests finishing: done of total. */
    void (*progress)(void *ctx, uint32_t done, uint32_t total, uint64_t sim_ns);
    void *progress_ctx;
} sim_scenario_config_t;

/* One instance's share of a run. */
typedef struct sim_instance_report {
    kvs_role_t role;
    uint32_t id;                   /* its index within its side */
    int64_t tp, pp;
    uint32_t requests_ok, requests_failed; /* paired with it, ended */
    uint64_t bytes;                /* payload bytes it moved: written (prefill)
                                      or received (decode) */
    uint64_t ring_peak_bytes;      /* decode: most ring bytes live on one of its
                                      ranks; prefill: 0 */
    /* Operator metrics of the requests paired with it that ended ok (exact
     * nearest-rank percentiles of the sorted per-request samples). */
    double e2e_p50_us, e2e_p90_us, e2e_p99_us; /* arrival -> request done */
    double transfer_p50_us, transfer_p99_us; /* first chunk computed -> done */
    uint64_t ring_p99_bytes;       /* decode: time-weighted p99 of ring bytes
                                      live, the largest over its ranks */
    uint64_t watermark_waits;      /* over its ranks */
    double nic_util_mean, nic_util_max; /* over its ranks: payload bytes its
                                      NIC carried / (line rate x sim_ns) */
} sim_instance_report_t;

/* A run's report: its scalar results are the public report's, generated
 * from the one list (kvstage/sim_report_fields.h: names, types, meanings;
 * sim/api.c copies them by the same list); its arrays are the
 * simulator's own. path holds a kvs_path_t, ok a bool (0 or 1). TTFT is
 * e2e (arrival -> request done): ttft_p50_us and ttft_p99_us equal
 * e2e_p50_us and e2e_p99_us. */
#define SIM_REPORT_HEAD(code, name, meaning)
#define SIM_REPORT_FIELD(code, name, json, meaning) KVS_SIM_REPORT_CTYPE(code) name;
#define SIM_REPORT_ARRAY(elem, name, count, meaning)
typedef struct sim_report {
    KVS_SIM_REPORT_FIELDS(SIM_REPORT_HEAD, SIM_REPORT_FIELD, SIM_REPORT_ARRAY)
    char aux_error[SIM_AUX_ERROR_BYTES]; /* the first wrong payload: rank,
                                      request, lengths; "" when none */
    char init_error[384];          /* the first init failure, as the rank saw it */
    sim_failure_t failure[SIM_MAX_FAILURE_KINDS]; /* by first occurrence; the
                                      count is failures */
    sim_instance_report_t instance[2 * SIM_MAX_INSTANCES]; /* prefill
                                      instances, then decode ones; the count
                                      is instances */
} sim_report_t;
#undef SIM_REPORT_HEAD
#undef SIM_REPORT_FIELD
#undef SIM_REPORT_ARRAY

/* Fills the defaults documented above into cfg (zero fields only). */
void sim_scenario_defaults(sim_scenario_config_t *cfg);
/* Runs the scenario. Returns a kvstage status; on failure err (err_bytes)
 * says what went wrong and what to change. A run whose requests fail still
 * returns KVS_OK: the report counts them. */
int sim_scenario_run(const sim_scenario_config_t *cfg, sim_report_t *out, char *err,
                     size_t err_bytes);

#endif
