/*
 * wire_seeds.c - makes fuzz_wire's seed corpus (the .bin files of fuzz/corpus/wire)
 * from the wire encoder itself, one message per seed, its fields set by
 * name: a field added to a message or to the fingerprint lands in every
 * seed at once, so a wire version bump no longer means editing binary
 * files by hand.
 *
 *     wire_seeds DIR            writes the seeds into DIR
 *     wire_seeds --check DIR    exits 1, naming each seed, when DIR's
 *                               differ from what the encoder makes now
 *
 * ctest wire_seeds_current runs the check on fuzz/corpus/wire. The two
 * aux_*.bin seeds are not messages (a type byte and a bare payload for the
 * fuzzer's framed mode) and are left as they are.
 */
#include "wire.h"

#include "wire_fixture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SESSION 0x4142434445464748ull
#define ROOM 0x5EED00000000002Aull

typedef struct seed {
    const char *name;
    kvs_msg_t msg;
} seed_t;

static void fill_b32(kvs_b32_t *b, uint8_t first)
{
    for (unsigned i = 0; i < sizeof b->b; i++)
        b->b[i] = (uint8_t)(first + i);
}

/* Every seed: a message of each type, and the variants of REGISTER,
 * REGISTER_ACK, LAYERS and STAGING_RSP whose fields steer the decoder and
 * the fingerprint check down other branches. */
static size_t make_seeds(seed_t *s, size_t cap)
{
    kvs_fingerprint_t fp;
    if (!wire_local_fingerprint(&fp))
        return 0;
    size_t n = 0;
#define SEED(nm, TYPE) (s[n] = (seed_t){.name = (nm), .msg = {.type = KVS_MSG_##TYPE, .seq = 1, \
                                                              .session = SESSION}}, \
                        &s[n++].msg)
    kvs_msg_t *m = SEED("hello", HELLO);
    fill_b32(&m->u.hello.nonce, 0x10);

    m = SEED("challenge", CHALLENGE);
    m->u.challenge.echo = SESSION + 1;
    m->u.challenge.secured = 1;
    fill_b32(&m->u.challenge.nonce, 0x30);
    fill_b32(&m->u.challenge.proof, 0x50);

    kvs_msg_register_t reg = {.tp_rank = 1, .tp_size = 2, .pp_rank = 0, .pp_size = 1,
                              .instance = 7, .dp_rank = 0, .peer_instance = 3,
                              .peer_dp_rank = 0, .fp = fp, .ring_addr = 0x7f0000000000ull,
                              .ring_bytes = 1u << 20, .ring_rkey = 0x55, .local_heads = 4,
                              .num_pages = 64};
    m = SEED("register", REGISTER); /* matches wire_local_fingerprint */
    m->u.reg = reg;
    m = SEED("register_mismatch", REGISTER);
    m->u.reg = reg;
    m->u.reg.fp.total_heads = 16;
    m = SEED("register_aux_differs", REGISTER);
    m->u.reg = reg;
    m->u.reg.fp.max_aux_bytes = 64;
    m = SEED("register_scales", REGISTER);
    m->u.reg = reg;
    m->u.reg.fp.dtype = KVS_DTYPE_FP8;
    m->u.reg.fp.kv_scales = KVS_KV_SCALES_PER_BLOCK;
    m->u.reg.fp.scale_block = 32;
    m = SEED("register_cp", REGISTER);
    m->u.reg = reg;
    m->u.reg.fp.prefill_cp = 2;
    m = SEED("register_hybrid", REGISTER); /* Qwen3-Next's layer pattern */
    m->u.reg = reg;
    m->u.reg.fp.full_attn_every = 4;
    m->u.reg.fp.other_layers = KVS_LAYER_STATE;
    m->u.reg.fp.state_heads = 16;
    m->u.reg.fp.state_conv_bytes = 3072;
    m->u.reg.fp.state_ssm_bytes = 65536;
    m = SEED("register_draft", REGISTER); /* an EAGLE draft: one layer */
    m->u.reg = reg;
    m->u.reg.fp.draft_layers = 1;
    m->u.reg.fp.draft_head_dim = fp.head_dim;
    m = SEED("fingerprint_reserved", REGISTER); /* a reserved field set */
    m->u.reg = reg;
    m->u.reg.fp.reserved = 1;

    kvs_msg_register_ack_t ack = {.echo = SESSION + 1, .tp_rank = 1, .pp_rank = 0,
                                  .status = KVS_OK, .instance = 3, .dp_rank = 0, .fp = fp,
                                  .cp_rank = 0, .cp_size = 1};
    m = SEED("register_ack", REGISTER_ACK);
    m->u.ack = ack;
    m = SEED("register_ack_cp", REGISTER_ACK);
    m->u.ack = ack;
    m->u.ack.cp_rank = 1;
    m->u.ack.cp_size = 2;

    m = SEED("layers", LAYERS);
    m->u.layers.first = 0;
    m->u.layers.count = 3;
    for (uint32_t i = 0; i < 3; i++)
        m->u.layers.entries[i] = (kvs_layer_entry_t){
            .k_addr = 0x100000u * (2 * i + 1), .k_rkey = 0x11 + i,
            .v_addr = 0x100000u * (2 * i + 2), .v_rkey = 0x21 + i};
    m = SEED("layers_scales", LAYERS);
    m->u.layers = s[n - 2].msg.u.layers;
    for (uint32_t i = 0; i < 3; i++) {
        m->u.layers.entries[i].ks_addr = 0x900000u + 0x1000u * i;
        m->u.layers.entries[i].ks_rkey = 0x31 + i;
        m->u.layers.entries[i].vs_addr = 0xa00000u + 0x1000u * i;
        m->u.layers.entries[i].vs_rkey = 0x41 + i;
    }
    m = SEED("layers_empty", LAYERS);
    m->u.layers.first = 5;

    m = SEED("room", ROOM);
    m->u.room = (kvs_msg_room_t){.room = ROOM, .base_tokens = 16, .total_tokens = 100,
                                 .num_pages = 6};
    m = SEED("pages", PAGES);
    m->u.pages.room = ROOM;
    m->u.pages.first = 0;
    m->u.pages.count = 6;
    for (int64_t i = 0; i < 6; i++)
        m->u.pages.ids[i] = 40 - 3 * i;

    m = SEED("staging_req", STAGING_REQ);
    m->u.req = (kvs_msg_staging_req_t){.room = ROOM, .chunk = 1, .pages = 32, .tokens = 512,
                                       .writer = 1, .stage = 0};
    kvs_msg_staging_rsp_t rsp = {.room = ROOM, .chunk = 1, .status = KVS_OK, .offset = 4096,
                                 .round = 2, .end = 8192, .rkey = 0x77, .rkey_v = 0x78};
    m = SEED("staging_rsp", STAGING_RSP);
    m->u.rsp = rsp;
    m = SEED("staging_rsp_oversized", STAGING_RSP);
    m->u.rsp = (kvs_msg_staging_rsp_t){.room = ROOM, .chunk = 1, .status = KVS_EOVERSIZED};
    m = SEED("chunk_ready", CHUNK_READY);
    m->u.ready = (kvs_msg_chunk_ready_t){.room = ROOM, .chunk = 1, .page_start = 32,
                                         .pages = 32, .writer = 1, .stage = 0};
    m = SEED("watermark", WATERMARK);
    m->u.wm = (kvs_msg_watermark_t){.round = 3, .offset = 65536};
    m = SEED("status", STATUS);
    m->u.status = (kvs_msg_status_t){.room = ROOM, .tp_rank = 1, .pp_rank = 0,
                                     .status = KVS_OK, .aux_bytes = 16, .chunks = 4};
    m = SEED("abort", ABORT);
    m->u.abort = (kvs_msg_abort_t){.room = ROOM, .status = KVS_ECANCELED};
    m = SEED("ack", ACK);
    m->seq = 0; /* a receipt is never itself sequenced */
    m->u.ack_link.cum = 9;
#undef SEED
    return n <= cap ? n : 0;
}

static int read_file(const char *path, uint8_t *buf, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    *len = fread(buf, 1, cap, f);
    const int bad = ferror(f) || !feof(f);
    fclose(f);
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    const bool check = argc == 3 && strcmp(argv[1], "--check") == 0;
    if (!(argc == 2 || check)) {
        fprintf(stderr, "usage: wire_seeds DIR | wire_seeds --check DIR\n");
        return 2;
    }
    const char *dir = argv[argc - 1];
    static seed_t seeds[32];
    const size_t n = make_seeds(seeds, sizeof seeds / sizeof seeds[0]);
    if (n == 0) {
        fprintf(stderr, "wire_seeds: the fixture layout was refused\n");
        return 2;
    }
    int stale = 0;
    for (size_t i = 0; i < n; i++) {
        static uint8_t want[KVS_CONTROL_MSG_MAX_BYTES], got[KVS_CONTROL_MSG_MAX_BYTES + 1];
        uint32_t len = 0;
        if (kvs__wire_encode(&seeds[i].msg, want, sizeof want, &len) != KVS_OK) {
            fprintf(stderr, "wire_seeds: seed %s does not encode\n", seeds[i].name);
            return 2;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.bin", dir, seeds[i].name);
        if (check) {
            size_t have = 0;
            if (read_file(path, got, sizeof got, &have) != 0 || have != len ||
                memcmp(got, want, len) != 0) {
                fprintf(stderr, "wire_seeds: %s is not what wire version %u encodes\n", path,
                        (unsigned)KVS_WIRE_VERSION);
                stale++;
            }
            continue;
        }
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(want, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "wire_seeds: cannot write %s: %s\n", path, strerror(errno));
            return 2;
        }
    }
    if (stale > 0) {
        fprintf(stderr, "wire_seeds: %d of %zu seeds are stale: rewrite them with "
                        "`wire_seeds %s` (the build's binary) and commit the result\n",
                stale, n, dir);
        return 1;
    }
    printf("wire_seeds: %zu seeds %s (wire version %u)\n", n, check ? "current" : "written",
           (unsigned)KVS_WIRE_VERSION);
    return 0;
}
