// The peer manager: authenticated sessions to and from every configured peer, driven from one
// non-blocking epoll loop on the engine thread (docs/peers.md). One class a concern:
//   manager.*     PeerManagerImpl: the peer table, the PeerManager API, the transports'
//                 requests (TransportHost), the loop, status; it owns the three parts below and
//                 serves them through PeerLoop (peer/loop.hpp)
//   listener.*    PeerListener: accepted connections (limits on unauthenticated ones, server
//                 handshakes) and the control connections peers open to us
//   dialer.*      PeerDialer: connect attempts with backoff, client handshakes, our control
//                 connections, and the extra connections a transport asks for
//   liveness.*    PeerLiveness: deadlines (handshakes, heartbeats, silence, reconnects, lookups)
//   peer_table.*  the peers and their sessions; directory.* region descriptors and lookups
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
#include <vector>

#include "net/connection.hpp"
#include "peer/dialer.hpp"
#include "peer/directory.hpp"
#include "peer/handshake.hpp"
#include "peer/key.hpp"
#include "peer/listener.hpp"
#include "peer/liveness.hpp"
#include "peer/loop.hpp"
#include "peer/peer_table.hpp"
#include "peer/resolver.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {

/// The settings this implementation can honour (the config library checks the same ranges,
/// but a Config may be built in code).
Status checkPeerConfig(const config::Config &cfg);

class PeerManagerImpl final : public PeerManager, private TransportHost, private PeerLoop {
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
    Status addPeer(const DirectoryPeer &p, PeerId *id) override;
    void removePeer(std::string_view name, const std::string &reason) override;
    void setUnknownPeerAnswer(Code code, std::string text) override;
    Status unknownPeer(std::string_view name) const override;
    int wakeFd() const override { return poller_.fd(); }
    void readable() override { poll_due_ = true; }
    size_t progress(EventSink &sink) override;
    PeersReport report(ReportDetail want) const override;

    /// The port the listener is bound to (0 before start()); tests bind port 0.
    uint16_t listenPort() const { return listener_.port(); }
    /// This process's incarnation (random, announced in every handshake).
    uint64_t incarnation() const override { return incarnation_; }

private:
    // ----- TransportHost (the transport's requests)
    void openChannels(PeerId peer, uint32_t count) override;
    void sessionReady(PeerId peer) override;
    void failSession(PeerId peer, SessionSide side, const std::string &reason) override;

    // ----- PeerLoop (what the listener, the dialer and liveness ask of the loop)
    bool running() const override { return started_ && !stopped_; }
    bool stopped() const override { return stopped_; }
    HandshakeIdentity identity() const override;
    Resolver *resolver() override { return resolver_.get(); }
    void noteDeadline(int64_t at) override;
    void signalWake() override;
    void setState(Peer &p, PeerState s, const std::string &reason) override;
    void inboundClosed(Peer &p, const std::string &reason) override;
    void defer(std::function<void()> cb) override { callbacks_.push_back(std::move(cb)); }
    void answerLookups(Peer &p) override;
    void peerRestarted(Peer &p, int64_t now) override { dialer_.peerRestarted(p, now); }
    void retire(std::unique_ptr<Connection> c) override { dead_conns_.push_back(std::move(c)); }
    void retire(std::unique_ptr<OutSession> s) override { dead_out_.push_back(std::move(s)); }
    void retire(std::unique_ptr<InSession> s) override { dead_in_.push_back(std::move(s)); }

    // ----- the loop
    void dispatch(const epoll_event &ev, int64_t now);
    size_t drainQueues(EventSink &sink);

    // ----- helpers
    /// Marks `peer` wanted and starts connecting it if it is not up.
    Status ensureConnected(PeerId peer);
    void resolveLookup(Peer &p, const std::string &name,
                       std::function<void(Status, RemoteRegion)> done);

    static constexpr uint64_t kTokenListen = 1;
    static constexpr uint64_t kTokenTimer = 2;
    static constexpr uint64_t kTokenWake = 3;
    static constexpr uint64_t kTokenResolver = 4;

    const config::Config cfg_;
    RegionTable &regions_;
    const PeerKey key_;
    const PeerLimits limits_;
    TransportSet &transports_;
    uint64_t incarnation_ = 0;

    // Declared before what registers connections in it, so it outlives them.
    Poller poller_;
    ipc::UniqueFd wake_;
    std::unique_ptr<Resolver> resolver_;

    PeerTable peers_;
    RegionDirectory directory_;
    PeerListener listener_;
    PeerDialer dialer_;
    PeerLiveness liveness_;

    // Events for the engine, delivered by progress().
    struct StateEvent {
        PeerId peer;
        PeerState state;
        std::string reason;
        bool inbound = false;  ///< the session the peer opened to us closed (state unused)
    };
    std::vector<StateEvent> state_events_;
    std::vector<std::function<void()>> callbacks_;

    // Objects closed during this progress() call, destroyed at its end (handlers up the stack
    // may still hold references to them).
    std::vector<std::unique_ptr<OutSession>> dead_out_;
    std::vector<std::unique_ptr<InSession>> dead_in_;
    std::vector<std::unique_ptr<Connection>> dead_conns_;

    /// Names the directory removed or refused, and why (lookups say it); bounded.
    std::map<std::string, std::string, std::less<>> gone_;
    std::optional<std::pair<Code, std::string>> unknown_answer_;

    bool in_progress_ = false;
    bool started_ = false;
    bool stopped_ = false;
    bool wake_signalled_ = false;
    /// The engine saw the poller's fd readable since progress() last asked it.
    bool poll_due_ = false;
};

}  // namespace tensorlane::sidecar
