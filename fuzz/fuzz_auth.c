/*
 * fuzz_auth.c - libFuzzer target for authenticated registration
 * (docs/security.md; src/handshake.c, src/auth.c): HELLO, CHALLENGE and the
 * HMAC-SHA-256 proofs of REGISTER, run between a real decode handler (TP 1,
 * two prefill writers p0 and p1) and a real prefill handler (TP 2, rank 0),
 * each on the fake device of tests/fixtures/fake_backend.c and a fabric of this file
 * that records every post and delivers one completion per progress call.
 * The harness stands between them: it relays what one side posted to the
 * other, drops it, replays it, and forges messages of its own.
 *
 * Input: byte 0 picks the secrets (bits 0-1 the decode's, bits 2-3 the
 * prefill's: none, A, A or B) and whether the decode connects to both
 * writers (bit 4) or to p0 alone; then ops, an opcode byte and operands:
 * relay the oldest post of a connection to the other side on a connection
 * of the fuzzer's choice (or deliver it and keep it, to replay it later);
 * drop one; forge a HELLO, a REGISTER (from the decode's last one, its
 * proof made with key A or B for the challenge the harness saw on that
 * connection or on another, zero, arbitrary, or the captured one kept,
 * then a field changed or not), a CHALLENGE (proof for the decode's
 * current nonce under A or B, zero, arbitrary, or the prefill's last
 * CHALLENGE replayed whole), a REGISTER_ACK of any status, or a message
 * of any type with fuzzer bytes as payload (kvs__wire_decode decides), each
 * with a sequence number that the receiving link expects, or one off, or
 * any; a DISCONNECT; advance the clock (retransmissions, the decode's
 * reconnects); call the decode's connect again. Nonces come from the
 * fabric's random_bytes, fed by the input (one byte a nonce; 0xFF: the
 * source fails), never from getrandom.
 *
 * The model (what docs/security.md and handshake.h promise; the link layer
 * is fuzz_link's business and is read, not modelled, here):
 * - the prefill answers each HELLO it takes with one CHALLENGE on that
 *   connection: secured, echoing the HELLO's session, its nonce fresh from
 *   the fabric, its proof the HMAC over both nonces and sessions; open, a
 *   CHALLENGE with secured 0 and nothing else. It keeps one challenge per
 *   connection, in a table of its links' size whose oldest entry goes when
 *   it is full, and forgets a connection's when the connection dies;
 * - with a secret, the prefill accepts a REGISTER (answers something other
 *   than KVS_EAUTH) exactly when its connection has a pending challenge of
 *   the REGISTER's session and its proof is the HMAC of the decode label
 *   over that challenge and the REGISTER as encoded; any REGISTER uses up
 *   the connection's challenge; a refusal is a REGISTER_ACK with KVS_EAUTH,
 *   the session echoed and nothing else, and counts in auth_refused;
 * - the decode says HELLO once per connection, only with a secret, with
 *   the fabric's fresh nonce; it sends its REGISTER (ring, key) only once
 *   per connection, and with a secret only after a CHALLENGE on that
 *   connection, answering its HELLO, whose proof checks under its own
 *   secret; the REGISTER's proof is the HMAC over that challenge (zero when
 *   open); a CHALLENGE that does not check counts in auth_refused;
 * - the decode sends nothing else on a connection, and counts no peer
 *   ready, before an OK REGISTER_ACK arrived after its REGISTER there;
 * - neither side sends a CHALLENGE, a REGISTER_ACK, a HELLO or a REGISTER
 *   but as above; every post decodes and carries the sender's session;
 *   auth_refused of each side equals the model's count (failures of the
 *   random source included);
 * - no leak (device memory, registrations, host memory), no out-of-bounds
 *   access, no undefined behaviour (ASan, LSan, UBSan).
 *
 * The two secrets live in environment variables, one of the two ways a
 * manager takes a secret (a file is the other): LLVMFuzzerInitialize sets
 * them once, the only process-wide state, and nothing changes them after.
 */
#include "auth.h"
#include "channel.h"
#include "fake_backend.h"
#include "link.h"
#include "wire.h"

#include <kvstage/kvstage.h>

#include "fuzz_support.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NCONN_D 8u        /* connections the decode's fabric hands out, in turn */
#define NCONN_P 22u       /* connections at the prefill: more than its 20 links */
#define WRITERS 2         /* prefill TP 2 -> decode TP 1: p0 and p1 */
#define MAX_OPS 256u
#define OUTBOX_MAX 64u    /* posts kept per side; the oldest go first */
#define OUT_BYTES 512u    /* handshake messages are smaller; larger posts are not kept */
#define SESSION_D 0xD5E55D0000000001ull
#define SESSION_P 0xA5E55A0000000002ull
#define LAYERS 2
#define POOL_PAGES 64

#define SECRET_A_ENV "KVS_FUZZ_AUTH_SECRET_A"
#define SECRET_B_ENV "KVS_FUZZ_AUTH_SECRET_B"
#define SECRET_A "kvstage fuzz cluster secret A..."
#define SECRET_B "another cluster's secret, B...."

static const kvs__secret_t key_a = {.key = SECRET_A, .len_bytes = sizeof SECRET_A - 1u};
static const kvs__secret_t key_b = {.key = SECRET_B, .len_bytes = sizeof SECRET_B - 1u};

typedef enum side { SIDE_D = 0, SIDE_P = 1 } side_t;

typedef struct post {
    side_t side;
    uint32_t conn, len;
    uint8_t b[OUT_BYTES];
} post_t;

/* The decode's side of one writer, as the model sees it. */
typedef struct dwriter {
    int conn;                  /* handle of its connection, -1 when none */
    bool hello;                /* the decode said HELLO on it */
    bool awaiting;             /* ... and took no CHALLENGE since */
    bool verified;             /* a CHALLENGE proved the secret: a REGISTER may go */
    bool registered;           /* the REGISTER went */
    bool acked;                /* an OK REGISTER_ACK came after it */
    kvs_b32_t nonce_d, nonce_p;
    uint64_t session_p;
} dwriter_t;

/* A challenge the prefill issued, as the model keeps it. */
typedef struct pend {
    bool used;
    uint32_t conn;
    uint64_t session_d, age;
    kvs_b32_t nonce_d, nonce_p;
} pend_t;

/* What one delivery made the receiving side post. */
typedef struct step {
    bool active;
    side_t side;
    uint32_t conn;
    bool decoded;
    kvs_msg_type_t type;
    int challenges, acks, registers; /* first posts on the step's connection */
    bool rng_failed;
    kvs_msg_challenge_t challenge;   /* the prefill's */
    kvs_msg_register_ack_t ack;      /* the prefill's */
} step_t;

typedef struct harness harness_t;

typedef struct afab {
    fake_fabric_t fake;        /* first: its mr slots; the rest are this file's */
    harness_t *h;
    side_t side;
    uint32_t nconn;
    char tags[NCONN_P];        /* connection handles are their addresses */
    bool staged;
    kvs_completion_t cqe;
} afab_t;

struct harness {
    input_t *in;
    bool setup;                /* random_bytes answers without input meanwhile */
    uint64_t now_ns;
    fake_device_t dev[2];
    afab_t fab[2];
    kvs_manager_t *m[2];
    kvs_decode_t *dec;
    kvs_prefill_t *pre;
    const kvs__secret_t *key[2]; /* each side's secret, NULL: open */
    /* model */
    dwriter_t dw[WRITERS];
    uint32_t next_handle;
    pend_t pend[64];
    uint32_t pend_cap;
    uint64_t pend_age;
    uint64_t refused[2];
    kvs_b32_t rng_last[2];
    bool rng_fresh[2];
    step_t st;
    /* captured */
    post_t slot[OUTBOX_MAX];   /* the posts kept, in the slots order[] names */
    uint8_t order[OUTBOX_MAX]; /* slots, oldest post first: [0, nout) in use,
                                  the rest free (only these bytes move) */
    uint32_t nout;
    kvs_msg_t reg_tmpl;        /* the decode's last REGISTER (or one made alike) */
    bool have_chal;
    kvs_msg_t last_chal;       /* the prefill's last CHALLENGE */
    kvs_b32_t last_hello;      /* the decode's last HELLO nonce */
    /* scratch */
    kvs_msg_t sent, in_msg, build;
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
};

static bool is_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0)
            return false;
    return true;
}

static bool b32_eq(const kvs_b32_t *a, const kvs_b32_t *b)
{
    return memcmp(a->b, b->b, sizeof a->b) == 0;
}

/* 32 bytes from one input byte: few enough that nonces collide when the
 * fuzzer wants them to. */
static void pattern(kvs_b32_t *out, uint8_t seed)
{
    for (unsigned i = 0; i < sizeof out->b; i++)
        out->b[i] = (uint8_t)(seed * 0x9Du + i * 0x3Bu + (seed >> 3));
}

/* ---- the fabric --------------------------------------------------------- */

static afab_t *afab_of(kvs_fabric_t *base)
{
    return KVS_CONTAINER_OF(KVS_CONTAINER_OF(base, fake_fabric_t, base), afab_t, fake);
}

static kvs_conn_t *conn_of(afab_t *f, uint32_t k) { return (kvs_conn_t *)(void *)&f->tags[k]; }

static uint32_t conn_index(const afab_t *f, const kvs_conn_t *conn)
{
    const char *p = (const char *)(const void *)conn;
    CHECK(p >= f->tags && p < f->tags + f->nconn);
    return (uint32_t)(p - f->tags);
}

static kvs__links_t *links_of(harness_t *h, side_t side)
{
    return side == SIDE_D ? kvs__decode_links(h->dec) : kvs__prefill_links(h->pre);
}

static kvs__link_t *link_find(kvs__links_t *ls, const kvs_conn_t *conn)
{
    for (uint32_t i = 0; i < ls->hi; i++)
        if (ls->v[i].conn == conn)
            return &ls->v[i];
    return NULL;
}

static bool link_slot_free(const kvs__links_t *ls)
{
    for (uint32_t i = 0; i < ls->hi; i++)
        if (ls->v[i].conn == NULL)
            return true;
    return ls->hi < ls->cap;
}

static int writer_of(const harness_t *h, uint32_t k)
{
    for (int w = 0; w < WRITERS; w++)
        if (h->dw[w].conn >= 0 && (uint32_t)h->dw[w].conn == k)
            return w;
    return -1;
}

static post_t *outbox_at(harness_t *h, uint32_t i)
{
    return &h->slot[h->order[i]];
}

/* Takes the post at i out of the order; its slot becomes the first free. */
static void outbox_remove(harness_t *h, uint32_t i)
{
    const uint8_t s = h->order[i];
    memmove(&h->order[i], &h->order[i + 1], h->nout - i - 1u);
    h->order[--h->nout] = s;
}

static void outbox_push(harness_t *h, side_t side, uint32_t conn, const void *b, uint32_t len)
{
    if (len > OUT_BYTES)
        return;
    if (h->nout == OUTBOX_MAX)
        outbox_remove(h, 0);
    post_t *p = outbox_at(h, h->nout++);
    p->side = side;
    p->conn = conn;
    p->len = len;
    memcpy(p->b, b, len);
}

/* The oldest post of side on conn, -1 when none. */
static int outbox_find(const harness_t *h, side_t side, uint32_t conn)
{
    for (uint32_t i = 0; i < h->nout; i++) {
        const post_t *p = &h->slot[h->order[i]];
        if (p->side == side && p->conn == conn)
            return (int)i;
    }
    return -1;
}

static void on_decode_sent(harness_t *h, uint32_t k, const kvs_msg_t *m)
{
    const int w = writer_of(h, k);
    CHECK(w >= 0); /* only on the connections it made */
    dwriter_t *s = &h->dw[w];
    step_t *st = &h->st;
    const bool on_step = st->active && st->side == SIDE_D && st->conn == k;
    switch (m->type) {
    case KVS_MSG_HELLO:
        CHECK(h->key[SIDE_D] != NULL); /* an open decode registers at once */
        CHECK(!s->hello);              /* once per connection */
        CHECK(h->rng_fresh[SIDE_D] && b32_eq(&m->u.hello.nonce, &h->rng_last[SIDE_D]));
        h->rng_fresh[SIDE_D] = false;
        s->hello = s->awaiting = true;
        s->nonce_d = m->u.hello.nonce;
        h->last_hello = m->u.hello.nonce;
        break;
    case KVS_MSG_REGISTER: {
        CHECK(!s->registered); /* once per connection */
        if (h->key[SIDE_D] != NULL) {
            CHECK(s->verified); /* its keys only to a prefill that proved the secret */
            kvs_b32_t want;
            kvs__auth_decode_proof(h->key[SIDE_D], &s->nonce_d, &s->nonce_p, s->session_p, m,
                                   &want);
            CHECK(b32_eq(&want, &m->u.reg.proof));
        } else {
            CHECK(!s->hello && is_zero(&m->u.reg.proof, sizeof m->u.reg.proof));
        }
        s->registered = true;
        h->reg_tmpl = *m;
        if (on_step)
            st->registers++;
        break;
    }
    case KVS_MSG_CHALLENGE:
    case KVS_MSG_REGISTER_ACK:
        CHECK(!"a decode sends no CHALLENGE and no REGISTER_ACK");
        break;
    default:
        CHECK(s->acked); /* nothing else before the prefill accepted it */
        break;
    }
}

static void on_prefill_sent(harness_t *h, uint32_t c, const kvs_msg_t *m)
{
    step_t *st = &h->st;
    const bool on_step = st->active && st->side == SIDE_P && st->conn == c;
    switch (m->type) {
    case KVS_MSG_CHALLENGE:
        CHECK(on_step && st->type == KVS_MSG_HELLO && st->challenges++ == 0);
        st->challenge = m->u.challenge;
        h->last_chal = *m;
        h->have_chal = true;
        break;
    case KVS_MSG_REGISTER_ACK:
        CHECK(on_step && st->type == KVS_MSG_REGISTER && st->acks++ == 0);
        st->ack = m->u.ack;
        break;
    case KVS_MSG_HELLO:
    case KVS_MSG_REGISTER:
    case KVS_MSG_LAYERS:
        CHECK(!"a prefill sends no HELLO, REGISTER or LAYERS");
        break;
    default:
        break;
    }
}

static int afab_send(kvs_fabric_t *base, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                     uint64_t wr_id)
{
    afab_t *f = afab_of(base);
    harness_t *h = f->h;
    const uint32_t k = conn_index(f, conn);
    CHECK(msg != NULL && len_bytes <= KVS_CONTROL_MSG_MAX_BYTES);
    kvs_msg_t *m = &h->sent;
    CHECK(kvs__wire_decode(msg, len_bytes, m) == KVS_OK);
    CHECK(m->session == (f->side == SIDE_D ? SESSION_D : SESSION_P));
    CHECK(wr_id == (KVS__WR_CONTROL | (uint64_t)m->type));
    outbox_push(h, f->side, k, msg, len_bytes);
    if (m->type == KVS_MSG_ACK)
        return KVS_OK;
    /* A first post is one the link has not posted yet (sends never fail
     * here, so a message is posted once when sent, and later only when
     * sent again after a timeout, which this model leaves to fuzz_link). */
    const kvs__link_t *l = link_find(links_of(h, f->side), conn);
    CHECK(l != NULL && m->seq != 0);
    if (l->q_unsent == 0)
        return KVS_OK;
    if (f->side == SIDE_D)
        on_decode_sent(h, k, m);
    else
        on_prefill_sent(h, k, m);
    return KVS_OK;
}

static int afab_poll(kvs_fabric_t *base, kvs_completion_t *out, int max)
{
    afab_t *f = afab_of(base);
    if (!f->staged || max < 1)
        return 0;
    f->staged = false;
    memcpy(out, &f->cqe, sizeof *out);
    return 1;
}

static uint64_t afab_now_ns(kvs_fabric_t *base) { return afab_of(base)->h->now_ns; }

static int afab_connect(kvs_fabric_t *base, const char *peer, kvs_conn_t **out)
{
    afab_t *f = afab_of(base);
    harness_t *h = f->h;
    CHECK(f->side == SIDE_D); /* the decode makes every connection */
    CHECK(peer[0] == 'p' && (peer[1] == '0' || peer[1] == '1') && peer[2] == '\0');
    const int w = peer[1] - '0';
    uint32_t k;
    do { /* in turn, never the other writer's nor the one being delivered to */
        k = h->next_handle++ % NCONN_D;
    } while ((int)k == h->dw[1 - w].conn ||
             (h->st.active && h->st.side == SIDE_D && h->st.conn == k));
    h->dw[w] = (dwriter_t){.conn = (int)k};
    *out = conn_of(f, k);
    return KVS_OK;
}

static void afab_disconnect(kvs_fabric_t *base, kvs_conn_t *conn)
{
    afab_t *f = afab_of(base);
    if (f->side != SIDE_D)
        return;
    const int w = writer_of(f->h, conn_index(f, conn));
    if (w >= 0)
        f->h->dw[w].conn = -1;
}

static int afab_random(kvs_fabric_t *base, void *buf, size_t len_bytes)
{
    afab_t *f = afab_of(base);
    harness_t *h = f->h;
    if (h->setup) { /* the manager's probe at create */
        memset(buf, 0x5A, len_bytes);
        return KVS_OK;
    }
    CHECK(len_bytes == sizeof(kvs_b32_t));
    const uint8_t seed = in_u8(h->in);
    if (seed == 0xFF) { /* the source fails: the handshake is refused, and counted */
        h->refused[f->side]++;
        h->st.rng_failed = true;
        return KVS_EBACKEND;
    }
    pattern(&h->rng_last[f->side], seed);
    h->rng_fresh[f->side] = true;
    memcpy(buf, h->rng_last[f->side].b, len_bytes);
    return KVS_OK;
}

static int afab_peer_addr(kvs_fabric_t *base, kvs_conn_t *conn, char *buf, size_t bytes)
{
    afab_t *f = afab_of(base);
    snprintf(buf, bytes, "%c%u", f->side == SIDE_D ? 'p' : 'd', conn_index(f, conn));
    return KVS_OK;
}

static void afab_setup(harness_t *h, side_t side)
{
    afab_t *f = &h->fab[side];
    fake_fabric_setup(&f->fake, KVS_FABRIC_CAP_WRITE_IMM);
    f->h = h;
    f->side = side;
    f->nconn = side == SIDE_D ? NCONN_D : NCONN_P;
    kvs_fabric_ops_t *ops = &f->fake.base.ops;
    ops->send = afab_send;
    ops->poll = afab_poll;
    ops->now_ns = afab_now_ns;
    ops->connect = afab_connect;
    ops->disconnect = afab_disconnect;
    ops->random_bytes = afab_random;
    ops->peer_addr = afab_peer_addr;
}

/* ---- the model of the prefill's challenges ------------------------------ */

static pend_t *pend_find(harness_t *h, uint32_t c)
{
    for (uint32_t i = 0; i < h->pend_cap; i++)
        if (h->pend[i].used && h->pend[i].conn == c)
            return &h->pend[i];
    return NULL;
}

static void pend_put(harness_t *h, uint32_t c, uint64_t session_d, const kvs_b32_t *nonce_d,
                     const kvs_b32_t *nonce_p)
{
    pend_t *slot = pend_find(h, c);
    for (uint32_t i = 0; slot == NULL && i < h->pend_cap; i++)
        if (!h->pend[i].used)
            slot = &h->pend[i];
    if (slot == NULL) { /* full: the oldest goes */
        slot = &h->pend[0];
        for (uint32_t i = 1; i < h->pend_cap; i++)
            if (h->pend[i].age < slot->age)
                slot = &h->pend[i];
    }
    *slot = (pend_t){.used = true, .conn = c, .session_d = session_d, .age = h->pend_age++,
                     .nonce_d = *nonce_d, .nonce_p = *nonce_p};
}

static void pend_clear(harness_t *h, uint32_t c)
{
    pend_t *p = pend_find(h, c);
    if (p != NULL)
        *p = (pend_t){0};
}

/* ---- driving the handlers ----------------------------------------------- */

static kvs_handler_stats_t stats_of(harness_t *h, side_t side)
{
    kvs_handler_stats_t s;
    memset(&s, 0, sizeof s);
    if (side == SIDE_D)
        kvs_decode_stats(h->dec, &s);
    else
        kvs_prefill_stats(h->pre, &s);
    return s;
}

static void progress(harness_t *h, side_t side)
{
    const int rc = side == SIDE_D ? kvs_decode_progress(h->dec) : kvs_prefill_progress(h->pre);
    CHECK(rc >= 0);
}

/* After every op: the counts and the decode's ready peers. */
static void check_state(harness_t *h)
{
    for (int s = 0; s < 2; s++)
        CHECK(stats_of(h, (side_t)s).auth_refused == h->refused[s]);
    int64_t acked = 0;
    for (int w = 0; w < WRITERS; w++)
        acked += h->dw[w].acked;
    CHECK(kvs_decode_peers_ready(h->dec) <= acked);
}

/* The decode takes a CHALLENGE on k: what the model expects of it. */
typedef struct dexpect {
    int w;
    bool asked, valid;
    dwriter_t before;
} dexpect_t;

static dexpect_t decode_pre(harness_t *h, uint32_t k, const kvs_msg_t *m)
{
    dexpect_t e = {.w = writer_of(h, k)};
    if (e.w < 0)
        return e;
    dwriter_t *s = &h->dw[e.w];
    e.before = *s;
    if (m->type == KVS_MSG_CHALLENGE) {
        const kvs_msg_challenge_t *c = &m->u.challenge;
        e.asked = s->awaiting && c->echo == SESSION_D;
        if (e.asked && h->key[SIDE_D] != NULL && c->secured == 1) {
            kvs_b32_t want;
            kvs__auth_prefill_proof(h->key[SIDE_D], &s->nonce_d, &c->nonce, SESSION_D,
                                    m->session, &want);
            e.valid = b32_eq(&want, &c->proof);
        }
        if (e.valid) { /* the REGISTER may go while it is taken */
            s->verified = true;
            s->nonce_p = c->nonce;
            s->session_p = m->session;
        }
    } else if (m->type == KVS_MSG_REGISTER_ACK && m->u.ack.echo == SESSION_D &&
               m->u.ack.status == KVS_OK && s->registered) {
        s->acked = true; /* the rest may go while it is taken */
    }
    return e;
}

static void decode_post(harness_t *h, const dexpect_t *e, bool delivered, const kvs_msg_t *m)
{
    const bool challenge = m->type == KVS_MSG_CHALLENGE;
    CHECK(h->st.registers == (delivered && challenge && e->asked && e->valid ? 1 : 0));
    if (e->w < 0)
        return;
    if (!delivered && h->dw[e->w].conn == e->before.conn) {
        h->dw[e->w] = e->before; /* not taken: what it allowed may not go */
    } else if (delivered && challenge && e->asked) {
        h->dw[e->w].awaiting = false;
        if (!e->valid)
            h->refused[SIDE_D]++;
    }
}

/* A refusal that says nothing but the status: compared field by field
 * (memcmp would compare the structs' padding, which is not the wire's). */
static bool ack_is_bare(const kvs_msg_register_ack_t *a, uint64_t echo)
{
#define FP_ZERO(kind, name) &&a->fp.name == 0
    return a->echo == echo && a->status == KVS_EAUTH && a->tp_rank == 0 && a->pp_rank == 0 &&
           a->reserved == 0 && a->instance == 0 && a->dp_rank == 0 KVS_WIRE_FP_FIELDS(FP_ZERO);
#undef FP_ZERO
}

/* The prefill takes m on c: would it accept it as a REGISTER? */
static bool prefill_accepts(harness_t *h, uint32_t c, const kvs_msg_t *m)
{
    if (h->key[SIDE_P] == NULL)
        return true;
    const pend_t *p = pend_find(h, c);
    if (p == NULL || p->session_d != m->session)
        return false;
    kvs_b32_t want;
    kvs__auth_decode_proof(h->key[SIDE_P], &p->nonce_d, &p->nonce_p, SESSION_P, m, &want);
    return b32_eq(&want, &m->u.reg.proof);
}

static void prefill_post(harness_t *h, uint32_t c, bool delivered, bool accept,
                         const kvs_msg_t *m)
{
    step_t *st = &h->st;
    if (!delivered || (m->type != KVS_MSG_HELLO && m->type != KVS_MSG_REGISTER)) {
        CHECK(st->challenges == 0 && st->acks == 0);
        return;
    }
    if (m->type == KVS_MSG_HELLO) {
        const kvs_msg_challenge_t *ch = &st->challenge;
        if (h->key[SIDE_P] == NULL) {
            CHECK(st->challenges == 1 && ch->secured == 0 && ch->echo == m->session);
            CHECK(is_zero(&ch->nonce, sizeof ch->nonce) && is_zero(&ch->proof, sizeof ch->proof));
            return;
        }
        if (st->rng_failed) {
            CHECK(st->challenges == 0);
            return;
        }
        CHECK(st->challenges == 1 && ch->secured == 1 && ch->echo == m->session);
        CHECK(h->rng_fresh[SIDE_P] && b32_eq(&ch->nonce, &h->rng_last[SIDE_P]));
        h->rng_fresh[SIDE_P] = false;
        kvs_b32_t want;
        kvs__auth_prefill_proof(h->key[SIDE_P], &m->u.hello.nonce, &ch->nonce, m->session,
                                SESSION_P, &want);
        CHECK(b32_eq(&want, &ch->proof));
        pend_put(h, c, m->session, &m->u.hello.nonce, &ch->nonce);
        return;
    }
    /* REGISTER: answered once, refused exactly when the proof does not
     * check, and then with the status alone. */
    CHECK(st->acks == 1 && st->ack.echo == m->session);
    if (accept) {
        CHECK(st->ack.status != KVS_EAUTH);
    } else {
        CHECK(ack_is_bare(&st->ack, m->session));
        h->refused[SIDE_P]++;
    }
    if (h->key[SIDE_P] != NULL)
        pend_clear(h, c); /* one REGISTER per challenge */
}

/* Delivers len bytes to side on connection k, one progress call. */
static void deliver(harness_t *h, side_t side, uint32_t k, const uint8_t *b, uint32_t len)
{
    afab_t *f = &h->fab[side];
    step_t *st = &h->st;
    kvs_msg_t *m = &h->in_msg;
    *st = (step_t){.active = true, .side = side, .conn = k};
    st->decoded = kvs__wire_decode(b, len, m) == KVS_OK;
    if (!st->decoded)
        memset(m, 0, sizeof *m);
    st->type = m->type;
    f->cqe.kind = KVS_COMPLETION_RECV;
    f->cqe.status = KVS_OK;
    f->cqe.conn = conn_of(f, k);
    f->cqe.len_bytes = len;
    memcpy(f->cqe.msg, b, len);
    f->staged = true;

    const uint64_t received = stats_of(h, side).msgs_received;
    dexpect_t e = {.w = -1};
    bool accept = false;
    if (side == SIDE_D)
        e = decode_pre(h, k, m);
    else if (m->type == KVS_MSG_REGISTER)
        accept = prefill_accepts(h, k, m);
    progress(h, side);
    CHECK(!f->staged);
    const uint64_t got = stats_of(h, side).msgs_received - received;
    CHECK(got <= 1 && (got == 0 || st->decoded));
    if (side == SIDE_D)
        decode_post(h, &e, got == 1, m);
    else
        prefill_post(h, k, got == 1, accept, m);
    st->active = false;
}

static void disconnect(harness_t *h, side_t side, uint32_t k)
{
    afab_t *f = &h->fab[side];
    /* The link layer kills the connection's link (making one if a slot is
     * free) and the tick reports it dead: the prefill forgets its
     * challenge then. */
    const bool dies = link_find(links_of(h, side), conn_of(f, k)) != NULL ||
                      link_slot_free(links_of(h, side));
    h->st = (step_t){.active = true, .side = side, .conn = k};
    f->cqe = (kvs_completion_t){.kind = KVS_COMPLETION_DISCONNECT, .conn = conn_of(f, k)};
    f->staged = true;
    progress(h, side);
    CHECK(!f->staged && h->st.challenges == 0 && h->st.acks == 0 && h->st.registers == 0);
    h->st.active = false;
    if (side == SIDE_P && dies)
        pend_clear(h, k);
}

/* ---- building messages --------------------------------------------------- */

static uint64_t pick_session(input_t *in, uint64_t usual)
{
    switch (in_u8(in) % 4u) {
    case 0: return usual;
    case 1: return usual + 1u;                         /* another incarnation */
    case 2: return usual == SESSION_D ? SESSION_P : SESSION_D; /* the other side's */
    default: return in_u64(in);
    }
}

/* The sequence number side's link on k expects, one off, or any. */
static uint32_t pick_seq(harness_t *h, input_t *in, side_t side, uint32_t k)
{
    const kvs__link_t *l = link_find(links_of(h, side), conn_of(&h->fab[side], k));
    const uint32_t want = l != NULL ? l->expected : 1u;
    switch (in_u8(in) % 6u) {
    case 0:
    case 1:
    case 2: return want;
    case 3: return want - 1u;
    case 4: return want + 1u;
    default: return (uint32_t)in_u16(in);
    }
}

static void encode_deliver(harness_t *h, side_t side, uint32_t k, kvs_msg_t *m)
{
    uint32_t len = 0;
    CHECK(kvs__wire_encode(m, h->buf, sizeof h->buf, &len) == KVS_OK);
    deliver(h, side, k, h->buf, len);
}

/* A message of type in_u8 with len in_u8 payload bytes from the input
 * behind a well-formed header: the decoder decides what it is. */
static void raw_deliver(harness_t *h, input_t *in, side_t side, uint32_t k)
{
    const uint8_t type = in_u8(in);
    const uint32_t payload = in_u8(in);
    const uint32_t seq = pick_seq(h, in, side, k);
    const uint64_t session = pick_session(in, side == SIDE_D ? SESSION_P : SESSION_D);
    uint8_t *b = h->buf;
    const uint32_t fields[4] = {KVS_WIRE_MAGIC, KVS_WIRE_VERSION | (uint32_t)type << 16,
                                payload, seq};
    for (unsigned i = 0; i < 16u; i++)
        b[i] = (uint8_t)(fields[i / 4u] >> (8u * (i % 4u)));
    for (unsigned i = 0; i < 8u; i++)
        b[16 + i] = (uint8_t)(session >> (8u * i));
    for (uint32_t i = 0; i < payload; i++)
        b[KVS_WIRE_HEADER_BYTES + i] = in_u8(in);
    deliver(h, side, k, b, KVS_WIRE_HEADER_BYTES + payload);
}

/* A REGISTER to the prefill on c, from the decode's last one. */
static void forge_register(harness_t *h, input_t *in, uint32_t c)
{
    kvs_msg_t *m = &h->build;
    *m = h->reg_tmpl;
    const pend_t *own = pend_find(h, c);
    switch (in_u8(in) % 3u) {
    case 0: break; /* the decode's session */
    case 1: m->session = own != NULL ? own->session_d : m->session; break;
    default: m->session = pick_session(in, SESSION_D); break;
    }
    const uint8_t how = in_u8(in);
    const pend_t *p = how % 6u == 4u ? pend_find(h, in_u8(in) % NCONN_P) : own;
    switch (how % 6u) {
    case 0: /* proved for the challenge seen, with A or B */
    case 1:
    case 4: /* ... for another connection's */
        if (p != NULL)
            kvs__auth_decode_proof(how % 6u == 1u ? &key_b : &key_a, &p->nonce_d, &p->nonce_p,
                                   SESSION_P, m, &m->u.reg.proof);
        else
            memset(&m->u.reg.proof, 0, sizeof m->u.reg.proof);
        break;
    case 2: memset(&m->u.reg.proof, 0, sizeof m->u.reg.proof); break;
    case 3: pattern(&m->u.reg.proof, in_u8(in)); break;
    default: break; /* the captured proof, as it was */
    }
    const uint8_t swap = in_u8(in);
    if (swap & 1u) /* a field changed after the proof was made */
        m->u.reg.ring_rkey ^= 1u + (swap >> 1);
    m->seq = pick_seq(h, in, SIDE_P, c);
    encode_deliver(h, SIDE_P, c, m);
}

static void op_to_prefill(harness_t *h, input_t *in)
{
    const uint32_t c = in_u8(in) % NCONN_P;
    kvs_msg_t *m = &h->build;
    switch (in_u8(in) % 3u) {
    case 0: {
        memset(m, 0, sizeof *m);
        m->type = KVS_MSG_HELLO;
        m->session = pick_session(in, SESSION_D);
        const uint8_t n = in_u8(in);
        if (n & 1u)
            m->u.hello.nonce = h->last_hello; /* the decode's, replayed */
        else
            pattern(&m->u.hello.nonce, n);
        m->seq = pick_seq(h, in, SIDE_P, c);
        encode_deliver(h, SIDE_P, c, m);
        break;
    }
    case 1: forge_register(h, in, c); break;
    default: raw_deliver(h, in, SIDE_P, c); break;
    }
}

/* A connection of the decode: a writer's, or any handle. */
static uint32_t pick_dconn(harness_t *h, uint8_t b)
{
    const int k = h->dw[b & 1u].conn;
    return (b & 0x80u) || k < 0 ? b % NCONN_D : (uint32_t)k;
}

static void op_to_decode(harness_t *h, input_t *in)
{
    const uint32_t k = pick_dconn(h, in_u8(in));
    const int w = writer_of(h, k);
    kvs_msg_t *m = &h->build;
    memset(m, 0, sizeof *m);
    switch (in_u8(in) % 4u) {
    case 0: {
        const uint8_t how = in_u8(in);
        if (how % 5u == 4u && h->have_chal) { /* the prefill's last, replayed whole */
            *m = h->last_chal;
            break;
        }
        m->type = KVS_MSG_CHALLENGE;
        m->session = pick_session(in, SESSION_P);
        kvs_msg_challenge_t *c = &m->u.challenge;
        c->echo = pick_session(in, SESSION_D);
        c->secured = in_u8(in) % 4u != 0 ? 1u : in_u8(in);
        pattern(&c->nonce, in_u8(in));
        const kvs_b32_t *nonce_d = w >= 0 ? &h->dw[w].nonce_d : &h->last_hello;
        if (how % 5u < 2u)
            kvs__auth_prefill_proof(how % 5u == 1u ? &key_b : &key_a, nonce_d, &c->nonce,
                                    c->echo, m->session, &c->proof);
        else if (how % 5u == 3u)
            pattern(&c->proof, in_u8(in));
        break;
    }
    case 1: {
        static const int statuses[4] = {KVS_OK, KVS_EAUTH, KVS_EFINGERPRINT, KVS_EINVAL};
        m->type = KVS_MSG_REGISTER_ACK;
        m->session = pick_session(in, SESSION_P);
        m->u.ack.echo = pick_session(in, SESSION_D);
        m->u.ack.status = statuses[in_u8(in) % 4u];
        m->u.ack.cp_size = 1; /* CP rank 0 of 1, as the decode expects */
        break;
    }
    case 2:
        m->type = KVS_MSG_HELLO;
        m->session = pick_session(in, SESSION_P);
        pattern(&m->u.hello.nonce, in_u8(in));
        break;
    default:
        raw_deliver(h, in, SIDE_D, k);
        return;
    }
    m->seq = pick_seq(h, in, SIDE_D, k);
    encode_deliver(h, SIDE_D, k, m);
}

/* Relays the oldest post of `from` on its connection to the other side on
 * the connection the input names; b bit 6 keeps it for a replay. */
static void op_relay(harness_t *h, input_t *in, side_t from)
{
    const uint8_t b = in_u8(in), d = in_u8(in);
    const uint32_t src = from == SIDE_D ? pick_dconn(h, b) : b % NCONN_P;
    const uint32_t dst = from == SIDE_D ? d % NCONN_P : pick_dconn(h, d);
    const int i = outbox_find(h, from, src);
    if (i < 0)
        return;
    post_t p = *outbox_at(h, (uint32_t)i);
    if (!(b & 0x40u))
        outbox_remove(h, (uint32_t)i);
    deliver(h, from == SIDE_D ? SIDE_P : SIDE_D, dst, p.b, p.len);
}

static void op_advance(harness_t *h, input_t *in)
{
    const uint8_t how = in_u8(in);
    if (how % 3u == 0) {
        h->now_ns += in_u8(in);
    } else if (how % 3u == 1) {
        h->now_ns += (uint64_t)in_u16(in) << 8;
    } else { /* to the next deadline of either side */
        uint64_t t = kvs_decode_next_deadline_ns(h->dec);
        const uint64_t tp = kvs_prefill_next_deadline_ns(h->pre);
        t = tp < t ? tp : t;
        if (t != UINT64_MAX && t > h->now_ns && t - h->now_ns < (1ull << 32))
            h->now_ns = t;
    }
    progress(h, SIDE_D);
    progress(h, SIDE_P);
}

static void run(harness_t *h, input_t *in)
{
    for (uint32_t n = 0; n < MAX_OPS && in->left > 0; n++) {
        switch (in_u8(in) % 9u) {
        case 0: op_relay(h, in, SIDE_D); break;
        case 1: op_relay(h, in, SIDE_P); break;
        case 2: {
            const uint8_t b = in_u8(in);
            const side_t side = b & 0x20u ? SIDE_P : SIDE_D;
            const int i = outbox_find(h, side, side == SIDE_D ? pick_dconn(h, b) : b % NCONN_P);
            if (i >= 0)
                outbox_remove(h, (uint32_t)i); /* lost */
            break;
        }
        case 3: op_to_prefill(h, in); break;
        case 4: op_to_decode(h, in); break;
        case 5: op_advance(h, in); break;
        case 6: {
            const uint8_t b = in_u8(in);
            if (b & 0x20u)
                disconnect(h, SIDE_P, b % NCONN_P);
            else
                disconnect(h, SIDE_D, pick_dconn(h, b));
            break;
        }
        case 7: {
            const uint8_t b = in_u8(in);
            const char *names[WRITERS] = {"p0", "p1"};
            const int rc = b & 2u ? kvs_decode_connect_peer(h->dec, (kvs_peer_t){0, 0})
                                  : kvs_decode_connect(h->dec, names[b & 1u], b & 1u, 0);
            (void)rc; /* KVS_EALREADY while connected: either is fine */
            break;
        }
        default:
            progress(h, SIDE_D);
            progress(h, SIDE_P);
            break;
        }
        check_state(h);
    }
}

/* ---- set-up -------------------------------------------------------------- */

static void quiet_log(void *user, kvs_log_level_t level, const char *msg)
{
    (void)user;
    (void)level;
    (void)msg;
}

static kvs_manager_config_t config(side_t side, const char *secret_env)
{
    kvs_manager_config_t c = {
        .role = side == SIDE_D ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL,
        .staging = true,
        .total_heads = 4,
        .head_dim = 16,
        .dtype = KVS_DTYPE_BF16,
        .layers = LAYERS,
        .page_size = 4,
        .tp_rank = 0,
        .tp_size = side == SIDE_D ? 1 : 2,
        .pp_size = 1,
        .peer_tp_size = side == SIDE_D ? 2 : 1,
        .chunk_tokens = 16,
        .ring_bytes = 64u << 10,
        .ring_max_live = 8,
        .transfer_workers = 1,
        .max_rooms = 4,
        .max_inflight_writes = 4,
        .session_id = side == SIDE_D ? SESSION_D : SESSION_P,
        .stall_timeout_ns = 1ull << 50, /* links never give up within a run */
        .retry_timeout_ns = 1000,
        .max_instances = 2,
        .max_peers = 2,
        .secret_env = secret_env,
        .log = {.fn = quiet_log, .level = KVS_LOG_OFF},
    };
    return c;
}

static void make_side(harness_t *h, side_t side, const char *secret_env)
{
    static const uint64_t k_base[LAYERS] = {0x10000, 0x20000};
    static const uint64_t v_base[LAYERS] = {0x30000, 0x40000};
    fake_device_setup(&h->dev[side]);
    afab_setup(h, side);
    const kvs_manager_config_t c = config(side, secret_env);
    kvs_error_t err;
    CHECK(kvs_manager_create(&c, &h->dev[side].base, &h->fab[side].fake.base, &h->m[side],
                             &err) == KVS_OK);
    const kvs_kv_buffers_t kv = {.num_layers = LAYERS, .k_base = k_base, .v_base = v_base,
                                 .local_heads = side == SIDE_D ? 4 : 2, .page_size = 4,
                                 .num_pages = POOL_PAGES};
    CHECK(kvs_manager_init_staging(h->m[side]) == KVS_OK);
    CHECK(kvs_manager_register_staging(h->m[side]) == KVS_OK);
    CHECK(kvs_manager_set_kv_buffers(h->m[side], &kv) == KVS_OK);
    if (side == SIDE_D)
        CHECK(kvs_decode_create(h->m[side], &h->dec) == KVS_OK);
    else
        CHECK(kvs_prefill_create(h->m[side], &h->pre) == KVS_OK);
}

/* A REGISTER as the decode makes it, before it made one. */
static void register_template(harness_t *h)
{
    kvs_msg_t *m = &h->reg_tmpl;
    memset(m, 0, sizeof *m);
    m->type = KVS_MSG_REGISTER;
    m->session = SESSION_D;
    kvs_msg_register_t *g = &m->u.reg;
    const kvs_manager_config_t c = config(SIDE_D, NULL);
    CHECK(kvs_manager_staging_buffer(h->m[SIDE_D], 0, &g->ring_addr, &g->ring_bytes,
                                     &g->ring_rkey) == KVS_OK);
    kvs__fingerprint(kvs_manager_layout(h->m[SIDE_D]), kvs_manager_path(h->m[SIDE_D]), &c,
                     &g->fp);
    g->tp_size = 1;
    g->pp_size = 1;
    g->local_heads = 4;
    g->num_pages = POOL_PAGES;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    CHECK(setenv(SECRET_A_ENV, SECRET_A, 1) == 0 && setenv(SECRET_B_ENV, SECRET_B, 1) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const envs[4] = {NULL, SECRET_A_ENV, SECRET_A_ENV, SECRET_B_ENV};
    static const kvs__secret_t *const keys[4] = {NULL, &key_a, &key_a, &key_b};
    input_t in = {.p = data, .left = size};
    harness_t *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    h->in = &in;
    h->setup = true;
    const uint8_t mode = in_u8(&in);
    h->key[SIDE_D] = keys[mode & 3u];
    h->key[SIDE_P] = keys[(mode >> 2) & 3u];
    for (int w = 0; w < WRITERS; w++)
        h->dw[w].conn = -1;
    for (uint32_t i = 0; i < OUTBOX_MAX; i++)
        h->order[i] = (uint8_t)i;
    make_side(h, SIDE_D, envs[mode & 3u]);
    make_side(h, SIDE_P, envs[(mode >> 2) & 3u]);
    h->pend_cap = kvs__prefill_links(h->pre)->cap;
    CHECK(h->pend_cap <= sizeof h->pend / sizeof h->pend[0]);
    register_template(h);
    h->setup = false;

    CHECK(kvs_decode_connect(h->dec, "p0", 0, 0) == KVS_OK);
    if (mode & 0x10u)
        CHECK(kvs_decode_connect(h->dec, "p1", 1, 0) == KVS_OK);
    check_state(h);
    run(h, &in);

    kvs_decode_destroy(h->dec);
    kvs_prefill_destroy(h->pre);
    for (int s = 0; s < 2; s++) {
        CHECK(kvs_manager_destroy(h->m[s]) == KVS_OK);
        CHECK(h->dev[s].live_allocs == 0 && h->dev[s].live_streams == 0 &&
              h->dev[s].live_events == 0 && h->fab[s].fake.live_mrs == 0);
    }
    free(h);
    return 0;
}
