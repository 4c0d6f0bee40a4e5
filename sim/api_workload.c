/*
 * api_workload.c - the simulator's workload as <kvstage/sim.h> hands it to
 * programs outside the simulator (`kvstage serve` on real devices): the
 * prompt lengths of a run's seed, drawn from the scenario's own stream in
 * its order, and the KV content of sim/kvdata.c, so that a run on hardware
 * moves and checks the bytes a simulated run of the same seed does.
 *
 * Thin on purpose: each function is the simulator's own, behind the
 * public names and an argument check; no state, no allocation.
 */
#include <kvstage/backend.h>
#include <kvstage/sim.h>

#include <string.h>

#include "kvdata.h"
#include "rng.h"
#include "scenario.h"

void kvs_sim_kv_fill(void *dst, size_t len_bytes, const kvs_sim_kv_coord_t *at)
{
    sim_kvdata_fill(dst, len_bytes, at);
}

uint64_t kvs_sim_kv_check(const void *src, size_t len_bytes, const kvs_sim_kv_coord_t *at)
{
    return sim_kvdata_check(src, len_bytes, at);
}

int kvs_sim_prompt_tokens(uint64_t seed, int64_t min_tokens, int64_t max_tokens, int64_t *out,
                          size_t n, kvs_error_t *err)
{
    const kvs_sim_bound_t *b = kvs_sim_config_bound("prompt_max_tokens");
    if (min_tokens < 1 || max_tokens < min_tokens || (uint64_t)max_tokens > b->max)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "prompt tokens %lld:%lld: give 1 <= "
                             "min_tokens <= max_tokens <= %llu", (long long)min_tokens,
                             (long long)max_tokens, (unsigned long long)b->max);
    if (out == NULL && n > 0)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "out is NULL: pass room for the %zu "
                             "prompt lengths", n);
    /* As sim_setup draws them: one stream of the root seed, request by
     * request. */
    sim_rng_t lengths;
    sim_rng_init(&lengths, seed, SIM_STREAM_LENGTHS);
    for (size_t i = 0; i < n; i++)
        out[i] = (int64_t)sim_rng_range(&lengths, (uint64_t)min_tokens, (uint64_t)max_tokens);
    if (err != NULL)
        memset(err, 0, sizeof *err);
    return KVS_OK;
}
