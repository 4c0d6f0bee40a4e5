/*
 * fault_fabric.c - the wrapper fabric of <kvstage/fault_fabric.h>. Every
 * slot forwards to the inner fabric and copies its error detail back, so
 * the core's messages name the real backend's failure. A write-error
 * write keeps its address and length and gets a remote key no
 * registration has (the low 16 bits flipped). A hostile write keeps its
 * key and length and lands hostile_shift_bytes (or its length) further. A
 * stale write is kept whole; REPOST posts it again, with its own wr_id,
 * from the first poll after the owner arms it, and poll takes its
 * completion out of what the core sees; REDIRECT sends a later write to
 * its target under its key. A replayed registration goes on a connection
 * of the wrapper's own, which the core never sees either: poll takes
 * every completion on it (the prefill's answers are counted, a disconnect
 * is honoured), and destroy closes it.
 *
 * Below the fabrics (hw/net): it knows kvs_fabric_t only, calls nothing
 * of hw/verbs, hw/ofi or the simulator, reads no clock and draws nothing.
 * Invariants: at most one write is spoiled (spoiled <= 1); `posting` is
 * NONE outside the inner write call of the wrapper's write or repost.
 */
#include <kvstage/fault_fabric.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct hw_net_ff_msg {
    uint8_t b[KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t len;
    uint64_t wr_id;
} hw_net_ff_msg_t;

struct kvs_fault_fabric {
    kvs_fabric_t base; /* first: the core sees this */
    kvs_fabric_t *inner;
    kvs_fault_fabric_config_t cfg;
    uint64_t writes;
    atomic_uint_fast64_t spoiled;
    kvs_fault_post_t posting;
    /* stale-write: the kept write and its connection (NULL once the core
     * disconnected it), armed by the owner, posted again by poll (REPOST) */
    bool posted;
    kvs_write_desc_t kept_desc;
    kvs_conn_t *kept_conn;
    atomic_bool kept, armed, stale_done;
    atomic_int stale_status;
    /* replay-registration: the first connection and its peer, what the rank
     * sent on it until registered, and the replay's own connection */
    kvs_conn_t *first_conn, *replay_conn;
    char *peer;
    hw_net_ff_msg_t *msgs; /* [KVS_FAULT_REPLAY_MAX] */
    uint32_t nmsgs;
    bool replay_posted;
    atomic_bool registered, replay_settled;
    atomic_uint replayed, answers;
    atomic_int replay_status;
};

static kvs_fault_fabric_t *hw_net_ff(kvs_fabric_t *fab)
{
    return KVS_CONTAINER_OF(fab, kvs_fault_fabric_t, base);
}

/* The inner fabric's error detail becomes the wrapper's. */
static int hw_net_ff_ret(kvs_fault_fabric_t *w, int rc)
{
    if (rc < 0) {
        w->base.last_backend_code = w->inner->last_backend_code;
        memcpy(w->base.last_backend_msg, w->inner->last_backend_msg,
               sizeof w->base.last_backend_msg);
    }
    return rc;
}

static int hw_net_ff_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                 uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return hw_net_ff_ret(w, w->inner->ops.mr_register(w->inner, dev, addr, len_bytes, out,
                                                      out_rkey));
}

static int hw_net_ff_mr_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                        uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return hw_net_ff_ret(w, w->inner->ops.mr_register_sealed(w->inner, dev, addr, len_bytes,
                                                             out, out_rkey));
}

static int hw_net_ff_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return hw_net_ff_ret(w, w->inner->ops.mr_deregister(w->inner, mr));
}

static int hw_net_ff_connect(kvs_fabric_t *fab, const char *peer, kvs_conn_t **out)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    const int rc = w->inner->ops.connect(w->inner, peer, out);
    if (rc == KVS_OK && w->cfg.kind == KVS_FAULT_REPLAY_REGISTRATION && w->peer == NULL &&
        (w->peer = strdup(peer)) != NULL)
        w->first_conn = *out;
    return hw_net_ff_ret(w, rc);
}

static void hw_net_ff_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    if (conn == w->kept_conn)
        w->kept_conn = NULL; /* gone with its peer: no repost */
    if (conn == w->first_conn)
        w->first_conn = NULL; /* nothing more to keep */
    w->inner->ops.disconnect(w->inner, conn);
}

static bool hw_net_ff_say(kvs_fault_write_fn fn, const kvs_fault_fabric_t *w, kvs_conn_t *conn,
                          const kvs_write_desc_t *desc)
{
    return fn == NULL || fn(w->cfg.ctx, conn, desc);
}

/* What becomes of write desc (the wrapper's count of it made): spoiled
 * into *d, kept, or neither. */
static kvs_fault_post_t hw_net_ff_choose(kvs_fault_fabric_t *w, kvs_conn_t *conn,
                                         const kvs_write_desc_t *desc, kvs_write_desc_t *d)
{
    const kvs_fault_fabric_config_t *c = &w->cfg;
    if (c->fail_write == 0 || w->writes < c->fail_write || atomic_load(&w->spoiled) != 0 ||
        c->kind == KVS_FAULT_REPLAY_REGISTRATION)
        return KVS_FAULT_POST_NONE;
    if (atomic_load(&w->kept)) { /* stale-write: the write that strikes, if due */
        if (c->stale != KVS_FAULT_STALE_REDIRECT || !hw_net_ff_say(c->pick, w, conn, desc))
            return KVS_FAULT_POST_NONE;
        if (c->due != NULL ? !c->due(c->ctx, conn, desc) : !atomic_load(&w->armed))
            return KVS_FAULT_POST_NONE;
        d->remote_addr = w->kept_desc.remote_addr;
        d->rkey = w->kept_desc.rkey;
        return KVS_FAULT_POST_SPOILED;
    }
    if (!hw_net_ff_say(c->pick, w, conn, desc))
        return KVS_FAULT_POST_NONE;
    switch (c->kind) {
    case KVS_FAULT_WRITE_ERROR:
        d->rkey ^= 0xffffu;
        return KVS_FAULT_POST_SPOILED;
    case KVS_FAULT_HOSTILE_WRITE:
        d->remote_addr += c->hostile_shift_bytes != 0 ? c->hostile_shift_bytes : d->len_bytes;
        return KVS_FAULT_POST_SPOILED;
    default: /* stale-write: goes as it is now */
        return KVS_FAULT_POST_KEPT;
    }
}

static int hw_net_ff_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    if (desc == NULL) /* the inner fabric's refusal, with its words */
        return hw_net_ff_ret(w, w->inner->ops.write(w->inner, conn, desc));
    kvs_write_desc_t d = *desc;
    w->writes++;
    const kvs_fault_post_t post = hw_net_ff_choose(w, conn, desc, &d);
    w->posting = post;
    const int rc = w->inner->ops.write(w->inner, conn, &d);
    w->posting = KVS_FAULT_POST_NONE;
    if (rc == KVS_OK && post == KVS_FAULT_POST_KEPT) {
        w->kept_desc = d;
        w->kept_conn = conn;
        atomic_store(&w->kept, true);
    } else if ((rc == KVS_OK || rc == KVS_EREMOTE) && post == KVS_FAULT_POST_SPOILED) {
        atomic_store(&w->spoiled, 1); /* made, or caught at the post */
    }
    return hw_net_ff_ret(w, rc);
}

static int hw_net_ff_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg,
                          uint32_t len_bytes, uint64_t wr_id)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    if (conn != NULL && conn == w->first_conn && !atomic_load(&w->registered) &&
        w->nmsgs < KVS_FAULT_REPLAY_MAX && len_bytes <= KVS_CONTROL_MSG_MAX_BYTES && msg != NULL) {
        hw_net_ff_msg_t *k = &w->msgs[w->nmsgs++];
        memcpy(k->b, msg, len_bytes);
        k->len = len_bytes;
        k->wr_id = wr_id;
    }
    return hw_net_ff_ret(w, w->inner->ops.send(w->inner, conn, msg, len_bytes, wr_id));
}

static void hw_net_ff_stale_end(kvs_fault_fabric_t *w, int status)
{
    atomic_store(&w->stale_status, status);
    atomic_store(&w->stale_done, true);
}

/* The kept write, posted again on the thread that drives the core (every
 * fabric call of a rank is made under its lock). */
static void hw_net_ff_repost(kvs_fault_fabric_t *w)
{
    w->posted = true;
    atomic_store(&w->spoiled, 1);
    if (w->kept_conn == NULL) {
        hw_net_ff_stale_end(w, KVS_EPEER);
        return;
    }
    kvs_write_desc_t d = w->kept_desc;
    d.wr_id = KVS_FAULT_STALE_WR_ID;
    w->posting = KVS_FAULT_POST_SPOILED;
    const int rc = w->inner->ops.write(w->inner, w->kept_conn, &d);
    w->posting = KVS_FAULT_POST_NONE;
    if (rc != KVS_OK) /* refused at the post (hw/ofi/grant.c may) */
        hw_net_ff_stale_end(w, rc);
}

static void hw_net_ff_replay_end(kvs_fault_fabric_t *w, int status)
{
    atomic_store(&w->replay_status, status);
    atomic_store(&w->replay_settled, true);
}

/* The kept messages, in order, on a new connection to the same peer. */
static void hw_net_ff_replay(kvs_fault_fabric_t *w)
{
    w->replay_posted = true;
    if (w->peer == NULL || w->nmsgs == 0) {
        hw_net_ff_replay_end(w, KVS_ENOENT); /* the rank never connected, or sent nothing */
        return;
    }
    int rc = w->inner->ops.connect(w->inner, w->peer, &w->replay_conn);
    if (rc != KVS_OK) {
        w->replay_conn = NULL;
        hw_net_ff_replay_end(w, rc);
        return;
    }
    for (uint32_t i = 0; i < w->nmsgs; i++) {
        const hw_net_ff_msg_t *k = &w->msgs[i];
        if ((rc = w->inner->ops.send(w->inner, w->replay_conn, k->b, k->len, k->wr_id)) !=
            KVS_OK) {
            hw_net_ff_replay_end(w, rc);
            return;
        }
        atomic_fetch_add(&w->replayed, 1u);
    }
}

/* Takes the completions of the replay's connection out of out[0, n). */
static int hw_net_ff_take_replay(kvs_fault_fabric_t *w, kvs_completion_t *out, int n)
{
    const kvs_conn_t *replay = w->replay_conn; /* the whole batch's, even once closed */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (out[i].conn != replay) {
            out[kept++] = out[i];
            continue;
        }
        if (out[i].kind == KVS_COMPLETION_RECV) {
            atomic_fetch_add(&w->answers, 1u); /* the prefill heard the replay */
            atomic_store(&w->replay_settled, true);
        } else if (out[i].kind == KVS_COMPLETION_DISCONNECT && w->replay_conn != NULL) {
            w->inner->ops.disconnect(w->inner, w->replay_conn);
            w->replay_conn = NULL;
            atomic_store(&w->replay_settled, true);
        }
    }
    return kept;
}

static int hw_net_ff_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    if (w->cfg.kind == KVS_FAULT_STALE_WRITE && w->cfg.stale == KVS_FAULT_STALE_REPOST &&
        atomic_load(&w->kept) && !w->posted && atomic_load(&w->armed))
        hw_net_ff_repost(w);
    if (w->cfg.kind == KVS_FAULT_REPLAY_REGISTRATION && !w->replay_posted &&
        atomic_load(&w->armed))
        hw_net_ff_replay(w);
    int n = w->inner->ops.poll(w->inner, out, max);
    if (n > 0 && w->replay_conn != NULL)
        n = hw_net_ff_take_replay(w, out, n);
    if (n <= 0 || !w->posted || atomic_load(&w->stale_done))
        return hw_net_ff_ret(w, n);
    for (int i = 0; i < n; i++) {
        if (out[i].kind != KVS_COMPLETION_WRITE || out[i].wr_id != KVS_FAULT_STALE_WR_ID)
            continue;
        hw_net_ff_stale_end(w, out[i].status);
        memmove(&out[i], &out[i + 1], (size_t)(n - i - 1) * sizeof out[0]);
        n--;
        break;
    }
    return n;
}

static uint64_t hw_net_ff_now_ns(kvs_fabric_t *fab)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return w->inner->ops.now_ns(w->inner);
}

static int hw_net_ff_wait_arm(kvs_fabric_t *fab, int *out_fd, uint64_t *out_wake_ns)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return hw_net_ff_ret(w, w->inner->ops.wait_arm(w->inner, out_fd, out_wake_ns));
}

static int hw_net_ff_random_bytes(kvs_fabric_t *fab, void *buf, size_t len_bytes)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return hw_net_ff_ret(w, w->inner->ops.random_bytes(w->inner, buf, len_bytes));
}

static int hw_net_ff_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return w->inner->ops.peer_addr(w->inner, conn, buf, bytes);
}

static int hw_net_ff_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                               uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return hw_net_ff_ret(w, w->inner->ops.key_grant(w->inner, conn, mr, addr, len_bytes, out,
                                                    out_rkey));
}

static int hw_net_ff_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return hw_net_ff_ret(w, w->inner->ops.key_revoke(w->inner, grant));
}

static uint64_t hw_net_ff_max_write_bytes(kvs_fabric_t *fab)
{
    kvs_fault_fabric_t *w = hw_net_ff(fab);
    return w->inner->ops.max_write_bytes(w->inner);
}

/* The required slots of the table that tells the defaults apart. */
static int hw_net_ff_no_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                 uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    return KVS_ENOTSUP;
}
static int hw_net_ff_no_deregister(kvs_fabric_t *fab, kvs_mr_t *mr) { return KVS_ENOTSUP; }

/* The wrapper's table: each optional slot forwarded where the inner
 * fabric fills it, left to the default where the inner has the default
 * (known from a table that fills only the required slots), so a check of
 * a slot's presence (the core's of key_grant) reads the inner's answer. */
static int hw_net_ff_ops(const kvs_fabric_t *inner, kvs_fabric_ops_t *ops)
{
    const kvs_fabric_ops_t bare = {.version = KVS_FABRIC_OPS_VERSION,
                                   .size = sizeof(kvs_fabric_ops_t), .name = "fault",
                                   .mr_register = hw_net_ff_no_register,
                                   .mr_deregister = hw_net_ff_no_deregister};
    kvs_fabric_t dflt;
    const int rc = kvs_fabric_init(&dflt, &bare, "fault");
    if (rc != KVS_OK)
        return rc;
    const kvs_fabric_ops_t *in = &inner->ops, *df = &dflt.ops;
#define HW_NET_FF_SLOT(slot, fn) (in->slot != df->slot ? (fn) : NULL)
    *ops = (kvs_fabric_ops_t){
        .version = KVS_FABRIC_OPS_VERSION,
        .size = sizeof(kvs_fabric_ops_t),
        .name = "fault",
        .caps = in->caps,
        .mr_register = hw_net_ff_mr_register,
        .mr_deregister = hw_net_ff_mr_deregister,
        .connect = HW_NET_FF_SLOT(connect, hw_net_ff_connect),
        .disconnect = HW_NET_FF_SLOT(disconnect, hw_net_ff_disconnect),
        .write = HW_NET_FF_SLOT(write, hw_net_ff_write),
        .send = HW_NET_FF_SLOT(send, hw_net_ff_send),
        .poll = HW_NET_FF_SLOT(poll, hw_net_ff_poll),
        .now_ns = HW_NET_FF_SLOT(now_ns, hw_net_ff_now_ns),
        .wait_arm = HW_NET_FF_SLOT(wait_arm, hw_net_ff_wait_arm),
        .random_bytes = HW_NET_FF_SLOT(random_bytes, hw_net_ff_random_bytes),
        .peer_addr = HW_NET_FF_SLOT(peer_addr, hw_net_ff_peer_addr),
        .key_grant = HW_NET_FF_SLOT(key_grant, hw_net_ff_key_grant),
        .key_revoke = HW_NET_FF_SLOT(key_revoke, hw_net_ff_key_revoke),
        .mr_register_sealed = HW_NET_FF_SLOT(mr_register_sealed, hw_net_ff_mr_register_sealed),
        .max_write_bytes = HW_NET_FF_SLOT(max_write_bytes, hw_net_ff_max_write_bytes),
    };
#undef HW_NET_FF_SLOT
    return KVS_OK;
}

int kvs_fault_fabric_create(kvs_fabric_t *inner, const kvs_fault_fabric_config_t *cfg,
                            kvs_fault_fabric_t **out)
{
    if (inner == NULL || cfg == NULL || out == NULL ||
        (unsigned)cfg->kind > KVS_FAULT_REPLAY_REGISTRATION ||
        (unsigned)cfg->stale > KVS_FAULT_STALE_REDIRECT)
        return KVS_EINVAL;
    kvs_fabric_ops_t ops;
    int rc = hw_net_ff_ops(inner, &ops);
    if (rc != KVS_OK)
        return rc;
    kvs_fault_fabric_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return KVS_ENOMEM;
    if ((rc = kvs_fabric_init(&w->base, &ops, "fault")) != KVS_OK) {
        free(w);
        return rc;
    }
    w->inner = inner;
    w->cfg = *cfg;
    /* calloc's zeroes start the other atomics: false, 0, KVS_OK */
    atomic_init(&w->stale_status, 1);
    if (cfg->kind == KVS_FAULT_REPLAY_REGISTRATION &&
        (w->msgs = calloc(KVS_FAULT_REPLAY_MAX, sizeof *w->msgs)) == NULL) {
        free(w);
        return KVS_ENOMEM;
    }
    *out = w;
    return KVS_OK;
}

void kvs_fault_fabric_destroy(kvs_fault_fabric_t *w)
{
    if (w == NULL)
        return;
    if (w->replay_conn != NULL)
        w->inner->ops.disconnect(w->inner, w->replay_conn);
    free(w->msgs);
    free(w->peer);
    free(w);
}

kvs_fabric_t *kvs_fault_fabric(kvs_fault_fabric_t *w) { return &w->base; }

void kvs_fault_fabric_rebind(kvs_fault_fabric_t *w, kvs_fabric_t *inner)
{
    w->inner = inner;
    w->kept_conn = NULL;
    w->first_conn = NULL;
    w->replay_conn = NULL;
}

kvs_fault_post_t kvs_fault_fabric_posting(const kvs_fault_fabric_t *w) { return w->posting; }

uint64_t kvs_fault_fabric_spoiled(const kvs_fault_fabric_t *w) { return atomic_load(&w->spoiled); }

void kvs_fault_fabric_arm(kvs_fault_fabric_t *w) { atomic_store(&w->armed, true); }

void kvs_fault_fabric_registered(kvs_fault_fabric_t *w) { atomic_store(&w->registered, true); }

bool kvs_fault_fabric_settled(const kvs_fault_fabric_t *w)
{
    if (w->cfg.kind == KVS_FAULT_REPLAY_REGISTRATION)
        return !atomic_load(&w->armed) || atomic_load(&w->replay_settled);
    if (w->cfg.kind != KVS_FAULT_STALE_WRITE || !atomic_load(&w->kept))
        return true;
    return w->cfg.stale == KVS_FAULT_STALE_REDIRECT ? atomic_load(&w->spoiled) != 0
                                                    : atomic_load(&w->stale_done);
}

uint32_t kvs_fault_fabric_replayed(const kvs_fault_fabric_t *w, int *status, uint32_t *answers)
{
    *status = atomic_load(&w->replay_status);
    *answers = atomic_load(&w->answers);
    return atomic_load(&w->replayed);
}

int kvs_fault_fabric_stale_status(const kvs_fault_fabric_t *w)
{
    return atomic_load(&w->stale_done) ? atomic_load(&w->stale_status) : 1;
}
