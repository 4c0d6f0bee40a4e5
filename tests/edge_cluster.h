/*
 * edge_cluster.h - a tiny simulated cluster for tests of the handlers and
 * the rank runtime (test_decode.c, test_prefill*.c, test_handler.c,
 * test_instance.c, test_link.c, test_rank.c, ...): one engine, sim
 * GPUs and NICs, the real managers and handlers created in the init order
 * of spec §8, each rank driven by a sim_driver_t (wake callbacks that
 * schedule one engine event per rank, as a real event loop would).
 *
 * The default cluster is prefill TP 2 -> decode TP 1 on a tiny shape (4 KV
 * heads, head dim 16, bf16, 2 layers, page 4, chunk 16 tokens: a full chunk
 * region is 8 KiB); options add prefill instances, odd ranks and faults.
 * Helpers open rooms on every rank, fill the prefill pools with a pattern,
 * run the engine to quiescence and check results, rings and every byte;
 * an intruder NIC speaks raw protocol for the hostile tests; a snapshot of
 * memory taken when a room ends, and the decode-ends-last check, watch for
 * writes that land after a room ended (spec §9).
 *
 * Nothing here is random except the sim fabric's remote keys, drawn from the
 * engine seed; EDGE_FAIL prints the seed with every failure.
 */
#ifndef KVS_TESTS_EDGE_CLUSTER_H
#define KVS_TESTS_EDGE_CLUSTER_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>

#include "driver.h"
#include "engine.h"
#include "fabric.h"
#include "gpu.h"
#include "wire.h"

/* The fingerprint settings of the managers here (no app tag, no aux). */
extern const kvs_manager_config_t edge_fp_cfg;

#define EDGE_SEED 0x6564676573ull   /* "edges" */
#define EDGE_MAX_NODES 12
#define EDGE_MAX_INSTANCES 4      /* prefill instances (spec §12) */
#define EDGE_MAX_LAYERS 4
#define EDGE_MAX_RESULTS 64
#define EDGE_ROOM_SLOT_PAGES 24      /* page ids reserved per room slot */
#define EDGE_ROOM_SLOTS 4
#define EDGE_POOL_PAGES (EDGE_ROOM_SLOT_PAGES * EDGE_ROOM_SLOTS)
#define EDGE_EVENT_BUDGET 1000000ull /* a run that needs more is a livelock */
#define EDGE_PREFILL_SESSION 0x100u  /* + tp rank */
#define EDGE_DECODE_SESSION 0x200u   /* + tp rank */

#define EDGE_FAIL(...)                                                                  \
    do {                                                                                \
        print_error("seed %llu: ", (unsigned long long)EDGE_SEED);                     \
        fail_msg(__VA_ARGS__);                                                          \
    } while (0)

typedef struct edge_cluster edge_cluster_t;

typedef struct edge_node {
    edge_cluster_t *cl;
    kvs_role_t role;
    int inst;                        /* prefill: its instance (id), 0 for the first */
    int dp;                          /* prefill: its attention group in the instance */
    int64_t tp;
    char name[16];
    sim_gpu_t *gpu;
    sim_nic_t *nic;
    kvs_manager_t *m;
    kvs_rank_t *rank;                /* its manager's handler, driven by drv */
    bool rank_owns_manager;          /* made by kvs_rank_create (opts.rank_create) */
    kvs_decode_t *dec;               /* the rank's handler (one of the two) */
    kvs_prefill_t *pre;
    sim_driver_t drv;                /* steps the rank as an event loop would */
    int64_t page_size, heads, layers, elem_bytes;
    bool mla;                        /* opts.mla: one plane, its one head global 0 */
    uint64_t pool_addr, layer_bytes, pool_bytes;
    uint8_t *pool_host;
    uint64_t k_base[EDGE_MAX_LAYERS], v_base[EDGE_MAX_LAYERS];
    uint64_t ks_base[EDGE_MAX_LAYERS], vs_base[EDGE_MAX_LAYERS]; /* odd_scales */
    bool crashed;                    /* edge_crash took it down */
    int progress_rc;                 /* first failure of a step */
    kvs_room_result_t res[EDGE_MAX_RESULTS]; /* their aux: copies in res_aux */
    uint8_t *res_aux[EDGE_MAX_RESULTS];
    int nres;
    uint32_t log_errors, log_warnings;
    uint32_t log_watched;            /* lines that held opts.log_watch */
    char log_last[KVS_ERROR_MSG_BYTES + 64];
} edge_node_t;

typedef struct edge_opts {
    int64_t prefill_tp, decode_tp;
    int64_t heads, head_dim, layers, page_size, chunk_tokens;
    kvs_dtype_t dtype;
    bool staging;
    kvs_path_t path;
    uint64_t ring_bytes;
    uint32_t ring_max_live, max_rooms, transfer_workers, max_inflight_writes;
    bool no_connect;                 /* leave kvs_decode_connect to the test */
    bool no_handlers;                /* stop after the KV buffers (and not connect) */
    /* Prefill ranks built with a different page size, dtype, path or
     * layout (TP / PP sizes). */
    int64_t odd_rank;                /* -1: none, -2: every prefill rank */
    int64_t odd_page_size;           /* 0: same */
    kvs_dtype_t odd_dtype;
    bool odd_dtype_set;
    bool odd_slice;                  /* staging off, slice path */
    int64_t odd_pp;                  /* 0: same; else stage 0 of this many (its layers) */
    int64_t odd_decode_tp;           /* 0: same; else the decode TP they believe in */
    uint32_t odd_app_tag;            /* their kvs_manager_config_t.app_tag (others 0) */
    bool odd_mla;                    /* kv_kind MLA: one latent buffer per layer of
                                        head_dim elements, one head */
    bool mla;                        /* every rank kv_kind MLA (a latent buffer of
                                        head_dim elements per layer, one head, the
                                        same on every TP rank): what moves and is
                                        checked is that one plane */
    bool odd_scales;                 /* kv_scales per-token (dtype must be fp8):
                                        a scale buffer beside each K and V */
    uint32_t max_aux_bytes;          /* of every rank */
    bool odd_max_aux_set;            /* ... but theirs is odd_max_aux */
    uint32_t odd_max_aux;
    sim_net_config_t net;
    sim_gpu_config_t gpu;            /* of every rank; hbm_bytes 0 -> 64 MiB */
    /* More prefill instances (spec §12): instance i > 0 of TP inst_tp[i]
     * (its ranks named i<i>p<tp>) that the decode ranks declare with
     * kvs_decode_add_instance; instance 0 is the default, of prefill_tp. */
    int instances;                   /* 0 -> 1 */
    int64_t inst_tp[EDGE_MAX_INSTANCES];
    int64_t inst_dp[EDGE_MAX_INSTANCES]; /* attention groups of inst_tp ranks each
                                          (DP attention), 0 -> 1 */
    int64_t inst_cp[EDGE_MAX_INSTANCES]; /* prefill CP ranks of inst_tp ranks each
                                          (docs/kinds/context-parallel.md), 0 -> 1;
                                          with inst_dp 0: node.dp is the CP rank */
    uint32_t max_instances;          /* of every rank, 0: the default */
    bool prefill_learns;             /* prefill ranks leave peer_tp_size 0: they learn
                                        the decode instance at its registration */
    bool rank_create;                /* every rank made by kvs_rank_create in one
                                        call (its KV as kvs_kv_layer_t), not step
                                        by step */
    /* Cluster secrets (docs/security.md): the environment variable each
     * role's ranks read theirs from, NULL: none (an open rank). */
    const char *prefill_secret_env, *decode_secret_env;
    const char *log_watch;           /* each node counts the log lines holding it */
    uint32_t extra_caps;             /* KVS_FABRIC_CAP_* bits every NIC's fabric
                                        claims besides its own */
} edge_opts_t;

/* Called after a node polled results (the node that got them, the new ones). */
typedef void (*edge_result_fn)(edge_cluster_t *cl, edge_node_t *n, const kvs_room_result_t *r);

#define EDGE_MAX_XCONNS 8

/* The intruder's link state per connection: next sequence number it sends,
 * next one it expects. */
typedef struct edge_xseq {
    kvs_conn_t *conn;
    uint32_t next, expected;
} edge_xseq_t;

struct edge_cluster {
    edge_opts_t o;
    edge_xseq_t xseq[EDGE_MAX_XCONNS];
    int nxseq;
    sim_engine_t *eng;
    sim_net_t *net;
    edge_node_t nodes[EDGE_MAX_NODES]; /* prefill ranks of instance 0, then decode
                                          ranks, then the other instances' ranks */
    int nprefill, ndecode;           /* instance 0's prefill ranks; decode ranks */
    int nextra;                      /* ranks of the other prefill instances */
    edge_result_fn on_result;
    void *on_result_ctx;
};

edge_opts_t edge_defaults(void);

edge_node_t *edge_prefill(edge_cluster_t *cl, int i);

edge_node_t *edge_decode(edge_cluster_t *cl, int i);

int edge_nnodes(const edge_cluster_t *cl);

/* Prefill rank tp of attention group g of instance inst. */
edge_node_t *edge_group_node(edge_cluster_t *cl, int inst, int g, int64_t tp);

edge_node_t *edge_inst_node(edge_cluster_t *cl, int inst, int64_t tp);

/* A step of n now (the test told it something). */
void edge_wake(edge_node_t *n);

/* n's rank exists (or is gone: NULL): its handler and driver follow. */
void edge_attach(edge_node_t *n, kvs_rank_t *rank);

/* Destroys n's handler (its manager stays). */
void edge_rank_drop(edge_node_t *n);

/* Runs everything that happens before the earliest stall deadline: the
 * cluster is then quiescent, with rooms that wait on the test (a computed
 * call, an open) still waiting, as they would while a real caller works.
 * A room without a result by then has none yet; edge_run_past_timeouts lets
 * the stall timeouts (30 s of simulated time) fire. */
void edge_run(edge_cluster_t *cl);

/* Runs until nothing at all is left, stall timeouts included. */
void edge_run_past_timeouts(edge_cluster_t *cl);

/* The manager (and handler) of a node, in the init order of spec §8. */
int edge_node_manager(edge_cluster_t *cl, edge_node_t *n, uint64_t session);

/* Connects decode rank d to each of its writers (named p<rank>). */
void edge_connect(edge_cluster_t *cl, int d);

edge_cluster_t *edge_create(const edge_opts_t *o);

/* Every decode rank registered with all its writers. */
void edge_assert_registered(edge_cluster_t *cl);

void edge_destroy(edge_cluster_t *cl);

/* Prefill rank n dies: its handler, memory and NIC vanish, so its peers
 * see their connections to it die. edge_restart brings it back. */
void edge_crash(edge_node_t *n);

/* A crashed prefill rank comes back under its name, with a new session. */
void edge_restart(edge_cluster_t *cl, edge_node_t *n);

/* Bytes of [base, total) of a room on every decode rank that are wrong. */
uint64_t edge_corrupt(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total);

/* Page ids of a room: slot (room % 4) of the pool. Prefill pages are
 * consecutive; decode pages skip one id after the second page, so the direct
 * path sees two page runs. */
int64_t edge_page(uint64_t room, int64_t i, bool decode);

/* The forward pass of tokens [0, total) of a room on one prefill rank. */
void edge_fill(edge_node_t *n, uint64_t room, int64_t total);
/* Fills tokens [start, end) only (a prefill CP rank's range); the rest of
 * the room's pages stay as they were. */
void edge_fill_range(edge_node_t *n, uint64_t room, int64_t start, int64_t end);

void edge_open_decode(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total);

void edge_open_prefill(edge_cluster_t *cl, int i, uint64_t room, int64_t total);

/* Opens a room on every rank: decode first, as a serving engine would. */
void edge_open(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total);

void edge_computed_on(edge_cluster_t *cl, int i, uint64_t room, int64_t end, bool final);

void edge_computed(edge_cluster_t *cl, uint64_t room, int64_t end, bool final);

/* Opens, computes in one step and runs a room to the end. */
void edge_transfer(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total);

/* The result of a room on a node; NULL when it has none. Two is a failure. */
const kvs_room_result_t *edge_result(const edge_node_t *n, uint64_t room);

/* The room ended on node n with exactly this status. */
const kvs_room_result_t *edge_expect(const edge_node_t *n, uint64_t room, int status);

/* The room ended with `status` on every rank of the cluster. */
void edge_expect_all(edge_cluster_t *cl, uint64_t room, int status);

uint64_t edge_ring_live_bytes(edge_cluster_t *cl);

void edge_expect_ring_empty(edge_cluster_t *cl);

/* A room ended ok everywhere and every byte arrived. */
void edge_expect_ok(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total);

typedef struct edge_room {
    uint64_t room;
    int64_t base, total;
} edge_room_t;

/* Opens n rooms at once, each computed whole, runs, and expects every one
 * ok with every byte right and the ring empty afterwards. */
void edge_transfer_ok(edge_cluster_t *cl, const edge_room_t *rooms, int n);

/* Opens a room paired with attention group g of prefill instance inst: on
 * every decode rank (naming the instance and group) and on that group's
 * prefill ranks. */
void edge_open_group(edge_cluster_t *cl, int inst, int g, uint64_t room, int64_t base,
                            int64_t total);

void edge_open_inst(edge_cluster_t *cl, int inst, uint64_t room, int64_t base,
                           int64_t total);

void edge_computed_group(edge_cluster_t *cl, int inst, int g, uint64_t room, int64_t end);

void edge_computed_inst(edge_cluster_t *cl, int inst, uint64_t room, int64_t end);

/* A room of group g of instance inst ended with `status` on the decode
 * ranks and on that group's prefill ranks, and no other rank reported it. */
void edge_expect_group(edge_cluster_t *cl, int inst, int g, uint64_t room, int status);

void edge_expect_inst(edge_cluster_t *cl, int inst, uint64_t room, int status);

/* A room of instance inst ended ok on every rank of its pair and every byte
 * of [base, total) arrived. */
void edge_expect_inst_ok(edge_cluster_t *cl, int inst, uint64_t room, int64_t base,
                                int64_t total);

/* Prefill context parallelism (inst_cp): opens a room of tokens [base,
 * total) paired with instance inst on every decode rank and on every CP
 * rank of the instance, each CP rank's pool holding its own range's tokens
 * only (kvs_layout_cp_range; the rest of its pool zero), gives aux (unless
 * aux_bytes is 0) on every prefill rank, computes it (final) and runs. */
void edge_cp_transfer(edge_cluster_t *cl, int inst, uint64_t room, int64_t base,
                      int64_t total, const void *aux, uint32_t aux_bytes);
/* After edge_cp_transfer: every decode rank and every CP rank reported the
 * room OK, each decode rank got the aux payload and counted the bytes of
 * [base, total) once, and every byte of [base, total) on every decode rank
 * is right. `what` names the case in failures. */
void edge_cp_expect_ok(edge_cluster_t *cl, int inst, uint64_t room, int64_t base,
                       int64_t total, const void *aux, uint32_t aux_bytes, const char *what);

/* Opts of the default cluster plus a second prefill instance of TP 4. */
edge_opts_t edge_two_instances(void);

kvs_handler_stats_t edge_stats(const edge_node_t *n);

int64_t edge_region_bytes(edge_cluster_t *cl, int64_t tokens);

void edge_send_raw(kvs_fabric_t *fab, kvs_conn_t *conn, const void *bytes, uint32_t len);

/* Sends msg on conn as the owner of fab would: a handler's NIC through that
 * handler's own link (its sequence numbers: what a confused or compromised
 * peer sends), the intruder with its own numbering per connection. */
void edge_send(edge_cluster_t *cl, kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_msg_t *msg);

kvs_conn_t *edge_conn(kvs_fabric_t *fab, const char *peer);

/* A NIC (on its own GPU) that no handler owns: the test speaks through it.
 * It behaves as a live peer's link would: whatever arrives is acknowledged
 * at once (ACKs and repeats dropped) and kept for edge_intruder_recv. */
#define EDGE_INBOX 32

typedef struct edge_intruder {
    edge_cluster_t *cl;
    sim_gpu_t *gpu;
    sim_nic_t *nic;
    kvs_fabric_t *fab;
    bool wake_pending;
    kvs_msg_t inbox[EDGE_INBOX];
    int ninbox;
    /* Its writes (edge_intruder_write): a buffer of EDGE_INTRUDER_WRITE_MAX
     * bytes of 0xEE, registered on first use, and each write's completion
     * status in the order they came (1 until it came). */
    uint64_t buf;
    kvs_mr_t *mr;
    int nwrites;
    int write_status[EDGE_INBOX];
} edge_intruder_t;

#define EDGE_INTRUDER_WRITE_MAX 65536u

void edge_intruder_create(edge_cluster_t *cl, edge_intruder_t *x);

void edge_intruder_destroy(edge_intruder_t *x);

/* The intruder writes len bytes of 0xEE to `peer` at remote_addr under
 * rkey (its connection to peer); returns the write's index in
 * x->write_status, which its completion fills. */
int edge_intruder_write(edge_intruder_t *x, const char *peer, uint64_t remote_addr,
                        uint64_t rkey, uint64_t len);

/* Control messages the intruder received since the last call. */
int edge_intruder_recv(edge_cluster_t *cl, edge_intruder_t *x, kvs_msg_t *out, int max);

/* The REGISTER decode rank 0 of this cluster sends, as a template. */
kvs_msg_t edge_register_msg(edge_cluster_t *cl);

/* ---- watching for writes after a room ended (spec §9) ---- */

/* Snapshot of a memory range taken when a chosen room's result appears:
 * set cl->on_result = edge_snap_on_result and cl->on_result_ctx to it. */
typedef struct edge_snap {
    uint64_t room;
    edge_node_t *node;      /* whose result triggers it */
    const uint8_t *mem;     /* watched range */
    size_t len;
    uint8_t *copy;
    bool taken;
} edge_snap_t;

void edge_snap_on_result(edge_cluster_t *cl, edge_node_t *n, const kvs_room_result_t *r);

/* Bytes of the watched range that changed after the snapshot. */
size_t edge_snap_changed(const edge_snap_t *s);

/* Every prefill rank that ended the room ended it no later than the decode:
 * a decode that ends (and frees) a room before a writer is done lets that
 * writer's in-flight writes land in memory it has handed back (spec §9). */
void edge_expect_decode_last(edge_cluster_t *cl, uint64_t room);

#endif
