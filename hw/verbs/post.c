/*
 * post.c - the verbs fabric's write and send: arguments checked, the key
 * tables pushed to the peer first (mr.c), then queued on the connection's
 * send queue (sq.c).
 *
 * A write becomes one or more work requests: it is cut at max_write_bytes
 * (the port's max_msg_sz), at the local MR's piece boundaries and at the
 * peer's piece boundaries (split registrations, mr.c); only the last request
 * carries the immediate, so it lands after every byte of the write (RC
 * executes a queue pair's requests in order). An operation is all in the
 * send queue or refused (KVS_EAGAIN when it has no room for all its
 * requests).
 */
#include "hw_verbs.h"

#include <stdint.h>

int hw_verbs_check_conn(hw_verbs_fabric_t *f, kvs_conn_t *conn, const char *op)
{
    kvs_conn_t *c = NULL;
    int rc = hw_net_conn_check(&f->connt, conn, op, &c);
    if (rc != KVS_OK)
        return rc;
    switch (c->net.state) {
    case HW_NET_CONN_UP:
    case HW_CONN_ACCEPTING: /* its QP is in RTS already */
    case HW_CONN_RECOVERING:
        return KVS_OK;
    case HW_CONN_RESOLVING:
    case HW_CONN_CONNECTING:
        if (c->recovering) /* a new QP is on its way: the request waits for it */
            return KVS_OK;
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "%s on %s: the connection to %s is "
                               "still being set up", op, f->device_name, c->net.peer);
    default:
        return kvs_fabric_fail(&f->base, KVS_EINVAL, 0, "%s on %s: the connection to %s was "
                               "disconnected", op, f->device_name, c->net.peer);
    }
}

/* Key tables first: a peer must hold them before any later operation. */
static int hw_verbs_ensure_keys(hw_verbs_fabric_t *f, kvs_conn_t *c)
{
    if (c->keys_pushed)
        return KVS_OK;
    int rc = hw_verbs_keys_push_all(f, c);
    if (rc != KVS_OK)
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "connection to %s: this side's key "
                               "tables could not be sent yet (%s): poll, then retry",
                               c->net.peer, kvs_strerror(rc));
    return KVS_OK;
}

int hw_verbs_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                  uint64_t wr_id)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    int rc = hw_verbs_check_conn(f, conn, "send");
    if (rc != KVS_OK)
        return rc;
    if (len_bytes > KVS_CONTROL_MSG_MAX_BYTES || (msg == NULL && len_bytes > 0))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "send on %s: %u bytes (at most %u, and msg "
                               "must not be NULL)", f->device_name, len_bytes,
                               KVS_CONTROL_MSG_MAX_BYTES);
    rc = hw_verbs_ensure_keys(f, conn);
    if (rc != KVS_OK)
        return rc;
    return hw_verbs_post_msg(conn, HW_OP_SEND, 0, msg, len_bytes, wr_id);
}

/* Remote key and bytes left in the remote piece holding raddr; KVS_EREMOTE
 * when a split key is unknown on conn or raddr lies outside it. */
static int hw_verbs_rkey_piece(hw_verbs_fabric_t *f, kvs_conn_t *conn, uint64_t rkey,
                               uint64_t raddr, uint32_t *out_rkey, uint64_t *left)
{
    if ((rkey & HW_VERBS_RKEY_SPLIT) == 0) {
        if (rkey > UINT32_MAX)
            return kvs_fabric_fail(&f->base, KVS_EINVAL, 0, "write on %s: remote key 0x%llx "
                                   "is not one a verbs fabric hands out: pass the key the "
                                   "peer's mr_register returned", conn->net.peer,
                                   (unsigned long long)rkey);
        *out_rkey = (uint32_t)rkey;
        *left = UINT64_MAX;
        return KVS_OK;
    }
    const uint32_t id = (uint32_t)(rkey >> 32) & 0x7fffffffu;
    const hw_rkeys_entry_t *t;
    uint64_t key, off;
    const int rc = hw_rkeys_lookup(&conn->rkeys, id, raddr, &key, &off, left, &t);
    if (rc == KVS_ENOENT)
        return kvs_fabric_fail(&f->base, KVS_EREMOTE, 0, "write on %s: split registration %u "
                               "of the peer is unknown on this connection (deregistered, or "
                               "a key of another peer): use a key the peer sent on this "
                               "connection", conn->net.peer, id);
    if (rc != KVS_OK)
        return kvs_fabric_fail(&f->base, KVS_EREMOTE, 0, "write on %s: remote address 0x%llx "
                               "is outside the peer's registration [0x%llx, +%llu): fix the "
                               "offset", conn->net.peer, (unsigned long long)raddr,
                               (unsigned long long)t->base, (unsigned long long)t->len_bytes);
    *out_rkey = (uint32_t)key;
    return KVS_OK;
}

static uint64_t hw_verbs_min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

int hw_verbs_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    int rc = hw_verbs_check_conn(f, conn, "write");
    if (rc != KVS_OK)
        return rc;
    kvs_conn_t *c = conn;
    kvs_mr_t *mr = NULL;
    rc = hw_net_write_check(&f->mrt, desc, &mr);
    if (rc != KVS_OK)
        return rc;
    rc = hw_verbs_ensure_keys(f, c);
    if (rc != KVS_OK)
        return rc;
    /* Count the requests first: all of them fit, or none is queued. */
    uint32_t n = 0;
    for (uint64_t off = 0; off < desc->len_bytes; n++) {
        uint32_t lkey = 0, rkey = 0;
        uint64_t lleft = 0, rleft = 0;
        hw_verbs_mr_piece(mr, desc->local_addr + off, &lkey, &lleft);
        rc = hw_verbs_rkey_piece(f, c, desc->rkey, desc->remote_addr + off, &rkey, &rleft);
        if (rc != KVS_OK)
            return rc;
        if (n == f->cfg.sq_depth)
            return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: %llu bytes need more "
                                   "than sq_depth %u work requests (pieces of at most %llu "
                                   "bytes): raise sq_depth or write less at once",
                                   f->device_name, (unsigned long long)desc->len_bytes,
                                   f->cfg.sq_depth, (unsigned long long)f->max_write_bytes);
        off += hw_verbs_min64(hw_verbs_min64(desc->len_bytes - off, lleft),
                              hw_verbs_min64(rleft, f->max_write_bytes));
    }
    if (n > hw_verbs_sq_room(c))
        return kvs_fabric_fail(fab, KVS_EAGAIN, 0, "write on %s: the send queue to %s has "
                               "room for %u work requests, this write needs %u: poll "
                               "completions, then retry", f->device_name, c->net.peer,
                               hw_verbs_sq_room(c), n);
    uint32_t first = 0;
    uint64_t off = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t lkey = 0, rkey = 0, i = 0;
        uint64_t lleft = 0, rleft = 0;
        hw_verbs_mr_piece(mr, desc->local_addr + off, &lkey, &lleft);
        (void)hw_verbs_rkey_piece(f, c, desc->rkey, desc->remote_addr + off, &rkey, &rleft);
        const uint64_t len = hw_verbs_min64(hw_verbs_min64(desc->len_bytes - off, lleft),
                                            hw_verbs_min64(rleft, f->max_write_bytes));
        hw_verbs_sqe_t *e = hw_verbs_sq_push(c, &i);
        if (k == 0)
            first = i;
        e->wr_id = desc->wr_id;
        e->kind = HW_OP_WRITE;
        e->last = k + 1 == n;
        e->laddr = desc->local_addr + off;
        e->raddr = desc->remote_addr + off;
        e->len = (uint32_t)len;
        e->lkey = lkey;
        e->rkey = rkey;
        e->opcode = e->last && desc->with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
        e->imm = desc->imm;
        off += len;
    }
    if (hw_verbs_conn_ready(c))
        hw_verbs_sq_post(c, first, n);
    return KVS_OK;
}
