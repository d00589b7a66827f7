// The sidecar's status document as a test reads it: tl_sidecar_status parsed, one peer's entry.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "tensorlane/tensorlane.h"

namespace tltest {

/// `c`'s sidecar's whole status document; empty when it cannot be had or parsed.
inline nlohmann::json sidecarStatus(tl_client *c) {
    std::string buf(1 << 16, '\0');
    size_t len = 0;
    if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
        return {};
    }
    buf.resize(std::min(len, buf.size() - 1));
    auto j = nlohmann::json::parse(buf, nullptr, false);
    return j.is_discarded() ? nlohmann::json{} : j;
}

/// The entry of `peer` in `c`'s sidecar's status (`peers[]`); empty when it has none.
inline nlohmann::json peerStatus(tl_client *c, const std::string &peer) {
    const nlohmann::json j = sidecarStatus(c);
    if (j.is_object() && j.contains("peers")) {
        for (const auto &p : j["peers"]) {
            if (p.value("name", "") == peer) {
                return p;
            }
        }
    }
    return {};
}

}  // namespace tltest
