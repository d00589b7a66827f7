// GID parsing and the rules of gid_index = "auto".
#include <gtest/gtest.h>

#include "sysfs_tree.hpp"
#include "tensorlane/sidecar/fabric.hpp"

namespace tensorlane::sidecar {
namespace {

using testing::SysfsTree;

constexpr const char *kLinkLocal = "fe80:0000:0000:0000:0e42:a1ff:fe65:1a2b";
constexpr const char *kV4 = "0000:0000:0000:0000:0000:ffff:0a00:0002";
constexpr const char *kV4Other = "0000:0000:0000:0000:0000:ffff:ac11:0001";  // 172.17.0.1
constexpr const char *kGlobal6 = "fd00:0000:0000:0000:0000:0000:0000:0002";

TEST(Gid, ParsesTheSysfsFormAndClassifies) {
    const auto v4 = Gid::parse(kV4);
    ASSERT_TRUE(v4);
    EXPECT_TRUE(v4->isIpv4Mapped());
    EXPECT_FALSE(v4->isLinkLocal());
    EXPECT_EQ(v4->address(), "10.0.0.2");
    EXPECT_EQ(v4->text(), kV4);
    EXPECT_EQ(v4->raw[15], 0x02);
    EXPECT_EQ(v4->raw[10], 0xff);

    const auto ll = Gid::parse(kLinkLocal);
    ASSERT_TRUE(ll);
    EXPECT_TRUE(ll->isLinkLocal());
    EXPECT_EQ(ll->address(), "fe80::e42:a1ff:fe65:1a2b");
    // fe80::/10 covers febf:: too, but not fec0::.
    EXPECT_TRUE(Gid::parse("febf::1")->isLinkLocal());
    EXPECT_FALSE(Gid::parse("fec0::1")->isLinkLocal());

    EXPECT_TRUE(Gid::parse("0000:0000:0000:0000:0000:0000:0000:0000")->isZero());
    EXPECT_FALSE(Gid::parse("0000:0000:0000:0000:0000:ffff:0a00:000g"));
    EXPECT_FALSE(Gid::parse("garbage"));
    EXPECT_EQ(Gid::parse("::ffff:10.0.0.2")->text(), kV4);
}

GidEntry entry(uint32_t index, const char *gid, RoceVersion v, const char *netdev) {
    GidEntry e;
    e.index = index;
    e.gid = Gid::parse(gid);
    e.version = v;
    e.type_text = v == RoceVersion::kV2 ? "RoCE v2" : "IB/RoCE v1";
    e.netdev = netdev;
    return e;
}

TEST(GidAuto, PrefersIpv4MappedOverIpv6AndLinkLocal) {
    const std::vector<GidEntry> table = {
        entry(0, kLinkLocal, RoceVersion::kV2, "eth0"),
        entry(1, kGlobal6, RoceVersion::kV2, "eth0"),
        entry(2, kV4, RoceVersion::kV1, "eth0"),
        entry(3, kV4, RoceVersion::kV2, "eth0"),
    };
    GidChoice c;
    ASSERT_TRUE(chooseGid(table, "eth0", &c).isOk());
    EXPECT_EQ(c.index, 3u);
    EXPECT_NE(c.reason.find("IPv4-mapped"), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find("2 (RoCE v1)"), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find("0 (link-local"), std::string::npos) << c.reason;
}

TEST(GidAuto, GlobalIpv6BeforeLinkLocal) {
    const std::vector<GidEntry> table = {
        entry(0, kLinkLocal, RoceVersion::kV2, "eth0"),
        entry(1, kGlobal6, RoceVersion::kV2, "eth0"),
    };
    GidChoice c;
    ASSERT_TRUE(chooseGid(table, "eth0", &c).isOk());
    EXPECT_EQ(c.index, 1u);
    EXPECT_NE(c.reason.find("global IPv6"), std::string::npos) << c.reason;
}

TEST(GidAuto, LinkLocalOnlyWhenNothingRoutableAndSaysSo) {
    const std::vector<GidEntry> table = {
        entry(0, kLinkLocal, RoceVersion::kV1, "eth0"),
        entry(1, kLinkLocal, RoceVersion::kV2, "eth0"),
    };
    GidChoice c;
    ASSERT_TRUE(chooseGid(table, "eth0", &c).isOk());
    EXPECT_EQ(c.index, 1u);
    EXPECT_NE(c.reason.find("no routable"), std::string::npos) << c.reason;
}

TEST(GidAuto, RoceV1OnlyIsRefusedWithWhatTheTableHolds) {
    const std::vector<GidEntry> table = {
        entry(0, kLinkLocal, RoceVersion::kV1, "eth0"),
        entry(1, kV4, RoceVersion::kV1, "eth0"),
    };
    GidChoice c{99, "untouched"};
    const Status st = chooseGid(table, "eth0", &c);
    EXPECT_EQ(st.code(), Code::kNotFound);
    EXPECT_NE(st.message().find("0-1 (RoCE v1)"), std::string::npos) << st.message();
    EXPECT_EQ(c.index, 99u);  // outputs are set only on success
}

TEST(GidAuto, OnlyTheConfiguredNetdev) {
    const std::vector<GidEntry> table = {
        entry(0, kV4Other, RoceVersion::kV2, "eth1"),
        entry(1, kV4, RoceVersion::kV2, "eth0"),
    };
    GidChoice c;
    ASSERT_TRUE(chooseGid(table, "eth0", &c).isOk());
    EXPECT_EQ(c.index, 1u);
    EXPECT_NE(c.reason.find("0 (of eth1)"), std::string::npos) << c.reason;
    ASSERT_TRUE(chooseGid(table, "eth1", &c).isOk());
    EXPECT_EQ(c.index, 0u);
}

TEST(GidAuto, OverlayNetdevsAreSkippedWhenAnyNetdevWillDo) {
    const std::vector<GidEntry> table = {
        entry(0, kV4Other, RoceVersion::kV2, "docker0"),
        entry(1, kV4Other, RoceVersion::kV2, "veth1a2b3c"),
        entry(2, kV4Other, RoceVersion::kV2, "cni0"),
        entry(3, kV4, RoceVersion::kV2, "eth0"),
    };
    GidChoice c;
    ASSERT_TRUE(chooseGid(table, "", &c).isOk());
    EXPECT_EQ(c.index, 3u);
    EXPECT_NE(c.reason.find("overlay netdev docker0"), std::string::npos) << c.reason;
    EXPECT_TRUE(isOverlayNetdev("flannel.1"));
    EXPECT_TRUE(isOverlayNetdev("cali12ab"));
    EXPECT_FALSE(isOverlayNetdev("eth0"));
    EXPECT_FALSE(isOverlayNetdev("ens1f0np0"));
    EXPECT_FALSE(isOverlayNetdev("bond0"));
}

TEST(GidAuto, UnreadableAndEmptyEntriesAreSkipped) {
    std::vector<GidEntry> table = {entry(0, kV4, RoceVersion::kV2, "eth0"),
                                   entry(1, kV4, RoceVersion::kV2, "eth0")};
    table[0].problem = "type unreadable";
    GidChoice c;
    ASSERT_TRUE(chooseGid(table, "eth0", &c).isOk());
    EXPECT_EQ(c.index, 1u);
    EXPECT_NE(c.reason.find("0 (type unreadable)"), std::string::npos) << c.reason;
}

TEST(GidTable, ReadsTheKernelLayoutAndSkipsUnreadableEntries) {
    const SysfsTree t;
    t.standardHost();
    // An entry whose type is a dangling link, one whose GID file is a directory.
    t.addGid("mlx5_0", 1, 8, kV4, "RoCE v2", "eth0");
    t.dangling(SysfsTree::portDir("mlx5_0", 1) + "/gid_attrs/types/8");
    t.unreadable(SysfsTree::portDir("mlx5_0", 1) + "/gids/9");
    // 10 sorts after 9, not after 1.
    t.addGid("mlx5_0", 1, 10, kV4, "RoCE v2", "eth0");
    const auto table = readGidTable(SysfsRoot(t.rootString()), "mlx5_0", 1);
    ASSERT_EQ(table.size(), 11u);
    EXPECT_EQ(table[3].version, RoceVersion::kV2);
    EXPECT_EQ(table[3].netdev, "eth0");
    EXPECT_EQ(table[2].version, RoceVersion::kV1);
    EXPECT_EQ(table[4].problem, "empty");
    EXPECT_EQ(table[8].problem, "type unreadable");
    EXPECT_EQ(table[9].problem, "GID unreadable");
    EXPECT_EQ(table[10].index, 10u);
    GidChoice c;
    ASSERT_TRUE(chooseGid(table, "eth0", &c).isOk());
    EXPECT_EQ(c.index, 3u);
    EXPECT_NE(c.reason.find("4 empty"), std::string::npos) << c.reason;
}

TEST(GidIndex, ANumberIsCheckedBeforeUse) {
    const std::vector<GidEntry> table = {
        entry(0, kLinkLocal, RoceVersion::kV1, "eth0"),
        entry(1, kV4, RoceVersion::kV2, "eth0"),
        entry(2, kV4Other, RoceVersion::kV2, "eth1"),
    };
    GidChoice c;
    ASSERT_TRUE(checkGidIndex(table, 1, "eth0", &c).isOk());
    EXPECT_EQ(c.index, 1u);
    EXPECT_NE(c.reason.find("set in the file"), std::string::npos);

    Status st = checkGidIndex(table, 0, "eth0", &c);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("not RoCE v2"), std::string::npos) << st.message();

    st = checkGidIndex(table, 7, "", &c);
    EXPECT_EQ(st.code(), Code::kNotFound);
    EXPECT_NE(st.message().find("no such GID table entry (indices 0-2)"), std::string::npos)
        << st.message();

    st = checkGidIndex(table, 2, "eth0", &c);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("belongs to eth1"), std::string::npos) << st.message();
    EXPECT_TRUE(checkGidIndex(table, 2, "", &c).isOk());

    std::vector<GidEntry> unreadable = table;
    unreadable[1].problem = "type unreadable";
    st = checkGidIndex(unreadable, 1, "eth0", &c);
    EXPECT_EQ(st.code(), Code::kInvalid);
    EXPECT_NE(st.message().find("type unreadable"), std::string::npos) << st.message();
}

TEST(RoceMtu, NetdevMtuLessRoceHeaders) {
    EXPECT_EQ(roceActiveMtu(9000), 4096u);
    EXPECT_EQ(roceActiveMtu(4200), 4096u);
    EXPECT_EQ(roceActiveMtu(4191), 2048u);  // 4095 bytes of payload do not hold 4096
    EXPECT_EQ(roceActiveMtu(1500), 1024u);
    EXPECT_EQ(roceActiveMtu(2144), 2048u);
    EXPECT_EQ(roceActiveMtu(600), 256u);
    EXPECT_EQ(roceActiveMtu(300), 0u);
}

}  // namespace
}  // namespace tensorlane::sidecar
