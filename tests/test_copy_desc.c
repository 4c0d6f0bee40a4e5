/*
 * test_copy_desc.c - kvs_copy_desc_check, the descriptor check every device
 * backend runs: each refusal with its status and the words that say what to
 * change, the geometry of an accepted descriptor, when it asks the backend
 * about memory (and only then), and a message buffer too small for the text.
 * And kvs_copy_parts_check, the check of a fused copy (gather_parts /
 * scatter_parts): the shape of each accepted part, the part count and NULL
 * refusals, a bad part named in the message, and what may not overlap (a
 * scatter's head ranges, a gather's staging blocks) against what may (a
 * scatter's shared staging address, a gather's shared heads, blocks that
 * only touch).
 *
 * The backend's memory is a fixed list of live ranges (a fake in_mem); the
 * shapes below are small enough to work out by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <kvstage/backend.h>

#include <stdlib.h>
#include <string.h>

#define LAYERS 4
#define LAYER_BYTES 1024u
#define K_BASE(l) (0x100000ull * ((l) + 1))
#define V_BASE(l) (0x100000ull * ((l) + 1) + 0x10000ull)
#define STAGING_ADDR 0x900000ull
#define STAGING_BYTES 1152u /* 192-byte slots x 3 x K and V */
#define PARTS_ADDR 0xa00000ull  /* the fused copies' staging blocks */
#define PARTS_BYTES 4096u
#define HEAD_BLOCK 576u /* a part's block per head: 16 bytes x 6 tokens x 3 x 2 */

/* The fake backend memory: live ranges, and how often it was asked. */
typedef struct mem {
    uint64_t addr[4 * LAYERS + 3];
    uint64_t len_bytes[4 * LAYERS + 3];
    unsigned n;
    unsigned asked;
} mem_t;

static bool mem_holds(void *ctx, uint64_t addr, uint64_t len_bytes)
{
    mem_t *m = ctx;
    m->asked++;
    for (unsigned i = 0; i < m->n; i++) {
        if (addr < m->addr[i])
            continue;
        const uint64_t rel = addr - m->addr[i];
        if (rel <= m->len_bytes[i] && len_bytes <= m->len_bytes[i] - rel)
            return true;
    }
    return false;
}

static void mem_add(mem_t *m, uint64_t addr, uint64_t len_bytes)
{
    m->addr[m->n] = addr;
    m->len_bytes[m->n] = len_bytes;
    m->n++;
}

/* Every layer buffer and the staging block live. */
static void mem_all(mem_t *m)
{
    memset(m, 0, sizeof *m);
    for (int l = 0; l < LAYERS; l++) {
        mem_add(m, K_BASE(l), LAYER_BYTES);
        mem_add(m, V_BASE(l), LAYER_BYTES);
    }
    mem_add(m, STAGING_ADDR, STAGING_BYTES);
    mem_add(m, PARTS_ADDR, PARTS_BYTES);
}

typedef struct fx {
    uint64_t k[LAYERS], v[LAYERS];
    int64_t pages[2];
    kvs_copy_desc_t good;
    mem_t mem;
    kvs_copy_shape_t sh;
    char msg[KVS_ERROR_MSG_BYTES];
} fx_t;

/*
 * 4 local heads of 8 x 2 bytes (16 bytes a head, 64 a token slot), heads
 * [1, +2) copied (32 bytes a token, at offset 16), pages of 4 tokens, pages
 * {3, 1}, 6 tokens, local layers [1, +2) into slots [1, +2) of 3:
 *   slot 192 bytes, block 192 * 3 * 2 = 1152, payload 192 * 2 * 2 = 768;
 *   page 3: token slots 12..15 -> bytes [12*64+16, 15*64+16+32) = [784, 1008)
 *   page 1: token slots 4..5   -> bytes [4*64+16, 5*64+16+32)   = [272, 368)
 */
static void fx_init(fx_t *f)
{
    memset(f, 0, sizeof *f);
    for (int l = 0; l < LAYERS; l++) {
        f->k[l] = K_BASE(l);
        f->v[l] = V_BASE(l);
    }
    f->pages[0] = 3;
    f->pages[1] = 1;
    f->good = (kvs_copy_desc_t){
        .k_base = f->k,
        .v_base = f->v,
        .local_heads = 4,
        .head_dim = 8,
        .elem_bytes = 2,
        .page_size = 4,
        .pages = f->pages,
        .num_pages = 2,
        .tokens = 6,
        .head_start = 1,
        .num_heads = 2,
        .layer_begin = 1,
        .layer_count = 2,
        .staging_slot_begin = 1,
        .staging_layer_slots = 3,
        .staging_addr = STAGING_ADDR,
    };
    mem_all(&f->mem);
}

static int check(fx_t *f, const kvs_copy_desc_t *d)
{
    memset(&f->sh, 0xa5, sizeof f->sh);
    f->msg[0] = '\0';
    f->mem.asked = 0;
    return kvs_copy_desc_check(d, "gather", "gpu 7", mem_holds, &f->mem, &f->sh, f->msg,
                               sizeof f->msg);
}

static bool shape_is_zero(const kvs_copy_shape_t *sh)
{
    static const kvs_copy_shape_t zero;
    return memcmp(sh, &zero, sizeof zero) == 0;
}

/* d is refused with status, a message starting "gather on gpu 7: " that
 * contains needle, and a zeroed shape. */
static void expect_refused(fx_t *f, const kvs_copy_desc_t *d, int status, const char *needle)
{
    const int rc = check(f, d);
    if (rc != status)
        fail_msg("want %s, got %s (\"%s\")", kvs_status_name(status), kvs_status_name(rc),
                 f->msg);
    if (strncmp(f->msg, "gather on gpu 7: ", 17) != 0 || strstr(f->msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"gather on gpu 7: \" or \"%s\"", f->msg, needle);
    assert_true(shape_is_zero(&f->sh));
}

#define REFUSED(field, value, status, needle)                                  \
    do {                                                                       \
        kvs_copy_desc_t d_ = f.good;                                           \
        d_.field = (value);                                                    \
        expect_refused(&f, &d_, (status), (needle));                           \
    } while (0)

/* Scale planes (FP8 KV with scales): 4 bytes a head (per-token fp32) of
 * the same heads and tokens, after each slot's KV rows.
 *   scale rows 2 x 4 = 8 bytes a token, slots of 16, heads at 4;
 *   slot 6 * (32 + 8) = 240 bytes, scales at 6 * 32 = 192; block 240 * 3 *
 *   2 = 1440, payload 240 * 2 * 2 = 960;
 *   page 3: scale slots 12..15 -> [12*16+4, 15*16+4+8) = [196, 252)
 *   page 1: scale slots 4..5   -> [4*16+4, 5*16+4+8)   = [68, 92) */
#define KS_BASE(l) (0x100000ull * ((l) + 1) + 0x20000ull)
#define VS_BASE(l) (0x100000ull * ((l) + 1) + 0x30000ull)
#define SCALE_STAGING_ADDR 0xb00000ull

/* Each layer's K and V scale buffers; with mem, live (256 bytes each). */
static void scale_buffers(uint64_t *ks, uint64_t *vs, mem_t *mem)
{
    for (int l = 0; l < LAYERS; l++) {
        ks[l] = KS_BASE(l);
        vs[l] = VS_BASE(l);
        if (mem != NULL) {
            mem_add(mem, ks[l], 256);
            mem_add(mem, vs[l], 256);
        }
    }
}

static void test_copy_desc_scale_planes_move_with_their_rows(void **state)
{
    fx_t f;
    fx_init(&f);
    uint64_t ks[LAYERS], vs[LAYERS];
    scale_buffers(ks, vs, &f.mem);
    mem_add(&f.mem, SCALE_STAGING_ADDR, 1440);
    kvs_copy_desc_t d = f.good;
    d.ks_base = ks;
    d.vs_base = vs;
    d.scale_bytes = 4;
    d.staging_addr = SCALE_STAGING_ADDR;
    assert_int_equal(check(&f, &d), KVS_OK);
    assert_int_equal(f.sh.row_bytes, 32); /* the KV rows as without scales */
    assert_int_equal(f.sh.head_off, 16);
    assert_int_equal(f.sh.scale_row_bytes, 8);
    assert_int_equal(f.sh.scale_token_bytes, 16);
    assert_int_equal(f.sh.scale_head_off, 4);
    assert_int_equal(f.sh.scale_off, 192);
    assert_int_equal(f.sh.slot_bytes, 240);
    assert_int_equal(f.sh.block_bytes, 1440);
    assert_int_equal(f.sh.payload_bytes, 960);
    assert_int_equal(f.sh.scale_pool_lo, 68);
    assert_int_equal(f.sh.scale_pool_hi, 252);
    /* K, V and their scale buffers of both layers, then the block. */
    assert_int_equal(f.mem.asked, 9);
    /* The block grew by the scale rows: the old 1152-byte one is too small. */
    kvs_copy_desc_t small = d;
    small.staging_addr = STAGING_ADDR;
    expect_refused(&f, &small, KVS_ERANGE, "staging block");

    /* A scale buffer need hold only the bytes the pages touch. */
    f.mem.len_bytes[2 * LAYERS + 2 + 2] = 252; /* layer 1's K scales */
    assert_int_equal(check(&f, &d), KVS_OK);
    f.mem.len_bytes[2 * LAYERS + 2 + 2] = 251;
    expect_refused(&f, &d, KVS_ERANGE, "K scale buffer of local layer 1");
    f.mem.len_bytes[2 * LAYERS + 2 + 2] = 256;
    f.mem.len_bytes[2 * LAYERS + 2 + 5] = 100; /* layer 2's V scales */
    expect_refused(&f, &d, KVS_ERANGE, "V scale buffer of local layer 2");
    f.mem.len_bytes[2 * LAYERS + 2 + 5] = 256;

    /* Refusals: a negative size, missing buffers. */
    kvs_copy_desc_t bad = d;
    bad.scale_bytes = -1;
    expect_refused(&f, &bad, KVS_EINVAL, "scale_bytes -1 must not be negative");
    bad = d;
    bad.ks_base = NULL;
    expect_refused(&f, &bad, KVS_EINVAL, "ks_base or vs_base is NULL");
    bad = d;
    bad.vs_base = NULL;
    expect_refused(&f, &bad, KVS_EINVAL, "ks_base or vs_base is NULL");
    /* One plane reads no V scales; half the block. */
    bad = d;
    bad.planes = 1;
    bad.v_base = NULL;
    bad.vs_base = NULL;
    assert_int_equal(check(&f, &bad), KVS_OK);
    assert_int_equal(f.sh.block_bytes, 720);
    assert_int_equal(f.sh.payload_bytes, 480);
    bad.ks_base = NULL;
    expect_refused(&f, &bad, KVS_EINVAL, "ks_base is NULL");
    /* Without scales the scale fields stay zero and are never read. */
    bad = f.good;
    bad.ks_base = (const uint64_t *)(uintptr_t)1;
    assert_int_equal(check(&f, &bad), KVS_OK);
    assert_int_equal(f.sh.slot_bytes, 192);
    assert_int_equal(f.sh.scale_row_bytes, 0);
    assert_int_equal(f.sh.scale_pool_hi, 0);
}

static void test_copy_desc_accepts_and_reports_the_shape(void **state)
{
    fx_t f;
    fx_init(&f);
    assert_int_equal(check(&f, &f.good), KVS_OK);
    assert_string_equal(f.msg, "");
    assert_int_equal(f.sh.pages_used, 2);
    assert_int_equal(f.sh.row_bytes, 32);
    assert_int_equal(f.sh.token_bytes, 64);
    assert_int_equal(f.sh.head_off, 16);
    assert_int_equal(f.sh.slot_bytes, 192);
    assert_int_equal(f.sh.block_bytes, 1152);
    assert_int_equal(f.sh.pool_lo, 272);
    assert_int_equal(f.sh.pool_hi, 1008);
    assert_int_equal(f.sh.payload_bytes, 768);
    /* K and V of both layers, then the staging block. */
    assert_int_equal(f.mem.asked, 5);

    /* A partial last page and pages past the used ones (never read). */
    int64_t more[3] = {0, 2, -7};
    kvs_copy_desc_t d = f.good;
    d.pages = more;
    d.num_pages = 3;
    d.tokens = 5;
    assert_int_equal(check(&f, &d), KVS_OK);
    assert_int_equal(f.sh.pages_used, 2);
    assert_int_equal(f.sh.pool_lo, 16);             /* slot 0 */
    assert_int_equal(f.sh.pool_hi, 8 * 64 + 16 + 32); /* slot 8, the 5th token */
    assert_int_equal(f.sh.slot_bytes, 160);
    assert_int_equal(f.sh.block_bytes, 960);

    /* A layer buffer need hold only the bytes the pages touch: layer 1's K
     * buffer cut to exactly pool_hi bytes will do, one byte less will not. */
    d = f.good;
    f.mem.len_bytes[2] = 1008;
    assert_int_equal(check(&f, &d), KVS_OK);
    f.mem.len_bytes[2] = 1007;
    expect_refused(&f, &d, KVS_ERANGE, "K buffer of local layer 1");
}

/* One plane per layer (MLA's latent): K only, half the block and payload,
 * v_base never read, and no V buffer asked for. */
static void test_copy_desc_one_plane_copies_k_only(void **state)
{
    fx_t f;
    fx_init(&f);
    kvs_copy_desc_t d = f.good;
    d.planes = 1;
    d.v_base = NULL;
    assert_int_equal(check(&f, &d), KVS_OK);
    assert_int_equal(f.sh.planes, 1);
    assert_int_equal(f.sh.block_bytes, 1152 / 2);
    assert_int_equal(f.sh.payload_bytes, 768 / 2);
    assert_int_equal(f.mem.asked, 3); /* K of both layers, then the block */
    /* The zero of descriptors made before the field: K and V. */
    d = f.good;
    assert_int_equal(d.planes, 0);
    assert_int_equal(check(&f, &d), KVS_OK);
    assert_int_equal(f.sh.planes, 2);
    d.planes = 2;
    assert_int_equal(check(&f, &d), KVS_OK);
    assert_int_equal(f.sh.block_bytes, 1152);
    /* Two planes still need a V base; a count other than 0, 1, 2 is refused. */
    d.v_base = NULL;
    expect_refused(&f, &d, KVS_EINVAL, "k_base or v_base is NULL");
    REFUSED(planes, 3, KVS_EINVAL, "planes 3");
    REFUSED(planes, -1, KVS_EINVAL, "planes -1");
    d = f.good;
    d.planes = 1;
    d.k_base = NULL;
    expect_refused(&f, &d, KVS_EINVAL, "k_base is NULL");
}

static void test_copy_desc_nothing_to_move_asks_nothing(void **state)
{
    fx_t f;
    fx_init(&f);
    memset(&f.mem, 0, sizeof f.mem); /* no memory at all */
    kvs_copy_desc_t d = f.good;
    d.tokens = 0;
    d.pages = NULL;
    d.staging_addr = 0;
    assert_int_equal(check(&f, &d), KVS_OK);
    assert_int_equal(f.sh.payload_bytes, 0);
    assert_int_equal(f.sh.pages_used, 0);
    assert_int_equal(f.sh.pool_lo, 0);
    assert_int_equal(f.sh.pool_hi, 0);
    assert_int_equal(f.mem.asked, 0);

    d = f.good;
    d.layer_count = 0;
    d.k_base = NULL;
    d.v_base = NULL;
    assert_int_equal(check(&f, &d), KVS_OK);
    assert_int_equal(f.sh.payload_bytes, 0);
    assert_int_equal(f.sh.pages_used, 2);
    assert_int_equal(f.sh.block_bytes, 1152);
    assert_int_equal(f.mem.asked, 0);
}

static void test_copy_desc_refuses_null_and_non_positive_sizes(void **state)
{
    fx_t f;
    fx_init(&f);
    expect_refused(&f, NULL, KVS_EINVAL, "descriptor is NULL");
    REFUSED(local_heads, 0, KVS_EINVAL, "local_heads 0, head_dim 8, elem_bytes 2 and "
                                        "page_size 4 must all be positive");
    REFUSED(head_dim, -3, KVS_EINVAL, "head_dim -3");
    REFUSED(elem_bytes, 0, KVS_EINVAL, "elem_bytes 0");
    REFUSED(page_size, -1, KVS_EINVAL, "page_size -1");
}

static void test_copy_desc_refuses_negative_counts(void **state)
{
    fx_t f;
    fx_init(&f);
    REFUSED(num_pages, -1, KVS_EINVAL,
            "num_pages -1, tokens 6, layer_begin 1, layer_count 2, staging_slot_begin 1 "
            "and staging_layer_slots 3 must not be negative");
    REFUSED(tokens, -1, KVS_EINVAL, "tokens -1");
    REFUSED(layer_begin, -1, KVS_EINVAL, "layer_begin -1");
    REFUSED(layer_count, -1, KVS_EINVAL, "layer_count -1");
    REFUSED(staging_slot_begin, -1, KVS_EINVAL, "staging_slot_begin -1");
    REFUSED(staging_layer_slots, -1, KVS_EINVAL, "staging_layer_slots -1");
}

static void test_copy_desc_refuses_heads_outside_the_pool(void **state)
{
    fx_t f;
    fx_init(&f);
    REFUSED(num_heads, 0, KVS_ERANGE, "heads [1, +0) outside the 4 local heads of the KV pool");
    REFUSED(head_start, -1, KVS_ERANGE, "heads [-1, +2)");
    REFUSED(head_start, 3, KVS_ERANGE, "heads [3, +2)");
    REFUSED(num_heads, 5, KVS_ERANGE, "heads [1, +5)");
    REFUSED(head_start, INT64_MAX, KVS_ERANGE, "local heads");
    /* The edge: heads [2, +2) of 4 fit. */
    kvs_copy_desc_t d = f.good;
    d.head_start = 2;
    assert_int_equal(check(&f, &d), KVS_OK);
}

static void test_copy_desc_refuses_more_tokens_than_pages(void **state)
{
    fx_t f;
    fx_init(&f);
    REFUSED(tokens, 9, KVS_ERANGE, "9 tokens do not fit in 2 pages of 4 tokens");
    REFUSED(num_pages, 1, KVS_ERANGE, "6 tokens do not fit in 1 pages");
    /* Exactly full pages fit (with a staging block for 8 tokens). */
    kvs_copy_desc_t d = f.good;
    d.tokens = 8;
    f.mem.len_bytes[2 * LAYERS] = 8 * 32 * 3 * 2;
    assert_int_equal(check(&f, &d), KVS_OK);
    assert_int_equal(f.sh.pages_used, 2);
    assert_int_equal(f.sh.block_bytes, 1536);
}

static void test_copy_desc_refuses_layer_range_overflow(void **state)
{
    fx_t f;
    fx_init(&f);
    REFUSED(layer_begin, INT64_MAX, KVS_ERANGE,
            "layer range [9223372036854775807, +2) overflows");
    REFUSED(layer_begin, INT64_MAX - 1, KVS_ERANGE, "overflows");
}

static void test_copy_desc_refuses_staging_slots_outside_the_block(void **state)
{
    fx_t f;
    fx_init(&f);
    REFUSED(staging_slot_begin, 2, KVS_ERANGE,
            "layer slots [2, +2) outside the 3 slots of the staging block");
    REFUSED(staging_slot_begin, 4, KVS_ERANGE, "layer slots [4, +2)");
    REFUSED(staging_layer_slots, 2, KVS_ERANGE, "outside the 2 slots");
    REFUSED(layer_count, 3, KVS_ERANGE, "layer slots [1, +3)");
}

static void test_copy_desc_refuses_null_bases_and_pages(void **state)
{
    fx_t f;
    fx_init(&f);
    REFUSED(k_base, NULL, KVS_EINVAL, "k_base or v_base is NULL");
    REFUSED(v_base, NULL, KVS_EINVAL, "k_base or v_base is NULL");
    REFUSED(pages, NULL, KVS_EINVAL, "pages is NULL");
}

static void test_copy_desc_refuses_sizes_overflowing_64_bits(void **state)
{
    fx_t f;
    fx_init(&f);
    REFUSED(head_dim, INT64_MAX / 2, KVS_ERANGE, "sizes overflow 64 bits; lower head_dim");
    REFUSED(elem_bytes, INT64_MAX, KVS_ERANGE, "sizes overflow 64 bits");
    /* Only the staging block's size overflows: every slot of it counts. */
    REFUSED(staging_layer_slots, INT64_MAX / 64, KVS_ERANGE, "sizes overflow 64 bits");
    /* Each product on its own: a token row of every copied head, a token
     * slot of every local head, a layer's slot, the payload (one plane and
     * both), the staging block with both planes. */
    kvs_copy_desc_t d = f.good;
    d.local_heads = d.num_heads = INT64_MAX / 4; /* 16 bytes a head */
    d.head_start = 0;
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits");
    d = f.good;
    d.local_heads = INT64_MAX / 4;
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits");
    d = f.good;
    d.page_size = INT64_MAX; /* the page capacity overflows: not checked */
    d.tokens = INT64_MAX / 2;
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits");
    const uint64_t slot = 192; /* 6 tokens x 32 bytes */
    d = f.good;
    d.layer_count = (int64_t)(UINT64_MAX / slot);
    d.staging_slot_begin = 0;
    d.staging_layer_slots = d.layer_count;
    d.layer_begin = 0;
    d.planes = 1;
    d.layer_count++; /* one slot more than a 64-bit payload holds */
    d.staging_layer_slots++;
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits");
    d.layer_count = d.staging_layer_slots = (int64_t)(UINT64_MAX / slot / 2 + 1);
    d.planes = 2; /* one plane fits, two do not */
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits");
    d = f.good;
    d.staging_layer_slots = (int64_t)(UINT64_MAX / slot / 2 + 1);
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits");
}

/* The scale planes' sizes and byte offsets are checked as the KV rows'
 * are: each product that can pass 64 bits on its own is refused. */
static void test_copy_desc_refuses_scale_sizes_overflowing_64_bits(void **state)
{
    fx_t f;
    fx_init(&f);
    uint64_t ks[LAYERS], vs[LAYERS];
    scale_buffers(ks, vs, NULL);
    kvs_copy_desc_t base = f.good;
    base.ks_base = ks;
    base.vs_base = vs;
    /* a scale row of every copied head: 4 x 2^62 */
    kvs_copy_desc_t d = base;
    d.num_heads = 4;
    d.head_start = 0;
    d.scale_bytes = INT64_C(1) << 62;
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits; lower head_dim, elem_bytes, "
                                        "scale_bytes");
    /* the copied heads' scale row fits (2 x 2^62), a token's (4 heads) does not */
    d = base;
    d.scale_bytes = INT64_C(1) << 62;
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits");
    /* each row fits, a KV row and its scale row together do not:
     * 3 x 2^62 + 2^62 */
    d = base;
    d.local_heads = d.num_heads = 1;
    d.head_start = 0;
    d.head_dim = INT64_C(1) << 62;
    d.elem_bytes = 3;
    d.tokens = 1;
    d.scale_bytes = INT64_C(1) << 62;
    expect_refused(&f, &d, KVS_ERANGE, "sizes overflow 64 bits");
    /* a page whose KV bytes fit but whose scale bytes do not: page 2^30 of
     * 4 tokens is KV byte 2^38 but scale byte 2^74 */
    int64_t far[2] = {3, INT64_C(1) << 30};
    d = base;
    d.scale_bytes = INT64_C(1) << 40;
    d.pages = far;
    expect_refused(&f, &d, KVS_ERANGE, "page id 1073741824 (entry 1) is out of range");
    /* the page count times its size passes 64 bits: no token limit from it,
     * the page ids still checked */
    d = f.good;
    d.num_pages = INT64_MAX;
    d.page_size = 4;
    assert_int_equal(check(&f, &d), KVS_OK);
}

static void test_copy_desc_refuses_bad_page_ids(void **state)
{
    fx_t f;
    fx_init(&f);
    int64_t pages[2] = {3, -1};
    REFUSED(pages, pages, KVS_ERANGE, "page id -1 (entry 1) is out of range");
    int64_t huge[2] = {INT64_MAX / 2, 1};
    REFUSED(pages, huge, KVS_ERANGE, "page id 4611686018427387903 (entry 0)");
    /* A page whose slots fit 64 bits but whose bytes do not. */
    int64_t far[2] = {3, INT64_MAX / 64};
    REFUSED(pages, far, KVS_ERANGE, "(entry 1) is out of range");
}

static void test_copy_desc_refuses_layer_buffers_not_in_memory(void **state)
{
    fx_t f;
    fx_init(&f);
    uint64_t k[LAYERS];
    memcpy(k, f.k, sizeof k);
    k[2] = 0x5000000; /* nowhere */
    REFUSED(k_base, k, KVS_ERANGE,
            "K buffer of local layer 2 (0x5000000) does not hold bytes [272, 1008) of the "
            "pages copied: not allocated, freed or too small");
    uint64_t v[LAYERS];
    memcpy(v, f.v, sizeof v);
    v[1] += 32; /* from there the buffer ends 16 bytes early */
    REFUSED(v_base, v, KVS_ERANGE, "V buffer of local layer 1");
    v[1] = UINT64_MAX - 100; /* base + pool range wraps */
    REFUSED(v_base, v, KVS_ERANGE, "V buffer of local layer 1");
    /* Pages past the layer buffers. */
    int64_t pages[2] = {3, 16};
    REFUSED(pages, pages, KVS_ERANGE, "K buffer of local layer 1");
    /* Only layers copied are looked at: layer 0 is not. */
    kvs_copy_desc_t d = f.good;
    memcpy(k, f.k, sizeof k);
    k[0] = 0x5000000;
    d.k_base = k;
    assert_int_equal(check(&f, &d), KVS_OK);
}

static void test_copy_desc_refuses_staging_block_not_in_memory(void **state)
{
    fx_t f;
    fx_init(&f);
    REFUSED(staging_addr, STAGING_ADDR + 1, KVS_ERANGE,
            "staging block [0x900001, +1152) (3 slots of 192 bytes, K and V) is not inside "
            "one live allocation");
    REFUSED(staging_addr, K_BASE(0), KVS_ERANGE, "staging block [0x100000, +1152)");
    /* The block must hold all S slots, not just those written. */
    REFUSED(staging_layer_slots, 4, KVS_ERANGE, "(4 slots of 192 bytes");
}

static void test_copy_desc_message_fits_any_buffer(void **state)
{
    fx_t f;
    fx_init(&f);
    kvs_copy_desc_t d = f.good;
    d.tokens = -1;
    char small[12];
    memset(small, 'x', sizeof small);
    assert_int_equal(kvs_copy_desc_check(&d, "scatter", "host", mem_holds, &f.mem, &f.sh,
                                         small, sizeof small),
                     KVS_EINVAL);
    assert_string_equal(small, "scatter on ");
    /* Just the prefix room: the detail is cut, the text still ends. */
    char prefix[sizeof "scatter on host: "];
    assert_int_equal(kvs_copy_desc_check(&d, "scatter", "host", mem_holds, &f.mem, &f.sh,
                                         prefix, sizeof prefix),
                     KVS_EINVAL);
    assert_string_equal(prefix, "scatter on host: ");
    /* No room at all. */
    assert_int_equal(
        kvs_copy_desc_check(&d, "scatter", "host", mem_holds, &f.mem, &f.sh, NULL, 0),
        KVS_EINVAL);
}

/* ---- kvs_copy_parts_check ------------------------------------------------ */

#define MAX_TEST_PARTS 4

/* Runs the parts check on f's memory with sh (MAX_TEST_PARTS entries,
 * filled with a pattern first) and the message reset. */
static int check_parts(fx_t *f, const kvs_copy_desc_t *d, const kvs_copy_part_t *parts,
                       int64_t nparts, bool scatter, kvs_copy_shape_t *sh)
{
    if (sh != NULL)
        memset(sh, 0xa5, MAX_TEST_PARTS * sizeof *sh);
    f->msg[0] = '\0';
    f->mem.asked = 0;
    return kvs_copy_parts_check(d, parts, nparts, scatter, scatter ? "scatter_parts" : "gather_parts",
                                "gpu 7", mem_holds, &f->mem, sh, f->msg, sizeof f->msg);
}

/* The parts are refused with status, a message that contains every needle
 * (NULL-terminated), and sh[0..nparts) zeroed where nparts is in range. */
static void expect_parts_refused(fx_t *f, const kvs_copy_desc_t *d, const kvs_copy_part_t *parts,
                                 int64_t nparts, bool scatter, int status, ...)
{
    kvs_copy_shape_t sh[MAX_TEST_PARTS];
    const int rc = check_parts(f, d, parts, nparts, scatter, sh);
    if (rc != status)
        fail_msg("want %s, got %s (\"%s\")", kvs_status_name(status), kvs_status_name(rc),
                 f->msg);
    va_list ap;
    va_start(ap, status);
    for (const char *needle = va_arg(ap, const char *); needle != NULL;
         needle = va_arg(ap, const char *))
        if (strstr(f->msg, needle) == NULL)
            fail_msg("message \"%s\" lacks \"%s\"", f->msg, needle);
    va_end(ap);
    /* A count out of range says nothing about how many shapes sh holds. */
    for (int64_t i = 0; i < nparts && i < MAX_TEST_PARTS && nparts <= KVS_COPY_PARTS_MAX; i++)
        if (!shape_is_zero(&sh[i]))
            fail_msg("shape of part %lld not zeroed after \"%s\"", (long long)i, f->msg);
    /* The same refusal without a shape array. */
    assert_int_equal(check_parts(f, d, parts, nparts, scatter, NULL), status);
}

/* f.good's own heads and staging address are not read: poison them. */
static kvs_copy_desc_t parts_desc(const fx_t *f)
{
    kvs_copy_desc_t d = f->good;
    d.head_start = -5;
    d.num_heads = 99;
    d.staging_addr = 0;
    return d;
}

static void test_copy_desc_parts_accept_and_report_each_shape(void **state)
{
    fx_t f;
    fx_init(&f);
    const kvs_copy_desc_t d = parts_desc(&f);
    /* Heads {0}, {2, 3}, {1}: the 4 local heads, out of order, each with a
     * block of its own right after the previous one. */
    const kvs_copy_part_t parts[3] = {
        {0, 1, PARTS_ADDR},
        {2, 2, PARTS_ADDR + HEAD_BLOCK},
        {1, 1, PARTS_ADDR + 3 * HEAD_BLOCK},
    };
    for (int scatter = 0; scatter < 2; scatter++) {
        kvs_copy_shape_t sh[MAX_TEST_PARTS];
        assert_int_equal(check_parts(&f, &d, parts, 3, scatter, sh), KVS_OK);
        assert_string_equal(f.msg, "");
        /* K and V of both layers, then the block: per part. */
        assert_int_equal(f.mem.asked, 15);
        const uint64_t rows[3] = {16, 32, 16}, offs[3] = {0, 32, 16};
        for (int i = 0; i < 3; i++) {
            assert_int_equal(sh[i].pages_used, 2);
            assert_int_equal(sh[i].token_bytes, 64);
            assert_int_equal(sh[i].row_bytes, rows[i]);
            assert_int_equal(sh[i].head_off, offs[i]);
            assert_int_equal(sh[i].slot_bytes, 6 * rows[i]);
            assert_int_equal(sh[i].block_bytes, 6 * rows[i] * 3 * 2);
            assert_int_equal(sh[i].payload_bytes, 6 * rows[i] * 2 * 2);
            /* Token slots 4..5 (page 1) and 12..15 (page 3). */
            assert_int_equal(sh[i].pool_lo, 4 * 64 + offs[i]);
            assert_int_equal(sh[i].pool_hi, 15 * 64 + offs[i] + rows[i]);
        }
        /* Untouched past nparts. */
        kvs_copy_shape_t pattern;
        memset(&pattern, 0xa5, sizeof pattern);
        assert_memory_equal(&sh[3], &pattern, sizeof pattern);
        /* No shapes wanted. */
        assert_int_equal(check_parts(&f, &d, parts, 3, scatter, NULL), KVS_OK);
        /* One part is a plain descriptor's check. */
        assert_int_equal(check_parts(&f, &d, &parts[1], 1, scatter, sh), KVS_OK);
        assert_int_equal(sh[0].head_off, 32);
    }
}

static void test_copy_desc_parts_refuse_counts_and_nulls(void **state)
{
    fx_t f;
    fx_init(&f);
    const kvs_copy_desc_t d = parts_desc(&f);
    const kvs_copy_part_t parts[2] = {{0, 1, PARTS_ADDR}, {1, 1, PARTS_ADDR + HEAD_BLOCK}};
    for (int scatter = 0; scatter < 2; scatter++) {
        const char *what = scatter ? "scatter_parts on gpu 7: " : "gather_parts on gpu 7: ";
        expect_parts_refused(&f, &d, parts, 0, scatter, KVS_EINVAL, what,
                             "part count out of range; pass 1 to 1024 parts", NULL);
        expect_parts_refused(&f, &d, parts, -1, scatter, KVS_EINVAL, "part count out of range",
                             NULL);
        expect_parts_refused(&f, &d, parts, KVS_COPY_PARTS_MAX + 1, scatter, KVS_EINVAL,
                             "part count out of range", NULL);
        expect_parts_refused(&f, &d, NULL, 2, scatter, KVS_EINVAL, what,
                             "parts is NULL; pass 1 to 1024 parts", NULL);
        expect_parts_refused(&f, NULL, parts, 2, scatter, KVS_EINVAL, what,
                             "descriptor is NULL; pass 1 to 1024 parts", NULL);
        assert_int_equal(f.mem.asked, 0);
    }
    /* KVS_COPY_PARTS_MAX parts of one head each: the count is fine (they
     * all scatter head 0, so the overlap rule refuses them, not the count). */
    kvs_copy_part_t *many = calloc(KVS_COPY_PARTS_MAX, sizeof *many);
    assert_non_null(many);
    for (int i = 0; i < KVS_COPY_PARTS_MAX; i++)
        many[i] = (kvs_copy_part_t){0, 1, PARTS_ADDR};
    assert_int_equal(check_parts(&f, &d, many, KVS_COPY_PARTS_MAX, true, NULL), KVS_ERANGE);
    assert_non_null(strstr(f.msg, "parts 0 and 1 both write heads"));
    free(many);
}

static void test_copy_desc_parts_refuse_a_bad_part_by_index(void **state)
{
    fx_t f;
    fx_init(&f);
    kvs_copy_desc_t d = parts_desc(&f);
    kvs_copy_part_t parts[3] = {
        {0, 1, PARTS_ADDR},
        {1, 1, PARTS_ADDR + HEAD_BLOCK},
        {2, 2, PARTS_ADDR + 2 * HEAD_BLOCK},
    };
    /* Heads outside the local heads: part 1 of a gather. */
    parts[1].head_start = 3;
    parts[1].num_heads = 2;
    expect_parts_refused(&f, &d, parts, 3, false, KVS_ERANGE,
                         "gather_parts part 1 on gpu 7: heads [3, +2) outside the 4 local "
                         "heads of the KV pool",
                         NULL);
    parts[1] = (kvs_copy_part_t){1, 0, PARTS_ADDR + HEAD_BLOCK};
    expect_parts_refused(&f, &d, parts, 3, true, KVS_ERANGE,
                         "scatter_parts part 1 on gpu 7: heads [1, +0)", NULL);
    parts[1] = (kvs_copy_part_t){1, 1, PARTS_ADDR + HEAD_BLOCK};
    /* Part 2's block runs past the live range by a byte. */
    parts[2].staging_addr = PARTS_ADDR + PARTS_BYTES - 2 * HEAD_BLOCK + 1;
    expect_parts_refused(&f, &d, parts, 3, true, KVS_ERANGE,
                         "scatter_parts part 2 on gpu 7: staging block [0xa00b81, +1152)",
                         "is not inside one live allocation", NULL);
    /* ... and in no live range at all. */
    parts[2].staging_addr = 0x5000000;
    expect_parts_refused(&f, &d, parts, 3, false, KVS_ERANGE,
                         "gather_parts part 2 on gpu 7: staging block [0x5000000, +1152)",
                         NULL);
    parts[2].staging_addr = PARTS_ADDR + 2 * HEAD_BLOCK;
    assert_int_equal(check_parts(&f, &d, parts, 3, false, NULL), KVS_OK);
    /* What is wrong with the shared descriptor shows on part 0. */
    d.tokens = -1;
    expect_parts_refused(&f, &d, parts, 3, true, KVS_EINVAL,
                         "scatter_parts part 0 on gpu 7: ", "tokens -1", NULL);
    d = parts_desc(&f);
    uint64_t k[LAYERS];
    memcpy(k, f.k, sizeof k);
    k[2] = 0x5000000;
    d.k_base = k;
    expect_parts_refused(&f, &d, parts, 3, false, KVS_ERANGE,
                         "gather_parts part 0 on gpu 7: K buffer of local layer 2", NULL);
}

static void test_copy_desc_parts_scatter_heads_must_not_overlap(void **state)
{
    fx_t f;
    fx_init(&f);
    const kvs_copy_desc_t d = parts_desc(&f);
    kvs_copy_part_t parts[3] = {
        {1, 2, PARTS_ADDR},
        {2, 1, PARTS_ADDR + 2 * HEAD_BLOCK},
        {0, 1, PARTS_ADDR + 3 * HEAD_BLOCK},
    };
    expect_parts_refused(&f, &d, parts, 3, true, KVS_ERANGE,
                         "scatter_parts on gpu 7: parts 0 and 1 both write heads of [1, +2) "
                         "and [2, +1); give each part its own heads",
                         NULL);
    /* Not neighbours in the list: parts 0 and 2. */
    parts[1] = (kvs_copy_part_t){3, 1, PARTS_ADDR + 2 * HEAD_BLOCK};
    parts[2] = (kvs_copy_part_t){0, 2, PARTS_ADDR + 3 * HEAD_BLOCK};
    expect_parts_refused(&f, &d, parts, 3, true, KVS_ERANGE,
                         "parts 0 and 2 both write heads of [1, +2) and [0, +2)", NULL);
    /* The same heads twice. */
    parts[2] = (kvs_copy_part_t){3, 1, PARTS_ADDR + 3 * HEAD_BLOCK};
    expect_parts_refused(&f, &d, parts, 3, true, KVS_ERANGE,
                         "parts 1 and 2 both write heads of [3, +1) and [3, +1)", NULL);
    /* Heads that only touch are disjoint: [1, +2), [3, +1), [0, +1). */
    parts[2] = (kvs_copy_part_t){0, 1, PARTS_ADDR + 3 * HEAD_BLOCK};
    kvs_copy_shape_t sh[MAX_TEST_PARTS];
    assert_int_equal(check_parts(&f, &d, parts, 3, true, sh), KVS_OK);
    /* Disjoint heads read from one staging address: a scatter only reads
     * its blocks, so they may overlap (here, the same block). */
    for (int i = 0; i < 3; i++)
        parts[i].staging_addr = PARTS_ADDR;
    assert_int_equal(check_parts(&f, &d, parts, 3, true, sh), KVS_OK);
    assert_int_equal(sh[0].block_bytes, 2 * HEAD_BLOCK);
    /* As a gather those blocks overlap. */
    expect_parts_refused(&f, &d, parts, 3, false, KVS_ERANGE,
                         "parts 0 and 1 write overlapping staging blocks", NULL);
}

static void test_copy_desc_parts_gather_blocks_must_not_overlap(void **state)
{
    fx_t f;
    fx_init(&f);
    const kvs_copy_desc_t d = parts_desc(&f);
    /* Replicas: both parts read heads [1, +2), into blocks of their own. */
    kvs_copy_part_t parts[2] = {
        {1, 2, PARTS_ADDR},
        {1, 2, PARTS_ADDR + 2 * HEAD_BLOCK},
    };
    assert_int_equal(check_parts(&f, &d, parts, 2, false, NULL), KVS_OK);
    /* As a scatter they write the same heads. */
    expect_parts_refused(&f, &d, parts, 2, true, KVS_ERANGE, "both write heads", NULL);

    /* Part 1's block starts on part 0's last byte. */
    parts[1].staging_addr = PARTS_ADDR + 2 * HEAD_BLOCK - 1;
    expect_parts_refused(&f, &d, parts, 2, false, KVS_ERANGE,
                         "gather_parts on gpu 7: parts 0 and 1 write overlapping staging "
                         "blocks [0xa00000, +1152) and [0xa0047f, +1152); give each part its "
                         "own block",
                         NULL);
    /* The same block twice. */
    parts[1].staging_addr = PARTS_ADDR;
    expect_parts_refused(&f, &d, parts, 2, false, KVS_ERANGE, "overlapping staging blocks",
                         NULL);
    /* Part 1 starts below part 0 and ends one byte inside it; one byte
     * lower they only touch. */
    parts[0] = (kvs_copy_part_t){0, 1, PARTS_ADDR + 2 * HEAD_BLOCK};
    parts[1] = (kvs_copy_part_t){2, 2, PARTS_ADDR + 1};
    expect_parts_refused(&f, &d, parts, 2, false, KVS_ERANGE,
                         "blocks [0xa00480, +576) and [0xa00001, +1152)", NULL);
    parts[1].staging_addr = PARTS_ADDR;
    assert_int_equal(check_parts(&f, &d, parts, 2, false, NULL), KVS_OK);
    /* Part 0 below part 1, touching; then one byte into it. */
    parts[0].staging_addr = PARTS_ADDR;
    parts[1].staging_addr = PARTS_ADDR + HEAD_BLOCK;
    assert_int_equal(check_parts(&f, &d, parts, 2, false, NULL), KVS_OK);
    parts[1].staging_addr = PARTS_ADDR + HEAD_BLOCK - 1;
    expect_parts_refused(&f, &d, parts, 2, false, KVS_ERANGE,
                         "blocks [0xa00000, +576) and [0xa0023f, +1152)", NULL);

    /* Blocks of no bytes (no tokens) overlap nothing, even at one address:
     * no memory is asked about either. */
    kvs_copy_desc_t none = d;
    none.tokens = 0;
    parts[0].staging_addr = parts[1].staging_addr = 0x5000000;
    kvs_copy_shape_t sh[MAX_TEST_PARTS];
    assert_int_equal(check_parts(&f, &none, parts, 2, false, sh), KVS_OK);
    assert_int_equal(f.mem.asked, 0);
    assert_int_equal(sh[1].block_bytes, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_desc_accepts_and_reports_the_shape),
        cmocka_unit_test(test_copy_desc_one_plane_copies_k_only),
        cmocka_unit_test(test_copy_desc_scale_planes_move_with_their_rows),
        cmocka_unit_test(test_copy_desc_nothing_to_move_asks_nothing),
        cmocka_unit_test(test_copy_desc_refuses_null_and_non_positive_sizes),
        cmocka_unit_test(test_copy_desc_refuses_negative_counts),
        cmocka_unit_test(test_copy_desc_refuses_heads_outside_the_pool),
        cmocka_unit_test(test_copy_desc_refuses_more_tokens_than_pages),
        cmocka_unit_test(test_copy_desc_refuses_layer_range_overflow),
        cmocka_unit_test(test_copy_desc_refuses_staging_slots_outside_the_block),
        cmocka_unit_test(test_copy_desc_refuses_null_bases_and_pages),
        cmocka_unit_test(test_copy_desc_refuses_sizes_overflowing_64_bits),
        cmocka_unit_test(test_copy_desc_refuses_scale_sizes_overflowing_64_bits),
        cmocka_unit_test(test_copy_desc_refuses_bad_page_ids),
        cmocka_unit_test(test_copy_desc_refuses_layer_buffers_not_in_memory),
        cmocka_unit_test(test_copy_desc_refuses_staging_block_not_in_memory),
        cmocka_unit_test(test_copy_desc_message_fits_any_buffer),
        cmocka_unit_test(test_copy_desc_parts_accept_and_report_each_shape),
        cmocka_unit_test(test_copy_desc_parts_refuse_counts_and_nulls),
        cmocka_unit_test(test_copy_desc_parts_refuse_a_bad_part_by_index),
        cmocka_unit_test(test_copy_desc_parts_scatter_heads_must_not_overlap),
        cmocka_unit_test(test_copy_desc_parts_gather_blocks_must_not_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
