/*
 * plan.c - `kvstage plan`: validates a model shape and the prefill/decode
 * parallelism through the library's layout planner (kvs_layout_init), then
 * prints each pipeline stage's layers (spec §4: stages need not split
 * evenly) and, for one chunk of T tokens, each decode rank's staging region:
 * which prefill ranks write into it, which head slices, at which byte offset
 * and how many bytes (spec §3-§5), for the decode stage holding the most
 * layers (the largest regions). It ends with the ring-sizing answer: how
 * many full G-token chunk regions fit in the decode staging ring, and which
 * knob to turn when too few do.
 *
 * All layout arithmetic comes from the library; this file only parses,
 * validates the command line and formats. Bad input is reported on exactly
 * one stderr line naming the flag to change, with exit status 2. Input
 * bounds keep every byte count at or below 2^62, so nothing here overflows.
 */
#include "plan.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvstage/kvstage.h>

#include "args.h"
#include "models.h"
#include "shape.h"

#define CLI_PLAN_CMD "plan"

/* The shape bounds (shape.h) keep the largest region below 2^62 bytes;
 * this one keeps the ring there too. */
#define CLI_PLAN_MAX_RING_MIB (INT64_C(1) << 42)

#define CLI_MIB (INT64_C(1) << 20)
#define CLI_PLAN_DEFAULT_PAGE_SIZE 1
#define CLI_PLAN_DEFAULT_RING_MIB ((int64_t)(KVS_DEFAULT_RING_BYTES >> 20))
/* Chunks of a request whose CP writers are listed (--prefill-cp). */
#define CLI_PLAN_MAX_CP_CHUNKS 64
/* Chunks in flight the ring advice aims at when only one fits. */
#define CLI_PLAN_SUGGESTED_CHUNKS 4

/* The shape flags (shape.h) come first, then plan's own. */
enum cli_plan_flag {
    CLI_PF_TOKENS = CLI_SF_COUNT,
    CLI_PF_REQUEST_TOKENS,
    CLI_PF_RING_MIB,
    CLI_PF_JSON,
    CLI_PF_HELP,
    CLI_PF_COUNT
};

static const cli_flag_t cli_plan_flags[CLI_PF_COUNT] = {
    CLI_SHAPE_FLAG_DEFS,
    [CLI_PF_TOKENS] = {"--tokens", true},
    [CLI_PF_REQUEST_TOKENS] = {"--request-tokens", true},
    [CLI_PF_RING_MIB] = {"--ring-mib", true},
    [CLI_PF_JSON] = {"--json", false},
    [CLI_PF_HELP] = {"--help", false},
};

/* What the command line asks for, after defaults and the model. */
typedef struct cli_plan_input {
    cli_shape_t shape;        /* shape.model is NULL without --model */
    int64_t tokens;           /* 0: a full chunk (G tokens) */
    int64_t request_tokens;   /* with --prefill-cp: the request whose chunks
                                 the CP writers are listed for; 0: CP x G +
                                 G / 2 */
    int64_t ring_mib;
    bool json;
} cli_plan_input_t;

/* The ring-sizing answer for a full G-token chunk (staging path only). */
typedef struct cli_plan_ring {
    int64_t ring_bytes;
    int64_t max_region_bytes;
    int64_t chunks_in_ring;      /* full chunk regions that fit */
    int64_t min_ring_mib;        /* smallest --ring-mib holding one chunk */
    int64_t suggested_ring_mib;  /* --ring-mib holding SUGGESTED_CHUNKS */
    int64_t max_chunk_tokens;    /* largest --chunk-tokens (multiple of the
                                    page size) whose region fits the ring;
                                    0 when not even one page fits */
    int64_t page_region_bytes;   /* region bytes of one page of tokens */
} cli_plan_ring_t;

void cli_plan_usage(FILE *out)
{
    fprintf(out,
            "usage: kvstage plan --prefill-tp P --decode-tp D\n"
            "                    (--model NAME | --kv-heads H --head-dim HD --layers L)\n"
            "                    [--dtype bf16|fp16|fp8|fp32] [--page-size PS]\n"
            "                    [--prefill-pp PP] [--decode-pp DP] [--prefill-cp CP]\n"
            "                    [--chunk-tokens C] [--kv-scales S] [--tokens T]\n"
            "                    [--request-tokens R] [--full-attn-every K\n"
            "                    (--window W | --state-heads H --state-bytes C+S)]\n"
            "                    [--ring-mib M] [--json]\n"
            "\n"
            "Plans the staging transfer of one chunk of KV cache from prefill ranks to\n"
            "decode ranks (spec sections 3-5): for each decode rank, which prefill ranks\n"
            "write which head slices at which offset of its staging region, and how many\n"
            "full chunk regions fit in the decode staging ring.\n"
            "\n"
            "  --model NAME       built-in model shape (see below); explicit flags override it\n"
            "  --kv-heads H       total KV heads of the model (1..%" PRId64 ")\n"
            "  --head-dim HD      head dimension (1..%" PRId64 ")\n"
            "  --mla-latent-dim N an MLA model: one latent of N elements per token and layer\n"
            "                     (576 for DeepSeek-V3), the same on every TP rank; in place\n"
            "                     of --kv-heads and --head-dim\n"
            "  --layers L         layers of the whole model (1..%" PRId64 ")\n"
            "  --dtype T          KV dtype: bf16, fp16, fp8, fp32 (default bf16)\n"
            "  --page-size PS     tokens per KV page (default %d)\n"
            "  --prefill-tp P     prefill attention TP size (1..%" PRId64 ", required)\n"
            "  --decode-tp D      decode attention TP size (1..%" PRId64 ", required)\n"
            "  --prefill-pp PP    prefill pipeline stages, at most L (default 1); L need\n"
            "                     not divide: stages hold L/PP layers, the last L%%PP one more\n"
            "  --decode-pp DP     decode pipeline stages, 1 or PP (default 1)\n"
            "  --prefill-cp CP    prefill context-parallel ranks (default 1): each holds one\n"
            "                     contiguous token range of a request; lists which CP rank\n"
            "                     writes which rows of each chunk's region\n"
            "  --kv-scales S      FP8 KV with scale planes (needs --dtype fp8): none\n"
            "                     (default), per-token (one fp32 per token and head) or\n"
            "                     per-block[:N] (MXFP8: one e8m0 byte per N elements, 32)\n"
            "  --chunk-tokens C   chunked-prefill size, a multiple of PS; 0 means %d\n"
            "                     (default 0, so PS must divide %d); the grid width\n"
            "                     is G = C tokens, C/PS pages\n"
            "  --tokens T         tokens of the chunk to lay out, 1..G (default G)\n"
            "  --request-tokens R with --prefill-cp: the request whose chunks are listed\n"
            "                     (default CP x G + G/2); with hybrid layers: the request\n"
            "                     whose last chunk (its last T tokens) is listed (default T)\n"
            "  --full-attn-every K hybrid: layer l is full attention when (l+1) %% K == 0,\n"
            "                     the others window or state layers (docs/kinds/hybrid.md)\n"
            "  --window W         the other layers are sliding-window layers of W tokens\n"
            "  --state-heads H    the other layers are state layers (linear attention /\n"
            "                     SSM) of H state heads, split over TP like KV heads\n"
            "  --state-bytes C+S  bytes of one state head's conv (C) and recurrent (S)\n"
            "                     state of one request (or one number: all recurrent)\n"
            "  --draft-layers N   a draft model's layers (speculative decoding: EAGLE's 1,\n"
            "                     MTP's 1) moved with the model's, after its layer slots in\n"
            "                     each writer's block (docs/kinds/draft.md)\n"
            "  --draft-head-dim D the draft's head dim (default the model's)\n"
            "  --draft-kv-heads H the draft's KV heads: the model's (checked)\n"
            "  --ring-mib M       decode staging ring size in MiB (default %" PRId64 ")\n"
            "  --json             print one JSON object instead of the table\n"
            "  --help             print this help\n"
            "\n"
            "Flags take `--flag value` or `--flag=value`, in any order.\n"
            "Bad input exits with status 2 and one line naming the flag to change.\n"
            "\n"
            "built-in models (KV heads, head dim, layers, dtype):\n",
            CLI_SHAPE_MAX_HEADS, CLI_SHAPE_MAX_HEAD_DIM, CLI_SHAPE_MAX_LAYERS,
            CLI_PLAN_DEFAULT_PAGE_SIZE, CLI_SHAPE_MAX_TP, CLI_SHAPE_MAX_TP,
            KVS_DEFAULT_CHUNK_TOKENS, KVS_DEFAULT_CHUNK_TOKENS, CLI_PLAN_DEFAULT_RING_MIB);
    cli_shape_models_usage(out);
    fprintf(out,
            "\n"
            "example: kvstage plan --model llama-3.1-70b --prefill-tp 8 --decode-tp 2\n");
}

/* Parses plan's own numeric flag `f` into *dst when given; keeps *dst
 * otherwise. */
static int cli_plan_number(const char *const *values, enum cli_plan_flag f,
                           int64_t min, int64_t max, int64_t *dst)
{
    if (values[f] == NULL)
        return 0;
    return cli_parse_i64(CLI_PLAN_CMD, cli_plan_flags[f].name, values[f], min,
                         max, dst);
}

/* Fills *in from the scanned flag values: the shape (model, explicit
 * flags, defaults; both TP sizes required), then plan's own flags. */
static int cli_plan_read(const char *const *values, cli_plan_input_t *in)
{
    static const cli_shape_defaults_t defaults = {
        .model = NULL,
        .page_size = CLI_PLAN_DEFAULT_PAGE_SIZE,
        .prefill_tp = 0,
        .decode_tp = 0,
    };
    int rc;
    memset(in, 0, sizeof *in);
    in->ring_mib = CLI_PLAN_DEFAULT_RING_MIB;
    in->json = values[CLI_PF_JSON] != NULL;
    if ((rc = cli_shape_read(CLI_PLAN_CMD, values, &defaults, &in->shape)) != 0)
        return rc;
    if ((rc = cli_plan_number(values, CLI_PF_TOKENS, 1, CLI_SHAPE_MAX_TOKENS,
                              &in->tokens)) != 0 ||
        (rc = cli_plan_number(values, CLI_PF_RING_MIB, 1, CLI_PLAN_MAX_RING_MIB,
                              &in->ring_mib)) != 0 ||
        (rc = cli_plan_number(values, CLI_PF_REQUEST_TOKENS, 1, CLI_SHAPE_MAX_TOKENS,
                              &in->request_tokens)) != 0)
        return rc;
    if (in->request_tokens != 0 && in->shape.params.prefill_cp <= 1 &&
        in->shape.params.full_attn_every <= 1)
        return cli_fail(CLI_PLAN_CMD, "--request-tokens: it lists the chunks of a request "
                                      "split over prefill CP ranks, or the last chunk of a "
                                      "hybrid model's request: give --prefill-cp 2 or more "
                                      "(or a hybrid model), or drop --request-tokens");
    return 0;
}

static int cli_plan_internal(const char *what, int status)
{
    fprintf(stderr, "kvstage plan: internal error: %s failed with %s (%s)\n",
            what, kvs_status_name(status), kvs_strerror(status));
    return 1;
}

/* TP writer j's block of a CP part (a region of the part's tokens); of a
 * hybrid layout, the hybrid block of those tokens in the request (window
 * rows inside the window, the state in the part ending the request). */
static int cli_plan_part_writer(const kvs_layout_t *lay, int64_t stage, int64_t j,
                                int64_t total, const kvs_cp_part_t *part, kvs_writer_t *w)
{
    if (lay->full_attn_every <= 1)
        return kvs_layout_writer(lay, 0, stage, j, part->token_end - part->token_start, w);
    const kvs_chunk_t ch = {.token_start = part->token_start, .token_end = part->token_end};
    kvs_hybrid_writer_t hw;
    const int rc = kvs_layout_hybrid_writer(lay, 0, stage, j, total, &ch, &hw);
    if (rc == KVS_OK)
        *w = hw.w;
    return rc;
}

/* Ring sizing for a full G-token chunk. */
static int cli_plan_ring(const kvs_layout_t *lay, int64_t ring_mib,
                         cli_plan_ring_t *r)
{
    memset(r, 0, sizeof *r);
    r->ring_bytes = ring_mib * CLI_MIB; /* <= 2^62 by the flag bound */
    r->max_region_bytes = kvs_layout_max_region_bytes(lay);
    if (r->max_region_bytes <= 0)
        return cli_plan_internal("kvs_layout_max_region_bytes", KVS_ERANGE);
    int64_t m = r->max_region_bytes;
    r->chunks_in_ring = r->ring_bytes / m;
    r->min_ring_mib = (m + CLI_MIB - 1) / CLI_MIB;
    r->suggested_ring_mib = r->min_ring_mib * CLI_PLAN_SUGGESTED_CHUNKS;
    /* A region grows linearly with its tokens; round a page's share up so
     * the chunk size suggested always fits. */
    int64_t pages = lay->chunk_pages;
    r->page_region_bytes = (m + pages - 1) / pages;
    r->max_chunk_tokens = r->ring_bytes / r->page_region_bytes * lay->page_size;
    return 0;
}

/* One pipeline stage of one side: its layers and, on the decode side, the
 * region every decode rank of that stage gets for the planned chunk. */
typedef struct cli_plan_stage {
    int64_t first_layer, num_layers;
    int64_t region_bytes; /* decode side only */
} cli_plan_stage_t;

/* What the plan prints besides the layout itself. */
typedef struct cli_plan_out {
    int64_t tokens;
    int64_t request_tokens;         /* prefill CP > 1: the request listed */
    int64_t region_stage;           /* the decode stage region/writers are for */
    const int64_t *region;          /* [decode_tp] */
    const kvs_writer_t *writers;    /* [decode_tp * tp_writers] */
    const cli_plan_stage_t *stages[2]; /* [prefill_pp], [decode_pp] (by kvs_role_t) */
} cli_plan_out_t;

static void cli_plan_json_stages(const char *key, const cli_plan_stage_t *st, int64_t n,
                                 bool decode)
{
    printf(", \"%s\": [", key);
    for (int64_t e = 0; e < n; e++) {
        printf("%s{\"stage\": %" PRId64 ", \"first_layer\": %" PRId64
               ", \"num_layers\": %" PRId64, e == 0 ? "" : ", ", e, st[e].first_layer,
               st[e].num_layers);
        if (decode)
            printf(", \"region_bytes\": %" PRId64, st[e].region_bytes);
        printf("}");
    }
    printf("]");
}

/* Prefill context parallelism: which CP rank holds which tokens of a
 * request of o->request_tokens, and for each chunk of it (from a cached
 * prefix of 0) the CP parts of decode rank 0's region and their writers,
 * region-wide index c * W + j (docs/kinds/context-parallel.md). JSON: one
 * "context_parallel" member; text: a table. */
static int cli_plan_cp(const kvs_layout_t *lay, const cli_plan_out_t *o, bool json)
{
    const int64_t total = o->request_tokens, stage = o->region_stage;
    const int64_t pages = total / lay->decode_page_size + (total % lay->decode_page_size != 0);
    const int64_t nchunks = kvs_grid_num_chunks(lay, pages);
    const int64_t shown = nchunks < CLI_PLAN_MAX_CP_CHUNKS ? nchunks : CLI_PLAN_MAX_CP_CHUNKS;
    char a[32];
    if (json)
        printf(", \"context_parallel\": {\"request_tokens\": %" PRId64 ", \"decode_rank\": 0"
               ", \"decode_stage\": %" PRId64 ", \"ranges\": [", total, stage);
    else
        printf("\ncontext parallel: prefill CP %" PRId64 ", each CP rank one contiguous "
               "range of a request (a multiple of %" PRId64 " tokens), with the prefill's "
               "TP and PP;\na chunk's writers are its TP writers x the CP ranks whose "
               "range meets it (writer c x %" PRId64 " + j)\nrequest of %" PRId64
               " tokens (--request-tokens), decode rank 0:\n ",
               lay->prefill_cp, lay->cp_align_tokens, lay->tp_writers, total);
    for (int64_t c = 0; c < lay->prefill_cp; c++) {
        int64_t cs = 0, ce = 0;
        int rc = kvs_layout_cp_range(lay, total, c, &cs, &ce);
        if (rc != KVS_OK)
            return cli_plan_internal("kvs_layout_cp_range", rc);
        if (json)
            printf("%s[%" PRId64 ", %" PRId64 "]", c == 0 ? "" : ", ", cs, ce);
        else
            printf(" CP rank %" PRId64 " holds [%" PRId64 ", %" PRId64 ")%s", c, cs, ce,
                   c + 1 < lay->prefill_cp ? "," : "\n");
    }
    if (json)
        printf("], \"chunks\": [");
    else
        printf("  %-5s  %-24s  %-8s  %-3s  %-24s  %-10s  %-6s  %-12s  %s\n", "chunk",
               "tokens", "arrivals", "CP", "rows (in its pages)", "local", "writer",
               "prefill rank", "offset");
    for (int64_t i = 0; i < shown; i++) {
        kvs_chunk_t ch;
        int64_t first = 0, count = 0;
        int rc = kvs_grid_chunk(lay, 0, total, i, &ch);
        if (rc == KVS_OK)
            rc = kvs_layout_cp_writers(lay, total, &ch, &first, &count);
        if (rc != KVS_OK)
            return cli_plan_internal("kvs_layout_cp_writers", rc);
        const int64_t arrivals = kvs_layout_chunk_arrivals(lay, total, &ch);
        if (json)
            printf("%s{\"chunk\": %" PRId64 ", \"token_start\": %" PRId64 ", \"token_end\": %"
                   PRId64 ", \"arrivals\": %" PRId64 ", \"parts\": [", i == 0 ? "" : ", ", i,
                   ch.token_start, ch.token_end, arrivals);
        for (int64_t c = first; c < first + count; c++) {
            kvs_cp_part_t part;
            if ((rc = kvs_layout_cp_part(lay, 0, stage, total, &ch, c, &part)) != KVS_OK)
                return cli_plan_internal("kvs_layout_cp_part", rc);
            if (json)
                printf("%s{\"cp_rank\": %" PRId64 ", \"token_start\": %" PRId64
                       ", \"token_end\": %" PRId64 ", \"local_token_start\": %" PRId64
                       ", \"offset\": %" PRId64 ", \"bytes\": %" PRId64 ", \"writers\": [",
                       c == first ? "" : ", ", c, part.token_start, part.token_end,
                       part.local_token_start, part.offset_bytes, part.len_bytes);
            for (int64_t j = 0; j < lay->tp_writers; j++) {
                kvs_writer_t w;
                if ((rc = cli_plan_part_writer(lay, stage, j, total, &part, &w)) != KVS_OK)
                    return cli_plan_internal("kvs_layout_writer", rc);
                const int64_t at = part.offset_bytes + w.offset_bytes;
                if (json) {
                    printf("%s{\"writer_index\": %" PRId64 ", \"prefill_rank\": %" PRId64
                           ", \"offset\": %" PRId64 ", \"bytes\": %" PRId64 "}",
                           j == 0 ? "" : ", ", c * lay->tp_writers + j, w.prefill_rank, at,
                           w.len_bytes);
                    continue;
                }
                char toks[48] = "", rows[48] = "", local[24] = "";
                if (c == first && j == 0)
                    snprintf(toks, sizeof toks, "[%" PRId64 ", %" PRId64 ")", ch.token_start,
                             ch.token_end);
                if (j == 0) {
                    snprintf(rows, sizeof rows, "[%" PRId64 ", %" PRId64 ")",
                             part.token_start, part.token_end);
                    snprintf(local, sizeof local, "%" PRId64, part.local_token_start);
                }
                char num[24] = "", arr[24] = "", cp[24] = "";
                if (c == first && j == 0) {
                    snprintf(num, sizeof num, "%" PRId64, i);
                    snprintf(arr, sizeof arr, "%" PRId64, arrivals);
                }
                if (j == 0)
                    snprintf(cp, sizeof cp, "%" PRId64, c);
                printf("  %-5s  %-24s  %-8s  %-3s  %-24s  %-10s  %6" PRId64 "  %12" PRId64
                       "  %s (%" PRId64 ")\n", num, toks, arr, cp, rows, local,
                       c * lay->tp_writers + j, w.prefill_rank,
                       cli_format_bytes(at, a, sizeof a), at);
            }
            if (json)
                printf("]}");
        }
        if (json)
            printf("]}");
    }
    if (json)
        printf("], \"chunks_left_out\": %" PRId64 "}", nchunks - shown);
    else if (nchunks > shown)
        printf("  (%" PRId64 " more chunk(s) left out)\n", nchunks - shown);
    return 0;
}

static void cli_plan_json(const cli_plan_input_t *in, const kvs_layout_t *lay,
                          const cli_plan_ring_t *ring, const cli_plan_out_t *o)
{
    const int64_t tokens = o->tokens;
    const int64_t *region = o->region;
    const kvs_writer_t *writers = o->writers;
    bool staging = lay->path == KVS_PATH_STAGING;
    printf("{\"model\": ");
    if (in->shape.model != NULL)
        printf("\"%s\"", in->shape.model->name);
    else
        printf("null");
    printf(", \"total_heads\": %" PRId64 ", \"head_dim\": %" PRId64
           ", \"dtype\": \"%s\", \"elem_bytes\": %" PRId64
           ", \"layers\": %" PRId64 ", \"page_size\": %" PRId64
           ", \"decode_page_size\": %" PRId64,
           lay->total_heads, lay->head_dim, kvs_dtype_name(in->shape.params.dtype),
           lay->elem_bytes, lay->layers, lay->page_size, lay->decode_page_size);
    printf(", \"prefill_tp\": %" PRId64 ", \"decode_tp\": %" PRId64
           ", \"prefill_pp\": %" PRId64 ", \"decode_pp\": %" PRId64,
           lay->prefill_tp, lay->decode_tp, lay->prefill_pp, lay->decode_pp);
    printf(", \"chunk_tokens\": %" PRId64 ", \"grid_tokens\": %" PRId64
           ", \"chunk_pages\": %" PRId64 ", \"tokens\": %" PRId64
           ", \"path\": \"%s\"",
           lay->chunk_tokens, lay->grid_tokens, lay->chunk_pages, tokens,
           staging ? "staging" : "direct");
    printf(", \"src_heads\": %" PRId64 ", \"dst_heads\": %" PRId64
           ", \"decode_layers\": %" PRId64 ", \"prefill_layers\": %" PRId64
           ", \"tp_writers\": %" PRId64 ", \"expected_arrivals\": %" PRId64
           ", \"targets_per_prefill\": %" PRId64 ", \"kv_kind\": \"%s\""
           ", \"planes\": %" PRId64 ", \"tp_sources\": %" PRId64,
           lay->src_heads, lay->dst_heads, lay->decode_layers,
           lay->prefill_layers, lay->tp_writers, lay->expected_arrivals,
           lay->targets_per_prefill, kvs_kv_kind_name(lay->kind), lay->planes,
           lay->tp_sources);
    printf(", \"prefill_cp\": %" PRId64, lay->prefill_cp);
    printf(", \"kv_scales\": \"%s\", \"scale_block\": %" PRId64 ", \"scale_bytes\": %" PRId64,
           kvs_kv_scales_name(lay->kv_scales), lay->scale_block, lay->scale_bytes);
    printf(", \"full_attn_every\": %" PRId64 ", \"other_layers\": \"%s\""
           ", \"window_tokens\": %" PRId64 ", \"state_heads\": %" PRId64
           ", \"state_conv_bytes\": %" PRId64 ", \"state_ssm_bytes\": %" PRId64,
           lay->full_attn_every, kvs_layer_kind_name(lay->other_layers), lay->window_tokens,
           lay->state_heads, lay->state_conv_bytes, lay->state_ssm_bytes);
    if (lay->full_attn_every > 1) /* the listed chunk is this request's last */
        printf(", \"request_tokens\": %" PRId64, o->request_tokens);
    printf(", \"draft_layers\": %" PRId64 ", \"draft_head_dim\": %" PRId64
           ", \"draft_part_bytes\": %" PRId64, lay->draft_layers, lay->draft_head_dim,
           kvs_layout_draft_part_bytes(lay, o->tokens,
                                       lay->prefill_tp > lay->decode_tp ? lay->src_heads
                                                                        : lay->dst_heads));
    cli_plan_json_stages("prefill_stages", o->stages[KVS_ROLE_PREFILL], lay->prefill_pp,
                         false);
    cli_plan_json_stages("decode_stages", o->stages[KVS_ROLE_DECODE], lay->decode_pp, true);
    printf(", \"decode_ranks\": [");
    for (int64_t d = 0; d < lay->decode_tp; d++) {
        printf("%s{\"decode_rank\": %" PRId64 ", \"decode_stage\": %" PRId64,
               d == 0 ? "" : ", ", d, o->region_stage);
        printf(", \"region_bytes\": %" PRId64 ", \"expected_arrivals\": %" PRId64
               ", \"writers\": [",
               region[d], lay->expected_arrivals);
        for (int64_t i = 0; i < lay->tp_writers; i++) {
            const kvs_writer_t *w = &writers[d * lay->tp_writers + i];
            printf("%s{\"writer_index\": %" PRId64 ", \"prefill_rank\": %" PRId64
                   ", \"src_head_start\": %" PRId64 ", \"dst_head_start\": %" PRId64
                   ", \"num_heads\": %" PRId64 ", \"offset\": %" PRId64
                   ", \"bytes\": %" PRId64 "}",
                   i == 0 ? "" : ", ", w->writer_index, w->prefill_rank,
                   w->heads.src_start, w->heads.dst_start, w->heads.num_heads,
                   w->offset_bytes, w->len_bytes);
        }
        printf("]}");
    }
    printf("]");
    printf(", \"ring_mib\": %" PRId64 ", \"ring_bytes\": %" PRId64
           ", \"ring_used\": %s",
           in->ring_mib, in->ring_mib * CLI_MIB, staging ? "true" : "false");
    if (staging) {
        printf(", \"max_region_bytes\": %" PRId64 ", \"chunks_in_ring\": %" PRId64
               ", \"fits\": %s, \"min_ring_mib\": %" PRId64
               ", \"suggested_ring_mib\": %" PRId64
               ", \"suggested_chunks\": %d"
               ", \"max_chunk_tokens_for_ring\": %" PRId64,
               ring->max_region_bytes, ring->chunks_in_ring,
               ring->chunks_in_ring >= 1 ? "true" : "false", ring->min_ring_mib,
               ring->suggested_ring_mib, CLI_PLAN_SUGGESTED_CHUNKS,
               ring->max_chunk_tokens);
    }
    if (lay->prefill_cp > 1)
        (void)cli_plan_cp(lay, o, true);
    printf("}\n");
}

static void cli_plan_table_ring(const cli_plan_input_t *in,
                                const kvs_layout_t *lay,
                                const cli_plan_ring_t *r)
{
    char a[32], b[32];
    printf("\nstaging ring (one per decode GPU): --ring-mib %" PRId64 " = %s "
           "(%" PRId64 " bytes)\n",
           in->ring_mib, cli_format_bytes(r->ring_bytes, a, sizeof a), r->ring_bytes);
    printf("  largest region, a full %" PRId64 "-token chunk: %s (%" PRId64
           " bytes)\n",
           lay->grid_tokens, cli_format_bytes(r->max_region_bytes, b, sizeof b),
           r->max_region_bytes);
    printf("  full chunks that fit in the ring: %" PRId64 "\n", r->chunks_in_ring);
    if (r->chunks_in_ring == 0) {
        printf("  DOES NOT FIT: every chunk would fail OVERSIZED. Change "
               "--ring-mib to at least %" PRId64,
               r->min_ring_mib);
        if (r->max_chunk_tokens > 0)
            printf(", or lower --chunk-tokens to at most %" PRId64
                   " (a multiple of the page size %" PRId64 ") to fit the "
                   "current ring.\n",
                   r->max_chunk_tokens, lay->page_size);
        else
            printf("; even one page of %" PRId64 " tokens (%s) does not fit "
                   "the current ring, so lowering --chunk-tokens cannot help.\n",
                   lay->page_size,
                   cli_format_bytes(r->page_region_bytes, a, sizeof a));
    } else if (r->chunks_in_ring == 1) {
        printf("  warning: only 1 chunk fits, so chunk transfers into a decode "
               "rank serialize (each waits for the previous scatter to free "
               "the ring). For %d chunks in flight use --ring-mib %" PRId64
               ".\n",
               CLI_PLAN_SUGGESTED_CHUNKS, r->suggested_ring_mib);
    } else if (r->chunks_in_ring < CLI_PLAN_SUGGESTED_CHUNKS) {
        printf("  %" PRId64 " chunks can be in flight per decode rank; for %d "
               "use --ring-mib %" PRId64 ".\n",
               r->chunks_in_ring, CLI_PLAN_SUGGESTED_CHUNKS, r->suggested_ring_mib);
    } else {
        printf("  %" PRId64 " chunks can be in flight per decode rank.\n",
               r->chunks_in_ring);
    }
}

/* "  prefill stage 0: layers 0-25 (26)" per stage, and the region of a
 * decode stage on the staging path. */
static void cli_plan_table_stages(const kvs_layout_t *lay, kvs_role_t role,
                                  const cli_plan_stage_t *st)
{
    const bool decode = role == KVS_ROLE_DECODE;
    const int64_t n = decode ? lay->decode_pp : lay->prefill_pp;
    char a[32];
    for (int64_t e = 0; e < n; e++) {
        printf("    %s stage %" PRId64 ": layers %" PRId64 "-%" PRId64 " (%" PRId64 ")",
               decode ? "decode" : "prefill", e, st[e].first_layer,
               st[e].first_layer + st[e].num_layers - 1, st[e].num_layers);
        if (decode && lay->path == KVS_PATH_STAGING)
            printf(", region %s (%" PRId64 " bytes) per decode rank",
                   cli_format_bytes(st[e].region_bytes, a, sizeof a), st[e].region_bytes);
        printf("\n");
    }
}

/* "26 layers per stage", or "26 or 27 layers per stage" for an uneven split. */
static void cli_plan_table_side(const kvs_layout_t *lay, kvs_role_t role,
                                const cli_plan_stage_t *st)
{
    const bool decode = role == KVS_ROLE_DECODE;
    const int64_t pp = decode ? lay->decode_pp : lay->prefill_pp;
    const int64_t most = decode ? lay->decode_layers : lay->prefill_layers;
    printf("  %-7s  TP %" PRId64 " x PP %" PRId64 ": %" PRId64 " KV head(s) per rank, ",
           decode ? "decode" : "prefill", decode ? lay->decode_tp : lay->prefill_tp, pp,
           decode ? lay->dst_heads : lay->src_heads);
    if (st[0].num_layers == most)
        printf("%" PRId64 " layers per stage\n", most);
    else
        printf("%" PRId64 " or %" PRId64 " layers per stage (the last %" PRId64
               " stage(s) hold one more)\n", st[0].num_layers, most, lay->layers % pp);
    cli_plan_table_stages(lay, role, st);
}

/* The layer pattern and what each kind moves (docs/kinds/hybrid.md). */
static void cli_plan_table_hybrid(const kvs_layout_t *lay, const cli_plan_out_t *o)
{
    char a[32];
    const int64_t full = lay->layers / lay->full_attn_every;
    printf("  layers   %" PRId64 " full attention (layer l when (l + 1) %% %" PRId64
           " == 0) + %" PRId64 " %s\n", full, lay->full_attn_every, lay->layers - full,
           lay->other_layers == KVS_LAYER_WINDOW ? "sliding-window" : "state (no KV pages)");
    if (lay->other_layers == KVS_LAYER_WINDOW) {
        int64_t ws = 0, we = 0;
        (void)kvs_layout_layer_tokens(lay, 0, o->request_tokens, &ws, &we);
        printf("  window   %" PRId64 " tokens: a window layer sends the rows of tokens [%"
               PRId64 ", %" PRId64 ") of this %" PRId64 "-token request (the last %" PRId64
               ", from a multiple of %" PRId64 "); its other pages are never written\n",
               lay->window_tokens, ws, we, o->request_tokens, lay->window_tokens,
               lay->cp_align_tokens);
    } else {
        int64_t pslot = 0, dslot = 0;
        (void)kvs_layout_state_slot_bytes(lay, KVS_ROLE_PREFILL, 0, &pslot);
        (void)kvs_layout_state_slot_bytes(lay, KVS_ROLE_DECODE, o->region_stage, &dslot);
        printf("  state    %" PRId64 " state heads x (%" PRId64 " conv + %" PRId64 " ssm) "
               "bytes per layer and request, split over TP as heads are (%" PRId64 " per "
               "prefill rank, %" PRId64 " per decode rank); carried after the KV rows of "
               "each writer's block in the request's last chunk; a decode rank's state "
               "slot %s (%" PRId64 " bytes)\n", lay->state_heads, lay->state_conv_bytes,
               lay->state_ssm_bytes, lay->state_src_heads, lay->state_dst_heads,
               cli_format_bytes(dslot, a, sizeof a), dslot);
        (void)pslot;
    }
    printf("  chunk    listed: the last %" PRId64 " tokens of a %" PRId64 "-token request "
           "(--request-tokens); layer slots of the layers with rows in it\n", o->tokens,
           o->request_tokens);
}

static void cli_plan_table(const cli_plan_input_t *in, const kvs_layout_t *lay,
                           const cli_plan_ring_t *ring, const cli_plan_out_t *o)
{
    char a[32], b[32];
    bool staging = lay->path == KVS_PATH_STAGING;
    const int64_t tokens = o->tokens;
    const int64_t *region = o->region;
    const kvs_writer_t *writers = o->writers;
    const cli_plan_stage_t *dstages = o->stages[KVS_ROLE_DECODE];
    /* Decode stages of different sizes: say whose regions are listed. */
    const bool uneven_decode = dstages[0].num_layers != lay->decode_layers;
    printf("kvstage plan%s%s\n", in->shape.model != NULL ? ": " : "",
           in->shape.model != NULL ? in->shape.model->name : "");
    if (lay->kind == KVS_KV_MLA)
        printf("  model    MLA: one latent of %" PRId64 " elements per token and layer, the "
               "same on every TP rank, %s (%" PRId64 " bytes), %" PRId64 " layers\n",
               lay->head_dim, kvs_dtype_name(in->shape.params.dtype), lay->elem_bytes,
               lay->layers);
    else
        printf("  model    %" PRId64 " KV heads x head dim %" PRId64 ", %s (%" PRId64
               " bytes), %" PRId64 " layers\n",
               lay->total_heads, lay->head_dim, kvs_dtype_name(in->shape.params.dtype),
               lay->elem_bytes, lay->layers);
    if (lay->kv_scales != KVS_KV_SCALES_NONE) /* docs/kinds/fp8-scales.md */
        printf("  scales   %s: %" PRId64 " byte(s) of scales per head and token (%s) beside "
               "each K%s buffer, sliced by head with their rows; each layer slot of a "
               "region holds its rows, then their scale rows\n",
               kvs_kv_scales_name(lay->kv_scales), lay->scale_bytes,
               lay->kv_scales == KVS_KV_SCALES_PER_TOKEN ? "one fp32"
                                                        : "one e8m0 byte per block",
               lay->planes == 2 ? " and V" : "");
    if (lay->full_attn_every > 1)
        cli_plan_table_hybrid(lay, o);
    if (lay->draft_layers > 0) { /* docs/kinds/draft.md */
        const int64_t part = kvs_layout_draft_part_bytes(
            lay, o->tokens, lay->prefill_tp > lay->decode_tp ? lay->src_heads : lay->dst_heads);
        printf("  draft    %" PRId64 " draft layer(s) of %s %" PRId64 ", the model's "
               "heads split the same way: they end each writer's block, [%s] slots after "
               "the model's, %s (%" PRId64 " bytes) of each writer's block here\n",
               lay->draft_layers, lay->planes == 1 ? "latent dim" : "head dim",
               lay->draft_head_dim, lay->planes == 1 ? "draft latent" : "draft K | draft V",
               cli_format_bytes(part, a, sizeof a), part);
        if (lay->prefill_pp > 1) /* the last stage's, on both sides */
            printf("           with PP the draft is the last stage's: prefill stage %" PRId64
                   " writes it, into the regions of decode stage %" PRId64 "\n",
                   kvs_layout_draft_stage(lay, KVS_ROLE_PREFILL),
                   kvs_layout_draft_stage(lay, KVS_ROLE_DECODE));
    }
    cli_plan_table_side(lay, KVS_ROLE_PREFILL, o->stages[KVS_ROLE_PREFILL]);
    cli_plan_table_side(lay, KVS_ROLE_DECODE, dstages);
    printf("  grid     page size %" PRId64 ", chunk %" PRId64 " tokens -> G = %"
           PRId64 " tokens = %" PRId64 " pages per chunk\n",
           lay->page_size, lay->chunk_tokens, lay->grid_tokens, lay->chunk_pages);
    if (!staging) {
        printf("  path     direct: P == D: no staging, direct page copy "
               "(prefill rank r copies its pages to decode rank r; no ring "
               "region, no gather or scatter)\n");
        return;
    }
    printf("  path     staging: gather on prefill, one write per writer, "
           "scatter on decode\n");
    if (lay->full_attn_every > 1 && lay->decode_pp == 1 && lay->prefill_pp > 1)
        printf("  chunk    T = %" PRId64 " tokens; each region holds %" PRId64
               " writer(s) x %" PRId64 " parts, one per prefill stage, each [its K slots | "
               "its V slots | its state] (one write of each stage): a slot per full layer "
               "and per window layer with rows in the chunk, the state in a request's "
               "last chunk; a chunk completes after %" PRId64 " arrival(s)\n",
               tokens, lay->tp_writers, lay->prefill_pp, lay->expected_arrivals);
    else if (lay->full_attn_every > 1)
        printf("  chunk    T = %" PRId64 " tokens; each region holds %" PRId64
               " writer(s) x [K slots | V slots | state]: a slot per full layer and per "
               "window layer with rows in the chunk, the state in a request's last chunk; "
               "a chunk completes after %" PRId64 " arrival(s)\n",
               tokens, lay->tp_writers, lay->expected_arrivals);
    else if (lay->planes == 1)
        printf("  chunk    T = %" PRId64 " tokens; each region holds %" PRId64
               " writer(s) x [latent layers 0..%" PRId64 "%s]; a chunk completes after %"
               PRId64 " arrival(s) (%" PRId64 " TP writer(s) x %" PRId64 " prefill "
               "stage(s) per decode stage)\n",
               tokens, lay->tp_writers, lay->decode_layers - 1,
               lay->draft_layers > 0 ? " | draft latent layers" : "", lay->expected_arrivals,
               lay->tp_writers, lay->prefill_pp / lay->decode_pp);
    else
        printf("  chunk    T = %" PRId64 " tokens; each region holds %" PRId64
               " writer(s) x [K layers 0..%" PRId64 " | V layers 0..%" PRId64
               "%s]; a chunk completes after %" PRId64 " arrival(s) (%" PRId64
               " TP writer(s) x %" PRId64 " prefill stage(s) per decode stage)\n",
               tokens, lay->tp_writers, lay->decode_layers - 1,
               lay->decode_layers - 1, lay->draft_layers > 0 ? " | draft K | draft V" : "",
               lay->expected_arrivals, lay->tp_writers, lay->prefill_pp / lay->decode_pp);
    if (lay->tp_sources > lay->tp_writers && lay->kind == KVS_KV_MLA)
        printf("  sources  MLA: the latent is the same on every prefill rank: decode rank d "
               "takes it once, from prefill rank d * %" PRId64 " / %" PRId64 "; the other "
               "%" PRId64 " prefill rank(s) of its room write nothing and report their "
               "status\n", lay->prefill_tp, lay->decode_tp,
               lay->tp_sources - lay->tp_writers);
    else if (lay->tp_sources > lay->tp_writers)
        printf("  sources  %" PRId64 " KV head(s) over prefill TP %" PRId64 ": %" PRId64
               " prefill ranks in a row hold each head, and the first of them writes it; "
               "the other %" PRId64 " prefill rank(s) of a room write nothing and report "
               "their status\n", lay->total_heads, lay->prefill_tp,
               lay->prefill_tp / lay->total_heads, lay->tp_sources - lay->tp_writers);
    if (lay->targets_per_prefill > 1)
        printf("  fan-out  each prefill rank serves %" PRId64 " decode ranks, "
               "one gather and one region each\n",
               lay->targets_per_prefill);
    if (uneven_decode)
        printf("  regions  listed for decode stage %" PRId64 ", whose %" PRId64 " layer "
               "slots are the most; the stages above give every stage's size\n",
               o->region_stage, lay->decode_layers);
    for (int64_t d = 0; d < lay->decode_tp; d++) {
        printf("\ndecode rank %" PRId64 ": region %s (%" PRId64 " bytes), %"
               PRId64 " writer(s)\n",
               d, cli_format_bytes(region[d], a, sizeof a), region[d],
               lay->tp_writers);
        printf("  %-6s  %-12s  %-15s  %-15s  %-28s  %s\n", "writer",
               "prefill rank", "src local heads", "dst local heads", "offset",
               "bytes");
        for (int64_t i = 0; i < lay->tp_writers; i++) {
            const kvs_writer_t *w = &writers[d * lay->tp_writers + i];
            char src[32], dst[32], off[48], len[48];
            snprintf(src, sizeof src, "[%" PRId64 ", %" PRId64 ")",
                     w->heads.src_start, w->heads.src_start + w->heads.num_heads);
            snprintf(dst, sizeof dst, "[%" PRId64 ", %" PRId64 ")",
                     w->heads.dst_start, w->heads.dst_start + w->heads.num_heads);
            snprintf(off, sizeof off, "%s (%" PRId64 ")",
                     cli_format_bytes(w->offset_bytes, a, sizeof a), w->offset_bytes);
            snprintf(len, sizeof len, "%s (%" PRId64 ")",
                     cli_format_bytes(w->len_bytes, b, sizeof b), w->len_bytes);
            printf("  %6" PRId64 "  %12" PRId64 "  %-15s  %-15s  %-28s  %s\n",
                   w->writer_index, w->prefill_rank, src, dst, off, len);
        }
    }
    cli_plan_table_ring(in, lay, ring);
}

/* Computes each stage's layers (and each decode stage's region) into
 * pst[prefill_pp] and dst[decode_pp], then every decode rank's region and
 * writers at decode stage `stage` for `tokens` tokens into
 * region[decode_tp] and writers[decode_tp * tp_writers]. */
/* The region of decode rank d at stage e for the last chunk (its last
 * `tokens` tokens) of a hybrid model's request of `request` tokens, and
 * its writers' blocks into w[tp_writers] unless w is NULL. */
static int cli_plan_hybrid_region(const kvs_layout_t *lay, int64_t d, int64_t e,
                                  int64_t tokens, int64_t request, int64_t *bytes,
                                  kvs_writer_t *w)
{
    const kvs_chunk_t chunk = {.token_start = request - tokens, .token_end = request};
    kvs_hybrid_writer_t hw;
    for (int64_t i = 0; i < lay->tp_writers; i++) {
        const int rc = kvs_layout_hybrid_writer(lay, d, e, i, request, &chunk, &hw);
        if (rc != KVS_OK)
            return cli_plan_internal("kvs_layout_hybrid_writer", rc);
        if (w != NULL)
            w[i] = hw.w;
        *bytes = hw.w.offset_bytes + hw.w.len_bytes;
    }
    return 0;
}

static int cli_plan_fill(const kvs_layout_t *lay, int64_t tokens, int64_t request, int64_t stage,
                         cli_plan_stage_t *pst, cli_plan_stage_t *dst,
                         int64_t *region, kvs_writer_t *writers)
{
    int rc;
    for (int64_t s = 0; s < lay->prefill_pp; s++)
        if ((rc = kvs_layout_stage_layers(lay, KVS_ROLE_PREFILL, s, &pst[s].first_layer,
                                          &pst[s].num_layers)) != KVS_OK)
            return cli_plan_internal("kvs_layout_stage_layers", rc);
    for (int64_t e = 0; e < lay->decode_pp; e++) {
        /* Every decode rank's region has the same size (spec §3: W writers
         * of nh heads each): rank 0's stands for them all. */
        if ((rc = kvs_layout_stage_layers(lay, KVS_ROLE_DECODE, e, &dst[e].first_layer,
                                          &dst[e].num_layers)) != KVS_OK)
            return cli_plan_internal("kvs_layout_stage_layers", rc);
        if (lay->full_attn_every > 1) {
            if ((rc = cli_plan_hybrid_region(lay, 0, e, tokens, request, &dst[e].region_bytes,
                                             NULL)) != 0)
                return rc;
            continue;
        }
        if ((rc = kvs_layout_region_bytes(lay, 0, e, tokens, &dst[e].region_bytes)) != KVS_OK)
            return cli_plan_internal("kvs_layout_region_bytes", rc);
    }
    for (int64_t d = 0; d < lay->decode_tp; d++) {
        if (lay->full_attn_every > 1) {
            if ((rc = cli_plan_hybrid_region(lay, d, stage, tokens, request, &region[d],
                                             &writers[d * lay->tp_writers])) != 0)
                return rc;
            continue;
        }
        rc = kvs_layout_region_bytes(lay, d, stage, tokens, &region[d]);
        if (rc != KVS_OK)
            return cli_plan_internal("kvs_layout_region_bytes", rc);
        for (int64_t i = 0; i < lay->tp_writers; i++) {
            rc = kvs_layout_writer(lay, d, stage, i, tokens,
                                   &writers[d * lay->tp_writers + i]);
            if (rc != KVS_OK)
                return cli_plan_internal("kvs_layout_writer", rc);
        }
    }
    return 0;
}

int cli_plan_main(int argc, char **argv)
{
    const char *values[CLI_PF_COUNT];
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "-h") == 0) {
            cli_plan_usage(stdout);
            return 0;
        }
    }
    int rc = cli_args_scan(CLI_PLAN_CMD, cli_plan_flags, CLI_PF_COUNT, argc,
                           argv, 1, values);
    if (rc != 0)
        return rc;
    if (values[CLI_PF_HELP] != NULL) {
        cli_plan_usage(stdout);
        return 0;
    }

    cli_plan_input_t in;
    rc = cli_plan_read(values, &in);
    if (rc != 0)
        return rc;

    kvs_layout_t lay;
    rc = cli_shape_layout(CLI_PLAN_CMD, &in.shape, &lay);
    if (rc != 0)
        return rc;

    int64_t tokens = in.tokens != 0 ? in.tokens : lay.grid_tokens;
    if (tokens > lay.grid_tokens)
        return cli_fail(CLI_PLAN_CMD,
                        "--tokens: %" PRId64 " is outside 1..%" PRId64 ": a "
                        "chunk never spans more than the grid width G = %"
                        PRId64 " tokens; raise --chunk-tokens to plan bigger "
                        "chunks",
                        tokens, lay.grid_tokens, lay.grid_tokens);

    /* The direct path (P == D) has no ring region; its one "writer" per
     * decode rank is the rank-to-rank copy of all local heads. */
    cli_plan_ring_t ring;
    memset(&ring, 0, sizeof ring);
    if (lay.path == KVS_PATH_STAGING) {
        rc = cli_plan_ring(&lay, in.ring_mib, &ring);
        if (rc != 0)
            return rc;
    }
    /* One writer slot per (decode rank, TP writer): decode_tp * tp_writers
     * is max(P, D) <= CLI_SHAPE_MAX_TP, so this stays small. */
    size_t n_writers = (size_t)(lay.decode_tp * lay.tp_writers);
    int64_t *region = calloc((size_t)lay.decode_tp, sizeof *region);
    kvs_writer_t *writers = calloc(n_writers, sizeof *writers);
    /* PP sizes are at most CLI_SHAPE_MAX_PP. */
    cli_plan_stage_t *pst = calloc((size_t)lay.prefill_pp, sizeof *pst);
    cli_plan_stage_t *dst = calloc((size_t)lay.decode_pp, sizeof *dst);
    if (region == NULL || writers == NULL || pst == NULL || dst == NULL) {
        rc = cli_plan_internal("allocating the plan", KVS_ENOMEM);
        goto out;
    }
    /* Regions and writers of the last decode stage: it holds the most
     * layers (spec §4), so its regions are the largest. */
    /* With CP, a request whose ranges straddle chunks unless one is given:
     * CP x G + G / 2 (both at most the shape bounds: no overflow). */
    /* Hybrid layers: the listed chunk is the last of a request (default
     * one chunk of T tokens), so it carries the window's rows and the
     * state (docs/kinds/hybrid.md). */
    const int64_t request = in.request_tokens != 0 ? in.request_tokens
                            : lay.full_attn_every > 1
                                ? tokens
                                : lay.prefill_cp * lay.grid_tokens + lay.grid_tokens / 2;
    if (lay.full_attn_every > 1 && request < tokens) {
        rc = cli_fail(CLI_PLAN_CMD, "--request-tokens: %" PRId64 " is fewer than the "
                                    "chunk's %" PRId64 " tokens (--tokens): the listed chunk "
                                    "is the request's last", request, tokens);
        goto out;
    }
    const cli_plan_out_t o = {.tokens = tokens, .request_tokens = request,
                              .region_stage = lay.decode_pp - 1,
                              .region = region, .writers = writers,
                              .stages = {[KVS_ROLE_PREFILL] = pst, [KVS_ROLE_DECODE] = dst}};
    rc = cli_plan_fill(&lay, tokens, o.request_tokens, o.region_stage, pst, dst, region,
                       writers);
    if (rc != 0)
        goto out;
    if (in.json) {
        cli_plan_json(&in, &lay, &ring, &o);
    } else {
        cli_plan_table(&in, &lay, &ring, &o);
        if (lay.prefill_cp > 1)
            rc = cli_plan_cp(&lay, &o, false);
    }
out:
    free(dst);
    free(pst);
    free(writers);
    free(region);
    return rc;
}
