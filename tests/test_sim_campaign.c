/*
 * test_sim_campaign.c - the campaign through the library's public API
 * (kvs_sim_campaign_run, <kvstage/sim.h>), not the CLI: every run reaches
 * the callback in order, each drawn config replays alone through
 * kvs_sim_run to the same digest and verdict, the totals add up, the whole
 * campaign is deterministic, and bad configs are refused naming the field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <kvstage/sim.h>

#define RUNS 24

typedef struct seen {
    uint64_t calls, next_index, violations, requests_total;
    uint64_t digest[RUNS];
    uint64_t replayed;
} seen_t;

/* Each run: in order, and its drawn config alone gives the same report. */
static void on_run(void *ctx, const kvs_sim_campaign_run_t *run)
{
    seen_t *s = ctx;
    assert_int_equal(run->index, s->next_index);
    s->next_index++;
    s->calls++;
    s->violations += run->violations;
    assert_non_null(run->config);
    assert_non_null(run->report);
    assert_non_null(run->why);
    if (run->status != KVS_OK)
        return; /* never ran: nothing to replay */
    s->requests_total += run->report->requests_total;
    s->digest[run->index] = run->report->digest;
    kvs_sim_report_t again;
    memset(&again, 0, sizeof again);
    again.size_bytes = (uint32_t)sizeof again;
    kvs_error_t err;
    assert_int_equal(kvs_sim_run(run->config, &again, &err), KVS_OK);
    assert_int_equal(again.digest, run->report->digest);
    assert_int_equal(again.violations, run->report->violations);
    assert_int_equal(again.requests_ok, run->report->requests_ok);
    assert_int_equal(again.ok, run->report->ok);
    s->replayed++;
}

static void report_init(kvs_sim_campaign_report_t *r)
{
    memset(r, 0, sizeof *r);
    r->size_bytes = (uint32_t)sizeof *r;
}

static void test_sim_campaign_runs_replay_and_add_up(void **state)
{
    (void)state;
    kvs_sim_campaign_config_t cfg;
    kvs_sim_campaign_config_init(&cfg);
    cfg.runs = RUNS;
    cfg.seed = 3;
    seen_t s;
    memset(&s, 0, sizeof s);
    kvs_sim_campaign_report_t r;
    report_init(&r);
    kvs_error_t err;
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run, &s, &r, &err), KVS_OK);
    assert_int_equal(r.version, KVS_SIM_CAMPAIGN_REPORT_VERSION);
    assert_int_equal(s.calls, RUNS);
    assert_int_equal(r.runs, RUNS);
    assert_true(s.replayed > RUNS / 2);
    assert_int_equal(r.violations, 0);
    assert_int_equal(s.violations, r.violations);
    assert_int_equal(r.requests_total, s.requests_total);
    assert_int_equal(r.setup_errors, 0);
    assert_int_equal(r.runs_stopped, 0);
    assert_true(r.runs_with_faults > 0 && r.runs_with_faults <= RUNS);

    /* The same config: the same runs, digests and totals. */
    seen_t s2;
    memset(&s2, 0, sizeof s2);
    kvs_sim_campaign_report_t r2;
    report_init(&r2);
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run, &s2, &r2, &err), KVS_OK);
    assert_int_equal(r2.digest, r.digest);
    assert_memory_equal(s2.digest, s.digest, sizeof s.digest);
    /* Another seed, other runs. */
    cfg.seed = 4;
    cfg.runs = 4;
    report_init(&r2);
    assert_int_equal(kvs_sim_campaign_run(&cfg, NULL, NULL, &r2, &err), KVS_OK);
    assert_int_not_equal(r2.digest, r.digest);
}

static void test_sim_campaign_refuses_bad_configs(void **state)
{
    (void)state;
    kvs_sim_campaign_config_t cfg;
    kvs_sim_campaign_report_t r;
    kvs_error_t err;
    kvs_sim_campaign_config_init(&cfg);
    report_init(&r);
    cfg.runs = 0;
    assert_int_equal(kvs_sim_campaign_run(&cfg, NULL, NULL, &r, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "runs"));
    cfg.runs = 1;
    cfg.faults = "drop,no-such-kind";
    assert_int_equal(kvs_sim_campaign_run(&cfg, NULL, NULL, &r, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "no-such-kind"));
    cfg.faults = NULL;
    cfg.version = KVS_SIM_CAMPAIGN_CONFIG_VERSION + 1;
    assert_int_equal(kvs_sim_campaign_run(&cfg, NULL, NULL, &r, &err), KVS_EVERSION);
    /* Every fault kind has a name, and the list ends. */
    uint32_t k = 0;
    while (kvs_sim_campaign_fault_name(k) != NULL)
        k++;
    assert_true(k > 5 && k <= KVS_SIM_CAMPAIGN_MAX_KINDS);
    assert_null(kvs_sim_campaign_fault_name(KVS_SIM_CAMPAIGN_MAX_KINDS));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_campaign_runs_replay_and_add_up),
        cmocka_unit_test(test_sim_campaign_refuses_bad_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
