/*
 * gpu.h - a simulated GPU: a kvstage device backend whose device memory is
 * real host memory, with streams and events on the engine's virtual clock.
 * gather and scatter really copy the bytes; each takes modeled time
 * (launch latency + bytes read and written / HBM bandwidth) and its bytes
 * become visible when it completes. Allocation fails cleanly once the
 * simulated HBM capacity is used up.
 *
 * Device addresses are (gpu id + 1) << 44 | offset in a per-GPU address
 * space, never host pointers; sim_gpu_host translates them for the fabric
 * and for verification.
 *
 * Data modes: in the bytes mode (the default) memory is host memory as
 * above. In the provenance mode it holds no bytes: one provenance map
 * (sim/prov.h) per GPU says where each byte came from, and gathers,
 * scatters and fabric writes move runs of it; the same descriptors are
 * checked, walked and timed the same way, so a run's events, times and
 * digest do not depend on the mode. mem_write and mem_read, which carry
 * host bytes, are not supported there.
 */
#ifndef KVS_SIM_GPU_H
#define KVS_SIM_GPU_H

#include <kvstage/backend.h>

#include "engine.h"
#include "prov.h"
#include "trace.h"

typedef struct sim_gpu sim_gpu_t;

/* What simulated memory holds (sim_gpu_config_t.data_mode). */
typedef enum sim_data_mode {
    SIM_DATA_BYTES = 0,      /* host memory, every byte */
    SIM_DATA_PROVENANCE = 1  /* a provenance map: where each byte came from */
} sim_data_mode_t;

typedef struct sim_gpu_config {
    uint64_t hbm_bytes;          /* capacity, 0 -> 141 GiB (H200) */
    uint64_t hbm_bytes_per_s;    /* 0 -> 4.8e12 (H200 HBM3e) */
    uint64_t launch_ns;          /* per kernel launch, 0 -> 5000 */
    uint32_t max_allocs;         /* live allocations, 0 -> 4096 */
    uint32_t max_streams;        /* 0 -> 64 */
    uint32_t max_events;         /* live events, 0 -> 65536 */
    uint32_t data_mode;          /* sim_data_mode_t, 0 = bytes */
} sim_gpu_config_t;

/* Called (from an engine event) whenever a stream operation completes, so
 * the owner can poll its events. */
typedef void (*sim_gpu_wake_fn)(void *ctx);

int sim_gpu_create(sim_engine_t *eng, const sim_gpu_config_t *cfg, uint32_t gpu_id,
                   sim_gpu_t **out);
/* Frees the GPU and all memory still allocated on it. */
void sim_gpu_destroy(sim_gpu_t *gpu);
kvs_device_t *sim_gpu_device(sim_gpu_t *gpu);
/* The sim_gpu behind a device made by sim_gpu_create, or NULL. */
sim_gpu_t *sim_gpu_from_device(kvs_device_t *dev);
void sim_gpu_set_wake(sim_gpu_t *gpu, sim_gpu_wake_fn fn, void *ctx);
uint32_t sim_gpu_id(const sim_gpu_t *gpu);
/* Host pointer of [addr, addr + len) if it lies inside one live allocation,
 * else NULL. */
uint8_t *sim_gpu_host(sim_gpu_t *gpu, uint64_t addr, uint64_t len_bytes);
/* [addr, addr + len) lies inside one live allocation (either mode). */
bool sim_gpu_in_mem(const sim_gpu_t *gpu, uint64_t addr, uint64_t len_bytes);
sim_data_mode_t sim_gpu_data_mode(const sim_gpu_t *gpu);
/* The provenance map of a GPU in the provenance mode, else NULL. Its
 * addresses are the GPU's device addresses. */
sim_prov_map_t *sim_gpu_prov(sim_gpu_t *gpu);
/* Copies len bytes (or their provenance) from src's saddr to dst's daddr,
 * both checked with sim_gpu_in_mem by the caller; the GPUs share a data
 * mode. What a fabric write does when a segment lands. */
int sim_gpu_move(sim_gpu_t *dst, uint64_t daddr, sim_gpu_t *src, uint64_t saddr,
                 uint64_t len_bytes);
uint64_t sim_gpu_used_bytes(const sim_gpu_t *gpu);
/* Simulated busy time of all copies so far, and bytes copied. */
uint64_t sim_gpu_copy_ns(const sim_gpu_t *gpu);
uint64_t sim_gpu_copy_bytes(const sim_gpu_t *gpu);
/* Reports every finished gather/scatter as a span on thread "gpu". */
void sim_gpu_set_span(sim_gpu_t *gpu, sim_span_fn fn, void *ctx);
/* Fault hook: multiplies the modeled time of scatters (1 = normal). */
void sim_gpu_set_scatter_slowdown(sim_gpu_t *gpu, uint32_t factor);
/* Test hook (planted bugs): sees every fused copy (the core's gather_parts
 * and scatter_parts) before it is checked and may change its parts and a
 * copy of its descriptor (e.g. point pages at a list of its own, read
 * before the hook's next call); then the copy runs as the core's default
 * runs it, one op per part. */
typedef void (*sim_gpu_copy_hook_fn)(void *ctx, uint32_t gpu_id, bool scatter,
                                     kvs_copy_desc_t *desc, kvs_copy_part_t *parts,
                                     int64_t nparts);
void sim_gpu_set_copy_hook(sim_gpu_t *gpu, sim_gpu_copy_hook_fn fn, void *ctx);

#endif
