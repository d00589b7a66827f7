// Turning untrusted bytes into text that is safe to log.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace tensorlane::sidecar {

/// At most `max` bytes of `bytes`, with anything outside printable ASCII replaced by '?'.
inline std::string printableText(std::span<const uint8_t> bytes, size_t max = 512) {
    std::string out;
    const size_t n = bytes.size() < max ? bytes.size() : max;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        const uint8_t b = bytes[i];
        out.push_back(b >= 0x20 && b < 0x7f ? static_cast<char>(b) : '?');
    }
    return out;
}

}  // namespace tensorlane::sidecar
