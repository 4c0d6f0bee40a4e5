/*
 * blocks.c - the handler's block cache of blocks.h.
 */
#include "blocks.h"

#include <kvstage/kvstage.h>

#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

/* The header before each block's payload: its capacity, padded so the
 * payload keeps malloc's alignment. */
typedef union kvs__block_hdr {
    size_t cap;
    max_align_t align;
} kvs__block_hdr_t;

static kvs__block_hdr_t *kvs__hdr(const void *p) { return (kvs__block_hdr_t *)p - 1; }

size_t kvs__blocks_cap(const void *p) { return kvs__hdr(p)->cap; }

int kvs__blocks_init(kvs__blocks_t *c, uint32_t max)
{
    memset(c, 0, sizeof *c);
    if (max > 0 && (c->v = calloc(max, sizeof *c->v)) == NULL)
        return KVS_ENOMEM;
    c->max = max;
    return KVS_OK;
}

void kvs__blocks_fini(kvs__blocks_t *c)
{
    for (uint32_t i = 0; i < c->count; i++)
        free(kvs__hdr(c->v[i]));
    free(c->v);
    memset(c, 0, sizeof *c);
}

/* An uncleared block of at least bytes: the smallest cached that fits. */
static void *kvs__blocks_take(kvs__blocks_t *c, size_t bytes)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; c != NULL && i < c->count; i++)
        if (kvs__blocks_cap(c->v[i]) >= bytes &&
            (best == UINT32_MAX || kvs__blocks_cap(c->v[i]) < kvs__blocks_cap(c->v[best])))
            best = i;
    if (best != UINT32_MAX) {
        void *p = c->v[best];
        c->v[best] = c->v[--c->count];
        c->hits++;
        return p;
    }
    if (bytes > SIZE_MAX - sizeof(kvs__block_hdr_t))
        return NULL;
    kvs__block_hdr_t *h = malloc(sizeof *h + bytes);
    if (h == NULL)
        return NULL;
    h->cap = bytes;
    if (c != NULL)
        c->misses++;
    return h + 1;
}

void *kvs__blocks_get(kvs__blocks_t *c, size_t bytes)
{
    void *p = kvs__blocks_take(c, bytes > 0 ? bytes : 1);
    if (p != NULL)
        memset(p, 0, bytes);
    return p;
}

void *kvs__blocks_fit(kvs__blocks_t *c, void *p, size_t bytes)
{
    if (p != NULL && kvs__blocks_cap(p) >= bytes)
        return p;
    void *q = kvs__blocks_take(c, bytes > 0 ? bytes : 1);
    if (q != NULL)
        kvs__blocks_put(c, p);
    return q;
}

void kvs__blocks_put(kvs__blocks_t *c, void *p)
{
    if (p == NULL)
        return;
    if (c == NULL || c->max == 0) {
        free(kvs__hdr(p));
        return;
    }
    if (c->count < c->max) {
        c->v[c->count++] = p;
        return;
    }
    /* Full: keep the larger of p and the smallest cached block. */
    uint32_t small = 0;
    for (uint32_t i = 1; i < c->count; i++)
        if (kvs__blocks_cap(c->v[i]) < kvs__blocks_cap(c->v[small]))
            small = i;
    if (kvs__blocks_cap(c->v[small]) < kvs__blocks_cap(p)) {
        free(kvs__hdr(c->v[small]));
        c->v[small] = p;
    } else {
        free(kvs__hdr(p));
    }
}
