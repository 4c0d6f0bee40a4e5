/*
 * channel.h (internal) - the control channel of a handler: encoding and
 * sending protocol messages over the fabric's SEND, and the compatibility
 * fingerprint both sides compare at registration (spec §7.1).
 */
#ifndef KVS_SRC_CHANNEL_H
#define KVS_SRC_CHANNEL_H

#include "backend.h"
#include "wire.h"

/* wr_id of control sends: the top bit set, so write completions (top bit
 * clear) are never confused with them. */
#define KVS__WR_CONTROL (1ull << 63)

/* Encodes msg and posts it on conn; counts it in stats. */
int kvs__channel_send(kvs_fabric_t *fab, kvs_conn_t *conn, const kvs_msg_t *msg,
                      kvs_handler_stats_t *stats);
/* The fingerprint of a layout on a path. */
void kvs__fingerprint(const kvs_layout_t *lay, kvs_path_t path, const kvs_manager_config_t *cfg,
                      kvs_fingerprint_t *out);
/* KVS_OK, or KVS_EFINGERPRINT with `why` naming the first field that
 * differs and both values. */
int kvs__fingerprint_check(const kvs_fingerprint_t *mine, const kvs_fingerprint_t *theirs,
                           char *why, size_t why_bytes);

#endif
