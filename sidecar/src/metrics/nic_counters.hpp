// The NIC's RoCE counters for the metrics endpoint: class/infiniband/<dev>/ports/<p>/hw_counters
// (mlx5: np_cnp_sent, np_ecn_marked_roce_packets, rp_cnp_handled, out_of_sequence,
// packet_seq_err, local_ack_timeout_err, ...; the simulated HCA writes the same files), read
// through the sidecar's SysfsRoot on the exposer's thread, never the engine's.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/fabric.hpp"

namespace tensorlane::sidecar {

/// One RDMA port and what could be read of it.
struct NicPortSample {
    std::string device;
    uint32_t port = 0;
    /// The port's state is exactly ACTIVE.
    bool active = false;
    /// hw_counters/<name> = value, sorted by name; files that are not a decimal count (and
    /// `lifespan`, a setting) are left out.
    std::vector<std::pair<std::string, uint64_t>> counters;
};

/// The ports shown: the one selectFabric() picks for `cfg` (the port the verbs transport uses),
/// else, when selection fails (no device, several candidates, port down), every port of every
/// device under the root.
std::vector<NicPortSample> readNicCounters(const config::Config &cfg, const SysfsRoot &root);

/// Whether `name` may be a Prometheus label value as is: [A-Za-z0-9_]+ (hw_counters names are
/// C identifiers; anything else in a hostile tree is skipped).
bool plainCounterName(const std::string &name);

}  // namespace tensorlane::sidecar
