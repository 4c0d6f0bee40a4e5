/*
 * scenario.c - one simulated run (see scenario.h): sets it up, runs the
 * engine's virtual clock until every request has ended (or nothing is
 * left to happen), has the report filled and frees the run. A run builds
 * the cluster (its instances, a simulated GPU and NIC per rank, the real
 * kvstage manager and handler on each), declares every prefill instance
 * to every decode rank and connects it to its writers in each, then
 * replays the workload:
 *   arrival -> the router pairs it with a prefill and a decode instance ->
 *   admission (KV pages in both instances, rooms opened on their ranks,
 *   naming each other) -> chunked prefill on its prefill instance's compute
 *   queue (modeled forward time; each step writes the pattern of sim/kvdata
 *   into that instance's KV pools and tells the handlers) -> the handlers
 *   move the KV -> every rank of the pair reports the room -> the decode
 *   ranks' bytes are checked against the pattern -> pages freed.
 * With max_aux_bytes, the prefill ranks give each request's aux payload
 * (sim/kvdata.h) at room open, and every decode rank's ok result is
 * checked against it in the result callback, the only place its bytes are
 * valid: nothing of it is kept.
 * Ranks make progress only when their GPU or NIC wakes them, like a real
 * event loop. Nothing here reads the wall clock.
 *
 * Nodes are numbered prefill instance 0's ranks first, then the other
 * prefill instances', then the decode instances' in order; ranks of
 * instance 0 are named p<tp>.<pp> and d<tp>.<pp>, others p<tp>.<pp>@<i>.
 * With one instance per side this is the node order, naming and event
 * order of the simulator before clusters.
 *
 * The run's state is run.h's, and each job its own file's: the cluster's
 * life node.c's, the faults faults.c's, the requests workload.c's, what
 * the pattern is and how it is checked verify.c's, the report report.c's,
 * failing and the page pools run.c's.
 */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sim_scenario_defaults(sim_scenario_config_t *c)
{
    if (c->requests == 0)
        c->requests = 16;
    if (c->prompt_min_tokens == 0)
        c->prompt_min_tokens = 256;
    if (c->prompt_max_tokens == 0)
        c->prompt_max_tokens = c->prompt_min_tokens > 1536 ? c->prompt_min_tokens : 1536;
    if (c->ring_bytes == 0)
        c->ring_bytes = KVS_DEFAULT_RING_BYTES;
    if (c->prefill_tokens_per_s == 0)
        c->prefill_tokens_per_s = 16384;
    if (c->max_inflight == 0)
        c->max_inflight = 4;
    if (c->transfer_workers == 0)
        c->transfer_workers = KVS_DEFAULT_TRANSFER_WORKERS;
    if (c->max_events == 0)
        c->max_events = 1ull << 40;
}

static int sim_setup(sim_scenario_t *sc)
{
    const sim_scenario_config_t *c = &sc->cfg;
    kvs_error_t err = {0};
    int rc = kvs_layout_init(&sc->lay, &c->shape, &err);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "shape: %s", err.msg);
    if ((rc = sim_topology_resolve(&c->shape, &c->topo, &sc->topo, NULL, NULL, &err)) != KVS_OK)
        return sim_fail(sc, rc, "topology: %s", err.msg);
    if (c->router != SIM_ROUTER_ROUND_ROBIN && c->router != SIM_ROUTER_LEAST_LOADED)
        return sim_fail(sc, KVS_EINVAL, "router %d unknown: use round robin (%d) or least "
                        "loaded (%d)", (int)c->router, SIM_ROUTER_ROUND_ROBIN,
                        SIM_ROUTER_LEAST_LOADED);
    if (c->prompt_min_tokens < 1 || c->prompt_max_tokens < c->prompt_min_tokens ||
        c->prefix_max_tokens < 0)
        return sim_fail(sc, KVS_EINVAL, "prompt tokens need 1 <= min <= max (got %lld:%lld) "
                        "and the cached prefix must be >= 0", (long long)c->prompt_min_tokens,
                        (long long)c->prompt_max_tokens);
    if (c->max_aux_bytes > KVS_AUX_BYTES_MAX)
        return sim_fail(sc, KVS_EINVAL, "max_aux_bytes %u is over the limit of %u bytes: set "
                        "it to 0..%u", c->max_aux_bytes, KVS_AUX_BYTES_MAX, KVS_AUX_BYTES_MAX);
    /* A ring that cannot hold the regions of this workload fails its
     * requests for sure: said now, not after the run. */
    char why[384];
    if ((rc = sim_check_ring(c, &sc->topo, &sc->ring_bytes_needed, why, sizeof why)) != KVS_OK)
        return sim_fail(sc, rc, "%s", why);
    if (c->max_aux_bytes > 0 && (sc->aux_buf = malloc(c->max_aux_bytes)) == NULL)
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    /* Pages of the smaller size on both sides (the same count when the
     * sizes are equal); a cached prefix starts a page of each side. */
    const int64_t ps = sc->lay.page_size < sc->lay.decode_page_size ? sc->lay.page_size
                                                                    : sc->lay.decode_page_size;
    sc->pool_pages = (int64_t)c->max_inflight * ((c->prompt_max_tokens + ps - 1) / ps) + 1;
    rc = sim_engine_create(c->seed, 1024, &sc->eng);
    if (rc == KVS_OK)
        rc = sim_net_create(sc->eng, &c->net, &sc->net);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "creating the engine and network failed: %s", kvs_strerror(rc));
    sc->reqs = calloc(c->requests, sizeof *sc->reqs);
    if (sc->reqs == NULL)
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    sc->waiting_first = sc->waiting_last = UINT32_MAX;
    if ((rc = sim_build_cluster(sc)) != KVS_OK || (rc = sim_faults_check(sc)) != KVS_OK)
        return rc;
    for (int64_t i = 0; i < sc->nprefill + sc->ndecode; i++) {
        if ((rc = sim_node_setup(sc, &sc->nodes[i], (uint32_t)i)) != KVS_OK)
            return rc;
        if (sc->nodes[i].rank != NULL)
            sim_faults_arm(sc, &sc->nodes[i]);
    }
    if ((rc = sim_connect_all(sc)) != KVS_OK)
        return rc;
    if ((rc = sim_workload_schedule(sc)) != KVS_OK)
        return rc;
    return KVS_OK;
}

int sim_scenario_run(const sim_scenario_config_t *cfg, sim_report_t *out, char *err,
                     size_t err_bytes)
{
    if (cfg == NULL || out == NULL)
        return KVS_EINVAL;
    sim_scenario_t *sc = calloc(1, sizeof *sc);
    if (sc == NULL)
        return KVS_ENOMEM;
    sc->cfg = *cfg;
    sim_scenario_defaults(&sc->cfg);
    sc->err = err;
    sc->err_bytes = err_bytes;
    if (err != NULL && err_bytes > 0)
        err[0] = '\0';
    if (sc->cfg.trace_path != NULL) {
        if (sim_trace_open(sc->cfg.trace_path, &sc->trace) != KVS_OK)
            sim_fail(sc, KVS_EINVAL, "cannot write the trace file %s: check the path",
                     sc->cfg.trace_path);
        sim_trace_process(sc->trace, 0, "requests");
    }
    int rc = sc->fatal == KVS_OK ? sim_setup(sc) : sc->fatal;
    if (rc == KVS_OK) {
        uint64_t budget = sc->cfg.max_events;
        while (sc->fatal == KVS_OK && sc->finished < sc->cfg.requests && budget > 0) {
            const uint64_t ran = sim_engine_run(sc->eng, UINT64_MAX, budget);
            budget -= ran < budget ? ran : budget;
            if (sim_engine_pending(sc->eng) == 0)
                break; /* nothing left to happen: the rest can never finish */
        }
        for (int64_t k = 0; k < sc->nprefill + sc->ndecode && sc->fatal == KVS_OK; k++)
            if (sc->nodes[k].drv.error != KVS_OK)
                sim_fail(sc, sc->nodes[k].drv.error, "scheduling a step of %s failed",
                         sc->nodes[k].name);
        rc = sc->fatal;
        if (rc == KVS_OK && sc->finished < sc->cfg.requests && err != NULL && err_bytes > 0)
            snprintf(err, err_bytes, "%u of %u requests never finished",
                     sc->cfg.requests - sc->finished, sc->cfg.requests);
    }
    if (sc->nodes != NULL && sc->eng != NULL && sc->pairs != NULL)
        sim_report_fill(sc, out);
    out->ring_bytes_needed = sc->ring_bytes_needed;
    if (sim_trace_close(sc->trace) != KVS_OK && rc == KVS_OK) {
        rc = KVS_EINVAL;
        if (err != NULL && err_bytes > 0)
            snprintf(err, err_bytes, "writing the trace file %s failed (disk full?)",
                     sc->cfg.trace_path);
    }
    for (int64_t i = 0; sc->nodes != NULL && i < sc->nprefill + sc->ndecode; i++) {
        sim_node_teardown(&sc->nodes[i]);
        free(sc->nodes[i].reported);
        free(sc->nodes[i].ring_changes);
    }
    for (uint32_t i = 0; sc->reqs != NULL && i < sc->cfg.requests; i++) {
        free(sc->reqs[i].ppages);
        free(sc->reqs[i].failed_ns);
        free(sc->reqs[i].dpages);
    }
    if (sc->net != NULL)
        (void)sim_net_destroy(sc->net);
    sim_engine_destroy(sc->eng);
    for (uint32_t k = 0; sc->insts != NULL && k < sc->npinst + sc->ndinst; k++)
        free(sc->insts[k].pages.taken);
    for (uint32_t k = 0; sc->pairs != NULL && k < sc->npinst * sc->ndinst; k++)
        free(sc->pairs[k].group);
    free(sc->nodes);
    free(sc->insts);
    free(sc->pairs);
    free(sc->reqs);
    free(sc->slot_runs);
    free(sc->aux_buf);
    sim_hostile_free(sc);
    free(sc);
    return rc;
}
