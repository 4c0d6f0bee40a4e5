/*
 * plan.h - the `kvstage plan` subcommand: from a model shape and the
 * prefill/decode parallelism, prints which prefill ranks write which head
 * slices where in each decode rank's staging region (spec §3-§5), and how
 * many full chunk regions fit in the decode staging ring.
 */
#ifndef KVSTAGE_TOOLS_PLAN_H
#define KVSTAGE_TOOLS_PLAN_H

#include <stdio.h>

/* Runs `kvstage plan`; argv[0] is "plan". Returns the process exit status:
 * 0 on success, 2 for bad input (one line on stderr naming the flag), 1 for
 * an internal failure. */
int cli_plan_main(int argc, char **argv);

/* Writes the usage of `kvstage plan` to out. */
void cli_plan_usage(FILE *out);

#endif
