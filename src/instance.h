/*
 * instance.h (internal) - the peer instances a handler is paired with
 * (spec §12) and, per instance, the pair's plan: computed once when the
 * instance's geometry becomes known, then read by every room paired with
 * it, so a room allocates no layout of its own.
 *
 * An instance is one model replica of the other role; with attention data
 * parallelism each of its attention groups is a peer of its own (it behaves
 * as an instance of TP attn_tp), so a kvs__inst_t is one (instance id,
 * attention group). Its plan: the pair's layout (spec §3-§5) and path, this
 * side's fingerprint of the pair, and its peer ranks: on the decode side the
 * prefill ranks that take part in this rank's rooms (CP ranks x sources x
 * stages: the writers, and with MLA the ranks that only report; each CP
 * rank writes its own token range, docs/kinds/context-parallel.md), on the
 * prefill side
 * the decode ranks in whose rooms this rank takes part (targets), each with
 * what this rank needs of it.
 *
 * The decode learns an instance's geometry from the application (given up
 * front: kvs_decode_add_instance, or the config's peer sizes for the
 * default instance); the prefill from the first registration of one of its
 * ranks (or from its config, for the default instance, when given).
 */
#ifndef KVS_SRC_INSTANCE_H
#define KVS_SRC_INSTANCE_H

#include "manager.h"
#include "wire.h"

typedef struct kvs__inst kvs__inst_t;

/* What a prefill rank knows of a decode rank it writes to. */
typedef struct kvs__target {
    int64_t writer;              /* this rank's writer index in its regions;
                                    -1 when it only reports (silent) */
    kvs_head_slice_t heads;      /* the heads this rank copies for it */
    int64_t slot;                /* staging: the first layer slot this rank's
                                    stage fills in a region */
    int64_t layer_slots;         /* ... of the decode stage's layer slots */
    int32_t writes;              /* staging: spans per chunk: 1, or the K and
                                    the V layers apart (prefill PP) */
    int64_t pieces;              /* staging: writes per full chunk: each span
                                    cut into pieces of at most the fabric's
                                    max_write_bytes (<= max_inflight_writes,
                                    checked when the pair is planned) */
    kvs_watermark_t wm;          /* its ring's last watermark */
    uint64_t ring_addr, ring_bytes, ring_rkey;
    bool scoped_keys;            /* each region's STAGING_RSP carries the keys
                                    of this rank's writes; ring_rkey is 0 */
    int64_t local_heads, num_pages;
    kvs_layer_entry_t *layers;   /* direct/slice: its KV layers */
    int64_t layers_total, layers_got;
} kvs__target_t;

/* One peer rank: a connection and the session behind it. */
typedef struct kvs__peer {
    kvs__inst_t *inst;
    int64_t index;               /* in inst->peers */
    int64_t tp_rank, pp_rank;    /* in its instance's attention group */
    int64_t cp_rank;             /* its prefill context-parallel rank (0 on
                                    the prefill side, and with CP 1) */
    bool silent;                 /* takes part in the pair's rooms (ROOM,
                                    STATUS, ABORT) but no bytes move between
                                    this rank and it: an MLA source other than
                                    the one that writes (kvs_layout_t.tp_sources) */
    kvs_conn_t *conn;            /* NULL until connected, and while lost */
    uint64_t session;            /* the peer's session, once it registered or
                                    acknowledged */
    bool ready;                  /* decode: its REGISTER_ACK accepted us;
                                    prefill: its REGISTER was accepted */
    bool lost;                   /* its connection died; until it is back */
    bool parked;                 /* decode: lost because the application said its
                                    instance is gone (kvs_decode_instance_lost):
                                    no timed reconnects, the next room naming it
                                    connects (a connect to a frozen process
                                    would hold the rank for connect_timeout_ms) */
    int refused;                 /* decode: status of a refused registration */
    char *name;                  /* decode: its fabric address, NULL unknown */
    uint64_t reconnect_ns, reconnect_wait_ns;
    kvs__target_t tgt;           /* prefill */
    /* decode: its REGISTER went on conn, so a REGISTER_ACK may come (with a
     * cluster secret only after the prefill proved it) */
    bool registered;
    /* decode, with a cluster secret (handshake.h): its HELLO is out */
    bool challenged;
    kvs_b32_t nonce, peer_nonce; /* this side's and the prefill's */
    uint64_t peer_session;       /* the prefill's, from its CHALLENGE */
} kvs__peer_t;

struct kvs__inst {
    kvs_peer_t ref;              /* the application's instance id and group */
    bool known;                  /* geometry and plan set */
    bool declared;               /* the geometry was given, not learned: a
                                    registration must agree with it */
    int64_t tp_size, pp_size;    /* of the peer group */
    int64_t cp_size;             /* the prefill's CP ranks (>= 1): on a decode
                                    its peer group's, on a prefill its own */
    kvs_layout_t lay;            /* the pair's layout */
    kvs_path_t path;             /* the pair's path */
    kvs_fingerprint_t fp;        /* this side's fingerprint of the pair */
    int64_t decode_stage;        /* the decode stage of the pair's regions
                                    (0 with decode PP 1) */
    int64_t stages, first_stage; /* decode: prefill stages that write to this
                                    rank, the first of them */
    int64_t npeers, words;       /* peer ranks; bitmap words over them */
    kvs__peer_t *peers;          /* [npeers] */
    char **addrs;                /* decode: [cp_size * pp_size * tp_size]
                                    addresses of the group's ranks (CP rank,
                                    then stage, then TP rank), or NULL */
    int64_t naddrs;              /* strings in addrs */
    int64_t rooms;               /* open rooms paired with it */
};

typedef struct kvs__insts {
    kvs__inst_t **v;
    uint32_t count, cap;
} kvs__insts_t;

int kvs__insts_init(kvs__insts_t *t, uint32_t cap);
/* Frees every instance, its peers (their names and layer tables) and
 * addresses; the caller has dropped the peers' connections. */
void kvs__insts_fini(kvs__insts_t *t);
kvs__inst_t *kvs__insts_find(const kvs__insts_t *t, kvs_peer_t ref);
/* A new instance of unknown geometry; NULL with m->err on failure (the
 * table is full: KVS_EFULL, or no memory). */
kvs__inst_t *kvs__insts_add(kvs__insts_t *t, kvs_manager_t *m, kvs_peer_t ref);

/* Removes the instance added last (it has no connection yet). */
void kvs__insts_pop(kvs__insts_t *t);

/* Sets the geometry of inst (tp_size, pp_size of the peer group; on a
 * decode cp_size, the prefill group's CP ranks, 0: 1; unused on a prefill,
 * whose CP size is its own) and computes the pair's plan from the manager:
 * layout, path, fingerprint, peer ranks. A decode's peers are CP rank c's
 * source j of stage s at (c * tp_sources + j) * stages + s. All or nothing:
 * on failure m->err names what to change and inst stays unknown. */
int kvs__inst_set_geometry(kvs__inst_t *inst, kvs_manager_t *m, int64_t tp_size,
                           int64_t pp_size, int64_t cp_size, bool declared);
/* Copies the addresses of the group's ranks (cp_size * pp_size * tp_size
 * strings: rank (c, s, t) at (c * pp_size + s) * tp_size + t, one group of
 * addresses per CP rank) and names the peers from them, replacing any before (a
 * group declared again, its peers all unconnected: the instance came back
 * elsewhere). All or nothing; each peer is as if never connected (tried
 * by the next room naming it). */
int kvs__inst_set_addrs(kvs__inst_t *inst, kvs_manager_t *m, const char *const *addrs);

/* Decode: the peer index of the prefill rank (cp, tp, stage) in inst, or
 * -1 when it takes no part in this rank's rooms. */
int64_t kvs__inst_writer_peer(const kvs__inst_t *inst, int64_t decode_tp, int64_t prefill_cp,
                              int64_t prefill_tp, int64_t prefill_stage);
/* Prefill: the peer index of decode rank (tp, pp) in inst, or -1 when this
 * rank does not write to it. */
int64_t kvs__inst_target_peer(const kvs__inst_t *inst, int64_t decode_tp, int64_t decode_pp);

#endif
