/*
 * fabric.c - the verbs fabric's ops table ("verbs"), create and destroy,
 * the public helpers of <kvstage/verbs.h>, and the clock.
 *
 * Create: reads every RDMA device (rdma_get_devices, so the contexts are
 * the ones rdma_cm binds to) into a snapshot, and where each sits on PCIe
 * when near_pci asks for the closest one (topology.c); lets select.c choose
 * device, port and GID; checks the bounds against the device's limits;
 * makes the PD, the completion channel and CQ (sized for every
 * connection's send and receive queues, so it cannot overrun), the
 * non-blocking rdma_cm channel, the wait set over both channels
 * (hw/net/waitset.h) whose fd wait_arm hands out, and the listener; and
 * logs the device with the reason it was chosen (cfg.log, KVS_LOG_INFO).
 * Every failure unwinds in reverse and says what to change.
 */
#include "hw_verbs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HW_VERBS_DEFAULT_CONNS 16u
#define HW_VERBS_DEFAULT_SQ 1024u
#define HW_VERBS_DEFAULT_RQ 128u
#define HW_VERBS_DEFAULT_SBUF (256u * 1024u)
#define HW_VERBS_DEFAULT_MRS 1024u
#define HW_VERBS_DEFAULT_PIECES 4096u
#define HW_VERBS_DEFAULT_GRANTS 1024u
#define HW_VERBS_RXE_VENDOR_ID 0xffffffu /* soft-RoCE (RXE_VENDOR_ID) */
#define HW_VERBS_DEFAULT_TIMEOUT_MS 10000u

_Static_assert(sizeof(((kvs_verbs_info_t *)0)->device_reason) >= HW_VERBS_REASON_BYTES,
               "kvs_verbs_info_t.device_reason holds select.c's reasons whole");

static int hw_verbs_mr_register_op(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                   uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);

uint64_t hw_verbs_now_ns(kvs_fabric_t *fab)
{
    (void)fab;
    return hw_net_now_ns();
}

static int hw_verbs_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes)
{
    (void)fab;
    return conn != NULL ? hw_net_peer_text(conn->net.peer, buf, bytes) : KVS_EINVAL;
}

static const kvs_fabric_ops_t hw_verbs_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    .name = "verbs",
    .caps = KVS_FABRIC_CAP_WRITE_IMM | KVS_FABRIC_CAP_PER_LAYER_WRITES |
            KVS_FABRIC_CAP_RELIABLE_SEND, /* RC */
    .mr_register = hw_verbs_mr_register_op,
    .mr_deregister = hw_verbs_mr_deregister,
    .connect = hw_verbs_connect,
    .disconnect = hw_verbs_disconnect,
    .write = hw_verbs_write,
    .send = hw_verbs_send,
    .poll = hw_verbs_poll,
    .now_ns = hw_verbs_now_ns,
    .wait_arm = hw_verbs_wait_arm,
    .random_bytes = hw_net_random_bytes,
    .peer_addr = hw_verbs_peer_addr,
    .key_grant = hw_verbs_key_grant,
    .key_revoke = hw_verbs_key_revoke,
    .mr_register_sealed = hw_verbs_mr_register_sealed,
};
/* Version 6's max_write_bytes keeps its default (no limit): a write longer
 * than the port's max_msg_sz is cut into work requests here (post.c). */
_Static_assert(KVS_FABRIC_OPS_VERSION == 6u,
               "the verbs table fills every slot of version 6 but max_write_bytes");

/* The table's mr_register is this file's, so that hw_verbs_try can tell a
 * verbs fabric by it. */
static int hw_verbs_mr_register_op(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                   uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    return hw_verbs_mr_register(fab, dev, addr, len_bytes, false, out, out_rkey);
}

static hw_verbs_fabric_t *hw_verbs_try(kvs_fabric_t *fab)
{
    if (fab == NULL || fab->ops.mr_register != hw_verbs_mr_register_op)
        return NULL;
    return KVS_CONTAINER_OF(fab, hw_verbs_fabric_t, base);
}

void kvs_verbs_config_init(kvs_verbs_config_t *cfg)
{
    if (cfg != NULL)
        *cfg = (kvs_verbs_config_t){.gid_index = KVS_VERBS_GID_AUTO};
}

/* ---- the device snapshot -------------------------------------------------------- */

typedef struct hw_verbs_snapshot {
    hw_verbs_dev_info_t *devs;
    hw_verbs_port_info_t *ports;
    hw_verbs_gid_t *gids;
    int ndevs;
} hw_verbs_snapshot_t;

static void hw_verbs_snapshot_free(hw_verbs_snapshot_t *s)
{
    free(s->devs);
    free(s->ports);
    free(s->gids);
}

/* Reads device, port and GID attributes of every context. */
static int hw_verbs_snapshot(struct ibv_context **ctxs, int n, hw_verbs_snapshot_t *s,
                             char *why, size_t why_bytes)
{
    memset(s, 0, sizeof *s);
    int nports = 0, ngids = 0;
    uint8_t *port_cnt = calloc((size_t)(n > 0 ? n : 1), 1);
    if (port_cnt == NULL) {
        snprintf(why, why_bytes, "no memory for the device list");
        return KVS_ENOMEM;
    }
    for (int d = 0; d < n; d++) {
        struct ibv_device_attr da;
        if (ibv_query_device(ctxs[d], &da) != 0) {
            snprintf(why, why_bytes, "ibv_query_device(%s) failed: %s",
                     ibv_get_device_name(ctxs[d]->device), strerror(errno));
            free(port_cnt);
            return KVS_EBACKEND;
        }
        port_cnt[d] = da.phys_port_cnt;
        nports += da.phys_port_cnt;
        for (int p = 1; p <= da.phys_port_cnt; p++) {
            struct ibv_port_attr pa;
            if (ibv_query_port(ctxs[d], (uint8_t)p, &pa) == 0)
                ngids += pa.gid_tbl_len;
        }
    }
    s->devs = calloc((size_t)(n > 0 ? n : 1), sizeof *s->devs);
    s->ports = calloc((size_t)(nports > 0 ? nports : 1), sizeof *s->ports);
    s->gids = calloc((size_t)(ngids > 0 ? ngids : 1), sizeof *s->gids);
    struct ibv_gid_entry *ent = calloc((size_t)(ngids > 0 ? ngids : 1), sizeof *ent);
    if (s->devs == NULL || s->ports == NULL || s->gids == NULL || ent == NULL) {
        free(ent);
        free(port_cnt);
        snprintf(why, why_bytes, "no memory for the device list");
        return KVS_ENOMEM;
    }
    int pi = 0, gi = 0;
    for (int d = 0; d < n; d++) {
        s->devs[d].name = ibv_get_device_name(ctxs[d]->device);
        s->devs[d].ports = &s->ports[pi];
        s->devs[d].nports = port_cnt[d];
        int tbl = 0;
        for (int p = 1; p <= port_cnt[d]; p++) {
            struct ibv_port_attr pa;
            if (ibv_query_port(ctxs[d], (uint8_t)p, &pa) == 0)
                tbl += pa.gid_tbl_len;
        }
        ssize_t got = tbl > 0 ? ibv_query_gid_table(ctxs[d], ent, (size_t)tbl, 0) : 0;
        for (int p = 1; p <= port_cnt[d]; p++) {
            hw_verbs_port_info_t *port = &s->ports[pi++];
            struct ibv_port_attr pa;
            if (ibv_query_port(ctxs[d], (uint8_t)p, &pa) != 0) {
                port->state = IBV_PORT_NOP;
                continue;
            }
            port->state = pa.state;
            port->link_layer = pa.link_layer;
            port->active_mtu = pa.active_mtu;
            port->gid_tbl_len = pa.gid_tbl_len;
            port->gids = &s->gids[gi];
            if (got >= 0) {
                for (ssize_t k = 0; k < got && gi < ngids; k++) {
                    if ((int)ent[k].port_num != p)
                        continue;
                    memcpy(s->gids[gi].raw, ent[k].gid.raw, 16);
                    s->gids[gi].index = (int)ent[k].gid_index;
                    s->gids[gi].type = (int)ent[k].gid_type;
                    gi++;
                    port->ngids++;
                }
            } else { /* an older kernel: one entry at a time */
                for (int k = 0; k < pa.gid_tbl_len && gi < ngids; k++) {
                    struct ibv_gid_entry e;
                    if (ibv_query_gid_ex(ctxs[d], (uint32_t)p, (uint32_t)k, &e, 0) != 0)
                        continue;
                    memcpy(s->gids[gi].raw, e.gid.raw, 16);
                    s->gids[gi].index = k;
                    s->gids[gi].type = (int)e.gid_type;
                    gi++;
                    port->ngids++;
                }
            }
        }
    }
    free(ent);
    free(port_cnt);
    s->ndevs = n;
    return KVS_OK;
}

/* ---- create / destroy ----------------------------------------------------------- */

static void hw_verbs_free(hw_verbs_fabric_t *f)
{
    if (f->conns != NULL)
        for (uint32_t i = 0; i < f->cfg.max_conns; i++)
            if (f->conns[i].net.state != HW_NET_CONN_FREE)
                hw_verbs_conn_free(&f->conns[i]);
    hw_verbs_grants_free_all(f);
    if (f->listener != NULL)
        (void)rdma_destroy_id(f->listener);
    hw_net_waitset_destroy(&f->waits);
    if (f->ch != NULL)
        rdma_destroy_event_channel(f->ch);
    if (f->mrs != NULL)
        hw_verbs_mr_free_all(f);
    if (f->cq != NULL)
        (void)ibv_destroy_cq(f->cq);
    if (f->cc != NULL)
        (void)ibv_destroy_comp_channel(f->cc);
    if (f->pd != NULL)
        (void)ibv_dealloc_pd(f->pd);
    if (f->devices != NULL)
        rdma_free_devices(f->devices);
    hw_verbs_cuda_close(f->cuda);
    free(f->wrs);
    free(f->sges);
    free(f->conns);
    free(f->mrs);
    free(f->grants);
    free(f);
}

static int hw_verbs_config(const kvs_verbs_config_t *in, kvs_verbs_config_t *c, kvs_error_t *err)
{
    *c = *in;
    if (c->max_conns == 0)
        c->max_conns = HW_VERBS_DEFAULT_CONNS;
    if (c->sq_depth == 0)
        c->sq_depth = HW_VERBS_DEFAULT_SQ;
    if (c->recv_depth == 0)
        c->recv_depth = HW_VERBS_DEFAULT_RQ;
    if (c->send_buf_bytes == 0)
        c->send_buf_bytes = HW_VERBS_DEFAULT_SBUF;
    if (c->max_mrs == 0)
        c->max_mrs = HW_VERBS_DEFAULT_MRS;
    if (c->max_mr_pieces == 0)
        c->max_mr_pieces = HW_VERBS_DEFAULT_PIECES;
    if (c->max_grants == 0)
        c->max_grants = HW_VERBS_DEFAULT_GRANTS;
    if (c->connect_timeout_ms == 0)
        c->connect_timeout_ms = HW_VERBS_DEFAULT_TIMEOUT_MS;
    if (c->max_conns > HW_VERBS_MAX_SLOTS || c->sq_depth > HW_VERBS_MAX_SLOTS ||
        c->recv_depth > HW_VERBS_MAX_SLOTS)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "verbs config: max_conns %u, sq_depth %u "
                             "and recv_depth %u must each be at most %u",
                             c->max_conns, c->sq_depth, c->recv_depth,
                             HW_VERBS_MAX_SLOTS);
    if (c->send_buf_bytes < KVS_CONTROL_MSG_MAX_BYTES)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "verbs config: send_buf_bytes %u is less "
                             "than one control message (%u bytes): raise it",
                             c->send_buf_bytes, KVS_CONTROL_MSG_MAX_BYTES);
    if (c->max_mtu_bytes != 0 && (c->max_mtu_bytes < 256 || c->max_mtu_bytes > 4096))
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "verbs config: max_mtu_bytes %u is "
                             "outside 256..4096 (0: the port's MTU)", c->max_mtu_bytes);
    if (c->gid_index < KVS_VERBS_GID_AUTO)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "verbs config: gid_index %d: use an index "
                             ">= 0 or KVS_VERBS_GID_AUTO (-1)", c->gid_index);
    char bus_id[HW_VERBS_BUS_ID_BYTES];
    if (c->near_pci != NULL && !hw_verbs_bus_id_parse(c->near_pci, bus_id, sizeof bus_id))
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "verbs config: near_pci '%.64s' is not a PCI "
                             "bus id: give DOMAIN:BUS:DEVICE.FUNCTION as cudaDeviceGetPCIBusId "
                             "reports it, e.g. 0000:3b:00.0", c->near_pci);
    if (c->log.fn == NULL && c->log.level == KVS_LOG_OFF)
        c->log.level = kvs_log_level_default();
    return KVS_OK;
}

int kvs_verbs_fabric_create(const kvs_verbs_config_t *cfg, kvs_fabric_t **out,
                            kvs_error_t *err)
{
    if (err != NULL)
        *err = (kvs_error_t){0};
    if (cfg == NULL || out == NULL)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "kvs_verbs_fabric_create: cfg and out "
                             "must not be NULL");
    hw_verbs_fabric_t *f = calloc(1, sizeof *f);
    if (f == NULL)
        return KVS_ERROR_SET(err, KVS_ENOMEM, 0, "no memory for a verbs fabric");
    int rc = hw_verbs_config(cfg, &f->cfg, err);
    if (rc != KVS_OK) {
        free(f);
        return rc;
    }
    kvs_verbs_config_t *c = &f->cfg;
    char why[KVS_ERROR_MSG_BYTES] = "";
    int ndev = 0;
    errno = 0;
    f->devices = rdma_get_devices(&ndev);
    if (f->devices == NULL)
        ndev = 0;
    hw_verbs_snapshot_t snap;
    rc = hw_verbs_snapshot(f->devices, ndev, &snap, why, sizeof why);
    /* Where everything sits on PCIe, only when that decides: near_pci set,
     * no device named, some device to choose from. */
    const bool named = c->device != NULL && c->device[0] != '\0';
    hw_verbs_topo_t topo = {0};
    const hw_verbs_near_t *near = NULL;
    if (rc == KVS_OK && c->near_pci != NULL && !named && snap.ndevs > 0) {
        rc = hw_verbs_topo_read(c->sysfs_root, c->near_pci, snap.devs, snap.ndevs, &topo, why,
                                sizeof why);
        near = &topo.near;
    }
    hw_verbs_near_t near_named = {0};
    if (c->near_pci != NULL && named) { /* not consulted: the reason says so */
        (void)hw_verbs_bus_id_parse(c->near_pci, f->near_pci, sizeof f->near_pci);
        near_named.bus_id = f->near_pci;
        near = &near_named;
    }
    hw_verbs_choice_t choice;
    if (rc == KVS_OK)
        rc = hw_verbs_select(snap.devs, snap.ndevs, c->device, near, c->port, c->gid_index,
                             &choice, why, sizeof why);
    hw_verbs_topo_free(&topo);
    hw_verbs_snapshot_free(&snap);
    if (rc != KVS_OK)
        goto fail;
    f->ctx = f->devices[choice.dev];
    snprintf(f->device_name, sizeof f->device_name, "%s", ibv_get_device_name(f->ctx->device));
    f->port = choice.port;
    f->gid_index = choice.gid_index;
    snprintf(f->gid_text, sizeof f->gid_text, "%s", choice.gid);
    snprintf(f->bind_addr, sizeof f->bind_addr, "%s",
             c->bind_addr != NULL && c->bind_addr[0] ? c->bind_addr : choice.addr);
    snprintf(f->device_reason, sizeof f->device_reason, "%s", choice.reason);
    c->device = f->device_name;
    c->bind_addr = f->bind_addr;
    c->near_pci = NULL;   /* used up: the cfg keeps no borrowed strings */
    c->sysfs_root = NULL;
    if (f->bind_addr[0] == '\0') {
        rc = KVS_EINVAL;
        snprintf(why, sizeof why, "%s port %d is InfiniBand, whose GIDs hold no IP address: "
                 "set bind_addr to the port's IPoIB address", f->device_name, f->port);
        goto fail;
    }

    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    if (ibv_query_device(f->ctx, &da) != 0 || ibv_query_port(f->ctx, (uint8_t)f->port, &pa)) {
        rc = KVS_EBACKEND;
        snprintf(why, sizeof why, "querying %s port %d failed: %s", f->device_name, f->port,
                 strerror(errno));
        goto fail;
    }
    f->port_mtu = pa.active_mtu;
    if (c->max_mtu_bytes != 0 && hw_verbs_mtu_enum(c->max_mtu_bytes) < f->port_mtu)
        f->port_mtu = hw_verbs_mtu_enum(c->max_mtu_bytes);
    f->max_mr_bytes = da.max_mr_size;
    f->mw_type2 = (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
    f->mw_own_mr = da.vendor_id == HW_VERBS_RXE_VENDOR_ID; /* grant.c says why */
    if (c->max_mr_bytes != 0 && c->max_mr_bytes < f->max_mr_bytes)
        f->max_mr_bytes = c->max_mr_bytes;
    f->max_write_bytes = pa.max_msg_sz;
    if (c->max_write_bytes != 0 && c->max_write_bytes < f->max_write_bytes)
        f->max_write_bytes = c->max_write_bytes;
    const uint64_t cqe = (uint64_t)c->max_conns * (c->sq_depth + c->recv_depth);
    if (cqe > (uint64_t)da.max_cqe || c->sq_depth > (uint32_t)da.max_qp_wr ||
        c->recv_depth > (uint32_t)da.max_qp_wr) {
        rc = KVS_EINVAL;
        snprintf(why, sizeof why, "%s allows %d completions per CQ and %d requests per queue; "
                 "max_conns %u x (sq_depth %u + recv_depth %u) = %llu: lower them",
                 f->device_name, da.max_cqe, da.max_qp_wr, c->max_conns, c->sq_depth,
                 c->recv_depth, (unsigned long long)cqe);
        goto fail;
    }
    f->cq_entries = (uint32_t)cqe;
    f->conns = calloc(c->max_conns, sizeof *f->conns);
    f->mrs = calloc(c->max_mrs, sizeof *f->mrs);
    f->grants = calloc(c->max_grants, sizeof *f->grants);
    f->wrs = calloc(c->sq_depth, sizeof *f->wrs);
    f->sges = calloc(c->sq_depth, sizeof *f->sges);
    if (f->conns == NULL || f->mrs == NULL || f->grants == NULL || f->wrs == NULL ||
        f->sges == NULL) {
        rc = KVS_ENOMEM;
        snprintf(why, sizeof why, "no memory for the fabric's tables: lower max_conns, "
                 "max_mrs, max_grants or sq_depth");
        goto fail;
    }
    hw_net_conns_init(&f->connt, &f->base, f->device_name, f->conns, sizeof *f->conns,
                      c->max_conns);
    for (uint32_t i = 0; i < c->max_conns; i++)
        f->conns[i].fab = f;
    const long page = sysconf(_SC_PAGESIZE); /* split registrations' pieces: whole pages */
    hw_net_mrs_init(&f->mrt, &f->base, f->device_name, f->mrs, sizeof *f->mrs, c->max_mrs,
                    page > 0 ? (uint64_t)page : 4096);

    const char *step = "ibv_alloc_pd";
    errno = 0;
    f->pd = ibv_alloc_pd(f->ctx);
    if (f->pd != NULL) {
        step = "ibv_create_comp_channel";
        f->cc = ibv_create_comp_channel(f->ctx);
    }
    if (f->cc != NULL) {
        step = "ibv_create_cq";
        f->cq = ibv_create_cq(f->ctx, (int)f->cq_entries, NULL, f->cc, 0);
    }
    if (f->cq != NULL) {
        step = "rdma_create_event_channel";
        f->ch = rdma_create_event_channel();
    }
    if (f->ch == NULL || hw_net_nonblock(f->ch->fd) != 0 || hw_net_nonblock(f->cc->fd)) {
        const int e = errno;
        rc = KVS_EBACKEND;
        snprintf(why, sizeof why, "%s on %s failed: %s%s", step, f->device_name, strerror(e),
                 e == ENOMEM || e == EAGAIN ? ": raise the locked-memory limit (ulimit -l)"
                 : e == ENODEV || e == ENOENT ? ": load rdma_ucm and check /dev/infiniband"
                                              : "");
        goto fail;
    }
    /* One fd for a driver to sleep on: readable when either channel is. */
    if ((rc = hw_net_waitset_create(&f->waits, &f->base, f->device_name)) != KVS_OK ||
        (rc = hw_net_waitset_add(&f->waits, f->cc->fd, HW_VERBS_WAIT_CQ, HW_NET_WAIT_IN)) !=
            KVS_OK ||
        (rc = hw_net_waitset_add(&f->waits, f->ch->fd, HW_VERBS_WAIT_CM, HW_NET_WAIT_IN)) !=
            KVS_OK) {
        snprintf(why, sizeof why, "%s", f->base.last_backend_msg);
        goto fail;
    }
    rc = hw_verbs_listen(f, why, sizeof why);
    if (rc != KVS_OK)
        goto fail;
    if (c->dmabuf == NULL)
        f->cuda = hw_verbs_cuda_open();
    rc = kvs_fabric_init(&f->base, &hw_verbs_ops, f->device_name);
    if (rc != KVS_OK) {
        snprintf(why, sizeof why, "kvs_fabric_init refused the verbs ops table: rebuild the "
                 "backend against this kvstage");
        goto fail;
    }
    kvs_log_write(&c->log, KVS_LOG_INFO, "verbs fabric: RDMA device %s port %d GID %d (%s), "
                 "listening on %s: %s", f->device_name, f->port, f->gid_index, f->gid_text,
                 f->address, f->device_reason);
    *out = &f->base;
    return KVS_OK;
fail:
    hw_verbs_free(f);
    return KVS_ERROR_SET(err, rc, 0, "%s", why);
}

int kvs_verbs_fabric_destroy(kvs_fabric_t *fab)
{
    if (fab == NULL)
        return KVS_OK;
    hw_verbs_fabric_t *f = hw_verbs_try(fab);
    if (f == NULL)
        return KVS_EINVAL;
    if (f->mrt.live > 0)
        return kvs_fabric_fail(fab, KVS_EBUSY, 0, "destroying fabric %s: %u registrations are "
                               "live: deregister them first", f->device_name, f->mrt.live);
    hw_verbs_free(f);
    return KVS_OK;
}

int kvs_verbs_fabric_info(kvs_fabric_t *fab, kvs_verbs_info_t *out)
{
    hw_verbs_fabric_t *f = hw_verbs_try(fab);
    if (f == NULL || out == NULL)
        return KVS_EINVAL;
    *out = (kvs_verbs_info_t){.port = f->port, .gid_index = f->gid_index,
                              .mtu_bytes = hw_verbs_mtu_bytes(f->port_mtu),
                              .max_mr_bytes = f->max_mr_bytes,
                              .max_write_bytes = f->max_write_bytes};
    snprintf(out->device, sizeof out->device, "%s", f->device_name);
    snprintf(out->gid, sizeof out->gid, "%s", f->gid_text);
    snprintf(out->address, sizeof out->address, "%s", f->address);
    snprintf(out->device_reason, sizeof out->device_reason, "%s", f->device_reason);
    return KVS_OK;
}

uint32_t kvs_verbs_conn_mtu(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    hw_verbs_fabric_t *f = hw_verbs_try(fab);
    kvs_conn_t *c = f != NULL ? hw_net_conns_of(&f->connt, conn) : NULL;
    return c != NULL && c->qp != NULL ? hw_verbs_mtu_bytes(c->mtu) : 0;
}

bool kvs_verbs_conn_alive(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    hw_verbs_fabric_t *f = hw_verbs_try(fab);
    kvs_conn_t *c = f != NULL ? hw_net_conns_of(&f->connt, conn) : NULL;
    return c != NULL && (c->net.state == HW_NET_CONN_UP || c->net.state == HW_CONN_ACCEPTING ||
                         c->net.state == HW_CONN_RECOVERING || c->recovering);
}

uint32_t kvs_verbs_conn_recoveries(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    hw_verbs_fabric_t *f = hw_verbs_try(fab);
    kvs_conn_t *c = f != NULL ? hw_net_conns_of(&f->connt, conn) : NULL;
    return c != NULL ? c->recoveries : 0;
}

int kvs_verbs_fabric_wait(kvs_fabric_t *fab, int timeout_ms)
{
    hw_verbs_fabric_t *f = hw_verbs_try(fab);
    if (f == NULL)
        return KVS_EINVAL;
    return hw_verbs_wait(f, timeout_ms);
}
