/*
 * fault.h - parsing `kvstage sim --fault SPEC` into the simulator's fault
 * list (sim/scenario.h). The grammar and the parser are the simulator's
 * (sim/fault_spec.h), shared with the library's kvs_sim_run:
 *   drop:TYPE:P  dup:TYPE:P  delay:TYPE:P:MICROS  write-error:P
 *   link-down:RANK:AT_US:FOR_US  slow-scatter:RANK:FACTOR
 *   crash:SIDE:N:AT_US  restart:SIDE:N:AT_US  hbm-full:RANK
 * with RANK p<tp>[.<pp>][@<instance>] or d<tp>[.<pp>][@<instance>] and SIDE
 * prefill[@<instance>] or decode[@<instance>].
 */
#ifndef KVSTAGE_TOOLS_FAULT_H
#define KVSTAGE_TOOLS_FAULT_H

#include <kvstage/kvstage.h>

#include "scenario.h"

/* Parses spec for the cluster topo (resolved) into *out. On error prints one
 * line naming --fault and what to change, returns CLI_EXIT_USAGE; 0 on
 * success. */
int cli_fault_parse(const char *cmd, const char *spec, const sim_topology_t *topo,
                    sim_fault_t *out);

#endif
