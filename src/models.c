/*
 * models.c - built-in model shapes by name (kvs_model_find): what the layout
 * planner needs from a well-known model. The numbers are the models'
 * published configs (num_key_value_heads; head_dim where the config gives
 * one, as Qwen3's and Llama 4's do, else hidden_size / num_attention_heads;
 * num_hidden_layers); the KV dtype is the usual bf16. A MoE model's KV is
 * that of its attention layers alone: experts hold no KV. An MLA model (kind KVS_KV_MLA) has one "head": its latent of
 * kv_lora_rank + qk_rope_head_dim elements.
 * Hybrid models (docs/kinds/hybrid.md, where the sources are cited) also
 * give their layer pattern: gpt-oss alternates 128-token sliding-window
 * layers with full ones (layer 0 a window layer: full_attn_every 2);
 * Qwen3-Next has three Gated DeltaNet layers, then a full one
 * (full_attention_interval 4), each DeltaNet layer a per-request state of
 * 16 state heads (linear_num_key_heads): a head's conv state is its 512
 * channels (q 128 + k 128 + its 2 value heads' 2 x 128) x (conv kernel 4 -
 * 1) bf16 = 3072 bytes, its recurrent state its 2 value heads x 128 x 128
 * bf16 = 65536 bytes.
 * Add a model by adding a row; names stay lower case. Read-only static
 * data: no state.
 */
#include <kvstage/kvstage.h>

#include <ctype.h>

/* A model of full attention layers alone: no window or state layers. */
#define KVS__FULL_ONLY 0, KVS_LAYER_FULL, 0, 0, 0, 0

static const kvs_model_t kvs__models[] = {
    {"llama-3.1-8b", 8, 128, 32, KVS_DTYPE_BF16, "Llama 3.1 8B", KVS_KV_GQA, KVS__FULL_ONLY},
    {"llama-3.1-70b", 8, 128, 80, KVS_DTYPE_BF16, "Llama 3.1 70B", KVS_KV_GQA, KVS__FULL_ONLY},
    {"llama-3.1-405b", 8, 128, 126, KVS_DTYPE_BF16, "Llama 3.1 405B", KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen2.5-7b", 4, 128, 28, KVS_DTYPE_BF16,
     "Qwen2.5 7B: 4 KV heads, replicated at TP 8", KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen2.5-72b", 8, 128, 80, KVS_DTYPE_BF16, "Qwen2.5 72B", KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen2.5-1.5b", 2, 128, 28, KVS_DTYPE_BF16,
     "Qwen2.5 1.5B: 2 KV heads, replicated at TP > 2", KVS_KV_GQA, KVS__FULL_ONLY},
    {"chatglm3-6b", 2, 128, 28, KVS_DTYPE_BF16,
     "ChatGLM3 6B: 2 KV groups, replicated at TP > 2", KVS_KV_GQA, KVS__FULL_ONLY},
    {"llama-3.2-1b", 8, 64, 16, KVS_DTYPE_BF16, "Llama 3.2 1B: head dim 64", KVS_KV_GQA, KVS__FULL_ONLY},
    {"llama-3.2-3b", 8, 128, 28, KVS_DTYPE_BF16, "Llama 3.2 3B", KVS_KV_GQA, KVS__FULL_ONLY},
    {"llama-3.3-70b", 8, 128, 80, KVS_DTYPE_BF16, "Llama 3.3 70B: Llama 3.1 70B's shape",
     KVS_KV_GQA, KVS__FULL_ONLY},
    {"llama-4-scout", 8, 128, 48, KVS_DTYPE_BF16,
     "Llama 4 Scout 17B-16E (MoE); chunked attention layers pooled in full", KVS_KV_GQA, KVS__FULL_ONLY},
    {"llama-4-maverick", 8, 128, 48, KVS_DTYPE_BF16,
     "Llama 4 Maverick 17B-128E (MoE); chunked attention layers pooled in full", KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen3-0.6b", 8, 128, 28, KVS_DTYPE_BF16, "Qwen3 0.6B: head dim 128 > hidden / heads",
     KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen3-8b", 8, 128, 36, KVS_DTYPE_BF16, "Qwen3 8B", KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen3-14b", 8, 128, 40, KVS_DTYPE_BF16, "Qwen3 14B", KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen3-32b", 8, 128, 64, KVS_DTYPE_BF16, "Qwen3 32B", KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen3-30b-a3b", 4, 128, 48, KVS_DTYPE_BF16,
     "Qwen3 30B-A3B (MoE): 4 KV heads, replicated at TP 8", KVS_KV_GQA, KVS__FULL_ONLY},
    {"qwen3-235b-a22b", 4, 128, 94, KVS_DTYPE_BF16,
     "Qwen3 235B-A22B (MoE): 4 KV heads, replicated at TP 8", KVS_KV_GQA, KVS__FULL_ONLY},
    /* MLA: kv_lora_rank 512 + qk_rope_head_dim 64 = one 576-element latent
     * per token and layer, the same on every TP rank (kind KVS_KV_MLA). */
    {"deepseek-v3", 1, 576, 61, KVS_DTYPE_BF16,
     "DeepSeek-V3: MLA, one 576-element latent per token (512 + 64 rope)", KVS_KV_MLA, KVS__FULL_ONLY},
    {"kimi-k2", 1, 576, 61, KVS_DTYPE_BF16,
     "Kimi K2: MLA as DeepSeek-V3, one 576-element latent per token", KVS_KV_MLA, KVS__FULL_ONLY},
    /* Hybrid: sliding-window layers (128 tokens) alternating with full
     * ones; 8 KV heads of 64. */
    {"gpt-oss-20b", 8, 64, 24, KVS_DTYPE_BF16,
     "gpt-oss 20B (MoE): 12 full + 12 window-128 layers", KVS_KV_GQA, 2, KVS_LAYER_WINDOW,
     128, 0, 0, 0},
    {"gpt-oss-120b", 8, 64, 36, KVS_DTYPE_BF16,
     "gpt-oss 120B (MoE): 18 full + 18 window-128 layers", KVS_KV_GQA, 2, KVS_LAYER_WINDOW,
     128, 0, 0, 0},
    /* Hybrid: 36 Gated DeltaNet state layers and 12 full attention layers
     * of 2 KV heads of 256. */
    {"qwen3-next-80b-a3b", 2, 256, 48, KVS_DTYPE_BF16,
     "Qwen3-Next 80B-A3B: 12 full + 36 DeltaNet state layers", KVS_KV_GQA, 4,
     KVS_LAYER_STATE, 0, 16, 3072, 65536},
};

#define KVS__MODEL_COUNT (sizeof kvs__models / sizeof kvs__models[0])

static int kvs__name_equal(const char *a, const char *b)
{
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
            return 0;
    }
    return *a == '\0' && *b == '\0';
}

const kvs_model_t *kvs_model_find(const char *name)
{
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < KVS__MODEL_COUNT; i++) {
        if (kvs__name_equal(kvs__models[i].name, name))
            return &kvs__models[i];
    }
    return NULL;
}

size_t kvs_model_count(void)
{
    return KVS__MODEL_COUNT;
}

const kvs_model_t *kvs_model_at(size_t i)
{
    return i < KVS__MODEL_COUNT ? &kvs__models[i] : NULL;
}
