/*
 * decode.c - the decode side of the staging protocol (spec §6-§8).
 *
 * Creation runs the init guards of spec §8 (kvs__manager_handler_check).
 * Then the handler is a state machine driven by kvs_decode_progress():
 * - connect: REGISTER (ring, geometry, fingerprint; KV layer keys on the
 *   direct/slice paths) to every prefill rank that writes to this rank; on
 *   REGISTER_ACK the peer gets the current watermark at once;
 * - room_open: ROOM (+ PAGES on the direct/slice paths) to every peer;
 * - STAGING_REQ: assign the chunk's region from the ring (once; duplicates
 *   get the same answer) and answer STAGING_RSP, or OVERSIZED which fails
 *   the request; when the ring is at its live-allocation bound the chunk
 *   waits in a bounded queue until a region is freed;
 * - CHUNK_READY: count arrivals per chunk (each writer x prefill stage once);
 *   when all arrived, scatter every writer's block in one fused copy
 *   (scatter_parts: each token row written once, whole) on the scatter
 *   stream and record an event; when the event completes, free the region
 *   and send the new WATERMARK to every peer;
 * - STATUS / ABORT: a request is done when every peer reported success and
 *   every chunk was scattered; it fails on the first failure, told to every
 *   peer at once, and its regions are freed once every peer has reported
 *   (no writer can still write) and no scatter is in flight. A peer's report
 *   is its STATUS, which it sends once its posted writes completed; its
 *   ABORT only fails the room at once (writes may still be landing). A peer
 *   that refused the registration never writes: it counts as a failed report.
 * Messages that are malformed, stale or out of range are counted and dropped,
 * never used to address memory. Control messages travel on reliable links
 * (link.c: retransmitted until acknowledged, duplicates dropped).
 * A peer whose connection dies (crashed, restarted) is lost: it can write
 * nothing more, so its report of every open room is in (failed), new rooms
 * fail at once while it is away, and the handler reconnects with a doubling
 * wait and registers again; the new incarnation starts from a fresh link.
 */
#include "arith.h"
#include "channel.h"
#include "error.h"
#include "link.h"
#include "log.h"
#include "manager.h"
#include "results.h"
#include "table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVS__POLL_BATCH 16

typedef struct kvs__dpeer {
    kvs_conn_t *conn;           /* NULL until connected, and while lost */
    char *name;                 /* its fabric address, for reconnecting */
    int64_t tp_rank, pp_rank;
    bool acked;
    bool lost;                  /* its connection died; until it acknowledges a
                                   new registration */
    int refused;                /* status of a refused registration */
    uint64_t prefill_session;
    uint64_t reconnect_ns, reconnect_wait_ns;
} kvs__dpeer_t;

enum { KVS__DCH_IDLE, KVS__DCH_WANTED, KVS__DCH_ALLOCATED, KVS__DCH_SCATTERING, KVS__DCH_DONE };

typedef struct kvs__dchunk {
    uint8_t state;
    int64_t tokens, page_start, num_pages;
    int64_t region_bytes;
    kvs_ring_alloc_t alloc;
    int64_t arrivals;
    kvs_event_t *event;
} kvs__dchunk_t;

typedef struct kvs__droom {
    uint64_t id;
    int64_t base, total;
    int64_t *pages, num_pages;
    int64_t num_chunks, scattered;
    kvs__dchunk_t *chunks;
    uint64_t *arrived;          /* num_chunks * words bits: writer x stage */
    uint64_t *reported;         /* words bits: peers that sent STATUS/ABORT */
    int64_t reports, reports_ok;
    int status;                 /* first failure, KVS_OK while none */
    uint64_t open_ns, bytes;
    uint64_t last_ns;           /* last progress; the stall timeout runs from it */
} kvs__droom_t;

/* A (room, chunk) in a FIFO: scatters in stream order, chunks waiting for
 * ring space. */
typedef struct kvs__dref {
    uint64_t room;
    int64_t chunk;
} kvs__dref_t;

typedef struct kvs__dqueue {
    kvs__dref_t *items;
    uint32_t cap, head, count;
} kvs__dqueue_t;

struct kvs_decode {
    kvs_manager_t *m;           /* borrowed; outlives the handler */
    kvs_fabric_t *fab;
    kvs_device_t *dev;
    const kvs_layout_t *lay;    /* m->layout */
    kvs_path_t path;
    int64_t rank;               /* decode TP rank */
    int64_t stages;             /* prefill stages per decode stage: Pp / Dp */
    int64_t npeers, words;      /* W * stages peers; bitmap words per set */
    kvs__dpeer_t *peers;
    kvs_stream_t *stream;
    kvs_ring_t *ring;
    uint64_t ring_addr, ring_bytes, ring_rkey;
    kvs__kv_keys_t kv_keys;     /* direct/slice: KV layers open to peers */
    kvs__table_t rooms;
    kvs__results_t results;
    kvs__dqueue_t scatters, wanted; /* wanted holds up to open_chunks */
    kvs_copy_part_t *parts;     /* a chunk's scatter: one part per writer's
                                 * heads, up to KVS_COPY_PARTS_MAX at once */
    int64_t parts_cap;
    uint64_t open_chunks;       /* chunks of the open rooms */
    kvs_completion_t *cq;
    kvs__links_t links;         /* one reliable link per peer connection */
    kvs_handler_stats_t stats;
    uint64_t session;
    uint64_t next_check_ns;     /* no room's stall deadline is earlier */
};

/* ---- small helpers -------------------------------------------------------- */

static int kvs__dq_init(kvs__dqueue_t *q, uint32_t cap)
{
    q->items = calloc(cap, sizeof *q->items);
    q->cap = cap;
    q->head = q->count = 0;
    return q->items != NULL ? KVS_OK : KVS_ENOMEM;
}

/* Grows q to hold `need` entries, keeping their order (at room open, never
 * per message). */
static int kvs__dq_reserve(kvs__dqueue_t *q, uint64_t need)
{
    if (need <= q->cap)
        return KVS_OK;
    if (need > UINT32_MAX / 2)
        return KVS_EFULL;
    const uint32_t cap = (uint32_t)need > 2 * q->cap ? (uint32_t)need : 2 * q->cap;
    kvs__dref_t *items = malloc((size_t)cap * sizeof *items);
    if (items == NULL)
        return KVS_ENOMEM;
    for (uint32_t i = 0; i < q->count; i++)
        items[i] = q->items[(q->head + i) % q->cap];
    free(q->items);
    q->items = items;
    q->cap = cap;
    q->head = 0;
    return KVS_OK;
}

static bool kvs__dq_push(kvs__dqueue_t *q, uint64_t room, int64_t chunk)
{
    if (q->count == q->cap)
        return false;
    q->items[(q->head + q->count) % q->cap] = (kvs__dref_t){room, chunk};
    q->count++;
    return true;
}

static kvs__dref_t kvs__dq_pop(kvs__dqueue_t *q)
{
    kvs__dref_t r = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    return r;
}

static bool kvs__bit(const uint64_t *bits, int64_t i) { return (bits[i / 64] >> (i % 64)) & 1u; }
static void kvs__bit_set(uint64_t *bits, int64_t i) { bits[i / 64] |= 1ull << (i % 64); }

static uint64_t kvs__now(const kvs_decode_t *d) { return kvs__net_now_ns(d->fab); }

/* The room moved: its stall deadline starts over. */
static void kvs__touch(kvs_decode_t *d, kvs__droom_t *r)
{
    r->last_ns = kvs__now(d);
    const uint64_t due = kvs__sat_add_u64(r->last_ns, d->m->cfg.stall_timeout_ns);
    if (due < d->next_check_ns)
        d->next_check_ns = due;
}

static kvs__dpeer_t *kvs__peer_of(kvs_decode_t *d, const kvs_conn_t *conn, int64_t *idx)
{
    for (int64_t i = 0; i < d->npeers; i++) {
        if (d->peers[i].conn != NULL && d->peers[i].conn == conn) {
            *idx = i;
            return &d->peers[i];
        }
    }
    return NULL;
}

static void kvs__send(kvs_decode_t *d, kvs__dpeer_t *p, const kvs_msg_t *msg)
{
    if (p->conn == NULL)
        return;
    /* A dead connection is handled at the end of progress (the link
     * reports it), never from inside the caller's loops. */
    int rc = kvs__link_send(&d->links, p->conn, msg);
    if (rc != KVS_OK && rc != KVS_EPEER)
        kvs__log(&d->m->log, KVS_LOG_WARN, "decode %lld: sending %s to prefill %lld/%lld "
                 "failed: %s", (long long)d->rank, kvs__wire_type_name(msg->type),
                 (long long)p->tp_rank, (long long)p->pp_rank, kvs_strerror(rc));
}

static void kvs__broadcast_watermark(kvs_decode_t *d, kvs_watermark_t wm)
{
    kvs_msg_t msg = {.type = KVS_MSG_WATERMARK};
    msg.u.wm = (kvs_msg_watermark_t){.round = wm.round,
                                     .offset = wm.offset};
    for (int64_t i = 0; i < d->npeers; i++)
        if (d->peers[i].acked)
            kvs__send(d, &d->peers[i], &msg);
}

/* ---- rooms ------------------------------------------------------------------ */

static void kvs__room_free(kvs__droom_t *r)
{
    if (r == NULL)
        return;
    free(r->pages);
    free(r->chunks);
    free(r->arrived);
    free(r->reported);
    free(r);
}

static void kvs__release_region(kvs_decode_t *d, kvs__dchunk_t *c)
{
    if (c->region_bytes == 0)
        return;
    kvs_watermark_t wm;
    int rc = kvs_ring_free(d->ring, c->alloc.id, &wm);
    if (rc == KVS_OK)
        kvs__broadcast_watermark(d, wm);
}

/* Finishes the room when nothing can still touch it; returns true if gone. */
static bool kvs__room_try_finish(kvs_decode_t *d, kvs__droom_t *r)
{
    if (r->reports < d->npeers)
        return false;
    if (r->status == KVS_OK && r->reports_ok == d->npeers && r->scattered < r->num_chunks)
        return false;
    for (int64_t i = 0; i < r->num_chunks; i++)
        if (r->chunks[i].state == KVS__DCH_SCATTERING)
            return false;
    /* Every writer has reported: no write can land; release what is left. */
    for (int64_t i = 0; i < r->num_chunks; i++) {
        kvs__dchunk_t *c = &r->chunks[i];
        if (c->state == KVS__DCH_ALLOCATED)
            kvs__release_region(d, c);
        c->state = KVS__DCH_DONE;
    }
    if (r->status == KVS_OK && r->reports_ok < d->npeers)
        r->status = KVS_EPEER;
    kvs_room_result_t res = {.room = r->id, .status = r->status, .chunks = r->num_chunks,
                             .bytes = r->bytes, .open_ns = r->open_ns,
                             .done_ns = kvs__now(d)};
    kvs__results_push(&d->results, &res);
    if (r->status == KVS_OK)
        d->stats.rooms_ok++;
    else
        d->stats.rooms_failed++;
    d->open_chunks -= (uint64_t)r->num_chunks;
    kvs__table_del(&d->rooms, r->id);
    kvs__room_free(r);
    return true;
}

/* Fails the room (first failure wins) and tells every peer that has not
 * reported yet, except `from` (the peer that told us; -1 for none). */
static void kvs__room_fail_from(kvs_decode_t *d, kvs__droom_t *r, int status, int64_t from)
{
    if (r->status != KVS_OK)
        return;
    r->status = status;
    kvs_msg_t msg = {.type = KVS_MSG_ABORT};
    msg.u.abort = (kvs_msg_abort_t){.room = r->id, .status = status};
    for (int64_t i = 0; i < d->npeers; i++)
        if (!kvs__bit(r->reported, i) && i != from)
            kvs__send(d, &d->peers[i], &msg);
    kvs__log(&d->m->log, KVS_LOG_INFO, "decode %lld: room %llu failed: %s",
             (long long)d->rank, (unsigned long long)r->id, kvs_strerror(status));
}

static void kvs__room_fail(kvs_decode_t *d, kvs__droom_t *r, int status)
{
    kvs__room_fail_from(d, r, status, -1);
}

/* ---- creation --------------------------------------------------------------- */

void kvs_decode_destroy(kvs_decode_t *d)
{
    if (d == NULL)
        return;
    kvs_manager_t *m = d->m;
    if (d->rooms.keys != NULL) {
        for (uint32_t i = 0; i <= d->rooms.mask; i++)
            if (d->rooms.state[i] == 1) {
                kvs__droom_t *r = d->rooms.vals[i];
                for (int64_t c = 0; c < r->num_chunks; c++) {
                    kvs__dchunk_t *ch = &r->chunks[c];
                    if (ch->event != NULL)
                        kvs__dev_event_destroy(d->dev, ch->event);
                    /* The ring is the manager's and outlives this handler:
                     * give back what the handler took (no watermark to send,
                     * the connections go down below). */
                    if ((ch->state == KVS__DCH_ALLOCATED || ch->state == KVS__DCH_SCATTERING) &&
                        ch->region_bytes > 0)
                        (void)kvs_ring_free(d->ring, ch->alloc.id, NULL);
                }
                kvs__room_free(r);
            }
        kvs__table_fini(&d->rooms);
    }
    kvs__manager_close_kv(m, &d->kv_keys);
    kvs__links_fini(&d->links);
    for (int64_t i = 0; d->peers != NULL && i < d->npeers; i++) {
        if (d->peers[i].conn != NULL)
            d->fab->ops.disconnect(d->fab, d->peers[i].conn);
        free(d->peers[i].name);
    }
    if (d->stream != NULL)
        kvs__dev_stream_destroy(d->dev, d->stream);
    kvs__results_fini(&d->results);
    free(d->scatters.items);
    free(d->wanted.items);
    free(d->parts);
    free(d->cq);
    free(d->peers);
    m->handler = NULL;
    free(d);
}

int kvs_decode_create(kvs_manager_t *m, kvs_decode_t **out)
{
    if (out == NULL)
        return m != NULL ? KVS__MFAIL(m, KVS_EINVAL, "out must not be NULL") : KVS_EINVAL;
    *out = NULL;
    int rc;
    kvs_decode_t *d = kvs__manager_handler_new(m, KVS_ROLE_DECODE, sizeof *d, &rc);
    if (d == NULL)
        return rc;
    const kvs_layout_t lay = m->layout;
    const kvs_path_t path = m->path;
    d->m = m;
    d->next_check_ns = UINT64_MAX;
    d->fab = m->fab;
    d->dev = m->dev;
    d->lay = &m->layout;
    d->path = path;
    d->rank = m->cfg.tp_rank;
    d->session = m->cfg.session_id;
    d->stages = lay.prefill_pp / lay.decode_pp;
    d->npeers = lay.tp_writers * d->stages;
    d->words = (d->npeers + 63) / 64;
    d->ring = m->ring;
    if (m->staging_count > 0) {
        d->ring_addr = m->staging_addr[0];
        d->ring_bytes = m->staging_bytes;
        d->ring_rkey = m->staging_rkey[0];
    }
    const uint32_t queue = m->cfg.ring_max_live > m->cfg.max_rooms ? m->cfg.ring_max_live
                                                                    : m->cfg.max_rooms;
    /* A scattering chunk holds a live region, or is the metadata-only chunk
     * of an empty room (at most one per room): both at once can be in flight. */
    const uint64_t scatter_bound = (uint64_t)m->cfg.ring_max_live + m->cfg.max_rooms;
    const uint32_t scatters = scatter_bound < UINT32_MAX ? (uint32_t)scatter_bound : UINT32_MAX;
    d->peers = calloc((size_t)d->npeers, sizeof *d->peers);
    d->cq = calloc(KVS__POLL_BATCH, sizeof *d->cq);
    d->parts_cap = lay.tp_writers < KVS_COPY_PARTS_MAX ? lay.tp_writers : KVS_COPY_PARTS_MAX;
    d->parts = calloc((size_t)d->parts_cap, sizeof *d->parts);
    if (d->peers == NULL || d->cq == NULL || d->parts == NULL ||
        kvs__table_init(&d->rooms, m->cfg.max_rooms) != KVS_OK ||
        kvs__results_init(&d->results, 2 * m->cfg.max_rooms) != KVS_OK ||
        kvs__dq_init(&d->scatters, scatters) != KVS_OK ||
        kvs__dq_init(&d->wanted, queue) != KVS_OK ||
        kvs__links_init(&d->links, d->fab, (uint32_t)d->npeers, d->session,
                        m->cfg.retry_timeout_ns,
                        m->cfg.stall_timeout_ns / 32, m->cfg.stall_timeout_ns,
                        &d->stats) != KVS_OK) {
        kvs_decode_destroy(d);
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the decode handler's tables failed");
    }
    for (int64_t i = 0; i < d->npeers; i++) {
        d->peers[i].tp_rank = -1;
        d->peers[i].pp_rank = -1;
    }
    if (path == KVS_PATH_STAGING) {
        rc = kvs__dev_stream_create(d->dev, &d->stream);
        if (rc != KVS_OK) {
            kvs_decode_destroy(d);
            return KVS__MFAIL(m, rc, "device '%s' could not create the scatter stream (%s)",
                              m->dev->name, kvs_strerror(rc));
        }
    } else {
        rc = kvs__manager_open_kv(m, &d->kv_keys);
        if (rc != KVS_OK) {
            kvs_decode_destroy(d);
            return rc;
        }
    }
    kvs__log(&m->log, KVS_LOG_INFO, "decode %lld: %s path, %lld writer(s) per chunk",
             (long long)d->rank, kvs_path_name(path), (long long)lay.expected_arrivals);
    *out = d;
    return KVS_OK;
}

/* ---- registration ----------------------------------------------------------- */

/* REGISTER (+ LAYERS on the direct/slice paths) on p's connection. */
static void kvs__register(kvs_decode_t *d, kvs__dpeer_t *p)
{
    kvs_manager_t *m = d->m;
    const bool direct = d->path != KVS_PATH_STAGING;
    kvs_msg_t msg = {.type = KVS_MSG_REGISTER};
    kvs_msg_register_t *reg = &msg.u.reg;
    reg->tp_rank = d->rank;
    reg->tp_size = m->cfg.tp_size;
    reg->pp_rank = m->cfg.pp_rank;
    reg->pp_size = m->cfg.pp_size;
    kvs__fingerprint(d->lay, d->path, d->m->cfg.app_tag, &reg->fp);
    reg->ring_addr = d->ring_addr;
    reg->ring_bytes = d->ring_bytes;
    reg->ring_rkey = d->ring_rkey;
    reg->local_heads = m->kv.local_heads;
    reg->num_pages = m->kv.num_pages;
    reg->layers_total = direct ? m->kv.num_layers : 0;
    kvs__send(d, p, &msg);
    for (int64_t first = 0; direct && first < m->kv.num_layers; first += KVS_WIRE_LAYERS_PER_MSG) {
        kvs_msg_t lm = {.type = KVS_MSG_LAYERS};
        lm.u.layers.first = first;
        int64_t n = m->kv.num_layers - first;
        lm.u.layers.count = (uint32_t)(n < KVS_WIRE_LAYERS_PER_MSG ? n : KVS_WIRE_LAYERS_PER_MSG);
        for (uint32_t i = 0; i < lm.u.layers.count; i++) {
            const int64_t l = first + i;
            lm.u.layers.entries[i] = (kvs_layer_entry_t){m->k_base[l], d->kv_keys.k_rkey[l],
                                                         m->v_base[l], d->kv_keys.v_rkey[l]};
        }
        kvs__send(d, p, &lm);
    }
}

int kvs_decode_connect(kvs_decode_t *d, const char *peer, int64_t prefill_tp_rank,
                       int64_t prefill_pp_rank)
{
    if (d == NULL || peer == NULL)
        return KVS_EINVAL;
    kvs_manager_t *m = d->m;
    int64_t writer;
    int rc = kvs_layout_writer_index(d->lay, prefill_tp_rank, d->rank, &writer);
    const int64_t first_stage = d->lay->decode_pp == 1 ? 0 : m->cfg.pp_rank;
    if (rc != KVS_OK || prefill_pp_rank < first_stage ||
        prefill_pp_rank >= first_stage + d->stages)
        return KVS__MFAIL(m, KVS_EINVAL, "prefill rank tp %lld pp %lld does not write to "
                          "decode rank tp %lld pp %lld: connect only this rank's writers",
                          (long long)prefill_tp_rank, (long long)prefill_pp_rank,
                          (long long)d->rank, (long long)m->cfg.pp_rank);
    kvs__dpeer_t *p = &d->peers[writer * d->stages + (prefill_pp_rank - first_stage)];
    if (p->conn != NULL)
        return KVS__MFAIL(m, KVS_EALREADY, "prefill rank tp %lld pp %lld is already "
                          "connected", (long long)prefill_tp_rank, (long long)prefill_pp_rank);
    char *name = malloc(strlen(peer) + 1);
    if (name == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "copying the address of prefill '%s' failed", peer);
    strcpy(name, peer);
    free(p->name);
    p->name = name;
    p->tp_rank = prefill_tp_rank;
    p->pp_rank = prefill_pp_rank;
    p->acked = false;
    p->refused = KVS_OK;
    rc = d->fab->ops.connect(d->fab, peer, &p->conn);
    if (rc != KVS_OK) {
        /* Not there (yet): the handler keeps trying, as for a peer lost
         * later; rooms fail at once until it registers. */
        p->conn = NULL;
        p->lost = true;
        p->reconnect_wait_ns = m->cfg.retry_timeout_ns;
        p->reconnect_ns = kvs__sat_add_u64(kvs__now(d), p->reconnect_wait_ns);
        return kvs__error_set(&m->err, rc, d->fab->last_backend_code, __FILE__, __LINE__,
                              "connecting to prefill '%s' failed (%s); kvs_decode_progress "
                              "keeps trying, or connect again with the right address", peer,
                              d->fab->last_backend_msg[0] ? d->fab->last_backend_msg
                                                          : kvs_strerror(rc));
    }
    p->lost = false;
    kvs__register(d, p);
    return KVS_OK;
}

int64_t kvs_decode_peers_ready(const kvs_decode_t *d)
{
    int64_t n = 0;
    for (int64_t i = 0; d != NULL && i < d->npeers; i++)
        n += d->peers[i].acked;
    return n;
}

/* ---- requests --------------------------------------------------------------- */

static int kvs__room_reject(kvs_decode_t *d, uint64_t room, int status)
{
    kvs_room_result_t res = {.room = room, .status = status, .open_ns = kvs__now(d),
                             .done_ns = kvs__now(d)};
    kvs__results_push(&d->results, &res);
    d->stats.rooms_failed++;
    return status;
}

int kvs_decode_room_open(kvs_decode_t *d, uint64_t room, int64_t base_tokens,
                         int64_t total_tokens, const int64_t *pages, int64_t num_pages)
{
    if (d == NULL)
        return KVS_EINVAL;
    kvs_manager_t *m = d->m;
    const int64_t ps = d->lay->page_size;
    int64_t lost = -1;
    for (int64_t i = 0; i < d->npeers; i++) {
        const kvs__dpeer_t *p = &d->peers[i];
        if (p->lost) {
            lost = i;
            continue;
        }
        if (p->conn == NULL)
            return KVS__MFAIL(m, KVS_ESTATE, "connect every prefill writer first "
                              "(kvs_decode_connect): %lld expected", (long long)d->npeers);
        if (p->refused != KVS_OK) /* it would never take part: fail now, not never */
            return KVS__MFAIL(m, p->refused, "room %llu: prefill rank tp %lld pp %lld refused "
                              "the registration (%s): fix the configuration mismatch and "
                              "recreate the handler", (unsigned long long)room,
                              (long long)p->tp_rank, (long long)p->pp_rank,
                              kvs_strerror(p->refused));
    }
    if (base_tokens < 0 || total_tokens < base_tokens || (pages == NULL && num_pages > 0))
        return KVS__MFAIL(m, KVS_EINVAL, "room %llu: need 0 <= base_tokens <= total_tokens "
                          "and a page list", (unsigned long long)room);
    if (base_tokens % ps != 0 || lost >= 0) {
        const int status = lost >= 0 ? KVS_EPEER : KVS_EPREFIX_ALIGN;
        if (lost >= 0)
            KVS__MFAIL(m, KVS_EPEER, "room %llu: prefill rank tp %lld pp %lld is unreachable "
                       "(its connection died; reconnecting): the request fails now, retry it "
                       "once kvs_decode_peers_ready() counts every writer again",
                       (unsigned long long)room, (long long)d->peers[lost].tp_rank,
                       (long long)d->peers[lost].pp_rank);
        else
            KVS__MFAIL(m, KVS_EPREFIX_ALIGN, "room %llu: cached prefix %lld is not a multiple "
                       "of the page size %lld", (unsigned long long)room,
                       (long long)base_tokens, (long long)ps);
        /* The prefill ranks hold this request too: tell them at once. */
        kvs_msg_t msg = {.type = KVS_MSG_ABORT};
        msg.u.abort = (kvs_msg_abort_t){.room = room, .status = status};
        for (int64_t i = 0; i < d->npeers; i++)
            kvs__send(d, &d->peers[i], &msg);
        return kvs__room_reject(d, room, status);
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
    if (kvs__table_get(&d->rooms, room) != NULL)
        return KVS__MFAIL(m, KVS_EALREADY, "room %llu is already open",
                          (unsigned long long)room);
    const bool staging = d->path == KVS_PATH_STAGING;
    kvs__droom_t *r = calloc(1, sizeof *r);
    if (r == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating room %llu failed", (unsigned long long)room);
    r->id = room;
    r->base = base_tokens;
    r->total = total_tokens;
    r->num_pages = num_pages;
    r->num_chunks = staging ? kvs_grid_num_chunks(d->lay, num_pages) : 0;
    r->pages = malloc((size_t)(num_pages > 0 ? num_pages : 1) * sizeof *r->pages);
    r->chunks = calloc((size_t)(r->num_chunks > 0 ? r->num_chunks : 1), sizeof *r->chunks);
    r->arrived = calloc((size_t)((r->num_chunks > 0 ? r->num_chunks : 1) * d->words),
                        sizeof *r->arrived);
    r->reported = calloc((size_t)d->words, sizeof *r->reported);
    if (r->pages == NULL || r->chunks == NULL || r->arrived == NULL || r->reported == NULL) {
        kvs__room_free(r);
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating room %llu failed", (unsigned long long)room);
    }
    if (num_pages > 0)
        memcpy(r->pages, pages, (size_t)num_pages * sizeof *pages);
    for (int64_t i = 0; i < r->num_chunks; i++) {
        kvs_chunk_t ch;
        int rc = kvs_grid_chunk(d->lay, base_tokens, total_tokens, i, &ch);
        if (rc != KVS_OK) {
            kvs__room_free(r);
            return KVS__MFAIL(m, rc, "room %llu: chunk %lld has no place on the grid",
                              (unsigned long long)room, (long long)i);
        }
        r->chunks[i].tokens = ch.token_end - ch.token_start;
        r->chunks[i].page_start = ch.page_start;
        r->chunks[i].num_pages = ch.num_pages;
        rc = kvs_layout_region_bytes(d->lay, d->rank, m->cfg.pp_rank, r->chunks[i].tokens,
                                     &r->chunks[i].region_bytes);
        if (rc != KVS_OK) {
            kvs__room_free(r);
            return KVS__MFAIL(m, rc, "room %llu: chunk %lld has no region",
                              (unsigned long long)room, (long long)i);
        }
    }
    /* Every chunk of every open room may wait for ring space at once. */
    const int64_t chunks = r->num_chunks;
    int rc = kvs__dq_reserve(&d->wanted, d->open_chunks + (uint64_t)chunks);
    if (rc != KVS_OK) {
        kvs__room_free(r);
        return KVS__MFAIL(m, rc, "room %llu: no room to queue its %lld chunks",
                          (unsigned long long)room, (long long)chunks);
    }
    rc = kvs__table_put(&d->rooms, room, r);
    if (rc != KVS_OK) {
        kvs__room_free(r);
        return KVS__MFAIL(m, rc, "room table full (%u rooms): raise max_rooms or finish "
                          "requests first", m->cfg.max_rooms);
    }
    d->open_chunks += (uint64_t)r->num_chunks;
    r->open_ns = kvs__now(d);
    kvs__touch(d, r);
    kvs_msg_t msg = {.type = KVS_MSG_ROOM};
    msg.u.room = (kvs_msg_room_t){.room = room, .base_tokens = base_tokens,
                                  .total_tokens = total_tokens, .num_pages = num_pages};
    for (int64_t i = 0; i < d->npeers; i++) {
        kvs__send(d, &d->peers[i], &msg);
        for (int64_t first = 0; !staging && first < num_pages; first += KVS_WIRE_PAGES_PER_MSG) {
            kvs_msg_t pm = {.type = KVS_MSG_PAGES};
            pm.u.pages.room = room;
            pm.u.pages.first = first;
            const int64_t n = num_pages - first;
            pm.u.pages.count = (uint32_t)(n < KVS_WIRE_PAGES_PER_MSG ? n : KVS_WIRE_PAGES_PER_MSG);
            memcpy(pm.u.pages.ids, pages + first, pm.u.pages.count * sizeof *pages);
            kvs__send(d, &d->peers[i], &pm);
        }
    }
    return KVS_OK;
}

/* ---- message handling ------------------------------------------------------- */

static void kvs__answer(kvs_decode_t *d, kvs__dpeer_t *p, const kvs__droom_t *r, int64_t chunk,
                        int status)
{
    kvs_msg_t msg = {.type = KVS_MSG_STAGING_RSP};
    msg.u.rsp = (kvs_msg_staging_rsp_t){.room = r->id,
                                        .chunk = chunk, .status = status};
    if (status == KVS_OK) {
        const kvs__dchunk_t *c = &r->chunks[chunk];
        msg.u.rsp.offset = c->alloc.offset;
        msg.u.rsp.round = c->alloc.round;
        msg.u.rsp.end = c->alloc.end;
    }
    kvs__send(d, p, &msg);
}

/* Tries to assign chunk's region; answers every peer when it succeeds. */
static int kvs__allocate(kvs_decode_t *d, kvs__droom_t *r, int64_t chunk)
{
    kvs__dchunk_t *c = &r->chunks[chunk];
    /* An empty range is one metadata-only chunk: no region to assign. */
    int rc = c->region_bytes == 0 ? KVS_OK
                                  : kvs_ring_assign(d->ring, (uint64_t)c->region_bytes, &c->alloc);
    if (rc == KVS_ERING_LIVE)
        return rc;
    if (rc != KVS_OK) {
        for (int64_t i = 0; i < d->npeers; i++)
            kvs__answer(d, &d->peers[i], r, chunk, rc);
        kvs__room_fail(d, r, rc);
        return rc;
    }
    c->state = KVS__DCH_ALLOCATED;
    const uint64_t live = kvs_ring_live_bytes(d->ring);
    if (live > d->stats.ring_peak_bytes)
        d->stats.ring_peak_bytes = live;
    for (int64_t i = 0; i < d->npeers; i++)
        kvs__answer(d, &d->peers[i], r, chunk, KVS_OK);
    return KVS_OK;
}

static void kvs__on_staging_req(kvs_decode_t *d, kvs__dpeer_t *p, const kvs_msg_staging_req_t *q)
{
    kvs__droom_t *r = kvs__table_get(&d->rooms, q->room);
    if (r == NULL || d->path != KVS_PATH_STAGING) {
        d->stats.msgs_rejected++;
        kvs_msg_t msg = {.type = KVS_MSG_STAGING_RSP};
        msg.u.rsp = (kvs_msg_staging_rsp_t){.room = q->room,
                                            .chunk = q->chunk, .status = KVS_ENOENT};
        kvs__send(d, p, &msg);
        return;
    }
    if (q->chunk < 0 || q->chunk >= r->num_chunks ||
        q->tokens != r->chunks[q->chunk].tokens || q->pages != r->chunks[q->chunk].num_pages) {
        d->stats.msgs_rejected++;
        kvs__room_fail(d, r, KVS_EPROTO);
        return;
    }
    if (r->status != KVS_OK) {
        kvs__answer(d, p, r, q->chunk, r->status);
        return;
    }
    kvs__touch(d, r);
    kvs__dchunk_t *c = &r->chunks[q->chunk];
    if (c->state == KVS__DCH_IDLE) {
        if (kvs__allocate(d, r, q->chunk) == KVS_ERING_LIVE) {
            c->state = KVS__DCH_WANTED;
            if (!kvs__dq_push(&d->wanted, r->id, q->chunk))
                kvs__room_fail(d, r, KVS_EFULL);
        }
    } else if (c->state != KVS__DCH_WANTED) {
        kvs__answer(d, p, r, q->chunk, KVS_OK); /* a duplicate gets the same answer */
    }
}

static void kvs__scatter(kvs_decode_t *d, kvs__droom_t *r, int64_t chunk)
{
    kvs_manager_t *m = d->m;
    kvs__dchunk_t *c = &r->chunks[chunk];
    /* This decode stage's layers: its regions' layer slots (spec §4). */
    int64_t first_layer = 0, layers = 0;
    (void)kvs_layout_stage_layers(d->lay, KVS_ROLE_DECODE, m->cfg.pp_rank, &first_layer,
                                  &layers);
    const kvs_copy_desc_t desc = {
        .k_base = m->k_base, .v_base = m->v_base, .local_heads = m->kv.local_heads,
        .head_dim = d->lay->head_dim, .elem_bytes = d->lay->elem_bytes,
        .page_size = d->lay->page_size, .pages = r->pages + c->page_start,
        .num_pages = c->num_pages, .tokens = c->tokens,
        .layer_begin = 0, .layer_count = layers,
        .staging_slot_begin = 0, .staging_layer_slots = layers};
    /* One fused scatter of every writer's block, so each token row of the
     * pool is written once, whole (parts_cap parts at a time). Writers that
     * replicate a head (prefill TP > heads) are consecutive and wrote the
     * same bytes: the later one's block replaces the earlier's part, so the
     * last is scattered, as when each writer's block was scattered in turn. */
    int rc = KVS_OK;
    int64_t n = 0;
    for (int64_t i = 0; i < d->lay->tp_writers && rc == KVS_OK && c->tokens > 0; i++) {
        kvs_writer_t w;
        rc = kvs_layout_writer(d->lay, d->rank, m->cfg.pp_rank, i, c->tokens, &w);
        if (rc != KVS_OK)
            break;
        const kvs_copy_part_t part = {
            .head_start = w.heads.dst_start, .num_heads = w.heads.num_heads,
            .staging_addr = d->ring_addr + c->alloc.offset + (uint64_t)w.offset_bytes};
        if (n > 0 && d->parts[n - 1].head_start == part.head_start) {
            d->parts[n - 1] = part; /* a replica */
            continue;
        }
        if (n == d->parts_cap) {
            rc = kvs__dev_scatter_parts(d->dev, d->stream, &desc, d->parts, n);
            n = 0;
        }
        if (rc == KVS_OK)
            d->parts[n++] = part;
    }
    if (rc == KVS_OK && n > 0)
        rc = kvs__dev_scatter_parts(d->dev, d->stream, &desc, d->parts, n);
    /* The event is recorded even after a refused copy: one refused part-way
     * may have left its first parts enqueued (the core's default copy runs
     * one op per part), and the region must stay allocated until they ran. */
    const int copy_rc = rc;
    rc = kvs__dev_event_record(d->dev, d->stream, &c->event);
    if (rc == KVS_OK && !kvs__dq_push(&d->scatters, r->id, chunk))
        rc = KVS_EFULL;
    if (rc != KVS_OK || copy_rc != KVS_OK) {
        const int why = copy_rc != KVS_OK ? copy_rc : rc;
        kvs__log(&m->log, KVS_LOG_ERROR, "decode %lld: scatter of room %llu chunk %lld "
                 "failed: %s", (long long)d->rank, (unsigned long long)r->id,
                 (long long)chunk, kvs_strerror(why));
        if (rc == KVS_OK) {
            c->state = KVS__DCH_SCATTERING; /* freed when the event completes */
        } else {
            if (c->event != NULL)
                kvs__dev_event_destroy(d->dev, c->event);
            c->event = NULL; /* the region stays allocated until every writer reported */
        }
        kvs__room_fail(d, r, why);
        return;
    }
    c->state = KVS__DCH_SCATTERING;
    d->stats.copies++;
}

static void kvs__on_chunk_ready(kvs_decode_t *d, int64_t peer, const kvs_msg_chunk_ready_t *q)
{
    kvs__droom_t *r = kvs__table_get(&d->rooms, q->room);
    const int64_t first_stage = d->lay->decode_pp == 1 ? 0 : d->m->cfg.pp_rank;
    /* Range checked before they are combined: a hostile writer or stage
     * must not overflow the index. */
    const bool in_range = q->writer >= 0 && q->writer < d->lay->tp_writers &&
                          q->stage >= first_stage && q->stage < first_stage + d->stages;
    const int64_t idx = in_range ? q->writer * d->stages + (q->stage - first_stage) : -1;
    if (r == NULL || q->chunk < 0 || q->chunk >= r->num_chunks || idx != peer ||
        r->chunks[q->chunk].state != KVS__DCH_ALLOCATED ||
        q->page_start != r->chunks[q->chunk].page_start ||
        q->pages != r->chunks[q->chunk].num_pages) {
        d->stats.msgs_rejected++;
        return;
    }
    kvs__dchunk_t *c = &r->chunks[q->chunk];
    uint64_t *bits = r->arrived + q->chunk * d->words;
    if (kvs__bit(bits, peer)) {
        d->stats.msgs_rejected++; /* duplicate */
        return;
    }
    kvs__bit_set(bits, peer);
    kvs__touch(d, r);
    if (++c->arrivals == d->npeers && r->status == KVS_OK) {
        r->bytes += (uint64_t)c->region_bytes;
        kvs__scatter(d, r, q->chunk);
    }
}

static void kvs__on_report(kvs_decode_t *d, int64_t peer, uint64_t room, int status)
{
    kvs__droom_t *r = kvs__table_get(&d->rooms, room);
    if (r == NULL || kvs__bit(r->reported, peer)) {
        d->stats.msgs_rejected++;
        return;
    }
    kvs__bit_set(r->reported, peer);
    r->reports++;
    kvs__touch(d, r);
    if (status == KVS_OK)
        r->reports_ok++;
    else
        kvs__room_fail(d, r, status);
    int64_t first_layer = 0, layers = 0; /* the layers this peer's stage wrote */
    if (d->path != KVS_PATH_STAGING && status == KVS_OK &&
        kvs_layout_stage_layers(d->lay, KVS_ROLE_PREFILL, d->peers[peer].pp_rank,
                                &first_layer, &layers) == KVS_OK)
        r->bytes += (uint64_t)(r->total - r->base) * (uint64_t)d->m->kv.local_heads *
                    (uint64_t)d->lay->head_dim * (uint64_t)d->lay->elem_bytes *
                    (uint64_t)layers * 2 / (uint64_t)d->lay->tp_writers;
    kvs__room_try_finish(d, r);
}

/* A prefill tells its failure at once, while writes it posted may still be
 * landing in this room's regions (or KV pages): the room fails now, but the
 * peer has reported only when its STATUS, sent after those writes
 * completed, arrives. Freeing on the ABORT would let them land in memory
 * already handed back (spec §9). */
static void kvs__on_abort(kvs_decode_t *d, int64_t peer, const kvs_msg_abort_t *a)
{
    kvs__droom_t *r = kvs__table_get(&d->rooms, a->room);
    if (r == NULL || kvs__bit(r->reported, peer)) {
        d->stats.msgs_rejected++;
        return;
    }
    kvs__room_fail_from(d, r, a->status != KVS_OK ? a->status : KVS_EPEER, peer);
}

/* Prefill idx will never write into this session's open rooms (it refused
 * the registration, or its connection died): counts its report in every one
 * it has not reported in, each failing with status. */
static void kvs__peer_reports_failed(kvs_decode_t *d, int64_t idx, int status)
{
    for (uint32_t i = 0; i <= d->rooms.mask; i++) {
        if (d->rooms.state[i] != 1)
            continue;
        kvs__droom_t *r = d->rooms.vals[i];
        if (kvs__bit(r->reported, idx))
            continue;
        kvs__bit_set(r->reported, idx);
        r->reports++;
        kvs__room_fail(d, r, status);
        kvs__room_try_finish(d, r); /* deleting leaves a tombstone: the walk goes on */
    }
}

static void kvs__on_ack(kvs_decode_t *d, kvs__dpeer_t *p, int64_t idx, uint64_t session,
                        const kvs_msg_register_ack_t *a)
{
    if (a->echo != d->session) {
        d->stats.msgs_rejected++;
        return;
    }
    if (a->status != KVS_OK) {
        if (p->acked) { /* contradicts the acceptance we hold: stale or forged */
            d->stats.msgs_rejected++;
            return;
        }
        p->refused = a->status;
        /* The prefill sends its fingerprint: name the field that differs. */
        kvs_fingerprint_t mine;
        kvs__fingerprint(d->lay, d->path, d->m->cfg.app_tag, &mine);
        char why[200];
        if (a->status != KVS_EFINGERPRINT ||
            kvs__fingerprint_check(&mine, &a->fp, why, sizeof why) == KVS_OK)
            snprintf(why, sizeof why, "%s", kvs_strerror(a->status));
        KVS__MFAIL(d->m, a->status, "prefill rank tp %lld pp %lld refused the registration: "
                   "%s", (long long)p->tp_rank, (long long)p->pp_rank, why);
        kvs__log(&d->m->log, KVS_LOG_ERROR, "%s", d->m->err.msg);
        /* It never accepted this session, so it ignores our rooms and never
         * writes into them: its (failed) report of every open room is in. */
        kvs__peer_reports_failed(d, idx, a->status);
        return;
    }
    p->acked = true;
    p->lost = false;
    p->prefill_session = session;
    if (d->ring != NULL) {
        kvs_msg_t msg = {.type = KVS_MSG_WATERMARK};
        kvs_watermark_t wm = kvs_ring_watermark(d->ring);
        msg.u.wm = (kvs_msg_watermark_t){.round = wm.round,
                                         .offset = wm.offset};
        kvs__send(d, p, &msg);
    }
}

static void kvs__on_message(kvs_decode_t *d, const kvs_completion_t *cqe)
{
    kvs_msg_t msg;
    int64_t idx;
    kvs__dpeer_t *p = kvs__peer_of(d, cqe->conn, &idx);
    const int got = p != NULL ? kvs__link_recv(&d->links, cqe, &msg) : KVS_EPROTO;
    if (got < 0)
        d->stats.msgs_rejected++;
    if (got <= 0)
        return; /* rejected, or taken by the link (an ACK, a duplicate) */
    d->stats.msgs_received++;
    if (msg.type == KVS_MSG_REGISTER_ACK) {
        kvs__on_ack(d, p, idx, msg.session, &msg.u.ack);
        return;
    }
    /* Everything else comes from an accepted prefill session. */
    if (!p->acked || msg.session != p->prefill_session) {
        d->stats.msgs_rejected++;
        return;
    }
    switch (msg.type) {
    case KVS_MSG_STAGING_REQ:
        kvs__on_staging_req(d, p, &msg.u.req);
        break;
    case KVS_MSG_CHUNK_READY:
        kvs__on_chunk_ready(d, idx, &msg.u.ready);
        break;
    case KVS_MSG_STATUS:
        kvs__on_report(d, idx, msg.u.status.room, msg.u.status.status);
        break;
    case KVS_MSG_ABORT:
        kvs__on_abort(d, idx, &msg.u.abort);
        break;
    default:
        d->stats.msgs_rejected++;
        break;
    }
}

/* ---- lost peers --------------------------------------------------------------- */

/* The fabric found p's connection dead: the prefill crashed or restarted.
 * A dead connection carries no more writes, so the peer has reported every
 * open room (failed); every other peer is told. */
static void kvs__peer_lost(void *ctx, kvs_conn_t *conn)
{
    kvs_decode_t *d = ctx;
    int64_t idx;
    kvs__dpeer_t *p = kvs__peer_of(d, conn, &idx);
    if (p == NULL)
        return;
    d->fab->ops.disconnect(d->fab, conn);
    p->conn = NULL;
    p->acked = false;
    /* The first loss waits retry_timeout before reconnecting; a reconnect
     * that dies again waits twice as long, up to the links' longest wait. */
    const uint64_t cap = d->links.rto_max_ns;
    p->reconnect_wait_ns = !p->lost ? d->m->cfg.retry_timeout_ns
                                    : kvs__double_capped(p->reconnect_wait_ns, cap);
    p->lost = true;
    p->reconnect_ns = kvs__sat_add_u64(kvs__now(d), p->reconnect_wait_ns);
    kvs__log(&d->m->log, KVS_LOG_WARN, "decode %lld: prefill %lld/%lld is unreachable (its "
             "connection died): its rooms fail, reconnecting to '%s'", (long long)d->rank,
             (long long)p->tp_rank, (long long)p->pp_rank, p->name);
    kvs__peer_reports_failed(d, idx, KVS_EPEER);
}

/* Lost peers whose wait is over: connect and register again. */
static void kvs__reconnect(kvs_decode_t *d)
{
    const uint64_t now = kvs__now(d);
    for (int64_t i = 0; i < d->npeers; i++) {
        kvs__dpeer_t *p = &d->peers[i];
        if (!p->lost || p->conn != NULL || now < p->reconnect_ns)
            continue;
        if (d->fab->ops.connect(d->fab, p->name, &p->conn) == KVS_OK) {
            kvs__log(&d->m->log, KVS_LOG_INFO, "decode %lld: reconnected to prefill '%s'",
                     (long long)d->rank, p->name);
            kvs__register(d, p);
            continue;
        }
        p->conn = NULL;
        const uint64_t cap = d->links.rto_max_ns;
        p->reconnect_wait_ns = kvs__double_capped(p->reconnect_wait_ns, cap);
        p->reconnect_ns = kvs__sat_add_u64(now, p->reconnect_wait_ns);
    }
}

/* ---- progress --------------------------------------------------------------- */

/* Completed scatters in stream order: free their regions. */
static int kvs__reap_scatters(kvs_decode_t *d)
{
    int done = 0;
    while (d->scatters.count > 0) {
        kvs__dref_t ref = d->scatters.items[d->scatters.head];
        kvs__droom_t *r = kvs__table_get(&d->rooms, ref.room);
        kvs__dchunk_t *c = r != NULL ? &r->chunks[ref.chunk] : NULL;
        if (c != NULL && c->state == KVS__DCH_SCATTERING) {
            int rc = kvs__dev_event_query(d->dev, c->event);
            if (rc == KVS_EAGAIN)
                break;
            kvs__dev_event_destroy(d->dev, c->event);
            c->event = NULL;
            c->state = KVS__DCH_DONE;
            kvs__release_region(d, c);
            kvs__touch(d, r);
            if (rc == KVS_OK)
                r->scattered++;
            else
                kvs__room_fail(d, r, rc);
            kvs__room_try_finish(d, r);
        }
        kvs__dq_pop(&d->scatters);
        done++;
    }
    return done;
}

/* Chunks that waited for ring space, in arrival order. */
static void kvs__retry_wanted(kvs_decode_t *d)
{
    while (d->wanted.count > 0) {
        kvs__dref_t ref = d->wanted.items[d->wanted.head];
        kvs__droom_t *r = kvs__table_get(&d->rooms, ref.room);
        if (r != NULL && r->chunks[ref.chunk].state == KVS__DCH_WANTED) {
            if (r->status != KVS_OK)
                r->chunks[ref.chunk].state = KVS__DCH_IDLE;
            else if (kvs__allocate(d, r, ref.chunk) == KVS_ERING_LIVE)
                break;
        }
        kvs__dq_pop(&d->wanted);
    }
}

/* Rooms past their stall deadline (spec §9: no request waits forever). The
 * first expiry fails the room with KVS_ETIMEDOUT and tells every peer; the
 * second, one more timeout later, stops waiting for the reports of peers
 * that stayed silent (dead, or cut off) and releases the room. */
static void kvs__expire(kvs_decode_t *d)
{
    const uint64_t now = kvs__now(d), timeout = d->m->cfg.stall_timeout_ns;
    if (now < d->next_check_ns)
        return;
    uint64_t next = UINT64_MAX;
    for (uint32_t i = 0; i <= d->rooms.mask; i++) {
        if (d->rooms.state[i] != 1)
            continue;
        kvs__droom_t *r = d->rooms.vals[i];
        if (now >= kvs__sat_add_u64(r->last_ns, timeout)) {
            if (r->status == KVS_OK) {
                kvs__room_fail(d, r, KVS_ETIMEDOUT);
            } else {
                for (int64_t p = 0; p < d->npeers; p++)
                    if (!kvs__bit(r->reported, p)) {
                        kvs__bit_set(r->reported, p);
                        r->reports++;
                    }
                if (kvs__room_try_finish(d, r))
                    continue; /* gone; deleting leaves a tombstone */
            }
            r->last_ns = now;
        }
        if (kvs__sat_add_u64(r->last_ns, timeout) < next)
            next = kvs__sat_add_u64(r->last_ns, timeout);
    }
    d->next_check_ns = next;
}

int kvs_decode_progress(kvs_decode_t *d)
{
    if (d == NULL)
        return KVS_EINVAL;
    int work = 0;
    for (;;) {
        int n = d->fab->ops.poll(d->fab, d->cq, KVS__POLL_BATCH);
        if (n < 0)
            return KVS__MFAIL(d->m, n, "polling fabric '%s' failed: %s", d->fab->name,
                              d->fab->last_backend_msg[0] ? d->fab->last_backend_msg
                                                          : kvs_strerror(n));
        for (int i = 0; i < n; i++) {
            if (d->cq[i].kind == KVS_COMPLETION_RECV)
                kvs__on_message(d, &d->cq[i]);
            else if (d->cq[i].kind == KVS_COMPLETION_DISCONNECT)
                kvs__link_kill(&d->links, d->cq[i].conn);
        }
        work += n;
        if (n < KVS__POLL_BATCH)
            break;
    }
    if (d->stream != NULL && kvs__reap_scatters(d) > 0)
        work++;
    if (d->ring != NULL)
        kvs__retry_wanted(d);
    kvs__expire(d);
    kvs__links_tick(&d->links, kvs__now(d), kvs__peer_lost, d);
    kvs__reconnect(d);
    return work;
}

int kvs_decode_poll_rooms(kvs_decode_t *d, kvs_room_result_t *out, int max)
{
    if (d == NULL || out == NULL || max < 0)
        return KVS_EINVAL;
    return kvs__results_pop(&d->results, out, max);
}

uint64_t kvs_decode_next_deadline_ns(const kvs_decode_t *d)
{
    if (d == NULL)
        return UINT64_MAX;
    uint64_t t = d->rooms.count > 0 ? d->next_check_ns : UINT64_MAX;
    const uint64_t links = kvs__links_deadline(&d->links);
    if (links < t)
        t = links;
    for (int64_t i = 0; i < d->npeers; i++)
        if (d->peers[i].lost && d->peers[i].conn == NULL && d->peers[i].reconnect_ns < t)
            t = d->peers[i].reconnect_ns;
    return t;
}

void kvs_decode_stats(const kvs_decode_t *d, kvs_handler_stats_t *out)
{
    if (d != NULL && out != NULL)
        *out = d->stats;
}

kvs__links_t *kvs__decode_links(kvs_decode_t *d) { return &d->links; }

uint64_t kvs__decode_stall_ns(const kvs_decode_t *d)
{
    return d->rooms.count > 0 ? d->next_check_ns : UINT64_MAX;
}
