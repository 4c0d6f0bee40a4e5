/*
 * rkeys.h - the remote-key tables of the network fabrics (hw/verbs,
 * hw/ofi): how a registration of several pieces is announced to a peer in
 * KEYS messages, and the per-connection table of the peer's registrations
 * that a writer resolves (id, remote address) against.
 *
 * KEYS: id, npieces, first, count (u32); base, piece_bytes, len_bytes
 * (u64); then count piece keys of key_bytes each (verbs: 4, ofi: 8); all
 * little-endian. DROP: id (u32). The fabrics frame and send the messages;
 * this file only encodes, decodes and keeps the tables.
 *
 * Invariants: a table set holds at most the `max` its owner passes (the
 * fabric's max_mrs), allocated at once on the first KEYS; an entry is used
 * for writes only once all its pieces are filled.
 */
#ifndef KVS_HW_RKEYS_H
#define KVS_HW_RKEYS_H

#include <kvstage/backend.h>

#include <stddef.h>
#include <stdint.h>

#define HW_RKEYS_HDR_BYTES 40u
#define HW_RKEYS_PIECES_MAX (UINT32_C(1) << 20)

/* Pieces one KEYS message carries at the most with keys of key_bytes. */
#define HW_RKEYS_PER_MSG(key_bytes) ((KVS_CONTROL_MSG_MAX_BYTES - HW_RKEYS_HDR_BYTES) / (key_bytes))

/* A local registration as its KEYS messages describe it. */
typedef struct hw_rkeys_reg {
    uint32_t id;
    uint32_t npieces;
    uint64_t base;
    uint64_t piece_bytes; /* every piece but the last */
    uint64_t len_bytes;
} hw_rkeys_reg_t;

/* The key of piece i of the registration behind ctx. */
typedef uint64_t (*hw_rkeys_key_fn)(const void *ctx, uint32_t piece);
/* Sends one KEYS message of len_bytes on conn; a kvstage status. */
typedef int (*hw_rkeys_send_fn)(void *conn, const uint8_t *msg, uint32_t len_bytes);

/* Sends all of r's keys (key_of(ctx, i), key_bytes wide) on conn in as few
 * KEYS messages as fit; the first failing send's status, else KVS_OK. */
int hw_rkeys_send(const hw_rkeys_reg_t *r, uint32_t key_bytes, hw_rkeys_key_fn key_of,
                  const void *ctx, hw_rkeys_send_fn send, void *conn);

/* A peer's registration, learnt from its KEYS messages. */
typedef struct hw_rkeys_entry {
    uint32_t id;
    uint32_t npieces;
    uint32_t filled;
    uint64_t base;
    uint64_t piece_bytes;
    uint64_t len_bytes;
    uint64_t *keys;
} hw_rkeys_entry_t;

/* One connection's tables of the peer's registrations. Zero-initialised is
 * empty; hw_rkeys_free empties it. */
typedef struct hw_rkeys {
    hw_rkeys_entry_t *e; /* NULL until the first KEYS, then max entries */
    uint32_t n;
} hw_rkeys_t;

/* Takes a KEYS message of len_bytes into s (at most max registrations,
 * each of at least min_pieces pieces). A registration sent again from its
 * first piece, or with another piece count, starts over. KVS_OK, else
 * KVS_EPROTO (malformed), KVS_EFULL (more than max) or KVS_ENOMEM, with
 * `why` saying so; s is unchanged then. */
int hw_rkeys_recv(hw_rkeys_t *s, uint32_t max, uint32_t key_bytes, uint32_t min_pieces,
                  const uint8_t *msg, uint32_t len_bytes, char *why, size_t why_bytes);

/* Takes a DROP message: forgets that registration (unknown ids and short
 * messages are ignored). */
void hw_rkeys_drop(hw_rkeys_t *s, const uint8_t *msg, uint32_t len_bytes);

/* The piece of registration id holding raddr: its key, raddr's offset in
 * it and the bytes left in it. KVS_ENOENT when id is unknown or not yet
 * complete, KVS_ERANGE when raddr lies outside it (*found then says where
 * it is); KVS_OK. */
int hw_rkeys_lookup(const hw_rkeys_t *s, uint32_t id, uint64_t raddr, uint64_t *key,
                    uint64_t *off_in_piece, uint64_t *left, const hw_rkeys_entry_t **found);

void hw_rkeys_free(hw_rkeys_t *s);

#endif
