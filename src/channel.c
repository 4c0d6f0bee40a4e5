/*
 * channel.c - sending control messages (encode into a stack buffer, one
 * fabric SEND) and the registration fingerprint. Receiving is the handlers'
 * poll loop: they decode each RECV with kvs__wire_decode.
 */
#include "channel.h"

#include <stdio.h>

int kvs__channel_send(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_msg_t *msg,
                      kvs_handler_stats_t *stats)
{
    uint8_t buf[KVS_CONTROL_MSG_MAX_BYTES];
    uint32_t len = 0;
    int rc = kvs__wire_encode(msg, buf, sizeof buf, &len);
    if (rc != KVS_OK)
        return rc;
    rc = fab->ops.send(fab, conn, buf, len, KVS__WR_CONTROL | (uint64_t)msg->type);
    if (rc == KVS_OK && stats != NULL)
        stats->msgs_sent++;
    return rc;
}

void kvs__fingerprint(const kvs_layout_t *lay, kvs_path_t path, const kvs_manager_config_t *cfg,
                      kvs_fingerprint_t *out)
{
    *out = (kvs_fingerprint_t){
        .protocol_version = KVS_WIRE_VERSION,
        .staging = (uint32_t)path,
        .kv_kind = (uint32_t)lay->kind,
        .total_heads = lay->total_heads,
        .head_dim = lay->head_dim,
        .layers = lay->layers,
        .prefill_page_size = lay->page_size,
        .decode_page_size = lay->decode_page_size,
        .chunk_tokens = lay->chunk_tokens,
        .prefill_tp = lay->prefill_tp,
        .decode_tp = lay->decode_tp,
        .prefill_pp = lay->prefill_pp,
        .decode_pp = lay->decode_pp,
        .dtype = (uint32_t)lay->dtype, /* bf16 and fp16 share a size, not a format */
        .app_tag = cfg->app_tag,
        .max_aux_bytes = cfg->max_aux_bytes,
        .kv_scales = (uint32_t)lay->kv_scales,
        .scale_block = (uint32_t)lay->scale_block,
        .prefill_cp = lay->prefill_cp,
        .full_attn_every = (uint32_t)lay->full_attn_every,
        .other_layers = (uint32_t)lay->other_layers,
        .window_tokens = lay->window_tokens,
        .state_heads = lay->state_heads,
        .state_conv_bytes = lay->state_conv_bytes,
        .state_ssm_bytes = lay->state_ssm_bytes,
        .draft_layers = lay->draft_layers,
        .draft_head_dim = lay->draft_head_dim,
    };
}

int kvs__fingerprint_check(const kvs_fingerprint_t *mine, const kvs_fingerprint_t *theirs,
                           char *why, size_t why_bytes)
{
    /* What to change when a page size differs: each side declares both. */
    static const char ps_hint[] =
        "declare the same two sizes on both sides (page_size and peer_page_size; "
        "--page-size / --decode-page-size)";
    const struct {
        const char *name;
        int64_t a, b;
        const char *hint; /* NULL: run both sides with the same setting */
    } f[] = {
        {"protocol version", mine->protocol_version, theirs->protocol_version, NULL},
        {"transfer path (staging on/off, --path)", mine->staging, theirs->staging, NULL},
        /* Before the shape: a GQA side and an MLA side differ in heads and
         * head dim too, and the kind is what to fix. */
        {"KV kind (0 gqa: K and V per layer, 1 mla: one latent per layer; kv_kind, "
         "--model / --mla-latent-dim)", mine->kv_kind, theirs->kv_kind, NULL},
        {"total KV heads", mine->total_heads, theirs->total_heads, NULL},
        {"head dim (MLA: the latent dim, --mla-latent-dim)", mine->head_dim, theirs->head_dim,
         NULL},
        {"model layers", mine->layers, theirs->layers, NULL},
        /* Each side declares both (its own and its peer's): they may
         * differ, but must be agreed (docs/kinds/page-sizes.md). */
        {"prefill page size", mine->prefill_page_size, theirs->prefill_page_size, ps_hint},
        {"decode page size", mine->decode_page_size, theirs->decode_page_size, ps_hint},
        {"chunk tokens", mine->chunk_tokens, theirs->chunk_tokens, NULL},
        {"dtype (0 bf16, 1 fp16, 2 fp8, 3 fp32)", mine->dtype, theirs->dtype, NULL},
        /* An FP8 side with scale planes against one without would move
         * rows whose scales never arrive (docs/kinds/fp8-scales.md). */
        {"KV scales (0 none, 1 per-token, 2 per-block; kv_scales, --kv-scales)",
         mine->kv_scales, theirs->kv_scales, NULL},
        {"scale block (elements per e8m0 scale; scale_block, --kv-scales per-block:N)",
         mine->scale_block, theirs->scale_block, NULL},
        /* A hybrid model's layer pattern: which layers move all their
         * pages, which a window's, which a state (docs/kinds/hybrid.md). */
        {"full attention every k-th layer (0: all; full_attn_every, --full-attn-every)",
         mine->full_attn_every, theirs->full_attn_every, NULL},
        {"other layers' kind (1 window, 2 state; other_layers, --window / --state-heads)",
         mine->other_layers, theirs->other_layers, NULL},
        {"sliding window tokens (window_tokens, --window)", mine->window_tokens,
         theirs->window_tokens, NULL},
        {"state heads (state_heads, --state-heads)", mine->state_heads, theirs->state_heads,
         NULL},
        {"conv state bytes per head (state_conv_bytes, --state-bytes C+S)",
         mine->state_conv_bytes, theirs->state_conv_bytes, NULL},
        {"recurrent state bytes per head (state_ssm_bytes, --state-bytes C+S)",
         mine->state_ssm_bytes, theirs->state_ssm_bytes, NULL},
        /* A draft model's KV ends each writer block (docs/kinds/draft.md):
         * a side that sends one and a side that expects none would read
         * each other's blocks at other offsets. */
        {"draft layers (0: no draft; draft_layers, --draft-layers)", mine->draft_layers,
         theirs->draft_layers, NULL},
        {"draft head dim (draft_head_dim, --draft-head-dim)", mine->draft_head_dim,
         theirs->draft_head_dim, NULL},
        /* Both sides must agree on the whole layout: which ranks write to
         * which, how many writers a chunk waits for, whose layers. */
        {"prefill TP size (--prefill-tp)", mine->prefill_tp, theirs->prefill_tp, NULL},
        {"decode TP size (--decode-tp)", mine->decode_tp, theirs->decode_tp, NULL},
        {"prefill PP size (--prefill-pp)", mine->prefill_pp, theirs->prefill_pp, NULL},
        {"decode PP size (--decode-pp)", mine->decode_pp, theirs->decode_pp, NULL},
        /* How many CP ranks write a request, and so which token ranges
         * each holds (docs/kinds/context-parallel.md). */
        {"prefill CP size (context_parallel, kvs_instance_desc_t.cp_size; --prefill-cp)",
         mine->prefill_cp, theirs->prefill_cp, NULL},
        /* What else the application needs both sides to share. */
        {"application tag (app_tag; serve: --seed/--requests/--prompt-tokens)",
         mine->app_tag, theirs->app_tag, NULL},
        {"largest aux payload (max_aux_bytes)", mine->max_aux_bytes, theirs->max_aux_bytes,
         NULL},
        /* 0 in this protocol version: a peer that sets it speaks another. */
        {"reserved field (0 in this protocol version)", mine->reserved, theirs->reserved,
         NULL},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (f[i].a != f[i].b) {
            snprintf(why, why_bytes, "%s differs: this side %lld, peer %lld; %s", f[i].name,
                     (long long)f[i].a, (long long)f[i].b,
                     f[i].hint != NULL ? f[i].hint : "run both sides with the same setting");
            return KVS_EFINGERPRINT;
        }
    }
    return KVS_OK;
}
