/*
 * conn.c - the ofi fabric's side of its connection table (hw/net/
 * conn_table.h keeps the slots, tokens and reasons): a new connection
 * starts without a socket, failing one closes its socket and counts the
 * death poll reports, freeing one releases its socket and key tables. It
 * calls nothing else of the fabric, so that the bootstrap (boot.c), the
 * registrations (mr.c) and the completions (poll.c) can each fail a
 * connection without calling one another.
 *
 * Invariants: a connection's socket, while it has one, is in the boot
 * wait set, keyed by slot; deaths counts the DEAD connections the user
 * knows and was not told of yet.
 */
#include "hw_ofi.h"

#include <stdarg.h>
#include <unistd.h>

kvs_conn_t *hw_ofi_conn_alloc(hw_ofi_fabric_t *f, hw_ofi_conn_state_t state)
{
    kvs_conn_t *c = hw_net_conn_alloc(&f->connt, (int)state);
    if (c != NULL) {
        c->fab = f;
        c->sock = -1;
    }
    return c;
}

void hw_ofi_conn_sock_close(kvs_conn_t *c)
{
    if (c->sock < 0)
        return;
    (void)hw_net_waitset_remove(&c->fab->boot, c->sock); /* closing removes it too */
    close(c->sock);
    c->sock = -1;
}

void hw_ofi_conn_free(kvs_conn_t *c)
{
    hw_ofi_fabric_t *f = c->fab;
    hw_ofi_conn_sock_close(c);
    hw_rkeys_free(&c->rkeys);
    if (c->net.state == HW_NET_CONN_DEAD && !c->net.down_told && c->net.user_knows)
        f->deaths--;
    hw_net_conn_free(&c->net);
    /* The address stays in the vector: requests still in the provider may
     * name it, and a peer that comes back is inserted again. */
}

void hw_ofi_conn_fail(kvs_conn_t *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const bool failed = hw_net_conn_vfail(&c->net, status, fmt, ap);
    va_end(ap);
    if (!failed)
        return;
    hw_ofi_conn_sock_close(c);
    if (!c->net.user_knows) { /* never handed out: nobody to tell */
        hw_ofi_conn_free(c);
        return;
    }
    c->fab->deaths++;
}
