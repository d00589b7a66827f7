#include "tensorlane/sidecar/trace.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "tensorlane/ipc/trace_lines.hpp"

namespace tensorlane::sidecar {

namespace trace_detail {
bool g_on = false;
}

namespace {
std::unique_ptr<ipc::TraceLines> g_lines;
std::string g_prefix;  ///< the started trace's
}  // namespace

std::string startTrace(const std::string &node) {
    if (g_lines != nullptr) {
        return g_prefix;
    }
    const char *prefix = std::getenv("TENSORLANE_TRACE_FILE");
    if (prefix == nullptr || *prefix == '\0') {
        return {};
    }
    g_prefix = prefix;
    g_lines = std::make_unique<ipc::TraceLines>(g_prefix);
    trace_detail::g_on = true;
    traceStep("sidecar node %s", node.c_str());
    return g_prefix;
}

void stopTraceForTests() {
    trace_detail::g_on = false;
    g_lines.reset();
    g_prefix.clear();
}

void traceStep(const char *fmt, ...) {
    if (g_lines == nullptr) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    g_lines->add(fmt, ap);
    va_end(ap);
}

void TurnTimer::end() {
    if (start_ == 0) {
        return;
    }
    const uint64_t total = nowNs() - start_;
    start_ = 0;
    if (total < uint64_t{min_us_} * 1000) {
        return;
    }
    char line[512];
    int at = std::snprintf(line, sizeof line, "%s us %llu", label_,
                           static_cast<unsigned long long>(total / 1000));
    for (int i = 0; i < n_ && at > 0 && static_cast<size_t>(at) < sizeof line; ++i) {
        at += std::snprintf(line + at, sizeof line - static_cast<size_t>(at), " %s %llu",
                            phases_[i].name, static_cast<unsigned long long>(phases_[i].ns / 1000));
    }
    traceStep("%s", line);
}

bool writeTrace() {
    return g_lines != nullptr && g_lines->write("tensorlane-sidecar");
}

}  // namespace tensorlane::sidecar
