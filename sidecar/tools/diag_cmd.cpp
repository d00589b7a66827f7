#include "diag_cmd.hpp"

#include <iostream>
#include <memory>
#include <string>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/diag.hpp"

namespace tensorlane::tools {

namespace {

struct DiagOptions {
    std::string config_path;
    std::string sysfs_root;
    bool json = false;
};

/// Exit statuses, as --help tells them.
constexpr int kExitOk = 0;
constexpr int kExitFail = 1;
constexpr int kExitConfig = 2;

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
    const sidecar::DiagReport report =
        sidecar::runDiag(*parsed.config, root, sidecar::DiagEnvironment::host());
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
    d->footer(
        "Each finding is ok, warn or fail, with the command that fixes it.\n"
        "Exit status: 0 when no finding fails (warnings allowed), 1 when any fails, 2 when the "
        "config cannot be read.");
    d->callback([run, opts] { *run = [opts] { return runDiagCommand(*opts); }; });
}

}  // namespace tensorlane::tools
