/*
 * error.c - recording error detail in a caller-owned kvs_error_t, for the
 * core (kvs__error_set, KVS__FAIL of error.h) and for backends whose create
 * functions report why they made nothing (kvs_error_set, KVS_ERROR_SET of
 * backend.h). The message is truncated to KVS_ERROR_MSG_BYTES - 1 bytes and
 * always NUL-terminated.
 */
#include "error.h"

#include <kvstage/backend.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Both setters below: the core's (error.h) and the backends' (backend.h). */
static int kvs__error_vset(kvs_error_t *err, int status, int backend_code, const char *file,
                           int line, const char *fmt, va_list ap)
{
    if (err == NULL)
        return status;
    err->status = status;
    err->backend_code = backend_code;
    err->file = file;
    err->line = line;
    if (fmt == NULL)
        snprintf(err->msg, sizeof err->msg, "%s", kvs_strerror(status));
    else
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return status;
}

int kvs__error_set(kvs_error_t *err, int status, int backend_code,
                   const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvs__error_vset(err, status, backend_code, file, line, fmt, ap);
    va_end(ap);
    return status;
}

int kvs_error_set(kvs_error_t *err, int status, int backend_code, const char *file, int line,
                  const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvs__error_vset(err, status, backend_code, file, line, fmt, ap);
    va_end(ap);
    return status;
}

void kvs__error_clear(kvs_error_t *err)
{
    if (err != NULL)
        memset(err, 0, sizeof *err);
}
