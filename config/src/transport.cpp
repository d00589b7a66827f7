// resolveTransport: which transport `[fabric] transport` means on this host, from sysfs alone.
//
// Only files are read (no libibverbs), so --check-config works on hosts without rdma-core and
// tests can point it at a fake tree. The verbs transport re-checks the device when it opens it.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tensorlane/config/config.hpp"

namespace tensorlane::config {
namespace {

namespace fs = std::filesystem;

/// Entry names of `dir`, sorted; empty when it is missing or unreadable.
std::vector<std::string> listDir(const fs::path &dir) {
    std::vector<std::string> names;
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec) {
        return names;
    }
    for (const fs::directory_iterator end; it != end; it.increment(ec)) {
        if (ec) {
            break;
        }
        names.push_back(it->path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
}

/// Port directories are numbers; sort them as numbers so port 10 comes after port 2.
std::vector<std::string> listPorts(const fs::path &device_dir) {
    std::vector<std::string> ports = listDir(device_dir / "ports");
    std::stable_sort(ports.begin(), ports.end(), [](const std::string &a, const std::string &b) {
        return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    return ports;
}

/// The state name of a port: sysfs writes "4: ACTIVE\n" (ib_port_state number and name).
std::string readPortState(const fs::path &state_file) {
    std::ifstream in(state_file);
    std::string line;
    if (!in || !std::getline(in, line)) {
        return "unreadable";
    }
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

Probe probeDevice(const fs::path &ib_dir, const std::string &device, unsigned port) {
    std::error_code ec;
    if (!fs::exists(ib_dir / device, ec)) {
        return {false, device + " not found under " + ib_dir.string()};
    }
    const fs::path state_file = ib_dir / device / "ports" / std::to_string(port) / "state";
    if (!fs::exists(state_file, ec)) {
        return {false, device + " has no port " + std::to_string(port)};
    }
    const std::string state = readPortState(state_file);
    return {isActive(state), device + " port " + std::to_string(port) + " is " + state};
}

Probe probeAny(const fs::path &ib_dir) {
    const std::vector<std::string> devices = listDir(ib_dir);
    if (devices.empty()) {
        return {false, "no RDMA device under " + ib_dir.string()};
    }
    // Name every port that is not up, a few at most, so the reason says what to fix.
    constexpr size_t kMaxListed = 4;
    std::vector<std::string> down;
    size_t not_listed = 0;
    for (const auto &device : devices) {
        const std::vector<std::string> ports = listPorts(ib_dir / device);
        if (ports.empty()) {
            if (down.size() < kMaxListed) {
                down.push_back(device + " has no ports");
            } else {
                ++not_listed;
            }
            continue;
        }
        for (const auto &port : ports) {
            const std::string state = readPortState(ib_dir / device / "ports" / port / "state");
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
    const char *env = std::getenv("TENSORLANE_SYSFS_ROOT");
    const std::string sysfs_root =
        sysfs_root_arg == "/sys" && env != nullptr && *env != '\0' ? env : sysfs_root_arg;
    if (cfg.fabric.transport == TransportKind::kTcp) {
        return {TransportKind::kTcp, "set in the file"};
    }
    Probe probe;
    try {
        const fs::path ib_dir = fs::path(sysfs_root) / "class" / "infiniband";
        probe = cfg.fabric.device == "auto"
                    ? probeAny(ib_dir)
                    : probeDevice(ib_dir, cfg.fabric.device, cfg.fabric.port);
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
