// The engine: the one progress loop (engine.cpp) and the parts it owns and drives.
//
//   ControlServer (control_server.hpp)  the client socket: admission, sessions, control calls
//   RequestPipeline (request_pipeline.hpp)  requests, per-peer queues, completions, notifications
//   RegionLifecycle (region_lifecycle.hpp)  quotas, registration, release and retirement
//
// EngineImpl keeps the loop (epoll, sleep and wake, the transports' progress and arm), the
// state every part shares (sessions, the region table, the transports, the peer layer, the
// counters), the metrics endpoint and the status document, and is the transports' EventSink,
// forwarding what they report to the request pipeline.
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "cluster_directory.hpp"
#include "control_server.hpp"
#include "engine_counters.hpp"
#include "metrics/snapshot.hpp"
#include "metrics/write_stats.hpp"
#include "region_lifecycle.hpp"
#include "request_pipeline.hpp"
#include "session_table.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "tensorlane/sidecar/transport.hpp"
#include "transport/local/local_transport.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {

class MetricsServer;

class EngineImpl final : public EventSink {
public:
    /// `remote`: the remote transports to use instead of the configured ones (empty: those).
    explicit EngineImpl(const config::Config &cfg,
                        std::vector<std::unique_ptr<Transport>> remote = {});
    ~EngineImpl() override;

    Status init();
    Status start();
    void run();
    void stop();
    /// The status document. With `only_uid`, the clients[] of that uid alone (a non-root
    /// client's tl_sidecar_status: it must not learn other users' pids and counters).
    EngineReport report(std::optional<uid_t> only_uid = std::nullopt,
                        ReportDetail want = ReportDetail::kFull) const;
    /// report() as `tensorlane status --json` prints it.
    std::string statusJson(std::optional<uid_t> only_uid = std::nullopt) const;

    // EventSink: transports report here, on the engine thread; the request pipeline handles it.
    void completed(uint64_t op_id, Code status, std::string_view reason) override {
        pipeline_->completed(op_id, status, reason);
    }
    void arrived(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                 std::string_view peer_name) override {
        pipeline_->arrived(region, imm, offset, bytes, peer_name);
    }
    void messageArrived(RegionId region, uint32_t imm, uint64_t offset,
                        std::span<const uint8_t> message, std::string_view peer_name) override {
        pipeline_->messageArrived(region, imm, offset, message, peer_name);
    }
    void peerState(PeerId peer, PeerState state, std::string_view reason) override;
    void inboundClosed(PeerId peer, std::string_view reason) override;

private:
    size_t pollEvents(int timeout_ms);
    /// Raises the sleep flags, then looks once more for work (Dekker). True: safe to sleep.
    bool armSleep();
    void disarmSleep();
    /// Progress of every transport, then of the peer layer.
    size_t progressTransports();
    /// Starts the Prometheus endpoint when [metrics] listen is set.
    Status startMetrics();
    /// The engine's state for one scrape (metrics/snapshot.hpp), built on the engine thread.
    Snapshot buildSnapshot() const;

    // Declared in the order they are made; destroyed in reverse (the parts first, holding
    // references to what comes before them).
    config::Config cfg_;  ///< [ipc] poll_mode resolved (never auto): see poll_choice_
    std::shared_ptr<spdlog::logger> log_;
    /// How [ipc] poll_mode was resolved for this host's CPUs, and why (logged, in the status).
    config::PollModeChoice poll_choice_;
    std::chrono::steady_clock::time_point started_;
    RegionTable regions_;
    /// Every transport, local first (what pollFds/arm/progress iterate); the peer layer binds
    /// the remote ones to peers.
    TransportSet transports_;
    std::vector<std::unique_ptr<Transport>> given_remote_;  ///< Engine::create's, until init()
    LocalTransport *local_ = nullptr;                       ///< transports_'s local one
    std::unique_ptr<PeerManager> peers_;
    /// The last "peer failed" warning per peer: the same reason again within kRepeatLogMs is
    /// logged at debug level and counted, then summed up in the next warning.
    struct FailedLog {
        std::string reason;
        int64_t at_ms = 0;
        uint64_t repeats = 0;
    };
    static constexpr int64_t kRepeatLogMs = 30000;
    std::unordered_map<PeerId, FailedLog> failed_logged_;
    /// The etcd directory ([directory] kind = "etcd"), feeding peers_.
    std::unique_ptr<ClusterDirectory> directory_;
    ipc::UniqueFd epoll_;
    ipc::UniqueFd stop_fd_;
    std::atomic<bool> stopping_{false};
    bool running_ = false;
    SessionTable sessions_;
    size_t last_poll_events_ = 0;
    EngineCounters counters_;
    /// Per-peer write counters and latency histograms for the metrics endpoint.
    EngineStats stats_;
    // The metrics endpoint ([metrics] listen; null when off). The channel outlives the server:
    // the server's threads wait on it.
    std::shared_ptr<SnapshotChannel> metrics_channel_;
    std::unique_ptr<MetricsServer> metrics_;
    // The parts, made by init() once the transports and the peer layer exist.
    std::optional<RegionLifecycle> region_lifecycle_;
    std::optional<RequestPipeline> pipeline_;
    std::optional<ControlServer> control_;
};

}  // namespace tensorlane::sidecar
