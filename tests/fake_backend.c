/*
 * fake_backend.c - the fake device and fabric of fake_backend.h. Device
 * addresses are counters, never dereferenced; registrations are heap cells
 * so LeakSanitizer also sees a leaked registration.
 */
#include "fake_backend.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct kvs_mr {
    uint64_t addr, len_bytes;
};

static int fake_mem_alloc(kvs_device_t *base, uint64_t len_bytes, uint64_t *out)
{
    fake_device_t *d = KVS_CONTAINER_OF(base, fake_device_t, base);
    d->alloc_calls++;
    if (d->alloc_fail_at != 0 && d->alloc_calls == d->alloc_fail_at)
        return d->fail_status != 0 ? d->fail_status
                                   : kvs_device_fail(base, KVS_EBACKEND, 2,
                                                     "fake: out of device memory");
    for (int i = 0; i < FAKE_MAX_LIVE; i++) {
        if (d->live[i] == 0) {
            d->live[i] = d->next_addr;
            *out = d->next_addr;
            d->next_addr += len_bytes + 4096;
            d->live_allocs++;
            return KVS_OK;
        }
    }
    return kvs_device_fail(base, KVS_EBACKEND, 3, "fake: too many live allocations");
}

static int fake_mem_free(kvs_device_t *base, uint64_t addr)
{
    fake_device_t *d = KVS_CONTAINER_OF(base, fake_device_t, base);
    for (int i = 0; i < FAKE_MAX_LIVE; i++) {
        if (d->live[i] == addr && addr != 0) {
            d->live[i] = 0;
            d->live_allocs--;
            return KVS_OK;
        }
    }
    return KVS_ENOENT;
}

struct kvs_stream {
    int unused;
};
struct kvs_event {
    int unused;
};

static int fake_stream_create(kvs_device_t *base, kvs_stream_t **out)
{
    fake_device_t *d = KVS_CONTAINER_OF(base, fake_device_t, base);
    *out = malloc(sizeof **out);
    if (*out == NULL)
        return KVS_ENOMEM;
    d->live_streams++;
    return KVS_OK;
}

static void fake_stream_destroy(kvs_device_t *base, kvs_stream_t *s)
{
    KVS_CONTAINER_OF(base, fake_device_t, base)->live_streams--;
    free(s);
}

static int fake_event_record(kvs_device_t *base, kvs_stream_t *s, kvs_event_t **out)
{
    fake_device_t *d = KVS_CONTAINER_OF(base, fake_device_t, base);
    *out = malloc(sizeof **out);
    if (*out == NULL)
        return KVS_ENOMEM;
    d->live_events++;
    return KVS_OK;
}

static int fake_event_query(kvs_device_t *base, kvs_event_t *e) { return KVS_OK; }

static void fake_event_destroy(kvs_device_t *base, kvs_event_t *e)
{
    KVS_CONTAINER_OF(base, fake_device_t, base)->live_events--;
    free(e);
}

static const kvs_device_ops_t fake_device_ops = {
    .version = KVS_DEVICE_OPS_VERSION,
    .size = sizeof(kvs_device_ops_t),
    .name = "fake-device",
    .mem_alloc = fake_mem_alloc,
    .mem_free = fake_mem_free,
    .stream_create = fake_stream_create,
    .stream_destroy = fake_stream_destroy,
    .event_record = fake_event_record,
    .event_query = fake_event_query,
    .event_destroy = fake_event_destroy,
};

static int fake_mr_register(kvs_fabric_t *base, kvs_device_t *dev, uint64_t addr,
                            uint64_t len_bytes, kvs_mr_t **out, uint64_t *rkey)
{
    fake_fabric_t *f = KVS_CONTAINER_OF(base, fake_fabric_t, base);
    f->register_calls++;
    if (f->register_fail_at != 0 && f->register_calls == f->register_fail_at)
        return f->fail_status != 0 ? f->fail_status
                                   : kvs_fabric_fail(base, KVS_EBACKEND, 12,
                                                     "fake: cannot pin memory");
    kvs_mr_t *mr = malloc(sizeof *mr);
    if (mr == NULL)
        return KVS_ENOMEM;
    mr->addr = addr;
    mr->len_bytes = len_bytes;
    *out = mr;
    *rkey = ++f->next_rkey;
    f->live_mrs++;
    return KVS_OK;
}

static int fake_mr_deregister(kvs_fabric_t *base, kvs_mr_t *mr)
{
    fake_fabric_t *f = KVS_CONTAINER_OF(base, fake_fabric_t, base);
    assert(mr != NULL);
    free(mr);
    f->live_mrs--;
    return KVS_OK;
}

static const kvs_fabric_ops_t fake_fabric_ops = {
    .version = KVS_FABRIC_OPS_VERSION,
    .size = sizeof(kvs_fabric_ops_t),
    .name = "fake-fabric",
    .caps = 0,
    .mr_register = fake_mr_register,
    .mr_deregister = fake_mr_deregister,
};

void fake_device_setup(fake_device_t *dev)
{
    memset(dev, 0, sizeof *dev);
    int rc = kvs_device_init(&dev->base, &fake_device_ops, NULL);
    assert(rc == KVS_OK);
    (void)rc;
    dev->next_addr = 0x100000000ull;
}

static int fake_key_grant(kvs_fabric_t *base, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                          uint64_t len_bytes, kvs_grant_t **out, uint64_t *rkey)
{
    return kvs_fabric_fail(base, KVS_EINVAL, 0, "fake: grants nothing");
}

static int fake_mr_register_sealed(kvs_fabric_t *base, kvs_device_t *dev, uint64_t addr,
                                   uint64_t len_bytes, kvs_mr_t **out, uint64_t *rkey)
{
    fake_fabric_t *f = KVS_CONTAINER_OF(base, fake_fabric_t, base);
    f->sealed_calls++;
    if (f->seal_status != 0)
        return f->seal_status;
    f->register_calls--; /* counted as a sealed registration only */
    return fake_mr_register(base, dev, addr, len_bytes, out, rkey);
}

void fake_fabric_grant_keys(fake_fabric_t *fab, bool seal)
{
    fab->base.ops.key_grant = fake_key_grant;
    if (seal)
        fab->base.ops.mr_register_sealed = fake_mr_register_sealed;
}

void fake_fabric_setup(fake_fabric_t *fab, uint32_t caps)
{
    memset(fab, 0, sizeof *fab);
    int rc = kvs_fabric_init(&fab->base, &fake_fabric_ops, NULL);
    assert(rc == KVS_OK);
    (void)rc;
    fab->base.ops.caps = caps;
}
