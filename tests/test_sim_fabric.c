/*
 * test_sim_fabric.c - unit tests of the simulated RDMA fabric (sim/fabric.c)
 * on simulated GPUs: registration and remote keys, connections by name,
 * writes that land exact bytes at the modeled time, remote access errors,
 * bandwidth sharing on one NIC and on one receiver (incast), the per-op cost
 * of small writes, control messages, completion queue overrun, fault hooks,
 * region-scoped keys (key_grant / key_revoke), lifetime and determinism.
 * Then the fabric contract every backend meets (tests/fixtures/fabric_contract.c)
 * on two simulated NICs, the engine run before each poll.
 *
 * Every test uses a fixed seed, printed when its fixture opens; a run is
 * deterministic, so rerunning the binary replays it.
 */
#include "backend.h"
#include "fabric.h"
#include "fake_backend.h"

#include "fabric_contract.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define FX_NICS 3
#define FX_BUF_BYTES (UINT64_C(64) << 20)
#define MIB (UINT64_C(1) << 20)
#define KIB (UINT64_C(1) << 10)

/* Default model numbers, restated here so the expected times are computed
 * independently of fabric.c. */
#define T_PER_OP_NS 3700u
#define T_LATENCY_NS 2000u
#define T_CTRL_NS 20000u

/* Wire time at 50 GB/s with 58 header bytes per 4096-byte packet. */
static uint64_t t_wire_ns(uint64_t bytes)
{
    const uint64_t packets = (bytes + 4095) / 4096;
    return (bytes + packets * 58 + 49) / 50; /* * 1e9 / 50e9, rounded up */
}

#include "xorshift.h"

/* ---- completion recorder: polls from the NIC's wake callback ----------- */

typedef struct rec_entry {
    kvs_completion_kind_t kind;
    int status;
    uint64_t wr_id;
    kvs_conn_t *conn;
    uint32_t imm;
    uint32_t len_bytes;
    uint64_t t_ns;
    uint8_t msg[64];
} rec_entry_t;

typedef struct recorder {
    sim_engine_t *eng;
    kvs_fabric_t *fab;
    rec_entry_t *e;
    size_t n, cap;
    int poll_error;
    kvs_completion_t *buf; /* 8 */
} recorder_t;

static void recorder_wake(void *ctx)
{
    recorder_t *r = ctx;
    for (;;) {
        int n = r->fab->ops.poll(r->fab, r->buf, 8);
        if (n < 0)
            r->poll_error = n;
        if (n <= 0)
            return;
        for (int i = 0; i < n; i++) {
            if (r->n == r->cap) {
                r->cap = r->cap == 0 ? 64 : r->cap * 2;
                r->e = realloc(r->e, r->cap * sizeof *r->e);
                assert_non_null(r->e);
            }
            const kvs_completion_t *c = &r->buf[i];
            rec_entry_t *e = &r->e[r->n++];
            memset(e, 0, sizeof *e);
            e->kind = c->kind;
            e->status = c->status;
            e->wr_id = c->wr_id;
            e->conn = c->conn;
            e->imm = c->imm;
            e->len_bytes = c->len_bytes;
            e->t_ns = sim_engine_now_ns(r->eng);
            if (c->kind == KVS_COMPLETION_RECV)
                memcpy(e->msg, c->msg, c->len_bytes < sizeof e->msg ? c->len_bytes
                                                                    : sizeof e->msg);
        }
    }
}

static size_t recorder_count(const recorder_t *r, kvs_completion_kind_t kind)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += r->e[i].kind == kind;
    return n;
}

/* ---- fixture: an engine, a net, FX_NICS GPUs each with a NIC, a 64 MiB
 * buffer and an MR over it ------------------------------------------------ */

typedef struct fx {
    uint64_t seed;
    sim_engine_t *eng;
    sim_net_t *net;
    sim_gpu_t *gpu[FX_NICS];
    sim_nic_t *nic[FX_NICS];
    kvs_fabric_t *fab[FX_NICS];
    kvs_device_t *dev[FX_NICS];
    uint64_t buf[FX_NICS];
    kvs_mr_t *mr[FX_NICS];
    uint64_t rkey[FX_NICS];
    recorder_t rec[FX_NICS];
} fx_t;

static fx_t *fx_open(uint64_t seed, const sim_net_config_t *cfg, bool record)
{
    print_message("[ seed     ] 0x%llx (fixed; rerun this test to replay)\n",
                  (unsigned long long)seed);
    fx_t *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    fx->seed = seed;
    assert_int_equal(sim_engine_create(seed, 64, &fx->eng), KVS_OK);
    assert_int_equal(sim_net_create(fx->eng, cfg, &fx->net), KVS_OK);
    for (int i = 0; i < FX_NICS; i++) {
        char name[16];
        snprintf(name, sizeof name, "nic%d", i);
        assert_int_equal(sim_gpu_create(fx->eng, NULL, (uint32_t)i, &fx->gpu[i]), KVS_OK);
        fx->dev[i] = sim_gpu_device(fx->gpu[i]);
        assert_int_equal(sim_nic_create(fx->net, name, fx->gpu[i], &fx->nic[i]), KVS_OK);
        fx->fab[i] = sim_nic_fabric(fx->nic[i]);
        assert_int_equal(fx->dev[i]->ops.mem_alloc(fx->dev[i], FX_BUF_BYTES, &fx->buf[i]),
                         KVS_OK);
        assert_int_equal(fx->fab[i]->ops.mr_register(fx->fab[i], fx->dev[i], fx->buf[i],
                                                     FX_BUF_BYTES, &fx->mr[i], &fx->rkey[i]),
                         KVS_OK);
        fx->rec[i].eng = fx->eng;
        fx->rec[i].fab = fx->fab[i];
        fx->rec[i].buf = calloc(8, sizeof(kvs_completion_t));
        assert_non_null(fx->rec[i].buf);
        if (record)
            sim_nic_set_wake(fx->nic[i], recorder_wake, &fx->rec[i]);
    }
    return fx;
}

static void fx_destroy_nic(fx_t *fx, int i)
{
    sim_nic_destroy(fx->nic[i]);
    fx->nic[i] = NULL;
    fx->fab[i] = NULL;
}

static void fx_close(fx_t *fx)
{
    for (int i = 0; i < FX_NICS; i++)
        if (fx->nic[i] != NULL)
            fx_destroy_nic(fx, i);
    assert_int_equal(sim_net_destroy(fx->net), KVS_OK);
    for (int i = 0; i < FX_NICS; i++) {
        sim_gpu_destroy(fx->gpu[i]);
        free(fx->rec[i].e);
        free(fx->rec[i].buf);
    }
    sim_engine_destroy(fx->eng);
    free(fx);
}

static uint8_t *fx_host(fx_t *fx, int i, uint64_t off, uint64_t len)
{
    uint8_t *p = sim_gpu_host(fx->gpu[i], fx->buf[i] + off, len);
    assert_non_null(p);
    return p;
}

static void fx_fill_random(fx_t *fx, int i, uint64_t off, uint64_t len, uint64_t *s)
{
    uint8_t *p = fx_host(fx, i, off, len);
    for (uint64_t k = 0; k < len; k++)
        p[k] = (uint8_t)(xorshift64(s) >> 56);
}

static bool all_zero(const uint8_t *p, uint64_t len)
{
    for (uint64_t k = 0; k < len; k++)
        if (p[k] != 0)
            return false;
    return true;
}

static kvs_conn_t *fx_connect(fx_t *fx, int from, int to)
{
    char name[16];
    snprintf(name, sizeof name, "nic%d", to);
    kvs_conn_t *c = NULL;
    assert_int_equal(fx->fab[from]->ops.connect(fx->fab[from], name, &c), KVS_OK);
    assert_non_null(c);
    return c;
}

/* Posts a write of len bytes from buf[from] + src_off to buf[to] + dst_off. */
static int fx_write(fx_t *fx, int from, int to, uint64_t src_off, uint64_t dst_off,
                    uint64_t len, uint64_t wr_id, bool with_imm, uint32_t imm)
{
    kvs_conn_t *c = fx_connect(fx, from, to);
    const kvs_write_desc_t d = {
        .local_addr = fx->buf[from] + src_off,
        .local_mr = fx->mr[from],
        .len_bytes = len,
        .remote_addr = fx->buf[to] + dst_off,
        .rkey = fx->rkey[to],
        .with_imm = with_imm,
        .imm = imm,
        .wr_id = wr_id,
    };
    return fx->fab[from]->ops.write(fx->fab[from], c, &d);
}

static void fx_run(fx_t *fx) { sim_engine_run(fx->eng, UINT64_MAX, 0); }

/* Time of the WRITE completion with wr_id on NIC i (fails if absent). */
static const rec_entry_t *fx_completion(fx_t *fx, int i, kvs_completion_kind_t kind,
                                        uint64_t wr_id)
{
    for (size_t k = 0; k < fx->rec[i].n; k++)
        if (fx->rec[i].e[k].kind == kind && fx->rec[i].e[k].wr_id == wr_id)
            return &fx->rec[i].e[k];
    fail_msg("no completion of kind %d with wr_id %llu on nic%d", (int)kind,
             (unsigned long long)wr_id, i);
    return NULL;
}

/* ------------------------------------------------------------------------ */

static void test_sim_fabric_ops_table(void **state)
{
    (void)state;
    fx_t *fx = fx_open(1, NULL, true);
    kvs_fabric_t *fab = fx->fab[0];
    assert_string_equal(fab->ops.name, "sim-nic");
    assert_string_equal(fab->name, "nic0");
    assert_int_equal(fab->ops.version, KVS_FABRIC_OPS_VERSION);
    assert_true(fab->ops.caps & KVS_FABRIC_CAP_WRITE_IMM);
    assert_true(fab->ops.caps & KVS_FABRIC_CAP_PER_LAYER_WRITES);
    assert_ptr_equal(sim_nic_from_fabric(fab), fx->nic[0]);
    fake_fabric_t fake;
    fake_fabric_setup(&fake, 0);
    assert_null(sim_nic_from_fabric(&fake.base));
    assert_null(sim_nic_from_fabric(NULL));
    /* the clock is the engine's */
    assert_int_equal(fab->ops.now_ns(fab), 0);
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, 4096, 1, false, 0), KVS_OK);
    fx_run(fx);
    assert_true(sim_engine_now_ns(fx->eng) > 0);
    assert_int_equal(fab->ops.now_ns(fab), sim_engine_now_ns(fx->eng));
    /* NIC names are unique */
    sim_nic_t *dup = NULL;
    assert_int_equal(sim_nic_create(fx->net, "nic1", fx->gpu[0], &dup), KVS_EINVAL);
    assert_null(dup);
    fx_close(fx);
}

static void test_sim_fabric_register_rkeys_unique(void **state)
{
    (void)state;
    sim_net_config_t cfg = {.max_mrs = 64};
    fx_t *fx = fx_open(2, &cfg, true);
    kvs_fabric_t *fab = fx->fab[1];
    kvs_device_t *dev = fx->dev[1];
    enum { N = 63 }; /* one MR per NIC already made by the fixture */
    kvs_mr_t *mrs[N];
    uint64_t keys[N + FX_NICS];
    for (int i = 0; i < N; i++) {
        assert_int_equal(fab->ops.mr_register(fab, dev, fx->buf[1] + (uint64_t)i * 4096,
                                              4096, &mrs[i], &keys[i]),
                         KVS_OK);
    }
    for (int i = 0; i < FX_NICS; i++)
        keys[N + i] = fx->rkey[i];
    int sequential = 0;
    for (int i = 0; i < N + FX_NICS; i++) {
        assert_int_not_equal(keys[i], 0);
        assert_true(keys[i] <= UINT32_MAX);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(keys[i], keys[j]);
        if (i > 0 && i < N && keys[i] == keys[i - 1] + 1)
            sequential++;
    }
    assert_true(sequential < 3); /* not a counter */
    /* the table is bounded */
    kvs_mr_t *extra = NULL;
    uint64_t extra_key = 0;
    assert_int_equal(fab->ops.mr_register(fab, dev, fx->buf[1], 4096, &extra, &extra_key),
                     KVS_EFULL);
    assert_non_null(strstr(fab->last_backend_msg, "max_mrs"));
    /* deregister frees a slot; twice is ENOENT */
    assert_int_equal(fab->ops.mr_deregister(fab, mrs[5]), KVS_OK);
    assert_int_equal(fab->ops.mr_deregister(fab, mrs[5]), KVS_ENOENT);
    assert_int_equal(fab->ops.mr_register(fab, dev, fx->buf[1], 4096, &extra, &extra_key),
                     KVS_OK);
    for (int i = 0; i < N; i++)
        if (i != 5)
            assert_int_not_equal(extra_key, keys[i]);
    /* an MR of another NIC is not ours */
    assert_int_equal(fab->ops.mr_deregister(fab, fx->mr[0]), KVS_ENOENT);
    fx_close(fx);

    /* bad registrations: outside an allocation, wrong GPU, not a sim GPU */
    fx = fx_open(3, NULL, true);
    fab = fx->fab[0];
    kvs_mr_t *mr = NULL;
    uint64_t key = 0;
    assert_int_equal(fab->ops.mr_register(fab, fx->dev[0], fx->buf[0] + FX_BUF_BYTES - 10,
                                          4096, &mr, &key),
                     KVS_EINVAL);
    assert_non_null(strstr(fab->last_backend_msg, "live allocation"));
    assert_int_equal(fab->ops.mr_register(fab, fx->dev[0], fx->buf[0], 0, &mr, &key),
                     KVS_EINVAL);
    assert_int_equal(fab->ops.mr_register(fab, fx->dev[1], fx->buf[1], 4096, &mr, &key),
                     KVS_EINVAL);
    fake_device_t fake;
    fake_device_setup(&fake);
    assert_int_equal(fab->ops.mr_register(fab, &fake.base, 4096, 4096, &mr, &key),
                     KVS_EINVAL);
    assert_non_null(strstr(fab->last_backend_msg, "not a simulated GPU"));
    assert_null(mr);
    fx_close(fx);
}

static void test_sim_fabric_connect_by_name(void **state)
{
    (void)state;
    fx_t *fx = fx_open(4, NULL, true);
    kvs_fabric_t *fab = fx->fab[0];
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    assert_ptr_equal(fx_connect(fx, 0, 1), c01); /* twice: the same conn */
    kvs_conn_t *c10 = fx_connect(fx, 1, 0);
    assert_ptr_not_equal(c10, c01);
    assert_ptr_equal(fx_connect(fx, 1, 0), c10);
    assert_ptr_not_equal(fx_connect(fx, 0, 2), c01);
    kvs_conn_t *c = NULL;
    assert_int_equal(fab->ops.connect(fab, "nope", &c), KVS_ENOENT);
    assert_non_null(strstr(fab->last_backend_msg, "'nope'"));
    assert_null(c);
    fx_close(fx);

    /* the connection table is bounded on both sides */
    sim_net_config_t cfg = {.max_conns = 1};
    fx = fx_open(5, &cfg, true);
    fx_connect(fx, 0, 1);
    assert_int_equal(fx->fab[2]->ops.connect(fx->fab[2], "nic0", &c), KVS_EFULL);
    assert_int_equal(fx->fab[0]->ops.connect(fx->fab[0], "nic2", &c), KVS_EFULL);
    fx_close(fx);
}

static void test_sim_fabric_write_lands_exact_bytes_at_modeled_time(void **state)
{
    (void)state;
    fx_t *fx = fx_open(6, NULL, true);
    uint64_t s = fx->seed;
    const uint64_t len = MIB, src_off = 3 * KIB, dst_off = 5 * MIB + 256;
    fx_fill_random(fx, 0, src_off, len, &s);
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    kvs_conn_t *c10 = fx_connect(fx, 1, 0);
    assert_int_equal(fx_write(fx, 0, 1, src_off, dst_off, len, 77, true, 0xabcu), KVS_OK);

    /* one 1 MiB segment: per-op + wire on TX, latency, lands; ack latency
     * later. 1 MiB = 256 packets: (1048576 + 256 * 58) / 50 = 21268.48 ns */
    assert_int_equal(t_wire_ns(MIB), 21269);
    const uint64_t land_ns = T_PER_OP_NS + 21269 + T_LATENCY_NS; /* 26969 */
    const uint64_t ack_ns = land_ns + T_LATENCY_NS;               /* 28969 */

    /* nothing visible before it lands */
    sim_engine_run(fx->eng, land_ns - 1, 0);
    assert_true(all_zero(fx_host(fx, 1, dst_off, len), len));
    assert_int_equal(fx->rec[1].n, 0);
    assert_int_equal(fx->rec[0].n, 0);

    sim_engine_run(fx->eng, land_ns, 0);
    assert_memory_equal(fx_host(fx, 1, dst_off, len), fx_host(fx, 0, src_off, len), len);
    assert_true(all_zero(fx_host(fx, 1, dst_off - 256, 256), 256)); /* neighbours intact */
    assert_true(all_zero(fx_host(fx, 1, dst_off + len, 4096), 4096));
    assert_int_equal(fx->rec[1].n, 1);
    const rec_entry_t *imm = &fx->rec[1].e[0];
    assert_int_equal(imm->kind, KVS_COMPLETION_IMM);
    assert_int_equal(imm->status, KVS_OK);
    assert_int_equal(imm->imm, 0xabcu);
    assert_ptr_equal(imm->conn, c10); /* the target's conn back to the sender */
    assert_int_equal(imm->t_ns, land_ns);
    assert_int_equal(fx->rec[0].n, 0);

    fx_run(fx);
    assert_int_equal(fx->rec[0].n, 1);
    const rec_entry_t *done = &fx->rec[0].e[0];
    assert_int_equal(done->kind, KVS_COMPLETION_WRITE);
    assert_int_equal(done->status, KVS_OK);
    assert_int_equal(done->wr_id, 77);
    assert_ptr_equal(done->conn, c01);
    assert_int_equal(done->t_ns, ack_ns);
    assert_int_equal(fx->rec[1].n, 1);
    assert_int_equal(sim_nic_writes(fx->nic[0]), 1);
    assert_int_equal(sim_nic_write_bytes(fx->nic[0]), len);
    assert_int_equal(sim_nic_writes(fx->nic[1]), 0);

    /* without imm: WRITE completion only */
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, 4096, 78, false, 0), KVS_OK);
    fx_run(fx);
    assert_int_equal(fx->rec[1].n, 1);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 78)->status, KVS_OK);
    fx_close(fx);
}

static void test_sim_fabric_write_wrong_rkey_fails_remote(void **state)
{
    (void)state;
    fx_t *fx = fx_open(7, NULL, true);
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, MIB, &s);
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    /* nic2's key is live, but on another NIC; rkey + 1 is (almost surely) no key */
    const uint64_t bad_keys[2] = {fx->rkey[2], (fx->rkey[1] + 1) & UINT32_MAX};
    for (int k = 0; k < 2; k++) {
        const kvs_write_desc_t d = {.local_addr = fx->buf[0], .local_mr = fx->mr[0],
                                    .len_bytes = MIB, .remote_addr = fx->buf[1],
                                    .rkey = bad_keys[k], .with_imm = true, .imm = 9,
                                    .wr_id = 40 + (uint64_t)k};
        assert_int_equal(fx->fab[0]->ops.write(fx->fab[0], c01, &d), KVS_OK);
    }
    fx_run(fx);
    for (int k = 0; k < 2; k++) {
        const rec_entry_t *e = fx_completion(fx, 0, KVS_COMPLETION_WRITE, 40 + (uint64_t)k);
        assert_int_equal(e->status, KVS_EREMOTE);
    }
    /* the first fails when it lands, NAK one latency later */
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 40)->t_ns,
                     T_PER_OP_NS + t_wire_ns(MIB) + 2 * T_LATENCY_NS);
    assert_int_equal(fx->rec[1].n, 0); /* the target gets nothing */
    assert_true(all_zero(fx_host(fx, 1, 0, MIB), MIB));
    assert_int_equal(sim_nic_writes(fx->nic[0]), 0);
    fx_close(fx);
}

static void test_sim_fabric_write_outside_mr_fails_remote(void **state)
{
    (void)state;
    sim_net_config_t cfg = {.segment_bytes = 64 * KIB};
    fx_t *fx = fx_open(8, &cfg, true);
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, MIB, &s);
    kvs_fabric_t *fab1 = fx->fab[1];
    kvs_mr_t *small = NULL;
    uint64_t small_key = 0;
    assert_int_equal(fab1->ops.mr_register(fab1, fx->dev[1], fx->buf[1] + 8 * MIB, 192 * KIB,
                                           &small, &small_key),
                     KVS_OK);
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    /* 1) starts inside, runs past the end: segments 0-2 land, the 4th fails,
     *    nothing after it lands */
    kvs_write_desc_t d = {.local_addr = fx->buf[0], .local_mr = fx->mr[0],
                          .len_bytes = MIB, .remote_addr = fx->buf[1] + 8 * MIB,
                          .rkey = small_key, .with_imm = true, .wr_id = 1};
    assert_int_equal(fx->fab[0]->ops.write(fx->fab[0], c01, &d), KVS_OK);
    /* 2) starts before the MR */
    d.remote_addr = fx->buf[1] + 8 * MIB - 4096;
    d.len_bytes = 8192;
    d.wr_id = 2;
    assert_int_equal(fx->fab[0]->ops.write(fx->fab[0], c01, &d), KVS_OK);
    fx_run(fx);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->status, KVS_EREMOTE);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 2)->status, KVS_EREMOTE);
    assert_int_equal(fx->rec[1].n, 0);
    assert_memory_equal(fx_host(fx, 1, 8 * MIB, 192 * KIB), fx_host(fx, 0, 0, 192 * KIB),
                        192 * KIB);
    assert_true(all_zero(fx_host(fx, 1, 8 * MIB + 192 * KIB, MIB), MIB));
    assert_true(all_zero(fx_host(fx, 1, 8 * MIB - 4096, 4096), 4096));
    fx_close(fx);
}

static void test_sim_fabric_write_rejects_bad_local_side(void **state)
{
    (void)state;
    fx_t *fx = fx_open(9, NULL, true);
    kvs_fabric_t *fab = fx->fab[0];
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    kvs_conn_t *c10 = fx_connect(fx, 1, 0);
    const kvs_write_desc_t ok = {.local_addr = fx->buf[0], .local_mr = fx->mr[0],
                                 .len_bytes = 4096, .remote_addr = fx->buf[1],
                                 .rkey = fx->rkey[1], .wr_id = 1};
    kvs_write_desc_t d = ok;
    d.len_bytes = 0;
    assert_int_equal(fab->ops.write(fab, c01, &d), KVS_EINVAL);
    d = ok;
    d.local_mr = fx->mr[1]; /* another NIC's MR */
    assert_int_equal(fab->ops.write(fab, c01, &d), KVS_EINVAL);
    d = ok;
    d.local_addr = fx->buf[0] + FX_BUF_BYTES - 100; /* runs past the MR */
    assert_int_equal(fab->ops.write(fab, c01, &d), KVS_EINVAL);
    assert_non_null(strstr(fab->last_backend_msg, "outside its MR"));
    d = ok;
    d.local_addr = fx->buf[0] - 1;
    assert_int_equal(fab->ops.write(fab, c01, &d), KVS_EINVAL);
    assert_int_equal(fab->ops.write(fab, c10, &ok), KVS_EINVAL); /* another NIC's conn */
    assert_int_equal(fab->ops.write(fab, c01, NULL), KVS_EINVAL);
    /* an MR deregistered is no longer usable */
    kvs_mr_t *mr = NULL;
    uint64_t key = 0;
    assert_int_equal(fab->ops.mr_register(fab, fx->dev[0], fx->buf[0], 4096, &mr, &key),
                     KVS_OK);
    assert_int_equal(fab->ops.mr_deregister(fab, mr), KVS_OK);
    d = ok;
    d.local_mr = mr;
    assert_int_equal(fab->ops.write(fab, c01, &d), KVS_EINVAL);
    /* nothing was queued */
    assert_int_equal(sim_engine_pending(fx->eng), 0);
    fx_run(fx);
    assert_int_equal(fx->rec[0].n + fx->rec[1].n, 0);
    fx_close(fx);
}

/* Completion time of one 16 MiB write on an idle network. */
static uint64_t single_16mib_ns(void)
{
    fx_t *fx = fx_open(10, NULL, true);
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, 16 * MIB, 1, false, 0), KVS_OK);
    fx_run(fx);
    const uint64_t t = fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->t_ns;
    fx_close(fx);
    /* 16 segments of 1 MiB back to back, one per-op, latency out and back */
    assert_int_equal(t, T_PER_OP_NS + 16 * t_wire_ns(MIB) + 2 * T_LATENCY_NS);
    return t;
}

static void assert_ratio(uint64_t t, uint64_t base, double lo, double hi)
{
    const double r = (double)t / (double)base;
    if (r < lo || r > hi)
        fail_msg("time %llu ns is %.3fx the base %llu ns, expected [%.2f, %.2f]",
                 (unsigned long long)t, r, (unsigned long long)base, lo, hi);
}

static void test_sim_fabric_concurrent_writes_share_bandwidth(void **state)
{
    (void)state;
    const uint64_t t1 = single_16mib_ns();
    fx_t *fx = fx_open(11, NULL, true);
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, 16 * MIB, 1, false, 0), KVS_OK);
    assert_int_equal(fx_write(fx, 0, 2, 16 * MIB, 0, 16 * MIB, 2, false, 0), KVS_OK);
    fx_run(fx);
    assert_ratio(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->t_ns, t1, 1.85, 2.05);
    assert_ratio(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 2)->t_ns, t1, 1.85, 2.05);
    fx_close(fx);
}

static void test_sim_fabric_incast_shares_receiver(void **state)
{
    (void)state;
    const uint64_t t1 = single_16mib_ns();
    fx_t *fx = fx_open(12, NULL, true);
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, 16 * MIB, &s);
    fx_fill_random(fx, 1, 0, 16 * MIB, &s);
    assert_int_equal(fx_write(fx, 0, 2, 0, 0, 16 * MIB, 1, true, 1), KVS_OK);
    assert_int_equal(fx_write(fx, 1, 2, 0, 16 * MIB, 16 * MIB, 2, true, 2), KVS_OK);
    fx_run(fx);
    assert_ratio(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->t_ns, t1, 1.85, 2.05);
    assert_ratio(fx_completion(fx, 1, KVS_COMPLETION_WRITE, 2)->t_ns, t1, 1.85, 2.05);
    assert_int_equal(recorder_count(&fx->rec[2], KVS_COMPLETION_IMM), 2);
    assert_memory_equal(fx_host(fx, 2, 0, 16 * MIB), fx_host(fx, 0, 0, 16 * MIB), 16 * MIB);
    assert_memory_equal(fx_host(fx, 2, 16 * MIB, 16 * MIB), fx_host(fx, 1, 0, 16 * MIB),
                        16 * MIB);
    fx_close(fx);

    /* full duplex: nic1 receives from nic0 while it sends to nic2, no slowdown */
    fx = fx_open(13, NULL, true);
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, 16 * MIB, 1, false, 0), KVS_OK);
    assert_int_equal(fx_write(fx, 1, 2, 0, 0, 16 * MIB, 2, false, 0), KVS_OK);
    fx_run(fx);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->t_ns, t1);
    assert_int_equal(fx_completion(fx, 1, KVS_COMPLETION_WRITE, 2)->t_ns, t1);
    fx_close(fx);
}

static void test_sim_fabric_small_writes_pay_per_op(void **state)
{
    (void)state;
    const uint64_t t_big = single_16mib_ns();
    fx_t *fx = fx_open(14, NULL, true);
    enum { N = 4096 };
    for (uint64_t i = 0; i < N; i++)
        assert_int_equal(fx_write(fx, 0, 1, i * 4 * KIB, i * 4 * KIB, 4 * KIB, i, false, 0),
                         KVS_OK);
    fx_run(fx);
    assert_int_equal(recorder_count(&fx->rec[0], KVS_COMPLETION_WRITE), N);
    uint64_t t_small = 0;
    for (size_t k = 0; k < fx->rec[0].n; k++) {
        assert_int_equal(fx->rec[0].e[k].status, KVS_OK);
        if (fx->rec[0].e[k].t_ns > t_small)
            t_small = fx->rec[0].e[k].t_ns;
    }
    /* each pays per-op on the TX port: 4096 * (3700 + 84) + latencies */
    assert_int_equal(t_small, N * (T_PER_OP_NS + t_wire_ns(4 * KIB)) + 2 * T_LATENCY_NS);
    assert_true(t_small > 10 * t_big);
    assert_int_equal(sim_nic_writes(fx->nic[0]), N);
    assert_int_equal(sim_nic_write_bytes(fx->nic[0]), 16 * MIB);
    fx_close(fx);
}

static void test_sim_fabric_messages_in_order_with_ctrl_latency(void **state)
{
    (void)state;
    fx_t *fx = fx_open(15, NULL, true);
    kvs_fabric_t *fab0 = fx->fab[0], *fab1 = fx->fab[1];
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    kvs_conn_t *c10 = fx_connect(fx, 1, 0);
    for (int i = 0; i < 5; i++) {
        char m[32];
        int n = snprintf(m, sizeof m, "message %d", i);
        assert_int_equal(fab0->ops.send(fab0, c01, m, (uint32_t)n + 1, 100 + (uint64_t)i),
                         KVS_OK);
    }
    uint8_t big[KVS_CONTROL_MSG_MAX_BYTES + 1] = {0};
    assert_int_equal(fab0->ops.send(fab0, c01, big, sizeof big, 1), KVS_EINVAL);
    assert_int_equal(fab0->ops.send(fab0, c01, big, KVS_CONTROL_MSG_MAX_BYTES, 105), KVS_OK);
    fx_run(fx);
    assert_int_equal(fx->rec[1].n, 6);
    for (int i = 0; i < 5; i++) {
        const rec_entry_t *e = &fx->rec[1].e[i];
        char m[32];
        snprintf(m, sizeof m, "message %d", i);
        assert_int_equal(e->kind, KVS_COMPLETION_RECV);
        assert_int_equal(e->t_ns, T_CTRL_NS);
        assert_ptr_equal(e->conn, c10);
        assert_int_equal(e->len_bytes, strlen(m) + 1);
        assert_string_equal((const char *)e->msg, m);
    }
    assert_int_equal(fx->rec[1].e[5].len_bytes, KVS_CONTROL_MSG_MAX_BYTES);
    /* SEND completions at delivery */
    assert_int_equal(recorder_count(&fx->rec[0], KVS_COMPLETION_SEND), 6);
    for (int i = 0; i < 6; i++) {
        const rec_entry_t *e = fx_completion(fx, 0, KVS_COMPLETION_SEND, 100 + (uint64_t)i);
        assert_int_equal(e->status, KVS_OK);
        assert_int_equal(e->t_ns, T_CTRL_NS);
        assert_ptr_equal(e->conn, c01);
    }
    assert_int_equal(sim_nic_msgs(fx->nic[0]), 6);
    /* reply on the conn the message came with */
    assert_int_equal(fab1->ops.send(fab1, fx->rec[1].e[0].conn, "pong", 5, 7), KVS_OK);
    fx_run(fx);
    assert_int_equal(recorder_count(&fx->rec[0], KVS_COMPLETION_RECV), 1);
    const rec_entry_t *pong = &fx->rec[0].e[fx->rec[0].n - 1];
    assert_int_equal(pong->kind, KVS_COMPLETION_RECV);
    assert_string_equal((const char *)pong->msg, "pong");
    assert_ptr_equal(pong->conn, c01);
    assert_int_equal(pong->t_ns, 2 * T_CTRL_NS);
    fx_close(fx);
}

static void test_sim_fabric_disconnect_kills_peer_side(void **state)
{
    (void)state;
    fx_t *fx = fx_open(16, NULL, true);
    kvs_fabric_t *fab0 = fx->fab[0], *fab1 = fx->fab[1];
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    kvs_conn_t *c10 = fx_connect(fx, 1, 0);
    fab0->ops.disconnect(fab0, c01);
    assert_int_equal(fab1->ops.send(fab1, c10, "x", 1, 1), KVS_EPEER);
    assert_non_null(strstr(fab1->last_backend_msg, "disconnect"));
    assert_int_equal(fab0->ops.send(fab0, c01, "x", 1, 1), KVS_EINVAL); /* gone */
    fab1->ops.disconnect(fab1, c10);
    c10 = fx_connect(fx, 1, 0);
    c01 = fx_connect(fx, 0, 1);
    assert_int_equal(fab1->ops.send(fab1, c10, "y", 2, 2), KVS_OK);
    fx_run(fx);
    assert_int_equal(recorder_count(&fx->rec[0], KVS_COMPLETION_RECV), 1);
    assert_ptr_equal(fx->rec[0].e[0].conn, c01);
    fx_close(fx);
}

/* The peer of a disconnected conn hears of it once, as a DISCONNECT
 * completion naming its conn, as rdma_cm's DISCONNECTED event. */
static void test_sim_fabric_disconnect_is_told(void **state)
{
    (void)state;
    fx_t *fx = fx_open(16, NULL, true);
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    assert_int_equal(fx->fab[0]->ops.send(fx->fab[0], c01, "x", 1, 1), KVS_OK);
    fx_run(fx);
    kvs_conn_t *c10 = fx->rec[1].e[0].conn; /* the reverse conn, from the RECV */
    fx->fab[0]->ops.disconnect(fx->fab[0], c01);
    fx_run(fx);
    assert_int_equal(recorder_count(&fx->rec[1], KVS_COMPLETION_DISCONNECT), 1);
    const rec_entry_t *e = &fx->rec[1].e[fx->rec[1].n - 1];
    assert_int_equal(e->kind, KVS_COMPLETION_DISCONNECT);
    assert_ptr_equal(e->conn, c10);
    assert_int_equal(e->status, KVS_EPEER);
    assert_int_equal(recorder_count(&fx->rec[0], KVS_COMPLETION_DISCONNECT), 0);
    fx_close(fx);
}

static void test_sim_fabric_cq_overflow_marks_nic_errored(void **state)
{
    (void)state;
    sim_net_config_t cfg = {.cq_entries = 4};
    fx_t *fx = fx_open(17, &cfg, true);
    sim_nic_set_wake(fx->nic[1], NULL, NULL); /* nobody polls nic1 */
    kvs_fabric_t *fab0 = fx->fab[0], *fab1 = fx->fab[1];
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    kvs_conn_t *c10 = fx_connect(fx, 1, 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(fab0->ops.send(fab0, c01, "m", 1, (uint64_t)i), KVS_OK);
    fx_run(fx);
    kvs_completion_t out[2];
    assert_int_equal(fab1->ops.poll(fab1, out, 2), 2); /* room for two more */
    for (int i = 0; i < 3; i++)
        assert_int_equal(fab0->ops.send(fab0, c01, "m", 1, 10 + (uint64_t)i), KVS_OK);
    fx_run(fx);
    assert_int_equal(fab1->ops.poll(fab1, out, 2), KVS_EFULL);
    assert_non_null(strstr(fab1->last_backend_msg, "overran"));
    assert_int_equal(fab1->ops.poll(fab1, out, 2), KVS_EFULL); /* from then on */
    assert_int_equal(fab1->ops.send(fab1, c10, "m", 1, 1), KVS_EFULL);
    /* the sender is unaffected */
    assert_int_equal(fx->rec[0].poll_error, 0);
    assert_int_equal(recorder_count(&fx->rec[0], KVS_COMPLETION_SEND), 7);
    fx_close(fx);
}

static void test_sim_fabric_link_down_drops(void **state)
{
    (void)state;
    fx_t *fx = fx_open(18, NULL, true);
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, MIB, &s);
    kvs_fabric_t *fab0 = fx->fab[0];
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    const uint64_t tx_done = T_PER_OP_NS + t_wire_ns(MIB);

    /* receiver down: the write fails with EPEER, the message vanishes */
    sim_nic_set_link_up(fx->nic[1], false);
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, MIB, 1, true, 1), KVS_OK);
    assert_int_equal(fab0->ops.send(fab0, c01, "lost", 5, 2), KVS_OK);
    fx_run(fx);
    const rec_entry_t *w = fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1);
    assert_int_equal(w->status, KVS_EPEER);
    assert_int_equal(w->t_ns, tx_done + 2 * T_LATENCY_NS);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_SEND, 2)->status, KVS_OK);
    assert_int_equal(fx->rec[1].n, 0);
    assert_true(all_zero(fx_host(fx, 1, 0, MIB), MIB));

    /* back up: works again */
    sim_nic_set_link_up(fx->nic[1], true);
    const uint64_t t0 = sim_engine_now_ns(fx->eng);
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, MIB, 3, true, 3), KVS_OK);
    fx_run(fx);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 3)->status, KVS_OK);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 3)->t_ns,
                     t0 + tx_done + 2 * T_LATENCY_NS);
    assert_int_equal(recorder_count(&fx->rec[1], KVS_COMPLETION_IMM), 1);
    assert_memory_equal(fx_host(fx, 1, 0, MIB), fx_host(fx, 0, 0, MIB), MIB);

    /* sender down: dropped as it leaves */
    sim_nic_set_link_up(fx->nic[0], false);
    const uint64_t t1 = sim_engine_now_ns(fx->eng);
    assert_int_equal(fx_write(fx, 0, 1, 0, 2 * MIB, MIB, 4, true, 4), KVS_OK);
    assert_int_equal(fab0->ops.send(fab0, c01, "lost", 5, 5), KVS_OK);
    fx_run(fx);
    w = fx_completion(fx, 0, KVS_COMPLETION_WRITE, 4);
    assert_int_equal(w->status, KVS_EPEER);
    assert_int_equal(w->t_ns, t1 + tx_done + 2 * T_LATENCY_NS);
    assert_int_equal(recorder_count(&fx->rec[1], KVS_COMPLETION_IMM), 1);
    assert_int_equal(recorder_count(&fx->rec[1], KVS_COMPLETION_RECV), 0);
    assert_true(all_zero(fx_host(fx, 1, 2 * MIB, MIB), MIB));
    fx_close(fx);
}

static void test_sim_fabric_fail_next_writes(void **state)
{
    (void)state;
    fx_t *fx = fx_open(19, NULL, true);
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, 3 * MIB, &s);
    sim_nic_fail_next_writes(fx->nic[0], 2);
    for (uint64_t i = 0; i < 3; i++)
        assert_int_equal(fx_write(fx, 0, 1, i * MIB, i * MIB, MIB, i, true, (uint32_t)i),
                         KVS_OK);
    fx_run(fx);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 0)->status, KVS_EREMOTE);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->status, KVS_EREMOTE);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 2)->status, KVS_OK);
    assert_true(all_zero(fx_host(fx, 1, 0, 2 * MIB), 2 * MIB));
    assert_memory_equal(fx_host(fx, 1, 2 * MIB, MIB), fx_host(fx, 0, 2 * MIB, MIB), MIB);
    assert_int_equal(fx->rec[1].n, 1);
    assert_int_equal(fx->rec[1].e[0].imm, 2);
    fx_close(fx);
}

/* A connection's send queue (sq_depth) holds each write and send from post
 * until its completion is polled: the (depth+1)-th post is refused with
 * KVS_EAGAIN, naming the knob, and queues nothing; a completion that
 * arrived but was not polled frees nothing; polling one frees one slot.
 * Queues are per connection, and a reconnected one starts empty. */
static void test_sim_fabric_sq_depth_refuses_until_polled(void **state)
{
    (void)state;
    const sim_net_config_t cfg = {.sq_depth = 2};
    fx_t *fx = fx_open(23, &cfg, true);
    sim_nic_set_wake(fx->nic[0], NULL, NULL); /* nic0 is polled by hand */
    kvs_fabric_t *fab0 = fx->fab[0];
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, 4 * MIB, &s);
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, MIB, 1, true, 1), KVS_OK);
    assert_int_equal(fab0->ops.send(fab0, c01, "m", 2, 2), KVS_OK);
    /* full: a write and a send are refused alike, and counted */
    assert_int_equal(fx_write(fx, 0, 1, MIB, MIB, MIB, 3, true, 3), KVS_EAGAIN);
    assert_non_null(strstr(fab0->last_backend_msg, "2 work requests in flight fill the send "
                                                   "queue to nic1 (sq_depth 2)"));
    assert_non_null(strstr(fab0->last_backend_msg, "poll completions"));
    assert_non_null(strstr(fab0->last_backend_msg, "raise sq_depth"));
    assert_int_equal(fab0->ops.send(fab0, c01, "n", 2, 4), KVS_EAGAIN);
    assert_non_null(strstr(fab0->last_backend_msg, "send on nic0"));
    assert_int_equal(sim_nic_posts_refused(fx->nic[0]), 2);
    assert_int_equal(sim_nic_msgs(fx->nic[0]), 1); /* the refused send is not counted */
    /* another connection of the same NIC has its own queue */
    assert_int_equal(fx_write(fx, 0, 2, 3 * MIB, 0, KIB, 5, false, 0), KVS_OK);
    fx_run(fx);
    /* the refused posts queued nothing: one IMM and one RECV at nic1 */
    assert_int_equal(fx->rec[1].n, 2);
    assert_int_equal(recorder_count(&fx->rec[1], KVS_COMPLETION_IMM), 1);
    assert_int_equal(recorder_count(&fx->rec[1], KVS_COMPLETION_RECV), 1);
    assert_true(all_zero(fx_host(fx, 1, MIB, MIB), MIB));
    /* completed but not polled: still full */
    assert_int_equal(fx_write(fx, 0, 1, MIB, MIB, MIB, 3, true, 3), KVS_EAGAIN);
    assert_int_equal(sim_nic_posts_refused(fx->nic[0]), 3);
    kvs_completion_t out[8];
    assert_int_equal(fab0->ops.poll(fab0, out, 1), 1);
    assert_int_equal(out[0].kind, KVS_COMPLETION_SEND); /* delivered first */
    assert_int_equal(out[0].wr_id, 2);
    /* one slot free: the write goes, then the queue is full again */
    assert_int_equal(fx_write(fx, 0, 1, MIB, MIB, MIB, 3, true, 3), KVS_OK);
    assert_int_equal(fab0->ops.send(fab0, c01, "n", 2, 4), KVS_EAGAIN);
    assert_int_equal(sim_nic_posts_refused(fx->nic[0]), 4);
    fx_run(fx);
    assert_memory_equal(fx_host(fx, 1, MIB, MIB), fx_host(fx, 0, MIB, MIB), MIB);
    assert_int_equal(fab0->ops.poll(fab0, out, 8), 3); /* WRITE 1, 5 and 3 */
    assert_int_equal(fab0->ops.send(fab0, c01, "n", 2, 4), KVS_OK);
    assert_int_equal(fx_write(fx, 0, 1, 2 * MIB, 2 * MIB, MIB, 6, false, 0), KVS_OK);
    fx_run(fx); /* their completions wait in nic0's CQ, unpolled */
    /* a reconnected conn starts empty, and the old conn's completions,
     * polled after, free nothing of it (the same slot, a new conn) */
    fab0->ops.disconnect(fab0, c01);
    kvs_conn_t *again = fx_connect(fx, 0, 1);
    assert_ptr_equal(again, c01);
    assert_int_equal(fab0->ops.send(fab0, again, "a", 2, 7), KVS_OK);
    assert_int_equal(fab0->ops.send(fab0, again, "b", 2, 8), KVS_OK);
    assert_int_equal(fab0->ops.poll(fab0, out, 8), 2); /* SEND 4, WRITE 6 */
    assert_int_equal(fab0->ops.send(fab0, again, "c", 2, 9), KVS_EAGAIN);
    assert_int_equal(sim_nic_posts_refused(fx->nic[0]), 5);
    fx_close(fx);
}

/* sq_depth 0, the default: nothing is ever refused. */
static void test_sim_fabric_sq_depth_zero_is_unlimited(void **state)
{
    (void)state;
    fx_t *fx = fx_open(24, NULL, true);
    sim_nic_set_wake(fx->nic[0], NULL, NULL); /* never polled */
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    for (uint64_t i = 0; i < 5000; i++)
        assert_int_equal(fx->fab[0]->ops.send(fx->fab[0], c01, "m", 2, i), KVS_OK);
    assert_int_equal(sim_nic_posts_refused(fx->nic[0]), 0);
    fx_close(fx);
}

static void test_sim_fabric_destroy_refused_and_mid_flight(void **state)
{
    (void)state;
    fx_t *fx = fx_open(20, NULL, true);
    assert_int_equal(sim_net_destroy(fx->net), KVS_EBUSY);
    assert_int_equal(sim_net_destroy(NULL), KVS_OK);
    sim_nic_destroy(NULL);

    /* receiver destroyed mid-write: the sender learns KVS_EPEER */
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    assert_int_equal(fx_write(fx, 0, 1, 0, 0, 16 * MIB, 1, true, 1), KVS_OK);
    assert_int_equal(fx->fab[0]->ops.send(fx->fab[0], c01, "hi", 3, 2), KVS_OK);
    sim_engine_run(fx->eng, 100000, 0); /* some segments have landed */
    fx_destroy_nic(fx, 1);
    fx_run(fx);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->status, KVS_EPEER);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_SEND, 2)->status, KVS_OK);
    assert_int_equal(fx->fab[0]->ops.send(fx->fab[0], c01, "x", 1, 3), KVS_EPEER);
    kvs_conn_t *c = NULL;
    assert_int_equal(fx->fab[0]->ops.connect(fx->fab[0], "nic1", &c), KVS_ENOENT);

    /* sender destroyed mid-write: nothing more lands; the receiver's only
     * completion says its connection died */
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, 16 * MIB, &s);
    assert_int_equal(fx_write(fx, 0, 2, 0, 0, 16 * MIB, 3, true, 3), KVS_OK);
    assert_int_equal(fx_write(fx, 0, 2, 0, 16 * MIB, 16 * MIB, 4, true, 4), KVS_OK);
    sim_engine_run(fx->eng, sim_engine_now_ns(fx->eng) + 100000, 0); /* ~2 segments each */
    fx_destroy_nic(fx, 0);
    fx_run(fx);
    assert_int_equal(fx->rec[2].n, 1);
    assert_int_equal(fx->rec[2].e[0].kind, KVS_COMPLETION_DISCONNECT);
    assert_int_equal(fx->rec[2].e[0].status, KVS_EPEER);
    assert_true(all_zero(fx_host(fx, 2, 8 * MIB, 8 * MIB), 8 * MIB));
    assert_true(all_zero(fx_host(fx, 2, 24 * MIB, 8 * MIB), 8 * MIB));

    /* the net can go with events still pending: they are cancelled */
    assert_int_equal(fx_connect(fx, 2, 2) != NULL, 1); /* loopback */
    assert_int_equal(fx_write(fx, 2, 2, 0, 32 * MIB, 4 * MIB, 5, true, 5), KVS_OK);
    sim_engine_run(fx->eng, sim_engine_now_ns(fx->eng) + 25000, 0); /* seg 0 on the wire */
    assert_true(sim_engine_pending(fx->eng) > 0);
    fx_destroy_nic(fx, 2);
    assert_int_equal(sim_net_destroy(fx->net), KVS_OK);
    assert_int_equal(sim_engine_pending(fx->eng), 0);
    assert_int_equal(sim_net_create(fx->eng, NULL, &fx->net), KVS_OK); /* for fx_close */
    fx_close(fx);
}

static void test_sim_fabric_loopback(void **state)
{
    (void)state;
    fx_t *fx = fx_open(21, NULL, true);
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, MIB, &s);
    kvs_conn_t *c00 = fx_connect(fx, 0, 0);
    assert_int_equal(fx_write(fx, 0, 0, 0, 8 * MIB, MIB, 1, true, 11), KVS_OK);
    assert_int_equal(fx->fab[0]->ops.send(fx->fab[0], c00, "self", 5, 2), KVS_OK);
    fx_run(fx);
    assert_memory_equal(fx_host(fx, 0, 8 * MIB, MIB), fx_host(fx, 0, 0, MIB), MIB);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->status, KVS_OK);
    assert_int_equal(recorder_count(&fx->rec[0], KVS_COMPLETION_IMM), 1);
    assert_int_equal(recorder_count(&fx->rec[0], KVS_COMPLETION_RECV), 1);
    fx_close(fx);
}

/* Random writes (some with bad keys), messages, link flaps and injected
 * failures on small segments: every posted write and send gets exactly one
 * completion, and targets see one IMM per successful write with imm. */
static void test_sim_fabric_random_ops_complete_once(void **state)
{
    (void)state;
    sim_net_config_t cfg = {.segment_bytes = 64 * KIB};
    fx_t *fx = fx_open(22, &cfg, true);
    uint64_t s = fx->seed;
    enum { OPS = 600 };
    bool with_imm[OPS] = {false};
    uint64_t writes[FX_NICS] = {0}, sends[FX_NICS] = {0};
    for (int op = 0; op < OPS; op++) {
        const int from = (int)(xorshift64(&s) % FX_NICS);
        const int to = (int)(xorshift64(&s) % FX_NICS);
        const uint64_t r = xorshift64(&s) % 100;
        if (r < 50) {
            const uint64_t len = 1 + xorshift64(&s) % (3 * MIB);
            const uint64_t off = xorshift64(&s) % (FX_BUF_BYTES - len);
            kvs_write_desc_t d = {.local_addr = fx->buf[from] + off, .local_mr = fx->mr[from],
                                  .len_bytes = len, .remote_addr = fx->buf[to] + off,
                                  .rkey = fx->rkey[to], .with_imm = (r & 1) != 0,
                                  .imm = (uint32_t)op, .wr_id = (uint64_t)op};
            if (r < 5)
                d.rkey = fx->rkey[(to + 1) % FX_NICS];
            assert_int_equal(fx->fab[from]->ops.write(fx->fab[from], fx_connect(fx, from, to),
                                                      &d),
                             KVS_OK);
            writes[from]++;
            with_imm[op] = d.with_imm;
        } else if (r < 85) {
            assert_int_equal(fx->fab[from]->ops.send(fx->fab[from], fx_connect(fx, from, to),
                                                     "m", 1, (uint64_t)op),
                             KVS_OK);
            sends[from]++;
        } else if (r < 95) {
            sim_nic_set_link_up(fx->nic[from], (xorshift64(&s) & 3) != 0);
        } else {
            sim_nic_fail_next_writes(fx->nic[from], (uint32_t)(xorshift64(&s) % 3));
        }
        sim_engine_run(fx->eng, sim_engine_now_ns(fx->eng) + xorshift64(&s) % 40000, 0);
    }
    fx_run(fx);
    assert_int_equal(sim_engine_pending(fx->eng), 0);
    uint64_t ok_imm = 0, imms = 0, failed = 0;
    for (int i = 0; i < FX_NICS; i++) {
        assert_int_equal(fx->rec[i].poll_error, 0);
        assert_int_equal(recorder_count(&fx->rec[i], KVS_COMPLETION_WRITE), writes[i]);
        assert_int_equal(recorder_count(&fx->rec[i], KVS_COMPLETION_SEND), sends[i]);
        imms += recorder_count(&fx->rec[i], KVS_COMPLETION_IMM);
        for (size_t k = 0; k < fx->rec[i].n; k++) {
            const rec_entry_t *e = &fx->rec[i].e[k];
            if (e->kind != KVS_COMPLETION_WRITE)
                continue;
            assert_true(e->wr_id < OPS);
            if (e->status == KVS_OK)
                ok_imm += with_imm[e->wr_id];
            else
                failed++;
        }
    }
    print_message("random ops: %llu writes failed, %llu IMMs, %llu sends\n",
                  (unsigned long long)failed, (unsigned long long)imms,
                  (unsigned long long)(sends[0] + sends[1] + sends[2]));
    assert_true(failed > 0);
    assert_true(imms > 0);
    assert_int_equal(imms, ok_imm);
    fx_close(fx);
}

/* A small scenario; fills out[] with rkeys and completion times. */
static size_t scenario(uint64_t seed, uint64_t *out, size_t max, uint64_t *digest)
{
    fx_t *fx = fx_open(seed, NULL, true);
    size_t n = 0;
    for (int i = 0; i < FX_NICS; i++)
        out[n++] = fx->rkey[i];
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    for (uint64_t i = 0; i < 8; i++) {
        assert_int_equal(fx_write(fx, (int)(i % 2), 2, 0, i * MIB, MIB + i * 4096, i, true,
                                  (uint32_t)i),
                         KVS_OK);
        assert_int_equal(fx->fab[0]->ops.send(fx->fab[0], c01, "m", 1, 100 + i), KVS_OK);
    }
    fx_run(fx);
    for (int i = 0; i < FX_NICS; i++)
        for (size_t k = 0; k < fx->rec[i].n && n < max; k++)
            out[n++] = fx->rec[i].e[k].t_ns ^ (fx->rec[i].e[k].wr_id << 40);
    *digest = sim_engine_digest(fx->eng);
    fx_close(fx);
    return n;
}

/* A write of len bytes from buf[from] + src_off to buf[to] + dst_off on conn
 * c under key rkey. */
static int fx_write_key(fx_t *fx, int from, kvs_conn_t *c, int to, uint64_t src_off,
                        uint64_t dst_off, uint64_t len, uint64_t rkey, uint64_t wr_id)
{
    const kvs_write_desc_t d = {.local_addr = fx->buf[from] + src_off,
                                .local_mr = fx->mr[from], .len_bytes = len,
                                .remote_addr = fx->buf[to] + dst_off, .rkey = rkey,
                                .wr_id = wr_id};
    return fx->fab[from]->ops.write(fx->fab[from], c, &d);
}

/* key_grant opens exactly one range of nic1's MR to nic0's connection, and
 * only until key_revoke: a write inside lands; one reaching one page past
 * the end, one from nic2 (another connection), one on a new connection of
 * nic0 after the old one was disconnected, and one after the revoke each
 * complete with KVS_EREMOTE and change no byte. Granting and revoking post
 * no work request and schedule no event. */
static void test_sim_fabric_key_grant_scopes_writes(void **state)
{
    (void)state;
    fx_t *fx = fx_open(21, NULL, true);
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, 2 * MIB, &s);
    fx_fill_random(fx, 2, 0, MIB, &s);
    kvs_fabric_t *f1 = fx->fab[1];
    assert_true(kvs__net_can_grant(f1));
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    kvs_conn_t *c10 = fx_connect(fx, 1, 0); /* nic1's side of the same connection */
    kvs_conn_t *c21 = fx_connect(fx, 2, 1);
    const uint64_t events = sim_engine_pending(fx->eng);
    kvs_grant_t *g = NULL;
    uint64_t key = 0;
    assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[1], fx->buf[1] + 64 * KIB, 64 * KIB,
                                       &g, &key),
                     KVS_OK);
    assert_non_null(g);
    assert_true(key != 0 && key <= UINT32_MAX);
    for (int i = 0; i < FX_NICS; i++)
        assert_int_not_equal(key, fx->rkey[i]); /* unique among the live keys */
    assert_int_equal(sim_engine_pending(fx->eng), events);
    assert_int_equal(sim_nic_grants_live(fx->nic[1]), 1);
    /* 1: exactly the range; 2: one page past its end; 3: from nic2 */
    assert_int_equal(fx_write_key(fx, 0, c01, 1, 0, 64 * KIB, 64 * KIB, key, 1), KVS_OK);
    assert_int_equal(fx_write_key(fx, 0, c01, 1, MIB, 68 * KIB, 64 * KIB, key, 2), KVS_OK);
    assert_int_equal(fx_write_key(fx, 2, c21, 1, 0, 64 * KIB, 64 * KIB, key, 3), KVS_OK);
    fx_run(fx);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->status, KVS_OK);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 2)->status, KVS_EREMOTE);
    assert_int_equal(fx_completion(fx, 2, KVS_COMPLETION_WRITE, 3)->status, KVS_EREMOTE);
    assert_memory_equal(fx_host(fx, 1, 64 * KIB, 64 * KIB), fx_host(fx, 0, 0, 64 * KIB),
                        64 * KIB);
    assert_true(all_zero(fx_host(fx, 1, 128 * KIB, 64 * KIB), 64 * KIB));
    /* 4: after the revoke, exactly the range again */
    assert_int_equal(f1->ops.key_revoke(f1, g), KVS_OK);
    assert_int_equal(sim_nic_grants_live(fx->nic[1]), 0);
    assert_int_equal(f1->ops.key_revoke(f1, g), KVS_ENOENT);
    assert_int_equal(fx_write_key(fx, 0, c01, 1, MIB, 64 * KIB, 64 * KIB, key, 4), KVS_OK);
    /* 5: a grant to a connection that is then disconnected: nic0's next
     * connection to nic1 is another one */
    assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[1], fx->buf[1], 4 * KIB, &g, &key),
                     KVS_OK);
    fx->fab[0]->ops.disconnect(fx->fab[0], c01);
    kvs_conn_t *again = fx_connect(fx, 0, 1);
    assert_int_equal(fx_write_key(fx, 0, again, 1, MIB, 0, 4 * KIB, key, 5), KVS_OK);
    fx_run(fx);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 4)->status, KVS_EREMOTE);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 5)->status, KVS_EREMOTE);
    assert_memory_equal(fx_host(fx, 1, 64 * KIB, 64 * KIB), fx_host(fx, 0, 0, 64 * KIB),
                        64 * KIB);
    assert_true(all_zero(fx_host(fx, 1, 0, 4 * KIB), 4 * KIB));
    assert_int_equal(recorder_count(&fx->rec[1], KVS_COMPLETION_IMM), 0);
    /* The grant of the dead connection is revoked like any other. */
    assert_int_equal(f1->ops.key_revoke(f1, g), KVS_OK);
    assert_int_equal(sim_nic_grants_made(fx->nic[1]), 2);
    assert_int_equal(sim_nic_grants_revoked(fx->nic[1]), 2);
    assert_int_equal(sim_nic_writes(fx->nic[0]), 1);
    fx_close(fx);
}

/* mr_register_sealed (fabric ops version 5): the registration's own key
 * opens nothing remote (a write under it completes with KVS_EREMOTE and
 * changes no byte), while a grant into it opens its range as usual; the
 * key still draws from the one rkey stream and is unique. */
static void test_sim_fabric_sealed_mr_opens_only_by_grant(void **state)
{
    (void)state;
    fx_t *fx = fx_open(23, NULL, true);
    uint64_t s = fx->seed;
    fx_fill_random(fx, 0, 0, MIB, &s);
    kvs_fabric_t *f1 = fx->fab[1];
    kvs_conn_t *c01 = fx_connect(fx, 0, 1);
    kvs_conn_t *c10 = fx_connect(fx, 1, 0);
    kvs_mr_t *sealed = NULL;
    uint64_t own = 0;
    assert_int_equal(f1->ops.mr_register_sealed(f1, fx->dev[1], fx->buf[1] + 256 * KIB,
                                                128 * KIB, &sealed, &own),
                     KVS_OK);
    assert_true(own != 0 && own <= UINT32_MAX);
    for (int i = 0; i < FX_NICS; i++)
        assert_int_not_equal(own, fx->rkey[i]);
    kvs_grant_t *g = NULL;
    uint64_t key = 0;
    assert_int_equal(f1->ops.key_grant(f1, c10, sealed, fx->buf[1] + 256 * KIB, 64 * KIB,
                                       &g, &key),
                     KVS_OK);
    assert_int_equal(fx_write_key(fx, 0, c01, 1, 0, 256 * KIB, 64 * KIB, own, 1), KVS_OK);
    assert_int_equal(fx_write_key(fx, 0, c01, 1, 0, 320 * KIB, 4 * KIB, own, 2), KVS_OK);
    assert_int_equal(fx_write_key(fx, 0, c01, 1, 0, 256 * KIB, 64 * KIB, key, 3), KVS_OK);
    fx_run(fx);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 1)->status, KVS_EREMOTE);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 2)->status, KVS_EREMOTE);
    assert_int_equal(fx_completion(fx, 0, KVS_COMPLETION_WRITE, 3)->status, KVS_OK);
    assert_memory_equal(fx_host(fx, 1, 256 * KIB, 64 * KIB), fx_host(fx, 0, 0, 64 * KIB),
                        64 * KIB);
    assert_true(all_zero(fx_host(fx, 1, 320 * KIB, 64 * KIB), 64 * KIB));
    assert_int_equal(f1->ops.mr_deregister(f1, sealed), KVS_EBUSY);
    assert_int_equal(f1->ops.key_revoke(f1, g), KVS_OK);
    assert_int_equal(f1->ops.mr_deregister(f1, sealed), KVS_OK);
    fx_close(fx);
}

/* What key_grant refuses, and its bound: max_grants live at once. An MR
 * with a live grant is not deregistered. A NIC of a net with no_key_grant
 * binds a version-3 table: the core's defaults answer KVS_ENOTSUP. */
static void test_sim_fabric_key_grant_refusals_and_bound(void **state)
{
    (void)state;
    sim_net_config_t cfg = {.max_grants = 2};
    fx_t *fx = fx_open(22, &cfg, true);
    kvs_fabric_t *f1 = fx->fab[1];
    kvs_conn_t *c10 = fx_connect(fx, 1, 0);
    kvs_grant_t *g[3] = {NULL, NULL, NULL};
    uint64_t key[3] = {0, 0, 0};
    const uint64_t b = fx->buf[1];
    assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[1], b, 0, &g[0], &key[0]), KVS_EINVAL);
    assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[1], b + FX_BUF_BYTES - 8, 16, &g[0],
                                       &key[0]),
                     KVS_EINVAL);
    assert_non_null(strstr(f1->last_backend_msg, "inside its MR"));
    assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[2], b, 8, &g[0], &key[0]), KVS_EINVAL);
    assert_int_equal(f1->ops.key_grant(f1, fx_connect(fx, 0, 1), fx->mr[1], b, 8, &g[0],
                                       &key[0]),
                     KVS_EINVAL); /* nic0's side of the connection */
    assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[1], b, 8, NULL, &key[0]), KVS_EINVAL);
    for (int i = 0; i < 2; i++)
        assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[1], b + (uint64_t)i * 8, 8, &g[i],
                                           &key[i]),
                         KVS_OK);
    assert_int_not_equal(key[0], key[1]);
    assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[1], b, 8, &g[2], &key[2]), KVS_EFULL);
    assert_non_null(strstr(f1->last_backend_msg, "max_grants"));
    assert_int_equal(f1->ops.mr_deregister(f1, fx->mr[1]), KVS_EBUSY);
    assert_int_equal(f1->ops.key_revoke(f1, g[0]), KVS_OK);
    assert_int_equal(f1->ops.key_grant(f1, c10, fx->mr[1], b, 8, &g[2], &key[2]), KVS_OK);
    assert_int_equal(f1->ops.key_revoke(f1, g[1]), KVS_OK);
    assert_int_equal(f1->ops.key_revoke(f1, g[2]), KVS_OK);
    assert_int_equal(fx->fab[0]->ops.key_revoke(fx->fab[0], g[2]), KVS_ENOENT);
    assert_int_equal(sim_nic_grants_live(fx->nic[1]), 0);
    fx_close(fx);

    sim_net_config_t v3 = {.no_key_grant = true};
    fx = fx_open(23, &v3, true);
    f1 = fx->fab[1];
    assert_int_equal(f1->ops.version, 3);
    assert_false(kvs__net_can_grant(f1));
    assert_ptr_equal(sim_nic_from_fabric(f1), fx->nic[1]);
    assert_int_equal(kvs__net_key_grant(f1, fx_connect(fx, 1, 0), fx->mr[1], fx->buf[1], 8,
                                        &g[0], &key[0]),
                     KVS_ENOTSUP);
    fx_close(fx);
}

static void test_sim_fabric_deterministic(void **state)
{
    (void)state;
    uint64_t a[64], b[64], c[64], da, db, dc;
    size_t na = scenario(42, a, 64, &da);
    size_t nb = scenario(42, b, 64, &db);
    size_t nc = scenario(43, c, 64, &dc);
    assert_int_equal(na, nb);
    assert_int_equal(na, 3 + 8 + 8 + 8 + 8); /* rkeys, WRITE, SEND, IMM, RECV */
    assert_memory_equal(a, b, na * sizeof a[0]);
    assert_int_equal(da, db);
    assert_int_equal(nc, na);
    for (int i = 0; i < FX_NICS; i++)
        assert_int_not_equal(a[i], c[i]); /* another seed, other keys */
    assert_memory_equal(a + 3, c + 3, (na - 3) * sizeof a[0]); /* same times */
}

/* ---- the fabric contract (tests/fixtures/fabric_contract.c) on this backend -------- */

/* Two NICs "a" and "b" on their own GPUs; regions are GPU memory, seen
 * through sim_gpu_host; fp_take runs the engine before each poll. */
typedef struct sim_duo {
    sim_engine_t *eng;
    sim_net_t *net;
    sim_gpu_t *gpu[2];
    sim_nic_t *nic[2];
    fp_memory_t mem[2];
} sim_duo_t;

static void sim_duo_alloc(void *ctx, uint64_t len, uint64_t *addr, uint8_t **mem)
{
    sim_gpu_t *gpu = ctx;
    kvs_device_t *dev = sim_gpu_device(gpu);
    assert_int_equal(dev->ops.mem_alloc(dev, len, addr), KVS_OK);
    *mem = sim_gpu_host(gpu, *addr, len);
    assert_non_null(*mem);
    memset(*mem, 0, len);
}

static void sim_duo_release(void *ctx, uint64_t addr)
{
    kvs_device_t *dev = sim_gpu_device(ctx);
    assert_int_equal(dev->ops.mem_free(dev, addr), KVS_OK);
}

static void sim_duo_step(void *ctx)
{
    sim_duo_t *d = ctx;
    sim_engine_run(d->eng, UINT64_MAX, 0);
}

static bool sim_contract_open(void *ctx, fp_pair_t *p)
{
    (void)ctx;
    sim_duo_t *d = calloc(1, sizeof *d);
    assert_non_null(d);
    assert_int_equal(sim_engine_create(0xFC, 64, &d->eng), KVS_OK);
    assert_int_equal(sim_net_create(d->eng, NULL, &d->net), KVS_OK);
    fp_side_t *sides[2] = {&p->a, &p->b};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sim_gpu_create(d->eng, NULL, (uint32_t)i, &d->gpu[i]), KVS_OK);
        assert_int_equal(sim_nic_create(d->net, i == 0 ? "a" : "b", d->gpu[i], &d->nic[i]),
                         KVS_OK);
        d->mem[i] = (fp_memory_t){.dev = sim_gpu_device(d->gpu[i]), .ctx = d->gpu[i],
                                  .alloc = sim_duo_alloc, .release = sim_duo_release};
        fp_side_init(sides[i], sim_nic_fabric(d->nic[i]));
        sides[i]->mem = &d->mem[i];
    }
    p->name = "the simulated NIC";
    p->step = sim_duo_step;
    p->step_ctx = d; /* close finds the duo here */
    /* Connections by name are made at once; a hello hands a its side. */
    assert_int_equal(p->b.fab->ops.connect(p->b.fab, "a", &p->ab), KVS_OK);
    assert_int_equal(p->b.fab->ops.send(p->b.fab, p->ab, "hello", 5, 1), KVS_OK);
    p->ba = fp_take(p, &p->a, KVS_COMPLETION_RECV, NULL).conn;
    assert_non_null(p->ba);
    (void)fp_take(p, &p->b, KVS_COMPLETION_SEND, p->ab);
    return true;
}

static void sim_contract_close(void *ctx, fp_pair_t *p)
{
    (void)ctx;
    sim_duo_t *d = p->step_ctx;
    for (int i = 0; i < 2; i++)
        sim_nic_destroy(d->nic[i]);
    fp_side_fini(&p->a);
    fp_side_fini(&p->b);
    assert_int_equal(sim_net_destroy(d->net), KVS_OK);
    for (int i = 0; i < 2; i++)
        sim_gpu_destroy(d->gpu[i]);
    sim_engine_destroy(d->eng);
    free(d);
}

static bool sim_contract_grants(void *ctx, fp_pair_t *p)
{
    (void)ctx;
    (void)p;
    return true;
}

static const fc_backend_t sim_contract = {
    .name = "the simulated NIC",
    .open = sim_contract_open,
    .close = sim_contract_close,
    .grants = sim_contract_grants,
};

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_fabric_ops_table),
        cmocka_unit_test(test_sim_fabric_register_rkeys_unique),
        cmocka_unit_test(test_sim_fabric_connect_by_name),
        cmocka_unit_test(test_sim_fabric_write_lands_exact_bytes_at_modeled_time),
        cmocka_unit_test(test_sim_fabric_write_wrong_rkey_fails_remote),
        cmocka_unit_test(test_sim_fabric_write_outside_mr_fails_remote),
        cmocka_unit_test(test_sim_fabric_write_rejects_bad_local_side),
        cmocka_unit_test(test_sim_fabric_concurrent_writes_share_bandwidth),
        cmocka_unit_test(test_sim_fabric_incast_shares_receiver),
        cmocka_unit_test(test_sim_fabric_small_writes_pay_per_op),
        cmocka_unit_test(test_sim_fabric_messages_in_order_with_ctrl_latency),
        cmocka_unit_test(test_sim_fabric_disconnect_kills_peer_side),
        cmocka_unit_test(test_sim_fabric_disconnect_is_told),
        cmocka_unit_test(test_sim_fabric_cq_overflow_marks_nic_errored),
        cmocka_unit_test(test_sim_fabric_link_down_drops),
        cmocka_unit_test(test_sim_fabric_fail_next_writes),
        cmocka_unit_test(test_sim_fabric_sq_depth_refuses_until_polled),
        cmocka_unit_test(test_sim_fabric_sq_depth_zero_is_unlimited),
        cmocka_unit_test(test_sim_fabric_destroy_refused_and_mid_flight),
        cmocka_unit_test(test_sim_fabric_loopback),
        cmocka_unit_test(test_sim_fabric_random_ops_complete_once),
        cmocka_unit_test(test_sim_fabric_key_grant_scopes_writes),
        cmocka_unit_test(test_sim_fabric_sealed_mr_opens_only_by_grant),
        cmocka_unit_test(test_sim_fabric_key_grant_refusals_and_bound),
        cmocka_unit_test(test_sim_fabric_deterministic),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed + fc_run(&sim_contract);
}
