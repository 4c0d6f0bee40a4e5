/*
 * test_cuda_device.c - unit tests of the CUDA device backend (hw/cuda),
 * built wherever CUDA is.
 *
 * Without a usable GPU (no device, no driver: CI machines and the
 * development VM) creating the device must fail cleanly: KVS_EBACKEND, no
 * object, the CUDA error as backend code and a message naming what to
 * change; that path is tested here and is not a skip. With a GPU the same
 * create succeeds and the tests in the body run: gather/scatter byte for
 * byte against the host backend on random shapes, CUDA errors turned into
 * statuses (device out of memory, unknown frees, bad descriptors), events
 * and streams, and the wait fd readable once an event after wait_arm
 * completed. Then the device contract every backend meets
 * (tests/fixtures/device_contract.c) on GPU 0; without a GPU its tests skip. Set
 * KVS_EXPECT_GPU=1 where a GPU must be found (the GPU check script does):
 * a failed create then fails the test.
 */
#include <kvstage/cuda.h>
#include <kvstage/host.h>

#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device_contract.h"
#include "kv_compare.h"
#include "xorshift.h"

static bool gpu_expected(void)
{
    const char *e = getenv("KVS_EXPECT_GPU");
    return e != NULL && strcmp(e, "1") == 0;
}

/* Opens GPU 0, or returns NULL (after checking the failure is clean) when
 * this machine has no usable GPU. */
static kvs_cuda_device_t *open_gpu(kvs_error_t *err)
{
    kvs_cuda_device_t *c = (kvs_cuda_device_t *)(uintptr_t)1;
    int rc = kvs_cuda_device_create(NULL, &c, err);
    if (rc == KVS_OK) {
        assert_non_null(c);
        return c;
    }
    if (gpu_expected())
        fail_msg("KVS_EXPECT_GPU=1 but no GPU: %s", err->msg);
    assert_null(c);
    assert_int_equal(rc, KVS_EBACKEND);
    assert_int_equal(err->status, rc);
    return NULL;
}

static void test_cuda_device_create_fails_cleanly_without_gpu(void **state)
{
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    assert_int_equal(kvs_cuda_device_create(NULL, NULL, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "out is NULL"));
    assert_int_equal(kvs_cuda_device_create(NULL, NULL, NULL), KVS_EINVAL);

    kvs_cuda_device_t *c = open_gpu(&err);
    if (c != NULL) {
        /* A GPU: an ordinal past the last one is a range error instead. */
        kvs_cuda_config_t cfg = {.ordinal = 1 << 20};
        kvs_cuda_device_t *c2 = NULL;
        assert_int_equal(kvs_cuda_device_create(&cfg, &c2, &err), KVS_ERANGE);
        assert_null(c2);
        assert_non_null(strstr(err.msg, "out of range"));
        kvs_cuda_device_destroy(c);
        return;
    }
    print_message("no usable GPU here; create failed cleanly: %s\n", err.msg);
    /* Says what is missing and what to do instead. */
    assert_non_null(strstr(err.msg, "no CUDA device"));
    assert_non_null(strstr(err.msg, "kvs_host_device_create"));
    assert_int_not_equal(err.backend_code, 0);
    assert_non_null(err.file);
    assert_true(err.line > 0);
    /* Any ordinal fails the same way, and a NULL err is fine. */
    kvs_cuda_config_t cfg = {.ordinal = 3};
    assert_int_equal(kvs_cuda_device_create(&cfg, &c, NULL), KVS_EBACKEND);
    assert_null(c);
    kvs_cuda_device_destroy(NULL);
    assert_null(kvs_cuda_device(NULL));
}

static void test_cuda_device_foreign_device_is_refused(void **state)
{
    kvs_host_device_t *h = NULL;
    assert_int_equal(kvs_host_device_create(NULL, &h, NULL), KVS_OK);
    kvs_device_t *dev = kvs_host_device(h);
    assert_null(kvs_cuda_device_from(dev));
    assert_null(kvs_cuda_device_from(NULL));
    assert_null(kvs_cuda_stream_handle(dev, NULL));
    assert_int_equal(kvs_cuda_stream_sync(dev, NULL), KVS_EINVAL);
    assert_int_equal(kvs_cuda_event_wait(dev, NULL), KVS_EINVAL);
    kvs_host_device_destroy(h);
}

/* ---- with a GPU ------------------------------------------------------------ */

static int wait_cuda(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    return kvs_cuda_event_wait(dev, ev);
}

static int wait_host(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    return kvs_host_event_wait(dev, ev);
}

static void test_cuda_device_matches_host_backend(void **state)
{
    kvs_error_t err;
    kvs_cuda_device_t *c = open_gpu(&err);
    if (c == NULL) {
        skip();
        return;
    }
    kvs_host_device_t *h = NULL;
    assert_int_equal(kvs_host_device_create(NULL, &h, NULL), KVS_OK);
    kvs_device_t *cd = kvs_cuda_device(c), *hd = kvs_host_device(h);
    kvs_stream_t *cs = NULL, *hs = NULL;
    assert_int_equal(cd->ops.stream_create(cd, &cs), KVS_OK);
    assert_int_equal(hd->ops.stream_create(hd, &hs), KVS_OK);
    assert_non_null(kvs_cuda_stream_handle(cd, cs));
    const kvc_side_t gpu = {cd, cs, wait_cuda, NULL}, cpu = {hd, hs, wait_host, NULL};
    uint64_t rng = 0xCDA;
    for (int i = 0; i < 30; i++) {
        const uint64_t seed = xorshift64(&rng);
        uint64_t r = seed;
        const kvc_shape_t sh = kvc_random_shape(&r, 48);
        char msg[256];
        if (kvc_compare(&gpu, &cpu, &sh, seed, msg, sizeof msg) != 0)
            fail_msg("cuda vs host, seed %llu: %s", (unsigned long long)seed, msg);
    }
    cd->ops.stream_destroy(cd, cs);
    hd->ops.stream_destroy(hd, hs);
    kvs_host_device_destroy(h);
    kvs_cuda_device_destroy(c);
}

/* A gather or scatter of one 4-token page of one 8-element head, one
 * layer, into a one-slot staging block at staging. */
static kvs_copy_desc_t one_page(const uint64_t *kb, const uint64_t *vb, const int64_t *pages,
                                uint64_t staging)
{
    return (kvs_copy_desc_t){.k_base = kb, .v_base = vb, .local_heads = 1, .head_dim = 8,
                             .elem_bytes = 2, .page_size = 4, .pages = pages, .num_pages = 1,
                             .tokens = 4, .head_start = 0, .num_heads = 1, .layer_begin = 0,
                             .layer_count = 1, .staging_slot_begin = 0,
                             .staging_layer_slots = 1, .staging_addr = staging};
}

static void test_cuda_device_errors_become_statuses(void **state)
{
    kvs_error_t err;
    kvs_cuda_device_t *c = open_gpu(&err);
    if (c == NULL) {
        skip();
        return;
    }
    kvs_device_t *d = kvs_cuda_device(c);
    uint64_t a = 0;
    /* More than any GPU holds: cudaMalloc fails, a status comes back. */
    assert_int_equal(d->ops.mem_alloc(d, 1ull << 52, &a), KVS_EBACKEND);
    assert_non_null(strstr(d->last_backend_msg, "cudaErrorMemoryAllocation"));
    assert_non_null(strstr(d->last_backend_msg, "lower the ring"));
    assert_int_equal(d->last_backend_code, 2); /* cudaErrorMemoryAllocation */
    assert_int_equal(d->ops.mem_alloc(d, 0, &a), KVS_EINVAL);
    assert_int_equal(d->ops.mem_alloc(d, 4096, &a), KVS_OK);
    assert_int_equal(d->ops.mem_free(d, a + 1), KVS_ENOENT);
    uint8_t buf[64] = {0};
    assert_int_equal(d->ops.mem_write(d, a + 4090, buf, 64), KVS_ERANGE);
    assert_int_equal(d->ops.mem_write(d, a, buf, 64), KVS_OK);
    assert_int_equal(d->ops.mem_read(d, a, buf, 64), KVS_OK);

    kvs_stream_t *s = NULL;
    assert_int_equal(d->ops.stream_create(d, &s), KVS_OK);
    /* A descriptor outside live memory never reaches the GPU. */
    const uint64_t kb[1] = {a}, vb[1] = {a + (1ull << 40)};
    const int64_t pages[1] = {0};
    kvs_copy_desc_t desc = one_page(kb, vb, pages, a + 1024);
    assert_int_equal(d->ops.gather(d, s, &desc), KVS_ERANGE);
    assert_non_null(strstr(d->last_backend_msg, "V buffer of local layer 0"));
    const uint64_t vb_ok[1] = {a + 2048};
    desc.v_base = vb_ok;
    assert_int_equal(d->ops.gather(d, s, &desc), KVS_OK);
    kvs_event_t *ev = NULL;
    assert_int_equal(d->ops.event_record(d, s, &ev), KVS_OK);
    int rc = d->ops.event_query(d, ev);
    assert_true(rc == KVS_OK || rc == KVS_EAGAIN);
    assert_int_equal(kvs_cuda_event_wait(d, ev), KVS_OK);
    assert_int_equal(d->ops.event_query(d, ev), KVS_OK);
    d->ops.event_destroy(d, ev);
    assert_int_equal(d->ops.event_query(d, ev), KVS_EINVAL);
    assert_int_equal(kvs_cuda_stream_sync(d, s), KVS_OK);
    d->ops.stream_destroy(d, s);
    assert_null(kvs_cuda_stream_handle(d, s));
    assert_int_equal(d->ops.gather(d, s, &desc), KVS_EINVAL);
    /* Destroy frees the allocation still live. */
    kvs_cuda_device_destroy(c);
}

static void test_cuda_device_wait_fd_signals_events(void **state)
{
    kvs_error_t err;
    kvs_cuda_device_t *c = open_gpu(&err);
    if (c == NULL) {
        skip();
        return;
    }
    kvs_device_t *d = kvs_cuda_device(c);
    uint64_t a = 0;
    assert_int_equal(d->ops.mem_alloc(d, 1u << 20, &a), KVS_OK);
    kvs_stream_t *s = NULL;
    assert_int_equal(d->ops.stream_create(d, &s), KVS_OK);
    const uint64_t kb[1] = {a}, vb[1] = {a + (256u << 10)};
    const int64_t pages[1] = {0};
    const kvs_copy_desc_t desc = one_page(kb, vb, pages, a + (512u << 10));
    int fd = -1;
    assert_int_equal(d->ops.wait_arm(d, NULL), KVS_EINVAL);
    assert_int_equal(d->ops.wait_arm(d, &fd), KVS_OK);
    assert_true(fd >= 0);
    /* Armed: the event's completion makes the fd readable (bounded: a lost
     * wake-up fails instead of hanging), and the event is complete then. */
    assert_int_equal(d->ops.gather(d, s, &desc), KVS_OK);
    kvs_event_t *ev = NULL;
    assert_int_equal(d->ops.event_record(d, s, &ev), KVS_OK);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 60000), 1);
    assert_int_equal(d->ops.event_query(d, ev), KVS_OK);
    d->ops.event_destroy(d, ev);
    /* The next arm consumes it; with nothing queued it stays quiet. */
    int again = -1;
    assert_int_equal(d->ops.wait_arm(d, &again), KVS_OK);
    assert_int_equal(again, fd);
    assert_int_equal(kvs_cuda_stream_sync(d, s), KVS_OK);
    assert_int_equal(poll(&pfd, 1, 0), 0);
    d->ops.stream_destroy(d, s);
    kvs_cuda_device_destroy(c);
}

/* ---- the device contract (tests/fixtures/device_contract.c) on this backend -------- */

/* GPU 0, or NULL without one: the contract's tests then skip (and with
 * KVS_EXPECT_GPU=1 fail, through open_gpu). */
static kvs_device_t *cuda_contract_open(void **ctx)
{
    kvs_error_t err;
    kvs_cuda_device_t *c = open_gpu(&err);
    *ctx = c;
    return c != NULL ? kvs_cuda_device(c) : NULL;
}

static int cuda_contract_wait(void *ctx, kvs_device_t *dev, kvs_event_t *ev)
{
    (void)ctx;
    return kvs_cuda_event_wait(dev, ev);
}

static void cuda_contract_close(void *ctx, kvs_device_t *dev)
{
    (void)dev;
    kvs_cuda_device_destroy(ctx);
}

static const dc_backend_t cuda_contract = {
    .name = "CUDA GPU 0",
    .open = cuda_contract_open,
    .wait = cuda_contract_wait,
    .close = cuda_contract_close,
};

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_device_create_fails_cleanly_without_gpu),
        cmocka_unit_test(test_cuda_device_foreign_device_is_refused),
        cmocka_unit_test(test_cuda_device_matches_host_backend),
        cmocka_unit_test(test_cuda_device_errors_become_statuses),
        cmocka_unit_test(test_cuda_device_wait_fd_signals_events),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed + dc_run(&cuda_contract);
}
