/*
 * campaign.c - `kvstage sim --campaign N --seed S` (see campaign.h): draws
 * N small random scenarios, runs each on the simulator, judges it by its
 * run invariants and sums up, with the command that replays the first run
 * that broke one.
 *
 * Run i draws from its own stream sim_rng_init(S, i), so any run replays
 * alone. The draw is a `kvstage sim` argv; the run is whatever
 * cli_sim_parse makes of it, so the printed command and the run cannot
 * drift apart. Scenarios are small (a few layers, small heads, short
 * prompts, few requests) because simulated GPU memory is real host memory:
 * a campaign explores many shapes, loads and fault mixes, not big models.
 *
 * In CLI_CAMPAIGN_CLUSTER_PCT of the runs the cluster has 1-4 instances
 * per side (spec §12), of mixed TP and PP, and faults of one rank strike
 * one instance: collateral_failures then checks that a fault fails only
 * the requests paired with an instance it struck. That draw too comes
 * from a stream of its own, so a run of one instance per side is drawn as
 * before clusters existed.
 *
 * About a quarter of the runs also get send queues that fill (--sq-depth
 * 1-4, with or without faults), so the fabric refuses posts and the core
 * must post them again; that draw comes from a stream of its own, so the
 * rest of every run is drawn as before the knob existed. Another quarter,
 * drawn from yet another stream, carries aux payloads (--aux-bytes), which
 * every decode rank checks byte for byte under the run's faults.
 *
 * Faults come from cli_campaign_fault_kinds: one row per `--fault` kind
 * with its odds, its classes and a function that writes a spec. A new kind
 * of sim_fault_kind_t (crash, restart, hbm-full) is one row and one
 * function. By default every kind is drawn, but never two whose classes
 * cli_campaign_conflicts keeps apart (each pair says why: mixes that the
 * library or the simulator's judge cannot pass yet); `--campaign-faults`
 * names the kinds and lifts that rule.
 *
 * Wall time is measured here (tools/ is not simulator code); it is the
 * only thing two campaigns of one seed may differ in.
 */
#include "campaign.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kvstage/kvstage.h>

#include "args.h"
#include "rng.h"
#include "scenario.h"
#include "sim.h"

#define CLI_CAMPAIGN_CMD "sim"
#define CLI_CAMPAIGN_MAX_RUNS 100000000
/* A generated command line: at most this many words and bytes. */
#define CLI_CAMPAIGN_MAX_ARGS 96
#define CLI_CAMPAIGN_TEXT_BYTES 2048
#define CLI_CAMPAIGN_SPEC_BYTES 96
/* Faults in a run that has any: 1..this. */
#define CLI_CAMPAIGN_MAX_FAULTS 4
/* Engine events one run may dispatch: over 10x what the largest draw
 * needed in 12000 runs, so a run that hits it is stuck (counted as hung),
 * not slow. */
#define CLI_CAMPAIGN_MAX_EVENTS 5000000
/* What a run may cost, in the generator's estimate of its writes and
 * messages: keeps the slowest runs within ~20x of the mean. */
#define CLI_CAMPAIGN_COST 20000
/* Stall timeout of runs without faults: the library default, since there
 * nothing may fail. */
#define CLI_CAMPAIGN_CLEAN_STALL_MS 30000
/* Send queues that fill: in this share of the runs (percent), --sq-depth
 * 1..CLI_CAMPAIGN_MAX_SQ_DEPTH, so the fabric refuses posts and the core
 * must post them again. Drawn from a stream of its own (the run's index
 * with this bit set: no run index has it), so every other draw of a run
 * is what it was before the knob existed. */
#define CLI_CAMPAIGN_SQ_PCT 25
#define CLI_CAMPAIGN_MAX_SQ_DEPTH 4
#define CLI_CAMPAIGN_KNOB_STREAM (UINT64_C(1) << 63)
/* Aux payloads: in this share of the runs (percent), --aux-bytes from
 * the list in cli_campaign_generate, so a run's requests carry payloads of one
 * byte up to several AUX messages (4000 bytes each) to every decode rank.
 * Drawn from a stream of its own (the run's index with this bit set), so a
 * run without them is drawn as before the knob existed. */
#define CLI_CAMPAIGN_AUX_PCT 25
#define CLI_CAMPAIGN_MAX_AUX_BYTES 16384
#define CLI_CAMPAIGN_AUX_STREAM (UINT64_C(1) << 61)
/* Clusters (spec §12): in this share of the runs (percent), 1..
 * CLI_CAMPAIGN_MAX_INSTANCES instances per side of mixed TP and PP, and
 * the least-loaded router in half of them; drawn from a stream of their own
 * (the run's index with this bit set), so a run of one instance per side
 * is drawn as before clusters existed. At most CLI_CAMPAIGN_MAX_CLUSTER_RANKS
 * ranks in all keep a cluster's set-up (every decode rank connects to its
 * writers in every prefill instance) within the cost of a run. */
#define CLI_CAMPAIGN_CLUSTER_PCT 40
#define CLI_CAMPAIGN_MAX_INSTANCES 4
#define CLI_CAMPAIGN_MAX_CLUSTER_RANKS 24
#define CLI_CAMPAIGN_CLUSTER_STREAM (UINT64_C(1) << 62)
/* Violating runs listed on stderr and in the JSON. */
#define CLI_CAMPAIGN_LISTED 10
#define CLI_CAMPAIGN_WHY_BYTES 256

/* Progress line on a terminal, as `kvstage sim` draws it. */
#define CLI_CAMPAIGN_PROGRESS_AFTER_S 0.5
#define CLI_CAMPAIGN_REDRAW_S 0.1
#define CLI_CAMPAIGN_BAR_WIDTH 20

enum cli_campaign_flag {
    CLI_CF_CAMPAIGN,
    CLI_CF_SEED,
    CLI_CF_JSON,
    CLI_CF_LOG,
    CLI_CF_FAULTS,
    CLI_CF_HELP,
    CLI_CF_COUNT
};

static const cli_flag_t cli_campaign_flags[CLI_CF_COUNT] = {
    [CLI_CF_CAMPAIGN] = {"--campaign", true},
    [CLI_CF_SEED] = {"--seed", true},
    [CLI_CF_JSON] = {"--json", false},
    [CLI_CF_LOG] = {"--campaign-log", true},
    [CLI_CF_FAULTS] = {"--campaign-faults", true},
    [CLI_CF_HELP] = {"--help", false},
};

/* ---- one generated command line ------------------------------------------ */

typedef struct cli_campaign_cmd {
    char text[CLI_CAMPAIGN_TEXT_BYTES];
    size_t used;
    char *argv[CLI_CAMPAIGN_MAX_ARGS];
    int argc;
    bool overflow;             /* a word did not fit: a generator bug */
} cli_campaign_cmd_t;

static void cli_campaign_word(cli_campaign_cmd_t *c, const char *word)
{
    const size_t len = strlen(word);
    if (c->overflow || c->argc == CLI_CAMPAIGN_MAX_ARGS ||
        len + 1 > sizeof c->text - c->used) {
        c->overflow = true;
        return;
    }
    memcpy(c->text + c->used, word, len + 1);
    c->argv[c->argc++] = c->text + c->used;
    c->used += len + 1;
}

static void cli_campaign_flag_str(cli_campaign_cmd_t *c, const char *flag, const char *value)
{
    cli_campaign_word(c, flag);
    cli_campaign_word(c, value);
}

static void cli_campaign_flag_u64(cli_campaign_cmd_t *c, const char *flag, uint64_t value)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, value);
    cli_campaign_flag_str(c, flag, buf);
}

/* ---- drawing --------------------------------------------------------------- */

#define CLI_CAMPAIGN_COUNT(a) (sizeof(a) / sizeof((a)[0]))
/* One element of a constant array, uniformly. */
#define CLI_CAMPAIGN_PICK(rng, a) ((a)[sim_rng_below((rng), CLI_CAMPAIGN_COUNT(a))])

/* Every draw below is a statement of its own, never two in one argument
 * list: C leaves the order of arguments open and gcc and clang differ,
 * which would give one seed other scenarios in each build. */

/* True with probability pct/100. */
static bool cli_campaign_pct(sim_rng_t *rng, uint64_t pct)
{
    return sim_rng_chance(rng, pct, 100);
}

/* What the fault generators look at, and the stall timeout they may set. */
typedef struct cli_campaign_scene {
    sim_topology_t topo;       /* every instance of both sides */
    uint64_t horizon_us;       /* rough simulated length of the run */
    uint64_t stall_ms;         /* 0: the default for runs with faults */
} cli_campaign_scene_t;

/* Ranks of a side over all its instances. */
static int64_t cli_campaign_side_ranks(const sim_topology_t *t, kvs_role_t role)
{
    int64_t n = 0;
    for (uint32_t i = 0; i < sim_topology_count(t, role); i++)
        n += sim_topology_ranks(t, role, i);
    return n;
}

/* Rank k of a side over all its instances (instance 0's first) -> its
 * instance and index in it. */
static uint32_t cli_campaign_locate(const sim_topology_t *t, kvs_role_t role, int64_t k,
                                    int64_t *index)
{
    uint32_t i = 0;
    while (k >= sim_topology_ranks(t, role, i))
        k -= sim_topology_ranks(t, role, i++);
    *index = k;
    return i;
}

/* "@<i>" for instance i > 0, "" for instance 0 (the form without clusters). */
static const char *cli_campaign_at(uint32_t inst, char *buf, size_t cap)
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
static const uint64_t cli_campaign_fault_stalls_ms[] = {2000, 5000, 30000};
#define CLI_CAMPAIGN_MAX_DELAY_US 50000
#define CLI_CAMPAIGN_MAX_LINK_DOWN_US 500000

/* "p<tp>.<pp>[@<i>]" or "d<tp>.<pp>[@<i>]", any rank of the cluster (decode
 * only when decode_only): one rank of one instance. */
static void cli_campaign_rank(sim_rng_t *rng, const cli_campaign_scene_t *s, bool decode_only,
                              char *out, size_t cap)
{
    const int64_t np = cli_campaign_side_ranks(&s->topo, KVS_ROLE_PREFILL);
    const int64_t nd = cli_campaign_side_ranks(&s->topo, KVS_ROLE_DECODE);
    const int64_t k = decode_only ? np + (int64_t)sim_rng_below(rng, (uint64_t)nd)
                                  : (int64_t)sim_rng_below(rng, (uint64_t)(np + nd));
    const bool decode = k >= np;
    const kvs_role_t role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
    int64_t idx;
    const uint32_t inst = cli_campaign_locate(&s->topo, role, decode ? k - np : k, &idx);
    const int64_t tp = decode ? s->topo.decode[inst].tp : s->topo.prefill[inst].tp;
    char at[16];
    snprintf(out, cap, "%c%" PRId64 ".%" PRId64 "%s", decode ? 'd' : 'p', idx % tp, idx / tp,
             cli_campaign_at(inst, at, sizeof at));
}

static const char *const cli_campaign_probs[] = {"0.001", "0.01", "0.05", "0.2", "0.5", "1"};

/* Message types the message faults pick from (fault.c's names), all of
 * them. REGISTER is sent once, at set-up, before any room opens, so a
 * duplicate of it is never mistaken for a restart mid-run here. */
static const char *const cli_campaign_msg_types[] = {
    "any", "register", "metadata", "staging_req", "staging_rsp",
    "chunk_ready", "watermark", "status", "abort",
};

static void cli_campaign_draw_msg(sim_rng_t *rng, const char *kind, char *spec, size_t cap)
{
    const char *type = CLI_CAMPAIGN_PICK(rng, cli_campaign_msg_types);
    const char *prob = CLI_CAMPAIGN_PICK(rng, cli_campaign_probs);
    snprintf(spec, cap, "%s:%s:%s", kind, type, prob);
}

/* Each draw function writes one --fault spec into spec and may set the
 * scene's stall timeout. */
static void cli_campaign_draw_drop(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec,
                                   size_t cap)
{
    cli_campaign_draw_msg(rng, "drop", spec, cap);
}

static void cli_campaign_draw_dup(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec,
                                  size_t cap)
{
    cli_campaign_draw_msg(rng, "dup", spec, cap);
}

static void cli_campaign_draw_delay(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec,
                                    size_t cap)
{
    static const uint64_t max_us[] = {10, 200, 5000, CLI_CAMPAIGN_MAX_DELAY_US};
    char head[64];
    cli_campaign_draw_msg(rng, "delay", head, sizeof head);
    snprintf(spec, cap, "%s:%" PRIu64, head,
             sim_rng_range(rng, 1, CLI_CAMPAIGN_PICK(rng, max_us)));
}

static void cli_campaign_draw_write_error(sim_rng_t *rng, cli_campaign_scene_t *s,
                                          char *spec, size_t cap)
{
    snprintf(spec, cap, "write-error:%s", CLI_CAMPAIGN_PICK(rng, cli_campaign_probs));
}

static void cli_campaign_draw_link_down(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec,
                                        size_t cap)
{
    static const uint64_t max_for_us[] = {50, 2000, 50000, CLI_CAMPAIGN_MAX_LINK_DOWN_US};
    char rank[32];
    cli_campaign_rank(rng, s, false, rank, sizeof rank);
    const uint64_t at_us = sim_rng_range(rng, 0, s->horizon_us);
    const uint64_t for_us = sim_rng_range(rng, 1, CLI_CAMPAIGN_PICK(rng, max_for_us));
    snprintf(spec, cap, "link-down:%s:%" PRIu64 ":%" PRIu64, rank, at_us, for_us);
}

static void cli_campaign_draw_slow_scatter(sim_rng_t *rng, cli_campaign_scene_t *s,
                                           char *spec, size_t cap)
{
    static const uint64_t factors[] = {2, 10, 100, 1000};
    char rank[32];
    cli_campaign_rank(rng, s, true, rank, sizeof rank);
    snprintf(spec, cap, "slow-scatter:%s:%" PRIu64, rank, CLI_CAMPAIGN_PICK(rng, factors));
}

/* A rank of either role, of one instance, crashes (or restarts) at a
 * random time of the run. */
static void cli_campaign_draw_rank_event(sim_rng_t *rng, cli_campaign_scene_t *s,
                                         const char *kind, char *spec, size_t cap)
{
    const bool decode = sim_rng_below(rng, 2) == 1;
    const kvs_role_t role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
    const int64_t k = (int64_t)sim_rng_below(rng,
                                             (uint64_t)cli_campaign_side_ranks(&s->topo, role));
    int64_t n;
    const uint32_t inst = cli_campaign_locate(&s->topo, role, k, &n);
    const uint64_t at_us = sim_rng_range(rng, 0, s->horizon_us);
    char at[16];
    snprintf(spec, cap, "%s:%s%s:%" PRId64 ":%" PRIu64, kind, decode ? "decode" : "prefill",
             cli_campaign_at(inst, at, sizeof at), n, at_us);
}

static void cli_campaign_draw_crash(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec,
                                    size_t cap)
{
    cli_campaign_draw_rank_event(rng, s, "crash", spec, cap);
}

static void cli_campaign_draw_restart(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec,
                                      size_t cap)
{
    cli_campaign_draw_rank_event(rng, s, "restart", spec, cap);
}

static void cli_campaign_draw_hbm_full(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec,
                                       size_t cap)
{
    char rank[32];
    cli_campaign_rank(rng, s, false, rank, sizeof rank);
    snprintf(spec, cap, "hbm-full:%s", rank);
}

/* A stall timeout shorter than the run's own waits: rooms time out while
 * their peers still make progress. The fault (stall:MS) carries it, so
 * the run and its replay know the cluster is faulted; --stall-timeout-ms
 * says the same number. */
static void cli_campaign_draw_stall(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec,
                                    size_t cap)
{
    static const uint64_t stalls_ms[] = {1, 2, 5, 10, 20, 50};
    s->stall_ms = CLI_CAMPAIGN_PICK(rng, stalls_ms);
    snprintf(spec, cap, "stall:%" PRIu64, s->stall_ms);
}

/* What a fault does, for the rule below on which faults share a run. */
enum {
    CLI_CAMPAIGN_LOSS = 1u << 0,    /* control messages never arrive */
    CLI_CAMPAIGN_ERROR = 1u << 1,   /* a rank fails a request for real */
    CLI_CAMPAIGN_TIMEOUT = 1u << 2, /* stall timeouts fire on healthy rooms */
    CLI_CAMPAIGN_LATE = 1u << 3,    /* control messages arrive late */
};

/*
 * Classes a default campaign (no --campaign-faults) never draws into one
 * run, because the simulator would count what follows as an unreported
 * failure although no implementation could have told the peer in time:
 * - TIMEOUT with ERROR: scenario.c judges per room, not per peer, so a rank
 *   that times out in a PP stage or TP group that a real failure never
 *   reached is counted as unreported.
 * - TIMEOUT with LOSS: a stall timeout of a few ms is shorter than the
 *   retransmissions a lossy link needs, so a notice (or the peer's loss,
 *   found when the link gives up after one stall timeout) arrives after the
 *   ranks that waited on it have timed out.
 * - TIMEOUT with LATE: the same with a notice delayed past the timeout.
 * (LOSS and LATE with ERROR were kept apart until control messages were
 * retried and a prefill told a decode whose ROOM was still on the way;
 * they now run together, link-down included.)
 */
static const uint32_t cli_campaign_conflicts[][2] = {
    {CLI_CAMPAIGN_TIMEOUT, CLI_CAMPAIGN_ERROR},
    {CLI_CAMPAIGN_TIMEOUT, CLI_CAMPAIGN_LOSS},
    {CLI_CAMPAIGN_TIMEOUT, CLI_CAMPAIGN_LATE},
};

/* The kinds a campaign draws, with their odds. A new kind is a row here
 * and a draw function above. */
typedef struct cli_campaign_fault_kind {
    const char *name;          /* as in --fault; also the JSON key */
    uint32_t weight;           /* odds relative to the other rows */
    uint32_t classes;          /* CLI_CAMPAIGN_LOSS | ... */
    void (*draw)(sim_rng_t *rng, cli_campaign_scene_t *s, char *spec, size_t cap);
} cli_campaign_fault_kind_t;

static const cli_campaign_fault_kind_t cli_campaign_fault_kinds[] = {
    {"drop", 6, CLI_CAMPAIGN_LOSS, cli_campaign_draw_drop},
    {"dup", 4, 0, cli_campaign_draw_dup},
    {"delay", 4, CLI_CAMPAIGN_LATE, cli_campaign_draw_delay},
    {"write-error", 4, CLI_CAMPAIGN_ERROR, cli_campaign_draw_write_error},
    {"link-down", 3, CLI_CAMPAIGN_LOSS | CLI_CAMPAIGN_ERROR, cli_campaign_draw_link_down},
    {"slow-scatter", 2, 0, cli_campaign_draw_slow_scatter},
    {"stall", 2, CLI_CAMPAIGN_TIMEOUT, cli_campaign_draw_stall},
    {"crash", 2, CLI_CAMPAIGN_ERROR, cli_campaign_draw_crash},
    {"restart", 2, CLI_CAMPAIGN_ERROR, cli_campaign_draw_restart},
    {"hbm-full", 1, CLI_CAMPAIGN_ERROR, cli_campaign_draw_hbm_full},
};

#define CLI_CAMPAIGN_KINDS CLI_CAMPAIGN_COUNT(cli_campaign_fault_kinds)

/* The fault kinds of a campaign: bit k for cli_campaign_fault_kinds[k]. */
typedef struct cli_campaign_faults {
    uint32_t kinds;
    bool conflicts;            /* apply cli_campaign_conflicts */
} cli_campaign_faults_t;

static bool cli_campaign_conflict(uint32_t a, uint32_t b)
{
    for (size_t c = 0; c < CLI_CAMPAIGN_COUNT(cli_campaign_conflicts); c++) {
        const uint32_t x = cli_campaign_conflicts[c][0], y = cli_campaign_conflicts[c][1];
        if (((a & x) && (b & y)) || ((a & y) && (b & x)))
            return true;
    }
    return false;
}

/* A kind that may join a run whose faults so far have classes `have`, by
 * its weight; CLI_CAMPAIGN_KINDS when none may. */
static size_t cli_campaign_pick_kind(sim_rng_t *rng, const cli_campaign_faults_t *faults,
                                     uint32_t have)
{
    uint64_t weight[CLI_CAMPAIGN_KINDS], total = 0;
    for (size_t k = 0; k < CLI_CAMPAIGN_KINDS; k++) {
        const cli_campaign_fault_kind_t *fk = &cli_campaign_fault_kinds[k];
        const bool ok = (faults->kinds >> k & 1u) &&
                        !(faults->conflicts && (cli_campaign_conflict(fk->classes, have) ||
                                                cli_campaign_conflict(fk->classes,
                                                                      fk->classes)));
        weight[k] = ok ? fk->weight : 0;
        total += weight[k];
    }
    if (total == 0)
        return CLI_CAMPAIGN_KINDS;
    uint64_t x = sim_rng_below(rng, total);
    size_t k = 0;
    while (x >= weight[k])
        x -= weight[k++];
    return k;
}

/* "all", "none", or kinds separated by commas -> *out. */
static int cli_campaign_parse_faults(const char *text, cli_campaign_faults_t *out)
{
    char names[512] = "";
    size_t used = 0;
    for (size_t k = 0; k < CLI_CAMPAIGN_KINDS; k++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                 cli_campaign_fault_kinds[k].name,
                                 k + 1 < CLI_CAMPAIGN_KINDS ? ", " : "");
    out->conflicts = false;
    if (strcmp(text, "all") == 0) {
        out->kinds = (1u << CLI_CAMPAIGN_KINDS) - 1u;
        return 0;
    }
    out->kinds = 0;
    if (strcmp(text, "none") == 0)
        return 0;
    for (const char *p = text;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        size_t k = 0;
        while (k < CLI_CAMPAIGN_KINDS && !(strlen(cli_campaign_fault_kinds[k].name) == len &&
                                           strncmp(cli_campaign_fault_kinds[k].name, p, len) == 0))
            k++;
        if (k == CLI_CAMPAIGN_KINDS)
            return cli_fail(CLI_CAMPAIGN_CMD, "--campaign-faults: unknown fault kind '%.*s': "
                            "give all, none, or kinds separated by commas out of %s",
                            (int)len, p, names);
        out->kinds |= 1u << k;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return 0;
}

/* Two sizes plan together when the larger is a multiple of the smaller:
 * TP sizes of the two sides, and heads over a TP (split or replicated). */
static bool cli_campaign_divides(int64_t a, int64_t b)
{
    return a >= b ? a % b == 0 : b % a == 0;
}

/* What a run was drawn with, beyond its command line. */
typedef struct cli_campaign_draw {
    uint64_t sim_seed;         /* the run's --seed */
    uint32_t sq_depth;         /* its --sq-depth, 0: none */
    uint32_t aux_bytes;        /* its --aux-bytes, 0: none */
    uint32_t instances;        /* of both sides */
    uint32_t nfaults;
    size_t kinds[CLI_CAMPAIGN_MAX_FAULTS];
} cli_campaign_draw_t;

/* One of the parallelism flags: a value per instance, comma separated (one
 * value: one instance, the form without clusters). */
static void cli_campaign_flag_sizes(cli_campaign_cmd_t *c, const char *flag,
                                    const sim_topology_t *t, kvs_role_t role, bool pp)
{
    char buf[SIM_MAX_INSTANCES * 8];
    size_t used = 0;
    for (uint32_t i = 0; i < sim_topology_count(t, role) && used < sizeof buf; i++) {
        const sim_instance_shape_t *s = role == KVS_ROLE_DECODE ? &t->decode[i] : &t->prefill[i];
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%" PRId64, i > 0 ? "," : "",
                                 pp ? s->pp : s->tp);
    }
    cli_campaign_flag_str(c, flag, buf);
}

/* More instances for the cluster *t, whose instance 0 of each side is
 * drawn: 1..CLI_CAMPAIGN_MAX_INSTANCES per side, each TP from the family of
 * the run's heads (powers of two, or the threes) and pairing with every
 * instance of the other side, PP mixed (uneven splits included) where the
 * decode allows it (a decode of PP > 1 pairs only with prefill instances
 * of its PP), up to CLI_CAMPAIGN_MAX_CLUSTER_RANKS ranks in all. */
static void cli_campaign_draw_cluster(sim_rng_t *rng, int64_t heads, int64_t layers,
                                      bool threes, sim_topology_t *t)
{
    static const int64_t pow2[] = {1, 2, 4, 8};
    static const int64_t three_tps[] = {1, 2, 3, 6};
    static const int64_t pps[] = {1, 1, 2, 3};
    const uint32_t np = (uint32_t)sim_rng_range(rng, 1, CLI_CAMPAIGN_MAX_INSTANCES);
    const uint32_t nd = (uint32_t)sim_rng_range(rng, 1, CLI_CAMPAIGN_MAX_INSTANCES);
    int64_t ranks = t->prefill[0].tp * t->prefill[0].pp + t->decode[0].tp * t->decode[0].pp;
    for (uint32_t i = 1; i < np; i++) {
        int64_t tp = t->prefill[0].tp;
        for (int tries = 0; tries < 16; tries++) {
            const int64_t c = threes ? CLI_CAMPAIGN_PICK(rng, three_tps)
                                     : CLI_CAMPAIGN_PICK(rng, pow2);
            if (cli_campaign_divides(c, t->decode[0].tp) && cli_campaign_divides(heads, c)) {
                tp = c;
                break;
            }
        }
        int64_t pp = CLI_CAMPAIGN_PICK(rng, pps);
        if (t->decode[0].pp > 1 || pp > layers)
            pp = t->decode[0].pp > 1 ? t->decode[0].pp : 1;
        if (ranks + tp * pp > CLI_CAMPAIGN_MAX_CLUSTER_RANKS)
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
            const int64_t c = threes ? CLI_CAMPAIGN_PICK(rng, three_tps)
                                     : CLI_CAMPAIGN_PICK(rng, pow2);
            bool fits = cli_campaign_divides(heads, c);
            for (uint32_t p = 0; p < t->prefill_instances; p++)
                fits = fits && cli_campaign_divides(c, t->prefill[p].tp);
            if (fits) {
                tp = c;
                break;
            }
        }
        const bool staged = cli_campaign_pct(rng, 50);
        const int64_t pp = same_pp && staged ? t->prefill[0].pp : 1;
        if (ranks + tp * pp > CLI_CAMPAIGN_MAX_CLUSTER_RANKS)
            break;
        ranks += tp * pp;
        t->decode[t->decode_instances++] = (sim_instance_shape_t){tp, pp};
    }
}

/*
 * Run `run` of campaign `seed` as a `kvstage sim` command line in *cmd.
 * Valid by construction (the test of that is that the CLI accepts it and
 * the simulator sets it up).
 */
static void cli_campaign_generate(uint64_t seed, uint64_t run,
                                  const cli_campaign_faults_t *faults, cli_campaign_cmd_t *cmd,
                                  cli_campaign_draw_t *draw)
{
    sim_rng_t rng;
    sim_rng_init(&rng, seed, run);
    memset(cmd, 0, sizeof *cmd);
    memset(draw, 0, sizeof *draw);
    cli_campaign_word(cmd, "sim");

    /* Heads and TP sizes: powers of two mostly, multiples of 3 sometimes
     * (3 and 6 heads, TP 1, 2, 3, 6); replicated heads (H < TP) on either
     * side, P > D, P < D and P == D. */
    static const int64_t pow2[] = {1, 2, 4, 8};
    static const int64_t three_heads[] = {3, 6};
    static const int64_t three_tps[] = {1, 2, 3, 6};
    int64_t heads, ptp, dtp;
    const bool threes = !cli_campaign_pct(&rng, 85);
    if (!threes) {
        heads = CLI_CAMPAIGN_PICK(&rng, pow2);
        ptp = CLI_CAMPAIGN_PICK(&rng, pow2);
        dtp = CLI_CAMPAIGN_PICK(&rng, pow2);
    } else {
        heads = CLI_CAMPAIGN_PICK(&rng, three_heads);
        ptp = dtp = 1; /* if no draw below fits (odds below 2^-30) */
        for (int tries = 0; tries < 64; tries++) {
            const int64_t p = CLI_CAMPAIGN_PICK(&rng, three_tps);
            const int64_t d = CLI_CAMPAIGN_PICK(&rng, three_tps);
            if (cli_campaign_divides(p, d) && cli_campaign_divides(heads, p) &&
                cli_campaign_divides(heads, d)) {
                ptp = p;
                dtp = d;
                break;
            }
        }
    }
    static const int64_t pps[] = {1, 1, 1, 1, 1, 2, 2, 3};
    const int64_t ppp = CLI_CAMPAIGN_PICK(&rng, pps);
    const int64_t dpp = cli_campaign_pct(&rng, 50) ? 1 : ppp;
    /* Layers split over the stages evenly, or not (spec §4: the last
     * layers % PP stages hold one more), down to one layer per stage. */
    int64_t layers = ppp * (int64_t)sim_rng_range(&rng, 1, 3);
    if (ppp > 1)
        layers += (int64_t)sim_rng_below(&rng, (uint64_t)ppp);
    static const int64_t head_dims[] = {4, 8, 16, 16, 32, 64, 3, 5};
    const int64_t head_dim = CLI_CAMPAIGN_PICK(&rng, head_dims);
    static const char *const dtypes[] = {"bf16", "fp16", "fp8", "fp32"};
    const char *dtype = CLI_CAMPAIGN_PICK(&rng, dtypes);
    static const int64_t page_sizes[] = {1, 2, 4, 8, 16};
    const int64_t ps = CLI_CAMPAIGN_PICK(&rng, page_sizes);
    static const int64_t chunk_pages[] = {1, 2, 3, 4, 8, 16};
    const int64_t chunk = ps * CLI_CAMPAIGN_PICK(&rng, chunk_pages);

    /* The cluster: instance 0 of each side is the one drawn above; more
     * instances, and the router, come from a stream of their own. */
    sim_topology_t topo;
    memset(&topo, 0, sizeof topo);
    topo.prefill_instances = topo.decode_instances = 1;
    topo.prefill[0] = (sim_instance_shape_t){ptp, ppp};
    topo.decode[0] = (sim_instance_shape_t){dtp, dpp};
    sim_rng_t cluster;
    sim_rng_init(&cluster, seed, run | CLI_CAMPAIGN_CLUSTER_STREAM);
    bool least_loaded = false;
    if (cli_campaign_pct(&cluster, CLI_CAMPAIGN_CLUSTER_PCT)) {
        cli_campaign_draw_cluster(&cluster, heads, layers, threes, &topo);
        least_loaded = cli_campaign_pct(&cluster, 50);
    }
    draw->instances = topo.prefill_instances + topo.decode_instances;
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
    static const char *const paths[] = {"auto", "auto", "auto", "staging", "slice", "direct"};
    const char *path = CLI_CAMPAIGN_PICK(&rng, paths);
    if (strcmp(path, "direct") == 0 && !same_tp)
        path = "auto";

    /* Workload: prompts of at most 48 chunks, and as many requests as keep
     * the run's writes and messages near CLI_CAMPAIGN_COST (the slice path
     * writes each page run, or token, of each layer on its own). */
    const int64_t lo = (int64_t)sim_rng_range(&rng, 1, 192);
    int64_t hi = lo + (int64_t)sim_rng_range(&rng, 0, 256);
    if (hi > 48 * chunk)
        hi = lo > 48 * chunk ? lo : 48 * chunk;
    /* (a request's ranks are those of its pair of instances) */
    const int64_t per_request = (hi + chunk - 1) / chunk * pair_ranks * 8 +
                                (strcmp(path, "slice") == 0 ? hi * layers * 2 * max_tp : 0);
    int64_t max_requests = CLI_CAMPAIGN_COST / per_request;
    max_requests = max_requests < 1 ? 1 : max_requests > 12 ? 12 : max_requests;
    /* A cluster gets a request per instance at least, as the cost allows,
     * so that a fault of one instance meets requests of others in flight
     * (isolation). */
    const int64_t per_instance = draw->instances > 2 ? (int64_t)draw->instances : 1;
    const int64_t min_requests = per_instance < max_requests ? per_instance : max_requests;
    const int64_t requests = (int64_t)sim_rng_range(&rng, (uint64_t)min_requests,
                                                    (uint64_t)max_requests);
    static const char *const rates[] = {"0", "20", "200", "2000", "20000", "2.5"};
    const char *rate = CLI_CAMPAIGN_PICK(&rng, rates);
    static const uint64_t prefill_speeds[] = {16384, 16384, 4096, 262144, 4194304};
    const uint64_t prefill_speed = CLI_CAMPAIGN_PICK(&rng, prefill_speeds);
    static const int64_t nics[] = {25, 100, 400};

    /* The ring: whole regions of the largest chunk, from exactly one
     * (every chunk waits for the previous one's scatter) to many, plus a
     * few odd bytes sometimes so wraps land anywhere. */
    kvs_layout_params_t params = {
        .total_heads = heads, .head_dim = head_dim, .layers = layers, .page_size = ps,
        .prefill_tp = ptp, .decode_tp = dtp, .prefill_pp = ppp, .decode_pp = dpp,
        .chunk_tokens = chunk};
    (void)kvs_dtype_parse(dtype, &params.dtype);
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
    uint64_t ring = (uint64_t)region * CLI_CAMPAIGN_PICK(&rng, ring_regions);
    if (cli_campaign_pct(&rng, 30))
        ring += sim_rng_below(&rng, (uint64_t)region);

    cli_campaign_flag_u64(cmd, "--kv-heads", (uint64_t)heads);
    cli_campaign_flag_u64(cmd, "--head-dim", (uint64_t)head_dim);
    cli_campaign_flag_u64(cmd, "--layers", (uint64_t)layers);
    cli_campaign_flag_str(cmd, "--dtype", dtype);
    cli_campaign_flag_u64(cmd, "--page-size", (uint64_t)ps);
    cli_campaign_flag_u64(cmd, "--chunk-tokens", (uint64_t)chunk);
    cli_campaign_flag_sizes(cmd, "--prefill-tp", &topo, KVS_ROLE_PREFILL, false);
    cli_campaign_flag_sizes(cmd, "--decode-tp", &topo, KVS_ROLE_DECODE, false);
    cli_campaign_flag_sizes(cmd, "--prefill-pp", &topo, KVS_ROLE_PREFILL, true);
    cli_campaign_flag_sizes(cmd, "--decode-pp", &topo, KVS_ROLE_DECODE, true);
    if (least_loaded)
        cli_campaign_flag_str(cmd, "--router", "least-loaded");
    cli_campaign_flag_u64(cmd, "--requests", (uint64_t)requests);
    char prompt[48];
    snprintf(prompt, sizeof prompt, "%" PRId64 ":%" PRId64, lo, hi);
    cli_campaign_flag_str(cmd, "--prompt-tokens", prompt);
    if (cli_campaign_pct(&rng, 30))
        cli_campaign_flag_u64(cmd, "--prefix-tokens", sim_rng_range(&rng, 0, (uint64_t)hi));
    cli_campaign_flag_str(cmd, "--rate", rate);
    cli_campaign_flag_u64(cmd, "--max-inflight", sim_rng_range(&rng, 1, 8));
    cli_campaign_flag_u64(cmd, "--transfer-workers", sim_rng_range(&rng, 1, 4));
    cli_campaign_flag_u64(cmd, "--prefill-tokens-per-s", prefill_speed);
    cli_campaign_flag_u64(cmd, "--ring-bytes", ring);
    cli_campaign_flag_u64(cmd, "--nic-gbps", (uint64_t)CLI_CAMPAIGN_PICK(&rng, nics));
    cli_campaign_flag_str(cmd, "--path", path);

    /* Faults: none in about a third of the runs (then every request must
     * finish ok), else 1..CLI_CAMPAIGN_MAX_FAULTS of them. */
    uint64_t stall_ms = CLI_CAMPAIGN_CLEAN_STALL_MS;
    if (!cli_campaign_pct(&rng, 35) && faults->kinds != 0) {
        uint64_t rate_milli = 0;
        if (strcmp(rate, "2.5") == 0)
            rate_milli = 2500;
        else
            rate_milli = (uint64_t)strtoull(rate, NULL, 10) * 1000;
        cli_campaign_scene_t scene = {
            .topo = topo,
            .horizon_us = 1000 + (uint64_t)requests * (uint64_t)hi * 1000000 / prefill_speed +
                          (rate_milli > 0 ? (uint64_t)requests * 1000000000 / rate_milli : 0)};
        const uint32_t want = (uint32_t)sim_rng_range(&rng, 1, CLI_CAMPAIGN_MAX_FAULTS);
        uint32_t classes = 0;
        while (draw->nfaults < want) {
            const size_t k = cli_campaign_pick_kind(&rng, faults, classes);
            if (k == CLI_CAMPAIGN_KINDS)
                break; /* every kind left conflicts with those drawn */
            char spec[CLI_CAMPAIGN_SPEC_BYTES];
            cli_campaign_fault_kinds[k].draw(&rng, &scene, spec, sizeof spec);
            if (spec[0] != '\0')
                cli_campaign_flag_str(cmd, "--fault", spec);
            classes |= cli_campaign_fault_kinds[k].classes;
            draw->kinds[draw->nfaults++] = k;
        }
        stall_ms = scene.stall_ms != 0 ? scene.stall_ms
                                       : CLI_CAMPAIGN_PICK(&rng, cli_campaign_fault_stalls_ms);
    }
    cli_campaign_flag_u64(cmd, "--stall-timeout-ms", stall_ms);
    cli_campaign_flag_u64(cmd, "--max-events", CLI_CAMPAIGN_MAX_EVENTS);
    sim_rng_t knobs;
    sim_rng_init(&knobs, seed, run | CLI_CAMPAIGN_KNOB_STREAM);
    if (cli_campaign_pct(&knobs, CLI_CAMPAIGN_SQ_PCT)) {
        draw->sq_depth = (uint32_t)sim_rng_range(&knobs, 1, CLI_CAMPAIGN_MAX_SQ_DEPTH);
        cli_campaign_flag_u64(cmd, "--sq-depth", draw->sq_depth);
    }
    /* Around one AUX message's size, and a few of them. */
    static const uint32_t aux_limits[] = {1, 100, 3999, 4000, 4001, 9000,
                                          CLI_CAMPAIGN_MAX_AUX_BYTES};
    sim_rng_t aux;
    sim_rng_init(&aux, seed, run | CLI_CAMPAIGN_AUX_STREAM);
    if (cli_campaign_pct(&aux, CLI_CAMPAIGN_AUX_PCT)) {
        draw->aux_bytes = CLI_CAMPAIGN_PICK(&aux, aux_limits);
        cli_campaign_flag_u64(cmd, "--aux-bytes", draw->aux_bytes);
    }
    draw->sim_seed = sim_rng_next(&rng);
    cli_campaign_flag_u64(cmd, "--seed", draw->sim_seed);
}

/* ---- judging and totals ---------------------------------------------------- */

typedef struct cli_campaign_listed {
    uint64_t run;
    char why[CLI_CAMPAIGN_WHY_BYTES];
    char *replay;              /* owned */
} cli_campaign_listed_t;

typedef struct cli_campaign_totals {
    uint64_t runs, runs_with_faults, runs_with_violations, violations;
    uint64_t requests_total, requests_ok, requests_failed;
    uint64_t hung, leaked_bytes, corrupt_bytes, unreported, failed_without_faults;
    uint64_t collateral;       /* requests failed with neither instance faulted */
    uint64_t runs_with_clusters; /* more than one instance on a side */
    uint64_t setup_errors, runs_stopped;
    uint64_t runs_with_sq_depth, posts_refused;
    uint64_t runs_with_aux, aux_bytes_verified, aux_corrupt_bytes;
    uint64_t events, max_run_events;
    uint64_t digest;           /* of every run's digest, in order */
    uint64_t kind_drawn[CLI_CAMPAIGN_KINDS];
    uint64_t paths[4];         /* by kvs_path_t */
    cli_campaign_listed_t listed[CLI_CAMPAIGN_LISTED];
    uint32_t nlisted;
} cli_campaign_totals_t;

/* splitmix64's finalizer: folds one run's digest into the campaign's. */
static uint64_t cli_campaign_mix(uint64_t h, uint64_t v)
{
    uint64_t z = h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Appends "<n> <what>" to why, comma separated, when n > 0. */
static void cli_campaign_why(char *why, uint64_t n, const char *what)
{
    if (n == 0)
        return;
    const size_t used = strlen(why);
    snprintf(why + used, CLI_CAMPAIGN_WHY_BYTES - used, "%s%" PRIu64 " %s",
             used > 0 ? ", " : "", n, what);
}

/* One finished run: its violations (0 = clean) and why, into the totals. */
static uint64_t cli_campaign_judge(cli_campaign_totals_t *t, const cli_campaign_draw_t *draw,
                                   int rc, const char *err, const sim_report_t *r, char *why)
{
    why[0] = '\0';
    t->runs++;
    t->runs_with_faults += draw->nfaults > 0;
    t->runs_with_sq_depth += draw->sq_depth > 0;
    t->runs_with_aux += draw->aux_bytes > 0;
    t->runs_with_clusters += draw->instances > 2;
    for (uint32_t f = 0; f < draw->nfaults; f++)
        t->kind_drawn[draw->kinds[f]]++;
    if (rc != KVS_OK && r->events == 0) {
        /* The generator believed the scenario valid: a bug of the generator
         * or of a validation, told apart from a broken invariant. */
        t->setup_errors++;
        snprintf(why, CLI_CAMPAIGN_WHY_BYTES, "set-up error (generator or validation bug): %s",
                 err[0] != '\0' ? err : "the generated command was refused");
        return 1;
    }
    if (rc != KVS_OK) {
        /* The simulator stopped the run (a handler failed its progress, a
         * room was reported twice, ...): a bug of the core or the sim. */
        t->runs_stopped++;
        snprintf(why, CLI_CAMPAIGN_WHY_BYTES, "run stopped by the simulator after %" PRIu64
                 " events: %s", r->events, err[0] != '\0' ? err : kvs_strerror(rc));
        return 1;
    }
    const uint64_t failed_clean = draw->nfaults == 0 ? r->requests_failed : 0;
    /* A request that failed though no fault struck either of its instances
     * (scenario.h): in a run without faults it is a failure without faults,
     * counted once as that. */
    const uint64_t collateral = draw->nfaults == 0 ? 0 : r->collateral_failures;
    t->requests_total += r->requests_total;
    t->requests_ok += r->requests_ok;
    t->requests_failed += r->requests_failed;
    t->hung += r->hung_requests;
    t->leaked_bytes += r->ring_leaked_bytes;
    t->corrupt_bytes += r->corrupt_bytes;
    t->unreported += r->unreported_failures;
    t->failed_without_faults += failed_clean;
    t->collateral += collateral;
    t->posts_refused += r->posts_refused;
    t->aux_bytes_verified += r->aux_bytes_verified;
    t->aux_corrupt_bytes += r->aux_corrupt_bytes;
    t->events += r->events;
    if (r->events > t->max_run_events)
        t->max_run_events = r->events;
    t->digest = cli_campaign_mix(t->digest, r->digest);
    if ((unsigned)r->path < CLI_CAMPAIGN_COUNT(t->paths))
        t->paths[r->path]++;
    cli_campaign_why(why, r->hung_requests, "hung");
    cli_campaign_why(why, r->ring_leaked_bytes, "ring bytes leaked");
    cli_campaign_why(why, r->corrupt_bytes, "corrupt bytes");
    cli_campaign_why(why, r->aux_corrupt_bytes, "of them in aux payloads");
    cli_campaign_why(why, r->unreported_failures, "unreported failures");
    cli_campaign_why(why, collateral, "collateral failures");
    cli_campaign_why(why, failed_clean, "requests failed without faults");
    /* The library's verdict (sim/check.h), nothing excused: a `stall` run
     * carries its fault (stall:MS, of the whole cluster), so `kvstage sim`
     * and kvs_sim_run judge its replay alike. */
    return r->violations;
}

/* ---- output ----------------------------------------------------------------- */

typedef struct cli_campaign_progress {
    bool tty;
    struct timespec start;
    double last_draw_s;
    int drawn_len;
} cli_campaign_progress_t;

static double cli_campaign_elapsed_s(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

static void cli_campaign_progress_draw(cli_campaign_progress_t *p, uint64_t done,
                                       uint64_t total, uint64_t violations)
{
    if (!p->tty)
        return;
    const double now = cli_campaign_elapsed_s(&p->start);
    if (now < CLI_CAMPAIGN_PROGRESS_AFTER_S ||
        (p->drawn_len > 0 && now - p->last_draw_s < CLI_CAMPAIGN_REDRAW_S && done != total))
        return;
    char bar[CLI_CAMPAIGN_BAR_WIDTH + 1];
    const uint64_t filled = total > 0 ? done * CLI_CAMPAIGN_BAR_WIDTH / total : 0;
    for (size_t i = 0; i < CLI_CAMPAIGN_BAR_WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[CLI_CAMPAIGN_BAR_WIDTH] = '\0';
    char line[128];
    int len = snprintf(line, sizeof line,
                       "[%s] %" PRIu64 "/%" PRIu64 " runs, %" PRIu64 " violations, %.1f s", bar,
                       done, total, violations, now);
    if (len < 0)
        return;
    if (len >= (int)sizeof line)
        len = (int)sizeof line - 1;
    fprintf(stderr, "\r%s%*s", line, p->drawn_len > len ? p->drawn_len - len : 0, "");
    fflush(stderr);
    if (len > p->drawn_len)
        p->drawn_len = len;
    p->last_draw_s = now;
}

static void cli_campaign_progress_clear(cli_campaign_progress_t *p)
{
    if (p->drawn_len == 0)
        return;
    fprintf(stderr, "\r%*s\r", p->drawn_len, "");
    fflush(stderr);
    p->drawn_len = 0;
}

static void cli_campaign_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)s; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(out, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(out, "\\u%04x", *c);
        else
            fputc(*c, out);
    }
    fputc('"', out);
}

/* {"run": i, "why": "...", "replay": "kvstage sim ..."} */
static void cli_campaign_json_listed(const cli_campaign_listed_t *l)
{
    printf("{\"run\": %" PRIu64 ", \"why\": ", l->run);
    cli_campaign_json_string(stdout, l->why);
    printf(", \"replay\": ");
    cli_campaign_json_string(stdout, l->replay != NULL ? l->replay : "");
    printf("}");
}

static void cli_campaign_print_json(const cli_campaign_totals_t *t, uint64_t seed,
                                    const char *self, double wall_s)
{
    printf("{\"ok\": %s, \"runs\": %" PRIu64 ", \"violations\": %" PRIu64
           ", \"runs_with_violations\": %" PRIu64 ", \"seed\": %" PRIu64,
           t->violations == 0 ? "true" : "false", t->runs, t->violations,
           t->runs_with_violations, seed);
    printf(", \"runs_with_faults\": %" PRIu64 ", \"requests_total\": %" PRIu64
           ", \"requests_ok\": %" PRIu64 ", \"requests_failed\": %" PRIu64,
           t->runs_with_faults, t->requests_total, t->requests_ok, t->requests_failed);
    printf(", \"hung_requests\": %" PRIu64 ", \"ring_leaked_bytes\": %" PRIu64
           ", \"corrupt_bytes\": %" PRIu64 ", \"unreported_failures\": %" PRIu64
           ", \"collateral_failures\": %" PRIu64
           ", \"failed_without_faults\": %" PRIu64 ", \"setup_errors\": %" PRIu64
           ", \"runs_stopped\": %" PRIu64,
           t->hung, t->leaked_bytes, t->corrupt_bytes, t->unreported, t->collateral,
           t->failed_without_faults, t->setup_errors, t->runs_stopped);
    printf(", \"runs_with_clusters\": %" PRIu64, t->runs_with_clusters);
    printf(", \"runs_with_sq_depth\": %" PRIu64 ", \"posts_refused\": %" PRIu64,
           t->runs_with_sq_depth, t->posts_refused);
    printf(", \"runs_with_aux\": %" PRIu64 ", \"aux_bytes_verified\": %" PRIu64
           ", \"aux_corrupt_bytes\": %" PRIu64,
           t->runs_with_aux, t->aux_bytes_verified, t->aux_corrupt_bytes);
    printf(", \"events\": %" PRIu64 ", \"max_run_events\": %" PRIu64
           ", \"digest\": \"%016" PRIx64 "\"",
           t->events, t->max_run_events, t->digest);
    printf(", \"faults_drawn\": {");
    for (size_t k = 0; k < CLI_CAMPAIGN_KINDS; k++)
        printf("%s\"%s\": %" PRIu64, k > 0 ? ", " : "", cli_campaign_fault_kinds[k].name,
               t->kind_drawn[k]);
    printf("}, \"paths_run\": {");
    for (size_t p = 1; p < CLI_CAMPAIGN_COUNT(t->paths); p++)
        printf("%s\"%s\": %" PRIu64, p > 1 ? ", " : "", kvs_path_name((kvs_path_t)p),
               t->paths[p]);
    printf("}, \"wall_seconds\": %.6f, \"ms_per_run\": %.3f", wall_s,
           t->runs > 0 ? wall_s * 1000.0 / (double)t->runs : 0.0);
    printf(", \"violating_runs\": [");
    for (uint32_t i = 0; i < t->nlisted; i++) {
        printf("%s", i > 0 ? ", " : "");
        cli_campaign_json_listed(&t->listed[i]);
    }
    printf("], \"first_violation\": ");
    if (t->nlisted > 0)
        cli_campaign_json_listed(&t->listed[0]);
    else
        printf("null");
    printf(", \"replay\": ");
    cli_campaign_json_string(stdout, self);
    printf("}\n");
}

static void cli_campaign_print_table(const cli_campaign_totals_t *t, uint64_t seed,
                                     const char *self, double wall_s)
{
    printf("%s: %" PRIu64 " random scenarios\n\n", self, t->runs);
    printf("  %-18s %" PRIu64 ": %" PRIu64 " with faults, %" PRIu64 " without\n", "runs",
           t->runs, t->runs_with_faults, t->runs - t->runs_with_faults);
    printf("  %-18s %" PRIu64 " ok, %" PRIu64 " failed (of %" PRIu64 ")\n", "requests",
           t->requests_ok, t->requests_failed, t->requests_total);
    printf("  %-18s %" PRIu64 " in %" PRIu64 " runs: %" PRIu64 " hung, %" PRIu64
           " leaked, %" PRIu64 " corrupt, %" PRIu64 " unreported,\n"
           "  %-18s %" PRIu64 " collateral, %" PRIu64 " failed without faults, %" PRIu64
           " set-up errors, %" PRIu64 " runs stopped\n",
           "violations", t->violations, t->runs_with_violations, t->hung, t->leaked_bytes,
           t->corrupt_bytes, t->unreported, "", t->collateral, t->failed_without_faults,
           t->setup_errors, t->runs_stopped);
    printf("  %-18s %" PRIu64 " runs with 2-%d instances on a side\n", "clusters",
           t->runs_with_clusters, CLI_CAMPAIGN_MAX_INSTANCES);
    printf("  %-18s", "faults drawn");
    for (size_t k = 0; k < CLI_CAMPAIGN_KINDS; k++)
        printf("%s %s %" PRIu64, k > 0 ? "," : "", cli_campaign_fault_kinds[k].name,
               t->kind_drawn[k]);
    printf("\n  %-18s", "paths run");
    for (size_t p = 1; p < CLI_CAMPAIGN_COUNT(t->paths); p++)
        printf("%s %s %" PRIu64, p > 1 ? "," : "", kvs_path_name((kvs_path_t)p), t->paths[p]);
    printf("\n  %-18s %" PRIu64 " runs with --sq-depth 1-%d, %" PRIu64 " posts refused "
           "(posted again)", "send queues", t->runs_with_sq_depth, CLI_CAMPAIGN_MAX_SQ_DEPTH,
           t->posts_refused);
    printf("\n  %-18s %" PRIu64 " runs with --aux-bytes 1-%d, %" PRIu64 " bytes verified "
           "on the decode ranks, %" PRIu64 " corrupt", "aux payloads", t->runs_with_aux,
           CLI_CAMPAIGN_MAX_AUX_BYTES, t->aux_bytes_verified, t->aux_corrupt_bytes);
    printf("\n  %-18s %" PRIu64 " dispatched (at most %" PRIu64 " in a run), digest %016"
           PRIx64 "\n", "events", t->events, t->max_run_events, t->digest);
    printf("  %-18s %.1f s (%.1f ms per run)\n", "wall time", wall_s,
           t->runs > 0 ? wall_s * 1000.0 / (double)t->runs : 0.0);
    printf("  %-18s %" PRIu64 "\n", "seed", seed);
    if (t->nlisted == 0) {
        printf("  %-18s none\n", "first violation");
        return;
    }
    printf("  %-18s run %" PRIu64 ": %s\n", "first violation", t->listed[0].run,
           t->listed[0].why);
    printf("  %-18s %s\n", "replay",
           t->listed[0].replay != NULL ? t->listed[0].replay : "(out of memory)");
}

/* ---- the campaign ------------------------------------------------------------ */

/* One line of --campaign-log. r is all zero when the run was never set up. */
static void cli_campaign_log_run(FILE *log, uint64_t run, int rc, const sim_report_t *r,
                                 uint64_t violations, const char *why, const char *replay)
{
    fprintf(log, "{\"run\": %" PRIu64 ", \"status\": \"%s\", \"digest\": \"%016" PRIx64
            "\", \"requests_total\": %" PRIu32 ", \"requests_ok\": %" PRIu32
            ", \"requests_failed\": %" PRIu32 ", \"events\": %" PRIu64
            ", \"sim_ns\": %" PRIu64 ", \"e2e_p99_us\": %.3f"
            ", \"violations\": %" PRIu64 ", \"why\": ",
            run, kvs_status_name(rc), r->digest, r->requests_total, r->requests_ok,
            r->requests_failed, r->events, r->sim_ns, r->e2e_p99_us, violations);
    if (violations > 0)
        cli_campaign_json_string(log, why);
    else
        fputs("null", log);
    fputs(", \"replay\": ", log);
    cli_campaign_json_string(log, replay != NULL ? replay : "");
    fputs("}\n", log);
}

int cli_campaign_main(int argc, char **argv)
{
    const char *values[CLI_CF_COUNT];
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "-h") == 0) {
            cli_sim_usage(stdout);
            return 0;
        }
    }
    /* A campaign draws every scenario flag itself: name the one given. */
    for (int a = 1; a < argc; a++) {
        const char *eq = strchr(argv[a], '=');
        const size_t len = eq != NULL ? (size_t)(eq - argv[a]) : strlen(argv[a]);
        bool known = strncmp(argv[a], "--", 2) != 0;
        for (size_t f = 0; f < CLI_CF_COUNT && !known; f++)
            known = strlen(cli_campaign_flags[f].name) == len &&
                    strncmp(cli_campaign_flags[f].name, argv[a], len) == 0;
        if (!known)
            return cli_fail(CLI_CAMPAIGN_CMD, "%.*s cannot be given with --campaign: a "
                            "campaign draws every scenario flag itself; give only "
                            "--campaign N, --seed S, --json, --campaign-log FILE and "
                            "--campaign-faults KINDS",
                            (int)len, argv[a]);
    }
    int rc = cli_args_scan(CLI_CAMPAIGN_CMD, cli_campaign_flags, CLI_CF_COUNT, argc, argv, 1,
                           values);
    if (rc != 0)
        return rc;
    if (values[CLI_CF_HELP] != NULL) {
        cli_sim_usage(stdout);
        return 0;
    }
    int64_t runs = 0;
    uint64_t seed = 0;
    if ((rc = cli_parse_i64(CLI_CAMPAIGN_CMD, "--campaign", values[CLI_CF_CAMPAIGN], 1,
                            CLI_CAMPAIGN_MAX_RUNS, &runs)) != 0)
        return rc;
    if (values[CLI_CF_SEED] != NULL &&
        (rc = cli_parse_u64(CLI_CAMPAIGN_CMD, "--seed", values[CLI_CF_SEED], 0, UINT64_MAX,
                            &seed)) != 0)
        return rc;
    /* Default: every kind, under cli_campaign_conflicts. */
    cli_campaign_faults_t faults = {.kinds = (1u << CLI_CAMPAIGN_KINDS) - 1u, .conflicts = true};
    if (values[CLI_CF_FAULTS] != NULL &&
        (rc = cli_campaign_parse_faults(values[CLI_CF_FAULTS], &faults)) != 0)
        return rc;
    FILE *log = NULL;
    if (values[CLI_CF_LOG] != NULL) {
        if (values[CLI_CF_LOG][0] == '\0')
            return cli_fail(CLI_CAMPAIGN_CMD, "--campaign-log is empty: give the file to "
                                              "write one JSON line per run to");
        log = fopen(values[CLI_CF_LOG], "w");
        if (log == NULL)
            return cli_fail(CLI_CAMPAIGN_CMD, "--campaign-log: cannot write %s: check the path",
                            values[CLI_CF_LOG]);
    }

    cli_campaign_totals_t *t = calloc(1, sizeof *t);
    cli_campaign_cmd_t *cmd = malloc(sizeof *cmd);
    if (t == NULL || cmd == NULL) {
        free(t);
        free(cmd);
        if (log != NULL)
            fclose(log);
        return cli_fail(CLI_CAMPAIGN_CMD, "out of memory for the campaign's tables");
    }
    cli_campaign_progress_t progress = {.tty = isatty(STDERR_FILENO) == 1};
    clock_gettime(CLOCK_MONOTONIC, &progress.start);
    for (uint64_t i = 0; i < (uint64_t)runs; i++) {
        cli_campaign_draw_t draw;
        cli_campaign_generate(seed, i, &faults, cmd, &draw);
        sim_report_t report;
        memset(&report, 0, sizeof report);
        char err[512] = "";
        int run_rc = KVS_EINVAL;
        if (cmd->overflow) {
            snprintf(err, sizeof err, "the generated command line does not fit in %d words "
                     "of %d bytes", CLI_CAMPAIGN_MAX_ARGS, CLI_CAMPAIGN_TEXT_BYTES);
        } else {
            cli_sim_input_t in;
            if (cli_sim_parse(cmd->argc, cmd->argv, &in) != 0) {
                snprintf(err, sizeof err, "kvstage sim refused the generated command (the "
                         "line above says why)");
                progress.drawn_len = 0; /* that line ended the progress line */
            } else
                run_rc = sim_scenario_run(&in.cfg, &report, err, sizeof err);
        }
        char why[CLI_CAMPAIGN_WHY_BYTES];
        const uint64_t v = cli_campaign_judge(t, &draw, run_rc, err, &report, why);
        char *replay = cli_sim_replay(cmd->argc, cmd->argv, draw.sim_seed);
        if (log != NULL)
            cli_campaign_log_run(log, i, run_rc, &report, v, why, replay);
        if (v > 0) {
            t->violations += v;
            t->runs_with_violations++;
            if (t->nlisted < CLI_CAMPAIGN_LISTED) {
                cli_campaign_listed_t *l = &t->listed[t->nlisted++];
                l->run = i;
                snprintf(l->why, sizeof l->why, "%s", why);
                l->replay = replay;
                replay = NULL;
            }
        }
        free(replay);
        cli_campaign_progress_draw(&progress, i + 1, (uint64_t)runs, t->violations);
    }
    const double wall_s = cli_campaign_elapsed_s(&progress.start);
    cli_campaign_progress_clear(&progress);
    int log_rc = 0;
    if (log != NULL && fclose(log) != 0)
        log_rc = cli_fail(CLI_CAMPAIGN_CMD, "--campaign-log: writing %s failed (disk full?)",
                          values[CLI_CF_LOG]);

    /* This campaign's own command (without its output flags). */
    char self[256];
    snprintf(self, sizeof self, "kvstage sim --campaign %" PRId64 " --seed %" PRIu64 "%s%s",
             runs, seed, values[CLI_CF_FAULTS] != NULL ? " --campaign-faults " : "",
             values[CLI_CF_FAULTS] != NULL ? values[CLI_CF_FAULTS] : "");
    if (values[CLI_CF_JSON] != NULL)
        cli_campaign_print_json(t, seed, self, wall_s);
    else
        cli_campaign_print_table(t, seed, self, wall_s);
    fflush(stdout);
    for (uint32_t i = 0; i < t->nlisted; i++)
        fprintf(stderr, "kvstage sim: FAILED: campaign run %" PRIu64 ": %s; replay: %s\n",
                t->listed[i].run, t->listed[i].why,
                t->listed[i].replay != NULL ? t->listed[i].replay : "(out of memory)");
    if (t->runs_with_violations > t->nlisted)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu64 " more runs with violations "
                "(--campaign-log FILE lists every run)\n",
                t->runs_with_violations - t->nlisted);
    const int status = t->violations > 0 ? 1 : log_rc;
    for (uint32_t i = 0; i < t->nlisted; i++)
        free(t->listed[i].replay);
    free(t);
    free(cmd);
    return status;
}
