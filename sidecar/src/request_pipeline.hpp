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
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine_counters.hpp"
#include "ex_message.hpp"
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
        /// A part of a kWriteEx request (request_ex.cpp): its ExOp's id, and which part
        /// (an entry's index, entries + k for its k-th scattered op, or kExRecordPart for a
        /// begin/payload/end record). 0: none.
        uint64_t ex = 0;
        uint32_t ex_part = 0;
        bool probe = false;  ///< into a peer's probe region: not in the per-peer write stats
    };
    static constexpr uint32_t kExRecordPart = UINT32_MAX;
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
    /// A message (an ExMessage record) landed in a local region (request_ex.cpp).
    void messageArrived(RegionId region, uint32_t imm, uint64_t offset,
                        std::span<const uint8_t> message, std::string_view peer_name);
    /// The session `peer_name` opened to us closed: its groups in flight here end (kPeer).
    void inboundClosed(std::string_view peer_name);

    // ---- deadlines of kWriteEx requests (request_ex.cpp)
    /// Ends what is past its deadline, at either end; returns how many ended. Cheap (no clock
    /// read) while nothing has a deadline.
    size_t pollDeadlines();
    /// Milliseconds until the next deadline, at most `cap` (the engine's sleep).
    int msToNextDeadline(int cap) const;
    /// kWriteEx requests in flight, and groups the target side watches (status, tests).
    size_t exInFlight() const { return ex_ops_.size(); }
    size_t groupsWatched() const { return in_groups_.size(); }
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
        std::vector<uint8_t> message;  ///< a message's record (messageArrived)
    };

    /// A kWriteEx request at the writer, from acceptance until its last part ended.
    struct ExOp {
        SessionId session = 0;
        uint32_t writer_uid = 0;
        uint64_t ticket = 0;
        uint32_t slot = kNoSlot;
        PeerId peer = kLocalPeer;
        /// Where the description lies in the client's region (the entries' statuses go back
        /// there): region, offset of the first entry, entries.
        RegionId desc_region = 0;
        uint64_t entries_offset = 0;
        uint32_t entries = 0;
        std::vector<int32_t> status;  ///< per entry; kPendingPart until it ends
        /// The entries of each scattered op (part entries + k), in its extents' order.
        std::vector<std::vector<uint32_t>> merged;
        uint32_t outstanding = 0;  ///< parts posted and not ended
        Code first = Code::kOk;    ///< the first failure
        bool grouped = false;      ///< begin/end records (a group, or a deadline)
        bool posting = true;       ///< its parts are being posted (nothing ends it meanwhile)
        bool end_posted = false;
        bool ticket_ended = false;
        int64_t deadline_ms = 0;  ///< steady ms; 0: none
        uint64_t bytes = 0;       ///< the entries' sum
        /// The end (or payload) record's template and the op that carries records.
        ExMessage record;
        WriteOp carrier;
    };
    static constexpr int32_t kPendingPart = -1;
    /// Posts one part of `x` (id `ex_id`): counted in x.outstanding first (it may end at once).
    void postPart(uint64_t ex_id, ExOp &x, WriteOp op, uint32_t part, uint32_t writer_uid);
    /// A part ended: its entry's status, the end record once every entry ended, the ticket.
    void partEnded(const PendingOp &op, Code status);
    /// Ends x's ticket with `status` (entries not ended yet get it too) unless it ended.
    void endExTicket(ExOp &x, Code status);
    /// Posts x's end record with `status`.
    void postEnd(uint64_t ex_id, ExOp &x, Code status);
    /// Erases x once its ticket ended and no part is outstanding.
    void settle(uint64_t ex_id);
    /// Delivers a record that landed here (messageArrived, or a held local one).
    void deliverRecord(RegionId region, uint32_t imm, std::span<const uint8_t> message,
                       std::string_view peer_name, uint32_t writer_uid);
    /// A notification for `region`'s owner; counted like notifyArrival's.
    void notifyOwner(RegionId region, const ipc::Notification &n, std::span<const uint8_t> payload);
    /// A group the target side watches, from its kGroupBegin until its kGroupEnd.
    struct InGroup {
        RegionId region = 0;
        uint32_t imm = 0;
        uint32_t writer_uid = 0;
        ipc::NotifyKind notify = ipc::NotifyKind::kGroup;
        uint32_t entries = 0;
        uint64_t offset = 0;
        int64_t deadline_ms = 0;  ///< steady ms; 0: none
        bool ended = false;       ///< the target ended it (deadline): its kGroupEnd is dropped
    };
    /// Ends a watched group at the target with `status` (a failed notification).
    void failInGroup(InGroup &g, Code status, std::string_view peer_name);
    void noteDeadline(int64_t at_ms);

    /// Handles one copied-out request: completes it, rejects it, or accepts it into its peer's
    /// queue (then it ends exactly once through completed()).
    void handleRequest(Session &s, const ipc::Request &r);
    /// The checks of one write (tl_write's, or one entry of a kWriteEx request) and the op it
    /// makes: kOk, or the code and `*why` it is rejected with. Counts nothing. `probe`, when
    /// given, says whether the target is a peer's probe region (RemoteRef::probe).
    Code buildWrite(Session &s, uint64_t src_region, uint64_t src_offset, uint64_t dst_remote,
                    uint64_t dst_offset, uint64_t bytes, uint32_t imm, WriteOp *op,
                    const char **why, bool *probe = nullptr);
    /// The target half of buildWrite (also a kWriteEx request's notification target): the
    /// local region, exposed and allowing this client, or the peer's region id.
    Code resolveTarget(Session &s, const RemoteRef &dst, WriteOp *op, const char **why);
    /// A kWriteEx request (request_ex.cpp): accepted (its parts posted) or rejected.
    void handleEx(Session &s, const ipc::Request &r, uint32_t slot);
    /// Whether `s` has as many kWriteEx parts in flight as it may: its ring waits.
    bool exBackPressure(const Session &s) const;
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
    // kWriteEx (request_ex.cpp).
    std::unordered_map<uint64_t, ExOp> ex_ops_;
    uint64_t next_ex_;  ///< starts at a random point: a restarted engine's ids are new ones
    /// Groups the target side watches, by (writer node, the writer's group id).
    std::map<std::pair<std::string, uint64_t>, InGroup> in_groups_;
    /// The earliest deadline at either end (steady ms; 0: none).
    int64_t next_deadline_ms_ = 0;
    uint64_t records_refused_ = 0;
};

}  // namespace tensorlane::sidecar
