#include "diag_cmd.hpp"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/diag.hpp"
#include "tensorlane/sidecar/engine.hpp"
#include "tensorlane/tensorlane.h"

namespace tensorlane::tools {

namespace {

struct DiagOptions {
    std::string config_path;
    std::string sysfs_root;
    bool json = false;
    bool no_probe = false;
};

/// Exit statuses, as --help tells them.
constexpr int kExitOk = 0;
constexpr int kExitFail = 1;
constexpr int kExitConfig = 2;

/// The peer probe: through the node's running sidecar, writes of 64 bytes with an immediate
/// into each peer's kProbeRegionName, each waited for; reports the round trips.
class PeerProbe {
public:
    PeerProbe(std::string socket, int count) : socket_(std::move(socket)), count_(count) {}
    ~PeerProbe() { tl_disconnect(c_); }
    PeerProbe(const PeerProbe &) = delete;
    PeerProbe &operator=(const PeerProbe &) = delete;

    sidecar::Finding probe(const config::PeerConfig &peer) {
        using S = sidecar::FindingStatus;
        const std::string what = "peer " + peer.name + " (" + peer.address.text() + ")";
        if (!connectOnce()) {
            return {"peer", S::kWarn,
                    what + ": not probed: no sidecar answers on " + socket_ + " (" + why_ + ")",
                    "start the sidecar (systemctl start tensorlane-sidecar), then run diag again"};
        }
        const std::string fix =
            "check that the sidecar runs on " + peer.name + ", that [[peers]] address " +
            peer.address.text() + " is right and reachable (firewall: its listen port), and that " +
            "both nodes use the same key file; `tensorlane status` shows the peer's state and "
            "last error";
        tl_remote remote = 0;
        tl_status s = TL_EPEER;
        // A peer is dialled on first use: give the connection a moment.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
        while ((s = tl_lookup(c_, peer.name.c_str(), sidecar::kProbeRegionName, &remote,
                              nullptr)) == TL_EPEER &&
               std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        if (s != TL_OK) {
            return {"peer", S::kFail,
                    what + ": cannot reach its probe region: " + tl_status_str(s) + ": " +
                        tl_last_error(),
                    fix};
        }
        std::vector<double> us;
        for (int i = 0; i < count_; ++i) {
            tl_ticket t = 0;
            const auto t0 = std::chrono::steady_clock::now();
            s = tl_write(c_, buffer_, 0, remote, 0, 64, 0x7e570000u + static_cast<uint32_t>(i), &t);
            if (s == TL_OK) {
                s = tl_wait(c_, t, 2000);
            }
            if (s != TL_OK) {
                return {"peer", S::kFail,
                        what + ": probe write " + std::to_string(i + 1) +
                            " failed: " + tl_status_str(s) + ": " + tl_last_error(),
                        fix};
            }
            us.push_back(
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                    .count());
        }
        std::sort(us.begin(), us.end());
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      ": write with immediate round trip %.0f us median, %.0f us min (%d probes "
                      "of 64 B) over %s",
                      us[us.size() / 2], us.front(), count_, transportOf(peer.name).c_str());
        return {"peer", S::kOk, what + buf, ""};
    }

    /// The running sidecar's directory state as a finding.
    sidecar::Finding directory() {
        using S = sidecar::FindingStatus;
        if (!connectOnce()) {
            return {"directory", S::kWarn, "the sidecar is not running: " + why_, ""};
        }
        std::string buf(1 << 16, '\0');
        size_t len = 0;
        if (tl_sidecar_status(c_, buf.data(), buf.size(), &len) != TL_OK) {
            return {"directory", S::kWarn, "no status from the sidecar", ""};
        }
        buf.resize(std::min(len, buf.size() - 1));
        // The keys are sorted: "directory" (flat) precedes "peers", so a cut document has it.
        const size_t at = buf.find("\"directory\":");
        const size_t open = at == std::string::npos ? at : buf.find('{', at);
        const size_t end = open == std::string::npos ? open : buf.find('}', open);
        auto d = end == std::string::npos
                     ? nlohmann::json()
                     : nlohmann::json::parse(buf.substr(open, end + 1 - open), nullptr, false);
        if (!d.is_object()) {
            return {"directory", S::kWarn, "the sidecar reports no directory", ""};
        }
        const std::string detail =
            "etcd " + d.value("endpoint", "?") + " cluster '" + d.value("cluster", "?") + "' " +
            d.value("state", "?") +
            (d.value("registered", false) ? ", registered, " : ", not registered, ") +
            std::to_string(d.value("nodes", 0)) + " nodes";
        if (d.value("state", "") == "up" && d.value("registered", false)) {
            return {"directory", S::kOk, detail, ""};
        }
        return {"directory", S::kFail, detail + ": " + d.value("last_error", ""),
                "check that etcd answers at [directory] endpoints (etcdctl endpoint health) and "
                "the sidecar's log (tensorlane.sidecar.cluster)"};
    }

private:
    bool connectOnce() {
        if (c_ != nullptr) {
            return true;
        }
        if (!why_.empty()) {
            return false;
        }
        tl_status s = tl_connect(socket_.c_str(), &c_);
        if (s == TL_OK) {
            void *ptr = nullptr;
            s = tl_alloc_host(c_, 4096, &ptr, &buffer_);
        }
        if (s != TL_OK) {
            why_ = std::string(tl_status_str(s)) + ": " + tl_last_error();
            tl_disconnect(c_);
            c_ = nullptr;
            return false;
        }
        return true;
    }
    std::string transportOf(const std::string &peer) {
        std::string buf(1 << 16, '\0');
        size_t len = 0;
        if (tl_sidecar_status(c_, buf.data(), buf.size(), &len) != TL_OK) {
            return "?";
        }
        buf.resize(std::min(len, buf.size() - 1));
        auto j = nlohmann::json::parse(buf, nullptr, false);
        if (j.is_discarded()) {
            return "?";
        }
        for (const auto &p : j["peers"]) {
            if (p.value("name", "") == peer) {
                return p.value("transport", "?");
            }
        }
        return "?";
    }

    std::string socket_;
    int count_;
    tl_client *c_ = nullptr;
    tl_region buffer_ = 0;
    std::string why_;
};

int runDiagCommand(const DiagOptions &o) {
    // The key file is not the fabric's business: diag checks it no more than its path.
    auto parsed = config::parseFile(o.config_path, {.check_key_file = false});
    if (!parsed.ok()) {
        for (const auto &e : parsed.errors) {
            std::cerr << e.text() << "\n";
        }
        std::cerr << "tensorlane diag: " << o.config_path << ": " << parsed.errors.size()
                  << " error(s)\n";
        return kExitConfig;
    }
    const sidecar::SysfsRoot root = o.sysfs_root.empty() ? sidecar::SysfsRoot::fromEnvironment()
                                                         : sidecar::SysfsRoot(o.sysfs_root);
    sidecar::DiagEnvironment env = sidecar::DiagEnvironment::host();
    std::shared_ptr<PeerProbe> probe;
    if (!o.no_probe) {
        probe = std::make_shared<PeerProbe>(parsed.config->node.socket, 5);
        env.probe_peer = [probe](const config::PeerConfig &p) { return probe->probe(p); };
        env.probe_directory = [probe] { return probe->directory(); };
    }
    const sidecar::DiagReport report = sidecar::runDiag(*parsed.config, root, env);
    std::cout << (o.json ? sidecar::diagJson(report) : sidecar::diagText(report)) << "\n";
    return report.failed() ? kExitFail : kExitOk;
}

}  // namespace

void addDiagCommand(CLI::App &app, std::function<int()> *run) {
    auto opts = std::make_shared<DiagOptions>();
    auto *d = app.add_subcommand(
        "diag",
        "check this host's RDMA fabric against the config: devices and port state, the GID "
        "table and the index auto picks, RoCE version, MTU, the host-wide traffic class, "
        "DSCP/PFC/ECN, counters, GPU-NIC PCIe distance, dma-buf/nvidia-peermem, memlock");
    d->add_option("--config", opts->config_path, "the node's TOML configuration")
        ->required()
        ->check(CLI::ExistingFile);
    d->add_option("--sysfs-root", opts->sysfs_root,
                  "read sysfs from DIR instead of /sys (default: $TENSORLANE_SYSFS_ROOT or /sys)")
        ->check(CLI::ExistingDirectory);
    d->add_flag("--json", opts->json,
                "print one JSON object (device, port, netdev, gid_index, gid, roce_version, "
                "traffic_class, findings [{check, status, detail, fix}])");
    d->add_flag("--no-probe", opts->no_probe,
                "do not probe the peers (by default each configured peer gets five 64-byte "
                "writes with immediate through the running sidecar, and their round trip)");
    d->footer(
        "Each finding is ok, warn or fail, with the command that fixes it.\n"
        "Exit status: 0 when no finding fails (warnings allowed), 1 when any fails, 2 when the "
        "config cannot be read.");
    d->callback([run, opts] { *run = [opts] { return runDiagCommand(*opts); }; });
}

}  // namespace tensorlane::tools
