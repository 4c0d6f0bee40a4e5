/*
 * sim.c - `kvstage sim`: parses the command line into a kvs_sim_config_t,
 * runs it with kvs_sim_run (<kvstage/sim.h>, the library's public API: this
 * file includes no simulator header) and prints a summary table or one
 * JSON object. The simulator decides everything that happens and the
 * library checks every field and gives the verdict; this file parses
 * flags (naming the flag to change, with the library's bounds and checks),
 * measures wall time (the only real clock here: tools/ is not simulator
 * code), draws a progress line on a terminal, and formats.
 *
 * Invariants checked on every run (the report's ok): every request
 * finished ok, no corrupt byte, no ring byte leaked, no request failed
 * unless a fault struck one of its two instances (collateral_failures). A
 * run that breaks one exits 1 and names it with the seed and the command
 * that replays it. Bad flags exit 2 with one stderr line naming the flag,
 * as a scenario that cannot be set up does.
 */
#include "sim.h"
#include "sweep.h"

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kvstage/kvstage.h>
#include <kvstage/sim.h>

#include "args.h"
#include "campaign.h"
#include "fault.h"
#include "shape.h"

#define CLI_SIM_CMD "sim"

/* Defaults of the command line that differ from the library's own (the
 * rest are kvs_sim_config_t's zero fields, which kvs_sim_run fills). Llama-3.1-70B at TP 8 -> 2 is a
 * common disaggregated deployment; page size 16 keeps page lists short. */
#define CLI_SIM_DEFAULT_MODEL "llama-3.1-70b"
#define CLI_SIM_DEFAULT_PREFILL_TP 8
#define CLI_SIM_DEFAULT_DECODE_TP 2
#define CLI_SIM_DEFAULT_PAGE_SIZE 16
#define CLI_SIM_DEFAULT_RATE_MILLI 20000 /* 20 requests/s */
#define CLI_SIM_DEFAULT_NIC_GBPS 400
/* Smaller than production (8192 tokens, 4096 MiB): simulated GPU memory is
 * real host memory, and these keep the default run at a few GB while every
 * request still spans several chunks and the ring still wraps. */
#define CLI_SIM_DEFAULT_CHUNK_TOKENS 512
#define CLI_SIM_DEFAULT_RING_MIB 512

/* Input bounds: the library's, one set (cli_bound_max), scaled to each
 * flag's unit. */
#define CLI_SIM_MAX(field) cli_bound_max(field)
#define CLI_SIM_MAX_REQUESTS CLI_SIM_MAX("requests")
#define CLI_SIM_MAX_RATE_MILLI CLI_SIM_MAX("rate_milli_per_s")
#define CLI_SIM_MAX_RING_BYTES CLI_SIM_MAX("ring_bytes")
#define CLI_SIM_MAX_RING_MIB (CLI_SIM_MAX_RING_BYTES / (INT64_C(1) << 20))
#define CLI_SIM_MAX_LINK_BYTES CLI_SIM_MAX("net_link_bytes_per_s")
#define CLI_SIM_MAX_NIC_GBPS (CLI_SIM_MAX_LINK_BYTES * 8 / 1000000000)
#define CLI_SIM_MAX_INFLIGHT CLI_SIM_MAX("max_inflight")
#define CLI_SIM_MAX_WORKERS CLI_SIM_MAX("transfer_workers")
#define CLI_SIM_MAX_PREFILL_RATE CLI_SIM_MAX("prefill_tokens_per_s")
#define CLI_SIM_MAX_EVENTS CLI_SIM_MAX("max_events")
#define CLI_SIM_MAX_SQ_DEPTH CLI_SIM_MAX("net_sq_depth")
#define CLI_SIM_MAX_STALL_MS (CLI_SIM_MAX("stall_timeout_ns") / 1000000)
#define CLI_SIM_MAX_AUX_BYTES CLI_SIM_MAX("max_aux_bytes")

#define CLI_MIB (UINT64_C(1) << 20)

/* Progress line: drawn only on a terminal and only once the run has taken
 * this long, redrawn at most every CLI_SIM_REDRAW_S. */
#define CLI_SIM_PROGRESS_AFTER_S 0.5
#define CLI_SIM_REDRAW_S 0.1
#define CLI_SIM_BAR_WIDTH 20

/* The shape flags (shape.h) come first, then sim's own. */
enum cli_sim_flag {
    CLI_XF_REQUESTS = CLI_SF_COUNT,
    CLI_XF_PROMPT_TOKENS,
    CLI_XF_RATE,
    CLI_XF_RING_MIB,
    CLI_XF_NIC_GBPS,
    CLI_XF_PATH,
    CLI_XF_SEED,
    CLI_XF_PREFIX_TOKENS,
    CLI_XF_MAX_INFLIGHT,
    CLI_XF_JSON,
    CLI_XF_TRACE,
    CLI_XF_STALL_MS,
    CLI_XF_RING_BYTES,
    CLI_XF_TRANSFER_WORKERS,
    CLI_XF_PREFILL_RATE,
    CLI_XF_MAX_EVENTS,
    CLI_XF_LINK_BYTES,
    CLI_XF_PER_OP_NS,
    CLI_XF_LATENCY_NS,
    CLI_XF_SQ_DEPTH,
    CLI_XF_ROUTER,
    CLI_XF_DATA,
    CLI_XF_AUX_BYTES,
    CLI_XF_HELP,
    CLI_XF_COUNT
};

static const cli_flag_t cli_sim_flags[CLI_XF_COUNT] = {
    CLI_SHAPE_FLAG_DEFS,
    [CLI_XF_REQUESTS] = {"--requests", true},
    [CLI_XF_PROMPT_TOKENS] = {"--prompt-tokens", true},
    [CLI_XF_RATE] = {"--rate", true},
    [CLI_XF_RING_MIB] = {"--ring-mib", true},
    [CLI_XF_NIC_GBPS] = {"--nic-gbps", true},
    [CLI_XF_PATH] = {"--path", true},
    [CLI_XF_SEED] = {"--seed", true},
    [CLI_XF_PREFIX_TOKENS] = {"--prefix-tokens", true},
    [CLI_XF_MAX_INFLIGHT] = {"--max-inflight", true},
    [CLI_XF_JSON] = {"--json", false},
    [CLI_XF_TRACE] = {"--trace", true},
    [CLI_XF_STALL_MS] = {"--stall-timeout-ms", true},
    [CLI_XF_RING_BYTES] = {"--ring-bytes", true},
    [CLI_XF_TRANSFER_WORKERS] = {"--transfer-workers", true},
    [CLI_XF_PREFILL_RATE] = {"--prefill-tokens-per-s", true},
    [CLI_XF_MAX_EVENTS] = {"--max-events", true},
    [CLI_XF_LINK_BYTES] = {"--link-bytes-per-s", true},
    [CLI_XF_PER_OP_NS] = {"--per-op-ns", true},
    [CLI_XF_LATENCY_NS] = {"--latency-ns", true},
    [CLI_XF_SQ_DEPTH] = {"--sq-depth", true},
    [CLI_XF_ROUTER] = {"--router", true},
    [CLI_XF_DATA] = {"--data", true},
    [CLI_XF_AUX_BYTES] = {"--aux-bytes", true},
    [CLI_XF_HELP] = {"--help", false},
};

/* State of the progress line on stderr. */
typedef struct cli_sim_progress {
    bool tty;
    struct timespec start;
    double last_draw_s;
    int drawn_len;             /* characters of the line on screen, 0: none */
} cli_sim_progress_t;

static double cli_sim_elapsed_s(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) +
           (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

/* The command line without flags as the library resolves it: the
 * defaults the usage states. */
static void cli_sim_defaults(kvs_sim_config_t *d)
{
    char cmd[] = CLI_SIM_CMD;
    char *argv[] = {cmd, NULL};
    cli_sim_input_t in;
    int rc = cli_sim_parse(1, argv, &in);
    if (rc == 0)
        rc = kvs_sim_config_check(&in.cfg, d, NULL);
    assert(rc == 0); /* the defaults are a valid run */
    (void)rc;
}

void cli_sim_usage(FILE *out)
{
    kvs_sim_config_t d;
    cli_sim_defaults(&d);
    fprintf(out,
            "usage: kvstage sim [--model NAME | --kv-heads H --head-dim HD --layers L]\n"
            "                   [--dtype T] [--page-size PS] [--decode-page-size DPS]\n"
            "                   [--chunk-tokens C] [--kv-scales S]\n"
            "                   [--prefill-tp P[,P...]] [--decode-tp D[,D...]]\n"
            "                   [--prefill-pp PP[,PP...]] [--decode-pp DP[,DP...]]\n"
            "                   [--prefill-cp CP] [--requests N] [--prompt-tokens MIN:MAX]\n"
            "                   [--prefix-tokens MAX] [--rate R] [--max-inflight N]\n"
            "                   [--ring-mib M | --ring-bytes B] [--nic-gbps G]\n"
            "                   [--transfer-workers W] [--prefill-tokens-per-s T]\n"
            "                   [--path PATH] [--seed S] [--json] [--trace FILE]\n"
            "                   [--fault SPEC]... [--stall-timeout-ms N] [--max-events E]\n"
            "                   [--router round-robin|least-loaded] [--aux-bytes N]\n"
            "                   [--data bytes|provenance]\n"
            "       kvstage sim --campaign N [--seed S] [--json] [--campaign-log FILE]\n"
            "                   [--campaign-faults KINDS] [--campaign-kinds KINDS]\n"
            "\n"
            "Runs a deterministic simulation of disaggregated serving: P x PP prefill\n"
            "GPUs and D x DP decode GPUs (simulated H200s, one RDMA NIC each) run the\n"
            "real kvstage core. Requests arrive as a Poisson process, are prefilled, and\n"
            "their KV cache moves to the decode ranks by the chosen path; every byte\n"
            "that arrives is verified. One seed reproduces a run bit for bit.\n"
            "Comma lists of TP sizes make a cluster of several instances per side\n"
            "(--prefill-tp 8,8,4 --decode-tp 2,2: three prefill and two decode\n"
            "instances), each with its own GPUs, KV pool and compute queue; a router\n"
            "pairs every request with one instance of each side.\n"
            "\n"
            "With no flags: %s, prefill TP %d -> decode TP %d, page size %d,\n"
            "%" PRIu32 " requests of %" PRId64 "..%" PRId64 " tokens at %d requests/s, "
            "%d Gb/s NICs.\n"
            "\n"
            "model shape (as for `kvstage plan`; explicit flags override the model):\n"
            "  --model NAME        built-in model (default %s, see below)\n"
            "  --kv-heads H        total KV heads of the model (1..%" PRId64 ")\n"
            "  --head-dim HD       head dimension (1..%" PRId64 ")\n"
            "  --mla-latent-dim N  an MLA model: one latent of N elements per token and\n"
            "                      layer (576 for DeepSeek-V3), the same on every TP rank;\n"
            "                      in place of --kv-heads and --head-dim\n"
            "  --layers L          layers of the whole model (1..%" PRId64 ")\n"
            "  --dtype T           KV dtype: bf16, fp16, fp8, fp32 (default: the model's)\n"
            "  --page-size PS      tokens per KV page (default %d here, not plan's 1, to\n"
            "                      keep the simulated page lists short)\n"
            "  --decode-page-size DPS  tokens per page of every decode instance's KV\n"
            "                      pool when it differs from PS (then PS is the\n"
            "                      prefill's); chunks cover whole pages of both sides\n"
            "                      (default: PS; docs/kinds/page-sizes.md)\n"
            "  --kv-scales S       FP8 KV with scale planes (needs --dtype fp8): none\n"
            "                      (default), per-token (one fp32 per token and head) or\n"
            "                      per-block[:N] (MXFP8: one e8m0 byte per N elements,\n"
            "                      32); moved and verified with their rows\n"
            "                      (docs/kinds/fp8-scales.md)\n"
            "  --chunk-tokens C    chunked-prefill size, a multiple of PS (and DPS) (default %d\n"
            "                      here to keep simulated memory small; 0 means %d)\n"
            "  --prefill-tp P[,P...]  prefill attention TP size (default %d); a comma\n"
            "                      list makes one prefill instance per value\n"
            "  --decode-tp D[,D...]   decode attention TP size (default %d), likewise\n"
            "  --prefill-pp PP[,PP...]  prefill pipeline stages, at most L (default 1);\n"
            "                      L need not divide: stages hold L/PP layers, the last\n"
            "                      L%%PP one more. One value for every instance or one each\n"
            "  --decode-pp DP[,DP...]   decode pipeline stages, 1 or PP (default 1); a\n"
            "                      decode instance of DP > 1 pairs only with prefill\n"
            "                      instances of PP DP, and every pair must pair\n"
            "  --prefill-cp CP     prefill context-parallel ranks of every prefill\n"
            "                      instance (default 1): each of its TP x PP, holding one\n"
            "                      token range of a request and computing it in parallel\n"
            "                      (docs/kinds/context-parallel.md)\n"
            "  --router R          round-robin (default: each side's instances in turn)\n"
            "                      or least-loaded (fewest requests in flight, ties to\n"
            "                      the lowest index); instances are numbered 0.. per side\n"
            "\n"
            "workload and hardware:\n"
            "  --requests N        requests to run (1..%d, default %" PRIu32 ")\n"
            "  --prompt-tokens MIN:MAX\n"
            "                      prompt length range, uniform (default %" PRId64 ":%" PRId64
            "; N alone\n"
            "                      means N:N)\n"
            "  --prefix-tokens MAX decode-side cached prefix drawn in 0..MAX tokens, page\n"
            "                      aligned; those tokens are not moved (default 0: none)\n"
            "  --rate R            mean arrivals per second, a decimal like 50 or 2.5\n"
            "                      (default %d); 0 means all requests arrive at once\n"
            "  --max-inflight N    requests admitted at once per instance (1..%d, default\n"
            "                      %" PRIu32 ")\n"
            "  --ring-mib M        decode staging ring per decode GPU, MiB (default %d\n"
            "                      here; production default 4096)\n"
            "  --ring-bytes B      the ring in bytes instead, for rings of a few chunks\n"
            "                      of a small shape\n"
            "  --nic-gbps G        NIC line rate, whole Gb/s (default %d)\n"
            "  --link-bytes-per-s B  link rate in bytes/s instead (a fitted model, e.g.\n"
            "                      soft-RoCE's in docs/rxe.md)\n"
            "  --per-op-ns N       NIC time per work request (default 3700)\n"
            "  --latency-ns N      one-way link latency (default 2000)\n"
            "  --sq-depth N        work requests a connection's send queue holds from\n"
            "                      post to polled completion (0..%d, default 0:\n"
            "                      unlimited); a write or send beyond them is refused\n"
            "                      (KVS_EAGAIN, as verbs does) and the core posts it\n"
            "                      again: posts_refused counts them\n"
            "  --aux-bytes N       every request carries an aux payload (the engine's\n"
            "                      own bytes: a first token, logprobs) of 0..N bytes,\n"
            "                      its length fixed by its index (none, a few bytes,\n"
            "                      N/2 or more, N), from its prefill ranks to every\n"
            "                      decode rank, checked byte for byte on each: a byte\n"
            "                      wrong, missing or extra fails the run (0..%u,\n"
            "                      default 0: none)\n"
            "  --data MODE         what simulated GPU memory holds: bytes (default: every\n"
            "                      KV byte, each checked) or provenance (where each\n"
            "                      byte came from, as runs that grow with copies, not\n"
            "                      bytes: the same events, times and digest, every KV\n"
            "                      slot checked, a small part of the memory and time)\n"
            "  --transfer-workers W  prefill staging buffers per rank (1..%d, default %d)\n"
            "  --prefill-tokens-per-s T  forward speed of each prefill instance (default\n"
            "                      %" PRIu64 ")\n"
            "  --path PATH         auto, staging, slice or direct (default auto: staging\n"
            "                      when the TP sizes differ, direct when equal)\n"
            "  --seed S            root seed of arrivals, lengths and the fabric\n"
            "                      (0..2^64-1, default 0)\n"
            "\n"
            "output:\n"
            "  --json              print one JSON object instead of the table\n"
            "  --trace FILE        write a Chrome trace-event JSON of the run to FILE\n"
            "\n"
            "faults (repeatable, seeded; with any fault the run passes on invariants\n"
            "alone, since requests may then fail):\n"
            "  --fault drop:TYPE:P | dup:TYPE:P | delay:TYPE:P:MICROS | write-error:P |\n"
            "          link-down:RANK:AT_US:FOR_US | slow-scatter:RANK:FACTOR |\n"
            "          crash:SIDE:N:AT_US | restart:SIDE:N:AT_US | hbm-full:RANK |\n"
            "          stall:MS (every rank's stall timeout, whole cluster) |\n"
            "          hostile-write:RANK:stale|outside:AT_US (a prefill rank's staged\n"
            "          write goes astray: the fabric must refuse it)\n"
            "                      TYPE register, metadata, staging_req, staging_rsp,\n"
            "                      watermark, chunk_ready, status, abort or any; P a\n"
            "                      probability in [0, 1]; RANK p<tp>[.<pp>][c<cp>][@<i>]\n"
            "                      or d<tp>[.<pp>][@<i>]: a rank of instance i (0 without\n"
            "                      @) and CP rank cp (0 without c), e.g. p3@1; SIDE\n"
            "                      prefill[@<i>] or decode[@<i>] and N the rank's index\n"
            "                      in that instance ((cp * pp + pp) * tp + tp rank).\n"
            "                      Message and write faults strike the whole cluster\n"
            "  --stall-timeout-ms N  a request with no progress this long fails\n"
            "                      (default 30000)\n"
            "  --max-events E      stop after E engine events; requests left then count\n"
            "                      as hung (default 2^40)\n"
            "\n"
            "campaigns:\n"
            "  --campaign N        run N random scenarios (shapes, TP/PP, clusters of 1-4\n"
            "                      instances per side, rings, loads, paths, send queue\n"
            "                      depths, fault mixes) drawn from\n"
            "                      --seed; print runs, violations and the `kvstage sim`\n"
            "                      command that replays the first violating run\n"
            "                      alone. A violation: a broken invariant, a request\n"
            "                      failed in a run without faults, a drawn scenario\n"
            "                      that could not be set up or a run the simulator\n"
            "                      stopped. Exit status 1 when there is any\n"
            "  --campaign-log FILE one JSON line per run: digest, counts, replay\n"
            "  --campaign-faults KINDS  the fault kinds to draw, mixed freely: all,\n"
            "                      none, or some of drop, dup, delay, write-error,\n"
            "                      link-down, slow-scatter, stall (a short stall\n"
            "                      timeout); default: all but link-down, and never\n"
            "                      a lost or late message or a short stall timeout\n"
            "                      with a write error in one run: mixes that cannot\n"
            "                      pass yet (tools/campaign.c says why)\n"
            "  --campaign-kinds KINDS  the model kinds to draw (docs/kinds/): all\n"
            "                      (default: each at its odds), none (GQA, one page\n"
            "                      size, no scales: the campaign of before), or some\n"
            "                      of mla, page-sizes, per-token, per-block (FP8\n"
            "                      scale planes), context-parallel (prefill CP), one\n"
            "                      of them at least in every run\n"
            "  --sweep KNOB=V1,V2,...  run the workload once per value of one knob:\n"
            "                      ring-mib, chunk-tokens, rate, path, decode-instances\n"
            "                      (that many decode instances of the first --decode-tp)\n"
            "                      or another flag's name; prints a table and its CSV\n"
            "  --sweep-csv FILE    write the sweep's CSV to FILE instead of stdout\n"
            "  --sweep-svg FILE    write a chart of p99 TTFT and goodput against the knob\n"
            "  --help              print this help\n"
            "\n"
            "Flags take `--flag value` or `--flag=value`, in any order. On a terminal a\n"
            "progress line is drawn on stderr while a long run goes on.\n"
            "Exit status: 0 when every request finished ok with no corrupt byte and no\n"
            "ring byte leaked, and no request failed unless a fault struck one of its\n"
            "instances (a campaign: no violation in any run); 1 when one of\n"
            "those broke (stderr says which, with the command that replays the run);\n"
            "2 for bad flags or a scenario that cannot be set up (one line naming\n"
            "what to change).\n"
            "\n"
            "built-in models (KV heads, head dim, layers, dtype):\n",
            CLI_SIM_DEFAULT_MODEL, CLI_SIM_DEFAULT_PREFILL_TP,
            CLI_SIM_DEFAULT_DECODE_TP, CLI_SIM_DEFAULT_PAGE_SIZE, d.requests,
            d.prompt_min_tokens, d.prompt_max_tokens,
            CLI_SIM_DEFAULT_RATE_MILLI / 1000, CLI_SIM_DEFAULT_NIC_GBPS,
            CLI_SIM_DEFAULT_MODEL, CLI_SHAPE_MAX_HEADS, CLI_SHAPE_MAX_HEAD_DIM,
            CLI_SHAPE_MAX_LAYERS, CLI_SIM_DEFAULT_PAGE_SIZE, CLI_SIM_DEFAULT_CHUNK_TOKENS,
            KVS_DEFAULT_CHUNK_TOKENS, CLI_SIM_DEFAULT_PREFILL_TP,
            CLI_SIM_DEFAULT_DECODE_TP, (int)CLI_SIM_MAX_REQUESTS, d.requests,
            d.prompt_min_tokens, d.prompt_max_tokens,
            CLI_SIM_DEFAULT_RATE_MILLI / 1000, (int)CLI_SIM_MAX_INFLIGHT,
            d.max_inflight, CLI_SIM_DEFAULT_RING_MIB, CLI_SIM_DEFAULT_NIC_GBPS,
            (int)CLI_SIM_MAX_SQ_DEPTH, (unsigned)CLI_SIM_MAX_AUX_BYTES, (int)CLI_SIM_MAX_WORKERS,
            d.transfer_workers,
            d.prefill_tokens_per_s);
    cli_shape_models_usage(out);
    fprintf(out,
            "\n"
            "examples:\n"
            "  kvstage sim\n"
            "  kvstage sim --model llama-3.1-8b --prefill-tp 4 --decode-tp 2 --requests 6\n"
            "  kvstage sim --path slice --seed 7 --json\n"
            "  kvstage sim --prefill-tp 8,8,4 --decode-tp 2,2 --router least-loaded\n"
            "  kvstage sim --prefill-tp 4,4,4 --decode-tp 1 --fault crash:prefill@1:2:20000\n");
}

/* Parses sim's own numeric flag `f` into *dst when given. */
static int cli_sim_number(const char *const *values, enum cli_sim_flag f,
                          int64_t min, int64_t max, int64_t *dst)
{
    if (values[f] == NULL)
        return 0;
    return cli_parse_i64(CLI_SIM_CMD, cli_sim_flags[f].name, values[f], min, max,
                         dst);
}

/* "50", "2.5", "0.125" -> thousandths of a request per second, without
 * floating point: digits, then optionally '.' and 1 to 3 digits. */
static int cli_sim_parse_rate(const char *text, uint64_t *milli)
{
    const char *flag = cli_sim_flags[CLI_XF_RATE].name;
    const char *dot = strchr(text, '.');
    char whole[32];
    size_t whole_len = dot != NULL ? (size_t)(dot - text) : strlen(text);
    size_t frac_len = dot != NULL ? strlen(dot + 1) : 0;
    bool shape_ok = whole_len >= 1 && whole_len < sizeof whole &&
                    (dot == NULL || (frac_len >= 1 && frac_len <= 3));
    uint64_t frac = 0;
    for (size_t i = 0; shape_ok && i < frac_len; i++) {
        char c = dot[1 + i];
        if (c < '0' || c > '9')
            shape_ok = false;
        else
            frac = frac * 10 + (uint64_t)(c - '0');
    }
    for (size_t i = frac_len; i < 3; i++)
        frac *= 10;
    if (!shape_ok)
        return cli_fail(CLI_SIM_CMD, "%s: '%s' is not a rate: give requests per "
                                     "second as plain decimal digits with at "
                                     "most 3 after the point, like 50 or 2.5 "
                                     "(0 = all at once)", flag, text);
    memcpy(whole, text, whole_len);
    whole[whole_len] = '\0';
    int64_t w = 0;
    int64_t max_whole = CLI_SIM_MAX_RATE_MILLI / 1000;
    int rc = cli_parse_i64(CLI_SIM_CMD, flag, whole, 0, max_whole, &w);
    if (rc != 0)
        return rc;
    uint64_t v = (uint64_t)w * 1000 + frac;
    if (v > (uint64_t)CLI_SIM_MAX_RATE_MILLI)
        return cli_fail(CLI_SIM_CMD, "%s: '%s' is out of range: give 0..%" PRId64
                                     " requests per second", flag, text, max_whole);
    *milli = v;
    return 0;
}

/* "MIN:MAX", or "N" for N:N. */
static int cli_sim_parse_prompt(const char *text, int64_t *min, int64_t *max)
{
    const char *flag = cli_sim_flags[CLI_XF_PROMPT_TOKENS].name;
    const char *colon = strchr(text, ':');
    char lo[32];
    size_t lo_len = colon != NULL ? (size_t)(colon - text) : strlen(text);
    if (lo_len >= sizeof lo)
        return cli_fail(CLI_SIM_CMD, "%s: '%s' is not MIN:MAX: give two whole "
                                     "numbers of tokens like 1024:4096", flag,
                        text);
    memcpy(lo, text, lo_len);
    lo[lo_len] = '\0';
    int rc = cli_parse_i64(CLI_SIM_CMD, flag, lo, 1, CLI_SHAPE_MAX_TOKENS, min);
    if (rc != 0)
        return rc;
    if (colon == NULL) {
        *max = *min;
        return 0;
    }
    rc = cli_parse_i64(CLI_SIM_CMD, flag, colon + 1, 1, CLI_SHAPE_MAX_TOKENS, max);
    if (rc != 0)
        return rc;
    if (*min > *max)
        return cli_fail(CLI_SIM_CMD, "%s: MIN %" PRId64 " is above MAX %" PRId64
                                     ": give MIN:MAX with MIN <= MAX", flag, *min,
                        *max);
    return 0;
}

/* One of the four parallelism flags: a value, or a comma list of one per
 * instance. */
typedef struct cli_sim_list {
    int64_t v[KVS_SIM_MAX_INSTANCES];
    uint32_t n;                /* 0: flag absent */
    char first[24];            /* v[0] as text, for the shape parser */
} cli_sim_list_t;

static int cli_sim_parse_list(const char *flag, const char *text, int64_t max,
                              cli_sim_list_t *out)
{
    memset(out, 0, sizeof *out);
    if (text == NULL)
        return 0;
    for (const char *p = text;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        char piece[24];
        if (out->n == KVS_SIM_MAX_INSTANCES)
            return cli_fail(CLI_SIM_CMD, "%s: '%s' lists more than %d instances: give at "
                                         "most %d values, one per instance", flag, text,
                            KVS_SIM_MAX_INSTANCES, KVS_SIM_MAX_INSTANCES);
        if (len == 0 || len >= sizeof piece)
            return cli_fail(CLI_SIM_CMD, "%s: '%s' is not a value or a comma list of "
                                         "values (one per instance), like 8 or 8,8,4",
                            flag, text);
        memcpy(piece, p, len);
        piece[len] = '\0';
        int rc = cli_parse_i64(CLI_SIM_CMD, flag, piece, 1, max, &out->v[out->n]);
        if (rc != 0)
            return rc;
        if (out->n++ == 0)
            memcpy(out->first, piece, len + 1);
        if (comma == NULL)
            return 0;
        p = comma + 1;
    }
}

/* The instances of one side from its TP and PP lists: as many as the
 * longer list; the other gives one value for all or one each. */
static int cli_sim_side(const char *tp_flag, const char *pp_flag, const cli_sim_list_t *tp,
                        const cli_sim_list_t *pp, int64_t tp0, int64_t pp0,
                        uint32_t *count, int64_t *tp_out, int64_t *pp_out)
{
    const uint32_t n = tp->n > pp->n ? tp->n : pp->n;
    const cli_sim_list_t *shorter = tp->n < pp->n ? tp : pp;
    if (shorter->n > 1 && shorter->n != n)
        return cli_fail(CLI_SIM_CMD, "%s gives %u values for the %u instances of %s: give "
                                     "one value for all instances, or one per instance",
                        shorter == tp ? tp_flag : pp_flag, shorter->n, n,
                        shorter == tp ? pp_flag : tp_flag);
    *count = n > 1 ? n : 0; /* one instance: the shape's, as without lists */
    for (uint32_t i = 0; i < n; i++) {
        tp_out[i] = tp->n > 1 ? tp->v[i] : tp0;
        pp_out[i] = pp->n > 1 ? pp->v[i] : pp0;
    }
    return 0;
}

/* Instances of a side as the flags list them: at least one, the shape's. */
static uint32_t cli_sim_count(const cli_sim_input_t *in, bool decode)
{
    const uint32_t n = decode ? in->cfg.decode_instances : in->cfg.prefill_instances;
    return n > 0 ? n : 1;
}

/* TP and PP sizes of instance i of a side as the flags list them. */
static void cli_sim_listed(const cli_sim_input_t *in, bool decode, uint32_t i, int64_t *tp,
                           int64_t *pp)
{
    const kvs_sim_config_t *c = &in->cfg;
    const kvs_layout_params_t *shape = &in->shape.params;
    if (decode) {
        *tp = c->decode_instances > 0 ? c->decode_instance_tp[i] : shape->decode_tp;
        *pp = c->decode_instances > 0 ? c->decode_instance_pp[i] : shape->decode_pp;
    } else {
        *tp = c->prefill_instances > 0 ? c->prefill_instance_tp[i] : shape->prefill_tp;
        *pp = c->prefill_instances > 0 ? c->prefill_instance_pp[i] : shape->prefill_pp;
    }
}

/* Reads the four parallelism flags as lists and leaves instance 0's values
 * in *shape_values for the shape parser. */
static int cli_sim_read_lists(const char *const *values, const char **shape_values,
                              cli_sim_list_t lists[4])
{
    static const enum cli_shape_flag flags[4] = {CLI_SF_PREFILL_TP, CLI_SF_PREFILL_PP,
                                                 CLI_SF_DECODE_TP, CLI_SF_DECODE_PP};
    const int64_t max[4] = {CLI_SHAPE_MAX_TP, CLI_SHAPE_MAX_PP, CLI_SHAPE_MAX_TP,
                            CLI_SHAPE_MAX_PP};
    for (int k = 0; k < 4; k++) {
        const int rc = cli_sim_parse_list(cli_sim_flags[flags[k]].name, values[flags[k]],
                                          max[k], &lists[k]);
        if (rc != 0)
            return rc;
        if (lists[k].n > 0)
            shape_values[flags[k]] = lists[k].first;
    }
    return 0;
}

/* The shape into the config's fields of it. */
static void cli_sim_set_shape(const kvs_layout_params_t *p, kvs_sim_config_t *c)
{
    c->total_heads = p->total_heads;
    c->heads_per_rank = p->heads_per_rank;
    c->heads_per_rank_tp = p->heads_per_rank_tp;
    c->head_dim = p->head_dim;
    c->dtype = (int32_t)p->dtype;
    c->layers = p->layers;
    c->page_size = p->page_size;
    c->prefill_tp = p->prefill_tp;
    c->decode_tp = p->decode_tp;
    c->prefill_pp = p->prefill_pp;
    c->decode_pp = p->decode_pp;
    c->prefill_cp = p->prefill_cp;
    c->chunk_tokens = p->chunk_tokens;
    c->kv_kind = (int32_t)p->kind;
    c->decode_page_size = p->decode_page_size;
    c->kv_scales = (int32_t)p->kv_scales;
    c->scale_block = (uint32_t)p->scale_block;
    c->full_attn_every = p->full_attn_every;
    c->other_layers = (int32_t)p->other_layers;
    c->window_tokens = p->window_tokens;
    c->state_heads = p->state_heads;
    c->state_conv_bytes = p->state_conv_bytes;
    c->state_ssm_bytes = p->state_ssm_bytes;
    c->draft_layers = p->draft_layers;
    c->draft_head_dim = p->draft_head_dim;
}

/* The cluster of the lists into in->cfg, checked by the library: every
 * pair must pair. */
static int cli_sim_topology(const cli_sim_list_t lists[4], cli_sim_input_t *in)
{
    const kvs_layout_params_t *shape = &in->shape.params;
    kvs_sim_config_t *c = &in->cfg;
    cli_sim_set_shape(shape, c);
    int rc = cli_sim_side("--prefill-tp", "--prefill-pp", &lists[0], &lists[1],
                          shape->prefill_tp, shape->prefill_pp, &c->prefill_instances,
                          c->prefill_instance_tp, c->prefill_instance_pp);
    if (rc == 0)
        rc = cli_sim_side("--decode-tp", "--decode-pp", &lists[2], &lists[3],
                          shape->decode_tp, shape->decode_pp, &c->decode_instances,
                          c->decode_instance_tp, c->decode_instance_pp);
    if (rc != 0)
        return rc;
    int32_t bad_p, bad_d;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    rc = kvs_sim_cluster_check(c, &bad_p, &bad_d, &err);
    if (rc == KVS_OK)
        return 0;
    if (bad_p < 0)
        return cli_fail(CLI_SIM_CMD, "change --prefill-tp, --prefill-pp, --decode-tp or "
                                     "--decode-pp: %s (%s)", err.msg, kvs_status_name(rc));
    /* The pair's sizes, to name the flag. */
    kvs_layout_params_t p = *shape;
    cli_sim_listed(in, false, (uint32_t)bad_p, &p.prefill_tp, &p.prefill_pp);
    cli_sim_listed(in, true, (uint32_t)bad_d, &p.decode_tp, &p.decode_pp);
    return cli_fail(CLI_SIM_CMD, "change %s: %s (%s); every prefill instance must pair "
                                 "with every decode instance, since the router may pair "
                                 "any two", cli_shape_flag_for(rc, &p), err.msg,
                    kvs_status_name(rc));
}

/* Fills *in from the scanned flag values: the shape first, then sim's own
 * flags; what is still zero takes the library's default in kvs_sim_run. */
static int cli_sim_read_values(const char *const *scanned, cli_sim_input_t *in)
{
    static const cli_shape_defaults_t defaults = {
        .model = CLI_SIM_DEFAULT_MODEL,
        .page_size = CLI_SIM_DEFAULT_PAGE_SIZE,
        .prefill_tp = CLI_SIM_DEFAULT_PREFILL_TP,
        .decode_tp = CLI_SIM_DEFAULT_DECODE_TP,
        .chunk_tokens = CLI_SIM_DEFAULT_CHUNK_TOKENS,
    };
    int rc;
    memset(in, 0, sizeof *in);
    kvs_sim_config_t *cfg = &in->cfg;
    kvs_sim_config_init(cfg);
    /* The parallelism flags take a list (one value per instance); the
     * shape is read with instance 0's. */
    const char *values[CLI_XF_COUNT];
    memcpy(values, scanned, sizeof values);
    cli_sim_list_t lists[4];
    if ((rc = cli_sim_read_lists(scanned, values, lists)) != 0)
        return rc;
    in->json = values[CLI_XF_JSON] != NULL;
    if ((rc = cli_shape_read(CLI_SIM_CMD, values, &defaults, &in->shape)) != 0)
        return rc;

    int64_t requests = 0, ring_mib = CLI_SIM_DEFAULT_RING_MIB, prefix = 0, inflight = 0;
    in->nic_gbps = CLI_SIM_DEFAULT_NIC_GBPS;
    if ((rc = cli_sim_number(values, CLI_XF_REQUESTS, 1, CLI_SIM_MAX_REQUESTS,
                             &requests)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_RING_MIB, 1, CLI_SIM_MAX_RING_MIB,
                             &ring_mib)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_NIC_GBPS, 1, CLI_SIM_MAX_NIC_GBPS,
                             &in->nic_gbps)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_PREFIX_TOKENS, 0,
                             CLI_SIM_MAX("prefix_max_tokens"), &prefix)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_MAX_INFLIGHT, 1,
                             CLI_SIM_MAX_INFLIGHT, &inflight)) != 0)
        return rc;
    if (values[CLI_XF_PROMPT_TOKENS] != NULL &&
        (rc = cli_sim_parse_prompt(values[CLI_XF_PROMPT_TOKENS],
                                   &cfg->prompt_min_tokens,
                                   &cfg->prompt_max_tokens)) != 0)
        return rc;
    cfg->rate_milli_per_s = CLI_SIM_DEFAULT_RATE_MILLI;
    if (values[CLI_XF_RATE] != NULL &&
        (rc = cli_sim_parse_rate(values[CLI_XF_RATE], &cfg->rate_milli_per_s)) != 0)
        return rc;
    int64_t stall_ms = 0, ring_bytes = 0, workers = 0, prefill_rate = 0, max_events = 0;
    if ((rc = cli_sim_number(values, CLI_XF_STALL_MS, 1, CLI_SIM_MAX_STALL_MS, &stall_ms)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_RING_BYTES, 1, CLI_SIM_MAX_RING_BYTES,
                             &ring_bytes)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_TRANSFER_WORKERS, 1, CLI_SIM_MAX_WORKERS,
                             &workers)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_PREFILL_RATE, 1, CLI_SIM_MAX_PREFILL_RATE,
                             &prefill_rate)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_MAX_EVENTS, 1, CLI_SIM_MAX_EVENTS,
                             &max_events)) != 0)
        return rc;
    if (values[CLI_XF_RING_BYTES] != NULL && values[CLI_XF_RING_MIB] != NULL)
        return cli_fail(CLI_SIM_CMD, "--ring-bytes and --ring-mib both size the ring: "
                                     "give one of them");
    cfg->stall_timeout_ns = (uint64_t)stall_ms * 1000000u;
    cfg->transfer_workers = (uint32_t)workers;
    cfg->prefill_tokens_per_s = (uint64_t)prefill_rate;
    cfg->max_events = (uint64_t)max_events;
    kvs_path_t path = KVS_PATH_AUTO;
    if (values[CLI_XF_PATH] != NULL &&
        kvs_path_parse(values[CLI_XF_PATH], &path) != KVS_OK)
        return cli_fail(CLI_SIM_CMD, "--path: unknown path '%s': use auto, "
                                     "staging, slice or direct",
                        values[CLI_XF_PATH]);
    cfg->path = (int32_t)path;
    if (values[CLI_XF_SEED] != NULL &&
        (rc = cli_parse_u64(CLI_SIM_CMD, "--seed", values[CLI_XF_SEED], 0,
                            UINT64_MAX, &cfg->seed)) != 0)
        return rc;
    if (values[CLI_XF_TRACE] != NULL) {
        if (values[CLI_XF_TRACE][0] == '\0')
            return cli_fail(CLI_SIM_CMD, "--trace is empty: give the file to "
                                         "write the trace to");
        cfg->trace_path = values[CLI_XF_TRACE];
    }

    if ((rc = cli_shape_layout(CLI_SIM_CMD, &in->shape, &in->lay)) != 0 ||
        (rc = cli_sim_topology(lists, in)) != 0)
        return rc;
    if (in->lay.full_attn_every > 1 && (path == KVS_PATH_DIRECT || path == KVS_PATH_SLICE))
        return cli_fail(CLI_SIM_CMD, "--path %s does not move hybrid layers (--full-attn-every "
                        "%" PRId64 ", %s layers): use --path staging or auto",
                        path == KVS_PATH_DIRECT ? "direct" : "slice", in->lay.full_attn_every,
                        kvs_layer_kind_name(in->lay.other_layers));
    if (in->lay.draft_layers > 0 && (path == KVS_PATH_DIRECT || path == KVS_PATH_SLICE))
        return cli_fail(CLI_SIM_CMD, "--path %s does not move a draft model's KV "
                        "(--draft-layers %" PRId64 "): use --path staging or auto",
                        path == KVS_PATH_DIRECT ? "direct" : "slice", in->lay.draft_layers);
    const uint32_t np = cli_sim_count(in, false), nd = cli_sim_count(in, true);
    for (uint32_t p = 0; path == KVS_PATH_DIRECT && p < np; p++)
        for (uint32_t d = 0; d < nd; d++) {
            int64_t ptp, dtp, pp;
            cli_sim_listed(in, false, p, &ptp, &pp);
            cli_sim_listed(in, true, d, &dtp, &pp);
            if (ptp != dtp)
                return cli_fail(CLI_SIM_CMD, "--path direct needs equal TP sizes (got "
                                             "--prefill-tp %" PRId64 ", --decode-tp %" PRId64
                                             "%s): use --path staging or slice, or equal "
                                             "TP sizes", ptp, dtp,
                                np + nd > 2 ? " in a pair of instances" : "");
        }
    cfg->router = KVS_SIM_ROUTER_ROUND_ROBIN;
    if (values[CLI_XF_ROUTER] != NULL) {
        if (strcmp(values[CLI_XF_ROUTER], "least-loaded") == 0)
            cfg->router = KVS_SIM_ROUTER_LEAST_LOADED;
        else if (strcmp(values[CLI_XF_ROUTER], "round-robin") != 0)
            return cli_fail(CLI_SIM_CMD, "--router: unknown router '%s': use round-robin "
                                         "or least-loaded", values[CLI_XF_ROUTER]);
    }

    cfg->data_mode = KVS_SIM_DATA_BYTES;
    if (values[CLI_XF_DATA] != NULL) {
        if (strcmp(values[CLI_XF_DATA], "provenance") == 0)
            cfg->data_mode = KVS_SIM_DATA_PROVENANCE;
        else if (strcmp(values[CLI_XF_DATA], "bytes") != 0)
            return cli_fail(CLI_SIM_CMD, "--data: unknown data mode '%s': use bytes or "
                                         "provenance", values[CLI_XF_DATA]);
    }

    cfg->requests = (uint32_t)requests;
    cfg->ring_bytes = ring_bytes > 0 ? (uint64_t)ring_bytes : (uint64_t)ring_mib * CLI_MIB;
    in->ring_flag_bytes = ring_bytes > 0;
    cfg->prefix_max_tokens = prefix;
    cfg->max_inflight = (uint32_t)inflight;
    cfg->net_link_bytes_per_s = (uint64_t)in->nic_gbps * 1000000000u / 8u;
    /* A fitted link model (tests/rxe/calibrate.sh) overrides the NIC. */
    int64_t link = 0, per_op = 0, latency = 0, sq_depth = 0, aux_bytes = 0;
    if ((rc = cli_sim_number(values, CLI_XF_AUX_BYTES, 0, CLI_SIM_MAX_AUX_BYTES, &aux_bytes)) != 0)
        return rc;
    cfg->max_aux_bytes = (uint32_t)aux_bytes;
    if ((rc = cli_sim_number(values, CLI_XF_LINK_BYTES, 1, CLI_SIM_MAX_LINK_BYTES, &link)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_PER_OP_NS, 1, CLI_SIM_MAX("net_per_op_ns"), &per_op)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_LATENCY_NS, 1, CLI_SIM_MAX("net_latency_ns"), &latency)) != 0 ||
        (rc = cli_sim_number(values, CLI_XF_SQ_DEPTH, 0, CLI_SIM_MAX_SQ_DEPTH, &sq_depth)) != 0)
        return rc;
    if (values[CLI_XF_LINK_BYTES] != NULL && values[CLI_XF_NIC_GBPS] != NULL)
        return cli_fail(CLI_SIM_CMD, "--link-bytes-per-s and --nic-gbps both set the link "
                                     "rate: give one of them");
    if (link > 0)
        cfg->net_link_bytes_per_s = (uint64_t)link;
    cfg->net_per_op_ns = (uint64_t)per_op;
    cfg->net_latency_ns = (uint64_t)latency;
    cfg->net_sq_depth = (uint32_t)sq_depth;
    return 0;
}

/* True when arg can be shown to a POSIX shell unquoted. */
static bool cli_sim_shell_plain(const char *arg)
{
    if (arg[0] == '\0')
        return false;
    for (const char *c = arg; *c != '\0'; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (*c >= '0' && *c <= '9') || strchr("-_./:=,+@%", *c) != NULL))
            return false;
    }
    return true;
}

/* Appends arg, shell-quoted when needed, to buf[*used..cap). buf is sized
 * by the caller for the worst case (4 bytes per byte + 3). */
static void cli_sim_shell_append(char *buf, size_t *used, const char *arg)
{
    size_t n = *used;
    buf[n++] = ' ';
    if (cli_sim_shell_plain(arg)) {
        size_t len = strlen(arg);
        memcpy(buf + n, arg, len);
        n += len;
    } else {
        buf[n++] = '\'';
        for (const char *c = arg; *c != '\0'; c++) {
            if (*c == '\'') {
                memcpy(buf + n, "'\\''", 4);
                n += 4;
            } else {
                buf[n++] = *c;
            }
        }
        buf[n++] = '\'';
    }
    buf[n] = '\0';
    *used = n;
}

char *cli_sim_replay(int argc, char **argv, uint64_t seed)
{
    size_t cap = 64;
    for (int a = 1; a < argc; a++)
        cap += 4 * strlen(argv[a]) + 4;
    char *buf = malloc(cap);
    if (buf == NULL)
        return NULL;
    size_t used = (size_t)snprintf(buf, cap, "kvstage %s", CLI_SIM_CMD);
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--seed") == 0) {
            a++; /* the scan accepted it, so its value follows */
            continue;
        }
        if (strncmp(argv[a], "--seed=", 7) == 0)
            continue;
        cli_sim_shell_append(buf, &used, argv[a]);
    }
    snprintf(buf + used, cap - used, " --seed %" PRIu64, seed);
    return buf;
}

/* Writes s as a JSON string. */
static void cli_sim_json_string(const char *s)
{
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)s; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}

/* A JSON number for a double; null when it is not finite. */
static void cli_sim_json_double(const char *key, double v, int decimals)
{
    if (isfinite(v))
        printf(", \"%s\": %.*f", key, decimals, v);
    else
        printf(", \"%s\": null", key);
}

static void cli_sim_progress_draw(void *ctx, uint32_t done, uint32_t total,
                                  uint64_t sim_ns)
{
    cli_sim_progress_t *p = ctx;
    if (!p->tty)
        return;
    double now = cli_sim_elapsed_s(&p->start);
    if (now < CLI_SIM_PROGRESS_AFTER_S)
        return;
    if (p->drawn_len > 0 && now - p->last_draw_s < CLI_SIM_REDRAW_S &&
        done != total)
        return;
    char bar[CLI_SIM_BAR_WIDTH + 1];
    uint64_t filled = total > 0 ? (uint64_t)done * CLI_SIM_BAR_WIDTH / total : 0;
    for (size_t i = 0; i < CLI_SIM_BAR_WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[CLI_SIM_BAR_WIDTH] = '\0';
    char line[128];
    int len = snprintf(line, sizeof line, "[%s] %" PRIu32 "/%" PRIu32
                       " requests, sim %" PRIu64 ".%03" PRIu64 " s",
                       bar, done, total, sim_ns / 1000000000u,
                       sim_ns / 1000000u % 1000u);
    if (len < 0)
        return;
    if (len >= (int)sizeof line)
        len = (int)sizeof line - 1;
    /* Pad over a longer previous line. */
    fprintf(stderr, "\r%s%*s", line, p->drawn_len > len ? p->drawn_len - len : 0,
            "");
    fflush(stderr);
    if (len > p->drawn_len)
        p->drawn_len = len;
    p->last_draw_s = now;
}

static void cli_sim_progress_clear(cli_sim_progress_t *p)
{
    if (p->drawn_len == 0)
        return;
    fprintf(stderr, "\r%*s\r", p->drawn_len, "");
    fflush(stderr);
    p->drawn_len = 0;
}

/* Which invariants the run broke, as counts. */
typedef struct cli_sim_verdict {
    uint32_t unfinished; /* neither ok nor failed */
    bool ok;
} cli_sim_verdict_t;

static cli_sim_verdict_t cli_sim_judge(const kvs_sim_report_t *r)
{
    cli_sim_verdict_t v;
    v.unfinished = r->hung_requests;
    /* The library's verdict (the report's ok): the CLI keeps none of its own. */
    v.ok = r->ok != 0;
    return v;
}

static double cli_sim_pct(double part, double whole)
{
    return whole > 0 ? 100.0 * part / whole : 0.0;
}

static const char *cli_sim_router_name(int32_t router)
{
    return router == KVS_SIM_ROUTER_LEAST_LOADED ? "least-loaded" : "round-robin";
}

/* "8" or "8,8,4": a side's TP (pp: PP) sizes, one per instance, of a
 * resolved config (kvs_sim_config_check). */
static const char *cli_sim_sizes(const kvs_sim_config_t *c, kvs_role_t role, bool pp, char *buf,
                                 size_t cap)
{
    const bool decode = role == KVS_ROLE_DECODE;
    const uint32_t n = decode ? c->decode_instances : c->prefill_instances;
    const int64_t *v = decode ? (pp ? c->decode_instance_pp : c->decode_instance_tp)
                              : (pp ? c->prefill_instance_pp : c->prefill_instance_tp);
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n && used < cap; i++) {
        const int w = snprintf(buf + used, cap - used, "%s%" PRId64, i > 0 ? "," : "", v[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

/* One scalar of the report as a JSON key, with json (its column of
 * kvstage/sim_report_fields.h): decimals for a double, 0 for an integer,
 * -1 for a key cli_sim_print_json writes in its own way. */
static void cli_sim_json_u32(const char *key, uint32_t v, int json)
{
    if (json >= 0)
        printf(", \"%s\": %" PRIu32, key, v);
}

static void cli_sim_json_i32(const char *key, int32_t v, int json)
{
    if (json >= 0)
        printf(", \"%s\": %" PRId32, key, v);
}

static void cli_sim_json_u64(const char *key, uint64_t v, int json)
{
    if (json >= 0)
        printf(", \"%s\": %" PRIu64, key, v);
}

static void cli_sim_json_i64(const char *key, int64_t v, int json)
{
    if (json >= 0)
        printf(", \"%s\": %" PRId64, key, v);
}

static void cli_sim_json_f64(const char *key, double v, int json)
{
    if (json >= 0)
        cli_sim_json_double(key, v, json);
}

/* Every scalar result of the report, by the one list
 * (kvstage/sim_report_fields.h), in struct order: a field added there is
 * a key here. */
static void cli_sim_print_json_fields(const kvs_sim_report_t *r)
{
#define CLI_SIM_JSON_HEAD(code, name, meaning)
#define CLI_SIM_JSON_FIELD(code, name, json, meaning) cli_sim_json_##code(#name, r->name, json);
#define CLI_SIM_JSON_ARRAY(elem, name, count, meaning)
    KVS_SIM_REPORT_FIELDS(CLI_SIM_JSON_HEAD, CLI_SIM_JSON_FIELD, CLI_SIM_JSON_ARRAY)
#undef CLI_SIM_JSON_HEAD
#undef CLI_SIM_JSON_FIELD
#undef CLI_SIM_JSON_ARRAY
}

static void cli_sim_print_json_instance_metrics(const kvs_sim_instance_metrics_t *ir)
{
    printf("\"ttft_p50_us\": %.3f, \"ttft_p90_us\": %.3f, \"ttft_p99_us\": %.3f"
           ", \"transfer_p50_us\": %.3f, \"transfer_p99_us\": %.3f"
           ", \"ring_p99_bytes\": %" PRIu64 ", \"watermark_waits\": %" PRIu64
           ", \"nic_util_mean\": %.6f, \"nic_util_max\": %.6f",
           ir->ttft_p50_us, ir->ttft_p90_us, ir->ttft_p99_us, ir->transfer_p50_us,
           ir->transfer_p99_us, ir->ring_p99_bytes, ir->watermark_waits, ir->nic_util_mean,
           ir->nic_util_max);
}

static void cli_sim_print_table_metrics(const kvs_sim_report_t *r)
{
    char a[32];
    printf("  %-18s p50 %.1f us, p90 %.1f us, p99 %.1f us (arrival -> KV complete at the "
           "decode)\n", "TTFT", r->ttft_p50_us, r->ttft_p90_us, r->ttft_p99_us);
    printf("  %-18s p50 %.1f us, p99 %.1f us (first chunk computed -> done)\n",
           "transfer", r->transfer_p50_us, r->transfer_p99_us);
    printf("  %-18s p99 %s on one decode rank (time-weighted)\n", "ring occupancy",
           cli_format_bytes((int64_t)r->ring_p99_bytes, a, sizeof a));
    printf("  %-18s mean %.1f%%, busiest rank %.1f%% of line rate x simulated time\n",
           "NIC utilisation", 100.0 * r->nic_util_mean, 100.0 * r->nic_util_max);
    for (uint32_t k = 0; k < r->instances; k++) {
        const kvs_sim_instance_t *ir = &r->instance[k];
        const kvs_sim_instance_metrics_t *m = &r->instance_metrics[k];
        const bool decode = ir->role == KVS_ROLE_DECODE;
        char label[32];
        snprintf(label, sizeof label, "%s %" PRIu32, decode ? "decode" : "prefill", ir->id);
        printf("  %-18s TTFT p50/p90/p99 %.1f/%.1f/%.1f us, transfer p50/p99 %.1f/%.1f us, "
               "NIC mean/max %.1f%%/%.1f%%, %" PRIu64 " watermark waits", label,
               m->ttft_p50_us, m->ttft_p90_us, m->ttft_p99_us, m->transfer_p50_us,
               m->transfer_p99_us, 100.0 * m->nic_util_mean, 100.0 * m->nic_util_max,
               m->watermark_waits);
        if (decode)
            printf(", ring p99 %s", cli_format_bytes((int64_t)m->ring_p99_bytes, a, sizeof a));
        printf("\n");
    }
}

/* cfg: the run's config as kvs_sim_config_check resolves it (defaults
 * filled in, every instance listed). */
static void cli_sim_print_json(const cli_sim_input_t *in, const kvs_sim_config_t *cfg,
                               const kvs_sim_report_t *r, double wall_s, const char *replay,
                               const cli_sim_verdict_t *v)
{
    const kvs_layout_t *lay = &in->lay;
    printf("{\"ok\": %s", v->ok ? "true" : "false");
    cli_sim_print_json_fields(r);
    /* The rest: the list's arrays and its fields of json -1 (ok above: the
     * CLI's verdict), and what the CLI derives or echoes. */
    printf(", \"requests_unfinished\": %" PRIu32 ", \"failures\": {", v->unfinished);
    for (uint32_t k = 0; k < r->failures; k++) {
        printf("%s\"%s\": {\"count\": %" PRIu32 ", \"first_detail\": ", k > 0 ? ", " : "",
               kvs_status_name(r->failure[k].status), r->failure[k].count);
        cli_sim_json_string(r->failure[k].first_detail);
        printf("}");
    }
    printf("}");
    printf(", \"sq_depth\": %" PRIu32 ", \"aux_bytes\": %" PRIu32, cfg->net_sq_depth,
           cfg->max_aux_bytes);
    printf(", \"init_error\": ");
    cli_sim_json_string(r->init_error);
    printf(", \"aux_error\": ");
    cli_sim_json_string(r->aux_error);
    printf(", \"sim_seconds\": %" PRIu64 ".%09" PRIu64, r->sim_ns / 1000000000u,
           r->sim_ns % 1000000000u);
    cli_sim_json_double("goodput_pct", cli_sim_pct(r->goodput_gbps,
                                                   r->line_rate_gbps), 3);
    printf(", \"digest\": \"%016" PRIx64 "\"", r->digest);
    cli_sim_json_double("wall_seconds", wall_s, 6);
    cli_sim_json_double("events_per_s", wall_s > 0 ? (double)r->events / wall_s : 0,
                        0);
    printf(", \"path\": \"%s\", \"path_requested\": \"%s\", \"seed\": %" PRIu64,
           kvs_path_name((kvs_path_t)r->path), kvs_path_name((kvs_path_t)cfg->path), cfg->seed);
    printf(", \"model\": ");
    if (in->shape.model != NULL)
        cli_sim_json_string(in->shape.model->name);
    else
        printf("null");
    printf(", \"total_heads\": %" PRId64 ", \"head_dim\": %" PRId64
           ", \"dtype\": \"%s\", \"layers\": %" PRId64 ", \"page_size\": %" PRId64
           ", \"decode_page_size\": %" PRId64 ", \"chunk_tokens\": %" PRId64,
           lay->total_heads, lay->head_dim, kvs_dtype_name(in->shape.params.dtype),
           lay->layers, lay->page_size, lay->decode_page_size, lay->chunk_tokens);
    printf(", \"kv_scales\": \"%s\", \"scale_block\": %" PRId64 ", \"scale_bytes\": %" PRId64,
           kvs_kv_scales_name(lay->kv_scales), lay->scale_block, lay->scale_bytes);
    printf(", \"full_attn_every\": %" PRId64 ", \"other_layers\": \"%s\""
           ", \"window_tokens\": %" PRId64 ", \"state_heads\": %" PRId64
           ", \"state_conv_bytes\": %" PRId64 ", \"state_ssm_bytes\": %" PRId64,
           lay->full_attn_every, kvs_layer_kind_name(lay->other_layers), lay->window_tokens,
           lay->state_heads, lay->state_conv_bytes, lay->state_ssm_bytes);
    printf(", \"draft_layers\": %" PRId64 ", \"draft_head_dim\": %" PRId64, lay->draft_layers,
           lay->draft_head_dim);
    printf(", \"prefill_tp\": %" PRId64 ", \"decode_tp\": %" PRId64
           ", \"prefill_pp\": %" PRId64 ", \"decode_pp\": %" PRId64
           ", \"prefill_cp\": %" PRId64,
           lay->prefill_tp, lay->decode_tp, lay->prefill_pp, lay->decode_pp, lay->prefill_cp);
    printf(", \"requests\": %" PRIu32 ", \"prompt_min_tokens\": %" PRId64
           ", \"prompt_max_tokens\": %" PRId64 ", \"prefix_max_tokens\": %" PRId64
           ", \"rate_milli_per_s\": %" PRIu64 ", \"max_inflight\": %" PRIu32
           ", \"ring_bytes\": %" PRIu64 ", \"nic_gbps\": %" PRId64,
           cfg->requests, cfg->prompt_min_tokens, cfg->prompt_max_tokens,
           cfg->prefix_max_tokens, cfg->rate_milli_per_s, cfg->max_inflight,
           cfg->ring_bytes, in->nic_gbps);
    printf(", \"transfer_workers\": %" PRIu32 ", \"prefill_tokens_per_s\": %" PRIu64
           ", \"stall_timeout_ns\": %" PRIu64 ", \"faults\": %" PRIu32,
           cfg->transfer_workers, cfg->prefill_tokens_per_s, cfg->stall_timeout_ns,
           cfg->nfaults);
    printf(", \"trace\": ");
    if (cfg->trace_path != NULL)
        cli_sim_json_string(cfg->trace_path);
    else
        printf("null");
    printf(", \"router\": \"%s\", \"prefill_instances\": %" PRIu32
           ", \"decode_instances\": %" PRIu32 ", \"instances\": [",
           cli_sim_router_name(cfg->router), cfg->prefill_instances, cfg->decode_instances);
    for (uint32_t k = 0; k < r->instances; k++) {
        const kvs_sim_instance_t *ir = &r->instance[k];
        printf("%s{\"id\": %" PRIu32 ", \"role\": \"%s\", \"tp\": %" PRId64 ", \"pp\": %"
               PRId64 ", \"requests_ok\": %" PRIu32 ", \"requests_failed\": %" PRIu32
               ", \"bytes\": %" PRIu64 ", \"ring_peak_bytes\": %" PRIu64,
               k > 0 ? ", " : "", ir->id, ir->role == KVS_ROLE_DECODE ? "decode" : "prefill",
               ir->tp, ir->pp, ir->requests_ok, ir->requests_failed, ir->bytes,
               ir->ring_peak_bytes);
        printf(", \"metrics\": {");
        cli_sim_print_json_instance_metrics(&r->instance_metrics[k]);
        printf("}}");
    }
    printf("]");
    printf(", \"replay\": ");
    cli_sim_json_string(replay != NULL ? replay : "");
    printf("}\n");
}

/* Why requests failed: one line per status, with its count and the first
 * request's detail. */
static void cli_sim_print_failures(FILE *out, const kvs_sim_report_t *r)
{
    for (uint32_t k = 0; k < r->failures; k++)
        fprintf(out, "  %-18s %" PRIu32 " %s: %s\n", k == 0 ? "failures" : "",
                r->failure[k].count, kvs_status_name(r->failure[k].status),
                r->failure[k].first_detail);
    if (r->failures_unlisted > 0)
        fprintf(out, "  %-18s %" PRIu32 " more with other statuses\n", "",
                r->failures_unlisted);
}

/* cfg: as for cli_sim_print_json. */
static void cli_sim_print_table(const cli_sim_input_t *in, const kvs_sim_config_t *cfg,
                                const kvs_sim_report_t *r, double wall_s, const char *replay)
{
    const kvs_layout_t *lay = &in->lay;
    char a[32], b[32], page[48];
    if (lay->decode_page_size != lay->page_size) /* prefill -> decode */
        snprintf(page, sizeof page, "%" PRId64 " -> %" PRId64, lay->page_size,
                 lay->decode_page_size);
    else
        snprintf(page, sizeof page, "%" PRId64, lay->page_size);
    char dtype[96]; /* the dtype, and its scale planes (docs/kinds/fp8-scales.md) */
    if (lay->kv_scales == KVS_KV_SCALES_PER_BLOCK)
        snprintf(dtype, sizeof dtype, "%s + e8m0 scale per %" PRId64 " elements (%" PRId64
                 " B a head)", kvs_dtype_name(in->shape.params.dtype), lay->scale_block,
                 lay->scale_bytes);
    else if (lay->kv_scales == KVS_KV_SCALES_PER_TOKEN)
        snprintf(dtype, sizeof dtype, "%s + fp32 scale per token and head",
                 kvs_dtype_name(in->shape.params.dtype));
    else
        snprintf(dtype, sizeof dtype, "%s", kvs_dtype_name(in->shape.params.dtype));
    if (lay->kind == KVS_KV_MLA)
        printf("kvstage sim: %s%s%" PRId64 " layers x MLA latent %" PRId64
               " (one per token, on every TP rank), %s, page %s, chunk %" PRId64
               " tokens\n",
               in->shape.model != NULL ? in->shape.model->name : "",
               in->shape.model != NULL ? ", " : "", lay->layers, lay->head_dim, dtype, page,
               lay->chunk_tokens);
    else
        printf("kvstage sim: %s%s%" PRId64 " layers x %" PRId64 " KV heads x head dim %"
               PRId64 ", %s, page %s, chunk %" PRId64 " tokens\n",
               in->shape.model != NULL ? in->shape.model->name : "",
               in->shape.model != NULL ? ", " : "", lay->layers, lay->total_heads,
               lay->head_dim, dtype, page, lay->chunk_tokens);
    if (lay->full_attn_every > 1 && lay->other_layers == KVS_LAYER_WINDOW)
        printf("  layers             full attention every %" PRId64 "-th layer, the others "
               "a window of %" PRId64 " tokens\n", lay->full_attn_every, lay->window_tokens);
    else if (lay->full_attn_every > 1)
        printf("  layers             full attention every %" PRId64 "-th layer, the others "
               "state layers of %" PRId64 " state heads x (%" PRId64 " + %" PRId64
               ") B a request\n", lay->full_attn_every, lay->state_heads,
               lay->state_conv_bytes, lay->state_ssm_bytes);
    if (lay->draft_layers > 0)
        printf("  draft              %" PRId64 " draft layer(s) of head dim %" PRId64
               ", after the model's in each writer's block%s\n", lay->draft_layers,
               lay->draft_head_dim,
               lay->prefill_pp > 1 ? " of the last stage (written by the last prefill stage)"
                                   : "");
    char cp[40] = ""; /* every prefill instance's CP ranks */
    if (lay->prefill_cp > 1)
        snprintf(cp, sizeof cp, " x CP %" PRId64, lay->prefill_cp);
    if (cfg->prefill_instances == 1 && cfg->decode_instances == 1) {
        printf("  prefill TP %" PRId64 " x PP %" PRId64 "%s -> decode TP %" PRId64
               " x PP %" PRId64 " on %" PRId64 " + %" PRId64 " simulated H200s, %"
               PRId64 " Gb/s NICs, path %s\n",
               lay->prefill_tp, lay->prefill_pp, cp, lay->decode_tp, lay->decode_pp,
               r->prefill_ranks, r->decode_ranks, in->nic_gbps,
               kvs_path_name((kvs_path_t)r->path));
    } else {
        char sizes[4][KVS_SIM_MAX_INSTANCES * 6];
        printf("  %" PRIu32 " prefill instance%s (TP %s x PP %s%s) -> %" PRIu32 " decode "
               "instance%s (TP %s x PP %s), %s router\n"
               "  on %" PRId64 " + %" PRId64 " simulated H200s, %" PRId64
               " Gb/s NICs, path %s\n",
               cfg->prefill_instances, cfg->prefill_instances > 1 ? "s" : "",
               cli_sim_sizes(cfg, KVS_ROLE_PREFILL, false, sizes[0], sizeof sizes[0]),
               cli_sim_sizes(cfg, KVS_ROLE_PREFILL, true, sizes[1], sizeof sizes[1]), cp,
               cfg->decode_instances, cfg->decode_instances > 1 ? "s" : "",
               cli_sim_sizes(cfg, KVS_ROLE_DECODE, false, sizes[2], sizeof sizes[2]),
               cli_sim_sizes(cfg, KVS_ROLE_DECODE, true, sizes[3], sizeof sizes[3]),
               cli_sim_router_name(cfg->router), r->prefill_ranks, r->decode_ranks,
               in->nic_gbps, kvs_path_name((kvs_path_t)r->path));
    }
    printf("  %" PRIu32 " requests of %" PRId64 "..%" PRId64 " tokens",
           cfg->requests, cfg->prompt_min_tokens, cfg->prompt_max_tokens);
    if (cfg->rate_milli_per_s == 0)
        printf(", all at once");
    else
        printf(" at %" PRIu64 ".%03" PRIu64 " requests/s",
               cfg->rate_milli_per_s / 1000, cfg->rate_milli_per_s % 1000);
    if (cfg->prefix_max_tokens > 0)
        printf(", cached prefix up to %" PRId64 " tokens", cfg->prefix_max_tokens);
    printf(", ring %s per decode GPU, max %" PRIu32 " in flight\n\n",
           cli_format_bytes((int64_t)cfg->ring_bytes, a, sizeof a),
           cfg->max_inflight);

    printf("  %-18s %" PRIu32 " ok, %" PRIu32 " failed (of %" PRIu32 ")\n",
           "requests", r->requests_ok, r->requests_failed, r->requests_total);
    printf("  %-18s %s moved (%" PRIu64 " bytes), %" PRIu64 " verified, %" PRIu64
           " corrupt\n",
           "bytes", cli_format_bytes((int64_t)r->bytes_moved, a, sizeof a),
           r->bytes_moved, r->bytes_verified, r->corrupt_bytes);
    if (cfg->max_aux_bytes > 0)
        printf("  %-18s up to %" PRIu32 " bytes a request, %" PRIu64 " verified on the decode "
               "ranks, %" PRIu64 " corrupt\n", "aux payloads", cfg->max_aux_bytes,
               r->aux_bytes_verified, r->aux_corrupt_bytes);
    printf("  %-18s peak %s on one decode rank, %" PRIu64 " bytes leaked, %"
           PRIu64 " watermark waits\n",
           "ring", cli_format_bytes((int64_t)r->ring_peak_bytes, b, sizeof b),
           r->ring_leaked_bytes, r->watermark_waits);
    printf("  %-18s %" PRIu64 " granted, %" PRIu64 " revoked, %" PRIu64 " leaked "
           "(one per writer, write and region)\n", "region keys", r->keys_granted,
           r->keys_revoked, r->keys_leaked);
    if (r->hostile_writes > 0)
        printf("  %-18s %" PRIu64 " sent astray, %" PRIu64 " of their bytes landed\n",
               "hostile writes", r->hostile_writes, r->hostile_bytes_landed);
    printf("  %-18s %" PRIu64 " violations: %" PRIu32 " hung, %" PRIu64 " leaked, %"
           PRIu64 " corrupt, %" PRIu32 " unreported failures, %" PRIu32 " collateral "
           "failures\n",
           "invariants", r->violations, r->hung_requests, r->ring_leaked_bytes,
           r->corrupt_bytes, r->unreported_failures, r->collateral_failures);
    if (r->failed_without_faults > 0)
        printf("  %-18s %" PRIu32 " requests failed in a run without faults\n", "",
               r->failed_without_faults);
    cli_sim_print_failures(stdout, r);
    for (uint32_t k = 0; k < r->instances; k++) {
        const kvs_sim_instance_t *ir = &r->instance[k];
        const bool decode = ir->role == KVS_ROLE_DECODE;
        char label[32];
        snprintf(label, sizeof label, "%s %" PRIu32, decode ? "decode" : "prefill", ir->id);
        printf("  %-18s TP %" PRId64 " x PP %" PRId64 ": %" PRIu32 " ok, %" PRIu32
               " failed, %s %s", label, ir->tp, ir->pp, ir->requests_ok, ir->requests_failed,
               cli_format_bytes((int64_t)ir->bytes, a, sizeof a),
               decode ? "received" : "written");
        if (decode)
            printf(", ring peak %s", cli_format_bytes((int64_t)ir->ring_peak_bytes, b, sizeof b));
        printf("\n");
    }
    printf("  %-18s %" PRIu64 " RDMA ops, %" PRIu64 " control messages (%" PRIu64
           " rejected, %" PRIu64 " sent again, %" PRIu64 " duplicates dropped)\n",
           "operations", r->rdma_ops, r->control_msgs, r->msgs_rejected,
           r->msgs_retransmitted, r->msgs_duplicate);
    if (cfg->net_sq_depth > 0)
        printf("  %-18s %" PRIu32 " work requests per connection, %" PRIu64
               " posts refused when full (posted again)\n",
               "send queues", cfg->net_sq_depth, r->posts_refused);
    if (r->ranks_crashed + r->ranks_restarted + r->ranks_down_at_start > 0)
        printf("  %-18s %" PRIu32 " crashed, %" PRIu32 " restarted, %" PRIu32
               " down from the start%s%s\n", "ranks", r->ranks_crashed, r->ranks_restarted,
               r->ranks_down_at_start, r->init_error[0] != '\0' ? ": " : "", r->init_error);
    printf("  %-18s %" PRIu64 ".%06" PRIu64 " s\n", "simulated time",
           r->sim_ns / 1000000000u, r->sim_ns / 1000u % 1000000u);
    printf("  %-18s %.1f Gb/s of %.1f Gb/s line rate (%.1f%%)\n", "goodput",
           r->goodput_gbps, r->line_rate_gbps,
           cli_sim_pct(r->goodput_gbps, r->line_rate_gbps));
    printf("  %-18s p50 %.1f us, p99 %.1f us (prefill done -> request done)\n",
           "transfer latency", r->latency_p50_us, r->latency_p99_us);
    printf("  %-18s p50 %.1f us, p99 %.1f us (arrival -> request done)\n",
           "e2e latency", r->e2e_p50_us, r->e2e_p99_us);
    cli_sim_print_table_metrics(r);
    printf("  %-18s %" PRIu64 " dispatched, %.0f events/s, digest %016" PRIx64 "\n",
           "events", r->events, wall_s > 0 ? (double)r->events / wall_s : 0.0,
           r->digest);
    printf("  %-18s %.3f s\n", "wall time", wall_s);
    if (cfg->trace_path != NULL)
        printf("  %-18s %s\n", "trace", cfg->trace_path);
    printf("  %-18s %" PRIu64 "\n", "seed", cfg->seed);
    printf("  %-18s %s\n", "replay", replay != NULL ? replay : "(out of memory)");
}

/* One stderr line per broken invariant, then the replay line. */
static void cli_sim_report_failure(const kvs_sim_report_t *r,
                                   const cli_sim_verdict_t *v, uint64_t seed,
                                   const char *replay)
{
    if (r->requests_failed > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu32 " of %" PRIu32
                " requests failed (seed %" PRIu64 ")\n",
                r->requests_failed, r->requests_total, seed);
    for (uint32_t k = 0; k < r->failures; k++)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu32 " %s, the first: %s\n",
                r->failure[k].count, kvs_status_name(r->failure[k].status),
                r->failure[k].first_detail);
    if (v->unfinished > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu32 " of %" PRIu32
                " requests never finished (seed %" PRIu64 ")\n",
                v->unfinished, r->requests_total, seed);
    if (r->corrupt_bytes > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu64 " corrupt bytes in "
                "requests reported ok (seed %" PRIu64 ")\n",
                r->corrupt_bytes, seed);
    if (r->aux_corrupt_bytes > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu64 " of them in aux payloads, which "
                "must reach every decode rank as the prefill gave them; first: %s (seed %"
                PRIu64 ")\n", r->aux_corrupt_bytes, r->aux_error, seed);
    if (r->ring_leaked_bytes > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu64 " ring bytes leaked "
                "after the run (seed %" PRIu64 ")\n",
                r->ring_leaked_bytes, seed);
    if (r->unreported_failures > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu32 " failures were not told to "
                "the peer, which timed out instead (seed %" PRIu64 ")\n",
                r->unreported_failures, seed);
    if (r->collateral_failures > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu32 " requests failed although no "
                "fault struck either of their instances (seed %" PRIu64 ")\n",
                r->collateral_failures, seed);
    if (r->keys_leaked > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu64 " region-scoped keys still granted "
                "after the run (seed %" PRIu64 ")\n", r->keys_leaked, seed);
    if (r->hostile_bytes_landed > 0)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu64 " bytes of hostile writes landed in "
                "a decode's memory: the fabric must refuse a write outside its writer's "
                "region-scoped key (seed %" PRIu64 ")\n", r->hostile_bytes_landed, seed);
    fprintf(stderr, "kvstage sim: replay: %s\n",
            replay != NULL ? replay : "(out of memory)");
}

int cli_sim_parse(int argc, char **argv, cli_sim_input_t *in)
{
    const char *values[CLI_XF_COUNT];
    memset(in, 0, sizeof *in);
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "-h") == 0) {
            in->help = true;
            return 0;
        }
    }
    /* --fault repeats, which the scanner refuses: take them out first. */
    const char *faults[KVS_SIM_MAX_FAULTS];
    uint32_t nfaults = 0;
    char *rest_argv[argc > 0 ? argc : 1];
    int rest_argc = 0;
    for (int a = 0; a < argc; a++) {
        const char *spec = NULL;
        if (a > 0 && strcmp(argv[a], "--fault") == 0) {
            if (a + 1 >= argc)
                return cli_fail(CLI_SIM_CMD, "--fault needs a value, e.g. --fault drop:any:0.01");
            spec = argv[++a];
        } else if (a > 0 && strncmp(argv[a], "--fault=", 8) == 0) {
            spec = argv[a] + 8;
        } else {
            rest_argv[rest_argc++] = argv[a];
            continue;
        }
        if (nfaults == KVS_SIM_MAX_FAULTS)
            return cli_fail(CLI_SIM_CMD, "--fault: at most %d faults per run",
                            KVS_SIM_MAX_FAULTS);
        faults[nfaults++] = spec;
    }
    int rc = cli_args_scan(CLI_SIM_CMD, cli_sim_flags, CLI_XF_COUNT, rest_argc, rest_argv,
                           1, values);
    if (rc != 0)
        return rc;
    if (values[CLI_XF_HELP] != NULL) {
        in->help = true;
        return 0;
    }
    rc = cli_sim_read_values(values, in);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < nfaults; i++) {
        if ((rc = cli_fault_check(CLI_SIM_CMD, faults[i], &in->cfg)) != 0)
            return rc;
        in->faults[i] = faults[i];
    }
    in->cfg.faults = in->faults;
    in->cfg.nfaults = nfaults;
    return 0;
}

/* Runs in->cfg through the library into *r (zeroed, its size set first). */
static int cli_sim_run(const cli_sim_input_t *in, kvs_sim_report_t *r, kvs_error_t *err)
{
    memset(r, 0, sizeof *r);
    r->size_bytes = (uint32_t)sizeof *r;
    memset(err, 0, sizeof *err);
    return kvs_sim_run(&in->cfg, r, err);
}

/* One run of `kvstage sim --sweep` (sweep.h): argv as `kvstage sim` takes
 * it, no output but the row. */
static int cli_sim_sweep_run(void *ctx, int argc, char **argv, cli_sweep_row_t *row)
{
    (void)ctx;
    cli_sim_input_t in;
    int rc = cli_sim_parse(argc, argv, &in);
    if (rc != 0 || in.help)
        return CLI_EXIT_USAGE;
    kvs_sim_report_t r;
    kvs_error_t err;
    rc = cli_sim_run(&in, &r, &err);
    if (rc != KVS_OK) {
        cli_fail(CLI_SIM_CMD, "%s (%s)", err.msg[0] != '\0' ? err.msg : kvs_strerror(rc),
                 kvs_status_name(rc));
        return CLI_EXIT_USAGE;
    }
    *row = (cli_sweep_row_t){
        .ttft_p50_us = r.ttft_p50_us, .ttft_p90_us = r.ttft_p90_us, .ttft_p99_us = r.ttft_p99_us,
        .transfer_p99_us = r.transfer_p99_us, .goodput_gbps = r.goodput_gbps,
        .line_rate_gbps = r.line_rate_gbps, .ring_peak_bytes = r.ring_peak_bytes,
        .ring_p99_bytes = r.ring_p99_bytes, .watermark_waits = r.watermark_waits,
        .nic_util_max = r.nic_util_max, .requests_ok = r.requests_ok,
        .requests_failed = r.requests_failed, .digest = r.digest};
    return cli_sim_judge(&r).ok ? 0 : 1;
}

int cli_sim_main(int argc, char **argv)
{
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--campaign") == 0 || strncmp(argv[a], "--campaign=", 11) == 0)
            return cli_campaign_main(argc, argv);
    }
    if (cli_sweep_wanted(argc, argv)) {
        const cli_sweep_runner_t runner = {.run = cli_sim_sweep_run,
                                           .default_decode_tp = CLI_SIM_DEFAULT_DECODE_TP};
        return cli_sweep_main(argc, argv, &runner);
    }
    cli_sim_input_t in;
    int rc = cli_sim_parse(argc, argv, &in);
    if (rc != 0)
        return rc;
    if (in.help) {
        cli_sim_usage(stdout);
        return 0;
    }

    cli_sim_progress_t progress;
    memset(&progress, 0, sizeof progress);
    progress.tty = isatty(STDERR_FILENO) == 1;
    in.cfg.progress = cli_sim_progress_draw;
    in.cfg.progress_ctx = &progress;

    kvs_sim_report_t report;
    kvs_error_t err;
    clock_gettime(CLOCK_MONOTONIC, &progress.start);
    rc = cli_sim_run(&in, &report, &err);
    double wall_s = cli_sim_elapsed_s(&progress.start);
    cli_sim_progress_clear(&progress);
    char *replay = cli_sim_replay(argc, argv, in.cfg.seed);
    if (rc == KVS_EOVERSIZED && report.events == 0) {
        /* Said before the run: no request that long could ever move. */
        const uint64_t need_mib = (report.ring_bytes_needed + CLI_MIB - 1) / CLI_MIB;
        char a[32], b[32];
        if (in.ring_flag_bytes)
            cli_fail(CLI_SIM_CMD, "OVERSIZED: a %s region does not fit a %s ring; raise "
                     "--ring-bytes to at least %" PRIu64, cli_format_bytes(
                         (int64_t)report.ring_bytes_needed, a, sizeof a),
                     cli_format_bytes((int64_t)in.cfg.ring_bytes, b, sizeof b),
                     report.ring_bytes_needed);
        else
            cli_fail(CLI_SIM_CMD, "OVERSIZED: a %" PRIu64 " MiB region does not fit a %"
                     PRIu64 " MiB ring; raise --ring-mib to at least %" PRIu64
                     " (or lower --chunk-tokens)", need_mib, in.cfg.ring_bytes / CLI_MIB,
                     need_mib);
        free(replay);
        return CLI_EXIT_USAGE;
    }
    if (rc != KVS_OK) {
        /* Set-up errors and faults that stop the run: one line, with the
         * seed, since a fault mid-run may depend on it. */
        cli_fail(CLI_SIM_CMD, "%s (%s); seed %" PRIu64 ", replay: %s",
                 err.msg[0] != '\0' ? err.msg : kvs_strerror(rc), kvs_status_name(rc),
                 in.cfg.seed, replay != NULL ? replay : "(out of memory)");
        free(replay);
        return CLI_EXIT_USAGE;
    }
    /* The config the run used, defaults filled in and instances listed. */
    kvs_sim_config_t resolved;
    rc = kvs_sim_config_check(&in.cfg, &resolved, NULL);
    assert(rc == KVS_OK); /* the run took it */
    cli_sim_verdict_t verdict = cli_sim_judge(&report);
    if (in.json)
        cli_sim_print_json(&in, &resolved, &report, wall_s, replay, &verdict);
    else
        cli_sim_print_table(&in, &resolved, &report, wall_s, replay);
    fflush(stdout);
    if (!verdict.ok)
        cli_sim_report_failure(&report, &verdict, in.cfg.seed, replay);
    free(replay);
    return verdict.ok ? 0 : 1;
}
