// The peer manager: the bootstrap listener, authenticated sessions to and from every configured
// peer, region descriptors, liveness and reconnection, and the TCP transport's data path, all
// driven from one non-blocking epoll loop on the engine thread (docs/peers.md).
//
// Sessions are one-way: our writes to a peer go over the session we opened to it ("out"), its
// writes to us over the session it opened to us ("in"). The server side of a session sends its
// exposed regions and acknowledges writes; the client side sends writes. So two nodes writing
// to each other hold two sessions, and no tie-break between simultaneous connects is needed.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "peer/handshake.hpp"
#include "peer/key.hpp"
#include "peer/log.hpp"
#include "peer/resolver.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "net/connection.hpp"
#include "transport/tcp/links.hpp"
#include "net/socket.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace tensorlane::sidecar {

/// Limits that keep unauthenticated and misbehaving peers bounded.
struct PeerLimits {
    /// Accepted connections still in their handshake; more are closed at once.
    size_t max_pending_handshakes = 64;
    /// Writes in flight per peer session (the receiver's reorder window is the same).
    size_t window = 4096;
    /// Bytes read from one data connection per progress() call before others get a turn.
    size_t read_budget = 16u << 20;
};

class PeerManagerImpl final : public PeerManager, private TcpHost {
public:
    PeerManagerImpl(const config::Config &cfg, RegionTable &regions, PeerKey key,
                    PeerLimits limits = {});
    ~PeerManagerImpl() override;
    PeerManagerImpl(const PeerManagerImpl &) = delete;
    PeerManagerImpl &operator=(const PeerManagerImpl &) = delete;

    /// Creates the epoll set, timer and eventfds. Called once by makePeerManager.
    Status init();

    // PeerManager
    Status start() override;
    void stop() override;
    std::optional<PeerId> peerByName(std::string_view name) const override;
    std::string peerName(PeerId id) const override;
    PeerState peerState(PeerId id) const override;
    void lookup(PeerId peer, const std::string &name,
                std::function<void(Status, RemoteRegion)> done) override;
    bool remoteValid(PeerId peer, RegionId remote) const override;
    void regionExposed(const Region &r) override;
    void regionRevoked(RegionId r) override;
    Transport &transport() override { return transport_; }
    int wakeFd() const override { return poller_.fd(); }
    size_t progress(EventSink &sink) override;
    std::string statusJson() const override;

    /// The port the listener is bound to (0 before start()); tests bind port 0.
    uint16_t listenPort() const { return listen_port_; }
    /// This process's incarnation (random, announced in every handshake).
    uint64_t incarnation() const { return incarnation_; }

private:
    // ----- TcpHost
    Status ensureConnected(PeerId peer) override;
    void dropPeer(PeerId peer) override;
    Status postWrite(WriteOp op) override;
    size_t runProgress(EventSink &sink) override { return progress(sink); }
    int loopFd() const override { return poller_.fd(); }
    size_t writesInFlight() const override;

    // ----- state
    struct OutData {
        std::unique_ptr<Connection> conn;
        std::unique_ptr<ClientHandshake> hs;
        bool sent_auth = false;
        bool ready = false;
    };
    /// Our session to a peer, from the first connect until it fails.
    struct OutSession {
        enum class Phase { kResolving, kConnecting, kHandshake, kSyncing, kData, kUp };
        Phase phase = Phase::kResolving;
        uint64_t attempt = 0;
        SockAddr addr;
        std::unique_ptr<Connection> control;
        std::unique_ptr<ClientHandshake> hs;
        std::vector<OutData> data;
        uint64_t session_id = 0;
        uint64_t remote_incarnation = 0;
        PeerCaps remote_caps;
        std::map<uint64_t, RegionDescriptor> staged;  ///< the snapshot until READY
        std::unique_ptr<OutLink> link;                ///< once up
        int64_t deadline_ms = 0;                      ///< for the phase, until up
        int64_t heartbeat_ms = 0;
    };
    /// A peer's authenticated session to us.
    struct InSession {
        uint64_t session_id = 0;
        uint64_t remote_incarnation = 0;
        std::unique_ptr<Connection> control;
        std::vector<std::unique_ptr<Connection>> data;
        std::unique_ptr<InLink> link;
        int64_t heartbeat_ms = 0;
    };
    /// An accepted connection that has not authenticated yet.
    struct Pending {
        std::unique_ptr<Connection> conn;
        std::unique_ptr<ServerHandshake> hs;
        int64_t deadline_ms = 0;
        bool challenged = false;
        bool closing = false;  ///< refused: REFUSE sent, waiting for the client to close
        std::string claimed;   ///< the name its HELLO claimed, for logs
    };
    struct PendingLookup {
        std::string name;
        std::function<void(Status, RemoteRegion)> done;
        int64_t deadline_ms = 0;
    };
    struct Peer {
        PeerId id = 0;
        std::string name;
        std::string host;
        uint16_t port = 0;
        std::string address;  ///< as configured, for status and logs
        PeerState state = PeerState::kDown;
        bool wanted = false;
        std::unique_ptr<OutSession> out;
        std::unique_ptr<InSession> in;
        bool attempt_scheduled = false;
        int64_t next_attempt_ms = 0;
        uint32_t backoff_ms = 0;
        uint64_t remote_incarnation = 0;               ///< of `regions`
        std::map<uint64_t, RegionDescriptor> regions;  ///< what it exposes to us, by id
        std::unordered_map<std::string, uint64_t> region_by_name;
        std::vector<PendingLookup> lookups;
        uint64_t writes_sent = 0;
        uint64_t bytes_sent = 0;
        uint64_t writes_received = 0;
        uint64_t bytes_received = 0;
        uint64_t failures = 0;
        std::string last_error;
        std::string last_logged_error;
    };
    /// What a RemoteRegion.id handed to the engine stands for. Handles are never reused, and a
    /// handle from before a peer restarted stays invalid (its region ids start over).
    struct Handle {
        PeerId peer = 0;
        uint64_t incarnation = 0;
        uint64_t remote_id = 0;
    };

    // ----- loop
    void dispatch(const epoll_event &ev, int64_t now);
    void runTimers(int64_t now);
    void rearmTimer();
    void noteDeadline(int64_t at);
    void signalWake();
    size_t deliverArrivals(EventSink &sink, int64_t now);
    size_t drainQueues(EventSink &sink);

    // ----- inbound (inbound.cpp)
    void acceptAll(int64_t now);
    void onPendingEvent(Connection &c, uint32_t events, int64_t now);
    Status admit(const HelloMsg &hello) const;
    void promote(uint64_t token, const HandshakeOutcome &o, int64_t now);
    void refusePending(Pending &pd, const std::string &wire_reason, const std::string &log_reason,
                       int64_t now);
    void dropPending(uint64_t token, const std::string &reason, int64_t now);
    void onInControlEvent(Connection &c, uint32_t events, int64_t now);
    void onInDataEvent(Connection &c, uint32_t events, int64_t now);
    void closeIn(Peer &p, const std::string &reason, bool warn);
    void sendSnapshot(Connection &control);

    // ----- outbound (outbound.cpp)
    void startAttempt(Peer &p, int64_t now);
    void onResolved(const Resolver::Result &r, int64_t now);
    void beginConnect(Peer &p, const SockAddr &addr, int64_t now);
    bool openConnection(Peer &p, ConnRole role, uint32_t index, int64_t now,
                        std::unique_ptr<Connection> *out);
    void onOutControlEvent(Connection &c, uint32_t events, int64_t now);
    void onOutDataEvent(Connection &c, uint32_t events, int64_t now);
    bool handleOutControlFrame(Peer &p, const FrameHeader &h, std::span<const uint8_t> payload,
                               int64_t now);
    void onSynced(Peer &p, int64_t now);
    void onUp(Peer &p, int64_t now);
    void failOut(Peer &p, const std::string &reason, bool reconnect, int64_t now);
    void applyRegionAdd(Peer &p, RegionDescriptor d);
    void applyRegionDel(Peer &p, uint64_t id);

    // ----- helpers
    Peer *peerOf(PeerId id);
    const Peer *peerOf(PeerId id) const;
    Peer *peerNamed(std::string_view name);
    void setState(Peer &p, PeerState s, const std::string &reason);
    void resolveLookup(Peer &p, const std::string &name,
                       std::function<void(Status, RemoteRegion)> done);
    uint64_t handleFor(const Peer &p, uint64_t remote_id);
    void pruneHandles(PeerId peer);
    HandshakeIdentity identity() const;
    int64_t heartbeatInterval(const PeerCaps &remote) const;
    void logDrop(const std::string &remote, const std::string &reason, int64_t now);

    static constexpr uint64_t kTokenListen = 1;
    static constexpr uint64_t kTokenTimer = 2;
    static constexpr uint64_t kTokenWake = 3;
    static constexpr uint64_t kTokenResolver = 4;

    const config::Config cfg_;
    RegionTable &regions_;
    const PeerKey key_;
    const PeerLimits limits_;
    uint64_t incarnation_ = 0;
    TcpTransport transport_;

    Poller poller_;
    ipc::UniqueFd timer_;
    ipc::UniqueFd wake_;
    std::unique_ptr<Resolver> resolver_;
    ipc::UniqueFd listener_;
    uint16_t listen_port_ = 0;
    std::string listen_address_;
    int64_t listen_paused_until_ = 0;

    std::vector<Peer> peers_;
    std::unordered_map<uint64_t, Pending> pending_;  ///< by connection token
    std::unordered_map<uint64_t, Handle> handles_;
    std::map<std::pair<PeerId, uint64_t>, uint64_t> handle_of_;  ///< current incarnation
    uint64_t next_handle_ = 1;
    uint64_t next_attempt_ = 1;

    // Events for the engine, delivered by progress().
    std::vector<Completion> completions_;
    struct StateEvent {
        PeerId peer;
        PeerState state;
        std::string reason;
    };
    std::vector<StateEvent> state_events_;
    std::vector<std::function<void()>> callbacks_;

    // Objects closed during this progress() call, destroyed at its end (handlers up the stack
    // may still hold references to them).
    std::vector<std::unique_ptr<OutSession>> dead_out_;
    std::vector<std::unique_ptr<InSession>> dead_in_;
    std::vector<std::unique_ptr<Connection>> dead_conns_;

    int64_t next_deadline_ = INT64_MAX;
    int64_t armed_deadline_ = INT64_MAX;
    bool in_progress_ = false;
    bool started_ = false;
    bool stopped_ = false;
    bool wake_signalled_ = false;

    LogLimiter drop_log_{20, 10000};
    uint64_t rejected_ = 0;
    std::string last_rejection_;
};

}  // namespace tensorlane::sidecar
