/*
 * verify.c - the data of a simulated run (run.h): the pattern of sim/kvdata
 * written into the prefill ranks' KV pools as their forward passes compute
 * tokens, and checked in the decode ranks' pools when a room ends, byte
 * for byte or by provenance (sim/prov.c), layer by layer and page run by
 * page run; and each ok result's aux payload.
 */
#include "run.h"

#include "prov.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t sim_max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Global head of local head j on a rank of TP tp holding `heads` heads. */
static int64_t sim_global_head(int64_t total, int64_t tp_size, int64_t rank, int64_t heads,
                               int64_t j)
{
    if (total >= tp_size)
        return rank * heads + j;
    return rank / (tp_size / total); /* replicated: ranks sharing a head */
}

/* Buffer kv of a local layer: 0 K, 1 V, 2 and 3 their scales. */
static uint64_t sim_base(const sim_node_t *n, int64_t layer, int kv)
{
    const uint64_t *const bases[] = {n->k_base, n->v_base, n->ks_base, n->vs_base};
    return bases[kv][layer];
}

/* The buffers of a layer, in the order they are walked: its planes (K and
 * V, or MLA's latent), then with scales each plane's scales; buffer q is
 * kv sim_buf_kv, of sim_buf_bytes a head. */
static int sim_bufs(const kvs_layout_t *l)
{
    return (int)l->planes * (l->scale_bytes > 0 ? 2 : 1);
}

static int sim_buf_kv(const kvs_layout_t *l, int q)
{
    return q < l->planes ? q : 2 + (q - (int)l->planes);
}

static int64_t sim_buf_bytes(const kvs_layout_t *l, int q)
{
    return q < l->planes ? l->head_dim * l->elem_bytes : l->scale_bytes;
}

static uint8_t *sim_slot(const sim_node_t *n, int64_t layer, int kv, int64_t page, int64_t slot,
                         int64_t head, int64_t ps, int64_t head_bytes)
{
    const uint64_t addr = sim_base(n, layer, kv) +
                          (uint64_t)(((page * ps + slot) * n->heads + head) * head_bytes);
    return n->pool_host + (addr - n->pool_addr);
}

/* Tokens from t (< end) whose pool slots follow t's, in a page list that
 * starts at token `base` (page aligned). */
static int64_t sim_slot_run(const int64_t *pages, int64_t base, int64_t t, int64_t end,
                            int64_t ps)
{
    const int64_t first = pages[(t - base) / ps] * ps + t % ps;
    int64_t n = ps - t % ps;
    while (t + n < end && pages[(t + n - base) / ps] * ps == first + n)
        n += ps;
    return n < end - t ? n : end - t;
}

/* The KV pool address of (local layer, K/V, token t) on node n, its pages
 * starting at token base. */
static uint64_t sim_slot_addr(const sim_node_t *n, int64_t layer, int kv, const int64_t *pages,
                              int64_t base, int64_t t, int64_t ps, int64_t head_bytes)
{
    const int64_t slot = pages[(t - base) / ps] * ps + t % ps;
    return sim_base(n, layer, kv) + (uint64_t)(slot * n->heads * head_bytes);
}

/* The kind of node n's local layer `layer` (full for a model of full
 * layers alone). */
static kvs_layer_kind_t sim_layer_kind(const kvs_layout_t *l, const sim_node_t *n,
                                       int64_t layer)
{
    kvs_layer_kind_t kind = KVS_LAYER_FULL;
    (void)kvs_layout_layer_kind(l, n->first_layer + layer, &kind);
    return kind;
}

/* The first token of a request of `total` tokens whose rows of local
 * layer `layer` a decode rank holds (kvs_layout_layer_tokens: 0 for a full
 * layer, the page-aligned window start for a window layer). */
static int64_t sim_layer_first(const kvs_layout_t *l, const sim_node_t *n, int64_t layer,
                               int64_t total)
{
    int64_t start = 0, end = 0;
    (void)kvs_layout_layer_tokens(l, n->first_layer + layer, total, &start, &end);
    return start;
}

/* The provenance of node n's rows of tokens [a, b) of a request, layer by
 * layer, one run per page run: written (prefill) or checked (decode,
 * returning the bytes that differ; a window layer's rows from its window's
 * first page on). State layers have no rows. */
static uint64_t sim_prov_pass(sim_scenario_t *sc, sim_node_t *n, uint64_t req,
                              const int64_t *pages, int64_t base, int64_t a, int64_t b,
                              bool check)
{
    const kvs_layout_t *l = &sc->lay;
    const int64_t ps = n->ps;
    sim_prov_map_t *map = sim_gpu_prov(n->gpu);
    const int64_t g0 = sim_global_head(l->total_heads, n->inst->tp, n->tp, n->heads, 0);
    /* The runs of slots first, once: a long page list costs its length
     * once, not once per layer and K/V. */
    size_t nruns = 0;
    for (int64_t t = a; t < b; nruns++) {
        if (nruns == sc->slot_runs_cap) {
            const size_t cap = nruns == 0 ? 64 : 2 * nruns;
            int64_t *v = realloc(sc->slot_runs, 2 * cap * sizeof *v);
            if (v == NULL) {
                sim_fail(sc, KVS_ENOMEM, "%s: out of host memory for a page list", n->name);
                return check ? (uint64_t)(b - a) * (uint64_t)(n->heads * sim_buf_bytes(l, 0))
                             : 0;
            }
            sc->slot_runs = v;
            sc->slot_runs_cap = cap;
        }
        sc->slot_runs[2 * nruns] = t;
        sc->slot_runs[2 * nruns + 1] = sim_slot_run(pages, base, t, b, ps);
        t += sc->slot_runs[2 * nruns + 1];
    }
    uint64_t bad = 0;
    for (int64_t layer = 0; layer < n->layers; layer++) {
        if (sim_layer_kind(l, n, layer) == KVS_LAYER_STATE)
            continue;
        const int64_t from = check ? sim_layer_first(l, n, layer, sc->reqs[req].tokens) : a;
        for (int q = 0; q < sim_bufs(l); q++) { /* K, V (or latent), scales */
            const int kv = sim_buf_kv(l, q);
            const int64_t hb = sim_buf_bytes(l, q);
            if (!check) /* one rewrite per layer and K/V */
                sim_prov_batch_begin(map);
            for (size_t k = 0; k < nruns; k++) {
                int64_t t = sc->slot_runs[2 * k], cnt = sc->slot_runs[2 * k + 1];
                if (t + cnt <= from)
                    continue; /* before the window */
                if (t < from) { /* the run's slots are consecutive */
                    cnt -= from - t;
                    t = from;
                }
                const sim_kv_coord_t c = {req, n->first_layer + layer, kv, g0, t};
                const sim_prov_run_t run = sim_kvdata_prov_rows(
                    &c, n->heads, cnt, l->total_heads, hb,
                    sim_slot_addr(n, layer, kv, pages, base, t, ps, hb));
                if (check)
                    bad += sim_prov_diff(map, &run);
                else if (sim_prov_batch_write(map, &run) != KVS_OK)
                    sim_fail(sc, KVS_ENOMEM, "%s: out of host memory for the provenance "
                             "of the KV pool", n->name);
            }
            if (!check && sim_prov_batch_end(map) != KVS_OK)
                sim_fail(sc, KVS_ENOMEM, "%s: out of host memory for the provenance "
                         "of the KV pool", n->name);
        }
    }
    return bad;
}

/* The state of request req in local state layer `layer` of node n, local
 * state head j: its address, and its coordinate (the K vector of token 0
 * of that layer and global state head, of state_head_bytes: a state layer
 * has no K rows, so no other vector has it). */
static uint64_t sim_state_addr(const sim_node_t *n, const kvs_layout_t *l, uint64_t req,
                               int64_t layer, int64_t j)
{
    return n->state_base[layer] +
           (uint64_t)(((int64_t)req * n->state_heads + j) * l->state_head_bytes);
}

static sim_kv_coord_t sim_state_coord(const sim_node_t *n, const kvs_layout_t *l, uint64_t req,
                                      int64_t layer, int64_t j)
{
    return (sim_kv_coord_t){req, n->first_layer + layer, 0,
                            sim_global_head(l->state_heads, n->inst->tp, n->tp, n->state_heads,
                                            j),
                            0};
}

/* The request's state in every state layer of node n: written (prefill, at
 * the end of its prompt) or checked (decode; returns the bytes that differ
 * and adds the bytes checked to *checked), in either data mode. */
static uint64_t sim_state_pass(sim_scenario_t *sc, sim_node_t *n, uint64_t req, bool check,
                               uint64_t *checked)
{
    const kvs_layout_t *l = &sc->lay;
    sim_prov_map_t *map = sim_gpu_prov(n->gpu);
    const int64_t hb = l->state_head_bytes;
    uint64_t bad = 0;
    for (int64_t layer = 0; n->state_base != NULL && layer < n->layers; layer++) {
        if (sim_layer_kind(l, n, layer) != KVS_LAYER_STATE)
            continue;
        if (map != NULL) { /* the slot's state heads are consecutive global heads */
            const sim_kv_coord_t c = sim_state_coord(n, l, req, layer, 0);
            const sim_prov_run_t run = sim_kvdata_prov_rows(
                &c, n->state_heads, 1, l->state_heads, hb, sim_state_addr(n, l, req, layer, 0));
            if (check)
                bad += sim_prov_diff(map, &run);
            else if (sim_prov_write(map, &run) != KVS_OK)
                sim_fail(sc, KVS_ENOMEM, "%s: out of host memory for the provenance of the "
                         "state buffers", n->name);
        }
        for (int64_t j = 0; map == NULL && j < n->state_heads; j++) {
            const sim_kv_coord_t c = sim_state_coord(n, l, req, layer, j);
            uint8_t *at = n->pool_host + (sim_state_addr(n, l, req, layer, j) - n->pool_addr);
            if (check)
                bad += sim_kvdata_check(at, (size_t)hb, &c);
            else
                sim_kvdata_fill(at, (size_t)hb, &c);
        }
        if (checked != NULL)
            *checked += (uint64_t)(n->state_heads * hb);
    }
    return bad;
}

/* A draft model's rows (docs/kinds/draft.md) of tokens [a, b) of a request
 * on node n, its pages starting at token base: written (prefill) or
 * checked (decode; returns the bytes that differ and adds those checked to
 * *checked), in either data mode. Draft layer i's vectors have the
 * coordinate of global layer layers + i (no model layer has it), the
 * model's heads and tokens, draft_head_dim elements each, so a draft byte
 * in a model slot, another draft layer or another token is wrong. With
 * PP the draft lives on the last stage of each instance (src/draft.c):
 * only there is it computed, moved and checked; the buffers of the other
 * stages are left alone, so a draft part that lands on one is corrupt
 * nowhere but is missing on the last stage. */
static uint64_t sim_draft_pass(sim_scenario_t *sc, sim_node_t *n, uint64_t req,
                               const int64_t *pages, int64_t base, int64_t a, int64_t b,
                               bool check, uint64_t *checked)
{
    const kvs_layout_t *l = &sc->lay;
    if (n->pp != n->inst->pp - 1)
        return 0;
    sim_prov_map_t *map = sim_gpu_prov(n->gpu);
    const int64_t hb = l->draft_head_dim * l->elem_bytes, ps = n->ps;
    uint64_t bad = 0;
    for (int64_t i = 0; i < l->draft_layers; i++)
        for (int kv = 0; kv < l->planes; kv++) {
            const uint64_t buf = (kv == 0 ? n->draft_k_base : n->draft_v_base)[i];
            for (int64_t t = a, cnt = 0; t < b; t += cnt) {
                cnt = sim_slot_run(pages, base, t, b, ps);
                const uint64_t at = buf + (uint64_t)((pages[(t - base) / ps] * ps + t % ps) *
                                                     n->heads * hb);
                sim_kv_coord_t c = {req, l->layers + i, kv,
                                    sim_global_head(l->total_heads, n->inst->tp, n->tp,
                                                    n->heads, 0),
                                    t};
                if (map != NULL) { /* the run's rows of consecutive global heads */
                    const sim_prov_run_t run = sim_kvdata_prov_rows(&c, n->heads, cnt,
                                                                    l->total_heads, hb, at);
                    if (check)
                        bad += sim_prov_diff(map, &run);
                    else if (sim_prov_write(map, &run) != KVS_OK)
                        sim_fail(sc, KVS_ENOMEM, "%s: out of host memory for the provenance "
                                 "of the draft's buffers", n->name);
                    continue;
                }
                for (int64_t k = 0; k < cnt; k++)
                    for (int64_t j = 0; j < n->heads; j++) {
                        c.token = t + k;
                        c.head = sim_global_head(l->total_heads, n->inst->tp, n->tp, n->heads,
                                                 j);
                        uint8_t *p = n->pool_host +
                                     (at + (uint64_t)((k * n->heads + j) * hb) - n->pool_addr);
                        if (check)
                            bad += sim_kvdata_check(p, (size_t)hb, &c);
                        else
                            sim_kvdata_fill(p, (size_t)hb, &c);
                    }
            }
            if (checked != NULL)
                *checked += (uint64_t)((b - a) * n->heads * hb);
        }
    return bad;
}

/* In the bytes mode a vector shorter than this is not looked at before the
 * window: what a page held (zeros, another request's bytes) equals a
 * vector's pattern by chance once in 2^(8 x its bytes), so the 1- and
 * 2-byte scale vectors of MXFP8 would be found "written" there in a
 * campaign's thousands of runs. Their rows' KV vectors are looked at, and
 * the provenance mode looks at every row. */
#define SIM_BEFORE_WINDOW_MIN_BYTES 8

/* A window layer's decode pages before its window must not be written for
 * this request (the engine never reads them): each of their vectors (rows,
 * in the provenance mode) that holds the request's own bytes counts as
 * corrupt, whole. Returns those bytes. */
static uint64_t sim_check_before_window(sim_scenario_t *sc, sim_node_t *n, uint64_t req)
{
    const kvs_layout_t *l = &sc->lay;
    const sim_req_t *r = &sc->reqs[req];
    sim_prov_map_t *map = sim_gpu_prov(n->gpu);
    uint64_t bad = 0;
    for (int64_t layer = 0; layer < n->layers; layer++) {
        if (sim_layer_kind(l, n, layer) != KVS_LAYER_WINDOW)
            continue;
        const int64_t ws = sim_layer_first(l, n, layer, r->tokens);
        for (int q = 0; q < sim_bufs(l); q++)
            for (int64_t t = r->base, kv = sim_buf_kv(l, q), hb = sim_buf_bytes(l, q); t < ws;
                 t++) {
                const int64_t g0 = sim_global_head(l->total_heads, n->inst->tp, n->tp,
                                                   n->heads, 0);
                if (map != NULL) {
                    const sim_kv_coord_t c = {req, n->first_layer + layer, (int32_t)kv, g0, t};
                    const sim_prov_run_t run = sim_kvdata_prov_rows(
                        &c, n->heads, 1, l->total_heads, hb,
                        sim_slot_addr(n, layer, (int)kv, r->dpages, r->base, t, n->ps, hb));
                    bad += sim_prov_diff(map, &run) == 0 ? run.len_bytes : 0;
                    continue;
                }
                for (int64_t j = 0; j < n->heads && hb >= SIM_BEFORE_WINDOW_MIN_BYTES; j++) {
                    const sim_kv_coord_t c = {
                        req, n->first_layer + layer, (int32_t)kv,
                        sim_global_head(l->total_heads, n->inst->tp, n->tp, n->heads, j), t};
                    const uint8_t *at = sim_slot(n, layer, (int)kv,
                                                 r->dpages[(t - r->base) / n->ps], t % n->ps, j,
                                                 n->ps, hb);
                    bad += sim_kvdata_check(at, (size_t)hb, &c) == 0 ? (uint64_t)hb : 0;
                }
            }
    }
    return bad;
}

/* The forward pass of tokens [a, b) on one prefill rank. */
void sim_fill_prefill(sim_scenario_t *sc, sim_node_t *n, uint64_t req, int64_t a, int64_t b)
{
    const kvs_layout_t *l = &sc->lay;
    const int64_t ps = n->ps;
    const sim_req_t *r = &sc->reqs[req];
    if (b == r->tokens) /* the prompt's end: its state */
        sim_state_pass(sc, n, req, false, NULL);
    sim_draft_pass(sc, n, req, r->ppages, 0, a, b, false, NULL);
    if (sim_gpu_prov(n->gpu) != NULL) {
        sim_prov_pass(sc, n, req, r->ppages, 0, a, b, false);
        return;
    }
    for (int64_t layer = 0; layer < n->layers; layer++)
        for (int q = 0; q < sim_bufs(l) && sim_layer_kind(l, n, layer) != KVS_LAYER_STATE;
             q++) /* K and V, or MLA's latent; scales; a state layer has no rows */
            for (int64_t t = a, kv = sim_buf_kv(l, q), hb = sim_buf_bytes(l, q); t < b; t++)
                for (int64_t j = 0; j < n->heads; j++) {
                    sim_kv_coord_t c = {req, n->first_layer + layer, (int32_t)kv,
                                        sim_global_head(l->total_heads, n->inst->tp, n->tp,
                                                        n->heads, j),
                                        t};
                    sim_kvdata_fill(sim_slot(n, layer, (int)kv, r->ppages[t / ps], t % ps, j, ps,
                                             hb),
                                    (size_t)hb, &c);
                }
}

/* Checks what one decode rank received for a request; returns bytes checked. */
uint64_t sim_verify_decode(sim_scenario_t *sc, sim_node_t *n, uint64_t req,
                           uint64_t *corrupt)
{
    const kvs_layout_t *l = &sc->lay;
    const int64_t ps = n->ps;
    const sim_req_t *r = &sc->reqs[req];
    /* A token's rows of every buffer of a layer (K and V, or the latent;
     * with scales their scales too), on this rank's heads. */
    int64_t row_bytes = 0;
    for (int q = 0; q < sim_bufs(l); q++)
        row_bytes += n->heads * sim_buf_bytes(l, q);
    uint64_t checked = 0;
    *corrupt += sim_state_pass(sc, n, req, true, &checked) + sim_check_before_window(sc, n, req) +
                sim_draft_pass(sc, n, req, r->dpages, r->base, r->base, r->tokens, true,
                               &checked);
    if (sim_gpu_prov(n->gpu) != NULL) {
        *corrupt += sim_prov_pass(sc, n, req, r->dpages, r->base, r->base, r->tokens, true);
        for (int64_t layer = 0; layer < n->layers; layer++) {
            const int64_t from = sim_layer_first(l, n, layer, r->tokens);
            if (sim_layer_kind(l, n, layer) != KVS_LAYER_STATE)
                checked += (uint64_t)(r->tokens - (from > r->base ? from : r->base)) *
                           (uint64_t)row_bytes;
        }
        return checked;
    }
    for (int64_t layer = 0; layer < n->layers; layer++)
        for (int q = 0; q < sim_bufs(l) && sim_layer_kind(l, n, layer) != KVS_LAYER_STATE; q++)
            for (int64_t t = sim_max_i64(r->base, sim_layer_first(l, n, layer, r->tokens)),
                         kv = sim_buf_kv(l, q), hb = sim_buf_bytes(l, q);
                 t < r->tokens; t++)
                for (int64_t j = 0; j < n->heads; j++) {
                    sim_kv_coord_t c = {req, n->first_layer + layer, (int32_t)kv,
                                        sim_global_head(l->total_heads, n->inst->tp, n->tp,
                                                        n->heads, j),
                                        t};
                    *corrupt += sim_kvdata_check(
                        sim_slot(n, layer, (int)kv, r->dpages[(t - r->base) / ps], t % ps, j, ps,
                                 hb),
                        (size_t)hb, &c);
                    checked += (uint64_t)hb;
                }
    return checked;
}

/* Checks the aux payload of a decode rank's ok result against its
 * request's (sim/kvdata.h): its length and every byte, while res->aux is
 * valid (the callback). The first payload with a wrong byte is described
 * in aux_error, naming the rank and the request. */
void sim_verify_aux(sim_scenario_t *sc, const sim_node_t *n, const kvs_room_result_t *res)
{
    uint64_t checked = 0;
    const uint64_t wrong = sim_kvdata_aux_verify(res->room, sc->cfg.max_aux_bytes, res->aux,
                                                 res->aux_bytes, &checked);
    sc->aux_bytes_verified += checked;
    if (wrong == 0)
        return;
    if (sc->aux_corrupt_bytes == 0)
        snprintf(sc->aux_error, sizeof sc->aux_error,
                 "%s: request %llu's aux payload: %u bytes arrived of %u sent, %llu wrong",
                 n->name, (unsigned long long)res->room, res->aux_bytes,
                 sim_kvdata_aux_bytes(res->room, sc->cfg.max_aux_bytes),
                 (unsigned long long)wrong);
    sc->aux_corrupt_bytes += wrong;
    sc->corrupt_bytes += wrong;
}

/* Spans of a rank's GPU, NIC and core go to its trace process. */
