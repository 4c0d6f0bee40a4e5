/*
 * prov.h - provenance maps: what simulated memory holds when it holds no
 * bytes. A map covers one address space (a simulated GPU's) and says, for
 * each byte that was ever written, where the byte came from: an origin key
 * (for KV data: request, layer, K or V; sim/kvdata.h) and an offset in that
 * key's origin space. Bytes never written, or erased, are holes.
 *
 * A map is a sorted set of disjoint runs. A run is a range of addresses
 * whose origins follow one rule: contiguous (origin = off + x), or rows
 * (the range is cut into rows of row_bytes; consecutive rows start stride
 * apart in the origin space, so a strided head slice of many tokens is one
 * run). Adjacent runs whose rules continue each other are merged, so the
 * size of a map, and the cost of copying through it, grows with the copy
 * and write descriptors that made it, not with the bytes they moved.
 *
 * What it does not: hold bytes, or know what an origin means; the caller
 * (the simulated GPU, the fabric, the scenario's fill and verification)
 * gives the rules. No global state, no randomness.
 *
 * Invariants: runs disjoint and sorted by address, none empty, none a hole;
 * a rows run has phase < row_bytes, stride != row_bytes, and spans at
 * least two rows (one that does not is stored contiguous).
 */
#ifndef KVS_SIM_PROV_H
#define KVS_SIM_PROV_H

#include <stddef.h>
#include <stdint.h>

/* The key of "no origin": a hole (never written, erased). */
#define SIM_PROV_HOLE UINT64_MAX

typedef struct sim_prov_run {
    uint64_t addr, len_bytes;
    uint64_t key;       /* origin key, SIM_PROV_HOLE for a hole */
    uint64_t off;       /* origin of the start of addr's row (of addr when
                           contiguous) */
    uint64_t row_bytes; /* 0: contiguous; else bytes per row */
    uint64_t stride;    /* origin distance from one row to the next */
    uint64_t phase;     /* addr's position in its row, < row_bytes */
} sim_prov_run_t;

typedef struct sim_prov_map sim_prov_map_t;

/* Runs one leaf of a map holds (prov.c: the runs are kept in leaves). */
#define SIM_PROV_LEAF_MAX 64

int sim_prov_map_create(sim_prov_map_t **out);
/* Frees the map; NULL is a no-op. */
void sim_prov_map_destroy(sim_prov_map_t *m);

/* The origin offset of byte addr + x of run r (x < r->len_bytes). */
uint64_t sim_prov_origin(const sim_prov_run_t *r, uint64_t x);
/* Puts r in its canonical form (a rows run inside one row, or of stride
 * row_bytes, becomes contiguous). */
void sim_prov_canon(sim_prov_run_t *r);

/* Writes run r over whatever [r->addr, +len) held (a hole key erases). */
int sim_prov_write(sim_prov_map_t *m, const sim_prov_run_t *r);
int sim_prov_erase(sim_prov_map_t *m, uint64_t addr, uint64_t len_bytes);
/* Copies `rows` rows of row_bytes: row i from src address s0 + i * ss to
 * dst address d0 + i * ds, holes included (they erase). Rows of one side
 * must not overlap each other (stride >= row_bytes when rows > 1); src and
 * dst may be the same map, and the result is as if every row was read
 * before any was written. */
int sim_prov_copy_rows(sim_prov_map_t *dst, uint64_t d0, uint64_t ds, sim_prov_map_t *src,
                       uint64_t s0, uint64_t ss, uint64_t row_bytes, uint64_t rows);
int sim_prov_copy(sim_prov_map_t *dst, uint64_t daddr, sim_prov_map_t *src, uint64_t saddr,
                  uint64_t len_bytes);
/* One source of sim_prov_copy_parts: rows of row_bytes from s0, ss apart,
 * landing dst_off bytes into each destination row. */
typedef struct sim_prov_rowsrc {
    uint64_t s0, ss, row_bytes, dst_off;
} sim_prov_rowsrc_t;
/* Row i of every part (sorted by dst_off, disjoint, all inside ds when
 * rows > 1) goes to d0 + i * ds + dst_off, in one rewrite: parts that
 * tile a row (a fused scatter of several writers' heads) leave one run
 * for all the rows. The same result as a sim_prov_copy_rows per part. */
int sim_prov_copy_parts(sim_prov_map_t *dst, uint64_t d0, uint64_t ds, sim_prov_map_t *src,
                        const sim_prov_rowsrc_t *parts, size_t nparts, uint64_t rows);
/* Batches: many writes or copies into one map in one rewrite of their
 * hull, with the result of making them one after the other. Between
 * begin and end only sim_prov_batch_* may change the map. A piece that
 * lands before the end of those pending, or a copy that reads what they
 * write, first writes them out, so any order is correct; batch what
 * lands in ascending addresses close together (one layer's K or V of a
 * page list), since the rewrite also sweeps the runs between the pieces. */
void sim_prov_batch_begin(sim_prov_map_t *m);
int sim_prov_batch_write(sim_prov_map_t *m, const sim_prov_run_t *r);
int sim_prov_batch_copy_parts(sim_prov_map_t *dst, uint64_t d0, uint64_t ds,
                              sim_prov_map_t *src, const sim_prov_rowsrc_t *parts,
                              size_t nparts, uint64_t rows);
/* Writes what is pending; the map is then free for every call again. */
int sim_prov_batch_end(sim_prov_map_t *m);
/* The bytes of [want->addr, +len) whose origin differs from want's (wrong
 * key, wrong offset, or a hole). */
uint64_t sim_prov_diff(sim_prov_map_t *m, const sim_prov_run_t *want);
/* The run holding addr (0 when addr is in a hole, else 1 and *out). */
int sim_prov_lookup(const sim_prov_map_t *m, uint64_t addr, sim_prov_run_t *out);
/* Runs in the map, and the most it ever held. */
uint64_t sim_prov_runs(const sim_prov_map_t *m);
/* 1 when the map's invariants hold (for tests). */
int sim_prov_valid(const sim_prov_map_t *m);
uint64_t sim_prov_runs_peak(const sim_prov_map_t *m);

#endif
