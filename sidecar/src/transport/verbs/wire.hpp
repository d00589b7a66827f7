// What the verbs transport says on the wire besides RDMA itself: its bootstrap data in SELECT /
// SELECTED, its messages on the session's control connection (TRANSPORT frames), and the write
// descriptor it places in the receiver's descriptor ring before a write's data
// (docs/verbs.md, "The immediate"). Little-endian, like the rest of the peer protocol.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "transport/verbs/qp.hpp"

namespace tensorlane::sidecar {

/// 2: the write descriptor has flags (silent, message) and room for a message (576-byte slots).
inline constexpr uint16_t kVerbsWireVersion = 2;

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
    /// receiver -> sender: the message with this sequence number was not delivered (its region
    /// is not, or no longer, exposed to the sender); the CREDIT that covers it follows.
    kMessageDropped = 5,
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

/// The descriptor's flags.
inline constexpr uint32_t kDescSilent = 1u << 0;   ///< nobody is notified of this write
inline constexpr uint32_t kDescMessage = 1u << 1;  ///< a message: no data, `message` is it
inline constexpr uint32_t kDescKnownFlags = kDescSilent | kDescMessage;
/// The most bytes a descriptor's message holds (transport.hpp's kMaxMessageBytes).
inline constexpr size_t kDescMaxMessageBytes = 512;
/// The fixed part of a descriptor, before the message: what a write's descriptor sends.
inline constexpr size_t kDescHeaderBytes = 64;

/// One write's descriptor, in the receiver's ring at slot seq % slots, written on the QP that
/// carries the write's first stripe, before that stripe (the header alone: inline). A message's
/// descriptor is the header and the message's bytes, written with the message's immediate (a
/// WRITE_WITH_IMM to the ring itself: a message is one stripe and has no other work request).
/// Everything in a slot is the peer's: the receiver checks each field (RecvWindow::onImm).
struct WriteDescriptor {
    uint64_t seq = 0;  ///< the write's sequence number in the session (from 1)
    uint64_t region = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;          ///< 0 for a message, else at least 1
    uint32_t imm = 0;            ///< the writer's own immediate
    uint32_t stripes = 0;        ///< how many QPs carry a part of the write, each ending in an imm
    uint32_t flags = 0;          ///< kDescSilent, kDescMessage; any other bit is a protocol error
    uint32_t message_bytes = 0;  ///< a message's length (1..512); 0 for a write
    uint64_t message_check = 0;  ///< messageCheck() of the message's bytes; 0 for a write
    uint64_t check = 0;          ///< descriptorCheck(): over every field above, catches a torn slot
    uint8_t message[kDescMaxMessageBytes]{};  ///< a message's bytes (message_bytes of them sent)
};
static_assert(sizeof(WriteDescriptor) == kDescHeaderBytes + kDescMaxMessageBytes &&
              offsetof(WriteDescriptor, message) == kDescHeaderBytes &&
              std::is_trivially_copyable_v<WriteDescriptor>);
/// The check word of `d`'s header (every field before `check`).
uint64_t descriptorCheck(const WriteDescriptor &d);
/// The check word of a message's bytes, for write `seq`.
uint64_t messageCheck(uint64_t seq, const uint8_t *message, size_t len);
/// What a descriptor's fields say, once its check word matched; false with `*error` when they
/// break the protocol (unknown flags, a message of a bad length or with data, a write of 0
/// bytes or with message bytes). The message's own bytes are checked apart (messageCheck).
bool validDescriptorFields(const WriteDescriptor &d, std::string *error);

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
