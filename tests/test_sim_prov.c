/*
 * test_sim_prov.c - provenance maps (sim/prov.h): writes overwrite and
 * split what they cover, neighbours whose rules continue each other merge
 * into one run (a head row, a strided head slice of many tokens), copies
 * of rows move runs and holes, and the diff counts exactly the bytes whose
 * origin is wrong. A randomized test checks every byte of a small address
 * space against a byte-by-byte model after each of many operations.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvstage/kvstage.h>

#include "prov.h"
#include "xorshift.h"

static sim_prov_map_t *map_new(void)
{
    sim_prov_map_t *m = NULL;
    assert_int_equal(sim_prov_map_create(&m), KVS_OK);
    return m;
}

static sim_prov_run_t contig(uint64_t addr, uint64_t len, uint64_t key, uint64_t off)
{
    return (sim_prov_run_t){.addr = addr, .len_bytes = len, .key = key, .off = off};
}

/* (key, origin) of byte addr, key SIM_PROV_HOLE in a hole. */
static void byte_at(const sim_prov_map_t *m, uint64_t addr, uint64_t *key, uint64_t *origin)
{
    sim_prov_run_t r;
    if (!sim_prov_lookup(m, addr, &r)) {
        *key = SIM_PROV_HOLE;
        *origin = 0;
        return;
    }
    assert_true(addr >= r.addr && addr < r.addr + r.len_bytes);
    *key = r.key;
    *origin = sim_prov_origin(&r, addr - r.addr);
}

static void test_sim_prov_write_then_lookup(void **state)
{
    (void)state;
    sim_prov_map_t *m = map_new();
    sim_prov_run_t r;
    assert_int_equal(sim_prov_lookup(m, 100, &r), 0);
    const sim_prov_run_t a = contig(100, 50, 7, 1000);
    assert_int_equal(sim_prov_write(m, &a), KVS_OK);
    assert_int_equal(sim_prov_runs(m), 1);
    assert_int_equal(sim_prov_lookup(m, 99, &r), 0);
    assert_int_equal(sim_prov_lookup(m, 150, &r), 0);
    uint64_t k, o;
    byte_at(m, 100, &k, &o);
    assert_int_equal(k, 7);
    assert_int_equal(o, 1000);
    byte_at(m, 149, &k, &o);
    assert_int_equal(o, 1049);
    sim_prov_map_destroy(m);
}

static void test_sim_prov_overwrite_splits(void **state)
{
    (void)state;
    sim_prov_map_t *m = map_new();
    const sim_prov_run_t a = contig(0, 100, 1, 0);
    const sim_prov_run_t b = contig(40, 20, 2, 500);
    assert_int_equal(sim_prov_write(m, &a), KVS_OK);
    assert_int_equal(sim_prov_write(m, &b), KVS_OK);
    assert_int_equal(sim_prov_runs(m), 3); /* [0,40) [40,60) [60,100) */
    uint64_t k, o;
    byte_at(m, 39, &k, &o);
    assert_true(k == 1 && o == 39);
    byte_at(m, 40, &k, &o);
    assert_true(k == 2 && o == 500);
    byte_at(m, 60, &k, &o);
    assert_true(k == 1 && o == 60);
    /* Erasing the middle leaves a hole; writing key 1 back merges all. */
    assert_int_equal(sim_prov_erase(m, 40, 20), KVS_OK);
    assert_int_equal(sim_prov_runs(m), 2);
    byte_at(m, 45, &k, &o);
    assert_true(k == SIM_PROV_HOLE);
    const sim_prov_run_t c = contig(40, 20, 1, 40);
    assert_int_equal(sim_prov_write(m, &c), KVS_OK);
    assert_int_equal(sim_prov_runs(m), 1);
    sim_prov_map_destroy(m);
}

/* Head rows of one head each (256 bytes), written one at a time in any
 * order, become one run per token row and then one strided run. */
static void test_sim_prov_rows_coalesce(void **state)
{
    (void)state;
    sim_prov_map_t *m = map_new();
    const uint64_t hb = 256, H = 8, heads = 4, tokens = 64, g0 = 4;
    /* Decode pool rows of 4 heads (global 4..7) of a model of 8 heads. */
    for (uint64_t h = heads; h-- > 0;) /* heads in reverse order */
        for (uint64_t t = 0; t < tokens; t++) {
            const sim_prov_run_t r = contig(((t * heads) + h) * hb, hb, 3,
                                            (t * H + g0 + h) * hb);
            assert_int_equal(sim_prov_write(m, &r), KVS_OK);
        }
    assert_int_equal(sim_prov_runs(m), 1);
    sim_prov_run_t r;
    assert_int_equal(sim_prov_lookup(m, 0, &r), 1);
    assert_int_equal(r.len_bytes, tokens * heads * hb);
    assert_int_equal(r.row_bytes, heads * hb);
    assert_int_equal(r.stride, H * hb);
    /* What the verifier expects: no byte differs... */
    sim_prov_run_t want = {.addr = 0, .len_bytes = tokens * heads * hb, .key = 3,
                           .off = g0 * hb, .row_bytes = heads * hb, .stride = H * hb};
    assert_int_equal(sim_prov_diff(m, &want), 0);
    /* ... and a head off by one (a modulo mapping) is every byte. */
    want.off = (g0 - 1) * hb;
    assert_int_equal(sim_prov_diff(m, &want), tokens * heads * hb);
    /* One byte off: every byte too (each has its neighbour's origin). */
    want.off = g0 * hb + 1;
    assert_int_equal(sim_prov_diff(m, &want), tokens * heads * hb);
    /* Another key (request, layer, K/V) in part of it. */
    const sim_prov_run_t other = contig(hb, hb, 4, 0);
    assert_int_equal(sim_prov_write(m, &other), KVS_OK);
    want.off = g0 * hb;
    assert_int_equal(sim_prov_diff(m, &want), hb);
    sim_prov_map_destroy(m);
}

/* A gather of one head out of 4-head pool rows into a contiguous staging
 * block, and a scatter back into rows of another pool: one run each. */
static void test_sim_prov_copy_rows_gather_scatter(void **state)
{
    (void)state;
    sim_prov_map_t *m = map_new();
    const uint64_t hb = 128, H = 4, tokens = 32;
    const uint64_t pool = 1 << 20, stg = 2 << 20, pool2 = 3 << 20;
    const sim_prov_run_t rows = {.addr = pool, .len_bytes = tokens * H * hb, .key = 9,
                                 .off = 0, .row_bytes = H * hb, .stride = H * hb};
    assert_int_equal(sim_prov_write(m, &rows), KVS_OK); /* contiguous: stride == row */
    assert_int_equal(sim_prov_runs(m), 1);
    /* Gather head 2 of every token. */
    assert_int_equal(sim_prov_copy_rows(m, stg, hb, m, pool + 2 * hb, H * hb, hb, tokens),
                     KVS_OK);
    assert_int_equal(sim_prov_runs(m), 2);
    const sim_prov_run_t want = {.addr = stg, .len_bytes = tokens * hb, .key = 9,
                                 .off = 2 * hb, .row_bytes = hb, .stride = H * hb};
    assert_int_equal(sim_prov_diff(m, &want), 0);
    /* Scatter into head 1 of 2-head rows: holes around it stay holes. */
    assert_int_equal(sim_prov_copy_rows(m, pool2 + hb, 2 * hb, m, stg, hb, hb, tokens), KVS_OK);
    uint64_t k, o;
    byte_at(m, pool2, &k, &o);
    assert_true(k == SIM_PROV_HOLE);
    byte_at(m, pool2 + 5 * 2 * hb + hb + 3, &k, &o);
    assert_true(k == 9 && o == (5 * H + 2) * hb + 3);
    assert_int_equal(sim_prov_runs(m), 2 + tokens);
    /* Copying a hole over data erases it. */
    assert_int_equal(sim_prov_copy(m, stg, m, 5 << 20, 10), KVS_OK);
    byte_at(m, stg + 9, &k, &o);
    assert_true(k == SIM_PROV_HOLE);
    byte_at(m, stg + 10, &k, &o);
    assert_true(k == 9 && o == 2 * hb + 10);
    sim_prov_map_destroy(m);
}

/* Many random writes, erases and row copies over a small space, each byte
 * checked against a byte-by-byte model; runs stay disjoint and sorted. */
#define SPACE 2048u
static void test_sim_prov_matches_byte_model(void **state)
{
    (void)state;
    uint64_t seed = 0x5eed2024u;
    sim_prov_map_t *m = map_new();
    uint64_t *key = malloc(SPACE * sizeof *key), *org = malloc(SPACE * sizeof *org);
    uint64_t *k2 = malloc(SPACE * sizeof *k2), *o2 = malloc(SPACE * sizeof *o2);
    assert_non_null(key);
    assert_non_null(org);
    assert_non_null(k2);
    assert_non_null(o2);
    for (uint32_t i = 0; i < SPACE; i++)
        key[i] = SIM_PROV_HOLE;
    for (int step = 0; step < 3000; step++) {
        const int op = (int)xorshift_range(&seed, 0, 9);
        if (op < 4) { /* a write: contiguous or rows */
            sim_prov_run_t r = {.addr = (uint64_t)xorshift_range(&seed, 0, SPACE - 1),
                                .key = (uint64_t)xorshift_range(&seed, 1, 3),
                                .off = (uint64_t)xorshift_range(&seed, 0, 4000)};
            r.len_bytes = (uint64_t)xorshift_range(&seed, 1, (int64_t)(SPACE - r.addr));
            if (op >= 2) {
                r.row_bytes = (uint64_t)xorshift_range(&seed, 1, 64);
                r.stride = r.row_bytes + (uint64_t)xorshift_range(&seed, 0, 64);
                r.phase = (uint64_t)xorshift_range(&seed, 0, (int64_t)r.row_bytes - 1);
            }
            assert_int_equal(sim_prov_write(m, &r), KVS_OK);
            for (uint64_t x = 0; x < r.len_bytes; x++) {
                key[r.addr + x] = r.key;
                org[r.addr + x] = sim_prov_origin(&r, x);
            }
        } else if (op == 4) {
            const uint64_t a = (uint64_t)xorshift_range(&seed, 0, SPACE - 1);
            const uint64_t n = (uint64_t)xorshift_range(&seed, 1, (int64_t)(SPACE - a));
            assert_int_equal(sim_prov_erase(m, a, n), KVS_OK);
            for (uint64_t x = 0; x < n; x++)
                key[a + x] = SIM_PROV_HOLE;
        } else { /* rows copied, possibly over themselves */
            const uint64_t row = (uint64_t)xorshift_range(&seed, 1, 48);
            const uint64_t ss = row + (uint64_t)xorshift_range(&seed, 0, 40);
            const uint64_t ds = row + (uint64_t)xorshift_range(&seed, 0, 40);
            const uint64_t n = (uint64_t)xorshift_range(&seed, 1, 16);
            const uint64_t s_span = (n - 1) * ss + row, d_span = (n - 1) * ds + row;
            if (s_span > SPACE || d_span > SPACE)
                continue;
            const uint64_t s0 = (uint64_t)xorshift_range(&seed, 0, (int64_t)(SPACE - s_span));
            const uint64_t d0 = (uint64_t)xorshift_range(&seed, 0, (int64_t)(SPACE - d_span));
            assert_int_equal(sim_prov_copy_rows(m, d0, ds, m, s0, ss, row, n), KVS_OK);
            memcpy(k2, key, SPACE * sizeof *key);
            memcpy(o2, org, SPACE * sizeof *org);
            for (uint64_t i = 0; i < n; i++)
                for (uint64_t x = 0; x < row; x++) {
                    key[d0 + i * ds + x] = k2[s0 + i * ss + x];
                    org[d0 + i * ds + x] = o2[s0 + i * ss + x];
                }
        }
        assert_true(sim_prov_valid(m));
        for (uint32_t a = 0; a < SPACE; a++) {
            uint64_t k, o;
            byte_at(m, a, &k, &o);
            if (k != key[a] || (k != SIM_PROV_HOLE && o != org[a]))
                fail_msg("step %d, byte %u: map says key %llu origin %llu, model key %llu "
                         "origin %llu (seed 0x5eed2024)",
                         step, a, (unsigned long long)k, (unsigned long long)o,
                         (unsigned long long)key[a], (unsigned long long)org[a]);
        }
        /* The diff against the model's own bytes, one byte at a time. */
        const uint64_t a = (uint64_t)xorshift_range(&seed, 0, SPACE - 1);
        if (key[a] != SIM_PROV_HOLE) {
            const sim_prov_run_t one = contig(a, 1, key[a], org[a]);
            assert_int_equal(sim_prov_diff(m, &one), 0);
            const sim_prov_run_t wrong = contig(a, 1, key[a], org[a] + 1);
            assert_int_equal(sim_prov_diff(m, &wrong), 1);
        }
    }
    /* Runs never outnumber bytes, and merge where they can: the model's
     * maximal runs of continuing bytes bound them from above. */
    assert_true(sim_prov_runs(m) <= SPACE);
    /* Enough runs that changes spanned several leaves. */
    assert_true(sim_prov_runs_peak(m) > 3 * SIM_PROV_LEAF_MAX);
    free(key);
    free(org);
    free(k2);
    free(o2);
    sim_prov_map_destroy(m);
}

/* A long strided diff against a run of a different row shape. */
static void test_sim_prov_diff_counts_bytes(void **state)
{
    (void)state;
    sim_prov_map_t *m = map_new();
    const sim_prov_run_t have = {.addr = 0, .len_bytes = 1000, .key = 1, .off = 0,
                                 .row_bytes = 100, .stride = 300};
    assert_int_equal(sim_prov_write(m, &have), KVS_OK);
    /* want: the same for the first 5 rows, then shifted rows. */
    const sim_prov_run_t same = {.addr = 0, .len_bytes = 500, .key = 1, .off = 0,
                                 .row_bytes = 100, .stride = 300};
    assert_int_equal(sim_prov_diff(m, &same), 0);
    const sim_prov_run_t wide = {.addr = 0, .len_bytes = 1000, .key = 1, .off = 0,
                                 .row_bytes = 200, .stride = 300};
    /* rows of 200 from 0, 300, 600...: byte x in [0,100) of each 200-row
     * matches the first row of two 100-rows; the second half does not. */
    uint64_t bad = 0;
    for (uint64_t x = 0; x < 1000; x++)
        bad += sim_prov_origin(&have, x) != sim_prov_origin(&wide, x);
    assert_int_equal(sim_prov_diff(m, &wide), bad);
    const sim_prov_run_t past = {.addr = 900, .len_bytes = 200, .key = 1, .off = 2700,
                                 .row_bytes = 0};
    assert_int_equal(sim_prov_diff(m, &past), 100); /* [1000,1100) is a hole */
    sim_prov_map_destroy(m);
}

/* A fused copy of several parts equals one copy per part, in any state
 * of the destination; parts that tile the rows leave one run. */
static void test_sim_prov_copy_parts_equals_parts_one_by_one(void **state)
{
    (void)state;
    uint64_t seed = 0xfa57u;
    for (int round = 0; round < 200; round++) {
        sim_prov_map_t *a = map_new(), *b = map_new();
        for (int w = 0; w < 20; w++) { /* the same random content in both */
            sim_prov_run_t r = {.addr = (uint64_t)xorshift_range(&seed, 0, 8191),
                                .len_bytes = (uint64_t)xorshift_range(&seed, 1, 300),
                                .key = (uint64_t)xorshift_range(&seed, 1, 2),
                                .off = (uint64_t)xorshift_range(&seed, 0, 999)};
            assert_int_equal(sim_prov_write(a, &r), KVS_OK);
            assert_int_equal(sim_prov_write(b, &r), KVS_OK);
        }
        const uint64_t rows = (uint64_t)xorshift_range(&seed, 1, 20);
        sim_prov_rowsrc_t parts[3];
        uint64_t off = 0;
        for (int j = 0; j < 3; j++) {
            off += (uint64_t)xorshift_range(&seed, 0, 4);
            const uint64_t row = (uint64_t)xorshift_range(&seed, 1, 16);
            parts[j] = (sim_prov_rowsrc_t){.s0 = (uint64_t)xorshift_range(&seed, 0, 3500),
                                           .ss = row + (uint64_t)xorshift_range(&seed, 0, 8),
                                           .row_bytes = row, .dst_off = off};
            off += row;
        }
        const uint64_t ds = off + (uint64_t)xorshift_range(&seed, 0, 4);
        const uint64_t d0 = 4096 + (uint64_t)xorshift_range(&seed, 0, 2000);
        assert_int_equal(sim_prov_copy_parts(a, d0, ds, a, parts, 3, rows), KVS_OK);
        for (int j = 0; j < 3; j++) /* sources end below 4096: never overwritten */
            assert_int_equal(sim_prov_copy_rows(b, d0 + parts[j].dst_off, ds, b, parts[j].s0,
                                                parts[j].ss, parts[j].row_bytes, rows),
                             KVS_OK);
        assert_true(sim_prov_valid(a) && sim_prov_valid(b));
        for (uint64_t x = 0; x < 8192 + 512; x++) {
            uint64_t ka, oa, kb, ob;
            byte_at(a, x, &ka, &oa);
            byte_at(b, x, &kb, &ob);
            if (ka != kb || (ka != SIM_PROV_HOLE && oa != ob))
                fail_msg("round %d, byte %llu differs (seed 0xfa57)", round,
                         (unsigned long long)x);
        }
        sim_prov_map_destroy(a);
        sim_prov_map_destroy(b);
    }
    /* Four one-head parts of a 4-head row, from one contiguous source. */
    sim_prov_map_t *m = map_new();
    const sim_prov_run_t src = contig(0, 4 * 64 * 32, 5, 0); /* 4 blocks of 32 rows */
    assert_int_equal(sim_prov_write(m, &src), KVS_OK);
    sim_prov_rowsrc_t heads[4];
    for (int j = 0; j < 4; j++)
        heads[j] = (sim_prov_rowsrc_t){.s0 = (uint64_t)j * 64 * 32, .ss = 64, .row_bytes = 64,
                                       .dst_off = (uint64_t)j * 64};
    assert_int_equal(sim_prov_copy_parts(m, 1 << 20, 256, m, heads, 4, 32), KVS_OK);
    assert_int_equal(sim_prov_runs(m), 1 + 32); /* a head's rows do not follow in src */
    sim_prov_map_destroy(m);
}

/* A batch of copies and writes (sim_prov_batch_*) leaves the map as the
 * same calls made one by one, whatever their order: pieces landing before
 * those pending, and copies reading what is pending, write them out first.
 * The sources hold strided runs too, so the closed-form copy of a page
 * run (rows inside one source run) is compared with the row loop. */
static void test_sim_prov_batch_equals_one_by_one(void **state)
{
    (void)state;
    uint64_t seed = 0xba7c4u;
    for (int round = 0; round < 150; round++) {
        sim_prov_map_t *a = map_new(), *b = map_new();
        for (int w = 0; w < 12; w++) { /* the same random content in both */
            sim_prov_run_t r = {.addr = (uint64_t)xorshift_range(&seed, 0, 6000),
                                .len_bytes = (uint64_t)xorshift_range(&seed, 1, 2000),
                                .key = (uint64_t)xorshift_range(&seed, 1, 2),
                                .off = (uint64_t)xorshift_range(&seed, 0, 999)};
            if (xorshift_range(&seed, 0, 1)) {
                r.row_bytes = (uint64_t)xorshift_range(&seed, 1, 32);
                r.stride = r.row_bytes + (uint64_t)xorshift_range(&seed, 1, 64);
            }
            assert_int_equal(sim_prov_write(a, &r), KVS_OK);
            assert_int_equal(sim_prov_write(b, &r), KVS_OK);
        }
        sim_prov_batch_begin(a);
        const int ops = (int)xorshift_range(&seed, 1, 8);
        for (int k = 0; k < ops; k++) {
            if (xorshift_range(&seed, 0, 3) == 0) { /* a write or an erase */
                sim_prov_run_t r = {.addr = (uint64_t)xorshift_range(&seed, 0, 7000),
                                    .len_bytes = (uint64_t)xorshift_range(&seed, 1, 500),
                                    .key = xorshift_range(&seed, 0, 2) == 0
                                               ? SIM_PROV_HOLE
                                               : (uint64_t)xorshift_range(&seed, 1, 3),
                                    .off = (uint64_t)xorshift_range(&seed, 0, 999)};
                assert_int_equal(sim_prov_batch_write(a, &r), KVS_OK);
                assert_int_equal(sim_prov_write(b, &r), KVS_OK);
                continue;
            }
            const size_t np = (size_t)xorshift_range(&seed, 1, 3);
            const uint64_t rows = (uint64_t)xorshift_range(&seed, 1, 40);
            sim_prov_rowsrc_t parts[3];
            uint64_t off = 0;
            for (size_t j = 0; j < np; j++) {
                off += (uint64_t)xorshift_range(&seed, 0, 2);
                const uint64_t row = (uint64_t)xorshift_range(&seed, 1, 16);
                const uint64_t ss = xorshift_range(&seed, 0, 1)
                                        ? row * (uint64_t)xorshift_range(&seed, 1, 3)
                                        : row + (uint64_t)xorshift_range(&seed, 0, 8);
                parts[j] = (sim_prov_rowsrc_t){.s0 = (uint64_t)xorshift_range(&seed, 0, 5000),
                                               .ss = ss, .row_bytes = row, .dst_off = off};
                off += row;
            }
            const uint64_t ds = off + (uint64_t)xorshift_range(&seed, 0, 3);
            const uint64_t d0 = (uint64_t)xorshift_range(&seed, 0, 7000);
            assert_int_equal(sim_prov_batch_copy_parts(a, d0, ds, a, parts, np, rows), KVS_OK);
            assert_int_equal(sim_prov_copy_parts(b, d0, ds, b, parts, np, rows), KVS_OK);
        }
        assert_int_equal(sim_prov_batch_end(a), KVS_OK);
        assert_true(sim_prov_valid(a) && sim_prov_valid(b));
        for (uint64_t x = 0; x < 9728; x++) { /* past every write and copy */
            uint64_t ka, oa, kb, ob;
            byte_at(a, x, &ka, &oa);
            byte_at(b, x, &kb, &ob);
            if (ka != kb || (ka != SIM_PROV_HOLE && oa != ob))
                fail_msg("round %d, byte %llu: batch key %llu origin %llu, one by one key "
                         "%llu origin %llu (seed 0xba7c4)",
                         round, (unsigned long long)x, (unsigned long long)ka,
                         (unsigned long long)oa, (unsigned long long)kb,
                         (unsigned long long)ob);
        }
        sim_prov_map_destroy(a);
        sim_prov_map_destroy(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_prov_write_then_lookup),
        cmocka_unit_test(test_sim_prov_overwrite_splits),
        cmocka_unit_test(test_sim_prov_rows_coalesce),
        cmocka_unit_test(test_sim_prov_copy_rows_gather_scatter),
        cmocka_unit_test(test_sim_prov_matches_byte_model),
        cmocka_unit_test(test_sim_prov_diff_counts_bytes),
        cmocka_unit_test(test_sim_prov_copy_parts_equals_parts_one_by_one),
        cmocka_unit_test(test_sim_prov_batch_equals_one_by_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
