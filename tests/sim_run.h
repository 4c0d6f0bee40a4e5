/*
 * sim_run.h - running a simulated scenario from a cmocka test: one data
 * mode, a clean run in both, or a planted bug in both (tests/test_sim_data.c,
 * tests/test_sim_context_parallel.c, tests/test_sim_hybrid.c,
 * tests/test_sim_draft.c). A run that cannot happen fails the
 * test, naming the run, its mode and seed.
 */
#ifndef KVS_TESTS_SIM_RUN_H
#define KVS_TESTS_SIM_RUN_H

#include <stdint.h>

#include "scenario.h"

/* The small workload the kind tests share: 8 requests of 1..900 tokens at
 * 200/s, 4 in flight, the staging path, a ring of ring_bytes; shape and
 * seed as given, every other field 0. */
sim_scenario_config_t sim_run_small(kvs_layout_params_t shape, uint64_t ring_bytes,
                                    uint64_t seed);

/* Runs c in data mode `mode`; its report. */
sim_report_t sim_run_mode(sim_scenario_config_t c, sim_data_mode_t mode, const char *what);

/* Runs c in both data modes: the same report bit for bit, every request
 * ok, no violation, some bytes verified and none corrupt (else the test
 * fails naming what). The report. */
sim_report_t sim_run_clean_in_both(const sim_scenario_config_t *c, const char *what);

/* Runs c, whose hooks plant a bug and count each change in *hits, in both
 * data modes: the bug must have been planted and show as corrupt bytes
 * and violations in each. */
void sim_run_caught_in_both(sim_scenario_config_t c, uint64_t *hits, const char *what);

/* sim_run_clean_in_both, and the run took the staging path (a hybrid
 * layout or a draft: path auto must pick it). The report. */
sim_report_t sim_run_staged_in_both(const sim_scenario_config_t *c, const char *what);

/* sim_run_caught_in_both, then the same run without its copy hook is
 * clean in both modes (the bug was the plant's, not the run's). */
void sim_run_caught_then_clean(sim_scenario_config_t c, uint64_t *hits, const char *what);

#endif
