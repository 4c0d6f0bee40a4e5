/*
 * serve_discovery.c - etcd discovery for `kvstage serve` (serve_discovery.h):
 * a small HTTP/1.1 client of etcd's v3 JSON gateway (grant, keepalive,
 * revoke, put, range), the base64 it needs, a scanner for the few JSON
 * fields it reads, and two threads: one renews the lease, one (decode)
 * follows the prefill instances and tells the ranks when one is gone.
 *
 * The JSON read here is etcd's answers and the records kvstage writes (by
 * this file or by json.dumps in Python): flat fields, numbers bare or in
 * quotes, strings without escapes (base64, addresses, names). A record
 * without cp_rank and cp_size is that of a rank without context
 * parallelism (CP rank 0 of 1).
 */
#include "serve_discovery.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CLI_DISC_ENDPOINTS 8
#define CLI_DISC_RECORDS 64
#define CLI_DISC_RANKS 64
#define CLI_DISC_INSTANCES 64
#define CLI_DISC_RESPONSE_MAX (4u << 20)
#define CLI_DISC_IO_TIMEOUT_S 2
#define CLI_DISC_KEY_BYTES 160
#define CLI_DISC_VALUE_BYTES 1024
#define CLI_SERVE_GROUP_RANKS 64 /* ranks of one group: serve's bound per process */

typedef struct cli_disc_pub {
    char key[CLI_DISC_KEY_BYTES];
    char value[CLI_DISC_VALUE_BYTES];
} cli_disc_pub_t;

struct cli_disc {
    char host[CLI_DISC_ENDPOINTS][256];
    char port[CLI_DISC_ENDPOINTS][8];
    int nendpoints;
    char root[96];            /* "/kvstage/CLUSTER/" */
    int64_t ttl_s;
    pthread_mutex_t mu;       /* everything below */
    pthread_cond_t cv;        /* the threads' sleeps; signalled to stop */
    bool stop;
    int64_t lease;            /* 0: none yet */
    cli_disc_pub_t pubs[CLI_DISC_RECORDS];
    int npubs;
    kvs_rank_t *ranks[CLI_DISC_RANKS];
    int nranks;
    bool watch[CLI_DISC_INSTANCES];  /* followed instances */
    bool gone[CLI_DISC_INSTANCES];
    uint64_t lost;
    pthread_t keeper, follower;
    bool keeper_on, follower_on;
};

static void cli_disc_say(char *err, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cli_disc_say(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* ---- base64 ---------------------------------------------------------------- */

static const char cli_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* out gets the base64 of in[0..n), NUL-terminated; false when it does not fit. */
static bool cli_b64_encode(const char *in, size_t n, char *out, size_t cap)
{
    if ((n + 2) / 3 * 4 + 1 > cap)
        return false;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t)(unsigned char)in[i] << 16 |
                           (i + 1 < n ? (uint32_t)(unsigned char)in[i + 1] << 8 : 0) |
                           (i + 2 < n ? (uint32_t)(unsigned char)in[i + 2] : 0);
        out[o++] = cli_b64[v >> 18 & 63];
        out[o++] = cli_b64[v >> 12 & 63];
        out[o++] = i + 1 < n ? cli_b64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? cli_b64[v & 63] : '=';
    }
    out[o] = '\0';
    return true;
}

/* The n base64 characters at in, decoded into out (NUL-terminated); false
 * on a bad character or when it does not fit. */
static bool cli_b64_decode(const char *in, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    uint32_t v = 0;
    int bits = 0;
    for (size_t i = 0; i < n && in[i] != '='; i++) {
        const char *p = strchr(cli_b64, in[i]);
        if (p == NULL || in[i] == '\0')
            return false;
        v = v << 6 | (uint32_t)(p - cli_b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o + 1 >= cap)
                return false;
            out[o++] = (char)(v >> bits & 0xff);
        }
    }
    out[o] = '\0';
    return true;
}

/* ---- JSON fields ------------------------------------------------------------- */

/* Where the value of field `name` starts in [p, end), after "name" : */
static const char *cli_json_at(const char *p, const char *end, const char *name)
{
    const size_t n = strlen(name);
    for (const char *q = p; q + n + 2 < end; q++) {
        if (q[0] != '"' || strncmp(q + 1, name, n) != 0 || q[n + 1] != '"')
            continue;
        const char *v = q + n + 2;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        if (v >= end || *v != ':')
            continue;
        v++;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        return v;
    }
    return NULL;
}

/* A string field into out; false when absent or too long. */
static bool cli_json_str(const char *p, const char *end, const char *name, char *out, size_t cap)
{
    const char *v = cli_json_at(p, end, name);
    if (v == NULL || *v != '"')
        return false;
    const char *close = memchr(v + 1, '"', (size_t)(end - v - 1));
    if (close == NULL || (size_t)(close - v - 1) >= cap)
        return false;
    memcpy(out, v + 1, (size_t)(close - v - 1));
    out[close - v - 1] = '\0';
    return true;
}

/* An integer field, bare or quoted (etcd quotes int64s); false when absent. */
static bool cli_json_int(const char *p, const char *end, const char *name, int64_t *out)
{
    const char *v = cli_json_at(p, end, name);
    if (v == NULL)
        return false;
    if (*v == '"')
        v++;
    char *stop = NULL;
    errno = 0;
    const long long x = strtoll(v, &stop, 10);
    if (stop == v || errno != 0)
        return false;
    *out = x;
    return true;
}

/* ---- HTTP ------------------------------------------------------------------------ */

/* De-chunks body[0..*len) in place (Transfer-Encoding: chunked). */
static bool cli_http_dechunk(char *body, size_t *len)
{
    size_t in = 0, out = 0;
    for (;;) {
        char *stop = NULL;
        const unsigned long n = strtoul(body + in, &stop, 16);
        const char *eol = strstr(body + in, "\r\n");
        if (stop == body + in || eol == NULL)
            return false;
        in = (size_t)(eol - body) + 2;
        if (n == 0)
            break;
        if (in + n > *len)
            return false;
        memmove(body + out, body + in, n);
        out += n;
        in += n + 2;
        if (in > *len)
            return false;
    }
    body[out] = '\0';
    *len = out;
    return true;
}

/* One POST to one endpoint: the answer's body (malloc'd, NUL-terminated)
 * into *body for a 200; -1 with err otherwise. */
static int cli_http_post(const cli_disc_t *d, int e, const char *path, const char *json,
                         char **body, char *err, size_t err_len)
{
    *body = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(d->host[e], d->port[e], &hints, &ai);
    if (rc != 0) {
        cli_disc_say(err, err_len, "etcd %s:%s: %s", d->host[e], d->port[e], gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        const struct timeval tv = {.tv_sec = CLI_DISC_IO_TIMEOUT_S};
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* connect too */
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        cli_disc_say(err, err_len, "etcd %s:%s: cannot connect (%s): is etcd running there?",
                     d->host[e], d->port[e], strerror(errno));
        return -1;
    }
    char head[512];
    const size_t n = strlen(json);
    const int h = snprintf(head, sizeof head,
                           "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                           "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                           path, d->host[e], d->port[e], n);
    bool ok = h > 0 && (size_t)h < sizeof head &&
              send(fd, head, (size_t)h, MSG_NOSIGNAL) == h &&
              send(fd, json, n, MSG_NOSIGNAL) == (ssize_t)n;
    size_t cap = 4096, got = 0;
    char *buf = ok ? malloc(cap + 1) : NULL;
    while (buf != NULL) {
        if (got == cap) {
            char *bigger = cap < CLI_DISC_RESPONSE_MAX ? realloc(buf, cap * 2 + 1) : NULL;
            if (bigger == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        const ssize_t r = recv(fd, buf + got, cap - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (buf == NULL) {
        cli_disc_say(err, err_len, "etcd %s:%s: %s failed: no answer", d->host[e], d->port[e],
                     path);
        return -1;
    }
    buf[got] = '\0';
    char *start = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.1 200", 12) != 0 || start == NULL) {
        cli_disc_say(err, err_len, "etcd %s:%s refused %s: %.200s", d->host[e], d->port[e],
                     path, start != NULL ? start + 4 : buf);
        free(buf);
        return -1;
    }
    *start = '\0';
    const bool chunked = strstr(buf, "\r\nTransfer-Encoding: chunked") != NULL ||
                         strstr(buf, "\r\ntransfer-encoding: chunked") != NULL;
    size_t len = got - (size_t)(start + 4 - buf);
    memmove(buf, start + 4, len + 1);
    if (chunked && !cli_http_dechunk(buf, &len)) {
        cli_disc_say(err, err_len, "etcd %s:%s: a chunked answer to %s did not parse",
                     d->host[e], d->port[e], path);
        free(buf);
        return -1;
    }
    *body = buf;
    return 0;
}

/* POST to the first endpoint that answers. */
static int cli_disc_call(const cli_disc_t *d, const char *path, const char *json, char **body,
                         char *err, size_t err_len)
{
    for (int e = 0; e < d->nendpoints; e++)
        if (cli_http_post(d, e, path, json, body, err, err_len) == 0)
            return 0;
    return -1;
}

/* ---- etcd calls ----------------------------------------------------------------- */

static int cli_disc_grant(cli_disc_t *d, int64_t *lease, char *err, size_t n)
{
    char req[64], *body = NULL;
    snprintf(req, sizeof req, "{\"TTL\": %" PRId64 "}", d->ttl_s);
    if (cli_disc_call(d, "/v3/lease/grant", req, &body, err, n) != 0)
        return -1;
    const bool ok = cli_json_int(body, body + strlen(body), "ID", lease) && *lease != 0;
    free(body);
    if (!ok)
        cli_disc_say(err, n, "etcd granted no lease");
    return ok ? 0 : -1;
}

/* The TTL left after renewing (0: it had lapsed), or -1. */
static int64_t cli_disc_keepalive(cli_disc_t *d, int64_t lease, char *err, size_t n)
{
    char req[64], *body = NULL;
    snprintf(req, sizeof req, "{\"ID\": \"%" PRId64 "\"}", lease);
    if (cli_disc_call(d, "/v3/lease/keepalive", req, &body, err, n) != 0)
        return -1;
    int64_t ttl = 0;
    (void)cli_json_int(body, body + strlen(body), "TTL", &ttl); /* absent: lapsed */
    free(body);
    return ttl;
}

static int cli_disc_put(cli_disc_t *d, const char *key, const char *value, int64_t lease,
                        char *err, size_t n)
{
    char k64[CLI_DISC_KEY_BYTES * 2], v64[CLI_DISC_VALUE_BYTES * 2], req[3 * CLI_DISC_VALUE_BYTES];
    if (!cli_b64_encode(key, strlen(key), k64, sizeof k64) ||
        !cli_b64_encode(value, strlen(value), v64, sizeof v64)) {
        cli_disc_say(err, n, "a discovery record is too long");
        return -1;
    }
    snprintf(req, sizeof req, "{\"key\": \"%s\", \"value\": \"%s\", \"lease\": \"%" PRId64 "\"}",
             k64, v64, lease);
    char *body = NULL;
    if (cli_disc_call(d, "/v3/kv/put", req, &body, err, n) != 0)
        return -1;
    free(body);
    return 0;
}

/* Every record under prefix: for each, fn(ctx, key, value). */
static int cli_disc_range(cli_disc_t *d, const char *prefix,
                          void (*fn)(void *ctx, const char *key, const char *value), void *ctx,
                          char *err, size_t n)
{
    char end[CLI_DISC_KEY_BYTES];
    const size_t plen = strlen(prefix);
    char k64[CLI_DISC_KEY_BYTES * 2], e64[CLI_DISC_KEY_BYTES * 2], req[4 * CLI_DISC_KEY_BYTES + 64];
    if (plen == 0 || plen >= sizeof end) {
        cli_disc_say(err, n, "a discovery key is too long");
        return -1;
    }
    memcpy(end, prefix, plen + 1);
    end[plen - 1]++; /* the key after every key starting with prefix */
    const int w = cli_b64_encode(prefix, plen, k64, sizeof k64) &&
                          cli_b64_encode(end, plen, e64, sizeof e64)
                      ? snprintf(req, sizeof req, "{\"key\": \"%s\", \"range_end\": \"%s\"}",
                                 k64, e64)
                      : -1;
    if (w < 0 || (size_t)w >= sizeof req) {
        cli_disc_say(err, n, "a discovery key is too long");
        return -1;
    }
    char *body = NULL;
    if (cli_disc_call(d, "/v3/kv/range", req, &body, err, n) != 0)
        return -1;
    const char *stop = body + strlen(body);
    for (const char *p = strstr(body, "\"key\""); p != NULL;) {
        const char *next = strstr(p + 5, "\"key\"");
        const char *obj_end = next != NULL ? next : stop;
        char kb[CLI_DISC_KEY_BYTES * 2], vb[CLI_DISC_VALUE_BYTES * 2];
        char key[CLI_DISC_KEY_BYTES], value[CLI_DISC_VALUE_BYTES];
        if (cli_json_str(p, obj_end, "key", kb, sizeof kb) &&
            cli_json_str(p, obj_end, "value", vb, sizeof vb) &&
            cli_b64_decode(kb, strlen(kb), key, sizeof key) &&
            cli_b64_decode(vb, strlen(vb), value, sizeof value))
            fn(ctx, key, value);
        p = next;
    }
    free(body);
    return 0;
}

/* ---- threads ---------------------------------------------------------------------- */

/* Sleeps ms or until stop; true when told to stop. Under d->mu. */
static bool cli_disc_sleep(cli_disc_t *d, int64_t ms)
{
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_sec += (time_t)(ms / 1000);
    at.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (at.tv_nsec >= 1000000000L) {
        at.tv_sec++;
        at.tv_nsec -= 1000000000L;
    }
    while (!d->stop && pthread_cond_timedwait(&d->cv, &d->mu, &at) != ETIMEDOUT)
        ;
    return d->stop;
}

static void *cli_disc_keep(void *arg)
{
    cli_disc_t *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!cli_disc_sleep(d, d->ttl_s * 1000 / 3)) {
        char err[256];
        const int64_t lease = d->lease;
        pthread_mutex_unlock(&d->mu);
        const int64_t ttl = cli_disc_keepalive(d, lease, err, sizeof err);
        pthread_mutex_lock(&d->mu);
        if (ttl < 0) {
            fprintf(stderr, "kvstage serve: discovery: renewing the lease: %s\n", err);
        } else if (ttl == 0 && !d->stop) {
            /* It lapsed (this process stalled past the TTL): publish again
             * under a new lease, so the instance comes back. */
            int64_t fresh = 0;
            if (cli_disc_grant(d, &fresh, err, sizeof err) == 0) {
                d->lease = fresh;
                for (int i = 0; i < d->npubs; i++)
                    (void)cli_disc_put(d, d->pubs[i].key, d->pubs[i].value, fresh, err,
                                       sizeof err);
            }
            fprintf(stderr, "kvstage serve: discovery: the lease had lapsed: published again\n");
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

typedef struct cli_disc_seen {
    const char *root;
    int64_t ranks[CLI_DISC_INSTANCES];  /* records of group 0 per instance */
    int64_t want[CLI_DISC_INSTANCES];   /* its CP x TP x PP, from a record */
} cli_disc_seen_t;

static void cli_disc_count(void *ctx, const char *key, const char *value)
{
    cli_disc_seen_t *s = ctx;
    const char *end = value + strlen(value);
    int64_t inst = -1, dp = -1, tp = 0, pp = 0, cp = 1;
    if (!cli_json_int(value, end, "instance", &inst) || !cli_json_int(value, end, "dp_rank", &dp) ||
        !cli_json_int(value, end, "tp_size", &tp) || !cli_json_int(value, end, "pp_size", &pp) ||
        inst < 0 || inst >= CLI_DISC_INSTANCES || dp != 0)
        return;
    (void)cli_json_int(value, end, "cp_size", &cp);
    (void)key;
    s->ranks[inst]++;
    s->want[inst] = tp * pp * (cp > 1 ? cp : 1);
}

static void *cli_disc_follow_run(void *arg)
{
    cli_disc_t *d = arg;
    const int64_t poll_ms = d->ttl_s * 1000 / 4;
    pthread_mutex_lock(&d->mu);
    while (!cli_disc_sleep(d, poll_ms)) {
        char prefix[CLI_DISC_KEY_BYTES], err[256];
        snprintf(prefix, sizeof prefix, "%sprefill/", d->root);
        cli_disc_seen_t seen;
        memset(&seen, 0, sizeof seen);
        pthread_mutex_unlock(&d->mu);
        const int rc = cli_disc_range(d, prefix, cli_disc_count, &seen, err, sizeof err);
        pthread_mutex_lock(&d->mu);
        if (rc != 0) {
            fprintf(stderr, "kvstage serve: discovery: following the instances: %s\n", err);
            continue;
        }
        for (int k = 0; k < CLI_DISC_INSTANCES; k++) {
            if (!d->watch[k])
                continue;
            const bool present = seen.want[k] > 0 && seen.ranks[k] == seen.want[k];
            if (present || d->gone[k]) {
                d->gone[k] = d->gone[k] && !present;
                continue;
            }
            d->gone[k] = true;
            d->lost++;
            fprintf(stderr, "kvstage serve: discovery: prefill instance %d is gone (its lease "
                            "lapsed): its rooms fail\n", k);
            for (int r = 0; r < d->nranks; r++)
                (void)kvs_rank_instance_lost(d->ranks[r], (kvs_peer_t){(uint64_t)k, 0});
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- the API -------------------------------------------------------------------------- */

int cli_disc_open(const char *url, const char *cluster, int64_t ttl_s, cli_disc_t **out,
                  char *err, size_t err_len)
{
    *out = NULL;
    if (strncmp(url, "etcd://", 7) != 0 && strncmp(url, "http://", 7) != 0) {
        cli_disc_say(err, err_len, "--discovery '%s': give etcd://HOST:PORT[,HOST:PORT...]",
                     url);
        return -1;
    }
    if (cluster[0] == '\0' || strchr(cluster, '/') != NULL || strlen(cluster) > 48) {
        cli_disc_say(err, err_len, "--discovery-cluster '%s': give a name of at most 48 "
                     "characters without '/'", cluster);
        return -1;
    }
    if (ttl_s < 2 || ttl_s > 3600) {
        cli_disc_say(err, err_len, "--discovery-ttl-s %" PRId64 ": give seconds in [2, 3600]",
                     ttl_s);
        return -1;
    }
    cli_disc_t *d = calloc(1, sizeof *d);
    if (d == NULL) {
        cli_disc_say(err, err_len, "--discovery: out of memory");
        return -1;
    }
    for (const char *p = url + 7; *p != '\0';) {
        const size_t n = strcspn(p, ",/");
        const char *colon = memchr(p, ':', n);
        if (d->nendpoints == CLI_DISC_ENDPOINTS || colon == NULL || colon == p ||
            (size_t)(colon - p) >= sizeof d->host[0] || n - (size_t)(colon - p) - 1 == 0 ||
            n - (size_t)(colon - p) - 1 >= sizeof d->port[0]) {
            cli_disc_say(err, err_len, "--discovery '%s': give HOST:PORT for each etcd member "
                         "(at most %d)", url, CLI_DISC_ENDPOINTS);
            free(d);
            return -1;
        }
        memcpy(d->host[d->nendpoints], p, (size_t)(colon - p));
        memcpy(d->port[d->nendpoints], colon + 1, n - (size_t)(colon - p) - 1);
        d->nendpoints++;
        p += n;
        if (*p == '/')
            break;
        if (*p == ',')
            p++;
    }
    if (d->nendpoints == 0) {
        cli_disc_say(err, err_len, "--discovery '%s': no HOST:PORT", url);
        free(d);
        return -1;
    }
    snprintf(d->root, sizeof d->root, "/kvstage/%s/", cluster);
    d->ttl_s = ttl_s;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    *out = d;
    return 0;
}

void cli_disc_close(cli_disc_t *d)
{
    if (d == NULL)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (d->keeper_on)
        pthread_join(d->keeper, NULL);
    if (d->follower_on)
        pthread_join(d->follower, NULL);
    if (d->lease != 0) {
        char req[64], err[256], *body = NULL;
        snprintf(req, sizeof req, "{\"ID\": \"%" PRId64 "\"}", d->lease);
        if (cli_disc_call(d, "/v3/lease/revoke", req, &body, err, sizeof err) == 0)
            free(body); /* else it lapses by itself */
    }
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

int cli_disc_publish(cli_disc_t *d, const cli_disc_record_t *rec, char *err, size_t err_len)
{
    cli_disc_pub_t pub;
    /* Keys as Python's Discovery.publish writes them: a CP rank's (CP size
     * > 1) ends with its CP rank. */
    const int64_t cp_size = rec->cp_size > 1 ? rec->cp_size : 1;
    int n = snprintf(pub.key, sizeof pub.key, "%s%s/%" PRIu64 "/%" PRId64 "/%" PRId64 "/%" PRId64,
                     d->root, rec->role, rec->instance, rec->dp_rank, rec->pp_rank, rec->tp_rank);
    if (n >= 0 && (size_t)n < sizeof pub.key && cp_size > 1)
        n += snprintf(pub.key + n, sizeof pub.key - (size_t)n, "/%" PRId64, rec->cp_rank);
    const int m = snprintf(
        pub.value, sizeof pub.value,
        "{\"address\": \"%s\", \"cp_rank\": %" PRId64 ", \"cp_size\": %" PRId64
        ", \"dp_rank\": %" PRId64 ", \"instance\": %" PRIu64
        ", \"pp_rank\": %" PRId64 ", \"pp_size\": %" PRId64 ", \"role\": \"%s\", \"shape\": "
        "{\"dtype\": \"%s\", \"head_dim\": %" PRId64 ", \"model_layers\": %" PRId64
        ", \"page_size\": %" PRId64 ", \"total_heads\": %" PRId64 "}, \"tp_rank\": %" PRId64
        ", \"tp_size\": %" PRId64 "}",
        rec->address, rec->cp_rank, cp_size, rec->dp_rank, rec->instance, rec->pp_rank,
        rec->pp_size, rec->role, rec->dtype, rec->head_dim, rec->model_layers, rec->page_size,
        rec->total_heads, rec->tp_rank, rec->tp_size);
    if (n < 0 || (size_t)n >= sizeof pub.key || m < 0 || (size_t)m >= sizeof pub.value) {
        cli_disc_say(err, err_len, "a discovery record is too long");
        return -1;
    }
    pthread_mutex_lock(&d->mu);
    int rc = 0;
    if (d->npubs == CLI_DISC_RECORDS) {
        cli_disc_say(err, err_len, "more than %d ranks to publish in one process",
                     CLI_DISC_RECORDS);
        rc = -1;
    }
    if (rc == 0 && d->lease == 0 && (rc = cli_disc_grant(d, &d->lease, err, err_len)) == 0) {
        if (pthread_create(&d->keeper, NULL, cli_disc_keep, d) == 0)
            d->keeper_on = true;
        else {
            cli_disc_say(err, err_len, "cannot start the lease's thread");
            rc = -1;
        }
    }
    if (rc == 0 && (rc = cli_disc_put(d, pub.key, pub.value, d->lease, err, err_len)) == 0)
        d->pubs[d->npubs++] = pub;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

typedef struct cli_disc_group {
    uint64_t instance;
    int64_t count;
    bool bad;
    char why[256];
    cli_disc_instance_t inst;
    char addr[CLI_SERVE_GROUP_RANKS][64];
    int64_t tp[CLI_SERVE_GROUP_RANKS], pp[CLI_SERVE_GROUP_RANKS];
} cli_disc_group_t;

static void cli_disc_collect(void *ctx, const char *key, const char *value)
{
    cli_disc_group_t *g = ctx;
    const char *end = value + strlen(value);
    int64_t inst = -1, dp = -1, pr = -1, tr = -1, cr = 0;
    cli_disc_instance_t *x = &g->inst;
    char addr[64];
    if (!cli_json_int(value, end, "instance", &inst) || (uint64_t)inst != g->instance ||
        !cli_json_int(value, end, "dp_rank", &dp) || dp != 0)
        return;
    (void)key;
    x->cp_size = 1; /* a record without CP */
    (void)cli_json_int(value, end, "cp_size", &x->cp_size);
    (void)cli_json_int(value, end, "cp_rank", &cr);
    if (!cli_json_int(value, end, "pp_rank", &pr) || !cli_json_int(value, end, "tp_rank", &tr) ||
        !cli_json_int(value, end, "tp_size", &x->tp_size) ||
        !cli_json_int(value, end, "pp_size", &x->pp_size) ||
        !cli_json_str(value, end, "address", addr, sizeof addr) || x->tp_size < 1 ||
        x->pp_size < 1 || x->cp_size < 1 || tr < 0 || tr >= x->tp_size || pr < 0 ||
        pr >= x->pp_size || cr < 0 || cr >= x->cp_size ||
        x->tp_size * x->pp_size > CLI_SERVE_GROUP_RANKS ||
        x->tp_size * x->pp_size * x->cp_size > CLI_SERVE_GROUP_RANKS) {
        g->bad = true;
        snprintf(g->why, sizeof g->why, "a record of it does not parse: %.160s", value);
        return;
    }
    (void)cli_json_int(value, end, "total_heads", &x->total_heads);
    (void)cli_json_int(value, end, "head_dim", &x->head_dim);
    (void)cli_json_int(value, end, "model_layers", &x->model_layers);
    (void)cli_json_int(value, end, "page_size", &x->page_size);
    (void)cli_json_str(value, end, "dtype", x->dtype, sizeof x->dtype);
    const int64_t i = (cr * x->pp_size + pr) * x->tp_size + tr;
    snprintf(g->addr[i], sizeof g->addr[i], "%s", addr);
    g->count++;
}

int cli_disc_wait_instance(cli_disc_t *d, uint64_t k, int64_t timeout_ms,
                           cli_disc_instance_t *out, char *err, size_t err_len)
{
    char prefix[CLI_DISC_KEY_BYTES];
    snprintf(prefix, sizeof prefix, "%sprefill/%" PRIu64 "/0/", d->root, k);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cli_disc_group_t *g = malloc(sizeof *g);
    if (g == NULL) {
        cli_disc_say(err, err_len, "--discovery: out of memory");
        return -1;
    }
    for (;;) {
        memset(g, 0, sizeof *g);
        g->instance = k;
        if (cli_disc_range(d, prefix, cli_disc_collect, g, err, err_len) != 0)
            break;
        const int64_t want = g->inst.tp_size * g->inst.pp_size * g->inst.cp_size;
        if (g->bad) {
            cli_disc_say(err, err_len, "prefill instance %" PRIu64 ": %s", k, g->why);
            break;
        }
        if (want > 0 && g->count == want) {
            /* serve's ports: rank (t, s, c) at PORT + (c * PP + s) * TP + t */
            const char *colon = strrchr(g->addr[0], ':');
            int64_t port = colon != NULL ? strtoll(colon + 1, NULL, 10) : 0;
            bool ok = colon != NULL && port > 0 && (size_t)(colon - g->addr[0]) < sizeof out->ip;
            for (int64_t i = 0; ok && i < want; i++) {
                const char *c = strrchr(g->addr[i], ':');
                ok = c != NULL && c - g->addr[i] == colon - g->addr[0] &&
                     strncmp(g->addr[i], g->addr[0], (size_t)(colon - g->addr[0])) == 0 &&
                     strtoll(c + 1, NULL, 10) == port + i;
            }
            if (!ok) {
                cli_disc_say(err, err_len, "prefill instance %" PRIu64 ": its ranks are at %s "
                             "... which are not one address with ports PORT + (c*PP + s)*TP + "
                             "t, as a serve prefill's: give the decode --prefill-instance "
                             "flags", k, g->addr[0]);
                break;
            }
            *out = g->inst;
            memcpy(out->ip, g->addr[0], (size_t)(colon - g->addr[0]));
            out->ip[colon - g->addr[0]] = '\0';
            out->port = (uint16_t)port;
            pthread_mutex_lock(&d->mu);
            if (k < CLI_DISC_INSTANCES)
                d->watch[k] = true;
            pthread_mutex_unlock(&d->mu);
            free(g);
            return 0;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        const int64_t ms = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
                           (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms >= timeout_ms) {
            cli_disc_say(err, err_len, "prefill instance %" PRIu64 ": %" PRId64 " of %" PRId64
                         " ranks published in %s after %" PRId64 " ms: is it running with the "
                         "same --discovery and --discovery-cluster?", k, g->count,
                         want, d->root, ms);
            break;
        }
        const struct timespec pause = {.tv_nsec = 50000000L};
        nanosleep(&pause, NULL);
    }
    free(g);
    return -1;
}

void cli_disc_follow(cli_disc_t *d, kvs_rank_t *rank)
{
    pthread_mutex_lock(&d->mu);
    if (d->nranks < CLI_DISC_RANKS)
        d->ranks[d->nranks++] = rank;
    if (!d->follower_on && pthread_create(&d->follower, NULL, cli_disc_follow_run, d) == 0)
        d->follower_on = true;
    pthread_mutex_unlock(&d->mu);
}

void cli_disc_unfollow(cli_disc_t *d, kvs_rank_t *rank)
{
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < d->nranks; i++) {
        if (d->ranks[i] == rank) {
            d->ranks[i] = d->ranks[--d->nranks];
            break;
        }
    }
    pthread_mutex_unlock(&d->mu);
}

uint64_t cli_disc_lost(cli_disc_t *d)
{
    pthread_mutex_lock(&d->mu);
    const uint64_t n = d->lost;
    pthread_mutex_unlock(&d->mu);
    return n;
}
