/*
 * serve_fault.h - a wrapper fabric for `kvstage serve --fault`: it forwards
 * every op to a real fabric and spoils the Nth write: write-error gives it
 * a remote key no registration has, so the peer's NIC answers with an
 * error completion (a remote access error); hostile-write keeps the key it
 * was given and moves the write CLI_FAULT_HOSTILE_SHIFT bytes past where
 * it was meant to land, outside the writer's region, as a hostile writer
 * would; stale-write lets the Nth write go as it is, keeps it, and posts it
 * once more, unchanged, when the rank is told its rooms are over (its
 * regions freed at the decode): the stale writer of the field, whose write
 * comes after the buffer it was meant for was given back. Only a
 * region-scoped key stops those two. On a decode rank, replay-registration
 * keeps every message the rank sent on its first connection until it is
 * told it is registered (HELLO, REGISTER and their ACKs), and once armed
 * opens a new connection to the same prefill rank and sends them all
 * again, byte for byte: another session's registration replayed, which the
 * prefill must refuse (with a cluster secret: the proof answers a
 * challenge of the old connection). The rest goes through untouched. Like
 * SQLite's test VFS: fault injection is a backend that delegates.
 */
#ifndef KVSTAGE_TOOLS_SERVE_FAULT_H
#define KVSTAGE_TOOLS_SERVE_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include <kvstage/backend.h>

typedef struct cli_fault_fabric cli_fault_fabric_t;

/* How far hostile-write moves its write: past any region of serve's
 * checks' shapes (test_serve.sh: at most 192 KiB), still inside their
 * 1 MiB ring when the region starts in its first 768 KiB. */
#define CLI_FAULT_HOSTILE_SHIFT (UINT64_C(256) << 10)

typedef enum cli_fault_kind {
    CLI_FAULT_WRITE_ERROR = 0, /* a remote key nobody registered */
    CLI_FAULT_HOSTILE_WRITE,   /* the key it was given, outside its region */
    CLI_FAULT_STALE_WRITE,     /* the same write again after its region was freed */
    CLI_FAULT_REPLAY_REGISTRATION /* decode: its registration, again, on a new connection */
} cli_fault_kind_t;

/* The most messages replay-registration keeps. */
#define CLI_FAULT_REPLAY_MAX 16

/* The wr_id of stale-write's second post: the core's writes never carry
 * it (theirs have bit 63 clear, its control sends bit 63 and a type), so
 * the wrapper takes that completion for itself. */
#define CLI_FAULT_STALE_WR_ID UINT64_MAX

/* Wraps inner (borrowed; must outlive the wrapper). fail_write: the 1-based
 * index of the write to spoil, 0 for none, the way `kind` says. */
int cli_fault_fabric_create(kvs_fabric_t *inner, uint64_t fail_write, cli_fault_kind_t kind,
                            cli_fault_fabric_t **out);
void cli_fault_fabric_destroy(cli_fault_fabric_t *w);
/* The kvs_fabric_t to hand to the core; owned by w. */
kvs_fabric_t *cli_fault_fabric(cli_fault_fabric_t *w);
/* How many writes were spoiled so far (0 or 1; stale-write: its second
 * post, once made). */
uint64_t cli_fault_fabric_spoiled(const cli_fault_fabric_t *w);
/* stale-write: the rank's rooms are over; the next poll (the thread that
 * drives the core) posts the kept write again. replay-registration: the
 * next poll replays what it kept. Safe from any thread. */
void cli_fault_fabric_arm(cli_fault_fabric_t *w);
/* replay-registration: the rank is registered; keep nothing more. */
void cli_fault_fabric_registered(cli_fault_fabric_t *w);
/* replay-registration: messages sent again on the new connection; *status
 * KVS_OK or why the replay could not be made (connect or send refused),
 * *answers the messages the peer sent back on it. */
uint32_t cli_fault_fabric_replayed(const cli_fault_fabric_t *w, int *status, uint32_t *answers);
/* Whether nothing of the fault is still to come: true but for stale-write
 * armed (or its Nth write made) and its second post not yet completed, and
 * replay-registration armed and not yet answered by the peer. */
bool cli_fault_fabric_settled(const cli_fault_fabric_t *w);
/* stale-write: the second post's completion status (KVS_OK: it landed),
 * or 1 when it was never made or has not completed. */
int cli_fault_fabric_stale_status(const cli_fault_fabric_t *w);

#endif
