/*
 * alloc_table.h - the live allocations of a hardware device backend
 * (hw/host, hw/cuda): an array sorted by address, bounded at device
 * creation, against which every range a call touches is validated.
 *
 * An entry is the device range [addr, addr + len_bytes) the caller asked
 * for plus what the backend needs to give it back (base, base_bytes: the
 * host's whole mapping, which may start below addr for alignment; CUDA's
 * cudaMalloc pointer). The table never allocates or frees device memory
 * itself: the backend checks for room (hw_alloc_table_room) before it
 * allocates, inserts what it got, and frees what hw_alloc_table_remove
 * hands back. Refusals are recorded on the device with what to change.
 *
 * Not thread-safe: the backend's device lock guards it.
 * Invariants: entries[0..count) sorted by addr, their ranges disjoint,
 * count <= cap.
 */
#ifndef KVS_HW_ALLOC_TABLE_H
#define KVS_HW_ALLOC_TABLE_H

#include <kvstage/backend.h>

#include <stdbool.h>
#include <stdint.h>

typedef struct hw_alloc {
    uint64_t addr;       /* device address of the first byte */
    uint64_t len_bytes;  /* as requested, > 0 */
    void *base;          /* what the backend frees (may lie below addr) */
    uint64_t base_bytes; /* its length, where the free call needs one */
    bool attached;       /* the application's memory (hw_alloc_table_attach):
                            copies may touch it, the backend never frees it */
} hw_alloc_t;

typedef struct hw_alloc_table {
    hw_alloc_t *entries; /* sorted by addr */
    uint32_t count;
    uint32_t cap;        /* the backend config's max_allocs */
} hw_alloc_table_t;

/* Sets up an empty table for cap allocations. Returns false when out of
 * memory; *t then holds nothing to free (hw_alloc_table_fini is harmless). */
bool hw_alloc_table_init(hw_alloc_table_t *t, uint32_t cap);

/* Frees the array, not the allocations (the backend frees those first,
 * walking entries[0..count)). Safe on a zeroed or failed-init table. */
void hw_alloc_table_fini(hw_alloc_table_t *t);

/* KVS_OK when one more allocation fits; else records KVS_EFULL ("allocation
 * table of <dev name> full: ...; free some or raise max_allocs") on dev and
 * returns it. Ask before allocating the memory. */
int hw_alloc_table_room(const hw_alloc_table_t *t, kvs_device_t *dev);

/* Inserts a (copied) in address order. There is room (hw_alloc_table_room)
 * and a's range overlaps no live one: fresh memory from the allocator. */
void hw_alloc_table_insert(hw_alloc_table_t *t, const hw_alloc_t *a);

/* The live allocation holding all of [addr, addr + len_bytes), or NULL. An
 * empty range may sit just past an allocation's end (a one-past pointer).
 * The pointer is valid until the table next changes. */
const hw_alloc_t *hw_alloc_table_lookup(const hw_alloc_table_t *t, uint64_t addr,
                                        uint64_t len_bytes);

/* hw_alloc_table_lookup as a kvs_copy_mem_fn: ctx is the table. */
bool hw_alloc_table_holds(void *ctx, uint64_t addr, uint64_t len_bytes);

/* Takes the allocation starting at addr out of the table and copies it to
 * *out for the backend to free. When addr starts no live allocation
 * records KVS_ENOENT ("mem_free on <dev name>: 0x... is not the start of a
 * live allocation ...") on dev, leaves the table and *out alone and
 * returns it. */
int hw_alloc_table_remove(hw_alloc_table_t *t, kvs_device_t *dev, uint64_t addr,
                          hw_alloc_t *out);

/* Adds the application's memory [addr, addr + len_bytes) (an engine's KV
 * pool) as an attached entry, so copies may name it. Records on dev (and
 * err, may be NULL) and returns KVS_EINVAL for len 0 or a range past the address space,
 * KVS_EINVAL naming the live entry it overlaps, KVS_EFULL when the table
 * is full (hw_alloc_table_room). what names the caller ("kvs_host_mem_attach"). */
int hw_alloc_table_attach(hw_alloc_table_t *t, kvs_device_t *dev, const char *what,
                          uint64_t addr, uint64_t len_bytes, kvs_error_t *err);

/* Takes the attached entry starting at addr out of the table. Records on
 * dev and returns KVS_ENOENT when addr starts no attached entry (or starts
 * memory the device allocated: free that with mem_free). */
int hw_alloc_table_detach(hw_alloc_table_t *t, kvs_device_t *dev, const char *what,
                          uint64_t addr, kvs_error_t *err);

/* Copies the failure dev recorded last into err (may be NULL) when rc is
 * not KVS_OK, for the public calls that take a kvs_error_t; returns rc. */
int hw_device_report(kvs_device_t *dev, int rc, kvs_error_t *err);

#endif
