/*
 * test_sim_context_parallel.c - prefill context parallelism in the
 * simulator (docs/kinds/context-parallel.md): every prefill instance has CP
 * ranks, each of the instance's TP x PP, each computing and holding one
 * token range of a request (kvs_layout_cp_range) in its own KV pool, all
 * writing into the decode's regions on the staging path.
 *
 * - Every slot moves, verified in both data modes (the same report, bit
 *   for bit, 0 corrupt): P4 CP2 -> D2, P2 CP4 -> D4, P2 CP3 -> D2, equal TP
 *   on the staging path, replicated heads, prefill PP with CP (to decode
 *   PP 1 and 2), MLA with CP (with PP too), two page sizes, FP8 scale
 *   planes, the direct and slice paths (GQA and MLA), cached prefixes, and
 *   prompts so short that CP ranks hold nothing.
 * - Planted bugs in a CP rank, through the simulated GPU's and NIC's test
 *   hooks (the core is not touched), caught as corrupt bytes in both
 *   modes: it gathers the rows of a chunk that straddles two ranges from
 *   the chunk's start instead of its range's (wrong range), or it writes
 *   its part from the region's start, where its range's first part would
 *   go without the other CP rank's rows before it (wrong offset). With
 *   region-scoped keys the wrong offset lands nowhere: the fabric refuses
 *   it and the requests fail instead.
 * - A CP rank that crashes fails its requests only and breaks no
 *   invariant; the fault names it by its index in its instance.
 * - A small ring whose regions the decode hands out as CP ranks ask, out
 *   of chunk order, and one staging buffer that a later chunk may hold
 *   while an earlier one waits: no request waits for ever.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "scenario.h"
#include "sim_run.h"

#define MS 1000000ull

/* A small Llama-like shape with prefill CP. */
static sim_scenario_config_t small_cp(int64_t p, int64_t cp, int64_t d, int64_t heads)
{
    /* (tests of the other paths set theirs) */
    return sim_run_small((kvs_layout_params_t){.total_heads = heads, .head_dim = 64,
                                               .dtype = KVS_DTYPE_BF16, .layers = 4,
                                               .page_size = 16, .prefill_tp = p,
                                               .decode_tp = d, .chunk_tokens = 256,
                                               .prefill_cp = cp},
                         8u << 20, 17);
}

/* Both modes give the same report, every request ok, every byte right. */
static sim_report_t clean_in_both(const sim_scenario_config_t *c, const char *what)
{
    const sim_report_t b = sim_run_clean_in_both(c, what);
    if (c->path != KVS_PATH_AUTO)
        assert_int_equal(b.path, c->path);
    const int64_t pp = c->shape.prefill_pp > 0 ? c->shape.prefill_pp : 1;
    assert_int_equal(b.prefill_ranks, c->shape.prefill_tp * pp * c->shape.prefill_cp);
    return b;
}

static void test_sim_cp_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t p, cp, d, heads, pp, dpp, ps, dps;
        kvs_kv_kind_t kind;
        kvs_kv_scales_t scales;
        const char *what;
        kvs_path_t path; /* 0 (auto) -> staging */
    } runs[] = {
        {4, 2, 2, 8, 1, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "P4 CP2 -> D2", KVS_PATH_AUTO},
        {2, 4, 4, 8, 1, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "P2 CP4 -> D4", KVS_PATH_AUTO},
        {2, 3, 2, 8, 1, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "P2 CP3 -> D2 (equal TP)", KVS_PATH_AUTO},
        {8, 2, 2, 4, 1, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE,
         "H4 P8 CP2 -> D2 (replicated heads)", KVS_PATH_AUTO},
        {2, 2, 2, 8, 2, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "P2xPP2 CP2 -> D2", KVS_PATH_AUTO},
        {2, 2, 2, 8, 2, 2, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "P2xPP2 CP2 -> D2xPP2", KVS_PATH_AUTO},
        {4, 2, 2, 0, 1, 1, 16, 16, KVS_KV_MLA, KVS_KV_SCALES_NONE, "MLA P4 CP2 -> D2", KVS_PATH_AUTO},
        {2, 2, 4, 0, 2, 1, 16, 16, KVS_KV_MLA, KVS_KV_SCALES_NONE, "MLA P2xPP2 CP2 -> D4", KVS_PATH_AUTO},
        {4, 2, 2, 8, 1, 1, 16, 64, KVS_KV_GQA, KVS_KV_SCALES_NONE, "pages 16 -> 64, P4 CP2 -> D2", KVS_PATH_AUTO},
        {2, 2, 4, 8, 1, 1, 64, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "pages 64 -> 16, P2 CP2 -> D4", KVS_PATH_AUTO},
        {4, 2, 2, 8, 1, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_PER_TOKEN,
         "FP8 per-token scales, P4 CP2 -> D2", KVS_PATH_AUTO},
        {2, 2, 2, 8, 1, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "P2 CP2 -> D2 direct",
         KVS_PATH_DIRECT},
        {2, 4, 2, 8, 1, 1, 16, 64, KVS_KV_GQA, KVS_KV_SCALES_NONE,
         "P2 CP4 -> D2 direct, pages 16 -> 64", KVS_PATH_DIRECT},
        {4, 2, 2, 8, 1, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "P4 CP2 -> D2 slice",
         KVS_PATH_SLICE},
        {4, 2, 2, 0, 1, 1, 16, 16, KVS_KV_MLA, KVS_KV_SCALES_NONE, "MLA P4 CP2 -> D2 slice",
         KVS_PATH_SLICE},
        {2, 2, 4, 8, 2, 1, 16, 16, KVS_KV_GQA, KVS_KV_SCALES_NONE, "P2xPP2 CP2 -> D4 slice",
         KVS_PATH_SLICE},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small_cp(runs[i].p, runs[i].cp, runs[i].d, runs[i].heads);
        c.shape.prefill_pp = runs[i].pp;
        c.shape.decode_pp = runs[i].dpp;
        c.shape.page_size = runs[i].ps;
        c.shape.decode_page_size = runs[i].dps;
        c.shape.kind = runs[i].kind;
        c.shape.kv_scales = runs[i].scales;
        if (runs[i].kind == KVS_KV_MLA)
            c.shape.head_dim = 576;
        if (runs[i].scales != KVS_KV_SCALES_NONE)
            c.shape.dtype = KVS_DTYPE_FP8;
        c.prefix_max_tokens = 320; /* cached prefixes, aligned to both page sizes */
        if (runs[i].path != KVS_PATH_AUTO) {
            c.path = runs[i].path;
            c.staging = runs[i].path != KVS_PATH_SLICE;
        }
        clean_in_both(&c, runs[i].what);
    }
}

/* A prompt of 20 tokens over CP 4 with 16-token pages: [0,16), [16,20) and
 * two CP ranks with nothing; they finish at once and every byte still
 * arrives. Against the same run without CP: the same bytes reach the
 * decode. */
static void test_sim_cp_ranks_with_nothing(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_cp(2, 4, 2, 8);
    c.prompt_min_tokens = 17;
    c.prompt_max_tokens = 40;
    const sim_report_t r = clean_in_both(&c, "P2 CP4 -> D2, prompts of 17..40 tokens");
    c.shape.prefill_cp = 1;
    const sim_report_t one = sim_run_mode(c, SIM_DATA_PROVENANCE, "the same without CP");
    assert_int_equal(r.bytes_verified, one.bytes_verified);
    assert_int_equal(one.requests_ok, c.requests);
}

/* A ring of four regions, a straddling chunk and send queues of one post
 * (the campaign's find): CP 1 asks for its chunks 6.. as CP 0 asks for
 * 0.., so the decode's ring hands out chunk 6 (both ranks write it) before
 * CP 0's chunks 2..5, whose places then wait for chunk 6 to be freed. CP 0
 * must write chunk 6 while its earlier chunks wait for the watermark;
 * before it did, each request timed out. */
static void test_sim_cp_ring_order_across_cp_ranks(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_cp(2, 2, 1, 2);
    c.shape.layers = 1;
    c.shape.page_size = 4;
    c.shape.chunk_tokens = 8; /* 100 tokens: CP 1 holds [52, 100), chunk 6 is [48, 56) */
    c.requests = 3;
    c.prompt_min_tokens = c.prompt_max_tokens = 100;
    c.ring_bytes = 4 * 8 * 2 * 64 * 2 * 2; /* four regions of 8 tokens */
    c.transfer_workers = 1;
    c.max_inflight = 1;
    c.rate_milli_per_s = 0;
    c.net.sq_depth = 1;
    c.stall_timeout_ns = 2000 * MS;
    clean_in_both(&c, "P2 CP2 -> D1, a ring of four regions, send queues of one");
}

/* With a chunk allowed past one that waits for the watermark (above), a
 * later chunk may take the one staging buffer, have its write refused by
 * a full send queue and wait to post it again, while the earlier chunk's
 * gather waits for that buffer: the scan must still reach the later
 * chunk's write (the campaign's find; before, requests timed out). */
static void test_sim_cp_buffer_held_by_a_later_chunk(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_cp(2, 4, 1, 2);
    c.shape.head_dim = 16;
    c.shape.layers = 10;
    c.shape.dtype = KVS_DTYPE_FP16;
    c.shape.page_size = 1;
    c.shape.chunk_tokens = 16;
    c.shape.prefill_pp = 3;
    c.requests = 3;
    c.prompt_min_tokens = 146;
    c.prompt_max_tokens = 393;
    c.rate_milli_per_s = 20000;
    c.max_inflight = 6;
    c.transfer_workers = 1;
    c.prefill_tokens_per_s = 262144;
    c.ring_bytes = 364337;
    c.net.link_bytes_per_s = 25000000000ull / 8;
    c.net.sq_depth = 1;
    c.stall_timeout_ns = 2000 * MS;
    c.seed = 1;
    clean_in_both(&c, "P2xPP3 CP4 -> D1, one staging buffer, send queues of one");
}

/* ---- planted bugs -------------------------------------------------------------- */

/* The run the plants strike: P4 CP2 -> D2, H8, every prompt of 1000
 * tokens, chunks of 384, no prefix: CP 1 holds [512, 1000), and the chunk
 * [384, 768) straddles the two ranges, CP 1's part of it being [512, 768).
 * The plants find that part by its length (256 tokens; CP 1's other part
 * has 232). */
typedef struct plant {
    int64_t straddle_tokens;  /* CP 1's part of the straddling chunk */
    int64_t back_tokens;      /* from its start back to the chunk's */
    int64_t writer_token_bytes; /* one TP writer's bytes per token */
    int64_t region_token_bytes; /* the region's bytes per token */
    uint32_t cp1_first_gpu, cp1_gpus; /* CP 1's GPUs (prefill ranks first) */
    uint64_t hits;
} plant_t;

static sim_scenario_config_t plant_run(plant_t *pl)
{
    sim_scenario_config_t c = small_cp(4, 2, 2, 8);
    c.shape.chunk_tokens = 384;
    c.prompt_min_tokens = c.prompt_max_tokens = 1000;
    kvs_layout_t lay;
    kvs_error_t err = {0};
    assert_int_equal(kvs_layout_init(&lay, &c.shape, &err), KVS_OK);
    int64_t start = 0, end = 0;
    assert_int_equal(kvs_layout_cp_range(&lay, 1000, 1, &start, &end), KVS_OK);
    const int64_t ts = start / lay.grid_tokens * lay.grid_tokens;
    assert_int_equal(start, 512); /* the geometry the comment above says */
    assert_int_equal(ts, 384);
    *pl = (plant_t){.straddle_tokens = ts + lay.grid_tokens - start, .back_tokens = start - ts,
                    /* 2 heads x 64 x 2 bytes x 4 layers x K and V */
                    .writer_token_bytes = 2 * 64 * 2 * 4 * 2,
                    .region_token_bytes = lay.tp_writers * 2 * 64 * 2 * 4 * 2,
                    .cp1_first_gpu = 4, .cp1_gpus = 4};
    assert_int_equal(lay.tp_writers, 2);
    c.hook_ctx = pl;
    return c;
}

/* Wrong range: CP 1 gathers its part of the straddling chunk from the
 * rows of the chunk's start, [384, 640), as if its pages began with the
 * chunk. Its page list is the room's list by token (prefill_staging.c
 * passes the list from the part's first page), so the chunk's first pages
 * are the entries just before: CP 1 never computed those rows. */
static void plant_wrong_range(void *ctx, uint32_t gpu_id, bool scatter, kvs_copy_desc_t *desc,
                              kvs_copy_part_t *parts, int64_t nparts)
{
    (void)parts;
    (void)nparts;
    plant_t *pl = ctx;
    if (scatter || gpu_id < pl->cp1_first_gpu || gpu_id >= pl->cp1_first_gpu + pl->cp1_gpus ||
        desc->tokens != pl->straddle_tokens)
        return;
    desc->pages -= pl->back_tokens / desc->page_size;
    desc->num_pages += pl->back_tokens / desc->page_size;
    pl->hits++;
}

/* Wrong offset: CP 1 places its part of the straddling chunk at its
 * range's offset (0: the range starts there) instead of the chunk's
 * (128 tokens of region in), over CP 0's rows. */
static bool plant_wrong_offset(void *ctx, const char *nic, const char *peer,
                               uint64_t *remote_addr, uint64_t *rkey, uint64_t len_bytes)
{
    (void)peer;
    (void)rkey;
    plant_t *pl = ctx;
    int tp = 0, pp = 0, cp = 0;
    if (sscanf(nic, "p%d.%dc%d", &tp, &pp, &cp) != 3 || cp != 1 ||
        len_bytes != (uint64_t)(pl->straddle_tokens * pl->writer_token_bytes))
        return false;
    *remote_addr -= (uint64_t)(pl->back_tokens * pl->region_token_bytes);
    pl->hits++;
    return true;
}

/* Runs c with the plant in both modes (sim_run_caught_in_both); without
 * it the same run is clean. */
static void caught_in_both(sim_scenario_config_t c, plant_t *pl, const char *what)
{
    sim_run_caught_in_both(c, &pl->hits, what);
    c.copy_hook = NULL;
    c.write_hook = NULL;
    clean_in_both(&c, "the planted run, unplanted");
}

static void test_sim_cp_catches_wrong_range(void **state)
{
    (void)state;
    plant_t pl;
    sim_scenario_config_t c = plant_run(&pl);
    c.copy_hook = plant_wrong_range;
    caught_in_both(c, &pl, "CP 1 gathers from the chunk's start, P4 CP2 -> D2");
}

static void test_sim_cp_catches_wrong_offset(void **state)
{
    (void)state;
    plant_t pl;
    sim_scenario_config_t c = plant_run(&pl);
    c.write_hook = plant_wrong_offset;
    /* The bytes must land for the check to see them: a fabric without
     * region-scoped keys. */
    c.net.no_key_grant = true;
    caught_in_both(c, &pl, "CP 1 writes at its range's offset, P4 CP2 -> D2");
    /* With scoped keys each write may reach its own bytes only: refused,
     * nothing lands, the requests fail instead, and nothing leaks. */
    c.net.no_key_grant = false;
    pl.hits = 0;
    const sim_report_t r = sim_run_mode(c, SIM_DATA_BYTES, "wrong offset, scoped keys");
    assert_true(pl.hits > 0);
    assert_int_equal(r.corrupt_bytes, 0);
    assert_int_equal(r.requests_ok, 0);
    assert_int_equal(r.ring_leaked_bytes, 0);
    assert_int_equal(r.hung_requests, 0);
}

/* ---- faults -------------------------------------------------------------------- */

static void test_sim_cp_rank_crash_fails_its_requests_only(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_cp(4, 2, 2, 8);
    c.requests = 12;
    c.prompt_min_tokens = 600; /* every request has rows on both CP ranks */
    c.stall_timeout_ns = 2000 * MS;
    /* CP 1's TP rank 2: index (1 * PP + 0) * TP + 2 = 6 of its instance. */
    c.faults[0] = (sim_fault_t){.kind = SIM_FAULT_CRASH, .role = KVS_ROLE_PREFILL, .rank = 6,
                                .at_ns = 20 * MS};
    c.nfaults = 1;
    const sim_report_t r = sim_run_mode(c, SIM_DATA_PROVENANCE, "CP 1's rank 2 crashes");
    assert_int_equal(r.ranks_crashed, 1);
    assert_true(r.requests_failed > 0);
    assert_int_equal(r.hung_requests, 0);
    assert_int_equal(r.corrupt_bytes, 0);
    assert_int_equal(r.ring_leaked_bytes, 0);
    if (r.violations != 0)
        fail_msg("a CP rank's crash broke %llu invariants", (unsigned long long)r.violations);
}

/* Equal TP with CP and path auto resolves to the direct path, which
 * moves CP too: every CP rank writes its range's runs. */
static void test_sim_cp_auto_takes_direct(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_cp(2, 2, 2, 8);
    c.path = KVS_PATH_AUTO;
    const sim_report_t r = clean_in_both(&c, "P2 CP2 -> D2, path auto");
    assert_int_equal(r.path, KVS_PATH_DIRECT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_cp_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_cp_ranks_with_nothing),
        cmocka_unit_test(test_sim_cp_ring_order_across_cp_ranks),
        cmocka_unit_test(test_sim_cp_buffer_held_by_a_later_chunk),
        cmocka_unit_test(test_sim_cp_catches_wrong_range),
        cmocka_unit_test(test_sim_cp_catches_wrong_offset),
        cmocka_unit_test(test_sim_cp_rank_crash_fails_its_requests_only),
        cmocka_unit_test(test_sim_cp_auto_takes_direct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
