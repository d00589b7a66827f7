// Integrity of the frames on one direction of one authenticated peer connection
// ([security] tcp_integrity = "mac"; DESIGN.md, "Peer bootstrap").
//
// Each frame gets a Poly1305 tag over its header and payload, under a one-time key taken from
// ChaCha20 with the connection's key and the frame's number as the nonce: the construction of
// RFC 8439 section 2.6 (the MAC half of ChaCha20-Poly1305), from libsodium. The key is derived
// from the pre-shared key and both handshake nonces (peer/handshake.cpp), so it differs per
// connection and direction, and a frame number is used at most once per key. The receiver
// numbers frames itself, so a frame replayed, dropped, reordered or injected fails its tag.
// The tag can be computed in pieces, so chunk data is authenticated where it lands, with no
// extra copy.
#pragma once

#include <sodium.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace tensorlane::sidecar {

class FrameAuth {
public:
    static constexpr size_t kKeyBytes = 32;
    static constexpr size_t kTagBytes = 16;
    using Key = std::array<uint8_t, kKeyBytes>;

    FrameAuth() = default;
    explicit FrameAuth(const Key &key) : key_(key), enabled_(true) {}
    ~FrameAuth() { sodium_memzero(key_.data(), key_.size()); }
    FrameAuth(const FrameAuth &) = default;
    FrameAuth &operator=(const FrameAuth &) = default;

    /// False for connections without integrity (before the handshake, or tcp_integrity none).
    bool enabled() const { return enabled_; }
    /// Starts the tag of the next frame (consumes one frame number).
    void begin();
    /// Adds bytes of the frame (its header first, then its payload, in order).
    void update(const uint8_t *data, size_t n);
    /// Writes the frame's tag.
    void finish(uint8_t tag[kTagBytes]);
    /// Whether `tag` is the frame's tag (constant time).
    bool verify(const uint8_t tag[kTagBytes]);
    /// The tag of one whole frame in one go.
    void sign(const uint8_t *head, size_t head_len, const uint8_t *data, size_t data_len,
              uint8_t tag[kTagBytes]);
    /// Frames tagged so far.
    uint64_t frames() const { return counter_; }

private:
    Key key_{};
    bool enabled_ = false;
    uint64_t counter_ = 0;
    crypto_onetimeauth_state state_{};
};

}  // namespace tensorlane::sidecar
