/*
 * region_keys.c - region-scoped remote keys of the decode's ring
 * (region_keys.h): one grant per (region, writer, write) through the
 * fabric's key_grant, revoked before the region is reused; the whole
 * ring's key where the fabric has no grants (where it has, the ring is
 * sealed, manager.c, and no whole-ring key opens anything).
 */
#include "region_keys.h"

#include "chunk.h"
#include "error.h"
#include "log.h"

#include <string.h>

void kvs__ring_keys_init(kvs__ring_keys_t *rk, kvs__handler_t *h)
{
    kvs_manager_t *m = h->m;
    memset(rk, 0, sizeof *rk);
    if (m->staging_count == 0)
        return; /* no ring: the direct and slice paths write into KV pages */
    rk->mr = m->staging_mr[0];
    rk->ring_addr = m->staging_addr[0];
    rk->ring_rkey = m->staging_rkey[0];
    rk->scoped = kvs__net_can_grant(h->fab);
    if (!rk->scoped)
        kvs_log_write(&m->log, KVS_LOG_WARN, "decode %lld: fabric '%s' cannot scope remote "
                      "keys (its ops table fills no key_grant, a slot of fabric ops version "
                      "4): every prefill writer gets the key of the whole staging ring and "
                      "could write into any region (docs/security.md)",
                      (long long)m->cfg.tp_rank,
                      h->fab->ops.name != NULL ? h->fab->ops.name : h->fab->name);
}

int kvs__wkeys_grant(kvs__ring_keys_t *rk, kvs__handler_t *h, const kvs__peer_t *peer,
                     uint64_t offset, int64_t total, const kvs_cp_part_t *part,
                     kvs__wkeys_t *k)
{
    kvs_manager_t *m = h->m;
    const kvs__inst_t *inst = peer->inst;
    kvs__span_t span[2];
    int n = 0;
    /* peer (c * tp_sources + j) * stages + s is TP writer j (instance.h) */
    int rc = kvs__part_spans(&inst->lay, m->cfg.tp_rank, inst->decode_stage,
                             (peer->index / inst->stages) % inst->lay.tp_sources, peer->pp_rank,
                             total, part, span, &n);
    if (rc != KVS_OK)
        return KVS__MFAIL(m, rc, "the bytes of writer %lld in a region part of %lld tokens "
                          "are not on the layout", (long long)peer->index,
                          (long long)(part->token_end - part->token_start));
    for (int i = 0; i < n; i++) {
        if (span[i].len_bytes == 0) { /* a block of no bytes (a hybrid writer of its
                                         state alone, before the last chunk): no key */
            k->grant[i] = NULL;
            k->rkey[i] = 0;
            continue;
        }
        rc = kvs__net_key_grant(h->fab, peer->conn, rk->mr,
                                rk->ring_addr + offset + span[i].remote_off, span[i].len_bytes,
                                &k->grant[i], &k->rkey[i]);
        if (rc == KVS_ENOTSUP && !m->staging_sealed) { /* declined after all: as without
                                                          grants */
            k->grant[i] = NULL;
            k->rkey[i] = rk->ring_rkey;
            if (!rk->fallback_told)
                kvs_log_write(&m->log, KVS_LOG_WARN, "decode %lld: fabric '%s' refused a "
                              "region-scoped key (KVS_ENOTSUP): its writers get the key of "
                              "the whole staging ring instead (docs/security.md)",
                              (long long)m->cfg.tp_rank, h->fab->name);
            rk->fallback_told = true;
            continue;
        }
        if (rc != KVS_OK) {
            char name[96];
            k->grant[i] = NULL;
            return kvs__error_set(&m->err, rc, h->fab->last_backend_code, __FILE__, __LINE__,
                                  "granting prefill %s its %llu bytes of a region failed%s: "
                                  "%s", kvs__peer_name(peer, name, sizeof name),
                                  (unsigned long long)span[i].len_bytes,
                                  rc == KVS_ENOTSUP ? " (the ring is sealed: no key of its "
                                                      "own to fall back to)" : "",
                                  h->fab->last_backend_msg[0] ? h->fab->last_backend_msg
                                                              : kvs_strerror(rc));
        }
        h->stats.keys_granted++;
    }
    return KVS_OK;
}

void kvs__wkeys_revoke(kvs__handler_t *h, kvs__wkeys_t *k)
{
    for (int i = 0; i < 2; i++) {
        if (k->grant[i] == NULL)
            continue;
        const int rc = kvs__net_key_revoke(h->fab, k->grant[i]);
        if (rc != KVS_OK) /* a fabric's bug: the grant is lost to us either way */
            kvs_log_write(&h->m->log, KVS_LOG_ERROR, "decode %lld: revoking a region-scoped "
                          "key failed (%s: %s); its writer may still reach those ring bytes",
                          (long long)h->m->cfg.tp_rank, kvs_status_name(rc),
                          h->fab->last_backend_msg);
        h->stats.keys_revoked++;
        k->grant[i] = NULL; /* its key stays: a late duplicate request gets the
                               answer it got first, a key that opens nothing */
    }
}
