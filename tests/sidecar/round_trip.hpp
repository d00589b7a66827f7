// A verified local round trip through a sidecar: the check tests make that a sidecar still
// serves (after a hostile client, a flood, a cap) and that bystanders are unaffected.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "harness.hpp"
#include "tensorlane/tensorlane.hpp"

namespace tltest {

/// A new client exposes a 64 KiB buffer as `prefix` + `seed`, writes random bytes into it with
/// immediate `imm` and checks the notification and every byte; true on success.
inline bool verifiedRoundTrip(const std::string &sock, uint64_t seed, const std::string &prefix,
                              uint32_t imm) {
    auto c = tensorlane::Client::connect(sock);
    if (!c.ok()) {
        return false;
    }
    auto src = c->allocHost(1 << 16);
    auto dst = c->allocHost(1 << 16);
    const std::string name = prefix + std::to_string(seed);
    if (!src.ok() || !dst.ok() || !dst->expose(name).ok()) {
        return false;
    }
    auto remote = c->lookup(c->nodeName(), name);
    if (!remote.ok()) {
        return false;
    }
    fillRandom(src->data(), 1 << 16, seed);
    auto t = c->write(*src, 0, *remote, 0, 1 << 16, imm);
    if (!t.ok() || t->wait(std::chrono::seconds(5)) != TL_OK) {
        return false;
    }
    auto n = c->waitNotification(std::chrono::seconds(5));
    return n.ok() && n->imm == imm && std::memcmp(src->data(), dst->data(), 1 << 16) == 0;
}

}  // namespace tltest
