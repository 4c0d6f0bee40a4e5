/*
 * prefill_direct.c - the direct and slice paths of a prefill rank (spec
 * §7): once the prompt is computed and the decode's page ids (PAGES) and
 * KV layer keys (LAYERS) are known, this rank writes its KV straight into
 * the decode's pages: one write per run of pages consecutive on both sides
 * x layer x K/V (direct: the same heads on both sides), or one per token x
 * layer x K/V when heads are sliced; with kv_scales each run's scale rows
 * follow its K and V rows, one write per scale buffer (the slice path, the baseline that
 * staging is measured against), at most max_inflight_writes in flight.
 *
 * With prefill context parallelism (docs/kinds/context-parallel.md) a CP
 * rank writes the tokens of its own range only (kvs_layout_cp_range, past
 * the cached prefix: the flow's [tok_start, tok_end)), read from its pages
 * as the staging gather reads them (the page list is by the request's
 * token, and a range starts a page on both sides); the decode's pages are
 * addressed by absolute token as without CP. A CP rank whose range is
 * empty writes nothing and reports once the prompt is computed: the decode
 * counts every CP rank's report before the room is done.
 *
 * The cursor of a flow (token, layer, K/V) only moves forward; a write the
 * fabric refuses for now is posted again from the same place by a later
 * progress call.
 */
#include "prefill.h"

#include "arith.h"

#include <string.h>

bool kvs__direct_flow_done(const kvs__pflow_t *fl)
{
    return fl->posted_all && fl->writes_pending == 0;
}

void kvs__direct_on_pages(kvs_prefill_t *p, kvs__peer_t *peer, const kvs_msg_pages_t *q)
{
    kvs__room_t *room = kvs__room_get(&p->h, q->room);
    kvs__proom_t *r = room != NULL && room->inst == peer->inst ? kvs__proom(room) : NULL;
    kvs__pflow_t *fl = r != NULL && r->nflows > 0 ? &r->flows[peer->index] : NULL;
    if (fl == NULL || fl->dpages == NULL || q->first != fl->dpages_got ||
        q->first + (int64_t)q->count > fl->num_dpages) {
        kvs__reject(&p->h);
        return;
    }
    for (uint32_t i = 0; i < q->count; i++) {
        if (q->ids[i] < 0 || q->ids[i] >= peer->tgt.num_pages) {
            kvs__reject(&p->h);
            kvs__room_fail(&p->h, room, KVS_ERANGE, NULL);
            return;
        }
        fl->dpages[q->first + i] = q->ids[i];
    }
    fl->dpages_got += q->count;
}

void kvs__direct_on_layers(kvs_prefill_t *p, kvs__peer_t *peer, const kvs_msg_layers_t *q)
{
    kvs__target_t *t = &peer->tgt;
    if (t->layers == NULL || q->first != t->layers_got ||
        q->first + (int64_t)q->count > t->layers_total) {
        kvs__reject(&p->h);
        return;
    }
    memcpy(t->layers + q->first, q->entries, q->count * sizeof *q->entries);
    t->layers_got += q->count;
}

/* Address of token t's head slice in one KV layer buffer. */
static uint64_t kvs__slot_addr(uint64_t base, int64_t page, int64_t slot, int64_t ps,
                               int64_t heads, int64_t head, int64_t head_bytes)
{
    return base + (uint64_t)(((page * ps + slot) * heads + head) * head_bytes);
}

/* Buffer q of a layer as the direct path writes it: q < planes is plane q
 * (K, V), q >= planes the scale buffer of plane q - planes (kv_scales):
 * this rank's source, the decode's destination, and their geometry. */
typedef struct kvs__direct_buf {
    uint64_t src, dst;
    int64_t head_bytes; /* one head of one token row in that buffer */
    kvs_mr_t *mr;
    uint64_t rkey;
} kvs__direct_buf_t;

static kvs__direct_buf_t kvs__direct_buf(const kvs_prefill_t *p, const kvs_layer_entry_t *e,
                                         int64_t l, int64_t q, int64_t planes, int64_t hb,
                                         int64_t scale_bytes)
{
    const kvs_manager_t *m = p->h.m;
    const kvs__kv_keys_t *kk = &p->h.kv_keys;
    const bool v = q % planes != 0, scale = q >= planes;
    if (scale)
        return (kvs__direct_buf_t){v ? m->vs_base[l] : m->ks_base[l], v ? e->vs_addr : e->ks_addr,
                                   scale_bytes, v ? kk->vs_mr[l] : kk->ks_mr[l],
                                   v ? e->vs_rkey : e->ks_rkey};
    return (kvs__direct_buf_t){v ? m->v_base[l] : m->k_base[l], v ? e->v_addr : e->k_addr, hb,
                               v ? kk->v_mr[l] : kk->k_mr[l], v ? e->v_rkey : e->k_rkey};
}

/* The end of the longest token run from `tok` that is contiguous in both
 * pools: it stops at `end` (the last token this rank writes + 1), or at a page boundary of either side where the
 * next page is not the one after (prefill pages of ps tokens from token 0,
 * decode pages of dps tokens from base). With one page size this is the
 * longest run of pages consecutive on both sides. */
static int64_t kvs__direct_run(const int64_t *pages, int64_t ps, const int64_t *dpages,
                               int64_t dps, int64_t base, int64_t tok, int64_t last)
{
    int64_t end = tok;
    for (;;) {
        const int64_t pend = (end / ps + 1) * ps;
        const int64_t dend = base + ((end - base) / dps + 1) * dps;
        end = kvs__min_i64(kvs__min_i64(pend, dend), last);
        if (end >= last)
            return last;
        if (end % ps == 0 && pages[end / ps] != pages[end / ps - 1] + 1)
            return end;
        const int64_t d = end - base;
        if (d % dps == 0 && dpages[d / dps] != dpages[d / dps - 1] + 1)
            return end;
    }
}

void kvs__direct_advance(kvs_prefill_t *p, kvs__proom_t *r, int64_t f)
{
    kvs__pflow_t *fl = &r->flows[f];
    const kvs__target_t *t = &kvs__flow_peer(r, f)->tgt;
    const kvs_layout_t *lay = &r->base.inst->lay;
    const kvs_manager_t *m = p->h.m;
    if (!r->final || fl->posted_all || fl->dpages_got < fl->num_dpages ||
        t->layers_got < t->layers_total)
        return;
    /* This rank's pages are of ps tokens, the decode's of dps (the same
     * unless the two sides declared different sizes). */
    const int64_t ps = lay->page_size, dps = lay->decode_page_size, lp = m->cfg.layers;
    const int64_t hb = lay->head_dim * lay->elem_bytes;
    const int64_t nh = t->heads.num_heads;
    const bool sliced = nh != m->kv.local_heads || nh != t->local_heads;
    /* Only this CP rank's tokens (all of them with CP 1). */
    while (r->base.status == KVS_OK && fl->cur_t < fl->tok_end) {
        const int64_t tok = fl->cur_t;
        const int64_t pi = tok / ps, slot = tok % ps;
        const int64_t di = (tok - fl->base) / dps, dslot = (tok - fl->base) % dps;
        if (fl->run_tokens == 0) {
            if (sliced) {
                fl->run_tokens = 1;
            } else {
                fl->run_tokens = kvs__direct_run(r->pages, ps, fl->dpages, dps, fl->base, tok,
                                                 fl->tok_end) - tok;
                /* no longer than one write of the fabric takes (a token's
                 * row fits one: checked when the pair was planned) */
                const uint64_t most = kvs__net_max_write_bytes(p->h.fab) / (uint64_t)(nh * hb);
                if (most < (uint64_t)fl->run_tokens)
                    fl->run_tokens = most > 0 ? (int64_t)most : 1;
            }
        }
        /* this stage's layer cur_l is the decode's layer slot + cur_l */
        const kvs_layer_entry_t *e = &t->layers[t->slot + fl->cur_l];
        const kvs__direct_buf_t b = kvs__direct_buf(p, e, fl->cur_l, fl->cur_kv, lay->planes, hb,
                                                    lay->scale_bytes);
        const uint64_t src = kvs__slot_addr(b.src, r->pages[pi], slot, ps, m->kv.local_heads,
                                            t->heads.src_start, b.head_bytes);
        const uint64_t dst = kvs__slot_addr(b.dst, fl->dpages[di], dslot, dps, t->local_heads,
                                            t->heads.dst_start, b.head_bytes);
        const uint64_t len =
            (uint64_t)(sliced ? nh * b.head_bytes : fl->run_tokens * nh * b.head_bytes);
        int rc = kvs__post_write(p, r, f, -1, src, b.mr, dst, b.rkey, len);
        if (rc == KVS_EAGAIN)
            return;
        if (rc != KVS_OK) {
            kvs__room_fail(&p->h, &r->base, rc, NULL);
            return;
        }
        fl->writes_pending++;
        /* K and V (or MLA's latent alone), then with kv_scales their scales */
        if (++fl->cur_kv == lay->planes * (lay->scale_bytes > 0 ? 2 : 1)) {
            fl->cur_kv = 0;
            if (++fl->cur_l == lp) {
                fl->cur_l = 0;
                fl->cur_t += fl->run_tokens;
                fl->run_tokens = 0;
            }
        }
    }
    fl->posted_all = fl->cur_t >= fl->tok_end || r->base.status != KVS_OK;
}
