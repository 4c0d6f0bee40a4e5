/*
 * serve.c - `kvstage serve` (see serve.h): parses the flags into the run's
 * plan (shape, the prefill instances and the router, seeded prompt
 * lengths, pool pages, addresses), starts one thread per rank of its
 * instance (serve_rank.c), waits for them, and judges the run: every
 * request this process serves reported by every rank, the expected ones
 * failed (none unless --expect-failed or --expect-lost), no corrupt byte,
 * and on the decode side every byte of every ok request checked. Prints a
 * summary or one JSON object (--json) with the rooms that failed, per
 * prefill instance on the decode, so a test can compare the processes'
 * views.
 */
#include "serve.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kvstage/kvstage.h>
#include <kvstage/sim.h>

#include "args.h"
#include "serve_discovery.h"
#include "serve_metrics.h"
#include "serve_rank.h"
#include "shape.h"

#define CLI_SERVE_CMD "serve"
#define CLI_SERVE_MAX_REQUESTS 100000
#define CLI_SERVE_MAX_RANKS 64
#define CLI_SERVE_MAX_INSTANCES 64
#define CLI_SERVE_INSTANCE_FLAG "--prefill-instance" /* repeated: cli_args_take_all */
#define CLI_SERVE_NAME_BYTES 64 /* an RDMA device name or bus id, with its NUL */

enum cli_serve_flag {
    CLI_VF_ROLE = CLI_SF_COUNT,
    CLI_VF_LISTEN,
    CLI_VF_PEER,
    CLI_VF_DEVICE,
    CLI_VF_DEVICE_NEAR_GPU,
    CLI_VF_FABRIC,
    CLI_VF_PROVIDER,
    CLI_VF_REQUESTS,
    CLI_VF_PROMPT_TOKENS,
    CLI_VF_SEED,
    CLI_VF_RING_MIB,
    CLI_VF_MAX_INFLIGHT,
    CLI_VF_TRANSFER_WORKERS,
    CLI_VF_STALL_MS,
    CLI_VF_FAULT,
    CLI_VF_EXPECT_FAILED,
    CLI_VF_EXPECT_LOST,
    CLI_VF_INSTANCE,
    CLI_VF_INSTANCES,
    CLI_VF_TIMEOUT_S,
    CLI_VF_LINGER_MS,
    CLI_VF_JSON,
    CLI_VF_NO_VERIFY,
    CLI_VF_SECRET_FILE,
    CLI_VF_SECRET_ENV,
    CLI_VF_METRICS,
    CLI_VF_METRICS_HOLD_MS,
    CLI_VF_DISCOVERY,
    CLI_VF_DISCOVERY_CLUSTER,
    CLI_VF_DISCOVERY_TTL_S,
    CLI_VF_HELP,
    CLI_VF_COUNT
};

static const cli_flag_t cli_serve_flags[CLI_VF_COUNT] = {
    CLI_SHAPE_FLAG_DEFS,
    [CLI_VF_ROLE] = {"--role", true},
    [CLI_VF_LISTEN] = {"--listen", true},
    [CLI_VF_PEER] = {"--peer", true},
    [CLI_VF_DEVICE] = {"--device", true},
    [CLI_VF_DEVICE_NEAR_GPU] = {"--device-near-gpu", true},
    [CLI_VF_FABRIC] = {"--fabric", true},
    [CLI_VF_PROVIDER] = {"--provider", true},
    [CLI_VF_REQUESTS] = {"--requests", true},
    [CLI_VF_PROMPT_TOKENS] = {"--prompt-tokens", true},
    [CLI_VF_SEED] = {"--seed", true},
    [CLI_VF_RING_MIB] = {"--ring-mib", true},
    [CLI_VF_MAX_INFLIGHT] = {"--max-inflight", true},
    [CLI_VF_TRANSFER_WORKERS] = {"--transfer-workers", true},
    [CLI_VF_STALL_MS] = {"--stall-timeout-ms", true},
    [CLI_VF_FAULT] = {"--fault", true},
    [CLI_VF_EXPECT_FAILED] = {"--expect-failed", true},
    [CLI_VF_EXPECT_LOST] = {"--expect-lost", true},
    [CLI_VF_INSTANCE] = {"--instance", true},
    [CLI_VF_INSTANCES] = {"--instances", true},
    [CLI_VF_TIMEOUT_S] = {"--timeout-s", true},
    [CLI_VF_LINGER_MS] = {"--linger-ms", true},
    [CLI_VF_JSON] = {"--json", false},
    [CLI_VF_NO_VERIFY] = {"--no-verify", false},
    [CLI_VF_SECRET_FILE] = {"--secret-file", true},
    [CLI_VF_SECRET_ENV] = {"--secret-env", true},
    [CLI_VF_METRICS] = {"--metrics", true},
    [CLI_VF_METRICS_HOLD_MS] = {"--metrics-hold-ms", true},
    [CLI_VF_DISCOVERY] = {"--discovery", true},
    [CLI_VF_DISCOVERY_CLUSTER] = {"--discovery-cluster", true},
    [CLI_VF_DISCOVERY_TTL_S] = {"--discovery-ttl-s", true},
    [CLI_VF_HELP] = {"--help", false},
};

void cli_serve_usage(FILE *out)
{
    fprintf(out,
            "usage: kvstage serve --role prefill|decode [flags]\n"
            "\n"
            "Runs every rank of one instance in this process: all the ranks of one prefill\n"
            "instance, or of the decode instance (one thread, host device and fabric per\n"
            "rank), and moves a seeded workload through the kvstage protocol over RDMA\n"
            "(verbs) or libfabric (ofi: tcp, shm, verbs, efa providers). Start the prefill processes first (one per prefill instance), then the\n"
            "decode process with the same shape and workload flags. Room i is paired with\n"
            "prefill instance i %% N (N prefill instances); each prefill serves its own\n"
            "rooms, the decode every room. A prefill writes a deterministic pattern into\n"
            "its KV pool; the decode checks every byte it receives against it.\n"
            "\n"
            "addresses and instances:\n"
            "  --listen IP:PORT      prefill: prefill rank t of stage s listens on\n"
            "                        IP:PORT + s*P + t, of CP rank c on IP:PORT +\n"
            "                        (c*Pp + s)*P + t with --prefill-cp (required);\n"
            "                        decode: IP is the local address to use (port ignored)\n"
            "  --instance K          prefill: this process is prefill instance K (0)\n"
            "  --instances N         prefill: the prefill instances rooms are spread over (1)\n"
            "  --prefill-instance K=IP:PORT,TP[,PP]\n"
            "                        decode, once per prefill instance K = 0..N-1: its ranks\n"
            "                        listen at IP:PORT + s*TP + t, it runs TP x PP ranks\n"
            "                        (PP 1 if not given); instances may differ in TP and PP\n"
            "  --peer IP:PORT        decode, one prefill instance: where it listens, its\n"
            "                        geometry from --prefill-tp/--prefill-pp (the same as\n"
            "                        --prefill-instance 0=IP:PORT,P,Pp)\n"
            "  --device NAME[,NAME...]\n"
            "                        RDMA device as ibv_devices names it: one for every rank\n"
            "                        of this process, or one per rank in rank order (rank t\n"
            "                        of stage s is entry s*TP + t) (default: automatic)\n"
            "  --device-near-gpu BUSID[,BUSID...]\n"
            "                        instead of --device: each rank takes the RDMA device\n"
            "                        closest on PCIe to this GPU (PCI bus id as\n"
            "                        cudaDeviceGetPCIBusId gives it, e.g. 0000:3b:00.0),\n"
            "                        one for every rank or one per rank as --device\n"
            "  --fabric verbs|ofi    the ranks' fabric: libibverbs + rdma_cm, or libfabric\n"
            "                        (verbs)\n"
            "  --provider NAME       --fabric ofi: the libfabric provider, as fi_info -l\n"
            "                        names it: tcp, shm, verbs, efa, ... (tcp); every\n"
            "                        process of a run gives the same\n"
            "shape (as kvstage sim; no default model: give --model or the three sizes):\n"
            "  --model NAME | --kv-heads H --head-dim D --layers L\n"
            "  --mla-latent-dim N    an MLA model: one latent of N elements per token and\n"
            "                        layer (instead of --kv-heads and --head-dim)\n"
            "  --dtype T (bf16)  --page-size N (16)  --prefill-tp P (2)  --decode-tp D (1)\n"
            "  --decode-page-size N  the decode's page size (--page-size's), one for every\n"
            "                        prefill instance; --page-size is then the prefill's\n"
            "  --kv-scales S         FP8 KV with scale planes (with --dtype fp8): none,\n"
            "                        per-token or per-block[:N]; each rank keeps a scale\n"
            "                        buffer beside every K and V buffer, moved and checked\n"
            "                        with the rows\n"
            "  --prefill-pp Pp (1)  --decode-pp Dp (1 or Pp)  --chunk-tokens C (64)\n"
            "  --prefill-cp C (1)    prefill context parallelism: every prefill instance\n"
            "                        runs C x Pp x P ranks, CP rank c computing (and filling\n"
            "                        its KV pool with) its own range of each prompt's tokens\n"
            "                        only (docs/kinds/context-parallel.md); give every\n"
            "                        process the same C (not with --discovery, nor --metrics\n"
            "                        on a prefill)\n"
            "  (each process runs TP x PP ranks of its instance; stage s holds L/PP layers,\n"
            "  the last L%%PP stages one more; a prefill's --prefill-tp/--prefill-pp are\n"
            "  its own; give every process the same model, page, chunk and decode flags:\n"
            "  a registration with another shape is refused, naming the flag that differs)\n"
            "workload (every process must give the same):\n"
            "  --requests N          requests (8)\n"
            "  --prompt-tokens A:B   prompt length drawn uniformly from [A, B] (64:256)\n"
            "  --seed S              seed of the prompt lengths (1)\n"
            "  --max-inflight N      requests open at once per rank (4)\n"
            "  --ring-mib M          decode staging ring, shared by every instance (16)\n"
            "  --transfer-workers N  prefill staging buffers (4)\n"
            "  --stall-timeout-ms N  a request with no progress this long fails (30000)\n"
            "checks:\n"
            "  --fault write-error:N prefill: spoil the remote key of the Nth RDMA write of\n"
            "                        prefill rank 0 (stage 0), so the peer's NIC fails it\n"
            "  --fault hostile-write:N prefill: move that write 256 KiB past its place,\n"
            "                        outside its region, under the key it was given: only\n"
            "                        a region-scoped key (verbs, ofi tcp) stops it\n"
            "  --fault stale-write:N prefill: let that write go, then post it again, as it\n"
            "                        was, once the rank's rooms are over (its region freed):\n"
            "                        it must fail with a remote access error (KVS_EREMOTE)\n"
            "  --fault replay-registration decode: at the end, send what rank 0 sent on its\n"
            "                        first connection until registered (HELLO, REGISTER)\n"
            "                        again on a new one: a prefill with --secret-file must\n"
            "                        refuse it (its auth_refused counts it)\n"
            "  --fault swap-pages    decode: give the core every room's page list with its\n"
            "                        first two pages swapped but check the rows where the\n"
            "                        unswapped list puts them: a wrong page mapping that\n"
            "                        the check must catch (the run fails, corrupt bytes)\n"
            "  --fault shift-scales  decode, with --kv-scales: publish each layer's scale\n"
            "                        buffers as the next layer's but check the scales where\n"
            "                        they belong: a wrong scale mapping the check must catch\n"
            "  --fault hold-from:R   prefill: open its rooms from room R on but never compute\n"
            "                        them; once its rooms before R are over, rank 0 says so\n"
            "                        on stderr (\"holding its rooms\"): kill the process then\n"
            "  --expect-failed K     exit 0 only when exactly K requests failed (0)\n"
            "  --expect-lost K       decode: prefill instance K is killed mid-run: exit 0\n"
            "                        only when at least one of its rooms and no other room\n"
            "                        failed, each with KVS_EPEER, and nothing hung\n"
            "  --timeout-s S         give up after S seconds (60)\n"
            "  --linger-ms N         serve the peer this long after the last result (500)\n"
            "  --json                one JSON object instead of the summary\n"
            "  --no-verify           a benchmark of the transfer alone: the prefill writes\n"
            "                        no pattern and the decode checks nothing (give it to\n"
            "                        every process; the run then verifies no byte)\n"
            "  --secret-file PATH    the cluster secret, read from PATH; or\n"
            "  --secret-env NAME     ... from environment variable NAME (never the secret\n"
            "                        itself on the command line: docs/security.md)\n"
            "metrics:\n"
            "  --metrics IP:PORT     serve GET /metrics over HTTP: every rank of this process\n"
            "                        in Prometheus text (docs/operations.md); PORT 0: any free\n"
            "                        port; stderr says where (\"metrics at http://...\")\n"
            "  --metrics-hold-ms N   keep the ranks and the endpoint up N ms after the run,\n"
            "                        for a last scrape (0)\n"
            "discovery (etcd; docs/operations.md):\n"
            "  --discovery etcd://HOST:PORT[,HOST:PORT...]\n"
            "                        every rank publishes itself there under this process's\n"
            "                        lease; a decode takes --instances N and finds prefill\n"
            "                        instances 0..N-1 there (waiting for those not up yet)\n"
            "                        instead of --peer/--prefill-instance, and fails an\n"
            "                        instance's rooms once its lease lapses\n"
            "  --discovery-cluster NAME  the cluster's name in etcd (default)\n"
            "  --discovery-ttl-s S   the lease's TTL: a process silent this long is gone (5)\n"
            "\n"
            "Exit status: 0 when every request ended as expected and every byte matched,\n"
            "1 otherwise, 2 for bad flags.\n");
}

typedef struct cli_serve_input {
    cli_shape_t shape;
    cli_serve_plan_t plan;
    kvs_role_t role;
    char bind_ip[64];
    char peer_ip[CLI_SERVE_MAX_INSTANCES][64];
    /* --device or --device-near-gpu, split at the commas, one per rank */
    char rank_text[CLI_SERVE_MAX_RANKS * CLI_SERVE_NAME_BYTES];
    const char *rank_list[CLI_SERVE_MAX_RANKS];
    cli_serve_instance_t peers[CLI_SERVE_MAX_INSTANCES]; /* decode: by id */
    int64_t requests, prompt_min, prompt_max, expect_failed;
    int64_t expect_lost;        /* decode: the instance expected lost, -1: none */
    uint64_t seed;
    bool json;
    char metrics_ip[64];        /* --metrics, "" when not given */
    uint16_t metrics_port;
    cli_disc_t *disc;           /* --discovery, NULL when not given */
    char disc_text[CLI_SERVE_MAX_INSTANCES][128]; /* decode: the instances it found,
                                   as --prefill-instance texts */
} cli_serve_input_t;

static int cli_serve_number(const char *const *values, enum cli_serve_flag f, int64_t min,
                            int64_t max, int64_t *dst)
{
    if (values[f] == NULL)
        return 0;
    return cli_parse_i64(CLI_SERVE_CMD, cli_serve_flags[f].name, values[f], min, max, dst);
}

/* "IP:PORT" or "[IPv6]:PORT" into ip and *port; port may be omitted when
 * !need_port. A rank's port leaves room for the ports of the ranks after
 * it (+ s*P + t); port_min 0 takes "any port" (the metrics endpoint). */
static int cli_serve_addr_in(const char *flag, const char *text, bool need_port, char *ip,
                             size_t ip_len, uint16_t *port, int64_t port_min, int64_t port_max)
{
    const char *colon = strrchr(text, ':');
    const char *close = strrchr(text, ']');
    if (colon != NULL && close != NULL && colon < close)
        colon = NULL; /* "[v6]" without a port */
    if (colon == NULL && need_port)
        return cli_fail(CLI_SERVE_CMD, "%s: '%s' has no port: give IP:PORT, e.g. "
                                       "192.0.2.1:18515", flag, text);
    size_t n = colon != NULL ? (size_t)(colon - text) : strlen(text);
    const char *start = text;
    if (n >= 2 && text[0] == '[' && text[n - 1] == ']') {
        start++;
        n -= 2;
    }
    if (n == 0 || n >= ip_len)
        return cli_fail(CLI_SERVE_CMD, "%s: '%s' has no usable address: give IP:PORT",
                        flag, text);
    memcpy(ip, start, n);
    ip[n] = '\0';
    int64_t p = 0;
    if (colon != NULL) {
        int rc = cli_parse_i64(CLI_SERVE_CMD, flag, colon + 1, port_min, port_max, &p);
        if (rc != 0)
            return rc;
    }
    *port = (uint16_t)p;
    return 0;
}

static int cli_serve_addr(const char *flag, const char *text, bool need_port, char *ip,
                          size_t ip_len, uint16_t *port)
{
    return cli_serve_addr_in(flag, text, need_port, ip, ip_len, port, 1,
                             65535 - CLI_SERVE_MAX_RANKS);
}

static int cli_serve_prompt(const char *text, int64_t *min, int64_t *max)
{
    const char *flag = cli_serve_flags[CLI_VF_PROMPT_TOKENS].name;
    const char *colon = strchr(text, ':');
    char lo[32];
    const size_t lo_len = colon != NULL ? (size_t)(colon - text) : strlen(text);
    if (lo_len >= sizeof lo)
        return cli_fail(CLI_SERVE_CMD, "%s: '%s' is not MIN:MAX: give two whole numbers "
                                       "of tokens like 64:256", flag, text);
    memcpy(lo, text, lo_len);
    lo[lo_len] = '\0';
    int rc = cli_parse_i64(CLI_SERVE_CMD, flag, lo, 1, CLI_SHAPE_MAX_TOKENS, min);
    if (rc == 0)
        rc = cli_parse_i64(CLI_SERVE_CMD, flag, colon != NULL ? colon + 1 : lo, 1,
                           CLI_SHAPE_MAX_TOKENS, max);
    if (rc == 0 && *min > *max)
        rc = cli_fail(CLI_SERVE_CMD, "%s: MIN %" PRId64 " is above MAX %" PRId64 ": give "
                                     "MIN:MAX with MIN <= MAX", flag, *min, *max);
    return rc;
}

/* The write faults, by name (kvstage/fault_fabric.h). */
static const struct {
    const char *name; /* with its colon */
    const char *flag; /* as an error names it */
    kvs_fault_kind_t kind;
} cli_serve_write_faults[] = {
    {"write-error:", "--fault write-error", KVS_FAULT_WRITE_ERROR},
    {"hostile-write:", "--fault hostile-write", KVS_FAULT_HOSTILE_WRITE},
    {"stale-write:", "--fault stale-write", KVS_FAULT_STALE_WRITE},
};

static const char *cli_serve_write_fault_flag(kvs_fault_kind_t kind)
{
    for (size_t i = 0; i < sizeof cli_serve_write_faults / sizeof cli_serve_write_faults[0]; i++)
        if (cli_serve_write_faults[i].kind == kind)
            return cli_serve_write_faults[i].flag;
    return "--fault";
}

/* --fault write-error:N, hostile-write:N, stale-write:N or hold-from:R
 * into the plan. */
static int cli_serve_fault(const char *text, cli_serve_plan_t *plan)
{
    static const char hold_from[] = "hold-from:";
    int64_t n = 0;
    if (strcmp(text, "replay-registration") == 0) {
        plan->replay_registration = true;
        return 0;
    }
    if (strcmp(text, "swap-pages") == 0) {
        plan->swap_pages = true;
        return 0;
    }
    if (strcmp(text, "shift-scales") == 0) {
        plan->shift_scales = true;
        return 0;
    }
    for (size_t i = 0; i < sizeof cli_serve_write_faults / sizeof cli_serve_write_faults[0]; i++) {
        const char *name = cli_serve_write_faults[i].name;
        if (strncmp(text, name, strlen(name)) != 0)
            continue;
        int rc = cli_parse_i64(CLI_SERVE_CMD, cli_serve_write_faults[i].flag,
                               text + strlen(name), 1, INT64_C(1) << 40, &n);
        plan->fail_write = (uint64_t)n;
        plan->write_fault = cli_serve_write_faults[i].kind;
        return rc;
    }
    if (strncmp(text, hold_from, sizeof hold_from - 1) == 0) {
        int rc = cli_parse_i64(CLI_SERVE_CMD, "--fault hold-from", text + sizeof hold_from - 1,
                               0, CLI_SERVE_MAX_REQUESTS - 1, &n);
        plan->hold = true;
        plan->hold_from = (uint32_t)n;
        return rc;
    }
    return cli_fail(CLI_SERVE_CMD, "--fault: unknown fault '%s': serve knows write-error:N "
                                   "(spoil the Nth RDMA write), hostile-write:N (move it "
                                   "outside its region), stale-write:N (post it again after "
                                   "its region was freed), replay-registration (send the "
                                   "decode's registration again on a new connection), "
                                   "swap-pages (scatter to the decode's pages swapped), "
                                   "shift-scales (scales to the decode's next layer) and "
                                   "hold-from:R (never compute the rooms from R on)", text);
}

/* Copies the n bytes at text into buf (len bytes) as a string; false when
 * they do not fit or are none. */
static bool cli_serve_piece(const char *text, size_t n, char *buf, size_t len)
{
    if (n == 0 || n >= len)
        return false;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return true;
}

/* One --prefill-instance K=IP:PORT,TP[,PP] into in->peers[K]. */
static int cli_serve_instance(cli_serve_input_t *in, const char *text, bool *seen)
{
    const char *flag = CLI_SERVE_INSTANCE_FLAG;
    const char *eq = strchr(text, '=');
    const char *c1 = eq != NULL ? strchr(eq + 1, ',') : NULL;
    const char *c2 = c1 != NULL ? strchr(c1 + 1, ',') : NULL;
    char id[24], addr[96], tp[24], pp[24] = "1";
    if (eq == NULL || c1 == NULL || (c2 != NULL && strchr(c2 + 1, ',') != NULL) ||
        !cli_serve_piece(text, (size_t)(eq - text), id, sizeof id) ||
        !cli_serve_piece(eq + 1, (size_t)(c1 - eq - 1), addr, sizeof addr) ||
        !cli_serve_piece(c1 + 1, c2 != NULL ? (size_t)(c2 - c1 - 1) : strlen(c1 + 1), tp,
                         sizeof tp) ||
        (c2 != NULL && !cli_serve_piece(c2 + 1, strlen(c2 + 1), pp, sizeof pp)))
        return cli_fail(CLI_SERVE_CMD, "%s: '%s' is not ID=IP:PORT,TP[,PP]: give e.g. %s "
                                       "1=192.0.2.1:18525,2 (instance 1, TP 2, PP 1)",
                        flag, text, flag);
    int64_t k = 0, t = 0, p = 0;
    int rc = cli_parse_i64(CLI_SERVE_CMD, "--prefill-instance ID", id, 0,
                           CLI_SERVE_MAX_INSTANCES - 1, &k);
    if (rc == 0 && seen[k])
        rc = cli_fail(CLI_SERVE_CMD, "%s: instance %" PRId64 " given twice: give each "
                                     "instance once", flag, k);
    if (rc == 0)
        rc = cli_parse_i64(CLI_SERVE_CMD, "--prefill-instance TP", tp, 1, CLI_SHAPE_MAX_TP, &t);
    if (rc == 0)
        rc = cli_parse_i64(CLI_SERVE_CMD, "--prefill-instance PP", pp, 1, CLI_SHAPE_MAX_PP, &p);
    const int64_t cp = in->shape.params.prefill_cp;
    if (rc == 0 && t * p * cp > CLI_SERVE_MAX_RANKS)
        rc = cli_fail(CLI_SERVE_CMD, "%s %" PRId64 ": TP x PP x CP = %" PRId64 " ranks in one "
                                     "process is more than %d: lower its TP or PP (or "
                                     "--prefill-cp)", flag, k, t * p * cp, CLI_SERVE_MAX_RANKS);
    uint16_t port = 0;
    if (rc == 0)
        rc = cli_serve_addr(flag, addr, true, in->peer_ip[k], sizeof in->peer_ip[k], &port);
    if (rc != 0)
        return rc;
    seen[k] = true;
    in->peers[k] = (cli_serve_instance_t){.ip = in->peer_ip[k], .port = port, .tp = t, .pp = p,
                                          .cp = cp};
    return 0;
}

/* The pair of prefill instance k with this decode, into its lay. */
static int cli_serve_pair(cli_serve_input_t *in, uint32_t k)
{
    cli_serve_instance_t *peer = &in->peers[k];
    kvs_layout_params_t params = in->shape.params;
    params.prefill_tp = peer->tp;
    params.prefill_pp = peer->pp;
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    const int rc = kvs_layout_init(&peer->lay, &params, &err);
    if (rc == KVS_OK)
        return 0;
    return cli_fail(CLI_SERVE_CMD, "%s %u: TP %" PRId64 " x PP %" PRId64 " does not pair with "
                                   "this decode (--decode-tp %" PRId64 ", --decode-pp %" PRId64
                                   "): change %s: %s (%s)",
                    CLI_SERVE_INSTANCE_FLAG, k, peer->tp, peer->pp, params.decode_tp,
                    params.decode_pp > 0 ? params.decode_pp : 1,
                    rc == KVS_EPP_SPLIT     ? "its PP (or --decode-pp, --layers)"
                    : rc == KVS_EHEAD_SPLIT ? "its TP (or --decode-tp, --kv-heads)"
                                            : "the shape flags",
                    err.msg[0] != '\0' ? err.msg : kvs_strerror(rc), kvs_status_name(rc));
}

/* Decode: the prefill instances of --prefill-instance (ids 0..N-1, each
 * once), each paired with this decode, no two listening on the same ports. */
static int cli_serve_instances(cli_serve_input_t *in, const char *const *values,
                               const char **given, size_t count)
{
    if (values[CLI_VF_PEER] != NULL)
        return cli_fail(CLI_SERVE_CMD, "--peer and %s both name prefill instances: give "
                                       "--peer for one instance or %s for each",
                        CLI_SERVE_INSTANCE_FLAG, CLI_SERVE_INSTANCE_FLAG);
    static const int own[] = {CLI_SF_PREFILL_TP, CLI_SF_PREFILL_PP};
    for (size_t f = 0; f < sizeof own / sizeof own[0]; f++)
        if (values[own[f]] != NULL)
            return cli_fail(CLI_SERVE_CMD, "%s is the one prefill instance's size with "
                                           "--peer; with %s each instance gives its own "
                                           "(ID=IP:PORT,TP[,PP]): drop %s",
                            cli_serve_flags[own[f]].name, CLI_SERVE_INSTANCE_FLAG,
                            cli_serve_flags[own[f]].name);
    bool seen[CLI_SERVE_MAX_INSTANCES] = {false};
    for (size_t i = 0; i < count; i++) {
        int rc = cli_serve_instance(in, given[i], seen);
        if (rc != 0)
            return rc;
    }
    for (size_t k = 0; k < count; k++)
        if (!seen[k])
            return cli_fail(CLI_SERVE_CMD, "%s: instance %zu is missing: the %zu instances "
                                           "are 0..%zu, each once (room i goes to instance "
                                           "i %% %zu)", CLI_SERVE_INSTANCE_FLAG, k, count,
                            count - 1, count);
    for (uint32_t k = 0; k < count; k++) {
        int rc = cli_serve_pair(in, k);
        if (rc != 0)
            return rc;
    }
    for (size_t a = 0; a < count; a++)
        for (size_t b = a + 1; b < count; b++) {
            const cli_serve_instance_t *x = &in->peers[a], *y = &in->peers[b];
            const int64_t xe = x->port + x->tp * x->pp * x->cp,
                          ye = y->port + y->tp * y->pp * y->cp;
            if (strcmp(x->ip, y->ip) == 0 && x->port < ye && y->port < xe)
                return cli_fail(CLI_SERVE_CMD, "%s %zu and %zu both listen on %s ports "
                                               "%u..%" PRId64 " and %u..%" PRId64 ": give each "
                                               "instance its own ports (its ranks take PORT.."
                                               "PORT + TP x PP x CP - 1)", CLI_SERVE_INSTANCE_FLAG,
                                a, b, x->ip, (unsigned)x->port, xe - 1, (unsigned)y->port,
                                ye - 1);
        }
    in->plan.instances = (uint32_t)count;
    in->plan.peers = in->peers;
    return 0;
}

/* --device or --device-near-gpu (flag f): one entry for every rank of this
 * process, or one per rank in rank order (rank t of stage s of CP rank c is
 * entry (c*PP + s)*TP + t; CP x TP x PP ranks, CP 1 on a decode), into
 * in->rank_list, which points into in->rank_text. */
static int cli_serve_rank_list(cli_serve_input_t *in, const char *const *values,
                               enum cli_serve_flag f, int64_t tp, int64_t pp, int64_t cp)
{
    const char *flag = cli_serve_flags[f].name, *text = values[f];
    const char *what = f == CLI_VF_DEVICE ? "RDMA device name" : "PCI bus id";
    const char *role = in->role == KVS_ROLE_DECODE ? "decode" : "prefill";
    const int64_t ranks = tp * pp * cp;
    const size_t len = strlen(text);
    if (len >= sizeof in->rank_text)
        return cli_fail(CLI_SERVE_CMD, "%s: the list is %zu characters long: give one %s per "
                                       "rank (at most %d of at most %d characters), or one for "
                                       "all", flag, len, what, CLI_SERVE_MAX_RANKS,
                        CLI_SERVE_NAME_BYTES - 1);
    memcpy(in->rank_text, text, len + 1);
    int64_t count = 0;
    for (char *p = in->rank_text;; count++) {
        char *comma = strchr(p, ',');
        if (comma != NULL)
            *comma = '\0';
        if (*p == '\0')
            return cli_fail(CLI_SERVE_CMD, "%s: entry %" PRId64 " of '%s' is empty: give one "
                                           "%s for every rank, or one for all", flag, count + 1,
                            text, what);
        if (strlen(p) >= CLI_SERVE_NAME_BYTES)
            return cli_fail(CLI_SERVE_CMD, "%s: '%s' is longer than %d characters: give one %s "
                                           "per entry", flag, p, CLI_SERVE_NAME_BYTES - 1, what);
        if (count < CLI_SERVE_MAX_RANKS)
            in->rank_list[count] = p;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    count++;
    if (count == 1)
        for (int64_t k = 1; k < ranks; k++)
            in->rank_list[k] = in->rank_list[0];
    else if (count != ranks && cp > 1)
        return cli_fail(CLI_SERVE_CMD, "%s: %" PRId64 " entries for the %" PRId64 " ranks of "
                                       "this %s (TP %" PRId64 " x PP %" PRId64 " x CP %" PRId64
                                       "): give one %s per rank in rank order (rank t of "
                                       "stage s of CP rank c is entry (c*PP + s)*TP + t), or "
                                       "one for all", flag, count, ranks, role, tp, pp, cp,
                        what);
    else if (count != ranks)
        return cli_fail(CLI_SERVE_CMD, "%s: %" PRId64 " entries for the %" PRId64 " rank%s of "
                                       "this %s (TP %" PRId64 " x PP %" PRId64 "): give one %s "
                                       "per rank in rank order (rank t of stage s is entry "
                                       "s*TP + t), or one for all", flag, count, ranks,
                        ranks == 1 ? "" : "s", role, tp, pp, what);
    if (f == CLI_VF_DEVICE)
        in->plan.devices = in->rank_list;
    else
        in->plan.near_gpus = in->rank_list;
    return 0;
}

/* Fails when flag f was given to the other role: "--f is for --role R: why". */
static int cli_serve_not_here(const char *const *values, enum cli_serve_flag f,
                              const char *role, const char *why)
{
    if (values[f] == NULL)
        return 0;
    return cli_fail(CLI_SERVE_CMD, "%s is for --role %s (%s): drop it", cli_serve_flags[f].name,
                    role, why);
}

/* --discovery: opens it; a decode waits for prefill instances 0..N-1
 * (--instances N) and makes of each the --prefill-instance text it would
 * have been given. */
static int cli_serve_discover(cli_serve_input_t *in, const char *const *values,
                              const char **given, size_t *count)
{
    const bool decode = in->role == KVS_ROLE_DECODE;
    if (decode && (*count > 0 || values[CLI_VF_PEER] != NULL))
        return cli_fail(CLI_SERVE_CMD, "--discovery finds the prefill instances: drop --peer "
                                       "and %s", CLI_SERVE_INSTANCE_FLAG);
    int64_t ttl_s = 5, instances = 1, timeout_s = 60;
    int rc;
    if ((rc = cli_serve_number(values, CLI_VF_DISCOVERY_TTL_S, 2, 3600, &ttl_s)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_INSTANCES, 1, CLI_SERVE_MAX_INSTANCES,
                               &instances)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_TIMEOUT_S, 1, 86400, &timeout_s)) != 0)
        return rc;
    char why[512];
    const char *cluster = values[CLI_VF_DISCOVERY_CLUSTER] != NULL
                              ? values[CLI_VF_DISCOVERY_CLUSTER] : "default";
    if (cli_disc_open(values[CLI_VF_DISCOVERY], cluster, ttl_s, &in->disc, why, sizeof why) != 0)
        return cli_fail(CLI_SERVE_CMD, "%s", why);
    in->plan.disc = in->disc;
    if (!decode)
        return 0;
    if (values[CLI_VF_INSTANCES] == NULL)
        return cli_fail(CLI_SERVE_CMD, "--role decode --discovery needs --instances N: the "
                                       "prefill instances 0..N-1 that rooms are spread over");
    const kvs_layout_params_t *sp = &in->shape.params;
    for (int64_t k = 0; k < instances; k++) {
        cli_disc_instance_t x;
        if (cli_disc_wait_instance(in->disc, (uint64_t)k, timeout_s * 1000, &x, why,
                                   sizeof why) != 0)
            return cli_fail(CLI_SERVE_CMD, "--discovery: %s", why);
        const struct {
            const char *flag;
            int64_t theirs, mine;
        } same[] = {{"--kv-heads", x.total_heads, sp->total_heads},
                    {"--head-dim", x.head_dim, sp->head_dim},
                    {"--layers", x.model_layers, sp->layers},
                    {"--page-size", x.page_size, sp->page_size},
                    {"--prefill-cp", x.cp_size, sp->prefill_cp > 1 ? sp->prefill_cp : 1}};
        for (size_t f = 0; f < sizeof same / sizeof same[0]; f++)
            if (same[f].theirs != 0 && same[f].theirs != same[f].mine)
                return cli_fail(CLI_SERVE_CMD, "--discovery: prefill instance %" PRId64 " serves "
                                               "%s %" PRId64 ", this decode %" PRId64 ": give "
                                               "both the same %s", k, same[f].flag,
                                same[f].theirs, same[f].mine, same[f].flag);
        const bool v6 = strchr(x.ip, ':') != NULL;
        snprintf(in->disc_text[k], sizeof in->disc_text[k], "%" PRId64 "=%s%s%s:%u,%" PRId64
                 ",%" PRId64, k, v6 ? "[" : "", x.ip, v6 ? "]" : "", (unsigned)x.port,
                 x.tp_size, x.pp_size);
        given[k] = in->disc_text[k];
    }
    *count = (size_t)instances;
    return 0;
}

static int cli_serve_read(int argc, char **argv, cli_serve_input_t *in, bool *help)
{
    const char *given[CLI_SERVE_MAX_INSTANCES];
    size_t count = 0;
    int rc = cli_args_take_all(CLI_SERVE_CMD, CLI_SERVE_INSTANCE_FLAG, &argc, argv, 1, given,
                               CLI_SERVE_MAX_INSTANCES, &count);
    if (rc != 0)
        return rc;
    const char *values[CLI_VF_COUNT] = {0};
    rc = cli_args_scan(CLI_SERVE_CMD, cli_serve_flags, CLI_VF_COUNT, argc, argv, 1, values);
    if (rc != 0)
        return rc;
    *help = values[CLI_VF_HELP] != NULL;
    if (*help)
        return 0;
    static const cli_shape_defaults_t defaults = {
        .model = NULL, .page_size = 16, .prefill_tp = 2, .decode_tp = 1, .chunk_tokens = 64};
    if ((rc = cli_shape_read(CLI_SERVE_CMD, values, &defaults, &in->shape)) != 0)
        return rc;
    const char *role = values[CLI_VF_ROLE];
    if (role == NULL)
        return cli_fail(CLI_SERVE_CMD, "--role is required: prefill or decode");
    if (strcmp(role, "prefill") == 0)
        in->role = KVS_ROLE_PREFILL;
    else if (strcmp(role, "decode") == 0)
        in->role = KVS_ROLE_DECODE;
    else
        return cli_fail(CLI_SERVE_CMD, "--role: unknown role '%s': use prefill or decode", role);
    const bool decode = in->role == KVS_ROLE_DECODE;
    if (!decode && count > 0)
        return cli_fail(CLI_SERVE_CMD, "%s is for --role decode (it tells the decode where "
                                       "each prefill instance is): a prefill gives its own "
                                       "--instance, --instances, --prefill-tp and "
                                       "--prefill-pp", CLI_SERVE_INSTANCE_FLAG);
    /* Prefill CP (docs/kinds/context-parallel.md): a prefill process runs
     * its instance's CP x PP x TP ranks; the decode declares every
     * instance with that CP size (the metrics label each CP rank's
     * samples cp_rank; a discovery record carries its CP rank and size). */
    if (values[CLI_VF_DISCOVERY] != NULL) {
        if ((rc = cli_serve_discover(in, values, given, &count)) != 0)
            return rc;
    } else if (values[CLI_VF_DISCOVERY_CLUSTER] != NULL || values[CLI_VF_DISCOVERY_TTL_S] != NULL) {
        return cli_fail(CLI_SERVE_CMD, "--discovery-cluster and --discovery-ttl-s go with "
                                       "--discovery etcd://HOST:PORT: give it, or drop them");
    }
    if (decode && count > 0) {
        /* Each pair is checked first, naming its instance; the shape's
         * prefill sizes are then instance 0's, whose pair is fine. */
        if ((rc = cli_serve_instances(in, values, given, count)) != 0)
            return rc;
        in->shape.params.prefill_tp = in->peers[0].tp;
        in->shape.params.prefill_pp = in->peers[0].pp;
    }
    if ((rc = cli_shape_layout(CLI_SERVE_CMD, &in->shape, &in->plan.lay)) != 0)
        return rc;
    const kvs_layout_t *l = &in->plan.lay;

    /* Each process bounds both sides' TP x PP, so a shape one of them
     * refuses is refused by the other too. */
    const int64_t pranks = l->prefill_tp * l->prefill_pp * l->prefill_cp,
                  dranks = l->decode_tp * l->decode_pp;
    if (pranks > CLI_SERVE_MAX_RANKS)
        return cli_fail(CLI_SERVE_CMD, "prefill TP x PP x CP = %" PRId64 " ranks in one process "
                                       "is more than %d: lower --prefill-tp, --prefill-pp or "
                                       "--prefill-cp", pranks, CLI_SERVE_MAX_RANKS);
    if (dranks > CLI_SERVE_MAX_RANKS)
        return cli_fail(CLI_SERVE_CMD, "decode TP x PP = %" PRId64 " ranks in one process is "
                                       "more than %d: lower --decode-tp or --decode-pp",
                        dranks, CLI_SERVE_MAX_RANKS);
    in->plan.dtype = in->shape.params.dtype;

    if (!decode && values[CLI_VF_LISTEN] == NULL)
        return cli_fail(CLI_SERVE_CMD, "--role prefill needs --listen IP:PORT (rank t of "
                                       "stage s listens on PORT + s*P + t)");
    if ((rc = cli_serve_not_here(values, decode ? CLI_VF_INSTANCE : CLI_VF_PEER,
                                 decode ? "prefill" : "decode",
                                 decode ? "the decode's instances are its --prefill-instance "
                                          "flags"
                                        : "the decode connects to the prefill")) != 0 ||
        (in->disc == NULL &&
         (rc = cli_serve_not_here(values, decode ? CLI_VF_INSTANCES : CLI_VF_EXPECT_LOST,
                                  decode ? "prefill" : "decode",
                                  decode ? "the decode counts its --prefill-instance flags; "
                                           "with --discovery it takes --instances"
                                         : "the decode sees a prefill instance lost")) != 0) ||
        (in->disc != NULL && !decode &&
         (rc = cli_serve_not_here(values, CLI_VF_EXPECT_LOST, "decode",
                                  "the decode sees a prefill instance lost")) != 0))
        return rc;
    if (values[CLI_VF_LISTEN] != NULL &&
        (rc = cli_serve_addr("--listen", values[CLI_VF_LISTEN], !decode, in->bind_ip,
                             sizeof in->bind_ip, &in->plan.listen_port)) != 0)
        return rc;
    in->plan.bind_ip = in->bind_ip[0] != '\0' ? in->bind_ip : NULL;
    const char *fabric = values[CLI_VF_FABRIC] != NULL ? values[CLI_VF_FABRIC] : "verbs";
    if (strcmp(fabric, "ofi") == 0) {
#ifndef KVS_CLI_OFI
        return cli_fail(CLI_SERVE_CMD, "--fabric ofi: this kvstage was built without "
                                       "libfabric: install libfabric-dev and rebuild");
#endif
        in->plan.ofi = true;
        in->plan.provider = values[CLI_VF_PROVIDER] != NULL ? values[CLI_VF_PROVIDER] : "tcp";
        if (values[CLI_VF_DEVICE] != NULL || values[CLI_VF_DEVICE_NEAR_GPU] != NULL)
            return cli_fail(CLI_SERVE_CMD, "--device and --device-near-gpu choose RDMA devices "
                                           "of --fabric verbs; with --fabric ofi the provider "
                                           "(--provider) chooses: drop them");
    } else if (strcmp(fabric, "verbs") != 0) {
        return cli_fail(CLI_SERVE_CMD, "--fabric '%s' is not a fabric: give verbs or ofi",
                        fabric);
    } else if (values[CLI_VF_PROVIDER] != NULL) {
        return cli_fail(CLI_SERVE_CMD, "--provider names a libfabric provider: give it with "
                                       "--fabric ofi");
    }
    if (values[CLI_VF_DEVICE] != NULL && values[CLI_VF_DEVICE_NEAR_GPU] != NULL)
        return cli_fail(CLI_SERVE_CMD, "--device and --device-near-gpu both choose the ranks' "
                                       "RDMA devices: give one of them");
    for (int f = CLI_VF_DEVICE; f <= CLI_VF_DEVICE_NEAR_GPU; f++)
        if (values[f] != NULL &&
            (rc = cli_serve_rank_list(in, values, (enum cli_serve_flag)f,
                                      decode ? l->decode_tp : l->prefill_tp,
                                      decode ? l->decode_pp : l->prefill_pp,
                                      decode ? 1 : l->prefill_cp)) != 0)
            return rc;
    if (decode && count == 0) {
        /* --peer: one prefill instance, of the shape's prefill sizes. */
        if (values[CLI_VF_PEER] == NULL)
            return cli_fail(CLI_SERVE_CMD, "--role decode needs --peer IP:PORT (where the "
                                           "prefill process listens) or %s ID=IP:PORT,TP[,PP] "
                                           "for each prefill instance",
                            CLI_SERVE_INSTANCE_FLAG);
        in->peers[0] = (cli_serve_instance_t){.ip = in->peer_ip[0], .tp = l->prefill_tp,
                                              .pp = l->prefill_pp, .cp = l->prefill_cp,
                                              .lay = *l};
        in->plan.instances = 1;
        in->plan.peers = in->peers;
        if ((rc = cli_serve_addr("--peer", values[CLI_VF_PEER], true, in->peer_ip[0],
                                 sizeof in->peer_ip[0], &in->peers[0].port)) != 0)
            return rc;
    } else if (!decode) {
        int64_t instances = 1, instance = 0;
        if ((rc = cli_serve_number(values, CLI_VF_INSTANCES, 1, CLI_SERVE_MAX_INSTANCES,
                                   &instances)) != 0 ||
            (rc = cli_serve_number(values, CLI_VF_INSTANCE, 0, CLI_SERVE_MAX_INSTANCES - 1,
                                   &instance)) != 0)
            return rc;
        if (instance >= instances)
            return cli_fail(CLI_SERVE_CMD, "--instance %" PRId64 " is not below --instances "
                                           "%" PRId64 ": the prefill instances are 0..%" PRId64,
                            instance, instances, instances - 1);
        in->plan.instances = (uint32_t)instances;
        in->plan.instance = (uint32_t)instance;
    }
    /* The cluster secret is named (a file, a variable), never given. */
    in->plan.secret_file = values[CLI_VF_SECRET_FILE];
    in->plan.secret_env = values[CLI_VF_SECRET_ENV];

    int64_t ring_mib = 16, inflight = 4, workers = 0, stall_ms = 0, timeout_s = 60,
            linger_ms = 500, metrics_hold_ms = 0;
    in->requests = 8;
    in->prompt_min = 64;
    in->prompt_max = 256;
    in->seed = 1;
    in->expect_lost = -1;
    if ((rc = cli_serve_number(values, CLI_VF_REQUESTS, 1, CLI_SERVE_MAX_REQUESTS,
                               &in->requests)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_RING_MIB, 1, INT64_C(1) << 20, &ring_mib)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_MAX_INFLIGHT, 1, 4096, &inflight)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_TRANSFER_WORKERS, 1, 64, &workers)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_STALL_MS, 1, 86400000, &stall_ms)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_EXPECT_FAILED, 0, CLI_SERVE_MAX_REQUESTS,
                               &in->expect_failed)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_EXPECT_LOST, 0, CLI_SERVE_MAX_INSTANCES - 1,
                               &in->expect_lost)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_TIMEOUT_S, 1, 86400, &timeout_s)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_LINGER_MS, 0, 600000, &linger_ms)) != 0 ||
        (rc = cli_serve_number(values, CLI_VF_METRICS_HOLD_MS, 0, 600000, &metrics_hold_ms)) !=
            0)
        return rc;
    if (values[CLI_VF_METRICS] != NULL &&
        (rc = cli_serve_addr_in("--metrics", values[CLI_VF_METRICS], true, in->metrics_ip,
                                sizeof in->metrics_ip, &in->metrics_port, 0, 65535)) != 0)
        return rc;
    if (values[CLI_VF_METRICS_HOLD_MS] != NULL && values[CLI_VF_METRICS] == NULL)
        return cli_fail(CLI_SERVE_CMD, "--metrics-hold-ms keeps the metrics endpoint up: "
                                       "give --metrics IP:PORT too, or drop it");
    if (in->expect_lost >= (int64_t)in->plan.instances)
        return cli_fail(CLI_SERVE_CMD, "--expect-lost %" PRId64 " names no prefill instance: "
                                       "the instances are 0..%u", in->expect_lost,
                        in->plan.instances - 1);
    if (in->expect_lost >= 0 && values[CLI_VF_EXPECT_FAILED] != NULL)
        return cli_fail(CLI_SERVE_CMD, "--expect-failed and --expect-lost both say which "
                                       "requests fail: give one");
    if (in->requests < (int64_t)in->plan.instances)
        return cli_fail(CLI_SERVE_CMD, "--requests %" PRId64 " is below the %u prefill instances: "
                                       "an instance without a room stops before the decode "
                                       "connects; raise --requests",
                        in->requests, in->plan.instances);
    if (values[CLI_VF_PROMPT_TOKENS] != NULL &&
        (rc = cli_serve_prompt(values[CLI_VF_PROMPT_TOKENS], &in->prompt_min,
                               &in->prompt_max)) != 0)
        return rc;
    if (values[CLI_VF_SEED] != NULL &&
        (rc = cli_parse_u64(CLI_SERVE_CMD, "--seed", values[CLI_VF_SEED], 0, UINT64_MAX,
                            &in->seed)) != 0)
        return rc;
    if (values[CLI_VF_FAULT] != NULL) {
        if ((rc = cli_serve_fault(values[CLI_VF_FAULT], &in->plan)) != 0)
            return rc;
        if (decode != (in->plan.replay_registration || in->plan.swap_pages ||
                       in->plan.shift_scales))
            return cli_fail(CLI_SERVE_CMD, "--fault %s: %s", values[CLI_VF_FAULT],
                            decode ? "it spoils or holds a prefill's work: give it to --role "
                                     "prefill (a decode knows replay-registration, "
                                     "swap-pages and shift-scales only)"
                                   : "it is a decode's (it replays its registration, swaps "
                                     "its pages or shifts its scales): give it to --role "
                                     "decode");
        if (in->plan.hold && in->plan.hold_from >= in->requests)
            return cli_fail(CLI_SERVE_CMD, "--fault hold-from:%u: there are rooms 0..%" PRId64
                                           " only: give a room below --requests",
                            in->plan.hold_from, in->requests - 1);
        /* --fault shift-scales moves scales a layer off: it needs them, and
         * two layers on every decode stage. */
        if (in->plan.shift_scales && (l->kv_scales == KVS_KV_SCALES_NONE ||
                                      l->layers / l->decode_pp < 2))
            return cli_fail(CLI_SERVE_CMD, "--fault shift-scales: it publishes each layer's "
                                           "scale buffers as the next layer's: give --kv-scales "
                                           "(with --dtype fp8) and --layers of at least 2 per "
                                           "decode stage (--layers %" PRId64 ", --decode-pp %"
                                           PRId64 ")", l->layers, l->decode_pp);
    }
    in->json = values[CLI_VF_JSON] != NULL;
    in->plan.no_verify = values[CLI_VF_NO_VERIFY] != NULL;
    in->plan.requests = (uint32_t)in->requests;
    in->plan.ring_bytes = (uint64_t)ring_mib << 20;
    in->plan.max_inflight = (uint32_t)inflight;
    in->plan.transfer_workers = (uint32_t)workers;
    in->plan.stall_timeout_ns = (uint64_t)stall_ms * 1000000u;
    in->plan.timeout_ns = (uint64_t)timeout_s * 1000000000u;
    in->plan.linger_ns = (uint64_t)linger_ms * 1000000u;
    in->plan.metrics_hold_ns = (uint64_t)metrics_hold_ms * 1000000u;
    return 0;
}

/* The seeded workload: prompt lengths (of every room, so every process
 * draws the same; the simulator's of the same seed, kvs_sim_prompt_tokens)
 * and the first pool page of each room it serves, in pages of its own side's
 * size. */
static int cli_serve_workload(cli_serve_input_t *in, int64_t **tokens, int64_t **first)
{
    const int64_t ps = in->role == KVS_ROLE_DECODE ? in->plan.lay.decode_page_size
                                                   : in->plan.lay.page_size;
    *tokens = calloc((size_t)in->requests, sizeof **tokens);
    *first = calloc((size_t)in->requests, sizeof **first);
    if (*tokens == NULL || *first == NULL)
        return cli_fail(CLI_SERVE_CMD, "out of memory for %" PRId64 " requests: lower "
                                       "--requests", in->requests);
    kvs_error_t err;
    if (kvs_sim_prompt_tokens(in->seed, in->prompt_min, in->prompt_max, *tokens,
                              (size_t)in->requests, &err) != KVS_OK)
        return cli_fail(CLI_SERVE_CMD, "--prompt-tokens: %s", err.msg);
    int64_t pages = 0;
    for (int64_t i = 0; i < in->requests; i++) {
        if (!cli_serve_serves(&in->plan, in->role, (uint32_t)i))
            continue;
        (*first)[i] = pages;
        pages += ((*tokens)[i] + ps - 1) / ps;
    }
    in->plan.tokens = *tokens;
    in->plan.first_page = *first;
    in->plan.pool_pages = pages;
    /* FNV-1a over the prefill instance count (the router: room i goes to
     * instance i % N), the request count and every prompt length: what
     * the processes must agree on beyond the shape (not the instances'
     * TP or PP: each pair's fingerprint carries its own). Another --seed,
     * --requests, --prompt-tokens or instance count then fails the
     * registration by name (KVS_EFINGERPRINT) instead of failing requests. */
    uint32_t h = 2166136261u;
    for (int64_t i = -2; i < in->requests; i++) {
        const uint64_t v = (uint64_t)(i == -2   ? in->plan.instances
                                      : i == -1 ? in->requests
                                                : (*tokens)[i]);
        for (int b = 0; b < 64; b += 8)
            h = (h ^ (uint8_t)(v >> b)) * 16777619u;
    }
    in->plan.workload_tag = h;
    return 0;
}

/* Bytes the decode ranks of a process hold together for room i: what their
 * verification checks (every decode TP rank, every layer of the model over
 * its stages, whichever way they split, each plane: K and V, or MLA's
 * latent). */
static uint64_t cli_serve_room_bytes(const kvs_layout_t *l, int64_t tokens)
{
    /* every row's bytes and, with kv_scales, its scales'; a hybrid model's
     * window layers the window's rows, its state layers each decode rank's
     * state (docs/kinds/hybrid.md) */
    const int64_t row = l->dst_heads * (l->head_dim * l->elem_bytes + l->scale_bytes);
    int64_t rows = tokens * l->layers, state = 0;
    for (int64_t layer = 0; l->full_attn_every > 1 && layer < l->layers; layer++) {
        kvs_layer_kind_t kind = KVS_LAYER_FULL;
        int64_t from = 0, to = tokens;
        (void)kvs_layout_layer_kind(l, layer, &kind);
        (void)kvs_layout_layer_tokens(l, layer, tokens, &from, &to);
        rows -= kind == KVS_LAYER_STATE ? tokens : from;
        state += kind == KVS_LAYER_STATE ? l->state_dst_heads * l->state_head_bytes : 0;
    }
    /* and a draft model's rows (docs/kinds/draft.md) */
    const int64_t draft = tokens * l->draft_layers * l->dst_heads * l->draft_head_dim *
                          l->elem_bytes * l->planes;
    return (uint64_t)((rows * row * l->planes + state + draft) * l->decode_tp);
}

/* What became of the rooms paired with one prefill instance. */
typedef struct cli_serve_tally {
    uint32_t rooms, ok, failed, missing;
    bool only_epeer;            /* every failed room failed with KVS_EPEER */
    char *failed_list;          /* "7:KVS_EPEER" entries, JSON strings with --json */
    size_t used, cap;
} cli_serve_tally_t;

/* Room i's end over the process's ranks: 1 while any rank has no result,
 * else the first failure, else KVS_OK. */
static int cli_serve_room_status(cli_serve_rank_t *ranks, int64_t n, uint32_t i)
{
    int st = KVS_OK;
    for (int64_t k = 0; k < n; k++) {
        if (ranks[k].status[i] == 1)
            return 1;
        if (st == KVS_OK && ranks[k].status[i] != KVS_OK)
            st = ranks[k].status[i];
    }
    return st;
}

/* Counts the rooms this process serves, per prefill instance; *expect gets
 * the bytes the decode should have verified. False when out of memory. */
static bool cli_serve_tally(const cli_serve_input_t *in, cli_serve_rank_t *ranks, int64_t n,
                            cli_serve_tally_t *t, uint64_t *expect)
{
    const cli_serve_plan_t *pl = &in->plan;
    for (uint32_t k = 0; k < pl->instances; k++) {
        t[k] = (cli_serve_tally_t){.only_epeer = true};
        t[k].cap = (size_t)pl->requests / pl->instances * 40 + 48; /* a room's entry < 40 */
        if ((t[k].failed_list = calloc(t[k].cap, 1)) == NULL)
            return false;
    }
    *expect = 0;
    for (uint32_t i = 0; i < pl->requests; i++) {
        if (!cli_serve_serves(pl, in->role, i))
            continue;
        cli_serve_tally_t *tk = &t[cli_serve_route(pl, i)];
        const int st = cli_serve_room_status(ranks, n, i);
        tk->rooms++;
        if (st == 1) {
            tk->missing++;
        } else if (st == KVS_OK) {
            tk->ok++;
            *expect += cli_serve_room_bytes(&pl->lay, pl->tokens[i]);
        } else {
            tk->failed++;
            tk->only_epeer = tk->only_epeer && st == KVS_EPEER;
            const char *q = in->json ? "\"" : "";
            const int w = snprintf(tk->failed_list + tk->used, tk->cap - tk->used, "%s%s%u:%s%s",
                                   tk->used > 0 ? (in->json ? "," : " ") : "", q, i,
                                   kvs_status_name(st), q);
            if (w > 0 && (size_t)w < tk->cap - tk->used)
                tk->used += (size_t)w;
        }
    }
    return true;
}

/* Whether instance k's rooms ended as the flags expect; *why gets a
 * clause when they did not. */
static bool cli_serve_tally_pass(const cli_serve_input_t *in, const cli_serve_tally_t *t,
                                 uint32_t k, char *why, size_t len)
{
    if (in->expect_lost < 0)
        return true; /* --expect-failed counts over every instance */
    if (k != (uint32_t)in->expect_lost && t->failed > 0) {
        snprintf(why, len, ", instance %u (not lost) had %u failed", k, t->failed);
        return false;
    }
    if (k == (uint32_t)in->expect_lost && (t->failed == 0 || !t->only_epeer)) {
        snprintf(why, len, ", lost instance %u had %s", k,
                 t->failed == 0 ? "no failed room: it was not lost while its rooms were open"
                                : "rooms failed with another status than KVS_EPEER");
        return false;
    }
    return true;
}

static int cli_serve_report(const cli_serve_input_t *in, cli_serve_rank_t *ranks, int64_t n)
{
    const cli_serve_plan_t *pl = &in->plan;
    const bool decode = in->role == KVS_ROLE_DECODE;
    uint64_t verified = 0, corrupt = 0, expect_verified = 0, payload = 0, spoiled = 0;
    uint64_t swapped = 0; /* --fault swap-pages: rooms given swapped pages */
    int stale = 1; /* --fault stale-write: how its second post ended, 1: not made */
    uint64_t replayed = 0, replay_answers = 0, auth_refused = 0;
    int replay_status = KVS_OK;
    uint64_t start = UINT64_MAX, end = 0, writes = 0, retrans = 0, dups = 0, pattern = 0;
    uint64_t ring_live = 0, rtt = 0, keys_granted = 0, keys_revoked = 0;
    int fatal = KVS_OK;
    for (int64_t k = 0; k < n; k++) {
        verified += ranks[k].bytes_verified;
        corrupt += ranks[k].corrupt_bytes;
        payload += ranks[k].payload_bytes;
        spoiled += ranks[k].spoiled_writes;
        swapped += ranks[k].swapped_rooms;
        stale = ranks[k].stale_status != 1 ? ranks[k].stale_status : stale;
        replayed += ranks[k].replayed;
        replay_answers += ranks[k].replay_answers;
        replay_status = ranks[k].replay_status != KVS_OK ? ranks[k].replay_status
                                                         : replay_status;
        auth_refused += ranks[k].stats.auth_refused;
        pattern = ranks[k].pattern_ns > pattern ? ranks[k].pattern_ns : pattern;
        writes += ranks[k].stats.rdma_writes;
        retrans += ranks[k].stats.msgs_retransmitted;
        dups += ranks[k].stats.msgs_duplicate;
        ring_live += ranks[k].stats.ring_live_bytes;
        keys_granted += ranks[k].stats.keys_granted;
        keys_revoked += ranks[k].stats.keys_revoked;
        rtt = ranks[k].stats.rtt_smoothed_ns > rtt ? ranks[k].stats.rtt_smoothed_ns : rtt;
        start = ranks[k].start_ns != 0 && ranks[k].start_ns < start ? ranks[k].start_ns : start;
        end = ranks[k].end_ns > end ? ranks[k].end_ns : end;
        if (ranks[k].fatal != KVS_OK) {
            fatal = ranks[k].fatal;
            fprintf(stderr, "kvstage serve: %s (%s)\n", ranks[k].err,
                    kvs_status_name(ranks[k].fatal));
        }
    }
    cli_serve_tally_t *tally = calloc(pl->instances, sizeof *tally);
    if (tally == NULL || !cli_serve_tally(in, ranks, n, tally, &expect_verified)) {
        for (uint32_t k = 0; tally != NULL && k < pl->instances; k++)
            free(tally[k].failed_list);
        free(tally);
        fprintf(stderr, "kvstage serve: out of memory for the report: lower --requests\n");
        return 1;
    }
    /* A prefill tallies its own instance only. */
    const uint32_t first = decode ? 0 : pl->instance, last = decode ? pl->instances : first + 1;
    uint32_t rooms = 0, ok = 0, failed = 0, missing = 0;
    bool instances_pass = true;
    char why[160] = "";
    for (uint32_t k = first; k < last; k++) {
        rooms += tally[k].rooms;
        ok += tally[k].ok;
        failed += tally[k].failed;
        missing += tally[k].missing;
        if (!cli_serve_tally_pass(in, &tally[k], k, why, sizeof why))
            instances_pass = false;
    }
    const double wall_s = end > start ? (double)(end - start) / 1e9 : 0.0;
    /* What arrived: the bytes checked, or with --no-verify what the rooms
     * reported (the decode's received payload). */
    const uint64_t moved = decode && !pl->no_verify ? verified : payload;
    const double gbs = wall_s > 0 ? (double)moved / wall_s / 1e9 : 0.0;
    const bool verified_all = !decode || pl->no_verify || verified == expect_verified;
    const bool fault_went = (pl->fail_write == 0 || spoiled == 1) &&
                            (!pl->swap_pages || swapped > 0);
    /* A write after its region was freed must be refused by the decode's
     * NIC (its key was revoked), not merely fail some other way. */
    const bool stale_refused = pl->fail_write == 0 || pl->write_fault != KVS_FAULT_STALE_WRITE ||
                               stale == KVS_EREMOTE;
    /* A replay is HELLO and REGISTER at least, and the prefill answered. */
    const bool replay_made = !decode || !pl->replay_registration ||
                             (replay_status == KVS_OK && replayed >= 2 && replay_answers > 0);
    char stale_name[48] = "none";
    if (stale != 1)
        snprintf(stale_name, sizeof stale_name, "%s", kvs_status_name(stale));
    const bool failed_as_expected = in->expect_lost >= 0 ? instances_pass
                                                          : failed == (uint32_t)in->expect_failed;
    /* Every room has ended, so a region still live in a decode ring is a
     * leak, and so is a region-scoped key not revoked. */
    const bool pass = fatal == KVS_OK && missing == 0 && failed_as_expected && corrupt == 0 &&
                      verified_all && fault_went && stale_refused && replay_made &&
                      ring_live == 0 &&
                      keys_granted == keys_revoked;
    const char *role = decode ? "decode" : "prefill";
    if (in->json) {
        printf("{\"role\":\"%s\",\"ranks\":%" PRId64 ",\"prefill_cp\":%" PRId64 ","
               "\"requests\":%u,\"requests_ok\":%u,"
               "\"requests_failed\":%u,\"requests_unfinished\":%u,\"failed_rooms\":[",
               role, n, pl->lay.prefill_cp, rooms, ok, failed, missing);
        for (uint32_t k = first, listed = 0; k < last; k++) {
            printf("%s%s", listed > 0 && tally[k].used > 0 ? "," : "", tally[k].failed_list);
            listed += tally[k].used > 0;
        }
        printf("],\"instances\":[");
        for (uint32_t k = first; k < last; k++) {
            const int64_t tp = decode ? pl->peers[k].tp : pl->lay.prefill_tp;
            const int64_t pp = decode ? pl->peers[k].pp : pl->lay.prefill_pp;
            const int64_t cp = decode ? pl->peers[k].cp : pl->lay.prefill_cp;
            printf("%s{\"id\":%u,\"tp\":%" PRId64 ",\"pp\":%" PRId64 ",\"cp\":%" PRId64 ","
                   "\"requests\":%u,"
                   "\"requests_ok\":%u,\"requests_failed\":%u,\"requests_unfinished\":%u,"
                   "\"failed_rooms\":[%s]}", k > first ? "," : "", k, tp, pp, cp, tally[k].rooms,
                   tally[k].ok, tally[k].failed, tally[k].missing, tally[k].failed_list);
        }
        printf("],\"bytes_verified\":%" PRIu64 ",\"bytes_expected\":%" PRIu64 ","
               "\"corrupt_bytes\":%" PRIu64 ",\"payload_bytes\":%" PRIu64 ","
               "\"rdma_writes\":%" PRIu64 ",\"spoiled_writes\":%" PRIu64 ","
               "\"swapped_rooms\":%" PRIu64 ","
               "\"stale_write\":\"%s\",\"replayed\":%" PRIu64 ","
               "\"replay_answers\":%" PRIu64 ",\"auth_refused\":%" PRIu64 ","
               "\"msgs_retransmitted\":%" PRIu64 ",\"msgs_duplicate\":%" PRIu64 ","
               "\"rtt_smoothed_ns\":%" PRIu64 ","
               "\"ring_live_bytes\":%" PRIu64 ",\"keys_granted\":%" PRIu64 ","
               "\"keys_revoked\":%" PRIu64 ",\"wall_s\":%.6f,\"pattern_s\":%.6f,\"goodput_gbytes_per_s\":%.6f,"
               "\"verified\":%s,\"pass\":%s}\n",
               verified, decode ? expect_verified : 0, corrupt, payload, writes, spoiled,
               swapped,
               stale_name, replayed, replay_answers, auth_refused, retrans,
               dups, rtt, ring_live, keys_granted, keys_revoked, wall_s, (double)pattern / 1e9,
               gbs,
               pl->no_verify ? "false" : "true", pass ? "true" : "false");
    } else {
        char b1[32], b2[32], cp_text[40] = "";
        if (pl->lay.prefill_cp > 1)
            snprintf(cp_text, sizeof cp_text, " (prefill CP %" PRId64 ")", pl->lay.prefill_cp);
        if (decode)
            printf("kvstage serve: decode, %" PRId64 " rank(s)%s, %u requests: %u ok, %u failed, "
                   "%u unfinished\n", n, cp_text, rooms, ok, failed, missing);
        else
            printf("kvstage serve: prefill instance %u of %u, %" PRId64 " rank(s)%s, %u "
                   "requests: %u ok, %u failed, %u unfinished\n", pl->instance, pl->instances,
                   n, cp_text, rooms, ok, failed, missing);
        if (decode && pl->no_verify)
            printf("  bytes received   %s, not checked (--no-verify)\n",
                   cli_format_bytes((int64_t)payload, b1, sizeof b1));
        else if (decode)
            printf("  bytes verified   %s of %s expected, %" PRIu64 " corrupt\n",
                   cli_format_bytes((int64_t)verified, b1, sizeof b1),
                   cli_format_bytes((int64_t)expect_verified, b2, sizeof b2), corrupt);
        else
            printf("  payload written  %s in %" PRIu64 " RDMA writes\n",
                   cli_format_bytes((int64_t)payload, b1, sizeof b1), writes);
        printf("  wall time        %.3f s (first room opened to last result; of it %.3f s "
               "%s the pattern, busiest rank)\n", wall_s, (double)pattern / 1e9,
               decode ? "checking" : "writing");
        printf("  goodput          %.4f GB/s\n", gbs);
        if (decode)
            printf("  ring at the end  %s live%s\n",
                   cli_format_bytes((int64_t)ring_live, b1, sizeof b1),
                   ring_live > 0 ? " (leaked: every room has ended)" : "");
        if (decode && keys_granted == 0)
            printf("  region keys      none: every writer held the whole ring's key (the "
                   "fabric has no key_grant, or nothing staged)\n");
        else if (decode)
            printf("  region keys      %" PRIu64 " granted, %" PRIu64 " revoked%s\n",
                   keys_granted, keys_revoked,
                   keys_granted != keys_revoked ? " (leaked: every room has ended)" : "");
        for (uint32_t k = first; decode && pl->instances > 1 && k < last; k++)
            printf("  instance %-7u TP %" PRId64 " PP %" PRId64 " CP %" PRId64 ": %u requests, "
                   "%u ok, %u failed%s%s%s\n", k, pl->peers[k].tp, pl->peers[k].pp,
                   pl->peers[k].cp, tally[k].rooms,
                   tally[k].ok, tally[k].failed, tally[k].failed > 0 ? " (" : "",
                   tally[k].failed_list, tally[k].failed > 0 ? ")" : "");
        printf("  failed rooms     ");
        for (uint32_t k = first, listed = 0; k < last; k++) {
            printf("%s%s", listed > 0 && tally[k].used > 0 ? " " : "", tally[k].failed_list);
            listed += tally[k].used > 0;
        }
        printf("%s\n", failed > 0 ? "" : "-");
        if (pl->fail_write > 0)
            printf("  spoiled writes   %" PRIu64 " (%s:%" PRIu64 ")%s%s\n", spoiled,
                   cli_serve_write_fault_flag(pl->write_fault), pl->fail_write,
                   pl->write_fault == KVS_FAULT_STALE_WRITE ? "; posted again after its "
                                                              "region was freed: " : "",
                   pl->write_fault == KVS_FAULT_STALE_WRITE ? stale_name : "");
        if (decode && pl->swap_pages)
            printf("  swapped pages    %" PRIu64 " rooms given their first two pages swapped "
                   "(--fault swap-pages): their rows must show up as corrupt\n", swapped);
        if (decode && pl->replay_registration)
            printf("  replayed         %" PRIu64 " messages of rank 0's registration on a new "
                   "connection: %s, %" PRIu64 " answers\n", replayed,
                   kvs_status_name(replay_status), replay_answers);
        if (auth_refused > 0)
            printf("  auth refused     %" PRIu64 " registrations\n", auth_refused);
        printf("  result           %s\n", pass ? "PASS" : "FAIL");
    }
    if (!pass && fatal == KVS_OK) {
        char expected[48];
        if (in->expect_lost >= 0)
            snprintf(expected, sizeof expected, "only of lost instance %" PRId64,
                     in->expect_lost);
        else
            snprintf(expected, sizeof expected, "expected %" PRId64, in->expect_failed);
        fprintf(stderr, "kvstage serve: %s: %u failed (%s)%s, %u unfinished, %" PRIu64 " corrupt "
                        "bytes, %" PRIu64 " of %" PRIu64 " bytes verified%s%s%s%s\n",
                role, failed, expected, why, missing, corrupt, verified,
                decode ? expect_verified : verified,
                fault_went ? "" : pl->swap_pages ? ", no room had two pages to swap "
                                                   "(--fault swap-pages)"
                                                 : ", the --fault write was never posted",
                stale_refused ? "" : ", the write posted after its region was freed ended "
                                     "with ", stale_refused ? "" : stale_name,
                replay_made ? "" : ", the registration was not replayed (or not answered)");
    }
    for (uint32_t k = 0; k < pl->instances; k++)
        free(tally[k].failed_list);
    free(tally);
    return pass ? 0 : 1;
}

int cli_serve_main(int argc, char **argv)
{
    cli_serve_input_t in;
    memset(&in, 0, sizeof in);
    bool help = false;
    int rc = cli_serve_read(argc, argv, &in, &help);
    if (rc != 0 || help) {
        cli_disc_close(in.disc);
        if (help)
            cli_serve_usage(stdout);
        return rc;
    }
    int64_t *tokens = NULL, *first = NULL;
    if ((rc = cli_serve_workload(&in, &tokens, &first)) != 0) {
        cli_disc_close(in.disc);
        free(tokens);
        free(first);
        return rc;
    }
    const kvs_layout_t *l = &in.plan.lay;
    const bool decode = in.role == KVS_ROLE_DECODE;
    const int64_t tp = decode ? l->decode_tp : l->prefill_tp;
    const int64_t pp = decode ? l->decode_pp : l->prefill_pp;
    const int64_t n = tp * pp * (decode ? 1 : l->prefill_cp);
    cli_serve_rank_t *ranks = calloc((size_t)n, sizeof *ranks);
    pthread_t *threads = calloc((size_t)n, sizeof *threads);
    int *status = calloc((size_t)n * in.plan.requests, sizeof *status);
    atomic_bool stop;
    atomic_init(&stop, false);
    rc = ranks != NULL && threads != NULL && status != NULL ? 0 : 1;
    cli_metrics_t *metrics = NULL;
    if (rc == 0 && in.metrics_ip[0] != '\0') {
        char why[256];
        uint16_t port = 0;
        if (cli_metrics_start(in.metrics_ip, in.metrics_port, (size_t)n, &metrics, &port, why,
                              sizeof why) != 0) {
            fprintf(stderr, "kvstage serve: %s\n", why);
            rc = 2;
        } else {
            const bool v6 = strchr(in.metrics_ip, ':') != NULL;
            fprintf(stderr, "kvstage serve: metrics at http://%s%s%s:%u/metrics\n",
                    v6 ? "[" : "", in.metrics_ip, v6 ? "]" : "", (unsigned)port);
            in.plan.metrics = metrics;
        }
    }
    int64_t started = 0;
    for (int64_t k = 0; rc == 0 && k < n; k++) {
        /* Rank k is TP rank k % TP of stage k / TP % PP of CP rank
         * k / (TP x PP), as in the simulator. */
        ranks[k] = (cli_serve_rank_t){.plan = &in.plan, .role = in.role, .tp = k % tp,
                                      .pp = k / tp % pp, .cp = k / (tp * pp), .stop = &stop,
                                      .status = status + (size_t)k * in.plan.requests};
        if (pthread_create(&threads[k], NULL, cli_serve_rank_run, &ranks[k]) != 0) {
            rc = 1;
            atomic_store(&stop, true); /* the ranks already started wind down */
        } else
            started++;
    }
    for (int64_t k = 0; k < started; k++)
        pthread_join(threads[k], NULL);
    cli_metrics_stop(metrics);
    cli_disc_close(in.disc);
    if (rc == 1)
        fprintf(stderr, "kvstage serve: could not start %" PRId64 " rank threads: lower the "
                        "TP, PP and CP sizes or raise the process limits\n", n);
    else if (rc == 0)
        rc = cli_serve_report(&in, ranks, n);
    free(status);
    free(threads);
    free(ranks);
    free(tokens);
    free(first);
    return rc;
}
