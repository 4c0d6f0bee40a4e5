/*
 * fault_spec.h - the text form of one simulator fault (scenario.h's
 * sim_fault_t), shared by `kvstage sim --fault SPEC` and the public
 * kvs_sim_run (include/kvstage/sim.h):
 *   drop:TYPE:P  dup:TYPE:P  delay:TYPE:P:MICROS  write-error:P
 *   link-down:RANK:AT_US:FOR_US  slow-scatter:RANK:FACTOR
 *   crash:prefill|decode:N:AT_US  restart:prefill|decode:N:AT_US  hbm-full:RANK
 * TYPE: register, metadata, staging_req, staging_rsp, watermark,
 * chunk_ready, status, abort or any; P a probability in [0, 1] (up to 6
 * decimals); RANK p<tp>[.<pp>] or d<tp>[.<pp>] of the cluster's layout.
 * Strict: every field is checked and a bad one is named with the accepted
 * form. Pure: no allocation, no output.
 */
#ifndef KVS_SIM_FAULT_SPEC_H
#define KVS_SIM_FAULT_SPEC_H

#include <stddef.h>

#include <kvstage/kvstage.h>

#include "scenario.h"

/* Parses spec for a cluster of layout lay into *out. KVS_OK, or
 * KVS_EINVAL with one line in err (err_bytes, may be NULL/0) that starts
 * with the quoted spec and says what to change, e.g.
 * "'drop:x:0.1': unknown message type 'x': use register, ...". */
int sim_fault_parse(const char *spec, const kvs_layout_t *lay, sim_fault_t *out,
                    char *err, size_t err_bytes);

#endif
