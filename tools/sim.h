/*
 * sim.h - the `kvstage sim` subcommand: runs one deterministic simulated
 * disaggregated-serving scenario through the library's public API
 * (<kvstage/sim.h>: kvs_sim_run, whose checks and verdict are the only
 * ones), one instance per side or a cluster of several (--prefill-tp
 * 8,8,4 --decode-tp 2,2), from the command line and reports what moved,
 * how fast, and whether every invariant held, with the seed and the
 * command that replays the run. `kvstage sim --campaign N` hands over to
 * campaign.h.
 *
 * The flag parser and the replay command are shared with the campaign, so
 * a campaign run is exactly the `kvstage sim` command it prints.
 */
#ifndef KVSTAGE_TOOLS_SIM_H
#define KVSTAGE_TOOLS_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <kvstage/sim.h>

#include "shape.h"

/* What a `kvstage sim` command line asks for. Not to be copied: cfg.faults
 * points into faults[]. */
typedef struct cli_sim_input {
    cli_shape_t shape;         /* with instance 0 of each side */
    kvs_layout_t lay;          /* the shape, validated: the pair of instance 0
                                  of each side */
    kvs_sim_config_t cfg;      /* the run for kvs_sim_run: zero fields take
                                  the library's defaults; every instance
                                  listed (--prefill-tp 8,8,4 ...) and every
                                  pair checked; trace_path and the faults
                                  point into the parsed argv */
    const char *faults[KVS_SIM_MAX_FAULTS]; /* cfg.faults, each checked */
    int64_t nic_gbps;
    bool ring_flag_bytes;      /* the ring came from --ring-bytes */
    bool json;
    bool help;                 /* --help or -h: nothing else was read */
} cli_sim_input_t;

/* Runs `kvstage sim`; argv[0] is "sim". Returns the process exit status:
 * 0 when every request finished ok with no corrupt byte and no ring byte
 * leaked; 1 when an invariant broke (stderr names it and the replay
 * command); 2 for bad input or a scenario that cannot be set up (one line on
 * stderr). */
int cli_sim_main(int argc, char **argv);

/* Parses the flags argv[1..argc) of `kvstage sim` (argv[0] is "sim"; no
 * --campaign) into *in. Returns 0, or CLI_EXIT_USAGE after one stderr line
 * naming the flag to change. */
int cli_sim_parse(int argc, char **argv, cli_sim_input_t *in);

/* The command that replays a run of argv: "kvstage sim" and the flags as
 * given, shell-quoted where needed, any --seed replaced by one `--seed
 * seed` at the end. Heap string owned by the caller; NULL when out of
 * memory. */
char *cli_sim_replay(int argc, char **argv, uint64_t seed);

/* Writes the usage of `kvstage sim` to out. */
void cli_sim_usage(FILE *out);

#endif
