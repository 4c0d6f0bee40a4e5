/*
 * slots.h - which slots of a fixed table are free: how the hardware device
 * backends (hw/host, hw/cuda) hand out their stream and event slots.
 *
 * The slots themselves (struct kvs_stream, struct kvs_event) are the
 * backend's, in an array it owns and indexes with what this table hands out;
 * their contents, liveness flag and ownership checks stay there (they differ:
 * worker threads and sequences on the host, CUDA handles on the GPU). This
 * keeps only the free indices, and says what to change when none is left.
 *
 * The index given back last goes out first (a stack); at start the low
 * indices go first. Not thread-safe: the backend's device lock guards it.
 * Invariant: free[0..free_count) are distinct indices below cap.
 */
#ifndef KVS_HW_SLOTS_H
#define KVS_HW_SLOTS_H

#include <kvstage/backend.h>

#include <stdbool.h>
#include <stdint.h>

typedef struct hw_slots {
    uint32_t *free;      /* free indices; free[free_count - 1] goes out next */
    uint32_t free_count;
    uint32_t cap;
    const char *full;    /* what a refusal says after "<device>: all <cap> " */
} hw_slots_t;

/* The refusals of the stream and event tables (both backends' configs name
 * their bounds max_streams and max_events). */
#define HW_SLOTS_FULL_STREAMS "streams in use; destroy one or raise max_streams"
#define HW_SLOTS_FULL_EVENTS "events live; destroy completed events or raise max_events"

/*
 * Sets up a table of cap free slots. full (static, HW_SLOTS_FULL_*) ends
 * the message of a refusal when all are taken. Returns false when out of
 * memory; *t then holds nothing to free (hw_slots_fini on it is harmless).
 */
bool hw_slots_init(hw_slots_t *t, uint32_t cap, const char *full);

/* Frees the table. Safe on a zeroed or failed-init table. */
void hw_slots_fini(hw_slots_t *t);

/* Takes a free index into *out. When every slot is taken records KVS_EFULL
 * ("<dev name>: all <cap> <full>") on dev and returns it. */
int hw_slots_take(hw_slots_t *t, kvs_device_t *dev, uint32_t *out);

/* Gives back index i, taken from t and not given back since. */
void hw_slots_put(hw_slots_t *t, uint32_t i);

#endif
