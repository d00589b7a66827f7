// GPU tier: a worker killed with GPU regions registered (imported by the sidecar for a local
// copy, with their dma-buf fds): the sidecar drops its imports and fds, and the GPU memory in
// use returns to its earlier level. A forgotten import or fd would keep the worker's memory
// alive after its death. The second case kills the worker while it keeps small GPU writes in
// flight (queued by the sidecar's engine thread on its own streams): the copies still running
// then hold the imports until they finish, and nothing is released under them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../sidecar/harness.hpp"
#include "../sidecar/status_json.hpp"
#include "gpu_support.hpp"
#include "tensorlane/tensorlane.h"

#ifdef TENSORLANE_HAVE_CUDA

namespace {

using tlgpu::Cuda;

constexpr uint64_t kHeld = uint64_t{2} << 30;  // what the worker holds

TL_GPU_WORKER(hold_gpu) {
    // args: socket, ready file[, "write"]. Registers two pieces of a 2 GiB allocation, copies
    // one into the other through the sidecar (so the sidecar imports it), says it is ready, and
    // waits to be killed; with "write", writing 4 KiB pieces 16 at a time until then.
    Cuda cuda;
    if (!cuda.open()) {
        std::fprintf(stderr, "worker: %s\n", cuda.why.c_str());
        return 2;
    }
    CUdeviceptr block = 0;
    tl_client *c = nullptr;
    tl_region a = 0, b = 0;
    tl_remote rb = 0;
    tl_ticket t = 0;
    const uint64_t half = kHeld / 2;
    if (cuda.cuMemAlloc(&block, kHeld) != CUDA_SUCCESS ||
        cuda.fill(block, half / 4, 1) != CUDA_SUCCESS || cuda.cuCtxSynchronize() != CUDA_SUCCESS ||
        tl_connect(args[0].c_str(), &c) != TL_OK ||
        tl_register(c, reinterpret_cast<void *>(block), half, &a) != TL_OK ||
        tl_register(c, reinterpret_cast<void *>(block + half), half, &b) != TL_OK ||
        tl_expose(c, b, "held") != TL_OK || tl_lookup(c, "node-a", "held", &rb, nullptr) != TL_OK ||
        tl_write(c, a, 0, rb, 0, 64 << 20, 1, &t) != TL_OK || tl_wait(c, t, 30000) != TL_OK) {
        std::fprintf(stderr, "worker: %s\n", tl_last_error());
        return 3;
    }
    const int fd = ::open(args[1].c_str(), O_WRONLY | O_CREAT, 0644);
    ::close(fd);
    const bool writing = args.size() > 2 && args[2] == "write";
    for (uint32_t imm = 2; writing; imm += 16) {
        tl_ticket ts[16];
        for (uint32_t k = 0; k < 16; ++k) {
            if (tl_write(c, a, k * 4096, rb, k * 4096, 4096, imm + k, &ts[k]) != TL_OK) {
                std::fprintf(stderr, "worker: write: %s\n", tl_last_error());
                return 4;
            }
        }
        for (tl_ticket t16 : ts) {
            if (tl_wait(c, t16, 30000) != TL_OK) {
                std::fprintf(stderr, "worker: wait: %s\n", tl_last_error());
                return 5;
            }
        }
        tl_notification n{};
        while (tl_wait_notification(c, &n, 0) == TL_OK) {
        }
    }
    for (;;) {
        ::pause();
    }
}

uint64_t importsOpen(tl_client *c) {
    std::string buf(1 << 16, '\0');
    size_t len = 0;
    if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
        return UINT64_MAX;
    }
    const auto at = buf.find("\"imports_open\":");
    return at == std::string::npos ? UINT64_MAX : std::stoull(buf.substr(at + 15));
}

/// Starts a worker holding 2 GiB (writing small pieces of it through the sidecar or idle),
/// kills it, and checks that the sidecar lets go of everything and still serves the next client.
void killedWorkerLetsGo(bool writing) {
    Cuda cuda;
    if (!cuda.open()) {
        GTEST_SKIP() << cuda.why;
    }
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK);
    {
        // Warm the sidecar first (its CUDA context and streams), so that what it keeps of its
        // own is in the baseline.
        CUdeviceptr buf = 0;
        ASSERT_EQ(cuda.cuMemAlloc(&buf, 2 << 20), CUDA_SUCCESS);
        tl_region x = 0, y = 0;
        tl_remote ry = 0;
        tl_ticket t = 0;
        ASSERT_EQ(tl_register(c, reinterpret_cast<void *>(buf), 1 << 20, &x), TL_OK)
            << tl_last_error();
        ASSERT_EQ(tl_register(c, reinterpret_cast<void *>(buf + (1 << 20)), 1 << 20, &y), TL_OK);
        ASSERT_EQ(tl_expose(c, y, "warm"), TL_OK);
        ASSERT_EQ(tl_lookup(c, "node-a", "warm", &ry, nullptr), TL_OK);
        ASSERT_EQ(tl_write(c, x, 0, ry, 0, 1 << 20, 1, &t), TL_OK);
        ASSERT_EQ(tl_wait(c, t, 30000), TL_OK) << tl_last_error() << sc.log().substr(0, 4000);
        tl_notification n{};
        ASSERT_EQ(tl_wait_notification(c, &n, 5000), TL_OK);
        ASSERT_EQ(tl_deregister(c, x), TL_OK);
        ASSERT_EQ(tl_deregister(c, y), TL_OK);
        cuda.cuMemFree(buf);
    }
    ASSERT_TRUE(tlgpu::waitFor([&] { return importsOpen(c) == 0; })) << importsOpen(c);
    const uint64_t baseline = cuda.freeBytes();
    const int fds_before = sc.openFds();

    tltest::TempDir dir;
    const std::string ready = dir.file("ready");
    std::vector<std::string> args{sc.socket(), ready};
    if (writing) {
        args.emplace_back("write");
    }
    pid_t worker = tlgpu::spawnWorker("hold_gpu", args);
    ASSERT_TRUE(tlgpu::waitFor([&] { return ::access(ready.c_str(), F_OK) == 0; },
                               std::chrono::seconds(60)))
        << "the worker did not get ready; sidecar log:\n"
        << sc.log().substr(0, 6000);
    const uint64_t held = cuda.freeBytes();
    EXPECT_LT(held + (kHeld - (256 << 20)), baseline) << "the worker's memory is not in use?";
    EXPECT_GE(importsOpen(c), 1u);
    if (writing) {
        // Killed in the middle of its writes: let some run first.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        EXPECT_GT(tltest::sidecarStatus(c)["counters"]["writes_local_gpu_inline"].get<uint64_t>(),
                  16u);
    }

    ::kill(worker, SIGKILL);
    EXPECT_EQ(tlgpu::waitWorker(worker), 128 + SIGKILL);
    // The sidecar sees the hang-up, releases the regions, closes the import (on its release
    // thread) and the dma-buf fd; the driver then frees the dead worker's memory.
    const bool back = tlgpu::waitFor([&] { return cuda.freeBytes() + (64 << 20) >= baseline; },
                                     std::chrono::seconds(20));
    EXPECT_TRUE(back) << "free " << cuda.freeBytes() << " bytes, before the worker " << baseline
                      << ", while it lived " << held << "\n"
                      << sc.log().substr(0, 6000);
    EXPECT_TRUE(tlgpu::waitFor([&] { return importsOpen(c) == 0; })) << importsOpen(c);
    EXPECT_TRUE(tlgpu::waitFor([&] { return sc.openFds() <= fds_before; }))
        << sc.openFds() << " fds, " << fds_before << " before the worker";
    // And it still copies for the client that is left, small writes the engine thread's way.
    CUdeviceptr buf = 0;
    ASSERT_EQ(cuda.cuMemAlloc(&buf, 2 << 20), CUDA_SUCCESS);
    ASSERT_EQ(cuda.fill(buf, (1 << 20) / 4, 9), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
    tl_region x = 0, y = 0;
    tl_remote ry = 0;
    ASSERT_EQ(tl_register(c, reinterpret_cast<void *>(buf), 1 << 20, &x), TL_OK);
    ASSERT_EQ(tl_register(c, reinterpret_cast<void *>(buf + (1 << 20)), 1 << 20, &y), TL_OK);
    ASSERT_EQ(tl_expose(c, y, "after"), TL_OK);
    ASSERT_EQ(tl_lookup(c, "node-a", "after", &ry, nullptr), TL_OK);
    for (uint64_t bytes : {uint64_t{1} << 20, uint64_t{4096}}) {
        tl_ticket t = 0;
        ASSERT_EQ(tl_write(c, x, 0, ry, 0, bytes, 3, &t), TL_OK);
        ASSERT_EQ(tl_wait(c, t, 30000), TL_OK) << tl_last_error();
    }
    EXPECT_EQ(cuda.mismatches(buf + (1 << 20), (1 << 20) / 4, 9), 0u);
    EXPECT_TRUE(sc.alive());
    cuda.cuMemFree(buf);
    tl_disconnect(c);
}

TEST(CudaRelease, AKilledWorkerLeavesNoImportNorFdAndItsGpuMemoryComesBack) {
    killedWorkerLetsGo(false);
}

TEST(CudaRelease, AWorkerKilledWithSmallGpuWritesInFlightLeavesNothingBehind) {
    killedWorkerLetsGo(true);
}

// NCCL closes one communicator's buffers while another's kernel still waits for its proxy's
// next send. Deregistering a pinned tl_alloc_host buffer unpins it (cuMemHostUnregister), which
// waits for the process's running kernels; the shim once did that with its region table
// locked, so the write the kernel waited for could not even be checked: a deadlock (seen with
// the NCCL plugin without MPS). The write must go through while the deregistration waits.
TEST(CudaRelease, AWriteGoesThroughWhileADeregistrationWaitsForAKernel) {
    Cuda cuda;
    if (!cuda.open()) {
        GTEST_SKIP() << cuda.why;
    }
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK);
    void *src = nullptr, *dst = nullptr, *doomed = nullptr;
    tl_region rs = 0, rd = 0, rx = 0;
    tl_remote to = 0;
    ASSERT_EQ(tl_alloc_host(c, 1 << 16, &src, &rs), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_alloc_host(c, 1 << 16, &dst, &rd), TL_OK);
    ASSERT_EQ(tl_alloc_host(c, 1 << 20, &doomed, &rx), TL_OK);
    ASSERT_EQ(tl_expose(c, rd, "dst"), TL_OK);
    ASSERT_EQ(tl_lookup(c, "node-a", "dst", &to, nullptr), TL_OK);
    std::memset(src, 0x5a, 1 << 16);

    void *host = nullptr;  // [0] the flag the kernel waits for, [1] its timed-out mark
    ASSERT_EQ(cuda.cuMemAllocHost(&host, 8), CUDA_SUCCESS);
    auto *words = static_cast<volatile unsigned *>(host);
    words[0] = 0;
    words[1] = 0;
    CUstream stream = nullptr;
    ASSERT_EQ(cuda.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(cuda.waitFlag(static_cast<unsigned *>(host), 20'000'000'000ull,
                            static_cast<unsigned *>(host) + 1, stream),
              CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuStreamQuery(stream), CUDA_ERROR_NOT_READY) << "the kernel did not start";

    std::atomic<bool> deregistered{false};
    tl_status dereg = TL_OK;
    std::thread t([&] {
        dereg = tl_deregister(c, rx);
        deregistered = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // into the unpin
    const bool waited = !deregistered.load();

    tl_ticket ticket = 0;
    ASSERT_EQ(tl_write(c, rs, 0, to, 0, 1 << 16, 7, &ticket), TL_OK) << tl_last_error();
    const tl_status s = tl_wait(c, ticket, 10000);
    const bool kernel_running = cuda.cuStreamQuery(stream) == CUDA_ERROR_NOT_READY;
    words[0] = 1;  // the kernel's "proxy" answered: it ends, the unpin ends
    EXPECT_EQ(cuda.cuStreamSynchronize(stream), CUDA_SUCCESS);
    t.join();
    EXPECT_EQ(s, TL_OK) << "the write waited for the deregistration: " << tl_last_error();
    EXPECT_TRUE(kernel_running) << "the write ended only after the kernel's 20 s timeout";
    EXPECT_EQ(words[1], 0u) << "the kernel timed out";
    EXPECT_EQ(dereg, TL_OK) << tl_last_error();
    EXPECT_EQ(std::memcmp(src, dst, 1 << 16), 0);
    if (!waited) {
        std::printf(
            "note: this driver's cuMemHostUnregister did not wait for the running "
            "kernel, so the deadlock could not arise here\n");
    }
    cuda.cuStreamDestroy(stream);
    cuda.cuMemFreeHost(host);
    tl_disconnect(c);
}

}  // namespace

#endif
