/*
 * device_contract.h - the device contract of kvstage/backend.h
 * (kvs_device_ops_t), written once and run on every device backend: the
 * simulated GPU (test_sim_gpu), the host device (test_host_device) and
 * CUDA (test_cuda_device, on a machine with a GPU). What each backend has
 * of its own (the sim's modeled time, the host's threads, CUDA's errors)
 * stays in its own test file.
 *
 * The contract: memory (a zero length refused, writes read back, every
 * range outside one live allocation refused with KVS_ERANGE, unknown and
 * double frees KVS_ENOENT); gather and scatter byte for byte against a
 * naive reference written here from backend.h's words (one and two
 * planes, random page lists, layer and head slices), touching nothing
 * else of the pool or the staging block; ops of one stream run in order;
 * refused descriptors (KVS_EINVAL, KVS_ERANGE with a message) change
 * nothing; events (complete on an empty stream and after the ops before
 * them, alive after their stream's destroy); wait_arm either KVS_ENOTSUP
 * or an fd that becomes readable once an op completes after the arm.
 */
#ifndef KVS_TESTS_DEVICE_CONTRACT_H
#define KVS_TESTS_DEVICE_CONTRACT_H

#include <kvstage/backend.h>

typedef struct dc_backend {
    const char *name;
    /* A new device, or NULL when this machine cannot make one (CUDA
     * without a GPU: the contract's tests skip); *ctx goes to the others. */
    kvs_device_t *(*open)(void **ctx);
    /* Lets what is queued run until ev is complete (the sim: its engine;
     * a real device: a blocking wait) and returns event_query's answer. */
    int (*wait)(void *ctx, kvs_device_t *dev, kvs_event_t *ev);
    /* Destroys the device and what ctx holds. */
    void (*close)(void *ctx, kvs_device_t *dev);
} dc_backend_t;

/* Runs the contract's tests on b as a cmocka group named for it; returns
 * the number that failed. */
int dc_run(const dc_backend_t *b);

#endif
