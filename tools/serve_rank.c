/*
 * serve_rank.c - one rank of `kvstage serve` (see serve_rank.h).
 *
 * Set-up: host device, verbs or ofi fabric (prefill rank (t, s) of CP rank c
 * listens on listen_port + (c * Pp + s) * P + t), KV pool of this rank's layers, then the rank
 * itself (kvs_rank_create: manager, staging memory and its registration,
 * KV layers, handler, in the library's init order) and its driver
 * (kvstage/driver.h, hw/driver/). What is serve's own stays here: the
 * workload, the data pattern, the verification, the fault and hold
 * injection and the messages.
 *
 * A decode rank then declares every prefill instance of the plan (its
 * geometry and its ranks' addresses), connects to each rank of each that
 * takes part in its rooms (its TP sources, at each prefill stage holding
 * its layers: with MLA the writer and the silent ones that only report)
 * and waits until all of them acknowledged its registration (the handler
 * keeps retrying a prefill that is not up yet), so no room fails for a
 * peer still starting; it drives the rank in its own loop for that
 * (kvs_driver_progress / kvs_driver_wait), since it must look at the rank
 * after every step. A refused registration (the processes were given
 * different shapes) never heals: the rank stops at once with the core's
 * message, which names the setting that differs.
 *
 * The run: the driver's progress thread steps the rank and sleeps on the
 * fabric's and the device's wait fds; this thread keeps max_inflight of
 * the rooms this process serves open (room i's pages are pool pages
 * first_page[i].., reversed on the prefill side so the page lists differ;
 * the decode names the room's prefill instance, a prefill the decode
 * instance 0), takes the results the driver hands over and checks them.
 * With prefill CP each CP rank fills the pattern of its own token range
 * only (kvs_layout_cp_range: a short prompt leaves the last ones nothing)
 * in the pages the room's list puts those tokens in, and reports the
 * room's tokens computed as a rank without CP does.
 * It sleeps on a condition the results signal, waking every
 * CLI_SERVE_CHECK_NS to look at the process's stop flag, the time-out and
 * a refused registration. A prefill fills the pattern and reports the
 * whole prompt computed, one grid step at a time, as soon as it opens a
 * room (with PP, each stage fills and sends its own layers); under --fault
 * hold-from it opens the rooms from then on but never computes them, and
 * its rank (0, 0) says so on stderr once every room of it before them is
 * over, so a test knows when killing the process catches its rooms open.
 * After the last result, or after the rank stopped, the driver keeps
 * serving its peer for linger_ns, so the peer's last messages are
 * answered (or told why they were refused) before the fabric closes.
 */
#include "serve_discovery.h"
#include "serve_metrics.h"
#include "serve_rank.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvstage/backend.h>
#include <kvstage/driver.h>
#include <kvstage/fault_fabric.h>
#include <kvstage/host.h>
#include <kvstage/sim.h>
#include <kvstage/verbs.h>
#ifdef KVS_CLI_OFI
#include <kvstage/ofi.h>
#endif

/* How often a rank's thread, waiting for results, looks at the process's
 * stop flag (a sibling rank failed), the time-out and a refused
 * registration. The driver's thread does not wake for it. */
#define CLI_SERVE_CHECK_NS 10000000u
/* How often the linger looks again for unacknowledged messages. */
#define CLI_SERVE_UNACKED_NS 2000000u

/* How far --fault hostile-write moves its write: past any region of
 * serve's checks' shapes (test_serve.sh: at most 192 KiB), still inside
 * their 1 MiB ring when the region starts in its first 768 KiB. */
#define CLI_FAULT_HOSTILE_SHIFT (UINT64_C(256) << 10)

/* Which writes a --fault write fault may spoil: any but one under a split
 * registration's handle (bit 63 of the key, the verbs fabric's: the
 * fabric looks the piece's key up behind it, so flipping its low bits
 * names no unregistered key); the next plain write is taken instead. */
static bool cli_rank_fault_pick(void *ctx, kvs_conn_t *conn, const kvs_write_desc_t *desc)
{
    (void)ctx;
    (void)conn;
    return (desc->rkey >> 63) == 0;
}

typedef struct cli_rank_ctx {
    cli_serve_rank_t *r;
    const cli_serve_plan_t *plan;
    const kvs_layout_t *lay;
    kvs_host_device_t *host;
    kvs_device_t *dev;
    kvs_fabric_t *real;         /* the real fabric (verbs or ofi) */
    kvs_fault_fabric_t *fault;  /* wrapper when this rank injects a fault */
    kvs_fabric_t *fab;          /* what the core uses */
    kvs_rank_t *rank;
    kvs_driver_t *drv;
    uint64_t pool_addr, layer_bytes;
    uint8_t *pool;
    int64_t layers, heads;
    int64_t ps;                 /* tokens per page of its own pool: the
                                   prefill's page_size, the decode's
                                   decode_page_size */
    int64_t planes;             /* buffers per layer: 2 (K, V), 1 (MLA) */
    int64_t scale_bytes;        /* of one head's scales in a token row, 0: none */
    uint64_t scale_base;        /* pool offset of the scale buffers (after the KV) */
    uint64_t scale_layer_bytes; /* one scale buffer: [slot][head][scale_bytes] */
    int64_t first_layer;        /* global id of its stage's first layer */
    /* Hybrid state layers (docs/kinds/hybrid.md): per layer of its stage,
     * the pool offset of its state buffer (0 for other layers), one slot a
     * room: [room][local state head][state_head_bytes]. */
    uint64_t *state_off;
    int64_t state_heads;        /* local state heads, 0 without state layers */
    /* A draft model's layers (docs/kinds/draft.md): their K and V buffers
     * after everything else, [plane][draft layer] of draft_layer_bytes,
     * laid out as the model's ([slot][head][draft_head_dim]); 0: none (no
     * draft, or a stage before the last with PP). */
    uint64_t draft_base, draft_layer_bytes;
    int64_t *pages;             /* scratch page list of one room */
    uint32_t served;            /* rooms this process serves */
    uint32_t hold_before, hold_done; /* prefill, --fault hold-from: its rooms
                                        before the held ones, and how many
                                        of them are over */
    bool hold_told;             /* the hold was announced on stderr */
    /* What the driver's thread hands over (mu; cv signalled on each). */
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* on CLOCK_MONOTONIC */
    bool sync_ok;               /* mu and cv were made */
    kvs_room_result_t *inbox;   /* [served + 1]: results not taken yet */
    kvs_room_result_t *taken;   /* [served + 1]: scratch of this thread */
    uint32_t inbox_n;
    bool inbox_overflow;        /* more results than rooms: a protocol error */
    bool fabric_failed;         /* a step failed: nothing more to serve */
} cli_rank_ctx_t;

static int cli_rank_fail(cli_rank_ctx_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the rank's first fatal error and stops the process's other
 * ranks. Any of the rank's threads (the driver's reports a failed step). */
static int cli_rank_fail(cli_rank_ctx_t *c, int status, const char *fmt, ...)
{
    if (c->sync_ok)
        pthread_mutex_lock(&c->mu);
    if (c->r->fatal == KVS_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->r->err, sizeof c->r->err, fmt, ap);
        va_end(ap);
        c->r->fatal = status;
    }
    if (c->sync_ok)
        pthread_mutex_unlock(&c->mu);
    atomic_store(c->r->stop, true);
    return status;
}

/* This rank failed, or a sibling did (every failure sets the flag). */
static bool cli_rank_stopped(const cli_rank_ctx_t *c) { return atomic_load(c->r->stop); }

static int64_t cli_rank_pp_size(const cli_rank_ctx_t *c)
{
    return c->r->role == KVS_ROLE_DECODE ? c->lay->decode_pp : c->lay->prefill_pp;
}

/* The prefill's CP size on this rank's side: its own, 1 on a decode. */
static int64_t cli_rank_cp_size(const cli_rank_ctx_t *c)
{
    return c->r->role == KVS_ROLE_DECODE ? 1 : c->lay->prefill_cp;
}

/* "prefill rank 1", "prefill rank 1 stage 0" when the role has PP > 1,
 * "prefill rank 1 cp 1" (or "... stage 0 cp 1") with prefill CP. */
static const char *cli_rank_name(const cli_rank_ctx_t *c, char *buf, size_t len)
{
    const char *role = c->r->role == KVS_ROLE_DECODE ? "decode" : "prefill";
    char cp[32] = "";
    if (cli_rank_cp_size(c) > 1)
        snprintf(cp, sizeof cp, " cp %lld", (long long)c->r->cp);
    if (cli_rank_pp_size(c) > 1)
        snprintf(buf, len, "%s rank %lld stage %lld%s", role, (long long)c->r->tp,
                 (long long)c->r->pp, cp);
    else
        snprintf(buf, len, "%s rank %lld%s", role, (long long)c->r->tp, cp);
    return buf;
}

/* This rank's index in its instance: (c * PP + s) * TP + t, the order of
 * its port, its --device entry and kvs_instance_desc_t.addrs. */
static int64_t cli_rank_index(const cli_rank_ctx_t *c)
{
    const bool decode = c->r->role == KVS_ROLE_DECODE;
    const int64_t tp = decode ? c->lay->decode_tp : c->lay->prefill_tp;
    return (c->r->cp * cli_rank_pp_size(c) + c->r->pp) * tp + c->r->tp;
}

/* The fabric's and the rank's log: one stderr line, naming the rank. */
static void cli_rank_log(void *user, kvs_log_level_t level, const char *msg)
{
    char who[48];
    fprintf(stderr, "kvstage serve: %s: %s\n", cli_rank_name(user, who, sizeof who), msg);
}

/* The rank's own log (rooms failing, peers lost, refusals): errors only,
 * unless KVS_LOG_LEVEL asks for more (warn, info, debug), as when chasing
 * why a room failed. */
static kvs_log_level_t cli_rank_log_level(void)
{
    kvs_log_level_t level = KVS_LOG_ERROR;
    (void)kvs_log_level_parse(getenv(KVS_LOG_ENV), &level);
    return level;
}

/* Prefill ranks that take part in one decode rank's rooms in a pair, the
 * ones it registers with: its TP sources at every prefill stage that holds
 * its layers (the first holder of each distinct KV or state head
 * writes, the others, as MLA's all but one, report their status only),
 * of every CP rank. */
static int64_t cli_rank_sources(const kvs_layout_t *l)
{
    return l->tp_sources * (l->decode_pp == 1 ? l->prefill_pp : 1) *
           (l->prefill_cp > 1 ? l->prefill_cp : 1);
}

/* The rank's last error message, taken under its lock (the driver's thread
 * may be stepping). */
static const char *cli_rank_msg(cli_rank_ctx_t *c, kvs_error_t *e)
{
    if (c->drv == NULL || kvs_driver_rank_error(c->drv, e) == KVS_EINVAL)
        e->msg[0] = '\0';
    return e->msg;
}

/* Global head of local head j on a rank of TP tp_size holding `heads`
 * heads (replicated heads: the ranks sharing one map by division). */
static int64_t cli_global_head(int64_t total, int64_t tp_size, int64_t rank, int64_t heads,
                               int64_t j)
{
    if (total >= tp_size)
        return rank * heads + j;
    return rank / (tp_size / total);
}

/* Page j of room i on this rank (n pages of its own size). */
static int64_t cli_page(const cli_rank_ctx_t *c, uint32_t i, int64_t j, int64_t n)
{
    const int64_t first = c->plan->first_page[i];
    return c->r->role == KVS_ROLE_PREFILL ? first + (n - 1 - j) : first + j;
}

/* Pages of room i on this rank: its prompt in pages of this side's size. */
static int64_t cli_room_pages(const cli_rank_ctx_t *c, uint32_t i)
{
    return (c->plan->tokens[i] + c->ps - 1) / c->ps;
}

/* Token slot `slot` of page `page` (this side's page size), head `head` of
 * layer `layer`'s plane kv (K or V; MLA: the latent, kv 0). */
static uint8_t *cli_slot(const cli_rank_ctx_t *c, int64_t layer, int kv, int64_t page,
                         int64_t slot, int64_t head, int64_t head_bytes)
{
    const uint64_t off = (uint64_t)(c->planes * layer + kv) * c->layer_bytes +
                         (uint64_t)(((page * c->ps + slot) * c->heads + head) * head_bytes);
    return c->pool + off;
}

/* The scales of that head's row (kv_scales): its plane's scale buffer,
 * laid out as the KV buffer is, [slot][head][scale_bytes]. */
static uint8_t *cli_scale_slot(const cli_rank_ctx_t *c, int64_t layer, int kv, int64_t page,
                               int64_t slot, int64_t head)
{
    const uint64_t off = c->scale_base +
                         (uint64_t)(c->planes * layer + kv) * c->scale_layer_bytes +
                         (uint64_t)(((page * c->ps + slot) * c->heads + head) * c->scale_bytes);
    return c->pool + off;
}

/* The fabric's clock (verbs, ofi: CLOCK_MONOTONIC, safe from any thread). */
static uint64_t cli_now(cli_rank_ctx_t *c) { return c->fab->ops.now_ns(c->fab); }

/* The first token of a room of `tokens` tokens whose rows the decode holds
 * in local layer `layer`: 0, or a window layer's first moved token
 * (kvs_layout_layer_tokens: the page-aligned window). */
static int64_t cli_rank_layer_from(const cli_rank_ctx_t *c, int64_t layer, int64_t tokens)
{
    int64_t from = 0, to = tokens;
    if (kvs_layout_layer_tokens(c->lay, c->first_layer + layer, tokens, &from, &to) != KVS_OK)
        from = 0; /* not reached: the layer is the layout's */
    return from;
}

/* The pattern of room i, the simulator's (kvs_sim_kv_fill: a function of
 * request, global layer, K/V, global head and token; MLA's latent is plane
 * 0 of head 0 on every rank; a row's scales, with kv_scales, are planes 2
 * and 3, K's and V's). Prefill: write it; decode: count bad bytes.
 * Token t sits in the room's page t / ps at slot t % ps, ps this side's own
 * page size, so a decode whose pages are not the prefill's checks its rows
 * where its own page list put them. */
static uint64_t cli_rank_pattern(cli_rank_ctx_t *c, uint32_t i, bool check, uint64_t *checked)
{
    const uint64_t t0 = cli_now(c);
    const kvs_layout_t *l = c->lay;
    const int64_t ps = c->ps, hb = l->head_dim * l->elem_bytes, tokens = c->plan->tokens[i];
    const int64_t n = cli_room_pages(c, i);
    const int64_t tp_size = c->r->role == KVS_ROLE_DECODE ? l->decode_tp : l->prefill_tp;
    /* A prefill CP rank holds its range of the room's tokens only; the
     * decode holds them all. */
    int64_t from = 0, to = tokens;
    if (!check && cli_rank_cp_size(c) > 1 &&
        kvs_layout_cp_range(l, tokens, c->r->cp, &from, &to) != KVS_OK)
        from = to = 0; /* not reached: the layout and the rank agree */
    uint64_t bad = 0;
    /* sc 0: the KV rows; sc 1: their scales. A hybrid model's state layer
     * has no rows, and a window layer's decode holds the window's alone
     * (kvs_layout_layer_tokens; the prefill writes every row, as an
     * engine's forward pass does). */
    for (int sc = 0; sc < (c->scale_bytes > 0 ? 2 : 1); sc++)
        for (int64_t layer = 0; layer < c->layers; layer++)
            for (int kv = 0; kv < (int)c->planes && c->state_off[layer] == 0; kv++)
                for (int64_t t = check ? cli_rank_layer_from(c, layer, tokens) : from; t < to;
                     t++)
                    for (int64_t j = 0; j < c->heads; j++) {
                        const kvs_sim_kv_coord_t at = {
                            i, c->first_layer + layer, sc * 2 + kv,
                            cli_global_head(l->total_heads, tp_size, c->r->tp, c->heads, j),
                            t};
                        const int64_t page = cli_page(c, i, t / ps, n);
                        const int64_t len = sc ? c->scale_bytes : hb;
                        uint8_t *p = sc ? cli_scale_slot(c, layer, kv, page, t % ps, j)
                                        : cli_slot(c, layer, kv, page, t % ps, j, hb);
                        if (check) {
                            bad += kvs_sim_kv_check(p, (size_t)len, &at);
                            *checked += (uint64_t)len;
                        } else {
                            kvs_sim_kv_fill(p, (size_t)len, &at);
                        }
                    }
    /* A draft model's rows, in its own buffers over the same pages: the
     * coordinate of global layer layers + d (no model layer has it), so a
     * draft row in a model slot, or the reverse, is corrupt. With PP only
     * the last stage holds the draft (kvs_layout_draft_stage): there alone
     * is it filled and checked. */
    const int64_t dhb = l->draft_head_dim * l->elem_bytes;
    const bool draft = c->r->pp == kvs_layout_draft_stage(l, c->r->role);
    for (int64_t d = 0; draft && d < l->draft_layers; d++)
        for (int kv = 0; kv < (int)c->planes; kv++)
            for (int64_t t = from; t < to; t++)
                for (int64_t j = 0; j < c->heads; j++) {
                    const kvs_sim_kv_coord_t at = {
                        i, l->layers + d, kv,
                        cli_global_head(l->total_heads, tp_size, c->r->tp, c->heads, j), t};
                    const int64_t page = cli_page(c, i, t / ps, n);
                    uint8_t *p = c->pool + c->draft_base +
                                 (uint64_t)(c->planes * d + kv) * c->draft_layer_bytes +
                                 (uint64_t)(((page * ps + t % ps) * c->heads + j) * dhb);
                    if (check) {
                        bad += kvs_sim_kv_check(p, (size_t)dhb, &at);
                        *checked += (uint64_t)dhb;
                    } else {
                        kvs_sim_kv_fill(p, (size_t)dhb, &at);
                    }
                }
    /* The room's state in each state layer, at its slot (the room's
     * index): a vector of state_head_bytes per local state head, the
     * coordinate of the K vector of token 0 of that layer and global state
     * head (a state layer has no K rows), as the simulator's. With prefill
     * CP the state passes from CP rank to CP rank (linear attention), so
     * only the CP rank holding the room's last token has its final state:
     * the others write none (a state the decode got from them is wrong). */
    const int64_t sb = l->state_head_bytes;
    const bool final_state = check || cli_rank_cp_size(c) <= 1 || (from < to && to == tokens);
    for (int64_t layer = 0; final_state && layer < c->layers; layer++)
        for (int64_t j = 0; c->state_off[layer] != 0 && j < c->state_heads; j++) {
            const kvs_sim_kv_coord_t at = {
                i, c->first_layer + layer, 0,
                cli_global_head(l->state_heads, tp_size, c->r->tp, c->state_heads, j), 0};
            uint8_t *p = c->pool + c->state_off[layer] +
                         (uint64_t)(((int64_t)i * c->state_heads + j) * sb);
            if (check) {
                bad += kvs_sim_kv_check(p, (size_t)sb, &at);
                *checked += (uint64_t)sb;
            } else {
                kvs_sim_kv_fill(p, (size_t)sb, &at);
            }
        }
    c->r->pattern_ns += cli_now(c) - t0;
    return bad;
}

/* ---- what the driver's thread hands over -------------------------------------- */

static void cli_rank_on_result(void *ctx, const kvs_room_result_t *res)
{
    cli_rank_ctx_t *c = ctx;
    pthread_mutex_lock(&c->mu);
    if (c->inbox_n < c->served + 1)
        c->inbox[c->inbox_n++] = *res;
    else
        c->inbox_overflow = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* A step failed: the fabric or the device itself. Nothing more to serve. */
static void cli_rank_on_error(void *ctx, int status)
{
    cli_rank_ctx_t *c = ctx;
    char who[48];
    cli_rank_fail(c, status, "%s: progress: %s", cli_rank_name(c, who, sizeof who),
                  kvs_driver_last_error(c->drv)->msg); /* on the thread that failed */
    pthread_mutex_lock(&c->mu);
    c->fabric_failed = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static bool cli_rank_fabric_failed(cli_rank_ctx_t *c)
{
    pthread_mutex_lock(&c->mu);
    const bool failed = c->fabric_failed;
    pthread_mutex_unlock(&c->mu);
    return failed;
}

/* Sleeps until the driver hands over a result or fails, at most
 * CLI_SERVE_CHECK_NS and never past until_ns (the fabric's clock). */
static void cli_rank_sleep(cli_rank_ctx_t *c, uint64_t until_ns)
{
    const uint64_t now = cli_now(c);
    uint64_t ns = CLI_SERVE_CHECK_NS;
    if (until_ns <= now)
        return;
    if (until_ns - now < ns)
        ns = until_ns - now;
    struct timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    at.tv_sec += (time_t)(ns / 1000000000u);
    at.tv_nsec += (long)(ns % 1000000000u);
    if (at.tv_nsec >= 1000000000L) {
        at.tv_sec++;
        at.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    while (c->inbox_n == 0 && !c->fabric_failed) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &at) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&c->mu);
}

/* The core names the setting that differs when it refuses a registration;
 * such a refusal never heals: stop with its message. So does a decode
 * whose registration failed authentication (KVS_EAUTH: the cluster secrets
 * differ); a prefill that refused a peer's keeps serving the others.
 * Returns KVS_OK, or the refusal's status after recording why the rank
 * stops. */
static int cli_rank_refused(cli_rank_ctx_t *c)
{
    kvs_error_t e;
    const int status = kvs_driver_rank_error(c->drv, &e);
    char who[48];
    if (status == KVS_EAUTH && c->r->role == KVS_ROLE_DECODE)
        return cli_rank_fail(c, KVS_EAUTH, "%s: %s (serve: --secret-file or --secret-env on "
                             "every process, naming the same secret, or on none)",
                             cli_rank_name(c, who, sizeof who), e.msg);
    if (status != KVS_EFINGERPRINT)
        return KVS_OK;
    /* The core names the tag; which flags serve hashes into it is ours to say. */
    return cli_rank_fail(c, KVS_EFINGERPRINT, "%s: %s%s", cli_rank_name(c, who, sizeof who),
                         e.msg,
                         strstr(e.msg, "app_tag") != NULL
                             ? " (serve's app_tag hashes --requests, the prompt lengths of "
                               "--seed and --prompt-tokens, and the number of prefill "
                               "instances: --instances on a prefill, the --prefill-instance "
                               "flags on the decode)"
                             : "");
}

/* ---- set-up ------------------------------------------------------------------- */

static int cli_rank_setup(cli_rank_ctx_t *c)
{
    const cli_serve_plan_t *pl = c->plan;
    const kvs_layout_t *l = c->lay;
    const bool decode = c->r->role == KVS_ROLE_DECODE;
    char who[48], hostname[48];
    cli_rank_name(c, who, sizeof who);
    snprintf(hostname, sizeof hostname, "%c%lld.%lldc%lld", decode ? 'd' : 'p',
             (long long)c->r->tp, (long long)c->r->pp, (long long)c->r->cp);
    c->inbox = calloc((size_t)c->served + 1, sizeof *c->inbox);
    c->taken = calloc((size_t)c->served + 1, sizeof *c->taken);
    if (c->inbox == NULL || c->taken == NULL)
        return cli_rank_fail(c, KVS_ENOMEM, "%s: result tables", who);
    pthread_condattr_t ca;
    bool ok = pthread_condattr_init(&ca) == 0;
    ok = ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
    if (ok && pthread_mutex_init(&c->mu, NULL) == 0) {
        if (pthread_cond_init(&c->cv, &ca) == 0)
            c->sync_ok = true;
        else
            pthread_mutex_destroy(&c->mu);
    }
    pthread_condattr_destroy(&ca);
    if (!c->sync_ok)
        return cli_rank_fail(c, KVS_ENOMEM, "%s: cannot make a mutex and a condition: free "
                             "memory or lower the TP and PP sizes", who);

    kvs_error_t err = {0};
    const kvs_host_config_t hc = {.name = hostname};
    int rc = kvs_host_device_create(&hc, &c->host, &err);
    if (rc != KVS_OK)
        return cli_rank_fail(c, rc, "%s: host device: %s", who, err.msg);
    c->dev = kvs_host_device(c->host);

    const int64_t at = cli_rank_index(c);
    const uint16_t port = decode ? 0 : (uint16_t)(pl->listen_port + at);
    /* A decode rank keeps one connection per source of every instance. */
    uint32_t conns = 0;
    for (uint32_t k = 0; decode && k < pl->instances; k++)
        conns += (uint32_t)cli_rank_sources(&pl->peers[k].lay);
    const kvs_log_t log = {.fn = cli_rank_log, .user = c, .level = kvs_log_level_default()};
    /* More than the fabrics' default max_conns (16, verbs.h and ofi.h). */
    const uint32_t max_conns = conns + 4 > 16 ? conns + 4 : 0;
    char what[128]; /* the fabric and the flags that chose it, for a failure */
    if (pl->ofi) {
#ifdef KVS_CLI_OFI
        kvs_ofi_config_t oc;
        kvs_ofi_config_init(&oc);
        oc.provider = pl->provider;
        oc.bind_addr = pl->bind_ip;
        oc.listen_port = port;
        oc.log = log;
        oc.max_conns = max_conns != 0 ? max_conns : oc.max_conns;
        snprintf(what, sizeof what, "ofi fabric (--provider %s)", pl->provider);
        rc = kvs_ofi_fabric_create(&oc, &c->real, &err);
#else
        snprintf(what, sizeof what, "ofi fabric");
        snprintf(err.msg, sizeof err.msg, "this kvstage was built without libfabric");
        rc = KVS_ENOTSUP; /* serve.c refuses --fabric ofi first */
#endif
    } else {
        kvs_verbs_config_t vc;
        kvs_verbs_config_init(&vc);
        vc.device = pl->devices != NULL ? pl->devices[at] : NULL;
        vc.near_pci = pl->near_gpus != NULL ? pl->near_gpus[at] : NULL;
        vc.log = log;
        vc.bind_addr = pl->bind_ip;
        vc.listen_port = port;
        vc.max_conns = max_conns != 0 ? max_conns : vc.max_conns;
        snprintf(what, sizeof what, "verbs fabric%s%s%s", vc.near_pci != NULL ?
                 " (--device-near-gpu " : "", vc.near_pci != NULL ? vc.near_pci : "",
                 vc.near_pci != NULL ? ")" : "");
        rc = kvs_verbs_fabric_create(&vc, &c->real, &err);
    }
    if (rc != KVS_OK)
        return cli_rank_fail(c, rc, "%s: %s: %s", who, what, err.msg);
    c->fab = c->real;
    const bool write_fault = !decode && pl->fail_write > 0;
    const bool replay = decode && pl->replay_registration;
    if (c->r->tp == 0 && c->r->pp == 0 && c->r->cp == 0 && (write_fault || replay)) {
        const kvs_fault_fabric_config_t fc = {
            .kind = write_fault ? pl->write_fault : KVS_FAULT_REPLAY_REGISTRATION,
            .fail_write = write_fault ? pl->fail_write : 0,
            .hostile_shift_bytes = CLI_FAULT_HOSTILE_SHIFT,
            .stale = KVS_FAULT_STALE_REPOST, /* posted again when its rooms are over */
            .pick = cli_rank_fault_pick};
        if ((rc = kvs_fault_fabric_create(c->real, &fc, &c->fault)) != KVS_OK)
            return cli_rank_fail(c, rc, "%s: fault wrapper: %s", who, kvs_strerror(rc));
        c->fab = kvs_fault_fabric(c->fault);
    }

    /* Its stage's layers: stages need not split evenly (spec §4). The
     * planes of each layer (K and V, or MLA's latent alone) side by side in
     * one allocation, in pages of this side's size; with kv_scales their
     * scale buffers after them, in the same order and pages. */
    (void)kvs_layout_stage_layers(l, c->r->role, c->r->pp, &c->first_layer, &c->layers);
    c->heads = decode ? l->dst_heads : l->src_heads;
    c->ps = decode ? l->decode_page_size : l->page_size;
    c->planes = l->planes;
    c->scale_bytes = l->scale_bytes;
    const int64_t row_bytes = c->heads * l->head_dim * l->elem_bytes;
    c->layer_bytes = (uint64_t)pl->pool_pages * (uint64_t)(c->ps * row_bytes);
    c->scale_base = (uint64_t)c->planes * (uint64_t)c->layers * c->layer_bytes;
    c->scale_layer_bytes = (uint64_t)pl->pool_pages *
                           (uint64_t)(c->ps * c->heads * c->scale_bytes);
    uint64_t pool_bytes = c->scale_base +
                          (uint64_t)c->planes * (uint64_t)c->layers * c->scale_layer_bytes;
    /* Hybrid state layers: a state buffer each after the scales, a slot a
     * room (docs/kinds/hybrid.md). */
    c->state_off = calloc((size_t)c->layers, sizeof *c->state_off);
    if (c->state_off == NULL)
        return cli_rank_fail(c, KVS_ENOMEM, "%s: state buffer table", who);
    c->state_heads = decode ? l->state_dst_heads : l->state_src_heads;
    for (int64_t i = 0; i < c->layers && l->full_attn_every > 1; i++) {
        kvs_layer_kind_t kind = KVS_LAYER_FULL;
        (void)kvs_layout_layer_kind(l, c->first_layer + i, &kind);
        if (kind != KVS_LAYER_STATE)
            continue;
        c->state_off[i] = pool_bytes;
        pool_bytes += (uint64_t)pl->requests * (uint64_t)(c->state_heads * l->state_head_bytes);
    }
    /* A draft model's K and V buffers (docs/kinds/draft.md): as many token
     * slots as the model's, rows of the draft's head dim; with PP on the
     * last stage alone (kvs_layout_draft_stage), as an engine holds them:
     * the other stages give the rank none. */
    const bool draft = c->r->pp == kvs_layout_draft_stage(l, c->r->role);
    c->draft_base = pool_bytes;
    c->draft_layer_bytes = draft ? (uint64_t)pl->pool_pages *
                                       (uint64_t)(c->ps * c->heads * l->draft_head_dim *
                                                  l->elem_bytes)
                                 : 0;
    pool_bytes += (uint64_t)c->planes * (uint64_t)l->draft_layers * c->draft_layer_bytes;
    rc = c->dev->ops.mem_alloc(c->dev, pool_bytes, &c->pool_addr);
    if (rc != KVS_OK)
        return cli_rank_fail(c, rc, "%s: KV pool of %llu bytes: %s: lower --requests or "
                             "--prompt-tokens", who, (unsigned long long)pool_bytes,
                             c->dev->last_backend_msg);
    c->pool = kvs_host_ptr(c->dev, c->pool_addr, pool_bytes);
    kvs_kv_layer_t *kv = calloc((size_t)c->layers, sizeof *kv);
    int64_t max_pages = 1;
    for (uint32_t i = 0; i < pl->requests; i++) {
        const int64_t n = cli_room_pages(c, i);
        max_pages = n > max_pages ? n : max_pages;
    }
    c->pages = calloc((size_t)max_pages, sizeof *c->pages);
    /* An engine's KV pool is made once and stays resident; a fresh mapping
     * is not: its pages are zeroed by the kernel on first touch, which on
     * this machine cost the decode more than the transfer (docs/
     * performance.md, "libfabric on loopback"). Touched here, before the
     * run's clock starts. */
    if (c->pool != NULL)
        memset(c->pool, 0, (size_t)pool_bytes);
    uint64_t *state_base = calloc((size_t)c->layers, sizeof *state_base);
    const size_t ndraft = l->draft_layers > 0 ? (size_t)l->draft_layers : 1;
    uint64_t *draft_k = calloc(ndraft, sizeof *draft_k);
    uint64_t *draft_v = calloc(ndraft, sizeof *draft_v);
    if (c->pool == NULL || kv == NULL || c->pages == NULL || state_base == NULL ||
        draft_k == NULL || draft_v == NULL) {
        free(kv);
        free(state_base);
        free(draft_k);
        free(draft_v);
        return cli_rank_fail(c, KVS_ENOMEM, "%s: KV pool tables", who);
    }
    for (int64_t d = 0; draft && d < l->draft_layers; d++) {
        draft_k[d] = c->pool_addr + c->draft_base +
                     (uint64_t)(c->planes * d) * c->draft_layer_bytes;
        draft_v[d] = c->planes == 2 ? draft_k[d] + c->draft_layer_bytes : 0;
    }
    bool has_state = false;
    for (int64_t i = 0; i < c->layers; i++) {
        state_base[i] = c->state_off[i] != 0 ? c->pool_addr + c->state_off[i] : 0;
        has_state = has_state || c->state_off[i] != 0;
    }
    /* MLA publishes its latent as K and no V (v_addr 0), and a scale
     * buffer for K alone. */
    const uint64_t scales_at = c->pool_addr + c->scale_base;
    for (int64_t i = 0; i < c->layers; i++) {
        /* --fault shift-scales: the decode publishes the next layer's
         * scale buffers as this layer's, so the scales land a layer off
         * where the check (cli_scale_slot) looks for them. */
        const int64_t si = decode && pl->shift_scales ? (i + 1) % c->layers : i;
        kv[i] = (kvs_kv_layer_t){.k_addr = c->pool_addr +
                                           (uint64_t)(c->planes * i) * c->layer_bytes,
                                 .v_addr = c->planes == 2 ? c->pool_addr +
                                                                (uint64_t)(2 * i + 1) *
                                                                    c->layer_bytes
                                                          : 0,
                                 .tokens = pl->pool_pages * c->ps,
                                 .token_stride_bytes = row_bytes,
                                 .head_stride_bytes = l->head_dim * l->elem_bytes,
                                 .elem_stride_bytes = l->elem_bytes};
        if (c->scale_bytes > 0) {
            kv[i].ks_addr = scales_at + (uint64_t)(c->planes * si) * c->scale_layer_bytes;
            kv[i].vs_addr = c->planes == 2 ? scales_at + (uint64_t)(2 * si + 1) *
                                                             c->scale_layer_bytes
                                           : 0;
        }
    }

    /* The decode's one ring serves every prefill instance: it stages when
     * any of them has another TP; a pair of equal TP takes the direct path
     * all the same. */
    bool staging = l->prefill_tp != l->decode_tp || l->full_attn_every > 1 ||
                   l->draft_layers > 0;
    for (uint32_t k = 0; decode && k < pl->instances; k++)
        staging = staging || pl->peers[k].tp != l->decode_tp;
    const kvs_rank_config_t rcfg = {
        .manager = {
            .role = c->r->role, .staging = staging, .total_heads = l->total_heads,
            .kv_kind = l->kind,
            .head_dim = l->head_dim, .dtype = pl->dtype, .layers = c->layers,
            .model_layers = l->layers,
            /* Its own page size and the other side's. */
            .page_size = c->ps, .peer_page_size = decode ? l->page_size : l->decode_page_size,
            /* FP8 scale planes: a scale buffer beside each K and V buffer. */
            .kv_scales = l->kv_scales, .scale_block = l->scale_block,
            .tp_rank = c->r->tp,
            .tp_size = decode ? l->decode_tp : l->prefill_tp, .pp_rank = c->r->pp,
            .pp_size = decode ? l->decode_pp : l->prefill_pp,
            .peer_tp_size = decode ? pl->peers[0].tp : l->decode_tp,
            .peer_pp_size = decode ? pl->peers[0].pp : l->decode_pp,
            .chunk_tokens = l->chunk_tokens, .ring_bytes = pl->ring_bytes,
            .transfer_workers = pl->transfer_workers,
            .max_rooms = 2 * pl->max_inflight + 16, .stall_timeout_ns = pl->stall_timeout_ns,
            .app_tag = pl->workload_tag,
            .secret_file = pl->secret_file, .secret_env = pl->secret_env,
            .instance_id = decode ? 0 : pl->instance,
            .max_instances = decode ? pl->instances : 0,
            /* A prefill's CP rank; a decode declares each instance's CP
             * size with the instance (cli_rank_add_instance). */
            .context_parallel = decode ? 1 : l->prefill_cp,
            .cp_rank = decode ? 0 : c->r->cp,
            /* Hybrid models: the layer pattern (the fingerprint compares
             * it); state buffers below. */
            .full_attn_every = l->full_attn_every, .other_layers = l->other_layers,
            .window_tokens = l->window_tokens, .state_heads = l->state_heads,
            .state_conv_bytes = l->state_conv_bytes, .state_ssm_bytes = l->state_ssm_bytes,
            /* A draft model's layers: its buffers below. */
            .draft_layers = l->draft_layers,
            .draft_head_dim = l->draft_layers > 0 ? l->draft_head_dim : 0,
            .log = {.fn = cli_rank_log, .user = c, .level = cli_rank_log_level()}},
        .layers = kv,
        .local_heads = c->heads,
        .state_base = has_state ? state_base : NULL,
        .state_slots = has_state ? (int64_t)pl->requests : 0,
        .draft_k_base = draft ? draft_k : NULL,
        .draft_v_base = draft && c->planes == 2 ? draft_v : NULL};
    rc = kvs_rank_create(&rcfg, c->dev, c->fab, &c->rank, &err);
    free(kv);
    free(state_base);
    free(draft_k);
    free(draft_v);
    if (rc != KVS_OK)
        return cli_rank_fail(c, rc, "%s: %s", who, err.msg);
    const kvs_driver_config_t dc = {.rank = c->rank, .dev = c->dev, .fab = c->fab,
                                    .on_result = cli_rank_on_result,
                                    .on_error = cli_rank_on_error, .ctx = c};
    rc = kvs_driver_create(&dc, &c->drv, &err);
    if (rc != KVS_OK)
        return cli_rank_fail(c, rc, "%s: driver: %s", who, err.msg);
    cli_metrics_add(c->plan->metrics, c->rank);
    if (pl->disc != NULL) {
        /* --discovery: this rank in etcd, as kvstage.Discovery writes it. */
        char addr[96] = "", why[512];
        if (!decode)
            snprintf(addr, sizeof addr, "%s:%u", pl->bind_ip != NULL ? pl->bind_ip : "",
                     (unsigned)(pl->listen_port + cli_rank_index(c)));
        const cli_disc_record_t rec = {
            .role = decode ? "decode" : "prefill", .instance = decode ? 0 : pl->instance,
            .pp_rank = c->r->pp, .tp_rank = c->r->tp, .cp_rank = c->r->cp,
            .cp_size = cli_rank_cp_size(c),
            .tp_size = decode ? l->decode_tp : l->prefill_tp,
            .pp_size = decode ? l->decode_pp : l->prefill_pp, .address = addr,
            .total_heads = l->total_heads, .head_dim = l->head_dim, .model_layers = l->layers,
            .page_size = c->ps, .dtype = kvs_dtype_name(l->dtype)};
        if (cli_disc_publish(pl->disc, &rec, why, sizeof why) != 0)
            return cli_rank_fail(c, KVS_EBACKEND, "%s: --discovery: %s", who, why);
        if (decode)
            cli_disc_follow(pl->disc, c->rank);
    }
    return KVS_OK;
}

/* ---- the decode's registration, in its own loop ---------------------------------- */

/* "IP:PORT", "[IPv6]:PORT" for an address with colons. */
static void cli_rank_addr(char *buf, size_t len, const char *ip, unsigned port)
{
    snprintf(buf, len, strchr(ip, ':') != NULL ? "[%s]:%u" : "%s:%u", ip, port);
}

/* Decode: declares prefill instance k (its geometry, its CP size and the
 * addresses of all its ranks, CP rank-major, then stage-major) and connects to its ranks that write to this
 * rank; a rank not up yet is retried by the handler. */
static int cli_rank_add_instance(cli_rank_ctx_t *c, uint32_t k, const char *who)
{
    const cli_serve_instance_t *in = &c->plan->peers[k];
    const int64_t n = in->cp * in->tp * in->pp;
    char(*addr)[80] = calloc((size_t)n, sizeof *addr);
    const char **addrs = calloc((size_t)n, sizeof *addrs);
    int rc = addr != NULL && addrs != NULL ? KVS_OK : KVS_ENOMEM;
    for (int64_t a = 0; rc == KVS_OK && a < n; a++) {
        cli_rank_addr(addr[a], sizeof addr[a], in->ip, (unsigned)(in->port + a));
        addrs[a] = addr[a];
    }
    if (rc == KVS_OK)
        rc = kvs_rank_add_instance(c->rank, &(kvs_instance_desc_t){
                                                .id = k, .tp_size = in->tp,
                                                .pp_size = in->pp, .cp_size = in->cp,
                                                .addrs = addrs});
    free(addr);
    free(addrs);
    kvs_error_t e;
    if (rc != KVS_OK)
        return cli_rank_fail(c, rc, "%s: prefill instance %u (TP %lld, PP %lld, CP %lld at "
                             "%s:%u..): %s", who, k, (long long)in->tp, (long long)in->pp,
                             (long long)in->cp, in->ip,
                             (unsigned)in->port,
                             rc == KVS_ENOMEM ? kvs_strerror(rc) : cli_rank_msg(c, &e));
    /* A prefill not up yet fails this; the handler keeps trying it. */
    (void)kvs_rank_connect(c->rank, (kvs_peer_t){k, 0});
    return KVS_OK;
}

/* Decode: declare every prefill instance, connect to this rank's sources
 * in each, and wait for their acks, stepping the rank in this thread. */
static int cli_rank_connect(cli_rank_ctx_t *c, uint64_t deadline_ns)
{
    const cli_serve_plan_t *pl = c->plan;
    char who[48];
    cli_rank_name(c, who, sizeof who);
    int64_t sources = 0;
    for (uint32_t k = 0; k < pl->instances; k++) {
        int rc = cli_rank_add_instance(c, k, who);
        if (rc != KVS_OK)
            return rc;
        sources += cli_rank_sources(&pl->peers[k].lay);
    }
    while (kvs_rank_peers_ready(c->rank) < sources) {
        if (cli_rank_stopped(c))
            return KVS_EPEER; /* a sibling rank failed and said why */
        if (cli_now(c) > deadline_ns) {
            char where[256] = "";
            size_t used = 0;
            for (uint32_t k = 0; k < pl->instances && used < sizeof where; k++) {
                const int w = snprintf(where + used, sizeof where - used, "%s%u at %s:%u..",
                                       k > 0 ? ", " : "", k, pl->peers[k].ip,
                                       (unsigned)pl->peers[k].port);
                used += w > 0 ? (size_t)w : 0;
            }
            kvs_error_t e;
            return cli_rank_fail(c, KVS_ETIMEDOUT, "%s: %lld of %lld prefill ranks (instance "
                                 "%s) acknowledged the registration in time: start every "
                                 "`kvstage serve --role prefill` first, check --peer or "
                                 "--prefill-instance, or raise --timeout-s (last error: %s)",
                                 who, (long long)kvs_rank_peers_ready(c->rank),
                                 (long long)sources, where, cli_rank_msg(c, &e));
        }
        int rc = kvs_driver_progress(c->drv);
        const int refused = rc >= 0 ? cli_rank_refused(c) : KVS_OK;
        if (refused == KVS_OK && c->fault != NULL &&
            kvs_rank_peers_ready(c->rank) >= sources) /* --fault replay-registration */
            kvs_fault_fabric_registered(c->fault);
        if (refused != KVS_OK)
            return refused;
        /* Its own sleep is bounded, for the stop flag and the time-out. */
        if (rc == 0 && (rc = kvs_driver_wait(c->drv, CLI_SERVE_CHECK_NS)) == KVS_EAGAIN)
            rc = KVS_OK;
        if (rc < 0) {
            pthread_mutex_lock(&c->mu);
            c->fabric_failed = true;
            pthread_mutex_unlock(&c->mu);
            return cli_rank_fail(c, rc, "%s: progress: %s", who,
                                 kvs_driver_last_error(c->drv)->msg);
        }
    }
    return KVS_OK;
}

/* ---- the run, on the driver's thread -------------------------------------------- */

static int cli_rank_open(cli_rank_ctx_t *c, uint32_t i)
{
    const kvs_layout_t *l = c->lay;
    const int64_t tokens = c->plan->tokens[i], n = cli_room_pages(c, i);
    char who[48];
    cli_rank_name(c, who, sizeof who);
    for (int64_t j = 0; j < n; j++)
        c->pages[j] = cli_page(c, i, j, n);
    const bool decode = c->r->role == KVS_ROLE_DECODE;
    if (decode && c->plan->swap_pages && n >= 2) {
        /* --fault swap-pages: the core scatters rows 0.. into the second
         * page and the next ones into the first; the check (cli_page) still
         * looks for them where the room's list puts them. */
        const int64_t p0 = c->pages[0];
        c->pages[0] = c->pages[1];
        c->pages[1] = p0;
        c->r->swapped_rooms++;
    }
    const bool hold = !decode && c->plan->hold && i >= c->plan->hold_from;
    if (!decode && !hold && !c->plan->no_verify)
        cli_rank_pattern(c, i, false, NULL);
    /* The decode names the room's prefill instance, a prefill the one
     * decode instance, 0. */
    const kvs_room_desc_t room = {
        .room = i, .peer = {decode ? cli_serve_route(c->plan, i) : 0, 0},
        .total_tokens = tokens, .pages = c->pages, .num_pages = n,
        .state_slot = i}; /* hybrid state layers: the room's slot */
    int rc = kvs_rank_open_room(c->rank, &room);
    kvs_error_t e;
    /* EPEER: a peer rank is away; the room failed and its result comes
     * like any other. */
    if (rc == KVS_EPEER || (decode && rc == KVS_OK))
        return KVS_OK;
    if (rc != KVS_OK)
        return cli_rank_fail(c, rc, "%s: room %u: %s", who, i, cli_rank_msg(c, &e));
    if (hold) {
        c->r->held = true;
        return KVS_OK; /* never computed: open until the process dies */
    }
    for (int64_t end = 0; end < tokens;) {
        end = end + l->grid_tokens < tokens ? end + l->grid_tokens : tokens;
        rc = kvs_rank_computed(c->rank, i, end, end == tokens);
        if (rc == KVS_ENOENT)
            break; /* the room already failed: nothing more to send */
        if (rc != KVS_OK)
            return cli_rank_fail(c, rc, "%s: room %u computed: %s", who, i,
                                 cli_rank_msg(c, &e));
    }
    return KVS_OK;
}

/* Takes the results the driver handed over and checks them; returns how
 * many, or a negative status after recording why the rank stops. */
static int cli_rank_results(cli_rank_ctx_t *c, uint32_t *inflight, uint32_t *done)
{
    char who[48];
    cli_rank_name(c, who, sizeof who);
    pthread_mutex_lock(&c->mu);
    const uint32_t got = c->inbox_n;
    const bool overflow = c->inbox_overflow;
    memcpy(c->taken, c->inbox, sizeof *c->taken * got);
    c->inbox_n = 0;
    pthread_mutex_unlock(&c->mu);
    if (overflow)
        return cli_rank_fail(c, KVS_EPROTO, "%s: more results than rooms: one was reported "
                             "twice", who);
    for (uint32_t k = 0; k < got; k++) {
        const kvs_room_result_t *res = &c->taken[k];
        const uint64_t room = res->room;
        if (room >= c->plan->requests || c->r->status[room] != 1 ||
            !cli_serve_serves(c->plan, c->r->role, (uint32_t)room))
            return cli_rank_fail(c, KVS_EPROTO, "%s: a result for room %llu, which is "
                                 "not open (or reported twice)", who,
                                 (unsigned long long)room);
        c->r->status[room] = res->status;
        c->r->payload_bytes += res->bytes;
        if (c->plan->hold && room < c->plan->hold_from)
            c->hold_done++;
        if (c->r->role == KVS_ROLE_DECODE && res->status == KVS_OK && !c->plan->no_verify)
            c->r->corrupt_bytes += cli_rank_pattern(c, (uint32_t)room, true,
                                                    &c->r->bytes_verified);
        (*inflight)--;
        (*done)++;
    }
    return (int)got;
}

/* --fault hold-from, rank (0, 0): once it holds a room and every room of
 * it before the held ones is over, one line on stderr, so that a test
 * kills the process while its rooms are open and the decode is running. */
static void cli_rank_tell_hold(cli_rank_ctx_t *c)
{
    if (!c->r->held || c->hold_told || c->hold_done < c->hold_before || c->r->tp != 0 ||
        c->r->pp != 0 || c->r->cp != 0)
        return;
    c->hold_told = true;
    fprintf(stderr, "kvstage serve: prefill instance %u: its rooms before %u are over; "
            "holding its rooms from %u on open (--fault hold-from:%u) until this process "
            "is killed\n", c->plan->instance, c->plan->hold_from, c->plan->hold_from,
            c->plan->hold_from);
}

static void cli_rank_loop(cli_rank_ctx_t *c, uint64_t deadline_ns)
{
    const cli_serve_plan_t *pl = c->plan;
    char who[48];
    cli_rank_name(c, who, sizeof who);
    uint32_t next = 0, inflight = 0, done = 0;
    c->r->start_ns = cli_now(c);
    while (done < c->served && !cli_rank_stopped(c)) {
        if (cli_now(c) > deadline_ns) {
            cli_rank_fail(c, KVS_ETIMEDOUT, "%s: %u of %u requests not over after --timeout-s: "
                          "check the peer process, or raise --timeout-s", who,
                          c->served - done, c->served);
            return;
        }
        while (inflight < pl->max_inflight && next < pl->requests && !cli_rank_stopped(c)) {
            if (cli_serve_serves(pl, c->r->role, next)) {
                if (cli_rank_open(c, next) != KVS_OK)
                    return;
                inflight++;
            }
            next++;
        }
        if (cli_rank_refused(c) != KVS_OK)
            return;
        const int got = cli_rank_results(c, &inflight, &done);
        if (got < 0)
            return;
        cli_rank_tell_hold(c);
        if (got == 0 && done < c->served)
            cli_rank_sleep(c, deadline_ns);
    }
    c->r->end_ns = cli_now(c);
}

/* Lets the driver keep answering the peer a little after the rank's end,
 * however it ended (unless the fabric failed): the peer's last
 * acknowledgements, and after a refused registration the REGISTER_ACK that
 * tells the peer why. Late results are taken as before. After linger_ns it
 * goes on, as the library's closing rule asks (docs/embedding.md,
 * "Closing"), until the live peers acknowledged every control message this
 * rank sent: a prefill rank that left with its last STATUS unacknowledged
 * would fail that room at the decode, and through the decode's ABORT at its
 * sibling ranks still writing it. At most the stall timeout more, after
 * which the link gives up on a silent peer anyway. */
static void cli_rank_linger(cli_rank_ctx_t *c)
{
    const uint64_t until = cli_now(c) + c->plan->linger_ns;
    const uint64_t stall = c->plan->stall_timeout_ns != 0 ? c->plan->stall_timeout_ns
                                                          : KVS_DEFAULT_STALL_TIMEOUT_NS;
    const uint64_t last = until + stall;
    if (c->fault != NULL) { /* --fault stale-write, replay-registration: every room is
                               over now; the driver's thread makes the fault at its
                               next poll, so wake it (idle, it sleeps until the
                               fabric has news) */
        kvs_fault_fabric_arm(c->fault);
        kvs_driver_wake(c->drv);
    }
    while (!cli_rank_fabric_failed(c)) {
        uint32_t ignore_inflight = 0, extra = 0;
        (void)cli_rank_results(c, &ignore_inflight, &extra);
        const uint64_t now = cli_now(c);
        if (now >= last)
            break;
        if (now < until) {
            cli_rank_sleep(c, until);
            continue;
        }
        kvs_handler_stats_t hs;
        kvs_rank_stats(c->rank, &hs);
        if (hs.msgs_unacked == 0 && (c->fault == NULL || kvs_fault_fabric_settled(c->fault)))
            break;
        cli_rank_sleep(c, now + CLI_SERVE_UNACKED_NS);
    }
}

static void cli_rank_teardown(cli_rank_ctx_t *c)
{
    if (c->drv != NULL) {
        (void)kvs_driver_stop(c->drv); /* a failure said why when it happened */
        kvs_rank_stats(c->rank, &c->r->stats);
    }
    c->r->stale_status = 1;
    if (c->fault != NULL) {
        c->r->spoiled_writes = kvs_fault_fabric_spoiled(c->fault);
        c->r->stale_status = kvs_fault_fabric_stale_status(c->fault);
        c->r->replayed = kvs_fault_fabric_replayed(c->fault, &c->r->replay_status,
                                                   &c->r->replay_answers);
    }
    if (c->drv != NULL && c->plan->disc != NULL)
        cli_disc_unfollow(c->plan->disc, c->rank); /* no-op for a prefill rank */
    if (c->drv != NULL && c->plan->metrics != NULL) {
        /* --metrics-hold-ms: the rank's final numbers stay up for a scrape. */
        struct timespec left = {.tv_sec = (time_t)(c->plan->metrics_hold_ns / 1000000000u),
                                .tv_nsec = (long)(c->plan->metrics_hold_ns % 1000000000u)};
        while (nanosleep(&left, &left) != 0 && errno == EINTR)
            ;
        cli_metrics_remove(c->plan->metrics, c->rank);
    }
    kvs_driver_destroy(c->drv);
    kvs_rank_destroy(c->rank);
    if (c->pool_addr != 0)
        (void)c->dev->ops.mem_free(c->dev, c->pool_addr);
    kvs_fault_fabric_destroy(c->fault);
    if (c->real != NULL) {
        int rc = KVS_OK;
#ifdef KVS_CLI_OFI
        if (c->plan->ofi)
            rc = kvs_ofi_fabric_destroy(c->real);
#endif
        if (!c->plan->ofi)
            rc = kvs_verbs_fabric_destroy(c->real);
        if (rc != KVS_OK)
            cli_rank_fail(c, rc, "tearing down the %s fabric: %s",
                          c->plan->ofi ? "ofi" : "verbs", kvs_strerror(rc));
    }
    kvs_host_device_destroy(c->host);
    free(c->pages);
    free(c->state_off);
    free(c->inbox);
    free(c->taken);
    if (c->sync_ok) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
    }
}

void *cli_serve_rank_run(void *arg)
{
    cli_rank_ctx_t c = {.r = arg};
    c.plan = c.r->plan;
    c.lay = &c.plan->lay;
    for (uint32_t i = 0; i < c.plan->requests; i++) {
        c.r->status[i] = 1;
        if (cli_serve_serves(c.plan, c.r->role, i)) {
            c.served++;
            c.hold_before += c.plan->hold && i < c.plan->hold_from;
        }
    }
    if (cli_rank_setup(&c) == KVS_OK) {
        const uint64_t deadline = cli_now(&c) + c.plan->timeout_ns;
        char who[48];
        int rc = c.r->role == KVS_ROLE_DECODE ? cli_rank_connect(&c, deadline) : KVS_OK;
        if (rc == KVS_OK && (rc = kvs_driver_start(c.drv)) != KVS_OK)
            cli_rank_fail(&c, rc, "%s: %s", cli_rank_name(&c, who, sizeof who),
                          kvs_driver_last_error(c.drv)->msg);
        if (rc == KVS_OK)
            cli_rank_loop(&c, deadline);
        /* The linger needs the thread, also when the decode stopped
         * before starting it (a refusal is answered meanwhile). */
        if (!cli_rank_fabric_failed(&c) && (rc == KVS_OK || kvs_driver_start(c.drv) == KVS_OK))
            cli_rank_linger(&c);
    }
    cli_rank_teardown(&c);
    return NULL;
}
