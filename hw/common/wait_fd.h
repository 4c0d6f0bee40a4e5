/*
 * wait_fd.h - the eventfd a hardware device backend hands out through its
 * wait_arm slot (backend.h, "Waiting for completions"). Whoever completes
 * an op (hw/host's stream workers, hw/cuda's host functions) signals it;
 * wait_arm empties and arms it. It is written at most once per arm, and
 * never while nobody waits, so a busy device makes no system call for it.
 *
 * Thread-safe without a lock: an atomic flag and the eventfd. The caller
 * signals only after the completion is visible to its event_query (done
 * sequence advanced, event recorded complete): then a completion after an
 * arm is either seen by the waiter's next query or writes the fd.
 */
#ifndef KVS_HW_WAIT_FD_H
#define KVS_HW_WAIT_FD_H

#include <stdatomic.h>
#include <stdbool.h>

typedef struct hw_wait_fd {
    int fd;            /* eventfd, non-blocking; -1 before init */
    atomic_bool armed; /* a waiter wants the next completion written */
} hw_wait_fd_t;

/* Makes the eventfd. Returns 0, or the errno of the failure (nothing to
 * free then). */
int hw_wait_fd_init(hw_wait_fd_t *w);
/* Closes it; no signal may run any more. */
void hw_wait_fd_fini(hw_wait_fd_t *w);
/* Empties it and arms it; returns the fd to poll for POLLIN. */
int hw_wait_fd_arm(hw_wait_fd_t *w);
/* An op completed: writes the fd if it is armed (and disarms it). */
void hw_wait_fd_signal(hw_wait_fd_t *w);

#endif
