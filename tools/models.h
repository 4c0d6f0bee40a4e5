/*
 * models.h - the built-in model shapes the CLI knows by name (--model). The
 * table is the library's (kvs_model_find, src/models.c), so the CLI, C
 * callers and the Python binding know the same models; these names keep
 * the CLI's spelling.
 */
#ifndef KVSTAGE_TOOLS_MODELS_H
#define KVSTAGE_TOOLS_MODELS_H

#include <stddef.h>

#include <kvstage/kvstage.h>

typedef kvs_model_t cli_model_t;

/* The model called `name` (ASCII case-insensitive), NULL if unknown. */
static inline const cli_model_t *cli_model_find(const char *name)
{
    return kvs_model_find(name);
}

/* Number of built-in models, and the i-th one (0 <= i < count). */
static inline size_t cli_model_count(void)
{
    return kvs_model_count();
}

static inline const cli_model_t *cli_model_at(size_t i)
{
    return kvs_model_at(i);
}

#endif
