#include "transport/verbs/wire.hpp"

#include "net/frame.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

namespace {
constexpr uint64_t kDescriptorMagic = 0x544c564244455343ull;  // "TLVBDESC"
constexpr size_t kMaxQps = 64;
}  // namespace

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
           (uint64_t{d.imm} << 32 | d.stripes) ^ kDescriptorMagic;
}

}  // namespace tensorlane::sidecar
