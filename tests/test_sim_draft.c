/*
 * test_sim_draft.c - a draft model's KV (speculative decoding,
 * docs/kinds/draft.md) in the simulator: the draft's layers moved by the
 * real core on the staging path, each writer block's draft part gathered
 * after its model slots and scattered into the draft's own buffers, over
 * the model's pages.
 *
 * - Every byte that must move does, verified in both data modes (the same
 *   report, bit for bit, 0 corrupt): every model slot and every draft
 *   slot (the draft's vectors have a layer coordinate no model layer has,
 *   so a draft byte in the wrong buffer, layer or token is wrong); at
 *   P > D, P < D, P = D (path auto stages a draft), replicated heads on
 *   either side, MLA with an MTP layer, prefill CP 2, a draft head dim of
 *   its own, two page sizes and cached prefixes; the draft adds exactly
 *   its bytes to what is verified. With pipeline parallelism (the draft on
 *   the last stage of both sides): prefill PP 2 and 3 into decode PP 1,
 *   PP 2 into PP 2, uneven stages, CP 2 and MLA; the same draft bytes
 *   verified as at PP 1.
 * - Planted bugs through the simulated GPU's copy hook (the core is not
 *   touched), caught as corrupt bytes in both modes: a draft part
 *   scattered into the model's layer slots (its draft buffers left
 *   unwritten: in the provenance mode exactly the draft's bytes twice),
 *   a draft row shifted by one token, and (with PP) a draft part read a
 *   stage's layer slots before its place.
 * - The direct and slice paths refuse a draft by name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "scenario.h"
#include "sim_run.h"

/* A small model of 8 layers of head dim 128 with a draft of `draft`
 * layers (EAGLE: 1). */
static sim_scenario_config_t small_draft(int64_t p, int64_t d, int64_t heads, int64_t draft)
{
    return sim_run_small((kvs_layout_params_t){.total_heads = heads, .head_dim = 128,
                                               .dtype = KVS_DTYPE_BF16, .layers = 8,
                                               .page_size = 16, .prefill_tp = p,
                                               .decode_tp = d, .chunk_tokens = 256,
                                               .draft_layers = draft},
                         16u << 20, 29);
}

static void test_sim_draft_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t p, d, heads, draft, draft_hd, cp, ps, dps, prefix;
        kvs_kv_kind_t kind;
        kvs_path_t path;
        const char *what;
    } runs[] = {
        {4, 2, 8, 1, 0, 1, 16, 16, 0, KVS_KV_GQA, KVS_PATH_STAGING, "EAGLE, P4 -> D2"},
        {2, 4, 8, 1, 0, 1, 16, 16, 0, KVS_KV_GQA, KVS_PATH_STAGING, "EAGLE, P2 -> D4"},
        {2, 2, 8, 1, 0, 1, 16, 16, 0, KVS_KV_GQA, KVS_PATH_AUTO, "EAGLE, P2 -> D2, path auto"},
        {8, 2, 4, 2, 0, 1, 16, 16, 0, KVS_KV_GQA, KVS_PATH_STAGING,
         "2 draft layers, H4 P8 -> D2 (heads replicated on the prefill)"},
        {2, 8, 4, 2, 0, 1, 16, 16, 0, KVS_KV_GQA, KVS_PATH_STAGING,
         "2 draft layers, H4 P2 -> D8 (heads replicated on the decode)"},
        {4, 2, 1, 1, 0, 1, 16, 16, 0, KVS_KV_MLA, KVS_PATH_STAGING, "MLA + MTP, P4 -> D2"},
        {2, 4, 1, 1, 0, 2, 16, 16, 0, KVS_KV_MLA, KVS_PATH_STAGING,
         "MLA + MTP, P2 x CP2 -> D4"},
        {4, 2, 8, 1, 0, 2, 16, 16, 0, KVS_KV_GQA, KVS_PATH_STAGING, "EAGLE, P4 x CP2 -> D2"},
        {2, 4, 8, 3, 64, 3, 16, 16, 0, KVS_KV_GQA, KVS_PATH_STAGING,
         "a draft of head dim 64 and 3 layers, P2 x CP3 -> D4"},
        {4, 2, 8, 3, 64, 1, 16, 16, 0, KVS_KV_GQA, KVS_PATH_STAGING,
         "a draft of head dim 64 and 3 layers, P4 -> D2"},
        {4, 2, 8, 1, 0, 1, 16, 64, 0, KVS_KV_GQA, KVS_PATH_STAGING,
         "EAGLE, pages 16 -> 64, P4 -> D2"},
        {2, 4, 8, 1, 32, 1, 64, 16, 512, KVS_KV_GQA, KVS_PATH_STAGING,
         "a draft of head dim 32, pages 64 -> 16, cached prefixes, P2 -> D4"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small_draft(runs[i].p, runs[i].d, runs[i].heads,
                                              runs[i].draft);
        c.shape.draft_head_dim = runs[i].draft_hd;
        c.shape.prefill_cp = runs[i].cp;
        c.shape.kind = runs[i].kind;
        if (runs[i].kind == KVS_KV_MLA)
            c.shape.head_dim = 576;
        c.shape.page_size = runs[i].ps;
        c.shape.decode_page_size = runs[i].dps;
        c.prefix_max_tokens = runs[i].prefix;
        c.path = runs[i].path;
        sim_run_staged_in_both(&c, runs[i].what);
    }
}

/* With pipeline parallelism the draft is the last stage's on both sides:
 * only the last prefill stage computes and writes it, only the last decode
 * stage (the one stage with decode PP 1) receives and checks it; every
 * byte verified in both modes. */
static void test_sim_draft_pp_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t p, d, heads, draft, draft_hd, cp, pp, dpp, layers;
        kvs_kv_kind_t kind;
        const char *what;
    } runs[] = {
        {4, 2, 8, 1, 0, 1, 2, 2, 8, KVS_KV_GQA, "EAGLE, P4 PP2 -> D2 PP2"},
        {4, 2, 8, 1, 0, 1, 2, 1, 8, KVS_KV_GQA, "EAGLE, P4 PP2 -> D2 PP1"},
        {2, 4, 8, 2, 64, 1, 2, 2, 7, KVS_KV_GQA,
         "2 draft layers of head dim 64, P2 PP2 -> D4 PP2, stages of 3 and 4 layers"},
        {2, 4, 8, 2, 64, 1, 2, 1, 7, KVS_KV_GQA,
         "2 draft layers of head dim 64, P2 PP2 -> D4 PP1, stages of 3 and 4 layers"},
        {2, 2, 8, 1, 0, 1, 3, 1, 8, KVS_KV_GQA, "EAGLE, P2 PP3 -> D2 PP1, path auto"},
        {4, 2, 8, 1, 0, 2, 2, 2, 8, KVS_KV_GQA, "EAGLE, P4 x CP2 PP2 -> D2 PP2"},
        {2, 4, 8, 1, 32, 2, 2, 1, 8, KVS_KV_GQA, "a draft of head dim 32, P2 x CP2 PP2 -> D4"},
        {4, 2, 1, 1, 0, 1, 2, 2, 8, KVS_KV_MLA, "MLA + MTP, P4 PP2 -> D2 PP2"},
        {2, 4, 1, 1, 0, 2, 2, 1, 8, KVS_KV_MLA, "MLA + MTP, P2 x CP2 PP2 -> D4 PP1"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small_draft(runs[i].p, runs[i].d, runs[i].heads,
                                              runs[i].draft);
        c.shape.draft_head_dim = runs[i].draft_hd;
        c.shape.prefill_cp = runs[i].cp;
        c.shape.prefill_pp = runs[i].pp;
        c.shape.decode_pp = runs[i].dpp;
        c.shape.layers = runs[i].layers;
        c.shape.kind = runs[i].kind;
        if (runs[i].kind == KVS_KV_MLA)
            c.shape.head_dim = 576;
        c.path = runs[i].p == runs[i].d ? KVS_PATH_AUTO : KVS_PATH_STAGING;
        sim_run_staged_in_both(&c, runs[i].what);
    }
}

/* The draft adds exactly its bytes: a draft of head dim 64 and 2 layers
 * beside 8 layers of 128 verifies 8 x 128 + 2 x 64 where the model alone
 * verifies 8 x 128, and moves more. */
static void test_sim_draft_adds_its_bytes(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_draft(4, 2, 8, 2);
    c.shape.draft_head_dim = 64;
    c.prompt_min_tokens = c.prompt_max_tokens = 1000;
    const sim_report_t w = sim_run_staged_in_both(&c, "a draft of 2 layers of head dim 64");
    c.shape.draft_layers = 0;
    c.shape.draft_head_dim = 0;
    const sim_report_t m = sim_run_mode(c, SIM_DATA_BYTES, "the model alone");
    assert_int_equal(m.corrupt_bytes, 0);
    assert_int_equal(w.bytes_verified * (8 * 128), m.bytes_verified * (8 * 128 + 2 * 64));
    assert_true(w.bytes_moved > m.bytes_moved);
    /* With PP the same draft bytes are verified once, on the last stage:
     * as many bytes as at PP 1, at decode PP 2 and 1 alike. */
    c.shape.draft_layers = 2;
    c.shape.draft_head_dim = 64;
    c.shape.prefill_pp = 2;
    for (int64_t dpp = 1; dpp <= 2; dpp++) {
        c.shape.decode_pp = dpp;
        const sim_report_t pp = sim_run_staged_in_both(&c, "the draft with PP");
        assert_int_equal(pp.bytes_verified, w.bytes_verified);
    }
}

/* A hybrid model with a draft (Qwen3-Next and its MTP layer; gpt-oss and
 * its EAGLE3 head): the draft's part ends each KV writer's block, after
 * the state, on the last stage of each side; a writer of its state alone
 * has none. Window and state layers, P > D, P < D, replicated KV heads,
 * prefill PP into D PP 1 and 2, CP 2; the draft adds exactly its bytes. */
static sim_scenario_config_t hybrid_draft(int64_t p, int64_t d, int64_t heads, int64_t draft,
                                          bool window)
{
    sim_scenario_config_t c = small_draft(p, d, heads, draft);
    if (window) {
        c.shape.full_attn_every = 2;
        c.shape.other_layers = KVS_LAYER_WINDOW;
        c.shape.window_tokens = 100;
    } else {
        c.shape.full_attn_every = 4;
        c.shape.other_layers = KVS_LAYER_STATE;
        c.shape.state_heads = 4;
        c.shape.state_conv_bytes = 96;
        c.shape.state_ssm_bytes = 160;
    }
    return c;
}

static void test_sim_draft_hybrid_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t p, d, heads, draft, draft_hd, cp, pp, dpp;
        bool window;
        const char *what;
    } runs[] = {
        {4, 2, 8, 1, 0, 1, 1, 1, false, "state + MTP, P4 -> D2"},
        {2, 4, 8, 2, 64, 1, 1, 1, true, "window + 2 draft layers of head dim 64, P2 -> D4"},
        {8, 2, 2, 1, 0, 1, 1, 1, false,
         "state + MTP, H2 P8 -> D2 (writers of their state alone: no draft part)"},
        {4, 2, 8, 2, 0, 1, 2, 1, false, "state + 2 draft layers, P4 PP2 -> D2 PP1"},
        {2, 2, 8, 1, 32, 1, 2, 2, true, "window + a draft of head dim 32, P2 PP2 -> D2 PP2"},
        {4, 2, 8, 1, 0, 2, 2, 1, false, "state + MTP, P4 x CP2 PP2 -> D2"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = hybrid_draft(runs[i].p, runs[i].d, runs[i].heads,
                                               runs[i].draft, runs[i].window);
        c.shape.draft_head_dim = runs[i].draft_hd;
        c.shape.prefill_cp = runs[i].cp;
        c.shape.prefill_pp = runs[i].pp;
        c.shape.decode_pp = runs[i].dpp;
        const sim_report_t r = sim_run_staged_in_both(&c, runs[i].what);
        assert_int_equal(r.bytes_moved, r.bytes_verified);
    }
    /* the draft adds exactly its bytes: 1000 rows x 8 heads x 128 x 2
     * bytes, K and V, 2 layers, per request */
    sim_scenario_config_t c = hybrid_draft(4, 2, 8, 2, false);
    c.prompt_min_tokens = c.prompt_max_tokens = 1000;
    const sim_report_t w = sim_run_staged_in_both(&c, "state + 2 draft layers, prompts of 1000");
    c.shape.draft_layers = 0;
    const sim_report_t m = sim_run_mode(c, SIM_DATA_BYTES, "the same hybrid model alone");
    assert_int_equal(m.corrupt_bytes, 0);
    assert_int_equal(w.bytes_verified - m.bytes_verified,
                     1000ull * 8 * 128 * 2 * 2 * 2 * (uint64_t)c.requests);
}

/* ---- planted bugs -------------------------------------------------------------- */

typedef struct plant {
    int64_t draft_layers;       /* what tells a draft copy from the model's */
    const uint64_t *model_k[64], *model_v[64]; /* per GPU: the model copy's buffers */
    uint64_t hits;
} plant_t;

static bool is_draft_copy(const plant_t *pl, const kvs_copy_desc_t *desc)
{
    return desc->layer_count == pl->draft_layers &&
           desc->staging_layer_slots == pl->draft_layers;
}

/* The decode scatters each draft part into the model's buffers (draft
 * layer i into the model's layer i): the draft's buffers stay unwritten
 * and the model's first layers get the draft's rows. The model's copy of
 * the same parts comes first on each GPU, so its buffers are known. */
static void plant_draft_into_model(void *ctx, uint32_t gpu_id, bool scatter,
                                   kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                   int64_t nparts)
{
    (void)parts;
    (void)nparts;
    plant_t *pl = ctx;
    if (!scatter || gpu_id >= 64)
        return;
    if (!is_draft_copy(pl, desc)) {
        pl->model_k[gpu_id] = desc->k_base;
        pl->model_v[gpu_id] = desc->v_base;
        return;
    }
    if (pl->model_k[gpu_id] == NULL)
        return;
    desc->k_base = pl->model_k[gpu_id];
    desc->v_base = pl->model_v[gpu_id];
    pl->hits++;
}

/* The decode scatters a draft slot one token early: token t gets the
 * staged row of t + 1 and the chunk's last token none (an MLA draft of
 * one layer: one slot a block, so the shifted rows stay inside it). */
static void plant_draft_row_shifted(void *ctx, uint32_t gpu_id, bool scatter,
                                    kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                    int64_t nparts)
{
    (void)gpu_id;
    plant_t *pl = ctx;
    if (!scatter || !is_draft_copy(pl, desc) || desc->tokens < 2)
        return;
    for (int64_t i = 0; i < nparts; i++)
        parts[i].staging_addr +=
            (uint64_t)(parts[i].num_heads * desc->head_dim * desc->elem_bytes);
    desc->tokens--;
    desc->num_pages = (desc->tokens + desc->page_size - 1) / desc->page_size;
    pl->hits++;
}

/* With PP: the decode reads each draft part a stage off, that many layer
 * slots before its place (the model's copy of the same parts, just before
 * on the GPU, gives the stage's layers and the slot's size): with decode
 * PP 1 the draft gets the last prefill stage's V rows (MLA: its latent
 * rows), with decode PP 2 those of the stage's own V slots. */
typedef struct plant_pp {
    plant_t base;
    int64_t stage_layers[64], model_hd[64]; /* per GPU, of its last model copy */
} plant_pp_t;

static void plant_draft_a_stage_off(void *ctx, uint32_t gpu_id, bool scatter,
                                    kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                    int64_t nparts)
{
    plant_pp_t *pl = ctx;
    if (!scatter || gpu_id >= 64)
        return;
    if (!is_draft_copy(&pl->base, desc)) {
        pl->stage_layers[gpu_id] = desc->staging_layer_slots;
        pl->model_hd[gpu_id] = desc->head_dim;
        return;
    }
    const int64_t lx = pl->stage_layers[gpu_id];
    if (lx <= 0)
        return;
    for (int64_t i = 0; i < nparts; i++)
        parts[i].staging_addr -= (uint64_t)(lx * desc->tokens * parts[i].num_heads *
                                            pl->model_hd[gpu_id] * desc->elem_bytes);
    pl->base.hits++;
}

/* Prompts of 1000 tokens, chunks of 256. */
static sim_scenario_config_t plant_run(plant_t *pl, sim_scenario_config_t c)
{
    c.prompt_min_tokens = c.prompt_max_tokens = 1000;
    memset(pl, 0, sizeof *pl);
    pl->draft_layers = c.shape.draft_layers;
    c.hook_ctx = pl;
    return c;
}

/* In the provenance mode every draft byte is missing (a hole) and as many
 * model bytes hold the draft's: exactly twice the draft's bytes. */
static void test_sim_draft_catches_draft_into_model_slots(void **state)
{
    (void)state;
    plant_t pl;
    sim_scenario_config_t c = plant_run(&pl, small_draft(4, 2, 8, 2));
    c.copy_hook = plant_draft_into_model;
    sim_run_caught_then_clean(c, &pl.hits,
                              "a draft part scattered into the model's layer slots, P4 -> D2");
    const sim_report_t r = sim_run_mode(c, SIM_DATA_PROVENANCE, "draft into the model");
    /* 1000 rows x 8 heads x 128 x 2 bytes, K and V, 2 draft layers */
    const uint64_t draft = 1000ull * 8 * 128 * 2 * 2 * 2 * c.requests;
    assert_int_equal(r.corrupt_bytes, 2 * draft);
}

static void test_sim_draft_catches_row_shifted(void **state)
{
    (void)state;
    plant_t pl;
    sim_scenario_config_t c = small_draft(4, 2, 1, 1);
    c.shape.kind = KVS_KV_MLA;
    c.shape.head_dim = 576;
    c = plant_run(&pl, c);
    c.copy_hook = plant_draft_row_shifted;
    sim_run_caught_then_clean(c, &pl.hits, "an MTP row scattered a token early, MLA P4 -> D2");
}

static void test_sim_draft_catches_a_stage_off(void **state)
{
    (void)state;
    static const struct {
        int64_t heads, dpp;
        kvs_kv_kind_t kind;
        const char *what;
    } runs[] = {
        {8, 1, KVS_KV_GQA, "a draft part read a stage off, P4 PP2 -> D2 PP1"},
        {8, 2, KVS_KV_GQA, "a draft part read a stage off, P4 PP2 -> D2 PP2"},
        {1, 1, KVS_KV_MLA, "an MTP part read a stage off, MLA P4 PP2 -> D2 PP1"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        plant_pp_t pl;
        sim_scenario_config_t c = small_draft(4, 2, runs[i].heads, 1);
        c.shape.kind = runs[i].kind;
        if (runs[i].kind == KVS_KV_MLA)
            c.shape.head_dim = 576;
        c.shape.prefill_pp = 2;
        c.shape.decode_pp = runs[i].dpp;
        c = plant_run(&pl.base, c);
        memset(&pl, 0, sizeof pl);
        pl.base.draft_layers = c.shape.draft_layers;
        c.hook_ctx = &pl;
        c.copy_hook = plant_draft_a_stage_off;
        sim_run_caught_then_clean(c, &pl.base.hits, runs[i].what);
    }
}

/* ---- refusals ------------------------------------------------------------------ */

/* A hybrid model's draft rows scattered a token early (the draft part of
 * 2 layers after the state: the shifted rows stay inside the block), with
 * state and with window layers: caught in both modes. */
static void test_sim_draft_hybrid_catches_row_shifted(void **state)
{
    (void)state;
    for (int window = 0; window <= 1; window++) {
        plant_t pl;
        sim_scenario_config_t c = plant_run(&pl, hybrid_draft(4, 2, 8, 2, window));
        c.copy_hook = plant_draft_row_shifted;
        sim_run_caught_then_clean(c, &pl.hits, window ? "a draft row a token early, window "
                                                        "layers, P4 -> D2"
                                                      : "a draft row a token early, state "
                                                        "layers, P4 -> D2");
    }
}

static void test_sim_draft_refuses_direct_and_slice(void **state)
{
    (void)state;
    static const kvs_path_t paths[] = {KVS_PATH_DIRECT, KVS_PATH_SLICE};
    for (size_t i = 0; i < 2; i++) {
        sim_scenario_config_t c = small_draft(2, 2, 8, 1);
        c.path = paths[i];
        c.requests = 2;
        sim_report_t r;
        char err[384] = "";
        const int rc = sim_scenario_run(&c, &r, err, sizeof err);
        if (rc != KVS_ENOTSUP || strstr(err, "use the staging path") == NULL)
            fail_msg("path %d with a draft: %s (%s)", (int)paths[i], kvs_status_name(rc), err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_draft_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_draft_pp_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_draft_adds_its_bytes),
        cmocka_unit_test(test_sim_draft_catches_draft_into_model_slots),
        cmocka_unit_test(test_sim_draft_catches_row_shifted),
        cmocka_unit_test(test_sim_draft_catches_a_stage_off),
        cmocka_unit_test(test_sim_draft_hybrid_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_draft_hybrid_catches_row_shifted),
        cmocka_unit_test(test_sim_draft_refuses_direct_and_slice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
