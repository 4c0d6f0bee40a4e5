/*
 * cuda.c - the CUDA device backend of cuda.h ("cuda"): kvstage device ops
 * on the CUDA runtime of one GPU.
 *
 * What it does:
 * - Memory: cudaMalloc / cudaFree. Live allocations sit in the allocation
 *   table of hw/common/alloc_table.c (sorted by address; an entry's base is
 *   the cudaMalloc pointer), against which every descriptor and
 *   mem_read/mem_write range is validated before anything reaches the GPU
 *   (a bad descriptor is a status, never a GPU fault).
 * - Streams: one non-blocking cudaStream_t each. A gather/scatter validates
 *   the descriptor (kvs_copy_desc_check of backend.h, the check every
 *   device backend runs), writes the layer bases and page ids into the
 *   stream's next descriptor slot (a pinned host buffer), copies it to the
 *   slot's device buffer with cudaMemcpyAsync and launches the kernel
 *   (kernels.cu; its arguments from copy_args.c) on the stream; an event
 *   recorded after the launch tells when the slot may be reused (the slot
 *   ring has desc_slots entries, so reuse waits only when that many copies
 *   are in flight).
 * - Events: cudaEvent_t without timing, created on first use of a slot and
 *   reused; event_query maps cudaErrorNotReady to KVS_EAGAIN.
 * - Waiting (wait_arm): the device's eventfd (hw/common/wait_fd.h).
 *   event_record queues, right after the event, a host function
 *   (cudaLaunchHostFunc) that runs on a CUDA thread once everything before
 *   it on the stream is done and signals it. The event is complete before
 *   its host function runs, so after an arm a recorded event either is
 *   seen complete by the caller's next event_query or writes the eventfd.
 *   The cost is one host function per recorded event (the stream waits for
 *   it: microseconds), paid whether or not anyone waits. A stream whose
 *   kernel faulted never runs its host functions: the error surfaces at
 *   the next event_query the caller makes for another reason (its
 *   deadline).
 * - Errors: every CUDA call goes through HW_CUDA_TRY, which turns a
 *   cudaError_t into a kvstage status with the call, the CUDA error's name
 *   and text and what to change in the device's last backend message; the
 *   error value is last_backend_code. Launches are checked with
 *   cudaGetLastError right after them (kernels.cu).
 *
 * What it does not: no peer access, no multi-GPU device, no CUDA graphs;
 * errors of kernels already running surface at the next call or event query
 * (CUDA's sticky errors: the process must restart after them).
 *
 * Locking: cuda->mu guards every table and is held for the whole of each
 * call except the blocking waits of kvs_cuda_stream_sync and
 * kvs_cuda_event_wait. Every call makes the device's GPU current first.
 *
 * Invariants: allocs holds every live cudaMalloc of the device; a
 * descriptor slot's buffers are rewritten only after its `done` event
 * completed; stream and event slots live in arrays owned by the device, so
 * their pointers stay valid memory until the device is destroyed; a slot is
 * live exactly when its index is out of the device's free-slot table
 * (hw/common/slots.c).
 */
#include <kvstage/cuda.h>

#include "alloc_table.h"
#include "copy_args.h"
#include "kernels.h"
#include "slots.h"
#include "wait_fd.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HW_CUDA_DEFAULT_MAX_ALLOCS 4096u
#define HW_CUDA_DEFAULT_MAX_STREAMS 16u
#define HW_CUDA_DEFAULT_MAX_EVENTS 4096u
#define HW_CUDA_DEFAULT_DESC_SLOTS 64u
/* First size of a descriptor slot: 80 layers x 2 bases + 1024 pages. */
#define HW_CUDA_SLOT_MIN_WORDS 1184u

/* One descriptor copy in flight: [K bases | V bases | pages] as words. */
typedef struct hw_cuda_slot {
    uint64_t *host;     /* pinned (cudaHostAlloc) */
    uint64_t *dev;      /* device (cudaMalloc) */
    size_t cap_words;
    cudaEvent_t done;   /* recorded after the last op that read the slot */
    bool has_event;
    bool pending;       /* done was recorded since the slot was last reused */
} hw_cuda_slot_t;

struct kvs_stream {
    kvs_cuda_device_t *cuda;
    cudaStream_t s;
    hw_cuda_slot_t *slots; /* desc_slots */
    uint32_t next;
    bool live;
};

struct kvs_event {
    kvs_cuda_device_t *cuda;
    cudaEvent_t ev;
    bool created;
    bool live;
};

struct kvs_cuda_device {
    kvs_device_t base; /* first: recovered with KVS_CONTAINER_OF */
    char name[32];
    int ordinal;
    pthread_mutex_t mu;
    uint32_t max_streams, max_events, desc_slots;
    hw_alloc_table_t allocs; /* base: what cudaMalloc returned */
    struct kvs_stream *streams;
    struct kvs_event *events;
    hw_slots_t stream_slots; /* which of streams[] are free */
    hw_slots_t event_slots;  /* which of events[] are free */
    hw_wait_fd_t wait;       /* readable after an event completed while armed */
};

static kvs_cuda_device_t *hw_cuda_of(kvs_device_t *dev)
{
    return KVS_CONTAINER_OF(dev, kvs_cuda_device_t, base);
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

static int hw_cuda_status(cudaError_t e)
{
    return e == cudaSuccess ? KVS_OK : e == cudaErrorNotReady ? KVS_EAGAIN : KVS_EBACKEND;
}

/* Records a failed CUDA call on the device: its text, the CUDA error and
 * what to change. Returns the kvstage status. */
static int hw_cuda_fail(kvs_cuda_device_t *c, cudaError_t e, const char *call,
                        const char *fix)
{
    return kvs_device_fail(&c->base, hw_cuda_status(e), (int)e, "%s on %s failed: %s (%s); %s",
                           call, c->name, cudaGetErrorName(e), cudaGetErrorString(e), fix);
}

/* Evaluates a CUDA call once; on failure records it and yields the status. */
#define HW_CUDA_TRY(c, call, fix)                                              \
    hw_cuda_try((c), (call), #call, (fix))

static int hw_cuda_try(kvs_cuda_device_t *c, cudaError_t e, const char *call,
                       const char *fix)
{
    return e == cudaSuccess ? KVS_OK : hw_cuda_fail(c, e, call, fix);
}

/* Fixes named in messages. */
#define HW_CUDA_FIX_STICKY                                                     \
    "if the error is sticky (an earlier kernel faulted) the process must "    \
    "restart; else check the GPU with nvidia-smi"
#define HW_CUDA_FIX_MEM                                                        \
    "lower the ring or KV pool size, or free device memory"
#define HW_CUDA_FIX_PINNED                                                     \
    "lower desc_slots or the pages per copy, or free pinned host memory"

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */

/* Locks the device and makes its GPU current on this thread. */
static int hw_cuda_enter(kvs_cuda_device_t *c)
{
    pthread_mutex_lock(&c->mu);
    int rc = HW_CUDA_TRY(c, cudaSetDevice(c->ordinal),
                         "the GPU went away or the driver failed; " HW_CUDA_FIX_STICKY);
    if (rc != KVS_OK)
        pthread_mutex_unlock(&c->mu);
    return rc;
}

static void hw_cuda_leave(kvs_cuda_device_t *c) { pthread_mutex_unlock(&c->mu); }

static int hw_cuda_mem_alloc(kvs_device_t *dev, uint64_t len_bytes, uint64_t *out_addr)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    if (out_addr == NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "mem_alloc on %s: out_addr is NULL",
                               c->name);
    if (len_bytes == 0)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "mem_alloc on %s: length 0; ask for at least one byte",
                               c->name);
    if (len_bytes > (uint64_t)SIZE_MAX)
        return kvs_device_fail(dev, KVS_ERANGE, ERANGE,
                               "mem_alloc on %s: %llu bytes exceed the address space; "
                               "ask for less",
                               c->name, (unsigned long long)len_bytes);
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    rc = hw_alloc_table_room(&c->allocs, dev);
    void *p = NULL;
    if (rc == KVS_OK)
        rc = HW_CUDA_TRY(c, cudaMalloc(&p, (size_t)len_bytes), HW_CUDA_FIX_MEM);
    if (rc == KVS_OK) {
        const hw_alloc_t a = {
            .addr = (uint64_t)(uintptr_t)p, .len_bytes = len_bytes, .base = p};
        hw_alloc_table_insert(&c->allocs, &a);
        *out_addr = a.addr;
    }
    hw_cuda_leave(c);
    return rc;
}

static int hw_cuda_mem_free(kvs_device_t *dev, uint64_t addr)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    hw_alloc_t a;
    rc = hw_alloc_table_remove(&c->allocs, dev, addr, &a);
    /* cudaFree waits for the GPU, so no queued kernel reads freed memory.
     * The entry is gone even if it fails: the pointer is no longer ours. */
    if (rc == KVS_OK)
        rc = HW_CUDA_TRY(c, cudaFree(a.base), HW_CUDA_FIX_STICKY);
    hw_cuda_leave(c);
    return rc;
}

static int hw_cuda_mem_copy(kvs_device_t *dev, uint64_t addr, void *host_buf,
                            uint64_t len_bytes, bool to_device)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    const char *what = to_device ? "mem_write" : "mem_read";
    if (host_buf == NULL && len_bytes != 0)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "%s on %s: %s is NULL", what,
                               c->name, to_device ? "src" : "dst");
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    if (hw_alloc_table_lookup(&c->allocs, addr, len_bytes) == NULL) {
        rc = kvs_device_fail(dev, KVS_ERANGE, ERANGE,
                             "%s on %s: [0x%llx, +%llu) is not inside one live allocation",
                             what, c->name, (unsigned long long)addr,
                             (unsigned long long)len_bytes);
    } else if (len_bytes != 0) {
        void *p = (void *)(uintptr_t)addr;
        if (to_device) {
            rc = HW_CUDA_TRY(c, cudaMemcpy(p, host_buf, (size_t)len_bytes,
                                           cudaMemcpyHostToDevice),
                             HW_CUDA_FIX_STICKY);
            /* From pageable memory cudaMemcpy may return before its DMA
             * landed, and our streams are not ordered after the legacy
             * stream it ran on: wait for it, so a copy queued next sees
             * the bytes. */
            if (rc == KVS_OK)
                rc = HW_CUDA_TRY(c, cudaStreamSynchronize(cudaStreamLegacy),
                                 HW_CUDA_FIX_STICKY);
        } else
            rc = HW_CUDA_TRY(c, cudaMemcpy(host_buf, p, (size_t)len_bytes,
                                           cudaMemcpyDeviceToHost),
                             HW_CUDA_FIX_STICKY);
    }
    hw_cuda_leave(c);
    return rc;
}

static int hw_cuda_mem_write(kvs_device_t *dev, uint64_t addr, const void *src,
                             uint64_t len_bytes)
{
    return hw_cuda_mem_copy(dev, addr, (void *)(uintptr_t)src, len_bytes, true);
}

static int hw_cuda_mem_read(kvs_device_t *dev, uint64_t addr, void *dst, uint64_t len_bytes)
{
    return hw_cuda_mem_copy(dev, addr, dst, len_bytes, false);
}

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */
/* ------------------------------------------------------------------------ */

/* Frees a slot's buffers and event. Its stream has been synchronised.
 * Teardown: a failure is recorded on the device and the rest still freed. */
static void hw_cuda_slot_release(kvs_cuda_device_t *c, hw_cuda_slot_t *sl)
{
    if (sl->host != NULL)
        (void)HW_CUDA_TRY(c, cudaFreeHost(sl->host), HW_CUDA_FIX_STICKY);
    if (sl->dev != NULL)
        (void)HW_CUDA_TRY(c, cudaFree(sl->dev), HW_CUDA_FIX_STICKY);
    if (sl->has_event)
        (void)HW_CUDA_TRY(c, cudaEventDestroy(sl->done), HW_CUDA_FIX_STICKY);
    memset(sl, 0, sizeof *sl);
}

static int hw_cuda_stream_create(kvs_device_t *dev, kvs_stream_t **out)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    if (out == NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "stream_create on %s: out is NULL",
                               c->name);
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    uint32_t i;
    rc = hw_slots_take(&c->stream_slots, dev, &i);
    if (rc != KVS_OK)
        goto out;
    struct kvs_stream *s = &c->streams[i];
    rc = HW_CUDA_TRY(c, cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking),
                     HW_CUDA_FIX_STICKY);
    if (rc != KVS_OK) {
        hw_slots_put(&c->stream_slots, i);
        goto out;
    }
    s->next = 0;
    s->live = true;
    *out = s;
out:
    hw_cuda_leave(c);
    return rc;
}

/* Waits for the stream, frees its descriptor slots and the CUDA stream, and
 * gives its place in the stream table back. mu held. */
static void hw_cuda_stream_stop(kvs_cuda_device_t *c, struct kvs_stream *s)
{
    /* Like CUDA: queued work still completes (we wait for it here because
     * the slots it reads are freed next). */
    (void)HW_CUDA_TRY(c, cudaStreamSynchronize(s->s), HW_CUDA_FIX_STICKY);
    for (uint32_t i = 0; i < c->desc_slots; i++)
        hw_cuda_slot_release(c, &s->slots[i]);
    (void)HW_CUDA_TRY(c, cudaStreamDestroy(s->s), HW_CUDA_FIX_STICKY);
    s->live = false;
    hw_slots_put(&c->stream_slots, (uint32_t)(s - c->streams));
}

static void hw_cuda_stream_destroy(kvs_device_t *dev, kvs_stream_t *stream)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    if (stream == NULL)
        return;
    if (hw_cuda_enter(c) != KVS_OK)
        return;
    if (stream->cuda != c || !stream->live)
        (void)kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                              "stream_destroy on %s: stream already destroyed or of another "
                              "device; destroy each stream once, on its own device",
                              c->name);
    else
        hw_cuda_stream_stop(c, stream);
    hw_cuda_leave(c);
}

/* Makes slot sl hold at least n words, waiting for its last reader. */
static int hw_cuda_slot_prepare(kvs_cuda_device_t *c, hw_cuda_slot_t *sl, size_t n)
{
    int rc = KVS_OK;
    if (sl->pending) {
        rc = HW_CUDA_TRY(c, cudaEventSynchronize(sl->done), HW_CUDA_FIX_STICKY);
        if (rc != KVS_OK)
            return rc;
        sl->pending = false;
    }
    if (!sl->has_event) {
        rc = HW_CUDA_TRY(c, cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming),
                         HW_CUDA_FIX_STICKY);
        if (rc != KVS_OK)
            return rc;
        sl->has_event = true;
    }
    if (n <= sl->cap_words)
        return KVS_OK;
    size_t cap = sl->cap_words * 2 > n ? sl->cap_words * 2 : n;
    if (cap < HW_CUDA_SLOT_MIN_WORDS)
        cap = HW_CUDA_SLOT_MIN_WORDS;
    if (sl->host != NULL) {
        rc = HW_CUDA_TRY(c, cudaFreeHost(sl->host), HW_CUDA_FIX_STICKY);
        sl->host = NULL;
        if (rc != KVS_OK)
            return rc;
    }
    if (sl->dev != NULL) {
        rc = HW_CUDA_TRY(c, cudaFree(sl->dev), HW_CUDA_FIX_STICKY);
        sl->dev = NULL;
        if (rc != KVS_OK)
            return rc;
    }
    sl->cap_words = 0;
    void *h = NULL, *d = NULL;
    rc = HW_CUDA_TRY(c, cudaHostAlloc(&h, cap * sizeof(uint64_t), cudaHostAllocDefault),
                     HW_CUDA_FIX_PINNED);
    if (rc != KVS_OK)
        return rc;
    sl->host = h;
    rc = HW_CUDA_TRY(c, cudaMalloc(&d, cap * sizeof(uint64_t)), HW_CUDA_FIX_MEM);
    if (rc != KVS_OK)
        return rc;
    sl->dev = d;
    sl->cap_words = cap;
    return KVS_OK;
}

static int hw_cuda_enqueue(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                           bool scatter)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    const char *what = scatter ? "scatter" : "gather";
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    if (s == NULL || s->cuda != c || !s->live) {
        rc = kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                             "%s on %s: stream is NULL, destroyed or of another device",
                             what, c->name);
        goto out;
    }
    char msg[KVS_ERROR_MSG_BYTES];
    kvs_copy_shape_t sh;
    rc = kvs_copy_desc_check(d, what, c->name, hw_alloc_table_holds, &c->allocs, &sh, msg,
                             sizeof msg);
    if (rc != KVS_OK) {
        rc = kvs_device_fail(dev, rc, rc == KVS_ERANGE ? ERANGE : EINVAL, "%s", msg);
        goto out;
    }
    if (sh.payload_bytes == 0)
        goto out; /* nothing to move: nothing to queue */
    const uint64_t L = (uint64_t)d->layer_count;
    if (L > HW_CUDA_MAX_LAYERS) {
        rc = kvs_device_fail(dev, KVS_ERANGE, ERANGE,
                             "%s on %s: %llu layers in one copy, at most %u; split the copy",
                             what, c->name, (unsigned long long)L, HW_CUDA_MAX_LAYERS);
        goto out;
    }
    const size_t n_words = hw_cuda_copy_words(d, &sh);
    hw_cuda_slot_t *sl = &s->slots[s->next];
    rc = hw_cuda_slot_prepare(c, sl, n_words);
    if (rc != KVS_OK)
        goto out;
    s->next = (s->next + 1) % c->desc_slots;
    hw_cuda_copy_words_fill(d, &sh, sl->host);
    rc = HW_CUDA_TRY(c, cudaMemcpyAsync(sl->dev, sl->host, n_words * sizeof(uint64_t),
                                        cudaMemcpyHostToDevice, s->s),
                     HW_CUDA_FIX_STICKY);
    if (rc == KVS_OK) {
        const hw_cuda_copy_args_t a = hw_cuda_copy_args_of(d, &sh, sl->dev, scatter);
        rc = HW_CUDA_TRY(c,
                         (cudaError_t)hw_cuda_copy_launch(&a, hw_cuda_copy_vec_bytes(d, &sh),
                                                         s->s),
                         "the kernel could not be launched; " HW_CUDA_FIX_STICKY);
    }
    if (rc == KVS_OK && sh.scale_row_bytes > 0) { /* the scale rows, same stream */
        const hw_cuda_copy_args_t a = hw_cuda_copy_scale_args_of(d, &sh, sl->dev, scatter);
        rc = HW_CUDA_TRY(c,
                         (cudaError_t)hw_cuda_copy_launch(
                             &a, hw_cuda_copy_scale_vec_bytes(d, &sh), s->s),
                         "the scale kernel could not be launched; " HW_CUDA_FIX_STICKY);
    }
    /* Whatever was queued may still read the slot: fence it either way. */
    int rc_ev = HW_CUDA_TRY(c, cudaEventRecord(sl->done, s->s), HW_CUDA_FIX_STICKY);
    if (rc_ev == KVS_OK)
        sl->pending = true;
    else if (rc == KVS_OK)
        rc = rc_ev;
out:
    hw_cuda_leave(c);
    return rc;
}

static int hw_cuda_gather(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *d)
{
    return hw_cuda_enqueue(dev, stream, d, false);
}

static int hw_cuda_scatter(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *d)
{
    return hw_cuda_enqueue(dev, stream, d, true);
}

void *kvs_cuda_stream_handle(kvs_device_t *dev, kvs_stream_t *stream)
{
    kvs_cuda_device_t *c = kvs_cuda_device_from(dev);
    if (c == NULL || stream == NULL)
        return NULL;
    pthread_mutex_lock(&c->mu);
    void *h = stream->cuda == c && stream->live ? (void *)stream->s : NULL;
    pthread_mutex_unlock(&c->mu);
    return h;
}

int kvs_cuda_mem_attach(kvs_device_t *dev, uint64_t addr, uint64_t len_bytes,
                        kvs_error_t *err)
{
    kvs_cuda_device_t *c = kvs_cuda_device_from(dev);
    if (c == NULL)
        return kvs_error_set(err, KVS_EINVAL, 0, __FILE__, __LINE__,
                             "kvs_cuda_mem_attach: dev is not a CUDA device: attach to the "
                             "device the rank runs on");
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return hw_device_report(dev, rc, err);
    /* Only this GPU's memory: the kernels run on it. */
    struct cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, (const void *)(uintptr_t)addr);
    if (e != cudaSuccess || at.type != cudaMemoryTypeDevice || at.device != c->ordinal) {
        (void)cudaGetLastError(); /* not sticky: clear it */
        rc = kvs_device_fail(dev, KVS_EINVAL, e != cudaSuccess ? (int)e : EINVAL,
                             "kvs_cuda_mem_attach on %s: 0x%llx is not memory of GPU %d "
                             "(%s): give the KV pool's tensors on cuda:%d",
                             c->name, (unsigned long long)addr, c->ordinal,
                             e != cudaSuccess ? cudaGetErrorString(e)
                             : at.type == cudaMemoryTypeDevice ? "it is another GPU's"
                                                                : "it is host memory",
                             c->ordinal);
    } else {
        rc = hw_alloc_table_attach(&c->allocs, dev, "kvs_cuda_mem_attach", addr, len_bytes,
                                   NULL);
    }
    hw_cuda_leave(c);
    return hw_device_report(dev, rc, err);
}

int kvs_cuda_mem_detach(kvs_device_t *dev, uint64_t addr, kvs_error_t *err)
{
    kvs_cuda_device_t *c = kvs_cuda_device_from(dev);
    if (c == NULL)
        return kvs_error_set(err, KVS_EINVAL, 0, __FILE__, __LINE__,
                             "kvs_cuda_mem_detach: dev is not a CUDA device");
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return hw_device_report(dev, rc, err);
    rc = hw_alloc_table_detach(&c->allocs, dev, "kvs_cuda_mem_detach", addr, NULL);
    /* Like cudaFree: no queued kernel touches it when this returns. */
    if (rc == KVS_OK)
        rc = HW_CUDA_TRY(c, cudaDeviceSynchronize(), HW_CUDA_FIX_STICKY);
    hw_cuda_leave(c);
    return hw_device_report(dev, rc, err);
}

int kvs_cuda_stream_sync(kvs_device_t *dev, kvs_stream_t *stream)
{
    kvs_cuda_device_t *c = kvs_cuda_device_from(dev);
    if (c == NULL)
        return KVS_EINVAL;
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    if (stream == NULL || stream->cuda != c || !stream->live) {
        rc = kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                             "stream_sync on %s: stream is NULL, destroyed or of another "
                             "device",
                             c->name);
        hw_cuda_leave(c);
        return rc;
    }
    cudaStream_t cs = stream->s;
    hw_cuda_leave(c);
    /* Outside the lock: other threads keep using the device meanwhile. */
    cudaError_t e = cudaStreamSynchronize(cs);
    if (e == cudaSuccess)
        return KVS_OK;
    pthread_mutex_lock(&c->mu);
    rc = hw_cuda_fail(c, e, "cudaStreamSynchronize", HW_CUDA_FIX_STICKY);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */
/* ------------------------------------------------------------------------ */

/* The host function queued after every recorded event: runs on a CUDA
 * thread once the event completed; must call no CUDA function. */
static void CUDART_CB hw_cuda_signal(void *arg)
{
    kvs_cuda_device_t *c = arg;
    hw_wait_fd_signal(&c->wait);
}

static int hw_cuda_wait_arm(kvs_device_t *dev, int *out_fd)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    if (out_fd == NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "wait_arm on %s: out_fd is NULL",
                               c->name);
    *out_fd = hw_wait_fd_arm(&c->wait);
    return KVS_OK;
}

static int hw_cuda_event_record(kvs_device_t *dev, kvs_stream_t *stream, kvs_event_t **out)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    if (out == NULL || stream == NULL || stream->cuda != c || !stream->live) {
        rc = kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                             "event_record on %s: out is NULL or the stream is NULL, "
                             "destroyed or of another device",
                             c->name);
        goto out;
    }
    uint32_t i;
    rc = hw_slots_take(&c->event_slots, dev, &i);
    if (rc != KVS_OK)
        goto out;
    struct kvs_event *ev = &c->events[i];
    if (!ev->created) {
        rc = HW_CUDA_TRY(c, cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming),
                         HW_CUDA_FIX_STICKY);
        ev->created = rc == KVS_OK;
    }
    if (rc == KVS_OK)
        rc = HW_CUDA_TRY(c, cudaEventRecord(ev->ev, stream->s), HW_CUDA_FIX_STICKY);
    /* After the event: tells a waiter (wait_arm) that it completed. */
    if (rc == KVS_OK)
        rc = HW_CUDA_TRY(c, cudaLaunchHostFunc(stream->s, hw_cuda_signal, c),
                         HW_CUDA_FIX_STICKY);
    if (rc != KVS_OK) {
        hw_slots_put(&c->event_slots, i);
        goto out;
    }
    ev->live = true;
    *out = ev;
out:
    hw_cuda_leave(c);
    return rc;
}

static int hw_cuda_event_check(kvs_cuda_device_t *c, kvs_event_t *ev, const char *what)
{
    if (ev == NULL || ev->cuda != c || !ev->live)
        return kvs_device_fail(&c->base, KVS_EINVAL, EINVAL,
                               "%s on %s: event is NULL, destroyed or of another device",
                               what, c->name);
    return KVS_OK;
}

static int hw_cuda_event_query(kvs_device_t *dev, kvs_event_t *ev)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    rc = hw_cuda_event_check(c, ev, "event_query");
    if (rc == KVS_OK) {
        cudaError_t e = cudaEventQuery(ev->ev);
        rc = e == cudaSuccess ? KVS_OK
             : e == cudaErrorNotReady
                 ? KVS_EAGAIN
                 : hw_cuda_fail(c, e, "cudaEventQuery",
                                "a copy before the event failed; " HW_CUDA_FIX_STICKY);
    }
    hw_cuda_leave(c);
    return rc;
}

int kvs_cuda_event_wait(kvs_device_t *dev, kvs_event_t *ev)
{
    kvs_cuda_device_t *c = kvs_cuda_device_from(dev);
    if (c == NULL)
        return KVS_EINVAL;
    int rc = hw_cuda_enter(c);
    if (rc != KVS_OK)
        return rc;
    rc = hw_cuda_event_check(c, ev, "event_wait");
    cudaEvent_t e_ev = rc == KVS_OK ? ev->ev : NULL;
    hw_cuda_leave(c);
    if (rc != KVS_OK)
        return rc;
    cudaError_t e = cudaEventSynchronize(e_ev);
    if (e == cudaSuccess)
        return KVS_OK;
    pthread_mutex_lock(&c->mu);
    rc = hw_cuda_fail(c, e, "cudaEventSynchronize",
                      "a copy before the event failed; " HW_CUDA_FIX_STICKY);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void hw_cuda_event_destroy(kvs_device_t *dev, kvs_event_t *ev)
{
    kvs_cuda_device_t *c = hw_cuda_of(dev);
    if (ev == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    /* The cudaEvent_t stays for the slot's next record. */
    if (hw_cuda_event_check(c, ev, "event_destroy") == KVS_OK) {
        ev->live = false;
        hw_slots_put(&c->event_slots, (uint32_t)(ev - c->events));
    }
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------------ */
/* The device                                                                */
/* ------------------------------------------------------------------------ */

static const kvs_device_ops_t hw_cuda_ops = {
    .version = KVS_DEVICE_OPS_VERSION,
    .size = sizeof(kvs_device_ops_t),
    .name = "cuda",
    .mem_alloc = hw_cuda_mem_alloc,
    .mem_free = hw_cuda_mem_free,
    .stream_create = hw_cuda_stream_create,
    .stream_destroy = hw_cuda_stream_destroy,
    .gather = hw_cuda_gather,
    .scatter = hw_cuda_scatter,
    .event_record = hw_cuda_event_record,
    .event_query = hw_cuda_event_query,
    .event_destroy = hw_cuda_event_destroy,
    .mem_write = hw_cuda_mem_write,
    .mem_read = hw_cuda_mem_read,
    .wait_arm = hw_cuda_wait_arm,
};

#define HW_CUDA_FIX_NO_GPU                                                     \
    "run on a machine with an NVIDIA GPU and driver, check "                  \
    "CUDA_VISIBLE_DEVICES, or use the host backend (kvs_host_device_create)"

/* Finds the GPU and checks this build has kernels for it. On failure fills
 * err and returns the status. */
static int hw_cuda_probe(int ordinal, kvs_error_t *err)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    int rt = CUDART_VERSION; /* what this was built with, if the call fails */
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess)
        rt = CUDART_VERSION;
    if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0))
        return KVS_ERROR_SET(err, KVS_EBACKEND, e == cudaSuccess ? cudaErrorNoDevice : e,
                             "no CUDA device: cudaGetDeviceCount found none (%s); "
                             HW_CUDA_FIX_NO_GPU,
                             cudaGetErrorName(e == cudaSuccess ? cudaErrorNoDevice : e));
    if (e == cudaErrorInsufficientDriver)
        return KVS_ERROR_SET(err, KVS_EBACKEND, e,
                             "no CUDA device: no NVIDIA driver for CUDA runtime %d.%d "
                             "(%s); install a driver that supports it, or use the host "
                             "backend (kvs_host_device_create)",
                             rt / 1000, rt % 1000 / 10, cudaGetErrorName(e));
    if (e != cudaSuccess)
        return KVS_ERROR_SET(err, KVS_EBACKEND, e,
                             "no CUDA device: cudaGetDeviceCount failed: %s (%s); "
                             HW_CUDA_FIX_NO_GPU,
                             cudaGetErrorName(e), cudaGetErrorString(e));
    if (ordinal < 0 || ordinal >= count)
        return KVS_ERROR_SET(err, KVS_ERANGE, cudaErrorInvalidDevice,
                             "CUDA device ordinal %d out of range: %d visible; pass "
                             "0..%d or change CUDA_VISIBLE_DEVICES",
                             ordinal, count, count - 1);
    e = cudaSetDevice(ordinal);
    if (e != cudaSuccess)
        return KVS_ERROR_SET(err, KVS_EBACKEND, e,
                             "cudaSetDevice(%d) failed: %s (%s); check the GPU with "
                             "nvidia-smi (compute mode, health)",
                             ordinal, cudaGetErrorName(e), cudaGetErrorString(e));
    e = (cudaError_t)hw_cuda_kernels_probe();
    if (e != cudaSuccess) {
        int major = 0, minor = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) !=
                cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal) !=
                cudaSuccess)
            return KVS_ERROR_SET(err, KVS_EBACKEND, e,
                                 "the gather/scatter kernels cannot run on CUDA device "
                                 "%d: %s; rebuild with CMAKE_CUDA_ARCHITECTURES "
                                 "including its compute capability (nvidia-smi "
                                 "--query-gpu=compute_cap)",
                                 ordinal, cudaGetErrorName(e));
        return KVS_ERROR_SET(err, KVS_EBACKEND, e,
                             "the gather/scatter kernels cannot run on CUDA device %d "
                             "(compute capability %d.%d): %s; rebuild with "
                             "-DCMAKE_CUDA_ARCHITECTURES=%d%d",
                             ordinal, major, minor, cudaGetErrorName(e), major, minor);
    }
    return KVS_OK;
}

static void hw_cuda_free_tables(kvs_cuda_device_t *c)
{
    if (c->streams != NULL)
        for (uint32_t i = 0; i < c->max_streams; i++)
            free(c->streams[i].slots);
    hw_slots_fini(&c->event_slots);
    hw_slots_fini(&c->stream_slots);
    free(c->events);
    free(c->streams);
    hw_alloc_table_fini(&c->allocs);
}

int kvs_cuda_device_create(const kvs_cuda_config_t *cfg, kvs_cuda_device_t **out,
                           kvs_error_t *err)
{
    if (out == NULL)
        return KVS_ERROR_SET(err, KVS_EINVAL, EINVAL,
                             "kvs_cuda_device_create: out is NULL; pass where to store "
                             "the device");
    *out = NULL;
    kvs_cuda_config_t k = cfg != NULL ? *cfg : (kvs_cuda_config_t){0};
    int rc = hw_cuda_probe(k.ordinal, err);
    if (rc != KVS_OK)
        return rc;
    kvs_cuda_device_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return KVS_ERROR_SET(err, KVS_ENOMEM, ENOMEM,
                             "kvs_cuda_device_create: out of host memory");
    c->ordinal = k.ordinal;
    snprintf(c->name, sizeof c->name, "cuda%d", k.ordinal);
    c->max_streams = k.max_streams ? k.max_streams : HW_CUDA_DEFAULT_MAX_STREAMS;
    c->max_events = k.max_events ? k.max_events : HW_CUDA_DEFAULT_MAX_EVENTS;
    c->desc_slots = k.desc_slots ? k.desc_slots : HW_CUDA_DEFAULT_DESC_SLOTS;
    c->streams = calloc(c->max_streams, sizeof *c->streams);
    c->events = calloc(c->max_events, sizeof *c->events);
    bool ok = hw_alloc_table_init(&c->allocs,
                                  k.max_allocs ? k.max_allocs : HW_CUDA_DEFAULT_MAX_ALLOCS) &&
              c->streams != NULL && c->events != NULL &&
              hw_slots_init(&c->stream_slots, c->max_streams, HW_SLOTS_FULL_STREAMS) &&
              hw_slots_init(&c->event_slots, c->max_events, HW_SLOTS_FULL_EVENTS);
    for (uint32_t i = 0; ok && i < c->max_streams; i++) {
        c->streams[i].cuda = c;
        c->streams[i].slots = calloc(c->desc_slots, sizeof *c->streams[i].slots);
        ok = c->streams[i].slots != NULL;
    }
    if (!ok || pthread_mutex_init(&c->mu, NULL) != 0) {
        hw_cuda_free_tables(c);
        free(c);
        return KVS_ERROR_SET(err, KVS_ENOMEM, ENOMEM,
                             "kvs_cuda_device_create: out of host memory for the "
                             "tables; lower max_allocs, max_streams, max_events or "
                             "desc_slots");
    }
    const int e = hw_wait_fd_init(&c->wait);
    if (e != 0) {
        pthread_mutex_destroy(&c->mu);
        hw_cuda_free_tables(c);
        free(c);
        return KVS_ERROR_SET(err, KVS_EBACKEND, e,
                             "kvs_cuda_device_create: eventfd failed (%s); raise the "
                             "process's open file limit (ulimit -n)",
                             strerror(e));
    }
    rc = kvs_device_init(&c->base, &hw_cuda_ops, c->name);
    if (rc != KVS_OK) {
        hw_wait_fd_fini(&c->wait);
        pthread_mutex_destroy(&c->mu);
        hw_cuda_free_tables(c);
        free(c);
        return KVS_ERROR_SET(err, rc, 0,
                             "kvs_cuda_device_create: the core refused the ops table; "
                             "rebuild hw/cuda against this kvstage's backend.h");
    }
    for (uint32_t i = 0; i < c->max_events; i++)
        c->events[i].cuda = c;
    *out = c;
    return KVS_OK;
}

void kvs_cuda_device_destroy(kvs_cuda_device_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    /* Teardown: failures are recorded on the dying device and go with it. */
    (void)HW_CUDA_TRY(c, cudaSetDevice(c->ordinal), HW_CUDA_FIX_STICKY);
    (void)HW_CUDA_TRY(c, cudaDeviceSynchronize(), HW_CUDA_FIX_STICKY);
    for (uint32_t i = 0; i < c->max_streams; i++)
        if (c->streams[i].live)
            hw_cuda_stream_stop(c, &c->streams[i]);
    for (uint32_t i = 0; i < c->max_events; i++)
        if (c->events[i].created)
            (void)HW_CUDA_TRY(c, cudaEventDestroy(c->events[i].ev), HW_CUDA_FIX_STICKY);
    for (uint32_t i = 0; i < c->allocs.count; i++)
        if (!c->allocs.entries[i].attached) /* the application's stays */
            (void)HW_CUDA_TRY(c, cudaFree(c->allocs.entries[i].base), HW_CUDA_FIX_STICKY);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    hw_wait_fd_fini(&c->wait); /* after the synchronize: no host function is left */
    hw_cuda_free_tables(c);
    free(c);
}

kvs_device_t *kvs_cuda_device(kvs_cuda_device_t *c) { return c != NULL ? &c->base : NULL; }

kvs_cuda_device_t *kvs_cuda_device_from(kvs_device_t *dev)
{
    if (dev == NULL || dev->ops.mem_alloc != hw_cuda_mem_alloc)
        return NULL;
    return hw_cuda_of(dev);
}
