/*
 * test_channel.c - unit tests of the control channel (src/channel.c): the
 * registration fingerprint taken from a layout, the check that compares two
 * fingerprints and names the first differing field with both values, and
 * kvs__channel_send over a tiny recording fabric (its bytes are the wire
 * encoding of the message, the wr_id marks a control send, stats count only
 * successful sends, and an unencodable message never reaches the fabric).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "channel.h"

/* ---- a recording fabric ------------------------------------------------ */

typedef struct rec_fabric {
    kvs_fabric_t base; /* first */
    int send_rc;       /* what send returns */
    int sends;
    kvs_conn_t *conn;
    uint64_t wr_id;
    uint32_t len_bytes;
    uint8_t bytes[KVS_CONTROL_MSG_MAX_BYTES];
} rec_fabric_t;

static int rec_reg(kvs_fabric_t *f, kvs_device_t *d, uint64_t a, uint64_t n, kvs_mr_t **o,
                   uint64_t *k)
{
    *o = NULL;
    *k = 0;
    return KVS_OK;
}

static int rec_dereg(kvs_fabric_t *f, kvs_mr_t *m) { return KVS_OK; }

static int rec_send(kvs_fabric_t *f, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                    uint64_t wr_id)
{
    rec_fabric_t *r = KVS_CONTAINER_OF(f, rec_fabric_t, base);
    r->sends++;
    r->conn = conn;
    r->wr_id = wr_id;
    assert_true(len_bytes <= sizeof r->bytes);
    memcpy(r->bytes, msg, len_bytes);
    r->len_bytes = len_bytes;
    return r->send_rc;
}

static const kvs_fabric_ops_t rec_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    .name = "test-rec",
    .mr_register = rec_reg,
    .mr_deregister = rec_dereg,
    .send = rec_send,
};

static void rec_init(rec_fabric_t *r)
{
    memset(r, 0, sizeof *r);
    assert_int_equal(kvs_fabric_init(&r->base, &rec_ops, "rec0"), KVS_OK);
}

/* An opaque connection handle; the channel only passes it through. */
static kvs_conn_t *fake_conn(void)
{
    static const char tag; /* its address only, never written */
    return (kvs_conn_t *)(uintptr_t)&tag;
}

/* ---- the fingerprint ----------------------------------------------------- */

static kvs_layout_t layout_sample(void)
{
    kvs_layout_params_t prm = {.total_heads = 8, .head_dim = 128, .dtype = KVS_DTYPE_FP32,
                               .layers = 80, .page_size = 16, .prefill_tp = 4,
                               .decode_tp = 2, .prefill_pp = 2, .decode_pp = 1,
                               .chunk_tokens = 4096};
    kvs_layout_t lay;
    assert_int_equal(kvs_layout_init(&lay, &prm, NULL), KVS_OK);
    return lay;
}

static void test_channel_fingerprint_fills_each_field(void **state)
{
    kvs_layout_t lay = layout_sample();
    kvs_fingerprint_t fp;
    memset(&fp, 0xA5, sizeof fp);
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &(kvs_manager_config_t){0}, &fp);
    assert_int_equal(fp.protocol_version, KVS_WIRE_VERSION);
    assert_int_equal(fp.staging, (uint32_t)KVS_PATH_STAGING);
    assert_int_equal(fp.total_heads, 8);
    assert_int_equal(fp.head_dim, 128);
    assert_int_equal(fp.layers, 80);
    assert_int_equal(fp.prefill_page_size, 16);
    assert_int_equal(fp.decode_page_size, 16); /* 0 in the params: the same */
    assert_int_equal(fp.chunk_tokens, 4096);
    assert_int_equal(fp.prefill_tp, 4);
    assert_int_equal(fp.decode_tp, 2);
    assert_int_equal(fp.prefill_pp, 2);
    assert_int_equal(fp.decode_pp, 1);
    assert_int_equal(fp.dtype, KVS_DTYPE_FP32); /* the format, not its size */
    assert_int_equal(fp.app_tag, 0);
    assert_int_equal(fp.prefill_cp, 1); /* 0 in the params: one CP rank */

    kvs__fingerprint(&lay, KVS_PATH_DIRECT, &(kvs_manager_config_t){0}, &fp);
    assert_int_equal(fp.staging, (uint32_t)KVS_PATH_DIRECT);
    kvs__fingerprint(&lay, KVS_PATH_SLICE, &(kvs_manager_config_t){0}, &fp);
    assert_int_equal(fp.staging, (uint32_t)KVS_PATH_SLICE);
}

static void test_channel_fingerprint_check_equal_is_ok(void **state)
{
    kvs_layout_t lay = layout_sample();
    kvs_fingerprint_t a, b;
    const kvs_manager_config_t none = {0};
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &none, &a);
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &none, &b);
    char why[256] = "untouched";
    assert_int_equal(kvs__fingerprint_check(&a, &b, why, sizeof why), KVS_OK);
    assert_string_equal(why, "untouched");
    /* the application tag and the aux limit are carried as given */
    kvs__fingerprint(&lay, KVS_PATH_STAGING,
                     &(kvs_manager_config_t){.app_tag = 0x5eed, .max_aux_bytes = 4097}, &b);
    assert_int_equal(b.app_tag, 0x5eed);
    assert_int_equal(b.max_aux_bytes, 4097);
    a.app_tag = 0x5eed;
    a.max_aux_bytes = 4097;
    assert_int_equal(kvs__fingerprint_check(&a, &b, why, sizeof why), KVS_OK);
}

/* Each field: a peer value that differs, the name `why` must carry, and the
 * values both sides report. */
static void test_channel_fingerprint_check_names_each_field(void **state)
{
    kvs_layout_t lay = layout_sample();
    kvs_fingerprint_t mine;
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &(kvs_manager_config_t){0}, &mine);
    const struct {
        const char *name;
        long long mine, theirs;
    } cases[] = {
        {"protocol version", KVS_WIRE_VERSION, KVS_WIRE_VERSION + 1},
        {"transfer path", 1, 2},
        {"total KV heads", 8, 16},
        {"head dim", 128, 64},
        {"model layers", 80, 40},
        {"prefill page size", 16, 32},
        {"chunk tokens", 4096, 8192},
        {"dtype", KVS_DTYPE_FP32, KVS_DTYPE_FP8},
        {"prefill TP size (--prefill-tp)", 4, 8},
        {"decode TP size (--decode-tp)", 2, 1},
        {"prefill PP size (--prefill-pp)", 2, 1},
        {"decode PP size (--decode-pp)", 1, 2},
        {"application tag (app_tag; serve: --seed/--requests/--prompt-tokens)", 0, 7},
        {"largest aux payload (max_aux_bytes)", 0, 64},
        {"decode page size", 16, 64},
        {"KV kind (0 gqa", KVS_KV_GQA, KVS_KV_MLA},
        {"prefill CP size (context_parallel, kvs_instance_desc_t.cp_size; --prefill-cp)", 1,
         2},
        {"reserved field (0 in this protocol version)", 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvs_fingerprint_t theirs = mine;
        switch (i) {
        case 0: theirs.protocol_version = (uint32_t)cases[i].theirs; break;
        case 1: theirs.staging = (uint32_t)cases[i].theirs; break;
        case 2: theirs.total_heads = cases[i].theirs; break;
        case 3: theirs.head_dim = cases[i].theirs; break;
        case 4: theirs.layers = cases[i].theirs; break;
        case 5: theirs.prefill_page_size = cases[i].theirs; break;
        case 6: theirs.chunk_tokens = cases[i].theirs; break;
        case 7: theirs.dtype = (uint32_t)cases[i].theirs; break;
        case 8: theirs.prefill_tp = cases[i].theirs; break;
        case 9: theirs.decode_tp = cases[i].theirs; break;
        case 10: theirs.prefill_pp = cases[i].theirs; break;
        case 11: theirs.decode_pp = cases[i].theirs; break;
        case 12: theirs.app_tag = (uint32_t)cases[i].theirs; break;
        case 13: theirs.max_aux_bytes = (uint32_t)cases[i].theirs; break;
        case 14: theirs.decode_page_size = cases[i].theirs; break;
        case 15: theirs.kv_kind = (uint32_t)cases[i].theirs; break;
        case 16: theirs.prefill_cp = cases[i].theirs; break;
        default: theirs.reserved = (uint32_t)cases[i].theirs; break;
        }
        char why[256] = "";
        assert_int_equal(kvs__fingerprint_check(&mine, &theirs, why, sizeof why),
                         KVS_EFINGERPRINT);
        char values[64];
        snprintf(values, sizeof values, "this side %lld, peer %lld", cases[i].mine,
                 cases[i].theirs);
        if (strstr(why, cases[i].name) == NULL || strstr(why, values) == NULL)
            fail_msg("field %s: why = \"%s\", wanted its name and \"%s\"", cases[i].name,
                     why, values);
    }
}

/* Case i: the fingerprints of layouts a and b (staging path) are refused
 * with a reason that holds `name`; a's against itself passes. */
static void refused_by_name(size_t i, const kvs_layout_t *la, const kvs_layout_t *lb,
                            const char *name)
{
    const kvs_manager_config_t none = {0};
    kvs_fingerprint_t a, b;
    kvs__fingerprint(la, KVS_PATH_STAGING, &none, &a);
    kvs__fingerprint(lb, KVS_PATH_STAGING, &none, &b);
    char why[256] = "";
    assert_int_equal(kvs__fingerprint_check(&a, &b, why, sizeof why), KVS_EFINGERPRINT);
    if (strstr(why, name) == NULL)
        fail_msg("case %zu: why = \"%s\", wanted \"%s\"", i, why, name);
    assert_int_equal(kvs__fingerprint_check(&a, &a, why, sizeof why), KVS_OK);
}

/* A hybrid model's layer pattern is in the fingerprint: a side that
 * moves every page of every layer and one that moves a window's (or a
 * state) are refused by name, as are two windows or two state sizes. */
static void test_channel_fingerprint_names_the_layer_pattern(void **state)
{
    (void)state;
    kvs_layout_params_t prm = {.total_heads = 8, .head_dim = 64, .layers = 36,
                               .page_size = 16, .prefill_tp = 4, .decode_tp = 2,
                               .chunk_tokens = 4096};
    const kvs_manager_config_t none = {0};
    kvs_layout_t full, win, win64, st, st2;
    assert_int_equal(kvs_layout_init(&full, &prm, NULL), KVS_OK);
    prm.full_attn_every = 2;
    prm.other_layers = KVS_LAYER_WINDOW;
    prm.window_tokens = 128;
    assert_int_equal(kvs_layout_init(&win, &prm, NULL), KVS_OK);
    prm.window_tokens = 64;
    assert_int_equal(kvs_layout_init(&win64, &prm, NULL), KVS_OK);
    prm.full_attn_every = 4;
    prm.other_layers = KVS_LAYER_STATE;
    prm.window_tokens = 0;
    prm.state_heads = 16;
    prm.state_conv_bytes = 3072;
    prm.state_ssm_bytes = 65536;
    assert_int_equal(kvs_layout_init(&st, &prm, NULL), KVS_OK);
    prm.state_conv_bytes = 0;
    prm.state_ssm_bytes = 65536 + 3072; /* the same sum, split otherwise */
    assert_int_equal(kvs_layout_init(&st2, &prm, NULL), KVS_OK);
    const struct {
        const kvs_layout_t *a, *b;
        const char *name;
    } cases[] = {
        {&full, &win, "full attention every k-th layer (0: all; full_attn_every, "
                      "--full-attn-every) differs: this side 0, peer 2"},
        {&win, &win64, "sliding window tokens (window_tokens, --window) differs: this side "
                       "128, peer 64"},
        {&st, &st2, "conv state bytes per head (state_conv_bytes, --state-bytes C+S) "
                    "differs: this side 3072, peer 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused_by_name(i, cases[i].a, cases[i].b, cases[i].name);
    kvs_fingerprint_t a;
    kvs__fingerprint(&st, KVS_PATH_STAGING, &none, &a);
    assert_int_equal(a.full_attn_every, 4);
    assert_int_equal(a.other_layers, KVS_LAYER_STATE);
    assert_int_equal(a.state_heads, 16);
    assert_int_equal(a.state_ssm_bytes, 65536);
}

/* A draft model's KV (docs/kinds/draft.md) is in the fingerprint: a side
 * that sends one and a side without are refused by name (each would read
 * the other's writer blocks at other offsets), as are drafts of other
 * layer counts or head dims; a draft head dim of 0 is the model's. */
static void test_channel_fingerprint_names_the_draft(void **state)
{
    (void)state;
    kvs_layout_params_t prm = {.total_heads = 8, .head_dim = 128, .layers = 32,
                               .page_size = 16, .prefill_tp = 4, .decode_tp = 2,
                               .chunk_tokens = 4096};
    const kvs_manager_config_t none = {0};
    kvs_layout_t plain, eagle, eagle_dim, two, small;
    assert_int_equal(kvs_layout_init(&plain, &prm, NULL), KVS_OK);
    prm.draft_layers = 1;
    assert_int_equal(kvs_layout_init(&eagle, &prm, NULL), KVS_OK);
    prm.draft_head_dim = 128; /* the model's, named */
    assert_int_equal(kvs_layout_init(&eagle_dim, &prm, NULL), KVS_OK);
    prm.draft_layers = 2;
    assert_int_equal(kvs_layout_init(&two, &prm, NULL), KVS_OK);
    prm.draft_head_dim = 64;
    assert_int_equal(kvs_layout_init(&small, &prm, NULL), KVS_OK);
    const struct {
        const kvs_layout_t *a, *b;
        const char *name;
    } cases[] = {
        {&eagle, &plain, "draft layers (0: no draft; draft_layers, --draft-layers) differs: "
                         "this side 1, peer 0"},
        {&plain, &eagle, "draft layers (0: no draft; draft_layers, --draft-layers) differs: "
                         "this side 0, peer 1"},
        {&eagle, &two, "draft layers (0: no draft; draft_layers, --draft-layers) differs: "
                       "this side 1, peer 2"},
        {&two, &small, "draft head dim (draft_head_dim, --draft-head-dim) differs: this "
                       "side 128, peer 64"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused_by_name(i, cases[i].a, cases[i].b, cases[i].name);
    kvs_fingerprint_t a, b;
    kvs__fingerprint(&eagle, KVS_PATH_STAGING, &none, &a);
    kvs__fingerprint(&eagle_dim, KVS_PATH_STAGING, &none, &b);
    char why[256] = "";
    assert_int_equal(kvs__fingerprint_check(&a, &b, why, sizeof why), KVS_OK);
    assert_int_equal(a.draft_layers, 1);
    assert_int_equal(a.draft_head_dim, 128);
    kvs__fingerprint(&plain, KVS_PATH_STAGING, &none, &a);
    assert_int_equal(a.draft_layers, 0);
    assert_int_equal(a.draft_head_dim, 0);
}

/* An MLA side (one latent of 576 per token) and a GQA side differ in kind,
 * heads and head dim: the kind, what to fix, is named; two MLA sides of
 * other latent dims differ in head dim, named as the latent dim. */
static void test_channel_fingerprint_mla_against_gqa_names_the_kind(void **state)
{
    kvs_layout_t gqa = layout_sample(), mla;
    kvs_layout_params_t prm = {.head_dim = 576, .dtype = KVS_DTYPE_FP32, .layers = 80,
                               .page_size = 16, .prefill_tp = 4, .decode_tp = 2,
                               .prefill_pp = 2, .chunk_tokens = 4096, .kind = KVS_KV_MLA};
    assert_int_equal(kvs_layout_init(&mla, &prm, NULL), KVS_OK);
    kvs_fingerprint_t a, b;
    kvs__fingerprint(&gqa, KVS_PATH_STAGING, &(kvs_manager_config_t){0}, &a);
    kvs__fingerprint(&mla, KVS_PATH_STAGING, &(kvs_manager_config_t){0}, &b);
    assert_int_equal(b.kv_kind, KVS_KV_MLA);
    assert_int_equal(b.head_dim, 576);
    assert_int_equal(b.total_heads, 1);
    char why[256] = "";
    assert_int_equal(kvs__fingerprint_check(&a, &b, why, sizeof why), KVS_EFINGERPRINT);
    assert_non_null(strstr(why, "KV kind"));
    assert_non_null(strstr(why, "this side 0, peer 1"));
    kvs_layout_t other;
    prm.head_dim = 512;
    assert_int_equal(kvs_layout_init(&other, &prm, NULL), KVS_OK);
    kvs__fingerprint(&other, KVS_PATH_STAGING, &(kvs_manager_config_t){0}, &a);
    assert_int_equal(kvs__fingerprint_check(&a, &b, why, sizeof why), KVS_EFINGERPRINT);
    assert_non_null(strstr(why, "latent dim"));
    assert_non_null(strstr(why, "this side 512, peer 576"));
}

static void test_channel_fingerprint_check_reports_first_difference(void **state)
{
    kvs_layout_t lay = layout_sample();
    kvs_fingerprint_t mine, theirs;
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &(kvs_manager_config_t){0}, &mine);
    theirs = mine;
    theirs.prefill_page_size = 64;
    theirs.total_heads = 32;
    theirs.dtype = 1;
    char why[256];
    assert_int_equal(kvs__fingerprint_check(&mine, &theirs, why, sizeof why),
                     KVS_EFINGERPRINT);
    assert_non_null(strstr(why, "total KV heads"));
    assert_null(strstr(why, "page size"));
    /* negative values print as such */
    theirs = mine;
    theirs.head_dim = -5;
    assert_int_equal(kvs__fingerprint_check(&mine, &theirs, why, sizeof why),
                     KVS_EFINGERPRINT);
    assert_non_null(strstr(why, "peer -5"));
}

/* The longest field name with the widest values fits the prefill's
 * 160-byte reason whole: the advice at its end is not cut. */
static void test_channel_fingerprint_check_app_tag_fits(void **state)
{
    kvs_layout_t lay = layout_sample();
    kvs_fingerprint_t mine, theirs;
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &(kvs_manager_config_t){.app_tag = UINT32_MAX - 1},
                     &mine);
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &(kvs_manager_config_t){.app_tag = UINT32_MAX},
                     &theirs);
    char why[160];
    assert_int_equal(kvs__fingerprint_check(&mine, &theirs, why, sizeof why),
                     KVS_EFINGERPRINT);
    const char *tail = "run both sides with the same setting";
    assert_true(strlen(why) >= strlen(tail));
    assert_string_equal(why + strlen(why) - strlen(tail), tail);
}

static void test_channel_fingerprint_check_truncates_why(void **state)
{
    kvs_layout_t lay = layout_sample();
    kvs_fingerprint_t mine, theirs;
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &(kvs_manager_config_t){0}, &mine);
    theirs = mine;
    theirs.layers = 1;
    char why[12];
    memset(why, 'X', sizeof why);
    assert_int_equal(kvs__fingerprint_check(&mine, &theirs, why, 8), KVS_EFINGERPRINT);
    assert_int_equal(strlen(why), 7);
    assert_memory_equal(why, "model l", 8);
    assert_int_equal(why[8], 'X'); /* nothing past why_bytes */
}

/* ---- sending ------------------------------------------------------------- */

static kvs_msg_t msg_room(void)
{
    kvs_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = KVS_MSG_ROOM;
    m.session = 0x1122334455667788ull;
    m.u.room.room = UINT64_MAX - 3;
    m.u.room.base_tokens = 32;
    m.u.room.total_tokens = 1000;
    m.u.room.num_pages = 61;
    return m;
}

static kvs_msg_t msg_pages(void)
{
    kvs_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = KVS_MSG_PAGES;
    m.session = 9;
    m.u.pages.room = 10;
    m.u.pages.first = 480;
    m.u.pages.count = KVS_WIRE_PAGES_PER_MSG; /* the largest message */
    for (uint32_t i = 0; i < m.u.pages.count; i++)
        m.u.pages.ids[i] = (int64_t)i * 7 - 100;
    return m;
}

/* What the fabric got must be exactly the encoding of m, and decode back to
 * it. */
static void assert_sent(const rec_fabric_t *r, const kvs_msg_t *m)
{
    uint8_t want[KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t want_len = 0;
    assert_int_equal(kvs__wire_encode(m, want, sizeof want, &want_len), KVS_OK);
    assert_int_equal(r->len_bytes, want_len);
    assert_memory_equal(r->bytes, want, want_len);
    assert_int_equal(r->wr_id, KVS__WR_CONTROL | (uint64_t)m->type);
    assert_ptr_equal(r->conn, fake_conn());

    kvs_msg_t got;
    assert_int_equal(kvs__wire_decode(r->bytes, r->len_bytes, &got), KVS_OK);
    assert_int_equal(got.type, m->type);
    switch (m->type) {
    case KVS_MSG_ROOM:
        assert_int_equal(got.session, m->session);
        assert_int_equal(got.u.room.room, m->u.room.room);
        assert_int_equal(got.u.room.base_tokens, m->u.room.base_tokens);
        assert_int_equal(got.u.room.total_tokens, m->u.room.total_tokens);
        assert_int_equal(got.u.room.num_pages, m->u.room.num_pages);
        break;
    case KVS_MSG_PAGES:
        assert_int_equal(got.session, m->session);
        assert_int_equal(got.u.pages.room, m->u.pages.room);
        assert_int_equal(got.u.pages.first, m->u.pages.first);
        assert_int_equal(got.u.pages.count, m->u.pages.count);
        assert_memory_equal(got.u.pages.ids, m->u.pages.ids,
                            m->u.pages.count * sizeof m->u.pages.ids[0]);
        break;
    default:
        fail_msg("assert_sent: no field check for type %d", (int)m->type);
    }
}

static void test_channel_send_encodes_and_counts(void **state)
{
    rec_fabric_t r;
    rec_init(&r);
    kvs_handler_stats_t stats;
    memset(&stats, 0, sizeof stats);

    kvs_msg_t room = msg_room();
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &room, &stats), KVS_OK);
    assert_int_equal(r.sends, 1);
    assert_int_equal(stats.msgs_sent, 1);
    assert_sent(&r, &room);

    kvs_msg_t pages = msg_pages();
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &pages, &stats), KVS_OK);
    assert_int_equal(r.sends, 2);
    assert_int_equal(stats.msgs_sent, 2);
    assert_sent(&r, &pages);
    assert_true(r.len_bytes > 8 * KVS_WIRE_PAGES_PER_MSG);
    /* Only msgs_sent moves. */
    assert_int_equal(stats.msgs_received, 0);
    assert_int_equal(stats.rdma_writes, 0);
}

static void test_channel_send_without_stats(void **state)
{
    rec_fabric_t r;
    rec_init(&r);
    kvs_msg_t room = msg_room();
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &room, NULL), KVS_OK);
    assert_int_equal(r.sends, 1);
    assert_sent(&r, &room);
}

static void test_channel_send_failure_is_not_counted(void **state)
{
    rec_fabric_t r;
    rec_init(&r);
    kvs_handler_stats_t stats;
    memset(&stats, 0, sizeof stats);
    kvs_msg_t room = msg_room();
    r.send_rc = KVS_EAGAIN;
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &room, &stats), KVS_EAGAIN);
    assert_int_equal(r.sends, 1);
    assert_int_equal(stats.msgs_sent, 0);
    r.send_rc = KVS_ENOTSUP;
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &room, &stats), KVS_ENOTSUP);
    assert_int_equal(stats.msgs_sent, 0);
    r.send_rc = KVS_OK;
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &room, &stats), KVS_OK);
    assert_int_equal(stats.msgs_sent, 1);
}

static void test_channel_send_invalid_message_not_sent(void **state)
{
    rec_fabric_t r;
    rec_init(&r);
    kvs_handler_stats_t stats;
    memset(&stats, 0, sizeof stats);
    kvs_msg_t m = msg_room();
    m.type = (kvs_msg_type_t)0;
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &m, &stats), KVS_EINVAL);
    m.type = (kvs_msg_type_t)(KVS_MSG_TYPE_MAX + 1);
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &m, &stats), KVS_EINVAL);
    m = msg_pages();
    m.u.pages.count = KVS_WIRE_PAGES_PER_MSG + 1; /* over its bound */
    assert_int_equal(kvs__channel_send(&r.base, fake_conn(), &m, &stats), KVS_EINVAL);
    assert_int_equal(r.sends, 0);
    assert_int_equal(stats.msgs_sent, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_channel_fingerprint_fills_each_field),
        cmocka_unit_test(test_channel_fingerprint_check_equal_is_ok),
        cmocka_unit_test(test_channel_fingerprint_check_names_each_field),
        cmocka_unit_test(test_channel_fingerprint_names_the_layer_pattern),
        cmocka_unit_test(test_channel_fingerprint_names_the_draft),
        cmocka_unit_test(test_channel_fingerprint_mla_against_gqa_names_the_kind),
        cmocka_unit_test(test_channel_fingerprint_check_reports_first_difference),
        cmocka_unit_test(test_channel_fingerprint_check_app_tag_fits),
        cmocka_unit_test(test_channel_fingerprint_check_truncates_why),
        cmocka_unit_test(test_channel_send_encodes_and_counts),
        cmocka_unit_test(test_channel_send_without_stats),
        cmocka_unit_test(test_channel_send_failure_is_not_counted),
        cmocka_unit_test(test_channel_send_invalid_message_not_sent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
