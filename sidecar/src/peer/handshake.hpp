// Mutual authentication of one peer connection: a challenge-response over the pre-shared key
// with HMAC-SHA256 (libsodium). Pure logic over message bytes; the manager moves the bytes.
//
//   client → server  HELLO      version, role, nonce_c, incarnation, caps, from, to
//   server → client  CHALLENGE  version, nonce_s, incarnation, session, caps, from,
//                               mac_s = HMAC(K, "server" || HELLO || CHALLENGE body)
//   client → server  AUTH       mac_c = HMAC(K, "client" || HELLO || CHALLENGE)
//
// Each side's MAC covers the other side's fresh nonce, so a recorded handshake replayed to
// either end fails; it covers both names, the version, the role and the capabilities, so none
// of them can be altered on the way.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "net/frame_auth.hpp"
#include "peer/key.hpp"
#include "peer/wire.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// Who this end is.
struct HandshakeIdentity {
    std::string name;
    uint64_t incarnation = 0;
    PeerCaps caps;
};

/// What an authenticated handshake established about the other end.
struct HandshakeOutcome {
    LinkRole role = LinkRole::kControl;
    std::string peer_name;
    uint64_t peer_incarnation = 0;
    uint64_t session_id = 0;
    uint32_t data_index = 0;
    PeerCaps peer_caps;
    /// Frame keys of this connection, bound to the whole handshake (both nonces): client to
    /// server and server to client. Used when both ends announced integrity.
    FrameAuth::Key c2s_key{};
    FrameAuth::Key s2c_key{};
    bool integrity = false;
};

/// kInvalid naming both values when a setting both ends must share differs (tcp_integrity;
/// a transport's own settings are checked by the transport, from its SELECT blob).
Status checkSharedCaps(const std::string &our_name, const PeerCaps &ours,
                       const std::string &their_name, const PeerCaps &theirs);

/// The connecting end.
class ClientHandshake {
public:
    ClientHandshake(const PeerKey &key, HandshakeIdentity self, std::string server_name,
                    LinkRole role, uint64_t session_id, uint32_t data_index);

    /// The HELLO payload, sent first.
    const std::vector<uint8_t> &hello() const { return hello_; }

    /// Checks the CHALLENGE: the version, the server's MAC (it holds the key and answered our
    /// fresh nonce), its name, the shared settings. On success `*auth` is the AUTH payload.
    /// kPermission for a failed proof, kInvalid for a mismatch or a malformed message.
    Status onChallenge(std::span<const uint8_t> payload, std::vector<uint8_t> *auth,
                       HandshakeOutcome *out);

private:
    const PeerKey &key_;
    HandshakeIdentity self_;
    std::string server_name_;
    HelloMsg msg_;
    std::vector<uint8_t> hello_;
};

/// The accepting end.
class ServerHandshake {
public:
    /// `admit` decides whether the (still unauthenticated) HELLO may proceed: a known peer name,
    /// from that peer's address, a data connection for an existing session. Its refusal is
    /// passed on. It may call useKey() to pick the key of the pair the HELLO names.
    using AdmitFn = std::function<Status(const HelloMsg &)>;

    /// `key` is used unless admit() picks another with useKey().
    ServerHandshake(const PeerKey &key, HandshakeIdentity self);

    /// The key both proofs use from now on (per-pair keys: the one of the peer the HELLO
    /// names). Called by the admit function, before the CHALLENGE is made.
    void useKey(const PeerKey &key) { key_ = &key; }

    /// Checks the HELLO and produces the CHALLENGE payload. `new_session_id` is used for a
    /// control connection; a data connection's session id is echoed.
    Status onHello(std::span<const uint8_t> payload, const AdmitFn &admit, uint64_t new_session_id,
                   std::vector<uint8_t> *challenge);
    /// Checks the client's MAC, then the shared settings.
    Status onAuth(std::span<const uint8_t> payload, HandshakeOutcome *out);

    /// The HELLO received (valid after onHello succeeded).
    const HelloMsg &hello() const { return hello_msg_; }

private:
    const PeerKey *key_;
    HandshakeIdentity self_;
    HelloMsg hello_msg_;
    std::vector<uint8_t> hello_;
    std::vector<uint8_t> challenge_;
    uint64_t session_id_ = 0;
    bool have_hello_ = false;
};

}  // namespace tensorlane::sidecar
