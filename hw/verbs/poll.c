/*
 * poll.c - completions of the verbs fabric: rdma_cm events first (accepts,
 * disconnects), then the completion queue, turned into kvs_completion_t.
 *
 * Receives: a user message becomes a RECV completion (copied out, the
 * buffer posted again at once); a write with immediate becomes an IMM
 * completion; fabric-internal messages (key tables) are handled here and
 * not reported. Sends and writes: one completion per operation when its
 * last work request completes, with the first error among its requests.
 * The first error on a connection fails the connection (conn.c) with a
 * message saying what went wrong and what to do, recorded on the fabric.
 * Completions of connections already freed are dropped (generation check).
 *
 * wait(): arms the completion channel, polls once more into a small stash
 * (a completion that arrived before arming raises no event), then sleeps
 * on the completion channel and the rdma_cm channel.
 */
#include "hw_verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

static const char *hw_verbs_op_name(uint8_t kind)
{
    return kind == HW_OP_WRITE ? "write" : kind == HW_OP_SEND ? "send" : "key-table send";
}

/* A receive completed: *out filled and true when it is the user's. */
static bool hw_verbs_on_recv(hw_verbs_fabric_t *f, const struct ibv_wc *wc,
                             kvs_completion_t *out)
{
    const uint32_t slot = (uint32_t)(wc->wr_id >> 16) & 0xffffu;
    const uint32_t gen = (uint32_t)(wc->wr_id >> 32) & 0xffffu;
    const uint32_t index = (uint32_t)wc->wr_id & 0xffffu;
    kvs_conn_t *c = hw_verbs_conn_at(f, slot, gen);
    if (c == NULL)
        return false;
    c->rq_posted--;
    if (wc->status != IBV_WC_SUCCESS) {
        hw_verbs_conn_fail(c, hw_verbs_wc_status(wc->status), "connection to %s failed: a "
                           "receive completed with '%s': %s", c->peer,
                           ibv_wc_status_str(wc->status), hw_verbs_wc_advice(wc->status));
        return false;
    }
    if (c->state == HW_CONN_CLOSING)
        return false;
    const uint8_t *buf = c->rbuf + (size_t)index * KVS_CONTROL_MSG_MAX_BYTES;
    bool user = true;
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        *out = (kvs_completion_t){.kind = KVS_COMPLETION_IMM, .status = KVS_OK, .conn = c,
                                  .imm = ntohl(wc->imm_data)};
    } else if (wc->wc_flags & IBV_WC_WITH_IMM) {
        hw_verbs_keys_recv(f, c, ntohl(wc->imm_data), buf, wc->byte_len);
        user = false;
    } else {
        out->kind = KVS_COMPLETION_RECV;
        out->status = KVS_OK;
        out->wr_id = 0;
        out->conn = c;
        out->imm = 0;
        out->len_bytes = wc->byte_len;
        memcpy(out->msg, buf, wc->byte_len);
    }
    if (user)
        c->user_knows = true;
    if (c->state != HW_CONN_DEAD) {
        int rc = hw_verbs_post_recv(c, index);
        if (rc != 0)
            hw_verbs_conn_fail(c, KVS_EBACKEND, "connection to %s: posting a receive "
                               "failed: %s", c->peer, strerror(rc));
    }
    return user;
}

/* A send-queue request completed: *out filled and true when it ends a user
 * operation. */
static bool hw_verbs_on_send(hw_verbs_fabric_t *f, const struct ibv_wc *wc,
                             kvs_completion_t *out)
{
    const uint32_t slot = (uint32_t)(wc->wr_id >> 16) & 0xffffu;
    const uint32_t gen = (uint32_t)(wc->wr_id >> 32) & 0xffffu;
    const uint32_t i = (uint32_t)wc->wr_id & 0xffffu;
    kvs_conn_t *c = hw_verbs_conn_at(f, slot, gen);
    if (c == NULL || i >= f->cfg.sq_depth || !c->sq[i].used)
        return false;
    hw_verbs_sqe_t e = c->sq[i];
    const int st = hw_verbs_wc_status(wc->status);
    if (st != KVS_OK && c->state != HW_CONN_DEAD && c->state != HW_CONN_CLOSING) {
        kvs_fabric_fail(&f->base, st, (int)wc->vendor_err, "%s to %s (wr_id 0x%llx) failed: "
                        "%s: %s", hw_verbs_op_name(e.kind), c->peer,
                        (unsigned long long)e.wr_id, ibv_wc_status_str(wc->status),
                        hw_verbs_wc_advice(wc->status));
        hw_verbs_conn_fail(c, KVS_EPEER, "connection to %s failed: a %s completed with '%s'",
                           c->peer, hw_verbs_op_name(e.kind), ibv_wc_status_str(wc->status));
    }
    if (e.send_bytes > 0) { /* in order: the ring's oldest bytes */
        c->s_used -= e.send_bytes;
        c->s_tail = e.send_end;
    }
    int final = KVS_OK;
    if (c->op_status == KVS_OK && st != KVS_OK)
        c->op_status = st;
    if (e.last) {
        final = c->op_status != KVS_OK ? c->op_status : e.status;
        c->op_status = KVS_OK;
    }
    hw_verbs_sq_done(c, i);
    const bool closing = c->state == HW_CONN_CLOSING;
    if (closing && c->sq_used == 0)
        hw_verbs_conn_free(c);
    if (!e.last || e.kind == HW_OP_INTERNAL)
        return false;
    *out = (kvs_completion_t){
        .kind = e.kind == HW_OP_WRITE ? KVS_COMPLETION_WRITE : KVS_COMPLETION_SEND,
        .status = final,
        .wr_id = e.wr_id,
        .conn = closing ? NULL : c,
    };
    return true;
}

static bool hw_verbs_on_wc(hw_verbs_fabric_t *f, const struct ibv_wc *wc, kvs_completion_t *out)
{
    if (wc->wr_id >> 63)
        return hw_verbs_on_recv(f, wc, out);
    return hw_verbs_on_send(f, wc, out);
}

int hw_verbs_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    if (max < 0 || (out == NULL && max > 0))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "poll on %s: max %d, out %s", f->device_name,
                               max, out == NULL ? "NULL" : "set");
    int rc = hw_verbs_cm_drain(f);
    if (rc != KVS_OK)
        return rc;
    int n = 0;
    while (n < max) {
        struct ibv_wc wcs[HW_VERBS_STASH];
        int got;
        if (f->nstash > 0) {
            got = f->nstash;
            memcpy(wcs, f->stash, sizeof wcs[0] * (size_t)got);
            f->nstash = 0;
        } else {
            /* each work completion gives at most one user completion */
            const int want = max - n < HW_VERBS_STASH ? max - n : HW_VERBS_STASH;
            got = ibv_poll_cq(f->cq, want, wcs);
            if (got < 0)
                return kvs_fabric_fail(fab, KVS_EBACKEND, got, "polling the completion queue "
                                       "of %s failed (%d): the device is in error; create "
                                       "the fabric again", f->device_name, got);
            if (got == 0)
                break;
        }
        int k = 0;
        for (; k < got && n < max; k++)
            if (hw_verbs_on_wc(f, &wcs[k], &out[n]))
                n++;
        if (k < got) { /* out is full: keep the rest for the next call */
            f->nstash = got - k;
            memcpy(f->stash, &wcs[k], sizeof wcs[0] * (size_t)f->nstash);
        }
    }
    return n;
}

int hw_verbs_wait(hw_verbs_fabric_t *f, int timeout_ms)
{
    if (f->nstash > 0)
        return KVS_OK;
    if (!f->cq_armed) {
        int rc = ibv_req_notify_cq(f->cq, 0);
        if (rc != 0)
            return kvs_fabric_fail(&f->base, KVS_EBACKEND, rc, "arming the completion queue "
                                   "of %s failed: %s", f->device_name, strerror(rc));
        f->cq_armed = true;
    }
    int got = ibv_poll_cq(f->cq, HW_VERBS_STASH, f->stash);
    if (got > 0) {
        f->nstash = got;
        return KVS_OK;
    }
    struct pollfd pfd[2] = {{.fd = f->cc->fd, .events = POLLIN},
                            {.fd = f->ch->fd, .events = POLLIN}};
    int r = poll(pfd, 2, timeout_ms);
    if (r < 0 && errno != EINTR)
        return kvs_fabric_fail(&f->base, KVS_EBACKEND, errno, "waiting on %s failed: %s",
                               f->device_name, strerror(errno));
    if (r > 0 && (pfd[0].revents & POLLIN)) {
        struct ibv_cq *cq = NULL;
        void *ctx = NULL;
        if (ibv_get_cq_event(f->cc, &cq, &ctx) == 0) {
            ibv_ack_cq_events(cq, 1);
            f->cq_armed = false;
        }
    }
    return r > 0 ? KVS_OK : KVS_EAGAIN;
}
