/*
 * check.c - the verdict of check.h: the ring a configuration needs before
 * it runs, and the violations of a finished run. Invariants of a run
 * (spec §9, §12): every request ends; none fails without a fault, or
 * outside the instances a fault struck; no byte arrives corrupt; no ring
 * byte and no region-scoped key outlives the run; no byte of a hostile
 * writer's write lands (issue 17 item 2: the fabric refuses it, so the
 * request it belongs to fails cleanly and no other request's bytes
 * change); every failure is told to the peer. The scenario
 * counts each; this file is the only place that sums them.
 */
#include "check.h"

#include <inttypes.h>
#include <stdio.h>

#define SIM_CHECK_MIB (UINT64_C(1) << 20)

int sim_check_ring(const sim_scenario_config_t *cfg, const sim_topology_t *topo,
                   uint64_t *needed_bytes, char *err, size_t err_bytes)
{
    uint64_t need = 0;
    int64_t need_tokens = 0;
    for (uint32_t p = 0; cfg->staging && p < topo->prefill_instances; p++)
        for (uint32_t d = 0; d < topo->decode_instances; d++) {
            const bool hybrid = cfg->shape.full_attn_every > 1; /* auto stages it */
            const bool draft = cfg->shape.draft_layers > 0;     /* ... and a draft */
            const bool stages = cfg->path == KVS_PATH_STAGING ||
                                (cfg->path == KVS_PATH_AUTO &&
                                 (topo->prefill[p].tp != topo->decode[d].tp || hybrid ||
                                  draft));
            if (!stages)
                continue;
            const kvs_layout_params_t params = sim_topology_pair(&cfg->shape, topo, p, d);
            kvs_layout_t lay;
            kvs_error_t lerr = {0};
            if (kvs_layout_init(&lay, &params, &lerr) != KVS_OK)
                continue; /* the topology check names it */
            if (hybrid) { /* a region's size depends on its chunk's place: the largest */
                const uint64_t bytes = (uint64_t)kvs_layout_max_region_bytes(&lay);
                if (bytes > need) {
                    need = bytes;
                    need_tokens = lay.grid_tokens;
                }
                continue;
            }
            /* A chunk moves min(G, what is left) tokens: the longest
             * prompt without a cached prefix, up to a full chunk. */
            const int64_t tokens = cfg->prompt_max_tokens < lay.grid_tokens
                                       ? cfg->prompt_max_tokens : lay.grid_tokens;
            for (int64_t e = 0; e < lay.decode_pp; e++) {
                int64_t bytes = 0;
                if (kvs_layout_region_bytes(&lay, 0, e, tokens, &bytes) == KVS_OK &&
                    (uint64_t)bytes > need) {
                    need = (uint64_t)bytes;
                    need_tokens = tokens;
                }
            }
        }
    if (needed_bytes != NULL)
        *needed_bytes = need;
    if (need <= cfg->ring_bytes)
        return KVS_OK;
    if (err != NULL && err_bytes > 0)
        snprintf(err, err_bytes, "a %" PRIu64 " MiB staging region (%" PRIu64 " bytes, "
                 "%" PRId64 " tokens on one decode rank) does not fit a %" PRIu64 " MiB "
                 "ring (ring_bytes %" PRIu64 "): no request that long could move; raise "
                 "ring_bytes to at least %" PRIu64 " MiB, or lower chunk_tokens",
                 (need + SIM_CHECK_MIB - 1) / SIM_CHECK_MIB, need, need_tokens,
                 cfg->ring_bytes / SIM_CHECK_MIB, cfg->ring_bytes,
                 (need + SIM_CHECK_MIB - 1) / SIM_CHECK_MIB);
    return KVS_EOVERSIZED;
}

void sim_check_report(const sim_scenario_config_t *cfg, sim_report_t *r)
{
    /* Without faults nothing may fail: what collateral_failures leaves
     * out (a region the ring cannot hold) counts here. */
    r->failed_without_faults = cfg->nfaults == 0 && r->requests_failed > r->collateral_failures
                                   ? r->requests_failed - r->collateral_failures : 0;
    r->violations = r->hung_requests + r->ring_leaked_bytes + r->corrupt_bytes +
                    r->unreported_failures + r->collateral_failures +
                    r->failed_without_faults + r->keys_leaked + r->hostile_bytes_landed;
    r->ok = r->violations == 0;
}
