/*
 * select.c - which RDMA device, port and GID a verbs fabric uses, decided
 * over a snapshot of the devices (so the rules are tested without
 * hardware), plus GID and MTU helpers.
 *
 * Rules: a named device must exist; a named port must exist and be
 * ACTIVE; a given GID index must hold a non-zero GID and is used as given.
 * Automatic choices take the first device, then the first ACTIVE port, that
 * has a usable GID: on Ethernet (RoCE) the first RoCE v2 GID that is
 * neither zero nor link-local (fe80::/10), IPv4-mapped ones before IPv6;
 * on InfiniBand GID index 0. Every refusal says what to change.
 *
 * Near a PCI device (a GPU; topology.c read where everything sits), when no
 * device is named: the RDMA device whose PCI path shares the most
 * components with the GPU's, counted from the host bridge down. Two or more
 * shared (a bridge below the host bridge) is the same PCIe switch, deeper
 * is closer; one is the same root complex; none, the same NUMA node before
 * any other. Devices without a PCI device (rxe, siw) are never closest.
 * Among the equally close, the first by name (mlx5_2 before mlx5_10) that
 * is usable; when none of them is, a refusal: a farther device would cross
 * the PCIe links this rule is there to avoid, so only a caller naming it
 * takes it.
 */
#include "hw_verbs.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

uint32_t hw_verbs_mtu_bytes(int mtu)
{
    switch (mtu) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
    default: return 0;
    }
}

int hw_verbs_mtu_enum(uint32_t bytes)
{
    if (bytes >= 4096)
        return IBV_MTU_4096;
    if (bytes >= 2048)
        return IBV_MTU_2048;
    if (bytes >= 1024)
        return IBV_MTU_1024;
    if (bytes >= 512)
        return IBV_MTU_512;
    if (bytes >= 256)
        return IBV_MTU_256;
    return 0;
}

static bool hw_verbs_gid_zero(const uint8_t raw[16])
{
    for (int i = 0; i < 16; i++)
        if (raw[i] != 0)
            return false;
    return true;
}

static bool hw_verbs_gid_v4mapped(const uint8_t raw[16])
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(raw, prefix, sizeof prefix) == 0;
}

static bool hw_verbs_gid_link_local(const uint8_t raw[16])
{
    return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
}

bool hw_verbs_gid_addr(const uint8_t raw[16], char *addr, size_t addr_bytes)
{
    char buf[INET6_ADDRSTRLEN];
    const char *s = hw_verbs_gid_v4mapped(raw) ? inet_ntop(AF_INET, raw + 12, buf, sizeof buf)
                                               : inet_ntop(AF_INET6, raw, buf, sizeof buf);
    if (s == NULL || hw_verbs_gid_zero(raw)) {
        if (addr_bytes > 0)
            addr[0] = '\0';
        return false;
    }
    snprintf(addr, addr_bytes, "%s", s);
    return true;
}

void hw_verbs_gid_text(const uint8_t raw[16], char *text, size_t text_bytes)
{
    char buf[INET6_ADDRSTRLEN];
    if (inet_ntop(AF_INET6, raw, buf, sizeof buf) == NULL)
        snprintf(buf, sizeof buf, "?");
    snprintf(text, text_bytes, "%s", buf);
}

static const char *hw_verbs_gid_type_name(int type)
{
    switch (type) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return "unknown type";
    }
}

static const char *hw_verbs_port_state_name(int state)
{
    switch (state) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
    }
}

/* Whether the automatic rule accepts this GID; rank 0 best. */
static int hw_verbs_gid_rank(const hw_verbs_port_info_t *p, const hw_verbs_gid_t *g)
{
    if (hw_verbs_gid_zero(g->raw))
        return -1;
    if (p->link_layer == IBV_LINK_LAYER_INFINIBAND)
        return g->index == 0 ? 0 : -1;
    if (g->type != IBV_GID_TYPE_ROCE_V2 || hw_verbs_gid_link_local(g->raw))
        return -1;
    return hw_verbs_gid_v4mapped(g->raw) ? 0 : 1;
}

static const hw_verbs_gid_t *hw_verbs_auto_gid(const hw_verbs_port_info_t *p)
{
    const hw_verbs_gid_t *best = NULL;
    int best_rank = 2;
    for (int i = 0; i < p->ngids; i++) {
        int r = hw_verbs_gid_rank(p, &p->gids[i]);
        if (r >= 0 && r < best_rank) {
            best = &p->gids[i];
            best_rank = r;
        }
    }
    return best;
}

/* "1=::ffff:192.0.2.1 (RoCE v1), 3=..." of the GIDs worth naming (not zero,
 * not link-local), cut with "..." to leave room for the rest of a message. */
static void hw_verbs_list_gids(const hw_verbs_port_info_t *p, char *buf, size_t n)
{
    const size_t cap = n < 120 ? n : 120;
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->ngids; i++) {
        const hw_verbs_gid_t *g = &p->gids[i];
        if (hw_verbs_gid_zero(g->raw) || hw_verbs_gid_link_local(g->raw))
            continue;
        char text[48], item[80];
        hw_verbs_gid_text(g->raw, text, sizeof text);
        int k = snprintf(item, sizeof item, "%s%d=%s (%s)", used ? ", " : "", g->index, text,
                         hw_verbs_gid_type_name(g->type));
        if (k < 0 || used + (size_t)k + 4 >= cap) {
            snprintf(buf + used, n - used, "%s...", used ? ", " : "");
            return;
        }
        memcpy(buf + used, item, (size_t)k + 1);
        used += (size_t)k;
    }
    if (used == 0)
        snprintf(buf, n, "none");
}

static void hw_verbs_list_devs(const hw_verbs_dev_info_t *devs, int ndevs, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < ndevs && used + 1 < n; i++) {
        int k = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", devs[i].name);
        if (k < 0)
            break;
        used += (size_t)k < n - used ? (size_t)k : n - used - 1;
    }
}

static void hw_verbs_fill(const hw_verbs_dev_info_t *devs, int d, int port,
                          const hw_verbs_gid_t *g, hw_verbs_choice_t *out)
{
    (void)devs;
    out->dev = d;
    out->port = port;
    out->gid_index = g->index;
    hw_verbs_gid_text(g->raw, out->gid, sizeof out->gid);
    if (!hw_verbs_gid_addr(g->raw, out->addr, sizeof out->addr) ||
        devs[d].ports[port - 1].link_layer == IBV_LINK_LAYER_INFINIBAND)
        out->addr[0] = '\0';
}

/* Port and GID on one device; *why says what failed. */
static int hw_verbs_select_on(const hw_verbs_dev_info_t *devs, int d, int want_port,
                              int want_gid, hw_verbs_choice_t *out, char *why, size_t n)
{
    const hw_verbs_dev_info_t *dev = &devs[d];
    if (want_port != 0 && (want_port < 1 || want_port > dev->nports)) {
        snprintf(why, n, "port %d of RDMA device %s does not exist (it has %d port%s): set "
                 "the port to 1..%d, or 0 for the first active one", want_port, dev->name,
                 dev->nports, dev->nports == 1 ? "" : "s", dev->nports);
        return KVS_EINVAL;
    }
    const int first = want_port != 0 ? want_port : 1;
    const int last = want_port != 0 ? want_port : dev->nports;
    char states[160] = "";
    size_t used = 0;
    for (int port = first; port <= last; port++) {
        const hw_verbs_port_info_t *p = &dev->ports[port - 1];
        if (p->state != IBV_PORT_ACTIVE) {
            if (want_port != 0) {
                snprintf(why, n, "port %d of RDMA device %s is %s, not ACTIVE: bring its link "
                         "up (ip link set <its netdev> up; for rxe: rdma link show) or choose "
                         "another port", port, dev->name, hw_verbs_port_state_name(p->state));
                return KVS_EBACKEND;
            }
            int k = snprintf(states + used, sizeof states - used, "%sport %d %s",
                             used ? ", " : "", port, hw_verbs_port_state_name(p->state));
            if (k > 0 && (size_t)k < sizeof states - used)
                used += (size_t)k;
            continue;
        }
        if (want_gid != KVS_VERBS_GID_AUTO) {
            for (int i = 0; i < p->ngids; i++) {
                const hw_verbs_gid_t *g = &p->gids[i];
                if (g->index == want_gid && !hw_verbs_gid_zero(g->raw)) {
                    hw_verbs_fill(devs, d, port, g, out);
                    return KVS_OK;
                }
            }
            char list[400];
            hw_verbs_list_gids(p, list, sizeof list);
            if (want_gid < 0 || want_gid >= p->gid_tbl_len)
                snprintf(why, n, "GID index %d is outside the GID table of %s port %d (%d "
                         "entries); usable: %s: set the GID index to one of them, or -1 for "
                         "automatic", want_gid, dev->name, port, p->gid_tbl_len, list);
            else
                snprintf(why, n, "GID index %d of %s port %d is empty; usable: %s: set the "
                         "GID index to one of them, or -1 for automatic", want_gid, dev->name, port, list);
            return KVS_EINVAL;
        }
        const hw_verbs_gid_t *g = hw_verbs_auto_gid(p);
        if (g != NULL) {
            hw_verbs_fill(devs, d, port, g, out);
            return KVS_OK;
        }
        char list[400];
        hw_verbs_list_gids(p, list, sizeof list);
        snprintf(why, n, "%s port %d has no usable GID (RoCE v2, not zero, not "
                 "link-local; others: %s): give its netdev an IP address, or set the GID "
                 "index", dev->name, port, list);
        if (want_port != 0)
            return KVS_EBACKEND;
        int k = snprintf(states + used, sizeof states - used, "%sport %d has no usable GID",
                         used ? ", " : "", port);
        if (k > 0 && (size_t)k < sizeof states - used)
            used += (size_t)k;
    }
    if (want_port == 0)
        snprintf(why, n, "RDMA device %s has no ACTIVE port with a usable GID (%s): bring a "
                 "port's link up and give its netdev an IP address (for rxe: rdma link add "
                 "rxe0 type rxe netdev <netdev>), or choose another device", dev->name,
                 states[0] ? states : "no ports");
    return KVS_EBACKEND;
}

/* strcmp, but runs of digits compare as numbers: mlx5_2 before mlx5_10. */
static int hw_verbs_name_cmp(const char *a, const char *b)
{
    while (*a != '\0' && *b != '\0') {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            while (*a == '0' && isdigit((unsigned char)a[1]))
                a++;
            while (*b == '0' && isdigit((unsigned char)b[1]))
                b++;
            size_t na = 0, nb = 0;
            while (isdigit((unsigned char)a[na]))
                na++;
            while (isdigit((unsigned char)b[nb]))
                nb++;
            if (na != nb)
                return na < nb ? -1 : 1;
            const int c = strncmp(a, b, na);
            if (c != 0)
                return c;
            a += na;
            b += nb;
            continue;
        }
        if (*a != *b)
            return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
        a++;
        b++;
    }
    return *a != '\0' ? 1 : *b != '\0' ? -1 : 0;
}

/* How many '/'-separated components paths a and b share from the start;
 * *last gets the last shared one (length *last_len). */
static int hw_verbs_pci_shared(const char *a, const char *b, const char **last,
                               size_t *last_len)
{
    int shared = 0;
    *last = NULL;
    *last_len = 0;
    while (*a != '\0' && *b != '\0') {
        const size_t na = strcspn(a, "/"), nb = strcspn(b, "/");
        if (na != nb || strncmp(a, b, na) != 0)
            break;
        shared++;
        *last = a;
        *last_len = na;
        a += na;
        b += nb;
        a += *a == '/';
        b += *b == '/';
    }
    return shared;
}

/* Closeness of a device to near: shared components, then the NUMA node;
 * -1 for a device without a PCI device. Higher is closer. */
static int hw_verbs_closeness(const hw_verbs_dev_info_t *dev, const hw_verbs_near_t *near)
{
    if (dev->pci.path == NULL)
        return -1;
    const char *last;
    size_t last_len;
    const int shared = hw_verbs_pci_shared(dev->pci.path, near->pci.path, &last, &last_len);
    const bool same_node = shared == 0 && near->pci.numa_node >= 0 &&
                           dev->pci.numa_node == near->pci.numa_node;
    return 2 * shared + (same_node ? 1 : 0);
}

/* "closest to PCI 0000:3b:00.0: same PCIe switch (below 0000:18:00.0)". */
static void hw_verbs_near_reason(const hw_verbs_dev_info_t *dev, const hw_verbs_near_t *near,
                                 char *buf, size_t n)
{
    const char *last;
    size_t last_len;
    const int shared = hw_verbs_pci_shared(dev->pci.path, near->pci.path, &last, &last_len);
    const int len = (int)(last_len < 64 ? last_len : 64);
    if (strcmp(dev->pci.path, near->pci.path) == 0)
        snprintf(buf, n, "closest to PCI %s: it is that PCI device", near->bus_id);
    else if (shared >= 2)
        snprintf(buf, n, "closest to PCI %s: same PCIe switch (below %.*s)", near->bus_id, len,
                 last);
    else if (shared == 1)
        snprintf(buf, n, "closest to PCI %s: same PCIe root complex (%.*s)", near->bus_id, len,
                 last);
    else if (near->pci.numa_node >= 0 && dev->pci.numa_node == near->pci.numa_node)
        snprintf(buf, n, "closest to PCI %s: same NUMA node (%d)", near->bus_id,
                 near->pci.numa_node);
    else
        snprintf(buf, n, "closest to PCI %s: none shares its root complex or NUMA node, first "
                 "by name", near->bus_id);
}

/* The device closest to near that is usable (see the top of the file). */
static int hw_verbs_select_near(const hw_verbs_dev_info_t *devs, int ndevs,
                                const hw_verbs_near_t *near, int want_port, int want_gid,
                                hw_verbs_choice_t *out, char *why, size_t why_bytes)
{
    int best = -1;
    for (int d = 0; d < ndevs; d++) {
        const int c = hw_verbs_closeness(&devs[d], near);
        best = c > best ? c : best;
    }
    if (best < 0) {
        char list[160];
        hw_verbs_list_devs(devs, ndevs, list, sizeof list);
        snprintf(why, why_bytes, "no RDMA device here is on PCI (%s: soft-RoCE or virtual), "
                 "so none is closest to PCI %s: set device to one of them, or leave near_pci "
                 "unset", list, near->bus_id);
        return KVS_EBACKEND;
    }
    /* The equally close ones by name; the first usable wins. */
    int tried = -1, first_rc = KVS_OK;
    char first_why[KVS_ERROR_MSG_BYTES] = "";
    for (;;) {
        int next = -1;
        for (int d = 0; d < ndevs; d++)
            if (hw_verbs_closeness(&devs[d], near) == best &&
                (tried < 0 || hw_verbs_name_cmp(devs[d].name, devs[tried].name) > 0) &&
                (next < 0 || hw_verbs_name_cmp(devs[d].name, devs[next].name) < 0))
                next = d;
        if (next < 0)
            break;
        tried = next;
        char w[KVS_ERROR_MSG_BYTES];
        const int rc = hw_verbs_select_on(devs, next, want_port, want_gid, out, w, sizeof w);
        if (rc == KVS_OK) {
            hw_verbs_near_reason(&devs[next], near, out->reason, sizeof out->reason);
            return KVS_OK;
        }
        if (first_rc == KVS_OK) {
            first_rc = rc;
            snprintf(first_why, sizeof first_why, "%s", w);
        }
    }
    memset(out, 0, sizeof *out);
    snprintf(why, why_bytes, "closest to PCI %s: %s", near->bus_id, first_why);
    return first_rc;
}

int hw_verbs_select(const hw_verbs_dev_info_t *devs, int ndevs, const char *want_dev,
                    const hw_verbs_near_t *near, int want_port, int want_gid,
                    hw_verbs_choice_t *out, char *why, size_t why_bytes)
{
    memset(out, 0, sizeof *out);
    if (why_bytes > 0)
        why[0] = '\0';
    if (ndevs <= 0) {
        snprintf(why, why_bytes, "no RDMA device found (/sys/class/infiniband is empty): "
                 "load the NIC's driver, or make a soft-RoCE device (rdma link add rxe0 type "
                 "rxe netdev <netdev>), or run the tests via tests/rxe/run-in-vm.sh");
        return KVS_EBACKEND;
    }
    if (want_port < 0) {
        snprintf(why, why_bytes, "port %d is not a port number: set it to 1.. or 0 for the "
                 "first active port", want_port);
        return KVS_EINVAL;
    }
    if (want_dev != NULL && want_dev[0] != '\0') {
        for (int d = 0; d < ndevs; d++) {
            if (strcmp(devs[d].name, want_dev) != 0)
                continue;
            const int rc = hw_verbs_select_on(devs, d, want_port, want_gid, out, why,
                                              why_bytes);
            if (rc == KVS_OK)
                snprintf(out->reason, sizeof out->reason, "named by the caller%s%s%s",
                         near != NULL ? " (near_pci " : "", near != NULL ? near->bus_id : "",
                         near != NULL ? " not consulted)" : "");
            return rc;
        }
        char list[200];
        hw_verbs_list_devs(devs, ndevs, list, sizeof list);
        snprintf(why, why_bytes, "RDMA device '%s' not found; devices here: %s: set the "
                 "device to one of them (or leave it unset for the first usable one)",
                 want_dev, list);
        return KVS_EINVAL;
    }
    if (near != NULL)
        return hw_verbs_select_near(devs, ndevs, near, want_port, want_gid, out, why,
                                    why_bytes);
    int first_rc = KVS_OK;
    char first_why[KVS_ERROR_MSG_BYTES] = "";
    for (int d = 0; d < ndevs; d++) {
        char w[KVS_ERROR_MSG_BYTES];
        int rc = hw_verbs_select_on(devs, d, want_port, want_gid, out, w, sizeof w);
        if (rc == KVS_OK) {
            snprintf(out->reason, sizeof out->reason, "first usable device");
            return KVS_OK;
        }
        if (first_rc == KVS_OK) {
            first_rc = rc;
            snprintf(first_why, sizeof first_why, "%s", w);
        }
        if (rc == KVS_EINVAL) /* a named port or GID index is wrong: say so */
            break;
    }
    snprintf(why, why_bytes, "%s%s", ndevs > 1 ? "no RDMA device is usable; the first: " : "",
             first_why);
    return first_rc;
}
