// The simulator's diagnostics. It is loaded into programs it did not write (perftest,
// ibverbs-utils, the sidecar), so like rdma-core's verbs_log it prints to stderr only, and only
// errors unless TENSORLANE_SIMHCA_LOG=debug|info asks for more.
#pragma once

namespace tensorlane::simhca {

/// Message levels.
enum class LogLevel { kError, kWarn, kInfo, kDebug };

/// printf-style message to stderr, prefixed "simhca:", when level is enabled.
void log(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace tensorlane::simhca
