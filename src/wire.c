/*
 * wire.c - the byte encoding of the staging protocol's control messages
 * (spec §7), declared in wire.h.
 *
 * Format: a 16-byte header (magic u32, version u16, type u16, payload length
 * u32, link sequence number u32) and then the fields of the message struct in declaration order, each
 * integer little-endian at its own width, written with explicit shifts (no
 * struct memcpy, no padding on the wire). LAYERS carries `count` layer entries
 * after session, first, count; PAGES carries `count` page ids after session,
 * room, first, count. Every other type has one fixed payload length.
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

/* Payload bytes of each message (header excluded). */
#define WIRE_FP_BYTES (4u + 4u + 9u * 8u + 4u + 4u)
#define WIRE_REGISTER_BYTES (8u + 4u * 8u + WIRE_FP_BYTES + 3u * 8u + 2u * 8u + 8u)
#define WIRE_LAYERS_FIXED_BYTES (8u + 8u + 4u)
#define WIRE_LAYER_ENTRY_BYTES (4u * 8u)
#define WIRE_REGISTER_ACK_BYTES (8u + 2u * 8u + 4u + 4u + 8u + WIRE_FP_BYTES)
#define WIRE_ROOM_BYTES (2u * 8u + 3u * 8u)
#define WIRE_PAGES_FIXED_BYTES (8u + 8u + 8u + 4u)
#define WIRE_PAGE_ID_BYTES 8u
#define WIRE_STAGING_REQ_BYTES (2u * 8u + 5u * 8u)
#define WIRE_STAGING_RSP_BYTES (2u * 8u + 8u + 4u + 4u + 3u * 8u)
#define WIRE_CHUNK_READY_BYTES (2u * 8u + 5u * 8u)
#define WIRE_WATERMARK_BYTES (3u * 8u)
#define WIRE_STATUS_BYTES (2u * 8u + 2u * 8u + 4u + 4u + 8u)
#define WIRE_ABORT_BYTES (2u * 8u + 4u + 4u)
#define WIRE_ACK_BYTES (4u + 4u)

_Static_assert(KVS_WIRE_HEADER_BYTES + WIRE_LAYERS_FIXED_BYTES +
                       KVS_WIRE_LAYERS_PER_MSG * WIRE_LAYER_ENTRY_BYTES <=
                   KVS_CONTROL_MSG_MAX_BYTES,
               "the largest LAYERS message must fit a control message");
_Static_assert(KVS_WIRE_HEADER_BYTES + WIRE_PAGES_FIXED_BYTES +
                       KVS_WIRE_PAGES_PER_MSG * WIRE_PAGE_ID_BYTES <=
                   KVS_CONTROL_MSG_MAX_BYTES,
               "the largest PAGES message must fit a control message");
_Static_assert(KVS_WIRE_HEADER_BYTES + WIRE_REGISTER_BYTES <= KVS_CONTROL_MSG_MAX_BYTES,
               "REGISTER must fit a control message");
_Static_assert(KVS_WIRE_HEADER_BYTES == 4u + 2u + 2u + 4u + 4u, "header layout");
_Static_assert(KVS_MSG_TYPE_MAX <= 0xFFFF, "type travels as a u16");

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

static void wire_put_u16(wire_writer_t *w, uint16_t v)
{
    assert(w->end - w->pos >= 2u);
    w->buf[w->pos + 0] = (uint8_t)(v & 0xFFu);
    w->buf[w->pos + 1] = (uint8_t)(v >> 8);
    w->pos += 2u;
}

static void wire_put_u32(wire_writer_t *w, uint32_t v)
{
    assert(w->end - w->pos >= 4u);
    for (unsigned i = 0; i < 4u; i++)
        w->buf[w->pos + i] = (uint8_t)((v >> (8u * i)) & 0xFFu);
    w->pos += 4u;
}

static void wire_put_u64(wire_writer_t *w, uint64_t v)
{
    assert(w->end - w->pos >= 8u);
    for (unsigned i = 0; i < 8u; i++)
        w->buf[w->pos + i] = (uint8_t)((v >> (8u * i)) & 0xFFu);
    w->pos += 8u;
}

/* Signed values travel as their two's complement bit pattern; the
 * conversion to unsigned is defined by C for every value. */
static void wire_put_i32(wire_writer_t *w, int32_t v) { wire_put_u32(w, (uint32_t)v); }
static void wire_put_i64(wire_writer_t *w, int64_t v) { wire_put_u64(w, (uint64_t)v); }

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
    uint32_t v = 0;
    for (unsigned i = 0; i < 4u; i++)
        v |= (uint32_t)r->buf[r->pos + i] << (8u * i);
    r->pos += 4u;
    return v;
}

static uint64_t wire_get_u64(wire_reader_t *r)
{
    assert(r->end - r->pos >= 8u);
    uint64_t v = 0;
    for (unsigned i = 0; i < 8u; i++)
        v |= (uint64_t)r->buf[r->pos + i] << (8u * i);
    r->pos += 8u;
    return v;
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

/* Payload bytes of a message of `type` carrying `count` entries (LAYERS,
 * PAGES; ignored otherwise), or 0 for an unknown type. count must already be
 * within its bound, so the products cannot overflow. */
static uint32_t wire_payload_bytes(uint32_t type, uint32_t count)
{
    switch (type) {
    case KVS_MSG_REGISTER:
        return WIRE_REGISTER_BYTES;
    case KVS_MSG_LAYERS:
        assert(count <= KVS_WIRE_LAYERS_PER_MSG);
        return WIRE_LAYERS_FIXED_BYTES + count * WIRE_LAYER_ENTRY_BYTES;
    case KVS_MSG_REGISTER_ACK:
        return WIRE_REGISTER_ACK_BYTES;
    case KVS_MSG_ROOM:
        return WIRE_ROOM_BYTES;
    case KVS_MSG_PAGES:
        assert(count <= KVS_WIRE_PAGES_PER_MSG);
        return WIRE_PAGES_FIXED_BYTES + count * WIRE_PAGE_ID_BYTES;
    case KVS_MSG_STAGING_REQ:
        return WIRE_STAGING_REQ_BYTES;
    case KVS_MSG_STAGING_RSP:
        return WIRE_STAGING_RSP_BYTES;
    case KVS_MSG_CHUNK_READY:
        return WIRE_CHUNK_READY_BYTES;
    case KVS_MSG_WATERMARK:
        return WIRE_WATERMARK_BYTES;
    case KVS_MSG_STATUS:
        return WIRE_STATUS_BYTES;
    case KVS_MSG_ABORT:
        return WIRE_ABORT_BYTES;
    case KVS_MSG_ACK:
        return WIRE_ACK_BYTES;
    default:
        return 0;
    }
}

/* ---- encode ------------------------------------------------------------- */

static void wire_put_fingerprint(wire_writer_t *w, const kvs_fingerprint_t *fp)
{
    wire_put_u32(w, fp->protocol_version);
    wire_put_u32(w, fp->staging);
    wire_put_i64(w, fp->total_heads);
    wire_put_i64(w, fp->head_dim);
    wire_put_i64(w, fp->layers);
    wire_put_i64(w, fp->page_size);
    wire_put_i64(w, fp->chunk_tokens);
    wire_put_i64(w, fp->prefill_tp);
    wire_put_i64(w, fp->decode_tp);
    wire_put_i64(w, fp->prefill_pp);
    wire_put_i64(w, fp->decode_pp);
    wire_put_u32(w, fp->dtype);
    wire_put_u32(w, fp->app_tag);
}

static void wire_put_payload(wire_writer_t *w, const kvs_msg_t *msg)
{
    switch (msg->type) {
    case KVS_MSG_REGISTER: {
        const kvs_msg_register_t *m = &msg->u.reg;
        wire_put_u64(w, m->session);
        wire_put_i64(w, m->tp_rank);
        wire_put_i64(w, m->tp_size);
        wire_put_i64(w, m->pp_rank);
        wire_put_i64(w, m->pp_size);
        wire_put_fingerprint(w, &m->fp);
        wire_put_u64(w, m->ring_addr);
        wire_put_u64(w, m->ring_bytes);
        wire_put_u64(w, m->ring_rkey);
        wire_put_i64(w, m->local_heads);
        wire_put_i64(w, m->num_pages);
        wire_put_i64(w, m->layers_total);
        break;
    }
    case KVS_MSG_LAYERS: {
        const kvs_msg_layers_t *m = &msg->u.layers;
        wire_put_u64(w, m->session);
        wire_put_i64(w, m->first);
        wire_put_u32(w, m->count);
        for (uint32_t i = 0; i < m->count; i++) {
            wire_put_u64(w, m->entries[i].k_addr);
            wire_put_u64(w, m->entries[i].k_rkey);
            wire_put_u64(w, m->entries[i].v_addr);
            wire_put_u64(w, m->entries[i].v_rkey);
        }
        break;
    }
    case KVS_MSG_REGISTER_ACK: {
        const kvs_msg_register_ack_t *m = &msg->u.ack;
        wire_put_u64(w, m->session);
        wire_put_i64(w, m->tp_rank);
        wire_put_i64(w, m->pp_rank);
        wire_put_i32(w, m->status);
        wire_put_u32(w, m->reserved);
        wire_put_u64(w, m->prefill_session);
        wire_put_fingerprint(w, &m->fp);
        break;
    }
    case KVS_MSG_ROOM: {
        const kvs_msg_room_t *m = &msg->u.room;
        wire_put_u64(w, m->session);
        wire_put_u64(w, m->room);
        wire_put_i64(w, m->base_tokens);
        wire_put_i64(w, m->total_tokens);
        wire_put_i64(w, m->num_pages);
        break;
    }
    case KVS_MSG_PAGES: {
        const kvs_msg_pages_t *m = &msg->u.pages;
        wire_put_u64(w, m->session);
        wire_put_u64(w, m->room);
        wire_put_i64(w, m->first);
        wire_put_u32(w, m->count);
        for (uint32_t i = 0; i < m->count; i++)
            wire_put_i64(w, m->ids[i]);
        break;
    }
    case KVS_MSG_STAGING_REQ: {
        const kvs_msg_staging_req_t *m = &msg->u.req;
        wire_put_u64(w, m->session);
        wire_put_u64(w, m->room);
        wire_put_i64(w, m->chunk);
        wire_put_i64(w, m->pages);
        wire_put_i64(w, m->tokens);
        wire_put_i64(w, m->writer);
        wire_put_i64(w, m->stage);
        break;
    }
    case KVS_MSG_STAGING_RSP: {
        const kvs_msg_staging_rsp_t *m = &msg->u.rsp;
        wire_put_u64(w, m->session);
        wire_put_u64(w, m->room);
        wire_put_i64(w, m->chunk);
        wire_put_i32(w, m->status);
        wire_put_u32(w, m->reserved);
        wire_put_u64(w, m->offset);
        wire_put_u64(w, m->round);
        wire_put_u64(w, m->end);
        break;
    }
    case KVS_MSG_CHUNK_READY: {
        const kvs_msg_chunk_ready_t *m = &msg->u.ready;
        wire_put_u64(w, m->session);
        wire_put_u64(w, m->room);
        wire_put_i64(w, m->chunk);
        wire_put_i64(w, m->page_start);
        wire_put_i64(w, m->pages);
        wire_put_i64(w, m->writer);
        wire_put_i64(w, m->stage);
        break;
    }
    case KVS_MSG_WATERMARK: {
        const kvs_msg_watermark_t *m = &msg->u.wm;
        wire_put_u64(w, m->session);
        wire_put_u64(w, m->round);
        wire_put_u64(w, m->offset);
        break;
    }
    case KVS_MSG_STATUS: {
        const kvs_msg_status_t *m = &msg->u.status;
        wire_put_u64(w, m->session);
        wire_put_u64(w, m->room);
        wire_put_i64(w, m->tp_rank);
        wire_put_i64(w, m->pp_rank);
        wire_put_i32(w, m->status);
        wire_put_u32(w, m->reserved);
        wire_put_i64(w, m->chunks);
        break;
    }
    case KVS_MSG_ABORT: {
        const kvs_msg_abort_t *m = &msg->u.abort;
        wire_put_u64(w, m->session);
        wire_put_u64(w, m->room);
        wire_put_i32(w, m->status);
        wire_put_u32(w, m->reserved);
        break;
    }
    case KVS_MSG_ACK:
        wire_put_u32(w, msg->u.ack_link.cum);
        wire_put_u32(w, msg->u.ack_link.reserved);
        break;
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

    uint32_t type = (uint32_t)msg->type;
    uint32_t count = 0;
    if (type == KVS_MSG_LAYERS) {
        count = msg->u.layers.count;
        if (count > KVS_WIRE_LAYERS_PER_MSG)
            return KVS_EINVAL;
    } else if (type == KVS_MSG_PAGES) {
        count = msg->u.pages.count;
        if (count > KVS_WIRE_PAGES_PER_MSG)
            return KVS_EINVAL;
    }
    uint32_t payload = wire_payload_bytes(type, count);
    if (payload == 0)
        return KVS_EINVAL;

    uint32_t total = KVS_WIRE_HEADER_BYTES + payload;
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
    wire_put_payload(&w, msg);
    assert(w.pos == total);
    *out_len = total;
    return KVS_OK;
}

/* ---- decode ------------------------------------------------------------- */

static void wire_get_fingerprint(wire_reader_t *r, kvs_fingerprint_t *fp)
{
    fp->protocol_version = wire_get_u32(r);
    fp->staging = wire_get_u32(r);
    fp->total_heads = wire_get_i64(r);
    fp->head_dim = wire_get_i64(r);
    fp->layers = wire_get_i64(r);
    fp->page_size = wire_get_i64(r);
    fp->chunk_tokens = wire_get_i64(r);
    fp->prefill_tp = wire_get_i64(r);
    fp->decode_tp = wire_get_i64(r);
    fp->prefill_pp = wire_get_i64(r);
    fp->decode_pp = wire_get_i64(r);
    fp->dtype = wire_get_u32(r);
    fp->app_tag = wire_get_u32(r);
}

/* Reads the payload of a message whose type and payload length are known to
 * be valid; only LAYERS and PAGES can still fail (their count). */
static int wire_get_payload(wire_reader_t *r, uint32_t type, kvs_msg_t *m)
{
    uint32_t payload = r->end - r->pos;

    switch (type) {
    case KVS_MSG_REGISTER: {
        kvs_msg_register_t *p = &m->u.reg;
        p->session = wire_get_u64(r);
        p->tp_rank = wire_get_i64(r);
        p->tp_size = wire_get_i64(r);
        p->pp_rank = wire_get_i64(r);
        p->pp_size = wire_get_i64(r);
        wire_get_fingerprint(r, &p->fp);
        p->ring_addr = wire_get_u64(r);
        p->ring_bytes = wire_get_u64(r);
        p->ring_rkey = wire_get_u64(r);
        p->local_heads = wire_get_i64(r);
        p->num_pages = wire_get_i64(r);
        p->layers_total = wire_get_i64(r);
        break;
    }
    case KVS_MSG_LAYERS: {
        kvs_msg_layers_t *p = &m->u.layers;
        if (payload < WIRE_LAYERS_FIXED_BYTES)
            return KVS_EPROTO;
        p->session = wire_get_u64(r);
        p->first = wire_get_i64(r);
        p->count = wire_get_u32(r);
        if (p->count > KVS_WIRE_LAYERS_PER_MSG ||
            payload != wire_payload_bytes(type, p->count))
            return KVS_EPROTO;
        for (uint32_t i = 0; i < p->count; i++) {
            p->entries[i].k_addr = wire_get_u64(r);
            p->entries[i].k_rkey = wire_get_u64(r);
            p->entries[i].v_addr = wire_get_u64(r);
            p->entries[i].v_rkey = wire_get_u64(r);
        }
        break;
    }
    case KVS_MSG_REGISTER_ACK: {
        kvs_msg_register_ack_t *p = &m->u.ack;
        p->session = wire_get_u64(r);
        p->tp_rank = wire_get_i64(r);
        p->pp_rank = wire_get_i64(r);
        p->status = wire_get_i32(r);
        p->reserved = wire_get_u32(r);
        p->prefill_session = wire_get_u64(r);
        wire_get_fingerprint(r, &p->fp);
        break;
    }
    case KVS_MSG_ROOM: {
        kvs_msg_room_t *p = &m->u.room;
        p->session = wire_get_u64(r);
        p->room = wire_get_u64(r);
        p->base_tokens = wire_get_i64(r);
        p->total_tokens = wire_get_i64(r);
        p->num_pages = wire_get_i64(r);
        break;
    }
    case KVS_MSG_PAGES: {
        kvs_msg_pages_t *p = &m->u.pages;
        if (payload < WIRE_PAGES_FIXED_BYTES)
            return KVS_EPROTO;
        p->session = wire_get_u64(r);
        p->room = wire_get_u64(r);
        p->first = wire_get_i64(r);
        p->count = wire_get_u32(r);
        if (p->count > KVS_WIRE_PAGES_PER_MSG ||
            payload != wire_payload_bytes(type, p->count))
            return KVS_EPROTO;
        for (uint32_t i = 0; i < p->count; i++)
            p->ids[i] = wire_get_i64(r);
        break;
    }
    case KVS_MSG_STAGING_REQ: {
        kvs_msg_staging_req_t *p = &m->u.req;
        p->session = wire_get_u64(r);
        p->room = wire_get_u64(r);
        p->chunk = wire_get_i64(r);
        p->pages = wire_get_i64(r);
        p->tokens = wire_get_i64(r);
        p->writer = wire_get_i64(r);
        p->stage = wire_get_i64(r);
        break;
    }
    case KVS_MSG_STAGING_RSP: {
        kvs_msg_staging_rsp_t *p = &m->u.rsp;
        p->session = wire_get_u64(r);
        p->room = wire_get_u64(r);
        p->chunk = wire_get_i64(r);
        p->status = wire_get_i32(r);
        p->reserved = wire_get_u32(r);
        p->offset = wire_get_u64(r);
        p->round = wire_get_u64(r);
        p->end = wire_get_u64(r);
        break;
    }
    case KVS_MSG_CHUNK_READY: {
        kvs_msg_chunk_ready_t *p = &m->u.ready;
        p->session = wire_get_u64(r);
        p->room = wire_get_u64(r);
        p->chunk = wire_get_i64(r);
        p->page_start = wire_get_i64(r);
        p->pages = wire_get_i64(r);
        p->writer = wire_get_i64(r);
        p->stage = wire_get_i64(r);
        break;
    }
    case KVS_MSG_WATERMARK: {
        kvs_msg_watermark_t *p = &m->u.wm;
        p->session = wire_get_u64(r);
        p->round = wire_get_u64(r);
        p->offset = wire_get_u64(r);
        break;
    }
    case KVS_MSG_STATUS: {
        kvs_msg_status_t *p = &m->u.status;
        p->session = wire_get_u64(r);
        p->room = wire_get_u64(r);
        p->tp_rank = wire_get_i64(r);
        p->pp_rank = wire_get_i64(r);
        p->status = wire_get_i32(r);
        p->reserved = wire_get_u32(r);
        p->chunks = wire_get_i64(r);
        break;
    }
    case KVS_MSG_ABORT: {
        kvs_msg_abort_t *p = &m->u.abort;
        p->session = wire_get_u64(r);
        p->room = wire_get_u64(r);
        p->status = wire_get_i32(r);
        p->reserved = wire_get_u32(r);
        break;
    }
    case KVS_MSG_ACK:
        m->u.ack_link.cum = wire_get_u32(r);
        m->u.ack_link.reserved = wire_get_u32(r);
        break;
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
    uint32_t magic = wire_get_u32(&r);
    uint16_t version = wire_get_u16(&r);
    uint16_t type = wire_get_u16(&r);
    uint32_t payload = wire_get_u32(&r);
    uint32_t seq = wire_get_u32(&r);
    if (magic != KVS_WIRE_MAGIC || version != KVS_WIRE_VERSION)
        return KVS_EPROTO;
    if (type < KVS_MSG_REGISTER || type > KVS_MSG_TYPE_MAX)
        return KVS_EPROTO;
    if (payload != len - KVS_WIRE_HEADER_BYTES)
        return KVS_EPROTO;
    /* Fixed types: the exact size. Counted types: at least the fixed part
     * here; the exact size for the count is checked once count is read. */
    if (type != KVS_MSG_LAYERS && type != KVS_MSG_PAGES &&
        payload != wire_payload_bytes(type, 0))
        return KVS_EPROTO;

    kvs_msg_t local;
    memset(&local, 0, sizeof local);
    local.type = (kvs_msg_type_t)type;
    local.seq = seq;
    int rc = wire_get_payload(&r, type, &local);
    if (rc != KVS_OK)
        return rc;
    *msg = local;
    return KVS_OK;
}

const char *kvs__wire_type_name(kvs_msg_type_t type)
{
    switch (type) {
    case KVS_MSG_REGISTER:
        return "REGISTER";
    case KVS_MSG_LAYERS:
        return "LAYERS";
    case KVS_MSG_REGISTER_ACK:
        return "REGISTER_ACK";
    case KVS_MSG_ROOM:
        return "ROOM";
    case KVS_MSG_PAGES:
        return "PAGES";
    case KVS_MSG_STAGING_REQ:
        return "STAGING_REQ";
    case KVS_MSG_STAGING_RSP:
        return "STAGING_RSP";
    case KVS_MSG_CHUNK_READY:
        return "CHUNK_READY";
    case KVS_MSG_WATERMARK:
        return "WATERMARK";
    case KVS_MSG_STATUS:
        return "STATUS";
    case KVS_MSG_ABORT:
        return "ABORT";
    case KVS_MSG_ACK:
        return "ACK";
    default:
        return "UNKNOWN";
    }
}
