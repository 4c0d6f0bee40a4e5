/*
 * prefill.c - the prefill side of the staging protocol (spec §6-§8).
 *
 * A prefill rank writes to targets_per_prefill decode ranks (one when
 * P >= D). Each decode rank registers with it (REGISTER, fingerprint checked,
 * REGISTER_ACK). A request (room) proceeds per target ("flow") once the
 * prefill opened it and the decode's ROOM arrived:
 * - staging: STAGING_REQ for every chunk at once (prefetch, spec §7.3);
 *   on STAGING_RSP the chunk waits until its KV is computed, the region is
 *   ready against the decode's last watermark (spec §6; re-checked when a
 *   WATERMARK arrives, never spun) and a staging buffer is free; then gather
 *   on the gather stream (one fused copy with the same chunk of every other
 *   target that is ready then, so the KV pool is read once for all of
 *   them), ONE write (two with prefill PP: the K and the V
 *   layers of this stage) into the region, and CHUNK_READY once the write
 *   completed. A staging buffer is reused only after its write completed.
 *   A write the fabric refuses for now (KVS_EAGAIN: the connection's send
 *   queue is full) is posted again by a later progress call, the V write
 *   after the K write that went out.
 * - direct / slice: once the prompt is computed and the decode's pages and
 *   layer keys are known, one write per page run x layer x K/V (direct) or
 *   per token x layer x K/V when heads are sliced, at most
 *   max_inflight_writes in flight.
 * When every chunk (or write) of a flow is done the rank reports STATUS to
 * that decode. A failure fails the whole room, is told to every decode at
 * once, and is reported only after the writes already posted completed, so
 * the decode frees no region a write can still land in.
 * Control messages travel on reliable links (link.c: retransmitted until
 * acknowledged, duplicates dropped; a new incarnation of a decode comes on
 * a new connection). A decode whose connection dies is lost: what this rank
 * owed it fails (and every other decode is told), rooms opened while it is
 * away fail at once, and its next REGISTER brings it back.
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

typedef struct kvs__ppeer {
    kvs_conn_t *conn;            /* reverse connection of the decode's REGISTER */
    bool registered;
    bool lost;                   /* its connection died; until it registers again */
    uint64_t session;
    int64_t tp_rank, pp_rank;    /* of the decode rank */
    int64_t writer;              /* this rank's writer index in its regions */
    kvs_head_slice_t heads;
    kvs_watermark_t wm;
    uint64_t ring_addr, ring_bytes, ring_rkey;
    int64_t local_heads, num_pages;
    kvs_layer_entry_t *layers;   /* direct/slice: the decode's KV layers */
    int64_t layers_total, layers_got;
} kvs__ppeer_t;

enum { KVS__PCH_NONE, KVS__PCH_REQ, KVS__PCH_ALLOC, KVS__PCH_GATHER, KVS__PCH_WRITE,
       KVS__PCH_DONE };

typedef struct kvs__pchunk {
    uint8_t state;
    bool waited;                 /* counted once as a watermark wait */
    bool unposted;               /* gathered, a write of it refused for now (the
                                    fabric's queue was full): posted again */
    uint64_t wait_ns;            /* when it started waiting */
    int64_t tokens, token_start, token_end, page_start, num_pages;
    int64_t region_bytes;
    uint64_t offset, round, end;
    int32_t worker;              /* staging buffer in use, -1 if none */
    int32_t writes_posted;       /* of kvs__chunk_writes: they go in order */
    int32_t writes_pending;      /* posted, not yet completed */
    kvs_event_t *event;
} kvs__pchunk_t;

typedef struct kvs__pflow {
    bool known;                  /* the decode's ROOM arrived */
    bool reqs_sent, reported;
    int64_t base, total;
    int64_t *dpages, num_dpages, dpages_got;
    int64_t num_chunks, chunks_done;
    kvs__pchunk_t *chunks;
    /* direct/slice cursor: token, layer, K/V */
    int64_t cur_t, cur_l, run_tokens;
    int cur_kv;
    bool posted_all;
    int64_t writes_pending;
} kvs__pflow_t;

typedef struct kvs__proom {
    uint64_t id;
    bool opened, final;
    int64_t total, computed;
    int64_t *pages, num_pages;
    kvs__pflow_t *flows;         /* one per target */
    int status;
    uint64_t open_ns, bytes, writes;
    uint64_t last_ns;            /* last progress; the stall timeout runs from it */
    struct kvs__proom *prev, *next; /* open order */
} kvs__proom_t;

typedef struct kvs__pop {        /* an in-flight write */
    uint64_t room;
    int32_t flow;
    int64_t chunk;               /* -1 for direct/slice writes */
    uint32_t gen;
    bool used;
} kvs__pop_t;

/* A room this rank ended failed, remembered (a bounded FIFO of the latest)
 * so that a decode whose ROOM comes late (its REGISTER or ROOM was lost
 * and sent again) still learns the outcome instead of waiting out its
 * stall timeout. */
typedef struct kvs__pgone {
    uint64_t room;
    int status;
} kvs__pgone_t;

typedef struct kvs__pgather {
    uint64_t room;
    int32_t flow;
    int64_t chunk;
} kvs__pgather_t;

struct kvs_prefill {
    kvs_manager_t *m;
    kvs_fabric_t *fab;
    kvs_device_t *dev;
    const kvs_layout_t *lay;
    kvs_path_t path;
    int64_t rank, stage;         /* TP and PP rank */
    int64_t ntargets;
    kvs__ppeer_t *peers;         /* [ntargets] */
    kvs__links_t links;          /* one reliable link per connection */
    kvs_stream_t *stream;
    uint32_t workers;
    bool *worker_busy;
    kvs__kv_keys_t kv_keys;      /* direct/slice: KV layers open to peers */
    kvs__table_t rooms;
    kvs__proom_t *first, *last;
    kvs__results_t results;
    kvs__pop_t *ops;
    uint32_t ops_cap, ops_used;
    kvs__pgone_t *gone;          /* [max_rooms]: latest rooms ended failed */
    uint32_t gone_next, gone_count;
    kvs__pgather_t *gathers;
    uint32_t gathers_cap, gathers_head, gathers_count;
    /* One fused gather: the flows whose chunk it stages, their staging
     * buffers and copy parts, up to fuse_cap at once. */
    int64_t *fuse_flows;
    int32_t *fuse_workers;
    kvs_copy_part_t *fuse_parts;
    int64_t fuse_cap;
    bool gather_blocked;         /* this progress pass: a gather waits for
                                    buffers or write slots, so later chunks
                                    (of later rooms) do not take them first */
    kvs_completion_t *cq;
    kvs_handler_stats_t stats;
    kvs_fingerprint_t fp;
    uint64_t session;
    uint64_t next_check_ns;      /* no room's stall deadline is earlier */
};

static uint64_t kvs__now(const kvs_prefill_t *p) { return kvs__net_now_ns(p->fab); }

/* The room moved: its stall deadline starts over. */
static void kvs__touch(kvs_prefill_t *p, kvs__proom_t *r)
{
    r->last_ns = kvs__now(p);
    const uint64_t due = kvs__sat_add_u64(r->last_ns, p->m->cfg.stall_timeout_ns);
    if (due < p->next_check_ns)
        p->next_check_ns = due;
}

static void kvs__send(kvs_prefill_t *p, kvs__ppeer_t *peer, const kvs_msg_t *msg)
{
    if (peer->conn == NULL)
        return;
    /* A dead connection is handled at the end of progress (the link
     * reports it), never from inside the caller's loops. */
    int rc = kvs__link_send(&p->links, peer->conn, msg);
    if (rc != KVS_OK && rc != KVS_EPEER)
        kvs__log(&p->m->log, KVS_LOG_WARN, "prefill %lld: sending %s to decode %lld/%lld "
                 "failed: %s", (long long)p->rank, kvs__wire_type_name(msg->type),
                 (long long)peer->tp_rank, (long long)peer->pp_rank, kvs_strerror(rc));
}

/* ---- rooms ------------------------------------------------------------------ */

static void kvs__room_free(kvs_prefill_t *p, kvs__proom_t *r)
{
    if (r == NULL)
        return;
    for (int64_t f = 0; r->flows != NULL && f < p->ntargets; f++) {
        for (int64_t c = 0; c < r->flows[f].num_chunks; c++)
            if (r->flows[f].chunks[c].event != NULL)
                kvs__dev_event_destroy(p->dev, r->flows[f].chunks[c].event);
        free(r->flows[f].chunks);
        free(r->flows[f].dpages);
    }
    free(r->flows);
    free(r->pages);
    free(r);
}

static kvs__proom_t *kvs__room_get_or_add(kvs_prefill_t *p, uint64_t id)
{
    kvs__proom_t *r = kvs__table_get(&p->rooms, id);
    if (r != NULL)
        return r;
    r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->flows = calloc((size_t)p->ntargets, sizeof *r->flows);
    if (r->flows == NULL || kvs__table_put(&p->rooms, id, r) != KVS_OK) {
        free(r->flows);
        free(r);
        return NULL;
    }
    r->id = id;
    kvs__touch(p, r);
    r->prev = p->last;
    if (p->last != NULL)
        p->last->next = r;
    else
        p->first = r;
    p->last = r;
    return r;
}

static void kvs__room_remove(kvs_prefill_t *p, kvs__proom_t *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        p->first = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    else
        p->last = r->prev;
    kvs__table_del(&p->rooms, r->id);
    kvs__room_free(p, r);
}

/* Fails the room once; every decode that has not heard of it yet is told. */
static void kvs__room_fail(kvs_prefill_t *p, kvs__proom_t *r, int status)
{
    if (r->status != KVS_OK)
        return;
    r->status = status;
    /* A gathered chunk whose writes did not all go out is not posted
     * again; with none in flight it holds its buffer and will see no
     * completion: release it (else its last completion does). */
    for (int64_t f = 0; f < p->ntargets; f++)
        for (int64_t i = 0; i < r->flows[f].num_chunks; i++) {
            kvs__pchunk_t *c = &r->flows[f].chunks[i];
            if (!c->unposted)
                continue;
            c->unposted = false;
            if (c->writes_pending > 0)
                continue;
            p->worker_busy[c->worker] = false;
            c->worker = -1;
            c->state = KVS__PCH_DONE;
        }
    kvs_msg_t msg = {.type = KVS_MSG_ABORT};
    msg.u.abort = (kvs_msg_abort_t){.room = r->id, .status = status};
    /* Once the caller opened the room, a decode whose ROOM is still on the
     * way is told too (it drops what it does not know). */
    for (int64_t f = 0; f < p->ntargets; f++)
        if (!r->flows[f].reported && p->peers[f].registered && (r->flows[f].known || r->opened))
            kvs__send(p, &p->peers[f], &msg);
    kvs__log(&p->m->log, KVS_LOG_INFO, "prefill %lld: room %llu failed: %s",
             (long long)p->rank, (unsigned long long)r->id, kvs_strerror(status));
}

static int64_t kvs__flow_busy(const kvs__pflow_t *fl)
{
    int64_t busy = fl->writes_pending;
    for (int64_t c = 0; c < fl->num_chunks; c++)
        busy += fl->chunks[c].state == KVS__PCH_GATHER || fl->chunks[c].state == KVS__PCH_WRITE;
    return busy;
}

static void kvs__report(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int status)
{
    kvs__pflow_t *fl = &r->flows[f];
    if (fl->reported)
        return;
    fl->reported = true;
    if (!fl->known && (status == KVS_OK || !p->peers[f].registered || !r->opened))
        return; /* the decode never opened it: nothing to tell */
    kvs_msg_t msg = {.type = KVS_MSG_STATUS};
    msg.u.status = (kvs_msg_status_t){.room = r->id,
                                      .tp_rank = p->rank, .pp_rank = p->stage,
                                      .status = status, .chunks = fl->num_chunks};
    kvs__send(p, &p->peers[f], &msg);
}

/* Reports every flow that can be reported and finishes the room when all
 * are; returns true when the room is gone. */
static bool kvs__room_try_finish(kvs_prefill_t *p, kvs__proom_t *r)
{
    int64_t reported = 0;
    for (int64_t f = 0; f < p->ntargets; f++) {
        kvs__pflow_t *fl = &r->flows[f];
        if (!fl->reported) {
            if (r->status != KVS_OK) {
                if (kvs__flow_busy(fl) == 0)
                    kvs__report(p, r, f, r->status);
            } else if (r->opened && r->final && fl->known &&
                       (p->path == KVS_PATH_STAGING ? fl->reqs_sent && fl->chunks_done == fl->num_chunks
                                                    : fl->posted_all && fl->writes_pending == 0)) {
                kvs__report(p, r, f, KVS_OK);
            }
        }
        reported += fl->reported;
    }
    /* A room the caller never opened has no one to report to: it waits for
     * room_open (then finishes at once if it already failed) or expires. */
    if (reported < p->ntargets || !r->opened)
        return false;
    int64_t chunks = 0;
    for (int64_t f = 0; f < p->ntargets; f++)
        chunks += r->flows[f].num_chunks;
    if (r->status != KVS_OK) {
        p->gone[p->gone_next] = (kvs__pgone_t){r->id, r->status};
        p->gone_next = (p->gone_next + 1) % p->m->cfg.max_rooms;
        if (p->gone_count < p->m->cfg.max_rooms)
            p->gone_count++;
    }
    kvs_room_result_t res = {.room = r->id, .status = r->status, .chunks = chunks,
                             .bytes = r->bytes, .rdma_writes = r->writes,
                             .open_ns = r->open_ns, .done_ns = kvs__now(p)};
    kvs__results_push(&p->results, &res);
    if (r->status == KVS_OK)
        p->stats.rooms_ok++;
    else
        p->stats.rooms_failed++;
    kvs__room_remove(p, r);
    return true;
}

/* ---- writes ------------------------------------------------------------------ */

static int kvs__post_write(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk,
                           uint64_t local, kvs_mr_t *mr, uint64_t remote, uint64_t rkey,
                           uint64_t len)
{
    if (p->ops_used == p->ops_cap)
        return KVS_EAGAIN;
    uint32_t i = 0;
    while (p->ops[i].used)
        i++;
    kvs__pop_t *op = &p->ops[i];
    op->used = true;
    op->gen = (op->gen + 1) & 0x7fffffffu;
    op->room = r->id;
    op->flow = (int32_t)f;
    op->chunk = chunk;
    kvs_write_desc_t w = {.local_addr = local, .local_mr = mr, .len_bytes = len,
                          .remote_addr = remote, .rkey = rkey,
                          .wr_id = (uint64_t)op->gen << 32 | i};
    int rc = p->fab->ops.write(p->fab, p->peers[f].conn, &w);
    if (rc != KVS_OK) {
        op->used = false;
        return rc;
    }
    p->ops_used++;
    p->stats.rdma_writes++;
    p->stats.rdma_write_bytes += len;
    r->writes++;
    r->bytes += len;
    return KVS_OK;
}

/* Where this rank's stage writes in a region of decode stage e (spec §4,
 * slots matched by global layer id): *lp layers of its own, into the *lx
 * layer slots of the region from slot *slot. */
static void kvs__stage_slots(const kvs_prefill_t *p, int64_t decode_stage, int64_t *lp,
                             int64_t *lx, int64_t *slot)
{
    int64_t first_p = 0, first_d = 0;
    *lp = *lx = 0;
    (void)kvs_layout_stage_layers(p->lay, KVS_ROLE_PREFILL, p->stage, &first_p, lp);
    (void)kvs_layout_stage_layers(p->lay, KVS_ROLE_DECODE, decode_stage, &first_d, lx);
    *slot = first_p - first_d;
}

/* The gathered block of a chunk goes out: one write when this stage's
 * layers are exactly the region's, else the K and the V layers of this
 * stage apart (prefill PP over a decode of PP 1).
 * Posts, in order, the writes of the chunk not posted yet: when the fabric
 * refuses one (KVS_EAGAIN: its send queue is full) those before it stay in
 * flight and the call is made again later for the rest. */
static int kvs__write_chunk(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk)
{
    kvs__ppeer_t *peer = &p->peers[f];
    kvs__pchunk_t *c = &r->flows[f].chunks[chunk];
    kvs_writer_t w;
    int rc = kvs_layout_writer(p->lay, peer->tp_rank, peer->pp_rank, peer->writer, c->tokens,
                               &w);
    if (rc != KVS_OK)
        return rc;
    const uint64_t blk = (uint64_t)kvs_layout_layer_block_bytes(p->lay, c->tokens,
                                                                w.heads.num_heads);
    int64_t lp, lx, slot;
    kvs__stage_slots(p, peer->pp_rank, &lp, &lx, &slot);
    const uint64_t local = p->m->staging_addr[c->worker];
    kvs_mr_t *mr = p->m->staging_mr[c->worker];
    const uint64_t region = peer->ring_addr + c->offset + (uint64_t)w.offset_bytes;
    const int32_t writes = slot == 0 && lp == lx ? 1 : 2;
    while (c->writes_posted < writes) {
        if (writes == 1) /* the whole block */
            rc = kvs__post_write(p, r, f, chunk, local, mr, region, peer->ring_rkey,
                                 2 * (uint64_t)lp * blk);
        else if (c->writes_posted == 0) /* K layers */
            rc = kvs__post_write(p, r, f, chunk, local, mr, region + (uint64_t)slot * blk,
                                 peer->ring_rkey, (uint64_t)lp * blk);
        else /* V layers */
            rc = kvs__post_write(p, r, f, chunk, local + (uint64_t)lp * blk, mr,
                                 region + (uint64_t)(lx + slot) * blk, peer->ring_rkey,
                                 (uint64_t)lp * blk);
        if (rc != KVS_OK)
            return rc;
        c->writes_posted++;
        c->writes_pending++;
    }
    return KVS_OK;
}

static void kvs__chunk_ready(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk)
{
    kvs__pflow_t *fl = &r->flows[f];
    kvs__pchunk_t *c = &fl->chunks[chunk];
    if (c->worker >= 0)
        p->worker_busy[c->worker] = false;
    c->worker = -1;
    c->state = KVS__PCH_DONE;
    fl->chunks_done++;
    kvs_msg_t msg = {.type = KVS_MSG_CHUNK_READY};
    msg.u.ready = (kvs_msg_chunk_ready_t){.room = r->id,
                                          .chunk = chunk, .page_start = c->page_start,
                                          .pages = c->num_pages, .writer = p->peers[f].writer,
                                          .stage = p->stage};
    kvs__send(p, &p->peers[f], &msg);
}

/* ---- creation --------------------------------------------------------------- */

void kvs_prefill_destroy(kvs_prefill_t *p)
{
    if (p == NULL)
        return;
    kvs_manager_t *m = p->m;
    while (p->first != NULL)
        kvs__room_remove(p, p->first);
    kvs__table_fini(&p->rooms);
    kvs__manager_close_kv(m, &p->kv_keys);
    kvs__links_fini(&p->links);
    for (int64_t i = 0; p->peers != NULL && i < p->ntargets; i++)
        free(p->peers[i].layers);
    if (p->stream != NULL)
        kvs__dev_stream_destroy(p->dev, p->stream);
    kvs__results_fini(&p->results);
    free(p->gone);
    free(p->peers);
    free(p->worker_busy);
    free(p->ops);
    free(p->gathers);
    free(p->fuse_flows);
    free(p->fuse_workers);
    free(p->fuse_parts);
    free(p->cq);
    m->handler = NULL;
    free(p);
}

int kvs_prefill_create(kvs_manager_t *m, kvs_prefill_t **out)
{
    if (out == NULL)
        return m != NULL ? KVS__MFAIL(m, KVS_EINVAL, "out must not be NULL") : KVS_EINVAL;
    *out = NULL;
    int rc;
    kvs_prefill_t *p = kvs__manager_handler_new(m, KVS_ROLE_PREFILL, sizeof *p, &rc);
    if (p == NULL)
        return rc;
    const kvs_layout_t lay = m->layout;
    const kvs_path_t path = m->path;
    p->m = m;
    p->next_check_ns = UINT64_MAX;
    p->fab = m->fab;
    p->dev = m->dev;
    p->lay = &m->layout;
    p->path = path;
    p->rank = m->cfg.tp_rank;
    p->stage = m->cfg.pp_rank;
    p->session = m->cfg.session_id;
    p->ntargets = lay.targets_per_prefill;
    p->workers = m->staging_count;
    p->ops_cap = m->cfg.max_inflight_writes;
    if (path == KVS_PATH_STAGING && lay.prefill_layers != lay.decode_layers && p->ops_cap < 2)
        p->ops_cap = 2; /* a staged chunk's K and V writes go out together */
    p->gathers_cap = p->workers > 0 ? p->workers : 1;
    kvs__fingerprint(&lay, path, m->cfg.app_tag, &p->fp);
    p->peers = calloc((size_t)p->ntargets, sizeof *p->peers);
    p->worker_busy = calloc(p->gathers_cap, sizeof *p->worker_busy);
    p->ops = calloc(p->ops_cap, sizeof *p->ops);
    p->gathers = calloc(p->gathers_cap, sizeof *p->gathers);
    p->fuse_cap = kvs__min_i64(kvs__min_i64(p->ntargets, p->gathers_cap), KVS_COPY_PARTS_MAX);
    p->fuse_flows = calloc((size_t)p->fuse_cap, sizeof *p->fuse_flows);
    p->fuse_workers = calloc((size_t)p->fuse_cap, sizeof *p->fuse_workers);
    p->fuse_parts = calloc((size_t)p->fuse_cap, sizeof *p->fuse_parts);
    p->cq = calloc(KVS__POLL_BATCH, sizeof *p->cq);
    p->gone = calloc(m->cfg.max_rooms, sizeof *p->gone);
    if (p->gone == NULL || p->peers == NULL || p->worker_busy == NULL || p->ops == NULL || p->gathers == NULL ||
        p->fuse_flows == NULL || p->fuse_workers == NULL || p->fuse_parts == NULL ||
        p->cq == NULL || kvs__table_init(&p->rooms, m->cfg.max_rooms) != KVS_OK ||
        kvs__results_init(&p->results, 2 * m->cfg.max_rooms) != KVS_OK ||
        /* a link per decode, plus slack for connections of decodes that
         * restarted or were refused */
        kvs__links_init(&p->links, p->fab, (uint32_t)(2 * p->ntargets + 16), p->session,
                        m->cfg.retry_timeout_ns, m->cfg.stall_timeout_ns / 32,
                        m->cfg.stall_timeout_ns, &p->stats) != KVS_OK) {
        kvs_prefill_destroy(p);
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the prefill handler's tables failed");
    }
    for (int64_t i = 0; i < p->ntargets; i++) {
        kvs__ppeer_t *peer = &p->peers[i];
        (void)kvs_layout_target(&lay, p->rank, i, &peer->tp_rank);
        peer->pp_rank = lay.decode_pp == 1 ? 0 : p->stage;
        (void)kvs_layout_writer_index(&lay, p->rank, peer->tp_rank, &peer->writer);
        (void)kvs_head_slice(lay.total_heads, lay.prefill_tp, lay.decode_tp, p->rank,
                             peer->tp_rank, &peer->heads);
    }
    if (path == KVS_PATH_STAGING) {
        rc = kvs__dev_stream_create(p->dev, &p->stream);
        if (rc != KVS_OK) {
            kvs_prefill_destroy(p);
            return KVS__MFAIL(m, rc, "device '%s' could not create the gather stream (%s)",
                              m->dev->name, kvs_strerror(rc));
        }
    } else {
        rc = kvs__manager_open_kv(m, &p->kv_keys);
        if (rc != KVS_OK) {
            kvs_prefill_destroy(p);
            return rc;
        }
    }
    *out = p;
    return KVS_OK;
}

/* ---- requests --------------------------------------------------------------- */

int kvs_prefill_room_open(kvs_prefill_t *p, uint64_t room, int64_t total_tokens,
                          const int64_t *pages, int64_t num_pages)
{
    if (p == NULL)
        return KVS_EINVAL;
    kvs_manager_t *m = p->m;
    const int64_t ps = p->lay->page_size;
    if (total_tokens < 0 || num_pages != kvs__ceil_div(total_tokens, ps) ||
        (pages == NULL && num_pages > 0))
        return KVS__MFAIL(m, KVS_EINVAL, "room %llu: %lld tokens need %lld page ids, got "
                          "%lld", (unsigned long long)room, (long long)total_tokens,
                          (long long)(total_tokens >= 0 ? kvs__ceil_div(total_tokens, ps) : 0), (long long)num_pages);
    for (int64_t i = 0; i < num_pages; i++)
        if (pages[i] < 0 || pages[i] >= m->kv.num_pages)
            return KVS__MFAIL(m, KVS_ERANGE, "room %llu: page id %lld outside the KV pool "
                              "of %lld pages", (unsigned long long)room, (long long)pages[i],
                              (long long)m->kv.num_pages);
    kvs__proom_t *r = kvs__table_get(&p->rooms, room);
    if (r != NULL && r->opened)
        return KVS__MFAIL(m, KVS_EALREADY, "room %llu is already open",
                          (unsigned long long)room);
    int64_t *copy = malloc((size_t)(num_pages > 0 ? num_pages : 1) * sizeof *copy);
    if (copy == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating room %llu failed", (unsigned long long)room);
    if (r == NULL)
        r = kvs__room_get_or_add(p, room);
    if (r == NULL) {
        free(copy);
        return KVS__MFAIL(m, KVS_EFULL, "room table full (%u rooms): raise max_rooms or "
                          "finish requests first", m->cfg.max_rooms);
    }
    if (num_pages > 0)
        memcpy(copy, pages, (size_t)num_pages * sizeof *pages);
    r->pages = copy;
    r->num_pages = num_pages;
    r->total = total_tokens;
    r->opened = true;
    r->open_ns = kvs__now(p);
    kvs__touch(p, r);
    for (int64_t f = 0; f < p->ntargets; f++) {
        if (r->flows[f].known && r->flows[f].total != total_tokens)
            kvs__room_fail(p, r, KVS_EPROTO);
        if (p->peers[f].lost) /* it would never take part: fail now, not later */
            kvs__room_fail(p, r, KVS_EPEER);
    }
    return KVS_OK;
}

int kvs_prefill_room_computed(kvs_prefill_t *p, uint64_t room, int64_t end_tokens, bool final)
{
    if (p == NULL)
        return KVS_EINVAL;
    kvs__proom_t *r = kvs__table_get(&p->rooms, room);
    if (r == NULL || !r->opened)
        return KVS__MFAIL(p->m, KVS_ENOENT, "room %llu is not open on this prefill rank",
                          (unsigned long long)room);
    if (end_tokens < r->computed || end_tokens > r->total || (final && end_tokens != r->total))
        return KVS__MFAIL(p->m, KVS_EINVAL, "room %llu: computed end %lld must grow up to "
                          "the %lld tokens of the request (final at the end)",
                          (unsigned long long)room, (long long)end_tokens, (long long)r->total);
    r->computed = end_tokens;
    kvs__touch(p, r);
    r->final = r->final || final;
    return KVS_OK;
}

/* ---- message handling ------------------------------------------------------- */

static void kvs__on_register(kvs_prefill_t *p, kvs_conn_t *conn, uint64_t session,
                             const kvs_msg_register_t *g)
{
    kvs_msg_t ack = {.type = KVS_MSG_REGISTER_ACK};
    ack.u.ack = (kvs_msg_register_ack_t){.echo = session, .tp_rank = p->rank,
                                         .pp_rank = p->stage, .status = KVS_OK, .fp = p->fp};
    char why[160];
    int64_t f = 0;
    while (f < p->ntargets &&
           (p->peers[f].tp_rank != g->tp_rank || p->peers[f].pp_rank != g->pp_rank))
        f++;
    int status = kvs__fingerprint_check(&p->fp, &g->fp, why, sizeof why);
    if (status == KVS_OK && f == p->ntargets) {
        status = KVS_EINVAL;
        snprintf(why, sizeof why, "decode rank tp %lld pp %lld is not a target of prefill "
                 "rank %lld", (long long)g->tp_rank, (long long)g->pp_rank, (long long)p->rank);
    }
    /* A staging decode sends no layer keys (else it would size our
     * allocation); a direct one sends its layers, heads and a pool whose
     * layer size fits in 64 bits (page addresses are computed from it). */
    if (status == KVS_OK && p->path == KVS_PATH_STAGING &&
        (g->ring_bytes == 0 || g->ring_addr + g->ring_bytes < g->ring_addr ||
         g->layers_total != 0))
        status = KVS_EPROTO;
    const int64_t page_bytes = p->lay->page_size * p->lay->dst_heads * p->lay->head_dim *
                               p->lay->elem_bytes;
    int64_t lp = 0, lx = 0, slot = 0; /* lx: the layers of the decode's stage */
    if (f < p->ntargets)
        kvs__stage_slots(p, p->peers[f].pp_rank, &lp, &lx, &slot);
    if (status == KVS_OK && p->path != KVS_PATH_STAGING &&
        (g->layers_total != lx || g->local_heads != p->lay->dst_heads ||
         g->num_pages <= 0 || g->num_pages > INT64_MAX / page_bytes))
        status = KVS_EPROTO;
    if (status != KVS_OK) {
        if (status == KVS_EPROTO)
            snprintf(why, sizeof why, "decode registration geometry is inconsistent");
        ack.u.ack.status = status;
        KVS__MFAIL(p->m, status, "refused a decode registration: %s", why);
        kvs__log(&p->m->log, KVS_LOG_ERROR, "prefill %lld: %s", (long long)p->rank, p->m->err.msg);
        (void)kvs__link_send(&p->links, conn, &ack);
        return;
    }
    kvs__ppeer_t *peer = &p->peers[f];
    if (peer->registered && peer->session != session)
        kvs__log(&p->m->log, KVS_LOG_WARN, "prefill %lld: decode %lld/%lld re-registered "
                 "as a new session: its watermark starts over", (long long)p->rank,
                 (long long)g->tp_rank, (long long)g->pp_rank);
    /* A registration over a registered one is a new incarnation of that
     * decode (same session id or not): the regions its previous incarnation
     * handed out mean nothing to the new one, so what this rank still owes
     * the old one fails instead of being written into the new ring. */
    for (kvs__proom_t *r = peer->registered ? p->first : NULL; r != NULL; r = r->next)
        if (r->flows[f].known && !r->flows[f].reported)
            kvs__room_fail(p, r, KVS_EPEER);
    if (peer->conn != NULL && peer->conn != conn)
        kvs__link_forget(&p->links, peer->conn); /* the old incarnation's */
    peer->conn = conn;
    peer->lost = false;
    peer->session = session;
    peer->wm = (kvs_watermark_t){0, 0};
    peer->ring_addr = g->ring_addr;
    peer->ring_bytes = g->ring_bytes;
    peer->ring_rkey = g->ring_rkey;
    peer->local_heads = g->local_heads;
    peer->num_pages = g->num_pages;
    peer->layers_total = g->layers_total;
    peer->layers_got = 0;
    free(peer->layers);
    peer->layers = NULL;
    if (g->layers_total > 0) {
        peer->layers = calloc((size_t)g->layers_total, sizeof *peer->layers);
        if (peer->layers == NULL)
            ack.u.ack.status = KVS_ENOMEM;
    }
    peer->registered = ack.u.ack.status == KVS_OK;
    kvs__send(p, peer, &ack);
}

static kvs__ppeer_t *kvs__peer_of(kvs_prefill_t *p, const kvs_conn_t *conn, uint64_t session,
                                  int64_t *f)
{
    for (int64_t i = 0; i < p->ntargets; i++) {
        if (p->peers[i].registered && p->peers[i].conn == conn && p->peers[i].session == session) {
            *f = i;
            return &p->peers[i];
        }
    }
    return NULL;
}

static void kvs__on_room(kvs_prefill_t *p, int64_t f, const kvs_msg_room_t *q)
{
    const int64_t ps = p->lay->page_size;
    /* More pages than the decode's pool holds cannot be real (and on the
     * direct path would size our page list). */
    if (q->base_tokens < 0 || q->total_tokens < q->base_tokens || q->base_tokens % ps != 0 ||
        q->num_pages != kvs__ceil_div(q->total_tokens - q->base_tokens, ps) ||
        q->num_pages > p->peers[f].num_pages) {
        p->stats.msgs_rejected++;
        return;
    }
    kvs__proom_t *r = kvs__table_get(&p->rooms, q->room);
    for (uint32_t i = 0; r == NULL && i < p->gone_count; i++) {
        if (p->gone[i].room != q->room)
            continue;
        /* Ended (failed) before this decode's ROOM came: tell it now. */
        kvs_msg_t msg = {.type = KVS_MSG_ABORT};
        msg.u.abort = (kvs_msg_abort_t){.room = q->room,
                                        .status = p->gone[i].status};
        kvs__send(p, &p->peers[f], &msg);
        msg = (kvs_msg_t){.type = KVS_MSG_STATUS};
        msg.u.status = (kvs_msg_status_t){.room = q->room,
                                          .tp_rank = p->rank, .pp_rank = p->stage,
                                          .status = p->gone[i].status};
        kvs__send(p, &p->peers[f], &msg);
        return;
    }
    if (r == NULL)
        r = kvs__room_get_or_add(p, q->room);
    if (r == NULL) {
        p->stats.msgs_rejected++;
        return;
    }
    kvs__pflow_t *fl = &r->flows[f];
    if (fl->known) {
        p->stats.msgs_rejected++;
        return;
    }
    fl->known = true;
    fl->base = q->base_tokens;
    fl->total = q->total_tokens;
    fl->num_dpages = q->num_pages;
    fl->cur_t = q->base_tokens;
    kvs__touch(p, r);
    if (p->path != KVS_PATH_STAGING && q->num_pages > 0) {
        fl->dpages = malloc((size_t)q->num_pages * sizeof *fl->dpages);
        if (fl->dpages == NULL)
            kvs__room_fail(p, r, KVS_ENOMEM);
    }
    if (r->opened && q->total_tokens != r->total)
        kvs__room_fail(p, r, KVS_EPROTO);
}

static void kvs__on_pages(kvs_prefill_t *p, int64_t f, const kvs_msg_pages_t *q)
{
    kvs__proom_t *r = kvs__table_get(&p->rooms, q->room);
    kvs__pflow_t *fl = r != NULL ? &r->flows[f] : NULL;
    if (fl == NULL || fl->dpages == NULL || q->first != fl->dpages_got ||
        q->first + (int64_t)q->count > fl->num_dpages) {
        p->stats.msgs_rejected++;
        return;
    }
    for (uint32_t i = 0; i < q->count; i++) {
        if (q->ids[i] < 0 || q->ids[i] >= p->peers[f].num_pages) {
            p->stats.msgs_rejected++;
            kvs__room_fail(p, r, KVS_ERANGE);
            return;
        }
        fl->dpages[q->first + i] = q->ids[i];
    }
    fl->dpages_got += q->count;
}

static void kvs__on_rsp(kvs_prefill_t *p, int64_t f, const kvs_msg_staging_rsp_t *q)
{
    kvs__proom_t *r = kvs__table_get(&p->rooms, q->room);
    kvs__pflow_t *fl = r != NULL ? &r->flows[f] : NULL;
    if (fl == NULL || q->chunk < 0 || q->chunk >= fl->num_chunks) {
        p->stats.msgs_rejected++;
        return;
    }
    kvs__pchunk_t *c = &fl->chunks[q->chunk];
    if (q->status != KVS_OK) {
        kvs__room_fail(p, r, q->status);
        return;
    }
    if (c->state != KVS__PCH_REQ) {
        if (c->offset != q->offset || c->round != q->round || c->end != q->end)
            p->stats.msgs_rejected++; /* a different answer to a duplicate */
        return;
    }
    /* A hostile or confused decode must not make us write outside its ring. */
    const uint64_t len = (uint64_t)c->region_bytes;
    if (q->end != q->offset + len || q->end < q->offset || q->end > p->peers[f].ring_bytes) {
        p->stats.msgs_rejected++;
        kvs__room_fail(p, r, KVS_ERANGE);
        return;
    }
    c->offset = q->offset;
    c->round = q->round;
    c->end = q->end;
    c->state = KVS__PCH_ALLOC;
    kvs__touch(p, r);
}

static void kvs__on_layers(kvs_prefill_t *p, int64_t f, const kvs_msg_layers_t *q)
{
    kvs__ppeer_t *peer = &p->peers[f];
    if (peer->layers == NULL || q->first != peer->layers_got ||
        q->first + (int64_t)q->count > peer->layers_total) {
        p->stats.msgs_rejected++;
        return;
    }
    memcpy(peer->layers + q->first, q->entries, q->count * sizeof *q->entries);
    peer->layers_got += q->count;
}

static void kvs__on_message(kvs_prefill_t *p, const kvs_completion_t *cqe)
{
    kvs_msg_t msg;
    const int got = kvs__link_recv(&p->links, cqe, &msg);
    if (got < 0)
        p->stats.msgs_rejected++;
    if (got <= 0)
        return; /* rejected, or taken by the link (an ACK, a duplicate) */
    p->stats.msgs_received++;
    if (msg.type == KVS_MSG_REGISTER) {
        kvs__on_register(p, cqe->conn, msg.session, &msg.u.reg);
        return;
    }
    int64_t f;
    kvs__ppeer_t *peer = kvs__peer_of(p, cqe->conn, msg.session, &f);
    if (peer == NULL) {
        p->stats.msgs_rejected++; /* unknown or stale session */
        return;
    }
    switch (msg.type) {
    case KVS_MSG_LAYERS:
        kvs__on_layers(p, f, &msg.u.layers);
        break;
    case KVS_MSG_ROOM:
        kvs__on_room(p, f, &msg.u.room);
        break;
    case KVS_MSG_PAGES:
        kvs__on_pages(p, f, &msg.u.pages);
        break;
    case KVS_MSG_STAGING_RSP:
        kvs__on_rsp(p, f, &msg.u.rsp);
        break;
    case KVS_MSG_WATERMARK:
        peer->wm = (kvs_watermark_t){msg.u.wm.round, msg.u.wm.offset};
        break;
    case KVS_MSG_ABORT: {
        /* An abort may overtake this rank's room_open: keep it (bounded by
         * the room table) so the open fails at once; unopened, it expires. */
        kvs__proom_t *r = kvs__room_get_or_add(p, msg.u.abort.room);
        if (r != NULL)
            kvs__room_fail(p, r, msg.u.abort.status != KVS_OK ? msg.u.abort.status : KVS_EPEER);
        else
            p->stats.msgs_rejected++;
        break;
    }
    default:
        p->stats.msgs_rejected++;
        break;
    }
}

static void kvs__on_write_done(kvs_prefill_t *p, const kvs_completion_t *cqe)
{
    const uint32_t i = (uint32_t)(cqe->wr_id & 0xffffffffu);
    const uint32_t gen = (uint32_t)(cqe->wr_id >> 32);
    if (i >= p->ops_cap || !p->ops[i].used || p->ops[i].gen != gen) {
        p->stats.msgs_rejected++;
        return;
    }
    kvs__pop_t op = p->ops[i];
    p->ops[i].used = false;
    p->ops_used--;
    kvs__proom_t *r = kvs__table_get(&p->rooms, op.room);
    if (r == NULL)
        return;
    kvs__pflow_t *fl = &r->flows[op.flow];
    kvs__touch(p, r);
    if (cqe->status != KVS_OK)
        kvs__room_fail(p, r, cqe->status);
    if (op.chunk < 0) {
        fl->writes_pending--;
        return;
    }
    kvs__pchunk_t *c = &fl->chunks[op.chunk];
    if (--c->writes_pending > 0 || c->unposted)
        return; /* more of it in flight, or still to be posted */
    if (r->status == KVS_OK) {
        kvs__chunk_ready(p, r, op.flow, op.chunk);
    } else {
        p->worker_busy[c->worker] = false;
        c->worker = -1;
        c->state = KVS__PCH_DONE;
    }
}

/* ---- progress --------------------------------------------------------------- */

static void kvs__send_requests(kvs_prefill_t *p, kvs__proom_t *r, int64_t f)
{
    kvs__pflow_t *fl = &r->flows[f];
    const int64_t pages = fl->num_dpages;
    fl->num_chunks = kvs_grid_num_chunks(p->lay, pages);
    fl->chunks = calloc((size_t)fl->num_chunks, sizeof *fl->chunks);
    if (fl->chunks == NULL) {
        fl->num_chunks = 0;
        kvs__room_fail(p, r, KVS_ENOMEM);
        return;
    }
    fl->reqs_sent = true;
    for (int64_t i = 0; i < fl->num_chunks; i++) {
        kvs__pchunk_t *c = &fl->chunks[i];
        kvs_chunk_t ch;
        if (kvs_grid_chunk(p->lay, fl->base, fl->total, i, &ch) != KVS_OK ||
            kvs_layout_region_bytes(p->lay, p->peers[f].tp_rank, p->peers[f].pp_rank,
                                    ch.token_end - ch.token_start, &c->region_bytes) != KVS_OK) {
            kvs__room_fail(p, r, KVS_ERANGE);
            return;
        }
        c->tokens = ch.token_end - ch.token_start;
        c->token_start = ch.token_start;
        c->token_end = ch.token_end;
        c->page_start = ch.page_start;
        c->num_pages = ch.num_pages;
        c->worker = -1;
        c->state = KVS__PCH_REQ;
        kvs_msg_t msg = {.type = KVS_MSG_STAGING_REQ};
        msg.u.req = (kvs_msg_staging_req_t){.room = r->id, .chunk = i,
                                            .pages = ch.num_pages, .tokens = c->tokens,
                                            .writer = p->peers[f].writer, .stage = p->stage};
        kvs__send(p, &p->peers[f], &msg);
    }
}

static int32_t kvs__free_worker(const kvs_prefill_t *p)
{
    for (uint32_t w = 0; w < p->workers; w++)
        if (!p->worker_busy[w])
            return (int32_t)w;
    return -1;
}

/* Writes one staged chunk takes: one, or K and V apart with prefill PP
 * over a decode of PP 1 (every target is at the same decode stage). */
static uint32_t kvs__chunk_writes(const kvs_prefill_t *p)
{
    int64_t lp, lx, slot;
    kvs__stage_slots(p, p->lay->decode_pp == 1 ? 0 : p->stage, &lp, &lx, &slot);
    return slot == 0 && lp == lx ? 1 : 2;
}

/* Chunk i of flow g may join a gather of the same chunk of another flow:
 * its region is ready now, it covers the same tokens, and no earlier chunk
 * of its flow still waits (regions are gathered in ring order). */
static bool kvs__can_join(const kvs_prefill_t *p, const kvs__proom_t *r, int64_t g, int64_t i,
                          const kvs__pchunk_t *c)
{
    const kvs__pflow_t *fl = &r->flows[g];
    if (!fl->known || !fl->reqs_sent || !p->peers[g].registered || p->peers[g].lost ||
        i >= fl->num_chunks)
        return false;
    const kvs__pchunk_t *cg = &fl->chunks[i];
    if (cg->state != KVS__PCH_ALLOC || cg->token_start != c->token_start ||
        cg->tokens != c->tokens || !kvs_ring_ready(p->peers[g].wm, cg->round, cg->end))
        return false;
    for (int64_t j = 0; j < i; j++)
        if (fl->chunks[j].state == KVS__PCH_ALLOC)
            return false;
    return true;
}

/* Gathers chunk i of flow f, and of every other flow of the room that can
 * join it now, in one fused copy (each token row of the KV pool read once
 * for all the decode ranks it feeds), one staging buffer per flow. It waits
 * (returns false; a later progress call tries again) until a buffer and
 * the write slots are free for every flow that joins: those free up as
 * writes in flight complete, which never waits on a gather, and a copy
 * never takes more than there are (fuse_cap, and the write slots), so the
 * wait ends. Also false when the room failed. */
static bool kvs__gather_chunk(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t i)
{
    kvs_manager_t *m = p->m;
    kvs__pchunk_t *c = &r->flows[f].chunks[i];
    if (p->gather_blocked)
        return false;
    const int64_t by_slots = (int64_t)(p->ops_cap / kvs__chunk_writes(p));
    const int64_t most = kvs__min_i64(p->fuse_cap, by_slots > 0 ? by_slots : 1);
    int64_t n = 0;
    for (int64_t k = 0; k < p->ntargets && n < most; k++) {
        const int64_t g = (f + k) % p->ntargets; /* flow f first */
        if (g == f || kvs__can_join(p, r, g, i, c))
            p->fuse_flows[n++] = g;
    }
    /* The write slots of these gathers and of those in flight must be free
     * when they finish: wait for writes to complete, do not fail. */
    p->gather_blocked = true; /* until it starts */
    if (p->gathers_count + (uint64_t)n > p->gathers_cap ||
        p->ops_used + (p->gathers_count + (uint64_t)n) * kvs__chunk_writes(p) > p->ops_cap)
        return false;
    for (int64_t k = 0; k < n; k++) {
        const int32_t w = kvs__free_worker(p);
        if (w < 0) { /* fewer buffers free than flows: wait for them all */
            for (int64_t j = 0; j < k; j++)
                p->worker_busy[p->fuse_workers[j]] = false;
            return false;
        }
        p->worker_busy[w] = true; /* taken for now: the next flow gets another */
        const int64_t g = p->fuse_flows[k];
        p->fuse_workers[k] = w;
        p->fuse_parts[k] = (kvs_copy_part_t){.head_start = p->peers[g].heads.src_start,
                                             .num_heads = p->peers[g].heads.num_heads,
                                             .staging_addr = m->staging_addr[w]};
    }
    for (int64_t k = 0; k < n; k++)
        p->worker_busy[p->fuse_workers[k]] = false;
    p->gather_blocked = false;
    const int64_t ps = p->lay->page_size;
    int64_t lp, lx, slot; /* this stage's layers go out of the buffer whole */
    kvs__stage_slots(p, p->peers[f].pp_rank, &lp, &lx, &slot);
    const kvs_copy_desc_t desc = {
        .k_base = m->k_base, .v_base = m->v_base, .local_heads = m->kv.local_heads,
        .head_dim = p->lay->head_dim, .elem_bytes = p->lay->elem_bytes, .page_size = ps,
        .pages = r->pages + c->token_start / ps, .num_pages = kvs__ceil_div(c->tokens, ps),
        .tokens = c->tokens, .layer_begin = 0, .layer_count = lp,
        .staging_slot_begin = 0, .staging_layer_slots = lp};
    const int copy_rc = kvs__dev_gather_parts(p->dev, p->stream, &desc, p->fuse_parts, n);
    /* One event per chunk, each complete when the fused copy is. Recorded
     * after a refused copy too: one refused part-way may have left its first
     * parts enqueued (the core's default copy runs one op per part), and
     * their buffers must stay busy until those ran (kvs__reap_gathers frees
     * them, the room having failed). */
    int rc = KVS_OK;
    int64_t recorded = 0;
    for (; recorded < n && rc == KVS_OK; recorded++)
        rc = kvs__dev_event_record(p->dev, p->stream,
                                   &r->flows[p->fuse_flows[recorded]].chunks[i].event);
    if (rc != KVS_OK) {
        for (int64_t k = 0; k < recorded; k++) {
            kvs__pchunk_t *cg = &r->flows[p->fuse_flows[k]].chunks[i];
            if (cg->event != NULL)
                kvs__dev_event_destroy(p->dev, cg->event);
            cg->event = NULL;
        }
        kvs__room_fail(p, r, copy_rc != KVS_OK ? copy_rc : rc);
        return false;
    }
    for (int64_t k = 0; k < n; k++) {
        const int64_t g = p->fuse_flows[k];
        kvs__pchunk_t *cg = &r->flows[g].chunks[i];
        p->worker_busy[p->fuse_workers[k]] = true;
        cg->worker = p->fuse_workers[k];
        cg->state = KVS__PCH_GATHER;
        if (copy_rc == KVS_OK && cg->waited && m->cfg.trace != NULL)
            m->cfg.trace(m->cfg.trace_ctx, "wait-for-watermark", r->id, i, cg->wait_ns,
                         kvs__now(p));
        p->gathers[(p->gathers_head + p->gathers_count) % p->gathers_cap] =
            (kvs__pgather_t){r->id, (int32_t)g, i};
        p->gathers_count++;
        p->stats.copies += copy_rc == KVS_OK;
    }
    if (copy_rc != KVS_OK) {
        kvs__room_fail(p, r, copy_rc);
        return false;
    }
    return true;
}

/* Starts the gathers of chunks that are computed, ready and have a buffer. */
static void kvs__advance_staging(kvs_prefill_t *p, kvs__proom_t *r, int64_t f)
{
    kvs__pflow_t *fl = &r->flows[f];
    kvs__ppeer_t *peer = &p->peers[f];
    for (int64_t i = 0; i < fl->num_chunks && r->status == KVS_OK; i++) {
        kvs__pchunk_t *c = &fl->chunks[i];
        if (c->unposted) {
            const int rc = kvs__write_chunk(p, r, f, i);
            if (rc == KVS_OK)
                c->unposted = false;
            else if (rc != KVS_EAGAIN)
                kvs__room_fail(p, r, rc); /* releases it, or its last completion will */
            continue;
        }
        if (c->state != KVS__PCH_ALLOC)
            continue;
        if (c->token_end > r->computed && !r->final)
            break; /* later chunks are not computed either */
        if (c->tokens == 0) { /* metadata-only: nothing to move */
            kvs__chunk_ready(p, r, f, i);
            continue;
        }
        if (!kvs_ring_ready(peer->wm, c->round, c->end)) {
            if (!c->waited) {
                p->stats.watermark_waits++;
                c->wait_ns = kvs__now(p);
            }
            c->waited = true;
            break; /* regions are handed out in ring order: later ones wait too */
        }
        if (!kvs__gather_chunk(p, r, f, i))
            return;
    }
}

/* Address of token t's head slice in one KV layer buffer. */
static uint64_t kvs__slot_addr(uint64_t base, int64_t page, int64_t slot, int64_t ps,
                               int64_t heads, int64_t head, int64_t head_bytes)
{
    return base + (uint64_t)(((page * ps + slot) * heads + head) * head_bytes);
}

/* Posts direct/slice writes from the cursor until the in-flight bound. */
static void kvs__advance_direct(kvs_prefill_t *p, kvs__proom_t *r, int64_t f)
{
    kvs__pflow_t *fl = &r->flows[f];
    kvs__ppeer_t *peer = &p->peers[f];
    kvs_manager_t *m = p->m;
    if (!r->final || fl->posted_all || fl->dpages_got < fl->num_dpages ||
        peer->layers_got < peer->layers_total)
        return;
    const int64_t ps = p->lay->page_size;
    int64_t lp, lx, first; /* this stage's layers, from slot `first` of the decode's */
    kvs__stage_slots(p, peer->pp_rank, &lp, &lx, &first);
    const int64_t hb = p->lay->head_dim * p->lay->elem_bytes;
    const int64_t nh = peer->heads.num_heads;
    const bool sliced = nh != m->kv.local_heads || nh != peer->local_heads;
    while (r->status == KVS_OK && fl->cur_t < fl->total) {
        const int64_t t = fl->cur_t;
        const int64_t pi = t / ps, di = (t - fl->base) / ps, slot = t % ps;
        if (fl->run_tokens == 0) {
            if (sliced) {
                fl->run_tokens = 1;
            } else { /* the longest run of pages consecutive on both sides */
                int64_t k = 1;
                while ((pi + k) * ps < fl->total && r->pages[pi + k] == r->pages[pi] + k &&
                       fl->dpages[di + k] == fl->dpages[di] + k)
                    k++;
                fl->run_tokens = ((pi + k) * ps < fl->total ? (pi + k) * ps : fl->total) - t;
            }
        }
        const int64_t dl = first + fl->cur_l;
        const kvs_layer_entry_t *e = &peer->layers[dl];
        const uint64_t src = kvs__slot_addr(fl->cur_kv ? m->v_base[fl->cur_l] : m->k_base[fl->cur_l],
                                            r->pages[pi], slot, ps, m->kv.local_heads,
                                            peer->heads.src_start, hb);
        const uint64_t dst = kvs__slot_addr(fl->cur_kv ? e->v_addr : e->k_addr, fl->dpages[di],
                                            slot, ps, peer->local_heads, peer->heads.dst_start,
                                            hb);
        const uint64_t len = (uint64_t)(sliced ? nh * hb : fl->run_tokens * nh * hb);
        int rc = kvs__post_write(p, r, f, -1, src,
                                 fl->cur_kv ? p->kv_keys.v_mr[fl->cur_l] : p->kv_keys.k_mr[fl->cur_l], dst,
                                 fl->cur_kv ? e->v_rkey : e->k_rkey, len);
        if (rc == KVS_EAGAIN)
            return;
        if (rc != KVS_OK) {
            kvs__room_fail(p, r, rc);
            return;
        }
        fl->writes_pending++;
        if (++fl->cur_kv == 2) {
            fl->cur_kv = 0;
            if (++fl->cur_l == lp) {
                fl->cur_l = 0;
                fl->cur_t += fl->run_tokens;
                fl->run_tokens = 0;
            }
        }
    }
    fl->posted_all = fl->cur_t >= fl->total || r->status != KVS_OK;
}

/* Completed gathers in stream order: their chunks go on the wire. */
static void kvs__reap_gathers(kvs_prefill_t *p)
{
    while (p->gathers_count > 0) {
        kvs__pgather_t g = p->gathers[p->gathers_head];
        kvs__proom_t *r = kvs__table_get(&p->rooms, g.room);
        kvs__pchunk_t *c = &r->flows[g.flow].chunks[g.chunk];
        int rc = kvs__dev_event_query(p->dev, c->event);
        if (rc == KVS_EAGAIN)
            return;
        kvs__dev_event_destroy(p->dev, c->event);
        c->event = NULL;
        p->gathers_head = (p->gathers_head + 1) % p->gathers_cap;
        p->gathers_count--;
        if (rc == KVS_OK && r->status == KVS_OK) {
            c->state = KVS__PCH_WRITE;
            rc = kvs__write_chunk(p, r, g.flow, g.chunk);
            if (rc == KVS_EAGAIN) {
                c->unposted = true; /* the fabric's queue is full: the rest later */
                continue;
            }
        }
        if (rc != KVS_OK || r->status != KVS_OK) {
            if (rc != KVS_OK)
                kvs__room_fail(p, r, rc);
            if (c->writes_pending == 0) {
                p->worker_busy[c->worker] = false;
                c->worker = -1;
                c->state = KVS__PCH_DONE;
            }
        }
    }
}

/* The fabric found a connection dead. If it was a registered decode's, that
 * decode crashed or restarted: nothing more reaches it and none of its
 * writes can land, so what this rank owes it fails and the other decodes
 * are told. */
static void kvs__peer_lost(void *ctx, kvs_conn_t *conn)
{
    kvs_prefill_t *p = ctx;
    p->fab->ops.disconnect(p->fab, conn); /* the peer hears of it too */
    int64_t f = 0;
    while (f < p->ntargets && !(p->peers[f].registered && p->peers[f].conn == conn))
        f++;
    if (f == p->ntargets)
        return; /* a refused or replaced connection */
    kvs__ppeer_t *peer = &p->peers[f];
    peer->registered = false;
    peer->lost = true;
    peer->conn = NULL;
    kvs__log(&p->m->log, KVS_LOG_WARN, "prefill %lld: decode %lld/%lld is unreachable (its "
             "connection died): its rooms fail until it registers again",
             (long long)p->rank, (long long)peer->tp_rank, (long long)peer->pp_rank);
    for (kvs__proom_t *r = p->first, *after; r != NULL; r = after) {
        after = r->next;
        /* its flow reports (to nobody) once its posted writes completed */
        kvs__room_fail(p, r, KVS_EPEER);
        kvs__room_try_finish(p, r);
    }
}

/* Rooms past their stall deadline (spec §9): the first expiry fails the room
 * with KVS_ETIMEDOUT and tells the decode ranks; flows report once their
 * posted writes completed. A failed room the caller never opened is dropped
 * one timeout later, silently: nobody asked for it. */
static void kvs__expire(kvs_prefill_t *p)
{
    const uint64_t now = kvs__now(p), timeout = p->m->cfg.stall_timeout_ns;
    if (now < p->next_check_ns)
        return;
    uint64_t next = UINT64_MAX;
    for (kvs__proom_t *r = p->first, *after; r != NULL; r = after) {
        after = r->next;
        if (now >= kvs__sat_add_u64(r->last_ns, timeout)) {
            if (r->status == KVS_OK) {
                kvs__room_fail(p, r, KVS_ETIMEDOUT);
            } else if (!r->opened) {
                kvs__room_remove(p, r);
                continue;
            }
            r->last_ns = now;
        }
        if (kvs__sat_add_u64(r->last_ns, timeout) < next)
            next = kvs__sat_add_u64(r->last_ns, timeout);
    }
    p->next_check_ns = next;
}

int kvs_prefill_progress(kvs_prefill_t *p)
{
    if (p == NULL)
        return KVS_EINVAL;
    int work = 0;
    for (;;) {
        int n = p->fab->ops.poll(p->fab, p->cq, KVS__POLL_BATCH);
        if (n < 0)
            return KVS__MFAIL(p->m, n, "polling fabric '%s' failed: %s", p->fab->name,
                              p->fab->last_backend_msg[0] ? p->fab->last_backend_msg
                                                          : kvs_strerror(n));
        for (int i = 0; i < n; i++) {
            if (p->cq[i].kind == KVS_COMPLETION_RECV)
                kvs__on_message(p, &p->cq[i]);
            else if (p->cq[i].kind == KVS_COMPLETION_WRITE)
                kvs__on_write_done(p, &p->cq[i]);
            else if (p->cq[i].kind == KVS_COMPLETION_DISCONNECT)
                kvs__link_kill(&p->links, p->cq[i].conn);
        }
        work += n;
        if (n < KVS__POLL_BATCH)
            break;
    }
    if (p->stream != NULL)
        kvs__reap_gathers(p);
    p->gather_blocked = false;
    for (kvs__proom_t *r = p->first, *next; r != NULL; r = next) {
        next = r->next;
        for (int64_t f = 0; f < p->ntargets; f++) {
            kvs__pflow_t *fl = &r->flows[f];
            if (!r->opened || !fl->known || !p->peers[f].registered || r->status != KVS_OK)
                continue;
            if (p->path == KVS_PATH_STAGING) {
                if (!fl->reqs_sent)
                    kvs__send_requests(p, r, f);
                kvs__advance_staging(p, r, f);
            } else {
                kvs__advance_direct(p, r, f);
            }
        }
        kvs__room_try_finish(p, r);
    }
    kvs__expire(p);
    kvs__links_tick(&p->links, kvs__now(p), kvs__peer_lost, p);
    return work;
}

int kvs_prefill_poll_rooms(kvs_prefill_t *p, kvs_room_result_t *out, int max)
{
    if (p == NULL || out == NULL || max < 0)
        return KVS_EINVAL;
    return kvs__results_pop(&p->results, out, max);
}

uint64_t kvs_prefill_next_deadline_ns(const kvs_prefill_t *p)
{
    if (p == NULL)
        return UINT64_MAX;
    const uint64_t rooms = p->first != NULL ? p->next_check_ns : UINT64_MAX;
    const uint64_t links = kvs__links_deadline(&p->links);
    return links < rooms ? links : rooms;
}

void kvs_prefill_stats(const kvs_prefill_t *p, kvs_handler_stats_t *out)
{
    if (p != NULL && out != NULL)
        *out = p->stats;
}

kvs__links_t *kvs__prefill_links(kvs_prefill_t *p) { return &p->links; }

uint64_t kvs__prefill_stall_ns(const kvs_prefill_t *p)
{
    return p->first != NULL ? p->next_check_ns : UINT64_MAX;
}
