/*
 * copy.c - hw_host_copy_run of copy.h: gather and scatter on the CPU, as
 * close to memcpy speed as the access pattern allows.
 *
 * Why it is shaped this way (measured on the development VM, see
 * docs/performance.md):
 * - The pool side of a copy is a list of segments: whole page runs when a
 *   token's row is its whole pool slot (consecutive page ids merged), else
 *   one row of row_bytes every token_bytes. The staging side is contiguous.
 * - Page ids are random, so each segment starts where no hardware
 *   prefetcher looks: plain memcpy per segment ran at ~0.45x of memcpy's
 *   bandwidth. A cursor walks the same segments HW_HOST_PREFETCH_LINES
 *   cache lines ahead of the copy and prefetches one line (for writing on
 *   the scatter side) per line copied, which keeps enough misses in flight:
 *   ~0.9x for whole page runs.
 * - Strided rows stay slower: the hardware stream prefetchers do not run
 *   ahead of a strided pattern, and one core keeps only so many misses in
 *   flight. A plain read of 256 bytes every 1024 peaks near a quarter of a
 *   contiguous read's bandwidth; the copy gets close to that ceiling.
 * - Copies larger than HW_HOST_STREAM_MIN_BYTES store with non-temporal
 *   (streaming) stores on x86-64, as glibc's memcpy does for large sizes:
 *   the destination is not read back soon, and skipping the read-for-
 *   ownership of every written line saves a third of the memory traffic.
 *   Smaller copies (likely read from cache next) and destinations that are
 *   not 16-byte aligned use plain stores.
 * - No division in the inner loops; 64-byte blocks go through a fixed-size
 *   memcpy (compilers turn it into vector moves) or four 16-byte streaming
 *   stores.
 */
#include "copy.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#define HW_HOST_HAVE_STREAM 1
#else
#define HW_HOST_HAVE_STREAM 0
#endif

/* Payload from which stores bypass the caches (beyond a core's L2 share). */
#define HW_HOST_STREAM_MIN_BYTES (4ull << 20)
#define HW_HOST_LINE_BYTES 64u
/* How far ahead of the copy the prefetch cursor runs, in cache lines. */
#define HW_HOST_PREFETCH_LINES 64u

/* A walk over the pool-side segments of one (layer, K or V) buffer. */
typedef struct hw_host_seg {
    const hw_host_copy_t *c;
    uint8_t *pool;     /* layer buffer, at head_start */
    bool whole;        /* segments are page runs, else rows */
    uint64_t page;     /* index into pages[] of the segment */
    uint64_t t;        /* rows: token within the page */
    uint64_t done;     /* tokens before the segment */
    uint8_t *ptr;      /* start of the segment */
    uint64_t len;      /* bytes, 0 once past the end */
} hw_host_seg_t;

/* Positions s at the segment starting at token s->done (page s->page,
 * token s->t). */
static void hw_host_seg_load(hw_host_seg_t *s)
{
    const hw_host_copy_t *c = s->c;
    if (s->done >= c->tokens) {
        s->len = 0;
        return;
    }
    const uint64_t ps = c->page_size;
    s->ptr = s->pool + ((uint64_t)c->pages[s->page] * ps + s->t) * c->token_bytes;
    if (!s->whole) {
        s->len = c->row_bytes;
        return;
    }
    /* A page run, extended while the next page id follows on and the run
     * so far is made of full pages. */
    uint64_t n = c->tokens - s->done < ps ? c->tokens - s->done : ps;
    uint64_t p = s->page;
    while (n % ps == 0 && s->done + n < c->tokens && c->pages[p + 1] == c->pages[p] + 1) {
        p++;
        const uint64_t rest = c->tokens - s->done - n;
        n += rest < ps ? rest : ps;
    }
    s->len = n * c->row_bytes;
}

static void hw_host_seg_start(hw_host_seg_t *s, const hw_host_copy_t *c, uint8_t *pool)
{
    *s = (hw_host_seg_t){.c = c, .pool = pool, .whole = c->row_bytes == c->token_bytes};
    hw_host_seg_load(s);
}

/* Moves to the next segment; returns the tokens the finished one held. */
static uint64_t hw_host_seg_next(hw_host_seg_t *s)
{
    const uint64_t ps = s->c->page_size;
    uint64_t tokens;
    if (s->whole) {
        tokens = s->len / s->c->row_bytes;
        s->page += (tokens + ps - 1) / ps;
        s->t = 0;
    } else {
        tokens = 1;
        if (++s->t == ps) {
            s->t = 0;
            s->page++;
        }
    }
    s->done += tokens;
    hw_host_seg_load(s);
    return tokens;
}

/* The prefetch cursor: a segment walk plus the offset of the next line. */
typedef struct hw_host_pf {
    hw_host_seg_t seg;
    uint64_t off;
} hw_host_pf_t;

static inline void hw_host_pf_line(hw_host_pf_t *pf, bool for_write)
{
    if (pf->seg.len == 0)
        return;
    if (for_write)
        __builtin_prefetch(pf->seg.ptr + pf->off, 1, 3);
    else
        __builtin_prefetch(pf->seg.ptr + pf->off, 0, 3);
    pf->off += HW_HOST_LINE_BYTES;
    if (pf->off >= pf->seg.len) {
        pf->off = 0;
        (void)hw_host_seg_next(&pf->seg);
    }
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
static inline void hw_host_move(uint8_t *dst, const uint8_t *src, uint64_t n,
                                hw_host_pf_t *pf, bool for_write, bool stream)
{
    if (stream && ((uintptr_t)dst & 15u) == 0) {
        while (n >= HW_HOST_LINE_BYTES) {
            hw_host_pf_line(pf, for_write);
            hw_host_stream_line(dst, src);
            dst += HW_HOST_LINE_BYTES;
            src += HW_HOST_LINE_BYTES;
            n -= HW_HOST_LINE_BYTES;
        }
    }
    while (n >= HW_HOST_LINE_BYTES) {
        hw_host_pf_line(pf, for_write);
        memcpy(dst, src, HW_HOST_LINE_BYTES);
        dst += HW_HOST_LINE_BYTES;
        src += HW_HOST_LINE_BYTES;
        n -= HW_HOST_LINE_BYTES;
    }
    if (n > 0) {
        hw_host_pf_line(pf, for_write);
        memcpy(dst, src, (size_t)n);
    }
}

/* One layer buffer <-> one contiguous staging slot. */
static void hw_host_copy_buffer(const hw_host_copy_t *c, uint8_t *pool, uint8_t *blk,
                                bool stream)
{
    hw_host_seg_t seg;
    hw_host_pf_t pf;
    hw_host_seg_start(&seg, c, pool);
    hw_host_seg_start(&pf.seg, c, pool);
    pf.off = 0;
    for (unsigned i = 0; i < HW_HOST_PREFETCH_LINES; i++)
        hw_host_pf_line(&pf, c->scatter);
    uint8_t *st = blk;
    while (seg.len > 0) {
        if (c->scatter)
            hw_host_move(seg.ptr, st, seg.len, &pf, true, stream);
        else
            hw_host_move(st, seg.ptr, seg.len, &pf, false, stream);
        st += seg.len;
        (void)hw_host_seg_next(&seg);
    }
}

void hw_host_copy_run(const hw_host_copy_t *c)
{
    if (c->tokens == 0 || c->layer_count == 0)
        return;
    const bool stream = HW_HOST_HAVE_STREAM &&
                        c->slot_bytes * c->layer_count * 2 >= HW_HOST_STREAM_MIN_BYTES;
    for (uint64_t kv = 0; kv < 2; kv++) {
        for (uint64_t j = 0; j < c->layer_count; j++) {
            uint8_t *pool = c->pool[kv * c->layer_count + j];
            uint8_t *blk = c->staging +
                           (kv * c->layer_slots + c->slot_begin + j) * c->slot_bytes;
            hw_host_copy_buffer(c, pool, blk, stream);
        }
    }
#if HW_HOST_HAVE_STREAM
    /* Streaming stores are weakly ordered: drain them before the op is
     * reported done. */
    if (stream)
        _mm_sfence();
#endif
}
