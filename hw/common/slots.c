/*
 * slots.c - the free-slot table of slots.h, shared by the hardware device
 * backends for their stream and event tables: a stack of free indices,
 * allocated once at device creation (every table has a bound set there).
 */
#include "slots.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

bool hw_slots_init(hw_slots_t *t, uint32_t cap, const char *full)
{
    *t = (hw_slots_t){.cap = cap, .full = full};
    t->free = calloc(cap != 0 ? cap : 1, sizeof *t->free);
    if (t->free == NULL)
        return false;
    /* Low indices on top: they go out first. */
    for (uint32_t i = 0; i < cap; i++)
        t->free[i] = cap - 1 - i;
    t->free_count = cap;
    return true;
}

void hw_slots_fini(hw_slots_t *t)
{
    free(t->free);
    t->free = NULL;
    t->free_count = 0;
}

int hw_slots_take(hw_slots_t *t, kvs_device_t *dev, uint32_t *out)
{
    if (t->free_count == 0)
        return kvs_device_fail(dev, KVS_EFULL, ENOSPC, "%s: all %u %s", dev->name, t->cap,
                               t->full);
    *out = t->free[--t->free_count];
    return KVS_OK;
}

void hw_slots_put(hw_slots_t *t, uint32_t i)
{
    assert(i < t->cap && t->free_count < t->cap);
    t->free[t->free_count++] = i;
}
