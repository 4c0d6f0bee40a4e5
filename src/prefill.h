/*
 * prefill.h (internal) - the prefill handler's state, shared by its three
 * files: prefill.c (rooms, registration, messages, reports), and the two
 * ways a room's KV leaves this rank: prefill_staging.c (gather, one write
 * per region, CHUNK_READY) and prefill_direct.c (the direct and slice
 * paths: writes straight into the decode's pages).
 *
 * A room paired with a decode instance has one flow per decode rank this
 * rank writes to in that instance (its targets, instance.h): a flow follows
 * that decode's side of the room (its ROOM, pages, regions) and reports to
 * it. A room opened before its decode instance registered has no flows yet;
 * they are made when the first of its ranks registers.
 */
#ifndef KVS_SRC_PREFILL_H
#define KVS_SRC_PREFILL_H

#include "fifo.h"
#include "handler.h"
#include "hybrid_copy.h"

enum { KVS__PCH_NONE, KVS__PCH_REQ, KVS__PCH_ALLOC, KVS__PCH_GATHER, KVS__PCH_WRITE,
       KVS__PCH_DONE };

typedef struct kvs__pchunk {
    uint8_t state;
    bool waited;                 /* counted once as a watermark wait */
    bool unposted;               /* gathered, a write of it refused for now (the
                                    fabric's queue was full): posted again */
    uint64_t wait_ns;            /* when it started waiting */
    int64_t tokens, token_start, token_end, page_start, num_pages;
    int64_t region_bytes;
    kvs_cp_part_t part;          /* this rank's CP part of it: the rows it
                                    gathers and where they go (the chunk at
                                    offset 0 with CP 1) */
    uint64_t offset, round, end;
    uint64_t rkey[2];            /* with scoped keys: the keys of its writes
                                    (STAGING_RSP's rkey, rkey_v) */
    int32_t worker;              /* staging buffer in use, -1 if none */
    int64_t writes_posted;       /* of the chunk's writes (pieces of its spans,
                                    target.pieces at most): they go in order */
    int64_t writes_pending;      /* posted, not yet completed */
    kvs_event_t *event;
} kvs__pchunk_t;

typedef struct kvs__pflow {
    bool known;                  /* the decode's ROOM arrived */
    bool reqs_sent, reported;
    int64_t base, total;
    int64_t *dpages, num_dpages, dpages_got;
    int64_t num_chunks, chunks_done;
    kvs__pchunk_t *chunks;
    /* direct/slice: the tokens this rank writes, [tok_start, tok_end):
     * its CP rank's range past the cached prefix (all of [base, total)
     * with CP 1; empty for a range inside the prefix or past the prompt) */
    int64_t tok_start, tok_end;
    /* direct/slice cursor: token, layer, K/V */
    int64_t cur_t, cur_l, run_tokens;
    int cur_kv;
    bool posted_all;
    int64_t writes_pending;
} kvs__pflow_t;

typedef struct kvs__proom {
    kvs__room_t base;            /* first */
    bool opened, final;
    int64_t total, computed;
    int64_t *pages, num_pages;
    int64_t nflows;              /* the instance's targets, 0 until it is known */
    kvs__pflow_t *flows;
} kvs__proom_t;

typedef struct kvs__pop {        /* an in-flight write */
    uint64_t room;
    int32_t flow;
    int64_t chunk;               /* -1 for direct/slice writes */
    uint32_t gen;
    bool used;
} kvs__pop_t;

/* A room this rank ended failed, remembered (a bounded FIFO of the latest)
 * so that a decode whose ROOM comes late (its REGISTER or ROOM was lost
 * and sent again) still learns the outcome instead of waiting out its
 * stall timeout. */
typedef struct kvs__pgone {
    uint64_t room;
    int status;
} kvs__pgone_t;

struct kvs_prefill {
    kvs__handler_t h;            /* first */
    uint32_t workers;            /* staging buffers */
    bool *worker_busy;
    kvs__pop_t *ops;             /* in-flight writes */
    uint32_t ops_cap, ops_used;
    uint32_t ops_lo;             /* every slot below it is used */
    kvs__pgone_t *gone;          /* [max_rooms]: latest rooms ended failed */
    uint32_t gone_next, gone_count;
    kvs__fifo_t gathers;         /* in stream order */
    /* One fused gather: the flows whose chunk it stages, their staging
     * buffers and copy parts, up to fuse_cap at once. */
    int64_t *fuse_flows;
    int32_t *fuse_workers;
    kvs_copy_part_t *fuse_parts;
    kvs__hyb_block_t *fuse_blocks; /* a hybrid layout's: each flow's writer block */
    int64_t fuse_cap;
    bool gather_blocked;         /* this progress pass: a gather waits for
                                    buffers or write slots, so later chunks
                                    (of later rooms) do not take them first */
};

static inline kvs__proom_t *kvs__proom(kvs__room_t *r) { return (kvs__proom_t *)r; }
static inline kvs__peer_t *kvs__flow_peer(const kvs__proom_t *r, int64_t f)
{
    return &r->base.inst->peers[f];
}

/* prefill.c */
/* Releases chunk c's staging buffer (if it holds one): the chunk is done. */
void kvs__pchunk_release(kvs_prefill_t *p, kvs__pchunk_t *c);
/* Posts one write of room r, flow f (chunk, or -1 for direct/slice writes).
 * KVS_EAGAIN when every write slot is taken or the fabric refuses it for
 * now. */
int kvs__post_write(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk,
                    uint64_t local, kvs_mr_t *mr, uint64_t remote, uint64_t rkey, uint64_t len);

/* prefill_staging.c */
void kvs__staging_send_requests(kvs_prefill_t *p, kvs__proom_t *r, int64_t f);
void kvs__staging_advance(kvs_prefill_t *p, kvs__proom_t *r, int64_t f);
void kvs__staging_on_rsp(kvs_prefill_t *p, kvs__peer_t *peer, const kvs_msg_staging_rsp_t *q);
/* A write of a staged chunk completed (its op already freed). */
void kvs__staging_write_done(kvs_prefill_t *p, kvs__proom_t *r, int64_t f, int64_t chunk);
/* Completed gathers in stream order: their chunks go on the wire. */
void kvs__staging_reap(kvs_prefill_t *p);
bool kvs__staging_flow_done(const kvs__pflow_t *fl);

/* prefill_direct.c */
void kvs__direct_advance(kvs_prefill_t *p, kvs__proom_t *r, int64_t f);
void kvs__direct_on_pages(kvs_prefill_t *p, kvs__peer_t *peer, const kvs_msg_pages_t *q);
void kvs__direct_on_layers(kvs_prefill_t *p, kvs__peer_t *peer, const kvs_msg_layers_t *q);
bool kvs__direct_flow_done(const kvs__pflow_t *fl);

#endif
