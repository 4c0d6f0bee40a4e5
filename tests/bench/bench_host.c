/*
 * bench_host.c - benchmark (not a test) of the host device backend
 * (hw/host): gather + scatter of one Llama-3-70B-shaped chunk against
 * memcpy of the same bytes, side by side in one run.
 *
 * Shape: 80 layers, 8 KV heads, head dim 128, bf16, page 16; one chunk of
 * `tokens` tokens on pages picked at random from a pool of `pool_chunks`
 * times that many token slots per layer buffer (default 8: 4 MiB for one
 * head of 2048-token chunks). A serving engine's layer buffers hold far
 * more (tens of thousands of slots), which the host backend maps with
 * transparent huge pages from 2 MiB up; a pool of 2 chunks left one-head
 * buffers at 1 MiB, on 4 KiB pages, each random page a TLB miss.
 * For each TP pair, the two copies one chunk costs as the engine runs them
 * (spec §3-§4): the prefill rank gathers, in one fused op (gather_parts),
 * the heads of every decode rank it feeds into one staging block each
 * (P2->D8: four one-head blocks from its 4-head rows), and the decode rank
 * scatters, in one fused op (scatter_parts), every writer's block into its
 * paged pool (P8->D2: four one-head blocks into 4-head rows). memcpy copies
 * the same bytes (the gather's, then the scatter's) between two
 * allocations of the same device. Each repetition runs memcpy, the fused
 * ops, the same parts as one op each (the engine's plan before fused
 * copies) and the naive loop back to back (interleaved, so machine load
 * hits all alike); medians over the repetitions after one warm-up. Device
 * ops are timed through the API: enqueue, record an event, wait for it.
 *
 *   ratio = ((G + S) / (t_gather + t_scatter)) / ((G + S) / t_memcpy)
 *
 * with G and S the bytes the gather and the scatter move.
 *
 * With `threads` > 1 the device splits each op's layers between that many
 * threads (copy_threads) and memcpy is split into as many equal parts run
 * by as many threads at once, so both sides use the same cores.
 *
 * A probe follows the table: how fast one core reads 256 of every 1024
 * bytes against contiguously (the bound of strided rows, which fused ops
 * avoid).
 *
 * Usage: bench_host [tokens] [repetitions] [threads] [vector_bytes] [pool_chunks]
 *        (defaults 2048 11 1 0 8; vector_bytes: the device's max_vector_bytes;
 *        pool_chunks: token slots of each layer buffer, in chunks)
 * Wall time comes from CLOCK_MONOTONIC; hw/ and benchmarks may read it.
 */
#include <kvstage/host.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../fixtures/xorshift.h"

#define BENCH_LAYERS 80
#define BENCH_HEADS 8
#define BENCH_HEAD_DIM 128
#define BENCH_ELEM_BYTES 2
#define BENCH_PAGE 16

typedef struct bench_case {
    const char *name;
    int64_t prefill_tp, decode_tp;
} bench_case_t;

/* One side's KV pool: K and V buffers of every layer, and the page list. */
typedef struct bench_pool {
    int64_t local_heads;
    uint64_t k[BENCH_LAYERS], v[BENCH_LAYERS];
    uint64_t layer_bytes;
    int64_t *pages;
} bench_pool_t;

/* Wall time and the CPU time of the whole process (every thread: the
 * stream's worker copies while the caller sleeps in the event wait). */
typedef struct bench_time {
    double wall_s, cpu_s;
} bench_time_t;

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static bench_time_t now_t(void)
{
    return (bench_time_t){clock_s(CLOCK_MONOTONIC), clock_s(CLOCK_PROCESS_CPUTIME_ID)};
}

static bench_time_t since(bench_time_t t0)
{
    bench_time_t t = now_t();
    return (bench_time_t){t.wall_s - t0.wall_s, t.cpu_s - t0.cpu_s};
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(kvs_device_t *dev, const char *what, int rc)
{
    fprintf(stderr, "bench_host: %s failed: %s (%s)\n", what, kvs_status_name(rc),
            dev != NULL ? dev->last_backend_msg : "");
    exit(1);
}

static uint64_t alloc_filled(kvs_device_t *dev, uint64_t len, uint64_t *rng)
{
    uint64_t a = 0;
    int rc = dev->ops.mem_alloc(dev, len, &a);
    if (rc != KVS_OK)
        die(dev, "mem_alloc", rc);
    uint64_t *p = kvs_host_ptr(dev, a, len);
    for (uint64_t i = 0; i < len / 8; i++) /* also faults every page in */
        p[i] = xorshift64(rng);
    return a;
}

static void pool_make(kvs_device_t *dev, bench_pool_t *p, int64_t local_heads,
                      int64_t chunk_pages, int64_t pool_chunks, uint64_t *rng)
{
    memset(p, 0, sizeof *p);
    p->local_heads = local_heads;
    const int64_t pool_pages = pool_chunks * chunk_pages;
    p->layer_bytes = (uint64_t)(pool_pages * BENCH_PAGE * local_heads * BENCH_HEAD_DIM *
                                BENCH_ELEM_BYTES);
    for (int l = 0; l < BENCH_LAYERS; l++) {
        p->k[l] = alloc_filled(dev, p->layer_bytes, rng);
        p->v[l] = alloc_filled(dev, p->layer_bytes, rng);
    }
    /* A random choice of chunk_pages distinct pages, in random order. */
    int64_t *perm = malloc((size_t)pool_pages * sizeof *perm);
    if (perm == NULL)
        die(NULL, "malloc", KVS_ENOMEM);
    for (int64_t i = 0; i < pool_pages; i++)
        perm[i] = i;
    for (int64_t i = pool_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)(xorshift64(rng) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    p->pages = perm; /* the first chunk_pages entries are used */
}

static void pool_free(kvs_device_t *dev, bench_pool_t *p)
{
    for (int l = 0; l < BENCH_LAYERS; l++) {
        dev->ops.mem_free(dev, p->k[l]);
        dev->ops.mem_free(dev, p->v[l]);
    }
    free(p->pages);
}

static kvs_copy_desc_t desc_of(const bench_pool_t *p, int64_t tokens, int64_t head_start,
                               int64_t num_heads, uint64_t staging)
{
    return (kvs_copy_desc_t){
        .k_base = p->k,
        .v_base = p->v,
        .local_heads = p->local_heads,
        .head_dim = BENCH_HEAD_DIM,
        .elem_bytes = BENCH_ELEM_BYTES,
        .page_size = BENCH_PAGE,
        .pages = p->pages,
        .num_pages = (tokens + BENCH_PAGE - 1) / BENCH_PAGE,
        .tokens = tokens,
        .head_start = head_start,
        .num_heads = num_heads,
        .layer_begin = 0,
        .layer_count = BENCH_LAYERS,
        .staging_slot_begin = 0,
        .staging_layer_slots = BENCH_LAYERS,
        .staging_addr = staging,
    };
}

/* The obvious CPU copy, for comparison: one memcpy per token row, in
 * order, no prefetch, plain stores; on the calling thread. */
static void naive_copy(const kvs_copy_desc_t *d, int scatter)
{
    const uint64_t hb = (uint64_t)(d->head_dim * d->elem_bytes);
    const uint64_t row = hb * (uint64_t)d->num_heads, tb = hb * (uint64_t)d->local_heads;
    const uint64_t off = hb * (uint64_t)d->head_start, slot = row * (uint64_t)d->tokens;
    const uint64_t ps = (uint64_t)d->page_size;
    for (uint64_t kv = 0; kv < 2; kv++)
        for (int64_t j = 0; j < d->layer_count; j++) {
            const uint64_t base = kv == 0 ? d->k_base[d->layer_begin + j]
                                          : d->v_base[d->layer_begin + j];
            uint8_t *pool = (uint8_t *)(uintptr_t)base + off;
            uint8_t *blk = (uint8_t *)(uintptr_t)d->staging_addr +
                           (kv * (uint64_t)d->staging_layer_slots +
                            (uint64_t)(d->staging_slot_begin + j)) * slot;
            for (uint64_t i = 0; i < (uint64_t)d->tokens; i++) {
                uint8_t *kvp = pool + ((uint64_t)d->pages[i / ps] * ps + i % ps) * tb;
                if (scatter)
                    memcpy(kvp, blk + i * row, (size_t)row);
                else
                    memcpy(blk + i * row, kvp, (size_t)row);
            }
        }
}

/* Sums `rows` rows of row_bytes spaced stride bytes apart, prefetching 4 KiB
 * of rows ahead: the read side of a strided copy, with nothing written. */
static uint64_t read_rows(const uint8_t *p, uint64_t rows, uint64_t row_bytes,
                          uint64_t stride)
{
    uint64_t sum = 0;
    const uint64_t ahead = 4096 / row_bytes > 0 ? 4096 / row_bytes : 1;
    for (uint64_t r = 0; r < rows; r++) {
        if (r + ahead < rows)
            for (uint64_t o = 0; o < row_bytes; o += 64)
                __builtin_prefetch(p + (r + ahead) * stride + o, 0, 3);
        const uint64_t *w = (const uint64_t *)(const void *)(p + r * stride);
        for (uint64_t i = 0; i < row_bytes / 8; i++)
            sum += w[i];
    }
    return sum;
}

/* The memory system's side of the story: how fast one core reads the same
 * bytes contiguously and as 256-byte rows every 1024 bytes (the strided
 * side of P8->D2 and P2->D8). */
static void read_probe(kvs_device_t *dev, uint64_t bytes, int reps, uint64_t *rng)
{
    const uint64_t a = alloc_filled(dev, 4 * bytes, rng);
    const uint8_t *p = kvs_host_ptr(dev, a, 4 * bytes);
    double *tc = calloc((size_t)reps, sizeof *tc), *ts = calloc((size_t)reps, sizeof *ts);
    if (tc == NULL || ts == NULL)
        die(NULL, "calloc", KVS_ENOMEM);
    volatile uint64_t sink = 0;
    for (int r = -1; r < reps; r++) {
        bench_time_t t0 = now_t();
        sink += read_rows(p, bytes / 256, 256, 256);
        const double c = since(t0).wall_s;
        t0 = now_t();
        sink += read_rows(p, bytes / 256, 256, 1024);
        const double st = since(t0).wall_s;
        if (r >= 0) {
            tc[r] = c;
            ts[r] = st;
        }
    }
    (void)sink;
    qsort(tc, (size_t)reps, sizeof *tc, cmp_double);
    qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
    const double bc = (double)bytes / tc[reps / 2] / 1e9, bs = (double)bytes / ts[reps / 2] / 1e9;
    printf("read probe, %.0f MiB, one core: contiguous %.2f GB/s, 256 of every 1024 bytes "
           "%.2f GB/s (%.2fx)\n",
           (double)bytes / (1 << 20), bc, bs, bs / bc);
    free(tc);
    free(ts);
    dev->ops.mem_free(dev, a);
}

/* memcpy on n threads: n - 1 helpers wait at a barrier for each copy and
 * take an equal share; the caller takes share 0. */
typedef struct memcpy_team {
    int n;
    pthread_t *threads;
    pthread_barrier_t start, end;
    uint8_t *dst;
    const uint8_t *src;
    uint64_t bytes;
    int quit;
} memcpy_team_t;

typedef struct memcpy_member {
    memcpy_team_t *team;
    int index;
} memcpy_member_t;

static void team_share(memcpy_team_t *t, int i)
{
    const uint64_t lo = t->bytes * (uint64_t)i / (uint64_t)t->n;
    const uint64_t hi = t->bytes * (uint64_t)(i + 1) / (uint64_t)t->n;
    memcpy(t->dst + lo, t->src + lo, (size_t)(hi - lo));
}

static void *team_member(void *arg)
{
    memcpy_member_t *m = arg;
    for (;;) {
        pthread_barrier_wait(&m->team->start);
        if (m->team->quit)
            return NULL;
        team_share(m->team, m->index);
        pthread_barrier_wait(&m->team->end);
    }
}

static memcpy_member_t g_members[64];

static void team_start(memcpy_team_t *t, int n)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    t->threads = calloc((size_t)n, sizeof *t->threads);
    if (t->threads == NULL || n > 64 || pthread_barrier_init(&t->start, NULL, (unsigned)n) != 0 ||
        pthread_barrier_init(&t->end, NULL, (unsigned)n) != 0)
        die(NULL, "memcpy team", KVS_ENOMEM);
    for (int i = 1; i < n; i++) {
        g_members[i] = (memcpy_member_t){t, i};
        if (pthread_create(&t->threads[i], NULL, team_member, &g_members[i]) != 0)
            die(NULL, "pthread_create", KVS_EBACKEND);
    }
}

static bench_time_t team_memcpy(memcpy_team_t *t, void *dst, const void *src, uint64_t bytes)
{
    t->dst = dst;
    t->src = src;
    t->bytes = bytes;
    const bench_time_t t0 = now_t();
    if (t->n > 1)
        pthread_barrier_wait(&t->start);
    team_share(t, 0);
    if (t->n > 1)
        pthread_barrier_wait(&t->end);
    return since(t0);
}

static void team_stop(memcpy_team_t *t)
{
    if (t->n > 1) {
        t->quit = 1;
        pthread_barrier_wait(&t->start);
        for (int i = 1; i < t->n; i++)
            pthread_join(t->threads[i], NULL);
    }
    pthread_barrier_destroy(&t->start);
    pthread_barrier_destroy(&t->end);
    free(t->threads);
}

/* Waits for everything queued on s, through an event. */
static void wait_stream(kvs_device_t *dev, kvs_stream_t *s)
{
    kvs_event_t *ev = NULL;
    int rc = dev->ops.event_record(dev, s, &ev);
    if (rc != KVS_OK)
        die(dev, "event_record", rc);
    rc = kvs_host_event_wait(dev, ev);
    if (rc != KVS_OK)
        die(dev, "event_wait", rc);
    dev->ops.event_destroy(dev, ev);
}

/* One side of a TP pair: a pool, the copy parts of its op and their staging
 * blocks. */
typedef struct bench_side {
    bench_pool_t pool;
    kvs_copy_part_t parts[BENCH_HEADS];
    int nparts;
    uint64_t payload; /* bytes the side's op moves */
} bench_side_t;

/* Runs the side's op as the engine does (fused: one gather_parts or
 * scatter_parts of every part) or as one gather/scatter per part, through
 * the API, and waits for it. */
static bench_time_t timed_side(kvs_device_t *dev, kvs_stream_t *s, const bench_side_t *sd,
                               int64_t tokens, int scatter, int fused)
{
    const kvs_copy_desc_t d = desc_of(&sd->pool, tokens, 0, 1, 0);
    const bench_time_t t0 = now_t();
    int rc = KVS_OK;
    if (fused)
        rc = scatter ? dev->ops.scatter_parts(dev, s, &d, sd->parts, sd->nparts)
                     : dev->ops.gather_parts(dev, s, &d, sd->parts, sd->nparts);
    for (int k = 0; k < sd->nparts && !fused && rc == KVS_OK; k++) {
        const kvs_copy_desc_t one = desc_of(&sd->pool, tokens, sd->parts[k].head_start,
                                            sd->parts[k].num_heads, sd->parts[k].staging_addr);
        rc = scatter ? dev->ops.scatter(dev, s, &one) : dev->ops.gather(dev, s, &one);
    }
    if (rc != KVS_OK)
        die(dev, scatter ? "scatter" : "gather", rc);
    wait_stream(dev, s);
    return since(t0);
}

/* The naive loop over every part of both sides. */
static bench_time_t timed_naive(const bench_side_t *g, const bench_side_t *sc, int64_t tokens)
{
    const bench_time_t t0 = now_t();
    for (int k = 0; k < g->nparts; k++) {
        const kvs_copy_desc_t d = desc_of(&g->pool, tokens, g->parts[k].head_start,
                                          g->parts[k].num_heads, g->parts[k].staging_addr);
        naive_copy(&d, 0);
    }
    for (int k = 0; k < sc->nparts; k++) {
        const kvs_copy_desc_t d = desc_of(&sc->pool, tokens, sc->parts[k].head_start,
                                          sc->parts[k].num_heads, sc->parts[k].staging_addr);
        naive_copy(&d, 1);
    }
    return since(t0);
}

/* Sets up one side: a pool of local_heads heads and nparts parts of
 * part_heads heads each, side by side from head 0, each with its own
 * staging block. */
static void side_make(kvs_device_t *dev, bench_side_t *sd, int64_t local_heads, int nparts,
                      int64_t part_heads, int64_t tokens, int64_t pool_chunks, uint64_t *rng)
{
    memset(sd, 0, sizeof *sd);
    pool_make(dev, &sd->pool, local_heads, (tokens + BENCH_PAGE - 1) / BENCH_PAGE, pool_chunks,
              rng);
    const uint64_t blk = (uint64_t)(tokens * part_heads * BENCH_HEAD_DIM * BENCH_ELEM_BYTES) *
                         BENCH_LAYERS * 2;
    sd->nparts = nparts;
    for (int k = 0; k < nparts; k++)
        sd->parts[k] = (kvs_copy_part_t){.head_start = k * part_heads, .num_heads = part_heads,
                                         .staging_addr = alloc_filled(dev, blk, rng)};
    sd->payload = blk * (uint64_t)nparts;
}

static void side_free(kvs_device_t *dev, bench_side_t *sd)
{
    for (int k = 0; k < sd->nparts; k++)
        dev->ops.mem_free(dev, sd->parts[k].staging_addr);
    pool_free(dev, &sd->pool);
}

int main(int argc, char **argv)
{
    const int64_t tokens = argc > 1 ? atoll(argv[1]) : 2048;
    const int reps = argc > 2 ? atoi(argv[2]) : 11;
    const int threads = argc > 3 ? atoi(argv[3]) : 1;
    const int vector_bytes = argc > 4 ? atoi(argv[4]) : 0;
    const int64_t pool_chunks = argc > 5 ? atoll(argv[5]) : 8;
    if (tokens <= 0 || reps <= 0 || threads <= 0 || threads > 64 || pool_chunks < 1 ||
        pool_chunks > 64) {
        fprintf(stderr, "usage: bench_host [tokens > 0] [repetitions > 0] [threads 1..64] "
                        "[vector_bytes 0|16|32|64] [pool_chunks 1..64]\n");
        return 2;
    }
    const bench_case_t cases[] = {
        {"P8->D2", 8, 2}, /* the main job's pair: prefill rows whole, decode strided */
        {"P2->D8", 2, 8}, /* prefill rows strided (1 of 4 heads), decode whole */
        {"P4->D2", 4, 2}, /* decode strided, 2 of 4 heads */
    };
    kvs_host_device_t *host = NULL;
    kvs_error_t err;
    const kvs_host_config_t cfg = {.copy_threads = (uint32_t)threads,
                                   .max_vector_bytes = (uint32_t)vector_bytes};
    int rc = kvs_host_device_create(&cfg, &host, &err);
    if (rc != KVS_OK) {
        fprintf(stderr, "bench_host: %s\n", err.msg);
        return 1;
    }
    kvs_device_t *dev = kvs_host_device(host);
    kvs_stream_t *s = NULL;
    if ((rc = dev->ops.stream_create(dev, &s)) != KVS_OK)
        die(dev, "stream_create", rc);
    uint64_t rng = 0x9e3779b97f4a7c15ull;

    printf("llama-3-70b shape: %d layers x %d KV heads x head dim %d, bf16, page %d; "
           "chunk of %lld tokens on random pages of a pool of %lld chunks; median of %d runs "
           "after 1 warm-up; %d thread(s) for memcpy and for each op\n",
           BENCH_LAYERS, BENCH_HEADS, BENCH_HEAD_DIM, BENCH_PAGE, (long long)tokens,
           (long long)pool_chunks, reps, threads);
    printf("bandwidth in GB/s of wall time; cpu_ratio: the same ratio on process CPU time "
           "(robust to other load)\n");
    printf("each pair: the prefill rank's gather for every decode rank it feeds and the "
           "decode rank's scatter of every writer's block, as the engine runs them (one fused "
           "op per side: gather_parts / scatter_parts); memcpy: the same bytes (the gather's, "
           "then the scatter's)\n");
    printf("ratio: gather+scatter bandwidth / memcpy bandwidth (goal >= 0.90x); per-part: "
           "the same ops as one gather/scatter per part (the engine before fused copies); "
           "naive: one memcpy per token row and part, no prefetch, one thread\n");
    memcpy_team_t team;
    team_start(&team, threads);
    printf("%-8s %9s %8s %8s %8s %8s %7s %10s %9s %7s %7s\n", "pair", "payload", "memcpy",
           "gather", "scatter", "g+s", "ratio", "cpu_ratio", "per-part", "ratio", "naive");
    double worst = 1e9;
    /* t[clock][op][rep], clock 0 wall, 1 cpu; ops below */
    enum { T_MEM_G, T_MEM_S, T_GATHER, T_SCATTER, T_PART_G, T_PART_S, T_NAIVE, T_OPS };
    double *t[2][T_OPS];
    for (int k = 0; k < 2; k++)
        for (int o = 0; o < T_OPS; o++)
            if ((t[k][o] = calloc((size_t)reps, sizeof(double))) == NULL)
                die(NULL, "calloc", KVS_ENOMEM);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t P = cases[c].prefill_tp, D = cases[c].decode_tp;
        /* Heads per rank (spec §3; no replication: 8 heads, TP <= 8). A
         * prefill rank feeds D / P decode ranks (P < D), a decode rank
         * takes P / D writers' blocks (P > D). */
        const int64_t src_heads = BENCH_HEADS / P, dst_heads = BENCH_HEADS / D;
        bench_side_t pre, dec;
        if (P < D)
            side_make(dev, &pre, src_heads, (int)(D / P), dst_heads, tokens, pool_chunks, &rng);
        else
            side_make(dev, &pre, src_heads, 1, src_heads, tokens, pool_chunks, &rng);
        if (P > D)
            side_make(dev, &dec, dst_heads, (int)(P / D), src_heads, tokens, pool_chunks, &rng);
        else
            side_make(dev, &dec, dst_heads, 1, dst_heads, tokens, pool_chunks, &rng);
        const uint64_t most = pre.payload > dec.payload ? pre.payload : dec.payload;
        const uint64_t m_src = alloc_filled(dev, most, &rng);
        const uint64_t m_dst = alloc_filled(dev, most, &rng);
        void *ms = kvs_host_ptr(dev, m_src, most), *md = kvs_host_ptr(dev, m_dst, most);

        for (int r = -1; r < reps; r++) {
            const bench_time_t run[T_OPS] = {
                team_memcpy(&team, md, ms, pre.payload),
                team_memcpy(&team, md, ms, dec.payload),
                timed_side(dev, s, &pre, tokens, 0, 1),
                timed_side(dev, s, &dec, tokens, 1, 1),
                timed_side(dev, s, &pre, tokens, 0, 0),
                timed_side(dev, s, &dec, tokens, 1, 0),
                timed_naive(&pre, &dec, tokens)};
            for (int o = 0; r >= 0 && o < T_OPS; o++) {
                t[0][o][r] = run[o].wall_s;
                t[1][o][r] = run[o].cpu_s;
            }
        }
        /* Keep the copies observable so nothing is optimised away. */
        if (((volatile uint8_t *)md)[most / 2] != ((volatile uint8_t *)ms)[most / 2])
            die(NULL, "memcpy check", KVS_EBACKEND);
        double med[2][T_OPS];
        for (int k = 0; k < 2; k++)
            for (int o = 0; o < T_OPS; o++) {
                qsort(t[k][o], (size_t)reps, sizeof(double), cmp_double);
                med[k][o] = t[k][o][reps / 2];
            }
        const double both = (double)(pre.payload + dec.payload);
        const double bw_m = both / (med[0][T_MEM_G] + med[0][T_MEM_S]) / 1e9;
        const double bw_g = (double)pre.payload / med[0][T_GATHER] / 1e9;
        const double bw_s = (double)dec.payload / med[0][T_SCATTER] / 1e9;
        const double bw_gs = both / (med[0][T_GATHER] + med[0][T_SCATTER]) / 1e9;
        const double ratio = bw_gs / bw_m;
        const double cpu_ratio = (med[1][T_MEM_G] + med[1][T_MEM_S]) /
                                 (med[1][T_GATHER] + med[1][T_SCATTER]);
        const double bw_part = both / (med[0][T_PART_G] + med[0][T_PART_S]) / 1e9;
        const double bw_naive = both / med[0][T_NAIVE] / 1e9;
        if (ratio < worst)
            worst = ratio;
        printf("%-8s %5.1f MiB %8.2f %8.2f %8.2f %8.2f %6.2fx %9.2fx %9.2f %6.2fx %7.2f\n",
               cases[c].name, both / (1 << 20), bw_m, bw_g, bw_s, bw_gs, ratio, cpu_ratio,
               bw_part, bw_part / bw_m, bw_naive);
        fflush(stdout);
        dev->ops.mem_free(dev, m_src);
        dev->ops.mem_free(dev, m_dst);
        side_free(dev, &pre);
        side_free(dev, &dec);
    }
    printf("lowest ratio (gather+scatter / memcpy bandwidth): %.2fx (goal >= 0.90x)\n", worst);
    read_probe(dev, (uint64_t)tokens * 256 * BENCH_LAYERS * 2, reps, &rng);
    team_stop(&team);
    for (int k = 0; k < 2; k++)
        for (int o = 0; o < T_OPS; o++)
            free(t[k][o]);
    dev->ops.stream_destroy(dev, s);
    kvs_host_device_destroy(host);
    return 0;
}
