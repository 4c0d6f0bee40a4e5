/*
 * waitset.h - how the network fabrics (hw/verbs, hw/ofi) wait: a set of
 * their own fds (completion channels, rdma_cm's channel, sockets, another
 * set), each with a key of the fabric's choosing, watched by one epoll fd;
 * a non-blocking drain of the ready ones and a blocking wait; the earliest
 * of the fabric's timers (connect, recovery, close and grace deadlines,
 * retries); and the answer of the wait_arm slot (backend.h, "Waiting for
 * completions"): the set's fd and that earliest time. Which fds a fabric
 * watches, what a key means and which timers it has stay with the fabric.
 *
 * Not thread-safe: the fabric is driven from one thread. The set's fd is
 * the fabric's for the set's life, so wait_arm hands out the same fd every
 * time; it is level-triggered (a ready fd stays ready until its owner
 * reads it), so a wake-up is never lost.
 * Invariants: a zeroed set is none (destroy does nothing to it); a created
 * set has fab and an fd until it is destroyed; a wake time is never before
 * the now it was started with, and UINT64_MAX means no timer.
 */
#ifndef KVS_HW_WAITSET_H
#define KVS_HW_WAITSET_H

#include <kvstage/backend.h>

#include <stdbool.h>
#include <stdint.h>

/* What an fd is watched for and what the drain reports of it. */
#define HW_NET_WAIT_IN 1u  /* readable (a listener: a peer to accept) */
#define HW_NET_WAIT_HUP 2u /* the peer hung up its end, or the fd failed */

typedef struct hw_net_waitset {
    kvs_fabric_t *fab; /* where failures are recorded; NULL: none */
    const char *name;  /* the fabric's name in messages; lives as long as it */
    int fd;            /* the epoll fd */
} hw_net_waitset_t;

/* One ready fd, by the key it was added with. */
typedef struct hw_net_ready {
    uint64_t key;
    uint32_t events; /* HW_NET_WAIT_IN and/or HW_NET_WAIT_HUP */
} hw_net_ready_t;

/* Makes an empty set. KVS_OK, or KVS_EBACKEND recorded on fab saying what
 * to change; *w is zeroed then (nothing to destroy). */
int hw_net_waitset_create(hw_net_waitset_t *w, kvs_fabric_t *fab, const char *name);
/* Closes the set's fd (the fds in it stay open: their owners close them)
 * and zeroes *w. Nothing on a zeroed set. */
void hw_net_waitset_destroy(hw_net_waitset_t *w);

/* Watches fd (borrowed: the caller closes it, after removing it) for
 * `what` (HW_NET_WAIT_IN, with HW_NET_WAIT_HUP to hear of a peer's
 * half-close too; a failure or hang-up is always reported), reported
 * with key. KVS_OK, else KVS_EBACKEND recorded on the fabric. */
int hw_net_waitset_add(hw_net_waitset_t *w, int fd, uint64_t key, uint32_t what);
/* Stops watching fd. KVS_OK, else KVS_EBACKEND recorded (fd was not in
 * the set); closing an fd removes it too, so a caller about to close it
 * may ignore the status. */
int hw_net_waitset_remove(hw_net_waitset_t *w, int fd);

/* The ready fds, at most max of them, into out, without blocking: how
 * many (0..max), or KVS_EBACKEND recorded on the fabric. A ready fd stays
 * ready (and is reported again) until its owner reads it. */
int hw_net_waitset_drain(hw_net_waitset_t *w, hw_net_ready_t *out, int max);
/* As drain, but sleeps until an fd is ready or timeout_ms passes (< 0:
 * no limit): 0 when it passed (or a signal came). */
int hw_net_waitset_wait(hw_net_waitset_t *w, hw_net_ready_t *out, int max, int timeout_ms);

/* The earliest of a fabric's timers, gathered in one pass. */
typedef struct hw_net_wake {
    uint64_t now_ns;  /* the clock when the pass started (now_ns's clock) */
    uint64_t wake_ns; /* the earliest so far, never before now_ns; UINT64_MAX: none */
} hw_net_wake_t;

/* A pass at now_ns, with no timer yet. */
hw_net_wake_t hw_net_wake_start(uint64_t now_ns);
/* A timer at deadline_ns; one already passed wakes now. */
void hw_net_wake_at(hw_net_wake_t *t, uint64_t deadline_ns);
/* Something is ready already: wake now. */
void hw_net_wake_now(hw_net_wake_t *t);
/* A timer delay_ns from now (UINT64_MAX if that does not fit). */
void hw_net_wake_in(hw_net_wake_t *t, uint64_t delay_ns);
/* Whether the wake is now: no later timer can change it. */
bool hw_net_wake_due(const hw_net_wake_t *t);

/* now_ns plus ms milliseconds (a connect or close timeout): a deadline,
 * UINT64_MAX if it does not fit. */
uint64_t hw_net_deadline_ns(uint64_t now_ns, uint32_t ms);
/* The milliseconds to sleep from now_ns until deadline_ns, rounded up so
 * the sleep does not end before it, and at most max_ms: 0 when it has
 * passed. */
int hw_net_ms_until(uint64_t now_ns, uint64_t deadline_ns, int max_ms);

/* wait_arm's answer: *out_fd the set's fd, *out_wake_ns the earliest of
 * t's timers. KVS_OK, or KVS_EINVAL recorded on the fabric when either
 * out is NULL. */
int hw_net_waitset_hand_out(const hw_net_waitset_t *w, const hw_net_wake_t *t, int *out_fd,
                            uint64_t *out_wake_ns);

#endif
