/*
 * api.c - the public simulator API of <kvstage/sim.h>: kvs_sim_run checks a
 * kvs_sim_config_t (version, size, every field against the bounds of
 * `kvstage sim`'s flags, the shape through the layout planner, the fault
 * specs through sim/fault_spec.h), copies it field by field into the
 * internal sim_scenario_config_t, runs sim_scenario_run and copies the
 * report back (its scalars by the one list of kvstage/sim_report_fields.h,
 * its arrays field by field). Field-by-field on both sides, so the
 * internal structs may grow (new faults, new knobs) without touching the
 * public ABI: what the public config does not name stays zero, which is
 * the scenario's default. kvs_sim_cluster_check and kvs_sim_fault_check
 * run the first steps of the same checks alone, so a caller that names
 * its own settings (`kvstage sim`'s flags) can tell which one to change.
 *
 * The only symbols exported from libkvstage_sim are the kvs_sim_* ones
 * (KVS_API); everything else in sim/ is compiled with hidden visibility.
 */
#include <kvstage/backend.h>
#include <kvstage/sim.h>

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "fault_spec.h"
#include "scenario.h"

_Static_assert(KVS_SIM_MAX_INSTANCES == SIM_MAX_INSTANCES,
               "the public report holds every instance of the scenario's");
_Static_assert(KVS_SIM_MAX_FAILURE_KINDS == SIM_MAX_FAILURE_KINDS &&
                   KVS_SIM_FAILURE_DETAIL_BYTES == SIM_FAILURE_DETAIL_BYTES,
               "the public report holds every failure kind of the scenario's");
_Static_assert(KVS_SIM_AUX_ERROR_BYTES == SIM_AUX_ERROR_BYTES,
               "the public report holds the scenario's aux error whole");
_Static_assert(KVS_SIM_MAX_FAULTS == SIM_MAX_FAULTS,
               "the public config names as many faults as a scenario holds");

/* The sizes of version 1 of the public structs: smaller ones are refused. */
#define SIM_API_CONFIG_V1_BYTES (offsetof(kvs_sim_config_t, trace_path) + sizeof(const char *))
#define SIM_API_REPORT_V1_BYTES (offsetof(kvs_sim_report_t, e2e_p99_us) + sizeof(double))

/* The bounds of every numeric field: far above any run that ends in
 * reasonable time, low enough that no product the simulator forms
 * overflows 64 bits. The one set: kvs_sim_config_bound exports it and
 * `kvstage sim` scales its flags' limits from it. */
#define SIM_API_MAX_HEADS 1024
#define SIM_API_MAX_HEAD_DIM 4096
#define SIM_API_MAX_LAYERS 4096
#define SIM_API_MAX_TP 1024
#define SIM_API_MAX_PP 1024
#define SIM_API_MAX_TOKENS (INT64_C(1) << 24)

static const kvs_sim_bound_t sim_api_bounds[] = {
    {"total_heads", 0, SIM_API_MAX_HEADS},
    {"heads_per_rank", 0, SIM_API_MAX_HEADS},
    {"heads_per_rank_tp", 0, SIM_API_MAX_TP},
    {"head_dim", 1, SIM_API_MAX_HEAD_DIM},
    {"layers", 1, SIM_API_MAX_LAYERS},
    {"page_size", 1, SIM_API_MAX_TOKENS},
    {"prefill_tp", 1, SIM_API_MAX_TP},   /* 0 with prefill_instances */
    {"decode_tp", 1, SIM_API_MAX_TP},    /* 0 with decode_instances */
    {"prefill_pp", 0, SIM_API_MAX_PP},
    {"decode_pp", 0, SIM_API_MAX_PP},
    {"prefill_cp", 0, SIM_API_MAX_TP},
    {"chunk_tokens", 0, SIM_API_MAX_TOKENS},
    {"prompt_min_tokens", 0, SIM_API_MAX_TOKENS},
    {"prompt_max_tokens", 0, SIM_API_MAX_TOKENS},
    {"prefix_max_tokens", 0, SIM_API_MAX_TOKENS},
    {"requests", 0, 1000000u},
    {"max_inflight", 0, 65536u},
    {"rate_milli_per_s", 0, UINT64_C(1000000) * 1000},       /* 1e6 requests/s */
    {"prefill_tokens_per_s", 0, UINT64_C(1) << 40},
    {"ring_bytes", 0, UINT64_C(1) << 50},
    {"transfer_workers", 0, 1024u},
    {"stall_timeout_ns", 0, UINT64_C(86400) * 1000000000u},  /* a day */
    {"max_events", 0, UINT64_C(1) << 62},
    {"net_link_bytes_per_s", 0, UINT64_C(100000) * 1000000000u / 8u}, /* 100 Tb/s */
    {"net_latency_ns", 0, UINT64_C(1) << 40},
    {"net_per_op_ns", 0, UINT64_C(1) << 40},
    {"net_sq_depth", 0, 65535u},                             /* as verbs' sq_depth */
    {"nfaults", 0, KVS_SIM_MAX_FAULTS},
    {"prefill_instances", 0, KVS_SIM_MAX_INSTANCES},
    {"decode_instances", 0, KVS_SIM_MAX_INSTANCES},
    {"max_aux_bytes", 0, KVS_AUX_BYTES_MAX},
    {"data_mode", 0, KVS_SIM_DATA_PROVENANCE},               /* kvs_sim_data_mode_t */
    {"kv_kind", 0, KVS_KV_MLA},                              /* kvs_kv_kind_t */
    {"prefill_instance_tp", 1, SIM_API_MAX_TP},
    {"prefill_instance_pp", 0, SIM_API_MAX_PP},
    {"decode_instance_tp", 1, SIM_API_MAX_TP},
    {"decode_instance_pp", 0, SIM_API_MAX_PP},
    {"decode_page_size", 0, SIM_API_MAX_TOKENS},             /* 0: page_size */
};

const kvs_sim_bound_t *kvs_sim_config_bound(const char *field)
{
    for (size_t i = 0; field != NULL && i < sizeof sim_api_bounds / sizeof sim_api_bounds[0];
         i++)
        if (strcmp(sim_api_bounds[i].field, field) == 0)
            return &sim_api_bounds[i];
    return NULL;
}

/* A refusal of the caller's config: no backend code behind it. */
#define SIM_API_FAIL(err, status, ...) KVS_ERROR_SET((err), (status), 0, __VA_ARGS__)

/* A signed field against its bound; min_override >= 0 lowers the minimum
 * (a TP size of 0 when the instances are listed). */
static int sim_api_range_i64(kvs_error_t *err, const char *field, int64_t v, int64_t min_override)
{
    const kvs_sim_bound_t *b = kvs_sim_config_bound(field);
    const int64_t min = min_override >= 0 ? min_override : b->min;
    if (v >= min && (uint64_t)v <= b->max)
        return KVS_OK;
    return SIM_API_FAIL(err, KVS_EINVAL, "%s is %lld: set it to %lld..%llu", field,
                        (long long)v, (long long)min, (unsigned long long)b->max);
}

/* An unsigned field against its bound (0 = default). */
static int sim_api_max_u64(kvs_error_t *err, const char *field, uint64_t v)
{
    const kvs_sim_bound_t *b = kvs_sim_config_bound(field);
    if (v <= b->max)
        return KVS_OK;
    return SIM_API_FAIL(err, KVS_EINVAL, "%s is %llu: set it to 0..%llu (0 = default)",
                        field, (unsigned long long)v, (unsigned long long)b->max);
}

/* A field that must be 0. */
static int sim_api_zero(kvs_error_t *err, const char *field, uint64_t v)
{
    if (v == 0)
        return KVS_OK;
    return SIM_API_FAIL(err, KVS_EINVAL, "%s is %llu: it is reserved, set it to 0", field,
                        (unsigned long long)v);
}

/* Copies the caller's config (of its own size) into *c, a config of this
 * library's size, zero-filled where the caller's is shorter. */
static int sim_api_read_config(const kvs_sim_config_t *cfg, kvs_sim_config_t *c,
                               kvs_error_t *err)
{
    if (cfg->version < 1 || cfg->version > KVS_SIM_CONFIG_VERSION)
        return SIM_API_FAIL(err, KVS_EVERSION,
                            "config version %u is unknown to this library (it runs 1..%d): "
                            "fill the config with kvs_sim_config_init of the kvstage/sim.h "
                            "it was built with", cfg->version, KVS_SIM_CONFIG_VERSION);
    if (cfg->size_bytes < SIM_API_CONFIG_V1_BYTES)
        return SIM_API_FAIL(err, KVS_EVERSION,
                            "config size_bytes %u is below version 1's %zu: set it to "
                            "sizeof(kvs_sim_config_t)", cfg->size_bytes,
                            (size_t)SIM_API_CONFIG_V1_BYTES);
    const unsigned char *raw = (const unsigned char *)cfg;
    for (size_t i = sizeof *c; i < cfg->size_bytes; i++)
        if (raw[i] != 0)
            return SIM_API_FAIL(err, KVS_EVERSION,
                                "config byte %zu is set, beyond the %zu bytes this library "
                                "knows: use a libkvstage_sim at least as new as the "
                                "kvstage/sim.h the caller was built with", i, sizeof *c);
    memset(c, 0, sizeof *c);
    memcpy(c, cfg, cfg->size_bytes < sizeof *c ? cfg->size_bytes : sizeof *c);
    return KVS_OK;
}

/* Every bound of kvs_sim_config_t, named by field. */
static int sim_api_check_bounds(const kvs_sim_config_t *c, kvs_error_t *err)
{
    int rc;
#define I64(f, min) if ((rc = sim_api_range_i64(err, #f, c->f, (min))) != KVS_OK) return rc
#define U64(f) if ((rc = sim_api_max_u64(err, #f, c->f)) != KVS_OK) return rc
    I64(total_heads, -1);
    I64(heads_per_rank, -1);
    I64(heads_per_rank_tp, -1);
    I64(head_dim, -1);
    I64(layers, -1);
    I64(page_size, -1);
    I64(decode_page_size, -1);
    I64(prefill_tp, c->prefill_instances > 0 ? 0 : -1);
    I64(decode_tp, c->decode_instances > 0 ? 0 : -1);
    I64(prefill_pp, -1);
    I64(decode_pp, -1);
    I64(prefill_cp, -1);
    I64(chunk_tokens, -1);
    I64(prompt_min_tokens, -1);
    I64(prompt_max_tokens, -1);
    I64(prefix_max_tokens, -1);
    U64(requests);
    U64(max_inflight);
    U64(rate_milli_per_s);
    U64(prefill_tokens_per_s);
    U64(ring_bytes);
    U64(transfer_workers);
    U64(stall_timeout_ns);
    U64(max_events);
    U64(net_link_bytes_per_s);
    U64(net_latency_ns);
    U64(net_per_op_ns);
    U64(nfaults);
    U64(net_sq_depth);
    U64(prefill_instances);
    U64(decode_instances);
    U64(max_aux_bytes);
    U64(data_mode);
    if (c->kv_kind < 0 || (rc = sim_api_max_u64(err, "kv_kind", (uint64_t)c->kv_kind)) != KVS_OK)
        return c->kv_kind < 0 ? SIM_API_FAIL(err, KVS_EINVAL, "kv_kind %d must be 0 (gqa) or "
                                             "1 (mla)", (int)c->kv_kind) : rc;
#undef I64
#undef U64
    if ((rc = sim_api_zero(err, "reserved4", c->reserved4)) != KVS_OK ||
        (rc = sim_api_zero(err, "reserved5", c->reserved5)) != KVS_OK ||
        (rc = sim_api_zero(err, "reserved0", c->reserved0)) != KVS_OK ||
        (rc = sim_api_zero(err, "reserved1", c->reserved1)) != KVS_OK ||
        (rc = sim_api_zero(err, "reserved3", c->reserved3)) != KVS_OK)
        return rc;
    /* Each listed instance's sizes, named by field and index. */
    for (uint32_t side = 0; side < 2; side++) {
        const uint32_t n = side == 0 ? c->prefill_instances : c->decode_instances;
        const int64_t *tp = side == 0 ? c->prefill_instance_tp : c->decode_instance_tp;
        const int64_t *pp = side == 0 ? c->prefill_instance_pp : c->decode_instance_pp;
        const char *name = side == 0 ? "prefill" : "decode";
        for (uint32_t i = 0; i < n; i++) {
            if (tp[i] < 1 || tp[i] > SIM_API_MAX_TP)
                return SIM_API_FAIL(err, KVS_EINVAL, "%s_instance_tp[%u] is %lld: set it to "
                                    "1..%d", name, i, (long long)tp[i], SIM_API_MAX_TP);
            if (pp[i] < 0 || pp[i] > SIM_API_MAX_PP)
                return SIM_API_FAIL(err, KVS_EINVAL, "%s_instance_pp[%u] is %lld: set it to "
                                    "0..%d (0 = 1)", name, i, (long long)pp[i], SIM_API_MAX_PP);
        }
    }
    if (c->router != KVS_SIM_ROUTER_ROUND_ROBIN && c->router != KVS_SIM_ROUTER_LEAST_LOADED)
        return SIM_API_FAIL(err, KVS_EINVAL,
                            "router %d is unknown: use KVS_SIM_ROUTER_ROUND_ROBIN (0) or "
                            "KVS_SIM_ROUTER_LEAST_LOADED (1)", (int)c->router);
    if (c->prompt_max_tokens != 0 && c->prompt_min_tokens > c->prompt_max_tokens)
        return SIM_API_FAIL(err, KVS_EINVAL,
                            "prompt_min_tokens %lld is above prompt_max_tokens %lld: give "
                            "min <= max", (long long)c->prompt_min_tokens,
                            (long long)c->prompt_max_tokens);
    if (c->path < KVS_PATH_AUTO || c->path > KVS_PATH_SLICE)
        return SIM_API_FAIL(err, KVS_EINVAL,
                            "path %d is unknown: use KVS_PATH_AUTO (0), STAGING (1), "
                            "DIRECT (2) or SLICE (3)", (int)c->path);

    if (c->nfaults > 0 && c->faults == NULL)
        return SIM_API_FAIL(err, KVS_EINVAL,
                            "nfaults is %u but faults is NULL: pass the fault strings",
                            c->nfaults);
    return KVS_OK;
}

/* The shape and the instances of c (bounds checked) into s, the shape
 * planned and the cluster resolved into *topo: what kvs_sim_cluster_check
 * checks. *bad_prefill and *bad_decode (may be NULL): the pair that cannot
 * pair, else -1. */
static int sim_api_cluster(const kvs_sim_config_t *c, sim_scenario_config_t *s,
                           sim_topology_t *topo, int *bad_prefill, int *bad_decode,
                           kvs_error_t *err)
{
    if (bad_prefill != NULL)
        *bad_prefill = -1;
    if (bad_decode != NULL)
        *bad_decode = -1;
    memset(s, 0, sizeof *s);
    s->shape.total_heads = c->total_heads;
    s->shape.heads_per_rank = c->heads_per_rank;
    s->shape.heads_per_rank_tp = c->heads_per_rank_tp;
    s->shape.head_dim = c->head_dim;
    s->shape.dtype = (kvs_dtype_t)c->dtype;
    s->shape.layers = c->layers;
    s->shape.page_size = c->page_size;
    s->shape.prefill_tp = c->prefill_tp;
    s->shape.decode_tp = c->decode_tp;
    s->shape.prefill_pp = c->prefill_pp;
    s->shape.decode_pp = c->decode_pp;
    s->shape.prefill_cp = c->prefill_cp;
    s->shape.chunk_tokens = c->chunk_tokens;
    s->shape.kind = (kvs_kv_kind_t)c->kv_kind;
    s->shape.decode_page_size = c->decode_page_size;
    s->shape.kv_scales = (kvs_kv_scales_t)c->kv_scales;
    s->shape.scale_block = (int64_t)c->scale_block;
    s->shape.full_attn_every = c->full_attn_every;
    s->shape.other_layers = (kvs_layer_kind_t)c->other_layers;
    s->shape.window_tokens = c->window_tokens;
    s->shape.state_heads = c->state_heads;
    s->shape.state_conv_bytes = c->state_conv_bytes;
    s->shape.state_ssm_bytes = c->state_ssm_bytes;
    s->shape.draft_layers = c->draft_layers;
    s->shape.draft_head_dim = c->draft_head_dim;
    /* The instances: with a list, 0 sizes of the shape are instance 0's. */
    s->topo.prefill_instances = c->prefill_instances;
    s->topo.decode_instances = c->decode_instances;
    for (uint32_t i = 0; i < c->prefill_instances; i++)
        s->topo.prefill[i] = (sim_instance_shape_t){c->prefill_instance_tp[i],
                                                    c->prefill_instance_pp[i]};
    for (uint32_t i = 0; i < c->decode_instances; i++)
        s->topo.decode[i] = (sim_instance_shape_t){c->decode_instance_tp[i],
                                                   c->decode_instance_pp[i]};
    if (c->prefill_instances > 0 && s->shape.prefill_tp == 0)
        s->shape.prefill_tp = s->topo.prefill[0].tp;
    if (c->prefill_instances > 0 && s->shape.prefill_pp == 0)
        s->shape.prefill_pp = s->topo.prefill[0].pp;
    if (c->decode_instances > 0 && s->shape.decode_tp == 0)
        s->shape.decode_tp = s->topo.decode[0].tp;
    if (c->decode_instances > 0 && s->shape.decode_pp == 0)
        s->shape.decode_pp = s->topo.decode[0].pp;

    kvs_layout_t lay;
    const int rc = kvs_layout_init(&lay, &s->shape, err);
    if (rc != KVS_OK)
        return rc;
    return sim_topology_resolve(&s->shape, &s->topo, topo, bad_prefill, bad_decode, err);
}

/* The public config, checked, as the scenario's. */
static int sim_api_scenario(const kvs_sim_config_t *c, sim_scenario_config_t *s,
                            sim_topology_t *resolved, uint64_t *ring_needed, kvs_error_t *err)
{
    sim_topology_t topo;
    int rc = sim_api_cluster(c, s, &topo, NULL, NULL, err);
    if (rc != KVS_OK)
        return rc;
    s->router = (sim_router_t)c->router;
    s->max_aux_bytes = c->max_aux_bytes;
    /* Hybrid layers move on the staging path only (auto picks it). */
    if (c->full_attn_every > 1 && (c->path == KVS_PATH_DIRECT || c->path == KVS_PATH_SLICE))
        return SIM_API_FAIL(err, KVS_EINVAL,
                            "path %s does not move hybrid layers (full_attn_every %lld: "
                            "window or state layers): use path staging or auto",
                            c->path == KVS_PATH_DIRECT ? "direct" : "slice",
                            (long long)c->full_attn_every);
    /* So does a draft model's KV (the draft part of each writer block). */
    if (c->draft_layers > 0 && (c->path == KVS_PATH_DIRECT || c->path == KVS_PATH_SLICE))
        return SIM_API_FAIL(err, KVS_EINVAL,
                            "path %s does not move a draft model's KV (draft_layers %lld): "
                            "use path staging or auto",
                            c->path == KVS_PATH_DIRECT ? "direct" : "slice",
                            (long long)c->draft_layers);
    /* Direct copies pages rank to rank: every pair needs equal TP sizes. */
    for (uint32_t p = 0; c->path == KVS_PATH_DIRECT && p < topo.prefill_instances; p++)
        for (uint32_t d = 0; d < topo.decode_instances; d++)
            if (topo.prefill[p].tp != topo.decode[d].tp)
                return SIM_API_FAIL(err, KVS_EINVAL,
                                    "path direct needs equal TP sizes (got prefill TP %lld "
                                    "and decode TP %lld%s): use path staging or slice, or "
                                    "equal TP sizes", (long long)topo.prefill[p].tp,
                                    (long long)topo.decode[d].tp,
                                    topo.prefill_instances + topo.decode_instances > 2
                                        ? " in a pair of instances" : "");
    for (uint32_t i = 0; i < c->nfaults; i++) {
        char why[KVS_ERROR_MSG_BYTES];
        if (c->faults[i] == NULL)
            return SIM_API_FAIL(err, KVS_EINVAL, "faults[%u] is NULL: pass a fault string "
                                "like \"drop:any:0.01\"", i);
        if (sim_fault_parse(c->faults[i], &topo, &s->faults[i], why, sizeof why) != KVS_OK)
            return SIM_API_FAIL(err, KVS_EINVAL, "faults[%u] %s", i, why);
    }
    s->nfaults = c->nfaults;

    s->requests = c->requests;
    s->prompt_min_tokens = c->prompt_min_tokens;
    s->prompt_max_tokens = c->prompt_max_tokens;
    s->rate_milli_per_s = c->rate_milli_per_s;
    s->prefix_max_tokens = c->prefix_max_tokens;
    s->ring_bytes = c->ring_bytes;
    s->path = (kvs_path_t)c->path;
    /* As `kvstage sim`: staging buffers exist on both sides unless the
     * path asked for does without them. */
    s->staging = s->path == KVS_PATH_AUTO || s->path == KVS_PATH_STAGING;
    s->prefill_tokens_per_s = c->prefill_tokens_per_s;
    s->max_inflight = c->max_inflight;
    s->transfer_workers = c->transfer_workers;
    s->seed = c->seed;
    s->gpu.data_mode = c->data_mode == KVS_SIM_DATA_PROVENANCE ? SIM_DATA_PROVENANCE
                                                                : SIM_DATA_BYTES;
    s->gpu.hbm_bytes = c->gpu_hbm_bytes;
    s->gpu.hbm_bytes_per_s = c->gpu_hbm_bytes_per_s;
    s->gpu.launch_ns = c->gpu_launch_ns;
    s->net.link_bytes_per_s = c->net_link_bytes_per_s;
    s->net.latency_ns = c->net_latency_ns;
    s->net.per_op_ns = c->net_per_op_ns;
    s->net.ctrl_latency_ns = c->net_ctrl_latency_ns;
    s->net.segment_bytes = c->net_segment_bytes;
    s->net.mtu_bytes = c->net_mtu_bytes;
    s->net.header_bytes = c->net_header_bytes;
    s->net.sq_depth = c->net_sq_depth;
    s->max_events = c->max_events;
    s->stall_timeout_ns = c->stall_timeout_ns;
    s->trace_path = c->trace_path;
    s->progress = c->progress;
    s->progress_ctx = c->progress_ctx;
    sim_scenario_defaults(s);
    /* A ring that cannot hold the workload's regions is refused here, as
     * the scenario would refuse it, so kvs_sim_config_check says it too. */
    char why[KVS_ERROR_MSG_BYTES];
    if ((rc = sim_check_ring(s, &topo, ring_needed, why, sizeof why)) != KVS_OK)
        return SIM_API_FAIL(err, rc, "%s", why);
    *resolved = topo;
    return KVS_OK;
}

/* The scenario's report as the public one, written up to the caller's
 * size_bytes (read before anything is written). */
static void sim_api_write_report(const sim_report_t *r, kvs_sim_report_t *out)
{
    const uint32_t size = out->size_bytes;
    kvs_sim_report_t p;
    memset(&p, 0, sizeof p);
    p.version = KVS_SIM_REPORT_VERSION;
    p.size_bytes = size;
    /* Every scalar result, by the one list (kvstage/sim_report_fields.h);
     * the arrays below by hand, their element types differ. */
#define SIM_API_HEAD(code, name, meaning)
#define SIM_API_FIELD(code, name, json, meaning) p.name = r->name;
#define SIM_API_ARRAY(elem, name, count, meaning)
    KVS_SIM_REPORT_FIELDS(SIM_API_HEAD, SIM_API_FIELD, SIM_API_ARRAY)
#undef SIM_API_HEAD
#undef SIM_API_FIELD
#undef SIM_API_ARRAY
    snprintf(p.init_error, sizeof p.init_error, "%s", r->init_error);
    snprintf(p.aux_error, sizeof p.aux_error, "%s", r->aux_error);
    for (uint32_t i = 0; i < r->instances && i < 2 * KVS_SIM_MAX_INSTANCES; i++) {
        const sim_instance_report_t *ir = &r->instance[i];
        p.instance[i] = (kvs_sim_instance_t){
            .role = (int32_t)ir->role, .id = ir->id, .tp = ir->tp, .pp = ir->pp,
            .requests_ok = ir->requests_ok, .requests_failed = ir->requests_failed,
            .bytes = ir->bytes, .ring_peak_bytes = ir->ring_peak_bytes};
        p.instance_metrics[i] = (kvs_sim_instance_metrics_t){
            .ttft_p50_us = ir->e2e_p50_us, .ttft_p90_us = ir->e2e_p90_us,
            .ttft_p99_us = ir->e2e_p99_us, .transfer_p50_us = ir->transfer_p50_us,
            .transfer_p99_us = ir->transfer_p99_us, .ring_p99_bytes = ir->ring_p99_bytes,
            .watermark_waits = ir->watermark_waits, .nic_util_mean = ir->nic_util_mean,
            .nic_util_max = ir->nic_util_max};
    }
    for (uint32_t i = 0; i < r->failures && i < KVS_SIM_MAX_FAILURE_KINDS; i++) {
        p.failure[i].status = r->failure[i].status;
        p.failure[i].count = r->failure[i].count;
        snprintf(p.failure[i].first_detail, sizeof p.failure[i].first_detail, "%s",
                 r->failure[i].first_detail);
    }
    if (size > sizeof p)
        memset((unsigned char *)out + sizeof p, 0, size - sizeof p);
    memcpy(out, &p, size < sizeof p ? size : sizeof p);
}

/* Reads, bounds and converts cfg: what kvs_sim_config_check and
 * kvs_sim_run share. */
static int sim_api_prepare(const kvs_sim_config_t *cfg, kvs_sim_config_t *c,
                           sim_scenario_config_t *s, sim_topology_t *topo,
                           uint64_t *ring_needed, kvs_error_t *err)
{
    *ring_needed = 0;
    int rc = sim_api_read_config(cfg, c, err);
    if (rc == KVS_OK)
        rc = sim_api_check_bounds(c, err);
    if (rc == KVS_OK)
        rc = sim_api_scenario(c, s, topo, ring_needed, err);
    return rc;
}

int kvs_sim_cluster_check(const kvs_sim_config_t *cfg, int32_t *bad_prefill,
                          int32_t *bad_decode, kvs_error_t *err)
{
    int bad_p = -1, bad_d = -1;
    kvs_sim_config_t c;
    sim_scenario_config_t s;
    sim_topology_t topo;
    int rc = cfg != NULL ? sim_api_read_config(cfg, &c, err)
                         : SIM_API_FAIL(err, KVS_EINVAL, "cfg must not be NULL");
    if (rc == KVS_OK)
        rc = sim_api_check_bounds(&c, err);
    if (rc == KVS_OK)
        rc = sim_api_cluster(&c, &s, &topo, &bad_p, &bad_d, err);
    if (bad_prefill != NULL)
        *bad_prefill = bad_p;
    if (bad_decode != NULL)
        *bad_decode = bad_d;
    if (rc == KVS_OK && err != NULL)
        memset(err, 0, sizeof *err);
    return rc;
}

int kvs_sim_fault_check(const kvs_sim_config_t *cfg, const char *spec, char *why,
                        size_t why_bytes)
{
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    kvs_sim_config_t c;
    sim_scenario_config_t s;
    sim_topology_t topo;
    int rc = cfg != NULL ? sim_api_read_config(cfg, &c, &err)
                         : SIM_API_FAIL(&err, KVS_EINVAL, "cfg must not be NULL");
    if (rc == KVS_OK) {
        c.faults = NULL; /* the spec is checked instead of them */
        c.nfaults = 0;
        rc = sim_api_check_bounds(&c, &err);
    }
    if (rc == KVS_OK)
        rc = sim_api_cluster(&c, &s, &topo, NULL, NULL, &err);
    if (rc != KVS_OK) {
        if (why != NULL && why_bytes > 0)
            snprintf(why, why_bytes, "%s", err.msg);
        return rc;
    }
    if (why != NULL && why_bytes > 0)
        why[0] = '\0';
    sim_fault_t fault;
    return sim_fault_parse(spec, &topo, &fault, why, why_bytes);
}

int kvs_sim_config_check(const kvs_sim_config_t *cfg, kvs_sim_config_t *resolved,
                         kvs_error_t *err)
{
    if (cfg == NULL)
        return SIM_API_FAIL(err, KVS_EINVAL, "cfg must not be NULL");
    kvs_sim_config_t c;
    sim_scenario_config_t s;
    sim_topology_t topo;
    uint64_t ring_needed;
    int rc = sim_api_prepare(cfg, &c, &s, &topo, &ring_needed, err);
    if (rc != KVS_OK)
        return rc;
    if (resolved != NULL) {
        /* The scenario's defaults, back in the public fields. */
        c.requests = s.requests;
        c.prompt_min_tokens = s.prompt_min_tokens;
        c.prompt_max_tokens = s.prompt_max_tokens;
        c.ring_bytes = s.ring_bytes;
        c.prefill_tokens_per_s = s.prefill_tokens_per_s;
        c.max_inflight = s.max_inflight;
        c.transfer_workers = s.transfer_workers;
        c.max_events = s.max_events;
        if (c.stall_timeout_ns == 0)
            c.stall_timeout_ns = KVS_DEFAULT_STALL_TIMEOUT_NS;
        c.prefill_instances = topo.prefill_instances;
        c.decode_instances = topo.decode_instances;
        for (uint32_t i = 0; i < topo.prefill_instances; i++) {
            c.prefill_instance_tp[i] = topo.prefill[i].tp;
            c.prefill_instance_pp[i] = topo.prefill[i].pp;
        }
        for (uint32_t i = 0; i < topo.decode_instances; i++) {
            c.decode_instance_tp[i] = topo.decode[i].tp;
            c.decode_instance_pp[i] = topo.decode[i].pp;
        }
        c.prefill_tp = topo.prefill[0].tp;
        c.prefill_pp = topo.prefill[0].pp;
        c.decode_tp = topo.decode[0].tp;
        c.decode_pp = topo.decode[0].pp;
        *resolved = c;
    }
    if (err != NULL)
        memset(err, 0, sizeof *err);
    return KVS_OK;
}

int kvs_sim_run(const kvs_sim_config_t *cfg, kvs_sim_report_t *out, kvs_error_t *err)
{
    if (cfg == NULL || out == NULL)
        return SIM_API_FAIL(err, KVS_EINVAL, "cfg and out must not be NULL");
    if (out->size_bytes < SIM_API_REPORT_V1_BYTES)
        return SIM_API_FAIL(err, KVS_EVERSION,
                            "report size_bytes %u is below version 1's %zu: set it to "
                            "sizeof(kvs_sim_report_t) before the call", out->size_bytes,
                            (size_t)SIM_API_REPORT_V1_BYTES);
    kvs_sim_config_t c;
    sim_scenario_config_t s;
    sim_topology_t topo;
    sim_report_t r;
    memset(&r, 0, sizeof r);
    int rc = sim_api_prepare(cfg, &c, &s, &topo, &r.ring_bytes_needed, err);
    if (rc != KVS_OK) {
        if (rc == KVS_EOVERSIZED) /* the size the ring needs, for the caller */
            sim_api_write_report(&r, out);
        return rc;
    }
    char why[KVS_ERROR_MSG_BYTES] = "";
    rc = sim_scenario_run(&s, &r, why, sizeof why);
    sim_api_write_report(&r, out);
    if (rc != KVS_OK)
        return SIM_API_FAIL(err, rc, "%s", why[0] != '\0' ? why : kvs_strerror(rc));
    if (err != NULL)
        memset(err, 0, sizeof *err);
    return KVS_OK;
}
