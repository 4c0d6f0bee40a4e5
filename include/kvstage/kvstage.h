/*
 * kvstage.h - the user's API of kvstage.
 *
 * kvstage moves an LLM's KV cache from prefill ranks to decode ranks through
 * a staging buffer when the two sides use different tensor parallelism.
 * This header is what a serving engine includes: status codes, the layout
 * planner (pure functions), the chunk grid, the staging ring allocator and
 * the KV manager with its init guards. Backend authors also include
 * <kvstage/backend.h>.
 *
 * Conventions: every function that can fail returns an int status
 * (KVS_OK == 0, errors negative, see KVS_STATUS_LIST). Objects are made with
 * kvs_<noun>_create() and released with kvs_<noun>_destroy(); a failed create
 * leaves nothing to free and destroy(NULL) is a no-op. Sizes end in _bytes,
 * times in _ns.
 */
#ifndef KVSTAGE_KVSTAGE_H
#define KVSTAGE_KVSTAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KVS_API __attribute__((visibility("default")))
#else
#define KVS_API
#endif

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/*
 * X(NAME, value, message). The message says what went wrong AND what to
 * change. One list generates the enum, kvs_status_name() and kvs_strerror().
 */
#define KVS_STATUS_LIST(X)                                                     \
    X(OK, 0, "success")                                                        \
    X(EINVAL, -1, "invalid argument: check the value named in the error "      \
                  "detail and pass one in its documented range")               \
    X(ENOMEM, -2, "out of host memory: free memory or lower the sizes "        \
                  "(ring size, live allocations, request count)")              \
    X(ESTATE, -3, "call made in the wrong state: follow the init order "      \
                  "create manager -> staging allocator -> register ring -> "   \
                  "set_kv_buffers -> create handler")                          \
    X(EALREADY, -4, "step already done: call it once per object; destroy "    \
                    "and recreate the object to redo it")                      \
    X(EBUSY, -5, "object still has live children: destroy the handlers, "     \
                 "allocations or registrations made from it first")            \
    X(ENOTSUP, -6, "operation not supported by this backend: pick a backend " \
                   "that implements it or turn the feature off")               \
    X(EBACKEND, -7, "the device or fabric backend reported a failure: see "   \
                    "the backend code and message in the error detail")        \
    X(EVERSION, -8, "backend ops table has an unknown version or size: "      \
                    "rebuild the backend against this kvstage's backend.h")    \
    X(ERANGE, -9, "value out of range: an offset, length, index or id lies "  \
                  "outside the object it addresses; fix the caller or peer")   \
    X(EOVERSIZED, -10, "staging region larger than the whole ring: raise the " \
                       "decode ring size (--ring-mib) or lower the chunk "     \
                       "size (--chunk-tokens)")                                \
    X(ERING_LIVE, -11, "too many live ring allocations: raise max_live of "   \
                       "the ring or free finished regions sooner")             \
    X(ENOENT, -12, "no such allocation, request or peer: the id was never "   \
                   "issued or was already released")                           \
    X(ENO_ALLOCATOR, -13, "staging enabled but the staging allocator is "     \
                          "missing: the transfer backend must initialise it "  \
                          "(kvs_manager_init_staging) before the decode "      \
                          "handler is created")                                \
    X(ENO_KV_BUFFERS, -14, "staging enabled but kv_buffer_tensors is "        \
                           "missing: set_kv_buffer_tensors() "                 \
                           "(kvs_manager_set_kv_buffers) must be called "      \
                           "during KV manager init")                           \
    X(EHEADS, -15, "total KV heads unresolvable: pass the model's total KV "  \
                   "heads (> 0) or the KV heads per rank (> 0)")               \
    X(EHEAD_SPLIT, -16, "heads or TP sizes do not divide: total KV heads "    \
                        "must be a multiple or a divisor of each TP size, "    \
                        "and one TP size a multiple of the other")             \
    X(EMLA, -17, "MLA geometry inconsistent: an MLA model keeps one "        \
                 "latent per token and layer, the same on every TP rank; "     \
                 "pass total_heads and heads_per_rank 0 or 1, head_dim the "   \
                 "latent dim (kv_lora_rank + qk_rope_head_dim, 576 for "       \
                 "DeepSeek-V3) and no V buffers")                              \
    X(ECONTEXT_PARALLEL, -18, "prefill context parallelism is a prefill "     \
                              "instance's: a decode rank declares it with "   \
                              "kvs_instance_desc_t.cp_size, not "             \
                              "context_parallel (set that to 1)")             \
    X(ECHUNK, -19, "chunked-prefill size must be positive (or 0 for 8192) "   \
                   "and a multiple of the page size: change --chunk-tokens")   \
    X(EPP_WRITES, -20, "prefill PP > 1 needs per-layer writes, which this "   \
                       "fabric cannot do: use prefill PP 1 or a fabric with "  \
                       "per-layer write support")                              \
    X(EPREFIX_ALIGN, -21, "decode cached prefix is not page aligned: the "    \
                          "request fails; align the prefix cache to the "      \
                          "page size")                                         \
    X(EPP_SPLIT, -22, "pipeline sizes do not fit: every pipeline stage "      \
                      "needs at least one layer (layers >= prefill PP), "      \
                      "decode PP must be 1 or equal to prefill PP, and a "     \
                      "rank's layers must be its stage's share of the model")  \
    X(EDTYPE, -23, "unknown dtype: use bf16, fp16, fp8 or fp32")               \
    X(EAGAIN, -24, "not ready yet: retry later (the operation is pending)")    \
    X(EREMOTE, -25, "remote access error: the write's key or range does not " \
                    "match a registration on the peer; re-register or fix "    \
                    "the offset")                                              \
    X(EFINGERPRINT, -26, "peer is incompatible (protocol version, model "     \
                         "shape, dtype, page size or staging setting differ): " \
                         "run both sides with the same model and settings")    \
    X(ETIMEDOUT, -27, "timed out waiting for the peer: the request failed; "  \
                      "check the peer's health or raise the stall timeout")    \
    X(EPEER, -28, "the peer reported a failure or went away: see the peer's " \
                  "log; the request failed and its resources were released")   \
    X(EPROTO, -29, "malformed or unexpected control message: the peer runs "  \
                   "an incompatible kvstage or is hostile; the message was "   \
                   "dropped")                                                  \
    X(EFULL, -30, "a bounded queue or table is full: raise its capacity or "  \
                  "lower the load")                                            \
    X(ECANCELED, -31, "the request was aborted by its caller (room abort): "  \
                      "nothing to fix; its peers were told and its memory "    \
                      "is released once no write can land")                   \
    X(EAUTH, -32, "the peer failed authentication (no cluster secret, a "     \
                  "wrong one, or a replayed registration): give every rank "   \
                  "the same secret (secret_file / secret_env), or none")

typedef enum kvs_status {
#define KVS__STATUS_ENUM(name, value, msg) KVS_##name = value,
    KVS_STATUS_LIST(KVS__STATUS_ENUM)
#undef KVS__STATUS_ENUM
} kvs_status_t;

/* Message for a status: what went wrong and what to change. Never NULL; an
 * unknown code gets "unknown kvstage status". Static storage. */
KVS_API const char *kvs_strerror(int status);
/* "KVS_EINVAL" etc.; "KVS_UNKNOWN" for an unknown code. Static storage. */
KVS_API const char *kvs_status_name(int status);

/* The detail of the last error of an object (never global). */
#define KVS_ERROR_MSG_BYTES 256
typedef struct kvs_error {
    int status;          /* kvstage status, KVS_OK when no error */
    int backend_code;    /* the backend's own code (errno, cudaError_t), 0 if none */
    const char *file;    /* source file that raised it, static storage */
    int line;
    char msg[KVS_ERROR_MSG_BYTES]; /* says which value or step to change */
} kvs_error_t;

/* ------------------------------------------------------------------------ */
/* Logging                                                                   */
/* ------------------------------------------------------------------------ */

typedef enum kvs_log_level {
    KVS_LOG_OFF = 0,
    KVS_LOG_ERROR = 1,
    KVS_LOG_WARN = 2,
    KVS_LOG_INFO = 3,
    KVS_LOG_DEBUG = 4,
    KVS_LOG_TRACE = 5
} kvs_log_level_t;

typedef void (*kvs_log_fn)(void *user, kvs_log_level_t level, const char *msg);

/* A log sink carried by each object that logs. fn == NULL writes to stderr. */
typedef struct kvs_log {
    kvs_log_fn fn;
    void *user;
    kvs_log_level_t level; /* messages above this level are dropped */
} kvs_log_t;

#define KVS_LOG_ENV "KVS_LOG_LEVEL"

/* Parses "off|error|warn|info|debug|trace" (or 0..5). KVS_EINVAL if unknown. */
KVS_API int kvs_log_level_parse(const char *text, kvs_log_level_t *out);
/* Level from the environment variable KVS_LOG_LEVEL, else KVS_LOG_WARN. */
KVS_API kvs_log_level_t kvs_log_level_default(void);
KVS_API const char *kvs_log_level_name(kvs_log_level_t level);
/* Writes one message to a sink, as kvstage's own objects do: to log->fn,
 * else to stderr as "kvstage <level>: <message>"; nothing when level is
 * above log->level (formatting happens only when it passes) or log is NULL.
 * For backends and tools that log next to the core. */
KVS_API void kvs_log_write(const kvs_log_t *log, kvs_log_level_t level, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ------------------------------------------------------------------------ */
/* Data types                                                                */
/* ------------------------------------------------------------------------ */

typedef enum kvs_dtype {
    KVS_DTYPE_BF16 = 0,
    KVS_DTYPE_FP16 = 1,
    KVS_DTYPE_FP8 = 2,
    KVS_DTYPE_FP32 = 3
} kvs_dtype_t;

/* What one layer of the KV cache holds: its kind. A kind says how many
 * planes (buffers) a layer has and whether they split by head over TP; the
 * layout planner, the copies and the fingerprint read it from one table
 * (src/layout.c), so a new kind (FP8 scale planes, hybrid state buffers)
 * is a new value and a row there. */
typedef enum kvs_kv_kind {
    /* Grouped-query attention (and MHA): a K and a V buffer per layer, each
     * [token_slot][local_head][head_dim]; KV heads split over TP (spec §3). */
    KVS_KV_GQA = 0,
    /* Multi-head latent attention (DeepSeek-V3, Kimi K2): ONE buffer per
     * layer holding one latent vector per token ([token_slot][1][head_dim],
     * head_dim = kv_lora_rank + qk_rope_head_dim, 576), no V, and the same
     * latent on every TP rank: a decode rank takes it from one prefill rank
     * (docs/kinds/mla.md). Heads are 1. */
    KVS_KV_MLA = 1
} kvs_kv_kind_t;

/* Scale planes of an FP8 KV cache (docs/kinds/fp8-scales.md). With scales
 * every layer's K (and V) buffer has a scale buffer beside it, laid out as
 * the KV rows are, [token_slot][local_head][scale bytes of one head], so a
 * head's scales split over TP with its head and move with its rows. */
typedef enum kvs_kv_scales {
    KVS_KV_SCALES_NONE = 0,      /* no scale planes (per-tensor scales, or none) */
    /* One fp32 scale per (token, head) row of K and of V: 4 bytes a head. */
    KVS_KV_SCALES_PER_TOKEN = 1,
    /* MXFP8 (OCP MX v1.0): one e8m0 byte per scale_block elements (32) of a
     * head: head_dim / scale_block bytes a head. */
    KVS_KV_SCALES_PER_BLOCK = 2
} kvs_kv_scales_t;

/* "none", "per-token", "per-block" (block 32) or "per-block:N" -> scales
 * and block (0 unless per-block); KVS_EINVAL otherwise. */
KVS_API int kvs_kv_scales_parse(const char *spec, kvs_kv_scales_t *out, int64_t *out_block);
/* "none", "per-token", "per-block"; "unknown" for another value. */
KVS_API const char *kvs_kv_scales_name(kvs_kv_scales_t scales);
/* Bytes of one head's scales in one token row: 0 (none), 4 (per-token),
 * head_dim / block (per-block; block 0 means 32); 0 when the value is
 * unknown or the block does not divide head_dim. */
KVS_API int64_t kvs_kv_scales_head_bytes(kvs_kv_scales_t scales, int64_t block,
                                         int64_t head_dim);
#define KVS_DEFAULT_SCALE_BLOCK 32

/* "gqa", "mla" -> kind; KVS_EINVAL otherwise. */
KVS_API int kvs_kv_kind_parse(const char *name, kvs_kv_kind_t *out);
/* "gqa", "mla"; "unknown" for another value. */
KVS_API const char *kvs_kv_kind_name(kvs_kv_kind_t kind);
/* Planes (buffers) per layer: 2 (K, V) for GQA, 1 for MLA; 0 when unknown. */
KVS_API int64_t kvs_kv_kind_planes(kvs_kv_kind_t kind);

/* What one layer of a hybrid model is (docs/kinds/hybrid.md). A model's
 * layers are all full attention unless kvs_layout_params_t.full_attn_every
 * says which are, the others being one kind: sliding-window attention
 * (gpt-oss) or a linear-attention / SSM state layer (Qwen3-Next's Gated
 * DeltaNet, Mamba). */
typedef enum kvs_layer_kind {
    KVS_LAYER_FULL = 0,   /* attention over every token: all its pages move */
    /* Attention over the last window_tokens tokens: only the pages holding
     * the request's last window_tokens tokens move (kvs_layout_layer_tokens). */
    KVS_LAYER_WINDOW = 1,
    /* No KV pages: one fixed-size state per request and state head (conv
     * state, then recurrent state), split over TP by state head and carried
     * in the request's last chunk (kvs_layout_hybrid_writer). */
    KVS_LAYER_STATE = 2
} kvs_layer_kind_t;

/* "full", "window", "state" -> kind; KVS_EINVAL otherwise. */
KVS_API int kvs_layer_kind_parse(const char *name, kvs_layer_kind_t *out);
/* "full", "window", "state"; "unknown" for another value. */
KVS_API const char *kvs_layer_kind_name(kvs_layer_kind_t kind);

/* Bytes per element; 0 for an unknown dtype. */
KVS_API int64_t kvs_dtype_bytes(kvs_dtype_t dtype);
/* "bf16", "fp16", "fp8", "fp32" -> dtype; KVS_EDTYPE otherwise. */
KVS_API int kvs_dtype_parse(const char *name, kvs_dtype_t *out);
KVS_API const char *kvs_dtype_name(kvs_dtype_t dtype);

/* ------------------------------------------------------------------------ */
/* Layout planner (spec §3-§5): pure functions, no allocation                */
/* ------------------------------------------------------------------------ */

#define KVS_DEFAULT_CHUNK_TOKENS 8192
/* The largest model and parallelism a layout takes (kvs_layout_init
 * refuses more with KVS_ERANGE): the plan walks layers and pipeline
 * stages, and no deployment comes near these. */
#define KVS_MAX_LAYERS 65536
#define KVS_MAX_PARALLEL 65536 /* prefill and decode TP and PP */

/* The two sides of a transfer. */
typedef enum kvs_role { KVS_ROLE_PREFILL = 0, KVS_ROLE_DECODE = 1 } kvs_role_t;

/* The layers pipeline stage `stage` of `pp` holds when `layers` layers are
 * split over pp stages as serving engines split them (spec §4): with
 * base = layers / pp and rem = layers % pp, the last rem stages hold one
 * layer more (80 layers over 3 stages: 26 / 27 / 27), contiguous from
 * layer 0. *first_layer gets the stage's first global layer id and
 * *num_layers its count (0 for a stage of a split with layers < pp, which
 * kvs_layout_init refuses). KVS_EINVAL for layers or pp <= 0 or a NULL out,
 * KVS_ERANGE for a stage outside [0, pp); the outs are left alone then. */
KVS_API int kvs_pp_stage_layers(int64_t layers, int64_t pp, int64_t stage,
                                int64_t *first_layer, int64_t *num_layers);

/* Resolves the total KV heads H (spec §3): total_heads when > 0, else
 * heads_per_rank * tp, else KVS_EHEADS. */
KVS_API int kvs_heads_resolve(int64_t total_heads, int64_t heads_per_rank,
                              int64_t tp, int64_t *out_heads);

/* Which heads one prefill rank copies into one decode rank. */
typedef struct kvs_head_slice {
    int64_t src_start; /* first local head on the prefill rank */
    int64_t num_heads; /* heads copied */
    int64_t dst_start; /* first local head on the decode rank */
} kvs_head_slice_t;

/* spec §3 formula for prefill rank src and decode rank dst (taken modulo
 * their TP). Heads are replicated when H < TP; ranks sharing a head map by
 * integer division. KVS_EINVAL for non-positive sizes. */
KVS_API int kvs_head_slice(int64_t total_heads, int64_t prefill_tp,
                           int64_t decode_tp, int64_t src, int64_t dst,
                           kvs_head_slice_t *out);

/* The inputs of a plan. Zero fields take their documented default. */
typedef struct kvs_layout_params {
    int64_t total_heads;    /* H of the model; 0: use heads_per_rank */
    int64_t heads_per_rank; /* fallback when total_heads is 0 */
    int64_t heads_per_rank_tp; /* TP that heads_per_rank refers to; 0: prefill_tp */
    int64_t head_dim;       /* hd > 0 */
    kvs_dtype_t dtype;
    int64_t layers;         /* layers of the whole model, in [1, KVS_MAX_LAYERS] */
    int64_t page_size;      /* tokens per page, > 0 */
    int64_t prefill_tp;     /* P in [1, KVS_MAX_PARALLEL] */
    int64_t decode_tp;      /* D in [1, KVS_MAX_PARALLEL] */
    int64_t prefill_pp;     /* Pp, 0 -> 1; at most layers (need not divide them) */
    int64_t decode_pp;      /* Dp, 0 -> 1; must be 1 or Pp */
    int64_t chunk_tokens;   /* C, 0 -> 8192; floored to whole pages (G) */
    /* What a layer holds (0: GQA). With KVS_KV_MLA, head_dim is the latent
     * dim and total_heads / heads_per_rank must be 0 or 1 (KVS_EMLA). */
    kvs_kv_kind_t kind;
    /* Tokens per page of the decode's KV pool, 0: page_size (then page_size
     * is both sides'). Otherwise page_size is the prefill's; the grid G is a
     * multiple of lcm(page_size, decode_page_size), so every chunk covers
     * whole pages on both sides (docs/kinds/page-sizes.md). */
    int64_t decode_page_size;
    /* Prefill context-parallel ranks, 0 -> 1: each holds one contiguous
     * token range of a request (kvs_layout_cp_range), with the same heads,
     * TP and PP as the others; a decode region's writers are its TP writers
     * x the CP ranks whose range meets the chunk
     * (docs/kinds/context-parallel.md). */
    int64_t prefill_cp;
    /* Scale planes beside each K / V buffer (0: none). Only with dtype fp8
     * (KVS_EDTYPE otherwise); per-block needs scale_block (0: 32) to divide
     * head_dim (KVS_EINVAL). */
    kvs_kv_scales_t kv_scales;
    int64_t scale_block;    /* elements per scale, per-block only; 0 -> 32 */
    /* Hybrid models (docs/kinds/hybrid.md). 0 (or 1): every layer is full
     * attention and the fields below must be 0. k > 1: layer l is full
     * attention when (l + 1) % k == 0 and of kind other_layers otherwise
     * (gpt-oss: k 2, window 128; Qwen3-Next: k 4, state). GQA only. */
    int64_t full_attn_every;
    kvs_layer_kind_t other_layers; /* KVS_LAYER_WINDOW or KVS_LAYER_STATE */
    int64_t window_tokens;  /* W of a window layer, > 0 with WINDOW */
    /* State layers: heads of a state layer, split over TP as KV heads are
     * (multiple or divisor of each TP), and the bytes one head's state of
     * one request takes: its conv part, then its recurrent (SSM) part. */
    int64_t state_heads;
    int64_t state_conv_bytes;
    int64_t state_ssm_bytes;
    /* Draft KV of speculative decoding (docs/kinds/draft.md): the layers of
     * a draft model (EAGLE / EAGLE3's one layer, DeepSeek's MTP layer, a
     * small standalone model) whose KV cache the decode needs as well,
     * indexed by the same pages. 0: no draft (the fields below must be 0).
     * The draft's layers move in the same regions, after the model's layer
     * slots, written by the same writers: its KV heads must split as the
     * model's (draft_kv_heads 0 or total_heads; an MLA draft is one latent),
     * of its own head_dim (draft_head_dim, 0: head_dim), in the model's dtype. */
    int64_t draft_layers;
    int64_t draft_head_dim;
    int64_t draft_kv_heads;
} kvs_layout_params_t;

typedef enum kvs_path {
    KVS_PATH_AUTO = 0,    /* staging when the TPs differ, direct when equal */
    KVS_PATH_STAGING = 1, /* gather, one write per writer, scatter */
    KVS_PATH_DIRECT = 2,  /* P == D: page runs to page runs */
    KVS_PATH_SLICE = 3    /* one write per page run (or token when heads are
                             sliced) x layer x K/V: the baseline */
} kvs_path_t;

/* "auto", "staging", "direct", "slice" -> path; KVS_EINVAL otherwise. */
KVS_API int kvs_path_parse(const char *name, kvs_path_t *out);

KVS_API const char *kvs_path_name(kvs_path_t path);

/* A validated plan. Filled by kvs_layout_init; read-only afterwards. */
typedef struct kvs_layout {
    int64_t total_heads, head_dim, elem_bytes, layers, page_size;
    kvs_dtype_t dtype;
    int64_t prefill_tp, decode_tp, prefill_pp, decode_pp;
    int64_t chunk_tokens;     /* C after defaulting */
    int64_t grid_tokens;      /* G = max(1, C / lcm) * lcm, lcm of the two
                                 sides' page sizes (ps when equal) */
    int64_t chunk_pages;      /* F = G / decode_page_size: decode pages of
                                 a chunk (the grid's pages are the decode's) */
    int64_t src_heads;        /* heads on a prefill rank: max(1, H / P) */
    int64_t dst_heads;        /* heads on a decode rank: max(1, H / D) */
    int64_t decode_layers;    /* the most layers one decode stage holds:
                                 ceil(layers / Dp), the layer slots of the
                                 largest region (stage by stage:
                                 kvs_layout_stage_layers) */
    int64_t prefill_layers;   /* the most layers one prefill stage holds:
                                 ceil(layers / Pp). Both are layers / PP
                                 when the split is even */
    int64_t tp_writers;       /* W: the prefill ranks that write a
                                 decode rank's region, one per distinct
                                 head of its sources: min(S, max(1, H / D))
                                 (1 with MLA); with state layers those
                                 and the first holder of each distinct
                                 state head, writing its state alone */
    int64_t expected_arrivals;/* W * (Dp == 1 ? Pp : 1): of one CP rank's
                                 part; a chunk's own with prefill_cp > 1:
                                 kvs_layout_chunk_arrivals */
    int64_t targets_per_prefill; /* decode ranks one prefill rank serves */
    kvs_path_t path;          /* STAGING when P != D, else DIRECT */
    kvs_kv_kind_t kind;       /* what a layer holds */
    int64_t planes;           /* buffers per layer: 2 (K, V), 1 (MLA) */
    int64_t tp_sources;       /* prefill TP ranks that take part in a decode
                                 rank's rooms: S = P > D ? P / D : 1.
                                 Writers 0..W-1 are sources 0..W-1; with
                                 H >= P every source writes (W = S); with
                                 replicated heads (H < P) or MLA only the
                                 first rank of each run holding the same
                                 heads: the others report their status and
                                 write nothing */
    int64_t decode_page_size; /* tokens per decode page (page_size is the
                                 prefill's); equal to page_size unless the
                                 params gave another */
    int64_t prefill_cp;       /* prefill context-parallel ranks (>= 1) */
    int64_t cp_align_tokens;  /* a CP rank's range starts at a multiple of
                                 this: lcm of the two page sizes (the grid's
                                 unit), so every CP part of a chunk starts a
                                 page on both sides */
    kvs_kv_scales_t kv_scales; /* scale planes beside K / V (0: none) */
    int64_t scale_block;      /* elements per scale (per-block), else 0 */
    int64_t scale_bytes;      /* bytes of one head's scales in a token row:
                                 0, 4 (per-token) or head_dim / scale_block.
                                 A staging layer slot holds its T * nh KV
                                 rows, then their T * nh scale rows */
    /* Hybrid layers (docs/kinds/hybrid.md): as the params gave them, 0 for
     * a model of full attention only (full_attn_every 0). */
    int64_t full_attn_every;
    kvs_layer_kind_t other_layers;
    int64_t window_tokens;
    int64_t state_heads;
    int64_t state_head_bytes; /* conv + ssm bytes of one state head */
    int64_t state_conv_bytes, state_ssm_bytes;
    int64_t state_src_heads;  /* state heads on a prefill rank */
    int64_t state_dst_heads;  /* state heads on a decode rank */
    /* Draft KV (docs/kinds/draft.md): 0 layers without a draft. A writer
     * block is the model's layer slots (K slots, then V slots), then the
     * draft's (K slots, then V slots), each slot [row][writer's heads]
     * [draft_head_dim x elem_bytes]: kvs_layout_draft_part_bytes. With
     * PP the draft is the last stage's on both sides
     * (kvs_layout_draft_stage): only that decode stage's blocks end with
     * it, and only the last prefill stage writes it. */
    int64_t draft_layers;
    int64_t draft_head_dim;   /* head_dim after defaulting; 0 without draft */
} kvs_layout_t;

/* Validates params and derives the plan. On error returns its code and, when
 * err != NULL, fills err->msg with the field to change. Layers need not
 * divide by the PP sizes (spec §4: the last layers % PP stages hold one
 * more), but every stage must hold one (KVS_EPP_SPLIT otherwise). */
KVS_API int kvs_layout_init(kvs_layout_t *out, const kvs_layout_params_t *params,
                            kvs_error_t *err);

/* The layers stage `stage` of the prefill (role KVS_ROLE_PREFILL, stages
 * [0, prefill_pp)) or the decode side (KVS_ROLE_DECODE, [0, decode_pp)) of
 * a layout holds, as kvs_pp_stage_layers splits them. A decode stage's
 * layers are the layer slots of its regions, matched by global layer id:
 * prefill stage s writes into decode stage e at slot
 * first_layer(s) - first_layer(e). KVS_EINVAL for a NULL lay or out or an
 * unknown role, KVS_ERANGE for a stage outside the side's PP. */
KVS_API int kvs_layout_stage_layers(const kvs_layout_t *lay, kvs_role_t role,
                                    int64_t stage, int64_t *first_layer,
                                    int64_t *num_layers);

/* One writer of a decode rank's region. */
typedef struct kvs_writer {
    int64_t writer_index;   /* position in the region, 0..W-1 */
    int64_t prefill_rank;   /* prefill TP rank that writes it */
    kvs_head_slice_t heads;
    int64_t offset_bytes;   /* from the start of the region */
    int64_t len_bytes;      /* T * nh * (hd * s + scale_bytes) * Lx * planes,
                               Lx the layers of the region's decode stage:
                               each layer slot its KV rows then their scale
                               rows (scale_bytes 0 without scales); plus,
                               at the decode stage that holds a draft
                               (kvs_layout_draft_stage), the draft part
                               (kvs_layout_draft_part_bytes) */
} kvs_writer_t;

/* Writer i of the region of decode rank d at decode stage e (its layer
 * slots Lx are that stage's layers, kvs_layout_stage_layers) for a chunk of
 * `tokens` tokens (0..G). KVS_EINVAL for a NULL lay or out, KVS_ERANGE for
 * d, e, i or tokens out of range.
 * KVS_ENOTSUP for a hybrid layout (full_attn_every > 1): its blocks depend
 * on the chunk's place in the request, kvs_layout_hybrid_writer. */
KVS_API int kvs_layout_writer(const kvs_layout_t *lay, int64_t decode_rank,
                              int64_t decode_stage, int64_t writer_index,
                              int64_t tokens, kvs_writer_t *out);
/* Total region bytes of decode rank d at decode stage e for a chunk of
 * `tokens` tokens; errors as kvs_layout_writer. */
KVS_API int kvs_layout_region_bytes(const kvs_layout_t *lay, int64_t decode_rank,
                                    int64_t decode_stage, int64_t tokens,
                                    int64_t *out_bytes);
/* The largest region over all decode ranks and decode stages for a full
 * chunk (G tokens): that of a stage holding decode_layers layers.
 * Hybrid: the largest over the stages of G rows in every full and window
 * layer slot plus the state part (an upper bound of any chunk's region). */
KVS_API int64_t kvs_layout_max_region_bytes(const kvs_layout_t *lay);
/* Decode rank that prefill rank r serves as its i-th target
 * (0 <= i < targets_per_prefill). */
KVS_API int kvs_layout_target(const kvs_layout_t *lay, int64_t prefill_rank,
                              int64_t i, int64_t *out_decode_rank);
/* Writer index of prefill rank r inside decode rank d's region; KVS_ENOENT
 * when r does not write to d (with MLA or replicated heads: when r is a
 * source that only reports, kvs_layout_source_index). */
KVS_API int kvs_layout_writer_index(const kvs_layout_t *lay, int64_t prefill_rank,
                                    int64_t decode_rank, int64_t *out_index);
/* Index of prefill rank r among the tp_sources prefill ranks that take part
 * in decode rank d's rooms (writers and, with MLA or replicated heads,
 * the ranks that only report); KVS_ENOENT when r takes no part in them,
 * KVS_ERANGE for a rank out of range. A source j < tp_writers is writer j. */
KVS_API int kvs_layout_source_index(const kvs_layout_t *lay, int64_t prefill_rank,
                                    int64_t decode_rank, int64_t *out_index);
/* The inverse: the prefill rank of source j (0 <= j < tp_sources) of
 * decode rank d. KVS_EINVAL for a NULL argument, KVS_ERANGE for d or j out
 * of range. */
KVS_API int kvs_layout_source_rank(const kvs_layout_t *lay, int64_t decode_rank,
                                   int64_t source_index, int64_t *out_prefill_rank);
/* Bytes of one layer block (one K, V or latent layer) of one writer:
 * tokens * num_heads * (head_dim * elem_bytes + scale_bytes), its KV rows
 * then, with scales, their scale rows. */
KVS_API int64_t kvs_layout_layer_block_bytes(const kvs_layout_t *lay,
                                             int64_t tokens, int64_t num_heads);
/* Bytes of the draft part that ends a writer block of `tokens` rows and
 * num_heads heads (kvs_writer_t.len_bytes counts it): draft_layers x planes
 * slots of tokens * num_heads * draft_head_dim * elem_bytes, K's then V's;
 * it starts at len_bytes minus this. 0 without a draft. */
KVS_API int64_t kvs_layout_draft_part_bytes(const kvs_layout_t *lay, int64_t tokens,
                                            int64_t num_heads);
/* The pipeline stage of `role` (KVS_ROLE_PREFILL or KVS_ROLE_DECODE) that
 * holds a draft model's layers: the last, prefill_pp - 1 or decode_pp - 1
 * (engines put EAGLE heads and MTP layers after the model's last layer).
 * The last prefill stage alone writes draft parts, and only the regions of
 * the last decode stage hold them (with decode PP 1: after the model's
 * layers of every prefill stage in each writer block). -1 without a draft,
 * for a NULL lay or an unknown role. */
KVS_API int64_t kvs_layout_draft_stage(const kvs_layout_t *lay, kvs_role_t role);

/* ------------------------------------------------------------------------ */
/* Built-in model shapes                                                     */
/* ------------------------------------------------------------------------ */

/* What the layout planner needs from a well-known model (`kvstage plan
 * --model NAME`). Static storage, read-only; new fields go at the end. */
typedef struct kvs_model {
    const char *name;     /* lower case, e.g. "llama-3.1-70b" */
    int64_t total_heads;  /* KV heads of the whole model (GQA groups) */
    int64_t head_dim;
    int64_t layers;
    kvs_dtype_t dtype;    /* KV cache dtype as usually served */
    const char *note;     /* one short line for a model list */
    kvs_kv_kind_t kind;   /* what a layer holds; with KVS_KV_MLA total_heads
                             is 1 and head_dim the latent dim */
    /* Hybrid layers (kvs_layout_params_t's fields of the same names; 0 for
     * a model of full attention only). */
    int64_t full_attn_every;
    kvs_layer_kind_t other_layers;
    int64_t window_tokens;
    int64_t state_heads, state_conv_bytes, state_ssm_bytes;
} kvs_model_t;

/* The model called `name` (ASCII case-insensitive); NULL if unknown. */
KVS_API const kvs_model_t *kvs_model_find(const char *name);
/* Number of built-in models, and the i-th one (NULL when i >= count). */
KVS_API size_t kvs_model_count(void);
KVS_API const kvs_model_t *kvs_model_at(size_t i);

/* ------------------------------------------------------------------------ */
/* Chunk grid (spec §5)                                                      */
/* ------------------------------------------------------------------------ */

/* A chunk of the transferred suffix of a request. */
typedef struct kvs_chunk {
    int64_t index;       /* chunk id, stable across sends */
    int64_t page_start;  /* first page of the suffix, = index * F */
    int64_t num_pages;   /* <= F */
    int64_t token_start; /* absolute token positions */
    int64_t token_end;
} kvs_chunk_t;

/* What one send of [start, end) becomes. */
typedef struct kvs_send {
    int64_t sent_end;    /* end actually sent: floored to the grid unless final */
    int64_t first_chunk; /* first chunk id it makes */
    int64_t num_chunks;  /* >= 1 for a final send (an empty one still makes a
                            metadata-only send); may be 0 for a non-final send
                            that is shorter than the grid */
} kvs_send_t;

/* Plans one send. base is the page-aligned cached prefix of the decode
 * (KVS_EPREFIX_ALIGN otherwise); start must be base or a previous sent_end;
 * end >= start. Non-final sends are floored to base + k*G. */
KVS_API int kvs_grid_send(const kvs_layout_t *lay, int64_t base, int64_t start,
                          int64_t end, bool final, kvs_send_t *out);
/* Chunk `index` of a suffix [base, total_end). */
KVS_API int kvs_grid_chunk(const kvs_layout_t *lay, int64_t base,
                           int64_t total_end, int64_t index, kvs_chunk_t *out);
/* ceil(pages / F), at least 1. */
KVS_API int64_t kvs_grid_num_chunks(const kvs_layout_t *lay, int64_t pages);

/* Context parallelism (docs/kinds/context-parallel.md). A request of
 * total_tokens tokens is split over the prefill_cp CP ranks in contiguous
 * ranges of `per` = ceil(total / CP) rounded up to cp_align_tokens tokens:
 * CP rank c holds [min(total, c * per), min(total, (c + 1) * per)), empty
 * for the last ranks of a short prompt. A CP rank's pages hold its range
 * only: token t at its page (t - start) / page_size. KVS_EINVAL for a NULL
 * argument or total < 0, KVS_ERANGE for c outside [0, prefill_cp). */
KVS_API int kvs_layout_cp_range(const kvs_layout_t *lay, int64_t total_tokens,
                                int64_t cp_rank, int64_t *out_start, int64_t *out_end);

/* What one CP rank writes into one chunk's region. The region of a chunk
 * of tokens [ts, te) is its CP parts in token order, each laid out as a
 * whole region of its tokens (its TP writers, spec §4): the part of tokens
 * [a, b) starts (a - ts) x the region's bytes per token in, so with
 * prefill_cp 1 the one part is the region of spec §4, byte for byte. */
typedef struct kvs_cp_part {
    int64_t cp_rank;
    int64_t token_start, token_end; /* [a, b): absolute, inside the chunk */
    int64_t local_token_start;      /* a - the CP rank's range start: where
                                       its rows start in its own pages */
    int64_t offset_bytes;           /* from the start of the region */
    int64_t len_bytes;              /* all its TP writers' bytes */
} kvs_cp_part_t;

/* The part of CP rank c in the region of decode rank d at decode stage e
 * for `chunk` of a request of total_tokens. KVS_ENOENT when c's range does
 * not meet the chunk (it writes nothing into it); an empty chunk (the
 * metadata-only send) is CP rank 0's, a part of 0 tokens (of a hybrid
 * layout: the CP rank holding the last token's, with the state if any).
 * A hybrid layout's part is the hybrid region of its tokens, after the
 * bytes of the parts before it (docs/kinds/hybrid.md). KVS_EINVAL for a
 * NULL argument, KVS_ERANGE for d, e or c out of range or a chunk that is
 * not one of [0, total_tokens) (longer than G, or reversed). */
KVS_API int kvs_layout_cp_part(const kvs_layout_t *lay, int64_t decode_rank,
                               int64_t decode_stage, int64_t total_tokens,
                               const kvs_chunk_t *chunk, int64_t cp_rank,
                               kvs_cp_part_t *out);
/* The CP ranks whose ranges meet `chunk` (they are consecutive): the first
 * and how many (>= 1). A chunk's writers are tp_writers x that many, each
 * writer j of CP rank c known by its region-wide index c * tp_writers + j,
 * and its expected arrivals that many x tp_writers x (Dp == 1 ? Pp : 1)
 * (kvs_layout_chunk_arrivals). Errors as kvs_layout_cp_part. */
KVS_API int kvs_layout_cp_writers(const kvs_layout_t *lay, int64_t total_tokens,
                                  const kvs_chunk_t *chunk, int64_t *out_first_cp,
                                  int64_t *out_count);
/* The arrivals a decode stage waits for before it scatters `chunk`
 * (expected_arrivals when prefill_cp is 1); 0 for a chunk not of [0,
 * total_tokens) or a NULL argument. */
KVS_API int64_t kvs_layout_chunk_arrivals(const kvs_layout_t *lay, int64_t total_tokens,
                                          const kvs_chunk_t *chunk);

/* Hybrid layers (src/hybrid.c, docs/kinds/hybrid.md) ----------------------- */

/* The kind of global layer `layer` (KVS_LAYER_FULL for every layer of a
 * non-hybrid layout). KVS_EINVAL for a NULL argument, KVS_ERANGE for a
 * layer outside [0, layers). */
KVS_API int kvs_layout_layer_kind(const kvs_layout_t *lay, int64_t layer,
                                  kvs_layer_kind_t *out);
/* The tokens of a request of total_tokens tokens whose rows of layer
 * `layer` move: [0, total) for a full layer; for a window layer those of
 * the pages that hold its last window_tokens tokens, the window start
 * floored to the grid unit (cp_align_tokens: a page of both sides):
 * [floor(max(0, total - W) / u) * u, total); an empty range [total, total)
 * for a state layer (it has no pages). Errors as kvs_layout_layer_kind,
 * and KVS_EINVAL for total_tokens < 0. */
KVS_API int kvs_layout_layer_tokens(const kvs_layout_t *lay, int64_t layer,
                                    int64_t total_tokens, int64_t *out_start,
                                    int64_t *out_end);

/* One writer's block of a hybrid region. A writer block is in parts, one
 * per prefill stage holding layers of the decode stage, in stage order
 * (kvs_layout_hybrid_part): one part, the whole block, when both sides
 * have the same PP or the prefill PP 1; with prefill PP into a decode of
 * PP 1 a part per prefill stage, so each stage writes one span. A part
 * holds, per plane (K then V), one slot per layer of it that has rows in
 * the chunk (full layers; window layers whose window meets the chunk), in
 * layer order, each of the slot's tokens x nh heads rows; then, in the
 * request's last chunk alone, its state: per state layer of the part, in
 * layer order, state_nh state heads of state_head_bytes (conv, then ssm).
 * With fewer KV (or state) heads than prefill ranks, of each run of
 * prefill ranks holding the same heads the first alone writes them: the
 * writers of KV come first, each with its state when it is the first
 * holder of its state heads too (else state_heads.num_heads 0); then the
 * writers of their state alone (w.heads.num_heads 0, kv_bytes 0). */
typedef struct kvs_hybrid_writer {
    kvs_writer_t w;            /* heads, offset and len of the whole block */
    kvs_head_slice_t state_heads; /* state heads this writer copies */
    int64_t token_start;       /* the chunk's first token (absolute) */
    int64_t tokens;            /* T: rows of a full slot */
    int64_t full_slots;        /* full layers of the stage (slots of T rows) */
    int64_t window_slots;      /* window layers of the stage with rows here */
    int64_t window_token_start;/* first token of a window slot (absolute) */
    int64_t window_tokens;     /* rows of a window slot (0: no window slot) */
    int64_t kv_bytes;          /* bytes of the slots (of every part) */
    int64_t state_layers;      /* state layers of the stage (in the state
                                  part of the last chunk, else 0) */
    int64_t state_offset_bytes;/* from the block's start, the first part's
                                  state: kv_bytes with one part */
    int64_t state_bytes;       /* state_layers x state_nh x state_head_bytes
                                  (of every part) */
    int64_t draft_offset_bytes;/* from the block's start: a draft's part
                                  (docs/kinds/draft.md), its block's last
                                  bytes, in the last decode stage */
    int64_t draft_bytes;       /* kvs_layout_draft_part_bytes of the chunk's
                                  rows and the writer's heads (0: none) */
} kvs_hybrid_writer_t;

/* Writer i of decode rank d's region at decode stage e for `chunk` of a
 * request of total_tokens tokens (the suffix's chunks, kvs_grid_chunk; a
 * chunk ending at total_tokens is the last and carries the state). Also
 * right for a layout of full layers alone (then the block is
 * kvs_layout_writer's). KVS_EINVAL for a NULL argument, KVS_ERANGE as
 * kvs_layout_writer and for a chunk not inside [0, total_tokens). */
KVS_API int kvs_layout_hybrid_writer(const kvs_layout_t *lay, int64_t decode_rank,
                                     int64_t decode_stage, int64_t writer_index,
                                     int64_t total_tokens, const kvs_chunk_t *chunk,
                                     kvs_hybrid_writer_t *out);
/* Where one layer's bytes are in a writer block (kvs_layout_hybrid_writer's
 * out, for the same decode stage). For a full or window layer and plane
 * (0 K, 1 V): its slot, rows of tokens [token_start, token_start + rows),
 * token-major [row][head of the writer's heads][head bytes]; for a state
 * layer (plane 0): its part of the state, [state head of the writer's
 * state heads][state_head_bytes], rows 0. */
typedef struct kvs_hybrid_slot {
    kvs_layer_kind_t kind;
    int64_t offset_bytes; /* from the writer block's start */
    int64_t token_start, rows;
    int64_t len_bytes;
} kvs_hybrid_slot_t;

/* The slot of global layer `layer` of decode stage e, plane `plane`, in a
 * writer block hw of that stage. KVS_ENOENT when the layer has no bytes in
 * the block (a window layer whose window misses the chunk, a state layer
 * outside the last chunk or with plane 1: a state is one part); KVS_EINVAL
 * for a NULL argument, KVS_ERANGE for a layer outside the stage or a plane
 * outside [0, planes). */
KVS_API int kvs_layout_hybrid_slot(const kvs_layout_t *lay, const kvs_hybrid_writer_t *hw,
                                   int64_t decode_stage, int64_t layer, int64_t plane,
                                   kvs_hybrid_slot_t *out);
/* The part of a writer block one prefill stage writes: the layers the
 * stage and the decode stage both hold, their slots then their state. */
typedef struct kvs_hybrid_part {
    int64_t prefill_stage;
    int64_t first_layer, num_layers; /* global layers of the part */
    int64_t offset_bytes;            /* from the writer block's start */
    int64_t len_bytes;               /* kv_bytes + state_bytes + draft_bytes
                                        (0: nothing to write in this chunk) */
    int64_t kv_bytes;                /* its slots, plane after plane */
    int64_t state_bytes;             /* its state, after its slots */
    int64_t draft_bytes;             /* a draft's part, after its state (the
                                        last prefill stage's part alone) */
} kvs_hybrid_part_t;

/* The part prefill stage s writes of writer block hw (kvs_layout_hybrid_
 * writer's out, for decode stage e). KVS_ENOENT when stage s holds none of
 * stage e's layers; KVS_EINVAL for a NULL argument, KVS_ERANGE for a stage
 * outside its side's PP. */
KVS_API int kvs_layout_hybrid_part(const kvs_layout_t *lay, const kvs_hybrid_writer_t *hw,
                                   int64_t decode_stage, int64_t prefill_stage,
                                   kvs_hybrid_part_t *out);
/* Bytes of one request's state on one rank of `role` for the layers of
 * `stage`: state layers x that side's state heads x state_head_bytes (the
 * per-request state slot). 0 without state layers. KVS_EINVAL / KVS_ERANGE
 * as kvs_layout_stage_layers. */
KVS_API int kvs_layout_state_slot_bytes(const kvs_layout_t *lay, kvs_role_t role,
                                        int64_t stage, int64_t *out_bytes);

/* ------------------------------------------------------------------------ */
/* Staging ring allocator (spec §6), thread-safe                             */
/* ------------------------------------------------------------------------ */

typedef struct kvs_ring kvs_ring_t;

typedef struct kvs_watermark {
    uint64_t round;
    uint64_t offset;
} kvs_watermark_t;

typedef struct kvs_ring_alloc {
    uint64_t id;     /* opaque handle for kvs_ring_free */
    uint64_t offset; /* region start in the ring */
    uint64_t round;
    uint64_t end;    /* offset + len */
} kvs_ring_alloc_t;

/* Creates a ring of size_bytes with at most max_live live allocations; the
 * ring allocates nothing after this. *out is owned by the caller. */
KVS_API int kvs_ring_create(uint64_t size_bytes, uint32_t max_live, kvs_ring_t **out);
/* Frees the ring; live allocations are dropped with it. NULL is a no-op. */
KVS_API void kvs_ring_destroy(kvs_ring_t *ring);
/* Assigns len_bytes (> 0). Never blocks; may overlap live data of the
 * previous round (overcommit). KVS_EINVAL for a NULL ring/out or len 0,
 * KVS_EOVERSIZED when len > size, KVS_ERING_LIVE when max_live allocations
 * are live, KVS_ERANGE when the live byte count would overflow 64 bits. A
 * failed assign changes nothing. */
KVS_API int kvs_ring_assign(kvs_ring_t *ring, uint64_t len_bytes, kvs_ring_alloc_t *out);
/* Frees an allocation; *wm_out (may be NULL) gets the new watermark.
 * KVS_ENOENT for an unknown or already freed id. */
KVS_API int kvs_ring_free(kvs_ring_t *ring, uint64_t id, kvs_watermark_t *wm_out);
/* Getters; ring must not be NULL. */
KVS_API kvs_watermark_t kvs_ring_watermark(const kvs_ring_t *ring);
KVS_API uint64_t kvs_ring_size_bytes(const kvs_ring_t *ring);
KVS_API uint32_t kvs_ring_live_count(const kvs_ring_t *ring);
/* Sum of the lengths of live allocations. */
KVS_API uint64_t kvs_ring_live_bytes(const kvs_ring_t *ring);
/* Prefill-side readiness of an allocation (round, end) against the last
 * watermark seen from its decode: r <= 0 || r-1 < wr || (r-1 == wr && end <= wt). */
KVS_API bool kvs_ring_ready(kvs_watermark_t wm, uint64_t round, uint64_t end);

/* ------------------------------------------------------------------------ */
/* KV manager and handlers (spec §8)                                         */
/* ------------------------------------------------------------------------ */

typedef struct kvs_manager kvs_manager_t;
typedef struct kvs_decode kvs_decode_t;
typedef struct kvs_device kvs_device_t; /* see <kvstage/backend.h> */
typedef struct kvs_fabric kvs_fabric_t; /* see <kvstage/backend.h> */

#define KVS_DEFAULT_RING_BYTES (4096ull << 20)
#define KVS_DEFAULT_TRANSFER_WORKERS 4
#define KVS_DEFAULT_RING_MAX_LIVE 4096
#define KVS_DEFAULT_STALL_TIMEOUT_NS (30ull * 1000000000ull)
#define KVS_DEFAULT_RETRY_TIMEOUT_NS (2ull * 1000000ull)
/* The default first retransmission timeout over a fabric with
 * KVS_FABRIC_CAP_RELIABLE_SEND (never above stall_timeout_ns / 32): there
 * a message is lost only with its connection, so the timer is a backstop,
 * floored as TCP floors its own (Linux: 200 ms). */
#define KVS_RELIABLE_RETRY_TIMEOUT_NS (200ull * 1000000ull)

/* The kv args of spec §8. Zero fields take their default. */
typedef struct kvs_manager_config {
    kvs_role_t role;
    bool staging;             /* staging on/off; must match on both sides */
    bool is_mla;              /* deprecated: true is kv_kind = KVS_KV_MLA
                                 (once refused staging: KVS_EMLA) */
    int64_t total_heads;      /* model's total KV heads, 0 if unknown */
    int64_t heads_per_rank;   /* KV heads on this rank, 0 if unknown */
    int64_t head_dim;
    kvs_dtype_t dtype;
    int64_t layers;           /* layers of the KV pool of this rank: its
                                 stage's share of model_layers */
    int64_t page_size;
    int64_t tp_rank, tp_size;
    int64_t pp_rank, pp_size;
    int64_t peer_tp_size;     /* TP of the default peer instance (instance 0,
                                 group 0, see kvs_peer_t); decode: 0 = this
                                 rank's TP; prefill: 0 = learned when it
                                 registers (given: a registration of another
                                 TP is refused) */
    int64_t peer_pp_size;     /* PP of the default peer instance, 0: 1 */
    int64_t context_parallel; /* prefill CP size, 0 -> 1: a prefill rank's
                                 own instance's (kvs_layout_params_t.
                                 prefill_cp); in the fingerprint. > 1 moves
                                 on every path, each CP rank writing its
                                 own token range; a decode rank
                                 declares CP instances with
                                 kvs_instance_desc_t.cp_size (> 1 here on a
                                 decode: KVS_ECONTEXT_PARALLEL); see cp_rank */
    int64_t chunk_tokens;     /* C, 0 -> 8192 */
    uint64_t ring_bytes;      /* decode ring, 0 -> 4096 MiB */
    uint32_t ring_max_live;   /* live ring allocations, 0 -> 4096 */
    uint32_t transfer_workers;/* prefill staging buffers, 0 -> 4 */
    kvs_log_t log;            /* level 0 with fn NULL: default level from env */
    kvs_path_t path;          /* AUTO by default; both sides must agree */
    uint64_t session_id;      /* this rank's incarnation, 0 -> derived from
                                 role and ranks; a restart with the same id
                                 resets the peers' state for it */
    uint32_t max_rooms;       /* concurrent requests, 0 -> 1024 */
    uint32_t max_inflight_writes; /* posted, not completed writes, 0 -> 1024 */
    uint64_t stall_timeout_ns;/* a request with no progress for this long
                                 fails with KVS_ETIMEDOUT and its peers are
                                 told; one more such wait for their reports
                                 and its regions are released. 0 -> 30 s */
    uint64_t retry_timeout_ns;/* a control message not acknowledged within
                                 this long (plus the link's measured round
                                 trip) is sent again, the wait doubling up
                                 to stall_timeout_ns / 32 (never below
                                 this); also the first wait before a lost
                                 peer is reconnected. 0 -> 2 ms, and for
                                 the retransmissions over a fabric with
                                 KVS_FABRIC_CAP_RELIABLE_SEND
                                 KVS_RELIABLE_RETRY_TIMEOUT_NS (at most
                                 stall_timeout_ns / 32) */
    /* Optional observer of spans the handlers spend waiting (today:
     * "wait-for-watermark" per chunk), in the fabric's clock; for traces. */
    void (*trace)(void *ctx, const char *what, uint64_t room, int64_t chunk,
                  uint64_t start_ns, uint64_t end_ns);
    void *trace_ctx;
    /* The application's own tag, 0 by default: both sides must agree on it
     * or the registration is refused with KVS_EFINGERPRINT, as for the
     * model shape. Put in it a hash of whatever else the application needs
     * both sides to share (kvstage serve: its workload flags), so that a
     * mismatch is refused by name instead of failing requests. */
    uint32_t app_tag;
    /* The model's layers, over every pipeline stage; 0 -> layers * pp_size
     * (an even split). Stages split them as spec §4 says (the last
     * model_layers % pp_size stages hold one more, kvs_pp_stage_layers), so
     * with an uneven split each rank's `layers` differs by stage: create
     * refuses (KVS_EPP_SPLIT) a `layers` that is not stage pp_rank's share. */
    int64_t model_layers;
    /* This rank's instance (spec §12): the application's id of the model
     * replica the rank belongs to, and with attention data parallelism the
     * attention group it serves in (tp_rank / tp_size are then its rank in
     * the group and attn_tp). Peers name it in their rooms. */
    uint64_t instance_id;
    int64_t dp_rank;
    uint32_t max_instances;   /* peer instances (attention groups) known at
                                 once, 0 -> 64 */
    uint32_t max_peers;       /* peer ranks connected at once, 0 -> 256 */
    /* The largest aux payload a request carries from prefill to decode (the
     * engine's own per-request bytes: first token, logprobs, hidden state),
     * at most KVS_AUX_BYTES_MAX; 0 (the default) carries none. Both sides
     * must agree on it (the fingerprint). */
    uint32_t max_aux_bytes;
    /* The cluster secret (docs/security.md): the path of a file holding it
     * (trailing newlines dropped) or the name of an environment variable
     * holding it, never the secret itself; at most one of the two, read
     * once at kvs_manager_create (KVS_EINVAL naming what to change when it
     * is unreadable, empty or shorter than 16 bytes). With a secret, every
     * registration proves both sides know it (HMAC-SHA-256 over fresh
     * nonces), and a peer that cannot is refused (KVS_EAUTH) before any
     * key, address or KV byte goes to it. Both NULL: an open cluster, as
     * before; the log says so once. The strings are borrowed during create
     * only. */
    const char *secret_file;
    const char *secret_env;
    /* What a layer of the KV pool holds (kvs_kv_kind_t; 0: GQA, K and V).
     * KVS_KV_MLA: one latent buffer per layer (set_kv_buffers' v_base NULL,
     * kvs_kv_layer_t.v_addr 0), head_dim the latent dim, heads 0 or 1 (else
     * KVS_EMLA). Both sides must agree (the fingerprint). */
    kvs_kv_kind_t kv_kind;
    /* Tokens per page of the peer side's KV pool (the decode's on a
     * prefill, the prefill's on a decode), 0: page_size. Both sides declare
     * both sizes and the fingerprint compares them; with different sizes the
     * chunk grid is a multiple of their lcm (docs/kinds/page-sizes.md). */
    int64_t peer_page_size;
    /* Scale planes of an FP8 KV cache (kvs_kv_scales_t, 0: none; dtype must
     * be fp8): a scale buffer beside each K and V buffer
     * (kvs_kv_buffers_t.ks_base / vs_base), moved with the rows of its
     * heads on every path. Both sides must agree (the fingerprint). See
     * docs/kinds/fp8-scales.md. */
    kvs_kv_scales_t kv_scales;
    int64_t scale_block;      /* elements per scale, per-block only; 0 -> 32 */
    /* A prefill rank's context-parallel rank in [0, context_parallel): the
     * token range of each request it holds (kvs_layout_cp_range); carried
     * in its REGISTER_ACK. 0 on a decode rank. */
    int64_t cp_rank;
    /* Hybrid models (docs/kinds/hybrid.md): the layer pattern, as
     * kvs_layout_params_t's fields of the same names (all 0: every layer
     * full attention). Both sides must agree (the fingerprint). Moved on
     * the staging path only (direct and slice refuse it by name, and AUTO
     * picks staging), with prefill PP equal to the decode's. State layers
     * need state buffers (kvs_kv_buffers_t.state_base) and a state slot per
     * request (kvs_decode_room_set_state_slot /
     * kvs_prefill_room_set_state_slot). */
    int64_t full_attn_every;
    kvs_layer_kind_t other_layers;
    int64_t window_tokens;
    int64_t state_heads;
    int64_t state_conv_bytes, state_ssm_bytes;
    /* Draft KV of speculative decoding (docs/kinds/draft.md): the layers of
     * a draft model whose KV moves with the model's, as
     * kvs_layout_params_t's fields of the same names (all 0: no draft).
     * The draft's heads split as the model's (draft_kv_heads 0 or
     * total_heads), its head dim is its own (draft_head_dim, 0: head_dim),
     * its pages are the model's. Both sides must agree (the fingerprint).
     * Moved on the staging path only (direct and slice refuse it by name,
     * and AUTO picks staging); needs the draft buffers
     * (kvs_kv_buffers_t.draft_k_base / draft_v_base). With PP every stage
     * gives the same fields, and the last stage of each side alone moves
     * the draft (kvs_layout_draft_stage): only it needs the draft's
     * buffers; a stage before it may pass them NULL (given, they are not
     * read). */
    int64_t draft_layers;
    int64_t draft_head_dim;
    int64_t draft_kv_heads;
} kvs_manager_config_t;

#define KVS_AUX_BYTES_MAX (1u << 20)

/* Per layer K and V base device addresses of this rank's KV pool, laid out
 * [token_slot][local_head][dim]. The arrays are copied by the manager. A
 * pool of one plane per layer (MLA) gives its latent buffers as k_base and
 * v_base NULL. */
typedef struct kvs_kv_buffers {
    int64_t num_layers;       /* entries in k_base / v_base */
    const uint64_t *k_base;
    const uint64_t *v_base;   /* NULL for MLA */
    int64_t local_heads;
    int64_t page_size;
    int64_t num_pages;        /* pages in each layer buffer */
    /* With kv_scales: per layer the scale buffers of K and of V, laid out
     * [token_slot][local_head][scale bytes of a head] (4 per-token, head_dim
     * / block per-block); vs_base NULL for MLA. NULL without scales. */
    const uint64_t *ks_base;
    const uint64_t *vs_base;
    /* With state layers (config.full_attn_every, other_layers
     * KVS_LAYER_STATE): per layer of this pool, a state layer's buffer of
     * state_slots slots laid out [slot][local state head][conv bytes | ssm
     * bytes] (docs/kinds/hybrid.md); entries of other layers are not read
     * (nor are the k_base / v_base entries of a state layer). NULL and 0
     * without state layers. */
    const uint64_t *state_base;
    int64_t state_slots;
    /* With a draft (config.draft_layers > 0): per draft layer, its K and V
     * buffers laid out as the model's ([token_slot][local_head]
     * [draft_head_dim]), as many pages of page_size token slots, indexed
     * by the same page ids; draft_v_base NULL for MLA (one latent per
     * layer). NULL without a draft, and may be NULL on a pipeline stage
     * before the last (it holds no draft: kvs_layout_draft_stage). */
    const uint64_t *draft_k_base;
    const uint64_t *draft_v_base;
} kvs_kv_buffers_t;

/* One layer of this rank's KV pool as an engine holds it: a K and a V
 * buffer of `tokens` token slots (a contiguous per-layer tensor of shape
 * [pool_tokens, heads, head_dim], as sglang's k_buffer[l] / v_buffer[l]).
 * The strides are the engine's: kvstage needs the contiguous ones (element
 * = the dtype's size, head = head_dim elements, token = heads heads) and
 * refuses others, naming the layer and the stride. A hybrid model's state
 * layer (docs/kinds/hybrid.md) keeps no K or V: its descriptor is not
 * needed (pass it zeroed), checked or read; a full or window layer's is. */
typedef struct kvs_kv_layer {
    uint64_t k_addr, v_addr;     /* device addresses of token slot 0; MLA:
                                    the latent buffer as k_addr, v_addr 0 */
    int64_t tokens;              /* token slots of each of the two buffers */
    int64_t token_stride_bytes;  /* from one token slot to the next */
    int64_t head_stride_bytes;   /* from one head to the next */
    int64_t elem_stride_bytes;   /* from one element to the next */
    uint64_t ks_addr, vs_addr;   /* with kv_scales: the scale buffers of K and
                                    V (contiguous [tokens, heads, scale
                                    bytes]); MLA: vs_addr 0. 0 without */
} kvs_kv_layer_t;

/* An engine's flat list of KV buffers into per-layer descriptors: n_ptrs =
 * 2 x layers addresses, the K layers then the V layers (sglang's
 * kv_data_ptrs), each buffer's length in bytes (kv_data_lens) and its item
 * size, the bytes of one page of it (kv_item_lens: page_size x heads x
 * head_dim x the dtype's size). Fills out[0 .. n_ptrs / 2) (out_cap
 * entries at least). KVS_EINVAL naming the first buffer whose item size or
 * length disagrees with the geometry, or whose K and V lengths differ. */
KVS_API int kvs_kv_layers_from_ptrs(const uint64_t *ptrs, const uint64_t *lens,
                                    const uint64_t *item_lens, int64_t n_ptrs,
                                    int64_t page_size, int64_t local_heads, int64_t head_dim,
                                    kvs_dtype_t dtype, kvs_kv_layer_t *out, int64_t out_cap,
                                    kvs_error_t *err);

/* Creates a KV manager. dev and fab are borrowed and must outlive it. On
 * error nothing is allocated; err (may be NULL) gets the detail. Config
 * guards (chunk size, the default chunk of 8192 included, PP on a fabric
 * without per-layer writes) are checked here when staging is on; that
 * `layers` is stage pp_rank's share of model_layers (KVS_EPP_SPLIT), an MLA
 * kind's heads are 0 or 1 (KVS_EMLA) and context parallelism > 1 is on a
 * prefill (KVS_ECONTEXT_PARALLEL) always; a
 * one-plane kind's staging on a device of ops version < 4 is refused
 * (KVS_ENOTSUP). */
KVS_API int kvs_manager_create(const kvs_manager_config_t *cfg, kvs_device_t *dev,
                               kvs_fabric_t *fab, kvs_manager_t **out,
                               kvs_error_t *err);
/* KVS_EBUSY (and nothing freed) while a handler made from it lives. */
KVS_API int kvs_manager_destroy(kvs_manager_t *m);

/* Decode: allocates the staging ring on the device and creates its allocator.
 * Prefill: allocates one staging buffer per transfer worker. */
KVS_API int kvs_manager_init_staging(kvs_manager_t *m);
/* Registers the staging memory with the fabric (remote key). Needs
 * kvs_manager_init_staging first. */
KVS_API int kvs_manager_register_staging(kvs_manager_t *m);
/* Publishes the KV buffers (set_kv_buffer_tensors). Once per manager. */
KVS_API int kvs_manager_set_kv_buffers(kvs_manager_t *m, const kvs_kv_buffers_t *kv);
/* The same step from per-layer descriptors (`layers` entries, one per layer
 * of this rank's pool, each holding local_heads heads): each is checked
 * against the manager's head_dim, dtype, page size and layer count, and the
 * first layer or field that disagrees is named. Every layer must hold the
 * same number of token slots, a whole number of pages. With state layers
 * (config.full_attn_every, other_layers KVS_LAYER_STATE; the kinds of the
 * stage's share of model_layers) a state layer's descriptor is not needed:
 * pass it zeroed (one given is not checked, and its K / V are published as
 * 0: nothing reads them); a full or window layer without its K or V address
 * is refused (KVS_EINVAL naming the layer, its kind and the field). A stage
 * of state layers alone gives the pool's token slots as layer 0's tokens.
 * State buffers are not descriptors: a pattern with state layers publishes
 * through kvs_rank_create (kvs_rank_config_t.state_base) or
 * kvs_manager_set_kv_buffers. */
KVS_API int kvs_manager_set_kv_layers(kvs_manager_t *m, const kvs_kv_layer_t *layers,
                                      int64_t num_layers, int64_t local_heads);
/* Sets the head counts (either may be 0 = unknown). Allowed until a handler
 * is created. */
KVS_API int kvs_manager_set_heads(kvs_manager_t *m, int64_t total_heads,
                                  int64_t heads_per_rank);
/* Detail of the last error of this manager (never NULL for a non-NULL m). */
KVS_API const kvs_error_t *kvs_manager_last_error(const kvs_manager_t *m);
/* The staging ring of a decode manager, NULL before init_staging. Borrowed. */
KVS_API kvs_ring_t *kvs_manager_ring(kvs_manager_t *m);
/* Staging buffer i (decode: 0 is the ring; prefill: one per transfer
 * worker): device address, length and remote key (0 until registered).
 * KVS_ESTATE before init_staging, KVS_ERANGE for a bad index. */
KVS_API int kvs_manager_staging_buffer(const kvs_manager_t *m, uint32_t index,
                                       uint64_t *addr, uint64_t *len_bytes,
                                       uint64_t *rkey);
/* Number of staging buffers (0 before init_staging). */
KVS_API uint32_t kvs_manager_staging_count(const kvs_manager_t *m);
/* The path the handler runs (KVS_PATH_AUTO until a handler was created). */
KVS_API kvs_path_t kvs_manager_path(const kvs_manager_t *m);
/* The resolved layout (valid after a handler was created). */
KVS_API const kvs_layout_t *kvs_manager_layout(const kvs_manager_t *m);

/* Creates the decode staging handler. Guards, in this order: role must be
 * decode (KVS_ESTATE); when staging is on: allocator (KVS_ENO_ALLOCATOR),
 * registration (KVS_ESTATE), KV buffers (KVS_ENO_KV_BUFFERS), total heads
 * (KVS_EHEADS), layout (KVS_EHEAD_SPLIT / KVS_EPP_SPLIT). One handler per
 * manager (KVS_EALREADY). */
KVS_API int kvs_decode_create(kvs_manager_t *m, kvs_decode_t **out);
/* Destroys the handler; NULL is a no-op. */
KVS_API void kvs_decode_destroy(kvs_decode_t *d);

/* ---- the protocol (spec §7), driven by the caller --------------------------
 * Handlers are state machines: they never block or sleep. The caller calls
 * *_progress() whenever the backend signals work (a completion, a finished
 * copy) or the clock passes *_next_deadline_ns(); progress polls the fabric
 * and the device and advances every request it can. */

typedef struct kvs_prefill kvs_prefill_t;

/* The peer instance a room is paired with (spec §12): the id the
 * application gives the model replica of the other role, and with attention
 * data parallelism the attention group that serves the room (0 otherwise).
 * A group behaves as an instance of TP attn_tp. {0, 0} is the default peer
 * instance, whose geometry the config's peer_tp_size / peer_pp_size give. */
typedef struct kvs_peer {
    uint64_t instance;
    int64_t dp_rank;
} kvs_peer_t;

#define KVS_REASON_BYTES 192

/* The end of one request on one rank. */
typedef struct kvs_room_result {
    uint64_t room;
    int status;              /* KVS_OK or why the request failed */
    int64_t chunks;          /* chunks moved (staging) */
    uint64_t bytes;          /* payload bytes written (prefill) / received (decode) */
    uint64_t rdma_writes;    /* writes posted for it */
    uint64_t open_ns, done_ns;
    /* Decode, on success: the request's aux payload as the prefill gave it
     * (NULL and 0 when it gave none). Owned by the handler; valid until its
     * next progress (or step). */
    const void *aux;
    uint32_t aux_bytes;
    /* The peer instance (and attention group) the room was paired with;
     * metrics count rooms per peer instance by it. */
    kvs_peer_t peer;
    /* Why it failed, in words ("" when it succeeded): the refusal at open,
     * or the status, what the room was doing then (bootstrapping, waiting,
     * transferring), how long it had been silent for a stall, and the peer
     * that reported the failure; kvs_strerror(status) says what to change. */
    char reason[KVS_REASON_BYTES];
} kvs_room_result_t;

typedef struct kvs_handler_stats {
    uint64_t rdma_writes, rdma_write_bytes;
    uint64_t msgs_sent, msgs_received;
    uint64_t msgs_rejected;  /* malformed, stale or out of range: dropped */
    uint64_t copies;         /* gathers (prefill) or scatters (decode) */
    uint64_t watermark_waits;/* prefill: chunks requeued until the ring freed */
    uint64_t ring_peak_bytes;/* decode: most ring bytes live at once */
    uint64_t rooms_ok, rooms_failed;
    uint64_t msgs_retransmitted; /* sent again: not acknowledged in time */
    uint64_t msgs_duplicate;     /* received again (or after a loss): dropped */
    uint64_t peers_lost;         /* connections found dead (peer crashed) */
    uint64_t ring_live_bytes;    /* decode: ring bytes live now; 0 once every room
                                    has ended (more is a leak) */
    uint64_t msgs_unacked;       /* control messages sent and not yet acknowledged
                                    by their peers: 0 once the peers have all this
                                    side said, so closing it now loses them nothing
                                    (a decode's last DONE, say) */
    uint64_t auth_refused;       /* registrations refused for authentication (no
                                    secret, a wrong one, a replay): each logged
                                    with the peer's address */
    uint64_t rtt_smoothed_ns;    /* the smoothed round trip of a control message to
                                    its ACK (what the retransmission timeout
                                    follows), the largest over the live
                                    connections; 0 before the first sample */
    uint64_t keys_granted;       /* decode: region-scoped keys granted to writers
                                    (one per region, writer and write; 0 on a
                                    fabric without key_grant: docs/security.md) */
    uint64_t keys_revoked;       /* decode: of those, revoked (each before its
                                    region went back to the ring); equal to
                                    keys_granted once every room has ended */
} kvs_handler_stats_t;

/* Where an open room stands, as serving engines poll a transfer (sglang's
 * KVPoll: Failed 0, Bootstrapping 1, WaitingForInput 2, Transferring 3,
 * Success 4, the same numbers). */
typedef enum kvs_room_state {
    KVS_ROOM_FAILED = 0,        /* it failed; its result comes once no write can land */
    KVS_ROOM_BOOTSTRAPPING = 1, /* a peer rank of it is not connected and registered
                                   yet (prefill: or its decode's ROOM has not come) */
    KVS_ROOM_WAITING = 2,       /* waiting for input: no KV has moved yet (prefill:
                                   not computed; decode: nothing arrived) */
    KVS_ROOM_TRANSFERRING = 3,  /* KV is moving */
    KVS_ROOM_SUCCESS = 4        /* done: only in a result (an ended room is gone) */
} kvs_room_state_t;

/* "failed", "bootstrapping", "waiting", "transferring", "success". */
KVS_API const char *kvs_room_state_name(kvs_room_state_t state);


/* A prefill instance as a decode rank learns it from the application (the
 * original system's table of prefill instances keyed by address). */
typedef struct kvs_instance_desc {
    uint64_t id;              /* the application's id of the instance */
    int64_t tp_size;          /* TP of one attention group (attn_tp) */
    int64_t pp_size;          /* 0 -> 1 */
    int64_t dp_size;          /* attention groups, 0 -> 1 */
    /* The fabric address of every rank: dp_size * cp_size * pp_size *
     * tp_size strings, rank (group g, CP rank c, stage s, tp t) at
     * ((g * cp_size + c) * pp_size + s) * tp_size + t: one group of
     * addresses per CP rank (with cp_size 1, (g * pp_size + s) * tp_size
     * + t). Copied; required. */
    const char *const *addrs;
    /* Its prefill context-parallel ranks, 0 -> 1; in the fingerprint (a
     * prefill of another CP size is refused, KVS_EFINGERPRINT). Moves on
     * every path: each CP rank writes its own range's tokens, and a room
     * is done once every CP rank reported (those whose range is empty
     * too). Each CP rank's prefill room
     * lists the request's pages by token (ceil(total / page_size) ids) and
     * reads only those of its range (kvs_layout_cp_range). */
    int64_t cp_size;
} kvs_instance_desc_t;

/* Decode: declares a prefill instance: its geometry (each pair's layout,
 * writers and region sizes are computed here, once) and its ranks'
 * addresses. Connections are made on first use (a room naming the
 * instance) or ahead of time (kvs_decode_connect_peer), and kept.
 * An id declared before may be declared again with the same shape while
 * none of its ranks is connected (it is gone: kvs_decode_instance_lost, or
 * its connections died): its new addresses replace the old ones and its
 * next room connects to them (an instance back at another address, or an
 * address given wrong). KVS_EALREADY for an id declared before while it is
 * connected or with another shape, KVS_EHEAD_SPLIT / KVS_EPP_SPLIT
 * when the instance cannot pair with this rank, KVS_EFULL past
 * max_instances. */
KVS_API int kvs_decode_add_instance(kvs_decode_t *d, const kvs_instance_desc_t *desc);
/* Decode: connects (now) to every prefill rank of the peer group that
 * writes to this rank and registers with each. A rank it cannot reach is
 * retried by kvs_decode_progress; the first failure is returned. */
KVS_API int kvs_decode_connect_peer(kvs_decode_t *d, kvs_peer_t peer);
/* Decode: connects to the prefill rank (tp, pp) of the default peer
 * instance, reachable as `peer` on the fabric, and registers with it (ring,
 * geometry, fingerprint). The rank must be one of this decode rank's
 * writers (KVS_EINVAL otherwise). */
KVS_API int kvs_decode_connect(kvs_decode_t *d, const char *peer, int64_t prefill_tp_rank,
                               int64_t prefill_pp_rank);
/* Decode: a request paired with the prefill instance `peer`, whose KV for
 * tokens [base_tokens, total_tokens) goes to `pages` (ceil((total - base) /
 * page_size) decode page ids, copied). Connects to the peer's ranks first if
 * they are not yet connected.
 * Returns KVS_OK, and the room's result comes through poll_rooms. A room
 * that fails at once for a reason of its own or of its peer returns that
 * status and ALSO reports it through poll_rooms: a cached prefix that is
 * not page aligned (KVS_EPREFIX_ALIGN), a writer that is unreachable
 * (KVS_EPEER; the others are told). Any other error is of the call (bad
 * arguments, wrong state, a writer that refused the registration) and no
 * result comes. */
KVS_API int kvs_decode_room_open_peer(kvs_decode_t *d, uint64_t room, kvs_peer_t peer,
                                      int64_t base_tokens, int64_t total_tokens,
                                      const int64_t *pages, int64_t num_pages);
/* kvs_decode_room_open_peer with the default peer instance {0, 0}. */
KVS_API int kvs_decode_room_open(kvs_decode_t *d, uint64_t room, int64_t base_tokens,
                                 int64_t total_tokens, const int64_t *pages,
                                 int64_t num_pages);
/* Hybrid models with state layers: the request's state slot in the state
 * buffers (kvs_kv_buffers_t.state_base, [0, state_slots)), where the
 * decode scatters the state of the request's last chunk (the prefill:
 * whence it gathers it). Give it before the room's last chunk moves (at
 * open, say); a last chunk with no slot fails the room (KVS_EINVAL).
 * KVS_ENOENT for a room not open, KVS_ERANGE for a slot outside the state
 * buffers, KVS_EINVAL on a manager without state layers. */
KVS_API int kvs_decode_room_set_state_slot(kvs_decode_t *d, uint64_t room, int64_t slot);
/* The state of an open room; KVS_ENOENT when this handler holds no such
 * room (never opened, or ended: its result came through poll_rooms). */
KVS_API int kvs_decode_room_state(const kvs_decode_t *d, uint64_t room, kvs_room_state_t *out);
/* Aborts an open room (the engine cancelled the request): it fails with
 * KVS_ECANCELED, its peers are told at once, and its result comes through
 * poll_rooms once no write can land. KVS_ENOENT for a room not open. */
KVS_API int kvs_decode_room_abort(kvs_decode_t *d, uint64_t room);
/* Returns how much work it found (>= 0; 0 = nothing to do) or a negative
 * status when the fabric itself failed. */
KVS_API int kvs_decode_progress(kvs_decode_t *d);
/* Finished requests since the last call (at most max), oldest first. */
KVS_API int kvs_decode_poll_rooms(kvs_decode_t *d, kvs_room_result_t *out, int max);
/* Earliest time progress has work without a new completion; UINT64_MAX if none. */
KVS_API uint64_t kvs_decode_next_deadline_ns(const kvs_decode_t *d);
KVS_API void kvs_decode_stats(const kvs_decode_t *d, kvs_handler_stats_t *out);
/* Peer ranks registered and acknowledged, over every peer instance. */
KVS_API int64_t kvs_decode_peers_ready(const kvs_decode_t *d);

/* Prefill: creates the handler (guards like the decode's: role, staging
 * buffers initialised and registered when staging is on, KV buffers
 * published, heads, layout). */
KVS_API int kvs_prefill_create(kvs_manager_t *m, kvs_prefill_t **out);
KVS_API void kvs_prefill_destroy(kvs_prefill_t *p);
/* A request paired with the decode instance `peer`, whose KV for tokens
 * [0, total_tokens) lives in `pages` (ceil(total / page_size) prefill page
 * ids, copied). Prefetches staging regions for every chunk as soon as the
 * decode side is known. The decode instance need not have registered yet:
 * the room waits for it (up to the stall timeout). Returns as
 * kvs_decode_room_open_peer: a decode rank it writes to that is unreachable
 * fails the room at once (KVS_EPEER, also reported through poll_rooms). */
KVS_API int kvs_prefill_room_open_peer(kvs_prefill_t *p, uint64_t room, kvs_peer_t peer,
                                       int64_t total_tokens, const int64_t *pages,
                                       int64_t num_pages);
/* kvs_prefill_room_open_peer with the default peer instance {0, 0}. */
KVS_API int kvs_prefill_room_open(kvs_prefill_t *p, uint64_t room, int64_t total_tokens,
                                  const int64_t *pages, int64_t num_pages);
/* KV of tokens [0, end_tokens) is computed; final when the prompt is done. */
KVS_API int kvs_prefill_room_computed(kvs_prefill_t *p, uint64_t room, int64_t end_tokens,
                                      bool final);
/* The room's aux payload: `bytes` (at most the config's max_aux_bytes)
 * copied from aux, replacing any given before, and handed to every decode
 * rank of the room with its result (kvs_room_result_t.aux) once the KV
 * landed. Give it on every prefill rank of the room, before the final
 * computed() call: each decode rank hears it from one of them. KVS_ENOENT
 * for a room not open, KVS_EALREADY after the final computed(). */
KVS_API int kvs_prefill_room_set_aux(kvs_prefill_t *p, uint64_t room, const void *aux,
                                     uint32_t bytes);
/* As kvs_decode_room_set_state_slot: the slot the request's state is
 * gathered from. */
KVS_API int kvs_prefill_room_set_state_slot(kvs_prefill_t *p, uint64_t room, int64_t slot);
/* As kvs_decode_room_state and kvs_decode_room_abort. */
KVS_API int kvs_prefill_room_state(const kvs_prefill_t *p, uint64_t room, kvs_room_state_t *out);
KVS_API int kvs_prefill_room_abort(kvs_prefill_t *p, uint64_t room);
/* As kvs_decode_progress. */
KVS_API int kvs_prefill_progress(kvs_prefill_t *p);
KVS_API int kvs_prefill_poll_rooms(kvs_prefill_t *p, kvs_room_result_t *out, int max);
KVS_API uint64_t kvs_prefill_next_deadline_ns(const kvs_prefill_t *p);
KVS_API void kvs_prefill_stats(const kvs_prefill_t *p, kvs_handler_stats_t *out);

/* ------------------------------------------------------------------------ */
/* The rank runtime: one rank of a serving engine, set up and driven        */
/* ------------------------------------------------------------------------ */
/*
 * A rank is the manager, its staging memory, its KV buffers and its handler
 * (decode or prefill), made in the init order of spec §8 by one call, and
 * driven by one step. The runtime never blocks, sleeps, reads a clock or
 * starts a thread: the caller (or a driver for real hardware, which adds a
 * progress thread and a blocking wait) calls kvs_rank_step whenever the
 * backends signal work or the clock passes the deadline it returned. The
 * step-by-step init calls above remain for callers that need them.
 */
typedef struct kvs_rank kvs_rank_t;

typedef struct kvs_rank_config {
    kvs_manager_config_t manager; /* role, geometry, instance and knobs */
    const kvs_kv_layer_t *layers; /* [manager.layers]: this rank's KV pool;
                                     borrowed for the call; a state layer's
                                     zeroed (kvs_manager_set_kv_layers) */
    int64_t local_heads;          /* KV heads each layer holds; 0: the
                                     config's heads_per_rank, or total_heads
                                     over tp_size */
    /* With state layers (docs/kinds/hybrid.md): kvs_kv_buffers_t's
     * state_base ([manager.layers], borrowed for the call) and state_slots;
     * NULL and 0 without. */
    const uint64_t *state_base;
    int64_t state_slots;
    /* With a draft (manager.draft_layers > 0): kvs_kv_buffers_t's
     * draft_k_base and draft_v_base ([manager.draft_layers], borrowed for
     * the call; V NULL for MLA); NULL without. */
    const uint64_t *draft_k_base;
    const uint64_t *draft_v_base;
} kvs_rank_config_t;

/* Creates the manager, its staging memory and their registration (staging
 * on), publishes the KV layers and creates the handler of cfg->manager.role.
 * dev and fab are borrowed and must outlive the rank. On error nothing is
 * left and err (may be NULL) says which step failed and why. */
KVS_API int kvs_rank_create(const kvs_rank_config_t *cfg, kvs_device_t *dev, kvs_fabric_t *fab,
                            kvs_rank_t **out, kvs_error_t *err);
/* A rank on a manager the caller set up step by step (spec §8): creates the
 * handler of the manager's role (the guards of kvs_decode_create /
 * kvs_prefill_create apply, and m's last error says why one failed). The
 * manager stays the caller's: it must outlive the rank, and destroying the
 * rank leaves it (and its staging ring) to make another. */
KVS_API int kvs_rank_create_on(kvs_manager_t *m, kvs_rank_t **out);
/* Destroys the handler, then the manager if kvs_rank_create made it. NULL
 * is a no-op. */
KVS_API void kvs_rank_destroy(kvs_rank_t *r);
KVS_API kvs_role_t kvs_rank_role(const kvs_rank_t *r);
/* The rank's manager and handler (the other handler is NULL). Borrowed. */
KVS_API kvs_manager_t *kvs_rank_manager(kvs_rank_t *r);
KVS_API kvs_decode_t *kvs_rank_decode(kvs_rank_t *r);
KVS_API kvs_prefill_t *kvs_rank_prefill(kvs_rank_t *r);
/* Detail of the rank's last failed call (its manager's). */
KVS_API const kvs_error_t *kvs_rank_last_error(const kvs_rank_t *r);

/* Decode: kvs_decode_add_instance and kvs_decode_connect_peer. A prefill
 * rank returns KVS_ESTATE: it learns its peers from their registrations. */
KVS_API int kvs_rank_add_instance(kvs_rank_t *r, const kvs_instance_desc_t *desc);
KVS_API int kvs_rank_connect(kvs_rank_t *r, kvs_peer_t peer);

/* One request, as both roles open it. */
typedef struct kvs_room_desc {
    uint64_t room;               /* the request's id, the same on every rank */
    kvs_peer_t peer;             /* the instance of the other role it is paired with */
    int64_t base_tokens;         /* decode: its cached prefix (page aligned);
                                    prefill: must be 0 */
    int64_t total_tokens;        /* the request's length */
    const int64_t *pages;        /* decode: ceil((total - base) / page_size)
                                    pages; prefill: ceil(total / page_size);
                                    copied */
    int64_t num_pages;
    const void *aux;             /* prefill: the request's aux payload (see
                                    kvs_prefill_room_set_aux), copied; decode:
                                    must be NULL (it arrives with the result) */
    uint32_t aux_bytes;
    int64_t state_slot;          /* with state layers: the request's slot in
                                    the state buffers (kvs_decode_room_set_
                                    state_slot); not read without */
} kvs_room_desc_t;

/* kvs_decode_room_open_peer / kvs_prefill_room_open_peer, with their
 * return convention. */
KVS_API int kvs_rank_open_room(kvs_rank_t *r, const kvs_room_desc_t *room);
/* Prefill: kvs_prefill_room_set_aux. A decode rank returns KVS_ESTATE. */
KVS_API int kvs_rank_set_aux(kvs_rank_t *r, uint64_t room, const void *aux, uint32_t bytes);
/* Prefill: kvs_prefill_room_computed. A decode rank returns KVS_ESTATE. */
KVS_API int kvs_rank_computed(kvs_rank_t *r, uint64_t room, int64_t end_tokens, bool final);
KVS_API int kvs_rank_room_state(const kvs_rank_t *r, uint64_t room, kvs_room_state_t *out);
KVS_API int kvs_rank_abort(kvs_rank_t *r, uint64_t room);
/* The application learned (from its discovery: a lease that lapsed) that
 * the peer instance (attention group) is gone, before any connection of it
 * died: every open room paired with it fails now with KVS_EPEER on this
 * rank and its peers are told, its connections are dropped, and, on a
 * decode, the next room naming it connects again (a restarted instance at
 * the same addresses is used without more calls) and waits for its
 * registration; nothing reconnects to it before (a connect to a process
 * that is stopped, not dead, would hold the rank until the fabric's
 * connect_timeout_ms). KVS_ENOENT for an
 * instance this rank does not know. kvs_decode_instance_lost and
 * kvs_prefill_instance_lost are the same on a handler. */
KVS_API int kvs_rank_instance_lost(kvs_rank_t *r, kvs_peer_t peer);
KVS_API int kvs_decode_instance_lost(kvs_decode_t *d, kvs_peer_t peer);
KVS_API int kvs_prefill_instance_lost(kvs_prefill_t *p, kvs_peer_t peer);

/* One step of the rank's loop: progress (poll the backends, advance every
 * room), then each finished room's result to on_result (results stay for
 * kvs_rank_poll when on_result is NULL), then *next_ns (may be NULL) gets
 * the earliest time another step has work without a new completion
 * (UINT64_MAX: none). Returns the work progress found (>= 0) or a negative
 * status when a backend itself failed (kvs_rank_last_error says which). */
KVS_API int kvs_rank_step(kvs_rank_t *r,
                          void (*on_result)(void *ctx, const kvs_room_result_t *res),
                          void *ctx, uint64_t *next_ns);
/* Finished rooms since the last call (at most max), oldest first. */
KVS_API int kvs_rank_poll(kvs_rank_t *r, kvs_room_result_t *out, int max);
KVS_API uint64_t kvs_rank_next_deadline_ns(const kvs_rank_t *r);
KVS_API void kvs_rank_stats(const kvs_rank_t *r, kvs_handler_stats_t *out);
/* Decode: peer ranks registered and acknowledged; prefill: 0. */
KVS_API int64_t kvs_rank_peers_ready(const kvs_rank_t *r);

/* Metrics of n ranks (a process's ranks, one scrape) as Prometheus text,
 * exposition format 0.0.4, each family once (docs/operations.md lists
 * them): per peer instance the time from a room's open to its end and the
 * bytes it moved (histograms, rooms that succeeded) and the rooms ended by
 * terminal status (KVS_OK or why they failed); per rank the open rooms by
 * state, the handler's counters (kvs_handler_stats_t: writes,
 * retransmissions, peers lost...), the ring's size, live and peak bytes.
 * Every sample is labelled role, instance, dp_rank, tp_rank, pp_rank. Each
 * rank's numbers are a snapshot taken under its lock (safe while a driver
 * steps it); rooms of more peer instances than max_instances count as
 * peer_instance="other". Writes at most cap bytes, NUL-terminated when cap
 * > 0; *len_out gets the text's length. KVS_ERANGE when it did not fit
 * (call again with *len_out + 1 bytes), KVS_EINVAL for a NULL rank, buf
 * (with cap > 0) or len_out, KVS_ENOMEM. */
KVS_API int kvs_rank_metrics(kvs_rank_t *const *ranks, size_t n, char *buf, size_t cap,
                             size_t *len_out);

/* A lock the rank takes around every call above but create and destroy,
 * for a driver that steps the rank on its own thread while the caller's
 * threads open rooms and poll (hw/ sets one; src/ starts no thread).
 * on_result runs outside it. NULL functions: no lock. */
KVS_API void kvs_rank_set_lock(kvs_rank_t *r, void (*lock)(void *ctx),
                               void (*unlock)(void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* KVSTAGE_KVSTAGE_H */
