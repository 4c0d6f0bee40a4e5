/*
 * test_sim_hybrid.c - hybrid models in the simulator (docs/kinds/hybrid.md):
 * sliding-window layers (gpt-oss) and per-request state layers (Qwen3-Next)
 * moved by the real core on the staging path, each writer's block a slot
 * per layer and plane (window layers: the chunk's rows inside the
 * page-aligned window) and, in a request's last chunk, its state part.
 *
 * - Every byte that must move does, verified in both data modes (the same
 *   report, bit for bit, 0 corrupt): every in-window slot of window
 *   layers, every slot of full layers, every state byte in the request's
 *   state slot, and no page of a window layer before its window holding
 *   the request's bytes; at P > D, P < D, P = D (path auto stages a
 *   hybrid layout), replicated heads and state heads, PP (with stages of
 *   a window layer alone, whose early chunks have empty blocks), two page
 *   sizes, cached prefixes, FP8 scale planes and a state larger than a
 *   chunk's rows.
 * - Planted bugs through the simulated GPU's copy hook (the core is not
 *   touched), caught as corrupt bytes in both modes: a state scattered to
 *   the next state head or into the next request's slot, a window row
 *   gathered from outside the window, and a window slot moved a page early
 *   (its first page lands before the window: the check of the pages before
 *   the window counts it).
 * - The direct and slice paths refuse a hybrid layout by name.
 * - With prefill context parallelism (CP 2 and 3): every byte in both
 *   modes over P > D, P < D, P = D, PP, two page sizes, cached prefixes
 *   and prompts leaving CP ranks empty; a CP rank's window rows counted
 *   from the chunk's start (planted) are caught in both modes, and only
 *   the verification sees them (every request reports ok).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "scenario.h"
#include "sim_run.h"

/* A small model of 8 layers, every other one (or every fourth) full. */
static sim_scenario_config_t small_hybrid(int64_t p, int64_t d, int64_t heads,
                                          kvs_layer_kind_t other)
{
    sim_scenario_config_t c = sim_run_small(
        (kvs_layout_params_t){.total_heads = heads, .head_dim = 64, .dtype = KVS_DTYPE_BF16,
                              .layers = 8, .page_size = 16, .prefill_tp = p, .decode_tp = d,
                              .chunk_tokens = 256, .other_layers = other},
        16u << 20, 23);
    if (other == KVS_LAYER_WINDOW) {
        c.shape.full_attn_every = 2; /* layer 0 a window layer, as gpt-oss */
        c.shape.window_tokens = 100;
    } else {
        c.shape.full_attn_every = 4; /* three state layers a full one, as Qwen3-Next */
        c.shape.state_heads = 4;
        c.shape.state_conv_bytes = 96;
        c.shape.state_ssm_bytes = 160;
    }
    return c;
}

static void test_sim_hybrid_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t p, d, heads, pp, ps, dps, prefix, state_heads;
        kvs_layer_kind_t other;
        kvs_kv_scales_t scales;
        kvs_path_t path;
        const char *what;
    } runs[] = {
        {4, 2, 8, 1, 16, 16, 0, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "window, P4 -> D2"},
        {2, 4, 8, 1, 16, 16, 0, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "window, P2 -> D4"},
        {2, 2, 8, 1, 16, 16, 0, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_NONE, KVS_PATH_AUTO,
         "window, P2 -> D2, path auto"},
        {8, 2, 4, 1, 16, 16, 0, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "window, H4 P8 -> D2 (replicated heads)"},
        {2, 2, 8, 2, 16, 16, 0, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "window, P2xPP2 -> D2xPP2"},
        {4, 2, 8, 1, 16, 64, 0, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "window, pages 16 -> 64, P4 -> D2"},
        {2, 4, 8, 1, 64, 16, 0, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "window, pages 64 -> 16, P2 -> D4"},
        {4, 2, 8, 1, 16, 16, 512, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "window, cached prefixes, P4 -> D2"},
        {4, 2, 8, 1, 16, 16, 0, 0, KVS_LAYER_WINDOW, KVS_KV_SCALES_PER_TOKEN, KVS_PATH_STAGING,
         "window, FP8 per-token scales, P4 -> D2"},
        {4, 2, 8, 1, 16, 16, 0, 4, KVS_LAYER_STATE, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "state, P4 -> D2"},
        {2, 4, 8, 1, 16, 16, 0, 4, KVS_LAYER_STATE, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "state, P2 -> D4"},
        {2, 2, 8, 1, 16, 16, 0, 4, KVS_LAYER_STATE, KVS_KV_SCALES_NONE, KVS_PATH_AUTO,
         "state, P2 -> D2, path auto"},
        {8, 2, 2, 1, 16, 16, 0, 16, KVS_LAYER_STATE, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "state, H2 P8 -> D2 (replicated KV heads, as Qwen3-Next)"},
        {8, 4, 8, 1, 16, 16, 0, 2, KVS_LAYER_STATE, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "state, 2 state heads P8 -> D4 (replicated state heads)"},
        {2, 2, 8, 2, 16, 16, 0, 4, KVS_LAYER_STATE, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "state, P2xPP2 -> D2xPP2"},
        {4, 2, 8, 1, 16, 64, 256, 4, KVS_LAYER_STATE, KVS_KV_SCALES_NONE, KVS_PATH_STAGING,
         "state, pages 16 -> 64, cached prefixes, P4 -> D2"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small_hybrid(runs[i].p, runs[i].d, runs[i].heads,
                                               runs[i].other);
        c.shape.prefill_pp = c.shape.decode_pp = runs[i].pp;
        c.shape.page_size = runs[i].ps;
        c.shape.decode_page_size = runs[i].dps;
        if (runs[i].state_heads > 0)
            c.shape.state_heads = runs[i].state_heads;
        if (runs[i].scales != KVS_KV_SCALES_NONE) {
            c.shape.dtype = KVS_DTYPE_FP8;
            c.shape.kv_scales = runs[i].scales;
        }
        c.prefix_max_tokens = runs[i].prefix;
        c.path = runs[i].path;
        sim_run_staged_in_both(&c, runs[i].what);
    }
}

/* PP 4 of 4 layers, every other one full: stages 0 and 2 hold a window
 * layer alone, so a chunk before the window has an empty block there (no
 * bytes, its CHUNK_READY alone) and the last chunk's block the window. */
static void test_sim_hybrid_stage_of_window_layers_alone(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_hybrid(2, 2, 8, KVS_LAYER_WINDOW);
    c.shape.layers = 4;
    c.shape.prefill_pp = c.shape.decode_pp = 4;
    c.prompt_min_tokens = 600;
    sim_run_staged_in_both(&c, "window, P2xPP4 -> D2xPP4, stages of a window layer alone");
}

/* Prefill PP into a decode of PP 1: each prefill stage writes its part of
 * the writer block (kvs_layout_hybrid_part), one span, and the decode
 * scatters the whole region. Uneven stages, stages of state layers alone
 * (no bytes before the last chunk: an arrival without a write), replicated
 * KV and state heads, CP and two page sizes. */
static void test_sim_hybrid_prefill_pp_into_decode_pp1(void **state)
{
    (void)state;
    static const struct {
        int64_t p, d, heads, pp, cp, ps, dps, state_heads;
        kvs_layer_kind_t other;
        const char *what;
    } runs[] = {
        {2, 2, 8, 2, 1, 16, 16, 0, KVS_LAYER_WINDOW, "window, P2xPP2 -> D2"},
        {4, 2, 8, 3, 1, 16, 64, 0, KVS_LAYER_WINDOW, "window, P4xPP3 -> D2, pages 16 -> 64"},
        {4, 2, 8, 2, 1, 16, 16, 4, KVS_LAYER_STATE, "state, P4xPP2 -> D2"},
        {2, 4, 8, 3, 1, 16, 16, 4, KVS_LAYER_STATE, "state, P2xPP3 -> D4 (uneven stages)"},
        {2, 1, 8, 4, 1, 16, 16, 4, KVS_LAYER_STATE,
         "state, P2xPP4 -> D1 (stages of state layers alone)"},
        {8, 2, 2, 2, 1, 16, 16, 16, KVS_LAYER_STATE,
         "state, H2 P8xPP2 -> D2 (replicated KV heads, state-alone writers)"},
        {4, 2, 8, 2, 2, 16, 16, 4, KVS_LAYER_STATE, "state, P4xPP2 CP2 -> D2"},
        {2, 2, 8, 2, 3, 16, 16, 0, KVS_LAYER_WINDOW, "window, P2xPP2 CP3 -> D2"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small_hybrid(runs[i].p, runs[i].d, runs[i].heads,
                                               runs[i].other);
        c.shape.prefill_pp = runs[i].pp;
        c.shape.decode_pp = 1;
        c.shape.prefill_cp = runs[i].cp;
        c.shape.page_size = runs[i].ps;
        c.shape.decode_page_size = runs[i].dps;
        if (runs[i].state_heads > 0)
            c.shape.state_heads = runs[i].state_heads;
        const sim_report_t r = sim_run_staged_in_both(&c, runs[i].what);
        assert_true(r.bytes_verified > 0);
        assert_int_equal(r.bytes_moved, r.bytes_verified); /* each head written once */
    }
}

/* A state larger than a chunk's rows (Qwen3-Next's 68608 bytes a state
 * head, chunks of 16 tokens): the prefill staging buffers hold the state
 * part besides the rows. */
static void test_sim_hybrid_state_larger_than_a_chunk(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_hybrid(4, 2, 8, KVS_LAYER_STATE);
    c.shape.chunk_tokens = 16;
    c.shape.state_conv_bytes = 3072;
    c.shape.state_ssm_bytes = 65536;
    c.prompt_max_tokens = 100;
    sim_run_staged_in_both(&c, "state of 68608 bytes a head, chunks of 16 tokens, P4 -> D2");
}

/* A window layer moves its window alone: fewer bytes than the same model
 * of full layers, and a state model's last chunk carries the state. */
static void test_sim_hybrid_moves_less_than_full(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_hybrid(4, 2, 8, KVS_LAYER_WINDOW);
    c.prompt_min_tokens = c.prompt_max_tokens = 1000;
    const sim_report_t w = sim_run_staged_in_both(&c, "window, prompts of 1000");
    c.shape.full_attn_every = 0;
    c.shape.other_layers = KVS_LAYER_FULL;
    c.shape.window_tokens = 0;
    const sim_report_t f = sim_run_mode(c, SIM_DATA_BYTES, "the same model, full layers");
    assert_int_equal(f.corrupt_bytes, 0);
    /* 4 full layers of 1000 rows and 4 window layers of 104 (the window of
     * 100 from token 900, floored to a page: 896), of 8 x 1000 */
    assert_int_equal(w.bytes_verified * 8000, f.bytes_verified * (4000 + 4 * 104));
}

/* Fewer KV heads than prefill ranks, as Qwen3-Next (2 KV heads, state
 * heads split over every rank): of a decode rank's four sources the first
 * writes the KV head with its state, the other three their state alone,
 * so every byte moved is one the decode holds, once. Before, each source
 * sent its replica of the KV head too. The same for state heads: fewer
 * than prefill ranks, each written by the first of the ranks holding it.
 * With CP 2 too: the KV rows of both CP ranks, the state of the last. */
static void test_sim_hybrid_replicated_kv_head_written_once(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_hybrid(8, 2, 2, KVS_LAYER_STATE);
    c.shape.state_heads = 16;
    sim_report_t r = sim_run_staged_in_both(&c, "state, H2 P8 -> D2, 16 state heads");
    assert_true(r.bytes_verified > 0);
    assert_int_equal(r.bytes_moved, r.bytes_verified);
    c.shape.prefill_cp = 2;
    r = sim_run_staged_in_both(&c, "state, H2 P8 CP2 -> D2, 16 state heads");
    assert_int_equal(r.bytes_moved, r.bytes_verified);
    /* KV and state heads both replicated, H4 and 4 state heads over P8 ->
     * D1: the KV writers are prefill 0, 2, 4, 6, the state-alone ones 1,
     * 3, 5, 7, so the two replicas of a state head are not next to each
     * other in writer order (the scatter once gave both to one copy:
     * KVS_ERANGE, overlapping heads) */
    c = small_hybrid(8, 1, 4, KVS_LAYER_STATE);
    r = sim_run_staged_in_both(&c, "state, H4 P8 -> D1, 4 state heads");
    assert_int_equal(r.bytes_moved, r.bytes_verified); /* a state replica written once */
    /* fewer state heads than KV heads (H8, 2 state heads, P8 -> D1): of
     * the 8 KV writers, prefill 0 and 4 write a state head too; and runs
     * of neither dividing the other (H6, 4 state heads, P12 -> D2: KV
     * runs of 2, state runs of 3, so prefill 3 of each decode rank's six
     * writes its state alone and 1 and 5 only report) */
    c = small_hybrid(8, 1, 8, KVS_LAYER_STATE);
    c.shape.state_heads = 2;
    r = sim_run_staged_in_both(&c, "state, H8 P8 -> D1, 2 state heads");
    assert_int_equal(r.bytes_moved, r.bytes_verified);
    c = small_hybrid(12, 2, 6, KVS_LAYER_STATE);
    c.shape.state_heads = 4;
    r = sim_run_staged_in_both(&c, "state, H6 P12 -> D2, 4 state heads");
    assert_int_equal(r.bytes_moved, r.bytes_verified);
}

/* ---- prefill context parallelism --------------------------------------------- */

/* Hybrid layers with prefill CP (docs/kinds/hybrid.md): each CP rank
 * sends its range's rows of full layers and those inside the window, and
 * the CP rank holding the request's last token the state (the simulator
 * fills a CP rank's state only when its range ends the prompt, so a state
 * from another CP rank is wrong bytes). Prompts of 1..900 tokens give CP
 * ranks with nothing (short prompts) and ranges straddling chunks. */
static void test_sim_hybrid_cp_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t cp, p, d, heads, pp, ps, dps, prefix, state_heads, chunk, min, max;
        kvs_layer_kind_t other;
        kvs_path_t path;
        const char *what;
    } runs[] = {
        {2, 4, 2, 8, 1, 16, 16, 0, 0, 256, 1, 900, KVS_LAYER_WINDOW, KVS_PATH_STAGING,
         "window, P4 CP2 -> D2"},
        {3, 2, 4, 8, 1, 16, 16, 0, 0, 256, 1, 900, KVS_LAYER_WINDOW, KVS_PATH_STAGING,
         "window, P2 CP3 -> D4"},
        {3, 2, 2, 8, 1, 16, 16, 0, 0, 128, 1, 900, KVS_LAYER_WINDOW, KVS_PATH_AUTO,
         "window, P2 CP3 -> D2, path auto, chunks of 128"},
        {2, 2, 2, 8, 2, 16, 16, 0, 0, 256, 1, 900, KVS_LAYER_WINDOW, KVS_PATH_STAGING,
         "window, P2xPP2 CP2 -> D2xPP2"},
        {2, 4, 2, 8, 1, 16, 64, 256, 0, 256, 1, 900, KVS_LAYER_WINDOW, KVS_PATH_STAGING,
         "window, pages 16 -> 64, cached prefixes, P4 CP2 -> D2"},
        {3, 2, 2, 8, 1, 16, 16, 0, 0, 256, 1, 40, KVS_LAYER_WINDOW, KVS_PATH_STAGING,
         "window, prompts of 1..40 tokens (empty CP ranks), P2 CP3 -> D2"},
        {2, 4, 2, 8, 1, 16, 16, 0, 4, 256, 1, 900, KVS_LAYER_STATE, KVS_PATH_STAGING,
         "state, P4 CP2 -> D2"},
        {3, 2, 4, 8, 1, 16, 16, 0, 4, 256, 1, 900, KVS_LAYER_STATE, KVS_PATH_STAGING,
         "state, P2 CP3 -> D4"},
        {2, 2, 2, 8, 1, 16, 16, 0, 4, 128, 1, 900, KVS_LAYER_STATE, KVS_PATH_AUTO,
         "state, P2 CP2 -> D2, path auto, chunks of 128"},
        {2, 8, 2, 2, 1, 16, 16, 0, 16, 256, 1, 900, KVS_LAYER_STATE, KVS_PATH_STAGING,
         "state, H2 P8 CP2 -> D2 (replicated KV heads, as Qwen3-Next)"},
        {2, 2, 2, 8, 2, 16, 16, 0, 4, 256, 1, 900, KVS_LAYER_STATE, KVS_PATH_STAGING,
         "state, P2xPP2 CP2 -> D2xPP2"},
        {3, 4, 2, 8, 1, 16, 64, 256, 4, 256, 1, 40, KVS_LAYER_STATE, KVS_PATH_STAGING,
         "state, prompts of 1..40, pages 16 -> 64, cached prefixes, P4 CP3 -> D2"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small_hybrid(runs[i].p, runs[i].d, runs[i].heads,
                                               runs[i].other);
        c.shape.prefill_cp = runs[i].cp;
        c.shape.prefill_pp = c.shape.decode_pp = runs[i].pp;
        c.shape.page_size = runs[i].ps;
        c.shape.decode_page_size = runs[i].dps;
        c.shape.chunk_tokens = runs[i].chunk;
        if (runs[i].state_heads > 0)
            c.shape.state_heads = runs[i].state_heads;
        c.prefix_max_tokens = runs[i].prefix;
        c.prompt_min_tokens = runs[i].min;
        c.prompt_max_tokens = runs[i].max;
        c.path = runs[i].path;
        sim_run_staged_in_both(&c, runs[i].what);
    }
}

/* PP 4 of 4 layers with CP 2: stages 0 and 2 hold a window layer alone.
 * Prompts of 1000 tokens, chunks of 384, a window of 400 from token 592:
 * CP 1 holds [512, 1000), so in the chunk [384, 768) CP 0's part [384,
 * 512) has no bytes on those stages (its arrival alone: no write, no
 * key) while CP 1's part holds the window rows [592, 768). */
static void test_sim_hybrid_cp_part_without_bytes(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_hybrid(2, 2, 8, KVS_LAYER_WINDOW);
    c.shape.layers = 4;
    c.shape.prefill_pp = c.shape.decode_pp = 4;
    c.shape.prefill_cp = 2;
    c.shape.chunk_tokens = 384;
    c.shape.window_tokens = 400;
    c.prompt_min_tokens = c.prompt_max_tokens = 1000;
    kvs_layout_t lay;
    assert_int_equal(kvs_layout_init(&lay, &c.shape, NULL), KVS_OK);
    const kvs_chunk_t ch = {.index = 1, .token_start = 384, .token_end = 768};
    kvs_cp_part_t p0, p1;
    assert_int_equal(kvs_layout_cp_part(&lay, 0, 0, 1000, &ch, 0, &p0), KVS_OK);
    assert_int_equal(kvs_layout_cp_part(&lay, 0, 0, 1000, &ch, 1, &p1), KVS_OK);
    assert_int_equal(p0.token_end, 512);
    assert_int_equal(p0.len_bytes, 0); /* the case this test is for */
    assert_true(p1.len_bytes > 0 && p1.offset_bytes == 0);
    sim_run_staged_in_both(&c, "window, P2xPP4 CP2 -> D2xPP4, a CP part without bytes");
}

/* The CP plant's run: P4 CP2 -> D2, prompts of 1000 tokens, chunks of 384,
 * a window of 400. CP 1 holds [512, 1000); the chunk [384, 768) straddles
 * the ranges, and the window starts at 600 floored to a page: 592, so CP
 * 1's part of that chunk has 176 window rows [592, 768), and the last
 * chunk's window slot 232. */
typedef struct cp_plant {
    uint32_t cp1_first_gpu, cp1_gpus; /* CP 1's GPUs (prefill ranks first) */
    int64_t window_rows;              /* CP 1's window slot in the straddling chunk */
    int64_t back_pages;               /* from its part's start back to the chunk's */
    uint64_t hits;
} cp_plant_t;

/* CP 1 gathers its window rows of the straddling chunk counted from the
 * chunk's start, not its part's: 128 tokens early, rows CP 1 never
 * computed and rows of other tokens. */
static void plant_cp_window_shift(void *ctx, uint32_t gpu_id, bool scatter,
                                  kvs_copy_desc_t *desc, kvs_copy_part_t *parts, int64_t nparts)
{
    (void)parts;
    (void)nparts;
    cp_plant_t *pl = ctx;
    if (scatter || gpu_id < pl->cp1_first_gpu || gpu_id >= pl->cp1_first_gpu + pl->cp1_gpus ||
        desc->layer_count != 1 || desc->page_size == 1 || desc->tokens != pl->window_rows)
        return;
    desc->pages -= pl->back_pages;
    pl->hits++;
}

static void test_sim_hybrid_cp_catches_window_rows_shifted(void **state)
{
    (void)state;
    cp_plant_t pl;
    sim_scenario_config_t c = small_hybrid(4, 2, 8, KVS_LAYER_WINDOW);
    c.shape.prefill_cp = 2;
    c.shape.chunk_tokens = 384;
    c.shape.window_tokens = 400;
    c.prompt_min_tokens = c.prompt_max_tokens = 1000;
    kvs_layout_t lay;
    assert_int_equal(kvs_layout_init(&lay, &c.shape, NULL), KVS_OK);
    int64_t cs = 0, ce = 0, ws = 0, we = 0;
    assert_int_equal(kvs_layout_cp_range(&lay, 1000, 1, &cs, &ce), KVS_OK);
    assert_int_equal(kvs_layout_layer_tokens(&lay, 0, 1000, &ws, &we), KVS_OK);
    assert_int_equal(cs, 512); /* the geometry the comment above says */
    assert_int_equal(ws, 592);
    pl = (cp_plant_t){.cp1_first_gpu = 4, .cp1_gpus = 4, .window_rows = 768 - ws,
                      .back_pages = (cs - 384) / 16};
    c.hook_ctx = &pl;
    c.copy_hook = plant_cp_window_shift;
    sim_run_caught_then_clean(c, &pl.hits, "CP 1's window rows counted from the chunk's start, "
                                           "P4 CP2 -> D2");
    /* Nothing but the verification sees it: every request still reports
     * ok, so with the verification off the run would pass. */
    pl.hits = 0;
    const sim_report_t r = sim_run_mode(c, SIM_DATA_BYTES, "the CP window plant");
    assert_true(pl.hits > 0);
    assert_int_equal(r.requests_ok, c.requests);
    assert_true(r.corrupt_bytes > 0);
}

/* ---- planted bugs -------------------------------------------------------------- */

typedef struct plant {
    int64_t state_head_bytes; /* what tells a state copy from a slot's */
    int64_t window_rows;      /* a window slot's rows in the last chunk */
    uint32_t requests;
    int64_t slot;             /* the wrong state slot a plant points to */
    uint64_t hits;
} plant_t;

static bool is_state_copy(const plant_t *pl, const kvs_copy_desc_t *desc)
{
    return desc->elem_bytes == 1 && desc->page_size == 1 &&
           desc->head_dim == pl->state_head_bytes;
}

/* The decode scatters each writer's state into the next state head of the
 * slot (one head a part: P4 -> D2, 4 state heads; the last part's wraps
 * to the first head, so no two parts overlap). */
static void plant_state_next_head(void *ctx, uint32_t gpu_id, bool scatter,
                                  kvs_copy_desc_t *desc, kvs_copy_part_t *parts, int64_t nparts)
{
    (void)gpu_id;
    plant_t *pl = ctx;
    if (!scatter || !is_state_copy(pl, desc) || nparts != desc->local_heads)
        return;
    for (int64_t i = 0; i < nparts; i++)
        parts[i].head_start = (parts[i].head_start + 1) % desc->local_heads;
    pl->hits++;
}

/* The decode scatters a request's state into the next request's slot. */
static void plant_state_next_slot(void *ctx, uint32_t gpu_id, bool scatter,
                                  kvs_copy_desc_t *desc, kvs_copy_part_t *parts, int64_t nparts)
{
    (void)gpu_id;
    (void)parts;
    (void)nparts;
    plant_t *pl = ctx;
    if (!scatter || !is_state_copy(pl, desc) || desc->pages[0] + 1 >= pl->requests)
        return;
    pl->slot = desc->pages[0] + 1;
    desc->pages = &pl->slot;
    pl->hits++;
}

/* The prefill gathers a window slot from a page early: its first rows are
 * from before the window, its last ones are missing. */
static void plant_window_early_rows(void *ctx, uint32_t gpu_id, bool scatter,
                                    kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                    int64_t nparts)
{
    (void)gpu_id;
    (void)parts;
    (void)nparts;
    plant_t *pl = ctx;
    if (scatter || is_state_copy(pl, desc) || desc->layer_count != 1 ||
        desc->tokens != pl->window_rows)
        return;
    desc->pages--;
    pl->hits++;
}

/* Both sides move a window slot a page early: the decode page before the
 * window gets the request's own rows (right, but never to be written), and
 * the window's last page none. */
static void plant_window_page_early(void *ctx, uint32_t gpu_id, bool scatter,
                                    kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                    int64_t nparts)
{
    (void)gpu_id;
    (void)scatter;
    (void)parts;
    (void)nparts;
    plant_t *pl = ctx;
    if (is_state_copy(pl, desc) || desc->layer_count != 1 || desc->tokens != pl->window_rows)
        return;
    desc->pages--;
    pl->hits++;
}

/* Prompts of 1000 tokens, chunks of 256: the last chunk [768, 1000); a
 * window of 100 starts at token 900, floored to a page: 896, 104 rows. */
static sim_scenario_config_t plant_run(plant_t *pl, kvs_layer_kind_t other)
{
    sim_scenario_config_t c = small_hybrid(4, 2, 8, other);
    c.prompt_min_tokens = c.prompt_max_tokens = 1000;
    *pl = (plant_t){.state_head_bytes = 96 + 160, .window_rows = 104,
                    .requests = c.requests};
    c.hook_ctx = pl;
    return c;
}

static void test_sim_hybrid_catches_state_to_next_head(void **state)
{
    (void)state;
    plant_t pl;
    sim_scenario_config_t c = plant_run(&pl, KVS_LAYER_STATE);
    c.copy_hook = plant_state_next_head;
    sim_run_caught_then_clean(c, &pl.hits, "a state scattered to the next state head, P4 -> D2");
}

static void test_sim_hybrid_catches_state_to_next_slot(void **state)
{
    (void)state;
    plant_t pl;
    sim_scenario_config_t c = plant_run(&pl, KVS_LAYER_STATE);
    c.copy_hook = plant_state_next_slot;
    sim_run_caught_then_clean(c, &pl.hits,
                              "a state scattered into the next request's slot, P4 -> D2");
}

static void test_sim_hybrid_catches_window_row_outside(void **state)
{
    (void)state;
    plant_t pl;
    sim_scenario_config_t c = plant_run(&pl, KVS_LAYER_WINDOW);
    c.copy_hook = plant_window_early_rows;
    sim_run_caught_then_clean(c, &pl.hits, "window rows gathered from before the window, P4 -> D2");
}

/* The page before the window is counted: in the provenance mode every
 * byte of the missing last page and of the page written before the window
 * is corrupt, twice the missing page's bytes alone. */
static void test_sim_hybrid_catches_page_before_window(void **state)
{
    (void)state;
    plant_t pl;
    sim_scenario_config_t c = plant_run(&pl, KVS_LAYER_WINDOW);
    c.copy_hook = plant_window_page_early;
    sim_run_caught_then_clean(c, &pl.hits, "a window slot moved a page early, P4 -> D2");
    pl.hits = 0;
    const sim_report_t r = sim_run_mode(c, SIM_DATA_PROVENANCE, "a window slot a page early");
    /* a page of 16 rows x 8 heads x 128 bytes, K and V, 4 window layers */
    const uint64_t page = 16ull * 8 * 128 * 2 * 4 * c.requests;
    assert_int_equal(r.corrupt_bytes, 2 * page);
}

/* ---- refusals ------------------------------------------------------------------ */

static void test_sim_hybrid_refuses_direct_and_slice(void **state)
{
    (void)state;
    static const kvs_path_t paths[] = {KVS_PATH_DIRECT, KVS_PATH_SLICE};
    for (size_t i = 0; i < 2; i++) {
        sim_scenario_config_t c = small_hybrid(2, 2, 8, KVS_LAYER_WINDOW);
        c.path = paths[i];
        c.requests = 2;
        sim_report_t r;
        char err[384] = "";
        const int rc = sim_scenario_run(&c, &r, err, sizeof err);
        if (rc != KVS_ENOTSUP || strstr(err, "use the staging path") == NULL)
            fail_msg("path %d with a hybrid layout: %s (%s)", (int)paths[i],
                     kvs_status_name(rc), err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_hybrid_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_hybrid_stage_of_window_layers_alone),
        cmocka_unit_test(test_sim_hybrid_prefill_pp_into_decode_pp1),
        cmocka_unit_test(test_sim_hybrid_state_larger_than_a_chunk),
        cmocka_unit_test(test_sim_hybrid_moves_less_than_full),
        cmocka_unit_test(test_sim_hybrid_replicated_kv_head_written_once),
        cmocka_unit_test(test_sim_hybrid_catches_state_to_next_head),
        cmocka_unit_test(test_sim_hybrid_catches_state_to_next_slot),
        cmocka_unit_test(test_sim_hybrid_catches_window_row_outside),
        cmocka_unit_test(test_sim_hybrid_catches_page_before_window),
        cmocka_unit_test(test_sim_hybrid_refuses_direct_and_slice),
        cmocka_unit_test(test_sim_hybrid_cp_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_hybrid_cp_part_without_bytes),
        cmocka_unit_test(test_sim_hybrid_cp_catches_window_rows_shifted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
