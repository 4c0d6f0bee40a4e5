/*
 * fabric.c - the ofi fabric's ops table ("ofi"), create and destroy, the
 * provider choice and the public helpers of <kvstage/ofi.h>.
 *
 * Create asks fi_getinfo for the named provider with what the fabric needs:
 * an FI_EP_RDM endpoint with FI_MSG and FI_RMA (writes both ways), messages
 * in order (FI_ORDER_SAS), the MR modes it can honour (FI_MR_LOCAL,
 * VIRT_ADDR, ALLOCATED, PROV_KEY, ENDPOINT; not RAW nor HMEM), contexts it
 * keeps (FI_CONTEXT, FI_CONTEXT2, FI_RX_CQ_DATA). Remote CQ data is not
 * asked for: with 8 bytes of it (tcp, shm) a write's immediate and the
 * receiver's connection token ride as the write's CQ data; with fewer
 * (verbs;ofi_rxm and efa carry 4) the immediate follows the write in a
 * message (imm_in_msg, hw_ofi.h).
 *
 * Why not 4 bytes of CQ data and the completion's source address
 * (FI_SOURCE, fi_cq_readfrom) to name the connection: ofi_rxm, which
 * carries verbs (and tcp) as "verbs;ofi_rxm", writes the completion of a
 * remote write with data with ofi_cq_write, not ofi_cq_write_src
 * (rxm_handle_remote_write in prov/rxm/src/rxm_cq.c, in 1.17 as in current
 * sources), and the util queue leaves that slot's source as it was:
 * fi_cq_readfrom hands out the address of an earlier completion, or 0,
 * the first peer inserted. So on rxm FI_SOURCE names the wrong connection,
 * silently (a probe on 1.17, tcp;ofi_rxm here and verbs;ofi_rxm in the rxe
 * VM: B's write reported as C's, the peer inserted first). efa
 * does report the source on both its paths (efa_av_reverse_lookup_rdm for
 * a hardware write with immediate, the peer's fi_addr for an emulated
 * one), but one way for every provider under 8 bytes is the one tested
 * here (verbs in the rxe VM, and tcp forced onto it in test_ofi_fabric).
 *
 * With bind_addr set, the endpoint sits on that address (FI_SOURCE given
 * to fi_getinfo: where to bind, not a capability), so "127.0.0.1" takes
 * loopback. A provider that libfabric does not offer so is refused with
 * the names of those it does. Then: fabric, domain, a table address
 * vector, a completion queue of the data format with an fd wait object
 * (fi_control FI_GETWAIT; a provider without one, and shm, whose fd a
 * peer's message never wakes, get a queue without, and wait_arm then has
 * the driver wake every millisecond), the endpoint bound to both, the send
 * and receive rings registered once, every receive posted, the bootstrap
 * listener and the wait sets (hw/net/waitset.h). Every failure unwinds in
 * reverse and says what to change.
 */
#include "hw_ofi.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HW_OFI_DEFAULT_CONNS 16u
#define HW_OFI_DEFAULT_TX 1024u
#define HW_OFI_DEFAULT_RX 256u
#define HW_OFI_DEFAULT_SLOTS 512u
#define HW_OFI_DEFAULT_MRS 1024u
#define HW_OFI_DEFAULT_GRANTS 1024u
#define HW_OFI_DEFAULT_TIMEOUT_MS 10000u
#define HW_OFI_API FI_VERSION(1, 9)

static uint64_t hw_ofi_now_ns(kvs_fabric_t *fab)
{
    (void)fab;
    return hw_net_now_ns();
}

static int hw_ofi_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes)
{
    (void)fab;
    return conn != NULL ? hw_net_peer_text(conn->net.peer, buf, bytes) : KVS_EINVAL;
}

static const kvs_fabric_ops_t hw_ofi_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    .name = "ofi",
    .caps = KVS_FABRIC_CAP_WRITE_IMM | KVS_FABRIC_CAP_PER_LAYER_WRITES |
            KVS_FABRIC_CAP_RELIABLE_SEND, /* FI_EP_RDM, FI_ORDER_SAS */
    .mr_register = hw_ofi_mr_register,
    .mr_deregister = hw_ofi_mr_deregister,
    .connect = hw_ofi_connect,
    .disconnect = hw_ofi_disconnect,
    .write = hw_ofi_write,
    .send = hw_ofi_send,
    .poll = hw_ofi_poll,
    .now_ns = hw_ofi_now_ns,
    .wait_arm = hw_ofi_wait_arm,
    .random_bytes = hw_net_random_bytes,
    .peer_addr = hw_ofi_peer_addr,
    .key_grant = hw_ofi_key_grant,
    .key_revoke = hw_ofi_key_revoke,
    .mr_register_sealed = hw_ofi_mr_register_sealed,
};

static hw_ofi_fabric_t *hw_ofi_try(kvs_fabric_t *fab)
{
    if (fab == NULL || fab->ops.mr_register != hw_ofi_mr_register)
        return NULL;
    return KVS_CONTAINER_OF(fab, hw_ofi_fabric_t, base);
}

/* What the fabric asks of a provider; prov NULL: any. */
static struct fi_info *hw_ofi_hints(const hw_ofi_lib_t *lib, const char *prov)
{
    struct fi_info *h = lib->dupinfo(NULL); /* fi_allocinfo() */
    if (h == NULL)
        return NULL;
    h->caps = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE;
    h->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
    h->ep_attr->type = FI_EP_RDM;
    h->tx_attr->msg_order = FI_ORDER_SAS;
    h->rx_attr->msg_order = FI_ORDER_SAS;
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                              FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->domain_attr->resource_mgmt = FI_RM_ENABLED;
    h->domain_attr->av_type = FI_AV_TABLE;
    if (prov != NULL && (h->fabric_attr->prov_name = strdup(prov)) == NULL) {
        lib->freeinfo(h);
        return NULL;
    }
    return h;
}

int kvs_ofi_providers(char *buf, size_t buf_bytes)
{
    if (buf_bytes > 0)
        buf[0] = '\0';
    hw_ofi_lib_t lib;
    char why[HW_OFI_WHY_BYTES];
    if (hw_ofi_lib_open(&lib, why, sizeof why) != KVS_OK)
        return 0;
    struct fi_info *h = hw_ofi_hints(&lib, NULL), *list = NULL;
    if (h == NULL || lib.getinfo(HW_OFI_API, NULL, NULL, 0, h, &list) != 0)
        list = NULL;
    lib.freeinfo(h);
    int n = 0;
    size_t used = 0;
    char names[32][32];
    for (struct fi_info *i = list; i != NULL; i = i->next) {
        /* "tcp;ofi_rxm" is chosen by "tcp": the core provider's name. */
        char name[32];
        snprintf(name, sizeof name, "%s", i->fabric_attr->prov_name);
        name[strcspn(name, ";")] = '\0';
        bool seen = false;
        for (int k = 0; k < n && !seen; k++)
            seen = strcmp(names[k], name) == 0;
        if (seen || n == 32)
            continue;
        snprintf(names[n++], sizeof names[0], "%s", name);
        if (buf_bytes > used) {
            int w = snprintf(buf + used, buf_bytes - used, "%s%s", n > 1 ? ", " : "", name);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    lib.freeinfo(list);
    return n;
}

static void hw_ofi_mr_mode_text(uint64_t mode, char *buf, size_t len)
{
    static const struct { uint64_t bit; const char *name; } bits[] = {
        {FI_MR_LOCAL, "FI_MR_LOCAL"}, {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"},
        {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"}, {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},
        {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"}};
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
        if ((mode & bits[i].bit) == 0 || used >= len)
            continue;
        int w = snprintf(buf + used, len - used, "%s%s", used ? "|" : "", bits[i].name);
        used += w > 0 ? (size_t)w : 0;
    }
    if (buf[0] == '\0')
        snprintf(buf, len, "none");
}

static void hw_ofi_free(hw_ofi_fabric_t *f)
{
    if (f->conns != NULL)
        for (uint32_t i = 0; i < f->cfg.max_conns; i++)
            if (f->conns[i].net.state != HW_NET_CONN_FREE)
                hw_ofi_conn_free(&f->conns[i]);
    hw_ofi_grant_free_all(f);
    hw_ofi_mr_free_all(f);
    if (f->ep != NULL)
        fi_close(&f->ep->fid);
    if (f->smr != NULL)
        fi_close(&f->smr->fid);
    if (f->rmr != NULL)
        fi_close(&f->rmr->fid);
    if (f->cq != NULL)
        fi_close(&f->cq->fid);
    if (f->av != NULL)
        fi_close(&f->av->fid);
    if (f->domain != NULL)
        fi_close(&f->domain->fid);
    if (f->fabric != NULL)
        fi_close(&f->fabric->fid);
    if (f->info != NULL)
        f->lib.freeinfo(f->info);
    if (f->listen_fd >= 0)
        close(f->listen_fd);
    hw_net_waitset_destroy(&f->waits);
    hw_net_waitset_destroy(&f->boot);
    free(f->conns);
    free(f->mrs);
    free(f->grants);
    free(f->ops);
    free(f->op_free);
    free(f->reqs);
    free(f->req_free);
    free(f->backlog);
    free(f->done);
    free(f->sbuf);
    free(f->slot_free);
    free(f->rbuf);
    free(f->rx);
    free(f);
}

static int hw_ofi_config(const kvs_ofi_config_t *in, hw_ofi_fabric_t *f, kvs_error_t *err)
{
    kvs_ofi_config_t *c = &f->cfg;
    *c = *in;
    const char *prov = c->provider != NULL && c->provider[0] ? c->provider : "tcp";
    if (strlen(prov) >= sizeof f->provider_want || strchr(prov, ';') != NULL)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "provider '%.60s' is not a provider name: "
                             "give one as fi_info -l lists it (tcp, shm, verbs, efa)", prov);
    snprintf(f->provider_want, sizeof f->provider_want, "%s", prov);
    c->provider = f->provider_want;
    if (c->bind_addr != NULL && c->bind_addr[0] != '\0') {
        if (strlen(c->bind_addr) >= sizeof f->bind_addr)
            return KVS_ERROR_SET(err, KVS_EINVAL, 0, "bind_addr '%.60s...' is too long: give "
                                 "an IP address", c->bind_addr);
        snprintf(f->bind_addr, sizeof f->bind_addr, "%s", c->bind_addr);
        c->bind_addr = f->bind_addr;
    } else {
        c->bind_addr = NULL;
    }
    if (c->max_conns == 0)
        c->max_conns = HW_OFI_DEFAULT_CONNS;
    if (c->tx_depth == 0)
        c->tx_depth = HW_OFI_DEFAULT_TX;
    if (c->recv_depth == 0)
        c->recv_depth = HW_OFI_DEFAULT_RX;
    if (c->send_slots == 0)
        c->send_slots = HW_OFI_DEFAULT_SLOTS;
    if (c->max_mrs == 0)
        c->max_mrs = HW_OFI_DEFAULT_MRS;
    if (c->max_grants == 0)
        c->max_grants = HW_OFI_DEFAULT_GRANTS;
    if (c->connect_timeout_ms == 0)
        c->connect_timeout_ms = HW_OFI_DEFAULT_TIMEOUT_MS;
    if (c->log.fn == NULL && c->log.level == KVS_LOG_OFF)
        c->log.level = kvs_log_level_default();
    const struct { const char *name; uint32_t v; } bounds[] = {
        {"max_conns", c->max_conns}, {"tx_depth", c->tx_depth},
        {"recv_depth", c->recv_depth}, {"send_slots", c->send_slots}};
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (bounds[i].v > HW_OFI_MAX_SLOTS)
            return KVS_ERROR_SET(err, KVS_EINVAL, 0, "%s %u is above %u: lower it",
                                 bounds[i].name, bounds[i].v, HW_OFI_MAX_SLOTS);
    if (c->max_mr_bytes != 0 && c->max_mr_bytes < 4096)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "max_mr_bytes %llu is below a page (4096): "
                             "raise it or leave it 0", (unsigned long long)c->max_mr_bytes);
    return KVS_OK;
}

/* fi_getinfo for the named provider; on failure `why` names the
 * providers that would do. */
static int hw_ofi_getinfo(hw_ofi_fabric_t *f, char *why, size_t why_bytes)
{
    struct fi_info *h = hw_ofi_hints(&f->lib, f->provider_want);
    if (h == NULL) {
        snprintf(why, why_bytes, "no memory for fi_getinfo's hints");
        return KVS_ENOMEM;
    }
    const char *node = f->cfg.bind_addr;
    int rc = f->lib.getinfo(HW_OFI_API, node, NULL, node != NULL ? FI_SOURCE : 0, h, &f->info);
    if (node != NULL && (rc != 0 || f->info->addr_format == FI_ADDR_STR)) {
        /* Shared memory has no IP addresses: it would take the text as the
         * endpoint's name, the same for every process. */
        if (rc == 0)
            f->lib.freeinfo(f->info);
        f->info = NULL;
        rc = f->lib.getinfo(HW_OFI_API, NULL, NULL, 0, h, &f->info);
    }
    f->lib.freeinfo(h);
    if (rc == 0 && f->info != NULL)
        return KVS_OK;
    f->info = NULL;
    char offered[200];
    const int n = kvs_ofi_providers(offered, sizeof offered);
    /* The list comes last: a long one is what gets cut (at 255 bytes). */
    char full[512];
    snprintf(full, sizeof full, "provider '%s' is not offered here (%s); pass one of those "
             "libfabric offers with reliable datagram endpoints, RMA writes and ordered "
             "messages: %s", f->provider_want, f->lib.strerror(-rc),
             n > 0 ? offered : "none (install libfabric's providers)");
    size_t len = strlen(full);
    if (why_bytes > 0) {
        len = len < why_bytes - 1 ? len : why_bytes - 1;
        memcpy(why, full, len);
        why[len] = '\0';
    }
    return KVS_EINVAL;
}

/* libfabric 1.17's ofi_rxm over verbs, without shared receives, crashes in
 * fi_close when a message arrived that nobody read yet: closing a
 * connection it closes the verbs endpoint first, then reads what is
 * queued and posts the receive buffers again onto the endpoint it closed.
 * The fabric drains before it closes (hw_ofi_drain), which narrows that
 * window but cannot shut it: a peer may send until the last moment. With
 * FI_OFI_RXM_USE_SRX=1 the buffers belong to a shared receive context that
 * outlives the connections, and the crash is gone (a two-endpoint probe in
 * the rxe VM crashes every time without it, never with it). */
static void hw_ofi_check_rxm_verbs(const hw_ofi_fabric_t *f)
{
    const char *srx = getenv("FI_OFI_RXM_USE_SRX");
    if (strcmp(f->info->fabric_attr->prov_name, "verbs;ofi_rxm") == 0 &&
        (srx == NULL || strcmp(srx, "1") != 0))
        kvs_log_write(&f->cfg.log, KVS_LOG_WARN, "ofi fabric %s: set FI_OFI_RXM_USE_SRX=1: "
                      "without it libfabric's ofi_rxm (1.17) can crash when the fabric is "
                      "destroyed while a message comes in (docs/fabrics.md)", f->address);
}

void kvs_ofi_config_init(kvs_ofi_config_t *cfg)
{
    if (cfg != NULL)
        *cfg = (kvs_ofi_config_t){0};
}

/* Allocates the tables and rings, all at create (every one is bounded). */
static int hw_ofi_tables(hw_ofi_fabric_t *f)
{
    const kvs_ofi_config_t *c = &f->cfg;
    f->conns = calloc(c->max_conns, sizeof *f->conns);
    f->mrs = calloc(c->max_mrs, sizeof *f->mrs);
    f->grants = calloc(c->max_grants, sizeof *f->grants);
    f->ops = calloc(c->tx_depth, sizeof *f->ops);
    f->op_free = calloc(c->tx_depth, sizeof *f->op_free);
    f->reqs = calloc(c->tx_depth, sizeof *f->reqs);
    f->req_free = calloc(c->tx_depth, sizeof *f->req_free);
    f->backlog = calloc(c->tx_depth, sizeof *f->backlog);
    f->done = calloc(c->tx_depth, sizeof *f->done);
    f->sbuf = calloc(c->send_slots, HW_OFI_MSG_BYTES);
    f->slot_free = calloc(c->send_slots, sizeof *f->slot_free);
    f->rbuf = calloc(c->recv_depth, HW_OFI_MSG_BYTES);
    f->rx = calloc(c->recv_depth, sizeof *f->rx);
    if (f->conns == NULL || f->mrs == NULL || f->grants == NULL || f->ops == NULL ||
        f->op_free == NULL ||
        f->reqs == NULL || f->req_free == NULL || f->backlog == NULL || f->done == NULL || f->sbuf == NULL ||
        f->slot_free == NULL || f->rbuf == NULL || f->rx == NULL)
        return KVS_ENOMEM;
    hw_net_conns_init(&f->connt, &f->base, f->name, f->conns, sizeof *f->conns, c->max_conns);
    for (uint32_t i = 0; i < c->max_conns; i++) {
        f->conns[i].fab = f;
        f->conns[i].sock = -1;
    }
    for (uint32_t i = 0; i < c->tx_depth; i++) {
        f->op_free[i] = c->tx_depth - 1 - i;
        f->req_free[i] = c->tx_depth - 1 - i;
    }
    f->op_nfree = f->req_nfree = c->tx_depth;
    for (uint32_t i = 0; i < c->send_slots; i++)
        f->slot_free[i] = c->send_slots - 1 - i;
    f->slot_nfree = c->send_slots;
    for (uint32_t i = 0; i < c->recv_depth; i++)
        f->rx[i].index = i;
    /* 4096: pieces split at the smallest page (max_mr_bytes is at least
     * that: hw_ofi_config) */
    hw_net_mrs_init(&f->mrt, &f->base, f->name, f->mrs, sizeof *f->mrs, c->max_mrs, 4096);
    f->next_key = 1;
    return KVS_OK;
}

/* Fabric, domain, address vector, completion queue and endpoint. */
static int hw_ofi_open(hw_ofi_fabric_t *f, char *why, size_t why_bytes)
{
    struct fi_info *i = f->info;
    const char *step = "fi_fabric";
    int rc = f->lib.fabric(i->fabric_attr, &f->fabric, NULL);
    if (rc == 0) {
        step = "fi_domain";
        rc = fi_domain(f->fabric, i, &f->domain, NULL);
    }
    if (rc == 0) {
        step = "fi_av_open";
        struct fi_av_attr aa = {.type = FI_AV_TABLE, .count = f->cfg.max_conns};
        rc = fi_av_open(f->domain, &aa, &f->av, NULL);
    }
    if (rc == 0) {
        step = "fi_cq_open";
        /* shm signals its fd only inside this process's own progress, never
         * when a peer writes: it gets the timer. */
        const bool fd_works = strncmp(i->fabric_attr->prov_name, "shm", 3) != 0;
        struct fi_cq_attr ca = {.size = (size_t)f->cfg.tx_depth + f->cfg.recv_depth,
                                .format = FI_CQ_FORMAT_DATA,
                                .wait_obj = fd_works ? FI_WAIT_FD : FI_WAIT_NONE};
        rc = fi_cq_open(f->domain, &ca, &f->cq, NULL);
        if (rc == -FI_ENOSYS || rc == -FI_EINVAL || rc == -FI_EOPNOTSUPP) {
            ca.wait_obj = FI_WAIT_NONE; /* wait_arm then wakes on a timer */
            rc = fi_cq_open(f->domain, &ca, &f->cq, NULL);
        } else if (rc == 0 && fd_works && fi_control(&f->cq->fid, FI_GETWAIT, &f->cq_fd) != 0) {
            f->cq_fd = -1;
        }
    }
    if (rc == 0) {
        step = "fi_endpoint";
        rc = fi_endpoint(f->domain, i, &f->ep, NULL);
    }
    if (rc == 0) {
        step = "fi_ep_bind (address vector)";
        rc = fi_ep_bind(f->ep, &f->av->fid, 0);
    }
    if (rc == 0) {
        step = "fi_ep_bind (completion queue)";
        rc = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV);
    }
    if (rc == 0) {
        step = "fi_enable";
        rc = fi_enable(f->ep);
    }
    if (rc == 0) {
        step = "fi_getname";
        f->ep_name_len = sizeof f->ep_name;
        rc = fi_getname(&f->ep->fid, f->ep_name, &f->ep_name_len);
    }
    if (rc != 0) {
        /* ofi_rxm sizes the verbs completion queue of its connections by
         * FI_UNIVERSE_SIZE, and libfabric (1.17 here; issue 10692, open)
         * does not cap it at the device's max_cqe: on rxe (32767) the
         * default fails at fi_enable with EINVAL (libfabric's warning:
         * "Unable to create verbs CQ"). */
        const bool cq_cap = rc == -FI_EINVAL && strcmp(step, "fi_enable") == 0 &&
                            strncmp(i->fabric_attr->prov_name, "verbs", 5) == 0;
        snprintf(why, why_bytes, "%s on provider %s failed: %s%s", step, f->name,
                 f->lib.strerror(-rc), rc == -FI_ETOOSMALL ? ": its address is too long"
                 : cq_cap ? ": the CQ ofi_rxm asks of verbs may be larger than the device "
                            "allows (rxe): set FI_UNIVERSE_SIZE=64" : "");
        return rc == -FI_ENOMEM ? KVS_ENOMEM : KVS_EBACKEND;
    }
    return KVS_OK;
}

/* The wait sets: boot over the bootstrap sockets (boot.c adds them), waits
 * over boot's fd and the completion queue's fd. */
static int hw_ofi_wait_sets(hw_ofi_fabric_t *f, char *why, size_t why_bytes)
{
    int rc;
    if ((rc = hw_net_waitset_create(&f->boot, &f->base, f->name)) != KVS_OK ||
        (rc = hw_net_waitset_create(&f->waits, &f->base, f->name)) != KVS_OK ||
        (rc = hw_net_waitset_add(&f->waits, f->boot.fd, HW_OFI_WAIT_BOOT, HW_NET_WAIT_IN)) !=
            KVS_OK ||
        (f->cq_fd >= 0 &&
         (rc = hw_net_waitset_add(&f->waits, f->cq_fd, HW_OFI_WAIT_CQ, HW_NET_WAIT_IN)) !=
             KVS_OK))
        snprintf(why, why_bytes, "%s", f->base.last_backend_msg);
    return rc;
}

int kvs_ofi_fabric_create(const kvs_ofi_config_t *cfg, kvs_fabric_t **out, kvs_error_t *err)
{
    if (err != NULL)
        *err = (kvs_error_t){0};
    if (cfg == NULL || out == NULL)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0, "kvs_ofi_fabric_create: cfg and out must "
                             "not be NULL");
    hw_ofi_fabric_t *f = calloc(1, sizeof *f);
    if (f == NULL)
        return KVS_ERROR_SET(err, KVS_ENOMEM, 0, "no memory for an ofi fabric");
    f->cq_fd = f->listen_fd = -1;
    int rc = hw_ofi_config(cfg, f, err);
    if (rc != KVS_OK) {
        free(f);
        return rc;
    }
    char why[KVS_ERROR_MSG_BYTES] = "";
    if ((rc = hw_ofi_lib_open(&f->lib, why, sizeof why)) != KVS_OK ||
        (rc = hw_ofi_getinfo(f, why, sizeof why)) != KVS_OK)
        goto fail;
    snprintf(f->name, sizeof f->name, "ofi:%s", f->info->fabric_attr->prov_name);
    f->mr_mode = f->info->domain_attr->mr_mode;
    f->cq_data_bytes = (uint32_t)f->info->domain_attr->cq_data_size;
    f->imm_in_msg = f->cq_data_bytes < 8;
    f->max_write_bytes = f->info->ep_attr->max_msg_size;
    if (f->cfg.max_write_bytes != 0 && f->cfg.max_write_bytes < f->max_write_bytes)
        f->max_write_bytes = f->cfg.max_write_bytes;
    f->max_mr_bytes = f->cfg.max_mr_bytes != 0 ? f->cfg.max_mr_bytes : UINT64_MAX;
    if ((rc = hw_ofi_tables(f)) != KVS_OK) {
        snprintf(why, sizeof why, "no memory for the fabric's tables: lower max_conns, "
                 "tx_depth, send_slots, recv_depth, max_mrs or max_grants");
        goto fail;
    }
    if ((rc = hw_ofi_open(f, why, sizeof why)) != KVS_OK)
        goto fail;
    const uint64_t sbytes = (uint64_t)f->cfg.send_slots * HW_OFI_MSG_BYTES;
    const uint64_t rbytes = (uint64_t)f->cfg.recv_depth * HW_OFI_MSG_BYTES;
    if ((rc = hw_ofi_mr_own(f, f->sbuf, sbytes, FI_SEND, &f->smr, &f->sdesc, why,
                            sizeof why)) != KVS_OK ||
        (rc = hw_ofi_mr_own(f, f->rbuf, rbytes, FI_RECV, &f->rmr, &f->rdesc, why,
                            sizeof why)) != KVS_OK)
        goto fail;
    for (uint32_t i = 0; i < f->cfg.recv_depth; i++) {
        if ((rc = hw_ofi_post_recv(f, i)) != KVS_OK) {
            snprintf(why, sizeof why, "posting receive %u of %u on %s failed: lower "
                     "recv_depth (the provider's rx size is %zu)", i, f->cfg.recv_depth,
                     f->name, f->info->rx_attr->size);
            goto fail;
        }
    }
    if ((rc = hw_ofi_wait_sets(f, why, sizeof why)) != KVS_OK ||
        (rc = hw_ofi_listen(f, why, sizeof why)) != KVS_OK)
        goto fail;
    rc = kvs_fabric_init(&f->base, &hw_ofi_ops, f->name);
    if (rc != KVS_OK) {
        snprintf(why, sizeof why, "kvs_fabric_init refused the ofi ops table: rebuild the "
                 "backend against this kvstage");
        goto fail;
    }
    hw_ofi_check_rxm_verbs(f);
    hw_ofi_grant_check(f);
    char modes[96];
    hw_ofi_mr_mode_text(f->mr_mode, modes, sizeof modes);
    kvs_log_write(&f->cfg.log, KVS_LOG_INFO, "ofi fabric: provider %s, fabric %s, domain %s, "
                  "MR modes %s, %u bytes of CQ data (immediates %s), bootstrap on %s",
                  f->info->fabric_attr->prov_name, f->info->fabric_attr->name,
                  f->info->domain_attr->name, modes, f->cq_data_bytes,
                  f->imm_in_msg ? "in messages" : "as CQ data", f->address);
    *out = &f->base;
    return KVS_OK;
fail:
    hw_ofi_free(f);
    return KVS_ERROR_SET(err, rc, 0, "%s", why);
}

int kvs_ofi_fabric_destroy(kvs_fabric_t *fab)
{
    if (fab == NULL)
        return KVS_OK;
    hw_ofi_fabric_t *f = hw_ofi_try(fab);
    if (f == NULL)
        return KVS_EINVAL;
    if (f->mrt.live > 0)
        return kvs_fabric_fail(fab, KVS_EBUSY, 0, "destroying fabric %s: %u registrations are "
                               "live: deregister them first", f->name, f->mrt.live);
    /* BYE to the peers still there (sending to one whose fabric is gone
     * may touch memory it unmapped: shm). */
    hw_ofi_boot_progress(f);
    for (uint32_t i = 0; i < f->cfg.max_conns; i++)
        if (f->conns[i].net.state == HW_NET_CONN_UP)
            hw_ofi_disconnect(fab, &f->conns[i]);
    hw_ofi_drain(f, hw_net_now_ns() + HW_OFI_DRAIN_NS);
    hw_ofi_free(f);
    return KVS_OK;
}

int kvs_ofi_fabric_info(kvs_fabric_t *fab, kvs_ofi_info_t *out)
{
    hw_ofi_fabric_t *f = hw_ofi_try(fab);
    if (f == NULL || out == NULL)
        return KVS_EINVAL;
    *out = (kvs_ofi_info_t){.cq_data_bytes = f->cq_data_bytes,
                            .max_write_bytes = f->max_write_bytes,
                            .max_mr_bytes = f->max_mr_bytes};
    snprintf(out->provider, sizeof out->provider, "%s", f->info->fabric_attr->prov_name);
    snprintf(out->fabric, sizeof out->fabric, "%s", f->info->fabric_attr->name);
    snprintf(out->domain, sizeof out->domain, "%s", f->info->domain_attr->name);
    snprintf(out->address, sizeof out->address, "%s", f->address);
    hw_ofi_mr_mode_text(f->mr_mode, out->mr_mode, sizeof out->mr_mode);
    return KVS_OK;
}

bool kvs_ofi_conn_alive(kvs_fabric_t *fab, kvs_conn_t *conn)
{
    hw_ofi_fabric_t *f = hw_ofi_try(fab);
    kvs_conn_t *c = f != NULL ? hw_net_conns_of(&f->connt, conn) : NULL;
    return c != NULL && c->net.state == HW_NET_CONN_UP;
}
