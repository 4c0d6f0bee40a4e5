/*
 * prov.c - the provenance maps of prov.h: the runs in address order, in a
 * two-level array: leaves of up to SIM_PROV_LEAF_MAX runs, and an array of
 * the leaves with each leaf's first address, searched by bisection. A map
 * of a few thousand runs is a few dozen leaves, so finding an address
 * touches a few cache lines of the top array and one leaf, and changing a
 * few runs moves at most one leaf's tail.
 *
 * Every change is a range rewrite: the runs touching [lo, hi) and its two
 * neighbours are collected (one search, then a walk), swept together with
 * the new pieces into a sorted, merged list, and that list replaces them:
 * inside their leaf when it fits, else the leaves they span are laid out
 * again. A copy of many rows therefore costs one rewrite of the
 * destination's hull plus a linear walk of the source's runs in its hull,
 * never a search per row.
 *
 * Invariants: those of prov.h; no leaf is empty; the runs of leaf i come
 * before those of leaf i + 1; first[i] is leaf i's first address; count
 * is the runs in all leaves.
 */
#include "prov.h"

#include <kvstage/kvstage.h>

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A leaf laid out again is filled to 3/4 of SIM_PROV_LEAF_MAX. */
#define SIM_PROV_LEAF_FILL (SIM_PROV_LEAF_MAX * 3 / 4)

typedef struct sim_prov_leaf {
    uint32_t n;
    sim_prov_run_t run[SIM_PROV_LEAF_MAX];
} sim_prov_leaf_t;

/* A growable array of runs (the map's scratch lists). */
typedef struct sim_prov_list {
    sim_prov_run_t *v;
    size_t n, cap;
} sim_prov_list_t;

struct sim_prov_map {
    sim_prov_leaf_t **leaf; /* [nleaves], in address order */
    uint64_t *first;        /* [nleaves]: leaf[i]->run[0].addr */
    size_t nleaves, leaves_cap;
    uint64_t count, peak;
    sim_prov_list_t src, pieces, old, out;
    sim_prov_leaf_t **spare; /* rewrite: leaves taken out or about to go in */
    size_t nspare, spare_cap;
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

/* ---- the leaves -------------------------------------------------------------- */

/* A position: run i of leaf l (l == nleaves: the end). */
typedef struct sim_prov_pos {
    size_t l, i;
} sim_prov_pos_t;

/* The first run whose end is past x (the run holding x, or the next). */
static sim_prov_pos_t sim_prov_seek(const sim_prov_map_t *m, uint64_t x)
{
    /* The last leaf starting at or before x (leaf 0 when none does). */
    size_t lo = 0, hi = m->nleaves;
    while (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        if (m->first[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    if (m->nleaves == 0)
        return (sim_prov_pos_t){0, 0};
    const sim_prov_leaf_t *f = m->leaf[lo];
    /* The first run of the leaf starting after x, then one back. */
    size_t a = 0, b = f->n;
    while (a < b) {
        const size_t mid = a + (b - a) / 2;
        if (f->run[mid].addr <= x)
            a = mid + 1;
        else
            b = mid;
    }
    if (a > 0 && sim_prov_end(&f->run[a - 1]) > x)
        a--;
    if (a == f->n)
        return (sim_prov_pos_t){lo + 1, 0};
    return (sim_prov_pos_t){lo, a};
}

/* Appends the runs overlapping [lo, hi), in order, to l; *at is where the
 * first of them is (or where one would go) when at. */
static int sim_prov_collect(const sim_prov_map_t *m, uint64_t lo, uint64_t hi,
                            sim_prov_list_t *l, sim_prov_pos_t *at)
{
    sim_prov_pos_t p = sim_prov_seek(m, lo);
    if (at != NULL)
        *at = p;
    for (; p.l < m->nleaves; p.l++, p.i = 0) {
        const sim_prov_leaf_t *f = m->leaf[p.l];
        for (; p.i < f->n; p.i++) {
            if (f->run[p.i].addr >= hi)
                return KVS_OK;
            const int rc = sim_prov_list_push(l, &f->run[p.i]);
            if (rc != KVS_OK)
                return rc;
        }
    }
    return KVS_OK;
}

/* Room for `more` leaves in the top array, and in the spare list. */
static int sim_prov_reserve(sim_prov_map_t *m, size_t more)
{
    if (m->nleaves + more > m->leaves_cap) {
        size_t cap = m->leaves_cap == 0 ? 16 : m->leaves_cap;
        while (cap < m->nleaves + more)
            cap *= 2;
        sim_prov_leaf_t **leaf = realloc(m->leaf, cap * sizeof *leaf);
        if (leaf == NULL)
            return KVS_ENOMEM;
        m->leaf = leaf;
        uint64_t *first = realloc(m->first, cap * sizeof *first);
        if (first == NULL)
            return KVS_ENOMEM;
        m->first = first;
        m->leaves_cap = cap;
    }
    if (m->nspare + more > m->spare_cap) {
        size_t cap = m->spare_cap == 0 ? 16 : m->spare_cap;
        while (cap < m->nspare + more)
            cap *= 2;
        sim_prov_leaf_t **spare = realloc(m->spare, cap * sizeof *spare);
        if (spare == NULL)
            return KVS_ENOMEM;
        m->spare = spare;
        m->spare_cap = cap;
    }
    return KVS_OK;
}

static void sim_prov_count(sim_prov_map_t *m, size_t removed, size_t added)
{
    m->count = m->count - removed + added;
    if (m->count > m->peak)
        m->peak = m->count;
}

/* Replaces the k runs from position p by m->out, laying out again the
 * leaves they span (with the runs before and after them in those leaves)
 * when they do not fit in place. On failure the map is unchanged. */
static int sim_prov_splice(sim_prov_map_t *m, sim_prov_pos_t p, size_t k)
{
    const size_t n = m->out.n;
    if (m->nleaves == 0 && n == 0)
        return KVS_OK;
    /* Insertions at the end of the map go into the last leaf. */
    if (p.l == m->nleaves && m->nleaves > 0) {
        p.l--;
        p.i = m->leaf[p.l]->n;
    }
    sim_prov_leaf_t *f = m->nleaves > 0 ? m->leaf[p.l] : NULL;
    if (f != NULL && p.i + k <= f->n && f->n - k + n <= SIM_PROV_LEAF_MAX &&
        (n > 0 || k < f->n)) {
        /* In place: the runs are all in leaf p.l, and it has room. */
        memmove(&f->run[p.i + n], &f->run[p.i + k], (f->n - p.i - k) * sizeof f->run[0]);
        memcpy(&f->run[p.i], m->out.v, n * sizeof f->run[0]);
        f->n = (uint32_t)(f->n - k + n);
        m->first[p.l] = f->run[0].addr;
        sim_prov_count(m, k, n);
        return KVS_OK;
    }
    /* The leaves [l0, l1) the k runs span, and the runs kept around them. */
    const size_t l0 = p.l;
    size_t l1 = l0, left = k, head = p.i, tail = 0;
    while (l1 < m->nleaves) {
        const size_t in = m->leaf[l1]->n - (l1 == l0 ? head : 0);
        if (left <= in) {
            tail = in - left;
            l1++;
            break;
        }
        left -= in;
        l1++;
    }
    const size_t total = head + n + tail;
    const size_t want = total == 0 ? 0
                        : total <= SIM_PROV_LEAF_MAX
                            ? 1
                            : (total + SIM_PROV_LEAF_FILL - 1) / SIM_PROV_LEAF_FILL;
    const size_t had = l1 - l0;
    int rc = sim_prov_reserve(m, want > had ? want - had : 0);
    /* The old leaves' runs, in order, into m->old (it held them already
     * for the rewrite, but without the head and tail). */
    m->old.n = 0;
    for (size_t l = l0, x = 0; l < l1 && rc == KVS_OK; l++) {
        const sim_prov_leaf_t *g = m->leaf[l];
        for (size_t i = 0; i < g->n && rc == KVS_OK; i++, x++)
            if (x < head || x >= head + k)
                rc = sim_prov_list_push(&m->old, &g->run[i]);
    }
    m->nspare = 0;
    for (size_t i = had; i < want && rc == KVS_OK; i++) {
        sim_prov_leaf_t *g = malloc(sizeof *g);
        if (g == NULL)
            rc = KVS_ENOMEM;
        else
            m->spare[m->nspare++] = g;
    }
    if (rc != KVS_OK) {
        while (m->nspare > 0)
            free(m->spare[--m->nspare]);
        return rc;
    }
    /* Leaves going away are freed; the top array closes or opens. */
    for (size_t l = l0 + want; l < l1; l++)
        free(m->leaf[l]);
    if (want != had) {
        memmove(&m->leaf[l0 + want], &m->leaf[l1], (m->nleaves - l1) * sizeof m->leaf[0]);
        memmove(&m->first[l0 + want], &m->first[l1], (m->nleaves - l1) * sizeof m->first[0]);
        for (size_t i = had; i < want; i++)
            m->leaf[l0 + i] = m->spare[i - had];
        m->nleaves = m->nleaves - had + want;
    }
    /* Lay the runs out: head (m->old[0, head)), new (m->out), tail. */
    size_t from = 0;
    for (size_t l = 0; l < want; l++) {
        sim_prov_leaf_t *g = m->leaf[l0 + l];
        const size_t take = total / want + (l < total % want);
        for (size_t i = 0; i < take; i++, from++) {
            const sim_prov_run_t *r = from < head       ? &m->old.v[from]
                                      : from < head + n ? &m->out.v[from - head]
                                                        : &m->old.v[from - n];
            g->run[i] = *r;
        }
        g->n = (uint32_t)take;
        m->first[l0 + l] = g->run[0].addr;
    }
    sim_prov_count(m, k, n);
    return KVS_OK;
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

/* Replaces what [lo, hi) holds by pieces (sorted, disjoint, inside it;
 * holes erase, bytes between pieces keep their runs). The runs touching
 * [lo, hi) and its two neighbours (so the new runs merge with them) are
 * swept with the pieces into m->out, which takes their place. */
static int sim_prov_rewrite(sim_prov_map_t *m, uint64_t lo, uint64_t hi,
                            const sim_prov_list_t *pieces)
{
    if (lo >= hi)
        return KVS_OK;
    m->old.n = 0;
    sim_prov_pos_t at;
    int rc = sim_prov_collect(m, lo > 0 ? lo - 1 : 0, hi + 1, &m->old, &at);
    if (rc == KVS_OK)
        rc = sim_prov_sweep(m, pieces);
    return rc == KVS_OK ? sim_prov_splice(m, at, m->old.n) : rc; /* on failure: unchanged */
}

/* ---- the API ---------------------------------------------------------------- */

int sim_prov_map_create(sim_prov_map_t **out)
{
    sim_prov_map_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return KVS_ENOMEM;
    *out = m;
    return KVS_OK;
}

void sim_prov_map_destroy(sim_prov_map_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->nleaves; i++)
        free(m->leaf[i]);
    free(m->leaf);
    free(m->first);
    free(m->spare);
    free(m->src.v);
    free(m->pieces.v);
    free(m->old.v);
    free(m->out.v);
    free(m->idx);
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
            rc = sim_prov_collect(src, p->s0,
                                  p->s0 + (rows - 1) * p->ss + p->row_bytes, &dst->src, NULL);
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
    if (sim_prov_collect(m, lo, hi, &m->src, NULL) != KVS_OK)
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
    const sim_prov_pos_t p = sim_prov_seek(m, addr);
    if (p.l == m->nleaves || m->leaf[p.l]->run[p.i].addr > addr)
        return 0;
    *out = m->leaf[p.l]->run[p.i];
    return 1;
}

int sim_prov_valid(const sim_prov_map_t *m)
{
    uint64_t runs = 0, end = 0;
    for (size_t l = 0; l < m->nleaves; l++) {
        const sim_prov_leaf_t *f = m->leaf[l];
        if (f->n == 0 || f->n > SIM_PROV_LEAF_MAX || m->first[l] != f->run[0].addr)
            return 0;
        for (size_t i = 0; i < f->n; i++) {
            const sim_prov_run_t *r = &f->run[i];
            if ((runs > 0 && r->addr < end) || r->len_bytes == 0 || r->key == SIM_PROV_HOLE)
                return 0;
            end = sim_prov_end(r);
            runs++;
        }
    }
    return runs == m->count && m->count <= m->peak;
}

uint64_t sim_prov_runs(const sim_prov_map_t *m) { return m->count; }
uint64_t sim_prov_runs_peak(const sim_prov_map_t *m) { return m->peak; }
