/*
 * bench_engine.c - events per second of the simulator's event engine on one
 * core. Not a test: run by hand (see usage) from an optimised build.
 *
 * Workload: `pending` timers, each re-arming itself at now + a random delay
 * drawn from its engine's rng stream, until `events` events ran. Five runs;
 * prints the median, min and max events/s and each run's digest, which must
 * be equal (the runs are deterministic; only the wall time varies). The wall
 * clock is read here, around sim_engine_run, never inside sim code.
 *
 * Usage: bench_engine [events (default 20000000)] [pending (default 1024)]
 */
#include "engine.h"

#include <kvstage/kvstage.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BENCH_RUNS = 5 };
#define BENCH_SEED UINT64_C(0xbe4c40)

typedef struct bench_ctx {
    sim_rng_t rng;
    uint64_t delay_ns_max;
} bench_ctx_t;

static void bench_rearm(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    bench_ctx_t *b = ctx;
    uint64_t delay_ns = 1 + sim_rng_below(&b->rng, b->delay_ns_max);
    int rc = sim_engine_after(eng, delay_ns, bench_rearm, b, arg + 1, NULL);
    if (rc != KVS_OK) {
        fprintf(stderr, "bench_engine: sim_engine_after failed: %d\n", rc);
        exit(1);
    }
}

static double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t bench_parse(const char *s, const char *what)
{
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || v == 0) {
        fprintf(stderr, "bench_engine: %s must be a positive integer, got '%s'\n", what, s);
        fprintf(stderr, "usage: bench_engine [events] [pending]\n");
        exit(2);
    }
    return (uint64_t)v;
}

/* One run; returns events/s and stores the digest. */
static double bench_once(uint64_t events, uint32_t pending, uint64_t *digest)
{
    sim_engine_t *eng = NULL;
    int rc = sim_engine_create(BENCH_SEED, pending, &eng);
    if (rc != KVS_OK) {
        fprintf(stderr, "bench_engine: sim_engine_create failed: %d\n", rc);
        exit(1);
    }
    bench_ctx_t b = {.delay_ns_max = 1000000};
    sim_engine_rng(eng, 1, &b.rng);
    for (uint32_t i = 0; i < pending; i++) {
        uint64_t at_ns = sim_rng_below(&b.rng, b.delay_ns_max);
        if (sim_engine_at(eng, at_ns, bench_rearm, &b, (uint64_t)i << 32, NULL) != KVS_OK) {
            fprintf(stderr, "bench_engine: sim_engine_at failed\n");
            exit(1);
        }
    }
    const double t0 = bench_now_s();
    const uint64_t ran = sim_engine_run(eng, UINT64_MAX, events);
    const double t1 = bench_now_s();
    if (ran != events || sim_engine_pending(eng) != pending) {
        fprintf(stderr, "bench_engine: ran %" PRIu64 " of %" PRIu64 " events\n", ran, events);
        exit(1);
    }
    *digest = sim_engine_digest(eng);
    sim_engine_destroy(eng);
    return (double)events / (t1 - t0);
}

int main(int argc, char **argv)
{
    if (argc > 3) {
        fprintf(stderr, "usage: bench_engine [events] [pending]\n");
        return 2;
    }
    const uint64_t events = argc > 1 ? bench_parse(argv[1], "events") : 20000000;
    const uint64_t pending = argc > 2 ? bench_parse(argv[2], "pending") : 1024;
    if (pending > UINT32_MAX / 2) {
        fprintf(stderr, "bench_engine: pending must be at most %u\n", UINT32_MAX / 2);
        return 2;
    }

    double rate[BENCH_RUNS];
    uint64_t digest[BENCH_RUNS];
    printf("bench_engine: %" PRIu64 " events, %" PRIu64 " pending timers, seed %#" PRIx64
           ", %d runs\n",
           events, pending, BENCH_SEED, BENCH_RUNS);
    for (int r = 0; r < BENCH_RUNS; r++) {
        rate[r] = bench_once(events, (uint32_t)pending, &digest[r]);
        printf("  run %d: %.2f M events/s  digest %#018" PRIx64 "\n", r + 1, rate[r] / 1e6,
               digest[r]);
    }
    for (int r = 1; r < BENCH_RUNS; r++) {
        if (digest[r] != digest[0]) {
            fprintf(stderr, "bench_engine: digests differ between runs: not deterministic\n");
            return 1;
        }
    }
    qsort(rate, BENCH_RUNS, sizeof(rate[0]), bench_cmp_double);
    printf("median %.2f M events/s  (min %.2f, max %.2f)  digest %#018" PRIx64
           " (equal in all runs)\n",
           rate[BENCH_RUNS / 2] / 1e6, rate[0] / 1e6, rate[BENCH_RUNS - 1] / 1e6, digest[0]);
    return 0;
}
