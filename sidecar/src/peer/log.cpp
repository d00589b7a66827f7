#include "peer/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>

namespace tensorlane::sidecar {

spdlog::logger &peerLog() {
    static const std::shared_ptr<spdlog::logger> logger = [] {
        constexpr const char *kName = "tensorlane.sidecar.peer";
        if (auto existing = spdlog::get(kName)) {
            return existing;
        }
        try {
            return spdlog::stderr_color_mt(kName);
        } catch (const spdlog::spdlog_ex &) {
            // Registered by someone else between get() and create.
            return spdlog::get(kName);
        }
    }();
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
