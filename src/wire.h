/*
 * wire.h (internal) - the control messages of the staging protocol (spec §7)
 * and their byte encoding: little-endian, fixed-width fields, a common
 * header (magic, version, type, length) and a bounded payload. Decoding never
 * trusts the peer: every length and count is checked against the buffer and
 * the protocol's own bounds before a field is read (KVS_EPROTO otherwise).
 *
 * Encoding and decoding are pure functions on caller buffers; nothing is
 * allocated. Range checks that need state (is this room known, is this
 * offset inside my ring) are the handlers' job.
 */
#ifndef KVS_SRC_WIRE_H
#define KVS_SRC_WIRE_H

#include <kvstage/backend.h>

#define KVS_WIRE_MAGIC 0x4B565354u /* "KVST" */
#define KVS_WIRE_VERSION 3u
#define KVS_WIRE_HEADER_BYTES 16u
/* Layers per LAYERS message and page ids per PAGES message, so a message
 * always fits KVS_CONTROL_MSG_MAX_BYTES. */
#define KVS_WIRE_LAYERS_PER_MSG 96u
#define KVS_WIRE_PAGES_PER_MSG 480u

typedef enum kvs_msg_type {
    KVS_MSG_REGISTER = 1,    /* decode -> prefill: geometry, ring, fingerprint */
    KVS_MSG_LAYERS = 2,      /* decode -> prefill: KV layer bases + keys (direct/slice) */
    KVS_MSG_REGISTER_ACK = 3,/* prefill -> decode: accepted or refused (status) */
    KVS_MSG_ROOM = 4,        /* decode -> prefill: a request's decode side */
    KVS_MSG_PAGES = 5,       /* decode -> prefill: decode page ids (direct/slice) */
    KVS_MSG_STAGING_REQ = 6, /* prefill -> decode: allocate a region for a chunk */
    KVS_MSG_STAGING_RSP = 7, /* decode -> prefill: region or OVERSIZED */
    KVS_MSG_CHUNK_READY = 8, /* prefill -> decode: a writer's bytes landed */
    KVS_MSG_WATERMARK = 9,   /* decode -> prefill: oldest live ring position */
    KVS_MSG_STATUS = 10,     /* prefill -> decode: this rank's result for a room */
    KVS_MSG_ABORT = 11,      /* either way: the room failed, release it */
    KVS_MSG_ACK = 12,        /* either way: link-level receipt (link.c), never
                                itself acknowledged */
    KVS_MSG_TYPE_MAX = 12
} kvs_msg_type_t;

/* The compatibility fingerprint (spec §7.1): both sides must agree. */
typedef struct kvs_fingerprint {
    uint32_t protocol_version;
    uint32_t staging;          /* 0 or 1 */
    int64_t total_heads, head_dim, layers, page_size, chunk_tokens;
    int64_t prefill_tp, decode_tp, prefill_pp, decode_pp; /* the layout's four sizes */
    uint32_t dtype;
    uint32_t app_tag;          /* kvs_manager_config_t.app_tag */
} kvs_fingerprint_t;

typedef struct kvs_msg_register {
    uint64_t session;          /* decode incarnation; a new one resets state */
    int64_t tp_rank, tp_size, pp_rank, pp_size;
    kvs_fingerprint_t fp;
    uint64_t ring_addr, ring_bytes, ring_rkey; /* 0 when staging is off */
    int64_t local_heads, num_pages;
    int64_t layers_total;      /* LAYERS entries that follow (0 for staging) */
} kvs_msg_register_t;

typedef struct kvs_layer_entry {
    uint64_t k_addr, k_rkey, v_addr, v_rkey;
} kvs_layer_entry_t;

typedef struct kvs_msg_layers {
    uint64_t session;
    int64_t first;             /* index of entries[0] */
    uint32_t count;            /* <= KVS_WIRE_LAYERS_PER_MSG */
    kvs_layer_entry_t entries[KVS_WIRE_LAYERS_PER_MSG];
} kvs_msg_layers_t;

typedef struct kvs_msg_register_ack {
    uint64_t session;          /* echoed */
    int64_t tp_rank, pp_rank;  /* of the prefill rank answering */
    int32_t status;            /* KVS_OK or why it refused */
    uint32_t reserved;
    uint64_t prefill_session;
    kvs_fingerprint_t fp;      /* the prefill's: a refused decode names the field */
} kvs_msg_register_ack_t;

typedef struct kvs_msg_room {
    uint64_t session, room;
    int64_t base_tokens;       /* decode's cached prefix (page aligned) */
    int64_t total_tokens;      /* end of the request */
    int64_t num_pages;         /* decode pages of the suffix; PAGES follow
                                  when the path writes pages directly */
} kvs_msg_room_t;

typedef struct kvs_msg_pages {
    uint64_t session, room;
    int64_t first;
    uint32_t count;            /* <= KVS_WIRE_PAGES_PER_MSG */
    int64_t ids[KVS_WIRE_PAGES_PER_MSG];
} kvs_msg_pages_t;

typedef struct kvs_msg_staging_req {
    uint64_t session;          /* prefill session */
    uint64_t room;
    int64_t chunk, pages, tokens;
    int64_t writer, stage;     /* TP writer index, prefill PP stage */
} kvs_msg_staging_req_t;

typedef struct kvs_msg_staging_rsp {
    uint64_t session;          /* decode session */
    uint64_t room;
    int64_t chunk;
    int32_t status;            /* KVS_OK, KVS_EOVERSIZED, ... */
    uint32_t reserved;
    uint64_t offset, round, end;
} kvs_msg_staging_rsp_t;

typedef struct kvs_msg_chunk_ready {
    uint64_t session;          /* prefill session */
    uint64_t room;
    int64_t chunk, page_start, pages;
    int64_t writer, stage;
} kvs_msg_chunk_ready_t;

typedef struct kvs_msg_watermark {
    uint64_t session;          /* decode session */
    uint64_t round, offset;
} kvs_msg_watermark_t;

typedef struct kvs_msg_status {
    uint64_t session, room;
    int64_t tp_rank, pp_rank;
    int32_t status;
    uint32_t reserved;
    int64_t chunks;            /* chunks this rank sent */
} kvs_msg_status_t;

typedef struct kvs_msg_abort {
    uint64_t session, room;
    int32_t status;            /* why */
    uint32_t reserved;
} kvs_msg_abort_t;

/* Link-level receipt: every message of the connection up to and including
 * sequence `cum` arrived, in order (link.c). */
typedef struct kvs_msg_ack {
    uint32_t cum;
    uint32_t reserved;
} kvs_msg_ack_t;

typedef struct kvs_msg {
    kvs_msg_type_t type;
    uint32_t seq;              /* link sequence number; 0 = not sequenced (ACK) */
    union {
        kvs_msg_register_t reg;
        kvs_msg_layers_t layers;
        kvs_msg_register_ack_t ack;
        kvs_msg_room_t room;
        kvs_msg_pages_t pages;
        kvs_msg_staging_req_t req;
        kvs_msg_staging_rsp_t rsp;
        kvs_msg_chunk_ready_t ready;
        kvs_msg_watermark_t wm;
        kvs_msg_status_t status;
        kvs_msg_abort_t abort;
        kvs_msg_ack_t ack_link;
    } u;
} kvs_msg_t;

/* Encodes msg into buf (cap bytes); *out_len gets the length. KVS_EINVAL for
 * an unknown type or counts over their bound, KVS_ERANGE if cap is short. */
int kvs__wire_encode(const kvs_msg_t *msg, uint8_t *buf, uint32_t cap, uint32_t *out_len);
/* Decodes len bytes; KVS_EPROTO for anything malformed (bad magic, version,
 * type, length, count). *msg is fully written on success only. */
int kvs__wire_decode(const uint8_t *buf, uint32_t len, kvs_msg_t *msg);
const char *kvs__wire_type_name(kvs_msg_type_t type);

#endif
