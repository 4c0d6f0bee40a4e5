/*
 * faults.c - the faults a simulated run injects (scenario.h's
 * sim_fault_t; run.h): each checked against the cluster before the ranks
 * are made, the timed ones scheduled (links down and up, crashes,
 * restarts), what they set on a rank's GPU and NIC once it is up (the
 * message filter, write errors, slow scatters; a hostile writer's fabric
 * wrapper is hostile.c's, made as node.c sets the rank up),
 * and what a crash does to the requests of the rank (failed, as no handler
 * of it can say). A restarted rank is set up again by node.c.
 */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sim_node_t *sim_fault_node(sim_scenario_t *sc, uint32_t i, const sim_fault_t *f);
static void sim_crash_event(sim_engine_t *eng, void *ctx, uint64_t arg);
static void sim_restart_event(sim_engine_t *eng, void *ctx, uint64_t arg);

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

/* What the faults set on rank n's GPU and NIC, once it is up (again
 * after a restart). */
void sim_faults_arm(sim_scenario_t *sc, sim_node_t *n)
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
    if (n->rank != NULL)
        sim_faults_arm(sc, n);
    sc->ranks_restarted++;
    if (n->role == KVS_ROLE_DECODE)
        (void)sim_connect_node(sc, n);
    else
        sim_node_wake(n);
}

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
int sim_faults_check(sim_scenario_t *sc)
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
