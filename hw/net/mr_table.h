/*
 * mr_table.h - the registration table of the network fabrics (hw/verbs,
 * hw/ofi): which of its fixed slots are live, the ids peers name a
 * registration by, how a range is cut into pieces, and the checks that
 * mr_register, mr_deregister and write make against it, each refusal
 * recorded on the fabric with what to change. Registering the pieces
 * (fi_mr_reg, ibv_reg_mr), their keys and who hears of them stay with
 * each fabric.
 *
 * A fabric's struct kvs_mr opens with hw_net_mr_t (libuv's handle base
 * under every handle type); the table walks the fabric's array by its
 * element size, as hw_in_table checks a handle in it.
 *
 * Not thread-safe: the fabric is driven from one thread.
 * Invariants: live counts the live slots, at most cap; an id is 31 bits,
 * never 0, from one counter per fabric (ofi's grants take theirs from it
 * too), so no two live registrations share one.
 */
#ifndef KVS_HW_MR_TABLE_H
#define KVS_HW_MR_TABLE_H

#include <kvstage/backend.h>

#include "handles.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What every fabric's registration holds; first in its struct kvs_mr. */
typedef struct hw_net_mr {
    uint64_t addr;
    uint64_t len_bytes;
    uint64_t piece_bytes; /* every piece but the last */
    uint32_t npieces;
    uint32_t id;          /* what peers name it by; unique per fabric */
    uint32_t grants;      /* live grants inside it: deregistering is refused */
    bool live;
} hw_net_mr_t;

typedef struct hw_net_mrs {
    kvs_fabric_t *fab;    /* where refusals are recorded */
    const char *name;     /* the fabric's name in messages; lives as long as it */
    void *slots;          /* the fabric's array of cap struct kvs_mr */
    size_t size;          /* sizeof (struct kvs_mr) */
    uint32_t cap;         /* max_mrs */
    uint32_t live;
    uint32_t next_id;
    uint64_t page_bytes;  /* pieces of a split registration are multiples of it */
} hw_net_mrs_t;

/* Sets up the table over slots (cap elements of size bytes, zeroed, owned
 * by the fabric until it is destroyed). */
void hw_net_mrs_init(hw_net_mrs_t *t, kvs_fabric_t *fab, const char *name, void *slots,
                     size_t size, uint32_t cap, uint64_t page_bytes);

/* The shared part of a registration (its struct kvs_mr opens with it). */
static inline hw_net_mr_t *hw_net_mr(kvs_mr_t *mr)
{
    return (hw_net_mr_t *)(void *)mr;
}
static inline hw_net_mr_t *hw_net_mrs_at(const hw_net_mrs_t *t, uint32_t i)
{
    return (hw_net_mr_t *)(void *)((char *)t->slots + (size_t)i * t->size);
}
/* mr when it is a live registration of the table, else NULL. */
static inline kvs_mr_t *hw_net_mrs_of(const hw_net_mrs_t *t, kvs_mr_t *mr)
{
    return hw_in_table(t->slots, mr, t->size, t->cap) && hw_net_mr(mr)->live ? mr : NULL;
}
/* Whether [addr, addr + len_bytes) lies inside m (len_bytes may be 0). */
static inline bool hw_net_mr_holds(const hw_net_mr_t *m, uint64_t addr, uint64_t len_bytes)
{
    return addr >= m->addr && len_bytes <= m->len_bytes &&
           addr - m->addr <= m->len_bytes - len_bytes;
}

/* The next id of a registration or grant: 31 bits, never 0. */
uint32_t hw_net_mrs_next_id(hw_net_mrs_t *t);

/*
 * mr_register's checks: out and out_rkey given (have_out), a non-empty
 * range that does not wrap, a free slot, and the pieces it is cut into: one
 * when it fits in max_mr_bytes, else pieces of max_mr_bytes rounded down to
 * the page (at least a page), at most max_pieces of them. KVS_OK with
 * *slot the free slot's struct kvs_mr and *plan the registration (addr,
 * len_bytes, piece_bytes, npieces; nothing else set). Else KVS_EINVAL or
 * KVS_EFULL recorded on the fabric; too many pieces ends with `advice`.
 */
int hw_net_mr_plan(hw_net_mrs_t *t, bool have_out, uint64_t addr, uint64_t len_bytes,
                   uint64_t max_mr_bytes, uint32_t max_pieces, const char *advice,
                   kvs_mr_t **slot, hw_net_mr_t *plan);

/* m's pieces are registered: it is live, with the next id. */
void hw_net_mr_open(hw_net_mrs_t *t, hw_net_mr_t *m);

/* mr_deregister's checks: KVS_ENOENT when mr is not a live registration of
 * the table, KVS_EBUSY while grants inside it are live (recorded on the
 * fabric); KVS_OK. */
int hw_net_mr_close_check(hw_net_mrs_t *t, kvs_mr_t *mr);

/* m (live) is being released: no longer live. */
void hw_net_mr_close(hw_net_mrs_t *t, hw_net_mr_t *m);

/* write's checks of its descriptor: not NULL, at least one byte, local_mr
 * a live registration of the table holding the source, a remote range that
 * does not wrap. KVS_OK with *mr the registration, else KVS_EINVAL
 * recorded on the fabric. */
int hw_net_write_check(hw_net_mrs_t *t, const kvs_write_desc_t *desc, kvs_mr_t **mr);

#endif
