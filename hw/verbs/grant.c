/*
 * grant.c - region-scoped remote keys (fabric ops version 4: key_grant,
 * key_revoke) as verbs type-2 memory windows: one window per grant, over
 * the range of one MR piece, bound to the grant's connection's queue pair,
 * so that only that peer, on that QP, and only inside the range can write
 * under its key (the responder checks the window's QP, state and range;
 * for rxe's range see below).
 *
 * Grant: ibv_alloc_mw(pd, IBV_MW_TYPE_2), then an IBV_WR_BIND_MW work
 * request (key ibv_inc_rkey of the window's) in the connection's send ring,
 * behind what is there and ahead of what follows. The send queue runs its
 * requests in order and a bind is a local operation that takes effect when
 * the queue reaches it, before the next request is sent; so the SEND that
 * carries the key to the peer (the core's STAGING_RSP, posted after
 * key_grant returns) leaves only after the window is bound, and no fence is
 * needed (IBV_SEND_FENCE orders a request behind earlier RDMA READs and
 * atomics, of which there are none). The bind's completion is the
 * fabric's (poll.c marks the grant bound or broken), never the user's.
 *
 * Revoke: ibv_dealloc_mw, not IBV_WR_LOCAL_INV. A local invalidate takes
 * effect when the send queue reaches it, and key_revoke would have to wait
 * for its completion on the shared CQ (stashing everyone else's) to keep
 * its promise that no write lands after it returns. Deallocating is a
 * synchronous command to the device: the window and its key are gone when
 * it returns (rxe removes it from its index first, so the responder finds
 * no window for the key). It is one call whatever state the connection is
 * in (up, recovering, dead), and the window is not reused, so a stale key
 * cannot open a later grant's window through it. A bind of the grant still
 * waiting in the ring is cancelled; one on the QP whose completion has not
 * come is waited for (bounded, 100 ms; receives polled meanwhile are kept
 * for poll), since a bind that runs after its window is gone fails and
 * takes the QP down (the connection then recovers, conn.c). The core
 * revokes long after the bind ran, once the region's data arrived, so the
 * wait is for error paths (a grant revoked at once).
 *
 * Recovery: a type-2 window stays bound to the QP that bound it. When a
 * connection gets a new QP, each bound window of it is invalidated and
 * bound again with the same key on the new QP (IBV_WR_LOCAL_INV then
 * IBV_WR_BIND_MW) ahead of everything waiting in the ring, so the peer's
 * key keeps working. The replaced QP is destroyed only after that (the
 * connection keeps it as stale_qp): rxe waits for a destroyed QP's last
 * reference, and a window bound to it is one, so destroying it first
 * stalled poll for seconds. A bind or rebind that fails marks the grant broken:
 * its key opens nothing (writes under it fail at the writer with
 * KVS_EREMOTE), which is the safe side, and it is not tried again.
 *
 * soft-RoCE checks a window's key, QP, state and access but not its range:
 * its responder (check_rkey in drivers/infiniband/sw/rxe/rxe_resp.c, 6.1)
 * checks the address against the window's MR instead. On soft-RoCE
 * (vendor id 0xffffff) each grant therefore binds its window over an MR of
 * its own that covers exactly the granted range (ibv_reg_mr of those
 * bytes, which are registered already), so that the range check rxe does
 * make is the grant's. Hardware that checks windows itself binds over the
 * registration's MR and registers nothing (f->mw_own_mr).
 *
 * Grants whose connection is freed lose their window at once; the slot
 * stays until key_revoke. A registration with live grants refuses
 * mr_deregister (KVS_EBUSY). Destroy deallocates every window.
 */
#include "hw_verbs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define HW_VERBS_GRANT_SETTLE_NS 100000000ull /* 100 ms: a bind in flight at revoke */

/* Deallocates g's window, then its own MR (the window holds it). */
static int hw_verbs_grant_release(kvs_grant_t *g)
{
    int err = 0;
    if (g->mw != NULL)
        err = ibv_dealloc_mw(g->mw);
    if (g->own_mr != NULL && err == 0)
        (void)ibv_dereg_mr(g->own_mr);
    g->mw = NULL;
    g->own_mr = NULL;
    return err;
}

static kvs_grant_t *hw_verbs_grant_of(hw_verbs_fabric_t *f, kvs_grant_t *g)
{
    const uintptr_t b = (uintptr_t)f->grants, q = (uintptr_t)g;
    if (g == NULL || f->grants == NULL || q < b || (q - b) % sizeof *g != 0 ||
        (q - b) / sizeof *g >= f->cfg.max_grants || !g->live)
        return NULL;
    return g;
}

int hw_verbs_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                       uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    if (out == NULL || out_rkey == NULL || len_bytes == 0)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: %s", f->device_name,
                               len_bytes == 0 ? "len_bytes is 0: grant a non-empty range"
                                              : "out and out_rkey must not be NULL");
    int rc = hw_verbs_check_conn(f, conn, "key_grant");
    if (rc != KVS_OK)
        return rc;
    if (hw_net_mrs_of(&f->mrt, mr) == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: mr is not a live "
                               "registration of this fabric", f->device_name);
    kvs_mr_t *m = mr;
    if (!hw_net_mr_holds(&m->net, addr, len_bytes))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: [0x%llx, +%llu) is not "
                               "inside its registration [0x%llx, +%llu): grant part of mr",
                               f->device_name, (unsigned long long)addr,
                               (unsigned long long)len_bytes, (unsigned long long)m->net.addr,
                               (unsigned long long)m->net.len_bytes);
    if (!f->mw_type2)
        return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "key_grant on %s: the device does not "
                               "report type-2 memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B): "
                               "no region-scoped keys on it", f->device_name);
    const uint64_t i = (addr - m->net.addr) / m->net.piece_bytes;
    if ((addr + len_bytes - 1 - m->net.addr) / m->net.piece_bytes != i)
        return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "key_grant on %s: [0x%llx, +%llu) "
                               "crosses a piece boundary of a split registration (pieces of "
                               "%llu bytes) and a memory window covers one MR: raise "
                               "max_mr_bytes", f->device_name, (unsigned long long)addr,
                               (unsigned long long)len_bytes,
                               (unsigned long long)m->net.piece_bytes);
    kvs_grant_t *g = NULL;
    for (uint32_t k = 0; k < f->cfg.max_grants; k++) {
        if (!f->grants[k].live) {
            g = &f->grants[k];
            break;
        }
    }
    if (g == NULL)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "key_grant on %s: all %u grants are live: "
                               "revoke some or raise max_grants", f->device_name,
                               f->cfg.max_grants);
    if (conn->sq_used == f->cfg.sq_depth)
        return kvs_fabric_fail(fab, KVS_EAGAIN, 0, "key_grant on %s: the send queue to %s is "
                               "full (sq_depth %u) and the bind needs a work request: poll "
                               "completions, then retry", f->device_name, conn->net.peer,
                               f->cfg.sq_depth);
    struct ibv_mr *own = NULL;
    if (f->mw_own_mr) {
        if (m->dmabuf)
            return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "key_grant on %s: a window's own MR "
                                   "over device memory (dma-buf) is not supported",
                                   f->device_name);
        errno = 0;
        /* no remote access of its own: its rkey is never sent, and only
         * the window bound over it (to conn's queue pair) opens it */
        own = ibv_reg_mr(f->pd, (void *)(uintptr_t)addr, len_bytes,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
        if (own == NULL) {
            const int err = errno != 0 ? errno : EINVAL;
            return kvs_fabric_fail(fab, KVS_EBACKEND, err, "key_grant on %s: ibv_reg_mr of "
                                   "the window's own MR [0x%llx, +%llu) failed: %s: raise "
                                   "the locked-memory limit or revoke grants",
                                   f->device_name, (unsigned long long)addr,
                                   (unsigned long long)len_bytes, strerror(err));
        }
    }
    errno = 0;
    struct ibv_mw *mw = ibv_alloc_mw(f->pd, IBV_MW_TYPE_2);
    if (mw == NULL) {
        const int err = errno != 0 ? errno : EINVAL;
        const bool unsup = err == EOPNOTSUPP || err == ENOSYS || err == EINVAL;
        if (own != NULL)
            (void)ibv_dereg_mr(own);
        return kvs_fabric_fail(fab, unsup ? KVS_ENOTSUP : KVS_EBACKEND, err,
                               "key_grant on %s: ibv_alloc_mw(IBV_MW_TYPE_2) failed: %s%s",
                               f->device_name, strerror(err),
                               unsup ? ": the device has no type-2 memory windows"
                                     : ": the device is out of windows; revoke grants");
    }
    *g = (kvs_grant_t){.mw = mw, .own_mr = own, .conn = conn, .mr = m,
                       .piece = own != NULL ? own : m->pieces[i], .addr = addr,
                       .len_bytes = len_bytes, .mw_rkey = mw->rkey,
                       .rkey = ibv_inc_rkey(mw->rkey), .live = true};
    uint32_t idx = 0;
    hw_verbs_sqe_t *e = hw_verbs_sq_push(conn, &idx);
    e->kind = HW_OP_BIND;
    e->opcode = IBV_WR_BIND_MW;
    e->last = true;
    e->grant = g;
    if (hw_verbs_conn_ready(conn))
        hw_verbs_sq_post(conn, idx, 1);
    m->net.grants++;
    f->live_grants++;
    *out = g;
    *out_rkey = g->rkey;
    return KVS_OK;
}

/* Whether a bind or invalidate of g is on the QP and not yet completed. */
static bool hw_verbs_grant_in_flight(const kvs_grant_t *g)
{
    const kvs_conn_t *c = g->conn;
    if (c == NULL || c->sq == NULL || c->qp == NULL)
        return false;
    const uint32_t depth = c->fab->cfg.sq_depth;
    for (uint32_t k = 0; k < c->sq_used; k++) {
        const hw_verbs_sqe_t *e = &c->sq[(c->sq_head + k) % depth];
        if (e->grant == g && e->state == HW_SQE_POSTED)
            return true;
    }
    return false;
}

/* A bind the QP still runs would fail once its window is gone and take the
 * QP down with it: wait for it, bounded (a bind is a local operation, it
 * runs in microseconds). Past the bound, or with the stash full, revoke
 * goes on anyway: the key dies either way, the QP may recover. */
static void hw_verbs_grant_settle(hw_verbs_fabric_t *f, const kvs_grant_t *g)
{
    const uint64_t until = hw_net_now_ns() + HW_VERBS_GRANT_SETTLE_NS;
    while (hw_verbs_grant_in_flight(g) && hw_net_now_ns() < until)
        if (hw_verbs_cq_take_sends(f) < 0 || f->nstash == HW_VERBS_STASH)
            break;
}

/* Cancels g's binds that wait in its connection's ring; unhooks posted ones
 * so that their completions leave g alone. */
static void hw_verbs_grant_unhook(kvs_grant_t *g)
{
    kvs_conn_t *c = g->conn;
    if (c == NULL || c->sq == NULL)
        return;
    const uint32_t depth = c->fab->cfg.sq_depth;
    for (uint32_t k = 0; k < c->sq_used; k++) {
        hw_verbs_sqe_t *e = &c->sq[(c->sq_head + k) % depth];
        if (e->grant != g)
            continue;
        e->grant = NULL;
        if (e->state == HW_SQE_QUEUED || e->state == HW_SQE_REPOST) {
            e->state = HW_SQE_DONE; /* retired in order, never posted */
            e->status = KVS_OK;
        }
    }
}

int hw_verbs_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    kvs_grant_t *g = hw_verbs_grant_of(f, grant);
    if (g == NULL)
        return kvs_fabric_fail(fab, KVS_ENOENT, 0, "key_revoke on %s: not a live grant of "
                               "this fabric (revoked already, or another fabric's)",
                               f->device_name);
    hw_verbs_grant_settle(f, g);
    hw_verbs_grant_unhook(g);
    int rc = KVS_OK;
    {
        const int err = hw_verbs_grant_release(g);
        if (err != 0) {
            /* A type-2 window opens nothing but on its own QP: breaking
             * that QP keeps the promise (the connection recovers on a new
             * one, where this window is not bound again). */
            rc = kvs_fabric_fail(fab, KVS_EBACKEND, err, "key_revoke on %s: ibv_dealloc_mw "
                                 "failed (%s): the connection's queue pair was broken so "
                                 "that the key opens nothing", f->device_name, strerror(err));
            if (g->conn != NULL)
                hw_verbs_conn_broken(g->conn, KVS_EPEER, "connection to %s: a memory window "
                                     "could not be deallocated", g->conn->net.peer);
        }
    }
    g->mr->net.grants--;
    f->live_grants--;
    *g = (kvs_grant_t){0};
    return rc;
}

void hw_verbs_grants_rebind(kvs_conn_t *c)
{
    hw_verbs_fabric_t *f = c->fab;
    const uint32_t depth = f->cfg.sq_depth;
    if (f->grants == NULL || c->qp == NULL)
        return;
    /* An invalidate the old QP took but did not report may have run: never
     * run it twice (rxe must not invalidate a window that is not bound);
     * its bind goes again, and fails harmlessly if the window is still
     * bound (the grant is then broken). */
    for (uint32_t k = 0; k < c->sq_used; k++) {
        hw_verbs_sqe_t *e = &c->sq[(c->sq_head + k) % depth];
        if (e->kind == HW_OP_INVAL && e->state == HW_SQE_REPOST) {
            e->state = HW_SQE_DONE;
            e->status = KVS_OK;
        }
    }
    uint32_t n = 0;
    for (uint32_t k = 0; k < f->cfg.max_grants; k++) {
        kvs_grant_t *g = &f->grants[k];
        if (!g->live || g->conn != c || !g->bound || g->broken)
            continue;
        if (depth - c->sq_used < 2) {
            g->broken = true; /* no room: its key opens nothing (the safe side) */
            continue;
        }
        /* ahead of the ring's head, in this order: invalidate, bind */
        hw_verbs_sqe_t *ops[2];
        for (int j = 1; j >= 0; j--) {
            c->sq_head = (c->sq_head + depth - 1) % depth;
            c->sq_used++;
            ops[j] = &c->sq[c->sq_head];
            *ops[j] = (hw_verbs_sqe_t){.state = HW_SQE_QUEUED, .last = true, .grant = g};
        }
        ops[0]->kind = HW_OP_INVAL;
        ops[0]->opcode = IBV_WR_LOCAL_INV;
        ops[0]->rkey = g->mw_rkey;
        ops[1]->kind = HW_OP_BIND;
        ops[1]->opcode = IBV_WR_BIND_MW;
        g->rkey = g->mw_rkey; /* the same key: the peer holds it */
        g->bound = false;
        n += 2;
    }
    if (n > 0) /* now, before the peer can use the new QP */
        hw_verbs_sq_post(c, c->sq_head, n);
    if (c->stale_qp != NULL) {
        /* returns once the invalidates above ran (they drop the windows'
         * hold on it) */
        (void)ibv_destroy_qp(c->stale_qp);
        c->stale_qp = NULL;
    }
}

bool hw_verbs_grants_hold(const kvs_conn_t *c)
{
    const hw_verbs_fabric_t *f = c->fab;
    for (uint32_t k = 0; f->grants != NULL && k < f->cfg.max_grants; k++) {
        const kvs_grant_t *g = &f->grants[k];
        if (g->live && g->conn == c && g->mw != NULL)
            return true;
    }
    return false;
}

void hw_verbs_grants_conn_gone(kvs_conn_t *c)
{
    hw_verbs_fabric_t *f = c->fab;
    if (f->grants == NULL)
        return;
    for (uint32_t k = 0; k < f->cfg.max_grants; k++) {
        kvs_grant_t *g = &f->grants[k];
        if (!g->live || g->conn != c)
            continue;
        hw_verbs_grant_unhook(g);
        (void)hw_verbs_grant_release(g);
        g->conn = NULL;
        g->bound = false;
        g->broken = true;
    }
}

void hw_verbs_grants_free_all(hw_verbs_fabric_t *f)
{
    if (f->grants == NULL)
        return;
    for (uint32_t k = 0; k < f->cfg.max_grants; k++) {
        kvs_grant_t *g = &f->grants[k];
        if (g->live)
            (void)hw_verbs_grant_release(g);
        if (g->live)
            g->mr->net.grants--;
        *g = (kvs_grant_t){0};
    }
    f->live_grants = 0;
}
