/*
 * draft.h (internal) - what src/layout.c asks of src/draft.c: checking a
 * draft model's layers (speculative decoding) into a layout.
 */
#ifndef KVS_SRC_DRAFT_H
#define KVS_SRC_DRAFT_H

#include <kvstage/kvstage.h>

/* Checks p's draft fields against the rest of *l (heads, kind, PP, scales
 * and hybrid fields already set, the region of the model's own layers
 * checked to fit) and fills l's draft fields; on error its code with err
 * naming the field to change. */
int kvs__draft_init(kvs_layout_t *l, const kvs_layout_params_t *p, kvs_error_t *err);

#endif
