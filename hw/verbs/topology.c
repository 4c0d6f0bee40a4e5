/*
 * topology.c - where the RDMA devices and the caller's PCI device (a GPU)
 * sit on PCIe, read from sysfs: the one place the verbs fabric reads the
 * PCI tree. It decides nothing (select.c picks the closest device over what
 * it read), and the sysfs root is a parameter, so tests build a fake tree.
 *
 * What it reads under ROOT (normally /sys):
 * - ROOT/bus/pci/devices/<bus id>, a link into ROOT/devices/pci<D:B>/...:
 *   the caller's device, as its path from the host bridge down and the
 *   numa_node file in that folder;
 * - ROOT/class/infiniband/<name>/device: the same for each RDMA device. No
 *   such link, or one that leads outside ROOT/devices/pci*, means no PCI
 *   device (soft-RoCE's rxe, siw, anything virtual): select.c never calls
 *   such a device closest.
 * Refusals (a bus id that is not one, or not in sysfs) say what to change.
 */
#include "hw_verbs.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Up to max hex digits at *p into *val; how many were read. */
static int hw_verbs_hex(const char **p, int max, unsigned long *val)
{
    int n = 0;
    *val = 0;
    while (n < max && isxdigit((unsigned char)**p)) {
        const int c = tolower((unsigned char)**p);
        *val = *val * 16 + (unsigned long)(isdigit(c) ? c - '0' : c - 'a' + 10);
        (*p)++;
        n++;
    }
    return n;
}

bool hw_verbs_bus_id_parse(const char *text, char *out, size_t out_bytes)
{
    if (text == NULL)
        return false;
    /* DOMAIN:BUS:DEVICE.FUNCTION, or BUS:DEVICE.FUNCTION in domain 0 */
    unsigned long f[3] = {0, 0, 0}, fn = 0;
    int digits[3] = {0, 0, 0}, fields = 0;
    const char *p = text;
    for (;;) {
        if (fields == 3)
            return false;
        digits[fields] = hw_verbs_hex(&p, 8, &f[fields]);
        fields++;
        if (*p != ':')
            break;
        p++;
    }
    if (*p != '.' || fields < 2)
        return false;
    p++;
    if (*p < '0' || *p > '7' || p[1] != '\0')
        return false;
    fn = (unsigned long)(*p - '0');
    const int b = fields - 2; /* index of the bus field */
    const unsigned long domain = fields == 3 ? f[0] : 0;
    if ((fields == 3 && (digits[0] < 1 || digits[0] > 8)) || digits[b] != 2 ||
        digits[b + 1] != 2 || f[b + 1] > 0x1f)
        return false;
    const int k = snprintf(out, out_bytes, "%04lx:%02lx:%02lx.%lx", domain, f[b], f[b + 1], fn);
    return k > 0 && (size_t)k < out_bytes;
}

/* The path of ROOT/link resolved, from its host bridge down, when it lies
 * below root_real/devices/pci*: malloc'd, or NULL (no such link, not PCI). */
static char *hw_verbs_pci_path(const char *root, const char *root_real, const char *link)
{
    char path[PATH_MAX];
    int k = snprintf(path, sizeof path, "%s/%s", root, link);
    if (k < 0 || (size_t)k >= sizeof path)
        return NULL;
    char *real = realpath(path, NULL);
    if (real == NULL)
        return NULL;
    const size_t n = strlen(root_real);
    char *out = NULL;
    if (strncmp(real, root_real, n) == 0 && strncmp(real + n, "/devices/pci", 12) == 0)
        out = strdup(real + n + strlen("/devices/"));
    free(real);
    return out;
}

/* numa_node of ROOT/devices/<pci path>; -1 when unknown. */
static int hw_verbs_numa_node(const char *root_real, const char *pci_path)
{
    char path[PATH_MAX];
    int k = snprintf(path, sizeof path, "%s/devices/%s/numa_node", root_real, pci_path);
    if (k < 0 || (size_t)k >= sizeof path)
        return -1;
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return -1;
    int node = -1;
    if (fscanf(fp, "%d", &node) != 1 || node < 0)
        node = -1;
    fclose(fp);
    return node;
}

void hw_verbs_topo_free(hw_verbs_topo_t *t)
{
    if (t == NULL)
        return;
    for (int i = 0; t->paths != NULL && i < t->npaths; i++)
        free(t->paths[i]);
    free(t->paths);
    t->paths = NULL;
    t->npaths = 0;
}

int hw_verbs_topo_read(const char *sysfs_root, const char *bus_id, hw_verbs_dev_info_t *devs,
                       int ndevs, hw_verbs_topo_t *t, char *why, size_t why_bytes)
{
    memset(t, 0, sizeof *t);
    const char *root = sysfs_root != NULL && sysfs_root[0] != '\0' ? sysfs_root : "/sys";
    if (!hw_verbs_bus_id_parse(bus_id, t->bus_id, sizeof t->bus_id)) {
        snprintf(why, why_bytes, "near_pci '%s' is not a PCI bus id: give DOMAIN:BUS:DEVICE."
                 "FUNCTION as cudaDeviceGetPCIBusId reports it, e.g. 0000:3b:00.0",
                 bus_id != NULL ? bus_id : "(null)");
        return KVS_EINVAL;
    }
    char *root_real = realpath(root, NULL);
    if (root_real == NULL) {
        snprintf(why, why_bytes, "sysfs root %s cannot be read (%s): mount sysfs there, or "
                 "set device instead of near_pci", root, strerror(errno));
        return KVS_EBACKEND;
    }
    t->paths = calloc((size_t)ndevs + 1, sizeof *t->paths);
    if (t->paths == NULL) {
        free(root_real);
        snprintf(why, why_bytes, "no memory for the PCI paths of %d RDMA devices", ndevs);
        return KVS_ENOMEM;
    }
    t->npaths = ndevs + 1;
    char link[96];
    snprintf(link, sizeof link, "bus/pci/devices/%s", t->bus_id);
    t->paths[ndevs] = hw_verbs_pci_path(root, root_real, link);
    if (t->paths[ndevs] == NULL) {
        snprintf(why, why_bytes, "near_pci %s is not a PCI device here (no %s/%s): give "
                 "the bus id of this rank's GPU as cudaDeviceGetPCIBusId reports it, or set "
                 "device", t->bus_id, root, link);
        free(root_real);
        hw_verbs_topo_free(t);
        return KVS_EINVAL;
    }
    t->near = (hw_verbs_near_t){
        .bus_id = t->bus_id,
        .pci = {.path = t->paths[ndevs],
                .numa_node = hw_verbs_numa_node(root_real, t->paths[ndevs])}};
    for (int d = 0; d < ndevs; d++) {
        snprintf(link, sizeof link, "class/infiniband/%s/device", devs[d].name);
        t->paths[d] = hw_verbs_pci_path(root, root_real, link);
        devs[d].pci = (hw_verbs_pci_t){
            .path = t->paths[d],
            .numa_node = t->paths[d] != NULL ? hw_verbs_numa_node(root_real, t->paths[d]) : -1};
    }
    free(root_real);
    return KVS_OK;
}
