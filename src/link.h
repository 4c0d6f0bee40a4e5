/*
 * link.h (internal) - reliable control messages over a fabric connection.
 *
 * The fabric's SEND is only as reliable as the network under it: the
 * simulator drops, duplicates and delays messages on purpose, and a real
 * link can go down for a while. Each handler keeps one link per connection:
 * - every message it sends gets the next sequence number of that link
 *   (from 1) and stays queued, encoded, until the peer acknowledges it;
 * - the receiver delivers only the next expected sequence number: an older
 *   one is a duplicate and a newer one follows a loss (go-back-N), both
 *   dropped; either way an ACK (the highest in-order number received)
 *   goes back once per progress call;
 * - a link that sees no ACK within its retransmission timeout sends its
 *   queue again, doubling the timeout up to rto_max;
 * - the timeout follows the path: each link times one message at a time,
 *   from its first post to an ACK naming it as the newest received (an ACK
 *   past it ends the timing with no sample: its own ACK may have been
 *   lost, and the later one measure the wait for a later message), and keeps a smoothed
 *   round trip and its variation from those samples (RFC 6298, in integer
 *   nanoseconds of the fabric's clock). The timeout is then
 *   SRTT + max(rto_min, 4 * RTTVAR), at most rto_max: rto_min plays the
 *   RFC's clock granularity G (as Linux's TCP floors its variation term),
 *   so a fast path keeps the configured first timeout plus its round trip,
 *   and a slow or loaded one (a busy peer answers late) is not resent
 *   needlessly. Before the first sample the timeout is rto_min (the RFC's
 *   1 s would stall the first lost REGISTER of a fast path 500 times too
 *   long; the first answer corrects a short guess at the cost of a
 *   duplicate or two). Karn's rule: a retransmission ends the timing, as
 *   an ACK after it may answer either post of a message, or be the peer's
 *   answer to a duplicate of an older one (a timed message whose ACK was
 *   lost would otherwise measure the timeout too). Unlike TCP, any ACK progress sets
 *   the timeout back from its doubled value to the estimator's, sample or
 *   not: with go-back-N every message behind a lost one is sent again, so
 *   under loss samples are rare, and a doubling kept until the next one
 *   held a 20%-loss run with a one-deep send queue at rto_max until every
 *   request stalled (docs/architecture.md); progress shows the path
 *   delivers, as the fixed timeout assumed before;
 * - a connection the fabric reports dead (its peer crashed or restarted:
 *   KVS_EPEER), or one whose oldest message went unacknowledged for
 *   give_up_ns (a partition, a peer that stopped), kills the link; the
 *   handler hears of it, disconnects (so the peer hears too) and recovers;
 * - a post the fabric refuses for now (KVS_EAGAIN: the connection's send
 *   queue is full) is not lost: that message and every later one wait,
 *   in order (a later one posted ahead would arrive after a gap and be
 *   dropped), and go out at the next ticks as the fabric takes them; an
 *   ACK it refuses stays owed; a retransmission stops at the first
 *   refusal and goes on at its next timeout. The room comes with a
 *   completion on the connection, which wakes the handler, so no tick is
 *   due for it; the retransmission timeout still runs as the backstop.
 * A new incarnation of a peer always comes with a new connection, so a
 * link never mixes two incarnations, and a duplicated REGISTER is dropped
 * here instead of looking like a restart.
 *
 * Memory: the send queue of a link is one byte buffer that grows by
 * doubling (up to KVS__LINK_QUEUE_MAX, then sends fail with KVS_EFULL);
 * nothing is allocated per message in steady state.
 */
#ifndef KVS_SRC_LINK_H
#define KVS_SRC_LINK_H

#include "backend.h"
#include "wire.h"

#define KVS__LINK_QUEUE_MAX (64u << 20) /* bytes of unacknowledged messages */
#define KVS__LINK_RESEND_BATCH 64u      /* messages sent again per timeout */

/* A round-trip estimator (RFC 6298 section 2, integers only): samples is 0
 * until the first one, which sets SRTT = R and RTTVAR = R / 2; each later
 * one sets RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R|, then SRTT = 7/8 SRTT +
 * 1/8 R. */
typedef struct kvs__rtt {
    uint64_t srtt_ns, rttvar_ns;
    uint64_t samples;
} kvs__rtt_t;

void kvs__rtt_sample(kvs__rtt_t *e, uint64_t rtt_ns);
/* The retransmission timeout e gives: rto_min before any sample, else
 * SRTT + max(rto_min, 4 * RTTVAR) (saturating), at most rto_max. */
uint64_t kvs__rtt_timeout(const kvs__rtt_t *e, uint64_t rto_min_ns, uint64_t rto_max_ns);

/* kvs__link_t.why, NUL included. */
#define KVS__LINK_WHY_BYTES 192

typedef struct kvs__link {
    kvs_conn_t *conn;          /* NULL: a free slot */
    void *owner;               /* the handler's peer on this connection, or NULL */
    bool dead;                 /* the fabric reported the connection dead */
    char why[KVS__LINK_WHY_BYTES]; /* ... or the link gave up: why, for the log */
    bool ack_due;              /* an ACK is owed to the peer */
    bool ack_refused;          /* ... and the fabric refused its post for now */
    /* sending */
    uint32_t next_seq;         /* of the next message sent */
    uint8_t *q;                /* [seq u32][len u32][bytes] ..., unacknowledged */
    uint32_t q_start, q_end, q_cap, q_count;
    uint32_t q_unsent;         /* the newest q_unsent queued are not out (a
                                  post was refused): they go, in order, before
                                  any newer one */
    uint32_t q_unsent_pos;     /* byte position of the oldest of them (a
                                  send finds it without walking the queue) */
    uint64_t rto_ns, retry_ns; /* current timeout; when the queue goes again */
    kvs__rtt_t rtt;            /* the path's round trip, from the ACKs */
    uint32_t timed_seq;        /* the message being timed, 0 for none: posted
                                  once, at timed_ns, and not acknowledged yet */
    uint64_t timed_ns;
    uint64_t waiting_since_ns; /* the queue last moved (or became non-empty) */
    /* receiving */
    uint32_t expected;         /* next in-order sequence number */
} kvs__link_t;

typedef struct kvs__links {
    kvs_fabric_t *fab;
    kvs__link_t *v;
    uint32_t cap;
    uint32_t hi;               /* slots [hi, cap) were never used: lookups and
                                  ticks stop there, so their cost follows the
                                  connections made, not the bound */
    uint64_t rto_min_ns, rto_max_ns, give_up_ns;
    uint64_t session;          /* the owner's session: every message sent
                                  carries it in its header */
    kvs_handler_stats_t *stats;
} kvs__links_t;

/* A table of up to cap links of the handler whose session is `session`.
 * KVS_ENOMEM if the table cannot be allocated. */
int kvs__links_init(kvs__links_t *ls, kvs_fabric_t *fab, uint32_t cap, uint64_t session,
                    uint64_t rto_min_ns, uint64_t rto_max_ns, uint64_t give_up_ns,
                    kvs_handler_stats_t *stats);
void kvs__links_fini(kvs__links_t *ls);

/* Sends msg on conn and keeps it until acknowledged (its seq and session
 * are set here).
 * KVS_EPEER: the connection is dead (the link is too, from now on);
 * KVS_EFULL: no link slot, or the queue is at its bound; KVS_ENOMEM. */
int kvs__link_send(kvs__links_t *ls, kvs_conn_t *conn, const kvs_msg_t *msg);

/* Passes one RECV through its link. Returns 1 when *msg is the next message
 * of the connection, to be handled; 0 when the link consumed it (an ACK, a
 * duplicate, one after a loss); KVS_EPROTO when it is malformed or
 * unsequenced; KVS_EFULL when no link slot is free for a new connection. */
int kvs__link_recv(kvs__links_t *ls, const kvs_completion_t *cqe, kvs_msg_t *msg);

/* What kvs__links_tick tells of a connection found dead: its owner, and
 * why it died (the fabric's reason, or the link's own: never empty). */
typedef void (*kvs__link_dead_fn)(void *ctx, kvs_conn_t *conn, void *owner, const char *why);

/* Sends the ACKs owed and the queues whose timeout passed. Each connection
 * found dead on the way is passed to on_dead (once) with its owner, and its
 * link freed. */
void kvs__links_tick(kvs__links_t *ls, uint64_t now_ns, kvs__link_dead_fn on_dead, void *ctx);

/* Names owner as conn's (making its link if there is none yet): what
 * arrives on conn is owner's. KVS_EFULL when no link slot is free. */
int kvs__link_bind(kvs__links_t *ls, kvs_conn_t *conn, void *owner);
/* The owner conn's link was bound to, NULL when none. */
void *kvs__link_owner(const kvs__links_t *ls, const kvs_conn_t *conn);

/* The earliest retransmission due, UINT64_MAX if none. */
uint64_t kvs__links_deadline(const kvs__links_t *ls);

/* The fabric said conn is dead (a DISCONNECT completion, cqe): the next
 * tick reports it to on_dead with the reason the completion gives, even
 * if nothing was ever sent on it. */
void kvs__link_kill(kvs__links_t *ls, const kvs_completion_t *cqe);

/* Frees conn's link (its queue is dropped): call before disconnecting. */
void kvs__link_forget(kvs__links_t *ls, const kvs_conn_t *conn);

/* Messages queued on conn's link and not yet acknowledged. */
uint32_t kvs__link_unacked(const kvs__links_t *ls, const kvs_conn_t *conn);
/* The same over every live link: messages the peers have yet to
 * acknowledge (a dead connection's queue counts for nothing). */
uint64_t kvs__links_unacked(const kvs__links_t *ls);
/* The largest smoothed round trip over the live links, 0 before any
 * sample (kvs_handler_stats_t.rtt_smoothed_ns). */
uint64_t kvs__links_srtt_max(const kvs__links_t *ls);

/* A handler's links: for tests that speak as the handler on its own
 * connections (a confused or compromised peer). */
kvs__links_t *kvs__decode_links(kvs_decode_t *d);
kvs__links_t *kvs__prefill_links(kvs_prefill_t *p);
/* The earliest stall deadline of a handler's rooms (UINT64_MAX if none):
 * what test harnesses run up to, retransmissions aside. */
uint64_t kvs__decode_stall_ns(const kvs_decode_t *d);
uint64_t kvs__prefill_stall_ns(const kvs_prefill_t *p);

#endif
