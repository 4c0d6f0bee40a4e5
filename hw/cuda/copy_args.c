/*
 * copy_args.c - the launch arguments of a CUDA gather or scatter
 * (copy_args.h), from a validated descriptor and its shape. Pure
 * arithmetic: no CUDA call, no allocation, no state.
 */
#include "copy_args.h"

#include <string.h>

size_t hw_cuda_copy_words(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh)
{
    return (size_t)(2 * (uint64_t)d->layer_count + sh->pages_used);
}

void hw_cuda_copy_words_fill(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                             uint64_t *words)
{
    const uint64_t L = (uint64_t)d->layer_count;
    for (uint64_t j = 0; j < L; j++) {
        words[j] = d->k_base[(uint64_t)d->layer_begin + j];
        words[L + j] = sh->planes != 1 ? d->v_base[(uint64_t)d->layer_begin + j] : 0;
    }
    if (sh->pages_used > 0)
        memcpy(words + 2 * L, d->pages, (size_t)sh->pages_used * sizeof(int64_t));
}

hw_cuda_copy_args_t hw_cuda_copy_args_of(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                                         const uint64_t *words, bool scatter)
{
    return (hw_cuda_copy_args_t){
        .words = words,
        .staging = d->staging_addr,
        .layer_count = (uint64_t)d->layer_count,
        .page_size = (uint64_t)d->page_size,
        .tokens = (uint64_t)d->tokens,
        .slot_begin = (uint64_t)d->staging_slot_begin,
        .layer_slots = (uint64_t)d->staging_layer_slots,
        .row_bytes = sh->row_bytes,
        .token_bytes = sh->token_bytes,
        .head_off = sh->head_off,
        .slot_bytes = sh->slot_bytes,
        .scatter = scatter,
        .planes = sh->planes == 1 ? 1u : 2u,
    };
}

unsigned hw_cuda_copy_vec_bytes(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh)
{
    uint64_t bits = sh->row_bytes | sh->token_bytes | sh->head_off | sh->slot_bytes |
                    d->staging_addr;
    for (int64_t j = 0; j < d->layer_count; j++)
        bits |= d->k_base[d->layer_begin + j] |
                (sh->planes != 1 ? d->v_base[d->layer_begin + j] : 0);
    unsigned v = 16;
    while (v > 1 && (bits & (v - 1)) != 0)
        v /= 2;
    return v;
}
