/*
 * bench_alloc.c - benchmark (not a test): does the core's hot path
 * allocate after warm-up? Runs one simulated scenario with N and with 2N
 * requests (same seed, same shape) and counts the heap calls of the core
 * only: this program links a second copy of the core (each .c file of
 * src/) whose malloc, calloc, realloc and free are the counters below
 * (alloc_count.h, forced in by CMake), with the simulator's objects; the
 * simulator's and libc's own calls are not counted. What the core
 * allocates per request in a steady state is
 *
 *     (allocs(2N) - allocs(N)) / N,
 *
 * set-up, warm-up and tear-down cancelling out; the goal is 0 for
 * requests of one size. The cases: the staging, direct and slice paths
 * with 512-token requests, and staging with 256..1536 tokens, where the
 * best-fit cache may still miss now and then. Every call site whose count
 * differs between the two runs is listed (file:line, calls and bytes per
 * extra request). The handlers' block caches (src/blocks.h) give their
 * hits and misses as they are finalised: the link wraps kvs__blocks_fini
 * (-Wl,--wrap) to read them.
 *
 * Exits 1 only when a run fails (kvs_sim_run refuses, a request fails, the
 * simulator finds a violation): the counts are reported, never judged.
 * Single-threaded, like the simulator: the counters are plain.
 *
 * Usage: bench_alloc [N (requests, default 64)]
 */
#define KVS_BENCH_ALLOC_IMPL
#include "alloc_count.h"

#include "blocks.h"

#include <kvstage/sim.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BENCH_SITES_MAX = 512 };

/* The heap calls of one call site of the core. */
typedef struct bench_site {
    const char *file;           /* __FILE__ of the call: a literal, kept */
    int line;
    uint64_t allocs;            /* malloc, calloc, realloc calls */
    uint64_t bytes;             /* bytes they asked for */
    uint64_t frees;             /* free of a non-NULL pointer */
} bench_site_t;

/* Every call site seen so far, in order of first call; the last slot
 * takes whatever does not fit (file NULL). */
static bench_site_t g_sites[BENCH_SITES_MAX];
static uint32_t g_nsites;

/* Block caches finalised so far and their counters. */
static uint64_t g_caches, g_block_hits, g_block_misses;

static bench_site_t *bench_site(const char *file, int line)
{
    for (uint32_t i = 0; i < g_nsites; i++)
        if (g_sites[i].line == line && g_sites[i].file != NULL &&
            (g_sites[i].file == file || strcmp(g_sites[i].file, file) == 0))
            return &g_sites[i];
    if (g_nsites == BENCH_SITES_MAX - 1) {
        g_sites[g_nsites].file = NULL;
        return &g_sites[g_nsites];
    }
    g_sites[g_nsites].file = file;
    g_sites[g_nsites].line = line;
    return &g_sites[g_nsites++];
}

static void bench_note_alloc(const char *file, int line, size_t bytes)
{
    bench_site_t *s = bench_site(file, line);
    s->allocs++;
    s->bytes += bytes;
}

void *kvs_bench_malloc(size_t bytes, const char *file, int line)
{
    bench_note_alloc(file, line, bytes);
    return malloc(bytes);
}

void *kvs_bench_calloc(size_t n, size_t size, const char *file, int line)
{
    bench_note_alloc(file, line, size != 0 && n > SIZE_MAX / size ? SIZE_MAX : n * size);
    return calloc(n, size);
}

void *kvs_bench_realloc(void *p, size_t bytes, const char *file, int line)
{
    bench_note_alloc(file, line, bytes);
    return realloc(p, bytes);
}

void kvs_bench_free(void *p, const char *file, int line)
{
    if (p != NULL)
        bench_site(file, line)->frees++;
    free(p);
}

/* The link's --wrap=kvs__blocks_fini sends the core's calls here. */
void __real_kvs__blocks_fini(kvs__blocks_t *c);
void __wrap_kvs__blocks_fini(kvs__blocks_t *c);

void __wrap_kvs__blocks_fini(kvs__blocks_t *c)
{
    g_caches++;
    g_block_hits += c->hits;
    g_block_misses += c->misses;
    __real_kvs__blocks_fini(c);
}

/* What one run did to the heap, in total and per site (indices of
 * g_sites; sites first seen later count 0 here). */
typedef struct bench_run {
    uint32_t requests;
    uint64_t allocs, bytes, frees;
    uint64_t caches, block_hits, block_misses;
    uint64_t digest, events;
    uint32_t nsites;
    bench_site_t sites[BENCH_SITES_MAX];
} bench_run_t;

/* One simulated cluster the benchmark runs. */
typedef struct bench_case {
    const char *name;           /* path and prompt lengths, for the tables */
    int64_t prefill_tp, decode_tp;
    kvs_path_t path;
    int64_t tokens_min, tokens_max; /* prompt lengths, uniform */
} bench_case_t;

/* An 8-head, 64-dim, 4-layer bf16 model in chunks of 256 tokens, every
 * request arriving at t = 0, at most 4 in flight per instance: small, so
 * a run is quick, and steady. */
#define BENCH_SEED UINT64_C(1)

static void bench_config(const bench_case_t *bc, uint32_t requests, kvs_sim_config_t *c)
{
    kvs_sim_config_init(c);
    c->total_heads = 8;
    c->head_dim = 64;
    c->layers = 4;
    c->page_size = 16;
    c->chunk_tokens = 256;
    c->prefill_tp = bc->prefill_tp;
    c->decode_tp = bc->decode_tp;
    c->path = (int32_t)bc->path;
    c->requests = requests;
    c->max_inflight = 4;
    c->prompt_min_tokens = bc->tokens_min;
    c->prompt_max_tokens = bc->tokens_max;
    c->ring_bytes = UINT64_C(64) << 20;
    c->gpu_hbm_bytes = UINT64_C(1) << 30;
    c->seed = BENCH_SEED;
}

/* Runs bc with `requests` requests into *out. KVS_OK, or 1 after saying
 * why the run failed. */
static int bench_run(const bench_case_t *bc, uint32_t requests, bench_run_t *out)
{
    static bench_site_t before[BENCH_SITES_MAX];
    const uint32_t nbefore = g_nsites;
    memcpy(before, g_sites, sizeof before);
    const uint64_t caches0 = g_caches, hits0 = g_block_hits, misses0 = g_block_misses;

    kvs_sim_config_t c;
    bench_config(bc, requests, &c);
    kvs_sim_report_t r;
    memset(&r, 0, sizeof r);
    r.size_bytes = (uint32_t)sizeof r;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    const int rc = kvs_sim_run(&c, &r, &err);
    if (rc != KVS_OK) {
        fprintf(stderr, "bench_alloc: %s, %u requests: kvs_sim_run: %s: %s\n", bc->name,
                requests, kvs_status_name(rc), err.msg);
        return 1;
    }
    if (r.requests_ok != requests || r.violations != 0) {
        fprintf(stderr,
                "bench_alloc: %s, %u requests: %u ok, %u failed, %" PRIu64
                " violations (seed %" PRIu64 ")\n",
                bc->name, requests, r.requests_ok, r.requests_failed, r.violations,
                (uint64_t)BENCH_SEED);
        return 1;
    }

    memset(out, 0, sizeof *out);
    out->requests = requests;
    out->nsites = g_nsites;
    for (uint32_t i = 0; i < g_nsites; i++) {
        bench_site_t *s = &out->sites[i];
        *s = g_sites[i];
        if (i < nbefore) {
            s->allocs -= before[i].allocs;
            s->bytes -= before[i].bytes;
            s->frees -= before[i].frees;
        }
        out->allocs += s->allocs;
        out->bytes += s->bytes;
        out->frees += s->frees;
    }
    out->caches = g_caches - caches0;
    out->block_hits = g_block_hits - hits0;
    out->block_misses = g_block_misses - misses0;
    out->digest = r.digest;
    out->events = r.events;
    return KVS_OK;
}

/* The core's source path from __FILE__: from its last "src/" on. */
static const char *bench_short(const char *file)
{
    const char *s = file, *p;
    while ((p = strstr(s, "src/")) != NULL && p[4] != '\0')
        s = p + 4;
    return s == file ? file : s - 4;
}

/* "src/file.c:line" of a site into buf. */
static const char *bench_site_name(const bench_site_t *s, char *buf, size_t bytes)
{
    if (s->file == NULL)
        snprintf(buf, bytes, "(other sites)");
    else
        snprintf(buf, bytes, "%s:%d", bench_short(s->file), s->line);
    return buf;
}

static void bench_print_run(const bench_case_t *bc, const bench_run_t *r)
{
    printf("%-16s %3lld->%-3lld %8u %10" PRIu64 " %12" PRIu64 " %10" PRIu64 " %10" PRId64
           " %7" PRIu64 " %10" PRIu64 " %10" PRIu64 "  %016" PRIx64 "\n",
           bc->name, (long long)bc->prefill_tp, (long long)bc->decode_tp, r->requests,
           r->allocs, r->bytes, r->frees, (int64_t)(r->allocs - r->frees), r->caches,
           r->block_hits, r->block_misses, r->digest);
}

/* Per extra request: (b - a) / (b.requests - a.requests), signed. */
static double bench_per(uint64_t a, uint64_t b, uint32_t extra)
{
    return ((double)b - (double)a) / (double)extra;
}

/* Lists the sites whose calls differ between runs a and b; returns how
 * many of them allocate more in b. */
static uint32_t bench_print_sites(const bench_case_t *bc, const bench_run_t *a,
                                  const bench_run_t *b)
{
    const uint32_t extra = b->requests - a->requests;
    uint32_t listed = 0, allocating = 0;
    char name[256];
    for (uint32_t i = 0; i < b->nsites; i++) {
        const bench_site_t *sb = &b->sites[i];
        const bench_site_t zero = {0};
        const bench_site_t *sa = i < a->nsites ? &a->sites[i] : &zero;
        if (sa->allocs == sb->allocs && sa->frees == sb->frees)
            continue;
        if (listed++ == 0)
            printf("\n%s: call sites whose calls grow with the requests (per extra request)\n",
                   bc->name);
        if (sb->allocs > sa->allocs)
            allocating++;
        printf("  %-26s %+9.3f allocs %+10.1f bytes %+9.3f frees   (allocs %" PRIu64
               " at N, %" PRIu64 " at 2N)\n",
               bench_site_name(sb, name, sizeof name), bench_per(sa->allocs, sb->allocs, extra),
               bench_per(sa->bytes, sb->bytes, extra), bench_per(sa->frees, sb->frees, extra),
               sa->allocs, sb->allocs);
    }
    return allocating;
}

int main(int argc, char **argv)
{
    uint32_t n = 64;
    if (argc > 1) {
        char *end = NULL;
        unsigned long v = strtoul(argv[1], &end, 10);
        if (end == argv[1] || *end != '\0' || v == 0 || v > 100000) {
            fprintf(stderr, "usage: bench_alloc [N (requests, 1..100000, default 64)]\n");
            return 2;
        }
        n = (uint32_t)v;
    }
    static const bench_case_t cases[] = {
        {"staging/512", 4, 2, KVS_PATH_STAGING, 512, 512},
        {"direct/512", 2, 2, KVS_PATH_DIRECT, 512, 512},
        {"slice/512", 4, 2, KVS_PATH_SLICE, 512, 512},
        /* not of one size: does best fit settle when the sizes vary? */
        {"staging/256-1536", 4, 2, KVS_PATH_STAGING, 256, 1536},
    };
    enum { NCASES = sizeof cases / sizeof cases[0] };
    static bench_run_t runs[NCASES][2];

    printf("bench_alloc: heap calls of the core (src/) only; the simulator's are not counted\n");
    printf("scenario: 8 KV heads x head dim 64 x 4 layers, bf16, page 16, chunk 256 tokens;\n"
           "  case = path/prompt tokens (uniform), all at t=0, 4 in flight; seed %" PRIu64 "\n",
           (uint64_t)BENCH_SEED);
    printf("%-16s %-8s %8s %10s %12s %10s %10s %7s %10s %10s  %-16s\n", "case", "P->D",
           "requests", "allocs", "bytes", "frees", "live_after", "caches", "blk_hits",
           "blk_misses", "digest");
    for (int k = 0; k < NCASES; k++)
        for (int j = 0; j < 2; j++) {
            if (bench_run(&cases[k], j == 0 ? n : 2 * n, &runs[k][j]) != KVS_OK)
                return 1;
            bench_print_run(&cases[k], &runs[k][j]);
        }

    printf("\nper extra request, (run(2N) - run(N)) / N with N = %u:\n", n);
    printf("%-16s %12s %14s %12s %14s %16s\n", "case", "allocs/req", "bytes/req", "frees/req",
           "blk_hits/req", "blk_misses/req");
    for (int k = 0; k < NCASES; k++) {
        const bench_run_t *a = &runs[k][0], *b = &runs[k][1];
        printf("%-16s %12.3f %14.1f %12.3f %14.3f %16.3f\n", cases[k].name,
               bench_per(a->allocs, b->allocs, n), bench_per(a->bytes, b->bytes, n),
               bench_per(a->frees, b->frees, n), bench_per(a->block_hits, b->block_hits, n),
               bench_per(a->block_misses, b->block_misses, n));
    }
    uint32_t growing = 0;
    for (int k = 0; k < NCASES; k++)
        growing += bench_print_sites(&cases[k], &runs[k][0], &runs[k][1]);
    if (growing == 0)
        printf("\nno call site of the core allocates per request after warm-up\n");
    else
        printf("\n%u call sites (counted once per case) allocate per request\n", growing);
    return 0;
}
