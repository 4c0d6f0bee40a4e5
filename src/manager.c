/*
 * manager.c - the KV manager and its init steps (spec §8): create (config
 * guards), init_staging (decode ring or prefill staging buffers on the
 * device), register_staging (remote keys from the fabric), set_kv_buffers
 * (set_kv_buffer_tensors) and set_heads.
 *
 * Every step either succeeds whole or returns its code and changes nothing;
 * a step called too early returns KVS_ESTATE, twice KVS_EALREADY. The detail
 * of the last error is kept in m->err. The manager allocates only in create
 * and init_staging/set_kv_buffers, and frees all of it in destroy.
 */
#include "manager.h"

#include "hybrid.h"

#include "error.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>


static int kvs__check_config(const kvs_manager_config_t *c, const kvs_device_t *dev,
                             const kvs_fabric_t *fab, kvs_error_t *err)
{
    if (c->role != KVS_ROLE_PREFILL && c->role != KVS_ROLE_DECODE)
        return KVS__FAIL(err, KVS_EINVAL, "role %d unknown: use KVS_ROLE_PREFILL or "
                         "KVS_ROLE_DECODE", (int)c->role);
    if (c->head_dim <= 0 || c->layers <= 0 || c->page_size <= 0)
        return KVS__FAIL(err, KVS_EINVAL, "head_dim, layers and page_size must be > 0 "
                         "(got %lld, %lld, %lld)", (long long)c->head_dim,
                         (long long)c->layers, (long long)c->page_size);
    if (kvs_dtype_bytes(c->dtype) == 0)
        return KVS__FAIL(err, KVS_EDTYPE, "dtype %d unknown: use bf16, fp16, fp8 or fp32",
                         (int)c->dtype);
    if (c->tp_size <= 0 || c->tp_rank < 0 || c->tp_rank >= c->tp_size)
        return KVS__FAIL(err, KVS_EINVAL, "tp_rank %lld must lie in [0, tp_size %lld)",
                         (long long)c->tp_rank, (long long)c->tp_size);
    if (c->pp_size <= 0 || c->pp_rank < 0 || c->pp_rank >= c->pp_size)
        return KVS__FAIL(err, KVS_EINVAL, "pp_rank %lld must lie in [0, pp_size %lld)",
                         (long long)c->pp_rank, (long long)c->pp_size);
    if (c->peer_tp_size < 0 || c->peer_pp_size < 0 || c->context_parallel < 0 ||
        c->total_heads < 0 || c->heads_per_rank < 0 || c->model_layers < 0)
        return KVS__FAIL(err, KVS_EINVAL, "peer_tp_size, peer_pp_size, context_parallel, "
                         "total_heads, heads_per_rank and model_layers must be >= 0 "
                         "(0 = default/unknown)");
    if (c->peer_page_size < 0)
        return KVS__FAIL(err, KVS_EINVAL, "peer_page_size %lld must be >= 0 (0: the peer's "
                         "pages are of page_size %lld tokens too)",
                         (long long)c->peer_page_size, (long long)c->page_size);
    /* The rest of the draft is checked with the layout (src/draft.c); its
     * layer count bounds the buffer arrays set_kv_buffers copies. */
    if (c->draft_layers < 0 || c->draft_layers > KVS_MAX_LAYERS)
        return KVS__FAIL(err, KVS_EINVAL, "draft_layers %lld must lie in [0, %d] (0: no "
                         "draft; --draft-layers)", (long long)c->draft_layers, KVS_MAX_LAYERS);
    if (c->max_aux_bytes > KVS_AUX_BYTES_MAX)
        return KVS__FAIL(err, KVS_EINVAL, "max_aux_bytes %u is over the limit of %u bytes: "
                         "carry a larger result out of band", c->max_aux_bytes,
                         KVS_AUX_BYTES_MAX);
    if (c->dp_rank < 0)
        return KVS__FAIL(err, KVS_EINVAL, "dp_rank %lld must be >= 0: the attention group "
                         "of this rank in its instance (0 without DP attention)",
                         (long long)c->dp_rank);
    if (kvs_kv_kind_planes(c->kv_kind) == 0)
        return KVS__FAIL(err, KVS_EINVAL, "kv_kind %d unknown: use KVS_KV_GQA (K and V per "
                         "layer) or KVS_KV_MLA (one latent per layer)", (int)c->kv_kind);
    if (c->kv_kind == KVS_KV_MLA && (c->total_heads > 1 || c->heads_per_rank > 1))
        return KVS__FAIL(err, KVS_EMLA, "kv_kind mla keeps one latent per token: "
                         "total_heads %lld and heads_per_rank %lld must be 0 or 1; pass the "
                         "latent dim (576 for DeepSeek-V3) as head_dim",
                         (long long)c->total_heads, (long long)c->heads_per_rank);
    if (c->kv_scales != KVS_KV_SCALES_NONE) {
        if (c->kv_scales != KVS_KV_SCALES_PER_TOKEN && c->kv_scales != KVS_KV_SCALES_PER_BLOCK)
            return KVS__FAIL(err, KVS_EINVAL, "kv_scales %d unknown: use none, per-token or "
                             "per-block (--kv-scales)", (int)c->kv_scales);
        if (c->dtype != KVS_DTYPE_FP8)
            return KVS__FAIL(err, KVS_EDTYPE, "kv_scales %s needs dtype fp8 (got %s): pass "
                             "dtype fp8 or kv_scales none (--kv-scales)",
                             kvs_kv_scales_name(c->kv_scales), kvs_dtype_name(c->dtype));
        if (c->scale_block < 0 ||
            kvs_kv_scales_head_bytes(c->kv_scales, c->scale_block, c->head_dim) == 0)
            return KVS__FAIL(err, KVS_EINVAL, "scale_block %lld must divide head_dim %lld "
                             "(0 means %d): one e8m0 scale per block of a head "
                             "(--kv-scales per-block:N)", (long long)c->scale_block,
                             (long long)c->head_dim, KVS_DEFAULT_SCALE_BLOCK);
        /* Every path's copies move the scales: a staging gather or scatter
         * needs a device that reads them. */
        if (c->staging && !kvs__dev_has_scales(dev))
            return KVS__FAIL(err, KVS_ENOTSUP, "kv_scales %s stages scale planes, which "
                             "device '%s' (device ops version %u) cannot copy: use a backend "
                             "of device ops version 5, or turn staging off",
                             kvs_kv_scales_name(c->kv_scales), dev->name, dev->ops.version);
    }
    /* This rank's pool holds its stage's share of the model (spec §4). */
    int64_t first_layer = 0, stage_layers = 0;
    if (c->model_layers == 0) /* create's default, layers * pp_size, overflowed */
        return KVS__FAIL(err, KVS_EINVAL, "layers %lld x pp_size %lld overflows 64 bits: "
                         "pass model_layers, the model's layers", (long long)c->layers,
                         (long long)c->pp_size);
    if (c->model_layers < c->pp_size)
        return KVS__FAIL(err, KVS_EPP_SPLIT, "model_layers %lld cannot fill pp_size %lld "
                         "stages: every stage needs at least one layer; lower pp_size or "
                         "pass the model's layers as model_layers",
                         (long long)c->model_layers, (long long)c->pp_size);
    (void)kvs_pp_stage_layers(c->model_layers, c->pp_size, c->pp_rank, &first_layer,
                              &stage_layers);
    if (stage_layers != c->layers)
        return KVS__FAIL(err, KVS_EPP_SPLIT, "layers %lld: pp_rank %lld of model_layers "
                         "%lld over pp_size %lld holds %lld layers (%lld..%lld): pass "
                         "layers %lld, or the model's layers as model_layers",
                         (long long)c->layers, (long long)c->pp_rank,
                         (long long)c->model_layers, (long long)c->pp_size,
                         (long long)stage_layers, (long long)first_layer,
                         (long long)(first_layer + stage_layers - 1), (long long)stage_layers);
    if (c->cp_rank < 0 || c->cp_rank >= (c->context_parallel > 0 ? c->context_parallel : 1) ||
        (c->role == KVS_ROLE_DECODE && c->cp_rank != 0))
        return KVS__FAIL(err, KVS_EINVAL, "cp_rank %lld must lie in [0, context_parallel "
                         "%lld) on a prefill rank and be 0 on a decode rank",
                         (long long)c->cp_rank,
                         (long long)(c->context_parallel > 0 ? c->context_parallel : 1));
    /* Spec §8 refuses prefill CP with staging; here every path moves it,
     * each CP rank writing its own token range
     * (docs/kinds/context-parallel.md). A decode pairs with CP ranks of a
     * declared instance only: kvs_decode_connect has no CP rank to name. */
    if (c->context_parallel > 1 && c->role == KVS_ROLE_DECODE)
        return KVS__FAIL(err, KVS_ECONTEXT_PARALLEL, "context_parallel %lld on a decode rank: "
                         "declare the prefill instance with kvs_decode_add_instance and its "
                         "cp_size instead (the default instance has no CP ranks to connect); "
                         "set context_parallel to 1", (long long)c->context_parallel);
    if (!c->staging)
        return KVS_OK;
    /* Staging-only guards of spec §8. (MLA, refused here once, is moved:
     * one writer per decode rank, docs/kinds/mla.md.) */
    if (kvs_kv_kind_planes(c->kv_kind) == 1 && !kvs__dev_has_planes(dev))
        return KVS__FAIL(err, KVS_ENOTSUP, "kv_kind %s stages one plane per layer, which "
                         "device '%s' (device ops version %u) cannot copy: use a backend "
                         "of device ops version 4 or turn staging off",
                         kvs_kv_kind_name(c->kv_kind), dev->name, dev->ops.version);
    if (c->chunk_tokens < 0 || (c->chunk_tokens > 0 && c->chunk_tokens % c->page_size != 0))
        return KVS__FAIL(err, KVS_ECHUNK, "chunk_tokens %lld must be a positive multiple "
                         "of page_size %lld (or 0 for %d)", (long long)c->chunk_tokens,
                         (long long)c->page_size, KVS_DEFAULT_CHUNK_TOKENS);
    /* 0 means 8192, which must be whole pages too: never floored in silence. */
    if (c->chunk_tokens == 0 && KVS_DEFAULT_CHUNK_TOKENS % c->page_size != 0)
        return KVS__FAIL(err, KVS_ECHUNK, "chunk_tokens 0 means %d, which is not a "
                         "multiple of page_size %lld: pass chunk_tokens as a multiple of "
                         "%lld, or a page_size dividing %d", KVS_DEFAULT_CHUNK_TOKENS,
                         (long long)c->page_size, (long long)c->page_size,
                         KVS_DEFAULT_CHUNK_TOKENS);
    /* A chunk covers whole pages on both sides (docs/kinds/page-sizes.md). */
    const int64_t peer_ps = c->peer_page_size > 0 ? c->peer_page_size : c->page_size;
    const int64_t chunk = c->chunk_tokens > 0 ? c->chunk_tokens : KVS_DEFAULT_CHUNK_TOKENS;
    if (chunk % peer_ps != 0)
        return KVS__FAIL(err, KVS_ECHUNK, "chunk_tokens %lld%s must be a multiple of the "
                         "peer's page size %lld (peer_page_size) as well as of page_size "
                         "%lld: pass chunk_tokens as a multiple of both",
                         (long long)chunk, c->chunk_tokens > 0 ? "" : " (the default)",
                         (long long)peer_ps, (long long)c->page_size);
    const int64_t prefill_pp = c->role == KVS_ROLE_PREFILL ? c->pp_size : c->peer_pp_size;
    if (prefill_pp > 1 && !kvs__net_has(fab, KVS_FABRIC_CAP_PER_LAYER_WRITES))
        return KVS__FAIL(err, KVS_EPP_WRITES, "prefill PP %lld needs per-layer writes "
                         "and fabric '%s' cannot do them: use prefill PP 1 or another "
                         "fabric", (long long)prefill_pp, fab->name);
    /* ring_bytes, ring_max_live and transfer_workers are > 0: create applied
     * their defaults before calling this. */
    return KVS_OK;
}

static int kvs__manager_load_secret(kvs_manager_t *m, const kvs_manager_config_t *c,
                                    kvs_error_t *err);

int kvs_manager_create(const kvs_manager_config_t *cfg, kvs_device_t *dev,
                       kvs_fabric_t *fab, kvs_manager_t **out, kvs_error_t *err)
{
    if (out == NULL)
        return KVS__FAIL(err, KVS_EINVAL, "out must not be NULL");
    *out = NULL;
    if (cfg == NULL || dev == NULL || fab == NULL)
        return KVS__FAIL(err, KVS_EINVAL, "config, device and fabric are required: "
                         "bind a backend with kvs_device_init/kvs_fabric_init first");
    kvs_manager_config_t c = *cfg;
    /* peer_tp_size stays 0 when not given: the prefill then learns the
     * default decode instance's TP at its registration. */
    if (c.peer_pp_size == 0)
        c.peer_pp_size = 1;
    if (c.context_parallel == 0)
        c.context_parallel = 1;
    if (c.ring_bytes == 0)
        c.ring_bytes = KVS_DEFAULT_RING_BYTES;
    if (c.ring_max_live == 0)
        c.ring_max_live = KVS_DEFAULT_RING_MAX_LIVE;
    if (c.transfer_workers == 0)
        c.transfer_workers = KVS_DEFAULT_TRANSFER_WORKERS;
    if (c.max_rooms == 0)
        c.max_rooms = 1024;
    if (c.max_inflight_writes == 0)
        c.max_inflight_writes = 1024;
    if (c.max_instances == 0)
        c.max_instances = 64;
    if (c.max_peers == 0)
        c.max_peers = 256;
    if (c.stall_timeout_ns == 0)
        c.stall_timeout_ns = KVS_DEFAULT_STALL_TIMEOUT_NS;
    /* Over a reliable fabric, unless the caller chose: a backstop. */
    const bool rto_default = c.retry_timeout_ns == 0;
    if (c.retry_timeout_ns == 0)
        c.retry_timeout_ns = KVS_DEFAULT_RETRY_TIMEOUT_NS;
    uint64_t rto_floor_ns = c.retry_timeout_ns;
    if (rto_default && (fab->ops.caps & KVS_FABRIC_CAP_RELIABLE_SEND)) {
        const uint64_t cap = c.stall_timeout_ns / 32;
        rto_floor_ns = KVS_RELIABLE_RETRY_TIMEOUT_NS < cap ? KVS_RELIABLE_RETRY_TIMEOUT_NS : cap;
        if (rto_floor_ns < c.retry_timeout_ns)
            rto_floor_ns = c.retry_timeout_ns;
    }
    if (c.model_layers == 0 && c.layers > 0 && c.pp_size > 0 &&
        __builtin_mul_overflow(c.layers, c.pp_size, &c.model_layers))
        c.model_layers = 0; /* refused by the check */
    if (c.is_mla && c.kv_kind == KVS_KV_GQA) /* the deprecated flag */
        c.kv_kind = KVS_KV_MLA;
    if (c.session_id == 0) /* distinct per (role, pp, tp) of one deployment */
        c.session_id = ((uint64_t)c.role + 1) << 56 | (uint64_t)c.pp_rank << 32 |
                       (uint64_t)c.tp_rank;
    int rc = kvs__check_config(&c, dev, fab, err);
    if (rc != KVS_OK)
        return rc;

    kvs_manager_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return KVS__FAIL(err, KVS_ENOMEM, "allocating the KV manager failed");
    const uint32_t bufs = c.role == KVS_ROLE_DECODE ? 1 : c.transfer_workers;
    m->staging_addr = calloc(bufs, sizeof *m->staging_addr);
    m->staging_mr = calloc(bufs, sizeof *m->staging_mr);
    m->staging_rkey = calloc(bufs, sizeof *m->staging_rkey);
    if (m->staging_addr == NULL || m->staging_mr == NULL || m->staging_rkey == NULL) {
        free(m->staging_addr);
        free(m->staging_mr);
        free(m->staging_rkey);
        free(m);
        return KVS__FAIL(err, KVS_ENOMEM, "allocating %u staging buffer slots failed",
                         bufs);
    }
    m->cfg = c;
    m->rto_floor_ns = rto_floor_ns;
    m->cfg.secret_file = m->cfg.secret_env = NULL; /* borrowed for create only */
    m->dev = dev;
    m->fab = fab;
    m->log = kvs__log_resolve(&c.log);
    rc = kvs__manager_load_secret(m, &c, err);
    if (rc != KVS_OK) {
        free(m->staging_addr);
        free(m->staging_mr);
        free(m->staging_rkey);
        free(m);
        return rc;
    }
    m->total_heads = c.total_heads;
    m->heads_per_rank = c.heads_per_rank;
    m->scale_bytes = kvs_kv_scales_head_bytes(c.kv_scales, c.scale_block, c.head_dim);
    if (c.kv_scales == KVS_KV_SCALES_PER_BLOCK && c.scale_block == 0)
        m->cfg.scale_block = KVS_DEFAULT_SCALE_BLOCK;
    else if (c.kv_scales != KVS_KV_SCALES_PER_BLOCK)
        m->cfg.scale_block = 0;
    kvs__error_clear(err);
    kvs_log_write(&m->log, KVS_LOG_DEBUG, "%s manager created: tp %lld/%lld pp %lld/%lld staging %s",
             c.role == KVS_ROLE_DECODE ? "decode" : "prefill", (long long)c.tp_rank,
             (long long)c.tp_size, (long long)c.pp_rank, (long long)c.pp_size,
             c.staging ? "on" : "off");
    *out = m;
    return KVS_OK;
}

/* Reads the cluster secret the config names into m->secret; an open
 * cluster says so once. A secret needs the fabric's random source for its
 * nonces. */
static int kvs__manager_load_secret(kvs_manager_t *m, const kvs_manager_config_t *c,
                                    kvs_error_t *err)
{
    char why[KVS_ERROR_MSG_BYTES];
    int rc = kvs__secret_load(c->secret_file, c->secret_env, &m->secret, why, sizeof why);
    if (rc != KVS_OK)
        return KVS__FAIL(err, rc, "%s", why);
    const char *role = c->role == KVS_ROLE_DECODE ? "decode" : "prefill";
    if (m->secret.len_bytes == 0) {
        kvs_log_write(&m->log, KVS_LOG_INFO, "%s %lld: the cluster is open: no secret is "
                      "configured, so any process that reaches this rank can register "
                      "(secret_file / secret_env close it, docs/security.md)", role,
                      (long long)c->tp_rank);
        return KVS_OK;
    }
    uint8_t probe[1];
    if (kvs__net_random(m->fab, probe, sizeof probe) != KVS_OK) {
        kvs__secret_wipe(&m->secret);
        return KVS__FAIL(err, KVS_ENOTSUP, "fabric '%s' has no random source (random_bytes) "
                         "for the nonces a cluster secret needs: use a fabric that has one, "
                         "or no secret", m->fab->name);
    }
    return KVS_OK;
}

/* Releases registrations, then device memory, then the ring. */
static void kvs__release_staging(kvs_manager_t *m)
{
    for (uint32_t i = 0; i < m->staging_count; i++) {
        if (m->staging_mr[i] != NULL)
            (void)kvs__net_deregister(m->fab, m->staging_mr[i]);
        m->staging_mr[i] = NULL;
        m->staging_rkey[i] = 0;
    }
    m->registered = false;
    for (uint32_t i = 0; i < m->staging_count; i++)
        (void)kvs__dev_free(m->dev, m->staging_addr[i]);
    m->staging_count = 0;
    kvs_ring_destroy(m->ring);
    m->ring = NULL;
}

int kvs_manager_destroy(kvs_manager_t *m)
{
    if (m == NULL)
        return KVS_OK;
    if (m->handler != NULL)
        return KVS__MFAIL(m, KVS_EBUSY, "a handler still lives: kvs_decode_destroy() "
                          "or kvs_prefill_destroy() it before the manager");
    kvs__release_staging(m);
    free(m->k_base);
    free(m->v_base);
    free(m->ks_base);
    free(m->vs_base);
    free(m->state_base);
    free(m->draft_k_base);
    free(m->draft_v_base);
    free(m->staging_addr);
    free(m->staging_mr);
    free(m->staging_rkey);
    kvs__secret_wipe(&m->secret);
    free(m);
    return KVS_OK;
}

const kvs_error_t *kvs_manager_last_error(const kvs_manager_t *m)
{
    return m != NULL ? &m->err : NULL;
}

/* Heads on this rank, from what is known now; 0 when unresolvable. */
static int64_t kvs__local_heads(const kvs_manager_t *m)
{
    if (m->cfg.kv_kind == KVS_KV_MLA) /* one latent, on every rank */
        return 1;
    if (m->heads_per_rank > 0)
        return m->heads_per_rank;
    if (m->total_heads > 0)
        return m->total_heads >= m->cfg.tp_size ? m->total_heads / m->cfg.tp_size : 1;
    return 0;
}

/* The most state bytes one writer block of this prefill rank carries (a
 * hybrid model's last chunk, docs/kinds/hybrid.md): a state part per layer
 * of its stage at most, each of its local state heads at most (a writer
 * copies a slice of them). 0 without state layers; -1 on overflow. */
static int64_t kvs__prefill_state_bytes(const kvs_manager_config_t *c)
{
    if (c->full_attn_every <= 1 || c->other_layers != KVS_LAYER_STATE ||
        c->state_heads < 0 || c->state_conv_bytes < 0 || c->state_ssm_bytes < 0)
        return 0; /* none, or a pattern the pairing refuses by name */
    const int64_t heads = c->state_heads >= c->tp_size ? c->state_heads / c->tp_size : 1;
    int64_t bytes = 0;
    if (__builtin_add_overflow(c->state_conv_bytes, c->state_ssm_bytes, &bytes) ||
        __builtin_mul_overflow(bytes, heads, &bytes) ||
        __builtin_mul_overflow(bytes, c->layers, &bytes))
        return -1;
    return bytes;
}

/* Bytes of one prefill staging buffer: F * ps * (one token across all of
 * this rank's layers, each plane: K and V, or MLA's latent), a hybrid
 * model's state part and a draft model's layers. 0 on overflow. */
static uint64_t kvs__prefill_buffer_bytes(const kvs_manager_t *m, int64_t heads)
{
    const kvs_manager_config_t *c = &m->cfg;
    const int64_t chunk = c->chunk_tokens > 0 ? c->chunk_tokens : KVS_DEFAULT_CHUNK_TOKENS;
    const int64_t pages = chunk / c->page_size > 0 ? chunk / c->page_size : 1;
    int64_t bytes = pages * c->page_size;
    int64_t head_bytes = 0; /* a head's row and, with scales, its scales */
    if (__builtin_mul_overflow(c->head_dim, kvs_dtype_bytes(c->dtype), &head_bytes) ||
        __builtin_add_overflow(head_bytes, m->scale_bytes, &head_bytes))
        return 0;
    const int64_t factors[] = {heads, head_bytes, c->layers, kvs_kv_kind_planes(c->kv_kind)};
    for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++)
        if (__builtin_mul_overflow(bytes, factors[i], &bytes))
            return 0;
    const int64_t state = kvs__prefill_state_bytes(c);
    if (state < 0 || __builtin_add_overflow(bytes, state, &bytes))
        return 0;
    /* A draft model's part (docs/kinds/draft.md): the same rows and heads
     * of its draft_layers layers, each of draft_head_dim, on the last
     * pipeline stage alone (the one that gathers it, src/draft_copy.c). */
    if (c->draft_layers > 0 && c->pp_rank == c->pp_size - 1) {
        int64_t draft = pages * c->page_size;
        const int64_t dhd = c->draft_head_dim > 0 ? c->draft_head_dim : c->head_dim;
        const int64_t more[] = {heads, dhd, kvs_dtype_bytes(c->dtype), c->draft_layers,
                                kvs_kv_kind_planes(c->kv_kind)};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
            if (__builtin_mul_overflow(draft, more[i], &draft))
                return 0;
        if (__builtin_add_overflow(bytes, draft, &bytes))
            return 0;
    }
    return (uint64_t)bytes;
}

int kvs_manager_init_staging(kvs_manager_t *m)
{
    if (m == NULL)
        return KVS_EINVAL;
    if (!m->cfg.staging)
        return KVS__MFAIL(m, KVS_ESTATE, "staging is off in this manager's config: "
                          "nothing to initialise (set config.staging to use it)");
    if (m->staging_count > 0)
        return KVS__MFAIL(m, KVS_EALREADY, "staging memory already initialised");
    uint32_t count = 1;
    uint64_t bytes = m->cfg.ring_bytes;
    if (m->cfg.role == KVS_ROLE_PREFILL) {
        const int64_t heads = kvs__local_heads(m);
        if (heads == 0)
            return KVS__MFAIL(m, KVS_EHEADS, "sizing the prefill staging buffers needs "
                              "the KV heads: set total_heads or heads_per_rank (> 0)");
        count = m->cfg.transfer_workers;
        bytes = kvs__prefill_buffer_bytes(m, heads);
        if (bytes == 0)
            return KVS__MFAIL(m, KVS_ERANGE, "prefill staging buffer size overflows: "
                              "lower chunk_tokens");
    }
    kvs_ring_t *ring = NULL;
    if (m->cfg.role == KVS_ROLE_DECODE) {
        int rc = kvs_ring_create(bytes, m->cfg.ring_max_live, &ring);
        if (rc != KVS_OK)
            return KVS__MFAIL(m, rc, "creating the staging ring allocator (%llu bytes, "
                              "%u live) failed", (unsigned long long)bytes,
                              m->cfg.ring_max_live);
    }
    for (uint32_t i = 0; i < count; i++) {
        int rc = kvs__dev_alloc(m->dev, bytes, &m->staging_addr[i]);
        if (rc != KVS_OK) {
            for (uint32_t j = 0; j < i; j++)
                (void)kvs__dev_free(m->dev, m->staging_addr[j]);
            kvs_ring_destroy(ring);
            return kvs__error_set(&m->err, rc == KVS_ENOTSUP ? rc : KVS_EBACKEND,
                                  m->dev->last_backend_code, __FILE__, __LINE__,
                                  "device '%s' could not allocate staging buffer %u of "
                                  "%llu bytes (%s): %s, or free device memory",
                                  m->dev->name, i, (unsigned long long)bytes,
                                  m->dev->last_backend_msg[0] ? m->dev->last_backend_msg
                                                              : kvs_strerror(rc),
                                  m->cfg.role == KVS_ROLE_DECODE
                                      ? "lower the ring size (ring_bytes, --ring-mib)"
                                      : "lower the chunk size (chunk_tokens, --chunk-tokens) "
                                        "or the transfer workers");
        }
    }
    m->ring = ring;
    m->staging_bytes = bytes;
    m->staging_count = count;
    kvs_log_write(&m->log, KVS_LOG_INFO, "staging memory: %u buffer(s) of %llu bytes", count,
             (unsigned long long)bytes);
    return KVS_OK;
}

int kvs_manager_register_staging(kvs_manager_t *m)
{
    if (m == NULL)
        return KVS_EINVAL;
    if (m->staging_count == 0)
        return KVS__MFAIL(m, KVS_ESTATE, "register_staging before init_staging: "
                          "initialise the staging memory first");
    if (m->registered)
        return KVS__MFAIL(m, KVS_EALREADY, "staging memory already registered");
    /* Where the fabric grants region-scoped keys, no key to the whole of
     * the staging memory need exist: seal it, so that only grants open it
     * (a prefill's buffers are sources and never written remotely). */
    m->staging_sealed = kvs__net_can_grant(m->fab);
    for (uint32_t i = 0; i < m->staging_count; i++) {
        int rc = KVS_ENOTSUP;
        if (m->staging_sealed)
            rc = kvs__net_register_sealed(m->fab, m->dev, m->staging_addr[i], m->staging_bytes,
                                          &m->staging_mr[i], &m->staging_rkey[i]);
        if (rc == KVS_ENOTSUP && m->staging_sealed && i == 0) {
            m->staging_sealed = false;
            kvs_log_write(&m->log, KVS_LOG_INFO, "fabric '%s' cannot seal a registration "
                          "(mr_register_sealed, fabric ops version 5): the staging memory's "
                          "own key stays valid at the fabric, though it is never sent "
                          "(docs/security.md)", m->fab->name);
        }
        if (!m->staging_sealed)
            rc = kvs__net_register(m->fab, m->dev, m->staging_addr[i], m->staging_bytes,
                                   &m->staging_mr[i], &m->staging_rkey[i]);
        if (rc != KVS_OK) {
            for (uint32_t j = 0; j < i; j++) {
                (void)kvs__net_deregister(m->fab, m->staging_mr[j]);
                m->staging_mr[j] = NULL;
                m->staging_rkey[j] = 0;
            }
            m->staging_mr[i] = NULL;
            m->staging_rkey[i] = 0;
            return kvs__error_set(&m->err, rc == KVS_ENOTSUP ? rc : KVS_EBACKEND,
                                  m->fab->last_backend_code, __FILE__, __LINE__,
                                  "fabric '%s' could not register staging buffer %u "
                                  "(%s)", m->fab->name, i,
                                  m->fab->last_backend_msg[0] ? m->fab->last_backend_msg
                                                              : kvs_strerror(rc));
        }
    }
    m->registered = true;
    return KVS_OK;
}

int kvs_manager_set_kv_buffers(kvs_manager_t *m, const kvs_kv_buffers_t *kv)
{
    if (m == NULL)
        return KVS_EINVAL;
    const bool one_plane = kvs_kv_kind_planes(m->cfg.kv_kind) == 1;
    if (kv == NULL || kv->k_base == NULL || (kv->v_base == NULL && !one_plane))
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers and their k_base/v_base arrays "
                          "must not be NULL");
    if (one_plane && kv->v_base != NULL)
        return KVS__MFAIL(m, KVS_EMLA, "kv buffers: kv_kind %s keeps one buffer per layer "
                          "(its latent, as k_base): pass v_base NULL",
                          kvs_kv_kind_name(m->cfg.kv_kind));
    const bool scales = m->scale_bytes > 0;
    if (scales && (kv->ks_base == NULL || (kv->vs_base == NULL && !one_plane)))
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers: kv_scales %s needs the scale buffers "
                          "of every layer: pass ks_base%s", kvs_kv_scales_name(m->cfg.kv_scales),
                          one_plane ? "" : " and vs_base");
    const bool state = m->cfg.full_attn_every > 1 && m->cfg.other_layers == KVS_LAYER_STATE;
    if (state && (kv->state_base == NULL || kv->state_slots <= 0))
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers: the layer pattern has state layers "
                          "(other_layers state): pass state_base, a state buffer per layer, "
                          "and state_slots > 0 (got %lld) with kvs_manager_set_kv_buffers",
                          (long long)kv->state_slots);
    if (!state && (kv->state_base != NULL || kv->state_slots != 0))
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers: state_base / state_slots given, but the "
                          "layer pattern has no state layers: set config.full_attn_every "
                          "and other_layers state (--state-heads), or pass NULL and 0");
    /* With PP the draft is the last stage's (kvs_layout_draft_stage): the
     * other stages need not hold its buffers, and do not read them. */
    const bool draft_here = m->cfg.draft_layers > 0 && m->cfg.pp_rank == m->cfg.pp_size - 1;
    const bool draft = m->cfg.draft_layers > 0 && (draft_here || kv->draft_k_base != NULL ||
                                                   kv->draft_v_base != NULL);
    if (draft && (kv->draft_k_base == NULL || (kv->draft_v_base == NULL && !one_plane)))
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers: draft_layers %lld needs the draft's "
                          "buffers, one per draft layer: pass draft_k_base%s%s",
                          (long long)m->cfg.draft_layers, one_plane ? "" : " and draft_v_base",
                          draft_here ? "" : " (or neither: pp_rank is not the last stage, "
                                            "which alone holds the draft)");
    if (draft && one_plane && kv->draft_v_base != NULL)
        return KVS__MFAIL(m, KVS_EMLA, "kv buffers: kv_kind %s keeps one buffer per draft "
                          "layer (its latent, as draft_k_base): pass draft_v_base NULL",
                          kvs_kv_kind_name(m->cfg.kv_kind));
    if (m->cfg.draft_layers == 0 && (kv->draft_k_base != NULL || kv->draft_v_base != NULL))
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers: draft_k_base / draft_v_base given, but "
                          "draft_layers is 0: set config.draft_layers (--draft-layers) or "
                          "pass them NULL");
    if (!scales && (kv->ks_base != NULL || kv->vs_base != NULL))
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers: ks_base / vs_base given, but kv_scales "
                          "is none: set config.kv_scales (--kv-scales) or pass them NULL");
    if (scales && one_plane && kv->vs_base != NULL)
        return KVS__MFAIL(m, KVS_EMLA, "kv buffers: kv_kind %s keeps one buffer per layer: "
                          "pass vs_base NULL", kvs_kv_kind_name(m->cfg.kv_kind));
    if (m->kv_published)
        return KVS__MFAIL(m, KVS_EALREADY, "kv buffers already published: "
                          "set_kv_buffer_tensors() runs once per manager");
    if (kv->num_layers != m->cfg.layers)
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers have %lld layers but the manager "
                          "has %lld: publish one K and V base per layer",
                          (long long)kv->num_layers, (long long)m->cfg.layers);
    if (kv->page_size != m->cfg.page_size)
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers page size %lld differs from the "
                          "manager's %lld", (long long)kv->page_size,
                          (long long)m->cfg.page_size);
    if (kv->local_heads <= 0 || kv->num_pages <= 0)
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers need local_heads > 0 and "
                          "num_pages > 0 (got %lld, %lld)", (long long)kv->local_heads,
                          (long long)kv->num_pages);
    if (m->heads_per_rank > 0 && kv->local_heads != m->heads_per_rank)
        return KVS__MFAIL(m, KVS_EINVAL, "kv buffers hold %lld heads but heads_per_rank "
                          "is %lld: make them agree", (long long)kv->local_heads,
                          (long long)m->heads_per_rank);
    const size_t n = (size_t)kv->num_layers;
    uint64_t *k = malloc(n * sizeof *k), *v = one_plane ? NULL : malloc(n * sizeof *v);
    uint64_t *ks = scales ? malloc(n * sizeof *ks) : NULL;
    uint64_t *vs = scales && !one_plane ? malloc(n * sizeof *vs) : NULL;
    uint64_t *st = state ? malloc(n * sizeof *st) : NULL;
    const size_t nd = draft ? (size_t)m->cfg.draft_layers : 0;
    uint64_t *dk = draft ? malloc(nd * sizeof *dk) : NULL;
    uint64_t *dv = draft && !one_plane ? malloc(nd * sizeof *dv) : NULL;
    if (k == NULL || (v == NULL && !one_plane) || (scales && ks == NULL) ||
        (scales && !one_plane && vs == NULL) || (state && st == NULL) ||
        (draft && dk == NULL) || (draft && !one_plane && dv == NULL)) {
        free(k);
        free(v);
        free(ks);
        free(vs);
        free(st);
        free(dk);
        free(dv);
        return KVS__MFAIL(m, KVS_ENOMEM, "copying %zu layer addresses failed", n);
    }
    memcpy(k, kv->k_base, n * sizeof *k);
    if (v != NULL)
        memcpy(v, kv->v_base, n * sizeof *v);
    if (ks != NULL)
        memcpy(ks, kv->ks_base, n * sizeof *ks);
    if (vs != NULL)
        memcpy(vs, kv->vs_base, n * sizeof *vs);
    if (st != NULL)
        memcpy(st, kv->state_base, n * sizeof *st);
    if (dk != NULL)
        memcpy(dk, kv->draft_k_base, nd * sizeof *dk);
    if (dv != NULL)
        memcpy(dv, kv->draft_v_base, nd * sizeof *dv);
    m->k_base = k;
    m->v_base = v;
    m->ks_base = ks;
    m->vs_base = vs;
    m->kv = *kv;
    m->kv.k_base = k;
    m->kv.v_base = v;
    m->kv.ks_base = ks;
    m->kv.vs_base = vs;
    m->state_base = st;
    m->kv.state_base = st;
    m->draft_k_base = dk;
    m->draft_v_base = dv;
    m->kv.draft_k_base = dk;
    m->kv.draft_v_base = dv;
    m->kv_published = true;
    return KVS_OK;
}

int kvs_manager_set_heads(kvs_manager_t *m, int64_t total_heads, int64_t heads_per_rank)
{
    if (m == NULL)
        return KVS_EINVAL;
    if (total_heads < 0 || heads_per_rank < 0)
        return KVS__MFAIL(m, KVS_EINVAL, "head counts must be >= 0 (0 = unknown)");
    if (m->cfg.kv_kind == KVS_KV_MLA && (total_heads > 1 || heads_per_rank > 1))
        return KVS__MFAIL(m, KVS_EMLA, "kv_kind mla keeps one latent per token: total_heads "
                          "%lld and heads_per_rank %lld must be 0 or 1",
                          (long long)total_heads, (long long)heads_per_rank);
    if (m->handler != NULL)
        return KVS__MFAIL(m, KVS_ESTATE, "heads are fixed once a handler exists: set "
                          "them before kvs_decode_create/kvs_prefill_create");
    if (m->kv_published && heads_per_rank > 0 && heads_per_rank != m->kv.local_heads)
        return KVS__MFAIL(m, KVS_EINVAL, "heads_per_rank %lld differs from the %lld "
                          "heads of the published kv buffers", (long long)heads_per_rank,
                          (long long)m->kv.local_heads);
    m->total_heads = total_heads;
    m->heads_per_rank = heads_per_rank;
    return KVS_OK;
}

kvs_ring_t *kvs_manager_ring(kvs_manager_t *m) { return m != NULL ? m->ring : NULL; }

uint32_t kvs_manager_staging_count(const kvs_manager_t *m)
{
    return m != NULL ? m->staging_count : 0;
}

int kvs_manager_staging_buffer(const kvs_manager_t *m, uint32_t index, uint64_t *addr,
                               uint64_t *len_bytes, uint64_t *rkey)
{
    if (m == NULL)
        return KVS_EINVAL;
    if (m->staging_count == 0)
        return KVS_ESTATE;
    if (index >= m->staging_count)
        return KVS_ERANGE;
    if (addr != NULL)
        *addr = m->staging_addr[index];
    if (len_bytes != NULL)
        *len_bytes = m->staging_bytes;
    if (rkey != NULL)
        *rkey = m->staging_rkey[index];
    return KVS_OK;
}

kvs_path_t kvs_manager_path(const kvs_manager_t *m)
{
    return m != NULL && m->handler != NULL ? m->path : KVS_PATH_AUTO;
}

const kvs_layout_t *kvs_manager_layout(const kvs_manager_t *m)
{
    return m != NULL && m->handler != NULL ? &m->layout : NULL;
}

kvs_layout_params_t kvs__manager_layout_params(const kvs_manager_t *m, int64_t peer_tp,
                                               int64_t peer_pp, int64_t peer_cp)
{
    const kvs_manager_config_t *c = &m->cfg;
    const bool decode = c->role == KVS_ROLE_DECODE;
    kvs_layout_params_t p = {
        .total_heads = m->total_heads,
        .heads_per_rank = m->heads_per_rank,
        .heads_per_rank_tp = c->tp_size,
        .head_dim = c->head_dim,
        .dtype = c->dtype,
        .layers = c->model_layers,
        .page_size = decode && c->peer_page_size > 0 ? c->peer_page_size : c->page_size,
        .decode_page_size = decode || c->peer_page_size == 0 ? c->page_size
                                                             : c->peer_page_size,
        .prefill_tp = decode ? peer_tp : c->tp_size,
        .decode_tp = decode ? c->tp_size : peer_tp,
        .prefill_pp = decode ? peer_pp : c->pp_size,
        .decode_pp = decode ? c->pp_size : peer_pp,
        .chunk_tokens = c->chunk_tokens,
        .kind = c->kv_kind,
        .kv_scales = c->kv_scales,
        .scale_block = c->scale_block,
        .prefill_cp = decode ? (peer_cp > 0 ? peer_cp : 1) : c->context_parallel,
        .full_attn_every = c->full_attn_every,
        .other_layers = c->other_layers,
        .window_tokens = c->window_tokens,
        .state_heads = c->state_heads,
        .state_conv_bytes = c->state_conv_bytes,
        .state_ssm_bytes = c->state_ssm_bytes,
        .draft_layers = c->draft_layers,
        .draft_head_dim = c->draft_head_dim,
        .draft_kv_heads = c->draft_kv_heads,
    };
    return p;
}

int kvs__manager_pair(kvs_manager_t *m, int64_t peer_tp, int64_t peer_pp, int64_t peer_cp,
                      kvs_layout_t *lay, kvs_path_t *path)
{
    const bool decode = m->cfg.role == KVS_ROLE_DECODE;
    if (peer_tp <= 0 || peer_pp <= 0)
        return KVS__MFAIL(m, KVS_EINVAL, "the %s instance's TP and PP sizes must be > 0 (got "
                          "%lld, %lld)", decode ? "prefill" : "decode", (long long)peer_tp,
                          (long long)peer_pp);
    kvs_layout_params_t p = kvs__manager_layout_params(m, peer_tp, peer_pp, peer_cp);
    int rc = kvs_layout_init(lay, &p, &m->err);
    if (rc != KVS_OK)
        return rc;
    const int64_t heads = decode ? lay->dst_heads : lay->src_heads;
    if (m->kv.local_heads != heads)
        return KVS__MFAIL(m, KVS_EHEAD_SPLIT, "kv buffers hold %lld heads but %lld total "
                          "heads over TP %lld give %lld per rank: fix total_heads or "
                          "the published buffers", (long long)m->kv.local_heads,
                          (long long)lay->total_heads, (long long)m->cfg.tp_size,
                          (long long)heads);
    kvs_path_t want = m->cfg.path;
    const bool hybrid = kvs__hybrid(lay);
    const bool draft = lay->draft_layers > 0;
    if (want == KVS_PATH_AUTO)
        want = lay->prefill_tp == lay->decode_tp && !((hybrid || draft) && m->cfg.staging)
                   ? KVS_PATH_DIRECT
               : m->cfg.staging                  ? KVS_PATH_STAGING
                                                 : KVS_PATH_SLICE;
    if (want == KVS_PATH_STAGING && !m->cfg.staging)
        return KVS__MFAIL(m, KVS_EINVAL, "path staging needs staging on: set "
                          "config.staging or pick the slice path");
    if (want == KVS_PATH_DIRECT && lay->prefill_tp != lay->decode_tp)
        return KVS__MFAIL(m, KVS_EINVAL, "the direct path needs equal TP (prefill %lld, "
                          "decode %lld): use staging or slice", (long long)lay->prefill_tp,
                          (long long)lay->decode_tp);
    if (want != KVS_PATH_STAGING && want != KVS_PATH_DIRECT && want != KVS_PATH_SLICE)
        return KVS__MFAIL(m, KVS_EINVAL, "path %d unknown: use auto, staging, direct or "
                          "slice", (int)want);
    /* Hybrid layers move by the staging copies alone (a writer block of
     * slots and a state part, docs/kinds/hybrid.md). */
    if (hybrid && want != KVS_PATH_STAGING)
        return KVS__MFAIL(m, KVS_ENOTSUP, "the %s path does not move hybrid layers "
                          "(full_attn_every %lld: window or state layers): use the staging "
                          "path (config.staging on, path staging or auto)",
                          want == KVS_PATH_DIRECT ? "direct" : "slice",
                          (long long)lay->full_attn_every);
    /* So does a draft model's KV: the draft part of each writer block
     * (docs/kinds/draft.md). */
    if (draft && want != KVS_PATH_STAGING)
        return KVS__MFAIL(m, KVS_ENOTSUP, "the %s path does not move a draft model's KV "
                          "(draft_layers %lld): use the staging path (config.staging on, "
                          "path staging or auto), or drop draft_layers (--draft-layers)",
                          want == KVS_PATH_DIRECT ? "direct" : "slice",
                          (long long)lay->draft_layers);
    if (want == KVS_PATH_STAGING && lay->prefill_pp > 1 &&
        !kvs__net_has(m->fab, KVS_FABRIC_CAP_PER_LAYER_WRITES))
        return KVS__MFAIL(m, KVS_EPP_WRITES, "prefill PP %lld needs per-layer writes "
                          "and fabric '%s' cannot do them: use prefill PP 1 or another "
                          "fabric", (long long)lay->prefill_pp, m->fab->name);
    *path = want;
    return KVS_OK;
}

int kvs__manager_handler_check(kvs_manager_t *m, kvs_role_t role, kvs_layout_t *lay,
                               kvs_path_t *path)
{
    const bool decode = role == KVS_ROLE_DECODE;
    if (m->cfg.role != role)
        return KVS__MFAIL(m, KVS_ESTATE, "%s on a %s manager: create the manager with "
                          "role %s", decode ? "kvs_decode_create" : "kvs_prefill_create",
                          decode ? "prefill" : "decode",
                          decode ? "KVS_ROLE_DECODE" : "KVS_ROLE_PREFILL");
    if (m->handler != NULL)
        return KVS__MFAIL(m, KVS_EALREADY, "this manager already has a handler");
    if (m->cfg.staging) {
        if (m->staging_count == 0)
            return decode ? KVS__MFAIL(m, KVS_ENO_ALLOCATOR, NULL)
                          : KVS__MFAIL(m, KVS_ENO_ALLOCATOR, "staging enabled but the "
                                       "prefill staging buffers are missing: the transfer "
                                       "backend must allocate them "
                                       "(kvs_manager_init_staging) before the prefill "
                                       "handler is created");
        if (!m->registered)
            return KVS__MFAIL(m, KVS_ESTATE, "the staging memory is not registered "
                              "with the fabric: call kvs_manager_register_staging first");
    }
    if (!m->kv_published) {
        if (m->cfg.staging)
            return KVS__MFAIL(m, KVS_ENO_KV_BUFFERS, NULL);
        return KVS__MFAIL(m, KVS_ESTATE, "kv buffers are not published: call "
                          "kvs_manager_set_kv_buffers (set_kv_buffer_tensors) first");
    }
    /* The default peer instance's pair: a handler exists only if this rank's
     * own geometry pairs with it (the decode's default is its own TP). */
    return kvs__manager_pair(m, m->cfg.peer_tp_size > 0 ? m->cfg.peer_tp_size : m->cfg.tp_size,
                             m->cfg.peer_pp_size, m->cfg.context_parallel, lay, path);
}

void *kvs__manager_handler_new(kvs_manager_t *m, kvs_role_t role, size_t bytes, int *rc)
{
    if (m == NULL) {
        *rc = KVS_EINVAL;
        return NULL;
    }
    kvs_layout_t lay = {0};
    kvs_path_t path = KVS_PATH_AUTO;
    *rc = kvs__manager_handler_check(m, role, &lay, &path);
    if (*rc != KVS_OK)
        return NULL;
    void *h = calloc(1, bytes);
    if (h == NULL) {
        *rc = KVS__MFAIL(m, KVS_ENOMEM, "allocating the %s handler failed",
                         role == KVS_ROLE_DECODE ? "decode" : "prefill");
        return NULL;
    }
    m->layout = lay;
    m->path = path;
    m->handler = h;
    return h;
}

uint64_t kvs__manager_layer_bytes(const kvs_manager_t *m)
{
    return (uint64_t)m->kv.num_pages * (uint64_t)m->kv.page_size *
           (uint64_t)m->kv.local_heads * (uint64_t)m->cfg.head_dim *
           (uint64_t)kvs_dtype_bytes(m->cfg.dtype);
}

/* Bytes of one scale buffer of this rank's pool (0 without scales). */
static uint64_t kvs__manager_scale_layer_bytes(const kvs_manager_t *m)
{
    return (uint64_t)m->kv.num_pages * (uint64_t)m->kv.page_size *
           (uint64_t)m->kv.local_heads * (uint64_t)m->scale_bytes;
}

void kvs__manager_close_kv(kvs_manager_t *m, kvs__kv_keys_t *keys)
{
    kvs_mr_t **const *all[] = {&keys->k_mr, &keys->v_mr, &keys->ks_mr, &keys->vs_mr};
    for (size_t b = 0; b < sizeof all / sizeof all[0]; b++)
        for (int64_t l = 0; *all[b] != NULL && l < m->kv.num_layers; l++)
            if ((*all[b])[l] != NULL) /* no V with one plane, no scales without */
                (void)kvs__net_deregister(m->fab, (*all[b])[l]);
    free(keys->k_mr);
    free(keys->v_mr);
    free(keys->k_rkey);
    free(keys->v_rkey);
    free(keys->ks_mr);
    free(keys->vs_mr);
    free(keys->ks_rkey);
    free(keys->vs_rkey);
    memset(keys, 0, sizeof *keys);
}

int kvs__manager_open_kv(kvs_manager_t *m, kvs__kv_keys_t *keys)
{
    const size_t layers = (size_t)m->kv.num_layers;
    keys->k_mr = calloc(layers, sizeof *keys->k_mr);
    keys->v_mr = calloc(layers, sizeof *keys->v_mr);
    keys->k_rkey = calloc(layers, sizeof *keys->k_rkey);
    keys->v_rkey = calloc(layers, sizeof *keys->v_rkey);
    keys->ks_mr = calloc(layers, sizeof *keys->ks_mr);
    keys->vs_mr = calloc(layers, sizeof *keys->vs_mr);
    keys->ks_rkey = calloc(layers, sizeof *keys->ks_rkey);
    keys->vs_rkey = calloc(layers, sizeof *keys->vs_rkey);
    if (keys->k_mr == NULL || keys->v_mr == NULL || keys->k_rkey == NULL ||
        keys->v_rkey == NULL || keys->ks_mr == NULL || keys->vs_mr == NULL ||
        keys->ks_rkey == NULL || keys->vs_rkey == NULL) {
        kvs__manager_close_kv(m, keys);
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the KV registration tables failed");
    }
    const uint64_t bytes = kvs__manager_layer_bytes(m);
    for (size_t l = 0; l < layers; l++) {
        int rc = kvs__net_register(m->fab, m->dev, m->k_base[l], bytes, &keys->k_mr[l],
                                   &keys->k_rkey[l]);
        if (rc == KVS_OK && m->v_base != NULL)
            rc = kvs__net_register(m->fab, m->dev, m->v_base[l], bytes, &keys->v_mr[l],
                                   &keys->v_rkey[l]);
        const uint64_t sbytes = kvs__manager_scale_layer_bytes(m);
        if (rc == KVS_OK && m->ks_base != NULL)
            rc = kvs__net_register(m->fab, m->dev, m->ks_base[l], sbytes, &keys->ks_mr[l],
                                   &keys->ks_rkey[l]);
        if (rc == KVS_OK && m->vs_base != NULL)
            rc = kvs__net_register(m->fab, m->dev, m->vs_base[l], sbytes, &keys->vs_mr[l],
                                   &keys->vs_rkey[l]);
        if (rc != KVS_OK) {
            kvs__manager_close_kv(m, keys);
            return kvs__error_set(&m->err, rc == KVS_ENOTSUP ? rc : KVS_EBACKEND,
                                  m->fab->last_backend_code, __FILE__, __LINE__,
                                  "fabric '%s' could not register KV layer %zu (%s)",
                                  m->fab->name, l,
                                  m->fab->last_backend_msg[0] ? m->fab->last_backend_msg
                                                              : kvs_strerror(rc));
        }
    }
    return KVS_OK;
}
