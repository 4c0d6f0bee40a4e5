/*
 * handler.c - the base of the decode and prefill handlers (see handler.h):
 * rooms and their stall timers, peers and their connections, sending and
 * dispatching control messages, the progress loop, results and stats.
 *
 * Invariants: a room is in the table and in the open-order list, or in
 * neither; a peer with a connection has its link bound to it, so a message
 * is matched to its peer by connection; a message other than the role's
 * registration reaches the role only from a ready peer whose session its
 * header names. Nothing here allocates after init except the links'
 * queues (bounded, link.h).
 */
#include "handler.h"

#include "arith.h"
#include "error.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kvs__peer_name(const kvs__peer_t *peer, char *buf, size_t bytes)
{
    const kvs__inst_t *inst = peer->inst;
    if (inst->ref.dp_rank != 0)
        snprintf(buf, bytes, "instance %llu group %lld rank tp %lld pp %lld",
                 (unsigned long long)inst->ref.instance, (long long)inst->ref.dp_rank,
                 (long long)peer->tp_rank, (long long)peer->pp_rank);
    else
        snprintf(buf, bytes, "instance %llu rank tp %lld pp %lld",
                 (unsigned long long)inst->ref.instance, (long long)peer->tp_rank,
                 (long long)peer->pp_rank);
    return buf;
}

static int kvs__handler_init(kvs__handler_t *h, const kvs__role_t *role, kvs_manager_t *m)
{
    const kvs_manager_config_t *c = &m->cfg;
    h->role = role;
    h->m = m;
    h->fab = m->fab;
    h->dev = m->dev;
    h->session = c->session_id;
    h->tp_rank = c->tp_rank;
    h->pp_rank = c->pp_rank;
    h->next_check_ns = UINT64_MAX;
    h->cq = calloc(KVS__POLL_BATCH, sizeof *h->cq);
    /* A room holds a handful of blocks (its own, flows, chunks, pages, aux):
     * keep those of the rooms a busy handler has open at once, up to 64. */
    const uint32_t keep = 8u * (c->max_rooms < 64 ? c->max_rooms : 64u);
    if (h->cq == NULL || kvs__table_init(&h->rooms, c->max_rooms) != KVS_OK ||
        kvs__blocks_init(&h->blocks, keep) != KVS_OK ||
        kvs__results_init(&h->results, 2 * c->max_rooms) != KVS_OK ||
        kvs__insts_init(&h->insts, c->max_instances) != KVS_OK ||
        /* a link per peer rank, and as many again for connections of peers
         * that restarted or were refused */
        kvs__links_init(&h->links, h->fab, 2 * c->max_peers + 16, h->session,
                        m->rto_floor_ns, c->stall_timeout_ns / 32, c->stall_timeout_ns,
                        &h->stats) != KVS_OK)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the %s handler's tables failed",
                          role->role == KVS_ROLE_DECODE ? "decode" : "prefill");
    if (role->accepts && m->secret.len_bytes > 0 &&
        kvs__handshake_init(&h->hs, h->links.cap) != KVS_OK)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the prefill's challenge table failed");
    /* What the default pair needs is made now; a later pair on another path
     * makes what it needs when it appears. */
    return kvs__handler_prepare_path(h, m->path);
}

static void kvs__handler_fini(kvs__handler_t *h)
{
    /* Every part is zeroed until made, and each fini takes a zeroed one. */
    while (h->first != NULL) {
        kvs__room_t *r = h->first;
        h->first = r->next;
        kvs__blocks_put(&h->blocks, r->aux);
        h->role->room_free(h, r, true);
    }
    h->last = NULL;
    kvs__table_fini(&h->rooms);
    kvs__manager_close_kv(h->m, &h->kv_keys);
    h->kv_open = false;
    kvs__links_fini(&h->links);
    kvs__handshake_fini(&h->hs);
    for (uint32_t i = 0; i < h->insts.count; i++) {
        kvs__inst_t *inst = h->insts.v[i];
        for (int64_t k = 0; k < inst->npeers; k++)
            if (inst->peers[k].conn != NULL)
                h->fab->ops.disconnect(h->fab, inst->peers[k].conn);
    }
    kvs__insts_fini(&h->insts);
    if (h->stream != NULL)
        kvs__dev_stream_destroy(h->dev, h->stream);
    h->stream = NULL;
    kvs__results_fini(&h->results, &h->blocks);
    kvs__blocks_fini(&h->blocks);
    free(h->cq);
    h->cq = NULL;
}

int kvs__handler_create(kvs_manager_t *m, const kvs__role_t *role, size_t bytes, void **out)
{
    if (out == NULL)
        return m != NULL ? KVS__MFAIL(m, KVS_EINVAL, "out must not be NULL") : KVS_EINVAL;
    *out = NULL;
    int rc;
    kvs__handler_t *h = kvs__manager_handler_new(m, role->role, bytes, &rc);
    if (h == NULL)
        return rc;
    rc = kvs__handler_init(h, role, m);
    if (rc == KVS_OK)
        rc = role->role_init(h);
    if (rc != KVS_OK) {
        kvs__handler_destroy(h);
        return rc;
    }
    *out = h;
    return KVS_OK;
}

void kvs__handler_destroy(kvs__handler_t *h)
{
    kvs_manager_t *m = h->m;
    kvs__handler_fini(h); /* rooms first: they name the role's state */
    h->role->role_fini(h);
    m->handler = NULL;
    free(h);
}

kvs__inst_t *kvs__inst_get(kvs__handler_t *h, kvs_peer_t ref)
{
    kvs__inst_t *inst = kvs__inst_find(h, ref);
    if (inst != NULL)
        return inst;
    kvs_manager_t *m = h->m;
    inst = kvs__insts_add(&h->insts, m, ref);
    if (inst == NULL || ref.instance != 0 || ref.dp_rank != 0)
        return inst;
    const bool decode = h->role->role == KVS_ROLE_DECODE;
    const int64_t tp = m->cfg.peer_tp_size > 0 ? m->cfg.peer_tp_size
                       : decode                ? m->cfg.tp_size
                                               : 0;
    if (tp > 0 && (kvs__inst_set_geometry(inst, m, tp, m->cfg.peer_pp_size,
                                                m->cfg.context_parallel, true) != KVS_OK ||
                   kvs__handler_prepare_path(h, inst->path) != KVS_OK)) {
        kvs__insts_pop(&h->insts);
        return NULL;
    }
    return inst;
}

int kvs__handler_prepare_path(kvs__handler_t *h, kvs_path_t path)
{
    if (path == KVS_PATH_STAGING && h->stream == NULL) {
        int rc = kvs__dev_stream_create(h->dev, &h->stream);
        if (rc != KVS_OK)
            return KVS__MFAIL(h->m, rc, "device '%s' could not create the %s stream (%s)",
                              h->dev->name,
                              h->role->role == KVS_ROLE_DECODE ? "scatter" : "gather",
                              kvs_strerror(rc));
    }
    if (path != KVS_PATH_STAGING && !h->kv_open) {
        int rc = kvs__manager_open_kv(h->m, &h->kv_keys);
        if (rc != KVS_OK)
            return rc;
        h->kv_open = true;
    }
    return KVS_OK;
}

/* ---- rooms -------------------------------------------------------------------- */

void kvs__room_touch(kvs__handler_t *h, kvs__room_t *r)
{
    r->last_ns = kvs__now(h);
    const uint64_t due = kvs__sat_add_u64(r->last_ns, h->m->cfg.stall_timeout_ns);
    if (due < h->next_check_ns)
        h->next_check_ns = due;
}

int kvs__room_add(kvs__handler_t *h, kvs__room_t *r, uint64_t id, kvs__inst_t *inst)
{
    int rc = kvs__table_put(&h->rooms, id, r);
    if (rc != KVS_OK)
        return rc;
    r->id = id;
    r->inst = inst;
    r->prev = h->last;
    r->next = NULL;
    if (h->last != NULL)
        h->last->next = r;
    else
        h->first = r;
    h->last = r;
    inst->rooms++;
    r->open_ns = kvs__now(h);
    kvs__room_touch(h, r);
    return KVS_OK;
}

void kvs__room_fail(kvs__handler_t *h, kvs__room_t *r, int status, const kvs__peer_t *from)
{
    kvs__room_fail_told(h, r, status, from, from);
}

void kvs__room_fail_told(kvs__handler_t *h, kvs__room_t *r, int status, const kvs__peer_t *from,
                         const kvs__peer_t *teller)
{
    if (r->status != KVS_OK)
        return;
    /* The reason, from what the room was doing when it failed. */
    const kvs_room_state_t was = h->role->room_state(h, r);
    char who[96] = "", quiet[48] = "";
    if (teller != NULL)
        kvs__peer_name(teller, who, sizeof who);
    if (status == KVS_ETIMEDOUT)
        snprintf(quiet, sizeof quiet, " with no progress for %llu ms",
                 (unsigned long long)((kvs__now(h) - r->last_ns) / 1000000u));
    if (snprintf(r->reason, sizeof r->reason, "%s while %s%s%s%s", kvs_status_name(status),
                 kvs_room_state_name(was), quiet, teller != NULL ? "; reported by " : "",
                 who) >= (int)sizeof r->reason)
        memcpy(r->reason + sizeof r->reason - 4, "...", 4);
    r->status = status;
    h->role->on_fail(h, r, from);
    kvs_log_write(&h->m->log, KVS_LOG_INFO, "%s %lld: room %llu failed: %s: %s",
             h->role->role == KVS_ROLE_DECODE ? "decode" : "prefill", (long long)h->tp_rank,
             (unsigned long long)r->id, r->reason, kvs_strerror(status));
}

static void kvs__room_unlink(kvs__handler_t *h, kvs__room_t *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        h->first = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    else
        h->last = r->prev;
    kvs__table_del(&h->rooms, r->id);
    r->inst->rooms--;
}

void kvs__room_end(kvs__handler_t *h, kvs__room_t *r, int64_t chunks)
{
    kvs_room_result_t res = {.room = r->id, .status = r->status, .chunks = chunks,
                             .bytes = r->bytes, .rdma_writes = r->writes,
                             .open_ns = r->open_ns, .done_ns = kvs__now(h)};
    if (r->inst != NULL)
        res.peer = r->inst->ref;
    if (r->status != KVS_OK)
        memcpy(res.reason, r->reason, sizeof res.reason);
    kvs__results_push(&h->results, &res, &r->aux, r->status == KVS_OK ? r->aux_got : 0);
    if (r->status == KVS_OK)
        h->stats.rooms_ok++;
    else
        h->stats.rooms_failed++;
    kvs__room_unlink(h, r);
    kvs__blocks_put(&h->blocks, r->aux);
    h->role->room_free(h, r, false);
}

int kvs__room_set_state_slot(kvs__handler_t *h, uint64_t id, int64_t slot)
{
    kvs_manager_t *m = h->m;
    kvs__room_t *r = kvs__room_get(h, id);
    if (m->state_base == NULL)
        return KVS__MFAIL(m, KVS_EINVAL, "room %llu: a state slot on a manager without state "
                          "layers: set config.full_attn_every and other_layers state, or "
                          "give none", (unsigned long long)id);
    if (r == NULL)
        return KVS__MFAIL(m, KVS_ENOENT, "room %llu is not open on this rank",
                          (unsigned long long)id);
    if (slot < 0 || slot >= m->kv.state_slots)
        return KVS__MFAIL(m, KVS_ERANGE, "room %llu: state slot %lld outside the %lld slots "
                          "of the state buffers (kv buffers' state_slots)",
                          (unsigned long long)id, (long long)slot,
                          (long long)m->kv.state_slots);
    r->state_slot = slot;
    r->has_state_slot = true;
    return KVS_OK;
}

void kvs__room_drop(kvs__handler_t *h, kvs__room_t *r)
{
    kvs__room_unlink(h, r);
    kvs__blocks_put(&h->blocks, r->aux);
    h->role->room_free(h, r, false);
}

void kvs__room_reject(kvs__handler_t *h, uint64_t id, kvs_peer_t peer, int status)
{
    const uint64_t now = kvs__now(h);
    kvs_room_result_t res = {.room = id, .status = status, .open_ns = now, .done_ns = now,
                             .peer = peer};
    /* Refused at open: the refusal's own words, when they are about it. */
    const kvs_error_t *e = &h->m->err;
    if (snprintf(res.reason, sizeof res.reason, "%s at open: %s", kvs_status_name(status),
                 e->status == status ? e->msg : kvs_strerror(status)) >= (int)sizeof res.reason)
        memcpy(res.reason + sizeof res.reason - 4, "...", 4); /* cut: whole in the log */
    kvs__results_push(&h->results, &res, NULL, 0);
    h->stats.rooms_failed++;
}

/* Rooms past their stall deadline (spec §9: no request waits forever). The
 * first expiry fails the room with KVS_ETIMEDOUT and tells the peers; a
 * failed room that stalls again is the role's (on_stalled): it stops
 * waiting for what can no longer come. */
static void kvs__expire(kvs__handler_t *h)
{
    const uint64_t now = kvs__now(h), timeout = h->m->cfg.stall_timeout_ns;
    if (now < h->next_check_ns)
        return;
    uint64_t next = UINT64_MAX;
    for (kvs__room_t *r = h->first, *after; r != NULL; r = after) {
        after = r->next;
        if (now >= kvs__sat_add_u64(r->last_ns, timeout)) {
            if (r->status == KVS_OK)
                kvs__room_fail(h, r, KVS_ETIMEDOUT, NULL);
            else if (h->role->on_stalled(h, r))
                continue; /* gone */
            r->last_ns = now;
        }
        if (kvs__sat_add_u64(r->last_ns, timeout) < next)
            next = kvs__sat_add_u64(r->last_ns, timeout);
    }
    h->next_check_ns = next;
}

int kvs__handler_poll_rooms(kvs__handler_t *h, kvs_room_result_t *out, int max)
{
    if (out == NULL || max < 0)
        return KVS_EINVAL;
    return kvs__results_pop(&h->results, out, max);
}

/* ---- peers ---------------------------------------------------------------------- */

void kvs__send(kvs__handler_t *h, kvs__peer_t *peer, const kvs_msg_t *msg)
{
    if (peer->conn == NULL)
        return;
    int rc = kvs__link_send(&h->links, peer->conn, msg);
    if (rc != KVS_OK && rc != KVS_EPEER) {
        char name[96];
        kvs_log_write(&h->m->log, KVS_LOG_WARN, "%s %lld: sending %s to %s failed: %s",
                 h->role->role == KVS_ROLE_DECODE ? "decode" : "prefill", (long long)h->tp_rank,
                 kvs__wire_type_name(msg->type), kvs__peer_name(peer, name, sizeof name),
                 kvs_strerror(rc));
    }
}

void kvs__peer_bind(kvs__handler_t *h, kvs__peer_t *peer, kvs_conn_t *conn)
{
    peer->conn = conn;
    /* No slot (a table of 2 * max_peers + 16 links is full): its messages
     * are then refused as from a stranger, and its sends fail and say so. */
    if (kvs__link_bind(&h->links, conn, peer) != KVS_OK)
        kvs_log_write(&h->m->log, KVS_LOG_ERROR, "no control link is free for a peer "
                 "connection: raise max_peers");
}

void kvs__peer_drop(kvs__handler_t *h, kvs__peer_t *peer)
{
    if (peer->conn == NULL)
        return;
    kvs__link_forget(&h->links, peer->conn);
    h->fab->ops.disconnect(h->fab, peer->conn);
    peer->conn = NULL;
}

/* Lost, with the next try after its wait (doubling while it stays away). */
static void kvs__peer_schedule_reconnect(kvs__handler_t *h, kvs__peer_t *peer)
{
    const uint64_t cap = h->links.rto_max_ns;
    peer->reconnect_wait_ns = !peer->lost || peer->reconnect_wait_ns == 0
                                  ? h->m->cfg.retry_timeout_ns
                                  : kvs__double_capped(peer->reconnect_wait_ns, cap);
    peer->lost = true;
    peer->reconnect_ns = kvs__sat_add_u64(kvs__now(h), peer->reconnect_wait_ns);
}

int kvs__peer_connect(kvs__handler_t *h, kvs__peer_t *peer)
{
    kvs_conn_t *conn = NULL;
    peer->parked = false; /* tried now: retried on the timer if it fails */
    int rc = h->fab->ops.connect(h->fab, peer->name, &conn);
    if (rc != KVS_OK) {
        kvs__peer_schedule_reconnect(h, peer);
        return rc;
    }
    /* A fabric keeps one connection per address: one that is another
     * peer's already means two declared ranks share an address. Binding it
     * would hand that peer's messages to this one. */
    const kvs__peer_t *other = kvs__link_owner(&h->links, conn);
    if (other != NULL && other != peer) {
        char mine[96], theirs[96];
        peer->refused = KVS_EINVAL;
        return KVS__MFAIL(h->m, KVS_EINVAL, "%s: its address '%s' is already that of %s: give "
                          "every rank of every instance its own address",
                          kvs__peer_name(peer, mine, sizeof mine), peer->name,
                          kvs__peer_name(other, theirs, sizeof theirs));
    }
    /* A lost peer stays lost until it acknowledges the registration that
     * follows: rooms naming it fail at once meanwhile. */
    kvs__peer_bind(h, peer, conn);
    return KVS_OK;
}

/* The fabric found conn dead. If a peer owned it, that peer crashed or
 * restarted: it is lost (the decode reconnects to it), and the role fails
 * what depended on it. */
static void kvs__on_dead(void *ctx, kvs_conn_t *conn, void *owner, const char *why)
{
    kvs__handler_t *h = ctx;
    h->fab->ops.disconnect(h->fab, conn); /* the peer hears of it too */
    kvs__handshake_forget(&h->hs, conn);
    kvs__peer_t *peer = owner;
    if (peer == NULL || peer->conn != conn)
        return; /* a refused or replaced connection */
    peer->conn = NULL;
    peer->ready = false;
    char name[96];
    kvs_log_write(&h->m->log, KVS_LOG_WARN, "%s %lld: %s %s is unreachable (its connection died: "
             "%s): its rooms fail%s",
             h->role->role == KVS_ROLE_DECODE ? "decode" : "prefill", (long long)h->tp_rank,
             h->role->role == KVS_ROLE_DECODE ? "prefill" : "decode",
             kvs__peer_name(peer, name, sizeof name), why,
             peer->name != NULL ? ", reconnecting" : " until it registers again");
    if (peer->name != NULL)
        kvs__peer_schedule_reconnect(h, peer);
    else
        peer->lost = true;
    h->role->on_peer_lost(h, peer);
}

int kvs__handler_instance_lost(kvs__handler_t *h, kvs_peer_t ref)
{
    kvs__inst_t *inst = kvs__insts_find(&h->insts, ref);
    const char *other = h->role->role == KVS_ROLE_DECODE ? "prefill" : "decode";
    if (inst == NULL)
        return KVS__MFAIL(h->m, KVS_ENOENT, "%s instance %llu group %lld is not known to this "
                          "rank: nothing to fail", other, (unsigned long long)ref.instance,
                          (long long)ref.dp_rank);
    kvs_log_write(&h->m->log, KVS_LOG_WARN, "%s %lld: %s instance %llu group %lld is gone, as "
                  "its application said (a discovery lease lapsed): its rooms fail%s",
                  h->role->role == KVS_ROLE_DECODE ? "decode" : "prefill", (long long)h->tp_rank,
                  other, (unsigned long long)ref.instance, (long long)ref.dp_rank,
                  h->role->role == KVS_ROLE_DECODE ? ", reconnecting on the next room" : "");
    /* The rooms fail first, as they stand (their reasons say so), then the
     * connections go. */
    for (int64_t i = 0; i < inst->npeers; i++)
        h->role->on_peer_lost(h, &inst->peers[i]);
    for (int64_t i = 0; i < inst->npeers; i++) {
        kvs__peer_t *peer = &inst->peers[i];
        if (peer->conn != NULL) {
            kvs__handshake_forget(&h->hs, peer->conn);
            kvs__peer_drop(h, peer); /* the peer hears of it too */
        }
        peer->ready = false;
        peer->lost = true;
        /* The decode connects again when a room names the instance, never
         * on its own timer: the instance is gone, and a connect to a
         * process that is stopped rather than dead blocks until the
         * fabric's connect_timeout_ms. */
        peer->parked = peer->name != NULL;
        peer->reconnect_ns = 0;
    }
    return KVS_OK;
}

/* Lost peers with an address whose wait is over: connect again; the role
 * hears of it as of a new connection (it registers). */
static void kvs__reconnect(kvs__handler_t *h)
{
    const uint64_t now = kvs__now(h);
    for (uint32_t i = 0; i < h->insts.count; i++) {
        kvs__inst_t *inst = h->insts.v[i];
        for (int64_t k = 0; k < inst->npeers; k++) {
            kvs__peer_t *p = &inst->peers[k];
            if (!p->lost || p->parked || p->conn != NULL || p->name == NULL ||
                now < p->reconnect_ns)
                continue;
            if (kvs__peer_connect(h, p) == KVS_OK) {
                char name[96];
                kvs_log_write(&h->m->log, KVS_LOG_INFO, "decode %lld: reconnected to prefill %s "
                         "at '%s'", (long long)h->tp_rank,
                         kvs__peer_name(p, name, sizeof name), p->name);
                h->role->on_connected(h, p);
            }
        }
    }
}

/* ---- the loop ------------------------------------------------------------------- */

static void kvs__on_recv(kvs__handler_t *h, const kvs_completion_t *cqe)
{
    kvs__peer_t *peer = kvs__link_owner(&h->links, cqe->conn);
    if (peer == NULL && !h->role->accepts) {
        h->stats.msgs_rejected++; /* a stranger's: not even acknowledged */
        return;
    }
    kvs_msg_t msg;
    const int got = kvs__link_recv(&h->links, cqe, &msg);
    if (got < 0)
        h->stats.msgs_rejected++;
    if (got <= 0)
        return; /* rejected, or taken by the link (an ACK, a duplicate) */
    h->stats.msgs_received++;
    const kvs_msg_type_t binding = h->role->role == KVS_ROLE_DECODE ? KVS_MSG_REGISTER_ACK
                                                                   : KVS_MSG_REGISTER;
    /* Authenticated registration (handshake.h) opens a connection. */
    if (msg.type == KVS_MSG_HELLO && h->role->accepts) {
        kvs__handshake_on_hello(h, cqe->conn, &msg);
        return;
    }
    if (msg.type == KVS_MSG_CHALLENGE && h->role->on_challenge != NULL) {
        h->role->on_challenge(h, cqe->conn, peer, &msg);
        return;
    }
    if (msg.type == binding) {
        h->role->on_register(h, cqe->conn, peer, &msg);
        return;
    }
    /* Everything else comes from an accepted session of a bound peer. */
    if (peer == NULL || !peer->ready || msg.session != peer->session) {
        h->stats.msgs_rejected++;
        return;
    }
    h->role->on_message(h, peer, &msg);
}

int kvs__handler_progress(kvs__handler_t *h)
{
    int work = 0;
    for (;;) {
        int n = h->fab->ops.poll(h->fab, h->cq, KVS__POLL_BATCH);
        if (n < 0)
            return KVS__MFAIL(h->m, n, "polling fabric '%s' failed: %s", h->fab->name,
                              h->fab->last_backend_msg[0] ? h->fab->last_backend_msg
                                                          : kvs_strerror(n));
        for (int i = 0; i < n; i++) {
            const kvs_completion_t *cqe = &h->cq[i];
            if (cqe->kind == KVS_COMPLETION_RECV)
                kvs__on_recv(h, cqe);
            else if (cqe->kind == KVS_COMPLETION_WRITE && h->role->on_write_done != NULL)
                h->role->on_write_done(h, cqe);
            else if (cqe->kind == KVS_COMPLETION_DISCONNECT)
                kvs__link_kill(&h->links, cqe);
        }
        work += n;
        if (n < KVS__POLL_BATCH)
            break;
    }
    work += h->role->advance(h);
    kvs__expire(h);
    kvs__links_tick(&h->links, kvs__now(h), kvs__on_dead, h);
    kvs__reconnect(h);
    return work;
}

uint64_t kvs__handler_deadline(const kvs__handler_t *h)
{
    uint64_t t = kvs__handler_stall_ns(h);
    const uint64_t links = kvs__links_deadline(&h->links);
    if (links < t)
        t = links;
    for (uint32_t i = 0; i < h->insts.count; i++) {
        const kvs__inst_t *inst = h->insts.v[i];
        for (int64_t k = 0; k < inst->npeers; k++) {
            const kvs__peer_t *p = &inst->peers[k];
            if (p->lost && !p->parked && p->conn == NULL && p->name != NULL &&
                p->reconnect_ns < t)
                t = p->reconnect_ns;
        }
    }
    return t;
}

/* ---- the calls both handler types answer the same --------------------------- */

const char *kvs_room_state_name(kvs_room_state_t state)
{
    switch (state) {
    case KVS_ROOM_FAILED:
        return "failed";
    case KVS_ROOM_BOOTSTRAPPING:
        return "bootstrapping";
    case KVS_ROOM_WAITING:
        return "waiting";
    case KVS_ROOM_TRANSFERRING:
        return "transferring";
    case KVS_ROOM_SUCCESS:
        return "success";
    }
    return "unknown";
}

int kvs__handler_room_state(const kvs__handler_t *h, uint64_t room, kvs_room_state_t *out)
{
    const kvs__room_t *r = kvs__room_get(h, room);
    if (r == NULL || out == NULL)
        return r == NULL ? KVS_ENOENT : KVS_EINVAL;
    *out = r->status != KVS_OK ? KVS_ROOM_FAILED : h->role->room_state(h, r);
    return KVS_OK;
}

void kvs__handler_room_counts(const kvs__handler_t *h, uint64_t counts[KVS__ROOM_STATES])
{
    for (int i = 0; i < KVS__ROOM_STATES; i++)
        counts[i] = 0;
    for (const kvs__room_t *r = h->first; r != NULL; r = r->next) {
        const kvs_room_state_t st =
            r->status != KVS_OK ? KVS_ROOM_FAILED : h->role->room_state(h, r);
        counts[(unsigned)st < KVS__ROOM_STATES ? st : KVS_ROOM_FAILED]++;
    }
}

int kvs__handler_room_abort(kvs__handler_t *h, uint64_t room)
{
    kvs__room_t *r = kvs__room_get(h, room);
    if (r == NULL)
        return KVS__MFAIL(h->m, KVS_ENOENT, "room %llu is not open on this rank: nothing to "
                          "abort", (unsigned long long)room);
    kvs__room_fail(h, r, KVS_ECANCELED, NULL);
    return KVS_OK;
}

/* Both public handler types embed kvs__handler_t first. */
#define KVS__HANDLER_CALLS(role)                                                          \
    void kvs_##role##_destroy(kvs_##role##_t *x)                                          \
    {                                                                                     \
        if (x != NULL)                                                                    \
            kvs__handler_destroy((kvs__handler_t *)x);                                    \
    }                                                                                     \
    int kvs_##role##_progress(kvs_##role##_t *x)                                          \
    {                                                                                     \
        return x != NULL ? kvs__handler_progress((kvs__handler_t *)x) : KVS_EINVAL;        \
    }                                                                                     \
    int kvs_##role##_poll_rooms(kvs_##role##_t *x, kvs_room_result_t *out, int max)       \
    {                                                                                     \
        return x != NULL ? kvs__handler_poll_rooms((kvs__handler_t *)x, out, max)          \
                         : KVS_EINVAL;                                                    \
    }                                                                                     \
    uint64_t kvs_##role##_next_deadline_ns(const kvs_##role##_t *x)                       \
    {                                                                                     \
        return x != NULL ? kvs__handler_deadline((const kvs__handler_t *)x) : UINT64_MAX; \
    }                                                                                     \
    void kvs_##role##_stats(const kvs_##role##_t *x, kvs_handler_stats_t *out)            \
    {                                                                                     \
        if (x == NULL || out == NULL)                                                     \
            return;                                                                       \
        *out = ((const kvs__handler_t *)x)->stats;                                        \
        out->msgs_unacked = kvs__links_unacked(&((const kvs__handler_t *)x)->links);      \
        out->rtt_smoothed_ns = kvs__links_srtt_max(&((const kvs__handler_t *)x)->links);  \
    }                                                                                     \
    kvs__links_t *kvs__##role##_links(kvs_##role##_t *x)                                  \
    {                                                                                     \
        return &((kvs__handler_t *)x)->links;                                             \
    }                                                                                     \
    uint64_t kvs__##role##_stall_ns(const kvs_##role##_t *x)                              \
    {                                                                                     \
        return kvs__handler_stall_ns((const kvs__handler_t *)x);                          \
    }                                                                                     \
    int kvs_##role##_room_state(const kvs_##role##_t *x, uint64_t room,                   \
                                kvs_room_state_t *out)                                    \
    {                                                                                     \
        return x != NULL ? kvs__handler_room_state((const kvs__handler_t *)x, room, out)   \
                         : KVS_EINVAL;                                                    \
    }                                                                                     \
    void kvs__##role##_room_counts(const kvs_##role##_t *x,                               \
                                   uint64_t counts[KVS__ROOM_STATES])                     \
    {                                                                                     \
        kvs__handler_room_counts((const kvs__handler_t *)x, counts);                      \
    }                                                                                     \
    int kvs_##role##_instance_lost(kvs_##role##_t *x, kvs_peer_t peer)                    \
    {                                                                                     \
        return x != NULL ? kvs__handler_instance_lost((kvs__handler_t *)x, peer)           \
                         : KVS_EINVAL;                                                    \
    }                                                                                     \
    int kvs_##role##_room_abort(kvs_##role##_t *x, uint64_t room)                         \
    {                                                                                     \
        return x != NULL ? kvs__handler_room_abort((kvs__handler_t *)x, room) : KVS_EINVAL; \
    }                                                                                     \
    int kvs_##role##_room_set_state_slot(kvs_##role##_t *x, uint64_t room, int64_t slot)  \
    {                                                                                     \
        return x != NULL ? kvs__room_set_state_slot((kvs__handler_t *)x, room, slot)      \
                         : KVS_EINVAL;                                                    \
    }

KVS__HANDLER_CALLS(decode)
KVS__HANDLER_CALLS(prefill)
