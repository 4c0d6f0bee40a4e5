/*
 * sq.c - a verbs connection's send queue: a ring in posting order that
 * keeps each request until it is reported, and the copy of every message
 * in the connection's registered send buffer.
 *
 * Every request is signalled; poll reports one completion per operation,
 * with the first error among its requests. When the QP fails, the requests
 * it flushed are posted again, in order, on the QP that replaces it
 * (conn.c), and requests made meanwhile wait in the ring (QUEUED).
 *
 * Messages are copied into the send buffer (a byte ring freed in
 * completion order), so the caller's buffer is free when send() returns.
 * Fabric-internal messages (KEYS, DROP, BYE) go as SEND WITH IMM, the
 * immediate naming their kind. It calls nothing of the fabric but failing a
 * connection (conn_fail.c), so that every file above can queue on it.
 */
#include "hw_verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

bool hw_verbs_conn_ready(const kvs_conn_t *c)
{
    return c->qp != NULL && !c->recovering &&
           (c->net.state == HW_NET_CONN_UP || c->net.state == HW_CONN_ACCEPTING);
}

uint64_t hw_verbs_sq_wr_id(const kvs_conn_t *c, uint32_t i)
{
    return (uint64_t)hw_net_conn_token(&c->net) << 16 | i;
}

uint32_t hw_verbs_sq_room(const kvs_conn_t *c) { return c->fab->cfg.sq_depth - c->sq_used; }

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
                             "(%s)", c->net.peer, strerror(rc));
    }
}

void hw_verbs_sq_flush(kvs_conn_t *c)
{
    /* the scratch chain holds at most sq_depth requests: the whole ring */
    hw_verbs_sq_post(c, c->sq_head, c->sq_used);
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
int hw_verbs_post_msg(kvs_conn_t *c, hw_verbs_op_kind_t kind, uint32_t imm,
                      const void *msg, uint32_t len, uint64_t wr_id)
{
    hw_verbs_fabric_t *f = c->fab;
    if (hw_verbs_sq_room(c) == 0)
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "send to %s: %u work requests in "
                               "flight fill the send queue: poll completions first, or raise "
                               "sq_depth", c->net.peer, f->cfg.sq_depth);
    uint32_t pos = 0, bytes = 0;
    if (len > 0 && !hw_verbs_ring_take(c, len, &pos, &bytes))
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "send to %s: %u bytes of control "
                               "messages in flight fill the send buffer: poll completions "
                               "first, or raise send_buf_bytes", c->net.peer, c->s_used);
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
