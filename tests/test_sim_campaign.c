/*
 * test_sim_campaign.c - the campaign through the library's public API
 * (kvs_sim_campaign_run, <kvstage/sim.h>), not the CLI: every run reaches
 * the callback in order, each drawn config replays alone through
 * kvs_sim_run to the same digest and verdict, the totals add up, the whole
 * campaign is deterministic, model kinds leave the other draws of a run as
 * they were, and bad configs are refused naming the field.
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

/* The runs of two campaigns of one seed, by index. */
typedef struct kinds_seen {
    uint64_t digest[RUNS];
    int32_t kv_kind[RUNS], kv_scales[RUNS];
    int64_t decode_page_size[RUNS];
    int32_t dtype[RUNS];
    int64_t prefill_cp[RUNS];
    int64_t full_attn_every[RUNS], draft_layers[RUNS], prefill_pp[RUNS];
    int32_t other_layers[RUNS], path[RUNS];
} kinds_seen_t;

static void on_run_kinds(void *ctx, const kvs_sim_campaign_run_t *run)
{
    kinds_seen_t *s = ctx;
    assert_int_equal(run->status, KVS_OK);
    assert_int_equal(run->violations, 0);
    s->digest[run->index] = run->report->digest;
    s->kv_kind[run->index] = run->config->kv_kind;
    s->kv_scales[run->index] = run->config->kv_scales;
    s->decode_page_size[run->index] = run->config->decode_page_size;
    s->dtype[run->index] = run->config->dtype;
    s->prefill_cp[run->index] = run->config->prefill_cp;
    s->full_attn_every[run->index] = run->config->full_attn_every;
    s->draft_layers[run->index] = run->config->draft_layers;
    s->prefill_pp[run->index] = run->config->prefill_pp;
    s->other_layers[run->index] = run->config->other_layers;
    s->path[run->index] = run->config->path;
}

static uint32_t model_kind(const char *name)
{
    uint32_t k = 0;
    while (kvs_sim_campaign_model_kind_name(k) != NULL &&
           strcmp(kvs_sim_campaign_model_kind_name(k), name) != 0)
        k++;
    assert_non_null(kvs_sim_campaign_model_kind_name(k));
    return k;
}

/* Model kinds (docs/kinds/) come from a stream of their own: a run that
 * drew none is the run of a campaign of kinds "none", digest for digest;
 * "none" draws none; naming kinds draws only those, one at least in every
 * run, and the drawn config carries it (an MLA latent, fp8 with scales). */
static void test_sim_campaign_model_kinds(void **state)
{
    (void)state;
    kvs_sim_campaign_config_t cfg;
    kvs_sim_campaign_config_init(&cfg);
    cfg.runs = RUNS;
    cfg.seed = 1;
    kvs_error_t err;
    kinds_seen_t all, none, mla;
    memset(&all, 0, sizeof all);
    memset(&none, 0, sizeof none);
    memset(&mla, 0, sizeof mla);
    kvs_sim_campaign_report_t r;
    report_init(&r);
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run_kinds, &all, &r, &err), KVS_OK);
    assert_int_equal(r.model_kinds, 7);
    uint64_t plain = 0, with_kind = 0;
    for (uint32_t k = 0; k < r.model_kinds; k++)
        with_kind += r.model_kind_runs[k];
    assert_true(with_kind > 0);
    cfg.kinds = "none";
    kvs_sim_campaign_report_t rn;
    report_init(&rn);
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run_kinds, &none, &rn, &err), KVS_OK);
    for (uint32_t k = 0; k < rn.model_kinds; k++)
        assert_int_equal(rn.model_kind_runs[k], 0);
    assert_int_equal(rn.runs_model_combined, 0);
    for (uint32_t i = 0; i < RUNS; i++) {
        assert_int_equal(none.kv_kind[i], KVS_KV_GQA);
        assert_int_equal(none.kv_scales[i], KVS_KV_SCALES_NONE);
        assert_int_equal(none.decode_page_size[i], 0);
        assert_int_equal(none.prefill_cp[i], 0);
        assert_int_equal(none.full_attn_every[i], 0);
        assert_int_equal(none.draft_layers[i], 0);
        if (all.kv_kind[i] == KVS_KV_GQA && all.kv_scales[i] == KVS_KV_SCALES_NONE &&
            all.decode_page_size[i] == 0 && all.prefill_cp[i] == 0 &&
            all.full_attn_every[i] == 0 && all.draft_layers[i] == 0) {
            assert_int_equal(all.digest[i], none.digest[i]);
            plain++;
        }
    }
    assert_true(plain > 0 && plain < RUNS);
    cfg.kinds = "mla,per-token";
    report_init(&r);
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run_kinds, &mla, &r, &err), KVS_OK);
    assert_int_equal(r.model_kind_runs[model_kind("page-sizes")], 0);
    assert_int_equal(r.model_kind_runs[model_kind("per-block")], 0);
    assert_int_equal(r.model_kind_runs[model_kind("context-parallel")], 0);
    assert_int_equal(r.model_kind_runs[model_kind("hybrid")], 0);
    for (uint32_t i = 0; i < RUNS; i++) {
        assert_true(mla.kv_kind[i] == KVS_KV_MLA || mla.kv_scales[i] == KVS_KV_SCALES_PER_TOKEN);
        assert_int_equal(mla.full_attn_every[i], 0);
        assert_int_equal(mla.decode_page_size[i], 0);
        assert_int_equal(mla.prefill_cp[i], 0);
        if (mla.kv_scales[i] != KVS_KV_SCALES_NONE)
            assert_int_equal(mla.dtype[i], KVS_DTYPE_FP8);
    }
    assert_int_equal(r.model_kind_runs[model_kind("mla")] +
                         r.model_kind_runs[model_kind("per-token")] - r.runs_model_combined,
                     RUNS);
    /* Prefill CP alone: 2..4 CP ranks in every run (these clusters fit
     * the rank bound), GQA with one page size otherwise. */
    kinds_seen_t cp;
    memset(&cp, 0, sizeof cp);
    cfg.kinds = "context-parallel";
    report_init(&r);
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run_kinds, &cp, &r, &err), KVS_OK);
    assert_int_equal(r.model_kind_runs[model_kind("context-parallel")], RUNS);
    for (uint32_t i = 0; i < RUNS; i++) {
        assert_true(cp.prefill_cp[i] >= 2 && cp.prefill_cp[i] <= 4);
        assert_int_equal(cp.kv_kind[i], KVS_KV_GQA);
        assert_int_equal(cp.decode_page_size[i], 0);
    }
    /* Hybrid layers alone: a pattern of window or state layers in every
     * run, GQA without CP, on the path AUTO picks (staging), a prefill PP
     * of 1 or the decode's. */
    kinds_seen_t hyb;
    memset(&hyb, 0, sizeof hyb);
    cfg.kinds = "hybrid";
    report_init(&r);
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run_kinds, &hyb, &r, &err), KVS_OK);
    assert_int_equal(r.model_kind_runs[model_kind("hybrid")], RUNS);
    uint32_t windows = 0;
    for (uint32_t i = 0; i < RUNS; i++) {
        assert_true(hyb.full_attn_every[i] >= 2 && hyb.full_attn_every[i] <= 4);
        assert_true(hyb.other_layers[i] == KVS_LAYER_WINDOW ||
                    hyb.other_layers[i] == KVS_LAYER_STATE);
        windows += hyb.other_layers[i] == KVS_LAYER_WINDOW;
        assert_int_equal(hyb.kv_kind[i], KVS_KV_GQA);
        assert_int_equal(hyb.prefill_cp[i], 0);
        assert_int_equal(hyb.path[i], KVS_PATH_AUTO);
    }
    assert_true(windows > 0 && windows < RUNS);
    /* A draft alone: 1..3 draft layers in every run, without scale planes,
     * on the path AUTO picks, at the PP drawn (some runs pipelined). */
    kinds_seen_t dr;
    memset(&dr, 0, sizeof dr);
    uint32_t pipelined = 0;
    cfg.kinds = "draft";
    report_init(&r);
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run_kinds, &dr, &r, &err), KVS_OK);
    assert_int_equal(r.model_kind_runs[model_kind("draft")], RUNS);
    for (uint32_t i = 0; i < RUNS; i++) {
        assert_true(dr.draft_layers[i] >= 1 && dr.draft_layers[i] <= 3);
        assert_int_equal(dr.kv_scales[i], KVS_KV_SCALES_NONE);
        assert_int_equal(dr.full_attn_every[i], 0);
        assert_int_equal(dr.path[i], KVS_PATH_AUTO);
        pipelined += dr.prefill_pp[i] > 1;
    }
    assert_true(pipelined > 0);
    /* A caller built before kinds existed (its config ends at faults)
     * gets every kind, as NULL does. */
    cfg.kinds = NULL;
    cfg.runs = 4;
    cfg.size_bytes = (uint32_t)offsetof(kvs_sim_campaign_config_t, kinds);
    kvs_sim_campaign_report_t old;
    report_init(&old);
    memset(&none, 0, sizeof none);
    assert_int_equal(kvs_sim_campaign_run(&cfg, on_run_kinds, &none, &old, &err), KVS_OK);
    assert_memory_equal(none.digest, all.digest, 4 * sizeof none.digest[0]);
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
    cfg.kinds = "mla,moe";
    assert_int_equal(kvs_sim_campaign_run(&cfg, NULL, NULL, &r, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "kinds: unknown model kind 'moe'"));
    cfg.kinds = "mla,";
    assert_int_equal(kvs_sim_campaign_run(&cfg, NULL, NULL, &r, &err), KVS_EINVAL);
    cfg.kinds = NULL;
    cfg.size_bytes = (uint32_t)offsetof(kvs_sim_campaign_config_t, faults);
    assert_int_equal(kvs_sim_campaign_run(&cfg, NULL, NULL, &r, &err), KVS_EVERSION);
    cfg.size_bytes = (uint32_t)sizeof cfg;
    cfg.version = KVS_SIM_CAMPAIGN_CONFIG_VERSION + 1;
    assert_int_equal(kvs_sim_campaign_run(&cfg, NULL, NULL, &r, &err), KVS_EVERSION);
    /* Every fault kind has a name, and the list ends. */
    uint32_t k = 0;
    while (kvs_sim_campaign_fault_name(k) != NULL)
        k++;
    assert_true(k > 5 && k <= KVS_SIM_CAMPAIGN_MAX_KINDS);
    assert_null(kvs_sim_campaign_fault_name(KVS_SIM_CAMPAIGN_MAX_KINDS));
    k = 0;
    while (kvs_sim_campaign_model_kind_name(k) != NULL)
        k++;
    assert_true(k == 7 && k <= KVS_SIM_CAMPAIGN_MAX_MODEL_KINDS);
    assert_null(kvs_sim_campaign_model_kind_name(KVS_SIM_CAMPAIGN_MAX_MODEL_KINDS));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_campaign_runs_replay_and_add_up),
        cmocka_unit_test(test_sim_campaign_model_kinds),
        cmocka_unit_test(test_sim_campaign_refuses_bad_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
