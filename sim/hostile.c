/*
 * hostile.c - the simulator's hostile writers (see hostile.h). A fault's
 * wrapper picks the first staged write of its rank at or after the fault's
 * at_ns (a write to a decode rank of a pair that stages: the direct and
 * slice paths write into the decode's KV pages under its whole-pool keys,
 * which are not scoped yet, docs/security.md). SIM_HOSTILE_OUTSIDE moves
 * that write its own length past its bytes. SIM_HOSTILE_STALE lets it go,
 * keeps its target and key, and redirects there the rank's next staged
 * write to the same decode rank once every request in flight at the keep
 * has ended (its region freed). The NIC's write hook marks the write the
 * wrapper spoils as planted, after the test's own hook (cfg.write_hook).
 *
 * A fault's state and wrapper outlive its rank's restarts: a write kept
 * before a restart strikes after it. Deterministic: the choices read the
 * virtual clock and the run's state only.
 */
#include "hostile.h"

#include "fabric.h"
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sim_hostile_add(sim_scenario_t *sc, uint32_t fault, sim_node_t *n)
{
    sim_hostile_state_t *h = &sc->hostile[fault];
    h->pending = calloc(sc->cfg.requests, sizeof *h->pending);
    if (h->pending == NULL)
        return KVS_ENOMEM;
    h->sc = sc;
    h->fault = fault;
    h->node = n;
    return KVS_OK;
}

/* Whether the pair of instances (pi, di) stages (as sim_check_ring says). */
static bool sim_pair_stages(const sim_scenario_t *sc, const sim_inst_t *pi, const sim_inst_t *di)
{
    return sc->cfg.staging && (sc->cfg.path == KVS_PATH_STAGING ||
                               (sc->cfg.path == KVS_PATH_AUTO &&
                                (pi->tp != di->tp || sc->lay.full_attn_every > 1 ||
                                 sc->lay.draft_layers > 0)));
}

/* The node whose NIC is named name, or NULL. */
static const sim_node_t *sim_node_named(const sim_scenario_t *sc, const char *name)
{
    for (int64_t k = 0; k < sc->nprefill + sc->ndecode; k++)
        if (strcmp(sc->nodes[k].name, name) == 0)
            return &sc->nodes[k];
    return NULL;
}

/* The name of the NIC at the other end of conn, a connection of h's rank. */
static bool sim_hostile_peer(const sim_hostile_state_t *h, kvs_conn_t *conn, char *buf,
                             size_t bytes)
{
    kvs_fabric_t *nic = sim_nic_fabric(h->node->nic);
    return nic->ops.peer_addr(nic, conn, buf, bytes) == KVS_OK;
}

/* The wrapper's pick: a staged write at or after the fault's time that no
 * earlier fault of the rank spoils (the first fault that strikes a write
 * takes it). */
static bool sim_hostile_pick(void *ctx, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    const sim_hostile_state_t *h = ctx;
    const sim_scenario_t *sc = h->sc;
    for (uint32_t k = 0; k < h->fault; k++)
        if (sc->hostile[k].node == h->node && sc->hostile[k].wrap != NULL &&
            kvs_fault_fabric_posting(sc->hostile[k].wrap) == KVS_FAULT_POST_SPOILED)
            return false;
    if (sim_engine_now_ns(sc->eng) < sc->cfg.faults[h->fault].at_ns)
        return false;
    char peer[sizeof h->peer];
    if (!sim_hostile_peer(h, conn, peer, sizeof peer))
        return false;
    const sim_node_t *d = sim_node_named(sc, peer);
    return d != NULL && d->role == KVS_ROLE_DECODE && sim_pair_stages(sc, h->node->inst, d->inst);
}

/* The wrapper's due (stale): a write to the decode rank of the kept one,
 * once every request in flight when it was kept has ended. */
static bool sim_hostile_due(void *ctx, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    const sim_hostile_state_t *h = ctx;
    char peer[sizeof h->peer];
    if (!sim_hostile_peer(h, conn, peer, sizeof peer) || strcmp(peer, h->peer) != 0)
        return false;
    for (uint32_t k = 0; k < h->npending; k++)
        if (h->sc->reqs[h->pending[k]].state != SIM_REQ_DONE)
            return false;
    return true;
}

/* The write hook of a rank hostile-write faults name: the test's own hook
 * sees every write first; a write a fault's wrapper spoils is marked
 * planted and counted, and a stale fault's kept write leaves its decode
 * rank and the requests in flight now. */
static bool sim_hostile_mark(void *ctx, const char *nic, const char *peer, uint64_t *remote_addr,
                             uint64_t *rkey, uint64_t len)
{
    sim_node_t *n = ctx;
    sim_scenario_t *sc = n->sc;
    bool planted = sc->cfg.write_hook != NULL &&
                   sc->cfg.write_hook(sc->cfg.hook_ctx, nic, peer, remote_addr, rkey, len);
    for (uint32_t i = 0; i < sc->cfg.nfaults; i++) {
        sim_hostile_state_t *h = &sc->hostile[i];
        if (h->node != n || h->wrap == NULL)
            continue;
        switch (kvs_fault_fabric_posting(h->wrap)) {
        case KVS_FAULT_POST_KEPT:
            snprintf(h->peer, sizeof h->peer, "%s", peer);
            h->npending = 0;
            for (uint32_t k = 0; k < sc->cfg.requests; k++)
                if (sc->reqs[k].state == SIM_REQ_ADMITTED)
                    h->pending[h->npending++] = k;
            break;
        case KVS_FAULT_POST_SPOILED:
            sc->hostile_writes++;
            planted = true;
            break;
        case KVS_FAULT_POST_NONE:
            break;
        }
    }
    return planted;
}

int sim_hostile_fabric(sim_scenario_t *sc, sim_node_t *n, kvs_fabric_t **fab)
{
    *fab = sim_nic_fabric(n->nic);
    bool struck = false;
    for (uint32_t i = sc->cfg.nfaults; i-- > 0;) { /* the last fault innermost */
        sim_hostile_state_t *h = &sc->hostile[i];
        if (h->node != n)
            continue;
        struck = true;
        if (h->wrap != NULL) { /* a restart: the same fault, on the new NIC */
            kvs_fault_fabric_rebind(h->wrap, *fab);
        } else {
            const bool stale = sc->cfg.faults[i].hostile == SIM_HOSTILE_STALE;
            const kvs_fault_fabric_config_t fc = {
                .kind = stale ? KVS_FAULT_STALE_WRITE : KVS_FAULT_HOSTILE_WRITE,
                .fail_write = 1,
                .hostile_shift_bytes = 0, /* its own length past its bytes */
                .stale = KVS_FAULT_STALE_REDIRECT,
                .pick = sim_hostile_pick,
                .due = sim_hostile_due,
                .ctx = h};
            const int rc = kvs_fault_fabric_create(*fab, &fc, &h->wrap);
            if (rc != KVS_OK)
                return sim_fail(sc, rc, "%s: the wrapper of hostile-write fault %u: %s", n->name,
                                i, kvs_strerror(rc));
        }
        *fab = kvs_fault_fabric(h->wrap);
    }
    if (struck)
        sim_nic_set_write_hook(n->nic, sim_hostile_mark, n);
    return KVS_OK;
}

void sim_hostile_free(sim_scenario_t *sc)
{
    for (uint32_t i = 0; i < SIM_MAX_FAULTS; i++) {
        kvs_fault_fabric_destroy(sc->hostile[i].wrap);
        free(sc->hostile[i].pending);
    }
}
