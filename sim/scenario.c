/*
 * scenario.c - one simulated run (see scenario.h). Builds the cluster (its
 * instances, a simulated GPU and NIC per rank, the real kvstage manager and
 * handler on each), declares every prefill instance to every decode rank
 * and connects it to its writers in each, then replays the workload on the
 * engine's virtual clock:
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
 * The run's state is run.h's; what the pattern is and how it is checked
 * is verify.c's, the report report.c's, failing and the page pools
 * run.c's.
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

/* ---- node plumbing ----------------------------------------------------------- */

/* Its GPU or NIC has news, or the scenario told it something: a step. */
static void sim_node_wake(sim_node_t *n) { sim_driver_wake(&n->drv); }

/* Records a change of n's ring occupancy (0 while the rank is down). An
 * allocation failure only stops the record; sim_node_ring_p99 then sees
 * less, never a wrong order. */
static void sim_node_ring_sample(void *ctx)
{
    sim_node_t *n = ctx;
    if (n->role != KVS_ROLE_DECODE)
        return;
    kvs_ring_t *ring = n->rank != NULL ? kvs_manager_ring(kvs_rank_manager(n->rank)) : NULL;
    const uint64_t live = ring != NULL ? kvs_ring_live_bytes(ring) : 0;
    const uint64_t last = n->nring_changes > 0 ? n->ring_changes[n->nring_changes - 1].live_bytes : 0;
    if (live == last)
        return;
    if (n->nring_changes == n->ring_changes_cap) {
        const size_t cap = n->ring_changes_cap > 0 ? 2 * n->ring_changes_cap : 64;
        sim_ring_change_t *grown = realloc(n->ring_changes, cap * sizeof *grown);
        if (grown == NULL)
            return;
        n->ring_changes = grown;
        n->ring_changes_cap = cap;
    }
    n->ring_changes[n->nring_changes++] =
        (sim_ring_change_t){.at_ns = sim_engine_now_ns(n->sc->eng), .live_bytes = live};
}

static int sim_node_pid(const sim_node_t *n) { return (int)(n - n->sc->nodes) + 1; }

static void sim_node_span(void *ctx, const char *name, const char *tid, uint64_t start_ns,
                          uint64_t end_ns)
{
    sim_node_t *n = ctx;
    sim_trace_span(n->sc->trace, sim_node_pid(n), tid, name, start_ns, end_ns);
}

static void sim_core_span(void *ctx, const char *what, uint64_t room, int64_t chunk,
                          uint64_t start_ns, uint64_t end_ns)
{
    sim_node_span(ctx, what, "core", start_ns, end_ns);
}

/* ---- faults ------------------------------------------------------------------ */

/* The wire header keeps the message type at bytes 6-7, little endian
 * (src/wire.h): the simulator's fault filter reads only that. */
static int sim_msg_type_of(const uint8_t *msg, uint32_t len)
{
    return len >= 8 ? (int)(msg[6] | (unsigned)msg[7] << 8) : 0;
}

static sim_msg_fate_t sim_msg_filter(void *ctx, const uint8_t *msg, uint32_t len,
                                     uint64_t *delay_ns)
{
    sim_scenario_t *sc = ctx;
    const int type = sim_msg_type_of(msg, len);
    for (uint32_t i = 0; i < sc->cfg.nfaults; i++) {
        const sim_fault_t *f = &sc->cfg.faults[i];
        if (f->kind > SIM_FAULT_DELAY || (f->msg_type != 0 && f->msg_type != type))
            continue;
        if (!sim_rng_chance(sim_net_fault_rng(sc->net), f->num, f->den))
            continue;
        *delay_ns = f->delay_ns;
        return f->kind == SIM_FAULT_DROP ? SIM_MSG_DROP
               : f->kind == SIM_FAULT_DUP ? SIM_MSG_DUP
                                           : SIM_MSG_DELAY;
    }
    return SIM_MSG_DELIVER;
}

/* Every request in flight now can no longer be told of a failure in time. */
static void sim_mark_untellable(sim_scenario_t *sc)
{
    for (uint32_t i = 0; i < sc->cfg.requests; i++)
        if (sc->reqs[i].state == SIM_REQ_ADMITTED)
            sc->reqs[i].untellable = true;
}

/* arg: bit 0 = the link comes up; bit 1 = the outage lasts a stall timeout
 * or more (a partition nobody can report across). */
static void sim_link_event(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_node_t *n = ctx;
    sim_scenario_t *sc = n->sc;
    const bool up = (arg & 1) != 0, long_cut = (arg & 2) != 0;
    if (long_cut) {
        sc->long_cuts += up ? (uint32_t)-1 : 1u;
        sim_mark_untellable(sc);
    }
    if (n->down)
        return;
    sim_nic_set_link_up(n->nic, up);
    sim_node_wake(n);
}

/* What the faults set on one rank's GPU and NIC (again after a restart). */
static sim_node_t *sim_fault_node(sim_scenario_t *sc, uint32_t i, const sim_fault_t *f);

static void sim_node_faults(sim_scenario_t *sc, sim_node_t *n)
{
    if (sc->msg_faults)
        sim_nic_set_msg_filter(n->nic, sim_msg_filter, sc);
    for (uint32_t i = 0; i < sc->cfg.nfaults; i++) {
        const sim_fault_t *f = &sc->cfg.faults[i];
        if (f->kind == SIM_FAULT_WRITE_ERROR && n->role == KVS_ROLE_PREFILL)
            sim_nic_set_write_error(n->nic, f->num, f->den);
        if (f->kind == SIM_FAULT_SLOW_SCATTER && sim_fault_node(sc, i, f) == n)
            sim_gpu_set_scatter_slowdown(n->gpu, f->factor > 0 ? f->factor : 1);
    }
}

static void sim_crash_event(sim_engine_t *eng, void *ctx, uint64_t arg);
static void sim_restart_event(sim_engine_t *eng, void *ctx, uint64_t arg);

/* The node a fault of one rank names, or NULL (with the scenario failed). */
static sim_node_t *sim_fault_node(sim_scenario_t *sc, uint32_t i, const sim_fault_t *f)
{
    const bool decode = f->role == KVS_ROLE_DECODE;
    const uint32_t insts = decode ? sc->ndinst : sc->npinst;
    if (f->instance >= insts) {
        sim_fail(sc, KVS_EINVAL, "fault %u names %s instance %u, but there are %u: use 0..%u",
                 i, decode ? "decode" : "prefill", f->instance, insts, insts - 1);
        return NULL;
    }
    sim_inst_t *inst = decode ? sim_decode_inst(sc, f->instance)
                              : sim_prefill_inst(sc, f->instance);
    if (f->rank < 0 || f->rank >= inst->nranks) {
        sim_fail(sc, KVS_EINVAL, "fault %u names rank %lld of %s instance %u, which has %lld: "
                 "use 0..%lld (pp * tp_size + tp)", i, (long long)f->rank,
                 decode ? "decode" : "prefill", f->instance, (long long)inst->nranks,
                 (long long)inst->nranks - 1);
        return NULL;
    }
    return &inst->nodes[f->rank];
}

/* Checks every fault against this cluster, marks the instances it strikes
 * and schedules the timed ones. Runs before the ranks are created
 * (hbm-full shapes a rank's GPU). */
static int sim_faults_check(sim_scenario_t *sc)
{
    /* A stall fault replaces the run's stall timeout (the shortest, when
     * several) before anything below or any rank reads it. */
    bool stall = false;
    for (uint32_t i = 0; i < sc->cfg.nfaults; i++) {
        const sim_fault_t *f = &sc->cfg.faults[i];
        if (f->kind == SIM_FAULT_STALL && (!stall || f->for_ns < sc->cfg.stall_timeout_ns)) {
            sc->cfg.stall_timeout_ns = f->for_ns;
            stall = true;
        }
    }
    for (uint32_t i = 0; i < sc->cfg.nfaults; i++) {
        const sim_fault_t *f = &sc->cfg.faults[i];
        const bool ranked = f->kind == SIM_FAULT_LINK_DOWN || f->kind == SIM_FAULT_CRASH ||
                            f->kind == SIM_FAULT_RESTART || f->kind == SIM_FAULT_SLOW_SCATTER ||
                            f->kind == SIM_FAULT_HBM_FULL || f->kind == SIM_FAULT_HOSTILE_WRITE;
        sim_node_t *n = NULL;
        if (ranked && (n = sim_fault_node(sc, i, f)) == NULL)
            return sc->fatal;
        /* A fault of one rank strikes its instance; the others (messages,
         * writes) the whole cluster. */
        for (uint32_t k = 0; k < sc->npinst + sc->ndinst; k++)
            if (!ranked || &sc->insts[k] == n->inst)
                sc->insts[k].faulted = true;
        int rc = KVS_OK;
        switch (f->kind) {
        case SIM_FAULT_DROP:
            /* Every message of a type lost: a partition for that type no
             * retry crosses, so nobody can be told through it. */
            if (f->num >= f->den && f->den > 0)
                sc->long_cuts++;
            sc->msg_faults = true;
            break;
        case SIM_FAULT_DUP:
        case SIM_FAULT_DELAY:
            sc->msg_faults = true;
            break;
        case SIM_FAULT_LINK_DOWN: {
            const uint64_t timeout = sc->cfg.stall_timeout_ns > 0 ? sc->cfg.stall_timeout_ns
                                                                   : KVS_DEFAULT_STALL_TIMEOUT_NS;
            const uint64_t cut = f->for_ns >= timeout ? 2 : 0;
            rc = sim_engine_at(sc->eng, f->at_ns, sim_link_event, n, cut, NULL);
            if (rc == KVS_OK)
                rc = sim_engine_at(sc->eng, f->at_ns + f->for_ns, sim_link_event, n, cut | 1,
                                   NULL);
            break;
        }
        case SIM_FAULT_CRASH:
            rc = sim_engine_at(sc->eng, f->at_ns, sim_crash_event, n, 0, NULL);
            break;
        case SIM_FAULT_RESTART:
            rc = sim_engine_at(sc->eng, f->at_ns, sim_restart_event, n, 0, NULL);
            break;
        case SIM_FAULT_HBM_FULL:
            n->hbm_full = true;
            break;
        case SIM_FAULT_WRITE_ERROR:
        case SIM_FAULT_SLOW_SCATTER:
            break; /* per rank, at its creation */
        case SIM_FAULT_STALL:
            break; /* above */
        case SIM_FAULT_HOSTILE_WRITE:
            if (n->role != KVS_ROLE_PREFILL)
                return sim_fail(sc, KVS_EINVAL, "fault %u: a hostile write is a prefill "
                                "rank's: name one (p<tp>[.<pp>][@<instance>])", i);
            rc = sim_hostile_add(sc, i, n);
            break; /* the rank's fabric wrapped, at its creation (hostile.c) */
        }
        if (rc != KVS_OK)
            return sim_fail(sc, rc, "scheduling fault %u failed", i);
    }
    return KVS_OK;
}

/* ---- requests ---------------------------------------------------------------- */

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
static void sim_report_in(sim_scenario_t *sc, sim_node_t *n, uint32_t i, int status, bool own)
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
static void sim_node_result(void *ctx, const kvs_room_result_t *res)
{
    sim_node_t *n = ctx;
    if (!n->down)
        sim_on_result(n->sc, n, res);
}

static void sim_node_error(void *ctx, int status)
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

/* ---- setup and teardown ------------------------------------------------------ */

static void sim_node_teardown(sim_node_t *n);

/* The layout of n's instance paired with instance 0 of the other side: its
 * own geometry (heads per rank, its stages' layers) is that of any pair. */
static const kvs_layout_t *sim_node_lay(const sim_scenario_t *sc, const sim_node_t *n)
{
    return n->role == KVS_ROLE_DECODE ? &sc->pairs[n->inst->id].lay
                                      : &sc->pairs[n->inst->id * sc->ndinst].lay;
}

static int sim_node_setup(sim_scenario_t *sc, sim_node_t *n, uint32_t gpu_id)
{
    const kvs_layout_t *l = sim_node_lay(sc, n);
    const bool decode = n->role == KVS_ROLE_DECODE;
    /* The default peer instance of its handler (kvs_peer_t {0, 0}) is
     * instance 0 of the other side; every pair can pair (the topology was
     * checked), so its own geometry is valid with it. */
    const sim_instance_shape_t *peer0 = decode ? &sc->topo.prefill[0] : &sc->topo.decode[0];
    const uint64_t other_ranks = (uint64_t)(decode ? sc->nprefill : sc->ndecode);
    const uint32_t other_insts = decode ? sc->npinst : sc->ndinst;
    n->gpu_id = gpu_id;
    /* Its stage's layers: stages need not split evenly (spec §4). */
    kvs_layout_stage_layers(l, n->role, n->pp, &n->first_layer, &n->layers);
    n->heads = decode ? l->dst_heads : l->src_heads;
    n->ps = decode ? l->decode_page_size : l->page_size;
    n->layer_bytes = (uint64_t)sc->pool_pages * (uint64_t)(n->ps * n->heads *
                                                            l->head_dim * l->elem_bytes);
    /* Scale buffers (kv_scales) after every KV buffer of the pool. */
    n->scale_layer_bytes = (uint64_t)sc->pool_pages * (uint64_t)(n->ps * n->heads *
                                                                  l->scale_bytes);
    const uint64_t kv_bytes = (uint64_t)l->planes * (uint64_t)n->layers * n->layer_bytes;
    const uint64_t scales_bytes = (uint64_t)l->planes * (uint64_t)n->layers * n->scale_layer_bytes;
    /* State buffers (state layers), a slot per request, after the scales. */
    const bool state = l->full_attn_every > 1 && l->other_layers == KVS_LAYER_STATE;
    n->state_heads = state ? (decode ? l->state_dst_heads : l->state_src_heads) : 0;
    const uint64_t state_layer_bytes = (uint64_t)sc->cfg.requests *
                                       (uint64_t)(n->state_heads * l->state_head_bytes);
    int64_t state_layers = 0;
    for (int64_t i = 0; state && i < n->layers; i++) {
        kvs_layer_kind_t kind = KVS_LAYER_FULL;
        (void)kvs_layout_layer_kind(l, n->first_layer + i, &kind);
        state_layers += kind == KVS_LAYER_STATE;
    }
    /* A draft model's buffers (docs/kinds/draft.md), after the state: per
     * draft layer its planes, the model's pages of draft_head_dim; on the
     * last stage alone, which holds the draft (an engine keeps none on the
     * others, and the manager takes none there). */
    const bool draft = l->draft_layers > 0 && n->pp == n->inst->pp - 1;
    n->draft_layer_bytes = draft ? (uint64_t)sc->pool_pages *
                                       (uint64_t)(n->ps * n->heads * l->draft_head_dim *
                                                  l->elem_bytes)
                                 : 0;
    const uint64_t before_draft = kv_bytes + scales_bytes +
                                  (uint64_t)state_layers * state_layer_bytes;
    const uint64_t pool_bytes = before_draft + (uint64_t)(l->planes * l->draft_layers) *
                                                   n->draft_layer_bytes;
    sim_gpu_config_t gc = sc->cfg.gpu;
    if (n->hbm_full)
        gc.hbm_bytes = pool_bytes; /* the KV pool fills it */
    int rc = sim_gpu_create(sc->eng, &gc, gpu_id, &n->gpu);
    if (rc == KVS_OK)
        rc = sim_nic_create(sc->net, n->name, n->gpu, &n->nic);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "creating the GPU/NIC of %s failed: %s", n->name, kvs_strerror(rc));
    if (sc->cfg.copy_hook != NULL)
        sim_gpu_set_copy_hook(n->gpu, sc->cfg.copy_hook, sc->cfg.hook_ctx);
    if (sc->cfg.write_hook != NULL)
        sim_nic_set_write_hook(n->nic, sc->cfg.write_hook, sc->cfg.hook_ctx);
    sim_driver_init(&n->drv, sc->eng, NULL, n, sim_node_result, sim_node_error);
    n->drv.on_step = sim_node_ring_sample;
    sim_gpu_set_wake(n->gpu, sim_driver_wake, &n->drv);
    sim_nic_set_wake(n->nic, sim_driver_wake, &n->drv);
    if (sc->trace != NULL) {
        sim_trace_process(sc->trace, sim_node_pid(n), n->name);
        sim_gpu_set_span(n->gpu, sim_node_span, n);
        sim_nic_set_span(n->nic, sim_node_span, n);
    }

    kvs_device_t *dev = sim_gpu_device(n->gpu);
    rc = dev->ops.mem_alloc(dev, pool_bytes, &n->pool_addr);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "%s: KV pool of %llu bytes: %s", n->name,
                        (unsigned long long)pool_bytes, dev->last_backend_msg);
    n->pool_host = sim_gpu_host(n->gpu, n->pool_addr, pool_bytes);
    n->k_base = calloc((size_t)n->layers, sizeof *n->k_base);
    n->v_base = calloc((size_t)n->layers, sizeof *n->v_base);
    n->ks_base = calloc((size_t)n->layers, sizeof *n->ks_base);
    n->vs_base = calloc((size_t)n->layers, sizeof *n->vs_base);
    n->state_base = state ? calloc((size_t)n->layers, sizeof *n->state_base) : NULL;
    n->draft_k_base = draft ? calloc((size_t)l->draft_layers, sizeof *n->draft_k_base) : NULL;
    n->draft_v_base = draft && l->planes == 2
                          ? calloc((size_t)l->draft_layers, sizeof *n->draft_v_base)
                          : NULL;
    if (n->k_base == NULL || n->v_base == NULL || n->ks_base == NULL || n->vs_base == NULL ||
        (state && n->state_base == NULL) || (draft && n->draft_k_base == NULL) ||
        (draft && l->planes == 2 && n->draft_v_base == NULL) ||
        (n->pool_host == NULL && sim_gpu_prov(n->gpu) == NULL))
        return sim_fail(sc, KVS_ENOMEM, "%s: KV pool tables", n->name);
    /* Layer i's planes back to back: K then V, or MLA's latent alone (no
     * V: v_base stays 0). */
    for (int64_t i = 0; i < n->layers; i++) {
        n->k_base[i] = n->pool_addr + (uint64_t)(l->planes * i) * n->layer_bytes;
        n->v_base[i] = l->planes == 2 ? n->k_base[i] + n->layer_bytes : 0;
        if (l->scale_bytes > 0) { /* layer i's scale planes, after all the KV */
            n->ks_base[i] = n->pool_addr + kv_bytes +
                            (uint64_t)(l->planes * i) * n->scale_layer_bytes;
            n->vs_base[i] = l->planes == 2 ? n->ks_base[i] + n->scale_layer_bytes : 0;
        }
    }
    for (int64_t i = 0, k = 0; state && i < n->layers; i++) {
        kvs_layer_kind_t kind = KVS_LAYER_FULL;
        (void)kvs_layout_layer_kind(l, n->first_layer + i, &kind);
        if (kind == KVS_LAYER_STATE)
            n->state_base[i] = n->pool_addr + kv_bytes + scales_bytes +
                               (uint64_t)(k++) * state_layer_bytes;
    }
    for (int64_t i = 0; draft && i < l->draft_layers; i++) { /* as the model's: K, V */
        n->draft_k_base[i] = n->pool_addr + before_draft +
                             (uint64_t)(l->planes * i) * n->draft_layer_bytes;
        if (n->draft_v_base != NULL)
            n->draft_v_base[i] = n->draft_k_base[i] + n->draft_layer_bytes;
    }

    const bool staging = sc->cfg.staging || sc->cfg.path == KVS_PATH_STAGING;
    kvs_manager_config_t mc = {
        .role = n->role, .staging = staging, .total_heads = l->total_heads,
        .kv_kind = l->kind, .kv_scales = l->kv_scales, .scale_block = l->scale_block,
        .full_attn_every = l->full_attn_every, .other_layers = l->other_layers,
        .window_tokens = l->window_tokens, .state_heads = l->state_heads,
        .state_conv_bytes = l->state_conv_bytes, .state_ssm_bytes = l->state_ssm_bytes,
        .draft_layers = l->draft_layers, .draft_head_dim = l->draft_head_dim,
        .head_dim = l->head_dim, .dtype = sc->cfg.shape.dtype, .layers = n->layers,
        .model_layers = l->layers,
        .page_size = n->ps, .peer_page_size = decode ? l->page_size : l->decode_page_size,
        .tp_rank = n->tp, .tp_size = n->inst->tp,
        .pp_rank = n->pp, .pp_size = n->inst->pp,
        /* A prefill's CP rank and size; a decode learns its peers' CP size
         * from their instances (sim_connect_node), its own config has none. */
        .context_parallel = decode || n->inst->cp == 1 ? 0 : n->inst->cp, .cp_rank = n->cp,
        .peer_tp_size = peer0->tp, .peer_pp_size = peer0->pp,
        .chunk_tokens = sc->cfg.shape.chunk_tokens, .ring_bytes = sc->cfg.ring_bytes,
        .transfer_workers = sc->cfg.transfer_workers, .path = sc->cfg.path,
        .max_rooms = 2 * sc->cfg.max_inflight + 16,
        .stall_timeout_ns = sc->cfg.stall_timeout_ns,
        /* Its instance, and a session of its own in the cluster (the
         * default's formula, instance 0 unchanged). */
        .instance_id = n->inst->id,
        .session_id = ((uint64_t)n->role + 1) << 56 | (uint64_t)n->inst->id << 44 |
                      (uint64_t)n->pp << 32 | (uint64_t)n->cp << 20 | (uint64_t)n->tp,
        /* Every rank of the other side may be its peer; 0: the defaults
         * (64 instances, 256 ranks) hold them. */
        .max_instances = other_insts > 64 ? other_insts : 0,
        .max_peers = other_ranks > 256 ? (uint32_t)other_ranks : 0,
        .max_aux_bytes = sc->cfg.max_aux_bytes,
        .trace = sc->trace != NULL ? sim_core_span : NULL, .trace_ctx = n,
        .log = {.fn = NULL, .level = KVS_LOG_ERROR}};
    kvs_kv_layer_t *layers = calloc((size_t)n->layers, sizeof *layers);
    if (layers == NULL)
        return sim_fail(sc, KVS_ENOMEM, "%s: KV pool tables", n->name);
    for (int64_t i = 0; i < n->layers; i++)
        layers[i] = (kvs_kv_layer_t){.k_addr = n->k_base[i], .v_addr = n->v_base[i],
                                     .tokens = sc->pool_pages * n->ps,
                                     .token_stride_bytes = n->heads * l->head_dim * l->elem_bytes,
                                     .head_stride_bytes = l->head_dim * l->elem_bytes,
                                     .elem_stride_bytes = l->elem_bytes,
                                     .ks_addr = n->ks_base[i], .vs_addr = n->vs_base[i]};
    const kvs_rank_config_t rcfg = {.manager = mc, .layers = layers, .local_heads = n->heads,
                                    .state_base = n->state_base,
                                    .state_slots = state ? (int64_t)sc->cfg.requests : 0,
                                    .draft_k_base = n->draft_k_base,
                                    .draft_v_base = n->draft_v_base};
    kvs_error_t err = {0};
    kvs_fabric_t *fab = NULL; /* its NIC's, wrapped by the hostile writers naming it */
    if ((rc = sim_hostile_fabric(sc, n, &fab)) != KVS_OK) {
        free(layers);
        return rc;
    }
    rc = kvs_rank_create(&rcfg, dev, fab, &n->rank, &err);
    free(layers);
    if (rc != KVS_OK && n->hbm_full) {
        /* The fault under test: the rank reports why and stays down; the
         * run goes on without it. */
        if (sc->ranks_down_at_start++ == 0)
            snprintf(sc->init_error, sizeof sc->init_error, "%s: %s (%s)", n->name, err.msg,
                     kvs_status_name(rc));
        sim_node_teardown(n);
        n->down = true;
        return KVS_OK;
    }
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "%s: %s", n->name, err.msg);
    sim_driver_set_rank(&n->drv, n->rank);
    sim_node_faults(sc, n);
    return KVS_OK;
}

/* Frees everything a rank holds (its counters are kept in n->acc). */
static void sim_node_teardown(sim_node_t *n)
{
    kvs_handler_stats_t st = {0};
    kvs_rank_stats(n->rank, &st);
    n->acc.rdma_writes += st.rdma_writes;
    n->acc.rdma_write_bytes += st.rdma_write_bytes;
    n->acc.msgs_sent += st.msgs_sent;
    n->acc.msgs_rejected += st.msgs_rejected;
    n->acc.watermark_waits += st.watermark_waits;
    n->acc.msgs_retransmitted += st.msgs_retransmitted;
    n->acc.msgs_duplicate += st.msgs_duplicate;
    n->acc.peers_lost += st.peers_lost;
    n->acc.keys_granted += st.keys_granted;
    n->acc.keys_revoked += st.keys_revoked;
    if (st.ring_peak_bytes > n->acc.ring_peak_bytes)
        n->acc.ring_peak_bytes = st.ring_peak_bytes;
    if (n->nic != NULL) {
        n->acc_posts_refused += sim_nic_posts_refused(n->nic);
        n->acc_planted_bytes += sim_nic_planted_landed_bytes(n->nic);
    }
    kvs_rank_destroy(n->rank);
    n->rank = NULL;
    if (n->sc != NULL && n->sc->eng != NULL)
        sim_node_ring_sample(n); /* its ring went with it */
    sim_driver_set_rank(&n->drv, NULL);
    if (n->gpu != NULL && n->pool_addr != 0) {
        kvs_device_t *dev = sim_gpu_device(n->gpu);
        (void)dev->ops.mem_free(dev, n->pool_addr);
    }
    sim_nic_destroy(n->nic);
    sim_gpu_destroy(n->gpu);
    free(n->k_base);
    free(n->v_base);
    free(n->ks_base);
    free(n->vs_base);
    free(n->state_base);
    free(n->draft_k_base);
    free(n->draft_v_base);
    n->nic = NULL;
    n->gpu = NULL;
    n->pool_addr = 0;
    n->pool_host = NULL;
    n->k_base = n->v_base = n->ks_base = n->vs_base = n->state_base = NULL;
    n->draft_k_base = n->draft_v_base = NULL;
}

/* Decode rank n declares every prefill instance (the addresses of its
 * ranks) and connects to its writers in each, ahead of time. One that is
 * down (ENOENT: no such NIC now) is kept and retried by the handler. */
static int sim_connect_node(sim_scenario_t *sc, sim_node_t *n)
{
    for (uint32_t p = 0; p < sc->npinst; p++) {
        const sim_inst_t *pi = sim_prefill_inst(sc, p);
        const char **addrs = malloc((size_t)pi->nranks * sizeof *addrs);
        if (addrs == NULL)
            return sim_fail(sc, KVS_ENOMEM, "scenario tables");
        bool down = false;
        for (int64_t k = 0; k < pi->nranks; k++) {
            addrs[k] = pi->nodes[k].name; /* CP- then stage-major, as the handler wants */
            down = down || pi->nodes[k].down;
        }
        const kvs_instance_desc_t desc = {.id = pi->id, .tp_size = pi->tp, .pp_size = pi->pp,
                                          .dp_size = 1, .cp_size = pi->cp, .addrs = addrs};
        int rc = kvs_rank_add_instance(n->rank, &desc);
        free(addrs);
        if (rc == KVS_OK)
            rc = kvs_rank_connect(n->rank, (kvs_peer_t){pi->id, 0});
        if (rc != KVS_OK && !(rc == KVS_ENOENT && down))
            return sim_fail(sc, rc, "%s: %s", n->name, kvs_rank_last_error(n->rank)->msg);
    }
    sim_node_wake(n);
    return KVS_OK;
}

static int64_t sim_group_root(int64_t *parent, int64_t k)
{
    while (parent[k] != k)
        k = parent[k] = parent[parent[k]];
    return k;
}

/* Groups of the ranks of pair (pi, di) that talk to each other: a decode
 * and every prefill rank that writes to it are one group, and groups
 * sharing a rank merge. Indexed prefill ranks first, then decode ranks;
 * numbered 0.. in that order; past 64 groups, the last ones share bit 63
 * (the judge then counts across them: stricter, never laxer). */
static int sim_pair_groups(sim_scenario_t *sc, const sim_inst_t *pi, const sim_inst_t *di,
                           sim_pair_t *pair)
{
    const kvs_layout_t *l = &pair->lay;
    const int64_t nodes = pi->nranks + di->nranks;
    const int64_t stages = l->prefill_pp / l->decode_pp;
    const int64_t cp_ranks = l->prefill_tp * l->prefill_pp; /* ranks of one CP rank */
    int64_t *parent = malloc((size_t)nodes * sizeof *parent);
    pair->group = malloc((size_t)nodes * sizeof *pair->group);
    if (parent == NULL || pair->group == NULL) {
        free(parent);
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    }
    for (int64_t k = 0; k < nodes; k++)
        parent[k] = k;
    for (int64_t d = 0; d < di->nranks; d++) {
        const sim_node_t *n = &di->nodes[d];
        const int64_t first = l->decode_pp == 1 ? 0 : n->pp;
        for (int64_t i = 0; i < l->tp_writers; i++) {
            /* its prefill rank (kvs_layout_writer's; a hybrid layout's
             * blocks differ by chunk, its writers do not) */
            kvs_hybrid_writer_t hw;
            const kvs_chunk_t none = {0};
            (void)kvs_layout_hybrid_writer(l, n->tp, n->pp, i, 0, &none, &hw);
            const kvs_writer_t w = hw.w;
            for (int64_t c = 0; c < l->prefill_cp; c++) /* every CP rank writes to it */
                for (int64_t s = first; s < first + stages; s++) {
                    const int64_t a = sim_group_root(parent, pi->nranks + d);
                    const int64_t b = sim_group_root(parent, c * cp_ranks +
                                                                 s * l->prefill_tp +
                                                                 w.prefill_rank);
                    parent[a] = b;
                }
        }
    }
    int64_t next = 0;
    for (int64_t k = 0; k < nodes; k++)
        pair->group[k] = -1;
    for (int64_t k = 0; k < nodes; k++) {
        const int64_t root = sim_group_root(parent, k);
        if (pair->group[root] < 0)
            pair->group[root] = next < 63 ? next++ : 63;
        pair->group[k] = pair->group[root];
    }
    pair->ngroups = next + 1; /* (63 when capped: indices up to 63) */
    free(parent);
    return KVS_OK;
}

static int sim_connect_all(sim_scenario_t *sc)
{
    for (int64_t d = 0; d < sc->ndecode; d++) {
        sim_node_t *n = &sc->nodes[sc->nprefill + d];
        int rc = n->down ? KVS_OK : sim_connect_node(sc, n);
        if (rc != KVS_OK)
            return rc;
    }
    return KVS_OK;
}

/* ---- crashes and restarts ---------------------------------------------------- */

/* The rank dies: its handler, memory and connections vanish (its peers see
 * the connections die). Its result of every request of its instance it was
 * in is in: failed. A decode rank that had already received its part of a
 * request still in flight elsewhere lost that KV with its memory: the
 * request fails too. */
static void sim_node_crash(sim_scenario_t *sc, sim_node_t *n)
{
    sim_node_teardown(n);
    n->down = true;
    sc->ranks_crashed++;
    for (uint32_t i = 0; i < sc->cfg.requests && sc->fatal == KVS_OK; i++) {
        sim_req_t *r = &sc->reqs[i];
        if (r->state != SIM_REQ_ADMITTED || !sim_in_pair(r, n))
            continue;
        r->untellable = true;
        if (!n->reported[i])
            sim_report_in(sc, n, i, KVS_EPEER, false);
        else if (n->role == KVS_ROLE_DECODE && r->status == KVS_OK) {
            char who[96];
            snprintf(who, sizeof who, "%s, which crashed holding its KV", n->name);
            sim_request_failed(sc, i, KVS_EPEER, who);
        }
    }
}

static void sim_crash_event(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_node_t *n = ctx;
    if (!n->down)
        sim_node_crash(n->sc, n);
}

/* The rank dies (if alive) and comes back at once: a new GPU, NIC, manager
 * and handler under the same name and session id. A decode declares the
 * prefill instances, connects and registers again; the decodes of a
 * prefill reconnect on their own. */
static void sim_restart_event(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_node_t *n = ctx;
    sim_scenario_t *sc = n->sc;
    if (!n->down)
        sim_node_crash(sc, n);
    if (sc->fatal != KVS_OK)
        return;
    n->down = false;
    n->hbm_full = false;
    if (sim_node_setup(sc, n, n->gpu_id) != KVS_OK)
        return;
    sc->ranks_restarted++;
    if (n->role == KVS_ROLE_DECODE)
        (void)sim_connect_node(sc, n);
    else
        sim_node_wake(n);
}

/* The instances, their ranks (named and numbered as the file's header
 * says), page pools and compute queues, and every pair's layout and groups. */
static int sim_build_cluster(sim_scenario_t *sc)
{
    const sim_scenario_config_t *c = &sc->cfg;
    sc->npinst = sc->topo.prefill_instances;
    sc->ndinst = sc->topo.decode_instances;
    sc->insts = calloc(sc->npinst + sc->ndinst, sizeof *sc->insts);
    sc->pairs = calloc((size_t)sc->npinst * sc->ndinst, sizeof *sc->pairs);
    if (sc->insts == NULL || sc->pairs == NULL)
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    for (uint32_t k = 0; k < sc->npinst + sc->ndinst; k++) {
        sim_inst_t *inst = &sc->insts[k];
        const bool decode = k >= sc->npinst;
        const sim_instance_shape_t *shape =
            decode ? &sc->topo.decode[k - sc->npinst] : &sc->topo.prefill[k];
        inst->role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
        inst->id = decode ? k - sc->npinst : k;
        inst->tp = shape->tp;
        inst->pp = shape->pp;
        inst->cp = decode ? 1 : sc->topo.prefill_cp;
        inst->nranks = sim_topology_ranks(&sc->topo, inst->role, inst->id);
        *(decode ? &sc->ndecode : &sc->nprefill) += inst->nranks;
        inst->compute_first = inst->compute_last = UINT32_MAX;
        if (sim_pages_init(&inst->pages, sc->pool_pages) != KVS_OK)
            return sim_fail(sc, KVS_ENOMEM, "page pools");
    }
    sc->nodes = calloc((size_t)(sc->nprefill + sc->ndecode), sizeof *sc->nodes);
    if (sc->nodes == NULL)
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    sim_node_t *n = sc->nodes;
    for (uint32_t k = 0; k < sc->npinst + sc->ndinst; k++) {
        sim_inst_t *inst = &sc->insts[k];
        inst->nodes = n;
        for (int64_t j = 0; j < inst->nranks; j++, n++) {
            n->sc = sc;
            n->inst = inst;
            n->role = inst->role;
            n->tp = j % inst->tp;
            n->pp = j / inst->tp % inst->pp;
            n->cp = j / (inst->tp * inst->pp);
            const char side = inst->role == KVS_ROLE_DECODE ? 'd' : 'p';
            /* "p<tp>.<pp>", "c<cp>" with CP, "@<instance>" past instance 0 */
            char cp[24] = "", at[16] = "";
            if (inst->cp > 1)
                snprintf(cp, sizeof cp, "c%lld", (long long)n->cp);
            if (inst->id > 0)
                snprintf(at, sizeof at, "@%u", inst->id);
            snprintf(n->name, sizeof n->name, "%c%lld.%lld%s%s", side, (long long)n->tp,
                     (long long)n->pp, cp, at);
            n->reported = calloc(c->requests, 1);
            if (n->reported == NULL)
                return sim_fail(sc, KVS_ENOMEM, "scenario tables");
        }
    }
    for (uint32_t p = 0; p < sc->npinst; p++)
        for (uint32_t d = 0; d < sc->ndinst; d++) {
            sim_pair_t *pair = &sc->pairs[p * sc->ndinst + d];
            const kvs_layout_params_t params = sim_topology_pair(&c->shape, &sc->topo, p, d);
            kvs_error_t err = {0};
            int rc = kvs_layout_init(&pair->lay, &params, &err);
            if (rc != KVS_OK) /* the topology was checked: cannot be */
                return sim_fail(sc, rc, "pair of prefill instance %u and decode instance %u: %s",
                                p, d, err.msg);
            if ((rc = sim_pair_groups(sc, sim_prefill_inst(sc, p), sim_decode_inst(sc, d),
                                      pair)) != KVS_OK)
                return rc;
        }
    return KVS_OK;
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
    /* a cached prefix starts a page of both sides: the lcm of the page
     * sizes, the grid's unit the layout keeps (kvstage.h) */
    const int64_t unit = sc->lay.cp_align_tokens;
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
    for (int64_t i = 0; i < sc->nprefill + sc->ndecode; i++)
        if ((rc = sim_node_setup(sc, &sc->nodes[i], (uint32_t)i)) != KVS_OK)
            return rc;
    if ((rc = sim_connect_all(sc)) != KVS_OK)
        return rc;
    /* The workload: arrival times, prompt lengths and cached prefixes. */
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
