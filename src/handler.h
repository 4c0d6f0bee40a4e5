/*
 * handler.h (internal) - the base both protocol handlers are built on (the
 * decode's in decode.c, the prefill's in prefill*.c), as libuv's uv_handle_t
 * is under every handle type: what the two roles share lives here once.
 *
 * - rooms: a bounded table by id and a list in open order; a room's stall
 *   timer (its last progress), its first failure, its end (a result for the
 *   caller, then freed);
 * - peers: the peer instances this rank is paired with (instance.h) and
 *   their ranks, each with its connection and session; messages are
 *   matched to their peer by connection and header session, never by
 *   looking into the payload;
 * - links: one reliable control link per connection (link.h), the sending
 *   of messages, dead connections and reconnecting (the decode connects;
 *   the prefill is connected to);
 * - the progress loop: poll the fabric, dispatch, let the role advance its
 *   work, expire stalled rooms, tick the links;
 * - results and stats.
 *
 * The role part is a small table of functions (kvs__role_t) and the role's
 * own room, chunk and queue state. A room of a role embeds kvs__room_t
 * first; the base allocates nothing per message.
 */
#ifndef KVS_SRC_HANDLER_H
#define KVS_SRC_HANDLER_H

#include "handshake.h"
#include "instance.h"
#include "link.h"
#include "manager.h"
#include "metrics.h"
#include "results.h"
#include "table.h"

#define KVS__POLL_BATCH 16

typedef struct kvs__handler kvs__handler_t;

/* What every room has, whatever its role. */
typedef struct kvs__room {
    uint64_t id;
    kvs__inst_t *inst;          /* the peer instance (group) it is paired with */
    int status;                 /* first failure, KVS_OK while none */
    uint64_t open_ns;
    uint64_t last_ns;           /* last progress; the stall timeout runs from it */
    uint64_t bytes, writes;     /* payload bytes and RDMA writes, for its result */
    /* The aux payload (spec §12): prefill, the bytes to send (aux_bytes);
     * decode, the announced size (aux_bytes) and the bytes come so far
     * (aux_got), handed to the room's result when it ends well. */
    uint8_t *aux;               /* a block of h->blocks, or NULL */
    uint32_t aux_bytes, aux_got;
    char reason[KVS_REASON_BYTES]; /* why it failed, set with status */
    struct kvs__room *prev, *next; /* open order */
    /* Hybrid models with state layers: the request's slot in the state
     * buffers, once given (kvs_*_room_set_state_slot). */
    bool has_state_slot;
    int64_t state_slot;
} kvs__room_t;

/* The role part of a handler. */
typedef struct kvs__role {
    kvs_role_t role;
    bool accepts;               /* peers connect to this role (prefill); the
                                   other makes every connection it uses, so a
                                   message on a connection it did not make is
                                   a stranger's, dropped unread */
    /* The message that binds a connection to a peer (prefill: REGISTER on a
     * connection it accepted; decode: REGISTER_ACK on one it made). peer is
     * the connection's peer, NULL when none is bound to it yet. */
    void (*on_register)(kvs__handler_t *h, kvs_conn_t *conn, kvs__peer_t *peer,
                        const kvs_msg_t *msg);
    /* A CHALLENGE on conn (decode; NULL for a role that accepts). */
    void (*on_challenge)(kvs__handler_t *h, kvs_conn_t *conn, kvs__peer_t *peer,
                         const kvs_msg_t *msg);
    /* The handler made a new connection to peer (decode: a reconnect). */
    void (*on_connected)(kvs__handler_t *h, kvs__peer_t *peer);
    /* Any other message, from a peer that is ready and whose session the
     * header names. */
    void (*on_message)(kvs__handler_t *h, kvs__peer_t *peer, const kvs_msg_t *msg);
    /* A write completion (prefill). */
    void (*on_write_done)(kvs__handler_t *h, const kvs_completion_t *cqe);
    /* After the completions of one progress call: the role's own work
     * (reaping copies, queued requests, advancing rooms). Returns work done. */
    int (*advance)(kvs__handler_t *h);
    /* r has just failed with status (kvs__room_fail): tell the peers that
     * must hear of it, except `from` (the one that told us, or NULL). */
    void (*on_fail)(kvs__handler_t *h, kvs__room_t *r, const kvs__peer_t *from);
    /* A failed room went one more stall timeout without progress; returns
     * true when it is gone. */
    bool (*on_stalled)(kvs__handler_t *h, kvs__room_t *r);
    /* The connection of peer died; the base has marked it lost. The role
     * fails what the peer owed or was owed. */
    void (*on_peer_lost)(kvs__handler_t *h, kvs__peer_t *peer);
    /* Frees a room the base no longer holds (after it ended, or at destroy:
     * then also releases its device work and ring regions). */
    void (*room_free)(kvs__handler_t *h, kvs__room_t *r, bool destroying);
    /* Where an open room stands (kvs_room_state_t, never SUCCESS). */
    kvs_room_state_t (*room_state)(const kvs__handler_t *h, const kvs__room_t *r);
    /* Sets up the role's own state after the base's (role_init) and frees
     * it, whatever of it exists (role_fini, before the base goes). */
    int (*role_init)(kvs__handler_t *h);
    void (*role_fini)(kvs__handler_t *h);
} kvs__role_t;

struct kvs__handler {
    const kvs__role_t *role;
    kvs_manager_t *m;           /* borrowed; outlives the handler */
    kvs_fabric_t *fab;
    kvs_device_t *dev;
    uint64_t session;
    int64_t tp_rank, pp_rank;
    kvs__insts_t insts;         /* the peer instances, with their ranks */
    kvs__table_t rooms;         /* id -> kvs__room_t * */
    kvs__room_t *first, *last;  /* open order */
    kvs__results_t results;
    kvs__blocks_t blocks;       /* freed room parts, reused by the next rooms */
    kvs__links_t links;         /* one reliable link per connection */
    kvs_completion_t *cq;
    kvs_stream_t *stream;       /* staging: the gather or scatter stream */
    kvs__kv_keys_t kv_keys;     /* direct/slice: KV layers open to peers */
    bool kv_open;
    kvs__handshake_t hs;        /* prefill: pending challenges (handshake.h) */
    kvs_handler_stats_t stats;
    uint64_t next_check_ns;     /* no room's stall deadline is earlier */
};

/* Creates a handler of `bytes` (its role's struct, which embeds
 * kvs__handler_t first) on m: the init guards of spec §8, the base's tables
 * sized by the manager's config, the links, what the default pair's path
 * needs, then role->role_init. *out gets it; on failure nothing is left
 * and m->err says why. */
int kvs__handler_create(kvs_manager_t *m, const kvs__role_t *role, size_t bytes, void **out);
/* Frees every room (role->room_free), the role's state, every peer,
 * connection and table, and the handler; the manager may make another. */
void kvs__handler_destroy(kvs__handler_t *h);

static inline uint64_t kvs__now(const kvs__handler_t *h) { return kvs__net_now_ns(h->fab); }

/* ---- rooms ---- */

static inline kvs__room_t *kvs__room_get(const kvs__handler_t *h, uint64_t id)
{
    return kvs__table_get(&h->rooms, id);
}
/* Adds r (zeroed by the caller except the role part) as room id, last in
 * open order, its stall timer started. KVS_EFULL at max_rooms. */
int kvs__room_add(kvs__handler_t *h, kvs__room_t *r, uint64_t id, kvs__inst_t *inst);
/* The room moved: its stall deadline starts over. */
void kvs__room_touch(kvs__handler_t *h, kvs__room_t *r);
/* Fails r with status unless it failed already (the first failure wins),
 * then role->on_fail tells the peers except `from`. */
void kvs__room_fail(kvs__handler_t *h, kvs__room_t *r, int status, const kvs__peer_t *from);
/* As kvs__room_fail, with the peer that told of the failure named in the
 * room's reason apart from `from` (whom on_fail does not tell). */
void kvs__room_fail_told(kvs__handler_t *h, kvs__room_t *r, int status, const kvs__peer_t *from,
                         const kvs__peer_t *teller);
/* Ends r: its result (chunks, writes) goes to the caller, the stats count
 * it, and it is removed and freed. */
void kvs__room_end(kvs__handler_t *h, kvs__room_t *r, int64_t chunks);
/* kvs_decode_room_set_state_slot / kvs_prefill_room_set_state_slot: the
 * slot of room `id` in the state buffers; errors in h->m's error. */
int kvs__room_set_state_slot(kvs__handler_t *h, uint64_t id, int64_t slot);
/* Removes and frees r without a result (nobody asked for it). */
void kvs__room_drop(kvs__handler_t *h, kvs__room_t *r);
/* A result for a room that never opened (refused at open), counted for
 * the peer instance it named. */
void kvs__room_reject(kvs__handler_t *h, uint64_t id, kvs_peer_t peer, int status);

/* ---- peers and messages ---- */

/* Sends msg to peer (nothing while it has no connection). A dead
 * connection is handled at the end of progress (the link reports it),
 * never from inside the caller's loops. */
void kvs__send(kvs__handler_t *h, kvs__peer_t *peer, const kvs_msg_t *msg);
/* Binds conn to peer: messages arriving on it are the peer's. */
void kvs__peer_bind(kvs__handler_t *h, kvs__peer_t *peer, kvs_conn_t *conn);
/* Unbinds and disconnects peer's connection (its link forgotten), if any. */
void kvs__peer_drop(kvs__handler_t *h, kvs__peer_t *peer);
/* Connects peer (its address known): KVS_OK with the connection bound (a
 * lost peer stays lost until the registration that follows is
 * acknowledged), or the fabric's status with peer marked lost and a
 * reconnect scheduled. */
int kvs__peer_connect(kvs__handler_t *h, kvs__peer_t *peer);
/* A message that names itself "rejected": counts it. */
static inline void kvs__reject(kvs__handler_t *h) { h->stats.msgs_rejected++; }

/* The peer instance (group) ref, or NULL. */
static inline kvs__inst_t *kvs__inst_find(const kvs__handler_t *h, kvs_peer_t ref)
{
    return kvs__insts_find(&h->insts, ref);
}

/* The peer instance (group) ref, added when it is new: of unknown
 * geometry, except the default instance {0, 0}, whose geometry the
 * config gives (the decode's default TP is its own; the prefill learns it
 * at registration unless peer_tp_size is set). NULL with m->err set when
 * the table is full or that geometry cannot pair with this rank. */
kvs__inst_t *kvs__inst_get(kvs__handler_t *h, kvs_peer_t ref);

/* Makes what a pair on `path` needs, once: the gather or scatter stream
 * for staging, the KV layers registered with the fabric for the direct and
 * slice paths. On failure m->err says why. */
int kvs__handler_prepare_path(kvs__handler_t *h, kvs_path_t path);

/* ---- the loop ---- */

/* Polls the fabric and drives everything: returns the work found (>= 0) or
 * a negative status when the fabric itself failed. */
int kvs__handler_progress(kvs__handler_t *h);
/* The earliest time progress has work without a new completion. */
uint64_t kvs__handler_deadline(const kvs__handler_t *h);
/* The earliest stall deadline of the rooms (UINT64_MAX if none). */
static inline uint64_t kvs__handler_stall_ns(const kvs__handler_t *h)
{
    return h->first != NULL ? h->next_check_ns : UINT64_MAX;
}
int kvs__handler_poll_rooms(kvs__handler_t *h, kvs_room_result_t *out, int max);
int kvs__handler_room_state(const kvs__handler_t *h, uint64_t room, kvs_room_state_t *out);
/* The open rooms by kvs_room_state_t (FAILED: failed, result not yet out). */
void kvs__handler_room_counts(const kvs__handler_t *h, uint64_t counts[KVS__ROOM_STATES]);
/* The application says instance ref is gone (its discovery lease lapsed):
 * its connections are dropped, its rooms fail with KVS_EPEER as when the
 * fabric finds them dead, and the decode reconnects on its next room.
 * KVS_ENOENT for an instance this rank does not know. */
int kvs__handler_instance_lost(kvs__handler_t *h, kvs_peer_t ref);
/* Fails room with KVS_ECANCELED (its peers are told); KVS_ENOENT. */
int kvs__handler_room_abort(kvs__handler_t *h, uint64_t room);

/* Formats the peer for messages: "prefill instance 7 group 0 rank tp 1 pp 0". */
const char *kvs__peer_name(const kvs__peer_t *peer, char *buf, size_t bytes);

#endif
