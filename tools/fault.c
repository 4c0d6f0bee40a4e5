/*
 * fault.c - the --fault parser of fault.h: the simulator's own fault-spec
 * parser (sim/fault_spec.h), with its message reported as one CLI line.
 */
#include "fault.h"

#include "args.h"
#include "fault_spec.h"

int cli_fault_parse(const char *cmd, const char *spec, const sim_topology_t *topo,
                    sim_fault_t *out)
{
    char err[512];
    if (sim_fault_parse(spec, topo, out, err, sizeof err) != KVS_OK)
        return cli_fail(cmd, "--fault %s", err);
    return 0;
}
