/*
 * kernels_emu.cu - kernels_emu.h: the CUDA kernels' arithmetic
 * (hw/cuda/copy_thread.cuh) compiled by nvcc as host code and run over an
 * emulated grid. Host code only: no kernel, no CUDA runtime call. Threads
 * run one after another, blocks in order. That stands for any order on a
 * GPU only while no two threads write the same bytes (copy_thread.cuh's
 * invariant): each launch runs twice, the second time recording where
 * every thread writes, so the test checks that invariant too.
 */
#include "kernels_emu.h"

#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "copy_thread.cuh"

namespace {

/* A move that records the destination of each vector instead of moving. */
struct emu_record {
    uintptr_t *dst;
    uint64_t cap, n;

    template <typename V>
    __host__ __device__ void operator()(V *pv, V *sv, int scatter)
    {
        if (n < cap)
            dst[n] = (uintptr_t)(scatter ? pv : sv);
        n++;
    }
};

/* hw_cuda_copy_dispatch's launcher: every thread of the grid, on the CPU. */
struct emu_launcher {
    emu_launch_t how;
    emu_result_t res;

    template <typename V, typename I, typename M>
    void run_grid(const hw_cuda_copy_args_t &a, const hw_cuda_grid_t &g, M &move)
    {
        for (uint32_t kv = 0; kv < g.z; kv++)
            for (uint32_t j = 0; j < g.y; j++)
                for (uint32_t bx = 0; bx < g.x; bx++)
                    for (uint32_t tx = 0; tx < HW_CUDA_THREADS; tx++)
                        hw_cuda_copy_thread<V, I, M &>(a, bx, tx, g.x, j, kv, move);
    }

    /* The copy, then the record of where it wrote. */
    template <typename V, typename I>
    int run_both(const hw_cuda_copy_args_t &a, const hw_cuda_grid_t &g)
    {
        hw_cuda_move move;
        run_grid<V, I>(a, g, move);
        /* Room for every vector once, plus one to see a thread too many. */
        emu_record rec = {NULL, a.tokens * (a.row_bytes / sizeof(V)) * g.y * g.z + 1, 0};
        rec.dst = (uintptr_t *)malloc(rec.cap * sizeof *rec.dst);
        if (rec.dst == NULL)
            return (int)cudaErrorMemoryAllocation;
        run_grid<V, I>(a, g, rec);
        const uint64_t kept = rec.n < rec.cap ? rec.n : rec.cap;
        std::sort(rec.dst, rec.dst + kept);
        uint64_t distinct = 0;
        for (uint64_t i = 0; i < kept; i++)
            distinct += i == 0 || rec.dst[i] != rec.dst[i - 1];
        free(rec.dst);
        res.moves = rec.n;
        res.moves_distinct = distinct;
        return (int)cudaSuccess;
    }

    template <typename V, typename I>
    int launch(const hw_cuda_copy_args_t &a, const hw_cuda_grid_t &launched)
    {
        hw_cuda_grid_t g = launched;
        if (how.grid_x_max > 0 && g.x > how.grid_x_max)
            g.x = how.grid_x_max;
        if (how.index_bits != 0)
            g.index_bits = how.index_bits;
        res.grid = g;
        if (g.index_bits == 32)
            return run_both<V, uint32_t>(a, g);
        return run_both<V, uint64_t>(a, g);
    }
};

/* hw_cuda_copy_dispatch's launcher that only records the grid. */
struct emu_geometry {
    hw_cuda_grid_t g;

    template <typename V, typename I>
    int launch(const hw_cuda_copy_args_t &, const hw_cuda_grid_t &launched)
    {
        g = launched;
        return (int)cudaSuccess;
    }
};

} // namespace

extern "C" int emu_copy_run(const hw_cuda_copy_args_t *a, unsigned vec_bytes,
                            const emu_launch_t *how, emu_result_t *res)
{
    emu_launcher l;
    memset(&l, 0, sizeof l);
    if (how != NULL)
        l.how = *how;
    const int rc = hw_cuda_copy_dispatch(*a, vec_bytes, l);
    if (res != NULL)
        *res = l.res;
    return rc;
}

extern "C" int emu_copy_grid(const hw_cuda_copy_args_t *a, unsigned vec_bytes,
                             hw_cuda_grid_t *grid)
{
    emu_geometry l;
    memset(&l, 0, sizeof l);
    const int rc = hw_cuda_copy_dispatch(*a, vec_bytes, l);
    *grid = l.g;
    return rc;
}
