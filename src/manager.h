/*
 * manager.h (internal) - the KV manager's state, shared by manager.c (init
 * steps and their guards) and decode.c (the decode handler made from it).
 */
#ifndef KVS_SRC_MANAGER_H
#define KVS_SRC_MANAGER_H

#include "backend.h"
#include "auth.h"
#include "error.h"

/* Records an error on the manager's own detail and returns its status. */
#define KVS__MFAIL(m, status, ...) KVS__FAIL(&(m)->err, (status), __VA_ARGS__)

struct kvs_manager {
    kvs_manager_config_t cfg;  /* defaults applied */
    uint64_t rto_floor_ns;     /* the control links' first and lowest
                                  retransmission timeout (kvstage.h,
                                  retry_timeout_ns) */
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
    bool staging_sealed;       /* registered with mr_register_sealed: its own key
                                  opens nothing remote, only grants do */
    kvs_ring_t *ring;          /* decode only */

    /* Published KV buffers (copies of the caller's arrays). */
    bool kv_published;
    kvs_kv_buffers_t kv;
    uint64_t *k_base, *v_base;  /* v_base NULL with one plane per layer (MLA) */
    uint64_t *ks_base, *vs_base; /* scale buffers (kv_scales), else NULL */
    uint64_t *state_base;       /* state buffers (state layers), else NULL */
    uint64_t *draft_k_base, *draft_v_base; /* a draft's buffers (draft_layers),
                                              else NULL; V NULL for MLA */
    int64_t scale_bytes;        /* one head's scales in a token row, 0: none */

    kvs_layout_t layout;       /* valid once a handler exists */
    kvs_path_t path;           /* resolved, valid once a handler exists */
    void *handler;             /* the live decode or prefill handler, if any */
    kvs__secret_t secret;      /* the cluster secret (len 0: open); wiped at destroy */
};

/* kvs_manager_set_kv_layers with the buffers beside the layers' own:
 * more's state_base and state_slots (state layers) and draft_k_base and
 * draft_v_base (a draft model); its other fields are not read. */
int kvs__manager_set_kv_layers(kvs_manager_t *m, const kvs_kv_layer_t *layers,
                               int64_t num_layers, int64_t local_heads,
                               const kvs_kv_buffers_t *more);

/* The layout params of the pair of this rank with a peer instance of TP
 * peer_tp and PP peer_pp. The prefill's CP size: on a decode the peer
 * instance's, peer_cp (0: 1); on a prefill its own (context_parallel),
 * peer_cp unused. */
kvs_layout_params_t kvs__manager_layout_params(const kvs_manager_t *m, int64_t peer_tp,
                                               int64_t peer_pp, int64_t peer_cp);
/* The layout and path of that pair, checked against this rank (its heads,
 * the path setting). On error m->err names what to change. */
int kvs__manager_pair(kvs_manager_t *m, int64_t peer_tp, int64_t peer_pp, int64_t peer_cp,
                      kvs_layout_t *lay, kvs_path_t *path);

/* The guards every handler creation runs (spec §8): role, one handler per
 * manager, staging memory initialised and registered, KV buffers published,
 * heads resolvable, layout and path valid. Fills *lay and *path. */
int kvs__manager_handler_check(kvs_manager_t *m, kvs_role_t role, kvs_layout_t *lay,
                               kvs_path_t *path);
/* Runs the guards, then allocates a zeroed handler of `bytes` and attaches
 * it to the manager (layout, path and handler set). NULL with *rc and
 * m->err on failure; *rc is KVS_EINVAL for a NULL manager. */
void *kvs__manager_handler_new(kvs_manager_t *m, kvs_role_t role, size_t bytes, int *rc);

/* The KV layer buffers of this rank opened to the fabric (direct and slice
 * paths): per layer, the K and V registrations and their remote keys. */
typedef struct kvs__kv_keys {
    kvs_mr_t **k_mr, **v_mr;
    uint64_t *k_rkey, *v_rkey;
    kvs_mr_t **ks_mr, **vs_mr; /* the scale buffers' (kv_scales), else NULL */
    uint64_t *ks_rkey, *vs_rkey;
} kvs__kv_keys_t;

/* Registers every K and V layer buffer (and with kv_scales their scale
 * buffers), all or nothing: on error *keys is left zeroed and m->err says
 * why. */
int kvs__manager_open_kv(kvs_manager_t *m, kvs__kv_keys_t *keys);
/* Deregisters and frees; a zeroed *keys is a no-op. */
void kvs__manager_close_kv(kvs_manager_t *m, kvs__kv_keys_t *keys);
/* Bytes of one KV layer buffer (K or V) of this rank. */
uint64_t kvs__manager_layer_bytes(const kvs_manager_t *m);

#endif
