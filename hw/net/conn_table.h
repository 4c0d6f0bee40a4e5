/*
 * conn_table.h - the connection table of the network fabrics (hw/verbs,
 * hw/ofi): fixed slots, the generation that makes a token (slot |
 * generation << 16) name one use of a slot, the check of a connection the
 * user passes back, the shared states FREE, UP and DEAD, and failing a
 * connection for good with the status and reason that later posts and its
 * DISCONNECT completion report. How a connection is made (rdma_cm and
 * queue pairs; a TCP bootstrap and an address vector), the states on the
 * way to UP and what else it holds stay with each fabric.
 *
 * A fabric's struct kvs_conn opens with hw_net_conn_t (libuv's handle base
 * under every handle type), as its struct kvs_mr opens with hw_net_mr_t;
 * the table walks the fabric's array by its element size. A fabric's own
 * states number from HW_NET_CONN_OWN, so one state field holds both.
 *
 * Not thread-safe: the fabric is driven from one thread.
 * Invariants: slot i of the array has slot == i; a slot is FREE or holds
 * one connection; each use of a slot has a new generation (a fabric may
 * move it on within a use: verbs, per queue pair), so a token or work
 * request id of an earlier use never names a later one; a DEAD connection
 * keeps its status and reason until the slot is freed.
 */
#ifndef KVS_HW_CONN_TABLE_H
#define KVS_HW_CONN_TABLE_H

#include <kvstage/backend.h>

#include "handles.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define HW_NET_WHY_BYTES 200
#define HW_NET_PEER_BYTES 64

/* The states every fabric's connections share; theirs follow. */
typedef enum hw_net_conn_state {
    HW_NET_CONN_FREE = 0,
    HW_NET_CONN_UP,
    HW_NET_CONN_DEAD,       /* failed for good: posts return KVS_EPEER with why */
    HW_NET_CONN_OWN         /* the first of a fabric's own states */
} hw_net_conn_state_t;

/* What every fabric's connection holds; first in its struct kvs_conn. */
typedef struct hw_net_conn {
    uint32_t slot;
    uint32_t gen;             /* its low 16 bits go in tokens and work request ids */
    int state;                /* hw_net_conn_state_t or the fabric's own */
    bool active;              /* we connected; else accepted */
    bool user_knows;          /* handed to the user (connect, or a completion) */
    bool down_told;           /* DEAD: the user got its DISCONNECT completion */
    int dead_status;          /* why posts fail once DEAD */
    char why[HW_NET_WHY_BYTES];
    char peer[HW_NET_PEER_BYTES]; /* "IP:port" for messages */
} hw_net_conn_t;

typedef struct hw_net_conns {
    kvs_fabric_t *fab;        /* where refusals are recorded */
    const char *name;         /* the fabric's name in messages; lives as long as it */
    void *slots;              /* the fabric's array of cap struct kvs_conn */
    size_t size;              /* sizeof (struct kvs_conn) */
    uint32_t cap;             /* max_conns, at most 65535 (a token's 16 bits) */
} hw_net_conns_t;

/* Sets up the table over slots (cap elements of size bytes, zeroed, owned
 * by the fabric until it is destroyed): every slot FREE, knowing its index. */
void hw_net_conns_init(hw_net_conns_t *t, kvs_fabric_t *fab, const char *name, void *slots,
                       size_t size, uint32_t cap);

/* The shared part of a connection (its struct kvs_conn opens with it). */
static inline hw_net_conn_t *hw_net_conn(kvs_conn_t *conn)
{
    return (hw_net_conn_t *)(void *)conn;
}
static inline kvs_conn_t *hw_net_conns_at(const hw_net_conns_t *t, uint32_t i)
{
    return (kvs_conn_t *)(void *)((char *)t->slots + (size_t)i * t->size);
}
/* conn when it is a live (not FREE) connection of the table, else NULL. */
static inline kvs_conn_t *hw_net_conns_of(const hw_net_conns_t *t, kvs_conn_t *conn)
{
    return hw_in_table(t->slots, conn, t->size, t->cap) &&
                   hw_net_conn(conn)->state != HW_NET_CONN_FREE
               ? conn
               : NULL;
}
/* The token naming this use of c's slot: slot | generation << 16 (ofi
 * stamps it on messages, verbs puts it in work request ids). */
static inline uint32_t hw_net_conn_token(const hw_net_conn_t *c)
{
    return c->slot | (c->gen & 0xffffu) << 16;
}

/* The live connection a token names, or NULL (a slot out of range, FREE,
 * or since used again). */
kvs_conn_t *hw_net_conn_by_token(const hw_net_conns_t *t, uint32_t token);

/* connect's checks of its arguments: peer and out given, peer a
 * "HOST:PORT" that resolves (into *dst). KVS_OK, else KVS_EINVAL recorded
 * on the fabric. */
int hw_net_conn_peer(hw_net_conns_t *t, const char *peer, kvs_conn_t **out,
                     struct sockaddr_storage *dst);

/* The first FREE slot made a new connection in `state` with the next
 * generation; everything else in it, the fabric's fields too, zero (the
 * fabric sets what starts otherwise). NULL when every slot is taken. */
kvs_conn_t *hw_net_conn_alloc(hw_net_conns_t *t, int state);
/* connect's refusal when hw_net_conn_alloc found no slot: KVS_EFULL
 * recorded on the fabric, saying what to change. */
int hw_net_conn_full(hw_net_conns_t *t);
/* c's slot is FREE; what the connection held is the fabric's to release
 * first. Its generation stays until the next use of the slot. */
void hw_net_conn_free(hw_net_conn_t *c);

/* Fails c for good: DEAD with status and the reason formatted from fmt.
 * Returns false, changing nothing, when c is FREE or DEAD already; the
 * fabric then does what else failing means to it. */
bool hw_net_conn_vfail(hw_net_conn_t *c, int status, const char *fmt, va_list ap);

/* A post's check of its connection: KVS_EINVAL when conn is not a live
 * connection of the table, KVS_EPEER with the reason when it is DEAD (both
 * recorded on the fabric, `op` naming the call); else KVS_OK with *out the
 * connection, whose own states the fabric checks next. */
int hw_net_conn_check(const hw_net_conns_t *t, kvs_conn_t *conn, const char *op,
                      kvs_conn_t **out);

/* conn (DEAD, known to the user, not told yet): its DISCONNECT completion,
 * with its status (KVS_EPEER when none was kept) and, in msg, the reason
 * it failed with; told from now on. */
kvs_completion_t hw_net_conn_down(kvs_conn_t *conn);

#endif
