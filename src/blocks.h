/*
 * blocks.h (internal) - a handler's cache of freed memory blocks, so that
 * requests in a steady state allocate nothing: a room's block, its flows,
 * chunks, page lists and aux payload go back here when it ends and come
 * out again for the next room of a size they fit.
 *
 * A block carries its capacity in a small header. get takes the smallest
 * cached block that fits (best fit over at most max blocks) and zeroes the
 * bytes asked for; put keeps a block while fewer than max are cached and
 * else frees it (or the smallest cached one, to keep the larger). So memory
 * held beyond the live rooms is at most max of the largest blocks seen.
 */
#ifndef KVS_SRC_BLOCKS_H
#define KVS_SRC_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvs__blocks {
    void **v;                   /* cached blocks (their payloads) */
    uint32_t count, max;
    uint64_t hits, misses;      /* gets served from the cache, or malloc */
} kvs__blocks_t;

/* An empty cache of at most max blocks (0: none kept). KVS_ENOMEM. */
int kvs__blocks_init(kvs__blocks_t *c, uint32_t max);
/* Frees every cached block. */
void kvs__blocks_fini(kvs__blocks_t *c);
/* A zeroed block of at least bytes (> 0) bytes, aligned for any type;
 * NULL when out of memory. c may be NULL: a plain allocation. */
void *kvs__blocks_get(kvs__blocks_t *c, size_t bytes);
/* A block of at least bytes bytes: p itself when it holds them, else a
 * new one (p's contents are NOT copied; p goes back to the cache). For
 * buffers reused whole (aux payloads). NULL when out of memory (p kept). */
void *kvs__blocks_fit(kvs__blocks_t *c, void *p, size_t bytes);
/* Gives p (from get or fit; NULL is a no-op) back. */
void kvs__blocks_put(kvs__blocks_t *c, void *p);
/* The bytes p can hold. */
size_t kvs__blocks_cap(const void *p);

#endif
