/*
 * xorshift.h - the tests' tiny PRNG for randomized checks: xorshift64 on a
 * caller-held state, seeded with a fixed value per test and printed on
 * failure so a run replays. (The simulator has its own, sim/rng.c.)
 */
#ifndef KVS_TESTS_XORSHIFT_H
#define KVS_TESTS_XORSHIFT_H

#include <stdint.h>
#include <string.h>

static inline uint64_t xorshift64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* A draw from [lo, hi] (lo <= hi). */
static inline int64_t xorshift_range(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(xorshift64(s) % (uint64_t)(hi - lo + 1));
}

/* Fills len bytes at p from the stream, 8 at a time. */
static inline void xorshift_fill(uint8_t *p, uint64_t len, uint64_t *s)
{
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const uint64_t x = xorshift64(s);
        memcpy(p + i, &x, 8);
    }
    for (; i < len; i++)
        p[i] = (uint8_t)xorshift64(s);
}

#endif
