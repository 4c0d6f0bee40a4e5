/*
 * sim.h - the simulator's public API: runs one deterministic simulated
 * disaggregated-serving scenario, the engine behind `kvstage sim` (prefill
 * instances of P x PP and decode instances of D x DP simulated GPUs with
 * one RDMA NIC each run the real kvstage core, a router pairing every
 * request with one instance of each side; every byte that arrives is
 * verified). For C and for any language with a C FFI (python/kvstage uses
 * it through ctypes).
 *
 * Link libkvstage_sim (pkg-config kvstage-sim, CMake kvstage::sim); it
 * brings libkvstage with it.
 *
 * ABI: both structs open with version and size_bytes, hold fixed-width
 * fields (plus two string pointers), and only ever grow at the end: the
 * size_bytes a caller passes says which fields it knows (a field past it
 * is 0, its default), and the version changes only if a field's meaning
 * does. Fill a config with kvs_sim_config_init (or set version and
 * size_bytes yourself) and a report's size_bytes before the call. A config
 * larger than this library knows is refused unless its unknown tail is all
 * zero (KVS_EVERSION); a report is written up to the smaller of the two
 * sizes. In the default data mode simulated device memory is real host
 * memory: a run costs memory in proportion to the KV bytes in flight and
 * the rings; the provenance mode (data_mode) holds none (see
 * docs/simulator.md).
 */
#ifndef KVSTAGE_SIM_H
#define KVSTAGE_SIM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <kvstage/kvstage.h>
#include <kvstage/sim_report_fields.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_SIM_CONFIG_VERSION 1
#define KVS_SIM_REPORT_VERSION 1
/* Faults per run, as `kvstage sim --fault` (repeatable up to this). */
#define KVS_SIM_MAX_FAULTS 16
/* Instances per side of a cluster (spec §12). */
#define KVS_SIM_MAX_INSTANCES 32
/* Statuses a report lists in failure[] (the rest: failures_unlisted). */
#define KVS_SIM_MAX_FAILURE_KINDS 8
#define KVS_SIM_FAILURE_DETAIL_BYTES 256
/* kvs_sim_report_t.aux_error, NUL included. */
#define KVS_SIM_AUX_ERROR_BYTES 192

/* What simulated GPU memory holds (kvs_sim_config_t.data_mode). Both
 * modes run the same events, times and digest and check every KV slot of
 * every completed request; they differ in cost and in what a wrong byte
 * counts as. */
typedef enum kvs_sim_data_mode {
    KVS_SIM_DATA_BYTES = 0,      /* real bytes: host memory per simulated HBM
                                    byte in use, each byte compared */
    KVS_SIM_DATA_PROVENANCE = 1  /* where each byte came from (request, layer,
                                    K/V, head, token, offset), as runs whose
                                    number grows with copy and write
                                    descriptors, not bytes; every byte of a
                                    misplaced or missing run counts as
                                    corrupt */
} kvs_sim_data_mode_t;

/* How a request is paired with one instance of each side, at its arrival. */
typedef enum kvs_sim_router {
    KVS_SIM_ROUTER_ROUND_ROBIN = 0,  /* each side's instances in turn */
    KVS_SIM_ROUTER_LEAST_LOADED = 1  /* fewest requests in flight (arrived, not
                                        ended); ties to the lowest index */
} kvs_sim_router_t;

/*
 * One scenario. Zero fields take the simulator's defaults, noted per field
 * (they are the scenario's, not `kvstage sim`'s command-line defaults);
 * head_dim, layers, page_size, both TP sizes and a head count have none.
 * Bounds are those of `kvstage sim`'s flags; a value outside them fails
 * with KVS_EINVAL and a message naming the field.
 */
typedef struct kvs_sim_config {
    uint32_t version;           /* KVS_SIM_CONFIG_VERSION */
    uint32_t size_bytes;        /* sizeof(kvs_sim_config_t) */

    /* Model shape and parallelism, as kvs_layout_params_t. */
    int64_t total_heads;        /* model's KV heads, 1..1024; 0: use heads_per_rank */
    int64_t heads_per_rank;     /* fallback when total_heads is 0 */
    int64_t heads_per_rank_tp;  /* TP heads_per_rank refers to, 0: prefill_tp */
    int64_t head_dim;           /* 1..4096 */
    int64_t layers;             /* layers of the whole model, 1..4096 */
    int64_t page_size;          /* tokens per KV page, 1..2^24 */
    int64_t prefill_tp;         /* 1..1024; 0 with prefill_instances:
                                   instance 0's */
    int64_t decode_tp;          /* 1..1024; 0 with decode_instances: instance 0's */
    int64_t prefill_pp;         /* 0..1024, 0 -> 1 */
    int64_t decode_pp;          /* 0..1024, 0 -> 1; must be 1 or prefill_pp */
    int64_t chunk_tokens;       /* chunked-prefill size, multiple of page_size;
                                   0 -> 8192 */
    int32_t dtype;              /* kvs_dtype_t, 0 = bf16 */
    int32_t path;               /* kvs_path_t: AUTO (0: staging when the TP
                                   sizes differ, direct when equal), STAGING,
                                   DIRECT (equal TP sizes only) or SLICE */

    /* Workload. */
    uint32_t requests;          /* 0..1000000, 0 -> 16 */
    uint32_t max_inflight;      /* requests admitted at once by each instance,
                                   0..65536, 0 -> 4 */
    int64_t prompt_min_tokens;  /* prompt lengths uniform in [min, max] tokens,
                                   0..2^24; 0 -> 256 */
    int64_t prompt_max_tokens;  /* 0 -> max(1536, min) */
    int64_t prefix_max_tokens;  /* decode cached prefix drawn in [0, this],
                                   page aligned, not moved; 0..2^24, 0 = none */
    uint64_t rate_milli_per_s;  /* mean arrivals per 1000 s (Poisson),
                                   0..1e9; 0: all at t = 0 */
    uint64_t prefill_tokens_per_s; /* forward speed of each prefill instance,
                                      0 -> 16384 */
    uint64_t seed;              /* root seed: arrivals, lengths, fabric */

    /* Staging and liveness. */
    uint64_t ring_bytes;        /* decode staging ring per decode GPU,
                                   0..2^50; 0 -> 4096 MiB */
    uint32_t transfer_workers;  /* prefill staging buffers, 0..1024, 0 -> 4 */
    uint32_t reserved0;         /* must be 0 */
    uint64_t stall_timeout_ns;  /* a request without progress this long fails,
                                   0..86400 s; 0 -> 30 s */
    uint64_t max_events;        /* engine safety bound, 0 -> 2^40 */

    /* Hardware; 0 takes the default of sim/gpu.h and sim/fabric.h. */
    uint64_t gpu_hbm_bytes;         /* 0 -> 141 GiB (H200) */
    uint64_t gpu_hbm_bytes_per_s;   /* 0 -> 4.8e12 */
    uint64_t gpu_launch_ns;         /* per kernel launch, 0 -> 5000 */
    uint64_t net_link_bytes_per_s;  /* NIC line rate, 0..1.25e13;
                                       0 -> 50e9 (400 Gb/s) */
    uint64_t net_latency_ns;        /* one way, 0 -> 2000 */
    uint64_t net_per_op_ns;         /* NIC cost per work request, 0 -> 3700 */
    uint64_t net_ctrl_latency_ns;   /* control messages, 0 -> 20000 */
    uint64_t net_segment_bytes;     /* scheduling granularity, 0 -> 1 MiB */
    uint32_t net_mtu_bytes;         /* 0 -> 4096 */
    uint32_t net_header_bytes;      /* per packet, 0 -> 58 */

    /* Faults: nfaults (0..KVS_SIM_MAX_FAULTS) strings in the syntax of
     * `kvstage sim --fault`, e.g. "drop:staging_req:0.05" or
     * "link-down:p0:5000:20000". Borrowed for the call only. */
    const char *const *faults;
    uint32_t nfaults;
    uint32_t reserved1;         /* must be 0 */
    /* Chrome trace-event JSON written here, NULL = none. Borrowed. */
    const char *trace_path;
    /* (after the version 1 prefix: a caller whose size_bytes stops before
     * a field leaves it at 0, its default) */
    uint32_t net_sq_depth;      /* work requests a connection holds from post
                                   to polled completion, 0..65535; a post
                                   beyond it is refused with KVS_EAGAIN and
                                   the core posts it again; 0 = unlimited */
    uint32_t data_mode;         /* kvs_sim_data_mode_t, 0 = bytes (was
                                   reserved2, which had to be 0: the same
                                   size and the same runs) */
    /* Clusters (spec §12): several instances per side, each with its own
     * TP and PP, GPUs, KV pool and compute queue, every pair able to pair
     * (a decode of PP > 1 pairs only with prefill instances of its PP).
     * prefill_instances 0: one, of prefill_tp and prefill_pp; else instance
     * i has prefill_instance_tp[i] (1..1024) and prefill_instance_pp[i] (0
     * -> 1), and prefill_tp / prefill_pp are instance 0's (or 0). Likewise
     * for decode. Instances are numbered 0.. within their side: faults name
     * their ranks as p3@1 (TP rank 3 of prefill instance 1), and the
     * report lists them in that order. */
    uint32_t prefill_instances; /* 0..KVS_SIM_MAX_INSTANCES */
    uint32_t decode_instances;  /* 0..KVS_SIM_MAX_INSTANCES */
    int64_t prefill_instance_tp[KVS_SIM_MAX_INSTANCES];
    int64_t prefill_instance_pp[KVS_SIM_MAX_INSTANCES];
    int64_t decode_instance_tp[KVS_SIM_MAX_INSTANCES];
    int64_t decode_instance_pp[KVS_SIM_MAX_INSTANCES];
    int32_t router;             /* kvs_sim_router_t, 0 = round robin */
    /* Aux payloads (kvs_manager_config_t.max_aux_bytes): every rank's
     * limit, 0..KVS_AUX_BYTES_MAX, 0 = none (was reserved3, which had to
     * be 0: the same size and the same runs). Each request then carries a
     * payload of a length in [0, this] fixed by its index (none, a few
     * bytes, half the limit or more, the limit) from its prefill ranks to
     * every decode rank of its pair, checked byte for byte on each ok
     * result (the report's aux_bytes_verified and aux_corrupt_bytes). */
    uint32_t max_aux_bytes;
    uint32_t reserved3;          /* must be 0 */
    /* Progress (after max_aux_bytes: callers with a shorter size_bytes get
     * none): called about every 1/64 of the requests finishing, with done
     * of total and the simulated time, on the caller's thread; NULL = none.
     * `kvstage sim` draws its progress line with it. */
    void (*progress)(void *ctx, uint32_t done, uint32_t total, uint64_t sim_ns);
    void *progress_ctx;
    /* What a layer of the KV cache holds (kvs_kv_kind_t, 0 = GQA: K and V;
     * after progress_ctx: a shorter size_bytes leaves it GQA). KVS_KV_MLA:
     * one latent of head_dim elements per token and layer, the same on
     * every TP rank; total_heads and heads_per_rank 0 or 1. */
    int32_t kv_kind;
    uint32_t reserved4;          /* must be 0 */
    /* Tokens per page of every decode instance's KV pool (after reserved4: a
     * shorter size_bytes leaves it 0), 1..2^24; 0: page_size. page_size is
     * then the prefill's; chunk_tokens must be a multiple of both. */
    int64_t decode_page_size;
    /* Scale planes of an FP8 KV cache (kvs_kv_scales_t, 0: none; after
     * decode_page_size: a shorter size_bytes leaves none): a scale buffer
     * beside every K and V buffer, filled and verified slot by slot like
     * the KV (dtype must be fp8; docs/kinds/fp8-scales.md). scale_block:
     * elements per scale with per-block, 0: 32. */
    int32_t kv_scales;
    uint32_t scale_block;
    /* Prefill context parallelism (after scale_block: a shorter size_bytes
     * leaves 1), 0..1024, 0 -> 1: every prefill instance has this many CP
     * ranks, each of its TP x PP, each holding and writing one contiguous
     * token range of a request (kvs_layout_cp_range); they compute their
     * ranges in parallel, each at prefill_tokens_per_s. Every path moves
     * it (docs/kinds/context-parallel.md). */
    int64_t prefill_cp;
    /* Hybrid models (after prefill_cp: a shorter size_bytes leaves every
     * layer full): kvs_layout_params_t's layer pattern of the same names
     * (docs/kinds/hybrid.md), 0: every layer full. Moved on the staging
     * path; window rows and each request's state are filled and verified
     * in both data modes, and a window layer's pages before its window
     * are checked not to hold the request's bytes. other_layers is a
     * kvs_layer_kind_t. */
    int64_t full_attn_every;
    int32_t other_layers;
    uint32_t reserved5;          /* must be 0 */
    int64_t window_tokens;
    int64_t state_heads, state_conv_bytes, state_ssm_bytes;
    /* Draft KV of speculative decoding (after the layer pattern: a shorter
     * size_bytes has no draft): kvs_layout_params_t's draft_layers and
     * draft_head_dim (docs/kinds/draft.md), 0: no draft, 0: the model's
     * head dim. Moved on the staging path (auto picks it); every draft
     * byte is filled and verified in both data modes. */
    int64_t draft_layers;
    int64_t draft_head_dim;
} kvs_sim_config_t;

/* One instance's share of a run (kvs_sim_report_t.instance). */
typedef struct kvs_sim_instance {
    int32_t role;               /* kvs_role_t */
    uint32_t id;                /* its index within its side */
    int64_t tp, pp;
    uint32_t requests_ok;       /* requests paired with it that ended ok */
    uint32_t requests_failed;   /* ... that ended failed */
    uint64_t bytes;             /* payload bytes it moved: written (prefill)
                                   or received (decode) */
    uint64_t ring_peak_bytes;   /* decode: most ring bytes live on one of its
                                   ranks; prefill: 0 */
} kvs_sim_instance_t;

/* What operators read of one instance (kvs_sim_report_t.instance_metrics,
 * in the order of instance[]). Percentiles are exact: the nearest rank of
 * the sorted samples of the requests paired with it that ended ok (0 when
 * none did). */
typedef struct kvs_sim_instance_metrics {
    double ttft_p50_us, ttft_p90_us, ttft_p99_us; /* arrival -> its KV complete
                                   at the decode (the request done) */
    double transfer_p50_us, transfer_p99_us; /* its first chunk computed (the
                                   first byte may move) -> done */
    uint64_t ring_p99_bytes;    /* decode: time-weighted 99th percentile of
                                   the bytes live in one rank's ring over the
                                   run (at most 1% of sim_ns above it), the
                                   largest over its ranks; prefill: 0 */
    uint64_t watermark_waits;   /* over its ranks */
    double nic_util_mean;       /* over its ranks: payload bytes the rank's
                                   NIC carried (written by a prefill rank,
                                   received by a decode one) / (line rate x
                                   sim_ns), 0..1 */
    double nic_util_max;        /* the busiest of its ranks, same measure */
} kvs_sim_instance_metrics_t;

/* Requests that ended with one status (kvs_sim_report_t.failure). */
typedef struct kvs_sim_failure {
    int32_t status;             /* a KVS_E* code: kvs_status_name names it */
    uint32_t count;             /* requests whose first failure it was */
    char first_detail[KVS_SIM_FAILURE_DETAIL_BYTES]; /* the first of them in
                                   simulated time: request, its pair of
                                   instances, the rank, when, and why */
} kvs_sim_failure_t;

/* What a run did. Counts are over the whole cluster. Its members, their
 * order, types and meanings are the list of kvstage/sim_report_fields.h
 * (KVS_SIM_REPORT_FIELDS): read each field's meaning there. */
#define KVS__SIM_REPORT_HEAD(code, name, meaning) KVS_SIM_REPORT_CTYPE(code) name;
#define KVS__SIM_REPORT_FIELD(code, name, json, meaning) KVS_SIM_REPORT_CTYPE(code) name;
#define KVS__SIM_REPORT_ARRAY(elem, name, count, meaning) elem name[count];
typedef struct kvs_sim_report {
    KVS_SIM_REPORT_FIELDS(KVS__SIM_REPORT_HEAD, KVS__SIM_REPORT_FIELD, KVS__SIM_REPORT_ARRAY)
} kvs_sim_report_t;
#undef KVS__SIM_REPORT_HEAD
#undef KVS__SIM_REPORT_FIELD
#undef KVS__SIM_REPORT_ARRAY

/* One member of kvs_sim_report_t, as kvs_sim_report_field() describes it:
 * what a language binding builds its mirror from. */
typedef struct kvs_sim_report_field {
    const char *name;           /* as spelled in kvs_sim_report_t */
    const char *type;           /* scalars: "u32", "i32", "u64", "i64", "f64";
                                   arrays: their element type's C name
                                   ("char", "kvs_sim_instance_t", ...) */
    uint32_t offset;            /* offsetof(kvs_sim_report_t, name) */
    uint32_t size_bytes;        /* the whole member's size */
    uint32_t count;             /* elements: 1 for a scalar */
    int32_t json;               /* decimals `kvstage sim --json` prints a
                                   double with, 0 for an integer, -1 where it
                                   writes the key in its own way */
    uint32_t head;              /* 1: version, size_bytes, reserved (not a
                                   result of the run) */
    uint32_t reserved0;         /* 0 */
    const char *meaning;        /* one line */
} kvs_sim_report_field_t;

/* Member i of kvs_sim_report_t in struct order, or NULL past the last;
 * static storage. A binding that builds its mirror from these has the
 * report's one description (kvstage/sim_report_fields.h). */
KVS_API const kvs_sim_report_field_t *kvs_sim_report_field(uint32_t i);
/* sizeof(kvs_sim_report_t) in this library. */
KVS_API uint32_t kvs_sim_report_size(void);

/* A zeroed config with version and size set. */
static inline void kvs_sim_config_init(kvs_sim_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->version = KVS_SIM_CONFIG_VERSION;
    cfg->size_bytes = (uint32_t)sizeof *cfg;
}

/*
 * Runs the scenario of cfg and fills *out. Returns KVS_OK when the run
 * happened: requests that fail (e.g. under injected faults) are counted in
 * the report, not returned. Otherwise a status, and err (may be NULL) says
 * which config field to change: KVS_EVERSION for an unknown version or
 * size, KVS_EINVAL (or the layout planner's code, e.g. KVS_EHEAD_SPLIT) for
 * a bad field, KVS_ENOMEM when the cluster does not fit in host memory.
 * Deterministic: the same config gives the same report (digest included).
 * Thread-safe: runs share no state.
 */
KVS_API int kvs_sim_run(const kvs_sim_config_t *cfg, kvs_sim_report_t *out,
                        kvs_error_t *err);

/*
 * Checks cfg as kvs_sim_run does before it runs anything (version, size,
 * every field's bounds, the shape, the cluster, the fault strings, and a
 * ring that holds the largest region of the workload), and when resolved
 * is not NULL writes there the config the run would use: zero fields
 * given their defaults, both sides' instance lists written out (at least
 * one instance each). Returns KVS_OK or the status kvs_sim_run would
 * return, with err (may be NULL) naming the field and what to change.
 * Borrowed pointers (faults, trace_path, progress_ctx) are copied as they
 * are.
 */
KVS_API int kvs_sim_config_check(const kvs_sim_config_t *cfg, kvs_sim_config_t *resolved,
                                 kvs_error_t *err);

/* The values one numeric field of kvs_sim_config_t accepts: [min, max]
 * (signed fields) or [0, max] (unsigned ones; 0 is its default where it
 * has one). The one set of bounds: kvs_sim_run checks them, `kvstage sim`
 * scales its flags' limits from them. */
typedef struct kvs_sim_bound {
    const char *field;          /* as spelled in kvs_sim_config_t */
    int64_t min;
    uint64_t max;
} kvs_sim_bound_t;

/* The bound of field, or NULL for a field that has none (a pointer, dtype,
 * path, router, a hardware field free of bounds). Static storage. */
KVS_API const kvs_sim_bound_t *kvs_sim_config_bound(const char *field);

/*
 * Checks cfg as far as its cluster, in kvs_sim_run's order: version, size,
 * every field's bounds, the shape (the layout planner), and every prefill
 * instance against every decode instance, since the router may pair any
 * two. Not the path, the fault strings nor the ring: kvs_sim_config_check
 * checks them. Returns KVS_OK, or the status kvs_sim_run would return with
 * err (may be NULL) saying what to change. When a pair of instances cannot
 * pair (the planner's status, e.g. KVS_EHEAD_SPLIT or KVS_EPP_SPLIT),
 * *bad_prefill and *bad_decode (each may be NULL) are its instances'
 * indexes, else -1: `kvstage sim` names the flag to change from them.
 */
KVS_API int kvs_sim_cluster_check(const kvs_sim_config_t *cfg, int32_t *bad_prefill,
                                  int32_t *bad_decode, kvs_error_t *err);

/*
 * Checks one fault string, in the syntax of kvs_sim_config_t.faults and
 * `kvstage sim --fault`, against the cluster of cfg (cfg's own faults are
 * not read), as kvs_sim_run reads it. Returns KVS_OK; KVS_EINVAL with one
 * line in why (why_bytes; may be NULL/0) that starts with the quoted spec
 * and says what to change, listing the accepted forms (give it 512 bytes:
 * the line can be longer than KVS_ERROR_MSG_BYTES); or, when cfg itself is
 * refused, kvs_sim_cluster_check's status with its message in why.
 */
KVS_API int kvs_sim_fault_check(const kvs_sim_config_t *cfg, const char *spec, char *why,
                                size_t why_bytes);

/* ---- The workload, for programs outside the simulator ---------------------
 * What a run on real devices (`kvstage serve`) shares with the simulator
 * so that it moves and checks the same bytes: the prompt lengths a seed
 * gives, and the content of every KV head vector, a function of where the
 * vector sits alone, so a receiver checks each byte without a copy of what
 * was sent. Pure: no allocation, no state. */

/* Where a KV head vector sits in a model's KV cache. */
typedef struct kvs_sim_kv_coord {
    uint64_t request;           /* the request's index in its run */
    int64_t layer;              /* global layer: its stage's first + local */
    int32_t kv;                 /* 0 = K, 1 = V; 2, 3: the scales of K, of V
                                   (FP8 KV with scale planes) */
    int64_t head;               /* global KV head */
    int64_t token;              /* position in the request */
} kvs_sim_kv_coord_t;

/* Writes the len_bytes bytes of the vector at `at` to dst. */
KVS_API void kvs_sim_kv_fill(void *dst, size_t len_bytes, const kvs_sim_kv_coord_t *at);

/* The number of the len_bytes bytes at src that differ from the vector at
 * `at`: 0 when the vector arrived whole and in its place. */
KVS_API uint64_t kvs_sim_kv_check(const void *src, size_t len_bytes,
                                  const kvs_sim_kv_coord_t *at);

/*
 * The prompt lengths of requests 0..n-1 of a run of root seed `seed`, in
 * tokens, uniform in [min_tokens, max_tokens]: those kvs_sim_run draws for
 * a config of that seed and those prompt bounds (and n requests or more).
 * Writes out[0..n). Returns KVS_OK, or KVS_EINVAL with err (may be NULL)
 * naming the argument: bounds outside 1 <= min_tokens <= max_tokens <=
 * kvs_sim_config_bound("prompt_max_tokens")->max, or out NULL with n > 0.
 */
KVS_API int kvs_sim_prompt_tokens(uint64_t seed, int64_t min_tokens, int64_t max_tokens,
                                  int64_t *out, size_t n, kvs_error_t *err);

/* ---- Campaigns ------------------------------------------------------------
 * Many small random scenarios, each drawn as a kvs_sim_config_t from
 * (seed, run index) alone and judged by kvs_sim_run's verdict: the swarm
 * tester behind `kvstage sim --campaign N`. Deterministic: one config, one
 * report (digest included). Same ABI rules as above. */
#define KVS_SIM_CAMPAIGN_CONFIG_VERSION 1
#define KVS_SIM_CAMPAIGN_REPORT_VERSION 1
/* Fault kinds a campaign knows (kvs_sim_campaign_fault_name). */
#define KVS_SIM_CAMPAIGN_MAX_KINDS 16
#define KVS_SIM_CAMPAIGN_WHY_BYTES 256
/* Runs one campaign takes at most (kvs_sim_campaign_config_t.runs). */
#define KVS_SIM_CAMPAIGN_MAX_RUNS 100000000
/* Model kinds a campaign knows (kvs_sim_campaign_model_kind_name). */
#define KVS_SIM_CAMPAIGN_MAX_MODEL_KINDS 8

typedef struct kvs_sim_campaign_config {
    uint32_t version;          /* KVS_SIM_CAMPAIGN_CONFIG_VERSION */
    uint32_t size_bytes;       /* sizeof(kvs_sim_campaign_config_t) */
    uint64_t runs;             /* 1..KVS_SIM_CAMPAIGN_MAX_RUNS */
    uint64_t seed;             /* run i is drawn from (seed, i) alone */
    /* Fault kinds to draw: NULL for every kind, never two that the
     * campaign keeps apart (mixes no implementation could pass); else
     * "all", "none" or kinds separated by commas (e.g. "drop,stall"),
     * which lifts that rule. Borrowed for the call. */
    const char *faults;
    /* Model kinds to draw (docs/kinds/; after faults: a shorter size_bytes
     * means NULL): NULL or "all" for every kind at its odds, each from a
     * stream of its own, so the other draws of a run are what they were
     * before kinds were drawn; "none" for GQA with one page size and no
     * scale planes in every run (the campaign of before); else kinds
     * separated by commas out of kvs_sim_campaign_model_kind_name's (e.g.
     * "mla,per-token"): only those, and at least one in every run.
     * Borrowed for the call. */
    const char *kinds;
} kvs_sim_campaign_config_t;

/* One finished run, for the caller's callback. Every pointer is valid
 * for the callback only. */
typedef struct kvs_sim_campaign_run {
    uint64_t index;            /* 0..runs-1 */
    int32_t status;            /* kvs_sim_run's return */
    uint32_t nfaults;          /* of config */
    const kvs_sim_config_t *config; /* as drawn: kvs_sim_run(config) replays
                                   the run (its faults, borrowed, included) */
    const kvs_sim_report_t *report; /* all zero when it never ran */
    uint64_t violations;       /* 0: the run passed */
    const char *why;           /* the violations in words, "" when none */
    const char *error;         /* kvs_sim_run's message when status != KVS_OK */
} kvs_sim_campaign_run_t;

typedef void (*kvs_sim_campaign_fn)(void *ctx, const kvs_sim_campaign_run_t *run);

/* Totals over the runs. */
typedef struct kvs_sim_campaign_report {
    uint32_t version;          /* written by the library */
    uint32_t size_bytes;       /* set by the caller */
    uint64_t runs, runs_with_faults, runs_with_violations, violations;
    uint64_t requests_total, requests_ok, requests_failed;
    uint64_t hung_requests, ring_leaked_bytes, corrupt_bytes, unreported_failures;
    uint64_t collateral_failures, failed_without_faults;
    uint64_t setup_errors;     /* drawn configs kvs_sim_run refused: a bug of
                                  the generator or of a validation */
    uint64_t runs_stopped;     /* runs the simulator stopped midway */
    uint64_t runs_with_clusters; /* more than one instance on a side */
    uint64_t runs_large;       /* of those, large clusters (TP up to 8) */
    uint64_t runs_with_sq_depth, posts_refused;
    uint64_t runs_with_aux, aux_bytes_verified, aux_corrupt_bytes;
    uint64_t runs_provenance;  /* in the provenance data mode */
    uint64_t events, max_run_events;
    uint64_t digest;           /* of every run's digest, in order */
    uint32_t kinds;            /* entries of kind_drawn */
    uint32_t max_instances;    /* most instances a side is drawn with */
    uint64_t kind_drawn[KVS_SIM_CAMPAIGN_MAX_KINDS]; /* by fault kind */
    uint64_t paths[4];         /* runs by kvs_path_t the handlers ran */
    uint32_t max_sq_depth, max_aux_bytes; /* the largest drawn */
    uint64_t keys_granted;     /* region-scoped keys granted over the runs */
    uint64_t keys_leaked;      /* grants live after their run */
    uint64_t hostile_writes;   /* writes hostile-write faults sent astray */
    uint64_t hostile_bytes_landed; /* bytes of them that landed (must be 0) */
    uint32_t model_kinds;      /* entries of model_kind_runs */
    uint32_t reserved0;        /* 0 */
    /* Runs by model kind (kvs_sim_campaign_model_kind_name): MLA, two page
     * sizes, scale planes; a run may have several. */
    uint64_t model_kind_runs[KVS_SIM_CAMPAIGN_MAX_MODEL_KINDS];
    uint64_t runs_model_combined; /* runs of two model kinds or more */
} kvs_sim_campaign_report_t;

/* A zeroed campaign config with version and size set. */
static inline void kvs_sim_campaign_config_init(kvs_sim_campaign_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->version = KVS_SIM_CAMPAIGN_CONFIG_VERSION;
    cfg->size_bytes = (uint32_t)sizeof *cfg;
}

/*
 * Runs the campaign of cfg: calls on_run (may be NULL) with ctx after
 * each run, on the caller's thread, and fills *out (its size_bytes set
 * before the call). Returns KVS_OK when the campaign ran, violations or
 * not (out->violations says); otherwise KVS_EVERSION or KVS_EINVAL (a bad
 * runs count or faults string) with err (may be NULL) naming the field.
 */
KVS_API int kvs_sim_campaign_run(const kvs_sim_campaign_config_t *cfg,
                                 kvs_sim_campaign_fn on_run, void *ctx,
                                 kvs_sim_campaign_report_t *out, kvs_error_t *err);

/* The name of fault kind k (as in --fault and kvs_sim_campaign_config_t
 * .faults), or NULL past the last. Static storage. */
KVS_API const char *kvs_sim_campaign_fault_name(uint32_t kind);

/* The name of model kind k (as in kvs_sim_campaign_config_t.kinds and
 * `--campaign-kinds`: "mla", "page-sizes", "per-token", "per-block"), or
 * NULL past the last. Static storage. */
KVS_API const char *kvs_sim_campaign_model_kind_name(uint32_t kind);

#ifdef __cplusplus
}
#endif
#endif /* KVSTAGE_SIM_H */
