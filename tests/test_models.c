/*
 * test_models.c - the built-in model table (kvs_model_find): names are
 * unique and lower case, lookup ignores ASCII case, unknown names and
 * out-of-range indices give NULL, and every model plans a valid layout at
 * TP 8 -> 2 (replicated heads included).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <string.h>

#include <kvstage/kvstage.h>

static void test_models_known_shape(void **state)
{
    const kvs_model_t *m = kvs_model_find("llama-3.1-70b");
    assert_non_null(m);
    assert_string_equal(m->name, "llama-3.1-70b");
    assert_int_equal(m->total_heads, 8);
    assert_int_equal(m->head_dim, 128);
    assert_int_equal(m->layers, 80);
    assert_int_equal(m->dtype, KVS_DTYPE_BF16);
    assert_true(strlen(m->note) > 0);
}

/* Shapes a config's other fields would get wrong: Qwen3 0.6B's head_dim
 * (128) is not hidden_size / num_attention_heads (64); MoE models keep the
 * KV of their attention layers only (Qwen3 235B: 4 KV heads over 94
 * layers; Llama 4 Scout: 8 over 48). */
static void test_models_current_families_shapes(void **state)
{
    const struct {
        const char *name;
        int64_t heads, head_dim, layers;
    } want[] = {
        {"qwen3-0.6b", 8, 128, 28},      {"qwen3-32b", 8, 128, 64},
        {"qwen3-235b-a22b", 4, 128, 94}, {"qwen3-30b-a3b", 4, 128, 48},
        {"llama-4-scout", 8, 128, 48},   {"llama-3.2-1b", 8, 64, 16},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kvs_model_t *m = kvs_model_find(want[i].name);
        assert_non_null(m);
        assert_int_equal(m->total_heads, want[i].heads);
        assert_int_equal(m->head_dim, want[i].head_dim);
        assert_int_equal(m->layers, want[i].layers);
    }
}

static void test_models_lookup_ignores_case(void **state)
{
    assert_ptr_equal(kvs_model_find("Qwen2.5-7B"), kvs_model_find("qwen2.5-7b"));
    assert_non_null(kvs_model_find("QWEN2.5-7B"));
}

static void test_models_unknown_is_null(void **state)
{
    assert_null(kvs_model_find(NULL));
    assert_null(kvs_model_find(""));
    assert_null(kvs_model_find("llama-3.1"));
    assert_null(kvs_model_find("llama-3.1-70bx"));
    assert_null(kvs_model_at(kvs_model_count()));
    assert_null(kvs_model_at((size_t)-1));
}

static void test_models_names_unique_lower_case_and_plannable(void **state)
{
    assert_true(kvs_model_count() >= 7);
    for (size_t i = 0; i < kvs_model_count(); i++) {
        const kvs_model_t *m = kvs_model_at(i);
        assert_non_null(m);
        for (const char *c = m->name; *c != '\0'; c++)
            assert_false(isupper((unsigned char)*c));
        assert_ptr_equal(kvs_model_find(m->name), m);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(kvs_model_at(j)->name, m->name);
        kvs_layout_params_t p = {.total_heads = m->total_heads, .head_dim = m->head_dim,
                                 .dtype = m->dtype, .layers = m->layers, .page_size = 16,
                                 .prefill_tp = 8, .decode_tp = 2, .kind = m->kind};
        kvs_layout_t lay;
        assert_int_equal(kvs_layout_init(&lay, &p, NULL), KVS_OK);
        assert_int_equal(lay.total_heads, m->total_heads);
    }
}

static void test_models_mla_rows_are_one_latent_per_token(void **state)
{
    (void)state;
    const char *names[] = {"deepseek-v3", "kimi-k2"};
    for (size_t i = 0; i < 2; i++) {
        const kvs_model_t *m = kvs_model_find(names[i]);
        assert_non_null(m);
        assert_int_equal(m->kind, KVS_KV_MLA);
        assert_int_equal(m->total_heads, 1);
        assert_int_equal(m->head_dim, 512 + 64); /* kv_lora_rank + qk_rope_head_dim */
        assert_int_equal(m->layers, 61);
        assert_int_equal(m->dtype, KVS_DTYPE_BF16);
    }
    /* The GQA rows keep their zero kind. */
    assert_int_equal(kvs_model_find("llama-3.1-70b")->kind, KVS_KV_GQA);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models_known_shape),
        cmocka_unit_test(test_models_current_families_shapes),
        cmocka_unit_test(test_models_lookup_ignores_case),
        cmocka_unit_test(test_models_unknown_is_null),
        cmocka_unit_test(test_models_names_unique_lower_case_and_plannable),
        cmocka_unit_test(test_models_mla_rows_are_one_latent_per_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
