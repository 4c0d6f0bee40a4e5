/*
 * shape.h - the model-shape flags every subcommand that lays out KV cache
 * shares (`plan`, `sim`): --model, --kv-heads, --head-dim, --dtype,
 * --layers, --page-size, --prefill-tp, --decode-tp, --prefill-pp,
 * --decode-pp, --chunk-tokens, --mla-latent-dim (an MLA model: one latent
 * of that many elements per token and layer, kind KVS_KV_MLA), --prefill-cp
 * (prefill context-parallel ranks, docs/kinds/context-parallel.md), the
 * hybrid layer pattern and a draft model's layers (--draft-layers,
 * --draft-head-dim, --draft-kv-heads: docs/kinds/draft.md). One place parses them into
 * kvs_layout_params_t, applies the subcommand's defaults, and turns a
 * kvs_layout_init failure into one line naming the flag to change.
 *
 * A subcommand puts the shape flags first in its flag table
 * (CLI_SHAPE_FLAG_DEFS) and numbers its own flags from CLI_SF_COUNT, so the
 * first CLI_SF_COUNT scanned values are the shape's. Nothing here exits or
 * allocates; errors are one stderr line (cli_fail) and CLI_EXIT_USAGE.
 */
#ifndef KVSTAGE_TOOLS_SHAPE_H
#define KVSTAGE_TOOLS_SHAPE_H

#include <stdio.h>

#include <kvstage/kvstage.h>

#include "args.h"
#include "models.h"

/* Upper bounds of the shape inputs: the library's (cli_bound_max), far
 * above any real deployment and low enough that the largest staging region
 * stays below 2^62 bytes. int64_t values read at run time, not constants. */
#define CLI_SHAPE_MAX_HEADS cli_bound_max("total_heads")
#define CLI_SHAPE_MAX_HEAD_DIM cli_bound_max("head_dim")
#define CLI_SHAPE_MAX_LAYERS cli_bound_max("layers")
#define CLI_SHAPE_MAX_PAGE_SIZE cli_bound_max("page_size")
#define CLI_SHAPE_MAX_TP cli_bound_max("prefill_tp")
#define CLI_SHAPE_MAX_PP cli_bound_max("prefill_pp")
#define CLI_SHAPE_MAX_CHUNK_TOKENS cli_bound_max("chunk_tokens")
/* Tokens of a prompt (--prompt-tokens, plan's --tokens). */
#define CLI_SHAPE_MAX_TOKENS cli_bound_max("prompt_max_tokens")

enum cli_shape_flag {
    CLI_SF_MODEL,
    CLI_SF_KV_HEADS,
    CLI_SF_HEAD_DIM,
    CLI_SF_DTYPE,
    CLI_SF_LAYERS,
    CLI_SF_PAGE_SIZE,
    CLI_SF_PREFILL_TP,
    CLI_SF_DECODE_TP,
    CLI_SF_PREFILL_PP,
    CLI_SF_DECODE_PP,
    CLI_SF_CHUNK_TOKENS,
    CLI_SF_MLA_LATENT_DIM,
    CLI_SF_DECODE_PAGE_SIZE,
    CLI_SF_PREFILL_CP,
    CLI_SF_KV_SCALES,
    CLI_SF_FULL_ATTN_EVERY,
    CLI_SF_WINDOW,
    CLI_SF_STATE_HEADS,
    CLI_SF_STATE_BYTES,
    CLI_SF_DRAFT_LAYERS,
    CLI_SF_DRAFT_HEAD_DIM,
    CLI_SF_DRAFT_KV_HEADS,
    CLI_SF_COUNT
};

/* Designated initializers for the shape rows of a subcommand's
 * cli_flag_t table (indexed by enum cli_shape_flag). */
#define CLI_SHAPE_FLAG_DEFS                                                    \
    [CLI_SF_MODEL] = {"--model", true},                                        \
    [CLI_SF_KV_HEADS] = {"--kv-heads", true},                                  \
    [CLI_SF_HEAD_DIM] = {"--head-dim", true},                                  \
    [CLI_SF_DTYPE] = {"--dtype", true},                                        \
    [CLI_SF_LAYERS] = {"--layers", true},                                      \
    [CLI_SF_PAGE_SIZE] = {"--page-size", true},                                \
    [CLI_SF_PREFILL_TP] = {"--prefill-tp", true},                              \
    [CLI_SF_DECODE_TP] = {"--decode-tp", true},                                \
    [CLI_SF_PREFILL_PP] = {"--prefill-pp", true},                              \
    [CLI_SF_DECODE_PP] = {"--decode-pp", true},                                \
    [CLI_SF_CHUNK_TOKENS] = {"--chunk-tokens", true},                          \
    [CLI_SF_MLA_LATENT_DIM] = {"--mla-latent-dim", true},                     \
    [CLI_SF_DECODE_PAGE_SIZE] = {"--decode-page-size", true},                \
    [CLI_SF_PREFILL_CP] = {"--prefill-cp", true},                      \
    [CLI_SF_KV_SCALES] = {"--kv-scales", true},                                \
    [CLI_SF_FULL_ATTN_EVERY] = {"--full-attn-every", true},                    \
    [CLI_SF_WINDOW] = {"--window", true},                                      \
    [CLI_SF_STATE_HEADS] = {"--state-heads", true},                            \
    [CLI_SF_STATE_BYTES] = {"--state-bytes", true},                            \
    [CLI_SF_DRAFT_LAYERS] = {"--draft-layers", true},                          \
    [CLI_SF_DRAFT_HEAD_DIM] = {"--draft-head-dim", true},                      \
    [CLI_SF_DRAFT_KV_HEADS] = {"--draft-kv-heads", true}

/* What a subcommand assumes for the shape flags it is not given. */
typedef struct cli_shape_defaults {
    const char *model;  /* built-in model used without --model; NULL: none,
                           so --kv-heads, --head-dim, --layers are required */
    int64_t page_size;  /* --page-size when absent, > 0 */
    int64_t prefill_tp; /* --prefill-tp when absent; 0: the flag is required */
    int64_t decode_tp;  /* --decode-tp when absent; 0: the flag is required */
    int64_t chunk_tokens; /* --chunk-tokens when absent (0 means 8192) */
} cli_shape_defaults_t;

/* A shape read from the command line. */
typedef struct cli_shape {
    /* The built-in model the shape starts from (--model, else the default
     * model), NULL when there is none or when --kv-heads, --head-dim and
     * --layers replace all of a default model. Static storage. */
    const cli_model_t *model;
    kvs_layout_params_t params; /* dtype, PP and chunk size always filled */
} cli_shape_t;

/*
 * Fills *out from values[0..CLI_SF_COUNT) (cli_args_scan's output for a
 * table that starts with CLI_SHAPE_FLAG_DEFS): the model first, then every
 * explicit flag over it, then the defaults. Range errors and missing
 * required flags print one line "kvstage <cmd>: ..." naming the flag and
 * return CLI_EXIT_USAGE; 0 on success. Does not check that the sizes fit
 * together: that is cli_shape_layout's job.
 */
int cli_shape_read(const char *cmd, const char *const *values,
                   const cli_shape_defaults_t *defaults, cli_shape_t *out);

/*
 * Validates the shape through the library's planner (kvs_layout_init) into
 * *lay, after the rule the planner leaves to the manager (spec §8): the
 * chunk size, 8192 when 0, is a multiple of the page size (of both page
 * sizes with --decode-page-size). On failure
 * prints one line naming the flag to change and returns CLI_EXIT_USAGE; 0
 * on success.
 */
int cli_shape_layout(const char *cmd, const cli_shape_t *shape,
                     kvs_layout_t *lay);

/* The flag to change for a kvs_layout_init failure (status) of params p,
 * e.g. "--decode-pp" or "--prefill-tp (or --kv-heads)"; the library's
 * detail says why. Static storage. */
const char *cli_shape_flag_for(int status, const kvs_layout_params_t *p);

/* Writes the built-in model list, one "  name heads hd layers dtype note"
 * line each, for a subcommand's --help. */
void cli_shape_models_usage(FILE *out);

#endif
