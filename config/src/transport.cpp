// resolveTransport: which transport `[fabric] transport` means on this host, from sysfs alone.
//
// Only files are read (no libibverbs), so --check-config works on hosts without rdma-core and
// tests can point it at a fake tree. The verbs transport re-checks the device when it opens it.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/config/sysfs.hpp"

namespace tensorlane::config {
namespace {

/// Port directories are numbers; sort them as numbers so port 10 comes after port 2.
std::vector<std::string> listPorts(const SysfsRoot &root, const std::string &device_dir) {
    std::vector<std::string> ports = root.list(device_dir + "/ports");
    std::stable_sort(ports.begin(), ports.end(), [](const std::string &a, const std::string &b) {
        return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    return ports;
}

/// The state name of a port: sysfs writes "4: ACTIVE\n" (ib_port_state number and name).
std::string readPortState(const SysfsRoot &root, const std::string &state_file) {
    const std::optional<std::string> text = root.read(state_file);
    if (!text) {
        return "unreadable";
    }
    const std::string line = text->substr(0, text->find('\n'));
    const size_t colon = line.find(':');
    std::string state = colon == std::string::npos ? line : line.substr(colon + 1);
    const size_t first = state.find_first_not_of(" \t\r");
    const size_t last = state.find_last_not_of(" \t\r");
    if (first == std::string::npos) {
        return "empty";
    }
    return state.substr(first, last - first + 1);
}

/// Exactly ACTIVE: "5: ACTIVE_DEFER" also contains the word, but cannot carry traffic yet.
bool isActive(const std::string &state) {
    return state == "ACTIVE";
}

struct Probe {
    bool active = false;
    std::string detail;
};

constexpr const char *kIbDir = "class/infiniband";

Probe probeDevice(const SysfsRoot &root, const std::string &device, unsigned port) {
    const std::string dev_dir = std::string(kIbDir) + "/" + device;
    if (!root.exists(dev_dir)) {
        return {false, device + " not found under " + root.pathOf(kIbDir)};
    }
    const std::string state_file = dev_dir + "/ports/" + std::to_string(port) + "/state";
    if (!root.exists(state_file)) {
        return {false, device + " has no port " + std::to_string(port)};
    }
    const std::string state = readPortState(root, state_file);
    return {isActive(state), device + " port " + std::to_string(port) + " is " + state};
}

Probe probeAny(const SysfsRoot &root) {
    const std::vector<std::string> devices = root.list(kIbDir);
    if (devices.empty()) {
        return {false, "no RDMA device under " + root.pathOf(kIbDir)};
    }
    // Name every port that is not up, a few at most, so the reason says what to fix.
    constexpr size_t kMaxListed = 4;
    std::vector<std::string> down;
    size_t not_listed = 0;
    for (const auto &device : devices) {
        const std::string dev_dir = std::string(kIbDir) + "/" + device;
        const std::vector<std::string> ports = listPorts(root, dev_dir);
        if (ports.empty()) {
            if (down.size() < kMaxListed) {
                down.push_back(device + " has no ports");
            } else {
                ++not_listed;
            }
            continue;
        }
        for (const auto &port : ports) {
            const std::string state = readPortState(root, dev_dir + "/ports/" + port + "/state");
            if (isActive(state)) {
                return {true, device + " port " + port + " is ACTIVE"};
            }
            if (down.size() < kMaxListed) {
                down.push_back(device + " port " + port + " is " + state);
            } else {
                ++not_listed;
            }
        }
    }
    std::string detail;
    for (const auto &d : down) {
        detail += detail.empty() ? d : ", " + d;
    }
    if (not_listed != 0) {
        detail += " and " + std::to_string(not_listed) + " more not ACTIVE";
    }
    return {false, detail};
}

}  // namespace

TransportChoice resolveTransport(const Config &cfg, const std::string &sysfs_root_arg) {
    // The default root follows TENSORLANE_SYSFS_ROOT, as every other sysfs read of the sidecar
    // does (DESIGN.md), so callers that pass nothing agree with the fabric selection.
    const char *env = std::getenv(SysfsRoot::kEnvVar);
    const std::string sysfs_root =
        sysfs_root_arg == "/sys" && env != nullptr && *env != '\0' ? env : sysfs_root_arg;
    if (cfg.fabric.transport == TransportKind::kTcp) {
        return {TransportKind::kTcp, "set in the file"};
    }
    Probe probe;
    try {
        const SysfsRoot root(sysfs_root);
        probe = cfg.fabric.device == "auto" ? probeAny(root)
                                            : probeDevice(root, cfg.fabric.device, cfg.fabric.port);
    } catch (const std::exception &e) {
        probe = {false, std::string("cannot read sysfs: ") + e.what()};
    }
    if (cfg.fabric.transport == TransportKind::kVerbs) {
        // Explicit verbs is kept even without a device: the sidecar then fails loudly at start,
        // which is what someone who asked for verbs wants, rather than a silent TCP fallback.
        return {TransportKind::kVerbs, probe.active ? "set in the file; " + probe.detail
                                                    : "set in the file, but " + probe.detail};
    }
    return {probe.active ? TransportKind::kVerbs : TransportKind::kTcp, probe.detail};
}

}  // namespace tensorlane::config
