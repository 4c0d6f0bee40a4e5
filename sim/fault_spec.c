/*
 * fault_spec.c - the fault-spec parser of fault_spec.h. Strict: every field
 * is checked and a bad one is named with the accepted form. Moved here from
 * tools/fault.c so the CLI and the library's kvs_sim_run read faults alike.
 */
#include "fault_spec.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_FAULT_FORMS                                                        \
    "drop:TYPE:P, dup:TYPE:P, delay:TYPE:P:MICROS, write-error:P, "            \
    "link-down:RANK:AT_US:FOR_US, slow-scatter:RANK:FACTOR, "                  \
    "crash:SIDE:N:AT_US, restart:SIDE:N:AT_US, hbm-full:RANK, stall:MS or "  \
    "hostile-write:RANK:stale|outside:AT_US, "                                 \
    "with RANK "    \
    "p<tp>[.<pp>][c<cp>][@<instance>] or d<tp>[.<pp>][@<instance>] and SIDE "  \
    "prefill[@<instance>] or decode[@<instance>]"
/* How RANK reads, for messages. */
#define SIM_FAULT_RANK_FORM                                                    \
    "RANK p<tp>[.<pp>][c<cp>][@<instance>] or d<tp>[.<pp>][@<instance>] of "   \
    "this cluster (e.g. p3, d1.0, p3@1: TP rank 3 of prefill instance 1; "      \
    "p3.0c1: TP rank 3 of CP rank 1)"
#define SIM_FAULT_MAX_FIELDS 5

static const struct {
    const char *name;
    int type;
} sim_fault_types[] = {
    {"any", 0},          {"register", 1},     {"metadata", 4},  {"staging_req", 6},
    {"staging_rsp", 7},  {"chunk_ready", 8},  {"watermark", 9}, {"status", 10},
    {"abort", 11},
};

static int sim_fault_fail(char *err, size_t err_bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int sim_fault_fail(char *err, size_t err_bytes, const char *fmt, ...)
{
    if (err != NULL && err_bytes > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_bytes, fmt, ap);
        va_end(ap);
    }
    return KVS_EINVAL;
}

/* "0.05", "1", "0" -> parts per million. */
static bool sim_fault_prob(const char *text, uint32_t *ppm)
{
    uint64_t whole = 0, frac = 0;
    int digits = 0;
    const char *p = text;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9' && whole <= 1)
        whole = whole * 10 + (uint64_t)(*p++ - '0');
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9' && digits < 6) {
            frac = frac * 10 + (uint64_t)(*p++ - '0');
            digits++;
        }
        if (digits == 0)
            return false;
    }
    if (*p != '\0')
        return false;
    while (digits++ < 6)
        frac *= 10;
    const uint64_t v = whole * 1000000 + frac;
    if (v > 1000000)
        return false;
    *ppm = (uint32_t)v;
    return true;
}

/* "@1" at text (or nothing: instance 0) -> instance of a side with count
 * instances; *end past it. */
static bool sim_fault_instance(const char *text, uint32_t count, uint32_t *out,
                               const char **end)
{
    *out = 0;
    *end = text;
    if (*text != '@')
        return true;
    char *e;
    const char *s = text + 1;
    if (*s < '0' || *s > '9')
        return false;
    const unsigned long i = strtoul(s, &e, 10);
    if (i >= count)
        return false;
    *out = (uint32_t)i;
    *end = e;
    return true;
}

/* "p3", "d1.0", "p3@1", "d0.1@2", "p3.0c1" (CP rank 1 of a prefill with
 * CP) -> side, instance and index in it: (cp * pp_size + pp) * tp_size +
 * tp, the rank's simulated name. */
static bool sim_fault_rank(const char *text, const sim_topology_t *topo, sim_fault_t *out)
{
    const bool decode = text[0] == 'd';
    if (text[0] != 'p' && text[0] != 'd')
        return false;
    if (text[1] < '0' || text[1] > '9')
        return false;
    char *end;
    const long tp = strtol(text + 1, &end, 10);
    long pp = 0;
    if (*end == '.') {
        const char *s = end + 1;
        if (*s < '0' || *s > '9')
            return false;
        pp = strtol(s, &end, 10);
    }
    long cp = 0;
    if (*end == 'c' && !decode) {
        const char *s = end + 1;
        if (*s < '0' || *s > '9')
            return false;
        cp = strtol(s, &end, 10);
    }
    const kvs_role_t role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
    uint32_t inst;
    const char *rest;
    if (!sim_fault_instance(end, sim_topology_count(topo, role), &inst, &rest) ||
        *rest != '\0')
        return false;
    const sim_instance_shape_t *s = decode ? &topo->decode[inst] : &topo->prefill[inst];
    const long cps = decode || topo->prefill_cp < 1 ? 1 : (long)topo->prefill_cp;
    if (tp < 0 || tp >= s->tp || pp < 0 || pp >= s->pp || cp < 0 || cp >= cps)
        return false;
    out->role = role;
    out->instance = inst;
    out->rank = (cp * s->pp + pp) * s->tp + tp;
    return true;
}

static bool sim_fault_u64(const char *text, uint64_t *out)
{
    if (text[0] < '0' || text[0] > '9')
        return false;
    char *end;
    const unsigned long long v = strtoull(text, &end, 10);
    if (*end != '\0' || v > UINT64_MAX / 1000)
        return false;
    *out = v;
    return true;
}

int sim_fault_parse(const char *spec, const sim_topology_t *topo, sim_fault_t *out,
                    char *err, size_t err_bytes)
{
    if (spec == NULL || topo == NULL || out == NULL)
        return sim_fault_fail(err, err_bytes, "fault spec, topology and output must not be "
                              "NULL");
    char buf[256];
    if (strlen(spec) >= sizeof buf)
        return sim_fault_fail(err, err_bytes, "'%.40s...': too long; use %s", spec,
                              SIM_FAULT_FORMS);
    strcpy(buf, spec);
    char *field[SIM_FAULT_MAX_FIELDS + 1];
    int n = 0;
    for (char *p = buf; n <= SIM_FAULT_MAX_FIELDS;) {
        field[n++] = p;
        p = strchr(p, ':');
        if (p == NULL)
            break;
        *p++ = '\0';
    }
    memset(out, 0, sizeof *out);
    if (topo->prefill_instances < 1 || topo->decode_instances < 1)
        return sim_fault_fail(err, err_bytes, "'%s': the cluster has no instance on a side: "
                              "resolve the topology first (sim_topology_resolve)", spec);
    const char *kind = field[0];
    uint32_t ppm = 0;
    if (strcmp(kind, "drop") == 0 || strcmp(kind, "dup") == 0 || strcmp(kind, "delay") == 0) {
        const bool delay = kind[1] == 'e';
        if (n != (delay ? 4 : 3))
            return sim_fault_fail(err, err_bytes, "'%s': %s takes %s", spec, kind,
                                  delay ? "TYPE:P:MICROS" : "TYPE:P");
        size_t t = 0;
        while (t < sizeof sim_fault_types / sizeof sim_fault_types[0] &&
               strcmp(sim_fault_types[t].name, field[1]) != 0)
            t++;
        if (t == sizeof sim_fault_types / sizeof sim_fault_types[0])
            return sim_fault_fail(err, err_bytes,
                                  "'%s': unknown message type '%s': use register, "
                                  "metadata, staging_req, staging_rsp, watermark, "
                                  "chunk_ready, status, abort or any", spec, field[1]);
        if (!sim_fault_prob(field[2], &ppm))
            return sim_fault_fail(err, err_bytes, "'%s': probability '%s' must be a "
                                  "decimal in [0, 1], e.g. 0.05", spec, field[2]);
        out->kind = kind[0] == 'd' && kind[1] == 'r'   ? SIM_FAULT_DROP
                    : kind[0] == 'd' && kind[1] == 'u' ? SIM_FAULT_DUP
                                                       : SIM_FAULT_DELAY;
        out->msg_type = sim_fault_types[t].type;
        if (delay) {
            uint64_t us;
            if (!sim_fault_u64(field[3], &us))
                return sim_fault_fail(err, err_bytes, "'%s': MICROS '%s' must be a whole "
                                      "number of microseconds", spec, field[3]);
            out->delay_ns = us * 1000;
        }
    } else if (strcmp(kind, "write-error") == 0) {
        if (n != 2 || !sim_fault_prob(field[1], &ppm))
            return sim_fault_fail(err, err_bytes, "'%s': use write-error:P with P in [0, 1]",
                                  spec);
        out->kind = SIM_FAULT_WRITE_ERROR;
    } else if (strcmp(kind, "link-down") == 0) {
        uint64_t at, len;
        if (n != 4 || !sim_fault_rank(field[1], topo, out) ||
            !sim_fault_u64(field[2], &at) || !sim_fault_u64(field[3], &len))
            return sim_fault_fail(err, err_bytes, "'%s': use link-down:RANK:AT_US:FOR_US "
                                  "with %s", spec, SIM_FAULT_RANK_FORM);
        out->kind = SIM_FAULT_LINK_DOWN;
        out->at_ns = at * 1000;
        out->for_ns = len * 1000;
    } else if (strcmp(kind, "slow-scatter") == 0) {
        uint64_t factor;
        if (n != 3 || !sim_fault_rank(field[1], topo, out) || out->role != KVS_ROLE_DECODE ||
            !sim_fault_u64(field[2], &factor) || factor < 1 || factor > 1000000)
            return sim_fault_fail(err, err_bytes, "'%s': use slow-scatter:RANK:FACTOR with "
                                  "RANK d<tp>[.<pp>][@<instance>], a decode rank of this "
                                  "cluster (e.g. d1@1), and FACTOR 1..1000000", spec);
        out->kind = SIM_FAULT_SLOW_SCATTER;
        out->factor = (uint32_t)factor;
    } else if (strcmp(kind, "crash") == 0 || strcmp(kind, "restart") == 0) {
        /* SIDE: prefill or decode, then @<instance> or nothing. */
        const bool decode = n >= 2 && strncmp(field[1], "decode", 6) == 0;
        const bool prefill = n >= 2 && strncmp(field[1], "prefill", 7) == 0;
        const kvs_role_t role = decode ? KVS_ROLE_DECODE : KVS_ROLE_PREFILL;
        uint32_t inst = 0;
        const char *rest = "";
        const bool side_ok = (decode || prefill) &&
                             sim_fault_instance(field[1] + (decode ? 6 : 7),
                                                sim_topology_count(topo, role), &inst, &rest) &&
                             *rest == '\0';
        const int64_t count = side_ok ? sim_topology_ranks(topo, role, inst) : 0;
        uint64_t rank, at;
        if (n != 4 || !side_ok || !sim_fault_u64(field[2], &rank) ||
            rank >= (uint64_t)count || !sim_fault_u64(field[3], &at)) {
            if (!side_ok)
                return sim_fault_fail(err, err_bytes, "'%s': use %s:SIDE:N:AT_US with SIDE "
                                      "prefill[@<instance>] or decode[@<instance>] of this "
                                      "cluster (%u prefill, %u decode instances; e.g. "
                                      "prefill@1) and N the rank's index in that instance "
                                      "((cp * pp_size + pp) * tp_size + tp)", spec, kind,
                                      topo->prefill_instances, topo->decode_instances);
            return sim_fault_fail(err, err_bytes, "'%s': use %s:SIDE:N:AT_US with N the "
                                  "rank's index in its instance ((cp * pp_size + pp) * tp_size + tp), "
                                  "0..%lld here", spec, kind, (long long)count - 1);
        }
        out->kind = kind[0] == 'c' ? SIM_FAULT_CRASH : SIM_FAULT_RESTART;
        out->role = role;
        out->instance = inst;
        out->rank = (int64_t)rank;
        out->at_ns = at * 1000;
    } else if (strcmp(kind, "hbm-full") == 0) {
        if (n != 2 || !sim_fault_rank(field[1], topo, out))
            return sim_fault_fail(err, err_bytes, "'%s': use hbm-full:RANK with %s", spec,
                                  SIM_FAULT_RANK_FORM);
        out->kind = SIM_FAULT_HBM_FULL;
    } else if (strcmp(kind, "hostile-write") == 0) {
        uint64_t at;
        const bool stale = n == 4 && strcmp(field[2], "stale") == 0;
        const bool outside = n == 4 && strcmp(field[2], "outside") == 0;
        if (n != 4 || !sim_fault_rank(field[1], topo, out) || out->role != KVS_ROLE_PREFILL ||
            !(stale || outside) || !sim_fault_u64(field[3], &at))
            return sim_fault_fail(err, err_bytes, "'%s': use hostile-write:RANK:MODE:AT_US "
                                  "with RANK p<tp>[.<pp>][@<instance>], a prefill rank of "
                                  "this cluster (e.g. p1@1), MODE stale (a freed region's "
                                  "key) or outside (past its own bytes), and AT_US the "
                                  "microsecond from which its next staged write goes astray",
                                  spec);
        out->kind = SIM_FAULT_HOSTILE_WRITE;
        out->hostile = stale ? SIM_HOSTILE_STALE : SIM_HOSTILE_OUTSIDE;
        out->at_ns = at * 1000;
    } else if (strcmp(kind, "stall") == 0) {
        /* A day at most, as stall_timeout_ns. */
        uint64_t ms;
        if (n != 2 || !sim_fault_u64(field[1], &ms) || ms < 1 || ms > UINT64_C(86400000))
            return sim_fault_fail(err, err_bytes, "'%s': use stall:MS with MS the stall "
                                  "timeout every rank gets, 1..86400000 ms (e.g. stall:5)",
                                  spec);
        out->kind = SIM_FAULT_STALL;
        out->for_ns = ms * 1000000;
    } else {
        return sim_fault_fail(err, err_bytes, "'%s': unknown fault '%s': use %s", spec, kind,
                              SIM_FAULT_FORMS);
    }
    out->num = ppm;
    out->den = 1000000;
    return KVS_OK;
}
