/*
 * conn.c - the ofi fabric's connection table: the slots, their tokens,
 * failing a connection with its reason and freeing it. It calls nothing
 * else of the fabric, so that the bootstrap (boot.c), the registrations
 * (mr.c) and the completions (poll.c) can each fail a connection without
 * calling one another.
 *
 * Invariants: a slot is FREE or holds one connection; tokens carry the
 * slot's generation, so nothing addressed to an earlier use of a slot is
 * taken by a later one; a connection's socket, while it has one, is in
 * boot_fd, keyed by slot.
 */
#include "hw_ofi.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <unistd.h>

kvs_conn_t *hw_ofi_conn_by_token(hw_ofi_fabric_t *f, uint32_t token)
{
    const uint32_t slot = token & 0xffffu;
    if (slot >= f->cfg.max_conns)
        return NULL;
    kvs_conn_t *c = &f->conns[slot];
    return c->state != HW_OFI_CONN_FREE && hw_ofi_token(c) == token ? c : NULL;
}

kvs_conn_t *hw_ofi_conn_alloc(hw_ofi_fabric_t *f)
{
    for (uint32_t i = 0; i < f->cfg.max_conns; i++) {
        kvs_conn_t *c = &f->conns[i];
        if (c->state == HW_OFI_CONN_FREE) {
            const uint32_t gen = c->gen + 1;
            *c = (kvs_conn_t){.fab = f, .slot = i, .gen = gen, .sock = -1};
            return c;
        }
    }
    return NULL;
}

void hw_ofi_conn_sock_close(kvs_conn_t *c)
{
    if (c->sock < 0)
        return;
    (void)epoll_ctl(c->fab->boot_fd, EPOLL_CTL_DEL, c->sock, NULL);
    close(c->sock);
    c->sock = -1;
}

void hw_ofi_conn_free(kvs_conn_t *c)
{
    hw_ofi_fabric_t *f = c->fab;
    hw_ofi_conn_sock_close(c);
    hw_rkeys_free(&c->rkeys);
    if (c->state == HW_OFI_CONN_DEAD && !c->down_told && c->user_knows)
        f->deaths--;
    c->state = HW_OFI_CONN_FREE;
    /* The address stays in the vector: requests still in the provider may
     * name it, and a peer that comes back is inserted again. */
}

void hw_ofi_conn_fail(kvs_conn_t *c, int status, const char *fmt, ...)
{
    if (c->state == HW_OFI_CONN_DEAD || c->state == HW_OFI_CONN_FREE)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    hw_ofi_conn_sock_close(c);
    if (!c->user_knows) { /* never handed out: nobody to tell */
        hw_ofi_conn_free(c);
        return;
    }
    c->state = HW_OFI_CONN_DEAD;
    c->dead_status = status;
    c->fab->deaths++;
}
