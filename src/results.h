/*
 * results.h (internal) - the bounded queue of finished requests a handler
 * hands to its caller through *_poll_rooms, oldest first. Capacity is fixed
 * at init; a push into a full queue drops the oldest and counts it.
 */
#ifndef KVS_SRC_RESULTS_H
#define KVS_SRC_RESULTS_H

#include <kvstage/kvstage.h>

typedef struct kvs__results {
    kvs_room_result_t *items;
    uint32_t cap, head, count;
    uint64_t dropped;
} kvs__results_t;

int kvs__results_init(kvs__results_t *q, uint32_t cap);
void kvs__results_fini(kvs__results_t *q);
void kvs__results_push(kvs__results_t *q, const kvs_room_result_t *r);
int kvs__results_pop(kvs__results_t *q, kvs_room_result_t *out, int max);

#endif
