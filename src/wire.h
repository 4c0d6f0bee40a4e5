/*
 * wire.h (internal) - the control messages of the staging protocol (spec §7)
 * and their byte encoding: little-endian, fixed-width fields, a common
 * header (magic, version, type, length, link sequence number, the sender's
 * session) and a bounded payload. Decoding never trusts the peer: every
 * length and count is checked against the buffer and the protocol's own
 * bounds before a field is read (KVS_EPROTO otherwise).
 *
 * The message set is described once, below (KVS_WIRE_MESSAGES and the field
 * lists it names); the structs, the payload sizes, the encoder, the decoder
 * and the type names are generated from it, so adding a field is one line.
 *
 * Encoding and decoding are pure functions on caller buffers; nothing is
 * allocated. Range checks that need state (is this room known, is this
 * offset inside my ring) are the handlers' job.
 */
#ifndef KVS_SRC_WIRE_H
#define KVS_SRC_WIRE_H

#include <kvstage/backend.h>

#define KVS_WIRE_MAGIC 0x4B565354u /* "KVST" */
#define KVS_WIRE_VERSION 15u /* 6: HELLO, CHALLENGE, REGISTER's proof;
                               7: region-scoped keys (REGISTER's scoped_keys,
                               STAGING_RSP's rkey and rkey_v);
                               8: the fingerprint's kv_kind (MLA);
                               9: the fingerprint's prefill_page_size and
                               decode_page_size (different page sizes);
                               10: the fingerprint's kv_scales and
                               scale_block, LAYERS' scale buffers (FP8
                               KV with scales);
                               11: the fingerprint's prefill_cp,
                               REGISTER_ACK's cp_rank and cp_size (prefill
                               context parallelism);
                               12: the fingerprint's layer pattern
                               (hybrid models: window and state layers);
                               13: the fingerprint's draft_layers and
                               draft_head_dim (draft KV of speculative
                               decoding);
                               14: with fewer KV heads than prefill ranks,
                               one writer per distinct head (the replicas
                               report, as MLA's sources do);
                               15: with fewer state heads than prefill
                               ranks, one writer per distinct state head
                               (a hybrid model's state replicas report) */
/* magic u32, version u16, type u16, payload length u32, seq u32, session u64 */
#define KVS_WIRE_HEADER_BYTES 24u
/* Layers per LAYERS message and page ids per PAGES message, so a message
 * always fits KVS_CONTROL_MSG_MAX_BYTES. */
#define KVS_WIRE_LAYERS_PER_MSG 48u
#define KVS_WIRE_PAGES_PER_MSG 480u
/* Bytes of a request's aux payload per AUX message. */
#define KVS_WIRE_AUX_PER_MSG 4000u

/* ---- field kinds: a C type and a width on the wire each -------------------- */
#define KVS__WT_u8 uint8_t
#define KVS__WT_u32 uint32_t
#define KVS__WT_i32 int32_t
#define KVS__WT_u64 uint64_t
#define KVS__WT_i64 int64_t
#define KVS__WT_fp kvs_fingerprint_t
#define KVS__WT_layer kvs_layer_entry_t
#define KVS__WT_b32 kvs_b32_t
#define KVS__WIRE_DECL(kind, name) KVS__WT_##kind name;

/* 32 opaque bytes: a nonce or an HMAC-SHA-256 proof (auth.h). */
typedef struct kvs_b32 {
    uint8_t b[32];
} kvs_b32_t;

/* The compatibility fingerprint (spec §7.1, §12): the model shape (its KV
 * kind, heads and head dim: with MLA the latent dim), dtype and its scale
 * planes, both sides' page sizes, the prefill's context parallelism, the
 * layer pattern of a hybrid model, a draft model's layers, chunk size, the pair's resolved path and
 * application tag, and
 * the four sizes of the pair's layout as the sender sees them. */
#define KVS_WIRE_FP_FIELDS(F)                                                  \
    F(u32, protocol_version)                                                   \
    F(u32, staging) /* the pair's kvs_path_t */                                \
    F(u32, kv_kind) /* kvs_kv_kind_t: GQA 0, MLA 1 */                          \
    F(u32, reserved)                                                           \
    F(i64, total_heads) F(i64, head_dim) F(i64, layers)                        \
    F(i64, prefill_page_size) F(i64, decode_page_size) /* tokens per page of   \
                             each side, as the sender declared them */       \
    F(i64, chunk_tokens)                                                       \
    F(i64, prefill_tp) F(i64, decode_tp) F(i64, prefill_pp) F(i64, decode_pp)  \
    F(u32, dtype)                                                              \
    F(u32, app_tag) /* kvs_manager_config_t.app_tag */                      \
    F(u32, max_aux_bytes) /* kvs_manager_config_t.max_aux_bytes */           \
    F(u32, kv_scales)   /* kvs_kv_scales_t: none 0, per-token 1, per-block 2 */ \
    F(u32, scale_block) /* elements per scale (per-block), else 0 */          \
    F(i64, prefill_cp)  /* prefill context-parallel ranks (>= 1) */           \
    F(u32, full_attn_every) /* hybrid: every k-th layer full, else 0 */       \
    F(u32, other_layers)    /* kvs_layer_kind_t of the others */              \
    F(i64, window_tokens) F(i64, state_heads)                                  \
    F(i64, state_conv_bytes) F(i64, state_ssm_bytes)                          \
    F(i64, draft_layers) /* draft KV: 0 without a draft */                     \
    F(i64, draft_head_dim) /* after defaulting to head_dim; 0 without */
typedef struct kvs_fingerprint {
    KVS_WIRE_FP_FIELDS(KVS__WIRE_DECL)
} kvs_fingerprint_t;

/* A decode KV layer as the direct and slice paths write it: its K and V
 * buffers and, with kv_scales, their scale buffers (0 without). */
#define KVS_WIRE_LAYER_FIELDS(F)                                               \
    F(u64, k_addr) F(u64, k_rkey) F(u64, v_addr) F(u64, v_rkey)                \
    F(u64, ks_addr) F(u64, ks_rkey) F(u64, vs_addr) F(u64, vs_rkey)
typedef struct kvs_layer_entry {
    KVS_WIRE_LAYER_FIELDS(KVS__WIRE_DECL)
} kvs_layer_entry_t;

/* ---- the messages ------------------------------------------------------------
 * Every message's header carries the session id of the rank that sent it
 * (its incarnation), so a receiver finds the session without looking at
 * the payload.
 */
#define KVS_WIRE_REGISTER_FIELDS(F) /* decode -> prefill */                     \
    F(i64, tp_rank) F(i64, tp_size) F(i64, pp_rank) F(i64, pp_size)             \
    F(u64, instance)      /* the decode's instance (spec §12) */               \
    F(i64, dp_rank)       /* ... and its attention group in it */              \
    F(u64, peer_instance) /* the prefill instance it means to register with */ \
    F(i64, peer_dp_rank)  /* ... and that instance's attention group */       \
    F(fp, fp)                                                                   \
    F(u64, ring_addr) F(u64, ring_bytes) /* ring_bytes 0: staging off */       \
    F(u64, ring_rkey)     /* the whole ring's key; 0 when scoped_keys */       \
    F(u32, scoped_keys)   /* 1: the decode grants each writer its bytes of     \
                             each region, and STAGING_RSP carries the keys;    \
                             0: every write uses ring_rkey */                  \
    F(u32, reserved)                                                            \
    F(i64, local_heads) F(i64, num_pages)                                       \
    F(i64, layers_total)  /* LAYERS entries that follow (0 for staging) */   \
    F(b32, proof)         /* with a cluster secret: the decode's proof (auth.h); \
                             zero in an open cluster */
#define KVS_WIRE_LAYERS_FIELDS(F) F(i64, first) F(u32, count)
/* Authenticated registration (docs/security.md): a decode with a cluster
 * secret opens every connection with HELLO and sends its REGISTER (which
 * carries its keys) only once the CHALLENGE proved the prefill knows the
 * secret; the REGISTER then carries the decode's proof. */
#define KVS_WIRE_HELLO_FIELDS(F) /* decode -> prefill */ F(b32, nonce)
#define KVS_WIRE_CHALLENGE_FIELDS(F) /* prefill -> decode */                    \
    F(u64, echo)          /* the decode session it answers */                  \
    F(u32, secured)       /* 1: the prefill has the secret and proves it;       \
                             0: it has none (an open prefill) */               \
    F(u32, reserved)                                                            \
    F(b32, nonce)         /* the prefill's, fresh for this connection */       \
    F(b32, proof)         /* the prefill's proof; zero when not secured */
#define KVS_WIRE_REGISTER_ACK_FIELDS(F) /* prefill -> decode */                 \
    F(u64, echo)          /* the decode session it answers */                  \
    F(i64, tp_rank) F(i64, pp_rank) /* of the prefill rank answering */        \
    F(i32, status)        /* KVS_OK or why it refused */                       \
    F(u32, reserved)                                                            \
    F(u64, instance) F(i64, dp_rank) /* the answering prefill's instance */    \
    F(fp, fp)             /* the prefill's: a refused decode names the field */ \
    F(i64, cp_rank) F(i64, cp_size) /* the answering rank's context-parallel  \
                             rank and the instance's CP ranks */
#define KVS_WIRE_ROOM_FIELDS(F) /* decode -> prefill: a request's decode side */ \
    F(u64, room)                                                                \
    F(i64, base_tokens)   /* decode's cached prefix (page aligned) */          \
    F(i64, total_tokens)  /* end of the request */                             \
    F(i64, num_pages)     /* decode pages of the suffix; PAGES follow on the    \
                             direct and slice paths */
#define KVS_WIRE_PAGES_FIELDS(F) F(u64, room) F(i64, first) F(u32, count)
#define KVS_WIRE_STAGING_REQ_FIELDS(F) /* prefill -> decode */                  \
    F(u64, room) F(i64, chunk) F(i64, pages) F(i64, tokens)                     \
    F(i64, writer) F(i64, stage) /* TP writer index, prefill PP stage */
#define KVS_WIRE_STAGING_RSP_FIELDS(F) /* decode -> prefill */                  \
    F(u64, room) F(i64, chunk)                                                  \
    F(i32, status)        /* KVS_OK, KVS_EOVERSIZED, ... */                    \
    F(u32, reserved) F(u64, offset) F(u64, round) F(u64, end)                   \
    /* With scoped_keys, the keys of the receiving writer's bytes of this      \
     * region (its grants): rkey for its first write (the whole block, or its  \
     * K layers when it writes them apart), rkey_v for its V layers then (0    \
     * otherwise); no key reaches any other byte. 0 without scoped_keys. */   \
    F(u64, rkey) F(u64, rkey_v)
#define KVS_WIRE_CHUNK_READY_FIELDS(F) /* prefill -> decode: a writer landed */ \
    F(u64, room) F(i64, chunk) F(i64, page_start) F(i64, pages)                 \
    F(i64, writer) F(i64, stage)
#define KVS_WIRE_WATERMARK_FIELDS(F) F(u64, round) F(u64, offset)
#define KVS_WIRE_STATUS_FIELDS(F) /* prefill -> decode: its result for a room */ \
    F(u64, room) F(i64, tp_rank) F(i64, pp_rank) F(i32, status)                  \
    F(u32, aux_bytes)     /* aux bytes it sent this decode rank first */       \
    F(i64, chunks)        /* chunks this rank sent */
/* prefill -> decode: bytes [first, first + count) of a room's aux payload
 * of `total` bytes, sent before its STATUS by the one prefill rank the
 * decode rank hears it from (its peer 0). */
#define KVS_WIRE_AUX_FIELDS(F) F(u64, room) F(u32, total) F(u32, first) F(u32, count)
#define KVS_WIRE_ABORT_FIELDS(F) F(u64, room) F(i32, status) F(u32, reserved)
/* Link-level receipt: every message of the connection up to and including
 * sequence `cum` arrived, in order (link.c); never itself acknowledged. */
#define KVS_WIRE_ACK_FIELDS(F) F(u32, cum) F(u32, reserved)

/*
 * X(NAME, value, member, type, ELEM, array, max): message KVS_MSG_NAME =
 * value, held in kvs_msg_t.u.member of type kvs_msg_<type>_t, whose fixed
 * fields KVS_WIRE_NAME_FIELDS lists in wire order. A counted message (ELEM
 * not `none`) ends its fixed fields with `count` and carries `count` ELEMs
 * after them, at most max, in array[max].
 */
#define KVS_WIRE_MESSAGES(X)                                                            \
    X(REGISTER, 1, reg, register, none, none, 0)                                        \
    X(LAYERS, 2, layers, layers, layer, entries, KVS_WIRE_LAYERS_PER_MSG)               \
    X(REGISTER_ACK, 3, ack, register_ack, none, none, 0)                                \
    X(ROOM, 4, room, room, none, none, 0)                                               \
    X(PAGES, 5, pages, pages, i64, ids, KVS_WIRE_PAGES_PER_MSG)                         \
    X(STAGING_REQ, 6, req, staging_req, none, none, 0)                                  \
    X(STAGING_RSP, 7, rsp, staging_rsp, none, none, 0)                                  \
    X(CHUNK_READY, 8, ready, chunk_ready, none, none, 0)                                \
    X(WATERMARK, 9, wm, watermark, none, none, 0)                                       \
    X(STATUS, 10, status, status, none, none, 0)                                        \
    X(ABORT, 11, abort, abort, none, none, 0)                                           \
    X(ACK, 12, ack_link, ack, none, none, 0)                                            \
    X(AUX, 13, aux, aux, u8, data, KVS_WIRE_AUX_PER_MSG)                                \
    X(HELLO, 14, hello, hello, none, none, 0)                                           \
    X(CHALLENGE, 15, challenge, challenge, none, none, 0)

typedef enum kvs_msg_type {
#define KVS__WIRE_ENUM(NAME, value, member, type, ELEM, array, max) KVS_MSG_##NAME = value,
    KVS_WIRE_MESSAGES(KVS__WIRE_ENUM)
#undef KVS__WIRE_ENUM
    KVS_MSG_TYPE_MAX = 15
} kvs_msg_type_t;

#define KVS__WIRE_ARRAY_none(array, max)
#define KVS__WIRE_ARRAY_u8(array, max) uint8_t array[max];
#define KVS__WIRE_ARRAY_i64(array, max) int64_t array[max];
#define KVS__WIRE_ARRAY_layer(array, max) kvs_layer_entry_t array[max];
#define KVS__WIRE_STRUCT(NAME, value, member, type, ELEM, array, max)                  \
    typedef struct kvs_msg_##type {                                                     \
        KVS_WIRE_##NAME##_FIELDS(KVS__WIRE_DECL) KVS__WIRE_ARRAY_##ELEM(array, max)     \
    } kvs_msg_##type##_t;
KVS_WIRE_MESSAGES(KVS__WIRE_STRUCT)
#undef KVS__WIRE_STRUCT

typedef struct kvs_msg {
    kvs_msg_type_t type;
    uint32_t seq;              /* link sequence number; 0 = not sequenced (ACK) */
    uint64_t session;          /* the sender's session (set by the sending handler) */
    union {
#define KVS__WIRE_MEMBER(NAME, value, member, type, ELEM, array, max) kvs_msg_##type##_t member;
        KVS_WIRE_MESSAGES(KVS__WIRE_MEMBER)
#undef KVS__WIRE_MEMBER
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
