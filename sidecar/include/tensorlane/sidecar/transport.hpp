// The seam every transport sits behind (DESIGN.md, "Transports").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

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
    std::shared_ptr<Region> src;  ///< keeps the source mapped until completion
    uint64_t src_offset = 0;
    RegionId dst_region = 0;  ///< the target sidecar's region id
    uint64_t dst_offset = 0;
    uint64_t bytes = 0;
    uint32_t imm = 0;
};

/// Where a transport reports what happened. Called on the engine thread only (from progress()).
class EventSink {
public:
    virtual ~EventSink() = default;
    /// A write this side posted ended. kOk means the data is in place at the target and its
    /// owner has been notified.
    virtual void completed(uint64_t op_id, Code status, std::string_view reason) = 0;
    /// Data landed in a local region and is visible; route a notification to its owner.
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
    /// verbs: memory registration; tcp/local: bookkeeping.
    virtual Status registerRegion(Region &r) = 0;
    virtual void deregisterRegion(RegionId r) = 0;
    /// Never blocks. kAgain when the transport is full for now.
    virtual Status post(WriteOp op) = 0;
    /// Drives I/O and reports events; returns how many events it reported.
    virtual size_t progress(EventSink &sink) = 0;
    /// An fd that becomes readable when progress() has work (-1: poll it every loop).
    virtual int wakeFd() const { return -1; }
    /// Writes posted and not yet reported.
    virtual size_t inFlight() const = 0;
};

}  // namespace tensorlane::sidecar
