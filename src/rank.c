/*
 * rank.c - the rank runtime (kvstage.h, "The rank runtime"): one call makes
 * a rank in the init order of spec §8 (manager, staging memory and its
 * registration, KV layers, handler), and one step drives it (progress, the
 * finished rooms, the next deadline). Every other call forwards to the
 * rank's handler, under the caller's lock when one is set.
 *
 * Deterministic like the handlers: no thread, clock or sleep here; a
 * driver for real hardware (hw/) adds those around kvs_rank_step.
 */
#include "error.h"
#include "manager.h"
#include "metrics.h"

#include <stdlib.h>

#define KVS__RANK_RESULTS 16 /* results taken per poll inside a step */

struct kvs_rank {
    kvs_manager_t *m;
    bool owns_manager;           /* made by kvs_rank_create, not the caller's */
    kvs_decode_t *dec;           /* one of the two is set */
    kvs_prefill_t *pre;
    kvs__metrics_t *metrics;     /* every result that leaves the rank */
    void (*lock)(void *ctx);
    void (*unlock)(void *ctx);
    void *lock_ctx;
};

static void kvs__rank_lock(const kvs_rank_t *r)
{
    if (r->lock != NULL)
        r->lock(r->lock_ctx);
}

static void kvs__rank_unlock(const kvs_rank_t *r)
{
    if (r->unlock != NULL)
        r->unlock(r->lock_ctx);
}

/* The heads each layer of this rank holds, from the config when not given. */
static int64_t kvs__rank_heads(const kvs_rank_config_t *cfg)
{
    const kvs_manager_config_t *c = &cfg->manager;
    if (cfg->local_heads > 0)
        return cfg->local_heads;
    if (c->kv_kind == KVS_KV_MLA || c->is_mla) /* one latent on every rank */
        return 1;
    if (c->heads_per_rank > 0)
        return c->heads_per_rank;
    if (c->total_heads > 0 && c->tp_size > 0)
        return c->total_heads >= c->tp_size ? c->total_heads / c->tp_size : 1;
    return 0;
}

/* The handler of the manager's role and the rank's metrics (one per peer
 * instance the manager can know, and "other"). */
static int kvs__rank_handler_create(kvs_rank_t *r)
{
    const kvs_manager_config_t *c = &r->m->cfg;
    int rc = c->role == KVS_ROLE_DECODE ? kvs_decode_create(r->m, &r->dec)
                                        : kvs_prefill_create(r->m, &r->pre);
    if (rc == KVS_OK && (rc = kvs__metrics_create(c->max_instances, &r->metrics)) != KVS_OK)
        KVS__MFAIL(r->m, rc, "allocating the rank's metrics (%u peer instances) failed",
                   (unsigned)c->max_instances);
    return rc;
}

int kvs_rank_create(const kvs_rank_config_t *cfg, kvs_device_t *dev, kvs_fabric_t *fab,
                    kvs_rank_t **out, kvs_error_t *err)
{
    if (out == NULL || cfg == NULL)
        return KVS__FAIL(err, KVS_EINVAL, "config and out must not be NULL");
    *out = NULL;
    kvs_rank_t *r = calloc(1, sizeof *r);
    if (r == NULL)
        return KVS__FAIL(err, KVS_ENOMEM, "allocating the rank failed");
    int rc = kvs_manager_create(&cfg->manager, dev, fab, &r->m, err);
    if (rc != KVS_OK) {
        free(r);
        return rc;
    }
    /* spec §8: staging memory -> its registration -> KV buffers -> handler. */
    const char *step = "init_staging";
    if (cfg->manager.staging && (rc = kvs_manager_init_staging(r->m)) == KVS_OK) {
        step = "register_staging";
        rc = kvs_manager_register_staging(r->m);
    }
    if (rc == KVS_OK) {
        step = "set_kv_layers";
        const kvs_kv_buffers_t more = {.state_base = cfg->state_base,
                                       .state_slots = cfg->state_slots,
                                       .draft_k_base = cfg->draft_k_base,
                                       .draft_v_base = cfg->draft_v_base};
        rc = kvs__manager_set_kv_layers(r->m, cfg->layers, cfg->manager.layers,
                                        kvs__rank_heads(cfg), &more);
    }
    r->owns_manager = true;
    if (rc == KVS_OK) {
        step = cfg->manager.role == KVS_ROLE_DECODE ? "decode_create" : "prefill_create";
        rc = kvs__rank_handler_create(r);
    }
    if (rc != KVS_OK) {
        const kvs_error_t *e = kvs_manager_last_error(r->m);
        kvs__error_set(err, rc, e->backend_code, e->file, e->line, "%s: %s", step, e->msg);
        kvs_rank_destroy(r);
        return rc;
    }
    kvs__error_clear(err);
    *out = r;
    return KVS_OK;
}

int kvs_rank_create_on(kvs_manager_t *m, kvs_rank_t **out)
{
    if (out == NULL || m == NULL)
        return m != NULL ? KVS__MFAIL(m, KVS_EINVAL, "out must not be NULL") : KVS_EINVAL;
    *out = NULL;
    kvs_rank_t *r = calloc(1, sizeof *r);
    if (r == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the rank failed");
    r->m = m;
    const int rc = kvs__rank_handler_create(r);
    if (rc != KVS_OK) {
        kvs_rank_destroy(r); /* not the manager: the caller's */
        return rc;
    }
    *out = r;
    return KVS_OK;
}

void kvs_rank_destroy(kvs_rank_t *r)
{
    if (r == NULL)
        return;
    kvs_decode_destroy(r->dec);
    kvs_prefill_destroy(r->pre);
    kvs__metrics_destroy(r->metrics);
    if (r->owns_manager)
        (void)kvs_manager_destroy(r->m); /* its handler is gone: cannot be busy */
    free(r);
}

kvs_role_t kvs_rank_role(const kvs_rank_t *r)
{
    return r->dec != NULL ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
}

kvs_manager_t *kvs_rank_manager(kvs_rank_t *r) { return r != NULL ? r->m : NULL; }
kvs_decode_t *kvs_rank_decode(kvs_rank_t *r) { return r != NULL ? r->dec : NULL; }
kvs_prefill_t *kvs_rank_prefill(kvs_rank_t *r) { return r != NULL ? r->pre : NULL; }

const kvs_error_t *kvs_rank_last_error(const kvs_rank_t *r)
{
    return r != NULL ? kvs_manager_last_error(r->m) : NULL;
}

void kvs_rank_set_lock(kvs_rank_t *r, void (*lock)(void *ctx), void (*unlock)(void *ctx),
                       void *ctx)
{
    if (r == NULL)
        return;
    r->lock = lock;
    r->unlock = unlock;
    r->lock_ctx = ctx;
}

/* A call only one role makes, on a rank of the other. */
static int kvs__rank_wrong_role(kvs_rank_t *r, const char *what, const char *role)
{
    return KVS__FAIL(&r->m->err, KVS_ESTATE, "%s is for %s ranks: this rank is a %s", what, role,
                     r->dec != NULL ? "decode" : "prefill");
}

int kvs_rank_add_instance(kvs_rank_t *r, const kvs_instance_desc_t *desc)
{
    if (r == NULL)
        return KVS_EINVAL;
    if (r->dec == NULL)
        return kvs__rank_wrong_role(r, "add_instance", "decode");
    kvs__rank_lock(r);
    const int rc = kvs_decode_add_instance(r->dec, desc);
    kvs__rank_unlock(r);
    return rc;
}

int kvs_rank_connect(kvs_rank_t *r, kvs_peer_t peer)
{
    if (r == NULL)
        return KVS_EINVAL;
    if (r->dec == NULL)
        return kvs__rank_wrong_role(r, "connect", "decode");
    kvs__rank_lock(r);
    const int rc = kvs_decode_connect_peer(r->dec, peer);
    kvs__rank_unlock(r);
    return rc;
}

int kvs_rank_open_room(kvs_rank_t *r, const kvs_room_desc_t *room)
{
    if (r == NULL || room == NULL)
        return KVS_EINVAL;
    if (r->pre != NULL && room->base_tokens != 0)
        return KVS__FAIL(&r->m->err, KVS_EINVAL, "room %llu: a prefill rank holds the whole "
                         "request: base_tokens must be 0 (got %lld)",
                         (unsigned long long)room->room, (long long)room->base_tokens);
    if (r->dec != NULL && (room->aux != NULL || room->aux_bytes != 0))
        return KVS__FAIL(&r->m->err, KVS_EINVAL, "room %llu: a decode rank gives no aux "
                         "payload (it arrives with the room's result): leave aux NULL",
                         (unsigned long long)room->room);
    const bool state = r->m->state_base != NULL;
    if (state && (room->state_slot < 0 || room->state_slot >= r->m->kv.state_slots))
        return KVS__FAIL(&r->m->err, KVS_ERANGE, "room %llu: state slot %lld outside the "
                         "%lld slots of the state buffers (state_slots)",
                         (unsigned long long)room->room, (long long)room->state_slot,
                         (long long)r->m->kv.state_slots);
    kvs__rank_lock(r);
    /* Checked before the room opens, so a refused payload opens nothing. */
    int rc = KVS_OK;
    if (room->aux_bytes > r->m->cfg.max_aux_bytes || (room->aux == NULL && room->aux_bytes > 0))
        rc = kvs_prefill_room_set_aux(r->pre, room->room, room->aux, room->aux_bytes);
    else
        rc = r->dec != NULL ? kvs_decode_room_open_peer(r->dec, room->room, room->peer,
                                                        room->base_tokens, room->total_tokens,
                                                        room->pages, room->num_pages)
                            : kvs_prefill_room_open_peer(r->pre, room->room, room->peer,
                                                         room->total_tokens, room->pages,
                                                         room->num_pages);
    if (rc == KVS_OK && state) /* in range: checked above */
        rc = r->dec != NULL ? kvs_decode_room_set_state_slot(r->dec, room->room, room->state_slot)
                            : kvs_prefill_room_set_state_slot(r->pre, room->room,
                                                              room->state_slot);
    if (rc == KVS_OK && r->pre != NULL && room->aux_bytes > 0) {
        rc = kvs_prefill_room_set_aux(r->pre, room->room, room->aux, room->aux_bytes);
        if (rc != KVS_OK) { /* no memory for it: the room goes too */
            const kvs_error_t why = r->m->err;
            (void)kvs_prefill_room_abort(r->pre, room->room);
            r->m->err = why;
        }
    }
    kvs__rank_unlock(r);
    return rc;
}

int kvs_rank_set_aux(kvs_rank_t *r, uint64_t room, const void *aux, uint32_t bytes)
{
    if (r == NULL)
        return KVS_EINVAL;
    if (r->pre == NULL)
        return kvs__rank_wrong_role(r, "set_aux", "prefill");
    kvs__rank_lock(r);
    const int rc = kvs_prefill_room_set_aux(r->pre, room, aux, bytes);
    kvs__rank_unlock(r);
    return rc;
}

int kvs_rank_computed(kvs_rank_t *r, uint64_t room, int64_t end_tokens, bool final)
{
    if (r == NULL)
        return KVS_EINVAL;
    if (r->pre == NULL)
        return kvs__rank_wrong_role(r, "computed", "prefill");
    kvs__rank_lock(r);
    const int rc = kvs_prefill_room_computed(r->pre, room, end_tokens, final);
    kvs__rank_unlock(r);
    return rc;
}

int kvs_rank_room_state(const kvs_rank_t *r, uint64_t room, kvs_room_state_t *out)
{
    if (r == NULL)
        return KVS_EINVAL;
    kvs__rank_lock(r);
    const int rc = r->dec != NULL ? kvs_decode_room_state(r->dec, room, out)
                                  : kvs_prefill_room_state(r->pre, room, out);
    kvs__rank_unlock(r);
    return rc;
}

int kvs_rank_abort(kvs_rank_t *r, uint64_t room)
{
    if (r == NULL)
        return KVS_EINVAL;
    kvs__rank_lock(r);
    const int rc = r->dec != NULL ? kvs_decode_room_abort(r->dec, room)
                                  : kvs_prefill_room_abort(r->pre, room);
    kvs__rank_unlock(r);
    return rc;
}

int kvs_rank_instance_lost(kvs_rank_t *r, kvs_peer_t peer)
{
    if (r == NULL)
        return KVS_EINVAL;
    kvs__rank_lock(r);
    const int rc = r->dec != NULL ? kvs_decode_instance_lost(r->dec, peer)
                                  : kvs_prefill_instance_lost(r->pre, peer);
    kvs__rank_unlock(r);
    return rc;
}

/* Unlocked: the callers hold the lock. */
static int kvs__rank_progress(kvs_rank_t *r)
{
    return r->dec != NULL ? kvs_decode_progress(r->dec) : kvs_prefill_progress(r->pre);
}

/* Every result leaves the rank here: the metrics count it. */
static int kvs__rank_poll(kvs_rank_t *r, kvs_room_result_t *out, int max)
{
    const int got = r->dec != NULL ? kvs_decode_poll_rooms(r->dec, out, max)
                                   : kvs_prefill_poll_rooms(r->pre, out, max);
    for (int i = 0; i < got; i++)
        kvs__metrics_observe(r->metrics, &out[i]);
    return got;
}

static uint64_t kvs__rank_deadline(const kvs_rank_t *r)
{
    return r->dec != NULL ? kvs_decode_next_deadline_ns(r->dec)
                          : kvs_prefill_next_deadline_ns(r->pre);
}

int kvs_rank_step(kvs_rank_t *r, void (*on_result)(void *ctx, const kvs_room_result_t *res),
                  void *ctx, uint64_t *next_ns)
{
    if (r == NULL)
        return KVS_EINVAL;
    kvs__rank_lock(r);
    const int work = kvs__rank_progress(r);
    kvs__rank_unlock(r);
    /* Results go to on_result outside the lock, so it may call the rank. */
    kvs_room_result_t res[KVS__RANK_RESULTS];
    for (int got = KVS__RANK_RESULTS; on_result != NULL && got == KVS__RANK_RESULTS;) {
        kvs__rank_lock(r);
        got = kvs__rank_poll(r, res, KVS__RANK_RESULTS);
        kvs__rank_unlock(r);
        for (int i = 0; i < got; i++)
            on_result(ctx, &res[i]);
    }
    if (next_ns != NULL) {
        kvs__rank_lock(r);
        *next_ns = kvs__rank_deadline(r);
        kvs__rank_unlock(r);
    }
    return work;
}

int kvs_rank_poll(kvs_rank_t *r, kvs_room_result_t *out, int max)
{
    if (r == NULL)
        return KVS_EINVAL;
    kvs__rank_lock(r);
    const int got = kvs__rank_poll(r, out, max);
    kvs__rank_unlock(r);
    return got;
}

uint64_t kvs_rank_next_deadline_ns(const kvs_rank_t *r)
{
    if (r == NULL)
        return UINT64_MAX;
    kvs__rank_lock(r);
    const uint64_t t = kvs__rank_deadline(r);
    kvs__rank_unlock(r);
    return t;
}

void kvs_rank_stats(const kvs_rank_t *r, kvs_handler_stats_t *out)
{
    if (r == NULL || out == NULL)
        return;
    kvs__rank_lock(r);
    if (r->dec != NULL)
        kvs_decode_stats(r->dec, out);
    else
        kvs_prefill_stats(r->pre, out);
    kvs__rank_unlock(r);
}

int kvs_rank_metrics(kvs_rank_t *const *ranks, size_t n, char *buf, size_t cap,
                     size_t *len_out)
{
    if ((ranks == NULL && n > 0) || (buf == NULL && cap > 0) || len_out == NULL)
        return KVS_EINVAL;
    enum { KVS__METRICS_RANKS_MAX = 4096 };
    if (n > KVS__METRICS_RANKS_MAX)
        return KVS_ERANGE;
    kvs__metrics_rank_t *view = calloc(n > 0 ? n : 1, sizeof *view);
    if (view == NULL)
        return KVS_ENOMEM;
    int rc = KVS_OK;
    kvs__metrics_t **snap = calloc(n > 0 ? n : 1, sizeof *snap);
    if (snap == NULL)
        rc = KVS_ENOMEM;
    for (size_t i = 0; i < n && rc == KVS_OK; i++) {
        const kvs_rank_t *r = ranks[i];
        if (r == NULL) {
            rc = KVS_EINVAL;
            break;
        }
        if ((rc = kvs__metrics_create_like(r->metrics, &snap[i])) != KVS_OK)
            break;
        const kvs_manager_config_t *c = &r->m->cfg;
        kvs__metrics_rank_t *v = &view[i];
        *v = (kvs__metrics_rank_t){.m = snap[i], .role = c->role, .instance = c->instance_id,
                                   .dp_rank = c->dp_rank, .tp_rank = c->tp_rank,
                                   .pp_rank = c->pp_rank, .cp_size = c->context_parallel,
                                   .cp_rank = c->cp_rank};
        kvs__rank_lock(r);
        kvs__metrics_copy(snap[i], r->metrics);
        if (r->dec != NULL) {
            kvs_decode_stats(r->dec, &v->stats);
            kvs__decode_room_counts(r->dec, v->rooms);
        } else {
            kvs_prefill_stats(r->pre, &v->stats);
            kvs__prefill_room_counts(r->pre, v->rooms);
        }
        v->ring_bytes = r->m->ring != NULL ? kvs_ring_size_bytes(r->m->ring) : 0;
        kvs__rank_unlock(r);
    }
    /* Each rank's numbers are one snapshot, taken under its lock; the text
     * is made outside every lock. */
    if (rc == KVS_OK)
        rc = kvs__metrics_render(view, n, buf, cap, len_out);
    for (size_t i = 0; snap != NULL && i < n; i++)
        kvs__metrics_destroy(snap[i]);
    free(snap);
    free(view);
    return rc;
}

int64_t kvs_rank_peers_ready(const kvs_rank_t *r)
{
    if (r == NULL || r->dec == NULL)
        return 0;
    kvs__rank_lock(r);
    const int64_t n = kvs_decode_peers_ready(r->dec);
    kvs__rank_unlock(r);
    return n;
}
