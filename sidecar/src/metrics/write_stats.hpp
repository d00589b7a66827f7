// What the engine counts for the metrics endpoint: per peer, the writes that ended (by status),
// their bytes, a latency histogram, and the writes that landed here from that peer.
//
// Owned and written by the engine thread alone, so plain integers: no atomics, no locks, no
// syscalls on the request path. The exposer never reads these; it asks the engine for a copy
// (SnapshotChannel), which the engine makes between two loop turns.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tensorlane/ipc/status.hpp"

namespace tensorlane::sidecar {

/// The steady clock in nanoseconds (CLOCK_MONOTONIC through the vDSO: no syscall).
inline int64_t monotonicNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/// Status codes a write can end with, indexed by their value (TL_OK .. TL_EINTERNAL).
inline constexpr size_t kStatusCodes = static_cast<size_t>(ipc::Code::kInternal) + 1;

/// Upper bounds of the latency histogram's buckets, in nanoseconds (1 us to 10 s, about three
/// per decade); a last, implicit bucket is +Inf. RoCE writes take microseconds, TCP on a
/// loaded host milliseconds, a write that waits out a peer timeout seconds.
inline constexpr std::array<uint64_t, 22> kLatencyBoundsNs = {
    1'000,         2'500,         5'000,         10'000,        25'000,      50'000,
    100'000,       250'000,       500'000,       1'000'000,     2'500'000,   5'000'000,
    10'000'000,    25'000'000,    50'000'000,    100'000'000,   250'000'000, 500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};
static_assert(std::is_sorted(kLatencyBoundsNs.begin(), kLatencyBoundsNs.end()));

/// Counters of the writes to one peer (and of those that came from it).
struct WriteStats {
    /// Writes that ended, whatever their status.
    uint64_t writes = 0;
    /// Bytes of the writes that completed (TL_OK: the data is in place at the target).
    uint64_t bytes = 0;
    /// Writes that ended with each status, indexed by the code's value.
    std::array<uint64_t, kStatusCodes> by_status{};
    /// Completed writes timed, per bucket (not cumulative); the last one is +Inf.
    std::array<uint64_t, kLatencyBoundsNs.size() + 1> latency_buckets{};
    /// Sum of the timed latencies, nanoseconds.
    uint64_t latency_sum_ns = 0;
    /// Writes from this peer that landed in a local region, and their bytes.
    uint64_t received_writes = 0;
    uint64_t received_bytes = 0;

    /// Completed writes in the histogram.
    uint64_t timed() const {
        uint64_t n = 0;
        for (uint64_t b : latency_buckets) {
            n += b;
        }
        return n;
    }
};

/// The engine's counters, one WriteStats per peer id (0: this node).
class EngineStats {
public:
    /// `names[id]` is the name of peer id `id` (names[0]: this node).
    explicit EngineStats(std::vector<std::string> names) : names_(std::move(names)) {
        peers_.resize(names_.size());
        for (size_t i = 0; i < names_.size(); ++i) {
            by_name_.emplace(names_[i], i);
        }
    }

    /// Whether writes are timed (the metrics endpoint is on): otherwise the request path does
    /// not even read the clock.
    bool timing() const { return timing_; }
    void setTiming(bool on) { timing_ = on; }

    /// The clock for timing writes: read at most once between two invalidateClock() calls, so
    /// a batch of requests taken off a ring (or of completions reported by a transport) costs
    /// one clock read, not one per write. The engine invalidates it where a batch starts.
    int64_t now() {
        if (now_ns_ == 0) {
            now_ns_ = monotonicNs();
        }
        return now_ns_;
    }
    void invalidateClock() { now_ns_ = 0; }

    /// A write to `peer` ended with `status`; `latency_ns` is from its acceptance (ignored
    /// when timing is off or the write failed).
    void writeEnded(uint32_t peer, ipc::Code status, uint64_t bytes, uint64_t latency_ns) {
        if (peer >= peers_.size()) {
            return;
        }
        WriteStats &s = peers_[peer];
        ++s.writes;
        const auto code = static_cast<size_t>(status);
        ++s.by_status[code < kStatusCodes ? code : kStatusCodes - 1];
        if (status != ipc::Code::kOk) {
            return;
        }
        s.bytes += bytes;
        if (timing_) {
            const auto *it =
                std::lower_bound(kLatencyBoundsNs.begin(), kLatencyBoundsNs.end(), latency_ns);
            ++s.latency_buckets[static_cast<size_t>(it - kLatencyBoundsNs.begin())];
            s.latency_sum_ns += latency_ns;
        }
    }

    /// A write from the peer named `peer` landed here (the owner is told, or was gone).
    void received(std::string_view peer, uint64_t bytes) {
        auto it = by_name_.find(peer);
        if (it == by_name_.end()) {
            return;
        }
        WriteStats &s = peers_[it->second];
        ++s.received_writes;
        s.received_bytes += bytes;
    }

    /// A request refused on its face (never accepted), by status.
    void rejected(ipc::Code status) {
        const auto code = static_cast<size_t>(status);
        ++rejected_[code < kStatusCodes ? code : kStatusCodes - 1];
    }

    const std::vector<std::string> &names() const { return names_; }
    const std::vector<WriteStats> &peers() const { return peers_; }
    const std::array<uint64_t, kStatusCodes> &rejectedByStatus() const { return rejected_; }

private:
    /// Lookups by a string_view without building a std::string (C++20 heterogeneous lookup).
    struct NameHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    std::vector<std::string> names_;
    std::unordered_map<std::string, size_t, NameHash, std::equal_to<>> by_name_;
    std::vector<WriteStats> peers_;
    std::array<uint64_t, kStatusCodes> rejected_{};
    bool timing_ = false;
    int64_t now_ns_ = 0;  ///< 0: read the clock on the next now()
};

}  // namespace tensorlane::sidecar
