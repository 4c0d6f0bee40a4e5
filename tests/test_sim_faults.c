/*
 * test_sim_faults.c - one named scenario per fault kind of `kvstage sim
 * --fault` (issue: faults, liveness and fuzzing), each asserting the exact
 * outcome: which requests succeed and which fail (with what), and that
 * nothing hung, leaked, was corrupted or went untold (violations == 0).
 *
 * The cluster is small (P4 -> D2, staging path) and the load light (100
 * requests/s), so the time a fault strikes tells which requests it can
 * touch: those done before it are unharmed, those whose rooms opened after
 * a rank came back are unharmed, those in flight over a crash fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "scenario.h"
#include "wire.h"

#define NREQ 24
#define MS 1000000ull

static sim_request_outcome_t outcomes[NREQ];

static sim_scenario_config_t cluster(void)
{
    sim_scenario_config_t c;
    memset(&c, 0, sizeof c);
    c.shape = (kvs_layout_params_t){.total_heads = 8, .head_dim = 64,
                                    .dtype = KVS_DTYPE_BF16, .layers = 4, .page_size = 16,
                                    .prefill_tp = 4, .decode_tp = 2, .chunk_tokens = 256};
    c.requests = NREQ;
    c.prompt_min_tokens = 32;
    c.prompt_max_tokens = 600;
    c.rate_milli_per_s = 100000; /* 100 requests/s: about 240 ms in all */
    c.ring_bytes = 8u << 20;
    c.staging = true;
    c.max_inflight = 4;
    c.seed = 7;
    c.stall_timeout_ns = 200 * MS;
    c.outcomes = outcomes;
    return c;
}

static void add(sim_scenario_config_t *c, sim_fault_t f)
{
    assert_true(c->nfaults < SIM_MAX_FAULTS);
    c->faults[c->nfaults++] = f;
}

/* Runs c; the run itself must succeed with no violation of any kind. */
static sim_report_t run(const sim_scenario_config_t *c, const char *what)
{
    sim_report_t r;
    char err[256];
    memset(outcomes, 0, sizeof outcomes);
    const int rc = sim_scenario_run(c, &r, err, sizeof err);
    if (rc != KVS_OK || r.violations != 0 || r.requests_ok + r.requests_failed != NREQ)
        fail_msg("%s (seed %llu): rc %s (%s), ok %u failed %u, hung %u, leaked %llu, "
                 "corrupt %llu, unreported %u, collateral %u", what,
                 (unsigned long long)c->seed, kvs_status_name(rc), err, r.requests_ok,
                 r.requests_failed, r.hung_requests, (unsigned long long)r.ring_leaked_bytes,
                 (unsigned long long)r.corrupt_bytes, r.unreported_failures,
                 r.collateral_failures);
    assert_int_equal(r.ring_leaked_bytes, 0);
    assert_int_equal(r.hung_requests, 0);
    assert_int_equal(r.corrupt_bytes, 0);
    assert_int_equal(r.unreported_failures, 0);
    assert_int_equal(r.collateral_failures, 0);
    return r;
}

static void expect_all_ok(const sim_report_t *r, const char *what)
{
    if (r->requests_ok != NREQ)
        fail_msg("%s: %u of %d requests ok", what, r->requests_ok, NREQ);
    for (int i = 0; i < NREQ; i++)
        assert_int_equal(outcomes[i].status, KVS_OK);
}

/* Requests done before `at` succeed; those open across it fail; those
 * opened at or after `back` (UINT64_MAX: never) succeed. Those opened in
 * [at, back) race the rank's return: either way (but ended, which run()
 * checks), except with back == UINT64_MAX, where they fail. Returns how
 * many failed. */
static int expect_window(uint64_t at, uint64_t back, const char *what)
{
    int failed = 0;
    for (int i = 0; i < NREQ; i++) {
        const sim_request_outcome_t *o = &outcomes[i];
        const bool before = o->done_ns < at;
        const bool after = o->opened_ns >= back;
        const bool across = o->opened_ns < at && o->done_ns >= at;
        const bool ok = o->status == KVS_OK;
        const bool racing = !before && !after && !across && back != UINT64_MAX;
        if (!racing && (before || after) != ok)
            fail_msg("%s: request %d (opened %.3f ms, done %.3f ms) ended %s; fault at %.3f "
                     "ms, back at %.3f ms", what, i, o->opened_ns / 1e6, o->done_ns / 1e6,
                     kvs_status_name(o->status), at / 1e6,
                     back == UINT64_MAX ? -1.0 : back / 1e6);
        failed += !ok;
    }
    return failed;
}

/* ---- message faults: recovered by the links ---------------------------- */

static void test_sim_faults_drop_each_type(void **state)
{
    (void)state;
    const int types[] = {0, KVS_MSG_REGISTER, KVS_MSG_ROOM, KVS_MSG_STAGING_REQ,
                         KVS_MSG_STAGING_RSP, KVS_MSG_CHUNK_READY, KVS_MSG_WATERMARK,
                         KVS_MSG_STATUS};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        sim_scenario_config_t c = cluster();
        add(&c, (sim_fault_t){.kind = SIM_FAULT_DROP, .msg_type = types[t], .num = 15,
                              .den = 100});
        char what[64];
        snprintf(what, sizeof what, "drop 15%% of type %d", types[t]);
        sim_report_t r = run(&c, what);
        expect_all_ok(&r, what);
        assert_true(r.msgs_retransmitted > 0);
        assert_int_equal(r.peers_lost, 0);
    }
}

/* ABORT travels only when something fails: write errors make failures,
 * and every ABORT is dropped half the time. The failed requests are
 * exactly those a write error hit (KVS_EREMOTE), each told to every rank
 * (no unreported failure), the rest succeed. */
static void test_sim_faults_drop_abort(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_WRITE_ERROR, .num = 5, .den = 100});
    add(&c, (sim_fault_t){.kind = SIM_FAULT_DROP, .msg_type = KVS_MSG_ABORT, .num = 50,
                          .den = 100});
    sim_report_t r = run(&c, "drop 50% of ABORT, 5% write errors");
    assert_true(r.requests_failed > 0 && r.requests_ok > 0);
    for (int i = 0; i < NREQ; i++)
        assert_true(outcomes[i].status == KVS_OK || outcomes[i].status == KVS_EREMOTE);
    assert_true(r.msgs_retransmitted > 0);
}

static void test_sim_faults_dup(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_DUP, .num = 30, .den = 100});
    sim_report_t r = run(&c, "dup 30%");
    expect_all_ok(&r, "dup 30%");
    assert_true(r.msgs_duplicate > 0);
    /* A duplicated REGISTER is dropped by the link, not taken for a
     * restart of the decode (which would fail what it owes). */
    c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_DUP, .msg_type = KVS_MSG_REGISTER, .num = 1,
                          .den = 1});
    r = run(&c, "dup every REGISTER");
    expect_all_ok(&r, "dup every REGISTER");
    assert_true(r.msgs_duplicate >= 4);
}

static void test_sim_faults_delay(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_DELAY, .num = 20, .den = 100,
                          .delay_ns = 5 * MS});
    sim_report_t r = run(&c, "delay 20% by 5 ms");
    expect_all_ok(&r, "delay 20% by 5 ms");
    /* 5 ms is past the 2 ms retransmission timeout: the copies that went
     * out meanwhile arrive as duplicates and are dropped. */
    assert_true(r.msgs_retransmitted > 0 && r.msgs_duplicate > 0);
}

/* ---- data path ------------------------------------------------------------ */

static void test_sim_faults_write_error(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_WRITE_ERROR, .num = 10, .den = 100});
    sim_report_t r = run(&c, "write errors 10%");
    assert_true(r.requests_failed > 0 && r.requests_ok > 0);
    for (int i = 0; i < NREQ; i++)
        assert_true(outcomes[i].status == KVS_OK || outcomes[i].status == KVS_EREMOTE);
}

static void test_sim_faults_slow_scatter(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    const sim_report_t base = run(&c, "baseline");
    add(&c, (sim_fault_t){.kind = SIM_FAULT_SLOW_SCATTER, .role = KVS_ROLE_DECODE, .rank = 0,
                          .factor = 50});
    const sim_report_t r = run(&c, "slow scatter x50 on d0");
    expect_all_ok(&r, "slow scatter x50 on d0");
    assert_true(r.latency_p99_us > base.latency_p99_us);
}

/* ---- links ---------------------------------------------------------------- */

static void test_sim_faults_link_down_short(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_LINK_DOWN, .role = KVS_ROLE_DECODE, .rank = 0,
                          .at_ns = 50 * MS, .for_ns = 10 * MS});
    sim_report_t r = run(&c, "d0 link down 10 ms");
    /* Control messages are sent again; an RDMA write that loses a segment
     * fails its request (KVS_EPEER), and only a request writing then. */
    for (int i = 0; i < NREQ; i++) {
        const sim_request_outcome_t *o = &outcomes[i];
        if (o->done_ns < 50 * MS || o->opened_ns >= 60 * MS)
            assert_int_equal(o->status, KVS_OK);
        else
            assert_true(o->status == KVS_OK || o->status == KVS_EPEER);
    }
    assert_true(r.msgs_retransmitted > 0);
    assert_int_equal(r.peers_lost, 0);
}

/* Down past the stall timeout: what was in flight fails; once the link is
 * back the ranks find each other again and later requests succeed. */
static void test_sim_faults_link_down_long(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    c.requests = NREQ;
    c.rate_milli_per_s = 50000; /* 20 ms apart: about 480 ms in all */
    add(&c, (sim_fault_t){.kind = SIM_FAULT_LINK_DOWN, .role = KVS_ROLE_PREFILL, .rank = 0,
                          .at_ns = 100 * MS, .for_ns = 250 * MS});
    sim_report_t r = run(&c, "p0 link down 250 ms");
    assert_true(r.requests_failed > 0);
    for (int i = 0; i < NREQ; i++) {
        const sim_request_outcome_t *o = &outcomes[i];
        if (o->done_ns < 100 * MS || o->opened_ns > 100 * MS + 250 * MS + 200 * MS)
            assert_int_equal(o->status, KVS_OK);
    }
    assert_true(outcomes[NREQ - 1].status == KVS_OK);
}

/* ---- ranks ---------------------------------------------------------------- */

static void test_sim_faults_crash_decode(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_CRASH, .role = KVS_ROLE_DECODE, .rank = 0,
                          .at_ns = 80 * MS});
    sim_report_t r = run(&c, "crash d0 at 80 ms");
    assert_int_equal(r.ranks_crashed, 1);
    const int failed = expect_window(80 * MS, UINT64_MAX, "crash d0 at 80 ms");
    assert_true(failed > 0 && failed < NREQ);
    assert_true(r.peers_lost > 0);
}

static void test_sim_faults_crash_prefill(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_CRASH, .role = KVS_ROLE_PREFILL, .rank = 1,
                          .at_ns = 80 * MS});
    sim_report_t r = run(&c, "crash p1 at 80 ms");
    assert_int_equal(r.ranks_crashed, 1);
    const int failed = expect_window(80 * MS, UINT64_MAX, "crash p1 at 80 ms");
    assert_true(failed > 0 && failed < NREQ);
}

/* A decode restarts with the same session id: what it held fails, the
 * prefill ranks reset its watermark on the new registration, and requests
 * opened after it is back succeed (a stale watermark would corrupt them). */
static void test_sim_faults_restart_decode(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_RESTART, .role = KVS_ROLE_DECODE, .rank = 0,
                          .at_ns = 80 * MS});
    sim_report_t r = run(&c, "restart d0 at 80 ms");
    assert_int_equal(r.ranks_crashed, 1);
    assert_int_equal(r.ranks_restarted, 1);
    /* back: it registers at once (one control round trip) */
    const int failed = expect_window(80 * MS, 80 * MS + 1 * MS, "restart d0 at 80 ms");
    assert_true(failed > 0);
    assert_true(r.bytes_verified > 0);
}

/* A prefill restarts: the decodes see its connections die, fail what it
 * owed, reconnect after the retry timeout and register again. */
static void test_sim_faults_restart_prefill(void **state)
{
    (void)state;
    sim_scenario_config_t c = cluster();
    add(&c, (sim_fault_t){.kind = SIM_FAULT_RESTART, .role = KVS_ROLE_PREFILL, .rank = 2,
                          .at_ns = 80 * MS});
    sim_report_t r = run(&c, "restart p2 at 80 ms");
    assert_int_equal(r.ranks_restarted, 1);
    /* back: retry timeout (2 ms) + one round trip */
    const int failed = expect_window(80 * MS, 80 * MS + 3 * MS, "restart p2 at 80 ms");
    assert_true(failed > 0);
    assert_true(r.peers_lost >= 1);
}

/* ---- clusters (spec §12): a lost instance fails only its own rooms ------- */

/* Three prefill instances (TP 4, 2, 4) and two decode instances of TP
 * decode_tp, round robin: 24 requests, 8 per prefill instance. */
static sim_scenario_config_t three_prefills(int64_t decode_tp)
{
    sim_scenario_config_t c = cluster();
    c.shape.decode_tp = decode_tp;
    c.topo = (sim_topology_t){.prefill_instances = 3, .decode_instances = 2,
                              .prefill = {{4, 1}, {2, 1}, {4, 1}},
                              .decode = {{decode_tp, 1}, {decode_tp, 1}}};
    c.rate_milli_per_s = 200000; /* 5 ms apart: about 120 ms in all */
    return c;
}

/* Prefill instance `lost` lost `down` of its ranks at `at`: exactly the
 * requests paired with it that had not ended before then fail, with
 * KVS_EPEER on every rank of the pair that took part (the decode ranks and
 * the instance's surviving ranks; the others crashed); every other
 * request succeeds on every rank. Returns how many failed. */
static int expect_instance_lost(uint32_t lost, uint32_t down, uint64_t at, const char *what)
{
    int failed = 0;
    for (int i = 0; i < NREQ; i++) {
        const sim_request_outcome_t *o = &outcomes[i];
        const bool paired = o->prefill_instance == lost;
        const bool fails = paired && o->done_ns >= at;
        if (fails != (o->status != KVS_OK))
            fail_msg("%s: request %d (prefill instance %u, decode instance %u, opened %.3f "
                     "ms, done %.3f ms) ended %s", what, i, o->prefill_instance,
                     o->decode_instance, o->opened_ns / 1e6, o->done_ns / 1e6,
                     kvs_status_name(o->status));
        if (!fails) {
            if (o->ranks_ok != o->ranks)
                fail_msg("%s: request %d ok on %u of its %u ranks", what, i, o->ranks_ok,
                         o->ranks);
            continue;
        }
        failed++;
        assert_int_equal(o->status, KVS_EPEER);
        if (o->ranks_down != down || o->ranks_peer != o->ranks - down || o->ranks_ok != 0 ||
            o->ranks_other != 0)
            fail_msg("%s: request %d of %u ranks: %u down, %u KVS_EPEER, %u ok, %u other; "
                     "want %u down and the rest KVS_EPEER", what, i, o->ranks, o->ranks_down,
                     o->ranks_peer, o->ranks_ok, o->ranks_other, down);
    }
    return failed;
}

/* One rank of prefill instance 1 crashes mid-run. With decode TP 1 every
 * rank of a pair talks to the decode rank, so all of them hear of it. */
static void test_sim_faults_cluster_crash_one_rank(void **state)
{
    (void)state;
    sim_scenario_config_t c = three_prefills(1);
    add(&c, (sim_fault_t){.kind = SIM_FAULT_CRASH, .role = KVS_ROLE_PREFILL, .instance = 1,
                          .rank = 1, .at_ns = 60 * MS});
    sim_report_t r = run(&c, "crash p1@1 at 60 ms");
    assert_int_equal(r.ranks_crashed, 1);
    assert_int_equal(r.collateral_failures, 0);
    for (int i = 0; i < NREQ; i++)
        assert_int_equal(outcomes[i].prefill_instance, (uint32_t)i % 3);
    const int failed = expect_instance_lost(1, 1, 60 * MS, "crash p1@1 at 60 ms");
    assert_true(failed > 0 && failed < NREQ / 3);
    assert_int_equal(r.requests_failed, failed);
    assert_int_equal(r.instance[1].requests_failed, failed);
    assert_int_equal(r.instance[0].requests_failed + r.instance[2].requests_failed, 0);
    assert_true(r.peers_lost > 0);
}

/* Every rank of prefill instance 1 crashes at once; the decode instances
 * (TP 2) lose the writers of both their ranks. */
static void test_sim_faults_cluster_crash_instance(void **state)
{
    (void)state;
    sim_scenario_config_t c = three_prefills(2);
    for (int64_t k = 0; k < 2; k++)
        add(&c, (sim_fault_t){.kind = SIM_FAULT_CRASH, .role = KVS_ROLE_PREFILL,
                              .instance = 1, .rank = k, .at_ns = 60 * MS});
    sim_report_t r = run(&c, "crash prefill instance 1 at 60 ms");
    assert_int_equal(r.ranks_crashed, 2);
    assert_int_equal(r.collateral_failures, 0);
    const int failed = expect_instance_lost(1, 2, 60 * MS, "crash prefill instance 1");
    assert_true(failed > 0 && failed < NREQ / 3);
    assert_int_equal(r.requests_failed, failed);
}

/* A rank of a decode instance crashes: the requests of that decode
 * instance fail, from every prefill instance, and no other. */
static void test_sim_faults_cluster_crash_decode(void **state)
{
    (void)state;
    sim_scenario_config_t c = three_prefills(2);
    add(&c, (sim_fault_t){.kind = SIM_FAULT_CRASH, .role = KVS_ROLE_DECODE, .instance = 0,
                          .rank = 1, .at_ns = 60 * MS});
    sim_report_t r = run(&c, "crash d1@0 at 60 ms");
    assert_int_equal(r.collateral_failures, 0);
    int failed = 0;
    for (int i = 0; i < NREQ; i++) {
        const sim_request_outcome_t *o = &outcomes[i];
        const bool fails = o->decode_instance == 0 && o->done_ns >= 60 * MS;
        if (fails != (o->status != KVS_OK))
            fail_msg("crash d1@0: request %d (decode instance %u, done %.3f ms) ended %s", i,
                     o->decode_instance, o->done_ns / 1e6, kvs_status_name(o->status));
        failed += fails;
    }
    assert_true(failed > 0);
    assert_int_equal(r.instance[4].requests_failed, 0); /* decode instance 1 */
}

/* A rank whose HBM is full cannot allocate its staging memory: it says so,
 * naming what to change, stays down, and every request fails cleanly. */
static void test_sim_faults_hbm_full(void **state)
{
    (void)state;
    const struct {
        kvs_role_t role;
        int64_t rank;
        const char *name, *knob;
    } cases[] = {{KVS_ROLE_DECODE, 0, "d0.0", "--ring-mib"},
                 {KVS_ROLE_PREFILL, 1, "p1.0", "--chunk-tokens"}};
    for (size_t k = 0; k < 2; k++) {
        sim_scenario_config_t c = cluster();
        c.requests = 8;
        add(&c, (sim_fault_t){.kind = SIM_FAULT_HBM_FULL, .role = cases[k].role,
                              .rank = cases[k].rank});
        sim_report_t r;
        char err[256];
        memset(outcomes, 0, sizeof outcomes);
        assert_int_equal(sim_scenario_run(&c, &r, err, sizeof err), KVS_OK);
        assert_int_equal(r.violations, 0);
        assert_int_equal(r.ranks_down_at_start, 1);
        assert_int_equal(r.requests_failed, 8);
        assert_non_null(strstr(r.init_error, cases[k].name));
        assert_non_null(strstr(r.init_error, cases[k].knob));
        assert_non_null(strstr(r.init_error, "HBM"));
        for (int i = 0; i < 8; i++)
            assert_int_not_equal(outcomes[i].status, KVS_OK);
    }
}

/* ---- a hostile writer (region-scoped keys, docs/security.md) ---------- */

/* p1 sends one staged write astray: under the key of a region freed
 * since (stale), or past its own bytes (outside). The fabric refuses it:
 * exactly one request fails (KVS_EREMOTE), nothing of the write lands,
 * every grant is revoked. On a fabric without key_grant (whole-ring key)
 * the same write lands: a violation, what the scoped keys stop. */
static void test_sim_faults_hostile_write(void **state)
{
    (void)state;
    const sim_hostile_t modes[] = {SIM_HOSTILE_STALE, SIM_HOSTILE_OUTSIDE};
    for (size_t k = 0; k < 2; k++) {
        sim_scenario_config_t c = cluster();
        add(&c, (sim_fault_t){.kind = SIM_FAULT_HOSTILE_WRITE, .role = KVS_ROLE_PREFILL,
                              .rank = 1, .at_ns = 20 * MS, .hostile = modes[k]});
        const char *what = k == 0 ? "hostile write, stale key" : "hostile write, outside";
        sim_report_t r = run(&c, what);
        assert_int_equal(r.hostile_writes, 1);
        assert_int_equal(r.hostile_bytes_landed, 0);
        assert_int_equal(r.requests_failed, 1);
        assert_true(r.keys_granted > 0);
        assert_int_equal(r.keys_granted, r.keys_revoked);
        assert_int_equal(r.keys_leaked, 0);
        for (int i = 0; i < NREQ; i++)
            assert_true(outcomes[i].status == KVS_OK || outcomes[i].status == KVS_EREMOTE);

        c.net.no_key_grant = true;
        char err[256];
        memset(outcomes, 0, sizeof outcomes);
        assert_int_equal(sim_scenario_run(&c, &r, err, sizeof err), KVS_OK);
        assert_int_equal(r.hostile_writes, 1);
        assert_int_equal(r.keys_granted, 0);
        if (r.hostile_bytes_landed == 0 || r.violations == 0)
            fail_msg("%s without key_grant: %llu bytes landed, %llu violations", what,
                     (unsigned long long)r.hostile_bytes_landed,
                     (unsigned long long)r.violations);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_faults_drop_each_type),
        cmocka_unit_test(test_sim_faults_drop_abort),
        cmocka_unit_test(test_sim_faults_dup),
        cmocka_unit_test(test_sim_faults_delay),
        cmocka_unit_test(test_sim_faults_write_error),
        cmocka_unit_test(test_sim_faults_slow_scatter),
        cmocka_unit_test(test_sim_faults_link_down_short),
        cmocka_unit_test(test_sim_faults_link_down_long),
        cmocka_unit_test(test_sim_faults_crash_decode),
        cmocka_unit_test(test_sim_faults_crash_prefill),
        cmocka_unit_test(test_sim_faults_restart_decode),
        cmocka_unit_test(test_sim_faults_restart_prefill),
        cmocka_unit_test(test_sim_faults_hbm_full),
        cmocka_unit_test(test_sim_faults_cluster_crash_one_rank),
        cmocka_unit_test(test_sim_faults_cluster_crash_instance),
        cmocka_unit_test(test_sim_faults_cluster_crash_decode),
        cmocka_unit_test(test_sim_faults_hostile_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
