/*
 * test_sim_engine.c - unit tests of the simulator's event engine
 * (sim/engine.c): time order, scheduling order among equal times, events
 * that schedule events, cancellation and stale ids, run() bounds and stop(),
 * argument checks, pool growth, and determinism of a randomized workload
 * (same seed -> same digest and counts; another seed -> another digest).
 * Every seed is fixed and printed when a check on it fails.
 */
#include "engine.h"

#include <kvstage/kvstage.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

/* ---- helpers ------------------------------------------------------------ */

/* What ran, in order. */
typedef struct trace {
    uint64_t *args;
    uint64_t *times_ns;
    size_t len;
    size_t cap;
} trace_t;

static void trace_init(trace_t *t, size_t cap)
{
    t->args = calloc(cap, sizeof(*t->args));
    t->times_ns = calloc(cap, sizeof(*t->times_ns));
    assert_non_null(t->args);
    assert_non_null(t->times_ns);
    t->len = 0;
    t->cap = cap;
}

static void trace_fini(trace_t *t)
{
    free(t->args);
    free(t->times_ns);
}

static void on_record(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    trace_t *t = ctx;
    assert_true(t->len < t->cap);
    if (t->len > 0)
        assert_true(sim_engine_now_ns(eng) >= t->times_ns[t->len - 1]);
    t->args[t->len] = arg;
    t->times_ns[t->len] = sim_engine_now_ns(eng);
    t->len++;
}

static sim_engine_t *engine_new(uint64_t seed, uint32_t initial_events)
{
    sim_engine_t *eng = NULL;
    assert_int_equal(sim_engine_create(seed, initial_events, &eng), KVS_OK);
    assert_non_null(eng);
    assert_int_equal(sim_engine_now_ns(eng), 0);
    assert_int_equal(sim_engine_seed(eng), seed);
    assert_int_equal(sim_engine_pending(eng), 0);
    assert_int_equal(sim_engine_events_run(eng), 0);
    return eng;
}

static uint64_t at_ok(sim_engine_t *eng, uint64_t at_ns, sim_event_fn fn, void *ctx,
                      uint64_t arg)
{
    uint64_t id = 0;
    assert_int_equal(sim_engine_at(eng, at_ns, fn, ctx, arg, &id), KVS_OK);
    assert_int_not_equal(id, 0);
    return id;
}

/* Fisher-Yates with the simulator's own PRNG. */
static void shuffle(uint64_t *v, size_t n, uint64_t seed)
{
    sim_rng_t rng;
    sim_rng_init(&rng, seed, 0);
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)sim_rng_below(&rng, i);
        uint64_t tmp = v[i - 1];
        v[i - 1] = v[j];
        v[j] = tmp;
    }
}

/* ---- create / destroy / arguments -------------------------------------- */

static void test_sim_engine_create_checks_arguments(void **state)
{
    (void)state;
    static int dummy;
    sim_engine_t *eng = (sim_engine_t *)&dummy; /* must be reset on failure */
    assert_int_equal(sim_engine_create(1, 0, &eng), KVS_EINVAL);
    assert_null(eng);
    assert_int_equal(sim_engine_create(1, 8, NULL), KVS_EINVAL);
    sim_engine_destroy(NULL);

    eng = engine_new(77, 1);
    assert_int_equal(sim_engine_step(eng), 0);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 0);
    assert_int_equal(sim_engine_digest(eng), 0);
    sim_engine_destroy(eng);
}

static void test_sim_engine_rejects_past_and_null_fn(void **state)
{
    (void)state;
    trace_t t;
    trace_init(&t, 8);
    sim_engine_t *eng = engine_new(1, 4);
    at_ok(eng, 100, on_record, &t, 1);
    assert_int_equal(sim_engine_step(eng), 1);
    assert_int_equal(sim_engine_now_ns(eng), 100);

    uint64_t id = 12345;
    assert_int_equal(sim_engine_at(eng, 99, on_record, &t, 2, &id), KVS_EINVAL);
    assert_int_equal(id, 12345); /* untouched on failure */
    assert_int_equal(sim_engine_at(eng, 0, on_record, &t, 2, NULL), KVS_EINVAL);
    assert_int_equal(sim_engine_at(eng, 200, NULL, &t, 2, NULL), KVS_EINVAL);
    assert_int_equal(sim_engine_after(eng, 5, NULL, &t, 2, NULL), KVS_EINVAL);
    /* now + delay overflows: refused, not wrapped into the past. */
    assert_int_equal(sim_engine_after(eng, UINT64_MAX - 99, on_record, &t, 3, NULL),
                     KVS_EINVAL);
    assert_int_equal(sim_engine_after(eng, UINT64_MAX, on_record, &t, 3, NULL), KVS_EINVAL);
    assert_int_equal(sim_engine_pending(eng), 0);

    /* The edges that are allowed: exactly now, and exactly UINT64_MAX. */
    assert_int_equal(sim_engine_at(eng, 100, on_record, &t, 4, NULL), KVS_OK);
    assert_int_equal(sim_engine_after(eng, UINT64_MAX - 100, on_record, &t, 5, NULL), KVS_OK);
    assert_int_equal(sim_engine_pending(eng), 2);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 2);
    assert_int_equal(sim_engine_now_ns(eng), UINT64_MAX);
    assert_int_equal(t.len, 3);
    assert_int_equal(t.args[1], 4);
    assert_int_equal(t.args[2], 5);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

/* ---- ordering ----------------------------------------------------------- */

static void test_sim_engine_runs_in_time_order(void **state)
{
    (void)state;
    enum { N = 2000 };
    const uint64_t seed = 0x7155;
    trace_t t;
    trace_init(&t, N);
    sim_engine_t *eng = engine_new(seed, 64);
    sim_rng_t rng;
    sim_engine_rng(eng, 1, &rng);
    uint64_t when_ns[N];
    for (uint64_t i = 0; i < N; i++) {
        when_ns[i] = sim_rng_below(&rng, 5000); /* many ties on purpose */
        at_ok(eng, when_ns[i], on_record, &t, i);
    }
    assert_int_equal(sim_engine_pending(eng), N);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), N);
    assert_int_equal(t.len, N);
    for (size_t k = 0; k < N; k++) {
        uint64_t i = t.args[k];
        if (t.times_ns[k] != when_ns[i])
            print_error("seed %#llx: event %llu ran at %llu, scheduled at %llu\n",
                        (unsigned long long)seed, (unsigned long long)i,
                        (unsigned long long)t.times_ns[k], (unsigned long long)when_ns[i]);
        assert_int_equal(t.times_ns[k], when_ns[i]);
        if (k > 0) {
            assert_true(t.times_ns[k - 1] <= t.times_ns[k]);
            /* Ties keep scheduling order, and arg i was scheduled i-th. */
            if (t.times_ns[k - 1] == t.times_ns[k])
                assert_true(t.args[k - 1] < t.args[k]);
        }
    }
    assert_int_equal(sim_engine_pending(eng), 0);
    assert_int_equal(sim_engine_events_run(eng), N);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

static void test_sim_engine_equal_times_run_in_scheduling_order(void **state)
{
    (void)state;
    enum { N = 1000 };
    uint64_t order[N];
    for (uint64_t i = 0; i < N; i++)
        order[i] = i;
    shuffle(order, N, 0xabc); /* args scrambled so address or arg order cannot pass */

    trace_t t;
    trace_init(&t, N);
    sim_engine_t *eng = engine_new(3, 16);
    for (size_t i = 0; i < N; i++)
        at_ok(eng, 500, on_record, &t, order[i]);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), N);
    assert_int_equal(t.len, N);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(t.args[i], order[i]);
        assert_int_equal(t.times_ns[i], 500);
    }
    sim_engine_destroy(eng);
    trace_fini(&t);
}

/* An event that schedules: one at the current time, one later, and cancels
 * a queued same-time event given by its id. */
typedef struct spawner {
    trace_t *t;
    uint64_t victim_id;
} spawner_t;

static void on_spawn(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    spawner_t *sp = ctx;
    on_record(eng, sp->t, arg);
    assert_int_equal(sim_engine_after(eng, 0, on_record, sp->t, 100 + arg, NULL), KVS_OK);
    assert_int_equal(sim_engine_after(eng, 5, on_record, sp->t, 200 + arg, NULL), KVS_OK);
    if (sp->victim_id != 0)
        assert_int_equal(sim_engine_cancel(eng, sp->victim_id), KVS_OK);
}

static void test_sim_engine_event_schedules_events(void **state)
{
    (void)state;
    trace_t t;
    trace_init(&t, 16);
    spawner_t sp = {.t = &t, .victim_id = 0};
    sim_engine_t *eng = engine_new(5, 1); /* every new event grows or reuses */

    at_ok(eng, 10, on_spawn, &sp, 1);
    at_ok(eng, 10, on_record, &t, 2);
    sp.victim_id = at_ok(eng, 10, on_record, &t, 3); /* cancelled by event 1 */
    at_ok(eng, 12, on_record, &t, 4);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 5);

    /* 101 is at the current time but after 2, which was queued before it. */
    const uint64_t want_args[] = {1, 2, 101, 4, 201};
    const uint64_t want_ns[] = {10, 10, 10, 12, 15};
    assert_int_equal(t.len, 5);
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(t.args[i], want_args[i]);
        assert_int_equal(t.times_ns[i], want_ns[i]);
    }
    assert_int_equal(sim_engine_now_ns(eng), 15);
    assert_int_equal(sim_engine_pending(eng), 0);
    assert_int_equal(sim_engine_events_run(eng), 5);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

/* Re-arms itself arg more times: runs in a pool of one slot because the
 * slot is freed before the event's function is called. */
static void on_rearm(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    uint64_t *count = ctx;
    (*count)++;
    if (arg > 0)
        assert_int_equal(sim_engine_after(eng, 3, on_rearm, ctx, arg - 1, NULL), KVS_OK);
}

static void test_sim_engine_event_reuses_its_own_slot(void **state)
{
    (void)state;
    uint64_t count = 0;
    sim_engine_t *eng = engine_new(9, 1);
    uint64_t first_id = at_ok(eng, 0, on_rearm, &count, 999);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 1000);
    assert_int_equal(count, 1000);
    assert_int_equal(sim_engine_now_ns(eng), 999 * 3);
    /* The first id's slot was reused 999 times: long stale. */
    assert_int_equal(sim_engine_cancel(eng, first_id), KVS_ENOENT);
    sim_engine_destroy(eng);
}

/* ---- cancel ------------------------------------------------------------- */

static void test_sim_engine_cancelled_events_never_run(void **state)
{
    (void)state;
    enum { N = 100 };
    trace_t t;
    trace_init(&t, N);
    sim_engine_t *eng = engine_new(11, 8);
    uint64_t ids[N];
    for (uint64_t i = 0; i < N; i++)
        ids[i] = at_ok(eng, 1000 - i, on_record, &t, i);
    for (size_t i = 0; i < N; i += 3)
        assert_int_equal(sim_engine_cancel(eng, ids[i]), KVS_OK);
    const uint64_t cancelled = (N + 2) / 3;
    assert_int_equal(sim_engine_pending(eng), N - cancelled);
    /* Cancelling twice is refused and does not count twice. */
    for (size_t i = 0; i < N; i += 3)
        assert_int_equal(sim_engine_cancel(eng, ids[i]), KVS_ENOENT);
    assert_int_equal(sim_engine_pending(eng), N - cancelled);

    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), N - cancelled);
    assert_int_equal(t.len, N - cancelled);
    for (size_t k = 0; k < t.len; k++)
        assert_int_not_equal(t.args[k] % 3, 0);
    assert_int_equal(sim_engine_pending(eng), 0);
    assert_int_equal(sim_engine_events_run(eng), N - cancelled);
    /* i = 99 (at 901) and i = 0 (at 1000) were cancelled: the first event
     * ran was i = 98, the last i = 1. */
    assert_int_equal(t.times_ns[0], 902);
    assert_int_equal(sim_engine_now_ns(eng), 999);

    /* Ids of events that ran are refused. */
    for (size_t i = 1; i < N; i += 3)
        assert_int_equal(sim_engine_cancel(eng, ids[i]), KVS_ENOENT);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

static void test_sim_engine_cancel_refuses_stale_and_unknown_ids(void **state)
{
    (void)state;
    trace_t t;
    trace_init(&t, 8);
    sim_engine_t *eng = engine_new(13, 1);
    uint64_t old_id = at_ok(eng, 5, on_record, &t, 1);
    assert_int_equal(sim_engine_cancel(eng, old_id), KVS_OK);
    assert_int_equal(sim_engine_pending(eng), 0);
    /* The cancelled entry still holds the only slot until it surfaces. */
    assert_int_equal(sim_engine_step(eng), 0);
    /* Now the slot is free and is taken again by a new event. */
    uint64_t new_id = at_ok(eng, 6, on_record, &t, 2);
    assert_int_equal((uint32_t)new_id, (uint32_t)old_id); /* same slot */
    assert_int_not_equal(new_id, old_id);                 /* new generation */
    assert_int_equal(sim_engine_cancel(eng, old_id), KVS_ENOENT);
    assert_int_equal(sim_engine_pending(eng), 1);

    assert_int_equal(sim_engine_cancel(eng, 0), KVS_ENOENT);
    assert_int_equal(sim_engine_cancel(eng, UINT64_MAX), KVS_ENOENT);
    assert_int_equal(sim_engine_cancel(eng, new_id + 1), KVS_ENOENT); /* slot 1: none */
    assert_int_equal(sim_engine_cancel(eng, (uint32_t)new_id), KVS_ENOENT); /* gen 0 */
    assert_int_equal(sim_engine_cancel(eng, new_id + (UINT64_C(1) << 32)), KVS_ENOENT);

    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 1);
    assert_int_equal(t.len, 1);
    assert_int_equal(t.args[0], 2);
    assert_int_equal(sim_engine_cancel(eng, new_id), KVS_ENOENT); /* already ran */
    sim_engine_destroy(eng);
    trace_fini(&t);
}

/* Cancels itself (already running: refused) and the id in *ctx. */
static void on_cancel_self(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    uint64_t *ids = ctx;
    assert_int_equal(sim_engine_cancel(eng, ids[0]), KVS_ENOENT);
    assert_int_equal(sim_engine_cancel(eng, ids[1]), KVS_OK);
}

static void test_sim_engine_event_cancels_itself_and_others(void **state)
{
    (void)state;
    trace_t t;
    trace_init(&t, 8);
    uint64_t ids[2];
    sim_engine_t *eng = engine_new(17, 4);
    ids[0] = at_ok(eng, 10, on_cancel_self, ids, 0);
    ids[1] = at_ok(eng, 10, on_record, &t, 1);
    at_ok(eng, 11, on_record, &t, 2);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 2);
    assert_int_equal(t.len, 1);
    assert_int_equal(t.args[0], 2);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

/* ---- run bounds and stop ------------------------------------------------ */

static void test_sim_engine_run_stops_at_until(void **state)
{
    (void)state;
    trace_t t;
    trace_init(&t, 8);
    sim_engine_t *eng = engine_new(19, 4);
    for (uint64_t i = 1; i <= 4; i++)
        at_ok(eng, i * 10, on_record, &t, i);
    assert_int_equal(sim_engine_run(eng, 25, 0), 2);
    assert_int_equal(sim_engine_now_ns(eng), 20); /* last event, not until */
    assert_int_equal(sim_engine_pending(eng), 2);
    assert_int_equal(sim_engine_run(eng, 25, 0), 0);
    assert_int_equal(sim_engine_run(eng, 30, 0), 1); /* until is inclusive */
    assert_int_equal(sim_engine_now_ns(eng), 30);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 1);
    assert_int_equal(sim_engine_now_ns(eng), 40);
    assert_int_equal(t.len, 4);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(t.args[i], i + 1);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

static void test_sim_engine_run_stops_at_max_events(void **state)
{
    (void)state;
    trace_t t;
    trace_init(&t, 16);
    sim_engine_t *eng = engine_new(23, 4);
    uint64_t ids[10];
    for (uint64_t i = 0; i < 10; i++)
        ids[i] = at_ok(eng, 7, on_record, &t, i);
    /* Cancelled events do not count against max_events. */
    assert_int_equal(sim_engine_cancel(eng, ids[0]), KVS_OK);
    assert_int_equal(sim_engine_cancel(eng, ids[1]), KVS_OK);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 3), 3);
    assert_int_equal(t.len, 3);
    assert_int_equal(t.args[0], 2);
    assert_int_equal(sim_engine_pending(eng), 5);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 100), 5);
    assert_int_equal(sim_engine_events_run(eng), 8);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

static void on_stop_at(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    on_record(eng, ctx, arg);
    if (arg == 3)
        sim_engine_stop(eng);
}

static void test_sim_engine_stop_from_inside_an_event(void **state)
{
    (void)state;
    trace_t t;
    trace_init(&t, 16);
    sim_engine_t *eng = engine_new(29, 4);
    for (uint64_t i = 0; i < 10; i++)
        at_ok(eng, 100 + i, on_stop_at, &t, i);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 4);
    assert_int_equal(sim_engine_now_ns(eng), 103);
    assert_int_equal(sim_engine_pending(eng), 6);
    /* The flag is cleared when run starts again. */
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 6);
    assert_int_equal(t.len, 10);
    /* A stop before run is forgotten by run. */
    at_ok(eng, 200, on_record, &t, 50);
    sim_engine_stop(eng);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 1);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

/* ---- growth ------------------------------------------------------------- */

static void test_sim_engine_grows_beyond_initial_capacity(void **state)
{
    (void)state;
    enum { N = 10000 };
    const uint64_t seed = 0x6e0;
    trace_t t;
    trace_init(&t, N);
    sim_engine_t *eng = engine_new(seed, 4);
    sim_rng_t rng;
    sim_engine_rng(eng, 2, &rng);
    uint64_t *when_ns = calloc(N, sizeof(*when_ns));
    uint64_t *ids = calloc(N, sizeof(*ids));
    assert_non_null(when_ns);
    assert_non_null(ids);
    for (uint64_t i = 0; i < N; i++) {
        when_ns[i] = sim_rng_below(&rng, 1000000);
        ids[i] = at_ok(eng, when_ns[i], on_record, &t, i);
    }
    /* Ids handed out before the pool moved still cancel the right event. */
    uint64_t cancelled = 0;
    for (size_t i = 0; i < N; i += 7, cancelled++)
        assert_int_equal(sim_engine_cancel(eng, ids[i]), KVS_OK);
    assert_int_equal(sim_engine_pending(eng), N - cancelled);
    assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), N - cancelled);
    assert_int_equal(t.len, N - cancelled);
    for (size_t k = 0; k < t.len; k++) {
        uint64_t i = t.args[k];
        assert_int_not_equal(i % 7, 0);
        if (t.times_ns[k] != when_ns[i])
            print_error("seed %#llx: event %llu out of place\n", (unsigned long long)seed,
                        (unsigned long long)i);
        assert_int_equal(t.times_ns[k], when_ns[i]);
        if (k > 0) {
            assert_true(t.times_ns[k - 1] <= t.times_ns[k]);
            if (t.times_ns[k - 1] == t.times_ns[k])
                assert_true(t.args[k - 1] < t.args[k]);
        }
    }
    free(ids);
    free(when_ns);
    sim_engine_destroy(eng);
    trace_fini(&t);
}

/* ---- determinism -------------------------------------------------------- */

/* A randomized workload: ACTORS actors, each with its own rng stream, whose
 * events schedule 0-3 more events at random delays (some at delay 0) and now
 * and then cancel a pending one, until a budget of spawns is spent. */
enum { ACTORS = 8, RECENT = 16 };

typedef struct workload {
    sim_rng_t rng[ACTORS];
    uint64_t recent_ids[RECENT]; /* candidates for cancel; may be stale */
    uint64_t spawn_budget;
    uint64_t last_now_ns;
    uint64_t cancel_ok;
    uint64_t cancel_enoent;
} workload_t;

static void on_work(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    workload_t *w = ctx;
    const uint64_t now_ns = sim_engine_now_ns(eng);
    assert_true(now_ns >= w->last_now_ns); /* the clock never goes back */
    w->last_now_ns = now_ns;

    sim_rng_t *rng = &w->rng[arg % ACTORS];
    uint64_t children = sim_rng_below(rng, 4);
    for (uint64_t c = 0; c < children && w->spawn_budget > 0; c++, w->spawn_budget--) {
        uint64_t delay_ns = sim_rng_chance(rng, 1, 8) ? 0 : sim_rng_exp(rng, 1000);
        uint64_t child = sim_rng_below(rng, ACTORS) | (sim_rng_next(rng) << 8);
        uint64_t id = 0;
        assert_int_equal(sim_engine_after(eng, delay_ns, on_work, w, child, &id), KVS_OK);
        w->recent_ids[sim_rng_below(rng, RECENT)] = id;
    }
    if (sim_rng_chance(rng, 1, 10)) {
        int rc = sim_engine_cancel(eng, w->recent_ids[sim_rng_below(rng, RECENT)]);
        assert_true(rc == KVS_OK || rc == KVS_ENOENT);
        if (rc == KVS_OK)
            w->cancel_ok++;
        else
            w->cancel_enoent++;
    }
}

typedef struct outcome {
    uint64_t digest;
    uint64_t events_run;
    uint64_t now_ns;
    uint64_t cancel_ok;
    uint64_t cancel_enoent;
} outcome_t;

static outcome_t run_workload(uint64_t seed, uint32_t initial_events)
{
    workload_t w = {.spawn_budget = 50000};
    sim_engine_t *eng = engine_new(seed, initial_events);
    for (uint64_t a = 0; a < ACTORS; a++) {
        sim_engine_rng(eng, 100 + a, &w.rng[a]);
        at_ok(eng, a, on_work, &w, a);
    }
    /* Run in slices to exercise until/max bounds on the way. */
    uint64_t total = 0;
    while (sim_engine_pending(eng) > 0) {
        uint64_t before_ns = sim_engine_now_ns(eng);
        uint64_t ran = sim_engine_run(eng, before_ns + 5000, 777);
        if (ran == 0) /* a gap longer than the slice: jump to the next event */
            ran = (uint64_t)sim_engine_step(eng);
        total += ran;
        assert_true(sim_engine_now_ns(eng) >= before_ns);
    }
    /* Cancelled entries may remain in the queue; a step drops them. */
    assert_int_equal(sim_engine_step(eng), 0);
    assert_int_equal(total, sim_engine_events_run(eng));
    outcome_t o = {
        .digest = sim_engine_digest(eng),
        .events_run = sim_engine_events_run(eng),
        .now_ns = sim_engine_now_ns(eng),
        .cancel_ok = w.cancel_ok,
        .cancel_enoent = w.cancel_enoent,
    };
    sim_engine_destroy(eng);
    return o;
}

static void assert_same_outcome(uint64_t seed, outcome_t a, outcome_t b)
{
    if (a.digest != b.digest || a.events_run != b.events_run || a.now_ns != b.now_ns)
        print_error("seed %#llx: runs differ: digest %#llx vs %#llx, events %llu vs %llu\n",
                    (unsigned long long)seed, (unsigned long long)a.digest,
                    (unsigned long long)b.digest, (unsigned long long)a.events_run,
                    (unsigned long long)b.events_run);
    assert_int_equal(a.digest, b.digest);
    assert_int_equal(a.events_run, b.events_run);
    assert_int_equal(a.now_ns, b.now_ns);
    assert_int_equal(a.cancel_ok, b.cancel_ok);
    assert_int_equal(a.cancel_enoent, b.cancel_enoent);
}

static void test_sim_engine_same_seed_same_digest(void **state)
{
    (void)state;
    const uint64_t seed = 0x5eed0001;
    outcome_t a = run_workload(seed, 1024);
    outcome_t b = run_workload(seed, 1024);
    assert_same_outcome(seed, a, b);
    /* The workload did real work, cancels included. */
    assert_true(a.events_run > 10000);
    assert_true(a.cancel_ok > 0);
    assert_true(a.cancel_enoent > 0);
    assert_int_not_equal(a.digest, 0);
    /* Pool size and growth (slot indices) do not change the order. */
    outcome_t c = run_workload(seed, 1);
    assert_same_outcome(seed, a, c);
}

static void test_sim_engine_other_seed_other_digest(void **state)
{
    (void)state;
    const uint64_t seed = 0x5eed0001;
    outcome_t a = run_workload(seed, 64);
    for (uint64_t other = seed + 1; other <= seed + 4; other++) {
        outcome_t b = run_workload(other, 64);
        if (a.digest == b.digest)
            print_error("seeds %#llx and %#llx gave the same digest %#llx\n",
                        (unsigned long long)seed, (unsigned long long)other,
                        (unsigned long long)a.digest);
        assert_int_not_equal(a.digest, b.digest);
    }
}

/* The digest depends on order, times and args, not only on the set. */
static void test_sim_engine_digest_is_order_sensitive(void **state)
{
    (void)state;
    uint64_t digests[4];
    const uint64_t args[4][2] = {{1, 2}, {2, 1}, {1, 2}, {1, 3}};
    const uint64_t times[4][2] = {{10, 20}, {10, 20}, {10, 21}, {10, 20}};
    for (size_t k = 0; k < 4; k++) {
        trace_t t;
        trace_init(&t, 4);
        sim_engine_t *eng = engine_new(1, 2);
        at_ok(eng, times[k][0], on_record, &t, args[k][0]);
        at_ok(eng, times[k][1], on_record, &t, args[k][1]);
        assert_int_equal(sim_engine_run(eng, UINT64_MAX, 0), 2);
        digests[k] = sim_engine_digest(eng);
        sim_engine_destroy(eng);
        trace_fini(&t);
    }
    for (size_t i = 0; i < 4; i++)
        for (size_t j = i + 1; j < 4; j++)
            assert_int_not_equal(digests[i], digests[j]);
}

/* The engine hands out the same streams as sim_rng_init(seed, component). */
static void test_sim_engine_rng_streams_follow_seed(void **state)
{
    (void)state;
    sim_engine_t *eng = engine_new(0xfeed, 1);
    sim_rng_t a, b;
    sim_engine_rng(eng, 42, &a);
    sim_rng_init(&b, 0xfeed, 42);
    for (int i = 0; i < 16; i++)
        assert_int_equal(sim_rng_next(&a), sim_rng_next(&b));
    sim_engine_destroy(eng);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_engine_create_checks_arguments),
        cmocka_unit_test(test_sim_engine_rejects_past_and_null_fn),
        cmocka_unit_test(test_sim_engine_runs_in_time_order),
        cmocka_unit_test(test_sim_engine_equal_times_run_in_scheduling_order),
        cmocka_unit_test(test_sim_engine_event_schedules_events),
        cmocka_unit_test(test_sim_engine_event_reuses_its_own_slot),
        cmocka_unit_test(test_sim_engine_cancelled_events_never_run),
        cmocka_unit_test(test_sim_engine_cancel_refuses_stale_and_unknown_ids),
        cmocka_unit_test(test_sim_engine_event_cancels_itself_and_others),
        cmocka_unit_test(test_sim_engine_run_stops_at_until),
        cmocka_unit_test(test_sim_engine_run_stops_at_max_events),
        cmocka_unit_test(test_sim_engine_stop_from_inside_an_event),
        cmocka_unit_test(test_sim_engine_grows_beyond_initial_capacity),
        cmocka_unit_test(test_sim_engine_same_seed_same_digest),
        cmocka_unit_test(test_sim_engine_other_seed_other_digest),
        cmocka_unit_test(test_sim_engine_digest_is_order_sensitive),
        cmocka_unit_test(test_sim_engine_rng_streams_follow_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
