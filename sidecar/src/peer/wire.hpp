// The bootstrap messages carried in HELLO, CHALLENGE, AUTH and REGION_ADD frames
// (net/frame.hpp has the framing; docs/peers.md the whole protocol).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/set.hpp"

namespace tensorlane::sidecar {

/// The peer protocol version. Bumped on any incompatible change; both ends must speak the same
/// one. Every version keeps the frame header and the HELLO payload's first two bytes (this
/// version) where they are, so a mismatch is always reported as such.
/// 2: frame integrity, transports. 3: each transport's parameters in its own SELECT blob (no
/// [tcp] settings in HELLO), tcp ACKs on the session's data connection 0.
inline constexpr uint16_t kPeerProtocolVersion = 3;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
/// The longest node name the protocol carries (tl_notification holds 63 bytes and a NUL).
inline constexpr size_t kMaxNodeNameBytes = 63;
/// The longest exposed-region name carried in a descriptor.
inline constexpr size_t kMaxRegionNameBytes = 255;

/// What a connection is for, told in HELLO. Wire values.
enum class LinkRole : uint8_t { kControl = 1, kData = 2 };

/// Settings a node announces at bootstrap.
struct PeerCaps {
    uint32_t peer_timeout_ms = 0;  ///< [tcp] peer_timeout_ms; the other end heartbeats faster
    uint32_t keepalive_ms = 0;     ///< [tcp] keepalive_ms
    uint32_t integrity = 1;        ///< [security] tcp_integrity: 1 mac, 0 none; must match
    uint32_t transports = kTransportTcp;  ///< TransportWireId bits this node offers now
};

/// HELLO: the client's opening message.
struct HelloMsg {
    uint16_t version = kPeerProtocolVersion;
    LinkRole role = LinkRole::kControl;
    std::array<uint8_t, kNonceBytes> nonce{};
    uint64_t incarnation = 0;  ///< random per sidecar process: a restart is a new incarnation
    uint64_t session_id = 0;   ///< data connections: the control session they join
    uint32_t data_index = 0;   ///< data connections: 0 .. connections-1
    PeerCaps caps;
    std::string from;  ///< the connecting node's name
    std::string to;    ///< the node it means to reach
};

/// CHALLENGE: the server's answer, with its MAC over HELLO and this message.
struct ChallengeMsg {
    uint16_t version = kPeerProtocolVersion;
    std::array<uint8_t, kNonceBytes> nonce{};
    uint64_t incarnation = 0;
    uint64_t session_id = 0;  ///< control: fresh; data: echoed
    PeerCaps caps;
    std::string from;  ///< the server node's name
    std::array<uint8_t, kMacBytes> mac{};
};

/// A region descriptor (REGION_ADD payload; the frame's arg is the region id).
struct RegionDescriptor {
    uint64_t id = 0;
    uint64_t bytes = 0;
    std::string name;
};

std::vector<uint8_t> encodeHello(const HelloMsg &m);
/// False with `*error` on malformed input (short, trailing bytes, bad role, long names).
bool decodeHello(std::span<const uint8_t> payload, HelloMsg *out, std::string *error);
/// The version in a HELLO or CHALLENGE payload, readable whatever the rest holds; 0 if short.
uint16_t peekVersion(std::span<const uint8_t> payload);

/// The CHALLENGE payload without its trailing MAC (what the MAC covers).
std::vector<uint8_t> encodeChallengeBody(const ChallengeMsg &m);
bool decodeChallenge(std::span<const uint8_t> payload, ChallengeMsg *out, std::string *error);

std::vector<uint8_t> encodeRegionAdd(uint64_t bytes, const std::string &name);
bool decodeRegionAdd(uint64_t id, std::span<const uint8_t> payload, RegionDescriptor *out);

}  // namespace tensorlane::sidecar
