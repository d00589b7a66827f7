// The peer key file named by [security] peer_key_file (docs/peers.md, "Key file"): one line
//
//     tensorlane-key-v1:<64 hexadecimal digits, the 32 key bytes>
//
// optionally ended by a newline, in a regular file that only its owner may read or write (mode
// 0600 or 0400). `tensorlane keygen FILE` writes one. The config parser (--check-config and the
// sidecar's start) and the peer layer read it through readKeyFile, so both report the same
// problem in the same words.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tensorlane::config {

/// What every key file starts with; the version names the file format.
inline constexpr std::string_view kKeyFilePrefix = "tensorlane-key-v1:";
/// Bytes of key in a file (64 hex digits).
inline constexpr size_t kKeyFileBytes = 32;
/// A larger file is refused before it is read: it is certainly not a key file.
inline constexpr size_t kKeyFileMaxBytes = 4096;

/// The 32 bytes of a key file. Wiped on destruction.
class KeyBytes {
public:
    KeyBytes() = default;
    KeyBytes(const KeyBytes &o) = default;
    KeyBytes &operator=(const KeyBytes &o) = default;
    ~KeyBytes();

    /// The bytes, kKeyFileBytes of them.
    uint8_t *data() { return bytes_.data(); }
    /// The bytes, kKeyFileBytes of them.
    const uint8_t *data() const { return bytes_.data(); }

private:
    std::array<uint8_t, kKeyFileBytes> bytes_{};
};

/// What reading a key file found.
struct KeyFileResult {
    /// kAccess: missing, not a regular file, unreadable or group/other-accessible; kFormat:
    /// readable but not a tensorlane-key-v1 file.
    enum class Problem { kNone, kAccess, kFormat };
    /// kNone on success.
    Problem problem = Problem::kNone;
    /// Empty on success; else what is wrong and how to fix it, without the file's name and
    /// never with key material, e.g. "mode 0644: group or others can read or write it (chmod
    /// 600 /etc/tensorlane/peer.key)".
    std::string detail;
    /// No problem.
    bool ok() const { return problem == Problem::kNone; }
};

/// Parses a key file's whole content: kKeyFilePrefix, 64 hex digits (either case), then
/// nothing, "\n" or "\r\n". Nothing else is accepted: no surrounding spaces, no second line.
/// On success `*key` holds the bytes; `detail` of a failure names no path and has no hint.
KeyFileResult parseKeyText(std::string_view text, KeyBytes *key);

/// Opens `path` (following symbolic links, as Kubernetes Secret volumes need), checks that it
/// is a regular file with no group or other access and at most kKeyFileMaxBytes, and parses it.
/// A failure's `detail` says how to fix it (`tensorlane keygen`, chmod).
KeyFileResult readKeyFile(const std::string &path, KeyBytes *key);

/// The content of a key file for `key`: kKeyFilePrefix, 64 lowercase hex digits, "\n".
std::string formatKeyText(const KeyBytes &key);

/// Writes a new key file: 32 bytes from the operating system's CSPRNG (libsodium
/// randombytes_buf), mode 0600, atomically (a temporary file in the same directory, then a
/// link or rename), so `path` holds a complete key or is untouched. An existing `path` is
/// refused unless `replace`. Returns "" on success, else an error that names `path`.
std::string writeNewKeyFile(const std::string &path, bool replace);

}  // namespace tensorlane::config
