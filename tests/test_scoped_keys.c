/*
 * test_scoped_keys.c - region-scoped remote keys (issue 17 item 2,
 * src/region_keys.c, docs/security.md) between real handlers on the
 * simulated cluster of edge_cluster.h (prefill TP 2 -> decode TP 1, a full
 * chunk region of 8 KiB: 4 KiB per writer). The decode grants each writer
 * exactly its bytes of each region on its own connection and revokes them
 * before the region is reused, so a writer that goes wrong is stopped by
 * the fabric: a write with a region's key after the region was freed, one
 * that reaches past its bytes (into the next region, or its sibling's block
 * of the same region), and one with another connection's key each fail at
 * the writer (KVS_EREMOTE); only that request fails, every other request's
 * bytes arrive whole, no ring byte and no grant outlives the rooms. The
 * ring is sealed, so its own key opens nothing. A fabric without key_grant (a version-3 table) falls back to the whole
 * ring's key, says so once, and then cannot stop the same stale write.
 *
 * The wrong writes are planted by a write hook on the prefill NICs (the
 * tap below), which sees every write posted (its target and key) and can
 * send the next one of a rank elsewhere or under another key.
 */
#include "edge_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAP_MAX 64

typedef enum tap_edit { TAP_NONE, TAP_REPLAY, TAP_SHIFT } tap_edit_t;

typedef struct tap_write {
    char nic[16];
    uint64_t addr, rkey, len;
} tap_write_t;

/* Every write the prefill NICs post, as posted (before an edit), and the
 * edit of the next write of `victim`. */
typedef struct tap {
    tap_write_t w[TAP_MAX];
    int n;
    const char *victim;       /* NULL: none */
    tap_edit_t edit;
    uint64_t addr, rkey;      /* REPLAY: sent to addr (unless keep_addr) under rkey */
    bool keep_addr;
    uint64_t shift;           /* SHIFT: moved this many bytes on, its own key kept */
    int done;                 /* edits made */
} tap_t;

static bool tap_hook(void *ctx, const char *nic, const char *peer, uint64_t *remote_addr,
                     uint64_t *rkey, uint64_t len)
{
    (void)peer;
    tap_t *t = ctx;
    if (t->n < TAP_MAX) {
        tap_write_t *w = &t->w[t->n++];
        *w = (tap_write_t){.addr = *remote_addr, .rkey = *rkey, .len = len};
        snprintf(w->nic, sizeof w->nic, "%s", nic);
    }
    if (t->victim == NULL || t->edit == TAP_NONE || strcmp(nic, t->victim) != 0)
        return false;
    if (t->edit == TAP_REPLAY) {
        if (!t->keep_addr)
            *remote_addr = t->addr;
        *rkey = t->rkey;
    } else {
        *remote_addr += t->shift;
    }
    t->edit = TAP_NONE; /* one write */
    t->done++;
    return true;
}

static void tap_install(edge_cluster_t *cl, tap_t *t)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < cl->nprefill; i++)
        sim_nic_set_write_hook(edge_prefill(cl, i)->nic, tap_hook, t);
}

/* A registered cluster of o with the tap on its prefill NICs. */
static edge_cluster_t *tapped_cluster(const edge_opts_t *o, tap_t *tap)
{
    edge_cluster_t *cl = edge_create(o);
    edge_assert_registered(cl);
    tap_install(cl, tap);
    return cl;
}

static void expect_refused(edge_cluster_t *cl, uint64_t room, int bad);

/* With tap's edit set up (edit and its fields), prefill rank `victim`'s
 * next write goes astray: room [0, 40) is computed on every prefill rank
 * (only on the victim when alone), the cluster runs, the edit is made and
 * the room is refused at the victim. */
static void plant(edge_cluster_t *cl, tap_t *tap, int victim, uint64_t room, bool alone)
{
    static const char *const names[] = {"p0", "p1"};
    assert_true(victim >= 0 && victim < 2 && tap->edit != TAP_NONE);
    const int done = tap->done;
    tap->victim = names[victim];
    if (alone)
        edge_computed_on(cl, victim, room, 40, true);
    else
        edge_computed(cl, room, 40, true);
    edge_run(cl);
    assert_int_equal(tap->done, done + 1);
    expect_refused(cl, room, victim);
}

/* The first write tap saw from nic (fails when none). */
static const tap_write_t *tap_first(const tap_t *t, const char *nic, int skip)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->w[i].nic, nic) == 0 && skip-- == 0)
            return &t->w[i];
    EDGE_FAIL("no write of %s seen", nic);
    return NULL;
}

/* Nothing planted landed, every grant made was revoked, the ring is empty. */
static void expect_clean(edge_cluster_t *cl)
{
    edge_node_t *d = edge_decode(cl, 0);
    edge_expect_ring_empty(cl);
    const kvs_handler_stats_t st = edge_stats(d);
    if (st.keys_granted != st.keys_revoked)
        EDGE_FAIL("%llu keys granted, %llu revoked", (unsigned long long)st.keys_granted,
                  (unsigned long long)st.keys_revoked);
    assert_int_equal(sim_nic_grants_live(d->nic), 0);
    for (int i = 0; i < cl->nprefill; i++)
        if (edge_prefill(cl, i)->nic != NULL) /* not crashed */
            assert_int_equal(sim_nic_planted_landed_bytes(edge_prefill(cl, i)->nic), 0);
}

/* The room failed where the refused write was: on the decode and on its
 * writer `bad` (KVS_EREMOTE). The other writer ends it too, ok when it had
 * written its part and reported before the failure reached it. */
static void expect_refused(edge_cluster_t *cl, uint64_t room, int bad)
{
    edge_expect(edge_decode(cl, 0), room, KVS_EREMOTE);
    for (int i = 0; i < cl->nprefill; i++) {
        const edge_node_t *p = edge_prefill(cl, i);
        if (i == bad)
            edge_expect(p, room, KVS_EREMOTE);
        else if (edge_result(p, room) == NULL)
            EDGE_FAIL("%s never ended room %llu", p->name, (unsigned long long)room);
    }
}

static uint64_t ring_rkey(edge_cluster_t *cl, uint64_t *addr, uint64_t *len)
{
    uint64_t rkey = 0;
    assert_int_equal(kvs_manager_staging_buffer(edge_decode(cl, 0)->m, 0, addr, len, &rkey),
                     KVS_OK);
    return rkey;
}

/* A stranger (the intruder NIC x) writes len bytes at raddr of d0 under
 * rkey: refused (KVS_EREMOTE), and not a byte of d0's ring changes. */
static void expect_stranger_refused(edge_cluster_t *cl, edge_intruder_t *x, uint64_t raddr,
                                    uint64_t rkey, uint64_t len, const char *what)
{
    uint64_t addr = 0, bytes = 0;
    (void)ring_rkey(cl, &addr, &bytes);
    const uint8_t *ring = sim_gpu_host(edge_decode(cl, 0)->gpu, addr, bytes);
    uint8_t *before = malloc((size_t)bytes);
    assert_non_null(before);
    memcpy(before, ring, (size_t)bytes);
    const int w = edge_intruder_write(x, "d0", raddr, rkey, len);
    edge_run(cl);
    assert_int_equal(x->write_status[w], KVS_EREMOTE);
    if (memcmp(before, ring, (size_t)bytes) != 0)
        EDGE_FAIL("a stranger's write under %s changed the ring", what);
    free(before);
}

/* One grant per writer and region, each write under its own key (never the
 * ring's, which the decode no longer sends), no extra write per region, and
 * every grant revoked once the rooms ended. */
static void test_scoped_keys_one_grant_per_writer_and_region(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.log_watch = "cannot scope remote keys";
    tap_t tap;
    edge_cluster_t *cl = tapped_cluster(&o, &tap);
    /* 40 tokens: chunks of 16, 16, 8; 48 tokens after a prefix of 16: 16 x 3 */
    const edge_room_t rooms[] = {{1, 0, 40}, {2, 16, 64}};
    edge_transfer_ok(cl, rooms, 2);
    edge_node_t *d = edge_decode(cl, 0);
    const uint64_t regions = 6, writers = 2;
    const kvs_handler_stats_t st = edge_stats(d);
    assert_int_equal(st.keys_granted, regions * writers);
    assert_int_equal(st.keys_revoked, regions * writers);
    assert_int_equal(d->log_watched, 0);
    /* One write per writer and region: grants add no work request. */
    assert_int_equal(tap.n, (int)(regions * writers));
    assert_int_equal(edge_stats(edge_prefill(cl, 0)).rdma_writes +
                         edge_stats(edge_prefill(cl, 1)).rdma_writes,
                     regions * writers);
    uint64_t addr = 0, len = 0;
    const uint64_t whole = ring_rkey(cl, &addr, &len);
    for (int i = 0; i < tap.n; i++) {
        assert_int_not_equal(tap.w[i].rkey, whole);
        assert_true(tap.w[i].addr >= addr && tap.w[i].addr + tap.w[i].len <= addr + len);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(tap.w[i].rkey, tap.w[j].rkey);
    }
    for (int i = 0; i < cl->nprefill; i++)
        assert_int_equal(edge_stats(edge_prefill(cl, i)).keys_granted, 0);
    expect_clean(cl);
    edge_destroy(cl);
}

/* p0 keeps the key of its first region of room 1 and, once room 1 is done
 * and that region freed (and handed to room 2: the empty ring restarts at
 * offset 0), writes room 2's first chunk there under the old key. The
 * fabric refuses it: room 2 fails (KVS_EREMOTE) on every rank; room 3,
 * open at the same time, and room 1 keep every byte. */
static void test_scoped_keys_stale_key_after_free_fails(void **state)
{
    (void)state;
    const edge_opts_t o = edge_defaults();
    tap_t tap;
    edge_cluster_t *cl = tapped_cluster(&o, &tap);
    edge_transfer(cl, 1, 0, 40);
    edge_expect_ok(cl, 1, 0, 40);
    const tap_write_t stale = *tap_first(&tap, "p0", 0);
    edge_open(cl, 2, 0, 40);
    edge_open(cl, 3, 0, 40);
    edge_run(cl); /* both have their regions */
    tap.edit = TAP_REPLAY;
    tap.addr = stale.addr;
    tap.rkey = stale.rkey;
    plant(cl, &tap, 0, 2, false);
    edge_computed(cl, 3, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 3, 0, 40);
    assert_int_equal(edge_corrupt(cl, 1, 0, 40), 0);
    expect_clean(cl);
    edge_destroy(cl);
}

/* p0's key of a region, used past its bytes: into the next region (room
 * 1), and into p1's block of the same region (room 3: its own length on).
 * Each fails at the fabric and fails only its room; room 2 moves whole. */
static void test_scoped_keys_write_outside_its_bytes_fails(void **state)
{
    (void)state;
    const edge_opts_t o = edge_defaults();
    tap_t tap;
    edge_cluster_t *cl = tapped_cluster(&o, &tap);
    const uint64_t region = (uint64_t)edge_region_bytes(cl, 16);
    edge_open(cl, 1, 0, 40);
    edge_open(cl, 2, 0, 40);
    edge_run(cl);
    tap.edit = TAP_SHIFT;
    tap.shift = region; /* chunk 1's region: p0 holds a key to it, another one */
    plant(cl, &tap, 0, 1, false);
    edge_computed(cl, 2, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 2, 0, 40);

    edge_open(cl, 3, 0, 40);
    edge_run(cl);
    tap.edit = TAP_SHIFT;
    tap.shift = region / 2; /* p1's block of the same region */
    plant(cl, &tap, 0, 3, false);
    assert_int_equal(edge_corrupt(cl, 2, 0, 40), 0);
    expect_clean(cl);
    edge_destroy(cl);
}

/* A live key on another connection: p0 has written room 1 (its regions
 * wait for p1), and a stranger (the intruder NIC) writes to p0's bytes
 * under p0's key: refused, not a byte of the ring changes, and room 1 then
 * completes whole. Then p1, a registered writer on its own connection,
 * writes its own bytes of room 2 under p0's key of that region: refused,
 * room 2 fails. */
static void test_scoped_keys_key_from_another_connection_fails(void **state)
{
    (void)state;
    const edge_opts_t o = edge_defaults();
    tap_t tap;
    edge_cluster_t *cl = tapped_cluster(&o, &tap);
    edge_open(cl, 1, 0, 40);
    edge_run(cl);
    edge_computed_on(cl, 0, 1, 40, true);
    edge_run(cl);
    const tap_write_t k = *tap_first(&tap, "p0", 0);
    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    expect_stranger_refused(cl, &x, k.addr, k.rkey, k.len, "p0's key");
    edge_computed_on(cl, 1, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);

    edge_open(cl, 2, 0, 40);
    edge_run(cl);
    const int seen = tap.n;
    edge_computed_on(cl, 0, 2, 40, true);
    edge_run(cl);
    assert_true(tap.n > seen && strcmp(tap.w[seen].nic, "p0") == 0);
    tap.edit = TAP_REPLAY;
    tap.keep_addr = true;
    tap.rkey = tap.w[seen].rkey; /* p0's key of room 2's first region */
    plant(cl, &tap, 1, 2, true);
    expect_clean(cl);
    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* The ring is sealed (fabric ops version 5, mr_register_sealed): its own
 * key, which the decode never sends, opens nothing either. p0 writing its
 * own bytes of room 1 under it is refused like any wrong key, and so is a
 * stranger writing under it; room 2, open beside them, moves whole. */
static void test_scoped_keys_ring_own_key_opens_nothing(void **state)
{
    (void)state;
    const edge_opts_t o = edge_defaults();
    tap_t tap;
    edge_cluster_t *cl = tapped_cluster(&o, &tap);
    uint64_t addr = 0, len = 0;
    const uint64_t whole = ring_rkey(cl, &addr, &len);
    edge_open(cl, 1, 0, 40);
    edge_open(cl, 2, 0, 40);
    edge_run(cl);
    tap.edit = TAP_REPLAY;
    tap.keep_addr = true;
    tap.rkey = whole;
    plant(cl, &tap, 0, 1, false);

    edge_intruder_t x;
    edge_intruder_create(cl, &x);
    expect_stranger_refused(cl, &x, addr, whole, 4096, "the ring's own key");
    edge_computed(cl, 2, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 2, 0, 40);
    expect_clean(cl);
    edge_intruder_destroy(&x);
    edge_destroy(cl);
}

/* Grants go back on every way a room ends: a write error, an abort by the
 * decode, a prefill rank lost mid-room, and the decode handler destroyed
 * with regions still assigned. */
static void test_scoped_keys_revoked_on_every_path(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    edge_assert_registered(cl);
    edge_node_t *d = edge_decode(cl, 0);
    /* a write error */
    sim_nic_fail_next_writes(edge_prefill(cl, 0)->nic, 1);
    edge_transfer(cl, 1, 0, 40);
    expect_refused(cl, 1, 0);
    expect_clean(cl);
    /* the decode aborts a room whose regions are assigned */
    edge_open(cl, 2, 0, 40);
    edge_run(cl);
    assert_true(sim_nic_grants_live(d->nic) > 0);
    assert_int_equal(kvs_decode_room_abort(d->dec, 2), KVS_OK);
    edge_wake(d);
    edge_run(cl);
    edge_expect(d, 2, KVS_ECANCELED);
    expect_clean(cl);
    /* a prefill rank dies mid-room */
    edge_open(cl, 3, 0, 40);
    edge_run(cl);
    assert_true(sim_nic_grants_live(d->nic) > 0);
    edge_crash(edge_prefill(cl, 1));
    edge_run(cl);
    edge_expect(d, 3, KVS_EPEER);
    expect_clean(cl);
    edge_restart(cl, edge_prefill(cl, 1));
    edge_run_past_timeouts(cl);
    /* the decode handler goes with regions assigned */
    edge_open(cl, 4, 0, 40);
    edge_run(cl);
    const uint64_t live = sim_nic_grants_live(d->nic);
    assert_true(live > 0);
    edge_rank_drop(d);
    assert_int_equal(sim_nic_grants_live(d->nic), 0);
    assert_int_equal(sim_nic_grants_made(d->nic), sim_nic_grants_revoked(d->nic));
    edge_destroy(cl);
}

/* A fabric without key_grant (a version-3 ops table, as verbs and ofi
 * have): the decode says so once at create, sends its whole ring's key,
 * and everything moves as before. The stale write of
 * test_scoped_keys_stale_key_after_free_fails then lands: what scoped
 * keys stop. */
static void test_scoped_keys_fallback_without_key_grant(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.net.no_key_grant = true;
    o.log_watch = "cannot scope remote keys";
    tap_t tap;
    edge_cluster_t *cl = tapped_cluster(&o, &tap);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(d->log_watched, 1);
    for (int i = 0; i < cl->nprefill; i++)
        assert_int_equal(edge_prefill(cl, i)->log_watched, 0);
    const edge_room_t rooms[] = {{1, 0, 40}, {2, 16, 64}};
    edge_transfer_ok(cl, rooms, 2);
    uint64_t addr = 0, len = 0;
    const uint64_t whole = ring_rkey(cl, &addr, &len);
    for (int i = 0; i < tap.n; i++)
        assert_int_equal(tap.w[i].rkey, whole);
    assert_int_equal(edge_stats(d).keys_granted, 0);
    assert_int_equal(d->log_watched, 1); /* once, at create */

    const tap_write_t stale = *tap_first(&tap, "p0", 0);
    edge_open(cl, 3, 0, 40);
    edge_run(cl);
    tap.victim = "p0";
    tap.edit = TAP_REPLAY;
    tap.addr = stale.addr;
    tap.rkey = stale.rkey;
    edge_computed(cl, 3, 40, true);
    edge_run(cl);
    assert_int_equal(tap.done, 1);
    assert_true(sim_nic_planted_landed_bytes(edge_prefill(cl, 0)->nic) > 0);
    edge_destroy(cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scoped_keys_one_grant_per_writer_and_region),
        cmocka_unit_test(test_scoped_keys_stale_key_after_free_fails),
        cmocka_unit_test(test_scoped_keys_write_outside_its_bytes_fails),
        cmocka_unit_test(test_scoped_keys_key_from_another_connection_fails),
        cmocka_unit_test(test_scoped_keys_ring_own_key_opens_nothing),
        cmocka_unit_test(test_scoped_keys_revoked_on_every_path),
        cmocka_unit_test(test_scoped_keys_fallback_without_key_grant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
