/*
 * test_backend.c - binding ops tables: version and size checks, required
 * slots, defaults for optional slots ("not supported", never a NULL call),
 * failure detail recorded on the instance, and the core's wrappers.
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
    kvs_mr_t *mr;
    uint64_t key = 0;
    assert_int_equal(kvs__net_register(&f, NULL, 0, 8, &mr, &key), KVS_OK);
    assert_int_equal(key, 7);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
