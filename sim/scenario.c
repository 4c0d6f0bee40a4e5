/*
 * scenario.c - one simulated run (see scenario.h). Builds the cluster (a
 * simulated GPU and NIC per rank, the real kvstage manager and handler on
 * each), registers every decode rank with its prefill writers, then replays
 * the workload on the engine's virtual clock:
 *   arrival -> admission (KV pages on both sides, rooms opened on every rank)
 *   -> chunked prefill (modeled forward time; each step writes the pattern of
 *   sim/kvdata into the prefill ranks' KV pools and tells the handlers)
 *   -> the handlers move the KV -> every rank reports the room -> the decode
 *   ranks' bytes are checked against the pattern -> pages freed.
 * Ranks make progress only when their GPU or NIC wakes them, like a real
 * event loop. Nothing here reads the wall clock.
 */
#include "scenario.h"

#include "engine.h"
#include "kvdata.h"
#include "trace.h"

#include <kvstage/backend.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* RNG stream ids: fixed, so adding one never reshuffles the others. */
enum { SIM_STREAM_ARRIVALS = 1, SIM_STREAM_LENGTHS = 2, SIM_STREAM_PREFIX = 3 };

typedef struct sim_scenario sim_scenario_t;

typedef struct sim_node {
    sim_scenario_t *sc;
    kvs_role_t role;
    int64_t tp, pp;
    char name[48];
    sim_gpu_t *gpu;
    sim_nic_t *nic;
    kvs_manager_t *m;
    kvs_decode_t *dec;
    kvs_prefill_t *pre;
    uint64_t pool_addr, layer_bytes;
    uint8_t *pool_host;          /* host view of the whole KV pool */
    int64_t layers, heads;       /* local */
    int64_t first_layer;         /* global id of its stage's first layer */
    uint64_t *k_base, *v_base;
    bool wake_pending;
    uint64_t timer_ns;           /* a progress already scheduled then, 0: none */
    uint32_t gpu_id;
    bool down;                   /* crashed, or failed its init: no handler */
    bool hbm_full;               /* its GPU holds the KV pool and nothing more */
    uint8_t *reported;           /* [requests]: this rank's result is in */
    kvs_handler_stats_t acc;     /* counters of its previous incarnations */
    uint64_t acc_posts_refused;  /* ... and of their NICs */
} sim_node_t;

typedef enum { SIM_REQ_WAITING, SIM_REQ_ADMITTED, SIM_REQ_DONE } sim_req_state_t;

typedef struct sim_req {
    int64_t tokens, base;
    uint64_t arrival_ns, computed_ns, done_ns;
    int64_t *ppages, *dpages;    /* ceil(tokens/ps), ceil((tokens-base)/ps) */
    int64_t computed;
    uint64_t opened_ns;
    int64_t reports_left;
    int status;
    bool unreported;             /* a rank timed out after a peer failed */
    uint64_t failed_groups;      /* bit g: a rank of group g failed it for real */
    uint64_t timed_out_groups;   /* bit g: a rank of group g timed out on it */
    uint64_t *failed_ns;         /* [groups], when; NULL until the first such */
    bool untellable;             /* a rank of it crashed, was down, or was cut off
                                    for a stall timeout or more: nobody could tell
                                    it, so its timeouts are expected */
    sim_req_state_t state;
} sim_req_t;

typedef struct sim_pages {
    int64_t *free_ids;
    int64_t count, cap;
} sim_pages_t;

struct sim_scenario {
    sim_scenario_config_t cfg;
    kvs_layout_t lay;
    sim_engine_t *eng;
    sim_net_t *net;
    sim_node_t *nodes;           /* prefill (P * Pp) then decode (D * Dp) */
    int64_t nprefill, ndecode;
    sim_pages_t ppool, dpool;
    int64_t pool_pages;
    sim_req_t *reqs;
    uint32_t *waiting;           /* admission FIFO of request indices */
    uint32_t waiting_head, waiting_count;
    uint32_t *compute;           /* forward-pass FIFO */
    uint32_t compute_head, compute_count;
    bool computing;
    uint32_t inflight, finished;
    uint64_t first_arrival_ns, last_done_ns;
    uint64_t bytes_verified, corrupt_bytes;
    int fatal;
    char *err;
    size_t err_bytes;
    sim_trace_t *trace;
    bool msg_faults;             /* a drop/dup/delay fault: NICs get the filter */
    uint32_t ranks_crashed, ranks_restarted, ranks_down_at_start;
    uint32_t long_cuts;          /* links down now for a stall timeout or more */
    int64_t *group;              /* [nodes]: ranks that talk to each other, directly
                                    or through one another (bit index, < 64) */
    int64_t ngroups;
    char init_error[384];
};

static int sim_fail(sim_scenario_t *sc, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int sim_fail(sim_scenario_t *sc, int status, const char *fmt, ...)
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

/* ---- pages ------------------------------------------------------------------ */

static int sim_pages_init(sim_pages_t *p, int64_t n)
{
    p->free_ids = malloc((size_t)n * sizeof *p->free_ids);
    if (p->free_ids == NULL)
        return KVS_ENOMEM;
    for (int64_t i = 0; i < n; i++)
        p->free_ids[i] = n - 1 - i; /* pop order 0, 1, 2, ... */
    p->count = p->cap = n;
    return KVS_OK;
}

static void sim_pages_take(sim_pages_t *p, int64_t *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = p->free_ids[--p->count];
}

static void sim_pages_give(sim_pages_t *p, const int64_t *ids, int64_t n)
{
    for (int64_t i = n - 1; i >= 0; i--)
        p->free_ids[p->count++] = ids[i];
}

/* ---- node plumbing ----------------------------------------------------------- */

static void sim_node_progress(sim_engine_t *eng, void *ctx, uint64_t arg);

static void sim_node_wake(void *ctx)
{
    sim_node_t *n = ctx;
    if (n->wake_pending || n->down)
        return;
    n->wake_pending = true;
    if (sim_engine_after(n->sc->eng, 0, sim_node_progress, n, 0, NULL) != KVS_OK)
        sim_fail(n->sc, KVS_ENOMEM, "scheduling the progress of %s failed", n->name);
}

/* Global head of local head j on a rank of TP tp holding `heads` heads. */
static int64_t sim_global_head(int64_t total, int64_t tp_size, int64_t rank, int64_t heads,
                               int64_t j)
{
    if (total >= tp_size)
        return rank * heads + j;
    return rank / (tp_size / total); /* replicated: ranks sharing a head */
}

static uint8_t *sim_slot(const sim_node_t *n, int64_t layer, int kv, int64_t page, int64_t slot,
                         int64_t head, int64_t ps, int64_t head_bytes)
{
    const uint64_t addr = (kv ? n->v_base[layer] : n->k_base[layer]) +
                          (uint64_t)(((page * ps + slot) * n->heads + head) * head_bytes);
    return n->pool_host + (addr - n->pool_addr);
}

/* The forward pass of tokens [a, b) on one prefill rank. */
static void sim_fill_prefill(sim_scenario_t *sc, sim_node_t *n, uint64_t req, int64_t a, int64_t b)
{
    const kvs_layout_t *l = &sc->lay;
    const int64_t ps = l->page_size, hb = l->head_dim * l->elem_bytes;
    const sim_req_t *r = &sc->reqs[req];
    for (int64_t layer = 0; layer < n->layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int64_t t = a; t < b; t++)
                for (int64_t j = 0; j < n->heads; j++) {
                    sim_kv_coord_t c = {req, n->first_layer + layer, kv,
                                        sim_global_head(l->total_heads, l->prefill_tp, n->tp,
                                                        n->heads, j),
                                        t};
                    sim_kvdata_fill(sim_slot(n, layer, kv, r->ppages[t / ps], t % ps, j, ps, hb),
                                    (size_t)hb, &c);
                }
}

/* Checks what one decode rank received for a request; returns bytes checked. */
static uint64_t sim_verify_decode(sim_scenario_t *sc, sim_node_t *n, uint64_t req,
                                  uint64_t *corrupt)
{
    const kvs_layout_t *l = &sc->lay;
    const int64_t ps = l->page_size, hb = l->head_dim * l->elem_bytes;
    const sim_req_t *r = &sc->reqs[req];
    uint64_t checked = 0;
    for (int64_t layer = 0; layer < n->layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int64_t t = r->base; t < r->tokens; t++)
                for (int64_t j = 0; j < n->heads; j++) {
                    sim_kv_coord_t c = {req, n->first_layer + layer, kv,
                                        sim_global_head(l->total_heads, l->decode_tp, n->tp,
                                                        n->heads, j),
                                        t};
                    *corrupt += sim_kvdata_check(
                        sim_slot(n, layer, kv, r->dpages[(t - r->base) / ps], t % ps, j, ps, hb),
                        (size_t)hb, &c);
                    checked += (uint64_t)hb;
                }
    return checked;
}

/* Spans of a rank's GPU, NIC and core go to its trace process. */
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
static void sim_node_faults(sim_scenario_t *sc, sim_node_t *n)
{
    const int64_t k = n - sc->nodes;
    if (sc->msg_faults)
        sim_nic_set_msg_filter(n->nic, sim_msg_filter, sc);
    for (uint32_t i = 0; i < sc->cfg.nfaults; i++) {
        const sim_fault_t *f = &sc->cfg.faults[i];
        if (f->kind == SIM_FAULT_WRITE_ERROR && n->role == KVS_ROLE_PREFILL)
            sim_nic_set_write_error(n->nic, f->num, f->den);
        if (f->kind == SIM_FAULT_SLOW_SCATTER && f->rank == k)
            sim_gpu_set_scatter_slowdown(n->gpu, f->factor > 0 ? f->factor : 1);
    }
}

static void sim_crash_event(sim_engine_t *eng, void *ctx, uint64_t arg);
static void sim_restart_event(sim_engine_t *eng, void *ctx, uint64_t arg);

/* The node of a crash/restart fault, or NULL (with the scenario failed). */
static sim_node_t *sim_fault_node(sim_scenario_t *sc, uint32_t i, const sim_fault_t *f)
{
    const bool decode = f->role == KVS_ROLE_DECODE;
    const int64_t count = decode ? sc->ndecode : sc->nprefill;
    if (f->rank < 0 || f->rank >= count) {
        sim_fail(sc, KVS_EINVAL, "fault %u names %s rank %lld, but there are %lld: use 0..%lld",
                 i, decode ? "decode" : "prefill", (long long)f->rank, (long long)count,
                 (long long)count - 1);
        return NULL;
    }
    return &sc->nodes[(decode ? sc->nprefill : 0) + f->rank];
}

/* Checks every fault against this cluster and schedules the timed ones.
 * Runs before the ranks are created (hbm-full shapes a rank's GPU). */
static int sim_faults_check(sim_scenario_t *sc)
{
    const int64_t nodes = sc->nprefill + sc->ndecode;
    for (uint32_t i = 0; i < sc->cfg.nfaults; i++) {
        const sim_fault_t *f = &sc->cfg.faults[i];
        const bool ranked = f->kind == SIM_FAULT_LINK_DOWN ||
                            f->kind == SIM_FAULT_SLOW_SCATTER || f->kind == SIM_FAULT_HBM_FULL;
        if (ranked && (f->rank < 0 || f->rank >= nodes))
            return sim_fail(sc, KVS_EINVAL, "fault %u names rank %lld of %lld: use p<tp> or "
                            "d<tp> of this cluster", i, (long long)f->rank, (long long)nodes);
        sim_node_t *n = NULL;
        if ((f->kind == SIM_FAULT_CRASH || f->kind == SIM_FAULT_RESTART) &&
            (n = sim_fault_node(sc, i, f)) == NULL)
            return sc->fatal;
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
            rc = sim_engine_at(sc->eng, f->at_ns, sim_link_event, &sc->nodes[f->rank], cut, NULL);
            if (rc == KVS_OK)
                rc = sim_engine_at(sc->eng, f->at_ns + f->for_ns, sim_link_event,
                                   &sc->nodes[f->rank], cut | 1, NULL);
            break;
        }
        case SIM_FAULT_CRASH:
            rc = sim_engine_at(sc->eng, f->at_ns, sim_crash_event, n, 0, NULL);
            break;
        case SIM_FAULT_RESTART:
            rc = sim_engine_at(sc->eng, f->at_ns, sim_restart_event, n, 0, NULL);
            break;
        case SIM_FAULT_HBM_FULL:
            sc->nodes[f->rank].hbm_full = true;
            break;
        case SIM_FAULT_WRITE_ERROR:
        case SIM_FAULT_SLOW_SCATTER:
            break; /* per rank, at its creation */
        }
        if (rc != KVS_OK)
            return sim_fail(sc, rc, "scheduling fault %u failed", i);
    }
    return KVS_OK;
}

/* ---- requests ---------------------------------------------------------------- */

static void sim_try_admit(sim_scenario_t *sc);
static void sim_compute_next(sim_scenario_t *sc);

static void sim_finish(sim_scenario_t *sc, uint32_t i)
{
    sim_req_t *r = &sc->reqs[i];
    const uint64_t now = sim_engine_now_ns(sc->eng);
    r->state = SIM_REQ_DONE;
    r->done_ns = now;
    if (r->status == KVS_OK) {
        for (int64_t d = 0; d < sc->ndecode; d++) {
            if (sc->nodes[sc->nprefill + d].down)
                continue; /* cannot be: a crash fails the request */
            uint64_t corrupt = 0;
            sc->bytes_verified += sim_verify_decode(sc, &sc->nodes[sc->nprefill + d], i, &corrupt);
            sc->corrupt_bytes += corrupt;
        }
    }
    sim_trace_span(sc->trace, 0, "requests", r->status == KVS_OK ? "transfer" : "transfer (failed)",
                   r->computed_ns, now);
    const int64_t ps = sc->lay.page_size;
    sim_pages_give(&sc->ppool, r->ppages, (r->tokens + ps - 1) / ps);
    sim_pages_give(&sc->dpool, r->dpages, (r->tokens - r->base + ps - 1) / ps);
    free(r->ppages);
    free(r->dpages);
    r->ppages = r->dpages = NULL;
    sc->inflight--;
    sc->finished++;
    sc->last_done_ns = now;
    const uint32_t step = sc->cfg.requests / 64 > 0 ? sc->cfg.requests / 64 : 1;
    if (sc->cfg.progress != NULL && (sc->finished % step == 0 || sc->finished == sc->cfg.requests))
        sc->cfg.progress(sc->cfg.progress_ctx, sc->finished, sc->cfg.requests, now);
    if (sc->finished == sc->cfg.requests)
        sim_engine_stop(sc->eng);
    sim_try_admit(sc);
}

/* Rank n's result for request i is in (its own, or its crash). */
static void sim_report_in(sim_scenario_t *sc, sim_node_t *n, uint32_t i, int status)
{
    sim_req_t *r = &sc->reqs[i];
    n->reported[i] = 1;
    if (r->status == KVS_OK && status != KVS_OK)
        r->status = status;
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
    if (r->state != SIM_REQ_ADMITTED || r->reports_left <= 0 || n->reported[res->room]) {
        sim_fail(sc, KVS_EPROTO, "%s reported room %llu twice", n->name,
                 (unsigned long long)res->room);
        return;
    }
    /* A rank that only learns of a real failure of a rank it talks to
     * (directly or through others: its group) by its own stall timeout was
     * never told: spec §9 wants failures sent at once. Not when a rank
     * crashed or was cut off, and not for a lost peer (KVS_EPEER): the one
     * who could not be told is on the other side of the dead connection.
     * Ranks of another group have no connection to the failing one. */
    const int64_t g = sc->group[n - sc->nodes];
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
            (r->failed_ns = calloc((size_t)sc->ngroups, sizeof *r->failed_ns)) == NULL) {
            sim_fail(sc, KVS_ENOMEM, "scenario tables");
            return;
        }
        r->failed_groups |= 1ull << g;
        r->failed_ns[g] = now;
    }
    sim_report_in(sc, n, (uint32_t)res->room, res->status);
}

static void sim_node_timer(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_node_t *n = ctx;
    if (n->timer_ns == arg)
        n->timer_ns = 0;
    sim_node_wake(n);
}

/* The handlers' contract: progress again when the clock passes their next
 * deadline (stall timeouts), even if nothing else wakes the rank. */
static void sim_node_arm_timer(sim_node_t *n)
{
    if (n->down)
        return;
    const uint64_t at = n->dec != NULL ? kvs_decode_next_deadline_ns(n->dec)
                                       : kvs_prefill_next_deadline_ns(n->pre);
    if (at == UINT64_MAX || (n->timer_ns != 0 && n->timer_ns <= at))
        return;
    const uint64_t now = sim_engine_now_ns(n->sc->eng);
    n->timer_ns = at > now ? at : now;
    if (sim_engine_at(n->sc->eng, n->timer_ns, sim_node_timer, n, n->timer_ns, NULL) != KVS_OK)
        sim_fail(n->sc, KVS_ENOMEM, "scheduling a timer of %s failed", n->name);
}

static void sim_node_progress(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_node_t *n = ctx;
    sim_scenario_t *sc = n->sc;
    n->wake_pending = false;
    if (n->down)
        return; /* crashed after this was scheduled */
    int rc = n->dec != NULL ? kvs_decode_progress(n->dec) : kvs_prefill_progress(n->pre);
    if (rc < 0) {
        sim_fail(sc, rc, "%s: progress failed: %s", n->name, kvs_manager_last_error(n->m)->msg);
        return;
    }
    kvs_room_result_t res[16];
    int got;
    do {
        got = n->dec != NULL ? kvs_decode_poll_rooms(n->dec, res, 16)
                             : kvs_prefill_poll_rooms(n->pre, res, 16);
        for (int i = 0; i < got && !n->down; i++)
            sim_on_result(sc, n, &res[i]);
    } while (got == 16);
    sim_node_arm_timer(n);
}

/* One forward-pass step of the request at the head of the compute FIFO. */
static void sim_compute_step(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_scenario_t *sc = ctx;
    const uint32_t i = (uint32_t)arg;
    sim_req_t *r = &sc->reqs[i];
    if (r->state == SIM_REQ_DONE) {
        /* It failed on every rank while being prefilled (its pages are
         * gone): the rest of its forward pass is abandoned. */
        sc->computing = false;
        sim_compute_next(sc);
        return;
    }
    const int64_t end = r->computed + sc->lay.grid_tokens < r->tokens
                            ? r->computed + sc->lay.grid_tokens : r->tokens;
    const bool final = end == r->tokens;
    for (int64_t p = 0; p < sc->nprefill; p++) {
        sim_node_t *n = &sc->nodes[p];
        if (n->down)
            continue;
        sim_fill_prefill(sc, n, i, r->computed, end);
        int rc = kvs_prefill_room_computed(n->pre, i, end, final);
        if (rc == KVS_ENOENT)
            continue; /* this rank already ended the room (it failed): nothing to send */
        if (rc != KVS_OK) {
            sim_fail(sc, rc, "%s: room_computed: %s", n->name, kvs_manager_last_error(n->m)->msg);
            return;
        }
        sim_node_wake(n);
    }
    r->computed = end;
    if (!final) {
        const int64_t next = end + sc->lay.grid_tokens < r->tokens ? sc->lay.grid_tokens
                                                                    : r->tokens - end;
        const uint64_t dt = (uint64_t)next * 1000000000ull / sc->cfg.prefill_tokens_per_s;
        sim_engine_after(eng, dt, sim_compute_step, sc, i, NULL);
        return;
    }
    r->computed_ns = sim_engine_now_ns(eng);
    sc->computing = false;
    sim_compute_next(sc);
}

static void sim_compute_next(sim_scenario_t *sc)
{
    if (sc->computing || sc->compute_count == 0)
        return;
    const uint32_t i = sc->compute[sc->compute_head];
    sc->compute_head = (sc->compute_head + 1) % sc->cfg.requests;
    sc->compute_count--;
    sc->computing = true;
    const sim_req_t *r = &sc->reqs[i];
    const int64_t first = sc->lay.grid_tokens < r->tokens ? sc->lay.grid_tokens : r->tokens;
    const uint64_t dt = (uint64_t)first * 1000000000ull / sc->cfg.prefill_tokens_per_s;
    if (sim_engine_after(sc->eng, dt, sim_compute_step, sc, i, NULL) != KVS_OK)
        sim_fail(sc, KVS_ENOMEM, "scheduling a forward pass failed");
}

static void sim_finish_event(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_finish(ctx, (uint32_t)arg);
}

static int sim_open_rooms(sim_scenario_t *sc, uint32_t i)
{
    sim_req_t *r = &sc->reqs[i];
    const int64_t ps = sc->lay.page_size;
    const int64_t np = (r->tokens + ps - 1) / ps, nd = (r->tokens - r->base + ps - 1) / ps;
    /* A rank that is down takes no part: its (failed) result is in now, and
     * the others learn of it by their connections to it. */
    int down = 0;
    if (sc->long_cuts > 0)
        r->untellable = true;
    for (int64_t k = 0; k < sc->nprefill + sc->ndecode; k++) {
        sim_node_t *n = &sc->nodes[k];
        if (n->down) {
            n->reported[i] = 1;
            r->reports_left--;
            r->status = r->status == KVS_OK ? KVS_EPEER : r->status;
            r->untellable = true;
            down++;
        }
    }
    for (int64_t d = 0; d < sc->ndecode; d++) {
        sim_node_t *n = &sc->nodes[sc->nprefill + d];
        if (n->down)
            continue;
        int rc = kvs_decode_room_open(n->dec, i, r->base, r->tokens, r->dpages, nd);
        /* EPEER: a prefill rank it writes from is away; the room failed at
         * once and its result comes from poll_rooms. */
        if (rc != KVS_OK && rc != KVS_EPEER)
            return sim_fail(sc, rc, "%s: room_open: %s", n->name, kvs_manager_last_error(n->m)->msg);
        if (rc == KVS_EPEER)
            r->untellable = true;
        sim_node_wake(n);
    }
    for (int64_t p = 0; p < sc->nprefill; p++) {
        sim_node_t *n = &sc->nodes[p];
        if (n->down)
            continue;
        int rc = kvs_prefill_room_open(n->pre, i, r->tokens, r->ppages, np);
        /* EPEER: a decode rank it writes to is away; the room failed at
         * once and its result comes from poll_rooms. */
        if (rc != KVS_OK && rc != KVS_EPEER)
            return sim_fail(sc, rc, "%s: room_open: %s", n->name, kvs_manager_last_error(n->m)->msg);
        if (rc == KVS_EPEER)
            r->untellable = true;
        sim_node_wake(n);
    }
    if (r->reports_left == 0 && down > 0 &&
        sim_engine_after(sc->eng, 0, sim_finish_event, sc, i, NULL) != KVS_OK)
        return sim_fail(sc, KVS_ENOMEM, "scheduling the end of request %u failed", i);
    return KVS_OK;
}

static void sim_try_admit(sim_scenario_t *sc)
{
    const int64_t ps = sc->lay.page_size;
    while (sc->waiting_count > 0 && sc->inflight < sc->cfg.max_inflight && sc->fatal == KVS_OK) {
        const uint32_t i = sc->waiting[sc->waiting_head];
        sim_req_t *r = &sc->reqs[i];
        const int64_t np = (r->tokens + ps - 1) / ps, nd = (r->tokens - r->base + ps - 1) / ps;
        if (np > sc->ppool.count || nd > sc->dpool.count)
            return; /* wait for pages */
        r->ppages = malloc((size_t)(np > 0 ? np : 1) * sizeof *r->ppages);
        r->dpages = malloc((size_t)(nd > 0 ? nd : 1) * sizeof *r->dpages);
        if (r->ppages == NULL || r->dpages == NULL) {
            sim_fail(sc, KVS_ENOMEM, "allocating page lists failed");
            return;
        }
        sim_pages_take(&sc->ppool, r->ppages, np);
        sim_pages_take(&sc->dpool, r->dpages, nd);
        sc->waiting_head = (sc->waiting_head + 1) % sc->cfg.requests;
        sc->waiting_count--;
        sc->inflight++;
        r->state = SIM_REQ_ADMITTED;
        r->opened_ns = sim_engine_now_ns(sc->eng);
        r->reports_left = sc->nprefill + sc->ndecode;
        if (sim_open_rooms(sc, i) != KVS_OK)
            return;
        sc->compute[(sc->compute_head + sc->compute_count) % sc->cfg.requests] = i;
        sc->compute_count++;
        sim_compute_next(sc);
    }
}

static void sim_arrive(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_scenario_t *sc = ctx;
    sc->waiting[(sc->waiting_head + sc->waiting_count) % sc->cfg.requests] = (uint32_t)arg;
    sc->waiting_count++;
    sim_try_admit(sc);
}

/* ---- setup and teardown ------------------------------------------------------ */

static void sim_node_teardown(sim_node_t *n);

static int sim_node_setup(sim_scenario_t *sc, sim_node_t *n, uint32_t gpu_id)
{
    const kvs_layout_t *l = &sc->lay;
    const bool decode = n->role == KVS_ROLE_DECODE;
    snprintf(n->name, sizeof n->name, "%c%lld.%lld", decode ? 'd' : 'p', (long long)n->tp,
             (long long)n->pp);
    n->gpu_id = gpu_id;
    /* Its stage's layers: stages need not split evenly (spec §4). */
    kvs_layout_stage_layers(l, n->role, n->pp, &n->first_layer, &n->layers);
    n->heads = decode ? l->dst_heads : l->src_heads;
    n->layer_bytes = (uint64_t)sc->pool_pages * (uint64_t)(l->page_size * n->heads *
                                                            l->head_dim * l->elem_bytes);
    const uint64_t pool_bytes = 2 * (uint64_t)n->layers * n->layer_bytes;
    sim_gpu_config_t gc = sc->cfg.gpu;
    if (n->hbm_full)
        gc.hbm_bytes = pool_bytes; /* the KV pool fills it */
    int rc = sim_gpu_create(sc->eng, &gc, gpu_id, &n->gpu);
    if (rc == KVS_OK)
        rc = sim_nic_create(sc->net, n->name, n->gpu, &n->nic);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "creating the GPU/NIC of %s failed: %s", n->name, kvs_strerror(rc));
    sim_gpu_set_wake(n->gpu, sim_node_wake, n);
    sim_nic_set_wake(n->nic, sim_node_wake, n);
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
    if (n->k_base == NULL || n->v_base == NULL || n->pool_host == NULL)
        return sim_fail(sc, KVS_ENOMEM, "%s: KV pool tables", n->name);
    for (int64_t i = 0; i < n->layers; i++) {
        n->k_base[i] = n->pool_addr + (uint64_t)(2 * i) * n->layer_bytes;
        n->v_base[i] = n->pool_addr + (uint64_t)(2 * i + 1) * n->layer_bytes;
    }

    const bool staging = sc->cfg.staging || sc->cfg.path == KVS_PATH_STAGING;
    kvs_manager_config_t mc = {
        .role = n->role, .staging = staging, .total_heads = l->total_heads,
        .head_dim = l->head_dim, .dtype = sc->cfg.shape.dtype, .layers = n->layers,
        .model_layers = l->layers,
        .page_size = l->page_size, .tp_rank = n->tp, .tp_size = decode ? l->decode_tp : l->prefill_tp,
        .pp_rank = n->pp, .pp_size = decode ? l->decode_pp : l->prefill_pp,
        .peer_tp_size = decode ? l->prefill_tp : l->decode_tp,
        .peer_pp_size = decode ? l->prefill_pp : l->decode_pp,
        .chunk_tokens = sc->cfg.shape.chunk_tokens, .ring_bytes = sc->cfg.ring_bytes,
        .transfer_workers = sc->cfg.transfer_workers, .path = sc->cfg.path,
        .max_rooms = 2 * sc->cfg.max_inflight + 16,
        .stall_timeout_ns = sc->cfg.stall_timeout_ns,
        .trace = sc->trace != NULL ? sim_core_span : NULL, .trace_ctx = n,
        .log = {.fn = NULL, .level = KVS_LOG_ERROR}};
    kvs_error_t err = {0};
    rc = kvs_manager_create(&mc, dev, sim_nic_fabric(n->nic), &n->m, &err);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "%s: manager: %s", n->name, err.msg);
    kvs_kv_buffers_t kv = {.num_layers = n->layers, .k_base = n->k_base, .v_base = n->v_base,
                           .local_heads = n->heads, .page_size = l->page_size,
                           .num_pages = sc->pool_pages};
    if (staging && (rc = kvs_manager_init_staging(n->m)) == KVS_OK)
        rc = kvs_manager_register_staging(n->m);
    if (rc == KVS_OK)
        rc = kvs_manager_set_kv_buffers(n->m, &kv);
    if (rc == KVS_OK)
        rc = decode ? kvs_decode_create(n->m, &n->dec) : kvs_prefill_create(n->m, &n->pre);
    if (rc != KVS_OK && n->hbm_full) {
        /* The fault under test: the rank reports why and stays down; the
         * run goes on without it. */
        if (sc->ranks_down_at_start++ == 0)
            snprintf(sc->init_error, sizeof sc->init_error, "%s: %s (%s)", n->name,
                     kvs_manager_last_error(n->m)->msg, kvs_status_name(rc));
        sim_node_teardown(n);
        n->down = true;
        return KVS_OK;
    }
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "%s: %s", n->name, kvs_manager_last_error(n->m)->msg);
    sim_node_faults(sc, n);
    return KVS_OK;
}

/* Frees everything a rank holds (its counters are kept in n->acc). */
static void sim_node_teardown(sim_node_t *n)
{
    kvs_handler_stats_t st = {0};
    if (n->dec != NULL)
        kvs_decode_stats(n->dec, &st);
    else if (n->pre != NULL)
        kvs_prefill_stats(n->pre, &st);
    n->acc.rdma_writes += st.rdma_writes;
    n->acc.rdma_write_bytes += st.rdma_write_bytes;
    n->acc.msgs_sent += st.msgs_sent;
    n->acc.msgs_rejected += st.msgs_rejected;
    n->acc.watermark_waits += st.watermark_waits;
    n->acc.msgs_retransmitted += st.msgs_retransmitted;
    n->acc.msgs_duplicate += st.msgs_duplicate;
    n->acc.peers_lost += st.peers_lost;
    if (st.ring_peak_bytes > n->acc.ring_peak_bytes)
        n->acc.ring_peak_bytes = st.ring_peak_bytes;
    if (n->nic != NULL)
        n->acc_posts_refused += sim_nic_posts_refused(n->nic);
    kvs_decode_destroy(n->dec);
    kvs_prefill_destroy(n->pre);
    if (n->m != NULL)
        (void)kvs_manager_destroy(n->m);
    if (n->gpu != NULL && n->pool_addr != 0) {
        kvs_device_t *dev = sim_gpu_device(n->gpu);
        (void)dev->ops.mem_free(dev, n->pool_addr);
    }
    sim_nic_destroy(n->nic);
    sim_gpu_destroy(n->gpu);
    free(n->k_base);
    free(n->v_base);
    n->dec = NULL;
    n->pre = NULL;
    n->m = NULL;
    n->nic = NULL;
    n->gpu = NULL;
    n->pool_addr = 0;
    n->pool_host = NULL;
    n->k_base = n->v_base = NULL;
    n->wake_pending = false;
    n->timer_ns = 0;
}

/* Decode rank n connects to each prefill rank that writes to it. One that
 * is down (ENOENT: no such NIC now) is kept and retried by the handler. */
static int sim_connect_node(sim_scenario_t *sc, sim_node_t *n)
{
    const kvs_layout_t *l = &sc->lay;
    const int64_t stages = l->prefill_pp / l->decode_pp;
    const int64_t first = l->decode_pp == 1 ? 0 : n->pp;
    for (int64_t i = 0; i < l->tp_writers; i++) {
        kvs_writer_t w;
        kvs_layout_writer(l, n->tp, n->pp, i, 0, &w);
        for (int64_t s = first; s < first + stages; s++) {
            char peer[48];
            snprintf(peer, sizeof peer, "p%lld.%lld", (long long)w.prefill_rank, (long long)s);
            int rc = kvs_decode_connect(n->dec, peer, w.prefill_rank, s);
            if (rc != KVS_OK && !(rc == KVS_ENOENT && sc->nodes[s * l->prefill_tp + w.prefill_rank].down))
                return sim_fail(sc, rc, "%s: %s", n->name, kvs_manager_last_error(n->m)->msg);
        }
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

/* Groups of ranks that talk to each other: a decode and every prefill rank
 * that writes to it are one group, and groups sharing a rank merge.
 * Numbered 0.. in node order; past 64 groups, the last ones share bit 63
 * (the judge then counts across them: stricter, never laxer). */
static int sim_groups(sim_scenario_t *sc)
{
    const kvs_layout_t *l = &sc->lay;
    const int64_t nodes = sc->nprefill + sc->ndecode;
    const int64_t stages = l->prefill_pp / l->decode_pp;
    int64_t *parent = malloc((size_t)nodes * sizeof *parent);
    sc->group = malloc((size_t)nodes * sizeof *sc->group);
    if (parent == NULL || sc->group == NULL) {
        free(parent);
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    }
    for (int64_t k = 0; k < nodes; k++)
        parent[k] = k;
    for (int64_t d = 0; d < sc->ndecode; d++) {
        const sim_node_t *n = &sc->nodes[sc->nprefill + d];
        const int64_t first = l->decode_pp == 1 ? 0 : n->pp;
        for (int64_t i = 0; i < l->tp_writers; i++) {
            kvs_writer_t w;
            kvs_layout_writer(l, n->tp, n->pp, i, 0, &w);
            for (int64_t s = first; s < first + stages; s++) {
                const int64_t a = sim_group_root(parent, sc->nprefill + d);
                const int64_t b = sim_group_root(parent, s * l->prefill_tp + w.prefill_rank);
                parent[a] = b;
            }
        }
    }
    int64_t next = 0;
    for (int64_t k = 0; k < nodes; k++)
        sc->group[k] = -1;
    for (int64_t k = 0; k < nodes; k++) {
        const int64_t root = sim_group_root(parent, k);
        if (sc->group[root] < 0)
            sc->group[root] = next < 63 ? next++ : 63;
        sc->group[k] = sc->group[root];
    }
    sc->ngroups = next + 1; /* (63 when capped: indices up to 63) */
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
 * the connections die). Its result of every request it was in is in:
 * failed. A decode rank that had already received its part of a request
 * still in flight elsewhere lost that KV with its memory: the request
 * fails too. */
static void sim_node_crash(sim_scenario_t *sc, sim_node_t *n)
{
    sim_node_teardown(n);
    n->down = true;
    sc->ranks_crashed++;
    for (uint32_t i = 0; i < sc->cfg.requests && sc->fatal == KVS_OK; i++) {
        sim_req_t *r = &sc->reqs[i];
        if (r->state != SIM_REQ_ADMITTED)
            continue;
        r->untellable = true;
        if (!n->reported[i])
            sim_report_in(sc, n, i, KVS_EPEER);
        else if (n->role == KVS_ROLE_DECODE && r->status == KVS_OK)
            r->status = KVS_EPEER;
    }
}

static void sim_crash_event(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_node_t *n = ctx;
    if (!n->down)
        sim_node_crash(n->sc, n);
}

/* The rank dies (if alive) and comes back at once: a new GPU, NIC, manager
 * and handler under the same name and session id. A decode connects and
 * registers again; the decodes of a prefill reconnect on their own. */
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

static int sim_setup(sim_scenario_t *sc)
{
    const sim_scenario_config_t *c = &sc->cfg;
    kvs_error_t err = {0};
    int rc = kvs_layout_init(&sc->lay, &c->shape, &err);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "shape: %s", err.msg);
    if (c->prompt_min_tokens < 1 || c->prompt_max_tokens < c->prompt_min_tokens ||
        c->prefix_max_tokens < 0)
        return sim_fail(sc, KVS_EINVAL, "prompt tokens need 1 <= min <= max (got %lld:%lld) "
                        "and the cached prefix must be >= 0", (long long)c->prompt_min_tokens,
                        (long long)c->prompt_max_tokens);
    const int64_t ps = sc->lay.page_size;
    sc->pool_pages = (int64_t)c->max_inflight * ((c->prompt_max_tokens + ps - 1) / ps) + 1;
    if (sim_pages_init(&sc->ppool, sc->pool_pages) != KVS_OK ||
        sim_pages_init(&sc->dpool, sc->pool_pages) != KVS_OK)
        return sim_fail(sc, KVS_ENOMEM, "page pools");
    rc = sim_engine_create(c->seed, 1024, &sc->eng);
    if (rc == KVS_OK)
        rc = sim_net_create(sc->eng, &c->net, &sc->net);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "creating the engine and network failed: %s", kvs_strerror(rc));
    sc->nprefill = sc->lay.prefill_tp * sc->lay.prefill_pp;
    sc->ndecode = sc->lay.decode_tp * sc->lay.decode_pp;
    sc->nodes = calloc((size_t)(sc->nprefill + sc->ndecode), sizeof *sc->nodes);
    sc->reqs = calloc(c->requests, sizeof *sc->reqs);
    sc->waiting = calloc(c->requests, sizeof *sc->waiting);
    sc->compute = calloc(c->requests, sizeof *sc->compute);
    if (sc->nodes == NULL || sc->reqs == NULL || sc->waiting == NULL || sc->compute == NULL)
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    for (int64_t i = 0; i < sc->nprefill + sc->ndecode; i++) {
        sim_node_t *n = &sc->nodes[i];
        const bool decode = i >= sc->nprefill;
        const int64_t k = decode ? i - sc->nprefill : i;
        const int64_t tp = decode ? sc->lay.decode_tp : sc->lay.prefill_tp;
        n->sc = sc;
        n->role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
        n->tp = k % tp;
        n->pp = k / tp;
        n->reported = calloc(c->requests, 1);
        if (n->reported == NULL)
            return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    }
    if ((rc = sim_faults_check(sc)) != KVS_OK || (rc = sim_groups(sc)) != KVS_OK)
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
        r->base = pmax > 0 ? (int64_t)sim_rng_range(&prefix, 0, (uint64_t)(pmax / ps)) * ps : 0;
        r->arrival_ns = t;
        if ((rc = sim_engine_at(sc->eng, t, sim_arrive, sc, i, NULL)) != KVS_OK)
            return sim_fail(sc, rc, "scheduling arrivals failed");
        if (c->rate_milli_per_s > 0)
            t += sim_rng_exp(&arrivals, 1000000000000ull / c->rate_milli_per_s);
    }
    return KVS_OK;
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double sim_percentile_us(uint64_t *v, size_t n, unsigned pct)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t idx = (n * pct + 99) / 100;
    idx = idx == 0 ? 0 : idx - 1;
    return (double)v[idx] / 1e3;
}

static void sim_report(sim_scenario_t *sc, sim_report_t *out)
{
    memset(out, 0, sizeof *out);
    out->requests_total = sc->cfg.requests;
    out->prefill_ranks = sc->nprefill;
    out->decode_ranks = sc->ndecode;
    uint64_t *lat = calloc(sc->cfg.requests + 1, sizeof *lat);
    uint64_t *e2e = calloc(sc->cfg.requests + 1, sizeof *e2e);
    size_t nl = 0;
    for (uint32_t i = 0; i < sc->cfg.requests; i++) {
        const sim_req_t *r = &sc->reqs[i];
        if (sc->cfg.outcomes != NULL)
            sc->cfg.outcomes[i] = (sim_request_outcome_t){
                .status = r->state == SIM_REQ_DONE ? r->status : 1,
                .arrival_ns = r->arrival_ns, .opened_ns = r->opened_ns, .done_ns = r->done_ns};
        out->unreported_failures += r->unreported;
        if (r->state != SIM_REQ_DONE) {
            out->hung_requests++;
        } else if (r->status == KVS_OK) {
            out->requests_ok++;
            if (lat != NULL && e2e != NULL) {
                lat[nl] = r->done_ns - r->computed_ns;
                e2e[nl++] = r->done_ns - r->arrival_ns;
            }
        } else {
            out->requests_failed++;
        }
    }
    out->latency_p50_us = lat != NULL ? sim_percentile_us(lat, nl, 50) : 0;
    out->latency_p99_us = lat != NULL ? sim_percentile_us(lat, nl, 99) : 0;
    out->e2e_p50_us = e2e != NULL ? sim_percentile_us(e2e, nl, 50) : 0;
    out->e2e_p99_us = e2e != NULL ? sim_percentile_us(e2e, nl, 99) : 0;
    free(lat);
    free(e2e);
    out->path = KVS_PATH_AUTO;
    for (int64_t i = 0; i < sc->nprefill + sc->ndecode; i++) {
        const sim_node_t *n = &sc->nodes[i];
        kvs_handler_stats_t st = {0};
        if (n->dec != NULL)
            kvs_decode_stats(n->dec, &st);
        else if (n->pre != NULL)
            kvs_prefill_stats(n->pre, &st);
        /* with the counters of the rank's previous incarnations */
        st.rdma_write_bytes += n->acc.rdma_write_bytes;
        st.rdma_writes += n->acc.rdma_writes;
        st.msgs_sent += n->acc.msgs_sent;
        st.msgs_rejected += n->acc.msgs_rejected;
        st.watermark_waits += n->acc.watermark_waits;
        st.msgs_retransmitted += n->acc.msgs_retransmitted;
        st.msgs_duplicate += n->acc.msgs_duplicate;
        st.peers_lost += n->acc.peers_lost;
        if (n->acc.ring_peak_bytes > st.ring_peak_bytes)
            st.ring_peak_bytes = n->acc.ring_peak_bytes;
        if (n->m != NULL && out->path == KVS_PATH_AUTO)
            out->path = kvs_manager_path(n->m);
        out->bytes_moved += st.rdma_write_bytes;
        out->rdma_ops += st.rdma_writes;
        out->control_msgs += st.msgs_sent;
        out->msgs_rejected += st.msgs_rejected;
        out->watermark_waits += st.watermark_waits;
        out->msgs_retransmitted += st.msgs_retransmitted;
        out->msgs_duplicate += st.msgs_duplicate;
        out->peers_lost += st.peers_lost;
        out->posts_refused += n->acc_posts_refused +
                              (n->nic != NULL ? sim_nic_posts_refused(n->nic) : 0);
        if (st.ring_peak_bytes > out->ring_peak_bytes)
            out->ring_peak_bytes = st.ring_peak_bytes;
        kvs_ring_t *ring = n->m != NULL ? kvs_manager_ring(n->m) : NULL;
        if (ring != NULL) /* surviving ranks only: a crash takes its ring along */
            out->ring_leaked_bytes += kvs_ring_live_bytes(ring);
    }
    out->bytes_verified = sc->bytes_verified;
    out->corrupt_bytes = sc->corrupt_bytes;
    out->violations = out->hung_requests + out->ring_leaked_bytes + out->corrupt_bytes +
                      out->unreported_failures;
    out->sim_ns = sc->last_done_ns > sc->first_arrival_ns ? sc->last_done_ns - sc->first_arrival_ns : 0;
    out->goodput_gbps = out->sim_ns > 0 ? (double)out->bytes_verified * 8.0 / (double)out->sim_ns : 0;
    const uint64_t nic = sc->cfg.net.link_bytes_per_s > 0 ? sc->cfg.net.link_bytes_per_s : 50000000000ull;
    const int64_t nics = sc->nprefill < sc->ndecode ? sc->nprefill : sc->ndecode;
    out->line_rate_gbps = (double)nic * 8.0 / 1e9 * (double)nics;
    out->events = sim_engine_events_run(sc->eng);
    out->digest = sim_engine_digest(sc->eng);
    out->ranks_crashed = sc->ranks_crashed;
    out->ranks_restarted = sc->ranks_restarted;
    out->ranks_down_at_start = sc->ranks_down_at_start;
    snprintf(out->init_error, sizeof out->init_error, "%s", sc->init_error);
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
        rc = sc->fatal;
        if (rc == KVS_OK && sc->finished < sc->cfg.requests && err != NULL && err_bytes > 0)
            snprintf(err, err_bytes, "%u of %u requests never finished",
                     sc->cfg.requests - sc->finished, sc->cfg.requests);
    }
    if (sc->nodes != NULL && sc->eng != NULL)
        sim_report(sc, out);
    if (sim_trace_close(sc->trace) != KVS_OK && rc == KVS_OK) {
        rc = KVS_EINVAL;
        if (err != NULL && err_bytes > 0)
            snprintf(err, err_bytes, "writing the trace file %s failed (disk full?)",
                     sc->cfg.trace_path);
    }
    for (int64_t i = 0; sc->nodes != NULL && i < sc->nprefill + sc->ndecode; i++) {
        sim_node_teardown(&sc->nodes[i]);
        free(sc->nodes[i].reported);
    }
    for (uint32_t i = 0; sc->reqs != NULL && i < sc->cfg.requests; i++) {
        free(sc->reqs[i].ppages);
        free(sc->reqs[i].failed_ns);
        free(sc->reqs[i].dpages);
    }
    if (sc->net != NULL)
        (void)sim_net_destroy(sc->net);
    sim_engine_destroy(sc->eng);
    free(sc->nodes);
    free(sc->group);
    free(sc->reqs);
    free(sc->waiting);
    free(sc->compute);
    free(sc->ppool.free_ids);
    free(sc->dpool.free_ids);
    free(sc);
    return rc;
}
