// The TCP transport as the engine sees it: the Transport seam over the peer manager's sessions.
// The byte-moving parts live next to it (connection, links); session setup, authentication and
// liveness live in the peer manager, which owns the one epoll loop both use.
#pragma once

#include <cstddef>

#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

/// What the TCP transport needs from its owner, the peer manager.
class TcpHost {
public:
    virtual ~TcpHost() = default;
    /// Marks `peer` wanted and starts connecting it if it is not up.
    virtual Status ensureConnected(PeerId peer) = 0;
    /// Closes the session to `peer` (its in-flight writes end with kPeer) and stops reconnecting.
    virtual void dropPeer(PeerId peer) = 0;
    /// Validates and sends one write; see Transport::post.
    virtual Status postWrite(WriteOp op) = 0;
    /// Drives all peer I/O and reports events.
    virtual size_t runProgress(EventSink &sink) = 0;
    virtual int loopFd() const = 0;
    virtual size_t writesInFlight() const = 0;
};

/// Transport "tcp": write-with-immediate over authenticated TCP sessions.
class TcpTransport final : public Transport {
public:
    explicit TcpTransport(TcpHost &host) : host_(host) {}

    const char *name() const override { return "tcp"; }
    Status connect(PeerId peer) override { return host_.ensureConnected(peer); }
    void disconnect(PeerId peer) override { host_.dropPeer(peer); }
    /// Nothing to register: the target reads straight into the region's mapped memory.
    Status registerRegion(Region &) override { return Status::ok(); }
    void deregisterRegion(RegionId) override {}
    /// Never blocks: kAgain when the peer's window is full, kPeer at once while it is down,
    /// kNotFound for a region the peer revoked.
    Status post(const WriteOp &op) override { return host_.postWrite(op); }
    /// The same as PeerManager::progress (one loop drives bootstrap and data).
    size_t progress(EventSink &sink) override { return host_.runProgress(sink); }
    std::vector<int> pollFds() const override { return {host_.loopFd()}; }
    size_t inFlight() const override { return host_.writesInFlight(); }

private:
    TcpHost &host_;
};

}  // namespace tensorlane::sidecar
