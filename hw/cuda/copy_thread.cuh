/*
 * copy_thread.cuh - the arithmetic of the gather and scatter kernels as
 * __host__ __device__ code: what decides which bytes move where, written
 * once for the GPU and for a check on the CPU.
 *
 * kernels.cu launches it on the GPU; tests/cuda/kernels_emu.cu compiles the
 * same code with nvcc as host code and calls hw_cuda_copy_thread for every
 * block and thread of the same grid on host memory, which test_cuda_kernels
 * compares with the host backend byte for byte on a machine without a GPU
 * (docs/cuda.md says what that check covers and what only a GPU checks).
 * Change the arithmetic here, never in a copy.
 *
 * One launch moves a whole descriptor: grid.z picks K or V, grid.y the
 * layer, and threads along x walk the layer's tokens x row vectors. Each
 * thread moves one vector of V bytes (uint4: 16-byte loads and stores)
 * between
 *   pool:    base[kv][j] + head_off + (pages[t / ps] * ps + t % ps) * token_bytes
 *   staging: staging + ((kv * S + slot_begin + j) * slot_bytes) + t * row_bytes
 * at vector w of the row; consecutive threads take consecutive vectors of a
 * row, then the next token, so both sides are coalesced within a row. A
 * grid of at most HW_CUDA_MAX_GRID_X blocks along x covers any row count:
 * each thread strides by the grid's thread count. Narrower vectors (8, 4, 2,
 * 1 bytes) serve rows or addresses that are not 16-byte aligned (e.g. a
 * head of 100 bf16). Index arithmetic is 32-bit whenever a layer's vector
 * count allows (64-bit division is slow).
 *
 * Invariants: no thread writes a byte another thread of the launch writes,
 * so threads may run in any order; nothing here checks an address (cuda.c
 * validated every one against live allocations).
 */
#ifndef KVS_HW_CUDA_COPY_THREAD_CUH
#define KVS_HW_CUDA_COPY_THREAD_CUH

#include "kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>

/* The launch geometry of one copy in V-byte vectors: x blocks walk a
 * layer's tokens x row vectors (at most HW_CUDA_MAX_GRID_X, each thread
 * then strides), y the layers, z K and V (K alone with one plane); 32-bit
 * indices when no thread's
 * idx + stride can wrap. */
template <typename V>
__host__ inline hw_cuda_grid_t hw_cuda_copy_grid_as(const hw_cuda_copy_args_t &a)
{
    const uint64_t n = a.tokens * (a.row_bytes / sizeof(V));
    uint64_t gx = (n + HW_CUDA_THREADS - 1) / HW_CUDA_THREADS;
    if (gx > HW_CUDA_MAX_GRID_X)
        gx = HW_CUDA_MAX_GRID_X;
    hw_cuda_grid_t g;
    g.x = (uint32_t)gx;
    g.y = (uint32_t)a.layer_count;
    g.z = a.planes == 1 ? 1u : 2u;
    g.index_bits = n + gx * HW_CUDA_THREADS <= UINT32_MAX ? 32u : 64u;
    return g;
}

/* The move of one vector between the pool (pv) and staging (sv). */
struct hw_cuda_move {
    template <typename V>
    __host__ __device__ void operator()(V *pv, V *sv, int scatter) const
    {
        if (scatter)
            *pv = *sv;
        else
            *sv = *pv;
    }
};

/* What thread tx of block (bx, j, kv) does in a grid of gx blocks along x:
 * moves its vectors of layer j's K (kv 0) or V (kv 1) rows, V-sized, with
 * I-wide indices. The kernels move with hw_cuda_move; the CPU check also
 * passes one that records where each thread writes. */
template <typename V, typename I, typename M = hw_cuda_move>
__host__ __device__ inline void hw_cuda_copy_thread(const hw_cuda_copy_args_t a, uint32_t bx,
                                                    uint32_t tx, uint32_t gx, uint32_t j_,
                                                    uint32_t kv_, M move = M())
{
    const I row_vecs = (I)(a.row_bytes / sizeof(V));
    const I n = (I)a.tokens * row_vecs;
    const I ps = (I)a.page_size;
    const uint64_t j = j_, kv = kv_;
    const uint64_t L = a.layer_count;
    char *pool = reinterpret_cast<char *>(a.words[kv * L + j] + a.head_off);
    const int64_t *pages = reinterpret_cast<const int64_t *>(a.words + 2 * L);
    char *blk = reinterpret_cast<char *>(a.staging +
                                         (kv * a.layer_slots + a.slot_begin + j) * a.slot_bytes);
    const I stride = (I)gx * HW_CUDA_THREADS;
    for (I idx = (I)bx * HW_CUDA_THREADS + tx; idx < n; idx += stride) {
        const I t = idx / row_vecs;
        const I w = idx - t * row_vecs;
        const I pi = t / ps;
        const uint64_t slot = (uint64_t)pages[pi] * a.page_size + (uint64_t)(t - pi * ps);
        V *pv = reinterpret_cast<V *>(pool + slot * a.token_bytes) + w;
        V *sv = reinterpret_cast<V *>(blk + (uint64_t)t * a.row_bytes) + w;
        move(pv, sv, a.scatter);
    }
}

template <typename V, typename L>
__host__ inline int hw_cuda_copy_dispatch_as(const hw_cuda_copy_args_t &a, L &launcher)
{
    const hw_cuda_grid_t g = hw_cuda_copy_grid_as<V>(a);
    if (g.index_bits == 32)
        return launcher.template launch<V, uint32_t>(a, g);
    return launcher.template launch<V, uint64_t>(a, g);
}

/*
 * Picks the vector type of vec_bytes (16: uint4, 8: uint2, 4, 2, 1) and the
 * index type and grid of hw_cuda_copy_grid_as, and returns
 * launcher.launch<V, I>(a, grid): a cudaError_t as int. An empty copy
 * (no tokens, layers or row bytes) launches nothing and returns cudaSuccess;
 * another vec_bytes returns cudaErrorInvalidValue.
 */
template <typename L>
__host__ inline int hw_cuda_copy_dispatch(const hw_cuda_copy_args_t &a, unsigned vec_bytes,
                                          L &launcher)
{
    if (a.tokens == 0 || a.layer_count == 0 || a.row_bytes == 0)
        return (int)cudaSuccess;
    switch (vec_bytes) {
    case 16:
        return hw_cuda_copy_dispatch_as<uint4>(a, launcher);
    case 8:
        return hw_cuda_copy_dispatch_as<uint2>(a, launcher);
    case 4:
        return hw_cuda_copy_dispatch_as<unsigned int>(a, launcher);
    case 2:
        return hw_cuda_copy_dispatch_as<unsigned short>(a, launcher);
    case 1:
        return hw_cuda_copy_dispatch_as<unsigned char>(a, launcher);
    default:
        return (int)cudaErrorInvalidValue;
    }
}

#endif
