/*
 * copy.c - hw_host_copy_run of copy.h: gather and scatter on the CPU, as
 * close to memcpy speed as the access pattern allows.
 *
 * Two paths, chosen per copy. The ratios below were measured on the 2-core
 * development VM with a throwaway A/B harness on CPU time (noisy, +-10%);
 * bench_host's figures are in docs/performance.md.
 * - Page runs, when a token's row is its whole pool slot (all local heads
 *   copied): each page is one contiguous run, merged with the next while
 *   page ids follow on. Page ids are random, so each run starts where no
 *   hardware prefetcher looks (plain memcpy per page: ~0.6x of memcpy's
 *   bandwidth). A cursor walks the same runs HW_HOST_RUN_PREFETCH_LINES
 *   cache lines ahead of the copy and prefetches one line per line copied;
 *   large copies store with non-temporal (streaming) stores, as glibc's
 *   memcpy does for large sizes, skipping the read-for-ownership of every
 *   written line: ~0.7-0.85x.
 * - Strided rows (row_bytes of every token_bytes): one memcpy per row,
 *   letting libc pick its widest vector moves (a hand-written 64-byte loop
 *   ran at ~0.6x of per-row memcpy: fewer instructions per line keep more
 *   misses inside the out-of-order window), and a prefetch of the rows
 *   HW_HOST_ROW_PREFETCH_BYTES ahead. Strided rows stay slower than memcpy:
 *   hardware stream prefetchers do not follow the pattern and one core
 *   keeps only so many misses in flight (256 bytes of every 1024 copy at
 *   ~0.45x of memcpy, 512 of 1024 at ~0.7x; bench_host's read probe shows
 *   the bound).
 * - No division in the inner loops: pages are walked with nested loops.
 */
#include "copy.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#define HW_HOST_HAVE_STREAM 1
#else
#define HW_HOST_HAVE_STREAM 0
#endif

#define HW_HOST_LINE_BYTES 64u
/* Tunables, overridable at build time for experiments. */
#ifndef HW_HOST_RUN_PREFETCH_LINES
#define HW_HOST_RUN_PREFETCH_LINES 128u /* page runs: lines ahead, 0 = none */
#endif
#ifndef HW_HOST_ROW_PREFETCH_BYTES
#define HW_HOST_ROW_PREFETCH_BYTES 4096u /* strided rows: bytes of rows ahead, 0 = none */
#endif
#ifndef HW_HOST_STREAM_MIN_BYTES
#define HW_HOST_STREAM_MIN_BYTES (4ull << 20) /* payload from which runs stream */
#endif

/* ------------------------------------------------------------------------ */
/* Page runs                                                                 */
/* ------------------------------------------------------------------------ */

/* A walk over the page runs of one layer buffer. */
typedef struct hw_host_run {
    const hw_host_copy_t *c;
    uint8_t *pool;   /* layer buffer, at head_start */
    uint64_t page;   /* index into pages[] of the run's first page */
    uint64_t done;   /* tokens before the run */
    uint8_t *ptr;    /* start of the run */
    uint64_t len;    /* bytes, 0 once past the end */
    uint64_t off;    /* prefetch cursor only: next line within the run */
} hw_host_run_t;

/* Loads the run starting at token r->done, page index r->page. */
static void hw_host_run_load(hw_host_run_t *r)
{
    const hw_host_copy_t *c = r->c;
    if (r->done >= c->tokens) {
        r->len = 0;
        return;
    }
    const uint64_t ps = c->page_size;
    r->ptr = r->pool + (uint64_t)c->pages[r->page] * ps * c->token_bytes;
    /* Extend while the run is made of full pages and the next id follows. */
    uint64_t n = c->tokens - r->done < ps ? c->tokens - r->done : ps;
    uint64_t p = r->page;
    while (n % ps == 0 && r->done + n < c->tokens && c->pages[p + 1] == c->pages[p] + 1) {
        p++;
        const uint64_t rest = c->tokens - r->done - n;
        n += rest < ps ? rest : ps;
    }
    r->len = n * c->row_bytes;
}

static void hw_host_run_start(hw_host_run_t *r, const hw_host_copy_t *c, uint8_t *pool)
{
    *r = (hw_host_run_t){.c = c, .pool = pool};
    hw_host_run_load(r);
}

static void hw_host_run_next(hw_host_run_t *r)
{
    const uint64_t ps = r->c->page_size, tokens = r->len / r->c->row_bytes;
    r->page += (tokens + ps - 1) / ps;
    r->done += tokens;
    r->off = 0;
    hw_host_run_load(r);
}

/* Prefetches the cursor's next line and advances it. */
static inline void hw_host_run_prefetch(hw_host_run_t *pf, bool for_write)
{
    if (pf->len == 0)
        return;
    if (for_write)
        __builtin_prefetch(pf->ptr + pf->off, 1, 3);
    else
        __builtin_prefetch(pf->ptr + pf->off, 0, 3);
    pf->off += HW_HOST_LINE_BYTES;
    if (pf->off >= pf->len)
        hw_host_run_next(pf);
}

/* Copies one 64-byte line with streaming stores; dst 16-byte aligned. */
static inline void hw_host_stream_line(uint8_t *dst, const uint8_t *src)
{
#if HW_HOST_HAVE_STREAM
    const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)src);
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 16));
    const __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + 32));
    const __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + 48));
    _mm_stream_si128((__m128i *)(void *)dst, a);
    _mm_stream_si128((__m128i *)(void *)(dst + 16), b);
    _mm_stream_si128((__m128i *)(void *)(dst + 32), c);
    _mm_stream_si128((__m128i *)(void *)(dst + 48), d);
#else
    memcpy(dst, src, HW_HOST_LINE_BYTES);
#endif
}

/* Copies n bytes, prefetching one line ahead per line copied. */
static void hw_host_run_move(uint8_t *dst, const uint8_t *src, uint64_t n,
                             hw_host_run_t *pf, bool for_write, bool stream)
{
    if (stream && ((uintptr_t)dst & 15u) == 0) {
        for (; n >= HW_HOST_LINE_BYTES; n -= HW_HOST_LINE_BYTES) {
            hw_host_run_prefetch(pf, for_write);
            hw_host_stream_line(dst, src);
            dst += HW_HOST_LINE_BYTES;
            src += HW_HOST_LINE_BYTES;
        }
    } else {
        for (uint64_t k = 0; k < n; k += HW_HOST_LINE_BYTES)
            hw_host_run_prefetch(pf, for_write);
        memcpy(dst, src, (size_t)n);
        return;
    }
    if (n > 0)
        memcpy(dst, src, (size_t)n);
}

static void hw_host_copy_runs(const hw_host_copy_t *c, uint8_t *pool, uint8_t *blk,
                              bool stream)
{
    hw_host_run_t run, pf;
    hw_host_run_start(&run, c, pool);
    hw_host_run_start(&pf, c, pool);
    /* Streaming stores into lines prefetched for writing would pay the
     * read-for-ownership they exist to avoid: no prefetch then (the
     * contiguous staging side is what hardware prefetchers follow). */
    if ((c->scatter && stream) || HW_HOST_RUN_PREFETCH_LINES == 0)
        pf.len = 0;
    for (unsigned i = 0; i < HW_HOST_RUN_PREFETCH_LINES; i++)
        hw_host_run_prefetch(&pf, c->scatter);
    uint8_t *st = blk;
    for (; run.len > 0; hw_host_run_next(&run)) {
        if (c->scatter)
            hw_host_run_move(run.ptr, st, run.len, &pf, true, stream);
        else
            hw_host_run_move(st, run.ptr, run.len, &pf, false, stream);
        st += run.len;
    }
}

/* ------------------------------------------------------------------------ */
/* Strided rows                                                              */
/* ------------------------------------------------------------------------ */

/* The prefetch cursor over rows: page index, token in page, row pointer. */
typedef struct hw_host_rowpf {
    const hw_host_copy_t *c;
    uint8_t *pool;
    uint64_t page, t, left;
    uint8_t *row;
} hw_host_rowpf_t;

static void hw_host_rowpf_seek(hw_host_rowpf_t *k)
{
    k->row = k->pool + (uint64_t)k->c->pages[k->page] * k->c->page_size * k->c->token_bytes;
}

/* Prefetches every line of the cursor's row and moves to the next row. */
static inline void hw_host_rowpf_step(hw_host_rowpf_t *k)
{
    if (k->left == 0)
        return;
    const hw_host_copy_t *c = k->c;
    if (c->scatter) {
        for (uint64_t o = 0; o < c->row_bytes; o += HW_HOST_LINE_BYTES)
            __builtin_prefetch(k->row + o, 1, 3);
    } else {
        for (uint64_t o = 0; o < c->row_bytes; o += HW_HOST_LINE_BYTES)
            __builtin_prefetch(k->row + o, 0, 3);
    }
    if (--k->left == 0)
        return;
    if (++k->t == c->page_size) {
        k->t = 0;
        k->page++;
        hw_host_rowpf_seek(k);
    } else {
        k->row += c->token_bytes;
    }
}

static void hw_host_copy_rows(const hw_host_copy_t *c, uint8_t *pool, uint8_t *blk)
{
    const uint64_t ps = c->page_size, row = c->row_bytes, tb = c->token_bytes;
    hw_host_rowpf_t pf = {.c = c, .pool = pool};
    if (HW_HOST_ROW_PREFETCH_BYTES > 0) {
        pf.left = c->tokens;
        hw_host_rowpf_seek(&pf);
        /* At least one row ahead, so the prefetch is never the row copied. */
        const uint64_t ahead = HW_HOST_ROW_PREFETCH_BYTES > row ? HW_HOST_ROW_PREFETCH_BYTES / row : 1;
        for (uint64_t i = 0; i < ahead; i++)
            hw_host_rowpf_step(&pf);
    }
    uint64_t done = 0;
    for (uint64_t p = 0; done < c->tokens; p++) {
        const uint64_t n = c->tokens - done < ps ? c->tokens - done : ps;
        uint8_t *kv = pool + (uint64_t)c->pages[p] * ps * tb;
        uint8_t *st = blk + done * row;
        for (uint64_t t = 0; t < n; t++, kv += tb, st += row) {
            hw_host_rowpf_step(&pf);
            if (c->scatter)
                memcpy(kv, st, (size_t)row);
            else
                memcpy(st, kv, (size_t)row);
        }
        done += n;
    }
}

/* ------------------------------------------------------------------------ */

void hw_host_copy_part(const hw_host_copy_t *c, unsigned part, unsigned parts)
{
    if (c->tokens == 0 || c->layer_count == 0)
        return;
    const bool whole = c->row_bytes == c->token_bytes;
    const bool stream = HW_HOST_HAVE_STREAM && whole &&
                        c->slot_bytes * c->layer_count * 2 >= HW_HOST_STREAM_MIN_BYTES;
    const uint64_t n = 2 * c->layer_count;
    const uint64_t b_end = (part + 1) * n / parts;
    for (uint64_t b = part * n / parts; b < b_end; b++) {
        const uint64_t kv = b / c->layer_count, j = b % c->layer_count;
        uint8_t *pool = c->pool[b];
        uint8_t *blk = c->staging + (kv * c->layer_slots + c->slot_begin + j) * c->slot_bytes;
        if (whole)
            hw_host_copy_runs(c, pool, blk, stream);
        else
            hw_host_copy_rows(c, pool, blk);
    }
#if HW_HOST_HAVE_STREAM
    /* Streaming stores are weakly ordered: drain them before this share is
     * reported done. */
    if (stream)
        _mm_sfence();
#endif
}

void hw_host_copy_run(const hw_host_copy_t *c) { hw_host_copy_part(c, 0, 1); }
