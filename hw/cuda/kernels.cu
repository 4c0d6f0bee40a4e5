/*
 * kernels.cu - the gather and scatter kernels of the CUDA backend.
 *
 * One launch moves a whole descriptor: grid.z picks K or V, grid.y the
 * layer, and threads along x walk the layer's tokens x row vectors. Each
 * thread moves one vector of V bytes (uint4: 16-byte loads and stores)
 * between
 *   pool:    base[kv][j] + head_off + (pages[t / ps] * ps + t % ps) * token_bytes
 *   staging: staging + ((kv * S + slot_begin + j) * slot_bytes) + t * row_bytes
 * at vector w of the row; consecutive threads take consecutive vectors of a
 * row, then the next token, so both sides are coalesced within a row.
 * Narrower vectors (8, 4, 2, 1 bytes) serve rows or addresses that are not
 * 16-byte aligned (e.g. a head of 100 bf16). Index arithmetic is 32-bit
 * whenever a layer's vector count allows (64-bit division is slow).
 *
 * No checks here: cuda.c validated every address against live allocations.
 */
#include "kernels.h"

#include <cuda_runtime.h>

namespace {

constexpr unsigned kThreads = 256;
constexpr uint64_t kMaxGridX = 65535;

template <typename V, typename I>
__global__ void __launch_bounds__(kThreads) hw_cuda_copy_kernel(hw_cuda_copy_args_t a)
{
    const I row_vecs = (I)(a.row_bytes / sizeof(V));
    const I n = (I)a.tokens * row_vecs;
    const I ps = (I)a.page_size;
    const uint64_t j = blockIdx.y, kv = blockIdx.z;
    const uint64_t L = a.layer_count;
    char *pool = reinterpret_cast<char *>(a.words[kv * L + j] + a.head_off);
    const int64_t *pages = reinterpret_cast<const int64_t *>(a.words + 2 * L);
    char *blk = reinterpret_cast<char *>(a.staging +
                                         (kv * a.layer_slots + a.slot_begin + j) * a.slot_bytes);
    const I stride = (I)gridDim.x * kThreads;
    for (I idx = (I)blockIdx.x * kThreads + threadIdx.x; idx < n; idx += stride) {
        const I t = idx / row_vecs;
        const I w = idx - t * row_vecs;
        const I pi = t / ps;
        const uint64_t slot = (uint64_t)pages[pi] * a.page_size + (uint64_t)(t - pi * ps);
        V *pv = reinterpret_cast<V *>(pool + slot * a.token_bytes) + w;
        V *sv = reinterpret_cast<V *>(blk + (uint64_t)t * a.row_bytes) + w;
        if (a.scatter)
            *pv = *sv;
        else
            *sv = *pv;
    }
}

template <typename V>
cudaError_t hw_cuda_launch_as(const hw_cuda_copy_args_t *a, cudaStream_t s)
{
    const uint64_t n = a->tokens * (a->row_bytes / sizeof(V));
    uint64_t gx = (n + kThreads - 1) / kThreads;
    if (gx > kMaxGridX)
        gx = kMaxGridX;
    const dim3 grid((unsigned)gx, (unsigned)a->layer_count, 2);
    /* 32-bit indices when idx + stride cannot wrap. */
    if (n + gx * kThreads <= UINT32_MAX)
        hw_cuda_copy_kernel<V, uint32_t><<<grid, kThreads, 0, s>>>(*a);
    else
        hw_cuda_copy_kernel<V, uint64_t><<<grid, kThreads, 0, s>>>(*a);
    return cudaGetLastError();
}

} // namespace

extern "C" int hw_cuda_copy_launch(const hw_cuda_copy_args_t *a, unsigned vec_bytes,
                                   void *stream)
{
    if (a->tokens == 0 || a->layer_count == 0 || a->row_bytes == 0)
        return (int)cudaSuccess;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (vec_bytes) {
    case 16:
        return (int)hw_cuda_launch_as<uint4>(a, s);
    case 8:
        return (int)hw_cuda_launch_as<uint2>(a, s);
    case 4:
        return (int)hw_cuda_launch_as<unsigned int>(a, s);
    case 2:
        return (int)hw_cuda_launch_as<unsigned short>(a, s);
    case 1:
        return (int)hw_cuda_launch_as<unsigned char>(a, s);
    default:
        return (int)cudaErrorInvalidValue;
    }
}

extern "C" int hw_cuda_kernels_probe(void)
{
    cudaFuncAttributes attr;
    return (int)cudaFuncGetAttributes(&attr, hw_cuda_copy_kernel<uint4, uint32_t>);
}
