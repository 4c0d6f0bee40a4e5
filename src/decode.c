/*
 * decode.c - the decode side of the staging protocol (spec §6-§8, §12), on
 * the handler base (handler.h: rooms, peers, links, the progress loop).
 *
 * Creation runs the init guards of spec §8 (kvs__manager_handler_check).
 * Then the handler is a state machine driven by kvs_decode_progress():
 * - peer instances: the application declares the prefill instances
 *   (kvs_decode_add_instance: geometry and addresses; the pair's layout is
 *   computed then, once). A room names its prefill instance; this rank
 *   connects to that instance's writers on first use (or ahead of time) and
 *   keeps the connections. REGISTER (ring, geometry, fingerprint of the
 *   pair; KV layer keys on the direct/slice paths) goes to each; on
 *   REGISTER_ACK the peer gets the current watermark at once;
 * - room_open: ROOM (+ PAGES on the direct/slice paths) to every writer of
 *   the room's instance;
 * - STAGING_REQ: assign the chunk's region from the one ring every prefill
 *   instance shares (once; duplicates get the same answer), grant each of
 *   its writers exactly its bytes of it when the fabric scopes keys
 *   (region_keys.h), and answer STAGING_RSP with them, or OVERSIZED which
 *   fails the request; when the ring is at its live-allocation bound the
 *   chunk waits in a FIFO, so requests from every instance are served in
 *   arrival order;
 * - CHUNK_READY: count arrivals per chunk (each writer x prefill stage once);
 *   when all arrived, scatter every writer's block in one fused copy
 *   (scatter_parts: each token row written once, whole) on the scatter
 *   stream and record an event; when the event completes, revoke the
 *   region's keys, free the region and send the new WATERMARK to every
 *   prefill session that writes into the ring, whatever its instance;
 * - STATUS / ABORT: a request is done when every writer reported success and
 *   every chunk was scattered; it fails on the first failure, told to every
 *   writer at once, and its regions are freed once every writer has reported
 *   (no writer can still write) and no scatter is in flight. A writer's
 *   report is its STATUS, which it sends once its posted writes completed;
 *   its ABORT only fails the room at once (writes may still be landing). A
 *   writer that refused the registration never writes: it counts as a failed
 *   report.
 * Messages that are malformed, stale or out of range are counted and dropped,
 * never used to address memory; a message about a room of another instance
 * is out of range. A writer whose connection dies (crashed, restarted) is
 * lost: it can write nothing more, so its report of every open room of its
 * instance is in (failed), rooms of other instances go on untouched, new
 * rooms naming its instance fail at once while it is away, and the base
 * reconnects with a doubling wait and this side registers again.
 */
#include "arith.h"
#include "channel.h"
#include "chunk.h"
#include "error.h"
#include "fifo.h"
#include "handler.h"
#include "hybrid.h"
#include "hybrid_copy.h"
#include "draft_copy.h"
#include "log.h"
#include "region_keys.h"

#include <assert.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KVS__DCH_IDLE, KVS__DCH_WANTED, KVS__DCH_ALLOCATED, KVS__DCH_SCATTERING, KVS__DCH_DONE };

typedef struct kvs__dchunk {
    uint8_t state;
    int64_t tokens, page_start, num_pages;
    int64_t token_start;        /* its first token in the request */
    int64_t region_bytes;
    kvs_ring_alloc_t alloc;
    int64_t arrivals, want;     /* writes arrived, and that it waits for (every
                                   writer of each CP rank that meets it) */
    int64_t first_cp, ncp;      /* the prefill CP ranks that write it */
    kvs_event_t *event;
    kvs__wkeys_t *keys;         /* [writers] with scoped keys, else NULL: each
                                   writer's keys of the region while allocated */
} kvs__dchunk_t;

typedef struct kvs__droom {
    kvs__room_t base;           /* first */
    int64_t base_tokens, total;
    int64_t *pages, num_pages;
    int64_t num_chunks, scattered;
    kvs__dchunk_t *chunks;
    kvs__wkeys_t *keys;         /* num_chunks * writers, with scoped keys */
    uint64_t *arrived;          /* num_chunks * words bits: writer x stage */
    uint64_t *reported;         /* words bits: writers that sent STATUS/ABORT */
    int64_t reports, reports_ok;
} kvs__droom_t;

struct kvs_decode {
    kvs__handler_t h;           /* first */
    kvs_ring_t *ring;           /* the manager's; shared by every instance */
    uint64_t ring_addr, ring_bytes, ring_rkey;
    kvs__ring_keys_t keys;      /* region-scoped keys (region_keys.h) */
    kvs__fifo_t scatters;       /* in stream order */
    kvs__fifo_t wanted;         /* chunks waiting for ring space, in arrival order */
    kvs_copy_part_t *parts;     /* a chunk's scatter: one part per writer's
                                 * heads, up to KVS_COPY_PARTS_MAX at once */
    uint64_t open_chunks;       /* chunks of the open rooms */
};

static kvs_decode_t *kvs__dec(kvs__handler_t *h) { return (kvs_decode_t *)h; }
static kvs__droom_t *kvs__droom(kvs__room_t *r) { return (kvs__droom_t *)r; }

static bool kvs__bit(const uint64_t *bits, int64_t i) { return (bits[i / 64] >> (i % 64)) & 1u; }
static void kvs__bit_set(uint64_t *bits, int64_t i) { bits[i / 64] |= 1ull << (i % 64); }

/* Chunk index i of a room as the layout names it. */
static kvs_chunk_t kvs__dchunk_of(const kvs__dchunk_t *c, int64_t i)
{
    return (kvs_chunk_t){.index = i, .page_start = c->page_start, .num_pages = c->num_pages,
                         .token_start = c->token_start, .token_end = c->token_start + c->tokens};
}

/* Peer p's CP rank writes chunk c (always with CP 1). */
static bool kvs__dchunk_writer(const kvs__dchunk_t *c, const kvs__peer_t *p)
{
    return p->cp_rank >= c->first_cp && p->cp_rank < c->first_cp + c->ncp;
}

/* ---- rooms -------------------------------------------------------------------- */

static void kvs__broadcast_watermark(kvs_decode_t *d, kvs_watermark_t wm)
{
    kvs_msg_t msg = {.type = KVS_MSG_WATERMARK};
    msg.u.wm = (kvs_msg_watermark_t){.round = wm.round, .offset = wm.offset};
    for (uint32_t i = 0; i < d->h.insts.count; i++) {
        kvs__inst_t *inst = d->h.insts.v[i];
        for (int64_t k = 0; k < inst->npeers; k++)
            if (inst->peers[k].ready)
                kvs__send(&d->h, &inst->peers[k], &msg);
    }
}

/* Keeps the ring figures of the stats current: bytes live now, and the
 * most ever live at once. */
static void kvs__note_ring(kvs_decode_t *d)
{
    if (d->ring == NULL) /* the direct and slice paths have none */
        return;
    const uint64_t live = kvs_ring_live_bytes(d->ring);
    d->h.stats.ring_live_bytes = live;
    if (live > d->h.stats.ring_peak_bytes)
        d->h.stats.ring_peak_bytes = live;
}

/* Revokes every writer's keys of chunk c's region (a no-op without scoped
 * keys): before the region goes back to the ring. */
static void kvs__revoke_region(kvs_decode_t *d, const kvs__droom_t *r, kvs__dchunk_t *c)
{
    for (int64_t i = 0; c->keys != NULL && i < r->base.inst->npeers; i++)
        kvs__wkeys_revoke(&d->h, &c->keys[i]);
}

static void kvs__release_region(kvs_decode_t *d, const kvs__droom_t *r, kvs__dchunk_t *c)
{
    if (c->region_bytes == 0)
        return;
    kvs__revoke_region(d, r, c);
    kvs_watermark_t wm;
    int rc = kvs_ring_free(d->ring, c->alloc.id, &wm);
    kvs__note_ring(d);
    if (rc == KVS_OK)
        kvs__broadcast_watermark(d, wm);
}

/* Finishes the room when nothing can still touch it; returns true if gone. */
static bool kvs__room_try_finish(kvs_decode_t *d, kvs__droom_t *r)
{
    const int64_t writers = r->base.inst->npeers;
    if (r->reports < writers)
        return false;
    if (r->base.status == KVS_OK && r->reports_ok == writers && r->scattered < r->num_chunks)
        return false;
    for (int64_t i = 0; i < r->num_chunks; i++)
        if (r->chunks[i].state == KVS__DCH_SCATTERING)
            return false;
    /* Every writer has reported: no write can land; release what is left. */
    for (int64_t i = 0; i < r->num_chunks; i++) {
        kvs__dchunk_t *c = &r->chunks[i];
        if (c->state == KVS__DCH_ALLOCATED)
            kvs__release_region(d, r, c);
        c->state = KVS__DCH_DONE;
    }
    /* A report that is not OK fails the room: an OK room has only OK ones. */
    assert(r->base.status != KVS_OK || r->reports_ok == writers);
    d->open_chunks -= (uint64_t)r->num_chunks;
    kvs__room_end(&d->h, &r->base, r->num_chunks);
    return true;
}

/* Every writer that has not reported yet hears of the failure, except
 * `from` (the one that told us). */
static void kvs__on_fail(kvs__handler_t *h, kvs__room_t *room, const kvs__peer_t *from)
{
    kvs__droom_t *r = kvs__droom(room);
    kvs__inst_t *inst = room->inst;
    kvs_msg_t msg = {.type = KVS_MSG_ABORT};
    msg.u.abort = (kvs_msg_abort_t){.room = room->id, .status = room->status};
    for (int64_t i = 0; i < inst->npeers; i++)
        if (!kvs__bit(r->reported, i) && &inst->peers[i] != from)
            kvs__send(h, &inst->peers[i], &msg);
}

static void kvs__room_free(kvs__handler_t *h, kvs__room_t *room, bool destroying)
{
    kvs_decode_t *d = kvs__dec(h);
    kvs__droom_t *r = kvs__droom(room);
    for (int64_t c = 0; destroying && c < r->num_chunks; c++) {
        kvs__dchunk_t *ch = &r->chunks[c];
        if (ch->event != NULL)
            kvs__dev_event_destroy(h->dev, ch->event);
        /* The ring is the manager's and outlives this handler: give back
         * what the handler took (no watermark to send, the connections go
         * down too). */
        if ((ch->state == KVS__DCH_ALLOCATED || ch->state == KVS__DCH_SCATTERING) &&
            ch->region_bytes > 0) {
            kvs__revoke_region(d, r, ch);
            (void)kvs_ring_free(d->ring, ch->alloc.id, NULL);
        }
    }
    if (destroying)
        kvs__note_ring(d);
    kvs__blocks_put(&h->blocks, r);
}

/* A failed room stalled again: the writers that stayed silent (dead, or cut
 * off) will not report now; stop waiting for them. */
static bool kvs__on_stalled(kvs__handler_t *h, kvs__room_t *room)
{
    kvs__droom_t *r = kvs__droom(room);
    for (int64_t p = 0; p < room->inst->npeers; p++)
        if (!kvs__bit(r->reported, p)) {
            kvs__bit_set(r->reported, p);
            r->reports++;
        }
    return kvs__room_try_finish(kvs__dec(h), r);
}

/* Writer `peer` will never write into the open rooms of its instance (it
 * refused the registration, or its connection died): counts its report in
 * every one it has not reported in, each failing with status. Rooms of
 * other instances are not its business. */
static void kvs__peer_reports_failed(kvs_decode_t *d, kvs__peer_t *peer, int status)
{
    for (kvs__room_t *room = d->h.first, *after; room != NULL; room = after) {
        after = room->next;
        kvs__droom_t *r = kvs__droom(room);
        if (room->inst != peer->inst || kvs__bit(r->reported, peer->index))
            continue;
        kvs__bit_set(r->reported, peer->index);
        r->reports++;
        kvs__room_fail(&d->h, room, status, NULL);
        kvs__room_try_finish(d, r);
    }
}

static void kvs__on_peer_lost(kvs__handler_t *h, kvs__peer_t *peer)
{
    kvs__peer_reports_failed(kvs__dec(h), peer, KVS_EPEER);
}

/* ---- registration --------------------------------------------------------------- */

/* REGISTER (+ LAYERS on the direct/slice paths) on peer's connection;
 * with a cluster secret, once the prefill proved it (kvs__register). */
static void kvs__send_register(kvs_decode_t *d, kvs__peer_t *p)
{
    kvs_manager_t *m = d->h.m;
    const kvs__inst_t *inst = p->inst;
    const bool direct = inst->path != KVS_PATH_STAGING;
    kvs_msg_t msg = {.type = KVS_MSG_REGISTER};
    msg.u.reg = (kvs_msg_register_t){
        .tp_rank = m->cfg.tp_rank, .tp_size = m->cfg.tp_size, .pp_rank = m->cfg.pp_rank,
        .pp_size = m->cfg.pp_size, .instance = m->cfg.instance_id, .dp_rank = m->cfg.dp_rank,
        .peer_instance = inst->ref.instance, .peer_dp_rank = inst->ref.dp_rank, .fp = inst->fp,
        .ring_addr = d->ring_addr, .ring_bytes = d->ring_bytes,
        /* With scoped keys the whole ring's key never leaves this rank. */
        .ring_rkey = d->keys.scoped ? 0 : d->ring_rkey, .scoped_keys = d->keys.scoped,
        .local_heads = m->kv.local_heads, .num_pages = m->kv.num_pages,
        .layers_total = direct ? m->kv.num_layers : 0};
    kvs__handshake_sign(&d->h, p, &msg);
    kvs__send(&d->h, p, &msg);
    p->registered = true;
    for (int64_t first = 0; direct && first < m->kv.num_layers; first += KVS_WIRE_LAYERS_PER_MSG) {
        kvs_msg_t lm = {.type = KVS_MSG_LAYERS};
        lm.u.layers.first = first;
        const int64_t n = m->kv.num_layers - first;
        lm.u.layers.count = (uint32_t)(n < KVS_WIRE_LAYERS_PER_MSG ? n : KVS_WIRE_LAYERS_PER_MSG);
        for (uint32_t i = 0; i < lm.u.layers.count; i++) {
            const int64_t l = first + i;
            const kvs__kv_keys_t *kk = &d->h.kv_keys;
            lm.u.layers.entries[i] = (kvs_layer_entry_t){
                .k_addr = m->k_base[l], .k_rkey = kk->k_rkey[l],
                .v_addr = m->v_base != NULL ? m->v_base[l] : 0, /* none with MLA */
                .v_rkey = kk->v_rkey[l],
                .ks_addr = m->ks_base != NULL ? m->ks_base[l] : 0, /* kv_scales */
                .ks_rkey = kk->ks_rkey[l],
                .vs_addr = m->vs_base != NULL ? m->vs_base[l] : 0,
                .vs_rkey = kk->vs_rkey[l]};
        }
        kvs__send(&d->h, p, &lm);
    }
}

/* Opens peer's new connection: HELLO first with a cluster secret (the
 * REGISTER follows its CHALLENGE), else the REGISTER at once. */
static void kvs__register(kvs_decode_t *d, kvs__peer_t *p)
{
    p->registered = false; /* a new connection: nothing is acknowledged on it yet */
    if (!kvs__handshake_open(&d->h, p))
        kvs__send_register(d, p);
    else if (p->refused == KVS_EAUTH)
        kvs__peer_reports_failed(d, p, KVS_EAUTH);
}

/* The prefill's CHALLENGE: it proved the secret (register now), or it did
 * not (refused, like a refused registration: it never writes). */
static void kvs__on_challenge(kvs__handler_t *h, kvs_conn_t *conn, kvs__peer_t *peer,
                              const kvs_msg_t *msg)
{
    const int rc = kvs__handshake_on_challenge(h, conn, peer, msg);
    if (rc == KVS_OK)
        kvs__send_register(kvs__dec(h), peer);
    else if (rc == KVS_EAUTH)
        kvs__peer_reports_failed(kvs__dec(h), peer, KVS_EAUTH);
}

static void kvs__on_connected(kvs__handler_t *h, kvs__peer_t *peer)
{
    kvs__register(kvs__dec(h), peer);
}

/* Connects peer (not connected, not refused) and registers. */
static int kvs__connect_peer(kvs_decode_t *d, kvs__peer_t *p)
{
    kvs_manager_t *m = d->h.m;
    p->ready = false;
    p->refused = KVS_OK;
    int rc = kvs__peer_connect(&d->h, p);
    if (rc == KVS_EINVAL)
        return rc; /* a shared address: refused, m->err says so */
    if (rc != KVS_OK) {
        /* Not there (yet): the handler keeps trying, as for a peer lost
         * later; rooms fail at once until it registers. */
        char name[96];
        return kvs__error_set(&m->err, rc, d->h.fab->last_backend_code, __FILE__, __LINE__,
                              "connecting to prefill %s at '%s' failed (%s); "
                              "kvs_decode_progress keeps trying, or connect again with the "
                              "right address", kvs__peer_name(p, name, sizeof name), p->name,
                              d->h.fab->last_backend_msg[0] ? d->h.fab->last_backend_msg
                                                            : kvs_strerror(rc));
    }
    kvs__register(d, p);
    return KVS_OK;
}

int kvs_decode_connect(kvs_decode_t *d, const char *peer, int64_t prefill_tp_rank,
                       int64_t prefill_pp_rank)
{
    if (d == NULL || peer == NULL)
        return KVS_EINVAL;
    kvs_manager_t *m = d->h.m;
    kvs__inst_t *inst = kvs__inst_get(&d->h, (kvs_peer_t){0, 0});
    if (inst == NULL)
        return m->err.status;
    const int64_t idx = kvs__inst_writer_peer(inst, m->cfg.tp_rank, 0, prefill_tp_rank,
                                              prefill_pp_rank);
    if (idx < 0)
        return KVS__MFAIL(m, KVS_EINVAL, "prefill rank tp %lld pp %lld takes no part in the "
                          "rooms of decode rank tp %lld pp %lld: connect only this rank's "
                          "writers (and with MLA the ranks that report to it)",
                          (long long)prefill_tp_rank, (long long)prefill_pp_rank,
                          (long long)m->cfg.tp_rank, (long long)m->cfg.pp_rank);
    kvs__peer_t *p = &inst->peers[idx];
    if (p->conn != NULL)
        return KVS__MFAIL(m, KVS_EALREADY, "prefill rank tp %lld pp %lld is already "
                          "connected", (long long)prefill_tp_rank, (long long)prefill_pp_rank);
    char *name = malloc(strlen(peer) + 1);
    if (name == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "copying the address of prefill '%s' failed", peer);
    strcpy(name, peer);
    free(p->name);
    p->name = name;
    p->lost = false; /* a new address: tried now, retried if it fails */
    return kvs__connect_peer(d, p);
}

/* True (m->err set) when one of the n addresses of desc is NULL. */
static bool kvs__null_addr(kvs_decode_t *d, const kvs_instance_desc_t *desc, int64_t n)
{
    for (int64_t a = 0; a < n; a++)
        if (desc->addrs[a] == NULL) {
            KVS__MFAIL(d->h.m, KVS_EINVAL, "prefill instance %llu: address %lld is NULL: "
                       "give every rank's address", (unsigned long long)desc->id, (long long)a);
            return true;
        }
    return false;
}

/* An instance declared again: the same geometry at new addresses (it came
 * back elsewhere: a restarted pod, another port), taken only while none of
 * its ranks is connected; its next room connects to them. */
static int kvs__redeclare(kvs_decode_t *d, const kvs_instance_desc_t *desc, int64_t pp,
                          int64_t cp, int64_t dp)
{
    kvs_manager_t *m = d->h.m;
    const unsigned long long id = (unsigned long long)desc->id;
    int64_t have = 0;
    while (kvs__inst_find(&d->h, (kvs_peer_t){desc->id, have}) != NULL)
        have++;
    const kvs__inst_t *g0 = kvs__inst_find(&d->h, (kvs_peer_t){desc->id, 0});
    if (have != dp || g0->tp_size != desc->tp_size || g0->pp_size != pp || g0->cp_size != cp)
        return KVS__MFAIL(m, KVS_EALREADY, "prefill instance %llu is declared already as "
                          "TP %lld x PP %lld x CP %lld x %lld group(s), not TP %lld x PP %lld "
                          "x CP %lld x %lld: an instance of another shape needs an id of its "
                          "own", id, (long long)g0->tp_size, (long long)g0->pp_size,
                          (long long)g0->cp_size, (long long)have, (long long)desc->tp_size,
                          (long long)pp, (long long)cp, (long long)dp);
    for (int64_t g = 0; g < dp; g++) {
        const kvs__inst_t *inst = kvs__inst_find(&d->h, (kvs_peer_t){desc->id, g});
        for (int64_t i = 0; i < inst->npeers; i++)
            if (inst->peers[i].conn != NULL)
                return KVS__MFAIL(m, KVS_EALREADY, "prefill instance %llu is declared already "
                                  "and connected: its new addresses are taken once it is "
                                  "gone (kvs_decode_instance_lost first)", id);
    }
    if (kvs__null_addr(d, desc, dp * cp * pp * desc->tp_size))
        return m->err.status;
    for (int64_t g = 0; g < dp; g++) {
        kvs__inst_t *inst = kvs__inst_find(&d->h, (kvs_peer_t){desc->id, g});
        const int rc = kvs__inst_set_addrs(inst, m, desc->addrs + g * cp * pp * desc->tp_size);
        if (rc != KVS_OK)
            return rc; /* groups before g have their new addresses: call again */
    }
    kvs_log_write(&m->log, KVS_LOG_INFO, "decode %lld: prefill instance %llu declared again: "
                  "its next room connects to %s...", (long long)m->cfg.tp_rank, id,
                  desc->addrs[0]);
    return KVS_OK;
}

int kvs_decode_add_instance(kvs_decode_t *d, const kvs_instance_desc_t *desc)
{
    if (d == NULL)
        return KVS_EINVAL;
    kvs_manager_t *m = d->h.m;
    if (desc == NULL || desc->addrs == NULL || desc->tp_size <= 0 || desc->pp_size < 0 ||
        desc->dp_size < 0 || desc->cp_size < 0)
        return KVS__MFAIL(m, KVS_EINVAL, "an instance needs tp_size > 0, pp_size, dp_size "
                          "and cp_size >= 0 (0 means 1) and the addresses of its ranks");
    const int64_t pp = desc->pp_size > 0 ? desc->pp_size : 1;
    const int64_t dp = desc->dp_size > 0 ? desc->dp_size : 1;
    const int64_t cp = desc->cp_size > 0 ? desc->cp_size : 1;
    if (kvs__inst_find(&d->h, (kvs_peer_t){desc->id, 0}) != NULL)
        return kvs__redeclare(d, desc, pp, cp, dp);
    if (dp > (int64_t)(d->h.insts.cap - d->h.insts.count))
        return KVS__MFAIL(m, KVS_EFULL, "prefill instance %llu has %lld attention groups "
                          "and %u more fit: raise max_instances",
                          (unsigned long long)desc->id, (long long)dp,
                          d->h.insts.cap - d->h.insts.count);
    if (kvs__null_addr(d, desc, dp * cp * pp * desc->tp_size))
        return m->err.status;
    for (int64_t g = 0; g < dp; g++) {
        kvs__inst_t *inst = kvs__insts_add(&d->h.insts, m, (kvs_peer_t){desc->id, g});
        int rc = inst != NULL ? kvs__inst_set_geometry(inst, m, desc->tp_size, pp, cp, true)
                              : m->err.status;
        if (rc == KVS_OK)
            rc = kvs__inst_set_addrs(inst, m, desc->addrs + g * cp * pp * desc->tp_size);
        if (rc == KVS_OK)
            rc = kvs__handler_prepare_path(&d->h, inst->path);
        if (rc != KVS_OK) {
            for (int64_t k = inst != NULL ? g + 1 : g; k > 0; k--)
                kvs__insts_pop(&d->h.insts); /* nothing connected yet */
            return rc;
        }
    }
    kvs_log_write(&m->log, KVS_LOG_INFO, "decode %lld: prefill instance %llu (TP %lld, PP %lld, "
             "%lld group(s)) declared", (long long)m->cfg.tp_rank,
             (unsigned long long)desc->id, (long long)desc->tp_size, (long long)pp,
             (long long)dp);
    return KVS_OK;
}

/* Connects every writer of inst that is not connected nor refused, and
 * those lost whose wait before the next try is over (a restarted instance
 * is connected again by the next room that names it, or by the handler's
 * own retries, whichever comes first; until it acknowledges, rooms naming
 * it fail at once). A writer parked by kvs_decode_instance_lost is
 * connected here only, and the room that asked waits for its registration
 * as on a first connect. Returns the first failure. */
static int kvs__connect_inst(kvs_decode_t *d, kvs__inst_t *inst)
{
    int first = KVS_OK;
    const uint64_t now = kvs__now(&d->h);
    for (int64_t i = 0; i < inst->npeers; i++) {
        kvs__peer_t *p = &inst->peers[i];
        if (p->conn != NULL || p->refused != KVS_OK || (p->lost && now < p->reconnect_ns))
            continue;
        if (p->name == NULL)
            return KVS__MFAIL(d->h.m, KVS_ESTATE, "connect every prefill writer first "
                              "(kvs_decode_connect): %lld expected", (long long)inst->npeers);
        const bool asked = p->parked;
        const int rc = kvs__connect_peer(d, p);
        if (rc == KVS_OK && asked)
            p->lost = false;
        if (first == KVS_OK)
            first = rc;
    }
    return first;
}

int kvs_decode_connect_peer(kvs_decode_t *d, kvs_peer_t peer)
{
    if (d == NULL)
        return KVS_EINVAL;
    kvs__inst_t *inst = kvs__inst_find(&d->h, peer);
    if (inst == NULL)
        return KVS__MFAIL(d->h.m, KVS_ENOENT, "prefill instance %llu group %lld was never "
                          "declared: kvs_decode_add_instance first",
                          (unsigned long long)peer.instance, (long long)peer.dp_rank);
    return kvs__connect_inst(d, inst);
}

int64_t kvs_decode_peers_ready(const kvs_decode_t *d)
{
    int64_t n = 0;
    for (uint32_t i = 0; d != NULL && i < d->h.insts.count; i++)
        for (int64_t k = 0; k < d->h.insts.v[i]->npeers; k++)
            n += d->h.insts.v[i]->peers[k].ready;
    return n;
}

/* REGISTER_ACK from the prefill rank `p` on its connection. */
static void kvs__on_ack(kvs__handler_t *h, kvs_conn_t *conn, kvs__peer_t *p,
                        const kvs_msg_t *msg)
{
    kvs_decode_t *d = kvs__dec(h);
    const kvs_msg_register_ack_t *a = &msg->u.ack;
    /* An answer to a REGISTER this connection never carried (with a secret:
     * from a prefill that skipped its challenge, or failed it) is forged. */
    if (p == NULL || p->conn != conn || !p->registered || a->echo != h->session) {
        kvs__reject(h);
        return;
    }
    /* An acceptance from a rank of another CP rank (or CP size) than the
     * one this address stands for would write other tokens' rows here. */
    const bool cp_wrong = a->status == KVS_OK &&
                          (a->cp_rank != p->cp_rank || a->cp_size != p->inst->lay.prefill_cp);
    if (a->status != KVS_OK || cp_wrong) {
        if (p->ready) { /* contradicts the acceptance we hold: stale or forged */
            kvs__reject(h);
            return;
        }
        const int status = cp_wrong ? KVS_EINVAL : a->status;
        p->refused = status;
        /* The prefill sends its fingerprint and its instance: name the
         * field that differs, or the instance the address really reaches. */
        char why[200], name[96];
        const kvs_peer_t meant = p->inst->ref;
        if (cp_wrong)
            snprintf(why, sizeof why, "its address '%s' reaches context-parallel rank %lld of "
                     "%lld, not rank %lld of %lld: fix that rank's address (the instance's "
                     "addresses are one group per CP rank) or its cp_rank",
                     p->name != NULL ? p->name : "?", (long long)a->cp_rank,
                     (long long)a->cp_size, (long long)p->cp_rank,
                     (long long)p->inst->lay.prefill_cp);
        else if (a->status == KVS_EINVAL && (a->instance != meant.instance || a->dp_rank != meant.dp_rank))
            snprintf(why, sizeof why, "its address '%s' reaches prefill instance %llu group %lld, "
                     "not instance %llu group %lld: fix that rank's address",
                     p->name != NULL ? p->name : "?", (unsigned long long)a->instance,
                     (long long)a->dp_rank, (unsigned long long)meant.instance,
                     (long long)meant.dp_rank);
        else if (a->status == KVS_EINVAL)
            snprintf(why, sizeof why, "this decode rank is not one of its targets: check the "
                     "TP and PP sizes declared for its instance");
        else if (a->status != KVS_EFINGERPRINT ||
                 kvs__fingerprint_check(&p->inst->fp, &a->fp, why, sizeof why) == KVS_OK)
            snprintf(why, sizeof why, "%s", kvs_strerror(a->status));
        KVS__MFAIL(h->m, status, "prefill %s %s the registration: %s",
                   kvs__peer_name(p, name, sizeof name), cp_wrong ? "cannot take" : "refused",
                   why);
        kvs_log_write(&h->m->log, KVS_LOG_ERROR, "%s", h->m->err.msg);
        /* It never accepted this session (or is not the rank meant), so no
         * room of ours goes to it and it never writes into one: its (failed)
         * report of every open room is in. */
        kvs__peer_reports_failed(d, p, status);
        return;
    }
    p->ready = true;
    p->lost = false;
    p->session = msg->session;
    if (d->ring != NULL) {
        kvs_msg_t wm = {.type = KVS_MSG_WATERMARK};
        const kvs_watermark_t now = kvs_ring_watermark(d->ring);
        wm.u.wm = (kvs_msg_watermark_t){.round = now.round, .offset = now.offset};
        kvs__send(h, p, &wm);
    }
}

/* ---- requests --------------------------------------------------------------- */

/* The room block: the room, its chunks, both bitmaps, its page list and
 * (with scoped keys) its writers' keys of every chunk in one allocation,
 * zeroed. */
static kvs__droom_t *kvs__droom_alloc(kvs_decode_t *d, int64_t chunks, int64_t words,
                                      int64_t pages, int64_t writers)
{
    const size_t nc = (size_t)(chunks > 0 ? chunks : 1), np = (size_t)(pages > 0 ? pages : 1);
    const size_t nk = d->keys.scoped ? (size_t)chunks * (size_t)writers : 0;
    const size_t bytes = sizeof(kvs__droom_t) + nc * sizeof(kvs__dchunk_t) +
                         (nc + 1) * (size_t)words * sizeof(uint64_t) + np * sizeof(int64_t) +
                         nk * sizeof(kvs__wkeys_t);
    kvs__droom_t *r = kvs__blocks_get(&d->h.blocks, bytes);
    if (r == NULL)
        return NULL;
    _Static_assert(sizeof(kvs__droom_t) % alignof(kvs__dchunk_t) == 0 &&
                       sizeof(kvs__dchunk_t) % alignof(uint64_t) == 0 &&
                       alignof(kvs__wkeys_t) <= alignof(int64_t),
                   "the room block's parts stay aligned");
    r->chunks = (kvs__dchunk_t *)(r + 1);
    r->arrived = (uint64_t *)(r->chunks + nc);
    r->reported = r->arrived + nc * (size_t)words;
    r->pages = (int64_t *)(r->reported + words);
    r->keys = nk > 0 ? (kvs__wkeys_t *)(void *)(r->pages + np) : NULL;
    return r;
}

int kvs_decode_room_open_peer(kvs_decode_t *d, uint64_t room, kvs_peer_t peer,
                              int64_t base_tokens, int64_t total_tokens, const int64_t *pages,
                              int64_t num_pages)
{
    if (d == NULL)
        return KVS_EINVAL;
    kvs_manager_t *m = d->h.m;
    /* The default instance is made from the config; others are declared. */
    const bool fallback = peer.instance == 0 && peer.dp_rank == 0;
    kvs__inst_t *inst = fallback ? kvs__inst_get(&d->h, peer) : kvs__inst_find(&d->h, peer);
    if (inst == NULL)
        return fallback ? m->err.status
                        : KVS__MFAIL(m, KVS_ENOENT, "room %llu names prefill instance %llu "
                                     "group %lld, which was never declared: "
                                     "kvs_decode_add_instance first", (unsigned long long)room,
                                     (unsigned long long)peer.instance, (long long)peer.dp_rank);
    /* Connected on first use; a writer that cannot be reached is lost (and
     * retried) and fails the room below. */
    int rc = kvs__connect_inst(d, inst);
    if (rc == KVS_ESTATE)
        return rc;
    /* This rank's pages; the prefix must also start a prefill page (the
     * grid's chunks start on both sides' pages: docs/kinds/page-sizes.md). */
    const int64_t ps = inst->lay.decode_page_size, pps = inst->lay.page_size;
    const kvs__peer_t *lost = NULL;
    for (int64_t i = 0; i < inst->npeers; i++) {
        const kvs__peer_t *p = &inst->peers[i];
        if (p->lost && lost == NULL)
            lost = p;
        if (p->refused != KVS_OK) { /* it would never take part: fail now, not never */
            char name[96];
            return KVS__MFAIL(m, p->refused, "room %llu: prefill %s refused the "
                              "registration (%s): fix the configuration mismatch and "
                              "recreate the handler", (unsigned long long)room,
                              kvs__peer_name(p, name, sizeof name), kvs_strerror(p->refused));
        }
    }
    if (base_tokens < 0 || total_tokens < base_tokens || (pages == NULL && num_pages > 0))
        return KVS__MFAIL(m, KVS_EINVAL, "room %llu: need 0 <= base_tokens <= total_tokens "
                          "and a page list", (unsigned long long)room);
    if (base_tokens % ps != 0 || base_tokens % pps != 0 || lost != NULL) {
        const int status = lost != NULL ? KVS_EPEER : KVS_EPREFIX_ALIGN;
        char name[96];
        if (lost != NULL)
            KVS__MFAIL(m, KVS_EPEER, "room %llu: prefill %s is unreachable (its connection "
                       "died or was never made; reconnecting): the request fails now, retry "
                       "it once the instance's writers are back", (unsigned long long)room,
                       kvs__peer_name(lost, name, sizeof name));
        else if (ps == pps)
            KVS__MFAIL(m, KVS_EPREFIX_ALIGN, "room %llu: cached prefix %lld is not a multiple "
                       "of the page size %lld", (unsigned long long)room,
                       (long long)base_tokens, (long long)ps);
        else
            KVS__MFAIL(m, KVS_EPREFIX_ALIGN, "room %llu: cached prefix %lld is not a multiple "
                       "of both page sizes (this decode's %lld, the prefill's %lld): cache "
                       "a prefix of whole pages on both sides", (unsigned long long)room,
                       (long long)base_tokens, (long long)ps, (long long)pps);
        /* The prefill ranks hold this request too: tell them at once. */
        kvs_msg_t msg = {.type = KVS_MSG_ABORT};
        msg.u.abort = (kvs_msg_abort_t){.room = room, .status = status};
        for (int64_t i = 0; i < inst->npeers; i++)
            kvs__send(&d->h, &inst->peers[i], &msg);
        kvs__room_reject(&d->h, room, inst->ref, status);
        return status;
    }
    const int64_t want_pages = kvs__ceil_div(total_tokens - base_tokens, ps);
    if (num_pages != want_pages)
        return KVS__MFAIL(m, KVS_EINVAL, "room %llu: %lld tokens after the prefix need "
                          "%lld pages, got %lld", (unsigned long long)room,
                          (long long)(total_tokens - base_tokens), (long long)want_pages,
                          (long long)num_pages);
    for (int64_t i = 0; i < num_pages; i++)
        if (pages[i] < 0 || pages[i] >= m->kv.num_pages)
            return KVS__MFAIL(m, KVS_ERANGE, "room %llu: page id %lld outside the KV pool "
                              "of %lld pages", (unsigned long long)room, (long long)pages[i],
                              (long long)m->kv.num_pages);
    if (kvs__room_get(&d->h, room) != NULL)
        return KVS__MFAIL(m, KVS_EALREADY, "room %llu is already open",
                          (unsigned long long)room);
    const bool staging = inst->path == KVS_PATH_STAGING;
    const int64_t chunks = staging ? kvs_grid_num_chunks(&inst->lay, num_pages) : 0;
    kvs__droom_t *r = kvs__droom_alloc(d, chunks, inst->words, num_pages, inst->npeers);
    if (r == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating room %llu failed", (unsigned long long)room);
    r->base_tokens = base_tokens;
    r->total = total_tokens;
    r->num_pages = num_pages;
    r->num_chunks = chunks;
    if (num_pages > 0)
        memcpy(r->pages, pages, (size_t)num_pages * sizeof *pages);
    for (int64_t i = 0; i < chunks; i++) {
        kvs__chunk_plan_t plan;
        rc = kvs__chunk_plan(&inst->lay, m->cfg.tp_rank, inst->decode_stage, base_tokens,
                             total_tokens, i, &plan);
        if (rc != KVS_OK) {
            kvs__blocks_put(&d->h.blocks, r);
            return KVS__MFAIL(m, rc, "room %llu: chunk %lld has no place on the grid",
                              (unsigned long long)room, (long long)i);
        }
        r->chunks[i] = (kvs__dchunk_t){.tokens = plan.tokens, .page_start = plan.page_start,
                                       .num_pages = plan.num_pages,
                                       .token_start = plan.token_start,
                                       .region_bytes = plan.region_bytes,
                                       .keys = r->keys != NULL ? r->keys + i * inst->npeers
                                                               : NULL};
        const kvs_chunk_t ch = kvs__dchunk_of(&r->chunks[i], i);
        kvs__dchunk_t *c = &r->chunks[i];
        c->want = kvs_layout_chunk_arrivals(&inst->lay, total_tokens, &ch);
        if (c->want <= 0 ||
            kvs_layout_cp_writers(&inst->lay, total_tokens, &ch, &c->first_cp, &c->ncp) !=
                KVS_OK) {
            kvs__blocks_put(&d->h.blocks, r);
            return KVS__MFAIL(m, KVS_ERANGE, "room %llu: chunk %lld has no prefill CP rank "
                              "to write it", (unsigned long long)room, (long long)i);
        }
    }
    /* Every chunk of every open room may wait for ring space at once. */
    rc = kvs__fifo_reserve(&d->wanted, d->open_chunks + (uint64_t)chunks);
    if (rc != KVS_OK) {
        kvs__blocks_put(&d->h.blocks, r);
        return KVS__MFAIL(m, rc, "room %llu: no room to queue its %lld chunks",
                          (unsigned long long)room, (long long)chunks);
    }
    rc = kvs__room_add(&d->h, &r->base, room, inst);
    if (rc != KVS_OK) {
        kvs__blocks_put(&d->h.blocks, r);
        return KVS__MFAIL(m, rc, "room table full (%u rooms): raise max_rooms or finish "
                          "requests first", m->cfg.max_rooms);
    }
    d->open_chunks += (uint64_t)chunks;
    kvs_msg_t msg = {.type = KVS_MSG_ROOM};
    msg.u.room = (kvs_msg_room_t){.room = room, .base_tokens = base_tokens,
                                  .total_tokens = total_tokens, .num_pages = num_pages};
    for (int64_t i = 0; i < inst->npeers; i++) {
        kvs__send(&d->h, &inst->peers[i], &msg);
        for (int64_t first = 0; !staging && first < num_pages; first += KVS_WIRE_PAGES_PER_MSG) {
            kvs_msg_t pm = {.type = KVS_MSG_PAGES};
            pm.u.pages.room = room;
            pm.u.pages.first = first;
            const int64_t n = num_pages - first;
            pm.u.pages.count = (uint32_t)(n < KVS_WIRE_PAGES_PER_MSG ? n : KVS_WIRE_PAGES_PER_MSG);
            memcpy(pm.u.pages.ids, pages + first, pm.u.pages.count * sizeof *pages);
            kvs__send(&d->h, &inst->peers[i], &pm);
        }
    }
    return KVS_OK;
}

int kvs_decode_room_open(kvs_decode_t *d, uint64_t room, int64_t base_tokens,
                         int64_t total_tokens, const int64_t *pages, int64_t num_pages)
{
    return kvs_decode_room_open_peer(d, room, (kvs_peer_t){0, 0}, base_tokens, total_tokens,
                                     pages, num_pages);
}

/* ---- message handling ------------------------------------------------------- */

static void kvs__answer(kvs_decode_t *d, kvs__peer_t *p, const kvs__droom_t *r, int64_t chunk,
                        int status)
{
    kvs_msg_t msg = {.type = KVS_MSG_STAGING_RSP};
    msg.u.rsp = (kvs_msg_staging_rsp_t){.room = r->base.id, .chunk = chunk, .status = status};
    if (status == KVS_OK) {
        const kvs__dchunk_t *c = &r->chunks[chunk];
        msg.u.rsp.offset = c->alloc.offset;
        msg.u.rsp.round = c->alloc.round;
        msg.u.rsp.end = c->alloc.end;
        if (c->keys != NULL) { /* this writer's keys of the region, and no other */
            msg.u.rsp.rkey = c->keys[p->index].rkey[0];
            msg.u.rsp.rkey_v = c->keys[p->index].rkey[1];
        }
    }
    kvs__send(&d->h, p, &msg);
}

/* Tries to assign chunk's region; answers every writer when it succeeds. */
static int kvs__allocate(kvs_decode_t *d, kvs__droom_t *r, int64_t chunk)
{
    kvs__dchunk_t *c = &r->chunks[chunk];
    kvs__inst_t *inst = r->base.inst;
    /* An empty range is one metadata-only chunk: no region to assign. */
    int rc = c->region_bytes == 0 ? KVS_OK
                                  : kvs_ring_assign(d->ring, (uint64_t)c->region_bytes, &c->alloc);
    if (rc == KVS_ERING_LIVE)
        return rc;
    if (rc != KVS_OK) {
        for (int64_t i = 0; i < inst->npeers; i++)
            if (!inst->peers[i].silent && kvs__dchunk_writer(c, &inst->peers[i]))
                kvs__answer(d, &inst->peers[i], r, chunk, rc);
        kvs__room_fail(&d->h, &r->base, rc, NULL);
        return rc;
    }
    c->state = KVS__DCH_ALLOCATED;
    kvs__note_ring(d);
    /* Each writer (connected: a lost one's room fails anyway) gets exactly
     * its bytes of the region; a grant that fails fails the room, and the
     * region, held until every writer reported, takes what was granted
     * back with it. */
    const kvs_chunk_t ch = kvs__dchunk_of(c, chunk);
    for (int64_t i = 0; c->keys != NULL && c->region_bytes > 0 && i < inst->npeers && rc == KVS_OK;
         i++) {
        const kvs__peer_t *p = &inst->peers[i];
        kvs_cp_part_t part;
        if (p->conn == NULL || p->silent || !kvs__dchunk_writer(c, p)) /* no bytes */
            continue;
        rc = kvs_layout_cp_part(&inst->lay, d->h.m->cfg.tp_rank, inst->decode_stage, r->total,
                                &ch, p->cp_rank, &part);
        if (rc == KVS_OK && part.len_bytes == 0)
            continue; /* a hybrid part with no bytes (with CP): it writes nothing */
        if (rc == KVS_OK)
            rc = kvs__wkeys_grant(&d->keys, &d->h, p, c->alloc.offset, r->total, &part,
                                  &c->keys[i]);
        else
            KVS__MFAIL(d->h.m, rc, "chunk %lld has no part of prefill CP rank %lld",
                       (long long)chunk, (long long)p->cp_rank);
    }
    if (rc != KVS_OK) {
        kvs_log_write(&d->h.m->log, KVS_LOG_ERROR, "decode %lld: room %llu chunk %lld: %s",
                      (long long)d->h.m->cfg.tp_rank, (unsigned long long)r->base.id,
                      (long long)chunk, d->h.m->err.msg);
        for (int64_t i = 0; i < inst->npeers; i++)
            if (!inst->peers[i].silent && kvs__dchunk_writer(c, &inst->peers[i]))
                kvs__answer(d, &inst->peers[i], r, chunk, rc);
        kvs__room_fail(&d->h, &r->base, rc, NULL);
        return rc;
    }
    /* its writers asked; the others (silent, or of CP ranks not meeting
     * it) write nothing */
    for (int64_t i = 0; i < inst->npeers; i++)
        if (!inst->peers[i].silent && kvs__dchunk_writer(c, &inst->peers[i]))
            kvs__answer(d, &inst->peers[i], r, chunk, KVS_OK);
    return KVS_OK;
}

/* The room of a message from p, or NULL when p's instance has no such room. */
static kvs__droom_t *kvs__room_of(kvs_decode_t *d, const kvs__peer_t *p, uint64_t room)
{
    kvs__room_t *r = kvs__room_get(&d->h, room);
    return r != NULL && r->inst == p->inst ? kvs__droom(r) : NULL;
}

static void kvs__on_staging_req(kvs_decode_t *d, kvs__peer_t *p, const kvs_msg_staging_req_t *q)
{
    kvs__droom_t *r = kvs__room_of(d, p, q->room);
    if (r == NULL || p->inst->path != KVS_PATH_STAGING || p->silent) {
        kvs__reject(&d->h);
        kvs_msg_t msg = {.type = KVS_MSG_STAGING_RSP};
        msg.u.rsp = (kvs_msg_staging_rsp_t){.room = q->room, .chunk = q->chunk,
                                            .status = KVS_ENOENT};
        kvs__send(&d->h, p, &msg);
        return;
    }
    if (q->chunk < 0 || q->chunk >= r->num_chunks ||
        q->tokens != r->chunks[q->chunk].tokens || q->pages != r->chunks[q->chunk].num_pages ||
        !kvs__dchunk_writer(&r->chunks[q->chunk], p)) {
        kvs__reject(&d->h);
        kvs__room_fail(&d->h, &r->base, KVS_EPROTO, NULL);
        return;
    }
    if (r->base.status != KVS_OK) {
        kvs__answer(d, p, r, q->chunk, r->base.status);
        return;
    }
    kvs__room_touch(&d->h, &r->base);
    kvs__dchunk_t *c = &r->chunks[q->chunk];
    if (c->state == KVS__DCH_IDLE) {
        if (kvs__allocate(d, r, q->chunk) == KVS_ERING_LIVE) {
            c->state = KVS__DCH_WANTED;
            if (!kvs__fifo_push(&d->wanted, (kvs__ref_t){r->base.id, 0, q->chunk}))
                kvs__room_fail(&d->h, &r->base, KVS_EFULL, NULL);
        }
    } else if (c->state != KVS__DCH_WANTED) {
        kvs__answer(d, p, r, q->chunk, KVS_OK); /* a duplicate gets the same answer */
    }
}

/* A hybrid layout's scatter of the part of CP rank `cp` of chunk `chunk`
 * (the chunk itself with CP 1): every TP writer's block of the part
 * (hybrid_copy.h), a hybrid region of the part's tokens at the part's
 * offset; its window rows into the part's pages, and the state (in the
 * part ending at the request's end alone) into the room's state slot. */
static int kvs__scatter_hybrid(kvs_decode_t *d, const kvs__droom_t *r, int64_t chunk,
                               int64_t cp)
{
    const kvs_manager_t *m = d->h.m;
    const kvs__inst_t *inst = r->base.inst;
    const kvs_layout_t *lay = &inst->lay;
    const kvs__dchunk_t *c = &r->chunks[chunk];
    const kvs_chunk_t ch = kvs__dchunk_of(c, chunk);
    kvs_cp_part_t at;
    int rc = kvs_layout_cp_part(lay, m->cfg.tp_rank, inst->decode_stage, r->total, &ch, cp, &at);
    if (rc != KVS_OK || at.len_bytes == 0)
        return rc; /* no bytes in this part (a stage's part before the window) */
    /* the part starts a decode page (its range and the chunk both do) */
    const int64_t skip = (at.token_start - c->token_start) / lay->decode_page_size;
    const kvs__hyb_copy_t hc = {
        .role = KVS_ROLE_DECODE, .lay = lay, .stage = inst->decode_stage, .total = r->total,
        .chunk = {.index = chunk, .page_start = c->page_start + skip,
                  .token_start = at.token_start, .token_end = at.token_end},
        .pages = r->pages + c->page_start + skip,
        .state_slot = r->base.has_state_slot ? r->base.state_slot : -1};
    /* in groups of 64 blocks: a later group's copies run after an earlier
     * one's on the stream, so of writers replicating a head the last still
     * lands last */
    kvs__hyb_block_t blocks[64];
    for (int64_t i0 = 0; i0 < lay->tp_writers && rc == KVS_OK; i0 += 64) {
        const int64_t n = kvs__min_i64(64, lay->tp_writers - i0);
        for (int64_t k = 0; k < n; k++) {
            kvs_hybrid_writer_t hw;
            rc = kvs_layout_hybrid_writer(lay, m->cfg.tp_rank, inst->decode_stage, i0 + k,
                                          r->total, &hc.chunk, &hw);
            if (rc != KVS_OK)
                return rc;
            blocks[k] = (kvs__hyb_block_t){m->cfg.tp_rank, i0 + k,
                                           d->ring_addr + c->alloc.offset +
                                               (uint64_t)at.offset_bytes +
                                               (uint64_t)hw.w.offset_bytes};
        }
        rc = kvs__hybrid_copy(d->h.dev, d->h.stream, m, &hc, blocks, n, d->parts,
                              KVS_COPY_PARTS_MAX);
    }
    return rc;
}

/* One fused scatter of d->parts[0, n) (their blocks' starts), then of
 * their draft parts (draft_copy.h): writers replicating a head keep their
 * order in both, so the last one's bytes land last. */
static int kvs__scatter_parts(kvs_decode_t *d, const kvs_layout_t *lay,
                              const kvs_copy_desc_t *desc, int64_t n)
{
    const int rc = kvs__dev_scatter_parts(d->h.dev, d->h.stream, desc, d->parts, n);
    return rc != KVS_OK ? rc
                        : kvs__draft_copy(d->h.dev, d->h.stream, d->h.m, lay, false, desc,
                                          d->parts, n);
}

static void kvs__scatter(kvs_decode_t *d, kvs__droom_t *r, int64_t chunk)
{
    kvs_manager_t *m = d->h.m;
    const kvs__inst_t *inst = r->base.inst;
    const kvs_layout_t *lay = &inst->lay;
    kvs__dchunk_t *c = &r->chunks[chunk];
    const kvs_chunk_t ch = kvs__dchunk_of(c, chunk);
    /* One fused scatter of every writer's block per CP part of the chunk
     * (with CP 1 the one part is the chunk), so each token row of the pool
     * is written once, whole (KVS_COPY_PARTS_MAX parts at a time). A part
     * is a region of its own tokens at its offset (context-parallel.md),
     * scattered to the decode pages from its first token on: it starts a
     * decode page (its range and the chunk both do). Writers that
     * replicate a head (prefill TP > heads) are consecutive and wrote the
     * same bytes: the later one's block replaces the earlier's part, so the
     * last is scattered, as when each writer's block was scattered in
     * turn. */
    const bool hybrid = kvs__hybrid(lay);
    int rc = KVS_OK;
    /* a hybrid layout: per CP part, the empty chunk's too (its state) */
    for (int64_t cp = c->first_cp; hybrid && cp < c->first_cp + c->ncp && rc == KVS_OK; cp++)
        rc = kvs__scatter_hybrid(d, r, chunk, cp);
    for (int64_t cp = c->first_cp;
         cp < c->first_cp + c->ncp && rc == KVS_OK && c->tokens > 0 && !hybrid; cp++) {
        kvs_cp_part_t at;
        rc = kvs_layout_cp_part(lay, m->cfg.tp_rank, inst->decode_stage, r->total, &ch, cp, &at);
        if (rc != KVS_OK)
            break;
        const int64_t tokens = at.token_end - at.token_start;
        const int64_t skip = (at.token_start - c->token_start) / lay->decode_page_size;
        const kvs_copy_desc_t desc = {
            .k_base = m->k_base, .v_base = m->v_base, .local_heads = m->kv.local_heads,
            .head_dim = lay->head_dim, .elem_bytes = lay->elem_bytes,
            .page_size = lay->decode_page_size, .pages = r->pages + c->page_start + skip,
            .num_pages = kvs__ceil_div(tokens, lay->decode_page_size), .tokens = tokens,
            .layer_begin = 0, .layer_count = m->cfg.layers,
            .staging_slot_begin = 0, .staging_layer_slots = m->cfg.layers,
            .planes = lay->planes, .ks_base = m->ks_base, .vs_base = m->vs_base,
            .scale_bytes = lay->scale_bytes};
        int64_t n = 0;
        for (int64_t i = 0; i < lay->tp_writers && rc == KVS_OK; i++) {
            kvs_writer_t w;
            rc = kvs_layout_writer(lay, m->cfg.tp_rank, inst->decode_stage, i, tokens, &w);
            if (rc != KVS_OK)
                break;
            const kvs_copy_part_t part = {
                .head_start = w.heads.dst_start, .num_heads = w.heads.num_heads,
                .staging_addr = d->ring_addr + c->alloc.offset + (uint64_t)at.offset_bytes +
                                (uint64_t)w.offset_bytes};
            if (n > 0 && d->parts[n - 1].head_start == part.head_start) {
                d->parts[n - 1] = part; /* a replica */
                continue;
            }
            if (n == KVS_COPY_PARTS_MAX) {
                rc = kvs__scatter_parts(d, lay, &desc, n);
                n = 0;
            }
            if (rc == KVS_OK)
                d->parts[n++] = part;
        }
        if (rc == KVS_OK && n > 0)
            rc = kvs__scatter_parts(d, lay, &desc, n);
    }
    /* The event is recorded even after a refused copy: one refused part-way
     * may have left its first parts enqueued (the core's default copy runs
     * one op per part), and the region must stay allocated until they ran. */
    const int copy_rc = rc;
    rc = kvs__dev_event_record(d->h.dev, d->h.stream, &c->event);
    if (rc == KVS_OK && !kvs__fifo_push(&d->scatters, (kvs__ref_t){r->base.id, 0, chunk}))
        rc = KVS_EFULL;
    if (rc != KVS_OK || copy_rc != KVS_OK) {
        const int why = copy_rc != KVS_OK ? copy_rc : rc;
        kvs_log_write(&m->log, KVS_LOG_ERROR, "decode %lld: scatter of room %llu chunk %lld "
                 "failed: %s", (long long)m->cfg.tp_rank, (unsigned long long)r->base.id,
                 (long long)chunk, kvs_strerror(why));
        if (rc == KVS_OK) {
            c->state = KVS__DCH_SCATTERING; /* freed when the event completes */
        } else {
            if (c->event != NULL)
                kvs__dev_event_destroy(d->h.dev, c->event);
            c->event = NULL; /* the region stays allocated until every writer reported */
        }
        kvs__room_fail(&d->h, &r->base, why, NULL);
        return;
    }
    c->state = KVS__DCH_SCATTERING;
    d->h.stats.copies++;
}

static void kvs__on_chunk_ready(kvs_decode_t *d, kvs__peer_t *p, const kvs_msg_chunk_ready_t *q)
{
    kvs__droom_t *r = kvs__room_of(d, p, q->room);
    const kvs__inst_t *inst = p->inst;
    /* Range checked before they are combined: a hostile writer or stage
     * must not overflow the index. */
    const int64_t W = inst->lay.tp_writers;
    const bool in_range = q->writer >= 0 && q->writer < inst->lay.prefill_cp * W &&
                          q->stage >= inst->first_stage &&
                          q->stage < inst->first_stage + inst->stages;
    /* writer c * W + j is TP writer j of CP rank c: peer (c * tp_sources +
     * j) * stages + s (instance.h) */
    const int64_t idx = in_range ? ((q->writer / W) * inst->lay.tp_sources + q->writer % W) *
                                           inst->stages +
                                       (q->stage - inst->first_stage)
                                 : -1;
    if (r == NULL || q->chunk < 0 || q->chunk >= r->num_chunks || idx != p->index ||
        !kvs__dchunk_writer(&r->chunks[q->chunk], p) ||
        r->chunks[q->chunk].state != KVS__DCH_ALLOCATED ||
        q->page_start != r->chunks[q->chunk].page_start ||
        q->pages != r->chunks[q->chunk].num_pages) {
        kvs__reject(&d->h);
        return;
    }
    kvs__dchunk_t *c = &r->chunks[q->chunk];
    uint64_t *bits = r->arrived + q->chunk * inst->words;
    if (kvs__bit(bits, idx)) {
        kvs__reject(&d->h); /* duplicate */
        return;
    }
    kvs__bit_set(bits, idx);
    kvs__room_touch(&d->h, &r->base);
    if (++c->arrivals == c->want && r->base.status == KVS_OK) {
        r->base.bytes += (uint64_t)c->region_bytes;
        kvs__scatter(d, r, q->chunk);
    }
}

/* A part of the room's aux payload, from its peer 0 (the one prefill rank
 * that gives it to this rank), in order: the link delivers in order and
 * drops duplicates, so anything else is a broken peer's. */
static void kvs__on_aux(kvs_decode_t *d, kvs__peer_t *p, const kvs_msg_aux_t *a)
{
    kvs__droom_t *r = kvs__room_of(d, p, a->room);
    if (r == NULL || p->index != 0 || kvs__bit(r->reported, p->index) || a->count == 0 ||
        a->total > d->h.m->cfg.max_aux_bytes || a->first != r->base.aux_got ||
        (a->first > 0 && a->total != r->base.aux_bytes) || a->count > a->total - a->first) {
        kvs__reject(&d->h);
        return;
    }
    kvs__room_touch(&d->h, &r->base);
    if (a->first == 0) {
        uint8_t *buf = kvs__blocks_fit(&d->h.blocks, r->base.aux, a->total);
        if (buf == NULL) {
            kvs__room_fail(&d->h, &r->base, KVS_ENOMEM, NULL);
            return;
        }
        r->base.aux = buf;
        r->base.aux_bytes = a->total;
    }
    memcpy(r->base.aux + a->first, a->data, a->count);
    r->base.aux_got += a->count;
}

static void kvs__on_report(kvs_decode_t *d, kvs__peer_t *p, const kvs_msg_status_t *s)
{
    kvs__droom_t *r = kvs__room_of(d, p, s->room);
    if (r == NULL || kvs__bit(r->reported, p->index)) {
        kvs__reject(&d->h);
        return;
    }
    kvs__bit_set(r->reported, p->index);
    r->reports++;
    kvs__room_touch(&d->h, &r->base);
    const kvs__inst_t *inst = p->inst;
    const int status = s->status;
    /* Its aux payload, all of it, came first (a failed room drops it). */
    if (status == KVS_OK && s->aux_bytes != (p->index == 0 ? r->base.aux_got : 0))
        kvs__room_fail(&d->h, &r->base, KVS_EPROTO, NULL);
    if (status == KVS_OK)
        r->reports_ok++;
    else
        kvs__room_fail(&d->h, &r->base, status, NULL);
    int64_t first_layer = 0, layers = 0; /* the layers this writer's stage wrote */
    int64_t cs = r->base_tokens, ce = r->total; /* ... of the tokens of its CP rank */
    (void)kvs_layout_cp_range(&inst->lay, r->total, p->cp_rank, &cs, &ce);
    const int64_t tokens = ce - (cs > r->base_tokens ? cs : r->base_tokens);
    if (inst->path != KVS_PATH_STAGING && status == KVS_OK && !p->silent && tokens > 0 &&
        kvs_layout_stage_layers(&inst->lay, KVS_ROLE_PREFILL, p->pp_rank, &first_layer,
                                &layers) == KVS_OK)
        r->base.bytes += (uint64_t)tokens *
                         (uint64_t)d->h.m->kv.local_heads *
                         (uint64_t)(inst->lay.head_dim * inst->lay.elem_bytes +
                                    inst->lay.scale_bytes) * (uint64_t)layers *
                         (uint64_t)inst->lay.planes / (uint64_t)inst->lay.tp_writers;
    kvs__room_try_finish(d, r);
}

/* A prefill tells its failure at once, while writes it posted may still be
 * landing in this room's regions (or KV pages): the room fails now, but the
 * writer has reported only when its STATUS, sent after those writes
 * completed, arrives. Freeing on the ABORT would let them land in memory
 * already handed back (spec §9). */
static void kvs__on_abort(kvs_decode_t *d, kvs__peer_t *p, const kvs_msg_abort_t *a)
{
    kvs__droom_t *r = kvs__room_of(d, p, a->room);
    if (r == NULL || kvs__bit(r->reported, p->index)) {
        kvs__reject(&d->h);
        return;
    }
    kvs__room_fail(&d->h, &r->base, a->status != KVS_OK ? a->status : KVS_EPEER, p);
}

static void kvs__on_message(kvs__handler_t *h, kvs__peer_t *p, const kvs_msg_t *msg)
{
    kvs_decode_t *d = kvs__dec(h);
    switch (msg->type) {
    case KVS_MSG_STAGING_REQ:
        kvs__on_staging_req(d, p, &msg->u.req);
        break;
    case KVS_MSG_CHUNK_READY:
        kvs__on_chunk_ready(d, p, &msg->u.ready);
        break;
    case KVS_MSG_STATUS:
        kvs__on_report(d, p, &msg->u.status);
        break;
    case KVS_MSG_AUX:
        kvs__on_aux(d, p, &msg->u.aux);
        break;
    case KVS_MSG_ABORT:
        kvs__on_abort(d, p, &msg->u.abort);
        break;
    default:
        kvs__reject(h);
        break;
    }
}

/* ---- progress --------------------------------------------------------------- */

/* Completed scatters in stream order: free their regions. */
static int kvs__reap_scatters(kvs_decode_t *d)
{
    int done = 0;
    while (d->scatters.count > 0) {
        const kvs__ref_t ref = kvs__fifo_head(&d->scatters);
        kvs__droom_t *r = kvs__droom(kvs__room_get(&d->h, ref.room));
        kvs__dchunk_t *c = r != NULL ? &r->chunks[ref.chunk] : NULL;
        if (c != NULL && c->state == KVS__DCH_SCATTERING) {
            int rc = kvs__dev_event_query(d->h.dev, c->event);
            if (rc == KVS_EAGAIN)
                break;
            kvs__dev_event_destroy(d->h.dev, c->event);
            c->event = NULL;
            c->state = KVS__DCH_DONE;
            kvs__release_region(d, r, c);
            kvs__room_touch(&d->h, &r->base);
            if (rc == KVS_OK)
                r->scattered++;
            else
                kvs__room_fail(&d->h, &r->base, rc, NULL);
            kvs__room_try_finish(d, r);
        }
        kvs__fifo_pop(&d->scatters);
        done++;
    }
    return done;
}

/* Chunks that waited for ring space, in arrival order, whatever their
 * instance. */
static void kvs__retry_wanted(kvs_decode_t *d)
{
    while (d->wanted.count > 0) {
        const kvs__ref_t ref = kvs__fifo_head(&d->wanted);
        kvs__droom_t *r = kvs__droom(kvs__room_get(&d->h, ref.room));
        if (r != NULL && r->chunks[ref.chunk].state == KVS__DCH_WANTED) {
            if (r->base.status != KVS_OK)
                r->chunks[ref.chunk].state = KVS__DCH_IDLE;
            else if (kvs__allocate(d, r, ref.chunk) == KVS_ERING_LIVE)
                break;
        }
        kvs__fifo_pop(&d->wanted);
    }
}

static int kvs__advance(kvs__handler_t *h)
{
    kvs_decode_t *d = kvs__dec(h);
    int work = 0;
    if (h->stream != NULL && kvs__reap_scatters(d) > 0)
        work++;
    if (d->ring != NULL)
        kvs__retry_wanted(d);
    return work;
}

/* Bootstrapping until every writer acknowledged this rank's registration;
 * transferring once a writer's bytes arrived (or, on the direct and slice
 * paths, once a writer reported). */
static kvs_room_state_t kvs__room_state(const kvs__handler_t *h, const kvs__room_t *room)
{
    (void)h;
    const kvs__droom_t *r = (const kvs__droom_t *)room;
    const kvs__inst_t *inst = room->inst;
    for (int64_t i = 0; i < inst->npeers; i++)
        if (!inst->peers[i].ready)
            return KVS_ROOM_BOOTSTRAPPING;
    if (r->reports > 0 || r->scattered > 0)
        return KVS_ROOM_TRANSFERRING;
    for (int64_t i = 0; i < r->num_chunks; i++)
        if (r->chunks[i].arrivals > 0)
            return KVS_ROOM_TRANSFERRING;
    return KVS_ROOM_WAITING;
}

static int kvs__role_init(kvs__handler_t *h)
{
    kvs_decode_t *d = kvs__dec(h);
    kvs_manager_t *m = h->m;
    d->ring = m->ring;
    if (m->staging_count > 0) {
        d->ring_addr = m->staging_addr[0];
        d->ring_bytes = m->staging_bytes;
        d->ring_rkey = m->staging_rkey[0];
    }
    kvs__ring_keys_init(&d->keys, h);
    const uint32_t queue = m->cfg.ring_max_live > m->cfg.max_rooms ? m->cfg.ring_max_live
                                                                    : m->cfg.max_rooms;
    /* A scattering chunk holds a live region, or is the metadata-only chunk
     * of an empty room (at most one per room): both at once can be in flight. */
    const uint64_t scatter_bound = (uint64_t)m->cfg.ring_max_live + m->cfg.max_rooms;
    const uint32_t scatters = scatter_bound < UINT32_MAX ? (uint32_t)scatter_bound : UINT32_MAX;
    d->parts = calloc(KVS_COPY_PARTS_MAX, sizeof *d->parts);
    if (d->parts == NULL || kvs__fifo_init(&d->scatters, scatters) != KVS_OK ||
        kvs__fifo_init(&d->wanted, queue) != KVS_OK)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the decode handler's queues failed");
    kvs_log_write(&m->log, KVS_LOG_INFO, "decode %lld: %s path, %lld writer(s) per chunk",
             (long long)m->cfg.tp_rank, kvs_path_name(m->path),
             (long long)m->layout.expected_arrivals);
    return KVS_OK;
}

static void kvs__role_fini(kvs__handler_t *h)
{
    kvs_decode_t *d = kvs__dec(h);
    kvs__fifo_fini(&d->scatters);
    kvs__fifo_fini(&d->wanted);
    free(d->parts);
}

static const kvs__role_t kvs__decode_role = {
    .role = KVS_ROLE_DECODE, .accepts = false, .role_init = kvs__role_init,
    .role_fini = kvs__role_fini, .on_register = kvs__on_ack, .on_connected = kvs__on_connected,
    .on_challenge = kvs__on_challenge,
    .on_message = kvs__on_message, .advance = kvs__advance, .on_fail = kvs__on_fail,
    .on_stalled = kvs__on_stalled, .on_peer_lost = kvs__on_peer_lost, .room_free = kvs__room_free,
    .room_state = kvs__room_state};

/* ---- the public calls ------------------------------------------------------- */

int kvs_decode_create(kvs_manager_t *m, kvs_decode_t **out)
{
    return kvs__handler_create(m, &kvs__decode_role, sizeof **out, (void **)out);
}
