/*
 * xorshift.h - the tests' tiny PRNG for randomized checks: xorshift64 on a
 * caller-held state, seeded with a fixed value per test and printed on
 * failure so a run replays. (The simulator has its own, sim/rng.c.)
 */
#ifndef KVS_TESTS_XORSHIFT_H
#define KVS_TESTS_XORSHIFT_H

#include <stdint.h>

static inline uint64_t xorshift64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

#endif
