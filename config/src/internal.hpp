// Helpers shared by the config sources; not part of the public API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "tensorlane/config/config.hpp"

namespace tensorlane::config::detail {

/// `s` in double quotes with '"', '\\' and control bytes escaped, cut at `max_bytes` (plus
/// "...") so that a hostile multi-megabyte string cannot flood an error message.
std::string quote(std::string_view s, size_t max_bytes = 80);

/// Parses "host:port" or "[v6]:port"; nullopt when the text is not one.
std::optional<Endpoint> parseEndpoint(std::string_view text);

/// True for 1-63 characters of [A-Za-z0-9._-] (node and peer names).
bool isValidName(std::string_view name);

/// A text that toml++ 3.3.0 can parse without undefined behaviour (see toml_guard.cpp).
struct ShieldedText {
    std::string text;      ///< the input with the mishandled code points swapped
    bool changed = false;  ///< whether anything was swapped (then unshieldToml the results)
};

/// Why a text cannot be shielded; line 0 when the problem has no single position.
struct UnsafeText {
    uint32_t line = 0;
    uint32_t column = 0;
    std::string message;
};

/// Swaps the code points toml++ 3.3.0 mishandles for private-use substitutes.
std::variant<ShieldedText, UnsafeText> shieldToml(std::string_view text);

/// Swaps the substitutes in a parsed string, key or error message back.
std::string unshieldToml(std::string_view s);

/// The [fabric] timeout as people read it: "1.07 s", "8.192 us", or "infinite" for 0.
std::string formatRcTimeout(uint8_t timeout);

}  // namespace tensorlane::config::detail
