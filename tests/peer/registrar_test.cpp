// The verbs transport's registrar on the simulated HCA, without a GPU: a dma-buf fd the HCA can
// take is registered as one; one it refuses (EOPNOTSUPP) sends the job to the peermem path,
// the refusal is remembered so later jobs skip the dma-buf try, and the resolver's error (an
// IPC import that failed) ends the job with that error, never a crash or a hang.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "transport/verbs/registrar.hpp"

namespace {

using tensorlane::sidecar::Registrar;

class RegistrarTest : public ::testing::Test {
protected:
    void SetUp() override {
        (void)tensorlane::peertest::simTree();
        int n = 0;
        ibv_device **list = ibv_get_device_list(&n);
        if (list == nullptr || n == 0) {
            if (list != nullptr) {
                ibv_free_device_list(list);
            }
            GTEST_SKIP() << "needs the simulated HCA (LD_LIBRARY_PATH at tests/simhca; CTest "
                            "sets it)";
        }
        ctx_ = ibv_open_device(list[0]);
        ibv_free_device_list(list);
        ASSERT_NE(ctx_, nullptr);
        pd_ = std::shared_ptr<ibv_pd>(ibv_alloc_pd(ctx_), [](ibv_pd *p) { ibv_dealloc_pd(p); });
        ASSERT_TRUE(pd_);
        ASSERT_TRUE(reg_.start().isOk());
    }
    void TearDown() override {
        pd_.reset();
        if (ctx_ != nullptr) {
            ibv_close_device(ctx_);
        }
    }
    /// Submits `job` and waits for its result.
    Registrar::Result run(Registrar::Job job) {
        job.pd = pd_;
        job.id = ++next_;
        reg_.submit(std::move(job));
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < until) {
            for (auto &r : reg_.take()) {
                if (r.id == next_) {
                    return r;
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ADD_FAILURE() << "no result for job " << next_;
        return {};
    }
    static constexpr unsigned kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ibv_context *ctx_ = nullptr;
    std::shared_ptr<ibv_pd> pd_;
    Registrar reg_;
    uint64_t next_ = 0;
};

TEST_F(RegistrarTest, AMappableDmabufIsRegisteredAsOne) {
    const int fd = ::memfd_create("tl-dmabuf", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
    Registrar::Job job;
    job.dmabuf_fd = fd;
    job.length = 1 << 20;
    job.iova = 0x7f0000000000ull;
    job.access = kAccess;
    bool resolver_called = false;
    job.peermem_addr = [&](void **) {
        resolver_called = true;
        return EFAULT;
    };
    Registrar::Result r = run(job);
    ASSERT_NE(r.mr, nullptr) << std::strerror(r.error);
    EXPECT_TRUE(r.dmabuf);
    EXPECT_FALSE(resolver_called);
    EXPECT_EQ(reg_.dmabufSupported(), 1);
    EXPECT_FALSE(reg_.peermemUsed());
    EXPECT_EQ(ibv_dereg_mr(r.mr), 0);
    ::close(fd);
}

TEST_F(RegistrarTest, ARefusedDmabufFallsBackToPeermemAndTheRefusalIsRemembered) {
    // A pipe cannot be mmap(2)ed: the simulator refuses it as a dma-buf with EOPNOTSUPP, as a
    // host without dma-buf support would.
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    std::vector<uint8_t> mem(1 << 20, 0x11);
    int resolves = 0;
    auto job = [&] {
        Registrar::Job j;
        j.dmabuf_fd = pipefd[0];
        j.length = mem.size();
        // The iova keeps the address's page offset, or the kernel refuses it (EINVAL).
        j.iova = 0x7f0000100000ull + (reinterpret_cast<uint64_t>(mem.data()) &
                                      (static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) - 1));
        j.access = kAccess;
        j.peermem_addr = [&](void **addr) {
            ++resolves;
            *addr = mem.data();
            return 0;
        };
        return j;
    };
    Registrar::Result r1 = run(job());
    ASSERT_NE(r1.mr, nullptr) << std::strerror(r1.error);
    EXPECT_FALSE(r1.dmabuf);
    EXPECT_EQ(r1.mr->addr, mem.data());
    EXPECT_EQ(resolves, 1);
    EXPECT_EQ(reg_.dmabufSupported(), 0);
    EXPECT_TRUE(reg_.peermemUsed());
    // The second job goes straight to peermem (the probe happened once).
    Registrar::Result r2 = run(job());
    ASSERT_NE(r2.mr, nullptr);
    EXPECT_FALSE(r2.dmabuf);
    EXPECT_EQ(resolves, 2);
    EXPECT_EQ(ibv_dereg_mr(r1.mr), 0);
    EXPECT_EQ(ibv_dereg_mr(r2.mr), 0);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
}

TEST_F(RegistrarTest, AFailedImportEndsTheJobWithItsError) {
    Registrar::Job j;
    j.length = 4096;
    j.iova = 0x7f0000200000ull;
    j.access = kAccess;
    j.peermem_addr = [](void **) { return EFAULT; };
    Registrar::Result r = run(j);
    EXPECT_EQ(r.mr, nullptr);
    EXPECT_EQ(r.error, EFAULT);
    // A job with neither an fd nor an address nor a resolver is refused, not registered at 0.
    Registrar::Job empty;
    empty.length = 4096;
    empty.access = kAccess;
    Registrar::Result e = run(empty);
    EXPECT_EQ(e.mr, nullptr);
    EXPECT_EQ(e.error, EINVAL);
}

}  // namespace
