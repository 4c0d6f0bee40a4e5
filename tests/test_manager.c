/*
 * test_manager.c - the KV manager's init steps and the guards of spec §8:
 * every guard returns its own code with an actionable message, every step is
 * all-or-nothing (device and fabric failures injected at each call leave no
 * allocation or registration behind), steps called early or twice return
 * codes, and the manager refuses to die under a live handler.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <kvstage/backend.h>

#include "fake_backend.h"

#define LAYERS 8

typedef struct fixture {
    fake_device_t dev;
    fake_fabric_t fab;
    uint64_t k[LAYERS], v[LAYERS];
    kvs_kv_buffers_t kv;
} fixture_t;

static int setup(void **state)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    fake_device_setup(&f.dev);
    fake_fabric_setup(&f.fab, KVS_FABRIC_CAP_WRITE_IMM);
    for (int i = 0; i < LAYERS; i++) {
        f.k[i] = 0x1000u * (uint64_t)(i + 1);
        f.v[i] = 0x100000u * (uint64_t)(i + 1);
    }
    f.kv = (kvs_kv_buffers_t){.num_layers = LAYERS, .k_base = f.k, .v_base = f.v,
                              .local_heads = 4, .page_size = 16, .num_pages = 64};
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(f->dev.live_allocs, 0);
    assert_int_equal(f->fab.live_mrs, 0);
    assert_int_equal(f->dev.live_streams, 0);
    assert_int_equal(f->dev.live_events, 0);
    return 0;
}

/* Decode rank 0 of TP 2 receiving from prefill TP 8: 8 heads, 4 per rank. */
static kvs_manager_config_t decode_cfg(void)
{
    kvs_manager_config_t c = {.role = KVS_ROLE_DECODE, .staging = true, .total_heads = 8,
                              .head_dim = 128, .dtype = KVS_DTYPE_BF16, .layers = LAYERS,
                              .page_size = 16, .tp_rank = 0, .tp_size = 2, .pp_size = 1,
                              .peer_tp_size = 8, .ring_bytes = 1u << 20};
    return c;
}

static kvs_manager_config_t prefill_cfg(void)
{
    kvs_manager_config_t c = {.role = KVS_ROLE_PREFILL, .staging = true, .total_heads = 8,
                              .head_dim = 128, .dtype = KVS_DTYPE_BF16, .layers = LAYERS,
                              .page_size = 16, .tp_rank = 3, .tp_size = 8, .pp_size = 1,
                              .peer_tp_size = 2, .chunk_tokens = 64};
    return c;
}

static kvs_manager_t *make(fixture_t *f, const kvs_manager_config_t *c)
{
    kvs_manager_t *m = NULL;
    kvs_error_t e;
    int rc = kvs_manager_create(c, &f->dev.base, &f->fab.base, &m, &e);
    if (rc != KVS_OK)
        fail_msg("create: %s: %s", kvs_status_name(rc), e.msg);
    return m;
}

static void test_manager_decode_init_in_order(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    kvs_manager_t *m = make(f, &c);
    assert_null(kvs_manager_ring(m));
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_non_null(kvs_manager_ring(m));
    assert_int_equal(kvs_ring_size_bytes(kvs_manager_ring(m)), 1u << 20);
    assert_int_equal(f->dev.live_allocs, 1);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(f->fab.live_mrs, 1);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    assert_null(kvs_manager_layout(m));
    kvs_decode_t *d = NULL;
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_non_null(d);
    const kvs_layout_t *l = kvs_manager_layout(m);
    assert_non_null(l);
    assert_int_equal(l->expected_arrivals, 4);
    assert_int_equal(l->dst_heads, 4);
    uint64_t addr, len, rkey;
    assert_int_equal(kvs_manager_staging_buffer(m, 0, &addr, &len, &rkey), KVS_OK);
    assert_int_equal(len, 1u << 20);
    assert_int_not_equal(rkey, 0);
    assert_int_equal(kvs_manager_staging_count(m), 1);
    assert_int_equal(kvs_manager_destroy(m), KVS_EBUSY);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "kvs_decode_destroy"));
    kvs_decode_destroy(d);
    kvs_decode_destroy(NULL);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    assert_int_equal(kvs_manager_destroy(NULL), KVS_OK);
}

static void test_manager_decode_without_allocator(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    kvs_decode_t *d = (kvs_decode_t *)&d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_ENO_ALLOCATOR);
    assert_null(d);
    const kvs_error_t *e = kvs_manager_last_error(m);
    assert_int_equal(e->status, KVS_ENO_ALLOCATOR);
    assert_non_null(strstr(e->msg, "staging allocator is missing"));
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_decode_without_kv_buffers(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_ENO_KV_BUFFERS);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg,
                           "kv_buffer_tensors is missing: set_kv_buffer_tensors()"));
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_decode_without_registration(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_register_staging(m), KVS_ESTATE);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_ESTATE);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "register"));
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_heads_unresolvable(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    c.total_heads = 0;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_EHEADS);
    assert_int_equal(kvs_manager_set_heads(m, -1, 0), KVS_EINVAL);
    assert_int_equal(kvs_manager_set_heads(m, 0, 3), KVS_EINVAL); /* buffers hold 4 */
    assert_int_equal(kvs_manager_set_heads(m, 8, 0), KVS_OK);
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_int_equal(kvs_manager_set_heads(m, 16, 0), KVS_ESTATE);
    { kvs_decode_t *d2; assert_int_equal(kvs_decode_create(m, &d2), KVS_EALREADY); }
    kvs_decode_destroy(d);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_heads_per_rank_fallback(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    c.total_heads = 0;
    c.heads_per_rank = 4; /* per decode rank: 4 * TP 2 = 8 */
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_int_equal(kvs_manager_layout(m)->total_heads, 8);
    kvs_decode_destroy(d);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_kv_heads_disagree_with_layout(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    c.total_heads = 16; /* 8 per decode rank, but the buffers hold 4 */
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_EHEAD_SPLIT);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

typedef struct guard_case {
    const char *what;
    kvs_manager_config_t cfg;
    uint32_t caps;
    int status;
    const char *names; /* what the error message must say */
} guard_case_t;

static void test_manager_config_guards(void **state)
{
    fixture_t *f = *state;
    guard_case_t g[] = {
        {"mla with GQA heads", decode_cfg(), 0, KVS_EMLA,
         "total_heads 8 and heads_per_rank 0 must be 0 or 1"},
        /* A decode pairs with CP ranks of a declared instance only. */
        {"context parallel on a decode", decode_cfg(), 0, KVS_ECONTEXT_PARALLEL,
         "context_parallel 2 on a decode rank: declare the prefill instance with "
         "kvs_decode_add_instance"},
        {"chunk not multiple", prefill_cfg(), 0, KVS_ECHUNK,
         "chunk_tokens 100 must be a positive multiple of page_size 16"},
        {"chunk negative", decode_cfg(), 0, KVS_ECHUNK, "chunk_tokens -16"},
        {"decode: prefill pp without per-layer writes", decode_cfg(), 0, KVS_EPP_WRITES,
         "prefill PP 2 needs per-layer writes and fabric 'fake-fabric'"},
        {"prefill pp without per-layer writes", prefill_cfg(), 0, KVS_EPP_WRITES,
         "prefill PP 2"},
        {"prefill pp with per-layer writes", prefill_cfg(),
         KVS_FABRIC_CAP_PER_LAYER_WRITES, KVS_OK, NULL},
        {"role", decode_cfg(), 0, KVS_EINVAL, "role 7 unknown"},
        {"sizes", decode_cfg(), 0, KVS_EINVAL, "page_size must be > 0"},
        {"dtype", decode_cfg(), 0, KVS_EDTYPE, "dtype 11 unknown"},
        {"tp rank", decode_cfg(), 0, KVS_EINVAL, "tp_rank 2 must lie in [0, tp_size 2)"},
        {"pp rank", decode_cfg(), 0, KVS_EINVAL, "pp_rank -1 must lie in [0, pp_size 1)"},
        {"negative peer", decode_cfg(), 0, KVS_EINVAL, "peer_tp_size"},
        {"mla staging (no longer refused)", decode_cfg(), 0, KVS_OK, NULL},
        {"head_dim", decode_cfg(), 0, KVS_EINVAL, "head_dim, layers and page_size"},
        {"layers", decode_cfg(), 0, KVS_EINVAL, "(got 128, -8, 16)"},
        {"tp size", decode_cfg(), 0, KVS_EINVAL, "tp_size 0"},
        {"tp rank negative", decode_cfg(), 0, KVS_EINVAL, "tp_rank -1"},
        {"pp size", decode_cfg(), 0, KVS_EINVAL, "pp_size 0"},
        {"pp rank past size", decode_cfg(), 0, KVS_EINVAL, "pp_rank 1 must lie in"},
        {"negative peer pp", decode_cfg(), 0, KVS_EINVAL, "peer_pp_size"},
        {"negative context parallel", decode_cfg(), 0, KVS_EINVAL, "context_parallel"},
        {"negative total heads", decode_cfg(), 0, KVS_EINVAL, "total_heads"},
        {"negative heads per rank", decode_cfg(), 0, KVS_EINVAL, "heads_per_rank"},
        {"context parallel 1 is staging's", prefill_cfg(), 0, KVS_OK, NULL},
        {"default chunk not whole pages", decode_cfg(), 0, KVS_ECHUNK,
         "chunk_tokens 0 means 8192, which is not a multiple of page_size 24"},
        {"default chunk, page size dividing it", decode_cfg(), 0, KVS_OK, NULL},
        {"default chunk, no staging: not checked", decode_cfg(), 0, KVS_OK, NULL},
        {"aux over the limit", prefill_cfg(), 0, KVS_EINVAL,
         "max_aux_bytes 1048577 is over the limit of 1048576 bytes"},
        {"aux at the limit", decode_cfg(), 0, KVS_OK, NULL},
        {"negative dp rank", decode_cfg(), 0, KVS_EINVAL, "dp_rank -1 must be >= 0"},
        {"bounds given, not defaulted", decode_cfg(), 0, KVS_OK, NULL},
        /* Different page sizes: the chunk covers whole pages of both sides. */
        {"negative peer page size", decode_cfg(), 0, KVS_EINVAL,
         "peer_page_size -16 must be >= 0"},
        {"chunk not whole peer pages", prefill_cfg(), 0, KVS_ECHUNK,
         "chunk_tokens 64 must be a multiple of the peer's page size 48"},
        {"default chunk not whole peer pages", decode_cfg(), 0, KVS_ECHUNK,
         "chunk_tokens 8192 (the default) must be a multiple of the peer's page size 24"},
        {"peer pages of 64", prefill_cfg(), 0, KVS_OK, NULL},
        {"peer pages of 24, no staging: not checked", decode_cfg(), 0, KVS_OK, NULL},
        /* Prefill CP moves on every path: staging off, a CP rank takes the
         * slice (or direct) path. */
        {"context parallel, no staging", prefill_cfg(), 0, KVS_OK, NULL},
        /* A prefill rank's CP rank lies in its CP size; a decode has none. */
        {"cp rank past the CP size", prefill_cfg(), 0, KVS_EINVAL,
         "cp_rank 1 must lie in [0, context_parallel 1)"},
        {"negative cp rank", prefill_cfg(), 0, KVS_EINVAL, "cp_rank -1 must lie in"},
        {"cp rank on a decode", decode_cfg(), 0, KVS_EINVAL, "be 0 on a decode rank"},
    };
    g[38].cfg.cp_rank = 1;
    g[39].cfg.cp_rank = -1;
    g[40].cfg.context_parallel = 2;
    g[40].cfg.cp_rank = 1;
    g[32].cfg.peer_page_size = -16;
    g[33].cfg.peer_page_size = 48; /* chunk_tokens 64 */
    g[34].cfg.peer_page_size = 24;
    g[35].cfg.peer_page_size = 64;
    g[36].cfg.peer_page_size = 24;
    g[36].cfg.staging = false;
    g[37].cfg.context_parallel = 3;
    g[37].cfg.staging = false;
    g[0].cfg.is_mla = true;
    g[1].cfg.context_parallel = 2;
    g[2].cfg.chunk_tokens = 100;
    g[3].cfg.chunk_tokens = -16;
    g[4].cfg.peer_pp_size = 2;
    g[5].cfg.pp_size = 2;
    g[6].cfg.pp_size = 2;
    g[7].cfg.role = (kvs_role_t)7;
    g[8].cfg.page_size = 0;
    g[9].cfg.dtype = (kvs_dtype_t)11;
    g[10].cfg.tp_rank = 2;
    g[11].cfg.pp_rank = -1;
    g[12].cfg.peer_tp_size = -1;
    g[13].cfg.kv_kind = KVS_KV_MLA;
    g[13].cfg.total_heads = 0;
    g[13].cfg.head_dim = 576;
    g[14].cfg.head_dim = 0;
    g[15].cfg.layers = -8;
    g[16].cfg.tp_size = 0;
    g[17].cfg.tp_rank = -1;
    g[18].cfg.pp_size = 0;
    g[19].cfg.pp_rank = 1;
    g[20].cfg.peer_pp_size = -1;
    g[21].cfg.context_parallel = -1;
    g[22].cfg.total_heads = -8;
    g[23].cfg.heads_per_rank = -4;
    g[24].cfg.context_parallel = 1;
    g[25].cfg.page_size = 24; /* chunk_tokens 0 */
    g[26].cfg.page_size = 64;
    g[27].cfg.page_size = 24;
    g[27].cfg.staging = false;
    g[28].cfg.max_aux_bytes = KVS_AUX_BYTES_MAX + 1;
    g[29].cfg.max_aux_bytes = KVS_AUX_BYTES_MAX;
    g[30].cfg.dp_rank = -1;
    g[31].cfg.max_peers = 8;
    g[31].cfg.retry_timeout_ns = 5000000;
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        f->fab.base.ops.caps = g[i].caps;
        kvs_manager_t *m = (kvs_manager_t *)&m;
        kvs_error_t e = {.status = KVS_EBUSY, .msg = "stale"};
        int rc = kvs_manager_create(&g[i].cfg, &f->dev.base, &f->fab.base, &m, &e);
        if (rc != g[i].status)
            fail_msg("%s: got %s (%s), want %s", g[i].what, kvs_status_name(rc), e.msg,
                     kvs_status_name(g[i].status));
        if (rc != KVS_OK) {
            assert_null(m);
            assert_int_equal(e.status, rc);
            if (strstr(e.msg, g[i].names) == NULL)
                fail_msg("%s: message \"%s\" does not say \"%s\"", g[i].what, e.msg,
                         g[i].names);
        } else {
            assert_int_equal(e.status, KVS_OK); /* a success clears the detail */
        }
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    }
}

/* Uneven pipeline splits (spec §4): `layers` is this rank's share of
 * model_layers, which create checks; the layout covers the whole model. */
static void test_manager_model_layers_uneven_split(void **state)
{
    fixture_t *f = *state;
    f->fab.base.ops.caps |= KVS_FABRIC_CAP_PER_LAYER_WRITES; /* prefill PP 3 */
    /* 26 layers over 3 stages: 8 / 9 / 9; this rank (stage 0) holds 8. */
    kvs_manager_config_t c = prefill_cfg();
    c.pp_size = 3;
    c.peer_pp_size = 3;
    c.model_layers = 26;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    uint64_t len = 0; /* sized for this rank's 8 layers */
    assert_int_equal(kvs_manager_staging_buffer(m, 0, NULL, &len, NULL), KVS_OK);
    assert_int_equal(len, 64u * 1 * 128 * 2 * LAYERS * 2);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    kvs_kv_buffers_t kv = f->kv;
    kv.local_heads = 1; /* 8 heads over prefill TP 8 */
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
    kvs_prefill_t *p = NULL;
    assert_int_equal(kvs_prefill_create(m, &p), KVS_OK);
    const kvs_layout_t *l = kvs_manager_layout(m);
    assert_int_equal(l->layers, 26);
    assert_int_equal(l->prefill_layers, 9);
    assert_int_equal(l->decode_layers, 9);
    kvs_prefill_destroy(p);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    typedef struct {
        const char *what;
        int64_t layers, model_layers, pp_rank, pp_size;
        int status;
        const char *names;
    } layers_case_t;
    const layers_case_t g[] = {
        {"stage 1 holds 9", 8, 26, 1, 3, KVS_EPP_SPLIT,
         "layers 8: pp_rank 1 of model_layers 26 over pp_size 3 holds 9 layers (8..16): "
         "pass layers 9"},
        {"stage 2 holds 9", 9, 26, 2, 3, KVS_OK, NULL},
        {"a stage without layers", 1, 2, 0, 3, KVS_EPP_SPLIT,
         "model_layers 2 cannot fill pp_size 3 stages"},
        {"default: an even split", 8, 0, 2, 3, KVS_OK, NULL},
        {"default overflows", INT64_MAX / 2, 0, 0, 3, KVS_EINVAL,
         "pass model_layers"},
        {"negative", 8, -1, 0, 1, KVS_EINVAL, "model_layers must be >= 0"},
        {"model of this rank alone", 8, 8, 0, 1, KVS_OK, NULL},
        {"model larger than pp 1 holds", 8, 9, 0, 1, KVS_EPP_SPLIT, "pass layers 9"},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        c = prefill_cfg();
        c.layers = g[i].layers;
        c.model_layers = g[i].model_layers;
        c.pp_rank = g[i].pp_rank;
        c.pp_size = g[i].pp_size;
        m = (kvs_manager_t *)&m;
        kvs_error_t e = {0};
        int rc = kvs_manager_create(&c, &f->dev.base, &f->fab.base, &m, &e);
        if (rc != g[i].status)
            fail_msg("%s: got %s (%s)", g[i].what, kvs_status_name(rc), e.msg);
        if (rc != KVS_OK) {
            assert_null(m);
            if (strstr(e.msg, g[i].names) == NULL)
                fail_msg("%s: message \"%s\" does not say \"%s\"", g[i].what, e.msg,
                         g[i].names);
        }
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    }
}

static void test_manager_create_argument_errors(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    kvs_manager_t *m;
    assert_int_equal(kvs_manager_create(&c, &f->dev.base, &f->fab.base, NULL, NULL),
                     KVS_EINVAL);
    assert_int_equal(kvs_manager_create(NULL, &f->dev.base, &f->fab.base, &m, NULL),
                     KVS_EINVAL);
    assert_int_equal(kvs_manager_create(&c, NULL, &f->fab.base, &m, NULL), KVS_EINVAL);
    assert_int_equal(kvs_manager_create(&c, &f->dev.base, NULL, &m, NULL), KVS_EINVAL);
    assert_null(m);
    assert_null(kvs_manager_last_error(NULL));
    assert_null(kvs_manager_ring(NULL));
    assert_null(kvs_manager_layout(NULL));
    assert_int_equal(kvs_manager_staging_count(NULL), 0);
    assert_int_equal(kvs_manager_init_staging(NULL), KVS_EINVAL);
    assert_int_equal(kvs_manager_register_staging(NULL), KVS_EINVAL);
    assert_int_equal(kvs_manager_set_kv_buffers(NULL, &f->kv), KVS_EINVAL);
    assert_int_equal(kvs_manager_set_heads(NULL, 1, 1), KVS_EINVAL);
    assert_int_equal(kvs_manager_staging_buffer(NULL, 0, NULL, NULL, NULL), KVS_EINVAL);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(NULL, &d), KVS_EINVAL);
    m = make(f, &c);
    assert_int_equal(kvs_decode_create(m, NULL), KVS_EINVAL);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_steps_twice(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_init_staging(m), KVS_EALREADY);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_EALREADY);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_EALREADY);
    kvs_decode_t *d, *d2;
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_int_equal(kvs_decode_create(m, &d2), KVS_EALREADY);
    assert_int_equal(f->dev.live_allocs, 1);
    assert_int_equal(f->fab.live_mrs, 1);
    kvs_decode_destroy(d);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_kv_buffer_validation(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    c.heads_per_rank = 4;
    kvs_manager_t *m = make(f, &c);
    kvs_kv_buffers_t bad[6];
    for (int i = 0; i < 6; i++)
        bad[i] = f->kv;
    bad[0].num_layers = LAYERS - 1;
    bad[1].page_size = 32;
    bad[2].local_heads = 0;
    bad[3].k_base = NULL;
    bad[4].local_heads = 2;
    bad[5].num_pages = 0;
    for (int i = 0; i < 6; i++)
        assert_int_equal(kvs_manager_set_kv_buffers(m, &bad[i]), KVS_EINVAL);
    assert_int_equal(kvs_manager_set_kv_buffers(m, NULL), KVS_EINVAL);
    /* the manager copies the arrays: later changes by the caller do not leak in */
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_staging_off(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    c.staging = false;
    c.peer_tp_size = 2;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_ESTATE);
    assert_int_equal(kvs_manager_staging_buffer(m, 0, NULL, NULL, NULL), KVS_ESTATE);
    kvs_decode_t *d;
    /* without staging the KV pages are written directly: they must be known */
    assert_int_equal(kvs_decode_create(m, &d), KVS_ESTATE);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "kvs_manager_set_kv_buffers"));
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_int_equal(kvs_manager_layout(m)->path, KVS_PATH_DIRECT);
    /* every K and V layer buffer is open to the peers */
    assert_int_equal(f->fab.live_mrs, 2 * LAYERS);
    kvs_decode_destroy(d);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_prefill_buffers(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = prefill_cfg();
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_staging_count(m), KVS_DEFAULT_TRANSFER_WORKERS);
    assert_int_equal(f->dev.live_allocs, KVS_DEFAULT_TRANSFER_WORKERS);
    /* F * ps * one token over all layers, K+V: 64 tokens * 1 head * 128 * 2 B * 8 * 2 */
    uint64_t addr, len, rkey = 99;
    assert_int_equal(kvs_manager_staging_buffer(m, 3, &addr, &len, &rkey), KVS_OK);
    assert_int_equal(len, 64u * 1 * 128 * 2 * LAYERS * 2);
    assert_int_equal(rkey, 0);
    assert_int_equal(kvs_manager_staging_buffer(m, 4, &addr, &len, &rkey), KVS_ERANGE);
    assert_null(kvs_manager_ring(m));
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(f->fab.live_mrs, KVS_DEFAULT_TRANSFER_WORKERS);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_ESTATE);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

/* An MLA pool: one latent buffer per layer (v_base NULL), one "head", a
 * staging buffer of one plane, and the plan of one writer per decode rank:
 * prefill 3 of TP 8 takes part in decode 0's rooms without writing. */
static void test_manager_mla_one_buffer_per_layer(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = prefill_cfg();
    c.kv_kind = KVS_KV_MLA;
    c.total_heads = 0;
    c.head_dim = 576;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    uint64_t addr, len, rkey;
    assert_int_equal(kvs_manager_staging_buffer(m, 0, &addr, &len, &rkey), KVS_OK);
    assert_int_equal(len, 64u * 1 * 576 * 2 * LAYERS * 1); /* one plane, not K and V */
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    kvs_kv_buffers_t kv = f->kv;
    kv.local_heads = 1;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EMLA);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "pass v_base NULL"));
    assert_int_equal(kvs_manager_set_heads(m, 8, 0), KVS_EMLA);
    kv.v_base = NULL;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
    kvs_prefill_t *p = NULL;
    assert_int_equal(kvs_prefill_create(m, &p), KVS_OK);
    const kvs_layout_t *l = kvs_manager_layout(m);
    assert_int_equal(l->kind, KVS_KV_MLA);
    assert_int_equal(l->planes, 1);
    assert_int_equal(l->tp_writers, 1);
    assert_int_equal(l->tp_sources, 4);
    int64_t idx;
    assert_int_equal(kvs_layout_writer_index(l, 3, 0, &idx), KVS_ENOENT);
    assert_int_equal(kvs_layout_source_index(l, 3, 0, &idx), KVS_OK);
    assert_int_equal(idx, 3);
    kvs_prefill_destroy(p);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    /* The deprecated flag is the kind; a device whose copies predate one
     * plane per layer (device ops version 3) cannot stage it. */
    c = decode_cfg();
    c.is_mla = true;
    c.total_heads = 1;
    c.head_dim = 576;
    f->dev.base.ops.version = 3;
    kvs_error_t e;
    assert_int_equal(kvs_manager_create(&c, &f->dev.base, &f->fab.base, &m, &e), KVS_ENOTSUP);
    assert_non_null(strstr(e.msg, "device ops version 3"));
    f->dev.base.ops.version = KVS_DEVICE_OPS_VERSION;
    m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
    kvs_decode_t *d = NULL;
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_int_equal(kvs_manager_layout(m)->kind, KVS_KV_MLA);
    assert_int_equal(kvs_manager_layout(m)->expected_arrivals, 1); /* 1 writer of 4 */
    kvs_decode_destroy(d);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

/* FP8 KV with scale planes: the config is checked (fp8, a block dividing
 * head_dim, a device that copies scales when staging), the staging buffer
 * holds each head's scales after its rows, and the scale buffers must be
 * published with the KV, and only then. */
static void test_manager_fp8_scale_planes(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = prefill_cfg();
    c.kv_scales = KVS_KV_SCALES_PER_TOKEN;
    kvs_manager_t *m = NULL;
    kvs_error_t e;
    assert_int_equal(kvs_manager_create(&c, &f->dev.base, &f->fab.base, &m, &e), KVS_EDTYPE);
    assert_non_null(strstr(e.msg, "kv_scales per-token needs dtype fp8 (got bf16)"));
    c.dtype = KVS_DTYPE_FP8;
    c.kv_scales = KVS_KV_SCALES_PER_BLOCK;
    c.scale_block = 48;
    assert_int_equal(kvs_manager_create(&c, &f->dev.base, &f->fab.base, &m, &e), KVS_EINVAL);
    assert_non_null(strstr(e.msg, "scale_block 48 must divide head_dim 128"));
    c.scale_block = 0; /* 32: 4 bytes a head of 128 */
    f->dev.base.ops.version = 4;
    assert_int_equal(kvs_manager_create(&c, &f->dev.base, &f->fab.base, &m, &e), KVS_ENOTSUP);
    assert_non_null(strstr(e.msg, "device ops version 4"));
    f->dev.base.ops.version = KVS_DEVICE_OPS_VERSION;
    m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    uint64_t addr, len, rkey;
    assert_int_equal(kvs_manager_staging_buffer(m, 0, &addr, &len, &rkey), KVS_OK);
    assert_int_equal(len, 64u * 1 * (128 + 4) * LAYERS * 2); /* rows and their scales */
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    kvs_kv_buffers_t kv = f->kv;
    kv.local_heads = 1;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "pass ks_base and vs_base"));
    uint64_t ks[LAYERS], vs[LAYERS];
    for (int i = 0; i < LAYERS; i++) {
        ks[i] = 0x10000000u + 0x1000u * (uint64_t)i;
        vs[i] = 0x20000000u + 0x1000u * (uint64_t)i;
    }
    kv.ks_base = ks;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EINVAL);
    kv.vs_base = vs;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
    ks[0] = 0; /* copied: the caller's arrays may change */
    kvs_prefill_t *p = NULL;
    assert_int_equal(kvs_prefill_create(m, &p), KVS_OK);
    const kvs_layout_t *l = kvs_manager_layout(m);
    assert_int_equal(l->kv_scales, KVS_KV_SCALES_PER_BLOCK);
    assert_int_equal(l->scale_block, 32);
    assert_int_equal(l->scale_bytes, 4);
    kvs_prefill_destroy(p);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    /* Scale buffers without kv_scales are refused, not ignored. */
    c = prefill_cfg();
    m = make(f, &c);
    kv = f->kv;
    kv.local_heads = 1;
    kv.ks_base = ks;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "kv_scales is none"));
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    /* Without staging an older device is fine: the direct and slice paths
     * write the scale buffers over the fabric. */
    c = prefill_cfg();
    c.staging = false;
    c.dtype = KVS_DTYPE_FP8;
    c.kv_scales = KVS_KV_SCALES_PER_TOKEN;
    f->dev.base.ops.version = 4;
    m = make(f, &c);
    f->dev.base.ops.version = KVS_DEVICE_OPS_VERSION;
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_prefill_needs_heads_to_size_buffers(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = prefill_cfg();
    c.total_heads = 0;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_EHEADS);
    assert_int_equal(f->dev.live_allocs, 0);
    assert_int_equal(kvs_manager_set_heads(m, 0, 1), KVS_OK);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

static void test_manager_alloc_failure_at_each_call(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = prefill_cfg();
    for (int n = 1;; n++) {
        f->dev.alloc_calls = 0;
        f->dev.alloc_fail_at = n;
        kvs_manager_t *m = make(f, &c);
        int rc = kvs_manager_init_staging(m);
        const bool injected = f->dev.alloc_calls >= n;
        if (!injected) {
            assert_int_equal(rc, KVS_OK);
            assert_int_equal(kvs_manager_destroy(m), KVS_OK);
            assert_int_equal(n, KVS_DEFAULT_TRANSFER_WORKERS + 1);
            break;
        }
        assert_int_equal(rc, KVS_EBACKEND);
        assert_int_equal(f->dev.live_allocs, 0);
        assert_int_equal(kvs_manager_staging_count(m), 0);
        const kvs_error_t *e = kvs_manager_last_error(m);
        assert_int_equal(e->backend_code, 2);
        assert_non_null(strstr(e->msg, "out of device memory"));
        f->dev.alloc_fail_at = 0;
        assert_int_equal(kvs_manager_init_staging(m), KVS_OK); /* retry works */
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    }
}

static void test_manager_register_failure_at_each_call(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = prefill_cfg();
    for (int n = 1;; n++) {
        f->fab.register_calls = 0;
        f->fab.register_fail_at = n;
        kvs_manager_t *m = make(f, &c);
        assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
        int rc = kvs_manager_register_staging(m);
        if (f->fab.register_calls < n) {
            assert_int_equal(rc, KVS_OK);
            assert_int_equal(kvs_manager_destroy(m), KVS_OK);
            assert_int_equal(n, KVS_DEFAULT_TRANSFER_WORKERS + 1);
            break;
        }
        assert_int_equal(rc, KVS_EBACKEND);
        assert_int_equal(f->fab.live_mrs, 0);
        assert_int_equal(kvs_manager_last_error(m)->backend_code, 12);
        f->fab.register_fail_at = 0;
        assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    }
    f->fab.register_fail_at = 0;
}

/* Every order of the four decode steps: each returns what a tiny reference
 * model of spec §8 predicts, and teardown finds nothing leaked. */
static void test_manager_decode_step_orders(void **state)
{
    fixture_t *f = *state;
    enum { INIT, REG, KV, CREATE, NSTEPS };
    int perm[NSTEPS] = {0, 1, 2, 3};
    int orders = 0;
    for (;;) {
        kvs_manager_config_t c = decode_cfg();
        kvs_manager_t *m = make(f, &c);
        kvs_decode_t *d = NULL;
        bool done[NSTEPS] = {false};
        for (int i = 0; i < NSTEPS; i++) {
            int rc, want;
            switch (perm[i]) {
            case INIT:
                rc = kvs_manager_init_staging(m);
                want = KVS_OK;
                break;
            case REG:
                rc = kvs_manager_register_staging(m);
                want = done[INIT] ? KVS_OK : KVS_ESTATE;
                break;
            case KV:
                rc = kvs_manager_set_kv_buffers(m, &f->kv);
                want = KVS_OK;
                break;
            default:
                rc = kvs_decode_create(m, &d);
                want = !done[INIT]  ? KVS_ENO_ALLOCATOR
                       : !done[REG] ? KVS_ESTATE
                       : !done[KV]  ? KVS_ENO_KV_BUFFERS
                                    : KVS_OK;
                break;
            }
            if (rc != want)
                fail_msg("order %d step %d: got %s want %s", orders, perm[i],
                         kvs_status_name(rc), kvs_status_name(want));
            done[perm[i]] = rc == KVS_OK;
        }
        kvs_decode_destroy(d);
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
        assert_int_equal(f->dev.live_allocs, 0);
        assert_int_equal(f->fab.live_mrs, 0);
        orders++;
        /* next permutation (lexicographic) */
        int i = NSTEPS - 2;
        while (i >= 0 && perm[i] > perm[i + 1])
            i--;
        if (i < 0)
            break;
        int j = NSTEPS - 1;
        while (perm[j] < perm[i])
            j--;
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        for (int a = i + 1, b = NSTEPS - 1; a < b; a++, b--) {
            t = perm[a];
            perm[a] = perm[b];
            perm[b] = t;
        }
    }
    assert_int_equal(orders, 24);
}

/* Decode with staging and the TP of both sides given as one: peer_tp_size 0
 * means "same as mine", so the plan is P == D on the direct path. */
static void test_manager_peer_tp_defaults_to_own(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    c.peer_tp_size = 0;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_path(m), KVS_PATH_AUTO); /* no handler yet */
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_int_equal(kvs_manager_layout(m)->prefill_tp, 2);
    assert_int_equal(kvs_manager_layout(m)->decode_tp, 2);
    assert_int_equal(kvs_manager_path(m), KVS_PATH_DIRECT);
    kvs_decode_destroy(d);
    assert_int_equal(kvs_manager_path(NULL), KVS_PATH_AUTO);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

/* Prefill staging buffers: chunk_tokens 0 sizes them for the 8192-token
 * default; a size that overflows 64 bits is refused before any allocation. */
static void test_manager_prefill_buffer_size_default_and_overflow(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = prefill_cfg();
    c.chunk_tokens = 0;
    c.transfer_workers = 1;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    uint64_t len = 0;
    assert_int_equal(kvs_manager_staging_buffer(m, 0, NULL, &len, NULL), KVS_OK);
    /* 8192 tokens * 1 head * 128 * 2 B * 8 layers * 2 */
    assert_int_equal(len, 8192u * 1 * 128 * 2 * LAYERS * 2);
    uint64_t addr = 0, rkey = 99;
    assert_int_equal(kvs_manager_staging_buffer(m, 0, &addr, NULL, &rkey), KVS_OK);
    assert_int_not_equal(addr, 0);
    assert_int_equal(rkey, 0); /* not registered yet */
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    c = prefill_cfg();
    c.head_dim = INT64_MAX / 2; /* * 64 tokens overflows */
    f->dev.alloc_calls = 0;
    m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_ERANGE);
    assert_int_equal(f->dev.alloc_calls, 0);
    assert_int_equal(kvs_manager_staging_count(m), 0);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "lower chunk_tokens"));
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

/* A backend that fails without recording a detail: the manager's message
 * falls back to the text of the backend's status. */
static void test_manager_backend_failure_without_detail(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    f->dev.alloc_fail_at = 1;
    f->dev.fail_status = KVS_ENOMEM;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_EBACKEND);
    const kvs_error_t *e = kvs_manager_last_error(m);
    assert_int_equal(e->backend_code, 0);
    assert_non_null(strstr(e->msg, "device 'fake-device' could not allocate staging buffer 0"));
    assert_non_null(strstr(e->msg, kvs_strerror(KVS_ENOMEM)));
    f->dev.alloc_calls = 0;
    f->dev.fail_status = KVS_ENOTSUP; /* passed through: the caller can pick another path */
    assert_int_equal(kvs_manager_init_staging(m), KVS_ENOTSUP);
    assert_non_null(strstr(e->msg, kvs_strerror(KVS_ENOTSUP)));
    f->dev.alloc_fail_at = 0;
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);

    f->fab.register_fail_at = 1;
    f->fab.fail_status = KVS_ENOTSUP; /* passed through: the caller can pick another path */
    assert_int_equal(kvs_manager_register_staging(m), KVS_ENOTSUP);
    assert_non_null(strstr(e->msg, "fabric 'fake-fabric' could not register staging buffer 0"));
    assert_non_null(strstr(e->msg, kvs_strerror(KVS_ENOTSUP)));
    f->fab.register_fail_at = 0;
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    f->dev.fail_status = 0;
    f->fab.fail_status = 0;
}

/* The direct and slice paths open every K and V layer buffer to the fabric;
 * a registration failure at any of them leaves none open, the error names
 * the layer, and a retry succeeds. */
static void test_manager_kv_register_failure_at_each_call(void **state)
{
    fixture_t *f = *state;
    /* Failures with a detail first: a failure without one must not show
     * the detail of an earlier call. */
    for (int silent = 0; silent < 2; silent++) {
        for (int n = 1;; n++) {
            kvs_manager_config_t c = decode_cfg();
            c.staging = false;
            c.peer_tp_size = 2;
            kvs_manager_t *m = make(f, &c);
            assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
            f->fab.register_calls = 0;
            f->fab.register_fail_at = n;
            f->fab.fail_status = silent ? KVS_EREMOTE : 0;
            if (silent && n == 2)
                f->fab.fail_status = KVS_ENOTSUP; /* passed through, not EBACKEND */
            kvs_decode_t *d = NULL;
            int rc = kvs_decode_create(m, &d);
            f->fab.register_fail_at = 0;
            if (f->fab.register_calls < n) {
                assert_int_equal(rc, KVS_OK);
                assert_int_equal(n, 2 * LAYERS + 1);
                kvs_decode_destroy(d);
                assert_int_equal(kvs_manager_destroy(m), KVS_OK);
                break;
            }
            const int want_rc = f->fab.fail_status == KVS_ENOTSUP ? KVS_ENOTSUP : KVS_EBACKEND;
            assert_int_equal(rc, want_rc);
            assert_null(d);
            assert_int_equal(f->fab.live_mrs, 0);
            const kvs_error_t *e = kvs_manager_last_error(m);
            char want[64];
            snprintf(want, sizeof want, "could not register KV layer %d (", (n - 1) / 2);
            if (strstr(e->msg, want) == NULL)
                fail_msg("call %d: \"%s\" does not name the layer", n, e->msg);
            assert_non_null(strstr(e->msg, !silent    ? "fake: cannot pin memory"
                                           : n == 2 ? kvs_strerror(KVS_ENOTSUP)
                                                    : kvs_strerror(KVS_EREMOTE)));
            assert_int_equal(kvs_decode_create(m, &d), KVS_OK); /* retry works */
            assert_int_equal(f->fab.live_mrs, 2 * LAYERS);
            kvs_decode_destroy(d);
            assert_int_equal(kvs_manager_destroy(m), KVS_OK);
        }
    }
    f->fab.fail_status = 0;
}

typedef struct path_case {
    const char *what;
    bool staging;
    int64_t peer_tp;
    kvs_path_t path;
    int status;
    kvs_path_t want; /* on success */
    const char *names;
} path_case_t;

/* Which path a handler runs, and each path a layout cannot run refused with
 * a message naming it. */
static void test_manager_path_choice(void **state)
{
    fixture_t *f = *state;
    const path_case_t p[] = {
        {"auto, equal TP", true, 2, KVS_PATH_AUTO, KVS_OK, KVS_PATH_DIRECT, NULL},
        {"auto, TPs differ, staging", true, 8, KVS_PATH_AUTO, KVS_OK, KVS_PATH_STAGING, NULL},
        {"auto, TPs differ, no staging", false, 8, KVS_PATH_AUTO, KVS_OK, KVS_PATH_SLICE,
         NULL},
        {"slice asked", true, 8, KVS_PATH_SLICE, KVS_OK, KVS_PATH_SLICE, NULL},
        {"staging without staging", false, 8, KVS_PATH_STAGING, KVS_EINVAL, 0,
         "path staging needs staging on"},
        {"direct with TPs differing", true, 8, KVS_PATH_DIRECT, KVS_EINVAL, 0,
         "direct path needs equal TP (prefill 8, decode 2)"},
        {"unknown path", true, 8, (kvs_path_t)7, KVS_EINVAL, 0, "path 7 unknown"},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        kvs_manager_config_t c = decode_cfg();
        c.staging = p[i].staging;
        c.peer_tp_size = p[i].peer_tp;
        c.path = p[i].path;
        kvs_manager_t *m = make(f, &c);
        if (c.staging) {
            assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
            assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
        }
        assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
        kvs_decode_t *d = NULL;
        int rc = kvs_decode_create(m, &d);
        if (rc != p[i].status)
            fail_msg("%s: got %s (%s)", p[i].what, kvs_status_name(rc),
                     kvs_manager_last_error(m)->msg);
        if (rc == KVS_OK) {
            assert_int_equal(kvs_manager_path(m), p[i].want);
        } else {
            assert_null(d);
            assert_int_equal(kvs_manager_path(m), KVS_PATH_AUTO);
            if (strstr(kvs_manager_last_error(m)->msg, p[i].names) == NULL)
                fail_msg("%s: \"%s\"", p[i].what, kvs_manager_last_error(m)->msg);
        }
        kvs_decode_destroy(d);
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    }
}

/* Hybrid layers (docs/kinds/hybrid.md): path auto stages them even at
 * equal TP, direct and slice refuse them by name, and state layers need
 * state buffers (and a state slot per room) that other patterns refuse. */
static void test_manager_hybrid_layers(void **state)
{
    fixture_t *f = *state;
    static const struct {
        kvs_path_t path;
        int status;
        kvs_path_t want;
    } paths[] = {{KVS_PATH_AUTO, KVS_OK, KVS_PATH_STAGING},
                 {KVS_PATH_STAGING, KVS_OK, KVS_PATH_STAGING},
                 {KVS_PATH_DIRECT, KVS_ENOTSUP, 0},
                 {KVS_PATH_SLICE, KVS_ENOTSUP, 0}};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        kvs_manager_config_t c = decode_cfg();
        c.peer_tp_size = 2; /* equal TP: auto would take direct */
        c.full_attn_every = 2;
        c.other_layers = KVS_LAYER_WINDOW;
        c.window_tokens = 128;
        c.path = paths[i].path;
        kvs_manager_t *m = make(f, &c);
        assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
        assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
        assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
        kvs_decode_t *d = NULL;
        const int rc = kvs_decode_create(m, &d);
        if (rc != paths[i].status)
            fail_msg("path %d: got %s (%s)", (int)paths[i].path, kvs_status_name(rc),
                     kvs_manager_last_error(m)->msg);
        if (rc == KVS_OK)
            assert_int_equal(kvs_manager_path(m), paths[i].want);
        else
            assert_non_null(strstr(kvs_manager_last_error(m)->msg, "use the staging path"));
        /* a window pattern has no state: no slot to give */
        if (d != NULL) {
            assert_int_equal(kvs_decode_room_set_state_slot(d, 1, 0), KVS_EINVAL);
            assert_non_null(strstr(kvs_manager_last_error(m)->msg, "without state layers"));
        }
        kvs_decode_destroy(d);
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    }

    /* State layers: their buffers, and only with them. */
    kvs_manager_config_t c = decode_cfg();
    c.full_attn_every = 4;
    c.other_layers = KVS_LAYER_STATE;
    c.state_heads = 8;
    c.state_conv_bytes = 64;
    c.state_ssm_bytes = 192;
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "pass state_base"));
    uint64_t st[LAYERS] = {0};
    for (int i = 0; i < LAYERS; i++)
        st[i] = (i + 1) % 4 != 0 ? 0x40000000u + 0x100000u * (uint64_t)i : 0;
    kvs_kv_buffers_t kv = f->kv;
    kv.state_base = st;
    kv.state_slots = 4;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
    kvs_decode_t *d = NULL;
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_int_equal(kvs_decode_room_set_state_slot(d, 7, 0), KVS_ENOENT);
    assert_int_equal(kvs_decode_room_set_state_slot(NULL, 7, 0), KVS_EINVAL);
    kvs_decode_destroy(d);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    c = decode_cfg(); /* every layer full: state buffers are refused, not ignored */
    m = make(f, &c);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "no state layers"));
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

/* A draft with PP (docs/kinds/draft.md): the last stage alone holds it.
 * A prefill stage before the last needs no draft buffers (given, both are
 * needed) and its staging buffers hold no draft part; the last stage
 * needs them, naming them, and its buffers grow by a draft part. */
static void test_manager_draft_on_the_last_stage(void **state)
{
    fixture_t *f = *state;
    uint64_t dk[1] = {0x40000000u}, dv[1] = {0x50000000u};
    f->fab.base.ops.caps |= KVS_FABRIC_CAP_PER_LAYER_WRITES; /* prefill PP 2 */
    uint64_t plain = 0;
    for (int64_t draft = 0; draft <= 1; draft++)
        for (int64_t stage = 0; stage < 2; stage++) {
            kvs_manager_config_t c = prefill_cfg();
            c.pp_size = 2;
            c.pp_rank = stage;
            c.draft_layers = draft;
            kvs_manager_t *m = make(f, &c);
            kvs_kv_buffers_t kv = f->kv;
            if (draft && stage == 1) {
                assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EINVAL);
                assert_non_null(strstr(kvs_manager_last_error(m)->msg,
                                       "pass draft_k_base and draft_v_base"));
                kv.draft_k_base = dk;
                kv.draft_v_base = dv;
            } else if (draft) {
                kv.draft_k_base = dk; /* one of the two: both, or neither */
                assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EINVAL);
                assert_non_null(strstr(kvs_manager_last_error(m)->msg,
                                       "or neither: pp_rank is not the last stage"));
                kv.draft_k_base = NULL;
            }
            assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
            assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
            uint64_t bytes = 0;
            assert_int_equal(kvs_manager_staging_buffer(m, 0, NULL, &bytes, NULL), KVS_OK);
            if (!draft && stage == 0)
                plain = bytes;
            /* a chunk of 64 tokens, 1 head, 128 x 2 bytes, K and V: the part */
            assert_int_equal(bytes, plain + (draft && stage == 1 ? 64 * 1 * 128 * 2 * 2 : 0));
            assert_int_equal(kvs_manager_destroy(m), KVS_OK);
        }
}

/* A draft model's KV (docs/kinds/draft.md): path auto stages it even at
 * equal TP, direct and slice refuse it by name, it needs the draft's
 * buffers (K and V; MLA: the latent alone) that a manager without a draft
 * refuses, and a draft layer count out of range is refused at create. */
static void test_manager_draft_layers(void **state)
{
    fixture_t *f = *state;
    uint64_t dk[2] = {0x40000000u, 0x40100000u}, dv[2] = {0x50000000u, 0x50100000u};
    static const struct {
        kvs_path_t path;
        int status;
        kvs_path_t want;
    } paths[] = {{KVS_PATH_AUTO, KVS_OK, KVS_PATH_STAGING},
                 {KVS_PATH_STAGING, KVS_OK, KVS_PATH_STAGING},
                 {KVS_PATH_DIRECT, KVS_ENOTSUP, 0},
                 {KVS_PATH_SLICE, KVS_ENOTSUP, 0}};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        kvs_manager_config_t c = decode_cfg();
        c.peer_tp_size = 2; /* equal TP: auto would take direct */
        c.draft_layers = 2;
        c.draft_head_dim = 64;
        c.path = paths[i].path;
        kvs_manager_t *m = make(f, &c);
        assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
        assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
        assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_EINVAL);
        assert_non_null(strstr(kvs_manager_last_error(m)->msg,
                               "pass draft_k_base and draft_v_base"));
        kvs_kv_buffers_t kv = f->kv;
        kv.draft_k_base = dk;
        kv.draft_v_base = dv;
        assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
        kvs_decode_t *d = NULL;
        const int rc = kvs_decode_create(m, &d);
        if (rc != paths[i].status)
            fail_msg("path %d: got %s (%s)", (int)paths[i].path, kvs_status_name(rc),
                     kvs_manager_last_error(m)->msg);
        if (rc == KVS_OK)
            assert_int_equal(kvs_manager_path(m), paths[i].want);
        else
            assert_non_null(strstr(kvs_manager_last_error(m)->msg,
                                   "does not move a draft model's KV (draft_layers 2): use "
                                   "the staging path"));
        kvs_decode_destroy(d);
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
    }

    /* MLA: one latent per draft layer, draft_v_base refused. */
    kvs_manager_config_t c = decode_cfg();
    c.kv_kind = KVS_KV_MLA;
    c.total_heads = 1;
    c.head_dim = 576;
    c.draft_layers = 1;
    kvs_manager_t *m = make(f, &c);
    kvs_kv_buffers_t kv = f->kv;
    kv.v_base = NULL;
    kv.local_heads = 1;
    kv.draft_k_base = dk;
    kv.draft_v_base = dv;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EMLA);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "pass draft_v_base NULL"));
    kv.draft_v_base = NULL;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    c = decode_cfg(); /* no draft: its buffers are refused, not ignored */
    m = make(f, &c);
    kv = f->kv;
    kv.draft_k_base = dk;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "draft_layers is 0"));
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    const int64_t bad[] = {-1, KVS_MAX_LAYERS + 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = decode_cfg();
        c.draft_layers = bad[i];
        kvs_error_t e;
        m = NULL;
        assert_int_equal(kvs_manager_create(&c, &f->dev.base, &f->fab.base, &m, &e),
                         KVS_EINVAL);
        assert_null(m);
        assert_non_null(strstr(e.msg, "draft_layers"));
    }
}

/* Head counts and KV buffers must agree whichever is given first. */
static void test_manager_heads_and_kv_buffers_agree(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    kvs_manager_t *m = make(f, &c);
    kvs_kv_buffers_t kv = f->kv;
    kv.v_base = NULL;
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "k_base/v_base"));
    assert_int_equal(kvs_manager_set_heads(m, 0, -1), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "head counts must be >= 0"));
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    assert_int_equal(kvs_manager_set_heads(m, 8, 4), KVS_OK); /* the buffers hold 4 */
    assert_int_equal(kvs_manager_set_heads(m, 8, 2), KVS_EINVAL);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg,
                           "heads_per_rank 2 differs from the 4 heads"));
    assert_int_equal(kvs_manager_set_heads(m, 8, 0), KVS_OK); /* unknown is fine */
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

/* A fabric that cannot poll (the default slot: KVS_ENOTSUP): progress
 * returns the fabric's failure and the detail names the fabric. */
static void test_manager_handlers_report_a_failing_poll(void **state)
{
    fixture_t *f = *state;
    kvs_manager_config_t c = decode_cfg();
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &f->kv), KVS_OK);
    kvs_decode_t *d;
    assert_int_equal(kvs_decode_create(m, &d), KVS_OK);
    assert_int_equal(kvs_decode_progress(d), KVS_ENOTSUP);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "polling fabric 'fake-fabric' failed"));
    kvs_decode_destroy(d);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    c = prefill_cfg();
    m = make(f, &c);
    kvs_kv_buffers_t kv = f->kv;
    kv.local_heads = 1; /* 8 heads over prefill TP 8 */
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_set_kv_buffers(m, &kv), KVS_OK);
    kvs_prefill_t *p;
    assert_int_equal(kvs_prefill_create(m, &p), KVS_OK);
    assert_int_equal(kvs_prefill_progress(p), KVS_ENOTSUP);
    assert_non_null(strstr(kvs_manager_last_error(m)->msg, "polling fabric 'fake-fabric' failed"));
    kvs_prefill_destroy(p);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

typedef struct logged {
    int infos;
} logged_t;

static void count_info(void *user, kvs_log_level_t level, const char *msg)
{
    if (level == KVS_LOG_INFO)
        ((logged_t *)user)->infos++;
}

static void test_manager_logs_through_callback(void **state)
{
    fixture_t *f = *state;
    logged_t seen = {0};
    kvs_manager_config_t c = decode_cfg();
    c.log = (kvs_log_t){.fn = count_info, .user = &seen, .level = KVS_LOG_INFO};
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(seen.infos, 1); /* create says once that the cluster is open */
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(seen.infos, 2);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

typedef struct said {
    int cannot_seal;
} said_t;

static void watch_seal(void *user, kvs_log_level_t level, const char *msg)
{
    if (level == KVS_LOG_INFO && strstr(msg, "cannot seal a registration") != NULL)
        ((said_t *)user)->cannot_seal++;
}

/* Where the fabric grants region-scoped keys the staging memory is
 * registered sealed (mr_register_sealed), on both roles; where it grants
 * but cannot seal (KVS_ENOTSUP), the manager says so once and registers
 * as before; a fabric without grants is never asked to seal. */
static void test_manager_seals_staging_where_keys_are_granted(void **state)
{
    fixture_t *f = *state;
    said_t said = {0};
    kvs_manager_config_t c = decode_cfg();
    c.log = (kvs_log_t){.fn = watch_seal, .user = &said, .level = KVS_LOG_INFO};
    kvs_manager_t *m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(f->fab.sealed_calls, 0); /* no key_grant: not asked */
    assert_int_equal(f->fab.register_calls, 1);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);

    fake_fabric_grant_keys(&f->fab, true);
    const kvs_manager_config_t roles[] = {decode_cfg(), prefill_cfg()};
    for (int i = 0; i < 2; i++) {
        const int calls = f->fab.register_calls, sealed = f->fab.sealed_calls;
        m = make(f, &roles[i]);
        assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
        assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
        assert_true(f->fab.sealed_calls > sealed);
        assert_int_equal(f->fab.register_calls, calls); /* none unsealed */
        assert_int_equal(f->fab.live_mrs, f->fab.sealed_calls - sealed);
        assert_int_equal(kvs_manager_destroy(m), KVS_OK);
        assert_int_equal(f->fab.live_mrs, 0);
    }

    f->fab.seal_status = KVS_ENOTSUP;
    m = make(f, &c);
    assert_int_equal(kvs_manager_init_staging(m), KVS_OK);
    const int calls = f->fab.register_calls;
    assert_int_equal(kvs_manager_register_staging(m), KVS_OK);
    assert_int_equal(said.cannot_seal, 1);
    assert_int_equal(f->fab.register_calls, calls + 1);
    assert_int_equal(f->fab.live_mrs, 1);
    assert_int_equal(kvs_manager_destroy(m), KVS_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_manager_decode_init_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_seals_staging_where_keys_are_granted,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_decode_without_allocator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_decode_without_kv_buffers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_decode_without_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_heads_unresolvable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_heads_per_rank_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_kv_heads_disagree_with_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_config_guards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_model_layers_uneven_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_create_argument_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_steps_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_kv_buffer_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_staging_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_prefill_buffers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_mla_one_buffer_per_layer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_fp8_scale_planes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_prefill_needs_heads_to_size_buffers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_alloc_failure_at_each_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_register_failure_at_each_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_decode_step_orders, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_logs_through_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_peer_tp_defaults_to_own, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_prefill_buffer_size_default_and_overflow,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_backend_failure_without_detail, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_manager_kv_register_failure_at_each_call, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_manager_path_choice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_hybrid_layers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_draft_layers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_draft_on_the_last_stage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manager_heads_and_kv_buffers_agree, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_manager_handlers_report_a_failing_poll, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
