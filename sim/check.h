/*
 * check.h - the simulator's verdict on a run, in one place: what a
 * configuration needs before it runs (a staging ring that holds the
 * largest region its requests can need) and which of a finished run's
 * counts are violations. The scenario, the public kvs_sim_run, Python's
 * simulate(), `kvstage sim` and the campaign all judge through these, so
 * they cannot disagree. Pure: no allocation, no output.
 */
#ifndef KVS_SIM_CHECK_H
#define KVS_SIM_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "scenario.h"

/* The largest staging region a request of cfg (defaults applied) can need
 * on one decode rank, over every pair of instances of the resolved topo
 * that stages (path STAGING, or AUTO with unequal TP sizes, staging on):
 * a full chunk, or the longest prompt when it is shorter. 0 when no pair
 * stages. Returns KVS_OK, or KVS_EOVERSIZED when cfg->ring_bytes is below
 * it, with err (err_bytes, may be NULL/0) saying how much ring is needed;
 * *needed_bytes (may be NULL) is written either way. */
int sim_check_ring(const sim_scenario_config_t *cfg, const sim_topology_t *topo,
                   uint64_t *needed_bytes, char *err, size_t err_bytes);

/* Fills r's verdict from its counts: failed_without_faults (requests that
 * failed in a run without faults and are not already collateral),
 * violations (hung + leaked + corrupt + unreported + collateral + failed
 * without faults + keys leaked + hostile bytes landed) and ok (no
 * violation). */
void sim_check_report(const sim_scenario_config_t *cfg, sim_report_t *r);

#endif
