/*
 * cuda.h - the CUDA device backend of kvstage ("cuda"): KV pools, staging
 * ring and staging buffers in cudaMalloc'd memory of one GPU, gather and
 * scatter as CUDA kernels, one CUDA stream per kvstage stream (the core
 * makes one per role: the prefill gather stream, the decode scatter
 * stream) and CUDA events for completion.
 *
 * Built only where a CUDA compiler was found (library kvstage_cuda). Device
 * addresses are CUDA device pointers. Every CUDA error becomes a kvstage
 * status (never a raw cudaError_t) with the CUDA error's name and text and
 * what to change in the device's last backend message; the cudaError_t value
 * is its last_backend_code. A create on a machine without a usable GPU or
 * driver fails cleanly with KVS_EBACKEND and says so.
 *
 * Threads: every call on one device is serialised by the device's mutex;
 * each call first makes the device's GPU current on the calling thread.
 * mem_free waits for the GPU (cudaFree does). mem_read/mem_write are
 * synchronous (a write has landed when it returns, so copies queued after
 * it see the bytes) but do not wait for kvstage streams: wait for an event
 * before reading what a copy wrote.
 *
 * Waiting (device ops wait_arm, backend.h): the device owns an eventfd that
 * becomes readable when an event recorded on any of its streams completes
 * after the last wait_arm (a host function queued after each event writes
 * it, at most once per arm). wait_arm may be called from any thread.
 */
#ifndef KVSTAGE_CUDA_H
#define KVSTAGE_CUDA_H

#include <kvstage/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_cuda_device kvs_cuda_device_t;

typedef struct kvs_cuda_config {
    int ordinal;            /* CUDA device number, as cudaSetDevice takes it */
    uint32_t max_allocs;    /* live allocations, 0 -> 4096 */
    uint32_t max_streams;   /* live streams, 0 -> 16 */
    uint32_t max_events;    /* live events, 0 -> 4096 */
    uint32_t desc_slots;    /* descriptors in flight per stream, 0 -> 64 */
} kvs_cuda_config_t;

/* Creates a device on GPU cfg->ordinal (cfg NULL: GPU 0, defaults). On
 * failure nothing is left to free and err (may be NULL) says what to change:
 * no CUDA device or driver, an ordinal out of range, out of memory. */
KVS_API int kvs_cuda_device_create(const kvs_cuda_config_t *cfg, kvs_cuda_device_t **out,
                                   kvs_error_t *err);
/* Waits for the GPU, then frees the device with every allocation, stream
 * and event still live on it. NULL: no-op. */
KVS_API void kvs_cuda_device_destroy(kvs_cuda_device_t *cuda);
/* The kvs_device_t to hand to the core; owned by cuda. */
KVS_API kvs_device_t *kvs_cuda_device(kvs_cuda_device_t *cuda);
/* The CUDA device behind dev, or NULL when dev is another backend's. */
KVS_API kvs_cuda_device_t *kvs_cuda_device_from(kvs_device_t *dev);

/* The application's GPU memory (an engine's KV pool: torch CUDA tensors)
 * made usable by the device's kernels: [addr, addr + len_bytes) must be
 * memory of this device's GPU (cudaPointerGetAttributes says so) and
 * overlap no live range. The device never frees it; the caller keeps it
 * alive and detaches it before freeing it or destroying the device.
 * KVS_EINVAL naming what is wrong, KVS_EFULL past max_allocs. */
KVS_API int kvs_cuda_mem_attach(kvs_device_t *dev, uint64_t addr, uint64_t len_bytes,
                                kvs_error_t *err);
/* Removes an attached range after the GPU finished every queued kernel.
 * KVS_ENOENT when addr starts no attached range. */
KVS_API int kvs_cuda_mem_detach(kvs_device_t *dev, uint64_t addr, kvs_error_t *err);

/* The cudaStream_t of a stream of dev (for timing or interop), or NULL. */
KVS_API void *kvs_cuda_stream_handle(kvs_device_t *dev, kvs_stream_t *stream);
/* Blocks until every op enqueued on stream so far has run. */
KVS_API int kvs_cuda_stream_sync(kvs_device_t *dev, kvs_stream_t *stream);
/* Blocks until event is complete (what event_query would report as KVS_OK). */
KVS_API int kvs_cuda_event_wait(kvs_device_t *dev, kvs_event_t *event);

#ifdef __cplusplus
}
#endif
#endif /* KVSTAGE_CUDA_H */
