/*
 * alloc_table.c - the allocation table of alloc_table.h, shared by the
 * hardware device backends: binary search for the first entry above an
 * address, insert and remove by shifting the tail (tables hold thousands of
 * entries at most; allocations are rare next to the lookups of every copy).
 */
#include "alloc_table.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool hw_alloc_table_init(hw_alloc_table_t *t, uint32_t cap)
{
    *t = (hw_alloc_table_t){.cap = cap};
    t->entries = calloc(cap != 0 ? cap : 1, sizeof *t->entries);
    return t->entries != NULL;
}

void hw_alloc_table_fini(hw_alloc_table_t *t)
{
    free(t->entries);
    t->entries = NULL;
    t->count = 0;
}

/* Index of the first entry with addr > x (0..count). */
static uint32_t hw_alloc_table_upper(const hw_alloc_table_t *t, uint64_t x)
{
    uint32_t lo = 0, hi = t->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->entries[mid].addr <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int hw_alloc_table_room(const hw_alloc_table_t *t, kvs_device_t *dev)
{
    if (t->count < t->cap)
        return KVS_OK;
    return kvs_device_fail(dev, KVS_EFULL, ENOSPC,
                           "allocation table of %s full: %u live allocations; free some or "
                           "raise max_allocs",
                           dev->name, t->cap);
}

void hw_alloc_table_insert(hw_alloc_table_t *t, const hw_alloc_t *a)
{
    assert(t->count < t->cap && a->len_bytes > 0);
    uint32_t i = hw_alloc_table_upper(t, a->addr);
    /* Disjoint from both neighbours. */
    assert(i == 0 || t->entries[i - 1].addr + t->entries[i - 1].len_bytes <= a->addr);
    assert(i == t->count || a->addr + a->len_bytes <= t->entries[i].addr);
    memmove(&t->entries[i + 1], &t->entries[i], (size_t)(t->count - i) * sizeof *a);
    t->entries[i] = *a;
    t->count++;
}

const hw_alloc_t *hw_alloc_table_lookup(const hw_alloc_table_t *t, uint64_t addr,
                                        uint64_t len_bytes)
{
    uint32_t i = hw_alloc_table_upper(t, addr);
    if (i == 0)
        return NULL;
    const hw_alloc_t *a = &t->entries[i - 1];
    uint64_t rel = addr - a->addr;
    if (rel > a->len_bytes || len_bytes > a->len_bytes - rel)
        return NULL;
    return a;
}

bool hw_alloc_table_holds(void *ctx, uint64_t addr, uint64_t len_bytes)
{
    return hw_alloc_table_lookup(ctx, addr, len_bytes) != NULL;
}

int hw_alloc_table_remove(hw_alloc_table_t *t, kvs_device_t *dev, uint64_t addr,
                          hw_alloc_t *out)
{
    uint32_t i = hw_alloc_table_upper(t, addr);
    if (i == 0 || t->entries[i - 1].addr != addr)
        return kvs_device_fail(dev, KVS_ENOENT, ENOENT,
                               "mem_free on %s: 0x%llx is not the start of a live allocation "
                               "(never allocated or already freed)",
                               dev->name, (unsigned long long)addr);
    if (t->entries[i - 1].attached)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "mem_free on %s: 0x%llx is the application's memory, attached, "
                               "not allocated by the device: detach it instead",
                               dev->name, (unsigned long long)addr);
    *out = t->entries[i - 1];
    memmove(&t->entries[i - 1], &t->entries[i], (size_t)(t->count - i) * sizeof *out);
    t->count--;
    return KVS_OK;
}

int hw_device_report(kvs_device_t *dev, int rc, kvs_error_t *err)
{
    if (rc != KVS_OK)
        (void)kvs_error_set(err, rc, dev->last_backend_code, __FILE__, __LINE__, "%s",
                            dev->last_backend_msg);
    return rc;
}

static int hw_alloc_table_attach_range(hw_alloc_table_t *t, kvs_device_t *dev,
                                       const char *what, uint64_t addr, uint64_t len_bytes)
{
    if (len_bytes == 0 || addr == 0 || len_bytes > UINT64_MAX - addr)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "%s on %s: [0x%llx, +%llu) is not a memory range: give a "
                               "non-NULL address and a length > 0 that stays in the address "
                               "space",
                               what, dev->name, (unsigned long long)addr,
                               (unsigned long long)len_bytes);
    uint32_t i = hw_alloc_table_upper(t, addr);
    const hw_alloc_t *clash = NULL;
    if (i > 0 && t->entries[i - 1].addr + t->entries[i - 1].len_bytes > addr)
        clash = &t->entries[i - 1];
    else if (i < t->count && addr + len_bytes > t->entries[i].addr)
        clash = &t->entries[i];
    if (clash != NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EEXIST,
                               "%s on %s: [0x%llx, +%llu) overlaps the live %s [0x%llx, +%llu); "
                               "attach each range once (merge overlapping tensors' ranges)",
                               what, dev->name, (unsigned long long)addr,
                               (unsigned long long)len_bytes,
                               clash->attached ? "attached range" : "device allocation",
                               (unsigned long long)clash->addr,
                               (unsigned long long)clash->len_bytes);
    int rc = hw_alloc_table_room(t, dev);
    if (rc != KVS_OK)
        return rc;
    hw_alloc_t a = {.addr = addr, .len_bytes = len_bytes, .attached = true};
    hw_alloc_table_insert(t, &a);
    return KVS_OK;
}

int hw_alloc_table_attach(hw_alloc_table_t *t, kvs_device_t *dev, const char *what,
                          uint64_t addr, uint64_t len_bytes, kvs_error_t *err)
{
    return hw_device_report(dev, hw_alloc_table_attach_range(t, dev, what, addr, len_bytes),
                            err);
}

static int hw_alloc_table_detach_range(hw_alloc_table_t *t, kvs_device_t *dev,
                                       const char *what, uint64_t addr)
{
    uint32_t i = hw_alloc_table_upper(t, addr);
    if (i == 0 || t->entries[i - 1].addr != addr || !t->entries[i - 1].attached)
        return kvs_device_fail(dev, KVS_ENOENT, ENOENT,
                               "%s on %s: 0x%llx is not the start of an attached range "
                               "(never attached, already detached, or device memory: free "
                               "that with mem_free)",
                               what, dev->name, (unsigned long long)addr);
    memmove(&t->entries[i - 1], &t->entries[i], (size_t)(t->count - i) * sizeof t->entries[0]);
    t->count--;
    return KVS_OK;
}

int hw_alloc_table_detach(hw_alloc_table_t *t, kvs_device_t *dev, const char *what,
                          uint64_t addr, kvs_error_t *err)
{
    return hw_device_report(dev, hw_alloc_table_detach_range(t, dev, what, addr), err);
}
