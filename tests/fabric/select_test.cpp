// selectFabric against fixture trees: device and port, netdev, GID, MTU, traffic class.
#include <gtest/gtest.h>

#include <filesystem>

#include "sysfs_tree.hpp"
#include "tensorlane/sidecar/fabric.hpp"
#include "test_config.hpp"

namespace tensorlane::sidecar {
namespace {

using testing::fabricConfig;
using testing::SysfsTree;

constexpr const char *kV4b = "0000:0000:0000:0000:0000:ffff:0a00:0102";  // 10.0.1.2
constexpr const char *kNic2 = "devices/pci0000:80/0000:80:01.0/0000:81:00.0";

Status select(const config::Config &cfg, const SysfsTree &t, FabricSelection *s) {
    return selectFabric(cfg, SysfsRoot(t.rootString()), s);
}

/// A second device, mlx5_1 on eth1 (10.0.1.2), on another host bridge.
void addSecondNic(const SysfsTree &t, const std::string &state = "4: ACTIVE") {
    t.addDevice("mlx5_1", kNic2);
    t.addPort("mlx5_1", 1, state);
    t.addNetdev("eth1", kNic2);
    t.addGid("mlx5_1", 1, 0, "fe80:0000:0000:0000:0e42:a1ff:fe65:1a2c", "RoCE v2", "eth1");
    t.addGid("mlx5_1", 1, 1, kV4b, "RoCE v2", "eth1");
}

TEST(SelectFabric, StandardHostAutoEverything) {
    SysfsTree t;
    t.standardHost();
    FabricSelection s;
    const Status st = select(fabricConfig(""), t, &s);
    ASSERT_TRUE(st.isOk()) << st.message();
    EXPECT_EQ(s.device, "mlx5_0");
    EXPECT_EQ(s.port, 1u);
    EXPECT_EQ(s.netdev, "eth0");
    EXPECT_EQ(s.gid_index, 3u);
    EXPECT_EQ(s.gid_text, "0000:0000:0000:0000:0000:ffff:0a00:0002");
    EXPECT_EQ(s.gid.raw[12], 10);
    EXPECT_EQ(s.roce_version, RoceVersion::kV2);
    EXPECT_EQ(s.port_state, "ACTIVE");
    EXPECT_EQ(s.rate_mbps, 100000u);  // "100 Gb/sec (4X EDR)"
    EXPECT_EQ(s.netdev_mtu, 9000u);
    EXPECT_EQ(s.active_mtu, 4096u);
    EXPECT_EQ(s.path_mtu, 4096u);
    EXPECT_EQ(s.traffic_class, 106);
    EXPECT_EQ(s.tclass_source, TclassSource::kConfig);
    EXPECT_NE(s.device_reason.find("only RDMA device"), std::string::npos) << s.device_reason;
    EXPECT_NE(s.tclass_reason.find("no host-wide override"), std::string::npos);
    EXPECT_NE(s.summary().find("GID 3 10.0.0.2"), std::string::npos) << s.summary();
}

TEST(SelectFabric, TheNicsPciFunctionIsTheAbsolutePathOfItsDeviceLink) {
    SysfsTree t;
    t.standardHost();
    FabricSelection s;
    ASSERT_TRUE(select(fabricConfig(""), t, &s).isOk());
    EXPECT_EQ(s.pci_path, t.rootString() + "/" + SysfsTree::kNicPci);
    EXPECT_TRUE(isPciFunctionPath(SysfsTree::kNicPci));
    // What is not a PCI function (a simulated device's plain device/ directory, a path outside
    // devices/, a bridge name that is not an address) is no PCI path.
    EXPECT_FALSE(isPciFunctionPath("class/infiniband/sim0/device"));
    EXPECT_FALSE(isPciFunctionPath("devices/virtual/net/lo"));
    EXPECT_FALSE(isPciFunctionPath("devices/pci0000:00"));
    EXPECT_FALSE(isPciFunctionPath("devices/pci0000:00/0000:00:01.8"));
    EXPECT_FALSE(isPciFunctionPath("devices/pci0000:00/0000:0g:01.0"));
    EXPECT_FALSE(isPciFunctionPath(""));
}

TEST(SelectFabric, ASimulatedDeviceOnNoBusHasNoPciPath) {
    SysfsTree t;
    t.standardHost();
    // The device link replaced by a plain directory, as mksysfs.sh writes without --pci.
    std::filesystem::remove(t.rootString() + "/class/infiniband/mlx5_0/device");
    std::filesystem::create_directories(t.rootString() + "/class/infiniband/mlx5_0/device");
    FabricSelection s;
    ASSERT_TRUE(select(fabricConfig(""), t, &s).isOk());
    EXPECT_EQ(s.pci_path, "");
}

TEST(SelectFabric, PortRatesInMegabits) {
    EXPECT_EQ(rateMbps("100 Gb/sec (4X EDR)"), 100000u);
    EXPECT_EQ(rateMbps("400 Gb/sec (4X NDR)"), 400000u);
    EXPECT_EQ(rateMbps("2.5 Gb/sec (1X SDR)"), 2500u);
    EXPECT_EQ(rateMbps("25 Gb/sec (1X EDR)"), 25000u);
    // What is not that form is unknown, not a guess.
    EXPECT_EQ(rateMbps(""), 0u);
    EXPECT_EQ(rateMbps("fast"), 0u);
    EXPECT_EQ(rateMbps("100 Mb/sec"), 0u);
    EXPECT_EQ(rateMbps("-5 Gb/sec"), 0u);
    EXPECT_EQ(rateMbps("1e99 Gb/sec"), 0u);
}

TEST(SelectFabric, CallableAgainAfterTheKernelMovesTheGid) {
    SysfsTree t;
    t.standardHost();
    FabricSelection s;
    ASSERT_TRUE(select(fabricConfig(""), t, &s).isOk());
    EXPECT_EQ(s.gid_index, 3u);
    // A port flap repopulates the table: the IPv4 GID now sits at index 5.
    t.addEmptyGid("mlx5_0", 1, 3);
    t.addGid("mlx5_0", 1, 5, "0000:0000:0000:0000:0000:ffff:0a00:0002", "RoCE v2", "eth0");
    ASSERT_TRUE(select(fabricConfig(""), t, &s).isOk());
    EXPECT_EQ(s.gid_index, 5u);
}

TEST(SelectFabric, TwoActiveDevicesWithAutoAreAmbiguous) {
    SysfsTree t;
    t.standardHost();
    addSecondNic(t);
    FabricSelection s;
    const Status st = select(fabricConfig(""), t, &s);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("ambiguous"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("mlx5_0 port 1 (eth0) ACTIVE"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("mlx5_1 port 1 (eth1) ACTIVE"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("set [fabric] device or netdev"), std::string::npos);

    // The netdev decides it.
    ASSERT_TRUE(select(fabricConfig("netdev = \"eth1\""), t, &s).isOk());
    EXPECT_EQ(s.device, "mlx5_1");
    EXPECT_EQ(s.gid_index, 1u);
    // So does the device.
    ASSERT_TRUE(select(fabricConfig("device = \"mlx5_1\""), t, &s).isOk());
    EXPECT_EQ(s.netdev, "eth1");
}

TEST(SelectFabric, AutoTakesTheOnlyActiveDevice) {
    SysfsTree t;
    t.standardHost();
    addSecondNic(t, "1: DOWN");
    FabricSelection s;
    const Status st = select(fabricConfig(""), t, &s);
    ASSERT_TRUE(st.isOk()) << st.message();
    EXPECT_EQ(s.device, "mlx5_0");
    EXPECT_NE(s.device_reason.find("only ACTIVE port"), std::string::npos) << s.device_reason;
}

TEST(SelectFabric, DownPortIsRefusedWithItsState) {
    SysfsTree t;
    t.standardHost();
    t.addPort("mlx5_0", 1, "1: DOWN", "3: Disabled");
    FabricSelection s;
    const Status st = select(fabricConfig(""), t, &s);
    EXPECT_EQ(st.code(), Code::kPeer);
    EXPECT_NE(st.message().find("mlx5_0 port 1 is DOWN (physical state Disabled)"),
              std::string::npos)
        << st.message();
    // ACTIVE_DEFER contains ACTIVE but is not up.
    t.addPort("mlx5_0", 1, "5: ACTIVE_DEFER");
    EXPECT_FALSE(select(fabricConfig(""), t, &s).isOk());
}

TEST(SelectFabric, NamedDeviceAndPortMustExist) {
    SysfsTree t;
    t.standardHost();
    FabricSelection s;
    Status st = select(fabricConfig("device = \"mlx5_7\""), t, &s);
    EXPECT_EQ(st.code(), Code::kNotFound);
    EXPECT_NE(st.message().find("(found: mlx5_0)"), std::string::npos) << st.message();
    st = select(fabricConfig("device = \"mlx5_0\"\nport = 2"), t, &s);
    EXPECT_EQ(st.code(), Code::kNotFound);
    EXPECT_NE(st.message().find("has no such port (ports: 1)"), std::string::npos);
    const SysfsTree empty;
    st = select(fabricConfig(""), empty, &s);
    EXPECT_EQ(st.code(), Code::kNotFound);
    EXPECT_NE(st.message().find("no RDMA device"), std::string::npos);
}

TEST(SelectFabric, InfiniBandPortIsNotRoce) {
    SysfsTree t;
    t.standardHost();
    t.addPort("mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "InfiniBand");
    FabricSelection s;
    const Status st = select(fabricConfig(""), t, &s);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("not Ethernet"), std::string::npos);
}

TEST(SelectFabric, ConfiguredNetdevMustBelongToThePort) {
    SysfsTree t;
    t.standardHost();
    t.addNetdev("eth5", "");
    FabricSelection s;
    Status st = select(fabricConfig("netdev = \"eth5\"\ndevice = \"mlx5_0\""), t, &s);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("not a netdev of mlx5_0 port 1 (its netdevs: eth0)"),
              std::string::npos)
        << st.message();
    st = select(fabricConfig("netdev = \"eth9\"\ndevice = \"mlx5_0\""), t, &s);
    EXPECT_EQ(st.code(), Code::kNotFound);
    EXPECT_NE(st.message().find("no such interface"), std::string::npos) << st.message();
}

TEST(SelectFabric, VlanNetdevWithTheOnlyRoutableGid) {
    SysfsTree t;
    t.standardHost();
    // eth0 keeps only link-local GIDs; the address is on the VLAN interface.
    t.addEmptyGid("mlx5_0", 1, 2);
    t.addEmptyGid("mlx5_0", 1, 3);
    t.addNetdev("eth0.100", "");
    t.addGid("mlx5_0", 1, 4, "0000:0000:0000:0000:0000:ffff:0a64:0002", "RoCE v2", "eth0.100");
    FabricSelection s;
    // netdev auto: eth0 (the PCI function's) has only a link-local v2 GID, so the VLAN's
    // routable one wins: never link-local when a routable GID exists on the port.
    ASSERT_TRUE(select(fabricConfig(""), t, &s).isOk());
    EXPECT_EQ(s.netdev, "eth0.100");
    EXPECT_EQ(s.gid_index, 4u);
    // Naming eth0 gets its link-local GID, with the warning in the reason.
    ASSERT_TRUE(select(fabricConfig("netdev = \"eth0\""), t, &s).isOk());
    EXPECT_EQ(s.gid_index, 1u);
    EXPECT_NE(s.gid_reason.find("no routable"), std::string::npos);
    ASSERT_TRUE(select(fabricConfig("netdev = \"eth0.100\""), t, &s).isOk());
    EXPECT_EQ(s.gid_index, 4u);
    EXPECT_EQ(s.gid.address(), "10.100.0.2");
}

TEST(SelectFabric, NumericGidIndexChecked) {
    SysfsTree t;
    t.standardHost();
    FabricSelection s;
    ASSERT_TRUE(select(fabricConfig("gid_index = 1"), t, &s).isOk());
    EXPECT_EQ(s.gid_index, 1u);
    EXPECT_EQ(s.netdev, "eth0");
    Status st = select(fabricConfig("gid_index = 2"), t, &s);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("\"IB/RoCE v1\", not RoCE v2"), std::string::npos) << st.message();
    st = select(fabricConfig("gid_index = 200"), t, &s);
    EXPECT_EQ(st.code(), Code::kNotFound);
    st = select(fabricConfig("gid_index = 5"), t, &s);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("empty"), std::string::npos) << st.message();
}

TEST(SelectFabric, MtuClampedToTheNetdevs) {
    SysfsTree t;
    t.standardHost();
    t.addNetdev("eth0", SysfsTree::kNicPci, 1500);
    FabricSelection s;
    ASSERT_TRUE(select(fabricConfig("mtu = 4096"), t, &s).isOk());
    EXPECT_EQ(s.netdev_mtu, 1500u);
    EXPECT_EQ(s.active_mtu, 1024u);
    EXPECT_EQ(s.path_mtu, 1024u);
    EXPECT_NE(s.mtu_reason.find("clamped"), std::string::npos) << s.mtu_reason;
    EXPECT_NE(s.mtu_reason.find("4192"), std::string::npos) << s.mtu_reason;
    // The file's smaller value stays.
    t.addNetdev("eth0", SysfsTree::kNicPci, 9000);
    ASSERT_TRUE(select(fabricConfig("mtu = 1024"), t, &s).isOk());
    EXPECT_EQ(s.active_mtu, 4096u);
    EXPECT_EQ(s.path_mtu, 1024u);
    EXPECT_EQ(s.mtu_reason.find("clamped"), std::string::npos);
}

TEST(SelectFabric, TclassOverrideFailRefusesAndExplains) {
    SysfsTree t;
    t.standardHost();
    t.setTclassOverride("mlx5_0", 1, 96);
    FabricSelection s;
    const Status st = select(fabricConfig("tclass_override = \"fail\""), t, &s);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("is 96 (dscp 24) but the file gives 106"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("tclass_override = \"adopt\""), std::string::npos);
}

TEST(SelectFabric, TclassOverrideAdoptUsesTheHostValue) {
    SysfsTree t;
    t.standardHost();
    t.setTclassOverride("mlx5_0", 1, 96);
    FabricSelection s;
    ASSERT_TRUE(select(fabricConfig("tclass_override = \"adopt\""), t, &s).isOk());
    EXPECT_EQ(s.traffic_class, 96);
    EXPECT_EQ(s.tclass_source, TclassSource::kHostOverride);
    EXPECT_NE(s.tclass_reason.find("adopted"), std::string::npos) << s.tclass_reason;
}

TEST(SelectFabric, TclassOverrideEqualOrUnsetIsOurs) {
    SysfsTree t;
    t.standardHost();
    FabricSelection s;
    t.setTclassOverride("mlx5_0", 1, 106);
    ASSERT_TRUE(select(fabricConfig(""), t, &s).isOk());
    EXPECT_EQ(s.tclass_source, TclassSource::kConfig);
    EXPECT_NE(s.tclass_reason.find("equal to the host-wide"), std::string::npos);
    // The file exists but no global class is set (mlx5 then prints nothing).
    t.setTclassOverride("mlx5_0", 1, -1);
    ASSERT_TRUE(select(fabricConfig("dscp = 46\necn = false"), t, &s).isOk());
    EXPECT_EQ(s.traffic_class, 184);
    EXPECT_NE(s.tclass_reason.find("is not set"), std::string::npos) << s.tclass_reason;
    // Unreadable (a directory, as EINVAL in a container): ours, and said.
    t.unreadable("class/infiniband/mlx5_0/tc/1/traffic_class");
    ASSERT_TRUE(select(fabricConfig(""), t, &s).isOk());
    EXPECT_NE(s.tclass_reason.find("unreadable"), std::string::npos);
}

TEST(TclassOverride, ParsesGlobalAndRuleLines) {
    SysfsTree t;
    t.addDevice("mlx5_0", "");
    t.write("class/infiniband/mlx5_0/tc/1/traffic_class",
            "Global tclass=106\ntclass=96,dst_ip=10.0.0.0/8");
    const TclassOverride o = readTclassOverride(SysfsRoot(t.rootString()), "mlx5_0", 1);
    EXPECT_TRUE(o.file_present);
    ASSERT_TRUE(o.value);
    EXPECT_EQ(*o.value, 106);
    EXPECT_TRUE(o.problem.empty());
    EXPECT_FALSE(readTclassOverride(SysfsRoot(t.rootString()), "mlx5_0", 2).file_present);
}

TEST(SysfsRoot, FromEnvironment) {
    ::setenv(SysfsRoot::kEnvVar, "/tmp/somewhere/", 1);
    EXPECT_EQ(SysfsRoot::fromEnvironment().path(), "/tmp/somewhere");
    ::setenv(SysfsRoot::kEnvVar, "", 1);
    EXPECT_EQ(SysfsRoot::fromEnvironment().path(), "/sys");
    ::unsetenv(SysfsRoot::kEnvVar);
    EXPECT_EQ(SysfsRoot::fromEnvironment().path(), "/sys");
}

}  // namespace
}  // namespace tensorlane::sidecar
