/*
 * log.c - log levels, their parsing and the per-object sink. There is no
 * global logger: each object carries the kvs_log_t it was created with. The
 * default level comes from the KVS_LOG_LEVEL environment variable (read, not
 * stored).
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kvs__level_names[] = {"off", "error", "warn",
                                               "info", "debug", "trace"};
#define KVS__LEVELS ((int)(sizeof kvs__level_names / sizeof kvs__level_names[0]))

const char *kvs_log_level_name(kvs_log_level_t level)
{
    if ((int)level < 0 || (int)level >= KVS__LEVELS)
        return "unknown";
    return kvs__level_names[level];
}

int kvs_log_level_parse(const char *text, kvs_log_level_t *out)
{
    if (text == NULL || out == NULL)
        return KVS_EINVAL;
    for (int i = 0; i < KVS__LEVELS; i++) {
        if (strcmp(text, kvs__level_names[i]) == 0) {
            *out = (kvs_log_level_t)i;
            return KVS_OK;
        }
    }
    if (text[0] >= '0' && text[0] < '0' + KVS__LEVELS && text[1] == '\0') {
        *out = (kvs_log_level_t)(text[0] - '0');
        return KVS_OK;
    }
    return KVS_EINVAL;
}

kvs_log_level_t kvs_log_level_default(void)
{
    kvs_log_level_t level;
    if (kvs_log_level_parse(getenv(KVS_LOG_ENV), &level) == KVS_OK)
        return level;
    return KVS_LOG_WARN;
}

kvs_log_t kvs__log_resolve(const kvs_log_t *user)
{
    kvs_log_t log = {0};
    if (user != NULL)
        log = *user;
    if (log.fn == NULL && log.level == KVS_LOG_OFF)
        log.level = kvs_log_level_default();
    return log;
}

void kvs_log_write(const kvs_log_t *log, kvs_log_level_t level, const char *fmt, ...)
{
    if (log == NULL || level == KVS_LOG_OFF || level > log->level)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (log->fn != NULL)
        log->fn(log->user, level, buf);
    else
        fprintf(stderr, "kvstage %s: %s\n", kvs_log_level_name(level), buf);
}
