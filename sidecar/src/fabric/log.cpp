#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <memory>

#include "fabric/internal.hpp"
#include "logging.hpp"

namespace tensorlane::sidecar {

spdlog::logger &fabricLog() {
    // The sidecar's asynchronous stderr logger for this part (logging.hpp).
    static const std::shared_ptr<spdlog::logger> logger = sidecarLogger("fabric");
    return *logger;
}

}  // namespace tensorlane::sidecar
