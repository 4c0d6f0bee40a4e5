/*
 * driver.c - one rank on the simulation engine (see driver.h).
 */
#include "driver.h"

static void sim_driver_step(sim_engine_t *eng, void *ctx, uint64_t arg);

void sim_driver_init(sim_driver_t *d, sim_engine_t *eng, kvs_rank_t *rank, void *ctx,
                     void (*on_result)(void *ctx, const kvs_room_result_t *res),
                     void (*on_error)(void *ctx, int status))
{
    *d = (sim_driver_t){.eng = eng, .rank = rank, .ctx = ctx, .on_result = on_result,
                        .on_error = on_error};
}

void sim_driver_set_rank(sim_driver_t *d, kvs_rank_t *rank)
{
    d->rank = rank;
    d->wake_pending = false;
    d->timer_ns = 0;
    d->stall_timer_ns = 0;
}

/* A timer fired: the slot is free again if it was this timer's. */
static void sim_driver_timer(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_driver_t *d = ctx;
    (void)eng;
    if (d->timer_ns == arg)
        d->timer_ns = 0;
    sim_driver_wake(d);
}

static void sim_driver_stall_timer(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_driver_t *d = ctx;
    (void)eng;
    if (d->stall_timer_ns == arg)
        d->stall_timer_ns = 0;
    sim_driver_wake(d);
}

/* Arms `slot` for at unless it is armed for no later. */
static void sim_driver_arm(sim_driver_t *d, uint64_t at, uint64_t *slot, sim_event_fn fn)
{
    if (at == UINT64_MAX || (*slot != 0 && *slot <= at))
        return;
    const uint64_t now = sim_engine_now_ns(d->eng);
    *slot = at > now ? at : now;
    if (sim_engine_at(d->eng, *slot, fn, d, *slot, NULL) != KVS_OK)
        d->error = KVS_ENOMEM;
}

void sim_driver_wake(void *driver)
{
    sim_driver_t *d = driver;
    if (d->wake_pending || d->rank == NULL)
        return;
    d->wake_pending = true;
    if (sim_engine_after(d->eng, 0, sim_driver_step, d, 0, NULL) != KVS_OK)
        d->error = KVS_ENOMEM;
}

static void sim_driver_step(sim_engine_t *eng, void *ctx, uint64_t arg)
{
    sim_driver_t *d = ctx;
    (void)eng;
    (void)arg;
    d->wake_pending = false;
    if (d->rank == NULL)
        return; /* went down after this was scheduled */
    uint64_t next = UINT64_MAX;
    const int rc = kvs_rank_step(d->rank, d->on_result, d->ctx, &next);
    if (rc < 0) {
        if (d->on_error != NULL)
            d->on_error(d->ctx, rc);
        return;
    }
    if (d->on_step != NULL)
        d->on_step(d->ctx);
    if (d->rank == NULL)
        return;
    /* The contract: step again when the clock passes the next deadline. */
    const uint64_t stall = d->stall_ns != NULL ? d->stall_ns(d->rank) : UINT64_MAX;
    if (next < stall)
        sim_driver_arm(d, next, &d->timer_ns, sim_driver_timer);
    sim_driver_arm(d, stall, &d->stall_timer_ns, sim_driver_stall_timer);
}
