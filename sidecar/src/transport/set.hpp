// The engine's transports: who owns them, which one carries a write, and the loop over them.
//
// The engine owns one TransportSet (local first, then the remote transports in the order of
// [fabric] transports). The peer layer binds a remote transport to a peer when the session we
// opened to it is up and unbinds it when that session fails; the engine posts through the set,
// which is one index into a vector, so the peer layer is never on the data path.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

/// A write that ended, as remote transports queue them before reporting completed().
struct Completion {
    uint64_t op_id = 0;
    Code code = Code::kOk;
    std::string reason;
    uint64_t bytes = 0;
};

class TransportSet {
public:
    TransportSet() = default;
    TransportSet(const TransportSet &) = delete;
    TransportSet &operator=(const TransportSet &) = delete;

    /// Adds a transport; the first with caps().local carries writes within this node, the ones
    /// with caps().remote are offered to peers in the order they were added.
    void add(std::unique_ptr<Transport> t);

    /// Every transport, local first: what the engine polls, progresses and arms.
    const std::vector<Transport *> &all() const { return all_; }
    /// The remote transports in preference order.
    const std::vector<Transport *> &remote() const { return remote_; }
    Transport *local() const { return local_; }
    /// The remote transport with this wire id, or nullptr.
    Transport *byWireId(uint32_t id) const;

    /// The peer layer: `t` carries our writes to `peer` from now on.
    void bind(PeerId peer, Transport *t);
    /// The peer layer: writes to `peer` fail at once with kPeer and `why` (the whole message,
    /// "peer 'x' is down: ...") until it is bound again.
    void unbind(PeerId peer, std::string why);
    /// The transport carrying writes to `peer` now, or nullptr.
    Transport *boundTo(PeerId peer) const {
        return peer < bound_.size() ? bound_[peer].transport : nullptr;
    }

    /// Posts `op` to the transport of its peer (the local one for kLocalPeer); kPeer with the
    /// unbind() message when no transport is bound.
    Status post(const WriteOp &op) const {
        if (op.peer == kLocalPeer && local_ != nullptr) {
            return local_->post(op);
        }
        if (op.peer < bound_.size() && bound_[op.peer].transport != nullptr) {
            return bound_[op.peer].transport->post(op);
        }
        return notBound(op.peer);
    }

    /// registerRegion on every transport, stopping at the first error, which is returned (the
    /// caller then calls deregisterRegion: every transport lets go of what it took).
    Status registerRegion(Region &r) const;
    void deregisterRegion(RegionId r) const;

    /// Destroys every transport (the engine's teardown, after the peer layer went).
    void clear();

private:
    Status notBound(PeerId peer) const;
    struct Binding {
        Transport *transport = nullptr;
        std::string down_reason;
    };
    std::vector<std::unique_ptr<Transport>> owned_;
    std::vector<Transport *> all_;
    std::vector<Transport *> remote_;
    Transport *local_ = nullptr;
    std::vector<Binding> bound_;  ///< by PeerId
};

/// Adds the remote transports `cfg` asks for (none without [[peers]]), in its preference order
/// ([fabric] transports, checked against each one's caps). A transport that cannot start here
/// is left out with a warning while another remains; when none can, or a name is not a remote
/// transport, an error. Defined in transport/registry.cpp: a new transport adds its line there.
Status addRemoteTransports(const config::Config &cfg, RegionTable &regions, TransportSet *set);

}  // namespace tensorlane::sidecar
