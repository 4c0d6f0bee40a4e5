/*
 * copy.h - the CPU copy engine of the host device backend: runs one
 * validated gather or scatter (a snapshot of a kvs_copy_desc_t turned into
 * host pointers) on the calling thread. It never fails and never checks:
 * host.c validates the descriptor against live memory before enqueueing and
 * keeps that memory alive until the op has run.
 */
#ifndef KVS_HW_HOST_COPY_H
#define KVS_HW_HOST_COPY_H

#include <stdbool.h>
#include <stdint.h>

typedef struct hw_host_copy {
    bool scatter;               /* staging -> pool; else pool -> staging */
    uint8_t *const *pool;       /* [2 * layer_count]: K of copy layer j at [j], V at
                                 * [layer_count + j], each already at head_start */
    const int64_t *pages;       /* ceil(tokens / page_size) page ids */
    uint8_t *staging;           /* start of the staging block */
    uint64_t layer_count;
    uint64_t page_size;         /* tokens per page */
    uint64_t tokens;
    uint64_t slot_begin;        /* staging slot of copy layer 0 */
    uint64_t layer_slots;       /* S: slots per K (and per V) half of the block */
    uint64_t row_bytes;         /* bytes copied per token */
    uint64_t token_bytes;       /* stride of token slots in the pool */
    uint64_t slot_bytes;        /* tokens * row_bytes */
    uint32_t max_vector_bytes;  /* widest streaming store: 16, 32 or 64 */
} hw_host_copy_t;

/* Performs the copy. Layer j, K (kv 0) or V (kv 1), token i goes between
 * pool[kv * layer_count + j] + (pages[i / ps] * ps + i % ps) * token_bytes
 * and staging + ((kv * S + slot_begin + j) * slot_bytes) + i * row_bytes. */
void hw_host_copy_run(const hw_host_copy_t *c);

/* Performs share `part` of `parts` (0 <= part < parts) of the copy: the
 * (K/V, layer) buffers kv * layer_count + j in [part * n / parts,
 * (part + 1) * n / parts) with n = 2 * layer_count. The shares of one copy
 * touch disjoint bytes and may run on different threads at once. */
void hw_host_copy_part(const hw_host_copy_t *c, unsigned part, unsigned parts);

#endif
