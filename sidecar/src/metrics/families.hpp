// Turns an engine snapshot and the NIC's counters into Prometheus metric families: the one
// place that names the metrics (docs/metrics.md lists them). Pure, so tests check the output
// of a known snapshot without a server.
#pragma once

#include <prometheus/metric_family.h>

#include <vector>

#include "nic_counters.hpp"
#include "snapshot.hpp"

namespace tensorlane::sidecar {

/// The families for one scrape. `snap` is nullptr when the engine did not answer in time:
/// then only tensorlane_engine_up (0) and the NIC's counters are there. Never throws: a status
/// document that does not parse gives fewer families, not an error.
std::vector<prometheus::MetricFamily> buildFamilies(const Snapshot *snap,
                                                    const std::vector<NicPortSample> &nic);

}  // namespace tensorlane::sidecar
