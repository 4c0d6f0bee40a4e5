/*
 * copy_check.h - validation and geometry of a gather/scatter descriptor
 * (kvs_copy_desc_t of backend.h), shared by the hardware device backends
 * (hw/host, hw/cuda) so both refuse exactly the same descriptors with the
 * same messages as the simulator's GPU.
 *
 * It checks the shape (signs, head range, tokens against pages, layer and
 * staging slot ranges, 64-bit overflow) and asks the backend, through a
 * callback, whether every byte range the copy touches lies inside one live
 * allocation. It copies nothing and keeps no state.
 */
#ifndef KVS_HW_COPY_CHECK_H
#define KVS_HW_COPY_CHECK_H

#include <kvstage/backend.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The geometry of one validated descriptor, in bytes unless named. */
typedef struct hw_copy_shape {
    uint64_t pages_used;    /* ceil(tokens / page_size) entries of pages[] read */
    uint64_t row_bytes;     /* num_heads * head_dim * elem_bytes: one token's copy */
    uint64_t token_bytes;   /* local_heads * head_dim * elem_bytes: one pool slot */
    uint64_t head_off;      /* head_start * head_dim * elem_bytes */
    uint64_t slot_bytes;    /* tokens * row_bytes: one staging layer slot */
    uint64_t block_bytes;   /* slot_bytes * staging_layer_slots * 2: the block */
    uint64_t pool_lo;       /* byte range touched in every layer buffer */
    uint64_t pool_hi;
    uint64_t payload_bytes; /* slot_bytes * layer_count * 2: bytes copied */
} hw_copy_shape_t;

/* True when [addr, addr + len_bytes) lies inside one live allocation of the
 * backend (an empty range may sit one past the end). */
typedef bool (*hw_copy_mem_fn)(void *ctx, uint64_t addr, uint64_t len_bytes);

/*
 * Validates d and fills *sh. `what` ("gather"/"scatter") and `dev_name`
 * start the message. On failure returns KVS_EINVAL (a NULL pointer or a
 * non-positive size) or KVS_ERANGE (a range outside its object) and writes
 * what to change into msg (msg_bytes > 0). in_mem is called only when the
 * copy moves bytes.
 */
int hw_copy_check(const kvs_copy_desc_t *d, const char *what, const char *dev_name,
                  hw_copy_mem_fn in_mem, void *ctx, hw_copy_shape_t *sh, char *msg,
                  size_t msg_bytes);

#endif
