/*
 * conn_table.c - the network fabrics' connection table (see conn_table.h):
 * slots, generations, tokens, the handle check of posts and failing a
 * connection for good. Records refusals on the fabric; makes, closes and
 * reports nothing of a connection itself.
 */
#include "conn_table.h"

#include "net_util.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

void hw_net_conns_init(hw_net_conns_t *t, kvs_fabric_t *fab, const char *name, void *slots,
                       size_t size, uint32_t cap)
{
    assert(size >= sizeof(hw_net_conn_t) && cap <= 0xffffu);
    *t = (hw_net_conns_t){.fab = fab, .name = name, .slots = slots, .size = size, .cap = cap};
    for (uint32_t i = 0; i < cap; i++)
        hw_net_conn(hw_net_conns_at(t, i))->slot = i;
}

kvs_conn_t *hw_net_conn_by_token(const hw_net_conns_t *t, uint32_t token)
{
    const uint32_t slot = token & 0xffffu;
    if (slot >= t->cap)
        return NULL;
    kvs_conn_t *conn = hw_net_conns_at(t, slot);
    const hw_net_conn_t *c = hw_net_conn(conn);
    return c->state != HW_NET_CONN_FREE && hw_net_conn_token(c) == token ? conn : NULL;
}

kvs_conn_t *hw_net_conn_alloc(hw_net_conns_t *t, int state)
{
    for (uint32_t i = 0; i < t->cap; i++) {
        kvs_conn_t *conn = hw_net_conns_at(t, i);
        hw_net_conn_t *c = hw_net_conn(conn);
        if (c->state == HW_NET_CONN_FREE) {
            const uint32_t gen = c->gen + 1;
            memset(conn, 0, t->size);
            *c = (hw_net_conn_t){.slot = i, .gen = gen, .state = state};
            return conn;
        }
    }
    return NULL;
}

int hw_net_conn_peer(hw_net_conns_t *t, const char *peer, kvs_conn_t **out,
                     struct sockaddr_storage *dst)
{
    if (peer == NULL || out == NULL)
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "connect on %s: peer and out must not "
                               "be NULL", t->name);
    char why[KVS_ERROR_MSG_BYTES];
    if (hw_net_parse_peer(peer, dst, why, sizeof why) != KVS_OK)
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "connect on %s: %s", t->name, why);
    return KVS_OK;
}

int hw_net_conn_full(hw_net_conns_t *t)
{
    return kvs_fabric_fail(t->fab, KVS_EFULL, 0, "connect on %s: all %u connections are in "
                           "use: disconnect some or raise max_conns", t->name, t->cap);
}

void hw_net_conn_free(hw_net_conn_t *c)
{
    c->state = HW_NET_CONN_FREE;
}

bool hw_net_conn_vfail(hw_net_conn_t *c, int status, const char *fmt, va_list ap)
{
    if (c->state == HW_NET_CONN_FREE || c->state == HW_NET_CONN_DEAD)
        return false;
    c->state = HW_NET_CONN_DEAD;
    c->dead_status = status;
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    return true;
}

int hw_net_conn_check(const hw_net_conns_t *t, kvs_conn_t *conn, const char *op,
                      kvs_conn_t **out)
{
    *out = hw_net_conns_of(t, conn);
    if (*out == NULL)
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "%s on %s: not a live connection of "
                               "this fabric (disconnected, never made, or another fabric's)",
                               op, t->name);
    const hw_net_conn_t *c = hw_net_conn(*out);
    if (c->state == HW_NET_CONN_DEAD)
        return kvs_fabric_fail(t->fab, KVS_EPEER, 0, "%s on a failed connection: %s; "
                               "disconnect it and connect again", op, c->why);
    return KVS_OK;
}

kvs_completion_t hw_net_conn_down(kvs_conn_t *conn)
{
    hw_net_conn_t *c = hw_net_conn(conn);
    assert(c->state == HW_NET_CONN_DEAD && !c->down_told);
    c->down_told = true;
    kvs_completion_t e = {.kind = KVS_COMPLETION_DISCONNECT,
                          .status = c->dead_status != KVS_OK ? c->dead_status : KVS_EPEER,
                          .conn = conn};
    /* Why, as backend.h asks: the reason it failed with, NUL included. */
    const size_t len = strnlen(c->why, sizeof c->why);
    memcpy(e.msg, c->why, len);
    e.msg[len] = '\0';
    e.len_bytes = (uint32_t)len;
    return e;
}
