/*
 * fault.h - checking `kvstage sim --fault SPEC` against the run's cluster.
 * The grammar and the parser are the library's (kvs_sim_fault_check of
 * <kvstage/sim.h>), the ones kvs_sim_run reads cfg.faults with:
 *   drop:TYPE:P  dup:TYPE:P  delay:TYPE:P:MICROS  write-error:P
 *   link-down:RANK:AT_US:FOR_US  slow-scatter:RANK:FACTOR
 *   crash:SIDE:N:AT_US  restart:SIDE:N:AT_US  hbm-full:RANK  stall:MS
 *   hostile-write:RANK:stale|outside:AT_US
 * with RANK p<tp>[.<pp>][@<instance>] or d<tp>[.<pp>][@<instance>] and SIDE
 * prefill[@<instance>] or decode[@<instance>].
 */
#ifndef KVSTAGE_TOOLS_FAULT_H
#define KVSTAGE_TOOLS_FAULT_H

#include <kvstage/sim.h>

/* Checks spec against the cluster of cfg (its own faults are not read). On
 * error prints one line naming --fault and what to change, returns
 * CLI_EXIT_USAGE; 0 on success. */
int cli_fault_check(const char *cmd, const char *spec, const kvs_sim_config_t *cfg);

#endif
