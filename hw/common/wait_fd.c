/*
 * wait_fd.c - the device backends' wait eventfd (see wait_fd.h).
 */
#define _DEFAULT_SOURCE

#include "wait_fd.h"

#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

int hw_wait_fd_init(hw_wait_fd_t *w)
{
    atomic_init(&w->armed, false);
    w->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return w->fd < 0 ? errno : 0;
}

void hw_wait_fd_fini(hw_wait_fd_t *w)
{
    if (w->fd >= 0)
        (void)close(w->fd);
    w->fd = -1;
}

int hw_wait_fd_arm(hw_wait_fd_t *w)
{
    uint64_t count;
    /* Empty first (EAGAIN when it already is), then arm: a completion
     * after the store writes it again. */
    (void)!read(w->fd, &count, sizeof count);
    atomic_store(&w->armed, true);
    return w->fd;
}

void hw_wait_fd_signal(hw_wait_fd_t *w)
{
    if (atomic_exchange(&w->armed, false)) {
        const uint64_t one = 1;
        /* Fails only with the counter at its maximum: readable anyway. */
        (void)!write(w->fd, &one, sizeof one);
    }
}
