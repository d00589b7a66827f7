// runDiag and its JSON against fixture trees, with the helper programs faked.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "sysfs_tree.hpp"
#include "tensorlane/sidecar/diag.hpp"
#include "test_config.hpp"

namespace tensorlane::sidecar {
namespace {

using testing::fabricConfig;
using testing::SysfsTree;

/// A host whose tools answer from a table keyed by the command line.
struct FakeHost {
    std::map<std::string, std::string> outputs;
    std::vector<std::string> calls;

    DiagEnvironment env() {
        DiagEnvironment e;
        e.run = [this](const std::vector<std::string> &argv) -> std::optional<std::string> {
            std::string key;
            for (const std::string &a : argv) {
                key += key.empty() ? a : " " + a;
            }
            calls.push_back(key);
            const auto it = outputs.find(key);
            return it == outputs.end() ? std::nullopt : std::optional<std::string>(it->second);
        };
        e.memlock_bytes = UINT64_MAX;
        e.cap_ipc_lock = false;
        e.kernel_release = "6.1.0-18-amd64";
        e.has_reg_dmabuf_mr = true;
        return e;
    }
};

std::string mlnxQos(const char *trust, int dscp26_prio, const char *pfc) {
    std::string out = "DCBX mode: OS controlled\nPriority trust state: " + std::string(trust) +
                      "\ndscp2prio mapping:\n";
    for (int p = 0; p < 8; ++p) {
        out += "        prio:" + std::to_string(p) + " dscp:";
        for (int d = p * 8 + 7; d >= p * 8; --d) {
            if (d == 26 && p != dscp26_prio) {
                continue;
            }
            out += std::to_string(d) + ",";
        }
        if (p == dscp26_prio && p != 3) {
            out += "26,";
        }
        out += "\n";
    }
    out +=
        "PFC configuration:\n        priority    0   1   2   3   4   5   6   7\n        enabled"
        "     " +
        std::string(pfc) + "\n";
    return out;
}

const Finding *find(const DiagReport &r, const std::string &check) {
    for (const Finding &f : r.findings) {
        if (f.check == check) {
            return &f;
        }
    }
    return nullptr;
}

FindingStatus statusOf(const DiagReport &r, const std::string &check) {
    const Finding *f = find(r, check);
    EXPECT_NE(f, nullptr) << "no finding " << check;
    return f == nullptr ? FindingStatus::kFail : f->status;
}

TEST(Diag, HealthyHostWithMlnxQos) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    host.outputs["mlnx_qos -i eth0"] = mlnxQos("dscp", 3, "0   0   0   1   0   0   0   0");
    host.outputs["ethtool -S eth0"] =
        "NIC statistics:\n     rx_prio3_pause: 12\n     tx_prio3_pause: 0\n     rx_prio0_pause: "
        "0\n";
    const DiagReport r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), host.env());
    for (const Finding &f : r.findings) {
        EXPECT_EQ(f.status, FindingStatus::kOk) << f.check << ": " << f.detail;
    }
    EXPECT_FALSE(r.failed());
    ASSERT_TRUE(r.selection);
    EXPECT_EQ(r.selection->gid_index, 3u);
    EXPECT_NE(find(r, "pause")->detail.find("rx_prio3_pause=12"), std::string::npos);
    EXPECT_NE(find(r, "gid")->detail.find("GID table of mlx5_0 port 1"), std::string::npos);
    EXPECT_NE(find(r, "pfc")->detail.find("alone"), std::string::npos);
}

TEST(Diag, QosMismatchesFailWithTheFixCommand) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    host.outputs["mlnx_qos -i eth0"] = mlnxQos("pcp", 0, "1   0   0   0   0   0   0   0");
    const DiagReport r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), host.env());
    EXPECT_TRUE(r.failed());
    const Finding *trust = find(r, "trust");
    ASSERT_NE(trust, nullptr);
    EXPECT_EQ(trust->status, FindingStatus::kFail);
    EXPECT_EQ(trust->fix, "mlnx_qos -i eth0 --trust dscp");
    const Finding *map = find(r, "dscp_map");
    EXPECT_EQ(map->status, FindingStatus::kFail);
    EXPECT_NE(map->detail.find("DSCP 26 -> priority 0"), std::string::npos) << map->detail;
    EXPECT_EQ(map->fix, "mlnx_qos -i eth0 --dscp2prio set,26,3");
    const Finding *pfc = find(r, "pfc");
    EXPECT_EQ(pfc->status, FindingStatus::kWarn);
    EXPECT_EQ(pfc->fix, "mlnx_qos -i eth0 --pfc 0,0,0,1,0,0,0,0");
}

TEST(Diag, DcbWhenMlnxQosIsMissing) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    host.outputs["dcb pfc show dev eth0 prio-pfc"] =
        "prio-pfc 0:off 1:off 2:off 3:on 4:on 5:off 6:off 7:off\n";
    host.outputs["dcb -N app show dev eth0 dscp-prio"] = "dscp-prio 26:3\n";
    const DiagReport r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), host.env());
    EXPECT_EQ(statusOf(r, "dscp_map"), FindingStatus::kOk);
    EXPECT_EQ(statusOf(r, "pfc"), FindingStatus::kWarn);  // also on 4
    EXPECT_EQ(find(r, "pfc")->fix, "dcb pfc set dev eth0 prio-pfc all:off 3:on");
    // dcb 6.1 cannot show the trust mode: a warning that says so, never a silent ok.
    EXPECT_EQ(statusOf(r, "trust"), FindingStatus::kWarn);
    EXPECT_NE(find(r, "trust")->detail.find("could not be read"), std::string::npos);
}

TEST(Diag, NoToolsIsAWarningNotASilentOk) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    const DiagReport r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), host.env());
    for (const char *c : {"trust", "dscp_map", "pfc", "pause"}) {
        EXPECT_EQ(statusOf(r, c), FindingStatus::kWarn) << c;
        EXPECT_NE(find(r, c)->detail.find("could not be r"), std::string::npos) << c;
    }
    EXPECT_FALSE(r.failed());
}

TEST(Diag, EcnCountersMemlockAndTclass) {
    SysfsTree t;
    t.standardHost();
    t.setEcn("eth0", 3, true, false);
    t.setCounter("mlx5_0", 1, "out_of_sequence", 42);
    t.setTclassOverride("mlx5_0", 1, 96);
    FakeHost host;
    DiagEnvironment env = host.env();
    env.memlock_bytes = 64 * 1024;
    const DiagReport r =
        runDiag(fabricConfig("tclass_override = \"adopt\""), SysfsRoot(t.rootString()), env);
    EXPECT_EQ(statusOf(r, "ecn"), FindingStatus::kWarn);
    EXPECT_NE(find(r, "ecn")->fix.find("roce_rp/enable/3"), std::string::npos);
    EXPECT_EQ(statusOf(r, "counters"), FindingStatus::kWarn);
    EXPECT_NE(find(r, "counters")->detail.find("out_of_sequence=42"), std::string::npos);
    EXPECT_EQ(statusOf(r, "memlock"), FindingStatus::kWarn);
    EXPECT_NE(find(r, "memlock")->fix.find("LimitMEMLOCK=infinity"), std::string::npos);
    EXPECT_EQ(statusOf(r, "traffic_class"), FindingStatus::kWarn);  // adopted: said
    ASSERT_TRUE(r.selection);
    EXPECT_EQ(r.selection->traffic_class, 96);

    // tclass_override = "fail": a failing finding, exit status 1.
    const DiagReport f = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), env);
    EXPECT_EQ(statusOf(f, "traffic_class"), FindingStatus::kFail);
    EXPECT_TRUE(f.failed());
    EXPECT_FALSE(f.selection);
    // The steps before still pass.
    EXPECT_EQ(statusOf(f, "gid"), FindingStatus::kOk);
    EXPECT_EQ(statusOf(f, "mtu"), FindingStatus::kOk);
}

TEST(Diag, DownPortFailsAndLaterStepsAreNotChecked) {
    SysfsTree t;
    t.standardHost();
    t.addPort("mlx5_0", 1, "1: DOWN", "3: Disabled");
    FakeHost host;
    const DiagReport r =
        runDiag(fabricConfig("transport = \"verbs\""), SysfsRoot(t.rootString()), host.env());
    EXPECT_EQ(statusOf(r, "port"), FindingStatus::kFail);
    EXPECT_NE(find(r, "port")->fix.find("ip link set dev eth0 up"), std::string::npos);
    EXPECT_EQ(statusOf(r, "gid"), FindingStatus::kWarn);
    EXPECT_NE(find(r, "gid")->detail.find("not checked"), std::string::npos);
    EXPECT_TRUE(r.failed());
}

TEST(Diag, FabricFailuresAreWarningsWhenTheTransportIsTcp) {
    const SysfsTree t;  // no RDMA device at all
    FakeHost host;
    const DiagReport auto_tcp = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), host.env());
    EXPECT_FALSE(auto_tcp.failed());
    EXPECT_EQ(statusOf(auto_tcp, "devices"), FindingStatus::kWarn);
    EXPECT_EQ(statusOf(auto_tcp, "transport"), FindingStatus::kWarn);
    const DiagReport verbs =
        runDiag(fabricConfig("transport = \"verbs\""), SysfsRoot(t.rootString()), host.env());
    EXPECT_TRUE(verbs.failed());
    EXPECT_EQ(statusOf(verbs, "devices"), FindingStatus::kFail);
}

TEST(Diag, GidIndexV1FailsRoceVersion) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    const DiagReport r =
        runDiag(fabricConfig("gid_index = 2"), SysfsRoot(t.rootString()), host.env());
    EXPECT_EQ(statusOf(r, "gid"), FindingStatus::kFail);
    EXPECT_EQ(statusOf(r, "roce_version"), FindingStatus::kFail);
}

TEST(Diag, PcieAndGpuDirect) {
    SysfsTree t;
    t.standardHost();
    // A GPU under the NIC's switch, and one on the other socket.
    t.addPci("devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0", "0x10de",
             "0x030200", 0);
    t.addPci("devices/pci0000:80/0000:80:01.0/0000:81:00.0", "0x10de", "0x030200", 1);
    FakeHost host;
    DiagEnvironment env = host.env();
    DiagReport r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), env);
    EXPECT_EQ(statusOf(r, "pcie"), FindingStatus::kOk);
    EXPECT_NE(find(r, "pcie")->detail.find("GPU 0000:04:00.0 PIX"), std::string::npos)
        << find(r, "pcie")->detail;
    EXPECT_NE(find(r, "pcie")->detail.find("GPU 0000:81:00.0 SYS"), std::string::npos);
    EXPECT_EQ(statusOf(r, "dmabuf"), FindingStatus::kOk);
    // Old kernel: nvidia-peermem is the fallback (warn); without it, GPUs cannot register.
    env.kernel_release = "5.4.0-150-generic";
    r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), env);
    EXPECT_EQ(statusOf(r, "dmabuf"), FindingStatus::kWarn);
    t.remove("module/nvidia_peermem");
    r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), env);
    EXPECT_EQ(statusOf(r, "dmabuf"), FindingStatus::kFail);
    // Only the far GPU: PCIe distance is a warning.
    t.remove("bus/pci/devices/0000:04:00.0");
    r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), host.env());
    EXPECT_EQ(statusOf(r, "pcie"), FindingStatus::kWarn);
}

TEST(Diag, PeersWithoutAProbeAreListedForTheRunningSidecarsProbe) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    const auto cfg =
        fabricConfig("", "[[peers]]\nname = \"node-b\"\naddress = \"10.0.0.3:18515\"\n");
    DiagEnvironment env = host.env();
    DiagReport r = runDiag(cfg, SysfsRoot(t.rootString()), env);
    // The sidecar's own preflight (no probe: it has no sessions yet) lists them.
    EXPECT_EQ(statusOf(r, "peers"), FindingStatus::kOk);
    EXPECT_NE(find(r, "peers")->detail.find("1 peer(s) configured"), std::string::npos);
    env.probe_peer = [](const config::PeerConfig &p) {
        return Finding{"peer " + p.name, FindingStatus::kOk, "round trip 7.1 us", ""};
    };
    r = runDiag(cfg, SysfsRoot(t.rootString()), env);
    EXPECT_EQ(statusOf(r, "peer node-b"), FindingStatus::kOk);
}

// The etcd directory's finding comes on every path: a tcp host skips the RDMA checks but not
// the directory (a merge once lost it there), and a verbs host has it too.
TEST(Diag, TheDirectoryFindingComesOverTcpAndVerbs) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    const std::string node_extra =
        "[directory]\nkind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\n"
        "cluster = \"prod\"\nadvertise = \"10.0.0.1:18515\"\n\n[security]\npeer_key_file = "
        "\"/nonexistent/peer.key\"\n";
    for (const char *transport : {"transport = \"tcp\"", "transport = \"verbs\""}) {
        const auto cfg = fabricConfig(transport, node_extra);
        DiagEnvironment env = host.env();
        DiagReport r = runDiag(cfg, SysfsRoot(t.rootString()), env);
        ASSERT_NE(find(r, "directory"), nullptr) << transport;
        EXPECT_NE(find(r, "directory")->detail.find("cluster 'prod'"), std::string::npos);
        env.probe_directory = [] {
            return Finding{"directory", FindingStatus::kOk,
                           "etcd x cluster 'prod' up, registered, 3 nodes", ""};
        };
        r = runDiag(cfg, SysfsRoot(t.rootString()), env);
        ASSERT_NE(find(r, "directory"), nullptr) << transport;
        EXPECT_NE(find(r, "directory")->detail.find("3 nodes"), std::string::npos) << transport;
    }
    // A static directory has no such finding.
    EXPECT_EQ(
        find(runDiag(fabricConfig("transport = \"tcp\""), SysfsRoot(t.rootString()), host.env()),
             "directory"),
        nullptr);
}

TEST(DiagJson, HasTheDocumentedShape) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    const DiagReport r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), host.env());
    const auto j = nlohmann::json::parse(diagJson(r));
    EXPECT_EQ(j["device"], "mlx5_0");
    EXPECT_EQ(j["port"], 1);
    EXPECT_EQ(j["netdev"], "eth0");
    EXPECT_EQ(j["gid_index"], 3);
    EXPECT_EQ(j["gid"], "0000:0000:0000:0000:0000:ffff:0a00:0002");
    EXPECT_EQ(j["roce_version"], "v2");
    EXPECT_EQ(j["traffic_class"], 106);
    EXPECT_EQ(j["traffic_class_source"], "config");
    EXPECT_EQ(j["path_mtu"], 4096);
    EXPECT_EQ(j["status"], "warn");  // no QoS tools in this fake host
    ASSERT_TRUE(j["findings"].is_array());
    ASSERT_FALSE(j["findings"].empty());
    for (const auto &f : j["findings"]) {
        EXPECT_TRUE(f["check"].is_string());
        EXPECT_TRUE(f["status"] == "ok" || f["status"] == "warn" || f["status"] == "fail");
        EXPECT_TRUE(f["detail"].is_string());
        EXPECT_TRUE(f["fix"].is_string());
    }
    // Without a selection the keys stay, as null.
    const SysfsTree empty;
    const auto n = nlohmann::json::parse(
        diagJson(runDiag(fabricConfig(""), SysfsRoot(empty.rootString()), host.env())));
    EXPECT_TRUE(n["gid_index"].is_null());
    EXPECT_TRUE(n["selection_error"].is_string());
}

TEST(DiagText, EveryNonOkFindingHasAFix) {
    SysfsTree t;
    t.standardHost();
    FakeHost host;
    DiagEnvironment env = host.env();
    env.memlock_bytes = 65536;
    const DiagReport r = runDiag(fabricConfig(""), SysfsRoot(t.rootString()), env);
    for (const Finding &f : r.findings) {
        if (f.status != FindingStatus::kOk) {
            EXPECT_FALSE(f.fix.empty()) << f.check << ": " << f.detail;
        }
    }
    const std::string text = diagText(r);
    EXPECT_NE(text.find("[warn] memlock"), std::string::npos) << text;
    EXPECT_NE(text.find("fix: systemd"), std::string::npos) << text;
}

}  // namespace
}  // namespace tensorlane::sidecar
