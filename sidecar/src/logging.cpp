#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include "logging.hpp"

#include <pthread.h>
#include <spdlog/async.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <string>

namespace tensorlane::sidecar {
namespace {

/// Messages that may wait for the writer thread; beyond that the oldest are overwritten.
constexpr size_t kQueueItems = 8192;

std::mutex g_mu;

}  // namespace

std::shared_ptr<spdlog::logger> sidecarLogger(std::string_view part) {
    std::string name = "tensorlane.sidecar";
    if (!part.empty()) {
        name += ".";
        name += part;
    }
    std::lock_guard lock(g_mu);
    if (auto existing = spdlog::get(name)) {
        return existing;
    }
    static const std::shared_ptr<spdlog::details::thread_pool> pool =
        std::make_shared<spdlog::details::thread_pool>(
            kQueueItems, 1, [] { pthread_setname_np(pthread_self(), "tl-log"); });
    static const std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> sink =
        std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto logger = std::make_shared<spdlog::async_logger>(
        name, sink, pool, spdlog::async_overflow_policy::overrun_oldest);
    // The registry gives it the global level (--log-level) and makes spdlog::get() find it.
    spdlog::initialize_logger(logger);
    return logger;
}

void flushLogs() {
    spdlog::apply_all([](const std::shared_ptr<spdlog::logger> &l) { l->flush(); });
}

}  // namespace tensorlane::sidecar
