/*
 * fake_backend.h - a small in-test device and fabric for the core's unit
 * tests: hands out fake device addresses (no memory behind them), counts
 * live allocations and registrations so tests can assert nothing leaked, and
 * fails the Nth call of a kind on request.
 */
#ifndef KVS_TESTS_FAKE_BACKEND_H
#define KVS_TESTS_FAKE_BACKEND_H

#include <kvstage/backend.h>

#define FAKE_MAX_LIVE 64

typedef struct fake_device {
    kvs_device_t base; /* first: recovered with KVS_CONTAINER_OF */
    int alloc_fail_at; /* fail the Nth mem_alloc (1-based), 0 = never */
    int fail_status;   /* 0: fail with KVS_EBACKEND and a detail; else this
                          status, with no detail recorded */
    int alloc_calls;
    int live_allocs;
    uint64_t next_addr;
    uint64_t live[FAKE_MAX_LIVE];
    int live_streams, live_events; /* streams and events complete at once */
} fake_device_t;

typedef struct fake_fabric {
    kvs_fabric_t base;
    int register_fail_at; /* fail the Nth mr_register (1-based), 0 = never */
    int fail_status;      /* as fake_device_t's */
    int register_calls;
    int live_mrs;
    uint64_t next_rkey;
    int sealed_calls;     /* mr_register_sealed (after fake_fabric_grant_keys) */
    int seal_status;      /* what it returns instead of registering, 0 = registers */
} fake_fabric_t;

/* Binds the fakes; caps are the fabric's KVS_FABRIC_CAP_* bits. */
void fake_device_setup(fake_device_t *dev);
void fake_fabric_setup(fake_fabric_t *fab, uint32_t caps);
/* Gives fab a key_grant (which refuses every grant, KVS_EINVAL) and, with
 * seal, an mr_register_sealed, as a fabric that scopes keys has. */
void fake_fabric_grant_keys(fake_fabric_t *fab, bool seal);

#endif
