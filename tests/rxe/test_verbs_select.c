/*
 * test_verbs_select.c - the verbs fabric's device, port and GID choice and
 * its configuration checks, on snapshots made up here (the choice by PCI
 * topology is test_verbs_topology.c): runs on any machine, with or without
 * RDMA hardware. Each refusal must say what to change and fit the error
 * buffer whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hw_verbs.h"

#define V4(a, b, c, d) {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d}
#define LL {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0xb0, 0x84, 0xb2, 0xff, 0xfe, 0x34, 0x11, 0x17}
#define V6 {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01}

static void assert_fits(const char *why)
{
    assert_true(strlen(why) > 0);
    assert_true(strlen(why) < KVS_ERROR_MSG_BYTES - 1); /* not cut */
}

static void assert_says(const char *why, const char *what)
{
    if (strstr(why, what) == NULL)
        fail_msg("message '%s' does not say '%s'", why, what);
    assert_fits(why);
}

static const hw_verbs_gid_t roce_gids[] = {
    {.raw = LL, .index = 0, .type = IBV_GID_TYPE_ROCE_V2},
    {.raw = V4(192, 0, 2, 1), .index = 1, .type = IBV_GID_TYPE_ROCE_V1},
    {.raw = V6, .index = 2, .type = IBV_GID_TYPE_ROCE_V2},
    {.raw = V4(192, 0, 2, 1), .index = 3, .type = IBV_GID_TYPE_ROCE_V2},
};
static const hw_verbs_port_info_t roce_port = {
    .state = IBV_PORT_ACTIVE, .link_layer = IBV_LINK_LAYER_ETHERNET,
    .active_mtu = IBV_MTU_4096, .gid_tbl_len = 16, .gids = roce_gids, .ngids = 4};
static const hw_verbs_port_info_t down_port = {
    .state = IBV_PORT_DOWN, .link_layer = IBV_LINK_LAYER_ETHERNET,
    .active_mtu = IBV_MTU_1024, .gid_tbl_len = 16, .gids = roce_gids, .ngids = 4};

static void test_verbs_select_no_device_says_how_to_get_one(void **state)
{
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(NULL, 0, NULL, NULL, 0, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_EBACKEND);
    assert_says(why, "no RDMA device found");
    assert_says(why, "rdma link add rxe0 type rxe netdev");
}

static void test_verbs_select_auto_prefers_roce_v2_ipv4(void **state)
{
    const hw_verbs_dev_info_t dev = {.name = "rxe0", .ports = &roce_port, .nports = 1};
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 0, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_OK);
    assert_int_equal(c.dev, 0);
    assert_int_equal(c.port, 1);
    assert_int_equal(c.gid_index, 3); /* not link-local 0, not v1 1, IPv4 before IPv6 2 */
    assert_string_equal(c.addr, "192.0.2.1");
    assert_string_equal(c.gid, "::ffff:192.0.2.1");
}

static void test_verbs_select_auto_takes_ipv6_when_no_ipv4(void **state)
{
    const hw_verbs_port_info_t p = {.state = IBV_PORT_ACTIVE,
                                    .link_layer = IBV_LINK_LAYER_ETHERNET,
                                    .gid_tbl_len = 16, .gids = roce_gids, .ngids = 3};
    const hw_verbs_dev_info_t dev = {.name = "mlx5_0", .ports = &p, .nports = 1};
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 0, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_OK);
    assert_int_equal(c.gid_index, 2);
    assert_string_equal(c.addr, "2001:db8::1");
}

static void test_verbs_select_skips_zero_and_link_local(void **state)
{
    const hw_verbs_gid_t gids[] = {
        {.raw = LL, .index = 0, .type = IBV_GID_TYPE_ROCE_V2},
        {.raw = {0}, .index = 1, .type = IBV_GID_TYPE_ROCE_V2},
    };
    const hw_verbs_port_info_t p = {.state = IBV_PORT_ACTIVE,
                                    .link_layer = IBV_LINK_LAYER_ETHERNET,
                                    .gid_tbl_len = 4, .gids = gids, .ngids = 2};
    const hw_verbs_dev_info_t dev = {.name = "rxe0", .ports = &p, .nports = 1};
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 0, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_EBACKEND);
    assert_says(why, "no usable GID");
    assert_says(why, "IP address");
    /* named explicitly, the link-local one is used as given */
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 0, 0, &c, why, sizeof why), KVS_OK);
    assert_int_equal(c.gid_index, 0);
}

static void test_verbs_select_skips_devices_with_ports_down(void **state)
{
    const hw_verbs_dev_info_t devs[] = {
        {.name = "mlx5_0", .ports = &down_port, .nports = 1},
        {.name = "rxe0", .ports = &roce_port, .nports = 1},
    };
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(devs, 2, NULL, NULL, 0, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_OK);
    assert_int_equal(c.dev, 1);
    assert_string_equal(c.reason, "first usable device");
    /* all down: the message names the state and what to do */
    assert_int_equal(hw_verbs_select(devs, 1, NULL, NULL, 0, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_EBACKEND);
    assert_says(why, "port 1 DOWN");
    assert_says(why, "link up");
}

static void test_verbs_select_port_down_or_missing_says_what_to_change(void **state)
{
    const hw_verbs_port_info_t ports[] = {roce_port, down_port};
    const hw_verbs_dev_info_t dev = {.name = "mlx5_1", .ports = ports, .nports = 2};
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 2, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_EBACKEND);
    assert_says(why, "port 2 of RDMA device mlx5_1 is DOWN");
    assert_says(why, "ip link set");
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 3, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_EINVAL);
    assert_says(why, "port 3 of RDMA device mlx5_1 does not exist (it has 2 ports)");
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, -1, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_EINVAL);
    assert_says(why, "not a port number");
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 1, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_OK);
    assert_int_equal(c.port, 1);
}

static void test_verbs_select_bad_gid_index_lists_the_valid_ones(void **state)
{
    const hw_verbs_dev_info_t dev = {.name = "rxe0", .ports = &roce_port, .nports = 1};
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 0, 7, &c, why, sizeof why), KVS_EINVAL);
    assert_says(why, "GID index 7 of rxe0 port 1 is empty");
    assert_says(why, "usable: 1=::ffff:192.0.2.1 (RoCE v1), 2=2001:db8::1 (RoCE v2), "
                     "3=::ffff:192.0.2.1 (RoCE v2)");
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 0, 99, &c, why, sizeof why), KVS_EINVAL);
    assert_says(why, "outside the GID table of rxe0 port 1 (16 entries)");
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 0, 1, &c, why, sizeof why), KVS_OK);
    assert_int_equal(c.gid_index, 1); /* RoCE v1, as asked */
}

static void test_verbs_select_unknown_device_lists_the_devices(void **state)
{
    const hw_verbs_dev_info_t devs[] = {
        {.name = "mlx5_0", .ports = &roce_port, .nports = 1},
        {.name = "rxe0", .ports = &roce_port, .nports = 1},
    };
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(devs, 2, "mlx5_9", NULL, 0, KVS_VERBS_GID_AUTO, &c, why,
                                     sizeof why),
                     KVS_EINVAL);
    assert_says(why, "'mlx5_9' not found; devices here: mlx5_0, rxe0");
    assert_int_equal(hw_verbs_select(devs, 2, "rxe0", NULL, 0, KVS_VERBS_GID_AUTO, &c, why,
                                     sizeof why),
                     KVS_OK);
    assert_int_equal(c.dev, 1);
    assert_string_equal(c.reason, "named by the caller");
}

static void test_verbs_select_infiniband_uses_gid_0_without_address(void **state)
{
    const hw_verbs_gid_t gids[] = {
        {.raw = LL, .index = 0, .type = IBV_GID_TYPE_IB},
    };
    const hw_verbs_port_info_t p = {.state = IBV_PORT_ACTIVE,
                                    .link_layer = IBV_LINK_LAYER_INFINIBAND,
                                    .gid_tbl_len = 128, .gids = gids, .ngids = 1};
    const hw_verbs_dev_info_t dev = {.name = "mlx5_2", .ports = &p, .nports = 1};
    hw_verbs_choice_t c;
    char why[KVS_ERROR_MSG_BYTES];
    assert_int_equal(hw_verbs_select(&dev, 1, NULL, NULL, 0, KVS_VERBS_GID_AUTO,
                                     &c, why, sizeof why),
                     KVS_OK);
    assert_int_equal(c.gid_index, 0);
    assert_string_equal(c.addr, ""); /* the fabric then asks for bind_addr */
}

static void test_verbs_select_mtu_helpers_round_down(void **state)
{
    assert_int_equal(hw_verbs_mtu_enum(9000), IBV_MTU_4096);
    assert_int_equal(hw_verbs_mtu_enum(1500), IBV_MTU_1024);
    assert_int_equal(hw_verbs_mtu_enum(255), 0);
    assert_int_equal(hw_verbs_mtu_bytes(IBV_MTU_2048), 2048);
    assert_int_equal(hw_verbs_mtu_bytes(0), 0);
}

/* The real create path: on a machine without RDMA it must say so; with
 * devices, a name that does not exist must list them. Either way nothing
 * is left to free. */
static void test_verbs_select_create_names_what_to_change(void **state)
{
    kvs_verbs_config_t cfg;
    kvs_verbs_config_init(&cfg);
    cfg.device = "kvs-no-such-device";
    kvs_fabric_t *fab = NULL;
    kvs_error_t err;
    int rc = kvs_verbs_fabric_create(&cfg, &fab, &err);
    assert_null(fab);
    assert_int_equal(err.status, rc);
    if (rc == KVS_EBACKEND) {
        assert_says(err.msg, "no RDMA device found");
    } else {
        assert_int_equal(rc, KVS_EINVAL);
        assert_says(err.msg, "'kvs-no-such-device' not found; devices here:");
    }
    kvs_verbs_config_init(&cfg);
    cfg.max_mtu_bytes = 100;
    assert_int_equal(kvs_verbs_fabric_create(&cfg, &fab, &err), KVS_EINVAL);
    assert_says(err.msg, "max_mtu_bytes 100 is outside 256..4096");
    kvs_verbs_config_init(&cfg);
    cfg.gid_index = -7;
    assert_int_equal(kvs_verbs_fabric_create(&cfg, &fab, &err), KVS_EINVAL);
    assert_says(err.msg, "gid_index -7");
    kvs_verbs_config_init(&cfg);
    cfg.near_pci = "GPU-0"; /* refused before any device is looked at */
    assert_int_equal(kvs_verbs_fabric_create(&cfg, &fab, &err), KVS_EINVAL);
    assert_says(err.msg, "near_pci 'GPU-0' is not a PCI bus id");
    assert_says(err.msg, "cudaDeviceGetPCIBusId");
    kvs_verbs_config_init(&cfg);
    cfg.send_buf_bytes = 100;
    assert_int_equal(kvs_verbs_fabric_create(&cfg, &fab, &err), KVS_EINVAL);
    assert_says(err.msg, "send_buf_bytes 100");
    assert_int_equal(kvs_verbs_fabric_create(NULL, &fab, &err), KVS_EINVAL);
    assert_int_equal(kvs_verbs_fabric_destroy(NULL), KVS_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verbs_select_no_device_says_how_to_get_one),
        cmocka_unit_test(test_verbs_select_auto_prefers_roce_v2_ipv4),
        cmocka_unit_test(test_verbs_select_auto_takes_ipv6_when_no_ipv4),
        cmocka_unit_test(test_verbs_select_skips_zero_and_link_local),
        cmocka_unit_test(test_verbs_select_skips_devices_with_ports_down),
        cmocka_unit_test(test_verbs_select_port_down_or_missing_says_what_to_change),
        cmocka_unit_test(test_verbs_select_bad_gid_index_lists_the_valid_ones),
        cmocka_unit_test(test_verbs_select_unknown_device_lists_the_devices),
        cmocka_unit_test(test_verbs_select_infiniband_uses_gid_0_without_address),
        cmocka_unit_test(test_verbs_select_mtu_helpers_round_down),
        cmocka_unit_test(test_verbs_select_create_names_what_to_change),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
