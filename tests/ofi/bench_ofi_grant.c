/*
 * bench_ofi_grant.c - what a region-scoped key costs on the ofi fabric
 * (hw/ofi/grant.c), side by side with no grant: two fabrics in this
 * process on one provider over 127.0.0.1, medians of many rounds of
 *   grant+revoke   key_grant + key_revoke of 4 KiB (a's calls alone)
 *   reg+dereg      mr_register + mr_deregister of 4 KiB (for scale)
 *   write          b writes 4 KiB under a key it holds, to its completion
 *   grant+write    a grants 4 KiB, b learns the key (its KEYS), writes
 *                  under it to its completion, a revokes: one region's
 *                  path with a grant, against `write` without
 * Between timed rounds both sides are polled until a's KEYS/DROP sends are
 * done, so a round never waits on the one before. Not a test: numbers go
 * to docs/performance.md and docs/security.md ("Cost").
 *
 * Usage: bench_ofi_grant [PROVIDER [ROUNDS]]   (default tcp 2000)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <kvstage/ofi.h>

#include "fabric_pair.h"
#include "hw_ofi.h" /* send slots in flight; the peer's key table */

#define PIECE 4096u

static void nap(kvs_fabric_t *fab)
{
    (void)fab;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static int cmp_u64(const void *x, const void *y)
{
    const uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* Polls both sides until a's internal sends are all done; drops what
 * they queued. */
static void settle(fp_pair_t *d)
{
    hw_ofi_fabric_t *a = hw_ofi_of(d->a.fab);
    for (int i = 0; i < 1000000 && (a->slot_nfree != a->cfg.send_slots || i < 4); i++) {
        fp_side_pump(&d->a);
        fp_side_pump(&d->b);
    }
    d->a.n = d->b.n = 0;
}

static void b_write(fp_pair_t *d, fp_region_t *src, uint64_t raddr, uint64_t rkey)
{
    const kvs_write_desc_t w = {.local_addr = (uint64_t)(uintptr_t)src->mem,
                                .local_mr = src->mr, .len_bytes = PIECE, .remote_addr = raddr,
                                .rkey = rkey, .wr_id = 1};
    int rc = d->b.fab->ops.write(d->b.fab, d->ab, &w);
    if (rc != KVS_OK)
        fail_msg("write: %s: %s", kvs_status_name(rc), d->b.fab->last_backend_msg);
    kvs_completion_t c = fp_take(d, &d->b, KVS_COMPLETION_WRITE, d->ab);
    if (c.status != KVS_OK)
        fail_msg("write completion: %s", kvs_status_name(c.status));
}

/* b polls until a's KEYS for id arrived. */
static void b_learn(fp_pair_t *d, uint64_t id, uint64_t raddr)
{
    uint64_t key, off, left;
    const hw_rkeys_entry_t *t;
    while (hw_rkeys_lookup(&d->ab->rkeys, (uint32_t)id, raddr, &key, &off, &left, &t) != KVS_OK)
        fp_side_pump(&d->b);
}

static uint64_t now_ns(void) { return fp_now_ns(); }

static void report(const char *what, uint64_t *ns, int n)
{
    qsort(ns, (size_t)n, sizeof *ns, cmp_u64);
    printf("  %-14s median %7.1f us  p10 %7.1f  p90 %7.1f  (%d rounds)\n", what,
           (double)ns[n / 2] / 1e3, (double)ns[n / 10] / 1e3, (double)ns[n * 9 / 10] / 1e3, n);
}

int main(int argc, char **argv)
{
    const char *prov = argc > 1 ? argv[1] : "tcp";
    const int rounds = argc > 2 ? atoi(argv[2]) : 2000;
    if (rounds < 10) {
        fprintf(stderr, "bench_ofi_grant: ROUNDS must be at least 10\n");
        return 2;
    }
    kvs_ofi_config_t cfg;
    kvs_ofi_config_init(&cfg);
    cfg.provider = prov;
    cfg.bind_addr = "127.0.0.1";
    fp_pair_t d = {.name = prov};
    kvs_error_t err;
    kvs_fabric_t *fa = NULL, *fb = NULL;
    if (kvs_ofi_fabric_create(&cfg, &fa, &err) != KVS_OK ||
        kvs_ofi_fabric_create(&cfg, &fb, &err) != KVS_OK) {
        fprintf(stderr, "bench_ofi_grant: %s\n", err.msg);
        return 1;
    }
    fp_side_init(&d.a, fa);
    fp_side_init(&d.b, fb);
    kvs_ofi_info_t info;
    (void)kvs_ofi_fabric_info(fa, &info);
    fp_pair_connect(&d, info.address, nap);
    if (!hw_ofi_of(fa)->grants_ok) {
        printf("bench_ofi_grant: %s: key_grant is KVS_ENOTSUP (provider not verified); "
               "measuring with grants forced on\n", info.provider);
        hw_ofi_of(fa)->grants_ok = true;
    }
    fp_region_t dst = {0}, src = {0};
    fp_region_reg(&d.a, &dst, 64 * PIECE);
    fp_region_reg(&d.b, &src, PIECE);
    const uint64_t base = (uint64_t)(uintptr_t)dst.mem;
    /* b learns dst's whole key for the `write` rounds */
    b_learn(&d, dst.rkey, base);
    uint64_t *ns = calloc((size_t)rounds, sizeof *ns);
    if (ns == NULL)
        return 1;
    printf("bench_ofi_grant: provider %s, 4 KiB, 127.0.0.1\n", info.provider);
    for (int i = 0; i < rounds; i++) {
        kvs_grant_t *g;
        uint64_t rkey;
        const uint64_t t0 = now_ns();
        if (fa->ops.key_grant(fa, d.ba, dst.mr, base + (uint64_t)(i % 64) * PIECE, PIECE, &g,
                              &rkey) != KVS_OK ||
            fa->ops.key_revoke(fa, g) != KVS_OK)
            fail_msg("grant+revoke: %s", fa->last_backend_msg);
        ns[i] = now_ns() - t0;
        settle(&d);
    }
    report("grant+revoke", ns, rounds);
    for (int i = 0; i < rounds; i++) {
        kvs_mr_t *mr;
        uint64_t rkey;
        const uint64_t t0 = now_ns();
        if (fa->ops.mr_register(fa, NULL, base, PIECE, &mr, &rkey) != KVS_OK ||
            fa->ops.mr_deregister(fa, mr) != KVS_OK)
            fail_msg("reg+dereg: %s", fa->last_backend_msg);
        ns[i] = now_ns() - t0;
        settle(&d);
    }
    report("reg+dereg", ns, rounds);
    for (int i = 0; i < rounds; i++) {
        const uint64_t t0 = now_ns();
        b_write(&d, &src, base + (uint64_t)(i % 64) * PIECE, dst.rkey);
        ns[i] = now_ns() - t0;
        settle(&d);
    }
    report("write", ns, rounds);
    for (int i = 0; i < rounds; i++) {
        kvs_grant_t *g;
        uint64_t rkey;
        const uint64_t raddr = base + (uint64_t)(i % 64) * PIECE;
        const uint64_t t0 = now_ns();
        if (fa->ops.key_grant(fa, d.ba, dst.mr, raddr, PIECE, &g, &rkey) != KVS_OK)
            fail_msg("grant: %s", fa->last_backend_msg);
        b_learn(&d, rkey, raddr);
        b_write(&d, &src, raddr, rkey);
        if (fa->ops.key_revoke(fa, g) != KVS_OK)
            fail_msg("revoke: %s", fa->last_backend_msg);
        ns[i] = now_ns() - t0;
        settle(&d);
    }
    report("grant+write", ns, rounds);
    free(ns);
    fp_region_free(&d.b, &src);
    fp_region_free(&d.a, &dst);
    fb->ops.disconnect(fb, d.ab);
    (void)kvs_ofi_fabric_destroy(fb);
    (void)kvs_ofi_fabric_destroy(fa);
    fp_side_fini(&d.b);
    fp_side_fini(&d.a);
    return 0;
}
