/*
 * serve_fault.c - the wrapper fabric of serve_fault.h. Every slot forwards
 * to the inner fabric and copies its error detail back, so the core's
 * messages name the real backend's failure. A write-error write keeps its
 * address and length and gets a remote key no registration has (the low
 * 16 bits flipped; a split-MR handle, bit 63, is left alone and the next
 * plain key is spoiled instead). A hostile write keeps its key and length
 * and lands CLI_FAULT_HOSTILE_SHIFT bytes further. A stale write is kept
 * whole (the same choice of write) and posted again, with its own wr_id,
 * from the first poll after the rank arms it; poll takes its completion
 * out of what the core sees. A replayed registration goes on a connection
 * of the wrapper's own, which the core never sees either: poll takes every
 * completion on it (the prefill's answers are counted, a disconnect is
 * honoured), and destroy closes it.
 */
#include "serve_fault.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct cli_ff_kept_msg {
    uint8_t b[KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t len;
    uint64_t wr_id;
} cli_ff_kept_msg_t;

struct cli_fault_fabric {
    kvs_fabric_t base; /* first: the core sees this */
    kvs_fabric_t *inner;
    uint64_t fail_write, writes, spoiled;
    cli_fault_kind_t kind;
    /* stale-write: the kept write and its connection (NULL once the core
     * disconnected it), armed by the rank, posted by poll */
    bool posted;
    kvs_write_desc_t kept_desc;
    kvs_conn_t *kept_conn;
    atomic_bool kept, armed, stale_done;
    atomic_int stale_status;
    /* replay-registration: the first connection and its peer, what the rank
     * sent on it until registered, and the replay's own connection */
    kvs_conn_t *first_conn, *replay_conn;
    char *peer;
    cli_ff_kept_msg_t *msgs; /* [CLI_FAULT_REPLAY_MAX] */
    uint32_t nmsgs;
    bool replay_posted;
    atomic_bool registered, replay_settled;
    atomic_uint replayed, answers;
    atomic_int replay_status;
};

static cli_fault_fabric_t *cli_ff(kvs_fabric_t *fab)
{
    return KVS_CONTAINER_OF(fab, cli_fault_fabric_t, base);
}

/* The inner fabric's error detail becomes the wrapper's. */
static int cli_ff_ret(cli_fault_fabric_t *w, int rc)
{
    if (rc < 0) {
        w->base.last_backend_code = w->inner->last_backend_code;
        memcpy(w->base.last_backend_msg, w->inner->last_backend_msg,
               sizeof w->base.last_backend_msg);
    }
    return rc;
}

static int cli_ff_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                              uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return cli_ff_ret(w, w->inner->ops.mr_register(w->inner, dev, addr, len_bytes, out,
                                                   out_rkey));
}

static int cli_ff_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return cli_ff_ret(w, w->inner->ops.mr_deregister(w->inner, mr));
}

static int cli_ff_connect(kvs_fabric_t *fab, const char *peer, kvs_conn_t **out)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    const int rc = w->inner->ops.connect(w->inner, peer, out);
    if (rc == KVS_OK && w->kind == CLI_FAULT_REPLAY_REGISTRATION && w->peer == NULL &&
        (w->peer = strdup(peer)) != NULL)
        w->first_conn = *out;
    return cli_ff_ret(w, rc);
}

static void cli_ff_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    if (conn == w->kept_conn)
        w->kept_conn = NULL; /* gone with its peer: no second post */
    if (conn == w->first_conn)
        w->first_conn = NULL; /* nothing more to keep */
    w->inner->ops.disconnect(w->inner, conn);
}

static int cli_ff_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    kvs_write_desc_t d = *desc;
    w->writes++;
    if (w->fail_write != 0 && w->spoiled == 0 && w->writes >= w->fail_write &&
        (d.rkey >> 63) == 0 && !atomic_load(&w->kept)) {
        if (w->kind == CLI_FAULT_STALE_WRITE) {
            w->kept_desc = d; /* goes as it is now; again once armed */
            w->kept_conn = conn;
            atomic_store(&w->kept, true);
        } else {
            if (w->kind == CLI_FAULT_HOSTILE_WRITE)
                d.remote_addr += CLI_FAULT_HOSTILE_SHIFT;
            else
                d.rkey ^= 0xffffu;
            w->spoiled++;
        }
    }
    return cli_ff_ret(w, w->inner->ops.write(w->inner, conn, &d));
}

static int cli_ff_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                       uint64_t wr_id)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    if (conn != NULL && conn == w->first_conn && !atomic_load(&w->registered) &&
        w->nmsgs < CLI_FAULT_REPLAY_MAX && len_bytes <= KVS_CONTROL_MSG_MAX_BYTES) {
        cli_ff_kept_msg_t *k = &w->msgs[w->nmsgs++];
        memcpy(k->b, msg, len_bytes);
        k->len = len_bytes;
        k->wr_id = wr_id;
    }
    return cli_ff_ret(w, w->inner->ops.send(w->inner, conn, msg, len_bytes, wr_id));
}

static void cli_ff_stale_end(cli_fault_fabric_t *w, int status)
{
    atomic_store(&w->stale_status, status);
    atomic_store(&w->stale_done, true);
}

/* The kept write, posted again on the thread that drives the core (every
 * fabric call of a rank is made under its lock). */
static void cli_ff_post_stale(cli_fault_fabric_t *w)
{
    w->posted = true;
    w->spoiled++;
    if (w->kept_conn == NULL) {
        cli_ff_stale_end(w, KVS_EPEER);
        return;
    }
    kvs_write_desc_t d = w->kept_desc;
    d.wr_id = CLI_FAULT_STALE_WR_ID;
    const int rc = w->inner->ops.write(w->inner, w->kept_conn, &d);
    if (rc != KVS_OK) /* refused at the post (hw/ofi/grant.c may) */
        cli_ff_stale_end(w, rc);
}

static void cli_ff_replay_end(cli_fault_fabric_t *w, int status)
{
    atomic_store(&w->replay_status, status);
    atomic_store(&w->replay_settled, true);
}

/* The kept messages, in order, on a new connection to the same peer. */
static void cli_ff_replay(cli_fault_fabric_t *w)
{
    w->replay_posted = true;
    if (w->peer == NULL || w->nmsgs == 0) {
        cli_ff_replay_end(w, KVS_ENOENT); /* the rank never connected, or sent nothing */
        return;
    }
    int rc = w->inner->ops.connect(w->inner, w->peer, &w->replay_conn);
    if (rc != KVS_OK) {
        w->replay_conn = NULL;
        cli_ff_replay_end(w, rc);
        return;
    }
    for (uint32_t i = 0; i < w->nmsgs; i++) {
        const cli_ff_kept_msg_t *k = &w->msgs[i];
        if ((rc = w->inner->ops.send(w->inner, w->replay_conn, k->b, k->len, k->wr_id)) != KVS_OK) {
            cli_ff_replay_end(w, rc);
            return;
        }
        atomic_fetch_add(&w->replayed, 1u);
    }
}

/* Takes the completions of the replay's connection out of out[0, n). */
static int cli_ff_take_replay(cli_fault_fabric_t *w, kvs_completion_t *out, int n)
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

static int cli_ff_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    if (atomic_load(&w->kept) && !w->posted && atomic_load(&w->armed))
        cli_ff_post_stale(w);
    if (w->kind == CLI_FAULT_REPLAY_REGISTRATION && !w->replay_posted && atomic_load(&w->armed))
        cli_ff_replay(w);
    int n = w->inner->ops.poll(w->inner, out, max);
    if (n > 0 && w->replay_conn != NULL)
        n = cli_ff_take_replay(w, out, n);
    if (n <= 0 || !w->posted || atomic_load(&w->stale_done))
        return cli_ff_ret(w, n);
    for (int i = 0; i < n; i++) {
        if (out[i].kind != KVS_COMPLETION_WRITE || out[i].wr_id != CLI_FAULT_STALE_WR_ID)
            continue;
        cli_ff_stale_end(w, out[i].status);
        memmove(&out[i], &out[i + 1], (size_t)(n - i - 1) * sizeof out[0]);
        n--;
        break;
    }
    return n;
}

static uint64_t cli_ff_now_ns(kvs_fabric_t *fab)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return w->inner->ops.now_ns(w->inner);
}

static int cli_ff_wait_arm(kvs_fabric_t *fab, int *out_fd, uint64_t *out_wake_ns)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return cli_ff_ret(w, w->inner->ops.wait_arm(w->inner, out_fd, out_wake_ns));
}

static int cli_ff_random_bytes(kvs_fabric_t *fab, void *buf, size_t len_bytes)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return cli_ff_ret(w, w->inner->ops.random_bytes(w->inner, buf, len_bytes));
}

static int cli_ff_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return w->inner->ops.peer_addr(w->inner, conn, buf, bytes);
}

static int cli_ff_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                            uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return cli_ff_ret(w, w->inner->ops.key_grant(w->inner, conn, mr, addr, len_bytes, out,
                                                 out_rkey));
}

static int cli_ff_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return cli_ff_ret(w, w->inner->ops.key_revoke(w->inner, grant));
}

static uint64_t cli_ff_max_write_bytes(kvs_fabric_t *fab)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return w->inner->ops.max_write_bytes(w->inner);
}

int cli_fault_fabric_create(kvs_fabric_t *inner, uint64_t fail_write, cli_fault_kind_t kind,
                            cli_fault_fabric_t **out)
{
    if (inner == NULL || out == NULL)
        return KVS_EINVAL;
    cli_fault_fabric_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return KVS_ENOMEM;
    const kvs_fabric_ops_t ops = {
        .version = KVS_FABRIC_OPS_VERSION,
        .size = sizeof(kvs_fabric_ops_t),
        .name = "fault",
        .caps = inner->ops.caps,
        .mr_register = cli_ff_mr_register,
        .mr_deregister = cli_ff_mr_deregister,
        .connect = cli_ff_connect,
        .disconnect = cli_ff_disconnect,
        .write = cli_ff_write,
        .send = cli_ff_send,
        .poll = cli_ff_poll,
        .now_ns = cli_ff_now_ns,
        .wait_arm = cli_ff_wait_arm,
        .random_bytes = cli_ff_random_bytes,
        .peer_addr = cli_ff_peer_addr,
        .key_grant = cli_ff_key_grant, /* a decode's (replay-registration) */
        .key_revoke = cli_ff_key_revoke,
        .max_write_bytes = cli_ff_max_write_bytes, /* the inner fabric's limit */
    };
    int rc = kvs_fabric_init(&w->base, &ops, "fault");
    if (rc != KVS_OK) {
        free(w);
        return rc;
    }
    w->inner = inner;
    w->fail_write = fail_write;
    w->kind = kind;
    atomic_init(&w->kept, false);
    atomic_init(&w->armed, false);
    atomic_init(&w->stale_done, false);
    atomic_init(&w->stale_status, 1);
    atomic_init(&w->registered, false);
    atomic_init(&w->replay_settled, false);
    atomic_init(&w->replayed, 0u);
    atomic_init(&w->answers, 0u);
    atomic_init(&w->replay_status, KVS_OK);
    if (kind == CLI_FAULT_REPLAY_REGISTRATION &&
        (w->msgs = calloc(CLI_FAULT_REPLAY_MAX, sizeof *w->msgs)) == NULL) {
        free(w);
        return KVS_ENOMEM;
    }
    *out = w;
    return KVS_OK;
}

/* After the rank's driver stopped: no other call into the fabric now. */
void cli_fault_fabric_destroy(cli_fault_fabric_t *w)
{
    if (w == NULL)
        return;
    if (w->replay_conn != NULL)
        w->inner->ops.disconnect(w->inner, w->replay_conn);
    free(w->msgs);
    free(w->peer);
    free(w);
}

kvs_fabric_t *cli_fault_fabric(cli_fault_fabric_t *w) { return &w->base; }

uint64_t cli_fault_fabric_spoiled(const cli_fault_fabric_t *w) { return w->spoiled; }

void cli_fault_fabric_arm(cli_fault_fabric_t *w) { atomic_store(&w->armed, true); }

bool cli_fault_fabric_settled(const cli_fault_fabric_t *w)
{
    if (w->kind == CLI_FAULT_REPLAY_REGISTRATION)
        return !atomic_load(&w->armed) || atomic_load(&w->replay_settled);
    return w->kind != CLI_FAULT_STALE_WRITE || !atomic_load(&w->kept) ||
           atomic_load(&w->stale_done);
}

void cli_fault_fabric_registered(cli_fault_fabric_t *w) { atomic_store(&w->registered, true); }

uint32_t cli_fault_fabric_replayed(const cli_fault_fabric_t *w, int *status, uint32_t *answers)
{
    *status = atomic_load(&w->replay_status);
    *answers = atomic_load(&w->answers);
    return atomic_load(&w->replayed);
}

int cli_fault_fabric_stale_status(const cli_fault_fabric_t *w)
{
    return atomic_load(&w->stale_done) ? atomic_load(&w->stale_status) : 1;
}
