/*
 * manager.h (internal) - the KV manager's state, shared by manager.c (init
 * steps and their guards) and decode.c (the decode handler made from it).
 */
#ifndef KVS_SRC_MANAGER_H
#define KVS_SRC_MANAGER_H

#include "backend.h"

struct kvs_manager {
    kvs_manager_config_t cfg;  /* defaults applied */
    kvs_device_t *dev;         /* borrowed */
    kvs_fabric_t *fab;         /* borrowed */
    kvs_log_t log;
    kvs_error_t err;           /* detail of the last error */

    int64_t total_heads;       /* as set; 0 = unknown */
    int64_t heads_per_rank;

    /* Staging memory: decode 1 ring, prefill one buffer per worker. */
    uint32_t staging_count;    /* 0 until init_staging succeeded */
    uint64_t staging_bytes;    /* bytes of each buffer */
    uint64_t *staging_addr;    /* [cfg.transfer_workers or 1] */
    kvs_mr_t **staging_mr;     /* same length; NULL until registered */
    uint64_t *staging_rkey;
    bool registered;
    kvs_ring_t *ring;          /* decode only */

    /* Published KV buffers (copies of the caller's arrays). */
    bool kv_published;
    kvs_kv_buffers_t kv;
    uint64_t *k_base, *v_base;

    kvs_layout_t layout;       /* valid once a handler exists */
    kvs_decode_t *decode;      /* the live decode handler, if any */
};

/* The layout params this manager's config describes (this side plus peer). */
kvs_layout_params_t kvs__manager_layout_params(const kvs_manager_t *m);

#endif
