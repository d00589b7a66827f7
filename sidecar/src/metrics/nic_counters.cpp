#include "nic_counters.hpp"

#include <algorithm>
#include <charconv>

namespace tensorlane::sidecar {

namespace {

/// A decimal count, as the kernel prints hw_counters (a u64 and a newline, trimmed by read()).
bool parseCount(const std::string &text, uint64_t *out) {
    if (text.empty() || text.size() > 20) {
        return false;
    }
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size()) {
        return false;
    }
    *out = v;
    return true;
}

NicPortSample readPort(const SysfsRoot &root, const std::string &device, uint32_t port,
                       const std::string &state) {
    NicPortSample s;
    s.device = device;
    s.port = port;
    s.active = state == "ACTIVE";
    const std::string dir =
        "class/infiniband/" + device + "/ports/" + std::to_string(port) + "/hw_counters";
    for (const std::string &name : root.list(dir)) {
        // lifespan is how long the driver caches the counters (ms), a setting, not a count.
        if (name == "lifespan" || !plainCounterName(name)) {
            continue;
        }
        uint64_t v = 0;
        if (const auto text = root.read(dir + "/" + name); text && parseCount(*text, &v)) {
            s.counters.emplace_back(name, v);
        }
    }
    std::sort(s.counters.begin(), s.counters.end());
    return s;
}

}  // namespace

bool plainCounterName(const std::string &name) {
    return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_';
    });
}

std::vector<NicPortSample> readNicCounters(const config::Config &cfg, const SysfsRoot &root) {
    std::vector<NicPortSample> out;
    FabricSelection sel;
    if (selectFabric(cfg, root, &sel).isOk()) {
        out.push_back(readPort(root, sel.device, sel.port, sel.port_state));
        return out;
    }
    for (const DeviceInfo &d : listDevices(root)) {
        for (const PortInfo &p : d.ports) {
            out.push_back(readPort(root, d.name, p.port, p.state));
        }
    }
    return out;
}

}  // namespace tensorlane::sidecar
