/*
 * gpu.c - the simulated GPU of gpu.h: a kvstage device backend ("sim-gpu")
 * whose device memory is real host memory and whose streams run on the
 * engine's virtual clock.
 *
 * What it does:
 * - Memory. Each allocation is host memory: mmap(MAP_NORESERVE) from 1 MiB
 *   up, so untouched pages cost no RSS, calloc below. Device addresses are
 *   (gpu id + 1) << 44 | offset; offsets come from a bump pointer aligned to
 *   256 bytes and are never reused, so a stale address never aliases a newer
 *   allocation. Live allocations sit in an array sorted by address (the bump
 *   pointer makes every new one the highest) for binary-search translation.
 *   The simulated HBM capacity is enforced on the requested lengths.
 * - Streams. A stream is a FIFO server: an op enqueued at `now` starts at
 *   max(now, busy_until) and lasts launch_ns + ceil(2 * bytes / bandwidth)
 *   (every byte is read and written once; the whole duration of a scatter is
 *   multiplied by the scatter slowdown). The descriptor is validated and
 *   snapshotted at enqueue (page list and layer bases copied into a buffer
 *   owned by the op slot and reused across ops); the bytes are copied by an
 *   engine event at the op's end, so nothing is visible earlier. The copy
 *   re-checks every address first: memory freed in between makes the op
 *   copy nothing and count a copy error.
 * - Events. An event waits for the ops enqueued on its stream before it was
 *   recorded: it is complete once the stream's completed-op sequence reaches
 *   the sequence recorded, i.e. after the last copy really ran (not merely
 *   once the clock reached its end, which could be before the copy event
 *   at the same instant was dispatched).
 *
 * - Data. One walker turns a descriptor into runs of rows (the tokens of a
 *   page run, or of consecutive pages, for one layer and K or V) and hands
 *   each run to the data mode: the bytes mode memmoves the rows, the
 *   provenance mode copies their provenance (sim/prov.h) in one range
 *   rewrite. Nothing else differs between the modes: validation, timing
 *   and events are the same code.
 * - Fused copies (gather_parts, scatter_parts) run as the core's default
 *   runs them, one op per part after the parts' check, so that a test hook
 *   can see (and, to plant a bug, change) a fused copy's parts.
 *
 * What it does not: no threads, no wall clock, no randomness; no kernel
 * other than gather and scatter; copies are all-or-nothing per op.
 *
 * Invariants: allocs[] sorted by addr and disjoint; used_bytes == sum of
 * live lengths; ops of one stream complete in enqueue order
 * (done_seq + 1 == the completing op's seq); stream, event and op slots live
 * in arrays owned by the GPU, so a kvs_stream_t / kvs_event_t pointer stays
 * valid memory until sim_gpu_destroy.
 *
 * Lifetime: the engine must outlive the GPU. sim_gpu_destroy cancels the
 * engine events of ops still pending, so none fires into freed memory; their
 * bytes are never copied.
 */
#define _DEFAULT_SOURCE

#include "gpu.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SIM_GPU_DEFAULT_HBM_BYTES (141ull << 30)
#define SIM_GPU_DEFAULT_HBM_BYTES_PER_S 4800000000000ull
#define SIM_GPU_DEFAULT_LAUNCH_NS 5000ull
#define SIM_GPU_DEFAULT_MAX_ALLOCS 4096u
#define SIM_GPU_DEFAULT_MAX_STREAMS 64u
#define SIM_GPU_DEFAULT_MAX_EVENTS 65536u

#define SIM_GPU_SPACE_SHIFT 44
#define SIM_GPU_SPACE_BYTES (1ull << SIM_GPU_SPACE_SHIFT)
#define SIM_GPU_MAX_ID ((1u << (64 - SIM_GPU_SPACE_SHIFT)) - 2u)
#define SIM_GPU_ALIGN_BYTES 256ull
#define SIM_GPU_MMAP_MIN_BYTES (1ull << 20)
/* Pending stream ops: the pool starts here and doubles up to the cap. */
#define SIM_GPU_OPS_INITIAL 64u
#define SIM_GPU_OPS_MAX (1u << 20)
#define SIM_GPU_NONE UINT32_MAX
/* Events live in pages of this many, allocated when first handed out:
 * event pointers stay valid, and a GPU that records few events touches
 * little memory (a small simulated run would otherwise spend more time
 * creating 65536 events per GPU than running). */
#define SIM_GPU_EVENT_PAGE 256u

__extension__ typedef unsigned __int128 sim_gpu_u128;

typedef struct sim_gpu_alloc {
    uint64_t addr;      /* device address */
    uint64_t len_bytes; /* as requested */
    uint8_t *host;
    bool mapped;        /* mmap'ed (else calloc'ed) */
} sim_gpu_alloc_t;

enum sim_gpu_stream_state {
    SIM_GPU_STREAM_FREE = 0,
    SIM_GPU_STREAM_LIVE = 1,
    SIM_GPU_STREAM_DRAINING = 2 /* destroyed with ops pending */
};

struct kvs_stream {
    sim_gpu_t *gpu;
    uint64_t busy_until_ns;
    uint64_t enq_seq;   /* ops enqueued on this slot, ever (never reset) */
    uint64_t done_seq;  /* ops completed on this slot, ever */
    uint32_t pending;   /* enq_seq - done_seq */
    uint32_t index;
    int state;
};

struct kvs_event {
    sim_gpu_t *gpu;
    uint64_t target_seq; /* complete when the stream's done_seq reaches it */
    uint64_t done_ns;    /* modeled completion, for diagnostics */
    uint32_t stream;
    uint32_t index;      /* in the GPU's event pages */
    bool live;
};

typedef struct sim_gpu_op {
    kvs_copy_desc_t desc;  /* snapshot; its arrays point into words */
    uint64_t *words;       /* [k_base layer_count | v_base layer_count | pages] */
    size_t words_cap;
    uint64_t bytes;        /* payload bytes (K and V) */
    uint64_t dur_ns;
    uint64_t seq;
    uint64_t engine_id;
    uint32_t stream;
    uint32_t next_free;
    bool scatter;
    bool live;
    /* Provenance mode, a fused scatter of nparts > 1 parts: its earlier
     * ops are `deferred` (they move nothing) and its last holds every
     * part and moves them all at once, one rewrite per run of rows. */
    bool deferred;
    kvs_copy_part_t *parts;
    int64_t nparts;
    size_t parts_cap;
} sim_gpu_op_t;

struct sim_gpu {
    kvs_device_t base; /* first: recovered with KVS_CONTAINER_OF */
    sim_engine_t *eng; /* borrowed; outlives the GPU */
    uint32_t id;
    char name[32];
    char label[16];    /* "gpu N": how messages name it */
    uint64_t hbm_bytes, hbm_bytes_per_s, launch_ns;
    uint32_t max_allocs, max_streams, max_events;

    uint64_t used_bytes;
    uint64_t next_offset;
    sim_gpu_alloc_t *allocs;
    uint32_t num_allocs;

    struct kvs_stream *streams;
    struct kvs_event **event_pages; /* max_events / PAGE + 1, NULL until used */
    uint32_t *event_free; /* stack of freed event indices; room for all
                             event_fresh rounded up to a page */
    uint32_t event_free_count;
    uint32_t event_fresh; /* indices [event_fresh, max_events) never handed out */

    sim_gpu_op_t *ops;
    uint32_t ops_cap;
    uint32_t op_free; /* head of the free list, SIM_GPU_NONE when empty */
    uint32_t ops_pending;

    uint32_t scatter_slowdown;
    sim_data_mode_t data_mode;
    sim_prov_map_t *prov;  /* provenance mode: what memory holds */
    sim_gpu_copy_hook_fn copy_hook;
    void *copy_hook_ctx;
    kvs_copy_part_t *hook_parts; /* [KVS_COPY_PARTS_MAX] while a hook is set */
    sim_prov_rowsrc_t *rowsrc;   /* fused scatters: [KVS_COPY_PARTS_MAX] */
    kvs_copy_shape_t *part_shapes; /* ... and their parts' shapes */
    int64_t *part_order;          /* ... by head_start */
    struct sim_gpu_prun *pruns;   /* a walk's runs of pool slots */
    size_t pruns_cap;
    sim_gpu_wake_fn wake;
    void *wake_ctx;
    sim_span_fn span;
    void *span_ctx;

    uint64_t copy_ns, copy_bytes, copy_errors, ops_done;
};

static sim_gpu_t *sim_gpu_of(kvs_device_t *dev)
{
    return KVS_CONTAINER_OF(dev, sim_gpu_t, base);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */

/* Index of the allocation with the greatest addr <= x, or -1. */
static int64_t sim_gpu_find(const sim_gpu_t *gpu, uint64_t x)
{
    int64_t lo = 0, hi = (int64_t)gpu->num_allocs - 1, best = -1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (gpu->allocs[mid].addr <= x) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

/* The allocation holding all of [addr, addr + len), or NULL. */
static const sim_gpu_alloc_t *sim_gpu_lookup(const sim_gpu_t *gpu, uint64_t addr,
                                             uint64_t len_bytes)
{
    int64_t i = sim_gpu_find(gpu, addr);
    if (i < 0)
        return NULL;
    const sim_gpu_alloc_t *a = &gpu->allocs[i];
    uint64_t rel = addr - a->addr;
    /* An empty range may sit just past the end (one-past pointer). */
    if (rel > a->len_bytes || len_bytes > a->len_bytes - rel)
        return NULL;
    return a;
}

uint8_t *sim_gpu_host(sim_gpu_t *gpu, uint64_t addr, uint64_t len_bytes)
{
    if (gpu == NULL || gpu->data_mode != SIM_DATA_BYTES)
        return NULL;
    const sim_gpu_alloc_t *a = sim_gpu_lookup(gpu, addr, len_bytes);
    return a != NULL ? a->host + (addr - a->addr) : NULL;
}

bool sim_gpu_in_mem(const sim_gpu_t *gpu, uint64_t addr, uint64_t len_bytes)
{
    return gpu != NULL && sim_gpu_lookup(gpu, addr, len_bytes) != NULL;
}

static void sim_gpu_release(sim_gpu_alloc_t *a)
{
    if (a->mapped)
        munmap(a->host, (size_t)a->len_bytes);
    else
        free(a->host);
}

static int sim_gpu_mem_alloc(kvs_device_t *dev, uint64_t len_bytes, uint64_t *out_addr)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    if (out_addr == NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "mem_alloc on gpu %u: out_addr is NULL", gpu->id);
    if (len_bytes == 0)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "mem_alloc on gpu %u: length 0; ask for at least one byte",
                               gpu->id);
    if (len_bytes > gpu->hbm_bytes - gpu->used_bytes)
        return kvs_device_fail(dev, KVS_EBACKEND, ENOMEM,
                               "simulated HBM of gpu %u full: %llu of %llu bytes used, "
                               "%llu requested; lower the ring or KV pool size",
                               gpu->id, (unsigned long long)gpu->used_bytes,
                               (unsigned long long)gpu->hbm_bytes,
                               (unsigned long long)len_bytes);
    if (gpu->num_allocs == gpu->max_allocs)
        return kvs_device_fail(dev, KVS_EFULL, ENOSPC,
                               "allocation table of gpu %u full: %u live allocations; "
                               "free some or raise max_allocs",
                               gpu->id, gpu->max_allocs);
    if (len_bytes > SIM_GPU_SPACE_BYTES - gpu->next_offset ||
        len_bytes > (uint64_t)SIZE_MAX)
        return kvs_device_fail(dev, KVS_EBACKEND, ENOSPC,
                               "address space of gpu %u exhausted: %llu bytes handed out "
                               "(offsets are never reused), %llu requested; recreate the "
                               "gpu or allocate less often",
                               gpu->id, (unsigned long long)gpu->next_offset,
                               (unsigned long long)len_bytes);

    sim_gpu_alloc_t a = {0};
    a.len_bytes = len_bytes;
    if (gpu->data_mode == SIM_DATA_PROVENANCE) {
        /* No bytes: a new allocation is a hole in the map. */
    } else if (len_bytes >= SIM_GPU_MMAP_MIN_BYTES) {
        void *p = mmap(NULL, (size_t)len_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            return kvs_device_fail(dev, KVS_ENOMEM, err,
                                   "gpu %u: cannot map %llu bytes of host memory to back "
                                   "the simulated HBM: %s",
                                   gpu->id, (unsigned long long)len_bytes, strerror(err));
        }
        a.host = p;
        a.mapped = true;
    } else {
        a.host = calloc(1, (size_t)len_bytes);
        if (a.host == NULL)
            return kvs_device_fail(dev, KVS_ENOMEM, ENOMEM,
                                   "gpu %u: out of host memory for %llu bytes",
                                   gpu->id, (unsigned long long)len_bytes);
    }
    a.addr = ((uint64_t)(gpu->id + 1) << SIM_GPU_SPACE_SHIFT) | gpu->next_offset;
    uint64_t step = len_bytes + (SIM_GPU_ALIGN_BYTES - 1);
    step -= step % SIM_GPU_ALIGN_BYTES;
    /* May reach exactly the end of the space; the next request then fails. */
    gpu->next_offset = step > SIM_GPU_SPACE_BYTES - gpu->next_offset
                           ? SIM_GPU_SPACE_BYTES
                           : gpu->next_offset + step;
    assert(gpu->num_allocs == 0 || gpu->allocs[gpu->num_allocs - 1].addr < a.addr);
    gpu->allocs[gpu->num_allocs++] = a;
    gpu->used_bytes += len_bytes;
    *out_addr = a.addr;
    return KVS_OK;
}

static int sim_gpu_mem_free(kvs_device_t *dev, uint64_t addr)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    int64_t i = sim_gpu_find(gpu, addr);
    if (i < 0 || gpu->allocs[i].addr != addr)
        return kvs_device_fail(dev, KVS_ENOENT, ENOENT,
                               "mem_free on gpu %u: 0x%llx is not the start of a live "
                               "allocation (never allocated or already freed)",
                               gpu->id, (unsigned long long)addr);
    sim_gpu_alloc_t a = gpu->allocs[i];
    memmove(&gpu->allocs[i], &gpu->allocs[i + 1],
            (size_t)(gpu->num_allocs - 1 - (uint32_t)i) * sizeof gpu->allocs[0]);
    gpu->num_allocs--;
    assert(gpu->used_bytes >= a.len_bytes);
    gpu->used_bytes -= a.len_bytes;
    if (gpu->prov != NULL && sim_prov_erase(gpu->prov, a.addr, a.len_bytes) != KVS_OK)
        gpu->copy_errors++; /* its runs stay: addresses are never reused */
    sim_gpu_release(&a);
    return KVS_OK;
}

static int sim_gpu_mem_write(kvs_device_t *dev, uint64_t addr, const void *src,
                             uint64_t len_bytes)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    if (src == NULL && len_bytes != 0)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "mem_write on gpu %u: src is NULL",
                               gpu->id);
    if (gpu->data_mode != SIM_DATA_BYTES)
        return kvs_device_fail(dev, KVS_ENOTSUP, 0,
                               "mem_write on gpu %u: the provenance data mode holds no "
                               "bytes; use the bytes mode", gpu->id);
    uint8_t *p = sim_gpu_host(gpu, addr, len_bytes);
    if (p == NULL)
        return kvs_device_fail(dev, KVS_ERANGE, ERANGE,
                               "mem_write on gpu %u: [0x%llx, +%llu) is not inside one "
                               "live allocation",
                               gpu->id, (unsigned long long)addr,
                               (unsigned long long)len_bytes);
    if (len_bytes != 0)
        memcpy(p, src, (size_t)len_bytes);
    return KVS_OK;
}

static int sim_gpu_mem_read(kvs_device_t *dev, uint64_t addr, void *dst, uint64_t len_bytes)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    if (dst == NULL && len_bytes != 0)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "mem_read on gpu %u: dst is NULL",
                               gpu->id);
    if (gpu->data_mode != SIM_DATA_BYTES)
        return kvs_device_fail(dev, KVS_ENOTSUP, 0,
                               "mem_read on gpu %u: the provenance data mode holds no "
                               "bytes; use the bytes mode", gpu->id);
    uint8_t *p = sim_gpu_host(gpu, addr, len_bytes);
    if (p == NULL)
        return kvs_device_fail(dev, KVS_ERANGE, ERANGE,
                               "mem_read on gpu %u: [0x%llx, +%llu) is not inside one "
                               "live allocation",
                               gpu->id, (unsigned long long)addr,
                               (unsigned long long)len_bytes);
    if (len_bytes != 0)
        memcpy(dst, p, (size_t)len_bytes);
    return KVS_OK;
}

/* ------------------------------------------------------------------------ */
/* Descriptor validation (at enqueue, and again before the copy)            */
/* ------------------------------------------------------------------------ */

static bool sim_gpu_mem_fn(void *ctx, uint64_t addr, uint64_t len_bytes)
{
    return sim_gpu_lookup(ctx, addr, len_bytes) != NULL;
}

/* kvs_copy_desc_check (the check every device backend runs) against this
 * GPU's live memory, with "gpu N" in the message. */
static int sim_gpu_check(sim_gpu_t *gpu, const kvs_copy_desc_t *d, const char *what,
                         kvs_copy_shape_t *sh, char *msg, size_t msg_bytes)
{
    return kvs_copy_desc_check(d, what, gpu->label, sim_gpu_mem_fn, gpu, sh, msg, msg_bytes);
}

/* ------------------------------------------------------------------------ */
/* Copies                                                                    */
/* ------------------------------------------------------------------------ */

/* Host pointer of device address a, known to be inside live memory. */
static uint8_t *sim_gpu_ptr(const sim_gpu_t *gpu, uint64_t a, uint64_t len_bytes)
{
    const sim_gpu_alloc_t *al = sim_gpu_lookup(gpu, a, len_bytes);
    assert(al != NULL);
    return al->host + (a - al->addr);
}

/* `rows` rows of row_bytes from src (rows ss apart) to dst (ds apart),
 * device addresses inside live memory. */
typedef int (*sim_gpu_rows_fn)(sim_gpu_t *gpu, uint64_t dst, uint64_t ds, uint64_t src,
                               uint64_t ss, uint64_t row_bytes, uint64_t rows);

static int sim_gpu_rows_bytes(sim_gpu_t *gpu, uint64_t dst, uint64_t ds, uint64_t src,
                              uint64_t ss, uint64_t row_bytes, uint64_t rows)
{
    uint8_t *d = sim_gpu_ptr(gpu, dst, (rows - 1) * ds + row_bytes);
    const uint8_t *s = sim_gpu_ptr(gpu, src, (rows - 1) * ss + row_bytes);
    for (uint64_t i = 0; i < rows; i++)
        memmove(d + i * ds, s + i * ss, (size_t)row_bytes);
    return KVS_OK;
}

static int sim_gpu_rows_prov(sim_gpu_t *gpu, uint64_t dst, uint64_t ds, uint64_t src,
                             uint64_t ss, uint64_t row_bytes, uint64_t rows)
{
    const sim_prov_rowsrc_t one = {.s0 = src, .ss = ss, .row_bytes = row_bytes};
    return sim_prov_batch_copy_parts(gpu->prov, dst, ds, gpu->prov, &one, 1, rows);
}

/* Tokens [i, i + n) of a copy whose pool slots follow each other from
 * slot `first` (a page, or pages with consecutive ids). */
typedef struct sim_gpu_prun {
    uint64_t i, first, n;
} sim_gpu_prun_t;

/* The runs of d's tokens in gpu->pruns, found once per copy rather than
 * once per layer and K/V (a long page list costs its length once).
 * Returns the count, or -1 when out of host memory. */
static int64_t sim_gpu_pruns(sim_gpu_t *gpu, const kvs_copy_desc_t *d)
{
    const uint64_t ps = (uint64_t)d->page_size, T = (uint64_t)d->tokens;
    size_t k = 0;
    for (uint64_t i = 0; i < T;) {
        const uint64_t first = (uint64_t)d->pages[i / ps] * ps + i % ps;
        uint64_t n = ps - i % ps; /* the rest of this page */
        while (i + n < T && (uint64_t)d->pages[(i + n) / ps] * ps == first + n)
            n += ps; /* the next page follows in the pool */
        if (n > T - i)
            n = T - i;
        if (k == gpu->pruns_cap) {
            const size_t cap = k == 0 ? 64 : 2 * k;
            sim_gpu_prun_t *v = realloc(gpu->pruns, cap * sizeof *v);
            if (v == NULL)
                return -1;
            gpu->pruns = v;
            gpu->pruns_cap = cap;
        }
        gpu->pruns[k++] = (sim_gpu_prun_t){i, first, n};
        i += n;
    }
    return (int64_t)k;
}

/* A copy moves, per layer, its planes' KV rows (K, V; K alone with one
 * plane) and, with scales, then their scale rows: sub-plane q < planes is
 * plane q's KV, q >= planes the scales of plane q - planes. */
typedef struct sim_gpu_subplane {
    uint64_t base;        /* the pool buffer of the layer */
    uint64_t token_bytes; /* one pool slot */
    uint64_t row_bytes;   /* one token's copied row */
    uint64_t head_off;    /* the first copied head in a slot */
    uint64_t slot_off;    /* from the staging block to this sub-plane's rows */
} sim_gpu_subplane_t;

static uint64_t sim_gpu_subplanes(const kvs_copy_shape_t *sh)
{
    return sh->scale_row_bytes > 0 ? 2 * sh->planes : sh->planes;
}

static sim_gpu_subplane_t sim_gpu_subplane(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                                           uint64_t q, int64_t l, uint64_t slot)
{
    const bool scale = q >= sh->planes;
    const uint64_t kv = scale ? q - sh->planes : q;
    const uint64_t S = (uint64_t)d->staging_layer_slots;
    sim_gpu_subplane_t sp = {.slot_off = (kv * S + slot) * sh->slot_bytes};
    if (scale) {
        sp.base = kv == 0 ? d->ks_base[l] : d->vs_base[l];
        sp.token_bytes = sh->scale_token_bytes;
        sp.row_bytes = sh->scale_row_bytes;
        sp.head_off = sh->scale_head_off;
        sp.slot_off += sh->scale_off;
    } else {
        sp.base = kv == 0 ? d->k_base[l] : d->v_base[l];
        sp.token_bytes = sh->token_bytes;
        sp.row_bytes = sh->row_bytes;
        sp.head_off = sh->head_off;
    }
    return sp;
}

/* Walks a validated copy, pool -> staging (gather) or back (scatter): for
 * each layer and K/V (K alone with one plane: MLA), then their scale
 * planes, the tokens whose pool slots follow each other (a page, or pages
 * with consecutive ids) are one run of rows. */
static int sim_gpu_walk(sim_gpu_t *gpu, const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                        bool scatter, sim_gpu_rows_fn rows)
{
    if (sh->payload_bytes == 0)
        return KVS_OK;
    const int64_t nruns = sim_gpu_pruns(gpu, d);
    if (nruns < 0)
        return KVS_ENOMEM;
    int rc = KVS_OK;
    for (int64_t j = 0; j < d->layer_count && rc == KVS_OK; j++) {
        const int64_t l = d->layer_begin + j;
        const uint64_t slot = (uint64_t)(d->staging_slot_begin + j);
        for (uint64_t q = 0; q < sim_gpu_subplanes(sh) && rc == KVS_OK; q++) {
            const sim_gpu_subplane_t sp = sim_gpu_subplane(d, sh, q, l, slot);
            const uint64_t base = sp.base + sp.head_off;
            const uint64_t blk = d->staging_addr + sp.slot_off;
            if (gpu->prov != NULL) /* one rewrite per layer and K/V (rows_prov) */
                sim_prov_batch_begin(gpu->prov);
            for (int64_t k = 0; k < nruns && rc == KVS_OK; k++) {
                const uint64_t i = gpu->pruns[k].i, first = gpu->pruns[k].first,
                               n = gpu->pruns[k].n;
                const uint64_t pool = base + first * sp.token_bytes;
                const uint64_t stg = blk + i * sp.row_bytes;
                rc = scatter ? rows(gpu, pool, sp.token_bytes, stg, sp.row_bytes,
                                    sp.row_bytes, n)
                             : rows(gpu, stg, sp.row_bytes, pool, sp.token_bytes,
                                    sp.row_bytes, n);
            }
            if (gpu->prov != NULL) {
                const int end = sim_prov_batch_end(gpu->prov);
                rc = rc != KVS_OK ? rc : end;
            }
        }
    }
    return rc;
}

/* A fused scatter's parts in one pass (provenance mode): for each layer,
 * K/V and run of pool rows, the rows of every part, ordered by head, in one
 * copy. sh[i] is part i's checked shape. */
static int sim_gpu_walk_parts(sim_gpu_t *gpu, const kvs_copy_desc_t *d,
                              const kvs_copy_part_t *parts, const kvs_copy_shape_t *sh,
                              int64_t nparts)
{
    int64_t *ord = gpu->part_order;
    for (int64_t i = 0; i < nparts; i++) { /* insertion sort: parts come sorted */
        int64_t k = i;
        while (k > 0 && parts[ord[k - 1]].head_start > parts[i].head_start) {
            ord[k] = ord[k - 1];
            k--;
        }
        ord[k] = i;
    }
    const int64_t nruns = sim_gpu_pruns(gpu, d);
    if (nruns < 0)
        return KVS_ENOMEM;
    int rc = KVS_OK;
    for (int64_t j = 0; j < d->layer_count && rc == KVS_OK; j++) {
        const int64_t l = d->layer_begin + j;
        const uint64_t slot = (uint64_t)(d->staging_slot_begin + j);
        for (uint64_t sq = 0; sq < sim_gpu_subplanes(&sh[0]) && rc == KVS_OK; sq++) {
            const sim_gpu_subplane_t sp0 = sim_gpu_subplane(d, &sh[0], sq, l, slot);
            const uint64_t base = sp0.base, tb = sp0.token_bytes;
            sim_prov_batch_begin(gpu->prov); /* one rewrite per layer and K/V */
            for (int64_t k = 0; k < nruns && rc == KVS_OK; k++) {
                const uint64_t i = gpu->pruns[k].i, first = gpu->pruns[k].first,
                               n = gpu->pruns[k].n;
                for (int64_t q = 0; q < nparts; q++) {
                    const int64_t p = ord[q];
                    const sim_gpu_subplane_t sp = sim_gpu_subplane(d, &sh[p], sq, l, slot);
                    gpu->rowsrc[q] = (sim_prov_rowsrc_t){
                        .s0 = parts[p].staging_addr + sp.slot_off + i * sp.row_bytes,
                        .ss = sp.row_bytes, .row_bytes = sp.row_bytes,
                        .dst_off = sp.head_off};
                }
                rc = sim_prov_batch_copy_parts(gpu->prov, base + first * tb, tb, gpu->prov,
                                               gpu->rowsrc, (size_t)nparts, n);
            }
            const int end = sim_prov_batch_end(gpu->prov);
            rc = rc != KVS_OK ? rc : end;
        }
    }
    return rc;
}

/* The data of a fused scatter's last op: every part that is still in live
 * memory (all of them, unless memory was freed under the copy). */
static int sim_gpu_fire_parts(sim_gpu_t *gpu, const sim_gpu_op_t *op)
{
    char msg[KVS_ERROR_MSG_BYTES];
    bool all = true;
    for (int64_t i = 0; i < op->nparts; i++) {
        kvs_copy_desc_t one = op->desc;
        one.head_start = op->parts[i].head_start;
        one.num_heads = op->parts[i].num_heads;
        one.staging_addr = op->parts[i].staging_addr;
        all = all && sim_gpu_check(gpu, &one, "scatter", &gpu->part_shapes[i], msg,
                                   sizeof msg) == KVS_OK;
    }
    if (all)
        return sim_gpu_walk_parts(gpu, &op->desc, op->parts, gpu->part_shapes, op->nparts);
    int rc = KVS_OK;
    for (int64_t i = 0; i < op->nparts && rc == KVS_OK; i++) {
        kvs_copy_desc_t one = op->desc;
        one.head_start = op->parts[i].head_start;
        one.num_heads = op->parts[i].num_heads;
        one.staging_addr = op->parts[i].staging_addr;
        kvs_copy_shape_t sh;
        if (sim_gpu_check(gpu, &one, "scatter", &sh, msg, sizeof msg) == KVS_OK)
            rc = sim_gpu_walk(gpu, &one, &sh, true, sim_gpu_rows_prov);
        else
            gpu->copy_errors++;
    }
    return rc;
}

static void sim_gpu_op_fire(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_gpu_t *gpu = ctx;
    assert(arg < gpu->ops_cap);
    sim_gpu_op_t *op = &gpu->ops[arg];
    assert(op->live);
    struct kvs_stream *s = &gpu->streams[op->stream];
    assert(s->done_seq + 1 == op->seq && s->pending > 0);

    kvs_copy_shape_t sh;
    char msg[KVS_ERROR_MSG_BYTES];
    if (sim_gpu_check(gpu, &op->desc, op->scatter ? "scatter" : "gather", &sh, msg,
                      sizeof msg) == KVS_OK) {
        int rc = KVS_OK;
        if (op->nparts > 1)
            rc = sim_gpu_fire_parts(gpu, op);
        else if (!op->deferred)
            rc = sim_gpu_walk(gpu, &op->desc, &sh, op->scatter,
                              gpu->prov != NULL ? sim_gpu_rows_prov : sim_gpu_rows_bytes);
        if (rc == KVS_OK)
            gpu->copy_bytes += op->bytes;
        else
            gpu->copy_errors++; /* out of host memory for provenance */
    } else {
        gpu->copy_errors++; /* memory freed while the op was in flight */
    }
    gpu->copy_ns += op->dur_ns;
    gpu->ops_done++;
    if (gpu->span != NULL) {
        const uint64_t now = sim_engine_now_ns(eng);
        gpu->span(gpu->span_ctx, op->scatter ? "scatter" : "gather", "gpu", now - op->dur_ns, now);
    }

    s->done_seq = op->seq;
    s->pending--;
    if (s->state == SIM_GPU_STREAM_DRAINING && s->pending == 0)
        s->state = SIM_GPU_STREAM_FREE;

    op->live = false;
    op->next_free = gpu->op_free;
    gpu->op_free = (uint32_t)arg;
    gpu->ops_pending--;

    /* Last: the callback may enqueue (growing ops[]) or destroy the GPU. */
    if (gpu->wake != NULL)
        gpu->wake(gpu->wake_ctx);
}

/* A free op slot index, growing the pool by doubling when it is empty. */
static int sim_gpu_op_get(sim_gpu_t *gpu, uint32_t *out)
{
    if (gpu->op_free == SIM_GPU_NONE) {
        if (gpu->ops_cap >= SIM_GPU_OPS_MAX)
            return kvs_device_fail(&gpu->base, KVS_EFULL, ENOSPC,
                                   "gpu %u: %u stream ops pending, the most it queues; run "
                                   "the engine or enqueue fewer copies",
                                   gpu->id, gpu->ops_cap);
        uint32_t cap = gpu->ops_cap == 0 ? SIM_GPU_OPS_INITIAL : gpu->ops_cap * 2;
        sim_gpu_op_t *ops = realloc(gpu->ops, (size_t)cap * sizeof *ops);
        if (ops == NULL)
            return kvs_device_fail(&gpu->base, KVS_ENOMEM, ENOMEM,
                                   "gpu %u: out of host memory for %u stream ops", gpu->id,
                                   cap);
        memset(&ops[gpu->ops_cap], 0, (size_t)(cap - gpu->ops_cap) * sizeof *ops);
        for (uint32_t i = cap; i-- > gpu->ops_cap;) {
            ops[i].next_free = gpu->op_free;
            gpu->op_free = i;
        }
        gpu->ops = ops;
        gpu->ops_cap = cap;
    }
    *out = gpu->op_free;
    gpu->op_free = gpu->ops[*out].next_free;
    return KVS_OK;
}

static void sim_gpu_op_put(sim_gpu_t *gpu, uint32_t i)
{
    gpu->ops[i].live = false;
    gpu->ops[i].next_free = gpu->op_free;
    gpu->op_free = i;
}

/* Modeled duration: launch + ceil(2 * bytes * 1e9 / bandwidth), times factor,
 * saturating. */
static uint64_t sim_gpu_duration(const sim_gpu_t *gpu, uint64_t bytes, uint32_t factor)
{
    sim_gpu_u128 copy = ((sim_gpu_u128)bytes * 2u * 1000000000u +
                         (gpu->hbm_bytes_per_s - 1)) /
                        gpu->hbm_bytes_per_s;
    sim_gpu_u128 ns = ((sim_gpu_u128)gpu->launch_ns + copy) * (factor == 0 ? 1u : factor);
    return ns > UINT64_MAX ? UINT64_MAX : (uint64_t)ns;
}

/* Enqueues one copy; *out_idx (may be NULL) gets its op slot. */
static int sim_gpu_enqueue(kvs_device_t *dev, kvs_stream_t *stream,
                           const kvs_copy_desc_t *d, bool scatter, uint32_t *out_idx)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    const char *what = scatter ? "scatter" : "gather";
    if (stream == NULL || stream->gpu != gpu || stream->state != SIM_GPU_STREAM_LIVE)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "%s on gpu %u: stream is NULL, destroyed or of another gpu",
                               what, gpu->id);
    kvs_copy_shape_t sh;
    char msg[KVS_ERROR_MSG_BYTES];
    int rc = sim_gpu_check(gpu, d, what, &sh, msg, sizeof msg);
    if (rc != KVS_OK)
        return kvs_device_fail(dev, rc, rc == KVS_ERANGE ? ERANGE : EINVAL, "%s", msg);

    uint64_t n_words = 0;
    if (__builtin_mul_overflow((uint64_t)d->layer_count, 4, &n_words) ||
        __builtin_add_overflow(n_words, sh.pages_used, &n_words) ||
        n_words > SIZE_MAX / sizeof(uint64_t))
        return kvs_device_fail(dev, KVS_ERANGE, ERANGE, "%s on gpu %u: descriptor too large",
                               what, gpu->id);
    uint32_t idx = 0;
    rc = sim_gpu_op_get(gpu, &idx);
    if (rc != KVS_OK)
        return rc;
    sim_gpu_op_t *op = &gpu->ops[idx];
    if (n_words > op->words_cap) {
        uint64_t *w = realloc(op->words, (size_t)n_words * sizeof *w);
        if (w == NULL) {
            sim_gpu_op_put(gpu, idx);
            return kvs_device_fail(dev, KVS_ENOMEM, ENOMEM,
                                   "%s on gpu %u: out of host memory for a %llu-page "
                                   "descriptor",
                                   what, gpu->id, (unsigned long long)sh.pages_used);
        }
        op->words = w;
        op->words_cap = (size_t)n_words;
    }
    /* Snapshot: layer j's bases at [j] and [L + j], its scale buffers' at
     * [2L + j] and [3L + j], pages after them; the copy indexes
     * k_base[layer_begin + j], so the arrays are shifted. */
    uint64_t L = (uint64_t)d->layer_count;
    const bool scales = sh.scale_row_bytes > 0;
    for (uint64_t j = 0; j < L; j++) {
        const uint64_t l = (uint64_t)d->layer_begin + j;
        op->words[j] = d->k_base[l];
        op->words[L + j] = sh.planes == 2 ? d->v_base[l] : 0;
        op->words[2 * L + j] = scales ? d->ks_base[l] : 0;
        op->words[3 * L + j] = scales && sh.planes == 2 ? d->vs_base[l] : 0;
    }
    int64_t *pages = (int64_t *)(void *)(op->words + 4 * L);
    for (uint64_t i = 0; i < sh.pages_used; i++)
        pages[i] = d->pages[i];
    op->desc = *d;
    op->desc.k_base = op->words;
    op->desc.v_base = op->words + L;
    op->desc.ks_base = op->words + 2 * L;
    op->desc.vs_base = op->words + 3 * L;
    op->desc.layer_begin = 0;
    op->desc.pages = pages;
    op->desc.num_pages = (int64_t)sh.pages_used;

    uint64_t now = sim_engine_now_ns(gpu->eng);
    uint64_t start = stream->busy_until_ns > now ? stream->busy_until_ns : now;
    uint64_t dur = sim_gpu_duration(gpu, sh.payload_bytes,
                                    scatter ? gpu->scatter_slowdown : 1u);
    uint64_t end = dur > UINT64_MAX - start ? UINT64_MAX : start + dur;
    rc = sim_engine_at(gpu->eng, end, sim_gpu_op_fire, gpu, idx, &op->engine_id);
    if (rc != KVS_OK) {
        sim_gpu_op_put(gpu, idx);
        return kvs_device_fail(dev, rc, 0, "%s on gpu %u: the engine refused the event",
                               what, gpu->id);
    }
    op->bytes = sh.payload_bytes;
    op->dur_ns = dur;
    op->scatter = scatter;
    op->stream = stream->index;
    op->seq = ++stream->enq_seq;
    op->live = true;
    op->deferred = false;
    op->nparts = 0;
    if (out_idx != NULL)
        *out_idx = idx;
    stream->pending++;
    stream->busy_until_ns = end;
    gpu->ops_pending++;
    return KVS_OK;
}

static int sim_gpu_gather(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *d)
{
    return sim_gpu_enqueue(dev, stream, d, false, NULL);
}

static int sim_gpu_scatter(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *d)
{
    return sim_gpu_enqueue(dev, stream, d, true, NULL);
}

/* Scratch of fused scatters, made on first use. */
static bool sim_gpu_fuse_ready(sim_gpu_t *gpu, int64_t n)
{
    if (n > KVS_COPY_PARTS_MAX)
        return false;
    if (gpu->rowsrc == NULL) {
        gpu->rowsrc = calloc(KVS_COPY_PARTS_MAX, sizeof *gpu->rowsrc);
        gpu->part_shapes = calloc(KVS_COPY_PARTS_MAX, sizeof *gpu->part_shapes);
        gpu->part_order = calloc(KVS_COPY_PARTS_MAX, sizeof *gpu->part_order);
    }
    return gpu->rowsrc != NULL && gpu->part_shapes != NULL && gpu->part_order != NULL;
}

/* Gives the last op of a fused scatter every part. */
static int sim_gpu_op_parts(sim_gpu_op_t *op, const kvs_copy_part_t *parts, int64_t n)
{
    if ((size_t)n > op->parts_cap) {
        kvs_copy_part_t *p = realloc(op->parts, (size_t)n * sizeof *p);
        if (p == NULL)
            return KVS_ENOMEM;
        op->parts = p;
        op->parts_cap = (size_t)n;
    }
    memcpy(op->parts, parts, (size_t)n * sizeof *parts);
    op->nparts = n;
    return KVS_OK;
}

/* A fused scatter that could not be enqueued whole: its ops enqueued so
 * far (this stream's, from first_op on) move their own parts again. */
static void sim_gpu_undefer(sim_gpu_t *gpu, const kvs_stream_t *stream, uint32_t first_op)
{
    const uint64_t seq0 = gpu->ops[first_op].seq;
    for (uint32_t i = 0; i < gpu->ops_cap; i++) {
        sim_gpu_op_t *op = &gpu->ops[i];
        if (op->live && op->stream == stream->index && op->seq >= seq0) {
            op->deferred = false;
            op->nparts = 0;
        }
    }
}

/* As the core's default fused copy (src/backend.c): the parts' shapes
 * checked together, then one copy per part, in order, a refused part
 * named before the detail; the copy hook sees the parts first. */
static bool sim_gpu_any_mem(void *ctx, uint64_t addr, uint64_t len_bytes)
{
    (void)ctx;
    (void)addr;
    (void)len_bytes;
    return true;
}

static int sim_gpu_parts(kvs_device_t *dev, kvs_stream_t *stream, const kvs_copy_desc_t *d,
                         const kvs_copy_part_t *parts, int64_t n, bool scatter)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    const char *what = scatter ? "scatter_parts" : "gather_parts";
    kvs_copy_desc_t hook_desc; /* the hook's copy: ops snapshot its pages */
    if (gpu->copy_hook != NULL && parts != NULL && n > 0 && n <= KVS_COPY_PARTS_MAX) {
        memcpy(gpu->hook_parts, parts, (size_t)n * sizeof *parts);
        hook_desc = *d;
        gpu->copy_hook(gpu->copy_hook_ctx, gpu->id, scatter, &hook_desc, gpu->hook_parts, n);
        parts = gpu->hook_parts;
        d = &hook_desc;
    }
    char msg[KVS_ERROR_MSG_BYTES];
    int rc = kvs_copy_parts_check(d, parts, n, scatter, what, dev->name, sim_gpu_any_mem, NULL,
                                  NULL, msg, sizeof msg);
    if (rc != KVS_OK)
        return kvs_device_fail(dev, rc, 0, "%s", msg);
    /* Provenance mode: a scatter of several parts moves them all with its
     * last op (the same result: scatter parts hold disjoint heads, and
     * nothing reads the pool rows before the last op completes). */
    const bool fuse = scatter && gpu->prov != NULL && n > 1 && sim_gpu_fuse_ready(gpu, n);
    uint32_t first_op = SIM_GPU_NONE;
    for (int64_t i = 0; i < n && rc == KVS_OK; i++) {
        kvs_copy_desc_t one = *d;
        one.head_start = parts[i].head_start;
        one.num_heads = parts[i].num_heads;
        one.staging_addr = parts[i].staging_addr;
        uint32_t idx = SIM_GPU_NONE;
        rc = sim_gpu_enqueue(dev, stream, &one, scatter, &idx);
        if (rc == KVS_OK && fuse) {
            sim_gpu_op_t *op = &gpu->ops[idx];
            if (first_op == SIM_GPU_NONE)
                first_op = idx;
            if (i + 1 < n) {
                op->deferred = true;
            } else if (sim_gpu_op_parts(op, parts, n) != KVS_OK) {
                rc = KVS_ENOMEM; /* undone below: each op moves its own part */
            }
        }
        if (rc != KVS_OK && fuse && first_op != SIM_GPU_NONE)
            sim_gpu_undefer(gpu, stream, first_op);
        if (rc != KVS_OK) {
            memcpy(msg, dev->last_backend_msg, sizeof msg);
            kvs_device_fail(dev, rc, dev->last_backend_code, "%s part %lld: %s", what,
                            (long long)i, msg[0] != '\0' ? msg : kvs_strerror(rc));
        }
    }
    return rc;
}

static int sim_gpu_gather_parts(kvs_device_t *dev, kvs_stream_t *stream,
                                const kvs_copy_desc_t *d, const kvs_copy_part_t *parts,
                                int64_t n)
{
    return sim_gpu_parts(dev, stream, d, parts, n, false);
}

static int sim_gpu_scatter_parts(kvs_device_t *dev, kvs_stream_t *stream,
                                 const kvs_copy_desc_t *d, const kvs_copy_part_t *parts,
                                 int64_t n)
{
    return sim_gpu_parts(dev, stream, d, parts, n, true);
}

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */
/* ------------------------------------------------------------------------ */

static int sim_gpu_stream_create(kvs_device_t *dev, kvs_stream_t **out)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    if (out == NULL)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL, "stream_create on gpu %u: out is NULL",
                               gpu->id);
    for (uint32_t i = 0; i < gpu->max_streams; i++) {
        struct kvs_stream *s = &gpu->streams[i];
        if (s->state == SIM_GPU_STREAM_FREE) {
            /* Sequences carry on from the slot's previous life, so events
             * recorded on it then stay complete. */
            assert(s->pending == 0 && s->done_seq == s->enq_seq);
            s->state = SIM_GPU_STREAM_LIVE;
            *out = s;
            return KVS_OK;
        }
    }
    return kvs_device_fail(dev, KVS_EFULL, ENOSPC,
                           "gpu %u: all %u streams in use; destroy one or raise max_streams",
                           gpu->id, gpu->max_streams);
}

static void sim_gpu_stream_destroy(kvs_device_t *dev, kvs_stream_t *stream)
{
    if (stream == NULL)
        return;
    assert(stream->gpu == sim_gpu_of(dev) && stream->state == SIM_GPU_STREAM_LIVE);
    /* Like CUDA: pending work still completes; the slot is reused after. */
    stream->state = stream->pending > 0 ? SIM_GPU_STREAM_DRAINING : SIM_GPU_STREAM_FREE;
}

static int sim_gpu_event_record(kvs_device_t *dev, kvs_stream_t *stream, kvs_event_t **out)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    if (out == NULL || stream == NULL || stream->gpu != gpu ||
        stream->state != SIM_GPU_STREAM_LIVE)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "event_record on gpu %u: out is NULL or the stream is NULL, "
                               "destroyed or of another gpu",
                               gpu->id);
    if (gpu->event_free_count == 0 && gpu->event_fresh == gpu->max_events)
        return kvs_device_fail(dev, KVS_EFULL, ENOSPC,
                               "gpu %u: all %u events live; destroy completed events or "
                               "raise max_events",
                               gpu->id, gpu->max_events);
    /* The last freed first, else the lowest never used (the order of a
     * stack filled with 0, 1, 2, ... at creation). */
    struct kvs_event *ev;
    if (gpu->event_free_count > 0) {
        const uint32_t i = gpu->event_free[--gpu->event_free_count];
        ev = &gpu->event_pages[i / SIM_GPU_EVENT_PAGE][i % SIM_GPU_EVENT_PAGE];
    } else {
        const uint32_t i = gpu->event_fresh;
        if (i % SIM_GPU_EVENT_PAGE == 0) {
            const size_t stack_bytes = ((size_t)i + SIM_GPU_EVENT_PAGE) * sizeof(uint32_t);
            struct kvs_event *page = calloc(SIM_GPU_EVENT_PAGE, sizeof *page);
            uint32_t *stack = page != NULL ? realloc(gpu->event_free, stack_bytes) : NULL;
            if (stack == NULL) {
                free(page);
                return kvs_device_fail(dev, KVS_ENOMEM, ENOMEM,
                                       "gpu %u: out of host memory for %u more events",
                                       gpu->id, SIM_GPU_EVENT_PAGE);
            }
            gpu->event_free = stack;
            gpu->event_pages[i / SIM_GPU_EVENT_PAGE] = page;
        }
        ev = &gpu->event_pages[i / SIM_GPU_EVENT_PAGE][i % SIM_GPU_EVENT_PAGE];
        ev->gpu = gpu;
        ev->index = i;
        gpu->event_fresh++;
    }
    uint64_t now = sim_engine_now_ns(gpu->eng);
    ev->live = true;
    ev->stream = stream->index;
    ev->target_seq = stream->enq_seq;
    ev->done_ns = stream->busy_until_ns > now ? stream->busy_until_ns : now;
    *out = ev;
    return KVS_OK;
}

static int sim_gpu_event_query(kvs_device_t *dev, kvs_event_t *ev)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    if (ev == NULL || ev->gpu != gpu || !ev->live)
        return kvs_device_fail(dev, KVS_EINVAL, EINVAL,
                               "event_query on gpu %u: event is NULL, destroyed or of "
                               "another gpu",
                               gpu->id);
    return gpu->streams[ev->stream].done_seq >= ev->target_seq ? KVS_OK : KVS_EAGAIN;
}

static void sim_gpu_event_destroy(kvs_device_t *dev, kvs_event_t *ev)
{
    sim_gpu_t *gpu = sim_gpu_of(dev);
    if (ev == NULL)
        return;
    assert(ev->gpu == gpu && ev->live);
    ev->live = false;
    assert(gpu->event_free_count < gpu->event_fresh);
    gpu->event_free[gpu->event_free_count++] = ev->index;
}

/* ------------------------------------------------------------------------ */
/* The GPU                                                                   */
/* ------------------------------------------------------------------------ */

static const kvs_device_ops_t sim_gpu_ops = {
    .version = KVS_DEVICE_OPS_VERSION,
    .size = sizeof(kvs_device_ops_t),
    .name = "sim-gpu",
    .mem_alloc = sim_gpu_mem_alloc,
    .mem_free = sim_gpu_mem_free,
    .stream_create = sim_gpu_stream_create,
    .stream_destroy = sim_gpu_stream_destroy,
    .gather = sim_gpu_gather,
    .scatter = sim_gpu_scatter,
    .event_record = sim_gpu_event_record,
    .event_query = sim_gpu_event_query,
    .event_destroy = sim_gpu_event_destroy,
    .mem_write = sim_gpu_mem_write,
    .mem_read = sim_gpu_mem_read,
    .gather_parts = sim_gpu_gather_parts,
    .scatter_parts = sim_gpu_scatter_parts,
};

int sim_gpu_create(sim_engine_t *eng, const sim_gpu_config_t *cfg, uint32_t gpu_id,
                   sim_gpu_t **out)
{
    if (eng == NULL || out == NULL || gpu_id > SIM_GPU_MAX_ID)
        return KVS_EINVAL;
    sim_gpu_config_t c = cfg != NULL ? *cfg : (sim_gpu_config_t){0};
    sim_gpu_t *gpu = calloc(1, sizeof *gpu);
    if (gpu == NULL)
        return KVS_ENOMEM;
    gpu->eng = eng;
    gpu->id = gpu_id;
    gpu->hbm_bytes = c.hbm_bytes ? c.hbm_bytes : SIM_GPU_DEFAULT_HBM_BYTES;
    gpu->hbm_bytes_per_s = c.hbm_bytes_per_s ? c.hbm_bytes_per_s
                                             : SIM_GPU_DEFAULT_HBM_BYTES_PER_S;
    gpu->launch_ns = c.launch_ns ? c.launch_ns : SIM_GPU_DEFAULT_LAUNCH_NS;
    gpu->max_allocs = c.max_allocs ? c.max_allocs : SIM_GPU_DEFAULT_MAX_ALLOCS;
    gpu->max_streams = c.max_streams ? c.max_streams : SIM_GPU_DEFAULT_MAX_STREAMS;
    gpu->max_events = c.max_events ? c.max_events : SIM_GPU_DEFAULT_MAX_EVENTS;
    gpu->scatter_slowdown = 1;
    gpu->op_free = SIM_GPU_NONE;
    gpu->data_mode = c.data_mode == SIM_DATA_PROVENANCE ? SIM_DATA_PROVENANCE : SIM_DATA_BYTES;
    snprintf(gpu->name, sizeof gpu->name, "sim-gpu%u", gpu_id);
    snprintf(gpu->label, sizeof gpu->label, "gpu %u", gpu_id);

    int rc = KVS_ENOMEM;
    gpu->allocs = calloc(gpu->max_allocs, sizeof *gpu->allocs);
    if (gpu->allocs == NULL)
        goto fail_allocs;
    gpu->streams = calloc(gpu->max_streams, sizeof *gpu->streams);
    if (gpu->streams == NULL)
        goto fail_streams;
    gpu->event_pages = calloc(gpu->max_events / SIM_GPU_EVENT_PAGE + 1, sizeof *gpu->event_pages);
    if (gpu->event_pages == NULL)
        goto fail_events;
    if (gpu->data_mode == SIM_DATA_PROVENANCE &&
        (rc = sim_prov_map_create(&gpu->prov)) != KVS_OK)
        goto fail_prov;
    rc = kvs_device_init(&gpu->base, &sim_gpu_ops, gpu->name);
    if (rc != KVS_OK)
        goto fail_init;

    for (uint32_t i = 0; i < gpu->max_streams; i++) {
        gpu->streams[i].gpu = gpu;
        gpu->streams[i].index = i;
    }
    /* Events are set up when first handed out (sim_gpu_event_record). */
    *out = gpu;
    return KVS_OK;

fail_init:
    sim_prov_map_destroy(gpu->prov);
fail_prov:
    free(gpu->event_pages);
fail_events:
    free(gpu->streams);
fail_streams:
    free(gpu->allocs);
fail_allocs:
    free(gpu);
    return rc;
}

void sim_gpu_destroy(sim_gpu_t *gpu)
{
    if (gpu == NULL)
        return;
    /* Pending ops never complete: drop their engine events so none fires
     * into freed memory (the engine must still be alive). */
    for (uint32_t i = 0; i < gpu->ops_cap; i++) {
        if (gpu->ops[i].live) {
            int rc = sim_engine_cancel(gpu->eng, gpu->ops[i].engine_id);
            assert(rc == KVS_OK);
            (void)rc;
        }
        free(gpu->ops[i].words);
        free(gpu->ops[i].parts);
    }
    free(gpu->ops);
    for (uint32_t i = 0; i < gpu->num_allocs; i++)
        sim_gpu_release(&gpu->allocs[i]);
    free(gpu->allocs);
    free(gpu->event_free);
    for (uint32_t p = 0; p <= gpu->max_events / SIM_GPU_EVENT_PAGE; p++)
        free(gpu->event_pages[p]);
    free(gpu->event_pages);
    free(gpu->streams);
    sim_prov_map_destroy(gpu->prov);
    free(gpu->hook_parts);
    free(gpu->rowsrc);
    free(gpu->part_shapes);
    free(gpu->part_order);
    free(gpu->pruns);
    free(gpu);
}

kvs_device_t *sim_gpu_device(sim_gpu_t *gpu) { return gpu != NULL ? &gpu->base : NULL; }

sim_gpu_t *sim_gpu_from_device(kvs_device_t *dev)
{
    if (dev == NULL || dev->ops.mem_alloc != sim_gpu_mem_alloc)
        return NULL;
    return sim_gpu_of(dev);
}

void sim_gpu_set_span(sim_gpu_t *gpu, sim_span_fn fn, void *ctx)
{
    gpu->span = fn;
    gpu->span_ctx = ctx;
}

void sim_gpu_set_wake(sim_gpu_t *gpu, sim_gpu_wake_fn fn, void *ctx)
{
    gpu->wake = fn;
    gpu->wake_ctx = ctx;
}

uint32_t sim_gpu_id(const sim_gpu_t *gpu) { return gpu->id; }
uint64_t sim_gpu_used_bytes(const sim_gpu_t *gpu) { return gpu->used_bytes; }
uint64_t sim_gpu_copy_ns(const sim_gpu_t *gpu) { return gpu->copy_ns; }
uint64_t sim_gpu_copy_bytes(const sim_gpu_t *gpu) { return gpu->copy_bytes; }

void sim_gpu_set_scatter_slowdown(sim_gpu_t *gpu, uint32_t factor)
{
    gpu->scatter_slowdown = factor == 0 ? 1 : factor;
}

sim_data_mode_t sim_gpu_data_mode(const sim_gpu_t *gpu) { return gpu->data_mode; }
sim_prov_map_t *sim_gpu_prov(sim_gpu_t *gpu) { return gpu != NULL ? gpu->prov : NULL; }

int sim_gpu_move(sim_gpu_t *dst, uint64_t daddr, sim_gpu_t *src, uint64_t saddr,
                 uint64_t len_bytes)
{
    assert(dst->data_mode == src->data_mode);
    assert(sim_gpu_in_mem(dst, daddr, len_bytes) && sim_gpu_in_mem(src, saddr, len_bytes));
    if (len_bytes == 0)
        return KVS_OK;
    if (dst->prov != NULL)
        return sim_prov_copy(dst->prov, daddr, src->prov, saddr, len_bytes);
    memmove(sim_gpu_ptr(dst, daddr, len_bytes), sim_gpu_ptr(src, saddr, len_bytes),
            (size_t)len_bytes);
    return KVS_OK;
}

void sim_gpu_set_copy_hook(sim_gpu_t *gpu, sim_gpu_copy_hook_fn fn, void *ctx)
{
    if (fn != NULL && gpu->hook_parts == NULL) {
        gpu->hook_parts = calloc(KVS_COPY_PARTS_MAX, sizeof *gpu->hook_parts);
        if (gpu->hook_parts == NULL)
            fn = NULL; /* test-only: the run then shows no planted bug */
    }
    gpu->copy_hook = fn;
    gpu->copy_hook_ctx = ctx;
}
