// What the parts of the peer layer (listener, dialer, liveness) need from the loop that owns
// them, PeerManagerImpl: deadlines, wake-ups, events for the engine, and objects kept alive to
// the end of a progress() pass. It hands out neither the peer table nor another part: the one
// request that reaches another part is peerRestarted (the listener's news, the dialer's work).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "net/connection.hpp"
#include "peer/handshake.hpp"
#include "peer/peer_table.hpp"
#include "peer/resolver.hpp"
#include "tensorlane/sidecar/peers.hpp"

namespace tensorlane::sidecar {

class PeerLoop {
public:
    virtual ~PeerLoop() = default;

    /// start() ran and stop() did not.
    virtual bool running() const = 0;
    /// stop() ran (or is running).
    virtual bool stopped() const = 0;
    /// Who this node is in a handshake (name, incarnation, caps of its usable transports).
    virtual HandshakeIdentity identity() const = 0;
    /// The host-name resolver; nullptr once stopped.
    virtual Resolver *resolver() = 0;

    /// The deadlines are looked at again no later than `at` (monotonic ms).
    virtual void noteDeadline(int64_t at) = 0;
    /// Makes the engine call progress() soon.
    virtual void signalWake() = 0;
    /// Changes `p`'s state and queues the event for the engine (nothing when it is unchanged).
    virtual void setState(Peer &p, PeerState s, const std::string &reason) = 0;
    /// The session `p` opened to us closed: the engine hears it (EventSink::inboundClosed).
    virtual void inboundClosed(Peer &p, const std::string &reason) = 0;
    /// Queues `cb` (a lookup's answer) for the engine; progress() runs it.
    virtual void defer(std::function<void()> cb) = 0;
    /// `p` is up: answers the lookups that waited for it from the region directory.
    virtual void answerLookups(Peer &p) = 0;
    /// A session from `p` came from a new incarnation (the peer restarted): ours to it is dead.
    virtual void peerRestarted(Peer &p, int64_t now) = 0;

    /// Closed objects, destroyed at the end of the progress() pass (handlers up the stack may
    /// still hold references to them).
    virtual void retire(std::unique_ptr<Connection> c) = 0;
    virtual void retire(std::unique_ptr<OutSession> s) = 0;
    virtual void retire(std::unique_ptr<InSession> s) = 0;
};

}  // namespace tensorlane::sidecar
