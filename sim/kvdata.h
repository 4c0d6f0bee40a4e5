/*
 * kvdata.h - the deterministic content of the simulated KV cache: every
 * head vector is a function of (request, global layer, K/V, global head,
 * token), so the decode side can check each byte it received without a copy
 * of what was sent. A request's aux payload is a function of the request
 * alone, its length too (sim_kvdata_aux_bytes), for the same reason.
 */
#ifndef KVS_SIM_KVDATA_H
#define KVS_SIM_KVDATA_H

#include <stddef.h>
#include <stdint.h>

#include <kvstage/sim.h>

#include "prov.h"

/* Where a vector sits: request, global layer, K (0) or V (1), global KV
 * head, token. The public type, so kvs_sim_kv_fill and kvs_sim_kv_check
 * (api_workload.c) hand it over as it is. */
typedef kvs_sim_kv_coord_t sim_kv_coord_t;

/* Writes the len bytes of the vector at c. */
void sim_kvdata_fill(uint8_t *dst, size_t len, const sim_kv_coord_t *c);
/* Number of the len bytes at src that differ from the vector at c. */
uint64_t sim_kvdata_check(const uint8_t *src, size_t len, const sim_kv_coord_t *c);

/* The same content in the provenance data mode (sim/prov.h): byte b of the
 * vector at c has origin key sim_kvdata_prov_key(request, layer, kv) and
 * offset (token * total_heads + head) * head_bytes + b, so a byte that
 * lands in the wrong slot, head, token, layer, side or request has the
 * wrong origin. */
uint64_t sim_kvdata_prov_key(uint64_t request, int64_t layer, int kv);
/* The run of `tokens` tokens from first->token, each a row of `heads`
 * consecutive global heads from first->head, laid out token-major from
 * addr (a KV pool's page run): one run, whatever the token count. */
sim_prov_run_t sim_kvdata_prov_rows(const sim_kv_coord_t *first, int64_t heads,
                                    int64_t tokens, int64_t total_heads, int64_t head_bytes,
                                    uint64_t addr);

/* The length of request's aux payload under a limit of max bytes, in
 * [0, max]: a hash of the request, not a draw of the run's streams. Every
 * run of four requests or more covers none (request % 4 == 0), a few bytes
 * (1), half the limit or more (2: more than one AUX message once max is
 * above twice KVS_WIRE_AUX_PER_MSG) and exactly max (3). */
uint32_t sim_kvdata_aux_bytes(uint64_t request, uint32_t max);
/* Its content: the vector at a coordinate no KV vector has (layer -1). */
void sim_kvdata_aux_fill(uint8_t *dst, size_t len, uint64_t request);
/* Checks a payload that arrived (aux_bytes at aux, which may be NULL when
 * aux_bytes is 0) against request's under the limit max: returns the bytes
 * wrong, a byte missing or extra counting as one that differs, and sets
 * *checked to the bytes compared (the longer of the two lengths). */
uint64_t sim_kvdata_aux_verify(uint64_t request, uint32_t max, const void *aux,
                               uint32_t aux_bytes, uint64_t *checked);

#endif
