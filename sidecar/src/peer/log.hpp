// The peer subsystem's logger and a limiter for messages an outsider can trigger at will.
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <cstdint>

namespace tensorlane::sidecar {

/// The "tensorlane.sidecar.peer" logger (created on first use, stderr, when nobody registered
/// it before).
spdlog::logger &peerLog();

/// Lets at most `burst` messages through per `window_ms`; counts the rest so the next message
/// that passes can say how many were suppressed. Keeps a flood of garbage connections from
/// flooding the log too.
class LogLimiter {
public:
    LogLimiter(uint32_t burst, int64_t window_ms) : burst_(burst), window_ms_(window_ms) {}
    /// True when a message may be logged now; `*suppressed` gets the count dropped before it.
    bool allow(int64_t now_ms, uint64_t *suppressed);

private:
    uint32_t burst_;
    int64_t window_ms_;
    int64_t window_start_ = 0;
    uint32_t used_ = 0;
    uint64_t suppressed_ = 0;
};

}  // namespace tensorlane::sidecar
