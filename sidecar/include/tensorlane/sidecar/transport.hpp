// The one seam every transport sits behind (DESIGN.md, "Transports"; docs/architecture.md,
// "Adding a transport"; transport/tcp/tcp_transport.hpp is the worked example).
//
// A transport moves write-with-immediate from a source region to a target region, and says
// what it can do (TransportCaps): which memory, within this node or to peer nodes, in what
// order. The engine owns every transport (TransportSet) and drives each from its one thread:
// their fds sit in the engine's epoll set, post() never blocks, progress() reports what
// happened through an EventSink, arm() comes before the engine sleeps.
//
// To peer nodes a transport runs sessions. The peer layer (peer/) authenticates the other
// node, carries each transport's own bootstrap data as an opaque blob (SELECT / SELECTED), hands
// over any extra authenticated connections the transport asks for (its channels: data
// connections, a channel for its own messages), and binds the transport to the peer once the
// session is up. From then on the transport owns the bytes: its data, its acknowledgements,
// credits and key messages travel on its own channels or RDMA writes, never on the peer layer's
// control connection. Sessions are one-way: our writes to a peer go over the session we opened
// (kOut), its writes to us over the one it opened (kIn).
//
// A transport may keep threads of its own (the local copy worker, verbs' async events); they
// hand their events to the engine thread through a queue and an fd in pollFds(), never by
// touching the engine's tables.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/report.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class Connection;  // net/connection.hpp: an authenticated, framed TCP connection

/// A peer's index in the engine's peer list; kLocalPeer is this node.
using PeerId = uint32_t;
inline constexpr PeerId kLocalPeer = 0;

enum class PeerState { kDown, kConnecting, kUp, kFailed };
const char *toString(PeerState s);

/// Which of a peer's two sessions: the one we opened (our writes) or the one it opened to us.
enum class SessionSide : uint8_t { kOut, kIn };

/// Wire ids of the remote transports, announced in the bootstrap as bits (PeerCaps::transports)
/// and named by SELECT. A new transport takes the next free bit.
enum TransportWireId : uint32_t {
    kTransportTcp = 1u << 0,
    kTransportVerbs = 1u << 1,
};

/// What a transport can do. The engine routes by it and the sidecar checks the configured
/// preference list ([fabric] transports) against it.
struct TransportCaps {
    bool host_memory = true;   ///< moves host regions (either end)
    bool cuda_memory = false;  ///< moves CUDA regions (either end)
    bool local = false;        ///< between two clients of this node (PeerId kLocalPeer)
    bool remote = false;       ///< to peer nodes, over sessions the peer layer bootstraps
    /// Writes to one peer end (completed()) in the order they were posted, and each arrives
    /// (arrived()) before its completion. Every transport here is ordered; the engine relies on
    /// it for tl_deregister after a write and for stream-ordered writes.
    bool ordered = true;
    /// Takes scattered writes (WriteOp::extents) between host regions.
    bool scatter = false;
    /// ... and from CUDA regions to a peer (remote transports that stage GPU sources).
    bool scatter_from_gpu = false;
    uint64_t max_message = 0;  ///< the largest single write; 0: any size a region can hold
    uint32_t wire_id = 0;      ///< remote: its TransportWireId
    uint64_t link_mbps = 0;    ///< remote: its link's rate (the NIC port's), 0 when unknown
    /// remote: its NIC's PCI function in sysfs ("/sys/devices/pci0000:00/.../0000:03:00.0");
    /// empty when it has none (tcp, a device on no bus)
    std::string nic_pci_path;
};

/// The most bytes WriteOp::message may hold (the engine's group and payload records,
/// request_pipeline's message.hpp; the payload itself is at most 256 of them).
inline constexpr size_t kMaxMessageBytes = 512;

/// One range of a scattered write (WriteOp::extents).
struct Extent {
    uint64_t src_offset = 0;
    uint64_t dst_offset = 0;
    uint64_t bytes = 0;
};

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
    /// No notification at the target: the data lands, and the write ends (completed()) as any
    /// other, but the target reports no arrived() for it (an entry of a grouped write, or the
    /// data of a write whose payload follows it as a message).
    bool silent = false;
    /// The bytes of the whole grouped write this op is an entry of (0: none): a transport that
    /// picks how to copy by size (the local one streams copies past the cache when they are
    /// large) looks at the group, whose entries together stream as one write.
    uint64_t group_bytes = 0;
    /// A scattered write, to a transport whose caps() say `scatter`, between host regions (or
    /// from a CUDA region, where they say `scatter_from_gpu`):
    /// these ranges, in order, instead of (src_offset, dst_offset, bytes); `bytes` is their
    /// sum (a grouped write's entries between one pair of regions, as one op). Shared: the
    /// copies a transport makes of the op share the list.
    std::shared_ptr<const std::vector<Extent>> extents;
    /// A message (`bytes` is 0 then, and `silent` false): at most kMaxMessageBytes that the
    /// transport carries verbatim, in order with the writes before and after it on the same
    /// peer, and the target reports with messageArrived() instead of arrived() (the region is
    /// checked there as for a write of 0 bytes at dst_offset). Opaque to transports: the
    /// engine's (a payload, a group's start or end).
    std::vector<uint8_t> message;
    /// Another op to the same peer follows this one in the same engine turn (the parts of one
    /// tl_write_msg or group): a transport may hold this one back and send them together, as
    /// long as it sends it within the turn (its progress()) whatever comes next. A hint only.
    bool more = false;
};

/// What every transport's post() checks of `silent` and `message` (kOk, or kInvalid with the
/// reason): a message has no bytes, is not silent and holds at most kMaxMessageBytes; a write
/// without one has bytes.
inline Status checkMessage(const WriteOp &op) {
    if (op.message.empty()) {
        return op.bytes != 0 ? Status::ok() : Status{Code::kInvalid, "write of 0 bytes"};
    }
    if (op.bytes != 0 || op.silent) {
        return {Code::kInvalid, "a message carries no bytes and is never silent"};
    }
    if (op.message.size() > kMaxMessageBytes) {
        return {Code::kInvalid, "message of " + std::to_string(op.message.size()) +
                                    " bytes (at most " + std::to_string(kMaxMessageBytes) + ")"};
    }
    return Status::ok();
}

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
    /// A message (WriteOp::message) reached a local region, after every write posted before it
    /// on the same peer arrived. Same rules as arrived(); `message` is valid during the call.
    /// Untrusted when it came from a peer: the engine checks it.
    virtual void messageArrived(RegionId region, uint32_t imm, uint64_t offset,
                                std::span<const uint8_t> message, std::string_view peer_name) {
        (void)region;
        (void)imm;
        (void)offset;
        (void)message;
        (void)peer_name;
    }
    /// A peer came up, failed or went down.
    virtual void peerState(PeerId peer, PeerState state, std::string_view reason) = 0;
    /// The session `peer` opened to us (its writes) closed: what it had half sent is dropped.
    virtual void inboundClosed(PeerId peer, std::string_view reason) {
        (void)peer;
        (void)reason;
    }
};

/// What the peer layer tells a transport about a session it opens on it.
struct SessionInfo {
    std::string peer_name;
    uint64_t session_id = 0;
    uint64_t incarnation = 0;  ///< the peer process's
    bool integrity = false;    ///< the session's connections carry FrameAuth tags
    /// The other end's bootstrap blob (its localBlob()), as it came; the transport checks it.
    std::vector<uint8_t> remote_blob;
};

/// What a remote transport may ask of the peer layer (engine thread only).
class TransportHost {
public:
    virtual ~TransportHost() = default;
    /// kOut: opens `count` more authenticated connections in our session to `peer`; each
    /// arrives through Transport::adoptChannel with its index, or the session fails.
    virtual void openChannels(PeerId peer, uint32_t count) = 0;
    /// kOut: the session's transport part is up; the peer layer binds this transport to the
    /// peer and writes may be posted.
    virtual void sessionReady(PeerId peer) = 0;
    /// Tears the session down with `reason` (a protocol error, a stalled peer).
    virtual void failSession(PeerId peer, SessionSide side, const std::string &reason) = 0;
    /// The peer's configured name (for notifications and logs).
    virtual std::string peerName(PeerId peer) const = 0;
};

class Transport {
public:
    virtual ~Transport() = default;
    virtual const char *name() const = 0;
    virtual TransportCaps caps() const = 0;
    /// Whether this node can use it now (verbs: its port is up).
    virtual bool available() const { return true; }

    // ----- memory
    /// Called when a region is allocated or registered, on the engine thread, with its id
    /// already given (it enters the region table once every transport took it); must not
    /// block for long (verbs registers MRs lazily on its own threads). When one transport
    /// refuses, every transport gets deregisterRegion(r.id) and the region is never added.
    virtual Status registerRegion(Region &r) = 0;
    /// Called once no write of any transport uses the region any more.
    virtual void deregisterRegion(RegionId r) = 0;

    // ----- sessions with peer nodes (caps().remote only; the defaults suit a local transport)
    /// Gives the transport the peer layer it talks to, before any session opens.
    virtual void attach(TransportHost &host) { (void)host; }
    /// The bootstrap data this end sends in SELECT (kOut) or SELECTED (kIn). An empty blob from
    /// a transport that needs one means it cannot make a session now.
    virtual std::vector<uint8_t> localBlob(PeerId peer, SessionSide side);
    /// A session is open at both ends. kIn: decode the sender's blob, get ready to receive, and
    /// say in `*channels` how many authenticated connections the sender will open (the peer
    /// layer accepts exactly those). kOut: start (openChannels if needed) and call
    /// TransportHost::sessionReady once writes may be posted.
    virtual Status openSession(PeerId peer, SessionSide side, const SessionInfo &info,
                               uint32_t *channels);
    /// The session is gone: kOut fails every write in flight with `code` (each ends exactly once,
    /// through progress()); kIn drops what was half received.
    virtual void closeSession(PeerId peer, SessionSide side, Code code, const std::string &reason);
    /// An authenticated connection of the session (channel `index`), from then on the
    /// transport's. It may hold bytes already read (the other end may speak right after its
    /// READY): epoll will not report those, so the transport looks at Connection::buffered().
    /// The default closes it.
    virtual void adoptChannel(PeerId peer, SessionSide side, uint32_t index,
                              std::unique_ptr<Connection> conn);
    /// A local region was exposed to `peer` (after its REGION_ADD went out on the session
    /// `peer` opened to us, which uses this transport): a transport that needs per-peer keys
    /// (verbs: an rkey in that session's protection domain) prepares and sends them. Right
    /// after openSession(kIn) succeeds this comes once for every region exposed at that moment,
    /// then for each one exposed later.
    virtual void regionExposed(PeerId peer, const std::shared_ptr<Region> &r) {
        (void)peer;
        (void)r;
    }
    /// The region was revoked (after its REGION_DEL went to `peer`).
    virtual void regionRevoked(PeerId peer, RegionId r) {
        (void)peer;
        (void)r;
    }

    // ----- the data path (engine thread)
    /// Never blocks. kAgain when the queue to `op.peer` is full for now (the engine keeps the
    /// op in that peer's queue and posts it again on a later turn); any other error ends the op
    /// at once. On kOk the op ends exactly once, later, through EventSink::completed().
    virtual Status post(const WriteOp &op) = 0;
    /// Drives I/O and reports events; returns how many events it reported.
    virtual size_t progress(EventSink &sink) = 0;
    /// Called once a turn, after the engine has published the turn's completions and
    /// notifications to its clients: output that may wait until they have heard goes now (the
    /// tcp transport's ACKs: a loopback send costs microseconds, which a receiver's notification
    /// would otherwise wait for). Never blocks; the engine calls it before it may sleep.
    virtual void afterPublish() {}
    /// Fds that become readable when progress() has work; the engine sleeps on them.
    virtual std::vector<int> pollFds() const { return {}; }
    /// The engine saw `fd`, one of pollFds(), readable; progress() follows in the same turn. A
    /// transport whose fds lead to a system call when looked at (an epoll set of its own)
    /// looks only then. In busy mode the engine looks at fds every 1024 turns.
    virtual void readable(int fd) { (void)fd; }
    /// Called right before the engine sleeps (after it raised its own sleep flags): arm
    /// notifications (a CQ), then check again. False: there is work now; do not sleep.
    virtual bool arm() { return true; }

    // ----- status
    /// Per-peer figures (`tensorlane status`, metrics): the typed ones, and with kFull the
    /// transport's own as `detail` (report.hpp). The default: the name alone.
    virtual TransportPeerReport peerReport(PeerId peer, ReportDetail want) const;
};

}  // namespace tensorlane::sidecar
