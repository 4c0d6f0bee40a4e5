/*
 * test_host_device.c - unit tests of the host device backend (hw/host):
 * creation and its argument errors; memory (alignment, zero fill, bounds of
 * mem_read/mem_write, unknown frees, the bounded table); gather and scatter
 * checked byte for byte against a naive reference written here from the
 * words of backend.h, on random shapes and page lists and on copies large
 * enough to take the streaming-store path, aligned and not; descriptor
 * validation (same statuses and wording as the simulated GPU); stream
 * ordering through dependent ops on a tiny queue; events (complete on an
 * empty stream, after the ops before them, surviving their stream's
 * destroy); mem_free draining queued ops; bounded stream and event tables;
 * foreign streams, events and devices; two threads sharing one device;
 * destroy with ops queued and memory live; the wait fd (readable after a
 * completion once armed, one write per arm, nothing while not armed); and
 * byte-for-byte agreement with
 * the simulated GPU (sim/gpu.c) on random shapes (tests/fixtures/kv_compare.c, the
 * harness the CUDA checks use against this backend). Then the device
 * contract every backend meets (tests/fixtures/device_contract.c) on a host device.
 * Random data and shapes come from fixed seeds, printed on failure.
 */
#include <kvstage/host.h>

#include "device_contract.h"
#include "engine.h"
#include "gpu.h"
#include "kv_compare.h"

#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "xorshift.h"

/* ---- fixture ------------------------------------------------------------- */

typedef struct fx {
    kvs_host_device_t *host;
    kvs_device_t *dev;
    kvs_stream_t *s;
} fx_t;

static void fx_open(fx_t *f, const kvs_host_config_t *cfg)
{
    memset(f, 0, sizeof *f);
    kvs_error_t err;
    assert_int_equal(kvs_host_device_create(cfg, &f->host, &err), KVS_OK);
    f->dev = kvs_host_device(f->host);
    assert_non_null(f->dev);
    assert_int_equal(f->dev->ops.stream_create(f->dev, &f->s), KVS_OK);
}

static void fx_close(fx_t *f)
{
    f->dev->ops.stream_destroy(f->dev, f->s);
    kvs_host_device_destroy(f->host);
}

static uint64_t dev_alloc(fx_t *f, uint64_t len)
{
    uint64_t a = 0;
    assert_int_equal(f->dev->ops.mem_alloc(f->dev, len, &a), KVS_OK);
    return a;
}

static uint8_t *host_of(fx_t *f, uint64_t addr, uint64_t len)
{
    uint8_t *p = kvs_host_ptr(f->dev, addr, len);
    assert_non_null(p);
    return p;
}

/* Waits for everything queued on the fixture's stream, through an event. */
static void drain(fx_t *f)
{
    kvs_event_t *ev = NULL;
    assert_int_equal(f->dev->ops.event_record(f->dev, f->s, &ev), KVS_OK);
    assert_int_equal(kvs_host_event_wait(f->dev, ev), KVS_OK);
    assert_int_equal(f->dev->ops.event_query(f->dev, ev), KVS_OK);
    f->dev->ops.event_destroy(f->dev, ev);
}

/* ---- a KV pool and a staging block on the device ------------------------ */

#define MAX_LAYERS 6
#define MAX_PAGES 4096

typedef struct shape {
    int64_t page_size, tokens, local_heads, head_start, num_heads, head_dim, elem_bytes;
    int64_t pool_layers, layer_begin, layer_count, slots, slot_begin;
    int64_t pool_pages; /* pages in every layer buffer */
    int page_order;     /* 0 shuffled, 1 ascending (runs merge), 2 descending */
    int64_t scale_bytes; /* 0, or a scale buffer beside each K and V of this
                            many bytes a head (FP8 KV with scales) */
} shape_t;

typedef struct pool {
    uint64_t k[MAX_LAYERS], v[MAX_LAYERS];
    uint64_t ks[MAX_LAYERS], vs[MAX_LAYERS]; /* scale buffers (scale_bytes > 0) */
    uint64_t layer_bytes, scale_layer_bytes;
    uint64_t stg, stg_bytes;
    int64_t pages[MAX_PAGES];
    int64_t num_pages;
} pool_t;

static uint64_t head_bytes(const shape_t *sh)
{
    return (uint64_t)(sh->head_dim * sh->elem_bytes);
}

/* A staging slot: its KV rows, then their scale rows. */
static uint64_t slot_bytes(const shape_t *sh)
{
    return (uint64_t)(sh->tokens * sh->num_heads) * (head_bytes(sh) + (uint64_t)sh->scale_bytes);
}

static void pool_make(fx_t *f, const shape_t *sh, pool_t *p, uint64_t *rng)
{
    memset(p, 0, sizeof *p);
    assert_true(sh->pool_layers <= MAX_LAYERS && sh->pool_pages <= MAX_PAGES);
    p->layer_bytes = (uint64_t)(sh->pool_pages * sh->page_size * sh->local_heads) *
                     head_bytes(sh);
    for (int64_t l = 0; l < sh->pool_layers; l++) {
        p->k[l] = dev_alloc(f, p->layer_bytes);
        p->v[l] = dev_alloc(f, p->layer_bytes);
        xorshift_fill(host_of(f, p->k[l], p->layer_bytes), p->layer_bytes, rng);
        xorshift_fill(host_of(f, p->v[l], p->layer_bytes), p->layer_bytes, rng);
    }
    p->scale_layer_bytes =
        (uint64_t)(sh->pool_pages * sh->page_size * sh->local_heads * sh->scale_bytes);
    for (int64_t l = 0; sh->scale_bytes > 0 && l < sh->pool_layers; l++) {
        p->ks[l] = dev_alloc(f, p->scale_layer_bytes);
        p->vs[l] = dev_alloc(f, p->scale_layer_bytes);
        xorshift_fill(host_of(f, p->ks[l], p->scale_layer_bytes), p->scale_layer_bytes, rng);
        xorshift_fill(host_of(f, p->vs[l], p->scale_layer_bytes), p->scale_layer_bytes, rng);
    }
    p->stg_bytes = slot_bytes(sh) * (uint64_t)sh->slots * 2;
    p->stg = dev_alloc(f, p->stg_bytes > 0 ? p->stg_bytes : 1);
    xorshift_fill(host_of(f, p->stg, p->stg_bytes), p->stg_bytes, rng);
    p->num_pages = (sh->tokens + sh->page_size - 1) / sh->page_size;
    assert_true(p->num_pages <= sh->pool_pages);
    /* Distinct page ids: a random subset in the shape's order. */
    static int64_t perm[MAX_PAGES];
    for (int64_t i = 0; i < sh->pool_pages; i++)
        perm[i] = i;
    for (int64_t i = sh->pool_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)(xorshift64(rng) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < p->num_pages; i++)
        p->pages[i] = perm[i];
    if (sh->page_order != 0) {
        /* Sort the subset (insertion sort: small), then maybe reverse. */
        for (int64_t i = 1; i < p->num_pages; i++)
            for (int64_t j = i; j > 0 && p->pages[j - 1] > p->pages[j]; j--) {
                int64_t t = p->pages[j];
                p->pages[j] = p->pages[j - 1];
                p->pages[j - 1] = t;
            }
        if (sh->page_order == 2)
            for (int64_t i = 0; i < p->num_pages / 2; i++) {
                int64_t t = p->pages[i];
                p->pages[i] = p->pages[p->num_pages - 1 - i];
                p->pages[p->num_pages - 1 - i] = t;
            }
    }
}

static void pool_free(fx_t *f, const shape_t *sh, pool_t *p)
{
    for (int64_t l = 0; l < sh->pool_layers; l++) {
        assert_int_equal(f->dev->ops.mem_free(f->dev, p->k[l]), KVS_OK);
        assert_int_equal(f->dev->ops.mem_free(f->dev, p->v[l]), KVS_OK);
        if (sh->scale_bytes > 0) {
            assert_int_equal(f->dev->ops.mem_free(f->dev, p->ks[l]), KVS_OK);
            assert_int_equal(f->dev->ops.mem_free(f->dev, p->vs[l]), KVS_OK);
        }
    }
    assert_int_equal(f->dev->ops.mem_free(f->dev, p->stg), KVS_OK);
}

static kvs_copy_desc_t desc_of(const shape_t *sh, const pool_t *p)
{
    return (kvs_copy_desc_t){
        .k_base = p->k,
        .v_base = p->v,
        .local_heads = sh->local_heads,
        .head_dim = sh->head_dim,
        .elem_bytes = sh->elem_bytes,
        .page_size = sh->page_size,
        .pages = p->pages,
        .num_pages = p->num_pages,
        .tokens = sh->tokens,
        .head_start = sh->head_start,
        .num_heads = sh->num_heads,
        .layer_begin = sh->layer_begin,
        .layer_count = sh->layer_count,
        .staging_slot_begin = sh->slot_begin,
        .staging_layer_slots = sh->slots,
        .staging_addr = p->stg,
        .ks_base = sh->scale_bytes > 0 ? p->ks : NULL,
        .vs_base = sh->scale_bytes > 0 ? p->vs : NULL,
        .scale_bytes = sh->scale_bytes,
    };
}

/*
 * The naive reference, straight from backend.h: staging offset and pool
 * offset of (copy layer j, kv, token i, head h), one head's bytes each;
 * kv 2 and 3 are the scales of K and of V (scale_bytes a head, after the
 * slot's KV rows).
 */
static void ref_offsets(const shape_t *sh, const pool_t *p, int64_t j, int kv, int64_t i,
                        int64_t h, uint64_t *stg_off, uint64_t *pool_off)
{
    const bool scale = kv >= 2;
    const uint64_t hb = scale ? (uint64_t)sh->scale_bytes : head_bytes(sh);
    const int64_t slot = (kv % 2) * sh->slots + sh->slot_begin + j;
    *stg_off = (uint64_t)slot * slot_bytes(sh) +
               (scale ? (uint64_t)(sh->tokens * sh->num_heads) * head_bytes(sh) : 0) +
               (uint64_t)(i * sh->num_heads + h) * hb;
    const int64_t page = p->pages[i / sh->page_size];
    const int64_t tslot = page * sh->page_size + i % sh->page_size;
    *pool_off = (uint64_t)(tslot * sh->local_heads + sh->head_start + h) * hb;
}

/* Buffer kv (K, V, K scales, V scales) of pool layer l and its bytes. */
static uint64_t ref_buffer(const pool_t *p, int kv, int64_t l, uint64_t *len)
{
    *len = kv < 2 ? p->layer_bytes : p->scale_layer_bytes;
    return kv == 0 ? p->k[l] : kv == 1 ? p->v[l] : kv == 2 ? p->ks[l] : p->vs[l];
}

/* Gather from pool A and compare the staging block with the reference (the
 * bytes before, copied slots replaced); then scatter that block into pool B
 * and compare every B buffer with its bytes before, the copied heads
 * replaced. */
static void round_trip_planes(const shape_t *sh, uint64_t seed, const kvs_host_config_t *cfg,
                              int planes)
{
    fx_t f;
    fx_open(&f, cfg);
    uint64_t rng = seed;
    pool_t a, b;
    pool_make(&f, sh, &a, &rng);
    pool_make(&f, sh, &b, &rng);
    memcpy(b.pages, a.pages, sizeof b.pages); /* same page ids, other buffers */
    const int buffers = sh->scale_bytes > 0 ? 4 : 2; /* K, V and their scales */

    uint8_t *want = malloc(a.stg_bytes + 1);
    assert_non_null(want);
    memcpy(want, host_of(&f, a.stg, a.stg_bytes), a.stg_bytes);
    kvs_copy_desc_t d = desc_of(sh, &a);
    d.planes = planes;
    if (planes == 1) {
        d.v_base = NULL; /* one plane: V is never read, its half of staging stays */
        d.vs_base = NULL;
    }
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    drain(&f);
    for (int64_t j = 0; j < sh->layer_count; j++)
        for (int kv = 0; kv < buffers; kv++) {
            if (kv % 2 >= planes)
                continue; /* V (or its scales) with one plane */
            const int64_t l = sh->layer_begin + j;
            uint64_t len;
            const uint64_t buf = ref_buffer(&a, kv, l, &len);
            const uint8_t *pool = host_of(&f, buf, len);
            const uint64_t hb = kv < 2 ? head_bytes(sh) : (uint64_t)sh->scale_bytes;
            for (int64_t i = 0; i < sh->tokens; i++)
                for (int64_t h = 0; h < sh->num_heads; h++) {
                    uint64_t so, po;
                    ref_offsets(sh, &a, j, kv, i, h, &so, &po);
                    memcpy(want + so, pool + po, hb);
                }
        }
    if (memcmp(host_of(&f, a.stg, a.stg_bytes), want, a.stg_bytes) != 0)
        fail_msg("gather differs from the reference (seed %llu)", (unsigned long long)seed);

    kvs_copy_desc_t ds = desc_of(sh, &b);
    ds.staging_addr = a.stg;
    ds.planes = planes;
    if (planes == 1) {
        ds.v_base = NULL;
        ds.vs_base = NULL;
    }
    uint8_t *before[4][MAX_LAYERS];
    for (int64_t l = 0; l < sh->pool_layers; l++)
        for (int kv = 0; kv < buffers; kv++) {
            uint64_t len;
            const uint64_t buf = ref_buffer(&b, kv, l, &len);
            before[kv][l] = malloc(len + 1);
            assert_non_null(before[kv][l]);
            memcpy(before[kv][l], host_of(&f, buf, len), len);
        }
    assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &ds), KVS_OK);
    drain(&f);
    const uint8_t *stg = host_of(&f, a.stg, a.stg_bytes);
    static const char *const names[] = {"K", "V", "K scales", "V scales"};
    for (int64_t l = 0; l < sh->pool_layers; l++)
        for (int kv = 0; kv < buffers; kv++) {
            uint8_t *exp = before[kv][l];
            const int64_t j = l - sh->layer_begin;
            const uint64_t hb = kv < 2 ? head_bytes(sh) : (uint64_t)sh->scale_bytes;
            if (j >= 0 && j < sh->layer_count && kv % 2 < planes) /* V untouched with one */
                for (int64_t i = 0; i < sh->tokens; i++)
                    for (int64_t h = 0; h < sh->num_heads; h++) {
                        uint64_t so, po;
                        ref_offsets(sh, &b, j, kv, i, h, &so, &po);
                        memcpy(exp + po, stg + so, hb);
                    }
            uint64_t len;
            const uint64_t buf = ref_buffer(&b, kv, l, &len);
            if (memcmp(host_of(&f, buf, len), exp, len) != 0)
                fail_msg("scatter into %s of layer %lld differs from the reference "
                         "(seed %llu)",
                         names[kv], (long long)l, (unsigned long long)seed);
            free(exp);
        }
    free(want);
    pool_free(&f, sh, &a);
    pool_free(&f, sh, &b);
    fx_close(&f);
}

static void round_trip_on(const shape_t *sh, uint64_t seed, const kvs_host_config_t *cfg)
{
    round_trip_planes(sh, seed, cfg, 2);
}

static void round_trip(const shape_t *sh, uint64_t seed) { round_trip_on(sh, seed, NULL); }

static shape_t random_shape(uint64_t *rng)
{
    static const int64_t page_sizes[] = {1, 2, 3, 4, 16};
    static const int64_t head_dims[] = {1, 3, 8, 36, 64, 128};
    static const int64_t elems[] = {1, 2, 4};
    shape_t s;
    memset(&s, 0, sizeof s);
    s.page_size = page_sizes[xorshift_range(rng, 0, 4)];
    s.head_dim = head_dims[xorshift_range(rng, 0, 5)];
    s.elem_bytes = elems[xorshift_range(rng, 0, 2)];
    s.local_heads = xorshift_range(rng, 1, 8);
    s.num_heads = xorshift_range(rng, 1, s.local_heads);
    s.head_start = xorshift_range(rng, 0, s.local_heads - s.num_heads);
    s.pool_pages = xorshift_range(rng, 1, 40);
    s.tokens = xorshift_range(rng, 0, s.pool_pages * s.page_size);
    s.pool_layers = xorshift_range(rng, 1, 4);
    s.layer_begin = xorshift_range(rng, 0, s.pool_layers - 1);
    s.layer_count = xorshift_range(rng, 0, s.pool_layers - s.layer_begin);
    s.slot_begin = xorshift_range(rng, 0, 2);
    s.slots = s.slot_begin + s.layer_count + xorshift_range(rng, 0, 2);
    s.page_order = (int)xorshift_range(rng, 0, 2);
    return s;
}

/* ---- tests --------------------------------------------------------------- */

static void test_host_device_create_arguments(void **state)
{
    kvs_host_device_t *h = NULL;
    kvs_error_t err;
    assert_int_equal(kvs_host_device_create(NULL, NULL, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "out is NULL"));
    assert_int_equal(err.status, KVS_EINVAL);
    assert_int_equal(kvs_host_device_create(NULL, NULL, NULL), KVS_EINVAL);
    kvs_host_config_t cfg = {.name = "a-name-that-is-far-too-long-for-the-device"};
    assert_int_equal(kvs_host_device_create(&cfg, &h, &err), KVS_EINVAL);
    assert_null(h);
    assert_non_null(strstr(err.msg, "shorter name"));

    cfg.name = "host7";
    assert_int_equal(kvs_host_device_create(&cfg, &h, &err), KVS_OK);
    kvs_device_t *dev = kvs_host_device(h);
    assert_string_equal(dev->name, "host7");
    assert_string_equal(dev->ops.name, "host");
    assert_ptr_equal(kvs_host_device_from(dev), h);
    kvs_host_device_destroy(h);
    kvs_host_device_destroy(NULL);
    assert_null(kvs_host_device(NULL));
    assert_null(kvs_host_device_from(NULL));
}

static void test_host_device_memory_alloc_free_bounds(void **state)
{
    fx_t f;
    kvs_host_config_t cfg = {.max_allocs = 3};
    fx_open(&f, &cfg);
    const uint64_t small = dev_alloc(&f, 100);
    const uint64_t huge = dev_alloc(&f, (2u << 20) + 5);
    assert_int_equal(small % 4096, 0);
    assert_int_equal(huge % (2u << 20), 0);
    const uint8_t *p = host_of(&f, huge, (2u << 20) + 5);
    for (uint64_t i = 0; i < (2u << 20) + 5; i += 4093)
        assert_int_equal(p[i], 0);
    assert_int_equal(host_of(&f, small, 100)[99], 0);

    uint8_t buf[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, back[16];
    assert_int_equal(f.dev->ops.mem_write(f.dev, small + 84, buf, 16), KVS_OK);
    assert_int_equal(f.dev->ops.mem_read(f.dev, small + 84, back, 16), KVS_OK);
    assert_memory_equal(buf, back, 16);
    assert_int_equal(f.dev->ops.mem_write(f.dev, small + 85, buf, 16), KVS_ERANGE);
    assert_non_null(strstr(f.dev->last_backend_msg, "not inside one live allocation"));
    assert_int_equal(f.dev->ops.mem_read(f.dev, small + 100, back, 1), KVS_ERANGE);
    assert_int_equal(f.dev->ops.mem_read(f.dev, small, NULL, 1), KVS_EINVAL);
    assert_int_equal(f.dev->ops.mem_write(f.dev, small + 100, NULL, 0), KVS_OK);
    assert_null(kvs_host_ptr(f.dev, small, 101));
    assert_non_null(kvs_host_ptr(f.dev, small + 100, 0));

    uint64_t a = 0;
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, 0, &a), KVS_EINVAL);
    assert_non_null(strstr(f.dev->last_backend_msg, "at least one byte"));
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, 8, NULL), KVS_EINVAL);
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, UINT64_MAX, &a), KVS_ERANGE);
    const uint64_t third = dev_alloc(&f, 1);
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, 8, &a), KVS_EFULL);
    assert_non_null(strstr(f.dev->last_backend_msg, "raise max_allocs"));

    assert_int_equal(f.dev->ops.mem_free(f.dev, small + 1), KVS_ENOENT);
    assert_non_null(strstr(f.dev->last_backend_msg, "not the start of a live allocation"));
    assert_int_equal(f.dev->ops.mem_free(f.dev, small), KVS_OK);
    assert_int_equal(f.dev->ops.mem_free(f.dev, small), KVS_ENOENT);
    assert_null(kvs_host_ptr(f.dev, small, 1));
    assert_int_equal(f.dev->ops.mem_free(f.dev, third), KVS_OK);
    assert_int_equal(f.dev->ops.mem_free(f.dev, huge), KVS_OK);
    fx_close(&f);
}

static void test_host_device_gather_scatter_fixed_shapes(void **state)
{
    /* page, tokens, local, start, num, dim, elem, pool layers, begin, count,
     * slots, slot begin, pool pages, order */
    const shape_t shapes[] = {
        {16, 40, 4, 1, 2, 64, 2, 3, 1, 2, 3, 1, 8, 0, 0},  /* strided, partial page */
        {16, 64, 2, 0, 2, 128, 2, 2, 0, 2, 2, 0, 8, 1, 0}, /* whole rows, runs merge */
        {16, 48, 2, 0, 2, 128, 2, 2, 0, 2, 2, 0, 8, 2, 0}, /* whole rows, descending */
        {4, 13, 1, 0, 1, 3, 1, 1, 0, 1, 1, 0, 5, 1, 0},    /* 3-byte rows */
        {1, 7, 8, 7, 1, 1, 4, 2, 1, 1, 4, 2, 9, 0, 0},     /* page of one token */
        {16, 0, 4, 0, 4, 8, 2, 2, 0, 2, 2, 0, 2, 0, 0},    /* no tokens */
        {16, 32, 4, 0, 4, 8, 2, 2, 0, 0, 2, 0, 2, 0, 0},   /* no layers */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        round_trip(&shapes[i], 0x1234 + i);
}

static void test_host_device_gather_scatter_random_shapes(void **state)
{
    uint64_t rng = 0xC0FFEE;
    for (int i = 0; i < 60; i++) {
        const uint64_t seed = xorshift64(&rng);
        uint64_t r = seed;
        shape_t sh = random_shape(&r);
        round_trip(&sh, seed);
    }
}

/* MLA's layers: one plane (planes 1), so the copies move K alone; the
 * pools' V buffers and the V half of the staging block must stay as they
 * were. Random shapes, and one of whole 576-element bf16 latents. */
static void test_host_device_one_plane_copies(void **state)
{
    uint64_t rng = 0x3A1A;
    for (int i = 0; i < 30; i++) {
        const uint64_t seed = xorshift64(&rng);
        uint64_t r = seed;
        shape_t sh = random_shape(&r);
        round_trip_planes(&sh, seed, NULL, 1);
    }
    /* page size, tokens, local heads, head start, heads, head dim, elem,
     * pool layers, layer begin, count, slots, slot begin, pool pages, order */
    const shape_t latent = {16, 100, 1, 0, 1, 576, 2, 3, 0, 3, 3, 0, 12, 0, 0};
    round_trip_planes(&latent, 0x576, NULL, 1);
}

/* FP8 KV with scale planes: the copies move each copied head's scales
 * (per-token fp32: 4 bytes; MXFP8 e8m0 per 32 elements: head_dim / 32)
 * with its rows, into the slot's scale rows, and touch no other scale.
 * Random shapes with 1..8 bytes of scales a head, with two planes and one,
 * and the engine's shapes: a P8->D2 decode taking 1 of 4 heads, whole
 * rows (page runs), and MXFP8 of head 128. */
static void test_host_device_scale_plane_copies(void **state)
{
    uint64_t rng = 0x5CA1E;
    for (int i = 0; i < 40; i++) {
        const uint64_t seed = xorshift64(&rng);
        uint64_t r = seed;
        shape_t sh = random_shape(&r);
        sh.scale_bytes = 1 + (int64_t)(xorshift64(&r) % 8);
        round_trip_planes(&sh, seed, NULL, i % 3 == 2 ? 1 : 2);
    }
    /* page, tokens, local, start, num, dim, elem, pool layers, begin, count,
     * slots, slot begin, pool pages, order, scale bytes */
    const shape_t shapes[] = {
        {16, 100, 4, 1, 1, 128, 1, 2, 0, 2, 2, 0, 12, 0, 4}, /* per-token, 1 of 4 heads */
        {16, 64, 2, 0, 2, 128, 1, 2, 0, 2, 2, 0, 8, 1, 4},   /* whole rows: page runs */
        {16, 40, 4, 2, 2, 128, 1, 3, 1, 2, 3, 1, 8, 2, 4},   /* MXFP8 head 128, 2 heads */
        {16, 33, 1, 0, 1, 576, 1, 2, 0, 2, 2, 0, 4, 0, 18},  /* MXFP8 latent, 576 / 32 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        round_trip_planes(&shapes[i], 0x5C0 + i, NULL, i == 3 ? 1 : 2);
    /* Streamed copies (4 MiB and up) take the same scale rows. */
    kvs_host_config_t cfg = {0};
    cfg.copy_threads = 2;
    const shape_t big = {64, 4096, 8, 0, 8, 128, 1, 2, 0, 2, 2, 0, 64, 1, 4};
    round_trip_planes(&big, 0x5CB, &cfg, 2);
}

static void test_host_device_gather_scatter_streaming_path(void **state)
{
    /* Over 4 MiB of payload: copies take the streaming-store path.
     * Pages of three 216-byte rows are 648-byte runs: a tail of 8 bytes
     * after the last full line, and every other run starts at a staging
     * offset only 8-byte aligned, so both store paths run in one copy.
     * Strided rows of 256 bytes stream every row; rows of 72 and 96 bytes
     * stream a line and copy the tail, or fall back to memcpy where the
     * row's start is not aligned for the widest stores. */
    const shape_t shapes[] = {
        {16, 4096, 4, 1, 1, 128, 2, 2, 0, 2, 2, 0, 260, 0, 0}, /* strided: rows path */
        {4, 16000, 3, 1, 1, 36, 2, 2, 0, 2, 2, 0, 4096, 0, 0},
        {16, 12000, 4, 2, 1, 48, 2, 2, 0, 2, 2, 0, 800, 0, 0},
        {16, 4096, 1, 0, 1, 128, 2, 2, 0, 2, 2, 0, 260, 1, 0},
        {3, 6000, 3, 0, 3, 36, 2, 2, 0, 2, 2, 0, 2100, 0, 0},
        {3, 6000, 3, 0, 3, 36, 2, 2, 0, 2, 2, 0, 2100, 1, 0},
    };
    /* Each streaming kernel this CPU runs: 16-, 32- and 64-byte stores
     * (the widest one the CPU lacks falls back to the next). */
    const uint32_t widths[] = {0, 16, 32, 64};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        const kvs_host_config_t cfg = {.max_vector_bytes = widths[w]};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            round_trip_on(&shapes[i], 0xB16 + i + 16 * w, &cfg);
    }
    kvs_host_config_t bad = {.max_vector_bytes = 24};
    kvs_host_device_t *h = NULL;
    kvs_error_t err;
    assert_int_equal(kvs_host_device_create(&bad, &h, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "max_vector_bytes must be 16, 32, 64 or 0"));
    assert_null(h);
}

/* Large ops split between the worker and helpers: 3 threads share the
 * layers (uneven: 8 or 4 buffers in 3 shares), 5 threads more shares than
 * a 2-buffer op has. */
static void test_host_device_copy_threads_split_ops(void **state)
{
    const shape_t shapes[] = {
        {16, 4096, 4, 1, 1, 128, 2, 4, 0, 4, 4, 0, 260, 0, 0},
        {3, 6000, 3, 0, 3, 36, 2, 2, 0, 2, 2, 0, 2100, 1, 0},
        {16, 2048, 2, 0, 2, 128, 2, 1, 0, 1, 1, 0, 130, 0, 0},
    };
    const kvs_host_config_t three = {.copy_threads = 3}, five = {.copy_threads = 5};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        round_trip_on(&shapes[i], 0x3D + i, &three);
        round_trip_on(&shapes[i], 0x5D + i, &five);
    }
    kvs_host_config_t bad = {.copy_threads = 257};
    kvs_host_device_t *h = NULL;
    kvs_error_t err;
    assert_int_equal(kvs_host_device_create(&bad, &h, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "copy_threads"));
    assert_null(h);
}

static void expect_bad(fx_t *f, const kvs_copy_desc_t *d, int code, const char *needle)
{
    f->dev->last_backend_msg[0] = '\0';
    assert_int_equal(f->dev->ops.gather(f->dev, f->s, d), code);
    if (strstr(f->dev->last_backend_msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", f->dev->last_backend_msg, needle);
    f->dev->last_backend_msg[0] = '\0';
    assert_int_equal(f->dev->ops.scatter(f->dev, f->s, d), code);
    if (strstr(f->dev->last_backend_msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", f->dev->last_backend_msg, needle);
}

static void test_host_device_descriptor_validation(void **state)
{
    fx_t f;
    fx_open(&f, NULL);
    const shape_t sh = {4, 8, 4, 1, 2, 4, 2, 3, 1, 2, 3, 1, 4, 0, 0};
    uint64_t rng = 16;
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    const kvs_copy_desc_t good = desc_of(&sh, &p);
    kvs_copy_desc_t d;

    assert_int_equal(f.dev->ops.gather(f.dev, NULL, &good), KVS_EINVAL);
    assert_non_null(strstr(f.dev->last_backend_msg, "stream is NULL"));
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, NULL), KVS_EINVAL);
    assert_non_null(strstr(f.dev->last_backend_msg, "descriptor is NULL"));

#define BAD(field, value, code, needle)                                        \
    do {                                                                       \
        d = good;                                                              \
        d.field = (value);                                                     \
        expect_bad(&f, &d, (code), (needle));                                  \
    } while (0)
    BAD(head_dim, 0, KVS_EINVAL, "head_dim 0");
    BAD(elem_bytes, -2, KVS_EINVAL, "elem_bytes -2");
    BAD(page_size, 0, KVS_EINVAL, "page_size 0");
    BAD(local_heads, 0, KVS_EINVAL, "local_heads 0");
    BAD(tokens, -1, KVS_EINVAL, "tokens -1");
    BAD(layer_count, -1, KVS_EINVAL, "layer_count -1");
    BAD(num_heads, 0, KVS_ERANGE, "local heads");
    BAD(head_start, 3, KVS_ERANGE, "heads [3, +2)");
    BAD(head_start, -1, KVS_ERANGE, "heads [-1, +2)");
    BAD(num_heads, 5, KVS_ERANGE, "heads [1, +5)");
    BAD(tokens, 9, KVS_ERANGE, "9 tokens do not fit in 2 pages");
    BAD(num_pages, 1, KVS_ERANGE, "do not fit");
    BAD(layer_count, 3, KVS_ERANGE, "layer slots [1, +3)");
    BAD(staging_slot_begin, 2, KVS_ERANGE, "layer slots [2, +2)");
    BAD(staging_layer_slots, 2, KVS_ERANGE, "outside the 2 slots");
    BAD(layer_begin, 2, KVS_ERANGE, "buffer of local layer 3");
    BAD(layer_begin, INT64_MAX, KVS_ERANGE, "overflows");
    BAD(staging_addr, p.stg + 256, KVS_ERANGE, "staging block");
    BAD(staging_addr, p.k[0], KVS_ERANGE, "staging block");
    BAD(k_base, NULL, KVS_EINVAL, "k_base or v_base is NULL");
    BAD(pages, NULL, KVS_EINVAL, "pages is NULL");
    BAD(head_dim, INT64_MAX / 2, KVS_ERANGE, "overflow");
    /* The staging block must hold all S slots, not just those written. */
    BAD(staging_layer_slots, 5, KVS_ERANGE, "staging block");

    /* A page id past the layer buffers, a negative one, an absurd one. */
    int64_t pages[2] = {p.pages[0], sh.pool_pages};
    BAD(pages, pages, KVS_ERANGE, "K buffer of local layer 1");
    pages[1] = -1;
    BAD(pages, pages, KVS_ERANGE, "page id -1");
    pages[1] = INT64_MAX / 2;
    BAD(pages, pages, KVS_ERANGE, "page id");

    /* A layer base in no allocation, then a freed layer buffer. */
    uint64_t vb[MAX_LAYERS];
    memcpy(vb, p.v, sizeof vb);
    vb[2] = p.stg + (1ull << 40);
    BAD(v_base, vb, KVS_ERANGE, "V buffer of local layer 2");
    assert_int_equal(f.dev->ops.mem_free(f.dev, p.k[1]), KVS_OK);
    expect_bad(&f, &good, KVS_ERANGE, "K buffer of local layer 1");
#undef BAD
    /* Nothing refused was queued: the stream is idle. */
    drain(&f);
    fx_close(&f);
}

/* Chains ops that each read what the previous one wrote, on a queue of two
 * slots so most enqueues wait for room: only in-order execution gives the
 * expected bytes. */
static void ordered_chain(const kvs_host_config_t *cfg, const shape_t *shp, int rounds)
{
    fx_t f;
    fx_open(&f, cfg);
    const shape_t sh = *shp;
    uint64_t rng = 77;
    pool_t a, b;
    pool_make(&f, &sh, &a, &rng);
    pool_make(&f, &sh, &b, &rng);
    memcpy(b.pages, a.pages, sizeof b.pages);
    /* Each round moves head 1 of A into B's head 1 (gather A, scatter into
     * B), then from there into A's head 0 (gather B, scatter into A). */
    kvs_copy_desc_t ga = desc_of(&sh, &a), sb = desc_of(&sh, &b), gb = desc_of(&sh, &b);
    kvs_copy_desc_t sa = desc_of(&sh, &a);
    sb.staging_addr = a.stg;
    gb.staging_addr = b.stg;
    sa.staging_addr = b.stg;
    sa.head_start = 0;
    const uint64_t hb = head_bytes(&sh);
    uint8_t *ka = host_of(&f, a.k[0], a.layer_bytes);
    for (int r = 0; r < rounds; r++) {
        /* Expected: A's head 0 takes A's head 1 of this round, for the
         * tokens copied. */
        uint8_t *want = malloc(a.layer_bytes);
        assert_non_null(want);
        assert_int_equal(f.dev->ops.gather(f.dev, f.s, &ga), KVS_OK);
        assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &sb), KVS_OK);
        assert_int_equal(f.dev->ops.gather(f.dev, f.s, &gb), KVS_OK);
        /* Compute the expectation while the ops may run: A is only written
         * by the fourth op, which is not queued yet. */
        memcpy(want, ka, a.layer_bytes);
        for (int64_t i = 0; i < sh.tokens; i++) {
            int64_t slot = a.pages[i / sh.page_size] * sh.page_size + i % sh.page_size;
            memcpy(want + (uint64_t)(slot * 2) * hb, ka + (uint64_t)(slot * 2 + 1) * hb, hb);
        }
        assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &sa), KVS_OK);
        drain(&f);
        assert_memory_equal(ka, want, a.layer_bytes);
        free(want);
        /* New data in head 1 for the next round. */
        xorshift_fill(ka, a.layer_bytes, &rng);
    }
    pool_free(&f, &sh, &a);
    pool_free(&f, &sh, &b);
    fx_close(&f);
}

static void test_host_device_stream_runs_ops_in_order(void **state)
{
    const kvs_host_config_t cfg = {.queue_ops = 2};
    const shape_t sh = {4, 24, 2, 1, 1, 8, 2, 1, 0, 1, 1, 0, 8, 0, 0};
    ordered_chain(&cfg, &sh, 20);
    /* Ops large enough to be split between three threads. */
    const kvs_host_config_t split = {.queue_ops = 2, .copy_threads = 3};
    const shape_t big = {16, 8192, 2, 1, 1, 64, 2, 1, 0, 1, 1, 0, 1024, 0, 0};
    ordered_chain(&split, &big, 4);
}

static void test_host_device_events(void **state)
{
    fx_t f;
    kvs_host_config_t cfg = {.max_events = 2};
    fx_open(&f, &cfg);
    kvs_event_t *e1 = NULL, *e2 = NULL, *e3 = NULL;
    /* Nothing queued: complete at once. */
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &e1), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, e1), KVS_OK);

    /* After a copy: pending or done, done once waited for, with the bytes. */
    const shape_t sh = {16, 2048, 4, 1, 1, 128, 2, 2, 0, 2, 2, 0, 200, 0, 0};
    uint64_t rng = 5;
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &e2), KVS_OK);
    int rc = f.dev->ops.event_query(f.dev, e2);
    assert_true(rc == KVS_OK || rc == KVS_EAGAIN);
    /* The table holds two events. */
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &e3), KVS_EFULL);
    assert_non_null(strstr(f.dev->last_backend_msg, "raise max_events"));
    assert_int_equal(kvs_host_event_wait(f.dev, e2), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, e2), KVS_OK);
    uint64_t so, po;
    ref_offsets(&sh, &p, 1, 1, 2047, 0, &so, &po);
    assert_memory_equal(host_of(&f, p.stg, p.stg_bytes) + so,
                        host_of(&f, p.v[1], p.layer_bytes) + po, head_bytes(&sh));

    /* Bad arguments. */
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, NULL), KVS_EINVAL);
    assert_int_equal(f.dev->ops.event_record(f.dev, NULL, &e3), KVS_EINVAL);
    f.dev->ops.event_destroy(f.dev, e1);
    assert_int_equal(f.dev->ops.event_query(f.dev, e1), KVS_EINVAL);
    assert_non_null(strstr(f.dev->last_backend_msg, "event is NULL, destroyed"));
    assert_int_equal(kvs_host_event_wait(f.dev, e1), KVS_EINVAL);
    assert_int_equal(f.dev->ops.event_query(f.dev, NULL), KVS_EINVAL);
    f.dev->ops.event_destroy(f.dev, NULL);
    f.dev->ops.event_destroy(f.dev, e1); /* twice: refused, recorded */
    assert_non_null(strstr(f.dev->last_backend_msg, "event_destroy"));

    /* An event outlives its stream; the slot's next life keeps it done. */
    kvs_stream_t *s2 = NULL;
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s2), KVS_OK);
    assert_int_equal(f.dev->ops.gather(f.dev, s2, &d), KVS_OK);
    assert_int_equal(f.dev->ops.event_record(f.dev, s2, &e1), KVS_OK);
    f.dev->ops.stream_destroy(f.dev, s2); /* runs what was queued first */
    assert_int_equal(f.dev->ops.event_query(f.dev, e1), KVS_OK);
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s2), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, e1), KVS_OK);
    f.dev->ops.stream_destroy(f.dev, s2);
    f.dev->ops.event_destroy(f.dev, e1);
    f.dev->ops.event_destroy(f.dev, e2);
    pool_free(&f, &sh, &p);
    fx_close(&f);
}

/* Whether fd is readable now (no waiting). */
static bool readable_now(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    const int r = poll(&pfd, 1, 0);
    assert_true(r >= 0);
    return r == 1 && (pfd.revents & POLLIN);
}

static void test_host_device_wait_fd_signals_completions(void **state)
{
    fx_t f;
    fx_open(&f, NULL);
    const shape_t sh = {16, 2048, 4, 1, 1, 128, 2, 2, 0, 2, 2, 0, 200, 0, 0};
    uint64_t rng = 11;
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    int fd = -1, again = -1;
    assert_int_equal(f.dev->ops.wait_arm(f.dev, NULL), KVS_EINVAL);
    assert_non_null(strstr(f.dev->last_backend_msg, "out_fd is NULL"));

    /* Not armed: completions write nothing. */
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(kvs_host_stream_sync(f.dev, f.s), KVS_OK);
    assert_int_equal(f.dev->ops.wait_arm(f.dev, &fd), KVS_OK);
    assert_true(fd >= 0);
    assert_false(readable_now(fd));

    /* Armed: the op's completion makes it readable; the event after the
     * op is complete by then. A blocking poll, bounded so a lost wake-up
     * fails instead of hanging. */
    kvs_event_t *ev = NULL;
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &ev), KVS_OK);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 60000), 1);
    assert_int_equal(kvs_host_stream_sync(f.dev, f.s), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, ev), KVS_OK);
    f.dev->ops.event_destroy(f.dev, ev);

    /* The next arm consumes it; the fd is the same. */
    assert_int_equal(f.dev->ops.wait_arm(f.dev, &again), KVS_OK);
    assert_int_equal(again, fd);
    assert_false(readable_now(fd));

    /* Many completions after one arm: one write. */
    for (int i = 0; i < 5; i++)
        assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(kvs_host_stream_sync(f.dev, f.s), KVS_OK);
    uint64_t count = 0;
    assert_int_equal(read(fd, &count, sizeof count), (ssize_t)sizeof count);
    assert_int_equal(count, 1);
    pool_free(&f, &sh, &p);
    fx_close(&f);
}

/* An engine's KV pool (memory the application allocated) gathered from
 * once attached, refused before and after, never freed by the device:
 * not by mem_free, not when the device is destroyed with it attached. */
static void test_host_device_attached_memory(void **state)
{
    (void)state;
    fx_t f;
    fx_open(&f, NULL);
    enum { PS = 4, HEADS = 2, DIM = 4, ELEM = 2, PAGES = 3 };
    const uint64_t page_bytes = PS * HEADS * DIM * ELEM, layer = PAGES * page_bytes;
    uint8_t *kv = malloc(2 * layer); /* K then V of one layer */
    assert_non_null(kv);
    for (uint64_t i = 0; i < 2 * layer; i++)
        kv[i] = (uint8_t)(i * 7 + 3);
    const uint64_t k = (uint64_t)(uintptr_t)kv, v = k + layer;
    const int64_t pages[] = {1};
    const uint64_t stg = dev_alloc(&f, 2 * page_bytes);
    kvs_copy_desc_t d = {.k_base = &k, .v_base = &v, .local_heads = HEADS, .head_dim = DIM,
                         .elem_bytes = ELEM, .page_size = PS, .pages = pages, .num_pages = 1,
                         .tokens = PS, .head_start = 0, .num_heads = HEADS,
                         .layer_begin = 0, .layer_count = 1, .staging_slot_begin = 0,
                         .staging_layer_slots = 1, .staging_addr = stg};
    /* Not attached: the copy is refused before it runs. */
    assert_int_not_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);

    kvs_error_t err;
    assert_int_equal(kvs_host_mem_attach(f.dev, kv, 2 * layer, &err), KVS_OK);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    drain(&f);
    const uint8_t *out = host_of(&f, stg, 2 * page_bytes);
    assert_memory_equal(out, kv + page_bytes, page_bytes);                 /* K page 1 */
    assert_memory_equal(out + page_bytes, kv + layer + page_bytes, page_bytes); /* V */
    assert_ptr_equal(kvs_host_ptr(f.dev, k + 5, 10), kv + 5);

    /* Refusals name what to do, and change nothing. */
    assert_int_equal(kvs_host_mem_attach(f.dev, kv + 8, 16, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "overlaps the live attached range"));
    assert_int_equal(kvs_host_mem_attach(f.dev, kv, 0, &err), KVS_EINVAL);
    assert_int_equal(f.dev->ops.mem_free(f.dev, k), KVS_EINVAL);
    assert_non_null(strstr(f.dev->last_backend_msg, "detach it instead"));
    assert_int_equal(kvs_host_mem_detach(f.dev, kv + 1, &err), KVS_ENOENT);
    assert_non_null(strstr(err.msg, "is not the start of an attached range"));
    assert_int_equal(kvs_host_mem_detach(f.dev, (void *)(uintptr_t)stg, &err), KVS_ENOENT);
    assert_int_equal(kvs_host_mem_attach(NULL, kv, 1, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "not a host device"));

    /* Detached: copies refuse it again. */
    assert_int_equal(kvs_host_mem_detach(f.dev, kv, &err), KVS_OK);
    assert_int_not_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_null(kvs_host_ptr(f.dev, k, 1));

    /* Attached at destroy: the device leaves it to its owner. */
    assert_int_equal(kvs_host_mem_attach(f.dev, kv, 2 * layer, NULL), KVS_OK);
    fx_close(&f);
    memset(kv, 0, 2 * layer); /* still ours, still mapped */
    free(kv);
}

static void test_host_device_mem_free_drains_streams(void **state)
{
    fx_t f;
    fx_open(&f, NULL);
    const shape_t sh = {16, 2048, 4, 1, 2, 128, 2, 2, 0, 2, 2, 0, 256, 0, 0};
    uint64_t rng = 9;
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    const uint64_t other = dev_alloc(&f, 64);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    kvs_event_t *ev = NULL;
    for (int i = 0; i < 4; i++)
        assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &ev), KVS_OK);
    /* Like cudaFree: waits for queued work, whatever memory it touches. */
    assert_int_equal(f.dev->ops.mem_free(f.dev, other), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, ev), KVS_OK);
    f.dev->ops.event_destroy(f.dev, ev);
    assert_int_equal(kvs_host_stream_sync(f.dev, f.s), KVS_OK);
    pool_free(&f, &sh, &p);
    fx_close(&f);
}

static void test_host_device_stream_table_and_foreign_objects(void **state)
{
    fx_t f, g;
    kvs_host_config_t cfg = {.max_streams = 2};
    fx_open(&f, &cfg);
    fx_open(&g, NULL);
    kvs_stream_t *s2 = NULL, *s3 = NULL;
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s2), KVS_OK);
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s3), KVS_EFULL);
    assert_non_null(strstr(f.dev->last_backend_msg, "raise max_streams"));
    assert_int_equal(f.dev->ops.stream_create(f.dev, NULL), KVS_EINVAL);
    f.dev->ops.stream_destroy(f.dev, s2);
    f.dev->ops.stream_destroy(f.dev, s2); /* twice: refused, recorded */
    assert_non_null(strstr(f.dev->last_backend_msg, "already destroyed"));
    f.dev->ops.stream_destroy(f.dev, NULL);
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s2), KVS_OK);

    /* Streams and events of another device are refused. */
    const shape_t sh = {4, 8, 2, 0, 1, 4, 2, 1, 0, 1, 1, 0, 4, 0, 0};
    uint64_t rng = 3;
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    assert_int_equal(f.dev->ops.gather(f.dev, g.s, &d), KVS_EINVAL);
    assert_non_null(strstr(f.dev->last_backend_msg, "of another device"));
    assert_int_equal(f.dev->ops.gather(f.dev, s2, &d), KVS_OK);
    /* The descriptor's memory belongs to f, not g. */
    assert_int_equal(g.dev->ops.gather(g.dev, g.s, &d), KVS_ERANGE);
    kvs_event_t *ev = NULL;
    assert_int_equal(g.dev->ops.event_record(g.dev, g.s, &ev), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, ev), KVS_EINVAL);
    assert_int_equal(kvs_host_stream_sync(f.dev, g.s), KVS_EINVAL);
    assert_int_equal(kvs_host_stream_sync(f.dev, s2), KVS_OK);
    g.dev->ops.event_destroy(g.dev, ev);
    f.dev->ops.stream_destroy(f.dev, s2);
    pool_free(&f, &sh, &p);
    fx_close(&g);
    fx_close(&f);
}

static void test_host_device_foreign_device_is_refused(void **state)
{
    kvs_device_t other;
    memset(&other, 0, sizeof other);
    assert_null(kvs_host_device_from(&other));
    assert_null(kvs_host_ptr(&other, 0, 0));
    assert_null(kvs_host_ptr(NULL, 0, 0));
    assert_int_equal(kvs_host_stream_sync(&other, NULL), KVS_EINVAL);
    assert_int_equal(kvs_host_event_wait(&other, NULL), KVS_EINVAL);
}

/* Two threads, each with its own stream and buffers, on one device. */
typedef struct worker_arg {
    kvs_device_t *dev;
    uint64_t seed;
    int ok;
} worker_arg_t;

static void *thread_round_trips(void *p)
{
    worker_arg_t *w = p;
    kvs_device_t *dev = w->dev;
    kvs_stream_t *s = NULL;
    uint64_t rng = w->seed;
    if (dev->ops.stream_create(dev, &s) != KVS_OK)
        return NULL;
    const uint64_t len = 64 * 1024;
    uint64_t a = 0, stg = 0;
    uint8_t *want = malloc(len);
    if (want == NULL || dev->ops.mem_alloc(dev, len, &a) != KVS_OK ||
        dev->ops.mem_alloc(dev, len, &stg) != KVS_OK)
        return NULL;
    int64_t pages[64];
    int ok = 1;
    for (int r = 0; r < 40 && ok; r++) {
        xorshift_fill(want, len, &rng);
        ok &= dev->ops.mem_write(dev, a, want, len) == KVS_OK;
        for (int i = 0; i < 64; i++)
            pages[i] = 63 - i;
        /* One layer, one head of 1024 bytes per token, page of one token:
         * the staging block is the pool reversed token by token. */
        const uint64_t kb[1] = {a}, vb[1] = {a};
        kvs_copy_desc_t d = {.k_base = kb, .v_base = vb, .local_heads = 1,
                             .head_dim = 512, .elem_bytes = 1, .page_size = 1,
                             .pages = pages, .num_pages = 64, .tokens = 64,
                             .head_start = 0, .num_heads = 1, .layer_begin = 0,
                             .layer_count = 1, .staging_slot_begin = 0,
                             .staging_layer_slots = 1, .staging_addr = stg};
        /* K and V are the same buffer here: 2 slots of 32 KiB. */
        kvs_event_t *ev = NULL;
        ok &= dev->ops.gather(dev, s, &d) == KVS_OK;
        ok &= dev->ops.event_record(dev, s, &ev) == KVS_OK;
        ok &= kvs_host_event_wait(dev, ev) == KVS_OK;
        dev->ops.event_destroy(dev, ev);
        const uint8_t *got = kvs_host_ptr(dev, stg, len);
        for (int t = 0; t < 64 && ok; t++)
            ok &= memcmp(got + (uint64_t)t * 512, want + (uint64_t)(63 - t) * 512, 512) == 0;
    }
    free(want);
    ok &= dev->ops.mem_free(dev, a) == KVS_OK;
    ok &= dev->ops.mem_free(dev, stg) == KVS_OK;
    dev->ops.stream_destroy(dev, s);
    w->ok = ok;
    return NULL;
}

static void test_host_device_two_threads_share_a_device(void **state)
{
    kvs_host_device_t *h = NULL;
    assert_int_equal(kvs_host_device_create(NULL, &h, NULL), KVS_OK);
    worker_arg_t w[2] = {{kvs_host_device(h), 11, 0}, {kvs_host_device(h), 12, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, thread_round_trips, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(w[0].ok, 1);
    assert_int_equal(w[1].ok, 1);
    kvs_host_device_destroy(h);
}

static void test_host_device_destroy_with_work_queued(void **state)
{
    fx_t f;
    fx_open(&f, NULL);
    const shape_t sh = {16, 1024, 2, 0, 1, 128, 2, 2, 0, 2, 2, 0, 128, 0, 0};
    uint64_t rng = 21;
    pool_t p, q;
    pool_make(&f, &sh, &p, &rng);
    pool_make(&f, &sh, &q, &rng);
    kvs_copy_desc_t dp = desc_of(&sh, &p), dq = desc_of(&sh, &q);
    kvs_stream_t *s2 = NULL;
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s2), KVS_OK);
    kvs_event_t *ev = NULL;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(f.dev->ops.gather(f.dev, f.s, &dp), KVS_OK);
        assert_int_equal(f.dev->ops.scatter(f.dev, s2, &dq), KVS_OK);
    }
    assert_int_equal(f.dev->ops.event_record(f.dev, s2, &ev), KVS_OK);
    /* Streams, an event and every allocation still live: destroy frees all
     * (ASan and valgrind check nothing leaks). */
    kvs_host_device_destroy(f.host);
}

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

static void test_host_device_matches_sim_gpu(void **state)
{
    fx_t f;
    fx_open(&f, NULL);
    sim_engine_t *eng = NULL;
    sim_gpu_t *gpu = NULL;
    assert_int_equal(sim_engine_create(1, 64, &eng), KVS_OK);
    assert_int_equal(sim_gpu_create(eng, NULL, 0, &gpu), KVS_OK);
    kvs_device_t *sdev = sim_gpu_device(gpu);
    kvs_stream_t *ss = NULL;
    assert_int_equal(sdev->ops.stream_create(sdev, &ss), KVS_OK);
    const kvc_side_t host = {f.dev, f.s, wait_host, NULL};
    const kvc_side_t sim = {sdev, ss, wait_sim, eng};
    uint64_t rng = 0x5EED;
    for (int i = 0; i < 40; i++) {
        const uint64_t seed = xorshift64(&rng);
        uint64_t r = seed;
        const kvc_shape_t sh = kvc_random_shape(&r, 48);
        char msg[256];
        if (kvc_compare(&host, &sim, &sh, seed, msg, sizeof msg) != 0)
            fail_msg("host vs sim-gpu, seed %llu: %s", (unsigned long long)seed, msg);
    }
    sdev->ops.stream_destroy(sdev, ss);
    sim_gpu_destroy(gpu);
    sim_engine_destroy(eng);
    fx_close(&f);
}

/* ---- the device contract (tests/fixtures/device_contract.c) on this backend -------- */

static kvs_device_t *host_contract_open(void **ctx)
{
    kvs_host_device_t *h = NULL;
    kvs_error_t err;
    assert_int_equal(kvs_host_device_create(NULL, &h, &err), KVS_OK);
    *ctx = h;
    return kvs_host_device(h);
}

static void host_contract_close(void *ctx, kvs_device_t *dev)
{
    (void)dev;
    kvs_host_device_destroy(ctx);
}

static const dc_backend_t host_contract = {
    .name = "the host device",
    .open = host_contract_open,
    .wait = wait_host,
    .close = host_contract_close,
};

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_device_create_arguments),
        cmocka_unit_test(test_host_device_attached_memory),
        cmocka_unit_test(test_host_device_memory_alloc_free_bounds),
        cmocka_unit_test(test_host_device_gather_scatter_fixed_shapes),
        cmocka_unit_test(test_host_device_gather_scatter_random_shapes),
        cmocka_unit_test(test_host_device_one_plane_copies),
        cmocka_unit_test(test_host_device_scale_plane_copies),
        cmocka_unit_test(test_host_device_gather_scatter_streaming_path),
        cmocka_unit_test(test_host_device_copy_threads_split_ops),
        cmocka_unit_test(test_host_device_descriptor_validation),
        cmocka_unit_test(test_host_device_stream_runs_ops_in_order),
        cmocka_unit_test(test_host_device_events),
        cmocka_unit_test(test_host_device_wait_fd_signals_completions),
        cmocka_unit_test(test_host_device_mem_free_drains_streams),
        cmocka_unit_test(test_host_device_stream_table_and_foreign_objects),
        cmocka_unit_test(test_host_device_foreign_device_is_refused),
        cmocka_unit_test(test_host_device_two_threads_share_a_device),
        cmocka_unit_test(test_host_device_destroy_with_work_queued),
        cmocka_unit_test(test_host_device_matches_sim_gpu),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed + dc_run(&host_contract);
}
