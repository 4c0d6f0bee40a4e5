/*
 * arith.h (internal) - integer helpers that cannot overflow on the values a
 * caller or a peer may send (token counts up to INT64_MAX).
 */
#ifndef KVS_SRC_ARITH_H
#define KVS_SRC_ARITH_H

#include <stdint.h>

/* ceil(a / b) for a >= 0, b > 0, without computing a + b - 1. */
static inline int64_t kvs__ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

#endif
