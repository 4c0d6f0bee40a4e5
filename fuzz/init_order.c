/*
 * init_order.c - the init-order fuzzer (ctest `init_order`): runs every order
 * of the init steps of spec §8 on the decode side and on the prefill side,
 * every order with one step left out and every order with one step done
 * twice, against the fake device and fabric of tests/fixtures/fake_backend.c, and
 * compares each returned code with a small reference model written from
 * spec §8 and the prototype comments of kvstage.h (never from src/).
 *
 * It also checks, after every step, that the fake backend holds exactly the
 * allocations, registrations, streams and events the model says the live
 * managers and handlers own (a step that fails changes nothing; a failed
 * handler creation leaves no half-built handler and sets *out to NULL), and
 * after every order that tearing down (handler, then manager) leaves nothing
 * behind and that kvs_manager_destroy refuses with KVS_EBUSY exactly while a
 * handler lives. A control message waits in the fabric from the start: it
 * must be held until a handler exists and then be consumed and counted, not
 * crash or vanish (spec §8, last paragraph).
 *
 * Prints "init-order: N orders checked, M mismatches" and the first
 * mismatches; exits 1 on any. It does not exercise the protocol beyond that
 * first message (tests/test_decode.c, test_prefill*.c, test_handler.c,
 * test_instance.c and the simulator do).
 */
#include <kvstage/backend.h>

#include "fake_backend.h"
#include "wire.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Under ASan/LSan (KVS_SANITIZE): name the order that crashed, and check for
 * host-memory leaks after each phase, not only at exit. */
#if defined(__SANITIZE_ADDRESS__)
#define IO_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IO_SANITIZED 1
#endif
#endif
#ifdef IO_SANITIZED
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#endif

/* ------------------------------------------------------------------------ */
/* Steps                                                                     */
/* ------------------------------------------------------------------------ */

enum {
    STEP_CREATE,   /* kvs_manager_create (a repeat makes a second manager) */
    STEP_INIT,     /* kvs_manager_init_staging */
    STEP_REGISTER, /* kvs_manager_register_staging */
    STEP_PUBLISH,  /* kvs_manager_set_kv_buffers (set_kv_buffer_tensors) */
    STEP_HEADS,    /* kvs_manager_set_heads(total = model's heads, per rank 0) */
    STEP_HANDLER,  /* kvs_decode_create / kvs_prefill_create */
    STEP_LISTEN,   /* kvs_decode_progress / kvs_prefill_progress */
    STEP_COUNT
};

#define BIT(s) (1u << (s))

static const char *const step_names[STEP_COUNT] = {"CREATE", "INIT",    "REGISTER", "PUBLISH",
                                                   "HEADS",  "HANDLER", "LISTEN"};

/* The longest order: every step once plus one repeat. */
#define ORDER_MAX (STEP_COUNT + 1)
/* Managers one order can make: CREATE at most twice. */
#define CTX_MAX 2

/* ------------------------------------------------------------------------ */
/* The model's world: one decode rank (TP 2, rank 0) fed by prefill TP 8,    */
/* and one prefill rank (TP 8, rank 3) feeding decode TP 2. The model has 8  */
/* KV heads; the configs start with both head counts 0 so HEADS matters.     */
/* ------------------------------------------------------------------------ */

#define LAYERS 8
#define MODEL_HEADS 8
#define PREFILL_WORKERS 2

typedef enum side { SIDE_DECODE = 0, SIDE_PREFILL = 1 } side_t;

static const char *const side_names[2] = {"decode", "prefill"};

static void quiet_log(void *user, kvs_log_level_t level, const char *msg)
{
    (void)user;
    (void)level;
    (void)msg;
}

static kvs_manager_config_t side_config(side_t side)
{
    kvs_manager_config_t c = {
        .staging = true,
        .total_heads = 0,
        .heads_per_rank = 0,
        .head_dim = 128,
        .dtype = KVS_DTYPE_BF16,
        .layers = LAYERS,
        .page_size = 16,
        .pp_size = 1,
        .chunk_tokens = 64,
        .ring_bytes = 1u << 20,
        .ring_max_live = 8,
        .transfer_workers = PREFILL_WORKERS,
        .max_rooms = 4,
        .max_inflight_writes = 4,
        .log = {.fn = quiet_log, .level = KVS_LOG_OFF},
    };
    if (side == SIDE_DECODE) {
        c.role = KVS_ROLE_DECODE;
        c.tp_rank = 0;
        c.tp_size = 2;
        c.peer_tp_size = 8;
    } else {
        c.role = KVS_ROLE_PREFILL;
        c.tp_rank = 3;
        c.tp_size = 8;
        c.peer_tp_size = 2;
    }
    return c;
}

/* Heads in this rank's KV pool: 8 over decode TP 2, 8 over prefill TP 8. */
static int64_t side_local_heads(side_t side)
{
    return side == SIDE_DECODE ? MODEL_HEADS / 2 : MODEL_HEADS / 8;
}

/* Staging buffers a manager owns once initialised: the decode ring, or one
 * per prefill transfer worker (spec §8). */
static int side_buffers(side_t side) { return side == SIDE_DECODE ? 1 : PREFILL_WORKERS; }

/* ------------------------------------------------------------------------ */
/* The reference model (spec §8, kvstage.h)                                  */
/* ------------------------------------------------------------------------ */

/*
 * Expected status of a step given the set of steps that already SUCCEEDED on
 * the current manager (the one the last successful CREATE made; `have_m`
 * false before any). Rules are checked top-down per step; the first that
 * applies gives the code. Derived from the spec and the header only:
 *
 * step     | code            | when                        | from
 * ---------+-----------------+-----------------------------+----------------------------------
 * any but  | EINVAL          | no manager (m == NULL)      | header conventions: a NULL object
 * CREATE,  |                 |                             | is an invalid argument
 * LISTEN   |                 |                             |
 * CREATE   | OK              | always (config is valid)    | kvs_manager_create; a repeat makes
 *          |                 |                             | a second, independent manager that
 *          |                 |                             | becomes the current one
 * INIT     | EALREADY        | INIT done                   | KVS_EALREADY: "call it once per
 *          |                 |                             | object"
 *          | EHEADS          | prefill and HEADS not done  | §8: a prefill buffer is F * ps *
 *          |                 |                             | (one token, all layers, K+V), which
 *          |                 |                             | needs the heads; EHEADS = "total KV
 *          |                 |                             | heads unresolvable"
 *          | OK              | otherwise (the decode ring  | §8, §10: ring size is a knob
 *          |                 | size needs no heads)        |
 * REGISTER | ESTATE          | INIT not done               | header: "Needs init_staging first";
 *          |                 |                             | KVS_ESTATE's init order
 *          | EALREADY        | REGISTER done               | KVS_EALREADY
 *          | OK              | otherwise                   |
 * PUBLISH  | EALREADY        | PUBLISH done                | header: "Once per manager"
 *          | OK              | otherwise (any time before  | §8 order is advice, the guards
 *          |                 | the handler)                | are at handler creation
 * HEADS    | ESTATE          | HANDLER done                | header: "Allowed until a handler
 *          |                 |                             | is created"
 *          | OK              | otherwise, repeats included | (no "once" in the header)
 * HANDLER  | EALREADY        | HANDLER done                | header: "One handler per manager"
 *          | ENO_ALLOCATOR   | INIT not done               | §8 guard 1; header guard order
 *          | ESTATE          | REGISTER not done           | header guard order (registration)
 *          | ENO_KV_BUFFERS  | PUBLISH not done            | §8 guard 2 (the seed error)
 *          | EHEADS          | HEADS not done              | §8 guard 3: neither total nor
 *          |                 |                             | per-rank heads > 0
 *          | OK              | otherwise                   | and *out is NULL on every failure
 *          |                 |                             | ("a failed create leaves nothing")
 * LISTEN   | EINVAL          | no handler on the current   | §8 last paragraph: a message before
 *          |                 | manager: progress(NULL)     | the handler is held or refused
 *          |                 |                             | cleanly; here it stays in the fabric
 *          | OK (any >= 0)   | otherwise; the held message | progress returns work done, never
 *          |                 | is consumed and counted     | an error on a healthy fabric
 *
 * HANDLER's EALREADY sits last in the header's list but first here: a
 * handler exists only after every guard passed, so the two orders agree.
 *
 * Resources the model says exist (checked after every step): per live
 * manager, side_buffers() device allocations once INIT succeeded and as many
 * registrations once REGISTER succeeded; one stream per live handler (both
 * sides run the staging path: TP 8 -> 2); no events. Teardown: destroy of a
 * manager with a live handler is KVS_EBUSY and frees nothing; after the
 * handler is destroyed it is KVS_OK and everything is gone.
 */

/* What the model expects: a status, or "any non-negative" for LISTEN. */
typedef struct expect {
    int status;
    bool any_non_negative;
} expect_t;

static expect_t model_expect(side_t side, int step, bool have_m, unsigned done)
{
    expect_t e = {KVS_OK, false};
    if (step == STEP_CREATE)
        return e;
    if (step == STEP_LISTEN) {
        if (!have_m || !(done & BIT(STEP_HANDLER)))
            e.status = KVS_EINVAL;
        else
            e.any_non_negative = true;
        return e;
    }
    if (!have_m) {
        e.status = KVS_EINVAL;
        return e;
    }
    switch (step) {
    case STEP_INIT:
        if (done & BIT(STEP_INIT))
            e.status = KVS_EALREADY;
        else if (side == SIDE_PREFILL && !(done & BIT(STEP_HEADS)))
            e.status = KVS_EHEADS;
        break;
    case STEP_REGISTER:
        if (!(done & BIT(STEP_INIT)))
            e.status = KVS_ESTATE;
        else if (done & BIT(STEP_REGISTER))
            e.status = KVS_EALREADY;
        break;
    case STEP_PUBLISH:
        if (done & BIT(STEP_PUBLISH))
            e.status = KVS_EALREADY;
        break;
    case STEP_HEADS:
        if (done & BIT(STEP_HANDLER))
            e.status = KVS_ESTATE;
        break;
    case STEP_HANDLER:
        if (done & BIT(STEP_HANDLER))
            e.status = KVS_EALREADY;
        else if (!(done & BIT(STEP_INIT)))
            e.status = KVS_ENO_ALLOCATOR;
        else if (!(done & BIT(STEP_REGISTER)))
            e.status = KVS_ESTATE;
        else if (!(done & BIT(STEP_PUBLISH)))
            e.status = KVS_ENO_KV_BUFFERS;
        else if (!(done & BIT(STEP_HEADS)))
            e.status = KVS_EHEADS;
        break;
    default:
        break;
    }
    return e;
}

/* ------------------------------------------------------------------------ */
/* A fabric with one control message waiting                                 */
/* ------------------------------------------------------------------------ */

/* The fake fabric plus a poll that delivers `pending` copies of one stray
 * control message, then reports no completions. */
typedef struct io_fabric {
    fake_fabric_t fake; /* first */
    int pending;
    uint32_t msg_len;
    uint8_t msg[KVS_CONTROL_MSG_MAX_BYTES];
} io_fabric_t;

static int io_poll(kvs_fabric_t *base, kvs_completion_t *out, int max)
{
    io_fabric_t *f = KVS_CONTAINER_OF(KVS_CONTAINER_OF(base, fake_fabric_t, base),
                                      io_fabric_t, fake);
    if (f->pending == 0 || max < 1)
        return 0;
    memset(out, 0, sizeof *out);
    out->kind = KVS_COMPLETION_RECV;
    out->status = KVS_OK;
    out->conn = NULL; /* from nobody this rank connected to */
    out->len_bytes = f->msg_len;
    memcpy(out->msg, f->msg, f->msg_len);
    f->pending--;
    return 1;
}

/* The first message each side sees in the field: the decode an answer to a
 * registration it never sent, the prefill a decode's REGISTER (with a
 * fingerprint that cannot match, so it is refused). */
static void io_fabric_setup(io_fabric_t *f, side_t side)
{
    memset(f, 0, sizeof *f);
    fake_fabric_setup(&f->fake, KVS_FABRIC_CAP_WRITE_IMM);
    f->fake.base.ops.poll = io_poll;
    kvs_msg_t msg;
    memset(&msg, 0, sizeof msg);
    if (side == SIDE_DECODE) {
        msg.type = KVS_MSG_REGISTER_ACK;
        msg.session = 99;
        msg.u.ack = (kvs_msg_register_ack_t){.echo = 77, .tp_rank = 0, .pp_rank = 0,
                                             .status = KVS_OK, .cp_size = 1};
    } else {
        msg.type = KVS_MSG_REGISTER;
        msg.session = 77;
        msg.u.reg = (kvs_msg_register_t){.tp_rank = 0, .tp_size = 2,
                                         .pp_rank = 0, .pp_size = 1, .ring_addr = 1u << 20,
                                         .ring_bytes = 1u << 20, .ring_rkey = 5};
    }
    int rc = kvs__wire_encode(&msg, f->msg, sizeof f->msg, &f->msg_len);
    if (rc != KVS_OK) {
        fprintf(stderr, "init-order: cannot encode the held message: %s\n",
                kvs_status_name(rc));
        exit(2);
    }
    f->pending = 1;
}

/* ------------------------------------------------------------------------ */
/* Running one order                                                         */
/* ------------------------------------------------------------------------ */

typedef struct ctx {
    kvs_manager_t *m;
    void *handler;  /* kvs_decode_t * or kvs_prefill_t * */
    unsigned done;  /* steps that succeeded on m */
} ctx_t;

typedef struct mismatch {
    side_t side;
    int order[ORDER_MAX];
    int len;
    int at;          /* index in order; -1 for teardown */
    char what[160];
} mismatch_t;

#define MISMATCH_SHOWN 12

typedef struct run {
    /* Per order. */
    side_t side;
    fake_device_t dev;
    io_fabric_t fab;
    uint64_t k[LAYERS], v[LAYERS];
    kvs_kv_buffers_t kv;
    ctx_t ctx[CTX_MAX + 1]; /* managers, plus a slot for a stray handler */
    int nctx;
    int cur;                /* the current manager's slot, -1 before CREATE */
    bool trace;             /* INIT_ORDER_TRACE set: print each order first */
    const int *order;
    int len;
    bool order_failed;
    /* Totals. */
    long orders;
    long mismatched_orders;
    long mismatches;
    mismatch_t shown[MISMATCH_SHOWN];
    int nshown;
} run_t;

static void format_order(char *buf, size_t cap, const int *order, int len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < len && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? "," : "",
                                 step_names[order[i]]);
}

static void mismatch(run_t *r, int at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void mismatch(run_t *r, int at, const char *fmt, ...)
{
    r->mismatches++;
    if (!r->order_failed)
        r->mismatched_orders++;
    r->order_failed = true;
    if (r->nshown == MISMATCH_SHOWN)
        return;
    mismatch_t *s = &r->shown[r->nshown++];
    s->side = r->side;
    s->len = r->len;
    memcpy(s->order, r->order, (size_t)r->len * sizeof *r->order);
    s->at = at;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->what, sizeof s->what, fmt, ap);
    va_end(ap);
}

static ctx_t *current(run_t *r) { return r->cur >= 0 ? &r->ctx[r->cur] : NULL; }

static kvs_handler_stats_t handler_stats(side_t side, void *h)
{
    kvs_handler_stats_t st;
    memset(&st, 0, sizeof st);
    if (side == SIDE_DECODE)
        kvs_decode_stats(h, &st);
    else
        kvs_prefill_stats(h, &st);
    return st;
}

/* The backend's live objects must equal what the model says the live
 * managers and handlers own. */
static void check_resources(run_t *r, int at, const char *when)
{
    int allocs = 0, mrs = 0, streams = 0;
    for (int i = 0; i < r->nctx; i++) {
        const ctx_t *c = &r->ctx[i];
        if (c->handler != NULL)
            streams++;
        if (c->m == NULL)
            continue;
        if (c->done & BIT(STEP_INIT))
            allocs += side_buffers(r->side);
        if (c->done & BIT(STEP_REGISTER))
            mrs += side_buffers(r->side);
    }
    if (r->dev.live_allocs != allocs || r->fab.fake.live_mrs != mrs ||
        r->dev.live_streams != streams || r->dev.live_events != 0)
        mismatch(r, at, "%s: backend holds allocs %d mrs %d streams %d events %d, "
                 "model %d %d %d 0", when, r->dev.live_allocs, r->fab.fake.live_mrs,
                 r->dev.live_streams, r->dev.live_events, allocs, mrs, streams);
}

static void destroy_handler(side_t side, void *h)
{
    if (side == SIDE_DECODE)
        kvs_decode_destroy(h);
    else
        kvs_prefill_destroy(h);
}

static int do_step(run_t *r, int step, int at)
{
    ctx_t *c = current(r);
    kvs_manager_t *m = c != NULL ? c->m : NULL;
    switch (step) {
    case STEP_CREATE: {
        kvs_manager_config_t cfg = side_config(r->side);
        kvs_manager_t *out = (kvs_manager_t *)&out; /* must be overwritten */
        kvs_error_t err;
        int rc = kvs_manager_create(&cfg, &r->dev.base, &r->fab.fake.base, &out, &err);
        if (rc == KVS_OK && out != NULL && r->nctx < CTX_MAX + 1) {
            r->cur = r->nctx;
            r->ctx[r->nctx++] = (ctx_t){.m = out, .done = BIT(STEP_CREATE)};
        } else if (rc != KVS_OK && out != NULL)
            mismatch(r, at, "CREATE failed (%s) but left *out non-NULL", kvs_status_name(rc));
        return rc;
    }
    case STEP_INIT:
        return kvs_manager_init_staging(m);
    case STEP_REGISTER:
        return kvs_manager_register_staging(m);
    case STEP_PUBLISH:
        return kvs_manager_set_kv_buffers(m, &r->kv);
    case STEP_HEADS:
        return kvs_manager_set_heads(m, MODEL_HEADS, 0);
    case STEP_HANDLER: {
        void *h = &h; /* sentinel: a failed create must write NULL */
        int rc;
        if (r->side == SIDE_DECODE) {
            kvs_decode_t *d = (kvs_decode_t *)h;
            rc = kvs_decode_create(m, &d);
            h = d;
        } else {
            kvs_prefill_t *p = (kvs_prefill_t *)h;
            rc = kvs_prefill_create(m, &p);
            h = p;
        }
        if (rc != KVS_OK && h != NULL)
            mismatch(r, at, "HANDLER failed (%s) but *out is not NULL (half-built "
                     "handler)", kvs_status_name(rc));
        if (rc == KVS_OK && h == NULL)
            mismatch(r, at, "HANDLER returned KVS_OK with *out NULL");
        if (rc == KVS_OK && h != NULL && c == NULL) {
            mismatch(r, at, "HANDLER made a handler without a manager");
            destroy_handler(r->side, h); /* best effort; it has no manager to detach */
        } else if (rc == KVS_OK && h != NULL) {
            if (c->handler != NULL && r->nctx < CTX_MAX + 1) {
                /* A second handler on one manager: the model refuses it. It
                 * was reported; park it in a spare slot so teardown frees it. */
                r->ctx[r->nctx++] = (ctx_t){.m = NULL, .handler = h};
            } else {
                c->handler = h;
            }
        }
        return rc;
    }
    case STEP_LISTEN: {
        void *h = c != NULL ? c->handler : NULL;
        const int pending = r->fab.pending;
        kvs_handler_stats_t before = {0};
        if (h != NULL)
            before = handler_stats(r->side, h);
        int rc = r->side == SIDE_DECODE ? kvs_decode_progress(h) : kvs_prefill_progress(h);
        if (h == NULL && r->fab.pending != pending)
            mismatch(r, at, "LISTEN without a handler consumed the held message");
        if (h != NULL && rc >= 0) {
            kvs_handler_stats_t after = handler_stats(r->side, h);
            const uint64_t seen = after.msgs_received + after.msgs_rejected -
                                  before.msgs_received - before.msgs_rejected;
            if (r->fab.pending != 0 || seen != (uint64_t)pending)
                mismatch(r, at, "LISTEN: %d message(s) were waiting, %d still wait, the "
                         "handler counted %llu", pending, r->fab.pending,
                         (unsigned long long)seen);
        }
        return rc;
    }
    default:
        return KVS_EINVAL;
    }
}

static void teardown(run_t *r)
{
    for (int i = r->nctx - 1; i >= 0; i--) {
        ctx_t *c = &r->ctx[i];
        if (c->m != NULL && c->handler != NULL) {
            const int allocs = r->dev.live_allocs, mrs = r->fab.fake.live_mrs;
            int rc = kvs_manager_destroy(c->m);
            if (rc != KVS_EBUSY) {
                mismatch(r, -1, "manager %d destroyed under a live handler: %s, want "
                         "KVS_EBUSY", i, kvs_status_name(rc));
                if (rc == KVS_OK) { /* freed: nothing safe left to do with it */
                    c->m = NULL;
                    c->handler = NULL;
                    continue;
                }
            }
            if (r->dev.live_allocs != allocs || r->fab.fake.live_mrs != mrs)
                mismatch(r, -1, "refused destroy of manager %d freed something", i);
        }
        if (c->handler != NULL)
            destroy_handler(r->side, c->handler);
        c->handler = NULL;
        if (c->m != NULL) {
            int rc = kvs_manager_destroy(c->m);
            if (rc != KVS_OK)
                mismatch(r, -1, "manager %d without a handler: destroy %s, want KVS_OK", i,
                         kvs_status_name(rc));
        }
        c->m = NULL;
    }
    r->nctx = 0;
    r->cur = -1;
    if (r->dev.live_allocs || r->fab.fake.live_mrs || r->dev.live_streams ||
        r->dev.live_events)
        mismatch(r, -1, "leak after teardown: allocs %d mrs %d streams %d events %d",
                 r->dev.live_allocs, r->fab.fake.live_mrs, r->dev.live_streams,
                 r->dev.live_events);
}

static void run_order(run_t *r, side_t side, const int *order, int len)
{
    r->side = side;
    r->order = order;
    r->len = len;
    r->order_failed = false;
    r->nctx = 0;
    r->cur = -1;
    memset(r->ctx, 0, sizeof r->ctx);
    fake_device_setup(&r->dev);
    io_fabric_setup(&r->fab, side);
    r->kv = (kvs_kv_buffers_t){.num_layers = LAYERS, .k_base = r->k, .v_base = r->v,
                               .local_heads = side_local_heads(side), .page_size = 16,
                               .num_pages = 64};
    if (r->trace) {
        char text[256];
        format_order(text, sizeof text, order, len);
        fprintf(stderr, "init-order: %s [%s]\n", side_names[side], text);
    }
    bool listened = false;
    for (int i = 0; i < len; i++) {
        const int step = order[i];
        ctx_t *c = current(r);
        const bool have_m = c != NULL;
        const unsigned done = have_m ? c->done : 0;
        const expect_t want = model_expect(side, step, have_m, done);
        const bool had_handler = have_m && c->handler != NULL;
        const int rc = do_step(r, step, i);
        const bool ok = want.any_non_negative ? rc >= 0 : rc == want.status;
        if (!ok)
            mismatch(r, i, "%s returned %s (%d), model wants %s", step_names[step],
                     kvs_status_name(rc), rc,
                     want.any_non_negative ? ">= 0" : kvs_status_name(want.status));
        if (step == STEP_LISTEN && rc >= 0)
            listened = true;
        /* Follow what really happened, so one mismatch does not cascade. */
        c = current(r);
        if (rc >= 0 && step != STEP_CREATE && c != NULL)
            c->done |= BIT(step);
        /* A refused step names its reason on the manager (spec §8: each guard
         * an actionable message). */
        if (rc < 0 && c != NULL && c->m != NULL && step != STEP_LISTEN &&
            step != STEP_CREATE) {
            const kvs_error_t *e = kvs_manager_last_error(c->m);
            if (e == NULL || e->status != rc || e->msg[0] == '\0')
                mismatch(r, i, "%s failed with %s but the manager's last error says %s "
                         "\"%s\"", step_names[step], kvs_status_name(rc),
                         e != NULL ? kvs_status_name(e->status) : "(none)",
                         e != NULL ? e->msg : "");
        }
        if (step == STEP_HANDLER && rc != KVS_OK && have_m && !had_handler &&
            kvs_manager_layout(c->m) != NULL)
            mismatch(r, i, "failed HANDLER left a layout on the manager (half-built)");
        check_resources(r, i, step_names[step]);
    }
    if (!listened && r->fab.pending != 1)
        mismatch(r, -1, "the held control message vanished without a LISTEN");
    teardown(r);
    r->orders++;
}

#ifdef IO_SANITIZED
/* The run a sanitizer report interrupts. The one piece of process-wide state
 * here, read only by the death callback to name the failing order. */
static const run_t *io_dying_run;

static void io_on_death(void)
{
    const run_t *r = io_dying_run;
    if (r == NULL || r->order == NULL)
        return;
    char order[256];
    format_order(order, sizeof order, r->order, r->len);
    fprintf(stderr, "init-order: died in %s order [%s] after %ld orders\n",
            side_names[r->side], order, r->orders);
}
#endif

/* Host-memory leaks LeakSanitizer sees now (the fake backend's counters
 * cover device memory and registrations only). */
static void check_host_leaks(run_t *r, const char *phase)
{
#ifdef IO_SANITIZED
    if (__lsan_do_recoverable_leak_check() != 0) {
        r->mismatches++;
        printf("  mismatch: %s: LeakSanitizer found host memory leaked (report on "
               "stderr)\n", phase);
    }
#else
    (void)r;
    (void)phase;
#endif
}

/* ------------------------------------------------------------------------ */
/* Enumeration                                                               */
/* ------------------------------------------------------------------------ */

/* Next lexicographic permutation of a[0..n); false after the last. */
static bool next_permutation(int *a, int n)
{
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0)
        return false;
    int j = n - 1;
    while (a[j] <= a[i])
        j--;
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
    for (int lo = i + 1, hi = n - 1; lo < hi; lo++, hi--) {
        t = a[lo];
        a[lo] = a[hi];
        a[hi] = t;
    }
    return true;
}

typedef struct counts {
    long full, omitted, repeated;
} counts_t;

static void run_side(run_t *r, side_t side, counts_t *n)
{
    int perm[STEP_COUNT];
    int order[ORDER_MAX];

    /* Every permutation of the seven steps, and each with one step done again
     * later: the second copy goes at every position after the first, so each
     * distinct order with one repeat runs exactly once. */
    for (int i = 0; i < STEP_COUNT; i++)
        perm[i] = i;
    do {
        run_order(r, side, perm, STEP_COUNT);
        n->full++;
        for (int first = 0; first < STEP_COUNT; first++) {
            for (int pos = first + 1; pos <= STEP_COUNT; pos++) {
                int len = 0;
                for (int i = 0; i < STEP_COUNT; i++) {
                    if (i == pos)
                        order[len++] = perm[first];
                    order[len++] = perm[i];
                }
                if (pos == STEP_COUNT)
                    order[len++] = perm[first];
                run_order(r, side, order, len);
                n->repeated++;
            }
        }
    } while (next_permutation(perm, STEP_COUNT));
    check_host_leaks(r, side == SIDE_DECODE ? "decode, full and repeated orders"
                                            : "prefill, full and repeated orders");

    /* Every permutation of the other six, for each step left out. */
    for (int skip = 0; skip < STEP_COUNT; skip++) {
        int len = 0;
        for (int i = 0; i < STEP_COUNT; i++)
            if (i != skip)
                perm[len++] = i;
        do {
            run_order(r, side, perm, len);
            n->omitted++;
        } while (next_permutation(perm, len));
    }
    check_host_leaks(r, side == SIDE_DECODE ? "decode, orders with a step omitted"
                                            : "prefill, orders with a step omitted");
}

int main(void)
{
    static run_t r; /* large; one per process, never shared */
    memset(&r, 0, sizeof r);
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive a sanitizer's exit */
    /* A UBSan abort (its own runtime under gcc) skips the death callback:
     * INIT_ORDER_TRACE=1 prints every order before it runs. */
    const char *trace = getenv("INIT_ORDER_TRACE");
    r.trace = trace != NULL && trace[0] != '\0' && strcmp(trace, "0") != 0;
#ifdef IO_SANITIZED
    io_dying_run = &r;
    __sanitizer_set_death_callback(io_on_death);
#endif
    for (int i = 0; i < LAYERS; i++) {
        r.k[i] = 0x1000u * (uint64_t)(i + 1);
        r.v[i] = 0x100000u * (uint64_t)(i + 1);
    }
    if (kvs_manager_destroy(NULL) != KVS_OK) {
        printf("init-order: kvs_manager_destroy(NULL) is not a no-op\n");
        return 1;
    }
    counts_t n[2] = {{0}};
    run_side(&r, SIDE_DECODE, &n[SIDE_DECODE]);
    run_side(&r, SIDE_PREFILL, &n[SIDE_PREFILL]);

    for (int s = 0; s < 2; s++)
        printf("init-order: %s: %ld full, %ld with one step omitted, %ld with one step "
               "repeated\n", side_names[s], n[s].full, n[s].omitted, n[s].repeated);
    for (int i = 0; i < r.nshown; i++) {
        const mismatch_t *m = &r.shown[i];
        char order[256];
        format_order(order, sizeof order, m->order, m->len);
        if (m->at >= 0)
            printf("  mismatch: %s [%s] step %d (%s): %s\n", side_names[m->side], order,
                   m->at + 1, step_names[m->order[m->at]], m->what);
        else
            printf("  mismatch: %s [%s] teardown: %s\n", side_names[m->side], order,
                   m->what);
    }
    if (r.mismatches > (long)r.nshown)
        printf("  ... %ld more\n", r.mismatches - (long)r.nshown);
    if (r.mismatches > 0)
        printf("init-order: %ld order(s) with a mismatch\n", r.mismatched_orders);
    printf("init-order: %ld orders checked, %ld mismatches\n", r.orders, r.mismatches);
    fflush(stdout);
    return r.mismatches == 0 ? 0 : 1;
}
