/*
 * serve_fault.h - a wrapper fabric for `kvstage serve --fault`: it forwards
 * every op to a real fabric and spoils the Nth write: write-error gives it
 * a remote key no registration has, so the peer's NIC answers with an
 * error completion (a remote access error); hostile-write keeps the key it
 * was given and moves the write CLI_FAULT_HOSTILE_SHIFT bytes past where
 * it was meant to land, outside the writer's region, as a stale or hostile
 * writer would (only a region-scoped key stops it). The rest goes through
 * untouched. Like SQLite's test VFS:
 * fault injection is a backend that delegates.
 */
#ifndef KVSTAGE_TOOLS_SERVE_FAULT_H
#define KVSTAGE_TOOLS_SERVE_FAULT_H

#include <stdint.h>

#include <kvstage/backend.h>

typedef struct cli_fault_fabric cli_fault_fabric_t;

/* How far hostile-write moves its write: past any region of serve's
 * checks' shapes (test_serve.sh: at most 192 KiB), still inside their
 * 1 MiB ring when the region starts in its first 768 KiB. */
#define CLI_FAULT_HOSTILE_SHIFT (UINT64_C(256) << 10)

typedef enum cli_fault_kind {
    CLI_FAULT_WRITE_ERROR = 0, /* a remote key nobody registered */
    CLI_FAULT_HOSTILE_WRITE    /* the key it was given, outside its region */
} cli_fault_kind_t;

/* Wraps inner (borrowed; must outlive the wrapper). fail_write: the 1-based
 * index of the write to spoil, 0 for none, the way `kind` says. */
int cli_fault_fabric_create(kvs_fabric_t *inner, uint64_t fail_write, cli_fault_kind_t kind,
                            cli_fault_fabric_t **out);
void cli_fault_fabric_destroy(cli_fault_fabric_t *w);
/* The kvs_fabric_t to hand to the core; owned by w. */
kvs_fabric_t *cli_fault_fabric(cli_fault_fabric_t *w);
/* How many writes were spoiled so far (0 or 1). */
uint64_t cli_fault_fabric_spoiled(const cli_fault_fabric_t *w);

#endif
