/*
 * test_ring.c - unit tests of the staging ring allocator (src/ring.c,
 * spec §6): placement and wrap, the watermark and the empty-ring restart,
 * error codes, id resolution, readiness, and a long pseudo-random run
 * checked against a small reference model written here. One test uses two
 * threads to check the ring's lock; threads live only in tests.
 */
#include <kvstage/kvstage.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "xorshift.h"

static kvs_ring_t *ring_new(uint64_t size_bytes, uint32_t max_live)
{
    kvs_ring_t *r = NULL;
    assert_int_equal(kvs_ring_create(size_bytes, max_live, &r), KVS_OK);
    assert_non_null(r);
    return r;
}

static kvs_ring_alloc_t assign_ok(kvs_ring_t *r, uint64_t len_bytes)
{
    kvs_ring_alloc_t a;
    assert_int_equal(kvs_ring_assign(r, len_bytes, &a), KVS_OK);
    assert_int_equal(a.end, a.offset + len_bytes);
    return a;
}

static kvs_watermark_t free_ok(kvs_ring_t *r, uint64_t id)
{
    kvs_watermark_t wm;
    assert_int_equal(kvs_ring_free(r, id, &wm), KVS_OK);
    kvs_watermark_t now = kvs_ring_watermark(r);
    assert_int_equal(now.round, wm.round);
    assert_int_equal(now.offset, wm.offset);
    return wm;
}

static void assert_wm(kvs_watermark_t wm, uint64_t round, uint64_t offset)
{
    assert_int_equal(wm.round, round);
    assert_int_equal(wm.offset, offset);
}

static void test_ring_first_assign_at_zero(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 4);
    assert_int_equal(kvs_ring_size_bytes(r), 100);
    assert_wm(kvs_ring_watermark(r), 0, 0);
    kvs_ring_alloc_t a = assign_ok(r, 10);
    assert_int_equal(a.offset, 0);
    assert_int_equal(a.round, 0);
    assert_int_equal(a.end, 10);
    kvs_ring_destroy(r);
}

static void test_ring_sequential_assigns(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 8);
    uint64_t lens[] = {10, 25, 1, 30};
    uint64_t expect = 0;
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        kvs_ring_alloc_t a = assign_ok(r, lens[i]);
        assert_int_equal(a.round, 0);
        assert_int_equal(a.offset, expect);
        expect += lens[i];
    }
    kvs_ring_destroy(r);
}

static void test_ring_wraps_at_end(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 8);
    assign_ok(r, 60);
    kvs_ring_alloc_t a = assign_ok(r, 50); /* 40 left: wraps */
    assert_int_equal(a.round, 1);
    assert_int_equal(a.offset, 0);
    assert_int_equal(a.end, 50);
    kvs_ring_alloc_t b = assign_ok(r, 50); /* exactly the rest of round 1 */
    assert_int_equal(b.round, 1);
    assert_int_equal(b.offset, 50);
    kvs_ring_alloc_t c = assign_ok(r, 1);
    assert_int_equal(c.round, 2);
    assert_int_equal(c.offset, 0);
    kvs_ring_destroy(r);
}

static void test_ring_exact_fit_does_not_wrap(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 8);
    assign_ok(r, 70);
    kvs_ring_alloc_t a = assign_ok(r, 30);
    assert_int_equal(a.round, 0);
    assert_int_equal(a.offset, 70);
    assert_int_equal(a.end, 100);
    kvs_ring_destroy(r);
}

static void test_ring_watermark_is_oldest_live(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 8);
    kvs_ring_alloc_t a = assign_ok(r, 40);
    kvs_ring_alloc_t b = assign_ok(r, 40);
    kvs_ring_alloc_t c = assign_ok(r, 40); /* round 1 at 0 */
    assert_wm(free_ok(r, b.id), 0, 0);     /* a is still the oldest */
    assert_wm(free_ok(r, a.id), 1, 0);     /* now c */
    kvs_ring_alloc_t d = assign_ok(r, 10);
    assert_int_equal(d.round, 1);
    assert_int_equal(d.offset, 40);
    assert_wm(free_ok(r, c.id), 1, 40);
    assert_wm(free_ok(r, d.id), 2, 0); /* empty: restart */
    assert_int_equal(kvs_ring_free(r, d.id, NULL), KVS_ENOENT);
    assert_wm(kvs_ring_watermark(r), 2, 0);
    kvs_ring_destroy(r);
}

/* The spec §6 deadlock case, which the restart avoids. */
static void test_ring_empty_ring_restarts(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 4);
    kvs_ring_alloc_t a = assign_ok(r, 60);
    kvs_watermark_t wm = free_ok(r, a.id);
    assert_wm(wm, 1, 0);
    kvs_ring_alloc_t b = assign_ok(r, 70);
    assert_int_equal(b.round, 1);
    assert_int_equal(b.offset, 0);
    assert_int_equal(b.end, 70);
    assert_true(kvs_ring_ready(wm, b.round, b.end));
    kvs_ring_destroy(r);
}

static void test_ring_oversized(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 4);
    kvs_ring_alloc_t a = assign_ok(r, 30);
    kvs_ring_alloc_t x;
    assert_int_equal(kvs_ring_assign(r, 101, &x), KVS_EOVERSIZED);
    assert_int_equal(kvs_ring_assign(r, UINT64_MAX, &x), KVS_EOVERSIZED);
    assert_int_equal(kvs_ring_live_count(r), 1); /* unchanged */
    assert_int_equal(kvs_ring_live_bytes(r), 30);
    kvs_ring_alloc_t b = assign_ok(r, 100); /* the whole ring: wraps */
    assert_int_equal(b.round, 1);
    assert_int_equal(b.offset, 0);
    assert_int_equal(b.end, 100);
    free_ok(r, a.id);
    free_ok(r, b.id);
    kvs_ring_destroy(r);
}

static void test_ring_zero_length_is_invalid(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 4);
    kvs_ring_alloc_t a;
    assert_int_equal(kvs_ring_assign(r, 0, &a), KVS_EINVAL);
    assert_int_equal(kvs_ring_assign(r, 1, NULL), KVS_EINVAL);
    assert_int_equal(kvs_ring_assign(NULL, 1, &a), KVS_EINVAL);
    assert_int_equal(kvs_ring_free(NULL, 1, NULL), KVS_EINVAL);
    assert_int_equal(kvs_ring_live_count(r), 0);
    assert_int_equal(assign_ok(r, 1).offset, 0);
    kvs_ring_destroy(r);
}

static void test_ring_max_live_exceeded(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 3);
    kvs_ring_alloc_t a[3];
    for (int i = 0; i < 3; i++)
        a[i] = assign_ok(r, 10);
    kvs_ring_alloc_t x;
    assert_int_equal(kvs_ring_assign(r, 10, &x), KVS_ERING_LIVE);
    assert_int_equal(kvs_ring_live_count(r), 3);
    assert_int_equal(kvs_ring_live_bytes(r), 30);
    free_ok(r, a[1].id);
    kvs_ring_alloc_t b = assign_ok(r, 10);
    assert_int_equal(b.offset, 30); /* the failed assign moved nothing */
    assert_int_equal(kvs_ring_live_count(r), 3);
    kvs_ring_destroy(r);
}

static void test_ring_double_free_and_garbage_id(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 4);
    kvs_ring_alloc_t a = assign_ok(r, 10);
    kvs_ring_alloc_t b = assign_ok(r, 10);
    kvs_watermark_t wm = {.round = 77, .offset = 77};
    assert_int_equal(kvs_ring_free(r, 0, &wm), KVS_ENOENT);
    assert_int_equal(kvs_ring_free(r, UINT64_MAX, &wm), KVS_ENOENT);
    assert_int_equal(kvs_ring_free(r, a.id ^ ((uint64_t)1 << 40), &wm), KVS_ENOENT);
    assert_int_equal(kvs_ring_free(r, (a.id & ~(uint64_t)UINT32_MAX) | 4, &wm),
                     KVS_ENOENT); /* slot index past max_live */
    assert_wm(wm, 77, 77);        /* not written on failure */
    free_ok(r, a.id);
    assert_int_equal(kvs_ring_free(r, a.id, &wm), KVS_ENOENT);
    assert_wm(wm, 77, 77);
    assert_int_equal(kvs_ring_live_count(r), 1);
    assert_int_equal(kvs_ring_live_bytes(r), 10);
    assert_wm(kvs_ring_watermark(r), 0, 10);
    free_ok(r, b.id);
    kvs_ring_destroy(r);
}

static void test_ring_stale_id_of_reused_slot(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(100, 1); /* one slot: every assign reuses it */
    kvs_ring_alloc_t a = assign_ok(r, 10);
    free_ok(r, a.id);
    kvs_ring_alloc_t b = assign_ok(r, 20);
    assert_true(a.id != b.id);
    assert_int_equal(kvs_ring_free(r, a.id, NULL), KVS_ENOENT);
    assert_int_equal(kvs_ring_live_count(r), 1);
    assert_int_equal(kvs_ring_free(r, b.id, NULL), KVS_OK);
    kvs_ring_destroy(r);
}

static void test_ring_ready_truth_table(void **state)
{
    (void)state;
    kvs_watermark_t wm = {.round = 3, .offset = 50};
    /* round 0 is always ready, whatever the watermark */
    assert_true(kvs_ring_ready((kvs_watermark_t){0, 0}, 0, UINT64_MAX));
    assert_true(kvs_ring_ready(wm, 0, 1000));
    /* r - 1 < wr */
    assert_true(kvs_ring_ready(wm, 1, 1000));
    assert_true(kvs_ring_ready(wm, 3, 1000));
    /* r - 1 == wr: ready up to the watermark offset */
    assert_true(kvs_ring_ready(wm, 4, 0));
    assert_true(kvs_ring_ready(wm, 4, 50));
    assert_false(kvs_ring_ready(wm, 4, 51));
    /* r - 1 > wr */
    assert_false(kvs_ring_ready(wm, 5, 1));
    assert_false(kvs_ring_ready(wm, UINT64_MAX, 1));
    /* the initial watermark (0, 0) */
    assert_false(kvs_ring_ready((kvs_watermark_t){0, 0}, 1, 1));
    assert_true(kvs_ring_ready((kvs_watermark_t){0, 0}, 1, 0));
    /* no unsigned wrap at the top */
    wm = (kvs_watermark_t){.round = UINT64_MAX, .offset = 5};
    assert_true(kvs_ring_ready(wm, UINT64_MAX, 1000));
}

static void test_ring_live_bytes_and_count(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(1000, 8);
    assert_int_equal(kvs_ring_live_count(r), 0);
    assert_int_equal(kvs_ring_live_bytes(r), 0);
    kvs_ring_alloc_t a = assign_ok(r, 100);
    kvs_ring_alloc_t b = assign_ok(r, 250);
    kvs_ring_alloc_t c = assign_ok(r, 900); /* wraps, overlaps a and b */
    assert_int_equal(kvs_ring_live_count(r), 3);
    assert_int_equal(kvs_ring_live_bytes(r), 1250);
    free_ok(r, b.id);
    assert_int_equal(kvs_ring_live_count(r), 2);
    assert_int_equal(kvs_ring_live_bytes(r), 1000);
    free_ok(r, a.id);
    free_ok(r, c.id);
    assert_int_equal(kvs_ring_live_count(r), 0);
    assert_int_equal(kvs_ring_live_bytes(r), 0);
    kvs_ring_destroy(r);
}

static void test_ring_create_argument_errors(void **state)
{
    (void)state;
    kvs_ring_t *r = (kvs_ring_t *)&r; /* any non-NULL value */
    assert_int_equal(kvs_ring_create(0, 4, &r), KVS_EINVAL);
    assert_null(r); /* a failed create leaves *out NULL */
    assert_int_equal(kvs_ring_create(100, 0, &r), KVS_EINVAL);
    assert_null(r);
    assert_int_equal(kvs_ring_create(100, 4, NULL), KVS_EINVAL);
    assert_int_equal(kvs_ring_create(UINT64_MAX, 2, &r), KVS_OK);
    assert_int_equal(kvs_ring_size_bytes(r), UINT64_MAX);
    /* live_bytes cannot count past 2^64 - 1 of overcommitted regions */
    kvs_ring_alloc_t a = assign_ok(r, UINT64_MAX);
    kvs_ring_alloc_t b;
    assert_int_equal(kvs_ring_assign(r, 1, &b), KVS_ERANGE);
    assert_int_equal(kvs_ring_live_count(r), 1);
    free_ok(r, a.id);
    kvs_ring_destroy(r);
}

static void test_ring_destroy_null(void **state)
{
    (void)state;
    kvs_ring_destroy(NULL);
}

/* ---- reference model ---------------------------------------------------- */

#define MODEL_SIZE_BYTES 1000
#define MODEL_MAX_LIVE 16
#define MODEL_STEPS 50000

typedef struct model {
    uint64_t round, head;
    kvs_watermark_t wm;
    uint32_t n;                        /* live allocations ... */
    kvs_ring_alloc_t live[MODEL_MAX_LIVE]; /* ... in assign order */
    uint64_t len[MODEL_MAX_LIVE];
} model_t;

static kvs_ring_alloc_t model_assign(model_t *m, uint64_t len_bytes)
{
    kvs_ring_alloc_t a = {.offset = m->head, .round = m->round};
    if (len_bytes > MODEL_SIZE_BYTES - m->head) {
        a.round = ++m->round;
        a.offset = 0;
    }
    a.end = a.offset + len_bytes;
    m->head = a.end;
    m->live[m->n] = a;
    m->len[m->n++] = len_bytes;
    return a;
}

static void model_free(model_t *m, uint32_t k)
{
    for (uint32_t i = k; i + 1 < m->n; i++) {
        m->live[i] = m->live[i + 1];
        m->len[i] = m->len[i + 1];
    }
    m->n--;
    if (m->n > 0) {
        m->wm = (kvs_watermark_t){m->live[0].round, m->live[0].offset};
    } else {
        m->head = 0;
        m->wm = (kvs_watermark_t){++m->round, 0};
    }
}

#define MODEL_CHECK(cond)                                                      \
    do {                                                                       \
        if (!(cond))                                                           \
            fail_msg("seed %llu step %u: %s", (unsigned long long)seed, step,  \
                     #cond);                                                   \
    } while (0)

static void test_ring_watermark_monotonic_random(void **state)
{
    (void)state;
    const uint64_t seed = 0x9e3779b97f4a7c15ull;
    uint64_t rng = seed;
    kvs_ring_t *r = ring_new(MODEL_SIZE_BYTES, MODEL_MAX_LIVE);
    model_t m = {0};
    kvs_watermark_t prev = {0, 0};
    uint32_t frees = 0, wraps = 0, full = 0;
    for (uint32_t step = 0; step < MODEL_STEPS; step++) {
        uint64_t x = xorshift64(&rng);
        bool do_assign = m.n == 0 || x % 8 < 4;
        if (do_assign) {
            /* mostly small, sometimes large, rarely the whole ring */
            uint64_t len = x % 16 == 0 ? MODEL_SIZE_BYTES
                           : x % 4 == 0 ? 1 + (x >> 8) % MODEL_SIZE_BYTES
                                        : 1 + (x >> 8) % 200;
            kvs_ring_alloc_t a;
            int rc = kvs_ring_assign(r, len, &a);
            if (m.n == MODEL_MAX_LIVE) {
                MODEL_CHECK(rc == KVS_ERING_LIVE);
                full++;
            } else {
                uint64_t round_before = m.round;
                kvs_ring_alloc_t e = model_assign(&m, len);
                MODEL_CHECK(rc == KVS_OK);
                MODEL_CHECK(a.offset == e.offset && a.round == e.round &&
                            a.end == e.end);
                m.live[m.n - 1].id = a.id;
                wraps += e.round != round_before;
            }
        } else {
            uint32_t k = (uint32_t)((x >> 8) % m.n);
            kvs_watermark_t wm;
            MODEL_CHECK(kvs_ring_free(r, m.live[k].id, &wm) == KVS_OK);
            MODEL_CHECK(kvs_ring_free(r, m.live[k].id, NULL) == KVS_ENOENT);
            model_free(&m, k);
            MODEL_CHECK(wm.round == m.wm.round && wm.offset == m.wm.offset);
            MODEL_CHECK(wm.round > prev.round ||
                        (wm.round == prev.round && wm.offset >= prev.offset));
            prev = wm;
            frees++;
        }
        uint64_t bytes = 0;
        for (uint32_t i = 0; i < m.n; i++)
            bytes += m.len[i];
        MODEL_CHECK(kvs_ring_live_count(r) == m.n);
        MODEL_CHECK(kvs_ring_live_bytes(r) == bytes);
        kvs_watermark_t now = kvs_ring_watermark(r);
        MODEL_CHECK(now.round == m.wm.round && now.offset == m.wm.offset);
        /* liveness: the oldest round is ready; safety: a ready region
         * overlaps no live region of an older round */
        for (uint32_t i = 0; i < m.n; i++) {
            const kvs_ring_alloc_t *a = &m.live[i];
            bool ready = kvs_ring_ready(now, a->round, a->end);
            MODEL_CHECK(ready || a->round != m.live[0].round);
            for (uint32_t j = 0; ready && j < i; j++) {
                const kvs_ring_alloc_t *b = &m.live[j];
                MODEL_CHECK(b->round == a->round || b->end <= a->offset ||
                            a->end <= b->offset);
            }
        }
    }
    /* the run went through every branch many times */
    assert_true(frees > MODEL_STEPS / 4);
    assert_true(wraps > 1000);
    assert_true(full > 100);
    kvs_ring_destroy(r);
}

/* ---- threads ------------------------------------------------------------ */

#define HAMMER_ITERS 20000
#define HAMMER_HELD 8

typedef struct hammer {
    kvs_ring_t *ring;
    uint64_t seed;
    int failures;
} hammer_t;

static void *hammer_run(void *arg)
{
    hammer_t *h = arg;
    uint64_t rng = h->seed;
    uint64_t held[HAMMER_HELD];
    uint32_t n = 0;
    kvs_watermark_t prev = {0, 0};
    for (uint32_t i = 0; i < HAMMER_ITERS; i++) {
        uint64_t x = xorshift64(&rng);
        if (n < HAMMER_HELD && (n == 0 || x % 2 == 0)) {
            kvs_ring_alloc_t a;
            if (kvs_ring_assign(h->ring, 1 + (x >> 8) % 300, &a) != KVS_OK)
                h->failures++;
            else
                held[n++] = a.id;
        } else {
            uint32_t k = (uint32_t)((x >> 8) % n);
            kvs_watermark_t wm;
            if (kvs_ring_free(h->ring, held[k], &wm) != KVS_OK)
                h->failures++;
            /* frees are serialised, so one thread sees the watermark rise */
            if (wm.round < prev.round ||
                (wm.round == prev.round && wm.offset < prev.offset))
                h->failures++;
            prev = wm;
            held[k] = held[--n];
        }
    }
    while (n > 0) {
        if (kvs_ring_free(h->ring, held[--n], NULL) != KVS_OK)
            h->failures++;
    }
    return NULL;
}

static void test_ring_two_threads_hammer(void **state)
{
    (void)state;
    kvs_ring_t *r = ring_new(1000, 2 * HAMMER_HELD);
    hammer_t h[2] = {{.ring = r, .seed = 12345}, {.ring = r, .seed = 67890}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, hammer_run, &h[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(h[0].failures, 0);
    assert_int_equal(h[1].failures, 0);
    assert_int_equal(kvs_ring_live_count(r), 0);
    assert_int_equal(kvs_ring_live_bytes(r), 0);
    kvs_watermark_t wm = kvs_ring_watermark(r);
    assert_int_equal(wm.offset, 0); /* the last free emptied it: restart */
    assert_true(wm.round > 0);
    kvs_ring_alloc_t a = assign_ok(r, 10);
    assert_int_equal(a.round, wm.round);
    assert_int_equal(a.offset, 0);
    kvs_ring_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_first_assign_at_zero),
        cmocka_unit_test(test_ring_sequential_assigns),
        cmocka_unit_test(test_ring_wraps_at_end),
        cmocka_unit_test(test_ring_exact_fit_does_not_wrap),
        cmocka_unit_test(test_ring_watermark_is_oldest_live),
        cmocka_unit_test(test_ring_empty_ring_restarts),
        cmocka_unit_test(test_ring_oversized),
        cmocka_unit_test(test_ring_zero_length_is_invalid),
        cmocka_unit_test(test_ring_max_live_exceeded),
        cmocka_unit_test(test_ring_double_free_and_garbage_id),
        cmocka_unit_test(test_ring_stale_id_of_reused_slot),
        cmocka_unit_test(test_ring_ready_truth_table),
        cmocka_unit_test(test_ring_live_bytes_and_count),
        cmocka_unit_test(test_ring_create_argument_errors),
        cmocka_unit_test(test_ring_destroy_null),
        cmocka_unit_test(test_ring_watermark_monotonic_random),
        cmocka_unit_test(test_ring_two_threads_hammer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
