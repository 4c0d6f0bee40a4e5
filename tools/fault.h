/*
 * fault.h - parsing `kvstage sim --fault SPEC` into the simulator's fault
 * list (sim/scenario.h). The grammar and the parser are the simulator's
 * (sim/fault_spec.h), shared with the library's kvs_sim_run:
 *   drop:TYPE:P  dup:TYPE:P  delay:TYPE:P:MICROS  write-error:P
 *   link-down:RANK:AT_US:FOR_US  slow-scatter:RANK:FACTOR
 *   crash:prefill|decode:N:AT_US  restart:prefill|decode:N:AT_US  hbm-full:RANK
 */
#ifndef KVSTAGE_TOOLS_FAULT_H
#define KVSTAGE_TOOLS_FAULT_H

#include <kvstage/kvstage.h>

#include "scenario.h"

/* Parses spec for a cluster of layout lay into *out. On error prints one
 * line naming --fault and what to change, returns CLI_EXIT_USAGE; 0 on
 * success. */
int cli_fault_parse(const char *cmd, const char *spec, const kvs_layout_t *lay,
                    sim_fault_t *out);

#endif
