/*
 * table.c - the bounded hash table of table.h: linear probing over a power
 * of two of slots (at least twice max_items), tombstones on delete, and a
 * rebuild into preallocated scratch arrays when tombstones crowd the table
 * (so nothing is allocated after init).
 */
#include "table.h"

#include <kvstage/kvstage.h>

#include <stdlib.h>
#include <string.h>

static uint32_t kvs__hash(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (uint32_t)key;
}

int kvs__table_init(kvs__table_t *t, uint32_t max_items)
{
    memset(t, 0, sizeof *t);
    if (max_items == 0 || max_items > (1u << 28))
        return KVS_EINVAL;
    uint32_t slots = 8;
    while (slots < 2 * max_items)
        slots <<= 1;
    t->keys = calloc(slots, sizeof *t->keys);
    t->vals = calloc(slots, sizeof *t->vals);
    t->state = calloc(slots, 1);
    t->keys2 = calloc(slots, sizeof *t->keys2);
    t->vals2 = calloc(slots, sizeof *t->vals2);
    t->state2 = calloc(slots, 1);
    if (t->keys == NULL || t->vals == NULL || t->state == NULL || t->keys2 == NULL ||
        t->vals2 == NULL || t->state2 == NULL) {
        kvs__table_fini(t);
        return KVS_ENOMEM;
    }
    t->mask = slots - 1;
    t->max_items = max_items;
    return KVS_OK;
}

void kvs__table_fini(kvs__table_t *t)
{
    free(t->keys);
    free(t->vals);
    free(t->state);
    free(t->keys2);
    free(t->vals2);
    free(t->state2);
    memset(t, 0, sizeof *t);
}

/* Slot holding key, or UINT32_MAX. */
static uint32_t kvs__find(const kvs__table_t *t, uint64_t key)
{
    for (uint32_t i = kvs__hash(key) & t->mask, n = 0; n <= t->mask; i = (i + 1) & t->mask, n++) {
        if (t->state[i] == 0)
            return UINT32_MAX;
        if (t->state[i] == 1 && t->keys[i] == key)
            return i;
    }
    return UINT32_MAX;
}

void *kvs__table_get(const kvs__table_t *t, uint64_t key)
{
    uint32_t i = kvs__find(t, key);
    return i == UINT32_MAX ? NULL : t->vals[i];
}

/* Drops tombstones: reinserts the live entries into the scratch arrays, in
 * slot order, and swaps them in. */
static void kvs__rebuild(kvs__table_t *t)
{
    const uint32_t slots = t->mask + 1;
    memset(t->state2, 0, slots);
    for (uint32_t i = 0; i < slots; i++) {
        if (t->state[i] != 1)
            continue;
        uint32_t j = kvs__hash(t->keys[i]) & t->mask;
        while (t->state2[j] == 1)
            j = (j + 1) & t->mask;
        t->keys2[j] = t->keys[i];
        t->vals2[j] = t->vals[i];
        t->state2[j] = 1;
    }
    uint64_t *k = t->keys;
    void **v = t->vals;
    uint8_t *st = t->state;
    t->keys = t->keys2;
    t->vals = t->vals2;
    t->state = t->state2;
    t->keys2 = k;
    t->vals2 = v;
    t->state2 = st;
    t->used_or_deleted = t->count;
}

int kvs__table_put(kvs__table_t *t, uint64_t key, void *val)
{
    if (kvs__find(t, key) != UINT32_MAX)
        return KVS_EALREADY;
    if (t->count >= t->max_items)
        return KVS_EFULL;
    if (t->used_or_deleted + 1 > (t->mask + 1) / 4 * 3)
        kvs__rebuild(t);
    uint32_t i = kvs__hash(key) & t->mask;
    while (t->state[i] == 1)
        i = (i + 1) & t->mask;
    if (t->state[i] == 0)
        t->used_or_deleted++;
    t->keys[i] = key;
    t->vals[i] = val;
    t->state[i] = 1;
    t->count++;
    return KVS_OK;
}

void *kvs__table_del(kvs__table_t *t, uint64_t key)
{
    uint32_t i = kvs__find(t, key);
    if (i == UINT32_MAX)
        return NULL;
    void *v = t->vals[i];
    t->state[i] = 2;
    t->vals[i] = NULL;
    t->count--;
    return v;
}
