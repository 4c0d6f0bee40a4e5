/*
 * metrics.h (internal) - what one rank has done, kept for operators: for
 * each peer instance (and attention group) its rooms' transfer time and
 * bytes as histograms and its ended rooms by status; rendered with the
 * handler's counters and its open rooms by state as Prometheus text
 * (kvs_rank_metrics in kvstage.h). Fed from the one place results leave a
 * rank (src/rank.c), so a caller that polls and one that takes on_result
 * see the same numbers.
 *
 * Bounded: the peer table holds max_peers instances, set at create; rooms
 * of instances past it count under peer_instance="other". Nothing is
 * allocated after create, no clock is read (times are the results' own).
 */
#ifndef KVS_SRC_METRICS_H
#define KVS_SRC_METRICS_H

#include <kvstage/kvstage.h>

#include <stddef.h>

#define KVS__ROOM_STATES 5 /* kvs_room_state_t: FAILED .. SUCCESS */

typedef struct kvs__metrics kvs__metrics_t;

/* An empty set of metrics with room for max_peers (> 0) peer instances.
 * KVS_ENOMEM, nothing made. */
int kvs__metrics_create(uint32_t max_peers, kvs__metrics_t **out);
void kvs__metrics_destroy(kvs__metrics_t *m);
/* An empty set with m's capacity (for kvs__metrics_copy). */
int kvs__metrics_create_like(const kvs__metrics_t *m, kvs__metrics_t **out);
/* dst (made like src) becomes a copy of src: a snapshot taken under the
 * rank's lock, rendered outside it. */
void kvs__metrics_copy(kvs__metrics_t *dst, const kvs__metrics_t *src);
/* Counts one ended room. */
void kvs__metrics_observe(kvs__metrics_t *m, const kvs_room_result_t *res);

/* What a rank adds to its metrics when they are rendered. */
typedef struct kvs__metrics_rank {
    const kvs__metrics_t *m;
    kvs_role_t role;
    uint64_t instance;
    int64_t dp_rank, tp_rank, pp_rank;
    /* A prefill CP rank's (context_parallel > 1): labelled cp_rank, so the
     * CP ranks of one TP and PP rank are told apart; 0 or 1: no label. */
    int64_t cp_size, cp_rank;
    kvs_handler_stats_t stats;
    uint64_t rooms[KVS__ROOM_STATES]; /* open rooms by state */
    uint64_t ring_bytes;              /* decode: the ring's size; prefill: 0 */
} kvs__metrics_rank_t;

/* Prometheus text (exposition format 0.0.4) of n ranks, each metric family
 * once with every rank's samples. Writes at most cap bytes, NUL-terminated
 * when cap > 0; *len gets the text's full length. KVS_ERANGE when it did
 * not fit (len >= cap): call again with len + 1 bytes. */
int kvs__metrics_render(const kvs__metrics_rank_t *ranks, size_t n, char *buf, size_t cap,
                        size_t *len);

/* The handlers' open rooms by state (src/handler.c). */
void kvs__decode_room_counts(const kvs_decode_t *d, uint64_t counts[KVS__ROOM_STATES]);
void kvs__prefill_room_counts(const kvs_prefill_t *p, uint64_t counts[KVS__ROOM_STATES]);

#endif
