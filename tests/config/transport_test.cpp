// resolveTransport against fake sysfs trees in a temporary directory.
#include <gtest/gtest.h>

#include <string>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::TempDir;

/// A sysfs root in a temporary directory, with the port state files a test writes into it.
struct FakeSysfs {
    TempDir dir;
    std::string root() const { return dir.path().string(); }
    void port(const std::string &device, int port, const std::string &content) const {
        dir.write("class/infiniband/" + device + "/ports/" + std::to_string(port) + "/state",
                  content, 0644);
    }
};

Config withTransport(TransportKind kind, std::string device = "auto", uint8_t port = 1) {
    Config c;
    c.fabric.transport = kind;
    c.fabric.device = std::move(device);
    c.fabric.port = port;
    return c;
}

TEST(ConfigTransport, AutoPicksVerbsWithAnActivePort) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "4: ACTIVE\n");
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kAuto), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kVerbs);
    EXPECT_EQ(t.reason, "mlx5_0 port 1 is ACTIVE");
}

TEST(ConfigTransport, AutoFallsBackToTcpWhenThePortIsDown) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "1: DOWN\n");
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kAuto), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kTcp);
    EXPECT_EQ(t.reason, "mlx5_0 port 1 is DOWN");
}

TEST(ConfigTransport, AutoFallsBackToTcpWithoutDevices) {
    const FakeSysfs sys;
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kAuto), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kTcp);
    EXPECT_EQ(t.reason, "no RDMA device under " + sys.root() + "/class/infiniband");
    // An empty class directory (rdma modules loaded, no device) is the same.
    std::filesystem::create_directories(sys.dir.path() / "class/infiniband");
    EXPECT_EQ(resolveTransport(withTransport(TransportKind::kAuto), sys.root()).kind,
              TransportKind::kTcp);
}

TEST(ConfigTransport, AutoLooksAtEveryDeviceAndPort) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "1: DOWN\n");
    sys.port("mlx5_1", 1, "2: INIT\n");
    sys.port("mlx5_1", 2, "4: ACTIVE\n");
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kAuto), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kVerbs);
    EXPECT_EQ(t.reason, "mlx5_1 port 2 is ACTIVE");
}

TEST(ConfigTransport, AutoListsEveryPortThatIsNotUp) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "1: DOWN\n");
    sys.port("mlx5_1", 1, "2: INIT\n");
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kAuto), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kTcp);
    EXPECT_EQ(t.reason, "mlx5_0 port 1 is DOWN, mlx5_1 port 1 is INIT");
}

TEST(ConfigTransport, ActiveDeferIsNotActive) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "5: ACTIVE_DEFER\n");
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kAuto), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kTcp);
    EXPECT_EQ(t.reason, "mlx5_0 port 1 is ACTIVE_DEFER");
}

TEST(ConfigTransport, ExplicitDeviceIsHonoured) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "1: DOWN\n");
    sys.port("mlx5_1", 1, "4: ACTIVE\n");
    TransportChoice t = resolveTransport(withTransport(TransportKind::kAuto, "mlx5_0"), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kTcp);
    EXPECT_EQ(t.reason, "mlx5_0 port 1 is DOWN");

    t = resolveTransport(withTransport(TransportKind::kAuto, "mlx5_1"), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kVerbs);
    EXPECT_EQ(t.reason, "mlx5_1 port 1 is ACTIVE");

    t = resolveTransport(withTransport(TransportKind::kAuto, "mlx5_9"), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kTcp);
    EXPECT_EQ(t.reason, "mlx5_9 not found under " + sys.root() + "/class/infiniband");
}

TEST(ConfigTransport, ExplicitDeviceUsesTheConfiguredPort) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "1: DOWN\n");
    sys.port("mlx5_0", 2, "4: ACTIVE\n");
    TransportChoice t =
        resolveTransport(withTransport(TransportKind::kAuto, "mlx5_0", 2), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kVerbs);
    EXPECT_EQ(t.reason, "mlx5_0 port 2 is ACTIVE");
    t = resolveTransport(withTransport(TransportKind::kAuto, "mlx5_0", 3), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kTcp);
    EXPECT_EQ(t.reason, "mlx5_0 has no port 3");
}

TEST(ConfigTransport, ExplicitTcpIsKept) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "4: ACTIVE\n");
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kTcp), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kTcp);
    EXPECT_EQ(t.reason, "set in the file");
}

TEST(ConfigTransport, ExplicitVerbsIsKeptWithoutADevice) {
    const FakeSysfs sys;
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kVerbs), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kVerbs);
    EXPECT_NE(t.reason.find("no RDMA device"), std::string::npos) << t.reason;
}

TEST(ConfigTransport, ExplicitVerbsWithAnActivePort) {
    const FakeSysfs sys;
    sys.port("mlx5_0", 1, "4: ACTIVE\n");
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kVerbs), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kVerbs);
    EXPECT_EQ(t.reason, "set in the file; mlx5_0 port 1 is ACTIVE");
}

TEST(ConfigTransport, OddStateFilesDoNotConfuseIt) {
    const FakeSysfs sys;
    sys.port("a", 1, "");
    sys.port("b", 1, "garbage");
    sys.port("c", 1, "4:ACTIVE");  // no space after the colon still counts
    const TransportChoice t = resolveTransport(withTransport(TransportKind::kAuto), sys.root());
    EXPECT_EQ(t.kind, TransportKind::kVerbs);
    EXPECT_EQ(t.reason, "c port 1 is ACTIVE");
}

}  // namespace
}  // namespace tensorlane::config
