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

/* The provenance of node n's rows of tokens [a, b) of a request, layer by
 * layer, one run per page run: written (prefill) or checked (decode,
 * returning the bytes that differ). */
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
    for (int64_t layer = 0; layer < n->layers; layer++)
        for (int q = 0; q < sim_bufs(l); q++) { /* K, V (or latent), scales */
            const int kv = sim_buf_kv(l, q);
            const int64_t hb = sim_buf_bytes(l, q);
            if (!check) /* one rewrite per layer and K/V */
                sim_prov_batch_begin(map);
            for (size_t k = 0; k < nruns; k++) {
                const int64_t t = sc->slot_runs[2 * k], cnt = sc->slot_runs[2 * k + 1];
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
    return bad;
}

/* The forward pass of tokens [a, b) on one prefill rank. */
void sim_fill_prefill(sim_scenario_t *sc, sim_node_t *n, uint64_t req, int64_t a, int64_t b)
{
    const kvs_layout_t *l = &sc->lay;
    const int64_t ps = n->ps;
    const sim_req_t *r = &sc->reqs[req];
    if (sim_gpu_prov(n->gpu) != NULL) {
        sim_prov_pass(sc, n, req, r->ppages, 0, a, b, false);
        return;
    }
    for (int64_t layer = 0; layer < n->layers; layer++)
        for (int q = 0; q < sim_bufs(l); q++) /* K and V, or MLA's latent; scales */
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
    if (sim_gpu_prov(n->gpu) != NULL) {
        *corrupt += sim_prov_pass(sc, n, req, r->dpages, r->base, r->base, r->tokens, true);
        return (uint64_t)n->layers * (uint64_t)(r->tokens - r->base) * (uint64_t)row_bytes;
    }
    uint64_t checked = 0;
    for (int64_t layer = 0; layer < n->layers; layer++)
        for (int q = 0; q < sim_bufs(l); q++)
            for (int64_t t = r->base, kv = sim_buf_kv(l, q), hb = sim_buf_bytes(l, q);
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
