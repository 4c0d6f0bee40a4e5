/*
 * ring.c - the staging ring allocator of a decode rank (spec §6).
 *
 * Hands out regions of one buffer in rounds: an assignment takes the next
 * bytes after head, or wraps to offset 0 of the next round when it does not
 * fit. It never blocks and may overlap live data of the previous round; the
 * prefill side waits on the watermark instead (kvs_ring_ready). It does not
 * touch memory in the buffer, send watermarks or know about requests.
 *
 * Invariants (ring_check asserts the O(1) ones after every change):
 * - allocations are linked in assign order, which is strictly increasing
 *   (round, offset) order, so the oldest live one is live_first;
 * - the watermark is (round, offset) of live_first, or (round, 0) of the
 *   current round right after the ring emptied; it never decreases;
 * - live_count and live_bytes are the count and length sum of that list;
 * - head <= size_bytes.
 * Nothing is allocated after kvs_ring_create: the slots live behind the ring
 * header in the same block. An id is (generation << 32) | slot index, so it
 * resolves in O(1) and a stale id of a reused slot is refused (until that
 * slot is reused 2^32 - 1 more times); a generation is never 0, so id 0 is
 * never valid. One mutex guards every call, the const getters included.
 */
#include <kvstage/kvstage.h>

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>

#define RING_NIL UINT32_MAX /* no slot; max_live <= UINT32_MAX keeps it free */

typedef struct ring_slot {
    uint64_t round;
    uint64_t offset;
    uint64_t len_bytes;
    uint32_t gen;  /* bumped on every assign; part of the id */
    uint32_t prev; /* live list only */
    uint32_t next; /* live list, or free list when not live */
    bool live;
} ring_slot_t;

struct kvs_ring {
    pthread_mutex_t mu;
    uint64_t size_bytes;
    uint64_t head_bytes;
    uint64_t round;
    kvs_watermark_t wm;
    uint64_t live_bytes;
    uint32_t live_count;
    uint32_t max_live;
    uint32_t free_first; /* singly linked through next */
    uint32_t live_first; /* oldest live allocation */
    uint32_t live_last;  /* newest live allocation */
    ring_slot_t slots[]; /* max_live entries */
};

/* The getters take a const ring but must lock; the ring is never const
 * storage (it comes from malloc), so casting the qualifier away is defined. */
static kvs_ring_t *ring_lock(const kvs_ring_t *ring)
{
    kvs_ring_t *r = (kvs_ring_t *)ring;
    int rc = pthread_mutex_lock(&r->mu);
    assert(rc == 0);
    (void)rc;
    return r;
}

static void ring_unlock(kvs_ring_t *r)
{
    int rc = pthread_mutex_unlock(&r->mu);
    assert(rc == 0);
    (void)rc;
}

/* O(1) checks of the invariants that need no walk of the list. */
static void ring_check(const kvs_ring_t *r)
{
    assert(r->head_bytes <= r->size_bytes);
    assert(r->live_count <= r->max_live);
    assert((r->live_count == 0) == (r->live_first == RING_NIL));
    assert((r->live_count == 0) == (r->live_last == RING_NIL));
    assert(r->live_count > 0 || r->live_bytes == 0);
    if (r->live_first != RING_NIL) {
        const ring_slot_t *s = &r->slots[r->live_first];
        assert(s->live && s->prev == RING_NIL);
        assert(r->wm.round == s->round && r->wm.offset == s->offset);
    }
    assert(r->wm.round <= r->round);
}

int kvs_ring_create(uint64_t size_bytes, uint32_t max_live, kvs_ring_t **out)
{
    if (out == NULL)
        return KVS_EINVAL;
    *out = NULL;
    if (size_bytes == 0 || max_live == 0)
        return KVS_EINVAL;
    /* At most 2^32 slots of a few dozen bytes: no overflow in 64 bits. */
    uint64_t alloc_bytes = sizeof(kvs_ring_t) + (uint64_t)max_live * sizeof(ring_slot_t);
#if SIZE_MAX < UINT64_MAX
    if (alloc_bytes > SIZE_MAX)
        return KVS_ENOMEM;
#endif
    kvs_ring_t *r = malloc((size_t)alloc_bytes);
    if (r == NULL)
        return KVS_ENOMEM;
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        return KVS_ENOMEM;
    }
    r->size_bytes = size_bytes;
    r->head_bytes = 0;
    r->round = 0;
    r->wm = (kvs_watermark_t){.round = 0, .offset = 0};
    r->live_bytes = 0;
    r->live_count = 0;
    r->max_live = max_live;
    r->free_first = 0;
    r->live_first = RING_NIL;
    r->live_last = RING_NIL;
    for (uint32_t i = 0; i < max_live; i++) {
        r->slots[i] = (ring_slot_t){.prev = RING_NIL, .live = false,
                                    .next = i + 1 < max_live ? i + 1 : RING_NIL};
    }
    *out = r;
    return KVS_OK;
}

void kvs_ring_destroy(kvs_ring_t *ring)
{
    if (ring == NULL)
        return;
    int rc = pthread_mutex_destroy(&ring->mu);
    assert(rc == 0);
    (void)rc;
    free(ring);
}

int kvs_ring_assign(kvs_ring_t *ring, uint64_t len_bytes, kvs_ring_alloc_t *out)
{
    if (ring == NULL || out == NULL || len_bytes == 0)
        return KVS_EINVAL;
    kvs_ring_t *r = ring_lock(ring);
    int status = KVS_OK;
    if (len_bytes > r->size_bytes) {
        status = KVS_EOVERSIZED;
    } else if (r->live_count == r->max_live) {
        status = KVS_ERING_LIVE;
    } else if (r->live_bytes > UINT64_MAX - len_bytes) {
        status = KVS_ERANGE; /* only with overcommit near 2^64 bytes */
    }
    if (status != KVS_OK) {
        ring_unlock(r);
        return status;
    }

    uint64_t offset = r->head_bytes;
    if (len_bytes > r->size_bytes - r->head_bytes) {
        assert(r->round < UINT64_MAX);
        r->round++;
        offset = 0;
    }
    r->head_bytes = offset + len_bytes;

    uint32_t idx = r->free_first;
    assert(idx != RING_NIL);
    ring_slot_t *s = &r->slots[idx];
    assert(!s->live);
    r->free_first = s->next;
    s->gen = s->gen == UINT32_MAX ? 1 : s->gen + 1;
    s->round = r->round;
    s->offset = offset;
    s->len_bytes = len_bytes;
    s->live = true;
    s->prev = r->live_last;
    s->next = RING_NIL;
    if (r->live_last != RING_NIL)
        r->slots[r->live_last].next = idx;
    else
        r->live_first = idx;
    r->live_last = idx;
    r->live_count++;
    r->live_bytes += len_bytes;
    ring_check(r);

    *out = (kvs_ring_alloc_t){.id = (uint64_t)s->gen << 32 | idx,
                              .offset = offset,
                              .round = r->round,
                              .end = offset + len_bytes};
    ring_unlock(r);
    return KVS_OK;
}

int kvs_ring_free(kvs_ring_t *ring, uint64_t id, kvs_watermark_t *wm_out)
{
    if (ring == NULL)
        return KVS_EINVAL;
    uint64_t idx64 = id & UINT32_MAX;
    uint64_t gen = id >> 32;
    kvs_ring_t *r = ring_lock(ring);
    if (idx64 >= r->max_live || !r->slots[idx64].live ||
        r->slots[idx64].gen != gen) {
        ring_unlock(r);
        return KVS_ENOENT;
    }

    uint32_t idx = (uint32_t)idx64;
    ring_slot_t *s = &r->slots[idx];
    if (s->prev != RING_NIL)
        r->slots[s->prev].next = s->next;
    else
        r->live_first = s->next;
    if (s->next != RING_NIL)
        r->slots[s->next].prev = s->prev;
    else
        r->live_last = s->prev;
    assert(r->live_count > 0 && r->live_bytes >= s->len_bytes);
    r->live_count--;
    r->live_bytes -= s->len_bytes;
    s->live = false;
    s->prev = RING_NIL;
    s->next = r->free_first;
    r->free_first = idx;

    if (r->live_first != RING_NIL) {
        const ring_slot_t *oldest = &r->slots[r->live_first];
        r->wm = (kvs_watermark_t){.round = oldest->round, .offset = oldest->offset};
    } else {
        /* Restart: without it an empty ring can wait forever (spec §6). */
        assert(r->round < UINT64_MAX);
        r->round++;
        r->head_bytes = 0;
        r->wm = (kvs_watermark_t){.round = r->round, .offset = 0};
    }
    ring_check(r);
    if (wm_out != NULL)
        *wm_out = r->wm;
    ring_unlock(r);
    return KVS_OK;
}

kvs_watermark_t kvs_ring_watermark(const kvs_ring_t *ring)
{
    assert(ring != NULL);
    kvs_ring_t *r = ring_lock(ring);
    kvs_watermark_t wm = r->wm;
    ring_unlock(r);
    return wm;
}

uint64_t kvs_ring_size_bytes(const kvs_ring_t *ring)
{
    assert(ring != NULL);
    kvs_ring_t *r = ring_lock(ring);
    uint64_t n = r->size_bytes;
    ring_unlock(r);
    return n;
}

uint32_t kvs_ring_live_count(const kvs_ring_t *ring)
{
    assert(ring != NULL);
    kvs_ring_t *r = ring_lock(ring);
    uint32_t n = r->live_count;
    ring_unlock(r);
    return n;
}

uint64_t kvs_ring_live_bytes(const kvs_ring_t *ring)
{
    assert(ring != NULL);
    kvs_ring_t *r = ring_lock(ring);
    uint64_t n = r->live_bytes;
    ring_unlock(r);
    return n;
}

bool kvs_ring_ready(kvs_watermark_t wm, uint64_t round, uint64_t end)
{
    if (round == 0)
        return true;
    return round - 1 < wm.round || (round - 1 == wm.round && end <= wm.offset);
}
