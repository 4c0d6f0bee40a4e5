/*
 * test_cuda_kernels.c - the CUDA gather/scatter kernels' address arithmetic
 * against the host backend, byte for byte, on a machine without a GPU.
 *
 * kernels_emu.cu compiles hw/cuda/copy_thread.cuh (what every kernel
 * thread runs, and the launch's grid and index width) with nvcc as host
 * code and runs it for every block and thread of the grid on host memory.
 * Here it is a device backend, "cuda-emu": memory, streams and events are
 * a host backend's (device address = host address); gather and scatter
 * check the descriptor and prepare the launch as hw/cuda/cuda.c does
 * (kvs_copy_desc_check, then hw/cuda/copy_args.c for the words, arguments
 * and vector width) and run the emulated grid; fused copies take the
 * core's default, one launch per part, as on the CUDA backend. It is
 * compared with the host backend (tests/fixtures/kv_compare.c: whole staging blocks
 * after gather, whole layer buffers after scatter) on
 *   - gpu_check's named shapes, which take every vector width (16, 8, 4, 2
 *     and 1 bytes), also with every device address shifted off alignment;
 *   - random shapes and page lists, half of them fused, as launched;
 *   - the same random shapes on grids cut to 1-3 blocks along x (every
 *     thread strides), with the other index width, with shifted addresses;
 * and every launch's threads must write each destination vector exactly
 * once (recorded by a second run of the same grid), which is what lets the
 * CPU run the threads in any order, and the GPU too. The launch geometry
 * is checked at sizes too large to allocate (the grid x clamp, the switch
 * to 64-bit indices), and copy_args.c on its own.
 *
 * What it does not check (only a GPU does: hw/cuda/gpu-check.sh): the
 * device compilation of the same code, real concurrency, CUDA memory,
 * streams and events, launch limits, and speed. See docs/cuda.md.
 *
 * A failure prints the shape's seed; CUDA_KERNELS_SEED=<seed> makes the
 * random tests run that shape alone, in every variant.
 */
#include <kvstage/host.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "copy_args.h"
#include "kernels_emu.h"
#include "kv_compare.h"
#include "xorshift.h"

/* ---- the emulated CUDA device --------------------------------------------- */

typedef struct emu_device {
    kvs_device_t base; /* first: recovered with KVS_CONTAINER_OF */
    kvs_host_device_t *host;
    kvs_device_t *inner; /* the host backend: memory, streams, events */
    emu_launch_t how;
    uint64_t addr_shift;  /* device addresses lie this far past the host's */
    unsigned widths_seen; /* bit v set when a launch of v-byte vectors ran */
    uint64_t launches;
} emu_device_t;

static emu_device_t *emu_of(kvs_device_t *dev)
{
    return KVS_CONTAINER_OF(dev, emu_device_t, base);
}

/* The inner device's failure, recorded on the emulated one. */
static int emu_pass(emu_device_t *e, int rc)
{
    if (rc != KVS_OK)
        return kvs_device_fail(&e->base, rc, e->inner->last_backend_code, "%s",
                               e->inner->last_backend_msg);
    return rc;
}

static int emu_mem_alloc(kvs_device_t *dev, uint64_t len_bytes, uint64_t *out_addr)
{
    emu_device_t *e = emu_of(dev);
    uint64_t a = 0;
    int rc = emu_pass(e, e->inner->ops.mem_alloc(e->inner, len_bytes + e->addr_shift, &a));
    if (rc == KVS_OK)
        *out_addr = a + e->addr_shift;
    return rc;
}

static int emu_mem_free(kvs_device_t *dev, uint64_t addr)
{
    emu_device_t *e = emu_of(dev);
    return emu_pass(e, e->inner->ops.mem_free(e->inner, addr - e->addr_shift));
}

static int emu_mem_write(kvs_device_t *dev, uint64_t addr, const void *src, uint64_t len)
{
    emu_device_t *e = emu_of(dev);
    return emu_pass(e, e->inner->ops.mem_write(e->inner, addr, src, len));
}

static int emu_mem_read(kvs_device_t *dev, uint64_t addr, void *dst, uint64_t len)
{
    emu_device_t *e = emu_of(dev);
    return emu_pass(e, e->inner->ops.mem_read(e->inner, addr, dst, len));
}

static int emu_stream_create(kvs_device_t *dev, kvs_stream_t **out)
{
    emu_device_t *e = emu_of(dev);
    return emu_pass(e, e->inner->ops.stream_create(e->inner, out));
}

static void emu_stream_destroy(kvs_device_t *dev, kvs_stream_t *s)
{
    emu_device_t *e = emu_of(dev);
    e->inner->ops.stream_destroy(e->inner, s);
}

static int emu_event_record(kvs_device_t *dev, kvs_stream_t *s, kvs_event_t **out)
{
    emu_device_t *e = emu_of(dev);
    return emu_pass(e, e->inner->ops.event_record(e->inner, s, out));
}

static int emu_event_query(kvs_device_t *dev, kvs_event_t *ev)
{
    emu_device_t *e = emu_of(dev);
    return emu_pass(e, e->inner->ops.event_query(e->inner, ev));
}

static void emu_event_destroy(kvs_device_t *dev, kvs_event_t *ev)
{
    emu_device_t *e = emu_of(dev);
    e->inner->ops.event_destroy(e->inner, ev);
}

static bool emu_holds(void *ctx, uint64_t addr, uint64_t len_bytes)
{
    emu_device_t *e = ctx;
    return kvs_host_ptr(e->inner, addr, len_bytes) != NULL;
}

/* One emulated launch of a (the KV rows, or with scales their scale rows,
 * `rows` naming which), checked: the grid covers every layer and K and V
 * of the copy, and its threads write each vector of the destination
 * exactly once (else a GPU's threads race, whatever bytes the CPU's order
 * left). */
static int emu_launch(emu_device_t *e, const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                      const hw_cuda_copy_args_t *a, unsigned vec, const char *what,
                      const char *rows)
{
    kvs_device_t *dev = &e->base;
    emu_result_t res;
    const int rc = emu_copy_run(a, vec, &e->how, &res);
    if (rc != 0)
        return kvs_device_fail(dev, KVS_EBACKEND, rc,
                               "%s on %s (%s): the emulated launch of %u-byte vectors "
                               "returned cudaError_t %d; the kernels take 16, 8, 4, 2 or 1",
                               what, dev->name, rows, vec, rc);
    const uint64_t want =
        (uint64_t)d->tokens * (a->row_bytes / vec) * (uint64_t)d->layer_count * sh->planes;
    if (res.grid.y != (uint32_t)d->layer_count || res.grid.z != sh->planes || res.grid.x < 1 ||
        res.grid.x > HW_CUDA_MAX_GRID_X || res.moves != want || res.moves_distinct != want)
        return kvs_device_fail(dev, KVS_EBACKEND, 0,
                               "%s on %s (%s): grid (%u, %u, %u) of %u-byte vectors made "
                               "%llu moves to %llu distinct vectors; %llu vectors, each "
                               "written once, by a grid (1..%u, %lld, %llu): fix "
                               "copy_thread.cuh",
                               what, dev->name, rows, res.grid.x, res.grid.y, res.grid.z, vec,
                               (unsigned long long)res.moves,
                               (unsigned long long)res.moves_distinct,
                               (unsigned long long)want, HW_CUDA_MAX_GRID_X,
                               (long long)d->layer_count, (unsigned long long)sh->planes);
    e->widths_seen |= vec;
    e->launches++;
    return KVS_OK;
}

/* hw_cuda_enqueue of cuda.c, with the emulated grid for the launches (the
 * KV rows, then with scale planes their scale rows): runs before it
 * returns, after what the stream already holds. */
static int emu_copy(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                    bool scatter)
{
    emu_device_t *e = emu_of(dev);
    const char *what = scatter ? "scatter" : "gather";
    char msg[KVS_ERROR_MSG_BYTES];
    kvs_copy_shape_t sh;
    int rc = kvs_copy_desc_check(d, what, dev->name, emu_holds, e, &sh, msg, sizeof msg);
    if (rc != KVS_OK)
        return kvs_device_fail(dev, rc, 0, "%s", msg);
    if (sh.payload_bytes == 0)
        return KVS_OK;
    assert_true((uint64_t)d->layer_count <= HW_CUDA_MAX_LAYERS);
    rc = emu_pass(e, kvs_host_stream_sync(e->inner, s));
    if (rc != KVS_OK)
        return rc;
    /* Exactly the words the kernels may read: ASan sees an overrun here. */
    const size_t n_words = hw_cuda_copy_words(d, &sh);
    uint64_t *words = malloc(n_words * sizeof *words);
    assert_non_null(words);
    hw_cuda_copy_words_fill(d, &sh, words);
    const hw_cuda_copy_args_t a = hw_cuda_copy_args_of(d, &sh, words, scatter);
    rc = emu_launch(e, d, &sh, &a, hw_cuda_copy_vec_bytes(d, &sh), what, "KV rows");
    if (rc == KVS_OK && sh.scale_row_bytes > 0) {
        const hw_cuda_copy_args_t sa = hw_cuda_copy_scale_args_of(d, &sh, words, scatter);
        rc = emu_launch(e, d, &sh, &sa, hw_cuda_copy_scale_vec_bytes(d, &sh), what,
                        "scale rows");
    }
    free(words);
    return rc;
}

static int emu_gather(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d)
{
    return emu_copy(dev, s, d, false);
}

static int emu_scatter(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d)
{
    return emu_copy(dev, s, d, true);
}

/* No gather_parts / scatter_parts: the core's default, as for "cuda". */
static const kvs_device_ops_t emu_ops = {
    .version = KVS_DEVICE_OPS_VERSION,
    .size = sizeof(kvs_device_ops_t),
    .name = "cuda-emu",
    .mem_alloc = emu_mem_alloc,
    .mem_free = emu_mem_free,
    .stream_create = emu_stream_create,
    .stream_destroy = emu_stream_destroy,
    .gather = emu_gather,
    .scatter = emu_scatter,
    .event_record = emu_event_record,
    .event_query = emu_event_query,
    .event_destroy = emu_event_destroy,
    .mem_write = emu_mem_write,
    .mem_read = emu_mem_read,
};

static void emu_open(emu_device_t *e)
{
    memset(e, 0, sizeof *e);
    kvs_error_t err;
    if (kvs_host_device_create(NULL, &e->host, &err) != KVS_OK)
        fail_msg("kvs_host_device_create: %s", err.msg);
    e->inner = kvs_host_device(e->host);
    assert_int_equal(kvs_device_init(&e->base, &emu_ops, "cuda-emu"), KVS_OK);
}

static void emu_close(emu_device_t *e) { kvs_host_device_destroy(e->host); }

/* ---- the two sides ----------------------------------------------------------- */

typedef struct fx {
    emu_device_t emu;
    kvs_host_device_t *host;
    kvs_stream_t *emu_s, *host_s;
    kvc_side_t a, b;
} fx_t;

static int wait_emu(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    emu_device_t *e = ctx;
    return kvs_host_event_wait(e->inner, ev);
}

static int wait_host(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    return kvs_host_event_wait(dev, ev);
}

static fx_t *fx_open(void)
{
    fx_t *f = calloc(1, sizeof *f);
    assert_non_null(f);
    emu_open(&f->emu);
    kvs_error_t err;
    if (kvs_host_device_create(NULL, &f->host, &err) != KVS_OK)
        fail_msg("kvs_host_device_create: %s", err.msg);
    kvs_device_t *ed = &f->emu.base, *hd = kvs_host_device(f->host);
    assert_int_equal(ed->ops.stream_create(ed, &f->emu_s), KVS_OK);
    assert_int_equal(hd->ops.stream_create(hd, &f->host_s), KVS_OK);
    f->a = (kvc_side_t){ed, f->emu_s, wait_emu, &f->emu};
    f->b = (kvc_side_t){hd, f->host_s, wait_host, NULL};
    return f;
}

static void fx_close(fx_t *f)
{
    f->emu.base.ops.stream_destroy(&f->emu.base, f->emu_s);
    kvs_host_device(f->host)->ops.stream_destroy(kvs_host_device(f->host), f->host_s);
    emu_close(&f->emu);
    kvs_host_device_destroy(f->host);
    free(f);
}

/* One launch variant: the emulated grid's deviation and the address shift. */
typedef struct variant {
    const char *name;
    emu_launch_t how;
    uint64_t addr_shift;
} variant_t;

/* The emulated CUDA device against the host backend on sh; fails naming
 * the case, the variant and the seed. */
static void compare(fx_t *f, const kvc_shape_t *sh, const variant_t *v, uint64_t seed,
                    const char *label)
{
    f->emu.how = v->how;
    f->emu.addr_shift = v->addr_shift;
    char msg[512];
    if (kvc_compare(&f->a, &f->b, sh, seed, msg, sizeof msg) != 0)
        fail_msg("%s (%s), seed %llu (CUDA_KERNELS_SEED=%llu replays a random one): "
                 "cuda-emu vs host: %s",
                 label, v->name, (unsigned long long)seed, (unsigned long long)seed, msg);
}

/* ---- named shapes (kvc_named_shapes, tests/fixtures/kv_compare.c) ------------------------ */

static const variant_t k_as_launched = {"as launched", {0, 0}, 0};

static void test_cuda_kernels_named_shapes_take_every_width(void **state)
{
    fx_t *f = fx_open();
    for (size_t i = 0; i < kvc_named_shape_count; i++)
        compare(f, &kvc_named_shapes[i].sh, &k_as_launched, 0x600 + i,
                kvc_named_shapes[i].name);
    /* Every vector type the kernels are instantiated for ran. */
    if (f->emu.widths_seen != (16 | 8 | 4 | 2 | 1))
        fail_msg("the named shapes launched vector widths 0x%x, not all of 16, 8, 4, 2 "
                 "and 1 bytes: change a shape so each width is taken",
                 f->emu.widths_seen);
    fx_close(f);
}

static void test_cuda_kernels_named_shapes_on_unaligned_addresses(void **state)
{
    /* Every pool and staging address off 16-byte alignment by the shift:
     * the vector width follows the addresses, not only the sizes. */
    static const variant_t shifts[] = {
        {"addresses 8 bytes off", {0, 0}, 8},
        {"addresses 4 bytes off", {0, 0}, 4},
        {"addresses 2 bytes off", {0, 0}, 2},
        {"addresses 1 byte off", {0, 0}, 1},
    };
    fx_t *f = fx_open();
    for (size_t v = 0; v < sizeof shifts / sizeof shifts[0]; v++) {
        f->emu.widths_seen = 0;
        for (size_t i = 0; i < kvc_named_shape_count; i++)
            compare(f, &kvc_named_shapes[i].sh, &shifts[v], 0x700 + i,
                    kvc_named_shapes[i].name);
        assert_true(f->emu.widths_seen != 0);
        if (f->emu.widths_seen >= 2 * shifts[v].addr_shift)
            fail_msg("%s: a launch used vectors wider than the addresses allow "
                     "(widths 0x%x): hw_cuda_copy_vec_bytes must look at every address",
                     shifts[v].name, f->emu.widths_seen);
    }
    fx_close(f);
}

/* ---- random shapes ------------------------------------------------------------- */

#define RANDOM_SHAPES 120
#define RANDOM_MAX_POOL_PAGES 20

/* The seed of random shape i, or the one CUDA_KERNELS_SEED names. */
static uint64_t random_seed(uint64_t *rng, bool *replay)
{
    const char *s = getenv("CUDA_KERNELS_SEED");
    *replay = s != NULL && *s != '\0';
    return *replay ? strtoull(s, NULL, 0) : xorshift64(rng);
}

static void random_shapes(const variant_t *variants, size_t n_variants, uint64_t root)
{
    fx_t *f = fx_open();
    uint64_t rng = root;
    for (int i = 0; i < RANDOM_SHAPES; i++) {
        bool replay;
        const uint64_t seed = random_seed(&rng, &replay);
        uint64_t r = seed;
        const kvc_shape_t sh = kvc_random_shape(&r, RANDOM_MAX_POOL_PAGES);
        char label[64];
        snprintf(label, sizeof label, "random shape %d", i);
        compare(f, &sh, &variants[(size_t)i % n_variants], seed, label);
        if (replay) {
            for (size_t v = 0; v < n_variants; v++)
                compare(f, &sh, &variants[v], seed, "replayed shape");
            break;
        }
    }
    fx_close(f);
}

static void test_cuda_kernels_random_shapes_as_launched(void **state)
{
    random_shapes(&k_as_launched, 1, 0xC0DA);
}

static void test_cuda_kernels_random_shapes_on_other_grids(void **state)
{
    /* The arithmetic must hold on any grid: one block per layer (every
     * thread strides over all of its layer's vectors), two or three, the
     * index width the launch did not pick, and unaligned addresses. */
    static const variant_t variants[] = {
        {"1 block along x, 64-bit indices", {1, 64}, 0},
        {"2 blocks along x", {2, 0}, 0},
        {"3 blocks along x, 32-bit indices, addresses 2 bytes off", {3, 32}, 2},
        {"64-bit indices, addresses 4 bytes off", {0, 64}, 4},
        {"1 block along x, addresses 1 byte off", {1, 0}, 1},
        {"addresses 8 bytes off", {0, 0}, 8},
    };
    random_shapes(variants, sizeof variants / sizeof variants[0], 0xB10C);
}

/* ---- the launch geometry, at sizes no test can allocate ------------------------- */

static hw_cuda_copy_args_t geometry_args(uint64_t tokens, uint64_t row_bytes, uint64_t layers)
{
    return (hw_cuda_copy_args_t){.layer_count = layers, .page_size = 16, .tokens = tokens,
                                 .layer_slots = layers, .row_bytes = row_bytes,
                                 .token_bytes = row_bytes, .slot_bytes = tokens * row_bytes};
}

static void expect_grid(uint64_t tokens, uint64_t row_bytes, unsigned vec, uint32_t x,
                        uint32_t index_bits)
{
    const hw_cuda_copy_args_t a = geometry_args(tokens, row_bytes, 3);
    hw_cuda_grid_t g;
    assert_int_equal(emu_copy_grid(&a, vec, &g), 0);
    if (g.x != x || g.y != 3 || g.z != 2 || g.index_bits != index_bits)
        fail_msg("%llu tokens of %llu B rows in %u-byte vectors: grid (%u, %u, %u) with "
                 "%u-bit indices, expected (%u, 3, 2) with %u-bit",
                 (unsigned long long)tokens, (unsigned long long)row_bytes, vec, g.x, g.y,
                 g.z, g.index_bits, x, index_bits);
    /* With 32-bit indices no thread's last idx + stride wraps. */
    if (g.index_bits == 32) {
        const uint64_t n = tokens * (row_bytes / vec);
        assert_true(n - 1 + (uint64_t)g.x * HW_CUDA_THREADS <= UINT32_MAX);
    }
}

static void test_cuda_kernels_launch_geometry(void **state)
{
    const uint64_t T = HW_CUDA_THREADS, X = HW_CUDA_MAX_GRID_X;
    /* One vector per thread, the last block partial. */
    expect_grid(1, 16, 16, 1, 32);
    expect_grid(T, 16, 16, 1, 32);
    expect_grid(T + 1, 16, 16, 2, 32);
    expect_grid(1000, 256, 16, (uint32_t)((1000 * 16 + T - 1) / T), 32);
    /* The grid stops at X blocks; threads stride beyond. */
    expect_grid(X * T, 1, 1, (uint32_t)X, 32);
    expect_grid(X * T + 1, 1, 1, (uint32_t)X, 32);
    expect_grid(1ull << 30, 2, 2, (uint32_t)X, 32);
    /* 64-bit indices exactly when n + X * T passes UINT32_MAX. */
    const uint64_t n32 = UINT32_MAX - X * T;
    expect_grid(n32, 1, 1, (uint32_t)X, 32);
    expect_grid(n32 + 1, 1, 1, (uint32_t)X, 64);
    expect_grid(n32 + 1, 16, 16, (uint32_t)X, 64);
    expect_grid(1ull << 33, 256, 16, (uint32_t)X, 64);
    /* Nothing to copy launches nothing; other widths are refused. */
    hw_cuda_grid_t g;
    hw_cuda_copy_args_t a = geometry_args(0, 16, 3);
    assert_int_equal(emu_copy_grid(&a, 16, &g), 0);
    assert_int_equal(g.x, 0);
    a = geometry_args(10, 16, 0);
    assert_int_equal(emu_copy_grid(&a, 16, &g), 0);
    assert_int_equal(g.x, 0);
    a = geometry_args(10, 16, 3);
    assert_int_not_equal(emu_copy_grid(&a, 3, &g), 0);
    assert_int_not_equal(emu_copy_grid(&a, 32, &g), 0);
}

/* ---- copy_args.c on its own ------------------------------------------------------ */

static void test_cuda_kernels_copy_args(void **state)
{
    const uint64_t k[4] = {0x1000, 0x2000, 0x3000, 0x4000};
    const uint64_t v[4] = {0x5000, 0x6000, 0x7000, 0x8000};
    const int64_t pages[3] = {7, 2, 5};
    kvs_copy_desc_t d = {.k_base = k, .v_base = v, .layer_begin = 1, .layer_count = 2,
                         .pages = pages, .page_size = 4, .tokens = 10,
                         .staging_slot_begin = 1, .staging_layer_slots = 3,
                         .staging_addr = 0x9000};
    kvs_copy_shape_t sh = {.pages_used = 3, .row_bytes = 64, .token_bytes = 256,
                           .head_off = 128, .slot_bytes = 640};
    /* [K bases of the copy's layers | V bases | page ids]. */
    assert_int_equal(hw_cuda_copy_words(&d, &sh), 7);
    uint64_t w[8];
    memset(w, 0xAA, sizeof w);
    hw_cuda_copy_words_fill(&d, &sh, w);
    const uint64_t want[8] = {0x2000, 0x3000, 0x6000, 0x7000, 7, 2, 5, 0xAAAAAAAAAAAAAAAAull};
    assert_memory_equal(w, want, sizeof want);
    const hw_cuda_copy_args_t a = hw_cuda_copy_args_of(&d, &sh, w, true);
    assert_ptr_equal(a.words, w);
    assert_int_equal(a.staging, 0x9000);
    assert_int_equal(a.layer_count, 2);
    assert_int_equal(a.page_size, 4);
    assert_int_equal(a.tokens, 10);
    assert_int_equal(a.slot_begin, 1);
    assert_int_equal(a.layer_slots, 3);
    assert_int_equal(a.row_bytes, 64);
    assert_int_equal(a.token_bytes, 256);
    assert_int_equal(a.head_off, 128);
    assert_int_equal(a.slot_bytes, 640);
    assert_int_equal(a.scatter, 1);
    /* The widest vector every size and address allows; layers outside
     * the copy do not count. */
    assert_int_equal(hw_cuda_copy_vec_bytes(&d, &sh), 16);
    sh.head_off = 136;
    assert_int_equal(hw_cuda_copy_vec_bytes(&d, &sh), 8);
    sh.head_off = 128;
    const uint64_t k_odd[4] = {0x1001, 0x2000, 0x3004, 0x4001};
    d.k_base = k_odd;
    assert_int_equal(hw_cuda_copy_vec_bytes(&d, &sh), 4);
    d.staging_addr = 0x9002;
    assert_int_equal(hw_cuda_copy_vec_bytes(&d, &sh), 2);
    sh.row_bytes = 3;
    assert_int_equal(hw_cuda_copy_vec_bytes(&d, &sh), 1);

    /* One plane (MLA): no V base is read, none is written to the words
     * (0 in its place), and the grid has one z. */
    d = (kvs_copy_desc_t){.k_base = k, .v_base = NULL, .layer_begin = 1, .layer_count = 2,
                          .pages = pages, .page_size = 4, .tokens = 10,
                          .staging_slot_begin = 1, .staging_layer_slots = 3,
                          .staging_addr = 0x9000, .planes = 1};
    sh = (kvs_copy_shape_t){.pages_used = 3, .row_bytes = 64, .token_bytes = 256,
                            .head_off = 128, .slot_bytes = 640, .planes = 1};
    memset(w, 0xAA, sizeof w);
    hw_cuda_copy_words_fill(&d, &sh, w);
    const uint64_t want1[8] = {0x2000, 0x3000, 0, 0, 7, 2, 5, 0xAAAAAAAAAAAAAAAAull};
    assert_memory_equal(w, want1, sizeof want1);
    const hw_cuda_copy_args_t a1 = hw_cuda_copy_args_of(&d, &sh, w, false);
    assert_int_equal(a1.planes, 1);
    assert_int_equal(hw_cuda_copy_vec_bytes(&d, &sh), 16);
    hw_cuda_grid_t g;
    assert_int_equal(emu_copy_grid(&a1, 16, &g), 0);
    assert_int_equal(g.z, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_kernels_copy_args),
        cmocka_unit_test(test_cuda_kernels_launch_geometry),
        cmocka_unit_test(test_cuda_kernels_named_shapes_take_every_width),
        cmocka_unit_test(test_cuda_kernels_named_shapes_on_unaligned_addresses),
        cmocka_unit_test(test_cuda_kernels_random_shapes_as_launched),
        cmocka_unit_test(test_cuda_kernels_random_shapes_on_other_grids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
