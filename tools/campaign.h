/*
 * campaign.h - `kvstage sim --campaign N --seed S [--json]
 * [--campaign-log FILE]`: N random simulator scenarios (shapes, TP/PP,
 * clusters of 1-4 instances per side, rings, loads, paths, fault mixes),
 * each judged by its run invariants.
 *
 * Run i is drawn from (S, i) alone, as a `kvstage sim` command line, and
 * run by parsing that command line, so the replay command a campaign
 * prints IS the run: same report, same digest, run alone.
 *
 * A violation is any of: a broken run invariant (hung request, leaked ring
 * byte, corrupt byte, unreported failure, collateral failure outside runs
 * of the `stall` kind), a request that failed in a run
 * without faults, a generated scenario the CLI or the simulator refused
 * (a bug of the generator or of a validation, counted apart as a set-up
 * error), or a run the simulator stopped midway (a handler's progress
 * failed, a room was reported twice: counted as a run stopped).
 */
#ifndef KVSTAGE_TOOLS_CAMPAIGN_H
#define KVSTAGE_TOOLS_CAMPAIGN_H

/* Runs the campaign; argv[0] is "sim" and argv holds --campaign. Returns
 * the exit status: 0 without violations, 1 with any, 2 for bad flags (one
 * stderr line naming the flag). */
int cli_campaign_main(int argc, char **argv);

#endif
