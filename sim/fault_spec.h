/*
 * fault_spec.h - the text form of one simulator fault (scenario.h's
 * sim_fault_t), shared by `kvstage sim --fault SPEC` and the public
 * kvs_sim_run (include/kvstage/sim.h):
 *   drop:TYPE:P  dup:TYPE:P  delay:TYPE:P:MICROS  write-error:P
 *   link-down:RANK:AT_US:FOR_US  slow-scatter:RANK:FACTOR
 *   crash:SIDE:N:AT_US  restart:SIDE:N:AT_US  hbm-full:RANK  stall:MS
 *   hostile-write:RANK:stale|outside:AT_US
 * TYPE: register, metadata, staging_req, staging_rsp, watermark,
 * chunk_ready, status, abort or any; P a probability in [0, 1] (up to 6
 * decimals); RANK p<tp>[.<pp>][@<i>] or d<tp>[.<pp>][@<i>]: TP rank tp of
 * stage pp (0 when absent) of prefill or decode instance i (0 when absent),
 * e.g. p3@1, d1.0; SIDE prefill[@<i>] or decode[@<i>] and N the rank's
 * index in that instance (pp * tp_size + tp); MS a stall timeout of 1 ms
 * or more that replaces the run's for every rank; hostile-write's RANK a
 * prefill rank, one of whose staged writes goes astray (scenario.h,
 * sim_hostile_t). Message, write and stall faults strike the whole
 * cluster. Strict: every field is checked against the
 * cluster and a bad one is named with the accepted form. Pure: no
 * allocation, no output.
 */
#ifndef KVS_SIM_FAULT_SPEC_H
#define KVS_SIM_FAULT_SPEC_H

#include <stddef.h>

#include <kvstage/kvstage.h>

#include "scenario.h"

/* Parses spec for the cluster topo (resolved: sim_topology_resolve) into
 * *out. KVS_OK, or KVS_EINVAL with one line in err (err_bytes, may be
 * NULL/0) that starts with the quoted spec and says what to change, e.g.
 * "'drop:x:0.1': unknown message type 'x': use register, ...". */
int sim_fault_parse(const char *spec, const sim_topology_t *topo, sim_fault_t *out,
                    char *err, size_t err_bytes);

#endif
