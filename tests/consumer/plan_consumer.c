/*
 * plan_consumer.c - a program outside the kvstage tree that uses an
 * installed libkvstage (tests/install_consumer.sh builds it through
 * pkg-config and through find_package): plans Llama-3.1-70B at prefill TP 8
 * x PP 3 -> decode TP 2 x PP 3 (80 layers split unevenly, 26 / 27 / 27) and
 * prints the largest staging region of a full chunk, which the test
 * compares with `kvstage plan --json`.
 */
#include <inttypes.h>
#include <stdio.h>

#include <kvstage/kvstage.h>

int main(void)
{
    const kvs_model_t *m = kvs_model_find("llama-3.1-70b");
    if (m == NULL) {
        fprintf(stderr, "plan_consumer: llama-3.1-70b is not a built-in model\n");
        return 1;
    }
    kvs_layout_params_t p = {.total_heads = m->total_heads, .head_dim = m->head_dim,
                             .dtype = m->dtype, .layers = m->layers, .page_size = 1,
                             .prefill_tp = 8, .decode_tp = 2, .prefill_pp = 3,
                             .decode_pp = 3};
    kvs_layout_t lay;
    kvs_error_t err;
    int rc = kvs_layout_init(&lay, &p, &err);
    if (rc != KVS_OK) {
        fprintf(stderr, "plan_consumer: %s: %s\n", kvs_status_name(rc), err.msg);
        return 1;
    }
    /* The largest region is the last stage's: it holds the most layers. */
    int64_t first = 0, layers = 0;
    rc = kvs_layout_stage_layers(&lay, KVS_ROLE_DECODE, 2, &first, &layers);
    if (rc != KVS_OK || first != 53 || layers != 27 || lay.decode_layers != 27) {
        fprintf(stderr, "plan_consumer: decode stage 2 holds layers %" PRId64 "+%" PRId64
                " (%s), not 53+27\n", first, layers, kvs_status_name(rc));
        return 1;
    }
    printf("max_region_bytes %" PRId64 "\n", kvs_layout_max_region_bytes(&lay));
    return 0;
}
