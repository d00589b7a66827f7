// The node-wide counters of `tensorlane status` ("counters"), one struct that the engine owns
// and each of its parts (control_server.hpp, request_pipeline.hpp, region_lifecycle.hpp) adds
// to on the engine thread. Plain integers: only that thread writes or reads them.
#pragma once

#include <cstdint>

namespace tensorlane::sidecar {

struct EngineCounters {
    uint64_t sessions_accepted = 0;      ///< control server
    uint64_t sessions_refused = 0;       ///< control server: every refusal's greeting
    uint64_t writes_local = 0;           ///< request pipeline
    uint64_t writes_remote = 0;          ///< request pipeline
    uint64_t requests_rejected = 0;      ///< request pipeline
    uint64_t notifications = 0;          ///< request pipeline
    uint64_t notifications_dropped = 0;  ///< request pipeline
    uint64_t probes_received = 0;        ///< writes into the peer probe's region
    uint64_t probes_sent = 0;            ///< writes into a peer's probe region (diag)
    uint64_t quota_refusals = 0;         ///< region lifecycle
    uint64_t session_cap_refusals = 0;   ///< sessions_per_uid/pid, fd_reserve
    uint64_t accept_pauses = 0;          ///< control server: accept() failed (EMFILE)
    uint64_t late_wakeups = 0;           ///< sleeps that ended by the idle tick with work waiting
};

}  // namespace tensorlane::sidecar
