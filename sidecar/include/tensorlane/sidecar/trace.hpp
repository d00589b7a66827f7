// The sidecar's step trace (TENSORLANE_TRACE_FILE=PREFIX): the tcp transport's steps of each
// write (posted, each chunk queued and sent, acknowledged at the writer; each chunk begun and
// landed, the write delivered at the target), kept in memory and written to PREFIX.PID when the
// sidecar stops, with the same clock as the NCCL plugin's trace (TENSORLANE_NCCL_TRACE_FILE), so
// that tests/nccl/trace_steps.py follows a message from the plugin through both sidecars
// (docs/nccl.md, "Diagnosing a hang"). Off (one load and a branch a step) unless set.
#pragma once

#include <time.h>

#include <cstdint>
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

/// Ends the trace without writing it, so that the next startTrace() starts afresh: for tests
/// that run one after another in one process. Only while no other thread can trace.
void stopTraceForTests();

/// Adds one step (printf format).
void traceStep(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/// The phases of one turn of a loop, timed only while tracing: a turn that took at least
/// `min_us` adds the step "LABEL us TOTAL PHASE us PHASE us ..." when it ends (where a busy
/// thread's time goes, turn by turn). Off, each mark() is a load and a branch.
class TurnTimer {
public:
    TurnTimer(const char *label, uint32_t min_us) : label_(label), min_us_(min_us) {
        if (tracing()) {
            start_ = last_ = nowNs();
        }
    }
    TurnTimer(const TurnTimer &) = delete;
    TurnTimer &operator=(const TurnTimer &) = delete;
    ~TurnTimer() { end(); }
    /// Ends the phase under way, which is called `name` (a string literal).
    void mark(const char *name) {
        if (start_ == 0 || n_ == kMaxPhases) {
            return;
        }
        const uint64_t now = nowNs();
        phases_[n_++] = Phase{name, now - last_};
        last_ = now;
    }
    /// Adds the step now (if long enough) rather than at the end of the scope.
    void end();

private:
    static constexpr int kMaxPhases = 12;
    struct Phase {
        const char *name;
        uint64_t ns;
    };
    static uint64_t nowNs() {
        timespec ts{};
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
    }
    const char *label_;
    uint32_t min_us_;
    uint64_t start_ = 0;
    uint64_t last_ = 0;
    Phase phases_[kMaxPhases]{};
    int n_ = 0;
};

/// Writes PREFIX.PID (after the engine's threads stopped); false when it could not.
bool writeTrace();

}  // namespace tensorlane::sidecar
