/*
 * campaign.c - `kvstage sim --campaign N --seed S` (see campaign.h): the
 * flags, the progress line, --campaign-log and the summary of
 * kvs_sim_campaign_run (sim/campaign.c, which draws, runs and judges every
 * run), and each run's replay: the `kvstage sim` command line of the
 * config it was drawn as.
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
#include <kvstage/sim.h>

#include "args.h"
#include "sim.h"

#define CLI_CAMPAIGN_CMD "sim"
#define CLI_CAMPAIGN_COUNT(a) (sizeof(a) / sizeof((a)[0]))
/* Violating runs listed on stderr and in the JSON. */
#define CLI_CAMPAIGN_LISTED 10
#define CLI_CAMPAIGN_REPLAY_BYTES 4096

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
    CLI_CF_KINDS,
    CLI_CF_HELP,
    CLI_CF_COUNT
};

static const cli_flag_t cli_campaign_flags[CLI_CF_COUNT] = {
    [CLI_CF_CAMPAIGN] = {"--campaign", true},
    [CLI_CF_SEED] = {"--seed", true},
    [CLI_CF_JSON] = {"--json", false},
    [CLI_CF_LOG] = {"--campaign-log", true},
    [CLI_CF_FAULTS] = {"--campaign-faults", true},
    [CLI_CF_KINDS] = {"--campaign-kinds", true},
    [CLI_CF_HELP] = {"--help", false},
};

/* ---- the replay command of a drawn config ----------------------------------- */

typedef struct cli_campaign_text {
    char buf[CLI_CAMPAIGN_REPLAY_BYTES];
    size_t used;
} cli_campaign_text_t;

static void cli_campaign_put(cli_campaign_text_t *t, const char *flag, const char *value)
{
    if (t->used < sizeof t->buf)
        t->used += (size_t)snprintf(t->buf + t->used, sizeof t->buf - t->used, " %s %s",
                                    flag, value);
}

static void cli_campaign_put_u64(cli_campaign_text_t *t, const char *flag, uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cli_campaign_put(t, flag, buf);
}

/* One value per instance, comma separated. */
static void cli_campaign_put_sizes(cli_campaign_text_t *t, const char *flag, uint32_t n,
                                   const int64_t *v)
{
    char buf[KVS_SIM_MAX_INSTANCES * 8] = "";
    size_t used = 0;
    for (uint32_t i = 0; i < n && used < sizeof buf; i++)
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%" PRId64, i > 0 ? "," : "",
                                 v[i]);
    cli_campaign_put(t, flag, buf);
}

/*
 * The `kvstage sim` command line that runs c (a config the campaign drew:
 * every field it sets has a flag; the rest are 0). Heap string owned by
 * the caller, NULL when out of memory. tests/cli_campaign.py replays
 * logged runs and checks they give the campaign's digest and counts.
 */
static char *cli_campaign_replay(const kvs_sim_config_t *c)
{
    cli_campaign_text_t t = {.used = 0};
    t.used = (size_t)snprintf(t.buf, sizeof t.buf, "kvstage sim");
    if (c->kv_kind == KVS_KV_MLA) {
        cli_campaign_put_u64(&t, "--mla-latent-dim", (uint64_t)c->head_dim);
    } else {
        cli_campaign_put_u64(&t, "--kv-heads", (uint64_t)c->total_heads);
        cli_campaign_put_u64(&t, "--head-dim", (uint64_t)c->head_dim);
    }
    cli_campaign_put_u64(&t, "--layers", (uint64_t)c->layers);
    cli_campaign_put(&t, "--dtype", kvs_dtype_name((kvs_dtype_t)c->dtype));
    if (c->kv_scales != KVS_KV_SCALES_NONE) {
        char scales[48];
        snprintf(scales, sizeof scales, "%s", kvs_kv_scales_name((kvs_kv_scales_t)c->kv_scales));
        if (c->kv_scales == KVS_KV_SCALES_PER_BLOCK && c->scale_block > 0)
            snprintf(scales, sizeof scales, "per-block:%" PRIu32, c->scale_block);
        cli_campaign_put(&t, "--kv-scales", scales);
    }
    cli_campaign_put_u64(&t, "--page-size", (uint64_t)c->page_size);
    if (c->decode_page_size > 0)
        cli_campaign_put_u64(&t, "--decode-page-size", (uint64_t)c->decode_page_size);
    cli_campaign_put_u64(&t, "--chunk-tokens", (uint64_t)c->chunk_tokens);
    cli_campaign_put_sizes(&t, "--prefill-tp", c->prefill_instances, c->prefill_instance_tp);
    cli_campaign_put_sizes(&t, "--decode-tp", c->decode_instances, c->decode_instance_tp);
    cli_campaign_put_sizes(&t, "--prefill-pp", c->prefill_instances, c->prefill_instance_pp);
    cli_campaign_put_sizes(&t, "--decode-pp", c->decode_instances, c->decode_instance_pp);
    if (c->prefill_cp > 1)
        cli_campaign_put_u64(&t, "--prefill-cp", (uint64_t)c->prefill_cp);
    if (c->draft_layers > 0) { /* docs/kinds/draft.md */
        cli_campaign_put_u64(&t, "--draft-layers", (uint64_t)c->draft_layers);
        if (c->draft_head_dim > 0)
            cli_campaign_put_u64(&t, "--draft-head-dim", (uint64_t)c->draft_head_dim);
    }
    if (c->full_attn_every > 1) { /* docs/kinds/hybrid.md */
        cli_campaign_put_u64(&t, "--full-attn-every", (uint64_t)c->full_attn_every);
        if (c->other_layers == KVS_LAYER_WINDOW) {
            cli_campaign_put_u64(&t, "--window", (uint64_t)c->window_tokens);
        } else {
            cli_campaign_put_u64(&t, "--state-heads", (uint64_t)c->state_heads);
            char bytes[48];
            snprintf(bytes, sizeof bytes, "%" PRId64 "+%" PRId64, c->state_conv_bytes,
                     c->state_ssm_bytes);
            cli_campaign_put(&t, "--state-bytes", bytes);
        }
    }
    if (c->router == KVS_SIM_ROUTER_LEAST_LOADED)
        cli_campaign_put(&t, "--router", "least-loaded");
    cli_campaign_put_u64(&t, "--requests", c->requests);
    char buf[64];
    snprintf(buf, sizeof buf, "%" PRId64 ":%" PRId64, c->prompt_min_tokens,
             c->prompt_max_tokens);
    cli_campaign_put(&t, "--prompt-tokens", buf);
    if (c->prefix_max_tokens > 0)
        cli_campaign_put_u64(&t, "--prefix-tokens", (uint64_t)c->prefix_max_tokens);
    /* Requests per second, exactly: whole, or with the thousandths kept. */
    const uint64_t milli = c->rate_milli_per_s;
    if (milli % 1000 == 0)
        snprintf(buf, sizeof buf, "%" PRIu64, milli / 1000);
    else {
        snprintf(buf, sizeof buf, "%" PRIu64 ".%03" PRIu64, milli / 1000, milli % 1000);
        for (size_t n = strlen(buf); buf[n - 1] == '0'; n--)
            buf[n - 1] = '\0';
    }
    cli_campaign_put(&t, "--rate", buf);
    cli_campaign_put_u64(&t, "--max-inflight", c->max_inflight);
    cli_campaign_put_u64(&t, "--transfer-workers", c->transfer_workers);
    cli_campaign_put_u64(&t, "--prefill-tokens-per-s", c->prefill_tokens_per_s);
    cli_campaign_put_u64(&t, "--ring-bytes", c->ring_bytes);
    if (c->net_link_bytes_per_s % 125000000u == 0)
        cli_campaign_put_u64(&t, "--nic-gbps", c->net_link_bytes_per_s / 125000000u);
    else
        cli_campaign_put_u64(&t, "--link-bytes-per-s", c->net_link_bytes_per_s);
    cli_campaign_put(&t, "--path", kvs_path_name((kvs_path_t)c->path));
    for (uint32_t f = 0; f < c->nfaults; f++)
        cli_campaign_put(&t, "--fault", c->faults[f]);
    cli_campaign_put_u64(&t, "--stall-timeout-ms", c->stall_timeout_ns / 1000000u);
    cli_campaign_put_u64(&t, "--max-events", c->max_events);
    if (c->net_sq_depth > 0)
        cli_campaign_put_u64(&t, "--sq-depth", c->net_sq_depth);
    if (c->max_aux_bytes > 0)
        cli_campaign_put_u64(&t, "--aux-bytes", c->max_aux_bytes);
    if (c->data_mode == KVS_SIM_DATA_PROVENANCE)
        cli_campaign_put(&t, "--data", "provenance");
    cli_campaign_put_u64(&t, "--seed", c->seed);
    if (t.used >= sizeof t.buf)
        return NULL;
    return strdup(t.buf);
}

typedef struct cli_campaign_listed {
    uint64_t run;
    char why[KVS_SIM_CAMPAIGN_WHY_BYTES];
    char *replay;              /* owned */
} cli_campaign_listed_t;

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

/* Runs of GQA: those that did not draw the MLA kind. */
static uint64_t cli_campaign_gqa_runs(const kvs_sim_campaign_report_t *t)
{
    for (uint32_t k = 0; k < t->model_kinds; k++)
        if (strcmp(kvs_sim_campaign_model_kind_name(k), "mla") == 0)
            return t->runs - t->model_kind_runs[k];
    return t->runs;
}

static void cli_campaign_print_json(const kvs_sim_campaign_report_t *t,
                                     const cli_campaign_listed_t *listed, uint32_t nlisted,
                                     uint64_t seed,
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
           t->hung_requests, t->ring_leaked_bytes, t->corrupt_bytes, t->unreported_failures, t->collateral_failures,
           t->failed_without_faults, t->setup_errors, t->runs_stopped);
    printf(", \"runs_with_clusters\": %" PRIu64 ", \"runs_large\": %" PRIu64
           ", \"runs_provenance\": %" PRIu64, t->runs_with_clusters, t->runs_large,
           t->runs_provenance);
    printf(", \"runs_with_sq_depth\": %" PRIu64 ", \"posts_refused\": %" PRIu64,
           t->runs_with_sq_depth, t->posts_refused);
    printf(", \"runs_with_aux\": %" PRIu64 ", \"aux_bytes_verified\": %" PRIu64
           ", \"aux_corrupt_bytes\": %" PRIu64,
           t->runs_with_aux, t->aux_bytes_verified, t->aux_corrupt_bytes);
    printf(", \"keys_granted\": %" PRIu64 ", \"keys_leaked\": %" PRIu64
           ", \"hostile_writes\": %" PRIu64 ", \"hostile_bytes_landed\": %" PRIu64,
           t->keys_granted, t->keys_leaked, t->hostile_writes, t->hostile_bytes_landed);
    printf(", \"events\": %" PRIu64 ", \"max_run_events\": %" PRIu64
           ", \"digest\": \"%016" PRIx64 "\"",
           t->events, t->max_run_events, t->digest);
    printf(", \"faults_drawn\": {");
    for (uint32_t k = 0; k < t->kinds; k++)
        printf("%s\"%s\": %" PRIu64, k > 0 ? ", " : "", kvs_sim_campaign_fault_name(k),
               t->kind_drawn[k]);
    printf("}, \"model_kinds\": {\"gqa\": %" PRIu64, cli_campaign_gqa_runs(t));
    for (uint32_t k = 0; k < t->model_kinds; k++)
        printf(", \"%s\": %" PRIu64, kvs_sim_campaign_model_kind_name(k),
               t->model_kind_runs[k]);
    printf("}, \"runs_model_combined\": %" PRIu64, t->runs_model_combined);
    printf(", \"paths_run\": {");
    for (size_t p = 1; p < CLI_CAMPAIGN_COUNT(t->paths); p++)
        printf("%s\"%s\": %" PRIu64, p > 1 ? ", " : "", kvs_path_name((kvs_path_t)p),
               t->paths[p]);
    printf("}, \"wall_seconds\": %.6f, \"ms_per_run\": %.3f", wall_s,
           t->runs > 0 ? wall_s * 1000.0 / (double)t->runs : 0.0);
    printf(", \"violating_runs\": [");
    for (uint32_t i = 0; i < nlisted; i++) {
        printf("%s", i > 0 ? ", " : "");
        cli_campaign_json_listed(&listed[i]);
    }
    printf("], \"first_violation\": ");
    if (nlisted > 0)
        cli_campaign_json_listed(&listed[0]);
    else
        printf("null");
    printf(", \"replay\": ");
    cli_campaign_json_string(stdout, self);
    printf("}\n");
}

static void cli_campaign_print_table(const kvs_sim_campaign_report_t *t,
                                     const cli_campaign_listed_t *listed, uint32_t nlisted,
                                     uint64_t seed,
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
           "violations", t->violations, t->runs_with_violations, t->hung_requests, t->ring_leaked_bytes,
           t->corrupt_bytes, t->unreported_failures, "", t->collateral_failures, t->failed_without_faults,
           t->setup_errors, t->runs_stopped);
    printf("  %-18s %" PRIu64 " runs with 2-%d instances on a side\n", "clusters",
           t->runs_with_clusters, (int)t->max_instances);
    printf("  %-18s %" PRIu64 " of them large (2-%d instances a side, TP up to 8)\n", "",
           t->runs_large, (int)t->max_instances);
    printf("  %-18s %" PRIu64 " runs in the provenance data mode\n", "data",
           t->runs_provenance);
    printf("  %-18s gqa %" PRIu64, "model kinds", cli_campaign_gqa_runs(t));
    for (uint32_t k = 0; k < t->model_kinds; k++)
        printf(", %s %" PRIu64, kvs_sim_campaign_model_kind_name(k), t->model_kind_runs[k]);
    printf(" (runs; %" PRIu64 " of two kinds or more)\n", t->runs_model_combined);
    printf("  %-18s", "faults drawn");
    for (uint32_t k = 0; k < t->kinds; k++)
        printf("%s %s %" PRIu64, k > 0 ? "," : "", kvs_sim_campaign_fault_name(k),
               t->kind_drawn[k]);
    printf("\n  %-18s", "paths run");
    for (size_t p = 1; p < CLI_CAMPAIGN_COUNT(t->paths); p++)
        printf("%s %s %" PRIu64, p > 1 ? "," : "", kvs_path_name((kvs_path_t)p), t->paths[p]);
    printf("\n  %-18s %" PRIu64 " runs with --sq-depth 1-%d, %" PRIu64 " posts refused "
           "(posted again)", "send queues", t->runs_with_sq_depth, (int)t->max_sq_depth,
           t->posts_refused);
    printf("\n  %-18s %" PRIu64 " runs with --aux-bytes 1-%d, %" PRIu64 " bytes verified "
           "on the decode ranks, %" PRIu64 " corrupt", "aux payloads", t->runs_with_aux,
           (int)t->max_aux_bytes, t->aux_bytes_verified, t->aux_corrupt_bytes);
    printf("\n  %-18s %" PRIu64 " granted, %" PRIu64 " leaked; %" PRIu64 " hostile writes "
           "sent astray, %" PRIu64 " bytes of them landed", "region keys", t->keys_granted,
           t->keys_leaked, t->hostile_writes, t->hostile_bytes_landed);
    printf("\n  %-18s %" PRIu64 " dispatched (at most %" PRIu64 " in a run), digest %016"
           PRIx64 "\n", "events", t->events, t->max_run_events, t->digest);
    printf("  %-18s %.1f s (%.1f ms per run)\n", "wall time", wall_s,
           t->runs > 0 ? wall_s * 1000.0 / (double)t->runs : 0.0);
    printf("  %-18s %" PRIu64 "\n", "seed", seed);
    if (nlisted == 0) {
        printf("  %-18s none\n", "first violation");
        return;
    }
    printf("  %-18s run %" PRIu64 ": %s\n", "first violation", listed[0].run,
           listed[0].why);
    printf("  %-18s %s\n", "replay",
           listed[0].replay != NULL ? listed[0].replay : "(out of memory)");
}

/* ---- the campaign ------------------------------------------------------------ */

/* One line of --campaign-log. r is all zero when the run was never set up. */
static void cli_campaign_log_run(FILE *log, uint64_t run, int rc, const kvs_sim_report_t *r,
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

/* The campaign's state between runs (the callback's ctx). */
typedef struct cli_campaign_state {
    kvs_sim_campaign_report_t report;
    cli_campaign_listed_t listed[CLI_CAMPAIGN_LISTED];
    uint32_t nlisted;
    FILE *log;
    uint64_t runs, violations;
    cli_campaign_progress_t progress;
} cli_campaign_state_t;

/* After each run: its log line, its replay when it is listed, progress. */
static void cli_campaign_on_run(void *ctx, const kvs_sim_campaign_run_t *run)
{
    cli_campaign_state_t *st = ctx;
    char *replay = st->log != NULL || (run->violations > 0 && st->nlisted < CLI_CAMPAIGN_LISTED)
                       ? cli_campaign_replay(run->config) : NULL;
    if (st->log != NULL)
        cli_campaign_log_run(st->log, run->index, run->status, run->report, run->violations,
                             run->why, replay);
    if (run->violations > 0 && st->nlisted < CLI_CAMPAIGN_LISTED) {
        cli_campaign_listed_t *l = &st->listed[st->nlisted++];
        l->run = run->index;
        snprintf(l->why, sizeof l->why, "%s", run->why);
        l->replay = replay;
        replay = NULL;
    }
    free(replay);
    /* The library's running totals are written only at the end: count
     * violations here for the progress line. */
    st->violations += run->violations;
    cli_campaign_progress_draw(&st->progress, run->index + 1, st->runs, st->violations);
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
                            "--campaign N, --seed S, --json, --campaign-log FILE, "
                            "--campaign-faults KINDS and --campaign-kinds KINDS",
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
                            KVS_SIM_CAMPAIGN_MAX_RUNS, &runs)) != 0)
        return rc;
    if (values[CLI_CF_SEED] != NULL &&
        (rc = cli_parse_u64(CLI_CAMPAIGN_CMD, "--seed", values[CLI_CF_SEED], 0, UINT64_MAX,
                            &seed)) != 0)
        return rc;
    kvs_sim_campaign_config_t cfg;
    kvs_sim_campaign_config_init(&cfg);
    cfg.runs = (uint64_t)runs;
    cfg.seed = seed;
    cfg.faults = values[CLI_CF_FAULTS];
    cfg.kinds = values[CLI_CF_KINDS];
    cli_campaign_state_t *st = calloc(1, sizeof *st);
    if (st == NULL)
        return cli_fail(CLI_CAMPAIGN_CMD, "out of memory for the campaign's tables");
    st->runs = (uint64_t)runs;
    if (values[CLI_CF_LOG] != NULL) {
        if (values[CLI_CF_LOG][0] == '\0') {
            free(st);
            return cli_fail(CLI_CAMPAIGN_CMD, "--campaign-log is empty: give the file to "
                                              "write one JSON line per run to");
        }
        st->log = fopen(values[CLI_CF_LOG], "w");
        if (st->log == NULL) {
            free(st);
            return cli_fail(CLI_CAMPAIGN_CMD, "--campaign-log: cannot write %s: check the path",
                            values[CLI_CF_LOG]);
        }
    }
    st->progress.tty = isatty(STDERR_FILENO) == 1;
    clock_gettime(CLOCK_MONOTONIC, &st->progress.start);
    kvs_sim_campaign_report_t *t = &st->report;
    t->size_bytes = (uint32_t)sizeof *t;
    kvs_error_t err = {0};
    rc = kvs_sim_campaign_run(&cfg, cli_campaign_on_run, st, t, &err);
    const double wall_s = cli_campaign_elapsed_s(&st->progress.start);
    cli_campaign_progress_clear(&st->progress);
    int log_rc = 0;
    if (st->log != NULL && fclose(st->log) != 0)
        log_rc = cli_fail(CLI_CAMPAIGN_CMD, "--campaign-log: writing %s failed (disk full?)",
                          values[CLI_CF_LOG]);
    if (rc != KVS_OK) {
        free(st);
        const bool faults = strncmp(err.msg, "faults: ", 8) == 0;
        const bool kinds = strncmp(err.msg, "kinds: ", 7) == 0;
        return cli_fail(CLI_CAMPAIGN_CMD, "%s%s",
                        faults ? "--campaign-faults: " : kinds ? "--campaign-kinds: " : "",
                        faults ? err.msg + 8 : kinds ? err.msg + 7 : err.msg);
    }

    /* This campaign's own command (without its output flags). */
    char self[512];
    snprintf(self, sizeof self, "kvstage sim --campaign %" PRId64 " --seed %" PRIu64 "%s%s%s%s",
             runs, seed, values[CLI_CF_FAULTS] != NULL ? " --campaign-faults " : "",
             values[CLI_CF_FAULTS] != NULL ? values[CLI_CF_FAULTS] : "",
             values[CLI_CF_KINDS] != NULL ? " --campaign-kinds " : "",
             values[CLI_CF_KINDS] != NULL ? values[CLI_CF_KINDS] : "");
    const cli_campaign_listed_t *listed = st->listed;
    const uint32_t nlisted = st->nlisted;
    if (values[CLI_CF_JSON] != NULL)
        cli_campaign_print_json(t, listed, nlisted, seed, self, wall_s);
    else
        cli_campaign_print_table(t, listed, nlisted, seed, self, wall_s);
    fflush(stdout);
    for (uint32_t i = 0; i < st->nlisted; i++)
        fprintf(stderr, "kvstage sim: FAILED: campaign run %" PRIu64 ": %s; replay: %s\n",
                st->listed[i].run, st->listed[i].why,
                st->listed[i].replay != NULL ? st->listed[i].replay : "(out of memory)");
    if (t->runs_with_violations > st->nlisted)
        fprintf(stderr, "kvstage sim: FAILED: %" PRIu64 " more runs with violations "
                "(--campaign-log FILE lists every run)\n",
                t->runs_with_violations - st->nlisted);
    const int status = t->violations > 0 ? 1 : log_rc;
    for (uint32_t i = 0; i < st->nlisted; i++)
        free(st->listed[i].replay);
    free(st);
    return status;
}
