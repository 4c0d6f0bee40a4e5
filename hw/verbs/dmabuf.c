/*
 * dmabuf.c - GPU memory for RDMA registration: asks the CUDA driver
 * (libcuda.so.1, loaded at run time so the fabric builds and runs without
 * CUDA) whether an address is device memory and, if so, exports the
 * page-aligned range around it as a dma-buf (cuMemGetHandleForAddressRange,
 * CUDA 11.7+) for ibv_reg_dmabuf_mr.
 *
 * An address CUDA does not know (host memory, or CUDA never initialised in
 * this process) is answered KVS_ENOTSUP: register it as host memory.
 */
#include "hw_verbs.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The few driver API names used, with their ABI values (cuda.h). */
typedef int hw_cu_result_t;
typedef unsigned long long hw_cu_deviceptr_t;
#define HW_CU_SUCCESS 0
#define HW_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define HW_CU_MEMORYTYPE_DEVICE 2
#define HW_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1

struct hw_verbs_cuda {
    void *lib;
    hw_cu_result_t (*pointer_get_attribute)(void *data, int attribute, hw_cu_deviceptr_t ptr);
    hw_cu_result_t (*get_handle)(void *handle, hw_cu_deviceptr_t ptr, size_t size, int type,
                                 unsigned long long flags);
    hw_cu_result_t (*error_string)(hw_cu_result_t err, const char **str);
};

hw_verbs_cuda_t *hw_verbs_cuda_open(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return NULL;
    hw_verbs_cuda_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        dlclose(lib);
        return NULL;
    }
    c->lib = lib;
    /* POSIX: a function pointer comes back from dlsym through a void *. */
    *(void **)&c->pointer_get_attribute = dlsym(lib, "cuPointerGetAttribute");
    *(void **)&c->get_handle = dlsym(lib, "cuMemGetHandleForAddressRange");
    *(void **)&c->error_string = dlsym(lib, "cuGetErrorString");
    if (c->pointer_get_attribute == NULL) {
        hw_verbs_cuda_close(c);
        return NULL;
    }
    return c;
}

void hw_verbs_cuda_close(hw_verbs_cuda_t *c)
{
    if (c == NULL)
        return;
    dlclose(c->lib);
    free(c);
}

int hw_verbs_cuda_dmabuf(void *ctx, kvs_device_t *dev, uint64_t addr, uint64_t len_bytes,
                         int *out_fd, uint64_t *out_offset, char *err_msg, size_t err_bytes)
{
    (void)dev;
    hw_verbs_cuda_t *c = ctx;
    if (c == NULL)
        return KVS_ENOTSUP;
    unsigned int type = 0;
    if (c->pointer_get_attribute(&type, HW_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) !=
            HW_CU_SUCCESS ||
        type != HW_CU_MEMORYTYPE_DEVICE)
        return KVS_ENOTSUP;
    if (c->get_handle == NULL) {
        snprintf(err_msg, err_bytes, "0x%llx is CUDA device memory but this CUDA driver has "
                 "no cuMemGetHandleForAddressRange (dma-buf export): install a driver for "
                 "CUDA 11.7 or later", (unsigned long long)addr);
        return KVS_ENOTSUP;
    }
    const long page = sysconf(_SC_PAGESIZE);
    const uint64_t mask = (uint64_t)(page > 0 ? page : 4096) - 1;
    const uint64_t base = addr & ~mask;
    const uint64_t end = (addr + len_bytes + mask) & ~mask;
    int fd = -1;
    hw_cu_result_t rc = c->get_handle(&fd, base, (size_t)(end - base),
                                      HW_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (rc != HW_CU_SUCCESS || fd < 0) {
        const char *s = NULL;
        if (c->error_string == NULL || c->error_string(rc, &s) != HW_CU_SUCCESS || s == NULL)
            s = "unknown CUDA error";
        snprintf(err_msg, err_bytes, "exporting CUDA memory [0x%llx, +%llu) as a dma-buf "
                 "failed (CUresult %d: %s): the allocation must be one cudaMalloc/cuMemAlloc "
                 "block on a GPU and driver with dma-buf support (open kernel modules)",
                 (unsigned long long)base, (unsigned long long)(end - base), rc, s);
        return KVS_EBACKEND;
    }
    *out_fd = fd;
    *out_offset = addr - base;
    return KVS_OK;
}
