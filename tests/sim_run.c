/*
 * sim_run.c - running a simulated scenario from a cmocka test (sim_run.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sim_run.h"

#include <string.h>

sim_scenario_config_t sim_run_small(kvs_layout_params_t shape, uint64_t ring_bytes,
                                    uint64_t seed)
{
    sim_scenario_config_t c;
    memset(&c, 0, sizeof c);
    c.shape = shape;
    c.requests = 8;
    c.prompt_min_tokens = 1;
    c.prompt_max_tokens = 900;
    c.rate_milli_per_s = 200000;
    c.ring_bytes = ring_bytes;
    c.staging = true;
    c.path = KVS_PATH_STAGING;
    c.max_inflight = 4;
    c.seed = seed;
    return c;
}

sim_report_t sim_run_mode(sim_scenario_config_t c, sim_data_mode_t mode, const char *what)
{
    c.gpu.data_mode = mode;
    sim_report_t r;
    char err[384];
    const int rc = sim_scenario_run(&c, &r, err, sizeof err);
    if (rc != KVS_OK)
        fail_msg("%s (%s mode, seed %llu): %s", what,
                 mode == SIM_DATA_BYTES ? "bytes" : "provenance", (unsigned long long)c.seed,
                 err);
    return r;
}

sim_report_t sim_run_clean_in_both(const sim_scenario_config_t *c, const char *what)
{
    const sim_report_t b = sim_run_mode(*c, SIM_DATA_BYTES, what);
    const sim_report_t p = sim_run_mode(*c, SIM_DATA_PROVENANCE, what);
    if (b.digest != p.digest || b.bytes_verified != p.bytes_verified ||
        b.corrupt_bytes != 0 || p.corrupt_bytes != 0 || b.requests_ok != c->requests ||
        b.violations != 0)
        fail_msg("%s (seed %llu): bytes mode %016llx, %llu verified, %llu corrupt, %u of %u "
                 "ok, %llu violations; provenance mode %016llx, %llu verified, %llu corrupt",
                 what, (unsigned long long)c->seed, (unsigned long long)b.digest,
                 (unsigned long long)b.bytes_verified, (unsigned long long)b.corrupt_bytes,
                 b.requests_ok, c->requests, (unsigned long long)b.violations,
                 (unsigned long long)p.digest, (unsigned long long)p.bytes_verified,
                 (unsigned long long)p.corrupt_bytes);
    assert_memory_equal(&b, &p, sizeof b);
    assert_true(b.bytes_verified > 0);
    return b;
}

void sim_run_caught_in_both(sim_scenario_config_t c, uint64_t *hits, const char *what)
{
    for (int mode = SIM_DATA_BYTES; mode <= SIM_DATA_PROVENANCE; mode++) {
        *hits = 0;
        const sim_report_t r = sim_run_mode(c, (sim_data_mode_t)mode, what);
        const char *name = mode == SIM_DATA_BYTES ? "bytes" : "provenance";
        if (*hits == 0)
            fail_msg("%s (%s mode): the bug was never planted", what, name);
        if (r.corrupt_bytes == 0 || r.violations == 0)
            fail_msg("%s (%s mode, seed %llu): planted %llu times, but %llu corrupt bytes "
                     "of %llu verified",
                     what, name, (unsigned long long)c.seed, (unsigned long long)*hits,
                     (unsigned long long)r.corrupt_bytes,
                     (unsigned long long)r.bytes_verified);
        print_message("%s, %s mode: %llu of %llu bytes corrupt\n", what, name,
                      (unsigned long long)r.corrupt_bytes,
                      (unsigned long long)r.bytes_verified);
    }
}

sim_report_t sim_run_staged_in_both(const sim_scenario_config_t *c, const char *what)
{
    const sim_report_t r = sim_run_clean_in_both(c, what);
    if (r.path != KVS_PATH_STAGING)
        fail_msg("%s: path %d, not staging", what, (int)r.path);
    return r;
}

void sim_run_caught_then_clean(sim_scenario_config_t c, uint64_t *hits, const char *what)
{
    sim_run_caught_in_both(c, hits, what);
    c.copy_hook = NULL;
    (void)sim_run_staged_in_both(&c, "the planted run, unplanted");
}
