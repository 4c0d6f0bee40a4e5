/*
 * workload.c - the requests of a simulated run (run.h): drawn and
 * scheduled at the start (arrivals a Poisson process, seeded), then
 *   arrival -> the router pairs it with a prefill and a decode instance ->
 *   admission (KV pages in both instances, in arrival order per instance)
 *   -> rooms opened on the ranks of the pair -> chunked prefill on its
 *   prefill instance's compute queue (modeled forward time; each step
 *   writes the pattern into the pools, verify.c's, and tells the ranks) ->
 *   every rank's result in (the driver's callbacks) -> the decode ranks'
 *   bytes checked -> pages freed, the next admitted.
 * It judges results too: a timeout a rank should have been told of is
 * counted (spec §9).
 */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void sim_try_admit(sim_scenario_t *sc);
static void sim_compute_next(sim_scenario_t *sc, sim_inst_t *pi);

static void sim_finish(sim_scenario_t *sc, uint32_t i)
{
    sim_req_t *r = &sc->reqs[i];
    const uint64_t now = sim_engine_now_ns(sc->eng);
    r->state = SIM_REQ_DONE;
    r->done_ns = now;
    if (r->status == KVS_OK) {
        for (int64_t d = 0; d < r->di->nranks; d++) {
            if (r->di->nodes[d].down)
                continue; /* cannot be: a crash fails the request */
            uint64_t corrupt = 0;
            sc->bytes_verified += sim_verify_decode(sc, &r->di->nodes[d], i, &corrupt);
            sc->corrupt_bytes += corrupt;
        }
    }
    sim_trace_span(sc->trace, 0, "requests", r->status == KVS_OK ? "transfer" : "transfer (failed)",
                   r->computed_ns, now);
    const int64_t ps = sc->lay.page_size, dps = sc->lay.decode_page_size;
    sim_pages_give(&r->pi->pages, r->ppages, (r->tokens + ps - 1) / ps);
    sim_pages_give(&r->di->pages, r->dpages, (r->tokens - r->base + dps - 1) / dps);
    free(r->ppages);
    free(r->dpages);
    r->ppages = r->dpages = NULL;
    r->pi->admitted--;
    r->di->admitted--;
    r->pi->routed--;
    r->di->routed--;
    sc->finished++;
    sc->last_done_ns = now;
    const uint32_t step = sc->cfg.requests / 64 > 0 ? sc->cfg.requests / 64 : 1;
    if (sc->cfg.progress != NULL && (sc->finished % step == 0 || sc->finished == sc->cfg.requests))
        sc->cfg.progress(sc->cfg.progress_ctx, sc->finished, sc->cfg.requests, now);
    if (sc->finished == sc->cfg.requests)
        sim_engine_stop(sc->eng);
    sim_try_admit(sc);
}

/* Rank n's result for request i is in: its own (from its handler), or
 * not (it was down or crashed). */
void sim_report_in(sim_scenario_t *sc, sim_node_t *n, uint32_t i, int status, bool own)
{
    sim_req_t *r = &sc->reqs[i];
    n->reported[i] = 1;
    if (!own)
        r->ranks_down++;
    else if (status == KVS_OK)
        r->ranks_ok++;
    else if (status == KVS_EPEER)
        r->ranks_peer++;
    else
        r->ranks_other++;
    if (status != KVS_OK && r->status == KVS_OK) {
        char who[96];
        snprintf(who, sizeof who, own ? "%s" : "%s, down (crashed or never up)", n->name);
        sim_request_failed(sc, i, status, who);
    }
    if (--r->reports_left == 0)
        sim_finish(sc, i);
}

static void sim_on_result(sim_scenario_t *sc, sim_node_t *n, const kvs_room_result_t *res)
{
    if (res->room >= sc->cfg.requests) {
        sim_fail(sc, KVS_EPROTO, "%s reported unknown room %llu", n->name,
                 (unsigned long long)res->room);
        return;
    }
    sim_req_t *r = &sc->reqs[res->room];
    if (r->state != SIM_REQ_ADMITTED || r->reports_left <= 0 || n->reported[res->room] ||
        !sim_in_pair(r, n)) {
        sim_fail(sc, KVS_EPROTO, "%s reported room %llu twice, or a room of another pair of "
                 "instances", n->name, (unsigned long long)res->room);
        return;
    }
    if (n->role == KVS_ROLE_DECODE)
        n->bytes_received += res->bytes;
    if (n->role == KVS_ROLE_DECODE && res->status == KVS_OK)
        sim_verify_aux(sc, n, res);
    /* A rank that only learns of a real failure of a rank it talks to
     * (directly or through others: its group) by its own stall timeout was
     * never told: spec §9 wants failures sent at once. Not when a rank
     * crashed or was cut off, and not for a lost peer (KVS_EPEER): the one
     * who could not be told is on the other side of the dead connection.
     * Ranks of another group have no connection to the failing one. */
    const sim_pair_t *pair = sim_pair_of(sc, r);
    const int64_t g = pair->group[sim_pair_index(r, n)];
    const bool real = res->status != KVS_OK && res->status != KVS_ETIMEDOUT &&
                      res->status != KVS_EPEER;
    const uint64_t now = sim_engine_now_ns(sc->eng);
    /* Telling takes time over a lossy link (retransmissions, a relay
     * through the decode): a timeout within a quarter stall timeout of the
     * failure had no fair chance to be told. */
    const uint64_t timeout = sc->cfg.stall_timeout_ns > 0 ? sc->cfg.stall_timeout_ns
                                                          : KVS_DEFAULT_STALL_TIMEOUT_NS;
    /* (A rank's result is the first failure it heard of: after a timeout in
     * its group, an ETIMEDOUT may be that one, told, not its own.) */
    if (res->status == KVS_ETIMEDOUT && (r->failed_groups >> g & 1u) &&
        !(r->timed_out_groups >> g & 1u) && !r->untellable &&
        now - r->failed_ns[g] >= timeout / 4)
        r->unreported = true;
    if (res->status == KVS_ETIMEDOUT)
        r->timed_out_groups |= 1ull << g;
    if (real && !(r->failed_groups >> g & 1u)) {
        if (r->failed_ns == NULL &&
            (r->failed_ns = calloc((size_t)pair->ngroups, sizeof *r->failed_ns)) == NULL) {
            sim_fail(sc, KVS_ENOMEM, "scenario tables");
            return;
        }
        r->failed_groups |= 1ull << g;
        r->failed_ns[g] = now;
    }
    sim_report_in(sc, n, (uint32_t)res->room, res->status, true);
}

/* The driver's callbacks: a finished room, a failed step. */
void sim_node_result(void *ctx, const kvs_room_result_t *res)
{
    sim_node_t *n = ctx;
    if (!n->down)
        sim_on_result(n->sc, n, res);
}

void sim_node_error(void *ctx, int status)
{
    sim_node_t *n = ctx;
    sim_fail(n->sc, status, "%s: progress failed: %s", n->name,
             kvs_rank_last_error(n->rank)->msg);
}

/* The tokens [*start, *end) of request r that prefill node n computes and
 * holds: its CP rank's range (kvs_layout_cp_range), all of them without
 * CP. */
static void sim_node_range(const sim_scenario_t *sc, const sim_node_t *n, const sim_req_t *r,
                           int64_t *start, int64_t *end)
{
    *start = 0;
    *end = r->tokens;
    if (n->inst->cp > 1)
        (void)kvs_layout_cp_range(&sc->lay, r->tokens, n->cp, start, end);
}

/* Tokens in request r's longest CP range (CP rank 0's; the request without
 * CP): the forward pass's length, its CP ranks computing in parallel. */
static int64_t sim_compute_span(const sim_scenario_t *sc, const sim_req_t *r)
{
    int64_t start = 0, end = r->tokens;
    if (r->pi->cp > 1)
        (void)kvs_layout_cp_range(&sc->lay, r->tokens, 0, &start, &end);
    return end - start;
}

/* One forward-pass step of the request at the head of its prefill
 * instance's compute FIFO: each CP rank computes the next grid's tokens
 * of its own range, and is told the request's tokens it has computed
 * (its range's end once it is done: its last call, final). */
static void sim_compute_step(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_scenario_t *sc = ctx;
    const uint32_t i = (uint32_t)arg;
    sim_req_t *r = &sc->reqs[i];
    sim_inst_t *pi = r->pi;
    if (r->state == SIM_REQ_DONE) {
        /* It failed on every rank while being prefilled (its pages are
         * gone): the rest of its forward pass is abandoned. */
        pi->computing = false;
        sim_compute_next(sc, pi);
        return;
    }
    const int64_t span = sim_compute_span(sc, r);
    const int64_t end = r->computed + sc->lay.grid_tokens < span
                            ? r->computed + sc->lay.grid_tokens : span;
    const bool final = end == span;
    for (int64_t p = 0; p < pi->nranks; p++) {
        sim_node_t *n = &pi->nodes[p];
        int64_t start, stop;
        sim_node_range(sc, n, r, &start, &stop);
        const int64_t a = start + r->computed < stop ? start + r->computed : stop;
        const int64_t b = start + end < stop ? start + end : stop;
        if (n->down || (r->computed > 0 && a == stop))
            continue; /* down, or its range was done and told before */
        if (a < b)
            sim_fill_prefill(sc, n, i, a, b);
        const bool done = b == stop;
        int rc = kvs_rank_computed(n->rank, i, done ? r->tokens : b, done);
        if (rc == KVS_ENOENT)
            continue; /* this rank already ended the room (it failed): nothing to send */
        if (rc != KVS_OK) {
            sim_fail(sc, rc, "%s: room_computed: %s", n->name, kvs_rank_last_error(n->rank)->msg);
            return;
        }
        sim_node_wake(n);
    }
    if (r->computed == 0)
        r->first_chunk_ns = sim_engine_now_ns(eng);
    r->computed = end;
    if (!final) {
        const int64_t next = end + sc->lay.grid_tokens < span ? sc->lay.grid_tokens
                                                               : span - end;
        const uint64_t dt = (uint64_t)next * 1000000000ull / sc->cfg.prefill_tokens_per_s;
        sim_engine_after(eng, dt, sim_compute_step, sc, i, NULL);
        return;
    }
    r->computed_ns = sim_engine_now_ns(eng);
    pi->computing = false;
    sim_compute_next(sc, pi);
}

static void sim_compute_next(sim_scenario_t *sc, sim_inst_t *pi)
{
    if (pi->computing || pi->compute_first == UINT32_MAX)
        return;
    const uint32_t i = pi->compute_first;
    pi->compute_first = sc->reqs[i].next_compute;
    if (pi->compute_first == UINT32_MAX)
        pi->compute_last = UINT32_MAX;
    pi->computing = true;
    const int64_t span = sim_compute_span(sc, &sc->reqs[i]);
    const int64_t first = sc->lay.grid_tokens < span ? sc->lay.grid_tokens : span;
    const uint64_t dt = (uint64_t)first * 1000000000ull / sc->cfg.prefill_tokens_per_s;
    if (sim_engine_after(sc->eng, dt, sim_compute_step, sc, i, NULL) != KVS_OK)
        sim_fail(sc, KVS_ENOMEM, "scheduling a forward pass failed");
}

static void sim_finish_event(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_finish(ctx, (uint32_t)arg);
}

/* Opens request i's rooms on the ranks of its pair, each naming the other
 * instance. */
static int sim_open_rooms(sim_scenario_t *sc, uint32_t i)
{
    sim_req_t *r = &sc->reqs[i];
    const int64_t ps = sc->lay.page_size, dps = sc->lay.decode_page_size;
    const int64_t np = (r->tokens + ps - 1) / ps, nd = (r->tokens - r->base + dps - 1) / dps;
    const kvs_peer_t prefill = {r->pi->id, 0}, decode = {r->di->id, 0};
    /* A rank that is down takes no part: its (failed) result is in now, and
     * the others learn of it by their connections to it. */
    int down = 0;
    if (sc->long_cuts > 0)
        r->untellable = true;
    for (int side = 0; side < 2; side++) {
        sim_inst_t *inst = side == 0 ? r->pi : r->di;
        for (int64_t k = 0; k < inst->nranks; k++) {
            sim_node_t *n = &inst->nodes[k];
            if (n->down) {
                n->reported[i] = 1;
                r->reports_left--;
                r->ranks_down++;
                char who[96];
                snprintf(who, sizeof who, "%s, down at its open", n->name);
                sim_request_failed(sc, i, KVS_EPEER, who);
                r->untellable = true;
                down++;
            }
        }
    }
    /* Its aux payload, which the prefill ranks copy at open. */
    const uint32_t aux_bytes = sim_kvdata_aux_bytes(i, sc->cfg.max_aux_bytes);
    if (aux_bytes > 0)
        sim_kvdata_aux_fill(sc->aux_buf, aux_bytes, i);
    /* Decode ranks first, as a serving engine opens them. EPEER: a peer
     * rank of the room is away; the room failed at once and its result
     * comes from the rank's results. */
    for (int side = 1; side >= 0; side--) {
        sim_inst_t *inst = side == 0 ? r->pi : r->di;
        const kvs_room_desc_t room = {
            .room = i, .peer = side == 0 ? decode : prefill,
            .base_tokens = side == 0 ? 0 : r->base, .total_tokens = r->tokens,
            .pages = side == 0 ? r->ppages : r->dpages, .num_pages = side == 0 ? np : nd,
            .aux = side == 0 && aux_bytes > 0 ? sc->aux_buf : NULL,
            .aux_bytes = side == 0 ? aux_bytes : 0, .state_slot = i};
        for (int64_t k = 0; k < inst->nranks; k++) {
            sim_node_t *n = &inst->nodes[k];
            if (n->down)
                continue;
            int rc = kvs_rank_open_room(n->rank, &room);
            if (rc != KVS_OK && rc != KVS_EPEER)
                return sim_fail(sc, rc, "%s: room_open: %s", n->name,
                                kvs_rank_last_error(n->rank)->msg);
            if (rc == KVS_EPEER)
                r->untellable = true;
            sim_node_wake(n);
        }
    }
    if (r->reports_left == 0 && down > 0 &&
        sim_engine_after(sc->eng, 0, sim_finish_event, sc, i, NULL) != KVS_OK)
        return sim_fail(sc, KVS_ENOMEM, "scheduling the end of request %u failed", i);
    return KVS_OK;
}

/* An instance can take request r now: below max_inflight, with its pages. */
static bool sim_inst_fits(const sim_scenario_t *sc, const sim_inst_t *inst, int64_t pages)
{
    return inst->admitted < sc->cfg.max_inflight && pages <= inst->pages.count;
}

/* Admits waiting requests in arrival order. A request that does not fit
 * holds back every later one of either of its instances (first come, first
 * served per instance), but not those of other instances. With one
 * instance per side: the first that does not fit stops admission. */
static void sim_try_admit(sim_scenario_t *sc)
{
    const int64_t ps = sc->lay.page_size, dps = sc->lay.decode_page_size;
    uint32_t held[2] = {0, 0}; /* instances held back, by side: bitmaps */
    const uint32_t all[2] = {(uint32_t)((1ull << sc->npinst) - 1),
                             (uint32_t)((1ull << sc->ndinst) - 1)};
    uint32_t prev = UINT32_MAX;
    for (uint32_t i = sc->waiting_first; i != UINT32_MAX && sc->fatal == KVS_OK;) {
        if (held[0] == all[0] || held[1] == all[1])
            return; /* nothing later can go */
        sim_req_t *r = &sc->reqs[i];
        const uint32_t next = r->next_waiting;
        const int64_t np = (r->tokens + ps - 1) / ps, nd = (r->tokens - r->base + dps - 1) / dps;
        const uint32_t pbit = 1u << r->pi->id, dbit = 1u << r->di->id;
        if ((held[0] & pbit) || (held[1] & dbit) || !sim_inst_fits(sc, r->pi, np) ||
            !sim_inst_fits(sc, r->di, nd)) {
            held[0] |= pbit; /* wait for pages or a slot */
            held[1] |= dbit;
            prev = i;
            i = next;
            continue;
        }
        r->ppages = malloc((size_t)(np > 0 ? np : 1) * sizeof *r->ppages);
        r->dpages = malloc((size_t)(nd > 0 ? nd : 1) * sizeof *r->dpages);
        if (r->ppages == NULL || r->dpages == NULL) {
            sim_fail(sc, KVS_ENOMEM, "allocating page lists failed");
            return;
        }
        sim_pages_take(&r->pi->pages, r->ppages, np);
        sim_pages_take(&r->di->pages, r->dpages, nd);
        /* Off the waiting list. */
        if (prev == UINT32_MAX)
            sc->waiting_first = next;
        else
            sc->reqs[prev].next_waiting = next;
        if (sc->waiting_last == i)
            sc->waiting_last = prev;
        r->next_waiting = UINT32_MAX;
        r->pi->admitted++;
        r->di->admitted++;
        r->state = SIM_REQ_ADMITTED;
        r->opened_ns = sim_engine_now_ns(sc->eng);
        r->reports_left = r->pi->nranks + r->di->nranks;
        if (sim_open_rooms(sc, i) != KVS_OK)
            return;
        sim_inst_t *pi = r->pi;
        r->next_compute = UINT32_MAX;
        if (pi->compute_last == UINT32_MAX)
            pi->compute_first = i;
        else
            sc->reqs[pi->compute_last].next_compute = i;
        pi->compute_last = i;
        sim_compute_next(sc, pi);
        i = next;
    }
}

/* The router: request r's prefill and decode instance. Round robin takes
 * each side's instances in turn; least-loaded the one with the fewest
 * requests in flight (routed, not ended), ties to the lowest index. */
static sim_inst_t *sim_route_side(sim_scenario_t *sc, sim_inst_t *insts, uint32_t n,
                                  uint32_t *turn)
{
    uint32_t pick = 0;
    if (sc->cfg.router == SIM_ROUTER_LEAST_LOADED) {
        for (uint32_t k = 1; k < n; k++)
            if (insts[k].routed < insts[pick].routed)
                pick = k;
    } else {
        pick = *turn;
        *turn = (*turn + 1) % n;
    }
    insts[pick].routed++;
    return &insts[pick];
}

static void sim_arrive(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_scenario_t *sc = ctx;
    const uint32_t i = (uint32_t)arg;
    sim_req_t *r = &sc->reqs[i];
    r->pi = sim_route_side(sc, sim_prefill_inst(sc, 0), sc->npinst, &sc->rr_prefill);
    r->di = sim_route_side(sc, sim_decode_inst(sc, 0), sc->ndinst, &sc->rr_decode);
    r->next_waiting = UINT32_MAX;
    if (sc->waiting_last == UINT32_MAX)
        sc->waiting_first = i;
    else
        sc->reqs[sc->waiting_last].next_waiting = i;
    sc->waiting_last = i;
    sim_try_admit(sc);
}

/* Draws the workload (arrival times, prompt lengths and cached prefixes,
 * each from its own stream) and schedules every arrival. */
int sim_workload_schedule(sim_scenario_t *sc)
{
    const sim_scenario_config_t *c = &sc->cfg;
    /* a cached prefix starts a page of both sides: the lcm of the page
     * sizes, the grid's unit the layout keeps (kvstage.h) */
    const int64_t unit = sc->lay.cp_align_tokens;
    int rc = KVS_OK;
    sim_rng_t arrivals, lengths, prefix;
    sim_engine_rng(sc->eng, SIM_STREAM_ARRIVALS, &arrivals);
    sim_engine_rng(sc->eng, SIM_STREAM_LENGTHS, &lengths);
    sim_engine_rng(sc->eng, SIM_STREAM_PREFIX, &prefix);
    /* Registration happens before the first request: 1 ms of setup. */
    uint64_t t = 1000000;
    sc->first_arrival_ns = t;
    for (uint32_t i = 0; i < c->requests; i++) {
        sim_req_t *r = &sc->reqs[i];
        r->tokens = (int64_t)sim_rng_range(&lengths, (uint64_t)c->prompt_min_tokens,
                                           (uint64_t)c->prompt_max_tokens);
        const int64_t pmax = c->prefix_max_tokens < r->tokens ? c->prefix_max_tokens : r->tokens;
        r->base = pmax > 0 ? (int64_t)sim_rng_range(&prefix, 0, (uint64_t)(pmax / unit)) * unit
                           : 0;
        r->arrival_ns = t;
        if ((rc = sim_engine_at(sc->eng, t, sim_arrive, sc, i, NULL)) != KVS_OK)
            return sim_fail(sc, rc, "scheduling arrivals failed");
        if (c->rate_milli_per_s > 0)
            t += sim_rng_exp(&arrivals, 1000000000000ull / c->rate_milli_per_s);
    }
    return KVS_OK;
}
