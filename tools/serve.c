/*
 * serve.c - `kvstage serve` (see serve.h): parses the flags into the run's
 * plan (shape, seeded prompt lengths, pool pages, addresses), starts one
 * thread per rank of its role (serve_rank.c), waits for them, and judges
 * the run: every request reported by every rank, the expected number
 * failed (0 unless --expect-failed), no corrupt byte, and on the decode
 * side every byte of every ok request checked. Prints a summary or one JSON
 * object (--json) with the rooms that failed, so a test can compare the
 * two processes' views.
 */
#include "serve.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kvstage/kvstage.h>

#include "args.h"
#include "rng.h"
#include "serve_rank.h"
#include "shape.h"

#define CLI_SERVE_CMD "serve"
#define CLI_SERVE_MAX_REQUESTS 100000
#define CLI_SERVE_MAX_RANKS 64
#define CLI_SERVE_WORKLOAD_STREAM 2 /* as the simulator's prompt lengths */

enum cli_serve_flag {
    CLI_VF_ROLE = CLI_SF_COUNT,
    CLI_VF_LISTEN,
    CLI_VF_PEER,
    CLI_VF_DEVICE,
    CLI_VF_REQUESTS,
    CLI_VF_PROMPT_TOKENS,
    CLI_VF_SEED,
    CLI_VF_RING_MIB,
    CLI_VF_MAX_INFLIGHT,
    CLI_VF_TRANSFER_WORKERS,
    CLI_VF_STALL_MS,
    CLI_VF_FAULT,
    CLI_VF_EXPECT_FAILED,
    CLI_VF_TIMEOUT_S,
    CLI_VF_LINGER_MS,
    CLI_VF_JSON,
    CLI_VF_HELP,
    CLI_VF_COUNT
};

static const cli_flag_t cli_serve_flags[CLI_VF_COUNT] = {
    CLI_SHAPE_FLAG_DEFS,
    [CLI_VF_ROLE] = {"--role", true},
    [CLI_VF_LISTEN] = {"--listen", true},
    [CLI_VF_PEER] = {"--peer", true},
    [CLI_VF_DEVICE] = {"--device", true},
    [CLI_VF_REQUESTS] = {"--requests", true},
    [CLI_VF_PROMPT_TOKENS] = {"--prompt-tokens", true},
    [CLI_VF_SEED] = {"--seed", true},
    [CLI_VF_RING_MIB] = {"--ring-mib", true},
    [CLI_VF_MAX_INFLIGHT] = {"--max-inflight", true},
    [CLI_VF_TRANSFER_WORKERS] = {"--transfer-workers", true},
    [CLI_VF_STALL_MS] = {"--stall-timeout-ms", true},
    [CLI_VF_FAULT] = {"--fault", true},
    [CLI_VF_EXPECT_FAILED] = {"--expect-failed", true},
    [CLI_VF_TIMEOUT_S] = {"--timeout-s", true},
    [CLI_VF_LINGER_MS] = {"--linger-ms", true},
    [CLI_VF_JSON] = {"--json", false},
    [CLI_VF_HELP] = {"--help", false},
};

void cli_serve_usage(FILE *out)
{
    fprintf(out,
            "usage: kvstage serve --role prefill|decode [flags]\n"
            "\n"
            "Runs every prefill rank, or every decode rank, of a layout in this process\n"
            "(one thread, host device and verbs fabric per rank) and moves a seeded\n"
            "workload through the kvstage protocol over RDMA. Start the prefill process\n"
            "first, then the decode process with the same shape and workload flags. The\n"
            "prefill writes a deterministic pattern into its KV pool; the decode checks\n"
            "every byte it receives against it.\n"
            "\n"
            "addresses:\n"
            "  --listen IP:PORT      prefill: prefill rank t of stage s listens on\n"
            "                        IP:PORT + s*P + t (required);\n"
            "                        decode: IP is the local address to use (port ignored)\n"
            "  --peer IP:PORT        decode: where the prefill process listens (required)\n"
            "  --device NAME         RDMA device as ibv_devices names it (default: automatic)\n"
            "shape (as kvstage sim; no default model: give --model or the three sizes):\n"
            "  --model NAME | --kv-heads H --head-dim D --layers L\n"
            "  --dtype T (bf16)  --page-size N (16)  --prefill-tp P (2)  --decode-tp D (1)\n"
            "  --prefill-pp Pp (1)  --decode-pp Dp (1 or Pp)  --chunk-tokens C (64)\n"
            "  (each process runs TP x PP ranks of its role; stage s holds L/PP layers,\n"
            "  the last L%%PP stages one more; give both processes the same shape: a\n"
            "  registration with another shape is refused, naming the flag that differs)\n"
            "workload (both processes must give the same):\n"
            "  --requests N          requests (8)\n"
            "  --prompt-tokens A:B   prompt length drawn uniformly from [A, B] (64:256)\n"
            "  --seed S              seed of the prompt lengths (1)\n"
            "  --max-inflight N      requests open at once per rank (4)\n"
            "  --ring-mib M          decode staging ring (16)\n"
            "  --transfer-workers N  prefill staging buffers (4)\n"
            "  --stall-timeout-ms N  a request with no progress this long fails (30000)\n"
            "checks:\n"
            "  --fault write-error:N prefill: spoil the remote key of the Nth RDMA write of\n"
            "                        prefill rank 0 (stage 0), so the peer's NIC fails it\n"
            "  --expect-failed K     exit 0 only when exactly K requests failed (0)\n"
            "  --timeout-s S         give up after S seconds (60)\n"
            "  --linger-ms N         serve the peer this long after the last result (500)\n"
            "  --json                one JSON object instead of the summary\n"
            "\n"
            "Exit status: 0 when every request ended as expected and every byte matched,\n"
            "1 otherwise, 2 for bad flags.\n");
}

typedef struct cli_serve_input {
    cli_shape_t shape;
    cli_serve_plan_t plan;
    kvs_role_t role;
    char bind_ip[64], peer_ip[64];
    int64_t requests, prompt_min, prompt_max, expect_failed;
    uint64_t seed;
    bool json;
} cli_serve_input_t;

static int cli_serve_number(const char *const *values, enum cli_serve_flag f, int64_t min,
                            int64_t max, int64_t *dst)
{
    if (values[f] == NULL)
        return 0;
    return cli_parse_i64(CLI_SERVE_CMD, cli_serve_flags[f].name, values[f], min, max, dst);
}

/* "IP:PORT" or "[IPv6]:PORT" into ip and *port; port may be omitted when
 * !need_port. */
static int cli_serve_addr(const char *flag, const char *text, bool need_port, char *ip,
                          size_t ip_len, uint16_t *port)
{
    const char *colon = strrchr(text, ':');
    const char *close = strrchr(text, ']');
    if (colon != NULL && close != NULL && colon < close)
        colon = NULL; /* "[v6]" without a port */
    if (colon == NULL && need_port)
        return cli_fail(CLI_SERVE_CMD, "%s: '%s' has no port: give IP:PORT, e.g. "
                                       "192.0.2.1:18515", flag, text);
    size_t n = colon != NULL ? (size_t)(colon - text) : strlen(text);
    const char *start = text;
    if (n >= 2 && text[0] == '[' && text[n - 1] == ']') {
        start++;
        n -= 2;
    }
    if (n == 0 || n >= ip_len)
        return cli_fail(CLI_SERVE_CMD, "%s: '%s' has no usable address: give IP:PORT",
                        flag, text);
    memcpy(ip, start, n);
    ip[n] = '\0';
    int64_t p = 0;
    if (colon != NULL) {
        int rc = cli_parse_i64(CLI_SERVE_CMD, flag, colon + 1, 1, 65535 - CLI_SERVE_MAX_RANKS,
                               &p);
        if (rc != 0)
            return rc;
    }
    *port = (uint16_t)p;
    return 0;
}

static int cli_serve_prompt(const char *text, int64_t *min, int64_t *max)
{
    const char *flag = cli_serve_flags[CLI_VF_PROMPT_TOKENS].name;
    const char *colon = strchr(text, ':');
    char lo[32];
    const size_t lo_len = colon != NULL ? (size_t)(colon - text) : strlen(text);
    if (lo_len >= sizeof lo)
        return cli_fail(CLI_SERVE_CMD, "%s: '%s' is not MIN:MAX: give two whole numbers "
                                       "of tokens like 64:256", flag, text);
    memcpy(lo, text, lo_len);
    lo[lo_len] = '\0';
    int rc = cli_parse_i64(CLI_SERVE_CMD, flag, lo, 1, CLI_SHAPE_MAX_TOKENS, min);
    if (rc == 0)
        rc = cli_parse_i64(CLI_SERVE_CMD, flag, colon != NULL ? colon + 1 : lo, 1,
                           CLI_SHAPE_MAX_TOKENS, max);
    if (rc == 0 && *min > *max)
        rc = cli_fail(CLI_SERVE_CMD, "%s: MIN %" PRId64 " is above MAX %" PRId64 ": give "
                                     "MIN:MAX with MIN <= MAX", flag, *min, *max);
    return rc;
}

static int cli_serve_fault(const char *text, uint64_t *nth)
{
    static const char prefix[] = "write-error:";
    if (strncmp(text, prefix, sizeof prefix - 1) != 0)
        return cli_fail(CLI_SERVE_CMD, "--fault: unknown fault '%s': serve knows "
                                       "write-error:N (spoil the Nth RDMA write)", text);
    int64_t n = 0;
    int rc = cli_parse_i64(CLI_SERVE_CMD, "--fault write-error", text + sizeof prefix - 1, 1,
                           INT64_C(1) << 40, &n);
    *nth = (uint64_t)n;
    return rc;
}

static int cli_serve_read(int argc, char **argv, cli_serve_input_t *in, bool *help)
{
    const char *values[CLI_VF_COUNT] = {0};
    int rc = cli_args_scan(CLI_SERVE_CMD, cli_serve_flags, CLI_VF_COUNT, argc, argv, 1, values);
    if (rc != 0)
        return rc;
    *help = values[CLI_VF_HELP] != NULL;
    if (*help)
        return 0;
    static const cli_shape_defaults_t defaults = {
        .model = NULL, .page_size = 16, .prefill_tp = 2, .decode_tp = 1, .chunk_tokens = 64};
    if ((rc = cli_shape_read(CLI_SERVE_CMD, values, &defaults, &in->shape)) != 0)
        return rc;
    if ((rc = cli_shape_layout(CLI_SERVE_CMD, &in->shape, &in->plan.lay)) != 0)
        return rc;
    const kvs_layout_t *l = &in->plan.lay;
    /* Each process bounds both sides' TP x PP, so a shape one of them
     * refuses is refused by the other too. */
    const int64_t pranks = l->prefill_tp * l->prefill_pp, dranks = l->decode_tp * l->decode_pp;
    if (pranks > CLI_SERVE_MAX_RANKS)
        return cli_fail(CLI_SERVE_CMD, "prefill TP x PP = %" PRId64 " ranks in one process is "
                                       "more than %d: lower --prefill-tp or --prefill-pp",
                        pranks, CLI_SERVE_MAX_RANKS);
    if (dranks > CLI_SERVE_MAX_RANKS)
        return cli_fail(CLI_SERVE_CMD, "decode TP x PP = %" PRId64 " ranks in one process is "
                                       "more than %d: lower --decode-tp or --decode-pp",
                        dranks, CLI_SERVE_MAX_RANKS);
    in->plan.dtype = in->shape.params.dtype;

    const char *role = values[CLI_VF_ROLE];
    if (role == NULL)
        return cli_fail(CLI_SERVE_CMD, "--role is required: prefill or decode");
    if (strcmp(role, "prefill") == 0)
        in->role = KVS_ROLE_PREFILL;
    else if (strcmp(role, "decode") == 0)
        in->role = KVS_ROLE_DECODE;
    else
        return cli_fail(CLI_SERVE_CMD, "--role: unknown role '%s': use prefill or decode", role);
    const bool decode = in->role == KVS_ROLE_DECODE;
    if (!decode && values[CLI_VF_LISTEN] == NULL)
        return cli_fail(CLI_SERVE_CMD, "--role prefill needs --listen IP:PORT (rank t of "
                                       "stage s listens on PORT + s*P + t)");
    if (decode && values[CLI_VF_PEER] == NULL)
        return cli_fail(CLI_SERVE_CMD, "--role decode needs --peer IP:PORT (where the "
                                       "prefill process listens)");
    if (!decode && values[CLI_VF_PEER] != NULL)
        return cli_fail(CLI_SERVE_CMD, "--peer is for --role decode (the decode connects "
                                       "to the prefill): drop it");
    if (values[CLI_VF_LISTEN] != NULL &&
        (rc = cli_serve_addr("--listen", values[CLI_VF_LISTEN], !decode, in->bind_ip,
                             sizeof in->bind_ip, &in->plan.listen_port)) != 0)
        return rc;
    if (decode && (rc = cli_serve_addr("--peer", values[CLI_VF_PEER], true, in->peer_ip,
                                       sizeof in->peer_ip, &in->plan.peer_port)) != 0)
        return rc;
    in->plan.bind_ip = in->bind_ip[0] != '\0' ? in->bind_ip : NULL;
    in->plan.peer_ip = in->peer_ip;
    in->plan.device = values[CLI_VF_DEVICE];

    int64_t ring_mib = 16, inflight = 4, workers = 0, stall_ms = 0, timeout_s = 60,
            linger_ms = 500;
    in->requests = 8;
    in->prompt_min = 64;
    in->prompt_max = 256;
    in->seed = 1;
    if ((rc = cli_serve_number(values, CLI_VF_REQUESTS, 1, CLI_SERVE_MAX_REQUESTS,
                               &in->requests)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_RING_MIB, 1, INT64_C(1) << 20, &ring_mib)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_MAX_INFLIGHT, 1, 4096, &inflight)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_TRANSFER_WORKERS, 1, 64, &workers)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_STALL_MS, 1, 86400000, &stall_ms)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_EXPECT_FAILED, 0, CLI_SERVE_MAX_REQUESTS,
                               &in->expect_failed)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_TIMEOUT_S, 1, 86400, &timeout_s)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_LINGER_MS, 0, 600000, &linger_ms)) != 0)
        return rc;
    if (values[CLI_VF_PROMPT_TOKENS] != NULL &&
        (rc = cli_serve_prompt(values[CLI_VF_PROMPT_TOKENS], &in->prompt_min,
                               &in->prompt_max)) != 0)
        return rc;
    if (values[CLI_VF_SEED] != NULL &&
        (rc = cli_parse_u64(CLI_SERVE_CMD, "--seed", values[CLI_VF_SEED], 0, UINT64_MAX,
                            &in->seed)) != 0)
        return rc;
    if (values[CLI_VF_FAULT] != NULL) {
        if (decode)
            return cli_fail(CLI_SERVE_CMD, "--fault write-error spoils a prefill write: give "
                                           "it to --role prefill");
        if ((rc = cli_serve_fault(values[CLI_VF_FAULT], &in->plan.fail_write)) != 0)
            return rc;
    }
    in->json = values[CLI_VF_JSON] != NULL;
    in->plan.requests = (uint32_t)in->requests;
    in->plan.ring_bytes = (uint64_t)ring_mib << 20;
    in->plan.max_inflight = (uint32_t)inflight;
    in->plan.transfer_workers = (uint32_t)workers;
    in->plan.stall_timeout_ns = (uint64_t)stall_ms * 1000000u;
    in->plan.timeout_ns = (uint64_t)timeout_s * 1000000000u;
    in->plan.linger_ns = (uint64_t)linger_ms * 1000000u;
    return 0;
}

/* The seeded workload: prompt lengths and each room's first pool page. */
static int cli_serve_workload(cli_serve_input_t *in, int64_t **tokens, int64_t **first)
{
    const int64_t ps = in->plan.lay.page_size;
    *tokens = calloc((size_t)in->requests, sizeof **tokens);
    *first = calloc((size_t)in->requests, sizeof **first);
    if (*tokens == NULL || *first == NULL)
        return cli_fail(CLI_SERVE_CMD, "out of memory for %" PRId64 " requests: lower "
                                       "--requests", in->requests);
    sim_rng_t rng;
    sim_rng_init(&rng, in->seed, CLI_SERVE_WORKLOAD_STREAM);
    int64_t pages = 0;
    for (int64_t i = 0; i < in->requests; i++) {
        (*tokens)[i] = (int64_t)sim_rng_range(&rng, (uint64_t)in->prompt_min,
                                              (uint64_t)in->prompt_max);
        (*first)[i] = pages;
        pages += ((*tokens)[i] + ps - 1) / ps;
    }
    in->plan.tokens = *tokens;
    in->plan.first_page = *first;
    in->plan.pool_pages = pages;
    /* FNV-1a over the request count and every prompt length: what the
     * two processes must agree on beyond the shape. Another --seed,
     * --requests or --prompt-tokens then fails the registration by name
     * (KVS_EFINGERPRINT) instead of failing requests. */
    uint32_t h = 2166136261u;
    for (int64_t i = -1; i < in->requests; i++) {
        const uint64_t v = (uint64_t)(i < 0 ? in->requests : (*tokens)[i]);
        for (int b = 0; b < 64; b += 8)
            h = (h ^ (uint8_t)(v >> b)) * 16777619u;
    }
    in->plan.workload_tag = h;
    return 0;
}

/* Bytes the decode ranks of a process hold together for room i: what their
 * verification checks (every decode TP rank, every layer of the model over
 * its stages, whichever way they split). */
static uint64_t cli_serve_room_bytes(const kvs_layout_t *l, int64_t tokens)
{
    return (uint64_t)(tokens * l->dst_heads * l->head_dim * l->elem_bytes * 2 * l->layers *
                      l->decode_tp);
}

static int cli_serve_report(const cli_serve_input_t *in, cli_serve_rank_t *ranks, int64_t n)
{
    const cli_serve_plan_t *pl = &in->plan;
    const bool decode = in->role == KVS_ROLE_DECODE;
    uint32_t ok = 0, failed = 0, missing = 0;
    uint64_t verified = 0, corrupt = 0, expect_verified = 0, payload = 0, spoiled = 0;
    uint64_t start = UINT64_MAX, end = 0, writes = 0, retrans = 0, dups = 0, pattern = 0;
    int fatal = KVS_OK;
    for (int64_t k = 0; k < n; k++) {
        verified += ranks[k].bytes_verified;
        corrupt += ranks[k].corrupt_bytes;
        payload += ranks[k].payload_bytes;
        spoiled += ranks[k].spoiled_writes;
        pattern = ranks[k].pattern_ns > pattern ? ranks[k].pattern_ns : pattern;
        writes += ranks[k].stats.rdma_writes;
        retrans += ranks[k].stats.msgs_retransmitted;
        dups += ranks[k].stats.msgs_duplicate;
        start = ranks[k].start_ns != 0 && ranks[k].start_ns < start ? ranks[k].start_ns : start;
        end = ranks[k].end_ns > end ? ranks[k].end_ns : end;
        if (ranks[k].fatal != KVS_OK) {
            fatal = ranks[k].fatal;
            fprintf(stderr, "kvstage serve: %s (%s)\n", ranks[k].err,
                    kvs_status_name(ranks[k].fatal));
        }
    }
    char failed_list[512] = "";
    size_t used = 0;
    for (uint32_t i = 0; i < pl->requests; i++) {
        int st = KVS_OK;
        bool all = true;
        for (int64_t k = 0; k < n; k++) {
            if (ranks[k].status[i] == 1)
                all = false;
            else if (st == KVS_OK && ranks[k].status[i] != KVS_OK)
                st = ranks[k].status[i];
        }
        if (!all) {
            missing++;
        } else if (st == KVS_OK) {
            ok++;
            expect_verified += cli_serve_room_bytes(&pl->lay, pl->tokens[i]);
        } else {
            failed++;
            int w = snprintf(failed_list + used, sizeof failed_list - used, "%s%s%u:%s",
                             in->json ? (used ? "," : "") : (used ? " " : ""),
                             in->json ? "\"" : "", i, kvs_status_name(st));
            if (w > 0 && (size_t)w < sizeof failed_list - used)
                used += (size_t)w;
            if (in->json && used + 1 < sizeof failed_list)
                failed_list[used++] = '"', failed_list[used] = '\0';
        }
    }
    const double wall_s = end > start ? (double)(end - start) / 1e9 : 0.0;
    const uint64_t moved = decode ? verified : payload;
    const double gbs = wall_s > 0 ? (double)moved / wall_s / 1e9 : 0.0;
    const bool verified_all = !decode || verified == expect_verified;
    const bool fault_went = pl->fail_write == 0 || spoiled == 1;
    const bool pass = fatal == KVS_OK && missing == 0 && failed == (uint32_t)in->expect_failed &&
                      corrupt == 0 && verified_all && fault_went;
    const char *role = decode ? "decode" : "prefill";
    if (in->json) {
        printf("{\"role\":\"%s\",\"ranks\":%" PRId64 ",\"requests\":%u,\"requests_ok\":%u,"
               "\"requests_failed\":%u,\"requests_unfinished\":%u,\"failed_rooms\":[%s],"
               "\"bytes_verified\":%" PRIu64 ",\"bytes_expected\":%" PRIu64 ","
               "\"corrupt_bytes\":%" PRIu64 ",\"payload_bytes\":%" PRIu64 ","
               "\"rdma_writes\":%" PRIu64 ",\"spoiled_writes\":%" PRIu64 ","
               "\"msgs_retransmitted\":%" PRIu64 ",\"msgs_duplicate\":%" PRIu64 ","
               "\"wall_s\":%.6f,\"pattern_s\":%.6f,\"goodput_gbytes_per_s\":%.6f,"
               "\"pass\":%s}\n",
               role, n, pl->requests, ok, failed, missing, failed_list, verified,
               decode ? expect_verified : 0, corrupt, payload, writes, spoiled, retrans, dups,
               wall_s, (double)pattern / 1e9, gbs, pass ? "true" : "false");
    } else {
        char b1[32], b2[32];
        printf("kvstage serve: %s, %" PRId64 " rank(s), %u requests: %u ok, %u failed, %u "
               "unfinished\n", role, n, pl->requests, ok, failed, missing);
        if (decode)
            printf("  bytes verified   %s of %s expected, %" PRIu64 " corrupt\n",
                   cli_format_bytes((int64_t)verified, b1, sizeof b1),
                   cli_format_bytes((int64_t)expect_verified, b2, sizeof b2), corrupt);
        else
            printf("  payload written  %s in %" PRIu64 " RDMA writes\n",
                   cli_format_bytes((int64_t)payload, b1, sizeof b1), writes);
        printf("  wall time        %.3f s (first room opened to last result; of it %.3f s "
               "%s the pattern, busiest rank)\n", wall_s, (double)pattern / 1e9,
               decode ? "checking" : "writing");
        printf("  goodput          %.4f GB/s\n", gbs);
        printf("  failed rooms     %s\n", failed > 0 ? failed_list : "-");
        if (pl->fail_write > 0)
            printf("  spoiled writes   %" PRIu64 " (--fault write-error:%" PRIu64 ")\n", spoiled,
                   pl->fail_write);
        printf("  result           %s\n", pass ? "PASS" : "FAIL");
    }
    if (!pass && fatal == KVS_OK)
        fprintf(stderr, "kvstage serve: %s: %u failed (expected %" PRId64 "), %u unfinished, "
                        "%" PRIu64 " corrupt bytes, %" PRIu64 " of %" PRIu64 " bytes verified%s\n",
                role, failed, in->expect_failed, missing, corrupt, verified,
                decode ? expect_verified : verified,
                fault_went ? "" : ", the --fault write was never posted");
    return pass ? 0 : 1;
}

int cli_serve_main(int argc, char **argv)
{
    cli_serve_input_t in;
    memset(&in, 0, sizeof in);
    bool help = false;
    int rc = cli_serve_read(argc, argv, &in, &help);
    if (rc != 0)
        return rc;
    if (help) {
        cli_serve_usage(stdout);
        return 0;
    }
    int64_t *tokens = NULL, *first = NULL;
    if ((rc = cli_serve_workload(&in, &tokens, &first)) != 0) {
        free(tokens);
        free(first);
        return rc;
    }
    const kvs_layout_t *l = &in.plan.lay;
    const bool decode = in.role == KVS_ROLE_DECODE;
    const int64_t tp = decode ? l->decode_tp : l->prefill_tp;
    const int64_t n = tp * (decode ? l->decode_pp : l->prefill_pp);
    cli_serve_rank_t *ranks = calloc((size_t)n, sizeof *ranks);
    pthread_t *threads = calloc((size_t)n, sizeof *threads);
    int *status = calloc((size_t)n * in.plan.requests, sizeof *status);
    atomic_bool stop;
    atomic_init(&stop, false);
    rc = ranks != NULL && threads != NULL && status != NULL ? 0 : 1;
    int64_t started = 0;
    for (int64_t k = 0; rc == 0 && k < n; k++) {
        /* Rank k is TP rank k % TP of stage k / TP, as in the simulator. */
        ranks[k] = (cli_serve_rank_t){.plan = &in.plan, .role = in.role, .tp = k % tp,
                                      .pp = k / tp, .stop = &stop,
                                      .status = status + (size_t)k * in.plan.requests};
        if (pthread_create(&threads[k], NULL, cli_serve_rank_run, &ranks[k]) != 0) {
            rc = 1;
            atomic_store(&stop, true); /* the ranks already started wind down */
        } else
            started++;
    }
    for (int64_t k = 0; k < started; k++)
        pthread_join(threads[k], NULL);
    if (rc != 0)
        fprintf(stderr, "kvstage serve: could not start %" PRId64 " rank threads: lower the "
                        "TP and PP sizes or raise the process limits\n", n);
    else
        rc = cli_serve_report(&in, ranks, n);
    free(status);
    free(threads);
    free(ranks);
    free(tokens);
    free(first);
    return rc;
}
