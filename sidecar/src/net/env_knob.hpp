// The sidecar's experiment knobs: numbers read from its environment (docs/peers.md lists them),
// never settings of the TOML.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>

namespace tensorlane::sidecar {

/// The decimal number in environment variable `name`, or nothing when it is unset, empty or not
/// wholly a decimal number.
inline std::optional<uint64_t> envNumber(const char *name) {
    const char *v = std::getenv(name);
    if (v == nullptr || *v < '0' || *v > '9') {
        return std::nullopt;
    }
    char *end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (*end != '\0') {
        return std::nullopt;
    }
    return static_cast<uint64_t>(n);
}

}  // namespace tensorlane::sidecar
