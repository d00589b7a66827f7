// The read-back parsers (mlnx_qos, dcb, ethtool) and the PCIe distance classes.
#include <gtest/gtest.h>

#include "fabric/internal.hpp"
#include "sysfs_tree.hpp"

namespace tensorlane::sidecar {
namespace {

using testing::SysfsTree;

// What MLNX_OFED's mlnx_qos -i prints (trimmed to the parts parsed).
constexpr const char *kMlnxQos = R"(DCBX mode: OS controlled
Priority trust state: dscp
dscp2prio mapping:
        prio:0 dscp:07,06,05,04,03,02,01,00,
        prio:1 dscp:15,14,13,12,11,10,09,08,
        prio:2 dscp:23,22,21,20,19,18,17,16,
        prio:3 dscp:31,30,29,28,27,26,25,24,
        prio:4 dscp:39,38,37,36,35,34,33,32,
        prio:5 dscp:47,46,45,44,43,42,41,40,
        prio:6 dscp:55,54,53,52,51,50,49,48,
        prio:7 dscp:63,62,61,60,59,58,57,56,
default priority:
Receive buffer size (bytes): 130944,130944,0,0,0,0,0,0,
Cable len: 7
PFC configuration:
        priority    0   1   2   3   4   5   6   7
        enabled     0   0   0   1   0   0   0   0
        buffer      0   0   0   1   0   0   0   0
tc: 1 ratelimit: unlimited, tsa: vendor
         priority:  0
)";

TEST(QosParse, MlnxQos) {
    const QosSettings q = parseMlnxQos(kMlnxQos);
    ASSERT_TRUE(q.trust);
    EXPECT_EQ(*q.trust, "dscp");
    ASSERT_TRUE(q.dscp_to_prio);
    EXPECT_EQ((*q.dscp_to_prio)[26], 3);
    EXPECT_EQ((*q.dscp_to_prio)[0], 0);
    EXPECT_EQ((*q.dscp_to_prio)[63], 7);
    ASSERT_TRUE(q.pfc);
    EXPECT_TRUE((*q.pfc)[3]);
    EXPECT_FALSE((*q.pfc)[0]);
    EXPECT_FALSE((*q.pfc)[4]);
    // Nothing recognisable: nothing set.
    const QosSettings none = parseMlnxQos("mlnx_qos: command failed\n");
    EXPECT_FALSE(none.trust);
    EXPECT_FALSE(none.dscp_to_prio);
    EXPECT_FALSE(none.pfc);
}

TEST(QosParse, Dcb) {
    const QosSettings q = parseDcb("prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off\n",
                                   "dscp-prio 0:0 26:3 48:6\n");
    ASSERT_TRUE(q.pfc);
    EXPECT_TRUE((*q.pfc)[3]);
    EXPECT_FALSE((*q.pfc)[7]);
    ASSERT_TRUE(q.dscp_to_prio);
    EXPECT_EQ((*q.dscp_to_prio)[26], 3);
    EXPECT_EQ((*q.dscp_to_prio)[25], -1);  // no entry
    EXPECT_FALSE(q.trust);
    // Two entries for one DSCP (dcb app add twice) are a conflict.
    const QosSettings c = parseDcb("", "dscp-prio 26:3 26:0\n");
    EXPECT_EQ((*c.dscp_to_prio)[26], -2);
    // A partial PFC line is not a PFC map.
    EXPECT_FALSE(parseDcb("prio-pfc 3:on\n", "").pfc);
}

TEST(QosParse, EthtoolPauseCounters) {
    const auto c = parsePauseCounters(
        "NIC statistics:\n     rx_packets: 10\n     rx_pause_ctrl_phy: 4\n"
        "     tx_prio3_pause: 17\n     rx_prio3_pause_duration: 900\n     garbage\n");
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c[0].first, "rx_pause_ctrl_phy");
    EXPECT_EQ(c[1].second, 17u);
}

TEST(PciDistance, ClassesAsNvidiaSmiTopo) {
    SysfsTree t;
    const std::string sw = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    const std::string nic = sw + "/0000:02:08.0/0000:03:00.0";
    const std::string gpu_pix = sw + "/0000:02:10.0/0000:04:00.0";
    const std::string gpu_pxb = sw + "/0000:02:18.0/0000:05:00.0/0000:06:00.0/0000:07:00.0";
    const std::string gpu_phb = "devices/pci0000:00/0000:00:02.0/0000:08:00.0";
    const std::string gpu_node = "devices/pci0000:40/0000:40:01.0/0000:41:00.0";
    const std::string gpu_sys = "devices/pci0000:80/0000:80:01.0/0000:81:00.0";
    t.addPci(nic, "0x15b3", "0x020000", 0);
    t.addPci(gpu_pix, "0x10de", "0x030200", 0);
    t.addPci(gpu_pxb, "0x10de", "0x030200", 0);
    t.addPci(gpu_phb, "0x10de", "0x030200", 0);
    t.addPci(gpu_node, "0x10de", "0x030200", 0);
    t.addPci(gpu_sys, "0x10de", "0x030200", 1);
    t.addPci("devices/pci0000:00/0000:00:03.0/0000:09:00.0", "0x8086", "0x030000", 0);
    const SysfsRoot root(t.rootString());
    EXPECT_EQ(pciDistance(root, gpu_pix, nic), PciDistance::kPix);
    EXPECT_EQ(pciDistance(root, gpu_pxb, nic), PciDistance::kPxb);
    EXPECT_EQ(pciDistance(root, gpu_phb, nic), PciDistance::kPhb);
    EXPECT_EQ(pciDistance(root, gpu_node, nic), PciDistance::kNode);
    EXPECT_EQ(pciDistance(root, gpu_sys, nic), PciDistance::kSys);
    EXPECT_EQ(pciDistance(root, "nonsense", nic), PciDistance::kUnknown);
    // Five NVIDIA GPUs; the Intel display controller is not one.
    const auto gpus = listNvidiaGpus(root);
    ASSERT_EQ(gpus.size(), 5u);
    EXPECT_EQ(gpus[0].pci_path.rfind("devices/", 0), 0u);
}

TEST(RunCommand, ReportsMissingProgramsAndCapturesOutput) {
    const CommandOutput missing = runCommand({"tensorlane-no-such-program-xyz"});
    EXPECT_FALSE(missing.found);
    EXPECT_FALSE(missing.ok());
    const CommandOutput echo = runCommand({"sh", "-c", "echo hello; echo err >&2"});
    EXPECT_TRUE(echo.ok());
    EXPECT_EQ(echo.out, "hello\n");
    const CommandOutput failing = runCommand({"sh", "-c", "exit 3"});
    EXPECT_TRUE(failing.found);
    EXPECT_EQ(failing.exit_code, 3);
    const CommandOutput slow = runCommand({"sleep", "5"}, 100);
    EXPECT_EQ(slow.exit_code, -1);
}

}  // namespace
}  // namespace tensorlane::sidecar
