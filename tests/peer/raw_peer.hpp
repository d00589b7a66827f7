// A peer that speaks the protocol by hand over blocking sockets, so that it can lie: an
// authenticated node that sends what a real one never would (two chunks claiming the same bytes,
// early ACKs, bad tags). It uses the project's own framing, handshake and FrameAuth, so what it
// sends passes every check except the one a test aims at.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "net/frame.hpp"
#include "net/frame_auth.hpp"
#include "peer/handshake.hpp"
#include "peer/key.hpp"

namespace tensorlane::peertest {

/// One blocking TCP connection with frame I/O (tags once authenticated).
class RawConn {
public:
    RawConn() = default;
    explicit RawConn(int fd) : fd_(fd) {}
    ~RawConn();
    RawConn(RawConn &&o) noexcept;
    RawConn &operator=(RawConn &&o) noexcept;
    RawConn(const RawConn &) = delete;
    RawConn &operator=(const RawConn &) = delete;

    /// Connects to 127.0.0.1:port (or `host`), from `source` when given (any 127/8 address
    /// works on loopback: a test's stand-in for another host).
    static RawConn connect(uint16_t port, const std::string &host = "127.0.0.1",
                           const std::string &source = "");
    bool ok() const { return fd_ >= 0; }
    int fd() const { return fd_; }

    /// Sends a whole frame (tagged when authenticated).
    bool send(sidecar::FrameType type, uint64_t arg, std::span<const uint8_t> payload = {});
    /// What sendChunk() does to a frame on its way.
    enum class Tamper {
        kNone,
        kForged,       ///< both tags wrong: not a frame of this connection's key
        kDataChanged,  ///< the data changed after it was tagged (its header tag holds)
    };
    /// Sends a CHUNK frame; `corrupt_tag` forges it (Tamper::kForged).
    bool sendChunk(uint64_t seq, const sidecar::ChunkHeader &h, const uint8_t *data, uint32_t len,
                   bool corrupt_tag = false);
    bool sendChunk(uint64_t seq, const sidecar::ChunkHeader &h, const uint8_t *data, uint32_t len,
                   Tamper tamper);
    /// Receives one frame within `timeout_ms` (verifying its tag when authenticated).
    bool recv(sidecar::FrameHeader *h, std::vector<uint8_t> *payload, int timeout_ms = 5000);
    /// Receives the next frame of `type`, skipping heartbeats.
    bool recvType(sidecar::FrameType type, sidecar::FrameHeader *h, std::vector<uint8_t> *payload,
                  int timeout_ms = 5000);
    /// Sends bytes as they are (no framing, no tag): for frames cut in the middle.
    bool sendRaw(const void *p, size_t n) { return writeAll(p, n); }
    /// The trailer a CHUNK frame gets (kChunkTrailerBytes; consumes a frame number), for frames
    /// sent in pieces.
    void chunkTag(const uint8_t *head, const uint8_t *data, uint32_t len, uint8_t *trailer) {
        tx_.signChunk(head, sidecar::kChunkFrameOverhead, data, len, trailer);
    }
    bool tagged() const { return tx_.enabled(); }
    /// Whether the other end closed the connection within `timeout_ms`.
    bool closedWithin(int timeout_ms);
    /// Starts tagging frames (client: c2s out, s2c in).
    void authenticate(const sidecar::HandshakeOutcome &o, bool client);

private:
    bool writeAll(const void *p, size_t n);
    bool readAll(void *p, size_t n, int timeout_ms);
    int fd_ = -1;
    sidecar::FrameAuth tx_;
    sidecar::FrameAuth rx_;
};

/// The settings a raw peer announces; must match the node's [tcp] (defaults of makeConfig).
struct RawCaps {
    uint32_t chunk_bytes = 1u << 20;
    uint32_t connections = 2;
    uint32_t peer_timeout_ms = 1500;
    uint32_t keepalive_ms = 250;
    bool integrity = true;
    /// Transport bits announced in the handshake (kTransportTcp, kTransportVerbs).
    uint32_t transports = 1;
};

/// The identity a raw peer presents.
sidecar::HandshakeIdentity rawIdentity(const std::string &name, const RawCaps &caps);

/// A raw node connecting to a real one as `name` (which the real node lists in [[peers]]):
/// the control connection, the snapshot, SELECT/SELECTED, then data connections on demand.
class RawClientPeer {
public:
    RawClientPeer(const std::string &secret, std::string name, std::string server_name,
                  uint16_t port, RawCaps caps = {});
    /// Connects from this local address (default: the kernel's choice, 127.0.0.1).
    void bindSource(std::string source) { source_ = std::move(source); }
    /// Handshake, snapshot until READY, SELECT tcp, SELECTED. False with `*why` (a REFUSE's
    /// text when the node refused the HELLO).
    bool openSession(std::string *why);
    /// The same with SELECT of `transport` carrying `blob`; SELECTED's payload in `*selected`.
    bool openSession(uint32_t transport, std::span<const uint8_t> blob,
                     std::vector<uint8_t> *selected, std::string *why);
    /// Opens and authenticates data connection `index` of the session.
    bool openData(uint32_t index, std::string *why);
    /// The exposed regions the snapshot listed: name → (id, bytes).
    const std::vector<sidecar::RegionDescriptor> &regions() const { return regions_; }
    RawConn &control() { return control_; }
    RawConn &data(uint32_t index) { return data_.at(index); }

private:
    sidecar::PeerKey key_;
    std::string name_;
    std::string server_name_;
    uint16_t port_;
    RawCaps caps_;
    std::string source_;
    RawConn control_;
    std::vector<RawConn> data_;
    uint64_t session_id_ = 0;
    uint64_t server_incarnation_ = 0;
    std::vector<sidecar::RegionDescriptor> regions_;
};

/// A raw node that a real one connects to (listed in its [[peers]] at this port): answers the
/// handshake, describes one region, accepts the session and its data connections.
/// A TCP socket listening on 127.0.0.1 at a port the kernel picks (`*port`); the fd.
int listenOnLoopback(uint16_t *port);

class RawServerPeer {
public:
    RawServerPeer(const std::string &secret, std::string name, RawCaps caps = {});
    ~RawServerPeer();
    uint16_t port() const { return port_; }
    /// Accepts the real node's control connection and its handshake, sends a snapshot with
    /// `region` (id 1) and READY, waits for SELECT and answers SELECTED.
    bool acceptSession(const sidecar::RegionDescriptor &region, std::string *why);
    /// Accepts the data connections the real node opens (as many as caps.connections).
    bool acceptData(std::string *why);
    RawConn &control() { return control_; }
    RawConn &data(uint32_t index) { return data_.at(index); }

private:
    bool acceptOne(RawConn *out, sidecar::HandshakeOutcome *o, std::string *why);
    sidecar::PeerKey key_;
    std::string name_;
    RawCaps caps_;
    int listen_fd_ = -1;
    uint16_t port_ = 0;
    uint64_t session_id_ = 0x5e55;
    RawConn control_;
    std::vector<RawConn> data_;
};

}  // namespace tensorlane::peertest
