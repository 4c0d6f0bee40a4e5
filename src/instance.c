/*
 * instance.c - the peer instances of a handler and their pair plans (see
 * instance.h). The table is bounded (max_instances); an instance's plan and
 * peers are allocated once, when its geometry becomes known, and kept until
 * the handler goes.
 */
#include "instance.h"

#include "channel.h"
#include "chunk.h"
#include "error.h"
#include "hybrid.h"

#include <stdlib.h>
#include <string.h>

int kvs__insts_init(kvs__insts_t *t, uint32_t cap)
{
    t->v = calloc(cap > 0 ? cap : 1, sizeof *t->v);
    t->count = 0;
    t->cap = cap > 0 ? cap : 1;
    return t->v != NULL ? KVS_OK : KVS_ENOMEM;
}

static void kvs__inst_free_plan(kvs__inst_t *inst)
{
    for (int64_t i = 0; inst->peers != NULL && i < inst->npeers; i++) {
        free(inst->peers[i].name);
        free(inst->peers[i].tgt.layers);
    }
    free(inst->peers);
    inst->peers = NULL;
    inst->npeers = 0;
}

static void kvs__inst_free(kvs__inst_t *inst)
{
    kvs__inst_free_plan(inst);
    for (int64_t a = 0; inst->addrs != NULL && a < inst->naddrs; a++)
        free(inst->addrs[a]);
    free(inst->addrs);
    free(inst);
}

void kvs__insts_fini(kvs__insts_t *t)
{
    for (uint32_t i = 0; t->v != NULL && i < t->count; i++)
        kvs__inst_free(t->v[i]);
    free(t->v);
    *t = (kvs__insts_t){0};
}

void kvs__insts_pop(kvs__insts_t *t)
{
    if (t->count > 0)
        kvs__inst_free(t->v[--t->count]);
}

kvs__inst_t *kvs__insts_find(const kvs__insts_t *t, kvs_peer_t ref)
{
    for (uint32_t i = 0; i < t->count; i++)
        if (t->v[i]->ref.instance == ref.instance && t->v[i]->ref.dp_rank == ref.dp_rank)
            return t->v[i];
    return NULL;
}

kvs__inst_t *kvs__insts_add(kvs__insts_t *t, kvs_manager_t *m, kvs_peer_t ref)
{
    if (t->count == t->cap) {
        KVS__MFAIL(m, KVS_EFULL, "%u peer instances (attention groups) are known already: "
                   "raise max_instances", t->cap);
        return NULL;
    }
    kvs__inst_t *inst = calloc(1, sizeof *inst);
    if (inst == NULL) {
        KVS__MFAIL(m, KVS_ENOMEM, "allocating peer instance %llu failed",
                   (unsigned long long)ref.instance);
        return NULL;
    }
    inst->ref = ref;
    t->v[t->count++] = inst;
    return inst;
}

/* Decode side: the prefill ranks that take part in this rank's rooms:
 * source j of stage s of CP rank c is peer (c * tp_sources + j) * stages
 * + s (each CP rank has the prefill's TP and PP and writes its own token
 * range); sources past the writers (MLA) are silent. */
static void kvs__plan_writers(kvs__inst_t *inst, const kvs_manager_t *m)
{
    const kvs_layout_t *l = &inst->lay;
    inst->stages = l->decode_pp == 1 ? l->prefill_pp : 1;
    inst->first_stage = l->decode_pp == 1 ? 0 : m->cfg.pp_rank;
    for (int64_t c = 0; c < l->prefill_cp; c++)
        for (int64_t w = 0; w < l->tp_sources; w++) {
            int64_t rank = 0;
            (void)kvs_layout_source_rank(l, m->cfg.tp_rank, w, &rank);
            for (int64_t s = 0; s < inst->stages; s++) {
                kvs__peer_t *p = &inst->peers[(c * l->tp_sources + w) * inst->stages + s];
                p->cp_rank = c;
                p->tp_rank = rank;
                p->pp_rank = inst->first_stage + s;
                p->silent = w >= l->tp_writers;
            }
        }
}

/* Writes of at most `most` bytes that n bytes take (most > 0). */
static uint64_t kvs__pieces(uint64_t n, uint64_t most) { return n / most + (n % most != 0); }

/* Staging: the writes of a full chunk of this prefill rank into the region
 * of target decode rank dtp: each of its spans (its block, or its K and V
 * layers apart) cut into pieces of at most the fabric's max_write_bytes.
 * *block_bytes gets the bytes it writes per full chunk. */
static int kvs__target_pieces(const kvs_layout_t *l, const kvs_manager_t *m, int64_t dstage,
                              int64_t dtp, int64_t *pieces, uint64_t *block_bytes)
{
    int64_t writer = 0;
    kvs__span_t span[2];
    int n = 0;
    int rc = kvs_layout_writer_index(l, m->cfg.tp_rank, dtp, &writer);
    if (rc == KVS_OK)
        rc = kvs__writer_spans(l, dtp, dstage, writer, m->cfg.pp_rank, l->grid_tokens, span, &n);
    if (rc != KVS_OK)
        return rc;
    const uint64_t most = kvs__net_max_write_bytes(m->fab);
    uint64_t total = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        total += kvs__pieces(span[i].len_bytes, most);
        bytes += span[i].len_bytes;
    }
    *pieces = total > INT64_MAX ? INT64_MAX : (int64_t)total;
    *block_bytes = bytes;
    return KVS_OK;
}

/* Prefill side, before a pair's plan is made: every write this rank would
 * post to it fits the fabric's max_write_bytes. Staging cuts a writer's
 * block into pieces, and a full chunk's pieces must fit the write slots
 * (max_inflight_writes: a chunk's gather waits until all of them are free,
 * so more could never go); the direct and slice paths cut page runs at a
 * token, so one token's head row must fit one write. */
static int kvs__check_write_sizes(const kvs_layout_t *l, kvs_path_t path, kvs_manager_t *m,
                                  int64_t dstage)
{
    const uint64_t most = kvs__net_max_write_bytes(m->fab);
    if (most == UINT64_MAX)
        return KVS_OK;
    const uint32_t slots = m->cfg.max_inflight_writes >= 2 ? m->cfg.max_inflight_writes : 2;
    for (int64_t i = 0; i < l->targets_per_prefill; i++) {
        int64_t dtp = 0;
        (void)kvs_layout_target(l, m->cfg.tp_rank, i, &dtp);
        if (path != KVS_PATH_STAGING) {
            kvs_head_slice_t hs;
            (void)kvs_head_slice(l->total_heads, l->prefill_tp, l->decode_tp, m->cfg.tp_rank,
                                 dtp, &hs);
            const uint64_t row = (uint64_t)(hs.num_heads * l->head_dim * l->elem_bytes);
            if (row > most)
                return KVS__MFAIL(m, KVS_ERANGE, "one token's %lld heads are %llu bytes, more "
                                  "than one write of fabric '%s' takes (max_write_bytes "
                                  "%llu): the %s path cannot cut them; use a fabric with "
                                  "larger writes or the staging path",
                                  (long long)hs.num_heads, (unsigned long long)row,
                                  m->fab->name, (unsigned long long)most,
                                  path == KVS_PATH_DIRECT ? "direct" : "slice");
            continue;
        }
        int64_t pieces = 0;
        uint64_t bytes = 0;
        int rc = kvs__target_pieces(l, m, dstage, dtp, &pieces, &bytes);
        if (rc != KVS_OK)
            return KVS__MFAIL(m, rc, "planning the writes to decode rank %lld failed",
                              (long long)dtp);
        if (pieces > (int64_t)slots)
            return KVS__MFAIL(m, KVS_ERANGE, "a full chunk of %lld tokens is %llu bytes "
                              "from this rank to decode rank %lld: %lld writes of at most "
                              "%llu bytes (fabric '%s' max_write_bytes), more than "
                              "max_inflight_writes %u: raise max_inflight_writes to %lld or "
                              "lower chunk_tokens",
                              (long long)l->grid_tokens, (unsigned long long)bytes,
                              (long long)dtp, (long long)pieces, (unsigned long long)most,
                              m->fab->name, slots, (long long)pieces);
    }
    return KVS_OK;
}

/* Prefill side: the decode ranks this rank writes to, and where its stage's
 * layers go in their regions. */
static void kvs__plan_targets(kvs__inst_t *inst, const kvs_manager_t *m)
{
    const kvs_layout_t *l = &inst->lay;
    int64_t first = 0, count = 0, dfirst = 0, dcount = 0;
    (void)kvs_layout_stage_layers(l, KVS_ROLE_PREFILL, m->cfg.pp_rank, &first, &count);
    (void)kvs_layout_stage_layers(l, KVS_ROLE_DECODE, inst->decode_stage, &dfirst, &dcount);
    for (int64_t i = 0; i < inst->npeers; i++) {
        kvs__peer_t *p = &inst->peers[i];
        (void)kvs_layout_target(l, m->cfg.tp_rank, i, &p->tp_rank);
        p->pp_rank = inst->decode_stage;
        p->tgt.writer = -1;
        if (kvs_layout_writer_index(l, m->cfg.tp_rank, p->tp_rank, &p->tgt.writer) != KVS_OK)
            p->silent = true; /* an MLA source that only reports */
        (void)kvs_head_slice(l->total_heads, l->prefill_tp, l->decode_tp, m->cfg.tp_rank,
                             p->tp_rank, &p->tgt.heads);
        p->tgt.slot = first - dfirst;
        p->tgt.layer_slots = dcount;
        /* One write of its block, or K and V apart with prefill PP; one
         * plane per layer is one contiguous range of layer slots either way,
         * and a hybrid block's part is one span (kvs_layout_hybrid_part). */
        p->tgt.writes =
            (first == dfirst && count == dcount) || l->planes == 1 || kvs__hybrid(l) ? 1 : 2;
        uint64_t bytes = 0;
        p->tgt.pieces = p->tgt.writes;
        if (inst->path == KVS_PATH_STAGING)
            (void)kvs__target_pieces(l, m, inst->decode_stage, p->tp_rank, &p->tgt.pieces,
                                     &bytes);
    }
}

int kvs__inst_set_geometry(kvs__inst_t *inst, kvs_manager_t *m, int64_t tp_size,
                           int64_t pp_size, int64_t cp_size, bool declared)
{
    kvs_layout_t lay;
    kvs_path_t path;
    int rc = kvs__manager_pair(m, tp_size, pp_size, cp_size, &lay, &path);
    if (rc != KVS_OK)
        return rc;
    const bool decode = m->cfg.role == KVS_ROLE_DECODE;
    if (!decode && (rc = kvs__check_write_sizes(&lay, path, m,
                                                lay.decode_pp == 1 ? 0 : m->cfg.pp_rank)) !=
                       KVS_OK)
        return rc;
    /* prefill_cp x tp_sources x Pp stays within the region bound of
     * kvs_layout_init times the CP size, both validated: no overflow. */
    const int64_t n = decode ? lay.prefill_cp * lay.tp_sources *
                                   (lay.decode_pp == 1 ? lay.prefill_pp : 1)
                             : lay.targets_per_prefill;
    kvs__peer_t *peers = calloc((size_t)n, sizeof *peers);
    if (peers == NULL)
        return KVS__MFAIL(m, KVS_ENOMEM, "allocating the %lld peer ranks of instance %llu "
                          "failed", (long long)n, (unsigned long long)inst->ref.instance);
    kvs__inst_free_plan(inst);
    inst->tp_size = tp_size;
    inst->pp_size = pp_size;
    inst->cp_size = lay.prefill_cp;
    inst->lay = lay;
    inst->path = path;
    inst->declared = declared;
    inst->decode_stage = lay.decode_pp == 1 ? 0 : m->cfg.pp_rank;
    kvs__fingerprint(&lay, path, &m->cfg, &inst->fp);
    inst->peers = peers;
    inst->npeers = n;
    inst->words = (n + 63) / 64;
    for (int64_t i = 0; i < n; i++) {
        peers[i].inst = inst;
        peers[i].index = i;
    }
    if (decode)
        kvs__plan_writers(inst, m);
    else
        kvs__plan_targets(inst, m);
    inst->known = true;
    return KVS_OK;
}

static char *kvs__strdup(const char *s)
{
    char *c = malloc(strlen(s) + 1);
    if (c != NULL)
        strcpy(c, s);
    return c;
}

int kvs__inst_set_addrs(kvs__inst_t *inst, kvs_manager_t *m, const char *const *addrs)
{
    const int64_t n = inst->cp_size * inst->pp_size * inst->tp_size;
    char **copy = calloc((size_t)n, sizeof *copy);
    char **names = calloc((size_t)inst->npeers + 1, sizeof *names);
    bool ok = copy != NULL && names != NULL;
    for (int64_t a = 0; ok && a < n; a++)
        ok = (copy[a] = kvs__strdup(addrs[a])) != NULL;
    for (int64_t i = 0; ok && i < inst->npeers; i++)
        ok = (names[i] = kvs__strdup(addrs[(inst->peers[i].cp_rank * inst->pp_size +
                                            inst->peers[i].pp_rank) * inst->tp_size +
                                           inst->peers[i].tp_rank])) != NULL;
    if (!ok) { /* nothing changed */
        for (int64_t a = 0; copy != NULL && a < n; a++)
            free(copy[a]);
        for (int64_t i = 0; names != NULL && i < inst->npeers; i++)
            free(names[i]);
        free(copy);
        free(names);
        return KVS__MFAIL(m, KVS_ENOMEM, "copying the addresses of instance %llu failed",
                          (unsigned long long)inst->ref.instance);
    }
    for (int64_t a = 0; inst->addrs != NULL && a < inst->naddrs; a++)
        free(inst->addrs[a]);
    free(inst->addrs);
    inst->addrs = copy;
    inst->naddrs = n;
    for (int64_t i = 0; i < inst->npeers; i++) {
        kvs__peer_t *p = &inst->peers[i];
        free(p->name);
        p->name = names[i];
        p->lost = p->parked = p->ready = false;
        p->refused = KVS_OK;
        p->reconnect_ns = p->reconnect_wait_ns = 0;
    }
    free(names);
    return KVS_OK;
}

int64_t kvs__inst_writer_peer(const kvs__inst_t *inst, int64_t decode_tp, int64_t prefill_cp,
                              int64_t prefill_tp, int64_t prefill_stage)
{
    int64_t writer;
    if (kvs_layout_source_index(&inst->lay, prefill_tp, decode_tp, &writer) != KVS_OK ||
        prefill_cp < 0 || prefill_cp >= inst->lay.prefill_cp ||
        prefill_stage < inst->first_stage || prefill_stage >= inst->first_stage + inst->stages)
        return -1;
    return (prefill_cp * inst->lay.tp_sources + writer) * inst->stages +
           (prefill_stage - inst->first_stage);
}

int64_t kvs__inst_target_peer(const kvs__inst_t *inst, int64_t decode_tp, int64_t decode_pp)
{
    for (int64_t i = 0; i < inst->npeers; i++)
        if (inst->peers[i].tp_rank == decode_tp && inst->peers[i].pp_rank == decode_pp)
            return i;
    return -1;
}
