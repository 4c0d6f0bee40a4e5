/*
 * kernels.h - the C interface of hw/cuda/kernels.cu: one launch of the
 * gather or scatter kernel for a validated descriptor. cuda.c prepares the
 * arguments (copy_args.c: device-side copy of the layer bases and page ids,
 * the vector width every address allows) and turns the returned cudaError_t
 * into a kvstage status; kernels.cu knows nothing of kvstage objects. The
 * kernels' arithmetic is in copy_thread.cuh.
 */
#ifndef KVS_HW_CUDA_KERNELS_H
#define KVS_HW_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest grid y extent: layers copied by one launch. */
#define HW_CUDA_MAX_LAYERS 65535u
/* Threads per block, and the most blocks along x (threads stride beyond). */
#define HW_CUDA_THREADS 256u
#define HW_CUDA_MAX_GRID_X 65535u

typedef struct hw_cuda_copy_args {
    /* Device memory, read by the kernel: [K base of copy layer j at j |
     * V base at layer_count + j (0 and never read with one plane) | page
     * ids (int64_t) after them]. */
    const uint64_t *words;
    uint64_t staging;      /* device address of the staging block */
    uint64_t layer_count;  /* 1..HW_CUDA_MAX_LAYERS */
    uint64_t page_size;    /* tokens per page */
    uint64_t tokens;
    uint64_t slot_begin;   /* staging slot of copy layer 0 */
    uint64_t layer_slots;  /* S */
    uint64_t row_bytes;    /* bytes per token copied */
    uint64_t token_bytes;  /* stride of token slots in the pool */
    uint64_t head_off;     /* bytes from a slot's start to head_start */
    uint64_t slot_bytes;   /* from one staging slot to the next: tokens *
                              (row_bytes + scale rows' bytes) */
    int scatter;           /* staging -> pool; else pool -> staging */
    uint32_t planes;       /* 2: K and V (grid z 2); 1: K only (MLA) */
} hw_cuda_copy_args_t;

/* One launch's grid (blocks of HW_CUDA_THREADS threads) and index width
 * (copy_thread.cuh's hw_cuda_copy_grid_as computes it). */
typedef struct hw_cuda_grid {
    uint32_t x, y, z;
    uint32_t index_bits; /* 32 or 64 */
} hw_cuda_grid_t;

/*
 * Enqueues one launch covering every layer and K and V (K alone with one
 * plane) on `stream` (a cudaStream_t): grid (x: vectors of a layer's rows,
 * y: layer, z: K/V, of extent planes).
 * vec_bytes (16, 8, 4, 2 or 1) must divide row_bytes, token_bytes,
 * head_off, slot_bytes and every address; 16 gives 16-byte vector loads and
 * stores. Returns the cudaError_t of the launch (cudaGetLastError right
 * after it) as an int; cudaSuccess (0) when nothing was launched because
 * the copy is empty.
 */
int hw_cuda_copy_launch(const hw_cuda_copy_args_t *a, unsigned vec_bytes, void *stream);

/* cudaFuncGetAttributes on a kernel of this build for the current device:
 * cudaErrorNoKernelImageForDevice (as int) when the GPU's architecture is
 * not among CMAKE_CUDA_ARCHITECTURES. */
int hw_cuda_kernels_probe(void);

#ifdef __cplusplus
}
#endif
#endif
