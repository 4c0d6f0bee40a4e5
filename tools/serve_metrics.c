/*
 * serve_metrics.c - the metrics endpoint of `kvstage serve` (serve_metrics.h):
 * a listening socket, one thread that accepts a connection at a time, reads
 * its request line, and answers GET /metrics with kvs_rank_metrics of the
 * ranks that joined; anything else gets 404 or 405. Bounded: at most
 * max_ranks ranks, a request head of 4 KiB, a few seconds per connection.
 */
#include "serve_metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define CLI_METRICS_HEAD_BYTES 4096
#define CLI_METRICS_IO_TIMEOUT_S 3
#define CLI_METRICS_POLL_MS 100 /* how soon the thread sees a stop */

struct cli_metrics {
    int fd;
    pthread_t thread;
    atomic_bool stop;
    pthread_mutex_t mu; /* ranks, nranks, text */
    kvs_rank_t **ranks;
    size_t nranks, max_ranks;
    char *text;         /* the last rendering, grown as needed */
    size_t text_cap;
    atomic_uint_fast64_t scrapes;
};

/* Sends all of buf; false when the peer went away or stalled. */
static bool cli_metrics_send(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        const ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        buf += n;
        len -= (size_t)n;
    }
    return true;
}

static void cli_metrics_reply(int fd, const char *status, const char *type, const char *body,
                              size_t len)
{
    char head[256];
    const int n = snprintf(head, sizeof head,
                           "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                           "Connection: close\r\n\r\n",
                           status, type, len);
    if (n > 0 && (size_t)n < sizeof head && cli_metrics_send(fd, head, (size_t)n))
        (void)cli_metrics_send(fd, body, len);
}

/* The Prometheus text of the ranks now joined, into m->text; its length,
 * or -1 (the reason in m->text). Under m->mu. */
static long cli_metrics_render(cli_metrics_t *m)
{
    for (;;) {
        size_t len = 0;
        const int rc = kvs_rank_metrics(m->ranks, m->nranks, m->text, m->text_cap, &len);
        if (rc == KVS_OK)
            return (long)len;
        if (rc != KVS_ERANGE || len + 1 <= m->text_cap)
            break;
        char *bigger = realloc(m->text, len + 1);
        if (bigger == NULL)
            break;
        m->text = bigger;
        m->text_cap = len + 1;
    }
    return -1;
}

static void cli_metrics_answer(cli_metrics_t *m, int fd)
{
    const struct timeval tv = {.tv_sec = CLI_METRICS_IO_TIMEOUT_S};
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char head[CLI_METRICS_HEAD_BYTES + 1];
    size_t got = 0;
    while (got < CLI_METRICS_HEAD_BYTES) {
        const ssize_t n = recv(fd, head + got, CLI_METRICS_HEAD_BYTES - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
        head[got] = '\0';
        if (strstr(head, "\r\n\r\n") != NULL || strstr(head, "\n\n") != NULL)
            break;
    }
    head[got] = '\0';
    static const char plain[] = "text/plain; charset=utf-8";
    if (strncmp(head, "GET ", 4) != 0) {
        static const char msg[] = "only GET /metrics is served here\n";
        cli_metrics_reply(fd, "405 Method Not Allowed", plain, msg, sizeof msg - 1);
        return;
    }
    const char *path = head + 4;
    const size_t plen = strcspn(path, " ?\r\n");
    if (!(plen == 8 && strncmp(path, "/metrics", 8) == 0)) {
        static const char msg[] = "not found: the metrics are at /metrics\n";
        cli_metrics_reply(fd, "404 Not Found", plain, msg, sizeof msg - 1);
        return;
    }
    pthread_mutex_lock(&m->mu);
    const long len = cli_metrics_render(m);
    if (len >= 0) {
        cli_metrics_reply(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", m->text,
                          (size_t)len);
        atomic_fetch_add(&m->scrapes, 1);
    } else {
        static const char msg[] = "kvs_rank_metrics failed: out of memory\n";
        cli_metrics_reply(fd, "500 Internal Server Error", plain, msg, sizeof msg - 1);
    }
    pthread_mutex_unlock(&m->mu);
}

static void *cli_metrics_run(void *arg)
{
    cli_metrics_t *m = arg;
    while (!atomic_load(&m->stop)) {
        struct pollfd p = {.fd = m->fd, .events = POLLIN};
        const int n = poll(&p, 1, CLI_METRICS_POLL_MS);
        if (n <= 0)
            continue;
        const int c = accept(m->fd, NULL, NULL);
        if (c < 0)
            continue;
        cli_metrics_answer(m, c);
        close(c);
    }
    return NULL;
}

int cli_metrics_start(const char *ip, uint16_t port, size_t max_ranks, cli_metrics_t **out,
                      uint16_t *bound_port, char *err, size_t err_len)
{
    *out = NULL;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t slen;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, ip, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        slen = sizeof *v4;
    } else if (inet_pton(AF_INET6, ip, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        slen = sizeof *v6;
    } else {
        snprintf(err, err_len, "--metrics: '%s' is not an IPv4 or IPv6 address", ip);
        return -1;
    }
    cli_metrics_t *m = calloc(1, sizeof *m);
    if (m == NULL || (m->ranks = calloc(max_ranks > 0 ? max_ranks : 1, sizeof *m->ranks)) == NULL) {
        if (m != NULL)
            free(m);
        snprintf(err, err_len, "--metrics: out of memory");
        return -1;
    }
    m->max_ranks = max_ranks;
    m->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (m->fd < 0 || setsockopt(m->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(m->fd, (struct sockaddr *)&ss, slen) != 0 || listen(m->fd, 16) != 0 ||
        getsockname(m->fd, (struct sockaddr *)&ss, &slen) != 0) {
        snprintf(err, err_len, "--metrics %s:%u: cannot listen there (%s): give a local "
                 "address and a free port (0: any)", ip, (unsigned)port, strerror(errno));
        if (m->fd >= 0)
            close(m->fd);
        free(m->ranks);
        free(m);
        return -1;
    }
    *bound_port = ntohs(ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
    atomic_init(&m->stop, false);
    atomic_init(&m->scrapes, 0);
    pthread_mutex_init(&m->mu, NULL);
    if (pthread_create(&m->thread, NULL, cli_metrics_run, m) != 0) {
        snprintf(err, err_len, "--metrics: cannot start its thread: raise the process limits");
        pthread_mutex_destroy(&m->mu);
        close(m->fd);
        free(m->ranks);
        free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void cli_metrics_stop(cli_metrics_t *m)
{
    if (m == NULL)
        return;
    atomic_store(&m->stop, true);
    pthread_join(m->thread, NULL);
    close(m->fd);
    pthread_mutex_destroy(&m->mu);
    free(m->text);
    free(m->ranks);
    free(m);
}

void cli_metrics_add(cli_metrics_t *m, kvs_rank_t *rank)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    if (m->nranks < m->max_ranks)
        m->ranks[m->nranks++] = rank;
    pthread_mutex_unlock(&m->mu);
}

void cli_metrics_remove(cli_metrics_t *m, kvs_rank_t *rank)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->nranks; i++) {
        if (m->ranks[i] == rank) {
            memmove(&m->ranks[i], &m->ranks[i + 1], (m->nranks - i - 1) * sizeof *m->ranks);
            m->nranks--;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

uint64_t cli_metrics_scrapes(cli_metrics_t *m)
{
    return m != NULL ? (uint64_t)atomic_load(&m->scrapes) : 0;
}
