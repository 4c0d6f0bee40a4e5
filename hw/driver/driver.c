/*
 * driver.c - the rank driver of driver.h: one kvs_rank_t's loop on real
 * hardware, on a progress thread of its own or in the caller's loop.
 *
 * A step is kvs_rank_step. A sleep is one ppoll over the driver's eventfd
 * and the fds the backends' wait_arm slots hand out, with the earliest of
 * the rank's next deadline, the fabric's wake time, the caller's timeout
 * and (for a backend without an fd) poll_interval_ns as its time-out.
 *
 * The rule that makes sleeping safe (backend.h, "Waiting for
 * completions"): the backends are armed right before a step whenever the
 * step before found nothing to do, and a sleep happens only right after
 * such an armed step also found nothing. Anything that completes after the
 * arm makes a backend fd readable; anything before it is found by that
 * step. Calls from other threads go the same way through the driver's
 * eventfd: the rank's lock is the driver's mutex, and its unlock, when the
 * caller is not the loop's thread (the progress thread, or the thread that
 * last called kvs_driver_progress), sets wake_pending and (on the
 * transition) writes the eventfd; a step first takes wake_pending, so a
 * call before the step is seen by it and a call after it wakes the sleep.
 * The loop's own calls wake nothing: it steps after them anyway.
 *
 * What it does not: no clock of its own for deadlines (the rank's and the
 * fabric's are the fabric's now_ns), no retry of a failed step (a backend
 * that failed stays failed: the thread ends and says why), no second
 * driver on one rank.
 *
 * Locking: mu is the rank's lock and guards every field marked (mu). The
 * fields marked (loop) belong to the thread that steps: the progress
 * thread while it runs, else the caller of progress / wait. The backends'
 * wait_arm runs under mu, as the fabric's other slots do (through the
 * rank), so the fabric is used by one thread at a time.
 */
#define _GNU_SOURCE

#include <kvstage/driver.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

struct kvs_driver {
    kvs_rank_t *rank;
    kvs_device_t *dev;
    kvs_fabric_t *fab;
    void (*on_result)(void *ctx, const kvs_room_result_t *res);
    void (*on_error)(void *ctx, int status);
    void *ctx;
    uint64_t poll_interval_ns;

    pthread_mutex_t mu;      /* the rank's lock */
    int wake_fd;             /* eventfd: calls from other threads, wake, stop */
    atomic_bool wake_pending;/* set by a waker, taken by the next step */
    atomic_bool stop;        /* the progress thread is asked to end */

    /* the progress thread (mu) */
    pthread_t thread;
    bool running;            /* started and not joined */
    int thread_status;       /* why it ended: KVS_OK, or a step's failure */
    /* the loop's thread: the progress thread, or the last caller of
     * kvs_driver_progress (mu) */
    bool owner_known;
    pthread_t owner;

    /* the loop's state (loop) */
    bool idle;               /* the last step found no work and no result */
    bool armed;              /* the backends were armed right before it */
    uint64_t next_ns;        /* the rank's next deadline after it */
    uint64_t fab_wake_ns;    /* the fabric's wake time from the last arm */
    int fab_fd, dev_fd;      /* from the last arm; -1: the backend has none */
    uint64_t step_results;   /* results handed out in the current step */

    kvs_driver_stats_t stats; /* (mu) */
    kvs_error_t err;         /* the driver's own last failure */
};

/* ---- the rank's lock, and waking ----------------------------------------- */

static void hw_driver_signal(kvs_driver_t *d)
{
    if (!atomic_exchange(&d->wake_pending, true)) {
        const uint64_t one = 1;
        (void)!write(d->wake_fd, &one, sizeof one); /* readable either way */
    }
}

static void hw_driver_drain(kvs_driver_t *d)
{
    uint64_t count;
    (void)!read(d->wake_fd, &count, sizeof count); /* non-blocking */
}

static void hw_driver_lock(void *ctx)
{
    kvs_driver_t *d = ctx;
    pthread_mutex_lock(&d->mu);
}

/* Unlocks; a call of a thread other than the loop's may have made work
 * for the rank: wake the driver. */
static void hw_driver_unlock(void *ctx)
{
    kvs_driver_t *d = ctx;
    const bool own = d->owner_known && pthread_equal(d->owner, pthread_self());
    pthread_mutex_unlock(&d->mu);
    if (!own)
        hw_driver_signal(d);
}

void kvs_driver_wake(kvs_driver_t *d)
{
    if (d != NULL)
        hw_driver_signal(d);
}

/* ---- create / destroy ------------------------------------------------------- */

int kvs_driver_create(const kvs_driver_config_t *cfg, kvs_driver_t **out, kvs_error_t *err)
{
    if (out == NULL || cfg == NULL || cfg->rank == NULL || cfg->dev == NULL ||
        cfg->fab == NULL)
        return KVS_ERROR_SET(err, KVS_EINVAL, 0,
                             "kvs_driver_create: cfg, cfg->rank, cfg->dev, cfg->fab and out "
                             "must be set: pass the rank and the device and fabric it was "
                             "created on");
    *out = NULL;
    kvs_driver_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return KVS_ERROR_SET(err, KVS_ENOMEM, ENOMEM, "kvs_driver_create: out of host memory");
    d->rank = cfg->rank;
    d->dev = cfg->dev;
    d->fab = cfg->fab;
    d->on_result = cfg->on_result;
    d->on_error = cfg->on_error;
    d->ctx = cfg->ctx;
    d->poll_interval_ns =
        cfg->poll_interval_ns != 0 ? cfg->poll_interval_ns : KVS_DRIVER_POLL_INTERVAL_NS_DEFAULT;
    d->idle = true; /* arm before the first step: a first wait may sleep after it */
    d->next_ns = UINT64_MAX;
    d->fab_wake_ns = UINT64_MAX;
    d->fab_fd = -1;
    d->dev_fd = -1;
    atomic_init(&d->wake_pending, false);
    atomic_init(&d->stop, false);
    d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->wake_fd < 0) {
        const int e = errno;
        free(d);
        return KVS_ERROR_SET(err, KVS_EBACKEND, e, "kvs_driver_create: eventfd failed (%s): "
                             "raise the process's open file limit (ulimit -n)", strerror(e));
    }
    const int e = pthread_mutex_init(&d->mu, NULL);
    if (e != 0) {
        close(d->wake_fd);
        free(d);
        return KVS_ERROR_SET(err, KVS_ENOMEM, e, "kvs_driver_create: pthread_mutex_init "
                             "failed (%s): free memory", strerror(e));
    }
    kvs_rank_set_lock(d->rank, hw_driver_lock, hw_driver_unlock, d);
    if (err != NULL)
        *err = (kvs_error_t){0};
    *out = d;
    return KVS_OK;
}

void kvs_driver_destroy(kvs_driver_t *d)
{
    if (d == NULL)
        return;
    (void)kvs_driver_stop(d);
    kvs_rank_set_lock(d->rank, NULL, NULL, NULL);
    pthread_mutex_destroy(&d->mu);
    close(d->wake_fd);
    free(d);
}

/* ---- one step, one sleep ------------------------------------------------------ */

static void hw_driver_on_result(void *ctx, const kvs_room_result_t *res)
{
    kvs_driver_t *d = ctx;
    d->step_results++;
    pthread_mutex_lock(&d->mu); /* counted before the caller sees it */
    d->stats.results++;
    pthread_mutex_unlock(&d->mu);
    d->on_result(d->ctx, res);
}

/* Arms both backends (under mu: the fabric is used by one thread at a
 * time). A backend without the slot is polled on poll_interval_ns. */
static int hw_driver_arm(kvs_driver_t *d)
{
    int fab_fd = -1, dev_fd = -1;
    uint64_t wake_ns = UINT64_MAX;
    pthread_mutex_lock(&d->mu);
    int rc = d->fab->ops.wait_arm(d->fab, &fab_fd, &wake_ns);
    const char *what = "fabric", *name = d->fab->name;
    const char *msg = d->fab->last_backend_msg;
    int code = d->fab->last_backend_code;
    if (rc == KVS_ENOTSUP) {
        fab_fd = -1;
        wake_ns = UINT64_MAX;
        rc = KVS_OK;
    }
    if (rc == KVS_OK) {
        rc = d->dev->ops.wait_arm(d->dev, &dev_fd);
        what = "device";
        name = d->dev->name;
        msg = d->dev->last_backend_msg;
        code = d->dev->last_backend_code;
        if (rc == KVS_ENOTSUP) {
            dev_fd = -1;
            rc = KVS_OK;
        }
    }
    if (rc == KVS_OK)
        d->stats.arms++;
    else
        KVS_ERROR_SET(&d->err, rc, code, "wait_arm on %s '%s' failed: %s", what,
                      name != NULL ? name : "?", msg[0] != '\0' ? msg : kvs_strerror(rc));
    pthread_mutex_unlock(&d->mu);
    if (rc != KVS_OK)
        return rc;
    d->fab_fd = fab_fd;
    d->dev_fd = dev_fd;
    d->fab_wake_ns = wake_ns;
    return KVS_OK;
}

/* One step: arm first when the last step was idle. Returns work plus
 * results (>= 0) or a negative status, with d->err set. */
static int hw_driver_step(kvs_driver_t *d)
{
    /* A call before this point is seen by this step. Drain, then clear:
     * the other order loses a wake-up. A call that sets the flag and
     * writes the eventfd between the clear and the drain would have its
     * write drained and leave the flag set, so that no later call writes
     * the eventfd (a set flag means "written already") and the next sleep
     * sleeps through them. Drained first, a call in between finds the flag
     * set and writes nothing, and this step, after the clear, sees it. */
    if (atomic_load(&d->wake_pending)) {
        hw_driver_drain(d);
        atomic_store(&d->wake_pending, false);
    }
    const bool arm = d->idle;
    if (arm) {
        const int rc = hw_driver_arm(d);
        if (rc != KVS_OK)
            return rc;
    }
    d->step_results = 0;
    uint64_t next = UINT64_MAX;
    const int work = kvs_rank_step(d->rank, d->on_result != NULL ? hw_driver_on_result : NULL,
                                   d, &next);
    pthread_mutex_lock(&d->mu);
    d->stats.steps++;
    if (work == 0 && d->step_results == 0)
        d->stats.idle_steps++;
    if (work < 0) {
        const kvs_error_t *e = kvs_rank_last_error(d->rank);
        KVS_ERROR_SET(&d->err, work, e->backend_code, "a step of the rank failed: %s",
                      e->msg[0] != '\0' ? e->msg : kvs_strerror(work));
    }
    pthread_mutex_unlock(&d->mu);
    if (work < 0)
        return work;
    d->next_ns = next;
    d->idle = work == 0 && d->step_results == 0;
    d->armed = arm;
    const uint64_t found = (uint64_t)work + d->step_results;
    return found < (uint64_t)INT32_MAX ? (int)found : INT32_MAX;
}

static struct timespec hw_driver_ts(uint64_t ns)
{
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000u),
                             .tv_nsec = (long)(ns % 1000000000u)};
}

/* Sleeps once if the last step was an armed idle one, at most timeout_ns
 * (UINT64_MAX: no limit of the caller's). KVS_OK when there may be work,
 * KVS_EAGAIN when the caller's timeout ran out, another status when ppoll
 * failed. */
static int hw_driver_sleep(kvs_driver_t *d, uint64_t timeout_ns)
{
    if (!d->idle || !d->armed)
        return KVS_OK; /* step again: work, or not yet armed */
    uint64_t at = d->next_ns < d->fab_wake_ns ? d->next_ns : d->fab_wake_ns;
    uint64_t sleep_ns = UINT64_MAX;
    if (at != UINT64_MAX) {
        pthread_mutex_lock(&d->mu); /* the fabric: one thread at a time */
        const uint64_t now = d->fab->ops.now_ns(d->fab);
        pthread_mutex_unlock(&d->mu);
        if (at <= now)
            return KVS_OK; /* a deadline passed during the step */
        sleep_ns = at - now;
    }
    if ((d->fab_fd < 0 || d->dev_fd < 0) && d->poll_interval_ns < sleep_ns)
        sleep_ns = d->poll_interval_ns; /* a backend that cannot wake us */
    const bool caller_limit = timeout_ns < sleep_ns;
    if (caller_limit)
        sleep_ns = timeout_ns;
    struct pollfd pfd[3] = {{.fd = d->wake_fd, .events = POLLIN},
                            {.fd = d->fab_fd, .events = POLLIN},
                            {.fd = d->dev_fd, .events = POLLIN}};
    /* A negative fd is ignored by ppoll. */
    const struct timespec ts = hw_driver_ts(sleep_ns);
    const int r = ppoll(pfd, 3, sleep_ns == UINT64_MAX ? NULL : &ts, NULL);
    const int e = errno;
    pthread_mutex_lock(&d->mu);
    d->stats.sleeps++;
    int rc = KVS_OK;
    if (r < 0 && e != EINTR) {
        rc = KVS_ERROR_SET(&d->err, KVS_EBACKEND, e, "the driver's ppoll failed: %s: check the "
                           "backends' wait fds (a closed fd, the open file limit)",
                           strerror(e));
    } else if (r == 0) {
        if (caller_limit) {
            d->stats.wakes_timeout++;
            rc = KVS_EAGAIN;
        } else {
            d->stats.wakes_deadline++;
        }
    } else if (r > 0) {
        if (pfd[0].revents != 0)
            d->stats.wakes_call++;
        else if (pfd[1].revents != 0)
            d->stats.wakes_fabric++;
        else
            d->stats.wakes_device++;
    }
    pthread_mutex_unlock(&d->mu);
    if (r > 0 && pfd[0].revents != 0)
        hw_driver_drain(d); /* the pending flag is the next step's to take */
    return rc;
}

/* ---- the caller's loop ----------------------------------------------------------- */

static bool hw_driver_thread_runs(kvs_driver_t *d)
{
    pthread_mutex_lock(&d->mu);
    const bool running = d->running;
    pthread_mutex_unlock(&d->mu);
    return running;
}

int kvs_driver_progress(kvs_driver_t *d)
{
    if (d == NULL)
        return KVS_EINVAL;
    pthread_mutex_lock(&d->mu);
    const bool running = d->running;
    if (!running) { /* this thread is the loop's now */
        d->owner = pthread_self();
        d->owner_known = true;
    }
    pthread_mutex_unlock(&d->mu);
    if (running)
        return KVS_ERROR_SET(&d->err, KVS_ESTATE, 0, "kvs_driver_progress: the driver's "
                             "progress thread steps this rank: stop it first, or do not "
                             "start it when the caller's loop steps");
    return hw_driver_step(d);
}

int kvs_driver_wait(kvs_driver_t *d, uint64_t timeout_ns)
{
    if (d == NULL)
        return KVS_EINVAL;
    if (hw_driver_thread_runs(d))
        return KVS_ERROR_SET(&d->err, KVS_ESTATE, 0, "kvs_driver_wait: the driver's "
                             "progress thread steps this rank: stop it first, or do not "
                             "start it when the caller's loop waits");
    return hw_driver_sleep(d, timeout_ns);
}

/* ---- the progress thread ------------------------------------------------------------ */

static void *hw_driver_thread(void *arg)
{
    kvs_driver_t *d = arg;
    pthread_mutex_lock(&d->mu);
    d->owner = pthread_self();
    d->owner_known = true;
    pthread_mutex_unlock(&d->mu);
    int rc = KVS_OK;
    while (!atomic_load(&d->stop)) {
        rc = hw_driver_step(d);
        if (rc < 0 || atomic_load(&d->stop))
            break;
        rc = hw_driver_sleep(d, UINT64_MAX);
        if (rc < 0)
            break;
    }
    if (rc > 0)
        rc = KVS_OK;
    pthread_mutex_lock(&d->mu);
    d->thread_status = rc;
    pthread_mutex_unlock(&d->mu);
    if (rc < 0 && d->on_error != NULL)
        d->on_error(d->ctx, rc);
    return NULL;
}

int kvs_driver_start(kvs_driver_t *d)
{
    if (d == NULL)
        return KVS_EINVAL;
    pthread_mutex_lock(&d->mu);
    if (d->running) {
        pthread_mutex_unlock(&d->mu);
        return KVS_ERROR_SET(&d->err, KVS_EALREADY, 0, "kvs_driver_start: the progress "
                             "thread runs already: stop it before starting it again");
    }
    atomic_store(&d->stop, false);
    d->thread_status = KVS_OK;
    d->owner_known = false; /* until the thread says who it is */
    d->idle = true; /* whatever the caller's loop left: arm again */
    const int e = pthread_create(&d->thread, NULL, hw_driver_thread, d);
    d->running = e == 0;
    pthread_mutex_unlock(&d->mu);
    if (e != 0)
        return KVS_ERROR_SET(&d->err, KVS_EBACKEND, e, "kvs_driver_start: pthread_create "
                             "failed (%s): raise the process's thread limit (ulimit -u) or "
                             "drive the rank from the caller's loop (kvs_driver_progress, "
                             "kvs_driver_wait)", strerror(e));
    return KVS_OK;
}

int kvs_driver_stop(kvs_driver_t *d)
{
    if (d == NULL)
        return KVS_EINVAL;
    pthread_mutex_lock(&d->mu);
    const bool running = d->running;
    const bool self = running && d->owner_known && pthread_equal(d->owner, pthread_self());
    pthread_mutex_unlock(&d->mu);
    if (!running)
        return KVS_OK;
    if (self)
        return KVS_ERROR_SET(&d->err, KVS_ESTATE, 0, "kvs_driver_stop: called on the "
                             "driver's own thread (from on_result or on_error): stop it from "
                             "another thread");
    atomic_store(&d->stop, true);
    hw_driver_signal(d);
    pthread_join(d->thread, NULL);
    pthread_mutex_lock(&d->mu);
    d->running = false;
    d->owner_known = false;
    const int rc = d->thread_status;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

bool kvs_driver_running(kvs_driver_t *d)
{
    return d != NULL && hw_driver_thread_runs(d);
}

/* ---- what it saw ----------------------------------------------------------------- */

int kvs_driver_rank_error(kvs_driver_t *d, kvs_error_t *out)
{
    if (d == NULL || out == NULL)
        return KVS_EINVAL;
    pthread_mutex_lock(&d->mu);
    *out = *kvs_rank_last_error(d->rank);
    pthread_mutex_unlock(&d->mu);
    return out->status;
}

const kvs_error_t *kvs_driver_last_error(const kvs_driver_t *d)
{
    return d != NULL ? &d->err : NULL;
}

void kvs_driver_stats(kvs_driver_t *d, kvs_driver_stats_t *out)
{
    if (d == NULL || out == NULL)
        return;
    pthread_mutex_lock(&d->mu);
    *out = d->stats;
    pthread_mutex_unlock(&d->mu);
}
