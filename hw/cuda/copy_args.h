/*
 * copy_args.h - what one CUDA gather or scatter hands its kernel, computed
 * from a descriptor kvs_copy_desc_check accepted: the words the kernel
 * reads (layer bases and page ids), the launch arguments and the widest
 * vector every offset and address allows.
 *
 * Plain C, no CUDA runtime: cuda.c prepares every launch with it, and
 * test_cuda_kernels prepares its launches of the kernels' arithmetic on
 * host memory (no GPU) with the same code. Keeps no state.
 */
#ifndef KVS_HW_CUDA_COPY_ARGS_H
#define KVS_HW_CUDA_COPY_ARGS_H

#include <kvstage/backend.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* Words the kernel reads for d: 2 * layer_count + pages_used, twice with
 * scale planes (the scale launch's own bases and page ids after them).
 * Bounded by validated allocations, so no overflow. */
size_t hw_cuda_copy_words(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh);

/* Writes the words of d into words (hw_cuda_copy_words of them): [K base of
 * copy layer j at j | V base at layer_count + j | page ids after them],
 * then with scales the same for the K and V scale buffers. */
void hw_cuda_copy_words_fill(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                             uint64_t *words);

/* The kernel's arguments for d, reading its words at words (device memory
 * on a GPU; borrowed, must hold them until the launch completed). */
hw_cuda_copy_args_t hw_cuda_copy_args_of(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                                         const uint64_t *words, bool scatter);

/* The widest vector (16, 8, 4, 2 or 1 bytes) dividing every row, slot and
 * head offset and every address of d. */
unsigned hw_cuda_copy_vec_bytes(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh);

/* The second launch of a copy with scale planes (sh->scale_row_bytes > 0):
 * the same kernel over the scale buffers (the words after the first
 * launch's), rows of scale_row_bytes at scale_off in each staging slot,
 * slots slot_bytes apart as the KV rows'. */
hw_cuda_copy_args_t hw_cuda_copy_scale_args_of(const kvs_copy_desc_t *d,
                                               const kvs_copy_shape_t *sh,
                                               const uint64_t *words, bool scatter);

/* hw_cuda_copy_vec_bytes of the scale launch. */
unsigned hw_cuda_copy_scale_vec_bytes(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh);

#endif
