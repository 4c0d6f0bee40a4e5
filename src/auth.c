/*
 * auth.c - the cluster secret and the proofs of authenticated registration
 * (see auth.h). SHA-256 and HMAC are nettle's; nothing here keeps state
 * between calls, and every buffer that held the secret or a MAC input is
 * wiped before it goes.
 */
#include "auth.h"

#include <kvstage/kvstage.h>

#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <nettle/sha2.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(SHA256_DIGEST_SIZE == KVS__AUTH_BYTES, "a proof is one SHA-256 digest");
_Static_assert(sizeof(kvs_b32_t) == KVS__AUTH_BYTES, "nonces and proofs travel as b32");

void kvs__sha256(const void *data, size_t len_bytes, uint8_t out[KVS__AUTH_BYTES])
{
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, len_bytes, data);
    sha256_digest(&ctx, SHA256_DIGEST_SIZE, out);
    explicit_bzero(&ctx, sizeof ctx);
}

void kvs__hmac_sha256(const void *key, size_t key_bytes, const void *data, size_t len_bytes,
                      uint8_t out[KVS__AUTH_BYTES])
{
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, key_bytes, key);
    hmac_sha256_update(&ctx, len_bytes, data);
    hmac_sha256_digest(&ctx, SHA256_DIGEST_SIZE, out);
    explicit_bzero(&ctx, sizeof ctx); /* holds the padded key */
}

bool kvs__auth_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    return memeql_sec(a, b, n) != 0;
}

void kvs__secret_wipe(kvs__secret_t *s)
{
    explicit_bzero(s, sizeof *s);
}

/* Reads at most cap bytes of path into buf; *got the count. */
static int secret_read_file(const char *path, uint8_t *buf, size_t cap, size_t *got, int *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        *err = errno;
        return KVS_EINVAL;
    }
    setvbuf(f, NULL, _IONBF, 0); /* no stdio buffer keeps a copy */
    *got = fread(buf, 1, cap, f);
    const bool bad = ferror(f) != 0;
    *err = bad ? errno : 0;
    fclose(f);
    return bad ? KVS_EINVAL : KVS_OK;
}

int kvs__secret_load(const char *file, const char *env, kvs__secret_t *out, char *why,
                     size_t why_bytes)
{
    memset(out, 0, sizeof *out);
    if (file == NULL && env == NULL)
        return KVS_OK;
    if (file != NULL && env != NULL) {
        snprintf(why, why_bytes, "both secret_file and secret_env are set: name the cluster "
                 "secret once");
        return KVS_EINVAL;
    }
    /* One byte over the bound, to tell "too long" from "exactly at it". */
    static const size_t cap = KVS__SECRET_MAX_BYTES + 1u;
    uint8_t buf[KVS__SECRET_MAX_BYTES + 1u];
    size_t n = 0;
    const char *where = file != NULL ? "secret file" : "secret environment variable";
    const char *name = file != NULL ? file : env;
    if (file != NULL) {
        int err = 0;
        if (secret_read_file(file, buf, cap, &n, &err) != KVS_OK) {
            snprintf(why, why_bytes, "the secret file '%s' cannot be read (%s): give a "
                     "readable file in secret_file", file, strerror(err));
            explicit_bzero(buf, sizeof buf);
            return KVS_EINVAL;
        }
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
            n--;
    } else {
        const char *v = getenv(env);
        if (v == NULL) {
            snprintf(why, why_bytes, "the secret environment variable %s is not set: set it "
                     "or fix secret_env", env);
            return KVS_EINVAL;
        }
        n = strnlen(v, cap);
        memcpy(buf, v, n);
    }
    int rc = KVS_OK;
    if (n > KVS__SECRET_MAX_BYTES) {
        snprintf(why, why_bytes, "the %s '%s' holds more than %u bytes: use a shorter "
                 "secret", where, name, KVS__SECRET_MAX_BYTES);
        rc = KVS_EINVAL;
    } else if (n < KVS__SECRET_MIN_BYTES) {
        snprintf(why, why_bytes, "the %s '%s' holds %s (%zu bytes): a cluster secret needs "
                 "at least %u bytes, e.g. `head -c 32 /dev/urandom | base64`", where, name,
                 n == 0 ? "nothing" : "too short a secret", n, KVS__SECRET_MIN_BYTES);
        rc = KVS_EINVAL;
    } else {
        memcpy(out->key, buf, n);
        out->len_bytes = (uint32_t)n;
    }
    explicit_bzero(buf, sizeof buf);
    return rc;
}

/* An HMAC input is label | fields: small, built on the stack. */
typedef struct auth_msg {
    uint8_t b[64 + 2 * KVS__AUTH_BYTES + 16 + KVS_CONTROL_MSG_MAX_BYTES];
    size_t n;
} auth_msg_t;

static void auth_put(auth_msg_t *m, const void *p, size_t n)
{
    memcpy(m->b + m->n, p, n);
    m->n += n;
}

static void auth_put_u64(auth_msg_t *m, uint64_t v)
{
    for (unsigned i = 0; i < 8u; i++)
        m->b[m->n++] = (uint8_t)(v >> (8u * i));
}

static void auth_finish(const kvs__secret_t *s, auth_msg_t *m, kvs_b32_t *out)
{
    kvs__hmac_sha256(s->key, s->len_bytes, m->b, m->n, out->b);
    explicit_bzero(m->b, m->n);
}

void kvs__auth_prefill_proof(const kvs__secret_t *s, const kvs_b32_t *nonce_d,
                             const kvs_b32_t *nonce_p, uint64_t session_d, uint64_t session_p,
                             kvs_b32_t *out)
{
    static const char label[] = "kvstage/1 prefill";
    auth_msg_t m = {.n = 0};
    auth_put(&m, label, sizeof label); /* with its NUL: a label never runs into a field */
    auth_put(&m, nonce_d->b, KVS__AUTH_BYTES);
    auth_put(&m, nonce_p->b, KVS__AUTH_BYTES);
    auth_put_u64(&m, session_d);
    auth_put_u64(&m, session_p);
    auth_finish(s, &m, out);
}

void kvs__auth_decode_proof(const kvs__secret_t *s, const kvs_b32_t *nonce_d,
                            const kvs_b32_t *nonce_p, uint64_t session_p, const kvs_msg_t *reg,
                            kvs_b32_t *out)
{
    static const char label[] = "kvstage/1 decode";
    auth_msg_t m = {.n = 0};
    auth_put(&m, label, sizeof label);
    auth_put(&m, nonce_d->b, KVS__AUTH_BYTES);
    auth_put(&m, nonce_p->b, KVS__AUTH_BYTES);
    auth_put_u64(&m, session_p);
    /* The registration as it travels, less what the link sets (seq) and
     * the proof itself; its header carries the decode's session. */
    kvs_msg_t copy = *reg;
    copy.seq = 0;
    memset(&copy.u.reg.proof, 0, sizeof copy.u.reg.proof);
    uint32_t len = 0;
    if (kvs__wire_encode(&copy, m.b + m.n, (uint32_t)(sizeof m.b - m.n), &len) != KVS_OK)
        len = 0; /* cannot happen: a REGISTER always encodes; the proof then fails */
    m.n += len;
    auth_finish(s, &m, out);
}
