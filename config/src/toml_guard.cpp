// Keeps toml++ 3.3.0 off a code path with undefined behaviour, without changing what parses.
//
// toml++ 3.3.0 decides whether a code point is "non-ASCII horizontal whitespace" with a generated
// lookup that ends in TOML_UNREACHABLE (__builtin_unreachable) and misses 3019 code points:
// U+00A1-U+0499, U+2C5E-U+3057 (but U+3000) and U+FB26-U+FEFE. The parser asks that question of
// characters outside strings, of characters it reads ahead while scanning a number or date, and
// inside a multi-line basic string after a backslash, so "a = [1,é]" or
// s = """\<newline>§""" reach the unreachable point (marzer/tomlplusplus#190, #295; fixed
// upstream after 3.3.0, which is what Debian 12 ships). Knowing in advance which characters the
// parser will classify would take a second TOML parser.
//
// Instead, every such code point is swapped for one in Unicode plane 15 (private use, above
// U+FEFF, so the lookup returns false at its first comparison) before parsing, and swapped back
// in every string and key of the result and in error messages. Code points keep their count, so
// lines and columns are unchanged. Where those characters are invalid TOML (outside strings),
// the parser still rejects the substitute; where they are valid (in strings and comments), the
// value comes back unchanged.
#include <array>
#include <cstdio>
#include <string>

#include "internal.hpp"

namespace tensorlane::config::detail {
namespace {

/// A run of code points the 3.3.0 lookup mishandles, and where its substitutes start.
struct Range {
    char32_t first;
    char32_t last;
    char32_t substitute;
};

// U+3000 is inside the middle range; the lookup handles it, but swapping it too keeps the
// table simple, and outside strings it is an error either way.
constexpr char32_t kPlane15 = 0xF0000;
constexpr std::array<Range, 3> kRanges = {{
    {0x00A1, 0x0499, kPlane15},
    {0x2C5E, 0x3057, kPlane15 + (0x0499 - 0x00A1 + 1)},
    {0xFB26, 0xFEFE, kPlane15 + (0x0499 - 0x00A1 + 1) + (0x3057 - 0x2C5E + 1)},
}};
constexpr char32_t kSubstituteEnd = kRanges[2].substitute + (0xFEFE - 0xFB26 + 1);

/// One decoded UTF-8 code point; `length` 0 when the bytes are not valid UTF-8.
struct Decoded {
    char32_t cp = 0;
    size_t length = 0;
};

Decoded decode(std::string_view s, size_t pos) {
    const auto b0 = static_cast<unsigned char>(s[pos]);
    size_t len = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2, cp = b0 & 0x1Fu, min = 0x80;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3, cp = b0 & 0x0Fu, min = 0x800;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4, cp = b0 & 0x07u, min = 0x10000;
    } else {
        return {};
    }
    if (pos + len > s.size()) {
        return {};
    }
    for (size_t i = 1; i < len; ++i) {
        const auto b = static_cast<unsigned char>(s[pos + i]);
        if ((b & 0xC0) != 0x80) {
            return {};
        }
        cp = (cp << 6) | (b & 0x3Fu);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not code points; leave them for
    // toml++ to reject.
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        return {};
    }
    return {cp, len};
}

void encode(char32_t cp, std::string &out) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

bool isSubstitute(char32_t cp) {
    return cp >= kPlane15 && cp < kSubstituteEnd;
}

char32_t toSubstitute(char32_t cp) {
    for (const Range &r : kRanges) {
        if (cp >= r.first && cp <= r.last) {
            return r.substitute + (cp - r.first);
        }
    }
    return cp;
}

char32_t fromSubstitute(char32_t cp) {
    for (const Range &r : kRanges) {
        if (cp >= r.substitute && cp <= r.substitute + (r.last - r.first)) {
            return r.first + (cp - r.substitute);
        }
    }
    return cp;
}

/// Whether `s` holds the escape "\U000F0..." (any case), which could spell a substitute.
bool hasPlane15Escape(std::string_view s) {
    for (size_t i = 0; i + 6 <= s.size(); ++i) {
        if (s[i] == '\\' && s[i + 1] == 'U' && s.substr(i + 2, 3) == "000" &&
            (s[i + 5] == 'F' || s[i + 5] == 'f')) {
            return true;
        }
    }
    return false;
}

}  // namespace

std::variant<ShieldedText, UnsafeText> shieldToml(std::string_view text) {
    ShieldedText out;
    out.text.reserve(text.size());
    // A substitute already in the file would come back as something else, but only matters when
    // something was swapped.
    std::optional<UnsafeText> clash;
    uint32_t line = 1;
    uint32_t column = 1;
    for (size_t pos = 0; pos < text.size();) {
        const char ch = text[pos];
        if ((static_cast<unsigned char>(ch) & 0x80) == 0) {
            out.text += ch;
            ++pos;
            if (ch == '\n') {
                ++line;
                column = 1;
            } else {
                ++column;
            }
            continue;
        }
        const Decoded d = decode(text, pos);
        if (d.length == 0) {
            out.text += ch;  // invalid UTF-8: toml++ reports it
            ++pos;
            ++column;
            continue;
        }
        if (isSubstitute(d.cp) && !clash) {
            clash = UnsafeText{line, column, ""};
            char buf[160];
            std::snprintf(buf, sizeof buf,
                          "invalid config: private-use character U+%05X cannot be combined with "
                          "the characters U+00A1-U+0499, U+2C5E-U+3057 or U+FB26-U+FEFE",
                          static_cast<unsigned>(d.cp));
            clash->message = buf;
        }
        const char32_t cp = toSubstitute(d.cp);
        out.changed = out.changed || cp != d.cp;
        encode(cp, out.text);
        pos += d.length;
        ++column;
    }
    if (out.changed && clash) {
        return *clash;
    }
    if (out.changed && hasPlane15Escape(text)) {
        return UnsafeText{0, 0,
                          "invalid config: a \\U000F.... escape cannot be combined with the "
                          "characters U+00A1-U+0499, U+2C5E-U+3057 or U+FB26-U+FEFE (a toml++ "
                          "3.3.0 workaround swaps those for plane-15 characters)"};
    }
    return out;
}

std::string unshieldToml(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t pos = 0; pos < s.size();) {
        const Decoded d =
            (static_cast<unsigned char>(s[pos]) & 0x80) != 0 ? decode(s, pos) : Decoded{};
        if (d.length != 0 && isSubstitute(d.cp)) {
            encode(fromSubstitute(d.cp), out);
            pos += d.length;
            continue;
        }
        // toml++ error messages spell code points past U+FFFF as "\U000F0123".
        if (s[pos] == '\\' && pos + 10 <= s.size() && s[pos + 1] == 'U') {
            unsigned value = 0;
            bool hex = true;
            for (size_t i = pos + 2; i < pos + 10 && hex; ++i) {
                const char c = s[i];
                hex = (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
                value = value * 16 + static_cast<unsigned>(c <= '9' ? c - '0' : c - 'A' + 10);
            }
            if (hex && isSubstitute(value)) {
                char buf[16];
                std::snprintf(buf, sizeof buf, "\\u%04X",
                              static_cast<unsigned>(fromSubstitute(value)));
                out += buf;
                pos += 10;
                continue;
            }
        }
        out += s[pos];
        ++pos;
    }
    return out;
}

}  // namespace tensorlane::config::detail
