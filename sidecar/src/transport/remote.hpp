// The seam between the peer layer (peer/: authentication, liveness, region descriptors,
// lookups) and the transports that carry writes to remote peers (transport/tcp, verbs).
//
// Sessions are one-way (docs/peers.md): our writes to a peer go over the session we opened to
// it (kOut), its writes to us over the session it opened to us (kIn). Once a session's control
// connection has authenticated and synchronised its region descriptors, the client picks a
// transport both ends can use (SELECT/SELECTED on the control connection, each carrying that
// transport's own bootstrap data: nothing for tcp; QPNs, PSNs, GID, MTU, traffic class for
// verbs) and the peer layer opens the session on that transport at both ends. The transport
// then owns the bytes; the peer layer keeps the control connection, its heartbeats, and tears
// the session down when either side fails.
//
// Everything here runs on the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "net/connection.hpp"
#include "net/frame.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

/// Transports a node can carry writes over, as bits in the bootstrap's PeerCaps::transports
/// and as the SELECT frame's argument. Wire values.
enum TransportBit : uint32_t {
    kTransportTcp = 1u << 0,
    kTransportVerbs = 1u << 1,
};

/// Which of a peer's two sessions: the one we opened (our writes) or the one it opened to us.
enum class SessionSide : uint8_t { kOut, kIn };

/// A write that ended, to be reported through EventSink::completed().
struct Completion {
    uint64_t op_id = 0;
    Code code = Code::kOk;
    std::string reason;
    uint64_t bytes = 0;
};

/// What the peer layer tells a transport about a session it opens on it.
struct SessionInfo {
    std::string peer_name;
    uint64_t session_id = 0;
    uint64_t incarnation = 0;  ///< the peer process's
    uint32_t connections = 0;  ///< [tcp] connections_per_peer (both ends agree)
    uint32_t chunk_bytes = 0;  ///< [tcp] chunk_bytes (both ends agree)
    bool integrity = false;    ///< frames carry FrameAuth tags
    /// The other end's transport data from SELECT/SELECTED (empty for tcp).
    std::vector<uint8_t> remote_blob;
};

/// What a remote transport may ask of the peer layer.
class PeerLink {
public:
    virtual ~PeerLink() = default;
    /// Sends a frame on the control connection of the session `side` with `peer`.
    virtual Status sendControl(PeerId peer, SessionSide side, FrameType type, uint64_t arg,
                               std::span<const uint8_t> payload = {}) = 0;
    /// Opens `count` more authenticated connections in our session to `peer` (kOut only); each
    /// arrives through RemoteTransport::adoptConnection, or the session fails.
    virtual void openDataConnections(PeerId peer, uint32_t count) = 0;
    /// The session's transport part is up (kOut: writes may be posted).
    virtual void transportReady(PeerId peer) = 0;
    /// Tears the session down with `reason` (a protocol error, a stalled peer).
    virtual void failSession(PeerId peer, SessionSide side, const std::string &reason) = 0;
    /// The peer's configured name (for notifications and logs).
    virtual std::string peerName(PeerId peer) const = 0;
};

/// A transport to remote peers: the Transport seam plus the session lifecycle the peer layer
/// drives.
class RemoteTransport : public Transport {
public:
    /// Its TransportBit (peer/wire.hpp).
    virtual uint32_t kind() const = 0;
    /// Whether this node can use it now (verbs: a device is open).
    virtual bool available() const = 0;
    /// The data this end sends in SELECT (kOut) or SELECTED (kIn) for a session with `peer`.
    virtual std::vector<uint8_t> localBlob(PeerId peer, SessionSide side) = 0;
    /// A session is open at both ends: kIn, ready to receive; kOut, start the data path and
    /// call PeerLink::transportReady when writes may be posted.
    virtual Status openSession(PeerId peer, SessionSide side, const SessionInfo &info) = 0;
    /// The session is gone: kOut fails every write in flight with `code` (they end exactly
    /// once, through progress()); kIn drops what was half received.
    virtual void closeSession(PeerId peer, SessionSide side, Code code,
                              const std::string &reason) = 0;
    /// A frame for this transport on the session's control connection (ACK, TRANSPORT). False
    /// means a protocol error: the peer layer fails the session.
    virtual bool onControlFrame(PeerId peer, SessionSide side, const FrameHeader &h,
                                std::span<const uint8_t> payload, std::string *error) = 0;
    /// An authenticated extra connection of the session (tcp data connections).
    virtual void adoptConnection(PeerId peer, SessionSide side, uint32_t index,
                                 std::unique_ptr<Connection> conn) = 0;
    /// Per-peer figures as a JSON object's text (status).
    virtual std::string peerStatusJson(PeerId peer) const = 0;
    /// Gives the transport the peer layer it talks to (before any session opens).
    virtual void attach(PeerLink &link) = 0;
    /// A local region was exposed (after its REGION_ADD went to `peer` on the session `peer`
    /// opened to us): a transport that needs per-peer keys (verbs: an rkey in that peer's
    /// protection domain) prepares and sends them. `peer` uses this transport for that session.
    virtual void regionExposed(PeerId peer, const std::shared_ptr<Region> &r) {
        (void)peer;
        (void)r;
    }
    /// The region was revoked (after its REGION_DEL went to `peer`).
    virtual void regionRevoked(PeerId peer, RegionId r) {
        (void)peer;
        (void)r;
    }
};

}  // namespace tensorlane::sidecar
