/*
 * test_backend.c - binding ops tables: version and size checks (each device
 * ops version needs its own slots: a version-1 table ends at mem_read, a
 * version-2 one holds gather_parts and scatter_parts, a version-3 one
 * wait_arm; a fabric table of version 1 ends at now_ns, one of version 2
 * holds wait_arm, one of version 3 ends at peer_addr, one of version 4
 * holds key_grant and key_revoke), required slots,
 * defaults for optional slots ("not supported", never a NULL call), the
 * default fused copy of a table without parts ops (its check first, then
 * one gather / scatter per part, in order, the part's heads and staging
 * address in the descriptor), failure detail recorded on the instance, and
 * the core's wrappers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "backend.h"
#include "fake_backend.h"

static int ok_alloc(kvs_device_t *d, uint64_t n, uint64_t *a) { *a = 64; return KVS_OK; }
static int ok_free(kvs_device_t *d, uint64_t a) { return KVS_OK; }
static int ok_reg(kvs_fabric_t *f, kvs_device_t *d, uint64_t a, uint64_t n, kvs_mr_t **o,
                  uint64_t *k)
{
    *o = NULL;
    *k = 7;
    return KVS_OK;
}
static int ok_dereg(kvs_fabric_t *f, kvs_mr_t *m) { return KVS_OK; }

static const kvs_device_ops_t dev_ops = {.version = KVS_DEVICE_OPS_VERSION,
                                         .size = sizeof(kvs_device_ops_t),
                                         .name = "t-dev",
                                         .mem_alloc = ok_alloc,
                                         .mem_free = ok_free};
static const kvs_fabric_ops_t fab_ops = {.version = KVS_FABRIC_OPS_VERSION,
                                         .size = sizeof(kvs_fabric_ops_t),
                                         .name = "t-fab",
                                         .caps = KVS_FABRIC_CAP_WRITE_IMM,
                                         .mr_register = ok_reg,
                                         .mr_deregister = ok_dereg};

static void test_backend_device_defaults_not_supported(void **state)
{
    kvs_device_t d;
    assert_int_equal(kvs_device_init(&d, &dev_ops, NULL), KVS_OK);
    assert_string_equal(d.name, "t-dev");
    kvs_stream_t *s = NULL;
    kvs_event_t *e = NULL;
    kvs_copy_desc_t c = {0};
    uint8_t buf[4];
    assert_int_equal(kvs__dev_stream_create(&d, &s), KVS_ENOTSUP);
    assert_int_equal(kvs__dev_gather(&d, s, &c), KVS_ENOTSUP);
    assert_int_equal(kvs__dev_scatter(&d, s, &c), KVS_ENOTSUP);
    assert_int_equal(kvs__dev_event_record(&d, s, &e), KVS_ENOTSUP);
    assert_int_equal(kvs__dev_event_query(&d, e), KVS_ENOTSUP);
    assert_int_equal(d.ops.mem_write(&d, 0, buf, 4), KVS_ENOTSUP);
    assert_int_equal(d.ops.mem_read(&d, 0, buf, 4), KVS_ENOTSUP);
    int fd = 3;
    assert_int_equal(d.ops.wait_arm(&d, &fd), KVS_ENOTSUP);
    assert_int_equal(fd, 3); /* untouched: there is no fd */
    kvs__dev_event_destroy(&d, e);
    kvs__dev_stream_destroy(&d, s);
    uint64_t a = 0;
    assert_int_equal(kvs__dev_alloc(&d, 16, &a), KVS_OK);
    assert_int_equal(a, 64);
    assert_int_equal(kvs__dev_free(&d, a), KVS_OK);
}

static void test_backend_fabric_defaults_not_supported(void **state)
{
    kvs_fabric_t f;
    assert_int_equal(kvs_fabric_init(&f, &fab_ops, "nic0"), KVS_OK);
    assert_string_equal(f.name, "nic0");
    assert_true(kvs__net_has(&f, KVS_FABRIC_CAP_WRITE_IMM));
    assert_false(kvs__net_has(&f, KVS_FABRIC_CAP_PER_LAYER_WRITES));
    kvs_conn_t *c = NULL;
    kvs_write_desc_t w = {0};
    kvs_completion_t done;
    assert_int_equal(f.ops.connect(&f, "peer", &c), KVS_ENOTSUP);
    assert_int_equal(f.ops.write(&f, c, &w), KVS_ENOTSUP);
    assert_int_equal(f.ops.send(&f, c, "x", 1, 0), KVS_ENOTSUP);
    assert_int_equal(f.ops.poll(&f, &done, 1), KVS_ENOTSUP);
    f.ops.disconnect(&f, c);
    assert_int_equal(kvs__net_now_ns(&f), 0);
    int fd = 3;
    uint64_t wake_ns = 5;
    assert_int_equal(f.ops.wait_arm(&f, &fd, &wake_ns), KVS_ENOTSUP);
    assert_int_equal(fd, 3);
    assert_int_equal(wake_ns, 5);
    kvs_mr_t *mr;
    uint64_t key = 0;
    assert_int_equal(kvs__net_register(&f, NULL, 0, 8, &mr, &key), KVS_OK);
    assert_int_equal(key, 7);
    /* No key_grant: a decode keeps the whole ring's key (security.md). */
    kvs_grant_t *g = NULL;
    assert_false(kvs__net_can_grant(&f));
    assert_int_equal(kvs__net_key_grant(&f, c, mr, 0, 8, &g, &key), KVS_ENOTSUP);
    assert_null(g);
    assert_int_equal(kvs__net_key_revoke(&f, g), KVS_ENOTSUP);
    assert_int_equal(kvs__net_deregister(&f, mr), KVS_OK);
}

static void test_backend_rejects_bad_version_and_size(void **state)
{
    kvs_device_t d;
    kvs_fabric_t f;
    kvs_device_ops_t dv = dev_ops;
    kvs_fabric_ops_t fv = fab_ops;
    dv.version = 99;
    fv.version = 0;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EVERSION);
    dv = dev_ops;
    fv = fab_ops;
    dv.size = 8;
    fv.size = sizeof(kvs_fabric_ops_t) + 8;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EVERSION);
    assert_int_equal(kvs_device_init(NULL, &dev_ops, NULL), KVS_EINVAL);
    assert_int_equal(kvs_device_init(&d, NULL, NULL), KVS_EINVAL);
    assert_int_equal(kvs_fabric_init(NULL, &fab_ops, NULL), KVS_EINVAL);
    assert_int_equal(kvs_fabric_init(&f, NULL, NULL), KVS_EINVAL);
}

static void test_backend_rejects_missing_required_slot(void **state)
{
    kvs_device_t d;
    kvs_fabric_t f;
    kvs_device_ops_t dv = dev_ops;
    kvs_fabric_ops_t fv = fab_ops;
    dv.mem_free = NULL;
    fv.mr_register = NULL;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EINVAL);
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EINVAL);
    /* Each required slot on its own. */
    dv = dev_ops;
    fv = fab_ops;
    dv.mem_alloc = NULL;
    fv.mr_deregister = NULL;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EINVAL);
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EINVAL);
}

static void test_backend_instance_name_falls_back(void **state)
{
    kvs_device_t d;
    kvs_fabric_t f;
    kvs_device_ops_t dv = dev_ops;
    kvs_fabric_ops_t fv = fab_ops;
    /* The instance name wins over the table's. */
    assert_int_equal(kvs_device_init(&d, &dv, "gpu3"), KVS_OK);
    assert_string_equal(d.name, "gpu3");
    /* Neither given: a generic name, never NULL (messages print it). */
    dv.name = NULL;
    fv.name = NULL;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_OK);
    assert_string_equal(d.name, "device");
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_string_equal(f.name, "fabric");
    fv = fab_ops;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_string_equal(f.name, "t-fab");
}

static void test_backend_fail_records_detail(void **state)
{
    fake_device_t dev;
    fake_fabric_t fab;
    fake_device_setup(&dev);
    fake_fabric_setup(&fab, 0);
    assert_int_equal(kvs_device_fail(&dev.base,
                                     KVS_EBACKEND, 2, "oom at %d", 5), KVS_EBACKEND);
    assert_int_equal(dev.base.last_backend_code, 2);
    assert_string_equal(dev.base.last_backend_msg, "oom at 5");
    assert_int_equal(kvs_fabric_fail(&fab.base, KVS_EBACKEND, 110, "timeout"), KVS_EBACKEND);
    assert_int_equal(fab.base.last_backend_code, 110);
    assert_string_equal(fab.base.last_backend_msg, "timeout");
    /* the base is the first member: container_of gets the instance back */
    assert_ptr_equal(KVS_CONTAINER_OF(&dev.base, fake_device_t, base), &dev);
}

/* The detail on an instance describes the last failed acquiring call: a
 * later call clears it, a release call (run while unwinding) keeps it. */
static void test_backend_detail_belongs_to_last_call(void **state)
{
    fake_device_t dev;
    fake_fabric_t fab;
    fake_device_setup(&dev);
    fake_fabric_setup(&fab, 0);
    uint64_t a = 0, b = 0;
    assert_int_equal(kvs__dev_alloc(&dev.base, 64, &a), KVS_OK);
    dev.alloc_fail_at = 2;
    assert_int_equal(kvs__dev_alloc(&dev.base, 64, &b), KVS_EBACKEND);
    assert_string_equal(dev.base.last_backend_msg, "fake: out of device memory");
    assert_int_equal(kvs__dev_free(&dev.base, a), KVS_OK);
    assert_string_equal(dev.base.last_backend_msg, "fake: out of device memory");
    assert_int_equal(dev.base.last_backend_code, 2);
    dev.alloc_fail_at = 3;
    dev.fail_status = KVS_ENOMEM; /* fails without a detail */
    assert_int_equal(kvs__dev_alloc(&dev.base, 64, &b), KVS_ENOMEM);
    assert_string_equal(dev.base.last_backend_msg, "");
    assert_int_equal(dev.base.last_backend_code, 0);

    kvs_mr_t *mr = NULL;
    uint64_t key = 0;
    fab.register_fail_at = 1;
    assert_int_equal(kvs__net_register(&fab.base, &dev.base, 0, 8, &mr, &key), KVS_EBACKEND);
    assert_int_equal(fab.base.last_backend_code, 12);
    assert_int_equal(kvs__net_register(&fab.base, &dev.base, 0, 8, &mr, &key), KVS_OK);
    assert_string_equal(fab.base.last_backend_msg, "");
    assert_int_equal(fab.base.last_backend_code, 0);
    assert_int_equal(kvs__net_deregister(&fab.base, mr), KVS_OK);
    assert_int_equal(fab.live_mrs, 0);
    assert_int_equal(dev.live_allocs, 0);
}

/* ---- the default fused copy ----------------------------------------------- */

/* A device of version 1 that records every gather and scatter it is asked
 * for and refuses the fail_at-th (1-based; 0: none). */
#define REC_MAX_CALLS 8

typedef struct rec_call {
    bool scatter;
    kvs_stream_t *stream;
    kvs_copy_desc_t desc;
} rec_call_t;

typedef struct rec_device {
    kvs_device_t base;
    rec_call_t calls[REC_MAX_CALLS];
    int n;
    int fail_at;
} rec_device_t;

static int rec_copy(kvs_device_t *d, kvs_stream_t *s, const kvs_copy_desc_t *c, bool scatter)
{
    rec_device_t *r = KVS_CONTAINER_OF(d, rec_device_t, base);
    assert_true(r->n < REC_MAX_CALLS);
    r->calls[r->n++] = (rec_call_t){.scatter = scatter, .stream = s, .desc = *c};
    if (r->n == r->fail_at)
        return kvs_device_fail(d, KVS_EBACKEND, 42, "%s on rec: queue full",
                               scatter ? "scatter" : "gather");
    return KVS_OK;
}
static int rec_gather(kvs_device_t *d, kvs_stream_t *s, const kvs_copy_desc_t *c)
{
    return rec_copy(d, s, c, false);
}
static int rec_scatter(kvs_device_t *d, kvs_stream_t *s, const kvs_copy_desc_t *c)
{
    return rec_copy(d, s, c, true);
}
/* In the struct but past a version-1 table's size: never to be called. */
static int rec_parts_trap(kvs_device_t *d, kvs_stream_t *s, const kvs_copy_desc_t *c,
                          const kvs_copy_part_t *parts, int64_t n)
{
    fail_msg("a version-1 table's parts slot was called");
    return KVS_EBACKEND;
}

#define DEVICE_OPS_V1_BYTES offsetof(kvs_device_ops_t, gather_parts)
#define DEVICE_OPS_V2_BYTES offsetof(kvs_device_ops_t, wait_arm)
#define FABRIC_OPS_V1_BYTES offsetof(kvs_fabric_ops_t, wait_arm)
#define FABRIC_OPS_V3_BYTES offsetof(kvs_fabric_ops_t, key_grant)
#define FABRIC_OPS_V4_BYTES offsetof(kvs_fabric_ops_t, mr_register_sealed)
#define FABRIC_OPS_V5_BYTES offsetof(kvs_fabric_ops_t, max_write_bytes)

static const kvs_device_ops_t rec_v1_ops = {.version = 1,
                                            .size = DEVICE_OPS_V1_BYTES,
                                            .name = "rec",
                                            .mem_alloc = ok_alloc,
                                            .mem_free = ok_free,
                                            .gather = rec_gather,
                                            .scatter = rec_scatter,
                                            .gather_parts = rec_parts_trap,
                                            .scatter_parts = rec_parts_trap};

/* 4 local heads of 8 x 2 bytes, 6 tokens on pages {3, 1} of 4, layers
 * [1, +2) into slots [1, +2) of 3. Its own heads and staging address are
 * not read by a fused copy: they are poisoned. */
typedef struct rec_fx {
    rec_device_t r;
    uint64_t k[4], v[4];
    int64_t pages[2];
    kvs_copy_desc_t desc;
    kvs_stream_t *stream;
} rec_fx_t;

static void rec_fx_init(rec_fx_t *f)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(kvs_device_init(&f->r.base, &rec_v1_ops, NULL), KVS_OK);
    for (int l = 0; l < 4; l++) {
        f->k[l] = 0x100000ull * (uint64_t)(l + 1);
        f->v[l] = f->k[l] + 0x10000;
    }
    f->pages[0] = 3;
    f->pages[1] = 1;
    f->desc = (kvs_copy_desc_t){.k_base = f->k, .v_base = f->v, .local_heads = 4,
                                .head_dim = 8, .elem_bytes = 2, .page_size = 4,
                                .pages = f->pages, .num_pages = 2, .tokens = 6,
                                .head_start = -5, .num_heads = 99, .layer_begin = 1,
                                .layer_count = 2, .staging_slot_begin = 1,
                                .staging_layer_slots = 3, .staging_addr = 0};
    f->stream = (kvs_stream_t *)(void *)f; /* any pointer the copies must pass on */
}

/* Call i was a copy of f's descriptor with part p's heads and staging
 * address, on f's stream. */
static void expect_call(const rec_fx_t *f, int i, bool scatter, const kvs_copy_part_t *p)
{
    const rec_call_t *c = &f->r.calls[i];
    assert_int_equal(c->scatter, scatter);
    assert_ptr_equal(c->stream, f->stream);
    kvs_copy_desc_t want = f->desc;
    want.head_start = p->head_start;
    want.num_heads = p->num_heads;
    want.staging_addr = p->staging_addr;
    /* Every field 8 bytes wide: no padding to differ. */
    _Static_assert(sizeof(kvs_copy_desc_t) == 20 * 8, "desc fields all 8 bytes");
    if (memcmp(&c->desc, &want, sizeof want) != 0)
        fail_msg("call %d: heads [%lld, +%lld) at 0x%llx, want part [%lld, +%lld) at 0x%llx "
                 "and the rest of the descriptor unchanged",
                 i, (long long)c->desc.head_start, (long long)c->desc.num_heads,
                 (unsigned long long)c->desc.staging_addr, (long long)p->head_start,
                 (long long)p->num_heads, (unsigned long long)p->staging_addr);
}

static void test_backend_version_1_table_gets_the_default_fused_copy(void **state)
{
    rec_fx_t f;
    rec_fx_init(&f);
    kvs_device_t *d = &f.r.base;
    assert_non_null(d->ops.gather_parts);
    assert_non_null(d->ops.scatter_parts);
    assert_true(d->ops.gather_parts != rec_parts_trap);
    assert_true(d->ops.scatter_parts != rec_parts_trap);
    assert_int_equal(d->ops.version, 1);

    /* Disjoint heads, out of order, blocks of 576 bytes a head. */
    const kvs_copy_part_t sp[3] = {{2, 2, 0x3000}, {0, 1, 0x1000}, {1, 1, 0x2000}};
    assert_int_equal(kvs__dev_scatter_parts(d, f.stream, &f.desc, sp, 3), KVS_OK);
    assert_int_equal(f.r.n, 3);
    for (int i = 0; i < 3; i++)
        expect_call(&f, i, true, &sp[i]);

    /* A gather may read the same heads into blocks of their own. */
    f.r.n = 0;
    const kvs_copy_part_t gp[4] = {
        {0, 2, 0x9000}, {0, 2, 0x1000}, {3, 1, 0x5000}, {1, 3, 0x6000}};
    assert_int_equal(kvs__dev_gather_parts(d, f.stream, &f.desc, gp, 4), KVS_OK);
    assert_int_equal(f.r.n, 4);
    for (int i = 0; i < 4; i++)
        expect_call(&f, i, false, &gp[i]);
    assert_string_equal(d->last_backend_msg, "");
}

static void test_backend_default_fused_copy_refuses_before_any_copy(void **state)
{
    rec_fx_t f;
    rec_fx_init(&f);
    kvs_device_t *d = &f.r.base;
    kvs_copy_part_t p[3] = {{0, 2, 0x1000}, {1, 2, 0x2000}, {3, 1, 0x3000}};
    /* Overlapping heads in a scatter: nothing is copied, not even part 0. */
    assert_int_equal(kvs__dev_scatter_parts(d, f.stream, &f.desc, p, 3), KVS_ERANGE);
    assert_string_equal(d->last_backend_msg,
                        "scatter_parts on rec: parts 0 and 1 both write heads of [0, +2) and "
                        "[1, +2); give each part its own heads");
    assert_int_equal(f.r.n, 0);
    /* Overlapping staging blocks in a gather (1152 bytes for 2 heads). */
    p[1] = (kvs_copy_part_t){2, 1, 0x1000 + 1151};
    assert_int_equal(kvs__dev_gather_parts(d, f.stream, &f.desc, p, 3), KVS_ERANGE);
    assert_non_null(strstr(d->last_backend_msg, "gather_parts on rec: parts 0 and 1 write "
                                                "overlapping staging blocks"));
    assert_int_equal(f.r.n, 0);
    /* A bad last part stops the first ones too. */
    p[1].staging_addr = 0x2000;
    p[2].num_heads = 2;
    assert_int_equal(kvs__dev_gather_parts(d, f.stream, &f.desc, p, 3), KVS_ERANGE);
    assert_non_null(strstr(d->last_backend_msg, "gather_parts part 2 on rec: heads [3, +2)"));
    assert_int_equal(f.r.n, 0);
    /* Counts and NULLs. */
    assert_int_equal(kvs__dev_scatter_parts(d, f.stream, &f.desc, p, 0), KVS_EINVAL);
    assert_non_null(strstr(d->last_backend_msg, "pass 1 to 1024 parts"));
    assert_int_equal(kvs__dev_scatter_parts(d, f.stream, NULL, p, 1), KVS_EINVAL);
    assert_non_null(strstr(d->last_backend_msg, "descriptor is NULL"));
    assert_int_equal(kvs__dev_gather_parts(d, f.stream, &f.desc, NULL, 1), KVS_EINVAL);
    assert_non_null(strstr(d->last_backend_msg, "parts is NULL"));
    assert_int_equal(f.r.n, 0);
    /* The next call's success clears the detail. */
    p[2].num_heads = 1;
    assert_int_equal(kvs__dev_gather_parts(d, f.stream, &f.desc, p, 3), KVS_OK);
    assert_string_equal(d->last_backend_msg, "");
    assert_int_equal(f.r.n, 3);
}

static void test_backend_default_fused_copy_stops_at_a_refused_part(void **state)
{
    rec_fx_t f;
    rec_fx_init(&f);
    kvs_device_t *d = &f.r.base;
    const kvs_copy_part_t p[3] = {{0, 1, 0x1000}, {1, 1, 0x2000}, {2, 2, 0x3000}};
    /* The backend refuses part 1: part 2 is never asked for, part 0 stays
     * enqueued (as backend.h says), and the detail names the part. */
    f.r.fail_at = 2;
    assert_int_equal(kvs__dev_scatter_parts(d, f.stream, &f.desc, p, 3), KVS_EBACKEND);
    assert_int_equal(f.r.n, 2);
    expect_call(&f, 0, true, &p[0]);
    expect_call(&f, 1, true, &p[1]);
    assert_string_equal(d->last_backend_msg, "scatter_parts part 1: scatter on rec: queue full");
    assert_int_equal(d->last_backend_code, 42);
}

static int grant_trap(kvs_fabric_t *f, kvs_conn_t *c, kvs_mr_t *mr, uint64_t addr,
                      uint64_t len, kvs_grant_t **out, uint64_t *rkey)
{
    fail_msg("a version-3 table's key_grant slot was called");
    return KVS_EBACKEND;
}

static int grant_ok(kvs_fabric_t *f, kvs_conn_t *c, kvs_mr_t *mr, uint64_t addr,
                    uint64_t len, kvs_grant_t **out, uint64_t *rkey)
{
    *out = (kvs_grant_t *)(void *)f;
    *rkey = addr + len;
    return KVS_OK;
}

static int revoke_ok(kvs_fabric_t *f, kvs_grant_t *g) { return g == (void *)f ? KVS_OK : KVS_ENOENT; }

/* A fabric table of version 3 (it ends at peer_addr) binds with key_grant
 * / key_revoke defaults, whatever its struct holds past its size; version
 * 4 must hold both and keeps them. */
static void test_backend_version_3_fabric_gets_no_key_grant(void **state)
{
    kvs_fabric_ops_t fv = fab_ops;
    fv.version = 3;
    fv.size = FABRIC_OPS_V3_BYTES;
    fv.key_grant = grant_trap;
    kvs_fabric_t f;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_false(kvs__net_can_grant(&f));
    kvs_grant_t *g = NULL;
    uint64_t key = 0;
    assert_int_equal(kvs__net_key_grant(&f, NULL, NULL, 0, 8, &g, &key), KVS_ENOTSUP);
    assert_int_equal(kvs__net_key_revoke(&f, g), KVS_ENOTSUP);
    fv.version = 4;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EVERSION);
    fv.size = FABRIC_OPS_V4_BYTES - sizeof(void *);
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EVERSION);
    fv.size = FABRIC_OPS_V4_BYTES;
    fv.key_grant = grant_ok;
    fv.key_revoke = revoke_ok;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_true(kvs__net_can_grant(&f));
    assert_int_equal(kvs__net_key_grant(&f, NULL, NULL, 16, 8, &g, &key), KVS_OK);
    assert_int_equal(key, 24);
    assert_int_equal(kvs__net_key_revoke(&f, g), KVS_OK);
}

static int seal_trap(kvs_fabric_t *f, kvs_device_t *d, uint64_t addr, uint64_t len,
                     kvs_mr_t **out, uint64_t *rkey)
{
    fail_msg("a version-4 table's mr_register_sealed slot was called");
    return KVS_EBACKEND;
}

static int seal_ok(kvs_fabric_t *f, kvs_device_t *d, uint64_t addr, uint64_t len,
                   kvs_mr_t **out, uint64_t *rkey)
{
    *out = (kvs_mr_t *)(void *)f;
    *rkey = addr ^ len;
    return KVS_OK;
}

/* Version 5 adds mr_register_sealed: a version-4 table binds without it
 * (KVS_ENOTSUP: the decode registers its ring as before), whatever lies
 * past its size; a version-5 table must hold it and keeps it. */
static void test_backend_version_4_fabric_gets_no_sealed_register(void **state)
{
    kvs_fabric_ops_t fv = fab_ops;
    fv.version = 4;
    fv.size = FABRIC_OPS_V4_BYTES;
    fv.key_grant = grant_ok;
    fv.key_revoke = revoke_ok;
    fv.mr_register_sealed = seal_trap;
    kvs_fabric_t f;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_true(kvs__net_can_grant(&f));
    kvs_mr_t *mr = NULL;
    uint64_t key = 0;
    assert_int_equal(kvs__net_register_sealed(&f, NULL, 64, 8, &mr, &key), KVS_ENOTSUP);
    assert_null(mr);
    fv.version = 5;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EVERSION);
    fv.size = sizeof(kvs_fabric_ops_t);
    fv.mr_register_sealed = seal_ok;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_int_equal(kvs__net_register_sealed(&f, NULL, 64, 8, &mr, &key), KVS_OK);
    assert_ptr_equal(mr, &f);
    assert_int_equal(key, 64 ^ 8);
}

/* Version 4 adds no slot: it says the copies read the descriptor's
 * planes. A copy of one plane per layer (MLA) never reaches an older table
 * (it would copy a V from v_base); a version-4 table gets it as it is. */
static void test_backend_one_plane_copy_needs_version_4(void **state)
{
    rec_fx_t f;
    rec_fx_init(&f); /* a version-1 table */
    kvs_device_t *d = &f.r.base;
    kvs_copy_desc_t one = f.desc;
    one.planes = 1;
    one.v_base = NULL;
    one.head_start = 0;
    one.num_heads = 4;
    assert_false(kvs__dev_has_planes(d));
    assert_int_equal(kvs__dev_gather(d, f.stream, &one), KVS_ENOTSUP);
    assert_non_null(strstr(d->last_backend_msg, "device ops version 4"));
    assert_int_equal(kvs__dev_scatter(d, f.stream, &one), KVS_ENOTSUP);
    const kvs_copy_part_t p = {0, 4, 0x1000};
    assert_int_equal(kvs__dev_gather_parts(d, f.stream, &one, &p, 1), KVS_ENOTSUP);
    assert_int_equal(kvs__dev_scatter_parts(d, f.stream, &one, &p, 1), KVS_ENOTSUP);
    assert_int_equal(f.r.n, 0); /* nothing reached the backend */
    /* Two planes still go to it. */
    one.planes = 0;
    one.v_base = f.v;
    assert_int_equal(kvs__dev_gather(d, f.stream, &one), KVS_OK);
    assert_int_equal(f.r.n, 1);

    kvs_device_ops_t v4 = rec_v1_ops;
    v4.version = 4;
    v4.size = sizeof(kvs_device_ops_t);
    v4.gather_parts = NULL;
    v4.scatter_parts = NULL;
    assert_int_equal(kvs_device_init(d, &v4, NULL), KVS_OK);
    assert_true(kvs__dev_has_planes(d));
    f.r.n = 0;
    one.planes = 1;
    one.v_base = NULL;
    assert_int_equal(kvs__dev_gather(d, f.stream, &one), KVS_OK);
    assert_int_equal(f.r.n, 1);
    assert_int_equal(f.r.calls[0].desc.planes, 1);
}

/* Device ops version 5 says the copies read the scale planes. A copy with
 * scales never reaches an older table (version 4 here): it would move the
 * KV rows and leave the scales behind. */
static void test_backend_scale_copy_needs_version_5(void **state)
{
    rec_fx_t f;
    rec_fx_init(&f);
    kvs_device_t *d = &f.r.base;
    kvs_device_ops_t v4 = rec_v1_ops;
    v4.version = 4;
    v4.size = sizeof(kvs_device_ops_t);
    v4.gather_parts = NULL;
    v4.scatter_parts = NULL;
    assert_int_equal(kvs_device_init(d, &v4, NULL), KVS_OK);
    assert_false(kvs__dev_has_scales(d));
    uint64_t ks[4] = {0}, vs[4] = {0};
    kvs_copy_desc_t one = f.desc;
    one.head_start = 0;
    one.num_heads = 4;
    one.ks_base = ks;
    one.vs_base = vs;
    one.scale_bytes = 4;
    assert_int_equal(kvs__dev_gather(d, f.stream, &one), KVS_ENOTSUP);
    assert_non_null(strstr(d->last_backend_msg, "device ops version 5"));
    assert_non_null(strstr(d->last_backend_msg, "kv_scales"));
    assert_int_equal(kvs__dev_scatter(d, f.stream, &one), KVS_ENOTSUP);
    const kvs_copy_part_t p = {0, 4, 0x1000};
    assert_int_equal(kvs__dev_gather_parts(d, f.stream, &one, &p, 1), KVS_ENOTSUP);
    assert_int_equal(kvs__dev_scatter_parts(d, f.stream, &one, &p, 1), KVS_ENOTSUP);
    assert_int_equal(f.r.n, 0); /* nothing reached the backend */
    /* Without scales it still goes. */
    one.scale_bytes = 0;
    assert_int_equal(kvs__dev_gather(d, f.stream, &one), KVS_OK);
    assert_int_equal(f.r.n, 1);

    kvs_device_ops_t v5 = v4;
    v5.version = 5;
    assert_int_equal(kvs_device_init(d, &v5, NULL), KVS_OK);
    assert_true(kvs__dev_has_scales(d));
    f.r.n = 0;
    one.scale_bytes = 4;
    assert_int_equal(kvs__dev_scatter(d, f.stream, &one), KVS_OK);
    assert_int_equal(f.r.n, 1);
    assert_int_equal(f.r.calls[0].desc.scale_bytes, 4);
}

static void test_backend_version_sizes(void **state)
{
    kvs_device_t d;
    kvs_device_ops_t dv = dev_ops;
    /* Version 1 ends at mem_read: one byte less is refused. */
    dv.version = 1;
    dv.size = DEVICE_OPS_V1_BYTES;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_OK);
    dv.size = DEVICE_OPS_V1_BYTES - 1;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    /* A version-1 table whose size reaches past mem_read binds, but slots
     * a later version added are never taken from it: the defaults run. */
    kvs_device_ops_t big_v1 = rec_v1_ops;
    big_v1.size = sizeof(kvs_device_ops_t);
    assert_int_equal(kvs_device_init(&d, &big_v1, NULL), KVS_OK);
    assert_true(d.ops.gather_parts != rec_parts_trap);
    assert_true(d.ops.scatter_parts != rec_parts_trap);
    assert_non_null(d.ops.gather_parts);
    /* Version 2 must hold its parts slots: a version-1 size, or one slot
     * short, is refused. */
    dv.version = 2;
    dv.size = DEVICE_OPS_V1_BYTES;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    dv.size = DEVICE_OPS_V2_BYTES - sizeof(void *);
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    dv.size = DEVICE_OPS_V2_BYTES;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_OK);
    /* Version 3 must hold wait_arm: a version-2 size is refused. */
    dv.version = 3;
    dv.size = DEVICE_OPS_V2_BYTES;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    dv.size = sizeof(kvs_device_ops_t) + 1;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    dv.size = sizeof(kvs_device_ops_t);
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_OK);
    /* Version 4 adds no slot: version 3's size. */
    dv.version = 4;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_OK);
    assert_int_equal(d.ops.version, 4);
    dv.size = DEVICE_OPS_V2_BYTES;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    dv.size = sizeof(kvs_device_ops_t);
    /* No table of a version this core does not know binds. */
    dv.version = KVS_DEVICE_OPS_VERSION + 1;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
    dv.version = 0;
    dv.size = DEVICE_OPS_V1_BYTES;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_EVERSION);
}

/* wait_arm slots a table of an older version holds in its struct but not
 * in its size: never to be called. */
static int dev_wait_trap(kvs_device_t *d, int *fd)
{
    fail_msg("wait_arm of a table older than version 3 was called");
    return KVS_EBACKEND;
}
static int fab_wait_trap(kvs_fabric_t *f, int *fd, uint64_t *wake_ns)
{
    fail_msg("wait_arm of a fabric table of version 1 was called");
    return KVS_EBACKEND;
}
static int dev_wait_fd(kvs_device_t *d, int *fd)
{
    *fd = 41;
    return KVS_OK;
}
static int fab_wait_fd(kvs_fabric_t *f, int *fd, uint64_t *wake_ns)
{
    *fd = 42;
    *wake_ns = 1000;
    return KVS_OK;
}

static void test_backend_older_tables_bind_without_wait_arm(void **state)
{
    /* A device table of version 2 (ends at scatter_parts) and a fabric
     * table of version 1 (ends at now_ns) still bind; their wait_arm is the
     * default, whatever their struct holds past their size. */
    kvs_device_ops_t dv = dev_ops;
    dv.version = 2;
    dv.size = DEVICE_OPS_V2_BYTES;
    dv.wait_arm = dev_wait_trap;
    kvs_device_t d;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_OK);
    int fd = -1;
    assert_int_equal(d.ops.wait_arm(&d, &fd), KVS_ENOTSUP);
    kvs_fabric_ops_t fv = fab_ops;
    fv.version = 1;
    fv.size = FABRIC_OPS_V1_BYTES;
    fv.wait_arm = fab_wait_trap;
    kvs_fabric_t f;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    uint64_t wake_ns = 0;
    assert_int_equal(f.ops.wait_arm(&f, &fd, &wake_ns), KVS_ENOTSUP);
    /* Version 2 must hold wait_arm: a version-1 size is refused. */
    fv.version = 2;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EVERSION);
    /* Tables of today's versions keep the slot they fill. */
    dv = dev_ops;
    dv.wait_arm = dev_wait_fd;
    assert_int_equal(kvs_device_init(&d, &dv, NULL), KVS_OK);
    assert_int_equal(d.ops.wait_arm(&d, &fd), KVS_OK);
    assert_int_equal(fd, 41);
    fv = fab_ops;
    fv.wait_arm = fab_wait_fd;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_int_equal(f.ops.wait_arm(&f, &fd, &wake_ns), KVS_OK);
    assert_int_equal(fd, 42);
    assert_int_equal(wake_ns, 1000);
}

static uint64_t write_limit_trap(kvs_fabric_t *f)
{
    fail_msg("max_write_bytes of a fabric table of version 5 was called");
    return 1;
}
static uint64_t write_limit_4k(kvs_fabric_t *f) { return 4096; }
static uint64_t write_limit_zero(kvs_fabric_t *f) { return 0; }

/* Version 6 adds max_write_bytes: a version-5 table binds without it (no
 * limit, one write per block as before), whatever lies past its size; a
 * version-6 table keeps it, and a 0 it answers reads as no limit. */
static void test_backend_version_5_fabric_has_no_write_limit(void **state)
{
    kvs_fabric_ops_t fv = fab_ops;
    fv.version = 5;
    fv.size = FABRIC_OPS_V5_BYTES;
    fv.max_write_bytes = write_limit_trap;
    kvs_fabric_t f;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_int_equal(kvs__net_max_write_bytes(&f), UINT64_MAX);
    fv.version = 6;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_EVERSION);
    fv.size = sizeof(kvs_fabric_ops_t);
    fv.max_write_bytes = write_limit_4k;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_int_equal(kvs__net_max_write_bytes(&f), 4096);
    fv.max_write_bytes = write_limit_zero;
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_int_equal(kvs__net_max_write_bytes(&f), UINT64_MAX);
    fv.max_write_bytes = NULL; /* optional: the default */
    assert_int_equal(kvs_fabric_init(&f, &fv, NULL), KVS_OK);
    assert_int_equal(kvs__net_max_write_bytes(&f), UINT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_device_defaults_not_supported),
        cmocka_unit_test(test_backend_fabric_defaults_not_supported),
        cmocka_unit_test(test_backend_rejects_bad_version_and_size),
        cmocka_unit_test(test_backend_rejects_missing_required_slot),
        cmocka_unit_test(test_backend_instance_name_falls_back),
        cmocka_unit_test(test_backend_fail_records_detail),
        cmocka_unit_test(test_backend_detail_belongs_to_last_call),
        cmocka_unit_test(test_backend_version_1_table_gets_the_default_fused_copy),
        cmocka_unit_test(test_backend_default_fused_copy_refuses_before_any_copy),
        cmocka_unit_test(test_backend_default_fused_copy_stops_at_a_refused_part),
        cmocka_unit_test(test_backend_one_plane_copy_needs_version_4),
        cmocka_unit_test(test_backend_scale_copy_needs_version_5),
        cmocka_unit_test(test_backend_version_sizes),
        cmocka_unit_test(test_backend_older_tables_bind_without_wait_arm),
        cmocka_unit_test(test_backend_version_3_fabric_gets_no_key_grant),
        cmocka_unit_test(test_backend_version_4_fabric_gets_no_sealed_register),
        cmocka_unit_test(test_backend_version_5_fabric_has_no_write_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
