/*
 * results.h (internal) - the bounded queue of finished requests a handler
 * hands to its caller through *_poll_rooms, oldest first. Capacity is fixed
 * at init; a push into a full queue drops the oldest and counts it.
 *
 * A result may carry a room's aux payload (decode). Its bytes are not
 * copied: the room's buffer (a block of blocks.h) is swapped with the
 * slot's, so a queue that has seen its largest payloads allocates nothing
 * more. A popped result's aux stays valid until the next push (the
 * caller's next progress).
 */
#ifndef KVS_SRC_RESULTS_H
#define KVS_SRC_RESULTS_H

#include <kvstage/kvstage.h>

#include "blocks.h"

typedef struct kvs__results {
    kvs_room_result_t *items;
    uint8_t **aux;              /* [cap]: each slot's payload block, or NULL */
    uint32_t cap, head, count;
    uint64_t dropped;
} kvs__results_t;

int kvs__results_init(kvs__results_t *q, uint32_t cap);
/* Gives the slots' payload blocks to c (NULL: frees them). */
void kvs__results_fini(kvs__results_t *q, kvs__blocks_t *c);
/* Queues r; with aux_bytes > 0 the result carries the first aux_bytes of
 * the block *aux, which is swapped with the slot's (the caller gets the
 * slot's old block, possibly NULL, to reuse or give back). */
void kvs__results_push(kvs__results_t *q, const kvs_room_result_t *r, uint8_t **aux,
                       uint32_t aux_bytes);
int kvs__results_pop(kvs__results_t *q, kvs_room_result_t *out, int max);

#endif
