// The engine's part for an etcd directory (docs/directory.md): it starts this node's
// Membership (cluster/: registration and the watch, on their own threads) and, on the engine
// thread, turns what the watch saw into the peer layer's peers (PeerManager::addPeer,
// removePeer). The records are untrusted: a node whose key fingerprint is not ours is refused
// and logged (the peer key still authenticates every connection of those accepted).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "cluster/membership.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "tensorlane/sidecar/report.hpp"

namespace tensorlane::sidecar {

class ClusterDirectory {
public:
    /// Reads the key (for its fingerprint) and the etcd password, and starts registering and
    /// watching. `transports`: the remote transports this node offers, by name.
    static std::unique_ptr<ClusterDirectory> start(const config::Config &cfg, PeerManager &peers,
                                                   const std::vector<std::string> &transports,
                                                   Status *error);
    ~ClusterDirectory();

    /// Readable when apply() has events.
    int fd() const { return membership_->fd(); }
    /// Applies the watch's events to the peer layer (engine thread). Returns how many.
    size_t apply();
    /// Stops the threads; `deregister` (a clean stop) deletes our key first.
    void stop(bool deregister) { membership_->stop(deregister); }
    DirectoryReport report() const;

private:
    ClusterDirectory(const config::Config &cfg, PeerManager &peers, std::string fingerprint);
    void accept(const NodeRecord &r);
    void remove(const std::string &name, const std::string &reason);
    void refuse(const std::string &name, const std::string &reason);
    void stateChanged(bool up, const std::string &reason);

    const config::Config &cfg_;
    PeerManager &peers_;
    const std::string fingerprint_;
    std::unique_ptr<Membership> membership_;
    std::map<std::string, uint64_t, std::less<>>
        listed_;  ///< names added to the peer layer, their epochs
    DirectoryReport counts_;
};

}  // namespace tensorlane::sidecar
