/*
 * driver.h - the rank driver for real hardware (library kvstage_driver,
 * hw/driver/): it owns the loop of one kvs_rank_t on real backends (hw/host,
 * hw/cuda, hw/verbs), where the clock is real, copies finish on other
 * threads and the NIC raises its own events.
 *
 * Two ways to use it:
 * - Thread mode: kvs_driver_start() runs a progress thread that steps the
 *   rank (kvs_rank_step) and sleeps until there is work; kvs_driver_stop()
 *   (or kvs_driver_destroy()) ends and joins it. What an engine uses: its
 *   own threads open rooms and report computed chunks while the driver's
 *   thread moves the bytes.
 * - Caller's loop: no thread; the caller calls kvs_driver_progress() (one
 *   step) and kvs_driver_wait() (sleep until there is work) in turn, e.g.
 *   inside its own event loop.
 * Finished rooms go to on_result (on the thread that stepped), or stay for
 * kvs_rank_poll when on_result is NULL.
 *
 * Sleeping, not spinning. The driver sleeps in ppoll(2) on the file
 * descriptors the backends hand out through their wait_arm slots (backend.h,
 * "Waiting for completions": the verbs fabric's epoll fd over its completion
 * and rdma_cm channels, the host and CUDA devices' eventfds), plus its own
 * eventfd, with the earliest of the rank's next deadline and the fabric's
 * own timers as the time-out. So it wakes when a copy completes, a message
 * or write completion arrives, a connection event comes, another thread
 * calls the rank, or a deadline passes, and at no other time. A backend
 * without wait_arm (the simulator, test fakes) is polled every
 * poll_interval_ns instead. The rule it follows: after a step that found no
 * work, arm the backends, step once more (what completed before the arm
 * raised no notification), and sleep only if that step found nothing
 * either.
 *
 * Threads (what is safe from where):
 * - kvs_rank_* calls on the rank: from any thread, at any time between
 *   kvs_driver_create and kvs_driver_destroy: the driver sets the rank's
 *   lock (kvs_rank_set_lock) to its mutex. A call from a thread other than
 *   the loop's (the progress thread; in the caller's loop, the thread that
 *   last called kvs_driver_progress) wakes the driver, so what it changed
 *   (a room opened, a chunk computed, an abort) is progressed at once. The
 *   loop's own calls wake nothing: in the caller's loop, call
 *   kvs_driver_progress after them before kvs_driver_wait, as a loop does.
 *   on_result runs outside the lock and may call the rank.
 * - The backends: while a driver exists, use the fabric only through the
 *   rank (the verbs fabric is not thread-safe; its now_ns is); the host and
 *   CUDA devices serialise their own calls (memory allocation, mem_read,
 *   kvs_host_ptr may be used from any thread).
 * - kvs_driver_start / stop / destroy: from one controlling thread, never
 *   from on_result or on_error (stop returns KVS_ESTATE there).
 * - kvs_driver_progress / wait: from one thread at a time, and only while
 *   the progress thread is not running (KVS_ESTATE otherwise).
 * - kvs_driver_wake, kvs_driver_stats, kvs_driver_rank_error: any thread.
 * - kvs_driver_last_error: the thread whose driver call failed, or any
 *   thread after kvs_driver_stop returned.
 * One driver per rank; create it before other threads see the rank.
 */
#ifndef KVSTAGE_DRIVER_H
#define KVSTAGE_DRIVER_H

#include <kvstage/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_driver kvs_driver_t;

/* The longest sleep when the device or the fabric has no wait fd. */
#define KVS_DRIVER_POLL_INTERVAL_NS_DEFAULT 1000000u

typedef struct kvs_driver_config {
    kvs_rank_t *rank;      /* the rank to drive; borrowed, must outlive the driver */
    kvs_device_t *dev;     /* the device and fabric the rank was created on; */
    kvs_fabric_t *fab;     /*   borrowed (their wait fds, the fabric's clock) */
    /* Each finished room, oldest first, on the thread that stepped (the
     * driver's in thread mode, the caller's in kvs_driver_progress),
     * outside the rank's lock: it may call the rank. NULL: results stay
     * for kvs_rank_poll. */
    void (*on_result)(void *ctx, const kvs_room_result_t *res);
    /* Thread mode: a step failed (a backend itself failed, see
     * kvs_driver_last_error): the thread stops stepping and ends with that
     * status, which kvs_driver_stop returns. Runs on the driver's thread.
     * NULL: nothing is called. */
    void (*on_error)(void *ctx, int status);
    void *ctx;             /* passed to on_result and on_error */
    /* The longest sleep when a backend has no wait fd; 0 takes
     * KVS_DRIVER_POLL_INTERVAL_NS_DEFAULT. Not used when both have one. */
    uint64_t poll_interval_ns;
} kvs_driver_config_t;

/* Counters, for tests and logs: how often the driver stepped, slept and
 * what woke it. A wake-up counts once, for the first cause in the order
 * listed (a call, the fabric, the device); a sleep that ran out counts as
 * deadline or timeout. */
typedef struct kvs_driver_stats {
    uint64_t steps;          /* kvs_rank_step calls */
    uint64_t idle_steps;     /* ... that found no work and no result */
    uint64_t arms;           /* times the backends were armed */
    uint64_t sleeps;         /* times it blocked in ppoll */
    uint64_t wakes_call;     /* by a rank call from another thread, kvs_driver_wake
                                or kvs_driver_stop */
    uint64_t wakes_fabric;   /* by the fabric's fd */
    uint64_t wakes_device;   /* by the device's fd */
    uint64_t wakes_deadline; /* the rank's next deadline, the fabric's timer or
                                poll_interval_ns passed */
    uint64_t wakes_timeout;  /* kvs_driver_wait's timeout passed */
    uint64_t results;        /* rooms handed to on_result */
} kvs_driver_stats_t;

/* Makes a driver for cfg->rank and sets the rank's lock to the driver's
 * mutex. No thread runs until kvs_driver_start. On failure nothing is left
 * and err (may be NULL) says what to change. cfg is copied; *out is the
 * caller's until kvs_driver_destroy. */
KVS_API int kvs_driver_create(const kvs_driver_config_t *cfg, kvs_driver_t **out,
                              kvs_error_t *err);
/* Stops and joins the thread if it runs, clears the rank's lock and frees
 * the driver; the rank stays the caller's. Not from on_result or on_error,
 * nor while other threads still call the rank. NULL is a no-op. */
KVS_API void kvs_driver_destroy(kvs_driver_t *d);

/* Thread mode: starts the progress thread. KVS_EALREADY when it runs,
 * KVS_EBACKEND when no thread can be made. A driver stopped (or whose
 * thread ended on an error) can be started again. */
KVS_API int kvs_driver_start(kvs_driver_t *d);
/* Ends the progress thread after its current step and joins it; returns
 * KVS_OK, or the status of the step failure that had ended it already.
 * KVS_OK when no thread runs; KVS_ESTATE from the driver's own thread
 * (on_result, on_error). Results not handed out stay for the next step or
 * kvs_rank_poll. */
KVS_API int kvs_driver_stop(kvs_driver_t *d);
/* Whether the progress thread runs (started and not stopped; a thread that
 * ended on an error still counts until kvs_driver_stop joined it). */
KVS_API bool kvs_driver_running(kvs_driver_t *d);

/* Caller's loop: one step of the rank (kvs_rank_step; results to
 * on_result or kept for kvs_rank_poll), arming the backends first when
 * the step before found nothing to do. Returns the work and results it
 * found (>= 0), or a negative status: KVS_ESTATE while the thread runs, a
 * backend's failure (kvs_driver_last_error says which). */
KVS_API int kvs_driver_progress(kvs_driver_t *d);
/* Caller's loop: blocks until there may be work (a backend's fd, a call
 * from another thread or kvs_driver_wake, the rank's next deadline or the
 * fabric's timer) or timeout_ns passed (UINT64_MAX: no limit), then
 * returns KVS_OK (call kvs_driver_progress) or KVS_EAGAIN (the timeout
 * passed with none of these). It returns KVS_OK at once when the last
 * progress found work, or found none before the backends were armed: a
 * loop turns once more before it sleeps. KVS_ESTATE while the thread
 * runs; another negative status when a backend's wait_arm or ppoll
 * failed (kvs_driver_last_error). */
KVS_API int kvs_driver_wait(kvs_driver_t *d, uint64_t timeout_ns);

/* Wakes the driver's sleep (thread mode or kvs_driver_wait) for one step.
 * Any thread; cheap when nobody sleeps. */
KVS_API void kvs_driver_wake(kvs_driver_t *d);

/* A copy of the rank's last error (kvs_rank_last_error) taken under the
 * rank's lock, so it is safe while the thread runs; returns its status. */
KVS_API int kvs_driver_rank_error(kvs_driver_t *d, kvs_error_t *out);
/* Detail of the driver's own last failure: a call that failed, a backend's
 * wait_arm, or the step failure that ended the thread (the rank's error
 * then). See the header's thread rules. */
KVS_API const kvs_error_t *kvs_driver_last_error(const kvs_driver_t *d);
/* The counters so far. Any thread. */
KVS_API void kvs_driver_stats(kvs_driver_t *d, kvs_driver_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSTAGE_DRIVER_H */
