/*
 * copy.c - hw_host_copy_run of copy.h: gather and scatter on the CPU, as
 * close to memcpy speed as the access pattern allows.
 *
 * Two paths, chosen per copy. The ratios below are of memcpy's bandwidth on
 * the 2-core development VM (shared and noisy, +-10%); bench_host's figures,
 * with their commands, are in docs/performance.md.
 * - Page runs, when a token's row is its whole pool slot (all local heads
 *   copied): each page is one contiguous run, merged with the next while
 *   page ids follow on. Page ids are random, so each run starts where no
 *   hardware prefetcher looks (plain memcpy per page: ~0.6x). Streaming
 *   copies (below) take several pages at a time (HW_HOST_PAGE_STREAMS, 8),
 *   a line of each in turn, so that many streams are in flight where one
 *   run at a time leaves the memory system idle between runs (the trick of
 *   glibc's large memcpy, which takes 4): on this VM the scatter of 4 KiB
 *   pages went from 12-25 GB/s, swinging with the machine, to 21 GB/s
 *   steadily at 4 pages, and 8 pages gathered another 4-9% faster than 4.
 *   Smaller copies walk the runs with a
 *   cursor HW_HOST_RUN_PREFETCH_LINES cache lines ahead of the copy that
 *   prefetches one line per line copied.
 * - Strided rows (row_bytes of every token_bytes): a prefetch of the rows
 *   HW_HOST_ROW_PREFETCH_BYTES ahead (16 KiB: a fused gather of whole
 *   1024-byte rows, a row at a time, ran 12.8-13.2 GB/s with it, 11.2-12.3
 *   at 4 KiB; single strided rows did not care from 2 to 16 KiB), then the
 *   row. Strided rows a row at a time stay slower than memcpy: hardware stream prefetchers do not follow the pattern and
 *   one core keeps only so many misses in flight (256 bytes of every 1024
 *   at ~0.45x, 512 of 1024 at ~0.7-0.8x; bench_host's read probe shows the
 *   bound: one core reads 256 of every 1024 bytes at ~0.3x of its
 *   contiguous read).
 * - Fused copies (several parts: gather_parts / scatter_parts) take the
 *   token-row path with each token's parts back to back, so parts that
 *   tile the slot make a scatter write, and a gather read, every row once,
 *   whole: the decode side of P8->D2 scatters four one-head blocks as
 *   1024-byte rows instead of four passes of 256 of every 1024 bytes.
 *   Streaming is chosen on the sum of the parts' rows.
 * - Streaming token rows that are whole lines go several full pages at a
 *   time, a line of each page in turn, like the page runs (8 for a gather,
 *   HW_HOST_ROW_SCATTER_STREAMS = 4 for a scatter): at 4 pages the fused
 *   gather of P2->D8 (four one-head parts of 4-head rows) went from
 *   0.83-0.89x of memcpy to 1.01-1.10x, the fused scatters from
 *   0.87-0.96x to 0.95-1.03x (one process, old and new alternated, pinned
 *   to one CPU).
 * - Stores. Copies of at least HW_HOST_STREAM_MIN_BYTES store whole lines
 *   with non-temporal (streaming) stores, as glibc's memcpy does for large
 *   sizes: no read-for-ownership of every written line. The kernel is the
 *   widest the CPU runs (AVX-512, AVX2, else SSE2) within the device's
 *   max_vector_bytes; a line whose destination is not aligned for it, and
 *   the tail of a row, go through memcpy. Strided rows shorter than
 *   HW_HOST_STREAM_MIN_ROW_BYTES keep memcpy with a prefetch for writing:
 *   streaming 256-byte rows into random pages measured slower than that
 *   (~0.7x of it), while 512-byte rows streamed ~1.25x faster.
 * - No division in the inner loops: pages are walked with nested loops.
 */
#include "copy.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
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
#define HW_HOST_ROW_PREFETCH_BYTES 16384u /* token rows: bytes of rows ahead, 0 = none */
#endif
#ifndef HW_HOST_ROW_PREFETCH_HINT
#define HW_HOST_ROW_PREFETCH_HINT 3 /* strided reads: __builtin_prefetch locality */
#endif
#ifndef HW_HOST_RUN_PREFETCH_HINT
#define HW_HOST_RUN_PREFETCH_HINT 3 /* page-run reads: __builtin_prefetch locality */
#endif
#ifndef HW_HOST_STREAM_MIN_ROW_BYTES
#define HW_HOST_STREAM_MIN_ROW_BYTES 512u /* strided rows: shortest row streamed */
#endif
/* Streaming copies move several pages at once, a line of each in turn:
 * HW_HOST_PAGE_STREAMS of them, but HW_HOST_ROW_SCATTER_STREAMS for a
 * scatter of token rows (each page reads a part's row from as many staging
 * places: 8 pages of four parts read 32 at once, which measured 13% slower
 * than 4 pages). At most HW_HOST_MAX_STREAMS. */
#define HW_HOST_MAX_STREAMS 16
#ifndef HW_HOST_PAGE_STREAMS
#define HW_HOST_PAGE_STREAMS 8
#endif
#ifndef HW_HOST_ROW_SCATTER_STREAMS
#define HW_HOST_ROW_SCATTER_STREAMS 4
#endif
_Static_assert(HW_HOST_PAGE_STREAMS >= 1 && HW_HOST_PAGE_STREAMS <= HW_HOST_MAX_STREAMS &&
                   HW_HOST_ROW_SCATTER_STREAMS >= 1 &&
                   HW_HOST_ROW_SCATTER_STREAMS <= HW_HOST_MAX_STREAMS,
               "streams per copy must be 1..HW_HOST_MAX_STREAMS");
#ifndef HW_HOST_STREAM_MIN_BYTES
#define HW_HOST_STREAM_MIN_BYTES (4ull << 20) /* payload from which copies stream */
#endif

/* ------------------------------------------------------------------------ */
/* Streaming stores                                                          */
/* ------------------------------------------------------------------------ */

/* Copies n bytes (a multiple of 64) to dst (aligned to the kernel's vector
 * width) with non-temporal stores. */
typedef void (*hw_host_stream_fn)(uint8_t *dst, const uint8_t *src, uint64_t n);

/* Copies n bytes (a multiple of 64) from each of `count` sources to its
 * destination (each aligned to the kernel's vector width), a line of each in
 * turn: that many streams in flight at once, where one page run at a time
 * leaves the memory system idle between runs. count is HW_HOST_PAGE_STREAMS
 * or HW_HOST_ROW_SCATTER_STREAMS (each compiled with its loops unrolled). */
typedef void (*hw_host_streams_fn)(uint8_t *const *dst, const uint8_t *const *src, uint64_t n,
                                   unsigned count);

typedef struct hw_host_rowpf hw_host_rowpf_t;

/* Moves every part of n token rows of one page, kv the first row's slot
 * and tok its token index in the copy, stepping the prefetch cursor pf
 * once per row (hw_host_copy_rows' inner loops, with a store kernel
 * inlined). */
typedef void (*hw_host_rows_fn)(const hw_host_copy_t *c, uint8_t *kv, uint64_t n, uint64_t tok,
                                uint64_t blk_index, hw_host_rowpf_t *pf);

/* Moves every part of the token rows of the `count` full pages from
 * pages[p] on of one layer buffer, a line of each page in turn
 * (hw_host_copy_rows). */
typedef void (*hw_host_rows_n_fn)(const hw_host_copy_t *c, uint8_t *pool, uint64_t p,
                                  uint64_t blk_index, unsigned count);

/* How a copy moves its bytes: streaming kernels and the dst alignment they
 * need, or none (plain memcpy). */
typedef struct hw_host_mover {
    hw_host_stream_fn stream; /* NULL: memcpy only */
    hw_host_streams_fn streams;
    hw_host_rows_fn rows;
    hw_host_rows_n_fn rows_n;
    uintptr_t align_mask;
} hw_host_mover_t;

#if HW_HOST_HAVE_STREAM
static void hw_host_stream_sse2(uint8_t *dst, const uint8_t *src, uint64_t n)
{
    for (; n > 0; n -= HW_HOST_LINE_BYTES, dst += HW_HOST_LINE_BYTES, src += HW_HOST_LINE_BYTES) {
        const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)src);
        const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 16));
        const __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + 32));
        const __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + 48));
        _mm_stream_si128((__m128i *)(void *)dst, a);
        _mm_stream_si128((__m128i *)(void *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(void *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(void *)(dst + 48), d);
    }
}

static inline __attribute__((always_inline)) void
hw_host_streams_sse2_n(uint8_t *const *dst, const uint8_t *const *src, uint64_t n, int count)
{
    for (uint64_t o = 0; o < n; o += HW_HOST_LINE_BYTES)
        for (int k = 0; k < count; k++)
            for (unsigned v = 0; v < HW_HOST_LINE_BYTES; v += 16)
                _mm_stream_si128((__m128i *)(void *)(dst[k] + o + v),
                                 _mm_loadu_si128((const __m128i *)(const void *)(src[k] + o + v)));
}

__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
hw_host_streams_avx2_n(uint8_t *const *dst, const uint8_t *const *src, uint64_t n, int count)
{
    for (uint64_t o = 0; o < n; o += HW_HOST_LINE_BYTES)
        for (int k = 0; k < count; k++) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(src[k] + o));
            const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src[k] + o + 32));
            _mm256_stream_si256((__m256i *)(void *)(dst[k] + o), a);
            _mm256_stream_si256((__m256i *)(void *)(dst[k] + o + 32), b);
        }
}

/* All loads of a line, then all stores. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
hw_host_streams_avx512_n(uint8_t *const *dst, const uint8_t *const *src, uint64_t n, int count)
{
    for (uint64_t o = 0; o < n; o += HW_HOST_LINE_BYTES) {
        __m512i line[HW_HOST_MAX_STREAMS];
        for (int k = 0; k < count; k++)
            line[k] = _mm512_loadu_si512((const void *)(src[k] + o));
        for (int k = 0; k < count; k++)
            _mm512_stream_si512((void *)(dst[k] + o), line[k]);
    }
}

/* hw_host_streams_fn per kernel: the body with count a constant. */
#define HW_HOST_STREAMS(NAME, ATTR, BODY)                                                    \
    ATTR static void NAME(uint8_t *const *dst, const uint8_t *const *src, uint64_t n,         \
                          unsigned count)                                                    \
    {                                                                                        \
        if (count == HW_HOST_PAGE_STREAMS)                                                   \
            BODY(dst, src, n, HW_HOST_PAGE_STREAMS);                                         \
        else                                                                                 \
            BODY(dst, src, n, HW_HOST_ROW_SCATTER_STREAMS);                                  \
    }
HW_HOST_STREAMS(hw_host_streams_sse2, , hw_host_streams_sse2_n)
HW_HOST_STREAMS(hw_host_streams_avx2, __attribute__((target("avx2"))), hw_host_streams_avx2_n)
HW_HOST_STREAMS(hw_host_streams_avx512, __attribute__((target("avx512f"))),
                hw_host_streams_avx512_n)
#undef HW_HOST_STREAMS

__attribute__((target("avx2"))) static void hw_host_stream_avx2(uint8_t *dst,
                                                                const uint8_t *src, uint64_t n)
{
    for (; n > 0; n -= HW_HOST_LINE_BYTES, dst += HW_HOST_LINE_BYTES, src += HW_HOST_LINE_BYTES) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)src);
        const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src + 32));
        _mm256_stream_si256((__m256i *)(void *)dst, a);
        _mm256_stream_si256((__m256i *)(void *)(dst + 32), b);
    }
}

__attribute__((target("avx512f"))) static void hw_host_stream_avx512(uint8_t *dst,
                                                                    const uint8_t *src,
                                                                    uint64_t n)
{
    for (; n > 0; n -= HW_HOST_LINE_BYTES, dst += HW_HOST_LINE_BYTES, src += HW_HOST_LINE_BYTES)
        _mm512_stream_si512((void *)dst, _mm512_loadu_si512((const void *)src));
}
#endif

/* Copies n bytes: whole lines streamed when the mover streams and dst is
 * aligned for it, the rest with memcpy. */
static inline void hw_host_move(const hw_host_mover_t *m, uint8_t *dst, const uint8_t *src,
                                uint64_t n)
{
    if (m->stream != NULL && ((uintptr_t)dst & m->align_mask) == 0) {
        const uint64_t lines = n & ~(uint64_t)(HW_HOST_LINE_BYTES - 1);
        if (lines > 0)
            m->stream(dst, src, lines);
        dst += lines;
        src += lines;
        n -= lines;
    }
    if (n > 0)
        memcpy(dst, src, (size_t)n);
}

/* ------------------------------------------------------------------------ */
/* Page runs                                                                 */
/* ------------------------------------------------------------------------ */

/* A walk over the page runs of one layer buffer (one part that covers
 * whole token slots). */
typedef struct hw_host_run {
    const hw_host_copy_t *c;
    uint8_t *pool;   /* layer buffer */
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
    r->len = n * c->token_bytes;
}

static void hw_host_run_start(hw_host_run_t *r, const hw_host_copy_t *c, uint8_t *pool)
{
    *r = (hw_host_run_t){.c = c, .pool = pool};
    hw_host_run_load(r);
}

static void hw_host_run_next(hw_host_run_t *r)
{
    const uint64_t ps = r->c->page_size, tokens = r->len / r->c->token_bytes;
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
        __builtin_prefetch(pf->ptr + pf->off, 0, HW_HOST_RUN_PREFETCH_HINT);
    pf->off += HW_HOST_LINE_BYTES;
    if (pf->off >= pf->len)
        hw_host_run_next(pf);
}

/* Bytes moved between prefetch bursts along page runs: 16 lines. */
#define HW_HOST_RUN_BLOCK_BYTES (16u * HW_HOST_LINE_BYTES)

/* Copies n bytes, prefetching one line ahead per line copied, a block of
 * lines at a time. */
static void hw_host_run_move(const hw_host_mover_t *m, uint8_t *dst, const uint8_t *src,
                             uint64_t n, hw_host_run_t *pf, bool for_write)
{
    while (n > 0) {
        const uint64_t k = n < HW_HOST_RUN_BLOCK_BYTES ? n : HW_HOST_RUN_BLOCK_BYTES;
        for (uint64_t o = 0; o < k; o += HW_HOST_LINE_BYTES)
            hw_host_run_prefetch(pf, for_write);
        hw_host_move(m, dst, src, k);
        dst += k;
        src += k;
        n -= k;
    }
}

/* A streaming copy of whole pages, gather or scatter: HW_HOST_PAGE_STREAMS
 * pages at a time, a line of each in turn (hw_host_streams_fn), between
 * their places in the pool and in the staging block; the rest page by
 * page. 8 pages gathered 4-9% faster than 4, and scattered 4-6% faster
 * (bench_host's 1- and 2-head pages, pinned, alternated in one process). */
static void hw_host_copy_pages_n(const hw_host_copy_t *c, const hw_host_mover_t *m,
                                 uint8_t *pool, uint8_t *blk)
{
    enum { N = HW_HOST_PAGE_STREAMS };
    const uint64_t ps = c->page_size, pb = ps * c->token_bytes, full = c->tokens / ps;
    const uint64_t lines = pb & ~(uint64_t)(HW_HOST_LINE_BYTES - 1);
    uint64_t p = 0;
    for (; p + N <= full; p += N) {
        uint8_t *dst[N];
        const uint8_t *src[N];
        uintptr_t misaligned = 0;
        for (int k = 0; k < N; k++) {
            uint8_t *page = pool + (uint64_t)c->pages[p + (uint64_t)k] * pb;
            uint8_t *st = blk + (p + (uint64_t)k) * pb;
            dst[k] = c->scatter ? page : st;
            src[k] = c->scatter ? st : page;
            misaligned |= (uintptr_t)dst[k] & m->align_mask;
        }
        if (misaligned != 0 || lines == 0) {
            for (int k = 0; k < N; k++)
                hw_host_move(m, dst[k], src[k], pb);
            continue;
        }
        m->streams(dst, src, lines, N);
        for (int k = 0; k < N && lines < pb; k++)
            memcpy(dst[k] + lines, src[k] + lines, (size_t)(pb - lines));
    }
    for (; p <= full; p++) {
        const uint64_t n = p < full ? pb : (c->tokens % ps) * c->token_bytes;
        if (n == 0)
            break; /* no partial last page: pages[full] is not there */
        uint8_t *pg = pool + (uint64_t)c->pages[p] * pb;
        if (c->scatter)
            hw_host_move(m, pg, blk + p * pb, n);
        else
            hw_host_move(m, blk + p * pb, pg, n);
    }
}

static void hw_host_copy_runs(const hw_host_copy_t *c, const hw_host_mover_t *m, uint8_t *pool,
                              uint8_t *blk)
{
    if (m->streams != NULL) {
        hw_host_copy_pages_n(c, m, pool, blk);
        return;
    }
    hw_host_run_t run, pf;
    hw_host_run_start(&run, c, pool);
    hw_host_run_start(&pf, c, pool);
    /* Streaming stores into lines prefetched for writing would pay the
     * read-for-ownership they exist to avoid: no prefetch then (the
     * contiguous staging side is what hardware prefetchers follow). */
    if ((c->scatter && m->stream != NULL) || HW_HOST_RUN_PREFETCH_LINES == 0)
        pf.len = 0;
    for (unsigned i = HW_HOST_RUN_PREFETCH_LINES; i > 0 && pf.len > 0; i--)
        hw_host_run_prefetch(&pf, c->scatter);
    uint8_t *st = blk;
    for (; run.len > 0; hw_host_run_next(&run)) {
        if (c->scatter)
            hw_host_run_move(m, run.ptr, st, run.len, &pf, true);
        else
            hw_host_run_move(m, st, run.ptr, run.len, &pf, false);
        st += run.len;
    }
}

/* ------------------------------------------------------------------------ */
/* Token rows                                                                */
/* ------------------------------------------------------------------------ */

/* The prefetch cursor over token rows: page index, token in page, and the
 * bytes [span_off, span_off + span_len) of each token slot. */
struct hw_host_rowpf {
    const hw_host_copy_t *c;
    uint8_t *pool;
    uint64_t span_off, span_len;
    uint64_t page, t, left;
    uint8_t *row;
};

static void hw_host_rowpf_seek(hw_host_rowpf_t *k)
{
    k->row = k->pool + (uint64_t)k->c->pages[k->page] * k->c->page_size * k->c->token_bytes +
             k->span_off;
}

/* Prefetches every line of the cursor's row and moves to the next row. */
static inline void hw_host_rowpf_step(hw_host_rowpf_t *k)
{
    if (k->left == 0)
        return;
    const hw_host_copy_t *c = k->c;
    if (c->scatter) {
        for (uint64_t o = 0; o < k->span_len; o += HW_HOST_LINE_BYTES)
            __builtin_prefetch(k->row + o, 1, 3);
    } else {
        for (uint64_t o = 0; o < k->span_len; o += HW_HOST_LINE_BYTES)
            __builtin_prefetch(k->row + o, 0, HW_HOST_ROW_PREFETCH_HINT);
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

#if HW_HOST_HAVE_STREAM
/* hw_host_rows_fn, compiled once per store kernel so that the kernel is
 * inlined: a fused copy of four one-head parts moves 256 bytes per call of
 * a kernel pointer otherwise, which cost 5-10% of its bandwidth. */
#define HW_HOST_PAGE_ROWS(NAME, ATTR, STREAM, MASK)                                         \
    ATTR static void NAME(const hw_host_copy_t *c, uint8_t *kv, uint64_t n, uint64_t tok,      \
                          uint64_t blk_index, hw_host_rowpf_t *pf)                             \
    {                                                                                         \
        const hw_host_copy_part_t *q = c->parts;                                              \
        for (uint64_t t = 0; t < n; t++, kv += c->token_bytes, tok++) {                       \
            hw_host_rowpf_step(pf);                                                           \
            for (uint64_t k = 0; k < c->nparts; k++) {                                        \
                const uint64_t row = q[k].row_bytes;                                          \
                uint8_t *st = q[k].staging + blk_index * q[k].slot_stride + tok * row;         \
                uint8_t *dst = c->scatter ? kv + q[k].head_off : st;                          \
                const uint8_t *src = c->scatter ? st : kv + q[k].head_off;                    \
                const uint64_t lines =                                                        \
                    ((uintptr_t)dst & (MASK)) == 0 ? row & ~(uint64_t)(HW_HOST_LINE_BYTES - 1) \
                                                   : 0;                                       \
                if (lines > 0)                                                                \
                    STREAM(dst, src, lines);                                                  \
                if (lines < row)                                                              \
                    memcpy(dst + lines, src + lines, (size_t)(row - lines));                  \
            }                                                                                 \
        }                                                                                     \
    }
HW_HOST_PAGE_ROWS(hw_host_page_rows_sse2, , hw_host_stream_sse2, 15u)
HW_HOST_PAGE_ROWS(hw_host_page_rows_avx2, __attribute__((target("avx2"))), hw_host_stream_avx2,
                  31u)
HW_HOST_PAGE_ROWS(hw_host_page_rows_avx512, __attribute__((target("avx512f"))),
                  hw_host_stream_avx512, 63u)
#undef HW_HOST_PAGE_ROWS

/* hw_host_rows_n_fn, once per store kernel with the many-stream kernel
 * inlined: token row r of the `count` pages, part by part,
 * each part's row a line of each page in turn. Page i's tokens go to
 * staging slots tok + i * ps. Every address is aligned for the kernel and
 * every row a whole number of lines (hw_host_rows_n_fits). */
#define HW_HOST_PAGE_ROWS_N(NAME, ATTR, STREAMS)                                              \
    ATTR static inline __attribute__((always_inline)) void NAME##_n(                          \
        const hw_host_copy_t *c, uint8_t *pool, uint64_t p, uint64_t blk_index, int count)    \
    {                                                                                         \
        const uint64_t ps = c->page_size, tb = c->token_bytes, tok = p * ps;                  \
        uint8_t *page[HW_HOST_MAX_STREAMS];                                                   \
        for (int i = 0; i < count; i++)                                                       \
            page[i] = pool + (uint64_t)c->pages[p + (uint64_t)i] * ps * tb;                   \
        for (uint64_t r = 0; r < ps; r++)                                                     \
            for (uint64_t k = 0; k < c->nparts; k++) {                                        \
                const hw_host_copy_part_t *q = &c->parts[k];                                  \
                uint8_t *st = q->staging + blk_index * q->slot_stride + (tok + r) * q->row_bytes; \
                uint8_t *kv[HW_HOST_MAX_STREAMS], *blk[HW_HOST_MAX_STREAMS];                  \
                for (int i = 0; i < count; i++) {                                             \
                    kv[i] = page[i] + r * tb + q->head_off;                                   \
                    blk[i] = st + (uint64_t)i * ps * q->row_bytes;                            \
                }                                                                             \
                if (c->scatter)                                                               \
                    STREAMS(kv, (const uint8_t *const *)blk, q->row_bytes, count);            \
                else                                                                          \
                    STREAMS(blk, (const uint8_t *const *)kv, q->row_bytes, count);            \
            }                                                                                 \
    }                                                                                         \
    ATTR static void NAME(const hw_host_copy_t *c, uint8_t *pool, uint64_t p,                  \
                          uint64_t blk_index, unsigned count)                                 \
    {                                                                                         \
        if (count == HW_HOST_PAGE_STREAMS)                                                    \
            NAME##_n(c, pool, p, blk_index, HW_HOST_PAGE_STREAMS);                            \
        else                                                                                  \
            NAME##_n(c, pool, p, blk_index, HW_HOST_ROW_SCATTER_STREAMS);                     \
    }
HW_HOST_PAGE_ROWS_N(hw_host_page_rows_n_sse2, , hw_host_streams_sse2_n)
HW_HOST_PAGE_ROWS_N(hw_host_page_rows_n_avx2, __attribute__((target("avx2"))),
                    hw_host_streams_avx2_n)
HW_HOST_PAGE_ROWS_N(hw_host_page_rows_n_avx512, __attribute__((target("avx512f"))),
                    hw_host_streams_avx512_n)
#undef HW_HOST_PAGE_ROWS_N
#endif

/* The widest streaming kernel this CPU runs within max_vector_bytes, for
 * copies of at least HW_HOST_STREAM_MIN_BYTES; none below. */
static hw_host_mover_t hw_host_mover_pick(uint64_t payload_bytes, uint32_t max_vector_bytes)
{
    hw_host_mover_t m = {0};
#if HW_HOST_HAVE_STREAM
    if (payload_bytes < HW_HOST_STREAM_MIN_BYTES)
        return m;
    if (max_vector_bytes >= 64 && __builtin_cpu_supports("avx512f"))
        m = (hw_host_mover_t){hw_host_stream_avx512, hw_host_streams_avx512,
                              hw_host_page_rows_avx512, hw_host_page_rows_n_avx512, 63};
    else if (max_vector_bytes >= 32 && __builtin_cpu_supports("avx2"))
        m = (hw_host_mover_t){hw_host_stream_avx2, hw_host_streams_avx2,
                              hw_host_page_rows_avx2, hw_host_page_rows_n_avx2, 31};
    else
        m = (hw_host_mover_t){hw_host_stream_sse2, hw_host_streams_sse2,
                              hw_host_page_rows_sse2, hw_host_page_rows_n_sse2, 15};
#else
    (void)payload_bytes;
    (void)max_vector_bytes;
#endif
    return m;
}

/* Whether the mover's many-page row kernel can take this layer buffer:
 * every part's row whole lines, and every address it stores to aligned for
 * the kernel (the pool side for a scatter, the staging side for a
 * gather). */
static bool hw_host_rows_n_fits(const hw_host_copy_t *c, const hw_host_mover_t *m,
                               const uint8_t *pool, uint64_t blk_index)
{
    if (m->rows_n == NULL)
        return false;
    uintptr_t bits = c->scatter ? (uintptr_t)pool | (uintptr_t)c->token_bytes : 0;
    for (uint64_t k = 0; k < c->nparts; k++) {
        const hw_host_copy_part_t *q = &c->parts[k];
        if (q->row_bytes == 0 || q->row_bytes % HW_HOST_LINE_BYTES != 0)
            return false;
        bits |= (uintptr_t)q->row_bytes;
        if (c->scatter)
            bits |= (uintptr_t)q->head_off;
        else
            bits |= (uintptr_t)(q->staging + blk_index * q->slot_stride);
    }
    return (bits & m->align_mask) == 0;
}

/* Copies token rows: each token, every part's bytes of its slot, in part
 * order. blk_index is the staging slot index (kv * S + slot_begin + j) of
 * this layer buffer in every part's block.
 *
 * Streaming copies whose rows are whole lines take HW_HOST_PAGE_STREAMS
 * full pages at a time (a scatter HW_HOST_ROW_SCATTER_STREAMS), a line of
 * each in turn, as the page runs do: a page at a time, even prefetched
 * 16 KiB ahead, keeps one stream of reads in flight. The pages left (fewer
 * than that, a partial last page) go a row at a time. */
static void hw_host_copy_rows(const hw_host_copy_t *c, const hw_host_mover_t *m,
                              uint8_t *pool, uint64_t blk_index)
{
    const uint64_t ps = c->page_size, tb = c->token_bytes, np = c->nparts;
    const hw_host_copy_part_t *q = c->parts;
    uint64_t done = 0, p = 0;
    if (hw_host_rows_n_fits(c, m, pool, blk_index)) {
        const unsigned n = c->scatter ? HW_HOST_ROW_SCATTER_STREAMS : HW_HOST_PAGE_STREAMS;
        for (; done + n * ps <= c->tokens; p += n, done += n * ps)
            m->rows_n(c, pool, p, blk_index, n);
        if (done == c->tokens)
            return;
    }
    /* The span of a slot the parts touch, prefetched a row at a time. */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint64_t k = 0; k < np; k++) {
        lo = q[k].head_off < lo ? q[k].head_off : lo;
        hi = q[k].head_off + q[k].row_bytes > hi ? q[k].head_off + q[k].row_bytes : hi;
    }
    hw_host_rowpf_t pf = {.c = c, .pool = pool, .span_off = lo, .span_len = hi - lo};
    /* Streamed rows written to the pool need no prefetch (see the page
     * runs); strided reads always want one. */
    if (HW_HOST_ROW_PREFETCH_BYTES > 0 && !(c->scatter && m->stream != NULL)) {
        pf.page = p;
        pf.left = c->tokens - done;
        hw_host_rowpf_seek(&pf);
        /* At least one row ahead, so the prefetch is never the row copied. */
        const uint64_t rows_ahead = HW_HOST_ROW_PREFETCH_BYTES / pf.span_len;
        for (uint64_t i = 0; i < (rows_ahead > 0 ? rows_ahead : 1); i++)
            hw_host_rowpf_step(&pf);
    }
    for (; done < c->tokens; p++) {
        const uint64_t n = c->tokens - done < ps ? c->tokens - done : ps;
        uint8_t *kv = pool + (uint64_t)c->pages[p] * ps * tb;
        if (m->rows != NULL) {
            m->rows(c, kv, n, done, blk_index, &pf);
            done += n;
            continue;
        }
        for (uint64_t t = 0; t < n; t++, kv += tb) {
            hw_host_rowpf_step(&pf);
            for (uint64_t k = 0; k < np; k++) {
                const uint64_t row = q[k].row_bytes;
                uint8_t *st = q[k].staging + blk_index * q[k].slot_stride + (done + t) * row;
                if (c->scatter)
                    hw_host_move(m, kv + q[k].head_off, st, row);
                else
                    hw_host_move(m, st, kv + q[k].head_off, row);
            }
        }
        done += n;
    }
}

/* ------------------------------------------------------------------------ */

uint64_t hw_host_copy_bytes(const hw_host_copy_t *c)
{
    uint64_t n = 0;
    for (uint64_t k = 0; k < c->nparts; k++)
        n += c->parts[k].slot_bytes * c->layer_count * c->planes;
    return n;
}

void hw_host_copy_part(const hw_host_copy_t *c, unsigned part, unsigned parts)
{
    if (c->tokens == 0 || c->layer_count == 0 || c->nparts == 0)
        return;
    uint64_t row_sum = 0;
    for (uint64_t k = 0; k < c->nparts; k++)
        row_sum += c->parts[k].row_bytes;
    /* One part of whole token slots: contiguous page runs. */
    const bool whole = c->nparts == 1 && c->parts[0].row_bytes == c->token_bytes;
    const hw_host_mover_t m = hw_host_mover_pick(hw_host_copy_bytes(c), c->max_vector_bytes);
    const hw_host_mover_t plain = {0};
    const uint64_t n = c->planes * c->layer_count;
    const uint64_t b_end = (part + 1) * n / parts;
    for (uint64_t b = part * n / parts; b < b_end; b++) {
        const uint64_t kv = b / c->layer_count, j = b % c->layer_count;
        const uint64_t blk_index = kv * c->layer_slots + c->slot_begin + j;
        if (whole)
            hw_host_copy_runs(c, &m, c->pool[b],
                              c->parts[0].staging + blk_index * c->parts[0].slot_stride);
        else
            hw_host_copy_rows(c, row_sum >= HW_HOST_STREAM_MIN_ROW_BYTES ? &m : &plain,
                              c->pool[b], blk_index);
    }
#if HW_HOST_HAVE_STREAM
    /* Streaming stores are weakly ordered: drain them before this share is
     * reported done. */
    if (m.stream != NULL)
        _mm_sfence();
#endif
}

void hw_host_copy_run(const hw_host_copy_t *c) { hw_host_copy_part(c, 0, 1); }
