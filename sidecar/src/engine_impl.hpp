// The engine's internals, shared by engine.cpp (the loop), control.cpp (the client socket
// protocol) and requests.cpp (the request path).
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "metrics/snapshot.hpp"
#include "metrics/write_stats.hpp"
#include "session.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "tensorlane/sidecar/transport.hpp"
#include "transport/local/local_transport.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {

class MetricsServer;
class CudaImport;
class CudaImportChecker;

/// epoll_ctl(EPOLL_CTL_ADD) of `fd` with `tag` as its data; 0 or errno.
int addToEpoll(int epfd, int fd, uint32_t events, uint64_t tag);

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
    std::string statusJson(std::optional<uid_t> only_uid = std::nullopt) const;

    // EventSink: transports report here, on the engine thread.
    void completed(uint64_t op_id, Code status, std::string_view reason) override;
    void arrived(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                 std::string_view peer_name) override;
    void peerState(PeerId peer, PeerState state, std::string_view reason) override;

private:
    // Epoll tags: the kind in the top byte, a session id below.
    enum Tag : uint64_t {
        kTagListen = 1ull << 56,
        kTagStop = 2ull << 56,
        kTagPeers = 4ull << 56,
        kTagSock = 5ull << 56,
        kTagBell = 6ull << 56,
        kTagTransport = 7ull << 56,  ///< a transport's fd (bits 32-55: its index, 0-31: the fd)
        kTagMetrics = 8ull << 56,    ///< a scrape waits for a snapshot
        kTagCudaCheck = 9ull << 56,  ///< CUDA imports verified (cuda_control.cpp)
    };
    static constexpr uint64_t kTagMask = 0xffull << 56;

    // engine.cpp
    size_t pollEvents(int timeout_ms);
    /// Raises the sleep flags, then looks once more for work (Dekker). True: safe to sleep.
    bool armSleep();
    void disarmSleep();
    /// Progress of every transport.
    size_t progressTransports();
    /// arrived() with the writer's uid (ipc::kWriterUidPeer for a peer's write).
    void notifyArrival(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                       std::string_view peer_name, uint32_t writer_uid);
    /// Delivers a held local arrival with `writer_uid`, if one is held.
    void releaseHeldArrival(uint32_t writer_uid);
    /// Re-arms the worker socket after an EMFILE pause, when its time has come.
    void resumeListener();
    /// A region no longer in the table whose last in-flight write ended: transports let go.
    void retireRegion(const std::shared_ptr<Region> &r);
    /// One fewer write uses `r` (an op ended).
    void dropUser(const std::shared_ptr<Region> &r);
    /// Publishes every session's rings; returns backlog entries moved into them.
    size_t publishAll();
    void reapSessions();
    void closeSession(Session &s, std::string reason);
    void destroySession(SessionId id);
    /// Starts the Prometheus endpoint when [metrics] listen is set.
    Status startMetrics();
    /// The engine's state for one scrape (metrics/snapshot.hpp), built on the engine thread.
    Snapshot buildSnapshot() const;

    // control.cpp
    void acceptClients();
    /// Whether the client may use the socket; `*why` says why not.
    bool allowed(const ipc::PeerCred &cred, int fd, std::string *why) const;
    /// Whether a client of `cred` may have one more session ([limits] sessions_per_uid,
    /// sessions_per_pid, fd_reserve); `*why` says why not.
    bool admitSession(const ipc::PeerCred &cred, std::string *why) const;
    /// Closes and destroys the sessions of `cred`'s uid or pid whose clients hung up (or that
    /// are closing) and are still counted; returns how many.
    size_t reapHungUp(const ipc::PeerCred &cred);
    void refuse(int fd, Code code, const std::string &why);
    void readControl(Session &s);
    void handleControl(Session &s, const unsigned char *msg, size_t bytes, ipc::UniqueFd *fds,
                       size_t nfds);
    void reply(Session &s, uint64_t seq, Code status, uint64_t v0, uint64_t v1,
               const std::string &error, int fd = -1);
    /// Copies a fixed-size message out of the datagram (wrong size: an error reply) and runs
    /// its handler.
    template <class Msg>
    void dispatch(Session &s, const ipc::MsgHeader &h, const unsigned char *msg, size_t bytes,
                  void (EngineImpl::*handler)(Session &, const Msg &));
    void onAllocHost(Session &s, const ipc::AllocHostMsg &m);
    void onRegister(Session &s, const ipc::RegisterMsg &m);
    void onDeregister(Session &s, const ipc::DeregisterMsg &m);
    void onExpose(Session &s, const ipc::ExposeMsg &m);
    void onExposeAccess(Session &s, const ipc::ExposeAccessMsg &m);
    /// tl_expose and tl_expose_access: checks the name (reserved prefixes included) and
    /// exposes the client's `region` with `access` (its owner_uid is filled in here).
    void exposeRegion(Session &s, uint64_t seq, uint64_t region, const char *field,
                      RegionAccess access, const char *call);
    /// kPermission, with the reason, when [security] reserved_names keeps `name` from `s`.
    Status checkReservedName(const Session &s, std::string_view name) const;
    /// Creates and exposes kProbeRegionName (engine.hpp).
    Status exposeProbeRegion();
    void onLookup(Session &s, const ipc::LookupMsg &m);
    void onStatus(Session &s, const ipc::StatusMsg &m);
    // cuda_control.cpp: CUDA memory (docs/gpu.md)
    void onRegisterCuda(Session &s, const ipc::RegisterMsg &m, ipc::UniqueFd dmabuf);
    /// Answers the CUDA registrations whose imports the checker has verified (or refused).
    void finishCudaChecks();
    /// The region of a CUDA registration whose import is verified; replies to the client.
    void addCudaRegion(Session &s, const ipc::RegisterMsg &m,
                       const std::shared_ptr<CudaImport> &imp);
    // stream_control.cpp: the stream-ordered calls
    void onStreamSetup(Session &s, const ipc::MsgHeader &m);
    void onStreamSubscribe(Session &s, const ipc::StreamSubscribeMsg &m);
    void onStreamCredit(Session &s, const ipc::StreamCreditMsg &m);
    /// Posts gated writes whose gate opened and hands over stream notifications; returns work.
    size_t pollStreams();
    /// Whether a session waits on its GPU (a held gate, a hand-over): the engine looks again
    /// soon rather than sleeping long.
    bool streamsUrgent() const;
    void releaseRegion(const std::shared_ptr<Region> &r);
    /// kNoMemory with the reason when one more region of `bytes` would exceed a quota.
    Status checkQuota(const Session &s, uint64_t new_bytes, bool new_mapping) const;
    std::string remotesQuotaText() const;
    /// Makes `r` usable by every transport (local, tcp, verbs); an error undoes nothing.
    Status registerWithTransports(Region &r) { return transports_.registerRegion(r); }

    // requests.cpp
    /// Ends a request on the client's completion ring (and in its stream slot, if it has one);
    /// a client whose backlog overflows is disconnected.
    void completeOrClose(Session &s, uint64_t ticket, Code status, uint64_t bytes,
                         uint32_t slot = kNoSlot);
    size_t drainRequests();
    /// Takes up to kBatch requests of one session while it has fewer than `cap` in flight.
    uint32_t drainSession(Session &s, uint64_t cap);
    /// Handles one copied-out request: completes it, rejects it, or accepts it into its peer's
    /// queue (then it ends exactly once through completed()).
    void handleRequest(Session &s, const ipc::Request &r);
    void reject(Session &s, const ipc::Request &r, Code code, const char *why);
    /// Posts `op` to its transport. False: the transport is full (kAgain); true: it was taken
    /// or it ended at once (completed() ran).
    bool postNow(const WriteOp &op);
    /// Posts queued writes, per peer in order, while their transports take them.
    size_t pumpQueues();

    Session *findSession(SessionId id) {
        auto it = sessions_.find(id);
        return it == sessions_.end() ? nullptr : it->second.get();
    }

    static constexpr uint32_t kNoSlot = UINT32_MAX;
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
    /// A local write's arrival, held until the completion that follows it names the op (and so
    /// the writer): LocalTransport::progress reports arrived() and then completed() of the same
    /// write (local_transport.hpp).
    struct HeldArrival {
        RegionId region = 0;
        uint32_t imm = 0;
        uint64_t offset = 0;
        uint64_t bytes = 0;
        /// The transport's own node name: valid for the progress() call that reported it,
        /// and the arrival never outlives that call.
        std::string_view peer;
    };
    /// Accepted writes to one peer that its transport could not take yet, oldest first.
    struct PeerQueue {
        std::deque<WriteOp> ops;
    };

    struct Counters {
        uint64_t sessions_accepted = 0;
        uint64_t sessions_refused = 0;
        uint64_t writes_local = 0;
        uint64_t writes_remote = 0;
        uint64_t requests_rejected = 0;
        uint64_t notifications = 0;
        uint64_t notifications_dropped = 0;
        uint64_t probes_received = 0;  ///< writes into the peer probe's region
        uint64_t quota_refusals = 0;
        uint64_t session_cap_refusals = 0;  ///< sessions_per_uid/pid, fd_reserve
        uint64_t accept_pauses = 0;
        uint64_t late_wakeups = 0;  ///< sleeps that ended by the idle tick with work waiting
    };

    config::Config cfg_;
    std::shared_ptr<spdlog::logger> log_;
    std::chrono::steady_clock::time_point started_;
    RegionTable regions_;
    RegionId probe_region_ = 0;
    /// Every transport, local first (what pollFds/arm/progress iterate); the peer layer binds
    /// the remote ones to peers.
    TransportSet transports_;
    std::vector<std::unique_ptr<Transport>> given_remote_;  ///< Engine::create's, until init()
    LocalTransport *local_ = nullptr;                       ///< transports_'s local one
    std::unique_ptr<PeerManager> peers_;
    ipc::UniqueFd epoll_;
    ipc::UniqueFd listen_;
    ipc::UniqueFd stop_fd_;
    std::atomic<bool> stopping_{false};
    bool running_ = false;
    std::unordered_map<SessionId, std::unique_ptr<Session>> sessions_;
    std::vector<Session *> active_;  ///< iteration order for the request path
    std::vector<SessionId> to_reap_;
    std::unordered_map<uint64_t, PendingOp> ops_;
    /// True while the local transport's progress() reports (its arrivals are held).
    bool in_local_progress_ = false;
    std::optional<HeldArrival> held_arrival_;
    std::unordered_map<PeerId, PeerQueue> queues_;
    size_t queued_ = 0;  ///< ops waiting in queues_
    /// Regions removed from the table with writes still using them: deregistered from the
    /// transports when the last one ends.
    std::unordered_map<RegionId, std::shared_ptr<Region>> retiring_;
    std::chrono::steady_clock::time_point listen_paused_until_{};
    bool listen_paused_ = false;
    size_t last_poll_events_ = 0;
    uint64_t mappings_ = 0;      ///< segments this sidecar maps (sessions and host buffers)
    uint64_t max_mappings_ = 0;  ///< what it allows itself (vm.max_map_count minus headroom)
    /// Bytes of tl_alloc_host buffers all clients hold, and the most they may
    /// ([limits] node_registered_bytes, "auto" resolved in init()).
    uint64_t node_host_bytes_ = 0;
    uint64_t node_registered_cap_ = 0;
    std::string node_cap_source_;  ///< how the cap was chosen, for messages and status
    /// Sessions held now by each uid and each pid ([limits] sessions_per_uid/pid).
    std::unordered_map<uid_t, uint32_t> sessions_of_uid_;
    std::unordered_map<pid_t, uint32_t> sessions_of_pid_;
    uint64_t fd_baseline_ = 0;  ///< fds open once start() has opened everything of its own
    SessionId next_session_ = 1;
    uint64_t next_op_ = 1;
    Counters counters_;
    /// Per-peer write counters and latency histograms for the metrics endpoint.
    EngineStats stats_;
    // The metrics endpoint ([metrics] listen; null when off). The channel outlives the server:
    // the server's threads wait on it.
    std::shared_ptr<SnapshotChannel> metrics_channel_;
    std::unique_ptr<MetricsServer> metrics_;
    /// Verifies first registrations of CUDA allocations (made on the first one).
    std::unique_ptr<CudaImportChecker> cuda_checker_;
    /// Sessions with stream segments (pollStreams looks at these only).
    std::vector<SessionId> stream_sessions_;
    std::chrono::steady_clock::time_point streams_moved_{};  ///< last gate or hand-over
};

}  // namespace tensorlane::sidecar
