/*
 * driver.h - drives one kvs_rank_t on the simulation engine as a real event
 * loop would: a wake (its GPU or NIC has news) schedules one step at the
 * current time, at most one pending at once; a step (kvs_rank_step)
 * progresses the rank, hands every finished room to on_result and arms a
 * timer for the rank's next deadline, so a rank nothing wakes still times
 * out. The simulator's scenario and the core's edge tests both drive their
 * ranks through it.
 *
 * A caller that must tell the rooms' stall deadlines from the links'
 * retransmissions (the edge tests run everything before the earliest stall
 * timeout) gives stall_ns: the driver then keeps two timers, stall_timer_ns
 * for the first and timer_ns for the rest. Deterministic: no clock, no
 * thread; every event goes through the engine.
 */
#ifndef KVS_SIM_DRIVER_H
#define KVS_SIM_DRIVER_H

#include <kvstage/kvstage.h>

#include "engine.h"

typedef struct sim_driver {
    sim_engine_t *eng;
    kvs_rank_t *rank;            /* borrowed; NULL while the rank is down */
    /* Each finished room; must not destroy the rank. */
    void (*on_result)(void *ctx, const kvs_room_result_t *res);
    /* A step failed (a backend itself): the status, the rank's error. */
    void (*on_error)(void *ctx, int status);
    /* Optional: the rank's earliest room stall deadline (UINT64_MAX: none). */
    uint64_t (*stall_ns)(const kvs_rank_t *rank);
    /* Optional: after every step that ran (the scenario samples its ring
     * there); schedules nothing. */
    void (*on_step)(void *ctx);
    void *ctx;
    bool wake_pending;
    uint64_t timer_ns;           /* a step already scheduled then, 0: none */
    uint64_t stall_timer_ns;     /* ... for a stall deadline (with stall_ns) */
    int error;                   /* KVS_ENOMEM when a step could not be scheduled */
} sim_driver_t;

/* Drives rank (may be NULL until it exists) on eng. The callbacks take ctx. */
void sim_driver_init(sim_driver_t *d, sim_engine_t *eng, kvs_rank_t *rank, void *ctx,
                     void (*on_result)(void *ctx, const kvs_room_result_t *res),
                     void (*on_error)(void *ctx, int status));
/* Schedules a step now unless one is pending (ctx: the sim_driver_t; the
 * signature of the GPU's and NIC's wake callbacks). A driver whose rank is
 * NULL ignores it. */
void sim_driver_wake(void *driver);
/* The rank went down (or came back): pending steps and timers of the old
 * one are forgotten; rank may be NULL. */
void sim_driver_set_rank(sim_driver_t *d, kvs_rank_t *rank);

#endif
