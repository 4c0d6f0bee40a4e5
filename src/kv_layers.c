/*
 * kv_layers.c - KV buffers as engines hold them: per-layer K and V buffers
 * with their strides (kvs_kv_layer_t), or an engine's flat list of buffer
 * addresses, lengths and item sizes, checked against the manager's
 * geometry and published as the set_kv_buffer_tensors step (spec §8).
 *
 * Every check names the first layer (and K or V) and the field that
 * disagrees, with both values, and a refused call changes nothing.
 *
 * A hybrid model's state layers (docs/kinds/hybrid.md) keep no K or V:
 * their descriptors are not required (zeroed ones are what to pass), not
 * checked and not published (their K / V entries are 0); a full or window
 * layer without its K or V is refused naming the layer and its kind. A
 * stage of state layers alone gives the pool's token slots as layer 0's
 * tokens, and no address.
 */
#include "error.h"
#include "hybrid.h"
#include "manager.h"

#include <stdlib.h>

int kvs_kv_layers_from_ptrs(const uint64_t *ptrs, const uint64_t *lens,
                            const uint64_t *item_lens, int64_t n_ptrs, int64_t page_size,
                            int64_t local_heads, int64_t head_dim, kvs_dtype_t dtype,
                            kvs_kv_layer_t *out, int64_t out_cap, kvs_error_t *err)
{
    const int64_t elem = kvs_dtype_bytes(dtype);
    if (ptrs == NULL || lens == NULL || item_lens == NULL || out == NULL)
        return KVS__FAIL(err, KVS_EINVAL, "ptrs, lens, item_lens and out must not be NULL");
    if (n_ptrs <= 0 || n_ptrs % 2 != 0 || out_cap < n_ptrs / 2)
        return KVS__FAIL(err, KVS_EINVAL, "n_ptrs %lld must be 2 x the layers (the K buffers, "
                         "then the V buffers) and out must hold n_ptrs / 2 = %lld layers "
                         "(out_cap %lld)", (long long)n_ptrs, (long long)(n_ptrs / 2),
                         (long long)out_cap);
    if (page_size <= 0 || local_heads <= 0 || head_dim <= 0 || elem == 0)
        return KVS__FAIL(err, KVS_EINVAL, "page_size, local_heads and head_dim must be > 0 "
                         "and dtype known (got %lld, %lld, %lld, %d)", (long long)page_size,
                         (long long)local_heads, (long long)head_dim, (int)dtype);
    const uint64_t item = (uint64_t)(page_size * local_heads * head_dim * elem);
    const int64_t layers = n_ptrs / 2;
    for (int64_t i = 0; i < n_ptrs; i++) {
        const char *kv = i < layers ? "K" : "V";
        const int64_t l = i % layers;
        if (item_lens[i] != item)
            return KVS__FAIL(err, KVS_EINVAL, "layer %lld %s: item size %llu bytes, but a page "
                             "of %lld tokens x %lld heads x head dim %lld x %lld bytes is %llu: "
                             "pass the bytes of one page of the buffer", (long long)l, kv,
                             (unsigned long long)item_lens[i], (long long)page_size,
                             (long long)local_heads, (long long)head_dim, (long long)elem,
                             (unsigned long long)item);
        if (ptrs[i] == 0 || lens[i] == 0 || lens[i] % item != 0)
            return KVS__FAIL(err, KVS_EINVAL, "layer %lld %s: address 0x%llx and length %llu "
                             "must be non-zero and the length a whole number of %llu-byte "
                             "pages", (long long)l, kv, (unsigned long long)ptrs[i],
                             (unsigned long long)lens[i], (unsigned long long)item);
        if (i >= layers && lens[i] != lens[l])
            return KVS__FAIL(err, KVS_EINVAL, "layer %lld: its K buffer has %llu bytes and its V "
                             "buffer %llu: pass buffers of one pool", (long long)l,
                             (unsigned long long)lens[l], (unsigned long long)lens[i]);
    }
    for (int64_t l = 0; l < layers; l++)
        out[l] = (kvs_kv_layer_t){.k_addr = ptrs[l], .v_addr = ptrs[layers + l],
                                  .tokens = (int64_t)(lens[l] / item) * page_size,
                                  .token_stride_bytes = local_heads * head_dim * elem,
                                  .head_stride_bytes = head_dim * elem,
                                  .elem_stride_bytes = elem};
    kvs__error_clear(err);
    return KVS_OK;
}

/* Refuses layer i of the pool, a full or window layer (kind) of model layer
 * `global`, when it lacks its K or V address: a layer left out (a zeroed
 * descriptor) is named as that, before anything else about it. */
static int kvs__check_layer_addr(kvs_manager_t *m, const kvs_kv_layer_t *l, int64_t i,
                                 kvs_layer_kind_t kind, int64_t global)
{
    const bool one_plane = kvs_kv_kind_planes(m->cfg.kv_kind) == 1;
    if (l->k_addr != 0 && (l->v_addr != 0 || one_plane))
        return KVS_OK;
    const char *plane = l->k_addr == 0 ? "K" : "V";
    return KVS__MFAIL(m, KVS_EINVAL, "layer %lld: its %s address is 0: a %s layer (model "
                      "layer %lld) keeps %s: pass its %s buffer as %s (only a state layer "
                      "goes without)", (long long)i, plane, kvs_layer_kind_name(kind),
                      (long long)global, one_plane ? "its latent" : "K and V", plane,
                      l->k_addr == 0 ? "k_addr" : "v_addr");
}

/* Checks layer i of the pool, a full or window layer with its addresses,
 * against the geometry and layer `ref`'s token slots; fills why (naming
 * it) on error. A state layer is never checked: it has no K or V. */
static int kvs__check_layer(kvs_manager_t *m, const kvs_kv_layer_t *l, int64_t i,
                            int64_t heads, int64_t ref, int64_t tokens)
{
    const int64_t elem = kvs_dtype_bytes(m->cfg.dtype), hd = m->cfg.head_dim;
    const bool one_plane = kvs_kv_kind_planes(m->cfg.kv_kind) == 1;
    const struct {
        const char *name;
        int64_t got, want;
    } strides[] = {{"element stride", l->elem_stride_bytes, elem},
                   {"head stride", l->head_stride_bytes, hd * elem},
                   {"token stride", l->token_stride_bytes, heads * hd * elem}};
    for (size_t k = 0; k < sizeof strides / sizeof strides[0]; k++)
        if (strides[k].got != strides[k].want)
            return KVS__MFAIL(m, KVS_EINVAL, "layer %lld: %s %lld bytes, but %lld heads x head "
                              "dim %lld x %lld bytes (%s) laid out [tokens, heads, head_dim] "
                              "need %lld: pass a contiguous per-layer buffer",
                              (long long)i, strides[k].name, (long long)strides[k].got,
                              (long long)heads, (long long)hd, (long long)elem,
                              kvs_dtype_name(m->cfg.dtype), (long long)strides[k].want);
    if (one_plane && l->v_addr != 0)
        return KVS__MFAIL(m, KVS_EMLA, "layer %lld: kv_kind %s keeps one buffer per layer "
                          "(its latent, as k_addr): pass v_addr 0", (long long)i,
                          kvs_kv_kind_name(m->cfg.kv_kind));
    const bool scales = m->scale_bytes > 0;
    if (scales && (l->ks_addr == 0 || (l->vs_addr == 0 && !one_plane)))
        return KVS__MFAIL(m, KVS_EINVAL, "layer %lld: kv_scales %s needs its scale buffers: "
                          "its %s address is 0", (long long)i,
                          kvs_kv_scales_name(m->cfg.kv_scales),
                          l->ks_addr == 0 ? "K scale" : "V scale");
    if ((!scales && (l->ks_addr != 0 || l->vs_addr != 0)) || (one_plane && l->vs_addr != 0))
        return KVS__MFAIL(m, KVS_EINVAL, "layer %lld: a %s scale address is given, but %s: "
                          "pass it 0, or set kv_scales (--kv-scales)", (long long)i,
                          l->ks_addr != 0 && !scales ? "K" : "V",
                          scales ? "one plane per layer has no V" : "kv_scales is none");
    if (l->tokens != tokens)
        return KVS__MFAIL(m, KVS_EINVAL, "layer %lld: %lld token slots, but layer %lld has "
                          "%lld: every layer of a pool holds the same slots", (long long)i,
                          (long long)l->tokens, (long long)ref, (long long)tokens);
    return KVS_OK;
}

/* The kind of model layer `global` under the config's pattern. */
static kvs_layer_kind_t kvs__pool_kind(const kvs_manager_t *m, int64_t global)
{
    return kvs__layer_kind_of(m->cfg.full_attn_every, m->cfg.other_layers, global);
}

int kvs_manager_set_kv_layers(kvs_manager_t *m, const kvs_kv_layer_t *layers,
                              int64_t num_layers, int64_t local_heads)
{
    return kvs__manager_set_kv_layers(m, layers, num_layers, local_heads,
                                      &(kvs_kv_buffers_t){0});
}

int kvs__manager_set_kv_layers(kvs_manager_t *m, const kvs_kv_layer_t *layers,
                               int64_t num_layers, int64_t local_heads,
                               const kvs_kv_buffers_t *more)
{
    if (m == NULL)
        return KVS_EINVAL;
    if (layers == NULL || num_layers != m->cfg.layers)
        return KVS__MFAIL(m, KVS_EINVAL, "%lld layers given, but this rank's pool has %lld "
                          "(config.layers): pass one descriptor per layer",
                          (long long)(layers == NULL ? 0 : num_layers), (long long)m->cfg.layers);
    /* The kinds of the pool's layers, its stage's share of the model's
     * (the config's model_layers, checked at create): a state layer has no
     * K or V, so its descriptor is neither needed nor read (zeroed below). */
    int64_t first = 0, count = 0;
    (void)kvs_pp_stage_layers(m->cfg.model_layers, m->cfg.pp_size, m->cfg.pp_rank, &first,
                              &count);
    for (int64_t i = 0; i < num_layers; i++) {
        const kvs_layer_kind_t kind = kvs__pool_kind(m, first + i);
        int rc = kind == KVS_LAYER_STATE ? KVS_OK
                                         : kvs__check_layer_addr(m, &layers[i], i, kind, first + i);
        if (rc != KVS_OK)
            return rc;
    }
    /* the pool's token slots: its first layer with K and V's; a stage of
     * state layers alone has none, and gives them as layer 0's tokens */
    int64_t ref = 0;
    while (ref < num_layers && kvs__pool_kind(m, first + ref) == KVS_LAYER_STATE)
        ref++;
    const bool all_state = ref == num_layers;
    if (all_state)
        ref = 0;
    const int64_t ps = m->cfg.page_size, tokens = layers[ref].tokens;
    if (local_heads <= 0 || tokens <= 0 || tokens % ps != 0)
        return KVS__MFAIL(m, KVS_EINVAL, "local_heads %lld must be > 0, and layer %lld's %lld "
                          "token slots a whole number of %lld-token pages%s",
                          (long long)local_heads, (long long)ref, (long long)tokens,
                          (long long)ps, all_state ? " (the stage's layers are all state "
                          "layers: layer 0's tokens give the pool's token slots, its "
                          "addresses are not needed)" : "");
    for (int64_t i = 0; i < num_layers; i++) {
        if (kvs__pool_kind(m, first + i) == KVS_LAYER_STATE)
            continue;
        int rc = kvs__check_layer(m, &layers[i], i, local_heads, ref, tokens);
        if (rc != KVS_OK)
            return rc;
    }
    uint64_t *k = malloc((size_t)num_layers * sizeof *k);
    uint64_t *v = malloc((size_t)num_layers * sizeof *v);
    uint64_t *ks = malloc((size_t)num_layers * sizeof *ks);
    uint64_t *vs = malloc((size_t)num_layers * sizeof *vs);
    int rc = KVS_ENOMEM;
    if (k != NULL && v != NULL && ks != NULL && vs != NULL) {
        for (int64_t i = 0; i < num_layers; i++) {
            /* a state layer's entries are 0 whatever its descriptor holds:
             * nothing reads them (kvs_kv_buffers_t), and a read would fail */
            const bool state = kvs__pool_kind(m, first + i) == KVS_LAYER_STATE;
            k[i] = state ? 0 : layers[i].k_addr;
            v[i] = state ? 0 : layers[i].v_addr;
            ks[i] = state ? 0 : layers[i].ks_addr;
            vs[i] = state ? 0 : layers[i].vs_addr;
        }
        const bool one_plane = kvs_kv_kind_planes(m->cfg.kv_kind) == 1;
        const bool scales = m->scale_bytes > 0;
        const kvs_kv_buffers_t kv = {.num_layers = num_layers, .k_base = k,
                                     .v_base = one_plane ? NULL : v,
                                     .local_heads = local_heads, .page_size = ps,
                                     .num_pages = tokens / ps,
                                     .ks_base = scales ? ks : NULL,
                                     .vs_base = scales && !one_plane ? vs : NULL,
                                     .state_base = more->state_base,
                                     .state_slots = more->state_slots,
                                     .draft_k_base = more->draft_k_base,
                                     .draft_v_base = more->draft_v_base};
        rc = kvs_manager_set_kv_buffers(m, &kv); /* copies the arrays */
    } else {
        KVS__MFAIL(m, rc, "copying %lld layer addresses failed", (long long)num_layers);
    }
    free(k);
    free(v);
    free(ks);
    free(vs);
    return rc;
}
