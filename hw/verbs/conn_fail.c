/*
 * conn_fail.c - how a verbs connection fails: broken for a while
 * (RECOVERING: its queue pair goes to the error state, a new one replaces
 * it and the flushed requests go again, conn.c's recovery) or for good
 * (DEAD: what never reached a queue pair completes with KVS_EPEER, later
 * posts say why). It calls nothing else of the fabric, so that posting
 * (post.c), grants (grant.c) and completions (poll.c) can fail a
 * connection without calling into the connection manager that calls them.
 */
#include "hw_verbs.h"

#include <stdarg.h>
#include <stdio.h>

void hw_verbs_qp_error(kvs_conn_t *c)
{
    if (c->qp != NULL) {
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
        (void)ibv_modify_qp(c->qp, &attr, IBV_QP_STATE);
    }
}

static void hw_verbs_conn_vfail(kvs_conn_t *c, int status, const char *fmt, va_list ap)
{
    /* a closing connection reaps its requests as they are */
    if (c->net.state == HW_CONN_CLOSING || !hw_net_conn_vfail(&c->net, status, fmt, ap))
        return;
    c->recovering = false;
    hw_verbs_qp_error(c);
    /* what never reached a QP completes now; what did completes as flushed */
    const uint32_t depth = c->fab->cfg.sq_depth;
    for (uint32_t k = 0; k < c->sq_used; k++) {
        hw_verbs_sqe_t *e = &c->sq[(c->sq_head + k) % depth];
        if (e->state == HW_SQE_QUEUED || e->state == HW_SQE_REPOST ||
            (e->state == HW_SQE_POSTED && c->qp == NULL)) {
            e->state = HW_SQE_DONE;
            e->status = KVS_EPEER;
        }
    }
    if (c->qp == NULL)
        c->sq_posted = 0;
}

void hw_verbs_conn_fail(kvs_conn_t *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hw_verbs_conn_vfail(c, status, fmt, ap);
    va_end(ap);
}

void hw_verbs_conn_broken(kvs_conn_t *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const bool setting_up = !c->recovering && (c->net.state == HW_CONN_RESOLVING ||
                                               c->net.state == HW_CONN_CONNECTING);
    const bool unseen = !c->net.active && !c->net.user_knows;
    if (setting_up || unseen || c->peer_bye) {
        hw_verbs_conn_vfail(c, status, fmt, ap);
    } else if (c->net.state == HW_NET_CONN_UP || c->net.state == HW_CONN_ACCEPTING ||
               c->recovering) {
        const uint64_t now = hw_net_now_ns();
        if (!c->recovering) { /* a fresh failure: the clock for recovery starts */
            vsnprintf(c->net.why, sizeof c->net.why, fmt, ap);
            c->deadline_ns = hw_net_deadline_ns(now, c->fab->cfg.connect_timeout_ms);
            c->retry_ns = now + HW_VERBS_FLUSH_WAIT_NS;
            c->broken_ns = now;
            /* Said once per failure, so a stall behind it can be told apart
             * from a slow peer in the log. */
            kvs_log_write(&c->fab->cfg.log, KVS_LOG_WARN, "verbs fabric: %s: a new queue "
                          "pair replaces it; %s within %u ms", c->net.why,
                          c->net.active ? "reconnecting" : "waiting for the peer to reconnect",
                          c->fab->cfg.connect_timeout_ms);
        } else { /* a reconnect attempt failed: try again a little later */
            c->retry_ns = now + HW_VERBS_RETRY_WAIT_NS;
        }
        c->net.state = HW_CONN_RECOVERING;
        c->recovering = true;
        hw_verbs_qp_error(c);
    }
    (void)status;
    va_end(ap);
}

void hw_verbs_conn_bye(kvs_conn_t *c)
{
    c->peer_bye = true;
    hw_verbs_conn_fail(c, KVS_EPEER, "connection to %s: the peer disconnected: connect again",
                       c->net.peer);
}
