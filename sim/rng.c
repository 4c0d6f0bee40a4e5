/*
 * rng.c - xoshiro256** (Blackman & Vigna) seeded by splitmix64 from
 * (seed, component). All state is in the caller's sim_rng_t.
 */
#include "rng.h"

#include <math.h>

static uint64_t sim_rng_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void sim_rng_init(sim_rng_t *rng, uint64_t seed, uint64_t component)
{
    /* Mix the component through splitmix first so nearby ids diverge. */
    uint64_t c = component;
    uint64_t x = seed ^ sim_rng_splitmix(&c);
    for (int i = 0; i < 4; i++)
        rng->s[i] = sim_rng_splitmix(&x);
    if ((rng->s[0] | rng->s[1] | rng->s[2] | rng->s[3]) == 0)
        rng->s[0] = 1; /* the one forbidden state */
}

static uint64_t sim_rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sim_rng_next(sim_rng_t *rng)
{
    uint64_t *s = rng->s;
    const uint64_t result = sim_rng_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = sim_rng_rotl(s[3], 45);
    return result;
}

uint64_t sim_rng_below(sim_rng_t *rng, uint64_t bound)
{
    if (bound == 0)
        return 0;
    /* Lemire's nearly divisionless method, 128-bit product. */
    unsigned __int128 m = (unsigned __int128)sim_rng_next(rng) * bound;
    uint64_t low = (uint64_t)m;
    if (low < bound) {
        const uint64_t threshold = -bound % bound;
        while (low < threshold) {
            m = (unsigned __int128)sim_rng_next(rng) * bound;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

uint64_t sim_rng_range(sim_rng_t *rng, uint64_t lo, uint64_t hi)
{
    if (hi <= lo)
        return lo;
    if (lo == 0 && hi == UINT64_MAX)
        return sim_rng_next(rng);
    return lo + sim_rng_below(rng, hi - lo + 1);
}

bool sim_rng_chance(sim_rng_t *rng, uint64_t num, uint64_t den)
{
    if (den == 0 || num >= den)
        return den != 0;
    return sim_rng_below(rng, den) < num;
}

uint64_t sim_rng_exp(sim_rng_t *rng, uint64_t mean)
{
    /* u in (0, 1]: 53 random bits, never 0 so log is finite. */
    const double u = (double)((sim_rng_next(rng) >> 11) + 1) * 0x1.0p-53;
    const double v = -log(u) * (double)mean;
    return v >= 18446744073709549568.0 ? UINT64_MAX : (uint64_t)v;
}
