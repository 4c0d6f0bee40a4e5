/*
 * mr_table.c - the network fabrics' registration table (see mr_table.h):
 * slots, ids, pieces and the checks of mr_register, mr_deregister and
 * write. Records refusals on the fabric; registers nothing itself.
 */
#include "mr_table.h"

#include <assert.h>

void hw_net_mrs_init(hw_net_mrs_t *t, kvs_fabric_t *fab, const char *name, void *slots,
                     size_t size, uint32_t cap, uint64_t page_bytes)
{
    assert(size >= sizeof(hw_net_mr_t) && page_bytes > 0);
    *t = (hw_net_mrs_t){.fab = fab, .name = name, .slots = slots, .size = size, .cap = cap,
                        .next_id = 1, .page_bytes = page_bytes};
}

uint32_t hw_net_mrs_next_id(hw_net_mrs_t *t)
{
    uint32_t id = t->next_id++ & 0x7fffffffu;
    if (id == 0)
        id = t->next_id++;
    return id;
}

int hw_net_mr_plan(hw_net_mrs_t *t, bool have_out, uint64_t addr, uint64_t len_bytes,
                   uint64_t max_mr_bytes, uint32_t max_pieces, const char *advice,
                   kvs_mr_t **slot, hw_net_mr_t *plan)
{
    if (!have_out || len_bytes == 0 || addr == 0 || addr + len_bytes < addr)
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "mr_register on %s: %s", t->name,
                               !have_out        ? "out and out_rkey must not be NULL"
                               : len_bytes == 0 ? "len_bytes is 0: register a non-empty range"
                                                : "the address range is NULL or wraps");
    *slot = NULL;
    for (uint32_t i = 0; i < t->cap && *slot == NULL; i++)
        if (!hw_net_mrs_at(t, i)->live)
            *slot = (kvs_mr_t *)(void *)hw_net_mrs_at(t, i);
    if (*slot == NULL)
        return kvs_fabric_fail(t->fab, KVS_EFULL, 0, "mr_register on %s: all %u registrations "
                               "are in use: deregister some or raise max_mrs", t->name, t->cap);
    uint64_t piece = len_bytes;
    if (piece > max_mr_bytes) {
        piece = max_mr_bytes / t->page_bytes * t->page_bytes;
        if (piece == 0)
            piece = t->page_bytes;
    }
    const uint64_t npieces = len_bytes / piece + (len_bytes % piece != 0);
    if (npieces > max_pieces)
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "mr_register on %s: %llu bytes need "
                               "%llu pieces of at most %llu bytes (max_mr_bytes), more than "
                               "%u: %s", t->name, (unsigned long long)len_bytes,
                               (unsigned long long)npieces, (unsigned long long)piece,
                               max_pieces, advice);
    *plan = (hw_net_mr_t){.addr = addr, .len_bytes = len_bytes, .piece_bytes = piece,
                          .npieces = (uint32_t)npieces};
    return KVS_OK;
}

void hw_net_mr_open(hw_net_mrs_t *t, hw_net_mr_t *m)
{
    assert(!m->live && t->live < t->cap);
    m->id = hw_net_mrs_next_id(t);
    m->live = true;
    t->live++;
}

int hw_net_mr_close_check(hw_net_mrs_t *t, kvs_mr_t *mr)
{
    if (hw_net_mrs_of(t, mr) == NULL)
        return kvs_fabric_fail(t->fab, KVS_ENOENT, 0, "mr_deregister on %s: not a live "
                               "registration of this fabric", t->name);
    if (hw_net_mr(mr)->grants > 0)
        return kvs_fabric_fail(t->fab, KVS_EBUSY, 0, "mr_deregister on %s: %u grants "
                               "(key_grant) inside this registration are live: revoke them "
                               "first", t->name, hw_net_mr(mr)->grants);
    return KVS_OK;
}

void hw_net_mr_close(hw_net_mrs_t *t, hw_net_mr_t *m)
{
    assert(m->live && t->live > 0);
    m->live = false;
    t->live--;
}

int hw_net_write_check(hw_net_mrs_t *t, const kvs_write_desc_t *desc, kvs_mr_t **mr)
{
    if (desc == NULL || desc->len_bytes == 0)
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "write on %s: %s", t->name,
                               desc == NULL ? "desc is NULL"
                                            : "len_bytes is 0: write at least one byte");
    *mr = hw_net_mrs_of(t, desc->local_mr);
    if (*mr == NULL)
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "write on %s: local_mr is not a live "
                               "registration of this fabric", t->name);
    const hw_net_mr_t *m = hw_net_mr(*mr);
    if (!hw_net_mr_holds(m, desc->local_addr, desc->len_bytes))
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "write on %s: source [0x%llx, +%llu) is "
                               "outside local_mr [0x%llx, +%llu)", t->name,
                               (unsigned long long)desc->local_addr,
                               (unsigned long long)desc->len_bytes,
                               (unsigned long long)m->addr, (unsigned long long)m->len_bytes);
    if (desc->remote_addr + desc->len_bytes < desc->remote_addr)
        return kvs_fabric_fail(t->fab, KVS_EINVAL, 0, "write on %s: the remote range wraps",
                               t->name);
    return KVS_OK;
}
