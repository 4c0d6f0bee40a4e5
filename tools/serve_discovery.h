/*
 * serve_discovery.h - `kvstage serve --discovery etcd://HOST:PORT`: the
 * processes of a run find each other through etcd, as kvstage.Discovery
 * (python/kvstage/discovery.py) does, with the same keys and records, so
 * serve processes and Python ranks see each other:
 *   /kvstage/CLUSTER/ROLE/INSTANCE/DP_RANK/PP_RANK/TP_RANK -> JSON record
 * under one lease per process, renewed by a thread every TTL / 3.
 *
 * A prefill rank publishes itself once made; a decode waits for each
 * prefill instance's records at start (instances may start after it) and
 * follows them: once an instance's records are gone (its lease lapsed:
 * the process died or hung), every decode rank is told
 * (kvs_rank_instance_lost) and that instance's rooms fail at once.
 *
 * etcd's v3 API through its JSON gateway (etcd >= 3.4), over plain HTTP/1.1
 * on a TCP socket: no client library. Bounded: 8 endpoints, 64 records per
 * process, 64 instances followed, responses of at most 4 MiB, a few
 * seconds per call.
 */
#ifndef KVS_TOOLS_SERVE_DISCOVERY_H
#define KVS_TOOLS_SERVE_DISCOVERY_H

#include <stddef.h>
#include <stdint.h>

#include <kvstage/kvstage.h>

typedef struct cli_disc cli_disc_t;

/* One rank as it publishes itself. */
typedef struct cli_disc_record {
    const char *role;          /* "prefill" or "decode" */
    uint64_t instance;
    int64_t dp_rank, pp_rank, tp_rank, tp_size, pp_size;
    int64_t cp_rank, cp_size;  /* a prefill's context parallelism; 0 -> 1 */
    const char *address;       /* "IP:PORT" a decode connects to ("" for a decode) */
    int64_t total_heads, head_dim, model_layers, page_size;
    const char *dtype;
} cli_disc_record_t;

/* A prefill instance (attention group 0) once all its ranks published. */
typedef struct cli_disc_instance {
    char ip[64];
    uint16_t port;             /* rank (t, s, c) at port + (c * pp + s) * tp + t,
                                  as serve's */
    int64_t tp_size, pp_size, cp_size;
    int64_t total_heads, head_dim, model_layers, page_size;
    char dtype[16];
} cli_disc_instance_t;

/* url "etcd://HOST:PORT[,HOST:PORT...]", cluster a name without '/',
 * ttl_s the lease's TTL (2..3600). Talks to nobody yet. -1 with err. */
int cli_disc_open(const char *url, const char *cluster, int64_t ttl_s, cli_disc_t **out,
                  char *err, size_t err_len);
/* Stops the threads and revokes the lease (this process's records go at
 * once). NULL: no-op. */
void cli_disc_close(cli_disc_t *d);
/* Publishes a record under the process's lease (granted, and its renewing
 * thread started, on the first). -1 with err. Thread-safe. */
int cli_disc_publish(cli_disc_t *d, const cli_disc_record_t *rec, char *err, size_t err_len);
/* Waits at most timeout_ms for every rank of prefill instance k (group 0)
 * to publish; its place into *out. Ranks must listen on serve's ports
 * (PORT + s * TP + t). -1 with err naming what is missing or wrong. */
int cli_disc_wait_instance(cli_disc_t *d, uint64_t k, int64_t timeout_ms,
                           cli_disc_instance_t *out, char *err, size_t err_len);
/* Decode: instances to follow (those waited for) and the ranks to tell
 * when one is gone. The follower thread starts with the first rank. */
void cli_disc_follow(cli_disc_t *d, kvs_rank_t *rank);
void cli_disc_unfollow(cli_disc_t *d, kvs_rank_t *rank);
/* Instances found gone so far (each counted once per disappearance). */
uint64_t cli_disc_lost(cli_disc_t *d);

#endif
