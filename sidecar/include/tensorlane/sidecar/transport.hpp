// The seam every transport sits behind (DESIGN.md, "Transports"; docs/architecture.md).
//
// A transport is chosen per peer at bootstrap (local for this node; verbs where both ends can,
// else tcp). The engine drives every transport from its one thread: post() never blocks,
// progress() reports what happened through an EventSink. A transport may keep threads of its
// own (the local copy worker, an async-event thread for verbs); they hand their events to the
// engine through a queue and an fd the engine polls, never by touching sessions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// A peer's index in the engine's peer list; kLocalPeer is this node.
using PeerId = uint32_t;
inline constexpr PeerId kLocalPeer = 0;

enum class PeerState { kDown, kConnecting, kUp, kFailed };
const char *toString(PeerState s);

/// One write-with-immediate. The engine validated it; the transport moves it.
struct WriteOp {
    uint64_t op_id = 0;  ///< unique per engine; reported back in completed()
    PeerId peer = kLocalPeer;
    std::shared_ptr<Region> src;  ///< keeps the source alive until completion
    uint64_t src_offset = 0;
    RegionId dst_region = 0;     ///< local: the target's region id; remote: the engine's handle
    uint64_t remote_region = 0;  ///< remote: the peer sidecar's own region id (peer layer)
    /// The target region itself when it is local (kLocalPeer): resolved by the engine so that a
    /// transport thread never looks anything up in the engine's tables.
    std::shared_ptr<Region> dst;
    uint64_t dst_offset = 0;
    uint64_t bytes = 0;
    uint32_t imm = 0;
};

/// Where a transport reports what happened. Called on the engine thread only (from progress()).
class EventSink {
public:
    virtual ~EventSink() = default;
    /// A write this side posted ended. kOk means the data is in place at the target.
    virtual void completed(uint64_t op_id, Code status, std::string_view reason) = 0;
    /// Data landed in a local region and is visible; route a notification to its owner. Comes
    /// before the writer's completed() wherever both ends are on this node.
    virtual void arrived(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                         std::string_view peer_name) = 0;
    /// A peer came up, failed or went down.
    virtual void peerState(PeerId peer, PeerState state, std::string_view reason) = 0;
};

/// One per kind; owns its connections to peers.
class Transport {
public:
    virtual ~Transport() = default;
    virtual const char *name() const = 0;
    /// Starts talking to `peer` (after bootstrap authenticated it, for remote transports).
    virtual Status connect(PeerId peer) = 0;
    virtual void disconnect(PeerId peer) = 0;
    /// Makes `r` usable by this transport (verbs: memory registration; tcp/local: nothing).
    /// Called when a region is allocated, registered or exposed; a transport whose
    /// registration is slow says so in slowRegistration() and is then called off the engine
    /// thread.
    virtual Status registerRegion(Region &r) = 0;
    /// Called only once no work of this transport uses the region any more.
    virtual void deregisterRegion(RegionId r) = 0;
    /// Whether registerRegion() may take long enough (milliseconds) that it must not run on
    /// the engine thread.
    virtual bool slowRegistration() const { return false; }
    /// Never blocks. kAgain when the queue to `op.peer` is full for now (the engine keeps the
    /// op in that peer's queue and posts it again after progress() reported a completion);
    /// any other error ends the op at once. On kOk the op ends exactly once, later, through
    /// EventSink::completed().
    virtual Status post(const WriteOp &op) = 0;
    /// Drives I/O and reports events; returns how many events it reported.
    virtual size_t progress(EventSink &sink) = 0;
    /// Fds that become readable when progress() has work; the engine sleeps on them.
    virtual std::vector<int> pollFds() const { return {}; }
    /// Called right before the engine sleeps (after it raised its own sleep flags): arm
    /// notifications (a CQ), then check again. False: there is work now; do not sleep.
    virtual bool arm() { return true; }
    /// Writes posted and not yet reported.
    virtual size_t inFlight() const = 0;
};

}  // namespace tensorlane::sidecar
