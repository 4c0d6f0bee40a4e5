/*
 * fault_fabric.h - a fault-injecting wrapper fabric (hw/net/fault_fabric.c),
 * in the style of SQLite's test VFS: it forwards every op to an inner
 * fabric and spoils one write, chosen by its owner, the way `kind` says.
 * `kvstage serve --fault` wraps a real fabric with it; the simulator wraps
 * the NIC of a rank a hostile-write fault names (sim/hostile.c).
 *
 * The kinds:
 * - write-error: the write gets a remote key no registration has (its low
 *   16 bits flipped), so the peer's NIC answers with an error completion.
 * - hostile-write: it keeps the key it was given and lands
 *   hostile_shift_bytes further (0: its own length further), outside the
 *   writer's region, as a hostile writer would.
 * - stale-write: the write goes as it is and is kept; once due, the stale
 *   writer of the field strikes, after the buffer the write was meant for
 *   was given back. KVS_FAULT_STALE_REPOST (serve): the kept write is
 *   posted again, unchanged, by the first poll after kvs_fault_fabric_arm.
 *   KVS_FAULT_STALE_REDIRECT (the simulator): a later write, its own source
 *   and length, goes to the kept target under the kept key; the first that
 *   `pick` and `due` accept.
 *   Only a region-scoped key stops hostile and stale writes.
 * - replay-registration (a decode): every message sent on the first
 *   connection until kvs_fault_fabric_registered is kept; once armed, the
 *   next poll opens a new connection to the same peer and sends them all
 *   again, byte for byte: another session's registration replayed, which
 *   the prefill must refuse.
 *
 * Which write: the first write, counted from the fail_write-th on (1-based,
 * over every write the wrapper is given), that `pick` accepts and the
 * inner fabric takes. A spoiled write the inner fabric refuses at the post
 * with KVS_EREMOTE was caught there (hw/ofi checks keys and ranges at the
 * post): the fault is spent. Any other refusal (a full send queue, a dead
 * connection) leaves the write unmade and the fault for the next one; a
 * kept write is kept only once taken. A slot the inner fabric leaves to its
 * default (backend.h) the wrapper leaves to its default too, so the core
 * sees the inner fabric's abilities (a fabric without key_grant stays one).
 *
 * Threads: the fabric's ops are driven from one thread at a time, as the
 * inner fabric's. kvs_fault_fabric_arm, _registered, _spoiled, _replayed,
 * _settled and _stale_status are safe from any thread (a serve rank arms
 * from its main thread while its driver's thread polls); _posting is for
 * the thread that writes. Nothing here reads the clock or draws at random:
 * the simulator stays deterministic.
 */
#ifndef KVSTAGE_FAULT_FABRIC_H
#define KVSTAGE_FAULT_FABRIC_H

#include <kvstage/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_fault_fabric kvs_fault_fabric_t;

typedef enum kvs_fault_kind {
    KVS_FAULT_WRITE_ERROR = 0,     /* a remote key nobody registered */
    KVS_FAULT_HOSTILE_WRITE,       /* the key it was given, outside its region */
    KVS_FAULT_STALE_WRITE,         /* under a key after its region was freed */
    KVS_FAULT_REPLAY_REGISTRATION  /* decode: its registration, again, on a new connection */
} kvs_fault_kind_t;

/* How a stale write strikes once due (see the top of this file). */
typedef enum kvs_fault_stale {
    KVS_FAULT_STALE_REPOST = 0,    /* the kept write again, at the poll after the arm */
    KVS_FAULT_STALE_REDIRECT       /* a later write sent to the kept target and key */
} kvs_fault_stale_t;

/* What the wrapper is doing with the write it is handing to its inner
 * fabric now (kvs_fault_fabric_posting). */
typedef enum kvs_fault_post {
    KVS_FAULT_POST_NONE = 0,       /* no write in hand, or one going as given */
    KVS_FAULT_POST_KEPT,           /* stale-write: the write kept, going as given */
    KVS_FAULT_POST_SPOILED         /* the fault's write, spoiled */
} kvs_fault_post_t;

/* An owner's say on one write (conn and desc as the wrapper was given
 * them). Called on the thread that writes, before the inner fabric sees
 * the write; it must not call the wrapper's ops. */
typedef bool (*kvs_fault_write_fn)(void *ctx, kvs_conn_t *conn, const kvs_write_desc_t *desc);

typedef struct kvs_fault_fabric_config {
    kvs_fault_kind_t kind;
    uint64_t fail_write;           /* 1-based: writes before it are never the one;
                                      0: no write fault (replay-registration) */
    uint64_t hostile_shift_bytes;  /* hostile-write: how far; 0: the write's length */
    kvs_fault_stale_t stale;       /* stale-write: how it strikes */
    kvs_fault_write_fn pick;       /* whether a write may be the one (and, on
                                      REDIRECT, the one redirected); NULL: any */
    kvs_fault_write_fn due;        /* REDIRECT: whether this write goes to the
                                      kept target now; NULL: once armed */
    void *ctx;                     /* for pick and due */
} kvs_fault_fabric_config_t;

/* The most messages replay-registration keeps. */
#define KVS_FAULT_REPLAY_MAX 16

/* The wr_id of a stale repost: the core's writes never carry it (theirs
 * have bit 63 clear, its control sends bit 63 and a type), so the wrapper
 * takes that completion for itself. */
#define KVS_FAULT_STALE_WR_ID UINT64_MAX

/* Wraps inner (borrowed: it must outlive the wrapper, or be replaced by
 * kvs_fault_fabric_rebind first). cfg is copied. KVS_EINVAL for a NULL
 * argument or an unknown kind or stale mode, KVS_ENOMEM; on failure
 * nothing is left to free. */
KVS_API int kvs_fault_fabric_create(kvs_fabric_t *inner, const kvs_fault_fabric_config_t *cfg,
                                    kvs_fault_fabric_t **out);
/* After the last call into the wrapper's fabric (a driver stopped, a rank
 * destroyed): closes a replay's connection on the inner fabric. NULL: no-op. */
KVS_API void kvs_fault_fabric_destroy(kvs_fault_fabric_t *w);
/* The kvs_fabric_t to hand to the core; owned by w. */
KVS_API kvs_fabric_t *kvs_fault_fabric(kvs_fault_fabric_t *w);
/* The inner fabric is replaced by inner (the rank on the wrapper was
 * destroyed with its fabric, and the next one is made on a new one: a
 * simulated rank's restart). What was counted, kept and spoiled stays;
 * connections of the old fabric are forgotten (a stale repost then ends
 * KVS_EPEER). Only while no rank uses the wrapper. */
KVS_API void kvs_fault_fabric_rebind(kvs_fault_fabric_t *w, kvs_fabric_t *inner);
/* What w is doing with the write it is handing to its inner fabric now:
 * for code below the wrapper (a simulated NIC's write hook marking the
 * spoiled write, a wrapper under this one) to tell that write apart. */
KVS_API kvs_fault_post_t kvs_fault_fabric_posting(const kvs_fault_fabric_t *w);
/* How many writes went spoiled so far (0 or 1; stale-write: its repost,
 * once made, or the redirected write). */
KVS_API uint64_t kvs_fault_fabric_spoiled(const kvs_fault_fabric_t *w);
/* stale-write (REPOST, or REDIRECT without `due`): the kept write's region
 * is freed; replay-registration: replay now. The next poll (the thread
 * that drives the core) makes it. */
KVS_API void kvs_fault_fabric_arm(kvs_fault_fabric_t *w);
/* replay-registration: the rank is registered; keep nothing more. */
KVS_API void kvs_fault_fabric_registered(kvs_fault_fabric_t *w);
/* replay-registration: messages sent again on the new connection; *status
 * KVS_OK or why the replay could not be made (KVS_ENOENT: nothing was
 * kept; connect or send refused), *answers the messages the peer sent
 * back on it. */
KVS_API uint32_t kvs_fault_fabric_replayed(const kvs_fault_fabric_t *w, int *status,
                                           uint32_t *answers);
/* Whether nothing of the fault is still to come: false only while a stale
 * write is kept and has not struck (REPOST: its repost not completed), or
 * a replay is armed and not yet answered or refused. */
KVS_API bool kvs_fault_fabric_settled(const kvs_fault_fabric_t *w);
/* stale-write REPOST: the repost's completion status (KVS_OK: it landed),
 * or 1 when it was never made or has not completed. */
KVS_API int kvs_fault_fabric_stale_status(const kvs_fault_fabric_t *w);

#ifdef __cplusplus
}
#endif

#endif
