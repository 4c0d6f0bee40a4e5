/*
 * fifo.h (internal) - the one bounded FIFO of the handlers: references to
 * (room, flow, chunk) in the order work was started or asked for. The
 * decode keeps its scatters (in stream order) and the chunks waiting for
 * ring space (in arrival order) in one each; the prefill its gathers.
 *
 * Capacity is set at init and grows only through kvs__fifo_reserve, which a
 * caller runs where it may allocate (a room open), never per message: a
 * push into a full FIFO fails instead.
 */
#ifndef KVS_SRC_FIFO_H
#define KVS_SRC_FIFO_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvs__ref {
    uint64_t room;
    int32_t flow;              /* prefill: the target's flow; decode: 0 */
    int64_t chunk;
} kvs__ref_t;

typedef struct kvs__fifo {
    kvs__ref_t *items;
    uint32_t cap, head, count;
} kvs__fifo_t;

/* An empty FIFO of cap (> 0) entries. KVS_ENOMEM. */
int kvs__fifo_init(kvs__fifo_t *q, uint32_t cap);
void kvs__fifo_fini(kvs__fifo_t *q);
/* Grows q to hold `need` entries, keeping their order. KVS_EFULL past
 * UINT32_MAX / 2 entries, KVS_ENOMEM. */
int kvs__fifo_reserve(kvs__fifo_t *q, uint64_t need);
/* false when full. */
bool kvs__fifo_push(kvs__fifo_t *q, kvs__ref_t ref);
/* The oldest entry; q must not be empty. */
static inline kvs__ref_t kvs__fifo_head(const kvs__fifo_t *q) { return q->items[q->head]; }
/* Drops the oldest entry; q must not be empty. */
void kvs__fifo_pop(kvs__fifo_t *q);

#endif
