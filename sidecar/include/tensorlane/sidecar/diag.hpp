// `tensorlane diag`: the fabric checked against the config, one finding per check, each with
// what was seen and the command that fixes it. The sidecar runs the same checks at start as its
// preflight ([fabric] preflight = "warn" | "fail").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/fabric.hpp"

namespace tensorlane::sidecar {

/// How a check came out. Exit status of `tensorlane diag`: 0 when none is kFail, else 1.
enum class FindingStatus { kOk, kWarn, kFail };
/// "ok", "warn", "fail".
const char *toString(FindingStatus s);

/// One check's outcome.
struct Finding {
    /// A stable name: "devices", "port", "gid", "roce_version", "mtu", "traffic_class", "trust",
    /// "dscp_map", "pfc", "ecn", "counters", "pause", "pcie", "dmabuf", "memlock", "peers"...
    std::string check;
    FindingStatus status = FindingStatus::kOk;
    /// What was seen.
    std::string detail;
    /// A concrete command or edit that fixes it; empty when there is nothing to fix.
    std::string fix;
};

/// What diag reads besides sysfs. host() is the real machine; tests replace members.
struct DiagEnvironment {
    /// Runs a helper program (mlnx_qos, dcb, ethtool); nullopt when it is missing or fails.
    std::function<std::optional<std::string>(const std::vector<std::string> &argv)> run;
    /// RLIMIT_MEMLOCK soft limit in bytes; UINT64_MAX for unlimited; nullopt when unknown.
    std::optional<uint64_t> memlock_bytes;
    /// Whether the process has CAP_IPC_LOCK (which lifts RLIMIT_MEMLOCK for MR pinning).
    std::optional<bool> cap_ipc_lock;
    /// uname -r, e.g. "6.1.0-18-amd64".
    std::string kernel_release;
    /// Whether libibverbs.so.1 exports ibv_reg_dmabuf_mr (rdma-core >= 34); nullopt: no
    /// libibverbs at all.
    std::optional<bool> has_reg_dmabuf_mr;
    /// Sends writes with immediate to `peer` through the running sidecar and reports their
    /// round trip (`tensorlane diag` sets it; unset, the peers are listed, not probed).
    std::function<Finding(const config::PeerConfig &peer)> probe_peer;
    /// The etcd directory's state as the running sidecar reports it ([directory] kind = "etcd";
    /// `tensorlane diag` sets it); unset: a finding that says where to look.
    std::function<Finding()> probe_directory;

    /// The running host: PATH programs, getrlimit, uname, dlopen("libibverbs.so.1").
    static DiagEnvironment host();
};

/// Everything diag found.
struct DiagReport {
    /// The config file checked, and the sysfs root read.
    std::string config_source;
    std::string sysfs_root;
    /// What the transport resolves to on this host, and why.
    config::TransportChoice transport;
    /// Set when selectFabric succeeded.
    std::optional<FabricSelection> selection;
    /// selectFabric's error when it failed.
    std::string selection_error;
    /// In check order.
    std::vector<Finding> findings;
    /// Any finding is kFail.
    bool failed() const;
};

/// Runs every check. Fabric failures are reported as warnings when the transport does not
/// resolve to verbs (the sidecar then does not use the NIC). Never throws.
DiagReport runDiag(const config::Config &cfg, const SysfsRoot &root, const DiagEnvironment &env);

/// The report for people: a header with the selection, then one block per finding.
std::string diagText(const DiagReport &report);
/// One JSON object: device, port, netdev, gid_index, gid, roce_version, traffic_class,
/// traffic_class_source, active_mtu, path_mtu, transport, status, findings [{check, status,
/// detail, fix}] (the selection's keys are null when selection failed). No final newline.
std::string diagJson(const DiagReport &report);
/// The selection as a JSON object (the same keys as diagJson's, plus the reasons), or
/// {"error": ...} when `selection` is empty. No final newline.
std::string selectionJson(const std::optional<FabricSelection> &selection,
                          const std::string &error);

}  // namespace tensorlane::sidecar
