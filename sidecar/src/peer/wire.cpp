#include "peer/wire.hpp"

#include "net/frame.hpp"

namespace tensorlane::sidecar {

namespace {

void putCaps(ByteWriter &w, const PeerCaps &c) {
    w.u32(c.peer_timeout_ms);
    w.u32(c.keepalive_ms);
    w.u32(c.integrity);
    w.u32(c.transports);
}

PeerCaps getCaps(ByteReader &r) {
    PeerCaps c;
    c.peer_timeout_ms = r.u32();
    c.keepalive_ms = r.u32();
    c.integrity = r.u32();
    c.transports = r.u32();
    return c;
}

}  // namespace

std::vector<uint8_t> encodeHello(const HelloMsg &m) {
    std::vector<uint8_t> out;
    ByteWriter w(&out);
    w.u16(m.version);
    w.u8(static_cast<uint8_t>(m.role));
    w.u8(0);
    w.bytes(m.nonce);
    w.u64(m.incarnation);
    w.u64(m.session_id);
    w.u32(m.data_index);
    putCaps(w, m.caps);
    w.str8(m.from);
    w.str8(m.to);
    return out;
}

bool decodeHello(std::span<const uint8_t> payload, HelloMsg *out, std::string *error) {
    ByteReader r(payload);
    HelloMsg m;
    m.version = r.u16();
    const uint8_t role = r.u8();
    (void)r.u8();
    r.bytes(m.nonce.data(), m.nonce.size());
    m.incarnation = r.u64();
    m.session_id = r.u64();
    m.data_index = r.u32();
    m.caps = getCaps(r);
    m.from = r.str8();
    m.to = r.str8();
    if (!r.ok() || !r.atEnd()) {
        *error = "malformed HELLO (" + std::to_string(payload.size()) + " bytes)";
        return false;
    }
    if (role != static_cast<uint8_t>(LinkRole::kControl) &&
        role != static_cast<uint8_t>(LinkRole::kData)) {
        *error = "HELLO with unknown role " + std::to_string(role);
        return false;
    }
    if (m.from.empty() || m.from.size() > kMaxNodeNameBytes || m.to.size() > kMaxNodeNameBytes) {
        *error = "HELLO with a node name of bad length";
        return false;
    }
    m.role = static_cast<LinkRole>(role);
    *out = std::move(m);
    return true;
}

uint16_t peekVersion(std::span<const uint8_t> payload) {
    return payload.size() < 2 ? 0 : loadLe16(payload.data());
}

std::vector<uint8_t> encodeChallengeBody(const ChallengeMsg &m) {
    std::vector<uint8_t> out;
    ByteWriter w(&out);
    w.u16(m.version);
    w.bytes(m.nonce);
    w.u64(m.incarnation);
    w.u64(m.session_id);
    putCaps(w, m.caps);
    w.str8(m.from);
    return out;
}

bool decodeChallenge(std::span<const uint8_t> payload, ChallengeMsg *out, std::string *error) {
    ByteReader r(payload);
    ChallengeMsg m;
    m.version = r.u16();
    r.bytes(m.nonce.data(), m.nonce.size());
    m.incarnation = r.u64();
    m.session_id = r.u64();
    m.caps = getCaps(r);
    m.from = r.str8();
    r.bytes(m.mac.data(), m.mac.size());
    if (!r.ok() || !r.atEnd()) {
        *error = "malformed CHALLENGE (" + std::to_string(payload.size()) + " bytes)";
        return false;
    }
    *out = std::move(m);
    return true;
}

std::vector<uint8_t> encodeRegionAdd(uint64_t bytes, const std::string &name) {
    std::vector<uint8_t> out;
    ByteWriter w(&out);
    w.u64(bytes);
    w.str8(name);
    return out;
}

bool decodeRegionAdd(uint64_t id, std::span<const uint8_t> payload, RegionDescriptor *out) {
    ByteReader r(payload);
    RegionDescriptor d;
    d.id = id;
    d.bytes = r.u64();
    d.name = r.str8();
    if (!r.ok() || !r.atEnd() || d.name.empty()) {
        return false;
    }
    *out = std::move(d);
    return true;
}

}  // namespace tensorlane::sidecar
