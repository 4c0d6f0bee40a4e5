/*
 * kernels_emu.h - the CUDA gather/scatter kernels run on the CPU, for
 * test_cuda_kernels: kernels_emu.cu compiles hw/cuda/copy_thread.cuh, the
 * code every kernel thread runs, with nvcc as host code, and calls it for
 * every block and thread of the launch's grid on host memory (device
 * addresses in the arguments are host addresses). No GPU, driver or CUDA
 * call is involved.
 */
#ifndef KVS_TESTS_CUDA_KERNELS_EMU_H
#define KVS_TESTS_CUDA_KERNELS_EMU_H

#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How to deviate from the launch hw_cuda_copy_launch makes, to check that
 * the arithmetic holds for any grid: grid_x_max > 0 cuts the grid to at
 * most that many blocks along x (each thread then strides over more
 * vectors); index_bits 32 or 64 forces that index width (0: as launched). */
typedef struct emu_launch {
    uint32_t grid_x_max;
    uint32_t index_bits;
} emu_launch_t;

/* What an emulated launch did. */
typedef struct emu_result {
    hw_cuda_grid_t grid;       /* as run; zeroed when nothing ran */
    uint64_t moves;            /* vector moves the threads made */
    uint64_t moves_distinct;   /* distinct destination vectors among them */
} emu_result_t;

/* Runs the copy hw_cuda_copy_launch(a, vec_bytes, stream) would launch,
 * thread by thread, on host memory, as varied by how (NULL: as launched),
 * and runs the same grid again recording where each thread writes (into
 * *res, which may be NULL). Returns what hw_cuda_copy_launch returns for
 * the same arguments (cudaSuccess 0, also for an empty copy;
 * cudaErrorInvalidValue for a vec_bytes the kernels do not take), or
 * cudaErrorMemoryAllocation when the record does not fit in host memory. */
int emu_copy_run(const hw_cuda_copy_args_t *a, unsigned vec_bytes, const emu_launch_t *how,
                 emu_result_t *res);

/* The grid and index width hw_cuda_copy_launch picks for a and vec_bytes,
 * without touching memory (a's addresses may be anything): returns 0 and
 * fills *grid, or returns as emu_copy_run when nothing would be launched
 * (*grid zeroed). */
int emu_copy_grid(const hw_cuda_copy_args_t *a, unsigned vec_bytes, hw_cuda_grid_t *grid);

#ifdef __cplusplus
}
#endif
#endif
