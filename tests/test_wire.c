/*
 * test_wire.c - unit tests of the control-message codec (src/wire.c, spec §7
 * and §9): every type round-trips with distinctive values, encoded lengths
 * are exact, golden byte vectors pin the little-endian format, and hostile
 * input (truncations, flipped header fields, trailing garbage, counts over
 * their bound, random bytes) is refused with KVS_EPROTO and leaves the output
 * untouched. Inputs are decoded from heap copies of their exact length so
 * AddressSanitizer catches any read past the end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#define NTYPES ((uint32_t)KVS_MSG_TYPE_MAX)

/* The counted messages by hand: bytes of their fixed fields (count last),
 * of one entry, and their bound; 0 for the others. */
typedef struct counted {
    uint32_t fixed, each, max;
} counted_t;
static counted_t counted(uint32_t type)
{
    switch (type) {
    case KVS_MSG_LAYERS: return (counted_t){12, 64, KVS_WIRE_LAYERS_PER_MSG};
    case KVS_MSG_PAGES: return (counted_t){20, 8, KVS_WIRE_PAGES_PER_MSG};
    case KVS_MSG_AUX: return (counted_t){20, 1, KVS_WIRE_AUX_PER_MSG};
    default: return (counted_t){0, 0, 0};
    }
}

#include "xorshift.h"


/* Field values for samples: mostly distinctive random values, and every
 * fourth field an edge value (all ones, the most negative, -1), so their
 * encoding is exercised every time. */
typedef struct sample_gen {
    uint64_t s;
    unsigned n;
} sample_gen_t;

static uint64_t gen_bits(sample_gen_t *g)
{
    static const uint64_t edges[] = {UINT64_MAX, 1ull << 63, UINT64_MAX - 1};
    const unsigned i = g->n++;
    return i % 4 == 3 ? edges[(i / 4) % 3] : xorshift64(&g->s);
}
static uint8_t gen_u8(sample_gen_t *g) { return (uint8_t)gen_bits(g); }
static uint32_t gen_u32(sample_gen_t *g) { return (uint32_t)gen_bits(g); }
static int32_t gen_i32(sample_gen_t *g) { return (int32_t)gen_u32(g); }
static uint64_t gen_u64(sample_gen_t *g) { return gen_bits(g); }
static int64_t gen_i64(sample_gen_t *g) { return (int64_t)gen_bits(g); }
#define GEN_FIELD(kind, name) v.name = gen_##kind(g);
static kvs_fingerprint_t gen_fp(sample_gen_t *g)
{
    kvs_fingerprint_t v;
    KVS_WIRE_FP_FIELDS(GEN_FIELD)
    return v;
}
static kvs_layer_entry_t gen_layer(sample_gen_t *g)
{
    kvs_layer_entry_t v;
    KVS_WIRE_LAYER_FIELDS(GEN_FIELD)
    return v;
}
#undef GEN_FIELD
static kvs_b32_t gen_b32(sample_gen_t *g)
{
    kvs_b32_t v;
    for (unsigned i = 0; i < sizeof v.b; i += 8) {
        const uint64_t w = gen_bits(g);
        memcpy(v.b + i, &w, 8);
    }
    return v;
}

/* A message of `type` with every field set from the one description of the
 * message set (wire.h); counted types carry `count` entries. Lengths and
 * byte layout are checked against hand-written numbers and golden vectors
 * below, not against that description. */
static kvs_msg_t sample_msg(kvs_msg_type_t type, uint32_t count, uint64_t seed)
{
    sample_gen_t gen = {.s = seed | 1u}, *g = &gen;
    kvs_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = type;
    m.seq = (uint32_t)(seed * 2654435761u) | 1u; /* the link's sequence number */
    m.session = gen_u64(g);
#define GEN_MSG_FIELD(kind, name) p->name = gen_##kind(g);
#define GEN_ARRAY_none(array)
#define GEN_ARRAY_u8(array) GEN_ARRAY(array, u8)
#define GEN_ARRAY_i64(array) GEN_ARRAY(array, i64)
#define GEN_ARRAY_layer(array) GEN_ARRAY(array, layer)
#define GEN_ARRAY(array, kind)                                                       \
    p->count = count;                                                                \
    for (uint32_t i = 0; i < count && i < sizeof p->array / sizeof p->array[0]; i++) \
        p->array[i] = gen_##kind(g);
#define GEN_MSG(NAME, value, member, mtype, ELEM, array, max)                        \
    case KVS_MSG_##NAME: {                                                           \
        kvs_msg_##mtype##_t *p = &m.u.member;                                        \
        KVS_WIRE_##NAME##_FIELDS(GEN_MSG_FIELD) GEN_ARRAY_##ELEM(array) break;       \
    }
    switch (type) {
        KVS_WIRE_MESSAGES(GEN_MSG)
    default:
        break;
    }
    return m;
}

/* Every sample used by the table-driven tests: each type once, the counted
 * types at 0, 1 and their bound. */
typedef struct sample_case {
    kvs_msg_type_t type;
    uint32_t count;
} sample_case_t;

static size_t all_cases(sample_case_t *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t t = 1; t <= NTYPES; t++) {
        if (counted(t).max > 0) {
            uint32_t counts[] = {0, 1, counted(t).max};
            for (size_t i = 0; i < 3; i++) {
                assert_true(n < cap);
                out[n++] = (sample_case_t){(kvs_msg_type_t)t, counts[i]};
            }
        } else {
            assert_true(n < cap);
            out[n++] = (sample_case_t){(kvs_msg_type_t)t, 0};
        }
    }
    return n;
}

/* The length the format says a message must have (header included). */
static uint32_t expected_len(kvs_msg_type_t type, uint32_t count)
{
    /* 24 header bytes, then the payload; the session travels in the header */
    switch (type) {
    /* the fingerprint: 180 bytes (92 before wire version 8 added kv_kind,
     * 100 before version 9 gave each side's page size, 108 before version
     * 10 added kv_scales and scale_block, 116 before version 11 added
     * prefill_cp, 124 before version 12 added the layer pattern of a hybrid
     * model, 164 before version 13 added draft_layers and draft_head_dim) */
    case KVS_MSG_REGISTER: return 24 + 32 + 32 + 180 + 24 + 8 + 16 + 8 + 32; /* 356 */
    /* a layer entry: 64 bytes (32 before version 10 added the scale buffers) */
    case KVS_MSG_LAYERS: return 24 + 12 + 64 * count;
    /* ... then the answering rank's cp_rank and cp_size (version 11) */
    case KVS_MSG_REGISTER_ACK: return 24 + 8 + 16 + 8 + 16 + 180 + 16;
    case KVS_MSG_ROOM: return 24 + 32;
    case KVS_MSG_PAGES: return 24 + 20 + 8 * count;
    case KVS_MSG_STAGING_REQ: return 24 + 48;
    case KVS_MSG_STAGING_RSP: return 24 + 64;
    case KVS_MSG_CHUNK_READY: return 24 + 48;
    case KVS_MSG_WATERMARK: return 24 + 16;
    case KVS_MSG_STATUS: return 24 + 40;
    case KVS_MSG_ABORT: return 24 + 16;
    case KVS_MSG_ACK: return 24 + 8;
    case KVS_MSG_AUX: return 24 + 20 + count;
    case KVS_MSG_HELLO: return 24 + 32;
    case KVS_MSG_CHALLENGE: return 24 + 16 + 32 + 32;
    default: return 0;
    }
}

static uint32_t encode_ok(const kvs_msg_t *m, uint8_t *buf, uint32_t cap)
{
    uint32_t len = 0;
    assert_int_equal(kvs__wire_encode(m, buf, cap, &len), KVS_OK);
    assert_true(len >= KVS_WIRE_HEADER_BYTES && len <= cap);
    return len;
}

/* Decodes from a heap copy of exactly len bytes (ASan sees over-reads). */
static int decode_exact(const uint8_t *bytes, uint32_t len, kvs_msg_t *out)
{
    uint8_t *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    if (len)
        memcpy(copy, bytes, len);
    int rc = kvs__wire_decode(copy, len, out);
    free(copy);
    return rc;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (unsigned i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void fill_pattern(kvs_msg_t *m) { memset(m, 0xA5, sizeof *m); }

static bool is_pattern(const kvs_msg_t *m)
{
    kvs_msg_t pattern;
    fill_pattern(&pattern);
    return memcmp(m, &pattern, sizeof *m) == 0;
}

static void assert_pattern(const kvs_msg_t *m)
{
    if (!is_pattern(m))
        fail_msg("a failed decode wrote *msg");
}

/* Decoding must fail with KVS_EPROTO and leave *msg alone. */
static void assert_eproto(const uint8_t *bytes, uint32_t len)
{
    kvs_msg_t m;
    fill_pattern(&m);
    assert_int_equal(decode_exact(bytes, len, &m), KVS_EPROTO);
    assert_pattern(&m);
}

#define EQ_FIELD(kind, name) EQ_##kind(x->name, y->name)
#define EQ_u8(a, b) assert_int_equal(a, b);
#define EQ_u32(a, b) assert_int_equal(a, b);
#define EQ_i32(a, b) assert_int_equal(a, b);
#define EQ_u64(a, b) assert_int_equal(a, b);
#define EQ_i64(a, b) assert_int_equal(a, b);
#define EQ_fp(a, b) assert_fp_equal(&(a), &(b));
#define EQ_layer(a, b) assert_layer_equal(&(a), &(b));
#define EQ_b32(p, q) assert_memory_equal((p).b, (q).b, sizeof (p).b);

static void assert_fp_equal(const kvs_fingerprint_t *x, const kvs_fingerprint_t *y)
{
    KVS_WIRE_FP_FIELDS(EQ_FIELD)
}

static void assert_layer_equal(const kvs_layer_entry_t *x, const kvs_layer_entry_t *y)
{
    KVS_WIRE_LAYER_FIELDS(EQ_FIELD)
}

/* Field by field (padding is not part of a message). */
static void assert_msg_equal(const kvs_msg_t *a, const kvs_msg_t *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->seq, b->seq);
    assert_int_equal(a->session, b->session);
#define EQ_ARRAY_none(array)
#define EQ_ARRAY_u8(array) EQ_ARRAY(array, u8)
#define EQ_ARRAY_i64(array) EQ_ARRAY(array, i64)
#define EQ_ARRAY_layer(array) EQ_ARRAY(array, layer)
#define EQ_ARRAY(array, kind)                                                        \
    for (uint32_t i = 0; i < x->count; i++)                                          \
        EQ_##kind(x->array[i], y->array[i])
#define EQ_MSG(NAME, value, member, mtype, ELEM, array, max)                         \
    case KVS_MSG_##NAME: {                                                           \
        const kvs_msg_##mtype##_t *x = &a->u.member, *y = &b->u.member;              \
        KVS_WIRE_##NAME##_FIELDS(EQ_FIELD) EQ_ARRAY_##ELEM(array) break;             \
    }
    switch (a->type) {
        KVS_WIRE_MESSAGES(EQ_MSG)
    default:
        fail_msg("unexpected type %d", (int)a->type);
    }
}

/* ---- round trips and lengths -------------------------------------------- */

static void test_wire_round_trips_every_type(void **state)
{
    (void)state;
    sample_case_t cases[32];
    size_t n = all_cases(cases, 32);
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    for (size_t i = 0; i < n; i++) {
        kvs_msg_t in = sample_msg(cases[i].type, cases[i].count, 0x9E3779B97F4A7C15u + i);
        uint32_t len = encode_ok(&in, buf, sizeof buf);
        kvs_msg_t out;
        fill_pattern(&out);
        assert_int_equal(decode_exact(buf, len, &out), KVS_OK);
        assert_msg_equal(&in, &out);
        /* Entries past the count are zeroed, not left over from *msg. */
        if (in.type == KVS_MSG_LAYERS && in.u.layers.count < KVS_WIRE_LAYERS_PER_MSG)
            assert_int_equal(out.u.layers.entries[in.u.layers.count].k_addr, 0);
        if (in.type == KVS_MSG_PAGES && in.u.pages.count < KVS_WIRE_PAGES_PER_MSG)
            assert_int_equal(out.u.pages.ids[KVS_WIRE_PAGES_PER_MSG - 1], 0);
        if (in.type == KVS_MSG_AUX && in.u.aux.count < KVS_WIRE_AUX_PER_MSG)
            assert_int_equal(out.u.aux.data[KVS_WIRE_AUX_PER_MSG - 1], 0);
        /* Re-encoding the decoded message gives the same bytes. */
        uint8_t again[KVS_CONTROL_MSG_MAX_BYTES];
        assert_int_equal(encode_ok(&out, again, sizeof again), len);
        assert_memory_equal(buf, again, len);
    }
}

static void test_wire_encoded_lengths_are_exact(void **state)
{
    (void)state;
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    for (uint32_t t = 1; t <= NTYPES; t++) {
        const uint32_t max = counted(t).max;
        for (uint32_t c = 0; c <= max; c++) {
            kvs_msg_t m = sample_msg((kvs_msg_type_t)t, c, 42 + c);
            uint32_t len = encode_ok(&m, buf, sizeof buf);
            assert_int_equal(len, expected_len((kvs_msg_type_t)t, c));
            /* The header's length field is the payload length. */
            uint32_t payload = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 |
                               (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
            assert_int_equal(payload, len - KVS_WIRE_HEADER_BYTES);
        }
    }
    assert_int_equal(expected_len(KVS_MSG_REGISTER, 0), 356);
    /* The largest messages fit a control message. */
    assert_int_equal(expected_len(KVS_MSG_LAYERS, KVS_WIRE_LAYERS_PER_MSG), 3108);
    assert_int_equal(expected_len(KVS_MSG_PAGES, KVS_WIRE_PAGES_PER_MSG), 3884);
    assert_int_equal(expected_len(KVS_MSG_AUX, KVS_WIRE_AUX_PER_MSG), 4044);
    assert_true(expected_len(KVS_MSG_AUX, KVS_WIRE_AUX_PER_MSG) <= KVS_CONTROL_MSG_MAX_BYTES);
    assert_true(expected_len(KVS_MSG_LAYERS, KVS_WIRE_LAYERS_PER_MSG) <= KVS_CONTROL_MSG_MAX_BYTES);
    assert_true(expected_len(KVS_MSG_PAGES, KVS_WIRE_PAGES_PER_MSG) <= KVS_CONTROL_MSG_MAX_BYTES);
    /* An exact-size buffer suffices. */
    kvs_msg_t big = sample_msg(KVS_MSG_PAGES, KVS_WIRE_PAGES_PER_MSG, 7);
    assert_int_equal(encode_ok(&big, buf, 3884), 3884);
}

/* ---- golden vectors ----------------------------------------------------- */

/* m encodes to exactly golden (n bytes), and golden decodes back to m;
 * *out (may be NULL) gets the decoded message. */
static void expect_golden(const kvs_msg_t *m, const uint8_t *golden, uint32_t n, kvs_msg_t *out)
{
    uint8_t buf[128];
    assert_true(n <= sizeof buf);
    const uint32_t len = encode_ok(m, buf, sizeof buf);
    assert_int_equal(len, n);
    assert_memory_equal(buf, golden, n);
    kvs_msg_t got;
    assert_int_equal(decode_exact(golden, n, &got), KVS_OK);
    assert_msg_equal(m, &got);
    if (out != NULL)
        *out = got;
}

static void test_wire_golden_watermark(void **state)
{
    (void)state;
    static const uint8_t golden[] = {
        0x54, 0x53, 0x56, 0x4B,                         /* magic "KVST" LE */
        0x0F, 0x00,                                     /* version 15 */
        0x09, 0x00,                                     /* type WATERMARK */
        0x10, 0x00, 0x00, 0x00,                         /* payload 16 */
        0x11, 0x22, 0x33, 0x44,                         /* link seq */
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* sender's session */
        0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, /* round */
        0xF0, 0xDE, 0xBC, 0x9A, 0x00, 0x00, 0x00, 0x80, /* offset */
    };
    kvs_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = KVS_MSG_WATERMARK;
    m.seq = 0x44332211u;
    m.session = 0x0102030405060708u;
    m.u.wm.round = 0x1112131415161718u;
    m.u.wm.offset = 0x800000009ABCDEF0u;
    expect_golden(&m, golden, sizeof golden, NULL);
}

/* Pins the signed encoding: two's complement, little-endian. */
static void test_wire_golden_abort_negative_status(void **state)
{
    (void)state;
    static const uint8_t golden[] = {
        0x54, 0x53, 0x56, 0x4B, 0x0F, 0x00, 0x0B, 0x00, 0x10, 0x00, 0x00, 0x00,
        0x07, 0x00, 0x00, 0x00,                         /* link seq 7 */
        0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, /* session = max u64 */
        0x2A, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* room = 42 */
        0xF6, 0xFF, 0xFF, 0xFF,                         /* status = -10 */
        0x00, 0x00, 0x00, 0x00,                         /* reserved */
    };
    kvs_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = KVS_MSG_ABORT;
    m.seq = 7;
    m.session = UINT64_MAX;
    m.u.abort.room = 42;
    m.u.abort.status = KVS_EOVERSIZED;
    kvs_msg_t out;
    expect_golden(&m, golden, sizeof golden, &out);
    assert_int_equal(out.u.abort.status, -10);
}

/* Pins STAGING_RSP (wire version 7, unchanged in 8): the region, then the two keys of the
 * receiving writer's bytes of it. */
static void test_wire_golden_staging_rsp_keys(void **state)
{
    (void)state;
    static const uint8_t golden[] = {
        0x54, 0x53, 0x56, 0x4B, 0x0F, 0x00, 0x07, 0x00, 0x40, 0x00, 0x00, 0x00,
        0x02, 0x00, 0x00, 0x00,                         /* link seq 2 */
        0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* session 5 */
        0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* room 9 */
        0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* chunk 3 */
        0x00, 0x00, 0x00, 0x00,                         /* status OK */
        0x00, 0x00, 0x00, 0x00,                         /* reserved */
        0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* offset 8192 */
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* round 1 */
        0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* end 16384 */
        0x44, 0x33, 0x22, 0x11, 0x00, 0x00, 0x00, 0x00, /* rkey */
        0x88, 0x77, 0x66, 0x55, 0x00, 0x00, 0x00, 0x00, /* rkey_v */
    };
    kvs_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = KVS_MSG_STAGING_RSP;
    m.seq = 2;
    m.session = 5;
    m.u.rsp = (kvs_msg_staging_rsp_t){.room = 9, .chunk = 3, .status = KVS_OK,
                                      .offset = 8192, .round = 1, .end = 16384,
                                      .rkey = 0x11223344u, .rkey_v = 0x55667788u};
    expect_golden(&m, golden, sizeof golden, NULL);
}

/* Pins the byte array's encoding: the bytes as they are, after the count. */
static void test_wire_golden_aux(void **state)
{
    (void)state;
    static const uint8_t golden[] = {
        0x54, 0x53, 0x56, 0x4B, 0x0F, 0x00, 0x0D, 0x00, 0x17, 0x00, 0x00, 0x00,
        0x03, 0x00, 0x00, 0x00,                         /* link seq 3 */
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* session 1 */
        0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* room 9 */
        0x10, 0x27, 0x00, 0x00,                         /* total 10000 */
        0xA0, 0x0F, 0x00, 0x00,                         /* first 4000 */
        0x03, 0x00, 0x00, 0x00,                         /* count 3 */
        0x61, 0x00, 0xFF,                               /* the bytes */
    };
    kvs_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = KVS_MSG_AUX;
    m.seq = 3;
    m.session = 1;
    m.u.aux = (kvs_msg_aux_t){.room = 9, .total = 10000, .first = 4000, .count = 3,
                              .data = {0x61, 0x00, 0xFF}};
    expect_golden(&m, golden, sizeof golden, NULL);
}

/* ---- hostile input ------------------------------------------------------ */

static void test_wire_every_truncation_is_eproto(void **state)
{
    (void)state;
    sample_case_t cases[32];
    size_t n = all_cases(cases, 32);
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    for (size_t i = 0; i < n; i++) {
        kvs_msg_t m = sample_msg(cases[i].type, cases[i].count, 1000 + i);
        uint32_t len = encode_ok(&m, buf, sizeof buf);
        for (uint32_t l = len; l-- > 0;) {
            assert_eproto(buf, l);
            /* Also when the header is patched to agree with the cut. */
            if (l >= KVS_WIRE_HEADER_BYTES) {
                uint8_t patched[KVS_CONTROL_MSG_MAX_BYTES];
                memcpy(patched, buf, l);
                put_le32(patched + 8, l - KVS_WIRE_HEADER_BYTES);
                assert_eproto(patched, l);
            }
        }
    }
}

static void test_wire_flipped_header_fields_are_eproto(void **state)
{
    (void)state;
    sample_case_t cases[32];
    size_t n = all_cases(cases, 32);
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    for (size_t i = 0; i < n; i++) {
        kvs_msg_t m = sample_msg(cases[i].type, cases[i].count, 2000 + i);
        uint32_t len = encode_ok(&m, buf, sizeof buf);
        /* Every single-bit flip of the magic, the version and the length. */
        for (unsigned bit = 0; bit < 32; bit++) {
            unsigned fields[] = {0, 8}; /* magic, length */
            for (size_t f = 0; f < 2; f++) {
                buf[fields[f] + bit / 8] ^= (uint8_t)(1u << (bit % 8));
                assert_eproto(buf, len);
                buf[fields[f] + bit / 8] ^= (uint8_t)(1u << (bit % 8));
            }
            if (bit < 16) {
                buf[4 + bit / 8] ^= (uint8_t)(1u << (bit % 8));
                assert_eproto(buf, len);
                buf[4 + bit / 8] ^= (uint8_t)(1u << (bit % 8));
            }
        }
        /* Types outside the protocol. */
        uint16_t bad_types[] = {0, KVS_MSG_TYPE_MAX + 1, 0x100 | (uint16_t)cases[i].type, 0xFFFF};
        for (size_t k = 0; k < sizeof bad_types / sizeof bad_types[0]; k++) {
            put_le16(buf + 6, bad_types[k]);
            assert_eproto(buf, len);
        }
        /* A valid type whose size differs from this payload. */
        put_le16(buf + 6, cases[i].type == KVS_MSG_REGISTER ? KVS_MSG_WATERMARK
                                                            : KVS_MSG_REGISTER);
        assert_eproto(buf, len);
        put_le16(buf + 6, (uint16_t)cases[i].type);
        /* Length field extremes. */
        uint32_t bad_lens[] = {0, len, len - KVS_WIRE_HEADER_BYTES + 1,
                               len - KVS_WIRE_HEADER_BYTES - 1, UINT32_MAX};
        for (size_t k = 0; k < sizeof bad_lens / sizeof bad_lens[0]; k++) {
            if (bad_lens[k] == len - KVS_WIRE_HEADER_BYTES)
                continue;
            put_le32(buf + 8, bad_lens[k]);
            assert_eproto(buf, len);
        }
        put_le32(buf + 8, len - KVS_WIRE_HEADER_BYTES);
        kvs_msg_t out;
        assert_int_equal(decode_exact(buf, len, &out), KVS_OK);
    }
}

static void test_wire_trailing_garbage_is_eproto(void **state)
{
    (void)state;
    sample_case_t cases[32];
    size_t n = all_cases(cases, 32);
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES + 64];
    for (size_t i = 0; i < n; i++) {
        kvs_msg_t m = sample_msg(cases[i].type, cases[i].count, 3000 + i);
        uint32_t len = encode_ok(&m, buf, KVS_CONTROL_MSG_MAX_BYTES);
        for (uint32_t extra = 1; extra <= 40; extra++) {
            memset(buf + len, 0, extra); /* zeros: the most plausible padding */
            assert_eproto(buf, len + extra);                 /* header unchanged */
            put_le32(buf + 8, len + extra - KVS_WIRE_HEADER_BYTES);
            assert_eproto(buf, len + extra);                 /* header agrees */
            put_le32(buf + 8, len - KVS_WIRE_HEADER_BYTES);
        }
    }
}

/* A LAYERS/PAGES/AUX message with `count` in its count field and a payload
 * of `entries` entries (the header length agrees with the bytes). */
static uint32_t craft_counted(uint8_t *buf, uint32_t cap, kvs_msg_type_t type,
                              uint32_t count, uint32_t entries)
{
    const uint32_t fixed = counted(type).fixed, each = counted(type).each;
    uint32_t len = KVS_WIRE_HEADER_BYTES + fixed + entries * each;
    assert_true(len <= cap);
    memset(buf, 0x5C, len);
    put_le32(buf, KVS_WIRE_MAGIC);
    put_le16(buf + 4, KVS_WIRE_VERSION);
    put_le16(buf + 6, (uint16_t)type);
    put_le32(buf + 8, len - KVS_WIRE_HEADER_BYTES);
    put_le32(buf + 12, 1); /* link seq */
    memset(buf + 16, 0, 8); /* session */
    put_le32(buf + KVS_WIRE_HEADER_BYTES + fixed - 4, count);
    return len;
}

static void test_wire_count_over_bound_is_eproto(void **state)
{
    (void)state;
    uint8_t buf[8192];
    kvs_msg_type_t types[] = {KVS_MSG_LAYERS, KVS_MSG_PAGES, KVS_MSG_AUX};
    for (size_t t = 0; t < 3; t++) {
        const uint32_t max = counted(types[t]).max;
        kvs_msg_t out;
        /* Sanity: the crafted form is accepted at the bound. */
        uint32_t len = craft_counted(buf, sizeof buf, types[t], max, max);
        assert_int_equal(decode_exact(buf, len, &out), KVS_OK);
        /* Over the bound, with a payload that matches the count. */
        len = craft_counted(buf, sizeof buf, types[t], max + 1, max + 1);
        assert_eproto(buf, len);
        /* Huge counts with short payloads (no overflow in the size check). */
        uint32_t huge[] = {UINT32_MAX, 0x80000000u, 0x08000000u, max + 1};
        for (size_t k = 0; k < 4; k++) {
            len = craft_counted(buf, sizeof buf, types[t], huge[k], 1);
            assert_eproto(buf, len);
            len = craft_counted(buf, sizeof buf, types[t], huge[k], 0);
            assert_eproto(buf, len);
        }
        /* Count and payload disagree in both directions. */
        len = craft_counted(buf, sizeof buf, types[t], 3, 2);
        assert_eproto(buf, len);
        len = craft_counted(buf, sizeof buf, types[t], 2, 3);
        assert_eproto(buf, len);
        len = craft_counted(buf, sizeof buf, types[t], 0, 1);
        assert_eproto(buf, len);
        /* Payload shorter than the fixed part, header agreeing. */
        for (uint32_t p = 0; p < counted(types[t]).fixed; p++) {
            put_le32(buf + 8, p);
            assert_eproto(buf, KVS_WIRE_HEADER_BYTES + p);
        }
    }
}

static void test_wire_decode_failure_leaves_msg_untouched(void **state)
{
    (void)state;
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    /* Failures found after some fields were read: the count check of a
     * LAYERS/PAGES message whose session and first are already parsed. */
    uint32_t len = craft_counted(buf, sizeof buf, KVS_MSG_LAYERS, KVS_WIRE_LAYERS_PER_MSG + 1, 2);
    assert_eproto(buf, len);
    len = craft_counted(buf, sizeof buf, KVS_MSG_PAGES, 7, 6);
    assert_eproto(buf, len);
    /* Failures in the header. */
    kvs_msg_t m = sample_msg(KVS_MSG_REGISTER, 0, 5);
    len = encode_ok(&m, buf, sizeof buf);
    buf[0] ^= 1;
    assert_eproto(buf, len);
    buf[0] ^= 1;
    assert_eproto(buf, len - 1);
    assert_eproto(buf, 0);
    /* Argument errors leave it alone too. */
    kvs_msg_t out;
    fill_pattern(&out);
    assert_int_equal(kvs__wire_decode(NULL, 12, &out), KVS_EINVAL);
    assert_pattern(&out);
    assert_int_equal(kvs__wire_decode(NULL, 0, &out), KVS_EPROTO);
    assert_pattern(&out);
    assert_int_equal(kvs__wire_decode(buf, len, NULL), KVS_EINVAL);
}

/* ---- encode errors ------------------------------------------------------ */

static void test_wire_encode_short_cap_is_erange(void **state)
{
    (void)state;
    sample_case_t cases[32];
    size_t n = all_cases(cases, 32);
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    for (size_t i = 0; i < n; i++) {
        kvs_msg_t m = sample_msg(cases[i].type, cases[i].count, 4000 + i);
        uint32_t need = expected_len(cases[i].type, cases[i].count);
        uint32_t caps[] = {0, 1, KVS_WIRE_HEADER_BYTES, need - 1};
        for (size_t k = 0; k < 4; k++) {
            memset(buf, 0xEE, sizeof buf);
            uint32_t len = 0;
            assert_int_equal(kvs__wire_encode(&m, buf, caps[k], &len), KVS_ERANGE);
            assert_int_equal(len, need); /* the size the caller must provide */
            for (size_t b = 0; b < sizeof buf; b++)
                assert_int_equal(buf[b], 0xEE); /* nothing written */
        }
        uint32_t len = 0;
        assert_int_equal(kvs__wire_encode(&m, NULL, 0, &len), KVS_ERANGE);
        assert_int_equal(len, need);
    }
}

static void test_wire_encode_invalid_is_einval(void **state)
{
    (void)state;
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t len = 777;
    kvs_msg_t m = sample_msg(KVS_MSG_WATERMARK, 0, 9);
    int bad_types[] = {0, KVS_MSG_TYPE_MAX + 1, 99, -1};
    for (size_t k = 0; k < 4; k++) {
        m.type = (kvs_msg_type_t)bad_types[k];
        assert_int_equal(kvs__wire_encode(&m, buf, sizeof buf, &len), KVS_EINVAL);
        assert_int_equal(len, 777);
    }
    m = sample_msg(KVS_MSG_LAYERS, KVS_WIRE_LAYERS_PER_MSG, 10);
    m.u.layers.count = KVS_WIRE_LAYERS_PER_MSG + 1;
    assert_int_equal(kvs__wire_encode(&m, buf, sizeof buf, &len), KVS_EINVAL);
    m.u.layers.count = UINT32_MAX;
    assert_int_equal(kvs__wire_encode(&m, buf, sizeof buf, &len), KVS_EINVAL);
    m = sample_msg(KVS_MSG_PAGES, KVS_WIRE_PAGES_PER_MSG, 11);
    m.u.pages.count = KVS_WIRE_PAGES_PER_MSG + 1;
    assert_int_equal(kvs__wire_encode(&m, buf, sizeof buf, &len), KVS_EINVAL);
    m.u.pages.count = UINT32_MAX;
    assert_int_equal(kvs__wire_encode(&m, buf, sizeof buf, &len), KVS_EINVAL);
    m = sample_msg(KVS_MSG_AUX, KVS_WIRE_AUX_PER_MSG, 13);
    m.u.aux.count = KVS_WIRE_AUX_PER_MSG + 1;
    assert_int_equal(kvs__wire_encode(&m, buf, sizeof buf, &len), KVS_EINVAL);
    assert_int_equal(len, 777);
    /* NULL arguments. */
    m = sample_msg(KVS_MSG_ROOM, 0, 12);
    assert_int_equal(kvs__wire_encode(NULL, buf, sizeof buf, &len), KVS_EINVAL);
    assert_int_equal(kvs__wire_encode(&m, buf, sizeof buf, NULL), KVS_EINVAL);
    assert_int_equal(kvs__wire_encode(&m, NULL, 16, &len), KVS_EINVAL);
}

static void test_wire_type_names(void **state)
{
    (void)state;
    const char *names[] = {NULL,          "REGISTER",    "LAYERS",      "REGISTER_ACK",
                           "ROOM",        "PAGES",       "STAGING_REQ", "STAGING_RSP",
                           "CHUNK_READY", "WATERMARK",   "STATUS",      "ABORT",
                           "ACK",         "AUX",         "HELLO",       "CHALLENGE"};
    for (uint32_t t = 1; t <= NTYPES; t++)
        assert_string_equal(kvs__wire_type_name((kvs_msg_type_t)t), names[t]);
    assert_string_equal(kvs__wire_type_name((kvs_msg_type_t)0), "UNKNOWN");
    assert_string_equal(kvs__wire_type_name((kvs_msg_type_t)(KVS_MSG_TYPE_MAX + 1)), "UNKNOWN");
    assert_string_equal(kvs__wire_type_name((kvs_msg_type_t)-1), "UNKNOWN");
}

/* ---- random bytes ------------------------------------------------------- */

/*
 * 100k buffers of random length <= KVS_CONTROL_MSG_MAX_BYTES: pure noise, a
 * valid header over noise (sizes near the type's own), and valid messages
 * with a few bytes mutated, cut or extended. Decoding must return OK or
 * EPROTO, leave *msg alone on EPROTO, and on OK re-encode to the same bytes
 * (the encoding is canonical).
 */
static void test_wire_random_bytes_never_crash(void **state)
{
    (void)state;
    const uint64_t seed = 0x5EED0F0A11BADB17u;
    uint64_t s = seed;
    uint32_t n_ok = 0, n_eproto = 0;
    uint8_t src[KVS_CONTROL_MSG_MAX_BYTES];
    uint8_t again[KVS_CONTROL_MSG_MAX_BYTES];

    for (uint32_t iter = 0; iter < 100000; iter++) {
        uint32_t mode = (uint32_t)(xorshift64(&s) % 4);
        uint32_t len;
        if (mode == 0) { /* noise */
            len = (uint32_t)(xorshift64(&s) % (KVS_CONTROL_MSG_MAX_BYTES + 1));
            for (uint32_t i = 0; i < len; i += 8) {
                uint64_t r = xorshift64(&s);
                for (uint32_t b = 0; b < 8 && i + b < len; b++)
                    src[i + b] = (uint8_t)(r >> (8 * b));
            }
        } else if (mode == 1) { /* valid header, noise payload */
            kvs_msg_type_t type = (kvs_msg_type_t)(xorshift64(&s) % (NTYPES + 2));
            uint32_t count = (uint32_t)(xorshift64(&s) % 500);
            uint32_t base = expected_len(type, count > 480 ? 0 : count);
            if (type == KVS_MSG_LAYERS && count > KVS_WIRE_LAYERS_PER_MSG)
                base = 12 + 20 + 32 * (count % 128);
            if (base == 0 || xorshift64(&s) % 8 == 0)
                base = (uint32_t)(xorshift64(&s) % (KVS_CONTROL_MSG_MAX_BYTES + 1));
            int32_t delta = (int32_t)(xorshift64(&s) % 5) - 2;
            len = (uint32_t)((int64_t)base + (xorshift64(&s) % 2 ? delta : 0));
            if (len > KVS_CONTROL_MSG_MAX_BYTES)
                len = KVS_CONTROL_MSG_MAX_BYTES;
            for (uint32_t i = 0; i < len; i++)
                src[i] = (uint8_t)xorshift64(&s);
            if (len >= KVS_WIRE_HEADER_BYTES) {
                put_le32(src, KVS_WIRE_MAGIC);
                put_le16(src + 4, KVS_WIRE_VERSION);
                put_le16(src + 6, (uint16_t)type);
                put_le32(src + 8, xorshift64(&s) % 8 ? len - KVS_WIRE_HEADER_BYTES
                                                     : (uint32_t)xorshift64(&s));
                /* Counted types: mostly a count that matches the bytes. */
                const counted_t c = counted(type);
                if (c.max > 0 && xorshift64(&s) % 2) {
                    const uint32_t at = KVS_WIRE_HEADER_BYTES + c.fixed;
                    if (len >= at)
                        put_le32(src + at - 4, (len - at) / c.each);
                }
            }
        } else { /* a valid message, then mutated */
            kvs_msg_type_t type = (kvs_msg_type_t)(1 + xorshift64(&s) % NTYPES);
            const uint32_t max = counted(type).max;
            uint32_t count = (uint32_t)(xorshift64(&s) % (max + 1));
            kvs_msg_t m = sample_msg(type, count, xorshift64(&s));
            len = encode_ok(&m, src, sizeof src);
            uint32_t flips = (uint32_t)(xorshift64(&s) % 4);
            for (uint32_t f = 0; f < flips; f++) {
                uint32_t at = (uint32_t)(xorshift64(&s) % len);
                src[at] ^= (uint8_t)(1u << (xorshift64(&s) % 8));
            }
            uint32_t cut = (uint32_t)(xorshift64(&s) % 8);
            if (cut == 1)
                len = (uint32_t)(xorshift64(&s) % (len + 1));
            else if (cut == 2 && len < KVS_CONTROL_MSG_MAX_BYTES)
                src[len++] = (uint8_t)xorshift64(&s);
        }

        kvs_msg_t out;
        fill_pattern(&out);
        int rc = decode_exact(src, len, &out);
        if (rc == KVS_OK) {
            n_ok++;
            uint32_t len2 = 0;
            if (kvs__wire_encode(&out, again, sizeof again, &len2) != KVS_OK ||
                len2 != len || memcmp(src, again, len) != 0)
                fail_msg("seed 0x%llx iter %u: decoded message does not re-encode "
                         "to its bytes", (unsigned long long)seed, iter);
        } else if (rc == KVS_EPROTO) {
            n_eproto++;
            if (!is_pattern(&out))
                fail_msg("seed 0x%llx iter %u: failed decode wrote *msg",
                         (unsigned long long)seed, iter);
        } else {
            fail_msg("seed 0x%llx iter %u: decode returned %d",
                     (unsigned long long)seed, iter, rc);
        }
    }
    /* Both outcomes were exercised, not just the magic check. */
    assert_true(n_ok > 1000);
    assert_true(n_eproto > 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_round_trips_every_type),
        cmocka_unit_test(test_wire_encoded_lengths_are_exact),
        cmocka_unit_test(test_wire_golden_watermark),
        cmocka_unit_test(test_wire_golden_abort_negative_status),
        cmocka_unit_test(test_wire_golden_aux),
        cmocka_unit_test(test_wire_golden_staging_rsp_keys),
        cmocka_unit_test(test_wire_every_truncation_is_eproto),
        cmocka_unit_test(test_wire_flipped_header_fields_are_eproto),
        cmocka_unit_test(test_wire_trailing_garbage_is_eproto),
        cmocka_unit_test(test_wire_count_over_bound_is_eproto),
        cmocka_unit_test(test_wire_decode_failure_leaves_msg_untouched),
        cmocka_unit_test(test_wire_encode_short_cap_is_erange),
        cmocka_unit_test(test_wire_encode_invalid_is_einval),
        cmocka_unit_test(test_wire_type_names),
        cmocka_unit_test(test_wire_random_bytes_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
