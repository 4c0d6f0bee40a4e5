/*
 * test_verbs_topology.c - the verbs fabric's choice of the RDMA device
 * closest to a GPU, on fake sysfs trees built here in a temp folder:
 * topology.c reads them (bus ids, the links under class/infiniband and
 * bus/pci/devices, numa_node), select.c chooses over the snapshot. Runs on
 * any machine, with or without RDMA hardware or GPUs. Each choice is
 * checked with its reason, each refusal for what it says to change and for
 * fitting the error buffer whole.
 *
 * The main tree (the snapshot lists the devices in another order than
 * their names, as rdma_get_devices may):
 *   root complex pci0000:17, NUMA 0
 *     0000:17:00.0 - switch 0000:18:00.0 - 0000:19:00.0 - GPU 0000:1a:00.0
 *                                        - 0000:19:04.0 - mlx5_2 0000:1b:00.0
 *                                        - 0000:19:08.0 - mlx5_1 0000:1c:00.0
 *   root complex pci0000:85, NUMA 1
 *     0000:85:00.0 - switch 0000:86:00.0 - 0000:87:00.0 - GPU 0000:88:00.0
 *                                        - 0000:87:04.0 - mlx5_10 0000:89:00.0
 *     0000:85:02.0 - GPU 0000:8a:00.0 (no switch)
 *   root complex pci0000:5d, NUMA 0: 0000:5d:00.0 - GPU 0000:5e:00.0
 *   root complex pci0000:ae, NUMA 1: 0000:ae:02.0 - mlx5_0 0000:b0:00.0
 *   root complex pci0000:d7, NUMA unknown: 0000:d7:00.0 - GPU 0000:d8:00.0
 *   rxe0 (soft-RoCE: no PCI device), siw0 (its device link is virtual)
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "hw_verbs.h"

#define GPU_SWITCH_1 "0000:1a:00.0"
#define GPU_SWITCH_2 "0000:88:00.0"
#define GPU_ROOT_2 "0000:8a:00.0"
#define GPU_NUMA_0 "0000:5e:00.0"
#define GPU_NOWHERE "0000:d8:00.0"

typedef struct fake_pci {
    const char *path; /* below devices/, from the host bridge down */
    int numa_node;    /* written into every folder of the path */
} fake_pci_t;

typedef struct fake_rdma {
    const char *name;
    const char *pci;    /* its PCI function below devices/, NULL: virtual */
    const char *device; /* virtual only: where its device link leads, below
                           devices/ (NULL: no link, as rxe) */
} fake_rdma_t;

static const fake_pci_t main_pci[] = {
    {"pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0", 0},
    {"pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1b:00.0", 0},
    {"pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:08.0/0000:1c:00.0", 0},
    {"pci0000:85/0000:85:00.0/0000:86:00.0/0000:87:00.0/0000:88:00.0", 1},
    {"pci0000:85/0000:85:00.0/0000:86:00.0/0000:87:04.0/0000:89:00.0", 1},
    {"pci0000:85/0000:85:02.0/0000:8a:00.0", 1},
    {"pci0000:5d/0000:5d:00.0/0000:5e:00.0", 0},
    {"pci0000:ae/0000:ae:02.0/0000:b0:00.0", 1},
    {"pci0000:d7/0000:d7:00.0/0000:d8:00.0", -1},
};

static const fake_rdma_t main_rdma[] = {
    {"rxe0", NULL, NULL},
    {"mlx5_2", "pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1b:00.0", NULL},
    {"mlx5_10", "pci0000:85/0000:85:00.0/0000:86:00.0/0000:87:04.0/0000:89:00.0", NULL},
    {"siw0", NULL, "virtual/net/dummy0"},
    {"mlx5_1", "pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:08.0/0000:1c:00.0", NULL},
    {"mlx5_0", "pci0000:ae/0000:ae:02.0/0000:b0:00.0", NULL},
};
#define MAIN_NDEVS ((int)(sizeof main_rdma / sizeof main_rdma[0]))

static const hw_verbs_gid_t gids[] = {
    {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1}, .index = 1,
     .type = IBV_GID_TYPE_ROCE_V2},
};
static const hw_verbs_port_info_t up_port = {
    .state = IBV_PORT_ACTIVE, .link_layer = IBV_LINK_LAYER_ETHERNET,
    .active_mtu = IBV_MTU_4096, .gid_tbl_len = 4, .gids = gids, .ngids = 1};
static const hw_verbs_port_info_t down_port = {
    .state = IBV_PORT_DOWN, .link_layer = IBV_LINK_LAYER_ETHERNET,
    .active_mtu = IBV_MTU_4096, .gid_tbl_len = 4, .gids = gids, .ngids = 1};

/* ---- fake sysfs trees ------------------------------------------------------ */

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    if (fp == NULL)
        fail_msg("cannot write %s: %s", path, strerror(errno));
    fputs(text, fp);
    fclose(fp);
}

/* mkdir -p root/rel */
static void make_dirs(const char *root, const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            fail_msg("mkdir %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", path, strerror(errno));
}

static void make_link(const char *target, const char *root, const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    if (symlink(target, path) != 0 && errno != EEXIST)
        fail_msg("symlink %s -> %s: %s", path, target, strerror(errno));
}

/* A PCI device as sysfs shows it: its folder and every bridge's above it,
 * each with numa_node and a link in bus/pci/devices. */
static void add_pci(const char *root, const fake_pci_t *d)
{
    char rel[1024], target[1200], node[16];
    snprintf(node, sizeof node, "%d\n", d->numa_node);
    const char *p = d->path;
    while ((p = strchr(p, '/')) != NULL) {
        const char *end = strchr(p + 1, '/');
        const size_t n = end != NULL ? (size_t)(end - d->path) : strlen(d->path);
        snprintf(rel, sizeof rel, "devices/%.*s", (int)n, d->path);
        make_dirs(root, rel);
        snprintf(target, sizeof target, "%s/numa_node", rel);
        char file[4096];
        snprintf(file, sizeof file, "%s/%s", root, target);
        write_file(file, node);
        snprintf(target, sizeof target, "../../../%s", rel);
        const char *id = strrchr(rel, '/') + 1;
        char link[256];
        snprintf(link, sizeof link, "bus/pci/devices/%s", id);
        make_link(target, root, link);
        p++;
    }
}

/* An RDMA device: devices/<pci>/infiniband/<name> with a device link back
 * to its PCI function (as mlx5), or devices/virtual/infiniband/<name> with
 * no device link (as rxe) or one to a virtual device (as siw). */
static void add_rdma(const char *root, const fake_rdma_t *r)
{
    char dir[1024], rel[1100], target[1200];
    snprintf(dir, sizeof dir, "devices/%s/infiniband/%s", r->pci != NULL ? r->pci : "virtual",
             r->name);
    make_dirs(root, dir);
    snprintf(target, sizeof target, "../../%s", dir);
    snprintf(rel, sizeof rel, "class/infiniband/%s", r->name);
    make_link(target, root, rel);
    snprintf(rel, sizeof rel, "%s/device", dir);
    if (r->pci != NULL) {
        snprintf(target, sizeof target, "../../../%s", strrchr(r->pci, '/') + 1);
        make_link(target, root, rel);
    } else if (r->device != NULL) {
        snprintf(target, sizeof target, "devices/%s", r->device);
        make_dirs(root, target);
        snprintf(target, sizeof target, "../../%s", r->device + strlen("virtual/"));
        make_link(target, root, rel);
    }
}

static char *tree_build(const fake_pci_t *pci, int npci, const fake_rdma_t *rdma, int nrdma)
{
    char *root = strdup("/tmp/kvs-topology-XXXXXX");
    assert_non_null(root);
    if (mkdtemp(root) == NULL)
        fail_msg("mkdtemp: %s", strerror(errno));
    make_dirs(root, "bus/pci/devices");
    make_dirs(root, "class/infiniband");
    make_dirs(root, "devices/virtual");
    for (int i = 0; i < npci; i++)
        add_pci(root, &pci[i]);
    for (int i = 0; i < nrdma; i++)
        add_rdma(root, &rdma[i]);
    return root;
}

/* rm -rf path (links are removed, never followed). */
static void remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        struct dirent *e;
        while (dir != NULL && (e = readdir(dir)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char child[4096];
            snprintf(child, sizeof child, "%s/%s", path, e->d_name);
            remove_tree(child);
        }
        if (dir != NULL)
            closedir(dir);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int main_tree_setup(void **state)
{
    *state = tree_build(main_pci, (int)(sizeof main_pci / sizeof main_pci[0]), main_rdma,
                        MAIN_NDEVS);
    return 0;
}

static int main_tree_teardown(void **state)
{
    remove_tree(*state);
    free(*state);
    return 0;
}

/* ---- choosing over a tree ----------------------------------------------------- */

static void assert_says(const char *why, const char *what)
{
    if (strstr(why, what) == NULL)
        fail_msg("message '%s' does not say '%s'", why, what);
    assert_true(strlen(why) < KVS_ERROR_MSG_BYTES - 1); /* not cut */
}

/* Whether name is one of the comma-separated list (NULL: none). */
static bool in_list(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; p != NULL && *p != '\0';) {
        const size_t k = strcspn(p, ",");
        if (k == n && strncmp(p, name, n) == 0)
            return true;
        p += k + (p[k] == ',');
    }
    return false;
}

/* What the fabric does at create, over a snapshot of the main tree's
 * devices (in main_rdma's order; those in `down` have their port down):
 * read where they sit, then choose. Returns the status; *name the device. */
static int choose(const char *root, const fake_rdma_t *rdma, int ndevs, const char *bus_id,
                  const char *want_dev, const char *down, hw_verbs_choice_t *c,
                  const char **name, char *why, size_t why_bytes)
{
    hw_verbs_dev_info_t devs[16];
    assert_true(ndevs <= 16);
    for (int d = 0; d < ndevs; d++) {
        const bool is_down = in_list(down, rdma[d].name);
        devs[d] = (hw_verbs_dev_info_t){.name = rdma[d].name,
                                        .ports = is_down ? &down_port : &up_port,
                                        .nports = 1};
    }
    hw_verbs_topo_t topo;
    int rc = hw_verbs_topo_read(root, bus_id, devs, ndevs, &topo, why, why_bytes);
    if (rc == KVS_OK)
        rc = hw_verbs_select(devs, ndevs, want_dev, &topo.near, 0, KVS_VERBS_GID_AUTO, c, why,
                             why_bytes);
    *name = rc == KVS_OK ? devs[c->dev].name : NULL;
    hw_verbs_topo_free(&topo);
    return rc;
}

static void expect_choice(const char *root, const char *bus_id, const char *down,
                          const char *want, const char *reason)
{
    hw_verbs_choice_t c;
    const char *name;
    char why[KVS_ERROR_MSG_BYTES];
    const int rc = choose(root, main_rdma, MAIN_NDEVS, bus_id, NULL, down, &c, &name, why,
                          sizeof why);
    if (rc != KVS_OK)
        fail_msg("near %s: %s: %s", bus_id, kvs_status_name(rc), why);
    if (strcmp(name, want) != 0)
        fail_msg("near %s: chose %s (%s), want %s", bus_id, name, c.reason, want);
    assert_string_equal(c.reason, reason);
}

static void test_verbs_topology_same_switch_first_by_name(void **state)
{
    /* mlx5_2 and mlx5_1 share the GPU's switch: the first by name, though
     * the snapshot lists mlx5_2 first */
    expect_choice(*state, GPU_SWITCH_1, NULL, "mlx5_1",
                  "closest to PCI 0000:1a:00.0: same PCIe switch (below 0000:18:00.0)");
    expect_choice(*state, GPU_SWITCH_2, NULL, "mlx5_10",
                  "closest to PCI 0000:88:00.0: same PCIe switch (below 0000:86:00.0)");
}

static void test_verbs_topology_root_complex_beats_numa_node(void **state)
{
    /* mlx5_10 (same root complex) before mlx5_0 (same NUMA node, first by
     * name) */
    expect_choice(*state, GPU_ROOT_2, NULL, "mlx5_10",
                  "closest to PCI 0000:8a:00.0: same PCIe root complex (pci0000:85)");
}

static void test_verbs_topology_numa_node_beats_anything_else(void **state)
{
    /* no NIC on its root complex: mlx5_1 and mlx5_2 share its NUMA node 0,
     * mlx5_0 (first by name) and mlx5_10 do not */
    expect_choice(*state, GPU_NUMA_0, NULL, "mlx5_1",
                  "closest to PCI 0000:5e:00.0: same NUMA node (0)");
    /* NUMA node unknown: any PCI device, the first by name, never rxe */
    expect_choice(*state, GPU_NOWHERE, NULL, "mlx5_0",
                  "closest to PCI 0000:d8:00.0: none shares its root complex or NUMA node, "
                  "first by name");
}

static void test_verbs_topology_takes_bus_ids_as_cuda_and_nvidia_smi_write_them(void **state)
{
    /* cudaDeviceGetPCIBusId, nvidia-smi, lspci: one device */
    expect_choice(*state, "0000:1A:00.0", NULL, "mlx5_1",
                  "closest to PCI 0000:1a:00.0: same PCIe switch (below 0000:18:00.0)");
    expect_choice(*state, "00000000:1A:00.0", NULL, "mlx5_1",
                  "closest to PCI 0000:1a:00.0: same PCIe switch (below 0000:18:00.0)");
    expect_choice(*state, "1a:00.0", NULL, "mlx5_1",
                  "closest to PCI 0000:1a:00.0: same PCIe switch (below 0000:18:00.0)");
    char out[HW_VERBS_BUS_ID_BYTES];
    static const char *const bad[] = {"", "gpu0", "1a:00", "0000:1a:00.8", "0000:1a:20.0",
                                      "0000:1a:0.0", "0000:0000:1a:00.0", "0000:1a:00.0 ",
                                      "123456789:1a:00.0", ":1a:00.0", "0000:1a:00:0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (hw_verbs_bus_id_parse(bad[i], out, sizeof out))
            fail_msg("'%s' parsed as the bus id %s", bad[i], out);
    assert_true(hw_verbs_bus_id_parse("10000:e1:1f.7", out, sizeof out)); /* VMD domain */
    assert_string_equal(out, "10000:e1:1f.7");
}

static void test_verbs_topology_next_equally_close_when_the_first_is_down(void **state)
{
    expect_choice(*state, GPU_SWITCH_1, "mlx5_1", "mlx5_2",
                  "closest to PCI 0000:1a:00.0: same PCIe switch (below 0000:18:00.0)");
    /* both on its switch down: refused, never a farther mlx5_0 or mlx5_10 */
    hw_verbs_choice_t c;
    const char *name;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(choose(*state, main_rdma, MAIN_NDEVS, GPU_SWITCH_1, NULL, "mlx5_1,mlx5_2",
                            &c, &name, why, sizeof why),
                     KVS_EBACKEND);
    assert_says(why, "closest to PCI 0000:1a:00.0: RDMA device mlx5_1 has no ACTIVE port");
    assert_says(why, "port 1 DOWN");
    assert_says(why, "link up");
}

static void test_verbs_topology_soft_roce_usable_but_never_closest(void **state)
{
    hw_verbs_choice_t c;
    const char *name;
    char why[KVS_ERROR_MSG_BYTES];
    /* by name, near or not */
    assert_int_equal(choose(*state, main_rdma, MAIN_NDEVS, GPU_SWITCH_1, "rxe0", NULL, &c,
                            &name, why, sizeof why),
                     KVS_OK);
    assert_string_equal(name, "rxe0");
    assert_string_equal(c.reason, "named by the caller (near_pci 0000:1a:00.0 not consulted)");
    /* first usable without near: rxe0 comes first in the snapshot */
    hw_verbs_dev_info_t devs[MAIN_NDEVS];
    for (int d = 0; d < MAIN_NDEVS; d++)
        devs[d] = (hw_verbs_dev_info_t){.name = main_rdma[d].name, .ports = &up_port,
                                        .nports = 1};
    assert_int_equal(hw_verbs_select(devs, MAIN_NDEVS, NULL, NULL, 0, KVS_VERBS_GID_AUTO, &c,
                                     why, sizeof why),
                     KVS_OK);
    assert_int_equal(c.dev, 0);
    assert_string_equal(c.reason, "first usable device");
    /* a host of soft devices only: none is closest, and the refusal says
     * what to do */
    assert_int_equal(choose(*state, (const fake_rdma_t[]){main_rdma[0], main_rdma[3]}, 2,
                            GPU_SWITCH_1, NULL, NULL, &c, &name, why, sizeof why),
                     KVS_EBACKEND);
    assert_says(why, "no RDMA device here is on PCI (rxe0, siw0");
    assert_says(why, "set device to one of them, or leave near_pci unset");
}

static void test_verbs_topology_unknown_bus_id_says_what_to_give(void **state)
{
    hw_verbs_choice_t c;
    const char *name;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(choose(*state, main_rdma, MAIN_NDEVS, "0000:3b:00.0", NULL, NULL, &c,
                            &name, why, sizeof why),
                     KVS_EINVAL);
    assert_says(why, "near_pci 0000:3b:00.0 is not a PCI device here");
    assert_says(why, "/bus/pci/devices/0000:3b:00.0");
    assert_says(why, "cudaDeviceGetPCIBusId");
    assert_int_equal(choose(*state, main_rdma, MAIN_NDEVS, "GPU-5f1b", NULL, NULL, &c, &name,
                            why, sizeof why),
                     KVS_EINVAL);
    assert_says(why, "near_pci 'GPU-5f1b' is not a PCI bus id");
    assert_says(why, "e.g. 0000:3b:00.0");
    assert_int_equal(choose("/nonexistent/kvs-sysfs", main_rdma, MAIN_NDEVS, GPU_SWITCH_1, NULL,
                            NULL, &c, &name, why, sizeof why),
                     KVS_EBACKEND);
    assert_says(why, "sysfs root /nonexistent/kvs-sysfs cannot be read");
    assert_says(why, "set device");
}

static void test_verbs_topology_no_device_at_all(void **state)
{
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    const hw_verbs_near_t near = {.bus_id = GPU_SWITCH_1,
                                  .pci = {.path = main_pci[0].path, .numa_node = 0}};
    assert_int_equal(hw_verbs_select(NULL, 0, NULL, &near, 0, KVS_VERBS_GID_AUTO, &c, why,
                                     sizeof why),
                     KVS_EBACKEND);
    assert_says(why, "no RDMA device found");
}

/* A switch below a switch: the deeper shared bridge wins over the outer
 * switch, and a NIC's own bus id is "that PCI device". */
static void test_verbs_topology_longest_shared_chain_wins(void **state)
{
    static const fake_pci_t pci[] = {
        {"pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0}, /* mlx5_4 */
        {"pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0/0000:05:00.0/"
         "0000:06:00.0", 0}, /* mlx5_5, inner switch */
        {"pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0/0000:05:04.0/"
         "0000:07:00.0", 0}, /* the GPU, inner switch */
    };
    static const fake_rdma_t rdma[] = {
        {"mlx5_4", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", NULL},
        {"mlx5_5", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0/"
                   "0000:05:00.0/0000:06:00.0", NULL},
    };
    char *root = tree_build(pci, 3, rdma, 2);
    hw_verbs_choice_t c;
    const char *name;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(choose(root, rdma, 2, "0000:07:00.0", NULL, NULL, &c, &name, why,
                            sizeof why),
                     KVS_OK);
    assert_string_equal(name, "mlx5_5");
    assert_string_equal(c.reason, "closest to PCI 0000:07:00.0: same PCIe switch (below "
                                  "0000:04:00.0)");
    assert_int_equal(choose(root, rdma, 2, "0000:03:00.0", NULL, NULL, &c, &name, why,
                            sizeof why),
                     KVS_OK);
    assert_string_equal(name, "mlx5_4");
    assert_string_equal(c.reason, "closest to PCI 0000:03:00.0: it is that PCI device");
    remove_tree(root);
    free(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verbs_topology_same_switch_first_by_name),
        cmocka_unit_test(test_verbs_topology_root_complex_beats_numa_node),
        cmocka_unit_test(test_verbs_topology_numa_node_beats_anything_else),
        cmocka_unit_test(test_verbs_topology_takes_bus_ids_as_cuda_and_nvidia_smi_write_them),
        cmocka_unit_test(test_verbs_topology_next_equally_close_when_the_first_is_down),
        cmocka_unit_test(test_verbs_topology_soft_roce_usable_but_never_closest),
        cmocka_unit_test(test_verbs_topology_unknown_bus_id_says_what_to_give),
        cmocka_unit_test(test_verbs_topology_no_device_at_all),
        cmocka_unit_test(test_verbs_topology_longest_shared_chain_wins),
    };
    return cmocka_run_group_tests(tests, main_tree_setup, main_tree_teardown);
}
