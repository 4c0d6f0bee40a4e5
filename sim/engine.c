/*
 * engine.c - the simulator's discrete-event engine: a virtual clock and an
 * event queue ordered by (at_ns, seq), seq being a 64-bit counter taken when
 * the event is scheduled, so equal times run in scheduling order.
 *
 * It does not know what events do, read the real clock, sleep, make threads
 * or keep global state; randomness is handed out as per-component streams of
 * the engine's seed (rng.h), never drawn here.
 *
 * Layout. Events live in a pool of slots (fn, ctx, arg) with a free list.
 * The queue is a binary min-heap of compact entries (at_ns, seq, slot index):
 * comparisons read only the heap array, and since it holds indices, not
 * pointers, both arrays may move when the pool doubles (realloc, only when
 * full; steady state allocates nothing).
 *
 * Invariants (engine_check asserts the O(1) ones after every change):
 * - every heap entry owns one slot, PENDING or CANCELLED; every other slot is
 *   FREE and on the free list: heap_len + free_len == cap;
 * - pending (scheduled - run - cancelled) is the number of PENDING slots;
 * - heap[0] is the least (at_ns, seq), and at_ns >= now_ns for every entry,
 *   so now_ns never decreases;
 * - an id is (generation << 32) | slot index; the generation is bumped each
 *   time the slot is taken and is never 0, so id 0 is never valid and a stale
 *   id of a reused slot is refused (until that slot is reused 2^32 - 1 more
 *   times). Cancelling marks the slot; the heap drops it lazily when it
 *   surfaces, and only then is the slot freed.
 */
#include "engine.h"

#include <kvstage/kvstage.h>

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#define ENGINE_NIL UINT32_MAX /* no slot; the pool never reaches 2^32 slots */
#define ENGINE_CAP_MAX (UINT32_C(1) << 31)

enum engine_slot_state { SLOT_FREE = 0, SLOT_PENDING, SLOT_CANCELLED };

typedef struct engine_slot {
    sim_event_fn fn;
    void *ctx;
    uint64_t arg;
    uint32_t gen;       /* bumped when taken; part of the id */
    uint32_t next_free; /* free list link while FREE */
    uint8_t state;      /* enum engine_slot_state */
} engine_slot_t;

typedef struct engine_entry {
    uint64_t at_ns;
    uint64_t seq;
    uint32_t slot;
} engine_entry_t;

struct sim_engine {
    uint64_t seed;
    uint64_t now_ns;
    uint64_t next_seq;     /* == events scheduled since create */
    uint64_t events_run;
    uint64_t cancelled;
    uint64_t digest;
    engine_entry_t *heap;  /* cap entries, heap_len used */
    engine_slot_t *slots;  /* cap slots */
    uint32_t heap_len;
    uint32_t cap;
    uint32_t free_first;   /* singly linked through next_free */
    uint32_t free_len;
    bool stopped;
};

static void engine_check(const sim_engine_t *eng)
{
    assert(eng->heap_len <= eng->cap);
    assert((uint64_t)eng->heap_len + eng->free_len == eng->cap);
    assert((eng->free_len == 0) == (eng->free_first == ENGINE_NIL));
    assert(eng->events_run + eng->cancelled <= eng->next_seq);
    assert(eng->next_seq - eng->events_run - eng->cancelled <= eng->heap_len);
    assert(eng->heap_len == 0 || eng->heap[0].at_ns >= eng->now_ns);
    (void)eng;
}

static inline bool engine_before(const engine_entry_t *a, const engine_entry_t *b)
{
    return a->at_ns < b->at_ns || (a->at_ns == b->at_ns && a->seq < b->seq);
}

/* Moves e up from hole i until its parent is not later. */
static void engine_sift_up(engine_entry_t *heap, uint32_t i, engine_entry_t e)
{
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!engine_before(&e, &heap[parent]))
            break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = e;
}

/* Moves e down from hole i of a heap of len entries. */
static void engine_sift_down(engine_entry_t *heap, uint32_t len, uint32_t i, engine_entry_t e)
{
    for (;;) {
        uint32_t child = 2 * i + 1;
        if (child >= len)
            break;
        if (child + 1 < len && engine_before(&heap[child + 1], &heap[child]))
            child++;
        if (!engine_before(&heap[child], &e))
            break;
        heap[i] = heap[child];
        i = child;
    }
    heap[i] = e;
}

/* Removes heap[0]; the caller has read it. */
static void engine_heap_pop(sim_engine_t *eng)
{
    assert(eng->heap_len > 0);
    uint32_t len = --eng->heap_len;
    if (len > 0)
        engine_sift_down(eng->heap, len, 0, eng->heap[len]);
}

static void engine_slot_free(sim_engine_t *eng, uint32_t idx)
{
    engine_slot_t *s = &eng->slots[idx];
    assert(s->state != SLOT_FREE);
    s->state = SLOT_FREE;
    s->fn = NULL;
    s->ctx = NULL;
    s->next_free = eng->free_first;
    eng->free_first = idx;
    eng->free_len++;
}

/* Links slots [from, to) into the free list, lowest index first out. */
static void engine_free_range(sim_engine_t *eng, uint32_t from, uint32_t to)
{
    for (uint32_t i = to; i > from; i--) {
        engine_slot_t *s = &eng->slots[i - 1];
        *s = (engine_slot_t){.state = SLOT_FREE, .gen = 0, .next_free = eng->free_first};
        eng->free_first = i - 1;
        eng->free_len++;
    }
}

/* Doubles the pool and the heap. On failure nothing observable changed. */
static int engine_grow(sim_engine_t *eng)
{
    if (eng->cap >= ENGINE_CAP_MAX)
        return KVS_ENOMEM;
    uint32_t new_cap = eng->cap * 2;
    if ((uint64_t)new_cap * sizeof(engine_slot_t) > SIZE_MAX)
        return KVS_ENOMEM;
    /* A grown first array is harmless if the second fails: cap stays. */
    engine_entry_t *heap = realloc(eng->heap, (size_t)new_cap * sizeof(*heap));
    if (heap == NULL)
        return KVS_ENOMEM;
    eng->heap = heap;
    engine_slot_t *slots = realloc(eng->slots, (size_t)new_cap * sizeof(*slots));
    if (slots == NULL)
        return KVS_ENOMEM;
    eng->slots = slots;
    uint32_t old_cap = eng->cap;
    eng->cap = new_cap;
    engine_free_range(eng, old_cap, new_cap);
    engine_check(eng);
    return KVS_OK;
}

/* Drops cancelled entries from the head of the heap, freeing their slots. */
static void engine_skim(sim_engine_t *eng)
{
    while (eng->heap_len > 0) {
        uint32_t idx = eng->heap[0].slot;
        if (eng->slots[idx].state != SLOT_CANCELLED)
            return;
        engine_heap_pop(eng);
        engine_slot_free(eng, idx);
    }
}

static inline uint64_t engine_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Runs heap[0], which must be PENDING. */
static void engine_dispatch_head(sim_engine_t *eng)
{
    assert(eng->heap_len > 0);
    const engine_entry_t head = eng->heap[0];
    engine_slot_t *s = &eng->slots[head.slot];
    assert(s->state == SLOT_PENDING);
    assert(head.at_ns >= eng->now_ns);
    const sim_event_fn fn = s->fn;
    void *const ctx = s->ctx;
    const uint64_t arg = s->arg;

    /* Free the slot first so fn can schedule into it. */
    engine_heap_pop(eng);
    engine_slot_free(eng, head.slot);
    eng->now_ns = head.at_ns;
    eng->events_run++;
    uint64_t d = engine_mix(eng->digest ^ head.at_ns);
    d = engine_mix(d ^ (head.seq << 1) ^ 1);
    eng->digest = engine_mix(d ^ arg);
    engine_check(eng);
    fn(eng, ctx, arg);
}

int sim_engine_create(uint64_t seed, uint32_t initial_events, sim_engine_t **out)
{
    if (out == NULL)
        return KVS_EINVAL;
    *out = NULL;
    if (initial_events == 0 || initial_events > ENGINE_CAP_MAX)
        return KVS_EINVAL;
    if ((uint64_t)initial_events * sizeof(engine_slot_t) > SIZE_MAX)
        return KVS_ENOMEM;
    sim_engine_t *eng = calloc(1, sizeof(*eng));
    if (eng == NULL)
        return KVS_ENOMEM;
    eng->heap = malloc((size_t)initial_events * sizeof(*eng->heap));
    if (eng->heap == NULL)
        goto fail_heap;
    eng->slots = malloc((size_t)initial_events * sizeof(*eng->slots));
    if (eng->slots == NULL)
        goto fail_slots;
    eng->seed = seed;
    eng->cap = initial_events;
    eng->free_first = ENGINE_NIL;
    engine_free_range(eng, 0, initial_events);
    engine_check(eng);
    *out = eng;
    return KVS_OK;

fail_slots:
    free(eng->heap);
fail_heap:
    free(eng);
    return KVS_ENOMEM;
}

void sim_engine_destroy(sim_engine_t *eng)
{
    if (eng == NULL)
        return;
    free(eng->slots);
    free(eng->heap);
    free(eng);
}

uint64_t sim_engine_now_ns(const sim_engine_t *eng) { return eng->now_ns; }

uint64_t sim_engine_seed(const sim_engine_t *eng) { return eng->seed; }

void sim_engine_rng(const sim_engine_t *eng, uint64_t component, sim_rng_t *out)
{
    sim_rng_init(out, eng->seed, component);
}

int sim_engine_at(sim_engine_t *eng, uint64_t at_ns, sim_event_fn fn, void *ctx,
                  uint64_t arg, uint64_t *out_id)
{
    if (eng == NULL || fn == NULL || at_ns < eng->now_ns)
        return KVS_EINVAL;
    if (eng->free_len == 0) {
        int rc = engine_grow(eng);
        if (rc != KVS_OK)
            return rc;
    }
    uint32_t idx = eng->free_first;
    engine_slot_t *s = &eng->slots[idx];
    assert(s->state == SLOT_FREE);
    eng->free_first = s->next_free;
    eng->free_len--;
    s->gen = s->gen == UINT32_MAX ? 1 : s->gen + 1;
    s->state = SLOT_PENDING;
    s->fn = fn;
    s->ctx = ctx;
    s->arg = arg;
    s->next_free = ENGINE_NIL;

    const engine_entry_t e = {.at_ns = at_ns, .seq = eng->next_seq++, .slot = idx};
    engine_sift_up(eng->heap, eng->heap_len++, e);
    engine_check(eng);
    if (out_id != NULL)
        *out_id = (uint64_t)s->gen << 32 | idx;
    return KVS_OK;
}

int sim_engine_after(sim_engine_t *eng, uint64_t delay_ns, sim_event_fn fn, void *ctx,
                     uint64_t arg, uint64_t *out_id)
{
    if (eng == NULL || delay_ns > UINT64_MAX - eng->now_ns)
        return KVS_EINVAL;
    return sim_engine_at(eng, eng->now_ns + delay_ns, fn, ctx, arg, out_id);
}

int sim_engine_cancel(sim_engine_t *eng, uint64_t id)
{
    if (eng == NULL)
        return KVS_EINVAL;
    const uint32_t idx = (uint32_t)id;
    const uint32_t gen = (uint32_t)(id >> 32);
    if (idx >= eng->cap || gen == 0)
        return KVS_ENOENT;
    engine_slot_t *s = &eng->slots[idx];
    if (s->gen != gen || s->state != SLOT_PENDING)
        return KVS_ENOENT;
    s->state = SLOT_CANCELLED;
    eng->cancelled++;
    engine_check(eng);
    return KVS_OK;
}

int sim_engine_step(sim_engine_t *eng)
{
    engine_skim(eng);
    if (eng->heap_len == 0)
        return 0;
    engine_dispatch_head(eng);
    return 1;
}

uint64_t sim_engine_run(sim_engine_t *eng, uint64_t until_ns, uint64_t max_events)
{
    uint64_t ran = 0;
    eng->stopped = false;
    while (max_events == 0 || ran < max_events) {
        engine_skim(eng);
        if (eng->heap_len == 0 || eng->heap[0].at_ns > until_ns)
            break;
        engine_dispatch_head(eng);
        ran++;
        if (eng->stopped)
            break;
    }
    return ran;
}

void sim_engine_stop(sim_engine_t *eng) { eng->stopped = true; }

uint64_t sim_engine_pending(const sim_engine_t *eng)
{
    return eng->next_seq - eng->events_run - eng->cancelled;
}

uint64_t sim_engine_events_run(const sim_engine_t *eng) { return eng->events_run; }

uint64_t sim_engine_digest(const sim_engine_t *eng) { return eng->digest; }
