/*
 * device_contract.c - the device contract's tests (see device_contract.h),
 * run by each device backend's test file on its own device. Random data
 * and shapes come from fixed seeds, named on failure.
 */
#include "device_contract.h"

#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xorshift.h"

/* ---- fixture: the backend's device and one stream --------------------------- */

typedef struct dc_fx {
    const dc_backend_t *b;
    void *ctx;
    kvs_device_t *dev;
    kvs_stream_t *s;
} dc_fx_t;

/* Opens the backend's device (the test skips where there is none). */
static void dc_open(dc_fx_t *f, void **state)
{
    memset(f, 0, sizeof *f);
    f->b = *state;
    f->dev = f->b->open(&f->ctx);
    if (f->dev == NULL)
        skip();
    assert_int_equal(f->dev->ops.stream_create(f->dev, &f->s), KVS_OK);
}

static void dc_close(dc_fx_t *f)
{
    f->dev->ops.stream_destroy(f->dev, f->s);
    f->b->close(f->ctx, f->dev);
}

static uint64_t dc_alloc(dc_fx_t *f, uint64_t len)
{
    uint64_t a = 0;
    assert_int_equal(f->dev->ops.mem_alloc(f->dev, len, &a), KVS_OK);
    assert_true(a != 0);
    return a;
}

static void dc_put(dc_fx_t *f, uint64_t addr, const void *src, uint64_t len)
{
    assert_int_equal(f->dev->ops.mem_write(f->dev, addr, src, len), KVS_OK);
}

static void dc_get(dc_fx_t *f, uint64_t addr, void *dst, uint64_t len)
{
    assert_int_equal(f->dev->ops.mem_read(f->dev, addr, dst, len), KVS_OK);
}

/* Waits for everything queued on the stream so far, through an event. */
static void dc_sync(dc_fx_t *f)
{
    kvs_event_t *ev = NULL;
    assert_int_equal(f->dev->ops.event_record(f->dev, f->s, &ev), KVS_OK);
    assert_int_equal(f->b->wait(f->ctx, f->dev, ev), KVS_OK);
    f->dev->ops.event_destroy(f->dev, ev);
}

static void dc_random(uint8_t *p, uint64_t len, uint64_t *rng)
{
    for (uint64_t i = 0; i < len; i++)
        p[i] = (uint8_t)(xorshift64(rng) >> 56);
}

/* A refusal says why: the backend's message is set. */
static void dc_refused(dc_fx_t *f, int rc, int want, const char *what)
{
    if (rc != want)
        fail_msg("%s on %s: %s, want %s", what, f->b->name, kvs_status_name(rc),
                 kvs_status_name(want));
    if (f->dev->last_backend_msg[0] == '\0')
        fail_msg("%s on %s: refused with no message", what, f->b->name);
}

/* ---- memory ------------------------------------------------------------------ */

static void dc_memory(void **state)
{
    dc_fx_t f;
    dc_open(&f, state);
    kvs_device_t *d = f.dev;
    uint64_t a = 0;
    dc_refused(&f, d->ops.mem_alloc(d, 0, &a), KVS_EINVAL, "mem_alloc of 0 bytes");
    /* An odd length: bounds are the length asked for, not a rounded one. */
    const uint64_t len = 4096 + 17;
    const uint64_t x = dc_alloc(&f, len), y = dc_alloc(&f, 64);
    uint8_t *in = malloc(len), *out = malloc(len + 1);
    assert_non_null(in);
    assert_non_null(out);
    uint64_t rng = 0xDC01;
    dc_random(in, len, &rng);
    dc_put(&f, x, in, len);
    uint8_t ybytes[64];
    memset(ybytes, 0x5a, sizeof ybytes);
    dc_put(&f, y, ybytes, sizeof ybytes);
    dc_get(&f, x, out, len);
    assert_memory_equal(in, out, len);
    /* Every range that leaves the allocation is refused, on both sides. */
    uint8_t two[2] = {1, 2};
    dc_refused(&f, d->ops.mem_read(d, x + len - 1, two, 2), KVS_ERANGE, "mem_read past the end");
    dc_refused(&f, d->ops.mem_write(d, x + len - 1, two, 2), KVS_ERANGE,
               "mem_write past the end");
    dc_refused(&f, d->ops.mem_write(d, x - 1, two, 2), KVS_ERANGE, "mem_write before the start");
    dc_refused(&f, d->ops.mem_read(d, x, out, len + 1), KVS_ERANGE, "mem_read one byte too long");
    assert_non_null(strstr(d->last_backend_msg, "mem_read")); /* names the call */
    dc_refused(&f, d->ops.mem_write(d, x + 60, in, UINT64_MAX), KVS_ERANGE,
               "mem_write of a length that wraps");
    assert_non_null(strstr(d->last_backend_msg, "mem_write"));
    dc_refused(&f, d->ops.mem_write(d, x, NULL, 1), KVS_EINVAL, "mem_write from NULL");
    dc_refused(&f, d->ops.mem_read(d, x, NULL, 1), KVS_EINVAL, "mem_read into NULL");
    dc_refused(&f, d->ops.mem_alloc(d, 8, NULL), KVS_EINVAL, "mem_alloc into NULL");
    /* ... and changes nothing: x and its neighbour read back as written. */
    dc_get(&f, x, out, len);
    assert_memory_equal(in, out, len);
    uint8_t yback[64];
    dc_get(&f, y, yback, sizeof yback);
    assert_memory_equal(ybytes, yback, sizeof yback);
    /* The last byte alone is inside. */
    dc_put(&f, x + len - 1, two, 1);
    assert_int_equal(d->ops.mem_free(d, x), KVS_OK);
    dc_refused(&f, d->ops.mem_free(d, x), KVS_ENOENT, "mem_free twice");
    dc_refused(&f, d->ops.mem_read(d, x, two, 1), KVS_ERANGE, "mem_read of freed memory");
    dc_refused(&f, d->ops.mem_free(d, y + 1), KVS_ENOENT, "mem_free inside an allocation");
    assert_int_equal(d->ops.mem_free(d, y), KVS_OK);
    free(in);
    free(out);
    dc_close(&f);
}

/* ---- gather and scatter against a reference ------------------------------------ */

#define DC_LAYERS 4

typedef struct dc_shape {
    int64_t ps, tokens, local_heads, head_start, num_heads, head_dim, elem;
    int64_t layers, layer_begin, layer_count, slots, slot_begin, planes, pool_pages;
} dc_shape_t;

/* A pool of `layers` layers (planes buffers each) and a staging block, on
 * the device and mirrored on the host, and the page list of the tokens. */
typedef struct dc_pool {
    dc_shape_t sh;
    uint64_t buf[2][DC_LAYERS]; /* [plane][layer] device addresses */
    uint8_t *host[2][DC_LAYERS];
    uint64_t buf_bytes;
    uint64_t stg;
    uint8_t *stg_host;
    uint64_t stg_bytes;
    int64_t *pages;
    int64_t npages;
} dc_pool_t;

static uint64_t dc_head_bytes(const dc_shape_t *s) { return (uint64_t)(s->head_dim * s->elem); }

static dc_shape_t dc_random_shape(uint64_t *rng)
{
    dc_shape_t s;
    s.ps = 1 + (int64_t)(xorshift64(rng) % 8);
    s.elem = (int64_t)1 << (xorshift64(rng) % 3);
    s.head_dim = 1 + (int64_t)(xorshift64(rng) % 12);
    s.local_heads = 1 + (int64_t)(xorshift64(rng) % 5);
    s.num_heads = 1 + (int64_t)(xorshift64(rng) % (uint64_t)s.local_heads);
    s.head_start = (int64_t)(xorshift64(rng) % (uint64_t)(s.local_heads - s.num_heads + 1));
    s.layers = 1 + (int64_t)(xorshift64(rng) % DC_LAYERS);
    s.layer_count = 1 + (int64_t)(xorshift64(rng) % (uint64_t)s.layers);
    s.layer_begin = (int64_t)(xorshift64(rng) % (uint64_t)(s.layers - s.layer_count + 1));
    s.slots = s.layer_count + (int64_t)(xorshift64(rng) % 3);
    s.slot_begin = (int64_t)(xorshift64(rng) % (uint64_t)(s.slots - s.layer_count + 1));
    s.planes = 1 + (int64_t)(xorshift64(rng) % 2);
    s.pool_pages = 4 + (int64_t)(xorshift64(rng) % 24);
    const int64_t max_tokens = s.pool_pages * s.ps;
    s.tokens = 1 + (int64_t)(xorshift64(rng) % (uint64_t)max_tokens);
    return s;
}

static void dc_pool_make(dc_fx_t *f, dc_pool_t *p, const dc_shape_t *sh, uint64_t *rng)
{
    memset(p, 0, sizeof *p);
    p->sh = *sh;
    const uint64_t hb = dc_head_bytes(sh);
    p->buf_bytes = (uint64_t)(sh->pool_pages * sh->ps * sh->local_heads) * hb;
    for (int64_t kv = 0; kv < sh->planes; kv++)
        for (int64_t l = 0; l < sh->layers; l++) {
            p->buf[kv][l] = dc_alloc(f, p->buf_bytes);
            p->host[kv][l] = malloc(p->buf_bytes);
            assert_non_null(p->host[kv][l]);
            dc_random(p->host[kv][l], p->buf_bytes, rng);
            dc_put(f, p->buf[kv][l], p->host[kv][l], p->buf_bytes);
        }
    p->stg_bytes = (uint64_t)(sh->planes * sh->slots * sh->tokens * sh->num_heads) * hb;
    p->stg = dc_alloc(f, p->stg_bytes);
    p->stg_host = malloc(p->stg_bytes);
    assert_non_null(p->stg_host);
    dc_random(p->stg_host, p->stg_bytes, rng);
    dc_put(f, p->stg, p->stg_host, p->stg_bytes);
    /* Distinct pages in a random order. */
    p->npages = (sh->tokens + sh->ps - 1) / sh->ps;
    int64_t *all = malloc((size_t)sh->pool_pages * sizeof *all);
    p->pages = malloc((size_t)p->npages * sizeof *p->pages);
    assert_non_null(all);
    assert_non_null(p->pages);
    for (int64_t i = 0; i < sh->pool_pages; i++)
        all[i] = i;
    for (int64_t i = sh->pool_pages - 1; i > 0; i--) {
        const int64_t j = (int64_t)(xorshift64(rng) % (uint64_t)(i + 1));
        const int64_t t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    memcpy(p->pages, all, (size_t)p->npages * sizeof *p->pages);
    free(all);
}

static void dc_pool_free(dc_fx_t *f, dc_pool_t *p)
{
    for (int64_t kv = 0; kv < p->sh.planes; kv++)
        for (int64_t l = 0; l < p->sh.layers; l++) {
            assert_int_equal(f->dev->ops.mem_free(f->dev, p->buf[kv][l]), KVS_OK);
            free(p->host[kv][l]);
        }
    assert_int_equal(f->dev->ops.mem_free(f->dev, p->stg), KVS_OK);
    free(p->stg_host);
    free(p->pages);
}

/* The descriptor of p's copy (its arrays point into p). */
static kvs_copy_desc_t dc_desc(const dc_pool_t *p)
{
    const dc_shape_t *s = &p->sh;
    return (kvs_copy_desc_t){
        .k_base = p->buf[0],
        .v_base = s->planes == 2 ? p->buf[1] : NULL,
        .local_heads = s->local_heads,
        .head_dim = s->head_dim,
        .elem_bytes = s->elem,
        .page_size = s->ps,
        .pages = p->pages,
        .num_pages = p->npages,
        .tokens = s->tokens,
        .head_start = s->head_start,
        .num_heads = s->num_heads,
        .layer_begin = s->layer_begin,
        .layer_count = s->layer_count,
        .staging_slot_begin = s->slot_begin,
        .staging_layer_slots = s->slots,
        .staging_addr = p->stg,
        .planes = s->planes,
    };
}

/* backend.h's words, naively: head h of token t of layer layer_begin + j,
 * plane kv, sits in the pool at slot pages[t / ps] * ps + t % ps, head
 * head_start + h, and in the staging block in slot kv * S + slot_begin + j,
 * row t, head h. Copies every such head one way on the host mirrors. */
static void dc_reference(dc_pool_t *p, bool scatter)
{
    const dc_shape_t *s = &p->sh;
    const uint64_t hb = dc_head_bytes(s);
    for (int64_t kv = 0; kv < s->planes; kv++)
        for (int64_t j = 0; j < s->layer_count; j++)
            for (int64_t t = 0; t < s->tokens; t++)
                for (int64_t h = 0; h < s->num_heads; h++) {
                    const int64_t slot = p->pages[t / s->ps] * s->ps + t % s->ps;
                    uint8_t *pool = p->host[kv][s->layer_begin + j] +
                                    (uint64_t)(slot * s->local_heads + s->head_start + h) * hb;
                    uint8_t *stg = p->stg_host +
                                   (uint64_t)(((kv * s->slots + s->slot_begin + j) * s->tokens +
                                               t) * s->num_heads + h) * hb;
                    if (scatter)
                        memcpy(pool, stg, hb);
                    else
                        memcpy(stg, pool, hb);
                }
}

/* The device's pool and staging block equal the host mirrors, every byte. */
static void dc_pool_check(dc_fx_t *f, const dc_pool_t *p, const char *what, uint64_t seed)
{
    uint8_t *got = malloc(p->buf_bytes > p->stg_bytes ? p->buf_bytes : p->stg_bytes);
    assert_non_null(got);
    for (int64_t kv = 0; kv < p->sh.planes; kv++)
        for (int64_t l = 0; l < p->sh.layers; l++) {
            dc_get(f, p->buf[kv][l], got, p->buf_bytes);
            if (memcmp(got, p->host[kv][l], p->buf_bytes) != 0)
                fail_msg("%s on %s, seed 0x%llx: plane %lld of layer %lld differs", what,
                         f->b->name, (unsigned long long)seed, (long long)kv, (long long)l);
        }
    dc_get(f, p->stg, got, p->stg_bytes);
    if (memcmp(got, p->stg_host, p->stg_bytes) != 0)
        fail_msg("%s on %s, seed 0x%llx: the staging block differs", what, f->b->name,
                 (unsigned long long)seed);
    free(got);
}

/* The copies of a hybrid model's state (src/hybrid_copy.c): a state
 * buffer as a pool of one-token pages, elem_bytes 1 and head_dim the bytes
 * of one state head (Qwen3-Next's 3072 + 65536, and an odd 1000 + 1), one
 * token, the page list the request's slot; two of four state heads. */
static const dc_shape_t dc_state_shapes[] = {
    {.ps = 1, .tokens = 1, .local_heads = 4, .head_start = 1, .num_heads = 2,
     .head_dim = 3072 + 65536, .elem = 1, .layers = 1, .layer_count = 1, .slots = 1,
     .planes = 1, .pool_pages = 6},
    {.ps = 1, .tokens = 1, .local_heads = 4, .head_start = 2, .num_heads = 2,
     .head_dim = 1001, .elem = 1, .layers = 2, .layer_begin = 1, .layer_count = 1,
     .slots = 1, .planes = 1, .pool_pages = 9},
};

static void dc_copies_match_reference(void **state)
{
    dc_fx_t f;
    dc_open(&f, state);
    uint64_t rng = 0xDC02;
    const int nstate = (int)(sizeof dc_state_shapes / sizeof dc_state_shapes[0]);
    for (int i = 0; i < 24 + nstate; i++) {
        const uint64_t seed = xorshift64(&rng);
        uint64_t r = seed;
        const dc_shape_t sh = i < 24 ? dc_random_shape(&r) : dc_state_shapes[i - 24];
        for (int scatter = 0; scatter < 2; scatter++) {
            dc_pool_t p;
            dc_pool_make(&f, &p, &sh, &r);
            const kvs_copy_desc_t d = dc_desc(&p);
            int rc = scatter ? f.dev->ops.scatter(f.dev, f.s, &d)
                             : f.dev->ops.gather(f.dev, f.s, &d);
            if (rc != KVS_OK)
                fail_msg("%s on %s, seed 0x%llx: %s: %s", scatter ? "scatter" : "gather",
                         f.b->name, (unsigned long long)seed, kvs_status_name(rc),
                         f.dev->last_backend_msg);
            dc_sync(&f);
            dc_reference(&p, scatter != 0);
            dc_pool_check(&f, &p, scatter ? "scatter" : "gather", seed);
            dc_pool_free(&f, &p);
        }
    }
    dc_close(&f);
}

/* A gather and a scatter of the staging block it fills, queued back to
 * back on one stream: the scatter reads what the gather wrote. */
static void dc_stream_runs_ops_in_order(void **state)
{
    dc_fx_t f;
    dc_open(&f, state);
    uint64_t rng = 0xDC03;
    for (int i = 0; i < 8; i++) {
        const uint64_t seed = xorshift64(&rng);
        uint64_t r = seed;
        const dc_shape_t sh = dc_random_shape(&r);
        dc_pool_t a, b;
        dc_pool_make(&f, &a, &sh, &r);
        dc_pool_make(&f, &b, &sh, &r);
        memcpy(b.pages, a.pages, (size_t)a.npages * sizeof *a.pages);
        kvs_copy_desc_t g = dc_desc(&a), s = dc_desc(&b);
        s.staging_addr = a.stg; /* b's rows from a's staging block */
        assert_int_equal(f.dev->ops.gather(f.dev, f.s, &g), KVS_OK);
        assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &s), KVS_OK);
        dc_sync(&f);
        dc_reference(&a, false);
        /* b's rows come from a's block; b's own block stays as it was */
        uint8_t *own = b.stg_host;
        b.stg_host = a.stg_host;
        dc_reference(&b, true);
        b.stg_host = own;
        dc_pool_check(&f, &a, "gather then scatter (the gather's side)", seed);
        dc_pool_check(&f, &b, "gather then scatter (the scatter's side)", seed);
        dc_pool_free(&f, &b);
        dc_pool_free(&f, &a);
    }
    dc_close(&f);
}

/* ---- refused descriptors ----------------------------------------------------- */

static void dc_refused_descriptors_change_nothing(void **state)
{
    dc_fx_t f;
    dc_open(&f, state);
    uint64_t rng = 0xDC04;
    dc_shape_t sh = dc_random_shape(&rng);
    sh.planes = 2;
    dc_pool_t p;
    dc_pool_make(&f, &p, &sh, &rng);
    kvs_device_t *d = f.dev;
    for (int scatter = 0; scatter < 2; scatter++) {
        const char *op = scatter ? "scatter" : "gather";
        int (*copy)(kvs_device_t *, kvs_stream_t *, const kvs_copy_desc_t *) =
            scatter ? d->ops.scatter : d->ops.gather;
        char what[96];
        snprintf(what, sizeof what, "%s of a NULL descriptor", op);
        dc_refused(&f, copy(d, f.s, NULL), KVS_EINVAL, what);
        kvs_copy_desc_t x = dc_desc(&p);
        x.planes = 3;
        snprintf(what, sizeof what, "%s with planes 3", op);
        dc_refused(&f, copy(d, f.s, &x), KVS_EINVAL, what);
        x = dc_desc(&p);
        x.num_heads = sh.local_heads + 1;
        snprintf(what, sizeof what, "%s of more heads than the pool has", op);
        dc_refused(&f, copy(d, f.s, &x), KVS_ERANGE, what);
        x = dc_desc(&p);
        x.staging_addr = p.stg + 1; /* the block's last byte falls outside */
        snprintf(what, sizeof what, "%s with the staging block past its allocation", op);
        dc_refused(&f, copy(d, f.s, &x), KVS_ERANGE, what);
        int64_t far[1] = {sh.pool_pages}; /* one page past every buffer */
        x = dc_desc(&p);
        x.pages = far;
        x.num_pages = 1;
        x.tokens = 1;
        snprintf(what, sizeof what, "%s of a page past the pool", op);
        dc_refused(&f, copy(d, f.s, &x), KVS_ERANGE, what);
    }
    dc_sync(&f);
    dc_pool_check(&f, &p, "refused copies", 0xDC04);
    dc_pool_free(&f, &p);
    dc_close(&f);
}

/* ---- events ------------------------------------------------------------------ */

static void dc_events(void **state)
{
    dc_fx_t f;
    dc_open(&f, state);
    kvs_device_t *d = f.dev;
    kvs_event_t *ev = NULL;
    dc_refused(&f, d->ops.event_record(d, f.s, NULL), KVS_EINVAL, "event_record into NULL");
    dc_refused(&f, d->ops.event_record(d, NULL, &ev), KVS_EINVAL,
               "event_record on a NULL stream");
    dc_refused(&f, d->ops.event_query(d, NULL), KVS_EINVAL, "event_query of NULL");
    /* On an empty stream: complete once waited for. */
    assert_int_equal(d->ops.event_record(d, f.s, &ev), KVS_OK);
    assert_non_null(ev);
    assert_int_equal(f.b->wait(f.ctx, d, ev), KVS_OK);
    assert_int_equal(d->ops.event_query(d, ev), KVS_OK);
    d->ops.event_destroy(d, ev);
    /* After a copy: complete means the copy's bytes are there. */
    uint64_t rng = 0xDC05;
    const dc_shape_t sh = dc_random_shape(&rng);
    dc_pool_t p;
    dc_pool_make(&f, &p, &sh, &rng);
    const kvs_copy_desc_t g = dc_desc(&p);
    kvs_stream_t *s2 = NULL;
    assert_int_equal(d->ops.stream_create(d, &s2), KVS_OK);
    assert_int_equal(d->ops.gather(d, s2, &g), KVS_OK);
    assert_int_equal(d->ops.event_record(d, s2, &ev), KVS_OK);
    const int q = d->ops.event_query(d, ev);
    assert_true(q == KVS_OK || q == KVS_EAGAIN);
    /* The event outlives its stream (destroy lets queued work finish). */
    d->ops.stream_destroy(d, s2);
    assert_int_equal(f.b->wait(f.ctx, d, ev), KVS_OK);
    d->ops.event_destroy(d, ev);
    dc_reference(&p, false);
    dc_pool_check(&f, &p, "gather, event, stream destroyed", 0xDC05);
    dc_pool_free(&f, &p);
    dc_close(&f);
}

/* ---- waiting on an fd -------------------------------------------------------- */

static void dc_wait_arm(void **state)
{
    dc_fx_t f;
    dc_open(&f, state);
    kvs_device_t *d = f.dev;
    int fd = -1;
    const int rc = d->ops.wait_arm(d, &fd);
    if (rc == KVS_ENOTSUP) { /* optional: a driver then wakes on a timer */
        dc_close(&f);
        return;
    }
    assert_int_equal(rc, KVS_OK);
    assert_true(fd >= 0);
    uint64_t rng = 0xDC06;
    const dc_shape_t sh = dc_random_shape(&rng);
    dc_pool_t p;
    dc_pool_make(&f, &p, &sh, &rng);
    /* Armed again right before the copy: its completion makes the fd
     * readable (bounded, so a lost wake-up fails instead of hanging). */
    int again = -1;
    assert_int_equal(d->ops.wait_arm(d, &again), KVS_OK);
    assert_int_equal(again, fd);
    const kvs_copy_desc_t g = dc_desc(&p);
    assert_int_equal(d->ops.gather(d, f.s, &g), KVS_OK);
    kvs_event_t *ev = NULL;
    assert_int_equal(d->ops.event_record(d, f.s, &ev), KVS_OK);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 60000), 1);
    assert_int_equal(f.b->wait(f.ctx, d, ev), KVS_OK);
    d->ops.event_destroy(d, ev);
    dc_pool_free(&f, &p);
    dc_close(&f);
}

int dc_run(const dc_backend_t *b)
{
    void *state = (void *)(uintptr_t)b;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(dc_memory, state),
        cmocka_unit_test_prestate(dc_copies_match_reference, state),
        cmocka_unit_test_prestate(dc_stream_runs_ops_in_order, state),
        cmocka_unit_test_prestate(dc_refused_descriptors_change_nothing, state),
        cmocka_unit_test_prestate(dc_events, state),
        cmocka_unit_test_prestate(dc_wait_arm, state),
    };
    char name[64];
    snprintf(name, sizeof name, "device contract on %s", b->name);
    return cmocka_run_group_tests_name(name, tests, NULL, NULL);
}
