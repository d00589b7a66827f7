// checkStartup: what the sidecar refuses at start, and --check-config with it.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "sysfs_tree.hpp"
#include "tensorlane/sidecar/startup.hpp"
#include "test_config.hpp"

namespace tensorlane::sidecar {
namespace {

using testing::fabricConfig;
using testing::SysfsTree;

/// A config with one peer and a key file under `dir` holding `key`.
config::Config withPeer(const SysfsTree &dir, const std::string &fabric, const std::string &key) {
    dir.write("etc/peer.key", key);
    ::chmod((dir.root() / "etc/peer.key").c_str(), 0600);
    config::Config c =
        fabricConfig(fabric, "[[peers]]\nname = \"node-b\"\naddress = \"10.0.0.3:18515\"\n");
    c.security.peer_key_file = (dir.root() / "etc/peer.key").string();
    return c;
}

bool anyContains(const std::vector<std::string> &v, const std::string &needle) {
    for (const std::string &s : v) {
        if (s.find(needle) != std::string::npos) {
            return true;
        }
    }
    return false;
}

// A tensorlane-key-v1 line (what `tensorlane keygen` writes; write() adds the newline).
const std::string kGoodKey = "tensorlane-key-v1:" + std::string(64, '0');

TEST(Startup, ShortKeyIsRefused) {
    SysfsTree t;
    const StartupReport r =
        checkStartup(withPeer(t, "transport = \"tcp\"", "short"), SysfsRoot(t.rootString()), {});
    EXPECT_FALSE(r.ok());
    // Not the key file format (tensorlane-key-v1): refused at start as by --check-config.
    EXPECT_TRUE(anyContains(r.errors, "not a tensorlane key file")) << r.status().message();
    EXPECT_EQ(r.status().code(), Code::kInvalid);
    EXPECT_TRUE(
        checkStartup(withPeer(t, "transport = \"tcp\"", kGoodKey), SysfsRoot(t.rootString()), {})
            .ok());
}

TEST(Startup, VerbsWithoutAUsablePortIsRefused) {
    SysfsTree t;  // no RDMA device
    const StartupReport r =
        checkStartup(withPeer(t, "transport = \"verbs\"", kGoodKey), SysfsRoot(t.rootString()), {});
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE(anyContains(r.errors, "the fabric is unusable: no RDMA device"))
        << r.status().message();
    EXPECT_FALSE(r.fabric);
    EXPECT_FALSE(r.fabric_error.empty());
    // Without peers the fabric is not needed: a warning only.
    const StartupReport lone =
        checkStartup(fabricConfig("transport = \"verbs\""), SysfsRoot(t.rootString()), {});
    EXPECT_TRUE(lone.ok()) << lone.status().message();
    EXPECT_TRUE(anyContains(lone.warnings, "not needed"));
}

TEST(Startup, AutoSelectsTheFabricAndSaysWhatPeersUse) {
    SysfsTree t;
    t.standardHost();
    const StartupReport r = checkStartup(withPeer(t, "", kGoodKey), SysfsRoot(t.rootString()), {});
    EXPECT_TRUE(r.ok()) << r.status().message();
    ASSERT_TRUE(r.fabric);
    EXPECT_EQ(r.fabric->gid_index, 3u);
    EXPECT_TRUE(r.preflight_ran);
    EXPECT_FALSE(r.preflight.empty());
    const std::string text = startupText(r);
    EXPECT_NE(text.find("[fabric selection]"), std::string::npos);
    EXPECT_NE(text.find("gid_index = 3 (GID 3"), std::string::npos) << text;
    EXPECT_NE(text.find("traffic_class = 106 (config"), std::string::npos) << text;
}

TEST(Startup, PreflightFailRefusesOnAFailingFinding) {
    SysfsTree t;
    t.standardHost();
    t.setTclassOverride("mlx5_0", 1, 96);  // differs, tclass_override = "fail"
    const StartupReport warn =
        checkStartup(withPeer(t, "preflight = \"warn\"", kGoodKey), SysfsRoot(t.rootString()), {});
    EXPECT_TRUE(warn.ok()) << warn.status().message();
    EXPECT_TRUE(anyContains(warn.warnings, "preflight traffic_class"));
    const StartupReport fail =
        checkStartup(withPeer(t, "preflight = \"fail\"", kGoodKey), SysfsRoot(t.rootString()), {});
    EXPECT_FALSE(fail.ok());
    EXPECT_TRUE(anyContains(fail.errors, "preflight traffic_class")) << fail.status().message();
    // With transport tcp the preflight does not run: the NIC is not used.
    const StartupReport tcp =
        checkStartup(withPeer(t, "preflight = \"fail\"\ntransport = \"tcp\"", kGoodKey),
                     SysfsRoot(t.rootString()), {});
    EXPECT_TRUE(tcp.ok());
    EXPECT_FALSE(tcp.preflight_ran);
}

}  // namespace
}  // namespace tensorlane::sidecar
