/*
 * net_util.c - the network fabrics' shared helpers (see net_util.h).
 */
#define _DEFAULT_SOURCE

#include "net_util.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

uint64_t hw_net_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int hw_net_random_bytes(kvs_fabric_t *fab, void *buf, size_t len_bytes)
{
    (void)fab;
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len_bytes) {
        const ssize_t n = getrandom(p + got, len_bytes - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return KVS_EBACKEND;
        got += (size_t)n;
    }
    return KVS_OK;
}

int hw_net_peer_text(const char *peer, char *buf, size_t bytes)
{
    if (peer[0] == 0)
        return KVS_ENOENT;
    snprintf(buf, bytes, "%s", peer);
    return KVS_OK;
}

int hw_net_nonblock(int fd)
{
    const int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int hw_net_parse_peer(const char *peer, struct sockaddr_storage *out, char *why,
                      size_t why_bytes)
{
    char host[256];
    const char *colon = strrchr(peer, ':');
    size_t hlen = colon != NULL ? (size_t)(colon - peer) : 0;
    if (colon == NULL || hlen == 0 || hlen >= sizeof host || colon[1] == '\0') {
        snprintf(why, why_bytes, "peer '%s' is not HOST:PORT (IPv6 as [ADDR]:PORT)", peer);
        return KVS_EINVAL;
    }
    const char *h = peer;
    if (peer[0] == '[' && colon[-1] == ']') {
        h = peer + 1;
        hlen -= 2;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(why, why_bytes, "peer '%.100s' cannot be resolved (%s): pass an IP address "
                 "and a port number", peer, gai_strerror(rc));
        return KVS_EINVAL;
    }
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return KVS_OK;
}

int hw_net_bind_sockaddr(const char *ip, uint16_t port, struct sockaddr_storage *out)
{
    char serv[8];
    snprintf(serv, sizeof serv, "%u", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res = NULL;
    if (getaddrinfo(ip, serv, &hints, &res) != 0 || res == NULL)
        return KVS_EINVAL;
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return KVS_OK;
}
