// How many CPUs this process may use: its affinity mask, lowered by a CPU quota of its cgroup
// (cgroup v2 cpu.max, v1 cpu.cfs_quota_us), as a container's CPU limit is. Chooses the poll
// mode ([ipc] poll_mode = "auto") and the tag workers ([tcp] tag_threads = "auto").
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tensorlane::sidecar {

struct CpuBudget {
    unsigned cpus = 1;
    /// Where the count comes from: "affinity", or the cgroup file and its quota.
    std::string source;
};

/// The CPUs of a quota given as cgroup v2's cpu.max text ("200000 100000" -> 2, "150000
/// 100000" -> 2, rounded up); nullopt for "max ..." (no quota) or text that is not a quota.
std::optional<unsigned> cpusOfQuota(std::string_view cpu_max);

/// This process's budget. `proc_root` and `cgroup_root` are "/proc" and "/sys/fs/cgroup" but
/// for tests; files that cannot be read leave the affinity count alone. Never throws.
CpuBudget usableCpus(const std::string &proc_root = "/proc",
                     const std::string &cgroup_root = "/sys/fs/cgroup");

}  // namespace tensorlane::sidecar
