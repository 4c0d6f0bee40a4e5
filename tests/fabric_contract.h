/*
 * fabric_contract.h - the fabric contract of kvstage/backend.h
 * (kvs_fabric_ops_t), written once and run on every fabric backend: the
 * simulated NIC (test_sim_fabric), libfabric over tcp and shm
 * (test_ofi_fabric) and over verbs (test_ofi_fabric_verbs, in the rxe VM),
 * and the verbs fabric (test_verbs_fabric, in the rxe VM). What each
 * backend has of its own (the sim's modeled time, verbs' recovery, ofi's
 * bootstrap) stays in its own test file.
 *
 * The contract, on a connected pair (tests/fabric_pair.h): messages of
 * every size arrive whole and in order both ways, each send completing in
 * order; a write with immediate lands every byte before its IMM completion
 * and completes at the writer under its wr_id; a write to a registration
 * the peer deregistered fails with KVS_EREMOTE (refused at post, or as its
 * completion) and only it: the connection carries on; a write whose source
 * leaves its registration is refused (KVS_EINVAL) with a message; a
 * disconnect is told to the peer as a DISCONNECT completion (KVS_EPEER) of
 * its connection, after which its sends fail with KVS_EPEER; and, where
 * the fabric has region-scoped keys, a grant opens exactly its range of a
 * sealed registration to its connection until it is revoked.
 */
#ifndef KVS_TESTS_FABRIC_CONTRACT_H
#define KVS_TESTS_FABRIC_CONTRACT_H

#include <stdbool.h>

#include "fabric_pair.h"

typedef struct fc_backend {
    const char *name;
    void *ctx;
    /* A connected pair in *p (a, b, ab, ba set; b connected to a), or
     * false when this machine cannot make one (a provider not offered:
     * the test skips). */
    bool (*open)(void *ctx, fp_pair_t *p);
    /* Destroys both fabrics (p->ab may be NULL: b disconnected it). */
    void (*close)(void *ctx, fp_pair_t *p);
    /* Whether key_grant and mr_register_sealed work on p's fabrics (else
     * the grant test skips); NULL: they do not. */
    bool (*grants)(void *ctx, fp_pair_t *p);
} fc_backend_t;

/* Runs the contract's tests on b as a cmocka group named for it; returns
 * the number that failed. */
int fc_run(const fc_backend_t *b);

#endif
