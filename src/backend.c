/*
 * backend.c - binding of backend ops tables (version/size checks, defaults
 * for optional slots) and the thin kvs__dev_* / kvs__net_* wrappers through
 * which the core calls them. A table smaller than the one this core knows is
 * copied as far as its size reaches and the rest filled with defaults.
 */
#include "backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The size of each version of a table: a version adds slots at the end, so
 * a table of an older version is a prefix of today's. */
#define KVS__DEVICE_OPS_V1_BYTES offsetof(kvs_device_ops_t, gather_parts)
#define KVS__DEVICE_OPS_V2_BYTES offsetof(kvs_device_ops_t, wait_arm)
#define KVS__DEVICE_OPS_V3_BYTES sizeof(kvs_device_ops_t)
#define KVS__DEVICE_OPS_V4_BYTES sizeof(kvs_device_ops_t) /* no slot: reads desc planes */
#define KVS__DEVICE_OPS_V5_BYTES sizeof(kvs_device_ops_t) /* no slot: reads scale planes */
#define KVS__FABRIC_OPS_V1_BYTES offsetof(kvs_fabric_ops_t, wait_arm)
#define KVS__FABRIC_OPS_V2_BYTES offsetof(kvs_fabric_ops_t, random_bytes)
#define KVS__FABRIC_OPS_V3_BYTES offsetof(kvs_fabric_ops_t, key_grant)
#define KVS__FABRIC_OPS_V4_BYTES offsetof(kvs_fabric_ops_t, mr_register_sealed)
#define KVS__FABRIC_OPS_V5_BYTES offsetof(kvs_fabric_ops_t, max_write_bytes)
#define KVS__FABRIC_OPS_V6_BYTES sizeof(kvs_fabric_ops_t)
_Static_assert(offsetof(kvs_device_ops_t, version) == 0, "version first");
_Static_assert(offsetof(kvs_fabric_ops_t, version) == 0, "version first");
/* Each version ends exactly where the next one's slots start: a table
 * grows at the end only, by the slots its version adds. */
_Static_assert(KVS__DEVICE_OPS_V2_BYTES ==
                   KVS__DEVICE_OPS_V1_BYTES + 2 * sizeof(void (*)(void)),
               "device ops version 2 adds gather_parts and scatter_parts, after mem_read");
_Static_assert(KVS__DEVICE_OPS_V3_BYTES == KVS__DEVICE_OPS_V2_BYTES + sizeof(void (*)(void)),
               "device ops version 3 adds wait_arm, last");
_Static_assert(KVS__FABRIC_OPS_V2_BYTES == KVS__FABRIC_OPS_V1_BYTES + sizeof(void (*)(void)),
               "fabric ops version 2 adds wait_arm, after now_ns");
_Static_assert(KVS__FABRIC_OPS_V3_BYTES == KVS__FABRIC_OPS_V2_BYTES + 2 * sizeof(void (*)(void)),
               "fabric ops version 3 adds random_bytes and peer_addr, after wait_arm");
_Static_assert(KVS__FABRIC_OPS_V4_BYTES == KVS__FABRIC_OPS_V3_BYTES + 2 * sizeof(void (*)(void)),
               "fabric ops version 4 adds key_grant and key_revoke, after peer_addr");
_Static_assert(KVS__FABRIC_OPS_V5_BYTES == KVS__FABRIC_OPS_V4_BYTES + sizeof(void (*)(void)),
               "fabric ops version 5 adds mr_register_sealed, after key_revoke");
_Static_assert(KVS__FABRIC_OPS_V6_BYTES == KVS__FABRIC_OPS_V5_BYTES + sizeof(void (*)(void)),
               "fabric ops version 6 adds max_write_bytes, after mr_register_sealed");

/* Defaults of optional slots: "not supported", never a NULL call. */
static int kvs__dev_no_stream(kvs_device_t *d, kvs_stream_t **o) { return KVS_ENOTSUP; }
static void kvs__dev_no_stream_destroy(kvs_device_t *d, kvs_stream_t *s) {}
static int kvs__dev_no_copy(kvs_device_t *d, kvs_stream_t *s, const kvs_copy_desc_t *c)
{
    return KVS_ENOTSUP;
}
static int kvs__dev_no_record(kvs_device_t *d, kvs_stream_t *s, kvs_event_t **o)
{
    return KVS_ENOTSUP;
}
static int kvs__dev_no_query(kvs_device_t *d, kvs_event_t *e) { return KVS_ENOTSUP; }
static void kvs__dev_no_event_destroy(kvs_device_t *d, kvs_event_t *e) {}
static int kvs__dev_no_mem_write(kvs_device_t *d, uint64_t a, const void *s, uint64_t n)
{
    return KVS_ENOTSUP;
}
static int kvs__dev_no_mem_read(kvs_device_t *d, uint64_t a, void *s, uint64_t n)
{
    return KVS_ENOTSUP;
}

/* Default fused copy: the parts' shapes checked together (memory is each
 * part's backend call's to check), then one copy per part, in order. A part
 * the backend refuses is named before the backend's detail, as the check
 * names it. */
static bool kvs__dev_any_mem(void *ctx, uint64_t addr, uint64_t len) { return true; }
static int kvs__dev_parts_loop(kvs_device_t *d, kvs_stream_t *s, const kvs_copy_desc_t *c,
                               const kvs_copy_part_t *parts, int64_t n, bool scatter)
{
    const char *what = scatter ? "scatter_parts" : "gather_parts";
    char msg[KVS_ERROR_MSG_BYTES];
    int rc = kvs_copy_parts_check(c, parts, n, scatter, what, d->name, kvs__dev_any_mem, NULL,
                                  NULL, msg, sizeof msg);
    if (rc != KVS_OK)
        return kvs_device_fail(d, rc, 0, "%s", msg);
    for (int64_t i = 0; i < n && rc == KVS_OK; i++) {
        const kvs_copy_desc_t one = kvs__copy_part_desc(c, &parts[i]);
        rc = scatter ? d->ops.scatter(d, s, &one) : d->ops.gather(d, s, &one);
        if (rc != KVS_OK) {
            memcpy(msg, d->last_backend_msg, sizeof msg);
            kvs_device_fail(d, rc, d->last_backend_code, "%s part %lld: %s", what,
                            (long long)i, msg[0] != '\0' ? msg : kvs_strerror(rc));
        }
    }
    return rc;
}
static int kvs__dev_gather_loop(kvs_device_t *d, kvs_stream_t *s, const kvs_copy_desc_t *c,
                                const kvs_copy_part_t *parts, int64_t n)
{
    return kvs__dev_parts_loop(d, s, c, parts, n, false);
}
static int kvs__dev_scatter_loop(kvs_device_t *d, kvs_stream_t *s, const kvs_copy_desc_t *c,
                                 const kvs_copy_part_t *parts, int64_t n)
{
    return kvs__dev_parts_loop(d, s, c, parts, n, true);
}

static int kvs__dev_no_wait(kvs_device_t *d, int *fd) { return KVS_ENOTSUP; }

static int kvs__net_no_connect(kvs_fabric_t *f, const char *p, kvs_conn_t **o)
{
    return KVS_ENOTSUP;
}
static void kvs__net_no_disconnect(kvs_fabric_t *f, kvs_conn_t *c) {}
static int kvs__net_no_write(kvs_fabric_t *f, kvs_conn_t *c, const kvs_write_desc_t *d)
{
    return KVS_ENOTSUP;
}
static int kvs__net_no_send(kvs_fabric_t *f, kvs_conn_t *c, const void *m, uint32_t n,
                            uint64_t id)
{
    return KVS_ENOTSUP;
}
static int kvs__net_no_poll(kvs_fabric_t *f, kvs_completion_t *o, int max)
{
    return KVS_ENOTSUP;
}
static uint64_t kvs__net_no_clock(kvs_fabric_t *f) { return 0; }
static int kvs__net_no_wait(kvs_fabric_t *f, int *fd, uint64_t *wake_ns) { return KVS_ENOTSUP; }
static int kvs__net_no_random(kvs_fabric_t *f, void *buf, size_t n) { return KVS_ENOTSUP; }
static int kvs__net_no_peer_addr(kvs_fabric_t *f, kvs_conn_t *c, char *buf, size_t n)
{
    return KVS_ENOTSUP;
}
static int kvs__net_no_grant(kvs_fabric_t *f, kvs_conn_t *c, kvs_mr_t *mr, uint64_t addr,
                             uint64_t len, kvs_grant_t **out, uint64_t *rkey)
{
    return KVS_ENOTSUP;
}
static int kvs__net_no_revoke(kvs_fabric_t *f, kvs_grant_t *g) { return KVS_ENOTSUP; }
static int kvs__net_no_seal(kvs_fabric_t *f, kvs_device_t *d, uint64_t addr, uint64_t len,
                            kvs_mr_t **out, uint64_t *rkey)
{
    return KVS_ENOTSUP;
}
static uint64_t kvs__net_no_write_limit(kvs_fabric_t *f) { return UINT64_MAX; }

#define KVS__DEFAULT(slot, fn)                                                 \
    do {                                                                       \
        if ((slot) == NULL)                                                    \
            (slot) = (fn);                                                     \
    } while (0)

/* Copies the slots of a table whose version is one of 1..max_version and
 * whose size holds at least that version's slots (version_bytes[version -
 * 1]): only those, so slots a later version added are never taken from an
 * older table, whatever its size says; KVS_EVERSION when the version or
 * size is not one this core knows. */
static int kvs__copy_table(void *dst, size_t dst_bytes, const void *src, uint32_t version,
                           uint32_t size, const size_t *version_bytes, uint32_t max_version)
{
    if (version < 1 || version > max_version || size < version_bytes[version - 1] ||
        size > dst_bytes)
        return KVS_EVERSION;
    memset(dst, 0, dst_bytes);
    memcpy(dst, src, version_bytes[version - 1]);
    return KVS_OK;
}

int kvs_device_init(kvs_device_t *dev, const kvs_device_ops_t *ops, const char *name)
{
    if (dev == NULL || ops == NULL)
        return KVS_EINVAL;
    kvs_device_t d = {0};
    static const size_t version_bytes[] = {KVS__DEVICE_OPS_V1_BYTES, KVS__DEVICE_OPS_V2_BYTES,
                                           KVS__DEVICE_OPS_V3_BYTES, KVS__DEVICE_OPS_V4_BYTES,
                                           KVS__DEVICE_OPS_V5_BYTES};
    _Static_assert(sizeof version_bytes / sizeof version_bytes[0] == KVS_DEVICE_OPS_VERSION,
                   "one size per device ops version");
    int rc = kvs__copy_table(&d.ops, sizeof d.ops, ops, ops->version, ops->size, version_bytes,
                             KVS_DEVICE_OPS_VERSION);
    if (rc != KVS_OK)
        return rc;
    if (d.ops.mem_alloc == NULL || d.ops.mem_free == NULL)
        return KVS_EINVAL;
    KVS__DEFAULT(d.ops.stream_create, kvs__dev_no_stream);
    KVS__DEFAULT(d.ops.stream_destroy, kvs__dev_no_stream_destroy);
    KVS__DEFAULT(d.ops.gather, kvs__dev_no_copy);
    KVS__DEFAULT(d.ops.scatter, kvs__dev_no_copy);
    KVS__DEFAULT(d.ops.event_record, kvs__dev_no_record);
    KVS__DEFAULT(d.ops.event_query, kvs__dev_no_query);
    KVS__DEFAULT(d.ops.event_destroy, kvs__dev_no_event_destroy);
    KVS__DEFAULT(d.ops.mem_write, kvs__dev_no_mem_write);
    KVS__DEFAULT(d.ops.mem_read, kvs__dev_no_mem_read);
    KVS__DEFAULT(d.ops.gather_parts, kvs__dev_gather_loop);
    KVS__DEFAULT(d.ops.scatter_parts, kvs__dev_scatter_loop);
    KVS__DEFAULT(d.ops.wait_arm, kvs__dev_no_wait);
    d.name = name != NULL ? name : (ops->name != NULL ? ops->name : "device");
    *dev = d;
    return KVS_OK;
}

int kvs_fabric_init(kvs_fabric_t *fab, const kvs_fabric_ops_t *ops, const char *name)
{
    if (fab == NULL || ops == NULL)
        return KVS_EINVAL;
    kvs_fabric_t f = {0};
    static const size_t version_bytes[] = {KVS__FABRIC_OPS_V1_BYTES, KVS__FABRIC_OPS_V2_BYTES,
                                           KVS__FABRIC_OPS_V3_BYTES, KVS__FABRIC_OPS_V4_BYTES,
                                           KVS__FABRIC_OPS_V5_BYTES, KVS__FABRIC_OPS_V6_BYTES};
    _Static_assert(sizeof version_bytes / sizeof version_bytes[0] == KVS_FABRIC_OPS_VERSION,
                   "one size per fabric ops version");
    int rc = kvs__copy_table(&f.ops, sizeof f.ops, ops, ops->version, ops->size, version_bytes,
                             KVS_FABRIC_OPS_VERSION);
    if (rc != KVS_OK)
        return rc;
    if (f.ops.mr_register == NULL || f.ops.mr_deregister == NULL)
        return KVS_EINVAL;
    KVS__DEFAULT(f.ops.connect, kvs__net_no_connect);
    KVS__DEFAULT(f.ops.disconnect, kvs__net_no_disconnect);
    KVS__DEFAULT(f.ops.write, kvs__net_no_write);
    KVS__DEFAULT(f.ops.send, kvs__net_no_send);
    KVS__DEFAULT(f.ops.poll, kvs__net_no_poll);
    KVS__DEFAULT(f.ops.now_ns, kvs__net_no_clock);
    KVS__DEFAULT(f.ops.wait_arm, kvs__net_no_wait);
    KVS__DEFAULT(f.ops.random_bytes, kvs__net_no_random);
    KVS__DEFAULT(f.ops.peer_addr, kvs__net_no_peer_addr);
    KVS__DEFAULT(f.ops.key_grant, kvs__net_no_grant);
    KVS__DEFAULT(f.ops.key_revoke, kvs__net_no_revoke);
    KVS__DEFAULT(f.ops.mr_register_sealed, kvs__net_no_seal);
    KVS__DEFAULT(f.ops.max_write_bytes, kvs__net_no_write_limit);
    f.name = name != NULL ? name : (ops->name != NULL ? ops->name : "fabric");
    *fab = f;
    return KVS_OK;
}

static void kvs__record(int *code, char *msg, size_t msg_bytes, int backend_code,
                        const char *fmt, va_list ap)
{
    *code = backend_code;
    vsnprintf(msg, msg_bytes, fmt, ap);
}

int kvs_device_fail(kvs_device_t *dev, int status, int backend_code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvs__record(&dev->last_backend_code, dev->last_backend_msg,
                sizeof dev->last_backend_msg, backend_code, fmt, ap);
    va_end(ap);
    return status;
}

int kvs_fabric_fail(kvs_fabric_t *fab, int status, int backend_code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvs__record(&fab->last_backend_code, fab->last_backend_msg,
                sizeof fab->last_backend_msg, backend_code, fmt, ap);
    va_end(ap);
    return status;
}

/* The failure detail on an instance belongs to the call that failed: the
 * wrappers of calls whose failure the core reports clear it first, so a
 * backend that fails without recording a detail does not show an older one.
 * Release calls (free, deregister, destroy) leave it alone: they run while
 * unwinding, between a failure and its report. */
static void kvs__dev_clear_detail(kvs_device_t *dev)
{
    dev->last_backend_code = 0;
    dev->last_backend_msg[0] = '\0';
}

static void kvs__net_clear_detail(kvs_fabric_t *fab)
{
    fab->last_backend_code = 0;
    fab->last_backend_msg[0] = '\0';
}

int kvs__dev_alloc(kvs_device_t *dev, uint64_t len_bytes, uint64_t *out_addr)
{
    kvs__dev_clear_detail(dev);
    return dev->ops.mem_alloc(dev, len_bytes, out_addr);
}
int kvs__dev_free(kvs_device_t *dev, uint64_t addr) { return dev->ops.mem_free(dev, addr); }
int kvs__dev_stream_create(kvs_device_t *dev, kvs_stream_t **out)
{
    kvs__dev_clear_detail(dev);
    return dev->ops.stream_create(dev, out);
}
void kvs__dev_stream_destroy(kvs_device_t *dev, kvs_stream_t *stream)
{
    dev->ops.stream_destroy(dev, stream);
}
bool kvs__dev_has_planes(const kvs_device_t *dev) { return dev->ops.version >= 4; }
bool kvs__dev_has_scales(const kvs_device_t *dev) { return dev->ops.version >= 5; }

/* A copy of one plane per layer goes only to a backend that reads planes
 * (device ops version 4): an older one would copy a V from v_base. One with
 * scale planes only to a backend that reads them (version 5): an older one
 * would move the KV rows and leave the scales behind. */
static int kvs__dev_copy_check(kvs_device_t *dev, const kvs_copy_desc_t *d, const char *what)
{
    kvs__dev_clear_detail(dev);
    if (d != NULL && d->scale_bytes != 0 && !kvs__dev_has_scales(dev))
        return kvs_device_fail(dev, KVS_ENOTSUP, 0, "%s on %s: a copy with scale planes "
                               "(FP8 KV with scales, kv_scales) needs device ops version 5, "
                               "the backend binds version %u: rebuild it against this "
                               "kvstage", what, dev->name, dev->ops.version);
    if (d != NULL && d->planes == 1 && !kvs__dev_has_planes(dev))
        return kvs_device_fail(dev, KVS_ENOTSUP, 0, "%s on %s: a copy of one plane per "
                               "layer (MLA) needs device ops version 4, the backend binds "
                               "version %u: rebuild it against this kvstage", what, dev->name,
                               dev->ops.version);
    return KVS_OK;
}
int kvs__dev_gather(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d)
{
    const int rc = kvs__dev_copy_check(dev, d, "gather");
    return rc != KVS_OK ? rc : dev->ops.gather(dev, s, d);
}
int kvs__dev_scatter(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d)
{
    const int rc = kvs__dev_copy_check(dev, d, "scatter");
    return rc != KVS_OK ? rc : dev->ops.scatter(dev, s, d);
}
int kvs__dev_gather_parts(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                          const kvs_copy_part_t *parts, int64_t nparts)
{
    const int rc = kvs__dev_copy_check(dev, d, "gather_parts");
    return rc != KVS_OK ? rc : dev->ops.gather_parts(dev, s, d, parts, nparts);
}
int kvs__dev_scatter_parts(kvs_device_t *dev, kvs_stream_t *s, const kvs_copy_desc_t *d,
                           const kvs_copy_part_t *parts, int64_t nparts)
{
    const int rc = kvs__dev_copy_check(dev, d, "scatter_parts");
    return rc != KVS_OK ? rc : dev->ops.scatter_parts(dev, s, d, parts, nparts);
}
int kvs__dev_event_record(kvs_device_t *dev, kvs_stream_t *s, kvs_event_t **out)
{
    kvs__dev_clear_detail(dev);
    return dev->ops.event_record(dev, s, out);
}
int kvs__dev_event_query(kvs_device_t *dev, kvs_event_t *ev)
{
    kvs__dev_clear_detail(dev);
    return dev->ops.event_query(dev, ev);
}
void kvs__dev_event_destroy(kvs_device_t *dev, kvs_event_t *ev)
{
    dev->ops.event_destroy(dev, ev);
}

bool kvs__net_has(const kvs_fabric_t *fab, uint32_t cap) { return (fab->ops.caps & cap) == cap; }
int kvs__net_register(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                      uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    kvs__net_clear_detail(fab);
    return fab->ops.mr_register(fab, dev, addr, len_bytes, out, out_rkey);
}
int kvs__net_register_sealed(kvs_fabric_t *fab, kvs_device_t *dev, uint64_t addr,
                             uint64_t len_bytes, kvs_mr_t **out, uint64_t *out_rkey)
{
    kvs__net_clear_detail(fab);
    return fab->ops.mr_register_sealed(fab, dev, addr, len_bytes, out, out_rkey);
}
int kvs__net_deregister(kvs_fabric_t *fab, kvs_mr_t *mr)
{
    return fab->ops.mr_deregister(fab, mr);
}
bool kvs__net_can_grant(const kvs_fabric_t *fab)
{
    return fab->ops.key_grant != kvs__net_no_grant;
}
int kvs__net_key_grant(kvs_fabric_t *fab, kvs_conn_t *conn, kvs_mr_t *mr, uint64_t addr,
                       uint64_t len_bytes, kvs_grant_t **out, uint64_t *out_rkey)
{
    kvs__net_clear_detail(fab);
    return fab->ops.key_grant(fab, conn, mr, addr, len_bytes, out, out_rkey);
}
int kvs__net_key_revoke(kvs_fabric_t *fab, kvs_grant_t *grant)
{
    return fab->ops.key_revoke(fab, grant);
}
uint64_t kvs__net_now_ns(kvs_fabric_t *fab) { return fab->ops.now_ns(fab); }
uint64_t kvs__net_max_write_bytes(kvs_fabric_t *fab)
{
    const uint64_t n = fab->ops.max_write_bytes(fab);
    return n == 0 ? UINT64_MAX : n;
}
int kvs__net_random(kvs_fabric_t *fab, void *buf, size_t len_bytes)
{
    return fab->ops.random_bytes(fab, buf, len_bytes);
}
const char *kvs__net_peer_addr(kvs_fabric_t *fab, kvs_conn_t *conn, char *buf, size_t bytes)
{
    if (bytes == 0)
        return "";
    buf[0] = 0;
    if (fab->ops.peer_addr(fab, conn, buf, bytes) != KVS_OK || buf[0] == 0)
        snprintf(buf, bytes, "an address fabric '%s' does not report", fab->name);
    buf[bytes - 1] = 0;
    return buf;
}
