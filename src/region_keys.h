/*
 * region_keys.h (internal) - region-scoped remote keys (issue 17 item 2,
 * docs/security.md): what the decode does with the fabric's key_grant and
 * key_revoke (fabric ops version 4).
 *
 * When a region of the ring is assigned, each writer of it (a prefill rank,
 * on its own connection) is granted exactly the bytes it writes there
 * (kvs__writer_spans: its block, or its K and its V layers apart), and its
 * STAGING_RSP carries those keys instead of the whole ring's. When the
 * region goes back to the ring (scattered, or its room ended) the grants
 * are revoked first, so the bytes are never handed to anyone else while a
 * key to them lives. A write anywhere else, from another connection or
 * after the revoke fails at the writer (KVS_EREMOTE) and changes no byte.
 *
 * Invariants: one grant per (region, writer, write); every grant made is
 * revoked exactly once (kvs_handler_stats_t.keys_granted == keys_revoked
 * once every room has ended). A fabric without key_grant makes none: every
 * writer keeps the whole ring's key, as before (said once, at create).
 */
#ifndef KVS_SRC_REGION_KEYS_H
#define KVS_SRC_REGION_KEYS_H

#include "handler.h"

/* One writer's keys of one region: a grant per write (1 or 2), NULL where
 * none was made (the fallback key, or no second write). */
typedef struct kvs__wkeys {
    kvs_grant_t *grant[2];
    uint64_t rkey[2];
} kvs__wkeys_t;

/* What the decode keeps to make grants. */
typedef struct kvs__ring_keys {
    bool scoped;                /* the fabric has key_grant: writers get grants */
    bool fallback_told;         /* a grant refused with KVS_ENOTSUP was logged */
    kvs_mr_t *mr;               /* the ring's registration (the manager's) */
    uint64_t ring_addr, ring_rkey;
} kvs__ring_keys_t;

/* Sets rk up for the ring of m (when it has one) and h's fabric; when the
 * fabric cannot scope keys, logs that once (WARN), naming the fabric. */
void kvs__ring_keys_init(kvs__ring_keys_t *rk, kvs__handler_t *h);

/* Grants writer `peer` of inst (connected) its bytes of the region at
 * ring offset `offset` into *k (zeroed by the caller): its TP writer's
 * block of `part`, the CP part of the chunk its CP rank writes (with CP 1
 * the whole chunk, offset 0; kvs__part_spans, of a request of `total`
 * tokens). A grant the fabric refuses with KVS_ENOTSUP falls back to
 * the whole ring's key for that write (logged once). Any other failure
 * returns its status with m->err naming it; what was granted stays in *k
 * for kvs__wkeys_revoke. */
int kvs__wkeys_grant(kvs__ring_keys_t *rk, kvs__handler_t *h, const kvs__peer_t *peer,
                     uint64_t offset, int64_t total, const kvs_cp_part_t *part,
                     kvs__wkeys_t *k);

/* Revokes every grant in k (none may stay live: the region is about to be
 * reused); k keeps the keys, now dead, for duplicate answers. */
void kvs__wkeys_revoke(kvs__handler_t *h, kvs__wkeys_t *k);

#endif
