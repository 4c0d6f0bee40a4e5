/*
 * fabric_pair.h - the scaffolding the real-fabric tests share
 * (tests/rxe/test_verbs_fabric.c, tests/ofi/test_ofi_fabric.c): two
 * fabrics in one process, each with a queue of completions polled but not
 * taken yet, the connection b opened to a and a's side of it, and
 * registered host buffers. Nothing here knows which fabric it drives: the
 * tests create and destroy their fabrics and say how to idle while one
 * side blocks in connect().
 *
 * Every wait is bounded by KVS_TEST_WAIT_S (default 60 s): a hang fails the
 * test through cmocka's fail_msg.
 */
#ifndef KVS_TESTS_FABRIC_PAIR_H
#define KVS_TESTS_FABRIC_PAIR_H

#include <kvstage/backend.h>

#include <stdint.h>

#define FP_QCAP 256

/* Memory of a side that is not plain host memory (the simulator's GPU):
 * alloc gives len zeroed bytes at a device address and a host view of
 * them, release frees them. */
typedef struct fp_memory {
    kvs_device_t *dev; /* registrations name it */
    void *ctx;
    void (*alloc)(void *ctx, uint64_t len, uint64_t *addr, uint8_t **mem);
    void (*release)(void *ctx, uint64_t addr);
} fp_memory_t;

/* One side: its fabric (the test's) and the completions polled but not
 * yet taken; mem NULL: registrations are of host memory. */
typedef struct fp_side {
    kvs_fabric_t *fab;
    kvs_completion_t *q; /* FP_QCAP */
    int n;
    const fp_memory_t *mem;
} fp_side_t;

typedef struct fp_pair {
    const char *name;   /* what the pair runs on (ofi: the provider); the test's */
    fp_side_t a, b;
    kvs_conn_t *ab;     /* b's connection to a (b connected) */
    kvs_conn_t *ba;     /* a's side of it, learnt from the first message */
    /* Called before each poll of fp_take (the simulator runs its engine);
     * NULL for real fabrics, which move on their own. */
    void (*step)(void *ctx);
    void *step_ctx;
} fp_pair_t;

/* A registered buffer: mem is the host's view of it, addr the address
 * the fabric knows (the same for host memory). */
typedef struct fp_region {
    uint8_t *mem;
    uint64_t addr;
    uint64_t len;
    kvs_mr_t *mr;
    uint64_t rkey;
} fp_region_t;

/* What a side does between polls while the other blocks in connect()
 * (sleep on the fabric's wait, or a short nap). */
typedef void (*fp_idle_fn)(kvs_fabric_t *fab);

uint64_t fp_now_ns(void);
/* Now plus KVS_TEST_WAIT_S. */
uint64_t fp_deadline_ns(void);

/* s drives fab (still the caller's to destroy); its queue is allocated. */
void fp_side_init(fp_side_t *s, kvs_fabric_t *fab);
/* Frees the queue; s is zero after. */
void fp_side_fini(fp_side_t *s);
/* Polls s's fabric into its queue (nothing when full). */
void fp_side_pump(fp_side_t *s);

/* One turn of the pair: its step (the simulator's engine), then a poll of
 * both sides into their queues. */
void fp_pair_pump(fp_pair_t *p);

/* Takes the first completion of `kind` on conn (any conn if NULL) from s,
 * polling both sides of p meanwhile; fails the test after the deadline. */
kvs_completion_t fp_take(fp_pair_t *p, fp_side_t *s, kvs_completion_kind_t kind,
                         kvs_conn_t *conn);

/* from connects to address (to's) while a thread polls to and idles. */
int fp_connect(fp_side_t *from, fp_side_t *to, const char *address, fp_idle_fn idle,
               kvs_conn_t **out);

/* b connects to a at a_address; one hello b -> a gives a its side (ba). */
void fp_pair_connect(fp_pair_t *p, const char *a_address, fp_idle_fn idle);

/* len zeroed bytes, page-aligned (host memory) or from s->mem, registered
 * on s. */
void fp_region_reg(fp_side_t *s, fp_region_t *r, uint64_t len);
/* The same, registered with mr_register_sealed (its own key opens
 * nothing remote); returns the status, the fabric's detail on failure. */
int fp_region_reg_sealed(fp_side_t *s, fp_region_t *r, uint64_t len);
/* Deregisters (when registered) and frees; r is zero after. */
void fp_region_free(fp_side_t *s, fp_region_t *r);

#endif
