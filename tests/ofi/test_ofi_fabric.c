/*
 * test_ofi_fabric.c - the libfabric fabric on this machine's providers:
 * by default over tcp on 127.0.0.1, over shm, and over tcp with the
 * immediates of writes sent in IMM messages (the way of providers with
 * fewer than 8 bytes of remote CQ data, verbs;ofi_rxm and efa, forced on
 * tcp so that every machine runs it); KVS_OFI_PROVIDERS names others
 * ("verbs" in the rxe VM: test_ofi_fabric_verbs). Two fabrics in this
 * process connect through the TCP bootstrap, exchange control messages
 * both ways (in order, up to the largest size), write random data with
 * immediates (whole, and split by max_write_bytes and by registration
 * pieces) and check every byte; a write with a key the peer dropped (or
 * never gave) is refused alone, naming the key, while the connection
 * carries on; a peer that disconnects or is destroyed gives DISCONNECT in
 * bounded time; wait_arm's fd is quiet while nothing happens and readable
 * when a message arrives (shm, which has no such fd, gives a short wake
 * time). Once, on tcp: an unknown provider is refused with the list of
 * those offered here, another device's memory is refused by name.
 *
 * KVS_OFI_PROVIDERS: comma-separated providers, each optionally with
 * "+imm-msg" (force IMM messages); default "tcp,shm,tcp+imm-msg". The
 * fabrics bind to KVS_OFI_ADDR, else KVS_VERBS_ADDR (the rxe VM sets it),
 * else 127.0.0.1. A provider of the default list missing here (a
 * libfabric built without shm) is a skip in the test's body, said on
 * stderr; one named in KVS_OFI_PROVIDERS that is missing fails. Every wait
 * is bounded (KVS_TEST_WAIT_S, default 60 s): a hang fails the test.
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
#include "hw_ofi.h" /* imm_in_msg, to force IMM messages on tcp */
#include "xorshift.h"

#define MAX_CASES 8

/* What one run of the tests is on (main makes them from KVS_OFI_PROVIDERS). */
typedef struct ofi_case {
    char label[48];   /* "tcp", "tcp+imm-msg": names the run */
    char prov[32];    /* kvs_ofi_config_t.provider */
    bool imm_in_msg;  /* IMM messages even where the provider has 8 bytes of CQ data */
    bool required;    /* named in KVS_OFI_PROVIDERS: missing fails instead of skipping */
    const char *addr; /* bind_addr */
} ofi_case_t;

static void cfg_for(kvs_ofi_config_t *cfg, const ofi_case_t *oc)
{
    kvs_ofi_config_init(cfg);
    cfg->provider = oc->prov;
    cfg->bind_addr = oc->addr;
    cfg->connect_timeout_ms = 5000;
}

/* Whether libfabric offers oc's provider here; says so on stderr when it
 * does not, and fails the test when the provider was asked for. */
static bool offered(const ofi_case_t *oc)
{
    char list[256];
    (void)kvs_ofi_providers(list, sizeof list);
    for (char *t = strtok(list, ", "); t != NULL; t = strtok(NULL, ", "))
        if (strcmp(t, oc->prov) == 0)
            return true;
    if (oc->required)
        fail_msg("provider %s (KVS_OFI_PROVIDERS) is not offered here: %s", oc->prov, list);
    fprintf(stderr, "test_ofi_fabric: provider %s is not offered here: SKIPPED\n", oc->prov);
    return false;
}

/* The ofi fabrics' connect() waits for the peer's poll: nap 1 ms. */
static void nap(kvs_fabric_t *fab)
{
    (void)fab;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static void side_open(fp_side_t *s, const kvs_ofi_config_t *cfg, bool imm_in_msg)
{
    kvs_error_t err;
    kvs_fabric_t *fab = NULL;
    int rc = kvs_ofi_fabric_create(cfg, &fab, &err);
    if (rc != KVS_OK)
        fail_msg("kvs_ofi_fabric_create: %s: %s", kvs_status_name(rc), err.msg);
    if (imm_in_msg) /* the choice create makes for providers under 8 bytes */
        hw_ofi_of(fab)->imm_in_msg = true;
    fp_side_init(s, fab);
}

static void side_close(fp_side_t *s)
{
    if (s->fab != NULL)
        assert_int_equal(kvs_ofi_fabric_destroy(s->fab), KVS_OK);
    fp_side_fini(s);
}

/* b connects to a; one hello b -> a hands a its side of the connection. */
static void duo_open_cfg(fp_pair_t *d, const ofi_case_t *oc, const kvs_ofi_config_t *cfg)
{
    memset(d, 0, sizeof *d);
    d->name = oc->label;
    side_open(&d->a, cfg, oc->imm_in_msg);
    side_open(&d->b, cfg, oc->imm_in_msg);
    kvs_ofi_info_t info;
    assert_int_equal(kvs_ofi_fabric_info(d->a.fab, &info), KVS_OK);
    fp_pair_connect(d, info.address, nap);
}

static void duo_open(fp_pair_t *d, const ofi_case_t *oc)
{
    kvs_ofi_config_t cfg;
    cfg_for(&cfg, oc);
    duo_open_cfg(d, oc, &cfg);
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
    kvs_ofi_config_init(&cfg);
    cfg.provider = "nosuchprov";
    kvs_fabric_t *fab = NULL;
    kvs_error_t err;
    assert_int_equal(kvs_ofi_fabric_create(&cfg, &fab, &err), KVS_EINVAL);
    assert_null(fab);
    assert_non_null(strstr(err.msg, "nosuchprov"));
    assert_non_null(strstr(err.msg, "tcp"));
    const ofi_case_t shm = {.prov = "shm"};
    if (offered(&shm))
        assert_non_null(strstr(err.msg, "shm"));
    cfg.provider = "tcp;ofi_rxm";
    assert_int_equal(kvs_ofi_fabric_create(&cfg, &fab, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "provider name"));
}

static void test_ofi_fabric_messages_in_order(void **state)
{
    const ofi_case_t *oc = *state;
    if (!offered(oc))
        skip();
    fp_pair_t d;
    duo_open(&d, oc);
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
    const ofi_case_t *oc = *state;
    if (!offered(oc))
        skip();
    fp_pair_t d;
    duo_open(&d, oc);
    /* the way immediates travel: CQ data from 8 bytes up, else IMM messages */
    kvs_ofi_info_t info;
    assert_int_equal(kvs_ofi_fabric_info(d.b.fab, &info), KVS_OK);
    const bool in_msg = hw_ofi_of(d.b.fab)->imm_in_msg;
    assert_true(in_msg == (oc->imm_in_msg || info.cq_data_bytes < 8));
    fprintf(stderr, "test_ofi_fabric: %s: provider %s, %u bytes of CQ data: immediates %s\n",
            oc->label, info.provider, info.cq_data_bytes, in_msg ? "in messages" : "as CQ data");
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
    const ofi_case_t *oc = *state;
    if (!offered(oc))
        skip();
    kvs_ofi_config_t cfg;
    cfg_for(&cfg, oc);
    cfg.max_mr_bytes = 64u << 10;
    cfg.max_write_bytes = 24u << 10;
    fp_pair_t d;
    duo_open_cfg(&d, oc, &cfg);
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
    const ofi_case_t *oc = *state;
    if (!offered(oc))
        skip();
    fp_pair_t d;
    duo_open(&d, oc);
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
    const ofi_case_t *oc = *state;
    if (!offered(oc))
        skip();
    fp_pair_t d;
    /* a disconnect: the peer hears BYE */
    duo_open(&d, oc);
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
    duo_open(&d, oc);
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
    const ofi_case_t *oc = *state;
    if (!offered(oc))
        skip();
    fp_pair_t d;
    duo_open(&d, oc);
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
    const ofi_case_t tcp = {.prov = "tcp", .addr = "127.0.0.1"};
    kvs_ofi_config_t cfg;
    cfg_for(&cfg, &tcp);
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

/* Cases from KVS_OFI_PROVIDERS ("verbs", "tcp+imm-msg", ...); returns how many. */
static int cases_make(ofi_case_t *cases, int max)
{
    const char *env = getenv("KVS_OFI_PROVIDERS");
    const bool asked = env != NULL && env[0] != '\0';
    const char *addr = getenv("KVS_OFI_ADDR");
    if (addr == NULL || addr[0] == '\0')
        addr = getenv("KVS_VERBS_ADDR");
    if (addr == NULL || addr[0] == '\0')
        addr = "127.0.0.1";
    char list[256];
    snprintf(list, sizeof list, "%s", asked ? env : "tcp,shm,tcp+imm-msg");
    int n = 0;
    for (char *t = strtok(list, ", "); t != NULL && n < max; t = strtok(NULL, ", ")) {
        ofi_case_t *c = &cases[n++];
        *c = (ofi_case_t){.required = asked, .addr = addr};
        snprintf(c->label, sizeof c->label, "%s", t);
        char *plus = strchr(t, '+');
        if (plus != NULL) {
            if (strcmp(plus, "+imm-msg") != 0) {
                fprintf(stderr, "test_ofi_fabric: KVS_OFI_PROVIDERS entry '%s': the only "
                        "option is +imm-msg\n", t);
                return -1;
            }
            c->imm_in_msg = true;
            *plus = '\0';
        }
        snprintf(c->prov, sizeof c->prov, "%s", t);
    }
    return n;
}

int main(void)
{
    static ofi_case_t cases[MAX_CASES];
    const int ncases = cases_make(cases, MAX_CASES);
    if (ncases <= 0)
        return 1;
    static const struct {
        const char *name;
        CMUnitTestFunction fn;
    } per_case[] = {
        {"test_ofi_fabric_messages_in_order", test_ofi_fabric_messages_in_order},
        {"test_ofi_fabric_write_with_data", test_ofi_fabric_write_with_data},
        {"test_ofi_fabric_write_split", test_ofi_fabric_write_split},
        {"test_ofi_fabric_error_fails_only_its_write", test_ofi_fabric_error_fails_only_its_write},
        {"test_ofi_fabric_peer_lost", test_ofi_fabric_peer_lost},
        {"test_ofi_fabric_wait_fd", test_ofi_fabric_wait_fd},
    };
    enum { PER_CASE = sizeof per_case / sizeof per_case[0] };
    static struct CMUnitTest tests[2 + MAX_CASES * PER_CASE];
    static char names[MAX_CASES * PER_CASE][112];
    size_t n = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_ofi_fabric_unknown_provider_refused);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_ofi_fabric_host_memory_only);
    for (int c = 0; c < ncases; c++) {
        for (size_t k = 0; k < PER_CASE; k++) {
            char *name = names[c * PER_CASE + k];
            snprintf(name, sizeof names[0], "%s/%s", per_case[k].name, cases[c].label);
            tests[n++] = (struct CMUnitTest){.name = name, .test_func = per_case[k].fn,
                                             .setup_func = prov_setup,
                                             .initial_state = &cases[c]};
        }
    }
    return _cmocka_run_group_tests("test_ofi_fabric", tests, n, NULL, NULL);
}
