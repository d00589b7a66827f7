// Remote peers: the authenticated bootstrap, exposed-region descriptors and lookups, liveness,
// and which transport carries our writes to each peer (bound in the engine's TransportSet).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/report.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

/// A region a peer exposed to us, as its descriptor said.
struct RemoteRegion {
    RegionId id = 0;  ///< the peer sidecar's region id
    uint64_t bytes = 0;
};

/// A node the cluster directory lists (docs/directory.md), as the engine's directory part hands
/// it to the peer layer once it checked the record (its key fingerprint among others).
struct DirectoryPeer {
    std::string name;
    config::Endpoint address;  ///< its bootstrap address
    uint64_t epoch = 0;        ///< its boot epoch; another one under the same name: a restart
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
    /// The peer's own id of the region a handle from lookup() stands for; false with the
    /// reason when the peer revoked it or restarted since (a write then fails at once with
    /// kNotFound).
    virtual bool resolveRemote(PeerId peer, RegionId handle, uint64_t *remote_id,
                               std::string *why) const = 0;
    /// resolveRemote() without the details.
    bool remoteValid(PeerId peer, RegionId handle) const {
        uint64_t id = 0;
        std::string why;
        return resolveRemote(peer, handle, &id, &why);
    }

    /// A local region was exposed or revoked: tell the connected peers.
    virtual void regionExposed(const Region &r) = 0;
    virtual void regionRevoked(RegionId r) = 0;

    /// Closes our session to `peer` and stops reconnecting it until it is used again.
    virtual void disconnect(PeerId peer) = 0;

    // ----- peers of a cluster directory (docs/directory.md); [[peers]] never change

    /// Adds the directory's node as a peer, or updates the entry of that name: a new address
    /// is dialled from the next attempt on; a new epoch is a restarted node (our sessions with
    /// it fail, writes in flight end kPeer, its handles die: writes through them kNotFound).
    /// Connected eagerly with [node] connect_eagerly. Returns its id (kept across leaving and
    /// joining again). Fails (kInvalid) for this node's own name or a [[peers]] name.
    virtual Status addPeer(const DirectoryPeer &p, PeerId *id) = 0;
    /// The directory no longer lists `name` (or refuses it): writes in flight fail with kPeer
    /// and `reason`, pending lookups too, its handles die, and lookups of the name say
    /// `reason` until it is listed again.
    virtual void removePeer(std::string_view name, const std::string &reason) = 0;
    /// What a lookup of a name that is no peer answers: `code` and "node 'NAME' " + `text`
    /// (the directory: not registered, or etcd down). Unset: not a configured peer.
    virtual void setUnknownPeerAnswer(Code code, std::string text) = 0;
    /// The answer to a lookup of `name`, which is no peer (peerByName said nullopt).
    virtual Status unknownPeer(std::string_view name) const = 0;
    /// This process's incarnation (random, announced in every handshake; the directory's epoch).
    virtual uint64_t incarnation() const = 0;

    /// Readable when progress() has work.
    virtual int wakeFd() const = 0;
    /// The engine saw wakeFd() readable: the next progress() looks at the sockets, timer and
    /// resolver (only then: an epoll_wait per engine turn would be a system call for nothing).
    virtual void readable() = 0;
    /// Runs lookup callbacks, peer state changes, and the sockets of bootstrap and liveness.
    virtual size_t progress(EventSink &sink) = 0;

    /// Peers, their state, transport and counters; the listener. kTyped leaves out what only
    /// `tensorlane status` shows (the transports' `detail`).
    virtual PeersReport report(ReportDetail want = ReportDetail::kFull) const = 0;
    /// report() as the JSON object's text (report_json.cpp).
    std::string statusJson() const;
};

class TransportSet;

/// Builds the peer manager for `cfg` over the remote transports of `transports` (which must
/// outlive it). Fails when the key file cannot be read.
std::unique_ptr<PeerManager> makePeerManager(const config::Config &cfg, RegionTable &regions,
                                             TransportSet &transports, Status *error);

}  // namespace tensorlane::sidecar
