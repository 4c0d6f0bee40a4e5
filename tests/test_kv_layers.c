/*
 * test_kv_layers.c - an engine's flat KV buffer list turned into per-layer
 * descriptors (kvs_kv_layers_from_ptrs, src/kv_layers.c): the K buffers
 * then the V buffers, with their lengths and the bytes of one page, as
 * sglang's KVArgs carries them. Every refusal names the layer, K or V and
 * the field, and writes nothing to out.
 *
 * Then the descriptors checked against a manager (kvs__manager_set_kv_layers,
 * on the fake backend): a hybrid model's state layer needs none (a zeroed
 * descriptor, its K / V published as 0), a full or window layer without
 * its K or V is refused naming the layer, its kind and what to pass, and a
 * refused call publishes nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include <kvstage/kvstage.h>

#include "fake_backend.h"
#include "manager.h"

#define LAYERS 3
#define PAGE 16
#define HEADS 4
#define DIM 128
#define ITEM ((uint64_t)PAGE * HEADS * DIM * 2) /* bf16 */
#define PAGES 10

typedef struct args {
    uint64_t ptrs[2 * LAYERS], lens[2 * LAYERS], items[2 * LAYERS];
    kvs_kv_layer_t out[LAYERS];
} args_t;

static args_t good(void)
{
    args_t a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < 2 * LAYERS; i++) {
        a.ptrs[i] = 0x10000000u + (uint64_t)i * 0x1000000u;
        a.lens[i] = PAGES * ITEM;
        a.items[i] = ITEM;
    }
    memset(a.out, 0x5A, sizeof a.out);
    return a;
}

static int convert(args_t *a, int64_t n, kvs_error_t *err)
{
    return kvs_kv_layers_from_ptrs(a->ptrs, a->lens, a->items, n, PAGE, HEADS, DIM,
                                   KVS_DTYPE_BF16, a->out, LAYERS, err);
}

static void test_kv_layers_from_ptrs_converts(void **state)
{
    (void)state;
    args_t a = good();
    kvs_error_t err = {.status = KVS_EBUSY};
    assert_int_equal(convert(&a, 2 * LAYERS, &err), KVS_OK);
    assert_int_equal(err.status, KVS_OK);
    for (int l = 0; l < LAYERS; l++) {
        assert_int_equal(a.out[l].k_addr, a.ptrs[l]);
        assert_int_equal(a.out[l].v_addr, a.ptrs[LAYERS + l]);
        assert_int_equal(a.out[l].tokens, PAGES * PAGE);
        assert_int_equal(a.out[l].token_stride_bytes, HEADS * DIM * 2);
        assert_int_equal(a.out[l].head_stride_bytes, DIM * 2);
        assert_int_equal(a.out[l].elem_stride_bytes, 2);
    }
    /* Fewer layers than out holds. */
    a = good();
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 2, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, NULL),
                     KVS_OK);
    assert_int_equal(a.out[0].v_addr, a.ptrs[1]);
}

static void expect_refused(args_t *a, int64_t n, const char *says)
{
    kvs_kv_layer_t before[LAYERS];
    memcpy(before, a->out, sizeof before);
    kvs_error_t err = {0};
    assert_int_equal(convert(a, n, &err), KVS_EINVAL);
    assert_int_equal(err.status, KVS_EINVAL);
    if (strstr(err.msg, says) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", err.msg, says);
    assert_memory_equal(a->out, before, sizeof before);
}

static void test_kv_layers_from_ptrs_refusals(void **state)
{
    (void)state;
    args_t a = good();
    expect_refused(&a, 5, "n_ptrs 5 must be 2 x the layers");
    expect_refused(&a, 0, "n_ptrs 0");
    expect_refused(&a, 8, "out must hold n_ptrs / 2 = 4 layers (out_cap 3)");
    a = good();
    a.items[4] = ITEM / 2; /* V of layer 1 */
    expect_refused(&a, 6, "layer 1 V: item size 8192 bytes, but a page of 16 tokens x 4 heads "
                          "x head dim 128 x 2 bytes is 16384");
    a = good();
    a.ptrs[2] = 0;
    expect_refused(&a, 6, "layer 2 K: address 0x0 and length");
    a = good();
    a.lens[0] = ITEM * 3 + 1;
    expect_refused(&a, 6, "layer 0 K: address 0x10000000 and length 49153 must be non-zero "
                          "and the length a whole number of 16384-byte pages");
    a = good();
    a.lens[3] = 0;
    expect_refused(&a, 6, "layer 0 V");
    a = good();
    a.lens[5] = ITEM * 4;
    expect_refused(&a, 6, "layer 2: its K buffer has 163840 bytes and its V buffer 65536");
    /* The geometry itself. */
    a = good();
    kvs_error_t err = {0};
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, PAGE, 0, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "page_size, local_heads and head_dim must be > 0"));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, PAGE, HEADS, DIM,
                                             (kvs_dtype_t)42, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "dtype known (got 16, 4, 128, 42)"));
    assert_int_equal(kvs_kv_layers_from_ptrs(NULL, a.lens, a.items, 6, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "must not be NULL"));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, NULL, LAYERS, NULL),
                     KVS_EINVAL);
    /* Each argument on its own. */
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, NULL, a.items, 6, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "ptrs, lens, item_lens and out must not be NULL"));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, NULL, 6, PAGE, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "must not be NULL"));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, 0, HEADS, DIM,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "(got 0, 4, 128, "));
    assert_int_equal(kvs_kv_layers_from_ptrs(a.ptrs, a.lens, a.items, 6, PAGE, HEADS, -1,
                                             KVS_DTYPE_BF16, a.out, LAYERS, &err),
                     KVS_EINVAL);
    assert_non_null(strstr(err.msg, "(got 16, 4, -1, "));
}

/* ---- descriptors against a manager: a hybrid model's layers --------------- */

#define HL 4 /* layers of a hybrid pool */

typedef struct hybrid_fixture {
    fake_device_t dev;
    fake_fabric_t fab;
    kvs_manager_t *m;
    kvs_kv_layer_t layers[HL];
    uint64_t state[HL];
} hybrid_fixture_t;

/* A decode manager of stage pp_rank of pp_size over 4 * pp_size layers of
 * the pattern (every `every`-th layer full, the others `other`), staging
 * initialised and registered, and a full descriptor for each of its HL
 * layers (the state layers' too; a test zeroes those it leaves out). */
static void hybrid_make(hybrid_fixture_t *f, int64_t every, kvs_layer_kind_t other,
                        int64_t pp_rank, int64_t pp_size)
{
    memset(f, 0, sizeof *f);
    fake_device_setup(&f->dev);
    fake_fabric_setup(&f->fab, KVS_FABRIC_CAP_WRITE_IMM | KVS_FABRIC_CAP_PER_LAYER_WRITES);
    kvs_manager_config_t c = {
        .role = KVS_ROLE_DECODE, .staging = true, .total_heads = 8, .head_dim = DIM,
        .dtype = KVS_DTYPE_BF16, .layers = HL, .model_layers = HL * pp_size, .page_size = PAGE,
        .tp_size = 2, .pp_rank = pp_rank, .pp_size = pp_size, .peer_tp_size = 2,
        .peer_pp_size = pp_size, .ring_bytes = 1u << 20, .full_attn_every = every,
        .other_layers = other};
    if (other == KVS_LAYER_WINDOW)
        c.window_tokens = 128;
    if (other == KVS_LAYER_STATE) {
        c.state_heads = 8;
        c.state_conv_bytes = 64;
        c.state_ssm_bytes = 192;
    }
    kvs_error_t err = {0};
    int rc = kvs_manager_create(&c, &f->dev.base, &f->fab.base, &f->m, &err);
    if (rc != KVS_OK)
        fail_msg("create: %s: %s", kvs_status_name(rc), err.msg);
    assert_int_equal(kvs_manager_init_staging(f->m), KVS_OK);
    assert_int_equal(kvs_manager_register_staging(f->m), KVS_OK);
    for (int l = 0; l < HL; l++) {
        f->layers[l] = (kvs_kv_layer_t){.k_addr = 0x10000000u * (uint64_t)(2 * l + 1),
                                        .v_addr = 0x10000000u * (uint64_t)(2 * l + 2),
                                        .tokens = PAGES * PAGE,
                                        .token_stride_bytes = HEADS * DIM * 2,
                                        .head_stride_bytes = DIM * 2, .elem_stride_bytes = 2};
        f->state[l] = 0xA0000000u + 0x100000u * (uint64_t)l;
    }
}

/* kvs__manager_set_kv_layers with the state buffers when the pattern has
 * state layers. */
static int hybrid_publish(hybrid_fixture_t *f)
{
    const bool state = f->m->cfg.other_layers == KVS_LAYER_STATE;
    const kvs_kv_buffers_t more = {.state_base = state ? f->state : NULL,
                                   .state_slots = state ? 4 : 0};
    return kvs__manager_set_kv_layers(f->m, f->layers, HL, HEADS, &more);
}

static void hybrid_expect_refused(hybrid_fixture_t *f, const char *says)
{
    assert_int_equal(hybrid_publish(f), KVS_EINVAL);
    const char *msg = kvs_manager_last_error(f->m)->msg;
    if (strstr(msg, says) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", msg, says);
    assert_false(f->m->kv_published); /* nothing published */
    assert_null(f->m->k_base);
}

static void hybrid_destroy(hybrid_fixture_t *f)
{
    assert_int_equal(kvs_manager_destroy(f->m), KVS_OK);
    assert_int_equal(f->dev.live_allocs, 0);
    assert_int_equal(f->fab.live_mrs, 0);
}

/* Every 2nd layer full, the others state layers: layers 0 and 2 have no K
 * or V. Zeroed descriptors there are accepted, and so are stale ones (an
 * engine's, or kvstage.Rank's before it passed none): neither is checked,
 * and both publish K / V 0 at the state layers, so that nothing can read
 * them; the handler is made on what was published. */
static void test_kv_layers_state_layer_without_kv(void **state)
{
    (void)state;
    for (int stale = 0; stale < 2; stale++) {
        hybrid_fixture_t f;
        hybrid_make(&f, 2, KVS_LAYER_STATE, 0, 1);
        for (int l = 0; l < HL; l += 2)
            f.layers[l] = stale ? (kvs_kv_layer_t){.k_addr = 0x1234, .tokens = 7}
                                : (kvs_kv_layer_t){0};
        assert_int_equal(hybrid_publish(&f), KVS_OK);
        assert_true(f.m->kv_published);
        for (int l = 0; l < HL; l++) {
            const bool full = l % 2 == 1;
            assert_int_equal(f.m->k_base[l], full ? f.layers[l].k_addr : 0);
            assert_int_equal(f.m->v_base[l], full ? f.layers[l].v_addr : 0);
            assert_int_equal(f.m->state_base[l], f.state[l]);
        }
        assert_int_equal(f.m->kv.num_pages, PAGES);
        kvs_decode_t *d = NULL;
        assert_int_equal(kvs_decode_create(f.m, &d), KVS_OK);
        kvs_decode_destroy(d);
        hybrid_destroy(&f);
    }
    /* A later stage's layers are its share of the model's: stage 1 of PP 2
     * holds model layers 4..7, its layer 0 model layer 4 (a state layer),
     * its layer 1 model layer 5 (full). */
    hybrid_fixture_t f;
    hybrid_make(&f, 2, KVS_LAYER_STATE, 1, 2);
    f.layers[0] = f.layers[2] = (kvs_kv_layer_t){0};
    assert_int_equal(hybrid_publish(&f), KVS_OK);
    assert_int_equal(f.m->k_base[0], 0);
    assert_int_equal(f.m->k_base[1], f.layers[1].k_addr);
    hybrid_destroy(&f);
    /* A stage of state layers alone (every 8th layer full: model layers
     * 0..3 are state layers) takes the pool's token slots from layer 0's
     * tokens, and no address; without them it says so. */
    hybrid_make(&f, 8, KVS_LAYER_STATE, 0, 2);
    for (int l = 0; l < HL; l++)
        f.layers[l] = (kvs_kv_layer_t){.tokens = l == 0 ? PAGES * PAGE : 0};
    assert_int_equal(hybrid_publish(&f), KVS_OK);
    assert_int_equal(f.m->kv.num_pages, PAGES);
    hybrid_destroy(&f);
    hybrid_make(&f, 8, KVS_LAYER_STATE, 0, 2);
    memset(f.layers, 0, sizeof f.layers);
    hybrid_expect_refused(&f, "layer 0's 0 token slots a whole number of 16-token pages (the "
                              "stage's layers are all state layers: layer 0's tokens give "
                              "the pool's token slots, its addresses are not needed)");
    hybrid_destroy(&f);
}

/* A full or window layer keeps K and V: left out (zeroed), or without one
 * of them, it is refused naming the layer, its kind and model layer, and
 * the field to pass; nothing is published, and the call succeeds once it
 * is given. */
static void test_kv_layers_attention_layer_needs_kv(void **state)
{
    (void)state;
    hybrid_fixture_t f;
    hybrid_make(&f, 2, KVS_LAYER_STATE, 0, 1);
    f.layers[0] = (kvs_kv_layer_t){0};
    f.layers[3] = (kvs_kv_layer_t){0}; /* a full layer */
    hybrid_expect_refused(&f, "layer 3: its K address is 0: a full layer (model layer 3) "
                              "keeps K and V: pass its K buffer as k_addr (only a state layer "
                              "goes without)");
    hybrid_destroy(&f);
    hybrid_make(&f, 2, KVS_LAYER_STATE, 0, 1);
    f.layers[1].v_addr = 0;
    hybrid_expect_refused(&f, "layer 1: its V address is 0: a full layer (model layer 1) "
                              "keeps K and V: pass its V buffer as v_addr");
    hybrid_destroy(&f);
    /* Stage 1 of PP 2: its layer 1 is model layer 5, full. */
    hybrid_make(&f, 2, KVS_LAYER_STATE, 1, 2);
    f.layers[0] = f.layers[1] = (kvs_kv_layer_t){0};
    hybrid_expect_refused(&f, "layer 1: its K address is 0: a full layer (model layer 5)");
    hybrid_destroy(&f);
    /* Window layers keep K and V too: layer 0 of every 2nd layer full. */
    hybrid_make(&f, 2, KVS_LAYER_WINDOW, 0, 1);
    f.layers[0].k_addr = 0;
    hybrid_expect_refused(&f, "layer 0: its K address is 0: a window layer (model layer 0) "
                              "keeps K and V: pass its K buffer as k_addr");
    f.layers[0].k_addr = 0x77000000u;
    f.layers[2] = (kvs_kv_layer_t){0};
    hybrid_expect_refused(&f, "layer 2: its K address is 0: a window layer (model layer 2)");
    f.layers[2] = f.layers[0];
    f.layers[2].k_addr = 0x78000000u;
    f.layers[2].v_addr = 0x79000000u;
    assert_int_equal(hybrid_publish(&f), KVS_OK);
    assert_int_equal(f.m->k_base[2], 0x78000000u);
    hybrid_destroy(&f);
    /* Without a pattern every layer is full, layer 0 as any other. */
    hybrid_make(&f, 0, KVS_LAYER_FULL, 0, 1);
    f.layers[0] = (kvs_kv_layer_t){0};
    f.layers[1].tokens = PAGES * PAGE;
    hybrid_expect_refused(&f, "layer 0: its K address is 0: a full layer (model layer 0)");
    hybrid_destroy(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_layers_from_ptrs_converts),
        cmocka_unit_test(test_kv_layers_from_ptrs_refusals),
        cmocka_unit_test(test_kv_layers_state_layer_without_kv),
        cmocka_unit_test(test_kv_layers_attention_layer_needs_kv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
