/*
 * test_copy_parts.c - a fused copy equals its parts copied one by one, on
 * every device backend.
 *
 * gather_parts into the parts' staging blocks must leave every block (the
 * slots not copied included) as one gather per part leaves a copy of it;
 * scatter_parts from those blocks into pool B must leave every layer
 * buffer as one scatter per part leaves pool C, B and C alike before. The
 * devices: the host backend (hw/host, native fused copies) with its default
 * config, three copy threads and 16-byte vectors, and the simulated GPU
 * (sim/gpu.c, the core's default loop). Shapes are random from fixed seeds
 * (heads split into contiguous ranges, a random subset of them in random
 * order, a gather's extra parts reading heads again into blocks of their
 * own, blocks in allocations of their own or back to back in one), plus
 * copies of over 4 MiB on the host, where it streams its stores (the
 * P8->D2 decode case of four one-head blocks into 4-head rows among them),
 * with every vector width and three copy threads. And the refusals on each
 * device: overlapping scatter heads, overlapping gather blocks, a freed
 * block in part 2 named in the detail, and on the host nothing of a
 * refused fused copy runs.
 *
 * Only kvs_device_t ops are used (plus a wait for an event), so any backend
 * can be added as a side. A failure prints the case and its seed;
 * COPY_PARTS_SEED=<seed> replays a random one.
 */
#include <kvstage/host.h>

#include "engine.h"
#include "gpu.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xorshift.h"

/* ---- devices ------------------------------------------------------------- */

/* Waits until ev is complete on dev; KVS_OK or the failure. */
typedef int (*wait_fn)(void *ctx, kvs_device_t *dev, kvs_event_t *ev);

typedef struct side {
    char label[64];
    kvs_device_t *dev;
    kvs_stream_t *s;
    wait_fn wait;
    void *wait_ctx;
    bool native; /* the backend's own fused copies: all or nothing */
    kvs_host_device_t *host;
    sim_engine_t *eng;
    sim_gpu_t *gpu;
} side_t;

static int wait_host(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    return kvs_host_event_wait(dev, ev);
}

/* The simulated GPU copies when its engine runs. */
static int wait_sim(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    sim_engine_run(ctx, UINT64_MAX, 0);
    return dev->ops.event_query(dev, ev);
}

static void side_open_host(side_t *sd, const char *label, const kvs_host_config_t *cfg)
{
    memset(sd, 0, sizeof *sd);
    snprintf(sd->label, sizeof sd->label, "%s", label);
    kvs_error_t err;
    if (kvs_host_device_create(cfg, &sd->host, &err) != KVS_OK)
        fail_msg("%s: %s", label, err.msg);
    sd->dev = kvs_host_device(sd->host);
    sd->wait = wait_host;
    sd->native = true;
    assert_int_equal(sd->dev->ops.stream_create(sd->dev, &sd->s), KVS_OK);
}

static void side_open_sim(side_t *sd)
{
    memset(sd, 0, sizeof *sd);
    snprintf(sd->label, sizeof sd->label, "sim-gpu");
    assert_int_equal(sim_engine_create(1, 64, &sd->eng), KVS_OK);
    assert_int_equal(sim_gpu_create(sd->eng, NULL, 0, &sd->gpu), KVS_OK);
    sd->dev = sim_gpu_device(sd->gpu);
    sd->wait = wait_sim;
    sd->wait_ctx = sd->eng;
    assert_int_equal(sd->dev->ops.stream_create(sd->dev, &sd->s), KVS_OK);
}

static void side_close(side_t *sd)
{
    sd->dev->ops.stream_destroy(sd->dev, sd->s);
    if (sd->host != NULL)
        kvs_host_device_destroy(sd->host);
    if (sd->gpu != NULL) {
        sim_gpu_destroy(sd->gpu);
        sim_engine_destroy(sd->eng);
    }
}

/* Waits for everything queued on the side's stream, through an event. */
static void side_drain(side_t *sd)
{
    kvs_event_t *ev = NULL;
    assert_int_equal(sd->dev->ops.event_record(sd->dev, sd->s, &ev), KVS_OK);
    assert_int_equal(sd->wait(sd->wait_ctx, sd->dev, ev), KVS_OK);
    sd->dev->ops.event_destroy(sd->dev, ev);
}

static void dev_ok(const side_t *sd, int rc, const char *what, uint64_t seed)
{
    if (rc != KVS_OK)
        fail_msg("%s on %s (seed %llu): %s: %s", what, sd->label, (unsigned long long)seed,
                 kvs_status_name(rc), sd->dev->last_backend_msg);
}

static uint64_t dev_alloc(const side_t *sd, uint64_t len_bytes)
{
    uint64_t a = 0;
    dev_ok(sd, sd->dev->ops.mem_alloc(sd->dev, len_bytes > 0 ? len_bytes : 1, &a), "mem_alloc",
           0);
    return a;
}

static void dev_free(const side_t *sd, uint64_t addr)
{
    if (addr != 0)
        dev_ok(sd, sd->dev->ops.mem_free(sd->dev, addr), "mem_free", 0);
}

/* ---- shapes and cases ---------------------------------------------------- */

#define MAX_LAYERS 4
#define MAX_PAGES 2048
#define MAX_PARTS 12

typedef struct shape {
    int64_t local_heads, head_dim, elem_bytes, page_size, tokens;
    int64_t pool_layers, layer_begin, layer_count, slots, slot_begin;
    int64_t pool_pages; /* pages in every layer buffer */
    int page_order;     /* 0 shuffled, 1 ascending, 2 descending */
} shape_t;

/* A part of the case: a head range; a replica reads heads again (gather
 * only), the others have disjoint heads and are the scatter's parts too. */
typedef struct entry {
    int64_t head_start, num_heads;
    bool replica;
} entry_t;

typedef struct copy_case {
    shape_t sh;
    entry_t e[MAX_PARTS];
    int n;
    bool packed; /* blocks back to back in one allocation, in part order */
    bool random; /* from random_case: COPY_PARTS_SEED replays it */
} copy_case_t;

static uint64_t head_bytes(const shape_t *sh) { return (uint64_t)(sh->head_dim * sh->elem_bytes); }

static uint64_t layer_bytes(const shape_t *sh)
{
    return (uint64_t)(sh->pool_pages * sh->page_size * sh->local_heads) * head_bytes(sh);
}

static uint64_t block_bytes(const shape_t *sh, int64_t num_heads)
{
    return head_bytes(sh) * (uint64_t)(num_heads * sh->tokens * sh->slots) * 2;
}

static copy_case_t random_case(uint64_t *rng)
{
    static const int64_t head_dims[] = {1, 3, 8, 64, 128};
    static const int64_t elems[] = {1, 2, 4};
    static const int64_t page_sizes[] = {1, 2, 3, 16};
    copy_case_t c;
    memset(&c, 0, sizeof c);
    shape_t *s = &c.sh;
    s->local_heads = xorshift_range(rng, 1, 8);
    s->head_dim = head_dims[xorshift_range(rng, 0, 4)];
    s->elem_bytes = elems[xorshift_range(rng, 0, 2)];
    s->page_size = page_sizes[xorshift_range(rng, 0, 3)];
    s->pool_pages = xorshift_range(rng, 1, 16);
    /* No tokens now and then; else 1 .. every slot of the pool. */
    s->tokens = xorshift_range(rng, 0, 15) == 0
                    ? 0
                    : xorshift_range(rng, 1, s->pool_pages * s->page_size);
    s->pool_layers = xorshift_range(rng, 1, 3);
    s->layer_begin = xorshift_range(rng, 0, s->pool_layers - 1);
    s->layer_count = xorshift_range(rng, 0, 7) == 0
                         ? 0
                         : xorshift_range(rng, 1, s->pool_layers - s->layer_begin);
    s->slot_begin = xorshift_range(rng, 0, 2);
    s->slots = s->slot_begin + s->layer_count + xorshift_range(rng, 0, 2);
    s->page_order = (int)xorshift_range(rng, 0, 2);

    /* [0, local_heads) cut into contiguous ranges, shuffled; a non-empty
     * prefix of them are the parts. */
    entry_t ranges[8];
    int nr = 0;
    int64_t start = 0;
    for (int64_t h = 1; h <= s->local_heads; h++)
        if (h == s->local_heads || xorshift_range(rng, 0, 1) == 0) {
            ranges[nr++] = (entry_t){start, h - start, false};
            start = h;
        }
    for (int i = nr - 1; i > 0; i--) {
        const int j = (int)xorshift_range(rng, 0, i);
        const entry_t t = ranges[i];
        ranges[i] = ranges[j];
        ranges[j] = t;
    }
    c.n = (int)xorshift_range(rng, 1, nr);
    memcpy(c.e, ranges, (size_t)c.n * sizeof c.e[0]);
    /* Up to two replicas, anywhere in the list, of any heads. */
    for (int64_t r = xorshift_range(rng, 0, 2); r > 0; r--) {
        const int64_t num = xorshift_range(rng, 1, s->local_heads);
        const entry_t rep = {xorshift_range(rng, 0, s->local_heads - num), num, true};
        const int at = (int)xorshift_range(rng, 0, c.n);
        memmove(&c.e[at + 1], &c.e[at], (size_t)(c.n - at) * sizeof c.e[0]);
        c.e[at] = rep;
        c.n++;
    }
    c.packed = xorshift_range(rng, 0, 1) == 1;
    c.random = true;
    return c;
}

/* ---- one case on one device ---------------------------------------------- */

typedef struct pool {
    uint64_t k[MAX_LAYERS], v[MAX_LAYERS];
} pool_t;

typedef struct run {
    side_t *sd;
    const copy_case_t *c;
    uint64_t seed, rng;
    uint64_t layer_bytes;
    int64_t pages[MAX_PAGES];
    int64_t num_pages;
    pool_t a, b, cc;               /* gather source; fused and one-by-one scatter targets */
    uint64_t blk_bytes[MAX_PARTS];
    uint64_t x[MAX_PARTS], y[MAX_PARTS]; /* blocks: fused, one by one */
    uint64_t x_alloc, y_alloc;     /* packed: the one allocation of each set */
    uint8_t *buf, *buf2;           /* host scratch of scratch_bytes */
    uint64_t scratch_bytes;
} run_t;

/* Writes the same len random bytes at a and (when not 0) at b. */
static void write_random(run_t *r, uint64_t a, uint64_t b, uint64_t len)
{
    if (len == 0)
        return;
    xorshift_fill(r->buf, len, &r->rng);
    dev_ok(r->sd, r->sd->dev->ops.mem_write(r->sd->dev, a, r->buf, len), "mem_write", r->seed);
    if (b != 0)
        dev_ok(r->sd, r->sd->dev->ops.mem_write(r->sd->dev, b, r->buf, len), "mem_write",
               r->seed);
}

/* The len bytes at a and at b are the same, else the case fails naming
 * what (with i) and the first byte that differs. */
static void expect_same(run_t *r, uint64_t a, uint64_t b, uint64_t len, const char *what, int i)
{
    if (len == 0)
        return;
    kvs_device_t *dev = r->sd->dev;
    dev_ok(r->sd, dev->ops.mem_read(dev, a, r->buf, len), "mem_read", r->seed);
    dev_ok(r->sd, dev->ops.mem_read(dev, b, r->buf2, len), "mem_read", r->seed);
    if (memcmp(r->buf, r->buf2, len) == 0)
        return;
    uint64_t at = 0;
    while (r->buf[at] == r->buf2[at])
        at++;
    const shape_t *s = &r->c->sh;
    char heads[MAX_PARTS * 32] = "";
    for (int k = 0, n = 0; k < r->c->n && n >= 0 && (size_t)n < sizeof heads; k++)
        n += snprintf(heads + n, sizeof heads - (size_t)n, " [%lld, +%lld)%s",
                      (long long)r->c->e[k].head_start, (long long)r->c->e[k].num_heads,
                      r->c->e[k].replica ? " replica" : "");
    char replay[64] = "";
    if (r->c->random)
        snprintf(replay, sizeof replay, ", replay: COPY_PARTS_SEED=%llu test_copy_parts",
                 (unsigned long long)r->seed);
    fail_msg("%s: %s %d: byte %llu of %llu differs (seed %llu%s; parts%s%s, %lld heads of "
             "%lld x %lld bytes, pages of %lld, %lld tokens, layers [%lld, +%lld) of %lld, "
             "slots [%lld, +%lld) of %lld)",
             r->sd->label, what, i, (unsigned long long)at, (unsigned long long)len,
             (unsigned long long)r->seed, replay, heads,
             r->c->packed ? " packed" : "",
             (long long)s->local_heads, (long long)s->head_dim, (long long)s->elem_bytes,
             (long long)s->page_size, (long long)s->tokens, (long long)s->layer_begin,
             (long long)s->layer_count, (long long)s->pool_layers, (long long)s->slot_begin,
             (long long)s->layer_count, (long long)s->slots);
}

static void make_pages(run_t *r)
{
    const shape_t *s = &r->c->sh;
    r->num_pages = (s->tokens + s->page_size - 1) / s->page_size;
    int64_t perm[MAX_PAGES];
    for (int64_t i = 0; i < s->pool_pages; i++)
        perm[i] = i;
    for (int64_t i = s->pool_pages - 1; i > 0; i--) {
        const int64_t j = xorshift_range(&r->rng, 0, i);
        const int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(r->pages, perm, (size_t)r->num_pages * sizeof r->pages[0]);
    if (s->page_order != 0)
        for (int64_t i = 1; i < r->num_pages; i++) /* insertion sort, then maybe reverse */
            for (int64_t j = i; j > 0 && (r->pages[j - 1] > r->pages[j]) == (s->page_order == 1);
                 j--) {
                const int64_t t = r->pages[j];
                r->pages[j] = r->pages[j - 1];
                r->pages[j - 1] = t;
            }
}

/* Allocates and fills pools A, B and C (B and C alike) and the blocks of
 * both sets (alike). */
static void run_setup(run_t *r, side_t *sd, const copy_case_t *c, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->sd = sd;
    r->c = c;
    r->seed = seed;
    r->rng = seed;
    const shape_t *s = &c->sh;
    assert_true(s->pool_layers <= MAX_LAYERS && s->pool_pages <= MAX_PAGES && c->n <= MAX_PARTS);
    r->layer_bytes = layer_bytes(s);
    r->scratch_bytes = r->layer_bytes;
    uint64_t total = 0;
    for (int i = 0; i < c->n; i++) {
        r->blk_bytes[i] = block_bytes(s, c->e[i].num_heads);
        total += r->blk_bytes[i];
        if (r->blk_bytes[i] > r->scratch_bytes)
            r->scratch_bytes = r->blk_bytes[i];
    }
    r->buf = malloc(r->scratch_bytes);
    r->buf2 = malloc(r->scratch_bytes);
    assert_true(r->buf != NULL && r->buf2 != NULL);
    make_pages(r);
    for (int64_t l = 0; l < s->pool_layers; l++) {
        r->a.k[l] = dev_alloc(sd, r->layer_bytes);
        r->a.v[l] = dev_alloc(sd, r->layer_bytes);
        r->b.k[l] = dev_alloc(sd, r->layer_bytes);
        r->b.v[l] = dev_alloc(sd, r->layer_bytes);
        r->cc.k[l] = dev_alloc(sd, r->layer_bytes);
        r->cc.v[l] = dev_alloc(sd, r->layer_bytes);
        write_random(r, r->a.k[l], 0, r->layer_bytes);
        write_random(r, r->a.v[l], 0, r->layer_bytes);
        write_random(r, r->b.k[l], r->cc.k[l], r->layer_bytes);
        write_random(r, r->b.v[l], r->cc.v[l], r->layer_bytes);
    }
    if (c->packed) {
        r->x_alloc = dev_alloc(sd, total);
        r->y_alloc = dev_alloc(sd, total);
    }
    uint64_t off = 0;
    for (int i = 0; i < c->n; i++) {
        r->x[i] = c->packed ? r->x_alloc + off : dev_alloc(sd, r->blk_bytes[i]);
        r->y[i] = c->packed ? r->y_alloc + off : dev_alloc(sd, r->blk_bytes[i]);
        off += r->blk_bytes[i];
        write_random(r, r->x[i], r->y[i], r->blk_bytes[i]);
    }
}

static void run_teardown(run_t *r)
{
    const shape_t *s = &r->c->sh;
    for (int64_t l = 0; l < s->pool_layers; l++) {
        const pool_t *p[3] = {&r->a, &r->b, &r->cc};
        for (int i = 0; i < 3; i++) {
            dev_free(r->sd, p[i]->k[l]);
            dev_free(r->sd, p[i]->v[l]);
        }
    }
    if (r->c->packed) {
        dev_free(r->sd, r->x_alloc);
        dev_free(r->sd, r->y_alloc);
    } else {
        for (int i = 0; i < r->c->n; i++) {
            dev_free(r->sd, r->x[i]);
            dev_free(r->sd, r->y[i]);
        }
    }
    free(r->buf);
    free(r->buf2);
}

/* The case's descriptor on pool p; its own heads and staging address are
 * poisoned (a fused copy does not read them). */
static kvs_copy_desc_t desc_on(const run_t *r, const pool_t *p)
{
    const shape_t *s = &r->c->sh;
    return (kvs_copy_desc_t){
        .k_base = p->k,
        .v_base = p->v,
        .local_heads = s->local_heads,
        .head_dim = s->head_dim,
        .elem_bytes = s->elem_bytes,
        .page_size = s->page_size,
        .pages = r->pages,
        .num_pages = r->num_pages,
        .tokens = s->tokens,
        .head_start = -1,
        .num_heads = 0,
        .layer_begin = s->layer_begin,
        .layer_count = s->layer_count,
        .staging_slot_begin = s->slot_begin,
        .staging_layer_slots = s->slots,
        .staging_addr = 0,
    };
}

static kvs_copy_desc_t desc_part(const run_t *r, const pool_t *p, int i, uint64_t staging)
{
    kvs_copy_desc_t d = desc_on(r, p);
    d.head_start = r->c->e[i].head_start;
    d.num_heads = r->c->e[i].num_heads;
    d.staging_addr = staging;
    return d;
}

/* Gather A fused into the x blocks and part by part into the y blocks;
 * then scatter the x blocks (all but replicas) fused into B and part by
 * part into C; compare. */
static void run_case(side_t *sd, const copy_case_t *c, uint64_t seed)
{
    run_t r;
    run_setup(&r, sd, c, seed);
    kvs_device_t *dev = sd->dev;
    kvs_copy_part_t parts[MAX_PARTS];
    for (int i = 0; i < c->n; i++)
        parts[i] = (kvs_copy_part_t){c->e[i].head_start, c->e[i].num_heads, r.x[i]};

    const kvs_copy_desc_t da = desc_on(&r, &r.a);
    dev_ok(sd, dev->ops.gather_parts(dev, sd->s, &da, parts, c->n), "gather_parts", seed);
    for (int i = 0; i < c->n; i++) {
        const kvs_copy_desc_t d = desc_part(&r, &r.a, i, r.y[i]);
        dev_ok(sd, dev->ops.gather(dev, sd->s, &d), "gather", seed);
    }
    side_drain(sd);
    for (int i = 0; i < c->n; i++)
        expect_same(&r, r.x[i], r.y[i], r.blk_bytes[i],
                    "gather_parts vs one gather per part, block of part", i);

    kvs_copy_part_t sp[MAX_PARTS];
    int ns = 0;
    for (int i = 0; i < c->n; i++)
        if (!c->e[i].replica)
            sp[ns++] = parts[i];
    const kvs_copy_desc_t db = desc_on(&r, &r.b);
    dev_ok(sd, dev->ops.scatter_parts(dev, sd->s, &db, sp, ns), "scatter_parts", seed);
    for (int i = 0; i < c->n; i++) {
        if (c->e[i].replica)
            continue;
        const kvs_copy_desc_t d = desc_part(&r, &r.cc, i, r.x[i]);
        dev_ok(sd, dev->ops.scatter(dev, sd->s, &d), "scatter", seed);
    }
    side_drain(sd);
    for (int64_t l = 0; l < c->sh.pool_layers; l++) {
        expect_same(&r, r.b.k[l], r.cc.k[l], r.layer_bytes,
                    "scatter_parts vs one scatter per part, K of layer", (int)l);
        expect_same(&r, r.b.v[l], r.cc.v[l], r.layer_bytes,
                    "scatter_parts vs one scatter per part, V of layer", (int)l);
    }
    run_teardown(&r);
}

/* ---- tests --------------------------------------------------------------- */

#define RANDOM_CASES 100

/* RANDOM_CASES cases from root, or the one of seed COPY_PARTS_SEED when
 * set (a failure prints its seed). */
static void random_cases_on(side_t *sd, uint64_t root)
{
    const char *replay = getenv("COPY_PARTS_SEED");
    uint64_t rng = root;
    for (int i = 0; i < (replay != NULL ? 1 : RANDOM_CASES); i++) {
        const uint64_t seed = replay != NULL ? strtoull(replay, NULL, 0) : xorshift64(&rng);
        uint64_t shape_rng = seed;
        const copy_case_t c = random_case(&shape_rng);
        run_case(sd, &c, seed);
    }
}

static void test_copy_parts_random_shapes_host(void **state)
{
    const kvs_host_config_t cfgs[] = {{.name = "host"},
                                      {.name = "host-3-threads", .copy_threads = 3},
                                      {.name = "host-16-byte-vectors", .max_vector_bytes = 16}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        side_t sd;
        side_open_host(&sd, cfgs[i].name, &cfgs[i]);
        random_cases_on(&sd, 0xF05ED + i);
        side_close(&sd);
    }
}

static void test_copy_parts_random_shapes_sim_gpu(void **state)
{
    side_t sd;
    side_open_sim(&sd);
    random_cases_on(&sd, 0xF05ED);
    side_close(&sd);
}

/* Copies of over 4 MiB: the host streams its stores (on the sum of the
 * parts' rows), and three copy threads split them. */
static void test_copy_parts_streaming_sizes_host(void **state)
{
    /* local heads, head_dim, elem, page, tokens, pool layers, begin, count,
     * slots, slot begin, pool pages, order */
    const shape_t decode = {4, 128, 2, 16, 4100, 2, 0, 2, 2, 0, 257, 0};
    /* 258 full pages: 64 groups of four, two pages and 5 tokens left. */
    const shape_t rest = {4, 128, 2, 16, 4133, 2, 0, 2, 2, 0, 300, 0};
    /* 72-byte heads in 576-byte token slots, pages of 3: rows 216, 72 and
     * 288 bytes long, most of them not aligned for wide stores. */
    const shape_t odd = {8, 36, 2, 3, 4000, 1, 0, 1, 1, 0, 1334, 0};
    const copy_case_t cases[] = {
        /* P8->D2 decode: four one-head blocks into 4-head rows, in order. */
        {.sh = decode, .e = {{0, 1, false}, {1, 1, false}, {2, 1, false}, {3, 1, false}},
         .n = 4, .packed = true},
        /* Two parts of two heads, out of order, blocks of their own. */
        {.sh = decode, .e = {{2, 2, false}, {0, 2, false}}, .n = 2},
        /* Head 2 left alone by the scatter; the gather reads head 1 twice. */
        {.sh = decode, .e = {{1, 1, false}, {3, 1, false}, {1, 1, true}, {0, 1, false}},
         .n = 4, .packed = true},
        {.sh = odd, .e = {{4, 4, false}, {0, 3, false}, {3, 1, false}}, .n = 3, .packed = true},
        /* Four pages at a time, then rows: 3 one-head parts and a
         * two-head one, out of order. */
        {.sh = rest, .e = {{3, 1, false}, {0, 2, false}, {2, 1, false}}, .n = 3, .packed = true},
        {.sh = rest, .e = {{1, 1, false}, {2, 2, false}}, .n = 2},
    };
    const kvs_host_config_t cfgs[] = {{.name = "host-vectors-0", .max_vector_bytes = 0},
                                      {.name = "host-vectors-16", .max_vector_bytes = 16},
                                      {.name = "host-vectors-32", .max_vector_bytes = 32},
                                      {.name = "host-vectors-64", .max_vector_bytes = 64},
                                      {.name = "host-3-threads", .copy_threads = 3}};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        side_t sd;
        side_open_host(&sd, cfgs[k].name, &cfgs[k]);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            /* Over 4 MiB fused; pool pages enough for the tokens. */
            const shape_t *s = &cases[i].sh;
            uint64_t payload = 0;
            for (int j = 0; j < cases[i].n; j++)
                payload += block_bytes(s, cases[i].e[j].num_heads) / (uint64_t)s->slots *
                           (uint64_t)s->layer_count;
            assert_true(payload >= (4u << 20));
            assert_true(s->pool_pages * s->page_size >= s->tokens);
            run_case(&sd, &cases[i], 0xB16 + 16 * k + i);
        }
        side_close(&sd);
    }
}

/* ---- refusals ------------------------------------------------------------ */

/* The call was refused with status and a detail holding every needle
 * (NULL-terminated). */
static void expect_refused(const side_t *sd, int rc, int status, ...)
{
    if (rc != status)
        fail_msg("%s: want %s, got %s (\"%s\")", sd->label, kvs_status_name(status),
                 kvs_status_name(rc), sd->dev->last_backend_msg);
    va_list ap;
    va_start(ap, status);
    for (const char *needle = va_arg(ap, const char *); needle != NULL;
         needle = va_arg(ap, const char *))
        if (strstr(sd->dev->last_backend_msg, needle) == NULL)
            fail_msg("%s: detail \"%s\" lacks \"%s\"", sd->label, sd->dev->last_backend_msg,
                     needle);
    va_end(ap);
}

/* Pool B and C (alike), and x blocks (alike with y), untouched since
 * run_setup: nothing of a refused copy ran. */
static void expect_untouched(run_t *r)
{
    for (int64_t l = 0; l < r->c->sh.pool_layers; l++) {
        expect_same(r, r->b.k[l], r->cc.k[l], r->layer_bytes,
                    "a refused scatter_parts wrote K of layer", (int)l);
        expect_same(r, r->b.v[l], r->cc.v[l], r->layer_bytes,
                    "a refused scatter_parts wrote V of layer", (int)l);
    }
}

static void refusals_on(side_t *sd)
{
    /* 4 heads of 8 x 2 bytes, 10 tokens in pages of 4, 2 layers. */
    const copy_case_t c = {.sh = {4, 8, 2, 4, 10, 2, 0, 2, 2, 0, 4, 0},
                           .e = {{0, 2, false}, {1, 2, false}, {3, 1, false}},
                           .n = 3};
    run_t r;
    run_setup(&r, sd, &c, 77);
    kvs_device_t *dev = sd->dev;
    const kvs_copy_desc_t db = desc_on(&r, &r.b);
    kvs_copy_part_t p[3];
    for (int i = 0; i < 3; i++)
        p[i] = (kvs_copy_part_t){c.e[i].head_start, c.e[i].num_heads, r.x[i]};

    /* Heads [0, +2) and [1, +2) both written. */
    expect_refused(sd, dev->ops.scatter_parts(dev, sd->s, &db, p, 3), KVS_ERANGE,
                   "scatter_parts on ", "parts 0 and 1 both write heads of [0, +2) and [1, +2)",
                   "give each part its own heads", NULL);
    /* Part 1's block 8 bytes into part 0's. */
    p[1] = (kvs_copy_part_t){2, 1, r.x[0] + 8};
    expect_refused(sd, dev->ops.gather_parts(dev, sd->s, &db, p, 3), KVS_ERANGE,
                   "gather_parts on ", "parts 0 and 1 write overlapping staging blocks",
                   "give each part its own block", NULL);
    /* Part 2's block freed: disjoint heads, blocks of their own. */
    p[1] = (kvs_copy_part_t){2, 1, r.x[1]};
    dev_free(sd, r.x[2]);
    r.x[2] = 0; /* freed: the teardown skips it */
    expect_refused(sd, dev->ops.scatter_parts(dev, sd->s, &db, p, 3), KVS_ERANGE, "part 2",
                   "staging block", NULL);
    side_drain(sd);
    /* On the host nothing ran: its fused copy is all or nothing. The
     * default loop (sim GPU) may have enqueued parts 0 and 1. */
    if (sd->native)
        expect_untouched(&r);
    expect_refused(sd, dev->ops.gather_parts(dev, sd->s, &db, p, 3), KVS_ERANGE, "part 2",
                   "staging block", NULL);
    side_drain(sd);
    if (sd->native)
        for (int i = 0; i < 2; i++)
            expect_same(&r, r.x[i], r.y[i], r.blk_bytes[i],
                        "a refused gather_parts wrote the block of part", i);
    /* No parts. */
    expect_refused(sd, dev->ops.gather_parts(dev, sd->s, &db, p, 0), KVS_EINVAL,
                   "pass 1 to 1024 parts", NULL);
    expect_refused(sd, dev->ops.scatter_parts(dev, sd->s, &db, NULL, 3), KVS_EINVAL,
                   "parts is NULL", NULL);
    /* Fixed, the same parts go through. */
    p[2].staging_addr = r.y[2];
    dev_ok(sd, dev->ops.scatter_parts(dev, sd->s, &db, p, 3), "scatter_parts", 77);
    side_drain(sd);
    run_teardown(&r);
}

static void test_copy_parts_refusals_host(void **state)
{
    side_t sd;
    side_open_host(&sd, "host", NULL);
    refusals_on(&sd);
    side_close(&sd);
}

static void test_copy_parts_refusals_sim_gpu(void **state)
{
    side_t sd;
    side_open_sim(&sd);
    refusals_on(&sd);
    side_close(&sd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_parts_random_shapes_host),
        cmocka_unit_test(test_copy_parts_random_shapes_sim_gpu),
        cmocka_unit_test(test_copy_parts_streaming_sizes_host),
        cmocka_unit_test(test_copy_parts_refusals_host),
        cmocka_unit_test(test_copy_parts_refusals_sim_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
