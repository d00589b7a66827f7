#include "peer/key.hpp"

#include <sodium.h>

#include <string>

#include "key_file_status.hpp"
#include "tensorlane/config/key_file.hpp"

namespace tensorlane::sidecar {

namespace {

// Domain separation: the same key bytes used elsewhere never yield this MAC key.
constexpr std::string_view kKeyContext = "tensorlane peer key v1";

}  // namespace

Status PeerKey::derive(const config::KeyBytes &bytes, PeerKey *out) {
    if (sodium_init() < 0) {
        return {Code::kInternal, "libsodium failed to initialise"};
    }
    PeerKey k;
    // BLAKE2b-256 keyed with the context string: the file's 32 random bytes become the HMAC key.
    crypto_generichash(k.bytes_.data(), k.bytes_.size(), bytes.data(), config::kKeyFileBytes,
                       reinterpret_cast<const unsigned char *>(kKeyContext.data()),
                       kKeyContext.size());
    *out = k;
    return Status::ok();
}

PeerKey::~PeerKey() {
    sodium_memzero(bytes_.data(), bytes_.size());
}

Status PeerKey::fromText(std::string_view text, PeerKey *out) {
    config::KeyBytes bytes;
    const config::KeyFileResult r = config::parseKeyText(text, &bytes);
    if (!r.ok()) {
        return {keyFileCode(r), "peer key text: " + r.detail};
    }
    return derive(bytes, out);
}

Status PeerKey::fromFile(const std::string &path, PeerKey *out) {
    config::KeyBytes bytes;
    if (Status s = readPeerKeyFile(path, &bytes); !s.isOk()) {
        return s;
    }
    return derive(bytes, out);
}

}  // namespace tensorlane::sidecar
