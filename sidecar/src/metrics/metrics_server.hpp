// The Prometheus endpoint ([metrics] listen): GET /metrics on exactly the configured address,
// served by one thread of its own (apart from the engine's) over non-blocking sockets, the
// exposition written by prometheus-cpp's TextSerializer.
//
// A client cannot hold the endpoint: every connection must send its whole request header within
// kHeaderTimeoutMs of being accepted, and take its answer within kSendTimeoutMs; a source address
// keeps at most kConnectionsPerSource connections waiting for their request (a new one closes
// that source's oldest), and at most kMaxConnections are open at all (a new one closes the
// oldest still waiting). Waiting costs a socket and a small buffer, never a thread, so slow
// clients delay nobody. (civetweb, which served it before, gives each connection a worker thread
// while it reads the request: 16 slow-header connections held its 4 workers for 18 s.)
//
// Each scrape asks the engine for a snapshot (SnapshotChannel, answered between two loop turns)
// and reads the NIC's hw_counters through the sysfs root on the scraping thread. Nothing on
// the engine's request path changes when it is on, except that writes are timed (two clock
// reads per write, for the latency histograms).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "snapshot.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/fabric.hpp"
#include "tensorlane/sidecar/status.hpp"

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

    /// Where it listens, "127.0.0.1:9464".
    const std::string &address() const { return address_; }

    /// A connection must send its whole request header within this long of being accepted.
    static constexpr int kHeaderTimeoutMs = 2000;
    /// ... and take its whole answer within this long of its request.
    static constexpr int kSendTimeoutMs = 5000;
    /// Connections of one source address waiting for their request, at most.
    static constexpr size_t kConnectionsPerSource = 8;
    /// Connections open at all, at most.
    static constexpr size_t kMaxConnections = 64;
    /// The longest request header read (longer ones are answered 431).
    static constexpr size_t kMaxRequestBytes = 16 * 1024;

private:
    class Loop;
    MetricsServer() = default;

    std::string address_;
    // Created in this order, destroyed in reverse: the loop (and its thread) goes before the
    // collector it calls.
    std::shared_ptr<MetricsCollector> collector_;
    std::unique_ptr<Loop> loop_;
};

}  // namespace tensorlane::sidecar
