// The binaries: `tensorlane diag` (exit status, JSON, messages) and the agreement between
// `tensorlane-sidecar --check-config` and the sidecar's start, against fixture trees.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "sysfs_tree.hpp"

namespace tensorlane::testing {
namespace {

struct CmdResult {
    int rc = -1;
    std::string out;  // stdout and stderr together
};

/// Runs `cmd` with a shell; `env` is prefixed ("VAR=value ...").
CmdResult run(const std::string &cmd, bool with_stderr = true) {
    CmdResult r;
    FILE *p = ::popen((cmd + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
    if (p == nullptr) {
        return r;
    }
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) {
        r.out.append(buf, n);
    }
    const int status = ::pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

/// Only stdout (for JSON).
CmdResult runStdout(const std::string &cmd) {
    return run(cmd, false);
}

const std::string kCli = TENSORLANE_CLI_BIN;
const std::string kSidecar = TENSORLANE_SIDECAR_BIN;

/// A config file in the tree's directory with its own socket and a 0600 key.
std::string writeConfig(const SysfsTree &t, const std::string &fabric, const std::string &key,
                        bool peers = true) {
    t.write("etc/peer.key", key);
    ::chmod((t.root() / "etc/peer.key").c_str(), 0600);
    std::string text = "[node]\nname = \"node-a\"\nlisten = \"127.0.0.1:18599\"\nsocket = \"" +
                       (t.root() / "run/sidecar.sock").string() + "\"\n\n[fabric]\n" + fabric +
                       "\n\n[security]\npeer_key_file = \"" + (t.root() / "etc/peer.key").string() +
                       "\"\n";
    if (peers) {
        text += "\n[[peers]]\nname = \"node-b\"\naddress = \"127.0.0.1:1\"\n";
    }
    t.write("etc/node.toml", text);
    return (t.root() / "etc/node.toml").string();
}

std::string env(const SysfsTree &t) {
    return "TENSORLANE_SYSFS_ROOT=" + t.rootString() + " ";
}

// A tensorlane-key-v1 line (what `tensorlane keygen` writes; write() adds the newline).
const std::string kKey = "tensorlane-key-v1:" + std::string(64, '0');

TEST(DiagCli, JsonShapeAndExitZero) {
    SysfsTree t;
    t.standardHost();
    const std::string cfg = writeConfig(t, "", kKey, false);
    const CmdResult r =
        runStdout(kCli + " diag --config " + cfg + " --sysfs-root " + t.rootString() + " --json");
    EXPECT_EQ(r.rc, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    for (const char *k : {"device", "port", "netdev", "gid_index", "gid", "roce_version",
                          "traffic_class", "findings"}) {
        EXPECT_TRUE(j.contains(k)) << k;
    }
    EXPECT_EQ(j["gid_index"], 3);
    EXPECT_EQ(j["traffic_class"], 106);
}

TEST(DiagCli, FailingFindingExitsOne) {
    SysfsTree t;
    t.standardHost();
    t.addPort("mlx5_0", 1, "1: DOWN", "3: Disabled");
    const std::string cfg = writeConfig(t, "transport = \"verbs\"", kKey, false);
    const CmdResult r = run(kCli + " diag --config " + cfg + " --sysfs-root " + t.rootString());
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find("[FAIL] port"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("fix: "), std::string::npos) << r.out;
    // TENSORLANE_SYSFS_ROOT does what --sysfs-root does.
    EXPECT_EQ(run(env(t) + kCli + " diag --config " + cfg).rc, 1);
}

/// The findings of `diag --json`, by check name (a check that appears twice keeps the last).
std::map<std::string, nlohmann::json> diagFindings(const SysfsTree &t, const std::string &cfg,
                                                   std::string *text_out) {
    const std::string base =
        kCli + " diag --no-probe --config " + cfg + " --sysfs-root " + t.rootString();
    *text_out = run(base).out;
    const auto j = nlohmann::json::parse(runStdout(base + " --json").out, nullptr, false);
    std::map<std::string, nlohmann::json> out;
    if (j.is_object() && j["findings"].is_array()) {
        for (const auto &f : j["findings"]) {
            out[f.value("check", "")] = f;
        }
    }
    return out;
}

// Issue 24: on a host without an RDMA device the RDMA checks are skipped, said once with the
// reason, instead of a dozen warnings that each say "fix the device finding first".
TEST(DiagCli, WithoutAnRdmaDeviceTheRdmaChecksAreSkippedOnceWithTheReason) {
    SysfsTree t;  // no class/infiniband at all
    t.write("class/net/lo/operstate", "unknown");
    const std::string cfg = writeConfig(t, "", kKey);
    std::string text;
    const auto f = diagFindings(t, cfg, &text);
    ASSERT_TRUE(f.count("rdma")) << text;
    EXPECT_NE(f.at("rdma").value("detail", "").find("no RDMA device"), std::string::npos) << text;
    for (const char *gone : {"device", "port", "gid", "roce_version", "netdev", "mtu",
                             "traffic_class", "trust", "pfc", "ecn", "counters", "dmabuf"}) {
        EXPECT_EQ(f.count(gone), 0u) << gone << "\n" << text;
    }
    EXPECT_EQ(text.find("fix the device finding first"), std::string::npos) << text;
    // What is left to warn about: that auto found tcp, and that there is no device.
    EXPECT_EQ(f.at("transport").value("status", ""), "warn");
    EXPECT_NE(text.find(", 2 warn, 0 fail"), std::string::npos) << text;
    EXPECT_TRUE(f.count("memlock") && f.count("pcie") && f.count("peers")) << text;
}

TEST(DiagCli, TransportTcpSkipsTheRdmaChecksEvenWithADevice) {
    SysfsTree t;
    t.standardHost();
    const std::string cfg = writeConfig(t, "transport = \"tcp\"", kKey);
    std::string text;
    const auto f = diagFindings(t, cfg, &text);
    ASSERT_TRUE(f.count("rdma")) << text;
    EXPECT_NE(f.at("rdma").value("detail", "").find("transport = \"tcp\""), std::string::npos)
        << text;
    EXPECT_EQ(f.count("gid"), 0u) << text;
    EXPECT_NE(text.find(", 0 warn, 0 fail"), std::string::npos) << text;
}

TEST(DiagCli, DmabufWithoutAGpuIsNotApplicableNotOk) {
    SysfsTree t;
    t.standardHost();  // a RoCE NIC, no NVIDIA GPU
    const std::string cfg = writeConfig(t, "", kKey, false);
    std::string text;
    const auto f = diagFindings(t, cfg, &text);
    ASSERT_TRUE(f.count("dmabuf")) << text;
    EXPECT_EQ(f.at("dmabuf").value("detail", "").rfind("not applicable: no NVIDIA GPU", 0), 0u)
        << text;
}

TEST(DiagCli, MissingArgumentsAreNamed) {
    CmdResult r = run(kCli + " diag");
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.out.find("--config is required"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("A subcommand is required"), std::string::npos) << r.out;
    r = run(kCli);
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.out.find("a verb is required: status bench diag"), std::string::npos) << r.out;
    r = run(kCli + " diag --config /nonexistent.toml");
    EXPECT_EQ(r.rc, 2);
}

TEST(DiagCli, EveryVerbsHelpDescribesThatVerb) {
    CmdResult r = run(kCli + " diag --help");
    EXPECT_EQ(r.rc, 0);
    EXPECT_NE(r.out.find("check this host's RDMA fabric"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--sysfs-root"), std::string::npos);
    EXPECT_NE(r.out.find("Exit status"), std::string::npos);
    r = run(kCli + " status --help");
    EXPECT_EQ(r.rc, 0);
    EXPECT_NE(r.out.find("ask a running sidecar"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("--sysfs-root"), std::string::npos);
    r = run(kCli + " bench --help");
    EXPECT_EQ(r.rc, 0);
    EXPECT_NE(r.out.find("write latency and bandwidth"), std::string::npos) << r.out;
}

/// --check-config refuses (2) exactly what start refuses (1), with the same reason.
void expectBothRefuse(const SysfsTree &t, const std::string &cfg, const std::string &reason,
                      int start_rc = 1) {
    const CmdResult check = run(env(t) + kSidecar + " --check-config " + cfg);
    EXPECT_EQ(check.rc, 2) << check.out;
    EXPECT_NE(check.out.find(reason), std::string::npos) << check.out;
    const CmdResult start = run(env(t) + "timeout 10 " + kSidecar + " --config " + cfg);
    EXPECT_EQ(start.rc, start_rc) << start.out;
    EXPECT_NE(start.out.find(reason), std::string::npos) << start.out;
}

TEST(CheckConfig, AgreesWithStartOnAShortKey) {
    SysfsTree t;
    // The key file's format is checked with the rest of the file: a configuration error (2).
    expectBothRefuse(t, writeConfig(t, "transport = \"tcp\"", "short"), "not a tensorlane key file",
                     2);
}

TEST(CheckConfig, AgreesWithStartOnVerbsWithoutAPort) {
    SysfsTree t;
    t.standardHost();
    t.addPort("mlx5_0", 1, "1: DOWN", "3: Disabled");
    expectBothRefuse(t, writeConfig(t, "transport = \"verbs\"", kKey),
                     "the fabric is unusable: mlx5_0 port 1 is DOWN");
}

TEST(CheckConfig, AgreesWithStartOnPreflightFail) {
    SysfsTree t;
    t.standardHost();
    t.setTclassOverride("mlx5_0", 1, 96);
    expectBothRefuse(t, writeConfig(t, "preflight = \"fail\"", kKey), "preflight traffic_class");
}

TEST(CheckConfig, PrintsTheFabricSelection) {
    SysfsTree t;
    t.standardHost();
    const std::string cfg = writeConfig(t, "", kKey);
    const CmdResult text = run(env(t) + kSidecar + " --check-config " + cfg);
    EXPECT_EQ(text.rc, 0) << text.out;
    EXPECT_NE(text.out.find("[fabric selection]"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("gid_index = 3 (GID 3 (10.0.0.2) is the first RoCE v2 IPv4-mapped"),
              std::string::npos)
        << text.out;
    EXPECT_NE(text.out.find("traffic_class = 106 (config"), std::string::npos);
    const CmdResult json = runStdout(env(t) + kSidecar + " --check-config " + cfg + " --json");
    EXPECT_EQ(json.rc, 0);
    const auto j = nlohmann::json::parse(json.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << json.out;
    EXPECT_EQ(j["fabric_selection"]["device"], "mlx5_0");
    EXPECT_EQ(j["fabric_selection"]["netdev"], "eth0");
    EXPECT_EQ(j["fabric_selection"]["gid_index"], 3);
    EXPECT_EQ(j["fabric_selection"]["traffic_class_source"], "config");
    EXPECT_TRUE(j["startup"]["ok"].get<bool>());
    EXPECT_EQ(j["derived"]["traffic_class"], 106);
    // Without an RDMA device the transport is tcp and there is no selection.
    SysfsTree bare;
    const std::string cfg2 = writeConfig(bare, "", kKey);
    const CmdResult tcp = runStdout(env(bare) + kSidecar + " --check-config " + cfg2 + " --json");
    EXPECT_EQ(tcp.rc, 0) << tcp.out;
    EXPECT_TRUE(nlohmann::json::parse(tcp.out)["fabric_selection"].is_null());
}

}  // namespace
}  // namespace tensorlane::testing
