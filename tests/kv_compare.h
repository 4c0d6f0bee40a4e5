/*
 * kv_compare.h - runs the same gather and scatter on two device backends
 * and compares every byte: identical random KV pools and staging blocks are
 * written to both through mem_write, the copies run on each side's stream,
 * and staging blocks (after gather) and whole layer buffers (after scatter)
 * are read back with mem_read and compared; as one op or as a fused copy of
 * several parts (kvc_shape_t.parts). Backend-neutral: the host
 * backend against the simulated GPU here, the CUDA backend against the host
 * backend on a GPU machine (tests/cuda/).
 */
#ifndef KVS_TESTS_KV_COMPARE_H
#define KVS_TESTS_KV_COMPARE_H

#include <kvstage/backend.h>

#include <stddef.h>
#include <stdint.h>

/* Waits until ev is complete on dev; KVS_OK or the failure. */
typedef int (*kvc_wait_fn)(void *ctx, kvs_device_t *dev, kvs_event_t *ev);

typedef struct kvc_side {
    kvs_device_t *dev;
    kvs_stream_t *stream;
    kvc_wait_fn wait;
    void *wait_ctx;
} kvc_side_t;

#define KVC_MAX_LAYERS 8

typedef struct kvc_shape {
    int64_t page_size, tokens, local_heads, head_start, num_heads, head_dim, elem_bytes;
    int64_t pool_layers, layer_begin, layer_count, slots, slot_begin;
    int64_t pool_pages; /* pages in every layer buffer, >= pages the tokens use */
    int64_t parts;      /* 0: one gather / scatter; n in [1, min(num_heads,
                           KVC_MAX_PARTS)]: gather_parts / scatter_parts of n
                           parts splitting the heads, each with its own slice
                           of the staging block, in reverse order for odd
                           seeds (what the engine calls) */
    int64_t planes;     /* the descriptor's: 0 (K and V) or 1 (K only: MLA;
                           the V buffers must come out untouched) */
    int64_t scale_bytes; /* the descriptor's: 0, or a scale buffer beside
                            each K and V buffer with this many bytes a head
                            (FP8 KV with scales), compared as well */
} kvc_shape_t;

#define KVC_MAX_PARTS 64

/* Shapes named for what they exercise (row widths, head slices, fused
 * parts), shared by the GPU check and the kernels' test on the CPU. */
typedef struct kvc_named_shape {
    const char *name;
    kvc_shape_t sh;
} kvc_named_shape_t;
extern const kvc_named_shape_t kvc_named_shapes[];
extern const size_t kvc_named_shape_count;

/* A valid random shape with at most max_pool_pages pages per buffer. */
kvc_shape_t kvc_random_shape(uint64_t *rng, int64_t max_pool_pages);

/* Returns 0 when both sides produced the same bytes; else -1 with what
 * differed (or which call failed) in msg. Frees what it allocated. */
int kvc_compare(const kvc_side_t *a, const kvc_side_t *b, const kvc_shape_t *sh,
                uint64_t seed, char *msg, size_t msg_bytes);

#endif
