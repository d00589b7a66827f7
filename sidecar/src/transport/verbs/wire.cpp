#include "transport/verbs/wire.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "net/frame.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

namespace {
constexpr uint64_t kDescriptorMagic = 0x544c564244455343ull;  // "TLVBDESC"
constexpr uint64_t kMessageMagic = 0x544c56424d534721ull;     // "TLVBMSG!"
constexpr size_t kMaxQps = 64;
}  // namespace

static_assert(kDescMaxMessageBytes == kMaxMessageBytes,
              "a ring slot holds the largest message the transport seam allows");

std::vector<uint8_t> encodeVerbsBlob(const VerbsBlob &b) {
    std::vector<uint8_t> out;
    ByteWriter w(&out);
    w.u16(b.version);
    w.bytes(b.gid);
    w.u32(b.mtu_bytes);
    w.u8(b.traffic_class);
    w.u8(b.sl);
    w.u16(static_cast<uint16_t>(b.qps.size()));
    for (const QpEndpoint &q : b.qps) {
        w.u32(q.qpn);
        w.u32(q.psn);
    }
    w.u64(b.ring_addr);
    w.u32(b.ring_rkey);
    w.u32(b.ring_slots);
    return out;
}

bool decodeVerbsBlob(std::span<const uint8_t> payload, VerbsBlob *out, std::string *error) {
    ByteReader r(payload);
    VerbsBlob b;
    b.version = r.u16();
    if (r.ok() && b.version != kVerbsWireVersion) {
        *error = "verbs bootstrap version " + std::to_string(b.version) + ", this node speaks " +
                 std::to_string(kVerbsWireVersion);
        return false;
    }
    r.bytes(b.gid.data(), b.gid.size());
    b.mtu_bytes = r.u32();
    b.traffic_class = r.u8();
    b.sl = r.u8();
    const uint16_t n = r.u16();
    if (n == 0 || n > kMaxQps) {
        *error = "verbs bootstrap with " + std::to_string(n) + " queue pairs";
        return false;
    }
    for (uint16_t i = 0; i < n; ++i) {
        QpEndpoint q;
        q.qpn = r.u32();
        q.psn = r.u32();
        if ((q.qpn >> 24) != 0 || (q.psn >> 24) != 0) {
            *error = "verbs bootstrap with a QPN or PSN wider than 24 bits";
            return false;
        }
        b.qps.push_back(q);
    }
    b.ring_addr = r.u64();
    b.ring_rkey = r.u32();
    b.ring_slots = r.u32();
    if (!r.ok() || !r.atEnd()) {
        *error = "malformed verbs bootstrap data (" + std::to_string(payload.size()) + " bytes)";
        return false;
    }
    if (b.mtu_bytes != 256 && b.mtu_bytes != 512 && b.mtu_bytes != 1024 && b.mtu_bytes != 2048 &&
        b.mtu_bytes != 4096) {
        *error = "verbs bootstrap with an MTU of " + std::to_string(b.mtu_bytes);
        return false;
    }
    *out = std::move(b);
    return true;
}

uint64_t verbsMsgArg(VerbsMsg m) {
    return uint64_t{kTransportVerbs} << 32 | static_cast<uint32_t>(m);
}

uint32_t verbsMsgOf(uint64_t arg) {
    return (arg >> 32) == kTransportVerbs ? static_cast<uint32_t>(arg) : 0;
}

std::vector<uint8_t> encodeRegionKey(const RegionKey &k) {
    std::vector<uint8_t> out;
    ByteWriter w(&out);
    w.u64(k.region);
    w.u64(k.addr);
    w.u32(k.rkey);
    w.u64(k.bytes);
    return out;
}

bool decodeRegionKey(std::span<const uint8_t> payload, RegionKey *out) {
    ByteReader r(payload);
    RegionKey k;
    k.region = r.u64();
    k.addr = r.u64();
    k.rkey = r.u32();
    k.bytes = r.u64();
    if (!r.ok() || !r.atEnd()) {
        return false;
    }
    *out = k;
    return true;
}

std::vector<uint8_t> encodeU64(uint64_t v) {
    std::vector<uint8_t> out;
    ByteWriter(&out).u64(v);
    return out;
}

bool decodeU64(std::span<const uint8_t> payload, uint64_t *out) {
    ByteReader r(payload);
    *out = r.u64();
    return r.ok() && r.atEnd();
}

uint64_t descriptorCheck(const WriteDescriptor &d) {
    return d.seq ^ (d.region * 0x9e3779b97f4a7c15ull) ^ (d.offset << 1) ^ (d.bytes << 7) ^
           (uint64_t{d.imm} << 32 | d.stripes) ^
           ((uint64_t{d.flags} << 32 | d.message_bytes) * 0xc2b2ae3d27d4eb4full) ^
           (d.message_check << 29 | d.message_check >> 35) ^ kDescriptorMagic;
}

uint64_t messageCheck(uint64_t seq, const uint8_t *message, size_t len) {
    // Eight bytes a step (FNV-style multiply, then a fold), the tail zero-padded; the length
    // and the sequence number are in the seed, so a stale message of another write (or the
    // same bytes shorter) does not match.
    uint64_t h = (seq * 0x9e3779b97f4a7c15ull) ^ (uint64_t{len} << 48) ^ kMessageMagic;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w = 0;
        std::memcpy(&w, message + i, std::min<size_t>(8, len - i));
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

bool validDescriptorFields(const WriteDescriptor &d, std::string *error) {
    // Strings only on the way out: this runs for every write.
    const auto fail = [&](const std::string &what) {
        *error = "descriptor of write " + std::to_string(d.seq) + " " + what;
        return false;
    };
    if ((d.flags & ~kDescKnownFlags) != 0) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%x", d.flags & ~kDescKnownFlags);
        return fail(std::string("has unknown flags ") + hex);
    }
    if ((d.flags & kDescMessage) == 0) {
        if (d.bytes == 0) {
            return fail("has no bytes");
        }
        if (d.message_bytes != 0 || d.message_check != 0) {
            return fail("carries message bytes but is no message");
        }
        return true;
    }
    if ((d.flags & kDescSilent) != 0) {
        return fail("is a message and silent");
    }
    if (d.message_bytes == 0 || d.message_bytes > kDescMaxMessageBytes) {
        return fail("claims a message of " + std::to_string(d.message_bytes) + " bytes (1 to " +
                    std::to_string(kDescMaxMessageBytes) + ")");
    }
    if (d.bytes != 0 || d.stripes != 1) {
        return fail("is a message with " + std::to_string(d.bytes) + " data bytes in " +
                    std::to_string(d.stripes) + " stripes");
    }
    return true;
}

}  // namespace tensorlane::sidecar
