/*
 * serve_rank.h - one rank of `kvstage serve`: a host device, a fabric (verbs
 * or ofi), a kvstage rank (kvs_rank_create) on them and its driver
 * (kvstage/driver.h),
 * and the workload it moves. Each rank runs on its own thread, which opens
 * the rooms and checks the results, while its driver's progress thread
 * steps the rank (every rank call goes through the driver's lock; the
 * fabric is used through the rank only). Ranks of one process share
 * only the read-only plan and a stop flag (a rank that fails stops its
 * siblings instead of leaving them to wait out the time-out).
 *
 * A process is one instance (spec §12): every rank of one prefill instance,
 * or of the one decode instance (id 0). Ranks: TP x PP. Rank (tp t, stage
 * s) holds stage s's layers of the model (kvs_layout_stage_layers: the last
 * layers % PP stages hold one more); prefill rank (t, s) listens on
 * listen_port + s * P + t. With prefill context parallelism
 * (--prefill-cp C, docs/kinds/context-parallel.md) a prefill process runs
 * C x PP x TP ranks, rank (t, s) of CP rank c listening on listen_port +
 * (c * PP + s) * P + t (the order of kvs_instance_desc_t.addrs); each CP
 * rank computes, and fills its pool for, its token range of every room
 * only (kvs_layout_cp_range). A decode rank declares every prefill instance
 * of the plan (with its CP size) and connects to the ranks of each that
 * write to it (its TP writers at every prefill stage holding its layers:
 * all of them when the decode has PP 1, stage s alone when its PP is the
 * instance's; those of every CP rank).
 *
 * The workload is a pure function of the plan (the seed drew the prompt
 * lengths; the router pairs room i with prefill instance i % instances), so
 * every process opens the same rooms with the same lengths, each prefill
 * only its own, without talking outside the kvstage protocol. The prefill
 * writes sim/kvdata's pattern into its KV pool before it tells the handler
 * a chunk is computed; the decode checks every byte it received against the
 * same pattern (a pattern of global heads, so the prefill's TP is no part
 * of it). Each side pages its pool by its own page size (the decode by the
 * layout's decode_page_size) and checks token t in its room's page t / ps;
 * an MLA pool holds one plane per layer (the latent, head 0 on every rank,
 * published with v_addr 0), and a decode rank registers with every source
 * of its rooms, the silent ones that only report their status included.
 */
#ifndef KVSTAGE_TOOLS_SERVE_RANK_H
#define KVSTAGE_TOOLS_SERVE_RANK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <kvstage/fault_fabric.h>
#include <kvstage/kvstage.h>

/* A prefill instance as the decode process knows it. */
typedef struct cli_serve_instance {
    const char *ip;             /* its ranks' address */
    uint16_t port;              /* rank (t, s) of CP rank c listens on
                                   port + (c * pp + s) * tp + t */
    int64_t tp, pp;
    int64_t cp;                 /* its CP ranks (--prefill-cp; 1: none) */
    kvs_layout_t lay;           /* its pair with the decode */
} cli_serve_instance_t;

/* What every rank of a run shares (read-only while ranks run). */
typedef struct cli_serve_plan {
    kvs_layout_t lay;           /* the pair this process serves (decode: its
                                   pair with instance 0; the decode side of
                                   every pair is the same) */
    kvs_dtype_t dtype;
    uint32_t requests;
    const int64_t *tokens;      /* [requests]: prompt length of room i */
    const int64_t *first_page;  /* [requests]: first pool page of room i,
                                   for the rooms this process serves */
    int64_t pool_pages;         /* pages of each rank's KV pool */
    uint32_t instances;         /* prefill instances the router pairs rooms
                                   with: room i with instance i % instances */
    uint32_t instance;          /* prefill: this process's instance */
    const cli_serve_instance_t *peers; /* decode: [instances], by id */
    uint64_t ring_bytes;
    uint32_t max_inflight;      /* rooms open at once per rank */
    uint32_t transfer_workers;
    uint64_t stall_timeout_ns;  /* 0: the library's default */
    const char *secret_file;    /* the cluster secret's file or variable, */
    const char *secret_env;     /* NULL: none (docs/security.md) */
    const char *const *devices; /* [ranks]: RDMA device of rank (t, s) of CP
                                   rank c at (c * PP + s) * TP + t; NULL (all
                                   or one): automatic */
    const char *const *near_gpus; /* [ranks]: PCI bus id whose closest RDMA
                                   device rank (t, s) takes, as devices;
                                   NULL: none */
    bool ofi;                   /* the libfabric fabric, else verbs */
    const char *provider;       /* ofi: the provider's name */
    const char *bind_ip;        /* this process's address, NULL: the GID's */
    uint16_t listen_port;       /* prefill rank (t, s) of CP rank c listens on
                                   listen_port + (c * Pp + s) * P + t */
    uint64_t fail_write;        /* prefill rank (0, 0): spoil this write (1-based), 0: none */
    kvs_fault_kind_t write_fault; /* ... how (kvstage/fault_fabric.h) */
    bool replay_registration;   /* decode rank (0, 0): replay its registration
                                   on a new connection at the end */
    bool swap_pages;            /* decode: give the core each room's pages with
                                   the first two swapped, check the unswapped
                                   list (--fault swap-pages: a wrong page
                                   mapping the check must catch) */
    bool shift_scales;          /* decode, with kv_scales: publish each layer's
                                   scale buffers as the next layer's, check
                                   them where they belong (--fault
                                   shift-scales: a wrong scale mapping the
                                   check must catch) */
    bool hold;                  /* prefill: never compute rooms from hold_from on */
    uint32_t hold_from;
    uint64_t timeout_ns;        /* give up when the run is not over by then */
    uint64_t linger_ns;         /* keep serving the peer this long after the end */
    bool no_verify;             /* --no-verify: no pattern written or checked (a
                                   benchmark of the transfer alone) */
    struct cli_metrics *metrics; /* --metrics: ranks join it (serve_metrics.h), NULL */
    struct cli_disc *disc;      /* --discovery: ranks publish themselves there and a
                                   decode's ranks follow it (serve_discovery.h), NULL */
    uint64_t metrics_hold_ns;   /* keep the ranks up this long after the run */
    uint32_t workload_tag;      /* hash of the requests, prompt lengths and
                                   prefill instance count: the managers'
                                   app_tag, so every process must run the
                                   same workload and router */
} cli_serve_plan_t;

/* The prefill instance room i is paired with: the router, round robin by
 * request index. */
static inline uint32_t cli_serve_route(const cli_serve_plan_t *pl, uint32_t room)
{
    return room % pl->instances;
}

/* Whether a process of `role` serves room i: the decode every room, a
 * prefill the rooms paired with its instance. */
static inline bool cli_serve_serves(const cli_serve_plan_t *pl, kvs_role_t role, uint32_t room)
{
    return role == KVS_ROLE_DECODE || cli_serve_route(pl, room) == pl->instance;
}

/* One rank and, after cli_serve_rank_run, what it saw. */
typedef struct cli_serve_rank {
    const cli_serve_plan_t *plan;
    kvs_role_t role;
    int64_t tp, pp;             /* TP rank and pipeline stage */
    int64_t cp;                 /* prefill: its context-parallel rank (0: none) */
    atomic_bool *stop;          /* shared by the process's ranks: set by one that failed */
    /* results */
    int *status;                /* [requests]: KVS_OK, a failure, or 1: no
                                   result (rooms it does not serve stay 1) */
    uint64_t payload_bytes;     /* bytes its results report */
    uint64_t bytes_verified, corrupt_bytes; /* decode */
    uint64_t start_ns, end_ns;  /* first room opened, last result in */
    uint64_t pattern_ns;        /* time spent writing or checking the pattern */
    uint64_t spoiled_writes;    /* --fault writes that went out spoiled */
    uint64_t swapped_rooms;     /* --fault swap-pages: rooms opened with two
                                   pages swapped */
    int stale_status;           /* --fault stale-write: how its second post
                                   ended (KVS_OK: it landed), 1: not made */
    uint32_t replayed, replay_answers; /* --fault replay-registration: messages
                                   replayed, answers to them */
    int replay_status;          /* ... KVS_OK, or why it could not be made */
    bool held;                  /* --fault hold-from: it held a room */
    kvs_handler_stats_t stats;
    int fatal;                  /* KVS_OK, or why the rank stopped early */
    char err[640];
} cli_serve_rank_t;

/* Thread main of a rank (arg: cli_serve_rank_t *, with plan, role, tp, pp,
 * stop and status set). Sets up, runs every request to its end, to the
 * time-out or until *stop, tears everything down, and returns NULL. A rank
 * that fails sets *stop. */
void *cli_serve_rank_run(void *arg);

#endif
