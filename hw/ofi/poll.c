/*
 * poll.c - completions of the ofi fabric: the completion queue, the done
 * queue of operations, the deaths of connections, and wait_arm.
 *
 * poll, in this order: the bootstrap (accepts, HELLOs, sockets that ended)
 * and the grace timers of peers gone; the backlog; operations whose
 * requests all completed; connections that died (each pending operation
 * of theirs completes with KVS_EPEER, then one DISCONNECT); then the
 * completion queue. A queue entry is a receive (a message: the user's, or
 * the fabric's KEYS, DROP, BYE, or IMM: the immediate of a write on
 * providers with fewer than 8 bytes of CQ data), a write with remote CQ
 * data that landed here (IMM; the data names the connection by its token),
 * or a request of ours. An error entry fails its request's operation alone; a receive's
 * error only reposts the buffer.
 *
 * wait_arm: fi_trywait on the queue (it says when entries are already
 * there: wake now), and the wait set's fd (hw/net/waitset.h) over the
 * queue's wait fd and the bootstrap's set; wake time now when something
 * waits to be reported, the earliest grace timer otherwise, and a
 * millisecond while the provider refuses requests (the backlog) or has no
 * wait fd.
 */
#include "hw_ofi.h"

#include <stdio.h>
#include <string.h>

#define HW_OFI_BATCH 16
#define HW_OFI_RETRY_NS 1000000u

int hw_ofi_post_recv(hw_ofi_fabric_t *f, uint32_t i)
{
    int rc = (int)fi_recv(f->ep, f->rbuf + (size_t)i * HW_OFI_MSG_BYTES, HW_OFI_MSG_BYTES,
                          f->rdesc, FI_ADDR_UNSPEC, &f->rx[i].ctx);
    return rc == 0 ? KVS_OK : hw_ofi_status(rc);
}

static int64_t hw_ofi_rx_index(const hw_ofi_fabric_t *f, const void *ctx)
{
    const uintptr_t b = (uintptr_t)f->rx, q = (uintptr_t)ctx;
    if (ctx == NULL || q < b || (q - b) % sizeof *f->rx != 0 ||
        (q - b) / sizeof *f->rx >= f->cfg.recv_depth)
        return -1;
    return (int64_t)((q - b) / sizeof *f->rx);
}

static int64_t hw_ofi_req_index(const hw_ofi_fabric_t *f, const void *ctx)
{
    const uintptr_t b = (uintptr_t)f->reqs, q = (uintptr_t)ctx;
    if (ctx == NULL || q < b || (q - b) % sizeof *f->reqs != 0 ||
        (q - b) / sizeof *f->reqs >= f->cfg.tx_depth)
        return -1;
    return (int64_t)((q - b) / sizeof *f->reqs);
}

static void hw_ofi_repost(hw_ofi_fabric_t *f, uint32_t i)
{
    if (hw_ofi_post_recv(f, i) != KVS_OK)
        kvs_log_write(&f->cfg.log, KVS_LOG_WARN, "ofi fabric %s: reposting receive %u failed; "
                   "%u remain posted", f->name, i, f->cfg.recv_depth - 1);
}

/* Whether op's connection is still the one it was posted on. */
static kvs_conn_t *hw_ofi_op_conn(hw_ofi_fabric_t *f, const hw_ofi_op_t *op)
{
    kvs_conn_t *c = hw_net_conns_of(&f->connt, op->conn);
    return c != NULL && c->net.gen == op->conn_gen ? c : NULL;
}

/* Reports finished operations while there is room. */
static int hw_ofi_drain_done(hw_ofi_fabric_t *f, kvs_completion_t *out, int n, int max)
{
    while (f->done_used > 0 && n < max) {
        const uint32_t i = f->done[f->done_head];
        f->done_head = (f->done_head + 1) % f->cfg.tx_depth;
        f->done_used--;
        hw_ofi_op_t *op = &f->ops[i];
        kvs_conn_t *c = hw_ofi_op_conn(f, op);
        if (!op->internal && !op->reported && c != NULL) {
            kvs_completion_t *o = &out[n++];
            o->kind = (kvs_completion_kind_t)op->kind;
            o->status = op->status;
            o->wr_id = op->wr_id;
            o->conn = c;
            o->imm = 0;
            o->len_bytes = 0;
        }
        hw_ofi_op_free(f, i);
    }
    return n;
}

/* Dead connections: their pending operations fail with KVS_EPEER, then
 * one DISCONNECT each. */
static int hw_ofi_report_deaths(hw_ofi_fabric_t *f, kvs_completion_t *out, int n, int max)
{
    for (uint32_t s = 0; s < f->cfg.max_conns && f->deaths > 0 && n < max; s++) {
        kvs_conn_t *c = &f->conns[s];
        if (c->net.state != HW_NET_CONN_DEAD || c->net.down_told)
            continue;
        for (uint32_t i = 0; i < f->cfg.tx_depth && n < max; i++) {
            hw_ofi_op_t *op = &f->ops[i];
            if (!op->live || op->internal || op->reported || op->conn != c ||
                op->conn_gen != c->net.gen)
                continue;
            op->reported = true;
            out[n++] = (kvs_completion_t){.kind = (kvs_completion_kind_t)op->kind,
                                          .status = KVS_EPEER, .wr_id = op->wr_id,
                                          .conn = c};
        }
        if (n >= max)
            return n;
        out[n++] = hw_net_conn_down(c);
        f->deaths--;
    }
    return n;
}

/* A message arrived in receive buffer i. */
static int hw_ofi_recv(hw_ofi_fabric_t *f, uint32_t i, size_t len, kvs_completion_t *out, int n)
{
    const uint8_t *m = f->rbuf + (size_t)i * HW_OFI_MSG_BYTES;
    kvs_conn_t *c = len >= HW_OFI_HDR_BYTES ? hw_net_conn_by_token(&f->connt, hw_get32(m + 4))
                                            : NULL;
    const uint32_t body = len >= HW_OFI_HDR_BYTES ? (uint32_t)(len - HW_OFI_HDR_BYTES) : 0;
    if (c == NULL || m[1] != HW_OFI_WIRE_VERSION || c->net.state != HW_NET_CONN_UP) {
        hw_ofi_repost(f, i);
        return n; /* for a connection since gone: dropped */
    }
    switch (m[0]) {
    case HW_OFI_MSG_USER:
        if (body <= KVS_CONTROL_MSG_MAX_BYTES) {
            kvs_completion_t *o = &out[n++];
            o->kind = KVS_COMPLETION_RECV;
            o->status = KVS_OK;
            o->wr_id = 0;
            o->conn = c;
            o->imm = 0;
            o->len_bytes = body;
            memcpy(o->msg, m + HW_OFI_HDR_BYTES, body);
            c->net.user_knows = true;
        }
        break;
    case HW_OFI_MSG_IMM: /* the immediate of a write whose bytes all landed */
        if (body == 4) {
            out[n++] = (kvs_completion_t){.kind = KVS_COMPLETION_IMM, .status = KVS_OK,
                                          .conn = c, .imm = hw_get32(m + HW_OFI_HDR_BYTES)};
            c->net.user_knows = true;
        }
        break;
    case HW_OFI_MSG_KEYS:
    case HW_OFI_MSG_DROP:
        hw_ofi_keys_recv(c, m[0], m + HW_OFI_HDR_BYTES, body);
        break;
    case HW_OFI_MSG_BYE:
        hw_ofi_conn_fail(c, KVS_EPEER, "the peer %s disconnected", c->net.peer);
        break;
    default:
        break;
    }
    hw_ofi_repost(f, i);
    return n;
}

static int hw_ofi_entry(hw_ofi_fabric_t *f, const struct fi_cq_data_entry *e,
                        kvs_completion_t *out, int n)
{
    const int64_t rx = hw_ofi_rx_index(f, e->op_context);
    if ((e->flags & FI_REMOTE_CQ_DATA) && (e->flags & (FI_RMA | FI_REMOTE_WRITE))) {
        /* token << 32 | imm; with fewer than 8 bytes no token survives (our
         * peers then send IMM messages instead): dropped */
        const uint32_t token = (uint32_t)(e->data >> 32);
        kvs_conn_t *c = f->cq_data_bytes >= 8 ? hw_net_conn_by_token(&f->connt, token) : NULL;
        if (c != NULL && c->net.state == HW_NET_CONN_UP) {
            out[n++] = (kvs_completion_t){.kind = KVS_COMPLETION_IMM, .status = KVS_OK,
                                          .conn = c, .imm = (uint32_t)e->data};
            c->net.user_knows = true;
        }
        if (rx >= 0) /* FI_RX_CQ_DATA: the write took a receive */
            hw_ofi_repost(f, (uint32_t)rx);
        return n;
    }
    if (rx >= 0)
        return hw_ofi_recv(f, (uint32_t)rx, e->len, out, n);
    const int64_t req = hw_ofi_req_index(f, e->op_context);
    if (req >= 0 && f->reqs[req].kind != HW_OFI_REQ_FREE)
        hw_ofi_req_done(f, (uint32_t)req, KVS_OK);
    return n;
}

static void hw_ofi_error_entry(hw_ofi_fabric_t *f)
{
    struct fi_cq_err_entry e = {0};
    if (fi_cq_readerr(f->cq, &e, 0) != 1)
        return;
    const int64_t rx = hw_ofi_rx_index(f, e.op_context);
    if (rx >= 0) {
        if (e.err != FI_ECANCELED)
            hw_ofi_repost(f, (uint32_t)rx);
        return;
    }
    const int64_t req = hw_ofi_req_index(f, e.op_context);
    if (req < 0 || f->reqs[req].kind == HW_OFI_REQ_FREE)
        return;
    const hw_ofi_req_t *r = &f->reqs[req];
    const hw_ofi_op_t *op = &f->ops[r->op];
    int status = hw_ofi_status(-e.err);
    if (r->kind == HW_OFI_REQ_WRITE && status != KVS_EPEER)
        status = KVS_EREMOTE;
    else if (status == KVS_EBACKEND || status == KVS_EAGAIN)
        status = KVS_EPEER;
    char detail[128] = "";
    const char *pe = fi_cq_strerror(f->cq, e.prov_errno, e.err_data, detail, sizeof detail);
    (void)kvs_fabric_fail(&f->base, status, e.err, "%s to %s failed: %s (provider: %s)%s",
                          r->kind == HW_OFI_REQ_WRITE ? "write" : "send", op->conn->net.peer,
                          f->lib.strerror(e.err), pe != NULL ? pe : "?",
                          status == KVS_EREMOTE ? ": check the remote key and range" : "");
    hw_ofi_req_done(f, (uint32_t)req, status);
}

int hw_ofi_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    if (out == NULL || max <= 0)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "poll on %s: out must hold at least one "
                               "completion", f->name);
    hw_ofi_boot_progress(f);
    hw_ofi_conn_tick(f, hw_net_now_ns());
    hw_ofi_backlog_flush(f);
    int n = hw_ofi_drain_done(f, out, 0, max);
    n = hw_ofi_report_deaths(f, out, n, max);
    while (n < max) {
        struct fi_cq_data_entry es[HW_OFI_BATCH];
        const int want = max - n < HW_OFI_BATCH ? max - n : HW_OFI_BATCH;
        const ssize_t got = fi_cq_read(f->cq, es, (size_t)want);
        if (got == -FI_EAGAIN)
            break;
        if (got == -FI_EAVAIL) {
            hw_ofi_error_entry(f);
            continue;
        }
        if (got < 0)
            return kvs_fabric_fail(fab, KVS_EBACKEND, (int)-got, "poll on %s: fi_cq_read "
                                   "failed: %s; the fabric cannot go on: destroy it",
                                   f->name, f->lib.strerror((int)-got));
        for (ssize_t k = 0; k < got; k++)
            n = hw_ofi_entry(f, &es[k], out, n);
        n = hw_ofi_drain_done(f, out, n, max);
    }
    return hw_ofi_drain_done(f, out, n, max);
}

int hw_ofi_wait_arm(kvs_fabric_t *fab, int *out_fd, uint64_t *out_wake_ns)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    hw_net_wake_t t = hw_net_wake_start(hw_net_now_ns());
    if (f->done_used > 0 || f->deaths > 0)
        hw_net_wake_now(&t);
    if (f->bl_used > 0 || f->cq_fd < 0)
        hw_net_wake_in(&t, HW_OFI_RETRY_NS);
    for (uint32_t i = 0; i < f->cfg.max_conns && !hw_net_wake_due(&t); i++) {
        const kvs_conn_t *c = &f->conns[i];
        if (c->net.state == HW_NET_CONN_UP && c->peer_gone)
            hw_net_wake_at(&t, c->gone_ns);
    }
    if (f->cq_fd >= 0 && !hw_net_wake_due(&t)) {
        struct fid *fids[1] = {&f->cq->fid};
        if (fi_trywait(f->fabric, fids, 1) != FI_SUCCESS)
            hw_net_wake_now(&t); /* entries are there already */
    }
    return hw_net_waitset_hand_out(&f->waits, &t, out_fd, out_wake_ns);
}

void hw_ofi_drain(hw_ofi_fabric_t *f, uint64_t deadline_ns)
{
    kvs_completion_t scratch[4]; /* what poll reports here goes nowhere */
    bool looked = false;         /* nothing of ours in flight at the last look */
    while (hw_net_now_ns() < deadline_ns) {
        const int n = hw_ofi_poll(&f->base, scratch, 4);
        if (n < 0)
            return;
        const bool idle = n == 0 && f->req_nfree == f->cfg.tx_depth;
        if (idle && looked)
            return;
        looked = idle;
    }
}
