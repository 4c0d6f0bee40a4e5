/*
 * test_sim_gpu.c - unit tests of the simulated GPU (sim/gpu.c): allocation,
 * translation and the HBM capacity; gather and scatter checked byte for byte
 * against a naive reference copy written here, over several shapes; the
 * timing model (bytes invisible before an op's end, FIFO streams, exact
 * durations, overlapping streams, scatter slowdown); events, wake callback,
 * descriptor validation, bounded tables, memory freed under an op in
 * flight, destroy with ops pending, and from_device on a foreign device.
 * Then the device contract every backend meets (tests/fixtures/device_contract.c:
 * memory bounds, copies against a reference, order, refusals, events,
 * wait_arm) on the simulated GPU, its engine run to let copies land.
 * Every random fill uses a fixed seed, printed on failure.
 */
#include "gpu.h"

#include "device_contract.h"

#include <kvstage/backend.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fake_backend.h"

/* ---- fixture ------------------------------------------------------------- */

typedef struct fx {
    sim_engine_t *eng;
    sim_gpu_t *gpu;
    kvs_device_t *dev;
    kvs_stream_t *s;
} fx_t;

static void fx_open(fx_t *f, const sim_gpu_config_t *cfg, uint32_t id)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(sim_engine_create(1, 64, &f->eng), KVS_OK);
    assert_int_equal(sim_gpu_create(f->eng, cfg, id, &f->gpu), KVS_OK);
    f->dev = sim_gpu_device(f->gpu);
    assert_non_null(f->dev);
    assert_int_equal(f->dev->ops.stream_create(f->dev, &f->s), KVS_OK);
}

static void fx_close(fx_t *f)
{
    f->dev->ops.stream_destroy(f->dev, f->s);
    sim_gpu_destroy(f->gpu);
    sim_engine_destroy(f->eng);
}

static uint64_t dev_alloc(fx_t *f, uint64_t len)
{
    uint64_t a = 0;
    assert_int_equal(f->dev->ops.mem_alloc(f->dev, len, &a), KVS_OK);
    return a;
}

static void run_all(fx_t *f) { sim_engine_run(f->eng, UINT64_MAX, 0); }

/* Counts wakes and remembers when the last one came. */
typedef struct wake_log {
    sim_engine_t *eng;
    int calls;
    uint64_t at_ns[8];
} wake_log_t;

static void on_wake(void *ctx)
{
    wake_log_t *w = ctx;
    if (w->calls < 8)
        w->at_ns[w->calls] = sim_engine_now_ns(w->eng);
    w->calls++;
}

/* ---- a KV pool and a staging block on the device ------------------------ */

typedef struct shape {
    const char *name;
    int64_t page_size, tokens, local_heads, head_start, num_heads, head_dim, elem_bytes;
    int64_t pool_layers, layer_begin, layer_count, slots, slot_begin;
    int64_t pool_pages; /* pages in every layer buffer */
} shape_t;

typedef struct pool {
    uint64_t k[8], v[8];  /* per layer device address */
    uint64_t layer_bytes;
    uint64_t stg;         /* staging block */
    uint64_t stg_bytes;
    int64_t pages[64];
    int64_t num_pages;
} pool_t;

static uint64_t slot_bytes(const shape_t *sh)
{
    return (uint64_t)(sh->tokens * sh->num_heads * sh->head_dim * sh->elem_bytes);
}

static void pool_make(fx_t *f, const shape_t *sh, pool_t *p, sim_rng_t *rng)
{
    memset(p, 0, sizeof *p);
    assert_true(sh->pool_layers <= 8);
    p->layer_bytes = (uint64_t)(sh->pool_pages * sh->page_size * sh->local_heads *
                                sh->head_dim * sh->elem_bytes);
    for (int64_t l = 0; l < sh->pool_layers; l++) {
        p->k[l] = dev_alloc(f, p->layer_bytes);
        p->v[l] = dev_alloc(f, p->layer_bytes);
    }
    p->stg_bytes = slot_bytes(sh) * (uint64_t)sh->slots * 2;
    p->stg = dev_alloc(f, p->stg_bytes > 0 ? p->stg_bytes : 1);
    /* Distinct page ids in a shuffled order. */
    p->num_pages = (sh->tokens + sh->page_size - 1) / sh->page_size;
    assert_true(p->num_pages <= sh->pool_pages && sh->pool_pages <= 64);
    int64_t perm[64];
    for (int64_t i = 0; i < sh->pool_pages; i++)
        perm[i] = i;
    for (int64_t i = sh->pool_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)sim_rng_below(rng, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < p->num_pages; i++)
        p->pages[i] = perm[i];
}

static void fill_random(fx_t *f, uint64_t addr, uint64_t len, sim_rng_t *rng)
{
    uint8_t *h = sim_gpu_host(f->gpu, addr, len);
    assert_non_null(h);
    for (uint64_t i = 0; i < len; i++)
        h[i] = (uint8_t)sim_rng_next(rng);
}

static kvs_copy_desc_t desc_of(const shape_t *sh, const pool_t *p)
{
    kvs_copy_desc_t d = {
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
    };
    return d;
}

/*
 * The naive reference: one element byte at a time, straight from the words
 * of backend.h. Returns the staging byte offset and the pool byte offset of
 * (layer j of the copy, kv, token i, head h, dim x, byte b).
 */
static void ref_offsets(const shape_t *sh, const pool_t *p, int64_t j, int kv, int64_t i,
                        int64_t h, int64_t x, int64_t b, uint64_t *stg_off,
                        uint64_t *pool_off)
{
    int64_t slot = kv * sh->slots + sh->slot_begin + j;
    *stg_off = (uint64_t)(slot * (int64_t)slot_bytes(sh) +
                          ((i * sh->num_heads + h) * sh->head_dim + x) * sh->elem_bytes + b);
    int64_t page = p->pages[i / sh->page_size];
    int64_t tslot = page * sh->page_size + i % sh->page_size;
    *pool_off = (uint64_t)(((tslot * sh->local_heads + sh->head_start + h) * sh->head_dim +
                            x) * sh->elem_bytes + b);
}

/* Gather from pool A, check the staging block against the reference, then
 * scatter into a zeroed pool B and check B is A on the copied bytes and zero
 * elsewhere. */
static void round_trip(const shape_t *sh, uint64_t seed)
{
    print_message("shape %s seed %llu\n", sh->name, (unsigned long long)seed);
    fx_t f;
    fx_open(&f, NULL, 3);
    sim_rng_t rng;
    sim_rng_init(&rng, seed, 1);
    pool_t a, b;
    pool_make(&f, sh, &a, &rng);
    pool_make(&f, sh, &b, &rng);
    memcpy(b.pages, a.pages, sizeof b.pages); /* same page ids, other buffers */
    for (int64_t l = 0; l < sh->pool_layers; l++) {
        fill_random(&f, a.k[l], a.layer_bytes, &rng);
        fill_random(&f, a.v[l], a.layer_bytes, &rng);
    }
    fill_random(&f, a.stg, a.stg_bytes, &rng); /* untouched slots stay as they are */
    uint8_t *before = malloc(a.stg_bytes);
    assert_non_null(before);
    memcpy(before, sim_gpu_host(f.gpu, a.stg, a.stg_bytes), a.stg_bytes);

    kvs_copy_desc_t d = desc_of(sh, &a);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    run_all(&f);

    /* Expected staging: the bytes before, with the copied ones replaced. */
    uint8_t *want = before;
    for (int64_t j = 0; j < sh->layer_count; j++)
        for (int kv = 0; kv < 2; kv++) {
            uint64_t base = kv == 0 ? a.k[sh->layer_begin + j] : a.v[sh->layer_begin + j];
            const uint8_t *pool = sim_gpu_host(f.gpu, base, a.layer_bytes);
            for (int64_t i = 0; i < sh->tokens; i++)
                for (int64_t h = 0; h < sh->num_heads; h++)
                    for (int64_t x = 0; x < sh->head_dim; x++)
                        for (int64_t e = 0; e < sh->elem_bytes; e++) {
                            uint64_t so, po;
                            ref_offsets(sh, &a, j, kv, i, h, x, e, &so, &po);
                            want[so] = pool[po];
                        }
        }
    assert_memory_equal(sim_gpu_host(f.gpu, a.stg, a.stg_bytes), want, a.stg_bytes);
    assert_int_equal(sim_gpu_copy_bytes(f.gpu),
                     slot_bytes(sh) * (uint64_t)sh->layer_count * 2);

    /* Scatter the same staging block into pool B. */
    kvs_copy_desc_t ds = desc_of(sh, &b);
    ds.staging_addr = a.stg;
    assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &ds), KVS_OK);
    run_all(&f);
    for (int64_t l = 0; l < sh->pool_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            uint8_t *exp = calloc(1, a.layer_bytes);
            assert_non_null(exp);
            int64_t j = l - sh->layer_begin;
            if (j >= 0 && j < sh->layer_count) {
                const uint8_t *src = sim_gpu_host(f.gpu, kv == 0 ? a.k[l] : a.v[l],
                                                  a.layer_bytes);
                for (int64_t i = 0; i < sh->tokens; i++)
                    for (int64_t h = 0; h < sh->num_heads; h++)
                        for (int64_t x = 0; x < sh->head_dim; x++)
                            for (int64_t e = 0; e < sh->elem_bytes; e++) {
                                uint64_t so, po;
                                ref_offsets(sh, &a, j, kv, i, h, x, e, &so, &po);
                                exp[po] = src[po];
                            }
            }
            assert_memory_equal(sim_gpu_host(f.gpu, kv == 0 ? b.k[l] : b.v[l],
                                             a.layer_bytes),
                                exp, a.layer_bytes);
            free(exp);
        }
    free(before);
    fx_close(&f);
}

/* ---- tests --------------------------------------------------------------- */

static void test_sim_gpu_alloc_free_translate(void **state)
{
    fx_t f;
    sim_gpu_config_t cfg = {.max_allocs = 4};
    fx_open(&f, &cfg, 2);
    assert_int_equal(sim_gpu_id(f.gpu), 2);
    assert_string_equal(f.dev->ops.name, "sim-gpu");

    uint64_t a = dev_alloc(&f, 100);
    uint64_t b = dev_alloc(&f, 3u << 20); /* mmap'ed */
    assert_int_equal(a >> 44, 3);
    assert_int_equal(b >> 44, 3);
    assert_int_equal(a % 256, 0);
    assert_int_equal(b % 256, 0);
    assert_true(b >= a + 100);
    assert_int_equal(sim_gpu_used_bytes(f.gpu), 100 + (3u << 20));

    /* Fresh memory reads as zero, both kinds. */
    uint8_t *ha = sim_gpu_host(f.gpu, a, 100);
    uint8_t *hb = sim_gpu_host(f.gpu, b, 3u << 20);
    assert_non_null(ha);
    assert_non_null(hb);
    assert_int_equal(ha[99], 0);
    assert_int_equal(hb[(3u << 20) - 1], 0);
    hb[(3u << 20) - 1] = 7;

    /* Inside, edges, outside, overflow. */
    assert_ptr_equal(sim_gpu_host(f.gpu, a + 10, 90), ha + 10);
    assert_null(sim_gpu_host(f.gpu, a + 10, 91));
    assert_null(sim_gpu_host(f.gpu, a - 1, 1));
    assert_null(sim_gpu_host(f.gpu, a + 100, 1)); /* the alignment gap */
    assert_null(sim_gpu_host(f.gpu, b, UINT64_MAX));
    assert_null(sim_gpu_host(f.gpu, UINT64_MAX, 2));
    assert_null(sim_gpu_host(f.gpu, 0, 1));
    assert_ptr_equal(sim_gpu_host(f.gpu, b + (3u << 20) - 1, 1), hb + (3u << 20) - 1);

    /* Errors. */
    uint64_t x;
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, 0, &x), KVS_EINVAL);
    assert_int_equal(f.dev->ops.mem_free(f.dev, a + 1), KVS_ENOENT);
    assert_int_equal(f.dev->ops.mem_free(f.dev, 12345), KVS_ENOENT);

    /* Free, then the address is dead and never handed out again. */
    assert_int_equal(f.dev->ops.mem_free(f.dev, a), KVS_OK);
    assert_int_equal(f.dev->ops.mem_free(f.dev, a), KVS_ENOENT);
    assert_null(sim_gpu_host(f.gpu, a, 1));
    assert_ptr_equal(sim_gpu_host(f.gpu, b, 1), hb);
    assert_int_equal(sim_gpu_used_bytes(f.gpu), 3u << 20);
    uint64_t c = dev_alloc(&f, 100);
    assert_true(c > b);
    assert_int_not_equal(c, a);

    /* The table is bounded: 4 live allocations. */
    dev_alloc(&f, 1);
    dev_alloc(&f, 1);
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, 1, &x), KVS_EFULL);
    assert_non_null(strstr(f.dev->last_backend_msg, "max_allocs"));
    assert_int_equal(f.dev->ops.mem_free(f.dev, b), KVS_OK);
    dev_alloc(&f, 1);
    fx_close(&f); /* frees the live ones: LeakSanitizer checks */
}

static void test_sim_gpu_hbm_full_fails_cleanly(void **state)
{
    fx_t f;
    sim_gpu_config_t cfg = {.hbm_bytes = 4u << 20};
    fx_open(&f, &cfg, 0);
    uint64_t a = dev_alloc(&f, 3u << 20);
    uint64_t x = 42;
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, (1u << 20) + 1, &x), KVS_EBACKEND);
    assert_int_equal(x, 42);
    assert_int_equal(f.dev->last_backend_code, 12 /* ENOMEM */);
    assert_string_equal(f.dev->last_backend_msg,
                        "simulated HBM of gpu 0 full: 3145728 of 4194304 bytes used, "
                        "1048577 requested; lower the ring or KV pool size");
    assert_int_equal(sim_gpu_used_bytes(f.gpu), 3u << 20);
    /* Exactly the rest still fits; then nothing does. */
    uint64_t b = dev_alloc(&f, 1u << 20);
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, 1, &x), KVS_EBACKEND);
    assert_int_equal(f.dev->ops.mem_free(f.dev, a), KVS_OK);
    assert_int_equal(f.dev->ops.mem_free(f.dev, b), KVS_OK);
    assert_int_equal(sim_gpu_used_bytes(f.gpu), 0);
    fx_close(&f);
}

static void test_sim_gpu_default_capacity_is_h200(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 0);
    uint64_t x;
    assert_int_equal(f.dev->ops.mem_alloc(f.dev, (141ull << 30) + 1, &x), KVS_EBACKEND);
    /* NORESERVE: a large allocation costs address space, not memory. */
    uint64_t a = dev_alloc(&f, 8ull << 30);
    assert_int_equal(sim_gpu_used_bytes(f.gpu), 8ull << 30);
    fx_close(&f);
    (void)a;
}

static const shape_t shapes[] = {
    {"ps1-bf16-head-slice-slots", 1, 5, 4, 1, 2, 8, 2, 3, 1, 2, 4, 1, 8},
    {"ps16-fp8-partial-page", 16, 37, 8, 2, 4, 16, 1, 4, 0, 4, 4, 0, 6},
    {"ps16-fp32-full-pages-slot-offset", 16, 32, 2, 0, 2, 4, 4, 5, 2, 3, 6, 3, 5},
    {"ps4-bf16-middle-head-one-token", 4, 1, 8, 5, 1, 16, 2, 2, 1, 1, 1, 0, 3},
    {"ps16-fp8-last-head-many-pages", 16, 250, 4, 3, 1, 8, 1, 2, 0, 2, 2, 0, 20},
};

static void test_sim_gpu_gather_scatter_round_trip_shapes(void **state)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        round_trip(&shapes[i], 1000 + i);
}

static void test_sim_gpu_bytes_visible_only_at_end(void **state)
{
    fx_t f;
    sim_gpu_config_t cfg = {.hbm_bytes_per_s = 1000000000ull, .launch_ns = 1000};
    fx_open(&f, &cfg, 0);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 7, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    fill_random(&f, p.k[0], p.layer_bytes, &rng);
    fill_random(&f, p.v[0], p.layer_bytes, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    /* payload = 8 tokens * 2 heads * 4 dims * 2 B * (K+V) = 256 B;
     * 2 * 256 B at 1 B/ns = 512 ns. */
    uint64_t end = 1000 + 512;
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    kvs_event_t *ev;
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &ev), KVS_OK);
    uint8_t *zero = calloc(1, p.stg_bytes);
    assert_non_null(zero);

    sim_engine_run(f.eng, end - 1, 0);
    assert_memory_equal(sim_gpu_host(f.gpu, p.stg, p.stg_bytes), zero, p.stg_bytes);
    assert_int_equal(f.dev->ops.event_query(f.dev, ev), KVS_EAGAIN);
    assert_int_equal(sim_gpu_copy_bytes(f.gpu), 0);

    sim_engine_run(f.eng, end, 0);
    assert_int_equal(sim_engine_now_ns(f.eng), end);
    assert_memory_not_equal(sim_gpu_host(f.gpu, p.stg, p.stg_bytes), zero, p.stg_bytes);
    assert_int_equal(f.dev->ops.event_query(f.dev, ev), KVS_OK);
    assert_int_equal(sim_gpu_copy_bytes(f.gpu), 256);
    assert_int_equal(sim_gpu_copy_ns(f.gpu), 1512);
    f.dev->ops.event_destroy(f.dev, ev);
    free(zero);
    fx_close(&f);
}

/* An event at the op's end instant, dispatched before the copy's own engine
 * event, still sees the op pending: completion means the bytes landed. */
typedef struct probe {
    kvs_device_t *dev;
    kvs_event_t *ev;
    int seen;
} probe_t;

static void probe_fn(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    probe_t *p = ctx;
    p->seen = p->dev->ops.event_query(p->dev, p->ev);
}

static void test_sim_gpu_event_not_complete_before_copy_ran(void **state)
{
    fx_t f;
    sim_gpu_config_t cfg = {.hbm_bytes_per_s = 1000000000ull, .launch_ns = 1000};
    fx_open(&f, &cfg, 0);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 8, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    probe_t pr = {.dev = f.dev, .seen = 1};
    /* Scheduled first, so it runs first at t = 1512. */
    assert_int_equal(sim_engine_at(f.eng, 1512, probe_fn, &pr, 0, NULL), KVS_OK);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &pr.ev), KVS_OK);
    run_all(&f);
    assert_int_equal(pr.seen, KVS_EAGAIN);
    assert_int_equal(f.dev->ops.event_query(f.dev, pr.ev), KVS_OK);
    f.dev->ops.event_destroy(f.dev, pr.ev);
    fx_close(&f);
}

static void test_sim_gpu_stream_fifo_exact_duration(void **state)
{
    fx_t f;
    /* 3 B/ns: 2 * 256 B take ceil(512 / 3) = 171 ns. */
    sim_gpu_config_t cfg = {.hbm_bytes_per_s = 3000000000ull, .launch_ns = 5000};
    fx_open(&f, &cfg, 0);
    wake_log_t w = {.eng = f.eng};
    sim_gpu_set_wake(f.gpu, on_wake, &w);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 9, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    uint64_t dur = 5000 + 171;
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    run_all(&f);
    assert_int_equal(w.calls, 3);
    assert_int_equal(w.at_ns[0], dur);
    assert_int_equal(w.at_ns[1], 2 * dur);
    assert_int_equal(w.at_ns[2], 3 * dur);
    assert_int_equal(sim_gpu_copy_ns(f.gpu), 3 * dur);
    assert_int_equal(sim_gpu_copy_bytes(f.gpu), 3 * 256);

    /* An op enqueued on an idle stream later starts then, not at busy_until. */
    assert_int_equal(sim_engine_at(f.eng, 100000, probe_fn,
                                   &(probe_t){.dev = f.dev, .ev = NULL}, 0, NULL),
                     KVS_OK);
    sim_engine_run(f.eng, UINT64_MAX, 1);
    assert_int_equal(sim_engine_now_ns(f.eng), 100000);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    run_all(&f);
    assert_int_equal(w.at_ns[3], 100000 + dur);
    fx_close(&f);
}

static void test_sim_gpu_two_streams_overlap(void **state)
{
    fx_t f;
    sim_gpu_config_t cfg = {.hbm_bytes_per_s = 1000000000ull, .launch_ns = 1000};
    fx_open(&f, &cfg, 0);
    kvs_stream_t *s2;
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s2), KVS_OK);
    assert_ptr_not_equal(s2, f.s);
    wake_log_t w = {.eng = f.eng};
    sim_gpu_set_wake(f.gpu, on_wake, &w);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 10, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.gather(f.dev, s2, &d), KVS_OK);
    run_all(&f);
    assert_int_equal(w.calls, 2);
    assert_int_equal(w.at_ns[0], 1512);
    assert_int_equal(w.at_ns[1], 1512);
    assert_int_equal(sim_gpu_copy_ns(f.gpu), 2 * 1512); /* busy time, summed */
    f.dev->ops.stream_destroy(f.dev, s2);
    fx_close(&f);
}

static void test_sim_gpu_scatter_slowdown(void **state)
{
    fx_t f;
    sim_gpu_config_t cfg = {.hbm_bytes_per_s = 1000000000ull, .launch_ns = 1000};
    fx_open(&f, &cfg, 0);
    wake_log_t w = {.eng = f.eng};
    sim_gpu_set_wake(f.gpu, on_wake, &w);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 11, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    sim_gpu_set_scatter_slowdown(f.gpu, 4);
    assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK); /* not slowed */
    run_all(&f);
    assert_int_equal(w.at_ns[0], 4 * 1512);
    assert_int_equal(w.at_ns[1], 5 * 1512);
    sim_gpu_set_scatter_slowdown(f.gpu, 1);
    assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &d), KVS_OK);
    run_all(&f);
    assert_int_equal(w.at_ns[2], 6 * 1512);
    fx_close(&f);
}

static void test_sim_gpu_event_eagain_then_ok(void **state)
{
    fx_t f;
    sim_gpu_config_t cfg = {.max_events = 2};
    fx_open(&f, &cfg, 0);
    kvs_event_t *idle, *busy, *x;
    /* On an idle stream: complete at once. */
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &idle), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, idle), KVS_OK);

    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 12, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &busy), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, busy), KVS_EAGAIN);
    assert_int_equal(f.dev->ops.event_query(f.dev, idle), KVS_OK);
    /* Bounded: two live events. */
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &x), KVS_EFULL);
    assert_non_null(strstr(f.dev->last_backend_msg, "max_events"));
    run_all(&f);
    assert_int_equal(f.dev->ops.event_query(f.dev, busy), KVS_OK);
    f.dev->ops.event_destroy(f.dev, idle);
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &x), KVS_OK);
    assert_int_equal(f.dev->ops.event_query(f.dev, x), KVS_OK);
    f.dev->ops.event_destroy(f.dev, x);
    f.dev->ops.event_destroy(f.dev, busy);
    assert_int_equal(f.dev->ops.event_record(f.dev, NULL, &x), KVS_EINVAL);
    fx_close(&f);
}

static void test_sim_gpu_event_survives_stream_destroy(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 0);
    kvs_stream_t *s2;
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s2), KVS_OK);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 13, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    fill_random(&f, p.k[0], p.layer_bytes, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    assert_int_equal(f.dev->ops.gather(f.dev, s2, &d), KVS_OK);
    kvs_event_t *ev;
    assert_int_equal(f.dev->ops.event_record(f.dev, s2, &ev), KVS_OK);
    f.dev->ops.stream_destroy(f.dev, s2); /* work still completes */
    assert_int_equal(f.dev->ops.event_query(f.dev, ev), KVS_EAGAIN);
    run_all(&f);
    assert_int_equal(f.dev->ops.event_query(f.dev, ev), KVS_OK);
    assert_int_equal(sim_gpu_copy_bytes(f.gpu), 256);
    f.dev->ops.event_destroy(f.dev, ev);
    fx_close(&f);
}

static void test_sim_gpu_stream_table_bounded(void **state)
{
    fx_t f;
    sim_gpu_config_t cfg = {.max_streams = 2};
    fx_open(&f, &cfg, 0);
    kvs_stream_t *s2, *s3;
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s2), KVS_OK);
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s3), KVS_EFULL);
    assert_non_null(strstr(f.dev->last_backend_msg, "max_streams"));
    f.dev->ops.stream_destroy(f.dev, s2);
    assert_int_equal(f.dev->ops.stream_create(f.dev, &s3), KVS_OK);
    f.dev->ops.stream_destroy(f.dev, s3);
    f.dev->ops.stream_destroy(f.dev, NULL);
    fx_close(&f);
}

static void test_sim_gpu_wake_called(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 0);
    wake_log_t w = {.eng = f.eng};
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 14, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    run_all(&f); /* no callback set: nothing to call */
    sim_gpu_set_wake(f.gpu, on_wake, &w);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(w.calls, 0);
    run_all(&f);
    assert_int_equal(w.calls, 2);
    sim_gpu_set_wake(f.gpu, NULL, NULL);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    run_all(&f);
    assert_int_equal(w.calls, 2);
    fx_close(&f);
}

/* A wake callback that enqueues more work while ops are in flight: the op
 * pool grows under it. */
typedef struct chain {
    fx_t *f;
    kvs_copy_desc_t d;
    int left;
} chain_t;

static void chain_wake(void *ctx)
{
    chain_t *c = ctx;
    if (c->left-- > 0)
        for (int i = 0; i < 100; i++)
            assert_int_equal(c->f->dev->ops.gather(c->f->dev, c->f->s, &c->d), KVS_OK);
}

static void test_sim_gpu_many_pending_ops_grow_pool(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 0);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 15, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    chain_t c = {.f = &f, .d = desc_of(&sh, &p), .left = 5};
    sim_gpu_set_wake(f.gpu, chain_wake, &c);
    for (int i = 0; i < 300; i++)
        assert_int_equal(f.dev->ops.gather(f.dev, f.s, &c.d), KVS_OK);
    run_all(&f);
    assert_int_equal(sim_gpu_copy_bytes(f.gpu), (300 + 500) * 256ull);
    fx_close(&f);
}

static void expect_bad(fx_t *f, const kvs_copy_desc_t *d, int code, const char *needle)
{
    f->dev->last_backend_msg[0] = '\0';
    assert_int_equal(f->dev->ops.gather(f->dev, f->s, d), code);
    assert_int_equal(f->dev->ops.scatter(f->dev, f->s, d), code);
    if (strstr(f->dev->last_backend_msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", f->dev->last_backend_msg, needle);
    assert_int_equal(sim_engine_pending(f->eng), 0);
}

static void test_sim_gpu_descriptor_validation(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 0);
    shape_t sh = {"t", 4, 8, 4, 1, 2, 4, 2, 3, 1, 2, 3, 1, 4};
    sim_rng_t rng;
    sim_rng_init(&rng, 16, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    const kvs_copy_desc_t good = desc_of(&sh, &p);
    kvs_copy_desc_t d;

    assert_int_equal(f.dev->ops.gather(f.dev, NULL, &good), KVS_EINVAL);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, NULL), KVS_EINVAL);

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
    BAD(staging_addr, p.stg + 256, KVS_ERANGE, "staging block");
    BAD(staging_addr, p.k[0], KVS_ERANGE, "staging block");
    BAD(k_base, NULL, KVS_EINVAL, "k_base or v_base is NULL");
    BAD(pages, NULL, KVS_EINVAL, "pages is NULL");
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
    uint64_t vb[8];
    memcpy(vb, p.v, sizeof vb);
    vb[2] = p.stg + (1ull << 30);
    BAD(v_base, vb, KVS_ERANGE, "V buffer of local layer 2");
    assert_int_equal(f.dev->ops.mem_free(f.dev, p.k[1]), KVS_OK);
    expect_bad(&f, &good, KVS_ERANGE, "K buffer of local layer 1");
#undef BAD

    /* Pages past the used ones are not looked at; zero tokens is a no-op op
     * that still costs a launch. */
    d = good;
    d.layer_begin = 2;
    d.layer_count = 1;
    int64_t more[3] = {p.pages[0], p.pages[1], -7};
    d.pages = more;
    d.num_pages = 3;
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    d.tokens = 0;
    d.staging_addr = 0;
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    run_all(&f);
    assert_int_equal(sim_gpu_copy_bytes(f.gpu), 8 * 2 * 4 * 2 * 2);
    fx_close(&f);
}

static void test_sim_gpu_memory_freed_in_flight_copies_nothing(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 0);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 17, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    fill_random(&f, p.stg, p.stg_bytes, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    uint64_t v0 = p.v[0];
    assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &d), KVS_OK);
    kvs_event_t *ev;
    assert_int_equal(f.dev->ops.event_record(f.dev, f.s, &ev), KVS_OK);
    /* The caller's arrays may change after enqueue: the op has a copy. */
    p.v[0] = 0;
    p.pages[0] = -5;
    assert_int_equal(f.dev->ops.mem_free(f.dev, p.k[0]), KVS_OK);
    run_all(&f);
    assert_int_equal(f.dev->ops.event_query(f.dev, ev), KVS_OK);
    assert_int_equal(sim_gpu_copy_bytes(f.gpu), 0);
    /* All or nothing: V was not written either. */
    uint8_t *zero = calloc(1, p.layer_bytes);
    assert_non_null(zero);
    assert_memory_equal(sim_gpu_host(f.gpu, v0, p.layer_bytes), zero, p.layer_bytes);
    free(zero);
    f.dev->ops.event_destroy(f.dev, ev);
    fx_close(&f);
}

static void test_sim_gpu_snapshot_taken_at_enqueue(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 0);
    shape_t sh = {"t", 1, 2, 1, 0, 1, 1, 1, 1, 0, 1, 1, 0, 4};
    sim_rng_t rng;
    sim_rng_init(&rng, 18, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    uint8_t kv[4] = {10, 11, 12, 13};
    assert_int_equal(f.dev->ops.mem_write(f.dev, p.k[0], kv, 4), KVS_OK);
    assert_int_equal(f.dev->ops.mem_write(f.dev, p.v[0], kv, 4), KVS_OK);
    int64_t pages[2] = {3, 1};
    kvs_copy_desc_t d = desc_of(&sh, &p);
    d.pages = pages;
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    pages[0] = 0;
    pages[1] = 0;
    run_all(&f);
    uint8_t got[4];
    assert_int_equal(f.dev->ops.mem_read(f.dev, p.stg, got, 4), KVS_OK);
    uint8_t want[4] = {13, 11, 13, 11};
    assert_memory_equal(got, want, 4);
    fx_close(&f);
}

static void test_sim_gpu_destroy_with_ops_pending(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 0);
    wake_log_t w = {.eng = f.eng};
    sim_gpu_set_wake(f.gpu, on_wake, &w);
    shape_t sh = {"t", 4, 8, 2, 0, 2, 4, 2, 1, 0, 1, 1, 0, 2};
    sim_rng_t rng;
    sim_rng_init(&rng, 19, 1);
    pool_t p;
    pool_make(&f, &sh, &p, &rng);
    kvs_copy_desc_t d = desc_of(&sh, &p);
    assert_int_equal(f.dev->ops.gather(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(f.dev->ops.scatter(f.dev, f.s, &d), KVS_OK);
    assert_int_equal(sim_engine_pending(f.eng), 2);
    sim_gpu_destroy(f.gpu); /* with live streams, memory and ops */
    assert_int_equal(sim_engine_pending(f.eng), 0);
    run_all(&f); /* nothing fires into freed memory (ASan) */
    assert_int_equal(w.calls, 0);
    sim_engine_destroy(f.eng);
}

static void test_sim_gpu_from_device_foreign_is_null(void **state)
{
    fx_t f;
    fx_open(&f, NULL, 5);
    assert_ptr_equal(sim_gpu_from_device(f.dev), f.gpu);
    assert_ptr_equal(sim_gpu_from_device(sim_gpu_device(f.gpu)), f.gpu);
    fake_device_t fake;
    fake_device_setup(&fake);
    assert_null(sim_gpu_from_device(&fake.base));
    assert_null(sim_gpu_from_device(NULL));
    fx_close(&f);
}

static void test_sim_gpu_create_arguments(void **state)
{
    sim_engine_t *eng;
    assert_int_equal(sim_engine_create(1, 8, &eng), KVS_OK);
    sim_gpu_t *gpu = NULL;
    assert_int_equal(sim_gpu_create(NULL, NULL, 0, &gpu), KVS_EINVAL);
    assert_int_equal(sim_gpu_create(eng, NULL, 0, NULL), KVS_EINVAL);
    assert_int_equal(sim_gpu_create(eng, NULL, UINT32_MAX, &gpu), KVS_EINVAL);
    assert_null(gpu);
    sim_gpu_destroy(NULL);
    /* Two GPUs: disjoint address spaces. */
    sim_gpu_t *g0, *g1;
    assert_int_equal(sim_gpu_create(eng, NULL, 0, &g0), KVS_OK);
    assert_int_equal(sim_gpu_create(eng, NULL, 1, &g1), KVS_OK);
    uint64_t a0, a1;
    assert_int_equal(sim_gpu_device(g0)->ops.mem_alloc(sim_gpu_device(g0), 16, &a0), KVS_OK);
    assert_int_equal(sim_gpu_device(g1)->ops.mem_alloc(sim_gpu_device(g1), 16, &a1), KVS_OK);
    assert_int_not_equal(a0, a1);
    assert_null(sim_gpu_host(g1, a0, 1));
    assert_null(sim_gpu_host(g0, a1, 1));
    assert_string_equal(sim_gpu_device(g1)->name, "sim-gpu1");
    sim_gpu_destroy(g0);
    sim_gpu_destroy(g1);
    sim_engine_destroy(eng);
}

/* ---- the device contract (tests/fixtures/device_contract.c) on this backend -------- */

typedef struct sim_contract {
    sim_engine_t *eng;
    sim_gpu_t *gpu;
} sim_contract_t;

static kvs_device_t *sim_contract_open(void **ctx)
{
    sim_contract_t *c = calloc(1, sizeof *c);
    assert_non_null(c);
    assert_int_equal(sim_engine_create(0xDC, 64, &c->eng), KVS_OK);
    assert_int_equal(sim_gpu_create(c->eng, NULL, 0, &c->gpu), KVS_OK);
    *ctx = c;
    return sim_gpu_device(c->gpu);
}

/* The simulated GPU copies when its engine runs. */
static int sim_contract_wait(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    sim_contract_t *c = ctx;
    sim_engine_run(c->eng, UINT64_MAX, 0);
    return dev->ops.event_query(dev, ev);
}

static void sim_contract_close(void *ctx, kvs_device_t *dev)
{
    sim_contract_t *c = ctx;
    (void)dev;
    sim_gpu_destroy(c->gpu);
    sim_engine_destroy(c->eng);
    free(c);
}

static const dc_backend_t sim_contract = {
    .name = "the simulated GPU",
    .open = sim_contract_open,
    .wait = sim_contract_wait,
    .close = sim_contract_close,
};

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_gpu_alloc_free_translate),
        cmocka_unit_test(test_sim_gpu_hbm_full_fails_cleanly),
        cmocka_unit_test(test_sim_gpu_default_capacity_is_h200),
        cmocka_unit_test(test_sim_gpu_gather_scatter_round_trip_shapes),
        cmocka_unit_test(test_sim_gpu_bytes_visible_only_at_end),
        cmocka_unit_test(test_sim_gpu_event_not_complete_before_copy_ran),
        cmocka_unit_test(test_sim_gpu_stream_fifo_exact_duration),
        cmocka_unit_test(test_sim_gpu_two_streams_overlap),
        cmocka_unit_test(test_sim_gpu_scatter_slowdown),
        cmocka_unit_test(test_sim_gpu_event_eagain_then_ok),
        cmocka_unit_test(test_sim_gpu_event_survives_stream_destroy),
        cmocka_unit_test(test_sim_gpu_stream_table_bounded),
        cmocka_unit_test(test_sim_gpu_wake_called),
        cmocka_unit_test(test_sim_gpu_many_pending_ops_grow_pool),
        cmocka_unit_test(test_sim_gpu_descriptor_validation),
        cmocka_unit_test(test_sim_gpu_memory_freed_in_flight_copies_nothing),
        cmocka_unit_test(test_sim_gpu_snapshot_taken_at_enqueue),
        cmocka_unit_test(test_sim_gpu_destroy_with_ops_pending),
        cmocka_unit_test(test_sim_gpu_from_device_foreign_is_null),
        cmocka_unit_test(test_sim_gpu_create_arguments),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed + dc_run(&sim_contract);
}
