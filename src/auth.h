/*
 * auth.h (internal) - the cluster secret and the proofs of authenticated
 * registration (docs/security.md, spec: registration).
 *
 * SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104) come from nettle, a
 * vetted library; this file adds only what the protocol needs on top:
 * loading the secret from a file or an environment variable, the two
 * proofs, and a comparison whose time does not depend on the bytes.
 *
 * The proofs (each side's nonce fresh per connection, from the fabric):
 *   prefill: HMAC(K, "kvstage/1 prefill" | nonce_d | nonce_p | S_d | S_p)
 *   decode:  HMAC(K, "kvstage/1 decode"  | nonce_d | nonce_p | S_p |
 *                    the REGISTER as encoded, with seq 0 and proof zeroed)
 * S_d, S_p are the two sessions (u64, little-endian). The labels differ,
 * so neither proof can be reflected as the other; the decode's covers its
 * whole registration (fingerprint, ring, key), so none of it can be
 * swapped. The secret never leaves the manager: buffers that held it or
 * an intermediate of it are wiped (explicit_bzero) before they are freed.
 */
#ifndef KVS_SRC_AUTH_H
#define KVS_SRC_AUTH_H

#include "wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVS__AUTH_BYTES 32u          /* a nonce, a digest, a proof */
#define KVS__SECRET_MIN_BYTES 16u    /* 128 bits: shorter is guessable */
#define KVS__SECRET_MAX_BYTES 1024u

typedef struct kvs__secret {
    uint8_t key[KVS__SECRET_MAX_BYTES];
    uint32_t len_bytes;              /* 0: no secret, the cluster is open */
} kvs__secret_t;

/* SHA-256 of data (FIPS 180-4). */
void kvs__sha256(const void *data, size_t len_bytes, uint8_t out[KVS__AUTH_BYTES]);
/* HMAC-SHA-256 of data under key (RFC 2104, RFC 4231). */
void kvs__hmac_sha256(const void *key, size_t key_bytes, const void *data, size_t len_bytes,
                      uint8_t out[KVS__AUTH_BYTES]);
/* a == b over n bytes, in time independent of where they differ. */
bool kvs__auth_equal(const uint8_t *a, const uint8_t *b, size_t n);

/* Reads the secret named by the config: the file `file` or the environment
 * variable `env` (at most one of them non-NULL; both NULL: no secret, KVS_OK
 * with out->len_bytes 0). A file's trailing newlines are not part of it.
 * KVS_EINVAL with `why` naming what to change when both are given, or the
 * secret is unreadable, empty, shorter than KVS__SECRET_MIN_BYTES or longer
 * than KVS__SECRET_MAX_BYTES. `why` never holds any byte of the secret. */
int kvs__secret_load(const char *file, const char *env, kvs__secret_t *out, char *why,
                     size_t why_bytes);
/* Wipes the secret. */
void kvs__secret_wipe(kvs__secret_t *s);

/* The prefill's proof of the secret. */
void kvs__auth_prefill_proof(const kvs__secret_t *s, const kvs_b32_t *nonce_d,
                             const kvs_b32_t *nonce_p, uint64_t session_d, uint64_t session_p,
                             kvs_b32_t *out);
/* The decode's proof over its REGISTER reg (sent by session reg->session). */
void kvs__auth_decode_proof(const kvs__secret_t *s, const kvs_b32_t *nonce_d,
                            const kvs_b32_t *nonce_p, uint64_t session_p, const kvs_msg_t *reg,
                            kvs_b32_t *out);

#endif
