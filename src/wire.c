/*
 * wire.c - the byte encoding of the staging protocol's control messages
 * (spec §7), declared in wire.h.
 *
 * Format: a 24-byte header (magic u32, version u16, type u16, payload length
 * u32, link sequence number u32, the sender's session u64) and then the
 * message's fields in the order its field list in wire.h gives, each integer
 * little-endian at its own width, written with explicit shifts (no struct
 * memcpy, no padding on the wire). A counted message (LAYERS, PAGES) carries
 * `count` entries after its fixed fields. Every other type has one fixed
 * payload length. Sizes, encoder, decoder and names are generated from the
 * one description of the message set in wire.h.
 *
 * Invariants: an encoded message is never longer than
 * KVS_CONTROL_MSG_MAX_BYTES (checked at compile time below). Decoding trusts
 * nothing: the header, the payload length and any count are checked against
 * the buffer and the protocol's bounds before a field is read, and *msg is
 * written only when the whole message decoded. What this file does not do:
 * semantic checks (is this room known, is this offset inside the ring); those
 * belong to the handlers. Pure functions on caller buffers: no allocation, no
 * state.
 */
#include "wire.h"

#include <assert.h>
#include <string.h>

/* Wire bytes of each field kind. */
#define WIRE_BYTES_u8 1u
#define WIRE_BYTES_u32 4u
#define WIRE_BYTES_i32 4u
#define WIRE_BYTES_u64 8u
#define WIRE_BYTES_i64 8u
#define WIRE_BYTES_none 0u
#define WIRE_BYTES_b32 32u
#define WIRE_SIZE(kind, name) +WIRE_BYTES_##kind
enum { WIRE_BYTES_fp = 0u KVS_WIRE_FP_FIELDS(WIRE_SIZE),
       WIRE_BYTES_layer = 0u KVS_WIRE_LAYER_FIELDS(WIRE_SIZE) };

/* Fixed payload bytes of each message (header excluded), and the bytes of
 * one entry of a counted message (0 for the others). */
#define WIRE_FIXED(NAME, value, member, type, ELEM, array, max)                          \
    WIRE_FIXED_##NAME = 0u KVS_WIRE_##NAME##_FIELDS(WIRE_SIZE),                          \
    WIRE_ENTRY_##NAME = WIRE_BYTES_##ELEM,
enum { KVS_WIRE_MESSAGES(WIRE_FIXED) };
#undef WIRE_FIXED

/* The largest message of each type fits a control message. */
#define WIRE_FITS(NAME, value, member, type, ELEM, array, max)                           \
    _Static_assert(KVS_WIRE_HEADER_BYTES + WIRE_FIXED_##NAME + (max)*WIRE_ENTRY_##NAME <= \
                       KVS_CONTROL_MSG_MAX_BYTES,                                        \
                   #NAME " must fit a control message");
KVS_WIRE_MESSAGES(WIRE_FITS)
#undef WIRE_FITS
_Static_assert(KVS_WIRE_HEADER_BYTES == 4u + 2u + 2u + 4u + 4u + 8u, "header layout");
_Static_assert(KVS_MSG_TYPE_MAX <= 0xFFFF, "type travels as a u16");
#define WIRE_COUNT(NAME, value, member, type, ELEM, array, max) +1
_Static_assert(KVS_MSG_TYPE_MAX == 0 KVS_WIRE_MESSAGES(WIRE_COUNT),
               "message types run 1..KVS_MSG_TYPE_MAX without a gap");
#undef WIRE_COUNT

/* ---- cursors ------------------------------------------------------------ */

/* Both cursors run over a span whose length was checked beforehand; the
 * asserts catch a size table that disagrees with the field lists. */
typedef struct wire_writer {
    uint8_t *buf;
    uint32_t pos, end;
} wire_writer_t;

typedef struct wire_reader {
    const uint8_t *buf;
    uint32_t pos, end;
} wire_reader_t;

static void wire_put_u8(wire_writer_t *w, uint8_t v)
{
    assert(w->end - w->pos >= 1u);
    w->buf[w->pos++] = v;
}

static void wire_put_u16(wire_writer_t *w, uint16_t v)
{
    assert(w->end - w->pos >= 2u);
    w->buf[w->pos + 0] = (uint8_t)(v & 0xFFu);
    w->buf[w->pos + 1] = (uint8_t)(v >> 8);
    w->pos += 2u;
}

/* Straight-line byte stores, no loop: the coverage-instrumented fuzz
 * builds paid a traced compare per byte, most of fuzz_link's time. */
static void wire_put_u32(wire_writer_t *w, uint32_t v)
{
    assert(w->end - w->pos >= 4u);
    uint8_t *b = w->buf + w->pos;
    b[0] = (uint8_t)(v & 0xFFu);
    b[1] = (uint8_t)((v >> 8) & 0xFFu);
    b[2] = (uint8_t)((v >> 16) & 0xFFu);
    b[3] = (uint8_t)(v >> 24);
    w->pos += 4u;
}

static void wire_put_u64(wire_writer_t *w, uint64_t v)
{
    wire_put_u32(w, (uint32_t)(v & 0xFFFFFFFFu));
    wire_put_u32(w, (uint32_t)(v >> 32));
}

/* Signed values travel as their two's complement bit pattern; the
 * conversion to unsigned is defined by C for every value. */
static void wire_put_i32(wire_writer_t *w, int32_t v) { wire_put_u32(w, (uint32_t)v); }
static void wire_put_i64(wire_writer_t *w, int64_t v) { wire_put_u64(w, (uint64_t)v); }

static uint8_t wire_get_u8(wire_reader_t *r)
{
    assert(r->end - r->pos >= 1u);
    return r->buf[r->pos++];
}

static uint16_t wire_get_u16(wire_reader_t *r)
{
    assert(r->end - r->pos >= 2u);
    uint16_t v = (uint16_t)(r->buf[r->pos] | ((uint16_t)r->buf[r->pos + 1] << 8));
    r->pos += 2u;
    return v;
}

static uint32_t wire_get_u32(wire_reader_t *r)
{
    assert(r->end - r->pos >= 4u);
    const uint8_t *b = r->buf + r->pos;
    r->pos += 4u;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint64_t wire_get_u64(wire_reader_t *r)
{
    const uint64_t lo = wire_get_u32(r);
    return lo | (uint64_t)wire_get_u32(r) << 32;
}

/* Unsigned to signed without implementation-defined conversions. */
static int32_t wire_get_i32(wire_reader_t *r)
{
    uint32_t u = wire_get_u32(r);
    if (u <= (uint32_t)INT32_MAX)
        return (int32_t)u;
    return -(int32_t)(~u) - 1;
}

static int64_t wire_get_i64(wire_reader_t *r)
{
    uint64_t u = wire_get_u64(r);
    if (u <= (uint64_t)INT64_MAX)
        return (int64_t)u;
    return -(int64_t)(~u) - 1;
}

/* ---- sizes -------------------------------------------------------------- */

/* Payload bytes of a message of `type` carrying `count` entries (counted
 * types; ignored otherwise), or 0 for an unknown type. count must already be
 * within its bound, so the products cannot overflow. */
static uint32_t wire_payload_bytes(uint32_t type, uint32_t count)
{
    switch (type) {
#define WIRE_PAYLOAD(NAME, value, member, type, ELEM, array, max)                        \
    case KVS_MSG_##NAME:                                                                 \
        assert(WIRE_ENTRY_##NAME == 0 || count <= (max));                                \
        return WIRE_FIXED_##NAME + (WIRE_ENTRY_##NAME > 0 ? count * WIRE_ENTRY_##NAME : 0u);
        KVS_WIRE_MESSAGES(WIRE_PAYLOAD)
#undef WIRE_PAYLOAD
    default:
        return 0;
    }
}

/* The entry count of a counted message, 0 for the others. */
static uint32_t wire_count(const kvs_msg_t *msg)
{
    switch (msg->type) {
    case KVS_MSG_LAYERS:
        return msg->u.layers.count;
    case KVS_MSG_PAGES:
        return msg->u.pages.count;
    case KVS_MSG_AUX:
        return msg->u.aux.count;
    default:
        return 0;
    }
}

/* The bound of a counted message's entries, 0 for the others. */
static uint32_t wire_count_max(uint32_t type)
{
    switch (type) {
#define WIRE_MAX(NAME, value, member, type, ELEM, array, max)                            \
    case KVS_MSG_##NAME:                                                                 \
        return (max);
        KVS_WIRE_MESSAGES(WIRE_MAX)
#undef WIRE_MAX
    default:
        return 0;
    }
}

static void wire_put_b32(wire_writer_t *w, kvs_b32_t v)
{
    assert(w->end - w->pos >= WIRE_BYTES_b32);
    memcpy(w->buf + w->pos, v.b, WIRE_BYTES_b32);
    w->pos += WIRE_BYTES_b32;
}

static kvs_b32_t wire_get_b32(wire_reader_t *r)
{
    assert(r->end - r->pos >= WIRE_BYTES_b32);
    kvs_b32_t v;
    memcpy(v.b, r->buf + r->pos, WIRE_BYTES_b32);
    r->pos += WIRE_BYTES_b32;
    return v;
}

/* ---- the composite kinds -------------------------------------------------- */

/* Field by field, in list order: of a value v (the composite kinds) or
 * through a pointer p (the messages). */
#define WIRE_PUT_FIELD(kind, name) wire_put_##kind(w, v.name);
#define WIRE_GET_FIELD(kind, name) v.name = wire_get_##kind(r);
#define WIRE_PUT_MSG_FIELD(kind, name) wire_put_##kind(w, p->name);
#define WIRE_GET_MSG_FIELD(kind, name) p->name = wire_get_##kind(r);

static void wire_put_fp(wire_writer_t *w, kvs_fingerprint_t v)
{
    KVS_WIRE_FP_FIELDS(WIRE_PUT_FIELD)
}

static kvs_fingerprint_t wire_get_fp(wire_reader_t *r)
{
    kvs_fingerprint_t v;
    KVS_WIRE_FP_FIELDS(WIRE_GET_FIELD)
    return v;
}

static void wire_put_layer(wire_writer_t *w, kvs_layer_entry_t v)
{
    KVS_WIRE_LAYER_FIELDS(WIRE_PUT_FIELD)
}

static kvs_layer_entry_t wire_get_layer(wire_reader_t *r)
{
    kvs_layer_entry_t v;
    KVS_WIRE_LAYER_FIELDS(WIRE_GET_FIELD)
    return v;
}

/* ---- encode ------------------------------------------------------------- */

#define WIRE_PUT_ARRAY_none(array)
#define WIRE_PUT_ARRAY_u8(array)                                                         \
    for (uint32_t i = 0; i < p->count; i++)                                              \
        wire_put_u8(w, p->array[i]);
#define WIRE_PUT_ARRAY_i64(array)                                                        \
    for (uint32_t i = 0; i < p->count; i++)                                              \
        wire_put_i64(w, p->array[i]);
#define WIRE_PUT_ARRAY_layer(array)                                                      \
    for (uint32_t i = 0; i < p->count; i++)                                              \
        wire_put_layer(w, p->array[i]);

static void wire_put_payload(wire_writer_t *w, const kvs_msg_t *msg)
{
    switch (msg->type) {
#define WIRE_ENCODE(NAME, value, member, type, ELEM, array, max)                         \
    case KVS_MSG_##NAME: {                                                               \
        const kvs_msg_##type##_t *p = &msg->u.member;                                    \
        KVS_WIRE_##NAME##_FIELDS(WIRE_PUT_MSG_FIELD) WIRE_PUT_ARRAY_##ELEM(array) break; \
    }
        KVS_WIRE_MESSAGES(WIRE_ENCODE)
#undef WIRE_ENCODE
    default:
        assert(0 && "type validated by the caller");
        break;
    }
}

/*
 * Borrows msg and buf for the call. On KVS_ERANGE *out_len gets the length
 * the message needs (so a caller can size its buffer); on KVS_EINVAL it is
 * left alone. buf may be NULL only with cap 0.
 */
int kvs__wire_encode(const kvs_msg_t *msg, uint8_t *buf, uint32_t cap, uint32_t *out_len)
{
    if (msg == NULL || out_len == NULL || (buf == NULL && cap != 0))
        return KVS_EINVAL;

    const uint32_t type = (uint32_t)msg->type;
    const uint32_t count = wire_count(msg);
    if (count > wire_count_max(type))
        return KVS_EINVAL;
    const uint32_t payload = wire_payload_bytes(type, count);
    if (payload == 0)
        return KVS_EINVAL;

    const uint32_t total = KVS_WIRE_HEADER_BYTES + payload;
    assert(total <= KVS_CONTROL_MSG_MAX_BYTES);
    if (cap < total) {
        *out_len = total;
        return KVS_ERANGE;
    }

    wire_writer_t w = {.buf = buf, .pos = 0, .end = total};
    wire_put_u32(&w, KVS_WIRE_MAGIC);
    wire_put_u16(&w, (uint16_t)KVS_WIRE_VERSION);
    wire_put_u16(&w, (uint16_t)type);
    wire_put_u32(&w, payload);
    wire_put_u32(&w, msg->seq);
    wire_put_u64(&w, msg->session);
    wire_put_payload(&w, msg);
    assert(w.pos == total);
    *out_len = total;
    return KVS_OK;
}

/* ---- decode ------------------------------------------------------------- */

#define WIRE_GET_ARRAY_none(array)
#define WIRE_GET_ARRAY_u8(array)                                                         \
    for (uint32_t i = 0; i < p->count; i++)                                              \
        p->array[i] = wire_get_u8(r);
#define WIRE_GET_ARRAY_i64(array)                                                        \
    for (uint32_t i = 0; i < p->count; i++)                                              \
        p->array[i] = wire_get_i64(r);
#define WIRE_GET_ARRAY_layer(array)                                                      \
    for (uint32_t i = 0; i < p->count; i++)                                              \
        p->array[i] = wire_get_layer(r);
/* A counted message's count is read with its fixed fields; the payload must
 * then be exactly that many entries long. */
#define WIRE_CHECK_COUNT_none(NAME, max)
#define WIRE_CHECK_COUNT_u8(NAME, max) WIRE_CHECK_COUNT(NAME, max)
#define WIRE_CHECK_COUNT_i64(NAME, max) WIRE_CHECK_COUNT(NAME, max)
#define WIRE_CHECK_COUNT_layer(NAME, max) WIRE_CHECK_COUNT(NAME, max)
#define WIRE_CHECK_COUNT(NAME, max)                                                      \
    if (p->count > (max) || payload != wire_payload_bytes(KVS_MSG_##NAME, p->count))     \
        return KVS_EPROTO;

/* Reads the payload of a message whose type is valid and whose payload
 * holds at least its fixed fields; only a counted message can still fail
 * (its count). *m is zeroed by the caller, so entries past a count are
 * zero. */
static int wire_get_payload(wire_reader_t *r, uint32_t type, kvs_msg_t *m)
{
    const uint32_t payload = r->end - r->pos;
    switch (type) {
#define WIRE_DECODE(NAME, value, member, type, ELEM, array, max)                         \
    case KVS_MSG_##NAME: {                                                               \
        kvs_msg_##type##_t *p = &m->u.member;                                            \
        KVS_WIRE_##NAME##_FIELDS(WIRE_GET_MSG_FIELD)                                     \
        WIRE_CHECK_COUNT_##ELEM(NAME, max)                                               \
        WIRE_GET_ARRAY_##ELEM(array) break;                                              \
    }
        KVS_WIRE_MESSAGES(WIRE_DECODE)
#undef WIRE_DECODE
    default:
        return KVS_EPROTO;
    }
    /* The size checks made the payload exactly this message's fields. */
    assert(r->pos == r->end);
    return KVS_OK;
}

/*
 * Borrows buf for the call (read only, len bytes; contents are hostile).
 * On success *msg is overwritten whole: entries past a LAYERS/PAGES count are
 * zero. On any failure *msg is untouched. A NULL msg, or a NULL buf with a
 * nonzero len, is the caller's bug (KVS_EINVAL).
 */
int kvs__wire_decode(const uint8_t *buf, uint32_t len, kvs_msg_t *msg)
{
    if (msg == NULL || (buf == NULL && len != 0))
        return KVS_EINVAL;
    if (len < KVS_WIRE_HEADER_BYTES)
        return KVS_EPROTO;

    wire_reader_t r = {.buf = buf, .pos = 0, .end = len};
    const uint32_t magic = wire_get_u32(&r);
    const uint16_t version = wire_get_u16(&r);
    const uint16_t type = wire_get_u16(&r);
    const uint32_t payload = wire_get_u32(&r);
    const uint32_t seq = wire_get_u32(&r);
    const uint64_t session = wire_get_u64(&r);
    if (magic != KVS_WIRE_MAGIC || version != KVS_WIRE_VERSION)
        return KVS_EPROTO;
    if (type < 1 || type > KVS_MSG_TYPE_MAX)
        return KVS_EPROTO;
    if (payload != len - KVS_WIRE_HEADER_BYTES)
        return KVS_EPROTO;
    /* Fixed types: the exact size. Counted types: at least the fixed part
     * here; the exact size for the count is checked once count is read. */
    const uint32_t fixed = wire_payload_bytes(type, 0);
    if (wire_count_max(type) == 0 ? payload != fixed : payload < fixed)
        return KVS_EPROTO;

    kvs_msg_t local;
    memset(&local, 0, sizeof local);
    local.type = (kvs_msg_type_t)type;
    local.seq = seq;
    local.session = session;
    int rc = wire_get_payload(&r, type, &local);
    if (rc != KVS_OK)
        return rc;
    *msg = local;
    return KVS_OK;
}

const char *kvs__wire_type_name(kvs_msg_type_t type)
{
    switch (type) {
#define WIRE_NAME(NAME, value, member, type, ELEM, array, max)                           \
    case KVS_MSG_##NAME:                                                                 \
        return #NAME;
        KVS_WIRE_MESSAGES(WIRE_NAME)
#undef WIRE_NAME
    default:
        return "UNKNOWN";
    }
}
