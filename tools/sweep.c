/*
 * sweep.c - `kvstage sim --sweep` (see sweep.h): rewrites the command line
 * once per value, runs each through the caller, and writes the table, the
 * CSV and the chart. Holds no simulator state; the rows are the runs' own
 * reports, so a row equals the single run of its replay command.
 */
#include "sweep.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "svg.h"

#define SWEEP_CMD "sim"
#define SWEEP_MAX_VALUES 32
#define SWEEP_VALUE_BYTES 64

typedef struct sweep_plan {
    char knob[SWEEP_VALUE_BYTES];
    char flag[SWEEP_VALUE_BYTES + 2];     /* the `kvstage sim` flag it sets */
    char values[SWEEP_MAX_VALUES][SWEEP_VALUE_BYTES];
    size_t nvalues;
    const char *csv_path, *svg_path;      /* NULL: CSV on stdout, no chart */
    char **base;                          /* argv without sweep flags */
    int nbase;
    const char *decode_tp;                /* the command's --decode-tp, or NULL */
} sweep_plan_t;

/* Is argv[*a] the flag name (as "--name v" or "--name=v")? Sets *value. */
static bool sweep_flag(int argc, char **argv, int *a, const char *name, const char **value,
                       bool *missing)
{
    const size_t len = strlen(name);
    if (strncmp(argv[*a], name, len) != 0)
        return false;
    if (argv[*a][len] == '=') {
        *value = argv[*a] + len + 1;
        return true;
    }
    if (argv[*a][len] != '\0')
        return false;
    if (*a + 1 >= argc) {
        *missing = true;
        return true;
    }
    *value = argv[++*a];
    return true;
}

bool cli_sweep_wanted(int argc, char **argv)
{
    for (int a = 1; a < argc; a++)
        if (strcmp(argv[a], "--sweep") == 0 || strncmp(argv[a], "--sweep=", 8) == 0)
            return true;
    return false;
}

static int sweep_parse_spec(const char *spec, sweep_plan_t *p)
{
    const char *eq = spec != NULL ? strchr(spec, '=') : NULL;
    if (eq == NULL || eq == spec || eq[1] == '\0' || (size_t)(eq - spec) >= SWEEP_VALUE_BYTES)
        return cli_fail(SWEEP_CMD, "--sweep wants KNOB=v1,v2,... (e.g. --sweep ring-mib=256,"
                        "512,1024); knobs: ring-mib, chunk-tokens, rate, path, "
                        "decode-instances or another flag's name");
    memcpy(p->knob, spec, (size_t)(eq - spec));
    p->knob[eq - spec] = '\0';
    if (strcmp(p->knob, "decode-instances") == 0)
        snprintf(p->flag, sizeof p->flag, "--decode-tp");
    else
        snprintf(p->flag, sizeof p->flag, "--%s", p->knob);
    for (const char *v = eq + 1; *v != '\0';) {
        const char *end = strchr(v, ',');
        const size_t len = end != NULL ? (size_t)(end - v) : strlen(v);
        if (len == 0 || len >= SWEEP_VALUE_BYTES)
            return cli_fail(SWEEP_CMD, "--sweep %s: an empty or overlong value", p->knob);
        if (p->nvalues == SWEEP_MAX_VALUES)
            return cli_fail(SWEEP_CMD, "--sweep %s: at most %d values", p->knob,
                            SWEEP_MAX_VALUES);
        memcpy(p->values[p->nvalues], v, len);
        p->values[p->nvalues++][len] = '\0';
        v += len + (end != NULL ? 1 : 0);
    }
    if (strcmp(p->knob, "decode-instances") == 0)
        for (size_t i = 0; i < p->nvalues; i++) {
            char *end = NULL;
            errno = 0;
            const long n = strtol(p->values[i], &end, 10);
            if (errno != 0 || *end != '\0' || n < 1 || n > 16)
                return cli_fail(SWEEP_CMD, "--sweep decode-instances: %s is not 1..16",
                                p->values[i]);
        }
    return 0;
}

/* Splits argv into the sweep's flags and the base command (without the
 * knob's own flag, which each run sets). */
static int sweep_parse(int argc, char **argv, sweep_plan_t *p)
{
    const char *spec = NULL;
    p->base = calloc((size_t)argc + 1, sizeof *p->base);
    if (p->base == NULL)
        return cli_fail(SWEEP_CMD, "out of memory");
    p->base[p->nbase++] = argv[0];
    for (int a = 1; a < argc; a++) {
        const char *v = NULL;
        bool missing = false;
        if (sweep_flag(argc, argv, &a, "--sweep", &v, &missing))
            spec = v;
        else if (sweep_flag(argc, argv, &a, "--sweep-csv", &v, &missing))
            p->csv_path = v;
        else if (sweep_flag(argc, argv, &a, "--sweep-svg", &v, &missing))
            p->svg_path = v;
        else if (strcmp(argv[a], "--json") == 0 || strncmp(argv[a], "--trace", 7) == 0)
            return cli_fail(SWEEP_CMD, "%s does not go with --sweep (a sweep prints a table "
                            "and CSV); run one value without --sweep for it", argv[a]);
        else {
            p->base[p->nbase++] = argv[a];
            continue;
        }
        if (missing)
            return cli_fail(SWEEP_CMD, "%s needs a value", argv[a]);
    }
    int rc = sweep_parse_spec(spec, p);
    if (rc != 0)
        return rc;
    /* Drop the knob's flag (and --ring-bytes for ring-mib) from the base. */
    int kept = 1;
    for (int a = 1; a < p->nbase; a++) {
        const char *v = NULL;
        bool missing = false;
        int b = a;
        if (sweep_flag(p->nbase, p->base, &b, p->flag, &v, &missing) ||
            (strcmp(p->knob, "ring-mib") == 0 &&
             sweep_flag(p->nbase, p->base, &b, "--ring-bytes", &v, &missing))) {
            if (strcmp(p->flag, "--decode-tp") == 0)
                p->decode_tp = v;
            a = b;
            continue;
        }
        p->base[kept++] = p->base[a];
    }
    p->nbase = kept;
    return 0;
}

/* The value the knob's flag takes for values[i]. */
static void sweep_flag_value(const sweep_plan_t *p, size_t i, int64_t default_decode_tp,
                             char *buf, size_t len)
{
    if (strcmp(p->knob, "decode-instances") != 0) {
        snprintf(buf, len, "%s", p->values[i]);
        return;
    }
    char tp[32];
    if (p->decode_tp != NULL)
        snprintf(tp, sizeof tp, "%.*s", (int)strcspn(p->decode_tp, ","), p->decode_tp);
    else
        snprintf(tp, sizeof tp, "%" PRId64, default_decode_tp);
    const long n = strtol(p->values[i], NULL, 10);
    size_t used = 0;
    buf[0] = '\0';
    for (long k = 0; k < n && used < len; k++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", k > 0 ? "," : "", tp);
}

static const char *sweep_verdict(int status)
{
    return status == 0 ? "ok" : status == 1 ? "violation" : "refused";
}

static void sweep_csv(FILE *out, const sweep_plan_t *p, const cli_sweep_row_t *rows,
                      const int *status)
{
    fprintf(out, "knob,value,ttft_p50_us,ttft_p90_us,ttft_p99_us,transfer_p99_us,"
            "goodput_gbps,line_rate_gbps,goodput_pct,ring_peak_bytes,ring_p99_bytes,"
            "watermark_waits,nic_util_max,requests_ok,requests_failed,verdict,digest\n");
    for (size_t i = 0; i < p->nvalues; i++) {
        const cli_sweep_row_t *r = &rows[i];
        fprintf(out, "%s,%s,", p->knob, p->values[i]);
        if (status[i] == 2) {
            fprintf(out, ",,,,,,,,,,,,,refused,\n");
            continue;
        }
        fprintf(out, "%.3f,%.3f,%.3f,%.3f,%.6f,%.6f,%.3f,%" PRIu64 ",%" PRIu64 ",%" PRIu64
                ",%.6f,%" PRIu32 ",%" PRIu32 ",%s,%016" PRIx64 "\n",
                r->ttft_p50_us, r->ttft_p90_us, r->ttft_p99_us, r->transfer_p99_us,
                r->goodput_gbps, r->line_rate_gbps,
                r->line_rate_gbps > 0 ? 100.0 * r->goodput_gbps / r->line_rate_gbps : 0.0,
                r->ring_peak_bytes, r->ring_p99_bytes, r->watermark_waits, r->nic_util_max,
                r->requests_ok, r->requests_failed, sweep_verdict(status[i]), r->digest);
    }
}

static void sweep_table(const sweep_plan_t *p, const cli_sweep_row_t *rows, const int *status)
{
    printf("kvstage sim --sweep %s: %zu runs\n", p->knob, p->nvalues);
    printf("  %-16s %12s %12s %13s %8s %12s %12s %10s\n", p->knob, "TTFT p50 ms",
           "TTFT p99 ms", "goodput Gb/s", "of line", "ring peak", "ok/failed", "verdict");
    for (size_t i = 0; i < p->nvalues; i++) {
        const cli_sweep_row_t *r = &rows[i];
        if (status[i] == 2) {
            printf("  %-16s %12s %12s %13s %8s %12s %12s %10s\n", p->values[i], "-", "-", "-",
                   "-", "-", "-", "refused");
            continue;
        }
        char peak[32], okf[32], pct[16];
        cli_format_bytes((int64_t)r->ring_peak_bytes, peak, sizeof peak);
        snprintf(okf, sizeof okf, "%" PRIu32 "/%" PRIu32, r->requests_ok, r->requests_failed);
        snprintf(pct, sizeof pct, "%.1f%%",
                 r->line_rate_gbps > 0 ? 100.0 * r->goodput_gbps / r->line_rate_gbps : 0.0);
        printf("  %-16s %12.2f %12.2f %13.1f %8s %12s %12s %10s\n", p->values[i],
               r->ttft_p50_us / 1e3, r->ttft_p99_us / 1e3, r->goodput_gbps, pct, peak, okf,
               sweep_verdict(status[i]));
    }
}

static int sweep_write_svg(const sweep_plan_t *p, const cli_sweep_row_t *rows,
                           const int *status)
{
    double ttft[SWEEP_MAX_VALUES], goodput[SWEEP_MAX_VALUES];
    const char *labels[SWEEP_MAX_VALUES];
    for (size_t i = 0; i < p->nvalues; i++) {
        ttft[i] = status[i] == 2 ? NAN : rows[i].ttft_p99_us / 1e3;
        goodput[i] = status[i] == 2 ? NAN : rows[i].goodput_gbps;
        labels[i] = p->values[i];
    }
    FILE *f = fopen(p->svg_path, "w");
    if (f == NULL)
        return cli_fail(SWEEP_CMD, "--sweep-svg: cannot write %s: %s", p->svg_path,
                        strerror(errno));
    char title[160];
    snprintf(title, sizeof title, "p99 TTFT and goodput against %s", p->knob);
    const cli_svg_series_t left = {.name = "p99 TTFT (ms)", .values = ttft};
    const cli_svg_series_t right = {.name = "goodput (Gb/s)", .values = goodput};
    int rc = cli_svg_chart(f, title, p->knob, labels, p->nvalues, &left, &right);
    if (fclose(f) != 0 || rc != 0)
        return cli_fail(SWEEP_CMD, "--sweep-svg: writing %s failed", p->svg_path);
    return 0;
}

int cli_sweep_main(int argc, char **argv, const cli_sweep_runner_t *runner)
{
    sweep_plan_t p;
    memset(&p, 0, sizeof p);
    cli_sweep_row_t rows[SWEEP_MAX_VALUES];
    int status[SWEEP_MAX_VALUES];
    char **run_argv = NULL;
    int rc = sweep_parse(argc, argv, &p);
    if (rc == 0 && (run_argv = calloc((size_t)p.nbase + 3, sizeof *run_argv)) == NULL)
        rc = cli_fail(SWEEP_CMD, "out of memory");
    bool broke = false;
    for (size_t i = 0; rc == 0 && i < p.nvalues; i++) {
        char value[SWEEP_MAX_VALUES * 8];
        sweep_flag_value(&p, i, runner->default_decode_tp, value, sizeof value);
        memcpy(run_argv, p.base, (size_t)p.nbase * sizeof *run_argv);
        run_argv[p.nbase] = p.flag;
        run_argv[p.nbase + 1] = value;
        fprintf(stderr, "kvstage sim --sweep: %s=%s (%zu of %zu)\n", p.knob, p.values[i], i + 1,
                p.nvalues);
        memset(&rows[i], 0, sizeof rows[i]);
        status[i] = runner->run(runner->ctx, p.nbase + 2, run_argv, &rows[i]);
        broke = broke || status[i] == 1;
    }
    if (rc == 0) {
        sweep_table(&p, rows, status);
        if (p.csv_path == NULL) {
            printf("\n");
            sweep_csv(stdout, &p, rows, status);
        } else {
            FILE *f = fopen(p.csv_path, "w");
            if (f == NULL) {
                rc = cli_fail(SWEEP_CMD, "--sweep-csv: cannot write %s: %s", p.csv_path,
                              strerror(errno));
            } else {
                sweep_csv(f, &p, rows, status);
                if (fclose(f) != 0)
                    rc = cli_fail(SWEEP_CMD, "--sweep-csv: writing %s failed", p.csv_path);
            }
        }
    }
    if (rc == 0 && p.svg_path != NULL)
        rc = sweep_write_svg(&p, rows, status);
    free(run_argv);
    free(p.base);
    return rc != 0 ? rc : broke ? 1 : 0;
}
