/*
 * rkeys.c - KEYS/DROP messages and the per-connection remote-key tables of
 * the network fabrics (see rkeys.h). Decodes what a peer sent defensively:
 * a malformed message changes nothing.
 */
#include "rkeys.h"

#include "net_util.h"

#include <stdio.h>
#include <stdlib.h>

int hw_rkeys_send(const hw_rkeys_reg_t *r, uint32_t key_bytes, hw_rkeys_key_fn key_of,
                  const void *ctx, hw_rkeys_send_fn send, void *conn)
{
    const uint32_t per_msg = HW_RKEYS_PER_MSG(key_bytes);
    uint8_t msg[KVS_CONTROL_MSG_MAX_BYTES];
    for (uint32_t first = 0; first < r->npieces; first += per_msg) {
        const uint32_t count = r->npieces - first < per_msg ? r->npieces - first : per_msg;
        hw_put32(msg, r->id);
        hw_put32(msg + 4, r->npieces);
        hw_put32(msg + 8, first);
        hw_put32(msg + 12, count);
        hw_put64(msg + 16, r->base);
        hw_put64(msg + 24, r->piece_bytes);
        hw_put64(msg + 32, r->len_bytes);
        uint8_t *k = msg + HW_RKEYS_HDR_BYTES;
        for (uint32_t i = 0; i < count; i++, k += key_bytes) {
            const uint64_t key = key_of(ctx, first + i);
            if (key_bytes == 4)
                hw_put32(k, (uint32_t)key);
            else
                hw_put64(k, key);
        }
        int rc = send(conn, msg, HW_RKEYS_HDR_BYTES + key_bytes * count);
        if (rc != KVS_OK)
            return rc;
    }
    return KVS_OK;
}

static hw_rkeys_entry_t *hw_rkeys_find(const hw_rkeys_t *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (s->e[i].id == id)
            return &s->e[i];
    return NULL;
}

static void hw_rkeys_remove(hw_rkeys_t *s, hw_rkeys_entry_t *t)
{
    free(t->keys);
    *t = s->e[--s->n];
}

int hw_rkeys_recv(hw_rkeys_t *s, uint32_t max, uint32_t key_bytes, uint32_t min_pieces,
                  const uint8_t *msg, uint32_t len, char *why, size_t why_bytes)
{
    if (len < HW_RKEYS_HDR_BYTES) {
        snprintf(why, why_bytes, "a key table message of %u bytes is too short: the peer "
                 "runs an incompatible kvstage", len);
        return KVS_EPROTO;
    }
    const uint32_t id = hw_get32(msg), npieces = hw_get32(msg + 4), first = hw_get32(msg + 8),
                   count = hw_get32(msg + 12);
    const uint64_t base = hw_get64(msg + 16), piece = hw_get64(msg + 24),
                   total = hw_get64(msg + 32);
    if (npieces < min_pieces || npieces == 0 || npieces > HW_RKEYS_PIECES_MAX || piece == 0 ||
        count > HW_RKEYS_PER_MSG(key_bytes) || first > npieces || count > npieces - first ||
        len != HW_RKEYS_HDR_BYTES + key_bytes * count ||
        total <= (uint64_t)(npieces - 1) * piece || total > (uint64_t)npieces * piece) {
        snprintf(why, why_bytes, "malformed key table from the peer: it runs an "
                 "incompatible kvstage");
        return KVS_EPROTO;
    }
    hw_rkeys_entry_t *t = hw_rkeys_find(s, id);
    if (t != NULL && (first == 0 || t->npieces != npieces)) {
        hw_rkeys_remove(s, t); /* sent again: start over */
        t = NULL;
    }
    if (t == NULL) {
        if (s->n >= max) {
            snprintf(why, why_bytes, "the peer has more than %u registrations with key "
                     "tables: raise max_mrs on this side", max);
            return KVS_EFULL;
        }
        if (s->e == NULL && (s->e = calloc(max, sizeof *s->e)) == NULL)
            goto nomem;
        uint64_t *keys = calloc(npieces, sizeof *keys);
        if (keys == NULL)
            goto nomem;
        t = &s->e[s->n++];
        *t = (hw_rkeys_entry_t){.id = id, .npieces = npieces, .base = base,
                                .piece_bytes = piece, .len_bytes = total, .keys = keys};
    }
    const uint8_t *k = msg + HW_RKEYS_HDR_BYTES;
    for (uint32_t i = 0; i < count; i++, k += key_bytes)
        t->keys[first + i] = key_bytes == 4 ? hw_get32(k) : hw_get64(k);
    t->filled += count;
    return KVS_OK;
nomem:
    snprintf(why, why_bytes, "no memory for the peer's key table of %u pieces", npieces);
    return KVS_ENOMEM;
}

void hw_rkeys_drop(hw_rkeys_t *s, const uint8_t *msg, uint32_t len)
{
    hw_rkeys_entry_t *t = len >= 4 ? hw_rkeys_find(s, hw_get32(msg)) : NULL;
    if (t != NULL)
        hw_rkeys_remove(s, t);
}

int hw_rkeys_lookup(const hw_rkeys_t *s, uint32_t id, uint64_t raddr, uint64_t *key,
                    uint64_t *off_in_piece, uint64_t *left, const hw_rkeys_entry_t **found)
{
    const hw_rkeys_entry_t *t = hw_rkeys_find(s, id);
    *found = t;
    if (t == NULL || t->filled < t->npieces)
        return KVS_ENOENT;
    if (raddr < t->base || raddr - t->base >= t->len_bytes)
        return KVS_ERANGE;
    const uint64_t off = raddr - t->base;
    const uint64_t i = off / t->piece_bytes;
    const uint64_t end = i + 1 == t->npieces ? t->len_bytes : (i + 1) * t->piece_bytes;
    *key = t->keys[i];
    *off_in_piece = off - i * t->piece_bytes;
    *left = end - off;
    return KVS_OK;
}

void hw_rkeys_free(hw_rkeys_t *s)
{
    for (uint32_t i = 0; i < s->n; i++)
        free(s->e[i].keys);
    free(s->e);
    *s = (hw_rkeys_t){0};
}
