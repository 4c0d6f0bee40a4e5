/*
 * fuzz_link.c - libFuzzer target for the reliable control link (src/link.c):
 * sequence numbers, cumulative ACKs, go-back-N retransmission, give-up and
 * dead connections, checked op by op against a model written in this file
 * from link.h.
 *
 * Input: byte 0 picks the mode (bit 0: no stats; bit 1: timeouts drawn from
 * all 64-bit values; bits 2-3: 3, 2, 1 or 0 link slots), then rto_min,
 * rto_max (may be below rto_min), give_up and the start of the clock, then
 * a sequence of ops, each an opcode byte and a connection byte followed by
 * its operands, on NCONN connections of a fake fabric (one more than the
 * most slots; its clock is the input's, and it records each post): send a
 * message (any type but ACK, a few entries), a burst of sends; receive a
 * well-formed message with a chosen sequence number (next expected,
 * duplicate, future, 0, any), an ACK with a chosen cum (all, part, one past
 * what was sent, far past, 2^31 ahead, 2^31 - 1 behind, any), garbage
 * (random bytes, a valid message with one byte flipped, a wrong length);
 * advance the clock (a little, a lot, to the next retransmission, to a
 * give-up edge); tick (its on_dead may send on a connection again, as the
 * handlers do, or be NULL); kill; forget; make the fabric's sends on a
 * connection succeed, or fail with KVS_EAGAIN, KVS_EPEER or KVS_ENOTSUP.
 * The model places a new link in the lowest free slot, as the table does,
 * so that a tick visits links in the same order on both sides.
 *
 * Each op runs on the links and on the model; both write an event log (each
 * post the fabric saw: connection, wr_id, bytes, what the fabric returned;
 * each on_dead; each send made from on_dead) and the two must be equal, as
 * must every return code. So, among others:
 * - kvs__link_recv returns 1 exactly for the connection's next expected
 *   sequence number, and then expects the next one; duplicates and future
 *   ones return 0 (and an ACK is owed); malformed bytes and an unsequenced
 *   message other than an ACK return KVS_EPROTO; a new connection with no
 *   slot left returns KVS_EFULL;
 * - an ACK for a connection without a link, or with a cum ahead of the last
 *   sequence number sent (serial arithmetic: 1..2^31 ahead), is refused
 *   with KVS_EPROTO and changes nothing; otherwise it drops exactly the
 *   queued messages up to cum, and progress restarts the timeout at the
 *   one the round-trip estimator gives (after a sample when cum covers the
 *   message being timed);
 * - the link times one message at a time, from its first post (the first
 *   message posted while none is timed) to an ACK whose cum is its
 *   sequence number; an ACK past it, or a retransmission pass, ends the
 *   timing with no sample. The estimator's arithmetic (kvs__rtt_sample and
 *   kvs__rtt_timeout) is shared with the model, and checked on its own by
 *   tests/test_link.c; what this target checks is which messages make
 *   samples and when the timeout changes;
 * - a send queues the message encoded with the next sequence number (from
 *   1), wr_id KVS__WR_CONTROL | type, then posts every queued message that
 *   never went out, oldest first, until the fabric refuses one (those wait,
 *   in order, for a later tick: none is posted ahead of an older refused
 *   one); it returns KVS_EPEER (and the link is dead) when the fabric says
 *   so, KVS_OK when it says anything else; a dead link refuses sends
 *   without posting;
 * - a tick posts the ACK owed (cum = last in-order sequence number; one the
 *   fabric refuses with KVS_EAGAIN stays owed, but makes no deadline of 0),
 *   then the messages that never went out, as a send does, then, with a
 *   non-empty queue: kills the link after give_up_ns without ACK progress,
 *   or once the retry time passed posts the oldest KVS__LINK_RESEND_BATCH
 *   queued messages again, in order, byte for byte as first sent, stopping
 *   at the first post the fabric refuses, and doubles the timeout up to
 *   rto_max (saturating: a timeout never wraps to a shorter one);
 *   nothing is posted on a dead link; each dead link is freed before its
 *   on_dead, which is called exactly once for it;
 * - a kill marks the connection's link dead, making one if the connection
 *   has none (link.h: reported even if nothing was sent) and a slot is free
 *   (none free: nothing is reported); a forget drops the link and its
 *   queue, and nothing is reported for it;
 * - after every op: kvs__link_unacked of each connection is the model's
 *   count of sent, unacknowledged messages, kvs__links_deadline is the
 *   model's (0 while a death or an ACK not refused is owed, else the
 *   earliest retry time), kvs__links_srtt_max is the model's largest
 *   smoothed round trip over live links, and the stats counters (sent,
 *   duplicate, retransmitted, peers lost) equal the model's;
 * - no leak, no out-of-bounds access, no undefined behaviour (ASan, LSan,
 *   UBSan).
 * Sequence numbers stay far below 2^31 (a few thousand ops), so the model
 * compares them as plain integers, except for the ACK checks above.
 */
#include "channel.h"
#include "link.h"
#include "wire.h"

#include "fuzz_support.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SLOTS 3u             /* link slots of the table, at most */
#define NCONN (MAX_SLOTS + 1u)   /* connections: one more, so slots run out */
#define MAX_OPS 4096u
#define CLOCK_MAX (1ull << 62)   /* the clock never comes near a wrap */
#define MAX_EVENTS 100000u       /* bounds one op's log (a burst is 255 posts) */
#define HARNESS_SESSION 0x5E5510Full /* the session of the handler owning the links */

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* ---- event log ---------------------------------------------------------- */

typedef enum ev_kind { EV_POST, EV_DEAD, EV_SEND } ev_kind_t;

typedef struct ev {
    ev_kind_t kind;
    uint32_t conn;
    int rc;         /* POST: what the fabric returned; SEND: what the send did */
    uint64_t wr_id; /* POST */
    uint32_t len, off; /* POST: bytes in the log's arena */
} ev_t;

typedef struct evlog {
    ev_t *v;
    uint32_t n, cap;
    uint8_t *bytes;
    size_t nbytes, bcap;
} evlog_t;

static void log_add(evlog_t *lg, ev_kind_t kind, uint32_t conn, int rc, uint64_t wr_id,
                    const uint8_t *b, uint32_t len)
{
    CHECK(lg->n < MAX_EVENTS);
    if (lg->n == lg->cap) {
        lg->cap = lg->cap ? 2 * lg->cap : 64;
        lg->v = realloc(lg->v, lg->cap * sizeof *lg->v);
        CHECK(lg->v != NULL);
    }
    if (lg->nbytes + len > lg->bcap) {
        while (lg->nbytes + len > lg->bcap)
            lg->bcap = lg->bcap ? 2 * lg->bcap : 8192;
        lg->bytes = realloc(lg->bytes, lg->bcap);
        CHECK(lg->bytes != NULL);
    }
    if (len > 0)
        memcpy(lg->bytes + lg->nbytes, b, len);
    lg->v[lg->n++] = (ev_t){.kind = kind, .conn = conn, .rc = rc, .wr_id = wr_id,
                            .len = len, .off = (uint32_t)lg->nbytes};
    lg->nbytes += len;
}

static void log_reset(evlog_t *lg)
{
    lg->n = 0;
    lg->nbytes = 0;
}

static void log_free(evlog_t *lg)
{
    free(lg->v);
    free(lg->bytes);
}

static void log_dump(const char *name, const evlog_t *lg)
{
    fprintf(stderr, "%s (%u events):\n", name, lg->n);
    for (uint32_t i = 0; i < lg->n; i++) {
        const ev_t *e = &lg->v[i];
        static const char *const kinds[] = {"post", "dead", "send"};
        fprintf(stderr, "  %s conn %u rc %d", kinds[e->kind], e->conn, e->rc);
        if (e->kind == EV_POST) {
            kvs_msg_t m;
            if (kvs__wire_decode(lg->bytes + e->off, e->len, &m) == KVS_OK)
                fprintf(stderr, " %s seq %u%s%u", kvs__wire_type_name(m.type), m.seq,
                        m.type == KVS_MSG_ACK ? " cum " : " len ",
                        m.type == KVS_MSG_ACK ? m.u.ack_link.cum : e->len);
            else
                fprintf(stderr, " undecodable, len %u", e->len);
        }
        fputc('\n', stderr);
    }
}

static bool ev_equal(const evlog_t *a, const ev_t *x, const evlog_t *b, const ev_t *y)
{
    return x->kind == y->kind && x->conn == y->conn && x->rc == y->rc &&
           x->wr_id == y->wr_id && x->len == y->len &&
           (x->len == 0 || memcmp(a->bytes + x->off, b->bytes + y->off, x->len) == 0);
}

/* ---- the fake fabric ---------------------------------------------------- */

typedef struct fake {
    kvs_fabric_t base;   /* first: recovered with KVS_CONTAINER_OF */
    uint64_t now_ns;
    char tags[NCONN];    /* the connection handles are their addresses */
    int fail[NCONN];     /* what a send on each connection returns */
    evlog_t *log;
} fake_t;

static kvs_conn_t *conn_of(fake_t *f, uint32_t k) { return (kvs_conn_t *)(void *)&f->tags[k]; }

static uint32_t conn_index(const fake_t *f, const kvs_conn_t *conn)
{
    const char *p = (const char *)(const void *)conn;
    CHECK(p >= f->tags && p < f->tags + NCONN);
    return (uint32_t)(p - f->tags);
}

static int fake_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                            uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    return KVS_ENOTSUP;
}

static int fake_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr) { return KVS_ENOTSUP; }

static int fake_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                     uint64_t wr_id)
{
    fake_t *f = KVS_CONTAINER_OF(fab, fake_t, base);
    const uint32_t k = conn_index(f, conn);
    CHECK(msg != NULL && len_bytes <= KVS_CONTROL_MSG_MAX_BYTES);
    log_add(f->log, EV_POST, k, f->fail[k], wr_id, msg, len_bytes);
    return f->fail[k];
}

static uint64_t fake_now_ns(kvs_fabric_t *fab)
{
    return KVS_CONTAINER_OF(fab, fake_t, base)->now_ns;
}

static const kvs_fabric_ops_t fake_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    .name = "fuzz-link",
    .mr_register = fake_mr_register,
    .mr_deregister = fake_mr_deregister,
    .send = fake_send,
    .now_ns = fake_now_ns,
};

/* ---- the model ---------------------------------------------------------- */

typedef struct mentry {
    uint32_t seq, len;
    kvs_msg_type_t type;
    uint8_t *bytes;     /* as first posted */
} mentry_t;

typedef struct mlink {
    bool used;
    uint32_t conn;
    bool dead, ack_due, ack_refused;
    uint32_t next_seq, expected;
    mentry_t *q;        /* q[head..n) are queued, oldest first */
    uint32_t unsent;    /* the newest `unsent` queued never went out */
    uint32_t head, n, cap;
    uint64_t rto_ns, retry_ns, since_ns;
    kvs__rtt_t rtt;
    uint32_t timed_seq; /* 0: none */
    uint64_t timed_ns;
} mlink_t;

typedef struct model {
    mlink_t slot[MAX_SLOTS];
    uint32_t cap;
    uint64_t rto_min_ns, rto_max_ns, give_up_ns;
    uint64_t sent, duplicate, retransmitted, lost;
} model_t;

static uint32_t mq_count(const mlink_t *l) { return l->n - l->head; }

static void mlink_clear(mlink_t *l)
{
    for (uint32_t i = l->head; i < l->n; i++)
        free(l->q[i].bytes);
    free(l->q);
    *l = (mlink_t){0};
}

static mlink_t *mlink_find(model_t *m, uint32_t k)
{
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->slot[i].used && m->slot[i].conn == k)
            return &m->slot[i];
    return NULL;
}

/* k's link, made in the lowest free slot on first use. */
static mlink_t *mlink_get(model_t *m, uint32_t k)
{
    mlink_t *l = mlink_find(m, k);
    for (uint32_t i = 0; l == NULL && i < m->cap; i++) {
        if (!m->slot[i].used) {
            l = &m->slot[i];
            *l = (mlink_t){.used = true, .conn = k, .next_seq = 1, .expected = 1,
                           .rto_ns = m->rto_min_ns};
        }
    }
    return l;
}

static void mq_push(mlink_t *l, uint32_t seq, kvs_msg_type_t type, const uint8_t *b, uint32_t len)
{
    if (l->head > 0 && l->n == l->cap) {
        memmove(l->q, l->q + l->head, mq_count(l) * sizeof *l->q);
        l->n -= l->head;
        l->head = 0;
    }
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->q = realloc(l->q, l->cap * sizeof *l->q);
        CHECK(l->q != NULL);
    }
    uint8_t *copy = malloc(len);
    CHECK(copy != NULL);
    memcpy(copy, b, len);
    l->q[l->n++] = (mentry_t){.seq = seq, .len = len, .type = type, .bytes = copy};
}

typedef struct harness {
    fake_t fab;
    kvs__links_t ls;
    kvs_handler_stats_t stats;
    bool with_stats;
    model_t m;
    evlog_t real, want;
    kvs_completion_t cqe;
    /* on_dead during the current tick sends this on reenter_conn (when set) */
    bool reenter;
    bool silent;        /* the current tick has no on_dead */
    uint32_t reenter_conn;
    kvs_msg_t reenter_msg;
} harness_t;

static int model_post(harness_t *h, mlink_t *l, kvs_msg_type_t type, const uint8_t *b,
                      uint32_t len)
{
    const int rc = h->fab.fail[l->conn];
    log_add(&h->want, EV_POST, l->conn, rc, KVS__WR_CONTROL | (uint64_t)type, b, len);
    if (rc == KVS_EPEER)
        l->dead = true;
    return rc;
}

/* Posts the queued messages that never went out, oldest first, until the
 * fabric refuses one. */
static void model_flush(harness_t *h, mlink_t *l)
{
    if (l->unsent == 0 || l->dead)
        return;
    while (l->unsent > 0) {
        const mentry_t *e = &l->q[l->n - l->unsent];
        if (model_post(h, l, e->type, e->bytes, e->len) != KVS_OK)
            break;
        if (l->timed_seq == 0) {
            l->timed_seq = e->seq;
            l->timed_ns = h->fab.now_ns;
        }
        l->unsent--;
    }
}

static int model_send(harness_t *h, uint32_t k, const kvs_msg_t *msg)
{
    mlink_t *l = mlink_get(&h->m, k);
    if (l == NULL)
        return KVS_EFULL;
    if (l->dead)
        return KVS_EPEER;
    kvs_msg_t mm = *msg;
    mm.seq = l->next_seq;
    mm.session = HARNESS_SESSION;
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t len = 0;
    CHECK(kvs__wire_encode(&mm, buf, sizeof buf, &len) == KVS_OK);
    mq_push(l, mm.seq, mm.type, buf, len);
    if (mq_count(l) == 1) {
        l->since_ns = h->fab.now_ns;
        l->retry_ns = sat_add(h->fab.now_ns, l->rto_ns);
    }
    l->next_seq++;
    CHECK(l->next_seq < (1u << 30)); /* far from the wrap, as the header says */
    l->unsent++;
    model_flush(h, l);
    if (l->dead)
        return KVS_EPEER;
    h->m.sent++;
    return KVS_OK;
}

/* What kvs__link_recv must return for these bytes on connection k; *seq and
 * *type get the message's when it is 1. */
static int model_recv(harness_t *h, uint32_t k, const uint8_t *b, uint32_t len, uint32_t *seq,
                      kvs_msg_type_t *type)
{
    kvs_msg_t msg;
    if (kvs__wire_decode(b, len, &msg) != KVS_OK)
        return KVS_EPROTO;
    if (msg.type == KVS_MSG_ACK) {
        mlink_t *l = mlink_find(&h->m, k);
        if (l == NULL)
            return KVS_EPROTO;
        const uint32_t last = l->next_seq - 1u, cum = msg.u.ack_link.cum;
        const uint32_t ahead = cum - last;
        if (ahead >= 1u && ahead <= 0x80000000u)
            return KVS_EPROTO; /* past what was sent */
        bool moved = false;
        while (cum <= last && mq_count(l) > 0 && l->q[l->head].seq <= cum) {
            free(l->q[l->head].bytes);
            l->head++;
            moved = true;
        }
        if (l->unsent > mq_count(l))
            l->unsent = mq_count(l);
        if (moved && l->timed_seq != 0 && l->timed_seq == cum)
            kvs__rtt_sample(&l->rtt, h->fab.now_ns - l->timed_ns);
        if (moved && l->timed_seq != 0 && l->timed_seq <= cum)
            l->timed_seq = 0;
        if (moved) {
            l->rto_ns = kvs__rtt_timeout(&l->rtt, h->m.rto_min_ns, h->m.rto_max_ns);
            l->since_ns = h->fab.now_ns;
            l->retry_ns = sat_add(h->fab.now_ns, l->rto_ns);
        }
        return 0;
    }
    if (msg.seq == 0)
        return KVS_EPROTO;
    mlink_t *l = mlink_get(&h->m, k);
    if (l == NULL)
        return KVS_EFULL;
    l->ack_due = true;
    if (msg.seq != l->expected) {
        h->m.duplicate++;
        return 0;
    }
    l->expected++;
    *seq = msg.seq;
    *type = msg.type;
    return 1;
}

static void model_tick(harness_t *h)
{
    model_t *m = &h->m;
    const uint64_t now = h->fab.now_ns;
    for (uint32_t i = 0; i < m->cap; i++) {
        mlink_t *l = &m->slot[i];
        if (!l->used)
            continue;
        if (l->ack_due && !l->dead) {
            kvs_msg_t ack = {.type = KVS_MSG_ACK, .seq = 0, .session = HARNESS_SESSION};
            ack.u.ack_link.cum = l->expected - 1u;
            uint8_t buf[64];
            uint32_t len = 0;
            CHECK(kvs__wire_encode(&ack, buf, sizeof buf, &len) == KVS_OK);
            l->ack_refused = model_post(h, l, KVS_MSG_ACK, buf, len) == KVS_EAGAIN;
            l->ack_due = l->ack_refused;
        }
        model_flush(h, l);
        if (mq_count(l) > 0 && now - l->since_ns >= m->give_up_ns)
            l->dead = true;
        if (mq_count(l) > 0 && now >= l->retry_ns && !l->dead) {
            l->timed_seq = 0;
            for (uint32_t j = 0; j < mq_count(l) && j < KVS__LINK_RESEND_BATCH && !l->dead;
                 j++) {
                const mentry_t *e = &l->q[l->head + j];
                if (model_post(h, l, e->type, e->bytes, e->len) != KVS_OK)
                    break;
                if (e->seq == l->timed_seq)
                    l->timed_seq = 0;
                m->retransmitted++;
            }
            const uint64_t twice = sat_add(l->rto_ns, l->rto_ns);
            l->rto_ns = twice < m->rto_max_ns ? twice : m->rto_max_ns;
            l->retry_ns = sat_add(now, l->rto_ns);
        }
        if (l->dead) {
            const uint32_t k = l->conn;
            mlink_clear(l);
            m->lost++;
            if (h->silent)
                continue;
            log_add(&h->want, EV_DEAD, k, 0, 0, NULL, 0);
            if (h->reenter) {
                const int rc = model_send(h, h->reenter_conn, &h->reenter_msg);
                log_add(&h->want, EV_SEND, h->reenter_conn, rc, 0, NULL, 0);
            }
        }
    }
}

static uint64_t model_deadline(const model_t *m)
{
    uint64_t t = UINT64_MAX;
    for (uint32_t i = 0; i < m->cap; i++) {
        const mlink_t *l = &m->slot[i];
        if (!l->used)
            continue;
        if (l->dead || (l->ack_due && !l->ack_refused))
            return 0;
        if (mq_count(l) > 0 && l->retry_ns < t)
            t = l->retry_ns;
    }
    return t;
}

/* ---- the harness -------------------------------------------------------- */

static void on_dead(void *ctx, kvs_conn_t *conn, void *owner, const char *why)
{
    harness_t *h = ctx;
    const uint32_t k = conn_index(&h->fab, conn);
    CHECK(kvs__link_unacked(&h->ls, conn) == 0); /* freed before it is reported */
    CHECK(owner == NULL);                          /* the harness binds none */
    CHECK(why != NULL && why[0] != '\0');          /* the log always says why */
    log_add(&h->real, EV_DEAD, k, 0, 0, NULL, 0);
    if (h->reenter) {
        const int rc = kvs__link_send(&h->ls, conn_of(&h->fab, h->reenter_conn), &h->reenter_msg);
        log_add(&h->real, EV_SEND, h->reenter_conn, rc, 0, NULL, 0);
    }
}

/* A message of type 1..11 (never ACK: links send those themselves) with
 * a few entries where it has any (0-7; count bytes from 248 up keep their
 * value, so long messages, which make the queue grow, stay reachable but
 * rare: encoding them, twice per send, was most of the target's time),
 * fields filled from `fill`. */
static void build_msg(kvs_msg_t *msg, uint8_t type_b, uint8_t count_b, uint8_t fill)
{
    if (count_b < 248u)
        count_b %= 8u;
    memset(msg, 0, sizeof *msg);
    msg->type = (kvs_msg_type_t)(1u + type_b % (KVS_MSG_TYPE_MAX - 1u));
    const uint64_t v = 0x0101010101010101ull * fill;
    switch (msg->type) {
    case KVS_MSG_LAYERS:
        msg->u.layers.first = (int64_t)v;
        msg->u.layers.count = count_b % (KVS_WIRE_LAYERS_PER_MSG + 1u);
        for (uint32_t i = 0; i < msg->u.layers.count; i++)
            msg->u.layers.entries[i].k_addr = v + i;
        break;
    case KVS_MSG_PAGES:
        msg->u.pages.room = v;
        msg->u.pages.count = count_b;
        for (uint32_t i = 0; i < msg->u.pages.count; i++)
            msg->u.pages.ids[i] = (int64_t)(fill * 1000u + i);
        break;
    default:
        /* room is the first field of ROOM (and of most other payloads) */
        msg->u.room.room = v + count_b;
        break;
    }
}

static void read_msg(input_t *in, kvs_msg_t *msg)
{
    const uint8_t t = in_u8(in), c = in_u8(in), f = in_u8(in);
    build_msg(msg, t, c, f);
}

/* The events of this op and the links' state against the model's. */
static void compare(harness_t *h, uint32_t op_index)
{
    bool same = h->real.n == h->want.n;
    for (uint32_t i = 0; same && i < h->real.n; i++)
        same = ev_equal(&h->real, &h->real.v[i], &h->want, &h->want.v[i]);
    if (!same) {
        fprintf(stderr, "op %u: the links and the model disagree\n", op_index);
        log_dump("links", &h->real);
        log_dump("model", &h->want);
    }
    CHECK(same);
    log_reset(&h->real);
    log_reset(&h->want);

    for (uint32_t k = 0; k < NCONN; k++) {
        const mlink_t *l = mlink_find(&h->m, k);
        CHECK(kvs__link_unacked(&h->ls, conn_of(&h->fab, k)) == (l ? mq_count(l) : 0));
    }
    CHECK(kvs__link_unacked(&h->ls, NULL) == 0);
    const uint64_t deadline = kvs__links_deadline(&h->ls);
    if (deadline != model_deadline(&h->m))
        fprintf(stderr, "op %u: deadline %llu, model %llu\n", op_index,
                (unsigned long long)deadline, (unsigned long long)model_deadline(&h->m));
    CHECK(deadline == model_deadline(&h->m));
    uint64_t srtt = 0;
    for (uint32_t i = 0; i < h->m.cap; i++)
        if (h->m.slot[i].used && !h->m.slot[i].dead && h->m.slot[i].rtt.srtt_ns > srtt)
            srtt = h->m.slot[i].rtt.srtt_ns;
    CHECK(kvs__links_srtt_max(&h->ls) == srtt);
    if (h->with_stats) {
        CHECK(h->stats.msgs_sent == h->m.sent);
        CHECK(h->stats.msgs_duplicate == h->m.duplicate);
        CHECK(h->stats.msgs_retransmitted == h->m.retransmitted);
        CHECK(h->stats.peers_lost == h->m.lost);
    }
}

static void do_send(harness_t *h, uint32_t k, const kvs_msg_t *msg)
{
    const int rc = kvs__link_send(&h->ls, conn_of(&h->fab, k), msg);
    CHECK(rc == model_send(h, k, msg));
}

/* Delivers the first len bytes of h->cqe.msg as a RECV on k. */
static void do_recv(harness_t *h, uint32_t k, uint32_t len)
{
    h->cqe.kind = KVS_COMPLETION_RECV;
    h->cqe.status = KVS_OK;
    h->cqe.conn = conn_of(&h->fab, k);
    h->cqe.len_bytes = len;
    uint32_t want_seq = 0;
    kvs_msg_type_t want_type = 0;
    const int want = model_recv(h, k, h->cqe.msg, len, &want_seq, &want_type);
    kvs_msg_t *msg = malloc(sizeof *msg);
    CHECK(msg != NULL);
    const int rc = kvs__link_recv(&h->ls, &h->cqe, msg);
    if (rc != want)
        fprintf(stderr, "recv on conn %u: links %d, model %d\n", k, rc, want);
    CHECK(rc == want);
    if (rc == 1)
        CHECK(msg->seq == want_seq && msg->type == want_type);
    free(msg);
}

/* Encodes msg with sequence number seq into h->cqe.msg; returns its length. */
static uint32_t encode_in(harness_t *h, kvs_msg_t *msg, uint32_t seq)
{
    msg->seq = seq;
    uint32_t len = 0;
    CHECK(kvs__wire_encode(msg, h->cqe.msg, sizeof h->cqe.msg, &len) == KVS_OK);
    return len;
}

static uint32_t expected_of(harness_t *h, uint32_t k)
{
    const mlink_t *l = mlink_find(&h->m, k);
    return l != NULL ? l->expected : 1u;
}

static void op_recv_msg(harness_t *h, input_t *in, uint32_t k)
{
    const uint32_t exp = expected_of(h, k);
    const uint8_t sel = in_u8(in);
    uint32_t seq;
    switch (sel % 6u) {
    case 0: seq = exp; break;                                  /* in order */
    case 1: seq = exp - 1u; break;                             /* duplicate (or 0) */
    case 2: seq = exp + 1u + in_u8(in); break;                 /* after a loss */
    case 3: seq = 0; break;                                    /* unsequenced */
    case 4: seq = exp - 1u - in_u8(in); break;                 /* old, or wrapped */
    default:                                                   /* anything */
        seq = (uint32_t)in_u16(in) | (uint32_t)in_u16(in) << 16;
        break;
    }
    kvs_msg_t msg;
    read_msg(in, &msg);
    do_recv(h, k, encode_in(h, &msg, seq));
}

static void op_recv_ack(harness_t *h, input_t *in, uint32_t k)
{
    const mlink_t *l = mlink_find(&h->m, k);
    const uint32_t last = l != NULL ? l->next_seq - 1u : 0;
    const uint32_t oldest = l != NULL && mq_count(l) > 0 ? l->q[l->head].seq : last;
    const uint8_t sel = in_u8(in);
    uint32_t cum;
    switch (sel % 8u) {
    case 0: cum = last; break;                                       /* everything */
    case 1: cum = oldest; break;                                     /* the oldest */
    case 2: cum = oldest + in_u8(in) % (last - oldest + 1u); break;  /* some */
    case 3: cum = last + 1u; break;                                  /* one too many */
    case 4: cum = last + 1u + in_u16(in); break;                     /* far past */
    case 5: cum = last - 0x80000000u; break;                         /* 2^31 ahead */
    case 6: cum = last + 0x80000001u; break;                         /* 2^31 - 1 behind */
    default: cum = (uint32_t)in_u16(in) | (uint32_t)in_u16(in) << 16; break;
    }
    kvs_msg_t ack = {.type = KVS_MSG_ACK};
    ack.u.ack_link.cum = cum;
    ack.u.ack_link.reserved = in_u8(in);
    do_recv(h, k, encode_in(h, &ack, in_u8(in))); /* the header's seq is ignored */
}

static void op_recv_garbage(harness_t *h, input_t *in, uint32_t k)
{
    const uint8_t mode = in_u8(in);
    if (mode % 3u == 0) { /* raw bytes */
        const uint32_t len = in_u8(in);
        for (uint32_t i = 0; i < len; i++)
            h->cqe.msg[i] = in_u8(in);
        do_recv(h, k, len);
        return;
    }
    kvs_msg_t msg;
    const uint32_t seq = expected_of(h, k) + in_u8(in) % 3u - 1u;
    if (in_u8(in) % 4u == 0) {
        memset(&msg, 0, sizeof msg);
        msg.type = KVS_MSG_ACK;
        msg.u.ack_link.cum = seq - 1u;
    } else {
        read_msg(in, &msg);
    }
    uint32_t len = encode_in(h, &msg, seq);
    if (mode % 3u == 1) { /* one byte flipped */
        const uint32_t pos = in_u16(in) % len;
        const uint8_t x = in_u8(in);
        h->cqe.msg[pos] ^= x != 0 ? x : 0x80u;
    } else { /* a length that disagrees with the header */
        const uint8_t d = in_u8(in);
        if (d & 0x80u) {
            const uint32_t more = 1u + (d & 0x7Fu);
            if (len + more <= sizeof h->cqe.msg) {
                memset(h->cqe.msg + len, d, more);
                len += more;
            }
        } else {
            len -= (1u + d) % len;
        }
    }
    do_recv(h, k, len);
}

static void op_advance(harness_t *h, input_t *in)
{
    fake_t *f = &h->fab;
    const uint8_t mode = in_u8(in);
    uint64_t to = f->now_ns;
    switch (mode % 5u) {
    case 0: to = f->now_ns + in_u8(in); break;
    case 1: to = f->now_ns + ((uint64_t)in_u16(in) << 8); break;
    case 2: { /* to the next retransmission */
        const uint64_t t = model_deadline(&h->m);
        to = t != UINT64_MAX && t > f->now_ns ? t : f->now_ns;
        break;
    }
    case 3: { /* to a give-up edge: one before, on it, one after */
        const mlink_t *l = mlink_find(&h->m, in_u8(in) % NCONN);
        const uint8_t side = in_u8(in) % 3u;
        if (l != NULL && mq_count(l) > 0) {
            const uint64_t edge = sat_add(l->since_ns, h->m.give_up_ns);
            to = side == 0 ? (edge > 0 ? edge - 1u : 0) : sat_add(edge, side - 1u);
        }
        break;
    }
    default: to = f->now_ns + (in_u64(in) & 0xFFFFFFFFFFull); break;
    }
    if (to > CLOCK_MAX)
        to = CLOCK_MAX;
    if (to > f->now_ns)
        f->now_ns = to;
}

static void op_tick(harness_t *h, input_t *in)
{
    const uint8_t r = in_u8(in);
    h->reenter = r % 8u < NCONN;
    if (h->reenter) {
        h->reenter_conn = r % 8u;
        read_msg(in, &h->reenter_msg);
    }
    h->silent = r % 8u == 7u; /* no on_dead: the links still die and count */
    kvs__links_tick(&h->ls, h->fab.now_ns, h->silent ? NULL : on_dead, h);
    model_tick(h);
    h->reenter = false;
    h->silent = false;
}

static void op_kill(harness_t *h, uint32_t k)
{
    /* A DISCONNECT with the fabric's reason every other time. */
    static kvs_completion_t cqe;
    cqe = (kvs_completion_t){.kind = KVS_COMPLETION_DISCONNECT, .status = KVS_EPEER,
                             .conn = conn_of(&h->fab, k)};
    if (k % 2u == 0) {
        cqe.len_bytes = (uint32_t)snprintf((char *)cqe.msg, sizeof cqe.msg, "peer %u closed", k);
    }
    kvs__link_kill(&h->ls, &cqe);
    mlink_t *l = mlink_get(&h->m, k); /* reported even if nothing was sent */
    if (l != NULL)
        l->dead = true;
}

static void op_forget(harness_t *h, uint32_t k)
{
    kvs__link_forget(&h->ls, conn_of(&h->fab, k));
    mlink_t *l = mlink_find(&h->m, k);
    if (l != NULL)
        mlink_clear(l);
}

static void run(harness_t *h, input_t *in)
{
    for (uint32_t op_index = 0; op_index < MAX_OPS && in->left > 0; op_index++) {
        const uint8_t op = in_u8(in);
        const uint32_t k = in_u8(in) % NCONN;
        switch (op % 10u) {
        case 0: {
            kvs_msg_t msg;
            read_msg(in, &msg);
            do_send(h, k, &msg);
            break;
        }
        case 1: { /* a burst: fills the queue past its first size and a resend batch */
            const uint32_t n = in_u8(in);
            kvs_msg_t msg;
            read_msg(in, &msg);
            for (uint32_t i = 0; i < n; i++) {
                msg.u.room.room += 1; /* every message differs */
                do_send(h, k, &msg);
            }
            break;
        }
        case 2: op_recv_msg(h, in, k); break;
        case 3: op_recv_ack(h, in, k); break;
        case 4: op_recv_garbage(h, in, k); break;
        case 5: op_advance(h, in); break;
        case 6: op_tick(h, in); break;
        case 7: op_kill(h, k); break;
        case 8: op_forget(h, k); break;
        default: {
            static const int fails[4] = {KVS_OK, KVS_EAGAIN, KVS_EPEER, KVS_ENOTSUP};
            h->fab.fail[k] = fails[in_u8(in) % 4u];
            break;
        }
        }
        compare(h, op_index);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_t in = {.p = data, .left = size};
    harness_t *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    CHECK(kvs_fabric_init(&h->fab.base, &fake_ops, "fuzz-link") == KVS_OK);
    h->fab.log = &h->real;

    const uint8_t mode = in_u8(&in);
    static const uint32_t caps[4] = {MAX_SLOTS, 2, 1, 0};
    h->with_stats = !(mode & 1u);
    uint64_t rto_min, rto_max, give_up;
    if (mode & 2u) { /* any 64-bit timeouts: nothing may wrap */
        rto_min = in_u64(&in);
        rto_max = in_u64(&in);
        give_up = in_u64(&in);
    } else {
        rto_min = in_u8(&in);
        rto_max = (uint64_t)in_u8(&in) * 16u;
        give_up = in_u16(&in);
    }
    h->fab.now_ns = in_u16(&in);

    model_t *m = &h->m;
    m->cap = caps[(mode >> 2) & 3u];
    m->rto_min_ns = rto_min;
    m->rto_max_ns = rto_max > rto_min ? rto_max : rto_min;
    m->give_up_ns = give_up;
    CHECK(kvs__links_init(&h->ls, &h->fab.base, m->cap, HARNESS_SESSION, rto_min, rto_max,
                          give_up,
                          h->with_stats ? &h->stats : NULL) == KVS_OK);

    run(h, &in);

    kvs__links_fini(&h->ls);
    kvs__links_fini(&h->ls); /* twice: the second is a no-op */
    for (uint32_t i = 0; i < MAX_SLOTS; i++)
        mlink_clear(&m->slot[i]);
    log_free(&h->real);
    log_free(&h->want);
    free(h);
    return 0;
}
