/*
 * run.h (internal) - the state of one simulated run (sim_scenario_run of
 * scenario.h), shared by the files that make a run, one job each:
 * scenario.c (setting a run up, the run loop, freeing it), node.c (the
 * cluster's life: building it, a rank's setup, teardown and connections),
 * faults.c (the faults injected, crashes and restarts), workload.c (the
 * requests: arrivals, the router, admission, prefill compute, results),
 * verify.c (the KV pattern written into prefill pools and checked in
 * decode pools), report.c (the report and its metrics), hostile.c (the
 * hostile writers' fabric wrappers) and run.c (failing the run or a
 * request, the KV page pools). Calls go one way: scenario.c -> faults.c
 * -> node.c, workload.c -> hostile.c, verify.c, report.c -> run.c
 * (node.c hands workload.c's result callbacks to each rank's driver;
 * faults.c schedules its own events); tests/call_graph.py checks that no
 * two of them call each other.
 */
#ifndef KVS_SIM_RUN_H
#define KVS_SIM_RUN_H

#include "scenario.h"

#include "check.h"
#include "driver.h"
#include "engine.h"
#include "hostile.h"
#include "kvdata.h"
#include "trace.h"

#include <kvstage/backend.h>

#include <stdbool.h>
#include <stdint.h>

/* A KV page pool: taken[id] says whether page id is in use; count pages
 * are free, none below low. */
typedef struct sim_pages {
    uint8_t *taken;
    int64_t count, cap, low;
} sim_pages_t;

typedef struct sim_scenario sim_scenario_t;
typedef struct sim_inst sim_inst_t;

/* From at_ns on, a decode ring held live_bytes (sim_node_t.ring_changes). */
typedef struct sim_ring_change {
    uint64_t at_ns, live_bytes;
} sim_ring_change_t;

typedef struct sim_node {
    sim_scenario_t *sc;
    sim_inst_t *inst;            /* its instance */
    kvs_role_t role;
    int64_t tp, pp;              /* in its instance */
    int64_t cp;                  /* its CP rank (prefill; 0 on a decode) */
    char name[64];                /* its NIC's address too */
    sim_gpu_t *gpu;
    sim_nic_t *nic;
    kvs_rank_t *rank;            /* NULL while down */
    sim_driver_t drv;            /* steps the rank on the engine */
    uint64_t pool_addr, layer_bytes;
    int64_t ps;                  /* tokens per page of its KV pool: its side's
                                    (kvs_layout_t page_size or decode_page_size) */
    uint8_t *pool_host;          /* host view of the whole KV pool */
    int64_t layers, heads;       /* local */
    int64_t first_layer;         /* global id of its stage's first layer */
    uint64_t *k_base, *v_base;
    uint64_t *ks_base, *vs_base; /* scale buffers (kv_scales), else NULL */
    uint64_t scale_layer_bytes;  /* bytes of one scale buffer, 0 without */
    /* State layers (docs/kinds/hybrid.md): per local layer its state
     * buffer, [request][local state head][state head bytes] (0 for other
     * layers), after the scales; NULL without state layers. A request's
     * state slot is its index. */
    uint64_t *state_base;
    int64_t state_heads;         /* local state heads */
    /* A draft model (docs/kinds/draft.md): per draft layer its K and V
     * buffers (V NULL for MLA), laid out as the model's with the draft's
     * head dim, after the state; NULL without a draft, and on a stage
     * before its instance's last (only the last holds the draft). */
    uint64_t *draft_k_base, *draft_v_base;
    uint64_t draft_layer_bytes;  /* bytes of one draft buffer, 0 without */
    uint32_t gpu_id;
    bool down;                   /* crashed, or failed its init: no handler */
    bool hbm_full;               /* its GPU holds the KV pool and nothing more */
    uint8_t *reported;           /* [requests]: this rank's result is in */
    kvs_handler_stats_t acc;     /* counters of its previous incarnations */
    uint64_t acc_posts_refused;  /* ... and of their NICs */
    uint64_t acc_planted_bytes;
    uint64_t bytes_received;     /* decode: payload bytes of its room results */
    /* Decode: its ring's live bytes over time, one entry per change, sampled
     * after every step (the only place the core changes a ring) and when
     * the rank goes down: exact, and no event of its own. */
    sim_ring_change_t *ring_changes;
    size_t nring_changes, ring_changes_cap;
} sim_node_t;

/* A model replica: its ranks, KV page pool, admission count and, for a
 * prefill instance, its compute queue (instances compute in parallel). */
struct sim_inst {
    kvs_role_t role;
    uint32_t id;                 /* index within its side */
    int64_t tp, pp;
    int64_t cp;                  /* CP ranks (prefill; 1 on a decode) */
    sim_node_t *nodes;           /* its cp * pp * tp ranks: CP rank c's stage
                                    s's TP rank t at (c * pp + s) * tp + t */
    int64_t nranks;
    sim_pages_t pages;
    uint32_t admitted;           /* requests admitted, not ended */
    uint32_t routed;             /* requests routed to it, not ended: its
                                    load as the router sees it */
    uint32_t compute_first, compute_last; /* prefill: forward-pass FIFO
                                    (sim_req_t.next_compute), UINT32_MAX: empty */
    bool computing;
    bool faulted;                /* a fault struck one of its ranks or the
                                    whole cluster */
};

/* What a pair of instances shares: its layout and the groups of its ranks
 * that talk to each other. */
typedef struct sim_pair {
    kvs_layout_t lay;
    int64_t *group;              /* [prefill ranks + decode ranks of the pair]:
                                    ranks that talk to each other, directly or
                                    through one another (bit index, < 64) */
    int64_t ngroups;
} sim_pair_t;

typedef enum { SIM_REQ_WAITING, SIM_REQ_ADMITTED, SIM_REQ_DONE } sim_req_state_t;

typedef struct sim_req {
    sim_inst_t *pi, *di;         /* its instances (the router's pick) */
    uint32_t next_waiting;       /* admission list, UINT32_MAX: last */
    uint32_t next_compute;       /* its prefill instance's compute FIFO */
    int64_t tokens, base;
    uint64_t arrival_ns, computed_ns, done_ns;
    uint64_t first_chunk_ns;     /* its first chunk computed: bytes may move */
    int64_t *ppages, *dpages;    /* ceil(tokens/ps), ceil((tokens-base)/ps);
                                    with prefill CP every CP rank takes the
                                    whole list, by token, and holds the rows
                                    of its range only */
    int64_t computed;            /* tokens into each CP rank's range (the
                                    request's tokens without CP) */
    uint64_t opened_ns;
    int64_t reports_left;
    int status;
    bool unreported;             /* a rank timed out after a peer failed */
    uint64_t failed_groups;      /* bit g: a rank of group g failed it for real */
    uint64_t timed_out_groups;   /* bit g: a rank of group g timed out on it */
    uint64_t *failed_ns;         /* [groups], when; NULL until the first such */
    bool untellable;             /* a rank of it crashed, was down, or was cut off
                                    for a stall timeout or more: nobody could tell
                                    it, so its timeouts are expected */
    sim_req_state_t state;
    uint32_t ranks_ok, ranks_peer, ranks_other, ranks_down; /* results by kind */
} sim_req_t;

struct sim_scenario {
    sim_scenario_config_t cfg;
    sim_topology_t topo;         /* resolved: every instance listed */
    kvs_layout_t lay;            /* pair (0, 0): what every pair shares (model
                                    shape, page size, grid) */
    sim_engine_t *eng;
    sim_net_t *net;
    sim_node_t *nodes;           /* prefill instances' ranks, then decode ones' */
    int64_t nprefill, ndecode;   /* over every instance */
    sim_inst_t *insts;           /* prefill instances, then decode ones */
    uint32_t npinst, ndinst;
    sim_pair_t *pairs;           /* [npinst * ndinst], prefill-major */
    uint32_t rr_prefill, rr_decode; /* round robin: the next instance */
    int64_t pool_pages;          /* per rank, every instance alike */
    int64_t *slot_runs;          /* sim_prov_pass: [2 * slot_runs_cap] */
    size_t slot_runs_cap;
    sim_req_t *reqs;
    uint32_t waiting_first, waiting_last; /* admission list in arrival order
                                    (sim_req_t.next_waiting), UINT32_MAX: empty */
    uint32_t finished;
    uint64_t first_arrival_ns, last_done_ns;
    uint64_t bytes_verified, corrupt_bytes;
    uint64_t aux_bytes_verified, aux_corrupt_bytes; /* aux payloads (the
                                    second also counted in corrupt_bytes) */
    char aux_error[SIM_AUX_ERROR_BYTES]; /* the first wrong payload */
    uint8_t *aux_buf;            /* [max_aux_bytes]: the payload of the request
                                    being opened (the ranks copy it) */
    int fatal;
    char *err;
    size_t err_bytes;
    sim_trace_t *trace;
    bool msg_faults;             /* a drop/dup/delay fault: NICs get the filter */
    sim_hostile_state_t hostile[SIM_MAX_FAULTS]; /* by fault index */
    uint32_t hostile_writes;     /* sent astray so far */
    uint32_t ranks_crashed, ranks_restarted, ranks_down_at_start;
    uint32_t long_cuts;          /* links down now for a stall timeout or more */
    uint64_t ring_bytes_needed;  /* check.h: the largest region a request needs */
    sim_failure_t failures[SIM_MAX_FAILURE_KINDS]; /* first detail of each status;
                                    counts are taken at the report */
    uint32_t nfailures;
    char init_error[384];
};

static inline sim_inst_t *sim_prefill_inst(sim_scenario_t *sc, uint32_t i) { return &sc->insts[i]; }
static inline sim_inst_t *sim_decode_inst(sim_scenario_t *sc, uint32_t i)
{
    return &sc->insts[sc->npinst + i];
}
static inline sim_pair_t *sim_pair_of(sim_scenario_t *sc, const sim_req_t *r)
{
    return &sc->pairs[r->pi->id * sc->ndinst + r->di->id];
}
/* Node n's index among the ranks of its pair (prefill ranks first). */
static inline int64_t sim_pair_index(const sim_req_t *r, const sim_node_t *n)
{
    return n->role == KVS_ROLE_PREFILL ? n - r->pi->nodes : r->pi->nranks + (n - r->di->nodes);
}
/* Node n is a rank of request r's pair. */
static inline bool sim_in_pair(const sim_req_t *r, const sim_node_t *n)
{
    return n->inst == r->pi || n->inst == r->di;
}

/* Its GPU or NIC has news, or the scenario told it something: a step. */
static inline void sim_node_wake(sim_node_t *n) { sim_driver_wake(&n->drv); }

/* ---- node.c ------------------------------------------------------------------ */

/* The instances, their ranks, page pools and compute queues, and every
 * pair's layout and groups (no rank set up yet). */
int sim_build_cluster(sim_scenario_t *sc);
/* Sets rank n up on GPU gpu_id: its GPU, NIC, KV pool and kvstage rank.
 * A rank whose GPU is full (hbm-full) reports why and stays down (n->rank
 * NULL, KVS_OK). */
int sim_node_setup(sim_scenario_t *sc, sim_node_t *n, uint32_t gpu_id);
/* Frees everything rank n holds, keeping its counters (n->acc). */
void sim_node_teardown(sim_node_t *n);
/* Decode rank n declares every prefill instance and connects to its
 * writers in each. */
int sim_connect_node(sim_scenario_t *sc, sim_node_t *n);
/* sim_connect_node of every decode rank that is up. */
int sim_connect_all(sim_scenario_t *sc);

/* ---- faults.c ---------------------------------------------------------------- */

/* Checks every fault against the cluster (sim_build_cluster's), marks the
 * instances it strikes and schedules the timed ones. Before any rank is
 * set up: hbm-full shapes a rank's GPU. */
int sim_faults_check(sim_scenario_t *sc);
/* What the faults set on rank n's GPU and NIC once it is up. */
void sim_faults_arm(sim_scenario_t *sc, sim_node_t *n);

/* ---- workload.c -------------------------------------------------------------- */

/* Draws every request's arrival, prompt length and cached prefix and
 * schedules its arrival. */
int sim_workload_schedule(sim_scenario_t *sc);
/* Rank n's result for request i is in: its own (from its handler), or not
 * (it was down or crashed). */
void sim_report_in(sim_scenario_t *sc, sim_node_t *n, uint32_t i, int status, bool own);
/* The driver's callbacks (ctx: the node): a room's result, a failed step. */
void sim_node_result(void *ctx, const kvs_room_result_t *res);
void sim_node_error(void *ctx, int status);

/* ---- run.c ------------------------------------------------------------------- */

/* Fails the run (the first status and message win) and stops the engine. */
int sim_fail(sim_scenario_t *sc, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Request i ends with `status` (its first failure), which `who` saw: the
 * first request of each status leaves its detail for the report. */
void sim_request_failed(sim_scenario_t *sc, uint32_t i, int status, const char *who);
/* A pool of n free pages; KVS_ENOMEM. */
int sim_pages_init(sim_pages_t *p, int64_t n);
/* Takes n free pages (the caller checked there are) into out. */
void sim_pages_take(sim_pages_t *p, int64_t *out, int64_t n);
/* Gives pages ids back. */
void sim_pages_give(sim_pages_t *p, const int64_t *ids, int64_t n);

/* ---- verify.c ---------------------------------------------------------------- */

/* Writes the pattern of tokens [a, b) of request req into prefill node n's
 * pool (bytes or provenance, as the run's data mode says). */
void sim_fill_prefill(sim_scenario_t *sc, sim_node_t *n, uint64_t req, int64_t a, int64_t b);
/* Checks decode node n's rows of request req against the pattern: the
 * bytes compared, and in *corrupt those that differ. */
uint64_t sim_verify_decode(sim_scenario_t *sc, sim_node_t *n, uint64_t req,
                           uint64_t *corrupt);
/* Checks an ok result's aux payload against the request's (the only place
 * its bytes are valid). */
void sim_verify_aux(sim_scenario_t *sc, const sim_node_t *n, const kvs_room_result_t *res);

/* ---- report.c ---------------------------------------------------------------- */

/* The run's report: counts, verdict inputs, metrics, per instance. */
void sim_report_fill(sim_scenario_t *sc, sim_report_t *out);

#endif
