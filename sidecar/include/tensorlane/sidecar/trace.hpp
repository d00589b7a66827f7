// The sidecar's step trace (TENSORLANE_TRACE_FILE=PREFIX): the tcp transport's steps of each
// write (posted, each chunk queued and sent, acknowledged at the writer; each chunk begun and
// landed, the write delivered at the target), kept in memory and written to PREFIX.PID when the
// sidecar stops, with the same clock as the NCCL plugin's trace (TENSORLANE_NCCL_TRACE_FILE), so
// that tests/nccl/trace_steps.py follows a message from the plugin through both sidecars
// (docs/nccl.md, "Diagnosing a hang"). Off (one load and a branch a step) unless set.
#pragma once

#include <string>

namespace tensorlane::sidecar {

namespace trace_detail {
extern bool g_on;
}

/// Whether steps are traced: test it before formatting a step's arguments.
inline bool tracing() {
    return trace_detail::g_on;
}

/// Starts the trace when TENSORLANE_TRACE_FILE is set (before the engine's threads start); its
/// first line names the node. Returns the file prefix, or "" when not tracing.
std::string startTrace(const std::string &node);

/// Adds one step (printf format).
void traceStep(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/// Writes PREFIX.PID (after the engine's threads stopped); false when it could not.
bool writeTrace();

}  // namespace tensorlane::sidecar
