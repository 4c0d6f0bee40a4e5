/*
 * rank_example.c - embedding kvstage in an engine, in C: a prefill rank
 * and a decode rank (in one process here; an engine runs each in its own),
 * each over its own KV pool (memory the engine allocated, attached to a
 * host device), on the verbs fabric, driven by the rank driver's thread.
 * One request (a "room") moves with an aux payload; the decode checks every
 * byte. Needs an RDMA device (soft-RoCE will do: tests/rxe/run-in-vm.sh).
 *
 *   cc rank_example.c $(pkg-config --cflags --libs kvstage) -lkvstage_hw
 *   KVS_VERBS_ADDR=<local IP of the RDMA device> ./rank_example
 *
 * Built by the build (target rank_example), run by ctest's examples_rxe.
 */
#include <kvstage/driver.h>
#include <kvstage/host.h>
#include <kvstage/kvstage.h>
#include <kvstage/verbs.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { LAYERS = 2, HEADS = 4, DIM = 64, PAGE = 16, POOL_PAGES = 32, TOKENS = 100 };
#define ROOM 42u

/* One rank of the engine: its KV pool and the kvstage objects over it. */
typedef struct engine_rank {
    uint16_t *kv;                    /* [2][LAYERS][POOL_PAGES * PAGE][HEADS][DIM], fp16 */
    kvs_host_device_t *host;
    kvs_fabric_t *fab;
    kvs_rank_t *rank;
    kvs_driver_t *drv;
    atomic_int done;                 /* the room's result came */
    int status;
    char aux[64];
    uint32_t aux_bytes;
} engine_rank_t;

static size_t layer_elems(void) { return (size_t)POOL_PAGES * PAGE * HEADS * DIM; }
static uint16_t *k_of(engine_rank_t *e, int l) { return e->kv + (size_t)l * layer_elems(); }
static uint16_t *v_of(engine_rank_t *e, int l)
{
    return e->kv + (size_t)(LAYERS + l) * layer_elems();
}

static int fail(const char *what, int rc, const kvs_error_t *err)
{
    fprintf(stderr, "rank_example: %s: %s (%s)\n", what,
            err != NULL && err->msg[0] != '\0' ? err->msg : kvs_strerror(rc),
            kvs_status_name(rc));
    return 1;
}

/* The driver hands each finished room here, on its thread; aux is valid
 * during the call only, so it is copied. */
static void on_result(void *ctx, const kvs_room_result_t *res)
{
    engine_rank_t *e = ctx;
    e->status = res->status;
    e->aux_bytes = res->aux_bytes < sizeof e->aux ? res->aux_bytes : 0;
    if (res->aux != NULL)
        memcpy(e->aux, res->aux, e->aux_bytes);
    atomic_store(&e->done, 1);
}

/* Everything one rank needs, in order: the pool and a device that may copy
 * from it, the fabric, the rank (manager, staging, handler) and its driver. */
static int rank_open(engine_rank_t *e, kvs_role_t role)
{
    kvs_error_t err;
    memset(e, 0, sizeof *e);
    const size_t bytes = 2 * LAYERS * layer_elems() * sizeof *e->kv;
    e->kv = calloc(1, bytes);
    if (e->kv == NULL)
        return fail("KV pool", KVS_ENOMEM, NULL);
    int rc = kvs_host_device_create(NULL, &e->host, &err);
    if (rc == KVS_OK)
        rc = kvs_host_mem_attach(kvs_host_device(e->host), e->kv, bytes, &err);
    if (rc != KVS_OK)
        return fail("host device", rc, &err);
    kvs_verbs_config_t vc;
    kvs_verbs_config_init(&vc);
    vc.bind_addr = getenv("KVS_VERBS_ADDR");
    if ((rc = kvs_verbs_fabric_create(&vc, &e->fab, &err)) != KVS_OK)
        return fail("verbs fabric", rc, &err);

    kvs_kv_layer_t layers[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        layers[l] = (kvs_kv_layer_t){.k_addr = (uint64_t)(uintptr_t)k_of(e, l),
                                     .v_addr = (uint64_t)(uintptr_t)v_of(e, l),
                                     .tokens = POOL_PAGES * PAGE,
                                     .token_stride_bytes = HEADS * DIM * 2,
                                     .head_stride_bytes = DIM * 2,
                                     .elem_stride_bytes = 2};
    kvs_rank_config_t rc_cfg = {
        .manager = {.role = role, .staging = true, .total_heads = HEADS, .head_dim = DIM,
                    .dtype = KVS_DTYPE_FP16, .layers = LAYERS, .page_size = PAGE,
                    .tp_rank = 0, .tp_size = 1, .pp_size = 1, .peer_tp_size = 1,
                    .ring_bytes = 16u << 20, .max_aux_bytes = sizeof e->aux},
        .layers = layers};
    if ((rc = kvs_rank_create(&rc_cfg, kvs_host_device(e->host), e->fab, &e->rank, &err)) !=
        KVS_OK)
        return fail("kvs_rank_create", rc, &err);
    kvs_driver_config_t dc = {.rank = e->rank, .dev = kvs_host_device(e->host),
                              .fab = e->fab, .on_result = on_result, .ctx = e};
    if ((rc = kvs_driver_create(&dc, &e->drv, &err)) != KVS_OK)
        return fail("kvs_driver_create", rc, &err);
    if ((rc = kvs_driver_start(e->drv)) != KVS_OK)
        return fail("kvs_driver_start", rc, kvs_driver_last_error(e->drv));
    return 0;
}

/* Whoever creates frees, in the reverse order; first the driver delivers
 * what the peers have not acknowledged yet (at most 1 s). */
static void rank_close(engine_rank_t *e)
{
    for (int i = 0; i < 100 && e->rank != NULL; i++) {
        kvs_handler_stats_t st = {0};
        kvs_rank_stats(e->rank, &st);
        if (st.msgs_unacked == 0)
            break;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    kvs_driver_destroy(e->drv); /* stops and joins its thread */
    kvs_rank_destroy(e->rank);
    if (e->fab != NULL)
        kvs_verbs_fabric_destroy(e->fab);
    if (e->host != NULL) {
        (void)kvs_host_mem_detach(kvs_host_device(e->host), e->kv, NULL);
        kvs_host_device_destroy(e->host);
    }
    free(e->kv);
}

static uint16_t value(int kv, int l, int64_t t, int h, int d)
{
    return (uint16_t)(kv * 40503 + l * 977 + t * 131 + h * 29 + d);
}

static bool wait_done(engine_rank_t *e, int seconds)
{
    for (int i = 0; i < seconds * 100 && !atomic_load(&e->done); i++)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    return atomic_load(&e->done);
}

int main(void)
{
    engine_rank_t pre, dec;
    if (rank_open(&pre, KVS_ROLE_PREFILL) != 0 || rank_open(&dec, KVS_ROLE_DECODE) != 0)
        return 1;
    /* The decode learns the prefill instance (id 0) and its ranks' addresses. */
    kvs_verbs_info_t info;
    kvs_verbs_fabric_info(pre.fab, &info);
    const char *addrs[] = {info.address};
    int rc = kvs_rank_add_instance(dec.rank, &(kvs_instance_desc_t){
                                                 .id = 0, .tp_size = 1, .addrs = addrs});
    if (rc != KVS_OK)
        return fail("kvs_rank_add_instance", rc, kvs_rank_last_error(dec.rank));

    /* The request: TOKENS tokens on pages the engines' allocators chose. */
    enum { NPAGES = (TOKENS + PAGE - 1) / PAGE };
    const int64_t ppages[NPAGES] = {3, 9, 4, 20, 11, 0, 17};
    const int64_t dpages[NPAGES] = {30, 1, 2, 14, 8, 25, 5};
    for (int kv = 0; kv < 2; kv++)
        for (int l = 0; l < LAYERS; l++)
            for (int64_t t = 0; t < TOKENS; t++)
                for (int h = 0; h < HEADS; h++)
                    for (int d = 0; d < DIM; d++) {
                        uint16_t *layer = kv == 0 ? k_of(&pre, l) : v_of(&pre, l);
                        const int64_t slot = ppages[t / PAGE] * PAGE + t % PAGE;
                        layer[(slot * HEADS + h) * DIM + d] = value(kv, l, t, h, d);
                    }
    const char aux[] = "first token 1734, logprob -0.25";
    rc = kvs_rank_open_room(dec.rank, &(kvs_room_desc_t){.room = ROOM, .total_tokens = TOKENS,
                                                         .pages = dpages,
                                                         .num_pages = NPAGES});
    if (rc != KVS_OK)
        return fail("decode open_room", rc, kvs_rank_last_error(dec.rank));
    rc = kvs_rank_open_room(pre.rank, &(kvs_room_desc_t){.room = ROOM, .total_tokens = TOKENS,
                                                         .pages = ppages, .num_pages = NPAGES,
                                                         .aux = aux, .aux_bytes = sizeof aux});
    if (rc == KVS_OK) /* the forward pass wrote all of it */
        rc = kvs_rank_computed(pre.rank, ROOM, TOKENS, true);
    if (rc != KVS_OK)
        return fail("prefill room", rc, kvs_rank_last_error(pre.rank));

    if (!wait_done(&dec, 60) || !wait_done(&pre, 10)) {
        kvs_room_state_t st = KVS_ROOM_FAILED;
        kvs_rank_room_state(dec.rank, ROOM, &st);
        fprintf(stderr, "rank_example: room %u not done in 60 s (decode: %s)\n", ROOM,
                kvs_room_state_name(st));
        return 1;
    }
    if (dec.status != KVS_OK || pre.status != KVS_OK)
        return fail("room", dec.status != KVS_OK ? dec.status : pre.status, NULL);
    int64_t bad = 0;
    for (int kv = 0; kv < 2; kv++)
        for (int l = 0; l < LAYERS; l++)
            for (int64_t t = 0; t < TOKENS; t++)
                for (int h = 0; h < HEADS; h++)
                    for (int d = 0; d < DIM; d++) {
                        const uint16_t *layer = kv == 0 ? k_of(&dec, l) : v_of(&dec, l);
                        const int64_t slot = dpages[t / PAGE] * PAGE + t % PAGE;
                        bad += layer[(slot * HEADS + h) * DIM + d] != value(kv, l, t, h, d);
                    }
    const bool aux_ok = dec.aux_bytes == sizeof aux && memcmp(dec.aux, aux, sizeof aux) == 0;
    printf("rank_example: room %u moved %d tokens x %d layers, %lld values wrong, aux %s\n",
           ROOM, TOKENS, LAYERS, (long long)bad, aux_ok ? "intact" : "WRONG");
    rank_close(&dec); /* the decode first: it would see its peer go */
    rank_close(&pre);
    return bad == 0 && aux_ok ? 0 : 1;
}
