/*
 * test_ofi_fabric.c - the libfabric fabric on this machine's providers,
 * no RDMA device needed: every test runs over tcp on 127.0.0.1 and over
 * shm. Two fabrics in this process connect through the TCP bootstrap,
 * exchange control messages both ways (in order, up to the largest size),
 * write random data with immediates (whole, and split by max_write_bytes
 * and by registration pieces) and check every byte; a write with a key the
 * peer dropped (or never gave) is refused alone, naming the key, while the
 * connection carries on; a peer that disconnects or is destroyed gives DISCONNECT in bounded
 * time; wait_arm's fd is quiet while nothing happens and readable when a
 * message arrives (shm, which has no such fd, gives a short wake time); an unknown provider is refused with the list of those
 * offered here.
 *
 * A provider missing here (a libfabric built without shm) is a skip in the
 * test's body, said on stderr. Every wait is bounded (KVS_TEST_WAIT_S,
 * default 60 s): a hang fails the test.
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <kvstage/host.h>
#include <kvstage/ofi.h>

#include "fabric_pair.h"
#include "xorshift.h"

static void cfg_for(kvs_ofi_config_t *cfg, const char *prov)
{
    kvs_ofi_config_init(cfg);
    cfg->provider = prov;
    cfg->bind_addr = "127.0.0.1";
    cfg->connect_timeout_ms = 5000;
}

/* Whether libfabric offers prov here; says so on stderr when it does not. */
static bool offered(const char *prov)
{
    char list[256];
    (void)kvs_ofi_providers(list, sizeof list);
    for (char *t = strtok(list, ", "); t != NULL; t = strtok(NULL, ", "))
        if (strcmp(t, prov) == 0)
            return true;
    fprintf(stderr, "test_ofi_fabric: provider %s is not offered here: SKIPPED\n", prov);
    return false;
}

/* The ofi fabrics' connect() waits for the peer's poll: nap 1 ms. */
static void nap(kvs_fabric_t *fab)
{
    (void)fab;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static void side_open(fp_side_t *s, const kvs_ofi_config_t *cfg)
{
    kvs_error_t err;
    kvs_fabric_t *fab = NULL;
    int rc = kvs_ofi_fabric_create(cfg, &fab, &err);
    if (rc != KVS_OK)
        fail_msg("kvs_ofi_fabric_create: %s: %s", kvs_status_name(rc), err.msg);
    fp_side_init(s, fab);
}

static void side_close(fp_side_t *s)
{
    if (s->fab != NULL)
        assert_int_equal(kvs_ofi_fabric_destroy(s->fab), KVS_OK);
    fp_side_fini(s);
}

/* b connects to a; one hello b -> a hands a its side of the connection. */
static void duo_open_cfg(fp_pair_t *d, const kvs_ofi_config_t *cfg)
{
    const char *prov = d->name;
    memset(d, 0, sizeof *d);
    d->name = prov;
    side_open(&d->a, cfg);
    side_open(&d->b, cfg);
    kvs_ofi_info_t info;
    assert_int_equal(kvs_ofi_fabric_info(d->a.fab, &info), KVS_OK);
    fp_pair_connect(d, info.address, nap);
}

static void duo_open(fp_pair_t *d)
{
    kvs_ofi_config_t cfg;
    cfg_for(&cfg, d->name);
    duo_open_cfg(d, &cfg);
}

static void duo_close(fp_pair_t *d)
{
    if (d->ab != NULL)
        d->b.fab->ops.disconnect(d->b.fab, d->ab);
    side_close(&d->b);
    side_close(&d->a);
}

/* a registers a target and tells b (address, key) in a message. */
static void announce(fp_pair_t *d, fp_region_t *dst)
{
    uint64_t m[2] = {(uint64_t)(uintptr_t)dst->mem, dst->rkey};
    assert_int_equal(d->a.fab->ops.send(d->a.fab, d->ba, m, sizeof m, 7), KVS_OK);
    kvs_completion_t c = fp_take(d, &d->b, KVS_COMPLETION_RECV, d->ab);
    assert_int_equal(c.len_bytes, sizeof m);
    assert_memory_equal(c.msg, m, sizeof m);
    (void)fp_take(d, &d->a, KVS_COMPLETION_SEND, d->ba);
}

/* b writes len random bytes at off of dst with imm; a sees the IMM after
 * every byte landed. */
static void write_check(fp_pair_t *d, fp_region_t *src, fp_region_t *dst, uint64_t off, uint64_t len,
                        uint32_t imm, uint64_t seed)
{
    uint64_t s = seed;
    for (uint64_t i = 0; i < len; i++)
        src->mem[i] = (uint8_t)xorshift64(&s);
    const kvs_write_desc_t w = {.local_addr = (uint64_t)(uintptr_t)src->mem,
                                .local_mr = src->mr, .len_bytes = len,
                                .remote_addr = (uint64_t)(uintptr_t)dst->mem + off,
                                .rkey = dst->rkey, .with_imm = true, .imm = imm,
                                .wr_id = 1000 + imm};
    int rc = d->b.fab->ops.write(d->b.fab, d->ab, &w);
    if (rc != KVS_OK)
        fail_msg("write: %s: %s", kvs_status_name(rc), d->b.fab->last_backend_msg);
    kvs_completion_t c = fp_take(d, &d->a, KVS_COMPLETION_IMM, d->ba);
    assert_int_equal(c.status, KVS_OK);
    assert_int_equal(c.imm, imm);
    assert_memory_equal(dst->mem + off, src->mem, len);
    c = fp_take(d, &d->b, KVS_COMPLETION_WRITE, d->ab);
    assert_int_equal(c.status, KVS_OK);
    assert_int_equal(c.wr_id, 1000 + imm);
}

static int prov_setup(void **state)
{
    (void)state;
    return 0;
}

static void test_ofi_fabric_unknown_provider_refused(void **state)
{
    (void)state;
    kvs_ofi_config_t cfg;
    cfg_for(&cfg, "nosuchprov");
    kvs_fabric_t *fab = NULL;
    kvs_error_t err;
    assert_int_equal(kvs_ofi_fabric_create(&cfg, &fab, &err), KVS_EINVAL);
    assert_null(fab);
    assert_non_null(strstr(err.msg, "nosuchprov"));
    assert_non_null(strstr(err.msg, "tcp"));
    if (offered("shm"))
        assert_non_null(strstr(err.msg, "shm"));
    cfg.provider = "tcp;ofi_rxm";
    assert_int_equal(kvs_ofi_fabric_create(&cfg, &fab, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "provider name"));
}

static void test_ofi_fabric_messages_in_order(void **state)
{
    fp_pair_t d = {.name = *state};
    if (!offered(d.name))
        skip();
    duo_open(&d);
    static uint8_t big[KVS_CONTROL_MSG_MAX_BYTES + 1];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7);
    for (uint32_t i = 0; i < 64; i++) {
        const uint32_t len = i == 63 ? KVS_CONTROL_MSG_MAX_BYTES : 1 + i * 13;
        big[0] = (uint8_t)i;
        assert_int_equal(d.a.fab->ops.send(d.a.fab, d.ba, big, len, i), KVS_OK);
        kvs_completion_t c = fp_take(&d, &d.b, KVS_COMPLETION_RECV, d.ab);
        assert_int_equal(c.len_bytes, len);
        assert_memory_equal(c.msg, big, len);
    }
    for (uint32_t i = 0; i < 64; i++)
        assert_int_equal(fp_take(&d, &d.a, KVS_COMPLETION_SEND, d.ba).wr_id, i);
    /* one byte too many is refused by name */
    assert_int_equal(d.a.fab->ops.send(d.a.fab, d.ba, big, sizeof big, 99), KVS_EINVAL);
    assert_non_null(strstr(d.a.fab->last_backend_msg, "shorten"));
    /* messages b -> a too, many in flight before any poll */
    for (uint32_t i = 0; i < 100; i++)
        assert_int_equal(d.b.fab->ops.send(d.b.fab, d.ab, &i, sizeof i, i), KVS_OK);
    for (uint32_t i = 0; i < 100; i++) {
        kvs_completion_t c = fp_take(&d, &d.a, KVS_COMPLETION_RECV, d.ba);
        uint32_t got;
        memcpy(&got, c.msg, sizeof got);
        assert_int_equal(got, i);
    }
    duo_close(&d);
}

static void test_ofi_fabric_write_with_data(void **state)
{
    fp_pair_t d = {.name = *state};
    if (!offered(d.name))
        skip();
    duo_open(&d);
    fp_region_t src = {0}, dst = {0};
    fp_region_reg(&d.b, &src, 1u << 20);
    fp_region_reg(&d.a, &dst, 2u << 20);
    announce(&d, &dst);
    write_check(&d, &src, &dst, 0, 1u << 20, 1, 11);
    write_check(&d, &src, &dst, 12345, 777, 2, 12);
    write_check(&d, &src, &dst, (2u << 20) - 4096, 4096, 3, 13);
    /* a write past the registration is refused before it goes out */
    kvs_write_desc_t w = {.local_addr = (uint64_t)(uintptr_t)src.mem, .local_mr = src.mr,
                          .len_bytes = 16, .remote_addr = (uint64_t)(uintptr_t)dst.mem + dst.len,
                          .rkey = dst.rkey};
    assert_int_equal(d.b.fab->ops.write(d.b.fab, d.ab, &w), KVS_EREMOTE);
    assert_non_null(strstr(d.b.fab->last_backend_msg, "outside"));
    fp_region_free(&d.a, &dst);
    fp_region_free(&d.b, &src);
    duo_close(&d);
}

static void test_ofi_fabric_write_split(void **state)
{
    fp_pair_t d = {.name = *state};
    if (!offered(d.name))
        skip();
    kvs_ofi_config_t cfg;
    cfg_for(&cfg, d.name);
    cfg.max_mr_bytes = 64u << 10;
    cfg.max_write_bytes = 24u << 10;
    duo_open_cfg(&d, &cfg);
    fp_region_t src = {0}, dst = {0};
    fp_region_reg(&d.b, &src, 1u << 20);
    fp_region_reg(&d.a, &dst, 1u << 20);
    kvs_ofi_info_t info;
    assert_int_equal(kvs_ofi_fabric_info(d.a.fab, &info), KVS_OK);
    assert_int_equal(info.max_mr_bytes, 64u << 10);
    announce(&d, &dst);
    write_check(&d, &src, &dst, 0, 1u << 20, 21, 31);
    write_check(&d, &src, &dst, 65536 - 100, 300000, 22, 32);
    fp_region_free(&d.a, &dst);
    fp_region_free(&d.b, &src);
    duo_close(&d);
}

static void test_ofi_fabric_error_fails_only_its_write(void **state)
{
    fp_pair_t d = {.name = *state};
    if (!offered(d.name))
        skip();
    duo_open(&d);
    fp_region_t src = {0}, dst = {0}, gone = {0};
    fp_region_reg(&d.b, &src, 64u << 10);
    fp_region_reg(&d.a, &dst, 64u << 10);
    fp_region_reg(&d.a, &gone, 64u << 10);
    announce(&d, &dst);
    announce(&d, &gone);
    /* a drops `gone`, then says so: the DROP reaches b first (in order) */
    assert_int_equal(d.a.fab->ops.mr_deregister(d.a.fab, gone.mr), KVS_OK);
    gone.mr = NULL;
    assert_int_equal(d.a.fab->ops.send(d.a.fab, d.ba, "dropped", 7, 8), KVS_OK);
    (void)fp_take(&d, &d.b, KVS_COMPLETION_RECV, d.ab);
    const kvs_write_desc_t w = {.local_addr = (uint64_t)(uintptr_t)src.mem, .local_mr = src.mr,
                                .len_bytes = 4096, .remote_addr = (uint64_t)(uintptr_t)gone.mem,
                                .rkey = gone.rkey, .with_imm = true, .imm = 5, .wr_id = 55};
    assert_int_equal(d.b.fab->ops.write(d.b.fab, d.ab, &w), KVS_EREMOTE);
    assert_non_null(strstr(d.b.fab->last_backend_msg, "no registration"));
    /* the connection carries on: a message and a good write */
    assert_true(kvs_ofi_conn_alive(d.b.fab, d.ab));
    write_check(&d, &src, &dst, 0, 4096, 6, 41);
    assert_int_equal(d.b.fab->ops.send(d.b.fab, d.ab, "after", 5, 3), KVS_OK);
    kvs_completion_t c = fp_take(&d, &d.a, KVS_COMPLETION_RECV, d.ba);
    assert_memory_equal(c.msg, "after", 5);
    fp_region_free(&d.a, &gone);
    fp_region_free(&d.a, &dst);
    fp_region_free(&d.b, &src);
    duo_close(&d);
}

static void test_ofi_fabric_peer_lost(void **state)
{
    fp_pair_t d = {.name = *state};
    if (!offered(d.name))
        skip();
    /* a disconnect: the peer hears BYE */
    duo_open(&d);
    d.b.fab->ops.disconnect(d.b.fab, d.ab);
    d.ab = NULL;
    kvs_completion_t c = fp_take(&d, &d.a, KVS_COMPLETION_DISCONNECT, d.ba);
    assert_int_equal(c.status, KVS_EPEER);
    assert_false(kvs_ofi_conn_alive(d.a.fab, d.ba));
    assert_int_equal(d.a.fab->ops.send(d.a.fab, d.ba, "x", 1, 1), KVS_EPEER);
    assert_non_null(strstr(d.a.fab->last_backend_msg, "disconnect"));
    d.a.fab->ops.disconnect(d.a.fab, d.ba);
    duo_close(&d);
    /* a destroyed peer (as a crash: no disconnect): its socket ends */
    duo_open(&d);
    d.ab = NULL;
    side_close(&d.b);
    c = fp_take(&d, &d.a, KVS_COMPLETION_DISCONNECT, d.ba);
    assert_int_equal(c.status, KVS_EPEER);
    d.a.fab->ops.disconnect(d.a.fab, d.ba);
    duo_close(&d);
}

typedef struct sender {
    fp_pair_t *d;
    uint64_t delay_ns;
} sender_t;

static void *send_later(void *arg)
{
    sender_t *s = arg;
    struct timespec ts = {0, (long)s->delay_ns};
    nanosleep(&ts, NULL);
    (void)s->d->b.fab->ops.send(s->d->b.fab, s->d->ab, "wake", 4, 9);
    return NULL;
}

static void test_ofi_fabric_wait_fd(void **state)
{
    fp_pair_t d = {.name = *state};
    if (!offered(d.name))
        skip();
    duo_open(&d);
    fp_side_pump(&d.a);
    int fd = -1;
    uint64_t wake = 0;
    /* quiet: arm, poll once more, then the fd stays unreadable */
    assert_int_equal(d.a.fab->ops.wait_arm(d.a.fab, &fd, &wake), KVS_OK);
    fp_side_pump(&d.a);
    assert_true(fd >= 0);
    assert_int_equal(d.a.n, 0);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (wake != UINT64_MAX) {
        /* a provider without a wait fd (shm): a short timer instead */
        assert_true(wake <= fp_now_ns() + 2000000u);
        fprintf(stderr, "test_ofi_fabric: %s has no completion wait fd: wake_ns timer\n",
                d.name);
        duo_close(&d);
        return;
    }
    assert_int_equal(poll(&p, 1, 50), 0);
    /* a message from the other side makes it readable */
    assert_int_equal(d.a.fab->ops.wait_arm(d.a.fab, &fd, &wake), KVS_OK);
    fp_side_pump(&d.a);
    sender_t s = {.d = &d, .delay_ns = 20000000};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, send_later, &s), 0);
    const uint64_t t0 = fp_now_ns();
    int ready = 0;
    while (ready == 0 && fp_now_ns() - t0 < 5000000000u) {
        /* the sender's side makes progress in its own polls */
        ready = poll(&p, 1, 10);
        if (ready == 0)
            fp_side_pump(&d.b);
    }
    pthread_join(t, NULL);
    assert_int_equal(ready, 1);
    kvs_completion_t c = fp_take(&d, &d.a, KVS_COMPLETION_RECV, d.ba);
    assert_memory_equal(c.msg, "wake", 4);
    duo_close(&d);
}

/* Host memory only: the host device's is registered, another device's
 * (GPU memory, here a device of another backend) refused by name. */
static void test_ofi_fabric_host_memory_only(void **state)
{
    (void)state;
    kvs_ofi_config_t cfg;
    cfg_for(&cfg, "tcp");
    kvs_fabric_t *fab = NULL;
    assert_int_equal(kvs_ofi_fabric_create(&cfg, &fab, NULL), KVS_OK);
    kvs_host_device_t *host = NULL;
    assert_int_equal(kvs_host_device_create(NULL, &host, NULL), KVS_OK);
    static uint8_t mem[8192];
    kvs_mr_t *mr = NULL;
    uint64_t rkey = 0;
    assert_int_equal(fab->ops.mr_register(fab, kvs_host_device(host), (uint64_t)(uintptr_t)mem,
                                          sizeof mem, &mr, &rkey),
                     KVS_OK);
    assert_int_equal(fab->ops.mr_deregister(fab, mr), KVS_OK);
    kvs_device_t other = {.ops = {.name = "cuda"}, .name = "cuda:0"};
    mr = NULL;
    assert_int_equal(fab->ops.mr_register(fab, &other, (uint64_t)(uintptr_t)mem, sizeof mem,
                                          &mr, &rkey),
                     KVS_ENOTSUP);
    assert_null(mr);
    assert_non_null(strstr(fab->last_backend_msg, "cuda:0 is not the host device"));
    kvs_host_device_destroy(host);
    assert_int_equal(kvs_ofi_fabric_destroy(fab), KVS_OK);
}

#define BOTH(fn)                                                                         \
    cmocka_unit_test_prestate_setup_teardown(fn, prov_setup, NULL, (void *)"tcp"),       \
        cmocka_unit_test_prestate_setup_teardown(fn, prov_setup, NULL, (void *)"shm")

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ofi_fabric_unknown_provider_refused),
        cmocka_unit_test(test_ofi_fabric_host_memory_only),
        BOTH(test_ofi_fabric_messages_in_order),
        BOTH(test_ofi_fabric_write_with_data),
        BOTH(test_ofi_fabric_write_split),
        BOTH(test_ofi_fabric_error_fails_only_its_write),
        BOTH(test_ofi_fabric_peer_lost),
        BOTH(test_ofi_fabric_wait_fd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
