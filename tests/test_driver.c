/*
 * test_driver.c - the rank driver (hw/driver/, kvstage/driver.h) on real
 * threads and a real clock, with no RDMA hardware: ranks on the host device
 * (hw/host) over a loopback fabric written here ("loop": endpoints in one
 * process, writes are memcpy, messages are queued, and each endpoint's wait
 * fd is an eventfd written when a completion is queued while it is armed).
 *
 * What it checks: a prefill and a decode rank, each on its driver's
 * progress thread, move rooms that the test's thread opens and computes
 * while the drivers step (the rank's lock), every byte checked; start, stop
 * and their refusals (twice, from on_result, progress and wait while the
 * thread runs); kvs_driver_wait in the caller's loop wakes on a message
 * (the fabric's fd), on a copy (the device's fd), on a call from another
 * thread (not on the loop's own calls; none is lost while another thread
 * calls without pause, the race that once left the progress thread asleep
 * through kvs_driver_stop) and at the rank's deadline (a room's stall
 * timeout), and a
 * fabric without wait_arm (a version-1 table) is polled on
 * poll_interval_ns. No spinning: over 200 ms with nothing to do, a driver
 * sleeps a handful of times (wake-ups are counted; nothing here asserts
 * how fast anything is).
 */
#include <kvstage/driver.h>
#include <kvstage/host.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvdata.h"

/* ---- the loopback fabric ---------------------------------------------------- */

#define LOOP_QCAP 4096
#define LOOP_MRS 16
#define LOOP_CONNS 8
#define LOOP_EPS 4

typedef struct loop_hub loop_hub_t;
typedef struct loop_ep loop_ep_t;

typedef struct loop_mr {
    uint64_t addr, len;
    bool live;
} loop_mr_t;

typedef struct loop_conn {
    loop_ep_t *ep;
    struct loop_conn *peer;
    bool live;
} loop_conn_t;

struct loop_ep {
    kvs_fabric_t base; /* first */
    loop_hub_t *hub;
    char name[16];
    kvs_completion_t *q; /* LOOP_QCAP, a ring */
    int head, n;
    loop_conn_t conns[LOOP_CONNS];
    loop_mr_t mrs[LOOP_MRS];
    int fd;     /* eventfd */
    bool armed;
};

struct loop_hub {
    pthread_mutex_t mu; /* guards every endpoint's queue, conns and armed flag */
    loop_ep_t *eps[LOOP_EPS];
    int n;
};

static loop_ep_t *loop_of(kvs_fabric_t *f) { return KVS_CONTAINER_OF(f, loop_ep_t, base); }

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Queues c on e and writes its eventfd if it is armed. hub->mu held. */
static void loop_push(loop_ep_t *e, const kvs_completion_t *c)
{
    assert_true(e->n < LOOP_QCAP);
    e->q[(e->head + e->n) % LOOP_QCAP] = *c;
    e->n++;
    if (e->armed) {
        e->armed = false;
        const uint64_t one = 1;
        assert_int_equal(write(e->fd, &one, sizeof one), (ssize_t)sizeof one);
    }
}

static int loop_mr_register(kvs_fabric_t *f, kvs_device_t *dev, uint64_t addr, uint64_t len,
                            kvs_mr_t **out, uint64_t *rkey)
{
    loop_ep_t *e = loop_of(f);
    for (int i = 0; i < LOOP_MRS; i++)
        if (!e->mrs[i].live) {
            e->mrs[i] = (loop_mr_t){.addr = addr, .len = len, .live = true};
            *out = (kvs_mr_t *)(void *)&e->mrs[i];
            *rkey = (uint64_t)i + 1;
            return KVS_OK;
        }
    return kvs_fabric_fail(f, KVS_EFULL, 0, "loop: more than %d registrations", LOOP_MRS);
}

static int loop_mr_deregister(kvs_fabric_t *f, kvs_mr_t *mr)
{
    ((loop_mr_t *)(void *)mr)->live = false;
    return KVS_OK;
}

static int loop_connect(kvs_fabric_t *f, const char *peer, kvs_conn_t **out)
{
    loop_ep_t *e = loop_of(f);
    loop_hub_t *h = e->hub;
    pthread_mutex_lock(&h->mu);
    loop_ep_t *to = NULL;
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->eps[i]->name, peer) == 0)
            to = h->eps[i];
    loop_conn_t *a = NULL, *b = NULL;
    for (int i = 0; to != NULL && i < LOOP_CONNS; i++) {
        if (a == NULL && !e->conns[i].live)
            a = &e->conns[i];
        else if (b == NULL && !to->conns[i].live && &to->conns[i] != a)
            b = &to->conns[i];
    }
    if (a == NULL || b == NULL) {
        pthread_mutex_unlock(&h->mu);
        return kvs_fabric_fail(f, KVS_EPEER, 0, "loop: no endpoint '%s' or no free "
                               "connection", peer);
    }
    *a = (loop_conn_t){.ep = e, .peer = b, .live = true};
    *b = (loop_conn_t){.ep = to, .peer = a, .live = true};
    pthread_mutex_unlock(&h->mu);
    *out = (kvs_conn_t *)(void *)a;
    return KVS_OK;
}

static void loop_disconnect(kvs_fabric_t *f, kvs_conn_t *conn)
{
    loop_ep_t *e = loop_of(f);
    pthread_mutex_lock(&e->hub->mu);
    loop_conn_t *c = (loop_conn_t *)(void *)conn;
    if (c->live && c->peer->live)
        loop_push(c->peer->ep, &(kvs_completion_t){.kind = KVS_COMPLETION_DISCONNECT,
                                                   .status = KVS_EPEER,
                                                   .conn = (kvs_conn_t *)(void *)c->peer});
    if (c->live)
        c->peer->live = false; /* the peer's side is dead too: its slot may be reused */
    c->live = false;
    pthread_mutex_unlock(&e->hub->mu);
}

static int loop_write(kvs_fabric_t *f, kvs_conn_t *conn, const kvs_write_desc_t *w)
{
    loop_ep_t *e = loop_of(f);
    pthread_mutex_lock(&e->hub->mu);
    loop_conn_t *c = (loop_conn_t *)(void *)conn;
    int st = KVS_EPEER;
    if (c->live && c->peer->live) {
        const loop_ep_t *to = c->peer->ep;
        const uint64_t k = w->rkey - 1;
        st = KVS_EREMOTE;
        if (k < LOOP_MRS && to->mrs[k].live && w->remote_addr >= to->mrs[k].addr &&
            w->len_bytes <= to->mrs[k].len - (w->remote_addr - to->mrs[k].addr)) {
            memcpy((void *)(uintptr_t)w->remote_addr, (const void *)(uintptr_t)w->local_addr,
                   (size_t)w->len_bytes);
            st = KVS_OK;
            if (w->with_imm)
                loop_push(c->peer->ep, &(kvs_completion_t){
                                           .kind = KVS_COMPLETION_IMM, .imm = w->imm,
                                           .conn = (kvs_conn_t *)(void *)c->peer});
        }
    }
    loop_push(e, &(kvs_completion_t){.kind = KVS_COMPLETION_WRITE, .status = st,
                                     .wr_id = w->wr_id, .conn = conn});
    pthread_mutex_unlock(&e->hub->mu);
    return KVS_OK;
}

static int loop_send(kvs_fabric_t *f, kvs_conn_t *conn, const void *msg, uint32_t len,
                     uint64_t wr_id)
{
    loop_ep_t *e = loop_of(f);
    if (len > KVS_CONTROL_MSG_MAX_BYTES)
        return kvs_fabric_fail(f, KVS_EINVAL, 0, "loop: message of %u bytes", len);
    pthread_mutex_lock(&e->hub->mu);
    loop_conn_t *c = (loop_conn_t *)(void *)conn;
    const bool up = c->live && c->peer->live;
    if (up) {
        kvs_completion_t r = {.kind = KVS_COMPLETION_RECV, .status = KVS_OK,
                              .conn = (kvs_conn_t *)(void *)c->peer, .len_bytes = len};
        memcpy(r.msg, msg, len);
        loop_push(c->peer->ep, &r);
    }
    loop_push(e, &(kvs_completion_t){.kind = KVS_COMPLETION_SEND,
                                     .status = up ? KVS_OK : KVS_EPEER, .wr_id = wr_id,
                                     .conn = conn});
    pthread_mutex_unlock(&e->hub->mu);
    return KVS_OK;
}

static int loop_poll(kvs_fabric_t *f, kvs_completion_t *out, int max)
{
    loop_ep_t *e = loop_of(f);
    pthread_mutex_lock(&e->hub->mu);
    int got = 0;
    for (; got < max && e->n > 0; got++) {
        out[got] = e->q[e->head];
        e->head = (e->head + 1) % LOOP_QCAP;
        e->n--;
    }
    pthread_mutex_unlock(&e->hub->mu);
    return got;
}

static uint64_t loop_now_ns(kvs_fabric_t *f) { return mono_ns(); }

static int loop_wait_arm(kvs_fabric_t *f, int *out_fd, uint64_t *out_wake_ns)
{
    loop_ep_t *e = loop_of(f);
    pthread_mutex_lock(&e->hub->mu);
    uint64_t count;
    (void)!read(e->fd, &count, sizeof count);
    e->armed = true;
    pthread_mutex_unlock(&e->hub->mu);
    *out_fd = e->fd;
    *out_wake_ns = UINT64_MAX;
    return KVS_OK;
}

static const kvs_fabric_ops_t loop_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    .name = "loop",
    .caps = KVS_FABRIC_CAP_WRITE_IMM | KVS_FABRIC_CAP_PER_LAYER_WRITES,
    .mr_register = loop_mr_register,
    .mr_deregister = loop_mr_deregister,
    .connect = loop_connect,
    .disconnect = loop_disconnect,
    .write = loop_write,
    .send = loop_send,
    .poll = loop_poll,
    .now_ns = loop_now_ns,
    .wait_arm = loop_wait_arm,
};

/* An endpoint of h; without wait_arm, its table is of version 1 (which
 * ends at now_ns), as a backend written before the slot would be. */
static loop_ep_t *loop_open(loop_hub_t *h, const char *name, bool with_wait)
{
    kvs_fabric_ops_t ops = loop_ops;
    if (!with_wait) {
        ops.version = 1;
        ops.size = offsetof(kvs_fabric_ops_t, wait_arm);
        ops.wait_arm = NULL;
    }
    loop_ep_t *e = calloc(1, sizeof *e);
    assert_non_null(e);
    e->q = calloc(LOOP_QCAP, sizeof *e->q);
    assert_non_null(e->q);
    e->hub = h;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert_true(e->fd >= 0);
    assert_int_equal(kvs_fabric_init(&e->base, &ops, e->name), KVS_OK);
    pthread_mutex_lock(&h->mu);
    assert_true(h->n < LOOP_EPS);
    h->eps[h->n++] = e;
    pthread_mutex_unlock(&h->mu);
    return e;
}

/* Leaves the hub: its connections die for the peers (who read only their
 * own side's live flag first, never the freed one). */
static void loop_close(loop_ep_t *e)
{
    loop_hub_t *h = e->hub;
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < LOOP_CONNS; i++)
        if (e->conns[i].live) {
            e->conns[i].peer->live = false;
            e->conns[i].live = false;
        }
    for (int i = 0; i < h->n; i++)
        if (h->eps[i] == e)
            h->eps[i] = h->eps[--h->n];
    pthread_mutex_unlock(&h->mu);
    close(e->fd);
    free(e->q);
    free(e);
}

/* ---- ranks on the host device ------------------------------------------------- */

#define HEADS 2
#define HEAD_DIM 64
#define ELEM 2
#define LAYERS 2
#define PAGE 16
#define POOL_PAGES 64
#define HEAD_BYTES (HEAD_DIM * ELEM)
#define LAYER_BYTES ((uint64_t)POOL_PAGES * PAGE * HEADS * HEAD_BYTES)

typedef struct node {
    kvs_role_t role;
    kvs_host_device_t *host;
    kvs_device_t *dev;
    loop_ep_t *ep;
    uint64_t pool;  /* [K0 | V0 | K1 | V1], LAYER_BYTES each */
    uint8_t *pool_host;
    kvs_rank_t *rank;
    kvs_driver_t *drv;
} node_t;

/* The results one node's driver handed out, for the test's thread. */
typedef struct inbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvs_room_result_t res[64];
    int n;
    kvs_driver_t *drv;  /* to try a stop from on_result */
    int stop_rc;        /* what that stop returned (1: not tried yet) */
} inbox_t;

static void inbox_init(inbox_t *b)
{
    memset(b, 0, sizeof *b);
    assert_int_equal(pthread_mutex_init(&b->mu, NULL), 0);
    assert_int_equal(pthread_cond_init(&b->cv, NULL), 0);
    b->stop_rc = 1;
}

static void inbox_fini(inbox_t *b)
{
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
}

static void on_result(void *ctx, const kvs_room_result_t *res)
{
    inbox_t *b = ctx;
    int stop_rc = 1;
    if (b->drv != NULL && b->stop_rc == 1) /* only this thread writes stop_rc */
        stop_rc = kvs_driver_stop(b->drv);
    pthread_mutex_lock(&b->mu);
    if (stop_rc != 1)
        b->stop_rc = stop_rc;
    assert_true(b->n < 64);
    b->res[b->n++] = *res;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Waits until the inbox holds n results; fails after 60 s (a hang). */
static void inbox_wait(inbox_t *b, int n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&b->mu);
    while (b->n < n) {
        const int rc = pthread_cond_timedwait(&b->cv, &b->mu, &until);
        if (rc == ETIMEDOUT) {
            pthread_mutex_unlock(&b->mu);
            fail_msg("%d of %d results after 60 s", b->n, n);
        }
    }
    pthread_mutex_unlock(&b->mu);
}

/* The ranks' log: dropped (a peer's connection dies at every teardown). */
static void quiet(void *user, kvs_log_level_t level, const char *msg) {}

static kvs_manager_config_t node_cfg(kvs_role_t role, uint64_t stall_ns)
{
    return (kvs_manager_config_t){
        .role = role, .staging = true, .path = KVS_PATH_STAGING, .total_heads = HEADS,
        .head_dim = HEAD_DIM, .dtype = KVS_DTYPE_BF16, .layers = LAYERS, .page_size = PAGE,
        .tp_rank = 0, .tp_size = 1, .pp_rank = 0, .pp_size = 1, .peer_tp_size = 1,
        .chunk_tokens = 64, .ring_bytes = 4u << 20, .stall_timeout_ns = stall_ns,
        .log = {.fn = quiet, .level = KVS_LOG_ERROR}};
}

static void node_open(node_t *n, loop_hub_t *h, kvs_role_t role, const char *name,
                      bool with_wait, uint64_t stall_ns, inbox_t *box)
{
    memset(n, 0, sizeof *n);
    n->role = role;
    kvs_error_t err;
    const kvs_host_config_t hc = {.name = name};
    assert_int_equal(kvs_host_device_create(&hc, &n->host, &err), KVS_OK);
    n->dev = kvs_host_device(n->host);
    n->ep = loop_open(h, name, with_wait);
    assert_int_equal(n->dev->ops.mem_alloc(n->dev, 2 * LAYERS * LAYER_BYTES, &n->pool), KVS_OK);
    n->pool_host = kvs_host_ptr(n->dev, n->pool, 2 * LAYERS * LAYER_BYTES);
    assert_non_null(n->pool_host);
    kvs_kv_layer_t layers[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        layers[l] = (kvs_kv_layer_t){.k_addr = n->pool + (uint64_t)(2 * l) * LAYER_BYTES,
                                     .v_addr = n->pool + (uint64_t)(2 * l + 1) * LAYER_BYTES,
                                     .tokens = POOL_PAGES * PAGE,
                                     .token_stride_bytes = HEADS * HEAD_BYTES,
                                     .head_stride_bytes = HEAD_BYTES,
                                     .elem_stride_bytes = ELEM};
    const kvs_rank_config_t rc = {.manager = node_cfg(role, stall_ns), .layers = layers,
                                  .local_heads = HEADS};
    const int st = kvs_rank_create(&rc, n->dev, &n->ep->base, &n->rank, &err);
    if (st != KVS_OK)
        fail_msg("kvs_rank_create (%s): %s: %s", name, kvs_status_name(st), err.msg);
    const kvs_driver_config_t dc = {.rank = n->rank, .dev = n->dev, .fab = &n->ep->base,
                                    .on_result = box != NULL ? on_result : NULL, .ctx = box,
                                    .poll_interval_ns = 50000000u};
    assert_int_equal(kvs_driver_create(&dc, &n->drv, &err), KVS_OK);
}

static void node_close(node_t *n)
{
    kvs_driver_destroy(n->drv);
    kvs_rank_destroy(n->rank);
    assert_int_equal(n->dev->ops.mem_free(n->dev, n->pool), KVS_OK);
    kvs_host_device_destroy(n->host);
    loop_close(n->ep);
}

/* Pages of room i: its own run of the pool, reversed on the prefill. */
static void room_pages(const node_t *n, uint32_t i, int64_t tokens, int64_t *pages)
{
    const int64_t np = (tokens + PAGE - 1) / PAGE;
    for (int64_t j = 0; j < np; j++)
        pages[j] = (int64_t)i * 8 + (n->role == KVS_ROLE_PREFILL ? np - 1 - j : j);
}

/* Fills (prefill) or checks (decode: returns the bad bytes) room i's KV. */
static uint64_t room_data(node_t *n, uint32_t i, int64_t tokens, bool check)
{
    int64_t pages[8];
    room_pages(n, i, tokens, pages);
    uint64_t bad = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int64_t t = 0; t < tokens; t++)
                for (int h = 0; h < HEADS; h++) {
                    const sim_kv_coord_t at = {i, l, kv, h, t};
                    const uint64_t slot = (uint64_t)(pages[t / PAGE] * PAGE + t % PAGE);
                    uint8_t *p = n->pool_host + (uint64_t)(2 * l + kv) * LAYER_BYTES +
                                 (slot * HEADS + (uint64_t)h) * HEAD_BYTES;
                    if (check)
                        bad += sim_kvdata_check(p, HEAD_BYTES, &at);
                    else
                        sim_kvdata_fill(p, HEAD_BYTES, &at);
                }
    return bad;
}

static void open_room(node_t *n, uint32_t i, int64_t tokens)
{
    int64_t pages[8];
    room_pages(n, i, tokens, pages);
    const kvs_room_desc_t d = {.room = i, .peer = {0, 0}, .total_tokens = tokens,
                               .pages = pages, .num_pages = (tokens + PAGE - 1) / PAGE};
    const int rc = kvs_rank_open_room(n->rank, &d);
    if (rc != KVS_OK)
        fail_msg("open room %u on the %s: %s", i, n->role == KVS_ROLE_DECODE ? "decode"
                                                                              : "prefill",
                 kvs_rank_last_error(n->rank)->msg);
}

/* Decode n declares prefill instance 0 at `addr` and registers with it. */
static void decode_connect(node_t *n, const char *addr)
{
    const char *addrs[1] = {addr};
    assert_int_equal(kvs_rank_add_instance(n->rank, &(kvs_instance_desc_t){
                                                        .id = 0, .tp_size = 1, .pp_size = 1,
                                                        .addrs = addrs}),
                     KVS_OK);
    assert_int_equal(kvs_rank_connect(n->rank, (kvs_peer_t){0, 0}), KVS_OK);
}

static void stats_of(node_t *n, kvs_driver_stats_t *s) { kvs_driver_stats(n->drv, s); }

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- tests ------------------------------------------------------------------- */

static loop_hub_t *hub_new(void)
{
    loop_hub_t *h = calloc(1, sizeof *h);
    assert_non_null(h);
    assert_int_equal(pthread_mutex_init(&h->mu, NULL), 0);
    return h;
}

static void hub_free(loop_hub_t *h)
{
    pthread_mutex_destroy(&h->mu);
    free(h);
}

static void test_driver_create_arguments(void **state)
{
    kvs_error_t err;
    kvs_driver_t *d = (kvs_driver_t *)(uintptr_t)1;
    assert_int_equal(kvs_driver_create(NULL, &d, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "pass the rank and the device and fabric"));
    const kvs_driver_config_t none = {0};
    assert_int_equal(kvs_driver_create(&none, &d, &err), KVS_EINVAL);
    assert_int_equal(kvs_driver_create(&none, NULL, NULL), KVS_EINVAL);
    kvs_driver_destroy(NULL);
    assert_int_equal(kvs_driver_start(NULL), KVS_EINVAL);
    assert_int_equal(kvs_driver_stop(NULL), KVS_EINVAL);
    assert_int_equal(kvs_driver_progress(NULL), KVS_EINVAL);
    assert_int_equal(kvs_driver_wait(NULL, 0), KVS_EINVAL);
    assert_false(kvs_driver_running(NULL));
    assert_null(kvs_driver_last_error(NULL));
    kvs_driver_wake(NULL);
}

/* Both ranks on their drivers' threads; this thread opens and computes the
 * rooms while they step (every call through the rank's lock), then checks
 * every byte, the thread rules and that idle drivers sleep. */
static void test_driver_threads_move_rooms_opened_from_another_thread(void **state)
{
    loop_hub_t *h = hub_new();
    inbox_t pbox, dbox;
    inbox_init(&pbox);
    inbox_init(&dbox);
    node_t pre, dec;
    node_open(&pre, h, KVS_ROLE_PREFILL, "p0", true, 0, &pbox);
    node_open(&dec, h, KVS_ROLE_DECODE, "d0", true, 0, &dbox);
    dbox.drv = dec.drv; /* the decode's first result tries a stop from on_result */

    assert_int_equal(kvs_driver_start(pre.drv), KVS_OK);
    assert_int_equal(kvs_driver_start(dec.drv), KVS_OK);
    assert_true(kvs_driver_running(dec.drv));
    assert_int_equal(kvs_driver_start(dec.drv), KVS_EALREADY);
    assert_non_null(strstr(kvs_driver_last_error(dec.drv)->msg, "stop it before"));
    assert_int_equal(kvs_driver_progress(dec.drv), KVS_ESTATE);
    assert_int_equal(kvs_driver_wait(dec.drv, 0), KVS_ESTATE);
    assert_non_null(strstr(kvs_driver_last_error(dec.drv)->msg, "stop it first"));

    decode_connect(&dec, "p0");
    enum { ROOMS = 6 };
    const int64_t tokens[ROOMS] = {100, 16, 128, 1, 77, 64};
    for (uint32_t i = 0; i < ROOMS; i++) {
        room_data(&pre, i, tokens[i], false);
        open_room(&dec, i, tokens[i]);
        open_room(&pre, i, tokens[i]);
        assert_int_equal(kvs_rank_computed(pre.rank, i, tokens[i], true), KVS_OK);
    }
    inbox_wait(&pbox, ROOMS);
    inbox_wait(&dbox, ROOMS);
    for (int k = 0; k < ROOMS; k++) {
        const kvs_room_result_t *r = &dbox.res[k];
        if (r->status != KVS_OK || pbox.res[k].status != KVS_OK)
            fail_msg("room %llu: decode %s, prefill %s", (unsigned long long)r->room,
                     kvs_status_name(r->status), kvs_status_name(pbox.res[k].status));
        assert_int_equal(room_data(&dec, (uint32_t)r->room, tokens[r->room], true), 0);
    }
    /* on_result runs on the driver's thread: stop is refused there. */
    assert_int_equal(dbox.stop_rc, KVS_ESTATE);

    /* Which source woke each side here depends on how the threads ran
     * (on a loaded machine a copy can finish before its driver sleeps, or
     * a retransmission deadline come first), so it is not asserted: the
     * wait_wakes_on_* tests below check each wake source alone. */
    kvs_driver_stats_t ps, ds;
    stats_of(&pre, &ps);
    stats_of(&dec, &ds);
    assert_int_equal(ds.results, ROOMS);
    assert_int_equal(ps.results, ROOMS);

    /* Nothing to do for 200 ms: each driver sleeps a handful of times, it
     * does not spin (counted, not timed). The last acknowledgements and
     * retransmissions may still be settling on a loaded machine, so up to
     * 5 windows are watched: a spinning driver steps thousands of times in
     * every one of them, a settled one a handful. */
    kvs_driver_stats_t ps2, ds2;
    bool quiet = false;
    for (int window = 0; window < 5 && !quiet; window++) {
        sleep_ms(50);
        stats_of(&pre, &ps);
        stats_of(&dec, &ds);
        sleep_ms(200);
        stats_of(&pre, &ps2);
        stats_of(&dec, &ds2);
        print_message("idle 200 ms: prefill %llu steps %llu sleeps, decode %llu steps %llu "
                      "sleeps\n",
                      (unsigned long long)(ps2.steps - ps.steps),
                      (unsigned long long)(ps2.sleeps - ps.sleeps),
                      (unsigned long long)(ds2.steps - ds.steps),
                      (unsigned long long)(ds2.sleeps - ds.sleeps));
        quiet = ps2.sleeps - ps.sleeps <= 5 && ds2.sleeps - ds.sleeps <= 5 &&
                ps2.steps - ps.steps <= 10 && ds2.steps - ds.steps <= 10;
    }
    if (!quiet)
        fail_msg("idle drivers spin: prefill %llu steps, decode %llu steps in 200 ms",
                 (unsigned long long)(ps2.steps - ps.steps),
                 (unsigned long long)(ds2.steps - ds.steps));

    assert_int_equal(kvs_driver_stop(dec.drv), KVS_OK);
    assert_false(kvs_driver_running(dec.drv));
    assert_int_equal(kvs_driver_stop(dec.drv), KVS_OK); /* not running: nothing to do */
    /* Stopped, it can be started again, and destroy stops it. */
    assert_int_equal(kvs_driver_start(dec.drv), KVS_OK);
    kvs_driver_destroy(dec.drv);
    dec.drv = NULL;
    assert_int_equal(kvs_driver_stop(pre.drv), KVS_OK);
    node_close(&dec);
    node_close(&pre);
    inbox_fini(&pbox);
    inbox_fini(&dbox);
    hub_free(h);
}

typedef struct sender {
    loop_ep_t *ep;
    const char *to;
} sender_t;

/* Another process's rank, as far as the fabric goes: connects and sends. */
static void *send_hello(void *arg)
{
    sender_t *s = arg;
    kvs_conn_t *c = NULL;
    assert_int_equal(s->ep->base.ops.connect(&s->ep->base, s->to, &c), KVS_OK);
    assert_int_equal(s->ep->base.ops.send(&s->ep->base, c, "hello", 5, 1), KVS_OK);
    return NULL;
}

/* The caller's loop: progress until the rank is idle and armed. */
static void settle(node_t *n)
{
    for (int i = 0; i < 100; i++)
        if (kvs_driver_progress(n->drv) == 0 && kvs_driver_wait(n->drv, 0) == KVS_EAGAIN)
            return;
    fail_msg("the rank did not settle in 100 steps");
}

static void test_driver_wait_wakes_on_a_message(void **state)
{
    loop_hub_t *h = hub_new();
    node_t pre;
    node_open(&pre, h, KVS_ROLE_PREFILL, "p0", true, 0, NULL);
    loop_ep_t *other = loop_open(h, "x", true);
    settle(&pre);
    kvs_driver_stats_t a, b;
    stats_of(&pre, &a);
    /* A message from another thread: wait wakes on the fabric's fd, long
     * before its 60 s limit (which would count as a timeout). */
    sender_t s = {.ep = other, .to = "p0"};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, send_hello, &s), 0);
    assert_int_equal(kvs_driver_wait(pre.drv, 60000000000u), KVS_OK);
    pthread_join(t, NULL);
    stats_of(&pre, &b);
    assert_int_equal(b.wakes_fabric - a.wakes_fabric, 1);
    assert_int_equal(b.wakes_timeout - a.wakes_timeout, 0);
    assert_int_equal(b.sleeps - a.sleeps, 1);
    assert_true(kvs_driver_progress(pre.drv) > 0); /* the message (a stranger's) */

    /* Then 200 ms with nothing: a few sleeps, the last one the timeout. */
    settle(&pre);
    stats_of(&pre, &a);
    const uint64_t until = mono_ns() + 200000000u;
    int rc = KVS_OK;
    while (rc == KVS_OK && mono_ns() < until) {
        rc = kvs_driver_wait(pre.drv, until - mono_ns());
        if (rc == KVS_OK)
            (void)kvs_driver_progress(pre.drv);
    }
    stats_of(&pre, &b);
    print_message("idle 200 ms in the caller's loop: %llu sleeps, %llu steps\n",
                  (unsigned long long)(b.sleeps - a.sleeps),
                  (unsigned long long)(b.steps - a.steps));
    if (b.sleeps - a.sleeps > 4 || b.steps - a.steps > 8)
        fail_msg("an idle rank's wait spins: %llu sleeps, %llu steps in 200 ms",
                 (unsigned long long)(b.sleeps - a.sleeps),
                 (unsigned long long)(b.steps - a.steps));
    node_close(&pre);
    loop_close(other);
    hub_free(h);
}

static void test_driver_wait_wakes_on_a_copy(void **state)
{
    loop_hub_t *h = hub_new();
    node_t pre;
    node_open(&pre, h, KVS_ROLE_PREFILL, "p0", true, 0, NULL);
    /* A copy on the rank's device that the rank did not ask for: its
     * completion makes the device's fd readable all the same. */
    kvs_stream_t *s = NULL;
    assert_int_equal(pre.dev->ops.stream_create(pre.dev, &s), KVS_OK);
    const uint64_t k[1] = {pre.pool}, v[1] = {pre.pool + LAYER_BYTES};
    const int64_t pages[1] = {0};
    const kvs_copy_desc_t desc = {.k_base = k, .v_base = v, .local_heads = HEADS,
                                  .head_dim = HEAD_DIM, .elem_bytes = ELEM,
                                  .page_size = PAGE, .pages = pages, .num_pages = 1,
                                  .tokens = PAGE, .head_start = 0, .num_heads = HEADS,
                                  .layer_begin = 0, .layer_count = 1,
                                  .staging_slot_begin = 0, .staging_layer_slots = 1,
                                  .staging_addr = pre.pool + 2 * LAYER_BYTES};
    settle(&pre);
    kvs_driver_stats_t a, b;
    stats_of(&pre, &a);
    assert_int_equal(pre.dev->ops.gather(pre.dev, s, &desc), KVS_OK);
    assert_int_equal(kvs_driver_wait(pre.drv, 60000000000u), KVS_OK);
    stats_of(&pre, &b);
    assert_int_equal(b.wakes_device - a.wakes_device, 1);
    assert_int_equal(b.wakes_timeout - a.wakes_timeout, 0);
    pre.dev->ops.stream_destroy(pre.dev, s);
    node_close(&pre);
    hub_free(h);
}

static void *wake_it(void *arg)
{
    kvs_driver_wake(arg);
    return NULL;
}

static void *stats_call(void *arg)
{
    kvs_handler_stats_t st;
    kvs_rank_stats(arg, &st); /* any rank call from another thread */
    return NULL;
}

static void test_driver_wait_wakes_on_a_call_from_another_thread(void **state)
{
    loop_hub_t *h = hub_new();
    node_t pre;
    node_open(&pre, h, KVS_ROLE_PREFILL, "p0", true, 0, NULL);
    kvs_driver_stats_t a, b;
    void *(*fns[2])(void *) = {wake_it, stats_call};
    void *args[2] = {pre.drv, pre.rank};
    for (int i = 0; i < 2; i++) {
        settle(&pre);
        stats_of(&pre, &a);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, fns[i], args[i]), 0);
        assert_int_equal(kvs_driver_wait(pre.drv, 60000000000u), KVS_OK);
        pthread_join(t, NULL);
        stats_of(&pre, &b);
        assert_int_equal(b.wakes_call - a.wakes_call, 1);
        assert_int_equal(b.wakes_timeout - a.wakes_timeout, 0);
    }
    /* The loop's own calls wake nothing (it steps after them anyway): a
     * wait right after one runs out. */
    settle(&pre);
    stats_of(&pre, &a);
    kvs_handler_stats_t st;
    kvs_rank_stats(pre.rank, &st);
    assert_int_equal(kvs_driver_wait(pre.drv, 1000000u), KVS_EAGAIN);
    stats_of(&pre, &b);
    assert_int_equal(b.wakes_call - a.wakes_call, 0);
    assert_int_equal(b.wakes_timeout - a.wakes_timeout, 1);
    node_close(&pre);
    hub_free(h);
}

/* The other thread of test_driver_no_call_is_lost: rank calls, one after
 * another, until stopped. */
typedef struct caller {
    kvs_rank_t *rank;
    atomic_bool stop;
} caller_t;

static void *call_until_stopped(void *arg)
{
    caller_t *c = arg;
    while (!atomic_load(&c->stop)) {
        kvs_handler_stats_t st;
        kvs_rank_stats(c->rank, &st);
    }
    return NULL;
}

/* While another thread makes call after call, the loop's every wait must
 * end within a call or two: a call that lands while the loop's thread takes
 * the previous wake-up (between clearing the pending flag and draining the
 * eventfd) must not leave the flag set with nothing to read, or no later
 * call writes the eventfd and the wait sleeps through them all. The wait's
 * time-out is far beyond any call, so a lost wake-up shows as a wait that
 * ran out (KVS_EAGAIN) instead of a hang. Many rounds: the window is a few
 * instructions wide. */
static void test_driver_no_call_is_lost(void **state)
{
    loop_hub_t *h = hub_new();
    node_t pre;
    node_open(&pre, h, KVS_ROLE_PREFILL, "p0", true, 0, NULL);
    settle(&pre);
    caller_t c = {.rank = pre.rank};
    atomic_init(&c.stop, false);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, call_until_stopped, &c), 0);
    int lost = 0;
    for (int round = 1; round <= 20000 && lost == 0; round++)
        if (kvs_driver_progress(pre.drv) < 0 ||
            kvs_driver_wait(pre.drv, 5000000000u) == KVS_EAGAIN)
            lost = round;
    atomic_store(&c.stop, true);
    pthread_join(t, NULL);
    kvs_driver_stats_t st;
    stats_of(&pre, &st);
    node_close(&pre);
    hub_free(h);
    if (lost != 0)
        fail_msg("round %d: the loop's wait slept 5 s through another thread's calls "
                 "(%llu sleeps, %llu woken by a call)", lost,
                 (unsigned long long)st.sleeps, (unsigned long long)st.wakes_call);
}

static void test_driver_wait_wakes_at_the_rank_deadline(void **state)
{
    loop_hub_t *h = hub_new();
    inbox_t box;
    inbox_init(&box);
    node_t pre;
    /* A room no decode ever asks for fails on its stall timeout: nothing
     * but the rank's deadline can wake the wait for it. */
    node_open(&pre, h, KVS_ROLE_PREFILL, "p0", true, 50000000u, &box);
    open_room(&pre, 0, 32);
    kvs_driver_stats_t a, b;
    stats_of(&pre, &a);
    int turns = 0;
    while (box.n == 0 && turns++ < 100) {
        (void)kvs_driver_progress(pre.drv);
        if (box.n == 0)
            assert_int_equal(kvs_driver_wait(pre.drv, 60000000000u), KVS_OK);
    }
    stats_of(&pre, &b);
    assert_int_equal(box.n, 1);
    assert_int_equal(box.res[0].status, KVS_ETIMEDOUT);
    assert_true(b.wakes_deadline - a.wakes_deadline >= 1);
    assert_int_equal(b.wakes_timeout - a.wakes_timeout, 0);
    assert_true(b.sleeps - a.sleeps <= 6);
    node_close(&pre);
    inbox_fini(&box);
    hub_free(h);
}

static void test_driver_polls_a_fabric_without_wait_arm(void **state)
{
    loop_hub_t *h = hub_new();
    node_t pre;
    node_open(&pre, h, KVS_ROLE_PREFILL, "p0", false, 0, NULL);
    assert_int_equal(kvs_driver_progress(pre.drv), 0);
    assert_int_equal(kvs_driver_progress(pre.drv), 0);
    kvs_driver_stats_t a, b;
    stats_of(&pre, &a);
    /* Nothing can wake it but its poll interval (50 ms), well inside the
     * 60 s it was given. */
    assert_int_equal(kvs_driver_wait(pre.drv, 60000000000u), KVS_OK);
    stats_of(&pre, &b);
    assert_int_equal(b.wakes_deadline - a.wakes_deadline, 1);
    assert_int_equal(b.wakes_timeout - a.wakes_timeout, 0);
    node_close(&pre);
    hub_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_driver_create_arguments),
        cmocka_unit_test(test_driver_threads_move_rooms_opened_from_another_thread),
        cmocka_unit_test(test_driver_wait_wakes_on_a_message),
        cmocka_unit_test(test_driver_wait_wakes_on_a_copy),
        cmocka_unit_test(test_driver_wait_wakes_on_a_call_from_another_thread),
        cmocka_unit_test(test_driver_no_call_is_lost),
        cmocka_unit_test(test_driver_wait_wakes_at_the_rank_deadline),
        cmocka_unit_test(test_driver_polls_a_fabric_without_wait_arm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
