// GPU tier: random data in one worker's GPU memory written into another worker's GPU buffer
// through the local transport (one sidecar), the tcp transport (two sidecars on loopback, GPU
// staging at both ends, FrameAuth on) and the verbs transport (two sidecars on the simulated
// HCA: GPU memory registered from the owner's dma-buf fd, else through the sidecar's IPC
// mapping as nvidia-peermem would), checked on the receiving GPU; GPU to host and host to GPU
// both ways; tensors that do not start at the beginning of their allocations.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../sidecar/harness.hpp"
#include "../sidecar/status_json.hpp"
#include "gpu_support.hpp"
#include "tensorlane/tensorlane.h"

#ifdef TENSORLANE_HAVE_CUDA

namespace {

using tlgpu::Cuda;

constexpr int kWaitMs = 30000;

/// Two sidecars that list each other (node-a, node-b), over tcp on loopback, or over the verbs
/// transport with each on a simulated RoCE device of its own (tests/simhca, two loopback
/// addresses): the production sidecar with the library swapped.
struct TwoNodes {
    tltest::TempDir dir;
    std::unique_ptr<tltest::Sidecar> a, b;
    /// `tcp_extra`: more of both sidecars' [tcp] table.
    explicit TwoNodes(const std::string &transport = "tcp", const std::string &tcp_extra = "") {
        const std::string key = dir.file("peer.key");
        tltest::writeFile(key, tltest::keyText('7'), 0600);
        const uint16_t pa = tltest::freePort(), pb = tltest::freePort();
        auto opts = [&](const char *name, uint16_t port, const char *peer, uint16_t peer_port) {
            tltest::SidecarOptions o;
            o.name = name;
            o.listen = "127.0.0.1:" + std::to_string(port);
            o.key_file = key;
            o.tcp = "keepalive_ms = 200\npeer_timeout_ms = 3000\n" + tcp_extra;
            o.peers.push_back({peer, "127.0.0.1:" + std::to_string(peer_port)});
            o.transport = transport;
            if (transport == "verbs") {
                o.rdma_ip = tltest::uniqueLoopback(name[5] == 'a' ? 21 : 22);
            }
            return o;
        };
        a = std::make_unique<tltest::Sidecar>(opts("node-a", pa, "node-b", pb));
        b = std::make_unique<tltest::Sidecar>(opts("node-b", pb, "node-a", pa));
    }
    bool ready() const { return a->ready() && b->ready(); }
    std::string logs() const { return a->log().substr(0, 8000) + b->log().substr(0, 8000); }
};

/// A device buffer inside a larger allocation, `lead` bytes past its start.
struct DeviceSpan {
    Cuda *cuda = nullptr;
    CUdeviceptr block = 0;
    CUdeviceptr ptr = 0;
    uint64_t bytes = 0;
    bool make(Cuda &c, uint64_t n, uint64_t lead) {
        cuda = &c;
        bytes = n;
        if (c.cuMemAlloc(&block, n + lead + 65536) != CUDA_SUCCESS) {
            return false;
        }
        ptr = block + lead;
        return true;
    }
    ~DeviceSpan() {
        if (block != 0) {
            cuda->cuMemFree(block);
        }
    }
    void *p() const { return reinterpret_cast<void *>(ptr); }
    uint64_t words() const { return bytes / 4; }
};

class CudaTransfer : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cuda.open()) {
            GTEST_SKIP() << cuda.why;
        }
    }
    /// Writes `bytes` of random data from a GPU region of `w` into a GPU region `r` exposed on
    /// `node` (offsets inside their allocations), checks them on the GPU.
    void gpuToGpu(tl_client *w, tl_client *r, const char *node, uint64_t bytes, uint32_t seed,
                  const std::string &name) {
        DeviceSpan src, dst;
        ASSERT_TRUE(src.make(cuda, bytes, 4096 * 3));
        ASSERT_TRUE(dst.make(cuda, bytes, 65536 + 256));
        ASSERT_EQ(cuda.fill(src.ptr, src.words(), seed), CUDA_SUCCESS);
        ASSERT_EQ(cuda.fill(dst.ptr, dst.words(), seed + 1), CUDA_SUCCESS);  // poison
        ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
        tl_region rs = 0, rd = 0;
        ASSERT_EQ(tl_register(w, src.p(), bytes, &rs), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_register(r, dst.p(), bytes, &rd), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_expose(r, rd, name.c_str()), TL_OK) << tl_last_error();
        tl_remote remote = 0;
        ASSERT_EQ(tltest::lookupEventually(w, node, name.c_str(), &remote, nullptr,
                                           std::chrono::seconds(20)),
                  TL_OK)
            << tl_last_error();
        tl_ticket t = 0;
        ASSERT_EQ(tl_write(w, rs, 0, remote, 0, bytes, seed, &t), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_wait(w, t, kWaitMs), TL_OK) << tl_last_error();
        tl_notification n{};
        ASSERT_EQ(tl_wait_notification(r, &n, kWaitMs), TL_OK) << tl_last_error();
        EXPECT_EQ(n.region, rd);
        EXPECT_EQ(n.imm, seed);
        EXPECT_EQ(n.bytes, bytes);
        EXPECT_EQ(cuda.mismatches(dst.ptr, dst.words(), seed), 0u) << bytes << " bytes";
        EXPECT_EQ(tl_deregister(w, rs), TL_OK);
        EXPECT_EQ(tl_deregister(r, rd), TL_OK);
    }
    /// GPU memory on node-a written into host memory on node-b, then that host memory written
    /// back into another GPU buffer on node-a; `seed` and `seed + 1` are the two payloads.
    void acrossNodesBothWays(TwoNodes &nodes, const std::string &name, uint64_t bytes,
                             uint64_t lead_src, uint64_t lead_back, uint32_t seed) {
        tl_client *a = nullptr, *b = nullptr;
        ASSERT_EQ(tl_connect(nodes.a->socket().c_str(), &a), TL_OK);
        ASSERT_EQ(tl_connect(nodes.b->socket().c_str(), &b), TL_OK);
        const uint64_t words = bytes / 4;
        DeviceSpan dev, back;
        ASSERT_TRUE(dev.make(cuda, bytes, lead_src));
        ASSERT_TRUE(back.make(cuda, bytes, lead_back));
        ASSERT_EQ(cuda.fill(dev.ptr, words, seed), CUDA_SUCCESS);
        ASSERT_EQ(cuda.fill(back.ptr, words, 1), CUDA_SUCCESS);
        ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
        void *host = nullptr;
        tl_region rh = 0, rdev = 0, rback = 0;
        const std::string host_name = name + "-host", back_name = name + "-back";
        ASSERT_EQ(tl_alloc_host(b, bytes, &host, &rh), TL_OK);
        ASSERT_EQ(tl_expose(b, rh, host_name.c_str()), TL_OK);
        ASSERT_EQ(tl_register(a, dev.p(), bytes, &rdev), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_register(a, back.p(), bytes, &rback), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_expose(a, rback, back_name.c_str()), TL_OK);
        tl_remote to_host = 0, to_back = 0;
        ASSERT_EQ(tltest::lookupEventually(a, "node-b", host_name.c_str(), &to_host, nullptr,
                                           std::chrono::seconds(20)),
                  TL_OK)
            << tl_last_error() << nodes.logs();
        ASSERT_EQ(tltest::lookupEventually(b, "node-a", back_name.c_str(), &to_back, nullptr,
                                           std::chrono::seconds(20)),
                  TL_OK)
            << tl_last_error();
        tl_ticket t = 0;
        ASSERT_EQ(tl_write(a, rdev, 0, to_host, 0, bytes, 1, &t), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_wait(a, t, kWaitMs), TL_OK) << tl_last_error() << nodes.logs();
        EXPECT_EQ(tlgpu::hostMismatches(host, words, seed), 0u);
        tlgpu::fillHost(host, words, seed + 1);
        ASSERT_EQ(tl_write(b, rh, 0, to_back, 0, bytes, 2, &t), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_wait(b, t, kWaitMs), TL_OK) << tl_last_error() << nodes.logs();
        EXPECT_EQ(cuda.mismatches(back.ptr, words, seed + 1), 0u);
        // Over the transport asked for (no silent fallback to another).
        EXPECT_EQ(tltest::peerStatus(a, "node-b").value("transport", ""), name);
        tl_disconnect(a);
        tl_disconnect(b);
    }
    /// LocalSmallGpuWritesKeepTheirOrderAmongLargeAndHostOnes with the sidecar in `mode`.
    void smallGpuWritesInOrder(const char *mode);
    Cuda cuda;
};

TEST_F(CudaTransfer, LocalGpuToGpuRandomData) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &r), TL_OK);
    uint32_t seed = 11;
    for (uint64_t bytes : {uint64_t{4096}, uint64_t{(1 << 20) + 4 * 77}, uint64_t{64} << 20}) {
        gpuToGpu(w, r, "node-a", bytes, seed++, "dst-" + std::to_string(bytes));
    }
    tl_disconnect(w);
    tl_disconnect(r);
}

TL_GPU_WORKER(recv_and_check) {
    // args: socket, name, bytes, seed. Exposes a GPU buffer (not at its allocation's start),
    // waits for one write, checks it on its GPU: exit 0 when every word is right.
    Cuda cuda;
    if (!cuda.open()) {
        std::fprintf(stderr, "worker: %s\n", cuda.why.c_str());
        return 2;
    }
    const uint64_t bytes = std::stoull(args[2]);
    const auto seed = static_cast<uint32_t>(std::stoul(args[3]));
    DeviceSpan dst;
    tl_client *c = nullptr;
    tl_region rd = 0;
    if (!dst.make(cuda, bytes, 8192) || cuda.fill(dst.ptr, dst.words(), seed + 7) != CUDA_SUCCESS ||
        cuda.cuCtxSynchronize() != CUDA_SUCCESS || tl_connect(args[0].c_str(), &c) != TL_OK ||
        tl_register(c, dst.p(), bytes, &rd) != TL_OK ||
        tl_expose(c, rd, args[1].c_str()) != TL_OK) {
        std::fprintf(stderr, "worker: setup: %s\n", tl_last_error());
        return 3;
    }
    tl_notification n{};
    if (tl_wait_notification(c, &n, kWaitMs) != TL_OK) {
        std::fprintf(stderr, "worker: no notification: %s\n", tl_last_error());
        return 4;
    }
    const uint64_t bad = cuda.mismatches(dst.ptr, dst.words(), seed);
    if (bad != 0) {
        std::fprintf(stderr, "worker: %llu of %llu words wrong\n",
                     static_cast<unsigned long long>(bad),
                     static_cast<unsigned long long>(dst.words()));
        return 5;
    }
    tl_disconnect(c);
    return 0;
}

TEST_F(CudaTransfer, LocalGpuToGpuAcrossWorkerProcesses) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    const uint64_t bytes = (16 << 20) + 4096 + 12;
    const uint32_t seed = 77;
    pid_t worker = tlgpu::spawnWorker(
        "recv_and_check", {sc.socket(), "across", std::to_string(bytes), std::to_string(seed)});
    tl_client *w = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &w), TL_OK);
    DeviceSpan src;
    ASSERT_TRUE(src.make(cuda, bytes, 12288));
    ASSERT_EQ(cuda.fill(src.ptr, src.words(), seed), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
    tl_region rs = 0;
    ASSERT_EQ(tl_register(w, src.p(), bytes, &rs), TL_OK) << tl_last_error();
    tl_remote remote = 0;
    ASSERT_EQ(
        tltest::lookupEventually(w, "node-a", "across", &remote, nullptr, std::chrono::seconds(30)),
        TL_OK)
        << tl_last_error() << sc.log().substr(0, 4000);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(w, rs, 0, remote, 0, bytes, seed, &t), TL_OK) << tl_last_error();
    EXPECT_EQ(tl_wait(w, t, kWaitMs), TL_OK) << tl_last_error();
    EXPECT_EQ(tlgpu::waitWorker(worker), 0) << sc.log().substr(0, 4000);
    tl_disconnect(w);
}

TEST_F(CudaTransfer, LocalGpuAndHostBothWays) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK);
    const uint64_t bytes = (3 << 20) + 40;
    const uint64_t words = bytes / 4;
    DeviceSpan dev, back;
    ASSERT_TRUE(dev.make(cuda, bytes, 4096));
    ASSERT_TRUE(back.make(cuda, bytes, 8192));
    ASSERT_EQ(cuda.fill(dev.ptr, words, 5), CUDA_SUCCESS);
    ASSERT_EQ(cuda.fill(back.ptr, words, 99), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
    void *host = nullptr;
    tl_region rh = 0, rdev = 0, rback = 0;
    ASSERT_EQ(tl_alloc_host(c, bytes, &host, &rh), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_register(c, dev.p(), bytes, &rdev), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_register(c, back.p(), bytes, &rback), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_expose(c, rh, "host"), TL_OK);
    ASSERT_EQ(tl_expose(c, rback, "back"), TL_OK);
    tl_remote to_host = 0, to_back = 0;
    ASSERT_EQ(tl_lookup(c, "node-a", "host", &to_host, nullptr), TL_OK);
    ASSERT_EQ(tl_lookup(c, "node-a", "back", &to_back, nullptr), TL_OK);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(c, rdev, 0, to_host, 0, bytes, 1, &t), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_wait(c, t, kWaitMs), TL_OK) << tl_last_error();
    EXPECT_EQ(tlgpu::hostMismatches(host, words, 5), 0u);
    tlgpu::fillHost(host, words, 6);
    ASSERT_EQ(tl_write(c, rh, 0, to_back, 0, bytes, 2, &t), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_wait(c, t, kWaitMs), TL_OK) << tl_last_error();
    EXPECT_EQ(cuda.mismatches(back.ptr, words, 6), 0u);
    tl_disconnect(c);
}

TEST_F(CudaTransfer, LocalSmallGpuWritesKeepTheirOrderAmongLargeAndHostOnes) {
    // One writer's rounds of GPU 4 KiB, host 4 KiB, GPU 8 MiB, GPU 4 KiB, host 64 KiB, GPU 4 KiB,
    // posted back to back. GPU-to-GPU writes are queued by the engine thread when the writer
    // has nothing on the copy thread; the host writes behind them are held until they have
    // finished, the small one is then copied on the engine thread, the 64 KiB one goes to the
    // copy thread and the GPU write after it follows it there. The owner's notifications must come
    // in posting order and every byte arrive. In event mode the sidecar sleeps whenever it finds
    // nothing to do: one that slept while its GPU copies ran would be woken only by its idle tick
    // (counted in late_wakeups).
    for (const char *mode : {"event", "adaptive"}) {
        SCOPED_TRACE(mode);
        smallGpuWritesInOrder(mode);
    }
}

void CudaTransfer::smallGpuWritesInOrder(const char *mode) {
    // A round's host writes: one small enough for the engine thread, one (64 KiB) for the copy
    // thread, which the GPU write after it then follows there.
    constexpr uint64_t kSmall = 4096, kLarge = 8 << 20, kHostBig = 65536;
    constexpr size_t kRounds = 40;
    constexpr uint64_t kGpuBytes = kLarge + kRounds * 3 * kSmall;
    constexpr uint64_t kHostRound = kSmall + kHostBig, kHostBytes = kRounds * kHostRound;
    tltest::Sidecar sc(tltest::SidecarOptions{.poll_mode = mode});
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK);
    DeviceSpan src, dst;
    ASSERT_TRUE(src.make(cuda, kGpuBytes, 4096));
    ASSERT_TRUE(dst.make(cuda, kGpuBytes, 8192 + 64));
    ASSERT_EQ(cuda.fill(src.ptr, src.words(), 31), CUDA_SUCCESS);
    ASSERT_EQ(cuda.fill(dst.ptr, dst.words(), 32), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
    void *hsrc = nullptr, *hdst = nullptr;
    tl_region rs = 0, rd = 0, rhs = 0, rhd = 0;
    ASSERT_EQ(tl_register(c, src.p(), kGpuBytes, &rs), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_register(c, dst.p(), kGpuBytes, &rd), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_alloc_host(c, kHostBytes, &hsrc, &rhs), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_alloc_host(c, kHostBytes, &hdst, &rhd), TL_OK) << tl_last_error();
    tlgpu::fillHost(hsrc, kHostBytes / 4, 33);
    tlgpu::fillHost(hdst, kHostBytes / 4, 34);
    ASSERT_EQ(tl_expose(c, rd, "gin"), TL_OK);
    ASSERT_EQ(tl_expose(c, rhd, "hin"), TL_OK);
    tl_remote gin = 0, hin = 0;
    ASSERT_EQ(tl_lookup(c, "node-a", "gin", &gin, nullptr), TL_OK);
    ASSERT_EQ(tl_lookup(c, "node-a", "hin", &hin, nullptr), TL_OK);
    const uint64_t late_before =
        tltest::sidecarStatus(c)["counters"]["late_wakeups"].get<uint64_t>();
    uint32_t imm = 0;
    for (size_t r = 0; r < kRounds; ++r) {
        std::vector<tl_ticket> tickets;
        size_t gpu_small = 0;
        for (const char kind : {'g', 'h', 'L', 'g', 'H', 'g'}) {
            tl_ticket t = 0;
            int rc = TL_OK;
            if (kind == 'L') {
                rc = tl_write(c, rs, 0, gin, 0, kLarge, imm++, &t);
            } else if (kind == 'g') {
                const uint64_t off = kLarge + (r * 3 + gpu_small++) * kSmall;
                rc = tl_write(c, rs, off, gin, off, kSmall, imm++, &t);
            } else {
                const uint64_t off = r * kHostRound + (kind == 'h' ? 0 : kSmall);
                const uint64_t n = kind == 'h' ? kSmall : kHostBig;
                rc = tl_write(c, rhs, off, hin, off, n, imm++, &t);
            }
            ASSERT_EQ(rc, TL_OK) << tl_last_error();
            tickets.push_back(t);
        }
        for (tl_ticket t : tickets) {
            ASSERT_EQ(tl_wait(c, t, kWaitMs), TL_OK) << tl_last_error();
        }
        for (uint32_t want = imm - 6; want < imm; ++want) {
            tl_notification n{};
            ASSERT_EQ(tl_wait_notification(c, &n, kWaitMs), TL_OK) << tl_last_error();
            ASSERT_EQ(n.imm, want) << "notification out of posting order, round " << r;
        }
    }
    EXPECT_EQ(cuda.mismatches(dst.ptr, dst.words(), 31), 0u);
    EXPECT_EQ(tlgpu::hostMismatches(hdst, kHostBytes / 4, 33), 0u);
    // The first write of every round after the first (both ends imported by then) went the
    // engine thread's way.
    const auto st = tltest::sidecarStatus(c);
    EXPECT_GE(st["counters"]["writes_local_gpu_inline"].get<uint64_t>(), kRounds - 1) << st.dump();
    EXPECT_EQ(st["counters"]["late_wakeups"].get<uint64_t>(), late_before)
        << "a sleep ended by the idle tick found work: a wake-up was lost";
    tl_disconnect(c);
    EXPECT_TRUE(sc.alive());
}

TEST_F(CudaTransfer, SmallGpuWritesIntoATargetDeregisteredMidStreamEachEndOnce) {
    // A writer keeps 32 small GPU writes in flight (queued by the engine thread) while the
    // target's owner deregisters it: every ticket ends once, either delivered or TL_ENOENT,
    // none after TL_ENOENT is delivered, and the sidecar lives on.
    constexpr uint64_t kSmall = 4096, kBytes = 1 << 20;
    constexpr int kWindow = 32, kRounds = 200;
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &r), TL_OK);
    DeviceSpan src, dst;
    ASSERT_TRUE(src.make(cuda, kBytes, 0));
    ASSERT_TRUE(dst.make(cuda, kBytes, 4096));
    ASSERT_EQ(cuda.fill(src.ptr, src.words(), 41), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
    tl_region rs = 0, rd = 0;
    ASSERT_EQ(tl_register(w, src.p(), kBytes, &rs), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_register(r, dst.p(), kBytes, &rd), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_expose(r, rd, "going"), TL_OK);
    tl_remote to = 0;
    ASSERT_EQ(tl_lookup(w, "node-a", "going", &to, nullptr), TL_OK);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(w, rs, 0, to, 0, kBytes, 0, &t), TL_OK);  // imports both ends
    ASSERT_EQ(tl_wait(w, t, kWaitMs), TL_OK) << tl_last_error();
    int ok = 0, gone = 0;
    bool deregistered = false;
    for (int round = 0; round < kRounds && gone == 0; ++round) {
        std::vector<tl_ticket> ts(kWindow);
        for (int k = 0; k < kWindow; ++k) {
            const uint64_t off = (k * kSmall) % kBytes;
            const int rc = tl_write(w, rs, off, to, off, kSmall, 1, &ts[k]);
            ASSERT_TRUE(rc == TL_OK || rc == TL_ENOENT) << rc << " " << tl_last_error();
            if (rc == TL_ENOENT) {
                ts[k] = 0;
                ++gone;
            }
            if (round == 20 && k == kWindow / 2) {
                ASSERT_EQ(tl_deregister(r, rd), TL_OK);
                deregistered = true;
            }
        }
        for (tl_ticket x : ts) {
            if (x == 0) {
                continue;
            }
            const int rc = tl_wait(w, x, kWaitMs);
            ASSERT_TRUE(rc == TL_OK || rc == TL_ENOENT) << rc << " " << tl_last_error();
            if (rc == TL_OK) {
                EXPECT_EQ(gone, 0) << "delivered after a write had found the target gone";
                ++ok;
            } else {
                ++gone;
            }
            // Consumed: a second wait does not find it.
            EXPECT_EQ(tl_wait(w, x, 0), TL_ENOENT);
        }
    }
    EXPECT_TRUE(deregistered);
    EXPECT_GE(ok, 20 * kWindow);  // every round before the deregistration
    EXPECT_GT(gone, 0);
    EXPECT_TRUE(sc.alive());
    tl_disconnect(w);
    tl_disconnect(r);
}

TEST_F(CudaTransfer, TcpGpuToGpuStagedAtBothEnds) {
    // Two tag workers each: the big chunks' socket copies and tags are theirs (docs/peers.md).
    TwoNodes nodes("tcp", "tag_threads = 2\n");
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(nodes.a->socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(nodes.b->socket().c_str(), &r), TL_OK);
    // One chunk, several chunks (the staging pipeline, more chunks than slots) and an odd size.
    uint32_t seed = 21;
    for (uint64_t bytes : {uint64_t{8192}, uint64_t{(24 << 20) + 4 * 1001}}) {
        gpuToGpu(w, r, "node-b", bytes, seed++, "tcp-" + std::to_string(bytes));
        if (HasFatalFailure()) {
            ADD_FAILURE() << nodes.logs();
            break;
        }
    }
    // The 24 MiB write's chunks were read from the socket into their staging slots by node-b's
    // workers and sent from node-a's slots by node-a's (and landed whole, checked above).
    const auto sb = tltest::peerStatus(r, "node-a");
    const auto sa = tltest::peerStatus(w, "node-b");
    EXPECT_GE(sb.value("chunks_read_by_tag_workers", uint64_t{0}), 1u) << sb.dump();
    EXPECT_GE(sa.value("chunks_sent_by_tag_workers", uint64_t{0}), 1u) << sa.dump();
    tl_disconnect(w);
    tl_disconnect(r);
}

TEST_F(CudaTransfer, TcpGpuAndHostBothWays) {
    TwoNodes nodes;
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    acrossNodesBothWays(nodes, "tcp", (5 << 20) + 36, 4096, 4096, 31);
}

TEST_F(CudaTransfer, VerbsGpuToGpuOnTheSimulatedHca) {
    TwoNodes nodes("verbs");
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(nodes.a->socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(nodes.b->socket().c_str(), &r), TL_OK);
    uint32_t seed = 41;
    for (uint64_t bytes : {uint64_t{4096}, uint64_t{(16 << 20) + 4 * 777}}) {
        gpuToGpu(w, r, "node-b", bytes, seed++, "verbs-" + std::to_string(bytes));
        if (HasFatalFailure()) {
            ADD_FAILURE() << nodes.logs();
            break;
        }
    }
    // Both went over verbs (no silent fallback to tcp), and the sidecar says how it registered
    // the GPU memory.
    const auto pa = tltest::peerStatus(w, "node-b");
    EXPECT_EQ(pa.value("transport", ""), "verbs") << pa.dump();
    const std::string how = pa.value("gpu_registration", "");
    EXPECT_TRUE(how == "dma-buf" || how == "peermem") << pa.dump();
    std::printf("verbs GPU memory registration on this host: %s\n", how.c_str());
    if (pa.contains("send")) {
        EXPECT_GE(pa["send"].value("writes_completed", 0), 2) << pa.dump();
    } else {
        ADD_FAILURE() << "no send session in " << pa.dump();
    }
    tl_disconnect(w);
    tl_disconnect(r);
}

TEST_F(CudaTransfer, VerbsGpuAndHostBothWays) {
    TwoNodes nodes("verbs");
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    acrossNodesBothWays(nodes, "verbs", (3 << 20) + 44, 8192, 4096 + 512, 51);
}

/// A group of 256 GPU entries of 64 KiB (GPU to GPU, within one allocation each) and a
/// payload, from node-a's client to `target`'s: one ticket, one notification after all of it
/// landed, checked on the GPU.
void gpuGroup(Cuda &cuda, tl_client *w, tl_client *r, const char *node, const std::string &name) {
    constexpr uint64_t kEntries = 256, kLen = 64 * 1024, kBytes = kEntries * kLen;
    DeviceSpan src, dst;
    ASSERT_TRUE(src.make(cuda, kBytes, 4096));
    ASSERT_TRUE(dst.make(cuda, kBytes, 8192));
    ASSERT_EQ(cuda.fill(src.ptr, src.words(), 91), CUDA_SUCCESS);
    ASSERT_EQ(cuda.fill(dst.ptr, dst.words(), 92), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
    tl_region rs = 0, rd = 0;
    ASSERT_EQ(tl_register(w, src.p(), kBytes, &rs), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_register(r, dst.p(), kBytes, &rd), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_expose(r, rd, name.c_str()), TL_OK) << tl_last_error();
    tl_remote remote = 0;
    ASSERT_EQ(
        tltest::lookupEventually(w, node, name.c_str(), &remote, nullptr, std::chrono::seconds(20)),
        TL_OK)
        << tl_last_error();
    std::vector<tl_group_entry> entries;
    for (uint64_t i = 0; i < kEntries; ++i) {
        const uint64_t k = (i * 37) % kEntries;  // submitted out of order, each to its place
        entries.push_back({rs, k * kLen, remote, k * kLen, kLen});
    }
    std::vector<tl_status> st(kEntries, TL_EINTERNAL);
    const char payload[] = "gpu blocks";
    tl_send_opts o{};
    o.imm = 93;
    o.payload = payload;
    o.payload_bytes = sizeof payload;
    o.entry_status = st.data();
    tl_ticket t = 0;
    ASSERT_EQ(tl_write_group(w, entries.data(), entries.size(), &o, &t), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_wait(w, t, kWaitMs), TL_OK) << tl_last_error();
    EXPECT_EQ(std::count(st.begin(), st.end(), TL_OK), static_cast<long>(kEntries));
    tl_message m{};
    ASSERT_EQ(tl_wait_message(r, &m, kWaitMs), TL_OK) << tl_last_error();
    EXPECT_EQ(m.kind, TL_NOTIFY_GROUP);
    EXPECT_EQ(m.status, TL_OK);
    EXPECT_EQ(m.entries, kEntries);
    EXPECT_EQ(m.ex.n.imm, 93u);
    EXPECT_STREQ(reinterpret_cast<const char *>(m.payload), payload);
    EXPECT_EQ(cuda.mismatches(dst.ptr, dst.words(), 91), 0u);
    EXPECT_EQ(tl_wait_message(r, &m, 100), TL_ETIMEDOUT);
    EXPECT_EQ(tl_deregister(w, rs), TL_OK);
    EXPECT_EQ(tl_deregister(r, rd), TL_OK);
}

TEST_F(CudaTransfer, LocalGroupOfGpuEntriesIsNotifiedOnceWhenAllLanded) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &r), TL_OK);
    gpuGroup(cuda, w, r, "node-a", "gpu-group");
    tl_disconnect(w);
    tl_disconnect(r);
}

TEST_F(CudaTransfer, TcpAndVerbsGroupsOfGpuEntriesAreNotifiedOnceWhenAllLanded) {
    for (const char *transport : {"tcp", "verbs"}) {
        SCOPED_TRACE(transport);
        TwoNodes nodes(transport);
        ASSERT_TRUE(nodes.ready()) << nodes.logs();
        tl_client *w = nullptr, *r = nullptr;
        ASSERT_EQ(tl_connect(nodes.a->socket().c_str(), &w), TL_OK);
        ASSERT_EQ(tl_connect(nodes.b->socket().c_str(), &r), TL_OK);
        gpuGroup(cuda, w, r, "node-b", std::string("gpu-group-") + transport);
        tl_disconnect(w);
        tl_disconnect(r);
    }
}

}  // namespace

#endif
