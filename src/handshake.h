/*
 * handshake.h (internal) - authenticated registration on the handler base
 * (docs/security.md): the message flow of a cluster secret, once for both
 * roles.
 *
 *   decode                          prefill
 *   HELLO {nonce_d}        ----->   draws nonce_p, keeps (conn, S_d, both)
 *                          <-----   CHALLENGE {S_d, secured, nonce_p, proof_p}
 *   checks proof_p; only then
 *   REGISTER {..., proof_d} ----->  checks proof_d against what it kept,
 *                                   forgets it (a replay finds nothing)
 *                          <-----   REGISTER_ACK
 *
 * A decode without a secret registers at once, as before; a prefill with
 * one refuses (KVS_EAUTH) every REGISTER whose proof does not check,
 * answering with nothing but the status. A decode with a secret sends its
 * keys only to a prefill that proved the secret. Refusals count in
 * stats.auth_refused and are logged with the peer's address.
 *
 * The prefill keeps one pending challenge per connection, in a table of
 * the links' size; when it is full the oldest is dropped (that decode's
 * REGISTER is then refused and it retries on its next connection).
 */
#ifndef KVS_SRC_HANDSHAKE_H
#define KVS_SRC_HANDSHAKE_H

#include "instance.h"
#include "wire.h"

typedef struct kvs__handler kvs__handler_t;

/* A pending challenge (prefill). */
typedef struct kvs__challenge {
    kvs_conn_t *conn;            /* NULL: a free slot */
    uint64_t session_d;
    kvs_b32_t nonce_d, nonce_p;
    uint64_t seq;                /* age, for replacing the oldest */
} kvs__challenge_t;

typedef struct kvs__handshake {
    kvs__challenge_t *v;
    uint32_t cap;
    uint64_t next_seq;
} kvs__handshake_t;

int kvs__handshake_init(kvs__handshake_t *hs, uint32_t cap);
void kvs__handshake_fini(kvs__handshake_t *hs);
/* conn is gone: its pending challenge too. */
void kvs__handshake_forget(kvs__handshake_t *hs, const kvs_conn_t *conn);

/* Decode, on peer's new connection: with a secret, sends HELLO and returns
 * true (the REGISTER waits for the CHALLENGE); without one, false. */
bool kvs__handshake_open(kvs__handler_t *h, kvs__peer_t *peer);
/* Decode: a CHALLENGE on conn (bound to peer, or NULL). KVS_OK when the
 * prefill proved the secret (peer's REGISTER may go, signed with
 * kvs__handshake_sign); KVS_EAUTH when it did not (peer refused, counted
 * and logged); KVS_EPROTO for one nobody asked for (counted rejected). */
int kvs__handshake_on_challenge(kvs__handler_t *h, kvs_conn_t *conn, kvs__peer_t *peer,
                                const kvs_msg_t *msg);
/* Decode: puts its proof in reg, a REGISTER to peer (a no-op when open). */
void kvs__handshake_sign(kvs__handler_t *h, const kvs__peer_t *peer, kvs_msg_t *reg);

/* Prefill: a HELLO on conn: answers CHALLENGE (secured when it has the
 * secret). */
void kvs__handshake_on_hello(kvs__handler_t *h, kvs_conn_t *conn, const kvs_msg_t *msg);
/* Prefill: may this REGISTER on conn proceed? KVS_OK when open or its
 * proof checks; else KVS_EAUTH, after refusing it (a bare REGISTER_ACK
 * with the status), counting and logging it. */
int kvs__handshake_check_register(kvs__handler_t *h, kvs_conn_t *conn, const kvs_msg_t *msg);

#endif
