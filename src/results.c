/*
 * results.c - the finished-request queue of results.h (a ring buffer).
 */
#include "results.h"

#include <stdlib.h>
#include <string.h>

int kvs__results_init(kvs__results_t *q, uint32_t cap)
{
    memset(q, 0, sizeof *q);
    if (cap == 0)
        return KVS_EINVAL;
    q->items = calloc(cap, sizeof *q->items);
    if (q->items == NULL)
        return KVS_ENOMEM;
    q->cap = cap;
    return KVS_OK;
}

void kvs__results_fini(kvs__results_t *q)
{
    free(q->items);
    memset(q, 0, sizeof *q);
}

void kvs__results_push(kvs__results_t *q, const kvs_room_result_t *r)
{
    if (q->count == q->cap) {
        q->head = (q->head + 1) % q->cap;
        q->count--;
        q->dropped++;
    }
    q->items[(q->head + q->count) % q->cap] = *r;
    q->count++;
}

int kvs__results_pop(kvs__results_t *q, kvs_room_result_t *out, int max)
{
    int n = 0;
    while (n < max && q->count > 0) {
        out[n++] = q->items[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    return n;
}
