/*
 * topology.c - resolving and checking a cluster's instances (see
 * topology.h). Every pair is planned once here, through the library's
 * planner (kvs_layout_init), so a cluster the handlers could not serve is
 * refused before anything is built.
 */
#include "topology.h"

#include <kvstage/backend.h>

#include <string.h>

/* A refusal of the topology: no backend code behind it. */
#define SIM_TOPO_FAIL(err, status, ...) KVS_ERROR_SET((err), (status), 0, __VA_ARGS__)

/* Bounds of one instance's sizes, as the layout's. */
#define SIM_TOPO_MAX_TP 1024
#define SIM_TOPO_MAX_PP 1024

static int sim_topology_side(const char *side, int64_t shape_tp, int64_t shape_pp,
                             uint32_t n, const sim_instance_shape_t *in,
                             sim_instance_shape_t *out, uint32_t *count, kvs_error_t *err)
{
    if (n > SIM_MAX_INSTANCES)
        return SIM_TOPO_FAIL(err, KVS_EINVAL, "%u %s instances: give 1..%d", n, side,
                             SIM_MAX_INSTANCES);
    const int64_t pp0 = shape_pp > 0 ? shape_pp : 1;
    if (n == 0) {
        out[0] = (sim_instance_shape_t){shape_tp, pp0};
        *count = 1;
        return KVS_OK;
    }
    for (uint32_t i = 0; i < n; i++) {
        const int64_t pp = in[i].pp > 0 ? in[i].pp : 1;
        if (in[i].tp < 1 || in[i].tp > SIM_TOPO_MAX_TP || pp > SIM_TOPO_MAX_PP)
            return SIM_TOPO_FAIL(err, KVS_EINVAL, "%s instance %u has TP %lld and PP %lld: "
                                 "give TP 1..%d and PP 1..%d", side, i, (long long)in[i].tp,
                                 (long long)in[i].pp, SIM_TOPO_MAX_TP, SIM_TOPO_MAX_PP);
        out[i] = (sim_instance_shape_t){in[i].tp, pp};
    }
    if (out[0].tp != shape_tp || out[0].pp != pp0)
        return SIM_TOPO_FAIL(err, KVS_EINVAL, "%s instance 0 has TP %lld and PP %lld but the "
                             "shape says %s_tp %lld and %s_pp %lld: they are the same "
                             "instance, give them the same sizes", side,
                             (long long)out[0].tp, (long long)out[0].pp, side,
                             (long long)shape_tp, side, (long long)pp0);
    *count = n;
    return KVS_OK;
}

kvs_layout_params_t sim_topology_pair(const kvs_layout_params_t *shape,
                                      const sim_topology_t *topo, uint32_t p, uint32_t d)
{
    kvs_layout_params_t params = *shape;
    params.prefill_tp = topo->prefill[p].tp;
    params.prefill_pp = topo->prefill[p].pp;
    params.decode_tp = topo->decode[d].tp;
    params.decode_pp = topo->decode[d].pp;
    return params;
}

int sim_topology_resolve(const kvs_layout_params_t *shape, const sim_topology_t *topo,
                         sim_topology_t *out, int *bad_prefill, int *bad_decode,
                         kvs_error_t *err)
{
    static const sim_topology_t none;
    if (topo == NULL)
        topo = &none;
    if (bad_prefill != NULL)
        *bad_prefill = -1;
    if (bad_decode != NULL)
        *bad_decode = -1;
    sim_topology_t t;
    memset(&t, 0, sizeof t);
    int rc = sim_topology_side("prefill", shape->prefill_tp, shape->prefill_pp,
                               topo->prefill_instances, topo->prefill, t.prefill,
                               &t.prefill_instances, err);
    if (rc == KVS_OK)
        rc = sim_topology_side("decode", shape->decode_tp, shape->decode_pp,
                               topo->decode_instances, topo->decode, t.decode,
                               &t.decode_instances, err);
    if (rc != KVS_OK)
        return rc;
    t.prefill_cp = shape->prefill_cp > 1 ? shape->prefill_cp : 1;
    for (uint32_t p = 0; p < t.prefill_instances; p++)
        for (uint32_t d = 0; d < t.decode_instances; d++) {
            const kvs_layout_params_t params = sim_topology_pair(shape, &t, p, d);
            kvs_layout_t lay;
            kvs_error_t why;
            memset(&why, 0, sizeof why);
            rc = kvs_layout_init(&lay, &params, &why);
            if (rc == KVS_OK)
                continue;
            if (bad_prefill != NULL)
                *bad_prefill = (int)p;
            if (bad_decode != NULL)
                *bad_decode = (int)d;
            if (params.decode_pp != 1 && params.decode_pp != params.prefill_pp)
                return SIM_TOPO_FAIL(err, rc, "decode instance %u (PP %lld) cannot pair with "
                                     "prefill instance %u (PP %lld): a decode of PP > 1 "
                                     "pairs only with prefill instances of its PP; give it "
                                     "PP 1, or every prefill instance PP %lld", d,
                                     (long long)params.decode_pp, p,
                                     (long long)params.prefill_pp,
                                     (long long)params.decode_pp);
            return SIM_TOPO_FAIL(err, rc, "prefill instance %u (TP %lld, PP %lld) cannot pair "
                                 "with decode instance %u (TP %lld, PP %lld): %s", p,
                                 (long long)params.prefill_tp, (long long)params.prefill_pp, d,
                                 (long long)params.decode_tp, (long long)params.decode_pp,
                                 why.msg[0] != '\0' ? why.msg : kvs_strerror(rc));
        }
    *out = t;
    return KVS_OK;
}
