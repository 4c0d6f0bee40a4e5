/*
 * alloc_count.h - the heap counters of bench_alloc. CMake forces this
 * header (-include) into every source of bench_alloc's second copy of the
 * core (each .c file of src/), and nowhere else: once <stdlib.h> has
 * declared the real functions, malloc, calloc, realloc and free become
 * calls to the counters of bench_alloc.c, which note the call site (file,
 * line) and forward to the real ones. The library and the simulator keep
 * the plain calls.
 *
 * Function-like macros, defined after the system headers were included
 * (behind their guards): only a call `malloc(...)` is renamed, never a
 * declaration, whatever the compiler and whether ASan is on (ASan
 * intercepts the real calls the counters make). A call through a member
 * of one of these names (ops.free(...)) would be renamed too and fail to
 * compile here; the core has none. bench_alloc.c defines
 * KVS_BENCH_ALLOC_IMPL before including this, to get the prototypes only.
 */
#ifndef KVS_BENCH_ALLOC_COUNT_H
#define KVS_BENCH_ALLOC_COUNT_H

#include <stddef.h>
#include <stdlib.h>

void *kvs_bench_malloc(size_t bytes, const char *file, int line);
void *kvs_bench_calloc(size_t n, size_t size, const char *file, int line);
void *kvs_bench_realloc(void *p, size_t bytes, const char *file, int line);
void kvs_bench_free(void *p, const char *file, int line);

#ifndef KVS_BENCH_ALLOC_IMPL
#define malloc(bytes) kvs_bench_malloc((bytes), __FILE__, __LINE__)
#define calloc(n, size) kvs_bench_calloc((n), (size), __FILE__, __LINE__)
#define realloc(p, bytes) kvs_bench_realloc((p), (bytes), __FILE__, __LINE__)
#define free(p) kvs_bench_free((p), __FILE__, __LINE__)
#endif

#endif /* KVS_BENCH_ALLOC_COUNT_H */
