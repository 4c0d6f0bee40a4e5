/*
 * engine.h - the deterministic discrete-event engine of the simulator.
 *
 * One engine owns the virtual clock (ns, advanced only by dispatching
 * events), the root seed, and the event queue ordered by (time, sequence
 * number taken at scheduling), so simultaneous events run in the order they
 * were scheduled, never by address. No threads, no wall clock: the same seed
 * and inputs give the same event order, bit for bit.
 *
 * Events live in a pool allocated at create that grows by doubling only when
 * full (no malloc per event in steady state). Cancelled events are dropped
 * lazily when they reach the head of the queue.
 */
#ifndef KVS_SIM_ENGINE_H
#define KVS_SIM_ENGINE_H

#include <stdint.h>

#include "rng.h"

typedef struct sim_engine sim_engine_t;

/* An event's action. ctx and arg are what was given to sim_engine_at. */
typedef void (*sim_event_fn)(sim_engine_t *eng, void *ctx, uint64_t arg);

/* Creates an engine with room for initial_events pending events (> 0).
 * Returns a kvstage status. */
int sim_engine_create(uint64_t seed, uint32_t initial_events, sim_engine_t **out);
void sim_engine_destroy(sim_engine_t *eng);

uint64_t sim_engine_now_ns(const sim_engine_t *eng);
uint64_t sim_engine_seed(const sim_engine_t *eng);
/* Component stream of this engine's seed (see rng.h). */
void sim_engine_rng(const sim_engine_t *eng, uint64_t component, sim_rng_t *out);

/* Schedules fn(eng, ctx, arg) at time at_ns (>= now; earlier is KVS_EINVAL).
 * *out_id (may be NULL) identifies it for sim_engine_cancel. */
int sim_engine_at(sim_engine_t *eng, uint64_t at_ns, sim_event_fn fn, void *ctx,
                  uint64_t arg, uint64_t *out_id);
/* Same, delay_ns after now. */
int sim_engine_after(sim_engine_t *eng, uint64_t delay_ns, sim_event_fn fn, void *ctx,
                     uint64_t arg, uint64_t *out_id);
/* Cancels a pending event: KVS_OK, or KVS_ENOENT if it already ran, was
 * cancelled, or never existed. */
int sim_engine_cancel(sim_engine_t *eng, uint64_t id);

/* Runs the next event; returns 1 if one ran, 0 if the queue is empty. */
int sim_engine_step(sim_engine_t *eng);
/* Runs events while the next one is at or before until_ns and fewer than
 * max_events ran in this call (0 = no limit). Returns the number run. The
 * clock ends at the last event run (it does not jump to until_ns). */
uint64_t sim_engine_run(sim_engine_t *eng, uint64_t until_ns, uint64_t max_events);
/* Asks the running sim_engine_run to return after the current event. */
void sim_engine_stop(sim_engine_t *eng);

uint64_t sim_engine_pending(const sim_engine_t *eng);   /* not yet run, not cancelled */
uint64_t sim_engine_events_run(const sim_engine_t *eng); /* since create */
/* Order-sensitive hash of (time, sequence, arg) of every event run: two runs
 * with equal digests dispatched the same events in the same order. */
uint64_t sim_engine_digest(const sim_engine_t *eng);

#endif
