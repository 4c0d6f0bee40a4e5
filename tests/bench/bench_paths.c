/*
 * bench_paths.c - benchmark (not a test): one transfer-bound workload moved
 * by the staging path and by the slice path on the simulator, side by side
 * in one run. Reports simulated goodput against line rate, RDMA writes, and
 * the simulator's own speed (engine events per wall second), median of
 * `repeats` runs each. Usage: bench_paths [requests] [repeats]
 * Wall time comes from CLOCK_MONOTONIC here, outside the simulation.
 */
#include "scenario.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const uint32_t requests = argc > 1 ? (uint32_t)atoi(argv[1]) : 16;
    const int repeats = argc > 2 ? atoi(argv[2]) : 3;
    /* Llama-3.1-8B shape, prefill TP 4 -> decode TP 2, 400 Gb/s NICs,
     * prompts of 512-2048 tokens all arriving at once, instant prefill:
     * the transfer is the only thing that takes time. */
    sim_scenario_config_t c;
    memset(&c, 0, sizeof c);
    c.shape = (kvs_layout_params_t){.total_heads = 8, .head_dim = 128, .dtype = KVS_DTYPE_BF16,
                                    .layers = 32, .page_size = 16, .prefill_tp = 4,
                                    .decode_tp = 2, .chunk_tokens = 2048};
    c.requests = requests;
    c.prompt_min_tokens = 512;
    c.prompt_max_tokens = 2048;
    c.ring_bytes = 1024ull << 20;
    c.staging = true;
    c.max_inflight = requests;
    c.prefill_tokens_per_s = 1000000000;
    c.seed = 7;
    const kvs_path_t paths[] = {KVS_PATH_STAGING, KVS_PATH_SLICE};
    printf("workload: llama-3.1-8b shape, P4 -> D2, %u requests of 512-2048 tokens, "
           "transfer-bound, %d runs each (median)\n", requests, repeats);
    printf("%-8s %12s %14s %12s %10s %14s %12s\n", "path", "rdma_writes", "goodput_gbps",
           "line_gbps", "sim_ms", "events/s", "wall_s");
    double goodput[2] = {0, 0};
    for (int p = 0; p < 2; p++) {
        c.path = paths[p];
        double *wall = calloc((size_t)repeats, sizeof *wall);
        sim_report_t r = {0};
        for (int i = 0; i < repeats; i++) {
            char err[256];
            const double t0 = wall_s();
            int rc = sim_scenario_run(&c, &r, err, sizeof err);
            wall[i] = wall_s() - t0;
            if (rc != KVS_OK || r.requests_ok != r.requests_total || r.corrupt_bytes != 0) {
                fprintf(stderr, "bench_paths: run failed: %s (%s)\n", kvs_strerror(rc), err);
                return 1;
            }
        }
        qsort(wall, (size_t)repeats, sizeof *wall, cmp_double);
        const double med = wall[repeats / 2];
        goodput[p] = r.goodput_gbps;
        printf("%-8s %12llu %14.1f %12.0f %10.3f %14.0f %12.3f\n", kvs_path_name(paths[p]),
               (unsigned long long)r.rdma_ops, r.goodput_gbps, r.line_rate_gbps,
               (double)r.sim_ns / 1e6, (double)r.events / med, med);
        free(wall);
    }
    printf("staging / slice goodput: %.1fx\n", goodput[1] > 0 ? goodput[0] / goodput[1] : 0.0);
    return 0;
}
