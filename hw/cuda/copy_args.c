/*
 * copy_args.c - the launch arguments of a CUDA gather or scatter
 * (copy_args.h), from a validated descriptor and its shape. Pure
 * arithmetic: no CUDA call, no allocation, no state. A copy with scale
 * planes is two launches of the same kernel over the same words buffer:
 * the KV rows, then their scale rows (hw_cuda_copy_scale_args_of).
 */
#include "copy_args.h"

#include <string.h>

/* Words of one launch: 2 * layer_count bases, then the page ids. */
static size_t hw_cuda_launch_words(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh)
{
    return (size_t)(2 * (uint64_t)d->layer_count + sh->pages_used);
}

size_t hw_cuda_copy_words(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh)
{
    return hw_cuda_launch_words(d, sh) * (sh->scale_row_bytes > 0 ? 2u : 1u);
}

/* One launch's words from the bases of its K and V (or scale) buffers. */
static void hw_cuda_launch_words_fill(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                                      const uint64_t *k, const uint64_t *v, uint64_t *words)
{
    const uint64_t L = (uint64_t)d->layer_count;
    for (uint64_t j = 0; j < L; j++) {
        words[j] = k[(uint64_t)d->layer_begin + j];
        words[L + j] = sh->planes != 1 ? v[(uint64_t)d->layer_begin + j] : 0;
    }
    if (sh->pages_used > 0)
        memcpy(words + 2 * L, d->pages, (size_t)sh->pages_used * sizeof(int64_t));
}

void hw_cuda_copy_words_fill(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh,
                             uint64_t *words)
{
    hw_cuda_launch_words_fill(d, sh, d->k_base, d->v_base, words);
    if (sh->scale_row_bytes > 0)
        hw_cuda_launch_words_fill(d, sh, d->ks_base, d->vs_base,
                                  words + hw_cuda_launch_words(d, sh));
}

hw_cuda_copy_args_t hw_cuda_copy_scale_args_of(const kvs_copy_desc_t *d,
                                               const kvs_copy_shape_t *sh,
                                               const uint64_t *words, bool scatter)
{
    hw_cuda_copy_args_t a = hw_cuda_copy_args_of(d, sh, words, scatter);
    a.words = words + hw_cuda_launch_words(d, sh);
    a.staging = d->staging_addr + sh->scale_off;
    a.row_bytes = sh->scale_row_bytes;
    a.token_bytes = sh->scale_token_bytes;
    a.head_off = sh->scale_head_off;
    return a;
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

/* The widest vector (16 .. 1) that divides every value or-ed into bits. */
static unsigned hw_cuda_vec_of(uint64_t bits)
{
    unsigned v = 16;
    while (v > 1 && (bits & (v - 1)) != 0)
        v /= 2;
    return v;
}

unsigned hw_cuda_copy_vec_bytes(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh)
{
    uint64_t bits = sh->row_bytes | sh->token_bytes | sh->head_off | sh->slot_bytes |
                    d->staging_addr;
    for (int64_t j = 0; j < d->layer_count; j++)
        bits |= d->k_base[d->layer_begin + j] |
                (sh->planes != 1 ? d->v_base[d->layer_begin + j] : 0);
    return hw_cuda_vec_of(bits);
}

unsigned hw_cuda_copy_scale_vec_bytes(const kvs_copy_desc_t *d, const kvs_copy_shape_t *sh)
{
    uint64_t bits = sh->scale_row_bytes | sh->scale_token_bytes | sh->scale_head_off |
                    sh->slot_bytes | (d->staging_addr + sh->scale_off);
    for (int64_t j = 0; j < d->layer_count; j++)
        bits |= d->ks_base[d->layer_begin + j] |
                (sh->planes != 1 ? d->vs_base[d->layer_begin + j] : 0);
    return hw_cuda_vec_of(bits);
}
