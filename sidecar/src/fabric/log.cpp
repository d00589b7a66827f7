#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>

#include "fabric/internal.hpp"

namespace tensorlane::sidecar {

spdlog::logger &fabricLog() {
    static const std::shared_ptr<spdlog::logger> logger = [] {
        constexpr const char *kName = "tensorlane.sidecar.fabric";
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

}  // namespace tensorlane::sidecar
