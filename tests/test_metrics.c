/*
 * test_metrics.c - the rank's metrics (src/metrics.c, kvs_rank_metrics):
 * histograms of rooms' time and bytes per peer instance with cumulative
 * buckets, rooms ended by status, the bounded peer table's "other", the
 * text's length contract (KVS_ERANGE, then the same text), and ranks that
 * moved KV on the simulated cluster reporting what they did, each family
 * once for several ranks.
 */
#include "edge_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

static char *render(const kvs__metrics_rank_t *ranks, size_t n)
{
    size_t len = 0;
    assert_int_equal(kvs__metrics_render(ranks, n, NULL, 0, &len), KVS_ERANGE);
    char *text = malloc(len + 1);
    assert_non_null(text);
    size_t again = 0;
    assert_int_equal(kvs__metrics_render(ranks, n, text, len + 1, &again), KVS_OK);
    assert_int_equal(again, len);
    assert_int_equal(strlen(text), len);
    return text;
}

static void expect_line(const char *text, const char *line)
{
    char want[512];
    assert_true(snprintf(want, sizeof want, "\n%s\n", line) < (int)sizeof want);
    if (strstr(text, want) == NULL)
        fail_msg("no line \"%s\" in:\n%s", line, text);
}

static size_t count_of(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

/* Formats the line to expect; a truncated one would be a broken test. */
#define LINE(...) assert_true(snprintf(line, sizeof line, __VA_ARGS__) < (int)sizeof line)

#define LABELS "role=\"decode\",instance=\"3\",dp_rank=\"0\",tp_rank=\"1\",pp_rank=\"0\""

static kvs_room_result_t result(uint64_t peer, int status, uint64_t ms, uint64_t bytes)
{
    return (kvs_room_result_t){.room = 1, .status = status, .bytes = bytes,
                               .open_ns = 5000000000ull, .done_ns = 5000000000ull + ms * 1000000ull,
                               .peer = {.instance = peer}};
}

/* Buckets are cumulative, sums exact, failures counted by status and kept
 * out of the histograms, peers apart. */
static void test_metrics_histograms_and_status(void **state)
{
    (void)state;
    kvs__metrics_t *m = NULL;
    assert_int_equal(kvs__metrics_create(8, &m), KVS_OK);
    kvs_room_result_t r = result(7, KVS_OK, 3, 100000); /* 3 ms, 100 KB */
    kvs__metrics_observe(m, &r);
    r = result(7, KVS_OK, 1, 65536); /* exactly on the bounds: le is <= */
    kvs__metrics_observe(m, &r);
    r = result(7, KVS_OK, 120000, 1ull << 40); /* past every bound */
    kvs__metrics_observe(m, &r);
    r = result(7, KVS_ETIMEDOUT, 30000, 0);
    kvs__metrics_observe(m, &r);
    r = result(9, KVS_ECANCELED, 2, 0);
    kvs__metrics_observe(m, &r);
    kvs__metrics_rank_t v = {.m = m, .role = KVS_ROLE_DECODE, .instance = 3, .tp_rank = 1,
                             .rooms = {0, 1, 2, 3, 0}, .ring_bytes = 1u << 20};
    v.stats.msgs_retransmitted = 4;
    v.stats.rtt_smoothed_ns = 1500000;
    char *t = render(&v, 1);

    const char *p7 = LABELS ",peer_instance=\"7\",peer_dp_rank=\"0\"";
    char line[512];
    LINE("kvstage_room_transfer_seconds_bucket{%s,le=\"0.001\"} 1", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_seconds_bucket{%s,le=\"0.0025\"} 1", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_seconds_bucket{%s,le=\"0.005\"} 2", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_seconds_bucket{%s,le=\"60\"} 2", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_seconds_bucket{%s,le=\"+Inf\"} 3", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_seconds_sum{%s} 120.004000000", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_seconds_count{%s} 3", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_bytes_bucket{%s,le=\"65536\"} 1", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_bytes_bucket{%s,le=\"262144\"} 2", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_bytes_bucket{%s,le=\"+Inf\"} 3", p7);
    expect_line(t, line);
    LINE("kvstage_room_transfer_bytes_sum{%s} %llu", p7,
             (unsigned long long)(100000 + 65536 + (1ull << 40)));
    expect_line(t, line);
    LINE("kvstage_rooms_ended_total{%s,status=\"KVS_OK\"} 3", p7);
    expect_line(t, line);
    LINE("kvstage_rooms_ended_total{%s,status=\"KVS_ETIMEDOUT\"} 1", p7);
    expect_line(t, line);
    /* Peer 9 only failed: zero in its histograms, its status counted, and
     * its KVS_OK series present at 0. */
    const char *p9 = LABELS ",peer_instance=\"9\",peer_dp_rank=\"0\"";
    LINE("kvstage_room_transfer_seconds_count{%s} 0", p9);
    expect_line(t, line);
    LINE("kvstage_rooms_ended_total{%s,status=\"KVS_ECANCELED\"} 1", p9);
    expect_line(t, line);
    LINE("kvstage_rooms_ended_total{%s,status=\"KVS_OK\"} 0", p9);
    expect_line(t, line);
    assert_null(strstr(t, "peer_instance=\"9\",peer_dp_rank=\"0\",status=\"KVS_ETIMEDOUT\""));
    /* Per rank: open rooms by state (never "success"), counters, ring. */
    expect_line(t, "kvstage_rooms_open{" LABELS ",state=\"transferring\"} 3");
    expect_line(t, "kvstage_rooms_open{" LABELS ",state=\"bootstrapping\"} 1");
    assert_null(strstr(t, "state=\"success\""));
    expect_line(t, "kvstage_control_messages_retransmitted_total{" LABELS "} 4");
    expect_line(t, "kvstage_control_rtt_seconds{" LABELS "} 0.001500000");
    expect_line(t, "kvstage_ring_size_bytes{" LABELS "} 1048576");
    expect_line(t, "# TYPE kvstage_room_transfer_seconds histogram");
    expect_line(t, "# TYPE kvstage_rooms_ended_total counter");
    expect_line(t, "# TYPE kvstage_ring_live_bytes gauge");
    free(t);
    kvs__metrics_destroy(m);
}

/* Rooms of more peer instances than the table holds count as "other". */
static void test_metrics_peer_table_bounded(void **state)
{
    (void)state;
    kvs__metrics_t *m = NULL;
    assert_int_equal(kvs__metrics_create(2, &m), KVS_OK);
    for (uint64_t peer = 1; peer <= 5; peer++) {
        kvs_room_result_t r = result(peer, KVS_OK, 1, 1000);
        kvs__metrics_observe(m, &r);
    }
    kvs__metrics_t *snap = NULL;
    assert_int_equal(kvs__metrics_create_like(m, &snap), KVS_OK);
    kvs__metrics_copy(snap, m);
    kvs__metrics_destroy(m); /* the snapshot stands alone */
    kvs__metrics_rank_t v = {.m = snap, .role = KVS_ROLE_DECODE, .instance = 3, .tp_rank = 1};
    char *t = render(&v, 1);
    expect_line(t, "kvstage_room_transfer_seconds_count{" LABELS
                   ",peer_instance=\"1\",peer_dp_rank=\"0\"} 1");
    expect_line(t, "kvstage_room_transfer_seconds_count{" LABELS
                   ",peer_instance=\"2\",peer_dp_rank=\"0\"} 1");
    expect_line(t, "kvstage_room_transfer_seconds_count{" LABELS
                   ",peer_instance=\"other\",peer_dp_rank=\"other\"} 3");
    assert_null(strstr(t, "peer_instance=\"3\""));
    free(t);
    kvs__metrics_destroy(snap);
}

/* A buffer too small gets the text's length and as much as fits. */
static void test_metrics_text_length_contract(void **state)
{
    (void)state;
    kvs__metrics_t *m = NULL;
    assert_int_equal(kvs__metrics_create(1, &m), KVS_OK);
    kvs__metrics_rank_t v = {.m = m, .role = KVS_ROLE_PREFILL};
    char small[64];
    size_t len = 0;
    assert_int_equal(kvs__metrics_render(&v, 1, small, sizeof small, &len), KVS_ERANGE);
    assert_true(len >= sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
    char *t = render(&v, 1);
    assert_memory_equal(small, t, sizeof small - 1);
    free(t);
    kvs__metrics_destroy(m);
    assert_int_equal(kvs_rank_metrics(NULL, 1, small, sizeof small, &len), KVS_EINVAL);
    assert_int_equal(kvs_rank_metrics(NULL, 0, small, sizeof small, NULL), KVS_EINVAL);
    assert_int_equal(kvs_rank_metrics(NULL, 0, NULL, 1, &len), KVS_EINVAL);
    kvs_rank_t *none[] = {NULL};
    assert_int_equal(kvs_rank_metrics(none, 1, small, sizeof small, &len), KVS_EINVAL);
    assert_int_equal(kvs_rank_metrics(none, 4097, small, sizeof small, &len), KVS_ERANGE);
    /* No rank: an exposition of families without samples. */
    assert_int_equal(kvs_rank_metrics(NULL, 0, small, sizeof small, &len), KVS_ERANGE);
    assert_true(len > 0);
    kvs__metrics_t *bad = (kvs__metrics_t *)&bad;
    assert_int_equal(kvs__metrics_create(0, &bad), KVS_ENOMEM);
    assert_null(bad);
}

/* Ranks that moved KV (and had one room aborted) report it: rooms by
 * status per peer, bytes equal to their results', writes; with two ranks
 * in one scrape each family appears once. */
static void test_metrics_ranks_report_transfers(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.rank_create = true;
    edge_cluster_t *cl = edge_create(&o);
    const edge_room_t rooms[] = {{1, 0, 40}, {2, 8, 33}};
    edge_transfer_ok(cl, rooms, 2);
    edge_open(cl, 3, 0, 40);
    edge_run(cl);
    assert_int_equal(kvs_rank_abort(edge_decode(cl, 0)->rank, 3), KVS_OK);
    edge_wake(edge_decode(cl, 0));
    edge_run(cl);
    edge_expect_all(cl, 3, KVS_ECANCELED);

    kvs_rank_t *ranks[] = {edge_decode(cl, 0)->rank, edge_prefill(cl, 0)->rank,
                           edge_prefill(cl, 1)->rank};
    size_t len = 0;
    assert_int_equal(kvs_rank_metrics(ranks, 3, NULL, 0, &len), KVS_ERANGE);
    char *t = malloc(len + 1);
    assert_non_null(t);
    assert_int_equal(kvs_rank_metrics(ranks, 3, t, len + 1, &len), KVS_OK);
    assert_int_equal(count_of(t, "# TYPE kvstage_room_transfer_seconds "), 1);
    assert_int_equal(count_of(t, "# TYPE kvstage_rdma_writes_total "), 1);
    assert_int_equal(count_of(t, "kvstage_rdma_writes_total{"), 3);
    assert_int_equal(count_of(t, "role=\"decode\""), count_of(t, "role=\"decode\",instance"));
    assert_true(strstr(t, "role=\"decode\",instance=\"0\",dp_rank=\"0\",tp_rank=\"0\","
                          "pp_rank=\"0\",peer_instance=\"0\",peer_dp_rank=\"0\","
                          "status=\"KVS_OK\"} 2\n") != NULL);
    assert_true(strstr(t, "role=\"decode\",instance=\"0\",dp_rank=\"0\",tp_rank=\"0\","
                          "pp_rank=\"0\",peer_instance=\"0\",peer_dp_rank=\"0\","
                          "status=\"KVS_ECANCELED\"} 1\n") != NULL);
    assert_true(strstr(t, "role=\"prefill\",instance=\"0\",dp_rank=\"0\",tp_rank=\"1\","
                          "pp_rank=\"0\",peer_instance=\"0\",peer_dp_rank=\"0\","
                          "status=\"KVS_ECANCELED\"} 1\n") != NULL);
    /* The decode's received bytes: the sum of its rooms' results. */
    kvs_handler_stats_t st;
    kvs_rank_stats(ranks[0], &st);
    char line[512];
    LINE("kvstage_rdma_writes_total{role=\"decode\",instance=\"0\","
             "dp_rank=\"0\",tp_rank=\"0\",pp_rank=\"0\"} %llu", (unsigned long long)st.rdma_writes);
    expect_line(t, line);
    kvs_rank_stats(ranks[1], &st);
    assert_true(st.rdma_write_bytes > 0);
    LINE("kvstage_rdma_write_bytes_total{role=\"prefill\",instance=\"0\","
             "dp_rank=\"0\",tp_rank=\"0\",pp_rank=\"0\"} %llu",
             (unsigned long long)st.rdma_write_bytes);
    expect_line(t, line);
    expect_line(t, "kvstage_ring_live_bytes{role=\"decode\",instance=\"0\",dp_rank=\"0\","
                   "tp_rank=\"0\",pp_rank=\"0\"} 0");
    free(t);
    edge_destroy(cl);
}

/* Every sample of the text (a line not starting '#') is named and labelled
 * once: no two lines share what comes before the value. */
static void expect_no_sample_twice(const char *t)
{
    size_t n = 0, cap = 0;
    char **keys = NULL;
    for (const char *line = t; *line != '\0';) {
        const char *end = strchr(line, '\n');
        const size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        size_t key = len; /* up to the last space: the name and labels */
        while (key > 0 && line[key - 1] != ' ')
            key--;
        if (line[0] != '#' && key > 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                keys = realloc(keys, cap * sizeof *keys);
                assert_non_null(keys);
            }
            keys[n] = calloc(1, key);
            assert_non_null(keys[n]);
            memcpy(keys[n], line, key - 1);
            for (size_t i = 0; i < n; i++)
                if (strcmp(keys[i], keys[n]) == 0)
                    fail_msg("sample twice: %s", keys[n]);
            n++;
        }
        line += len + (end != NULL);
    }
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
}

/* A prefill instance of CP 2 x TP 2: its CP ranks have the same TP and PP
 * ranks two by two, so each sample carries cp_rank; a rank without CP
 * (instance 0's) carries none, as before. */
static void test_metrics_cp_ranks_labelled_apart(void **state)
{
    (void)state;
    edge_opts_t o = edge_defaults();
    o.decode_tp = 1;
    o.prefill_tp = 1;
    o.instances = 2;
    o.inst_tp[1] = 2;
    o.inst_cp[1] = 2;
    o.max_aux_bytes = 64;
    edge_cluster_t *cl = edge_create(&o);
    const char aux[] = "cp";
    edge_cp_transfer(cl, 1, 4, 0, 70, aux, sizeof aux);
    edge_cp_expect_ok(cl, 1, 4, 0, 70, aux, sizeof aux, "P2 CP2 -> D1");
    kvs_rank_t *ranks[5] = {edge_prefill(cl, 0)->rank};
    for (int c = 0; c < 2; c++)
        for (int64_t t = 0; t < 2; t++)
            ranks[1 + 2 * c + t] = edge_group_node(cl, 1, c, t)->rank;
    size_t len = 0;
    assert_int_equal(kvs_rank_metrics(ranks, 5, NULL, 0, &len), KVS_ERANGE);
    char *t = malloc(len + 1);
    assert_non_null(t);
    assert_int_equal(kvs_rank_metrics(ranks, 5, t, len + 1, &len), KVS_OK);
    expect_no_sample_twice(t);
    assert_int_equal(count_of(t, "kvstage_rdma_writes_total{"), 5);
    for (int c = 0; c < 2; c++)
        for (int64_t tp = 0; tp < 2; tp++) {
            char line[256];
            LINE("kvstage_rooms_ended_total{role=\"prefill\",instance=\"1\",dp_rank=\"0\","
                 "tp_rank=\"%lld\",pp_rank=\"0\",cp_rank=\"%d\",peer_instance=\"0\","
                 "peer_dp_rank=\"0\",status=\"KVS_OK\"} 1", (long long)tp, c);
            expect_line(t, line);
        }
    expect_line(t, "kvstage_rdma_writes_total{role=\"prefill\",instance=\"0\",dp_rank=\"0\","
                   "tp_rank=\"0\",pp_rank=\"0\"} 0");
    free(t);
    edge_destroy(cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_histograms_and_status),
        cmocka_unit_test(test_metrics_peer_table_bounded),
        cmocka_unit_test(test_metrics_text_length_contract),
        cmocka_unit_test(test_metrics_ranks_report_transfers),
        cmocka_unit_test(test_metrics_cp_ranks_labelled_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
