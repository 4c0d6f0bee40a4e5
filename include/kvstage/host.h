/*
 * host.h - the host device backend of kvstage ("host"): a kvstage device
 * whose memory is plain host memory and whose gather/scatter run on the CPU.
 *
 * It is a real device for machines without a GPU (CPU serving, tests of the
 * fabric backends on plain RAM, a reference for the CUDA backend), not a
 * model: no simulated clock, no modeled time. Each stream is an ordered
 * queue served by its own worker thread, so gather and scatter are
 * asynchronous like GPU kernels and events complete when the worker has run
 * every op enqueued before them. With copy_threads > 1 each stream also has
 * helper threads that take a share of every large op's layers (one core
 * keeps only so many cache misses in flight; strided copies need more).
 *
 * Device addresses ARE host virtual addresses (uint64_t of the pointer), so
 * a fabric backend can register them directly. Allocations are anonymous
 * mappings: page aligned, zero filled, 2 MiB aligned and backed by
 * transparent huge pages where the kernel allows (from 2 MiB up).
 *
 * Threads: every call on one device is serialised by the device's mutex, so
 * the device may be used from several threads. gather/scatter block only
 * when the stream's queue is full (until its worker frees a slot).
 * mem_free waits for every stream to finish its queued ops first (like
 * cudaFree), so no queued op ever reads freed memory; mem_read/mem_write do
 * NOT wait for streams: wait for an event first.
 *
 * Waiting (device ops wait_arm, backend.h): the device owns an eventfd that
 * becomes readable when an op on any of its streams completes after the
 * last wait_arm; its workers write it at most once per arm. wait_arm may be
 * called from any thread.
 */
#ifndef KVSTAGE_HOST_H
#define KVSTAGE_HOST_H

#include <kvstage/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_host_device kvs_host_device_t;

typedef struct kvs_host_config {
    const char *name;       /* instance name for messages, copied; NULL -> "host" */
    uint32_t max_allocs;    /* live allocations, 0 -> 4096 */
    uint32_t max_streams;   /* live streams (one worker thread each), 0 -> 16 */
    uint32_t max_events;    /* live events, 0 -> 65536 */
    uint32_t queue_ops;     /* ops queued per stream before gather blocks, 0 -> 64 */
    uint32_t copy_threads;  /* threads sharing each large op (its layers split
                             * between them), the stream's worker included;
                             * 0 -> 1 */
    uint32_t max_vector_bytes; /* widest vector store large copies use: 16,
                                * 32 or 64 bytes; 0 -> the widest this CPU
                                * runs (lower it where wide vectors slow the
                                * clock) */
} kvs_host_config_t;

/* Creates a host device (cfg may be NULL for the defaults). On failure
 * nothing is left to free and err (may be NULL) says what to change. */
KVS_API int kvs_host_device_create(const kvs_host_config_t *cfg, kvs_host_device_t **out,
                                   kvs_error_t *err);
/* Waits for every stream's queued ops, joins the workers and frees the
 * device with all memory, streams and events still live on it. NULL: no-op. */
KVS_API void kvs_host_device_destroy(kvs_host_device_t *host);
/* The kvs_device_t to hand to the core; owned by host. */
KVS_API kvs_device_t *kvs_host_device(kvs_host_device_t *host);
/* The host device behind dev, or NULL when dev is another backend's. */
KVS_API kvs_host_device_t *kvs_host_device_from(kvs_device_t *dev);

/* The application's own memory (an engine's KV pool: torch or numpy
 * arrays) made usable by the device's copies: [ptr, ptr + len_bytes) is
 * added to the ranges gathers and scatters may touch (its device address
 * is ptr itself). The device never frees it; the caller keeps it alive and
 * detaches it (kvs_host_mem_detach) before freeing it or destroying the
 * device. KVS_EINVAL when the range is empty, NULL or overlaps a live range
 * (attach each range once: merge overlapping arrays' ranges first), KVS_EFULL
 * past max_allocs; err (may be NULL) and the device say which. */
KVS_API int kvs_host_mem_attach(kvs_device_t *dev, const void *ptr, uint64_t len_bytes,
                                kvs_error_t *err);
/* Removes a range kvs_host_mem_attach added, waiting for queued copies that
 * may still touch it. KVS_ENOENT when ptr starts no attached range. */
KVS_API int kvs_host_mem_detach(kvs_device_t *dev, const void *ptr, kvs_error_t *err);

/* Host pointer of [addr, addr + len_bytes) when it lies inside one live
 * allocation of dev, else NULL. Valid until that allocation is freed. */
KVS_API void *kvs_host_ptr(kvs_device_t *dev, uint64_t addr, uint64_t len_bytes);
/* Blocks until every op enqueued on stream so far has run. */
KVS_API int kvs_host_stream_sync(kvs_device_t *dev, kvs_stream_t *stream);
/* Blocks until event is complete (what event_query would report as KVS_OK). */
KVS_API int kvs_host_event_wait(kvs_device_t *dev, kvs_event_t *event);

#ifdef __cplusplus
}
#endif
#endif /* KVSTAGE_HOST_H */
