// SysfsRoot: every sysfs read of tensorlane, relative to one root.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "tensorlane/config/sysfs.hpp"

namespace tensorlane::config {

namespace fs = std::filesystem;

namespace {

/// sysfs attributes are one page at most; anything larger is not an attribute.
constexpr size_t kMaxAttributeBytes = 64 * 1024;

bool allDigits(const std::string &s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

SysfsRoot::SysfsRoot(std::string root) : root_(std::move(root)) {
    while (root_.size() > 1 && root_.back() == '/') {
        root_.pop_back();
    }
}

SysfsRoot SysfsRoot::fromEnvironment() {
    const char *env = std::getenv(kEnvVar);
    return SysfsRoot(env != nullptr && *env != '\0' ? env : "/sys");
}

std::string SysfsRoot::pathOf(std::string_view rel) const {
    std::string out = root_;
    if (!rel.empty()) {
        out += '/';
        out += rel;
    }
    return out;
}

std::optional<std::string> SysfsRoot::read(std::string_view rel) const {
    // open + read rather than an ifstream: a directory opens fine as a stream and reads as
    // empty, and the sysfs errors (EINVAL on unpopulated GID attributes) come from read().
    const std::string path = pathOf(rel);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        return std::nullopt;
    }
    std::string out;
    char buf[4096];
    bool failed = false;
    while (out.size() <= kMaxAttributeBytes) {
        const ssize_t r = ::read(fd, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            failed = true;
            break;
        }
        if (r == 0) {
            break;
        }
        out.append(buf, static_cast<size_t>(r));
    }
    ::close(fd);
    if (failed || out.size() > kMaxAttributeBytes) {
        return std::nullopt;
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\t' ||
                            out.back() == '\r' || out.back() == '\0')) {
        out.pop_back();
    }
    return out;
}

std::vector<std::string> SysfsRoot::list(std::string_view rel) const {
    std::vector<std::string> names;
    std::error_code ec;
    fs::directory_iterator it(pathOf(rel), ec);
    if (ec) {
        return names;
    }
    for (const fs::directory_iterator end; it != end; it.increment(ec)) {
        if (ec) {
            break;
        }
        names.push_back(it->path().filename().string());
    }
    // Ports and GID indices are numbers: 10 sorts after 9.
    const bool numeric = std::all_of(names.begin(), names.end(), allDigits);
    std::sort(names.begin(), names.end(), [numeric](const std::string &a, const std::string &b) {
        if (numeric && a.size() != b.size()) {
            return a.size() < b.size();
        }
        return a < b;
    });
    return names;
}

bool SysfsRoot::exists(std::string_view rel) const {
    std::error_code ec;
    return fs::exists(pathOf(rel), ec);
}

bool SysfsRoot::present(std::string_view rel) const {
    std::error_code ec;
    return fs::symlink_status(pathOf(rel), ec).type() != fs::file_type::not_found && !ec;
}

std::optional<std::string> SysfsRoot::resolve(std::string_view rel) const {
    std::error_code ec;
    const fs::path target = fs::canonical(pathOf(rel), ec);
    if (ec) {
        return std::nullopt;
    }
    const fs::path base = fs::canonical(root_, ec);
    if (ec) {
        return std::nullopt;
    }
    const fs::path inside = target.lexically_relative(base);
    if (inside.empty() || *inside.begin() == "..") {
        return std::nullopt;
    }
    return inside.string();
}

}  // namespace tensorlane::config
