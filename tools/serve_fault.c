/*
 * serve_fault.c - the wrapper fabric of serve_fault.h. Every slot forwards
 * to the inner fabric and copies its error detail back, so the core's
 * messages name the real backend's failure. A write-error write keeps its
 * address and length and gets a remote key no registration has (the low
 * 16 bits flipped; a split-MR handle, bit 63, is left alone and the next
 * plain key is spoiled instead). A hostile write keeps its key and length
 * and lands CLI_FAULT_HOSTILE_SHIFT bytes further.
 */
#include "serve_fault.h"

#include <stdlib.h>
#include <string.h>

struct cli_fault_fabric {
    kvs_fabric_t base; /* first: the core sees this */
    kvs_fabric_t *inner;
    uint64_t fail_write, writes, spoiled;
    cli_fault_kind_t kind;
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
    return cli_ff_ret(w, w->inner->ops.connect(w->inner, peer, out));
}

static void cli_ff_disconnect(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    w->inner->ops.disconnect(w->inner, conn);
}

static int cli_ff_write(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    kvs_write_desc_t d = *desc;
    w->writes++;
    if (w->fail_write != 0 && w->spoiled == 0 && w->writes >= w->fail_write &&
        (d.rkey >> 63) == 0) {
        if (w->kind == CLI_FAULT_HOSTILE_WRITE)
            d.remote_addr += CLI_FAULT_HOSTILE_SHIFT;
        else
            d.rkey ^= 0xffffu;
        w->spoiled++;
    }
    return cli_ff_ret(w, w->inner->ops.write(w->inner, conn, &d));
}

static int cli_ff_send(kvs_fabric_t *fab, kvs_conn_t *conn, const void *msg, uint32_t len_bytes,
                       uint64_t wr_id)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return cli_ff_ret(w, w->inner->ops.send(w->inner, conn, msg, len_bytes, wr_id));
}

static int cli_ff_poll(kvs_fabric_t *fab, kvs_completion_t *out, int max)
{
    cli_fault_fabric_t *w = cli_ff(fab);
    return cli_ff_ret(w, w->inner->ops.poll(w->inner, out, max));
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
        /* key_grant / key_revoke are not forwarded: the wrapper sits on a
         * prefill rank only (serve_rank.c), and grants are the decode's. */
    };
    int rc = kvs_fabric_init(&w->base, &ops, "fault");
    if (rc != KVS_OK) {
        free(w);
        return rc;
    }
    w->inner = inner;
    w->fail_write = fail_write;
    w->kind = kind;
    *out = w;
    return KVS_OK;
}

void cli_fault_fabric_destroy(cli_fault_fabric_t *w) { free(w); }

kvs_fabric_t *cli_fault_fabric(cli_fault_fabric_t *w) { return &w->base; }

uint64_t cli_fault_fabric_spoiled(const cli_fault_fabric_t *w) { return w->spoiled; }
