// Host addresses without their ports, for the accept-side checks (docs/peers.md, "Who may
// connect"): which configured peer a connection's source address belongs to, if any.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "net/socket.hpp"

namespace tensorlane::sidecar {

/// An IPv4 or IPv6 host address. IPv4-mapped IPv6 addresses (what a [::] listener reports for
/// an IPv4 client) are stored as IPv4, so both spellings of one host compare equal.
struct HostAddress {
    /// AF_INET, AF_INET6, or 0 for "none".
    uint8_t family = 0;
    std::array<uint8_t, 16> bytes{};

    auto operator<=>(const HostAddress &) const = default;
    bool empty() const { return family == 0; }
    /// "10.0.0.2" or "fe80::1".
    std::string text() const;
};

/// The host part of a socket address (family 0 for anything but IPv4 and IPv6).
HostAddress hostOf(const SockAddr &a);

/// Every address `host` resolves to (getaddrinfo, both families; blocking: call it off the
/// engine thread). Returns 0, or an EAI_* value (negative) with `*error` saying why.
int resolveAllHosts(const std::string &host, std::vector<HostAddress> *out, std::string *error);

/// "10.0.0.2, 10.0.0.3" (at most the first 4, then "...").
std::string hostListText(const std::vector<HostAddress> &hosts);

}  // namespace tensorlane::sidecar
