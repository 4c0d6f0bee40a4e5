/*
 * test_sim_api.c - the public simulator API (kvs_sim_run, <kvstage/sim.h>):
 * a run matches sim_scenario_run on the same scenario field for field; the
 * ABI guards (version, the config's and the report's size, an unknown tail
 * that must be zero, reserved fields) refuse what they should with
 * KVS_EVERSION or KVS_EINVAL; bad fields and fault strings are named in the
 * error; a larger report is written up to this library's size and zeroed
 * beyond it; aux payloads (max_aux_bytes) are checked on every decode rank
 * and counted in the report; kvs_sim_cluster_check names the pair of
 * instances that cannot pair, kvs_sim_fault_check gives a fault string's
 * whole line; the workload outside the simulator (kvs_sim_prompt_tokens,
 * kvs_sim_kv_fill and kvs_sim_kv_check) is the run's.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <kvstage/sim.h>

#include "kvdata.h"
#include "scenario.h"
#include "wire.h"

/* Two layers, TP 2 -> 1, three short prompts: a few MB, milliseconds. */
static kvs_sim_config_t tiny(void)
{
    kvs_sim_config_t c;
    kvs_sim_config_init(&c);
    c.total_heads = 2;
    c.head_dim = 64;
    c.layers = 2;
    c.page_size = 16;
    c.chunk_tokens = 64;
    c.prefill_tp = 2;
    c.decode_tp = 1;
    c.requests = 3;
    c.prompt_min_tokens = 16;
    c.prompt_max_tokens = 200;
    c.ring_bytes = 4u << 20;
    c.seed = 5;
    return c;
}

static int run(const kvs_sim_config_t *c, kvs_sim_report_t *r, kvs_error_t *err)
{
    memset(r, 0, sizeof *r);
    r->size_bytes = sizeof *r;
    memset(err, 0, sizeof *err);
    return kvs_sim_run(c, r, err);
}

/* err holds status and a message containing `words`. */
static void expect_error(int rc, const kvs_error_t *err, int status, const char *words)
{
    assert_int_equal(rc, status);
    assert_int_equal(err->status, status);
    if (strstr(err->msg, words) == NULL)
        fail_msg("message '%s' lacks '%s'", err->msg, words);
}

/* Issue 25 item 8: regions of more than 4 GiB move. The issue's own shape
 * (40 KV heads, head dim 256, 128 layers, P8 -> D4, 8192-token chunks: 10
 * GiB per decode rank and chunk, 5 GiB per writer), in provenance mode so
 * that no KV byte is held, with prefill PP on both sides and PP 2 into 1:
 * every slot of every request checked, the regions past 2^32 bytes, and a
 * ring too small for them refused before the run, naming both knobs. */
static void test_sim_api_regions_past_4gib_move(void **state)
{
    (void)state;
    const int64_t pps[][2] = {{1, 1}, {2, 2}, {2, 1}};
    for (size_t i = 0; i < sizeof pps / sizeof pps[0]; i++) {
        kvs_sim_config_t c;
        kvs_sim_config_init(&c);
        c.total_heads = 40;
        c.head_dim = 256;
        c.layers = 128;
        c.page_size = 16;
        c.chunk_tokens = 8192;
        c.prefill_tp = 8;
        c.decode_tp = 4;
        c.prefill_pp = pps[i][0];
        c.decode_pp = pps[i][1];
        c.requests = 2;
        c.prompt_min_tokens = 8192 + 16;
        c.prompt_max_tokens = 2 * 8192;
        c.ring_bytes = 24ull << 30; /* two full regions; the H200's HBM holds the pool */
        c.data_mode = KVS_SIM_DATA_PROVENANCE;
        c.seed = 3;
        kvs_sim_report_t r;
        kvs_error_t err;
        const int rc = run(&c, &r, &err);
        if (rc != KVS_OK)
            fail_msg("PP %lld -> %lld: %s: %s", (long long)pps[i][0], (long long)pps[i][1],
                     kvs_status_name(rc), err.msg);
        assert_int_equal(r.requests_ok, 2);
        assert_int_equal(r.violations, 0);
        assert_true(r.ring_bytes_needed > (UINT64_C(1) << 32));
        assert_true(r.bytes_verified >= 2 * r.ring_bytes_needed);
        /* Too small a ring: refused before any room opens, naming both knobs. */
        c.ring_bytes = 4096ull << 20;
        expect_error(run(&c, &r, &err), &err, KVS_EOVERSIZED, "raise ring_bytes to at least");
        if (strstr(err.msg, "chunk_tokens") == NULL)
            fail_msg("'%s' does not name chunk_tokens", err.msg);
    }
}

/* A decode room sends its page list on the direct and slice paths in
 * PAGES messages of at most KVS_WIRE_PAGES_PER_MSG ids (480): rooms of
 * 1200 pages (one token a page: three messages) move whole, every byte
 * verified where the decode's page list puts it. */
static void test_sim_api_direct_rooms_of_many_page_messages(void **state)
{
    (void)state;
    kvs_sim_config_t c = tiny();
    c.prefill_tp = c.decode_tp = 1;
    c.path = KVS_PATH_DIRECT;
    c.page_size = 1;
    c.requests = 2;
    c.prompt_min_tokens = c.prompt_max_tokens = 2 * KVS_WIRE_PAGES_PER_MSG + 240;
    kvs_sim_report_t r;
    kvs_error_t err;
    const int rc = run(&c, &r, &err);
    if (rc != KVS_OK)
        fail_msg("rooms of 1200 pages: %s: %s", kvs_status_name(rc), err.msg);
    assert_int_equal(r.path, KVS_PATH_DIRECT);
    assert_int_equal(r.requests_ok, 2);
    assert_int_equal(r.violations, 0);
    assert_int_equal(r.corrupt_bytes, 0);
    /* rooms x tokens x layers x K and V x heads x head_dim x 2 bytes */
    assert_true(r.bytes_verified >= (uint64_t)2 * 1200 * c.layers * 2 * c.total_heads *
                                        c.head_dim * 2);
}

static void test_sim_api_run_matches_the_scenario(void **state)
{
    kvs_sim_config_t c = tiny();
    kvs_sim_report_t r;
    kvs_error_t err;
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_int_equal(err.status, KVS_OK);
    assert_int_equal(r.version, KVS_SIM_REPORT_VERSION);
    assert_int_equal(r.size_bytes, sizeof r);
    assert_int_equal(r.requests_total, 3);
    assert_int_equal(r.requests_ok, 3);
    assert_int_equal(r.violations, 0);
    assert_int_equal(r.path, KVS_PATH_STAGING);
    assert_true(r.bytes_verified > 0 && r.bytes_verified == r.bytes_moved);

    /* The same scenario straight through sim_scenario_run. */
    sim_scenario_config_t s;
    memset(&s, 0, sizeof s);
    s.shape = (kvs_layout_params_t){.total_heads = 2, .head_dim = 64, .layers = 2,
                                    .page_size = 16, .chunk_tokens = 64,
                                    .prefill_tp = 2, .decode_tp = 1};
    s.requests = 3;
    s.prompt_min_tokens = 16;
    s.prompt_max_tokens = 200;
    s.ring_bytes = 4u << 20;
    s.seed = 5;
    s.staging = true;
    sim_report_t want;
    char why[256];
    assert_int_equal(sim_scenario_run(&s, &want, why, sizeof why), KVS_OK);
    assert_int_equal(r.digest, want.digest);
    assert_int_equal(r.events, want.events);
    assert_int_equal(r.bytes_moved, want.bytes_moved);
    assert_int_equal(r.rdma_ops, want.rdma_ops);
    assert_int_equal(r.sim_ns, want.sim_ns);
    assert_int_equal(r.ring_peak_bytes, want.ring_peak_bytes);
    assert_true(r.latency_p99_us == want.latency_p99_us);
    assert_string_equal(r.aux_error, "");
    assert_string_equal(r.aux_error, want.aux_error);

    /* Deterministic; another seed, another run. */
    kvs_sim_report_t again;
    assert_int_equal(run(&c, &again, &err), KVS_OK);
    assert_int_equal(again.digest, r.digest);
    c.seed = 6;
    assert_int_equal(run(&c, &again, &err), KVS_OK);
    assert_int_not_equal(again.digest, r.digest);
}

static void test_sim_api_faults_in_cli_syntax(void **state)
{
    kvs_sim_config_t c = tiny();
    const char *faults[] = {"dup:any:0.5"};
    c.faults = faults;
    c.nfaults = 1;
    kvs_sim_report_t r;
    kvs_error_t err;
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_true(r.msgs_duplicate > 0); /* dropped by the links */
    assert_int_equal(r.requests_ok, 3);
    assert_int_equal(r.violations, 0);

    const char *bad[] = {"dup:any:0.5", "drop:nope:0.1"};
    c.faults = bad;
    c.nfaults = 2;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "faults[1] 'drop:nope:0.1': unknown "
                                                      "message type 'nope'");
    const char *none[] = {NULL};
    c.faults = none;
    c.nfaults = 1;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "faults[0] is NULL");
    c.faults = NULL;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "nfaults is 1 but faults is NULL");
    c.faults = faults;
    c.nfaults = KVS_SIM_MAX_FAULTS + 1;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "nfaults is 17");
}

static void test_sim_api_bad_fields_are_named(void **state)
{
    kvs_sim_report_t r;
    kvs_error_t err;
    kvs_sim_config_t c = tiny();
    c.prefill_tp = 0;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "prefill_tp is 0: set it to 1..1024");
    c = tiny();
    c.decode_tp = 3;
    expect_error(run(&c, &r, &err), &err, KVS_EHEAD_SPLIT, "decode TP 3");
    c = tiny();
    c.requests = 2000000;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "requests is 2000000");
    c = tiny();
    c.prompt_min_tokens = 300;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL,
                 "prompt_min_tokens 300 is above prompt_max_tokens 200");
    c = tiny();
    c.path = 9;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "path 9 is unknown");
    c = tiny();
    c.path = KVS_PATH_DIRECT;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "path direct needs equal TP sizes");
    c = tiny();
    c.dtype = 17;
    expect_error(run(&c, &r, &err), &err, KVS_EDTYPE, "dtype 17");
    c = tiny();
    c.reserved1 = 1;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL, "reserved1 is 1");
    c = tiny();
    c.chunk_tokens = 100; /* not a multiple of the page size: the manager's guard */
    expect_error(run(&c, &r, &err), &err, KVS_ECHUNK, "chunk_tokens 100");
    /* A NULL err is allowed. */
    assert_int_equal(kvs_sim_run(&c, &r, NULL), KVS_ECHUNK);
    assert_int_equal(kvs_sim_run(NULL, &r, &err), KVS_EINVAL);
    assert_int_equal(kvs_sim_run(&c, NULL, &err), KVS_EINVAL);
}

static void test_sim_api_version_and_size_guards(void **state)
{
    kvs_sim_report_t r;
    kvs_error_t err;
    kvs_sim_config_t c = tiny();
    c.version = 0;
    expect_error(run(&c, &r, &err), &err, KVS_EVERSION, "kvs_sim_config_init");
    c.version = KVS_SIM_CONFIG_VERSION + 1;
    expect_error(run(&c, &r, &err), &err, KVS_EVERSION, "config version 2");
    c = tiny();
    c.size_bytes = offsetof(kvs_sim_config_t, trace_path);
    expect_error(run(&c, &r, &err), &err, KVS_EVERSION, "config size_bytes");

    /* A caller built with a larger config: a zero tail runs, a set byte in
     * it is refused. */
    struct {
        kvs_sim_config_t c;
        uint64_t newer_field;
    } big;
    memset(&big, 0, sizeof big);
    big.c = tiny();
    big.c.size_bytes = sizeof big;
    assert_int_equal(run(&big.c, &r, &err), KVS_OK);
    assert_int_equal(r.requests_ok, 3);
    big.newer_field = 1;
    expect_error(run(&big.c, &r, &err), &err, KVS_EVERSION, "beyond the");

    /* The report: too small is refused; larger is written up to ours and
     * zeroed beyond. */
    c = tiny();
    memset(&r, 0, sizeof r);
    r.size_bytes = offsetof(kvs_sim_report_t, e2e_p99_us);
    assert_int_equal(kvs_sim_run(&c, &r, &err), KVS_EVERSION);
    assert_non_null(strstr(err.msg, "report size_bytes"));
    struct {
        kvs_sim_report_t r;
        uint64_t newer_field;
    } wide;
    memset(&wide, 0xab, sizeof wide);
    wide.r.size_bytes = sizeof wide;
    assert_int_equal(kvs_sim_run(&c, &wide.r, &err), KVS_OK);
    assert_int_equal(wide.r.size_bytes, sizeof wide);
    assert_int_equal(wide.r.requests_ok, 3);
    assert_int_equal(wide.newer_field, 0);
}

/* A cluster (spec §12): instances listed per side, the router, and an
 * instance[] entry per instance in the report. */
static void test_sim_api_cluster(void **state)
{
    kvs_sim_report_t r;
    kvs_error_t err;
    kvs_sim_config_t c = tiny();
    c.requests = 8;
    c.prefill_tp = 0; /* instance 0's */
    c.prefill_instances = 3;
    c.prefill_instance_tp[0] = 2;
    c.prefill_instance_tp[1] = 1;
    c.prefill_instance_tp[2] = 2;
    c.prefill_instance_pp[2] = 2;
    c.decode_instances = 2;
    c.decode_instance_tp[0] = 1;
    c.decode_instance_tp[1] = 2;
    c.router = KVS_SIM_ROUTER_LEAST_LOADED;
    const char *faults[] = {"crash:prefill@2:3:1000"}; /* at the first arrival */
    c.faults = faults;
    c.nfaults = 1;
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_int_equal(r.instances, 5);
    assert_int_equal(r.prefill_ranks, 2 + 1 + 4);
    assert_int_equal(r.decode_ranks, 1 + 2);
    assert_int_equal(r.violations, 0);
    assert_int_equal(r.collateral_failures, 0);
    const int64_t tp[5] = {2, 1, 2, 1, 2}, pp[5] = {1, 1, 2, 1, 1};
    uint32_t ok[2] = {0, 0};
    for (uint32_t k = 0; k < 5; k++) {
        const kvs_sim_instance_t *in = &r.instance[k];
        assert_int_equal(in->role, k < 3 ? KVS_ROLE_PREFILL : KVS_ROLE_DECODE);
        assert_int_equal(in->id, k < 3 ? k : k - 3);
        assert_int_equal(in->tp, tp[k]);
        assert_int_equal(in->pp, pp[k]);
        ok[k >= 3] += in->requests_ok;
    }
    assert_int_equal(ok[0], r.requests_ok);
    assert_int_equal(ok[1], r.requests_ok);
    assert_int_equal(r.instance[0].requests_failed + r.instance[1].requests_failed, 0);
    /* Only the crashed instance's requests failed. */
    assert_true(r.instance[2].requests_failed > 0);
    assert_int_equal(r.instance[2].requests_ok, 0);
    assert_int_equal(r.requests_failed, r.instance[2].requests_failed);

    /* Bad instance fields are named. */
    kvs_sim_config_t bad = c;
    bad.prefill_instance_tp[1] = 0;
    expect_error(run(&bad, &r, &err), &err, KVS_EINVAL, "prefill_instance_tp[1] is 0");
    bad = c;
    bad.decode_instances = KVS_SIM_MAX_INSTANCES + 1;
    expect_error(run(&bad, &r, &err), &err, KVS_EINVAL, "decode_instances is 33");
    bad = c;
    bad.router = 2;
    expect_error(run(&bad, &r, &err), &err, KVS_EINVAL, "router 2 is unknown");
    bad = c;
    bad.decode_instance_pp[1] = 2; /* prefill instances of PP 1 and 2 */
    expect_error(run(&bad, &r, &err), &err, KVS_EPP_SPLIT,
                 "decode instance 1 (PP 2) cannot pair with prefill instance 0 (PP 1)");
    bad = c;
    bad.prefill_tp = 1; /* instance 0 is TP 2 */
    expect_error(run(&bad, &r, &err), &err, KVS_EINVAL, "prefill instance 0 has TP 2");
    bad = c;
    const char *faults_bad[] = {"crash:prefill@3:0:10"};
    bad.faults = faults_bad;
    expect_error(run(&bad, &r, &err), &err, KVS_EINVAL, "faults[0] 'crash:prefill@3:0:10'");

    /* A caller that knows the report up to posts_refused gets no more. */
    struct {
        kvs_sim_report_t r;
    } old;
    memset(&old, 0xab, sizeof old);
    old.r.size_bytes = offsetof(kvs_sim_report_t, collateral_failures);
    assert_int_equal(kvs_sim_run(&c, &old.r, &err), KVS_OK);
    assert_int_equal(old.r.collateral_failures, 0xabababab);
    assert_int_equal(old.r.instances, 0xabababab);
}

/* Aux payloads (max_aux_bytes): every decode rank's ok result is checked
 * against the payload its request's prefill ranks gave, so the count of
 * bytes checked is known in advance; a payload lost or cut short would
 * count in aux_corrupt_bytes and fail the run. KV bytes and their count
 * are as without aux. */
static void test_sim_api_aux_payloads(void **state)
{
    kvs_sim_report_t none, r;
    kvs_error_t err;
    kvs_sim_config_t c = tiny();
    c.requests = 8;
    c.decode_tp = 2; /* two decode ranks: every payload goes to both */
    assert_int_equal(run(&c, &none, &err), KVS_OK);
    assert_int_equal(none.aux_bytes_verified, 0);
    assert_int_equal(none.aux_corrupt_bytes, 0);

    const uint32_t limits[] = {1, 9000, KVS_AUX_BYTES_MAX};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        c.max_aux_bytes = limits[k];
        assert_int_equal(run(&c, &r, &err), KVS_OK);
        uint64_t want = 0;
        for (uint64_t i = 0; i < c.requests; i++)
            want += 2 * (uint64_t)sim_kvdata_aux_bytes(i, c.max_aux_bytes);
        assert_true(want > 0);
        assert_int_equal(r.requests_ok, 8);
        assert_int_equal(r.aux_bytes_verified, want);
        assert_int_equal(r.aux_corrupt_bytes, 0);
        assert_int_equal(r.corrupt_bytes, 0);
        assert_int_equal(r.violations, 0);
        assert_int_equal(r.bytes_verified, none.bytes_verified);
        assert_int_equal(r.bytes_moved, none.bytes_moved);
        assert_int_not_equal(r.digest, none.digest); /* AUX messages went */
    }
    /* Lost messages are sent again: payloads still arrive whole. */
    const char *faults[] = {"drop:any:0.05"};
    c.faults = faults;
    c.nfaults = 1;
    c.max_aux_bytes = 9000;
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_int_equal(r.aux_corrupt_bytes, 0);
    assert_true(r.aux_bytes_verified > 0);
    assert_int_equal(r.violations, 0);

    c = tiny();
    c.max_aux_bytes = KVS_AUX_BYTES_MAX + 1;
    expect_error(run(&c, &r, &err), &err, KVS_EINVAL,
                 "max_aux_bytes is 1048577: set it to 0..1048576");
}

/* The verdict is the library's (report.ok), and why requests failed comes
 * with it: counts by status, each with its first detail. */
static void test_sim_api_verdict_and_failures(void **state)
{
    kvs_sim_report_t r;
    kvs_error_t err;
    kvs_sim_config_t c = tiny();
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_int_equal(r.ok, 1);
    assert_int_equal(r.violations, 0);
    assert_int_equal(r.failures, 0);
    assert_true(r.ring_bytes_needed > 0 && r.ring_bytes_needed <= c.ring_bytes);

    /* A crash fails its instance's requests: failures, no violation. */
    const char *crash[] = {"crash:prefill:0:2000"};
    c.faults = crash;
    c.nfaults = 1;
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_int_equal(r.ok, 1);
    assert_true(r.requests_failed > 0);
    assert_int_equal(r.failures, 1);
    assert_int_equal(r.failure[0].status, KVS_EPEER);
    assert_int_equal(r.failure[0].count, r.requests_failed);
    assert_non_null(strstr(r.failure[0].first_detail, "request "));

    /* No fault, a stall timeout below the run's waits: every request fails
     * though nothing struck it, which the library calls a violation. */
    c = tiny();
    c.stall_timeout_ns = 1000;
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_int_equal(r.ok, 0);
    assert_true(r.violations > 0 && r.requests_failed > 0);
    uint32_t counted = r.failures_unlisted;
    for (uint32_t k = 0; k < r.failures; k++)
        counted += r.failure[k].count;
    assert_int_equal(counted, r.requests_failed);

    /* A ring below the largest region is refused before the run, with the
     * size it needs; kvs_sim_config_check says the same. */
    c = tiny();
    c.ring_bytes = 4096;
    expect_error(run(&c, &r, &err), &err, KVS_EOVERSIZED, "raise ring_bytes to at least");
    assert_int_equal(r.events, 0);
    assert_true(r.ring_bytes_needed > 4096);
    kvs_sim_config_t resolved;
    expect_error(kvs_sim_config_check(&c, &resolved, &err), &err, KVS_EOVERSIZED,
                 "ring_bytes");
    c.ring_bytes = r.ring_bytes_needed; /* exactly one region fits */
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_int_equal(r.ok, 1);
}

/* kvs_sim_config_check: the defaults filled in, the instances listed;
 * kvs_sim_config_bound: the one set of bounds. */
static void test_sim_api_config_check_and_bounds(void **state)
{
    kvs_sim_config_t c = tiny(), out;
    kvs_error_t err;
    c.requests = 0;
    c.ring_bytes = 0;
    assert_int_equal(kvs_sim_config_check(&c, &out, &err), KVS_OK);
    assert_int_equal(out.requests, 16);
    assert_int_equal(out.ring_bytes, KVS_DEFAULT_RING_BYTES);
    assert_int_equal(out.prefill_instances, 1);
    assert_int_equal(out.prefill_instance_tp[0], 2);
    assert_int_equal(out.decode_instance_pp[0], 1);
    c.requests = 2000000;
    expect_error(kvs_sim_config_check(&c, NULL, &err), &err, KVS_EINVAL, "requests is 2000000");

    const kvs_sim_bound_t *b = kvs_sim_config_bound("requests");
    assert_non_null(b);
    assert_int_equal(b->max, 1000000);
    assert_int_equal(kvs_sim_config_bound("head_dim")->min, 1);
    assert_null(kvs_sim_config_bound("path"));
    assert_null(kvs_sim_config_bound(NULL));
}

/* kvs_sim_cluster_check: the checks of kvs_sim_run up to the cluster, with
 * the pair that cannot pair named by its instances. */
static void test_sim_api_cluster_check_names_the_pair(void **state)
{
    kvs_error_t err;
    int32_t p = 7, d = 7;
    kvs_sim_config_t c = tiny();
    assert_int_equal(kvs_sim_cluster_check(&c, &p, &d, &err), KVS_OK);
    assert_int_equal(err.status, KVS_OK);
    assert_int_equal(p, -1);
    assert_int_equal(d, -1);
    /* Neither the ring nor the faults are its business. */
    c.ring_bytes = 4096;
    const char *bad_fault[] = {"drop:nope:0.1"};
    c.faults = bad_fault;
    c.nfaults = 1;
    assert_int_equal(kvs_sim_cluster_check(&c, NULL, NULL, &err), KVS_OK);

    /* Prefill instance 1 of TP 3 cannot pair with decode instance 1 of TP 2. */
    c = tiny();
    c.total_heads = 6;
    c.prefill_instances = 2;
    c.prefill_instance_tp[0] = 2;
    c.prefill_instance_tp[1] = 3;
    c.decode_instances = 2;
    c.decode_instance_tp[0] = 1;
    c.decode_instance_tp[1] = 2;
    assert_int_equal(kvs_sim_cluster_check(&c, &p, &d, &err), KVS_EHEAD_SPLIT);
    assert_int_equal(p, 1);
    assert_int_equal(d, 1);
    assert_non_null(strstr(err.msg, "prefill instance 1 (TP 3, PP 1) cannot pair with "
                                    "decode instance 1 (TP 2, PP 1)"));
    /* ... as kvs_sim_run says it. */
    kvs_sim_report_t r;
    expect_error(run(&c, &r, &err), &err, KVS_EHEAD_SPLIT, "prefill instance 1 (TP 3");

    /* A bad field or a shape that cannot be planned names no pair. */
    c = tiny();
    c.requests = 2000000;
    expect_error(kvs_sim_cluster_check(&c, &p, &d, &err), &err, KVS_EINVAL,
                 "requests is 2000000");
    assert_int_equal(p, -1);
    assert_int_equal(d, -1);
    c = tiny();
    c.decode_tp = 3; /* 2 heads over 3 ranks */
    expect_error(kvs_sim_cluster_check(&c, &p, &d, &err), &err, KVS_EHEAD_SPLIT, "");
    assert_int_equal(p, -1);
    c.version = 99;
    expect_error(kvs_sim_cluster_check(&c, NULL, NULL, &err), &err, KVS_EVERSION, "version 99");
    expect_error(kvs_sim_cluster_check(NULL, &p, &d, &err), &err, KVS_EINVAL, "cfg");
    assert_int_equal(p, -1);
}

/* kvs_sim_fault_check: one fault string against the cluster, with the
 * parser's whole line, which may be longer than a kvs_error_t holds. */
static void test_sim_api_fault_check_whole_line(void **state)
{
    char why[512];
    kvs_sim_config_t c = tiny();
    c.prefill_instances = 2;
    c.prefill_instance_tp[0] = 2;
    c.prefill_instance_tp[1] = 1;
    memset(why, 'x', sizeof why);
    assert_int_equal(kvs_sim_fault_check(&c, "crash:prefill@1:0:10", why, sizeof why), KVS_OK);
    assert_string_equal(why, "");
    assert_int_equal(kvs_sim_fault_check(&c, "dup:any:0.5", NULL, 0), KVS_OK);
    /* Instance 1 has one rank, and there is no instance 2. */
    assert_int_equal(kvs_sim_fault_check(&c, "crash:prefill@1:1:10", why, sizeof why),
                     KVS_EINVAL);
    assert_non_null(strstr(why, "'crash:prefill@1:1:10': use crash:SIDE:N:AT_US with N"));
    assert_int_equal(kvs_sim_fault_check(&c, "hbm-full:p0@2", why, sizeof why), KVS_EINVAL);
    assert_true(strncmp(why, "'hbm-full:p0@2': ", 17) == 0);
    /* A hostile writer is a prefill rank, in one of two modes. */
    assert_int_equal(kvs_sim_fault_check(&c, "hostile-write:p0@1:outside:10", why, sizeof why),
                     KVS_OK);
    assert_int_equal(kvs_sim_fault_check(&c, "hostile-write:p1:stale:0", NULL, 0), KVS_OK);
    assert_int_equal(kvs_sim_fault_check(&c, "hostile-write:d0:stale:0", why, sizeof why),
                     KVS_EINVAL);
    assert_non_null(strstr(why, "a prefill rank of this cluster"));
    assert_int_equal(kvs_sim_fault_check(&c, "hostile-write:p0:sideways:0", why, sizeof why),
                     KVS_EINVAL);
    assert_non_null(strstr(why, "MODE stale"));
    /* The list of forms runs past KVS_ERROR_MSG_BYTES and arrives whole. */
    assert_int_equal(kvs_sim_fault_check(&c, "bogus", why, sizeof why), KVS_EINVAL);
    assert_true(strlen(why) >= KVS_ERROR_MSG_BYTES);
    assert_non_null(strstr(why, "or decode[@<instance>]"));
    /* A short buffer gets a cut line, still terminated. */
    char small[16];
    assert_int_equal(kvs_sim_fault_check(&c, "bogus", small, sizeof small), KVS_EINVAL);
    assert_string_equal(small, "'bogus': unknow");
    /* cfg's own faults are not read; cfg's own errors are. */
    const char *bad[] = {"drop:nope:0.1"};
    c.faults = bad;
    c.nfaults = 1;
    assert_int_equal(kvs_sim_fault_check(&c, "dup:any:0.5", why, sizeof why), KVS_OK);
    c.prefill_instance_tp[1] = 0;
    assert_int_equal(kvs_sim_fault_check(&c, "dup:any:0.5", why, sizeof why), KVS_EINVAL);
    assert_non_null(strstr(why, "prefill_instance_tp[1] is 0"));
    assert_int_equal(kvs_sim_fault_check(NULL, "dup:any:0.5", why, sizeof why), KVS_EINVAL);
    assert_int_equal(kvs_sim_fault_check(&c, NULL, why, sizeof why), KVS_EINVAL);
}

/* The workload for programs outside the simulator: the prompt lengths are
 * the run's (the bytes it moved add up to them), and the KV pattern is
 * the one the decode checks. */
static void test_sim_api_workload_is_the_runs(void **state)
{
    kvs_error_t err;
    kvs_sim_config_t c = tiny();
    c.requests = 12;
    int64_t tokens[12], again[12];
    assert_int_equal(kvs_sim_prompt_tokens(c.seed, c.prompt_min_tokens, c.prompt_max_tokens,
                                           tokens, 12, &err), KVS_OK);
    assert_int_equal(err.status, KVS_OK);
    int64_t sum = 0;
    bool differ = false;
    for (size_t i = 0; i < 12; i++) {
        assert_true(tokens[i] >= 16 && tokens[i] <= 200);
        differ |= tokens[i] != tokens[0];
        sum += tokens[i];
    }
    assert_true(differ);
    /* Every token's K and V of both layers and both heads moves once: 2
     * heads x 64 x 2 bytes x 2 layers x 2 = 1024 bytes a token. */
    kvs_sim_report_t r;
    assert_int_equal(run(&c, &r, &err), KVS_OK);
    assert_int_equal(r.bytes_moved, (uint64_t)sum * 1024);
    /* A prefix of the draws is the shorter run's; another seed, others. */
    assert_int_equal(kvs_sim_prompt_tokens(c.seed, 16, 200, again, 5, NULL), KVS_OK);
    assert_memory_equal(again, tokens, 5 * sizeof tokens[0]);
    assert_int_equal(kvs_sim_prompt_tokens(c.seed + 1, 16, 200, again, 12, NULL), KVS_OK);
    assert_memory_not_equal(again, tokens, sizeof tokens);
    assert_int_equal(kvs_sim_prompt_tokens(1, 64, 64, again, 3, NULL), KVS_OK);
    assert_true(again[0] == 64 && again[2] == 64);
    expect_error(kvs_sim_prompt_tokens(1, 0, 64, again, 3, &err), &err, KVS_EINVAL,
                 "1 <= min_tokens <= max_tokens");
    expect_error(kvs_sim_prompt_tokens(1, 65, 64, again, 3, &err), &err, KVS_EINVAL, "65:64");
    expect_error(kvs_sim_prompt_tokens(1, 1, (INT64_C(1) << 24) + 1, again, 3, &err), &err,
                 KVS_EINVAL, "16777216");
    expect_error(kvs_sim_prompt_tokens(1, 1, 64, NULL, 3, &err), &err, KVS_EINVAL, "out");
    assert_int_equal(kvs_sim_prompt_tokens(1, 1, 64, NULL, 0, NULL), KVS_OK);

    /* The pattern: a function of the coordinate, checked byte by byte. */
    uint8_t v[256], w[256];
    const kvs_sim_kv_coord_t at = {.request = 3, .layer = 1, .kv = 1, .head = 5, .token = 77};
    kvs_sim_kv_fill(v, sizeof v, &at);
    kvs_sim_kv_fill(w, sizeof w, &at);
    assert_memory_equal(v, w, sizeof v);
    assert_int_equal(kvs_sim_kv_check(v, sizeof v, &at), 0);
    /* The simulator's own content (what its decode ranks check). */
    sim_kvdata_fill(w, sizeof w, &at);
    assert_memory_equal(v, w, sizeof v);
    v[10] ^= 1;
    v[200] ^= 0x80;
    assert_int_equal(kvs_sim_kv_check(v, sizeof v, &at), 2);
    kvs_sim_kv_coord_t other = at;
    other.kv = 0; /* K instead of V: almost every byte differs */
    assert_true(kvs_sim_kv_check(w, sizeof w, &other) > 200);
    other = at;
    other.token = 78;
    assert_true(kvs_sim_kv_check(w, sizeof w, &other) > 200);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_api_direct_rooms_of_many_page_messages),
        cmocka_unit_test(test_sim_api_run_matches_the_scenario),
        cmocka_unit_test(test_sim_api_faults_in_cli_syntax),
        cmocka_unit_test(test_sim_api_bad_fields_are_named),
        cmocka_unit_test(test_sim_api_version_and_size_guards),
        cmocka_unit_test(test_sim_api_cluster),
        cmocka_unit_test(test_sim_api_aux_payloads),
        cmocka_unit_test(test_sim_api_verdict_and_failures),
        cmocka_unit_test(test_sim_api_config_check_and_bounds),
        cmocka_unit_test(test_sim_api_cluster_check_names_the_pair),
        cmocka_unit_test(test_sim_api_fault_check_whole_line),
        cmocka_unit_test(test_sim_api_workload_is_the_runs),
        cmocka_unit_test(test_sim_api_regions_past_4gib_move),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
