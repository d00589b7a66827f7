#include "peer/log.hpp"

#include <memory>

#include "logging.hpp"

namespace tensorlane::sidecar {

spdlog::logger &peerLog() {
    static const std::shared_ptr<spdlog::logger> logger = sidecarLogger("peer");
    return *logger;
}

bool LogLimiter::allow(int64_t now_ms, uint64_t *suppressed) {
    if (now_ms - window_start_ >= window_ms_) {
        window_start_ = now_ms;
        used_ = 0;
    }
    if (used_ >= burst_) {
        ++suppressed_;
        return false;
    }
    ++used_;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
}

}  // namespace tensorlane::sidecar
