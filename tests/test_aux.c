/*
 * test_aux.c - a request's aux payload (kvs_manager_config_t.max_aux_bytes,
 * kvs_prefill_room_set_aux, kvs_room_result_t.aux): the engine's own bytes
 * per request (a first token, logprobs, a hidden state) carried from the
 * prefill to every decode rank of the room with its result, on the
 * simulated cluster of edge_cluster.h.
 *
 * Every payload is checked byte for byte on every decode rank; sizes cover
 * none, one byte, exactly one AUX message, one byte over, and the limit.
 * Refusals change nothing; a broken peer's AUX messages are dropped or
 * fail only the room they name.
 */
#include "edge_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#define AUX_LIMIT 10000u

/* The payload of room `room`: distinct per room and per byte. */
static void aux_fill(uint8_t *buf, uint32_t bytes, uint64_t room)
{
    for (uint32_t i = 0; i < bytes; i++)
        buf[i] = (uint8_t)(room * 131u + i * 7u + (i >> 8));
}

/* Gives room `room` its payload on every prefill rank of instance 0. */
static void aux_set_all(edge_cluster_t *cl, uint64_t room, uint32_t bytes)
{
    uint8_t *buf = malloc(bytes > 0 ? bytes : 1);
    assert_non_null(buf);
    aux_fill(buf, bytes, room);
    for (int i = 0; i < cl->nprefill; i++) {
        edge_node_t *n = edge_prefill(cl, i);
        if (kvs_rank_set_aux(n->rank, room, buf, bytes) != KVS_OK)
            EDGE_FAIL("%s: set_aux %llu: %s", n->name, (unsigned long long)room,
                      kvs_rank_last_error(n->rank)->msg);
    }
    free(buf);
}

/* Every decode rank got room's payload whole; the prefill ranks none. */
static void aux_expect(edge_cluster_t *cl, uint64_t room, uint32_t bytes)
{
    uint8_t *want = malloc(bytes > 0 ? bytes : 1);
    assert_non_null(want);
    aux_fill(want, bytes, room);
    for (int d = 0; d < cl->ndecode; d++) {
        const kvs_room_result_t *r = edge_expect(edge_decode(cl, d), room, KVS_OK);
        if (r->aux_bytes != bytes)
            EDGE_FAIL("d%d: room %llu came with %u aux bytes, not %u", d,
                      (unsigned long long)room, r->aux_bytes, bytes);
        if (bytes == 0)
            assert_null(r->aux);
        else if (memcmp(r->aux, want, bytes) != 0)
            EDGE_FAIL("d%d: room %llu: aux bytes differ", d, (unsigned long long)room);
    }
    for (int i = 0; i < cl->nprefill; i++) {
        const kvs_room_result_t *r = edge_expect(edge_prefill(cl, i), room, KVS_OK);
        assert_null(r->aux);
        assert_int_equal(r->aux_bytes, 0);
    }
    free(want);
}

/* Rooms of every size at once, on one layout. */
static void aux_round(edge_opts_t o)
{
    o.max_aux_bytes = AUX_LIMIT;
    edge_cluster_t *cl = edge_create(&o);
    const uint32_t sizes[] = {0, 1, KVS_WIRE_AUX_PER_MSG, KVS_WIRE_AUX_PER_MSG + 1, AUX_LIMIT};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    /* At most EDGE_ROOM_SLOTS rooms at once (each has its pages). */
    for (int first = 0; first < n; first += EDGE_ROOM_SLOTS) {
        const int end = first + EDGE_ROOM_SLOTS < n ? first + EDGE_ROOM_SLOTS : n;
        for (int i = first; i < end; i++) {
            const uint64_t room = 10 + (uint64_t)i;
            edge_open(cl, room, 0, 20 + 4 * i);
            aux_set_all(cl, room, sizes[i]);
            edge_computed(cl, room, 20 + 4 * i, true);
        }
        edge_run(cl);
        for (int i = first; i < end; i++) {
            edge_expect_ok(cl, 10 + (uint64_t)i, 0, 20 + 4 * i);
            aux_expect(cl, 10 + (uint64_t)i, sizes[i]);
        }
    }
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

static void test_aux_reaches_every_decode_rank(void **state)
{
    (void)state;
    /* Two writers per decode rank (only writer 0 sends it). */
    aux_round(edge_defaults());
    /* One prefill rank, two decode ranks: each hears it. */
    edge_opts_t o = edge_defaults();
    o.prefill_tp = 1;
    o.decode_tp = 2;
    aux_round(o);
    /* The slice path (writes straight into the decode's pages). */
    o = edge_defaults();
    o.staging = false;
    o.path = KVS_PATH_SLICE;
    aux_round(o);
}

/* Given at room_open (kvs_room_desc_t), replaced later, and kept through a
 * refused replacement. */
static void test_aux_given_at_open_and_replaced(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.max_aux_bytes = 64;
    edge_cluster_t *cl = edge_create(&o);
    edge_open_decode(cl, 1, 0, 24);
    uint8_t first[64], second[40];
    aux_fill(first, sizeof first, 99);
    aux_fill(second, sizeof second, 1);
    for (int i = 0; i < cl->nprefill; i++) {
        edge_node_t *n = edge_prefill(cl, i);
        int64_t pages[6];
        for (int64_t k = 0; k < 6; k++)
            pages[k] = edge_page(1, k, false);
        edge_fill(n, 1, 24);
        const kvs_room_desc_t desc = {.room = 1, .total_tokens = 24, .pages = pages,
                                      .num_pages = 6, .aux = first, .aux_bytes = 64};
        assert_int_equal(kvs_rank_open_room(n->rank, &desc), KVS_OK);
        /* Over the limit: refused by name, the payload given stays. */
        uint8_t big[65] = {0};
        assert_int_equal(kvs_rank_set_aux(n->rank, 1, big, sizeof big), KVS_EINVAL);
        assert_non_null(strstr(kvs_rank_last_error(n->rank)->msg, "max_aux_bytes 64"));
        assert_int_equal(kvs_rank_set_aux(n->rank, 1, NULL, 3), KVS_EINVAL);
        /* Replaced by a shorter one. */
        assert_int_equal(kvs_rank_set_aux(n->rank, 1, second, sizeof second), KVS_OK);
        edge_wake(n);
    }
    edge_computed(cl, 1, 24, true);
    /* After the final computed(): too late, said so. */
    for (int i = 0; i < cl->nprefill; i++) {
        edge_node_t *n = edge_prefill(cl, i);
        assert_int_equal(kvs_rank_set_aux(n->rank, 1, first, 8), KVS_EALREADY);
        assert_non_null(strstr(kvs_rank_last_error(n->rank)->msg, "before it"));
    }
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 24);
    aux_expect(cl, 1, sizeof second);
    edge_destroy(cl);
}

/* What is refused opens nothing and loses nothing. */
static void test_aux_refusals(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.max_aux_bytes = 16;
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *p = edge_prefill(cl, 0), *d = edge_decode(cl, 0);
    int64_t pages[2] = {0, 1};
    uint8_t buf[32] = {0};
    /* Prefill: a payload over the limit refuses the room_open: not opened. */
    kvs_room_desc_t desc = {.room = 5, .total_tokens = 8, .pages = pages, .num_pages = 2,
                            .aux = buf, .aux_bytes = 17};
    assert_int_equal(kvs_rank_open_room(p->rank, &desc), KVS_EINVAL);
    const char *why = kvs_rank_last_error(p->rank)->msg;
    if (strstr(why, "17 bytes is over max_aux_bytes 16") == NULL)
        EDGE_FAIL("refusal does not name the size and the limit: %s", why);
    kvs_room_state_t st;
    assert_int_equal(kvs_rank_room_state(p->rank, 5, &st), KVS_ENOENT);
    desc.aux = NULL;
    desc.aux_bytes = 4;
    assert_int_equal(kvs_rank_open_room(p->rank, &desc), KVS_EINVAL);
    assert_int_equal(kvs_rank_room_state(p->rank, 5, &st), KVS_ENOENT);
    /* A room that is not open has nothing to carry it. */
    assert_int_equal(kvs_rank_set_aux(p->rank, 6, buf, 4), KVS_ENOENT);
    assert_int_equal(kvs_prefill_room_set_aux(NULL, 6, buf, 4), KVS_EINVAL);
    /* Decode: it gives none, and has no set_aux. */
    desc = (kvs_room_desc_t){.room = 5, .total_tokens = 8, .pages = pages, .num_pages = 2,
                             .aux = buf, .aux_bytes = 4};
    assert_int_equal(kvs_rank_open_room(d->rank, &desc), KVS_EINVAL);
    assert_non_null(strstr(kvs_rank_last_error(d->rank)->msg, "leave aux NULL"));
    assert_int_equal(kvs_rank_room_state(d->rank, 5, &st), KVS_ENOENT);
    assert_int_equal(kvs_rank_set_aux(d->rank, 5, buf, 4), KVS_ESTATE);
    /* The room still opens and moves, with its payload, once asked right. */
    edge_open(cl, 5, 0, 8);
    aux_set_all(cl, 5, 16);
    edge_computed(cl, 5, 8, true);
    edge_run(cl);
    edge_expect_ok(cl, 5, 0, 8);
    aux_expect(cl, 5, 16);
    edge_destroy(cl);
}

/* Both sides must agree on the limit: refused at registration, by name. */
static void test_aux_limit_mismatch_is_refused(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.max_aux_bytes = 64;
    o.odd_rank = 1;
    o.odd_max_aux_set = true;
    o.odd_max_aux = 128;
    edge_cluster_t *cl = edge_create(&o);
    edge_run(cl);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(kvs_decode_peers_ready(d->dec), 1);
    const kvs_error_t *pe = kvs_manager_last_error(edge_prefill(cl, 1)->m);
    assert_int_equal(pe->status, KVS_EFINGERPRINT);
    if (strstr(pe->msg, "largest aux payload (max_aux_bytes) differs: this side 128, peer 64") ==
        NULL)
        EDGE_FAIL("p1 does not name max_aux_bytes: %s", pe->msg);
    edge_destroy(cl);
}

/* What a broken prefill could send: AUX from a rank that does not give
 * this decode rank its payload, over the limit, out of order, past its own
 * total: each dropped and counted. A STATUS that claims bytes that never
 * came fails the room it names (KVS_EPROTO), and only it. */
static void test_aux_hostile(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.max_aux_bytes = 64;
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    kvs_fabric_t *p0fab = sim_nic_fabric(edge_prefill(cl, 0)->nic);
    kvs_fabric_t *p1fab = sim_nic_fabric(edge_prefill(cl, 1)->nic);
    kvs_conn_t *c0 = edge_conn(p0fab, "d0"), *c1 = edge_conn(p1fab, "d0");

    edge_open(cl, 1, 0, 16);
    edge_open(cl, 2, 0, 16);
    aux_set_all(cl, 1, 8);
    const kvs_handler_stats_t before = edge_stats(d);
    kvs_msg_t m = {.type = KVS_MSG_AUX};
    /* p1 is this decode rank's peer 1: it never gives the payload. */
    m.session = EDGE_PREFILL_SESSION + 1;
    m.u.aux = (kvs_msg_aux_t){.room = 1, .total = 4, .first = 0, .count = 4};
    edge_send(cl, p1fab, c1, &m);
    m.session = EDGE_PREFILL_SESSION + 0;
    m.u.aux = (kvs_msg_aux_t){.room = 1, .total = 65, .first = 0, .count = 1};
    edge_send(cl, p0fab, c0, &m); /* over the limit */
    m.u.aux = (kvs_msg_aux_t){.room = 1, .total = 8, .first = 4, .count = 4};
    edge_send(cl, p0fab, c0, &m); /* not from the start */
    m.u.aux = (kvs_msg_aux_t){.room = 1, .total = 8, .first = 0, .count = 9};
    edge_send(cl, p0fab, c0, &m); /* past its total */
    m.u.aux = (kvs_msg_aux_t){.room = 1, .total = 8, .first = 0, .count = 0};
    edge_send(cl, p0fab, c0, &m); /* empty */
    m.u.aux = (kvs_msg_aux_t){.room = 77, .total = 8, .first = 0, .count = 8};
    edge_send(cl, p0fab, c0, &m); /* no such room */
    edge_run(cl);
    assert_int_equal(edge_stats(d).msgs_rejected - before.msgs_rejected, 6);
    /* Room 2: p0 says it sent 5 bytes first; none came. */
    m = (kvs_msg_t){.type = KVS_MSG_STATUS};
    m.session = EDGE_PREFILL_SESSION + 0;
    m.u.status = (kvs_msg_status_t){.room = 2, .status = KVS_OK, .aux_bytes = 5};
    edge_send(cl, p0fab, c0, &m);
    edge_computed(cl, 1, 16, true);
    edge_computed(cl, 2, 16, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 16);
    aux_expect(cl, 1, 8);
    edge_expect(d, 2, KVS_EPROTO);
    /* The prefill ranks end it too (ok if they finished before they heard). */
    for (int i = 0; i < cl->nprefill; i++)
        assert_non_null(edge_result(edge_prefill(cl, i), 2));
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

int main(void)
{
    print_message("test_aux: seed %llu\n", (unsigned long long)EDGE_SEED);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_aux_reaches_every_decode_rank),
        cmocka_unit_test(test_aux_given_at_open_and_replaced),
        cmocka_unit_test(test_aux_refusals),
        cmocka_unit_test(test_aux_limit_mismatch_is_refused),
        cmocka_unit_test(test_aux_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
