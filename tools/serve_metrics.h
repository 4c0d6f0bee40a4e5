/*
 * serve_metrics.h - `kvstage serve --metrics IP:PORT`: an HTTP endpoint
 * that answers GET /metrics with the Prometheus text of every rank of the
 * process (kvs_rank_metrics: one exposition, each family once).
 *
 * Ranks join after they are made and leave before they are destroyed,
 * under the endpoint's mutex, so a scrape never reads a rank that is gone.
 * One thread serves one request at a time (a scraper, not a web server):
 * each connection gets at most a few seconds to send its request line.
 */
#ifndef KVS_TOOLS_SERVE_METRICS_H
#define KVS_TOOLS_SERVE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include <kvstage/kvstage.h>

typedef struct cli_metrics cli_metrics_t;

/* Listens on ip:port (port 0: one the kernel picks) for up to max_ranks
 * ranks and starts the serving thread; *bound_port gets the port. On
 * failure returns -1 with err saying what to change, nothing left. */
int cli_metrics_start(const char *ip, uint16_t port, size_t max_ranks, cli_metrics_t **out,
                      uint16_t *bound_port, char *err, size_t err_len);
/* Stops and joins the thread, closes the socket, frees. NULL: no-op. */
void cli_metrics_stop(cli_metrics_t *m);
/* A rank joins (scrapes include it from now) or leaves (before it is
 * destroyed). m may be NULL (no endpoint): nothing happens. */
void cli_metrics_add(cli_metrics_t *m, kvs_rank_t *rank);
void cli_metrics_remove(cli_metrics_t *m, kvs_rank_t *rank);
/* Requests answered with 200 so far. */
uint64_t cli_metrics_scrapes(cli_metrics_t *m);

#endif
