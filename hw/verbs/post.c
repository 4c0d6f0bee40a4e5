/*
 * post.c - posting on a verbs connection: RDMA WRITE (WITH IMM) and SEND.
 *
 * A write becomes one or more work requests: it is cut at max_write_bytes
 * (the port's max_msg_sz), at the local MR's piece boundaries and at the
 * peer's piece boundaries (split registrations, mr.c); only the last request
 * carries the immediate, so it lands after every byte of the write (RC
 * executes a queue pair's requests in order). Every request is signalled;
 * poll reports one completion per operation, with the first error among its
 * requests.
 *
 * The send queue is a ring in posting order that keeps each request until
 * it is reported: when the QP fails, the requests it flushed are posted
 * again, in order, on the QP that replaces it (conn.c), and requests made
 * meanwhile wait in the ring (QUEUED). An operation is all in the ring or
 * refused (KVS_EAGAIN when the ring has no room for all its requests).
 *
 * Messages are copied into the connection's registered send ring (a byte
 * ring freed in completion order), so the caller's buffer is free when
 * send() returns. Fabric-internal messages go as SEND WITH IMM, the
 * immediate naming their kind.
 */
#include "hw_verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

bool hw_verbs_conn_ready(const kvs_conn_t *c)
{
    return c->qp != NULL && !c->recovering &&
           (c->state == HW_CONN_UP || c->state == HW_CONN_ACCEPTING);
}

int hw_verbs_check_conn(hw_verbs_fabric_t *f, kvs_conn_t *conn, const char *op)
{
    kvs_conn_t *c = hw_verbs_conn_of(f, conn);
    if (c == NULL)
        return kvs_fabric_fail(&f->base, KVS_EINVAL, 0, "%s on %s: not a live connection of "
                               "this fabric (disconnected, or another fabric's)", op,
                               f->device_name);
    switch (c->state) {
    case HW_CONN_UP:
    case HW_CONN_ACCEPTING: /* its QP is in RTS already */
    case HW_CONN_RECOVERING:
        return KVS_OK;
    case HW_CONN_RESOLVING:
    case HW_CONN_CONNECTING:
        if (c->recovering) /* a new QP is on its way: the request waits for it */
            return KVS_OK;
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "%s on %s: the connection to %s is "
                               "still being set up", op, f->device_name, c->peer);
    case HW_CONN_DEAD:
        return kvs_fabric_fail(&f->base, KVS_EPEER, 0, "%s on a failed connection: %s; "
                               "disconnect and connect again", op, c->why);
    default:
        return kvs_fabric_fail(&f->base, KVS_EINVAL, 0, "%s on %s: the connection to %s was "
                               "disconnected", op, f->device_name, c->peer);
    }
}

uint64_t hw_verbs_sq_wr_id(const kvs_conn_t *c, uint32_t i)
{
    return (uint64_t)(c->gen & 0xffffu) << 32 | (uint64_t)c->slot << 16 | i;
}

static uint32_t hw_verbs_sq_room(const kvs_conn_t *c) { return c->fab->cfg.sq_depth - c->sq_used; }

hw_verbs_sqe_t *hw_verbs_sq_push(kvs_conn_t *c, uint32_t *index)
{
    const uint32_t depth = c->fab->cfg.sq_depth;
    const uint32_t i = (c->sq_head + c->sq_used) % depth;
    c->sq_used++;
    c->sq[i] = (hw_verbs_sqe_t){.state = HW_SQE_QUEUED};
    *index = i;
    return &c->sq[i];
}

/* Posts ring entries [first, first + count) that are QUEUED or REPOST, in
 * one chain. A refusal by the QP breaks the connection: those entries go
 * again on the next QP. */
void hw_verbs_sq_post(kvs_conn_t *c, uint32_t first, uint32_t count)
{
    hw_verbs_fabric_t *f = c->fab;
    const uint32_t depth = f->cfg.sq_depth;
    uint32_t n = 0;
    for (uint32_t k = 0; k < count; k++) {
        const uint32_t i = (first + k) % depth;
        hw_verbs_sqe_t *e = &c->sq[i];
        if (e->state != HW_SQE_QUEUED && e->state != HW_SQE_REPOST)
            continue;
        f->sges[n] = (struct ibv_sge){.addr = e->laddr, .length = e->len, .lkey = e->lkey};
        f->wrs[n] = (struct ibv_send_wr){
            .wr_id = hw_verbs_sq_wr_id(c, i),
            .sg_list = e->len > 0 ? &f->sges[n] : NULL,
            .num_sge = e->len > 0 ? 1 : 0,
            .opcode = (enum ibv_wr_opcode)e->opcode,
            .send_flags = IBV_SEND_SIGNALED,
        };
        if (e->opcode == IBV_WR_RDMA_WRITE || e->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
            f->wrs[n].wr.rdma.remote_addr = e->raddr;
            f->wrs[n].wr.rdma.rkey = e->rkey;
        }
        if (e->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || e->opcode == IBV_WR_SEND_WITH_IMM)
            f->wrs[n].imm_data = htonl(e->imm);
        if (e->opcode == IBV_WR_BIND_MW) {
            /* the provider finds the window by the key it has now (mw->rkey)
             * and gives it the new one (bind_mw.rkey) */
            kvs_grant_t *g = e->grant;
            g->mw->rkey = g->mw_rkey;
            f->wrs[n].bind_mw.mw = g->mw;
            f->wrs[n].bind_mw.rkey = g->rkey;
            f->wrs[n].bind_mw.bind_info = (struct ibv_mw_bind_info){
                .mr = g->piece, .addr = g->addr, .length = g->len_bytes,
                .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};
        }
        if (e->opcode == IBV_WR_LOCAL_INV)
            f->wrs[n].invalidate_rkey = e->rkey;
        if (n > 0)
            f->wrs[n - 1].next = &f->wrs[n];
        n++;
    }
    if (n == 0)
        return;
    struct ibv_send_wr *bad = NULL;
    const int rc = ibv_post_send(c->qp, &f->wrs[0], &bad);
    uint32_t posted = n;
    if (rc != 0) {
        posted = 0;
        while (posted < n && &f->wrs[posted] != bad)
            posted++;
    }
    for (uint32_t k = 0; k < posted; k++)
        c->sq[f->wrs[k].wr_id & 0xffffu].state = HW_SQE_POSTED;
    c->sq_posted += posted;
    if (rc != 0) {
        for (uint32_t k = posted; k < n; k++)
            c->sq[f->wrs[k].wr_id & 0xffffu].state = HW_SQE_REPOST;
        hw_verbs_conn_broken(c, KVS_EPEER, "connection to %s: the queue pair refused a post "
                             "(%s)", c->peer, strerror(rc));
    }
}

void hw_verbs_sq_flush(kvs_conn_t *c)
{
    /* the scratch chain holds at most sq_depth requests: the whole ring */
    hw_verbs_sq_post(c, c->sq_head, c->sq_used);
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
                               c->peer, kvs_strerror(rc));
    return KVS_OK;
}

/* Reserves len bytes of the send ring; *pos, *bytes (with any tail skipped
 * to stay contiguous). False when they do not fit now. */
static bool hw_verbs_ring_take(kvs_conn_t *c, uint32_t len, uint32_t *pos, uint32_t *bytes)
{
    const uint32_t cap = c->fab->cfg.send_buf_bytes;
    if (c->s_used == 0)
        c->s_head = c->s_tail = 0;
    if (c->s_used == 0 || c->s_head > c->s_tail) {
        if (cap - c->s_head >= len) {
            *pos = c->s_head;
            *bytes = len;
        } else if (c->s_tail >= len) { /* wrap: skip the end */
            *pos = 0;
            *bytes = cap - c->s_head + len;
        } else {
            return false;
        }
    } else if (c->s_tail - c->s_head >= len) {
        *pos = c->s_head;
        *bytes = len;
    } else {
        return false;
    }
    c->s_head = *pos + len;
    c->s_used += *bytes;
    return true;
}

/* One SEND (WITH IMM when internal) of msg. */
static int hw_verbs_post_msg(kvs_conn_t *c, hw_verbs_op_kind_t kind, uint32_t imm,
                             const void *msg, uint32_t len, uint64_t wr_id)
{
    hw_verbs_fabric_t *f = c->fab;
    if (hw_verbs_sq_room(c) == 0)
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "send to %s: %u work requests in "
                               "flight fill the send queue: poll completions first, or raise "
                               "sq_depth", c->peer, f->cfg.sq_depth);
    uint32_t pos = 0, bytes = 0;
    if (len > 0 && !hw_verbs_ring_take(c, len, &pos, &bytes))
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "send to %s: %u bytes of control "
                               "messages in flight fill the send buffer: poll completions "
                               "first, or raise send_buf_bytes", c->peer, c->s_used);
    if (len > 0)
        memcpy(c->sbuf + pos, msg, len);
    uint32_t i;
    hw_verbs_sqe_t *e = hw_verbs_sq_push(c, &i);
    e->wr_id = wr_id;
    e->kind = (uint8_t)kind;
    e->last = true;
    e->laddr = (uintptr_t)(c->sbuf + pos);
    e->len = len;
    e->lkey = c->smr->lkey;
    e->send_bytes = bytes;
    e->send_end = c->s_head;
    e->opcode = kind == HW_OP_INTERNAL ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
    e->imm = imm;
    if (hw_verbs_conn_ready(c))
        hw_verbs_sq_post(c, i, 1);
    return KVS_OK;
}

int hw_verbs_send_internal(kvs_conn_t *c, uint32_t kind, const void *msg, uint32_t len)
{
    return hw_verbs_post_msg(c, HW_OP_INTERNAL, kind, msg, len, 0);
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
                                   "peer's mr_register returned", conn->peer,
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
                               "connection", conn->peer, id);
    if (rc != KVS_OK)
        return kvs_fabric_fail(&f->base, KVS_EREMOTE, 0, "write on %s: remote address 0x%llx "
                               "is outside the peer's registration [0x%llx, +%llu): fix the "
                               "offset", conn->peer, (unsigned long long)raddr,
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
    if (desc == NULL || desc->len_bytes == 0)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: %s", f->device_name,
                               desc == NULL ? "desc is NULL" : "len_bytes is 0");
    const kvs_mr_t *mr = hw_verbs_mr_of(f, desc->local_mr);
    if (mr == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: local_mr is not a live "
                               "registration of this fabric", f->device_name);
    if (desc->local_addr < mr->addr || desc->len_bytes > mr->len_bytes ||
        desc->local_addr - mr->addr > mr->len_bytes - desc->len_bytes)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: source [0x%llx, +%llu) is "
                               "outside its registration [0x%llx, +%llu)", f->device_name,
                               (unsigned long long)desc->local_addr,
                               (unsigned long long)desc->len_bytes,
                               (unsigned long long)mr->addr, (unsigned long long)mr->len_bytes);
    if (desc->remote_addr + desc->len_bytes < desc->remote_addr)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: the remote range wraps",
                               f->device_name);
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
                               "completions, then retry", f->device_name, c->peer,
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
