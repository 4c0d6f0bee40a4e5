/*
 * fifo.c - the bounded FIFO of fifo.h (a ring buffer of kvs__ref_t).
 */
#include "fifo.h"

#include <kvstage/kvstage.h>

#include <assert.h>
#include <stdlib.h>

int kvs__fifo_init(kvs__fifo_t *q, uint32_t cap)
{
    q->items = calloc(cap > 0 ? cap : 1, sizeof *q->items);
    q->cap = cap > 0 ? cap : 1;
    q->head = q->count = 0;
    return q->items != NULL ? KVS_OK : KVS_ENOMEM;
}

void kvs__fifo_fini(kvs__fifo_t *q)
{
    free(q->items);
    *q = (kvs__fifo_t){0};
}

int kvs__fifo_reserve(kvs__fifo_t *q, uint64_t need)
{
    if (need <= q->cap)
        return KVS_OK;
    if (need > UINT32_MAX / 2)
        return KVS_EFULL;
    const uint32_t cap = (uint32_t)need > 2 * q->cap ? (uint32_t)need : 2 * q->cap;
    kvs__ref_t *items = malloc((size_t)cap * sizeof *items);
    if (items == NULL)
        return KVS_ENOMEM;
    for (uint32_t i = 0; i < q->count; i++)
        items[i] = q->items[(q->head + i) % q->cap];
    free(q->items);
    q->items = items;
    q->cap = cap;
    q->head = 0;
    return KVS_OK;
}

bool kvs__fifo_push(kvs__fifo_t *q, kvs__ref_t ref)
{
    if (q->count == q->cap)
        return false;
    q->items[(q->head + q->count) % q->cap] = ref;
    q->count++;
    return true;
}

void kvs__fifo_pop(kvs__fifo_t *q)
{
    assert(q->count > 0);
    q->head = (q->head + 1) % q->cap;
    q->count--;
}
