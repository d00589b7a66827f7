#include "log.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tensorlane::simhca {
namespace {

LogLevel threshold() {
    static const LogLevel level = [] {
        const char *v = std::getenv("TENSORLANE_SIMHCA_LOG");
        if (v == nullptr) {
            return LogLevel::kWarn;
        }
        if (std::strcmp(v, "debug") == 0) {
            return LogLevel::kDebug;
        }
        if (std::strcmp(v, "info") == 0) {
            return LogLevel::kInfo;
        }
        if (std::strcmp(v, "error") == 0) {
            return LogLevel::kError;
        }
        return LogLevel::kWarn;
    }();
    return level;
}

}  // namespace

void log(LogLevel level, const char *fmt, ...) {
    if (level > threshold()) {
        return;
    }
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "simhca: %s\n", buf);
}

}  // namespace tensorlane::simhca
