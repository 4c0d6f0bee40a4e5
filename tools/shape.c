/*
 * shape.c - reads the shared model-shape flags (see shape.h) for `plan` and
 * `sim`, and names the flag to change when the library's planner rejects
 * the shape. All layout rules live in the library (kvs_layout_init); this
 * file only parses, applies defaults and words the errors.
 */
#include "shape.h"

#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

/* The shape rows, for flag names in messages. */
static const cli_flag_t cli__shape_flags[CLI_SF_COUNT] = {CLI_SHAPE_FLAG_DEFS};

static int cli__shape_number(const char *cmd, const char *const *values,
                             enum cli_shape_flag f, int64_t min, int64_t max,
                             int64_t *dst)
{
    if (values[f] == NULL)
        return 0;
    return cli_parse_i64(cmd, cli__shape_flags[f].name, values[f], min, max, dst);
}

static int cli__shape_model_fail(const char *cmd, const char *name)
{
    char names[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < cli_model_count(); i++) {
        int n = snprintf(names + used, sizeof names - used, "%s%s",
                         i == 0 ? "" : ", ", cli_model_at(i)->name);
        if (n < 0 || (size_t)n >= sizeof names - used)
            break;
        used += (size_t)n;
    }
    return cli_fail(cmd, "--model: unknown model '%s': use one of %s, or give "
                         "--kv-heads, --head-dim and --layers",
                    name, names);
}

/* The layer pattern flags over the model's (docs/kinds/hybrid.md):
 * --full-attn-every K, then --window W or --state-heads H with
 * --state-bytes CONV+SSM (or one number, all recurrent). A --window
 * replaces a model's state layers and --state-heads its window; the
 * planner checks the rest. */
static int cli__shape_hybrid(const char *cmd, const char *const *values,
                             kvs_layout_params_t *p)
{
    int rc;
    if ((rc = cli__shape_number(cmd, values, CLI_SF_FULL_ATTN_EVERY, 0,
                                CLI_SHAPE_MAX_LAYERS, &p->full_attn_every)) != 0)
        return rc;
    if (values[CLI_SF_WINDOW] != NULL && values[CLI_SF_STATE_HEADS] != NULL)
        return cli_fail(cmd, "--window and --state-heads: give one; the layers that are "
                             "not full attention are all window layers or all state layers");
    if (values[CLI_SF_WINDOW] != NULL) {
        if ((rc = cli__shape_number(cmd, values, CLI_SF_WINDOW, 1, CLI_SHAPE_MAX_TOKENS,
                                    &p->window_tokens)) != 0)
            return rc;
        p->other_layers = KVS_LAYER_WINDOW;
        p->state_heads = p->state_conv_bytes = p->state_ssm_bytes = 0;
    }
    if (values[CLI_SF_STATE_HEADS] != NULL) {
        if ((rc = cli__shape_number(cmd, values, CLI_SF_STATE_HEADS, 1, CLI_SHAPE_MAX_HEADS,
                                    &p->state_heads)) != 0)
            return rc;
        p->other_layers = KVS_LAYER_STATE;
        p->window_tokens = 0;
        if (values[CLI_SF_STATE_BYTES] == NULL)
            return cli_fail(cmd, "--state-heads needs --state-bytes CONV+SSM: the bytes of "
                                 "one state head's conv and recurrent state of one request");
    }
    const char *sb = values[CLI_SF_STATE_BYTES];
    if (sb != NULL) {
        if (p->other_layers != KVS_LAYER_STATE)
            return cli_fail(cmd, "--state-bytes %s without state layers: give --state-heads "
                                 "(or a hybrid --model with state layers)", sb);
        char conv[32] = "", ssm[32] = "";
        const char *plus = strchr(sb, '+');
        const size_t n = plus != NULL ? (size_t)(plus - sb) : 0;
        if (plus != NULL && (n == 0 || n >= sizeof conv || strlen(plus + 1) >= sizeof ssm))
            return cli_fail(cmd, "--state-bytes: '%s' is not CONV+SSM or N (bytes of one "
                                 "state head of one request)", sb);
        if (plus != NULL) {
            memcpy(conv, sb, n);
            snprintf(ssm, sizeof ssm, "%s", plus + 1);
            if ((rc = cli_parse_i64(cmd, "--state-bytes (conv part)", conv, 0, INT32_MAX,
                                    &p->state_conv_bytes)) != 0 ||
                (rc = cli_parse_i64(cmd, "--state-bytes (ssm part)", ssm, 0, INT32_MAX,
                                    &p->state_ssm_bytes)) != 0)
                return rc;
        } else {
            p->state_conv_bytes = 0;
            if ((rc = cli_parse_i64(cmd, "--state-bytes", sb, 1, INT32_MAX,
                                    &p->state_ssm_bytes)) != 0)
                return rc;
        }
    }
    return 0;
}

int cli_shape_read(const char *cmd, const char *const *values,
                   const cli_shape_defaults_t *defaults, cli_shape_t *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    kvs_layout_params_t *p = &out->params;
    p->dtype = KVS_DTYPE_BF16;
    p->page_size = defaults->page_size;
    p->prefill_tp = defaults->prefill_tp;
    p->decode_tp = defaults->decode_tp;
    p->prefill_pp = 1;
    p->decode_pp = 1;
    p->prefill_cp = 1;
    p->chunk_tokens = defaults->chunk_tokens;

    const char *model_name = values[CLI_SF_MODEL];
    bool explicit_model = model_name != NULL;
    if (!explicit_model)
        model_name = defaults->model;
    if (model_name != NULL) {
        out->model = cli_model_find(model_name);
        if (out->model == NULL)
            return cli__shape_model_fail(cmd, model_name);
        p->total_heads = out->model->total_heads;
        p->head_dim = out->model->head_dim;
        p->layers = out->model->layers;
        p->dtype = out->model->dtype;
        p->kind = out->model->kind;
        /* Hybrid layers (docs/kinds/hybrid.md): the model's pattern. */
        p->full_attn_every = out->model->full_attn_every;
        p->other_layers = out->model->other_layers;
        p->window_tokens = out->model->window_tokens;
        p->state_heads = out->model->state_heads;
        p->state_conv_bytes = out->model->state_conv_bytes;
        p->state_ssm_bytes = out->model->state_ssm_bytes;
    }
    /* An MLA model by its latent: one "head" of that many elements. */
    if (values[CLI_SF_MLA_LATENT_DIM] != NULL) {
        if (values[CLI_SF_HEAD_DIM] != NULL)
            return cli_fail(cmd, "--mla-latent-dim and --head-dim: give one; an MLA "
                                 "model's head dim is its latent dim");
        if ((rc = cli__shape_number(cmd, values, CLI_SF_MLA_LATENT_DIM, 1,
                                    CLI_SHAPE_MAX_HEAD_DIM, &p->head_dim)) != 0)
            return rc;
        p->kind = KVS_KV_MLA;
        p->total_heads = 0;
    }
    if (p->kind == KVS_KV_MLA && values[CLI_SF_KV_HEADS] != NULL &&
        strcmp(values[CLI_SF_KV_HEADS], "1") != 0)
        return cli_fail(cmd, "--kv-heads %s: an MLA model keeps one latent per token: drop "
                             "--kv-heads (or give 1), or drop --mla-latent-dim / the MLA "
                             "--model", values[CLI_SF_KV_HEADS]);

    if ((rc = cli__shape_number(cmd, values, CLI_SF_KV_HEADS, 1,
                                CLI_SHAPE_MAX_HEADS, &p->total_heads)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_HEAD_DIM, 1,
                                CLI_SHAPE_MAX_HEAD_DIM, &p->head_dim)) != 0)
        return rc;
    if (values[CLI_SF_DTYPE] != NULL &&
        kvs_dtype_parse(values[CLI_SF_DTYPE], &p->dtype) != KVS_OK)
        return cli_fail(cmd, "--dtype: unknown dtype '%s': use bf16, fp16, fp8 "
                             "or fp32", values[CLI_SF_DTYPE]);
    if ((rc = cli__shape_number(cmd, values, CLI_SF_LAYERS, 1,
                                CLI_SHAPE_MAX_LAYERS, &p->layers)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_PAGE_SIZE, 1,
                                CLI_SHAPE_MAX_PAGE_SIZE, &p->page_size)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_DECODE_PAGE_SIZE, 1,
                                CLI_SHAPE_MAX_PAGE_SIZE, &p->decode_page_size)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_PREFILL_TP, 1,
                                CLI_SHAPE_MAX_TP, &p->prefill_tp)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_DECODE_TP, 1,
                                CLI_SHAPE_MAX_TP, &p->decode_tp)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_PREFILL_PP, 1,
                                CLI_SHAPE_MAX_PP, &p->prefill_pp)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_DECODE_PP, 1,
                                CLI_SHAPE_MAX_PP, &p->decode_pp)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_PREFILL_CP, 1,
                                CLI_SHAPE_MAX_TP, &p->prefill_cp)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_CHUNK_TOKENS, 0,
                                CLI_SHAPE_MAX_CHUNK_TOKENS, &p->chunk_tokens)) != 0)
        return rc;

    /* FP8 KV with scale planes (docs/kinds/fp8-scales.md): none,
     * per-token or per-block[:N]; the planner checks the dtype and block. */
    if (values[CLI_SF_KV_SCALES] != NULL &&
        kvs_kv_scales_parse(values[CLI_SF_KV_SCALES], &p->kv_scales, &p->scale_block) != KVS_OK)
        return cli_fail(cmd, "--kv-scales: unknown scales '%s': use none, per-token (one "
                             "fp32 per token and head) or per-block[:N] (one e8m0 byte per N "
                             "elements, 32 by default)", values[CLI_SF_KV_SCALES]);

    if ((rc = cli__shape_hybrid(cmd, values, p)) != 0)
        return rc;
    /* A draft model's layers (docs/kinds/draft.md); the planner checks
     * that they fit the model. */
    if ((rc = cli__shape_number(cmd, values, CLI_SF_DRAFT_LAYERS, 0, CLI_SHAPE_MAX_LAYERS,
                                &p->draft_layers)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_DRAFT_HEAD_DIM, 1,
                                CLI_SHAPE_MAX_HEAD_DIM, &p->draft_head_dim)) != 0 ||
        (rc = cli__shape_number(cmd, values, CLI_SF_DRAFT_KV_HEADS, 1, CLI_SHAPE_MAX_HEADS,
                                &p->draft_kv_heads)) != 0)
        return rc;

    /* A default model whose every number the flags replace names nothing
     * (an MLA latent replaces both its heads and its head dim). */
    if (!explicit_model && values[CLI_SF_LAYERS] != NULL &&
        ((values[CLI_SF_KV_HEADS] != NULL && values[CLI_SF_HEAD_DIM] != NULL) ||
         values[CLI_SF_MLA_LATENT_DIM] != NULL))
        out->model = NULL;

    static const struct {
        enum cli_shape_flag flag;
        const char *what;
    } required[] = {
        {CLI_SF_KV_HEADS, "the model's total KV heads"},
        {CLI_SF_HEAD_DIM, "the head dimension"},
        {CLI_SF_LAYERS, "the model's layers"},
    };
    const int64_t *required_value[] = {&p->total_heads, &p->head_dim, &p->layers};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (i == 0 && p->kind == KVS_KV_MLA)
            continue; /* one latent: no KV heads to give */
        if (*required_value[i] == 0)
            return cli_fail(cmd, "%s is required (%s) unless --model names a "
                                 "built-in model",
                            cli__shape_flags[required[i].flag].name,
                            required[i].what);
    }
    if (p->prefill_tp == 0)
        return cli_fail(cmd, "--prefill-tp is required: the prefill attention "
                             "TP size");
    if (p->decode_tp == 0)
        return cli_fail(cmd, "--decode-tp is required: the decode attention "
                             "TP size");
    return 0;
}

static bool cli__shape_divides(int64_t a, int64_t b)
{
    return a % b == 0 || b % a == 0;
}

const char *cli_shape_flag_for(int status, const kvs_layout_params_t *p)
{
    switch (status) {
    case KVS_EHEAD_SPLIT:
        if (p->full_attn_every > 1 && p->state_heads > 0 &&
            cli__shape_divides(p->total_heads, p->prefill_tp) &&
            cli__shape_divides(p->total_heads, p->decode_tp) &&
            (!cli__shape_divides(p->state_heads, p->prefill_tp) ||
             !cli__shape_divides(p->state_heads, p->decode_tp)))
            return "--state-heads (or the TP sizes)";
        if (!cli__shape_divides(p->total_heads, p->prefill_tp))
            return "--prefill-tp (or --kv-heads)";
        if (!cli__shape_divides(p->total_heads, p->decode_tp))
            return "--decode-tp (or --kv-heads)";
        return "--decode-tp (or --prefill-tp)";
    case KVS_EPP_SPLIT:
        if (p->decode_pp != 1 && p->decode_pp != p->prefill_pp)
            return "--decode-pp";
        return "--prefill-pp (or --layers)"; /* fewer layers than stages */
    case KVS_ECHUNK:
        return p->decode_page_size > 0 && p->decode_page_size != p->page_size
                   ? "--chunk-tokens (or --page-size / --decode-page-size)"
                   : "--chunk-tokens (or --page-size)";
    case KVS_EDTYPE:
        return p->kv_scales != KVS_KV_SCALES_NONE ? "--dtype (or --kv-scales)" : "--dtype";
    case KVS_EHEADS:
        return "--kv-heads";
    case KVS_ENOTSUP:
        return p->draft_layers > 0 ? "--draft-layers (or --draft-kv-heads)" : "the shape flags";
    case KVS_EINVAL:
        if (p->prefill_cp < 0)
            return "--prefill-cp";
        if (p->draft_layers == 0 && (p->draft_head_dim != 0 || p->draft_kv_heads != 0))
            return "--draft-layers (or --draft-head-dim / --draft-kv-heads)";
        if (p->full_attn_every != 0 || p->window_tokens != 0 || p->state_heads != 0 ||
            p->state_conv_bytes != 0 || p->state_ssm_bytes != 0)
            return "--full-attn-every / --window / --state-heads / --state-bytes";
        return p->kv_scales != KVS_KV_SCALES_NONE ? "--kv-scales (or --head-dim)"
                                                  : "the shape flags";
    case KVS_EMLA:
        return "--kv-heads (an MLA model has one latent per token)";
    default:
        return "the shape flags";
    }
}

int cli_shape_layout(const char *cmd, const cli_shape_t *shape,
                     kvs_layout_t *lay)
{
    /* Spec §8: the chunk must be whole pages (the planner alone would
     * floor it; a manager with staging on refuses it), and 0 means 8192,
     * so the default needs a page size dividing 8192. */
    const kvs_layout_params_t *p = &shape->params;
    const int64_t chunk = p->chunk_tokens > 0 ? p->chunk_tokens : KVS_DEFAULT_CHUNK_TOKENS;
    if (p->page_size > 0 && chunk % p->page_size != 0) {
        const int64_t fit = chunk / p->page_size > 0 ? chunk / p->page_size * p->page_size
                                                     : p->page_size;
        return cli_fail(cmd, "--chunk-tokens: %s%" PRId64 "%s not a multiple of "
                             "--page-size %" PRId64 ": give --chunk-tokens a multiple "
                             "of %" PRId64 " (e.g. %" PRId64 "), or another --page-size",
                        p->chunk_tokens > 0 ? "" : "0 means ", chunk,
                        p->chunk_tokens > 0 ? " is" : ", which is", p->page_size,
                        p->page_size, fit);
    }
    /* Different page sizes: a chunk covers whole pages of each side. */
    const int64_t dps = p->decode_page_size;
    if (dps > 0 && chunk % dps != 0) {
        int64_t a = p->page_size, b = dps; /* lcm: the smallest chunk that fits */
        while (b != 0) {
            const int64_t t = a % b;
            a = b;
            b = t;
        }
        return cli_fail(cmd, "--chunk-tokens: %s%" PRId64 "%s not a multiple of "
                             "--decode-page-size %" PRId64 ": give --chunk-tokens a multiple "
                             "of both page sizes (of %" PRId64 "), or another "
                             "--decode-page-size",
                        p->chunk_tokens > 0 ? "" : "0 means ", chunk,
                        p->chunk_tokens > 0 ? " is" : ", which is", dps,
                        p->page_size / a * dps);
    }
    kvs_error_t err;
    memset(&err, 0, sizeof err);
    int rc = kvs_layout_init(lay, &shape->params, &err);
    if (rc == KVS_OK)
        return 0;
    return cli_fail(cmd, "change %s: %s (%s)",
                    cli_shape_flag_for(rc, &shape->params),
                    err.msg[0] != '\0' ? err.msg : kvs_strerror(rc),
                    kvs_status_name(rc));
}

void cli_shape_models_usage(FILE *out)
{
    for (size_t i = 0; i < cli_model_count(); i++) {
        const cli_model_t *m = cli_model_at(i);
        fprintf(out, "  %-16s %3" PRId64 " %4" PRId64 " %4" PRId64 "  %-5s %-3s %s\n",
                m->name, m->total_heads, m->head_dim, m->layers,
                kvs_dtype_name(m->dtype), kvs_kv_kind_name(m->kind), m->note);
    }
}
