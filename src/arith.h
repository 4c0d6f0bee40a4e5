/*
 * arith.h (internal) - integer helpers that cannot overflow on the values a
 * caller or a peer may send (token counts up to INT64_MAX).
 */
#ifndef KVS_SRC_ARITH_H
#define KVS_SRC_ARITH_H

#include <stdint.h>

/* ceil(a / b) for a >= 0, b > 0, without computing a + b - 1. */
static inline int64_t kvs__ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

static inline int64_t kvs__min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* gcd of a, b > 0. */
static inline int64_t kvs__gcd_i64(int64_t a, int64_t b)
{
    while (b != 0) {
        const int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* a + b, or UINT64_MAX where that would wrap: a deadline that far away is
 * never reached, instead of wrapping to one that is already past. */
static inline uint64_t kvs__sat_add_u64(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* 2x, but never past cap (nor wrapping). */
static inline uint64_t kvs__double_capped(uint64_t x, uint64_t cap)
{
    return x <= cap / 2 ? 2 * x : cap;
}

#endif
