/*
 * kvdata.h - the deterministic content of the simulated KV cache: every
 * head vector is a function of (request, global layer, K/V, global head,
 * token), so the decode side can check each byte it received without a copy
 * of what was sent.
 */
#ifndef KVS_SIM_KVDATA_H
#define KVS_SIM_KVDATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct sim_kv_coord {
    uint64_t request;
    int64_t layer;   /* global layer */
    int kv;          /* 0 = K, 1 = V */
    int64_t head;    /* global KV head */
    int64_t token;   /* position in the request */
} sim_kv_coord_t;

/* Writes the len bytes of the vector at c. */
void sim_kvdata_fill(uint8_t *dst, size_t len, const sim_kv_coord_t *c);
/* Number of the len bytes at src that differ from the vector at c. */
uint64_t sim_kvdata_check(const uint8_t *src, size_t len, const sim_kv_coord_t *c);

#endif
