/*
 * fuzz_support.h - what the libFuzzer targets share: CHECK (abort with the
 * violated property, so libFuzzer saves the input) and a little-endian
 * reader over the input that yields zeros once the bytes run out.
 */
#ifndef KVS_FUZZ_SUPPORT_H
#define KVS_FUZZ_SUPPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, __LINE__,  \
                    #cond);                                                      \
            abort();                                                             \
        }                                                                        \
    } while (0)

typedef struct input {
    const uint8_t *p;
    size_t left;
} input_t;

static inline uint8_t in_u8(input_t *in)
{
    if (in->left == 0)
        return 0;
    in->left--;
    return *in->p++;
}

static inline uint16_t in_u16(input_t *in)
{
    uint16_t lo = in_u8(in);
    return (uint16_t)(lo | (uint16_t)in_u8(in) << 8);
}

static inline uint64_t in_u64(input_t *in)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < 8u; i++)
        v |= (uint64_t)in_u8(in) << (8u * i);
    return v;
}

#endif
