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
    q->aux = calloc(cap, sizeof *q->aux);
    if (q->items == NULL || q->aux == NULL) {
        free(q->items);
        free(q->aux);
        q->items = NULL;
        q->aux = NULL;
        return KVS_ENOMEM;
    }
    q->cap = cap;
    return KVS_OK;
}

void kvs__results_fini(kvs__results_t *q, kvs__blocks_t *c)
{
    for (uint32_t i = 0; q->aux != NULL && i < q->cap; i++)
        kvs__blocks_put(c, q->aux[i]);
    free(q->aux);
    free(q->items);
    memset(q, 0, sizeof *q);
}

void kvs__results_push(kvs__results_t *q, const kvs_room_result_t *r, uint8_t **aux,
                       uint32_t aux_bytes)
{
    if (q->count == q->cap) {
        q->head = (q->head + 1) % q->cap;
        q->count--;
        q->dropped++;
    }
    const uint32_t slot = (q->head + q->count) % q->cap;
    q->items[slot] = *r;
    q->items[slot].aux = NULL;
    q->items[slot].aux_bytes = 0;
    if (aux != NULL && aux_bytes > 0) {
        uint8_t *const mine = q->aux[slot];
        q->aux[slot] = *aux;
        *aux = mine;
        q->items[slot].aux = q->aux[slot];
        q->items[slot].aux_bytes = aux_bytes;
    }
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
