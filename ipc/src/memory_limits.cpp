#include "tensorlane/ipc/memory_limits.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

namespace tensorlane::ipc {
namespace {

/// v1 writes "unlimited" as the largest page-aligned counter (9223372036854771712 on x86-64);
/// anything this large is no limit.
constexpr uint64_t kUnlimitedFrom = uint64_t{1} << 62;

std::string joinRoot(const std::string &root, const std::string &rel) {
    std::string r = root;
    while (!r.empty() && r.back() == '/') {
        r.pop_back();
    }
    return r + "/" + rel;
}

bool isDir(const std::string &path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// A decimal number from the first word of `path`; "max" is nullopt with *unlimited set.
std::optional<uint64_t> readNumber(const std::string &path, bool *unlimited) {
    std::ifstream in(path);
    std::string word;
    if (!(in >> word)) {
        return std::nullopt;
    }
    if (word == "max") {
        *unlimited = true;
        return std::nullopt;
    }
    char *end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(word.c_str(), &end, 10);
    if (end == word.c_str() || *end != '\0' || errno != 0 || word[0] == '-') {
        return std::nullopt;
    }
    if (v >= kUnlimitedFrom) {
        *unlimited = true;
        return std::nullopt;
    }
    return v;
}

/// The cgroup paths of this process: the v2 one ("0::") and the v1 memory one.
void ownPaths(const std::string &root, std::optional<std::string> *v2,
              std::optional<std::string> *v1) {
    std::ifstream in(joinRoot(root, "proc/self/cgroup"));
    std::string line;
    while (std::getline(in, line)) {
        const size_t a = line.find(':');
        const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos) {
            continue;
        }
        const std::string controllers = line.substr(a + 1, b - a - 1);
        const std::string path = line.substr(b + 1);
        if (line.compare(0, a, "0") == 0 && controllers.empty()) {
            *v2 = path;
            continue;
        }
        std::stringstream list(controllers);
        for (std::string c; std::getline(list, c, ',');) {
            if (c == "memory") {
                *v1 = path;
            }
        }
    }
}

/// Walks from `mount`/`path` (or `mount` itself when that is missing) up to `mount`, and
/// keeps the level with the least room. `version` 0 in the result: no level has a limit.
CgroupMemory walk(const std::string &root, const std::string &mount_rel, std::string path,
                  const char *limit_file, const char *usage_file, int version) {
    CgroupMemory best;
    const std::string mount = joinRoot(root, mount_rel);
    if (!isDir(mount)) {
        return best;
    }
    while (!path.empty() && path.back() == '/') {
        path.pop_back();
    }
    if (!path.empty() && path.front() != '/') {
        path.insert(0, "/");
    }
    if (!isDir(mount + path)) {
        path.clear();  // not below this mount: the mount's root is our cgroup
    }
    for (;;) {
        const std::string dir = mount + path;
        bool unlimited = false;
        const std::optional<uint64_t> limit = readNumber(dir + "/" + limit_file, &unlimited);
        if (limit) {
            bool ignored = false;
            const uint64_t usage = readNumber(dir + "/" + usage_file, &ignored).value_or(0);
            CgroupMemory here;
            here.version = version;
            here.dir = mount_rel + (path.empty() ? "" : path);
            here.limit = *limit;
            here.usage = usage;
            if (best.version == 0 || here.room() < best.room()) {
                best = here;
            }
        }
        if (path.empty()) {
            break;
        }
        path.erase(path.rfind('/'));
    }
    return best;
}

}  // namespace

std::string memoryRoot() {
    const char *env = std::getenv(kMemoryRootEnv);
    return env != nullptr && *env != '\0' ? std::string(env) : std::string("/");
}

CgroupMemory readCgroupMemory(const std::string &root) {
    std::optional<std::string> v2, v1;
    ownPaths(root, &v2, &v1);
    if (v2) {
        // A hybrid host has a v2 line too, with the memory controller on v1: no memory.max.
        CgroupMemory m = walk(root, "sys/fs/cgroup", *v2, "memory.max", "memory.current", 2);
        if (m.version != 0) {
            return m;
        }
    }
    if (v1) {
        return walk(root, "sys/fs/cgroup/memory", *v1, "memory.limit_in_bytes",
                    "memory.usage_in_bytes", 1);
    }
    return {};
}

uint64_t readMeminfo(const std::string &root, const char *key) {
    std::ifstream in(joinRoot(root, "proc/meminfo"));
    std::string line;
    const size_t klen = std::strlen(key);
    while (std::getline(in, line)) {
        if (line.compare(0, klen, key) == 0 && line.size() > klen && line[klen] == ':') {
            return std::strtoull(line.c_str() + klen + 1, nullptr, 10) * 1024;
        }
    }
    return 0;
}

uint64_t memoryBudget(const std::string &root) {
    const uint64_t total = readMeminfo(root, "MemTotal");
    return std::min(total == 0 ? UINT64_MAX : total, readCgroupMemory(root).limit);
}

}  // namespace tensorlane::ipc
