/*
 * trace.h - Chrome trace-event JSON output of a simulated run (opens in
 * Perfetto or chrome://tracing): one process per rank, threads "gpu", "nic"
 * and "core", complete ("X") spans in simulated microseconds. Also the span
 * callback type the simulated GPU and NIC report their operations through.
 */
#ifndef KVS_SIM_TRACE_H
#define KVS_SIM_TRACE_H

#include <stdint.h>

/* A finished operation: name ("gather", "write"...) on thread `tid` of the
 * reporting component, over [start_ns, end_ns] of simulated time. */
typedef void (*sim_span_fn)(void *ctx, const char *name, const char *tid,
                            uint64_t start_ns, uint64_t end_ns);

typedef struct sim_trace sim_trace_t;

/* Creates path and writes the header; KVS_EINVAL if it cannot be written. */
int sim_trace_open(const char *path, sim_trace_t **out);
void sim_trace_process(sim_trace_t *t, int pid, const char *name);
void sim_trace_span(sim_trace_t *t, int pid, const char *tid, const char *name,
                    uint64_t start_ns, uint64_t end_ns);
/* Writes the footer and closes; KVS_EINVAL if any write failed. NULL is a no-op. */
int sim_trace_close(sim_trace_t *t);

#endif
