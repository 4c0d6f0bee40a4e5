/*
 * serve_fault.h - a wrapper fabric for `kvstage serve --fault`: it forwards
 * every op to a real fabric and spoils the remote key of the Nth write, so
 * the peer's NIC answers that write with an error completion (a remote
 * access error). The rest goes through untouched. Like SQLite's test VFS:
 * fault injection is a backend that delegates.
 */
#ifndef KVSTAGE_TOOLS_SERVE_FAULT_H
#define KVSTAGE_TOOLS_SERVE_FAULT_H

#include <stdint.h>

#include <kvstage/backend.h>

typedef struct cli_fault_fabric cli_fault_fabric_t;

/* Wraps inner (borrowed; must outlive the wrapper). fail_write: the 1-based
 * index of the write to spoil, 0 for none. */
int cli_fault_fabric_create(kvs_fabric_t *inner, uint64_t fail_write, cli_fault_fabric_t **out);
void cli_fault_fabric_destroy(cli_fault_fabric_t *w);
/* The kvs_fabric_t to hand to the core; owned by w. */
kvs_fabric_t *cli_fault_fabric(cli_fault_fabric_t *w);
/* How many writes were spoiled so far (0 or 1). */
uint64_t cli_fault_fabric_spoiled(const cli_fault_fabric_t *w);

#endif
