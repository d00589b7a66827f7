// The pre-shared peer key: read from [security] peer_key_file and hashed to the 32-byte MAC key
// the handshake uses (docs/peers.md, "Key file").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// The 32-byte HMAC-SHA256 key shared by the nodes that may talk. Wiped on destruction.
class PeerKey {
public:
    static constexpr size_t kBytes = 32;
    /// The shortest key file content accepted (after trimming whitespace).
    static constexpr size_t kMinSecretBytes = 16;
    /// The longest key file accepted; a larger file is almost certainly the wrong file.
    static constexpr size_t kMaxFileBytes = 4096;

    PeerKey() = default;
    PeerKey(const PeerKey &o) = default;
    PeerKey &operator=(const PeerKey &o) = default;
    ~PeerKey();

    /// Derives the key from a secret (the key file's content with surrounding whitespace
    /// trimmed). kInvalid when it is shorter than kMinSecretBytes.
    static Status fromSecret(std::string_view secret, PeerKey *out);
    /// Reads and derives the key from `path`. The file must be a regular file that neither
    /// group nor others can access (mode 0600 or stricter).
    static Status fromFile(const std::string &path, PeerKey *out);

    const uint8_t *data() const { return bytes_.data(); }

private:
    std::array<uint8_t, kBytes> bytes_{};
};

}  // namespace tensorlane::sidecar
