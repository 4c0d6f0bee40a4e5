/*
 * progress_loop.c - the C side of bench_progress.py: a loop of n
 * kvs_driver_progress calls on the driver a kvstage.Rank made, timed with
 * the monotonic clock, so that the Python call (Rank.progress) and the C
 * loop are measured side by side on the same rank in one process. Built as
 * the module kvs_bench_progress (loaded with ctypes), never a test.
 */
#include <kvstage/driver.h>

#include <time.h>

#define KVS_BENCH_EXPORT __attribute__((visibility("default")))

/* Nanoseconds per call over n calls; a negative status if one failed. */
KVS_BENCH_EXPORT double kvs_bench_progress_loop(kvs_driver_t *d, long n);

double kvs_bench_progress_loop(kvs_driver_t *d, long n)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        int rc = kvs_driver_progress(d);
        if (rc < 0)
            return rc;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) /
           (double)(n > 0 ? n : 1);
}
