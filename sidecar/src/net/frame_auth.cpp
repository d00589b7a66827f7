#include "net/frame_auth.hpp"

#include <openssl/evp.h>

#include <cstring>
#include <utility>

namespace tensorlane::sidecar {

namespace {

/// OpenSSL's Poly1305, fetched once per process (null when the provider has none).
EVP_MAC *poly1305() {
    static EVP_MAC *const mac = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
    return mac;
}

}  // namespace

// ----- FrameMac

void FrameMac::CtxFree::operator()(evp_mac_ctx_st *c) const {
    EVP_MAC_CTX_free(c);
}

FrameMac::FrameMac(Backend backend) {
    if (backend != Backend::kSodium && poly1305() != nullptr) {
        ctx_.reset(EVP_MAC_CTX_new(poly1305()));
    }
}

FrameMac::~FrameMac() {
    sodium_memzero(&state_, sizeof state_);
}

FrameMac::FrameMac(FrameMac &&other) noexcept
    : failed_(other.failed_),
      ossl_frame_(other.ossl_frame_),
      ctx_(std::move(other.ctx_)),
      state_(other.state_) {
    sodium_memzero(&other.state_, sizeof other.state_);
    other.ossl_frame_ = false;
}

FrameMac &FrameMac::operator=(FrameMac &&other) noexcept {
    if (this != &other) {
        failed_ = other.failed_;
        ossl_frame_ = other.ossl_frame_;
        ctx_ = std::move(other.ctx_);
        state_ = other.state_;
        sodium_memzero(&other.state_, sizeof other.state_);
        other.ossl_frame_ = false;
    }
    return *this;
}

void FrameMac::init(const OneTimeKey &otk, size_t frame_bytes) {
    failed_ = false;
    ossl_frame_ = ctx_ != nullptr && frame_bytes >= kOpenSslFrom;
    if (ossl_frame_) {
        failed_ = EVP_MAC_init(ctx_.get(), otk.data(), otk.size(), nullptr) != 1;
    } else {
        crypto_onetimeauth_init(&state_, otk.data());
    }
}

void FrameMac::update(const uint8_t *data, size_t n) {
    if (n == 0) {
        return;
    }
    if (ossl_frame_) {
        failed_ = failed_ || EVP_MAC_update(ctx_.get(), data, n) != 1;
    } else {
        crypto_onetimeauth_update(&state_, data, n);
    }
}

void FrameMac::final(uint8_t tag[kTagBytes]) {
    if (ossl_frame_) {
        size_t len = 0;
        if (failed_ || EVP_MAC_final(ctx_.get(), tag, &len, kTagBytes) != 1 || len != kTagBytes) {
            failed_ = true;
            std::memset(tag, 0, kTagBytes);
        }
    } else {
        crypto_onetimeauth_final(&state_, tag);
    }
}

bool FrameMac::verify(const uint8_t tag[kTagBytes]) {
    uint8_t expect[kTagBytes];
    final(expect);
    const bool ok = !failed_ && crypto_verify_16(expect, tag) == 0;
    sodium_memzero(expect, sizeof expect);
    return ok;
}

// ----- FrameAuth

FrameAuth::FrameAuth(const Key &key, Backend backend) : key_(key), enabled_(true), mac_(backend) {}

FrameAuth::~FrameAuth() {
    sodium_memzero(key_.data(), key_.size());
}

FrameAuth::FrameAuth(FrameAuth &&other) noexcept
    : key_(other.key_),
      enabled_(other.enabled_),
      counter_(other.counter_),
      mac_(std::move(other.mac_)) {
    sodium_memzero(other.key_.data(), other.key_.size());
    other.enabled_ = false;
}

FrameAuth &FrameAuth::operator=(FrameAuth &&other) noexcept {
    if (this != &other) {
        key_ = other.key_;
        enabled_ = other.enabled_;
        counter_ = other.counter_;
        mac_ = std::move(other.mac_);
        sodium_memzero(other.key_.data(), other.key_.size());
        other.enabled_ = false;
    }
    return *this;
}

void FrameAuth::nextBlock(uint8_t *out, size_t n) {
    // RFC 8439 2.6: the Poly1305 key is the first 32 bytes of the ChaCha20 keystream for this
    // nonce. The nonce is the frame number, little-endian, in its first 8 of 12 bytes.
    uint8_t nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {};
    std::memcpy(nonce, &counter_, sizeof counter_);
    ++counter_;
    crypto_stream_chacha20_ietf(out, n, nonce, key_.data());
}

FrameMac::OneTimeKey FrameAuth::nextKey() {
    FrameMac::OneTimeKey otk;
    nextBlock(otk.data(), otk.size());
    return otk;
}

FrameAuth::ChunkKeys FrameAuth::nextChunkKeys() {
    // The block's second half as well: RFC 8439's AEAD never uses it for anything (its
    // encryption starts at block counter 1), so it is a key of its own.
    uint8_t block[64];
    nextBlock(block, sizeof block);
    ChunkKeys k;
    std::memcpy(k.data.data(), block, k.data.size());
    std::memcpy(k.head.data(), block + k.data.size(), k.head.size());
    sodium_memzero(block, sizeof block);
    return k;
}

void FrameAuth::headerTag(const FrameMac::OneTimeKey &head_key, const uint8_t *head,
                          size_t head_len, uint8_t tag[kTagBytes]) {
    crypto_onetimeauth(tag, head, head_len, head_key.data());
}

bool FrameAuth::headerTagMatches(const FrameMac::OneTimeKey &head_key, const uint8_t *head,
                                 size_t head_len, const uint8_t tag[kTagBytes]) {
    return crypto_onetimeauth_verify(tag, head, head_len, head_key.data()) == 0;
}

void FrameAuth::signChunk(const uint8_t *head, size_t head_len, const uint8_t *data,
                          size_t data_len, uint8_t trailer[2 * kTagBytes]) {
    FrameMac::OneTimeKey head_key = beginChunk(head_len + data_len);
    update(head, head_len);
    update(data, data_len);
    finish(trailer);
    headerTag(head_key, head, head_len, trailer + kTagBytes);
    sodium_memzero(head_key.data(), head_key.size());
}

FrameMac::OneTimeKey FrameAuth::beginChunk(size_t frame_bytes) {
    ChunkKeys k = nextChunkKeys();
    mac_.init(k.data, frame_bytes);
    sodium_memzero(k.data.data(), k.data.size());
    return k.head;
}

void FrameAuth::begin(size_t frame_bytes) {
    FrameMac::OneTimeKey otk = nextKey();
    mac_.init(otk, frame_bytes);
    sodium_memzero(otk.data(), otk.size());
}

void FrameAuth::beginWith(const FrameMac::OneTimeKey &otk, size_t frame_bytes) {
    mac_.init(otk, frame_bytes);
}

void FrameAuth::sign(const uint8_t *head, size_t head_len, const uint8_t *data, size_t data_len,
                     uint8_t tag[kTagBytes]) {
    begin(head_len + data_len);
    update(head, head_len);
    update(data, data_len);
    finish(tag);
}

}  // namespace tensorlane::sidecar
