/*
 * backend.h (internal) - the only way the core reaches a backend. Each
 * wrapper calls the bound (filled) ops table; every slot is non-NULL after
 * kvs_device_init / kvs_fabric_init, so a missing optional slot answers
 * KVS_ENOTSUP instead of crashing. Tracing or fault hooks belong here.
 * The wrappers of calls that acquire or run something (alloc, stream and
 * event creation and queries, gather, scatter, register, key_grant) clear the
 * instance's last_backend_code/msg first, so after a failure they describe
 * that call; the release wrappers leave them alone.
 */
#ifndef KVS_SRC_BACKEND_H
#define KVS_SRC_BACKEND_H

#include <kvstage/backend.h>

int kvs__dev_alloc(kvs_device_t *dev, uint64_t len_bytes, uint64_t *out_addr);
int kvs__dev_free(kvs_device_t *dev, uint64_t addr);
int kvs__dev_stream_create(kvs_device_t *dev, kvs_stream_t **out);
void kvs__dev_stream_destroy(kvs_device_t *dev, kvs_stream_t *stream);
/* Whether the device's copies read kvs_copy_desc_t.planes (device ops
 * version 4): copies of one plane per layer (MLA) go only to such a device. */
bool kvs__dev_has_planes(const kvs_device_t *dev);
/* Whether the device's copies read the scale planes of kvs_copy_desc_t
 * (device ops version 5): copies with scales go only to such a device. */
bool kvs__dev_has_scales(const kvs_device_t *dev);
int kvs__dev_gather(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d);
int kvs__dev_scatter(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d);
int kvs__dev_gather_parts(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                          const kvs_copy_part_t *parts, int64_t nparts);
int kvs__dev_scatter_parts(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                           const kvs_copy_part_t *parts, int64_t nparts);
/* The descriptor of one part of a fused copy: d with the part's heads and
 * staging block. */
static inline kvs_copy_desc_t kvs__copy_part_desc(const kvs_copy_desc_t *d,
                                                  const kvs_copy_part_t *part)
{
    kvs_copy_desc_t one = *d;
    one.head_start = part->head_start;
    one.num_heads = part->num_heads;
    one.staging_addr = part->staging_addr;
    return one;
}

int kvs__dev_event_record(kvs_device_t *dev, kvs_stream_t *s, kvs_event_t **out);
int kvs__dev_event_query(kvs_device_t *dev, kvs_event_t *ev);
void kvs__dev_event_destroy(kvs_device_t *dev, kvs_event_t *ev);

bool kvs__net_has(const kvs_fabric_t *fab, uint32_t cap);
int kvs__net_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                      uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);
/* A registration whose own key opens nothing remote; only grants do
 * (mr_register_sealed, version 5; KVS_ENOTSUP where the fabric has none). */
int kvs__net_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                             uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey);
int kvs__net_deregister(kvs_fabric_t *fab, kvs_mr_t *mr);
/* Whether the fabric fills key_grant (version 4): a decode scopes its
 * writers' keys to their regions only then. */
bool kvs__net_can_grant(const kvs_fabric_t *fab);
/* Region-scoped keys (backend.h, key_grant / key_revoke). */
int kvs__net_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                       uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey);
int kvs__net_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant);
uint64_t kvs__net_now_ns(kvs_fabric_t *fab);
/* The most bytes one write takes on fab (its max_write_bytes; UINT64_MAX
 * when it has no limit, a 0 read as that too). */
uint64_t kvs__net_max_write_bytes(kvs_fabric_t *fab);
/* len_bytes unpredictable bytes (the fabric's random_bytes). */
int kvs__net_random(kvs_fabric_t *fab, void *buf, size_t len_bytes);
/* conn's peer address as text for a log line, or words saying the fabric
 * does not report it; returns buf. */
const char *kvs__net_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes);

#endif
