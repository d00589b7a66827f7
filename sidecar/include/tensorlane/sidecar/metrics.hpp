// The Prometheus endpoint's check that --check-config shares with the start: whether
// [metrics] listen names an address this build can serve on.
#pragma once

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// Ok when [metrics] listen is off, or its host resolves to an address the endpoint can bind
/// (IPv4 only where civetweb has no IPv6); kInvalid with the reason otherwise. Whether the
/// port is free is known only when binding, at start.
Status checkMetricsListen(const config::Config &cfg);

}  // namespace tensorlane::sidecar
