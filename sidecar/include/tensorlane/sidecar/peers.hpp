// Remote peers: the authenticated bootstrap, exposed-region descriptors, and the transport that
// carries writes to them (tcp here; verbs with the RDMA issue).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

/// A region a peer exposed to us, as its descriptor said.
struct RemoteRegion {
    RegionId id = 0;  ///< the peer sidecar's region id
    uint64_t bytes = 0;
};

/// Owns everything about remote peers. Peer ids are 1 + the index in cfg.peers (kLocalPeer, 0,
/// is this node). Every method is called on the engine thread; internal threads hand their
/// results over through wakeFd()/progress().
class PeerManager {
public:
    virtual ~PeerManager() = default;

    /// Listens on [node] listen and, with connect_eagerly, starts connecting every peer.
    virtual Status start() = 0;
    /// Closes every connection and joins internal threads; in-flight writes complete with kPeer.
    virtual void stop() = 0;

    /// The id of a configured peer, or nullopt.
    virtual std::optional<PeerId> peerByName(std::string_view name) const = 0;
    virtual std::string peerName(PeerId id) const = 0;
    virtual PeerState peerState(PeerId id) const = 0;

    /// Finds `name` among the regions `peer` exposes to us, connecting first if needed. `done`
    /// runs exactly once on the engine thread (from progress()): kOk with the region, kNotFound
    /// when the peer has no such exposed region, kPeer when it cannot be reached in time.
    virtual void lookup(PeerId peer, const std::string &name,
                        std::function<void(Status, RemoteRegion)> done) = 0;
    /// False when the peer has revoked the region (so a write fails fast with kNotFound).
    virtual bool remoteValid(PeerId peer, RegionId remote) const = 0;

    /// A local region was exposed or revoked: tell the connected peers.
    virtual void regionExposed(const Region &r) = 0;
    virtual void regionRevoked(RegionId r) = 0;

    /// The transport that carries writes to remote peers.
    virtual Transport &transport() = 0;

    /// Readable when progress() has work.
    virtual int wakeFd() const = 0;
    /// Runs lookup callbacks, peer state changes and the transport's events.
    virtual size_t progress(EventSink &sink) = 0;

    /// Peers, their state, transport and counters, as a JSON object's text.
    virtual std::string statusJson() const = 0;
};

/// Builds the peer manager for `cfg`. Regions are read (exposure, bounds) by transport threads.
/// Fails when the key file cannot be read.
std::unique_ptr<PeerManager> makePeerManager(const config::Config &cfg, RegionTable &regions,
                                             Status *error);

}  // namespace tensorlane::sidecar
