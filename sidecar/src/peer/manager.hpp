// The peer manager: authenticated sessions to and from every configured peer, driven from one
// non-blocking epoll loop on the engine thread (docs/peers.md). Split by concern:
//   manager.cpp   the peer table, state, the PeerManager API, the loop, status
//   inbound.cpp   authentication of accepted connections (the listener, server handshakes) and
//                 the control connections peers open to us
//   outbound.cpp  connect attempts with backoff, client handshakes, our control connections,
//                 and the extra connections a transport asks for
//   liveness.cpp  deadlines: handshakes, heartbeats, silence, reconnects, lookups
//   directory.*   region descriptors and lookups (RegionDirectory)
// The bytes of writes belong to the transports (tensorlane/sidecar/transport.hpp), which the
// engine owns and drives; this layer authenticates their connections, carries their bootstrap
// blobs, and binds a transport to a peer once our session to it is up (TransportSet::bind).
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
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "net/connection.hpp"
#include "net/socket.hpp"
#include "peer/address.hpp"
#include "peer/directory.hpp"
#include "peer/handshake.hpp"
#include "peer/key.hpp"
#include "peer/log.hpp"
#include "peer/resolver.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {

/// The settings this implementation can honour (the config library checks the same ranges,
/// but a Config may be built in code).
Status checkPeerConfig(const config::Config &cfg);

/// Limits that keep unauthenticated and misbehaving peers bounded.
struct PeerLimits {
    /// Accepted connections from unlisted addresses ([security] allow_unlisted_peers) still in
    /// their handshake, all sources together; more are closed at once. Connections from the
    /// addresses of configured peers do not count here: a flood from elsewhere never keeps a
    /// configured peer out.
    size_t max_pending_handshakes = 64;
    /// Accepted connections from one source address still in their handshake; for the address
    /// of configured peers, at least connections_per_peer + 2, times the peers at it. When a
    /// source is at its limit, its oldest connection that has not sent a HELLO yet is closed
    /// to make room; with none, the new one is.
    size_t max_pending_per_source = 16;
    /// A connection from an address no peer is known at starts a new resolution of the peers'
    /// host names, at most this often.
    int64_t address_refresh_ms = 1000;
};

class PeerManagerImpl final : public PeerManager, private TransportHost {
public:
    /// `transports` (owned by the engine, outliving this) carry the writes; their remote ones,
    /// in preference order, are offered to peers and bound to them.
    PeerManagerImpl(const config::Config &cfg, RegionTable &regions, PeerKey key,
                    TransportSet &transports, PeerLimits limits = {});
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
    bool resolveRemote(PeerId peer, RegionId handle, uint64_t *remote_id,
                       std::string *why) const override;
    void regionExposed(const Region &r) override;
    void regionRevoked(RegionId r) override;
    void disconnect(PeerId peer) override;
    int wakeFd() const override { return poller_.fd(); }
    void readable() override { poll_due_ = true; }
    size_t progress(EventSink &sink) override;
    PeersReport report() const override;

    /// The port the listener is bound to (0 before start()); tests bind port 0.
    uint16_t listenPort() const { return listen_port_; }
    /// This process's incarnation (random, announced in every handshake).
    uint64_t incarnation() const { return incarnation_; }

private:
    // ----- TransportHost (the transport's requests)
    void openChannels(PeerId peer, uint32_t count) override;
    void sessionReady(PeerId peer) override;
    void failSession(PeerId peer, SessionSide side, const std::string &reason) override;

    // ----- state
    /// A connection of our session that is still in its handshake (a transport asked for it).
    struct OutExtra {
        std::unique_ptr<Connection> conn;
        std::unique_ptr<ClientHandshake> hs;
        bool sent_auth = false;
    };
    /// Our session to a peer, from the first connect until it fails.
    struct OutSession {
        enum class Phase {
            kResolving,
            kConnecting,
            kHandshake,
            kSyncing,
            kSelecting,
            kOpening,
            kUp
        };
        Phase phase = Phase::kResolving;
        uint64_t attempt = 0;
        SockAddr addr;
        std::unique_ptr<Connection> control;
        std::unique_ptr<ClientHandshake> hs;
        std::vector<OutExtra> extras;  ///< by index
        uint64_t session_id = 0;
        uint64_t remote_incarnation = 0;
        PeerCaps remote_caps;
        bool integrity = false;
        std::map<uint64_t, RegionDescriptor> staged;  ///< the snapshot until READY
        Transport *transport = nullptr;               ///< chosen at SELECT
        bool transport_open = false;
        int64_t deadline_ms = 0;  ///< for the phase, until up
        int64_t heartbeat_ms = 0;
    };
    /// A peer's authenticated session to us.
    struct InSession {
        uint64_t session_id = 0;
        uint64_t remote_incarnation = 0;
        PeerCaps remote_caps;
        bool integrity = false;
        std::unique_ptr<Connection> control;
        uint32_t data_expected = 0;  ///< channels the transport takes (its openSession says)
        std::vector<bool> data_taken;
        Transport *transport = nullptr;  ///< the one the peer selected
        bool transport_open = false;
        int64_t heartbeat_ms = 0;
    };
    /// An accepted connection that has not authenticated yet.
    struct Pending {
        std::unique_ptr<Connection> conn;
        std::unique_ptr<ServerHandshake> hs;
        HostAddress source;   ///< where it comes from (port left out)
        bool listed = false;  ///< the source is a configured peer's address
        int64_t accepted_ms = 0;
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
        /// The key of this pair of nodes: [[peers]] key_file, or the shared key.
        PeerKey key;
        /// What `host` resolves to: the addresses its connections may come from.
        std::vector<HostAddress> hosts;
        bool numeric = false;          ///< `host` is a literal address (never resolved)
        bool hosts_resolving = false;  ///< a resolution of every address is queued
        PeerState state = PeerState::kDown;
        bool wanted = false;
        std::unique_ptr<OutSession> out;
        std::unique_ptr<InSession> in;
        bool attempt_scheduled = false;
        int64_t next_attempt_ms = 0;
        uint32_t backoff_ms = 0;
        uint64_t remote_incarnation = 0;  ///< of the regions in the directory
        std::vector<PendingLookup> lookups;
        uint64_t failures = 0;
        std::string last_error;
        std::string last_logged_error;
    };

    // ----- loop (manager.cpp)
    void dispatch(const epoll_event &ev, int64_t now);
    void noteDeadline(int64_t at);
    void rearmTimer();
    void signalWake();
    size_t drainQueues(EventSink &sink);

    // ----- deadlines (liveness.cpp)
    void runTimers(int64_t now);
    void checkOut(Peer &p, int64_t now, const std::function<void(int64_t)> &due);
    void checkIn(Peer &p, int64_t now, const std::function<void(int64_t)> &due);
    void checkLookups(Peer &p, int64_t now, const std::function<void(int64_t)> &due);

    // ----- inbound (inbound.cpp)
    void acceptAll(int64_t now);
    void onPendingEvent(Connection &c, uint32_t events, int64_t now);
    /// Whether a HELLO from `source` may proceed; picks the pair's key into `hs`.
    Status admit(const HelloMsg &hello, const HostAddress &source, ServerHandshake &hs, int64_t now,
                 std::string *log_detail);
    /// Whether `source` is an address of a configured peer; how many peers are at it.
    size_t peersAt(const HostAddress &source) const;
    /// The most pending handshakes `source` may hold.
    size_t sourceQuota(const HostAddress &source, bool listed) const;
    /// Makes room for one more pending handshake from `source`: true when there is (maybe
    /// after closing its oldest connection that has not sent a HELLO), else false with `*why`.
    bool makeRoom(const HostAddress &source, bool listed, int64_t now, std::string *why);
    /// Removes a pending handshake from the per-source counts (before it leaves pending_).
    void forgetPending(const Pending &pd);
    /// Resolves the host names of the peers again (at most every address_refresh_ms).
    void refreshPeerHosts(int64_t now);
    void onHostsResolved(const Resolver::Result &r);
    void promote(uint64_t token, const HandshakeOutcome &o, int64_t now);
    void refusePending(Pending &pd, const std::string &wire_reason, const std::string &log_reason,
                       int64_t now);
    void dropPending(uint64_t token, const std::string &reason, int64_t now);
    void onInControlEvent(Connection &c, uint32_t events, int64_t now);
    bool handleInControlFrame(Peer &p, const FrameHeader &h, std::span<const uint8_t> payload,
                              int64_t now);
    void closeIn(Peer &p, const std::string &reason, bool warn);
    void sendSnapshot(Connection &control);

    // ----- outbound (outbound.cpp)
    void startAttempt(Peer &p, int64_t now);
    void onResolved(const Resolver::Result &r, int64_t now);
    void beginConnect(Peer &p, const SockAddr &addr, int64_t now);
    bool openConnection(Peer &p, ConnRole role, uint32_t index, int64_t now,
                        std::unique_ptr<Connection> *out);
    void onOutControlEvent(Connection &c, uint32_t events, int64_t now);
    void onOutExtraEvent(Connection &c, uint32_t events, int64_t now);
    bool handleOutControlFrame(Peer &p, const FrameHeader &h, std::span<const uint8_t> payload,
                               int64_t now);
    void onSynced(Peer &p, int64_t now);
    void onSelected(Peer &p, uint64_t kind, std::span<const uint8_t> blob, int64_t now);
    void onUp(Peer &p, int64_t now);
    void failOut(Peer &p, const std::string &reason, bool reconnect, int64_t now);

    // ----- helpers
    /// The transport our session to `p` should use: the first of ours, in preference order,
    /// that is available here and that the peer announced; or nullptr with `*why`.
    Transport *chooseTransport(const Peer &p, const PeerCaps &remote, std::string *why);
    /// Marks `peer` wanted and starts connecting it if it is not up.
    Status ensureConnected(PeerId peer);
    Peer *peerOf(PeerId id);
    const Peer *peerOf(PeerId id) const;
    Peer *peerNamed(std::string_view name);
    void setState(Peer &p, PeerState s, const std::string &reason);
    void resolveLookup(Peer &p, const std::string &name,
                       std::function<void(Status, RemoteRegion)> done);
    HandshakeIdentity identity() const;
    int64_t heartbeatInterval(const PeerCaps &remote) const;
    void logDrop(const std::string &remote, const std::string &reason, int64_t now);
    SessionInfo sessionInfo(const Peer &p, uint64_t session_id, uint64_t incarnation,
                            bool integrity) const;
    /// Turns on the frame tags of an authenticated connection (when both ends asked for them).
    static void authenticate(Connection &c, const HandshakeOutcome &o, bool client);

    static constexpr uint64_t kTokenListen = 1;
    static constexpr uint64_t kTokenTimer = 2;
    static constexpr uint64_t kTokenWake = 3;
    static constexpr uint64_t kTokenResolver = 4;
    /// Resolver tags of address-book lookups: this bit, then the peer id.
    static constexpr uint64_t kHostsTag = uint64_t{1} << 63;

    const config::Config cfg_;
    RegionTable &regions_;
    const PeerKey key_;
    const PeerLimits limits_;
    TransportSet &transports_;
    uint64_t incarnation_ = 0;

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
    std::map<HostAddress, size_t> pending_by_source_;
    size_t pending_unlisted_ = 0;
    int64_t hosts_refreshed_ms_ = INT64_MIN / 2;
    /// Outgoing connections leave from the listen address when it is a specific one, so peers
    /// see us come from the address they dial (verify_peer_address).
    std::optional<SockAddr> bind_source_;
    RegionDirectory directory_;
    uint64_t next_attempt_ = 1;

    // Events for the engine, delivered by progress().
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
    /// The engine saw the poller's fd readable since progress() last asked it.
    bool poll_due_ = false;

    LogLimiter drop_log_{20, 10000};
    LogLimiter region_log_{5, 10000};
    uint64_t rejected_ = 0;
    std::string last_rejection_;
    uint64_t unlisted_dropped_ = 0;  ///< closed at accept: no configured peer is at the address
    uint64_t claims_refused_ = 0;    ///< a peer's name claimed from another address
};

}  // namespace tensorlane::sidecar
