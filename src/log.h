/*
 * log.h - internal logging through an object's kvs_log_t sink: messages
 * go through the public kvs_log_write (formatting only when the level
 * passes, so disabled logs cost a comparison); the sink's resolution here.
 */
#ifndef KVS_SRC_LOG_H
#define KVS_SRC_LOG_H

#include <kvstage/kvstage.h>

/* Copies a user sink, taking the environment's level when level is 0 and no
 * callback was given. */
kvs_log_t kvs__log_resolve(const kvs_log_t *user);

#endif
