/*
 * sweep.h - `kvstage sim --sweep KNOB=v1,v2,...`: runs the same workload
 * once per value of one knob and prints a table of what operators read
 * (TTFT, goodput, ring peak, requests, verdict), writes it as CSV and, with
 * --sweep-svg, a chart of p99 TTFT and goodput against the knob (svg.h).
 *
 * It works on the command line only: each run is the `kvstage sim` command
 * of the sweep's other flags with the knob's flag set to one value, handed
 * to the caller's run function, so a row replays as one plain command.
 * Knobs: ring-mib, chunk-tokens, rate, path, decode-instances (that many
 * decode instances, each of the first --decode-tp value), and any other
 * value flag of `kvstage sim` by its name without the dashes.
 */
#ifndef KVSTAGE_TOOLS_SWEEP_H
#define KVSTAGE_TOOLS_SWEEP_H

#include <stdbool.h>
#include <stdint.h>

/* What one run of a sweep gave. */
typedef struct cli_sweep_row {
    double ttft_p50_us, ttft_p90_us, ttft_p99_us; /* arrival -> KV at the decode */
    double transfer_p99_us;
    double goodput_gbps, line_rate_gbps;
    uint64_t ring_peak_bytes, ring_p99_bytes, watermark_waits;
    double nic_util_max;
    uint32_t requests_ok, requests_failed;
    uint64_t digest;
} cli_sweep_row_t;

/* How to run one `kvstage sim` command line (argv[0] is "sim"; no sweep
 * flags): fills *row and returns its exit status: 0 ok, 1 an invariant
 * broke (row filled), 2 refused before the run (one stderr line said why;
 * row untouched). */
typedef struct cli_sweep_runner {
    int (*run)(void *ctx, int argc, char **argv, cli_sweep_row_t *row);
    void *ctx;
    int64_t default_decode_tp; /* --decode-tp when the command gives none */
} cli_sweep_runner_t;

/* True when argv asks for a sweep (--sweep or --sweep=...). */
bool cli_sweep_wanted(int argc, char **argv);

/* Runs the sweep of argv (`kvstage sim` flags with --sweep KNOB=v1,...,
 * optional --sweep-csv FILE and --sweep-svg FILE). Returns the exit
 * status: 0 when every run that happened kept every invariant, 1 when one
 * broke one, 2 for bad sweep flags. Runs refused before they start (e.g. a
 * ring too small for the workload) are rows marked "refused". */
int cli_sweep_main(int argc, char **argv, const cli_sweep_runner_t *runner);

#endif
