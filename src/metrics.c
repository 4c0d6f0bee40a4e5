/*
 * metrics.c - per-rank metrics for operators (metrics.h): histograms of
 * rooms' transfer time and bytes and ended rooms by status, per peer
 * instance, and their Prometheus text with the handler's counters.
 *
 * Units: times are kept in integer nanoseconds and bytes as integers; the
 * text prints seconds by integer arithmetic (no floating point anywhere).
 * Histogram bounds are fixed here, the same for every rank, so that
 * operators can aggregate them across ranks and instances.
 */
#include "metrics.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Time from a room's open to its end: 1 ms .. 60 s. */
static const struct {
    uint64_t ns;
    const char *le;
} kvs__time_bounds[] = {
    {1000000ull, "0.001"},    {2500000ull, "0.0025"},   {5000000ull, "0.005"},
    {10000000ull, "0.01"},    {25000000ull, "0.025"},   {50000000ull, "0.05"},
    {100000000ull, "0.1"},    {250000000ull, "0.25"},   {500000000ull, "0.5"},
    {1000000000ull, "1"},     {2500000000ull, "2.5"},   {5000000000ull, "5"},
    {10000000000ull, "10"},   {30000000000ull, "30"},   {60000000000ull, "60"},
};
#define KVS__TIME_BUCKETS (sizeof kvs__time_bounds / sizeof kvs__time_bounds[0])

/* Bytes a room moved: 64 KiB .. 16 GiB, by fours. */
#define KVS__BYTES_BUCKETS 10
static uint64_t kvs__bytes_bound(size_t i)
{
    return (uint64_t)1 << (16 + 2 * i);
}

/* Every status code, in list order; index KVS__NCODES counts unknown ones. */
static const int kvs__codes[] = {
#define KVS__CODE(name, value, msg) KVS_##name,
    KVS_STATUS_LIST(KVS__CODE)
#undef KVS__CODE
};
#define KVS__NCODES (sizeof kvs__codes / sizeof kvs__codes[0])

static size_t kvs__code_index(int status)
{
    for (size_t i = 0; i < KVS__NCODES; i++)
        if (kvs__codes[i] == status)
            return i;
    return KVS__NCODES;
}

typedef struct kvs__peer_metrics {
    kvs_peer_t peer;
    bool other; /* rooms of instances past the table */
    uint64_t time_count[KVS__TIME_BUCKETS + 1]; /* per bucket, last: above all */
    uint64_t time_sum_ns;
    uint64_t bytes_count[KVS__BYTES_BUCKETS + 1];
    uint64_t bytes_sum;
    uint64_t ok_rooms;
    uint64_t ended[KVS__NCODES + 1]; /* by status */
} kvs__peer_metrics_t;

struct kvs__metrics {
    uint32_t cap, used;
    kvs__peer_metrics_t *peers; /* [cap + 1]: the last is "other" */
};

int kvs__metrics_create(uint32_t max_peers, kvs__metrics_t **out)
{
    *out = NULL;
    kvs__metrics_t *m = calloc(1, sizeof *m);
    if (m == NULL || max_peers == 0 ||
        (m->peers = calloc((size_t)max_peers + 1, sizeof *m->peers)) == NULL) {
        free(m);
        return KVS_ENOMEM;
    }
    m->cap = max_peers;
    m->peers[max_peers].other = true;
    *out = m;
    return KVS_OK;
}

void kvs__metrics_destroy(kvs__metrics_t *m)
{
    if (m == NULL)
        return;
    free(m->peers);
    free(m);
}

int kvs__metrics_create_like(const kvs__metrics_t *m, kvs__metrics_t **out)
{
    return kvs__metrics_create(m->cap, out);
}

void kvs__metrics_copy(kvs__metrics_t *dst, const kvs__metrics_t *src)
{
    assert(dst->cap == src->cap);
    dst->used = src->used;
    memcpy(dst->peers, src->peers, ((size_t)src->cap + 1) * sizeof *src->peers);
}

static kvs__peer_metrics_t *kvs__peer_slot(kvs__metrics_t *m, kvs_peer_t peer)
{
    for (uint32_t i = 0; i < m->used; i++)
        if (m->peers[i].peer.instance == peer.instance && m->peers[i].peer.dp_rank == peer.dp_rank)
            return &m->peers[i];
    if (m->used == m->cap)
        return &m->peers[m->cap];
    m->peers[m->used].peer = peer;
    return &m->peers[m->used++];
}

static uint64_t kvs__sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

void kvs__metrics_observe(kvs__metrics_t *m, const kvs_room_result_t *res)
{
    kvs__peer_metrics_t *p = kvs__peer_slot(m, res->peer);
    p->ended[kvs__code_index(res->status)]++;
    if (res->status != KVS_OK)
        return;
    p->ok_rooms++;
    const uint64_t ns = res->done_ns >= res->open_ns ? res->done_ns - res->open_ns : 0;
    size_t b = 0;
    while (b < KVS__TIME_BUCKETS && ns > kvs__time_bounds[b].ns)
        b++;
    p->time_count[b]++;
    p->time_sum_ns = kvs__sat_add(p->time_sum_ns, ns);
    b = 0;
    while (b < KVS__BYTES_BUCKETS && res->bytes > kvs__bytes_bound(b))
        b++;
    p->bytes_count[b]++;
    p->bytes_sum = kvs__sat_add(p->bytes_sum, res->bytes);
}

/* ---- text ---- */

typedef struct kvs__text {
    char *buf;
    size_t cap, len; /* len counts past cap: the length the text needs */
} kvs__text_t;

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
static void kvs__put(kvs__text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const size_t room = t->len < t->cap ? t->cap - t->len : 0;
    const int n = vsnprintf(room > 0 ? t->buf + t->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->len += (size_t)n;
}

static void kvs__family(kvs__text_t *t, const char *name, const char *type, const char *help)
{
    kvs__put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The labels every sample of a rank carries, without braces. */
static void kvs__rank_labels(kvs__text_t *t, const kvs__metrics_rank_t *r)
{
    kvs__put(t, "role=\"%s\",instance=\"%" PRIu64 "\",dp_rank=\"%" PRId64 "\",tp_rank=\"%" PRId64
                "\",pp_rank=\"%" PRId64 "\"",
             r->role == KVS_ROLE_DECODE ? "decode" : "prefill", r->instance, r->dp_rank,
             r->tp_rank, r->pp_rank);
    if (r->cp_size > 1)
        kvs__put(t, ",cp_rank=\"%" PRId64 "\"", r->cp_rank);
}

static void kvs__peer_labels(kvs__text_t *t, const kvs__peer_metrics_t *p)
{
    if (p->other)
        kvs__put(t, ",peer_instance=\"other\",peer_dp_rank=\"other\"");
    else
        kvs__put(t, ",peer_instance=\"%" PRIu64 "\",peer_dp_rank=\"%" PRId64 "\"",
                 p->peer.instance, p->peer.dp_rank);
}

/* The peers of a rank with something to show: the table's used slots, and
 * "other" once it counted a room. */
static size_t kvs__peers_shown(const kvs__metrics_t *m)
{
    uint64_t other = 0;
    for (size_t i = 0; i <= KVS__NCODES; i++)
        other += m->peers[m->cap].ended[i];
    return m->used + (other > 0 ? 1 : 0);
}

static const kvs__peer_metrics_t *kvs__peer_at(const kvs__metrics_t *m, size_t i)
{
    return i < m->used ? &m->peers[i] : &m->peers[m->cap];
}

static void kvs__seconds(kvs__text_t *t, uint64_t ns)
{
    kvs__put(t, "%" PRIu64 ".%09" PRIu64, ns / UINT64_C(1000000000), ns % UINT64_C(1000000000));
}

/* One histogram family: its bounds and the counts and sum of a peer. */
typedef struct kvs__hist {
    const char *name, *help;
    size_t buckets;                                  /* bounds, +Inf apart */
    void (*le)(kvs__text_t *t, size_t b);            /* bound b as le="..." */
    const uint64_t *(*counts)(const kvs__peer_metrics_t *p); /* [buckets + 1] */
    void (*sum)(kvs__text_t *t, const kvs__peer_metrics_t *p);
} kvs__hist_t;

static void kvs__time_le(kvs__text_t *t, size_t b) { kvs__put(t, "%s", kvs__time_bounds[b].le); }
static void kvs__bytes_le(kvs__text_t *t, size_t b)
{
    kvs__put(t, "%" PRIu64, kvs__bytes_bound(b));
}
static const uint64_t *kvs__time_counts(const kvs__peer_metrics_t *p) { return p->time_count; }
static const uint64_t *kvs__bytes_counts(const kvs__peer_metrics_t *p) { return p->bytes_count; }
static void kvs__time_sum(kvs__text_t *t, const kvs__peer_metrics_t *p)
{
    kvs__seconds(t, p->time_sum_ns);
}
static void kvs__bytes_sum(kvs__text_t *t, const kvs__peer_metrics_t *p)
{
    kvs__put(t, "%" PRIu64, p->bytes_sum);
}

static const kvs__hist_t kvs__hists[] = {
    {"kvstage_room_transfer_seconds",
     "Time from a room's open to its end on this rank, rooms that succeeded, by peer instance.",
     KVS__TIME_BUCKETS, kvs__time_le, kvs__time_counts, kvs__time_sum},
    {"kvstage_room_transfer_bytes",
     "KV bytes a room moved on this rank (written by a prefill rank, received by a decode "
     "rank), rooms that succeeded, by peer instance.",
     KVS__BYTES_BUCKETS, kvs__bytes_le, kvs__bytes_counts, kvs__bytes_sum},
};

/* The samples' labels: the rank's, the peer's. */
static void kvs__labels(kvs__text_t *t, const kvs__metrics_rank_t *r, const kvs__peer_metrics_t *p)
{
    kvs__rank_labels(t, r);
    kvs__peer_labels(t, p);
}

static void kvs__histogram(kvs__text_t *t, const kvs__hist_t *h, const kvs__metrics_rank_t *ranks,
                           size_t n)
{
    kvs__family(t, h->name, "histogram", h->help);
    for (size_t r = 0; r < n; r++) {
        for (size_t i = 0; i < kvs__peers_shown(ranks[r].m); i++) {
            const kvs__peer_metrics_t *p = kvs__peer_at(ranks[r].m, i);
            const uint64_t *counts = h->counts(p);
            uint64_t below = 0;
            for (size_t b = 0; b <= h->buckets; b++) {
                below += counts[b];
                kvs__put(t, "%s_bucket{", h->name);
                kvs__labels(t, &ranks[r], p);
                kvs__put(t, ",le=\"");
                if (b < h->buckets)
                    h->le(t, b);
                else
                    kvs__put(t, "+Inf");
                kvs__put(t, "\"} %" PRIu64 "\n", below);
            }
            kvs__put(t, "%s_sum{", h->name);
            kvs__labels(t, &ranks[r], p);
            kvs__put(t, "} ");
            h->sum(t, p);
            kvs__put(t, "\n%s_count{", h->name);
            kvs__labels(t, &ranks[r], p);
            kvs__put(t, "} %" PRIu64 "\n", p->ok_rooms);
        }
    }
}

static void kvs__ended(kvs__text_t *t, const kvs__metrics_rank_t *ranks, size_t n)
{
    const char *name = "kvstage_rooms_ended_total";
    kvs__family(t, name, "counter",
                "Rooms that ended on this rank, by peer instance and terminal status "
                "(KVS_OK: succeeded; any other names why it failed).");
    for (size_t r = 0; r < n; r++) {
        for (size_t i = 0; i < kvs__peers_shown(ranks[r].m); i++) {
            const kvs__peer_metrics_t *p = kvs__peer_at(ranks[r].m, i);
            for (size_t c = 0; c <= KVS__NCODES; c++) {
                /* KVS_OK always, so a scrape sees every peer's series. */
                if (p->ended[c] == 0 && !(c < KVS__NCODES && kvs__codes[c] == KVS_OK))
                    continue;
                kvs__put(t, "%s{", name);
                kvs__labels(t, &ranks[r], p);
                kvs__put(t, ",status=\"%s\"} %" PRIu64 "\n",
                         c < KVS__NCODES ? kvs_status_name(kvs__codes[c]) : "KVS_UNKNOWN",
                         p->ended[c]);
            }
        }
    }
}

static void kvs__open_rooms(kvs__text_t *t, const kvs__metrics_rank_t *ranks, size_t n)
{
    const char *name = "kvstage_rooms_open";
    kvs__family(t, name, "gauge",
                "Rooms open on this rank by state (failed: failed, its result not out yet, "
                "waiting until no write can land).");
    for (size_t r = 0; r < n; r++) {
        for (int s = 0; s < KVS__ROOM_STATES; s++) {
            if (s == KVS_ROOM_SUCCESS) /* ended rooms are results, not open */
                continue;
            kvs__put(t, "%s{", name);
            kvs__rank_labels(t, &ranks[r]);
            kvs__put(t, ",state=\"%s\"} %" PRIu64 "\n", kvs_room_state_name((kvs_room_state_t)s),
                     ranks[r].rooms[s]);
        }
    }
}

/* The handler's counters: one list, read by the renderer below. */
#define KVS__STAT_LIST(X)                                                                     \
    X(rdma_writes, "kvstage_rdma_writes_total", "counter", "RDMA writes posted.")              \
    X(rdma_write_bytes, "kvstage_rdma_write_bytes_total", "counter",                           \
      "Bytes of the RDMA writes posted.")                                                     \
    X(copies, "kvstage_copies_total", "counter",                                              \
      "Device copies: gathers (prefill) or scatters (decode).")                               \
    X(msgs_sent, "kvstage_control_messages_sent_total", "counter", "Control messages sent.")   \
    X(msgs_received, "kvstage_control_messages_received_total", "counter",                     \
      "Control messages received.")                                                           \
    X(msgs_rejected, "kvstage_control_messages_rejected_total", "counter",                     \
      "Control messages dropped as malformed, stale or out of range.")                        \
    X(msgs_retransmitted, "kvstage_control_messages_retransmitted_total", "counter",           \
      "Control messages sent again, not acknowledged in time.")                               \
    X(msgs_duplicate, "kvstage_control_messages_duplicate_total", "counter",                   \
      "Control messages received again and dropped.")                                         \
    X(msgs_unacked, "kvstage_control_messages_unacked", "gauge",                              \
      "Control messages sent and not yet acknowledged.")                                      \
    X(peers_lost, "kvstage_peers_lost_total", "counter", "Connections found dead.")            \
    X(auth_refused, "kvstage_auth_refused_total", "counter",                                  \
      "Registrations refused for authentication.")                                            \
    X(watermark_waits, "kvstage_watermark_waits_total", "counter",                            \
      "Prefill: chunks requeued until the decode's ring freed their region.")                 \
    X(ring_live_bytes, "kvstage_ring_live_bytes", "gauge",                                    \
      "Decode: staging ring bytes live now.")                                                 \
    X(ring_peak_bytes, "kvstage_ring_peak_bytes", "gauge",                                    \
      "Decode: the most staging ring bytes live at once.")                                    \
    X(keys_granted, "kvstage_keys_granted_total", "counter",                                  \
      "Decode: region-scoped remote keys granted to writers.")                                \
    X(keys_revoked, "kvstage_keys_revoked_total", "counter",                                  \
      "Decode: region-scoped remote keys revoked.")

static void kvs__rank_gauge(kvs__text_t *t, const kvs__metrics_rank_t *ranks, size_t n,
                            const char *name, const char *type, const char *help,
                            size_t offset)
{
    kvs__family(t, name, type, help);
    for (size_t r = 0; r < n; r++) {
        uint64_t v;
        memcpy(&v, (const char *)&ranks[r].stats + offset, sizeof v);
        kvs__put(t, "%s{", name);
        kvs__rank_labels(t, &ranks[r]);
        kvs__put(t, "} %" PRIu64 "\n", v);
    }
}

int kvs__metrics_render(const kvs__metrics_rank_t *ranks, size_t n, char *buf, size_t cap,
                        size_t *len)
{
    kvs__text_t t = {.buf = buf, .cap = cap};
    if (cap > 0)
        buf[0] = '\0';
    for (size_t h = 0; h < sizeof kvs__hists / sizeof kvs__hists[0]; h++)
        kvs__histogram(&t, &kvs__hists[h], ranks, n);
    kvs__ended(&t, ranks, n);
    kvs__open_rooms(&t, ranks, n);
#define KVS__STAT_RENDER(field, name, type, help)                                             \
    kvs__rank_gauge(&t, ranks, n, name, type, help, offsetof(kvs_handler_stats_t, field));
    KVS__STAT_LIST(KVS__STAT_RENDER)
#undef KVS__STAT_RENDER
    kvs__family(&t, "kvstage_control_rtt_seconds", "gauge",
                "The smoothed round trip of a control message to its acknowledgement, the "
                "largest over the live connections (0 before the first sample).");
    for (size_t r = 0; r < n; r++) {
        kvs__put(&t, "kvstage_control_rtt_seconds{");
        kvs__rank_labels(&t, &ranks[r]);
        kvs__put(&t, "} ");
        kvs__seconds(&t, ranks[r].stats.rtt_smoothed_ns);
        kvs__put(&t, "\n");
    }
    kvs__family(&t, "kvstage_ring_size_bytes", "gauge", "Decode: the staging ring's size.");
    for (size_t r = 0; r < n; r++) {
        kvs__put(&t, "kvstage_ring_size_bytes{");
        kvs__rank_labels(&t, &ranks[r]);
        kvs__put(&t, "} %" PRIu64 "\n", ranks[r].ring_bytes);
    }
    *len = t.len;
    return t.len < cap ? KVS_OK : KVS_ERANGE;
}
