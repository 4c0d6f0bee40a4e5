/*
 * fabric.c - the simulated RDMA fabric of fabric.h: a network of NICs on the
 * engine's virtual clock, each NIC a kvstage fabric backend ("sim-nic"). This
 * file is the ops table the core calls (registrations, connections, posts,
 * polling, grants) and the lifetime and knobs of the net and its NICs; the
 * wire under it, where writes and messages travel and land, is
 * nic_model.c's (nic_model.h), with the default numbers and the model of a
 * write.
 *
 * Connections come in pairs: connect(A, "B") creates A's conn to B and B's
 * conn back to A (the reverse), so a RECV or IMM at B carries B's conn to A
 * and B can reply on it. Disconnecting one side (or destroying its NIC)
 * marks the other dead and gives its owner a DISCONNECT completion: posts on
 * a dead conn fail with KVS_EPEER; disconnect it and connect again.
 *
 * Grants (key_grant / key_revoke, fabric ops version 4): a grant is one
 * range of one of the NIC's MRs opened to the peer of one of its
 * connections (the NIC's side of it, named by pointer and generation, so a
 * connection disconnected meanwhile matches no write), with a key drawn
 * from the rkey stream like an MR's: 32 bits, non-zero, unique among the
 * live MRs and grants of the net. A grant costs no event and no work
 * request: granting and revoking are table updates (a verbs memory window
 * bind is a work request on the send queue; its cost is for the real
 * fabric to measure). An MR with live grants cannot be deregistered
 * (KVS_EBUSY), as verbs refuses to deregister an MR with bound windows.
 *
 * Bounds: at most SIM_NET_MAX_NICS NICs, max_mrs MRs, max_conns conns and
 * max_grants grants per NIC (grants in pages allocated as used),
 * cq_entries completions per NIC (storage grows by doubling up to it),
 * and the per-net pools of writes, messages and event records grow by
 * doubling up to fixed caps: no malloc per operation in steady state.
 *
 * Send queues: every write and send accepted on a connection holds one
 * slot of its send queue until its completion is polled (as a verbs send
 * queue keeps each request until it is reported); a completion that is
 * never pushed (the NIC is gone or in error) frees nothing, and a conn
 * that is disconnected starts again empty. With sq_depth > 0 a post that
 * finds sq_depth slots held is refused with KVS_EAGAIN before anything is
 * queued, naming the knob, and counted (sim_nic_posts_refused); the
 * caller polls and posts again. Slots are counted with sq_depth 0 too
 * (unlimited: nothing is refused), so the bookkeeping is checked in every
 * run. No event, no draw: a limit changes only what the core does.
 *
 * Write size: with max_write_bytes set (fabric ops version 6), a write of
 * more bytes is refused at post (KVS_EINVAL), as a NIC refuses a message
 * over its port's max_msg_sz, and the slot reports the limit so the core
 * posts pieces; 0 (the default) takes any length.
 *
 * Counters: sim_nic_writes / sim_nic_write_bytes count writes of this NIC
 * that completed successfully and their bytes; sim_nic_msgs counts control
 * messages accepted by send(); sim_nic_posts_refused counts the posts a
 * full send queue refused.
 */
#include "nic_model.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The ops table                                                             */
/* ------------------------------------------------------------------------ */

static int sim_nic_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                               uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);

static sim_nic_t *sim_nic_of(kvs_fabric_t *fab)
{
    sim_nic_t *nic = sim_nic_from_fabric(fab);
    assert(nic != NULL);
    return nic;
}

/* A key of a live MR or grant anywhere on the net. */
static bool sim_net_rkey_live(const sim_net_t *net, uint64_t rkey)
{
    for (uint32_t s = 0; s < SIM_NET_MAX_NICS; s++) {
        const sim_nic_t *n = net->nics[s];
        if (n == NULL)
            continue;
        for (uint32_t i = 0; i < n->mr_hwm; i++)
            if (n->mrs[i].live && n->mrs[i].rkey == rkey)
                return true;
        if (sim_nic_grant_by_key(n, rkey) != NULL)
            return true;
    }
    return false;
}

/* 32-bit keys as in verbs, drawn from the net's stream: non-sequential,
 * non-zero, unique among the live MRs and grants of the net; 0 when
 * SIM_NET_RKEY_TRIES draws found none free. */
static uint64_t sim_net_draw_rkey(sim_net_t *net)
{
    uint64_t rkey = 0;
    for (int t = 0; t < SIM_NET_RKEY_TRIES && rkey == 0; t++) {
        rkey = sim_rng_next(&net->rkey_rng) & UINT32_MAX;
        if (rkey != 0 && sim_net_rkey_live(net, rkey))
            rkey = 0;
    }
    return rkey;
}

static int sim_nic_mr_register_as(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                  uint64_t len_bytes, bool sealed, kvs_mr_t **out,
                                  uint64_t *out_rkey)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (out == NULL || out_rkey == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "mr_register on %s: out and out_rkey "
                                                   "must not be NULL", nic->name);
    sim_gpu_t *gpu = dev != NULL ? sim_gpu_from_device(dev) : NULL;
    if (gpu == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "mr_register on %s: the device is not a "
                                                   "simulated GPU", nic->name);
    if (gpu != nic->gpu)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "mr_register on %s: GPU %u is not the GPU of this NIC (GPU "
                               "%u)", nic->name, sim_gpu_id(gpu), sim_gpu_id(nic->gpu));
    if (len_bytes == 0 || !sim_gpu_in_mem(gpu, addr, len_bytes))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "mr_register on %s: [0x%llx, +%llu bytes) is not inside one "
                               "live allocation of GPU %u",
                               nic->name, (unsigned long long)addr,
                               (unsigned long long)len_bytes, sim_gpu_id(gpu));
    uint32_t slot = SIM_NIL;
    for (uint32_t i = 0; i < net->cfg.max_mrs; i++) {
        if (!nic->mrs[i].live) {
            slot = i;
            break;
        }
    }
    if (slot == SIM_NIL)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "mr_register on %s: all %u MR slots are "
                                                  "in use; deregister some or raise max_mrs",
                               nic->name, net->cfg.max_mrs);
    const uint64_t rkey = sim_net_draw_rkey(net);
    if (rkey == 0)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "mr_register on %s: no free remote key "
                                                  "found", nic->name);
    kvs_mr_t *mr = &nic->mrs[slot];
    *mr = (kvs_mr_t){.nic = nic, .addr = addr, .len_bytes = len_bytes, .rkey = rkey,
                     .live = true, .sealed = sealed};
    if (slot + 1 > nic->mr_hwm)
        nic->mr_hwm = slot + 1;
    *out = mr;
    *out_rkey = rkey;
    return KVS_OK;
}

static int sim_nic_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                               uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    return sim_nic_mr_register_as(fab, dev, addr, len_bytes, false, out, out_rkey);
}

/* Fabric ops version 5: its key draws from the same stream, so a run's
 * keys (and digest) do not depend on which registrations are sealed. */
static int sim_nic_mr_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                      uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    return sim_nic_mr_register_as(fab, dev, addr, len_bytes, true, out, out_rkey);
}

static int sim_nic_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr)
{
    sim_nic_t *nic = sim_nic_of(fab);
    if (sim_nic_mr_of(nic, mr) == NULL)
        return kvs_fabric_fail(fab, KVS_ENOENT, 0, "mr_deregister on %s: not a live MR of "
                                                   "this NIC", nic->name);
    for (uint32_t i = 0; i < nic->grants_fresh; i++)
        if (sim_nic_grant_at(nic, i)->live && sim_nic_grant_at(nic, i)->mr == mr)
            return kvs_fabric_fail(fab, KVS_EBUSY, 0, "mr_deregister on %s: grants "
                                   "(key_grant) of this MR are live: revoke them first",
                                   nic->name);
    mr->live = false;
    while (nic->mr_hwm > 0 && !nic->mrs[nic->mr_hwm - 1].live)
        nic->mr_hwm--;
    return KVS_OK;
}

static sim_nic_t *sim_net_find(const sim_net_t *net, const char *name)
{
    for (uint32_t s = 0; s < SIM_NET_MAX_NICS; s++)
        if (net->nics[s] != NULL && strcmp(net->nics[s]->name, name) == 0)
            return net->nics[s];
    return NULL;
}

static kvs_conn_t *sim_nic_conn_free_slot(const sim_nic_t *nic)
{
    for (uint32_t i = 0; i < nic->net->cfg.max_conns; i++)
        if (!nic->conns[i].live)
            return &nic->conns[i];
    return NULL;
}

static int sim_nic_connect(kvs_fabric_t *fab, const char *peer_name, kvs_conn_t **out)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (peer_name == NULL || out == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "connect on %s: peer and out must not be "
                                                   "NULL", nic->name);
    sim_nic_t *peer = sim_net_find(net, peer_name);
    if (peer == NULL)
        return kvs_fabric_fail(fab, KVS_ENOENT, 0, "connect on %s: no NIC named '%s' on this "
                                                   "network", nic->name, peer_name);
    for (uint32_t i = 0; i < net->cfg.max_conns; i++) {
        kvs_conn_t *c = &nic->conns[i];
        if (c->live && !c->dead && c->peer == peer) {
            *out = c;
            return KVS_OK;
        }
    }
    kvs_conn_t *mine = sim_nic_conn_free_slot(nic);
    kvs_conn_t *theirs = peer == nic ? mine : sim_nic_conn_free_slot(peer);
    if (mine == NULL || theirs == NULL)
        return kvs_fabric_fail(fab, KVS_EFULL, 0,
                               "connect %s -> %s: connection table of %s is full (%u); "
                               "disconnect some or raise max_conns",
                               nic->name, peer->name, mine == NULL ? nic->name : peer->name,
                               net->cfg.max_conns);
    *mine = (kvs_conn_t){.local = nic, .peer = peer, .reverse = theirs, .gen = mine->gen,
                         .live = true};
    if (theirs != mine)
        *theirs = (kvs_conn_t){.local = peer, .peer = nic, .reverse = mine,
                               .gen = theirs->gen, .live = true};
    *out = mine;
    return KVS_OK;
}

/* The peer of c went away: c is dead, and its owner hears of it with a
 * DISCONNECT completion (as rdma_cm's DISCONNECTED event tells a verbs
 * backend). */
static void sim_conn_kill(kvs_conn_t *c)
{
    c->peer = NULL;
    c->reverse = NULL;
    c->dead = true;
    sim_nic_t *owner = c->local;
    const sim_cqe_t e = {.kind = KVS_COMPLETION_DISCONNECT, .conn = c, .status = KVS_EPEER};
    if (sim_nic_push(owner, &e))
        sim_nic_wake(owner);
}

static void sim_nic_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    sim_nic_t *nic = sim_nic_of(fab);
    if (sim_nic_conn_of(nic, conn) == NULL)
        return;
    kvs_conn_t *rev = conn->reverse;
    if (rev != NULL && rev != conn)
        sim_conn_kill(rev);
    /* A DISCONNECT still queued for this conn must not reach a later conn
     * in the same slot: drop it. */
    uint32_t kept = 0;
    for (uint32_t i = 0; i < nic->cq_len; i++) {
        const sim_cqe_t e = nic->cq[(nic->cq_head + i) % nic->cq_cap];
        if (e.kind == KVS_COMPLETION_DISCONNECT && e.conn == conn)
            continue;
        nic->cq[(nic->cq_head + kept) % nic->cq_cap] = e;
        kept++;
    }
    nic->cq_len = kept;
    *conn = (kvs_conn_t){.gen = conn->gen + 1};
}

/* Validates a conn for posting: ours, live, not dead. */
static int sim_nic_check_conn(sim_nic_t *nic, kvs_conn_t *conn, const char *op)
{
    if (sim_nic_conn_of(nic, conn) == NULL)
        return kvs_fabric_fail(&nic->base, KVS_EINVAL, 0, "%s on %s: the connection is not a "
                                                          "live connection of this NIC", op,
                               nic->name);
    if (conn->dead)
        return kvs_fabric_fail(&nic->base, KVS_EPEER, 0,
                               "%s on %s: the peer disconnected or was destroyed; disconnect "
                               "and connect again", op, nic->name);
    assert(conn->peer != NULL && conn->reverse != NULL); /* live and not dead */
    return KVS_OK;
}

/* A free slot in conn's send queue, else KVS_EAGAIN (counted). */
static int sim_nic_check_sq(sim_nic_t *nic, kvs_conn_t *conn, const char *op)
{
    const uint32_t depth = nic->net->cfg.sq_depth;
    if (depth == 0 || conn->sq_used < depth)
        return KVS_OK;
    nic->posts_refused++;
    return kvs_fabric_fail(&nic->base, KVS_EAGAIN, 0,
                           "%s on %s: %u work requests in flight fill the send queue to %s "
                           "(sq_depth %u): poll completions, then retry, or raise sq_depth",
                           op, nic->name, conn->sq_used, conn->peer->name, depth);
}

/* A WRITE or SEND completion polled: its send queue slot is free again,
 * unless its conn was disconnected meanwhile (a new conn starts empty). */
static void sim_nic_sq_release(const sim_cqe_t *e)
{
    if ((e->kind != KVS_COMPLETION_WRITE && e->kind != KVS_COMPLETION_SEND) || e->conn == NULL ||
        !e->conn->live || e->conn->gen != e->conn_gen)
        return;
    assert(e->conn->sq_used > 0);
    e->conn->sq_used--;
}

static int sim_nic_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (nic->fatal != KVS_OK)
        return kvs_fabric_fail(fab, nic->fatal, 0, "%s", nic->fatal_msg);
    int rc = sim_nic_check_conn(nic, conn, "write");
    if (rc != KVS_OK)
        return rc;
    if (desc == NULL || desc->len_bytes == 0)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: %s", nic->name,
                               desc == NULL ? "desc is NULL" : "len_bytes is 0");
    const kvs_mr_t *mr = sim_nic_mr_of(nic, desc->local_mr);
    if (mr == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "write on %s: local_mr is not a live MR of "
                                                   "this NIC", nic->name);
    if (desc->local_addr < mr->addr || desc->len_bytes > mr->len_bytes ||
        desc->local_addr - mr->addr > mr->len_bytes - desc->len_bytes)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "write on %s: source [0x%llx, +%llu bytes) is outside its MR "
                               "[0x%llx, +%llu bytes)",
                               nic->name, (unsigned long long)desc->local_addr,
                               (unsigned long long)desc->len_bytes,
                               (unsigned long long)mr->addr,
                               (unsigned long long)mr->len_bytes);
    if (net->cfg.max_write_bytes != 0 && desc->len_bytes > net->cfg.max_write_bytes)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "write on %s: %llu bytes, more than the %llu one write takes "
                               "(max_write_bytes): write it in pieces",
                               nic->name, (unsigned long long)desc->len_bytes,
                               (unsigned long long)net->cfg.max_write_bytes);
    rc = sim_nic_check_sq(nic, conn, "write");
    if (rc != KVS_OK)
        return rc;
    uint32_t w;
    rc = sim_wr_alloc(net, &w);
    if (rc != KVS_OK)
        return kvs_fabric_fail(fab, rc, 0, "write on %s: %u writes in flight on the network, "
                                           "no room for another", nic->name, net->wrs_cap);
    sim_wr_t *wr = &net->wrs[w];
    sim_nic_t *peer = conn->peer;
    wr->local_addr = desc->local_addr;
    wr->remote_addr = desc->remote_addr;
    wr->rkey = desc->rkey;
    if (nic->write_hook != NULL)
        wr->planted = nic->write_hook(nic->write_hook_ctx, nic->name, peer->name,
                                      &wr->remote_addr, &wr->rkey, desc->len_bytes);
    wr->len_bytes = desc->len_bytes;
    wr->wr_id = desc->wr_id;
    wr->post_ns = sim_engine_now_ns(net->eng);
    wr->with_imm = desc->with_imm;
    wr->imm = desc->imm;
    wr->src_conn = conn;
    wr->src_conn_gen = conn->gen;
    wr->dst_conn = conn->reverse;
    wr->dst_conn_gen = conn->reverse->gen;
    wr->src_slot = nic->slot;
    wr->src_gen = nic->gen;
    wr->dst_slot = peer->slot;
    wr->dst_gen = peer->gen;
    wr->status = KVS_OK;
    if (nic->fail_next_writes > 0) {
        nic->fail_next_writes--;
        wr->force_fail = true;
    } else if (nic->write_error_den > 0 &&
               sim_rng_chance(&net->fault_rng, nic->write_error_num, nic->write_error_den)) {
        wr->force_fail = true;
    }
    wr->in_tx = true;
    wr->refs = 1;
    conn->sq_used++;
    if (nic->tx_tail == SIM_NIL)
        nic->tx_head = w;
    else
        net->wrs[nic->tx_tail].next = w;
    nic->tx_tail = w;
    sim_nic_tx_kick(nic);
    if (nic->fatal != KVS_OK)
        return kvs_fabric_fail(fab, nic->fatal, 0, "%s", nic->fatal_msg);
    return KVS_OK;
}

static int sim_nic_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg,
                        uint32_t len_bytes, uint64_t wr_id)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (nic->fatal != KVS_OK)
        return kvs_fabric_fail(fab, nic->fatal, 0, "%s", nic->fatal_msg);
    int rc = sim_nic_check_conn(nic, conn, "send");
    if (rc != KVS_OK)
        return rc;
    if (len_bytes > KVS_CONTROL_MSG_MAX_BYTES || (msg == NULL && len_bytes > 0))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "send on %s: %u bytes (at most %u, and msg must not be NULL)",
                               nic->name, len_bytes, KVS_CONTROL_MSG_MAX_BYTES);
    rc = sim_nic_check_sq(nic, conn, "send");
    if (rc != KVS_OK)
        return rc;
    uint32_t m;
    rc = sim_msg_alloc(net, &m);
    if (rc != KVS_OK)
        return kvs_fabric_fail(fab, rc, 0, "send on %s: %u control messages in flight or "
                                           "unpolled on the network, no room for another",
                               nic->name, net->msgs_cap);
    sim_msg_t *mm = sim_msg_at(net, m);
    mm->src_conn = conn;
    mm->src_conn_gen = conn->gen;
    mm->dst_conn = conn->reverse;
    mm->dst_conn_gen = conn->reverse->gen;
    mm->src_slot = nic->slot;
    mm->src_gen = nic->gen;
    mm->dst_slot = conn->peer->slot;
    mm->dst_gen = conn->peer->gen;
    mm->wr_id = wr_id;
    mm->seq = conn->send_seq;
    mm->len_bytes = len_bytes;
    mm->dropped = !nic->link_up; /* leaving a NIC whose link is down */
    mm->dup = false;
    if (len_bytes > 0)
        memcpy(mm->data, msg, len_bytes);
    uint64_t delay_ns = 0;
    const sim_msg_fate_t fate = nic->msg_filter != NULL
                                    ? nic->msg_filter(nic->msg_filter_ctx, mm->data, len_bytes,
                                                      &delay_ns)
                                    : SIM_MSG_DELIVER;
    if (fate == SIM_MSG_DROP)
        mm->dropped = true;
    uint64_t at = sim_add_sat(sim_net_now(net), net->cfg.ctrl_latency_ns);
    if (fate == SIM_MSG_DELAY)
        at = sim_add_sat(at, delay_ns);
    if (at < conn->last_deliver_ns)
        at = conn->last_deliver_ns; /* behind a delayed one: order is kept */
    conn->last_deliver_ns = at;
    rc = sim_net_schedule(net, at, REC_MSG, m, 0, 0, NULL);
    if (rc != KVS_OK) {
        sim_msg_free(net, m);
        return kvs_fabric_fail(fab, rc, 0, "send on %s: could not schedule the delivery",
                               nic->name);
    }
    uint32_t m2;
    if (fate == SIM_MSG_DUP && sim_msg_alloc(net, &m2) == KVS_OK) {
        sim_msg_t *copy = sim_msg_at(net, m2);
        *copy = *mm;
        copy->dup = true;
        if (sim_net_schedule(net, at, REC_MSG, m2, 0, 0, NULL) != KVS_OK)
            sim_msg_free(net, m2);
    }
    conn->send_seq++;
    conn->sq_used++;
    nic->msgs++;
    return KVS_OK;
}

static int sim_nic_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (nic->fatal != KVS_OK)
        return kvs_fabric_fail(fab, nic->fatal, 0, "%s", nic->fatal_msg);
    if (max < 0 || (out == NULL && max > 0))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "poll on %s: max %d, out %s", nic->name,
                               max, out == NULL ? "NULL" : "set");
    int n = 0;
    while (n < max && nic->cq_len > 0) {
        const sim_cqe_t e = nic->cq[nic->cq_head];
        nic->cq_head = (nic->cq_head + 1) % nic->cq_cap;
        nic->cq_len--;
        sim_nic_sq_release(&e);
        kvs_completion_t *c = &out[n++];
        c->kind = (kvs_completion_kind_t)e.kind;
        c->status = e.status;
        c->wr_id = e.wr_id;
        c->conn = e.conn;
        c->imm = e.imm;
        c->len_bytes = e.len_bytes;
        if (e.kind == KVS_COMPLETION_RECV) {
            memcpy(c->msg, sim_msg_at(net, e.msg)->data, e.len_bytes);
            sim_msg_free(net, e.msg);
        } else if (e.kind == KVS_COMPLETION_DISCONNECT) { /* why, as backend.h asks */
            const int len = snprintf((char *)c->msg, sizeof c->msg,
                                     "NIC %s: the peer closed the connection or its NIC is "
                                     "gone (crashed or restarted)", nic->name);
            c->len_bytes = len > 0 ? (uint32_t)len : 0;
        }
    }
    return n;
}

static uint64_t sim_nic_now_ns(kvs_fabric_t *fab)
{
    return sim_net_now(sim_nic_of(fab)->net);
}

/* The nonces of authenticated registration: the net's own stream (its
 * component id keeps the other streams as they were), so they are
 * unpredictable to nobody but the seed's holder, and a run replays. */
static int sim_nic_random_bytes(kvs_fabric_t *fab, void *buf, size_t len_bytes)
{
    sim_rng_t *rng = &sim_nic_of(fab)->net->nonce_rng;
    uint8_t *out = buf;
    for (size_t i = 0; i < len_bytes; i += 8) {
        const uint64_t w = sim_rng_next(rng);
        for (size_t k = 0; k < 8 && i + k < len_bytes; k++)
            out[i + k] = (uint8_t)(w >> (8u * k));
    }
    return KVS_OK;
}

static int sim_nic_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes)
{
    (void)fab;
    if (conn == NULL || conn->peer == NULL)
        return KVS_ENOENT;
    snprintf(buf, bytes, "%s", conn->peer->name);
    return KVS_OK;
}

/* A free grant slot of nic (its page allocated on first use), or SIM_NIL
 * when max_grants are live or a page cannot be allocated (*why says). */
static uint32_t sim_nic_grant_slot(sim_nic_t *nic, int *why)
{
    if (nic->grants_free != SIM_NIL) {
        const uint32_t i = nic->grants_free;
        nic->grants_free = sim_nic_grant_at(nic, i)->next;
        return i;
    }
    *why = KVS_EFULL;
    if (nic->grants_fresh >= nic->net->cfg.max_grants)
        return SIM_NIL;
    kvs_grant_t **page = &nic->grant_pages[nic->grants_fresh / SIM_NIC_GRANT_PAGE];
    if (*page == NULL && (*page = calloc(SIM_NIC_GRANT_PAGE, sizeof **page)) == NULL) {
        *why = KVS_ENOMEM;
        return SIM_NIL;
    }
    return nic->grants_fresh++;
}

static int sim_nic_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                             uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey)
{
    sim_nic_t *nic = sim_nic_of(fab);
    sim_net_t *net = nic->net;
    if (out == NULL || out_rkey == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: out and out_rkey must "
                                                   "not be NULL", nic->name);
    if (sim_nic_mr_of(nic, mr) == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: mr is not a live MR of "
                                                   "this NIC", nic->name);
    int rc = sim_nic_check_conn(nic, conn, "key_grant");
    if (rc != KVS_OK)
        return rc;
    if (len_bytes == 0 || addr < mr->addr || len_bytes > mr->len_bytes ||
        addr - mr->addr > mr->len_bytes - len_bytes)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0,
                               "key_grant on %s: [0x%llx, +%llu bytes) is not a non-empty "
                               "range inside its MR [0x%llx, +%llu bytes)",
                               nic->name, (unsigned long long)addr,
                               (unsigned long long)len_bytes, (unsigned long long)mr->addr,
                               (unsigned long long)mr->len_bytes);
    const uint64_t rkey = sim_net_draw_rkey(net);
    if (rkey == 0)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "key_grant on %s: no free remote key "
                                                  "found", nic->name);
    const uint32_t i = sim_nic_grant_slot(nic, &rc);
    if (i == SIM_NIL)
        return kvs_fabric_fail(fab, rc, 0, rc == KVS_EFULL
                                               ? "key_grant on %s: all %u grants are live: "
                                                 "revoke some, or raise max_grants"
                                               : "key_grant on %s: no memory for grants "
                                                 "(%u at most)",
                               nic->name, net->cfg.max_grants);
    kvs_grant_t *g = sim_nic_grant_at(nic, i);
    *g = (kvs_grant_t){.mr = mr, .conn = conn, .conn_gen = conn->gen, .next = SIM_NIL,
                       .addr = addr, .len_bytes = len_bytes, .rkey = rkey, .live = true};
    nic->grants_live++;
    nic->grants_made++;
    *out = g;
    *out_rkey = rkey;
    return KVS_OK;
}

static int sim_nic_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant)
{
    sim_nic_t *nic = sim_nic_of(fab);
    const uint32_t i = sim_nic_grant_index(nic, grant);
    if (i == SIM_NIL || !grant->live)
        return kvs_fabric_fail(fab, KVS_ENOENT, 0, "key_revoke on %s: not a live grant of "
                                                   "this NIC", nic->name);
    *grant = (kvs_grant_t){.next = nic->grants_free, .live = false};
    nic->grants_free = i;
    nic->grants_live--;
    nic->grants_revoked++;
    return KVS_OK;
}

/* Every slot but the grants, shared by both tables below. */
#define SIM_NIC_OPS_SLOTS                                                      \
    .name = "sim-nic",                                                         \
    .caps = KVS_FABRIC_CAP_WRITE_IMM | KVS_FABRIC_CAP_PER_LAYER_WRITES,        \
    .mr_register = sim_nic_mr_register, .mr_deregister = sim_nic_mr_deregister, \
    .connect = sim_nic_connect, .disconnect = sim_nic_disconnect,              \
    .write = sim_nic_write, .send = sim_nic_send, .poll = sim_nic_poll,        \
    .now_ns = sim_nic_now_ns, .random_bytes = sim_nic_random_bytes,            \
    .peer_addr = sim_nic_peer_addr

static uint64_t sim_nic_max_write_bytes(kvs_fabric_t *fab)
{
    const uint64_t n = sim_nic_of(fab)->net->cfg.max_write_bytes;
    return n != 0 ? n : UINT64_MAX;
}

static const kvs_fabric_ops_t sim_nic_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    SIM_NIC_OPS_SLOTS,
    .key_grant = sim_nic_key_grant,
    .key_revoke = sim_nic_key_revoke,
    .mr_register_sealed = sim_nic_mr_register_sealed,
    .max_write_bytes = sim_nic_max_write_bytes,
};

/* sim_net_config_t.no_key_grant: the table of a fabric without grants, of
 * version 3 (it ends at peer_addr). */
static const kvs_fabric_ops_t sim_nic_ops_v3 = {
    .version = 3,
    .size = offsetof(kvs_fabric_ops_t, key_grant),
    SIM_NIC_OPS_SLOTS,
};

/* ------------------------------------------------------------------------ */
/* Network and NIC lifetime                                                  */
/* ------------------------------------------------------------------------ */

int sim_net_create(sim_engine_t *eng, const sim_net_config_t *cfg, sim_net_t **out)
{
    if (eng == NULL || out == NULL)
        return KVS_EINVAL;
    sim_net_t *net = calloc(1, sizeof *net);
    if (net == NULL)
        return KVS_ENOMEM;
    net->eng = eng;
    if (cfg != NULL)
        net->cfg = *cfg;
    sim_net_config_t *c = &net->cfg;
    if (c->link_bytes_per_s == 0)
        c->link_bytes_per_s = UINT64_C(50000000000);
    if (c->latency_ns == 0)
        c->latency_ns = 2000;
    if (c->mtu_bytes == 0)
        c->mtu_bytes = 4096;
    if (c->header_bytes == 0)
        c->header_bytes = 58;
    if (c->per_op_ns == 0)
        c->per_op_ns = 3700;
    if (c->segment_bytes == 0)
        c->segment_bytes = UINT64_C(1) << 20;
    if (c->ctrl_latency_ns == 0)
        c->ctrl_latency_ns = 20000;
    if (c->cq_entries == 0)
        c->cq_entries = 65536;
    if (c->max_mrs == 0)
        c->max_mrs = 1024;
    if (c->max_conns == 0)
        c->max_conns = 256;
    if (c->max_grants == 0)
        c->max_grants = 65536;
    sim_engine_rng(eng, SIM_NET_RKEY_COMPONENT, &net->rkey_rng);
    sim_engine_rng(eng, SIM_NET_FAULT_COMPONENT, &net->fault_rng);
    sim_engine_rng(eng, SIM_NET_NONCE_COMPONENT, &net->nonce_rng);
    net->recs_free = SIM_NIL;
    net->wrs_free = SIM_NIL;
    net->msgs_free = SIM_NIL;
    *out = net;
    return KVS_OK;
}

int sim_net_destroy(sim_net_t *net)
{
    if (net == NULL)
        return KVS_OK;
    if (net->nic_count > 0)
        return KVS_EBUSY;
    for (uint32_t r = 0; r < net->recs_cap; r++)
        if (net->recs[r].kind != REC_FREE)
            (void)sim_engine_cancel(net->eng, net->recs[r].ev_id);
    free(net->recs);
    free(net->wrs);
    for (uint32_t p = 0; p < net->msgs_cap / SIM_NET_MSG_PAGE; p++)
        free(net->msg_pages[p]);
    free(net);
    return KVS_OK;
}

int sim_nic_create(sim_net_t *net, const char *name, sim_gpu_t *gpu, sim_nic_t **out)
{
    if (net == NULL || name == NULL || name[0] == '\0' || gpu == NULL || out == NULL)
        return KVS_EINVAL;
    if (sim_net_find(net, name) != NULL)
        return KVS_EINVAL; /* names are unique: connect finds NICs by name */
    uint32_t slot = SIM_NIL;
    for (uint32_t s = 0; s < SIM_NET_MAX_NICS; s++) {
        if (net->nics[s] == NULL) {
            slot = s;
            break;
        }
    }
    if (slot == SIM_NIL)
        return KVS_EFULL;
    sim_nic_t *nic = calloc(1, sizeof *nic);
    if (nic == NULL)
        return KVS_ENOMEM;
    const size_t name_len = strlen(name);
    nic->name = malloc(name_len + 1);
    nic->mrs = calloc(net->cfg.max_mrs, sizeof *nic->mrs);
    nic->conns = calloc(net->cfg.max_conns, sizeof *nic->conns);
    nic->grant_pages = calloc((net->cfg.max_grants + SIM_NIC_GRANT_PAGE - 1) / SIM_NIC_GRANT_PAGE,
                              sizeof *nic->grant_pages);
    nic->cq_cap = net->cfg.cq_entries < SIM_NIC_CQ_INITIAL ? net->cfg.cq_entries
                                                            : SIM_NIC_CQ_INITIAL;
    nic->cq = malloc((size_t)nic->cq_cap * sizeof *nic->cq);
    if (nic->name == NULL || nic->mrs == NULL || nic->conns == NULL ||
        nic->grant_pages == NULL || nic->cq == NULL)
        goto fail;
    memcpy(nic->name, name, name_len + 1);
    int rc = kvs_fabric_init(&nic->base, net->cfg.no_key_grant ? &sim_nic_ops_v3 : &sim_nic_ops,
                             nic->name);
    assert(rc == KVS_OK);
    (void)rc;
    nic->net = net;
    nic->gpu = gpu;
    nic->slot = slot;
    nic->gen = net->nic_gen[slot];
    nic->tx_head = nic->tx_tail = nic->tx_rec = SIM_NIL;
    nic->grants_free = SIM_NIL;
    nic->link_up = true;
    net->nics[slot] = nic;
    net->nic_count++;
    *out = nic;
    return KVS_OK;
fail:
    free(nic->cq);
    free(nic->grant_pages);
    free(nic->conns);
    free(nic->mrs);
    free(nic->name);
    free(nic);
    return KVS_ENOMEM;
}

void sim_nic_destroy(sim_nic_t *nic)
{
    if (nic == NULL)
        return;
    sim_net_t *net = nic->net;
    /* TX: cancel the turn in progress, drop the queued writes. Their
     * segments already on the wire find the sender gone and stop. */
    if (nic->tx_rec != SIM_NIL) {
        const sim_rec_t rec = net->recs[nic->tx_rec];
        assert(rec.kind == REC_TX);
        (void)sim_engine_cancel(net->eng, rec.ev_id);
        sim_rec_free(net, nic->tx_rec);
        nic->tx_rec = SIM_NIL;
        net->wrs[rec.a].failed = true;
        sim_wr_release(net, (uint32_t)rec.a);
    }
    while (nic->tx_head != SIM_NIL) {
        const uint32_t w = nic->tx_head;
        nic->tx_head = net->wrs[w].next;
        net->wrs[w].next = SIM_NIL;
        net->wrs[w].in_tx = false;
        net->wrs[w].failed = true;
        sim_wr_release(net, w);
    }
    nic->tx_tail = SIM_NIL;
    /* Unpolled messages go back to the pool. */
    for (uint32_t i = 0; i < nic->cq_len; i++) {
        const sim_cqe_t *e = &nic->cq[(nic->cq_head + i) % nic->cq_cap];
        if (e->kind == KVS_COMPLETION_RECV)
            sim_msg_free(net, e->msg);
    }
    /* Peers' connections to it die: later posts on them fail with KVS_EPEER. */
    for (uint32_t s = 0; s < SIM_NET_MAX_NICS; s++) {
        sim_nic_t *other = net->nics[s];
        if (other == NULL || other == nic)
            continue;
        for (uint32_t i = 0; i < net->cfg.max_conns; i++) {
            kvs_conn_t *c = &other->conns[i];
            if (c->live && c->peer == nic)
                sim_conn_kill(c);
        }
    }
    net->nics[nic->slot] = NULL;
    net->nic_gen[nic->slot]++;
    net->nic_count--;
    free(nic->cq);
    for (uint32_t p = 0; p * SIM_NIC_GRANT_PAGE < net->cfg.max_grants; p++)
        free(nic->grant_pages[p]); /* live grants go with their NIC, as its MRs */
    free(nic->grant_pages);
    free(nic->conns);
    free(nic->mrs);
    free(nic->name);
    free(nic);
}

kvs_fabric_t *sim_nic_fabric(sim_nic_t *nic) { return nic != NULL ? &nic->base : NULL; }

sim_nic_t *sim_nic_from_fabric(kvs_fabric_t *fab)
{
    if (fab == NULL || fab->ops.mr_register != sim_nic_mr_register)
        return NULL;
    return KVS_CONTAINER_OF(fab, sim_nic_t, base);
}

void sim_nic_set_span(sim_nic_t *nic, sim_span_fn fn, void *ctx)
{
    nic->span = fn;
    nic->span_ctx = ctx;
}

void sim_nic_set_wake(sim_nic_t *nic, sim_nic_wake_fn fn, void *ctx)
{
    nic->wake = fn;
    nic->wake_ctx = ctx;
}

uint64_t sim_nic_writes(const sim_nic_t *nic) { return nic->writes; }

uint64_t sim_nic_write_bytes(const sim_nic_t *nic) { return nic->write_bytes; }

uint64_t sim_nic_msgs(const sim_nic_t *nic) { return nic->msgs; }

uint64_t sim_nic_posts_refused(const sim_nic_t *nic) { return nic->posts_refused; }

uint32_t sim_nic_grants_live(const sim_nic_t *nic) { return nic->grants_live; }

uint64_t sim_nic_grants_made(const sim_nic_t *nic) { return nic->grants_made; }

uint64_t sim_nic_grants_revoked(const sim_nic_t *nic) { return nic->grants_revoked; }

uint64_t sim_nic_planted_landed_bytes(const sim_nic_t *nic)
{
    return nic->planted_landed_bytes;
}

void sim_nic_set_link_up(sim_nic_t *nic, bool up) { nic->link_up = up; }

void sim_nic_set_write_error(sim_nic_t *nic, uint32_t num, uint32_t den)
{
    nic->write_error_num = num;
    nic->write_error_den = den;
}

void sim_nic_set_msg_filter(sim_nic_t *nic, sim_msg_filter_fn fn, void *ctx)
{
    nic->msg_filter = fn;
    nic->msg_filter_ctx = ctx;
}

sim_rng_t *sim_net_fault_rng(sim_net_t *net) { return &net->fault_rng; }

void sim_nic_fail_next_writes(sim_nic_t *nic, uint32_t count)
{
    nic->fail_next_writes = count;
}

void sim_nic_set_write_hook(sim_nic_t *nic, sim_nic_write_hook_fn fn, void *ctx)
{
    nic->write_hook = fn;
    nic->write_hook_ctx = ctx;
}
