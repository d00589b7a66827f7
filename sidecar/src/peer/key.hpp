// The pre-shared peer key: read from [security] peer_key_file (a tensorlane-key-v1 file,
// tensorlane/config/key_file.hpp) and hashed to the 32-byte MAC key the handshake uses
// (docs/peers.md, "Key file").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::config {
class KeyBytes;
}

namespace tensorlane::sidecar {

/// The 32-byte HMAC-SHA256 key shared by the nodes that may talk. Wiped on destruction.
class PeerKey {
public:
    static constexpr size_t kBytes = 32;

    PeerKey() = default;
    PeerKey(const PeerKey &o) = default;
    PeerKey &operator=(const PeerKey &o) = default;
    ~PeerKey();

    /// Derives the key from a key file's content (one tensorlane-key-v1 line). kInvalid, with
    /// the reason, for anything else.
    static Status fromText(std::string_view text, PeerKey *out);
    /// Reads and derives the key from `path`: a regular file that neither group nor others can
    /// access (mode 0600 or stricter) holding a tensorlane-key-v1 line. kPermission for a
    /// missing, unreadable or open file, kInvalid for a bad format; the message names the file
    /// and says how to make one (`tensorlane keygen FILE`).
    static Status fromFile(const std::string &path, PeerKey *out);

    const uint8_t *data() const { return bytes_.data(); }

private:
    /// The MAC key of a key file's bytes.
    static Status derive(const config::KeyBytes &bytes, PeerKey *out);

    std::array<uint8_t, kBytes> bytes_{};
};

}  // namespace tensorlane::sidecar
