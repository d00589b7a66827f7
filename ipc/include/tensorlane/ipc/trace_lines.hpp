// A trace kept in memory and written at exit: one line a step, "<seconds.micros> <text>", the
// time from CLOCK_REALTIME so that the files of every process of a host share one clock. Adding a
// line formats it into a slot taken with one atomic increment (no lock, no system call besides
// the vDSO clock), so tracing moves the timings it measures far less than a log line would.
// Used by the NCCL plugin (TENSORLANE_NCCL_TRACE_FILE) and the sidecar (TENSORLANE_TRACE_FILE);
// tests/nccl/trace_steps.py reads both.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>

namespace tensorlane::ipc {

class TraceLines {
public:
    /// 44 MiB, taken at construction (a 1 MiB all_reduce makes about 35 lines a rank).
    static constexpr size_t kLines = 1 << 18;
    static constexpr size_t kBytes = 168;

    /// Lines go to `path`.PID at write().
    explicit TraceLines(std::string path) : path_(std::move(path)) {}

    /// Adds one line (printf format); past kLines lines are counted, not kept.
    void add(const char *fmt, va_list ap) {
        const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
        if (i >= kLines) {
            return;
        }
        timespec ts{};
        ::clock_gettime(CLOCK_REALTIME, &ts);  // one clock for every process of the host
        Line &l = lines_[i];
        int n = std::snprintf(l.text, kBytes, "%lld.%06ld ", static_cast<long long>(ts.tv_sec),
                              ts.tv_nsec / 1000);
        if (n > 0 && static_cast<size_t>(n) < kBytes) {
            const int m = std::vsnprintf(l.text + n, kBytes - static_cast<size_t>(n), fmt, ap);
            n = m < 0 ? n : std::min<int>(n + m, static_cast<int>(kBytes) - 1);
        }
        l.len.store(static_cast<uint32_t>(std::max(n, 0)), std::memory_order_release);
    }
    void addf(const char *fmt, ...) __attribute__((format(printf, 2, 3))) {
        va_list ap;
        va_start(ap, fmt);
        add(fmt, ap);
        va_end(ap);
    }

    /// Writes the lines so far to `path`.PID (a line still being written is left out); `who`
    /// names the writer in its message on failure. Returns whether the file was written. The
    /// file must not exist yet: a sidecar runs as root, and a name that is already there (a
    /// symbolic link planted in a shared directory, say) is refused rather than followed or
    /// overwritten.
    bool write(const char *who) const {
        const std::string file = path_ + "." + std::to_string(::getpid());
        const int fd =
            ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        FILE *f = fd >= 0 ? ::fdopen(fd, "w") : nullptr;
        if (f == nullptr) {
            std::fprintf(stderr, "%s: trace file %s: %s\n", who, file.c_str(),
                         std::strerror(errno));
            if (fd >= 0) {
                ::close(fd);
            }
            return false;
        }
        const size_t n = next_.load(std::memory_order_acquire);
        for (size_t i = 0; i < std::min(n, kLines); ++i) {
            const uint32_t len = lines_[i].len.load(std::memory_order_acquire);
            if (len != 0) {
                std::fprintf(f, "%.*s\n", static_cast<int>(len), lines_[i].text);
            }
        }
        if (n > kLines) {
            std::fprintf(f, "# %zu more lines did not fit\n", n - kLines);
        }
        return std::fclose(f) == 0;
    }

private:
    struct Line {
        std::atomic<uint32_t> len{0};  ///< set last: a line being written is skipped
        char text[kBytes];
    };
    std::string path_;
    std::unique_ptr<Line[]> lines_ = std::make_unique<Line[]>(kLines);
    std::atomic<size_t> next_{0};
};

}  // namespace tensorlane::ipc
