// The framing every peer connection uses (control and data), and the byte-order helpers for it.
// docs/peers.md describes the whole protocol; this header is its single source of truth.
//
// Every frame is a 16-byte header followed by `length` payload bytes:
//
//   offset 0  u16 magic   0x4C54 ("TL" on the wire)
//          2  u8  type    FrameType
//          3  u8  flags   0 (reserved)
//          4  u32 length  payload bytes after the header
//          8  u64 arg     type-specific: a sequence number, a region id, ...
//
// All integers are little-endian. A CHUNK frame's payload starts with a 40-byte chunk header
// (ChunkHeader) and carries the chunk's data after it, which the receiver reads into a receive
// buffer and copies into the target region once the frame's tag verified (straight into the
// region when frames carry no tags).
//
// Once a connection has authenticated ([security] tcp_integrity = "mac", the default), every
// frame after the handshake is followed by a 16-byte tag (FrameAuth) over its header and
// payload; `length` does not count the tag.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorlane::sidecar {

// The wire is little-endian and the code copies integers with memcpy; a big-endian host would
// need byte swaps here, so it fails to build rather than speak a different protocol.
static_assert(std::endian::native == std::endian::little, "the peer wire format is little-endian");

inline constexpr uint16_t kFrameMagic = 0x4C54;  // bytes 'T' 'L'
inline constexpr size_t kFrameHeaderBytes = 16;
inline constexpr size_t kChunkHeaderBytes = 40;
/// A CHUNK frame's header and chunk header together.
inline constexpr size_t kChunkFrameOverhead = kFrameHeaderBytes + kChunkHeaderBytes;
/// The authentication tag after each frame of an authenticated connection.
inline constexpr size_t kFrameTagBytes = 16;
/// What follows a CHUNK frame's data on an authenticated connection: its tag (over headers and
/// data), then a second tag over its headers alone, under the other half of the frame's key
/// block. A chunk whose tag fails while its header tag holds had its data changed and nothing
/// else (the writer changed its source while it was sent, or the path flipped data bits): that
/// write fails, lands nothing, and the stream goes on; a header tag that fails too drops the
/// session (docs/peers.md, "Integrity").
inline constexpr size_t kChunkTrailerBytes = 2 * kFrameTagBytes;
/// Largest payload accepted before a connection is authenticated (HELLO is well under it).
inline constexpr uint32_t kMaxHandshakePayload = 1024;
/// Largest control payload after authentication (a region descriptor, a refusal text).
inline constexpr uint32_t kMaxControlPayload = 4096;

/// What a frame carries. Values are wire constants: never renumber, only append.
enum class FrameType : uint8_t {
    kHello = 1,       ///< client → server: version, nonce, names, capabilities
    kChallenge = 2,   ///< server → client: nonce, names, capabilities, server MAC
    kAuth = 3,        ///< client → server: client MAC
    kReady = 4,       ///< server → client: authenticated (after the region snapshot on control)
    kRefuse = 5,      ///< either way: a reason text, then the sender closes
    kRegionAdd = 16,  ///< server → client: an exposed region (arg = id)
    kRegionDel = 17,  ///< server → client: a revoked region (arg = id)
    kAck = 18,        ///< server → client on tcp data connection 0: a write ended (arg = seq)
    kHeartbeat = 19,  ///< either way on control: liveness
    kSelect = 20,     ///< client → server on control: the transport for this session (arg)
    kSelected = 21,   ///< server → client on control: the transport accepted (arg)
    kTransport = 22,  ///< either way on a transport's own channel: one of its messages
    kChunk = 32,      ///< client → server on data connections: one piece of a write
};

/// A decoded frame header.
struct FrameHeader {
    FrameType type = FrameType::kHello;
    uint8_t flags = 0;
    uint32_t length = 0;
    uint64_t arg = 0;
};

/// The fixed part of a CHUNK payload.
struct ChunkHeader {
    uint64_t region = 0;        ///< the target sidecar's region id
    uint64_t write_offset = 0;  ///< where the whole write starts in the region
    uint64_t total_bytes = 0;   ///< the whole write's size
    uint64_t chunk_offset = 0;  ///< where this chunk starts within the write
    uint32_t imm = 0;           ///< the writer's immediate
    uint32_t flags = 0;         ///< ChunkFlag bits (tcp wire version 2; 0 before)
};

/// ChunkHeader::flags. A receiver refuses any other bit.
/// WriteOp::silent: the target lands the write and acknowledges it, but notifies no one.
inline constexpr uint32_t kChunkSilent = 1u << 0;
/// WriteOp::message: the chunk's data is the message (total_bytes is its length, one chunk at
/// chunk_offset 0), delivered with messageArrived() and written nowhere.
inline constexpr uint32_t kChunkMessage = 1u << 1;
/// A scattered write (WriteOp::extents; silent): write_offset is where this chunk lands in the
/// region, chunk_offset its place in the write's bytes (which all its chunks fill once).
inline constexpr uint32_t kChunkScatter = 1u << 2;
/// With kChunkScatter (tcp wire version 3): the chunk carries several small extents, its data
/// a table of write_offset entries (net/packed_chunk.hpp) then their bytes in table order;
/// chunk_offset is the place of its first byte in the write's bytes.
inline constexpr uint32_t kChunkPacked = 1u << 3;
inline constexpr uint32_t kChunkFlagMask =
    kChunkSilent | kChunkMessage | kChunkScatter | kChunkPacked;

inline void storeLe16(uint8_t *p, uint16_t v) {
    std::memcpy(p, &v, sizeof v);
}
inline void storeLe32(uint8_t *p, uint32_t v) {
    std::memcpy(p, &v, sizeof v);
}
inline void storeLe64(uint8_t *p, uint64_t v) {
    std::memcpy(p, &v, sizeof v);
}
inline uint16_t loadLe16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline uint32_t loadLe32(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline uint64_t loadLe64(const uint8_t *p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

/// Writes a frame header into `out` (kFrameHeaderBytes).
inline void encodeFrameHeader(uint8_t *out, FrameType type, uint32_t length, uint64_t arg) {
    storeLe16(out, kFrameMagic);
    out[2] = static_cast<uint8_t>(type);
    out[3] = 0;
    storeLe32(out + 4, length);
    storeLe64(out + 8, arg);
}

/// Reads a frame header; false when the magic is wrong.
inline bool decodeFrameHeader(const uint8_t *in, FrameHeader *out) {
    if (loadLe16(in) != kFrameMagic) {
        return false;
    }
    out->type = static_cast<FrameType>(in[2]);
    out->flags = in[3];
    out->length = loadLe32(in + 4);
    out->arg = loadLe64(in + 8);
    return true;
}

/// Writes a whole CHUNK frame header (frame header + chunk header) for `chunk_len` data bytes.
inline void encodeChunkFrame(uint8_t *out, uint64_t seq, const ChunkHeader &c, uint32_t chunk_len) {
    encodeFrameHeader(out, FrameType::kChunk, static_cast<uint32_t>(kChunkHeaderBytes) + chunk_len,
                      seq);
    uint8_t *p = out + kFrameHeaderBytes;
    storeLe64(p, c.region);
    storeLe64(p + 8, c.write_offset);
    storeLe64(p + 16, c.total_bytes);
    storeLe64(p + 24, c.chunk_offset);
    storeLe32(p + 32, c.imm);
    storeLe32(p + 36, c.flags);
}

/// Reads the chunk header that follows a CHUNK frame header.
inline ChunkHeader decodeChunkHeader(const uint8_t *p) {
    ChunkHeader c;
    c.region = loadLe64(p);
    c.write_offset = loadLe64(p + 8);
    c.total_bytes = loadLe64(p + 16);
    c.chunk_offset = loadLe64(p + 24);
    c.imm = loadLe32(p + 32);
    c.flags = loadLe32(p + 36);
    return c;
}

/// Appends little-endian fields to a byte vector (payload building).
class ByteWriter {
public:
    explicit ByteWriter(std::vector<uint8_t> *out) : out_(out) {}
    void u8(uint8_t v) { out_->push_back(v); }
    void u16(uint16_t v) { append(&v, sizeof v); }
    void u32(uint32_t v) { append(&v, sizeof v); }
    void u64(uint64_t v) { append(&v, sizeof v); }
    void bytes(std::span<const uint8_t> b) { append(b.data(), b.size()); }
    /// A string of at most 255 bytes, length-prefixed with one byte (longer ones are cut).
    void str8(std::string_view s) {
        const size_t n = s.size() > 255 ? 255 : s.size();
        u8(static_cast<uint8_t>(n));
        append(s.data(), n);
    }

private:
    void append(const void *p, size_t n) {
        const auto *b = static_cast<const uint8_t *>(p);
        out_->insert(out_->end(), b, b + n);
    }
    std::vector<uint8_t> *out_;
};

/// Reads little-endian fields from untrusted bytes. Every read past the end sets a sticky
/// failure and yields zeros, so decoders check ok() once at the end.
class ByteReader {
public:
    explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
    uint8_t u8() {
        uint8_t v = 0;
        take(&v, sizeof v);
        return v;
    }
    uint16_t u16() {
        uint16_t v = 0;
        take(&v, sizeof v);
        return v;
    }
    uint32_t u32() {
        uint32_t v = 0;
        take(&v, sizeof v);
        return v;
    }
    uint64_t u64() {
        uint64_t v = 0;
        take(&v, sizeof v);
        return v;
    }
    void bytes(uint8_t *out, size_t n) { take(out, n); }
    std::string str8() {
        const size_t n = u8();
        if (!ok_ || in_.size() - pos_ < n) {
            ok_ = false;
            return {};
        }
        std::string s(reinterpret_cast<const char *>(in_.data() + pos_), n);
        pos_ += n;
        return s;
    }
    /// True when every read was in bounds.
    bool ok() const { return ok_; }
    /// True when every byte was consumed.
    bool atEnd() const { return pos_ == in_.size(); }
    size_t position() const { return pos_; }

private:
    void take(void *out, size_t n) {
        if (!ok_ || in_.size() - pos_ < n) {
            ok_ = false;
            std::memset(out, 0, n);
            return;
        }
        std::memcpy(out, in_.data() + pos_, n);
        pos_ += n;
    }
    std::span<const uint8_t> in_;
    size_t pos_ = 0;
    bool ok_ = true;
};

/// A frame type's name for logs ("HELLO", or "type 0x2a" for unknown ones).
std::string frameTypeName(uint8_t type);

}  // namespace tensorlane::sidecar
