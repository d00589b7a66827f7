#include "peer/handshake.hpp"

#include <sodium.h>

#include <string_view>

namespace tensorlane::sidecar {

namespace {

// The labels separate the two MACs, so the server's proof can never be reflected back as the
// client's.
constexpr std::string_view kServerLabel = "tensorlane peer v1 server proof";
constexpr std::string_view kClientLabel = "tensorlane peer v1 client proof";
// Frame keys: an HMAC over the whole transcript (HELLO and CHALLENGE, so both fresh nonces),
// one per direction.
constexpr std::string_view kC2sLabel = "tensorlane peer v2 frame key client to server";
constexpr std::string_view kS2cLabel = "tensorlane peer v2 frame key server to client";

void mac(const PeerKey &key, std::string_view label, std::span<const uint8_t> a,
         std::span<const uint8_t> b, uint8_t out[kMacBytes]) {
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key.data(), PeerKey::kBytes);
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char *>(label.data()),
                                  label.size());
    // Length prefixes keep the concatenation unambiguous.
    const uint64_t la = a.size();
    const uint64_t lb = b.size();
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char *>(&la), sizeof la);
    crypto_auth_hmacsha256_update(&st, a.data(), a.size());
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char *>(&lb), sizeof lb);
    crypto_auth_hmacsha256_update(&st, b.data(), b.size());
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

void deriveKeys(const PeerKey &key, std::span<const uint8_t> hello,
                std::span<const uint8_t> challenge, HandshakeOutcome *out) {
    static_assert(FrameAuth::kKeyBytes == kMacBytes);
    mac(key, kC2sLabel, hello, challenge, out->c2s_key.data());
    mac(key, kS2cLabel, hello, challenge, out->s2c_key.data());
}

std::string versionMismatch(const std::string &ours_name, uint16_t ours,
                            const std::string &theirs_name, uint16_t theirs) {
    return "peer protocol version mismatch: " + ours_name + " speaks version " +
           std::to_string(ours) + ", " + theirs_name + " speaks version " + std::to_string(theirs) +
           "; run the same tensorlane release on both nodes";
}

}  // namespace

Status checkSharedCaps(const std::string &our_name, const PeerCaps &ours,
                       const std::string &their_name, const PeerCaps &theirs) {
    if (ours.integrity != theirs.integrity) {
        auto name = [](uint32_t v) { return v != 0 ? std::string("\"mac\"") : "\"none\""; };
        return {Code::kInvalid, "[security] tcp_integrity differs: " + our_name + " has " +
                                    name(ours.integrity) + ", " + their_name + " has " +
                                    name(theirs.integrity) + "; both ends must set the same value"};
    }
    if (theirs.peer_timeout_ms == 0 || theirs.keepalive_ms == 0) {
        return {Code::kInvalid, their_name + " announced a zero timeout"};
    }
    return Status::ok();
}

// ----- client

ClientHandshake::ClientHandshake(const PeerKey &key, HandshakeIdentity self,
                                 std::string server_name, LinkRole role, uint64_t session_id,
                                 uint32_t data_index)
    : key_(key), self_(std::move(self)), server_name_(std::move(server_name)) {
    msg_.version = kPeerProtocolVersion;
    msg_.role = role;
    randombytes_buf(msg_.nonce.data(), msg_.nonce.size());
    msg_.incarnation = self_.incarnation;
    msg_.session_id = session_id;
    msg_.data_index = data_index;
    msg_.caps = self_.caps;
    msg_.from = self_.name;
    msg_.to = server_name_;
    hello_ = encodeHello(msg_);
}

Status ClientHandshake::onChallenge(std::span<const uint8_t> payload, std::vector<uint8_t> *auth,
                                    HandshakeOutcome *out) {
    const uint16_t version = peekVersion(payload);
    if (version != kPeerProtocolVersion) {
        return {Code::kInvalid,
                versionMismatch(self_.name, kPeerProtocolVersion, server_name_, version)};
    }
    ChallengeMsg c;
    std::string error;
    if (!decodeChallenge(payload, &c, &error)) {
        return {Code::kInvalid, error};
    }
    const auto body = payload.first(payload.size() - kMacBytes);
    uint8_t expect[kMacBytes];
    mac(key_, kServerLabel, hello_, body, expect);
    const bool good = crypto_verify_32(expect, c.mac.data()) == 0;
    sodium_memzero(expect, sizeof expect);
    if (!good) {
        return {Code::kPermission,
                "authentication failed: the server's proof does not match "
                "(a different peer key on the two nodes, or a forged or "
                "replayed answer)"};
    }
    if (c.from != server_name_) {
        return {Code::kInvalid, "the peer at this address is '" + c.from + "', not '" +
                                    server_name_ + "' (check [[peers]] address)"};
    }
    if (msg_.role == LinkRole::kData && c.session_id != msg_.session_id) {
        return {Code::kInvalid, "the peer answered for another session"};
    }
    Status caps = checkSharedCaps(self_.name, self_.caps, c.from, c.caps);
    if (!caps.isOk()) {
        return caps;
    }
    uint8_t proof[kMacBytes];
    mac(key_, kClientLabel, hello_, payload, proof);
    auth->assign(proof, proof + kMacBytes);
    out->role = msg_.role;
    out->peer_name = c.from;
    out->peer_incarnation = c.incarnation;
    out->session_id = c.session_id;
    out->data_index = msg_.data_index;
    out->peer_caps = c.caps;
    out->integrity = self_.caps.integrity != 0;
    deriveKeys(key_, hello_, payload, out);
    return Status::ok();
}

// ----- server

ServerHandshake::ServerHandshake(const PeerKey &key, HandshakeIdentity self)
    : key_(&key), self_(std::move(self)) {}

Status ServerHandshake::onHello(std::span<const uint8_t> payload, const AdmitFn &admit,
                                uint64_t new_session_id, std::vector<uint8_t> *challenge) {
    if (have_hello_) {
        return {Code::kInvalid, "a second HELLO"};
    }
    const uint16_t version = peekVersion(payload);
    if (version != kPeerProtocolVersion) {
        return {Code::kInvalid,
                versionMismatch(self_.name, kPeerProtocolVersion, "the connecting node", version)};
    }
    std::string error;
    if (!decodeHello(payload, &hello_msg_, &error)) {
        return {Code::kInvalid, error};
    }
    if (hello_msg_.to != self_.name) {
        return {Code::kInvalid, "'" + hello_msg_.from + "' meant to reach '" + hello_msg_.to +
                                    "', but this node is '" + self_.name + "'"};
    }
    Status s = admit(hello_msg_);
    if (!s.isOk()) {
        return s;
    }
    hello_.assign(payload.begin(), payload.end());
    session_id_ = hello_msg_.role == LinkRole::kData ? hello_msg_.session_id : new_session_id;
    ChallengeMsg c;
    c.version = kPeerProtocolVersion;
    randombytes_buf(c.nonce.data(), c.nonce.size());
    c.incarnation = self_.incarnation;
    c.session_id = session_id_;
    c.caps = self_.caps;
    c.from = self_.name;
    challenge_ = encodeChallengeBody(c);
    uint8_t proof[kMacBytes];
    mac(*key_, kServerLabel, hello_, challenge_, proof);
    challenge_.insert(challenge_.end(), proof, proof + kMacBytes);
    *challenge = challenge_;
    have_hello_ = true;
    return Status::ok();
}

Status ServerHandshake::onAuth(std::span<const uint8_t> payload, HandshakeOutcome *out) {
    if (!have_hello_) {
        return {Code::kInvalid, "AUTH before HELLO"};
    }
    if (payload.size() != kMacBytes) {
        return {Code::kInvalid, "malformed AUTH (" + std::to_string(payload.size()) + " bytes)"};
    }
    uint8_t expect[kMacBytes];
    mac(*key_, kClientLabel, hello_, challenge_, expect);
    const bool good = crypto_verify_32(expect, payload.data()) == 0;
    sodium_memzero(expect, sizeof expect);
    if (!good) {
        return {Code::kPermission,
                "authentication failed: the proof from '" + hello_msg_.from +
                    "' does not match (a different peer key on the two nodes, or a replayed "
                    "handshake)"};
    }
    Status caps = checkSharedCaps(self_.name, self_.caps, hello_msg_.from, hello_msg_.caps);
    if (!caps.isOk()) {
        return caps;
    }
    out->role = hello_msg_.role;
    out->peer_name = hello_msg_.from;
    out->peer_incarnation = hello_msg_.incarnation;
    out->session_id = session_id_;
    out->data_index = hello_msg_.data_index;
    out->peer_caps = hello_msg_.caps;
    out->integrity = self_.caps.integrity != 0;
    deriveKeys(*key_, hello_, challenge_, out);
    return Status::ok();
}

}  // namespace tensorlane::sidecar
