/*
 * poll.c - completions of the verbs fabric: rdma_cm events first (accepts,
 * disconnects, reconnects), then the completion queue, then recovery and
 * close timers, turned into kvs_completion_t.
 *
 * Receives: a user message becomes a RECV completion (copied out, the
 * buffer posted again at once); a write with immediate becomes an IMM
 * completion; fabric-internal messages (key tables, BYE) are handled here
 * and not reported. Send-queue requests are marked done as their work
 * completions arrive and reported from the head of the connection's ring,
 * one completion per operation with the first error among its requests.
 * A flushed request of a connection that is recovering is not reported: it
 * goes again on the next QP. The first real error on a connection (a bad
 * key or range at the peer) fails that operation and breaks the QP
 * (conn.c recovers it). Completions of QPs already replaced or freed are
 * dropped (generation check). A connection the user knows that fails for
 * good (peer gone, BYE, not back in time) gets one DISCONNECT completion
 * once every operation of it was reported, so the core learns of the loss
 * at once instead of by its own time-outs.
 *
 * wait(): arms the completion channel, polls once more into a small stash
 * (a completion that arrived before arming raises no event), then sleeps
 * on the wait set (hw/net/waitset.h) over the completion channel and the
 * rdma_cm channel.
 *
 * wait_arm() (the ops slot, for a driver's own sleep): takes a completion
 * event that already fired (the channel is non-blocking), arms the CQ,
 * and hands out the wait set's fd over both channels; the caller polls
 * once more before it sleeps (backend.h), which stands for wait()'s stash.
 * Its wake time is the earliest timer conn_tick runs (a recovery's
 * deadline or next reconnect, a close's deadline), or now when poll has
 * something to report without a new event.
 */
#include "hw_verbs.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const char *hw_verbs_op_name(uint8_t kind)
{
    return kind == HW_OP_WRITE    ? "write"
           : kind == HW_OP_SEND   ? "send"
           : kind == HW_OP_BIND   ? "memory window bind (key_grant)"
           : kind == HW_OP_INVAL  ? "memory window invalidate (a rebind)"
                                  : "fabric message";
}

/* A receive completed: *out filled and true when it is the user's. */
static bool hw_verbs_on_recv(hw_verbs_fabric_t *f, const struct ibv_wc *wc,
                             kvs_completion_t *out)
{
    const uint32_t token = (uint32_t)(wc->wr_id >> 16); /* bit 63 falls off */
    const uint32_t slot = token & 0xffffu, gen = token >> 16;
    const uint32_t index = (uint32_t)wc->wr_id & 0xffffu;
    kvs_conn_t *c = hw_net_conn_by_token(&f->connt, token);
    const uint8_t *buf = NULL;
    if (c != NULL) {
        c->rq_posted--;
        buf = c->rbuf + (size_t)index * KVS_CONTROL_MSG_MAX_BYTES;
    } else if (slot < f->cfg.max_conns && f->conns[slot].net.state != HW_NET_CONN_FREE &&
               f->conns[slot].prev_rbuf != NULL && f->conns[slot].prev_gen == gen) {
        /* received by the QP a recovery replaced: deliver it, post nothing */
        c = &f->conns[slot];
        if (wc->status != IBV_WC_SUCCESS || c->net.state == HW_CONN_CLOSING)
            return false;
        buf = c->prev_rbuf + (size_t)index * KVS_CONTROL_MSG_MAX_BYTES;
    } else {
        return false;
    }
    const bool current = (c->net.gen & 0xffffu) == gen;
    if (wc->status != IBV_WC_SUCCESS) {
        hw_verbs_conn_broken(c, hw_verbs_wc_status(wc->status), "connection to %s: a receive "
                             "completed with '%s'", c->net.peer, ibv_wc_status_str(wc->status));
        return false;
    }
    if (c->net.state == HW_CONN_CLOSING)
        return false;
    bool user = true;
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        *out = (kvs_completion_t){.kind = KVS_COMPLETION_IMM, .status = KVS_OK, .conn = c,
                                  .imm = ntohl(wc->imm_data)};
    } else if (wc->wc_flags & IBV_WC_WITH_IMM) {
        const uint32_t kind = ntohl(wc->imm_data);
        user = false;
        if (kind == HW_VERBS_CTRL_BYE) {
            hw_verbs_conn_bye(c);
            return false;
        }
        char why[KVS_ERROR_MSG_BYTES];
        const int rc = hw_verbs_keys_recv(f, c, kind, buf, wc->byte_len, why, sizeof why);
        if (rc != KVS_OK)
            hw_verbs_conn_fail(c, rc, "connection to %s: %s", c->net.peer, why);
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
        c->net.user_knows = true;
    if (current && c->qp != NULL && c->net.state != HW_NET_CONN_DEAD &&
        c->net.state != HW_CONN_RECOVERING) {
        int rc = hw_verbs_post_recv(c, index);
        if (rc != 0)
            hw_verbs_conn_broken(c, KVS_EBACKEND, "connection to %s: posting a receive "
                                 "failed: %s", c->net.peer, strerror(rc));
    }
    return user;
}

/* A bind or invalidate completed: its grant (if not revoked meanwhile) is
 * bound with the new key, or broken. */
static void hw_verbs_grant_done(hw_verbs_sqe_t *e, enum ibv_wc_status wc_status)
{
    kvs_grant_t *g = e->grant;
    if (g == NULL)
        return; /* revoked meanwhile */
    if (wc_status == IBV_WC_SUCCESS) {
        if (e->kind == HW_OP_BIND) {
            g->mw_rkey = g->rkey;
            g->bound = true;
        }
        return;
    }
    g->bound = false;
    g->broken = true;
}

/* A send-queue request completed: mark it; reporting is retire()'s. */
static void hw_verbs_on_send(hw_verbs_fabric_t *f, const struct ibv_wc *wc)
{
    const uint32_t i = (uint32_t)wc->wr_id & 0xffffu;
    kvs_conn_t *c = hw_net_conn_by_token(&f->connt, (uint32_t)(wc->wr_id >> 16));
    if (c == NULL || i >= f->cfg.sq_depth || c->sq[i].state != HW_SQE_POSTED)
        return;
    hw_verbs_sqe_t *e = &c->sq[i];
    c->sq_posted--;
    if ((e->kind == HW_OP_BIND || e->kind == HW_OP_INVAL) && wc->status != IBV_WC_WR_FLUSH_ERR)
        hw_verbs_grant_done(e, wc->status);
    if (wc->status == IBV_WC_SUCCESS) {
        e->state = HW_SQE_DONE;
        e->status = KVS_OK;
        return;
    }
    if (wc->status == IBV_WC_WR_FLUSH_ERR) {
        /* an earlier request broke the QP: go again on the next one */
        hw_verbs_conn_broken(c, KVS_EPEER, "connection to %s: its queue pair failed",
                             c->net.peer);
        if (c->net.state == HW_CONN_RECOVERING) {
            e->state = HW_SQE_REPOST;
        } else {
            e->state = HW_SQE_DONE;
            e->status = KVS_EPEER;
        }
        return;
    }
    const int st = hw_verbs_wc_status(wc->status);
    e->state = HW_SQE_DONE;
    e->status = st;
    kvs_fabric_fail(&f->base, st, (int)wc->vendor_err, "%s to %s (wr_id 0x%llx) failed: %s: "
                    "%s", hw_verbs_op_name(e->kind), c->net.peer, (unsigned long long)e->wr_id,
                    ibv_wc_status_str(wc->status), hw_verbs_wc_advice(wc->status));
    /* The QP is in error now: a new one replaces it (a peer that is gone
     * refuses the reconnect, and the connection then fails for good). */
    hw_verbs_conn_broken(c, st, "connection to %s: a %s failed with '%s'", c->net.peer,
                         hw_verbs_op_name(e->kind), ibv_wc_status_str(wc->status));
}

int hw_verbs_cq_take_sends(hw_verbs_fabric_t *f)
{
    if (f->nstash == HW_VERBS_STASH)
        return 0;
    struct ibv_wc wcs[HW_VERBS_STASH];
    const int got = ibv_poll_cq(f->cq, HW_VERBS_STASH - f->nstash, wcs);
    if (got < 0)
        return kvs_fabric_fail(&f->base, KVS_EBACKEND, got, "polling the completion queue "
                               "of %s failed (%d): the device is in error; create the "
                               "fabric again", f->device_name, got);
    for (int k = 0; k < got; k++) {
        if (wcs[k].wr_id >> 63)
            f->stash[f->nstash++] = wcs[k]; /* poll reports it, in order */
        else
            hw_verbs_on_send(f, &wcs[k]);
    }
    return got;
}

/* Reports done requests from the head of c's ring, in order, into
 * out[*n..max). */
static void hw_verbs_retire(kvs_conn_t *c, kvs_completion_t *out, int *n, int max)
{
    const uint32_t depth = c->fab->cfg.sq_depth;
    while (c->sq_used > 0) {
        hw_verbs_sqe_t *e = &c->sq[c->sq_head];
        if (e->state != HW_SQE_DONE)
            break;
        const bool report = e->last && hw_verbs_op_reported(e->kind);
        if (report && *n >= max)
            break;
        if (c->op_status == KVS_OK && e->status != KVS_OK)
            c->op_status = e->status;
        if (e->send_bytes > 0) { /* in order: the ring's oldest bytes */
            c->s_used -= e->send_bytes;
            c->s_tail = e->send_end;
        }
        int final = KVS_OK;
        if (e->last) {
            final = c->op_status;
            c->op_status = KVS_OK;
        }
        if (report)
            out[(*n)++] = (kvs_completion_t){
                .kind = e->kind == HW_OP_WRITE ? KVS_COMPLETION_WRITE : KVS_COMPLETION_SEND,
                .status = final,
                .wr_id = e->wr_id,
                .conn = c->net.state == HW_CONN_CLOSING ? NULL : c,
            };
        e->state = HW_SQE_FREE;
        c->sq_head = (c->sq_head + 1) % depth;
        c->sq_used--;
    }
}

static void hw_verbs_retire_all(hw_verbs_fabric_t *f, kvs_completion_t *out, int *n, int max)
{
    for (uint32_t k = 0; k < f->cfg.max_conns; k++) {
        kvs_conn_t *c = &f->conns[k];
        if (c->net.state != HW_NET_CONN_FREE && c->sq_used > 0)
            hw_verbs_retire(c, out, n, max);
    }
}

/* A DEAD connection the user knows, all of whose operations were reported,
 * and that was not yet reported itself. */
static bool hw_verbs_untold_death(const kvs_conn_t *c)
{
    return c->net.state == HW_NET_CONN_DEAD && c->net.user_knows && !c->net.down_told &&
           c->sq_used == 0;
}

/* One DISCONNECT completion per connection that failed for good. */
static void hw_verbs_tell_deaths(hw_verbs_fabric_t *f, kvs_completion_t *out, int *n, int max)
{
    for (uint32_t k = 0; k < f->cfg.max_conns && *n < max; k++) {
        kvs_conn_t *c = &f->conns[k];
        if (!hw_verbs_untold_death(c))
            continue;
        out[(*n)++] = hw_net_conn_down(c);
    }
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
    hw_verbs_retire_all(f, out, &n, max);
    while (n < max) {
        struct ibv_wc wcs[HW_VERBS_STASH];
        int got;
        if (f->nstash > 0) {
            got = f->nstash;
            memcpy(wcs, f->stash, sizeof wcs[0] * (size_t)got);
            f->nstash = 0;
        } else {
            /* each work completion gives at most one receive completion */
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
        for (; k < got && n < max; k++) {
            if (wcs[k].wr_id >> 63) {
                if (hw_verbs_on_recv(f, &wcs[k], &out[n]))
                    n++;
            } else {
                hw_verbs_on_send(f, &wcs[k]);
            }
        }
        if (k < got) { /* out is full: keep the rest for the next call */
            f->nstash = got - k;
            memcpy(f->stash, &wcs[k], sizeof wcs[0] * (size_t)f->nstash);
        }
        hw_verbs_retire_all(f, out, &n, max);
    }
    hw_verbs_conn_tick(f);
    hw_verbs_retire_all(f, out, &n, max);
    hw_verbs_tell_deaths(f, out, &n, max);
    return n;
}

/* Whether poll has something to report without a new event: completions
 * stashed by wait, requests done at the head of a ring (left there when
 * out was full), a connection's death not told yet. */
static bool hw_verbs_ready(const hw_verbs_fabric_t *f)
{
    if (f->nstash > 0)
        return true;
    for (uint32_t k = 0; k < f->cfg.max_conns; k++) {
        const kvs_conn_t *c = &f->conns[k];
        if (c->sq_used > 0 && c->sq[c->sq_head].state == HW_SQE_DONE)
            return true;
        if (hw_verbs_untold_death(c))
            return true;
    }
    return false;
}

/* Arms the CQ unless it is armed and its event has not fired. */
static int hw_verbs_arm_cq(hw_verbs_fabric_t *f)
{
    if (f->cq_armed)
        return KVS_OK;
    int rc = ibv_req_notify_cq(f->cq, 0);
    if (rc != 0)
        return kvs_fabric_fail(&f->base, KVS_EBACKEND, rc, "arming the completion queue "
                               "of %s failed: %s", f->device_name, strerror(rc));
    f->cq_armed = true;
    return KVS_OK;
}

/* Takes the completion events that fired (the channel is non-blocking):
 * a fired event keeps the channel readable until it is taken. */
static void hw_verbs_take_cq_events(hw_verbs_fabric_t *f)
{
    struct ibv_cq *cq = NULL;
    void *ctx = NULL;
    while (ibv_get_cq_event(f->cc, &cq, &ctx) == 0) {
        ibv_ack_cq_events(cq, 1);
        f->cq_armed = false;
    }
}

int hw_verbs_wait_arm(kvs_fabric_t *fab, int *out_fd, uint64_t *out_wake_ns)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    hw_verbs_take_cq_events(f);
    int rc = hw_verbs_arm_cq(f);
    if (rc != KVS_OK)
        return rc;
    hw_net_wake_t t = hw_net_wake_start(hw_net_now_ns());
    if (hw_verbs_ready(f))
        hw_net_wake_now(&t);
    for (uint32_t k = 0; k < f->cfg.max_conns && !hw_net_wake_due(&t); k++) {
        const kvs_conn_t *c = &f->conns[k];
        /* the timers of conn_tick, which poll runs */
        if (c->net.state == HW_CONN_CLOSING) {
            if (c->sq_used == 0)
                hw_net_wake_now(&t); /* freed at the next tick */
            else if (c->bye_sent)
                hw_net_wake_at(&t, c->deadline_ns);
            continue;
        }
        if (!c->recovering)
            continue;
        hw_net_wake_at(&t, c->deadline_ns);
        if (c->net.state == HW_CONN_RECOVERING && c->net.active)
            hw_net_wake_at(&t, c->retry_ns);
    }
    return hw_net_waitset_hand_out(&f->waits, &t, out_fd, out_wake_ns);
}

int hw_verbs_wait(hw_verbs_fabric_t *f, int timeout_ms)
{
    if (hw_verbs_ready(f))
        return KVS_OK;
    for (uint32_t k = 0; k < f->cfg.max_conns; k++) {
        const kvs_conn_t *c = &f->conns[k];
        if (c->net.state == HW_CONN_RECOVERING || c->net.state == HW_CONN_CLOSING || c->recovering)
            if (timeout_ms < 0 || timeout_ms > 50)
                timeout_ms = 50; /* timers of recovery and close run in poll */
    }
    int rc = hw_verbs_arm_cq(f);
    if (rc != KVS_OK)
        return rc;
    int got = ibv_poll_cq(f->cq, HW_VERBS_STASH, f->stash);
    if (got > 0) {
        f->nstash = got;
        return KVS_OK;
    }
    hw_net_ready_t ready[2];
    const int r = hw_net_waitset_wait(&f->waits, ready, 2, timeout_ms);
    if (r < 0)
        return r;
    for (int i = 0; i < r; i++)
        if (ready[i].key == HW_VERBS_WAIT_CQ)
            hw_verbs_take_cq_events(f);
    return r > 0 ? KVS_OK : KVS_EAGAIN;
}
