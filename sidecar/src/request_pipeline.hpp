// The request path: requests taken from each session's ring and validated from a private copy,
// accepted into the queue of their target peer, posted to the TransportSet, and ended exactly
// once on the client's completion ring (and in its stream slot); the notifications of writes
// that landed here, into their owners' rings; the gated writes of the stream-ordered calls,
// posted once the client's GPU stream opens their gate; and the backlogs of clients whose rings
// are full. No syscalls and no logging here except rate-limited reasons for rejected requests.
//
// Back-pressure, in two places (DESIGN.md, "Each session has a cap on requests in flight (the
// rest waits in its ring) and each peer its own queue"):
// - a session with [limits] in_flight requests accepted and not ended is not drained further:
//   the rest waits in its ring, whose fullness the shim reports as TL_EAGAIN;
// - an accepted write waits in its target peer's queue while that peer's transport is full
//   (kAgain), so a slow or full peer holds back only the writes to it, never a session's writes
//   to other peers.
//
// Engine thread only. The engine forwards its EventSink (completed, arrived) here.
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine_counters.hpp"
#include "metrics/write_stats.hpp"
#include "session_table.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

class PeerManager;
class RegionLifecycle;
class TransportSet;

class RequestPipeline {
public:
    /// No stream slot (a request without kRequestHasSlot).
    static constexpr uint32_t kNoSlot = UINT32_MAX;
    /// An accepted request until it ends.
    struct PendingOp {
        SessionId session;
        uint64_t ticket;
        uint64_t bytes;
        std::shared_ptr<Region> src;  ///< counts as a user until the op ends
        std::shared_ptr<Region> dst;  ///< local writes: the target, also a user
        PeerId peer = kLocalPeer;
        int64_t accepted_ns = 0;  ///< EngineStats::now() at acceptance; 0 when not timed
        uint32_t slot = kNoSlot;  ///< its stream TicketSlot (Request.slot)
        uint32_t writer_uid = 0;  ///< the writer's uid, for the target's notification
    };
    /// Accepted writes to one peer that its transport could not take yet, oldest first.
    struct PeerQueue {
        std::deque<WriteOp> ops;
    };

    /// `in_flight_cap`: [limits] in_flight. `peers` may be null (no [[peers]]). All references
    /// must outlive this object.
    RequestPipeline(uint64_t in_flight_cap, SessionTable &sessions, RegionTable &regions,
                    RegionLifecycle &lifecycle, TransportSet &transports, PeerManager *peers,
                    EngineStats &stats, EngineCounters &counters);
    RequestPipeline(const RequestPipeline &) = delete;
    RequestPipeline &operator=(const RequestPipeline &) = delete;

    // ---- one engine turn, in this order (engine.cpp, run())
    /// Takes requests from every session served now; returns how many.
    size_t drainRequests();
    /// Posts gated writes whose gate opened and hands over stream notifications; returns work.
    size_t pollStreams();
    /// Posts queued writes, per peer in order, while their transports take them.
    size_t pumpQueues();
    /// Publishes every session's rings; returns backlog entries moved into them. A session
    /// whose ring cursors the client corrupted is closed.
    size_t publishAll();

    /// Takes up to a batch of requests of one session while it has fewer than `cap` in flight
    /// (tl_deregister drains the ring first, past the cap); returns how many.
    uint32_t drainSession(Session &s, uint64_t cap);
    /// Whether drainRequests() takes requests of `s` now: its completion backlog is below a
    /// ring's worth and it has fewer than [limits] in_flight requests in flight.
    bool served(const Session &s) const {
        return s.completion_backlog.size() < s.completions.depth() && s.in_flight < cap_;
    }

    // ---- the transports' events (EventSink, forwarded by the engine)
    /// A write ended: its users let go, its ticket ends on the writer's completion ring.
    void completed(uint64_t op_id, Code status, std::string_view reason);
    /// Data landed in a local region: a notification for its owner. A local transport's
    /// arrival is held until the completed() that follows it names the writer.
    void arrived(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                 std::string_view peer_name);
    /// Around one transport's progress(): `local` when it is the local transport, whose
    /// arrivals come each right before the completion of the same write (local_transport.hpp).
    void beginProgress(bool local) { in_local_progress_ = local; }
    void endProgress();

    // ---- sessions
    /// `s` has a stream segment now (tl_write_on_stream, tl_stream_wait_*): pollStreams()
    /// watches it.
    void addStreamSession(SessionId id) { stream_sessions_.push_back(id); }
    /// `s` is going: its writes still waiting for a transport or for their stream's gate end
    /// here (kConnection) and let go of their memory. Returns how many.
    size_t dropSession(Session &s);

    // ---- sleeping
    /// Whether a session waits on its GPU (a held gate, a hand-over): the engine looks again
    /// soon rather than sleeping long.
    bool streamsUrgent() const { return !stream_sessions_.empty() && anyStreamUrgent(); }
    /// streamsUrgent() and a gate or hand-over moved in the last 2 ms: the GPU cannot ring our
    /// doorbell, so the engine does not sleep yet.
    bool watchingStreams() const;

    // ---- status
    /// Writes waiting in peers' queues.
    size_t queued() const { return queued_; }
    /// Accepted writes not ended yet.
    size_t inFlight() const { return ops_.size(); }
    const std::unordered_map<uint64_t, PendingOp> &ops() const { return ops_; }
    const std::unordered_map<PeerId, PeerQueue> &queues() const { return queues_; }

private:
    /// A local write's arrival, held until the completion that follows it names the op (and so
    /// the writer).
    struct HeldArrival {
        RegionId region = 0;
        uint32_t imm = 0;
        uint64_t offset = 0;
        uint64_t bytes = 0;
        /// The transport's own node name: valid for the progress() call that reported it,
        /// and the arrival never outlives that call.
        std::string_view peer;
    };

    /// Handles one copied-out request: completes it, rejects it, or accepts it into its peer's
    /// queue (then it ends exactly once through completed()).
    void handleRequest(Session &s, const ipc::Request &r);
    void reject(Session &s, const ipc::Request &r, Code code, const char *why);
    /// Ends a request on the client's completion ring (and in its stream slot, if it has one);
    /// a client whose backlog overflows is closed.
    void completeOrClose(Session &s, uint64_t ticket, Code status, uint64_t bytes,
                         uint32_t slot = kNoSlot);
    /// An accepted write: posted now when its peer's queue is empty and the transport takes
    /// it, else queued behind the others.
    void enqueue(WriteOp op);
    /// Posts `op` to its transport. False: the transport is full (kAgain); true: it was taken
    /// or it ended at once (completed() ran).
    bool postNow(const WriteOp &op);
    /// arrived() with the writer's uid (ipc::kWriterUidPeer for a peer's write).
    void notifyArrival(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                       std::string_view peer_name, uint32_t writer_uid);
    /// Delivers a held local arrival with `writer_uid`, if one is held.
    void releaseHeldArrival(uint32_t writer_uid);
    bool anyStreamUrgent() const;

    const uint64_t cap_;
    SessionTable &sessions_;
    RegionTable &regions_;
    RegionLifecycle &lifecycle_;
    TransportSet &transports_;
    PeerManager *const peers_;
    EngineStats &stats_;
    EngineCounters &counters_;
    std::shared_ptr<spdlog::logger> log_;
    uint64_t next_op_ = 1;
    std::unordered_map<uint64_t, PendingOp> ops_;
    std::unordered_map<PeerId, PeerQueue> queues_;
    size_t queued_ = 0;  ///< ops waiting in queues_
    /// True while the local transport's progress() reports (its arrivals are held).
    bool in_local_progress_ = false;
    std::optional<HeldArrival> held_arrival_;
    /// Sessions with stream segments (pollStreams looks at these only).
    std::vector<SessionId> stream_sessions_;
    std::chrono::steady_clock::time_point streams_moved_{};  ///< last gate or hand-over
};

}  // namespace tensorlane::sidecar
