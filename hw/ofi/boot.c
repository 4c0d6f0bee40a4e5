/*
 * boot.c - the ofi fabric's connections: a TCP bootstrap that stands in
 * for rdma_cm, because an RDM endpoint has addresses but no connections.
 *
 * Each fabric listens on a TCP port (bind_addr:listen_port). connect()
 * opens a socket to the peer's listener and sends HELLO (magic, version,
 * provider, this side's connection token, its endpoint address from
 * fi_getname); the peer, inside its poll or connect, accepts, reads it,
 * checks the provider, inserts the address into its address vector and
 * answers with its own HELLO (or a refusal whose text says why: another
 * provider, no free connection). Both then send over the endpoint only,
 * stamping each message with the receiver's token. Each side pushes its
 * registrations' keys (mr.c) before anything else on the connection.
 *
 * The socket stays open and silent: its end is how a side learns that its
 * peer is gone. A disconnect sends BYE over the endpoint (in order after
 * the messages before it) and closes the socket; the peer fails the
 * connection at the BYE, or HW_OFI_GRACE_NS after the socket ended when no
 * BYE comes (a crash), so messages already on their way are still taken.
 *
 * The slots themselves and their tokens are hw/net/conn_table.h's; what
 * failing and freeing a connection mean here, conn.c's.
 *
 * Invariants: sockets of HELLO and UP connections are in the boot wait set
 * (hw/net/waitset.h), keyed by slot (the listener by UINT64_MAX).
 */
#define _GNU_SOURCE /* accept4 */

#include "hw_ofi.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HW_OFI_LISTENER_KEY UINT64_MAX

static void hw_ofi_sockaddr_text(const struct sockaddr_storage *ss, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    uint16_t port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(buf, len, "%s:%u", ip, port);
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)(const void *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(buf, len, "[%s]:%u", ip, port);
    }
}

int hw_ofi_listen(hw_ofi_fabric_t *f, char *why, size_t why_bytes)
{
    struct sockaddr_storage sa;
    const char *ip = f->cfg.bind_addr != NULL ? f->cfg.bind_addr : "0.0.0.0";
    if (hw_net_bind_sockaddr(ip, f->cfg.listen_port, &sa) != KVS_OK) {
        snprintf(why, why_bytes, "bind_addr '%s' is not an IP address: give one of this "
                 "host's addresses", ip);
        return KVS_EINVAL;
    }
    const socklen_t salen = sa.ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                                    : sizeof(struct sockaddr_in6);
    f->listen_fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (f->listen_fd < 0 ||
        setsockopt(f->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(f->listen_fd, (struct sockaddr *)&sa, salen) != 0 ||
        listen(f->listen_fd, 64) != 0 ||
        getsockname(f->listen_fd, (struct sockaddr *)&sa, &(socklen_t){sizeof sa}) != 0) {
        const int e = errno;
        snprintf(why, why_bytes, "bootstrap listener on %s port %u: %s%s", ip,
                 f->cfg.listen_port, strerror(e),
                 e == EADDRINUSE ? ": another process uses that port; pick another "
                                   "listen_port (or 0 for any)"
                 : e == EADDRNOTAVAIL ? ": bind_addr is not an address of this host" : "");
        return KVS_EINVAL;
    }
    if (hw_net_waitset_add(&f->boot, f->listen_fd, HW_OFI_LISTENER_KEY, HW_NET_WAIT_IN) !=
        KVS_OK) {
        snprintf(why, why_bytes, "bootstrap listener on %s port %u: %s", ip,
                 f->cfg.listen_port, f->base.last_backend_msg);
        return KVS_EBACKEND;
    }
    hw_ofi_sockaddr_text(&sa, f->address, sizeof f->address);
    return KVS_OK;
}

/* Our HELLO for conn c (status 0), or a refusal with reason text. */
static void hw_ofi_hello_make(hw_ofi_fabric_t *f, uint8_t *h, uint32_t status, uint32_t token,
                              const char *reason)
{
    memset(h, 0, HW_OFI_HELLO_BYTES);
    hw_put32(h, HW_OFI_HELLO_MAGIC);
    hw_put32(h + 4, HW_OFI_WIRE_VERSION);
    hw_put32(h + 8, status);
    hw_put32(h + 12, token);
    snprintf((char *)h + 20, HW_OFI_PROV_BYTES, "%s", f->info->fabric_attr->prov_name);
    if (status != 0) {
        const size_t n = strnlen(reason, HW_OFI_NAME_MAX - 1);
        memcpy(h + 20 + HW_OFI_PROV_BYTES, reason, n);
        hw_put32(h + 16, (uint32_t)n);
    } else {
        memcpy(h + 20 + HW_OFI_PROV_BYTES, f->ep_name, f->ep_name_len);
        hw_put32(h + 16, (uint32_t)f->ep_name_len);
    }
}

/* Checks a peer's HELLO and inserts its address; KVS_OK, or a status with
 * `why` (which the passive side sends back as its refusal). */
static int hw_ofi_hello_take(kvs_conn_t *c, const uint8_t *h, char *why, size_t why_bytes)
{
    hw_ofi_fabric_t *f = c->fab;
    const uint32_t len = hw_get32(h + 16);
    char prov[HW_OFI_PROV_BYTES + 1] = {0};
    memcpy(prov, h + 20, HW_OFI_PROV_BYTES);
    if (hw_get32(h) != HW_OFI_HELLO_MAGIC || len > HW_OFI_NAME_MAX) {
        snprintf(why, why_bytes, "%s is not a kvstage ofi fabric's bootstrap port: give the "
                 "address the peer's fabric listens on", c->net.peer);
        return KVS_EPROTO;
    }
    if (hw_get32(h + 4) != HW_OFI_WIRE_VERSION) {
        snprintf(why, why_bytes, "%s speaks bootstrap version %u, this side %u: run the same "
                 "kvstage on both", c->net.peer, hw_get32(h + 4), HW_OFI_WIRE_VERSION);
        return KVS_EFINGERPRINT;
    }
    if (hw_get32(h + 8) != 0) {
        snprintf(why, why_bytes, "%s refused the connection: %.*s", c->net.peer, (int)len,
                 (const char *)h + 20 + HW_OFI_PROV_BYTES);
        return KVS_EPEER;
    }
    if (strcmp(prov, f->info->fabric_attr->prov_name) != 0) {
        snprintf(why, why_bytes, "%s runs provider %s, this side %s: give both the same "
                 "provider", c->net.peer, prov, f->info->fabric_attr->prov_name);
        return KVS_EINVAL;
    }
    c->peer_token = hw_get32(h + 12);
    int rc = fi_av_insert(f->av, h + 20 + HW_OFI_PROV_BYTES, 1, &c->peer_addr, 0, NULL);
    if (rc != 1) {
        snprintf(why, why_bytes, "inserting the endpoint address of %s into the address "
                 "vector failed: %s", c->net.peer, f->lib.strerror(rc < 0 ? -rc : FI_EINVAL));
        return KVS_EBACKEND;
    }
    c->in_av = true;
    return KVS_OK;
}

/* Writes all of buf, waiting at most until deadline_ns. */
static int hw_ofi_sock_write(int fd, const uint8_t *buf, size_t len, uint64_t deadline_ns)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -errno;
        const uint64_t now = hw_net_now_ns();
        if (now >= deadline_ns)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        (void)poll(&p, 1, hw_net_ms_until(now, deadline_ns, INT_MAX));
    }
    return 0;
}

/* Watches c's socket in the boot set, keyed by its slot: KVS_OK, else
 * KVS_EBACKEND with the reason recorded on the fabric. */
static int hw_ofi_sock_watch(kvs_conn_t *c)
{
    return hw_net_waitset_add(&c->fab->boot, c->sock, c->net.slot,
                              HW_NET_WAIT_IN | HW_NET_WAIT_HUP);
}

/* The connection is up: keys first, before any message of the user. */
static void hw_ofi_conn_up(kvs_conn_t *c)
{
    c->net.state = HW_NET_CONN_UP;
    int rc = hw_ofi_keys_push_all(c);
    if (rc != KVS_OK)
        hw_ofi_conn_fail(c, rc, "sending this side's registration keys to %s failed: %s",
                         c->net.peer, c->fab->base.last_backend_msg);
}

static void hw_ofi_accept(hw_ofi_fabric_t *f)
{
    for (int k = 0; k < 16; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(f->listen_fd, (struct sockaddr *)&ss, &sl,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        kvs_conn_t *c = hw_ofi_conn_alloc(f, HW_OFI_CONN_HELLO);
        if (c == NULL) {
            uint8_t h[HW_OFI_HELLO_BYTES];
            char reason[HW_OFI_NAME_MAX];
            snprintf(reason, sizeof reason, "all %u connections of %s are in use: raise its "
                     "max_conns", f->cfg.max_conns, f->address);
            hw_ofi_hello_make(f, h, 1, 0, reason);
            (void)hw_ofi_sock_write(fd, h, sizeof h, hw_net_now_ns() + 100000000u);
            close(fd);
            continue;
        }
        c->sock = fd;
        hw_ofi_sockaddr_text(&ss, c->net.peer, sizeof c->net.peer);
        if (hw_ofi_sock_watch(c) != KVS_OK) {
            kvs_log_write(&f->cfg.log, KVS_LOG_WARN, "ofi fabric %s: connection from %s "
                          "refused: %s", f->address, c->net.peer, f->base.last_backend_msg);
            hw_ofi_conn_free(c);
        }
    }
}

/* A passive connection's socket is readable: more of the HELLO. */
static void hw_ofi_hello_read(kvs_conn_t *c)
{
    hw_ofi_fabric_t *f = c->fab;
    ssize_t n = recv(c->sock, c->hello + c->hello_got, HW_OFI_HELLO_BYTES - c->hello_got,
                     MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        hw_ofi_conn_free(c); /* gave up before its HELLO: nothing to tell */
        return;
    }
    if (n < 0)
        return;
    c->hello_got += (uint32_t)n;
    if (c->hello_got < HW_OFI_HELLO_BYTES)
        return;
    char why[HW_OFI_WHY_BYTES];
    uint8_t h[HW_OFI_HELLO_BYTES];
    int rc = hw_ofi_hello_take(c, c->hello, why, sizeof why);
    hw_ofi_hello_make(f, h, rc == KVS_OK ? 0 : 1, hw_net_conn_token(&c->net), why);
    const uint64_t deadline = hw_net_deadline_ns(hw_net_now_ns(), f->cfg.connect_timeout_ms);
    if (hw_ofi_sock_write(c->sock, h, sizeof h, deadline) != 0 || rc != KVS_OK) {
        kvs_log_write(&f->cfg.log, KVS_LOG_WARN, "ofi fabric %s: connection from %s refused: %s",
                   f->address, c->net.peer, rc != KVS_OK ? why : "its socket failed");
        hw_ofi_conn_free(c);
        return;
    }
    hw_ofi_conn_up(c);
}

/* An up connection's socket is readable: it ended (or carries bytes it
 * should not, which end it too). */
static void hw_ofi_sock_event(kvs_conn_t *c, uint32_t events)
{
    uint8_t junk[64];
    ssize_t n = recv(c->sock, junk, sizeof junk, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) &&
        (events & HW_NET_WAIT_HUP) == 0)
        return;
    const char *what = n == 0 ? "closed its end" : n > 0 ? "sent bytes on the bootstrap socket"
                                                         : strerror(errno);
    hw_ofi_conn_sock_close(c);
    if (c->net.state != HW_NET_CONN_UP || c->peer_gone)
        return;
    c->peer_gone = true;
    c->gone_ns = hw_net_now_ns() + HW_OFI_GRACE_NS;
    snprintf(c->net.why, sizeof c->net.why, "the peer %s went away (its bootstrap socket %s)",
             c->net.peer, what);
}

void hw_ofi_boot_progress(hw_ofi_fabric_t *f)
{
    hw_net_ready_t ready[16];
    const int n = hw_net_waitset_drain(&f->boot, ready, 16); /* a failure: recorded, no events */
    for (int i = 0; i < n; i++) {
        if (ready[i].key == HW_OFI_LISTENER_KEY) {
            hw_ofi_accept(f);
            continue;
        }
        kvs_conn_t *c = &f->conns[ready[i].key];
        if (c->net.state == HW_OFI_CONN_HELLO)
            hw_ofi_hello_read(c);
        else if (c->net.state == HW_NET_CONN_UP && c->sock >= 0)
            hw_ofi_sock_event(c, ready[i].events);
    }
}

void hw_ofi_conn_tick(hw_ofi_fabric_t *f, uint64_t now)
{
    for (uint32_t i = 0; i < f->cfg.max_conns; i++) {
        kvs_conn_t *c = &f->conns[i];
        if (c->net.state == HW_NET_CONN_UP && c->peer_gone && now >= c->gone_ns) {
            char why[HW_NET_WHY_BYTES];
            snprintf(why, sizeof why, "%s", c->net.why);
            hw_ofi_conn_fail(c, KVS_EPEER, "%s", why);
        }
    }
}

/* Opens the socket and waits for the peer's HELLO; KVS_OK with c UP. */
static int hw_ofi_dial(kvs_conn_t *c, const struct sockaddr_storage *dst, uint64_t deadline,
                       char *why, size_t why_bytes)
{
    hw_ofi_fabric_t *f = c->fab;
    const socklen_t dl = dst->ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                                   : sizeof(struct sockaddr_in6);
    c->sock = socket(dst->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->sock < 0) {
        snprintf(why, why_bytes, "socket: %s", strerror(errno));
        return KVS_EBACKEND;
    }
    const int one = 1;
    (void)setsockopt(c->sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(c->sock, (const struct sockaddr *)dst, dl);
    if (rc != 0 && errno != EINPROGRESS) {
        snprintf(why, why_bytes, "%s: %s: start the peer's fabric first", c->net.peer,
                 strerror(errno));
        return errno == ECONNREFUSED ? KVS_EPEER : KVS_EBACKEND;
    }
    uint8_t h[HW_OFI_HELLO_BYTES];
    hw_ofi_hello_make(f, h, 0, hw_net_conn_token(&c->net), "");
    uint32_t got = 0;
    bool sent = false;
    for (;;) {
        const uint64_t now = hw_net_now_ns();
        if (now >= deadline) {
            snprintf(why, why_bytes, "%s did not answer within %u ms: is its fabric running "
                     "and polled, on this provider?", c->net.peer, f->cfg.connect_timeout_ms);
            return KVS_ETIMEDOUT;
        }
        struct pollfd p[2] = {{.fd = c->sock, .events = sent ? POLLIN : POLLOUT},
                              {.fd = f->boot.fd, .events = POLLIN}};
        (void)poll(p, 2, hw_net_ms_until(now, deadline, 100));
        if (p[1].revents & POLLIN) /* peers connecting to us meanwhile */
            hw_ofi_boot_progress(f);
        if (!sent && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
            int e = 0;
            (void)getsockopt(c->sock, SOL_SOCKET, SO_ERROR, &e, &(socklen_t){sizeof e});
            if (e != 0) {
                snprintf(why, why_bytes, "%s: %s: start the peer's fabric first (or check "
                         "the address)", c->net.peer, strerror(e));
                return e == ECONNREFUSED ? KVS_EPEER : KVS_EBACKEND;
            }
            if ((rc = hw_ofi_sock_write(c->sock, h, sizeof h, deadline)) != 0) {
                snprintf(why, why_bytes, "sending HELLO to %s: %s", c->net.peer, strerror(-rc));
                return KVS_EPEER;
            }
            sent = true;
        } else if (sent && (p[0].revents & (POLLIN | POLLERR | POLLHUP))) {
            ssize_t n = recv(c->sock, c->hello + got, HW_OFI_HELLO_BYTES - got, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                snprintf(why, why_bytes, "%s closed the bootstrap connection before "
                         "answering: is it a kvstage ofi fabric?", c->net.peer);
                return KVS_EPEER;
            }
            if (n > 0 && (got += (uint32_t)n) == HW_OFI_HELLO_BYTES)
                break;
        }
    }
    if ((rc = hw_ofi_hello_take(c, c->hello, why, why_bytes)) != KVS_OK)
        return rc;
    if (hw_ofi_sock_watch(c) != KVS_OK) { /* the wait set's reason, cut to fit */
        const size_t len = strnlen(f->base.last_backend_msg, why_bytes - 1);
        memcpy(why, f->base.last_backend_msg, len);
        why[len] = '\0';
        return KVS_EBACKEND;
    }
    return KVS_OK;
}

int hw_ofi_connect(kvs_fabric_t *fab, const char *peer, kvs_conn_t **out)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    struct sockaddr_storage dst;
    int rc = hw_net_conn_peer(&f->connt, peer, out, &dst);
    if (rc != KVS_OK)
        return rc;
    char why[HW_OFI_WHY_BYTES];
    kvs_conn_t *c = hw_ofi_conn_alloc(f, HW_OFI_CONN_CONNECTING);
    if (c == NULL)
        return hw_net_conn_full(&f->connt);
    c->net.active = true;
    snprintf(c->net.peer, sizeof c->net.peer, "%s", peer);
    const uint64_t deadline = hw_net_deadline_ns(hw_net_now_ns(), f->cfg.connect_timeout_ms);
    rc = hw_ofi_dial(c, &dst, deadline, why, sizeof why);
    if (rc != KVS_OK) {
        hw_ofi_conn_free(c);
        return kvs_fabric_fail(fab, rc, 0, "connect on %s: %s", f->name, why);
    }
    c->net.user_knows = true;
    hw_ofi_conn_up(c);
    if (c->net.state != HW_NET_CONN_UP) {
        snprintf(why, sizeof why, "%s", c->net.why);
        c->net.down_told = true;
        f->deaths--;
        hw_ofi_conn_free(c);
        return kvs_fabric_fail(fab, KVS_EPEER, 0, "connect on %s: %s", f->name, why);
    }
    *out = c;
    return KVS_OK;
}

void hw_ofi_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    kvs_conn_t *c = hw_net_conns_of(&f->connt, conn);
    if (c == NULL)
        return;
    if (c->net.state == HW_NET_CONN_UP && !c->peer_gone)
        (void)hw_ofi_send_internal(c, HW_OFI_MSG_BYE, NULL, 0);
    /* Its requests still in the provider complete into nothing: their
     * operations name this slot's old generation. */
    hw_ofi_conn_free(c);
}
