#include "tensorlane/sidecar/trace.hpp"

#include <cstdarg>
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

void traceStep(const char *fmt, ...) {
    if (g_lines == nullptr) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    g_lines->add(fmt, ap);
    va_end(ap);
}

bool writeTrace() {
    return g_lines != nullptr && g_lines->write("tensorlane-sidecar");
}

}  // namespace tensorlane::sidecar
