// libFuzzer target for the config parser: any bytes go in, and parseString must return either a
// config that describes cleanly or errors that each have a one-line text; never crash or throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tensorlane/config/config.hpp"

namespace {

using namespace tensorlane::config;

/// Stops the run with a crash libFuzzer reports (and saves the input for).
void check(bool condition) {
    if (!condition) {
        std::abort();
    }
}

/// What validation promises about every accepted config.
void checkInvariants(const Config &c) {
    check(c.fabric.dscp <= 63 && c.fabric.pfc_priority <= 7 && c.fabric.timeout <= 31);
    check(c.fabric.retry_cnt <= 7 && c.fabric.rnr_retry <= 7 && c.fabric.min_rnr_timer <= 31);
    check(c.fabric.port >= 1 && c.fabric.qps_per_peer >= 1 && c.fabric.qps_per_peer <= 64);
    check(c.ipc.ring_depth >= 16 && c.ipc.ring_depth <= 65536 &&
          (c.ipc.ring_depth & (c.ipc.ring_depth - 1)) == 0);
    check(c.tcp.reconnect_min_ms <= c.tcp.reconnect_max_ms);
    check(!c.node.socket.empty() && c.node.socket.front() == '/' && c.node.socket.size() < 108);
    check(c.node.listen.port != 0 && !c.node.listen.host.empty());
    for (const auto &peer : c.peers) {
        check(peer.address.port != 0 && !peer.address.host.empty() && peer.name != c.node.name);
        check(c.findPeer(peer.name) == &peer);  // names are unique
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string_view text(reinterpret_cast<const char *>(data), size);
    const ParseResult r = parseString(text, "fuzz.toml", ParseOptions{.check_key_file = false});
    check(r.config.has_value() == r.errors.empty());
    if (!r.ok()) {
        for (const auto &e : r.errors) {
            const std::string line = e.text();
            check(!line.empty() && line.find('\n') == std::string::npos);
        }
        return 0;
    }
    checkInvariants(*r.config);
    // A root that does not exist keeps runs independent of this host's RDMA devices.
    const TransportChoice choice = resolveTransport(*r.config, "/nonexistent-sysfs");
    check(choice.kind != TransportKind::kAuto);
    check(!describeText(*r.config, choice).empty());
    check(nlohmann::json::accept(describeJson(*r.config, choice)));
    return 0;
}
