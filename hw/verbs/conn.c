/*
 * conn.c - connections of the verbs fabric: rdma_cm listener, active
 * connect, passive accept, one RC queue pair per connection driven through
 * INIT/RTR/RTS by the fabric itself (rdma_init_qp_attr + ibv_modify_qp), so
 * that both sides can set the agreed path MTU, a short RNR timer and an
 * explicit GID index; the rdma_cm event loop; recovery and teardown (how a
 * connection breaks or fails is conn_fail.c's).
 *
 * Handshake: the request carries {magic, version, this side's MTU, a token
 * naming the connection, flags}; the accepting side takes the smallest of
 * its own MTU, the requester's and the route's, moves its QP to RTS and
 * answers it in the accept; the requester moves to RTR/RTS with it and
 * completes with rdma_establish. A refusal carries a reason code the
 * requester turns into a message. Receives are posted before the QP leaves
 * INIT, so no message can arrive before a buffer waits for it.
 *
 * Recovery: RC moves a QP to the error state on the first failed request
 * (a bad key or range at the peer fails the QPs of both sides). The fabric
 * keeps the kvs_conn_t, the failed operation completes with its error, and
 * the connection goes RECOVERING: the side that connected makes a new
 * cm_id and QP and asks again with the same token and the RECONNECT flag;
 * the accepting side attaches the new QP to the same kvs_conn_t. Requests
 * the old QP flushed, and those made meanwhile, are then posted again in
 * order (post.c), so only the failed operation fails. A message may arrive
 * twice and a write may land twice (same bytes) across a recovery. Within
 * connect_timeout_ms the connection is back or it fails for good (DEAD):
 * everything pending completes with KVS_EPEER and posts return KVS_EPEER.
 * A user's disconnect sends BYE first, so the peer fails its side at once
 * instead of waiting for a reconnect.
 *
 * Lifetime: connections live in a table of max_conns slots (hw/net/
 * conn_table.h); each use of a slot and each QP gets a new generation (in
 * work request ids), so a late completion of an old QP never reaches its
 * successor. Connections the user made are freed by
 * disconnect (after their requests are reported); accepted ones that failed
 * are reclaimed when a new peer needs the slot.
 */
#include "hw_verbs.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HW_VERBS_PRIV_BYTES 24u
#define HW_VERBS_RNR_RETRY 7      /* retry forever: the peer reposts receives when it polls */
#define HW_VERBS_RETRY 7          /* transport retries before a peer counts as gone */
#define HW_VERBS_MIN_RNR_TIMER 12 /* 0.64 ms before resending into a full receive queue */
#define HW_VERBS_FLAG_RECONNECT 1u

enum hw_verbs_reject {
    HW_REJ_VERSION = 1,
    HW_REJ_FULL = 2,
    HW_REJ_DEVICE = 3,
    HW_REJ_INTERNAL = 4,
    HW_REJ_UNKNOWN = 5 /* a reconnect for a connection this side no longer has */
};

typedef struct hw_verbs_priv {
    uint8_t mtu;
    uint8_t code;
    uint8_t flags;
    uint64_t token;
} hw_verbs_priv_t;

static void hw_verbs_priv_put(uint8_t *p, const hw_verbs_priv_t *v)
{
    memset(p, 0, HW_VERBS_PRIV_BYTES);
    const uint32_t m = HW_VERBS_MAGIC;
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(m >> (8 * i));
    p[4] = (uint8_t)HW_VERBS_WIRE_VERSION;
    p[5] = (uint8_t)(HW_VERBS_WIRE_VERSION >> 8);
    p[6] = v->mtu;
    p[7] = v->code;
    for (int i = 0; i < 8; i++)
        p[8 + i] = (uint8_t)(v->token >> (8 * i));
    p[16] = v->flags;
}

/* KVS_OK and *v when p is one of ours; KVS_EPROTO if foreign; KVS_EVERSION
 * for another version of ours. */
static int hw_verbs_priv_get(const uint8_t *p, size_t len, hw_verbs_priv_t *v)
{
    if (p == NULL || len < HW_VERBS_PRIV_BYTES)
        return KVS_EPROTO;
    const uint32_t m = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                       (uint32_t)p[3] << 24;
    if (m != HW_VERBS_MAGIC)
        return KVS_EPROTO;
    if ((uint32_t)(p[4] | p[5] << 8) != HW_VERBS_WIRE_VERSION)
        return KVS_EVERSION;
    *v = (hw_verbs_priv_t){.mtu = p[6], .code = p[7], .flags = p[16]};
    for (int i = 0; i < 8; i++)
        v->token |= (uint64_t)p[8 + i] << (8 * i);
    return KVS_OK;
}

/* A token no other connection of either side is likely to have. */
static uint64_t hw_verbs_token(const kvs_conn_t *c)
{
    uint64_t x = hw_net_now_ns() ^ (uint64_t)getpid() << 40 ^
                 (uint64_t)(uintptr_t)c ^ (uint64_t)c->net.gen << 20;
    x += 0x9e3779b97f4a7c15u; /* splitmix64 finaliser */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return (x ^ (x >> 31)) | 1u;
}

/* ---- the table (hw/net/conn_table.h) ----------------------------------------- */

static void hw_verbs_conn_free_prev(kvs_conn_t *c)
{
    if (c->prev_rmr != NULL)
        (void)ibv_dereg_mr(c->prev_rmr);
    free(c->prev_rbuf);
    c->prev_rmr = NULL;
    c->prev_rbuf = NULL;
}

/* Destroys the QP (and, when drop_id, the cm_id). Requests it still had
 * go again on the next QP; its receive buffers stay readable for its
 * completions still in the CQ, and the next QP gets new ones (new gen). */
static void hw_verbs_conn_drop_qp(kvs_conn_t *c, bool drop_id)
{
    const uint32_t depth = c->fab->cfg.sq_depth;
    for (uint32_t k = 0; k < c->sq_used; k++) {
        hw_verbs_sqe_t *e = &c->sq[(c->sq_head + k) % depth];
        if (e->state == HW_SQE_POSTED)
            e->state = HW_SQE_REPOST;
    }
    c->sq_posted = 0;
    c->rq_posted = 0;
    if (c->qp != NULL && c->stale_qp == NULL && hw_verbs_grants_hold(c))
        c->stale_qp = c->qp; /* destroyed once its windows are rebound (grant.c) */
    else if (c->qp != NULL)
        (void)ibv_destroy_qp(c->qp);
    c->qp = NULL;
    if (drop_id && c->id != NULL)
        (void)rdma_destroy_id(c->id);
    if (drop_id)
        c->id = NULL;
    hw_verbs_conn_free_prev(c);
    c->prev_rbuf = c->rbuf;
    c->prev_rmr = c->rmr;
    c->prev_gen = c->net.gen & 0xffffu;
    c->rbuf = NULL;
    c->rmr = NULL;
    c->net.gen++;
}

void hw_verbs_conn_free(kvs_conn_t *c)
{
    hw_verbs_grants_conn_gone(c); /* windows before the QP they are bound to */
    if (c->stale_qp != NULL)
        (void)ibv_destroy_qp(c->stale_qp);
    if (c->qp != NULL)
        (void)ibv_destroy_qp(c->qp);
    if (c->id != NULL)
        (void)rdma_destroy_id(c->id);
    if (c->smr != NULL)
        (void)ibv_dereg_mr(c->smr);
    if (c->rmr != NULL)
        (void)ibv_dereg_mr(c->rmr);
    free(c->sbuf);
    free(c->rbuf);
    free(c->sq);
    hw_verbs_conn_free_prev(c);
    hw_rkeys_free(&c->rkeys);
    /* a FREE slot holds nothing of the connection it was but the table's part */
    const hw_net_conn_t net = c->net;
    hw_verbs_fabric_t *f = c->fab;
    *c = (kvs_conn_t){.net = net, .fab = f};
    hw_net_conn_free(&c->net);
}

/* A FREE slot, else the slot of an accepted connection that failed and
 * has nothing left to report, made a new connection in `state`; NULL when
 * neither is left. */
static kvs_conn_t *hw_verbs_conn_alloc(hw_verbs_fabric_t *f, hw_verbs_conn_state_t state)
{
    kvs_conn_t *c = hw_net_conn_alloc(&f->connt, (int)state);
    for (uint32_t i = 0; i < f->cfg.max_conns && c == NULL; i++) {
        kvs_conn_t *r = &f->conns[i];
        if (r->net.state == HW_NET_CONN_DEAD && !r->net.active && r->sq_used == 0) {
            hw_verbs_conn_free(r); /* late completions of its QP are dropped by generation */
            c = hw_net_conn_alloc(&f->connt, (int)state);
        }
    }
    if (c != NULL)
        c->fab = f;
    return c;
}

/* ---- queue pair ------------------------------------------------------------- */

int hw_verbs_post_recv(kvs_conn_t *c, uint32_t index)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)(c->rbuf + (size_t)index * KVS_CONTROL_MSG_MAX_BYTES),
        .length = KVS_CONTROL_MSG_MAX_BYTES,
        .lkey = c->rmr->lkey,
    };
    struct ibv_recv_wr wr = {
        .wr_id = UINT64_C(1) << 63 | (uint64_t)hw_net_conn_token(&c->net) << 16 | index,
        .sg_list = &sge,
        .num_sge = 1,
    };
    struct ibv_recv_wr *bad = NULL;
    int rc = ibv_post_recv(c->qp, &wr, &bad);
    if (rc != 0)
        return rc;
    c->rq_posted++;
    return 0;
}

/* The connection's buffers (receive buffers again for each new QP).
 * Returns 0 or an errno, *step says what. */
static int hw_verbs_conn_buffers(kvs_conn_t *c, const char **step)
{
    hw_verbs_fabric_t *f = c->fab;
    const kvs_verbs_config_t *cfg = &f->cfg;
    const size_t rbytes = (size_t)cfg->recv_depth * KVS_CONTROL_MSG_MAX_BYTES;
    *step = "allocating connection buffers";
    if (c->sq == NULL)
        c->sq = calloc(cfg->sq_depth, sizeof *c->sq);
    if (c->sbuf == NULL)
        c->sbuf = malloc(cfg->send_buf_bytes);
    if (c->rbuf == NULL)
        c->rbuf = malloc(rbytes);
    if (c->sq == NULL || c->sbuf == NULL || c->rbuf == NULL)
        return ENOMEM;
    *step = "registering connection buffers (ibv_reg_mr)";
    errno = 0;
    if (c->smr == NULL)
        c->smr = ibv_reg_mr(f->pd, c->sbuf, cfg->send_buf_bytes, IBV_ACCESS_LOCAL_WRITE);
    if (c->rmr == NULL)
        c->rmr = ibv_reg_mr(f->pd, c->rbuf, rbytes, IBV_ACCESS_LOCAL_WRITE);
    if (c->smr == NULL || c->rmr == NULL)
        return errno != 0 ? errno : ENOMEM;
    return 0;
}

/* Buffers, the QP, posted receives, INIT. Returns 0 or an errno with
 * *step naming what failed. */
static int hw_verbs_conn_setup(kvs_conn_t *c, const char **step)
{
    hw_verbs_fabric_t *f = c->fab;
    const kvs_verbs_config_t *cfg = &f->cfg;
    int rc = hw_verbs_conn_buffers(c, step);
    if (rc != 0)
        return rc;
    *step = "creating the queue pair (ibv_create_qp)";
    struct ibv_qp_init_attr qa = {
        .send_cq = f->cq,
        .recv_cq = f->cq,
        .cap = {.max_send_wr = cfg->sq_depth, .max_recv_wr = cfg->recv_depth,
                .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    c->qp = ibv_create_qp(f->pd, &qa);
    if (c->qp == NULL)
        return errno != 0 ? errno : ENOMEM;
    *step = "moving the queue pair to INIT";
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT};
    int mask = 0;
    if (rdma_init_qp_attr(c->id, &attr, &mask) != 0)
        return errno != 0 ? errno : EINVAL;
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    mask |= IBV_QP_ACCESS_FLAGS;
    rc = ibv_modify_qp(c->qp, &attr, mask);
    if (rc != 0)
        return rc;
    *step = "posting receives (ibv_post_recv)";
    for (uint32_t i = 0; i < cfg->recv_depth; i++) {
        rc = hw_verbs_post_recv(c, i);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* RTR with the agreed MTU, then RTS. */
static int hw_verbs_conn_rts(kvs_conn_t *c, int mtu, const char **step)
{
    hw_verbs_fabric_t *f = c->fab;
    *step = "moving the queue pair to RTR";
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RTR};
    int mask = 0;
    if (rdma_init_qp_attr(c->id, &attr, &mask) != 0)
        return errno != 0 ? errno : EINVAL;
    attr.path_mtu = (enum ibv_mtu)mtu;
    attr.min_rnr_timer = HW_VERBS_MIN_RNR_TIMER;
    mask |= IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER;
    if (f->cfg.gid_index != KVS_VERBS_GID_AUTO && attr.ah_attr.is_global)
        attr.ah_attr.grh.sgid_index = (uint8_t)f->gid_index;
    int rc = ibv_modify_qp(c->qp, &attr, mask);
    if (rc != 0)
        return rc;
    *step = "moving the queue pair to RTS";
    memset(&attr, 0, sizeof attr);
    attr.qp_state = IBV_QPS_RTS;
    mask = 0;
    if (rdma_init_qp_attr(c->id, &attr, &mask) != 0)
        return errno != 0 ? errno : EINVAL;
    attr.retry_cnt = HW_VERBS_RETRY;
    attr.rnr_retry = HW_VERBS_RNR_RETRY;
    mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
    c->mtu = mtu;
    return ibv_modify_qp(c->qp, &attr, mask);
}

/* The route's MTU as rdma_cm computed it (RoCE: from the netdev MTU). */
static int hw_verbs_route_mtu(kvs_conn_t *c)
{
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RTR};
    int mask = 0;
    if (rdma_init_qp_attr(c->id, &attr, &mask) != 0 || (mask & IBV_QP_PATH_MTU) == 0)
        return IBV_MTU_4096;
    return attr.path_mtu;
}

static int hw_verbs_min_mtu(int a, int b) { return a < b ? a : b; }

static void hw_verbs_addr_text(struct sockaddr *sa, char *buf, size_t n)
{
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (sa == NULL || getnameinfo(sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                : sizeof(struct sockaddr_in),
                                  host, sizeof host, serv, sizeof serv,
                                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(buf, n, "?");
        return;
    }
    snprintf(buf, n, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

/* A new QP is up: what waited in the ring goes now. */
static void hw_verbs_conn_up(kvs_conn_t *c)
{
    c->net.state = HW_NET_CONN_UP;
    if (c->recovering) {
        c->recovering = false;
        c->recoveries++;
        kvs_log_write(&c->fab->cfg.log, KVS_LOG_INFO, "verbs fabric: connection to %s "
                      "re-established after %.1f ms (recovery %u)", c->net.peer,
                      (double)(hw_net_now_ns() - c->broken_ns) / 1e6, c->recoveries);
        hw_verbs_sq_flush(c);
    }
}

/* Connect or accept parameters of c's QP carrying v in priv. */
static void hw_verbs_conn_param(const kvs_conn_t *c, const hw_verbs_priv_t *v,
                                uint8_t priv[HW_VERBS_PRIV_BYTES], struct rdma_conn_param *out)
{
    hw_verbs_priv_put(priv, v);
    *out = (struct rdma_conn_param){
        .private_data = priv,
        .private_data_len = HW_VERBS_PRIV_BYTES,
        .retry_count = HW_VERBS_RETRY,
        .rnr_retry_count = HW_VERBS_RNR_RETRY,
        .qp_num = c->qp->qp_num,
    };
}

/* ---- passive side ----------------------------------------------------------- */

static void hw_verbs_reject(struct rdma_cm_id *id, uint8_t code, bool destroy)
{
    uint8_t priv[HW_VERBS_PRIV_BYTES];
    hw_verbs_priv_put(priv, &(hw_verbs_priv_t){.code = code});
    (void)rdma_reject(id, priv, sizeof priv);
    if (destroy)
        (void)rdma_destroy_id(id);
}

/* The passive connection a reconnect request names, if this side still has it. */
static kvs_conn_t *hw_verbs_find_token(hw_verbs_fabric_t *f, uint64_t token)
{
    for (uint32_t i = 0; i < f->cfg.max_conns; i++) {
        kvs_conn_t *c = &f->conns[i];
        if (!c->net.active && c->token == token && c->net.state != HW_NET_CONN_FREE &&
            c->net.state != HW_NET_CONN_DEAD && c->net.state != HW_CONN_CLOSING)
            return c;
    }
    return NULL;
}

static void hw_verbs_on_request(hw_verbs_fabric_t *f, struct rdma_cm_id *id,
                                const uint8_t *priv, size_t priv_len)
{
    hw_verbs_priv_t req;
    if (hw_verbs_priv_get(priv, priv_len, &req) != KVS_OK) {
        hw_verbs_reject(id, HW_REJ_VERSION, true);
        return;
    }
    if (id->verbs != f->ctx) {
        hw_verbs_reject(id, HW_REJ_DEVICE, true);
        return;
    }
    kvs_conn_t *c = NULL;
    if (req.flags & HW_VERBS_FLAG_RECONNECT) {
        c = hw_verbs_find_token(f, req.token);
        if (c == NULL) {
            hw_verbs_reject(id, HW_REJ_UNKNOWN, true);
            return;
        }
        if (!c->recovering) /* its failure has not reached this side's CQ yet */
            hw_verbs_conn_broken(c, KVS_EPEER, "connection to %s: the peer reconnects",
                                 c->net.peer);
        hw_verbs_conn_drop_qp(c, true);
    } else {
        c = hw_verbs_conn_alloc(f, HW_CONN_ACCEPTING);
        if (c == NULL) {
            hw_verbs_reject(id, HW_REJ_FULL, true);
            return;
        }
        c->token = req.token;
        hw_verbs_addr_text(rdma_get_peer_addr(id), c->net.peer, sizeof c->net.peer);
    }
    c->id = id;
    id->context = c;
    c->net.state = HW_CONN_ACCEPTING;
    const char *step = "";
    int err = hw_verbs_conn_setup(c, &step);
    int mtu = hw_verbs_min_mtu(f->port_mtu, hw_verbs_route_mtu(c));
    if (req.mtu >= IBV_MTU_256 && req.mtu <= IBV_MTU_4096)
        mtu = hw_verbs_min_mtu(mtu, req.mtu);
    if (err == 0)
        err = hw_verbs_conn_rts(c, mtu, &step);
    if (err == 0 && c->recovering)
        hw_verbs_grants_rebind(c); /* before the peer may write again */
    if (err == 0) {
        uint8_t rep[HW_VERBS_PRIV_BYTES];
        struct rdma_conn_param param;
        hw_verbs_conn_param(c, &(hw_verbs_priv_t){.mtu = (uint8_t)mtu, .token = c->token}, rep,
                            &param);
        step = "accepting (rdma_accept)";
        err = rdma_accept(id, &param) == 0 ? 0 : (errno != 0 ? errno : EINVAL);
        if (err == 0)
            return;
    } else {
        hw_verbs_reject(id, HW_REJ_INTERNAL, false);
    }
    kvs_fabric_fail(&f->base, hw_verbs_errno_status(err), err, "accepting %s failed while %s: "
                    "%s", c->net.peer, step, strerror(err));
    if (c->recovering) { /* the peer tries again */
        hw_verbs_conn_drop_qp(c, true);
        hw_verbs_conn_broken(c, KVS_EPEER, "connection to %s: accepting its reconnect failed",
                             c->net.peer);
    } else {
        hw_verbs_conn_free(c); /* the user never saw it */
    }
}

/* ---- the event loop --------------------------------------------------------- */

static const char *hw_verbs_reject_text(uint8_t code)
{
    switch (code) {
    case HW_REJ_VERSION:
        return "it runs another kvstage verbs protocol version: run the same kvstage on "
               "both sides";
    case HW_REJ_FULL:
        return "it has no free connection slot: raise its max_conns";
    case HW_REJ_DEVICE:
        return "the address reached another RDMA device of the peer than the one it "
               "listens with: connect to the address of its fabric";
    case HW_REJ_UNKNOWN:
        return "it no longer has this connection (it disconnected or restarted): connect "
               "again";
    default:
        return "it failed to set up the connection: see the peer's log";
    }
}

static void hw_verbs_on_response(kvs_conn_t *c, const uint8_t *priv, size_t len)
{
    hw_verbs_priv_t rep;
    if (hw_verbs_priv_get(priv, len, &rep) != KVS_OK || rep.mtu < IBV_MTU_256 ||
        rep.mtu > IBV_MTU_4096 || rep.mtu > c->fab->port_mtu) {
        hw_verbs_conn_fail(c, KVS_EPROTO, "connecting to %s: the peer's answer is not a "
                           "kvstage verbs fabric's: connect to a kvstage fabric's address",
                           c->net.peer);
        return;
    }
    const char *step = "";
    int err = hw_verbs_conn_rts(c, rep.mtu, &step);
    if (err == 0 && c->recovering)
        hw_verbs_grants_rebind(c); /* before the peer may write again */
    if (err == 0 && rdma_establish(c->id) != 0) {
        step = "completing the connection (rdma_establish)";
        err = errno != 0 ? errno : EINVAL;
    }
    if (err != 0) {
        hw_verbs_conn_broken(c, hw_verbs_errno_status(err), "connecting to %s failed while "
                             "%s: %s", c->net.peer, step, strerror(err));
        return;
    }
    hw_verbs_conn_up(c);
}

static void hw_verbs_on_route(kvs_conn_t *c)
{
    hw_verbs_fabric_t *f = c->fab;
    const char *step = "";
    int err = hw_verbs_conn_setup(c, &step);
    if (err == 0) {
        uint8_t priv[HW_VERBS_PRIV_BYTES];
        struct rdma_conn_param param;
        hw_verbs_conn_param(c, &(hw_verbs_priv_t){.mtu = (uint8_t)f->port_mtu,
                                                  .token = c->token,
                                                  .flags = c->recovering
                                                               ? HW_VERBS_FLAG_RECONNECT
                                                               : 0},
                            priv, &param);
        step = "sending the connection request (rdma_connect)";
        if (rdma_connect(c->id, &param) != 0)
            err = errno != 0 ? errno : EINVAL;
    }
    if (err != 0) {
        hw_verbs_conn_broken(c, hw_verbs_errno_status(err), "connecting to %s failed while "
                             "%s: %s", c->net.peer, step, strerror(err));
        return;
    }
    c->net.state = HW_CONN_CONNECTING;
}

/* Milliseconds to c's deadline for rdma_cm's timeouts: 1 to 60000. */
static uint32_t hw_verbs_ms_left(const kvs_conn_t *c, uint64_t now)
{
    const int ms = hw_net_ms_until(now, c->deadline_ns, 60000);
    return ms > 0 ? (uint32_t)ms : 1;
}

typedef struct hw_verbs_event {
    enum rdma_cm_event_type type;
    int status;
    struct rdma_cm_id *id;
    uint8_t priv[64];
    size_t priv_len;
} hw_verbs_event_t;

static void hw_verbs_on_event(hw_verbs_fabric_t *f, const hw_verbs_event_t *e)
{
    if (e->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
        hw_verbs_on_request(f, e->id, e->priv, e->priv_len);
        return;
    }
    kvs_conn_t *c = e->id != NULL ? e->id->context : NULL;
    if (e->type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
        for (uint32_t i = 0; i < f->cfg.max_conns; i++)
            hw_verbs_conn_fail(&f->conns[i], KVS_EBACKEND, "RDMA device %s was removed: "
                               "create the fabric again on a present device", f->device_name);
        return;
    }
    if (c == NULL || hw_net_conns_of(&f->connt, c) != c || c->id != e->id)
        return; /* the listener's, or of a QP already replaced or freed */
    switch (e->type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (c->net.state != HW_CONN_RESOLVING)
            break;
        if (c->id->verbs != f->ctx) {
            hw_verbs_conn_fail(c, KVS_EINVAL, "connecting to %s: it is reached through "
                               "another RDMA device than %s: connect to an address on %s's "
                               "network, or select the other device", c->net.peer,
                               f->device_name, f->device_name);
            break;
        }
        if (rdma_resolve_route(c->id, (int)hw_verbs_ms_left(c, hw_net_now_ns())) != 0)
            hw_verbs_conn_broken(c, hw_verbs_errno_status(errno), "connecting to %s: "
                                 "rdma_resolve_route failed: %s", c->net.peer, strerror(errno));
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        if (c->net.state == HW_CONN_RESOLVING)
            hw_verbs_on_route(c);
        break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        if (c->net.state == HW_CONN_CONNECTING)
            hw_verbs_on_response(c, e->priv, e->priv_len);
        break;
    case RDMA_CM_EVENT_ESTABLISHED:
        if (c->net.state == HW_CONN_ACCEPTING || c->net.state == HW_CONN_CONNECTING)
            hw_verbs_conn_up(c);
        break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
        hw_verbs_conn_broken(c, KVS_EPEER, "connecting to %s: no route from %s (status %d): "
                             "the peer's address must be reachable through RDMA device %s; "
                             "check the address", c->net.peer, f->bind_addr, e->status,
                             f->device_name);
        break;
    case RDMA_CM_EVENT_REJECTED: {
        hw_verbs_priv_t rej;
        if (hw_verbs_priv_get(e->priv, e->priv_len, &rej) == KVS_OK && rej.code != 0) {
            if (rej.code == HW_REJ_UNKNOWN || !c->recovering)
                hw_verbs_conn_fail(c, KVS_EPEER, "connecting to %s: refused by the peer: %s",
                                   c->net.peer, hw_verbs_reject_text(rej.code));
            else
                hw_verbs_conn_broken(c, KVS_EPEER, "reconnecting to %s: refused by the peer: "
                                     "%s", c->net.peer, hw_verbs_reject_text(rej.code));
        } else {
            hw_verbs_conn_broken(c, KVS_EPEER, "connecting to %s: refused (status %d): nothing "
                                 "listens there; start the peer first and check its address "
                                 "and port", c->net.peer, e->status);
        }
        break;
    }
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
        hw_verbs_conn_broken(c, KVS_EPEER, "connection to %s failed: the peer did not answer "
                             "(status %d): check that it runs and the network", c->net.peer,
                             e->status);
        break;
    case RDMA_CM_EVENT_DISCONNECTED:
        (void)rdma_disconnect(c->id);
        hw_verbs_conn_broken(c, KVS_EPEER, "connection to %s: the peer disconnected: connect "
                             "again", c->net.peer);
        break;
    default:
        break;
    }
    /* An accepted connection the user never saw is dropped when it fails. */
    if (c->net.state == HW_NET_CONN_DEAD && !c->net.active && !c->net.user_knows && c->sq_used == 0)
        hw_verbs_conn_free(c);
}

int hw_verbs_cm_drain(hw_verbs_fabric_t *f)
{
    for (;;) {
        struct rdma_cm_event *ev = NULL;
        if (rdma_get_cm_event(f->ch, &ev) != 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return KVS_OK;
            return kvs_fabric_fail(&f->base, KVS_EBACKEND, errno, "reading connection events "
                                   "of %s failed: %s", f->device_name, strerror(errno));
        }
        hw_verbs_event_t e = {.type = ev->event, .status = ev->status, .id = ev->id};
        if (ev->param.conn.private_data != NULL) {
            e.priv_len = ev->param.conn.private_data_len < sizeof e.priv
                             ? ev->param.conn.private_data_len
                             : sizeof e.priv;
            memcpy(e.priv, ev->param.conn.private_data, e.priv_len);
        }
        (void)rdma_ack_cm_event(ev);
        hw_verbs_on_event(f, &e);
    }
}

/* ---- active side -------------------------------------------------------------- */

/* "a.b.c.d:port", "[v6]:port" or "name:port" -> resolved address. */
/* A new cm_id asking the peer again (first connect or reconnect). */
static int hw_verbs_resolve(kvs_conn_t *c, int *err)
{
    hw_verbs_fabric_t *f = c->fab;
    struct sockaddr_storage src;
    if (hw_net_bind_sockaddr(f->bind_addr, 0, &src) != KVS_OK) {
        *err = EINVAL;
        return KVS_EINVAL;
    }
    if (rdma_create_id(f->ch, &c->id, c, RDMA_PS_TCP) != 0) {
        *err = errno;
        c->id = NULL;
        return hw_verbs_errno_status(*err);
    }
    c->net.state = HW_CONN_RESOLVING;
    const uint32_t ms = hw_verbs_ms_left(c, hw_net_now_ns());
    if (rdma_resolve_addr(c->id, (struct sockaddr *)&src, (struct sockaddr *)&c->dst,
                          (int)ms) != 0) {
        *err = errno;
        return KVS_EPEER;
    }
    return KVS_OK;
}

int hw_verbs_connect(kvs_fabric_t *fab, const char *peer, kvs_conn_t **out)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    struct sockaddr_storage dst, src;
    int rc = hw_net_conn_peer(&f->connt, peer, out, &dst);
    if (rc != KVS_OK)
        return rc;
    if (hw_net_bind_sockaddr(f->bind_addr, 0, &src) != KVS_OK)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "connect on %s: bind address '%s' is not "
                               "an IP address", f->device_name, f->bind_addr);
    if (src.ss_family != dst.ss_family)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "connect on %s: peer '%s' and this "
                               "fabric's address %s are of different IP families: use an "
                               "address of the same family", f->device_name, peer,
                               f->bind_addr);
    kvs_conn_t *c = hw_verbs_conn_alloc(f, HW_CONN_RESOLVING);
    if (c == NULL)
        return hw_net_conn_full(&f->connt);
    c->net.active = true;
    c->dst = dst;
    c->token = hw_verbs_token(c);
    snprintf(c->net.peer, sizeof c->net.peer, "%s", peer);
    c->deadline_ns = hw_net_deadline_ns(hw_net_now_ns(), f->cfg.connect_timeout_ms);
    int err = 0;
    rc = hw_verbs_resolve(c, &err);
    if (rc != KVS_OK) {
        hw_verbs_conn_free(c);
        return kvs_fabric_fail(fab, rc, err, "connecting to %s: rdma_cm could not start (%s): "
                               "check the address is reachable from %s", peer, strerror(err),
                               f->bind_addr);
    }
    while (c->net.state == HW_CONN_RESOLVING || c->net.state == HW_CONN_CONNECTING) {
        rc = hw_verbs_cm_drain(f);
        if (rc != KVS_OK)
            break;
        if (c->net.state != HW_CONN_RESOLVING && c->net.state != HW_CONN_CONNECTING)
            break;
        const uint64_t now = hw_net_now_ns();
        if (now >= c->deadline_ns) {
            hw_verbs_conn_fail(c, KVS_ETIMEDOUT, "connecting to %s: no answer within %u ms: "
                               "check that the peer runs and listens on that address and "
                               "port, or raise connect_timeout_ms", peer,
                               f->cfg.connect_timeout_ms);
            break;
        }
        struct pollfd pfd = {.fd = f->ch->fd, .events = POLLIN};
        const uint32_t ms = hw_verbs_ms_left(c, now);
        (void)poll(&pfd, 1, ms < 100 ? (int)ms : 100);
    }
    char why[KVS_ERROR_MSG_BYTES];
    if (rc == KVS_OK && c->net.state == HW_NET_CONN_UP) {
        c->net.user_knows = true;
        rc = hw_verbs_keys_push_all(f, c);
        if (rc == KVS_OK) {
            *out = c;
            return KVS_OK;
        }
        snprintf(why, sizeof why, "%s", f->base.last_backend_msg);
        hw_verbs_conn_fail(c, rc, "connecting to %s: sending this side's key tables failed: %s",
                           peer, why);
    }
    if (rc == KVS_OK)
        rc = c->net.dead_status != KVS_OK ? c->net.dead_status : KVS_EPEER;
    snprintf(why, sizeof why, "%s", c->net.why[0] ? c->net.why : f->base.last_backend_msg);
    hw_verbs_conn_free(c);
    return kvs_fabric_fail(fab, rc, 0, "%s", why);
}

void hw_verbs_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    kvs_conn_t *c = hw_net_conns_of(&f->connt, conn);
    if (c == NULL || c->net.state == HW_CONN_CLOSING)
        return;
    const bool up = hw_verbs_conn_ready(c);
    /* BYE first, so that the peer fails its side at once; the connection
     * closes when it has been delivered (or after connect_timeout_ms). */
    if (up && hw_verbs_send_internal(c, HW_VERBS_CTRL_BYE, NULL, 0) == KVS_OK) {
        c->net.state = HW_CONN_CLOSING;
        c->bye_sent = true;
        c->recovering = false;
        c->deadline_ns = hw_net_deadline_ns(hw_net_now_ns(), f->cfg.connect_timeout_ms);
        snprintf(c->net.why, sizeof c->net.why, "connection to %s was disconnected by this side",
                 c->net.peer);
        return;
    }
    if (c->net.state == HW_NET_CONN_UP || c->net.state == HW_CONN_ACCEPTING)
        (void)rdma_disconnect(c->id); /* tells the peer; an error here changes nothing */
    hw_verbs_conn_fail(c, KVS_EPEER, "connection to %s was disconnected by this side",
                       c->net.peer);
    c->net.state = HW_CONN_CLOSING;
    c->bye_sent = false;
    if (c->sq_used == 0) /* else tick frees it once its requests are reported */
        hw_verbs_conn_free(c);
}

void hw_verbs_conn_tick(hw_verbs_fabric_t *f)
{
    const uint64_t now = hw_net_now_ns();
    for (uint32_t i = 0; i < f->cfg.max_conns; i++) {
        kvs_conn_t *c = &f->conns[i];
        if (c->net.state == HW_CONN_CLOSING) {
            if (c->sq_used == 0) {
                hw_verbs_conn_free(c); /* destroying the id disconnects */
            } else if (c->bye_sent && now >= c->deadline_ns) {
                c->bye_sent = false; /* the BYE is stuck: flush everything */
                hw_verbs_qp_error(c);
            }
            continue;
        }
        if (!c->recovering)
            continue;
        if (now >= c->deadline_ns) {
            char why[HW_NET_WHY_BYTES];
            snprintf(why, sizeof why, "%s", c->net.why);
            hw_verbs_conn_fail(c, KVS_EPEER, "%.120s, and it was not re-established within "
                               "%u ms: check the peer; disconnect and connect again", why,
                               f->cfg.connect_timeout_ms);
            continue;
        }
        if (c->net.state != HW_CONN_RECOVERING || !c->net.active || now < c->retry_ns)
            continue;
        /* the old QP's flushes, or their time, are over: ask again */
        hw_verbs_conn_drop_qp(c, true);
        int err = 0;
        if (hw_verbs_resolve(c, &err) != KVS_OK) {
            if (c->id != NULL)
                (void)rdma_destroy_id(c->id);
            c->id = NULL;
            c->net.state = HW_CONN_RECOVERING;
            c->retry_ns = now + HW_VERBS_RETRY_WAIT_NS;
        }
    }
}

/* ---- the listener ------------------------------------------------------------- */

int hw_verbs_listen(hw_verbs_fabric_t *f, char *why, size_t why_bytes)
{
    struct sockaddr_storage sa;
    if (hw_net_bind_sockaddr(f->bind_addr, f->cfg.listen_port, &sa) != KVS_OK) {
        snprintf(why, why_bytes, "bind address '%s' is not an IP address: set bind_addr to "
                 "an IP of the RDMA device's netdev", f->bind_addr);
        return KVS_EINVAL;
    }
    if (rdma_create_id(f->ch, &f->listener, NULL, RDMA_PS_TCP) != 0) {
        snprintf(why, why_bytes, "rdma_create_id failed: %s: load rdma_ucm (modprobe "
                 "rdma_ucm) and check /dev/infiniband/rdma_cm", strerror(errno));
        f->listener = NULL;
        return KVS_EBACKEND;
    }
    if (rdma_bind_addr(f->listener, (struct sockaddr *)&sa) != 0) {
        const int err = errno;
        snprintf(why, why_bytes, err == EADDRINUSE
                 ? "rdma_cm port %u on %s is in use: choose another listen_port (0: any)"
                 : "binding rdma_cm to %2$s port %1$u failed: %3$s: set bind_addr to an IP "
                   "of the RDMA device's netdev",
                 f->cfg.listen_port, f->bind_addr, strerror(err));
        return err == EADDRINUSE ? KVS_EINVAL : KVS_EBACKEND;
    }
    if (f->listener->verbs != f->ctx) {
        snprintf(why, why_bytes, "address %s does not belong to RDMA device %s: set bind_addr "
                 "to an IP of its netdev, or select the device that owns %s", f->bind_addr,
                 f->device_name, f->bind_addr);
        return KVS_EINVAL;
    }
    if (rdma_listen(f->listener, (int)f->cfg.max_conns) != 0) {
        snprintf(why, why_bytes, "rdma_listen on %s failed: %s", f->bind_addr,
                 strerror(errno));
        return KVS_EBACKEND;
    }
    const unsigned port = ntohs(rdma_get_src_port(f->listener));
    snprintf(f->address, sizeof f->address, strchr(f->bind_addr, ':') ? "[%s]:%u" : "%s:%u",
             f->bind_addr, port);
    return KVS_OK;
}
