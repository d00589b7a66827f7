// GPU tier: the stream-ordered calls. tl_write_on_stream starts after the kernel queued before
// it (the receiver sees the kernel's values); tl_stream_wait_notification holds a kernel until
// the data is there, in a stream and in a CUDA graph replayed twice; a write that fails still
// releases the stream waiting for it; a sidecar that dies releases the streams waiting on it.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "../sidecar/harness.hpp"
#include "gpu_support.hpp"
#include "tensorlane/tensorlane.h"

#ifdef TENSORLANE_HAVE_CUDA

namespace {

using tlgpu::Cuda;

constexpr int kStreamWaitMs = 30000;
constexpr uint64_t kBytes = 4 << 20;
constexpr uint64_t kWords = kBytes / 4;

/// Two clients of one sidecar with a GPU buffer each: `src` of the writer, `dst` of the
/// receiver (exposed as "dst", looked up by the writer).
class CudaStreams : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cuda.open()) {
            GTEST_SKIP() << cuda.why;
        }
        sc = std::make_unique<tltest::Sidecar>();
        ASSERT_TRUE(sc->ready()) << sc->log();
        ASSERT_EQ(tl_connect(sc->socket().c_str(), &w), TL_OK);
        ASSERT_EQ(tl_connect(sc->socket().c_str(), &r), TL_OK);
        ASSERT_EQ(cuda.cuMemAlloc(&src_block, kBytes + 65536), CUDA_SUCCESS);
        ASSERT_EQ(cuda.cuMemAlloc(&dst_block, kBytes + 65536), CUDA_SUCCESS);
        ASSERT_EQ(cuda.cuMemAlloc(&bad, 8), CUDA_SUCCESS);
        src = src_block + 4096;
        dst = dst_block + 8192;
        ASSERT_EQ(cuda.fill(src, kWords, 1), CUDA_SUCCESS);
        ASSERT_EQ(cuda.fill(dst, kWords, 2), CUDA_SUCCESS);
        ASSERT_EQ(cuda.cuMemsetD32(bad, 0, 2), CUDA_SUCCESS);
        ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
        ASSERT_EQ(tl_register(w, reinterpret_cast<void *>(src), kBytes, &rs), TL_OK)
            << tl_last_error();
        ASSERT_EQ(tl_register(r, reinterpret_cast<void *>(dst), kBytes, &rd), TL_OK)
            << tl_last_error();
        ASSERT_EQ(tl_expose(r, rd, "dst"), TL_OK);
        ASSERT_EQ(tl_lookup(w, "node-a", "dst", &remote, nullptr), TL_OK) << tl_last_error();
        ASSERT_EQ(cuda.cuStreamCreate(&ws, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        ASSERT_EQ(cuda.cuStreamCreate(&rstream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    }
    void TearDown() override {
        if (ws != nullptr) {
            cuda.cuStreamSynchronize(ws);
            cuda.cuStreamSynchronize(rstream);
        }
        tl_disconnect(w);
        tl_disconnect(r);
        if (src_block != 0) {
            cuda.cuMemFree(src_block);
            cuda.cuMemFree(dst_block);
            cuda.cuMemFree(bad);
        }
    }
    /// Waits (bounded) for an event: true once it has completed.
    bool eventDone(CUevent ev, std::chrono::milliseconds timeout) {
        return tlgpu::waitFor([&] { return cuda.cuEventQuery(ev) != CUDA_ERROR_NOT_READY; },
                              timeout) &&
               cuda.cuEventQuery(ev) == CUDA_SUCCESS;
    }
    uint64_t badCount() {
        uint64_t v = UINT64_MAX;
        cuda.cuMemcpyDtoH(&v, bad, 8);
        return v;
    }

    Cuda cuda;
    std::unique_ptr<tltest::Sidecar> sc;
    tl_client *w = nullptr, *r = nullptr;
    CUdeviceptr src_block = 0, dst_block = 0, src = 0, dst = 0, bad = 0;
    tl_region rs = 0, rd = 0;
    tl_remote remote = 0;
    CUstream ws = nullptr, rstream = nullptr;
};

TEST_F(CudaStreams, WriteOnStreamStartsAfterTheKernelBeforeIt) {
    // The kernel writes seed 3 after 300 ms; a write that did not wait for it would carry the
    // seed-1 words that are there now.
    ASSERT_EQ(cuda.spinFill(src, kWords, 3, 300'000'000ull, ws), CUDA_SUCCESS);
    tl_ticket t = 0;
    const auto before = std::chrono::steady_clock::now();
    ASSERT_EQ(tl_write_on_stream(w, rs, 0, remote, 0, kBytes, 9, ws, &t), TL_OK) << tl_last_error();
    // It did not block the caller on the GPU.
    EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(100));
    EXPECT_EQ(cuda.cuStreamQuery(ws), CUDA_ERROR_NOT_READY);
    ASSERT_EQ(tl_stream_wait_ticket(w, t, ws), TL_OK) << tl_last_error();
    CUevent after = nullptr;
    ASSERT_EQ(cuda.cuEventCreate(&after, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuEventRecord(after, ws), CUDA_SUCCESS);
    ASSERT_EQ(tl_wait(w, t, kStreamWaitMs), TL_OK) << tl_last_error() << sc->log().substr(0, 4000);
    EXPECT_TRUE(eventDone(after, std::chrono::seconds(10)));
    tl_notification n{};
    ASSERT_EQ(tl_wait_notification(r, &n, kStreamWaitMs), TL_OK);
    EXPECT_EQ(n.imm, 9u);
    EXPECT_EQ(cuda.mismatches(dst, kWords, 3), 0u) << "the write did not see the kernel's words";
    cuda.cuEventDestroy(after);
}

TEST_F(CudaStreams, WaitNotificationHoldsTheKernelUntilTheDataIsThere) {
    ASSERT_EQ(tl_stream_wait_notification(r, rd, 42, rstream), TL_OK) << tl_last_error();
    ASSERT_EQ(cuda.check(dst, kWords, 4, bad, rstream), CUDA_SUCCESS);
    CUevent done = nullptr;
    ASSERT_EQ(cuda.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuEventRecord(done, rstream), CUDA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(cuda.cuEventQuery(done), CUDA_ERROR_NOT_READY) << "the kernel ran before the data";
    // On the writer's stream: a context-wide synchronise would wait for rstream, which waits
    // for this very write.
    ASSERT_EQ(cuda.fill(src, kWords, 4, ws), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuStreamSynchronize(ws), CUDA_SUCCESS);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(w, rs, 0, remote, 0, kBytes, 42, &t), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_wait(w, t, kStreamWaitMs), TL_OK) << tl_last_error();
    ASSERT_TRUE(eventDone(done, std::chrono::seconds(10))) << sc->log().substr(0, 4000);
    EXPECT_EQ(badCount(), 0u);
    // The notification went to the stream, not to the host queue.
    tl_notification n{};
    EXPECT_EQ(tl_wait_notification(r, &n, 100), TL_ETIMEDOUT);
    cuda.cuEventDestroy(done);
}

TEST_F(CudaStreams, AWaitAfterTheDataArrivedPassesAtOnce) {
    ASSERT_EQ(cuda.fill(src, kWords, 5), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(w, rs, 0, remote, 0, kBytes, 43, &t), TL_OK);
    ASSERT_EQ(tl_wait(w, t, kStreamWaitMs), TL_OK);
    // Arrived (and not taken by tl_wait_notification) before the stream asked: it counts.
    ASSERT_EQ(tl_stream_wait_notification(r, rd, 43, rstream), TL_OK) << tl_last_error();
    ASSERT_EQ(cuda.check(dst, kWords, 5, bad, rstream), CUDA_SUCCESS);
    CUevent done = nullptr;
    ASSERT_EQ(cuda.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuEventRecord(done, rstream), CUDA_SUCCESS);
    ASSERT_TRUE(eventDone(done, std::chrono::seconds(10)));
    EXPECT_EQ(badCount(), 0u);
    cuda.cuEventDestroy(done);
}

TEST_F(CudaStreams, ACapturedGraphWaitsForOneNotificationPerReplay) {
    CUdeviceptr counter = bad + 4;  // the second word of the counter buffer, zeroed
    ASSERT_EQ(cuda.cuStreamBeginCapture(rstream, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    ASSERT_EQ(tl_stream_wait_notification(r, rd, 7, rstream), TL_OK) << tl_last_error();
    ASSERT_EQ(cuda.add(counter, 1, 1, rstream), CUDA_SUCCESS);
    CUgraph graph = nullptr;
    ASSERT_EQ(cuda.cuStreamEndCapture(rstream, &graph), CUDA_SUCCESS);
    CUgraphExec exec = nullptr;
    ASSERT_EQ(cuda.cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
    CUevent first = nullptr, second = nullptr;
    ASSERT_EQ(cuda.cuEventCreate(&first, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuEventCreate(&second, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuGraphLaunch(exec, rstream), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuEventRecord(first, rstream), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuGraphLaunch(exec, rstream), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuEventRecord(second, rstream), CUDA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(cuda.cuEventQuery(first), CUDA_ERROR_NOT_READY);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(w, rs, 0, remote, 0, 4096, 7, &t), TL_OK);
    ASSERT_EQ(tl_wait(w, t, kStreamWaitMs), TL_OK);
    EXPECT_TRUE(eventDone(first, std::chrono::seconds(10)));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(cuda.cuEventQuery(second), CUDA_ERROR_NOT_READY) << "one notification, two replays";
    ASSERT_EQ(tl_write(w, rs, 0, remote, 0, 4096, 7, &t), TL_OK);
    ASSERT_EQ(tl_wait(w, t, kStreamWaitMs), TL_OK);
    EXPECT_TRUE(eventDone(second, std::chrono::seconds(10)));
    uint32_t count = 0;
    cuda.cuMemcpyDtoH(&count, counter, 4);
    EXPECT_EQ(count, 2u);
    cuda.cuGraphExecDestroy(exec);
    cuda.cuGraphDestroy(graph);
    cuda.cuEventDestroy(first);
    cuda.cuEventDestroy(second);
}

TEST_F(CudaStreams, AFailedWriteStillReleasesTheStreamWaitingForIt) {
    ASSERT_EQ(cuda.spinFill(src, kWords, 6, 300'000'000ull, ws), CUDA_SUCCESS);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write_on_stream(w, rs, 0, remote, 0, kBytes, 1, ws, &t), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_stream_wait_ticket(w, t, ws), TL_OK) << tl_last_error();
    CUevent after = nullptr;
    ASSERT_EQ(cuda.cuEventCreate(&after, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuEventRecord(after, ws), CUDA_SUCCESS);
    // The target goes away while the write waits for its kernel.
    ASSERT_EQ(tl_deregister(r, rd), TL_OK);
    EXPECT_TRUE(eventDone(after, std::chrono::seconds(10))) << "a failed write held its stream";
    EXPECT_EQ(tl_wait(w, t, kStreamWaitMs), TL_ENOENT) << tl_last_error();
    cuda.cuEventDestroy(after);
}

TEST_F(CudaStreams, ASidecarThatDiesReleasesTheStreamsWaitingOnIt) {
    ASSERT_EQ(tl_stream_wait_notification(r, rd, 99, rstream), TL_OK) << tl_last_error();
    CUevent after = nullptr;
    ASSERT_EQ(cuda.cuEventCreate(&after, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuEventRecord(after, rstream), CUDA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(cuda.cuEventQuery(after), CUDA_ERROR_NOT_READY);
    sc->kill(SIGKILL);
    EXPECT_TRUE(eventDone(after, std::chrono::seconds(10))) << "a stream hung on a dead sidecar";
    tl_notification n{};
    EXPECT_EQ(tl_wait_notification(r, &n, 1000), TL_ECONN);
    cuda.cuEventDestroy(after);
}

}  // namespace

#endif
