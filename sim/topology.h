/*
 * topology.h - the instances of a simulated cluster (spec §12): how many
 * prefill and decode instances, each with its own TP and PP, and the check
 * that every prefill instance can pair with every decode instance (any
 * request may be routed to any pair). Shared by the scenario, the public
 * kvs_sim_run, the fault parser and `kvstage sim`. Pure: no allocation.
 */
#ifndef KVS_SIM_TOPOLOGY_H
#define KVS_SIM_TOPOLOGY_H

#include <stdint.h>

#include <kvstage/kvstage.h>

/* Instances per side. */
#define SIM_MAX_INSTANCES 32

/* One model replica's parallelism. */
typedef struct sim_instance_shape {
    int64_t tp, pp;            /* pp 0 -> 1 */
} sim_instance_shape_t;

/* The instances of both sides, numbered 0.. within their side (their
 * kvs_peer_t instance ids). 0 instances on a side: one, of the shape's TP
 * and PP; with instances, instance 0 is the shape's (its TP and PP must
 * equal them). A decode instance of PP > 1 pairs only with prefill
 * instances of the same PP: a cluster where some pair cannot pair is
 * refused. */
typedef struct sim_topology {
    uint32_t prefill_instances, decode_instances;
    sim_instance_shape_t prefill[SIM_MAX_INSTANCES], decode[SIM_MAX_INSTANCES];
    int64_t prefill_cp;        /* every prefill instance's context-parallel
                                  ranks (the shape's prefill_cp; 0 -> 1):
                                  each holds one token range of a request
                                  with the instance's TP and PP
                                  (docs/kinds/context-parallel.md) */
} sim_topology_t;

/* The cluster of shape and topo in *out: every side with its instances
 * listed (at least one; PP 0 made 1), the prefill CP size the shape's
 * (topo's is not read), each pair's layout checked by the
 * planner. Returns KVS_OK, or a status with err (may be NULL) naming what
 * to change: KVS_EINVAL for a count or size out of bounds or an instance 0
 * that is not the shape's, the planner's status (e.g. KVS_EHEAD_SPLIT,
 * KVS_EPP_SPLIT) for a pair that cannot pair, which *bad_prefill and
 * *bad_decode (may be NULL; else -1) then name. */
int sim_topology_resolve(const kvs_layout_params_t *shape, const sim_topology_t *topo,
                         sim_topology_t *out, int *bad_prefill, int *bad_decode,
                         kvs_error_t *err);

/* The layout params of pair (prefill instance p, decode instance d) of a
 * resolved topology: the shape with the pair's TP and PP sizes. */
kvs_layout_params_t sim_topology_pair(const kvs_layout_params_t *shape,
                                      const sim_topology_t *topo, uint32_t p, uint32_t d);

/* Ranks of instance i of a side of a resolved topology: TP x PP, and
 * x CP on the prefill side. */
static inline int64_t sim_topology_ranks(const sim_topology_t *topo, kvs_role_t role,
                                         uint32_t i)
{
    if (role == KVS_ROLE_DECODE)
        return topo->decode[i].tp * topo->decode[i].pp;
    const int64_t cp = topo->prefill_cp > 1 ? topo->prefill_cp : 1;
    return topo->prefill[i].tp * topo->prefill[i].pp * cp;
}

/* Instances of a side of a resolved topology. */
static inline uint32_t sim_topology_count(const sim_topology_t *topo, kvs_role_t role)
{
    return role == KVS_ROLE_DECODE ? topo->decode_instances : topo->prefill_instances;
}

#endif
