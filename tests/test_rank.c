/*
 * test_rank.c - the rank runtime (src/rank.c, src/kv_layers.c): a rank made
 * in one call from KV layers as an engine holds them, driven by one step,
 * its rooms followed by state, aborted, and its calls under the caller's
 * lock; every refusal names what to change and leaves nothing behind.
 *
 * Transfers run on the simulated cluster of edge_cluster.h; the refusals of
 * the one-call create run on the fake backend, which fails the Nth
 * allocation or registration on request.
 */
#include "edge_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_backend.h"

/* ---- one call makes a rank --------------------------------------------------- */

/* Ranks made by kvs_rank_create move every byte, on staging and on slice. */
static void test_rank_create_moves_kv(void **state)
{
    (void)state;
    const kvs_path_t paths[] = {KVS_PATH_AUTO, KVS_PATH_SLICE};
    for (size_t i = 0; i < 2; i++) {
        edge_opts_t o = edge_defaults();
        o.rank_create = true;
        o.staging = paths[i] == KVS_PATH_AUTO;
        o.path = paths[i];
        edge_cluster_t *cl = edge_create(&o);
        const edge_room_t rooms[] = {{1, 0, 40}, {2, 8, 33}, {3, 0, 1}};
        edge_transfer_ok(cl, rooms, 3);
        assert_int_equal(kvs_rank_role(edge_decode(cl, 0)->rank), KVS_ROLE_DECODE);
        assert_int_equal(kvs_rank_role(edge_prefill(cl, 0)->rank), KVS_ROLE_PREFILL);
        assert_int_equal(kvs_rank_peers_ready(edge_decode(cl, 0)->rank), 2);
        assert_int_equal(kvs_rank_peers_ready(edge_prefill(cl, 0)->rank), 0);
        kvs_handler_stats_t st;
        kvs_rank_stats(edge_decode(cl, 0)->rank, &st);
        assert_int_equal(st.rooms_ok, 3);
        kvs_rank_stats(edge_prefill(cl, 1)->rank, &st);
        assert_int_equal(st.rooms_ok, 3);
        edge_destroy(cl);
    }
}

typedef struct fixture {
    fake_device_t dev;
    fake_fabric_t fab;
    kvs_kv_layer_t layers[2];
} fixture_t;

static kvs_rank_config_t fixture_cfg(fixture_t *f, kvs_role_t role)
{
    fake_device_setup(&f->dev);
    fake_fabric_setup(&f->fab, KVS_FABRIC_CAP_WRITE_IMM);
    for (int l = 0; l < 2; l++)
        f->layers[l] = (kvs_kv_layer_t){.k_addr = 0x100000u * (uint64_t)(2 * l + 1),
                                        .v_addr = 0x100000u * (uint64_t)(2 * l + 2),
                                        .tokens = 1024, .token_stride_bytes = 4 * 128 * 2,
                                        .head_stride_bytes = 128 * 2, .elem_stride_bytes = 2};
    const kvs_manager_config_t mc = {
        .role = role, .staging = true, .total_heads = 8, .head_dim = 128,
        .dtype = KVS_DTYPE_BF16, .layers = 2, .page_size = 16, .tp_rank = 0, .tp_size = 2,
        .pp_size = 1, .peer_tp_size = 1, .ring_bytes = 1u << 20, .transfer_workers = 2};
    return (kvs_rank_config_t){.manager = mc, .layers = f->layers};
}

/* A refused create names the init step and why, and leaves nothing: every
 * allocation and registration it made is released. */
static void expect_create_refused(fixture_t *f, const kvs_rank_config_t *cfg, int status,
                                  const char *says)
{
    kvs_rank_t *r = (kvs_rank_t *)&r;
    kvs_error_t err = {0};
    const int rc = kvs_rank_create(cfg, &f->dev.base, &f->fab.base, &r, &err);
    if (rc != status)
        fail_msg("got %s (%s), want %s", kvs_status_name(rc), err.msg, kvs_status_name(status));
    assert_null(r);
    assert_int_equal(err.status, status);
    if (strstr(err.msg, says) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", err.msg, says);
    assert_int_equal(f->dev.live_allocs, 0);
    assert_int_equal(f->fab.live_mrs, 0);
}

static void test_rank_create_refusals(void **state)
{
    (void)state;
    fixture_t f;
    for (int role = 0; role < 2; role++) {
        const kvs_role_t rl = role == 0 ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
        kvs_rank_config_t cfg = fixture_cfg(&f, rl);
        /* Made whole, then destroyed whole. */
        kvs_rank_t *r = NULL;
        kvs_error_t err = {.status = KVS_EBUSY};
        assert_int_equal(kvs_rank_create(&cfg, &f.dev.base, &f.fab.base, &r, &err), KVS_OK);
        assert_int_equal(err.status, KVS_OK);
        assert_int_equal(kvs_rank_role(r), rl);
        assert_non_null(kvs_rank_manager(r));
        assert_true((kvs_rank_decode(r) != NULL) == (rl == KVS_ROLE_DECODE));
        assert_true((kvs_rank_prefill(r) != NULL) == (rl == KVS_ROLE_PREFILL));
        assert_true(f.dev.live_allocs > 0);
        kvs_rank_destroy(r);
        assert_int_equal(f.dev.live_allocs, 0);
        assert_int_equal(f.fab.live_mrs, 0);

        /* The manager's own guard. */
        cfg = fixture_cfg(&f, rl);
        cfg.manager.page_size = 0;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "page_size must be > 0");
        /* Each init step, failing. */
        cfg = fixture_cfg(&f, rl);
        f.dev.alloc_fail_at = 1;
        expect_create_refused(&f, &cfg, KVS_EBACKEND, "init_staging: ");
        cfg = fixture_cfg(&f, rl);
        f.fab.register_fail_at = 1;
        expect_create_refused(&f, &cfg, KVS_EBACKEND, "register_staging: ");
        /* KV layers that do not fit the geometry, each by name. */
        cfg = fixture_cfg(&f, rl);
        f.layers[1].head_stride_bytes = 512;
        expect_create_refused(&f, &cfg, KVS_EINVAL,
                              "set_kv_layers: layer 1: head stride 512 bytes, but 4 heads x "
                              "head dim 128 x 2 bytes (bf16)");
        cfg = fixture_cfg(&f, rl);
        f.layers[0].elem_stride_bytes = 4;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 0: element stride 4 bytes");
        cfg = fixture_cfg(&f, rl);
        f.layers[1].token_stride_bytes = 4 * 128 * 2 + 64;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 1: token stride 1088 bytes");
        cfg = fixture_cfg(&f, rl);
        f.layers[1].v_addr = 0;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 1: its V address is 0");
        cfg = fixture_cfg(&f, rl);
        f.layers[0].k_addr = 0;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 0: its K address is 0");
        cfg = fixture_cfg(&f, rl);
        f.layers[1].tokens = 512;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 1: 512 token slots, but layer 0 has "
                                                    "1024");
        cfg = fixture_cfg(&f, rl);
        f.layers[0].tokens = 1000;
        expect_create_refused(&f, &cfg, KVS_EINVAL,
                              "layer 0's 1000 token slots a whole number of 16-token pages");
        cfg = fixture_cfg(&f, rl);
        cfg.layers = NULL;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "0 layers given, but this rank's pool has 2");
        /* Heads: given, or from heads_per_rank, or total over TP. */
        cfg = fixture_cfg(&f, rl);
        cfg.local_heads = 8;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "token stride 1024 bytes, but 8 heads");
        cfg = fixture_cfg(&f, rl);
        cfg.manager.heads_per_rank = 2;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "but 2 heads");
    }
    /* Arguments. */
    kvs_rank_config_t cfg = fixture_cfg(&f, KVS_ROLE_DECODE);
    kvs_error_t err = {0};
    assert_int_equal(kvs_rank_create(&cfg, &f.dev.base, &f.fab.base, NULL, &err), KVS_EINVAL);
    kvs_rank_t *r = (kvs_rank_t *)&r;
    assert_int_equal(kvs_rank_create(NULL, &f.dev.base, &f.fab.base, &r, &err), KVS_EINVAL);
    assert_non_null(strstr(err.msg, "config and out must not be NULL"));
    assert_int_equal(kvs_rank_create(&cfg, NULL, &f.fab.base, &r, NULL), KVS_EINVAL);
    assert_null(r);
}

/* FP8 KV with scale planes from per-layer descriptors: each layer gives
 * its K and V scale buffers (ks_addr, vs_addr); a missing one, or one
 * given without kv_scales, is named; with them the rank is made and its
 * layout sized with the scale rows. */
static void test_rank_create_with_scale_planes(void **state)
{
    (void)state;
    fixture_t f;
    for (int role = 0; role < 2; role++) {
        const kvs_role_t rl = role == 0 ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
        kvs_rank_config_t cfg = fixture_cfg(&f, rl);
        /* a scale address without kv_scales */
        f.layers[1].ks_addr = 0x900000u;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 1: a K scale address is given, "
                                                    "but kv_scales is none");
        cfg = fixture_cfg(&f, rl);
        cfg.manager.dtype = KVS_DTYPE_FP8;
        cfg.manager.kv_scales = KVS_KV_SCALES_PER_TOKEN;
        for (int l = 0; l < 2; l++) {
            f.layers[l].token_stride_bytes = 4 * 128;
            f.layers[l].head_stride_bytes = 128;
            f.layers[l].elem_stride_bytes = 1;
            f.layers[l].ks_addr = 0x1000000u * (uint64_t)(2 * l + 1);
            f.layers[l].vs_addr = 0x1000000u * (uint64_t)(2 * l + 2);
        }
        f.layers[0].vs_addr = 0;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 0: kv_scales per-token needs its "
                                                    "scale buffers: its V scale address is 0");
        f.layers[0].vs_addr = 0x2000000u;
        f.layers[1].ks_addr = 0;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 1: kv_scales per-token needs its "
                                                    "scale buffers: its K scale address is 0");
        f.layers[1].ks_addr = 0x3000000u;
        kvs_rank_t *r = NULL;
        kvs_error_t err = {0};
        assert_int_equal(kvs_rank_create(&cfg, &f.dev.base, &f.fab.base, &r, &err), KVS_OK);
        const kvs_layout_t *l = kvs_manager_layout(kvs_rank_manager(r));
        assert_int_equal(l->scale_bytes, 4);
        assert_int_equal(kvs_layout_layer_block_bytes(l, 10, 1), 10 * (128 + 4));
        kvs_rank_destroy(r);
        assert_int_equal(f.dev.live_allocs, 0);
        assert_int_equal(f.fab.live_mrs, 0);
    }
}

/* MLA keeps one latent buffer per layer (k_addr): a V buffer or a V scale
 * buffer given with it is named, and without them the rank is made. */
static void test_rank_create_mla_one_buffer_per_layer(void **state)
{
    (void)state;
    fixture_t f;
    for (int role = 0; role < 2; role++) {
        const kvs_role_t rl = role == 0 ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
        kvs_rank_config_t cfg = fixture_cfg(&f, rl);
        cfg.manager.kv_kind = KVS_KV_MLA;
        cfg.manager.total_heads = 1;
        cfg.manager.head_dim = 576;
        for (int l = 0; l < 2; l++) {
            f.layers[l].token_stride_bytes = 576 * 2;
            f.layers[l].head_stride_bytes = 576 * 2;
        }
        expect_create_refused(&f, &cfg, KVS_EMLA, "layer 0: kv_kind mla keeps one buffer per "
                                                  "layer (its latent, as k_addr): pass v_addr 0");
        f.layers[0].v_addr = f.layers[1].v_addr = 0;
        /* with scale planes: the latent's K scale buffer only */
        cfg.manager.dtype = KVS_DTYPE_FP8;
        cfg.manager.kv_scales = KVS_KV_SCALES_PER_TOKEN;
        for (int l = 0; l < 2; l++) {
            f.layers[l].token_stride_bytes = f.layers[l].head_stride_bytes = 576;
            f.layers[l].elem_stride_bytes = 1;
            f.layers[l].ks_addr = 0x1000000u * (uint64_t)(l + 1);
        }
        f.layers[1].vs_addr = 0x4000000u;
        expect_create_refused(&f, &cfg, KVS_EINVAL, "layer 1: a V scale address is given, but "
                                                    "one plane per layer has no V");
        f.layers[1].vs_addr = 0;
        kvs_rank_t *r = NULL;
        kvs_error_t err = {0};
        assert_int_equal(kvs_rank_create(&cfg, &f.dev.base, &f.fab.base, &r, &err), KVS_OK);
        assert_int_equal(kvs_manager_layout(kvs_rank_manager(r))->scale_bytes, 4);
        kvs_rank_destroy(r);
        assert_int_equal(f.dev.live_allocs, 0);
        assert_int_equal(f.fab.live_mrs, 0);
    }
}

/* A rank on the caller's manager leaves it to the caller, who can make
 * another rank on it; its handler's guards apply. */
static void test_rank_create_on(void **state)
{
    (void)state;
    fixture_t f;
    kvs_rank_config_t cfg = fixture_cfg(&f, KVS_ROLE_PREFILL);
    kvs_manager_t *m = NULL;
    kvs_error_t err = {0};
    assert_int_equal(kvs_manager_create(&cfg.manager, &f.dev.base, &f.fab.base, &m, &err),
                     KVS_OK);
    kvs_rank_t *r = (kvs_rank_t *)&r;
    /* No staging yet: the handler's guard says which step is missing. */
    assert_int_equal(kvs_rank_create_on(m, &r), KVS_ENO_ALLOCATOR);
    assert_null(r);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_layers(m, f.layers, 2, 4), KVS_OK);
    assert_int_equal(kvs_rank_create_on(m, &r), KVS_OK);
    assert_ptr_equal(kvs_rank_manager(r), m);
    kvs_rank_destroy(r);
    assert_int_equal(kvs_rank_create_on(m, &r), KVS_OK); /* the manager stayed */
    kvs_rank_destroy(r);
    assert_int_equal(kvs_rank_create_on(m, NULL), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "out must not be NULL"));
    assert_int_equal(kvs_rank_create_on(NULL, &r), KVS_EINVAL);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    assert_int_equal(f.dev.live_allocs, 0);
    assert_int_equal(f.fab.live_mrs, 0);
    kvs_rank_destroy(NULL); /* a no-op */
}

/* ---- the calls of one role, and NULL ------------------------------------------ */

static void test_rank_wrong_role_and_null(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    kvs_rank_t *p = edge_prefill(cl, 0)->rank, *d = edge_decode(cl, 0)->rank;
    const kvs_instance_desc_t inst = {.id = 9, .tp_size = 1};
    assert_int_equal(kvs_rank_add_instance(p, &inst), KVS_ESTATE);
    assert_non_null(strstr(kvs_rank_last_error(p)->msg,
                           "add_instance is for decode ranks: this rank is a prefill"));
    assert_int_equal(kvs_rank_connect(p, (kvs_peer_t){0, 0}), KVS_ESTATE);
    assert_int_equal(kvs_rank_computed(d, 1, 4, true), KVS_ESTATE);
    assert_non_null(strstr(kvs_rank_last_error(d)->msg,
                           "computed is for prefill ranks: this rank is a decode"));
    /* A prefill rank holds the whole request. */
    int64_t pages[2] = {0, 1};
    const kvs_room_desc_t bad = {.room = 1, .base_tokens = 4, .total_tokens = 8,
                                 .pages = pages, .num_pages = 1};
    assert_int_equal(kvs_rank_open_room(p, &bad), KVS_EINVAL);
    assert_non_null(strstr(kvs_rank_last_error(p)->msg, "base_tokens must be 0 (got 4)"));
    /* A decode rank gives no aux payload: neither bytes nor a length. */
    const char aux[] = "tok";
    kvs_room_desc_t with_aux = {.room = 1, .total_tokens = 8, .pages = pages, .num_pages = 1,
                                .aux = aux, .aux_bytes = sizeof aux};
    assert_int_equal(kvs_rank_open_room(d, &with_aux), KVS_EINVAL);
    assert_non_null(strstr(kvs_rank_last_error(d)->msg, "a decode rank gives no aux payload"));
    with_aux.aux = NULL;
    assert_int_equal(kvs_rank_open_room(d, &with_aux), KVS_EINVAL);
    with_aux.aux = aux;
    with_aux.aux_bytes = 0;
    assert_int_equal(kvs_rank_open_room(d, &with_aux), KVS_EINVAL);
    /* The decode calls, through the rank. */
    assert_int_equal(kvs_rank_connect(d, (kvs_peer_t){0, 0}), KVS_OK);
    assert_int_equal(kvs_rank_add_instance(d, &inst), KVS_EINVAL); /* no addresses */
    assert_int_equal(kvs_rank_abort(d, 77), KVS_ENOENT);
    assert_non_null(strstr(kvs_rank_last_error(d)->msg, "room 77 is not open on this rank"));
    assert_int_equal(kvs_rank_abort(p, 77), KVS_ENOENT);
    kvs_room_state_t st;
    assert_int_equal(kvs_rank_room_state(d, 77, &st), KVS_ENOENT);
    /* NULL ranks. */
    assert_int_equal(kvs_rank_add_instance(NULL, &inst), KVS_EINVAL);
    assert_int_equal(kvs_rank_connect(NULL, (kvs_peer_t){0, 0}), KVS_EINVAL);
    assert_int_equal(kvs_rank_open_room(NULL, &bad), KVS_EINVAL);
    assert_int_equal(kvs_rank_open_room(d, NULL), KVS_EINVAL);
    assert_int_equal(kvs_rank_computed(NULL, 1, 4, true), KVS_EINVAL);
    assert_int_equal(kvs_rank_set_aux(NULL, 1, NULL, 0), KVS_EINVAL);
    assert_int_equal(kvs_rank_room_state(NULL, 1, &st), KVS_EINVAL);
    assert_int_equal(kvs_rank_abort(NULL, 1), KVS_EINVAL);
    assert_int_equal(kvs_rank_step(NULL, NULL, NULL, NULL), KVS_EINVAL);
    assert_int_equal(kvs_rank_poll(NULL, NULL, 0), KVS_EINVAL);
    assert_int_equal(kvs_rank_next_deadline_ns(NULL), UINT64_MAX);
    assert_int_equal(kvs_rank_peers_ready(NULL), 0);
    assert_null(kvs_rank_manager(NULL));
    assert_null(kvs_rank_decode(NULL));
    assert_null(kvs_rank_prefill(NULL));
    assert_null(kvs_rank_last_error(NULL));
    kvs_handler_stats_t stats = {.rooms_ok = 5};
    kvs_rank_stats(NULL, &stats);
    assert_int_equal(stats.rooms_ok, 5);
    kvs_rank_stats(d, NULL);
    kvs_rank_set_lock(NULL, NULL, NULL, NULL);
    edge_destroy(cl);
}

/* ---- rooms followed, aborted ---------------------------------------------------- */

static kvs_room_state_t state_of(kvs_rank_t *r, uint64_t room)
{
    kvs_room_state_t st = KVS_ROOM_SUCCESS;
    const int rc = kvs_rank_room_state(r, room, &st);
    if (rc != KVS_OK)
        fail_msg("room %llu: %s", (unsigned long long)room, kvs_status_name(rc));
    return st;
}

/* Bootstrapping until the peers registered and (prefill) the decode's side
 * came, waiting until KV moves, transferring, then gone with its result. */
static void test_rank_room_states(void **state)
{
    (void)state;
    assert_string_equal(kvs_room_state_name(KVS_ROOM_FAILED), "failed");
    assert_string_equal(kvs_room_state_name(KVS_ROOM_BOOTSTRAPPING), "bootstrapping");
    assert_string_equal(kvs_room_state_name(KVS_ROOM_WAITING), "waiting");
    assert_string_equal(kvs_room_state_name(KVS_ROOM_TRANSFERRING), "transferring");
    assert_string_equal(kvs_room_state_name(KVS_ROOM_SUCCESS), "success");
    assert_string_equal(kvs_room_state_name((kvs_room_state_t)9), "unknown");
    /* The numbers sglang's KVPoll uses. */
    assert_int_equal(KVS_ROOM_FAILED, 0);
    assert_int_equal(KVS_ROOM_SUCCESS, 4);

    edge_opts_t o = edge_defaults();
    o.no_connect = true;
    edge_cluster_t *cl = edge_create(&o);
    kvs_rank_t *d = edge_decode(cl, 0)->rank;
    kvs_rank_t *p0 = edge_prefill(cl, 0)->rank;
    edge_open_prefill(cl, 0, 1, 40);
    edge_open_prefill(cl, 1, 1, 40);
    assert_int_equal(state_of(p0, 1), KVS_ROOM_BOOTSTRAPPING); /* no decode yet */
    assert_int_equal(kvs_rank_room_state(p0, 1, NULL), KVS_EINVAL); /* a room, nowhere to say */
    edge_connect(cl, 0);
    edge_open_decode(cl, 1, 0, 40);
    assert_int_equal(state_of(d, 1), KVS_ROOM_BOOTSTRAPPING); /* not acknowledged yet */
    edge_run(cl);
    assert_int_equal(state_of(d, 1), KVS_ROOM_WAITING);
    assert_int_equal(state_of(p0, 1), KVS_ROOM_WAITING);
    edge_computed(cl, 1, 16, false); /* one chunk of three */
    edge_run(cl);
    assert_int_equal(state_of(d, 1), KVS_ROOM_TRANSFERRING);
    assert_int_equal(state_of(p0, 1), KVS_ROOM_TRANSFERRING);
    edge_computed(cl, 1, 40, true);
    edge_run(cl);
    edge_expect_ok(cl, 1, 0, 40);
    kvs_room_state_t st;
    assert_int_equal(kvs_rank_room_state(d, 1, &st), KVS_ENOENT);
    assert_int_equal(kvs_rank_room_state(p0, 1, &st), KVS_ENOENT);
    assert_int_equal(kvs_rank_room_state(d, 1, NULL), KVS_ENOENT);
    edge_destroy(cl);
}

/* An abort on either side ends the room KVS_ECANCELED on every rank, while
 * the rooms beside it finish whole. */
static void expect_reason(const kvs_room_result_t *res, const char *says)
{
    assert_non_null(res);
    if (strncmp(res->reason, says, strlen(says)) != 0)
        fail_msg("room %llu's reason \"%s\" does not start \"%s\"",
                 (unsigned long long)res->room, res->reason, says);
}

static void test_rank_abort(void **state)
{
    (void)state;
    for (int side = 0; side < 2; side++) {
        edge_opts_t o = edge_defaults();
        edge_cluster_t *cl = edge_create(&o);
        edge_open(cl, 1, 0, 40);
        edge_open(cl, 2, 0, 40);
        edge_computed(cl, 1, 16, false);
        edge_computed(cl, 2, 40, true);
        edge_run(cl);
        edge_node_t *n = side == 0 ? edge_decode(cl, 0) : edge_prefill(cl, 1);
        assert_int_equal(kvs_rank_abort(n->rank, 1), KVS_OK);
        assert_int_equal(state_of(n->rank, 1), KVS_ROOM_FAILED);
        edge_wake(n);
        edge_run(cl);
        edge_expect_all(cl, 1, KVS_ECANCELED);
        /* Each side's result says why: the status, what the room was
         * doing, and on the side that did not abort, who reported it. */
        const edge_node_t *other = side == 0 ? edge_prefill(cl, 1) : edge_decode(cl, 0);
        expect_reason(edge_result(n, 1), "KVS_ECANCELED while transferring");
        expect_reason(edge_result(other, 1), "KVS_ECANCELED while transferring; reported by");
        edge_expect_ok(cl, 2, 0, 40);
        assert_string_equal(edge_result(n, 2)->reason, "");
        edge_expect_ring_empty(cl);
        /* Ended: nothing left to abort. */
        assert_int_equal(kvs_rank_abort(n->rank, 1), KVS_ENOENT);
        edge_destroy(cl);
    }
}

/* The application says the peer instance is gone (its discovery lease
 * lapsed) while its connections still stand: its open rooms fail with
 * KVS_EPEER on every rank at once (no stall timeout), nothing leaks, the
 * decode does not reconnect on its own timer (a connect to a stopped
 * process would hold the rank for the fabric's connect timeout), and the
 * next room naming it connects again and moves every byte. Said on a
 * prefill rank of a decode instance, the same rooms fail there and the
 * decode hears of it. An instance nobody declared is KVS_ENOENT. */
static void test_rank_instance_lost(void **state)
{
    (void)state;
    for (int side = 0; side < 2; side++) {
        edge_opts_t o = edge_defaults();
        o.rank_create = true;
        edge_cluster_t *cl = edge_create(&o);
        edge_open(cl, 1, 0, 40);
        edge_open(cl, 2, 0, 40);
        edge_computed(cl, 1, 16, false);
        edge_run(cl);
        edge_node_t *n = side == 0 ? edge_decode(cl, 0) : edge_prefill(cl, 1);
        assert_int_equal(kvs_rank_instance_lost(n->rank, (kvs_peer_t){0, 0}), KVS_OK);
        edge_wake(n);
        edge_run(cl); /* before any stall timeout */
        edge_expect_all(cl, 1, KVS_EPEER);
        edge_expect_all(cl, 2, KVS_EPEER);
        expect_reason(edge_result(n, 1), "KVS_EPEER while transferring");
        expect_reason(edge_result(n, 2), "KVS_EPEER while "); /* prefetched: its state varies */
        edge_expect_ring_empty(cl);
        if (side == 0) {
            kvs_handler_stats_t before, after;
            kvs_rank_stats(n->rank, &before);
            edge_run_past_timeouts(cl);
            kvs_rank_stats(n->rank, &after);
            assert_int_equal(after.msgs_sent, before.msgs_sent); /* no REGISTER */
            /* The next room connects and waits for the registration (the
             * prefill ranks fail a room of a lost decode that has not
             * registered again, so theirs open after it). */
            edge_open_decode(cl, 3, 0, 40);
            assert_int_equal(state_of(n->rank, 3), KVS_ROOM_BOOTSTRAPPING);
            edge_run(cl);
            for (int i = 0; i < cl->nprefill; i++)
                edge_open_prefill(cl, i, 3, 40);
            edge_computed(cl, 3, 40, true);
            edge_run(cl);
        } else {
            edge_transfer(cl, 3, 0, 40);
        }
        edge_expect_ok(cl, 3, 0, 40);
        assert_int_equal(kvs_rank_instance_lost(n->rank, (kvs_peer_t){7, 0}), KVS_ENOENT);
        if (strstr(kvs_rank_last_error(n->rank)->msg, "instance 7") == NULL)
            fail_msg("\"%s\" does not name instance 7", kvs_rank_last_error(n->rank)->msg);
        assert_int_equal(kvs_rank_instance_lost(NULL, (kvs_peer_t){0, 0}), KVS_EINVAL);
        edge_destroy(cl);
    }
}

/* A prefill instance declared again (discovery saw it come back, maybe at
 * other addresses): refused, naming what to do, while it is connected or
 * when its shape differs; once it is gone its new addresses replace the
 * old ones whole. Declared where nothing listens, its next room fails
 * KVS_EPEER at once; declared again at the right addresses, the next room
 * connects to them and moves every byte. */
static void decode_open_alone(edge_node_t *d, uint64_t room, int inst, int *rc_out)
{
    int64_t pages[16];
    const int64_t np = (40 + d->page_size - 1) / d->page_size;
    assert_true(np <= 16);
    for (int64_t i = 0; i < np; i++)
        pages[i] = edge_page(room, i, true);
    *rc_out = kvs_decode_room_open_peer(d->dec, room, (kvs_peer_t){(uint64_t)inst, 0}, 0, 40,
                                        pages, np);
    edge_wake(d);
}

static void expect_error_says(edge_node_t *n, const char *says)
{
    const char *msg = kvs_manager_last_error(n->m)->msg;
    if (strstr(msg, says) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", msg, says);
}

static void test_rank_instance_redeclared(void **state)
{
    (void)state;
    edge_opts_t o = edge_two_instances();
    edge_cluster_t *cl = edge_create(&o);
    edge_node_t *d = edge_decode(cl, 0);
    assert_int_equal(cl->ndecode, 1);
    const int64_t tp = o.inst_tp[1];
    const char *right[8], *wrong[8];
    char nowhere[8][32];
    for (int64_t t = 0; t < tp; t++) {
        right[t] = edge_group_node(cl, 1, 0, t)->name;
        snprintf(nowhere[t], sizeof nowhere[t], "nowhere%lld", (long long)t);
        wrong[t] = nowhere[t];
    }
    edge_open_inst(cl, 1, 1, 0, 40);
    edge_computed_inst(cl, 1, 1, 40);
    edge_run(cl);
    edge_expect_inst_ok(cl, 1, 1, 0, 40);

    kvs_instance_desc_t desc = {.id = 1, .tp_size = tp, .addrs = right};
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EALREADY);
    expect_error_says(d, "kvs_decode_instance_lost first");
    desc.tp_size = tp / 2;
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EALREADY);
    expect_error_says(d, "an id of its own");

    assert_int_equal(kvs_decode_instance_lost(d->dec, (kvs_peer_t){1, 0}), KVS_OK);
    edge_run(cl);
    const char *holes[8] = {"x0", NULL, "x2", "x3", "x4", "x5", "x6", "x7"};
    desc = (kvs_instance_desc_t){.id = 1, .tp_size = tp, .addrs = holes};
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_EINVAL);
    expect_error_says(d, "address 1 is NULL");
    desc.addrs = wrong;
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_OK);
    int rc = KVS_OK;
    decode_open_alone(d, 2, 1, &rc);
    assert_int_equal(rc, KVS_EPEER); /* nothing listens there */
    edge_run(cl);
    edge_expect(d, 2, KVS_EPEER);

    desc.addrs = right;
    assert_int_equal(kvs_decode_add_instance(d->dec, &desc), KVS_OK);
    decode_open_alone(d, 3, 1, &rc);
    assert_int_equal(rc, KVS_OK);
    assert_int_equal(state_of(d->rank, 3), KVS_ROOM_BOOTSTRAPPING);
    edge_run(cl); /* registered before the prefill ranks hear of the room */
    for (int64_t t = 0; t < tp; t++) {
        edge_node_t *p = edge_group_node(cl, 1, 0, t);
        int64_t pages[16];
        const int64_t np = (40 + p->page_size - 1) / p->page_size;
        assert_true(np <= 16);
        for (int64_t k = 0; k < np; k++)
            pages[k] = edge_page(3, k, false);
        edge_fill(p, 3, 40);
        assert_int_equal(kvs_prefill_room_open(p->pre, 3, 40, pages, np), KVS_OK);
        edge_wake(p);
    }
    edge_computed_inst(cl, 1, 3, 40);
    edge_run(cl);
    edge_expect_inst_ok(cl, 1, 3, 0, 40);
    edge_expect_ring_empty(cl);
    edge_destroy(cl);
}

/* ---- the step, and the caller's lock ------------------------------------------- */

typedef struct lock_probe {
    int depth, max_depth;
    uint64_t locks;
} lock_probe_t;

static void probe_lock(void *ctx)
{
    lock_probe_t *p = ctx;
    if (++p->depth > p->max_depth)
        p->max_depth = p->depth;
    p->locks++;
}

static void probe_unlock(void *ctx)
{
    lock_probe_t *p = ctx;
    assert_true(p->depth > 0);
    p->depth--;
}

typedef struct reopen {
    kvs_rank_t *rank;
    lock_probe_t *probe;
    int results;
    int depth_seen;
} reopen_t;

/* A result callback that calls the rank back (as an engine's would). */
static void on_result_calls_back(void *ctx, const kvs_room_result_t *res)
{
    reopen_t *x = ctx;
    x->results++;
    x->depth_seen = x->probe->depth;
    kvs_room_state_t st;
    assert_int_equal(kvs_rank_room_state(x->rank, res->room, &st), KVS_ENOENT);
}

/* Every call takes the lock once and gives it back; on_result runs outside
 * it, so it may call the rank. */
static void test_rank_lock_and_step(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    edge_cluster_t *cl = edge_create(&o);
    lock_probe_t probe[3] = {{0}};
    for (int i = 0; i < 3; i++)
        kvs_rank_set_lock(cl->nodes[i].rank, probe_lock, probe_unlock, &probe[i]);
    edge_transfer_ok(cl, (const edge_room_t[]){{1, 0, 40}, {2, 4, 17}}, 2);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(probe[i].depth, 0);
        assert_int_equal(probe[i].max_depth, 1); /* never taken twice */
        assert_true(probe[i].locks > 10);
    }
    /* The decode stepped by hand (its driver let go of it), with a result
     * callback that calls the rank back. */
    edge_node_t *d = edge_decode(cl, 0);
    sim_driver_set_rank(&d->drv, NULL);
    edge_open(cl, 3, 0, 8);
    edge_computed(cl, 3, 8, true);
    reopen_t x = {.rank = d->rank, .probe = &probe[2], .depth_seen = -1};
    for (int i = 0; i < 1000 && x.results == 0; i++) {
        sim_engine_run(cl->eng, sim_engine_now_ns(cl->eng) + 100000u, EDGE_EVENT_BUDGET);
        uint64_t next = 0;
        assert_true(kvs_rank_step(d->rank, on_result_calls_back, &x, &next) >= 0);
        assert_true(next > sim_engine_now_ns(cl->eng));
    }
    assert_int_equal(x.results, 1);
    assert_int_equal(x.depth_seen, 0); /* outside the lock */
    assert_int_equal(probe[2].depth, 0);
    /* Without a callback the results stay for kvs_rank_poll. */
    edge_open(cl, 4, 0, 8);
    edge_computed(cl, 4, 8, true);
    kvs_room_result_t res[2];
    int got = 0;
    for (int i = 0; i < 1000 && got == 0; i++) {
        sim_engine_run(cl->eng, sim_engine_now_ns(cl->eng) + 100000u, EDGE_EVENT_BUDGET);
        assert_true(kvs_rank_step(d->rank, NULL, NULL, NULL) >= 0);
        got = kvs_rank_poll(d->rank, res, 2);
    }
    assert_int_equal(got, 1);
    assert_int_equal(res[0].room, 4);
    assert_int_equal(res[0].status, KVS_OK);
    uint64_t next = 0;
    assert_true(kvs_rank_step(d->rank, NULL, NULL, &next) >= 0);
    assert_int_equal(kvs_rank_next_deadline_ns(d->rank), next);
    sim_driver_set_rank(&d->drv, d->rank);
    edge_destroy(cl);
}

int main(void)
{
    print_message("test_rank: seed %llu\n", (unsigned long long)EDGE_SEED);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_create_moves_kv),
        cmocka_unit_test(test_rank_create_refusals),
        cmocka_unit_test(test_rank_create_on),
        cmocka_unit_test(test_rank_create_with_scale_planes),
        cmocka_unit_test(test_rank_create_mla_one_buffer_per_layer),
        cmocka_unit_test(test_rank_wrong_role_and_null),
        cmocka_unit_test(test_rank_room_states),
        cmocka_unit_test(test_rank_abort),
        cmocka_unit_test(test_rank_instance_lost),
        cmocka_unit_test(test_rank_instance_redeclared),
        cmocka_unit_test(test_rank_lock_and_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
