// The small value methods of the config types and the text helpers the other sources share.
#include <charconv>
#include <cmath>
#include <cstdio>

#include "internal.hpp"
#include "tensorlane/config/config.hpp"

namespace tensorlane::config {

std::string Endpoint::text() const {
    // An IPv6 literal contains ':' and needs brackets, or the port would be ambiguous.
    if (host.find(':') != std::string::npos) {
        return "[" + host + "]:" + std::to_string(port);
    }
    return host + ":" + std::to_string(port);
}

uint8_t Config::trafficClass() const {
    // RoCEv2 carries the IP TOS byte in the GRH traffic class: DSCP in the upper six bits, ECN in
    // the lower two. ECT(0) is 0b10; the NIC marks CE (0b11) itself on congestion.
    return static_cast<uint8_t>((fabric.dscp << 2) | (fabric.ecn ? 2 : 0));
}

double Config::rcTimeoutSeconds() const {
    // IB spec 1.4, 9.7.6.1.3: local ACK timeout = 4.096 us * 2^timeout; 0 disables the timer.
    if (fabric.timeout == 0) {
        return 0.0;
    }
    return 4.096e-6 * std::ldexp(1.0, fabric.timeout);
}

const PeerConfig *Config::findPeer(std::string_view name) const {
    for (const auto &peer : peers) {
        if (peer.name == name) {
            return &peer;
        }
    }
    return nullptr;
}

std::string Error::text() const {
    std::string out = file;
    if (line != 0) {
        out += ":" + std::to_string(line) + ":" + std::to_string(column);
    }
    out += ": ";
    if (!key.empty()) {
        out += "key '" + key + "': ";
    }
    if (!message.empty()) {
        out += message;
        return out;
    }
    out += "expected " + expected;
    if (!found.empty()) {
        out += ", found " + found;
    }
    return out;
}

std::string Error::fix() const {
    if (!key.empty() && found == "unknown key") {
        return "remove or rename '" + key + "' (" + expected + ")";
    }
    if (!key.empty() && !expected.empty()) {
        return "set '" + key + "' to " + expected;
    }
    if (!key.empty()) {
        return "correct '" + key + "': " + message;
    }
    if (line != 0) {
        return "correct the TOML syntax at line " + std::to_string(line) + ", column " +
               std::to_string(column);
    }
    return "give a readable TOML file: " + message;
}

const char *toString(TransportKind k) {
    switch (k) {
        case TransportKind::kAuto:
            return "auto";
        case TransportKind::kVerbs:
            return "verbs";
        case TransportKind::kTcp:
            return "tcp";
    }
    return "?";
}

std::vector<std::string> transportPreference(const FabricConfig &f) {
    if (!f.transports.empty()) {
        return f.transports;
    }
    switch (f.transport) {
        case TransportKind::kVerbs:
            return {"verbs"};
        case TransportKind::kTcp:
            return {"tcp"};
        case TransportKind::kAuto:
            break;
    }
    return {"verbs", "tcp"};
}

bool isTransportName(std::string_view name) {
    return name == "tcp" || name == "verbs";
}

const char *toString(PollMode m) {
    switch (m) {
        case PollMode::kBusy:
            return "busy";
        case PollMode::kAdaptive:
            return "adaptive";
        case PollMode::kEvent:
            return "event";
        case PollMode::kAuto:
            return "auto";
    }
    return "?";
}

PollModeChoice resolvePollMode(PollMode configured, unsigned cpus, std::string_view cpu_source) {
    const std::string count = std::to_string(cpus) + " usable CPU" + (cpus == 1 ? "" : "s") + " (" +
                              std::string(cpu_source) + ")";
    if (configured != PollMode::kAuto) {
        PollModeChoice c{configured, "set in the file", false};
        if (configured != PollMode::kEvent && cpus < kAdaptiveMinCpus) {
            c.warn = true;
            c.reason += std::string("; with only ") + count + ", " + toString(configured) +
                        " spinning takes the CPU the other side of each hand-off needs " +
                        "(round trips of milliseconds): \"event\" or \"auto\" suits this host";
        }
        return c;
    }
    if (cpus >= kAdaptiveMinCpus) {
        return {PollMode::kAdaptive,
                "auto: " + count + ": spin up to spin_us, then sleep (\"busy\" for the lowest " +
                    "latency where a core per side can be spared)",
                false};
    }
    return {PollMode::kEvent,
            "auto: only " + count + ": sleep at once instead of spinning, since a spinning " +
                "client or sidecar would take the CPU the other side of each hand-off needs " +
                "(adaptive from " + std::to_string(kAdaptiveMinCpus) + " CPUs)",
            false};
}

const char *toString(TrustMode t) {
    switch (t) {
        case TrustMode::kDscp:
            return "dscp";
        case TrustMode::kPcp:
            return "pcp";
    }
    return "?";
}

const char *toString(TclassOverride t) {
    return t == TclassOverride::kAdopt ? "adopt" : "fail";
}

const char *toString(Preflight p) {
    return p == Preflight::kFail ? "fail" : "warn";
}

const char *toString(GdrFlush g) {
    switch (g) {
        case GdrFlush::kAuto:
            return "auto";
        case GdrFlush::kOn:
            return "on";
        case GdrFlush::kOff:
            return "off";
    }
    return "?";
}

const char *toString(TcpIntegrity t) {
    return t == TcpIntegrity::kNone ? "none" : "mac";
}

const char *toString(DirectoryKind k) {
    return k == DirectoryKind::kEtcd ? "etcd" : "static";
}

std::string formatBytes(uint64_t bytes) {
    // The largest binary unit that divides it exactly, as a person would write it in the file.
    static constexpr const char *kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    size_t unit = 0;
    while (bytes != 0 && unit + 1 < std::size(kUnits) && bytes % 1024 == 0) {
        bytes /= 1024;
        ++unit;
    }
    if (unit == 0) {
        return std::to_string(bytes);
    }
    return std::to_string(bytes) + kUnits[unit];
}

namespace detail {

std::string quote(std::string_view s, size_t max_bytes) {
    bool cut = false;
    if (s.size() > max_bytes) {
        // Back off to a UTF-8 lead byte so the message stays valid UTF-8 (JSON needs it).
        size_t end = max_bytes;
        while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) {
            --end;
        }
        s = s.substr(0, end);
        cut = true;
    }
    std::string out = "\"";
    for (char ch : s) {
        const auto byte = static_cast<unsigned char>(ch);
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += ch;
        } else if (byte < 0x20 || byte == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", byte);
            out += buf;
        } else {
            out += ch;
        }
    }
    out += cut ? "\"..." : "\"";
    return out;
}

namespace {

bool isHostNameChar(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '-' || ch == '_';
}

bool isHexDigit(char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

bool isIpv6Literal(std::string_view host) {
    // Shape only (hex digits, ':' and '.' for an embedded IPv4, then an optional "%zone"); the
    // resolver has the last word when the sidecar connects.
    const size_t zone = host.find('%');
    const std::string_view addr = host.substr(0, zone);
    if (addr.find(':') == std::string_view::npos) {
        return false;
    }
    for (char ch : addr) {
        if (!isHexDigit(ch) && ch != ':' && ch != '.') {
            return false;
        }
    }
    if (zone != std::string_view::npos) {
        const std::string_view name = host.substr(zone + 1);
        if (name.empty()) {
            return false;
        }
        for (char ch : name) {
            if (!isHostNameChar(ch)) {
                return false;
            }
        }
    }
    return true;
}

}  // namespace

std::optional<Endpoint> parseEndpoint(std::string_view text) {
    std::string_view host;
    std::string_view port;
    if (!text.empty() && text.front() == '[') {
        const size_t close = text.find(']');
        if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
            return std::nullopt;
        }
        host = text.substr(1, close - 1);
        port = text.substr(close + 2);
        if (!isIpv6Literal(host)) {
            return std::nullopt;
        }
    } else {
        const size_t colon = text.rfind(':');
        if (colon == std::string_view::npos) {
            return std::nullopt;
        }
        host = text.substr(0, colon);
        port = text.substr(colon + 1);
        if (host.empty()) {
            return std::nullopt;
        }
        // No ':' here: an unbracketed IPv6 literal would make the port ambiguous.
        for (char ch : host) {
            if (!isHostNameChar(ch)) {
                return std::nullopt;
            }
        }
    }
    // Digits only (from_chars alone would accept a leading '-' or stop at trailing garbage).
    if (port.empty() || port.size() > 5) {
        return std::nullopt;
    }
    for (char ch : port) {
        if (ch < '0' || ch > '9') {
            return std::nullopt;
        }
    }
    unsigned value = 0;
    std::from_chars(port.data(), port.data() + port.size(), value);
    if (value < 1 || value > 65535) {
        return std::nullopt;
    }
    return Endpoint{std::string(host), static_cast<uint16_t>(value)};
}

bool isValidName(std::string_view name) {
    if (name.empty() || name.size() > 63) {
        return false;
    }
    for (char ch : name) {
        if (!isHostNameChar(ch)) {
            return false;
        }
    }
    return true;
}

std::string formatRcTimeout(uint8_t timeout) {
    if (timeout == 0) {
        return "infinite";
    }
    const double seconds = 4.096e-6 * std::ldexp(1.0, timeout);
    char buf[48];
    if (seconds >= 1.0) {
        std::snprintf(buf, sizeof buf, "%.2f s", seconds);
    } else if (seconds >= 1e-3) {
        std::snprintf(buf, sizeof buf, "%.2f ms", seconds * 1e3);
    } else {
        std::snprintf(buf, sizeof buf, "%.3f us", seconds * 1e6);
    }
    return buf;
}

}  // namespace detail
}  // namespace tensorlane::config
