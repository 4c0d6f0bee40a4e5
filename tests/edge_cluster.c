/*
 * edge_cluster.c - the simulated test cluster of edge_cluster.h.
 */
#include "edge_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "kvdata.h"
#include "link.h"

const kvs_manager_config_t edge_fp_cfg;

/* ---- the cluster ---------------------------------------------------------- */

edge_opts_t edge_defaults(void)
{
    edge_opts_t o;
    memset(&o, 0, sizeof o);
    o.prefill_tp = 2;
    o.decode_tp = 1;
    o.heads = 4;
    o.head_dim = 16;
    o.layers = 2;
    o.page_size = 4;
    o.chunk_tokens = 16;
    o.dtype = KVS_DTYPE_BF16;
    o.staging = true;
    o.path = KVS_PATH_AUTO;
    o.ring_bytes = 64u << 10;
    o.transfer_workers = 2;
    o.odd_rank = -1;
    return o;
}

edge_node_t *edge_prefill(edge_cluster_t *cl, int i) { return &cl->nodes[i]; }

edge_node_t *edge_decode(edge_cluster_t *cl, int i) { return &cl->nodes[cl->nprefill + i]; }

int edge_nnodes(const edge_cluster_t *cl)
{
    return cl->nprefill + cl->ndecode + cl->nextra;
}

edge_node_t *edge_group_node(edge_cluster_t *cl, int inst, int g, int64_t tp)
{
    if (inst == 0)
        return edge_prefill(cl, (int)tp);
    for (int i = cl->nprefill + cl->ndecode; i < edge_nnodes(cl); i++)
        if (cl->nodes[i].inst == inst && cl->nodes[i].dp == g && cl->nodes[i].tp == tp)
            return &cl->nodes[i];
    EDGE_FAIL("no prefill rank %lld in group %d of instance %d", (long long)tp, g, inst);
    return NULL;
}

edge_node_t *edge_inst_node(edge_cluster_t *cl, int inst, int64_t tp)
{
    return edge_group_node(cl, inst, 0, tp);
}

/* The TP of prefill instance inst (of one attention group). */
static int64_t edge_inst_tp(const edge_cluster_t *cl, int inst)
{
    return inst == 0 ? cl->o.prefill_tp : cl->o.inst_tp[inst];
}

/* The attention groups of prefill instance inst. */
static int edge_inst_dp(const edge_cluster_t *cl, int inst)
{
    return inst == 0 || cl->o.inst_dp[inst] == 0 ? 1 : (int)cl->o.inst_dp[inst];
}

/* The prefill CP ranks of instance inst. */
static int64_t edge_inst_cp(const edge_cluster_t *cl, int inst)
{
    return inst == 0 || cl->o.inst_cp[inst] == 0 ? 1 : cl->o.inst_cp[inst];
}

/* The node groups of instance inst: its attention groups, or its CP ranks
 * (a node's dp is then its CP rank). */
static int edge_inst_groups(const edge_cluster_t *cl, int inst)
{
    return edge_inst_cp(cl, inst) > 1 ? (int)edge_inst_cp(cl, inst) : edge_inst_dp(cl, inst);
}

static void edge_log(void *user, kvs_log_level_t level, const char *msg)
{
    edge_node_t *n = user;
    if (level == KVS_LOG_ERROR)
        n->log_errors++;
    else if (level == KVS_LOG_WARN)
        n->log_warnings++;
    if (n->cl->o.log_watch != NULL && strstr(msg, n->cl->o.log_watch) != NULL)
        n->log_watched++;
    snprintf(n->log_last, sizeof n->log_last, "%s", msg);
    if (getenv("EDGE_LOG") != NULL) /* debugging a test: every line */
        fprintf(stderr, "[%s %llu] %s\n", n->name,
                (unsigned long long)sim_engine_now_ns(n->cl->eng), msg);
}

/* The driver's callbacks: each finished room, a failed step, and the
 * rooms' stall deadline, which the harness tells from the links'
 * retransmissions (edge_run stops before the first, runs the others). */
static void edge_on_result(void *ctx, const kvs_room_result_t *res)
{
    edge_node_t *n = ctx;
    if (n->nres == EDGE_MAX_RESULTS)
        EDGE_FAIL("%s: more than %d results", n->name, EDGE_MAX_RESULTS);
    /* The aux bytes live until the rank's next step: keep a copy. */
    uint8_t *aux = NULL;
    if (res->aux_bytes > 0) {
        assert_non_null(res->aux);
        aux = malloc(res->aux_bytes);
        assert_non_null(aux);
        memcpy(aux, res->aux, res->aux_bytes);
    }
    n->res_aux[n->nres] = aux;
    n->res[n->nres] = *res;
    n->res[n->nres++].aux = aux;
    if (n->cl->on_result != NULL)
        n->cl->on_result(n->cl, n, res);
}

static void edge_on_error(void *ctx, int status)
{
    edge_node_t *n = ctx;
    if (n->progress_rc == KVS_OK)
        n->progress_rc = status;
}

static uint64_t edge_stall_ns(const kvs_rank_t *rank)
{
    kvs_rank_t *r = (kvs_rank_t *)rank; /* the getters take no const */
    return kvs_rank_decode(r) != NULL ? kvs__decode_stall_ns(kvs_rank_decode(r))
                                      : kvs__prefill_stall_ns(kvs_rank_prefill(r));
}

void edge_wake(edge_node_t *n) { sim_driver_wake(&n->drv); }

void edge_attach(edge_node_t *n, kvs_rank_t *rank)
{
    n->rank = rank;
    n->dec = kvs_rank_decode(rank);
    n->pre = kvs_rank_prefill(rank);
    sim_driver_set_rank(&n->drv, rank);
}

void edge_rank_drop(edge_node_t *n)
{
    kvs_rank_destroy(n->rank);
    edge_attach(n, NULL);
}

static void edge_check_progress(edge_cluster_t *cl)
{
    for (int i = 0; i < edge_nnodes(cl); i++)
        if (cl->nodes[i].progress_rc != KVS_OK)
            EDGE_FAIL("%s: progress failed: %s (%s)", cl->nodes[i].name,
                      kvs_status_name(cl->nodes[i].progress_rc),
                      kvs_manager_last_error(cl->nodes[i].m)->msg);
}

/* The earliest stall deadline any rank armed a timer for, UINT64_MAX if none
 * (timers for link retransmissions are armed apart, and run). */
static uint64_t edge_earliest_timer(const edge_cluster_t *cl)
{
    uint64_t t = UINT64_MAX;
    for (int i = 0; i < edge_nnodes(cl); i++) {
        const uint64_t at = cl->nodes[i].drv.stall_timer_ns;
        if (at != 0 && at < t)
            t = at;
    }
    return t;
}

void edge_run(edge_cluster_t *cl)
{
    /* One event at a time: a rank may arm an earlier timer at any event. */
    uint64_t ran = 0;
    for (;;) {
        const uint64_t t = edge_earliest_timer(cl);
        if (sim_engine_run(cl->eng, t == UINT64_MAX ? UINT64_MAX : t - 1, 1) == 0)
            break;
        if (++ran >= EDGE_EVENT_BUDGET)
            EDGE_FAIL("the engine is still busy after %llu events: livelock",
                      (unsigned long long)EDGE_EVENT_BUDGET);
    }
    edge_check_progress(cl);
}

void edge_run_past_timeouts(edge_cluster_t *cl)
{
    sim_engine_run(cl->eng, UINT64_MAX, EDGE_EVENT_BUDGET);
    if (sim_engine_pending(cl->eng) != 0)
        EDGE_FAIL("the engine is still busy after %llu events: livelock",
                  (unsigned long long)EDGE_EVENT_BUDGET);
    edge_check_progress(cl);
}

static int edge_node_setup(edge_cluster_t *cl, edge_node_t *n, kvs_role_t role, int inst,
                           int dp, int64_t tp, uint32_t gpu_id)
{
    const edge_opts_t *o = &cl->o;
    const bool decode = role == KVS_ROLE_DECODE;
    const bool odd = !decode && inst == 0 && (tp == o->odd_rank || o->odd_rank == -2);
    n->cl = cl;
    n->role = role;
    n->inst = inst;
    n->dp = dp;
    n->tp = tp;
    if (inst > 0 && edge_inst_groups(cl, inst) > 1)
        snprintf(n->name, sizeof n->name, "i%dg%dp%lld", inst, dp, (long long)tp);
    else if (inst > 0)
        snprintf(n->name, sizeof n->name, "i%dp%lld", inst, (long long)tp);
    else
        snprintf(n->name, sizeof n->name, "%c%lld", decode ? 'd' : 'p', (long long)tp);
    n->page_size = odd && o->odd_page_size > 0 ? o->odd_page_size : o->page_size;
    const kvs_dtype_t dtype = odd && o->odd_dtype_set ? o->odd_dtype : o->dtype;
    n->elem_bytes = kvs_dtype_bytes(dtype);
    const int64_t tp_size = decode ? o->decode_tp : edge_inst_tp(cl, inst);
    n->mla = o->mla;
    n->heads = (odd && o->odd_mla) || o->mla ? 1 : o->heads >= tp_size ? o->heads / tp_size : 1;
    n->layers = odd && o->odd_pp > 0 ? o->layers / o->odd_pp : o->layers;
    assert_true(n->layers <= EDGE_MAX_LAYERS);

    sim_gpu_config_t gc = o->gpu;
    if (gc.hbm_bytes == 0)
        gc.hbm_bytes = 64u << 20;
    int rc = sim_gpu_create(cl->eng, &gc, gpu_id, &n->gpu);
    if (rc == KVS_OK)
        rc = sim_nic_create(cl->net, n->name, n->gpu, &n->nic);
    if (rc != KVS_OK)
        return rc;
    sim_driver_init(&n->drv, cl->eng, NULL, n, edge_on_result, edge_on_error);
    n->drv.stall_ns = edge_stall_ns;
    sim_gpu_set_wake(n->gpu, sim_driver_wake, &n->drv);
    sim_nic_set_wake(n->nic, sim_driver_wake, &n->drv);

    kvs_device_t *dev = sim_gpu_device(n->gpu);
    n->layer_bytes = (uint64_t)(EDGE_POOL_PAGES * n->page_size * n->heads * o->head_dim *
                                n->elem_bytes);
    const bool scales = odd && o->odd_scales; /* 4 bytes a head, after the KV */
    const uint64_t scale_layer_bytes = (uint64_t)(EDGE_POOL_PAGES * n->page_size * n->heads * 4);
    n->pool_bytes = 2 * (uint64_t)n->layers * (n->layer_bytes + (scales ? scale_layer_bytes : 0));
    rc = dev->ops.mem_alloc(dev, n->pool_bytes, &n->pool_addr);
    if (rc != KVS_OK)
        return rc;
    n->pool_host = sim_gpu_host(n->gpu, n->pool_addr, n->pool_bytes);
    assert_non_null(n->pool_host);
    memset(n->pool_host, 0, n->pool_bytes);
    for (int64_t l = 0; l < n->layers; l++) {
        n->k_base[l] = n->pool_addr + (uint64_t)(2 * l) * n->layer_bytes;
        n->v_base[l] = n->pool_addr + (uint64_t)(2 * l + 1) * n->layer_bytes;
        const uint64_t sb = n->pool_addr + 2 * (uint64_t)n->layers * n->layer_bytes;
        n->ks_base[l] = scales ? sb + (uint64_t)(2 * l) * scale_layer_bytes : 0;
        n->vs_base[l] = scales ? sb + (uint64_t)(2 * l + 1) * scale_layer_bytes : 0;
    }

    return edge_node_manager(cl, n, (decode ? EDGE_DECODE_SESSION : EDGE_PREFILL_SESSION) +
                                        0x100u * (uint64_t)inst + 0x10u * (uint64_t)dp +
                                        (uint64_t)tp);
}

int edge_node_manager(edge_cluster_t *cl, edge_node_t *n, uint64_t session)
{
    const edge_opts_t *o = &cl->o;
    const bool decode = n->role == KVS_ROLE_DECODE;
    const bool odd = !decode && n->inst == 0 && (n->tp == o->odd_rank || o->odd_rank == -2);
    const kvs_dtype_t dtype = odd && o->odd_dtype_set ? o->odd_dtype : o->dtype;
    const int64_t tp = n->tp, tp_size = decode ? o->decode_tp : edge_inst_tp(cl, n->inst);
    const kvs_role_t role = n->role;
    const bool staging = o->staging && !(odd && o->odd_slice);
    const bool mla = (odd && o->odd_mla) || o->mla, scales = odd && o->odd_scales;
    kvs_manager_config_t mc = {
        .kv_scales = scales ? KVS_KV_SCALES_PER_TOKEN : KVS_KV_SCALES_NONE,
        .role = role, .staging = staging, .total_heads = mla ? 0 : o->heads,
        .kv_kind = mla ? KVS_KV_MLA : KVS_KV_GQA, .head_dim = o->head_dim,
        .dtype = dtype, .layers = n->layers, .page_size = n->page_size, .tp_rank = tp,
        .tp_size = tp_size, .pp_rank = 0, .pp_size = odd && o->odd_pp > 0 ? o->odd_pp : 1,
        .peer_tp_size = decode ? o->prefill_tp
                        : odd && o->odd_decode_tp > 0 ? o->odd_decode_tp
                        : o->prefill_learns ? 0 : o->decode_tp,
        .peer_pp_size = 1,
        .chunk_tokens = o->chunk_tokens, .ring_bytes = o->ring_bytes,
        .ring_max_live = o->ring_max_live, .transfer_workers = o->transfer_workers,
        .path = odd && o->odd_slice ? KVS_PATH_SLICE : o->path, .max_rooms = o->max_rooms,
        .max_inflight_writes = o->max_inflight_writes,
        .session_id = session, .app_tag = odd ? o->odd_app_tag : 0,
        .max_aux_bytes = odd && o->odd_max_aux_set ? o->odd_max_aux : o->max_aux_bytes,
        .instance_id = decode ? 0 : (uint64_t)n->inst,
        .dp_rank = decode || edge_inst_cp(cl, n->inst) > 1 ? 0 : n->dp,
        .context_parallel = decode ? 0 : edge_inst_cp(cl, n->inst),
        .cp_rank = decode || edge_inst_cp(cl, n->inst) == 1 ? 0 : n->dp,
        .max_instances = o->max_instances,
        .secret_env = decode ? o->decode_secret_env : o->prefill_secret_env,
        .log = {.fn = edge_log,
                .user = n,
                .level = getenv("EDGE_LOG") != NULL ? KVS_LOG_DEBUG : KVS_LOG_WARN}};
    kvs_error_t err = {0};
    sim_nic_fabric(n->nic)->ops.caps |= o->extra_caps;
    if (o->rank_create) {
        kvs_kv_layer_t layers[EDGE_MAX_LAYERS];
        const int64_t elem = n->elem_bytes;
        for (int64_t l = 0; l < n->layers; l++)
            layers[l] = (kvs_kv_layer_t){.k_addr = n->k_base[l],
                                         .v_addr = mla ? 0 : n->v_base[l],
                                         .tokens = EDGE_POOL_PAGES * n->page_size,
                                         .token_stride_bytes = n->heads * o->head_dim * elem,
                                         .head_stride_bytes = o->head_dim * elem,
                                         .elem_stride_bytes = elem,
                                         .ks_addr = n->ks_base[l],
                                         .vs_addr = mla ? 0 : n->vs_base[l]};
        const kvs_rank_config_t rc_cfg = {.manager = mc, .layers = layers};
        kvs_rank_t *rank = NULL;
        int rc = kvs_rank_create(&rc_cfg, sim_gpu_device(n->gpu), sim_nic_fabric(n->nic), &rank,
                                 &err);
        if (rc != KVS_OK) {
            print_error("%s: rank: %s\n", n->name, err.msg);
            return rc;
        }
        n->m = kvs_rank_manager(rank);
        n->rank_owns_manager = true;
        edge_attach(n, rank);
        return KVS_OK;
    }
    int rc = kvs_manager_create(&mc, sim_gpu_device(n->gpu), sim_nic_fabric(n->nic), &n->m, &err);
    if (rc != KVS_OK) {
        print_error("%s: manager: %s\n", n->name, err.msg);
        return rc;
    }
    /* spec §8: manager -> staging memory -> its registration -> KV buffers
     * -> handler. */
    if (staging && (rc = kvs_manager_init_staging(n->m)) == KVS_OK)
        rc = kvs_manager_register_staging(n->m);
    kvs_kv_buffers_t kv = {.num_layers = n->layers, .k_base = n->k_base,
                           .v_base = mla ? NULL : n->v_base,
                           .local_heads = n->heads, .page_size = n->page_size,
                           .num_pages = EDGE_POOL_PAGES,
                           .ks_base = scales ? n->ks_base : NULL,
                           .vs_base = scales && !mla ? n->vs_base : NULL};
    if (rc == KVS_OK)
        rc = kvs_manager_set_kv_buffers(n->m, &kv);
    kvs_rank_t *rank = NULL;
    if (rc == KVS_OK && !o->no_handlers && (rc = kvs_rank_create_on(n->m, &rank)) == KVS_OK)
        edge_attach(n, rank);
    if (rc != KVS_OK)
        print_error("%s: %s\n", n->name, kvs_manager_last_error(n->m)->msg);
    return rc;
}

void edge_connect(edge_cluster_t *cl, int d)
{
    edge_node_t *n = edge_decode(cl, d);
    const kvs_layout_t *lay = kvs_manager_layout(n->m);
    for (int64_t i = 0; i < lay->tp_sources; i++) { /* writers, and MLA's silent ranks */
        int64_t rank = 0;
        assert_int_equal(kvs_layout_source_rank(lay, n->tp, i, &rank), KVS_OK);
        char peer[16];
        snprintf(peer, sizeof peer, "p%lld", (long long)rank);
        int rc = kvs_decode_connect(n->dec, peer, rank, 0);
        if (rc != KVS_OK)
            EDGE_FAIL("%s: connect %s: %s", n->name, peer, kvs_manager_last_error(n->m)->msg);
    }
    for (int inst = 1; inst < cl->o.instances; inst++) {
        char names[EDGE_MAX_NODES][32];
        const char *addrs[EDGE_MAX_NODES];
        const int64_t tp = edge_inst_tp(cl, inst), cp = edge_inst_cp(cl, inst);
        const int dp = edge_inst_dp(cl, inst);
        /* groups in address order: attention groups, or CP ranks */
        for (int g = 0; g < edge_inst_groups(cl, inst); g++)
            for (int64_t t = 0; t < tp; t++) {
                const edge_node_t *p = edge_group_node(cl, inst, g, t);
                snprintf(names[g * tp + t], sizeof names[0], "%s", p->name);
                addrs[g * tp + t] = names[g * tp + t];
            }
        const kvs_instance_desc_t desc = {.id = (uint64_t)inst, .tp_size = tp, .dp_size = dp,
                                          .addrs = addrs, .cp_size = cp};
        int rc = kvs_decode_add_instance(n->dec, &desc);
        for (int g = 0; g < dp && rc == KVS_OK; g++)
            rc = kvs_decode_connect_peer(n->dec, (kvs_peer_t){(uint64_t)inst, g});
        if (rc != KVS_OK)
            EDGE_FAIL("%s: instance %d: %s", n->name, inst, kvs_manager_last_error(n->m)->msg);
    }
    edge_wake(n);
}

edge_cluster_t *edge_create(const edge_opts_t *o)
{
    edge_cluster_t *cl = calloc(1, sizeof *cl);
    assert_non_null(cl);
    cl->o = *o;
    cl->nprefill = (int)o->prefill_tp;
    cl->ndecode = (int)o->decode_tp;
    assert_true(o->instances <= EDGE_MAX_INSTANCES);
    for (int inst = 1; inst < o->instances; inst++)
        cl->nextra += (int)o->inst_tp[inst] * edge_inst_groups(cl, inst);
    assert_true(edge_nnodes(cl) <= EDGE_MAX_NODES);
    assert_int_equal(sim_engine_create(EDGE_SEED, 256, &cl->eng), KVS_OK);
    assert_int_equal(sim_net_create(cl->eng, &o->net, &cl->net), KVS_OK);
    for (int i = 0, inst = 1, g = 0, tp = 0; i < edge_nnodes(cl); i++) {
        const bool decode = i >= cl->nprefill && i < cl->nprefill + cl->ndecode;
        int rc;
        if (i < cl->nprefill + cl->ndecode) {
            rc = edge_node_setup(cl, &cl->nodes[i], decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL,
                                 0, 0, decode ? i - cl->nprefill : i, (uint32_t)i);
        } else {
            rc = edge_node_setup(cl, &cl->nodes[i], KVS_ROLE_PREFILL, inst, g, tp, (uint32_t)i);
            if (++tp == edge_inst_tp(cl, inst) && (tp = 0, ++g == edge_inst_groups(cl, inst))) {
                inst++;
                g = 0;
            }
        }
        if (rc != KVS_OK)
            EDGE_FAIL("setting up node %d failed: %s", i, kvs_status_name(rc));
    }
    if (!o->no_connect && !o->no_handlers) {
        for (int d = 0; d < cl->ndecode; d++)
            edge_connect(cl, d);
        edge_run(cl);
    }
    return cl;
}

void edge_assert_registered(edge_cluster_t *cl)
{
    for (int d = 0; d < cl->ndecode; d++) {
        edge_node_t *n = edge_decode(cl, d);
        if (kvs_decode_peers_ready(n->dec) != kvs_manager_layout(n->m)->expected_arrivals)
            EDGE_FAIL("%s: %lld of %lld peers ready: %s", n->name,
                      (long long)kvs_decode_peers_ready(n->dec),
                      (long long)kvs_manager_layout(n->m)->expected_arrivals,
                      kvs_manager_last_error(n->m)->msg);
    }
}

void edge_destroy(edge_cluster_t *cl)
{
    for (int i = 0; i < edge_nnodes(cl); i++) {
        edge_node_t *n = &cl->nodes[i];
        kvs_rank_destroy(n->rank);
        if (n->m != NULL && !n->rank_owns_manager)
            assert_int_equal(kvs_manager_destroy(n->m), KVS_OK);
        if (n->pool_addr != 0) {
            kvs_device_t *dev = sim_gpu_device(n->gpu);
            assert_int_equal(dev->ops.mem_free(dev, n->pool_addr), KVS_OK);
        }
        sim_nic_destroy(n->nic);
        sim_gpu_destroy(n->gpu);
        for (int r = 0; r < n->nres; r++)
            free(n->res_aux[r]);
    }
    assert_int_equal(sim_net_destroy(cl->net), KVS_OK);
    sim_engine_destroy(cl->eng);
    free(cl);
}

void edge_crash(edge_node_t *n)
{
    edge_rank_drop(n);
    if (!n->rank_owns_manager)
        assert_int_equal(kvs_manager_destroy(n->m), KVS_OK);
    n->m = NULL;
    kvs_device_t *dev = sim_gpu_device(n->gpu);
    assert_int_equal(dev->ops.mem_free(dev, n->pool_addr), KVS_OK);
    n->pool_addr = 0;
    sim_nic_destroy(n->nic);
    n->nic = NULL;
    sim_gpu_destroy(n->gpu);
    n->gpu = NULL;
    n->crashed = true;
}

void edge_restart(edge_cluster_t *cl, edge_node_t *n)
{
    const uint32_t gpu_id = (uint32_t)(n - cl->nodes);
    const int inst = n->inst, dp = n->dp;
    const int64_t tp = n->tp;
    memset(n, 0, sizeof *n);
    assert_int_equal(edge_node_setup(cl, n, KVS_ROLE_PREFILL, inst, dp, tp, gpu_id), KVS_OK);
}

/* ---- requests --------------------------------------------------------------- */

int64_t edge_page(uint64_t room, int64_t i, bool decode)
{
    const int64_t slot = (int64_t)(room % EDGE_ROOM_SLOTS) * EDGE_ROOM_SLOT_PAGES;
    return slot + i + (decode && i >= 2 ? 1 : 0);
}

static int64_t edge_pages(int64_t tokens, int64_t ps) { return (tokens + ps - 1) / ps; }

/* Global head of local head j of a rank (heads are not replicated here;
 * an MLA latent is one head, the same on every TP rank). */
static int64_t edge_global_head(const edge_node_t *n, int64_t j)
{
    return n->mla ? 0 : n->tp * n->heads + j;
}

static uint8_t *edge_slot(const edge_node_t *n, int64_t layer, int kv, int64_t page,
                          int64_t slot, int64_t head)
{
    const int64_t hb = n->cl->o.head_dim * n->elem_bytes;
    const uint64_t addr = (kv ? n->v_base[layer] : n->k_base[layer]) +
                          (uint64_t)(((page * n->page_size + slot) * n->heads + head) * hb);
    return n->pool_host + (addr - n->pool_addr);
}

void edge_fill(edge_node_t *n, uint64_t room, int64_t total) { edge_fill_range(n, room, 0, total); }

void edge_fill_range(edge_node_t *n, uint64_t room, int64_t start, int64_t end)
{
    const size_t hb = (size_t)(n->cl->o.head_dim * n->elem_bytes);
    for (int64_t l = 0; l < n->layers; l++)
        for (int kv = 0; kv < (n->mla ? 1 : 2); kv++)
            for (int64_t t = start; t < end; t++)
                for (int64_t j = 0; j < n->heads; j++) {
                    sim_kv_coord_t c = {room, l, kv, edge_global_head(n, j), t};
                    sim_kvdata_fill(edge_slot(n, l, kv, edge_page(room, t / n->page_size, false),
                                              t % n->page_size, j),
                                    hb, &c);
                }
}

uint64_t edge_corrupt(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total)
{
    uint64_t bad = 0;
    for (int d = 0; d < cl->ndecode; d++) {
        edge_node_t *n = edge_decode(cl, d);
        const size_t hb = (size_t)(cl->o.head_dim * n->elem_bytes);
        for (int64_t l = 0; l < n->layers; l++)
            for (int kv = 0; kv < (n->mla ? 1 : 2); kv++)
                for (int64_t t = base; t < total; t++)
                    for (int64_t j = 0; j < n->heads; j++) {
                        sim_kv_coord_t c = {room, l, kv, edge_global_head(n, j), t};
                        bad += sim_kvdata_check(
                            edge_slot(n, l, kv, edge_page(room, (t - base) / n->page_size, true),
                                      t % n->page_size, j),
                            hb, &c);
                    }
    }
    return bad;
}

void edge_open_decode(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total)
{
    for (int d = 0; d < cl->ndecode; d++) {
        edge_node_t *n = edge_decode(cl, d);
        int64_t pages[EDGE_ROOM_SLOT_PAGES];
        const int64_t np = edge_pages(total - base, n->page_size);
        assert_true(np < EDGE_ROOM_SLOT_PAGES);
        for (int64_t i = 0; i < np; i++)
            pages[i] = edge_page(room, i, true);
        int rc = kvs_decode_room_open(n->dec, room, base, total, pages, np);
        if (rc != KVS_OK)
            EDGE_FAIL("%s: room_open %llu: %s", n->name, (unsigned long long)room,
                      kvs_manager_last_error(n->m)->msg);
        edge_wake(n);
    }
}

void edge_open_prefill(edge_cluster_t *cl, int i, uint64_t room, int64_t total)
{
    edge_node_t *n = edge_prefill(cl, i);
    int64_t pages[EDGE_ROOM_SLOT_PAGES];
    const int64_t np = edge_pages(total, n->page_size);
    assert_true(np <= EDGE_ROOM_SLOT_PAGES);
    for (int64_t k = 0; k < np; k++)
        pages[k] = edge_page(room, k, false);
    edge_fill(n, room, total);
    int rc = kvs_prefill_room_open(n->pre, room, total, pages, np);
    if (rc != KVS_OK)
        EDGE_FAIL("%s: room_open %llu: %s", n->name, (unsigned long long)room,
                  kvs_manager_last_error(n->m)->msg);
    edge_wake(n);
}

void edge_open(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total)
{
    edge_open_decode(cl, room, base, total);
    for (int i = 0; i < cl->nprefill; i++)
        edge_open_prefill(cl, i, room, total);
}

void edge_computed_on(edge_cluster_t *cl, int i, uint64_t room, int64_t end, bool final)
{
    edge_node_t *n = edge_prefill(cl, i);
    int rc = kvs_prefill_room_computed(n->pre, room, end, final);
    if (rc != KVS_OK)
        EDGE_FAIL("%s: room_computed %llu: %s", n->name, (unsigned long long)room,
                  kvs_manager_last_error(n->m)->msg);
    edge_wake(n);
}

void edge_computed(edge_cluster_t *cl, uint64_t room, int64_t end, bool final)
{
    for (int i = 0; i < cl->nprefill; i++)
        edge_computed_on(cl, i, room, end, final);
}

void edge_transfer(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total)
{
    edge_open(cl, room, base, total);
    edge_computed(cl, room, total, true);
    edge_run(cl);
}

/* ---- results ---------------------------------------------------------------- */

const kvs_room_result_t *edge_result(const edge_node_t *n, uint64_t room)
{
    const kvs_room_result_t *found = NULL;
    for (int i = 0; i < n->nres; i++) {
        if (n->res[i].room != room)
            continue;
        if (found != NULL)
            EDGE_FAIL("%s reported room %llu twice", n->name, (unsigned long long)room);
        found = &n->res[i];
    }
    return found;
}

const kvs_room_result_t *edge_expect(const edge_node_t *n, uint64_t room, int status)
{
    const kvs_room_result_t *r = edge_result(n, room);
    if (r == NULL)
        EDGE_FAIL("%s never reported room %llu (expected %s)", n->name,
                  (unsigned long long)room, kvs_status_name(status));
    if (r->status != status)
        EDGE_FAIL("%s: room %llu ended %s, expected %s (last error: %s)", n->name,
                  (unsigned long long)room, kvs_status_name(r->status), kvs_status_name(status),
                  kvs_manager_last_error(n->m)->msg);
    return r;
}

void edge_expect_all(edge_cluster_t *cl, uint64_t room, int status)
{
    for (int i = 0; i < edge_nnodes(cl); i++)
        edge_expect(&cl->nodes[i], room, status);
}

uint64_t edge_ring_live_bytes(edge_cluster_t *cl)
{
    uint64_t live = 0;
    for (int d = 0; d < cl->ndecode; d++) {
        kvs_ring_t *ring = kvs_manager_ring(edge_decode(cl, d)->m);
        if (ring != NULL)
            live += kvs_ring_live_bytes(ring);
    }
    return live;
}

void edge_expect_ring_empty(edge_cluster_t *cl)
{
    const uint64_t live = edge_ring_live_bytes(cl);
    if (live != 0)
        EDGE_FAIL("%llu ring bytes still live: a region leaked", (unsigned long long)live);
    for (int d = 0; d < cl->ndecode; d++) {
        kvs_ring_t *ring = kvs_manager_ring(edge_decode(cl, d)->m);
        if (ring != NULL)
            assert_int_equal(kvs_ring_live_count(ring), 0);
        /* What the rank reports (kvstage serve's leak check) agrees. */
        assert_int_equal(edge_stats(edge_decode(cl, d)).ring_live_bytes, 0);
    }
}

void edge_expect_ok(edge_cluster_t *cl, uint64_t room, int64_t base, int64_t total)
{
    edge_expect_all(cl, room, KVS_OK);
    const uint64_t bad = edge_corrupt(cl, room, base, total);
    if (bad != 0)
        EDGE_FAIL("room %llu: %llu corrupt bytes on the decode side", (unsigned long long)room,
                  (unsigned long long)bad);
}

void edge_transfer_ok(edge_cluster_t *cl, const edge_room_t *rooms, int n)
{
    for (int i = 0; i < n; i++)
        edge_open(cl, rooms[i].room, rooms[i].base, rooms[i].total);
    for (int i = 0; i < n; i++)
        edge_computed(cl, rooms[i].room, rooms[i].total, true);
    edge_run(cl);
    for (int i = 0; i < n; i++)
        edge_expect_ok(cl, rooms[i].room, rooms[i].base, rooms[i].total);
    edge_expect_ring_empty(cl);
}

/* ---- rooms of other prefill instances (spec §12) ------------------------------ */

void edge_open_group(edge_cluster_t *cl, int inst, int g, uint64_t room, int64_t base,
                            int64_t total)
{
    for (int d = 0; d < cl->ndecode; d++) {
        edge_node_t *n = edge_decode(cl, d);
        int64_t pages[EDGE_ROOM_SLOT_PAGES];
        const int64_t np = edge_pages(total - base, n->page_size);
        for (int64_t i = 0; i < np; i++)
            pages[i] = edge_page(room, i, true);
        int rc = kvs_decode_room_open_peer(n->dec, room, (kvs_peer_t){(uint64_t)inst, g}, base,
                                           total, pages, np);
        if (rc != KVS_OK)
            EDGE_FAIL("%s: room_open %llu: %s", n->name, (unsigned long long)room,
                      kvs_manager_last_error(n->m)->msg);
        edge_wake(n);
    }
    for (int64_t t = 0; t < edge_inst_tp(cl, inst); t++) {
        edge_node_t *n = edge_group_node(cl, inst, g, t);
        int64_t pages[EDGE_ROOM_SLOT_PAGES];
        const int64_t np = edge_pages(total, n->page_size);
        for (int64_t k = 0; k < np; k++)
            pages[k] = edge_page(room, k, false);
        edge_fill(n, room, total);
        int rc = kvs_prefill_room_open(n->pre, room, total, pages, np);
        if (rc != KVS_OK)
            EDGE_FAIL("%s: room_open %llu: %s", n->name, (unsigned long long)room,
                      kvs_manager_last_error(n->m)->msg);
        edge_wake(n);
    }
}

void edge_open_inst(edge_cluster_t *cl, int inst, uint64_t room, int64_t base,
                           int64_t total)
{
    edge_open_group(cl, inst, 0, room, base, total);
}

void edge_computed_group(edge_cluster_t *cl, int inst, int g, uint64_t room, int64_t end)
{
    for (int64_t t = 0; t < edge_inst_tp(cl, inst); t++) {
        edge_node_t *n = edge_group_node(cl, inst, g, t);
        int rc = kvs_prefill_room_computed(n->pre, room, end, true);
        if (rc != KVS_OK)
            EDGE_FAIL("%s: room_computed %llu: %s", n->name, (unsigned long long)room,
                      kvs_manager_last_error(n->m)->msg);
        edge_wake(n);
    }
}

void edge_computed_inst(edge_cluster_t *cl, int inst, uint64_t room, int64_t end)
{
    edge_computed_group(cl, inst, 0, room, end);
}

void edge_expect_group(edge_cluster_t *cl, int inst, int g, uint64_t room, int status)
{
    for (int i = 0; i < edge_nnodes(cl); i++) {
        edge_node_t *n = &cl->nodes[i];
        if (n->role == KVS_ROLE_DECODE || (n->inst == inst && n->dp == g))
            edge_expect(n, room, status);
        else if (edge_result(n, room) != NULL)
            EDGE_FAIL("%s of instance %d reported room %llu of instance %d", n->name, n->inst,
                      (unsigned long long)room, inst);
    }
}

void edge_expect_inst(edge_cluster_t *cl, int inst, uint64_t room, int status)
{
    edge_expect_group(cl, inst, 0, room, status);
}

void edge_expect_inst_ok(edge_cluster_t *cl, int inst, uint64_t room, int64_t base,
                                int64_t total)
{
    edge_expect_inst(cl, inst, room, KVS_OK);
    const uint64_t bad = edge_corrupt(cl, room, base, total);
    if (bad != 0)
        EDGE_FAIL("room %llu of instance %d: %llu corrupt bytes", (unsigned long long)room,
                  inst, (unsigned long long)bad);
}

void edge_cp_transfer(edge_cluster_t *cl, int inst, uint64_t room, int64_t base,
                      int64_t total, const void *aux, uint32_t aux_bytes)
{
    edge_open_group(cl, inst, 0, room, base, total); /* fills whole requests: redone below */
    for (int64_t c = 0; c < edge_inst_cp(cl, inst); c++)
        for (int64_t t = 0; t < edge_inst_tp(cl, inst); t++) {
            edge_node_t *n = edge_group_node(cl, inst, (int)c, t);
            if (c > 0) { /* edge_open_group opened group 0 only */
                int64_t pages[EDGE_ROOM_SLOT_PAGES];
                const int64_t np = edge_pages(total, n->page_size);
                for (int64_t k = 0; k < np; k++)
                    pages[k] = edge_page(room, k, false);
                assert_int_equal(kvs_prefill_room_open(n->pre, room, total, pages, np), KVS_OK);
            }
            memset(n->pool_host, 0, n->pool_bytes);
            int64_t cs, ce;
            assert_int_equal(kvs_layout_cp_range(kvs_manager_layout(n->m), total, c, &cs, &ce),
                             KVS_OK);
            edge_fill_range(n, room, cs, ce);
            if (aux_bytes > 0 && kvs_prefill_room_set_aux(n->pre, room, aux, aux_bytes) != KVS_OK)
                EDGE_FAIL("%s: set_aux %llu: %s", n->name, (unsigned long long)room,
                          kvs_manager_last_error(n->m)->msg);
            assert_int_equal(kvs_prefill_room_computed(n->pre, room, total, true), KVS_OK);
            edge_wake(n);
        }
    edge_run(cl);
}

void edge_cp_expect_ok(edge_cluster_t *cl, int inst, uint64_t room, int64_t base,
                       int64_t total, const void *aux, uint32_t aux_bytes, const char *what)
{
    for (int d = 0; d < cl->ndecode; d++) {
        edge_node_t *n = edge_decode(cl, d);
        const kvs_room_result_t *r = edge_expect(n, room, KVS_OK);
        const uint8_t *got = n->res_aux[r - n->res]; /* the copy edge_on_result kept */
        if (r->aux_bytes != aux_bytes || (aux_bytes > 0 && memcmp(got, aux, aux_bytes) != 0))
            EDGE_FAIL("%s: %s got %u aux bytes, not the %u every prefill rank gave", what,
                      n->name, r->aux_bytes, aux_bytes);
        const kvs_layout_t *lay = kvs_manager_layout(n->m);
        const uint64_t want = (uint64_t)((total - base) * n->heads * cl->o.head_dim *
                                         n->elem_bytes * n->layers * lay->planes);
        if (r->bytes != want)
            EDGE_FAIL("%s: %s counted %llu bytes received, not %llu", what, n->name,
                      (unsigned long long)r->bytes, (unsigned long long)want);
    }
    for (int64_t c = 0; c < edge_inst_cp(cl, inst); c++)
        for (int64_t t = 0; t < edge_inst_tp(cl, inst); t++)
            edge_expect(edge_group_node(cl, inst, (int)c, t), room, KVS_OK);
    const uint64_t bad = edge_corrupt(cl, room, base, total);
    if (bad != 0)
        EDGE_FAIL("%s, tokens [%lld, %lld): %llu corrupt bytes on the decode side", what,
                  (long long)base, (long long)total, (unsigned long long)bad);
}

edge_opts_t edge_two_instances(void)
{
    edge_opts_t o = edge_defaults();
    o.instances = 2;
    o.inst_tp[1] = 4;
    return o;
}

kvs_handler_stats_t edge_stats(const edge_node_t *n)
{
    kvs_handler_stats_t st;
    memset(&st, 0, sizeof st);
    if (n->dec != NULL)
        kvs_decode_stats(n->dec, &st);
    else
        kvs_prefill_stats(n->pre, &st);
    return st;
}

int64_t edge_region_bytes(edge_cluster_t *cl, int64_t tokens)
{
    int64_t bytes = 0;
    assert_int_equal(kvs_layout_region_bytes(kvs_manager_layout(edge_decode(cl, 0)->m), 0,
                                             0, tokens, &bytes),
                     KVS_OK);
    return bytes;
}

/* ---- hand-made control messages --------------------------------------------- */

void edge_send_raw(kvs_fabric_t *fab, kvs_conn_t *conn, const void *bytes, uint32_t len)
{
    assert_int_equal(fab->ops.send(fab, conn, bytes, len, 0), KVS_OK);
}

/* The intruder's link state of conn, made on first use. */
static edge_xseq_t *edge_xseq_of(edge_cluster_t *cl, kvs_conn_t *conn)
{
    int k = 0;
    while (k < cl->nxseq && cl->xseq[k].conn != conn)
        k++;
    assert_true(k < EDGE_MAX_XCONNS);
    if (k == cl->nxseq)
        cl->xseq[cl->nxseq++] = (edge_xseq_t){.conn = conn, .next = 1, .expected = 1};
    return &cl->xseq[k];
}

void edge_send(edge_cluster_t *cl, kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_msg_t *msg)
{
    for (int i = 0; i < edge_nnodes(cl); i++) {
        edge_node_t *n = &cl->nodes[i];
        if (sim_nic_fabric(n->nic) != fab || (n->dec == NULL && n->pre == NULL))
            continue;
        kvs__links_t *ls = n->dec != NULL ? kvs__decode_links(n->dec) : kvs__prefill_links(n->pre);
        /* the link stamps its owner's session; the test says which goes out */
        const uint64_t own = ls->session;
        ls->session = msg->session;
        const int rc = kvs__link_send(ls, conn, msg);
        ls->session = own;
        assert_int_equal(rc, KVS_OK);
        return;
    }
    edge_xseq_t *x = edge_xseq_of(cl, conn);
    kvs_msg_t m = *msg;
    m.seq = x->next++;
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t len = 0;
    assert_int_equal(kvs__wire_encode(&m, buf, sizeof buf, &len), KVS_OK);
    edge_send_raw(fab, conn, buf, len);
}

kvs_conn_t *edge_conn(kvs_fabric_t *fab, const char *peer)
{
    kvs_conn_t *c = NULL;
    assert_int_equal(fab->ops.connect(fab, peer, &c), KVS_OK);
    assert_non_null(c);
    return c;
}

static void edge_intruder_poll(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    edge_intruder_t *x = ctx;
    edge_cluster_t *cl = x->cl;
    (void)eng;
    (void)arg;
    x->wake_pending = false;
    static kvs_completion_t cq[16];
    for (;;) {
        int n = x->fab->ops.poll(x->fab, cq, 16);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            if (cq[i].kind == KVS_COMPLETION_WRITE && cq[i].wr_id < (uint64_t)x->nwrites)
                x->write_status[cq[i].wr_id] = cq[i].status;
            if (cq[i].kind != KVS_COMPLETION_RECV)
                continue;
            kvs_msg_t m;
            assert_int_equal(kvs__wire_decode(cq[i].msg, cq[i].len_bytes, &m), KVS_OK);
            if (m.type == KVS_MSG_ACK)
                continue;
            edge_xseq_t *link = edge_xseq_of(cl, cq[i].conn);
            const bool fresh = m.seq == link->expected;
            if (fresh)
                link->expected++;
            kvs_msg_t ack = {.type = KVS_MSG_ACK};
            ack.u.ack_link.cum = link->expected - 1;
            uint8_t buf[64];
            uint32_t len = 0;
            assert_int_equal(kvs__wire_encode(&ack, buf, sizeof buf, &len), KVS_OK);
            edge_send_raw(x->fab, cq[i].conn, buf, len);
            if (!fresh)
                continue;
            assert_true(x->ninbox < EDGE_INBOX);
            x->inbox[x->ninbox++] = m;
        }
        if (n < 16)
            return;
    }
}

static void edge_intruder_wake(void *ctx)
{
    edge_intruder_t *x = ctx;
    if (x->wake_pending)
        return;
    x->wake_pending = true;
    if (sim_engine_after(x->cl->eng, 0, edge_intruder_poll, x, 0, NULL) != KVS_OK)
        EDGE_FAIL("intruder: scheduling its poll failed");
}

void edge_intruder_create(edge_cluster_t *cl, edge_intruder_t *x)
{
    sim_gpu_config_t gc = {.hbm_bytes = 1u << 20};
    memset(x, 0, sizeof *x);
    x->cl = cl;
    assert_int_equal(sim_gpu_create(cl->eng, &gc, 99, &x->gpu), KVS_OK);
    assert_int_equal(sim_nic_create(cl->net, "intruder", x->gpu, &x->nic), KVS_OK);
    x->fab = sim_nic_fabric(x->nic);
    sim_nic_set_wake(x->nic, edge_intruder_wake, x);
}

void edge_intruder_destroy(edge_intruder_t *x)
{
    if (x->mr != NULL)
        assert_int_equal(x->fab->ops.mr_deregister(x->fab, x->mr), KVS_OK);
    sim_nic_destroy(x->nic);
    sim_gpu_destroy(x->gpu);
}

int edge_intruder_write(edge_intruder_t *x, const char *peer, uint64_t remote_addr,
                        uint64_t rkey, uint64_t len)
{
    if (x->mr == NULL) {
        kvs_device_t *dev = sim_gpu_device(x->gpu);
        uint64_t key = 0;
        assert_int_equal(dev->ops.mem_alloc(dev, EDGE_INTRUDER_WRITE_MAX, &x->buf), KVS_OK);
        memset(sim_gpu_host(x->gpu, x->buf, EDGE_INTRUDER_WRITE_MAX), 0xEE,
               EDGE_INTRUDER_WRITE_MAX);
        assert_int_equal(x->fab->ops.mr_register(x->fab, dev, x->buf, EDGE_INTRUDER_WRITE_MAX,
                                                 &x->mr, &key),
                         KVS_OK);
    }
    assert_true(len <= EDGE_INTRUDER_WRITE_MAX && x->nwrites < EDGE_INBOX);
    const int i = x->nwrites++;
    x->write_status[i] = 1;
    const kvs_write_desc_t d = {.local_addr = x->buf, .local_mr = x->mr, .len_bytes = len,
                                .remote_addr = remote_addr, .rkey = rkey, .wr_id = (uint64_t)i};
    assert_int_equal(x->fab->ops.write(x->fab, edge_conn(x->fab, peer), &d), KVS_OK);
    return i;
}

int edge_intruder_recv(edge_cluster_t *cl, edge_intruder_t *x, kvs_msg_t *out, int max)
{
    (void)cl;
    assert_true(x->ninbox <= max);
    const int got = x->ninbox;
    memcpy(out, x->inbox, (size_t)got * sizeof *out);
    x->ninbox = 0;
    return got;
}

kvs_msg_t edge_register_msg(edge_cluster_t *cl)
{
    edge_node_t *d = edge_decode(cl, 0);
    kvs_msg_t msg = {.type = KVS_MSG_REGISTER};
    kvs_msg_register_t *g = &msg.u.reg;
    uint64_t addr = 0, len = 0, rkey = 0;
    assert_int_equal(kvs_manager_staging_buffer(d->m, 0, &addr, &len, &rkey), KVS_OK);
    msg.session = 0xbad5e55u;
    g->tp_rank = 0;
    g->tp_size = cl->o.decode_tp;
    g->pp_rank = 0;
    g->pp_size = 1;
    kvs__fingerprint(kvs_manager_layout(d->m), kvs_manager_path(d->m), &edge_fp_cfg, &g->fp);
    g->ring_addr = addr;
    g->ring_bytes = len;
    g->ring_rkey = rkey;
    g->local_heads = d->heads;
    g->num_pages = EDGE_POOL_PAGES;
    return msg;
}

/* ---- watching for writes after a room ended ---------------------------------- */

void edge_snap_on_result(edge_cluster_t *cl, edge_node_t *n, const kvs_room_result_t *r)
{
    edge_snap_t *s = cl->on_result_ctx;
    if (n != s->node || r->room != s->room || s->taken)
        return;
    memcpy(s->copy, s->mem, s->len);
    s->taken = true;
}

size_t edge_snap_changed(const edge_snap_t *s)
{
    assert_true(s->taken);
    size_t changed = 0;
    for (size_t i = 0; i < s->len; i++)
        changed += s->copy[i] != s->mem[i];
    return changed;
}

void edge_expect_decode_last(edge_cluster_t *cl, uint64_t room)
{
    const kvs_room_result_t *d = edge_result(edge_decode(cl, 0), room);
    assert_non_null(d);
    for (int i = 0; i < cl->nprefill; i++) {
        const kvs_room_result_t *p = edge_result(edge_prefill(cl, i), room);
        if (p != NULL && p->done_ns > d->done_ns)
            EDGE_FAIL("room %llu: the decode ended it at %llu ns, before %s finished its "
                      "writes at %llu ns", (unsigned long long)room,
                      (unsigned long long)d->done_ns, edge_prefill(cl, i)->name,
                      (unsigned long long)p->done_ns);
    }
}
