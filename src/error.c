/*
 * error.c - recording error detail in a caller-owned kvs_error_t. The message
 * is truncated to KVS_ERROR_MSG_BYTES - 1 bytes and always NUL-terminated.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int kvs__error_set(kvs_error_t *err, int status, int backend_code,
                   const char *file, int line, const char *fmt, ...)
{
    if (err == NULL)
        return status;
    err->status = status;
    err->backend_code = backend_code;
    err->file = file;
    err->line = line;
    if (fmt == NULL) {
        snprintf(err->msg, sizeof err->msg, "%s", kvs_strerror(status));
        return status;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return status;
}

void kvs__error_clear(kvs_error_t *err)
{
    if (err != NULL)
        memset(err, 0, sizeof *err);
}
