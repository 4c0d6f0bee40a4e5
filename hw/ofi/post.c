/*
 * post.c - writes and sends of the ofi fabric: operations, the requests
 * they are made of, and the backlog of requests the provider refused for
 * now (-FI_EAGAIN).
 *
 * An operation (one user write or send, or an internal message) takes one
 * op slot and one request per provider call: a write splits at
 * max_write_bytes and at the pieces of both sides' registrations. All are
 * taken before anything is posted, so a post is accepted whole or refused
 * (KVS_EAGAIN) whole. A write with an immediate that splits posts its
 * last piece, the one carrying the remote CQ data, only once the others
 * completed with FI_DELIVERY_COMPLETE, so the data never arrives before
 * the bytes (providers need not order writes). Where the immediate rides
 * in an IMM message instead (imm_in_msg, hw_ofi.h), that message is the
 * write's last request, held the same way until every piece landed; it
 * takes a send slot, and the write completes once it was sent.
 *
 * Order: a request goes to the provider at once unless the backlog holds
 * some, then behind them; poll posts the backlog first. So requests reach
 * the provider in the order they were made, which with FI_ORDER_SAS keeps
 * each connection's messages in order.
 *
 * Invariants: ops and requests live iff taken from their free stacks;
 * op.outstanding counts its requests not completed; an op is put on the
 * done queue once, when its last request completes.
 */
#include "hw_ofi.h"

#include <stdio.h>
#include <string.h>

int hw_ofi_check_conn(hw_ofi_fabric_t *f, kvs_conn_t *conn, const char *op)
{
    kvs_conn_t *c = NULL;
    int rc = hw_net_conn_check(&f->connt, conn, op, &c);
    if (rc != KVS_OK)
        return rc;
    if (c->net.state != HW_NET_CONN_UP)
        return kvs_fabric_fail(&f->base, KVS_EINVAL, 0, "%s on %s: the connection to %s is "
                               "not up yet", op, f->name, c->net.peer);
    return KVS_OK;
}

static uint32_t hw_ofi_op_take(hw_ofi_fabric_t *f, kvs_conn_t *conn, uint8_t kind,
                               uint64_t wr_id, bool internal)
{
    const uint32_t i = f->op_free[--f->op_nfree];
    f->ops[i] = (hw_ofi_op_t){.wr_id = wr_id, .conn = conn, .conn_gen = conn->net.gen,
                              .deferred = -1, .kind = kind, .internal = internal,
                              .live = true};
    return i;
}

void hw_ofi_op_free(hw_ofi_fabric_t *f, uint32_t op)
{
    f->ops[op].live = false;
    f->op_free[f->op_nfree++] = op;
}

static uint32_t hw_ofi_req_take(hw_ofi_fabric_t *f, uint32_t op, uint8_t kind)
{
    const uint32_t i = f->req_free[--f->req_nfree];
    f->reqs[i] = (hw_ofi_req_t){.op = op, .kind = kind};
    f->ops[op].outstanding++;
    return i;
}

static int hw_ofi_req_post(hw_ofi_fabric_t *f, hw_ofi_req_t *r)
{
    const hw_ofi_op_t *op = &f->ops[r->op];
    const fi_addr_t dest = op->conn->peer_addr;
    void *buf = (void *)(uintptr_t)r->laddr;
    if (r->kind == HW_OFI_REQ_SEND)
        return (int)fi_send(f->ep, buf, r->len, r->desc, dest, &r->ctx);
    /* Delivery complete: a write completes once it landed at the peer, so
     * the peer's refusal (a dropped key) fails it here. */
    struct iovec iov = {.iov_base = buf, .iov_len = r->len};
    struct fi_rma_iov rma = {.addr = r->raddr, .len = r->len, .key = r->rkey};
    struct fi_msg_rma m = {.msg_iov = &iov, .desc = &r->desc, .iov_count = 1, .addr = dest,
                           .rma_iov = &rma, .rma_iov_count = 1, .context = &r->ctx,
                           .data = r->data};
    return (int)fi_writemsg(f->ep, &m, FI_COMPLETION | FI_DELIVERY_COMPLETE |
                                           (r->with_data ? FI_REMOTE_CQ_DATA : 0));
}

static void hw_ofi_backlog_push(hw_ofi_fabric_t *f, uint32_t req)
{
    f->backlog[(f->bl_head + f->bl_used++) % f->cfg.tx_depth] = req;
}

/* Posts req now, or behind the backlog. A refusal other than "later"
 * completes it with the error (reported by poll). */
static void hw_ofi_submit(hw_ofi_fabric_t *f, uint32_t req)
{
    if (f->bl_used > 0) {
        hw_ofi_backlog_push(f, req);
        return;
    }
    int rc = hw_ofi_req_post(f, &f->reqs[req]);
    if (rc == -FI_EAGAIN)
        hw_ofi_backlog_push(f, req);
    else if (rc != 0)
        hw_ofi_req_done(f, req, hw_ofi_status(rc));
}

void hw_ofi_backlog_flush(hw_ofi_fabric_t *f)
{
    while (f->bl_used > 0) {
        const uint32_t req = f->backlog[f->bl_head];
        const hw_ofi_op_t *op = &f->ops[f->reqs[req].op];
        kvs_conn_t *c = hw_net_conns_of(&f->connt, op->conn);
        if (c == NULL || c->net.gen != op->conn_gen || c->net.state == HW_NET_CONN_DEAD) {
            /* its connection is gone: nothing to post it to */
            f->bl_head = (f->bl_head + 1) % f->cfg.tx_depth;
            f->bl_used--;
            hw_ofi_req_done(f, req, KVS_EPEER);
            continue;
        }
        int rc = hw_ofi_req_post(f, &f->reqs[req]);
        if (rc == -FI_EAGAIN)
            return;
        f->bl_head = (f->bl_head + 1) % f->cfg.tx_depth;
        f->bl_used--;
        if (rc != 0)
            hw_ofi_req_done(f, req, hw_ofi_status(rc));
    }
}

void hw_ofi_req_done(hw_ofi_fabric_t *f, uint32_t req, int status)
{
    hw_ofi_req_t *r = &f->reqs[req];
    const uint32_t opi = r->op;
    hw_ofi_op_t *op = &f->ops[opi];
    if (r->kind == HW_OFI_REQ_SEND)
        f->slot_free[f->slot_nfree++] = r->slot;
    r->kind = HW_OFI_REQ_FREE;
    f->req_free[f->req_nfree++] = req;
    if (status != KVS_OK && op->status == KVS_OK)
        op->status = status;
    op->outstanding--;
    if (op->deferred >= 0 && op->outstanding == 1) {
        /* Only the piece carrying the data is left: the others landed. */
        const uint32_t last = (uint32_t)op->deferred;
        op->deferred = -1;
        if (op->status == KVS_OK)
            hw_ofi_submit(f, last);
        else
            hw_ofi_req_done(f, last, op->status);
        return;
    }
    if (op->outstanding == 0)
        f->done[(f->done_head + f->done_used++) % f->cfg.tx_depth] = opi;
}

/* Takes a send slot and a request of op and writes header + msg into the
 * slot; the request is the caller's to submit (or defer). The caller
 * checked that a slot and a request are free. */
static uint32_t hw_ofi_msg_req(hw_ofi_fabric_t *f, kvs_conn_t *c, uint32_t op, uint32_t kind,
                               const void *msg, uint32_t len_bytes)
{
    const uint32_t slot = f->slot_free[--f->slot_nfree];
    uint8_t *buf = f->sbuf + (size_t)slot * HW_OFI_MSG_BYTES;
    buf[0] = (uint8_t)kind;
    buf[1] = HW_OFI_WIRE_VERSION;
    buf[2] = buf[3] = 0;
    hw_put32(buf + 4, c->peer_token);
    if (len_bytes > 0)
        memcpy(buf + HW_OFI_HDR_BYTES, msg, len_bytes);
    const uint32_t req = hw_ofi_req_take(f, op, HW_OFI_REQ_SEND);
    hw_ofi_req_t *r = &f->reqs[req];
    r->slot = slot;
    r->next = UINT32_MAX;
    r->laddr = (uint64_t)(uintptr_t)buf;
    r->len = HW_OFI_HDR_BYTES + len_bytes;
    r->desc = f->sdesc;
    return req;
}

/* Takes a send slot, an op and a request and posts header + msg. */
static int hw_ofi_send_msg(hw_ofi_fabric_t *f, kvs_conn_t *c, uint32_t kind, const void *msg,
                           uint32_t len_bytes, uint64_t wr_id, bool internal)
{
    if (f->slot_nfree == 0 || f->op_nfree == 0 || f->req_nfree == 0)
        return kvs_fabric_fail(&f->base, KVS_EAGAIN, 0, "send to %s: all %u send slots or "
                               "%u requests are in flight: poll and retry, or raise "
                               "send_slots / tx_depth", c->net.peer, f->cfg.send_slots,
                               f->cfg.tx_depth);
    const uint32_t op = hw_ofi_op_take(f, c, KVS_COMPLETION_SEND, wr_id, internal);
    hw_ofi_submit(f, hw_ofi_msg_req(f, c, op, kind, msg, len_bytes));
    return KVS_OK;
}

int hw_ofi_send_internal(kvs_conn_t *conn, uint32_t kind, const void *msg, uint32_t len_bytes)
{
    return hw_ofi_send_msg(conn->fab, conn, kind, msg, len_bytes, 0, true);
}

int hw_ofi_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                uint64_t wr_id)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    if (len_bytes > KVS_CONTROL_MSG_MAX_BYTES || (msg == NULL && len_bytes > 0))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "send on %s: %u bytes (at most %u, and msg "
                               "not NULL): shorten the message", f->name, len_bytes,
                               KVS_CONTROL_MSG_MAX_BYTES);
    int rc = hw_ofi_check_conn(f, conn, "send");
    if (rc != KVS_OK)
        return rc;
    return hw_ofi_send_msg(f, conn, HW_OFI_MSG_USER, msg, len_bytes, wr_id, false);
}

/* Walks the pieces of a write: calls emit (when not NULL) for each and
 * returns how many there are, or a negative status (fabric message set). */
/* The target address, key and bytes left in the remote piece holding
 * [raddr, ...) of handle rkey on conn; KVS_EREMOTE with the fabric's
 * message set when the handle is unknown or raddr lies outside it. */
static int hw_ofi_rkey_piece(hw_ofi_fabric_t *f, kvs_conn_t *conn, uint64_t rkey,
                             uint64_t raddr, uint64_t *out_addr, uint64_t *out_key,
                             uint64_t *left)
{
    const hw_rkeys_entry_t *t = NULL;
    uint64_t off = 0;
    const int rc = rkey <= UINT32_MAX ? hw_rkeys_lookup(&conn->rkeys, (uint32_t)rkey, raddr,
                                                         out_key, &off, left, &t)
                                      : KVS_ENOENT;
    if (rc == KVS_ENOENT)
        return kvs_fabric_fail(&f->base, KVS_EREMOTE, 0, "write to %s: remote key 0x%llx is "
                               "no registration %s announced: use the key its mr_register "
                               "gave", conn->net.peer, (unsigned long long)rkey, conn->net.peer);
    if (rc != KVS_OK)
        return kvs_fabric_fail(&f->base, KVS_EREMOTE, 0, "write to %s: remote address 0x%llx "
                               "lies outside registration 0x%llx [0x%llx, +%llu)", conn->net.peer,
                               (unsigned long long)raddr, (unsigned long long)rkey,
                               (unsigned long long)t->base, (unsigned long long)t->len_bytes);
    *out_addr = (f->mr_mode & FI_MR_VIRT_ADDR) ? raddr : off;
    return KVS_OK;
}

static int64_t hw_ofi_write_pieces(hw_ofi_fabric_t *f, kvs_conn_t *c, const kvs_write_desc_t *d,
                                   const kvs_mr_t *mr, uint32_t op, bool take, uint32_t *head)
{
    int64_t n = 0;
    hw_ofi_req_t *prev = NULL;
    uint64_t done = 0;
    while (done < d->len_bytes) {
        void *desc;
        uint64_t lleft, rleft = 0, raddr = 0, rkey = 0; /* set when rc is KVS_OK */
        hw_ofi_mr_piece(mr, d->local_addr + done, &desc, &lleft);
        int rc = hw_ofi_rkey_piece(f, c, d->rkey, d->remote_addr + done, &raddr, &rkey, &rleft);
        if (rc != KVS_OK)
            return rc;
        uint64_t len = d->len_bytes - done;
        len = len < lleft ? len : lleft;
        len = len < rleft ? len : rleft;
        len = len < f->max_write_bytes ? len : f->max_write_bytes;
        if (len > UINT32_MAX)
            len = UINT32_C(1) << 31;
        if (take) {
            const uint32_t req = hw_ofi_req_take(f, op, HW_OFI_REQ_WRITE);
            hw_ofi_req_t *r = &f->reqs[req];
            r->laddr = d->local_addr + done;
            r->len = (uint32_t)len;
            r->desc = desc;
            r->raddr = raddr;
            r->rkey = rkey;
            r->next = UINT32_MAX;
            if (prev != NULL)
                prev->next = req;
            else
                *head = req;
            prev = r;
        }
        done += len;
        n++;
    }
    return n;
}

int hw_ofi_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    kvs_mr_t *mr = NULL;
    int rc = hw_net_write_check(&f->mrt, desc, &mr);
    if (rc == KVS_OK)
        rc = hw_ofi_check_conn(f, conn, "write");
    if (rc != KVS_OK)
        return rc;
    uint32_t head = UINT32_MAX;
    const int64_t n = hw_ofi_write_pieces(f, conn, desc, mr, 0, false, &head);
    if (n < 0)
        return (int)n;
    /* Without 8 bytes of CQ data the immediate follows in a message. */
    const bool imm_msg = desc->with_imm && f->imm_in_msg;
    if (f->op_nfree == 0 || (uint64_t)n + imm_msg > f->req_nfree ||
        (imm_msg && f->slot_nfree == 0))
        return kvs_fabric_fail(fab, KVS_EAGAIN, 0, "write on %s: %lld requests%s needed, %u "
                               "of tx_depth %u free (%u send slots): poll and retry, or raise "
                               "tx_depth", f->name, (long long)n + imm_msg,
                               imm_msg ? " and a send slot" : "", f->req_nfree,
                               f->cfg.tx_depth, f->slot_nfree);
    const uint32_t op = hw_ofi_op_take(f, conn, KVS_COMPLETION_WRITE, desc->wr_id, false);
    (void)hw_ofi_write_pieces(f, conn, desc, mr, op, true, &head);
    uint32_t last = head;
    while (f->reqs[last].next != UINT32_MAX)
        last = f->reqs[last].next;
    if (imm_msg) {
        uint8_t imm[4];
        hw_put32(imm, desc->imm);
        const uint32_t q = hw_ofi_msg_req(f, conn, op, HW_OFI_MSG_IMM, imm, sizeof imm);
        f->reqs[last].next = q;
        last = q;
        f->ops[op].deferred = (int32_t)last; /* sent once every byte landed */
    } else if (desc->with_imm) {
        hw_ofi_req_t *r = &f->reqs[last];
        r->with_data = true;
        r->data = (uint64_t)conn->peer_token << 32 | desc->imm;
        if (n > 1) /* the others land first (delivery complete), then this one */
            f->ops[op].deferred = (int32_t)last;
    }
    const uint32_t held = f->ops[op].deferred >= 0 ? last : UINT32_MAX;
    for (uint32_t q = head; q != held && q != UINT32_MAX;) {
        const uint32_t next = f->reqs[q].next; /* read first: a refused post frees q */
        hw_ofi_submit(f, q);
        q = next;
    }
    return KVS_OK;
}
