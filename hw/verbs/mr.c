/*
 * mr.c - memory registration of the verbs fabric: host memory through
 * ibv_reg_mr, device memory through a dma-buf (dmabuf.c or the config's
 * exporter) and ibv_reg_dmabuf_mr; ranges larger than max_mr_bytes split
 * into page-aligned pieces, one MR each. The slots, ids, piece sizes and
 * the checks of mr_register and mr_deregister are hw/net/mr_table.c's,
 * shared with the ofi fabric.
 *
 * A registration of one piece hands out its MR's rkey. A split one hands
 * out a handle (HW_VERBS_RKEY_SPLIT | id << 32 | first piece's rkey) and its
 * piece keys travel to peers in KEYS messages: on every connection that is
 * up when it is registered, and to later connections before their first
 * operation (connections carry messages in order, so a peer always holds
 * the keys before any message of ours that could name the handle); the
 * messages and the peer's tables are hw/net/rkeys.c's, keys 4 bytes. The
 * writer's side resolves (handle, address) to a piece key and splits
 * writes at piece boundaries (post.c). Deregistering sends DROP.
 */
#include "hw_verbs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t hw_verbs_piece_rkey(const void *mr, uint32_t i)
{
    return ((const kvs_mr_t *)mr)->pieces[i]->rkey;
}

static int hw_verbs_keys_send_one(void *conn, const uint8_t *msg, uint32_t len_bytes)
{
    return hw_verbs_send_internal(conn, HW_VERBS_CTRL_KEYS, msg, len_bytes);
}

/* The KEYS messages of mr (rkeys.c) on conn. */
static int hw_verbs_keys_send_mr(kvs_conn_t *conn, const kvs_mr_t *mr)
{
    const hw_rkeys_reg_t r = {.id = mr->net.id, .npieces = mr->net.npieces,
                              .base = mr->net.addr, .piece_bytes = mr->net.piece_bytes,
                              .len_bytes = mr->net.len_bytes};
    return hw_rkeys_send(&r, 4, hw_verbs_piece_rkey, mr, hw_verbs_keys_send_one, conn);
}

int hw_verbs_keys_push_all(hw_verbs_fabric_t *f, kvs_conn_t *conn)
{
    for (uint32_t i = 0; i < f->cfg.max_mrs; i++) {
        const kvs_mr_t *mr = &f->mrs[i];
        if (mr->net.live && mr->net.npieces > 1) {
            int rc = hw_verbs_keys_send_mr(conn, mr);
            if (rc != KVS_OK)
                return rc;
        }
    }
    conn->keys_pushed = true;
    return KVS_OK;
}

/* After a split registration or deregistration: tell the connections that
 * already hold our tables; the others get everything before their next
 * operation. */
static void hw_verbs_keys_broadcast(hw_verbs_fabric_t *f, const kvs_mr_t *mr, bool drop)
{
    for (uint32_t i = 0; i < f->cfg.max_conns; i++) {
        kvs_conn_t *c = &f->conns[i];
        const bool takes = c->net.state == HW_NET_CONN_UP || c->net.state == HW_CONN_ACCEPTING ||
                           c->net.state == HW_CONN_RECOVERING || c->recovering;
        if (!takes || !c->keys_pushed)
            continue;
        int rc;
        if (drop) {
            uint8_t msg[4];
            hw_put32(msg, mr->net.id);
            rc = hw_verbs_send_internal(c, HW_VERBS_CTRL_DROP, msg, sizeof msg);
        } else {
            rc = hw_verbs_keys_send_mr(c, mr);
        }
        if (rc != KVS_OK)
            c->keys_pushed = false; /* resend them all before its next operation */
    }
}

int hw_verbs_keys_recv(hw_verbs_fabric_t *f, kvs_conn_t *conn, uint32_t kind,
                       const uint8_t *msg, uint32_t len, char *why, size_t why_bytes)
{
    if (kind == HW_VERBS_CTRL_DROP) {
        hw_rkeys_drop(&conn->rkeys, msg, len);
        return KVS_OK;
    }
    if (kind != HW_VERBS_CTRL_KEYS) {
        snprintf(why, why_bytes, "unknown fabric message %u of %u bytes: the peer runs an "
                 "incompatible kvstage", kind, len);
        return KVS_EPROTO;
    }
    /* Only split registrations travel as tables (one piece: its rkey). */
    return hw_rkeys_recv(&conn->rkeys, f->cfg.max_mrs, 4, 2, msg, len, why, why_bytes);
}

static void hw_verbs_mr_release(kvs_mr_t *mr)
{
    for (uint32_t i = 0; mr->pieces != NULL && i < mr->net.npieces; i++)
        if (mr->pieces[i] != NULL)
            (void)ibv_dereg_mr(mr->pieces[i]);
    free(mr->pieces);
    *mr = (kvs_mr_t){0};
}

int hw_verbs_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                         uint64_t len_bytes, bool sealed, kvs_mr_t **out, uint64_t *out_rkey)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    kvs_mr_t *mr = NULL;
    hw_net_mr_t plan;
    int rc = hw_net_mr_plan(&f->mrt, out != NULL && out_rkey != NULL, addr, len_bytes,
                            f->max_mr_bytes, f->cfg.max_mr_pieces,
                            "raise max_mr_pieces or register less", &mr, &plan);
    if (rc != KVS_OK)
        return rc;
    const uint64_t npieces = plan.npieces, piece = plan.piece_bytes;
    if (sealed && npieces > 1) /* a window covers one MR: grants could not cross pieces */
        return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "mr_register_sealed on %s: %llu bytes "
                               "need %llu MRs of at most %llu bytes (max_mr_bytes) and a "
                               "split registration is not sealed: raise max_mr_bytes",
                               f->device_name, (unsigned long long)len_bytes,
                               (unsigned long long)npieces, (unsigned long long)piece);
    int fd = -1;
    uint64_t fd_off = 0;
    char why[KVS_ERROR_MSG_BYTES] = "";
    const kvs_verbs_dmabuf_fn exporter = f->cfg.dmabuf != NULL ? f->cfg.dmabuf
                                                               : hw_verbs_cuda_dmabuf;
    void *exporter_ctx = f->cfg.dmabuf != NULL ? f->cfg.dmabuf_ctx : (void *)f->cuda;
    rc = exporter(exporter_ctx, dev, addr, len_bytes, &fd, &fd_off, why, sizeof why);
    if (rc != KVS_OK && rc != KVS_ENOTSUP)
        return kvs_fabric_fail(fab, rc, 0, "mr_register on %s: %s", f->device_name, why);
    if (rc == KVS_ENOTSUP && why[0] != '\0')
        return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "mr_register on %s: %s", f->device_name,
                               why);
    const bool dmabuf = rc == KVS_OK;
    *mr = (kvs_mr_t){.net = plan, .dmabuf = dmabuf};
    mr->pieces = calloc(npieces, sizeof *mr->pieces);
    if (mr->pieces == NULL) {
        if (fd >= 0)
            close(fd);
        *mr = (kvs_mr_t){0};
        return kvs_fabric_fail(fab, KVS_ENOMEM, 0, "mr_register on %s: no memory for %llu "
                               "MR handles", f->device_name, (unsigned long long)npieces);
    }
    /* MW_BIND: key_grant binds memory windows to it (grant.c). Sealed: no
     * remote access of its own, so its rkey opens nothing; a window bound
     * over it still may grant remote writes, which need only local write
     * on the MR (the verbs spec's rule for binds, and rxe's). */
    const int access = IBV_ACCESS_LOCAL_WRITE | (sealed ? 0 : IBV_ACCESS_REMOTE_WRITE) |
                       (f->mw_type2 ? IBV_ACCESS_MW_BIND : 0);
    for (uint64_t i = 0; i < npieces; i++) {
        const uint64_t off = i * piece;
        const uint64_t n = i + 1 == npieces ? len_bytes - off : piece;
        errno = 0;
        mr->pieces[i] = dmabuf ? ibv_reg_dmabuf_mr(f->pd, fd_off + off, n, addr + off, fd,
                                                   access)
                               : ibv_reg_mr(f->pd, (void *)(uintptr_t)(addr + off), n, access);
        if (mr->pieces[i] == NULL) {
            const int err = errno != 0 ? errno : EINVAL;
            const char *hint =
                err == ENOMEM || err == EAGAIN
                    ? "raise the locked-memory limit (ulimit -l unlimited, or CAP_IPC_LOCK)"
                : err == EFAULT ? "the range is not mapped memory of this process"
                : err == EOPNOTSUPP && dmabuf ? "this RDMA device cannot register dma-bufs"
                                              : "check the address range";
            const int st = hw_verbs_errno_status(err);
            hw_verbs_mr_release(mr);
            if (fd >= 0)
                close(fd);
            return kvs_fabric_fail(fab, st == KVS_EINVAL ? KVS_EINVAL : KVS_EBACKEND, err,
                                   "mr_register on %s: %s of [0x%llx, +%llu) failed: %s: %s",
                                   f->device_name, dmabuf ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr",
                                   (unsigned long long)(addr + off), (unsigned long long)n,
                                   strerror(err), hint);
        }
    }
    if (fd >= 0)
        close(fd); /* the MRs hold their own reference to the dma-buf */
    hw_net_mr_open(&f->mrt, &mr->net);
    mr->rkey = npieces == 1 ? mr->pieces[0]->rkey
                            : HW_VERBS_RKEY_SPLIT | (uint64_t)mr->net.id << 32 |
                                  mr->pieces[0]->rkey;
    if (npieces > 1)
        hw_verbs_keys_broadcast(f, mr, false);
    *out = mr;
    *out_rkey = mr->rkey;
    return KVS_OK;
}

int hw_verbs_mr_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    if (!f->mw_type2) /* no grant could ever open it */
        return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "mr_register_sealed on %s: the device "
                               "has no type-2 memory windows", f->device_name);
    return hw_verbs_mr_register(fab, dev, addr, len_bytes, true, out, out_rkey);
}

int hw_verbs_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr)
{
    hw_verbs_fabric_t *f = hw_verbs_of(fab);
    const int rc = hw_net_mr_close_check(&f->mrt, mr);
    if (rc != KVS_OK)
        return rc;
    if (mr->net.npieces > 1)
        hw_verbs_keys_broadcast(f, mr, true);
    hw_net_mr_close(&f->mrt, &mr->net);
    hw_verbs_mr_release(mr);
    return KVS_OK;
}

void hw_verbs_mr_free_all(hw_verbs_fabric_t *f)
{
    for (uint32_t i = 0; i < f->cfg.max_mrs; i++)
        if (f->mrs[i].net.live)
            hw_verbs_mr_release(&f->mrs[i]);
    f->mrt.live = 0;
}
