// A copy of the engine's state for one scrape, and the hand-over between the exposer's threads
// and the engine thread.
//
// The engine's tables (sessions, regions, the peer layer, the transports) belong to the engine
// thread and take no locks. A scrape therefore never reads them: the exposer thread asks
// (SnapshotChannel::request rings an eventfd in the engine's epoll set), and the engine, between
// two loop turns, builds a Snapshot by value (its `tensorlane status` report plus its write
// counters) and hands it back. The engine pays for this only when scraped (every 15 s or so),
// and never waits: the one mutex guards the hand-over, never the data path.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/report.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "write_stats.hpp"

namespace tensorlane::sidecar {

/// One peer's counters at the time of the snapshot.
struct PeerSample {
    std::string name;
    /// This node itself (the local transport).
    bool local = false;
    WriteStats stats;
    /// Writes accepted and not ended, of which `queued` wait for their transport.
    uint64_t in_flight = 0;
    uint64_t queued = 0;
};

/// The engine's state for one scrape.
struct Snapshot {
    /// What `tensorlane status` shows (engine, clients, counters, peers, transports).
    EngineReport report;
    /// Index = peer id (0: this node).
    std::vector<PeerSample> peers;
    /// Requests refused on their face, by status.
    std::array<uint64_t, kStatusCodes> rejected{};
    /// Whether the engine times writes (the latency histograms are filled).
    bool timing = false;
};

/// The hand-over: any number of exposer threads request, the engine thread serves.
class SnapshotChannel {
public:
    /// kInternal when the eventfd cannot be made.
    static std::shared_ptr<SnapshotChannel> create(Status *error);

    /// Readable while a request waits: the engine polls it and then calls serve().
    int fd() const { return fd_.get(); }

    /// Any thread: asks the engine for a fresh snapshot and waits up to `timeout` for it.
    /// nullptr when the engine did not answer in time or the channel is closed.
    std::shared_ptr<const Snapshot> request(std::chrono::milliseconds timeout);

    /// The engine thread, when fd() is readable: builds one snapshot for every request that
    /// waits (they share it) with `build`.
    void serve(const std::function<Snapshot()> &build);

    /// Wakes every waiting request (they get nullptr) and refuses later ones: the engine is
    /// going away.
    void close();

private:
    SnapshotChannel() = default;

    ipc::UniqueFd fd_;
    std::mutex mutex_;
    std::condition_variable served_cv_;
    uint64_t requested_ = 0;  ///< the newest request's number
    uint64_t served_ = 0;     ///< the newest request a snapshot answered
    bool closed_ = false;
    std::shared_ptr<const Snapshot> latest_;
};

}  // namespace tensorlane::sidecar
