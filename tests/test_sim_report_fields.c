/*
 * test_sim_report_fields.c - the report described once
 * (kvstage/sim_report_fields.h): the public struct it generates has every
 * member at the offset the hand-written kvs_sim_report_t had (a copy of
 * it below pins the ABI); kvs_sim_report_field() lists every member in
 * order with its offset, size, type and count; and a run's public report
 * (kvs_sim_run, copied by the list) equals the internal one
 * (sim_scenario_run) in every scalar of the list, which a planted
 * difference in any one of them shows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <kvstage/sim.h>

#include "scenario.h"

/* kvs_sim_report_t as it was written by hand before the list (report
 * version 1 and its later groups, up to hostile_bytes_landed). A member
 * appended to the list is appended here too: nothing before it may move. */
typedef struct legacy_sim_report {
    uint32_t version;           /* written by the library */
    uint32_t size_bytes;        /* set by the caller: sizeof(kvs_sim_report_t) */
    uint32_t requests_total, requests_ok;
    uint32_t requests_failed;   /* terminal, not ok (hung ones apart) */
    uint32_t hung_requests;     /* never terminal on every rank */
    uint32_t unreported_failures; /* a rank learned of a peer's failure only
                                     by its own stall timeout */
    int32_t path;               /* kvs_path_t the handlers ran */
    uint64_t bytes_moved;       /* payload bytes the prefill side wrote */
    uint64_t bytes_verified;    /* decode bytes compared with the pattern */
    uint64_t corrupt_bytes;     /* of those, wrong (in requests reported ok) */
    uint64_t ring_leaked_bytes; /* live in any ring after the run */
    uint64_t violations;        /* hung + leaked + corrupt + unreported
                                   (+ collateral_failures,
                                   failed_without_faults, keys_leaked and
                                   hostile_bytes_landed, below): ok is
                                   violations == 0 */
    uint64_t rdma_ops, control_msgs, msgs_rejected, watermark_waits;
    uint64_t ring_peak_bytes;   /* most ring bytes live on one decode rank */
    uint64_t sim_ns;            /* first arrival to last completion */
    uint64_t events;            /* engine events dispatched */
    uint64_t digest;            /* engine event-order digest: one seed, one digest */
    int64_t prefill_ranks, decode_ranks;
    double goodput_gbps;        /* bytes_verified over sim time, Gb/s */
    double line_rate_gbps;      /* NIC rate x min(prefill NICs, decode NICs) */
    double latency_p50_us, latency_p99_us; /* prefill done -> request done */
    double e2e_p50_us, e2e_p99_us;         /* arrival -> request done */
    /* (after the version 1 prefix: callers with a shorter size_bytes get
     * the prefix only) */
    uint64_t msgs_retransmitted; /* control messages sent again */
    uint64_t msgs_duplicate;     /* received twice or after a loss: dropped */
    uint64_t peers_lost;         /* connections the handlers found dead */
    uint32_t ranks_crashed, ranks_restarted;
    uint32_t ranks_down_at_start; /* failed their init (hbm-full) */
    uint32_t reserved;
    char init_error[384];        /* the first such failure, NUL-terminated */
    uint64_t posts_refused;      /* writes and sends refused by a full send
                                    queue (net_sq_depth) */
    /* Clusters (after posts_refused: callers with a shorter size_bytes get
     * what came before). */
    uint32_t collateral_failures; /* requests that failed although neither of
                                     their instances was faulted (no fault on
                                     a rank of either, none of the whole
                                     cluster: message or write faults); a
                                     region the ring can never hold
                                     (KVS_EOVERSIZED) is not collateral.
                                     Counted in violations */
    uint32_t instances;          /* entries of instance[]: prefill instances
                                    first, then decode ones */
    kvs_sim_instance_t instance[2 * KVS_SIM_MAX_INSTANCES];
    /* Aux payloads (config max_aux_bytes; after instance[]: callers with a
     * shorter size_bytes get what came before). */
    uint64_t aux_bytes_verified; /* compared on the decode ranks, one payload
                                    per ok result of each; not in
                                    bytes_verified */
    uint64_t aux_corrupt_bytes;  /* of those, wrong, missing or extra; also
                                    counted in corrupt_bytes (violations) */
    /* The verdict and why requests failed (after aux_corrupt_bytes: callers
     * with a shorter size_bytes get what came before). */
    uint32_t ok;                 /* 1: the run broke no invariant; the one
                                    verdict of kvs_sim_run, Python's
                                    simulate() and `kvstage sim` (exit 0) */
    uint32_t failed_without_faults; /* requests that failed in a run without
                                    faults and are not collateral (a region
                                    the ring cannot hold); in violations */
    uint64_t ring_bytes_needed;  /* the largest staging region a request of
                                    this workload can need on one decode
                                    rank (0: no pair stages); a config whose
                                    ring_bytes is below it is refused before
                                    the run with KVS_EOVERSIZED, this field
                                    still written */
    uint32_t failures;           /* entries of failure[] */
    uint32_t failures_unlisted;  /* requests that failed with a status past
                                    the first KVS_SIM_MAX_FAILURE_KINDS */
    kvs_sim_failure_t failure[KVS_SIM_MAX_FAILURE_KINDS]; /* by status, in the
                                    order each first happened */
    /* What operators read (after failure[]: callers with a shorter
     * size_bytes get what came before). Computed from what the run
     * recorded: they add no event and leave the digest as it was. TTFT is
     * e2e above (arrival -> KV complete at the decode); its percentiles,
     * like all here, are exact nearest-rank ones of the ok requests. */
    double ttft_p50_us, ttft_p90_us, ttft_p99_us;
    double transfer_p50_us, transfer_p99_us; /* first chunk computed -> done */
    uint64_t ring_p99_bytes;     /* time-weighted 99th percentile of bytes
                                    live in one decode rank's ring, the largest
                                    over ranks (ring_peak_bytes: the most) */
    double nic_util_mean;        /* over every rank, as in
                                    kvs_sim_instance_metrics_t */
    double nic_util_max;         /* the busiest rank's */
    double goodput_fraction;     /* goodput_gbps / line_rate_gbps */
    kvs_sim_instance_metrics_t instance_metrics[2 * KVS_SIM_MAX_INSTANCES];
    /* The first wrong aux payload in words: the rank, the request and both
     * lengths; "" when none (after instance_metrics[]: callers with a
     * shorter size_bytes get what came before). */
    char aux_error[KVS_SIM_AUX_ERROR_BYTES];
    /* Region-scoped keys and hostile writers (docs/security.md; after
     * aux_error: callers with a shorter size_bytes get what came before). */
    uint64_t keys_granted;       /* region-scoped keys the decode ranks granted */
    uint64_t keys_revoked;       /* ... and revoked */
    uint64_t keys_leaked;        /* grants still live after the run; in violations */
    uint64_t hostile_writes;     /* writes the hostile-write faults sent astray */
    uint64_t hostile_bytes_landed; /* bytes of them that landed in a decode's
                                    memory; in violations (the fabric must
                                    refuse every one) */
} legacy_sim_report_t;


#define LEGACY_HEAD(code, name, meaning)                                                   \
    _Static_assert(offsetof(kvs_sim_report_t, name) == offsetof(legacy_sim_report_t, name), \
                   #name " moved");                                                        \
    _Static_assert(sizeof(((kvs_sim_report_t *)0)->name) ==                                \
                       sizeof(((legacy_sim_report_t *)0)->name),                           \
                   #name " changed size");
#define LEGACY_FIELD(code, name, json, meaning) LEGACY_HEAD(code, name, meaning)
#define LEGACY_ARRAY(elem, name, count, meaning) LEGACY_HEAD(elem, name, meaning)
KVS_SIM_REPORT_FIELDS(LEGACY_HEAD, LEGACY_FIELD, LEGACY_ARRAY)
_Static_assert(sizeof(kvs_sim_report_t) == sizeof(legacy_sim_report_t),
               "kvs_sim_report_t grew or shrank: append to the list and to the copy above");

/* The list's names, in order, for the table's test. */
#define NAME_HEAD(code, name, meaning) #name,
#define NAME_FIELD(code, name, json, meaning) #name,
#define NAME_ARRAY(elem, name, count, meaning) #name,
static const char *const list_names[] = {
    KVS_SIM_REPORT_FIELDS(NAME_HEAD, NAME_FIELD, NAME_ARRAY)};
#define LIST_COUNT (sizeof list_names / sizeof list_names[0])

static bool scalar_type(const char *t)
{
    return strcmp(t, "u32") == 0 || strcmp(t, "i32") == 0 || strcmp(t, "u64") == 0 ||
           strcmp(t, "i64") == 0 || strcmp(t, "f64") == 0;
}

static void test_report_field_table_covers_the_struct(void **state)
{
    (void)state;
    assert_int_equal(kvs_sim_report_size(), sizeof(kvs_sim_report_t));
    uint32_t end = 0, n = 0;
    for (const kvs_sim_report_field_t *f; (f = kvs_sim_report_field(n)) != NULL; n++) {
        assert_true(n < LIST_COUNT);
        assert_string_equal(f->name, list_names[n]);
        assert_non_null(f->meaning);
        assert_true(f->meaning[0] != '\0');
        /* In order, no overlap, no gap wider than alignment padding. */
        assert_true(f->offset >= end);
        assert_true(f->offset - end < 8);
        assert_true(f->count >= 1 && f->size_bytes % f->count == 0);
        if (scalar_type(f->type)) {
            assert_int_equal(f->count, 1);
            assert_int_equal(f->size_bytes, f->type[1] == '3' ? 4 : 8);
        } else {
            assert_int_equal(f->json, -1); /* an array: the CLI writes it */
        }
        assert_true(f->json >= -1 && f->json <= 9);
        end = f->offset + f->size_bytes;
    }
    assert_int_equal(n, LIST_COUNT);
    assert_true(end <= sizeof(kvs_sim_report_t) && sizeof(kvs_sim_report_t) - end < 8);
    assert_null(kvs_sim_report_field(n + 1000));
    /* A few by hand: the table says what the header says. */
    const kvs_sim_report_field_t *f = kvs_sim_report_field(0);
    assert_string_equal(f->name, "version");
    assert_int_equal(f->head, 1);
    for (uint32_t i = 0; (f = kvs_sim_report_field(i)) != NULL; i++) {
        if (strcmp(f->name, "path") == 0)
            assert_string_equal(f->type, "i32");
        if (strcmp(f->name, "hostile_bytes_landed") == 0)
            assert_int_equal(f->offset, offsetof(kvs_sim_report_t, hostile_bytes_landed));
        if (strcmp(f->name, "instance") == 0) {
            assert_string_equal(f->type, "kvs_sim_instance_t");
            assert_int_equal(f->count, 2 * KVS_SIM_MAX_INSTANCES);
            assert_int_equal(f->size_bytes, sizeof(((kvs_sim_report_t *)0)->instance));
        }
        if (strcmp(f->name, "goodput_gbps") == 0)
            assert_int_equal(f->json, 6);
    }
}

/* The name of the first scalar of the list in which pub differs from in,
 * or NULL when they all match. */
static const char *first_difference(const sim_report_t *in, const kvs_sim_report_t *pub)
{
#define DIFF_HEAD(code, name, meaning)
#define DIFF_FIELD(code, name, json, meaning)                                               \
    {                                                                                       \
        const KVS_SIM_REPORT_CTYPE(code) a = in->name, b = pub->name;                       \
        if (memcmp(&a, &b, sizeof a) != 0)                                                  \
            return #name;                                                                   \
    }
#define DIFF_ARRAY(elem, name, count, meaning)
    KVS_SIM_REPORT_FIELDS(DIFF_HEAD, DIFF_FIELD, DIFF_ARRAY)
    return NULL;
}

/* The same scenario both ways: the public report (copied by the list)
 * equals the internal one in every scalar, and one planted difference in
 * any of them is named. */
static void test_report_copy_is_the_list(void **state)
{
    (void)state;
    kvs_sim_config_t c;
    kvs_sim_config_init(&c);
    c.total_heads = 2;
    c.head_dim = 64;
    c.layers = 2;
    c.page_size = 16;
    c.chunk_tokens = 64;
    c.prefill_tp = 2;
    c.decode_tp = 1;
    c.requests = 6;
    c.prompt_min_tokens = 16;
    c.prompt_max_tokens = 200;
    c.ring_bytes = 4u << 20;
    c.seed = 5;
    kvs_sim_report_t pub;
    memset(&pub, 0, sizeof pub);
    pub.size_bytes = sizeof pub;
    kvs_error_t err;
    assert_int_equal(kvs_sim_run(&c, &pub, &err), KVS_OK);

    sim_scenario_config_t s;
    memset(&s, 0, sizeof s);
    s.shape = (kvs_layout_params_t){.total_heads = 2, .head_dim = 64, .layers = 2,
                                    .page_size = 16, .chunk_tokens = 64,
                                    .prefill_tp = 2, .decode_tp = 1};
    s.requests = 6;
    s.prompt_min_tokens = 16;
    s.prompt_max_tokens = 200;
    s.ring_bytes = 4u << 20;
    s.seed = 5;
    s.staging = true;
    static sim_report_t in;
    char why[256];
    assert_int_equal(sim_scenario_run(&s, &in, why, sizeof why), KVS_OK);
    assert_true(in.requests_ok == 6 && in.bytes_moved > 0 && in.events > 0);
    const char *diff = first_difference(&in, &pub);
    if (diff != NULL)
        fail_msg("the public report's %s is not the scenario's", diff);

    /* Planted: each scalar in turn made different is named. */
    uint32_t planted = 0;
#define PLANT_HEAD(code, name, meaning)
#define PLANT_FIELD(code, name, json, meaning)                                              \
    {                                                                                       \
        kvs_sim_report_t bad = pub;                                                         \
        bad.name = (KVS_SIM_REPORT_CTYPE(code))(bad.name + 1);                              \
        const char *got = first_difference(&in, &bad);                                      \
        assert_non_null(got);                                                               \
        assert_string_equal(got, #name);                                                    \
        planted++;                                                                          \
    }
#define PLANT_ARRAY(elem, name, count, meaning)
    KVS_SIM_REPORT_FIELDS(PLANT_HEAD, PLANT_FIELD, PLANT_ARRAY)
    assert_true(planted > 50);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_field_table_covers_the_struct),
        cmocka_unit_test(test_report_copy_is_the_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
