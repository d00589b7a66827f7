// How much memory this process may use: /proc/meminfo and the memory cgroup it runs in (v2 or
// v1). Segments handed to clients are charged to the sidecar's cgroup (it backs them with
// posix_fallocate), so this bounds what all clients together may hold without the OOM killer.
//
// Every read is below one root directory: "/" on a host, a fixture tree in tests, or
// $TENSORLANE_MEMORY_ROOT. The layout is the kernel's:
//   proc/self/cgroup         "0::/a/b" (v2), "4:memory:/a/b" (v1; controllers comma-separated)
//   proc/meminfo             "MemTotal:  N kB", "MemAvailable:  N kB"
//   sys/fs/cgroup/<path>/{memory.max,memory.current}                         (v2)
//   sys/fs/cgroup/memory/<path>/{memory.limit_in_bytes,memory.usage_in_bytes}   (v1)
// A cgroup path that is not below the mount (a container without a cgroup namespace sees its
// own cgroup at the mount's root) is read at the mount's root.
#pragma once

#include <cstdint>
#include <string>

namespace tensorlane::ipc {

/// The tightest memory limit of a cgroup and its ancestors up to the mount's root.
struct CgroupMemory {
    int version = 0;              ///< 2 or 1; 0 when no limit was found (none, or unlimited)
    std::string dir;              ///< the cgroup directory that sets it, below the root
    uint64_t limit = UINT64_MAX;  ///< bytes; UINT64_MAX: unlimited
    uint64_t usage = 0;           ///< bytes that cgroup uses now
    /// Bytes still free under the limit; UINT64_MAX when unlimited.
    uint64_t room() const {
        return limit == UINT64_MAX ? UINT64_MAX : limit > usage ? limit - usage : 0;
    }
};

/// The environment variable that replaces "/" for these reads.
inline constexpr const char *kMemoryRootEnv = "TENSORLANE_MEMORY_ROOT";

/// $TENSORLANE_MEMORY_ROOT when set and not empty, else "/".
std::string memoryRoot();

/// The memory cgroup of this process below `root`: v2 where a memory.max is set, else v1.
CgroupMemory readCgroupMemory(const std::string &root);

/// One "Key:   N kB" line of `root`/proc/meminfo, in bytes; 0 when missing.
uint64_t readMeminfo(const std::string &root, const char *key);

/// The most memory this process may use: MemTotal, or less when its cgroup's limit is lower.
/// UINT64_MAX when neither is known.
uint64_t memoryBudget(const std::string &root);

}  // namespace tensorlane::ipc
