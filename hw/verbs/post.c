/*
 * post.c - posting on a verbs connection: RDMA WRITE (WITH IMM) and SEND.
 *
 * A write becomes one or more work requests: it is cut at max_write_bytes
 * (the port's max_msg_sz), at the local MR's piece boundaries and at the
 * peer's piece boundaries (split registrations, mr.c); only the last request
 * carries the immediate, so it lands after every byte of the write (RC
 * executes a queue pair's requests in order). Every request is signalled;
 * poll reports one completion per operation, with the first error among its
 * requests. All requests of an operation are posted in one ibv_post_send, or
 * none when the send queue has no room (KVS_EAGAIN).
 *
 * Messages are copied into the connection's registered send ring (a byte
 * ring freed in completion order, which RC guarantees), so the caller's
 * buffer is free when send() returns. Fabric-internal messages (key tables)
 * go as SEND WITH IMM, the immediate naming their kind.
 */
#include "hw_verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

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
        return KVS_OK;
    case HW_CONN_DEAD:
        return kvs_fabric_fail(&f->base, KVS_EPEER, 0, "%s on a failed connection: %s; "
                               "disconnect and connect again", op, c->why);
    case HW_CONN_CLOSING:
        return kvs_fabric_fail(&f->base, KVS_EINVAL, 0, "%s on %s: the connection to %s was "
                               "disconnected", op, f->device_name, c->peer);
    default:
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "%s on %s: the connection to %s is "
                               "still being set up", op, f->device_name, c->peer);
    }
}

static uint32_t hw_verbs_sq_take(kvs_conn_t *c)
{
    const uint32_t i = c->sq_free;
    c->sq_free = c->sq[i].next_free;
    c->sq[i] = (hw_verbs_sqe_t){.used = true};
    c->sq_used++;
    return i;
}

void hw_verbs_sq_done(kvs_conn_t *c, uint32_t i)
{
    c->sq[i].used = false;
    c->sq[i].next_free = c->sq_free;
    c->sq_free = i;
    c->sq_used--;
}

static uint64_t hw_verbs_sq_wr_id(const kvs_conn_t *c, uint32_t i)
{
    return (uint64_t)(c->gen & 0xffffu) << 32 | (uint64_t)c->slot << 16 | i;
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
    if (c->sq_used >= f->cfg.sq_depth)
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "send to %s: %u work requests in "
                               "flight fill the send queue: poll completions first, or raise "
                               "sq_depth", c->peer, f->cfg.sq_depth);
    uint32_t pos = 0, bytes = 0;
    const uint32_t old_head = c->s_head;
    if (len > 0 && !hw_verbs_ring_take(c, len, &pos, &bytes))
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "send to %s: %u bytes of control "
                               "messages in flight fill the send buffer: poll completions "
                               "first, or raise send_buf_bytes", c->peer, c->s_used);
    if (len > 0)
        memcpy(c->sbuf + pos, msg, len);
    const uint32_t i = hw_verbs_sq_take(c);
    hw_verbs_sqe_t *e = &c->sq[i];
    e->wr_id = wr_id;
    e->kind = (uint8_t)kind;
    e->last = true;
    e->send_bytes = bytes;
    e->send_end = c->s_head;
    struct ibv_sge sge = {.addr = (uintptr_t)(c->sbuf + pos), .length = len,
                          .lkey = c->smr->lkey};
    struct ibv_send_wr wr = {
        .wr_id = hw_verbs_sq_wr_id(c, i),
        .sg_list = len > 0 ? &sge : NULL,
        .num_sge = len > 0 ? 1 : 0,
        .opcode = kind == HW_OP_INTERNAL ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
        .send_flags = IBV_SEND_SIGNALED,
    };
    if (kind == HW_OP_INTERNAL)
        wr.imm_data = htonl(imm);
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(c->qp, &wr, &bad);
    if (rc != 0) {
        c->s_used -= bytes; /* the newest reservation: undo it */
        c->s_head = old_head;
        hw_verbs_sq_done(c, i);
        hw_verbs_conn_fail(c, KVS_EPEER, "connection to %s: posting a send failed: %s",
                           c->peer, strerror(rc));
        return kvs_fabric_fail(&f->base, KVS_EPEER, rc, "send to %s: ibv_post_send failed: "
                               "%s; disconnect and connect again", c->peer, strerror(rc));
    }
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
    const uint32_t room = f->cfg.sq_depth - c->sq_used;
    uint32_t n = 0;
    for (uint64_t off = 0; off < desc->len_bytes;) {
        uint32_t lkey = 0, rkey = 0;
        uint64_t lleft = 0, rleft = 0;
        hw_verbs_mr_piece(mr, desc->local_addr + off, &lkey, &lleft);
        rc = hw_verbs_rkey_piece(f, c, desc->rkey, desc->remote_addr + off, &rkey, &rleft);
        if (rc != KVS_OK)
            return rc;
        const uint64_t len = hw_verbs_min64(hw_verbs_min64(desc->len_bytes - off, lleft),
                                            hw_verbs_min64(rleft, f->max_write_bytes));
        if (n == f->cfg.sq_depth)
            return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: %llu bytes need more "
                                   "than sq_depth %u work requests (pieces of at most %llu "
                                   "bytes): raise sq_depth or write less at once",
                                   f->device_name, (unsigned long long)desc->len_bytes,
                                   f->cfg.sq_depth, (unsigned long long)f->max_write_bytes);
        f->sges[n] = (struct ibv_sge){.addr = desc->local_addr + off, .length = (uint32_t)len,
                                      .lkey = lkey};
        f->wrs[n] = (struct ibv_send_wr){
            .sg_list = &f->sges[n],
            .num_sge = 1,
            .opcode = IBV_WR_RDMA_WRITE,
            .send_flags = IBV_SEND_SIGNALED,
            .wr.rdma = {.remote_addr = desc->remote_addr + off, .rkey = rkey},
        };
        n++;
        off += len;
    }
    if (n > room)
        return kvs_fabric_fail(fab, KVS_EAGAIN, 0, "write on %s: the send queue to %s has "
                               "room for %u work requests, this write needs %u: poll "
                               "completions, then retry", f->device_name, c->peer, room, n);
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t i = hw_verbs_sq_take(c);
        c->sq[i].wr_id = desc->wr_id;
        c->sq[i].kind = HW_OP_WRITE;
        c->sq[i].last = k + 1 == n;
        f->wrs[k].wr_id = hw_verbs_sq_wr_id(c, i);
        f->wrs[k].next = k + 1 < n ? &f->wrs[k + 1] : NULL;
    }
    if (desc->with_imm) {
        f->wrs[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        f->wrs[n - 1].imm_data = htonl(desc->imm);
    }
    struct ibv_send_wr *bad = NULL;
    rc = ibv_post_send(c->qp, &f->wrs[0], &bad);
    if (rc == 0)
        return KVS_OK;
    uint32_t posted = 0;
    while (posted < n && &f->wrs[posted] != bad)
        posted++;
    for (uint32_t k = posted; k < n; k++)
        hw_verbs_sq_done(c, (uint32_t)(f->wrs[k].wr_id & 0xffffu));
    hw_verbs_conn_fail(c, KVS_EPEER, "connection to %s: posting a write failed: %s", c->peer,
                       strerror(rc));
    if (posted == 0)
        return kvs_fabric_fail(fab, KVS_EPEER, rc, "write to %s: ibv_post_send failed: %s; "
                               "disconnect and connect again", c->peer, strerror(rc));
    /* Part of it went out: its completion reports the failure. */
    hw_verbs_sqe_t *e = &c->sq[f->wrs[posted - 1].wr_id & 0xffffu];
    e->last = true;
    e->status = KVS_EPEER;
    return KVS_OK;
}
