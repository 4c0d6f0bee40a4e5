/*
 * handles.h - how the network fabrics (hw/verbs, hw/ofi) check a handle the
 * user passes back (a connection, a registration, a grant: a pointer into
 * one of the fabric's fixed tables) and find the piece of a split
 * registration that an address falls in. Pure inline arithmetic, so the
 * files of a fabric can all use it without calling one another.
 */
#ifndef KVS_HW_HANDLES_H
#define KVS_HW_HANDLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether p points at one of the n elements (each `size` bytes) of table. */
static inline bool hw_in_table(const void *table, const void *p, size_t size, uint32_t n)
{
    const uintptr_t b = (uintptr_t)table, q = (uintptr_t)p;
    return p != NULL && q >= b && (q - b) % size == 0 && (q - b) / size < n;
}

/* A registration of len_bytes split into npieces of piece_bytes (the last
 * one shorter): the index of the piece holding byte `off`, and in *left the
 * bytes from off to that piece's end. Requires off < len_bytes. */
static inline uint32_t hw_piece_at(uint64_t off, uint64_t piece_bytes, uint32_t npieces,
                                   uint64_t len_bytes, uint64_t *left)
{
    const uint64_t i = off / piece_bytes;
    const uint64_t end = i + 1 == npieces ? len_bytes : (i + 1) * piece_bytes;
    *left = end - off;
    return (uint32_t)i;
}

#endif
