/*
 * grant.c - region-scoped remote keys of the ofi fabric (fabric ops
 * version 4, key_grant / key_revoke; the contract is in
 * include/kvstage/backend.h, the threat model in docs/security.md).
 *
 * A grant is a registration of its own (fi_mr_reg, FI_REMOTE_WRITE) of
 * exactly [addr, addr + len_bytes), inside a live kvs_mr_t of this
 * fabric. Its kvstage rkey is a fresh id from the registrations' counter;
 * the provider's key and the range go in one KEYS message on conn only
 * (mr.c, rkeys.c), queued before key_grant returns, so it reaches the peer
 * before any later message on conn (the STAGING_RSP that names the id):
 * every message to one peer takes the same path, hw_ofi_submit in post.c,
 * in order onto one endpoint with FI_ORDER_SAS. key_revoke closes the
 * registration (fi_close) and sends DROP to that peer if it is still the
 * same connection.
 *
 * What this enforces, and by whom:
 * - range and lifetime: the provider. Its MR checks refuse a write under
 *   the grant's key that leaves [addr, addr + len_bytes) or comes after
 *   fi_close. Verified for tcp (libfabric 1.17's "tcp;ofi_rxm"): the
 *   writer gets an error completion (KVS_EREMOTE), no byte changed, and
 *   the provider ends that writer's connection (its later writes fail with
 *   KVS_EPEER). shm changes no byte either but leaves the write without
 *   any completion, so it gets no grants; neither does any provider not
 *   verified (hw_ofi_grant_verified): key_grant answers KVS_ENOTSUP, said
 *   once at create, and the core falls back to the whole ring's key.
 * - "only conn's peer": this fabric, not the provider. The key is sent on
 *   conn alone, and a writer's fabric posts only under ids announced on
 *   the connection it writes on (hw_ofi_rkey_piece, per-connection
 *   tables). libfabric keys are not bound to an endpoint: a hostile
 *   process that learns the provider key by other means (and writes with
 *   its own libfabric) can write inside the granted range until the
 *   revoke. Never outside it, nor after the revoke.
 * - in flight: progress is manual (only inside this process's own fabric
 *   calls), so nothing lands while key_revoke runs. A stream provider
 *   checks a write's key when its header arrives (our reading of tcp's
 *   receive path, not a test): a write whose header was taken before
 *   fi_close and whose payload is still arriving may land the rest of it
 *   during a later poll, at most one message (<= max_write_bytes) per
 *   writer. Untested; docs/security.md says so.
 *
 * Invariants: a grant is live iff its registration is open; mr->net.grants
 * counts the live grants inside mr; live_grants counts them all.
 */
#include "hw_ofi.h"

#include <stdio.h>
#include <string.h>

/* Providers whose MR checks test_ofi_fabric verified: a write out of range
 * and one after fi_close both fail at the writer (KVS_EREMOTE), no byte
 * changed (test_ofi_fabric_grant_provider_refuses_*). "tcp" of libfabric
 * 1.17 is "tcp;ofi_rxm". Not shm: it changes no byte either, but the
 * writer never gets a completion (waited 5 s), so a hostile or stale
 * write would hang its writer instead of failing. */
static const char *const hw_ofi_grant_verified[] = {"tcp", "tcp;ofi_rxm"};

void hw_ofi_grant_check(hw_ofi_fabric_t *f)
{
    const char *prov = f->info->fabric_attr->prov_name;
    f->grants_ok = false;
    for (size_t i = 0; i < sizeof hw_ofi_grant_verified / sizeof hw_ofi_grant_verified[0];
         i++)
        if (strcmp(prov, hw_ofi_grant_verified[i]) == 0)
            f->grants_ok = true;
    if (!f->grants_ok)
        kvs_log_write(&f->cfg.log, KVS_LOG_WARN, "ofi fabric %s: provider %s is not one whose "
                      "memory-registration checks kvstage verified (tcp): key_grant "
                      "answers KVS_ENOTSUP and a decode hands its writers the whole staging "
                      "ring's key (docs/security.md)", f->address, prov);
}

static uint64_t hw_ofi_grant_key(const void *grant, uint32_t piece)
{
    (void)piece;
    return fi_mr_key(((const kvs_grant_t *)grant)->fmr);
}

static kvs_grant_t *hw_ofi_grant_of(hw_ofi_fabric_t *f, kvs_grant_t *g)
{
    return hw_in_table(f->grants, g, sizeof *g, f->cfg.max_grants) && g->live ? g : NULL;
}

int hw_ofi_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                     uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    if (!f->grants_ok)
        return kvs_fabric_fail(fab, KVS_ENOTSUP, 0, "key_grant on %s: the provider's "
                               "memory-registration checks are not verified to fail a "
                               "write outside a grant or after its revoke at the writer "
                               "(tcp is; shm leaves such a write without completion): no "
                               "region-scoped keys here, take --provider tcp for them",
                               f->name);
    if (out == NULL || out_rkey == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: out and out_rkey must "
                               "not be NULL", f->name);
    if (hw_net_mrs_of(&f->mrt, mr) == NULL)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: mr is not a live "
                               "registration of this fabric", f->name);
    const hw_net_mr_t *m = &mr->net;
    if (len_bytes == 0 || !hw_net_mr_holds(m, addr, len_bytes))
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: [0x%llx, +%llu) is "
                               "empty or not inside the registration [0x%llx, +%llu)",
                               f->name, (unsigned long long)addr,
                               (unsigned long long)len_bytes, (unsigned long long)m->addr,
                               (unsigned long long)m->len_bytes);
    if (len_bytes > f->max_mr_bytes)
        return kvs_fabric_fail(fab, KVS_EINVAL, 0, "key_grant on %s: %llu bytes is above "
                               "max_mr_bytes %llu, and a grant is one registration: raise "
                               "max_mr_bytes", f->name, (unsigned long long)len_bytes,
                               (unsigned long long)f->max_mr_bytes);
    int rc = hw_ofi_check_conn(f, conn, "key_grant");
    if (rc != KVS_OK)
        return rc;
    kvs_grant_t *g = NULL;
    for (uint32_t i = 0; i < f->cfg.max_grants && g == NULL; i++)
        if (!f->grants[i].live)
            g = &f->grants[i];
    if (g == NULL)
        return kvs_fabric_fail(fab, KVS_EFULL, 0, "key_grant on %s: all %u grants are live: "
                               "revoke some or raise max_grants", f->name, f->cfg.max_grants);
    if (f->slot_nfree == 0 || f->op_nfree == 0 || f->req_nfree == 0)
        return kvs_fabric_fail(fab, KVS_EAGAIN, 0, "key_grant on %s: no send slot for the "
                               "grant's KEYS message to %s: poll and retry, or raise "
                               "send_slots", f->name, conn->net.peer);
    struct fid_mr *fmr = NULL;
    rc = hw_ofi_mr_reg_one(f, (void *)(uintptr_t)addr, len_bytes, FI_REMOTE_WRITE, &fmr);
    if (rc != 0)
        return kvs_fabric_fail(fab, hw_ofi_status(rc) == KVS_ENOMEM ? KVS_ENOMEM
                                                                     : KVS_EBACKEND,
                               -rc, "key_grant on %s: fi_mr_reg of [0x%llx, +%llu) failed: "
                               "%s%s", f->name, (unsigned long long)addr,
                               (unsigned long long)len_bytes, f->lib.strerror(-rc),
                               rc == -FI_ENOMEM ? ": raise the locked-memory limit "
                                                  "(ulimit -l)" : "");
    *g = (kvs_grant_t){.fmr = fmr, .mr = mr, .conn = conn, .conn_gen = conn->net.gen,
                       .id = hw_net_mrs_next_id(&f->mrt), .addr = addr, .len_bytes = len_bytes,
                       .live = true};
    const hw_rkeys_reg_t r = {.id = g->id, .npieces = 1, .base = addr,
                              .piece_bytes = len_bytes, .len_bytes = len_bytes};
    rc = hw_ofi_keys_send(conn, &r, hw_ofi_grant_key, g);
    if (rc != KVS_OK) { /* a slot was free: not expected, but leave nothing behind */
        fi_close(&fmr->fid);
        *g = (kvs_grant_t){0};
        return rc;
    }
    mr->net.grants++;
    f->live_grants++;
    *out = g;
    *out_rkey = g->id;
    return KVS_OK;
}

/* Closes g's registration: from here on the provider refuses its key. */
static void hw_ofi_grant_close(hw_ofi_fabric_t *f, kvs_grant_t *g)
{
    fi_close(&g->fmr->fid);
    g->mr->net.grants--;
    f->live_grants--;
    *g = (kvs_grant_t){0};
}

int hw_ofi_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant)
{
    hw_ofi_fabric_t *f = hw_ofi_of(fab);
    kvs_grant_t *g = hw_ofi_grant_of(f, grant);
    if (g == NULL)
        return kvs_fabric_fail(fab, KVS_ENOENT, 0, "key_revoke on %s: not a live grant of "
                               "this fabric (revoked already, or never granted)", f->name);
    kvs_conn_t *c = g->conn;
    const bool same_peer = c->net.state == HW_NET_CONN_UP && c->net.gen == g->conn_gen;
    const uint32_t id = g->id;
    hw_ofi_grant_close(f, g);
    if (same_peer) /* the peer's table forgets it; writes under it now fail there */
        hw_ofi_drop_send(c, id);
    return KVS_OK;
}

void hw_ofi_grant_free_all(hw_ofi_fabric_t *f)
{
    for (uint32_t i = 0; f->grants != NULL && i < f->cfg.max_grants; i++)
        if (f->grants[i].live)
            hw_ofi_grant_close(f, &f->grants[i]);
}
