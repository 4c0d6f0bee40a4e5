/*
 * run.c - a simulated run's bookkeeping (run.h): failing the run or one
 * request with the detail the report keeps, and the KV page pools of the
 * instances. Calls nothing else of the run.
 */
#include "run.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sim_fail(sim_scenario_t *sc, int status, const char *fmt, ...)
{
    if (sc->fatal == KVS_OK && sc->err != NULL && sc->err_bytes > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sc->err, sc->err_bytes, fmt, ap);
        va_end(ap);
    }
    if (sc->fatal == KVS_OK)
        sc->fatal = status;
    if (sc->eng != NULL) /* setup errors come before the engine exists */
        sim_engine_stop(sc->eng);
    return status;
}

/* Request i ends with `status` (its first failure), which `who` saw: the
 * first request of each status leaves its detail for the report. */
void sim_request_failed(sim_scenario_t *sc, uint32_t i, int status, const char *who)
{
    sim_req_t *r = &sc->reqs[i];
    if (r->status != KVS_OK || status == KVS_OK)
        return;
    r->status = status;
    for (uint32_t k = 0; k < sc->nfailures; k++)
        if (sc->failures[k].status == status)
            return;
    if (sc->nfailures == SIM_MAX_FAILURE_KINDS)
        return;
    sim_failure_t *f = &sc->failures[sc->nfailures++];
    f->status = status;
    const uint64_t now = sc->eng != NULL ? sim_engine_now_ns(sc->eng) : 0;
    snprintf(f->first_detail, sizeof f->first_detail,
             "request %u (%lld tokens, prefill %u -> decode %u) on %s at %llu.%03llu ms: %s",
             i, (long long)r->tokens, r->pi != NULL ? r->pi->id : 0,
             r->di != NULL ? r->di->id : 0, who, (unsigned long long)(now / 1000000u),
             (unsigned long long)(now / 1000u % 1000u), kvs_strerror(status));
}

/* ---- pages ------------------------------------------------------------------ */

int sim_pages_init(sim_pages_t *p, int64_t n)
{
    p->taken = calloc((size_t)(n > 0 ? n : 1), 1);
    if (p->taken == NULL)
        return KVS_ENOMEM;
    p->count = p->cap = n;
    p->low = 0;
    return KVS_OK;
}

/* Takes the n lowest free pages, in ascending order: a request's pages
 * then form few runs of consecutive ids however requests come and go, so
 * a copy of its KV (one descriptor walk per run) stays a few runs long
 * over a long run. (A stack of freed pages, reused last in first out,
 * left later requests' pages in ever smaller runs.) Which pages a request
 * gets changes no time or count of the simulation, only addresses. */
void sim_pages_take(sim_pages_t *p, int64_t *out, int64_t n)
{
    assert(n <= p->count);
    int64_t id = p->low;
    for (int64_t i = 0; i < n; i++, id++) {
        while (p->taken[id])
            id++;
        p->taken[id] = 1;
        out[i] = id;
    }
    p->count -= n;
    while (p->low < p->cap && p->taken[p->low])
        p->low++;
}

void sim_pages_give(sim_pages_t *p, const int64_t *ids, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        assert(p->taken[ids[i]]);
        p->taken[ids[i]] = 0;
        if (ids[i] < p->low)
            p->low = ids[i];
    }
    p->count += n;
}
