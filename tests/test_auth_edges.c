/*
 * test_auth_edges.c - authenticated registration (docs/security.md,
 * src/handshake.c) between real handlers on the simulated cluster of
 * edge_cluster.h: the same secret on both sides works; a decode without
 * the secret, a prefill without it, a wrong secret, a stranger without
 * it and a replayed registration are each refused before any key or
 * address reaches the unproven side, counted (auth_refused) and logged
 * with the peer's address; with no secret anywhere nothing changes.
 */
#define _DEFAULT_SOURCE /* setenv */
#include "edge_cluster.h"

#include "auth.h"
#include "fake_backend.h"
#include "handler.h"

#include <stdlib.h>
#include <string.h>

#define SECRET_A "KVS_TEST_SECRET_A"
#define SECRET_B "KVS_TEST_SECRET_B"

static int setup(void **state)
{
    (void)state;
    setenv(SECRET_A, "correct horse battery staple 42", 1);
    setenv(SECRET_B, "another cluster's secret, wrong", 1);
    return 0;
}

static edge_opts_t opts(const char *prefill_env, const char *decode_env)
{
    edge_opts_t o = edge_defaults();
    o.prefill_secret_env = prefill_env;
    o.decode_secret_env = decode_env;
    return o;
}

static void test_auth_edges_same_secret_transfers(void **state)
{
    (void)state;
    edge_opts_t o = opts(SECRET_A, SECRET_A);
    edge_cluster_t *cl = edge_create(&o);
    edge_run(cl);
    assert_int_equal(kvs_decode_peers_ready(edge_decode(cl, 0)->dec), 2);
    const edge_room_t rooms[] = {{1, 0, 40}, {2, 16, 64}};
    edge_transfer_ok(cl, rooms, 2);
    for (int i = 0; i < edge_nnodes(cl); i++)
        assert_int_equal(edge_stats(&cl->nodes[i]).auth_refused, 0);
    edge_destroy(cl);
}

static void test_auth_edges_open_cluster_as_before(void **state)
{
    (void)state;
    edge_opts_t o = opts(NULL, NULL);
    edge_cluster_t *cl = edge_create(&o);
    edge_run(cl);
    const edge_room_t rooms[] = {{1, 0, 40}};
    edge_transfer_ok(cl, rooms, 1);
    for (int i = 0; i < edge_nnodes(cl); i++)
        assert_int_equal(edge_stats(&cl->nodes[i]).auth_refused, 0);
    edge_destroy(cl);
}

/* A decode without the secret: each prefill refuses its REGISTER, counts
 * and logs it with the decode's address, and answers with the status
 * alone (no fingerprint, no instance); the decode's rooms fail. */
static void test_auth_edges_decode_without_secret_refused(void **state)
{
    (void)state;
    edge_opts_t o = opts(SECRET_A, NULL);
    edge_cluster_t *cl = edge_create(&o);
    edge_run(cl);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 0);
    for (int i = 0; i < cl->nprefill; i++) {
        edge_node_t *p = edge_prefill(cl, i);
        assert_int_equal(edge_stats(p).auth_refused, 1);
        assert_non_null(strstr(p->log_last, "refused the registration of the peer at d0"));
    }
    /* What the decode received: one REGISTER_ACK per prefill, refusals. */
    assert_int_equal(edge_stats(d).msgs_received, (uint64_t)cl->nprefill);
    int64_t pages[16];
    for (int i = 0; i < 16; i++)
        pages[i] = edge_page(1, i, true);
    assert_int_equal(kvs_decode_room_open(d->dec, 1, 0, 40, pages, 10), KVS_EAUTH);
    edge_destroy(cl);
}

/* The decode refuses every prefill (it cannot prove the decode's secret),
 * logging `why`; no REGISTER goes: each prefill received its HELLO only. */
static void expect_decode_refuses(const char *prefill_env, const char *why)
{
    edge_opts_t o = opts(prefill_env, SECRET_A);
    edge_cluster_t *cl = edge_create(&o);
    edge_run(cl);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(edge_stats(d).auth_refused, (uint64_t)cl->nprefill);
    assert_non_null(strstr(d->log_last, why));
    assert_non_null(strstr(d->log_last, "refused the registration of the peer at p"));
    for (int i = 0; i < cl->nprefill; i++)
        assert_int_equal(edge_stats(edge_prefill(cl, i)).msgs_received, 1);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 0);
    edge_destroy(cl);
}

/* A decode with the secret, prefills without: its ring key stays. */
static void test_auth_edges_prefill_without_secret_gets_no_key(void **state)
{
    (void)state;
    expect_decode_refuses(NULL, "has no cluster secret");
}

/* Different secrets: the prefill's proof fails at the decode. */
static void test_auth_edges_wrong_secret_refused(void **state)
{
    (void)state;
    expect_decode_refuses(SECRET_B, "does not know the cluster secret");
}

/* A stranger (the intruder NIC) against a prefill with the secret: a bare
 * REGISTER, one after a HELLO with no proof, and a REGISTER whose proof
 * was made for another session's challenge (a replay) are all refused,
 * each answered with the status alone. */
static void test_auth_edges_stranger_and_replay_refused(void **state)
{
    (void)state;
    edge_opts_t o = opts(SECRET_A, SECRET_A);
    edge_cluster_t *cl = edge_create(&o);
    edge_run(cl);
    edge_node_t *p = edge_prefill(cl, 0);
    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_msg_t got[8];
    kvs_msg_t reg = edge_register_msg(cl);

    /* 1: a captured REGISTER sent bare, on a new connection. */
    kvs_conn_t *c1 = edge_conn(x.fab, "p0");
    edge_send(cl, x.fab, c1, &reg);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    assert_int_equal(got[0].type, KVS_MSG_REGISTER_ACK);
    assert_int_equal(got[0].u.ack.status, KVS_EAUTH);
    assert_int_equal(got[0].u.ack.fp.head_dim, 0);
    assert_int_equal(got[0].u.ack.instance, 0);
    assert_int_equal(edge_stats(p).auth_refused, 1);
    assert_non_null(strstr(p->log_last, "no challenge"));

    /* 2: HELLO, then a REGISTER whose proof is for an older challenge
     * (made with the right secret: a replay from another session). */
    kvs_msg_t hello = {.type = KVS_MSG_HELLO};
    hello.session = reg.session;
    memset(hello.u.hello.nonce.b, 0x11, 32);
    edge_send(cl, x.fab, c1, &hello);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    assert_int_equal(got[0].type, KVS_MSG_CHALLENGE);
    assert_int_equal(got[0].u.challenge.secured, 1);
    kvs__secret_t s;
    char why[256];
    assert_int_equal(kvs__secret_load(NULL, SECRET_A, &s, why, sizeof why), KVS_OK);
    kvs_b32_t old_nonce;
    memset(old_nonce.b, 0x22, 32);
    kvs__auth_decode_proof(&s, &hello.u.hello.nonce, &old_nonce, EDGE_PREFILL_SESSION, &reg,
                           &reg.u.reg.proof);
    edge_send(cl, x.fab, c1, &reg);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    assert_int_equal(got[0].u.ack.status, KVS_EAUTH);
    assert_int_equal(edge_stats(p).auth_refused, 2);
    assert_non_null(strstr(p->log_last, "proof does not check"));

    /* 3: the right proof for the live challenge is accepted once; the
     * same REGISTER sent again (a replay) finds no challenge. */
    edge_send(cl, x.fab, c1, &hello);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    kvs__auth_decode_proof(&s, &hello.u.hello.nonce, &got[0].u.challenge.nonce,
                           EDGE_PREFILL_SESSION, &reg, &reg.u.reg.proof);
    kvs__secret_wipe(&s);
    edge_send(cl, x.fab, c1, &reg);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    assert_int_not_equal(got[0].u.ack.status, KVS_EAUTH);
    assert_int_equal(edge_stats(p).auth_refused, 2);
    edge_send(cl, x.fab, c1, &reg);
    edge_run(cl);
    assert_int_equal(edge_stats(p).auth_refused, 3);

    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* Handshake messages out of place are dropped and counted, answered with
 * nothing: a HELLO or a CHALLENGE nobody asked for at a decode, a
 * CHALLENGE at a prefill, forged ACKs; and a REGISTER from a session
 * other than its HELLO's finds no challenge. */
static void test_auth_edges_out_of_place_dropped(void **state)
{
    (void)state;
    edge_opts_t o = opts(SECRET_A, SECRET_A);
    edge_cluster_t *cl = edge_create(&o);
    edge_run(cl);
    edge_node_t *p = edge_prefill(cl, 0), *d = edge_decode(cl, 0);
    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    kvs_msg_t got[8];
    kvs_msg_t reg = edge_register_msg(cl);
    kvs_msg_t hello = {.type = KVS_MSG_HELLO};
    hello.session = reg.session;
    memset(hello.u.hello.nonce.b, 0x33, 32);
    kvs_msg_t chal = {.type = KVS_MSG_CHALLENGE};
    chal.session = reg.session;
    chal.u.challenge.secured = 1;
    chal.u.challenge.echo = reg.session;

    kvs_conn_t *cd = edge_conn(x.fab, "d0");
    const uint64_t d_rejected = edge_stats(d).msgs_rejected;
    edge_send(cl, x.fab, cd, &hello); /* a decode takes no HELLO */
    edge_send(cl, x.fab, cd, &chal);  /* nor a CHALLENGE it did not ask for */
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 0);
    assert_int_equal(edge_stats(d).msgs_rejected, d_rejected + 2);
    assert_int_equal(edge_stats(d).auth_refused, 0);

    kvs_conn_t *cp = edge_conn(x.fab, "p0");
    const uint64_t p_rejected = edge_stats(p).msgs_rejected;
    edge_send(cl, x.fab, cp, &chal); /* a prefill takes no CHALLENGE */
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 0);
    assert_int_equal(edge_stats(p).msgs_rejected, p_rejected + 1);

    /* HELLO from one session, REGISTER from another on the same connection. */
    edge_send(cl, x.fab, cp, &hello);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    assert_int_equal(got[0].type, KVS_MSG_CHALLENGE);
    reg.session = hello.session + 1;
    edge_send(cl, x.fab, cp, &reg);
    edge_run(cl);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 1);
    assert_int_equal(got[0].u.ack.status, KVS_EAUTH);
    assert_int_equal(edge_stats(p).auth_refused, 1);
    assert_non_null(strstr(p->log_last, "no challenge"));

    /* Forged ACKs: past what the prefill sent on this connection, and on
     * a connection that never carried a message. Both dropped, counted. */
    const uint64_t rejected = edge_stats(p).msgs_rejected;
    kvs_msg_t ack = {.type = KVS_MSG_ACK};
    ack.u.ack_link.cum = 1000;
    edge_send(cl, x.fab, cp, &ack);
    edge_send(cl, x.fab, edge_conn(x.fab, "p0"), &ack);
    edge_run(cl);
    assert_int_equal(edge_stats(p).msgs_rejected, rejected + 2);
    assert_int_equal(edge_intruder_recv(cl, &x, got, 8), 0);

    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* ms milliseconds of the cluster: a handshake takes microseconds, and
 * nothing is sent again before 2 ms (edge_run would wait for the decode's
 * unanswered HELLO to p0, which it sends again for ever). */
static void run_ms(edge_cluster_t *cl, uint64_t ms)
{
    sim_engine_run(cl->eng, sim_engine_now_ns(cl->eng) + ms * 1000000u, EDGE_EVENT_BUDGET);
}

/* The control messages waiting at p0's NIC (its handler dropped), ACKs
 * left out. */
static int p0_inbox(edge_node_t *p0, kvs_msg_t *out, int max)
{
    kvs_fabric_t *fab = sim_nic_fabric(p0->nic);
    kvs_completion_t cqe;
    int n = 0;
    while (fab->ops.poll(fab, &cqe, 1) == 1)
        if (cqe.kind == KVS_COMPLETION_RECV && n < max &&
            kvs__wire_decode(cqe.msg, cqe.len_bytes, &out[n]) == KVS_OK &&
            out[n].type != KVS_MSG_ACK)
            n++;
    return n;
}

/* The secret on both sides, and p0 without its handler: the decode's HELLO
 * to p0 waits at p0's NIC, p1 registers, and the test speaks as p0. */
static edge_cluster_t *p0_silent(edge_node_t **d, edge_node_t **p0)
{
    edge_opts_t o = opts(SECRET_A, SECRET_A);
    o.no_connect = true;
    edge_cluster_t *cl = edge_create(&o);
    *d = edge_decode(cl, 0);
    *p0 = edge_prefill(cl, 0);
    edge_rank_drop(*p0);
    edge_connect(cl, 0);
    run_ms(cl, 1);
    assert_int_equal(kvs_decode_peers_ready((*d)->dec), 1); /* p1 */
    return cl;
}

/* A prefill that skips its challenge: p0 (its handler gone, its NIC
 * speaking) answers the decode's HELLO with an OK REGISTER_ACK straight
 * away. The decode never sent p0 a REGISTER, so the answer is forged: it
 * is dropped and counted, and p0 is not ready (found by fuzz_auth: the
 * decode took it and sent p0 its watermark). p1 registers as usual. */
static void test_auth_edges_ack_before_challenge_refused(void **state)
{
    (void)state;
    edge_node_t *d, *p0;
    edge_cluster_t *cl = p0_silent(&d, &p0);
    const uint64_t rejected = edge_stats(d).msgs_rejected;
    kvs_msg_t ack = {.type = KVS_MSG_REGISTER_ACK};
    ack.session = EDGE_PREFILL_SESSION;
    ack.u.ack = (kvs_msg_register_ack_t){.echo = EDGE_DECODE_SESSION, .status = KVS_OK};
    kvs_fabric_t *p0fab = sim_nic_fabric(p0->nic);
    edge_send(cl, p0fab, edge_conn(p0fab, "d0"), &ack);
    run_ms(cl, 1);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 1);
    assert_int_equal(edge_stats(d).msgs_rejected, rejected + 1);
    assert_int_equal(edge_stats(d).auth_refused, 0);
    edge_destroy(cl);
}

static int random_fails(kvs_fabric_t *fab, void *buf, size_t len_bytes)
{
    (void)fab;
    (void)buf;
    (void)len_bytes;
    return KVS_EBACKEND;
}

/* The decode's connection to p0 dies with its HELLO unanswered, and its
 * random source fails when it connects again (it refuses p0: no nonce, no
 * HELLO). The CHALLENGE that answers the old HELLO, sent on the new
 * connection, gets no REGISTER: the old connection's nonce is not this
 * one's (found by fuzz_auth: the decode sent its ring key). */
static void test_auth_edges_old_challenge_on_new_connection(void **state)
{
    (void)state;
    edge_node_t *d, *p0;
    edge_cluster_t *cl = p0_silent(&d, &p0);
    kvs_fabric_t *p0fab = sim_nic_fabric(p0->nic);
    kvs_msg_t got[8];
    assert_int_equal(p0_inbox(p0, got, 8), 1);
    assert_int_equal(got[0].type, KVS_MSG_HELLO);

    /* What a prefill with the secret answers that HELLO with. */
    kvs_msg_t chal = {.type = KVS_MSG_CHALLENGE};
    chal.session = EDGE_PREFILL_SESSION;
    chal.u.challenge.echo = EDGE_DECODE_SESSION;
    chal.u.challenge.secured = 1;
    memset(chal.u.challenge.nonce.b, 0x44, 32);
    kvs__secret_t s;
    char why[256];
    assert_int_equal(kvs__secret_load(NULL, SECRET_A, &s, why, sizeof why), KVS_OK);
    kvs__auth_prefill_proof(&s, &got[0].u.hello.nonce, &chal.u.challenge.nonce,
                            EDGE_DECODE_SESSION, EDGE_PREFILL_SESSION, &chal.u.challenge.proof);
    kvs__secret_wipe(&s);

    sim_nic_fabric(d->nic)->ops.random_bytes = random_fails;
    p0fab->ops.disconnect(p0fab, edge_conn(p0fab, "d0"));
    run_ms(cl, 5); /* the decode connects again after 2 ms, and refuses p0 */
    assert_int_equal(edge_stats(d).auth_refused, 1);
    assert_int_equal(p0_inbox(p0, got, 8), 0);

    edge_send(cl, p0fab, edge_conn(p0fab, "d0"), &chal);
    run_ms(cl, 1);
    assert_int_equal(p0_inbox(p0, got, 8), 0); /* no REGISTER */
    assert_int_equal(kvs_decode_peers_ready(d->dec), 1); /* p1 */
    edge_destroy(cl);
}

static int random_ok(kvs_fabric_t *fab, void *buf, size_t len_bytes)
{
    (void)fab;
    memset(buf, 0x77, len_bytes);
    return KVS_OK;
}

static bool challenge_pending(const kvs__handler_t *h, const kvs_conn_t *conn)
{
    for (uint32_t i = 0; i < h->hs.cap; i++)
        if (h->hs.v[i].conn == conn)
            return true;
    return false;
}

/* A prefill keeps one pending challenge per connection in a table of its
 * links' size; a HELLO that finds it full drops the oldest challenge (found
 * by fuzz_auth: it dropped the first slot's, however young). A prefill on
 * the fake backend, the HELLOs handed to its handshake directly. */
static void test_auth_edges_full_challenge_table_drops_oldest(void **state)
{
    (void)state;
    fake_device_t dev;
    fake_fabric_t fab;
    fake_device_setup(&dev);
    fake_fabric_setup(&fab, KVS_FABRIC_CAP_WRITE_IMM);
    fab.base.ops.random_bytes = random_ok;
    const kvs_manager_config_t c = {
        .role = KVS_ROLE_PREFILL, .staging = true, .total_heads = 4, .head_dim = 16,
        .dtype = KVS_DTYPE_BF16, .layers = 2, .page_size = 4, .tp_rank = 0, .tp_size = 2,
        .pp_size = 1, .peer_tp_size = 1, .chunk_tokens = 16, .transfer_workers = 1,
        .max_rooms = 4, .max_inflight_writes = 4, .max_peers = 2, .secret_env = SECRET_A,
        .log = {.level = KVS_LOG_OFF}};
    const uint64_t k_base[2] = {0x10000, 0x20000}, v_base[2] = {0x30000, 0x40000};
    const kvs_kv_buffers_t kv = {.num_layers = 2, .k_base = k_base, .v_base = v_base,
                                 .local_heads = 2, .page_size = 4, .num_pages = 16};
    kvs_manager_t *m = NULL;
    kvs_prefill_t *p = NULL;
    kvs_error_t err;
    assert_int_equal(kvs_manager_create(&c, &dev.base, &fab.base, &m, &err), KVS_OK);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
    assert_int_equal(kvs_prefill_create(m, &p), KVS_OK);
    kvs__handler_t *h = (kvs__handler_t *)p; /* embedded first */

    char tags[64];
    const uint32_t cap = h->hs.cap;
    assert_true(cap >= 3 && cap < sizeof tags);
    kvs_conn_t *conn[sizeof tags];
    for (uint32_t i = 0; i <= cap; i++)
        conn[i] = (kvs_conn_t *)(void *)&tags[i];
    kvs_msg_t hello = {.type = KVS_MSG_HELLO, .session = 7};
    for (uint32_t i = 0; i < cap; i++)
        kvs__handshake_on_hello(h, conn[i], &hello);
    kvs__handshake_on_hello(h, conn[0], &hello); /* again: now the youngest */
    kvs__handshake_on_hello(h, conn[cap], &hello); /* full: conn 1's goes */
    assert_false(challenge_pending(h, conn[1]));
    assert_true(challenge_pending(h, conn[0]));
    for (uint32_t i = 2; i <= cap; i++)
        assert_true(challenge_pending(h, conn[i]));

    kvs_prefill_destroy(p);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    assert_int_equal(dev.live_allocs, 0);
    assert_int_equal(fab.live_mrs, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth_edges_same_secret_transfers),
        cmocka_unit_test(test_auth_edges_open_cluster_as_before),
        cmocka_unit_test(test_auth_edges_decode_without_secret_refused),
        cmocka_unit_test(test_auth_edges_prefill_without_secret_gets_no_key),
        cmocka_unit_test(test_auth_edges_wrong_secret_refused),
        cmocka_unit_test(test_auth_edges_stranger_and_replay_refused),
        cmocka_unit_test(test_auth_edges_out_of_place_dropped),
        cmocka_unit_test(test_auth_edges_ack_before_challenge_refused),
        cmocka_unit_test(test_auth_edges_old_challenge_on_new_connection),
        cmocka_unit_test(test_auth_edges_full_challenge_table_drops_oldest),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
