// The shared-memory contract between the sidecar and one client: the session segment's header,
// its three rings and the entries that travel in them.
//
// Rules (DESIGN.md, "Shared-memory rules"): fixed-size trivially copyable structs; offsets, never
// pointers; the creator writes `magic` last with a release store and the attacher validates it
// with an acquire load; the sidecar copies every entry out before looking at it. Nothing here
// depends on a build option.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tensorlane/ipc/spsc_ring.hpp"

namespace tensorlane::ipc {

inline constexpr uint64_t kSegmentMagic = 0x314745534c4e4c54ull;  // "TLNLSEG1"
/// 2: per-slot sequence words (ring_seq); 3: Request.flags and Request.slot (stream-ordered
/// calls) and the stream segment (StreamSegmentHeader); 4: Op::kWriteEx (payloads, grouped
/// writes, deadlines), Notification's kind/status/entries/payload_bytes and the notification
/// payload slab.
inline constexpr uint32_t kLayoutVersion = 4;
inline constexpr uint32_t kMinRingDepth = 16;
inline constexpr uint32_t kMaxRingDepth = 65536;
inline constexpr size_t kPeerNameBytes = 64;  ///< tl_notification.peer, NUL included
inline constexpr size_t kRegionNameBytes = 64;
/// The most payload bytes a write or message carries (TL_MAX_PAYLOAD).
inline constexpr uint32_t kMaxPayload = 256;
/// The most entries one grouped write holds (TL_GROUP_MAX_ENTRIES).
inline constexpr uint32_t kMaxGroupEntries = 16384;

/// Request operations. Anything else is answered with kInvalid.
enum class Op : uint32_t {
    kNop = 1,    ///< completes at once; measures the ring round trip
    kWrite = 2,  ///< write-with-immediate into a remote region
    /// A write with a payload, a message, or a grouped write, described by an ExHeader in the
    /// client's own host region: src_region names that region, src_offset the header's offset
    /// in it, bytes the description's length (exDescriptionBytes) and imm the notification's
    /// immediate; dst_remote and dst_offset are 0.
    kWriteEx = 3,
};

/// ExHeader::kind.
enum class ExKind : uint32_t {
    /// tl_write_msg: at most one entry (none: a message of its payload alone), notified as a
    /// write (or a message) with the payload.
    kWrite = 1,
    /// tl_write_group: any number of entries to one peer, one notification once all are in.
    kGroup = 2,
};

/// The head of a kWriteEx description; then the payload (padded to 8 bytes), then the entries.
/// Written by the client before it publishes the request; the sidecar copies all of it out
/// before looking at it, and writes only ExEntry::status back (before the request's
/// completion), where the region is still the client's.
struct ExHeader {
    uint32_t magic;  ///< kExMagic
    uint32_t kind;   ///< ExKind
    uint32_t entries;
    uint32_t payload_bytes;  ///< at most kMaxPayload
    int32_t timeout_ms;      ///< > 0: the deadline, from when the sidecar takes the request
    uint32_t flags;          ///< 0
    uint64_t notify;         ///< a remote handle: the region the target's notification names
    uint64_t notify_offset;  ///< the notification's offset when there is no entry
    uint64_t reserved[2];
};
static_assert(sizeof(ExHeader) == 56 && std::is_trivially_copyable_v<ExHeader>);
inline constexpr uint32_t kExMagic = 0x31584c54u;  // "TLX1"

/// One entry of a kWriteEx description (tl_group_entry, plus where its status comes back).
struct ExEntry {
    uint64_t src_region;
    uint64_t src_offset;
    uint64_t dst_remote;
    uint64_t dst_offset;
    uint64_t bytes;
    int32_t status;  ///< written by the sidecar when the request ends (a Code)
    uint32_t reserved;
};
static_assert(sizeof(ExEntry) == 48 && std::is_trivially_copyable_v<ExEntry>);

/// The length of a description with `entries` entries and `payload` payload bytes.
constexpr uint64_t exDescriptionBytes(uint32_t entries, uint32_t payload) {
    return sizeof(ExHeader) + ((uint64_t{payload} + 7) & ~uint64_t{7}) +
           uint64_t{entries} * sizeof(ExEntry);
}
/// Where the entries start in a description.
constexpr uint64_t exEntriesOffset(uint32_t payload) {
    return sizeof(ExHeader) + ((uint64_t{payload} + 7) & ~uint64_t{7});
}

/// Request.flags bits. Anything else is answered with kInvalid.
enum RequestFlag : uint8_t {
    /// `slot` names this request's TicketSlot in the session's stream segment: the sidecar
    /// stores the ticket there when the request ends (tl_stream_wait_ticket waits on it).
    kRequestHasSlot = 1u << 0,
    /// Stream-ordered (tl_write_on_stream): the write starts only once the client's GPU stream
    /// has stored the ticket's low 32 bits (or a later one) into the slot's `gate`.
    kRequestGated = 1u << 1,
};
inline constexpr uint8_t kRequestFlagMask = kRequestHasSlot | kRequestGated;

/// One request, written by the client into the request ring.
struct Request {
    uint8_t op;           ///< Op
    uint8_t flags;        ///< RequestFlag bits
    uint16_t slot;        ///< TicketSlot index when flags has kRequestHasSlot
    uint32_t imm;         ///< delivered to the target's owner
    uint64_t ticket;      ///< echoed in the completion
    uint64_t src_region;  ///< the client's region id
    uint64_t src_offset;
    uint64_t dst_remote;  ///< a handle from lookup
    uint64_t dst_offset;
    uint64_t bytes;
    uint64_t ring_seq;  ///< the ring's (spsc_ring.hpp); set by publish, ignored by push
};
static_assert(sizeof(Request) == 64 && std::is_trivially_copyable_v<Request>);
static_assert(offsetof(Request, ticket) == 8 && offsetof(Request, bytes) == 48);
static_assert(offsetof(Request, imm) == 4 && offsetof(Request, slot) == 2);
static_assert(isRingEntry<Request>());

/// The end of one request, written by the sidecar into the completion ring.
struct Completion {
    uint64_t ticket;
    int32_t status;  ///< Code
    uint32_t reserved;
    uint64_t bytes;
    uint64_t ring_seq;  ///< the ring's
};
static_assert(sizeof(Completion) == 32 && std::is_trivially_copyable_v<Completion>);
static_assert(isRingEntry<Completion>());

/// Data arrived in one of the client's regions, written by the sidecar into the notification
/// ring only once the data is in place.
struct Notification {
    uint64_t region;
    uint64_t offset;
    uint64_t bytes;
    uint32_t imm;
    /// Local writes: the writing client's uid (SO_PEERCRED at its connect); writes from peers:
    /// kWriterUidPeer.
    uint32_t writer_uid;
    char peer[kPeerNameBytes];  ///< NUL-terminated node name of the writer
    /// Notifications dropped since the previous one delivered: the client's backlog in the
    /// sidecar was full ([limits] notification_backlog). Their data is in place all the same.
    uint64_t dropped;
    uint8_t kind;  ///< NotifyKind
    uint8_t reserved3;
    uint16_t payload_bytes;  ///< in the payload slab at this entry's ring position
    int32_t status;          ///< a Code: kOk, or why the write or group failed (kGroup)
    uint32_t entries;        ///< a group's entry count
    uint32_t reserved4;
    uint64_t ring_seq;  ///< the ring's
};

/// Notification::kind (TL_NOTIFY_*).
enum class NotifyKind : uint8_t {
    kWrite = 0,    ///< a write landed (tl_write, tl_write_msg with bytes)
    kMessage = 1,  ///< a message of its payload alone (tl_write_msg with 0 bytes)
    kGroup = 2,    ///< a grouped write ended (status says how)
};
/// Payload bytes of one notification slot: the slab has one per notification ring slot.
inline constexpr uint32_t kPayloadSlotBytes = kMaxPayload;
static_assert(sizeof(Notification) == 128 && std::is_trivially_copyable_v<Notification>);
static_assert(isRingEntry<Notification>());
static_assert(offsetof(Notification, peer) == 32);
static_assert(offsetof(Notification, dropped) == 96);
static_assert(offsetof(Notification, writer_uid) == 28);
static_assert(offsetof(Notification, payload_bytes) == 106);
/// Notification::writer_uid of a write that came from a peer node (TL_UID_PEER).
inline constexpr uint32_t kWriterUidPeer = 0xffffffffu;
/// Notification::writer_uid the sidecar could not attribute (TL_UID_UNKNOWN; not expected).
inline constexpr uint32_t kWriterUidUnknown = 0xfffffffeu;

/// Flags of the doorbell protocol; each on its own line because each has one writer.
struct alignas(kCacheLine) DoorbellFlag {
    std::atomic<uint32_t> value;
};
static_assert(sizeof(DoorbellFlag) == kCacheLine);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

/// The segment header. Written once by the sidecar before `magic`; afterwards the sidecar never
/// reads geometry back from it (the client could have changed it), only the doorbell flags.
struct alignas(kCacheLine) SegmentHeader {
    std::atomic<uint64_t> magic;  ///< kSegmentMagic, stored last (release)
    uint32_t version;             ///< kLayoutVersion
    uint32_t header_bytes;        ///< sizeof(SegmentHeader)
    uint64_t total_bytes;
    uint64_t session_id;
    uint32_t request_depth;
    uint32_t completion_depth;
    uint32_t notification_depth;
    uint32_t reserved0;
    uint64_t request_offset;  ///< RingControl, then request_depth Requests
    uint64_t completion_offset;
    uint64_t notification_offset;
    /// The notification payload slab: notification_depth slots of kPayloadSlotBytes; slot
    /// (ring position % depth) holds the payload of the notification at that position.
    uint64_t payload_offset;
    uint64_t reserved1[6];  ///< pads the fields to two cache lines
    /// Set by the sidecar before it sleeps; a client that publishes then rings the doorbell.
    DoorbellFlag sidecar_sleeping;
    /// Set by a client before it sleeps; the sidecar rings the client's doorbell after publishing.
    DoorbellFlag client_waiting;
};
static_assert(sizeof(SegmentHeader) == 4 * kCacheLine);
static_assert(offsetof(SegmentHeader, sidecar_sleeping) == 2 * kCacheLine);
static_assert(std::is_trivially_destructible_v<SegmentHeader>);

/// Where everything sits in a segment for a given ring depth.
struct SegmentGeometry {
    uint32_t request_depth = 0;
    uint32_t completion_depth = 0;
    uint32_t notification_depth = 0;
    uint64_t request_offset = 0;
    uint64_t completion_offset = 0;
    uint64_t notification_offset = 0;
    uint64_t payload_offset = 0;
    uint64_t total_bytes = 0;

    /// The layout for `ring_depth` requests (a power of two); notifications get the same depth.
    static constexpr SegmentGeometry forDepth(uint32_t ring_depth) {
        SegmentGeometry g;
        g.request_depth = g.completion_depth = g.notification_depth = ring_depth;
        uint64_t off = sizeof(SegmentHeader);
        g.request_offset = off;
        off += sizeof(RingControl) + uint64_t{ring_depth} * sizeof(Request);
        g.completion_offset = off;
        off += sizeof(RingControl) + uint64_t{ring_depth} * sizeof(Completion);
        g.notification_offset = off;
        off += sizeof(RingControl) + uint64_t{ring_depth} * sizeof(Notification);
        g.payload_offset = off;
        off += uint64_t{ring_depth} * kPayloadSlotBytes;
        g.total_bytes = (off + 4095) & ~uint64_t{4095};
        return g;
    }
};

constexpr bool isValidRingDepth(uint32_t d) {
    return d >= kMinRingDepth && d <= kMaxRingDepth && (d & (d - 1)) == 0;
}

/// Typed views of a mapped segment. `base` must be the start of a mapping of at least
/// g.total_bytes.
struct SegmentView {
    SegmentHeader *header = nullptr;
    RingControl *request_ctl = nullptr;
    Request *requests = nullptr;
    RingControl *completion_ctl = nullptr;
    Completion *completions = nullptr;
    RingControl *notification_ctl = nullptr;
    Notification *notifications = nullptr;
    uint8_t *payloads = nullptr;  ///< the notification payload slab

    static SegmentView at(void *base, const SegmentGeometry &g) {
        auto *b = static_cast<unsigned char *>(base);
        SegmentView v;
        v.header = reinterpret_cast<SegmentHeader *>(b);
        v.request_ctl = reinterpret_cast<RingControl *>(b + g.request_offset);
        v.requests = reinterpret_cast<Request *>(b + g.request_offset + sizeof(RingControl));
        v.completion_ctl = reinterpret_cast<RingControl *>(b + g.completion_offset);
        v.completions =
            reinterpret_cast<Completion *>(b + g.completion_offset + sizeof(RingControl));
        v.notification_ctl = reinterpret_cast<RingControl *>(b + g.notification_offset);
        v.notifications =
            reinterpret_cast<Notification *>(b + g.notification_offset + sizeof(RingControl));
        v.payloads = b + g.payload_offset;
        return v;
    }
};

// ---- The stream segment (stream-ordered calls; docs/gpu.md)
//
// A second, small segment per session, created by the sidecar on the client's first stream
// call (MsgType::kStreamSetup) and registered by the client with the CUDA driver, so that its
// GPU streams can store into it (cuStreamWriteValue32) and wait on it (cuStreamWaitValue32).
// Every word has one writer at a time; values are compared cyclically (int32_t differences),
// as CU_STREAM_WAIT_VALUE_GEQ compares them.

inline constexpr uint64_t kStreamSegmentMagic = 0x314d5253534c4e4cull;  // "LNLSSRM1"
/// Subscriptions (region, imm) one session may hold for tl_stream_wait_notification.
inline constexpr uint32_t kStreamSubscriptions = 1024;

/// One per request slot (Request.slot). The client resets both words to ticket - 1 before it
/// gives the slot to a new ticket (both are quiet then: the previous ticket has ended and its
/// gate was passed), so a stale value can never satisfy the new ticket.
struct alignas(16) TicketSlot {
    /// Written by the client's GPU stream (tl_write_on_stream): the ticket's low 32 bits once
    /// the work queued before the write has finished. Read by the sidecar (acquire).
    std::atomic<uint32_t> gate;
    /// Written by the sidecar when the request ends (release, after `status`): the ticket's low
    /// 32 bits. A stream in tl_stream_wait_ticket waits until it is >= the ticket.
    std::atomic<uint32_t> done;
    int32_t status;  ///< Code of the ended request (written before `done`)
    uint32_t reserved;
};
static_assert(sizeof(TicketSlot) == 16 && std::atomic<uint32_t>::is_always_lock_free);

/// One per subscription (region, imm) of tl_stream_wait_notification: a hand-over flag, so that
/// a wait captured in a CUDA graph works on every replay. The sidecar stores 1 when a
/// notification for the pair arrives and the flag is 0 (it counts the rest and hands them
/// over one at a time); the GPU stream waits for 1 and then stores 0 (one notification
/// consumed). Each value has exactly one writer, so none is lost.
struct alignas(kCacheLine) NotifySlot {
    std::atomic<uint32_t> flag;
};
static_assert(sizeof(NotifySlot) == kCacheLine);

struct alignas(kCacheLine) StreamSegmentHeader {
    std::atomic<uint64_t> magic;  ///< kStreamSegmentMagic, stored last (release)
    uint32_t version;             ///< kLayoutVersion
    uint32_t ticket_slots;        ///< TicketSlots (2 x the ring depth)
    uint32_t notify_slots;        ///< NotifySlots (kStreamSubscriptions)
    uint32_t reserved0;
    uint64_t ticket_offset;  ///< from the segment's start
    uint64_t notify_offset;
    uint64_t total_bytes;
};
static_assert(sizeof(StreamSegmentHeader) == kCacheLine);

/// Where everything sits in a stream segment for a given ring depth.
struct StreamGeometry {
    uint32_t ticket_slots = 0;
    uint32_t notify_slots = 0;
    uint64_t ticket_offset = 0;
    uint64_t notify_offset = 0;
    uint64_t total_bytes = 0;

    /// Twice as many ticket slots as requests may be outstanding: a slot whose gated write
    /// ended before its GPU stream reached the gate stays out of use until it does.
    static constexpr StreamGeometry forDepth(uint32_t ring_depth) {
        StreamGeometry g;
        g.ticket_slots = 2 * ring_depth;
        g.notify_slots = kStreamSubscriptions;
        g.ticket_offset = sizeof(StreamSegmentHeader);
        g.notify_offset = g.ticket_offset + uint64_t{g.ticket_slots} * sizeof(TicketSlot);
        g.notify_offset = (g.notify_offset + kCacheLine - 1) & ~uint64_t{kCacheLine - 1};
        const uint64_t end = g.notify_offset + uint64_t{g.notify_slots} * sizeof(NotifySlot);
        g.total_bytes = (end + 4095) & ~uint64_t{4095};
        return g;
    }
};
static_assert(StreamGeometry::forDepth(kMaxRingDepth).ticket_slots <= 65536 * 2);

/// Typed views of a mapped stream segment.
struct StreamView {
    StreamSegmentHeader *header = nullptr;
    TicketSlot *tickets = nullptr;
    NotifySlot *notify = nullptr;

    static StreamView at(void *base, const StreamGeometry &g) {
        auto *b = static_cast<unsigned char *>(base);
        StreamView v;
        v.header = reinterpret_cast<StreamSegmentHeader *>(b);
        v.tickets = reinterpret_cast<TicketSlot *>(b + g.ticket_offset);
        v.notify = reinterpret_cast<NotifySlot *>(b + g.notify_offset);
        return v;
    }
};

/// Initialises a zeroed stream segment and publishes it (magic last). Sidecar only.
void initStreamSegment(void *base, const StreamGeometry &g);
/// Checks a stream segment the client just mapped against what `ring_depth` gives.
bool validateStreamSegment(const void *base, uint64_t mapped_bytes, uint32_t ring_depth,
                           StreamGeometry *out);

/// Initialises a zeroed segment and publishes it (magic last). Called by the sidecar only.
void initSegment(void *base, const SegmentGeometry &g, uint64_t session_id);

/// Checks a segment the client just mapped: magic (acquire), version, and that the geometry in
/// the header is the one `forDepth(header depth)` gives and fits in `mapped_bytes`. Returns the
/// geometry through `out` on success.
bool validateSegment(const void *base, uint64_t mapped_bytes, SegmentGeometry *out);

}  // namespace tensorlane::ipc
