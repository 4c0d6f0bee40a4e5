/*
 * models.h - the built-in model shapes the CLI knows by name (--model): the
 * model's total KV heads, head dim, layers and KV dtype. Only the numbers
 * the staging layout needs; explicit flags override any of them.
 */
#ifndef KVSTAGE_TOOLS_MODELS_H
#define KVSTAGE_TOOLS_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include <kvstage/kvstage.h>

typedef struct cli_model {
    const char *name;     /* lower case, as typed after --model */
    int64_t total_heads;  /* KV heads of the whole model (GQA groups) */
    int64_t head_dim;
    int64_t layers;
    kvs_dtype_t dtype;    /* KV cache dtype as usually served */
    const char *note;     /* one short line for the model list */
} cli_model_t;

/* The model called `name` (ASCII case-insensitive), NULL if unknown. The
 * result points at static storage. */
const cli_model_t *cli_model_find(const char *name);
/* Number of built-in models, and the i-th one (0 <= i < count). */
size_t cli_model_count(void);
const cli_model_t *cli_model_at(size_t i);

#endif
