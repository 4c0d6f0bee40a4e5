/*
 * log.h - internal logging through an object's kvs_log_t sink. Formatting
 * happens only when the level passes, so disabled logs cost a comparison.
 */
#ifndef KVS_SRC_LOG_H
#define KVS_SRC_LOG_H

#include <kvstage/kvstage.h>

void kvs__log(const kvs_log_t *log, kvs_log_level_t level, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Copies a user sink, taking the environment's level when level is 0 and no
 * callback was given. */
kvs_log_t kvs__log_resolve(const kvs_log_t *user);

#endif
