/*
 * sim.h - the `kvstage sim` subcommand: runs one deterministic simulated
 * disaggregated-serving scenario (sim/scenario.h) from the command line and
 * reports what moved, how fast, and whether every invariant held, with the
 * seed and the command that replays the run.
 */
#ifndef KVSTAGE_TOOLS_SIM_H
#define KVSTAGE_TOOLS_SIM_H

#include <stdio.h>

/* Runs `kvstage sim`; argv[0] is "sim". Returns the process exit status:
 * 0 when every request finished ok with no corrupt byte and no ring byte
 * leaked; 1 when an invariant broke (stderr names it and the replay
 * command); 2 for bad input or a scenario that cannot be set up (one line on
 * stderr). */
int cli_sim_main(int argc, char **argv);

/* Writes the usage of `kvstage sim` to out. */
void cli_sim_usage(FILE *out);

#endif
