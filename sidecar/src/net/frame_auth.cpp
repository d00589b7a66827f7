#include "net/frame_auth.hpp"

#include <cstring>

namespace tensorlane::sidecar {

void FrameAuth::begin() {
    // RFC 8439 2.6: the Poly1305 key is the first 32 bytes of the ChaCha20 keystream for this
    // nonce. The nonce is the frame number, little-endian, in its first 8 of 12 bytes.
    uint8_t nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {};
    std::memcpy(nonce, &counter_, sizeof counter_);
    ++counter_;
    uint8_t otk[crypto_onetimeauth_KEYBYTES];
    crypto_stream_chacha20_ietf(otk, sizeof otk, nonce, key_.data());
    crypto_onetimeauth_init(&state_, otk);
    sodium_memzero(otk, sizeof otk);
}

void FrameAuth::update(const uint8_t *data, size_t n) {
    if (n != 0) {
        crypto_onetimeauth_update(&state_, data, n);
    }
}

void FrameAuth::finish(uint8_t tag[kTagBytes]) {
    crypto_onetimeauth_final(&state_, tag);
}

bool FrameAuth::verify(const uint8_t tag[kTagBytes]) {
    uint8_t expect[kTagBytes];
    crypto_onetimeauth_final(&state_, expect);
    const bool ok = crypto_verify_16(expect, tag) == 0;
    sodium_memzero(expect, sizeof expect);
    return ok;
}

void FrameAuth::sign(const uint8_t *head, size_t head_len, const uint8_t *data, size_t data_len,
                     uint8_t tag[kTagBytes]) {
    begin();
    update(head, head_len);
    update(data, data_len);
    finish(tag);
}

}  // namespace tensorlane::sidecar
