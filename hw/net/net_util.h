/*
 * net_util.h - what the network fabrics (hw/verbs, hw/ofi) share that is
 * not RDMA: little-endian field codecs for their internal messages, the
 * clock, non-blocking fds and parsing of "HOST:PORT" peers (their log lines
 * go through the public kvs_log_write).
 *
 * Pure helpers: no state, no allocation that outlives a call.
 */
#ifndef KVS_HW_NET_UTIL_H
#define KVS_HW_NET_UTIL_H

#include <kvstage/backend.h>
#include <kvstage/kvstage.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

static inline void hw_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void hw_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t hw_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t hw_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* CLOCK_MONOTONIC in nanoseconds: the fabrics' now_ns. */
uint64_t hw_net_now_ns(void);
/* len_bytes from the kernel's generator (getrandom(2)): the fabrics'
 * random_bytes slot. KVS_EBACKEND if it fails. */
int hw_net_random_bytes(kvs_fabric_t *fab, void *buf, size_t len_bytes);
/* Copies a connection's "IP:port" into buf: the fabrics' peer_addr. */
int hw_net_peer_text(const char *peer, char *buf, size_t bytes);

/* Sets O_NONBLOCK on fd; 0 or -1 with errno. */
int hw_net_nonblock(int fd);

/* "IPv4:port", "[IPv6]:port" or "host:port" into *out. KVS_EINVAL with
 * `why` saying what to change when it is none of them or does not
 * resolve. */
int hw_net_parse_peer(const char *peer, struct sockaddr_storage *out, char *why,
                      size_t why_bytes);

/* A numeric IP address and port into *out (AI_PASSIVE: NULL ip is any
 * address); KVS_EINVAL when ip is not an IP address. */
int hw_net_bind_sockaddr(const char *ip, uint16_t port, struct sockaddr_storage *out);

#endif
