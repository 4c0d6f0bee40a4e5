/*
 * fabric_pair.c - two fabrics in one process for the real-fabric tests
 * (see fabric_pair.h). Test code: it reads the real clock, sleeps in the
 * connect helper's thread and fails through cmocka.
 */
#include "fabric_pair.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

uint64_t fp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t fp_deadline_ns(void)
{
    const char *s = getenv("KVS_TEST_WAIT_S");
    const uint64_t secs = s != NULL && atoi(s) > 0 ? (uint64_t)atoi(s) : 60;
    return fp_now_ns() + secs * 1000000000u;
}

void fp_side_init(fp_side_t *s, kvs_fabric_t *fab)
{
    s->fab = fab;
    s->mem = NULL; /* host memory unless the test sets it */
    s->q = calloc(FP_QCAP, sizeof *s->q);
    assert_non_null(s->q);
    s->n = 0;
}

void fp_side_fini(fp_side_t *s)
{
    free(s->q);
    *s = (fp_side_t){0};
}

void fp_side_pump(fp_side_t *s)
{
    if (s->fab == NULL || s->n == FP_QCAP)
        return;
    int got = s->fab->ops.poll(s->fab, s->q + s->n, FP_QCAP - s->n);
    if (got < 0)
        fail_msg("poll: %s: %s", kvs_status_name(got), s->fab->last_backend_msg);
    s->n += got;
}

void fp_pair_pump(fp_pair_t *p)
{
    if (p->step != NULL)
        p->step(p->step_ctx);
    fp_side_pump(&p->a);
    fp_side_pump(&p->b);
}

kvs_completion_t fp_take(fp_pair_t *p, fp_side_t *s, kvs_completion_kind_t kind,
                         kvs_conn_t *conn)
{
    const uint64_t until = fp_deadline_ns();
    for (;;) {
        for (int i = 0; i < s->n; i++) {
            if (s->q[i].kind == kind && (conn == NULL || s->q[i].conn == conn)) {
                kvs_completion_t c = s->q[i];
                memmove(&s->q[i], &s->q[i + 1], sizeof s->q[0] * (size_t)(s->n - i - 1));
                s->n--;
                return c;
            }
        }
        fp_pair_pump(p);
        if (fp_now_ns() > until)
            fail_msg("no completion of kind %d within the deadline (%d queued)", (int)kind,
                     s->n);
    }
}

typedef struct fp_pumper {
    fp_side_t *s;
    fp_idle_fn idle;
    volatile int stop;
} fp_pumper_t;

static void *fp_pump_thread(void *arg)
{
    fp_pumper_t *p = arg;
    while (!p->stop) {
        fp_side_pump(p->s);
        p->idle(p->s->fab);
    }
    return NULL;
}

int fp_connect(fp_side_t *from, fp_side_t *to, const char *address, fp_idle_fn idle,
               kvs_conn_t **out)
{
    fp_pumper_t p = {.s = to, .idle = idle};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fp_pump_thread, &p), 0);
    int rc = from->fab->ops.connect(from->fab, address, out);
    p.stop = 1;
    pthread_join(t, NULL);
    return rc;
}

void fp_pair_connect(fp_pair_t *p, const char *a_address, fp_idle_fn idle)
{
    int rc = fp_connect(&p->b, &p->a, a_address, idle, &p->ab);
    if (rc != KVS_OK)
        fail_msg("connect: %s: %s", kvs_status_name(rc), p->b.fab->last_backend_msg);
    assert_int_equal(p->b.fab->ops.send(p->b.fab, p->ab, "hello", 5, 1), KVS_OK);
    kvs_completion_t c = fp_take(p, &p->a, KVS_COMPLETION_RECV, NULL);
    assert_int_equal(c.status, KVS_OK);
    assert_int_equal(c.len_bytes, 5);
    assert_memory_equal(c.msg, "hello", 5);
    p->ba = c.conn;
    assert_non_null(p->ba);
    c = fp_take(p, &p->b, KVS_COMPLETION_SEND, p->ab);
    assert_int_equal(c.status, KVS_OK);
    assert_int_equal(c.wr_id, 1);
}

static int fp_region_reg_as(fp_side_t *s, fp_region_t *r, uint64_t len, bool sealed)
{
    r->len = len;
    kvs_device_t *dev = NULL;
    if (s->mem != NULL) {
        s->mem->alloc(s->mem->ctx, len, &r->addr, &r->mem);
        dev = s->mem->dev;
    } else {
        r->mem = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
        assert_non_null(r->mem);
        memset(r->mem, 0, len);
        r->addr = (uint64_t)(uintptr_t)r->mem;
    }
    return sealed ? s->fab->ops.mr_register_sealed(s->fab, dev, r->addr, len, &r->mr, &r->rkey)
                  : s->fab->ops.mr_register(s->fab, dev, r->addr, len, &r->mr, &r->rkey);
}

void fp_region_reg(fp_side_t *s, fp_region_t *r, uint64_t len)
{
    int rc = fp_region_reg_as(s, r, len, false);
    if (rc != KVS_OK)
        fail_msg("mr_register: %s: %s", kvs_status_name(rc), s->fab->last_backend_msg);
}

int fp_region_reg_sealed(fp_side_t *s, fp_region_t *r, uint64_t len)
{
    return fp_region_reg_as(s, r, len, true);
}

void fp_region_free(fp_side_t *s, fp_region_t *r)
{
    if (r->mr != NULL)
        assert_int_equal(s->fab->ops.mr_deregister(s->fab, r->mr), KVS_OK);
    if (s->mem != NULL && r->mem != NULL)
        s->mem->release(s->mem->ctx, r->addr);
    else
        free(r->mem);
    *r = (fp_region_t){0};
}
