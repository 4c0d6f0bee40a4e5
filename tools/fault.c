/*
 * fault.c - the --fault check of fault.h: the library's fault-spec check
 * (kvs_sim_fault_check), its whole line reported as one CLI line.
 */
#include "fault.h"

#include "args.h"

int cli_fault_check(const char *cmd, const char *spec, const kvs_sim_config_t *cfg)
{
    char why[512]; /* the line lists every form: longer than a kvs_error_t */
    if (kvs_sim_fault_check(cfg, spec, why, sizeof why) != KVS_OK)
        return cli_fail(cmd, "--fault %s", why);
    return 0;
}
