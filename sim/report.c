/*
 * report.c - the report of a simulated run (run.h): what ended how, the
 * bytes verified, the rings, the events, the verdict's inputs
 * (sim/check.c judges them) and the metrics (transfer latency and
 * end-to-end percentiles, goodput, ring occupancy), for the run and per
 * instance.
 */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double sim_percentile_us(uint64_t *v, size_t n, unsigned pct)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t idx = (n * pct + 99) / 100;
    idx = idx == 0 ? 0 : idx - 1;
    return (double)v[idx] / 1e3;
}

static int cmp_ring_change_bytes(const void *a, const void *b)
{
    const sim_ring_change_t *x = a, *y = b;
    return x->live_bytes < y->live_bytes ? -1 : x->live_bytes > y->live_bytes;
}

/* The time-weighted 99th percentile of n's ring occupancy over [from, to]:
 * the least live_bytes such that the ring held at most that for 99% of the
 * window (exact: every change is recorded). Reorders its changes. */
static uint64_t sim_node_ring_p99(sim_node_t *n, uint64_t from, uint64_t to)
{
    if (n->nring_changes == 0 || to <= from)
        return 0;
    /* Each change becomes (held for, live): clip to the window. The time
     * before the first change held 0 bytes. */
    uint64_t zero_ns = n->ring_changes[0].at_ns > from
                           ? (n->ring_changes[0].at_ns < to ? n->ring_changes[0].at_ns : to) - from
                           : 0;
    for (size_t k = 0; k < n->nring_changes; k++) {
        const uint64_t start = n->ring_changes[k].at_ns > from ? n->ring_changes[k].at_ns : from;
        uint64_t end = k + 1 < n->nring_changes ? n->ring_changes[k + 1].at_ns : to;
        end = end < to ? end : to;
        n->ring_changes[k].at_ns = end > start ? end - start : 0; /* now: held for */
    }
    qsort(n->ring_changes, n->nring_changes, sizeof *n->ring_changes, cmp_ring_change_bytes);
    /* held above b for at most 1% of the window (rounded down) */
    const uint64_t need = (to - from) - (to - from) / 100;
    uint64_t covered = zero_ns;
    if (covered >= need)
        return 0;
    for (size_t k = 0; k < n->nring_changes; k++) {
        covered += n->ring_changes[k].at_ns;
        if (covered >= need)
            return n->ring_changes[k].live_bytes;
    }
    return n->ring_changes[n->nring_changes - 1].live_bytes;
}

/* Percentiles of the ok requests paired with instance inst (NULL: all). */
static void sim_request_percentiles(const sim_scenario_t *sc, const sim_inst_t *inst,
                                    uint64_t *e2e, uint64_t *xfer, double e2e_us[3],
                                    double xfer_us[2])
{
    size_t n = 0;
    for (uint32_t i = 0; i < sc->cfg.requests; i++) {
        const sim_req_t *r = &sc->reqs[i];
        if (r->state != SIM_REQ_DONE || r->status != KVS_OK)
            continue;
        if (inst != NULL && r->pi != inst && r->di != inst)
            continue;
        e2e[n] = r->done_ns - r->arrival_ns;
        xfer[n++] = r->done_ns - r->first_chunk_ns;
    }
    e2e_us[0] = sim_percentile_us(e2e, n, 50);
    e2e_us[1] = sim_percentile_us(e2e, n, 90);
    e2e_us[2] = sim_percentile_us(e2e, n, 99);
    xfer_us[0] = sim_percentile_us(xfer, n, 50);
    xfer_us[1] = sim_percentile_us(xfer, n, 99);
}

/* Operator metrics (after the counters: sim_ns, line rate). Reads only
 * what the run recorded: no event, no change to the digest. */
static void sim_report_metrics(sim_scenario_t *sc, sim_report_t *out)
{
    out->ttft_p50_us = out->e2e_p50_us; /* TTFT is e2e: arrival -> KV complete */
    out->ttft_p99_us = out->e2e_p99_us;
    uint64_t *e2e = calloc(sc->cfg.requests + 1, sizeof *e2e);
    uint64_t *xfer = calloc(sc->cfg.requests + 1, sizeof *xfer);
    if (e2e != NULL && xfer != NULL) {
        double e[3], x[2];
        sim_request_percentiles(sc, NULL, e2e, xfer, e, x);
        out->ttft_p90_us = e[1];
        out->transfer_p50_us = x[0];
        out->transfer_p99_us = x[1];
        for (uint32_t k = 0; k < out->instances; k++) {
            sim_instance_report_t *ir = &out->instance[k];
            sim_request_percentiles(sc, &sc->insts[k], e2e, xfer, e, x);
            ir->e2e_p50_us = e[0];
            ir->e2e_p90_us = e[1];
            ir->e2e_p99_us = e[2];
            ir->transfer_p50_us = x[0];
            ir->transfer_p99_us = x[1];
        }
    }
    free(e2e);
    free(xfer);
    const uint64_t nic = sc->cfg.net.link_bytes_per_s > 0 ? sc->cfg.net.link_bytes_per_s : 50000000000ull;
    const double capacity = (double)nic * (double)out->sim_ns / 1e9;
    const uint64_t from = sc->first_arrival_ns, to = sc->last_done_ns;
    double util_sum = 0;
    for (int64_t i = 0; i < sc->nprefill + sc->ndecode; i++) {
        sim_node_t *n = &sc->nodes[i];
        if (n->inst == NULL)
            continue;
        sim_instance_report_t *ir = &out->instance[n->inst - sc->insts];
        kvs_handler_stats_t st = {0};
        kvs_rank_stats(n->rank, &st);
        ir->watermark_waits += st.watermark_waits + n->acc.watermark_waits;
        const uint64_t carried = n->role == KVS_ROLE_DECODE
                                     ? n->bytes_received
                                     : st.rdma_write_bytes + n->acc.rdma_write_bytes;
        const double util = capacity > 0 ? (double)carried / capacity : 0;
        util_sum += util;
        ir->nic_util_mean += util / (double)n->inst->nranks;
        if (util > ir->nic_util_max)
            ir->nic_util_max = util;
        if (util > out->nic_util_max)
            out->nic_util_max = util;
        const uint64_t p99 = sim_node_ring_p99(n, from, to);
        if (p99 > ir->ring_p99_bytes)
            ir->ring_p99_bytes = p99;
        if (p99 > out->ring_p99_bytes)
            out->ring_p99_bytes = p99;
    }
    const int64_t ranks = sc->nprefill + sc->ndecode;
    out->nic_util_mean = ranks > 0 ? util_sum / (double)ranks : 0;
    out->goodput_fraction = out->line_rate_gbps > 0 ? out->goodput_gbps / out->line_rate_gbps : 0;
}

void sim_report_fill(sim_scenario_t *sc, sim_report_t *out)
{
    memset(out, 0, sizeof *out);
    out->requests_total = sc->cfg.requests;
    out->prefill_ranks = sc->nprefill;
    out->decode_ranks = sc->ndecode;
    uint64_t *lat = calloc(sc->cfg.requests + 1, sizeof *lat);
    uint64_t *e2e = calloc(sc->cfg.requests + 1, sizeof *e2e);
    size_t nl = 0;
    /* Per instance: prefill ones first, then decode ones. */
    out->instances = sc->npinst + sc->ndinst;
    for (uint32_t k = 0; k < out->instances; k++) {
        const sim_inst_t *inst = &sc->insts[k];
        out->instance[k] = (sim_instance_report_t){
            .role = inst->role, .id = inst->id, .tp = inst->tp, .pp = inst->pp};
    }
    for (uint32_t i = 0; i < sc->cfg.requests; i++) {
        const sim_req_t *r = &sc->reqs[i];
        if (sc->cfg.outcomes != NULL)
            sc->cfg.outcomes[i] = (sim_request_outcome_t){
                .status = r->state == SIM_REQ_DONE ? r->status : 1,
                .arrival_ns = r->arrival_ns, .opened_ns = r->opened_ns, .done_ns = r->done_ns,
                .prefill_instance = r->pi != NULL ? r->pi->id : 0,
                .decode_instance = r->di != NULL ? r->di->id : 0,
                .ranks = r->pi != NULL ? (uint32_t)(r->pi->nranks + r->di->nranks) : 0,
                .ranks_ok = r->ranks_ok, .ranks_peer = r->ranks_peer,
                .ranks_other = r->ranks_other, .ranks_down = r->ranks_down};
        out->unreported_failures += r->unreported;
        sim_instance_report_t *pr = r->pi != NULL ? &out->instance[r->pi - sc->insts] : NULL;
        sim_instance_report_t *dr = r->di != NULL ? &out->instance[r->di - sc->insts] : NULL;
        if (r->state != SIM_REQ_DONE) {
            out->hung_requests++;
        } else if (r->status == KVS_OK) {
            out->requests_ok++;
            pr->requests_ok++;
            dr->requests_ok++;
            if (lat != NULL && e2e != NULL) {
                lat[nl] = r->done_ns - r->computed_ns;
                e2e[nl++] = r->done_ns - r->arrival_ns;
            }
        } else {
            out->requests_failed++;
            pr->requests_failed++;
            dr->requests_failed++;
            /* Isolation (spec §12): a fault fails only requests paired with
             * an instance it struck. */
            if (!r->pi->faulted && !r->di->faulted && r->status != KVS_EOVERSIZED)
                out->collateral_failures++;
            uint32_t k = 0;
            while (k < sc->nfailures && sc->failures[k].status != r->status)
                k++;
            if (k < sc->nfailures)
                sc->failures[k].count++;
            else
                out->failures_unlisted++;
        }
    }
    out->latency_p50_us = lat != NULL ? sim_percentile_us(lat, nl, 50) : 0;
    out->latency_p99_us = lat != NULL ? sim_percentile_us(lat, nl, 99) : 0;
    out->e2e_p50_us = e2e != NULL ? sim_percentile_us(e2e, nl, 50) : 0;
    out->e2e_p99_us = e2e != NULL ? sim_percentile_us(e2e, nl, 99) : 0;
    free(lat);
    free(e2e);
    out->path = KVS_PATH_AUTO;
    for (int64_t i = 0; i < sc->nprefill + sc->ndecode; i++) {
        const sim_node_t *n = &sc->nodes[i];
        kvs_handler_stats_t st = {0};
        kvs_rank_stats(n->rank, &st);
        /* with the counters of the rank's previous incarnations */
        st.rdma_write_bytes += n->acc.rdma_write_bytes;
        st.rdma_writes += n->acc.rdma_writes;
        st.msgs_sent += n->acc.msgs_sent;
        st.msgs_rejected += n->acc.msgs_rejected;
        st.watermark_waits += n->acc.watermark_waits;
        st.msgs_retransmitted += n->acc.msgs_retransmitted;
        st.msgs_duplicate += n->acc.msgs_duplicate;
        st.peers_lost += n->acc.peers_lost;
        st.keys_granted += n->acc.keys_granted;
        st.keys_revoked += n->acc.keys_revoked;
        if (n->acc.ring_peak_bytes > st.ring_peak_bytes)
            st.ring_peak_bytes = n->acc.ring_peak_bytes;
        out->keys_granted += st.keys_granted;
        out->keys_revoked += st.keys_revoked;
        out->hostile_bytes_landed += n->acc_planted_bytes +
                                     (n->nic != NULL ? sim_nic_planted_landed_bytes(n->nic) : 0);
        if (n->role == KVS_ROLE_DECODE && n->nic != NULL) /* a crash takes its grants along */
            out->keys_leaked += sim_nic_grants_live(n->nic);
        if (n->rank != NULL && out->path == KVS_PATH_AUTO)
            out->path = kvs_manager_path(kvs_rank_manager(n->rank));
        if (n->inst == NULL)
            continue; /* set-up stopped before its instance was built */
        sim_instance_report_t *ir = &out->instance[n->inst - sc->insts];
        ir->bytes += n->role == KVS_ROLE_DECODE ? n->bytes_received : st.rdma_write_bytes;
        if (n->role == KVS_ROLE_DECODE && st.ring_peak_bytes > ir->ring_peak_bytes)
            ir->ring_peak_bytes = st.ring_peak_bytes;
        out->bytes_moved += st.rdma_write_bytes;
        out->rdma_ops += st.rdma_writes;
        out->control_msgs += st.msgs_sent;
        out->msgs_rejected += st.msgs_rejected;
        out->watermark_waits += st.watermark_waits;
        out->msgs_retransmitted += st.msgs_retransmitted;
        out->msgs_duplicate += st.msgs_duplicate;
        out->peers_lost += st.peers_lost;
        out->posts_refused += n->acc_posts_refused +
                              (n->nic != NULL ? sim_nic_posts_refused(n->nic) : 0);
        if (st.ring_peak_bytes > out->ring_peak_bytes)
            out->ring_peak_bytes = st.ring_peak_bytes;
        kvs_ring_t *ring = n->rank != NULL ? kvs_manager_ring(kvs_rank_manager(n->rank)) : NULL;
        if (ring != NULL) /* surviving ranks only: a crash takes its ring along */
            out->ring_leaked_bytes += kvs_ring_live_bytes(ring);
    }
    out->bytes_verified = sc->bytes_verified;
    out->aux_bytes_verified = sc->aux_bytes_verified;
    out->aux_corrupt_bytes = sc->aux_corrupt_bytes;
    snprintf(out->aux_error, sizeof out->aux_error, "%s", sc->aux_error);
    out->corrupt_bytes = sc->corrupt_bytes;
    out->hostile_writes = sc->hostile_writes;
    out->failures = sc->nfailures;
    memcpy(out->failure, sc->failures, sizeof out->failure);
    sim_check_report(&sc->cfg, out);
    out->sim_ns = sc->last_done_ns > sc->first_arrival_ns ? sc->last_done_ns - sc->first_arrival_ns : 0;
    out->goodput_gbps = out->sim_ns > 0 ? (double)out->bytes_verified * 8.0 / (double)out->sim_ns : 0;
    const uint64_t nic = sc->cfg.net.link_bytes_per_s > 0 ? sc->cfg.net.link_bytes_per_s : 50000000000ull;
    const int64_t nics = sc->nprefill < sc->ndecode ? sc->nprefill : sc->ndecode;
    out->line_rate_gbps = (double)nic * 8.0 / 1e9 * (double)nics;
    sim_report_metrics(sc, out);
    out->events = sim_engine_events_run(sc->eng);
    out->digest = sim_engine_digest(sc->eng);
    out->ranks_crashed = sc->ranks_crashed;
    out->ranks_restarted = sc->ranks_restarted;
    out->ranks_down_at_start = sc->ranks_down_at_start;
    snprintf(out->init_error, sizeof out->init_error, "%s", sc->init_error);
}
