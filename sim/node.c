/*
 * node.c - the cluster's life in a simulated run (run.h): building it (its
 * instances, their ranks named and numbered as scenario.c's header says,
 * page pools, and every pair of instances' layout and groups of ranks that
 * talk to each other), setting a rank up (a simulated GPU and NIC, its KV
 * pool laid out, the real kvstage rank on them) and tearing it down
 * (keeping its counters), and connecting each decode rank to the prefill
 * instances. What the faults set on a rank, and crashes and restarts, are
 * faults.c's; the rank's results go to workload.c (the driver's
 * callbacks).
 */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records a change of n's ring occupancy (0 while the rank is down). An
 * allocation failure only stops the record; sim_node_ring_p99 then sees
 * less, never a wrong order. */
static void sim_node_ring_sample(void *ctx)
{
    sim_node_t *n = ctx;
    if (n->role != KVS_ROLE_DECODE)
        return;
    kvs_ring_t *ring = n->rank != NULL ? kvs_manager_ring(kvs_rank_manager(n->rank)) : NULL;
    const uint64_t live = ring != NULL ? kvs_ring_live_bytes(ring) : 0;
    const uint64_t last = n->nring_changes > 0 ? n->ring_changes[n->nring_changes - 1].live_bytes : 0;
    if (live == last)
        return;
    if (n->nring_changes == n->ring_changes_cap) {
        const size_t cap = n->ring_changes_cap > 0 ? 2 * n->ring_changes_cap : 64;
        sim_ring_change_t *grown = realloc(n->ring_changes, cap * sizeof *grown);
        if (grown == NULL)
            return;
        n->ring_changes = grown;
        n->ring_changes_cap = cap;
    }
    n->ring_changes[n->nring_changes++] =
        (sim_ring_change_t){.at_ns = sim_engine_now_ns(n->sc->eng), .live_bytes = live};
}

static int sim_node_pid(const sim_node_t *n) { return (int)(n - n->sc->nodes) + 1; }

static void sim_node_span(void *ctx, const char *name, const char *tid, uint64_t start_ns,
                          uint64_t end_ns)
{
    sim_node_t *n = ctx;
    sim_trace_span(n->sc->trace, sim_node_pid(n), tid, name, start_ns, end_ns);
}

static void sim_core_span(void *ctx, const char *what, uint64_t room, int64_t chunk,
                          uint64_t start_ns, uint64_t end_ns)
{
    sim_node_span(ctx, what, "core", start_ns, end_ns);
}

/* The layout of n's instance paired with instance 0 of the other side: its
 * own geometry (heads per rank, its stages' layers) is that of any pair. */
static const kvs_layout_t *sim_node_lay(const sim_scenario_t *sc, const sim_node_t *n)
{
    return n->role == KVS_ROLE_DECODE ? &sc->pairs[n->inst->id].lay
                                      : &sc->pairs[n->inst->id * sc->ndinst].lay;
}

int sim_node_setup(sim_scenario_t *sc, sim_node_t *n, uint32_t gpu_id)
{
    const kvs_layout_t *l = sim_node_lay(sc, n);
    const bool decode = n->role == KVS_ROLE_DECODE;
    /* The default peer instance of its handler (kvs_peer_t {0, 0}) is
     * instance 0 of the other side; every pair can pair (the topology was
     * checked), so its own geometry is valid with it. */
    const sim_instance_shape_t *peer0 = decode ? &sc->topo.prefill[0] : &sc->topo.decode[0];
    const uint64_t other_ranks = (uint64_t)(decode ? sc->nprefill : sc->ndecode);
    const uint32_t other_insts = decode ? sc->npinst : sc->ndinst;
    n->gpu_id = gpu_id;
    /* Its stage's layers: stages need not split evenly (spec §4). */
    kvs_layout_stage_layers(l, n->role, n->pp, &n->first_layer, &n->layers);
    n->heads = decode ? l->dst_heads : l->src_heads;
    n->ps = decode ? l->decode_page_size : l->page_size;
    n->layer_bytes = (uint64_t)sc->pool_pages * (uint64_t)(n->ps * n->heads *
                                                            l->head_dim * l->elem_bytes);
    /* Scale buffers (kv_scales) after every KV buffer of the pool. */
    n->scale_layer_bytes = (uint64_t)sc->pool_pages * (uint64_t)(n->ps * n->heads *
                                                                  l->scale_bytes);
    const uint64_t kv_bytes = (uint64_t)l->planes * (uint64_t)n->layers * n->layer_bytes;
    const uint64_t scales_bytes = (uint64_t)l->planes * (uint64_t)n->layers * n->scale_layer_bytes;
    /* State buffers (state layers), a slot per request, after the scales. */
    const bool state = l->full_attn_every > 1 && l->other_layers == KVS_LAYER_STATE;
    n->state_heads = state ? (decode ? l->state_dst_heads : l->state_src_heads) : 0;
    const uint64_t state_layer_bytes = (uint64_t)sc->cfg.requests *
                                       (uint64_t)(n->state_heads * l->state_head_bytes);
    int64_t state_layers = 0;
    for (int64_t i = 0; state && i < n->layers; i++) {
        kvs_layer_kind_t kind = KVS_LAYER_FULL;
        (void)kvs_layout_layer_kind(l, n->first_layer + i, &kind);
        state_layers += kind == KVS_LAYER_STATE;
    }
    /* A draft model's buffers (docs/kinds/draft.md), after the state: per
     * draft layer its planes, the model's pages of draft_head_dim; on the
     * last stage alone, which holds the draft (an engine keeps none on the
     * others, and the manager takes none there). */
    const bool draft = l->draft_layers > 0 && n->pp == n->inst->pp - 1;
    n->draft_layer_bytes = draft ? (uint64_t)sc->pool_pages *
                                       (uint64_t)(n->ps * n->heads * l->draft_head_dim *
                                                  l->elem_bytes)
                                 : 0;
    const uint64_t before_draft = kv_bytes + scales_bytes +
                                  (uint64_t)state_layers * state_layer_bytes;
    const uint64_t pool_bytes = before_draft + (uint64_t)(l->planes * l->draft_layers) *
                                                   n->draft_layer_bytes;
    sim_gpu_config_t gc = sc->cfg.gpu;
    if (n->hbm_full)
        gc.hbm_bytes = pool_bytes; /* the KV pool fills it */
    int rc = sim_gpu_create(sc->eng, &gc, gpu_id, &n->gpu);
    if (rc == KVS_OK)
        rc = sim_nic_create(sc->net, n->name, n->gpu, &n->nic);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "creating the GPU/NIC of %s failed: %s", n->name, kvs_strerror(rc));
    if (sc->cfg.copy_hook != NULL)
        sim_gpu_set_copy_hook(n->gpu, sc->cfg.copy_hook, sc->cfg.hook_ctx);
    if (sc->cfg.write_hook != NULL)
        sim_nic_set_write_hook(n->nic, sc->cfg.write_hook, sc->cfg.hook_ctx);
    sim_driver_init(&n->drv, sc->eng, NULL, n, sim_node_result, sim_node_error);
    n->drv.on_step = sim_node_ring_sample;
    sim_gpu_set_wake(n->gpu, sim_driver_wake, &n->drv);
    sim_nic_set_wake(n->nic, sim_driver_wake, &n->drv);
    if (sc->trace != NULL) {
        sim_trace_process(sc->trace, sim_node_pid(n), n->name);
        sim_gpu_set_span(n->gpu, sim_node_span, n);
        sim_nic_set_span(n->nic, sim_node_span, n);
    }

    kvs_device_t *dev = sim_gpu_device(n->gpu);
    rc = dev->ops.mem_alloc(dev, pool_bytes, &n->pool_addr);
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "%s: KV pool of %llu bytes: %s", n->name,
                        (unsigned long long)pool_bytes, dev->last_backend_msg);
    n->pool_host = sim_gpu_host(n->gpu, n->pool_addr, pool_bytes);
    n->k_base = calloc((size_t)n->layers, sizeof *n->k_base);
    n->v_base = calloc((size_t)n->layers, sizeof *n->v_base);
    n->ks_base = calloc((size_t)n->layers, sizeof *n->ks_base);
    n->vs_base = calloc((size_t)n->layers, sizeof *n->vs_base);
    n->state_base = state ? calloc((size_t)n->layers, sizeof *n->state_base) : NULL;
    n->draft_k_base = draft ? calloc((size_t)l->draft_layers, sizeof *n->draft_k_base) : NULL;
    n->draft_v_base = draft && l->planes == 2
                          ? calloc((size_t)l->draft_layers, sizeof *n->draft_v_base)
                          : NULL;
    if (n->k_base == NULL || n->v_base == NULL || n->ks_base == NULL || n->vs_base == NULL ||
        (state && n->state_base == NULL) || (draft && n->draft_k_base == NULL) ||
        (draft && l->planes == 2 && n->draft_v_base == NULL) ||
        (n->pool_host == NULL && sim_gpu_prov(n->gpu) == NULL))
        return sim_fail(sc, KVS_ENOMEM, "%s: KV pool tables", n->name);
    /* Layer i's planes back to back: K then V, or MLA's latent alone (no
     * V: v_base stays 0). */
    for (int64_t i = 0; i < n->layers; i++) {
        n->k_base[i] = n->pool_addr + (uint64_t)(l->planes * i) * n->layer_bytes;
        n->v_base[i] = l->planes == 2 ? n->k_base[i] + n->layer_bytes : 0;
        if (l->scale_bytes > 0) { /* layer i's scale planes, after all the KV */
            n->ks_base[i] = n->pool_addr + kv_bytes +
                            (uint64_t)(l->planes * i) * n->scale_layer_bytes;
            n->vs_base[i] = l->planes == 2 ? n->ks_base[i] + n->scale_layer_bytes : 0;
        }
    }
    for (int64_t i = 0, k = 0; state && i < n->layers; i++) {
        kvs_layer_kind_t kind = KVS_LAYER_FULL;
        (void)kvs_layout_layer_kind(l, n->first_layer + i, &kind);
        if (kind == KVS_LAYER_STATE)
            n->state_base[i] = n->pool_addr + kv_bytes + scales_bytes +
                               (uint64_t)(k++) * state_layer_bytes;
    }
    for (int64_t i = 0; draft && i < l->draft_layers; i++) { /* as the model's: K, V */
        n->draft_k_base[i] = n->pool_addr + before_draft +
                             (uint64_t)(l->planes * i) * n->draft_layer_bytes;
        if (n->draft_v_base != NULL)
            n->draft_v_base[i] = n->draft_k_base[i] + n->draft_layer_bytes;
    }

    const bool staging = sc->cfg.staging || sc->cfg.path == KVS_PATH_STAGING;
    kvs_manager_config_t mc = {
        .role = n->role, .staging = staging, .total_heads = l->total_heads,
        .kv_kind = l->kind, .kv_scales = l->kv_scales, .scale_block = l->scale_block,
        .full_attn_every = l->full_attn_every, .other_layers = l->other_layers,
        .window_tokens = l->window_tokens, .state_heads = l->state_heads,
        .state_conv_bytes = l->state_conv_bytes, .state_ssm_bytes = l->state_ssm_bytes,
        .draft_layers = l->draft_layers, .draft_head_dim = l->draft_head_dim,
        .head_dim = l->head_dim, .dtype = sc->cfg.shape.dtype, .layers = n->layers,
        .model_layers = l->layers,
        .page_size = n->ps, .peer_page_size = decode ? l->page_size : l->decode_page_size,
        .tp_rank = n->tp, .tp_size = n->inst->tp,
        .pp_rank = n->pp, .pp_size = n->inst->pp,
        /* A prefill's CP rank and size; a decode learns its peers' CP size
         * from their instances (sim_connect_node), its own config has none. */
        .context_parallel = decode || n->inst->cp == 1 ? 0 : n->inst->cp, .cp_rank = n->cp,
        .peer_tp_size = peer0->tp, .peer_pp_size = peer0->pp,
        .chunk_tokens = sc->cfg.shape.chunk_tokens, .ring_bytes = sc->cfg.ring_bytes,
        .transfer_workers = sc->cfg.transfer_workers, .path = sc->cfg.path,
        .max_rooms = 2 * sc->cfg.max_inflight + 16,
        .stall_timeout_ns = sc->cfg.stall_timeout_ns,
        /* Its instance, and a session of its own in the cluster (the
         * default's formula, instance 0 unchanged). */
        .instance_id = n->inst->id,
        .session_id = ((uint64_t)n->role + 1) << 56 | (uint64_t)n->inst->id << 44 |
                      (uint64_t)n->pp << 32 | (uint64_t)n->cp << 20 | (uint64_t)n->tp,
        /* Every rank of the other side may be its peer; 0: the defaults
         * (64 instances, 256 ranks) hold them. */
        .max_instances = other_insts > 64 ? other_insts : 0,
        .max_peers = other_ranks > 256 ? (uint32_t)other_ranks : 0,
        .max_aux_bytes = sc->cfg.max_aux_bytes,
        .trace = sc->trace != NULL ? sim_core_span : NULL, .trace_ctx = n,
        .log = {.fn = NULL, .level = KVS_LOG_ERROR}};
    kvs_kv_layer_t *layers = calloc((size_t)n->layers, sizeof *layers);
    if (layers == NULL)
        return sim_fail(sc, KVS_ENOMEM, "%s: KV pool tables", n->name);
    for (int64_t i = 0; i < n->layers; i++)
        layers[i] = (kvs_kv_layer_t){.k_addr = n->k_base[i], .v_addr = n->v_base[i],
                                     .tokens = sc->pool_pages * n->ps,
                                     .token_stride_bytes = n->heads * l->head_dim * l->elem_bytes,
                                     .head_stride_bytes = l->head_dim * l->elem_bytes,
                                     .elem_stride_bytes = l->elem_bytes,
                                     .ks_addr = n->ks_base[i], .vs_addr = n->vs_base[i]};
    const kvs_rank_config_t rcfg = {.manager = mc, .layers = layers, .local_heads = n->heads,
                                    .state_base = n->state_base,
                                    .state_slots = state ? (int64_t)sc->cfg.requests : 0,
                                    .draft_k_base = n->draft_k_base,
                                    .draft_v_base = n->draft_v_base};
    kvs_error_t err = {0};
    kvs_fabric_t *fab = NULL; /* its NIC's, wrapped by the hostile writers naming it */
    if ((rc = sim_hostile_fabric(sc, n, &fab)) != KVS_OK) {
        free(layers);
        return rc;
    }
    rc = kvs_rank_create(&rcfg, dev, fab, &n->rank, &err);
    free(layers);
    if (rc != KVS_OK && n->hbm_full) {
        /* The fault under test: the rank reports why and stays down; the
         * run goes on without it. */
        if (sc->ranks_down_at_start++ == 0)
            snprintf(sc->init_error, sizeof sc->init_error, "%s: %s (%s)", n->name, err.msg,
                     kvs_status_name(rc));
        sim_node_teardown(n);
        n->down = true;
        return KVS_OK;
    }
    if (rc != KVS_OK)
        return sim_fail(sc, rc, "%s: %s", n->name, err.msg);
    sim_driver_set_rank(&n->drv, n->rank);
    return KVS_OK;
}

/* Frees everything a rank holds (its counters are kept in n->acc). */
void sim_node_teardown(sim_node_t *n)
{
    kvs_handler_stats_t st = {0};
    kvs_rank_stats(n->rank, &st);
    n->acc.rdma_writes += st.rdma_writes;
    n->acc.rdma_write_bytes += st.rdma_write_bytes;
    n->acc.msgs_sent += st.msgs_sent;
    n->acc.msgs_rejected += st.msgs_rejected;
    n->acc.watermark_waits += st.watermark_waits;
    n->acc.msgs_retransmitted += st.msgs_retransmitted;
    n->acc.msgs_duplicate += st.msgs_duplicate;
    n->acc.peers_lost += st.peers_lost;
    n->acc.keys_granted += st.keys_granted;
    n->acc.keys_revoked += st.keys_revoked;
    if (st.ring_peak_bytes > n->acc.ring_peak_bytes)
        n->acc.ring_peak_bytes = st.ring_peak_bytes;
    if (n->nic != NULL) {
        n->acc_posts_refused += sim_nic_posts_refused(n->nic);
        n->acc_planted_bytes += sim_nic_planted_landed_bytes(n->nic);
    }
    kvs_rank_destroy(n->rank);
    n->rank = NULL;
    if (n->sc != NULL && n->sc->eng != NULL)
        sim_node_ring_sample(n); /* its ring went with it */
    sim_driver_set_rank(&n->drv, NULL);
    if (n->gpu != NULL && n->pool_addr != 0) {
        kvs_device_t *dev = sim_gpu_device(n->gpu);
        (void)dev->ops.mem_free(dev, n->pool_addr);
    }
    sim_nic_destroy(n->nic);
    sim_gpu_destroy(n->gpu);
    free(n->k_base);
    free(n->v_base);
    free(n->ks_base);
    free(n->vs_base);
    free(n->state_base);
    free(n->draft_k_base);
    free(n->draft_v_base);
    n->nic = NULL;
    n->gpu = NULL;
    n->pool_addr = 0;
    n->pool_host = NULL;
    n->k_base = n->v_base = n->ks_base = n->vs_base = n->state_base = NULL;
    n->draft_k_base = n->draft_v_base = NULL;
}

/* Decode rank n declares every prefill instance (the addresses of its
 * ranks) and connects to its writers in each, ahead of time. One that is
 * down (ENOENT: no such NIC now) is kept and retried by the handler. */
int sim_connect_node(sim_scenario_t *sc, sim_node_t *n)
{
    for (uint32_t p = 0; p < sc->npinst; p++) {
        const sim_inst_t *pi = sim_prefill_inst(sc, p);
        const char **addrs = malloc((size_t)pi->nranks * sizeof *addrs);
        if (addrs == NULL)
            return sim_fail(sc, KVS_ENOMEM, "scenario tables");
        bool down = false;
        for (int64_t k = 0; k < pi->nranks; k++) {
            addrs[k] = pi->nodes[k].name; /* CP- then stage-major, as the handler wants */
            down = down || pi->nodes[k].down;
        }
        const kvs_instance_desc_t desc = {.id = pi->id, .tp_size = pi->tp, .pp_size = pi->pp,
                                          .dp_size = 1, .cp_size = pi->cp, .addrs = addrs};
        int rc = kvs_rank_add_instance(n->rank, &desc);
        free(addrs);
        if (rc == KVS_OK)
            rc = kvs_rank_connect(n->rank, (kvs_peer_t){pi->id, 0});
        if (rc != KVS_OK && !(rc == KVS_ENOENT && down))
            return sim_fail(sc, rc, "%s: %s", n->name, kvs_rank_last_error(n->rank)->msg);
    }
    sim_node_wake(n);
    return KVS_OK;
}

static int64_t sim_group_root(int64_t *parent, int64_t k)
{
    while (parent[k] != k)
        k = parent[k] = parent[parent[k]];
    return k;
}

/* Groups of the ranks of pair (pi, di) that talk to each other: a decode
 * and every prefill rank that writes to it are one group, and groups
 * sharing a rank merge. Indexed prefill ranks first, then decode ranks;
 * numbered 0.. in that order; past 64 groups, the last ones share bit 63
 * (the judge then counts across them: stricter, never laxer). */
static int sim_pair_groups(sim_scenario_t *sc, const sim_inst_t *pi, const sim_inst_t *di,
                           sim_pair_t *pair)
{
    const kvs_layout_t *l = &pair->lay;
    const int64_t nodes = pi->nranks + di->nranks;
    const int64_t stages = l->prefill_pp / l->decode_pp;
    const int64_t cp_ranks = l->prefill_tp * l->prefill_pp; /* ranks of one CP rank */
    int64_t *parent = malloc((size_t)nodes * sizeof *parent);
    pair->group = malloc((size_t)nodes * sizeof *pair->group);
    if (parent == NULL || pair->group == NULL) {
        free(parent);
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    }
    for (int64_t k = 0; k < nodes; k++)
        parent[k] = k;
    for (int64_t d = 0; d < di->nranks; d++) {
        const sim_node_t *n = &di->nodes[d];
        const int64_t first = l->decode_pp == 1 ? 0 : n->pp;
        for (int64_t i = 0; i < l->tp_writers; i++) {
            /* its prefill rank (kvs_layout_writer's; a hybrid layout's
             * blocks differ by chunk, its writers do not) */
            kvs_hybrid_writer_t hw;
            const kvs_chunk_t none = {0};
            (void)kvs_layout_hybrid_writer(l, n->tp, n->pp, i, 0, &none, &hw);
            const kvs_writer_t w = hw.w;
            for (int64_t c = 0; c < l->prefill_cp; c++) /* every CP rank writes to it */
                for (int64_t s = first; s < first + stages; s++) {
                    const int64_t a = sim_group_root(parent, pi->nranks + d);
                    const int64_t b = sim_group_root(parent, c * cp_ranks +
                                                                 s * l->prefill_tp +
                                                                 w.prefill_rank);
                    parent[a] = b;
                }
        }
    }
    int64_t next = 0;
    for (int64_t k = 0; k < nodes; k++)
        pair->group[k] = -1;
    for (int64_t k = 0; k < nodes; k++) {
        const int64_t root = sim_group_root(parent, k);
        if (pair->group[root] < 0)
            pair->group[root] = next < 63 ? next++ : 63;
        pair->group[k] = pair->group[root];
    }
    pair->ngroups = next + 1; /* (63 when capped: indices up to 63) */
    free(parent);
    return KVS_OK;
}

int sim_connect_all(sim_scenario_t *sc)
{
    for (int64_t d = 0; d < sc->ndecode; d++) {
        sim_node_t *n = &sc->nodes[sc->nprefill + d];
        int rc = n->down ? KVS_OK : sim_connect_node(sc, n);
        if (rc != KVS_OK)
            return rc;
    }
    return KVS_OK;
}

/* The instances, their ranks (named and numbered as the file's header
 * says), page pools and compute queues, and every pair's layout and groups. */
int sim_build_cluster(sim_scenario_t *sc)
{
    const sim_scenario_config_t *c = &sc->cfg;
    sc->npinst = sc->topo.prefill_instances;
    sc->ndinst = sc->topo.decode_instances;
    sc->insts = calloc(sc->npinst + sc->ndinst, sizeof *sc->insts);
    sc->pairs = calloc((size_t)sc->npinst * sc->ndinst, sizeof *sc->pairs);
    if (sc->insts == NULL || sc->pairs == NULL)
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    for (uint32_t k = 0; k < sc->npinst + sc->ndinst; k++) {
        sim_inst_t *inst = &sc->insts[k];
        const bool decode = k >= sc->npinst;
        const sim_instance_shape_t *shape =
            decode ? &sc->topo.decode[k - sc->npinst] : &sc->topo.prefill[k];
        inst->role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
        inst->id = decode ? k - sc->npinst : k;
        inst->tp = shape->tp;
        inst->pp = shape->pp;
        inst->cp = decode ? 1 : sc->topo.prefill_cp;
        inst->nranks = sim_topology_ranks(&sc->topo, inst->role, inst->id);
        *(decode ? &sc->ndecode : &sc->nprefill) += inst->nranks;
        inst->compute_first = inst->compute_last = UINT32_MAX;
        if (sim_pages_init(&inst->pages, sc->pool_pages) != KVS_OK)
            return sim_fail(sc, KVS_ENOMEM, "page pools");
    }
    sc->nodes = calloc((size_t)(sc->nprefill + sc->ndecode), sizeof *sc->nodes);
    if (sc->nodes == NULL)
        return sim_fail(sc, KVS_ENOMEM, "scenario tables");
    sim_node_t *n = sc->nodes;
    for (uint32_t k = 0; k < sc->npinst + sc->ndinst; k++) {
        sim_inst_t *inst = &sc->insts[k];
        inst->nodes = n;
        for (int64_t j = 0; j < inst->nranks; j++, n++) {
            n->sc = sc;
            n->inst = inst;
            n->role = inst->role;
            n->tp = j % inst->tp;
            n->pp = j / inst->tp % inst->pp;
            n->cp = j / (inst->tp * inst->pp);
            const char side = inst->role == KVS_ROLE_DECODE ? 'd' : 'p';
            /* "p<tp>.<pp>", "c<cp>" with CP, "@<instance>" past instance 0 */
            char cp[24] = "", at[16] = "";
            if (inst->cp > 1)
                snprintf(cp, sizeof cp, "c%lld", (long long)n->cp);
            if (inst->id > 0)
                snprintf(at, sizeof at, "@%u", inst->id);
            snprintf(n->name, sizeof n->name, "%c%lld.%lld%s%s", side, (long long)n->tp,
                     (long long)n->pp, cp, at);
            n->reported = calloc(c->requests, 1);
            if (n->reported == NULL)
                return sim_fail(sc, KVS_ENOMEM, "scenario tables");
        }
    }
    for (uint32_t p = 0; p < sc->npinst; p++)
        for (uint32_t d = 0; d < sc->ndinst; d++) {
            sim_pair_t *pair = &sc->pairs[p * sc->ndinst + d];
            const kvs_layout_params_t params = sim_topology_pair(&c->shape, &sc->topo, p, d);
            kvs_error_t err = {0};
            int rc = kvs_layout_init(&pair->lay, &params, &err);
            if (rc != KVS_OK) /* the topology was checked: cannot be */
                return sim_fail(sc, rc, "pair of prefill instance %u and decode instance %u: %s",
                                p, d, err.msg);
            if ((rc = sim_pair_groups(sc, sim_prefill_inst(sc, p), sim_decode_inst(sc, d),
                                      pair)) != KVS_OK)
                return rc;
        }
    return KVS_OK;
}
