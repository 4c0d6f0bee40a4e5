/*
 * test_sim_rng.c - unit tests of the simulator's PRNG (sim/rng.c):
 * xoshiro256** against the reference test vector, stream derivation pinned
 * (replays depend on it), independence of components, and range and
 * distribution of below/range/chance/exp. Every seed is fixed, so each
 * statistical bound is checked against one known sequence and cannot flake;
 * the bounds are still wide (several sigma) so a correct generator passes for
 * any seed, and a biased one fails.
 */
#include "rng.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static void test_sim_rng_matches_reference_vector(void **state)
{
    (void)state;
    /* xoshiro256** from state {1, 2, 3, 4}, as in the reference xoshiro256starstar.c. */
    const uint64_t want[10] = {
        11520u, 0u, 1509978240u, 1215971899390074240u, 1216172134540287360u,
        607988272756665600u, 16172922978634559625u, 8476171486693032832u,
        10595114339597558777u, 2904607092377533576u,
    };
    sim_rng_t rng = {.s = {1, 2, 3, 4}};
    for (size_t i = 0; i < 10; i++)
        assert_int_equal(sim_rng_next(&rng), want[i]);
}

static void test_sim_rng_stream_derivation_is_pinned(void **state)
{
    (void)state;
    /* (seed 42, component 7): state = four splitmix64 outputs from
     * 42 ^ splitmix64(7), computed by an independent Python model. A change
     * here breaks every recorded seed's replay. */
    const uint64_t want[4] = {
        0x24bfb39aeb008c15u, 0xd858489e7fc02496u, 0x3deebe24036964f3u, 0x532b7127a28f00a1u,
    };
    sim_rng_t rng;
    sim_rng_init(&rng, 42, 7);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(sim_rng_next(&rng), want[i]);
}

static void test_sim_rng_same_seed_and_component_same_sequence(void **state)
{
    (void)state;
    const uint64_t seeds[] = {0, 1, 0xdeadbeef, UINT64_MAX};
    for (size_t k = 0; k < sizeof(seeds) / sizeof(seeds[0]); k++) {
        sim_rng_t a, b;
        sim_rng_init(&a, seeds[k], 3);
        sim_rng_init(&b, seeds[k], 3);
        assert_true((a.s[0] | a.s[1] | a.s[2] | a.s[3]) != 0);
        for (int i = 0; i < 1000; i++)
            assert_int_equal(sim_rng_next(&a), sim_rng_next(&b));
    }
}

/* Counts equal outputs at equal positions over n draws. */
static int same_positions(sim_rng_t a, sim_rng_t b, int n)
{
    int same = 0;
    for (int i = 0; i < n; i++)
        same += sim_rng_next(&a) == sim_rng_next(&b);
    return same;
}

static void test_sim_rng_components_give_different_sequences(void **state)
{
    (void)state;
    enum { COMPONENTS = 64 };
    sim_rng_t r[COMPONENTS];
    uint64_t first[COMPONENTS];
    for (uint64_t c = 0; c < COMPONENTS; c++) {
        sim_rng_init(&r[c], 0x5eed, c);
        sim_rng_t copy = r[c];
        first[c] = sim_rng_next(&copy);
    }
    for (size_t i = 0; i < COMPONENTS; i++) {
        for (size_t j = i + 1; j < COMPONENTS; j++) {
            assert_int_not_equal(first[i], first[j]);
            assert_int_equal(same_positions(r[i], r[j], 100), 0);
        }
    }
    /* Other seeds, same component: different too; nor is stream c of seed s
     * stream s of seed c. */
    sim_rng_t a, b;
    sim_rng_init(&a, 1, 5);
    sim_rng_init(&b, 2, 5);
    assert_int_equal(same_positions(a, b, 100), 0);
    sim_rng_init(&a, 1, 2);
    sim_rng_init(&b, 2, 1);
    assert_int_equal(same_positions(a, b, 100), 0);
}

static void test_sim_rng_below_stays_in_range(void **state)
{
    (void)state;
    const uint64_t bounds[] = {1, 2, 3, 7, 10, 1000, (UINT64_C(1) << 63) + 1, UINT64_MAX};
    sim_rng_t rng;
    sim_rng_init(&rng, 99, 1);
    for (size_t k = 0; k < sizeof(bounds) / sizeof(bounds[0]); k++) {
        for (int i = 0; i < 10000; i++)
            assert_true(sim_rng_below(&rng, bounds[k]) < bounds[k]);
    }
    for (int i = 0; i < 100; i++)
        assert_int_equal(sim_rng_below(&rng, 0), 0);
    /* 2^63 + 1 rejects about half of all draws; both halves still appear. */
    int high = 0;
    for (int i = 0; i < 1000; i++)
        high += sim_rng_below(&rng, (UINT64_C(1) << 63) + 1) >= (UINT64_C(1) << 62);
    assert_true(high > 400 && high < 600);
}

static void test_sim_rng_below_is_roughly_uniform(void **state)
{
    (void)state;
    enum { BUCKETS = 10, DRAWS = 100000, EXPECTED = DRAWS / BUCKETS };
    uint64_t count[BUCKETS] = {0};
    sim_rng_t rng;
    sim_rng_init(&rng, 0x1234, 9);
    for (int i = 0; i < DRAWS; i++)
        count[sim_rng_below(&rng, BUCKETS)]++;
    /* chi-square with 9 degrees of freedom, times EXPECTED to stay integer:
     * p(chi2 > 40) is about 1e-5; each bucket within 10000 +- 600 (6.3 sd). */
    uint64_t chi2_x_expected = 0;
    for (int b = 0; b < BUCKETS; b++) {
        int64_t d = (int64_t)count[b] - EXPECTED;
        chi2_x_expected += (uint64_t)(d * d);
        if (count[b] < EXPECTED - 600 || count[b] > EXPECTED + 600)
            print_error("seed 0x1234 comp 9: bucket %d has %llu draws\n", b,
                        (unsigned long long)count[b]);
        assert_true(count[b] >= EXPECTED - 600 && count[b] <= EXPECTED + 600);
    }
    assert_true(chi2_x_expected < 40u * EXPECTED);
}

static void test_sim_rng_range_ends_are_reachable(void **state)
{
    (void)state;
    sim_rng_t rng;
    sim_rng_init(&rng, 7, 7);
    bool seen[4] = {false};
    for (int i = 0; i < 1000; i++) {
        uint64_t v = sim_rng_range(&rng, 5, 8);
        assert_true(v >= 5 && v <= 8);
        seen[v - 5] = true;
    }
    for (int i = 0; i < 4; i++)
        assert_true(seen[i]);

    assert_int_equal(sim_rng_range(&rng, 9, 9), 9);
    assert_int_equal(sim_rng_range(&rng, UINT64_MAX, UINT64_MAX), UINT64_MAX);
    bool lo = false, hi = false;
    for (int i = 0; i < 1000; i++) {
        uint64_t v = sim_rng_range(&rng, UINT64_MAX - 1, UINT64_MAX);
        assert_true(v >= UINT64_MAX - 1);
        lo |= v == UINT64_MAX - 1;
        hi |= v == UINT64_MAX;
    }
    assert_true(lo && hi);
    /* The full range draws all 64 bits: both halves appear. */
    int top = 0;
    for (int i = 0; i < 1000; i++)
        top += sim_rng_range(&rng, 0, UINT64_MAX) >> 63;
    assert_true(top > 400 && top < 600);
}

static void test_sim_rng_chance_edges_and_rate(void **state)
{
    (void)state;
    sim_rng_t rng;
    sim_rng_init(&rng, 2024, 4);
    for (int i = 0; i < 10000; i++) {
        assert_false(sim_rng_chance(&rng, 0, 1 + (uint64_t)i));
        assert_true(sim_rng_chance(&rng, 1 + (uint64_t)i, 1 + (uint64_t)i));
        assert_true(sim_rng_chance(&rng, 5, 4));
    }
    /* 1/4 over 100000 draws: 25000 +- 1000 is 7 standard deviations. */
    int hits = 0;
    for (int i = 0; i < 100000; i++)
        hits += sim_rng_chance(&rng, 1, 4);
    if (hits < 24000 || hits > 26000)
        print_error("seed 2024 comp 4: chance(1,4) hit %d of 100000\n", hits);
    assert_true(hits >= 24000 && hits <= 26000);
}

static void test_sim_rng_exp_mean_is_close(void **state)
{
    (void)state;
    const uint64_t means[] = {100, 1000, 1000000};
    for (size_t k = 0; k < sizeof(means) / sizeof(means[0]); k++) {
        sim_rng_t rng;
        sim_rng_init(&rng, 31337, k);
        uint64_t sum = 0;
        for (int i = 0; i < 100000; i++)
            sum += sim_rng_exp(&rng, means[k]);
        /* Truncation to an integer lowers the mean by about 0.5. Within 3%:
         * the standard error is 0.32% of the mean. */
        const double mean = (double)sum / 100000.0 + 0.5;
        const double want = (double)means[k];
        if (mean < want * 0.97 || mean > want * 1.03)
            print_error("seed 31337 comp %zu: exp mean %.1f, want %.0f\n", k, mean, want);
        assert_true(mean >= want * 0.97 && mean <= want * 1.03);
    }
    sim_rng_t rng;
    sim_rng_init(&rng, 1, 1);
    assert_int_equal(sim_rng_exp(&rng, 0), 0);
    /* A huge mean saturates instead of overflowing. */
    for (int i = 0; i < 1000; i++)
        (void)sim_rng_exp(&rng, UINT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_rng_matches_reference_vector),
        cmocka_unit_test(test_sim_rng_stream_derivation_is_pinned),
        cmocka_unit_test(test_sim_rng_same_seed_and_component_same_sequence),
        cmocka_unit_test(test_sim_rng_components_give_different_sequences),
        cmocka_unit_test(test_sim_rng_below_stays_in_range),
        cmocka_unit_test(test_sim_rng_below_is_roughly_uniform),
        cmocka_unit_test(test_sim_rng_range_ends_are_reachable),
        cmocka_unit_test(test_sim_rng_chance_edges_and_rate),
        cmocka_unit_test(test_sim_rng_exp_mean_is_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
