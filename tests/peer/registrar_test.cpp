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

#include "cuda/import.hpp"
#include "harness.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "transport/verbs/mr_cache.hpp"
#include "transport/verbs/registrar.hpp"

namespace {

using tensorlane::sidecar::CudaImport;
using tensorlane::sidecar::MemoryKind;
using tensorlane::sidecar::MrCache;
using tensorlane::sidecar::MrView;
using tensorlane::sidecar::Region;
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

/// A CUDA region as RegionLifecycle::addCuda makes one: the client's claimed address, the
/// sidecar's import of the allocation (no dma-buf fd; nothing is imported until a registration
/// asks).
std::shared_ptr<Region> cudaRegion(uint64_t id, uint64_t client_address,
                                   const std::shared_ptr<CudaImport> &imp) {
    auto r = std::make_shared<Region>();
    r->id = id;
    r->kind = MemoryKind::kCuda;
    r->bytes = 4096;
    r->cuda.alloc_bytes = 1u << 20;
    r->cuda.alloc_offset = 0;
    r->cuda.client_address = client_address;
    r->cuda.import = imp;
    return r;
}

// Two clients claim the same device address for their own allocations: each gets an MR of its
// own memory (the cache is keyed by the sidecar's import, not by the address a client sent), and
// a second range of one allocation shares that allocation's entry.
TEST_F(RegistrarTest, MrCacheKeysAllocationsByTheSidecarsImportNotTheClientsAddress) {
    MrCache cache(pd_, reg_, MrCache::Scope::kAllocation);
    auto mine =
        std::make_shared<CudaImport>(tensorlane::sidecar::CudaIpcHandle{}, 0, 1u << 20, nullptr, 0);
    auto theirs =
        std::make_shared<CudaImport>(tensorlane::sidecar::CudaIpcHandle{}, 0, 1u << 20, nullptr, 0);
    const uint64_t claimed = 0x7f0000000000;
    auto a = cudaRegion(1, claimed, mine);
    auto b = cudaRegion(2, claimed, theirs);
    auto a2 = cudaRegion(3, claimed + 8192, mine);
    a2->cuda.alloc_offset = 8192;
    EXPECT_NE(MrCache::keyOf(*a, 0, MrCache::Scope::kAllocation),
              MrCache::keyOf(*b, 0, MrCache::Scope::kAllocation));
    std::string error;
    (void)cache.get(*a, 0, &error);
    (void)cache.get(*b, 0, &error);
    EXPECT_EQ(cache.size(), 2u) << "another client's allocation shares this one's MR";
    (void)cache.get(*a2, 0, &error);
    EXPECT_EQ(cache.size(), 2u);
    // The entry goes with the last region that used it.
    cache.release(a->id);
    EXPECT_EQ(cache.size(), 2u);
    cache.release(a2->id);
    cache.release(b->id);
    EXPECT_EQ(cache.size(), 0u);
}

// A range exposed to a peer gets an MR on exactly its bytes; the sending side's MR for it covers
// the whole buffer (local keys), shared with the buffer's other ranges.
TEST_F(RegistrarTest, MrCacheRegistersAnExposedRangeAloneAndSourcesByTheirSegment) {
    auto buffer = tensorlane::peertest::makeHostRegion(3 * 4096);
    buffer->id = 10;
    auto range = std::make_shared<Region>();
    range->id = 11;
    range->parent = buffer->id;
    range->base = buffer->base + 4096;
    range->bytes = 4096 + 100;
    range->mapping = buffer->mapping;
    // Each in a protection domain of its own, as a receiving and a sending session are.
    std::shared_ptr<ibv_pd> other(ibv_alloc_pd(ctx_), [](ibv_pd *p) { ibv_dealloc_pd(p); });
    ASSERT_TRUE(other);
    MrCache exposed(pd_, reg_, MrCache::Scope::kRegion);
    MrCache sources(other, reg_, MrCache::Scope::kAllocation);
    const auto registered = [&](MrCache &cache, const Region &r) {
        std::string error;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < until) {
            const MrView v = cache.get(r, kAccess, &error);
            if (v.mr != nullptr || !error.empty()) {
                return v;
            }
            for (auto &res : reg_.take()) {
                (void)(exposed.complete(res) || sources.complete(res));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ADD_FAILURE() << "no MR for region " << r.id << ": " << error;
        return MrView{};
    };
    const MrView v = registered(exposed, *range);
    ASSERT_NE(v.mr, nullptr);
    EXPECT_EQ(v.addr, reinterpret_cast<uint64_t>(range->base));
    EXPECT_EQ(v.mr->addr, range->base);
    EXPECT_EQ(v.mr->length, range->bytes) << "the peer's key covers more than the range";
    const MrView whole = registered(exposed, *buffer);
    ASSERT_NE(whole.mr, nullptr);
    EXPECT_NE(whole.mr, v.mr);
    EXPECT_EQ(exposed.size(), 2u);
    const MrView s1 = registered(sources, *range);
    const MrView s2 = registered(sources, *buffer);
    ASSERT_NE(s1.mr, nullptr);
    EXPECT_EQ(s1.mr, s2.mr);
    EXPECT_GE(s1.mr->length, 3u * 4096);
    EXPECT_EQ(s1.addr, reinterpret_cast<uint64_t>(range->base));
    exposed.release(range->id);
    EXPECT_EQ(exposed.size(), 1u);
}

}  // namespace
