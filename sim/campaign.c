/*
 * campaign.c - kvs_sim_campaign_run (include/kvstage/sim.h): N small
 * random scenarios, each drawn as a kvs_sim_config_t from (seed, run)
 * alone, run with kvs_sim_run and judged by its verdict (check.h), with
 * totals. Printing, the progress line and the replay command line are the
 * caller's (`kvstage sim --campaign`, tools/campaign.c): a run's config is
 * all a replay needs.
 *
 * Run i draws from its own stream sim_rng_init(S, i), so any run replays
 * alone. Scenarios are small (a few layers, small heads, short prompts,
 * few requests) because simulated GPU memory is real host memory in the
 * bytes data mode: a campaign explores many shapes, loads and fault
 * mixes, not big models.
 *
 * Knobs added after the first draws come from streams of their own (the
 * run's index with one high bit set: no run index has it), so a run
 * without them is drawn as before they existed: clusters of 1-4 instances
 * per side (SIM_CAMPAIGN_CLUSTER_PCT), send queues that fill, aux
 * payloads, large clusters (up to 4 x 4 instances, TP up to 8), the
 * provenance data mode and the model kinds of docs/kinds/ (an MLA latent,
 * two page sizes, FP8 scale planes; SIM_CAMPAIGN_MLA_PCT), which change
 * the shape drawn before them and nothing else.
 *
 * Faults come from sim_campaign_fault_kinds: one row per fault kind with
 * its odds, its classes and a function that writes a spec. By default
 * every kind is drawn, but never two whose classes sim_campaign_conflicts
 * keeps apart; a config's faults string names the kinds and lifts that
 * rule. A `stall` run carries its fault (stall:MS), so its verdict is the
 * library's like any other's: nothing is excused here.
 *
 * No clock, no output, no global state: two campaigns of one seed give one
 * report.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvstage/kvstage.h>
#include <kvstage/sim.h>

#include "rng.h"
#include "topology.h"

#define SIM_CAMPAIGN_SPEC_BYTES 128
/* Faults in a run that has any: 1..this. */
#define SIM_CAMPAIGN_MAX_FAULTS 4
/* Engine events one run may dispatch: over 10x what the largest draw
 * needed in 12000 runs, so a run that hits it is stuck (counted as hung),
 * not slow. */
#define SIM_CAMPAIGN_MAX_EVENTS 5000000
/* What a run may cost, in the generator's estimate of its writes and
 * messages: keeps the slowest runs within ~20x of the mean. */
#define SIM_CAMPAIGN_COST 20000
/* Stall timeout of runs without faults: the library default, since there
 * nothing may fail. */
#define SIM_CAMPAIGN_CLEAN_STALL_MS 30000
/* Send queues that fill: in this share of the runs (percent), --sq-depth
 * 1..SIM_CAMPAIGN_MAX_SQ_DEPTH, so the fabric refuses posts and the core
 * must post them again. Drawn from a stream of its own (the run's index
 * with this bit set: no run index has it), so every other draw of a run
 * is what it was before the knob existed. */
#define SIM_CAMPAIGN_SQ_PCT 25
#define SIM_CAMPAIGN_MAX_SQ_DEPTH 4
#define SIM_CAMPAIGN_KNOB_STREAM (UINT64_C(1) << 63)
/* Aux payloads: in this share of the runs (percent), --aux-bytes from
 * the list in sim_campaign_generate, so a run's requests carry payloads of one
 * byte up to several AUX messages (4000 bytes each) to every decode rank.
 * Drawn from a stream of its own (the run's index with this bit set), so a
 * run without them is drawn as before the knob existed. */
#define SIM_CAMPAIGN_AUX_PCT 25
#define SIM_CAMPAIGN_MAX_AUX_BYTES 16384
#define SIM_CAMPAIGN_AUX_STREAM (UINT64_C(1) << 61)
/* Clusters (spec §12): in this share of the runs (percent), 1..
 * SIM_CAMPAIGN_MAX_INSTANCES instances per side of mixed TP and PP, and
 * the least-loaded router in half of them; drawn from a stream of their own
 * (the run's index with this bit set), so a run of one instance per side
 * is drawn as before clusters existed. At most SIM_CAMPAIGN_MAX_CLUSTER_RANKS
 * ranks in all keep a cluster's set-up (every decode rank connects to its
 * writers in every prefill instance) within the cost of a run. */
#define SIM_CAMPAIGN_CLUSTER_PCT 40
#define SIM_CAMPAIGN_MAX_INSTANCES 4
#define SIM_CAMPAIGN_MAX_CLUSTER_RANKS 24
#define SIM_CAMPAIGN_CLUSTER_STREAM (UINT64_C(1) << 62)
/* Large clusters: in this share of the runs the cluster draw above left
 * at one instance per side (percent), 2..SIM_CAMPAIGN_MAX_INSTANCES
 * instances per side of TP up to 8, up to SIM_CAMPAIGN_MAX_LARGE_RANKS
 * ranks in all; a stream of their own. */
#define SIM_CAMPAIGN_LARGE_PCT 8
#define SIM_CAMPAIGN_MAX_LARGE_RANKS 64
#define SIM_CAMPAIGN_LARGE_STREAM (UINT64_C(1) << 60)
/* The provenance data mode (kvs_sim_config_t.data_mode) in this share of
 * the runs (percent); a stream of its own. */
#define SIM_CAMPAIGN_PROVENANCE_PCT 25
#define SIM_CAMPAIGN_DATA_STREAM (UINT64_C(1) << 59)
/* Hostile writers (a hostile-write fault: issue 17 item 2): in this share
 * of the runs with faults (percent), one more fault, from a stream of its
 * own, so every other draw of a run is what it was before the kind
 * existed; in every faulted run when the campaign's faults name no other
 * kind. */
#define SIM_CAMPAIGN_HOSTILE_PCT 20
#define SIM_CAMPAIGN_HOSTILE_STREAM (UINT64_C(1) << 58)
/* Model kinds (docs/kinds/, issue 25): an MLA latent in place of K and V
 * in this share of the runs (percent), a decode page size other than the
 * prefill's in this share, scale planes (FP8) in this share, per-token or
 * per-block alike; any of them together. Drawn from a stream of their own
 * and applied to the shape drawn as before (heads, dtype, page and chunk
 * sizes), after the cluster, so every other draw of a run is what it was
 * before the kinds, and a campaign of kinds "none" is the one of before. */
#define SIM_CAMPAIGN_MLA_PCT 20
#define SIM_CAMPAIGN_PAGES_PCT 20
#define SIM_CAMPAIGN_SCALES_PCT 20
#define SIM_CAMPAIGN_MODEL_STREAM (UINT64_C(1) << 57)
/* Prefill context parallelism (docs/kinds/context-parallel.md): 2..4 CP
 * ranks on every prefill instance, in this share of the runs (percent),
 * as many as keep the cluster within SIM_CAMPAIGN_MAX_CP_RANKS ranks (2
 * always do: clusters are drawn with at most half as many), on whichever
 * path the run draws. A stream of its own, so a run without it is what it
 * was before the kind. */
#define SIM_CAMPAIGN_CP_PCT 15
#define SIM_CAMPAIGN_MAX_CP_RANKS (2 * SIM_CAMPAIGN_MAX_LARGE_RANKS)
#define SIM_CAMPAIGN_CP_STREAM (UINT64_C(1) << 56)
/* Hybrid models (docs/kinds/hybrid.md): a layer pattern of window or state
 * layers (every 2nd..4th layer full attention) in this share of the runs,
 * from a stream of its own. Hybrid layers are GQA, on the staging path,
 * at any PP pair and with or without prefill CP: a run that draws them
 * drops MLA, keeps the PP and CP drawn and takes the path AUTO picks
 * (staging). */
#define SIM_CAMPAIGN_HYBRID_PCT 15
#define SIM_CAMPAIGN_HYBRID_STREAM (UINT64_C(1) << 55)
/* Draft KV of speculative decoding (docs/kinds/draft.md): 1..3 draft
 * layers of the model's heads and a head dim of their own, in this share
 * of the runs, from a stream of its own. A draft moves on the staging path
 * without scale planes, beside hybrid layers too: a run that draws it
 * drops its scales and takes the path AUTO picks; its instances keep the
 * PP drawn (the draft is the last stage's). */
#define SIM_CAMPAIGN_DRAFT_PCT 15
#define SIM_CAMPAIGN_DRAFT_STREAM (UINT64_C(1) << 54)

static int sim_campaign_fail(kvs_error_t *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int sim_campaign_fail(kvs_error_t *err, int status, const char *fmt, ...)
{
    if (err != NULL) {
        memset(err, 0, sizeof *err);
        err->status = status;
        err->file = __FILE__;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}
#define SIM_CAMPAIGN_FAIL(err, status, ...) sim_campaign_fail((err), (status), __VA_ARGS__)

/* ---- drawing --------------------------------------------------------------- */

#define SIM_CAMPAIGN_COUNT(a) (sizeof(a) / sizeof((a)[0]))
/* One element of a constant array, uniformly. */
#define SIM_CAMPAIGN_PICK(rng, a) ((a)[sim_rng_below((rng), SIM_CAMPAIGN_COUNT(a))])

/* Every draw below is a statement of its own, never two in one argument
 * list: C leaves the order of arguments open and gcc and clang differ,
 * which would give one seed other scenarios in each build. */

/* True with probability pct/100. */
static bool sim_campaign_pct(sim_rng_t *rng, uint64_t pct)
{
    return sim_rng_chance(rng, pct, 100);
}

/* What the fault generators look at, and the stall timeout they may set. */
typedef struct sim_campaign_scene {
    sim_topology_t topo;       /* every instance of both sides */
    uint64_t horizon_us;       /* rough simulated length of the run */
    uint64_t stall_ms;         /* 0: the default for runs with faults */
} sim_campaign_scene_t;

/* Ranks of a side over all its instances. */
static int64_t sim_campaign_side_ranks(const sim_topology_t *t, kvs_role_t role)
{
    int64_t n = 0;
    for (uint32_t i = 0; i < sim_topology_count(t, role); i++)
        n += sim_topology_ranks(t, role, i);
    return n;
}

/* Rank k of a side over all its instances (instance 0's first) -> its
 * instance and index in it. */
static uint32_t sim_campaign_locate(const sim_topology_t *t, kvs_role_t role, int64_t k,
                                    int64_t *index)
{
    uint32_t i = 0;
    while (k >= sim_topology_ranks(t, role, i))
        k -= sim_topology_ranks(t, role, i++);
    *index = k;
    return i;
}

/* "@<i>" for instance i > 0, "" for instance 0 (the form without clusters). */
static const char *sim_campaign_at(uint32_t inst, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (inst > 0)
        snprintf(buf, cap, "@%" PRIu32, inst);
    return buf;
}

/* Runs with faults get a stall timeout far above any healthy wait of these
 * scenarios (their slowest request takes under 1 s from arrival to done,
 * at most 0.8 s over 5000 clean runs): a timeout there means a fault cut
 * a request off. Message delays and link-down windows stay under a quarter
 * of it, so a notice delayed, or resent after the link is back, can still
 * arrive before the peer gives up. The `stall` kind below draws short
 * timeouts instead. */
static const uint64_t sim_campaign_fault_stalls_ms[] = {2000, 5000, 30000};
#define SIM_CAMPAIGN_MAX_DELAY_US 50000
#define SIM_CAMPAIGN_MAX_LINK_DOWN_US 500000

/* Which ranks sim_campaign_rank draws from. */
enum { SIM_CAMPAIGN_ANY_RANK, SIM_CAMPAIGN_DECODE_RANK, SIM_CAMPAIGN_PREFILL_RANK };

/* "p<tp>.<pp>[c<cp>][@<i>]" or "d<tp>.<pp>[@<i>]", a rank of the cluster
 * on the side `which` says (SIM_CAMPAIGN_*_RANK): one rank of one
 * instance (of one CP rank with prefill CP). */
static void sim_campaign_rank(sim_rng_t *rng, const sim_campaign_scene_t *s, int which,
                              char *out, size_t cap)
{
    const int64_t np = sim_campaign_side_ranks(&s->topo, KVS_ROLE_PREFILL);
    const int64_t nd = sim_campaign_side_ranks(&s->topo, KVS_ROLE_DECODE);
    const int64_t k = which == SIM_CAMPAIGN_DECODE_RANK
                          ? np + (int64_t)sim_rng_below(rng, (uint64_t)nd)
                      : which == SIM_CAMPAIGN_PREFILL_RANK
                          ? (int64_t)sim_rng_below(rng, (uint64_t)np)
                          : (int64_t)sim_rng_below(rng, (uint64_t)(np + nd));
    const bool decode = k >= np;
    const kvs_role_t role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
    int64_t idx;
    const uint32_t inst = sim_campaign_locate(&s->topo, role, decode ? k - np : k, &idx);
    const sim_instance_shape_t *sh = decode ? &s->topo.decode[inst] : &s->topo.prefill[inst];
    /* (ints: a drawn cluster's sizes are small, and a name fits rank[64]) */
    char at[16], cp[16] = "";
    if (!decode && s->topo.prefill_cp > 1)
        snprintf(cp, sizeof cp, "c%d", (int)(idx / (sh->tp * sh->pp)));
    snprintf(out, cap, "%c%d.%d%s%s", decode ? 'd' : 'p', (int)(idx % sh->tp),
             (int)(idx / sh->tp % sh->pp), cp, sim_campaign_at(inst, at, sizeof at));
}

static const char *const sim_campaign_probs[] = {"0.001", "0.01", "0.05", "0.2", "0.5", "1"};

/* Message types the message faults pick from (fault.c's names), all of
 * them. REGISTER is sent once, at set-up, before any room opens, so a
 * duplicate of it is never mistaken for a restart mid-run here. */
static const char *const sim_campaign_msg_types[] = {
    "any", "register", "metadata", "staging_req", "staging_rsp",
    "chunk_ready", "watermark", "status", "abort",
};

static void sim_campaign_draw_msg(sim_rng_t *rng, const char *kind, char *spec, size_t cap)
{
    const char *type = SIM_CAMPAIGN_PICK(rng, sim_campaign_msg_types);
    const char *prob = SIM_CAMPAIGN_PICK(rng, sim_campaign_probs);
    snprintf(spec, cap, "%s:%s:%s", kind, type, prob);
}

/* Each draw function writes one --fault spec into spec and may set the
 * scene's stall timeout. */
static void sim_campaign_draw_drop(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec,
                                   size_t cap)
{
    sim_campaign_draw_msg(rng, "drop", spec, cap);
}

static void sim_campaign_draw_dup(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec,
                                  size_t cap)
{
    sim_campaign_draw_msg(rng, "dup", spec, cap);
}

static void sim_campaign_draw_delay(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec,
                                    size_t cap)
{
    static const uint64_t max_us[] = {10, 200, 5000, SIM_CAMPAIGN_MAX_DELAY_US};
    char head[64];
    sim_campaign_draw_msg(rng, "delay", head, sizeof head);
    snprintf(spec, cap, "%s:%" PRIu64, head,
             sim_rng_range(rng, 1, SIM_CAMPAIGN_PICK(rng, max_us)));
}

static void sim_campaign_draw_write_error(sim_rng_t *rng, sim_campaign_scene_t *s,
                                          char *spec, size_t cap)
{
    snprintf(spec, cap, "write-error:%s", SIM_CAMPAIGN_PICK(rng, sim_campaign_probs));
}

static void sim_campaign_draw_link_down(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec,
                                        size_t cap)
{
    static const uint64_t max_for_us[] = {50, 2000, 50000, SIM_CAMPAIGN_MAX_LINK_DOWN_US};
    char rank[64];
    sim_campaign_rank(rng, s, SIM_CAMPAIGN_ANY_RANK, rank, sizeof rank);
    const uint64_t at_us = sim_rng_range(rng, 0, s->horizon_us);
    const uint64_t for_us = sim_rng_range(rng, 1, SIM_CAMPAIGN_PICK(rng, max_for_us));
    snprintf(spec, cap, "link-down:%s:%" PRIu64 ":%" PRIu64, rank, at_us, for_us);
}

static void sim_campaign_draw_slow_scatter(sim_rng_t *rng, sim_campaign_scene_t *s,
                                           char *spec, size_t cap)
{
    static const uint64_t factors[] = {2, 10, 100, 1000};
    char rank[64];
    sim_campaign_rank(rng, s, SIM_CAMPAIGN_DECODE_RANK, rank, sizeof rank);
    snprintf(spec, cap, "slow-scatter:%s:%" PRIu64, rank, SIM_CAMPAIGN_PICK(rng, factors));
}

/* A rank of either role, of one instance, crashes (or restarts) at a
 * random time of the run. */
static void sim_campaign_draw_rank_event(sim_rng_t *rng, sim_campaign_scene_t *s,
                                         const char *kind, char *spec, size_t cap)
{
    const bool decode = sim_rng_below(rng, 2) == 1;
    const kvs_role_t role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
    const int64_t k = (int64_t)sim_rng_below(rng,
                                             (uint64_t)sim_campaign_side_ranks(&s->topo, role));
    int64_t n;
    const uint32_t inst = sim_campaign_locate(&s->topo, role, k, &n);
    const uint64_t at_us = sim_rng_range(rng, 0, s->horizon_us);
    char at[16];
    snprintf(spec, cap, "%s:%s%s:%" PRId64 ":%" PRIu64, kind, decode ? "decode" : "prefill",
             sim_campaign_at(inst, at, sizeof at), n, at_us);
}

static void sim_campaign_draw_crash(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec,
                                    size_t cap)
{
    sim_campaign_draw_rank_event(rng, s, "crash", spec, cap);
}

static void sim_campaign_draw_restart(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec,
                                      size_t cap)
{
    sim_campaign_draw_rank_event(rng, s, "restart", spec, cap);
}

static void sim_campaign_draw_hbm_full(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec,
                                       size_t cap)
{
    char rank[64];
    sim_campaign_rank(rng, s, SIM_CAMPAIGN_ANY_RANK, rank, sizeof rank);
    snprintf(spec, cap, "hbm-full:%s", rank);
}

/* A prefill rank writes one staged chunk where its keys do not reach: a
 * region freed since (stale) or past its own bytes (outside), from a
 * random time in the first quarter of the run on. With region-scoped keys the fabric refuses
 * it: its request fails cleanly, nothing of it lands. */
static void sim_campaign_draw_hostile_write(sim_rng_t *rng, sim_campaign_scene_t *s,
                                            char *spec, size_t cap)
{
    char rank[64];
    sim_campaign_rank(rng, s, SIM_CAMPAIGN_PREFILL_RANK, rank, sizeof rank);
    const bool stale = sim_rng_below(rng, 2) == 0;
    /* early in the run, so a stale writer still writes after its region
     * went back */
    const uint64_t at_us = sim_rng_range(rng, 0, s->horizon_us / 4);
    snprintf(spec, cap, "hostile-write:%s:%s:%" PRIu64, rank, stale ? "stale" : "outside",
             at_us);
}

/* A stall timeout shorter than the run's own waits: rooms time out while
 * their peers still make progress. The fault (stall:MS) carries it, so
 * the run and its replay know the cluster is faulted; --stall-timeout-ms
 * says the same number. */
static void sim_campaign_draw_stall(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec,
                                    size_t cap)
{
    static const uint64_t stalls_ms[] = {1, 2, 5, 10, 20, 50};
    s->stall_ms = SIM_CAMPAIGN_PICK(rng, stalls_ms);
    snprintf(spec, cap, "stall:%" PRIu64, s->stall_ms);
}

/* What a fault does, for the rule below on which faults share a run. */
enum {
    SIM_CAMPAIGN_LOSS = 1u << 0,    /* control messages never arrive */
    SIM_CAMPAIGN_ERROR = 1u << 1,   /* a rank fails a request for real */
    SIM_CAMPAIGN_TIMEOUT = 1u << 2, /* stall timeouts fire on healthy rooms */
    SIM_CAMPAIGN_LATE = 1u << 3,    /* control messages arrive late */
    SIM_CAMPAIGN_HOSTILE = 1u << 4, /* a hostile writer: an ERROR that strikes
                                       for sure, at one of the run's first writes */
};

/*
 * Classes a default campaign (no --campaign-faults) never draws into one
 * run, because the simulator would count what follows as an unreported
 * failure although no implementation could have told the peer in time:
 * - TIMEOUT with ERROR: workload.c judges per room, not per peer, so a rank
 *   that times out in a PP stage or TP group that a real failure never
 *   reached is counted as unreported.
 * - TIMEOUT with LOSS: a stall timeout of a few ms is shorter than the
 *   retransmissions a lossy link needs, so a notice (or the peer's loss,
 *   found when the link gives up after one stall timeout) arrives after the
 *   ranks that waited on it have timed out.
 * - TIMEOUT with LATE: the same with a notice delayed past the timeout.
 * - HOSTILE with LOSS: on links that lose half their messages with send
 *   queues of 1-2 requests, go-back-N barely moves (thousands of
 *   retransmissions, a handful of writes in 5 s), so the notice of the
 *   hostile write's failure sits behind the backlog until the other ranks
 *   time out. write-error does the same when it strikes there (campaign
 *   run 2382 of seed 1 replays with write-error:0.1 in place of the
 *   hostile write: 1 unreported failure), but at the odds it is drawn with
 *   it seldom strikes in such a run; a hostile writer always does.
 * (LOSS and LATE with ERROR were kept apart until control messages were
 * retried and a prefill told a decode whose ROOM was still on the way;
 * they now run together, link-down included.)
 */
static const uint32_t sim_campaign_conflicts[][2] = {
    {SIM_CAMPAIGN_TIMEOUT, SIM_CAMPAIGN_ERROR},
    {SIM_CAMPAIGN_TIMEOUT, SIM_CAMPAIGN_LOSS},
    {SIM_CAMPAIGN_HOSTILE, SIM_CAMPAIGN_LOSS},
    {SIM_CAMPAIGN_TIMEOUT, SIM_CAMPAIGN_LATE},
};

/* The kinds a campaign draws, with their odds. A new kind is a row here
 * and a draw function above; one of weight 0 is never picked by weight
 * but drawn from a stream of its own (hostile-write: see
 * SIM_CAMPAIGN_HOSTILE_PCT), so the runs drawn before it came stay as
 * they were. */
typedef struct sim_campaign_fault_kind {
    const char *name;          /* as in --fault; also the JSON key */
    uint32_t weight;           /* odds relative to the other rows */
    uint32_t classes;          /* SIM_CAMPAIGN_LOSS | ... */
    void (*draw)(sim_rng_t *rng, sim_campaign_scene_t *s, char *spec, size_t cap);
} sim_campaign_fault_kind_t;

static const sim_campaign_fault_kind_t sim_campaign_fault_kinds[] = {
    {"drop", 6, SIM_CAMPAIGN_LOSS, sim_campaign_draw_drop},
    {"dup", 4, 0, sim_campaign_draw_dup},
    {"delay", 4, SIM_CAMPAIGN_LATE, sim_campaign_draw_delay},
    {"write-error", 4, SIM_CAMPAIGN_ERROR, sim_campaign_draw_write_error},
    {"link-down", 3, SIM_CAMPAIGN_LOSS | SIM_CAMPAIGN_ERROR, sim_campaign_draw_link_down},
    {"slow-scatter", 2, 0, sim_campaign_draw_slow_scatter},
    {"stall", 2, SIM_CAMPAIGN_TIMEOUT, sim_campaign_draw_stall},
    {"crash", 2, SIM_CAMPAIGN_ERROR, sim_campaign_draw_crash},
    {"restart", 2, SIM_CAMPAIGN_ERROR, sim_campaign_draw_restart},
    {"hbm-full", 1, SIM_CAMPAIGN_ERROR, sim_campaign_draw_hbm_full},
    {"hostile-write", 0, SIM_CAMPAIGN_ERROR | SIM_CAMPAIGN_HOSTILE,
     sim_campaign_draw_hostile_write},
};
#define SIM_CAMPAIGN_HOSTILE_KIND 10 /* its row above */

#define SIM_CAMPAIGN_KINDS SIM_CAMPAIGN_COUNT(sim_campaign_fault_kinds)

/* The fault kinds of a campaign: bit k for sim_campaign_fault_kinds[k]. */
typedef struct sim_campaign_faults {
    uint32_t kinds;
    bool conflicts;            /* apply sim_campaign_conflicts */
} sim_campaign_faults_t;

static bool sim_campaign_conflict(uint32_t a, uint32_t b)
{
    for (size_t c = 0; c < SIM_CAMPAIGN_COUNT(sim_campaign_conflicts); c++) {
        const uint32_t x = sim_campaign_conflicts[c][0], y = sim_campaign_conflicts[c][1];
        if (((a & x) && (b & y)) || ((a & y) && (b & x)))
            return true;
    }
    return false;
}

/* A kind that may join a run whose faults so far have classes `have`, by
 * its weight; SIM_CAMPAIGN_KINDS when none may. */
static size_t sim_campaign_pick_kind(sim_rng_t *rng, const sim_campaign_faults_t *faults,
                                     uint32_t have)
{
    uint64_t weight[SIM_CAMPAIGN_KINDS], total = 0;
    for (size_t k = 0; k < SIM_CAMPAIGN_KINDS; k++) {
        const sim_campaign_fault_kind_t *fk = &sim_campaign_fault_kinds[k];
        const bool ok = (faults->kinds >> k & 1u) &&
                        !(faults->conflicts && (sim_campaign_conflict(fk->classes, have) ||
                                                sim_campaign_conflict(fk->classes,
                                                                      fk->classes)));
        weight[k] = ok ? fk->weight : 0;
        total += weight[k];
    }
    if (total == 0)
        return SIM_CAMPAIGN_KINDS;
    uint64_t x = sim_rng_below(rng, total);
    size_t k = 0;
    while (x >= weight[k])
        x -= weight[k++];
    return k;
}

/* "all", "none", or kinds separated by commas -> *out. */
static int sim_campaign_parse_faults(const char *text, sim_campaign_faults_t *out,
                                     kvs_error_t *err)
{
    char names[512] = "";
    size_t used = 0;
    for (size_t k = 0; k < SIM_CAMPAIGN_KINDS; k++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                 sim_campaign_fault_kinds[k].name,
                                 k + 1 < SIM_CAMPAIGN_KINDS ? ", " : "");
    out->conflicts = false;
    if (strcmp(text, "all") == 0) {
        out->kinds = (1u << SIM_CAMPAIGN_KINDS) - 1u;
        return 0;
    }
    out->kinds = 0;
    if (strcmp(text, "none") == 0)
        return 0;
    for (const char *p = text;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        size_t k = 0;
        while (k < SIM_CAMPAIGN_KINDS && !(strlen(sim_campaign_fault_kinds[k].name) == len &&
                                           strncmp(sim_campaign_fault_kinds[k].name, p, len) == 0))
            k++;
        if (k == SIM_CAMPAIGN_KINDS)
            return SIM_CAMPAIGN_FAIL(err, KVS_EINVAL, "faults: unknown fault kind '%.*s': "
                                     "give all, none, or kinds separated by commas out of %s",
                                     (int)len, p, names);
        out->kinds |= 1u << k;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return 0;
}

/* The model kinds (SIM_CAMPAIGN_MLA_PCT ...): bit k of a run's kinds for
 * row k. Scale planes are one draw: per-token or per-block, never both. */
enum {
    SIM_CAMPAIGN_MLA,
    SIM_CAMPAIGN_PAGES,
    SIM_CAMPAIGN_PER_TOKEN,
    SIM_CAMPAIGN_PER_BLOCK,
    SIM_CAMPAIGN_CP,
    SIM_CAMPAIGN_HYBRID,
    SIM_CAMPAIGN_DRAFT,
    SIM_CAMPAIGN_MODEL_KINDS
};
static const char *const sim_campaign_model_names[SIM_CAMPAIGN_MODEL_KINDS] = {
    [SIM_CAMPAIGN_MLA] = "mla",
    [SIM_CAMPAIGN_PAGES] = "page-sizes",
    [SIM_CAMPAIGN_PER_TOKEN] = "per-token",
    [SIM_CAMPAIGN_PER_BLOCK] = "per-block",
    [SIM_CAMPAIGN_CP] = "context-parallel",
    [SIM_CAMPAIGN_HYBRID] = "hybrid",
    [SIM_CAMPAIGN_DRAFT] = "draft",
};
#define SIM_CAMPAIGN_ALL_MODELS ((1u << SIM_CAMPAIGN_MODEL_KINDS) - 1u)
#define SIM_CAMPAIGN_SCALES (1u << SIM_CAMPAIGN_PER_TOKEN | 1u << SIM_CAMPAIGN_PER_BLOCK)

/* The model kinds of a campaign. */
typedef struct sim_campaign_models {
    uint32_t kinds;            /* bit k: sim_campaign_model_names[k] may be drawn */
    bool at_least_one;         /* named: every run draws one of them at least */
} sim_campaign_models_t;

/* "all", "none", or model kinds separated by commas -> *out. */
static int sim_campaign_parse_models(const char *text, sim_campaign_models_t *out,
                                     kvs_error_t *err)
{
    out->at_least_one = false;
    if (strcmp(text, "all") == 0) {
        out->kinds = SIM_CAMPAIGN_ALL_MODELS;
        return 0;
    }
    out->kinds = 0;
    if (strcmp(text, "none") == 0)
        return 0;
    out->at_least_one = true;
    for (const char *p = text;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        size_t k = 0;
        while (k < SIM_CAMPAIGN_MODEL_KINDS &&
               !(strlen(sim_campaign_model_names[k]) == len &&
                 strncmp(sim_campaign_model_names[k], p, len) == 0))
            k++;
        if (k == SIM_CAMPAIGN_MODEL_KINDS)
            return SIM_CAMPAIGN_FAIL(err, KVS_EINVAL, "kinds: unknown model kind '%.*s': give "
                                     "all, none (GQA only), or kinds separated by commas out "
                                     "of mla, page-sizes, per-token, per-block, context-parallel, "
                                     "hybrid, draft",
                                     (int)len, p);
        out->kinds |= 1u << k;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return 0;
}

/* A run's model kinds, from its own stream: each at its odds, scales as
 * one draw (per-token or per-block), CP and hybrid layers from streams of
 * their own (cp, hybrid, draft); with kinds named, one of them at least
 * (drawn uniformly when the odds gave none). The draws are the same
 * whatever the campaign allows, so a kind left out leaves the others as
 * they were. A run with hybrid layers takes no MLA (hybrid layers are
 * GQA; a draft and CP they keep); one with a draft takes no scale
 * planes. */
static uint32_t sim_campaign_draw_models(sim_rng_t *rng, sim_rng_t *cp, sim_rng_t *hybrid,
                                         sim_rng_t *draft, const sim_campaign_models_t *m)
{
    uint32_t got = 0;
    if (sim_campaign_pct(cp, SIM_CAMPAIGN_CP_PCT))
        got |= 1u << SIM_CAMPAIGN_CP;
    if (sim_campaign_pct(hybrid, SIM_CAMPAIGN_HYBRID_PCT))
        got |= 1u << SIM_CAMPAIGN_HYBRID;
    if (sim_campaign_pct(draft, SIM_CAMPAIGN_DRAFT_PCT))
        got |= 1u << SIM_CAMPAIGN_DRAFT;
    if (sim_campaign_pct(rng, SIM_CAMPAIGN_MLA_PCT))
        got |= 1u << SIM_CAMPAIGN_MLA;
    if (sim_campaign_pct(rng, SIM_CAMPAIGN_PAGES_PCT))
        got |= 1u << SIM_CAMPAIGN_PAGES;
    if (sim_campaign_pct(rng, SIM_CAMPAIGN_SCALES_PCT))
        got |= 1u << (sim_rng_below(rng, 2) == 0 ? SIM_CAMPAIGN_PER_TOKEN
                                                  : SIM_CAMPAIGN_PER_BLOCK);
    got &= m->kinds;
    if (got == 0 && m->at_least_one) {
        uint32_t named[SIM_CAMPAIGN_MODEL_KINDS], n = 0;
        for (uint32_t k = 0; k < SIM_CAMPAIGN_MODEL_KINDS; k++)
            if (m->kinds >> k & 1u)
                named[n++] = k;
        got = 1u << named[sim_rng_below(rng, n)];
    }
    if (got >> SIM_CAMPAIGN_HYBRID & 1u)
        got &= ~(1u << SIM_CAMPAIGN_MLA);
    if (got >> SIM_CAMPAIGN_DRAFT & 1u)
        got &= ~SIM_CAMPAIGN_SCALES;
    return got;
}

/* Prefill and decode page sizes drawn for a run of two page sizes: the
 * pairs of issue 25 (16 -> 64, 64 -> 16), others where one divides the
 * other, either way round, and one of lcm 48 not a power of two. */
static const int64_t sim_campaign_page_pairs[][2] = {
    {16, 64}, {64, 16}, {16, 32}, {32, 16}, {4, 16}, {16, 4},
    {2, 8}, {8, 2}, {1, 4}, {4, 1}, {16, 48}, {48, 16},
};

/* Elements per e8m0 scale drawn for per-block runs: those dividing the
 * head dim (1 always does). */
static int64_t sim_campaign_draw_block(sim_rng_t *rng, int64_t head_dim)
{
    static const int64_t blocks[] = {32, 16, 8, 4, 2, 1};
    int64_t fit[SIM_CAMPAIGN_COUNT(blocks)];
    size_t n = 0;
    for (size_t i = 0; i < SIM_CAMPAIGN_COUNT(blocks); i++)
        if (head_dim % blocks[i] == 0)
            fit[n++] = blocks[i];
    return fit[sim_rng_below(rng, n)];
}

static int64_t sim_campaign_gcd(int64_t a, int64_t b)
{
    while (b != 0) {
        const int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Two sizes plan together when the larger is a multiple of the smaller:
 * TP sizes of the two sides, and heads over a TP (split or replicated). */
static bool sim_campaign_divides(int64_t a, int64_t b)
{
    return a >= b ? a % b == 0 : b % a == 0;
}

/* More instances for the cluster *t, whose instance 0 of each side is
 * drawn: 1..SIM_CAMPAIGN_MAX_INSTANCES per side, each TP from the family of
 * the run's heads (powers of two, or the threes) and pairing with every
 * instance of the other side, PP mixed (uneven splits included) where the
 * decode allows it (a decode of PP > 1 pairs only with prefill instances
 * of its PP), up to SIM_CAMPAIGN_MAX_CLUSTER_RANKS ranks in all. A large
 * cluster has 2..SIM_CAMPAIGN_MAX_INSTANCES instances per side, TP sizes
 * drawn from the wide end (up to 8), up to SIM_CAMPAIGN_MAX_LARGE_RANKS
 * ranks. */
static void sim_campaign_draw_cluster(sim_rng_t *rng, int64_t heads, int64_t layers,
                                      bool threes, bool large, sim_topology_t *t)
{
    static const int64_t pow2[] = {1, 2, 4, 8};
    static const int64_t three_tps[] = {1, 2, 3, 6};
    /* A large cluster leans to the widest TP sizes. */
    static const int64_t pow2_large[] = {2, 4, 8, 8};
    static const int64_t three_large[] = {2, 3, 6, 6};
    static const int64_t pps[] = {1, 1, 2, 3};
    const int64_t *tps = threes ? (large ? three_large : three_tps) : (large ? pow2_large : pow2);
    const uint64_t min_n = large ? 2 : 1;
    const uint32_t np = (uint32_t)sim_rng_range(rng, min_n, SIM_CAMPAIGN_MAX_INSTANCES);
    const uint32_t nd = (uint32_t)sim_rng_range(rng, min_n, SIM_CAMPAIGN_MAX_INSTANCES);
    const int64_t max_ranks = large ? SIM_CAMPAIGN_MAX_LARGE_RANKS
                                    : SIM_CAMPAIGN_MAX_CLUSTER_RANKS;
    int64_t ranks = t->prefill[0].tp * t->prefill[0].pp + t->decode[0].tp * t->decode[0].pp;
    for (uint32_t i = 1; i < np; i++) {
        int64_t tp = t->prefill[0].tp;
        for (int tries = 0; tries < 16; tries++) {
            const int64_t c = tps[sim_rng_below(rng, 4)];
            if (sim_campaign_divides(c, t->decode[0].tp) && sim_campaign_divides(heads, c)) {
                tp = c;
                break;
            }
        }
        int64_t pp = SIM_CAMPAIGN_PICK(rng, pps);
        if (t->decode[0].pp > 1 || pp > layers)
            pp = t->decode[0].pp > 1 ? t->decode[0].pp : 1;
        if (ranks + tp * pp > max_ranks)
            break;
        ranks += tp * pp;
        t->prefill[t->prefill_instances++] = (sim_instance_shape_t){tp, pp};
    }
    bool same_pp = true;
    for (uint32_t i = 1; i < t->prefill_instances; i++)
        same_pp = same_pp && t->prefill[i].pp == t->prefill[0].pp;
    for (uint32_t i = 1; i < nd; i++) {
        int64_t tp = t->decode[0].tp;
        for (int tries = 0; tries < 16; tries++) {
            const int64_t c = tps[sim_rng_below(rng, 4)];
            bool fits = sim_campaign_divides(heads, c);
            for (uint32_t p = 0; p < t->prefill_instances; p++)
                fits = fits && sim_campaign_divides(c, t->prefill[p].tp);
            if (fits) {
                tp = c;
                break;
            }
        }
        const bool staged = sim_campaign_pct(rng, 50);
        const int64_t pp = same_pp && staged ? t->prefill[0].pp : 1;
        if (ranks + tp * pp > max_ranks)
            break;
        ranks += tp * pp;
        t->decode[t->decode_instances++] = (sim_instance_shape_t){tp, pp};
    }
}

/* What a run was drawn with: its config and what the totals count. */
typedef struct sim_campaign_draw {
    kvs_sim_config_t cfg;
    char spec[SIM_CAMPAIGN_MAX_FAULTS][SIM_CAMPAIGN_SPEC_BYTES];
    const char *faults[SIM_CAMPAIGN_MAX_FAULTS]; /* -> spec */
    uint32_t sq_depth;         /* its net_sq_depth, 0: none */
    uint32_t aux_bytes;        /* its max_aux_bytes, 0: none */
    uint32_t instances;        /* of both sides */
    bool large;                /* a large cluster */
    uint32_t models;           /* bit k: model kind k (SIM_CAMPAIGN_MLA ...) */
    uint32_t nfaults;
    size_t kinds[SIM_CAMPAIGN_MAX_FAULTS];
} sim_campaign_draw_t;

/*
 * Run `run` of campaign `seed` as a config in draw->cfg (its fault strings
 * in draw->spec). Valid by construction (the test of that is that
 * kvs_sim_run sets it up: a refusal is a set-up error).
 */
static void sim_campaign_generate(uint64_t seed, uint64_t run,
                                  const sim_campaign_faults_t *faults,
                                  const sim_campaign_models_t *models, sim_campaign_draw_t *draw)
{
    sim_rng_t rng;
    sim_rng_init(&rng, seed, run);
    memset(draw, 0, sizeof *draw);
    kvs_sim_config_t *cfg = &draw->cfg;
    kvs_sim_config_init(cfg);

    /* Heads and TP sizes: powers of two mostly, multiples of 3 sometimes
     * (3 and 6 heads, TP 1, 2, 3, 6); replicated heads (H < TP) on either
     * side, P > D, P < D and P == D. */
    static const int64_t pow2[] = {1, 2, 4, 8};
    static const int64_t three_heads[] = {3, 6};
    static const int64_t three_tps[] = {1, 2, 3, 6};
    int64_t heads, ptp, dtp;
    const bool threes = !sim_campaign_pct(&rng, 85);
    if (!threes) {
        heads = SIM_CAMPAIGN_PICK(&rng, pow2);
        ptp = SIM_CAMPAIGN_PICK(&rng, pow2);
        dtp = SIM_CAMPAIGN_PICK(&rng, pow2);
    } else {
        heads = SIM_CAMPAIGN_PICK(&rng, three_heads);
        ptp = dtp = 1; /* if no draw below fits (odds below 2^-30) */
        for (int tries = 0; tries < 64; tries++) {
            const int64_t p = SIM_CAMPAIGN_PICK(&rng, three_tps);
            const int64_t d = SIM_CAMPAIGN_PICK(&rng, three_tps);
            if (sim_campaign_divides(p, d) && sim_campaign_divides(heads, p) &&
                sim_campaign_divides(heads, d)) {
                ptp = p;
                dtp = d;
                break;
            }
        }
    }
    static const int64_t pps[] = {1, 1, 1, 1, 1, 2, 2, 3};
    int64_t ppp = SIM_CAMPAIGN_PICK(&rng, pps);
    int64_t dpp = sim_campaign_pct(&rng, 50) ? 1 : ppp;
    /* Layers split over the stages evenly, or not (spec §4: the last
     * layers % PP stages hold one more), down to one layer per stage. */
    int64_t layers = ppp * (int64_t)sim_rng_range(&rng, 1, 3);
    if (ppp > 1)
        layers += (int64_t)sim_rng_below(&rng, (uint64_t)ppp);
    static const int64_t head_dims[] = {4, 8, 16, 16, 32, 64, 3, 5};
    const int64_t head_dim = SIM_CAMPAIGN_PICK(&rng, head_dims);
    static const kvs_dtype_t dtypes[] = {KVS_DTYPE_BF16, KVS_DTYPE_FP16, KVS_DTYPE_FP8,
                                         KVS_DTYPE_FP32};
    kvs_dtype_t dtype = SIM_CAMPAIGN_PICK(&rng, dtypes);
    static const int64_t page_sizes[] = {1, 2, 4, 8, 16};
    int64_t ps = SIM_CAMPAIGN_PICK(&rng, page_sizes);
    static const int64_t chunk_pages[] = {1, 2, 3, 4, 8, 16};
    int64_t chunk = ps * SIM_CAMPAIGN_PICK(&rng, chunk_pages);

    /* The cluster: instance 0 of each side is the one drawn above; more
     * instances, and the router, come from a stream of their own. */
    sim_topology_t topo;
    memset(&topo, 0, sizeof topo);
    topo.prefill_instances = topo.decode_instances = 1;
    topo.prefill[0] = (sim_instance_shape_t){ptp, ppp};
    topo.decode[0] = (sim_instance_shape_t){dtp, dpp};
    sim_rng_t cluster;
    sim_rng_init(&cluster, seed, run | SIM_CAMPAIGN_CLUSTER_STREAM);
    bool least_loaded = false;
    if (sim_campaign_pct(&cluster, SIM_CAMPAIGN_CLUSTER_PCT)) {
        sim_campaign_draw_cluster(&cluster, heads, layers, threes, false, &topo);
        least_loaded = sim_campaign_pct(&cluster, 50);
    }
    /* Large clusters: a stream of their own, drawn only in runs the draw
     * above left at one instance per side, so every other run is as it
     * was before they existed. */
    sim_rng_t large;
    sim_rng_init(&large, seed, run | SIM_CAMPAIGN_LARGE_STREAM);
    if (topo.prefill_instances == 1 && topo.decode_instances == 1 &&
        sim_campaign_pct(&large, SIM_CAMPAIGN_LARGE_PCT)) {
        sim_campaign_draw_cluster(&large, heads, layers, threes, true, &topo);
        least_loaded = sim_campaign_pct(&large, 50);
        draw->large = topo.prefill_instances > 1 || topo.decode_instances > 1;
    }
    draw->instances = topo.prefill_instances + topo.decode_instances;

    /* Model kinds (SIM_CAMPAIGN_MLA_PCT ...), from a stream of their own,
     * applied to the shape drawn above: MLA keeps one latent of head_dim
     * elements (one "head", on every TP rank: every cluster drawn pairs);
     * two page sizes take a pair of the table and the smallest chunk of
     * whole pages on both sides at least as long as the one drawn; scale
     * planes make the KV fp8. */
    sim_rng_t model, cp_rng, hybrid_rng, draft_rng;
    sim_rng_init(&model, seed, run | SIM_CAMPAIGN_MODEL_STREAM);
    sim_rng_init(&cp_rng, seed, run | SIM_CAMPAIGN_CP_STREAM);
    sim_rng_init(&hybrid_rng, seed, run | SIM_CAMPAIGN_HYBRID_STREAM);
    sim_rng_init(&draft_rng, seed, run | SIM_CAMPAIGN_DRAFT_STREAM);
    draw->models = sim_campaign_draw_models(&model, &cp_rng, &hybrid_rng, &draft_rng, models);
    kvs_kv_kind_t kind = KVS_KV_GQA;
    int64_t dps = 0;
    kvs_kv_scales_t scales = KVS_KV_SCALES_NONE;
    int64_t scale_block = 0;
    if (draw->models >> SIM_CAMPAIGN_MLA & 1u) {
        kind = KVS_KV_MLA;
        heads = 1;
    }
    if (draw->models >> SIM_CAMPAIGN_PAGES & 1u) {
        const size_t pair = sim_rng_below(&model, SIM_CAMPAIGN_COUNT(sim_campaign_page_pairs));
        ps = sim_campaign_page_pairs[pair][0];
        dps = sim_campaign_page_pairs[pair][1];
        const int64_t unit = ps / sim_campaign_gcd(ps, dps) * dps;
        chunk = (chunk + unit - 1) / unit * unit;
    }
    if (draw->models & SIM_CAMPAIGN_SCALES) {
        dtype = KVS_DTYPE_FP8;
        scales = draw->models >> SIM_CAMPAIGN_PER_TOKEN & 1u ? KVS_KV_SCALES_PER_TOKEN
                                                              : KVS_KV_SCALES_PER_BLOCK;
        if (scales == KVS_KV_SCALES_PER_BLOCK)
            scale_block = sim_campaign_draw_block(&model, head_dim);
    }

    /* CP: 2..4 ranks of every prefill instance's TP x PP, fewer where the
     * cluster would pass SIM_CAMPAIGN_MAX_CP_RANKS. */
    if (draw->models >> SIM_CAMPAIGN_CP & 1u) {
        int64_t cp = (int64_t)sim_rng_range(&cp_rng, 2, 4);
        const int64_t prefill = sim_campaign_side_ranks(&topo, KVS_ROLE_PREFILL);
        const int64_t decode = sim_campaign_side_ranks(&topo, KVS_ROLE_DECODE);
        while (cp > 2 && prefill * cp + decode > SIM_CAMPAIGN_MAX_CP_RANKS)
            cp--;
        topo.prefill_cp = cp;
    }

    /* Hybrid layers: every 2nd..4th layer full attention, the others
     * window layers of 1..256 tokens or state layers of the model's KV
     * heads (they split over every TP as those do) and a few bytes to a
     * few KiB a head, at the PP the cluster drew. */
    kvs_layout_params_t hyb = {0};
    if (draw->models >> SIM_CAMPAIGN_HYBRID & 1u) {
        hyb.full_attn_every = (int64_t)sim_rng_range(&hybrid_rng, 2, 4);
        if (sim_rng_below(&hybrid_rng, 2) == 0) {
            static const int64_t windows[] = {1, 3, 16, 64, 128, 256};
            hyb.other_layers = KVS_LAYER_WINDOW;
            hyb.window_tokens = SIM_CAMPAIGN_PICK(&hybrid_rng, windows);
        } else {
            static const int64_t conv[] = {0, 8, 96}, ssm[] = {16, 256, 4096};
            hyb.other_layers = KVS_LAYER_STATE;
            hyb.state_heads = heads;
            hyb.state_conv_bytes = SIM_CAMPAIGN_PICK(&hybrid_rng, conv);
            hyb.state_ssm_bytes = SIM_CAMPAIGN_PICK(&hybrid_rng, ssm);
        }
    }
    /* A draft: 1..3 layers of head dim 8..128 (or the model's), at the PP
     * the cluster drew (the last stage of each instance holds it). */
    int64_t draft_layers = 0, draft_head_dim = 0;
    if (draw->models >> SIM_CAMPAIGN_DRAFT & 1u) {
        static const int64_t dims[] = {0, 0, 8, 16, 64, 128};
        draft_layers = (int64_t)sim_rng_range(&draft_rng, 1, 3);
        draft_head_dim = SIM_CAMPAIGN_PICK(&draft_rng, dims);
    }

    bool same_tp = true;
    int64_t max_tp = 1, pair_ranks = 1;
    for (uint32_t p = 0; p < topo.prefill_instances; p++)
        for (uint32_t d = 0; d < topo.decode_instances; d++) {
            const int64_t a = topo.prefill[p].tp, b = topo.decode[d].tp;
            const int64_t r = sim_topology_ranks(&topo, KVS_ROLE_PREFILL, p) +
                              sim_topology_ranks(&topo, KVS_ROLE_DECODE, d);
            same_tp = same_tp && a == b;
            max_tp = a > max_tp ? a : max_tp;
            max_tp = b > max_tp ? b : max_tp;
            pair_ranks = r > pair_ranks ? r : pair_ranks;
        }

    /* Path: auto mostly; staging, slice, and direct when the TPs match. */
    static const kvs_path_t paths[] = {KVS_PATH_AUTO, KVS_PATH_AUTO, KVS_PATH_AUTO,
                                       KVS_PATH_STAGING, KVS_PATH_SLICE, KVS_PATH_DIRECT};
    kvs_path_t path = SIM_CAMPAIGN_PICK(&rng, paths);
    if ((path == KVS_PATH_DIRECT && !same_tp) || hyb.full_attn_every > 1 || draft_layers > 0)
        path = KVS_PATH_AUTO; /* (hybrid layers and drafts: staging alone) */

    /* Workload: prompts of at most 48 chunks, and as many requests as keep
     * the run's writes and messages near SIM_CAMPAIGN_COST (the slice path
     * writes each page run, or token, of each layer on its own). */
    const int64_t lo = (int64_t)sim_rng_range(&rng, 1, 192);
    int64_t hi = lo + (int64_t)sim_rng_range(&rng, 0, 256);
    if (hi > 48 * chunk)
        hi = lo > 48 * chunk ? lo : 48 * chunk;
    /* (a request's ranks are those of its pair of instances) */
    const int64_t buffers = (kind == KVS_KV_MLA ? 1 : 2) *
                            (scales != KVS_KV_SCALES_NONE ? 2 : 1); /* a layer's */
    const int64_t per_request = (hi + chunk - 1) / chunk * pair_ranks * 8 +
                                (path == KVS_PATH_SLICE ? hi * layers * buffers * max_tp : 0);
    int64_t max_requests = SIM_CAMPAIGN_COST / per_request;
    max_requests = max_requests < 1 ? 1 : max_requests > 12 ? 12 : max_requests;
    /* A cluster gets a request per instance at least, as the cost allows,
     * so that a fault of one instance meets requests of others in flight
     * (isolation). */
    const int64_t per_instance = draw->instances > 2 ? (int64_t)draw->instances : 1;
    const int64_t min_requests = per_instance < max_requests ? per_instance : max_requests;
    const int64_t requests = (int64_t)sim_rng_range(&rng, (uint64_t)min_requests,
                                                    (uint64_t)max_requests);
    /* (requests per 1000 s: 0 (all at once), 20/s .. 20000/s, 2.5/s) */
    static const uint64_t rates_milli[] = {0, 20000, 200000, 2000000, 20000000, 2500};
    const uint64_t rate_milli = SIM_CAMPAIGN_PICK(&rng, rates_milli);
    static const uint64_t prefill_speeds[] = {16384, 16384, 4096, 262144, 4194304};
    const uint64_t prefill_speed = SIM_CAMPAIGN_PICK(&rng, prefill_speeds);
    static const int64_t nics[] = {25, 100, 400};

    /* The ring: whole regions of the largest chunk, from exactly one
     * (every chunk waits for the previous one's scatter) to many, plus a
     * few odd bytes sometimes so wraps land anywhere. */
    kvs_layout_params_t params = {
        .total_heads = heads, .head_dim = head_dim, .layers = layers, .page_size = ps,
        .prefill_tp = ptp, .decode_tp = dtp, .prefill_pp = ppp, .decode_pp = dpp,
        .chunk_tokens = chunk, .prefill_cp = topo.prefill_cp};
    params.dtype = dtype;
    params.kind = kind;
    params.decode_page_size = dps;
    params.kv_scales = scales;
    params.scale_block = scale_block;
    params.full_attn_every = hyb.full_attn_every;
    params.other_layers = hyb.other_layers;
    params.window_tokens = hyb.window_tokens;
    params.state_heads = hyb.state_heads;
    params.state_conv_bytes = hyb.state_conv_bytes;
    params.state_ssm_bytes = hyb.state_ssm_bytes;
    params.draft_layers = draft_layers;
    params.draft_head_dim = draft_head_dim;
    int64_t region = 4096; /* of the pair with the largest */
    for (uint32_t p = 0; p < topo.prefill_instances; p++)
        for (uint32_t d = 0; d < topo.decode_instances; d++) {
            const kvs_layout_params_t pair = sim_topology_pair(&params, &topo, p, d);
            kvs_layout_t lay;
            kvs_error_t lerr = {0};
            if (kvs_layout_init(&lay, &pair, &lerr) == KVS_OK &&
                kvs_layout_max_region_bytes(&lay) > region)
                region = kvs_layout_max_region_bytes(&lay);
        }
    static const uint64_t ring_regions[] = {1, 1, 2, 3, 4, 8, 64};
    uint64_t ring = (uint64_t)region * SIM_CAMPAIGN_PICK(&rng, ring_regions);
    if (sim_campaign_pct(&rng, 30))
        ring += sim_rng_below(&rng, (uint64_t)region);

    cfg->total_heads = heads;
    cfg->head_dim = head_dim;
    cfg->layers = layers;
    cfg->dtype = (int32_t)dtype;
    cfg->page_size = ps;
    cfg->chunk_tokens = chunk;
    cfg->kv_kind = (int32_t)kind;
    cfg->decode_page_size = dps;
    cfg->kv_scales = (int32_t)scales;
    cfg->scale_block = (uint32_t)scale_block;
    cfg->prefill_cp = topo.prefill_cp > 1 ? topo.prefill_cp : 0;
    cfg->full_attn_every = hyb.full_attn_every;
    cfg->other_layers = (int32_t)hyb.other_layers;
    cfg->window_tokens = hyb.window_tokens;
    cfg->state_heads = hyb.state_heads;
    cfg->state_conv_bytes = hyb.state_conv_bytes;
    cfg->state_ssm_bytes = hyb.state_ssm_bytes;
    cfg->draft_layers = draft_layers;
    cfg->draft_head_dim = draft_head_dim;
    cfg->prefill_instances = topo.prefill_instances;
    cfg->decode_instances = topo.decode_instances;
    for (uint32_t i = 0; i < topo.prefill_instances; i++) {
        cfg->prefill_instance_tp[i] = topo.prefill[i].tp;
        cfg->prefill_instance_pp[i] = topo.prefill[i].pp;
    }
    for (uint32_t i = 0; i < topo.decode_instances; i++) {
        cfg->decode_instance_tp[i] = topo.decode[i].tp;
        cfg->decode_instance_pp[i] = topo.decode[i].pp;
    }
    cfg->prefill_tp = topo.prefill[0].tp;
    cfg->prefill_pp = topo.prefill[0].pp;
    cfg->decode_tp = topo.decode[0].tp;
    cfg->decode_pp = topo.decode[0].pp;
    cfg->router = least_loaded ? KVS_SIM_ROUTER_LEAST_LOADED : KVS_SIM_ROUTER_ROUND_ROBIN;
    cfg->requests = (uint32_t)requests;
    cfg->prompt_min_tokens = lo;
    cfg->prompt_max_tokens = hi;
    if (sim_campaign_pct(&rng, 30))
        cfg->prefix_max_tokens = (int64_t)sim_rng_range(&rng, 0, (uint64_t)hi);
    cfg->rate_milli_per_s = rate_milli;
    cfg->max_inflight = (uint32_t)sim_rng_range(&rng, 1, 8);
    cfg->transfer_workers = (uint32_t)sim_rng_range(&rng, 1, 4);
    cfg->prefill_tokens_per_s = prefill_speed;
    cfg->ring_bytes = ring;
    const int64_t nic_gbps = SIM_CAMPAIGN_PICK(&rng, nics);
    cfg->net_link_bytes_per_s = (uint64_t)nic_gbps * 1000000000u / 8u;
    cfg->path = (int32_t)path;

    /* Faults: none in about a third of the runs (then every request must
     * finish ok), else 1..SIM_CAMPAIGN_MAX_FAULTS of them. */
    uint64_t stall_ms = SIM_CAMPAIGN_CLEAN_STALL_MS;
    if (!sim_campaign_pct(&rng, 35) && faults->kinds != 0) {
        sim_campaign_scene_t scene = {
            .topo = topo,
            .horizon_us = 1000 + (uint64_t)requests * (uint64_t)hi * 1000000 / prefill_speed +
                          (rate_milli > 0 ? (uint64_t)requests * 1000000000 / rate_milli : 0)};
        const uint32_t want = (uint32_t)sim_rng_range(&rng, 1, SIM_CAMPAIGN_MAX_FAULTS);
        uint32_t classes = 0;
        while (draw->nfaults < want) {
            const size_t k = sim_campaign_pick_kind(&rng, faults, classes);
            if (k == SIM_CAMPAIGN_KINDS)
                break; /* every kind left conflicts with those drawn */
            char spec[SIM_CAMPAIGN_SPEC_BYTES];
            sim_campaign_fault_kinds[k].draw(&rng, &scene, spec, sizeof spec);
            snprintf(draw->spec[draw->nfaults], sizeof draw->spec[draw->nfaults], "%s", spec);
            classes |= sim_campaign_fault_kinds[k].classes;
            draw->kinds[draw->nfaults++] = k;
        }
        stall_ms = scene.stall_ms != 0 ? scene.stall_ms
                                       : SIM_CAMPAIGN_PICK(&rng, sim_campaign_fault_stalls_ms);
        /* A hostile writer, from its own stream (SIM_CAMPAIGN_HOSTILE_PCT). */
        const size_t hk = SIM_CAMPAIGN_HOSTILE_KIND;
        const sim_campaign_fault_kind_t *hostile_kind = &sim_campaign_fault_kinds[hk];
        assert(hostile_kind->draw == sim_campaign_draw_hostile_write);
        sim_rng_t hostile;
        sim_rng_init(&hostile, seed, run | SIM_CAMPAIGN_HOSTILE_STREAM);
        const uint64_t pct = faults->kinds == 1u << hk ? 100 : SIM_CAMPAIGN_HOSTILE_PCT;
        if (draw->nfaults < SIM_CAMPAIGN_MAX_FAULTS && (faults->kinds >> hk & 1u) &&
            !(faults->conflicts && sim_campaign_conflict(hostile_kind->classes, classes)) &&
            sim_campaign_pct(&hostile, pct)) {
            hostile_kind->draw(&hostile, &scene, draw->spec[draw->nfaults],
                               sizeof draw->spec[draw->nfaults]);
            draw->kinds[draw->nfaults++] = hk;
        }
    }
    for (uint32_t f = 0; f < draw->nfaults; f++)
        draw->faults[f] = draw->spec[f];
    cfg->faults = draw->faults;
    cfg->nfaults = draw->nfaults;
    cfg->stall_timeout_ns = stall_ms * 1000000u;
    cfg->max_events = SIM_CAMPAIGN_MAX_EVENTS;
    sim_rng_t knobs;
    sim_rng_init(&knobs, seed, run | SIM_CAMPAIGN_KNOB_STREAM);
    if (sim_campaign_pct(&knobs, SIM_CAMPAIGN_SQ_PCT)) {
        draw->sq_depth = (uint32_t)sim_rng_range(&knobs, 1, SIM_CAMPAIGN_MAX_SQ_DEPTH);
        cfg->net_sq_depth = draw->sq_depth;
    }
    /* Around one AUX message's size, and a few of them. */
    static const uint32_t aux_limits[] = {1, 100, 3999, 4000, 4001, 9000,
                                          SIM_CAMPAIGN_MAX_AUX_BYTES};
    sim_rng_t aux;
    sim_rng_init(&aux, seed, run | SIM_CAMPAIGN_AUX_STREAM);
    if (sim_campaign_pct(&aux, SIM_CAMPAIGN_AUX_PCT)) {
        draw->aux_bytes = SIM_CAMPAIGN_PICK(&aux, aux_limits);
        cfg->max_aux_bytes = draw->aux_bytes;
    }
    /* The provenance data mode: a stream of its own, so the rest of every
     * run is drawn as before it existed (and both modes give one digest). */
    sim_rng_t data;
    sim_rng_init(&data, seed, run | SIM_CAMPAIGN_DATA_STREAM);
    if (sim_campaign_pct(&data, SIM_CAMPAIGN_PROVENANCE_PCT))
        cfg->data_mode = KVS_SIM_DATA_PROVENANCE;
    cfg->seed = sim_rng_next(&rng);
}

/* splitmix64's finalizer: folds one run's digest into the campaign's. */
static uint64_t sim_campaign_mix(uint64_t h, uint64_t v)
{
    uint64_t z = h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Appends "<n> <what>" to why, comma separated, when n > 0. */
static void sim_campaign_why(char *why, uint64_t n, const char *what)
{
    if (n == 0)
        return;
    const size_t used = strlen(why);
    snprintf(why + used, KVS_SIM_CAMPAIGN_WHY_BYTES - used, "%s%" PRIu64 " %s",
             used > 0 ? ", " : "", n, what);
}

/* ---- judging and the campaign ---------------------------------------------- */

/* One finished run into the totals; its violations (0 = clean) and why. */
static uint64_t sim_campaign_judge(kvs_sim_campaign_report_t *t, const sim_campaign_draw_t *draw,
                                   int rc, const char *err, const kvs_sim_report_t *r,
                                   char *why)
{
    why[0] = '\0';
    t->runs++;
    t->runs_with_faults += draw->nfaults > 0;
    t->runs_with_sq_depth += draw->sq_depth > 0;
    t->runs_with_aux += draw->aux_bytes > 0;
    t->runs_with_clusters += draw->instances > 2;
    t->runs_large += draw->large;
    t->runs_provenance += draw->cfg.data_mode == KVS_SIM_DATA_PROVENANCE;
    for (uint32_t f = 0; f < draw->nfaults; f++)
        t->kind_drawn[draw->kinds[f]]++;
    for (uint32_t k = 0; k < SIM_CAMPAIGN_MODEL_KINDS; k++)
        t->model_kind_runs[k] += draw->models >> k & 1u;
    t->runs_model_combined += (draw->models & (draw->models - 1u)) != 0;
    if (rc != KVS_OK && r->events == 0) {
        /* The generator believed the scenario valid: a bug of the generator
         * or of a validation, told apart from a broken invariant. */
        t->setup_errors++;
        snprintf(why, KVS_SIM_CAMPAIGN_WHY_BYTES, "set-up error (generator or validation bug): %.190s",
                 err[0] != '\0' ? err : kvs_strerror(rc));
        return 1;
    }
    if (rc != KVS_OK) {
        /* The simulator stopped the run (a handler failed its progress, a
         * room was reported twice, ...): a bug of the core or the sim. */
        t->runs_stopped++;
        snprintf(why, KVS_SIM_CAMPAIGN_WHY_BYTES, "run stopped by the simulator after %" PRIu64
                 " events: %.190s", r->events, err[0] != '\0' ? err : kvs_strerror(rc));
        return 1;
    }
    t->requests_total += r->requests_total;
    t->requests_ok += r->requests_ok;
    t->requests_failed += r->requests_failed;
    t->hung_requests += r->hung_requests;
    t->ring_leaked_bytes += r->ring_leaked_bytes;
    t->corrupt_bytes += r->corrupt_bytes;
    t->unreported_failures += r->unreported_failures;
    t->failed_without_faults += r->failed_without_faults;
    t->collateral_failures += r->collateral_failures;
    t->posts_refused += r->posts_refused;
    t->aux_bytes_verified += r->aux_bytes_verified;
    t->aux_corrupt_bytes += r->aux_corrupt_bytes;
    t->keys_granted += r->keys_granted;
    t->keys_leaked += r->keys_leaked;
    t->hostile_writes += r->hostile_writes;
    t->hostile_bytes_landed += r->hostile_bytes_landed;
    t->events += r->events;
    if (r->events > t->max_run_events)
        t->max_run_events = r->events;
    t->digest = sim_campaign_mix(t->digest, r->digest);
    if ((unsigned)r->path < SIM_CAMPAIGN_COUNT(t->paths))
        t->paths[r->path]++;
    sim_campaign_why(why, r->hung_requests, "hung");
    sim_campaign_why(why, r->ring_leaked_bytes, "ring bytes leaked");
    sim_campaign_why(why, r->corrupt_bytes, "corrupt bytes");
    sim_campaign_why(why, r->aux_corrupt_bytes, "of them in aux payloads");
    sim_campaign_why(why, r->unreported_failures, "unreported failures");
    sim_campaign_why(why, r->collateral_failures, "collateral failures");
    sim_campaign_why(why, r->failed_without_faults, "requests failed without faults");
    sim_campaign_why(why, r->keys_leaked, "region-scoped keys leaked");
    sim_campaign_why(why, r->hostile_bytes_landed, "bytes of hostile writes landed");
    /* The library's verdict (check.h), nothing excused. */
    return r->violations;
}

const char *kvs_sim_campaign_fault_name(uint32_t kind)
{
    return kind < SIM_CAMPAIGN_KINDS ? sim_campaign_fault_kinds[kind].name : NULL;
}

const char *kvs_sim_campaign_model_kind_name(uint32_t kind)
{
    return kind < SIM_CAMPAIGN_MODEL_KINDS ? sim_campaign_model_names[kind] : NULL;
}

_Static_assert(SIM_CAMPAIGN_MODEL_KINDS <= KVS_SIM_CAMPAIGN_MAX_MODEL_KINDS,
               "a model kind past kvs_sim_campaign_report_t.model_kind_runs");
_Static_assert(SIM_CAMPAIGN_KINDS <= KVS_SIM_CAMPAIGN_MAX_KINDS,
               "a fault kind past kvs_sim_campaign_report_t.kind_drawn");
_Static_assert(SIM_CAMPAIGN_HOSTILE_KIND < SIM_CAMPAIGN_KINDS,
               "SIM_CAMPAIGN_HOSTILE_KIND names the hostile-write row");

int kvs_sim_campaign_run(const kvs_sim_campaign_config_t *cfg, kvs_sim_campaign_fn on_run,
                         void *ctx, kvs_sim_campaign_report_t *out, kvs_error_t *err)
{
    if (cfg == NULL || out == NULL)
        return SIM_CAMPAIGN_FAIL(err, KVS_EINVAL, "cfg and out must not be NULL");
    if (cfg->version != KVS_SIM_CAMPAIGN_CONFIG_VERSION ||
        cfg->size_bytes < offsetof(kvs_sim_campaign_config_t, kinds))
        return SIM_CAMPAIGN_FAIL(err, KVS_EVERSION, "campaign config version %u, size_bytes "
                                 "%u: use kvs_sim_campaign_config_init", cfg->version,
                                 cfg->size_bytes);
    if (out->size_bytes < sizeof(kvs_sim_campaign_report_t))
        return SIM_CAMPAIGN_FAIL(err, KVS_EVERSION, "report size_bytes %u: set it to "
                                 "sizeof(kvs_sim_campaign_report_t) before the call",
                                 out->size_bytes);
    if (cfg->runs < 1 || cfg->runs > KVS_SIM_CAMPAIGN_MAX_RUNS)
        return SIM_CAMPAIGN_FAIL(err, KVS_EINVAL, "runs %" PRIu64 " is out of range: give "
                                 "1..%d", cfg->runs, KVS_SIM_CAMPAIGN_MAX_RUNS);
    /* Default: every kind, under sim_campaign_conflicts. */
    sim_campaign_faults_t faults = {.kinds = (1u << SIM_CAMPAIGN_KINDS) - 1u, .conflicts = true};
    int rc;
    if (cfg->faults != NULL && (rc = sim_campaign_parse_faults(cfg->faults, &faults, err)) != 0)
        return rc;
    /* Default: every model kind at its odds (a caller of before kinds
     * existed, whose config ends at faults, gets the same). */
    sim_campaign_models_t models = {.kinds = SIM_CAMPAIGN_ALL_MODELS, .at_least_one = false};
    const char *kinds = cfg->size_bytes >= offsetof(kvs_sim_campaign_config_t, kinds) +
                                               sizeof cfg->kinds
                            ? cfg->kinds : NULL;
    if (kinds != NULL && (rc = sim_campaign_parse_models(kinds, &models, err)) != 0)
        return rc;
    const uint32_t size = out->size_bytes;
    memset(out, 0, sizeof *out);
    out->version = KVS_SIM_CAMPAIGN_REPORT_VERSION;
    out->size_bytes = size;
    out->kinds = (uint32_t)SIM_CAMPAIGN_KINDS;
    out->max_instances = SIM_CAMPAIGN_MAX_INSTANCES;
    out->max_sq_depth = SIM_CAMPAIGN_MAX_SQ_DEPTH;
    out->max_aux_bytes = SIM_CAMPAIGN_MAX_AUX_BYTES;
    out->model_kinds = SIM_CAMPAIGN_MODEL_KINDS;
    sim_campaign_draw_t *draw = malloc(sizeof *draw);
    kvs_sim_report_t *report = malloc(sizeof *report);
    if (draw == NULL || report == NULL) {
        free(draw);
        free(report);
        return SIM_CAMPAIGN_FAIL(err, KVS_ENOMEM, "out of memory for one run's tables");
    }
    for (uint64_t i = 0; i < cfg->runs; i++) {
        sim_campaign_generate(cfg->seed, i, &faults, &models, draw);
        memset(report, 0, sizeof *report);
        report->size_bytes = (uint32_t)sizeof *report;
        kvs_error_t run_err = {0};
        const int run_rc = kvs_sim_run(&draw->cfg, report, &run_err);
        char why[KVS_SIM_CAMPAIGN_WHY_BYTES];
        const uint64_t v = sim_campaign_judge(out, draw, run_rc, run_err.msg, report, why);
        if (v > 0) {
            out->violations += v;
            out->runs_with_violations++;
        }
        if (on_run != NULL) {
            const kvs_sim_campaign_run_t run = {
                .index = i, .status = run_rc, .nfaults = draw->nfaults, .config = &draw->cfg,
                .report = report, .violations = v, .why = why, .error = run_err.msg};
            on_run(ctx, &run);
        }
    }
    free(draw);
    free(report);
    if (err != NULL)
        memset(err, 0, sizeof *err);
    return KVS_OK;
}
