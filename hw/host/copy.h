/*
 * copy.h - the CPU copy engine of the host device backend: runs one
 * validated gather or scatter (a snapshot of a kvs_copy_desc_t turned into
 * host pointers), or one fused copy of several parts (gather_parts /
 * scatter_parts), on the calling thread. It never fails and never checks:
 * host.c validates the descriptor against live memory before enqueueing and
 * keeps that memory alive until the op has run.
 */
#ifndef KVS_HW_HOST_COPY_H
#define KVS_HW_HOST_COPY_H

#include <stdbool.h>
#include <stdint.h>

/* One part of a copy: a head range of every token slot and its staging
 * block. */
typedef struct hw_host_copy_part {
    uint8_t *staging;           /* start of the part's staging block */
    uint64_t head_off;          /* bytes from a token slot's start to its heads */
    uint64_t row_bytes;         /* bytes copied per token */
    uint64_t slot_bytes;        /* tokens * row_bytes: the bytes copied per slot */
    uint64_t slot_stride;       /* from one staging slot to the next: slot_bytes,
                                 * more when the slot also holds scale rows */
} hw_host_copy_part_t;

typedef struct hw_host_copy {
    bool scatter;               /* staging -> pool; else pool -> staging */
    uint8_t *const *pool;       /* [2 * layer_count]: K of copy layer j at [j], V at
                                 * [layer_count + j], each at its first token slot */
    const int64_t *pages;       /* ceil(tokens / page_size) page ids */
    const hw_host_copy_part_t *parts; /* nparts >= 1 parts, in one pass */
    uint64_t nparts;
    uint64_t layer_count;
    uint64_t page_size;         /* tokens per page */
    uint64_t tokens;
    uint64_t slot_begin;        /* staging slot of copy layer 0 */
    uint64_t layer_slots;       /* S: slots per K (and per V) half of a block */
    uint64_t token_bytes;       /* stride of token slots in the pool */
    uint32_t max_vector_bytes;  /* widest streaming store: 16, 32 or 64 */
    uint64_t planes;            /* 2: K and V; 1: K only (MLA: pool[L + j] is
                                 * never read, the block has S slots) */
} hw_host_copy_t;

/* Payload bytes of the copy: every part's slot of every layer, of each plane. */
uint64_t hw_host_copy_bytes(const hw_host_copy_t *c);

/* Performs the copy. For each part q: layer j, K (kv 0) or V (kv 1), token
 * i goes between pool[kv * layer_count + j] + (pages[i / ps] * ps + i % ps)
 * * token_bytes + q.head_off and q.staging + ((kv * S + slot_begin + j) *
 * q.slot_stride) + i * q.row_bytes. The parts of a scatter write disjoint
 * heads, those of a gather disjoint staging blocks. */
void hw_host_copy_run(const hw_host_copy_t *c);

/* Performs share `part` of `parts` (0 <= part < parts) of the copy: the
 * (K/V, layer) buffers kv * layer_count + j in [part * n / parts,
 * (part + 1) * n / parts) with n = planes * layer_count. The shares of one copy
 * touch disjoint bytes and may run on different threads at once. */
void hw_host_copy_part(const hw_host_copy_t *c, unsigned part, unsigned parts);

#endif
