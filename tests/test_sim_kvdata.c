/*
 * test_sim_kvdata.c - the simulator's deterministic payloads (sim/kvdata.h),
 * its aux payloads above all: their lengths cover none, a few bytes, half
 * the limit or more and the limit, never over it; a payload differs from
 * another request's and from every KV vector; and the verifier counts a
 * byte flipped, missing, extra, or a payload not delivered at all, so a
 * simulator run with aux payloads cannot pass without them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <kvstage/kvstage.h>

#include "kvdata.h"

static void test_sim_kvdata_aux_lengths_cover_every_class(void **state)
{
    (void)state;
    const uint32_t limits[] = {1, 5, 300, 9000, KVS_AUX_BYTES_MAX};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        const uint32_t max = limits[k];
        const uint32_t small = max < 256 ? max : 256;
        for (uint64_t req = 0; req < 64; req++) {
            const uint32_t n = sim_kvdata_aux_bytes(req, max);
            assert_true(n <= max);
            assert_int_equal(sim_kvdata_aux_bytes(req, max), n); /* a function */
            switch (req % 4) {
            case 0:
                assert_int_equal(n, 0);
                break;
            case 1:
                assert_true(n >= 1 && n <= small);
                break;
            case 2:
                assert_true(n >= max - max / 2 && n <= max);
                break;
            default:
                assert_int_equal(n, max);
            }
        }
    }
    for (uint64_t req = 0; req < 8; req++)
        assert_int_equal(sim_kvdata_aux_bytes(req, 0), 0); /* aux off */
}

static void test_sim_kvdata_aux_differs_from_others(void **state)
{
    (void)state;
    uint8_t a[256], b[256];
    sim_kvdata_aux_fill(a, sizeof a, 7);
    sim_kvdata_aux_fill(b, sizeof b, 8);
    assert_true(memcmp(a, b, sizeof a) != 0);
    /* No KV vector of the request: layer 0, head 0, token 0 of K. */
    const sim_kv_coord_t kv = {.request = 7};
    sim_kvdata_fill(b, sizeof b, &kv);
    assert_true(memcmp(a, b, sizeof a) != 0);
    /* A prefix of a longer payload is the shorter one. */
    uint8_t c[100];
    sim_kvdata_aux_fill(c, sizeof c, 7);
    assert_memory_equal(a, c, sizeof c);
}

static void test_sim_kvdata_aux_verify_counts_every_fault(void **state)
{
    (void)state;
    const uint32_t max = 9000;
    const uint64_t req = 3; /* exactly max bytes */
    const uint32_t want = sim_kvdata_aux_bytes(req, max);
    assert_int_equal(want, max);
    uint8_t *p = malloc(max + 2);
    assert_non_null(p);
    sim_kvdata_aux_fill(p, max + 2, req);
    uint64_t checked = 0;

    /* As sent. */
    assert_int_equal(sim_kvdata_aux_verify(req, max, p, want, &checked), 0);
    assert_int_equal(checked, want);
    /* One byte flipped, in the second AUX message's part. */
    p[5000] ^= 0x10;
    assert_int_equal(sim_kvdata_aux_verify(req, max, p, want, &checked), 1);
    p[5000] ^= 0x10;
    /* Three bytes short, two extra. */
    assert_int_equal(sim_kvdata_aux_verify(req, max, p, want - 3, &checked), 3);
    assert_int_equal(checked, want);
    assert_int_equal(sim_kvdata_aux_verify(req, max, p, want + 2, &checked), 2);
    assert_int_equal(checked, want + 2);
    /* Not delivered: every byte counts. */
    assert_int_equal(sim_kvdata_aux_verify(req, max, NULL, 0, &checked), want);
    assert_int_equal(checked, want);
    /* Another request's payload: nearly every byte differs. */
    assert_true(sim_kvdata_aux_verify(req + 4, max, p, want, &checked) > want / 2);
    /* A request without one, and none came: nothing to check. */
    assert_int_equal(sim_kvdata_aux_verify(4, max, NULL, 0, &checked), 0);
    assert_int_equal(checked, 0);
    /* ... but one came. */
    assert_int_equal(sim_kvdata_aux_verify(4, max, p, 10, &checked), 10);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_kvdata_aux_lengths_cover_every_class),
        cmocka_unit_test(test_sim_kvdata_aux_differs_from_others),
        cmocka_unit_test(test_sim_kvdata_aux_verify_counts_every_fault),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
