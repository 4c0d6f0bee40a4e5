/*
 * gpu_check.c - the GPU check of the CUDA backend (run by
 * hw/cuda/gpu-check.sh on a machine with a GPU; not a ctest test).
 *
 * 1. Correctness: gather and scatter on the CUDA backend against the host
 *    backend, byte for byte on random data (tests/fixtures/kv_compare.c), for named
 *    shapes covering each vector width the kernels pick (16, 8, 4, 2 and 1
 *    bytes: rows and head offsets of 256, 200, 12, 66 and 3 bytes), for the
 *    fused copies the engine calls (gather_parts / scatter_parts: the CUDA
 *    backend's default, one kernel per part, against the host's one pass)
 *    and for random shapes (a third of them fused).
 * 2. Bandwidth: one Llama-3-70B-shaped chunk (80 layers, 8 KV heads, head
 *    dim 128, bf16, page 16, random pages) per TP pair, gather and scatter
 *    timed with CUDA events on the backend's stream against
 *    cudaMemcpyAsync device-to-device of the same payload on that stream;
 *    medians over repetitions. Bandwidth counts payload bytes (each op reads
 *    and writes them once):
 *      ratio = (2 P / (t_gather + t_scatter)) / (P / t_memcpy)
 *
 * Usage: gpu_check [tokens] [repetitions] [random shapes]  (4096 20 40)
 * Exit status: 0 all equal, 1 a difference or a failed call, 2 no GPU.
 */
#include <kvstage/cuda.h>
#include <kvstage/host.h>

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_compare.h"
#include "xorshift.h"

#define CHECK_CUDA(call)                                                       \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess) {                                               \
            fprintf(stderr, "gpu_check: %s failed: %s (%s)\n", #call,          \
                    cudaGetErrorName(e_), cudaGetErrorString(e_));             \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define CHECK_KVS(dev, call)                                                   \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != KVS_OK) {                                                   \
            fprintf(stderr, "gpu_check: %s failed: %s (%s)\n", #call,          \
                    kvs_status_name(rc_), (dev)->last_backend_msg);            \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static int wait_cuda(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    return kvs_cuda_event_wait(dev, ev);
}

static int wait_host(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    return kvs_host_event_wait(dev, ev);
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}


/* ---- bandwidth --------------------------------------------------------------- */

#define BW_LAYERS 80
#define BW_HEADS 8
#define BW_HEAD_DIM 128
#define BW_PAGE 16

typedef struct bw_pool {
    uint64_t k[BW_LAYERS], v[BW_LAYERS];
    int64_t *pages;
} bw_pool_t;

static void bw_pool_make(kvs_device_t *d, bw_pool_t *p, int64_t local_heads,
                         int64_t chunk_pages, uint64_t *rng)
{
    const int64_t pool_pages = 2 * chunk_pages;
    const uint64_t lb = (uint64_t)(pool_pages * BW_PAGE * local_heads * BW_HEAD_DIM * 2);
    for (int l = 0; l < BW_LAYERS; l++) {
        CHECK_KVS(d, d->ops.mem_alloc(d, lb, &p->k[l]));
        CHECK_KVS(d, d->ops.mem_alloc(d, lb, &p->v[l]));
        CHECK_CUDA(cudaMemset((void *)(uintptr_t)p->k[l], l, lb));
        CHECK_CUDA(cudaMemset((void *)(uintptr_t)p->v[l], l + 1, lb));
    }
    /* The memsets ran on the legacy stream, which the backend's
     * non-blocking streams do not wait for. */
    CHECK_CUDA(cudaDeviceSynchronize());
    p->pages = malloc((size_t)pool_pages * sizeof *p->pages);
    if (p->pages == NULL)
        exit(1);
    for (int64_t i = 0; i < pool_pages; i++)
        p->pages[i] = i;
    for (int64_t i = pool_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)(xorshift64(rng) % (uint64_t)(i + 1));
        int64_t t = p->pages[i];
        p->pages[i] = p->pages[j];
        p->pages[j] = t;
    }
}

static void bw_pool_free(kvs_device_t *d, bw_pool_t *p)
{
    for (int l = 0; l < BW_LAYERS; l++) {
        CHECK_KVS(d, d->ops.mem_free(d, p->k[l]));
        CHECK_KVS(d, d->ops.mem_free(d, p->v[l]));
    }
    free(p->pages);
}

static kvs_copy_desc_t bw_desc(const bw_pool_t *p, int64_t local_heads, int64_t tokens,
                               int64_t head_start, int64_t nh, uint64_t stg)
{
    return (kvs_copy_desc_t){
        .k_base = p->k, .v_base = p->v, .local_heads = local_heads,
        .head_dim = BW_HEAD_DIM, .elem_bytes = 2, .page_size = BW_PAGE, .pages = p->pages,
        .num_pages = (tokens + BW_PAGE - 1) / BW_PAGE, .tokens = tokens,
        .head_start = head_start, .num_heads = nh, .layer_begin = 0,
        .layer_count = BW_LAYERS, .staging_slot_begin = 0,
        .staging_layer_slots = BW_LAYERS, .staging_addr = stg};
}

/* Median milliseconds of `reps` runs of one op kind (0 memcpy, 1 gather,
 * 2 scatter), each bracketed by events on the stream. */
static float bw_time(kvs_device_t *d, kvs_stream_t *s, int kind, const kvs_copy_desc_t *desc,
                     uint64_t dst, uint64_t src, uint64_t bytes, int reps)
{
    cudaStream_t cs = (cudaStream_t)kvs_cuda_stream_handle(d, s);
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    float *ms = calloc((size_t)reps, sizeof *ms);
    if (ms == NULL)
        exit(1);
    for (int r = -3; r < reps; r++) {
        CHECK_CUDA(cudaEventRecord(a, cs));
        if (kind == 0)
            CHECK_CUDA(cudaMemcpyAsync((void *)(uintptr_t)dst, (const void *)(uintptr_t)src,
                                       bytes, cudaMemcpyDeviceToDevice, cs));
        else if (kind == 1)
            CHECK_KVS(d, d->ops.gather(d, s, desc));
        else
            CHECK_KVS(d, d->ops.scatter(d, s, desc));
        CHECK_CUDA(cudaEventRecord(b, cs));
        CHECK_CUDA(cudaEventSynchronize(b));
        if (r >= 0)
            CHECK_CUDA(cudaEventElapsedTime(&ms[r], a, b));
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp_float);
    const float med = ms[reps / 2];
    free(ms);
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
    return med;
}

int main(int argc, char **argv)
{
    const int64_t tokens = argc > 1 ? atoll(argv[1]) : 4096;
    const int reps = argc > 2 ? atoi(argv[2]) : 20;
    const int randoms = argc > 3 ? atoi(argv[3]) : 40;
    if (tokens <= 0 || reps <= 0 || randoms < 0) {
        fprintf(stderr, "usage: gpu_check [tokens > 0] [repetitions > 0] [random shapes]\n");
        return 2;
    }
    kvs_error_t err;
    kvs_cuda_device_t *c = NULL;
    if (kvs_cuda_device_create(NULL, &c, &err) != KVS_OK) {
        fprintf(stderr, "gpu_check: %s\n", err.msg);
        return 2;
    }
    kvs_host_device_t *h = NULL;
    if (kvs_host_device_create(NULL, &h, &err) != KVS_OK) {
        fprintf(stderr, "gpu_check: %s\n", err.msg);
        return 1;
    }
    kvs_device_t *cd = kvs_cuda_device(c), *hd = kvs_host_device(h);
    kvs_stream_t *cs = NULL, *hs = NULL;
    CHECK_KVS(cd, cd->ops.stream_create(cd, &cs));
    CHECK_KVS(hd, hd->ops.stream_create(hd, &hs));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    int rt = 0, drv = 0;
    CHECK_CUDA(cudaRuntimeGetVersion(&rt));
    CHECK_CUDA(cudaDriverGetVersion(&drv));
    printf("gpu_check: %s (sm_%d%d, %d SMs), CUDA runtime %d.%d, driver %d.%d\n", prop.name,
           prop.major, prop.minor, prop.multiProcessorCount, rt / 1000, rt % 1000 / 10,
           drv / 1000, drv % 1000 / 10);

    /* 1. correctness */
    const kvc_side_t gpu = {cd, cs, wait_cuda, NULL}, cpu = {hd, hs, wait_host, NULL};
    int bad = 0;
    char msg[256];
    printf("\n== correctness: cuda vs host backend, byte for byte\n");
    for (size_t i = 0; i < kvc_named_shape_count; i++) {
        const int r =
            kvc_compare(&gpu, &cpu, &kvc_named_shapes[i].sh, 0x600 + i, msg, sizeof msg);
        printf("%-44s %s%s%s\n", kvc_named_shapes[i].name, r == 0 ? "equal" : "DIFFERENT: ",
               r == 0 ? "" : msg, "");
        bad |= r != 0;
    }
    uint64_t rng = 0xC4EC;
    int rand_bad = 0;
    for (int i = 0; i < randoms; i++) {
        const uint64_t seed = xorshift64(&rng);
        uint64_t r = seed;
        const kvc_shape_t sh = kvc_random_shape(&r, 64);
        if (kvc_compare(&gpu, &cpu, &sh, seed, msg, sizeof msg) != 0) {
            printf("random shape seed %llu: DIFFERENT: %s\n", (unsigned long long)seed, msg);
            rand_bad++;
        }
    }
    printf("%-44s %d of %d equal\n", "random shapes", randoms - rand_bad, randoms);
    bad |= rand_bad != 0;

    /* 2. bandwidth */
    printf("\n== bandwidth: llama-3-70b chunk of %lld tokens (80 layers, 8 KV heads, "
           "head dim 128, bf16, page 16, random pages), median of %d\n",
           (long long)tokens, reps);
    printf("%-8s %9s %10s %9s %9s %9s %7s\n", "pair", "payload", "memcpy_d2d", "gather",
           "scatter", "g+s", "ratio");
    const int64_t pairs[][2] = {{8, 2}, {2, 8}, {4, 2}};
    const int64_t chunk_pages = (tokens + BW_PAGE - 1) / BW_PAGE;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const int64_t P = pairs[i][0], D = pairs[i][1];
        const int64_t src_heads = BW_HEADS / P, dst_heads = BW_HEADS / D;
        const int64_t nh = P > D ? src_heads : dst_heads;
        const int64_t src_start = P < D ? dst_heads % src_heads : 0;
        const int64_t dst_start = P > D ? src_heads % dst_heads : 0;
        bw_pool_t pre, dec;
        bw_pool_make(cd, &pre, src_heads, chunk_pages, &rng);
        bw_pool_make(cd, &dec, dst_heads, chunk_pages, &rng);
        const uint64_t payload = (uint64_t)(tokens * nh * BW_HEAD_DIM * 2) * BW_LAYERS * 2;
        uint64_t stg = 0, m_src = 0, m_dst = 0;
        CHECK_KVS(cd, cd->ops.mem_alloc(cd, payload, &stg));
        CHECK_KVS(cd, cd->ops.mem_alloc(cd, payload, &m_src));
        CHECK_KVS(cd, cd->ops.mem_alloc(cd, payload, &m_dst));
        const kvs_copy_desc_t g = bw_desc(&pre, src_heads, tokens, src_start, nh, stg);
        const kvs_copy_desc_t sc = bw_desc(&dec, dst_heads, tokens, dst_start, nh, stg);
        const float t_m = bw_time(cd, cs, 0, NULL, m_dst, m_src, payload, reps);
        const float t_g = bw_time(cd, cs, 1, &g, 0, 0, 0, reps);
        const float t_s = bw_time(cd, cs, 2, &sc, 0, 0, 0, reps);
        const double pb = (double)payload;
        const double bw_m = pb / (t_m * 1e-3) / 1e9, bw_g = pb / (t_g * 1e-3) / 1e9;
        const double bw_s = pb / (t_s * 1e-3) / 1e9;
        const double bw_gs = 2.0 * pb / ((t_g + t_s) * 1e-3) / 1e9;
        char name[16];
        snprintf(name, sizeof name, "P%lld->D%lld", (long long)P, (long long)D);
        printf("%-8s %5.0f MiB %10.0f %9.0f %9.0f %9.0f %6.2fx   GB/s\n", name,
               pb / (1 << 20), bw_m, bw_g, bw_s, bw_gs, bw_gs / bw_m);
        fflush(stdout);
        CHECK_KVS(cd, cd->ops.mem_free(cd, stg));
        CHECK_KVS(cd, cd->ops.mem_free(cd, m_src));
        CHECK_KVS(cd, cd->ops.mem_free(cd, m_dst));
        bw_pool_free(cd, &pre);
        bw_pool_free(cd, &dec);
    }
    cd->ops.stream_destroy(cd, cs);
    hd->ops.stream_destroy(hd, hs);
    kvs_host_device_destroy(h);
    kvs_cuda_device_destroy(c);
    printf("\ngpu_check: %s\n", bad ? "FAILED (differences above)" : "all results equal");
    return bad ? 1 : 0;
}
