/*
 * bench_scale.c - wall time and peak memory of a cluster-scale simulation
 * (issue 15, "Scale"): 128 simulated H200s serving 10,000 requests of the
 * llama-3.1-70b shape in the provenance data mode, through kvs_sim_run.
 * Not a test: run by hand from an optimised build, pinned to one core:
 *
 *   taskset -c 0 build-rel/bench_scale [requests [runs [warmup_requests]]]
 *
 * Defaults: 10000 requests, 3 runs, a 200-request warm-up run first (0: no
 * warm-up). Prints each run's wall time, verdict, requests ok, events and
 * digest (equal across runs: the simulation is deterministic, only the
 * wall time varies), then the median wall time and the process's peak
 * resident set (getrusage ru_maxrss: the most any run reached, warm-up
 * included). Exit 1 when a run fails or the runs disagree.
 *
 * Cluster: 8 prefill instances at TP 8 and 32 decode instances at TP 2
 * (64 + 64 GPUs, the example), 8192-token chunks, 4 GiB rings, page
 * size 16, 400 Gb/s NICs.
 * Workload: prompts of 1024..8192 tokens arriving at 20 requests/s
 * (Poisson); each prefill instance runs 16384 tokens/s, so the prefill side
 * is about 70% busy and requests queue at times, but all should succeed.
 * The wall clock is read here, around kvs_sim_run, never inside sim code.
 */
#include <kvstage/kvstage.h>
#include <kvstage/sim.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

enum { BENCH_RUNS_MAX = 15, BENCH_PREFILL = 8, BENCH_DECODE = 32 };

static double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bench_config(kvs_sim_config_t *c, uint32_t requests)
{
    kvs_sim_config_init(c);
    c->total_heads = 8; /* llama-3.1-70b: 8 KV heads of 128, 80 layers, bf16 */
    c->head_dim = 128;
    c->layers = 80;
    c->dtype = KVS_DTYPE_BF16;
    c->page_size = 16;
    c->chunk_tokens = 8192;
    c->prefill_instances = BENCH_PREFILL;
    c->decode_instances = BENCH_DECODE;
    for (int i = 0; i < BENCH_PREFILL; i++)
        c->prefill_instance_tp[i] = 8;
    for (int i = 0; i < BENCH_DECODE; i++)
        c->decode_instance_tp[i] = 2;
    c->requests = requests;
    c->prompt_min_tokens = 1024;
    c->prompt_max_tokens = 8192;
    c->rate_milli_per_s = 20000; /* 20 requests/s */
    c->max_inflight = 4;
    c->ring_bytes = UINT64_C(4) << 30;
    c->data_mode = KVS_SIM_DATA_PROVENANCE;
    c->seed = 1;
}

/* One run; returns its wall time, or a negative value when it failed. */
static double bench_run(uint32_t requests, kvs_sim_report_t *rep)
{
    kvs_sim_config_t c;
    bench_config(&c, requests);
    memset(rep, 0, sizeof *rep);
    rep->size_bytes = (uint32_t)sizeof *rep;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    const double t0 = bench_now_s();
    const int rc = kvs_sim_run(&c, rep, &err);
    const double t1 = bench_now_s();
    if (rc != KVS_OK) {
        fprintf(stderr, "bench_scale: kvs_sim_run: %s: %s\n", kvs_status_name(rc), err.msg);
        return -1;
    }
    return t1 - t0;
}

static int bench_cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long bench_peak_rss_kib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

int main(int argc, char **argv)
{
    const uint32_t requests = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 10000;
    int runs = argc > 2 ? atoi(argv[2]) : 3;
    const uint32_t warmup = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 200;
    if (requests == 0 || runs < 1 || runs > BENCH_RUNS_MAX) {
        fprintf(stderr, "usage: bench_scale [requests (default 10000)] [runs 1..%d "
                        "(default 3)] [warmup_requests (default 200, 0: none)]\n",
                BENCH_RUNS_MAX);
        return 2;
    }
    printf("bench_scale: %d x TP 8 prefill -> %d x TP 2 decode (128 GPUs), llama-3.1-70b "
           "shape, provenance mode, %" PRIu32 " requests of 1024..8192 tokens at 20/s, "
           "8192-token chunks, 4 GiB rings\n",
           BENCH_PREFILL, BENCH_DECODE, requests);
    kvs_sim_report_t rep;
    if (warmup > 0) {
        const double w = bench_run(warmup, &rep);
        if (w < 0)
            return 1;
        printf("warm-up    %" PRIu32 " requests, %.3f s, %s\n", warmup, w,
               rep.ok ? "ok" : "FAILED");
    }
    double wall[BENCH_RUNS_MAX];
    uint64_t digest = 0;
    int bad = 0;
    for (int i = 0; i < runs; i++) {
        wall[i] = bench_run(requests, &rep);
        if (wall[i] < 0)
            return 1;
        printf("run %d      %.3f s wall, verdict %s, %" PRIu32 "/%" PRIu32 " requests ok, "
               "%" PRIu32 " failed, %" PRIu64 " events, %.3f s simulated, %" PRIu64
               " corrupt bytes, digest %016" PRIx64 ", peak RSS so far %.1f MiB\n",
               i + 1, wall[i], rep.ok ? "ok" : "FAILED", rep.requests_ok, rep.requests_total,
               rep.requests_failed, rep.events, (double)rep.sim_ns * 1e-9, rep.corrupt_bytes,
               rep.digest, (double)bench_peak_rss_kib() / 1024.0);
        if (!rep.ok || (i > 0 && rep.digest != digest))
            bad = 1;
        digest = rep.digest;
    }
    qsort(wall, (size_t)runs, sizeof wall[0], bench_cmp);
    printf("median     %.3f s wall (min %.3f, max %.3f over %d runs), peak RSS %.1f MiB, "
           "goodput %.1f Gb/s, e2e p99 %.0f us\n",
           wall[runs / 2], wall[0], wall[runs - 1], runs,
           (double)bench_peak_rss_kib() / 1024.0, rep.goodput_gbps, rep.e2e_p99_us);
    return bad;
}
