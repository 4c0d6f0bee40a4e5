/*
 * decode.c - the decode staging handler: created from a KV manager once the
 * decode side's init steps are done (spec §8). Creation checks, in order:
 * the manager is a decode manager and has no handler yet; when staging is on,
 * the staging allocator exists, the ring is registered with the fabric, the
 * KV buffers were published, the total heads resolve and the layout of both
 * sides is valid. Nothing is allocated unless every check passed.
 *
 * The handler borrows its manager, which refuses to be destroyed while the
 * handler lives (KVS_EBUSY).
 */
#include "error.h"
#include "log.h"
#include "manager.h"

#include <stdlib.h>

struct kvs_decode {
    kvs_manager_t *m; /* borrowed; outlives the handler */
};

#define KVS__MFAIL(m, status, ...) KVS__FAIL(&(m)->err, (status), __VA_ARGS__)

static int kvs__decode_check(kvs_manager_t *m, kvs_layout_t *lay)
{
    if (m->cfg.role != KVS_ROLE_DECODE)
        return KVS__MFAIL(m, KVS_ESTATE, "kvs_decode_create on a prefill manager: "
                          "create the manager with role KVS_ROLE_DECODE");
    if (m->decode != NULL)
        return KVS__MFAIL(m, KVS_EALREADY, "this manager already has a decode handler");
    if (m->cfg.staging) {
        if (m->ring == NULL)
            return KVS__MFAIL(m, KVS_ENO_ALLOCATOR, NULL);
        if (!m->registered)
            return KVS__MFAIL(m, KVS_ESTATE, "the staging ring is not registered with "
                              "the fabric: call kvs_manager_register_staging first");
        if (!m->kv_published)
            return KVS__MFAIL(m, KVS_ENO_KV_BUFFERS, NULL);
    }
    kvs_layout_params_t p = kvs__manager_layout_params(m);
    int rc = kvs_layout_init(lay, &p, &m->err);
    if (rc != KVS_OK)
        return rc;
    if (m->kv_published && m->kv.local_heads != lay->dst_heads)
        return KVS__MFAIL(m, KVS_EHEAD_SPLIT, "kv buffers hold %lld heads but %lld total "
                          "heads over decode TP %lld give %lld per rank: fix total_heads "
                          "or the published buffers", (long long)m->kv.local_heads,
                          (long long)lay->total_heads, (long long)lay->decode_tp,
                          (long long)lay->dst_heads);
    return KVS_OK;
}

int kvs_decode_create(kvs_manager_t *m, kvs_decode_t **out)
{
    if (out == NULL)
        return m != NULL ? KVS__MFAIL(m, KVS_EINVAL, "out must not be NULL") : KVS_EINVAL;
    *out = NULL;
    if (m == NULL)
        return KVS_EINVAL;
    kvs_layout_t lay;
    int rc = kvs__decode_check(m, &lay);
    if (rc != KVS_OK)
        return rc;
    kvs_decode_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the decode handler failed");
    d->m = m;
    m->layout = lay;
    m->decode = d;
    kvs__log(&m->log, KVS_LOG_INFO, "decode handler: %s path, %lld writer(s) per chunk",
             kvs_path_name(lay.path), (long long)lay.expected_arrivals);
    *out = d;
    return KVS_OK;
}

void kvs_decode_destroy(kvs_decode_t *d)
{
    if (d == NULL)
        return;
    d->m->decode = NULL;
    free(d);
}
