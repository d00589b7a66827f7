// What the engine counts for the metrics endpoint: per peer, the writes that ended (by status),
// their bytes, a latency histogram, and the writes that landed here from that peer.
//
// Owned and written by the engine thread alone, so plain integers: no atomics, no locks, no
// syscalls on the request path. The exposer never reads these; it asks the engine for a copy
// (SnapshotChannel), which the engine makes between two loop turns.
//
// What a timed write costs the engine thread (issue 20; docs/benchmarks.md): one WriteClock
// reading per drain of the rings (its acceptance, shared by the batch), and one per engine turn
// after the turn's completions are published (its end, shared likewise and off the writer's
// path: the writer already has its completion); a bucket found with one count-leading-zeros and
// one compare; no allocation (the list of writes waiting for their end stamp keeps its
// capacity). Arrivals find their peer without hashing when they come from the same peer as the
// one before.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tensorlane/ipc/status.hpp"
#include "write_clock.hpp"

namespace tensorlane::sidecar {

/// Status codes a write can end with, indexed by their value (TL_OK .. TL_EDEADLINE).
inline constexpr size_t kStatusCodes = static_cast<size_t>(ipc::kLastCode) + 1;

/// Upper bounds of the latency histogram's buckets, in nanoseconds (1 us to 10 s, about three
/// per decade); a last, implicit bucket is +Inf. RoCE writes take microseconds, TCP on a
/// loaded host milliseconds, a write that waits out a peer timeout seconds.
inline constexpr std::array<uint64_t, 22> kLatencyBoundsNs = {
    1'000,         2'500,         5'000,         10'000,        25'000,      50'000,
    100'000,       250'000,       500'000,       1'000'000,     2'500'000,   5'000'000,
    10'000'000,    25'000'000,    50'000'000,    100'000'000,   250'000'000, 500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};
static_assert(std::is_sorted(kLatencyBoundsNs.begin(), kLatencyBoundsNs.end()));

namespace detail {

/// Each bound at least twice the one before: then a power-of-two range [2^(w-1), 2^w) holds at
/// most one bound, and a latency's bucket is the first bound at or above 2^(w-1) or the next.
constexpr bool boundsAtLeastDouble() {
    for (size_t i = 1; i < kLatencyBoundsNs.size(); ++i) {
        if (kLatencyBoundsNs[i] < 2 * kLatencyBoundsNs[i - 1]) {
            return false;
        }
    }
    return true;
}
static_assert(boundsAtLeastDouble());

struct BucketTable {
    /// By std::bit_width of the latency: the first bound >= 2^(width-1) (0 for width 0).
    std::array<uint8_t, 65> first{};
    /// The bounds, then UINT64_MAX standing for +Inf (no latency is above it).
    std::array<uint64_t, kLatencyBoundsNs.size() + 1> bounds{};
};

constexpr BucketTable makeBucketTable() {
    BucketTable t;
    for (size_t i = 0; i < kLatencyBoundsNs.size(); ++i) {
        t.bounds[i] = kLatencyBoundsNs[i];
    }
    t.bounds.back() = UINT64_MAX;
    for (size_t w = 0; w < t.first.size(); ++w) {
        const uint64_t low = w == 0 ? 0 : uint64_t{1} << (w - 1);
        size_t i = 0;
        while (i < kLatencyBoundsNs.size() && kLatencyBoundsNs[i] < low) {
            ++i;
        }
        t.first[w] = static_cast<uint8_t>(i);
    }
    return t;
}

inline constexpr BucketTable kBucketTable = makeBucketTable();

}  // namespace detail

/// The histogram bucket of a latency: the first bound >= `ns` (bounds are inclusive, as
/// Prometheus' `le`), kLatencyBoundsNs.size() for +Inf. The same answer as std::lower_bound
/// over kLatencyBoundsNs, with one count-leading-zeros, one table load and one compare.
constexpr size_t latencyBucket(uint64_t ns) {
    const size_t i = detail::kBucketTable.first[static_cast<size_t>(std::bit_width(ns))];
    return i + (ns > detail::kBucketTable.bounds[i] ? 1 : 0);
}
static_assert(latencyBucket(0) == 0 && latencyBucket(1'000) == 0 && latencyBucket(1'001) == 1);
static_assert(latencyBucket(10'000'000'000) == kLatencyBoundsNs.size() - 1);
static_assert(latencyBucket(10'000'000'001) == kLatencyBoundsNs.size());
static_assert(latencyBucket(UINT64_MAX) == kLatencyBoundsNs.size());

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

    /// Peer id `id` (the next one) is `name`: a peer the cluster directory added.
    void addPeer(size_t id, std::string name) {
        if (id != names_.size()) {
            return;
        }
        by_name_.emplace(name, id);
        names_.push_back(std::move(name));
        peers_.emplace_back();
    }

    /// Whether writes are timed (the metrics endpoint is on): otherwise the request path does
    /// not even read the clock.
    bool timing() const { return timing_; }
    /// Turning timing on picks and calibrates the clock (WriteClock::calibrated(): a few
    /// milliseconds, once) unless setClock() gave one.
    void setTiming(bool on) {
        timing_ = on;
        if (on && !clock_set_) {
            setClock(WriteClock::calibrated());
        }
    }
    /// The clock writes are timed with (tests: the steady clock, WriteClock{}).
    void setClock(WriteClock clock) {
        clock_ = clock;
        clock_set_ = true;
        ended_.reserve(kEndedCapacity);
    }
    const WriteClock &clock() const { return clock_; }

    /// The clock for stamping accepted writes: read at most once between two invalidateClock()
    /// calls, so a batch of requests taken off a ring costs one clock read, not one per write.
    /// The engine invalidates it where a drain starts.
    int64_t now() {
        if (now_ns_ == 0) {
            now_ns_ = clock_.nowNs();
        }
        return now_ns_;
    }
    void invalidateClock() { now_ns_ = 0; }

    /// A write to `peer` ended with `status`; `latency_ns` is from its acceptance (ignored
    /// when timing is off or the write failed).
    void writeEnded(uint32_t peer, ipc::Code status, uint64_t bytes, uint64_t latency_ns) {
        if (count(peer, status, bytes) && timing_) {
            record(peers_[peer], latency_ns);
        }
    }

    /// The engine's form: a write to `peer` ended with `status`; `accepted_ns` is its now()
    /// stamp at acceptance (0: not timed). Counted at once; a completed timed write's latency
    /// runs to the next timeEnded(), which the engine calls once per turn after publishing the
    /// turn's completions.
    void writeEndedSince(uint32_t peer, ipc::Code status, uint64_t bytes, int64_t accepted_ns) {
        if (count(peer, status, bytes) && timing_ && accepted_ns != 0) {
            ended_.push_back({peer, accepted_ns});
        }
    }

    /// Reads the clock once if writes ended since the last call and records their latencies
    /// (a reading below a write's stamp, from another CPU's marginally different counter,
    /// counts as 0). Cheap when none did: one compare.
    void timeEnded() {
        if (ended_.empty()) {
            return;
        }
        const int64_t end = clock_.nowNs();
        for (const Ended &e : ended_) {
            record(peers_[e.peer],
                   static_cast<uint64_t>(std::max<int64_t>(0, end - e.accepted_ns)));
        }
        ended_.clear();  // keeps its capacity: no allocation per turn
    }
    /// Writes waiting for timeEnded().
    size_t endedUntimed() const { return ended_.size(); }

    /// A write from the peer named `peer` landed here (the owner is told, or was gone).
    void received(std::string_view peer, uint64_t bytes) {
        // Arrivals come in runs from one peer (a local write's, a transport's batch): the last
        // one's peer is tried first, a string compare instead of a hash and a lookup.
        size_t id = last_received_;
        if (id >= names_.size() || names_[id] != peer) {
            auto it = by_name_.find(peer);
            if (it == by_name_.end()) {
                return;
            }
            id = it->second;
            last_received_ = id;
        }
        WriteStats &s = peers_[id];
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
    /// A completed timed write waiting for its end stamp.
    struct Ended {
        uint32_t peer;
        int64_t accepted_ns;
    };
    /// Room for the writes of a busy turn before the list grows (and then keeps its size).
    static constexpr size_t kEndedCapacity = 1024;

    /// Counts a write that ended; true when it completed (TL_OK) and is a known peer's.
    bool count(uint32_t peer, ipc::Code status, uint64_t bytes) {
        if (peer >= peers_.size()) {
            return false;
        }
        WriteStats &s = peers_[peer];
        ++s.writes;
        const auto code = static_cast<size_t>(status);
        ++s.by_status[code < kStatusCodes ? code : kStatusCodes - 1];
        if (status != ipc::Code::kOk) {
            return false;
        }
        s.bytes += bytes;
        return true;
    }
    static void record(WriteStats &s, uint64_t latency_ns) {
        ++s.latency_buckets[latencyBucket(latency_ns)];
        s.latency_sum_ns += latency_ns;
    }

    std::vector<std::string> names_;
    std::unordered_map<std::string, size_t, NameHash, std::equal_to<>> by_name_;
    std::vector<WriteStats> peers_;
    std::array<uint64_t, kStatusCodes> rejected_{};
    std::vector<Ended> ended_;
    WriteClock clock_;
    bool timing_ = false;
    bool clock_set_ = false;
    int64_t now_ns_ = 0;        ///< 0: read the clock on the next now()
    size_t last_received_ = 0;  ///< the peer of the last arrival
};

}  // namespace tensorlane::sidecar
