/*
 * mr.c - memory registration of the ofi fabric and the key tables that let
 * a peer write into it.
 *
 * A registration is one or more pieces (fi_mr_reg each): ranges larger
 * than max_mr_bytes split at page-aligned piece boundaries. The MR modes
 * the provider asked for are honoured here: FI_MR_PROV_KEY takes the
 * provider's key, else the fabric requests a fresh one; FI_MR_ENDPOINT binds
 * each piece to the endpoint and enables it; FI_MR_LOCAL is why every
 * piece's descriptor is kept (post.c passes them). FI_MR_VIRT_ADDR decides
 * how a writer addresses a piece (post.c's rkey_piece): by virtual address,
 * or by offset into the piece. The slots, ids, piece sizes and the checks
 * of mr_register and mr_deregister are hw/net/mr_table.c's, shared with the
 * verbs fabric.
 *
 * The remote key handed out is the registration's id, never a provider
 * key: its base, length, piece size and piece keys travel in KEYS messages
 * on every connection that is up when it is registered, and to later
 * connections before their first operation (connections carry messages in
 * order, so a peer always holds the keys before any message of ours that
 * names the id). Deregistering sends DROP, and is refused while grants
 * (grant.c) inside the registration are live. Grants take their ids from
 * the same counter, so a peer's table holds both without a clash. The messages and the peer's
 * tables are hw/net/rkeys.c's, shared with the verbs fabric. A writer
 * resolves (id, address) to (piece key, target address) and post.c splits
 * writes at pieces.
 *
 * A sealed registration (mr_register_sealed, where grants work) is made
 * without FI_REMOTE_WRITE and its keys are never sent: no peer can name it,
 * and the provider refuses a forged key to it; only grants open it.
 */
#include "hw_ofi.h"

#include <kvstage/host.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* KEYS and DROP are hw/net/rkeys.h's, with 8-byte piece keys. */
#define HW_OFI_KEYS_MAX HW_RKEYS_PER_MSG(8u)

int hw_ofi_mr_reg_one(hw_ofi_fabric_t *f, void *buf, size_t len, uint64_t access,
                      struct fid_mr **out)
{
    const uint64_t key = (f->mr_mode & FI_MR_PROV_KEY) ? 0 : f->next_key++;
    int rc = fi_mr_reg(f->domain, buf, len, access, 0, key, 0, out, NULL);
    if (rc == 0 && (f->mr_mode & FI_MR_ENDPOINT)) {
        rc = fi_mr_bind(*out, &f->ep->fid, 0);
        if (rc == 0)
            rc = fi_mr_enable(*out);
        if (rc != 0) {
            fi_close(&(*out)->fid);
            *out = NULL;
        }
    }
    return rc;
}

int hw_ofi_mr_own(hw_ofi_fabric_t *f, void *buf, size_t len, uint64_t access,
                  struct fid_mr **out, void **desc, char *why, size_t why_bytes)
{
    *desc = NULL;
    int rc = hw_ofi_mr_reg_one(f, buf, len, access, out);
    if (rc != 0) {
        snprintf(why, why_bytes, "registering %zu bytes of the fabric's message buffers on "
                 "%s failed: %s%s", len, f->name, f->lib.strerror(-rc),
                 rc == -FI_ENOMEM ? ": raise the locked-memory limit (ulimit -l) or lower "
                                    "send_slots and recv_depth" : "");
        return hw_ofi_status(rc) == KVS_ENOMEM ? KVS_ENOMEM : KVS_EBACKEND;
    }
    *desc = fi_mr_desc(*out);
    return KVS_OK;
}

static void hw_ofi_mr_release(kvs_mr_t *mr)
{
    for (uint32_t i = 0; mr->pieces != NULL && i < mr->net.npieces; i++)
        if (mr->pieces[i] != NULL)
            fi_close(&mr->pieces[i]->fid);
    free(mr->pieces);
    free(mr->descs);
    free(mr->keys);
    *mr = (kvs_mr_t){0};
}

static uint32_t hw_ofi_keys_msgs(const kvs_mr_t *mr)
{
    return (mr->net.npieces + HW_OFI_KEYS_MAX - 1) / HW_OFI_KEYS_MAX;
}

static uint64_t hw_ofi_piece_key(const void *mr, uint32_t i)
{
    return ((const kvs_mr_t *)mr)->keys[i];
}

static int hw_ofi_keys_send_one(void *conn, const uint8_t *msg, uint32_t len_bytes)
{
    return hw_ofi_send_internal(conn, HW_OFI_MSG_KEYS, msg, len_bytes);
}

int hw_ofi_keys_send(kvs_conn_t *conn, const hw_rkeys_reg_t *r, hw_rkeys_key_fn key_of,
                     const void *ctx)
{
    return hw_rkeys_send(r, 8, key_of, ctx, hw_ofi_keys_send_one, conn);
}

void hw_ofi_drop_send(kvs_conn_t *conn, uint32_t id)
{
    uint8_t msg[4];
    hw_put32(msg, id);
    (void)hw_ofi_send_internal(conn, HW_OFI_MSG_DROP, msg, sizeof msg);
}

/* The KEYS messages of mr (rkeys.c) on conn. */
static int hw_ofi_keys_send_mr(kvs_conn_t *conn, const kvs_mr_t *mr)
{
    const hw_rkeys_reg_t r = {.id = mr->net.id, .npieces = mr->net.npieces,
                              .base = mr->net.addr, .piece_bytes = mr->net.piece_bytes,
                              .len_bytes = mr->net.len_bytes};
    return hw_ofi_keys_send(conn, &r, hw_ofi_piece_key, mr);
}

uint32_t hw_ofi_keys_msgs_all(hw_ofi_fabric_t *f)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < f->cfg.max_mrs; i++)
        if (f->mrs[i].net.live)
            n += hw_ofi_keys_msgs(&f->mrs[i]);
    return n;
}

int hw_ofi_keys_push_all(kvs_conn_t *conn)
{
    hw_ofi_fabric_t *f = conn->fab;
    for (uint32_t i = 0; i < f->cfg.max_mrs; i++) {
        if (!f->mrs[i].net.live || f->mrs[i].sealed)
            continue;
        int rc = hw_ofi_keys_send_mr(conn, &f->mrs[i]);
        if (rc != KVS_OK)
            return rc;
    }
    return KVS_OK;
}

/* sealed (mr_register_sealed): registered without FI_REMOTE_WRITE and its
 * keys never sent, so only grants (grant.c, registrations of their own)
 * open it to a writer. */
static int hw_ofi_mr_register_as(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                                 uint64_t len_bytes, bool sealed, kvs_mr_t **out,
                                 uint64_t *out_rkey)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    /* Host memory only (no FI_HMEM yet): a device address handed to
     * libfabric as a host one would read or write the wrong memory. */
    if (dev != NULL && kvs_host_device_from(dev) == NULL)
        return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "mr_register on %s: device %s is not the "
                               "host device, and the ofi fabric registers host memory only "
                               "(no FI_HMEM): run the rank on the host device, or take the "
                               "verbs fabric for GPU memory", f->name,
                               dev->name != NULL ? dev->name : dev->ops.name);
    kvs_mr_t *mr = NULL;
    hw_net_mr_t plan;
    int rc = hw_net_mr_plan(&f->mrt, out != NULL && out_rkey != NULL, addr, len_bytes,
                            f->max_mr_bytes, HW_RKEYS_PIECES_MAX, "raise max_mr_bytes", &mr,
                            &plan);
    if (rc != KVS_OK)
        return rc;
    const uint64_t npieces = plan.npieces;
    /* Every up connection hears of it now: there must be send slots for
     * all of that before anything is registered. */
    uint32_t up = 0;
    for (uint32_t i = 0; i < f->cfg.max_conns && !sealed; i++)
        up += f->conns[i].net.state == HW_NET_CONN_UP;
    const uint64_t msgs = (npieces + HW_OFI_KEYS_MAX - 1) / HW_OFI_KEYS_MAX * up;
    if (msgs > f->slot_nfree || msgs > f->op_nfree || msgs > f->req_nfree)
        return kvs_fabric_fail(fab, KVS_EAGAIN, 0, "mr_register on %s: its keys need %llu "
                               "messages to %u peers and %u send slots are free: poll "
                               "and retry, or raise send_slots", f->name,
                               (unsigned long long)msgs, up, f->slot_nfree);
    *mr = (kvs_mr_t){.net = plan, .sealed = sealed};
    mr->pieces = calloc(npieces, sizeof *mr->pieces);
    mr->descs = calloc(npieces, sizeof *mr->descs);
    mr->keys = calloc(npieces, sizeof *mr->keys);
    if (mr->pieces == NULL || mr->descs == NULL || mr->keys == NULL) {
        hw_ofi_mr_release(mr);
        return kvs_fabric_fail(fab, KVS_ENOMEM, 0, "mr_register on %s: no memory for %llu "
                               "pieces: raise max_mr_bytes", f->name,
                               (unsigned long long)npieces);
    }
    for (uint32_t i = 0; i < plan.npieces; i++) {
        const uint64_t off = (uint64_t)i * plan.piece_bytes;
        const uint64_t len = i + 1 == plan.npieces ? len_bytes - off : plan.piece_bytes;
        rc = hw_ofi_mr_reg_one(f, (void *)(uintptr_t)(addr + off), len,
                               FI_WRITE | (sealed ? 0 : FI_REMOTE_WRITE) | FI_SEND | FI_RECV,
                               &mr->pieces[i]);
        if (rc != 0) {
            hw_ofi_mr_release(mr);
            return kvs_fabric_fail(fab, hw_ofi_status(rc) == KVS_ENOMEM ? KVS_ENOMEM
                                                                        : KVS_EBACKEND,
                                   -rc, "mr_register on %s: fi_mr_reg of [0x%llx, +%llu) "
                                   "(piece %u of %u) failed: %s%s", f->name,
                                   (unsigned long long)(addr + off), (unsigned long long)len,
                                   i + 1, plan.npieces, f->lib.strerror(-rc),
                                   rc == -FI_ENOMEM ? ": raise the locked-memory limit "
                                                      "(ulimit -l)" : "");
        }
        mr->descs[i] = fi_mr_desc(mr->pieces[i]);
        mr->keys[i] = fi_mr_key(mr->pieces[i]);
    }
    hw_net_mr_open(&f->mrt, &mr->net);
    for (uint32_t i = 0; i < f->cfg.max_conns && !sealed; i++) {
        kvs_conn_t *c = &f->conns[i];
        if (c->net.state == HW_NET_CONN_UP && hw_ofi_keys_send_mr(c, mr) != KVS_OK)
            hw_ofi_conn_fail(c, KVS_EPEER, "sending the keys of a registration to %s failed: "
                             "%s", c->net.peer, fab->last_backend_msg);
    }
    *out = mr;
    *out_rkey = mr->net.id;
    return KVS_OK;
}

int hw_ofi_mr_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                       uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    return hw_ofi_mr_register_as(fab, dev, addr, len_bytes, false, out, out_rkey);
}

int hw_ofi_mr_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                              uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    if (!f->grants_ok) /* no grant could ever open it */
        return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "mr_register_sealed on %s: key_grant "
                               "is not supported on this provider", f->name);
    return hw_ofi_mr_register_as(fab, dev, addr, len_bytes, true, out, out_rkey);
}

int hw_ofi_mr_deregister(kvs_fabric_t *fab, kvs_mr_t *mr)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    const int rc = hw_net_mr_close_check(&f->mrt, mr);
    if (rc != KVS_OK)
        return rc;
    for (uint32_t i = 0; i < f->cfg.max_conns && !mr->sealed; i++)
        if (f->conns[i].net.state == HW_NET_CONN_UP)
            hw_ofi_drop_send(&f->conns[i], mr->net.id);
    hw_net_mr_close(&f->mrt, &mr->net);
    hw_ofi_mr_release(mr);
    return KVS_OK;
}

void hw_ofi_mr_free_all(hw_ofi_fabric_t *f)
{
    for (uint32_t i = 0; f->mrs != NULL && i < f->cfg.max_mrs; i++)
        if (f->mrs[i].net.live)
            hw_ofi_mr_release(&f->mrs[i]);
    f->mrt.live = 0;
}

void hw_ofi_keys_recv(kvs_conn_t *conn, uint32_t kind, const uint8_t *msg, uint32_t len)
{
    if (kind == HW_OFI_MSG_DROP) {
        hw_rkeys_drop(&conn->rkeys, msg, len);
        return;
    }
    /* Malformed, or more than max_mrs: its writes fail with KVS_EREMOTE
     * naming the key, so the table is left as it was. */
    char why[KVS_ERROR_MSG_BYTES];
    const kvs_ofi_config_t *cfg = &conn->fab->cfg;
    (void)hw_rkeys_recv(&conn->rkeys, cfg->max_mrs + cfg->max_grants, 8, 1, msg, len, why,
                        sizeof why);
}
