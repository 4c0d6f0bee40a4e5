/*
 * sim_consumer.c - a program outside the kvstage tree that runs a small
 * simulated scenario through an installed libkvstage_sim (kvs_sim_run) and
 * prints how many requests finished ok, the bytes verified and the event
 * digest (the test compares them with `kvstage sim --json`); with
 * "bad" as its argument it passes a bad TP size and prints the error.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <kvstage/sim.h>

int main(int argc, char **argv)
{
    kvs_sim_config_t cfg;
    kvs_sim_config_init(&cfg);
    const kvs_model_t *m = kvs_model_find("llama-3.1-8b");
    if (m == NULL)
        return 1;
    cfg.total_heads = m->total_heads;
    cfg.head_dim = m->head_dim;
    cfg.layers = 4;
    cfg.page_size = 16;
    cfg.chunk_tokens = 512;
    cfg.prefill_tp = 4;
    cfg.decode_tp = argc > 1 && strcmp(argv[1], "bad") == 0 ? 3 : 2;
    cfg.requests = 4;
    cfg.prompt_min_tokens = 64;
    cfg.prompt_max_tokens = 256;
    cfg.ring_bytes = 64u << 20;
    kvs_sim_report_t rep = {.size_bytes = sizeof rep};
    kvs_error_t err;
    int rc = kvs_sim_run(&cfg, &rep, &err);
    if (rc != KVS_OK) {
        printf("error %s: %s\n", kvs_status_name(rc), err.msg);
        return 1;
    }
    printf("requests_ok %" PRIu32 " of %" PRIu32 ", bytes_verified %" PRIu64
           ", violations %" PRIu64 ", digest %016" PRIx64 "\n",
           rep.requests_ok, rep.requests_total, rep.bytes_verified, rep.violations,
           rep.digest);
    return 0;
}
