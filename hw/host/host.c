/*
 * host.c - the host device backend of host.h ("host"): kvstage device ops
 * on plain host memory, with one worker thread per stream.
 *
 * What it does:
 * - Memory. Each allocation is its own anonymous mapping (zero filled, page
 *   aligned; from 2 MiB up 2 MiB aligned and advised for transparent huge
 *   pages, which halves the TLB cost of strided gathers). The device address
 *   is the host address. Live allocations sit in the allocation table of
 *   hw/common/alloc_table.c (sorted by address; each entry's base and
 *   base_bytes are its whole mapping), which validates every range a call
 *   touches.
 * - Streams. A stream is a ring of queue_ops op slots and a worker thread.
 *   gather/scatter validate the descriptor against live memory
 *   (kvs_copy_desc_check of backend.h; gather_parts/scatter_parts with
 *   kvs_copy_parts_check, all parts in one op), snapshot it into the next
 *   slot (layer buffers turned into pointers, page list and parts copied)
 *   and wake the
 *   worker, which runs the ops in order (hw/host/copy.c) and advances
 *   done_seq. With copy_threads > 1 the stream also owns copy_threads - 1
 *   helpers: for an op of at least HW_HOST_SPLIT_MIN_BYTES the worker posts
 *   it as a job (job_gen + 1), runs share 0 itself and waits until every
 *   helper ran its share.
 * - Events. An event remembers its stream slot and the stream's enqueue
 *   sequence at record time; it is complete once done_seq reaches it.
 * - Waiting (wait_arm): the device's eventfd (hw/common/wait_fd.h), which
 *   a worker signals after it advanced done_seq: an op that completes after
 *   an arm is seen by the caller's next event_query or writes the eventfd.
 *
 * What it does not: no clock, no modeled time, no partial copies; ops never
 * fail once enqueued (memory stays alive: mem_free drains every stream first).
 *
 * Locking: host->mu guards the allocation table, stream states and the event
 * table and is held for the whole of every call (so a validated op cannot
 * lose its memory before it is queued). stream->mu guards the ring, the
 * sequences and the job handed to helpers, and is shared with the worker
 * and the helpers. Order: host->mu, then stream->mu; worker and helpers
 * take only their stream->mu, so waits under host->mu (queue full,
 * mem_free draining, stream_destroy joining) always end.
 *
 * Invariants: allocs holds every live mapping; per stream
 * done_seq <= enq_seq <= done_seq + queue_ops; op seq k lives in slot
 * (k - 1) % queue_ops; stream and event slots live in arrays owned by the
 * device, so a kvs_stream_t / kvs_event_t pointer stays valid memory until
 * the device is destroyed and an event outlives its stream's destroy; a
 * slot is live exactly when its index is out of the device's free-slot
 * table (hw/common/slots.c).
 */
#define _DEFAULT_SOURCE

#include <kvstage/host.h>

#include "alloc_table.h"
#include "copy.h"
#include "slots.h"
#include "wait_fd.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HW_HOST_DEFAULT_MAX_ALLOCS 4096u
#define HW_HOST_DEFAULT_MAX_STREAMS 16u
#define HW_HOST_DEFAULT_MAX_EVENTS 65536u
#define HW_HOST_DEFAULT_QUEUE_OPS 64u
#define HW_HOST_HUGE_BYTES (2ull << 20)
/* Ops below this payload run on the worker alone: waking helpers costs
 * more than they save. */
#define HW_HOST_SPLIT_MIN_BYTES (1ull << 20)
#define HW_HOST_MAX_COPY_THREADS 256u

typedef struct hw_host_op {
    hw_host_copy_t copy; /* its pool, pages and parts point into words */
    hw_host_copy_t scales; /* its scale rows (scales.nparts 0: none), run
                              after copy: the same pages, scale buffers and
                              each slot's scale rows */
    uint64_t *words;     /* [pool pointers 2 * layer_count | pages | parts |
                            scale pointers 2 * layer_count | scale parts] */
    size_t words_cap;
} hw_host_op_t;

typedef struct hw_host_helper {
    struct kvs_stream *stream;
    unsigned part;          /* its share of every split op, 1.. */
    uint64_t start_gen;     /* job_gen when the stream started: every later
                               job is this helper's, however late it runs */
    pthread_t thread;
} hw_host_helper_t;

struct kvs_stream {
    kvs_host_device_t *host;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the worker waits for ops or stop */
    pthread_cond_t done_cv; /* waiters for progress and for queue room */
    pthread_cond_t job_cv;  /* helpers wait for a job or their stop */
    pthread_cond_t part_cv; /* the worker waits for the helpers' shares */
    pthread_t thread;
    hw_host_op_t *ops;      /* queue_ops slots */
    hw_host_helper_t *helpers; /* copy_threads - 1 */
    uint64_t enq_seq;       /* ops enqueued on this slot, ever (never reset) */
    uint64_t done_seq;      /* ops run on this slot, ever */
    const hw_host_copy_t *job; /* the op being split */
    uint64_t job_gen;       /* ops handed to the helpers, ever */
    uint32_t parts_left;    /* helpers still running a share of job */
    uint32_t index;
    bool live;              /* created and not destroyed */
    bool stop;              /* the worker exits once drained */
    bool helpers_stop;      /* set by the worker after it drained */
};

struct kvs_event {
    kvs_host_device_t *host;
    struct kvs_stream *stream;
    uint64_t target_seq;
    bool live;
};

struct kvs_host_device {
    kvs_device_t base; /* first: recovered with KVS_CONTAINER_OF */
    char name[32];
    pthread_mutex_t mu;
    uint32_t max_streams, max_events, queue_ops, copy_threads;
    uint32_t max_vector_bytes; /* 16, 32 or 64 */
    hw_alloc_table_t allocs; /* base, base_bytes: the whole mapping */
    struct kvs_stream *streams;
    struct kvs_event *events;
    hw_slots_t stream_slots; /* which of streams[] are free */
    hw_slots_t event_slots;  /* which of events[] are free */
    hw_wait_fd_t wait;       /* readable after an op completed while armed */
};

static kvs_host_device_t *hw_host_of(kvs_device_t *dev)
{
    return KVS_CONTAINER_OF(dev, kvs_host_device_t, base);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */

static int hw_host_mem_alloc(kvs_device_t *dev, uint64_t len_bytes, uint64_t *out_addr)
{
    kvs_host_device_t *h = hw_host_of(dev);
    if (out_addr == NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "mem_alloc on %s: out_addr is NULL",
                               h->name);
    if (len_bytes == 0)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "mem_alloc on %s: length 0; ask for at least one byte",
                               h->name);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t align = len_bytes >= HW_HOST_HUGE_BYTES ? HW_HOST_HUGE_BYTES : page;
    /* Room for the length rounded up to pages plus the alignment slack. */
    if (len_bytes > (uint64_t)SIZE_MAX / 2 - 2 * align)
        return kvs_device_fail(dev, KVS_ERANGE, ERANGE,
                               "mem_alloc on %s: %llu bytes exceed the address space; "
                               "ask for less",
                               h->name, (unsigned long long)len_bytes);
    pthread_mutex_lock(&h->mu);
    int rc = hw_alloc_table_room(&h->allocs, dev);
    if (rc != KVS_OK)
        goto out;
    hw_alloc_t a = {.len_bytes = len_bytes};
    a.base_bytes = (len_bytes + page - 1) / page * page + (align - page);
    a.base = mmap(NULL, (size_t)a.base_bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a.base == MAP_FAILED) {
        int err = errno;
        rc = kvs_device_fail(dev, KVS_ENOMEM, err,
                             "mem_alloc on %s: cannot map %llu bytes of host memory (%s); "
                             "lower the ring or KV pool size or free device memory",
                             h->name, (unsigned long long)len_bytes, strerror(err));
        goto out;
    }
    a.addr = ((uint64_t)(uintptr_t)a.base + align - 1) / align * align;
    if (align == HW_HOST_HUGE_BYTES) {
        /* Advice only: without THP support the memory stays in small pages. */
        (void)madvise((void *)(uintptr_t)a.addr, (size_t)(a.base_bytes - (align - page)),
                      MADV_HUGEPAGE);
    }
    hw_alloc_table_insert(&h->allocs, &a);
    *out_addr = a.addr;
out:
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* Waits until every live stream has run all its queued ops. host->mu held. */
static void hw_host_drain_all(kvs_host_device_t *h)
{
    for (uint32_t i = 0; i < h->max_streams; i++) {
        struct kvs_stream *s = &h->streams[i];
        if (!s->live)
            continue;
        pthread_mutex_lock(&s->mu);
        while (s->done_seq != s->enq_seq)
            pthread_cond_wait(&s->done_cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
}

static int hw_host_mem_free(kvs_device_t *dev, uint64_t addr)
{
    kvs_host_device_t *h = hw_host_of(dev);
    pthread_mutex_lock(&h->mu);
    hw_alloc_t a;
    int rc = hw_alloc_table_remove(&h->allocs, dev, addr, &a);
    if (rc == KVS_OK) {
        /* Like cudaFree: queued ops may still read or write it (h->mu held
         * throughout, so no new op can name it meanwhile). */
        hw_host_drain_all(h);
        munmap(a.base, (size_t)a.base_bytes);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int hw_host_mem_copy(kvs_device_t *dev, uint64_t addr, void *host_buf,
                            uint64_t len_bytes, bool to_device)
{
    kvs_host_device_t *h = hw_host_of(dev);
    const char *what = to_device ? "mem_write" : "mem_read";
    if (host_buf == NULL && len_bytes != 0)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "%s on %s: %s is NULL", what,
                               h->name, to_device ? "src" : "dst");
    pthread_mutex_lock(&h->mu);
    int rc = KVS_OK;
    if (hw_alloc_table_lookup(&h->allocs, addr, len_bytes) == NULL) {
        rc = kvs_device_fail(dev, KVS_ERANGE, ERANGE,
                             "%s on %s: [0x%llx, +%llu) is not inside one live allocation",
                             what, h->name, (unsigned long long)addr,
                             (unsigned long long)len_bytes);
    } else if (len_bytes != 0) {
        void *p = (void *)(uintptr_t)addr;
        if (to_device)
            memcpy(p, host_buf, (size_t)len_bytes);
        else
            memcpy(host_buf, p, (size_t)len_bytes);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int hw_host_mem_write(kvs_device_t *dev, uint64_t addr, const void *src,
                             uint64_t len_bytes)
{
    return hw_host_mem_copy(dev, addr, (void *)(uintptr_t)src, len_bytes, true);
}

static int hw_host_mem_read(kvs_device_t *dev, uint64_t addr, void *dst, uint64_t len_bytes)
{
    return hw_host_mem_copy(dev, addr, dst, len_bytes, false);
}

int kvs_host_mem_attach(kvs_device_t *dev, const void *ptr, uint64_t len_bytes,
                        kvs_error_t *err)
{
    kvs_host_device_t *h = kvs_host_device_from(dev);
    if (h == NULL)
        return kvs_error_set(err, KVS_EINVAL, 0, __FILE__, __LINE__,
                             "kvs_host_mem_attach: dev is not a host device: attach to the "
                             "device the rank runs on");
    pthread_mutex_lock(&h->mu);
    int rc = hw_alloc_table_attach(&h->allocs, dev, "kvs_host_mem_attach",
                                   (uint64_t)(uintptr_t)ptr, len_bytes, err);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int kvs_host_mem_detach(kvs_device_t *dev, const void *ptr, kvs_error_t *err)
{
    kvs_host_device_t *h = kvs_host_device_from(dev);
    if (h == NULL)
        return kvs_error_set(err, KVS_EINVAL, 0, __FILE__, __LINE__,
                             "kvs_host_mem_detach: dev is not a host device");
    pthread_mutex_lock(&h->mu);
    int rc = hw_alloc_table_detach(&h->allocs, dev, "kvs_host_mem_detach",
                                   (uint64_t)(uintptr_t)ptr, err);
    /* Like mem_free: no queued op may still touch it when this returns. */
    if (rc == KVS_OK)
        hw_host_drain_all(h);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

void *kvs_host_ptr(kvs_device_t *dev, uint64_t addr, uint64_t len_bytes)
{
    kvs_host_device_t *h = kvs_host_device_from(dev);
    if (h == NULL)
        return NULL;
    pthread_mutex_lock(&h->mu);
    const hw_alloc_t *a = hw_alloc_table_lookup(&h->allocs, addr, len_bytes);
    pthread_mutex_unlock(&h->mu);
    return a != NULL ? (void *)(uintptr_t)addr : NULL;
}

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */
/* ------------------------------------------------------------------------ */

static void *hw_host_helper(void *arg)
{
    const hw_host_helper_t *hp = arg;
    struct kvs_stream *s = hp->stream;
    const unsigned parts = s->host->copy_threads;
    pthread_mutex_lock(&s->mu);
    /* Not s->job_gen now: the worker may already have posted a job before
     * this thread first ran (seen under valgrind), and that job waits for
     * this helper's part. */
    uint64_t seen = hp->start_gen;
    for (;;) {
        while (s->job_gen == seen && !s->helpers_stop)
            pthread_cond_wait(&s->job_cv, &s->mu);
        if (s->job_gen == seen)
            break; /* the worker drained and left */
        seen = s->job_gen;
        const hw_host_copy_t *c = s->job;
        pthread_mutex_unlock(&s->mu);
        hw_host_copy_part(c, hp->part, parts);
        pthread_mutex_lock(&s->mu);
        if (--s->parts_left == 0)
            pthread_cond_signal(&s->part_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Runs one op, split with the helpers when it is large. s->mu held on
 * entry and exit, released while copying. */
static void hw_host_run_op(struct kvs_stream *s, const hw_host_copy_t *c)
{
    const uint32_t parts = s->host->copy_threads;
    if (parts == 1 || hw_host_copy_bytes(c) < HW_HOST_SPLIT_MIN_BYTES) {
        pthread_mutex_unlock(&s->mu);
        hw_host_copy_run(c);
        pthread_mutex_lock(&s->mu);
        return;
    }
    s->job = c;
    s->job_gen++;
    s->parts_left = parts - 1;
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    hw_host_copy_part(c, 0, parts);
    pthread_mutex_lock(&s->mu);
    while (s->parts_left > 0)
        pthread_cond_wait(&s->part_cv, &s->mu);
    s->job = NULL;
}

static void *hw_host_worker(void *arg)
{
    struct kvs_stream *s = arg;
    const uint32_t cap = s->host->queue_ops;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->done_seq == s->enq_seq && !s->stop)
            pthread_cond_wait(&s->work_cv, &s->mu);
        if (s->done_seq == s->enq_seq)
            break; /* stopped and drained */
        const hw_host_op_t *op = &s->ops[s->done_seq % cap];
        hw_host_run_op(s, &op->copy);
        if (op->scales.nparts > 0) /* the scale rows of the same tokens and heads */
            hw_host_run_op(s, &op->scales);
        s->done_seq++;
        pthread_cond_broadcast(&s->done_cv);
        hw_wait_fd_signal(&s->host->wait); /* done_seq advanced first */
    }
    /* No more jobs: let the helpers go. */
    s->helpers_stop = true;
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Joins the first n helpers of s (they leave once helpers_stop is set). */
static void hw_host_helpers_join(struct kvs_stream *s, uint32_t n)
{
    pthread_mutex_lock(&s->mu);
    s->helpers_stop = true;
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    for (uint32_t i = 0; i < n; i++)
        pthread_join(s->helpers[i].thread, NULL);
}

/* Starts the helpers and the worker of a stream slot; on failure nothing
 * is left running and the pthread error is returned. */
static int hw_host_stream_start(kvs_host_device_t *h, struct kvs_stream *s)
{
    s->stop = false;
    s->helpers_stop = false;
    uint32_t started = 0;
    int err = 0;
    for (; started < h->copy_threads - 1; started++) {
        s->helpers[started] = (hw_host_helper_t){.stream = s, .part = started + 1,
                                                 .start_gen = s->job_gen};
        err = pthread_create(&s->helpers[started].thread, NULL, hw_host_helper,
                             &s->helpers[started]);
        if (err != 0)
            break;
    }
    if (err == 0)
        err = pthread_create(&s->thread, NULL, hw_host_worker, s);
    if (err != 0)
        hw_host_helpers_join(s, started);
    return err;
}

static int hw_host_stream_create(kvs_device_t *dev, kvs_stream_t **out)
{
    kvs_host_device_t *h = hw_host_of(dev);
    if (out == NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "stream_create on %s: out is NULL",
                               h->name);
    pthread_mutex_lock(&h->mu);
    uint32_t i;
    int rc = hw_slots_take(&h->stream_slots, dev, &i);
    if (rc != KVS_OK)
        goto out;
    struct kvs_stream *s = &h->streams[i];
    /* Sequences carry on from the slot's previous life, so events recorded
     * on it then stay complete. */
    int err = hw_host_stream_start(h, s);
    if (err != 0) {
        hw_slots_put(&h->stream_slots, i);
        rc = kvs_device_fail(dev, KVS_EBACKEND, err,
                             "stream_create on %s: cannot start the stream's %u threads "
                             "(%s); raise the process thread limit, use fewer streams or "
                             "lower copy_threads",
                             h->name, h->copy_threads, strerror(err));
        goto out;
    }
    s->live = true;
    *out = s;
out:
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* Stops and joins the worker after it ran every queued op, then its
 * helpers, and frees the slot. host->mu held. */
static void hw_host_stream_stop(struct kvs_stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    hw_host_helpers_join(s, s->host->copy_threads - 1);
    s->live = false;
    hw_slots_put(&s->host->stream_slots, s->index);
}

static void hw_host_stream_destroy(kvs_device_t *dev, kvs_stream_t *stream)
{
    kvs_host_device_t *h = hw_host_of(dev);
    if (stream == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    if (stream->host != h || !stream->live)
        (void)kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                              "stream_destroy on %s: stream already destroyed or of another "
                              "device; destroy each stream once, on its own device",
                              h->name);
    else
        hw_host_stream_stop(stream); /* like CUDA: queued work still completes */
    pthread_mutex_unlock(&h->mu);
}

/* Validates and enqueues a copy of nparts parts (a gather or scatter is
 * one part, fused = false, checked as such). */
static int hw_host_enqueue(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                           const kvs_copy_part_t *parts, int64_t nparts, bool scatter,
                           bool fused)
{
    kvs_host_device_t *h = hw_host_of(dev);
    const char *what = fused ? (scatter ? "scatter_parts" : "gather_parts")
                             : (scatter ? "scatter" : "gather");
    char msg[KVS_ERROR_MSG_BYTES];
    kvs_copy_shape_t sh;
    int rc = KVS_OK;
    pthread_mutex_lock(&h->mu);
    if (s == NULL || s->host != h || !s->live) {
        rc = kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                             "%s on %s: stream is NULL, destroyed or of another device",
                             what, h->name);
        goto out;
    }
    rc = fused ? kvs_copy_parts_check(d, parts, nparts, scatter, what, h->name,
                                      hw_alloc_table_holds, &h->allocs, NULL, msg, sizeof msg)
               : kvs_copy_desc_check(d, what, h->name, hw_alloc_table_holds, &h->allocs, &sh,
                                     msg, sizeof msg);
    if (rc != KVS_OK) {
        rc = kvs_device_fail(dev, rc, rc == KVS_ERANGE ? ERANGE : EINVAL, "%s", msg);
        goto out;
    }
    /* Every product below was checked for overflow by the check; the page
     * count and layer count are bounded by validated allocations. */
    const uint64_t L = (uint64_t)d->layer_count, tokens = (uint64_t)d->tokens;
    const uint64_t ps = (uint64_t)d->page_size;
    const uint64_t pages_used = tokens / ps + (tokens % ps != 0);
    const uint64_t head_bytes = (uint64_t)d->head_dim * (uint64_t)d->elem_bytes;
    const uint64_t part_words = sizeof(hw_host_copy_part_t) / sizeof(uint64_t);
    _Static_assert(sizeof(hw_host_copy_part_t) % sizeof(uint64_t) == 0, "parts fill words");
    const bool scales = d->scale_bytes > 0;
    const uint64_t n_words = (2 * L + (uint64_t)nparts * part_words) * (scales ? 2 : 1) +
                             pages_used;
    const uint64_t planes = d->planes == 1 ? 1 : 2; /* as the check read it */
    const uint64_t sb = (uint64_t)d->scale_bytes;

    pthread_mutex_lock(&s->mu);
    while (s->enq_seq - s->done_seq == h->queue_ops)
        pthread_cond_wait(&s->done_cv, &s->mu);
    hw_host_op_t *op = &s->ops[s->enq_seq % h->queue_ops];
    if (n_words > op->words_cap) {
        uint64_t *w = realloc(op->words, (size_t)n_words * sizeof *w);
        if (w == NULL) {
            pthread_mutex_unlock(&s->mu);
            rc = kvs_device_fail(dev, KVS_ENOMEM, ENOMEM,
                                 "%s on %s: out of host memory for a descriptor of %llu "
                                 "layers, %llu pages and %lld parts",
                                 what, h->name, (unsigned long long)L,
                                 (unsigned long long)pages_used, (long long)nparts);
            goto out;
        }
        op->words = w;
        op->words_cap = (size_t)n_words;
    }
    /* Snapshot: pointers to copy layer j's K at [j] and V at [L + j] (NULL
     * with one plane: never read), at their first token slot; the page ids
     * and the parts after them. */
    uint8_t **pool = (uint8_t **)(void *)op->words;
    for (uint64_t j = 0; j < L; j++) {
        const uint64_t l = (uint64_t)d->layer_begin + j;
        pool[j] = (uint8_t *)(uintptr_t)d->k_base[l];
        pool[L + j] = planes == 2 ? (uint8_t *)(uintptr_t)d->v_base[l] : NULL;
    }
    int64_t *pages = (int64_t *)(void *)(op->words + 2 * L);
    if (pages_used > 0)
        memcpy(pages, d->pages, (size_t)pages_used * sizeof *pages);
    hw_host_copy_part_t *cp = (hw_host_copy_part_t *)(void *)(op->words + 2 * L + pages_used);
    for (int64_t k = 0; k < nparts; k++) {
        const uint64_t row = (uint64_t)parts[k].num_heads * head_bytes;
        const uint64_t srow = (uint64_t)parts[k].num_heads * sb;
        cp[k] = (hw_host_copy_part_t){
            .staging = (uint8_t *)(uintptr_t)parts[k].staging_addr,
            .head_off = (uint64_t)parts[k].head_start * head_bytes,
            .row_bytes = row,
            .slot_bytes = row * tokens,
            .slot_stride = (row + srow) * tokens,
        };
    }
    /* With scales: pointers to layer j's K scales at [j] and V scales at
     * [L + j], and the parts' scale rows, at the end of each slot. */
    uint8_t **spool = (uint8_t **)(void *)(op->words + 2 * L + pages_used +
                                           (uint64_t)nparts * part_words);
    hw_host_copy_part_t *sp = (hw_host_copy_part_t *)(void *)(spool + 2 * L);
    for (uint64_t j = 0; scales && j < L; j++) {
        const uint64_t l = (uint64_t)d->layer_begin + j;
        spool[j] = (uint8_t *)(uintptr_t)d->ks_base[l];
        spool[L + j] = planes == 2 ? (uint8_t *)(uintptr_t)d->vs_base[l] : NULL;
    }
    for (int64_t k = 0; scales && k < nparts; k++) {
        const uint64_t srow = (uint64_t)parts[k].num_heads * sb;
        sp[k] = (hw_host_copy_part_t){
            .staging = cp[k].staging + cp[k].slot_bytes,
            .head_off = (uint64_t)parts[k].head_start * sb,
            .row_bytes = srow,
            .slot_bytes = srow * tokens,
            .slot_stride = cp[k].slot_stride,
        };
    }
    op->copy = (hw_host_copy_t){
        .scatter = scatter,
        .pool = pool,
        .pages = pages,
        .parts = cp,
        .nparts = (uint64_t)nparts,
        .layer_count = L,
        .page_size = ps,
        .tokens = tokens,
        .slot_begin = (uint64_t)d->staging_slot_begin,
        .layer_slots = (uint64_t)d->staging_layer_slots,
        .token_bytes = (uint64_t)d->local_heads * head_bytes,
        .max_vector_bytes = h->max_vector_bytes,
        .planes = planes,
    };
    op->scales = op->copy;
    op->scales.nparts = 0;
    if (scales) {
        op->scales.pool = spool;
        op->scales.parts = sp;
        op->scales.nparts = (uint64_t)nparts;
        op->scales.token_bytes = (uint64_t)d->local_heads * sb;
    }
    s->enq_seq++;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
out:
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* A single gather or scatter is a copy of one part: desc's own. */
static int hw_host_enqueue_one(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *d,
                               bool scatter)
{
    const kvs_copy_part_t one = {
        .head_start = d != NULL ? d->head_start : 0,
        .num_heads = d != NULL ? d->num_heads : 0,
        .staging_addr = d != NULL ? d->staging_addr : 0,
    };
    return hw_host_enqueue(dev, stream, d, &one, 1, scatter, false);
}

static int hw_host_gather(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *d)
{
    return hw_host_enqueue_one(dev, stream, d, false);
}

static int hw_host_scatter(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *d)
{
    return hw_host_enqueue_one(dev, stream, d, true);
}

static int hw_host_gather_parts(kvs_device_t *dev, kvs_stream_t *stream,
                                const kvs_copy_desc_t *d, const kvs_copy_part_t *parts,
                                int64_t nparts)
{
    return hw_host_enqueue(dev, stream, d, parts, nparts, false, true);
}

static int hw_host_scatter_parts(kvs_device_t *dev, kvs_stream_t *stream,
                                 const kvs_copy_desc_t *d, const kvs_copy_part_t *parts,
                                 int64_t nparts)
{
    return hw_host_enqueue(dev, stream, d, parts, nparts, true, true);
}

/* Waits until s->done_seq reaches target. s->mu not held. */
static void hw_host_wait_seq(struct kvs_stream *s, uint64_t target)
{
    pthread_mutex_lock(&s->mu);
    while (s->done_seq < target)
        pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

int kvs_host_stream_sync(kvs_device_t *dev, kvs_stream_t *stream)
{
    kvs_host_device_t *h = kvs_host_device_from(dev);
    if (h == NULL)
        return KVS_EINVAL;
    pthread_mutex_lock(&h->mu);
    if (stream == NULL || stream->host != h || !stream->live) {
        int rc = kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                                 "stream_sync on %s: stream is NULL, destroyed or of another "
                                 "device",
                                 h->name);
        pthread_mutex_unlock(&h->mu);
        return rc;
    }
    pthread_mutex_lock(&stream->mu);
    const uint64_t target = stream->enq_seq;
    pthread_mutex_unlock(&stream->mu);
    pthread_mutex_unlock(&h->mu);
    /* The slot outlives a concurrent destroy, and its sequence only grows. */
    hw_host_wait_seq(stream, target);
    return KVS_OK;
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */
/* ------------------------------------------------------------------------ */

static int hw_host_event_record(kvs_device_t *dev, kvs_stream_t *stream, kvs_event_t **out)
{
    kvs_host_device_t *h = hw_host_of(dev);
    pthread_mutex_lock(&h->mu);
    int rc = KVS_OK;
    if (out == NULL || stream == NULL || stream->host != h || !stream->live) {
        rc = kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                             "event_record on %s: out is NULL or the stream is NULL, "
                             "destroyed or of another device",
                             h->name);
        goto out;
    }
    uint32_t i;
    rc = hw_slots_take(&h->event_slots, dev, &i);
    if (rc != KVS_OK)
        goto out;
    struct kvs_event *ev = &h->events[i];
    pthread_mutex_lock(&stream->mu);
    ev->target_seq = stream->enq_seq;
    pthread_mutex_unlock(&stream->mu);
    ev->stream = stream;
    ev->live = true;
    *out = ev;
out:
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* The event's stream and target if ev is a live event of h. host->mu held. */
static int hw_host_event_check(kvs_host_device_t *h, kvs_event_t *ev, const char *what)
{
    if (ev == NULL || ev->host != h || !ev->live)
        return kvs_device_fail(&h->base, KVS_EINVAL, EINVAL,
                               "%s on %s: event is NULL, destroyed or of another device",
                               what, h->name);
    return KVS_OK;
}

static int hw_host_event_query(kvs_device_t *dev, kvs_event_t *ev)
{
    kvs_host_device_t *h = hw_host_of(dev);
    pthread_mutex_lock(&h->mu);
    int rc = hw_host_event_check(h, ev, "event_query");
    if (rc == KVS_OK) {
        pthread_mutex_lock(&ev->stream->mu);
        rc = ev->stream->done_seq >= ev->target_seq ? KVS_OK : KVS_EAGAIN;
        pthread_mutex_unlock(&ev->stream->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int kvs_host_event_wait(kvs_device_t *dev, kvs_event_t *ev)
{
    kvs_host_device_t *h = kvs_host_device_from(dev);
    if (h == NULL)
        return KVS_EINVAL;
    pthread_mutex_lock(&h->mu);
    int rc = hw_host_event_check(h, ev, "event_wait");
    struct kvs_stream *s = rc == KVS_OK ? ev->stream : NULL;
    const uint64_t target = rc == KVS_OK ? ev->target_seq : 0;
    pthread_mutex_unlock(&h->mu);
    if (s != NULL)
        hw_host_wait_seq(s, target);
    return rc;
}

static void hw_host_event_destroy(kvs_device_t *dev, kvs_event_t *ev)
{
    kvs_host_device_t *h = hw_host_of(dev);
    if (ev == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    if (hw_host_event_check(h, ev, "event_destroy") == KVS_OK) {
        ev->live = false;
        hw_slots_put(&h->event_slots, (uint32_t)(ev - h->events));
    }
    pthread_mutex_unlock(&h->mu);
}

static int hw_host_wait_arm(kvs_device_t *dev, int *out_fd)
{
    kvs_host_device_t *h = hw_host_of(dev);
    if (out_fd == NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "wait_arm on %s: out_fd is NULL",
                               h->name);
    *out_fd = hw_wait_fd_arm(&h->wait);
    return KVS_OK;
}

/* ------------------------------------------------------------------------ */
/* The device                                                                */
/* ------------------------------------------------------------------------ */

static const kvs_device_ops_t hw_host_ops = {
    .version = KVS_DEVICE_OPS_VERSION,
    .size = sizeof(kvs_device_ops_t),
    .name = "host",
    .mem_alloc = hw_host_mem_alloc,
    .mem_free = hw_host_mem_free,
    .stream_create = hw_host_stream_create,
    .stream_destroy = hw_host_stream_destroy,
    .gather = hw_host_gather,
    .scatter = hw_host_scatter,
    .event_record = hw_host_event_record,
    .event_query = hw_host_event_query,
    .event_destroy = hw_host_event_destroy,
    .mem_write = hw_host_mem_write,
    .mem_read = hw_host_mem_read,
    .gather_parts = hw_host_gather_parts,
    .scatter_parts = hw_host_scatter_parts,
    .wait_arm = hw_host_wait_arm,
};

/* Initialises stream slot s: op ring, helper table, sync objects. On
 * failure nothing of it is left allocated. */
static bool hw_host_slot_init(kvs_host_device_t *h, struct kvs_stream *s, uint32_t index)
{
    s->host = h;
    s->index = index;
    s->ops = calloc(h->queue_ops, sizeof *s->ops);
    s->helpers = calloc(h->copy_threads, sizeof *s->helpers); /* copy_threads - 1 used */
    if (s->ops == NULL || s->helpers == NULL)
        goto fail_mem;
    if (pthread_mutex_init(&s->mu, NULL) != 0)
        goto fail_mem;
    if (pthread_cond_init(&s->work_cv, NULL) != 0)
        goto fail_mu;
    if (pthread_cond_init(&s->done_cv, NULL) != 0)
        goto fail_work;
    if (pthread_cond_init(&s->job_cv, NULL) != 0)
        goto fail_done;
    if (pthread_cond_init(&s->part_cv, NULL) != 0)
        goto fail_job;
    return true;
fail_job:
    pthread_cond_destroy(&s->job_cv);
fail_done:
    pthread_cond_destroy(&s->done_cv);
fail_work:
    pthread_cond_destroy(&s->work_cv);
fail_mu:
    pthread_mutex_destroy(&s->mu);
fail_mem:
    free(s->helpers);
    free(s->ops);
    s->helpers = NULL;
    s->ops = NULL;
    return false;
}

/* Frees the tables of a device whose streams are all stopped; the first
 * `streams_inited` slots were initialised. */
static void hw_host_free_tables(kvs_host_device_t *h, uint32_t streams_inited)
{
    for (uint32_t i = 0; i < streams_inited; i++) {
        struct kvs_stream *s = &h->streams[i];
        for (uint32_t k = 0; s->ops != NULL && k < h->queue_ops; k++)
            free(s->ops[k].words);
        free(s->ops);
        free(s->helpers);
        pthread_cond_destroy(&s->part_cv);
        pthread_cond_destroy(&s->job_cv);
        pthread_cond_destroy(&s->done_cv);
        pthread_cond_destroy(&s->work_cv);
        pthread_mutex_destroy(&s->mu);
    }
    hw_slots_fini(&h->event_slots);
    hw_slots_fini(&h->stream_slots);
    free(h->events);
    free(h->streams);
    hw_alloc_table_fini(&h->allocs);
}

int kvs_host_device_create(const kvs_host_config_t *cfg, kvs_host_device_t **out,
                           kvs_error_t *err)
{
    if (out == NULL)
        return KVS_ERROR_SET(err, KVS_EINVAL, EINVAL,
                             "kvs_host_device_create: out is NULL; pass where to store "
                             "the device");
    kvs_host_config_t c = cfg != NULL ? *cfg : (kvs_host_config_t){0};
    if (c.copy_threads > HW_HOST_MAX_COPY_THREADS)
        return KVS_ERROR_SET(err, KVS_EINVAL, EINVAL,
                             "kvs_host_device_create: copy_threads above %u; pass at most "
                             "one per core",
                             HW_HOST_MAX_COPY_THREADS);
    if (c.max_vector_bytes != 0 && c.max_vector_bytes != 16 && c.max_vector_bytes != 32 &&
        c.max_vector_bytes != 64)
        return KVS_ERROR_SET(err, KVS_EINVAL, EINVAL,
                             "kvs_host_device_create: max_vector_bytes must be 16, 32, "
                             "64 or 0 (the widest the CPU runs)");
    if (c.name != NULL && strlen(c.name) >= sizeof((kvs_host_device_t *)0)->name)
        return KVS_ERROR_SET(err, KVS_EINVAL, EINVAL,
                             "kvs_host_device_create: name longer than 31 bytes; "
                             "pass a shorter name");
    kvs_host_device_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return KVS_ERROR_SET(err, KVS_ENOMEM, ENOMEM,
                             "kvs_host_device_create: out of host memory");
    snprintf(h->name, sizeof h->name, "%s", c.name != NULL ? c.name : "host");
    h->max_streams = c.max_streams ? c.max_streams : HW_HOST_DEFAULT_MAX_STREAMS;
    h->max_events = c.max_events ? c.max_events : HW_HOST_DEFAULT_MAX_EVENTS;
    h->queue_ops = c.queue_ops ? c.queue_ops : HW_HOST_DEFAULT_QUEUE_OPS;
    h->copy_threads = c.copy_threads ? c.copy_threads : 1;
    h->max_vector_bytes = c.max_vector_bytes ? c.max_vector_bytes : 64;

    uint32_t inited = 0;
    h->streams = calloc(h->max_streams, sizeof *h->streams);
    h->events = calloc(h->max_events, sizeof *h->events);
    if (!hw_alloc_table_init(&h->allocs,
                             c.max_allocs ? c.max_allocs : HW_HOST_DEFAULT_MAX_ALLOCS) ||
        h->streams == NULL || h->events == NULL ||
        !hw_slots_init(&h->stream_slots, h->max_streams, HW_SLOTS_FULL_STREAMS) ||
        !hw_slots_init(&h->event_slots, h->max_events, HW_SLOTS_FULL_EVENTS))
        goto fail_nomem;
    for (; inited < h->max_streams; inited++)
        if (!hw_host_slot_init(h, &h->streams[inited], inited))
            goto fail_nomem;
    const int e = hw_wait_fd_init(&h->wait);
    if (e != 0) {
        hw_host_free_tables(h, inited);
        free(h);
        return KVS_ERROR_SET(err, KVS_EBACKEND, e,
                             "kvs_host_device_create: eventfd failed (%s); raise the "
                             "process's open file limit (ulimit -n)",
                             strerror(e));
    }
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        hw_wait_fd_fini(&h->wait);
        goto fail_nomem;
    }
    int rc = kvs_device_init(&h->base, &hw_host_ops, h->name);
    if (rc != KVS_OK) {
        pthread_mutex_destroy(&h->mu);
        hw_wait_fd_fini(&h->wait);
        hw_host_free_tables(h, inited);
        free(h);
        return KVS_ERROR_SET(err, rc, 0,
                             "kvs_host_device_create: the core refused the ops table; "
                             "rebuild hw/host against this kvstage's backend.h");
    }
    for (uint32_t i = 0; i < h->max_events; i++)
        h->events[i].host = h;
    *out = h;
    return KVS_OK;

fail_nomem:
    hw_host_free_tables(h, inited);
    free(h);
    return KVS_ERROR_SET(err, KVS_ENOMEM, ENOMEM,
                         "kvs_host_device_create: out of host memory for the tables; "
                         "lower max_allocs, max_streams, max_events or queue_ops");
}

void kvs_host_device_destroy(kvs_host_device_t *h)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    for (uint32_t i = 0; i < h->max_streams; i++)
        if (h->streams[i].live)
            hw_host_stream_stop(&h->streams[i]);
    for (uint32_t i = 0; i < h->allocs.count; i++)
        if (!h->allocs.entries[i].attached) /* the application's stays */
            munmap(h->allocs.entries[i].base, (size_t)h->allocs.entries[i].base_bytes);
    pthread_mutex_unlock(&h->mu);
    pthread_mutex_destroy(&h->mu);
    hw_wait_fd_fini(&h->wait); /* every worker has been joined: none signals */
    hw_host_free_tables(h, h->max_streams);
    free(h);
}

kvs_device_t *kvs_host_device(kvs_host_device_t *h) { return h != NULL ? &h->base : NULL; }

kvs_host_device_t *kvs_host_device_from(kvs_device_t *dev)
{
    if (dev == NULL || dev->ops.mem_alloc != hw_host_mem_alloc)
        return NULL;
    return hw_host_of(dev);
}
