/*
 * table.h (internal) - a bounded open-addressing hash table from uint64_t
 * keys to pointers (the rooms of a handler). Capacity is fixed at init; put
 * beyond max_items returns KVS_EFULL. Iteration order depends only on the
 * sequence of operations, so simulator runs stay deterministic.
 */
#ifndef KVS_SRC_TABLE_H
#define KVS_SRC_TABLE_H

#include <stdint.h>

typedef struct kvs__table {
    uint64_t *keys;
    void **vals;
    uint8_t *state; /* 0 empty, 1 used, 2 deleted */
    uint64_t *keys2; /* scratch arrays of the same size for rebuilds */
    void **vals2;
    uint8_t *state2;
    uint32_t mask;  /* slots - 1 */
    uint32_t count, used_or_deleted, max_items;
} kvs__table_t;

int kvs__table_init(kvs__table_t *t, uint32_t max_items);
void kvs__table_fini(kvs__table_t *t);
void *kvs__table_get(const kvs__table_t *t, uint64_t key);
/* KVS_EALREADY when the key exists, KVS_EFULL at max_items. */
int kvs__table_put(kvs__table_t *t, uint64_t key, void *val);
/* Removes and returns the value, NULL when absent. */
void *kvs__table_del(kvs__table_t *t, uint64_t key);

#endif
