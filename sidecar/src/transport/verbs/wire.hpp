// What the verbs transport says on the wire besides RDMA itself: its bootstrap data in SELECT /
// SELECTED, its messages on the session's control connection (TRANSPORT frames), and the write
// descriptor it places in the receiver's descriptor ring before a write's data
// (docs/verbs.md, "The immediate"). Little-endian, like the rest of the peer protocol.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "transport/verbs/qp.hpp"

namespace tensorlane::sidecar {

inline constexpr uint16_t kVerbsWireVersion = 1;

/// SELECT (sender -> receiver) and SELECTED (receiver -> sender) payloads.
struct VerbsBlob {
    uint16_t version = kVerbsWireVersion;
    std::array<uint8_t, 16> gid{};  ///< the end's RoCE v2 GID
    uint32_t mtu_bytes = 0;         ///< its path MTU (min of the TOML and its port's active MTU)
    /// The sender's traffic class and SL: the receiver's QPs use them too, so the ACKs travel
    /// in the same class as the data (DESIGN.md, "Transports").
    uint8_t traffic_class = 0;
    uint8_t sl = 0;
    std::vector<QpEndpoint> qps;
    /// Receiver only: where the sender writes each write's descriptor, before its data.
    uint64_t ring_addr = 0;
    uint32_t ring_rkey = 0;
    uint32_t ring_slots = 0;
};
std::vector<uint8_t> encodeVerbsBlob(const VerbsBlob &b);
/// False with `*error` for a malformed blob (or a version this build does not speak).
bool decodeVerbsBlob(std::span<const uint8_t> payload, VerbsBlob *out, std::string *error);

/// The largest verbs message payload (a KEY_ADD) a channel accepts, with room to spare.
inline constexpr size_t kMaxVerbsMsgBytes = 64;

/// The verbs transport's messages, TRANSPORT frames on the session's verbs channel (an
/// authenticated connection of its own): the frame's arg is (kTransportVerbs << 32) | type.
enum class VerbsMsg : uint32_t {
    kKeyAdd = 1,      ///< receiver -> sender: a region's address and rkey for this session
    kKeyDel = 2,      ///< receiver -> sender: stop using that rkey
    kKeyDelDone = 3,  ///< sender -> receiver: no write of ours uses it any more
    kCredit = 4,      ///< receiver -> sender: descriptors consumed so far (slots free again)
};
uint64_t verbsMsgArg(VerbsMsg m);
/// The message type of a TRANSPORT frame's arg, or 0 when it is not the verbs transport's.
uint32_t verbsMsgOf(uint64_t arg);

/// KEY_ADD payload.
struct RegionKey {
    uint64_t region = 0;  ///< the receiver's region id (the one its REGION_ADD named)
    uint64_t addr = 0;    ///< the address that region's first byte has in the MR
    uint32_t rkey = 0;
    uint64_t bytes = 0;
};
/// Whether [offset, offset + bytes) lies inside the region a key covers (overflow-safe): what
/// a sender checks before it posts a write with that key.
inline bool withinKey(const RegionKey &k, uint64_t offset, uint64_t bytes) {
    return offset <= k.bytes && bytes <= k.bytes - offset;
}
std::vector<uint8_t> encodeRegionKey(const RegionKey &k);
bool decodeRegionKey(std::span<const uint8_t> payload, RegionKey *out);
std::vector<uint8_t> encodeU64(uint64_t v);
bool decodeU64(std::span<const uint8_t> payload, uint64_t *out);

/// One write's descriptor, in the receiver's ring at slot seq % slots, written (inline) on the
/// QP that carries the write's first stripe, before that stripe.
struct WriteDescriptor {
    uint64_t seq = 0;  ///< the write's sequence number in the session (from 1)
    uint64_t region = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t imm = 0;      ///< the writer's own immediate
    uint32_t stripes = 0;  ///< how many QPs carry a part of the write, each ending in an imm
    uint64_t check = 0;    ///< seq ^ region ^ offset ^ bytes ^ magic: catches a torn slot
};
static_assert(sizeof(WriteDescriptor) == 48 && std::is_trivially_copyable_v<WriteDescriptor>);
uint64_t descriptorCheck(const WriteDescriptor &d);

/// The wire immediate: which write a stripe belongs to and how many stripes it has.
///   bits 0-22   the write's sequence number modulo 2^23
///   bits 23-29  stripes - 1 (1..128 stripes)
///   bit  30     0
///   bit  31     0
struct WireImm {
    static constexpr uint32_t kSeqBits = 23;
    static constexpr uint32_t kSeqMask = (1u << kSeqBits) - 1;
    static uint32_t encode(uint64_t seq, uint32_t stripes) {
        return static_cast<uint32_t>(seq & kSeqMask) | ((stripes - 1) & 0x7f) << kSeqBits;
    }
    static uint32_t seqOf(uint32_t imm) { return imm & kSeqMask; }
    static uint32_t stripesOf(uint32_t imm) { return ((imm >> kSeqBits) & 0x7f) + 1; }
};

}  // namespace tensorlane::sidecar
