/*
 * wire_fixture.h - the registration both fuzz_wire.c and wire_seeds.c take
 * as "ours": the fingerprint of a valid layout (8 KV heads, head dim 128,
 * bf16, 32 layers, 16-token pages, P4 -> D2, 512-token chunks, staging), so
 * the seed REGISTER that matches it and the fuzzer's check agree by
 * construction.
 */
#ifndef KVS_FUZZ_WIRE_FIXTURE_H
#define KVS_FUZZ_WIRE_FIXTURE_H

#include "channel.h"

#include <kvstage/kvstage.h>

/* Fills *out; false if the layout is refused (a bug here, not an input). */
static inline bool wire_local_fingerprint(kvs_fingerprint_t *out)
{
    const kvs_layout_params_t params = {.total_heads = 8, .head_dim = 128,
                                        .dtype = KVS_DTYPE_BF16, .layers = 32,
                                        .page_size = 16, .prefill_tp = 4,
                                        .decode_tp = 2, .chunk_tokens = 512};
    kvs_layout_t lay;
    kvs_error_t err;
    if (kvs_layout_init(&lay, &params, &err) != KVS_OK)
        return false;
    kvs__fingerprint(&lay, KVS_PATH_STAGING, &(kvs_manager_config_t){0}, out);
    return true;
}

#endif
