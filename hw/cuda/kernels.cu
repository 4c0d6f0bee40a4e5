/*
 * kernels.cu - the gather and scatter kernels of the CUDA backend: one
 * launch of hw_cuda_copy_thread (copy_thread.cuh, which holds all of the
 * kernels' arithmetic and says how the grid walks a descriptor) per
 * gather or scatter, on the caller's stream.
 *
 * No checks here: cuda.c validated every address against live allocations.
 */
#include "kernels.h"

#include <cuda_runtime.h>

#include "copy_thread.cuh"

namespace {

template <typename V, typename I>
__global__ void __launch_bounds__(HW_CUDA_THREADS) hw_cuda_copy_kernel(hw_cuda_copy_args_t a)
{
    hw_cuda_copy_thread<V, I>(a, blockIdx.x, threadIdx.x, gridDim.x, blockIdx.y, blockIdx.z);
}

/* hw_cuda_copy_dispatch's launcher: the kernel on a stream. */
struct hw_cuda_launcher {
    cudaStream_t s;

    template <typename V, typename I>
    int launch(const hw_cuda_copy_args_t &a, const hw_cuda_grid_t &g)
    {
        hw_cuda_copy_kernel<V, I><<<dim3(g.x, g.y, g.z), HW_CUDA_THREADS, 0, s>>>(a);
        return (int)cudaGetLastError();
    }
};

} // namespace

extern "C" int hw_cuda_copy_launch(const hw_cuda_copy_args_t *a, unsigned vec_bytes,
                                   void *stream)
{
    hw_cuda_launcher l = {static_cast<cudaStream_t>(stream)};
    return hw_cuda_copy_dispatch(*a, vec_bytes, l);
}

extern "C" int hw_cuda_kernels_probe(void)
{
    cudaFuncAttributes attr;
    return (int)cudaFuncGetAttributes(&attr, hw_cuda_copy_kernel<uint4, uint32_t>);
}
