/*
 * test_sim_data.c - the simulator's two data modes (sim/gpu.h): bytes, where
 * simulated memory holds every KV byte, and provenance, where it holds only
 * where each byte came from.
 *
 * - Mode equality: small runs over the paths (staging, direct, slice), TP
 *   pairs both ways, replicated heads, pipeline stages, cached prefixes and
 *   faults give the same report, bit for bit (times, counts, verified
 *   bytes, event digest), in both modes.
 * - Planted bugs: two known ways to misplace KV, planted through the test
 *   hooks of the simulated GPU and NIC (the core is not touched), must be
 *   caught as corrupt bytes in both modes:
 *     1. spec §3's modulo head mapping: the decode rank maps its writers'
 *        heads by `src % rep` where the spec divides (`src / rep`), so a
 *        replicated head lands in the wrong slot;
 *     2. an off-by-one writer offset: writers after the first write their
 *        block one byte past their offset in the region;
 *     3. MLA (one latent per token and layer, one writer per decode rank):
 *        the decode scatters each token from the next token's row, or each
 *        layer from the next layer's slot.
 * - MLA moves every byte in both modes at P > D, P < D, P = D (direct),
 *   slice, and with pipeline stages.
 * - Different page sizes on the two sides (16 -> 64, 64 -> 16, 48 -> 32)
 *   move every byte in both modes on every path; a planted wrong decode
 *   page mapping (a chunk's first two decode pages swapped) is caught.
 * The seed of each run is in its config; a failure names the run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenario.h"
#include "sim_run.h"

#define MS 1000000ull

/* A small Llama-like shape, as test_sim_protocol's. */
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
    c.rate_milli_per_s = 200000;
    c.ring_bytes = 8u << 20;
    c.staging = true;
    c.max_inflight = 4;
    c.seed = 42;
    return c;
}

/* Both modes, the same report; returns it. */
static sim_report_t same_in_both(const sim_scenario_config_t *c, const char *what)
{
    const sim_report_t b = sim_run_mode(*c, SIM_DATA_BYTES, what);
    const sim_report_t p = sim_run_mode(*c, SIM_DATA_PROVENANCE, what);
    if (b.digest != p.digest || b.sim_ns != p.sim_ns || b.events != p.events ||
        b.bytes_verified != p.bytes_verified || b.corrupt_bytes != p.corrupt_bytes ||
        b.requests_ok != p.requests_ok)
        fail_msg("%s (seed %llu): bytes mode digest %016llx, %llu ns, %llu events, %llu "
                 "verified, %llu corrupt, %u ok; provenance mode %016llx, %llu ns, %llu "
                 "events, %llu verified, %llu corrupt, %u ok",
                 what, (unsigned long long)c->seed, (unsigned long long)b.digest,
                 (unsigned long long)b.sim_ns, (unsigned long long)b.events,
                 (unsigned long long)b.bytes_verified, (unsigned long long)b.corrupt_bytes,
                 b.requests_ok, (unsigned long long)p.digest, (unsigned long long)p.sim_ns,
                 (unsigned long long)p.events, (unsigned long long)p.bytes_verified,
                 (unsigned long long)p.corrupt_bytes, p.requests_ok);
    assert_memory_equal(&b, &p, sizeof b); /* every count, time and latency */
    assert_int_equal(b.corrupt_bytes, 0);
    return b;
}

/* ---- mode equality ----------------------------------------------------------- */

static void test_sim_data_modes_agree_on_paths(void **state)
{
    (void)state;
    sim_scenario_config_t c = small(4, 2, 8);
    c.prompt_min_tokens = 1;
    c.prompt_max_tokens = 1500;
    c.prefix_max_tokens = 512; /* cached prefixes, page aligned */
    c.requests = 12;
    sim_report_t r = same_in_both(&c, "P4 -> D2 staging, prefixes");
    assert_int_equal(r.path, KVS_PATH_STAGING);
    assert_int_equal(r.requests_ok, 12);
    assert_true(r.bytes_verified > 0);

    c = small(2, 4, 8);
    same_in_both(&c, "P2 -> D4 staging");

    c = small(2, 2, 8);
    r = same_in_both(&c, "P2 -> D2 direct");
    assert_int_equal(r.path, KVS_PATH_DIRECT);

    c = small(4, 2, 8);
    c.path = KVS_PATH_SLICE;
    c.staging = false;
    r = same_in_both(&c, "P4 -> D2 slice");
    assert_int_equal(r.path, KVS_PATH_SLICE);
}

static void test_sim_data_modes_agree_on_heads_and_stages(void **state)
{
    (void)state;
    sim_scenario_config_t c = small(8, 2, 2); /* prefill ranks share a head */
    same_in_both(&c, "H2 P8 -> D2");
    c = small(2, 8, 4); /* decode ranks share a head */
    same_in_both(&c, "H4 P2 -> D8");
    c = small(4, 2, 8);
    c.shape.prefill_pp = 2;
    same_in_both(&c, "P4xPP2 -> D2");
    c.shape.decode_pp = 2;
    same_in_both(&c, "P4xPP2 -> D2xPP2");
    c = small(2, 4, 8);
    c.shape.layers = 7;
    c.shape.prefill_pp = 4;
    c.path = KVS_PATH_SLICE;
    c.staging = false;
    same_in_both(&c, "7 layers, P2xPP4 -> D4 slice");
}

static void add(sim_scenario_config_t *c, sim_fault_t f)
{
    assert_true(c->nfaults < SIM_MAX_FAULTS);
    c->faults[c->nfaults++] = f;
}

/* Failed writes land nothing, crashed ranks lose their memory, lost and
 * late messages change the order of copies: still the same run. */
static void test_sim_data_modes_agree_under_faults(void **state)
{
    (void)state;
    sim_scenario_config_t c = small(4, 2, 8);
    c.requests = 16;
    c.stall_timeout_ns = 200 * MS;
    add(&c, (sim_fault_t){.kind = SIM_FAULT_WRITE_ERROR, .num = 10, .den = 100});
    add(&c, (sim_fault_t){.kind = SIM_FAULT_DROP, .msg_type = 0, .num = 5, .den = 100});
    add(&c, (sim_fault_t){.kind = SIM_FAULT_DELAY, .num = 20, .den = 100, .delay_ns = 2 * MS});
    sim_report_t r = same_in_both(&c, "write errors, drops, delays");
    assert_true(r.requests_failed > 0 || r.msgs_retransmitted > 0);

    c = small(4, 2, 8);
    c.requests = 16;
    c.rate_milli_per_s = 100000;
    c.stall_timeout_ns = 200 * MS;
    add(&c, (sim_fault_t){.kind = SIM_FAULT_RESTART, .role = KVS_ROLE_DECODE, .rank = 0,
                          .at_ns = 60 * MS});
    add(&c, (sim_fault_t){.kind = SIM_FAULT_CRASH, .role = KVS_ROLE_PREFILL, .rank = 3,
                          .at_ns = 120 * MS});
    add(&c, (sim_fault_t){.kind = SIM_FAULT_SLOW_SCATTER, .role = KVS_ROLE_DECODE, .rank = 1,
                          .factor = 20});
    r = same_in_both(&c, "restart, crash, slow scatter");
    assert_int_equal(r.ranks_crashed, 2);
}

/* ---- planted bugs -------------------------------------------------------------- */

typedef struct plant {
    int64_t P, D, H;    /* one instance per side, PP 1 */
    uint64_t hits;      /* copies or writes the bug changed */
} plant_t;

/* Spec §3, P > D: writer i of decode rank d is prefill rank src = d*k + i
 * (k = P / D) and fills heads from ((src / rep) * src_heads) % dst_heads
 * (rep = P / H prefill ranks share a head). The bug maps by src % rep.
 * The core hands the decode scatter one part per head range, the last
 * replica of each; the planted decode takes, for each of its head ranges,
 * the block of the last writer the modulo mapping sends there. */
static void plant_modulo_heads(void *ctx, uint32_t gpu_id, bool scatter,
                               kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                               int64_t nparts)
{
    plant_t *pl = ctx;
    if (!scatter || gpu_id < (uint32_t)pl->P)
        return; /* decode scatters only */
    const int64_t d = (int64_t)gpu_id - pl->P, k = pl->P / pl->D;
    const int64_t src_heads = pl->H / pl->P > 0 ? pl->H / pl->P : 1;
    const int64_t dst_heads = pl->H / pl->D > 0 ? pl->H / pl->D : 1;
    const int64_t rep = pl->P / pl->H > 0 ? pl->P / pl->H : 1;
    const uint64_t writer_bytes = (uint64_t)(desc->tokens * src_heads * desc->head_dim *
                                             desc->elem_bytes * desc->staging_layer_slots * 2);
    /* The writer of parts[0] (the core's order: last of its replicas). */
    int64_t w0 = -1;
    for (int64_t i = 0; i < k; i++)
        if (((d * k + i) / rep * src_heads) % dst_heads == parts[0].head_start)
            w0 = i;
    assert_true(w0 >= 0);
    const uint64_t region = parts[0].staging_addr - (uint64_t)w0 * writer_bytes;
    for (int64_t j = 0; j < nparts; j++) {
        int64_t w = -1;
        for (int64_t i = 0; i < k; i++)
            if (((d * k + i) % rep * src_heads) % dst_heads == parts[j].head_start)
                w = i; /* modulo, not division */
        const uint64_t addr = w >= 0 ? region + (uint64_t)w * writer_bytes
                                     : parts[j].staging_addr;
        pl->hits += addr != parts[j].staging_addr;
        parts[j].staging_addr = addr;
    }
}

/* Writers after the first (prefill ranks with tp % k != 0) write one byte
 * past their offset in the region. */
static bool plant_writer_offset(void *ctx, const char *nic, const char *peer,
                                uint64_t *remote_addr, uint64_t *rkey, uint64_t len_bytes)
{
    (void)peer;
    (void)rkey;
    (void)len_bytes;
    plant_t *pl = ctx;
    int tp = 0, pp = 0;
    if (sscanf(nic, "p%d.%d", &tp, &pp) != 2 || tp % (pl->P / pl->D) == 0)
        return false;
    *remote_addr += 1;
    pl->hits++;
    return true;
}

/* Runs c with the plant pl (its hook context) in both modes. */
static void caught_in_both(sim_scenario_config_t c, plant_t *pl, const char *what)
{
    c.hook_ctx = pl;
    sim_run_caught_in_both(c, &pl->hits, what);
}

static void test_sim_data_catches_modulo_head_mapping(void **state)
{
    (void)state;
    /* H4, P8 -> D2: prefill ranks 2h and 2h+1 hold head h; decode rank d
     * holds heads 2d and 2d+1, from writers 0..3 = prefill 4d..4d+3. */
    sim_scenario_config_t c = small(8, 2, 4);
    plant_t pl = {.P = 8, .D = 2, .H = 4};
    c.copy_hook = plant_modulo_heads;
    caught_in_both(c, &pl, "modulo head mapping, H4 P8 -> D2");
    /* Without the plant the same run is clean: the hook's model of the
     * core's parts is right (it changes nothing under division). */
    sim_scenario_config_t clean = small(8, 2, 4);
    same_in_both(&clean, "H4 P8 -> D2, no plant");
}

static void test_sim_data_catches_writer_offset(void **state)
{
    (void)state;
    sim_scenario_config_t c = small(4, 2, 8);
    plant_t pl = {.P = 4, .D = 2, .H = 8};
    c.write_hook = plant_writer_offset;
    /* The bytes must land for the check to see them: a fabric without
     * region-scoped keys (whole-ring key, as verbs and ofi today). */
    c.net.no_key_grant = true;
    caught_in_both(c, &pl, "writer offset + 1, P4 -> D2");
    /* With scoped keys the same writes reach one byte past their grant:
     * the fabric refuses them, not one lands, the requests fail instead. */
    c.net.no_key_grant = false;
    pl.hits = 0;
    c.hook_ctx = &pl;
    const sim_report_t r = sim_run_mode(c, SIM_DATA_BYTES, "writer offset + 1, scoped keys");
    assert_true(pl.hits > 0);
    assert_int_equal(r.corrupt_bytes, 0);
    assert_int_equal(r.requests_ok, 0);
    assert_int_equal(r.ring_leaked_bytes, 0);
}

/* ---- MLA: one latent per token and layer, one writer per decode rank ------- */

/* DeepSeek-V3's latent (576 elements, bf16) on a small model. */
static sim_scenario_config_t small_mla(int64_t p, int64_t d)
{
    sim_scenario_config_t c = small(p, d, 0);
    c.shape.head_dim = 576;
    c.shape.kind = KVS_KV_MLA;
    return c;
}

static void test_sim_data_mla_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t p, d, pp, dpp;
        kvs_path_t path;
        const char *what;
    } runs[] = {
        {4, 2, 1, 1, KVS_PATH_AUTO, "MLA P4 -> D2 staging (2 ranks only report)"},
        {8, 2, 1, 1, KVS_PATH_AUTO, "MLA P8 -> D2 staging"},
        {2, 4, 1, 1, KVS_PATH_AUTO, "MLA P2 -> D4 staging"},
        {2, 2, 1, 1, KVS_PATH_AUTO, "MLA P2 -> D2 direct"},
        {4, 2, 1, 1, KVS_PATH_SLICE, "MLA P4 -> D2 slice"},
        {4, 2, 2, 1, KVS_PATH_AUTO, "MLA P4xPP2 -> D2"},
        {4, 2, 2, 2, KVS_PATH_AUTO, "MLA P4xPP2 -> D2xPP2"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small_mla(runs[i].p, runs[i].d);
        c.shape.prefill_pp = runs[i].pp;
        c.shape.decode_pp = runs[i].dpp;
        c.path = runs[i].path;
        c.staging = runs[i].path != KVS_PATH_SLICE;
        c.prefix_max_tokens = 128;
        const sim_report_t r = same_in_both(&c, runs[i].what);
        if (r.requests_ok != c.requests || r.violations != 0)
            fail_msg("%s: %u of %u ok, %llu violations", runs[i].what, r.requests_ok,
                     c.requests, (unsigned long long)r.violations);
        /* Every decode rank checked one plane: the latent, never a V. */
        assert_true(r.bytes_verified > 0);
        assert_int_equal(r.bytes_verified % (576 * 2), 0);
    }
    /* One writer: as many staged writes as chunks (x stages), where GQA's
     * P4 -> D2 makes two per chunk. */
    sim_scenario_config_t c = small_mla(4, 2);
    const sim_report_t mla = sim_run_mode(c, SIM_DATA_PROVENANCE, "MLA P4 -> D2 ops");
    c = small(4, 2, 8);
    const sim_report_t gqa = sim_run_mode(c, SIM_DATA_PROVENANCE, "GQA P4 -> D2 ops");
    assert_true(mla.rdma_ops < gqa.rdma_ops);
}

/* The decode scatters each token's latent from the next token's row of
 * the region (an off-by-one row): every token but the last gets its
 * neighbour's latent. */
static void plant_mla_wrong_row(void *ctx, uint32_t gpu_id, bool scatter,
                                kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                int64_t nparts)
{
    plant_t *pl = ctx;
    if (!scatter || gpu_id < (uint32_t)pl->P || desc->tokens < 2)
        return;
    assert_int_equal(desc->planes, 1);
    assert_int_equal(nparts, 1); /* one writer per decode rank */
    parts[0].staging_addr += (uint64_t)(desc->head_dim * desc->elem_bytes);
    pl->hits++;
}

/* The decode scatters layer j from the staging slot of layer j + 1: the
 * latent of the wrong layer. */
static void plant_mla_wrong_layer(void *ctx, uint32_t gpu_id, bool scatter,
                                  kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                  int64_t nparts)
{
    plant_t *pl = ctx;
    (void)nparts;
    if (!scatter || gpu_id < (uint32_t)pl->P || desc->tokens == 0)
        return;
    parts[0].staging_addr += (uint64_t)(desc->tokens * desc->head_dim * desc->elem_bytes);
    pl->hits++;
}

static void test_sim_data_catches_mla_wrong_row_and_layer(void **state)
{
    (void)state;
    sim_scenario_config_t c = small_mla(4, 2);
    plant_t pl = {.P = 4, .D = 2, .H = 1};
    c.copy_hook = plant_mla_wrong_row;
    caught_in_both(c, &pl, "MLA latent of the next token, P4 -> D2");
    c.copy_hook = plant_mla_wrong_layer;
    caught_in_both(c, &pl, "MLA latent of the next layer, P4 -> D2");
}

/* ---- FP8 KV with scale planes (docs/kinds/fp8-scales.md) ------------------ */

/* The small model in fp8 with scale planes: per-token (one fp32 per token
 * and head, 4 bytes) or per-block (one e8m0 byte per 32 elements: 2 bytes
 * a head of 64). */
static sim_scenario_config_t small_fp8(int64_t p, int64_t d, int64_t heads,
                                       kvs_kv_scales_t scales)
{
    sim_scenario_config_t c = small(p, d, heads);
    c.shape.dtype = KVS_DTYPE_FP8;
    c.shape.kv_scales = scales;
    return c;
}

static void test_sim_data_fp8_scales_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t p, d, pp, dpp, heads;
        kvs_kv_scales_t scales;
        kvs_kv_kind_t kind;
        kvs_path_t path;
        const char *what;
    } runs[] = {
        {4, 2, 1, 1, 8, KVS_KV_SCALES_PER_TOKEN, KVS_KV_GQA, KVS_PATH_AUTO,
         "per-token scales, P4 -> D2 staging"},
        {2, 4, 1, 1, 8, KVS_KV_SCALES_PER_TOKEN, KVS_KV_GQA, KVS_PATH_AUTO,
         "per-token scales, P2 -> D4 staging"},
        {8, 2, 1, 1, 4, KVS_KV_SCALES_PER_BLOCK, KVS_KV_GQA, KVS_PATH_AUTO,
         "MXFP8 scales, H4 P8 -> D2 (heads replicated)"},
        {2, 2, 1, 1, 8, KVS_KV_SCALES_PER_TOKEN, KVS_KV_GQA, KVS_PATH_AUTO,
         "per-token scales, P2 -> D2 direct"},
        {2, 2, 1, 1, 8, KVS_KV_SCALES_PER_BLOCK, KVS_KV_GQA, KVS_PATH_STAGING,
         "MXFP8 scales, P2 -> D2 staging"},
        {4, 2, 1, 1, 8, KVS_KV_SCALES_PER_BLOCK, KVS_KV_GQA, KVS_PATH_SLICE,
         "MXFP8 scales, P4 -> D2 slice"},
        {4, 2, 2, 1, 8, KVS_KV_SCALES_PER_TOKEN, KVS_KV_GQA, KVS_PATH_AUTO,
         "per-token scales, P4xPP2 -> D2"},
        {4, 2, 2, 2, 8, KVS_KV_SCALES_PER_BLOCK, KVS_KV_GQA, KVS_PATH_AUTO,
         "MXFP8 scales, P4xPP2 -> D2xPP2"},
        {4, 2, 1, 1, 0, KVS_KV_SCALES_PER_BLOCK, KVS_KV_MLA, KVS_PATH_AUTO,
         "MXFP8 scales of an MLA latent, P4 -> D2"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small_fp8(runs[i].p, runs[i].d, runs[i].heads, runs[i].scales);
        c.shape.kind = runs[i].kind;
        if (runs[i].kind == KVS_KV_MLA)
            c.shape.head_dim = 576;
        c.shape.prefill_pp = runs[i].pp;
        c.shape.decode_pp = runs[i].dpp;
        c.path = runs[i].path;
        c.staging = runs[i].path != KVS_PATH_SLICE;
        c.prefix_max_tokens = 128;
        const sim_report_t r = same_in_both(&c, runs[i].what);
        if (r.requests_ok != c.requests || r.violations != 0 || r.corrupt_bytes != 0)
            fail_msg("%s: %u of %u ok, %llu violations, %llu corrupt", runs[i].what,
                     r.requests_ok, c.requests, (unsigned long long)r.violations,
                     (unsigned long long)r.corrupt_bytes);
        /* Every scale slot was checked as well as every K/V slot: the same
         * run without scales verifies hd bytes a head where this one
         * verifies hd + scale bytes. */
        sim_scenario_config_t plain = c;
        plain.shape.kv_scales = KVS_KV_SCALES_NONE;
        const sim_report_t q = sim_run_mode(plain, SIM_DATA_PROVENANCE, runs[i].what);
        const uint64_t hd = (uint64_t)c.shape.head_dim;
        const uint64_t sb = runs[i].scales == KVS_KV_SCALES_PER_TOKEN ? 4 : hd / 32;
        assert_true(q.bytes_verified > 0);
        if (r.bytes_verified * hd != q.bytes_verified * (hd + sb))
            fail_msg("%s: %llu bytes verified with scales, %llu without: want x %llu / %llu",
                     runs[i].what, (unsigned long long)r.bytes_verified,
                     (unsigned long long)q.bytes_verified, (unsigned long long)(hd + sb),
                     (unsigned long long)hd);
    }
}

/* Plants that move only the scales: the decode's scatter writes them
 * through scale buffers shifted by one head (each head gets its
 * neighbour's scales) or by one token slot (each token the scales of the
 * token before it); the K and V rows stay right. */
typedef struct plant_scales {
    plant_t base;     /* first: caught_in_both counts its hits */
    uint64_t shift;   /* bytes: scale_bytes (a head) or local heads x that */
    bool by_token;
    uint64_t ks[16], vs[16];
} plant_scales_t;

static void plant_scale_shift(void *ctx, uint32_t gpu_id, bool scatter, kvs_copy_desc_t *desc,
                              kvs_copy_part_t *parts, int64_t nparts)
{
    plant_scales_t *pl = ctx;
    (void)parts;
    (void)nparts;
    if (!scatter || gpu_id < (uint32_t)pl->base.P || desc->tokens == 0)
        return;
    assert_true(desc->scale_bytes > 0);
    assert_true(desc->layer_count <= 16);
    const uint64_t shift = (uint64_t)desc->scale_bytes *
                           (pl->by_token ? (uint64_t)desc->local_heads : 1u);
    for (int64_t j = 0; j < desc->layer_count; j++) {
        pl->ks[desc->layer_begin + j] = desc->ks_base[desc->layer_begin + j] + shift;
        pl->vs[desc->layer_begin + j] = desc->vs_base[desc->layer_begin + j] + shift;
    }
    desc->ks_base = pl->ks;
    desc->vs_base = pl->vs;
    pl->base.hits++;
}

static void test_sim_data_catches_scale_of_wrong_head_or_token(void **state)
{
    (void)state;
    for (int by_token = 0; by_token < 2; by_token++) {
        sim_scenario_config_t c = small_fp8(4, 2, 8, KVS_KV_SCALES_PER_TOKEN);
        plant_scales_t pl = {.base = {.P = 4, .D = 2, .H = 8}, .by_token = by_token != 0};
        c.copy_hook = plant_scale_shift;
        caught_in_both(c, &pl.base, by_token ? "scales of the previous token row, P4 -> D2"
                                             : "scales of the next head, P4 -> D2");
    }
    /* The same run without the plant is clean. */
    sim_scenario_config_t c = small_fp8(4, 2, 8, KVS_KV_SCALES_PER_TOKEN);
    const sim_report_t r = same_in_both(&c, "per-token scales, no plant");
    assert_int_equal(r.corrupt_bytes, 0);
    assert_int_equal(r.requests_ok, c.requests);
}

/* ---- different page sizes on the two sides (docs/kinds/page-sizes.md) ---- */

static void test_sim_data_two_page_sizes_every_byte_in_both_modes(void **state)
{
    (void)state;
    static const struct {
        int64_t p, d, pp, dpp, ps, dps, chunk;
        kvs_path_t path;
        const char *what;
    } runs[] = {
        {4, 2, 1, 1, 16, 64, 256, KVS_PATH_AUTO, "pages 16 -> 64, P4 -> D2 staging"},
        {2, 4, 1, 1, 64, 16, 256, KVS_PATH_AUTO, "pages 64 -> 16, P2 -> D4 staging"},
        {4, 2, 1, 1, 48, 32, 192, KVS_PATH_AUTO, "pages 48 -> 32 (lcm 96), P4 -> D2"},
        {2, 2, 1, 1, 16, 64, 256, KVS_PATH_AUTO, "pages 16 -> 64, P2 -> D2 direct"},
        {2, 2, 1, 1, 48, 32, 192, KVS_PATH_AUTO, "pages 48 -> 32, P2 -> D2 direct"},
        {4, 2, 1, 1, 64, 16, 256, KVS_PATH_SLICE, "pages 64 -> 16, P4 -> D2 slice"},
        {4, 2, 2, 1, 16, 64, 256, KVS_PATH_AUTO, "pages 16 -> 64, P4xPP2 -> D2"},
        {4, 2, 2, 2, 64, 16, 256, KVS_PATH_AUTO, "pages 64 -> 16, P4xPP2 -> D2xPP2"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small(runs[i].p, runs[i].d, 8);
        c.shape.prefill_pp = runs[i].pp;
        c.shape.decode_pp = runs[i].dpp;
        c.shape.page_size = runs[i].ps;
        c.shape.decode_page_size = runs[i].dps;
        c.shape.chunk_tokens = runs[i].chunk;
        c.path = runs[i].path;
        c.staging = runs[i].path != KVS_PATH_SLICE;
        c.prompt_min_tokens = 1;
        c.prefix_max_tokens = 300; /* aligned to both page sizes */
        const sim_report_t r = same_in_both(&c, runs[i].what);
        if (r.requests_ok != c.requests || r.violations != 0 || r.bytes_verified == 0)
            fail_msg("%s: %u of %u ok, %llu violations, %llu bytes verified", runs[i].what,
                     r.requests_ok, c.requests, (unsigned long long)r.violations,
                     (unsigned long long)r.bytes_verified);
    }
    /* Equal sizes, given or not, are the same run byte for byte. */
    sim_scenario_config_t c = small(4, 2, 8);
    const sim_report_t zero = sim_run_mode(c, SIM_DATA_PROVENANCE, "decode_page_size 0");
    c.shape.decode_page_size = c.shape.page_size;
    const sim_report_t same = sim_run_mode(c, SIM_DATA_PROVENANCE, "decode_page_size 16");
    assert_memory_equal(&zero, &same, sizeof zero);
}

/* The decode maps a chunk's token rows to the wrong pages of its own: the
 * rows of the chunk's first decode page go to its second and back (what
 * a scatter that indexes decode pages by the prefill's page size, or
 * misplaces a prefill page that spans two decode pages, does). */
typedef struct plant_pages {
    plant_t pl;
    int64_t swapped[1024];
} plant_pages_t;

static void plant_swapped_decode_pages(void *ctx, uint32_t gpu_id, bool scatter,
                                       kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                       int64_t nparts)
{
    (void)parts;
    (void)nparts;
    plant_pages_t *pp = ctx;
    if (!scatter || gpu_id < (uint32_t)pp->pl.P || desc->num_pages < 2 ||
        desc->tokens <= desc->page_size || desc->num_pages > 1024)
        return;
    memcpy(pp->swapped, desc->pages, (size_t)desc->num_pages * sizeof *desc->pages);
    pp->swapped[0] = desc->pages[1];
    pp->swapped[1] = desc->pages[0];
    desc->pages = pp->swapped;
    pp->pl.hits++;
}

static void test_sim_data_catches_wrong_decode_page(void **state)
{
    (void)state;
    static const struct {
        int64_t ps, dps;
        const char *what;
    } runs[] = {
        {16, 64, "rows to the wrong decode page, pages 16 -> 64"},
        {64, 16, "rows to the wrong decode page, pages 64 -> 16"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sim_scenario_config_t c = small(4, 2, 8);
        c.shape.page_size = runs[i].ps;
        c.shape.decode_page_size = runs[i].dps;
        plant_pages_t pp = {.pl = {.P = 4, .D = 2, .H = 8}};
        c.copy_hook = plant_swapped_decode_pages;
        caught_in_both(c, &pp.pl, runs[i].what);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_data_modes_agree_on_paths),
        cmocka_unit_test(test_sim_data_modes_agree_on_heads_and_stages),
        cmocka_unit_test(test_sim_data_modes_agree_under_faults),
        cmocka_unit_test(test_sim_data_catches_modulo_head_mapping),
        cmocka_unit_test(test_sim_data_catches_writer_offset),
        cmocka_unit_test(test_sim_data_mla_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_data_catches_mla_wrong_row_and_layer),
        cmocka_unit_test(test_sim_data_fp8_scales_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_data_catches_scale_of_wrong_head_or_token),
        cmocka_unit_test(test_sim_data_two_page_sizes_every_byte_in_both_modes),
        cmocka_unit_test(test_sim_data_catches_wrong_decode_page),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
