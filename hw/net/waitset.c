/*
 * waitset.c - the network fabrics' wait set (see waitset.h): one epoll fd
 * over the fabric's fds with their keys, drained without blocking or
 * waited on, the earliest of the fabric's timers, and wait_arm's answer.
 * Records failures on the fabric, saying what to change; reads, accepts
 * and closes none of the fds it watches.
 */
#include "waitset.h"

#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define HW_NET_WAIT_BATCH 16

int hw_net_waitset_create(hw_net_waitset_t *w, kvs_fabric_t *fab, const char *name)
{
    *w = (hw_net_waitset_t){0};
    const int fd = epoll_create1(EPOLL_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        return kvs_fabric_fail(fab, KVS_EBACKEND, e, "making the wait set of %s "
                               "(epoll_create1) failed: %s%s", name, strerror(e),
                               e == EMFILE || e == ENFILE
                                   ? ": raise the open file limit (ulimit -n)"
                                   : ": raise the kernel's memory or epoll limits");
    }
    *w = (hw_net_waitset_t){.fab = fab, .name = name, .fd = fd};
    return KVS_OK;
}

void hw_net_waitset_destroy(hw_net_waitset_t *w)
{
    if (w->fab == NULL)
        return;
    (void)close(w->fd);
    *w = (hw_net_waitset_t){0};
}

/* What to change when epoll_ctl refused fd with errno e. */
static const char *hw_net_waitset_advice(int e)
{
    switch (e) {
    case ENOSPC:
        return ": raise /proc/sys/fs/epoll/max_user_watches";
    case ENOMEM:
        return ": the kernel is out of memory: free some or lower max_conns";
    case EEXIST:
        return ": it is watched already (a fabric bug: remove it first)";
    case ENOENT:
        return ": it is not in the set (a fabric bug: removed twice, or never added)";
    case EBADF:
    case EPERM:
        return ": it is closed or not an fd epoll can watch (a fabric bug)";
    default:
        return "";
    }
}

int hw_net_waitset_add(hw_net_waitset_t *w, int fd, uint64_t key, uint32_t what)
{
    assert(w->fab != NULL && (what & ~(HW_NET_WAIT_IN | HW_NET_WAIT_HUP)) == 0);
    struct epoll_event ev = {.events = ((what & HW_NET_WAIT_IN) ? EPOLLIN : 0u) |
                                       ((what & HW_NET_WAIT_HUP) ? EPOLLRDHUP : 0u),
                             .data.u64 = key};
    if (epoll_ctl(w->fd, EPOLL_CTL_ADD, fd, &ev) == 0)
        return KVS_OK;
    const int e = errno;
    return kvs_fabric_fail(w->fab, KVS_EBACKEND, e, "watching fd %d (key %llu) in the wait "
                           "set of %s failed: %s%s", fd, (unsigned long long)key, w->name,
                           strerror(e), hw_net_waitset_advice(e));
}

int hw_net_waitset_remove(hw_net_waitset_t *w, int fd)
{
    assert(w->fab != NULL);
    if (epoll_ctl(w->fd, EPOLL_CTL_DEL, fd, NULL) == 0)
        return KVS_OK;
    const int e = errno;
    return kvs_fabric_fail(w->fab, KVS_EBACKEND, e, "unwatching fd %d in the wait set of %s "
                           "failed: %s%s", fd, w->name, strerror(e), hw_net_waitset_advice(e));
}

int hw_net_waitset_wait(hw_net_waitset_t *w, hw_net_ready_t *out, int max, int timeout_ms)
{
    assert(w->fab != NULL && out != NULL && max > 0);
    struct epoll_event evs[HW_NET_WAIT_BATCH];
    const int n = epoll_wait(w->fd, evs, max < HW_NET_WAIT_BATCH ? max : HW_NET_WAIT_BATCH,
                             timeout_ms);
    if (n < 0) {
        const int e = errno;
        if (e == EINTR)
            return 0;
        return kvs_fabric_fail(w->fab, KVS_EBACKEND, e, "waiting on the wait set of %s "
                               "failed: %s: the fabric cannot wait any more: destroy it",
                               w->name, strerror(e));
    }
    for (int i = 0; i < n; i++) {
        const uint32_t got = evs[i].events;
        out[i] = (hw_net_ready_t){
            .key = evs[i].data.u64,
            .events = ((got & EPOLLIN) ? HW_NET_WAIT_IN : 0u) |
                      ((got & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) ? HW_NET_WAIT_HUP : 0u)};
    }
    return n;
}

int hw_net_waitset_drain(hw_net_waitset_t *w, hw_net_ready_t *out, int max)
{
    return hw_net_waitset_wait(w, out, max, 0);
}

hw_net_wake_t hw_net_wake_start(uint64_t now_ns)
{
    return (hw_net_wake_t){.now_ns = now_ns, .wake_ns = UINT64_MAX};
}

void hw_net_wake_at(hw_net_wake_t *t, uint64_t deadline_ns)
{
    if (deadline_ns < t->now_ns)
        deadline_ns = t->now_ns;
    if (deadline_ns < t->wake_ns)
        t->wake_ns = deadline_ns;
}

void hw_net_wake_now(hw_net_wake_t *t)
{
    t->wake_ns = t->now_ns;
}

void hw_net_wake_in(hw_net_wake_t *t, uint64_t delay_ns)
{
    hw_net_wake_at(t, delay_ns > UINT64_MAX - t->now_ns ? UINT64_MAX : t->now_ns + delay_ns);
}

bool hw_net_wake_due(const hw_net_wake_t *t)
{
    return t->wake_ns <= t->now_ns;
}

uint64_t hw_net_deadline_ns(uint64_t now_ns, uint32_t ms)
{
    const uint64_t delay_ns = (uint64_t)ms * 1000000u; /* fits: ms is 32 bits */
    return delay_ns > UINT64_MAX - now_ns ? UINT64_MAX : now_ns + delay_ns;
}

int hw_net_ms_until(uint64_t now_ns, uint64_t deadline_ns, int max_ms)
{
    if (deadline_ns <= now_ns || max_ms <= 0)
        return 0;
    const uint64_t left_ns = deadline_ns - now_ns;
    const uint64_t ms = left_ns / 1000000u + (left_ns % 1000000u != 0);
    return ms < (uint64_t)max_ms ? (int)ms : max_ms;
}

int hw_net_waitset_hand_out(const hw_net_waitset_t *w, const hw_net_wake_t *t, int *out_fd,
                            uint64_t *out_wake_ns)
{
    assert(w->fab != NULL);
    if (out_fd == NULL || out_wake_ns == NULL)
        return kvs_fabric_fail(w->fab, KVS_EINVAL, 0, "wait_arm on %s: out_fd and "
                               "out_wake_ns must not be NULL", w->name);
    *out_fd = w->fd;
    *out_wake_ns = t->wake_ns;
    return KVS_OK;
}
