#include "net/cpus.hpp"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace tensorlane::sidecar {
namespace {

std::optional<std::string> readSmall(const std::string &path) {
    std::ifstream in(path);
    if (!in) {
        return std::nullopt;
    }
    std::string text;
    std::getline(in, text);
    return text;
}

std::optional<int64_t> toInt(std::string_view s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
        s.remove_suffix(1);
    }
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size()) {
        return std::nullopt;
    }
    return v;
}

std::optional<unsigned> cpusOf(int64_t quota, int64_t period) {
    if (quota <= 0 || period <= 0) {
        return std::nullopt;
    }
    return static_cast<unsigned>(std::max<int64_t>(1, (quota + period - 1) / period));
}

/// The tightest quota on the way from `dir` up to `root` (a parent's limit binds its children).
void lowerByV2(const std::string &root, std::string dir, CpuBudget *b) {
    for (;;) {
        const std::string file = root + dir + (dir == "/" ? "" : "/") + "cpu.max";
        if (auto text = readSmall(file)) {
            if (auto n = cpusOfQuota(*text); n && *n < b->cpus) {
                b->cpus = *n;
                b->source = "cgroup " + file + " " + *text;
            }
        }
        if (dir.empty() || dir == "/") {
            return;
        }
        const size_t slash = dir.find_last_of('/');
        dir = slash == 0 || slash == std::string::npos ? "/" : dir.substr(0, slash);
    }
}

}  // namespace

std::optional<unsigned> cpusOfQuota(std::string_view cpu_max) {
    const size_t space = cpu_max.find(' ');
    if (space == std::string_view::npos) {
        return std::nullopt;
    }
    const auto quota = toInt(cpu_max.substr(0, space));
    const auto period = toInt(cpu_max.substr(space + 1));
    return quota && period ? cpusOf(*quota, *period) : std::nullopt;
}

CpuBudget usableCpus(const std::string &proc_root, const std::string &cgroup_root) {
    CpuBudget b;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        b.cpus = static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
        b.source = "affinity";
    } else {
        b.cpus = std::max(1u, std::thread::hardware_concurrency());
        b.source = "hardware_concurrency";
    }
    std::ifstream in(proc_root + "/self/cgroup");
    for (std::string line; std::getline(in, line);) {
        // id:controllers:path; cgroup v2 is "0::/path".
        const size_t a = line.find(':');
        const size_t c = a == std::string::npos ? a : line.find(':', a + 1);
        if (c == std::string::npos) {
            continue;
        }
        const std::string id = line.substr(0, a);
        const std::string controllers = line.substr(a + 1, c - a - 1);
        const std::string path = line.substr(c + 1);
        if (id == "0" && controllers.empty()) {
            lowerByV2(cgroup_root, path.empty() ? "/" : path, &b);
            continue;
        }
        std::stringstream names(controllers);
        for (std::string name; std::getline(names, name, ',');) {
            if (name != "cpu") {
                continue;
            }
            const std::string dir = cgroup_root + "/" + controllers + (path == "/" ? "" : path);
            const auto quota = readSmall(dir + "/cpu.cfs_quota_us");
            const auto period = readSmall(dir + "/cpu.cfs_period_us");
            const auto q = quota ? toInt(*quota) : std::nullopt;
            const auto p = period ? toInt(*period) : std::nullopt;
            if (auto n = q && p ? cpusOf(*q, *p) : std::nullopt; n && *n < b.cpus) {
                b.cpus = *n;
                b.source = "cgroup " + dir + "/cpu.cfs_quota_us " + *quota;
            }
        }
    }
    return b;
}

}  // namespace tensorlane::sidecar
