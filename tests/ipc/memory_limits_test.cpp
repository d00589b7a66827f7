// The memory readers on fixture trees: cgroup v2, v1, a hybrid host, none at all, a container
// whose cgroup path is not below the mount, and MemTotal against a cgroup limit.
#include "tensorlane/ipc/memory_limits.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace ipc = tensorlane::ipc;
namespace fs = std::filesystem;

namespace {

/// A fixture root under /tmp, removed at destruction.
class Tree {
public:
    Tree() {
        char tmpl[] = "/tmp/tl-memtree-XXXXXX";
        root_ = ::mkdtemp(tmpl);
    }
    ~Tree() {
        std::error_code ec;
        fs::remove_all(root_, ec);
    }
    /// Writes `text` to `rel`, creating its directories.
    void put(const std::string &rel, const std::string &text) const {
        const fs::path p = fs::path(root_) / rel;
        fs::create_directories(p.parent_path());
        std::ofstream(p) << text;
    }
    void dir(const std::string &rel) const { fs::create_directories(fs::path(root_) / rel); }
    const std::string &root() const { return root_; }

private:
    std::string root_;
};

constexpr uint64_t kMiB = uint64_t{1} << 20;

}  // namespace

TEST(CgroupMemory, V2OwnLimit) {
    Tree t;
    t.put("proc/self/cgroup", "0::/job.slice/run-1.scope\n");
    t.put("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
    t.put("sys/fs/cgroup/job.slice/run-1.scope/memory.max", "268435456\n");
    t.put("sys/fs/cgroup/job.slice/run-1.scope/memory.current", "67108864\n");
    const ipc::CgroupMemory m = ipc::readCgroupMemory(t.root());
    EXPECT_EQ(m.version, 2);
    EXPECT_EQ(m.limit, 256 * kMiB);
    EXPECT_EQ(m.usage, 64 * kMiB);
    EXPECT_EQ(m.room(), 192 * kMiB);
    EXPECT_EQ(m.dir, "sys/fs/cgroup/job.slice/run-1.scope");
}

TEST(CgroupMemory, V2AncestorWithLessRoomWins) {
    Tree t;
    t.put("proc/self/cgroup", "0::/a/b\n");
    t.put("sys/fs/cgroup/a/b/memory.max", "max\n");
    t.put("sys/fs/cgroup/a/b/memory.current", "1000\n");
    t.put("sys/fs/cgroup/a/memory.max", "134217728\n");
    t.put("sys/fs/cgroup/a/memory.current", "33554432\n");
    const ipc::CgroupMemory m = ipc::readCgroupMemory(t.root());
    EXPECT_EQ(m.version, 2);
    EXPECT_EQ(m.limit, 128 * kMiB);
    EXPECT_EQ(m.room(), 96 * kMiB);
    EXPECT_EQ(m.dir, "sys/fs/cgroup/a");
}

TEST(CgroupMemory, V2UnlimitedEverywhereIsNoLimit) {
    Tree t;
    t.put("proc/self/cgroup", "0::/a\n");
    t.put("sys/fs/cgroup/a/memory.max", "max\n");
    t.put("sys/fs/cgroup/a/memory.current", "5\n");
    const ipc::CgroupMemory m = ipc::readCgroupMemory(t.root());
    EXPECT_EQ(m.version, 0);
    EXPECT_EQ(m.limit, UINT64_MAX);
    EXPECT_EQ(m.room(), UINT64_MAX);
}

TEST(CgroupMemory, V1LimitAndUnlimitedValue) {
    Tree t;
    t.put("proc/self/cgroup",
          "12:pids:/docker/abc\n7:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n");
    t.put("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "536870912\n");
    t.put("sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "134217728\n");
    // The parent is unlimited in v1's way: the largest page-aligned counter.
    t.put("sys/fs/cgroup/memory/docker/memory.limit_in_bytes", "9223372036854771712\n");
    t.put("sys/fs/cgroup/memory/docker/memory.usage_in_bytes", "999999999\n");
    t.put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    const ipc::CgroupMemory m = ipc::readCgroupMemory(t.root());
    EXPECT_EQ(m.version, 1);
    EXPECT_EQ(m.limit, 512 * kMiB);
    EXPECT_EQ(m.usage, 128 * kMiB);
    EXPECT_EQ(m.dir, "sys/fs/cgroup/memory/docker/abc");
}

TEST(CgroupMemory, V1MemoryAmongOtherControllers) {
    Tree t;
    t.put("proc/self/cgroup", "4:cpu,memory:/x\n");
    t.put("sys/fs/cgroup/memory/x/memory.limit_in_bytes", "1048576\n");
    t.put("sys/fs/cgroup/memory/x/memory.usage_in_bytes", "0\n");
    EXPECT_EQ(ipc::readCgroupMemory(t.root()).limit, kMiB);
}

TEST(CgroupMemory, HybridHostReadsTheV1Controller) {
    // systemd's hybrid layout: a v2 line (and unified tree) without the memory controller.
    Tree t;
    t.put("proc/self/cgroup", "0::/user.slice\n9:memory:/user.slice\n");
    t.dir("sys/fs/cgroup/user.slice");
    t.put("sys/fs/cgroup/memory/user.slice/memory.limit_in_bytes", "2097152\n");
    t.put("sys/fs/cgroup/memory/user.slice/memory.usage_in_bytes", "1048576\n");
    const ipc::CgroupMemory m = ipc::readCgroupMemory(t.root());
    EXPECT_EQ(m.version, 1);
    EXPECT_EQ(m.room(), kMiB);
}

TEST(CgroupMemory, ContainerWithoutCgroupNamespaceReadsTheMountRoot) {
    // /proc/self/cgroup names the host's path; the container's mount shows its own cgroup.
    Tree t;
    t.put("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    t.put("sys/fs/cgroup/memory.max", "67108864\n");
    t.put("sys/fs/cgroup/memory.current", "0\n");
    const ipc::CgroupMemory m = ipc::readCgroupMemory(t.root());
    EXPECT_EQ(m.version, 2);
    EXPECT_EQ(m.limit, 64 * kMiB);
    EXPECT_EQ(m.dir, "sys/fs/cgroup");
}

TEST(CgroupMemory, NoneAtAll) {
    Tree t;
    EXPECT_EQ(ipc::readCgroupMemory(t.root()).version, 0);
    t.put("proc/self/cgroup", "0::/\n");  // a v2 root: no memory.max there
    t.dir("sys/fs/cgroup");
    EXPECT_EQ(ipc::readCgroupMemory(t.root()).limit, UINT64_MAX);
    t.put("proc/self/cgroup", "garbage\n:::\n7:memory\n");
    EXPECT_EQ(ipc::readCgroupMemory(t.root()).version, 0);
}

TEST(CgroupMemory, GarbageInTheFilesIsNoLimit) {
    Tree t;
    t.put("proc/self/cgroup", "7:memory:/x\n");
    t.put("sys/fs/cgroup/memory/x/memory.limit_in_bytes", "-5\n");
    EXPECT_EQ(ipc::readCgroupMemory(t.root()).version, 0);
    t.put("sys/fs/cgroup/memory/x/memory.limit_in_bytes", "12abc\n");
    EXPECT_EQ(ipc::readCgroupMemory(t.root()).version, 0);
    t.put("sys/fs/cgroup/memory/x/memory.limit_in_bytes", "99999999999999999999999\n");
    EXPECT_EQ(ipc::readCgroupMemory(t.root()).version, 0);
}

TEST(MemoryBudget, TheLesserOfMemTotalAndTheCgroupLimit) {
    Tree t;
    t.put("proc/meminfo", "MemTotal:        1048576 kB\nMemAvailable:     524288 kB\n");
    EXPECT_EQ(ipc::readMeminfo(t.root(), "MemTotal"), 1024 * kMiB);
    EXPECT_EQ(ipc::readMeminfo(t.root(), "MemAvailable"), 512 * kMiB);
    EXPECT_EQ(ipc::readMeminfo(t.root(), "MemFree"), 0u);
    EXPECT_EQ(ipc::memoryBudget(t.root()), 1024 * kMiB);  // no cgroup
    t.put("proc/self/cgroup", "0::/a\n");
    t.put("sys/fs/cgroup/a/memory.max", "268435456\n");
    t.put("sys/fs/cgroup/a/memory.current", "0\n");
    EXPECT_EQ(ipc::memoryBudget(t.root()), 256 * kMiB);
    t.put("sys/fs/cgroup/a/memory.max", "4294967296\n");  // more than the machine
    EXPECT_EQ(ipc::memoryBudget(t.root()), 1024 * kMiB);
}

TEST(MemoryRoot, FromTheEnvironment) {
    ::unsetenv(ipc::kMemoryRootEnv);
    EXPECT_EQ(ipc::memoryRoot(), "/");
    ::setenv(ipc::kMemoryRootEnv, "/fixture", 1);
    EXPECT_EQ(ipc::memoryRoot(), "/fixture");
    ::setenv(ipc::kMemoryRootEnv, "", 1);
    EXPECT_EQ(ipc::memoryRoot(), "/");
    ::unsetenv(ipc::kMemoryRootEnv);
}
