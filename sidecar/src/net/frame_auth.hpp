// Integrity of the frames on one direction of one authenticated peer connection
// ([security] tcp_integrity = "mac"; DESIGN.md, "Peer bootstrap").
//
// Each frame gets a Poly1305 tag over its header and payload, under a one-time key taken from
// ChaCha20 with the connection's key and the frame's number as the nonce: the construction of
// RFC 8439 section 2.6 (the MAC half of ChaCha20-Poly1305), from libsodium. The key is derived
// from the pre-shared key and both handshake nonces (peer/handshake.cpp), so it differs per
// connection and direction, and a frame number is used at most once per key. The receiver
// numbers frames itself, so a frame replayed, dropped, reordered or injected fails its tag.
// The tag can be computed in pieces, so chunk data is authenticated as it lands in its receive
// buffer; it reaches the target region only once the tag verified (transport/tcp/links.hpp).
//
// Poly1305 itself runs in OpenSSL's implementation (EVP_MAC "POLY1305": AVX2/AVX-512 code,
// 7.8 GB/s on one core of the vm against 2.2 GB/s for libsodium's portable one): the tag is the
// same function of the same bytes, so the wire does not change and either side may use either
// (tests/peer/frame_auth_test.cpp checks them against each other and against RFC 8439's AEAD).
// OpenSSL's costs about 120 ns more to start a frame, so frames under kOpenSslFrom bytes (control
// frames) take libsodium's, bigger ones (data chunks) OpenSSL's; where OpenSSL's provider offers
// no POLY1305 every frame takes libsodium's. `tests/peer/frame_auth_bench` measures both.
//
// FrameMac is one frame's Poly1305 under its one-time key; FrameAuth numbers the frames of one
// direction and derives their keys. The key of a frame can be taken out (nextKey()) and its
// tag computed by another thread with a FrameMac of its own (net/tag_pool.hpp): the frame
// numbers stay in wire order however the tags are computed.
#pragma once

#include <sodium.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

struct evp_mac_ctx_st;

namespace tensorlane::sidecar {

/// One frame's Poly1305 tag under its one-time key (RFC 8439 2.5), computed in pieces. Each
/// thread that tags needs its own (it holds an OpenSSL context).
class FrameMac {
public:
    static constexpr size_t kTagBytes = 16;
    using OneTimeKey = std::array<uint8_t, crypto_onetimeauth_KEYBYTES>;

    /// Which Poly1305 runs: OpenSSL's where it can be had, else libsodium's.
    enum class Backend { kAuto, kOpenSsl, kSodium };
    /// Frames of at least this many bytes (header and payload) use OpenSSL's Poly1305.
    static constexpr size_t kOpenSslFrom = 2048;

    explicit FrameMac(Backend backend = Backend::kAuto);
    ~FrameMac();
    FrameMac(FrameMac &&other) noexcept;
    FrameMac &operator=(FrameMac &&other) noexcept;
    FrameMac(const FrameMac &) = delete;
    FrameMac &operator=(const FrameMac &) = delete;

    /// Whether big frames run in OpenSSL (tests, status).
    bool usesOpenSsl() const { return ctx_ != nullptr; }
    /// Starts a frame under `otk`; `frame_bytes`, when known, picks the faster implementation
    /// for its size (the tag does not depend on it).
    void init(const OneTimeKey &otk, size_t frame_bytes = std::numeric_limits<size_t>::max());
    /// Adds bytes of the frame, in order.
    void update(const uint8_t *data, size_t n);
    /// Writes the frame's tag.
    void final(uint8_t tag[kTagBytes]);
    /// Whether `tag` is the frame's tag (constant time).
    bool verify(const uint8_t tag[kTagBytes]);

private:
    struct CtxFree {
        void operator()(evp_mac_ctx_st *c) const;
    };

    bool failed_ = false;      ///< OpenSSL refused a step of this frame: its tag never verifies
    bool ossl_frame_ = false;  ///< this frame runs in ctx_ (else in state_)
    std::unique_ptr<evp_mac_ctx_st, CtxFree> ctx_;  ///< OpenSSL's Poly1305, or null
    crypto_onetimeauth_state state_{};              ///< libsodium's
};

/// The frames of one direction of one connection: their numbers and one-time keys, and the
/// tag of the current frame.
class FrameAuth {
public:
    static constexpr size_t kKeyBytes = 32;
    static constexpr size_t kTagBytes = FrameMac::kTagBytes;
    using Key = std::array<uint8_t, kKeyBytes>;
    using Backend = FrameMac::Backend;
    static constexpr size_t kOpenSslFrom = FrameMac::kOpenSslFrom;

    FrameAuth() = default;
    explicit FrameAuth(const Key &key, Backend backend = Backend::kAuto);
    ~FrameAuth();
    FrameAuth(FrameAuth &&other) noexcept;
    FrameAuth &operator=(FrameAuth &&other) noexcept;
    FrameAuth(const FrameAuth &) = delete;
    FrameAuth &operator=(const FrameAuth &) = delete;

    /// Whether this one computes big frames with OpenSSL (tests, status).
    bool usesOpenSsl() const { return mac_.usesOpenSsl(); }

    /// False for connections without integrity (before the handshake, or tcp_integrity none).
    bool enabled() const { return enabled_; }

    /// The one-time key of the next frame (consumes its number): its tag may then be computed
    /// anywhere, with any FrameMac (wipe the key after use).
    FrameMac::OneTimeKey nextKey();
    /// A CHUNK frame's two keys: its tag's (nextKey()'s) and its header tag's, the next 32
    /// bytes of the same ChaCha20 block (kChunkTrailerBytes). Consumes one frame number.
    struct ChunkKeys {
        FrameMac::OneTimeKey data;
        FrameMac::OneTimeKey head;
    };
    ChunkKeys nextChunkKeys();
    /// A chunk frame's header tag: Poly1305 of its headers under `head_key` (libsodium; the
    /// headers are a few dozen bytes).
    static void headerTag(const FrameMac::OneTimeKey &head_key, const uint8_t *head,
                          size_t head_len, uint8_t tag[kTagBytes]);
    /// Whether `tag` is the header tag of `head` (constant time).
    static bool headerTagMatches(const FrameMac::OneTimeKey &head_key, const uint8_t *head,
                                 size_t head_len, const uint8_t tag[kTagBytes]);
    /// A whole chunk frame's trailer (kChunkTrailerBytes: its tag, then its header tag), here.
    void signChunk(const uint8_t *head, size_t head_len, const uint8_t *data, size_t data_len,
                   uint8_t trailer[2 * kTagBytes]);
    /// Starts the tag of the next chunk frame here, like begin(); returns its header key.
    FrameMac::OneTimeKey beginChunk(size_t frame_bytes = std::numeric_limits<size_t>::max());
    /// Starts the tag of the next frame here (consumes one frame number).
    void begin(size_t frame_bytes = std::numeric_limits<size_t>::max());
    /// Starts the tag of a frame whose key nextKey() took, here.
    void beginWith(const FrameMac::OneTimeKey &otk,
                   size_t frame_bytes = std::numeric_limits<size_t>::max());
    /// Adds bytes of the frame (its header first, then its payload, in order).
    void update(const uint8_t *data, size_t n) { mac_.update(data, n); }
    /// Writes the frame's tag.
    void finish(uint8_t tag[kTagBytes]) { mac_.final(tag); }
    /// Whether `tag` is the frame's tag (constant time).
    bool verify(const uint8_t tag[kTagBytes]) { return mac_.verify(tag); }
    /// The tag of one whole frame in one go.
    void sign(const uint8_t *head, size_t head_len, const uint8_t *data, size_t data_len,
              uint8_t tag[kTagBytes]);
    /// Frames numbered so far.
    uint64_t frames() const { return counter_; }

private:
    /// The first `n` (at most 64) bytes of the next frame's ChaCha20 key block (consumes its
    /// number).
    void nextBlock(uint8_t *out, size_t n);

    Key key_{};
    bool enabled_ = false;
    uint64_t counter_ = 0;
    FrameMac mac_{Backend::kSodium};  ///< replaced by the keyed constructor
};

}  // namespace tensorlane::sidecar
