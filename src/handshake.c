/*
 * handshake.c - authenticated registration (see handshake.h): HELLO,
 * CHALLENGE and the proof in REGISTER, for both roles. The proofs
 * themselves are auth.c's; the nonces come from the fabric
 * (random_bytes), so the simulator replays and real fabrics draw from
 * the kernel.
 */
#include "handshake.h"

#include "handler.h"
#include "error.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kvs__role_name(const kvs__handler_t *h)
{
    return h->role->role == KVS_ROLE_DECODE ? "decode" : "prefill";
}

static bool kvs__secured(const kvs__handler_t *h) { return h->m->secret.len_bytes > 0; }

int kvs__handshake_init(kvs__handshake_t *hs, uint32_t cap)
{
    hs->v = calloc(cap, sizeof *hs->v);
    hs->cap = hs->v != NULL ? cap : 0;
    hs->next_seq = 1;
    return hs->v != NULL ? KVS_OK : KVS_ENOMEM;
}

void kvs__handshake_fini(kvs__handshake_t *hs)
{
    if (hs->v != NULL)
        memset(hs->v, 0, hs->cap * sizeof *hs->v);
    free(hs->v);
    hs->v = NULL;
    hs->cap = 0;
}

static kvs__challenge_t *kvs__challenge_find(kvs__handshake_t *hs, const kvs_conn_t *conn)
{
    for (uint32_t i = 0; i < hs->cap; i++)
        if (hs->v[i].conn == conn)
            return &hs->v[i];
    return NULL;
}

void kvs__handshake_forget(kvs__handshake_t *hs, const kvs_conn_t *conn)
{
    kvs__challenge_t *c = conn != NULL ? kvs__challenge_find(hs, conn) : NULL;
    if (c != NULL)
        memset(c, 0, sizeof *c);
}

/* Counts and logs a refused registration with the peer's address; the
 * manager's error names it too. */
static void kvs__auth_refuse(kvs__handler_t *h, kvs_conn_t *conn, const char *why)
{
    char addr[96];
    h->stats.auth_refused++;
    KVS__MFAIL(h->m, KVS_EAUTH, "refused the registration of the peer at %s: %s",
               kvs__net_peer_addr(h->fab, conn, addr, sizeof addr), why);
    kvs_log_write(&h->m->log, KVS_LOG_ERROR, "%s %lld: %s", kvs__role_name(h),
                  (long long)h->tp_rank, h->m->err.msg);
}

/* ---- decode ----------------------------------------------------------------- */

bool kvs__handshake_open(kvs__handler_t *h, kvs__peer_t *peer)
{
    /* A new connection: a HELLO of the last one is not this one's, and a
     * CHALLENGE to it must not pass here (it would, with the old nonce,
     * if the random source failed below). */
    peer->challenged = false;
    if (!kvs__secured(h))
        return false;
    kvs_msg_t msg = {.type = KVS_MSG_HELLO};
    if (kvs__net_random(h->fab, peer->nonce.b, sizeof peer->nonce.b) != KVS_OK) {
        /* The manager checked the source at create: it failed since. */
        peer->refused = KVS_EAUTH;
        kvs__auth_refuse(h, peer->conn, "fabric's random source failed");
        return true;
    }
    peer->challenged = true;
    msg.u.hello.nonce = peer->nonce;
    kvs__send(h, peer, &msg);
    return true;
}

int kvs__handshake_on_challenge(kvs__handler_t *h, kvs_conn_t *conn, kvs__peer_t *peer,
                                const kvs_msg_t *msg)
{
    const kvs_msg_challenge_t *c = &msg->u.challenge;
    if (peer == NULL || peer->conn != conn || !peer->challenged || c->echo != h->session) {
        kvs__reject(h); /* unasked, stale or forged */
        return KVS_EPROTO;
    }
    peer->challenged = false;
    kvs_b32_t want;
    kvs__auth_prefill_proof(&h->m->secret, &peer->nonce, &c->nonce, h->session, msg->session,
                            &want);
    const bool ok = c->secured == 1 && kvs__auth_equal(want.b, c->proof.b, sizeof want.b);
    if (ok) {
        peer->peer_nonce = c->nonce;
        peer->peer_session = msg->session;
        return KVS_OK;
    }
    char name[96], why[192];
    snprintf(why, sizeof why, "prefill %s %s: no key or address goes to it",
             kvs__peer_name(peer, name, sizeof name),
             c->secured == 1 ? "does not know the cluster secret"
                             : "has no cluster secret (an open prefill)");
    peer->refused = KVS_EAUTH;
    kvs__auth_refuse(h, conn, why);
    return KVS_EAUTH;
}

void kvs__handshake_sign(kvs__handler_t *h, const kvs__peer_t *peer, kvs_msg_t *reg)
{
    memset(&reg->u.reg.proof, 0, sizeof reg->u.reg.proof);
    if (!kvs__secured(h))
        return;
    reg->session = h->session; /* as the link will send it */
    kvs__auth_decode_proof(&h->m->secret, &peer->nonce, &peer->peer_nonce, peer->peer_session,
                           reg, &reg->u.reg.proof);
}

/* ---- prefill ---------------------------------------------------------------- */

void kvs__handshake_on_hello(kvs__handler_t *h, kvs_conn_t *conn, const kvs_msg_t *msg)
{
    kvs__handshake_t *hs = &h->hs;
    kvs_msg_t out = {.type = KVS_MSG_CHALLENGE};
    kvs_msg_challenge_t *c = &out.u.challenge;
    c->echo = msg->session;
    if (kvs__secured(h)) {
        kvs__challenge_t *slot = kvs__challenge_find(hs, conn);
        for (uint32_t i = 0; slot == NULL && i < hs->cap; i++)
            if (hs->v[i].conn == NULL)
                slot = &hs->v[i];
        if (slot == NULL) /* full: the oldest goes */
            for (uint32_t i = 0; i < hs->cap; i++)
                if (slot == NULL || hs->v[i].seq < slot->seq)
                    slot = &hs->v[i];
        if (slot == NULL || kvs__net_random(h->fab, c->nonce.b, sizeof c->nonce.b) != KVS_OK) {
            kvs__auth_refuse(h, conn, "no challenge could be made (random source failed)");
            return;
        }
        *slot = (kvs__challenge_t){.conn = conn, .session_d = msg->session,
                                   .nonce_d = msg->u.hello.nonce, .nonce_p = c->nonce,
                                   .seq = hs->next_seq++};
        c->secured = 1;
        kvs__auth_prefill_proof(&h->m->secret, &slot->nonce_d, &slot->nonce_p,
                                slot->session_d, h->session, &c->proof);
    }
    (void)kvs__link_send(&h->links, conn, &out);
}

int kvs__handshake_check_register(kvs__handler_t *h, kvs_conn_t *conn, const kvs_msg_t *msg)
{
    kvs__handshake_t *hs = &h->hs;
    if (!kvs__secured(h))
        return KVS_OK;
    kvs__challenge_t *c = kvs__challenge_find(hs, conn);
    const char *why = NULL;
    if (c == NULL || c->session_d != msg->session) {
        why = "no challenge of this rank is pending for it (no HELLO, or a replayed "
              "registration)";
    } else {
        kvs_b32_t want;
        kvs__auth_decode_proof(&h->m->secret, &c->nonce_d, &c->nonce_p, h->session, msg,
                               &want);
        if (!kvs__auth_equal(want.b, msg->u.reg.proof.b, sizeof want.b))
            why = "its proof does not check (no cluster secret, a wrong one, or a "
                  "replayed registration)";
    }
    if (c != NULL)
        memset(c, 0, sizeof *c); /* one REGISTER per challenge */
    if (why == NULL)
        return KVS_OK;
    kvs__auth_refuse(h, conn, why);
    /* The status alone: nothing about this rank goes to an unproven peer. */
    kvs_msg_t ack = {.type = KVS_MSG_REGISTER_ACK};
    ack.u.ack = (kvs_msg_register_ack_t){.echo = msg->session, .status = KVS_EAUTH};
    (void)kvs__link_send(&h->links, conn, &ack);
    return KVS_EAUTH;
}
