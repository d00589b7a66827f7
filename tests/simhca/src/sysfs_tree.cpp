#include "sysfs_tree.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tensorlane::simhca {

std::string sysfsRoot() {
    const char *v = std::getenv(kSysfsRootEnv);
    return v != nullptr ? std::string(v) : std::string();
}

std::optional<std::string> readTrimmed(const std::string &path) {
    std::ifstream in(path);
    if (!in) {
        return std::nullopt;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) {
        s.pop_back();
    }
    return s;
}

bool writeAtomically(const std::string &path, const std::string &contents) {
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        return false;
    }
    const bool ok =
        ::write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size());
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
        ::unlink(tmp.c_str());
        return false;
    }
    return true;
}

std::vector<std::string> listDirectory(const std::string &path) {
    std::vector<std::string> names;
    DIR *d = ::opendir(path.c_str());
    if (d == nullptr) {
        return names;
    }
    while (const dirent *e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") {
            names.push_back(n);
        }
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

std::optional<uint64_t> parseLeadingInt(const std::string &s) {
    if (s.empty()) {
        return std::nullopt;
    }
    char *end = nullptr;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
    if (end == s.c_str()) {
        return std::nullopt;
    }
    return static_cast<uint64_t>(v);
}

}  // namespace tensorlane::simhca
