// What the peers expose to us: their region descriptors (REGION_ADD/DEL on the control
// connection of our session to them), and the handles the engine's clients hold for them.
//
// Bounded against a hostile or buggy peer: at most [limits] peer_regions descriptors per peer
// (more are ignored, counted and logged), and handles are pruned: a handle whose region was
// revoked, or that belongs to an earlier incarnation of the peer, is kept only as a tombstone
// (so a write through it says why it fails) among a bounded number of tombstones.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "peer/wire.hpp"
#include "tensorlane/sidecar/peers.hpp"

namespace tensorlane::sidecar {

class RegionDirectory {
public:
    /// `max_regions` descriptors per peer; `max_tombstones` dead handles remembered in all.
    explicit RegionDirectory(uint32_t max_regions, size_t max_tombstones = 4096)
        : max_regions_(max_regions), max_tombstones_(max_tombstones) {}

    /// A fresh snapshot from `peer` (its session synchronised): replaces what we knew. A new
    /// incarnation turns every handle of the old one into a tombstone.
    void replace(PeerId peer, uint64_t incarnation, std::map<uint64_t, RegionDescriptor> regions);
    /// Forgets every descriptor of `peer` and turns its handles into tombstones saying `reason`
    /// (the cluster directory says it left, or restarted with a new epoch).
    void forget(PeerId peer, const std::string &reason);
    /// REGION_ADD. False when the peer is over its limit (the descriptor is ignored).
    bool add(PeerId peer, RegionDescriptor d);
    /// REGION_DEL.
    void remove(PeerId peer, uint64_t id);
    /// Whether a snapshot of `peer` is over the limit (how many were dropped).
    uint64_t dropped(PeerId peer) const;

    /// The region exposed by `peer` under `name`, with a handle for the engine; nullopt when
    /// there is none.
    std::optional<RemoteRegion> lookup(PeerId peer, const std::string &name);

    /// What a handle stands for when it is still good.
    struct Target {
        uint64_t remote_id = 0;  ///< the peer's own region id
        uint64_t bytes = 0;
    };
    /// The target of `handle` at `peer`, or nullopt with the reason in `*why`.
    std::optional<Target> resolve(PeerId peer, RegionId handle, std::string *why) const;

    size_t regionCount(PeerId peer) const;
    size_t handleCount() const { return handles_.size(); }
    size_t tombstoneCount() const { return tombstones_.size(); }

private:
    struct PeerRegions {
        uint64_t incarnation = 0;
        std::map<uint64_t, RegionDescriptor> by_id;
        std::unordered_map<std::string, uint64_t> by_name;
        uint64_t dropped = 0;
    };
    struct Handle {
        PeerId peer = 0;
        uint64_t incarnation = 0;
        uint64_t remote_id = 0;
    };
    /// Turns `handle` into a tombstone with `reason`; the oldest tombstones are forgotten.
    void bury(uint64_t handle, std::string reason);

    uint32_t max_regions_;
    size_t max_tombstones_;
    std::unordered_map<PeerId, PeerRegions> peers_;
    std::unordered_map<uint64_t, Handle> handles_;  ///< live handles
    std::map<std::tuple<PeerId, uint64_t, uint64_t>, uint64_t> handle_of_;
    std::unordered_map<uint64_t, std::string> tombstones_;  ///< dead handle → why
    std::deque<uint64_t> tombstone_order_;
    uint64_t next_handle_ = 1;
};

}  // namespace tensorlane::sidecar
