/*
 * test_sim_protocol.c - the staging protocol end to end on the simulator:
 * the real core on simulated GPUs and NICs, every received byte checked.
 * Each scenario must end with every request ok, no corrupt byte and no ring
 * byte leaked; the seed is printed so a failure replays.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scenario.h"

/* A small Llama-like shape so each scenario runs in well under a second. */
static sim_scenario_config_t small(int64_t p, int64_t d, int64_t heads)
{
    sim_scenario_config_t c;
    memset(&c, 0, sizeof c);
    c.shape = (kvs_layout_params_t){.total_heads = heads, .head_dim = 64,
                                    .dtype = KVS_DTYPE_BF16, .layers = 4, .page_size = 16,
                                    .prefill_tp = p, .decode_tp = d, .chunk_tokens = 256};
    c.requests = 8;
    c.prompt_min_tokens = 32;
    c.prompt_max_tokens = 700;
    c.rate_milli_per_s = 200000; /* 200 requests/s */
    c.ring_bytes = 8u << 20;
    c.staging = true;
    c.max_inflight = 4;
    c.seed = 42;
    return c;
}

static sim_report_t run_ok(const sim_scenario_config_t *c, const char *what)
{
    sim_report_t r;
    char err[256];
    int rc = sim_scenario_run(c, &r, err, sizeof err);
    if (rc != KVS_OK || r.requests_ok != r.requests_total || r.corrupt_bytes != 0 ||
        r.ring_leaked_bytes != 0 || r.bytes_verified == 0 || r.hung_requests != 0 ||
        r.unreported_failures != 0 || r.violations != 0)
        fail_msg("%s (seed %llu): rc %s (%s), ok %u/%u, corrupt %llu, leaked %llu, "
                 "verified %llu", what, (unsigned long long)c->seed, kvs_status_name(rc), err,
                 r.requests_ok, r.requests_total, (unsigned long long)r.corrupt_bytes,
                 (unsigned long long)r.ring_leaked_bytes, (unsigned long long)r.bytes_verified);
    return r;
}

static void test_sim_protocol_p_gt_d(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    sim_report_t r = run_ok(&c, "P4 -> D2");
    assert_int_equal(r.path, KVS_PATH_STAGING);
    assert_int_equal(r.bytes_moved, r.bytes_verified);
}

static void test_sim_protocol_p_lt_d(void **state)
{
    sim_scenario_config_t c = small(2, 4, 8);
    run_ok(&c, "P2 -> D4");
}

static void test_sim_protocol_replicated_heads_on_prefill(void **state)
{
    /* H2 over prefill TP 8: four prefill ranks hold each head; each
     * decode rank receives its head once, from the first of them (the
     * other three report without writing). */
    sim_scenario_config_t c = small(8, 2, 2);
    sim_report_t r = run_ok(&c, "H2 P8 -> D2");
    assert_int_equal(r.bytes_moved, r.bytes_verified);
    /* H4 over P8 -> D2: pairs hold a head; writers 0 and 2 of each four */
    c = small(8, 2, 4);
    r = run_ok(&c, "H4 P8 -> D2");
    assert_int_equal(r.bytes_moved, r.bytes_verified);
    /* and with prefill PP on the decode's unstaged region */
    c.shape.prefill_pp = 2;
    r = run_ok(&c, "H4 P8xPP2 -> D2");
    assert_int_equal(r.bytes_moved, r.bytes_verified);
}

static void test_sim_protocol_replicated_heads_on_decode(void **state)
{
    sim_scenario_config_t c = small(2, 8, 2);
    run_ok(&c, "H2 P2 -> D8");
    c = small(2, 8, 4); /* decode ranks 2k, 2k+1 share head k */
    run_ok(&c, "H4 P2 -> D8");
}

static void test_sim_protocol_prefill_pp(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.shape.prefill_pp = 2; /* decode PP 1: each chunk waits for 2 x 2 writers */
    sim_report_t r = run_ok(&c, "P4xPP2 -> D2");
    assert_int_equal(r.prefill_ranks, 8);
    c.shape.decode_pp = 2;
    run_ok(&c, "P4xPP2 -> D2xPP2");
}

/* Uneven pipeline splits (spec §4): 80 layers over prefill TP 8 x PP 3
 * (26 / 27 / 27) into decode TP 2 with PP 1 (each chunk waits for 4 TP
 * writers x 3 stages, each writing its layers into their global slots) and
 * with PP 3 (stage e into decode stage e). Every byte the decode ranks hold
 * is verified: as many as a run without PP of the same workload moves. */
static void test_sim_protocol_uneven_prefill_pp(void **state)
{
    sim_scenario_config_t c = small(8, 2, 8);
    c.shape.layers = 80;
    c.shape.head_dim = 16;
    c.requests = 6;
    const sim_report_t even = run_ok(&c, "80 layers, P8 -> D2");
    c.shape.prefill_pp = 3;
    sim_report_t r = run_ok(&c, "80 layers, P8xPP3 -> D2");
    assert_int_equal(r.prefill_ranks, 24);
    assert_int_equal(r.bytes_verified, even.bytes_verified);
    assert_int_equal(r.bytes_moved, r.bytes_verified);
    c.shape.decode_pp = 3;
    r = run_ok(&c, "80 layers, P8xPP3 -> D2xPP3");
    assert_int_equal(r.bytes_verified, even.bytes_verified);
    assert_int_equal(r.bytes_moved, r.bytes_verified);
    /* P < D, each prefill rank feeding two decode ranks; 7 layers over 4
     * stages (1 / 2 / 2 / 2), and the slice path's per-layer writes. */
    c = small(2, 4, 8);
    c.shape.layers = 7;
    const sim_report_t even7 = run_ok(&c, "7 layers, P2 -> D4");
    c.shape.prefill_pp = 4;
    r = run_ok(&c, "7 layers, P2xPP4 -> D4");
    assert_int_equal(r.bytes_verified, even7.bytes_verified);
    c.shape.decode_pp = 4;
    r = run_ok(&c, "7 layers, P2xPP4 -> D4xPP4");
    assert_int_equal(r.bytes_verified, even7.bytes_verified);
    c.path = KVS_PATH_SLICE;
    r = run_ok(&c, "7 layers, P2xPP4 -> D4xPP4 slice");
    assert_int_equal(r.bytes_verified, even7.bytes_verified);
}

static void test_sim_protocol_ring_wraps_often(void **state)
{
    /* A full chunk region here is 1 MiB: a 3 MiB ring wraps every 3 chunks
     * and prefill must wait for the watermark. */
    sim_scenario_config_t c = small(4, 2, 8);
    c.ring_bytes = 3u << 20;
    c.requests = 16;
    c.rate_milli_per_s = 0;
    c.prefill_tokens_per_s = 10000000;
    sim_report_t r = run_ok(&c, "3-chunk ring");
    /* Assignment overcommits into the previous round (spec §6), so live
     * bytes exceed the ring; the readiness wait keeps the data intact. */
    assert_true(r.watermark_waits > 0);
    assert_true(r.ring_peak_bytes > 3u << 20);
}

static void test_sim_protocol_ring_exactly_one_chunk(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.ring_bytes = 1u << 20; /* 256 tokens x 4 heads x 64 x 2 B x 4 layers x 2 */
    c.requests = 6;
    run_ok(&c, "1-chunk ring");
}

static void test_sim_protocol_mixed_sizes_and_prefix(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.prompt_min_tokens = 1;
    c.prompt_max_tokens = 2000;
    c.prefix_max_tokens = 512; /* cached prefixes, page aligned */
    c.requests = 24;
    run_ok(&c, "mixed sizes with prefixes");
}

static void test_sim_protocol_many_concurrent(void **state)
{
    sim_scenario_config_t c = small(2, 4, 8);
    c.requests = 120;
    c.max_inflight = 128;
    c.rate_milli_per_s = 0; /* all at once */
    c.prompt_max_tokens = 300;
    c.ring_bytes = 64u << 20;
    run_ok(&c, "120 concurrent");
}

static void test_sim_protocol_direct_path(void **state)
{
    sim_scenario_config_t c = small(2, 2, 8);
    sim_report_t r = run_ok(&c, "P2 -> D2 direct");
    assert_int_equal(r.path, KVS_PATH_DIRECT);
}

static void test_sim_protocol_deterministic(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.prefix_max_tokens = 64;
    sim_report_t a = run_ok(&c, "run a");
    sim_report_t b = run_ok(&c, "run b");
    assert_memory_equal(&a, &b, sizeof a);
    c.seed = 43;
    sim_report_t d = run_ok(&c, "other seed");
    assert_int_not_equal(a.digest, d.digest);
}

/* ---- clusters (spec §12) --------------------------------------------------- */

/* Three prefill instances (TP 8, 8, 4) and two decode instances (TP 2, 2),
 * the topology of the clusters issue, on the small shape: rooms of
 * instances of different TP share each decode ring. */
static sim_scenario_config_t five_instances(uint32_t requests)
{
    sim_scenario_config_t c = small(8, 2, 8);
    c.topo = (sim_topology_t){.prefill_instances = 3, .decode_instances = 2,
                              .prefill = {{8, 1}, {8, 1}, {4, 1}},
                              .decode = {{2, 1}, {2, 1}}};
    c.requests = requests;
    return c;
}

static void test_sim_protocol_cluster_all_ok(void **state)
{
    sim_scenario_config_t c = five_instances(30);
    c.rate_milli_per_s = 0;
    sim_request_outcome_t out[30];
    c.outcomes = out;
    sim_report_t r = run_ok(&c, "3P2D");
    assert_int_equal(r.bytes_moved, r.bytes_verified);
    assert_int_equal(r.prefill_ranks, 20);
    assert_int_equal(r.decode_ranks, 4);
    assert_int_equal(r.instances, 5);
    const int64_t tps[5] = {8, 8, 4, 2, 2};
    uint64_t written = 0, received = 0, peak = 0;
    for (uint32_t k = 0; k < 5; k++) {
        const sim_instance_report_t *ir = &r.instance[k];
        const bool decode = k >= 3;
        assert_int_equal(ir->role, decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL);
        assert_int_equal(ir->id, decode ? k - 3 : k);
        assert_int_equal(ir->tp, tps[k]);
        assert_int_equal(ir->pp, 1);
        assert_int_equal(ir->requests_ok, decode ? 15 : 10); /* round robin */
        assert_int_equal(ir->requests_failed, 0);
        assert_true(ir->bytes > 0);
        *(decode ? &received : &written) += ir->bytes;
        assert_true(decode ? ir->ring_peak_bytes > 0 : ir->ring_peak_bytes == 0);
        peak = ir->ring_peak_bytes > peak ? ir->ring_peak_bytes : peak;
    }
    assert_int_equal(written, r.bytes_moved);
    assert_int_equal(received, r.bytes_verified);
    assert_int_equal(peak, r.ring_peak_bytes);
    for (uint32_t i = 0; i < c.requests; i++) {
        assert_int_equal(out[i].prefill_instance, i % 3);
        assert_int_equal(out[i].decode_instance, i % 2);
        assert_int_equal(out[i].ranks, (i % 3 == 2 ? 4 : 8) + 2);
        assert_int_equal(out[i].ranks_ok, out[i].ranks);
    }
}

/* Mixed PP, uneven splits (5 layers over 2 and 3 stages) and a decode
 * instance of PP 2 next to one of PP 1: every prefill instance of PP 2. */
static void test_sim_protocol_cluster_mixed_pp(void **state)
{
    sim_scenario_config_t c = small(2, 1, 8);
    c.shape.layers = 5;
    c.shape.prefill_pp = 2;
    c.topo = (sim_topology_t){.prefill_instances = 2, .decode_instances = 2,
                              .prefill = {{2, 2}, {4, 2}}, .decode = {{1, 1}, {2, 2}}};
    run_ok(&c, "PP 2 prefills, PP 1 and 2 decodes");
    c = small(2, 1, 8);
    c.shape.layers = 5;
    c.topo = (sim_topology_t){.prefill_instances = 3, .decode_instances = 2,
                              .prefill = {{2, 1}, {4, 2}, {1, 3}}, .decode = {{1, 1}, {2, 1}}};
    c.requests = 12;
    run_ok(&c, "PP 1, 2, 3 prefills, PP 1 decodes");
}

/* A topology where some pair cannot pair is refused, naming the pair. */
static void test_sim_protocol_cluster_refused(void **state)
{
    sim_scenario_config_t c = small(2, 1, 8);
    c.topo = (sim_topology_t){.prefill_instances = 2, .decode_instances = 2,
                              .prefill = {{2, 2}, {2, 1}}, .decode = {{1, 1}, {2, 2}}};
    c.shape.prefill_pp = 2;
    sim_report_t r;
    char err[256];
    assert_int_equal(sim_scenario_run(&c, &r, err, sizeof err), KVS_EPP_SPLIT);
    assert_non_null(strstr(err, "decode instance 1 (PP 2) cannot pair with prefill instance 1"));
    c.topo.decode[1].pp = 1;
    c.topo.prefill[0].tp = 4; /* not the shape's instance 0 */
    assert_int_equal(sim_scenario_run(&c, &r, err, sizeof err), KVS_EINVAL);
    assert_non_null(strstr(err, "prefill instance 0"));
}

/* Least loaded: at its arrival every request goes to the instance of each
 * side with the fewest requests in flight (arrived, not ended), ties to
 * the lowest index. Checked against the outcomes, and the run must have
 * preferred an idle instance over round robin's turn at least once. */
static void test_sim_protocol_router_least_loaded(void **state)
{
    enum { N = 40 };
    sim_scenario_config_t c = small(4, 2, 8);
    c.topo = (sim_topology_t){.prefill_instances = 3, .decode_instances = 2,
                              .prefill = {{4, 1}, {2, 1}, {4, 1}}, .decode = {{2, 1}, {1, 1}}};
    c.requests = N;
    c.prompt_min_tokens = 16;
    c.prompt_max_tokens = 2048; /* some prefills take 8x longer than others */
    c.rate_milli_per_s = 40000;
    c.max_inflight = 8;
    c.router = SIM_ROUTER_LEAST_LOADED;
    sim_request_outcome_t out[N];
    c.outcomes = out;
    run_ok(&c, "least loaded");
    int preferred = 0;
    for (int side = 0; side < 2; side++) {
        const uint32_t n = side == 0 ? 3 : 2;
        for (uint32_t i = 0; i < N; i++) {
            uint32_t load[3] = {0, 0, 0};
            bool tie = false;
            for (uint32_t j = 0; j < i; j++) {
                tie = tie || out[j].done_ns == out[i].arrival_ns;
                if (out[j].done_ns > out[i].arrival_ns)
                    load[side == 0 ? out[j].prefill_instance : out[j].decode_instance]++;
            }
            if (tie)
                continue; /* an end at the very arrival: either order is fair */
            uint32_t want = 0;
            for (uint32_t k = 1; k < n; k++)
                if (load[k] < load[want])
                    want = k;
            const uint32_t got = side == 0 ? out[i].prefill_instance : out[i].decode_instance;
            if (got != want)
                fail_msg("request %u went to %s instance %u, loads %u %u %u: want %u", i,
                         side == 0 ? "prefill" : "decode", got, load[0], load[1], load[2],
                         want);
            preferred += got != i % n;
        }
    }
    assert_true(preferred > 0);
}

/* Round robin: each side's instances in turn, whatever their load. */
static void test_sim_protocol_router_round_robin(void **state)
{
    enum { N = 20 };
    sim_scenario_config_t c = small(4, 2, 8);
    c.topo = (sim_topology_t){.prefill_instances = 3, .decode_instances = 2,
                              .prefill = {{4, 1}, {2, 1}, {4, 1}}, .decode = {{2, 1}, {1, 1}}};
    c.requests = N;
    c.prompt_max_tokens = 2048;
    c.rate_milli_per_s = 40000;
    sim_request_outcome_t out[N];
    c.outcomes = out;
    sim_report_t r = run_ok(&c, "round robin");
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(out[i].prefill_instance, i % 3);
        assert_int_equal(out[i].decode_instance, i % 2);
    }
    assert_int_equal(r.instance[0].requests_ok, 7);
    assert_int_equal(r.instance[2].requests_ok, 6);
    assert_int_equal(r.instance[3].requests_ok, 10);
}

static void test_sim_protocol_staging_beats_slice(void **state)
{
    /* Transfer-bound: everything arrives at once and prefill is instant. */
    sim_scenario_config_t c = small(4, 2, 8);
    c.requests = 12;
    c.rate_milli_per_s = 0;
    c.prefill_tokens_per_s = 1000000000;
    c.ring_bytes = 16u << 20;
    sim_report_t staged = run_ok(&c, "staging");
    c.path = KVS_PATH_SLICE;
    sim_report_t sliced = run_ok(&c, "slice");
    assert_int_equal(staged.path, KVS_PATH_STAGING);
    assert_int_equal(sliced.path, KVS_PATH_SLICE);
    assert_int_equal(staged.bytes_verified, sliced.bytes_verified);
    if (staged.rdma_ops * 50 > sliced.rdma_ops || staged.goodput_gbps <= sliced.goodput_gbps)
        fail_msg("staging %llu ops %.2f Gb/s vs slice %llu ops %.2f Gb/s",
                 (unsigned long long)staged.rdma_ops, staged.goodput_gbps,
                 (unsigned long long)sliced.rdma_ops, sliced.goodput_gbps);
}

static void test_sim_protocol_trace_has_every_span_kind(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.ring_bytes = 3u << 20; /* waits for the watermark happen */
    c.requests = 10;
    c.rate_milli_per_s = 0;
    c.prefill_tokens_per_s = 10000000;
    char path[] = "/tmp/kvstage-trace-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    c.trace_path = path;
    run_ok(&c, "traced");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 22];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(path);
    assert_true(strncmp(buf, "{\"displayTimeUnit\"", 18) == 0);
    assert_non_null(strstr(buf, "\"name\":\"gather\""));
    assert_non_null(strstr(buf, "\"name\":\"write\""));
    assert_non_null(strstr(buf, "\"name\":\"scatter\""));
    assert_non_null(strstr(buf, "\"name\":\"wait-for-watermark\""));
    assert_non_null(strstr(buf, "\"name\":\"transfer\""));
    assert_non_null(strstr(buf, "\"args\":{\"name\":\"d1.0\"}"));
    assert_non_null(strstr(buf, "]}\n"));
}

/* Faults: the run must end with every request terminal, nothing leaked or
 * corrupt and no unreported failure, whatever else fails. */
static sim_report_t run_faulted(sim_scenario_config_t *c, const char *what)
{
    sim_report_t r;
    char err[256];
    c->requests = 16;
    c->stall_timeout_ns = 1000000000; /* 1 s: well above any healthy wait here */
    int rc = sim_scenario_run(c, &r, err, sizeof err);
    if (rc != KVS_OK || r.violations != 0 || r.requests_ok + r.requests_failed != r.requests_total)
        fail_msg("%s (seed %llu): rc %s (%s), ok %u failed %u hung %u unreported %u "
                 "leaked %llu corrupt %llu", what, (unsigned long long)c->seed,
                 kvs_status_name(rc), err, r.requests_ok, r.requests_failed, r.hung_requests,
                 r.unreported_failures, (unsigned long long)r.ring_leaked_bytes,
                 (unsigned long long)r.corrupt_bytes);
    return r;
}

static void test_sim_protocol_fault_dup_and_delay_are_harmless(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.nfaults = 2;
    c.faults[0] = (sim_fault_t){.kind = SIM_FAULT_DUP, .num = 20, .den = 100};
    c.faults[1] = (sim_fault_t){.kind = SIM_FAULT_DELAY, .num = 10, .den = 100,
                                .delay_ns = 2000000};
    sim_report_t r = run_faulted(&c, "dup 20% + delay 10%");
    assert_int_equal(r.requests_ok, r.requests_total); /* duplicates are recognised */
    assert_true(r.msgs_duplicate > 0);
}

/* Lost control messages are sent again until acknowledged: every request
 * still succeeds, at 5% and at 20% loss of every type. */
static void test_sim_protocol_fault_drop_is_recovered(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.nfaults = 1;
    c.faults[0] = (sim_fault_t){.kind = SIM_FAULT_DROP, .num = 5, .den = 100};
    sim_report_t r = run_faulted(&c, "drop 5%");
    assert_int_equal(r.requests_ok, r.requests_total);
    assert_true(r.msgs_retransmitted > 0);
    c.faults[0].num = 20;
    r = run_faulted(&c, "drop 20%");
    assert_int_equal(r.requests_ok, r.requests_total);
    assert_int_equal(r.peers_lost, 0);
}

static void test_sim_protocol_fault_write_errors(void **state)
{
    sim_scenario_config_t c = small(2, 4, 8);
    c.nfaults = 1;
    c.faults[0] = (sim_fault_t){.kind = SIM_FAULT_WRITE_ERROR, .num = 10, .den = 100};
    sim_report_t r = run_faulted(&c, "write errors 10%");
    assert_true(r.requests_failed > 0 && r.requests_ok > 0);
}

static void test_sim_protocol_fault_slow_scatter(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.nfaults = 1;
    c.faults[0] = (sim_fault_t){.kind = SIM_FAULT_SLOW_SCATTER, .role = KVS_ROLE_DECODE,
                                 .rank = 0, .factor = 20};
    sim_report_t r = run_faulted(&c, "slow scatter x20 on d0");
    assert_int_equal(r.requests_ok, r.requests_total);
}

/* ---- send queues that fill (net.sq_depth) ------------------------------- */

/* c as a transfer of many chunks (prompts of 8 to 16 chunks of 256
 * tokens), run with unlimited send queues, then with 1 and 2 work requests
 * per connection: the fabric refuses the posts beyond them (KVS_EAGAIN)
 * and the core must post them again. Every request succeeds with every
 * byte verified, each write goes out exactly once (as many RDMA writes as
 * unlimited), and refusals did happen (else the run proves nothing). */
static void sq_depth_runs(sim_scenario_config_t c, int64_t min_tokens, int64_t max_tokens,
                          const char *what)
{
    c.prompt_min_tokens = min_tokens;
    c.prompt_max_tokens = max_tokens;
    char name[128];
    snprintf(name, sizeof name, "%s, send queues unlimited", what);
    const sim_report_t ref = run_ok(&c, name);
    assert_int_equal(ref.posts_refused, 0);
    for (uint32_t depth = 1; depth <= 2; depth++) {
        c.net.sq_depth = depth;
        snprintf(name, sizeof name, "%s, sq_depth %u", what, depth);
        const sim_report_t r = run_ok(&c, name);
        if (r.posts_refused == 0)
            fail_msg("%s: no post was refused", name);
        if (r.bytes_verified != ref.bytes_verified || r.bytes_moved != ref.bytes_moved ||
            r.rdma_ops != ref.rdma_ops)
            fail_msg("%s: %llu bytes moved, %llu verified in %llu writes; unlimited: %llu, "
                     "%llu in %llu", name, (unsigned long long)r.bytes_moved,
                     (unsigned long long)r.bytes_verified, (unsigned long long)r.rdma_ops,
                     (unsigned long long)ref.bytes_moved,
                     (unsigned long long)ref.bytes_verified, (unsigned long long)ref.rdma_ops);
    }
}

static void test_sim_protocol_sq_depth_staging(void **state)
{
    sq_depth_runs(small(4, 2, 8), 2048, 4096, "P4 -> D2 staging");
    sq_depth_runs(small(2, 4, 8), 2048, 4096, "P2 -> D4 staging"); /* two targets each */
}

/* Prefill PP 2 into decode PP 1: a chunk is two writes (K and V layers of
 * the stage), and the second may be refused after the first went out. */
static void test_sim_protocol_sq_depth_prefill_pp(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.shape.prefill_pp = 2;
    sq_depth_runs(c, 2048, 4096, "P4xPP2 -> D2 staging");
    c.shape.decode_pp = 2;
    sq_depth_runs(c, 2048, 4096, "P4xPP2 -> D2xPP2 staging");
    c.shape.layers = 5; /* 2 / 3 layers: the K and V writes of unequal stages */
    c.shape.decode_pp = 1;
    sq_depth_runs(c, 2048, 4096, "5 layers, P4xPP2 -> D2 staging");
}

static void test_sim_protocol_sq_depth_direct_and_slice(void **state)
{
    sq_depth_runs(small(2, 2, 8), 2048, 4096, "P2 -> D2 direct");
    sim_scenario_config_t c = small(4, 2, 8);
    c.path = KVS_PATH_SLICE; /* a write per token, layer and K/V */
    c.requests = 4;
    sq_depth_runs(c, 256, 512, "P4 -> D2 slice");
}

/* Refused posts and failing writes together: a room that fails while a
 * gathered chunk waits to be posted again (none of its writes out, or the
 * K write out and the V write refused with prefill PP) releases its
 * buffer, at once or at the K write's completion: no leak, no hang. */
static void test_sim_protocol_sq_depth_with_write_errors(void **state)
{
    for (int64_t pp = 1; pp <= 2; pp++) {
        sim_scenario_config_t c = small(4, 2, 8);
        c.shape.prefill_pp = pp;
        c.prompt_min_tokens = 2048;
        c.prompt_max_tokens = 4096;
        c.prefill_tokens_per_s = 100000000; /* chunks gathered back to back */
        c.net.sq_depth = 1;
        c.nfaults = 1;
        c.faults[0] = (sim_fault_t){.kind = SIM_FAULT_WRITE_ERROR, .num = 5, .den = 100};
        sim_report_t r = run_faulted(&c, pp == 1 ? "sq_depth 1, write errors 5%"
                                                 : "sq_depth 1, PP 2, write errors 5%");
        assert_true(r.requests_failed > 0);
        assert_true(r.posts_refused > 0);
    }
}

/* Refused posts and lost control messages together: retransmissions meet
 * full send queues (a pass stops at its first refusal and goes on at the
 * next timeout) and every request still succeeds. */
static void test_sim_protocol_sq_depth_with_drops(void **state)
{
    sim_scenario_config_t c = small(4, 2, 8);
    c.prompt_min_tokens = 2048;
    c.prompt_max_tokens = 4096;
    c.net.sq_depth = 1;
    c.nfaults = 1;
    c.faults[0] = (sim_fault_t){.kind = SIM_FAULT_DROP, .num = 20, .den = 100};
    sim_report_t r = run_faulted(&c, "sq_depth 1, drop 20%");
    assert_int_equal(r.requests_ok, r.requests_total);
    assert_true(r.posts_refused > 0 && r.msgs_retransmitted > 0);
}

/* Regions and writer blocks past 4 GiB (issue 25 item 8): 10 KV heads of
 * dim 256, 128 layers, P2 -> D1, 8192-token chunks: each writer's block
 * is 5 GiB, a region 10 GiB, on a fabric that takes at most 2^31 bytes a
 * write (a port's max_msg_sz on rxe and mlx5), so each block goes as 3
 * pieces. Provenance mode holds no KV bytes, so the run stays small, and
 * every KV slot of every layer is still checked. With prefill PP 2 into a
 * decode of PP 1, each stage writes its K and V layers apart (1.25 GiB
 * each), here on a fabric of 1 GiB writes: 2 pieces each. */
static void test_sim_protocol_regions_past_4gib(void **state)
{
    for (int64_t pp = 1; pp <= 2; pp++) {
        sim_scenario_config_t c = small(2, 1, 10);
        c.shape.head_dim = 256;
        c.shape.layers = 128;
        c.shape.chunk_tokens = 8192;
        c.shape.prefill_pp = pp;
        c.requests = 2;
        c.prompt_min_tokens = 8192 + 100; /* a full chunk and a short one */
        c.prompt_max_tokens = 8192 + 100;
        c.ring_bytes = UINT64_C(24) << 30;
        c.gpu.data_mode = SIM_DATA_PROVENANCE;
        c.net.max_write_bytes = UINT64_C(1) << (pp == 1 ? 31 : 30);
        sim_report_t r = run_ok(&c, pp == 1 ? "5 GiB writers, pieces of 2 GiB"
                                            : "5 GiB writers, PP 2, pieces of 1 GiB");
        assert_int_equal(r.bytes_moved, r.bytes_verified);
        const uint64_t layer = 100 * 5 * 256 * 2; /* of a short chunk, per writer */
        assert_int_equal(r.bytes_verified, 2 * ((UINT64_C(10) << 30) + 2 * 128 * 2 * layer));
        /* full chunks: 3 pieces per writer (PP 2: 2 + 2 per stage); short
         * ones: one per span */
        const uint64_t per_full = pp == 1 ? 2 * 3 : 2 * 2 * 4;
        const uint64_t per_short = pp == 1 ? 2 : 2 * 2 * 2;
        assert_int_equal(r.rdma_ops, 2 * (per_full + per_short));
    }
}

/* A write size limit with write errors: pieces of 4 KiB, some of them
 * fail; every run ends with no request hung, no ring byte leaked and no
 * corrupt byte, whichever piece failed. */
static void test_sim_protocol_pieces_with_write_errors(void **state)
{
    for (int64_t pp = 1; pp <= 2; pp++) {
        sim_scenario_config_t c = small(4, 2, 8);
        c.shape.prefill_pp = pp;
        c.net.max_write_bytes = 4096;
        c.nfaults = 1;
        /* about 128 pieces a chunk per writer: one write in 2000 fails some
         * requests, not all */
        c.faults[0] = (sim_fault_t){.kind = SIM_FAULT_WRITE_ERROR, .num = 1, .den = 2000};
        sim_report_t r = run_faulted(&c, pp == 1 ? "4 KiB pieces, write errors 0.05%"
                                                 : "4 KiB pieces, PP 2, write errors 0.05%");
        assert_true(r.requests_failed > 0);
        assert_true(r.requests_ok > 0);
    }
    sim_scenario_config_t c = small(4, 2, 8);
    c.net.max_write_bytes = 4096;
    sim_report_t r = run_ok(&c, "4 KiB pieces");
    assert_int_equal(r.bytes_moved, r.bytes_verified);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_protocol_p_gt_d),
        cmocka_unit_test(test_sim_protocol_p_lt_d),
        cmocka_unit_test(test_sim_protocol_replicated_heads_on_prefill),
        cmocka_unit_test(test_sim_protocol_replicated_heads_on_decode),
        cmocka_unit_test(test_sim_protocol_prefill_pp),
        cmocka_unit_test(test_sim_protocol_uneven_prefill_pp),
        cmocka_unit_test(test_sim_protocol_ring_wraps_often),
        cmocka_unit_test(test_sim_protocol_ring_exactly_one_chunk),
        cmocka_unit_test(test_sim_protocol_mixed_sizes_and_prefix),
        cmocka_unit_test(test_sim_protocol_many_concurrent),
        cmocka_unit_test(test_sim_protocol_direct_path),
        cmocka_unit_test(test_sim_protocol_deterministic),
        cmocka_unit_test(test_sim_protocol_cluster_all_ok),
        cmocka_unit_test(test_sim_protocol_cluster_mixed_pp),
        cmocka_unit_test(test_sim_protocol_cluster_refused),
        cmocka_unit_test(test_sim_protocol_router_least_loaded),
        cmocka_unit_test(test_sim_protocol_router_round_robin),
        cmocka_unit_test(test_sim_protocol_staging_beats_slice),
        cmocka_unit_test(test_sim_protocol_trace_has_every_span_kind),
        cmocka_unit_test(test_sim_protocol_fault_dup_and_delay_are_harmless),
        cmocka_unit_test(test_sim_protocol_fault_drop_is_recovered),
        cmocka_unit_test(test_sim_protocol_fault_write_errors),
        cmocka_unit_test(test_sim_protocol_fault_slow_scatter),
        cmocka_unit_test(test_sim_protocol_sq_depth_staging),
        cmocka_unit_test(test_sim_protocol_sq_depth_prefill_pp),
        cmocka_unit_test(test_sim_protocol_sq_depth_direct_and_slice),
        cmocka_unit_test(test_sim_protocol_sq_depth_with_write_errors),
        cmocka_unit_test(test_sim_protocol_sq_depth_with_drops),
        cmocka_unit_test(test_sim_protocol_regions_past_4gib),
        cmocka_unit_test(test_sim_protocol_pieces_with_write_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
