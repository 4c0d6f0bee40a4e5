/*
 * rng.h - the simulator's own PRNG: xoshiro256** seeded through splitmix64.
 * No libc rand, no global state. Each component draws from its own stream,
 * derived from the root seed and a fixed component id, so adding a component
 * never reshuffles the others. Decisions use integer probabilities.
 */
#ifndef KVS_SIM_RNG_H
#define KVS_SIM_RNG_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sim_rng {
    uint64_t s[4];
} sim_rng_t;

/* Stream `component` of root seed `seed` (any values; never all-zero state). */
void sim_rng_init(sim_rng_t *rng, uint64_t seed, uint64_t component);
uint64_t sim_rng_next(sim_rng_t *rng);
/* Uniform in [0, bound), unbiased (Lemire); bound 0 returns 0. */
uint64_t sim_rng_below(sim_rng_t *rng, uint64_t bound);
/* Uniform in [lo, hi] inclusive; lo <= hi. */
uint64_t sim_rng_range(sim_rng_t *rng, uint64_t lo, uint64_t hi);
/* True with probability num/den (den > 0; num >= den is always true). */
bool sim_rng_chance(sim_rng_t *rng, uint64_t num, uint64_t den);
/* Exponentially distributed with the given mean (for Poisson arrivals),
 * computed from 53 random bits; deterministic for a given state. */
uint64_t sim_rng_exp(sim_rng_t *rng, uint64_t mean);

#endif
