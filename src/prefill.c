/*
 * prefill.c - the prefill side of the staging protocol (spec §6-§8, §12),
 * on the handler base (handler.h): its rooms, the registration of decode
 * ranks, the control messages and the reports. How a room's KV leaves this
 * rank is in prefill_staging.c and prefill_direct.c (prefill.h).
 *
 * A prefill rank serves every decode instance that registers with it: each
 * decode rank registers (REGISTER: its instance, geometry, ring, key and
 * the pair's fingerprint; REGISTER_ACK), and the first rank of an instance
 * to register teaches this rank the instance's geometry, from which the
 * pair's plan (layout, targets, gather plan) is computed once. A request
 * (room) names its decode instance; it proceeds per target ("flow") once
 * the prefill opened it and that decode's ROOM arrived, on the pair's path:
 * - staging: STAGING_REQ for every chunk at once (prefetch, spec §7.3); on
 *   STAGING_RSP the chunk waits until its KV is computed, the region is
 *   ready against that decode's last watermark (spec §6; re-checked when a
 *   WATERMARK arrives, never spun) and a staging buffer is free; then gather
 *   (fused with the same chunk of the room's other targets), ONE write (two
 *   with prefill PP when the decode holds more layers), and CHUNK_READY once
 *   the write completed. The staging buffers are shared by every target of
 *   every instance; one is reused only after its write completed.
 * - direct / slice: once the prompt is computed and the decode's pages and
 *   layer keys are known, one write per page run x layer x K/V (direct) or
 *   per token x layer x K/V when heads are sliced.
 * When every chunk (or write) of a flow is done the rank reports STATUS to
 * that decode. A silent flow (MLA: a decode rank whose latent another
 * prefill rank of the room writes) moves nothing and reports once the
 * prompt is computed (final), so its decode completes the room. A failure fails the whole room, is told to every decode of
 * the room at once, and is reported only after the writes already posted
 * completed, so the decode frees no region a write can still land in. A
 * decode whose connection dies is lost: the rooms paired with its instance
 * fail (and that instance's other ranks are told), rooms of other instances
 * go on, rooms opened while it is away fail at once, and its next REGISTER
 * brings it back.
 */
#include "prefill.h"

#include "arith.h"
#include "channel.h"
#include "error.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvs_prefill_t *kvs__pre(kvs__handler_t *h) { return (kvs_prefill_t *)h; }

/* ---- rooms ------------------------------------------------------------------ */

void kvs__pchunk_release(kvs_prefill_t *p, kvs__pchunk_t *c)
{
    if (c->worker >= 0)
        p->worker_busy[c->worker] = false;
    c->worker = -1;
    c->state = KVS__PCH_DONE;
}

static void kvs__room_free(kvs__handler_t *h, kvs__room_t *room, bool destroying)
{
    kvs__proom_t *r = kvs__proom(room);
    (void)destroying; /* an event is gone unless a gather of the room runs */
    for (int64_t f = 0; r->flows != NULL && f < r->nflows; f++) {
        for (int64_t c = 0; c < r->flows[f].num_chunks; c++)
            if (r->flows[f].chunks[c].event != NULL)
                kvs__dev_event_destroy(h->dev, r->flows[f].chunks[c].event);
        kvs__blocks_put(&h->blocks, r->flows[f].chunks);
        kvs__blocks_put(&h->blocks, r->flows[f].dpages);
    }
    kvs__blocks_put(&h->blocks, r->flows);
    kvs__blocks_put(&h->blocks, r->pages);
    kvs__blocks_put(&h->blocks, r);
}

/* Gives r its flows once its instance is known (a target each). */
static int kvs__room_bind(kvs_prefill_t *p, kvs__proom_t *r)
{
    const kvs__inst_t *inst = r->base.inst;
    if (r->flows != NULL || !inst->known)
        return KVS_OK;
    r->flows = kvs__blocks_get(&p->h.blocks, (size_t)inst->npeers * sizeof *r->flows);
    if (r->flows == NULL)
        return KVS_ENOMEM;
    r->nflows = inst->npeers;
    return KVS_OK;
}

/* The room id of inst: made (unopened) when it does not exist yet, as when a
 * decode's ROOM or ABORT overtakes this rank's room_open. NULL when the
 * table is full, or when the room is another instance's. */
static kvs__proom_t *kvs__room_get_or_add(kvs_prefill_t *p, uint64_t id, kvs__inst_t *inst)
{
    kvs__room_t *found = kvs__room_get(&p->h, id);
    if (found != NULL)
        return found->inst == inst ? kvs__proom(found) : NULL;
    kvs__proom_t *r = kvs__blocks_get(&p->h.blocks, sizeof *r);
    if (r == NULL)
        return NULL;
    r->base.inst = inst;
    if (kvs__room_bind(p, r) != KVS_OK || kvs__room_add(&p->h, &r->base, id, inst) != KVS_OK) {
        kvs__blocks_put(&p->h.blocks, r->flows);
        kvs__blocks_put(&p->h.blocks, r);
        return NULL;
    }
    return r;
}

/* Releases the staging buffers of chunks gathered whose writes will not all
 * go out, and tells every decode of the room that has not heard of it yet. */
static void kvs__on_fail(kvs__handler_t *h, kvs__room_t *room, const kvs__peer_t *from)
{
    kvs_prefill_t *p = kvs__pre(h);
    kvs__proom_t *r = kvs__proom(room);
    (void)from;
    /* A gathered chunk whose writes did not all go out is not posted
     * again; with none in flight it holds its buffer and will see no
     * completion: release it (else its last completion does). */
    for (int64_t f = 0; f < r->nflows; f++)
        for (int64_t i = 0; i < r->flows[f].num_chunks; i++) {
            kvs__pchunk_t *c = &r->flows[f].chunks[i];
            if (!c->unposted)
                continue;
            c->unposted = false;
            if (c->writes_pending == 0)
                kvs__pchunk_release(p, c);
        }
    kvs_msg_t msg = {.type = KVS_MSG_ABORT};
    msg.u.abort = (kvs_msg_abort_t){.room = room->id, .status = room->status};
    /* Once the caller opened the room, a decode whose ROOM is still on the
     * way is told too (it drops what it does not know). */
    for (int64_t f = 0; f < r->nflows; f++) {
        kvs__peer_t *peer = kvs__flow_peer(r, f);
        if (!r->flows[f].reported && peer->ready && (r->flows[f].known || r->opened))
            kvs__send(h, peer, &msg);
    }
}

static int64_t kvs__flow_busy(const kvs__pflow_t *fl)
{
    int64_t busy = fl->writes_pending;
    for (int64_t c = 0; c < fl->num_chunks; c++)
        busy += fl->chunks[c].state == KVS__PCH_GATHER || fl->chunks[c].state == KVS__PCH_WRITE;
    return busy;
}

/* Whether this rank is the one that gives flow f's decode rank the room's aux
 * payload: the decode hears it from its peer 0, the writer 0 of the first
 * prefill stage that writes to it, of CP rank 0 (instance.c). */
static bool kvs__flow_carries_aux(const kvs_prefill_t *p, const kvs__proom_t *r, int64_t f)
{
    const kvs__inst_t *inst = r->base.inst;
    return inst->peers[f].tgt.writer == 0 && (inst->lay.decode_pp > 1 || p->h.pp_rank == 0) &&
           p->h.m->cfg.cp_rank == 0;
}

static void kvs__report(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int status)
{
    kvs__pflow_t *fl = &r->flows[f];
    if (fl->reported)
        return;
    fl->reported = true;
    kvs__peer_t *peer = kvs__flow_peer(r, f);
    if (!fl->known && (status == KVS_OK || !peer->ready || !r->opened))
        return; /* the decode never opened it: nothing to tell */
    const uint32_t aux = status == KVS_OK && kvs__flow_carries_aux(p, r, f) ? r->base.aux_bytes : 0;
    kvs_msg_t msg = {.type = KVS_MSG_AUX};
    for (uint32_t first = 0; first < aux; first += KVS_WIRE_AUX_PER_MSG) {
        const uint32_t n = aux - first < KVS_WIRE_AUX_PER_MSG ? aux - first : KVS_WIRE_AUX_PER_MSG;
        msg.u.aux.room = r->base.id;
        msg.u.aux.total = aux;
        msg.u.aux.first = first;
        msg.u.aux.count = n;
        memcpy(msg.u.aux.data, r->base.aux + first, n);
        kvs__send(&p->h, peer, &msg);
    }
    msg = (kvs_msg_t){.type = KVS_MSG_STATUS};
    msg.u.status = (kvs_msg_status_t){.room = r->base.id, .tp_rank = p->h.tp_rank,
                                      .pp_rank = p->h.pp_rank, .status = status,
                                      .aux_bytes = aux, .chunks = fl->num_chunks};
    kvs__send(&p->h, peer, &msg);
}

static void kvs__remember_failed(kvs_prefill_t *p, const kvs__proom_t *r)
{
    p->gone[p->gone_next] = (kvs__pgone_t){r->base.id, r->base.status};
    p->gone_next = (p->gone_next + 1) % p->h.m->cfg.max_rooms;
    if (p->gone_count < p->h.m->cfg.max_rooms)
        p->gone_count++;
}

/* Reports every flow that can be reported and finishes the room when all
 * are; returns true when the room is gone. */
static bool kvs__room_try_finish(kvs_prefill_t *p, kvs__proom_t *r)
{
    const bool staging = r->base.inst->path == KVS_PATH_STAGING;
    int64_t reported = 0;
    for (int64_t f = 0; f < r->nflows; f++) {
        kvs__pflow_t *fl = &r->flows[f];
        if (!fl->reported) {
            if (r->base.status != KVS_OK) {
                if (kvs__flow_busy(fl) == 0)
                    kvs__report(p, r, f, r->base.status);
            } else if (r->opened && r->final && fl->known &&
                       (kvs__flow_peer(r, f)->silent ||
                        (staging ? kvs__staging_flow_done(fl) : kvs__direct_flow_done(fl)))) {
                kvs__report(p, r, f, KVS_OK);
            }
        }
        reported += fl->reported;
    }
    /* A room the caller never opened has no one to report to: it waits for
     * room_open (then finishes at once if it already failed) or expires. A
     * room whose decode instance never registered ends only failed. */
    if (reported < r->nflows || !r->opened ||
        (!r->base.inst->known && r->base.status == KVS_OK))
        return false;
    int64_t chunks = 0;
    for (int64_t f = 0; f < r->nflows; f++)
        chunks += r->flows[f].num_chunks;
    if (r->base.status != KVS_OK)
        kvs__remember_failed(p, r);
    kvs__room_end(&p->h, &r->base, chunks);
    return true;
}

/* A failed room stalled again: one the caller never opened is dropped,
 * silently (nobody asked for it); an opened one waits for its flows. */
static bool kvs__on_stalled(kvs__handler_t *h, kvs__room_t *room)
{
    if (kvs__proom(room)->opened)
        return false;
    kvs__room_drop(h, room);
    return true;
}

/* The decode `peer` crashed or restarted: nothing more reaches it and none
 * of its writes can land, so the rooms paired with its instance fail (the
 * instance's other ranks are told); its flows report (to nobody) once their
 * posted writes completed. Rooms of other instances go on. */
static void kvs__on_peer_lost(kvs__handler_t *h, kvs__peer_t *peer)
{
    kvs_prefill_t *p = kvs__pre(h);
    for (kvs__room_t *room = h->first, *after; room != NULL; room = after) {
        after = room->next;
        if (room->inst != peer->inst)
            continue;
        kvs__room_fail(h, room, KVS_EPEER, NULL);
        kvs__room_try_finish(p, kvs__proom(room));
    }
}

/* ---- writes ------------------------------------------------------------------ */

int kvs__post_write(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk,
                    uint64_t local, kvs_mr_t *mr, uint64_t remote, uint64_t rkey, uint64_t len)
{
    if (p->ops_used == p->ops_cap)
        return KVS_EAGAIN;
    /* The lowest free slot: none below ops_lo is free, so the scan is
     * short however many writes are in flight. */
    uint32_t i = p->ops_lo;
    while (p->ops[i].used)
        i++;
    kvs__pop_t *op = &p->ops[i];
    op->used = true;
    op->gen = (op->gen + 1) & 0x7fffffffu;
    op->room = r->base.id;
    op->flow = (int32_t)f;
    op->chunk = chunk;
    kvs_write_desc_t w = {.local_addr = local, .local_mr = mr, .len_bytes = len,
                          .remote_addr = remote, .rkey = rkey,
                          .wr_id = (uint64_t)op->gen << 32 | i};
    int rc = p->h.fab->ops.write(p->h.fab, kvs__flow_peer(r, f)->conn, &w);
    if (rc != KVS_OK) {
        op->used = false;
        return rc;
    }
    p->ops_used++;
    p->ops_lo = i + 1;
    p->h.stats.rdma_writes++;
    p->h.stats.rdma_write_bytes += len;
    r->base.writes++;
    r->base.bytes += len;
    return KVS_OK;
}

static void kvs__on_write_done(kvs__handler_t *h, const kvs_completion_t *cqe)
{
    kvs_prefill_t *p = kvs__pre(h);
    const uint32_t i = (uint32_t)(cqe->wr_id & 0xffffffffu);
    const uint32_t gen = (uint32_t)(cqe->wr_id >> 32);
    if (i >= p->ops_cap || !p->ops[i].used || p->ops[i].gen != gen) {
        kvs__reject(h);
        return;
    }
    const kvs__pop_t op = p->ops[i];
    p->ops[i].used = false;
    p->ops_used--;
    if (i < p->ops_lo)
        p->ops_lo = i;
    kvs__room_t *room = kvs__room_get(h, op.room);
    if (room == NULL)
        return;
    kvs__proom_t *r = kvs__proom(room);
    kvs__room_touch(h, room);
    if (cqe->status != KVS_OK)
        kvs__room_fail(h, room, cqe->status, NULL);
    if (op.chunk < 0)
        r->flows[op.flow].writes_pending--;
    else
        kvs__staging_write_done(p, r, op.flow, op.chunk);
}

/* ---- requests --------------------------------------------------------------- */

int kvs_prefill_room_open_peer(kvs_prefill_t *p, uint64_t room, kvs_peer_t peer,
                               int64_t total_tokens, const int64_t *pages, int64_t num_pages)
{
    if (p == NULL)
        return KVS_EINVAL;
    kvs_manager_t *m = p->h.m;
    const int64_t ps = m->cfg.page_size;
    if (total_tokens < 0 || num_pages != kvs__ceil_div(total_tokens, ps) ||
        (pages == NULL && num_pages > 0))
        return KVS__MFAIL(m, KVS_EINVAL, "room %llu: %lld tokens need %lld page ids, got "
                          "%lld", (unsigned long long)room, (long long)total_tokens,
                          (long long)(total_tokens >= 0 ? kvs__ceil_div(total_tokens, ps) : 0),
                          (long long)num_pages);
    for (int64_t i = 0; i < num_pages; i++)
        if (pages[i] < 0 || pages[i] >= m->kv.num_pages)
            return KVS__MFAIL(m, KVS_ERANGE, "room %llu: page id %lld outside the KV pool "
                              "of %lld pages", (unsigned long long)room, (long long)pages[i],
                              (long long)m->kv.num_pages);
    kvs__room_t *found = kvs__room_get(&p->h, room);
    if (found != NULL && kvs__proom(found)->opened)
        return KVS__MFAIL(m, KVS_EALREADY, "room %llu is already open",
                          (unsigned long long)room);
    kvs__inst_t *inst = found != NULL ? found->inst : kvs__inst_get(&p->h, peer);
    if (inst == NULL)
        return m->err.status;
    int64_t *copy = kvs__blocks_get(&p->h.blocks, (size_t)(num_pages > 0 ? num_pages : 1) *
                                                      sizeof *copy);
    if (copy == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating room %llu failed", (unsigned long long)room);
    kvs__proom_t *r = found != NULL ? kvs__proom(found) : kvs__room_get_or_add(p, room, inst);
    if (r == NULL) {
        kvs__blocks_put(&p->h.blocks, copy);
        return KVS__MFAIL(m, KVS_EFULL, "room table full (%u rooms): raise max_rooms or "
                          "finish requests first", m->cfg.max_rooms);
    }
    if (num_pages > 0)
        memcpy(copy, pages, (size_t)num_pages * sizeof *pages);
    r->pages = copy;
    r->num_pages = num_pages;
    r->total = total_tokens;
    r->opened = true;
    r->base.open_ns = kvs__now(&p->h);
    kvs__room_touch(&p->h, &r->base);
    /* A decode instance's ROOM that came first for this room id, but from
     * another instance than the caller names, is a misrouted request. */
    if (inst->ref.instance != peer.instance || inst->ref.dp_rank != peer.dp_rank)
        kvs__room_fail(&p->h, &r->base, KVS_EPROTO, NULL);
    const kvs__peer_t *lost = NULL;
    for (int64_t f = 0; f < r->nflows; f++) {
        if (r->flows[f].known && r->flows[f].total != total_tokens)
            kvs__room_fail(&p->h, &r->base, KVS_EPROTO, NULL);
        if (kvs__flow_peer(r, f)->lost && lost == NULL)
            lost = kvs__flow_peer(r, f);
    }
    if (lost == NULL)
        return KVS_OK;
    /* A decode rank of the instance is away: it would never take part. The
     * room fails now, as on the decode side, and its result is in. */
    char name[96];
    KVS__MFAIL(m, KVS_EPEER, "room %llu: decode %s is unreachable (its connection died): "
               "the request fails now; retry it once it has registered again",
               (unsigned long long)room, kvs__peer_name(lost, name, sizeof name));
    kvs__room_fail(&p->h, &r->base, KVS_EPEER, NULL);
    kvs__room_try_finish(p, r);
    return KVS_EPEER;
}

int kvs_prefill_room_open(kvs_prefill_t *p, uint64_t room, int64_t total_tokens,
                          const int64_t *pages, int64_t num_pages)
{
    return kvs_prefill_room_open_peer(p, room, (kvs_peer_t){0, 0}, total_tokens, pages,
                                      num_pages);
}

int kvs_prefill_room_computed(kvs_prefill_t *p, uint64_t room, int64_t end_tokens, bool final)
{
    if (p == NULL)
        return KVS_EINVAL;
    kvs__room_t *found = kvs__room_get(&p->h, room);
    kvs__proom_t *r = found != NULL ? kvs__proom(found) : NULL;
    if (r == NULL || !r->opened)
        return KVS__MFAIL(p->h.m, KVS_ENOENT, "room %llu is not open on this prefill rank",
                          (unsigned long long)room);
    if (end_tokens < r->computed || end_tokens > r->total || (final && end_tokens != r->total))
        return KVS__MFAIL(p->h.m, KVS_EINVAL, "room %llu: computed end %lld must grow up to "
                          "the %lld tokens of the request (final at the end)",
                          (unsigned long long)room, (long long)end_tokens, (long long)r->total);
    r->computed = end_tokens;
    kvs__room_touch(&p->h, &r->base);
    r->final = r->final || final;
    return KVS_OK;
}

int kvs_prefill_room_set_aux(kvs_prefill_t *p, uint64_t room, const void *aux, uint32_t bytes)
{
    if (p == NULL)
        return KVS_EINVAL;
    kvs_manager_t *m = p->h.m;
    if (bytes > m->cfg.max_aux_bytes)
        return KVS__MFAIL(m, KVS_EINVAL, "room %llu: an aux payload of %u bytes is over "
                          "max_aux_bytes %u: raise it on every rank of both roles",
                          (unsigned long long)room, bytes, m->cfg.max_aux_bytes);
    if (aux == NULL && bytes > 0)
        return KVS__MFAIL(m, KVS_EINVAL, "room %llu: aux is NULL with %u bytes",
                          (unsigned long long)room, bytes);
    kvs__room_t *found = kvs__room_get(&p->h, room);
    kvs__proom_t *r = found != NULL ? kvs__proom(found) : NULL;
    if (r == NULL || !r->opened)
        return KVS__MFAIL(m, KVS_ENOENT, "room %llu is not open on this prefill rank",
                          (unsigned long long)room);
    if (r->final)
        return KVS__MFAIL(m, KVS_EALREADY, "room %llu: its last computed() call was made; "
                          "give the aux payload before it (or at room_open)",
                          (unsigned long long)room);
    if (bytes > 0) {
        uint8_t *buf = kvs__blocks_fit(&p->h.blocks, r->base.aux, bytes);
        if (buf == NULL)
            return KVS__MFAIL(m, KVS_ENOMEM, "room %llu: allocating %u aux bytes failed",
                              (unsigned long long)room, bytes);
        r->base.aux = buf;
        memcpy(r->base.aux, aux, bytes);
    }
    r->base.aux_bytes = bytes;
    return KVS_OK;
}

/* ---- registration ------------------------------------------------------------- */

/* Refuses a registration on conn (no peer bound to it), naming why. */
static void kvs__refuse(kvs_prefill_t *p, kvs_conn_t *conn, uint64_t session,
                        const kvs_fingerprint_t *fp, int status, const char *why)
{
    kvs_msg_t ack = {.type = KVS_MSG_REGISTER_ACK};
    ack.u.ack = (kvs_msg_register_ack_t){.echo = session, .tp_rank = p->h.tp_rank,
                                         .pp_rank = p->h.pp_rank, .status = status,
                                         .instance = p->h.m->cfg.instance_id,
                                         .dp_rank = p->h.m->cfg.dp_rank, .fp = *fp,
                                         .cp_rank = p->h.m->cfg.cp_rank,
                                         .cp_size = p->h.m->cfg.context_parallel};
    KVS__MFAIL(p->h.m, status, "refused a decode registration: %s", why);
    kvs_log_write(&p->h.m->log, KVS_LOG_ERROR, "prefill %lld: %s", (long long)p->h.tp_rank,
             p->h.m->err.msg);
    (void)kvs__link_send(&p->h.links, conn, &ack);
}

/* Checks a registration against the pair it makes with this rank; on
 * KVS_OK *out is the decode's instance (its plan learned, when it was the
 * instance's first registration) and *f the target it is. */
static int kvs__check_register(kvs_prefill_t *p, const kvs_msg_register_t *g,
                               kvs_fingerprint_t *fp, kvs__inst_t **out, int64_t *f,
                               char *why, size_t why_bytes)
{
    kvs_manager_t *m = p->h.m;
    /* Until an instance is known, answers carry the default pair's. */
    kvs__fingerprint(&m->layout, m->path, &m->cfg, fp);
    fp->decode_tp = g->tp_size;
    fp->decode_pp = g->pp_size;
    if (g->peer_instance != m->cfg.instance_id || g->peer_dp_rank != m->cfg.dp_rank) {
        snprintf(why, why_bytes, "decode rank tp %lld pp %lld of instance %llu registered for "
                 "prefill instance %llu group %lld, but this is instance %llu group %lld: fix "
                 "the decode's address of this rank", (long long)g->tp_rank,
                 (long long)g->pp_rank, (unsigned long long)g->instance,
                 (unsigned long long)g->peer_instance, (long long)g->peer_dp_rank,
                 (unsigned long long)m->cfg.instance_id, (long long)m->cfg.dp_rank);
        return KVS_EINVAL;
    }
    const kvs_peer_t ref = {g->instance, g->dp_rank};
    kvs__inst_t *inst = kvs__inst_find(&p->h, ref);
    if (inst != NULL && inst->known) {
        *fp = inst->fp;
    } else {
        /* Learned from this registration once it checks out. */
        kvs_layout_t lay;
        kvs_path_t path;
        int rc = kvs__manager_pair(m, g->tp_size, g->pp_size, 0, &lay, &path);
        if (rc != KVS_OK) {
            snprintf(why, why_bytes, "decode instance %llu (TP %lld, PP %lld) cannot pair "
                     "with this rank: %s", (unsigned long long)g->instance,
                     (long long)g->tp_size, (long long)g->pp_size, m->err.msg);
            return rc;
        }
        kvs__fingerprint(&lay, path, &m->cfg, fp);
    }
    int status = kvs__fingerprint_check(fp, &g->fp, why, why_bytes);
    if (status != KVS_OK)
        return status;
    if (inst == NULL)
        inst = kvs__insts_add(&p->h.insts, m, ref);
    if (inst != NULL && !inst->known &&
        kvs__inst_set_geometry(inst, m, g->tp_size, g->pp_size, 0, false) == KVS_OK &&
        kvs__handler_prepare_path(&p->h, inst->path) == KVS_OK) {
        for (kvs__room_t *r = p->h.first; r != NULL; r = r->next)
            if (r->inst == inst && kvs__room_bind(p, kvs__proom(r)) != KVS_OK)
                kvs__room_fail(&p->h, r, KVS_ENOMEM, NULL);
    }
    if (inst == NULL || !inst->known) {
        snprintf(why, why_bytes, "%s", m->err.msg);
        return m->err.status;
    }
    *fp = inst->fp;
    *f = kvs__inst_target_peer(inst, g->tp_rank, g->pp_rank);
    if (*f < 0) {
        snprintf(why, why_bytes, "decode rank tp %lld pp %lld is not a target of prefill "
                 "rank %lld", (long long)g->tp_rank, (long long)g->pp_rank,
                 (long long)p->h.tp_rank);
        return KVS_EINVAL;
    }
    /* A staging decode sends no layer keys (else it would size our
     * allocation); a direct one sends its layers, heads and a pool whose
     * layer size fits in 64 bits (page addresses are computed from it). */
    const kvs_layout_t *l = &inst->lay;
    const int64_t page_bytes = l->decode_page_size * l->dst_heads * l->head_dim * l->elem_bytes;
    int64_t dfirst = 0, dlayers = 0;
    (void)kvs_layout_stage_layers(l, KVS_ROLE_DECODE, inst->decode_stage, &dfirst, &dlayers);
    /* A decode that scopes keys must not hand out its whole ring's. */
    if (inst->path == KVS_PATH_STAGING
            ? (g->ring_bytes == 0 || g->ring_addr + g->ring_bytes < g->ring_addr ||
               g->layers_total != 0 || g->scoped_keys > 1 ||
               (g->scoped_keys == 1 && g->ring_rkey != 0))
            : (g->layers_total != dlayers || g->local_heads != l->dst_heads ||
               g->num_pages <= 0 || g->num_pages > INT64_MAX / page_bytes)) {
        snprintf(why, why_bytes, "decode registration geometry is inconsistent");
        return KVS_EPROTO;
    }
    *out = inst;
    return KVS_OK;
}

static void kvs__on_register(kvs__handler_t *h, kvs_conn_t *conn, kvs__peer_t *bound,
                             const kvs_msg_t *msg)
{
    kvs_prefill_t *p = kvs__pre(h);
    const kvs_msg_register_t *g = &msg->u.reg;
    (void)bound; /* a REGISTER on a bound connection comes again after a loss */
    if (kvs__handshake_check_register(h, conn, msg) != KVS_OK)
        return; /* refused before anything of this rank goes out */
    kvs_fingerprint_t fp;
    kvs__inst_t *inst = NULL;
    int64_t f = -1;
    char why[KVS_ERROR_MSG_BYTES + 128]; /* room for the prefix and a whole message */
    int status = kvs__check_register(p, g, &fp, &inst, &f, why, sizeof why);
    if (status != KVS_OK) {
        kvs__refuse(p, conn, msg->session, &fp, status, why);
        return;
    }
    kvs__peer_t *peer = &inst->peers[f];
    if (peer->ready && peer->session != msg->session) {
        char name[96];
        kvs_log_write(&h->m->log, KVS_LOG_WARN, "prefill %lld: decode %s re-registered as a new "
                 "session: its watermark starts over", (long long)h->tp_rank,
                 kvs__peer_name(peer, name, sizeof name));
    }
    /* A registration over a registered one is a new incarnation of that
     * decode (same session id or not): the regions its previous incarnation
     * handed out mean nothing to the new one, so what this rank still owes
     * the old one fails instead of being written into the new ring. */
    for (kvs__room_t *room = peer->ready ? h->first : NULL; room != NULL; room = room->next) {
        kvs__proom_t *r = kvs__proom(room);
        if (room->inst == inst && r->nflows > 0 && r->flows[f].known && !r->flows[f].reported)
            kvs__room_fail(h, room, KVS_EPEER, NULL);
    }
    kvs__target_t *t = &peer->tgt;
    kvs_layer_entry_t *layers = NULL;
    if (g->layers_total > 0 &&
        (layers = calloc((size_t)g->layers_total, sizeof *layers)) == NULL) {
        kvs__refuse(p, conn, msg->session, &fp, KVS_ENOMEM, "no memory for its layer table");
        return;
    }
    if (peer->conn != NULL && peer->conn != conn)
        kvs__link_forget(&h->links, peer->conn); /* the old incarnation's */
    kvs__peer_bind(h, peer, conn);
    peer->lost = false;
    peer->ready = true;
    peer->session = msg->session;
    t->wm = (kvs_watermark_t){0, 0};
    t->ring_addr = g->ring_addr;
    t->ring_bytes = g->ring_bytes;
    t->ring_rkey = g->ring_rkey;
    t->scoped_keys = g->scoped_keys == 1;
    t->local_heads = g->local_heads;
    t->num_pages = g->num_pages;
    t->layers_total = g->layers_total;
    t->layers_got = 0;
    free(t->layers);
    t->layers = layers;
    kvs_msg_t ack = {.type = KVS_MSG_REGISTER_ACK};
    ack.u.ack = (kvs_msg_register_ack_t){.echo = msg->session, .tp_rank = h->tp_rank,
                                         .pp_rank = h->pp_rank, .status = KVS_OK,
                                         .instance = h->m->cfg.instance_id,
                                         .dp_rank = h->m->cfg.dp_rank, .fp = fp,
                                         .cp_rank = h->m->cfg.cp_rank,
                                         .cp_size = h->m->cfg.context_parallel};
    kvs__send(h, peer, &ack);
}

/* ---- messages ----------------------------------------------------------------- */

static void kvs__on_room(kvs_prefill_t *p, kvs__peer_t *peer, const kvs_msg_room_t *q)
{
    /* The decode's page ids, in its page size; the prefix is aligned to
     * both sides' pages (the grid starts there). */
    const int64_t ps = peer->inst->lay.decode_page_size;
    const int64_t f = peer->index;
    /* More pages than the decode's pool holds cannot be real (and on the
     * direct path would size our page list). */
    if (q->base_tokens < 0 || q->total_tokens < q->base_tokens || q->base_tokens % ps != 0 ||
        q->base_tokens % peer->inst->lay.page_size != 0 ||
        q->num_pages != kvs__ceil_div(q->total_tokens - q->base_tokens, ps) ||
        q->num_pages > peer->tgt.num_pages) {
        kvs__reject(&p->h);
        return;
    }
    kvs__room_t *found = kvs__room_get(&p->h, q->room);
    for (uint32_t i = 0; found == NULL && i < p->gone_count; i++) {
        if (p->gone[i].room != q->room)
            continue;
        /* Ended (failed) before this decode's ROOM came: tell it now. */
        kvs_msg_t msg = {.type = KVS_MSG_ABORT};
        msg.u.abort = (kvs_msg_abort_t){.room = q->room, .status = p->gone[i].status};
        kvs__send(&p->h, peer, &msg);
        msg = (kvs_msg_t){.type = KVS_MSG_STATUS};
        msg.u.status = (kvs_msg_status_t){.room = q->room, .tp_rank = p->h.tp_rank,
                                          .pp_rank = p->h.pp_rank, .status = p->gone[i].status};
        kvs__send(&p->h, peer, &msg);
        return;
    }
    kvs__proom_t *r = kvs__room_get_or_add(p, q->room, peer->inst);
    if (r == NULL || r->nflows == 0) {
        kvs__reject(&p->h);
        return;
    }
    kvs__pflow_t *fl = &r->flows[f];
    if (fl->known) {
        kvs__reject(&p->h);
        return;
    }
    fl->known = true;
    fl->base = q->base_tokens;
    fl->total = q->total_tokens;
    fl->num_dpages = q->num_pages;
    /* This CP rank's tokens of the room past the prefix (every token with
     * CP 1): the direct and slice paths write those only. */
    int64_t cs = q->base_tokens, ce = q->total_tokens;
    (void)kvs_layout_cp_range(&peer->inst->lay, q->total_tokens, p->h.m->cfg.cp_rank, &cs, &ce);
    fl->tok_start = cs > q->base_tokens ? cs : q->base_tokens;
    fl->tok_end = ce > fl->tok_start ? ce : fl->tok_start;
    fl->cur_t = fl->tok_start;
    kvs__room_touch(&p->h, &r->base);
    if (peer->inst->path != KVS_PATH_STAGING && q->num_pages > 0) {
        fl->dpages = kvs__blocks_get(&p->h.blocks, (size_t)q->num_pages * sizeof *fl->dpages);
        if (fl->dpages == NULL)
            kvs__room_fail(&p->h, &r->base, KVS_ENOMEM, NULL);
    }
    if (r->opened && q->total_tokens != r->total)
        kvs__room_fail(&p->h, &r->base, KVS_EPROTO, NULL);
}

static void kvs__on_message(kvs__handler_t *h, kvs__peer_t *peer, const kvs_msg_t *msg)
{
    kvs_prefill_t *p = kvs__pre(h);
    switch (msg->type) {
    case KVS_MSG_LAYERS:
        kvs__direct_on_layers(p, peer, &msg->u.layers);
        break;
    case KVS_MSG_ROOM:
        kvs__on_room(p, peer, &msg->u.room);
        break;
    case KVS_MSG_PAGES:
        kvs__direct_on_pages(p, peer, &msg->u.pages);
        break;
    case KVS_MSG_STAGING_RSP:
        kvs__staging_on_rsp(p, peer, &msg->u.rsp);
        break;
    case KVS_MSG_WATERMARK:
        peer->tgt.wm = (kvs_watermark_t){msg->u.wm.round, msg->u.wm.offset};
        break;
    case KVS_MSG_ABORT: {
        /* An abort may overtake this rank's room_open: keep it (bounded by
         * the room table) so the open fails at once; unopened, it expires. */
        kvs__proom_t *r = kvs__room_get_or_add(p, msg->u.abort.room, peer->inst);
        if (r != NULL)
            kvs__room_fail_told(h, &r->base,
                                msg->u.abort.status != KVS_OK ? msg->u.abort.status : KVS_EPEER,
                                NULL, peer);
        else
            kvs__reject(h);
        break;
    }
    default:
        kvs__reject(h);
        break;
    }
}

/* ---- progress --------------------------------------------------------------- */

static int kvs__advance(kvs__handler_t *h)
{
    kvs_prefill_t *p = kvs__pre(h);
    if (h->stream != NULL)
        kvs__staging_reap(p);
    p->gather_blocked = false;
    for (kvs__room_t *room = h->first, *next; room != NULL; room = next) {
        next = room->next;
        kvs__proom_t *r = kvs__proom(room);
        const bool staging = room->inst->path == KVS_PATH_STAGING;
        for (int64_t f = 0; f < r->nflows; f++) {
            if (!r->opened || !r->flows[f].known || !kvs__flow_peer(r, f)->ready ||
                room->status != KVS_OK || kvs__flow_peer(r, f)->silent)
                continue; /* a silent flow (MLA) moves nothing: it only reports */
            if (staging) {
                if (!r->flows[f].reqs_sent)
                    kvs__staging_send_requests(p, r, f);
                kvs__staging_advance(p, r, f);
            } else if (p->ops_used < p->ops_cap) {
                /* With every write slot taken it could only stop at its
                 * first post: hundreds of rooms in flight made that scan
                 * the cost of each completion. */
                kvs__direct_advance(p, r, f);
            }
        }
        kvs__room_try_finish(p, r);
    }
    return 0;
}

/* Bootstrapping until its decode instance registered and every target's
 * ROOM came; transferring once a gather or a write of it started. */
static kvs_room_state_t kvs__room_state(const kvs__handler_t *h, const kvs__room_t *room)
{
    (void)h;
    const kvs__proom_t *r = (const kvs__proom_t *)room;
    if (r->nflows == 0)
        return KVS_ROOM_BOOTSTRAPPING;
    bool moving = false;
    for (int64_t f = 0; f < r->nflows; f++) {
        const kvs__pflow_t *fl = &r->flows[f];
        if (!fl->known || !room->inst->peers[f].ready)
            return KVS_ROOM_BOOTSTRAPPING;
        moving = moving || fl->writes_pending > 0 || fl->chunks_done > 0 || fl->cur_t > fl->tok_start;
        for (int64_t c = 0; c < fl->num_chunks; c++)
            moving = moving || fl->chunks[c].state >= KVS__PCH_GATHER;
    }
    return moving ? KVS_ROOM_TRANSFERRING : KVS_ROOM_WAITING;
}

static int kvs__role_init(kvs__handler_t *h)
{
    kvs_prefill_t *p = kvs__pre(h);
    kvs_manager_t *m = h->m;
    p->workers = m->staging_count;
    /* a staged chunk's K and V writes go out together (prefill PP) */
    p->ops_cap = m->cfg.max_inflight_writes >= 2 ? m->cfg.max_inflight_writes : 2;
    const uint32_t slots = p->workers > 0 ? p->workers : 1;
    p->fuse_cap = kvs__min_i64(slots, KVS_COPY_PARTS_MAX);
    p->worker_busy = calloc(slots, sizeof *p->worker_busy);
    p->ops = calloc(p->ops_cap, sizeof *p->ops);
    p->fuse_flows = calloc((size_t)p->fuse_cap, sizeof *p->fuse_flows);
    p->fuse_workers = calloc((size_t)p->fuse_cap, sizeof *p->fuse_workers);
    p->fuse_parts = calloc((size_t)p->fuse_cap, sizeof *p->fuse_parts);
    p->fuse_blocks = calloc((size_t)p->fuse_cap, sizeof *p->fuse_blocks);
    p->gone = calloc(m->cfg.max_rooms, sizeof *p->gone);
    if (p->gone == NULL || p->worker_busy == NULL || p->ops == NULL || p->fuse_flows == NULL ||
        p->fuse_workers == NULL || p->fuse_parts == NULL || p->fuse_blocks == NULL ||
        kvs__fifo_init(&p->gathers, slots) != KVS_OK)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the prefill handler's tables failed");
    /* The default decode instance, when the config gives its geometry. */
    if (m->cfg.peer_tp_size > 0 && kvs__inst_get(&p->h, (kvs_peer_t){0, 0}) == NULL)
        return m->err.status;
    return KVS_OK;
}

static void kvs__role_fini(kvs__handler_t *h)
{
    kvs_prefill_t *p = kvs__pre(h);
    kvs__fifo_fini(&p->gathers);
    free(p->gone);
    free(p->worker_busy);
    free(p->ops);
    free(p->fuse_flows);
    free(p->fuse_workers);
    free(p->fuse_parts);
    free(p->fuse_blocks);
}

static const kvs__role_t kvs__prefill_role = {
    .role = KVS_ROLE_PREFILL, .accepts = true, .role_init = kvs__role_init,
    .role_fini = kvs__role_fini, .on_register = kvs__on_register,
    .on_message = kvs__on_message, .on_write_done = kvs__on_write_done,
    .advance = kvs__advance, .on_fail = kvs__on_fail, .on_stalled = kvs__on_stalled,
    .on_peer_lost = kvs__on_peer_lost, .room_free = kvs__room_free,
    .room_state = kvs__room_state};

/* ---- the public calls ------------------------------------------------------- */

int kvs_prefill_create(kvs_manager_t *m, kvs_prefill_t **out)
{
    return kvs__handler_create(m, &kvs__prefill_role, sizeof **out, (void **)out);
}
