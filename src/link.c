/*
 * link.c - reliable control messages over a fabric connection: sequence
 * numbers, cumulative ACKs, go-back-N retransmission with a doubling
 * timeout that follows the path's round trip, duplicate filtering, dead
 * connections, posts the fabric refused (link.h says why).
 */
#include "link.h"

#include "arith.h"
#include "channel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVS__LINK_ENTRY_HDR 8u /* seq u32, len u32 */

/* Sequence numbers run 1, 2, ... and skip 0 (unsequenced) when they wrap. */
static uint32_t kvs__seq_next(uint32_t seq) { return seq + 1u != 0 ? seq + 1u : 1u; }

static void kvs__put32(uint8_t *p, uint32_t v)
{
    for (unsigned i = 0; i < 4u; i++)
        p[i] = (uint8_t)(v >> (8u * i));
}

static uint32_t kvs__get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void kvs__rtt_sample(kvs__rtt_t *e, uint64_t rtt_ns)
{
    if (e->samples++ == 0) {
        e->srtt_ns = rtt_ns;
        e->rttvar_ns = rtt_ns / 2;
        return;
    }
    /* Each step is a weighted mean of two values: it cannot overflow. */
    const uint64_t dev = e->srtt_ns > rtt_ns ? e->srtt_ns - rtt_ns : rtt_ns - e->srtt_ns;
    e->rttvar_ns = e->rttvar_ns - e->rttvar_ns / 4 + dev / 4;
    e->srtt_ns = e->srtt_ns - e->srtt_ns / 8 + rtt_ns / 8;
}

uint64_t kvs__rtt_timeout(const kvs__rtt_t *e, uint64_t rto_min_ns, uint64_t rto_max_ns)
{
    if (e->samples == 0)
        return rto_min_ns;
    const uint64_t var4 = e->rttvar_ns <= UINT64_MAX / 4 ? 4 * e->rttvar_ns : UINT64_MAX;
    const uint64_t rto = kvs__sat_add_u64(e->srtt_ns, var4 > rto_min_ns ? var4 : rto_min_ns);
    return rto < rto_max_ns ? rto : rto_max_ns;
}

int kvs__links_init(kvs__links_t *ls, kvs_fabric_t *fab, uint32_t cap, uint64_t session,
                    uint64_t rto_min_ns, uint64_t rto_max_ns, uint64_t give_up_ns,
                    kvs_handler_stats_t *stats)
{
    *ls = (kvs__links_t){.fab = fab, .cap = cap, .session = session, .rto_min_ns = rto_min_ns,
                         .rto_max_ns = rto_max_ns > rto_min_ns ? rto_max_ns : rto_min_ns,
                         .give_up_ns = give_up_ns, .stats = stats};
    ls->v = calloc(cap > 0 ? cap : 1, sizeof *ls->v);
    return ls->v != NULL ? KVS_OK : KVS_ENOMEM;
}

static void kvs__link_clear(kvs__link_t *l)
{
    free(l->q);
    *l = (kvs__link_t){0};
}

void kvs__links_fini(kvs__links_t *ls)
{
    for (uint32_t i = 0; ls->v != NULL && i < ls->cap; i++)
        kvs__link_clear(&ls->v[i]);
    free(ls->v);
    ls->v = NULL;
}

/* conn's link (a free slot for conn NULL; none past the slots in use
 * means the first free one is at hi). */
static kvs__link_t *kvs__link_find(const kvs__links_t *ls, const kvs_conn_t *conn)
{
    for (uint32_t i = 0; i < ls->hi; i++)
        if (ls->v[i].conn == conn)
            return &ls->v[i];
    return NULL;
}

/* conn's link, made on first use; NULL when every slot is taken. */
static kvs__link_t *kvs__link_get(kvs__links_t *ls, kvs_conn_t *conn)
{
    kvs__link_t *l = kvs__link_find(ls, conn);
    if (l != NULL)
        return l;
    l = kvs__link_find(ls, NULL);
    if (l == NULL && ls->hi < ls->cap)
        l = &ls->v[ls->hi++]; /* slots are taken lowest first */
    if (l == NULL)
        return NULL;
    *l = (kvs__link_t){.conn = conn, .next_seq = 1, .expected = 1, .rto_ns = ls->rto_min_ns};
    return l;
}

static uint64_t kvs__link_now(const kvs__links_t *ls)
{
    return ls->fab->ops.now_ns(ls->fab);
}

/* Posts one encoded message; a dead connection kills the link. */
static int kvs__link_post(kvs__links_t *ls, kvs__link_t *l, const uint8_t *bytes, uint32_t len,
                          uint32_t type)
{
    int rc = ls->fab->ops.send(ls->fab, l->conn, bytes, len, KVS__WR_CONTROL | type);
    if (rc == KVS_EPEER && !l->dead) {
        l->dead = true;
        snprintf(l->why, sizeof l->why, "a send on it failed: %.160s",
                 ls->fab->last_backend_msg[0] != '\0' ? ls->fab->last_backend_msg
                                                      : kvs_strerror(rc));
    }
    return rc;
}

/* The message at byte `pos` of the queue, posted. */
static int kvs__link_post_at(kvs__links_t *ls, kvs__link_t *l, uint32_t pos)
{
    const uint8_t *e = l->q + pos;
    const uint32_t len = kvs__get32(e + 4);
    const uint8_t *bytes = e + KVS__LINK_ENTRY_HDR;
    const uint32_t type = (uint32_t)bytes[6] | (uint32_t)bytes[7] << 8;
    return kvs__link_post(ls, l, bytes, len, type);
}

/* Posts the messages that never went out, oldest first, until the fabric
 * refuses one (its send queue is full: a later tick goes on). */
static void kvs__link_flush(kvs__links_t *ls, kvs__link_t *l)
{
    if (l->q_unsent == 0 || l->dead)
        return;
    uint32_t pos = l->q_unsent_pos;
    while (l->q_unsent > 0 && kvs__link_post_at(ls, l, pos) == KVS_OK) {
        if (l->timed_seq == 0) { /* none timed: time this one, sent once so far */
            l->timed_seq = kvs__get32(l->q + pos);
            l->timed_ns = kvs__link_now(ls);
        }
        pos += KVS__LINK_ENTRY_HDR + kvs__get32(l->q + pos + 4);
        l->q_unsent--;
    }
    l->q_unsent_pos = pos;
}

/* Room for `need` more bytes at the end of the queue: compacts, then grows. */
static int kvs__link_reserve(kvs__link_t *l, uint32_t need)
{
    if (l->q_cap - l->q_end >= need)
        return KVS_OK;
    const uint32_t used = l->q_end - l->q_start;
    if (l->q_start > 0 && l->q_cap - used >= need) {
        memmove(l->q, l->q + l->q_start, used);
        l->q_unsent_pos -= l->q_start;
        l->q_start = 0;
        l->q_end = used;
        return KVS_OK;
    }
    uint64_t cap = l->q_cap > 0 ? l->q_cap : 4096u;
    while (cap < (uint64_t)used + need)
        cap *= 2;
    if (cap > KVS__LINK_QUEUE_MAX)
        return KVS_EFULL;
    uint8_t *q = malloc((size_t)cap);
    if (q == NULL)
        return KVS_ENOMEM;
    if (used > 0)
        memcpy(q, l->q + l->q_start, used);
    free(l->q);
    l->q = q;
    l->q_cap = (uint32_t)cap;
    l->q_unsent_pos -= l->q_start;
    l->q_start = 0;
    l->q_end = used;
    return KVS_OK;
}

int kvs__link_send(kvs__links_t *ls, kvs_conn_t *conn, const kvs_msg_t *msg)
{
    kvs__link_t *l = kvs__link_get(ls, conn);
    if (l == NULL)
        return KVS_EFULL;
    if (l->dead)
        return KVS_EPEER;
    kvs_msg_t m = *msg;
    m.seq = l->next_seq;
    m.session = ls->session;
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t len = 0;
    int rc = kvs__wire_encode(&m, buf, sizeof buf, &len);
    if (rc != KVS_OK)
        return rc;
    rc = kvs__link_reserve(l, KVS__LINK_ENTRY_HDR + len);
    if (rc != KVS_OK)
        return rc;
    uint8_t *e = l->q + l->q_end;
    kvs__put32(e, m.seq);
    kvs__put32(e + 4, len);
    memcpy(e + KVS__LINK_ENTRY_HDR, buf, len);
    if (l->q_unsent == 0)
        l->q_unsent_pos = l->q_end;
    l->q_end += KVS__LINK_ENTRY_HDR + len;
    if (l->q_count++ == 0) {
        l->waiting_since_ns = kvs__link_now(ls);
        l->retry_ns = kvs__sat_add_u64(l->waiting_since_ns, l->rto_ns);
    }
    l->next_seq = kvs__seq_next(l->next_seq);
    /* Queued, then posted behind any that were refused before it (never
     * ahead of them: the peer would drop it as following a loss). A post
     * the fabric refuses (a full send queue, say) goes at a later tick. */
    l->q_unsent++;
    kvs__link_flush(ls, l);
    if (l->dead)
        return KVS_EPEER;
    if (ls->stats != NULL)
        ls->stats->msgs_sent++;
    return KVS_OK;
}

/* Drops the queued messages up to and including seq `cum`. */
static void kvs__link_acked(kvs__links_t *ls, kvs__link_t *l, uint32_t cum)
{
    bool moved = false;
    while (l->q_count > 0) {
        const uint8_t *e = l->q + l->q_start;
        const uint32_t seq = kvs__get32(e);
        if ((int32_t)(cum - seq) < 0)
            break;
        l->q_start += KVS__LINK_ENTRY_HDR + kvs__get32(e + 4);
        l->q_count--;
        moved = true;
    }
    if (l->q_count == 0)
        l->q_start = l->q_end = 0;
    if (l->q_unsent >= l->q_count) { /* >: a forged ACK of messages never sent */
        l->q_unsent = l->q_count;
        l->q_unsent_pos = l->q_start;
    }
    if (!moved)
        return;
    const uint64_t now_ns = kvs__link_now(ls);
    if (l->timed_seq != 0 && cum == l->timed_seq) {
        /* Sent once and acknowledged as the newest the peer has: a sample
         * (an ACK that covers it and later ones may come late, after its
         * own was lost and a later message went out: none). */
        kvs__rtt_sample(&l->rtt, now_ns >= l->timed_ns ? now_ns - l->timed_ns : 0);
    }
    if (l->timed_seq != 0 && (int32_t)(cum - l->timed_seq) >= 0)
        l->timed_seq = 0;
    /* Progress undoes the doubling, sample or not (link.h: why not Karn's
     * kept backoff). */
    l->rto_ns = kvs__rtt_timeout(&l->rtt, ls->rto_min_ns, ls->rto_max_ns);
    l->waiting_since_ns = now_ns;
    l->retry_ns = kvs__sat_add_u64(now_ns, l->rto_ns);
}

int kvs__link_recv(kvs__links_t *ls, const kvs_completion_t *cqe, kvs_msg_t *msg)
{
    if (kvs__wire_decode(cqe->msg, cqe->len_bytes, msg) != KVS_OK)
        return KVS_EPROTO;
    if (msg->type == KVS_MSG_ACK) {
        kvs__link_t *l = kvs__link_find(ls, cqe->conn);
        /* An ACK past what was sent is forged or confused: ignored. */
        if (l == NULL || (int32_t)(l->next_seq - 1u - msg->u.ack_link.cum) < 0)
            return KVS_EPROTO;
        kvs__link_acked(ls, l, msg->u.ack_link.cum);
        return 0;
    }
    if (msg->seq == 0)
        return KVS_EPROTO;
    kvs__link_t *l = kvs__link_get(ls, cqe->conn);
    if (l == NULL)
        return KVS_EFULL;
    l->ack_due = true;
    if (msg->seq != l->expected) {
        if (ls->stats != NULL)
            ls->stats->msgs_duplicate++;
        return 0;
    }
    l->expected = kvs__seq_next(l->expected);
    return 1;
}

/* Sends up to a batch of the queue again, oldest first, and stops at the
 * first post the fabric refuses: those after it would only be dropped by
 * the peer, after the gap; the pass goes on at the next timeout. (The tick
 * flushed what never went out just before: if anything is still unsent,
 * the fabric is refusing, and this pass stops at once.) */
static void kvs__link_resend(kvs__links_t *ls, kvs__link_t *l, uint64_t now_ns)
{
    /* Karn: an ACK after this may answer either post of a message, or be
     * the peer's answer to a duplicate: none is a sample until the next
     * message timed. */
    l->timed_seq = 0;
    uint32_t pos = l->q_start;
    for (uint32_t i = 0; i < l->q_count && i < KVS__LINK_RESEND_BATCH && !l->dead; i++) {
        if (kvs__link_post_at(ls, l, pos) != KVS_OK)
            break;
        if (ls->stats != NULL)
            ls->stats->msgs_retransmitted++;
        pos += KVS__LINK_ENTRY_HDR + kvs__get32(l->q + pos + 4);
    }
    /* Saturating: a timeout of 2^63 ns or more (retry_timeout_ns is the
     * user's) must not wrap to a short one and resend on every tick. */
    const uint64_t twice = kvs__sat_add_u64(l->rto_ns, l->rto_ns);
    l->rto_ns = twice < ls->rto_max_ns ? twice : ls->rto_max_ns;
    l->retry_ns = kvs__sat_add_u64(now_ns, l->rto_ns);
}

void kvs__links_tick(kvs__links_t *ls, uint64_t now_ns, kvs__link_dead_fn on_dead, void *ctx)
{
    for (uint32_t i = 0; i < ls->hi; i++) {
        kvs__link_t *l = &ls->v[i];
        if (l->conn == NULL)
            continue;
        if (l->ack_due && !l->dead) {
            kvs_msg_t ack = {.type = KVS_MSG_ACK, .session = ls->session};
            ack.u.ack_link.cum = l->expected - 1u;
            uint8_t buf[64];
            uint32_t len = 0;
            /* Owed until posted when the fabric refuses it for now (a full
             * send queue: a completion, which wakes the handler, makes
             * room); owed once when the post fails otherwise: the peer
             * sends again and is answered then. */
            const int rc = kvs__wire_encode(&ack, buf, sizeof buf, &len) == KVS_OK
                               ? kvs__link_post(ls, l, buf, len, KVS_MSG_ACK)
                               : KVS_EPROTO;
            l->ack_refused = rc == KVS_EAGAIN;
            l->ack_due = l->ack_refused;
        }
        kvs__link_flush(ls, l);
        if (l->q_count > 0 && now_ns - l->waiting_since_ns >= ls->give_up_ns && !l->dead) {
            l->dead = true; /* silent for too long: partitioned or stopped */
            snprintf(l->why, sizeof l->why, "%u message(s) unacknowledged for %llu ms: the "
                     "peer stopped or the network is cut", l->q_count,
                     (unsigned long long)((now_ns - l->waiting_since_ns) / 1000000u));
        }
        if (l->q_count > 0 && now_ns >= l->retry_ns && !l->dead)
            kvs__link_resend(ls, l, now_ns);
        if (l->dead) {
            kvs_conn_t *conn = l->conn;
            void *owner = l->owner;
            char why[KVS__LINK_WHY_BYTES];
            memcpy(why, l->why, sizeof why);
            kvs__link_clear(l);
            if (ls->stats != NULL)
                ls->stats->peers_lost++;
            if (on_dead != NULL)
                on_dead(ctx, conn, owner, why);
        }
    }
}

uint64_t kvs__links_deadline(const kvs__links_t *ls)
{
    uint64_t t = UINT64_MAX;
    for (uint32_t i = 0; i < ls->hi; i++) {
        const kvs__link_t *l = &ls->v[i];
        if (l->conn != NULL && (l->dead || (l->ack_due && !l->ack_refused)))
            return 0; /* owed now: the next tick does it (a refused post
                         waits for a completion, not for the clock) */
        if (l->conn != NULL && l->q_count > 0 && l->retry_ns < t)
            t = l->retry_ns;
    }
    return t;
}

void kvs__link_kill(kvs__links_t *ls, const kvs_completion_t *cqe)
{
    kvs__link_t *l = kvs__link_get(ls, cqe->conn);
    if (l == NULL || l->dead)
        return;
    l->dead = true;
    /* The fabric's text, bounded by its length and by the message room:
     * a backend's word, trusted for nothing but the log. */
    const uint32_t n = cqe->len_bytes < KVS_CONTROL_MSG_MAX_BYTES ? cqe->len_bytes : 0;
    if (n > 0)
        snprintf(l->why, sizeof l->why, "the fabric reported it dead: %.*s", (int)n,
                 (const char *)cqe->msg);
    else
        snprintf(l->why, sizeof l->why, "the fabric reported it dead (%s)",
                 kvs_status_name(cqe->status != KVS_OK ? cqe->status : KVS_EPEER));
}

int kvs__link_bind(kvs__links_t *ls, kvs_conn_t *conn, void *owner)
{
    kvs__link_t *l = kvs__link_get(ls, conn);
    if (l == NULL)
        return KVS_EFULL;
    l->owner = owner;
    return KVS_OK;
}

void *kvs__link_owner(const kvs__links_t *ls, const kvs_conn_t *conn)
{
    const kvs__link_t *l = conn != NULL ? kvs__link_find(ls, conn) : NULL;
    return l != NULL ? l->owner : NULL;
}

void kvs__link_forget(kvs__links_t *ls, const kvs_conn_t *conn)
{
    kvs__link_t *l = conn != NULL ? kvs__link_find(ls, conn) : NULL;
    if (l != NULL)
        kvs__link_clear(l);
}

uint32_t kvs__link_unacked(const kvs__links_t *ls, const kvs_conn_t *conn)
{
    const kvs__link_t *l = conn != NULL ? kvs__link_find(ls, conn) : NULL;
    return l != NULL ? l->q_count : 0;
}

uint64_t kvs__links_unacked(const kvs__links_t *ls)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < ls->hi; i++)
        if (ls->v[i].conn != NULL && !ls->v[i].dead) /* a dead peer takes nothing more */
            n += ls->v[i].q_count;
    return n;
}

uint64_t kvs__links_srtt_max(const kvs__links_t *ls)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < ls->hi; i++)
        if (ls->v[i].conn != NULL && !ls->v[i].dead && ls->v[i].rtt.srtt_ns > m)
            m = ls->v[i].rtt.srtt_ns;
    return m;
}
