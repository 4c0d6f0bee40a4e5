/*
 * prefill_staging.c - the staging path of a prefill rank (spec §6-§7): per
 * flow (a decode rank of the room's instance), STAGING_REQ for every chunk
 * at once; on STAGING_RSP the chunk waits until its KV is computed, its
 * region is ready against that decode's last watermark and a staging
 * buffer is free; then one fused gather with the same chunk of the room's
 * other flows that are ready then (the KV pool read once for all of them),
 * ONE write per region (two with prefill PP when the region holds more
 * layers than this stage: the K and the V layers), each under the key the
 * STAGING_RSP gave for it when the decode scopes keys (region_keys.h), and
 * CHUNK_READY once the writes completed. A fabric whose max_write_bytes is
 * below a write's bytes gets it as the fewest pieces of at most that many
 * bytes, in order, under the same key; the chunk is ready once the last
 * piece completed, and a failed piece fails the room like a failed write.
 *
 * Invariants: a staging buffer is taken by at most one chunk, from its
 * gather until its last write completed (or the room failed with none in
 * flight); a chunk's writes are posted in order; the gather FIFO holds the
 * chunks gathering, in stream order.
 */
#include "prefill.h"

#include "arith.h"
#include "chunk.h"
#include "draft_copy.h"
#include "hybrid.h"
#include "hybrid_copy.h"

#include <assert.h>
#include <stdlib.h>

/* This rank's writer index in a region: TP writer j of CP rank c is
 * c * W + j (docs/kinds/context-parallel.md; j with CP 1). */
static int64_t kvs__cp_writer(const kvs_prefill_t *p, const kvs__peer_t *peer)
{
    return p->h.m->cfg.cp_rank * peer->inst->lay.tp_writers + peer->tgt.writer;
}

bool kvs__staging_flow_done(const kvs__pflow_t *fl)
{
    return fl->reqs_sent && fl->chunks_done == fl->num_chunks;
}

void kvs__staging_send_requests(kvs_prefill_t *p, kvs__proom_t *r, int64_t f)
{
    kvs__pflow_t *fl = &r->flows[f];
    kvs__peer_t *peer = kvs__flow_peer(r, f);
    const kvs__inst_t *inst = r->base.inst;
    fl->num_chunks = kvs_grid_num_chunks(&inst->lay, fl->num_dpages);
    fl->chunks = kvs__blocks_get(&p->h.blocks, (size_t)fl->num_chunks * sizeof *fl->chunks);
    if (fl->chunks == NULL) {
        fl->num_chunks = 0;
        kvs__room_fail(&p->h, &r->base, KVS_ENOMEM, NULL);
        return;
    }
    fl->reqs_sent = true;
    for (int64_t i = 0; i < fl->num_chunks; i++) {
        kvs__pchunk_t *c = &fl->chunks[i];
        kvs__chunk_plan_t plan;
        if (kvs__chunk_plan(&inst->lay, peer->tp_rank, inst->decode_stage, fl->base, fl->total,
                            i, &plan) != KVS_OK) {
            kvs__room_fail(&p->h, &r->base, KVS_ERANGE, NULL);
            return;
        }
        c->tokens = plan.tokens;
        c->token_start = plan.token_start;
        c->token_end = plan.token_end;
        c->page_start = plan.page_start;
        c->num_pages = plan.num_pages;
        c->region_bytes = plan.region_bytes;
        c->worker = -1;
        /* This CP rank's part of the chunk; a chunk its range does not
         * meet is written by other CP ranks: done here at once. */
        const kvs_chunk_t ch = {.index = i, .page_start = plan.page_start,
                                .num_pages = plan.num_pages, .token_start = plan.token_start,
                                .token_end = plan.token_end};
        const int rc = kvs_layout_cp_part(&inst->lay, peer->tp_rank, inst->decode_stage,
                                          fl->total, &ch, p->h.m->cfg.cp_rank, &c->part);
        if (rc == KVS_ENOENT) {
            c->state = KVS__PCH_DONE;
            fl->chunks_done++;
            continue;
        }
        if (rc != KVS_OK) {
            kvs__room_fail(&p->h, &r->base, KVS_ERANGE, NULL);
            return;
        }
        c->state = KVS__PCH_REQ;
        kvs_msg_t msg = {.type = KVS_MSG_STAGING_REQ};
        msg.u.req = (kvs_msg_staging_req_t){.room = r->base.id, .chunk = i,
                                            .pages = plan.num_pages, .tokens = plan.tokens,
                                            .writer = kvs__cp_writer(p, peer),
                                            .stage = p->h.pp_rank};
        kvs__send(&p->h, peer, &msg);
    }
}

void kvs__staging_on_rsp(kvs_prefill_t *p, kvs__peer_t *peer, const kvs_msg_staging_rsp_t *q)
{
    kvs__room_t *room = kvs__room_get(&p->h, q->room);
    kvs__proom_t *r = room != NULL && room->inst == peer->inst ? kvs__proom(room) : NULL;
    kvs__pflow_t *fl = r != NULL && r->nflows > 0 ? &r->flows[peer->index] : NULL;
    if (fl == NULL || q->chunk < 0 || q->chunk >= fl->num_chunks) {
        kvs__reject(&p->h);
        return;
    }
    kvs__pchunk_t *c = &fl->chunks[q->chunk];
    if (q->status != KVS_OK) {
        kvs__room_fail(&p->h, room, q->status, NULL);
        return;
    }
    if (c->state != KVS__PCH_REQ) {
        if (c->offset != q->offset || c->round != q->round || c->end != q->end ||
            (peer->tgt.scoped_keys && (c->rkey[0] != q->rkey || c->rkey[1] != q->rkey_v)))
            kvs__reject(&p->h); /* a different answer to a duplicate */
        return;
    }
    /* A hostile or confused decode must not make us write outside its ring. */
    const uint64_t len = (uint64_t)c->region_bytes;
    if (q->end != q->offset + len || q->end < q->offset || q->end > peer->tgt.ring_bytes) {
        kvs__reject(&p->h);
        kvs__room_fail(&p->h, room, KVS_ERANGE, NULL);
        return;
    }
    c->offset = q->offset;
    c->round = q->round;
    c->end = q->end;
    c->rkey[0] = q->rkey;
    c->rkey[1] = q->rkey_v;
    c->state = KVS__PCH_ALLOC;
    kvs__room_touch(&p->h, room);
}

/* The bytes this rank writes of chunk c of flow f: 0 for a hybrid writer of
 * its state alone in a chunk that carries no state (kvs_layout_hybrid_writer),
 * which then reports its arrival without a write. Asked of hybrid layouts
 * alone: any other writer's block of a non-empty part has bytes. */
static uint64_t kvs__block_bytes(const kvs_prefill_t *p, const kvs__proom_t *r, int64_t f,
                                 const kvs__pchunk_t *c)
{
    const kvs__inst_t *inst = r->base.inst;
    const kvs__peer_t *peer = kvs__flow_peer(r, f);
    kvs__span_t span[2];
    int n = 0;
    if (kvs__part_spans(&inst->lay, peer->tp_rank, inst->decode_stage, peer->tgt.writer,
                        p->h.pp_rank, r->flows[f].total, &c->part, span, &n) != KVS_OK)
        return 1; /* not ours to judge: kvs__write_chunk reports the error */
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += span[i].len_bytes;
    return bytes;
}

/* The gathered block of a chunk goes out: one write, or the K and the V
 * layers of this stage apart when the region holds more layers (prefill
 * PP into a decode of PP 1), each under its own key of the region when the
 * decode scopes keys (else its whole ring's). Posts, in order, the writes
 * of the chunk not posted yet: when the fabric refuses one (KVS_EAGAIN:
 * its send queue is full) those before it stay in flight and the call is
 * made again later for the rest. */
static int kvs__write_chunk(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk)
{
    const kvs__inst_t *inst = r->base.inst;
    const kvs__peer_t *peer = kvs__flow_peer(r, f);
    const kvs__target_t *t = &peer->tgt;
    kvs__pchunk_t *c = &r->flows[f].chunks[chunk];
    kvs__span_t span[2];
    int n = 0;
    int rc = kvs__part_spans(&inst->lay, peer->tp_rank, inst->decode_stage, t->writer,
                             p->h.pp_rank, r->flows[f].total, &c->part, span, &n);
    if (rc != KVS_OK)
        return rc;
    assert(n == t->writes);
    const uint64_t local = p->h.m->staging_addr[c->worker];
    kvs_mr_t *mr = p->h.m->staging_mr[c->worker];
    const uint64_t region = t->ring_addr + c->offset;
    const uint64_t most = kvs__net_max_write_bytes(p->h.fab);
    int64_t k = 0; /* the piece's index in the chunk's writes */
    for (int s = 0; s < n; s++) {
        const kvs__span_t *w = &span[s];
        const uint64_t rkey = t->scoped_keys ? c->rkey[s] : t->ring_rkey;
        const uint64_t pieces = w->len_bytes / most + (w->len_bytes % most != 0);
        if (c->writes_posted >= k + (int64_t)pieces) {
            k += (int64_t)pieces;
            continue; /* this span went out already */
        }
        for (uint64_t off = (uint64_t)(c->writes_posted - k) * most; off < w->len_bytes;
             off += most) {
            const uint64_t len = w->len_bytes - off < most ? w->len_bytes - off : most;
            rc = kvs__post_write(p, r, f, chunk, local + w->local_off + off, mr,
                                 region + w->remote_off + off, rkey, len);
            if (rc != KVS_OK)
                return rc;
            c->writes_posted++;
            c->writes_pending++;
        }
        k += (int64_t)pieces;
    }
    assert(k <= t->pieces);
    return KVS_OK;
}

/* Every write of the chunk landed: the decode hears of it. */
static void kvs__chunk_ready(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk)
{
    kvs__pflow_t *fl = &r->flows[f];
    kvs__pchunk_t *c = &fl->chunks[chunk];
    kvs__pchunk_release(p, c);
    fl->chunks_done++;
    kvs__peer_t *peer = kvs__flow_peer(r, f);
    kvs_msg_t msg = {.type = KVS_MSG_CHUNK_READY};
    msg.u.ready = (kvs_msg_chunk_ready_t){.room = r->base.id, .chunk = chunk,
                                          .page_start = c->page_start, .pages = c->num_pages,
                                          .writer = kvs__cp_writer(p, peer),
                                          .stage = p->h.pp_rank};
    kvs__send(&p->h, peer, &msg);
}

void kvs__staging_write_done(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk)
{
    kvs__pchunk_t *c = &r->flows[f].chunks[chunk];
    if (--c->writes_pending > 0 || c->unposted)
        return; /* more of it in flight, or still to be posted */
    if (r->base.status == KVS_OK)
        kvs__chunk_ready(p, r, f, chunk);
    else
        kvs__pchunk_release(p, c);
}

static int32_t kvs__free_worker(const kvs_prefill_t *p)
{
    for (uint32_t w = 0; w < p->workers; w++)
        if (!p->worker_busy[w])
            return (int32_t)w;
    return -1;
}

/* Chunk i of flow g may join a gather of the same chunk of another flow:
 * its region is ready now, it covers the same tokens, and no earlier chunk
 * of its flow still waits (regions are gathered in ring order). */
static bool kvs__can_join(const kvs__proom_t *r, int64_t g, int64_t i, const kvs__pchunk_t *c)
{
    const kvs__pflow_t *fl = &r->flows[g];
    const kvs__peer_t *peer = kvs__flow_peer(r, g);
    if (!fl->known || !fl->reqs_sent || !peer->ready || peer->lost || i >= fl->num_chunks)
        return false;
    const kvs__pchunk_t *cg = &fl->chunks[i];
    if (cg->state != KVS__PCH_ALLOC || cg->part.token_start != c->part.token_start ||
        cg->part.token_end != c->part.token_end ||
        !kvs_ring_ready(peer->tgt.wm, cg->round, cg->end))
        return false;
    for (int64_t j = 0; j < i; j++)
        if (fl->chunks[j].state == KVS__PCH_ALLOC)
            return false;
    return true;
}

/* The fused gather of chunk c (of the flows whose parts are fuse_parts[0,
 * n)): every layer of this rank's stage, one slot each, then a draft
 * model's layers after them in each block (draft_copy.h). */
static int kvs__gather_parts(kvs_prefill_t *p, const kvs__proom_t *r, const kvs__pchunk_t *c,
                             int64_t n)
{
    const kvs_manager_t *m = p->h.m;
    const kvs_layout_t *lay = &r->base.inst->lay;
    const int64_t ps = lay->page_size;
    const int64_t rows = c->part.token_end - c->part.token_start;
    const kvs_copy_desc_t desc = {
        .k_base = m->k_base, .v_base = m->v_base, .local_heads = m->kv.local_heads,
        .head_dim = lay->head_dim, .elem_bytes = lay->elem_bytes, .page_size = ps,
        .pages = r->pages + c->part.token_start / ps, .num_pages = kvs__ceil_div(rows, ps),
        .tokens = rows, .layer_begin = 0, .layer_count = m->cfg.layers,
        .staging_slot_begin = 0, .staging_layer_slots = m->cfg.layers,
        .planes = lay->planes, .ks_base = m->ks_base, .vs_base = m->vs_base,
        .scale_bytes = lay->scale_bytes};
    const int rc = kvs__dev_gather_parts(p->h.dev, p->h.stream, &desc, p->fuse_parts, n);
    return rc != KVS_OK ? rc
                        : kvs__draft_copy(p->h.dev, p->h.stream, m, lay, true, &desc,
                                          p->fuse_parts, n);
}

/* The same for a hybrid layout: each flow's writer block of chunk i
 * (hybrid_copy.h), the flows fuse_flows[0, n) into their buffers. */
static int kvs__gather_hybrid(kvs_prefill_t *p, const kvs__proom_t *r, int64_t f, int64_t i,
                              int64_t n)
{
    const kvs_manager_t *m = p->h.m;
    const kvs__inst_t *inst = r->base.inst;
    const kvs__pchunk_t *c = &r->flows[f].chunks[i];
    for (int64_t k = 0; k < n; k++) {
        const kvs__peer_t *peer = kvs__flow_peer(r, p->fuse_flows[k]);
        /* its TP writer's block of this CP rank's part (the part's
         * tokens below: a hybrid region of its own) */
        p->fuse_blocks[k] = (kvs__hyb_block_t){peer->tp_rank, peer->tgt.writer,
                                               m->staging_addr[p->fuse_workers[k]]};
    }
    const kvs__hyb_copy_t hc = {
        .role = KVS_ROLE_PREFILL, .lay = &inst->lay, .stage = inst->decode_stage,
        .total = r->flows[f].total,
        .chunk = {.index = i, .token_start = c->part.token_start,
                  .token_end = c->part.token_end},
        .pages = r->pages, .state_slot = r->base.has_state_slot ? r->base.state_slot : -1};
    return kvs__hybrid_copy(p->h.dev, p->h.stream, m, &hc, p->fuse_blocks, n, p->fuse_parts,
                            p->fuse_cap);
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
    kvs_manager_t *m = p->h.m;
    const kvs__inst_t *inst = r->base.inst;
    kvs__pchunk_t *c = &r->flows[f].chunks[i];
    if (p->gather_blocked)
        return false;
    const int64_t writes = kvs__flow_peer(r, f)->tgt.pieces; /* the same for every flow */
    const int64_t by_slots = (int64_t)p->ops_cap / writes;
    const int64_t most = kvs__min_i64(p->fuse_cap, by_slots > 0 ? by_slots : 1);
    int64_t n = 0;
    for (int64_t k = 0; k < r->nflows && n < most; k++) {
        const int64_t g = (f + k) % r->nflows; /* flow f first */
        if (g == f || kvs__can_join(r, g, i, c))
            p->fuse_flows[n++] = g;
    }
    /* The write slots of these gathers and of those in flight must be free
     * when they finish: wait for writes to complete, do not fail. */
    p->gather_blocked = true; /* until it starts */
    if (p->gathers.count + (uint64_t)n > p->gathers.cap ||
        p->ops_used + (p->gathers.count + (uint64_t)n) * (uint64_t)writes > p->ops_cap)
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
        const kvs__target_t *t = &kvs__flow_peer(r, g)->tgt;
        p->fuse_workers[k] = w;
        p->fuse_parts[k] = (kvs_copy_part_t){.head_start = t->heads.src_start,
                                             .num_heads = t->heads.num_heads,
                                             .staging_addr = m->staging_addr[w]};
    }
    for (int64_t k = 0; k < n; k++)
        p->worker_busy[p->fuse_workers[k]] = false;
    p->gather_blocked = false;
    /* This CP rank's rows of the chunk (all of it with CP 1): its page list
     * is indexed by the request's token, and its range starts a page
     * (kvs_layout_cp_range), so the part's first row starts one. */
    const int copy_rc = kvs__hybrid(&inst->lay) ? kvs__gather_hybrid(p, r, f, i, n)
                                                : kvs__gather_parts(p, r, c, n);
    /* One event per chunk, each complete when the fused copy is. Recorded
     * after a refused copy too: one refused part-way may have left its first
     * parts enqueued (the core's default copy runs one op per part), and
     * their buffers must stay busy until those ran (kvs__staging_reap frees
     * them, the room having failed). */
    int rc = KVS_OK;
    int64_t recorded = 0;
    for (; recorded < n && rc == KVS_OK; recorded++)
        rc = kvs__dev_event_record(p->h.dev, p->h.stream,
                                   &r->flows[p->fuse_flows[recorded]].chunks[i].event);
    if (rc != KVS_OK) {
        for (int64_t k = 0; k < recorded; k++) {
            kvs__pchunk_t *cg = &r->flows[p->fuse_flows[k]].chunks[i];
            if (cg->event != NULL)
                kvs__dev_event_destroy(p->h.dev, cg->event);
            cg->event = NULL;
        }
        kvs__room_fail(&p->h, &r->base, copy_rc != KVS_OK ? copy_rc : rc, NULL);
        return false;
    }
    for (int64_t k = 0; k < n; k++) {
        const int64_t g = p->fuse_flows[k];
        kvs__pchunk_t *cg = &r->flows[g].chunks[i];
        p->worker_busy[p->fuse_workers[k]] = true;
        cg->worker = p->fuse_workers[k];
        cg->state = KVS__PCH_GATHER;
        if (copy_rc == KVS_OK && cg->waited && m->cfg.trace != NULL)
            m->cfg.trace(m->cfg.trace_ctx, "wait-for-watermark", r->base.id, i, cg->wait_ns,
                         kvs__now(&p->h));
        (void)kvs__fifo_push(&p->gathers, (kvs__ref_t){r->base.id, (int32_t)g, i});
        p->h.stats.copies += copy_rc == KVS_OK;
    }
    if (copy_rc != KVS_OK) {
        kvs__room_fail(&p->h, &r->base, copy_rc, NULL);
        return false;
    }
    return true;
}

/* Starts the gathers of chunks that are computed, ready and have a buffer. */
void kvs__staging_advance(kvs_prefill_t *p, kvs__proom_t *r, int64_t f)
{
    kvs__pflow_t *fl = &r->flows[f];
    const kvs__peer_t *peer = kvs__flow_peer(r, f);
    /* Once a gather waits for a buffer, the scan goes on for the writes
     * still to post alone: with CP a later chunk may hold the buffer an
     * earlier one waits for, and it frees it only once its writes went. */
    bool gathers_wait = false;
    for (int64_t i = 0; i < fl->num_chunks && r->base.status == KVS_OK; i++) {
        kvs__pchunk_t *c = &fl->chunks[i];
        if (c->unposted) {
            const int rc = kvs__write_chunk(p, r, f, i);
            if (rc == KVS_OK)
                c->unposted = false;
            else if (rc != KVS_EAGAIN)
                kvs__room_fail(&p->h, &r->base, rc, NULL); /* releases it, or its last
                                                              completion will */
            continue;
        }
        if (c->state != KVS__PCH_ALLOC || gathers_wait)
            continue;
        if (c->part.token_end > r->computed && !r->final)
            break; /* later chunks are not computed either */
        if (c->region_bytes == 0 || c->part.len_bytes == 0 ||
            (kvs__hybrid(&r->base.inst->lay) && kvs__block_bytes(p, r, f, c) == 0)) {
            /* metadata-only, or a hybrid part with no bytes for this stage
             * (a window stage's part before the window, with CP): nothing
             * to move, its arrival alone */
            kvs__chunk_ready(p, r, f, i);
            continue;
        }
        if (!kvs_ring_ready(peer->tgt.wm, c->round, c->end)) {
            if (!c->waited) {
                p->h.stats.watermark_waits++;
                c->wait_ns = kvs__now(&p->h);
            }
            c->waited = true;
            /* Without CP a flow's regions are handed out in ring order:
             * later ones wait too. With CP the decode hands out a chunk's
             * region when its first writer asks, so another CP rank's
             * requests may place a later chunk of this rank before an
             * earlier one in the ring; that later chunk, which the other
             * CP rank shares, may be what keeps the earlier one's place
             * taken: it goes now if it can (else both wait for ever). */
            if (r->base.inst->lay.prefill_cp > 1)
                continue;
            break;
        }
        if (!kvs__gather_chunk(p, r, f, i)) {
            if (r->base.inst->lay.prefill_cp == 1)
                return; /* later chunks were not gathered either: none to post */
            gathers_wait = true;
        }
    }
}

void kvs__staging_reap(kvs_prefill_t *p)
{
    while (p->gathers.count > 0) {
        const kvs__ref_t g = kvs__fifo_head(&p->gathers);
        kvs__proom_t *r = kvs__proom(kvs__room_get(&p->h, g.room));
        kvs__pchunk_t *c = &r->flows[g.flow].chunks[g.chunk];
        int rc = kvs__dev_event_query(p->h.dev, c->event);
        if (rc == KVS_EAGAIN)
            return;
        kvs__dev_event_destroy(p->h.dev, c->event);
        c->event = NULL;
        kvs__fifo_pop(&p->gathers);
        if (rc == KVS_OK && r->base.status == KVS_OK) {
            c->state = KVS__PCH_WRITE;
            rc = kvs__write_chunk(p, r, g.flow, g.chunk);
            if (rc == KVS_EAGAIN) {
                c->unposted = true; /* the fabric's queue is full: the rest later */
                continue;
            }
        }
        if (rc != KVS_OK || r->base.status != KVS_OK) {
            if (rc != KVS_OK)
                kvs__room_fail(&p->h, &r->base, rc, NULL);
            if (c->writes_pending == 0)
                kvs__pchunk_release(p, c);
        }
    }
}
