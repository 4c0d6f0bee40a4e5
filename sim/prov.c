/*
 * prov.c - the provenance maps of prov.h: a treap of runs keyed by address
 * (nodes in one growable array, linked by index, 0 = none).
 *
 * Every change is a range rewrite: the runs touching [lo, hi) and its two
 * neighbours are collected (one walk), swept together with the new pieces
 * into a sorted, merged list, and that list replaces them. Usually it is as
 * long as what it replaces, or one run longer or shorter: the nodes are
 * reused in place and the difference inserted or removed. Otherwise the
 * range is split out of the tree and the list built back into a subtree in
 * linear time and joined. A copy of many rows therefore costs one rewrite
 * of the destination's hull plus a linear walk of the source's runs in its
 * hull, never a tree operation per row.
 *
 * Invariants: those of prov.h; the tree is a binary search tree on addr
 * and a max-heap on prio; count == nodes reachable from root; free nodes
 * are chained through `left`.
 */
#include "prov.h"

#include <kvstage/kvstage.h>

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct sim_prov_node {
    sim_prov_run_t run;
    uint32_t left, right;
    uint32_t prio;
} sim_prov_node_t;

/* A growable array of runs (the map's scratch lists). */
typedef struct sim_prov_list {
    sim_prov_run_t *v;
    size_t n, cap;
} sim_prov_list_t;

struct sim_prov_map {
    sim_prov_node_t *nodes; /* [0] unused: index 0 is "none" */
    uint32_t cap, used;     /* slots allocated, slots ever handed out */
    uint32_t free_head;
    uint32_t root;
    uint64_t count, peak;
    uint64_t rng;
    sim_prov_list_t src, pieces, old, out;
    uint32_t *stack;        /* subtree build */
    size_t stack_cap;
    uint32_t *ids;          /* rewrite: the nodes of m->old */
    size_t ids_n, ids_cap;
    size_t *idx;            /* copy_parts: [2 * idx_cap] cursors */
    size_t idx_cap;
    bool batching;          /* between sim_prov_batch_begin and _end */
    uint64_t batch_lo, batch_hi; /* the hull of the pieces pending, lo == hi
                                    when none */
};

/* ---- runs ----------------------------------------------------------------- */

static uint64_t sim_prov_end(const sim_prov_run_t *r) { return r->addr + r->len_bytes; }

uint64_t sim_prov_origin(const sim_prov_run_t *r, uint64_t x)
{
    if (r->row_bytes == 0)
        return r->off + x;
    const uint64_t y = r->phase + x;
    return r->off + (y / r->row_bytes) * r->stride + y % r->row_bytes;
}

void sim_prov_canon(sim_prov_run_t *r)
{
    if (r->key == SIM_PROV_HOLE) {
        r->off = r->row_bytes = r->stride = r->phase = 0;
        return;
    }
    if (r->row_bytes == 0) {
        r->stride = r->phase = 0;
        return;
    }
    /* Normalise the phase into the first row. */
    if (r->phase >= r->row_bytes) {
        r->off += (r->phase / r->row_bytes) * r->stride;
        r->phase %= r->row_bytes;
    }
    if (r->stride == r->row_bytes || r->phase + r->len_bytes <= r->row_bytes) {
        r->off += r->phase;
        r->row_bytes = r->stride = r->phase = 0;
    }
}

/* Bytes [s, e) of r (offsets from r->addr), canonical. */
static sim_prov_run_t sim_prov_clip(const sim_prov_run_t *r, uint64_t s, uint64_t e)
{
    sim_prov_run_t c = *r;
    c.addr = r->addr + s;
    c.len_bytes = e - s;
    if (c.key == SIM_PROV_HOLE)
        return c;
    if (c.row_bytes == 0) {
        c.off += s;
        return c;
    }
    const uint64_t y = r->phase + s;
    c.off = r->off + (y / r->row_bytes) * r->stride;
    c.phase = y % r->row_bytes;
    sim_prov_canon(&c);
    return c;
}

/* Extends a by b (b starts where a ends) when b's rule continues a's. */
static bool sim_prov_join(sim_prov_run_t *a, const sim_prov_run_t *b)
{
    if (a->key != b->key || sim_prov_end(a) != b->addr)
        return false;
    if (a->key == SIM_PROV_HOLE) {
        a->len_bytes += b->len_bytes;
        return true;
    }
    if (a->row_bytes == 0 && b->row_bytes == 0) {
        if (b->off == a->off + a->len_bytes) {
            a->len_bytes += b->len_bytes;
            return true;
        }
        /* a is one whole row, b the start of the next. */
        if (b->off > a->off + a->len_bytes && b->len_bytes <= a->len_bytes) {
            a->row_bytes = a->len_bytes;
            a->stride = b->off - a->off;
            a->phase = 0;
            a->len_bytes += b->len_bytes;
            return true;
        }
        return false;
    }
    if (a->row_bytes == 0) {
        /* a is the end of b's first row, or of the row before it. */
        const uint64_t R = b->row_bytes, S = b->stride;
        if (a->len_bytes <= b->phase && a->off + a->len_bytes == b->off + b->phase) {
            sim_prov_run_t m = *b;
            m.addr = a->addr;
            m.len_bytes += a->len_bytes;
            m.phase = b->phase - a->len_bytes;
            *a = m;
            return true;
        }
        if (b->phase == 0 && a->len_bytes <= R && b->off >= S &&
            a->off + a->len_bytes == b->off - S + R) {
            sim_prov_run_t m = *b;
            m.addr = a->addr;
            m.len_bytes += a->len_bytes;
            m.off = b->off - S;
            m.phase = R - a->len_bytes;
            *a = m;
            return true;
        }
        return false;
    }
    const uint64_t y = a->phase + a->len_bytes;
    const uint64_t next_off = a->off + (y / a->row_bytes) * a->stride;
    const uint64_t next_phase = y % a->row_bytes;
    if (b->row_bytes == 0) {
        if (b->off != next_off + next_phase || next_phase + b->len_bytes > a->row_bytes)
            return false;
    } else if (b->row_bytes != a->row_bytes || b->stride != a->stride ||
               b->phase != next_phase || b->off != next_off) {
        return false;
    }
    a->len_bytes += b->len_bytes;
    return true;
}

/* ---- lists ------------------------------------------------------------------ */

static int sim_prov_list_push(sim_prov_list_t *l, const sim_prov_run_t *r)
{
    if (l->n == l->cap) {
        const size_t cap = l->cap == 0 ? 64 : l->cap * 2;
        sim_prov_run_t *v = realloc(l->v, cap * sizeof *v);
        if (v == NULL)
            return KVS_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *r;
    return KVS_OK;
}

/* Appends r, merged into the last entry when it continues it. Holes are
 * kept (a hole piece erases) unless drop_holes. */
static int sim_prov_emit(sim_prov_list_t *l, const sim_prov_run_t *r, bool drop_holes)
{
    if (r->len_bytes == 0 || (drop_holes && r->key == SIM_PROV_HOLE))
        return KVS_OK;
    if (l->n > 0 && sim_prov_join(&l->v[l->n - 1], r))
        return KVS_OK;
    return sim_prov_list_push(l, r);
}

/* ---- the tree --------------------------------------------------------------- */

static uint32_t sim_prov_prio(sim_prov_map_t *m)
{
    uint64_t x = m->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    m->rng = x;
    return (uint32_t)(x >> 32);
}

static int sim_prov_node_new(sim_prov_map_t *m, const sim_prov_run_t *r, uint32_t *out)
{
    uint32_t i = m->free_head;
    if (i != 0) {
        m->free_head = m->nodes[i].left;
    } else {
        if (m->used + 1 >= m->cap) {
            if (m->cap >= UINT32_MAX / 2)
                return KVS_ENOMEM;
            const uint32_t cap = m->cap == 0 ? 256 : m->cap * 2;
            sim_prov_node_t *n = realloc(m->nodes, (size_t)cap * sizeof *n);
            if (n == NULL)
                return KVS_ENOMEM;
            m->nodes = n;
            m->cap = cap;
        }
        i = ++m->used;
    }
    m->nodes[i] = (sim_prov_node_t){.run = *r, .prio = sim_prov_prio(m)};
    m->count++;
    if (m->count > m->peak)
        m->peak = m->count;
    *out = i;
    return KVS_OK;
}

static void sim_prov_node_free(sim_prov_map_t *m, uint32_t i)
{
    m->nodes[i].left = m->free_head;
    m->free_head = i;
    m->count--;
}

/* Splits t into runs with addr < key (*l) and the rest (*r). */
static void sim_prov_split(sim_prov_map_t *m, uint32_t t, uint64_t key, uint32_t *l, uint32_t *r)
{
    if (t == 0) {
        *l = *r = 0;
        return;
    }
    sim_prov_node_t *n = &m->nodes[t];
    if (n->run.addr < key) {
        sim_prov_split(m, n->right, key, &m->nodes[t].right, r);
        *l = t;
    } else {
        sim_prov_split(m, n->left, key, l, &m->nodes[t].left);
        *r = t;
    }
}

/* Joins l and r, every run of l before every run of r. */
static uint32_t sim_prov_merge(sim_prov_map_t *m, uint32_t l, uint32_t r)
{
    if (l == 0 || r == 0)
        return l != 0 ? l : r;
    if (m->nodes[l].prio > m->nodes[r].prio) {
        m->nodes[l].right = sim_prov_merge(m, m->nodes[l].right, r);
        return l;
    }
    m->nodes[r].left = sim_prov_merge(m, l, m->nodes[r].left);
    return r;
}

/* Appends node t's index to m->ids. */
static int sim_prov_ids_push(sim_prov_map_t *m, uint32_t t)
{
    if (m->ids_n == m->ids_cap) {
        const size_t cap = m->ids_cap == 0 ? 64 : m->ids_cap * 2;
        uint32_t *v = realloc(m->ids, cap * sizeof *v);
        if (v == NULL)
            return KVS_ENOMEM;
        m->ids = v;
        m->ids_cap = cap;
    }
    m->ids[m->ids_n++] = t;
    return KVS_OK;
}

/* Appends the runs of subtree t overlapping [lo, hi), in order, to l, and
 * when ids their nodes' indices to m->ids. */
static int sim_prov_collect(sim_prov_map_t *m, uint32_t t, uint64_t lo, uint64_t hi,
                            sim_prov_list_t *l, bool ids)
{
    while (t != 0) {
        const sim_prov_node_t *n = &m->nodes[t];
        int rc = KVS_OK;
        if (lo < n->run.addr)
            rc = sim_prov_collect(m, n->left, lo, hi, l, ids);
        if (rc == KVS_OK && n->run.addr < hi && sim_prov_end(&n->run) > lo) {
            rc = sim_prov_list_push(l, &n->run);
            if (rc == KVS_OK && ids)
                rc = sim_prov_ids_push(m, t);
        }
        if (rc != KVS_OK)
            return rc;
        if (sim_prov_end(&n->run) >= hi)
            return KVS_OK;
        t = n->right;
    }
    return KVS_OK;
}

static uint32_t sim_prov_find(const sim_prov_map_t *m, uint64_t x)
{
    uint32_t t = m->root;
    while (t != 0) {
        const sim_prov_run_t *r = &m->nodes[t].run;
        if (x < r->addr)
            t = m->nodes[t].left;
        else if (x >= sim_prov_end(r))
            t = m->nodes[t].right;
        else
            return t;
    }
    return 0;
}

/* A treap of the sorted runs l (a Cartesian tree on fresh priorities, built
 * with a stack in linear time). */
static int sim_prov_build(sim_prov_map_t *m, const sim_prov_list_t *l, uint32_t *out)
{
    *out = 0;
    if (l->n > m->stack_cap) {
        uint32_t *s = realloc(m->stack, l->n * sizeof *s);
        if (s == NULL)
            return KVS_ENOMEM;
        m->stack = s;
        m->stack_cap = l->n;
    }
    size_t top = 0;
    for (size_t i = 0; i < l->n; i++) {
        uint32_t x;
        int rc = sim_prov_node_new(m, &l->v[i], &x);
        if (rc != KVS_OK) {
            /* Keep what was built so far: the caller's map stays a tree. */
            for (size_t j = 1; j < top; j++)
                m->nodes[m->stack[j - 1]].right = m->stack[j];
            *out = top > 0 ? m->stack[0] : 0;
            return rc;
        }
        uint32_t last = 0;
        while (top > 0 && m->nodes[m->stack[top - 1]].prio < m->nodes[x].prio)
            last = m->stack[--top];
        m->nodes[x].left = last;
        if (top > 0)
            m->nodes[m->stack[top - 1]].right = x;
        m->stack[top++] = x;
    }
    *out = top > 0 ? m->stack[0] : 0;
    return KVS_OK;
}

/* Puts node x (fresh, children unset) into the tree by its address. */
static void sim_prov_insert(sim_prov_map_t *m, uint32_t x)
{
    const uint64_t key = m->nodes[x].run.addr;
    const uint32_t prio = m->nodes[x].prio;
    uint32_t *link = &m->root;
    while (*link != 0 && m->nodes[*link].prio >= prio)
        link = key < m->nodes[*link].run.addr ? &m->nodes[*link].left : &m->nodes[*link].right;
    sim_prov_split(m, *link, key, &m->nodes[x].left, &m->nodes[x].right);
    *link = x;
}

/* Takes node x out of the tree and frees it. */
static void sim_prov_remove(sim_prov_map_t *m, uint32_t x)
{
    const uint64_t key = m->nodes[x].run.addr;
    uint32_t *link = &m->root;
    while (*link != x)
        link = key < m->nodes[*link].run.addr ? &m->nodes[*link].left : &m->nodes[*link].right;
    *link = sim_prov_merge(m, m->nodes[x].left, m->nodes[x].right);
    sim_prov_node_free(m, x);
}

/* Frees every node of subtree t. */
static void sim_prov_free_tree(sim_prov_map_t *m, uint32_t t)
{
    while (t != 0) {
        const uint32_t right = m->nodes[t].right;
        sim_prov_free_tree(m, m->nodes[t].left);
        sim_prov_node_free(m, t);
        t = right;
    }
}

/* m->out from the old runs m->old (sorted) overlaid by pieces (sorted,
 * disjoint; holes erase, bytes between pieces keep their runs). */
static int sim_prov_sweep(sim_prov_map_t *m, const sim_prov_list_t *pieces)
{
    const sim_prov_run_t *nw = pieces->v;
    const size_t nn = pieces->n;
    size_t j = 0;
    uint64_t covered = 0; /* end of the new pieces emitted so far */
    int rc = KVS_OK;
    m->out.n = 0;
    for (size_t i = 0; i < m->old.n && rc == KVS_OK; i++) {
        const sim_prov_run_t *o = &m->old.v[i];
        uint64_t pos = o->addr > covered ? o->addr : covered;
        while (pos < sim_prov_end(o) && rc == KVS_OK) {
            while (j < nn && nw[j].addr <= pos && rc == KVS_OK) {
                rc = sim_prov_emit(&m->out, &nw[j], true);
                covered = sim_prov_end(&nw[j]);
                if (covered > pos)
                    pos = covered;
                j++;
            }
            if (pos >= sim_prov_end(o) || rc != KVS_OK)
                break;
            uint64_t lim = sim_prov_end(o);
            if (j < nn && nw[j].addr < lim)
                lim = nw[j].addr;
            sim_prov_run_t part = sim_prov_clip(o, pos - o->addr, lim - o->addr);
            rc = sim_prov_emit(&m->out, &part, true);
            pos = lim;
        }
    }
    for (; j < nn && rc == KVS_OK; j++)
        rc = sim_prov_emit(&m->out, &nw[j], true);
    return rc;
}

/* Node count changes a rewrite makes in place, by single inserts or
 * removals; a larger change rebuilds the range's subtree. */
#define SIM_PROV_INPLACE_MAX 4

/* Replaces what [lo, hi) holds by pieces (sorted, disjoint, inside it;
 * holes erase, bytes between pieces keep their runs). The runs touching
 * [lo, hi) and its two neighbours (so the new runs merge with them) are
 * swept with the pieces into m->out. Most rewrites leave as many runs as
 * they found, or one more or less: those reuse the nodes where they are
 * (the runs stay in address order, so the tree stays a search tree) and
 * insert or remove the difference, without splitting the tree. */
static int sim_prov_rewrite(sim_prov_map_t *m, uint64_t lo, uint64_t hi,
                            const sim_prov_list_t *pieces)
{
    if (lo >= hi)
        return KVS_OK;
    m->old.n = 0;
    m->ids_n = 0;
    int rc = sim_prov_collect(m, m->root, lo > 0 ? lo - 1 : 0, hi + 1, &m->old, true);
    if (rc == KVS_OK)
        rc = sim_prov_sweep(m, pieces);
    if (rc != KVS_OK)
        return rc; /* nothing changed */
    const size_t k = m->ids_n, n = m->out.n;
    if (n + SIM_PROV_INPLACE_MAX < k || k + SIM_PROV_INPLACE_MAX < n) {
        const uint64_t lo2 = k > 0 && m->old.v[0].addr < lo ? m->old.v[0].addr : lo;
        const uint64_t e = k > 0 ? sim_prov_end(&m->old.v[k - 1]) : hi;
        uint32_t a, b, mid, c, built = 0;
        sim_prov_split(m, m->root, lo2, &a, &b);
        sim_prov_split(m, b, e > hi ? e : hi, &mid, &c);
        sim_prov_free_tree(m, mid);
        rc = sim_prov_build(m, &m->out, &built);
        /* On failure the range loses what it held (holes): still a map. */
        m->root = sim_prov_merge(m, sim_prov_merge(m, a, built), c);
        return rc;
    }
    /* Removals first, while every node still holds its old run. */
    for (size_t i = n; i < k; i++)
        sim_prov_remove(m, m->ids[i]);
    for (size_t i = 0; i < n && i < k; i++)
        m->nodes[m->ids[i]].run = m->out.v[i];
    for (size_t i = k; i < n; i++) {
        uint32_t x;
        rc = sim_prov_node_new(m, &m->out.v[i], &x);
        if (rc != KVS_OK)
            return rc; /* the runs not inserted become holes */
        sim_prov_insert(m, x);
    }
    return KVS_OK;
}

/* ---- the API ---------------------------------------------------------------- */

int sim_prov_map_create(sim_prov_map_t **out)
{
    sim_prov_map_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return KVS_ENOMEM;
    m->rng = 0x9E3779B97F4A7C15ull;
    *out = m;
    return KVS_OK;
}

void sim_prov_map_destroy(sim_prov_map_t *m)
{
    if (m == NULL)
        return;
    free(m->nodes);
    free(m->src.v);
    free(m->pieces.v);
    free(m->old.v);
    free(m->out.v);
    free(m->stack);
    free(m->idx);
    free(m->ids);
    free(m);
}

int sim_prov_write(sim_prov_map_t *m, const sim_prov_run_t *r)
{
    assert(!m->batching);
    if (r->len_bytes == 0)
        return KVS_OK;
    sim_prov_run_t c = *r;
    sim_prov_canon(&c);
    m->pieces.n = 0;
    int rc = sim_prov_list_push(&m->pieces, &c);
    return rc == KVS_OK ? sim_prov_rewrite(m, c.addr, sim_prov_end(&c), &m->pieces) : rc;
}

int sim_prov_erase(sim_prov_map_t *m, uint64_t addr, uint64_t len_bytes)
{
    const sim_prov_run_t hole = {.addr = addr, .len_bytes = len_bytes, .key = SIM_PROV_HOLE};
    return sim_prov_write(m, &hole);
}

/* One part of a row whose origin is affine in the row: row i's bytes
 * [dst_off, + len) come from origin off + i * step of key, contiguously. */
typedef struct sim_prov_seg {
    uint64_t dst_off, len, key, off, step;
} sim_prov_seg_t;

/* Parts a copy_parts call handles in closed form (more take the row loop). */
#define SIM_PROV_SEGS_MAX 64

/* copy_parts in closed form, its cost per part instead of per row: when
 * every part's rows lie inside one source run and each row reads one
 * contiguous stretch of origins that moves by a fixed step from row to row
 * (a page run of one rank's heads, gathered or scattered), the pieces are
 * those the row loop would emit: one rows run when the parts tile the
 * destination rows, else one piece per row and segment. Returns 1 with
 * dst->pieces filled, 0 when the copy is not of that form (nothing done),
 * or an error. */
static int sim_prov_copy_affine(sim_prov_map_t *dst, uint64_t d0, uint64_t ds,
                                const sim_prov_rowsrc_t *parts, size_t nparts, uint64_t rows,
                                const size_t *cur, const size_t *end)
{
    sim_prov_seg_t seg[SIM_PROV_SEGS_MAX];
    size_t ns = 0;
    for (size_t j = 0; j < nparts; j++) {
        const sim_prov_rowsrc_t *p = &parts[j];
        if (p->row_bytes == 0)
            continue;
        if (end[j] != cur[j] + 1)
            return 0;
        const sim_prov_run_t *r = &dst->src.v[cur[j]];
        const uint64_t lo = p->s0, hi = p->s0 + (rows - 1) * p->ss + p->row_bytes;
        if (r->addr > lo || sim_prov_end(r) < hi)
            return 0;
        const uint64_t y0 = lo - r->addr;
        sim_prov_seg_t s = {.dst_off = p->dst_off, .len = p->row_bytes, .key = r->key,
                            .off = sim_prov_origin(r, y0)};
        if (r->row_bytes == 0) {
            s.step = p->ss;
        } else {
            const uint64_t R = r->row_bytes;
            if ((r->phase + y0) % R + p->row_bytes > R || p->ss % R != 0)
                return 0;
            s.step = p->ss / R * r->stride;
        }
        sim_prov_seg_t *t = ns > 0 ? &seg[ns - 1] : NULL;
        if (t != NULL && t->key == s.key && t->dst_off + t->len == s.dst_off &&
            t->off + t->len == s.off && t->step == s.step)
            t->len += s.len; /* the next heads of the same rows */
        else
            seg[ns++] = s;
    }
    int rc = KVS_OK;
    if (ns == 1 && seg[0].len == ds && seg[0].step >= ds) {
        sim_prov_run_t run = {.addr = d0 + seg[0].dst_off, .len_bytes = rows * ds,
                              .key = seg[0].key, .off = seg[0].off, .row_bytes = ds,
                              .stride = seg[0].step};
        sim_prov_canon(&run);
        return sim_prov_emit(&dst->pieces, &run, false) == KVS_OK ? 1 : KVS_ENOMEM;
    }
    for (uint64_t i = 0; i < rows && rc == KVS_OK; i++)
        for (size_t k = 0; k < ns && rc == KVS_OK; k++) {
            const sim_prov_run_t piece = {.addr = d0 + i * ds + seg[k].dst_off,
                                          .len_bytes = seg[k].len, .key = seg[k].key,
                                          .off = seg[k].off + i * seg[k].step};
            rc = sim_prov_emit(&dst->pieces, &piece, false);
        }
    return rc == KVS_OK ? 1 : rc;
}

/* The pieces of a copy_parts, appended to dst->pieces (after those there,
 * which end at or before this copy's first destination byte). */
static int sim_prov_parts_pieces(sim_prov_map_t *dst, uint64_t d0, uint64_t ds,
                                 sim_prov_map_t *src, const sim_prov_rowsrc_t *parts,
                                 size_t nparts, uint64_t rows)
{
    if (nparts > dst->idx_cap) {
        size_t *idx = realloc(dst->idx, 2 * nparts * sizeof *idx);
        if (idx == NULL)
            return KVS_ENOMEM;
        dst->idx = idx;
        dst->idx_cap = nparts;
    }
    size_t *cur = dst->idx, *end = dst->idx + nparts;
    /* Read every part's rows first: src may be dst. */
    dst->src.n = 0;
    int rc = KVS_OK;
    for (size_t j = 0; j < nparts && rc == KVS_OK; j++) {
        const sim_prov_rowsrc_t *p = &parts[j];
        assert(j == 0 || parts[j - 1].dst_off + parts[j - 1].row_bytes <= p->dst_off);
        assert(rows == 1 || (p->ss >= p->row_bytes && p->dst_off + p->row_bytes <= ds));
        cur[j] = dst->src.n;
        if (p->row_bytes > 0)
            rc = sim_prov_collect(src, src->root, p->s0,
                                  p->s0 + (rows - 1) * p->ss + p->row_bytes, &dst->src,
                                  false);
        end[j] = dst->src.n;
    }
    const sim_prov_run_t *v = dst->src.v;
    if (rc == KVS_OK && rows > 1 && nparts <= SIM_PROV_SEGS_MAX) {
        const int fast = sim_prov_copy_affine(dst, d0, ds, parts, nparts, rows, cur, end);
        if (fast != 0)
            return fast < 0 ? fast : KVS_OK;
    }
    for (uint64_t i = 0; i < rows && rc == KVS_OK; i++) {
        for (size_t j = 0; j < nparts && rc == KVS_OK; j++) {
            const sim_prov_rowsrc_t *p = &parts[j];
            const uint64_t lo = p->s0 + i * p->ss, hi = lo + p->row_bytes;
            const uint64_t to = d0 + i * ds + p->dst_off; /* lo lands here */
            while (cur[j] < end[j] && sim_prov_end(&v[cur[j]]) <= lo)
                cur[j]++;
            uint64_t pos = lo;
            for (size_t q = cur[j]; q < end[j] && v[q].addr < hi && rc == KVS_OK; q++) {
                if (v[q].addr > pos) {
                    const sim_prov_run_t hole = {.addr = to + (pos - lo),
                                                 .len_bytes = v[q].addr - pos,
                                                 .key = SIM_PROV_HOLE};
                    rc = sim_prov_emit(&dst->pieces, &hole, false);
                    pos = v[q].addr;
                }
                const uint64_t e = sim_prov_end(&v[q]) < hi ? sim_prov_end(&v[q]) : hi;
                sim_prov_run_t piece = sim_prov_clip(&v[q], pos - v[q].addr, e - v[q].addr);
                piece.addr = to + (pos - lo);
                if (rc == KVS_OK)
                    rc = sim_prov_emit(&dst->pieces, &piece, false);
                pos = e;
            }
            if (pos < hi && rc == KVS_OK) {
                const sim_prov_run_t hole = {.addr = to + (pos - lo), .len_bytes = hi - pos,
                                             .key = SIM_PROV_HOLE};
                rc = sim_prov_emit(&dst->pieces, &hole, false);
            }
        }
    }
    return rc;
}

/* The destination hull of a copy_parts. */
static void sim_prov_parts_hull(uint64_t d0, uint64_t ds, const sim_prov_rowsrc_t *parts,
                                size_t nparts, uint64_t rows, uint64_t *lo, uint64_t *hi)
{
    const sim_prov_rowsrc_t *last = &parts[nparts - 1];
    *lo = d0 + parts[0].dst_off;
    *hi = d0 + (rows - 1) * ds + last->dst_off + last->row_bytes;
}

int sim_prov_copy_parts(sim_prov_map_t *dst, uint64_t d0, uint64_t ds, sim_prov_map_t *src,
                        const sim_prov_rowsrc_t *parts, size_t nparts, uint64_t rows)
{
    assert(!dst->batching);
    if (rows == 0 || nparts == 0)
        return KVS_OK;
    dst->pieces.n = 0;
    const int rc = sim_prov_parts_pieces(dst, d0, ds, src, parts, nparts, rows);
    uint64_t lo, hi;
    sim_prov_parts_hull(d0, ds, parts, nparts, rows, &lo, &hi);
    return rc == KVS_OK ? sim_prov_rewrite(dst, lo, hi, &dst->pieces) : rc;
}

void sim_prov_batch_begin(sim_prov_map_t *m)
{
    assert(!m->batching);
    m->batching = true;
    m->pieces.n = 0;
    m->batch_lo = m->batch_hi = 0;
}

/* Writes the pieces pending. */
static int sim_prov_batch_flush(sim_prov_map_t *m)
{
    int rc = KVS_OK;
    if (m->batch_lo < m->batch_hi)
        rc = sim_prov_rewrite(m, m->batch_lo, m->batch_hi, &m->pieces);
    m->pieces.n = 0;
    m->batch_lo = m->batch_hi = 0;
    return rc;
}

int sim_prov_batch_end(sim_prov_map_t *m)
{
    assert(m->batching);
    const int rc = sim_prov_batch_flush(m);
    m->batching = false;
    return rc;
}

/* Whether [lo, hi) overlaps the pending hull of m. */
static bool sim_prov_batch_touches(const sim_prov_map_t *m, uint64_t lo, uint64_t hi)
{
    return m->batch_lo < m->batch_hi && lo < m->batch_hi && hi > m->batch_lo;
}

int sim_prov_batch_copy_parts(sim_prov_map_t *dst, uint64_t d0, uint64_t ds,
                              sim_prov_map_t *src, const sim_prov_rowsrc_t *parts,
                              size_t nparts, uint64_t rows)
{
    assert(dst->batching);
    if (rows == 0 || nparts == 0)
        return KVS_OK;
    uint64_t lo, hi;
    sim_prov_parts_hull(d0, ds, parts, nparts, rows, &lo, &hi);
    /* Pending pieces are written first when this copy lands before their
     * end, or reads what they write: the result is that of the copies one
     * after the other. */
    bool flush = dst->batch_lo < dst->batch_hi && lo < dst->batch_hi;
    for (size_t j = 0; j < nparts && !flush && src == dst; j++)
        flush = parts[j].row_bytes > 0 &&
                sim_prov_batch_touches(dst, parts[j].s0,
                                       parts[j].s0 + (rows - 1) * parts[j].ss +
                                           parts[j].row_bytes);
    int rc = flush ? sim_prov_batch_flush(dst) : KVS_OK;
    if (rc != KVS_OK)
        return rc;
    rc = sim_prov_parts_pieces(dst, d0, ds, src, parts, nparts, rows);
    if (dst->batch_lo == dst->batch_hi)
        dst->batch_lo = lo;
    dst->batch_hi = hi;
    return rc;
}

int sim_prov_batch_write(sim_prov_map_t *m, const sim_prov_run_t *r)
{
    assert(m->batching);
    if (r->len_bytes == 0)
        return KVS_OK;
    sim_prov_run_t c = *r;
    sim_prov_canon(&c);
    if (m->batch_lo < m->batch_hi && c.addr < m->batch_hi) {
        const int rc = sim_prov_batch_flush(m);
        if (rc != KVS_OK)
            return rc;
    }
    const int rc = sim_prov_list_push(&m->pieces, &c);
    if (rc != KVS_OK)
        return rc;
    if (m->batch_lo == m->batch_hi)
        m->batch_lo = c.addr;
    m->batch_hi = sim_prov_end(&c);
    return KVS_OK;
}

int sim_prov_copy_rows(sim_prov_map_t *dst, uint64_t d0, uint64_t ds, sim_prov_map_t *src,
                       uint64_t s0, uint64_t ss, uint64_t row_bytes, uint64_t rows)
{
    if (row_bytes == 0)
        return KVS_OK;
    const sim_prov_rowsrc_t one = {.s0 = s0, .ss = ss, .row_bytes = row_bytes};
    return sim_prov_copy_parts(dst, d0, ds, src, &one, 1, rows);
}

int sim_prov_copy(sim_prov_map_t *dst, uint64_t daddr, sim_prov_map_t *src, uint64_t saddr,
                  uint64_t len_bytes)
{
    return sim_prov_copy_rows(dst, daddr, len_bytes, src, saddr, len_bytes, len_bytes, 1);
}

/* Bytes where a and b (same addr and length) give different origins. */
static uint64_t sim_prov_run_diff(const sim_prov_run_t *a, const sim_prov_run_t *b)
{
    if (a->key != b->key)
        return a->len_bytes;
    if (a->off == b->off && a->row_bytes == b->row_bytes && a->stride == b->stride &&
        a->phase == b->phase)
        return 0;
    /* Walk the pieces where both are contiguous: within one, the origins
     * differ by a constant, so they agree everywhere or nowhere. */
    uint64_t bad = 0;
    for (uint64_t x = 0; x < a->len_bytes;) {
        uint64_t seg = a->len_bytes - x;
        if (a->row_bytes != 0 && a->row_bytes - (a->phase + x) % a->row_bytes < seg)
            seg = a->row_bytes - (a->phase + x) % a->row_bytes;
        if (b->row_bytes != 0 && b->row_bytes - (b->phase + x) % b->row_bytes < seg)
            seg = b->row_bytes - (b->phase + x) % b->row_bytes;
        if (sim_prov_origin(a, x) != sim_prov_origin(b, x))
            bad += seg;
        x += seg;
    }
    return bad;
}

uint64_t sim_prov_diff(sim_prov_map_t *m, const sim_prov_run_t *want)
{
    if (want->len_bytes == 0)
        return 0;
    sim_prov_run_t w = *want;
    sim_prov_canon(&w);
    const uint64_t lo = w.addr, hi = sim_prov_end(&w);
    m->src.n = 0;
    if (sim_prov_collect(m, m->root, lo, hi, &m->src, false) != KVS_OK)
        return w.len_bytes; /* cannot tell: count it all as wrong */
    uint64_t bad = 0, pos = lo;
    for (size_t i = 0; i < m->src.n; i++) {
        const sim_prov_run_t *r = &m->src.v[i];
        const uint64_t s = r->addr > pos ? r->addr : pos;
        const uint64_t e = sim_prov_end(r) < hi ? sim_prov_end(r) : hi;
        bad += s - pos; /* a hole */
        const sim_prov_run_t have = sim_prov_clip(r, s - r->addr, e - r->addr);
        const sim_prov_run_t exp = sim_prov_clip(&w, s - lo, e - lo);
        bad += sim_prov_run_diff(&have, &exp);
        pos = e;
    }
    return bad + (hi - pos);
}

int sim_prov_lookup(const sim_prov_map_t *m, uint64_t addr, sim_prov_run_t *out)
{
    const uint32_t t = sim_prov_find(m, addr);
    if (t == 0)
        return 0;
    *out = m->nodes[t].run;
    return 1;
}

uint64_t sim_prov_runs(const sim_prov_map_t *m) { return m->count; }
uint64_t sim_prov_runs_peak(const sim_prov_map_t *m) { return m->peak; }
