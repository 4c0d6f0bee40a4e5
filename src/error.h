/*
 * error.h - internal helpers to record the detail of an error in an object's
 * kvs_error_t (never in a global). Every failing path of the core goes through
 * KVS__FAIL so the status, source position and a message naming what to
 * change are kept together.
 */
#ifndef KVS_SRC_ERROR_H
#define KVS_SRC_ERROR_H

#include <kvstage/kvstage.h>

/* Fills *err (when not NULL) and returns status. fmt may be NULL: the
 * status's own message is used. */
int kvs__error_set(kvs_error_t *err, int status, int backend_code,
                   const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
void kvs__error_clear(kvs_error_t *err);

#define KVS__FAIL(err, status, ...)                                            \
    kvs__error_set((err), (status), 0, __FILE__, __LINE__, __VA_ARGS__)

#endif
