// The Prometheus endpoint ([metrics] listen): prometheus-cpp's Exposer (civetweb) serving
// GET /metrics on exactly the configured address, its threads apart from the engine's.
//
// Each scrape asks the engine for a snapshot (SnapshotChannel, answered between two loop turns)
// and reads the NIC's hw_counters through the sysfs root on the scraping thread. Nothing on
// the engine's request path changes when it is on, except that writes are timed (two clock
// reads per write, for the latency histograms).
#pragma once

#include <sys/socket.h>

#include <memory>
#include <string>

#include "snapshot.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/fabric.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace prometheus {
class Exposer;
}

namespace tensorlane::sidecar {

class MetricsCollector;

/// The running endpoint; stops (joins its threads) when destroyed.
class MetricsServer {
public:
    /// Starts serving `cfg.metrics.listen` (which must be set). kInvalid when the host does
    /// not resolve, kInternal with the reason (address in use, not an address of this host)
    /// when it cannot bind. Sets *error only on failure.
    static std::unique_ptr<MetricsServer> start(const config::Config &cfg, SysfsRoot root,
                                                std::shared_ptr<SnapshotChannel> channel,
                                                Status *error);
    ~MetricsServer();
    MetricsServer(const MetricsServer &) = delete;
    MetricsServer &operator=(const MetricsServer &) = delete;

    /// Where it listens, "127.0.0.1:9464" ("[::1]:9464" for IPv6).
    const std::string &address() const { return address_; }

private:
    MetricsServer() = default;

    std::string address_;
    /// Where a connection reaches the listener (loopback for a wildcard address): used to wake
    /// civetweb's accept loop at stop.
    sockaddr_storage wake_addr_{};
    socklen_t wake_len_ = 0;
    // Created in this order, destroyed in reverse: the exposer (and its threads) goes before
    // the collector it calls.
    std::shared_ptr<MetricsCollector> collector_;
    std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace tensorlane::sidecar
