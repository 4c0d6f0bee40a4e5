/*
 * test_hw_waitset.c - hw/net/waitset.c, how both network fabrics wait: on
 * real fds (eventfds, a pipe, a socket pair) a ready fd is reported with
 * its key and what it is ready for, a quiet one is not, a removed one no
 * more; a set inside a set wakes its parent (ofi's boot set in its wait
 * set); a blocking wait sleeps until its timeout or an fd is ready; the
 * earliest of a set of timers, with none, past and overflowing ones;
 * wait_arm's answer; and each refusal recorded on the fabric naming what
 * failed and what to change. Driven on a fabric base with no ops: the set
 * only records failures on it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "waitset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct fixture {
    kvs_fabric_t fab;
    hw_net_waitset_t w;
} fixture_t;

static int setup(void **state)
{
    fixture_t *x = calloc(1, sizeof *x);
    if (x == NULL || hw_net_waitset_create(&x->w, &x->fab, "test") != KVS_OK) {
        free(x);
        return -1;
    }
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *x = *state;
    hw_net_waitset_destroy(&x->w);
    free(x);
    return 0;
}

static int make_eventfd(void)
{
    const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert_true(fd >= 0);
    return fd;
}

static void signal_fd(int fd)
{
    const uint64_t one = 1;
    assert_int_equal(write(fd, &one, sizeof one), (ssize_t)sizeof one);
}

static void empty_fd(int fd)
{
    uint64_t v;
    assert_int_equal(read(fd, &v, sizeof v), (ssize_t)sizeof v);
}

/* The event of key among the n in r, or NULL. */
static const hw_net_ready_t *find_key(const hw_net_ready_t *r, int n, uint64_t key)
{
    for (int i = 0; i < n; i++)
        if (r[i].key == key)
            return &r[i];
    return NULL;
}

static void test_hw_waitset_reports_ready_fds_by_key(void **state)
{
    fixture_t *x = *state;
    const int a = make_eventfd(), b = make_eventfd();
    const uint64_t key_a = UINT64_MAX, key_b = 7; /* ofi's listener key, a slot */
    assert_int_equal(hw_net_waitset_add(&x->w, a, key_a, HW_NET_WAIT_IN), KVS_OK);
    assert_int_equal(hw_net_waitset_add(&x->w, b, key_b, HW_NET_WAIT_IN), KVS_OK);
    hw_net_ready_t r[4];
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 0); /* nothing ready */

    signal_fd(b);
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 1);
    assert_int_equal(r[0].key, key_b);
    assert_int_equal(r[0].events, HW_NET_WAIT_IN);
    /* level-triggered: still ready until its owner reads it */
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 1);
    assert_int_equal(r[0].key, key_b);

    signal_fd(a);
    const int n = hw_net_waitset_drain(&x->w, r, 4);
    assert_int_equal(n, 2);
    assert_non_null(find_key(r, n, key_a));
    assert_non_null(find_key(r, n, key_b));
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 1), 1); /* at most max */

    empty_fd(b);
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 1);
    assert_int_equal(r[0].key, key_a);
    empty_fd(a);
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 0);
    close(a);
    close(b);
}

static void test_hw_waitset_removed_fd_is_quiet(void **state)
{
    fixture_t *x = *state;
    const int a = make_eventfd(), b = make_eventfd();
    assert_int_equal(hw_net_waitset_add(&x->w, a, 1, HW_NET_WAIT_IN), KVS_OK);
    assert_int_equal(hw_net_waitset_add(&x->w, b, 2, HW_NET_WAIT_IN), KVS_OK);
    signal_fd(a);
    signal_fd(b);
    assert_int_equal(hw_net_waitset_remove(&x->w, a), KVS_OK);
    hw_net_ready_t r[4];
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 1);
    assert_int_equal(r[0].key, 2);
    /* added again under another key: reported under that one */
    assert_int_equal(hw_net_waitset_add(&x->w, a, 3, HW_NET_WAIT_IN), KVS_OK);
    const int n = hw_net_waitset_drain(&x->w, r, 4);
    assert_int_equal(n, 2);
    assert_non_null(find_key(r, n, 3));
    assert_null(find_key(r, n, 1));
    close(a);
    close(b);
}

static void test_hw_waitset_hangup_of_a_peer(void **state)
{
    fixture_t *x = *state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(hw_net_waitset_add(&x->w, sv[0], 5, HW_NET_WAIT_IN | HW_NET_WAIT_HUP),
                     KVS_OK);
    assert_int_equal(hw_net_waitset_add(&x->w, p[0], 6, HW_NET_WAIT_IN), KVS_OK);
    hw_net_ready_t r[4];
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 0);

    assert_int_equal(write(p[1], "x", 1), 1); /* bytes: readable, no hang-up */
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 1);
    assert_int_equal(r[0].key, 6);
    assert_int_equal(r[0].events, HW_NET_WAIT_IN);
    char c;
    assert_int_equal(read(p[0], &c, 1), 1);

    assert_int_equal(shutdown(sv[1], SHUT_WR), 0); /* the peer half-closes */
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 4), 1);
    assert_int_equal(r[0].key, 5);
    assert_true(r[0].events & HW_NET_WAIT_HUP);

    close(p[1]); /* the writer gone: a hang-up is reported though not asked for */
    const int n = hw_net_waitset_drain(&x->w, r, 4);
    assert_int_equal(n, 2);
    const hw_net_ready_t *pipe_ev = find_key(r, n, 6);
    assert_non_null(pipe_ev);
    assert_true(pipe_ev->events & HW_NET_WAIT_HUP);
    close(p[0]);
    close(sv[0]);
    close(sv[1]);
}

/* ofi's layout: the boot set's fd inside the set wait_arm hands out. */
static void test_hw_waitset_nested_set_wakes_parent(void **state)
{
    fixture_t *x = *state;
    hw_net_waitset_t inner;
    assert_int_equal(hw_net_waitset_create(&inner, &x->fab, "inner"), KVS_OK);
    assert_int_equal(hw_net_waitset_add(&x->w, inner.fd, 0, HW_NET_WAIT_IN), KVS_OK);
    const int a = make_eventfd();
    assert_int_equal(hw_net_waitset_add(&inner, a, 42, HW_NET_WAIT_IN), KVS_OK);
    hw_net_ready_t r[2];
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 2), 0);
    signal_fd(a);
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 2), 1);
    assert_int_equal(r[0].key, 0);
    assert_int_equal(hw_net_waitset_drain(&inner, r, 2), 1);
    assert_int_equal(r[0].key, 42);
    empty_fd(a);
    assert_int_equal(hw_net_waitset_drain(&x->w, r, 2), 0);
    assert_int_equal(hw_net_waitset_remove(&x->w, inner.fd), KVS_OK);
    hw_net_waitset_destroy(&inner);
    close(a);
}

static void test_hw_waitset_wait_blocks_until_ready_or_timeout(void **state)
{
    fixture_t *x = *state;
    const int a = make_eventfd();
    assert_int_equal(hw_net_waitset_add(&x->w, a, 9, HW_NET_WAIT_IN), KVS_OK);
    hw_net_ready_t r[2];
    assert_int_equal(hw_net_waitset_wait(&x->w, r, 2, 1), 0); /* timed out */
    signal_fd(a);
    assert_int_equal(hw_net_waitset_wait(&x->w, r, 2, -1), 1); /* ready: no sleep */
    assert_int_equal(r[0].key, 9);
    close(a);
}

static void test_hw_waitset_earliest_timer(void **state)
{
    (void)state;
    const uint64_t now = 1000;
    hw_net_wake_t t = hw_net_wake_start(now);
    assert_int_equal(t.wake_ns, UINT64_MAX); /* no timer: none */
    assert_false(hw_net_wake_due(&t));
    hw_net_wake_at(&t, 5000);
    hw_net_wake_at(&t, 3000);
    hw_net_wake_at(&t, 4000);
    assert_int_equal(t.wake_ns, 3000); /* the earliest, in any order */
    hw_net_wake_at(&t, UINT64_MAX);
    assert_int_equal(t.wake_ns, 3000);
    hw_net_wake_in(&t, 500);
    assert_int_equal(t.wake_ns, 1500);
    hw_net_wake_in(&t, UINT64_MAX); /* overflows: no earlier */
    assert_int_equal(t.wake_ns, 1500);
    assert_false(hw_net_wake_due(&t));
    hw_net_wake_at(&t, 10); /* passed already: now, never before it */
    assert_int_equal(t.wake_ns, now);
    assert_true(hw_net_wake_due(&t));
    hw_net_wake_at(&t, 2000);
    assert_int_equal(t.wake_ns, now);

    t = hw_net_wake_start(UINT64_MAX - 10);
    hw_net_wake_in(&t, 100); /* past the end of the clock: as good as none */
    assert_int_equal(t.wake_ns, UINT64_MAX);
    t = hw_net_wake_start(now);
    hw_net_wake_now(&t);
    assert_true(hw_net_wake_due(&t));
    assert_int_equal(t.wake_ns, now);
}

static void test_hw_waitset_deadlines_and_sleeps(void **state)
{
    (void)state;
    assert_int_equal(hw_net_deadline_ns(1000, 0), 1000);
    assert_int_equal(hw_net_deadline_ns(1000, 10000), 1000 + UINT64_C(10000000000));
    assert_int_equal(hw_net_deadline_ns(UINT64_MAX - 5, 1), UINT64_MAX); /* overflow */
    assert_int_equal(hw_net_deadline_ns(0, UINT32_MAX), (uint64_t)UINT32_MAX * 1000000u);

    assert_int_equal(hw_net_ms_until(5000000, 5000000, 100), 0); /* at it: passed */
    assert_int_equal(hw_net_ms_until(6000000, 5000000, 100), 0);
    assert_int_equal(hw_net_ms_until(0, 1, 100), 1);           /* rounded up */
    assert_int_equal(hw_net_ms_until(0, 2000000, 100), 2);
    assert_int_equal(hw_net_ms_until(0, 2000001, 100), 3);
    assert_int_equal(hw_net_ms_until(0, 500000000, 100), 100); /* at most max_ms */
    assert_int_equal(hw_net_ms_until(0, UINT64_MAX, INT32_MAX), INT32_MAX);
    assert_int_equal(hw_net_ms_until(0, 1000000, 0), 0);
}

static void test_hw_waitset_hand_out(void **state)
{
    fixture_t *x = *state;
    hw_net_wake_t t = hw_net_wake_start(100);
    hw_net_wake_at(&t, 250);
    int fd = -1;
    uint64_t wake = 0;
    assert_int_equal(hw_net_waitset_hand_out(&x->w, &t, &fd, &wake), KVS_OK);
    assert_int_equal(fd, x->w.fd);
    assert_int_equal(wake, 250);
    assert_int_equal(hw_net_waitset_hand_out(&x->w, &t, NULL, &wake), KVS_EINVAL);
    assert_non_null(strstr(x->fab.last_backend_msg,
                           "wait_arm on test: out_fd and out_wake_ns must not be NULL"));
    x->fab.last_backend_msg[0] = '\0';
    assert_int_equal(hw_net_waitset_hand_out(&x->w, &t, &fd, NULL), KVS_EINVAL);
    assert_non_null(strstr(x->fab.last_backend_msg, "out_wake_ns must not be NULL"));
}

static void test_hw_waitset_refusals_say_what_to_change(void **state)
{
    fixture_t *x = *state;
    const int a = make_eventfd();
    assert_int_equal(hw_net_waitset_add(&x->w, a, 1, HW_NET_WAIT_IN), KVS_OK);
    assert_int_equal(hw_net_waitset_add(&x->w, a, 2, HW_NET_WAIT_IN), KVS_EBACKEND);
    assert_non_null(strstr(x->fab.last_backend_msg, "watching fd"));
    assert_non_null(strstr(x->fab.last_backend_msg, "(key 2) in the wait set of test"));
    assert_non_null(strstr(x->fab.last_backend_msg, "watched already"));
    assert_int_equal(hw_net_waitset_remove(&x->w, a), KVS_OK);
    assert_int_equal(hw_net_waitset_remove(&x->w, a), KVS_EBACKEND);
    assert_non_null(strstr(x->fab.last_backend_msg, "unwatching fd"));
    assert_non_null(strstr(x->fab.last_backend_msg, "not in the set"));
    close(a);
    assert_int_equal(hw_net_waitset_add(&x->w, a, 3, HW_NET_WAIT_IN), KVS_EBACKEND);
    assert_non_null(strstr(x->fab.last_backend_msg, "closed or not an fd epoll can watch"));

    char path[] = "/tmp/test_hw_waitset.XXXXXX"; /* a regular file: epoll refuses it */
    const int file = mkstemp(path);
    assert_true(file >= 0);
    unlink(path);
    assert_int_equal(hw_net_waitset_add(&x->w, file, 4, HW_NET_WAIT_IN), KVS_EBACKEND);
    assert_non_null(strstr(x->fab.last_backend_msg, "closed or not an fd epoll can watch"));
    close(file);
}

/* Out of fds: create says so, leaves nothing to destroy, and asks for a
 * higher limit. */
static void test_hw_waitset_create_fails_out_of_fds(void **state)
{
    fixture_t *x = *state;
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    const int next = open("/dev/null", O_RDONLY | O_CLOEXEC); /* the lowest free fd */
    assert_true(next >= 0);
    close(next);
    struct rlimit low = {.rlim_cur = (rlim_t)next, .rlim_max = old.rlim_max}; /* none free */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    hw_net_waitset_t w;
    memset(&w, 0xa5, sizeof w);
    const int rc = hw_net_waitset_create(&w, &x->fab, "starved");
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(rc, KVS_EBACKEND);
    assert_null(w.fab);
    assert_non_null(strstr(x->fab.last_backend_msg, "making the wait set of starved "
                                                     "(epoll_create1) failed"));
    assert_non_null(strstr(x->fab.last_backend_msg, "raise the open file limit (ulimit -n)"));
    hw_net_waitset_destroy(&w); /* a failed create: nothing to do */
    const bool open0 = fcntl(0, F_GETFD) >= 0;
    hw_net_waitset_t zero = {0};
    hw_net_waitset_destroy(&zero); /* a zeroed set is none: its fd 0 is not closed */
    assert_int_equal(fcntl(0, F_GETFD) >= 0, open0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hw_waitset_reports_ready_fds_by_key, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hw_waitset_removed_fd_is_quiet, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hw_waitset_hangup_of_a_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hw_waitset_nested_set_wakes_parent, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hw_waitset_wait_blocks_until_ready_or_timeout,
                                        setup, teardown),
        cmocka_unit_test(test_hw_waitset_earliest_timer),
        cmocka_unit_test(test_hw_waitset_deadlines_and_sleeps),
        cmocka_unit_test_setup_teardown(test_hw_waitset_hand_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hw_waitset_refusals_say_what_to_change, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hw_waitset_create_fails_out_of_fds, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
