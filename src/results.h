/*
 * results.h (internal) - the bounded queue of finished requests a handler
 * hands to its caller through *_poll_rooms, oldest first. Capacity is fixed
 * at init; a push into a full queue drops the oldest and counts it.
 *
 * A result may carry a room's aux payload (decode). Its bytes are not
 * copied: the room's buffer is swapped with the slot's, so a queue that has
 * seen its largest payloads allocates nothing more. A popped result's aux
 * stays valid until the next push (the caller's next progress).
 */
#ifndef KVS_SRC_RESULTS_H
#define KVS_SRC_RESULTS_H

#include <kvstage/kvstage.h>

typedef struct kvs__aux_buf {
    uint8_t *bytes;
    uint32_t cap;
} kvs__aux_buf_t;

typedef struct kvs__results {
    kvs_room_result_t *items;
    kvs__aux_buf_t *aux;        /* [cap]: each slot's payload buffer */
    uint32_t cap, head, count;
    uint64_t dropped;
} kvs__results_t;

int kvs__results_init(kvs__results_t *q, uint32_t cap);
void kvs__results_fini(kvs__results_t *q);
/* Queues r; with aux_bytes > 0 the result carries the first aux_bytes of
 * *aux, whose buffer is swapped with the slot's (the caller gets the slot's
 * old buffer, possibly NULL, to reuse or free). */
void kvs__results_push(kvs__results_t *q, const kvs_room_result_t *r, kvs__aux_buf_t *aux,
                       uint32_t aux_bytes);
int kvs__results_pop(kvs__results_t *q, kvs_room_result_t *out, int max);

#endif
