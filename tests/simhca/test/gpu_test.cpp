// The CUDA paths of the simulated HCA, for a machine with a GPU (label gpu; skips elsewhere):
// device memory registered as nvidia-peermem allows (ibv_reg_mr on a cuMemAlloc pointer), and
// as a dma-buf (cuMemGetHandleForAddressRange, then ibv_reg_dmabuf_mr with the device pointer as
// iova), written into and read back by RDMA from host memory on the other simulated device.
// The CUDA driver is opened with dlopen, as the simulator itself does; nothing links CUDA.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "verbs_fixture.hpp"

namespace tensorlane::simhca::test {
namespace {

struct Cuda {
    void *lib = nullptr;
    int (*init)(unsigned) = nullptr;
    int (*deviceGet)(int *, int) = nullptr;
    int (*ctxCreate)(void **, unsigned, int) = nullptr;
    int (*ctxDestroy)(void *) = nullptr;
    int (*memAlloc)(uint64_t *, size_t) = nullptr;
    int (*memFree)(uint64_t) = nullptr;
    int (*htod)(uint64_t, const void *, size_t) = nullptr;
    int (*dtoh)(void *, uint64_t, size_t) = nullptr;
    int (*getHandle)(void *, uint64_t, size_t, int, unsigned long long) = nullptr;
    void *ctx = nullptr;
    std::string why;

    bool open() {
        lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (lib == nullptr) {
            why = "no CUDA driver (libcuda.so.1 cannot be opened)";
            return false;
        }
        init = reinterpret_cast<decltype(init)>(dlsym(lib, "cuInit"));
        deviceGet = reinterpret_cast<decltype(deviceGet)>(dlsym(lib, "cuDeviceGet"));
        ctxCreate = reinterpret_cast<decltype(ctxCreate)>(dlsym(lib, "cuCtxCreate_v2"));
        ctxDestroy = reinterpret_cast<decltype(ctxDestroy)>(dlsym(lib, "cuCtxDestroy_v2"));
        memAlloc = reinterpret_cast<decltype(memAlloc)>(dlsym(lib, "cuMemAlloc_v2"));
        memFree = reinterpret_cast<decltype(memFree)>(dlsym(lib, "cuMemFree_v2"));
        htod = reinterpret_cast<decltype(htod)>(dlsym(lib, "cuMemcpyHtoD_v2"));
        dtoh = reinterpret_cast<decltype(dtoh)>(dlsym(lib, "cuMemcpyDtoH_v2"));
        getHandle =
            reinterpret_cast<decltype(getHandle)>(dlsym(lib, "cuMemGetHandleForAddressRange"));
        int dev = 0;
        if (init == nullptr || init(0) != 0 || deviceGet(&dev, 0) != 0) {
            why = "CUDA driver present but no usable GPU (cuInit/cuDeviceGet failed)";
            return false;
        }
        return ctxCreate(&ctx, 0, dev) == 0;
    }
    ~Cuda() {
        if (ctx != nullptr)
            ctxDestroy(ctx);
    }
};

// RDMA WRITE from host memory on A into GPU memory registered on B, then READ it back.
void roundTrip(QpPair &pair, Cuda &cuda, ibv_mr *gpu_mr, uint64_t gpu_iova, size_t n) {
    auto src = pair.buffer(pair.a, n);
    auto back = pair.buffer(pair.a, n);
    for (size_t i = 0; i < n; ++i)
        src->data()[i] = static_cast<uint8_t>(i * 13 + 1);
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, static_cast<uint32_t>(n), gpu_iova,
                       gpu_mr->rkey, 1),
              0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    std::vector<uint8_t> host(n);
    ASSERT_EQ(cuda.dtoh(host.data(), reinterpret_cast<uint64_t>(gpu_mr->addr), n), 0);
    EXPECT_EQ(std::memcmp(host.data(), src->data(), n), 0) << "WRITE did not land in GPU memory";
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_READ, *back, 0, static_cast<uint32_t>(n), gpu_iova,
                       gpu_mr->rkey, 2),
              0);
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(std::memcmp(back->data(), src->data(), n), 0) << "READ of GPU memory differs";
}

TEST(SimGpu, PeermemStyleRegistrationOfDeviceMemory) {
    Cuda cuda;
    if (!cuda.open()) {
        GTEST_SKIP() << cuda.why;
    }
    QpPair pair;
    const size_t n = 1 << 20;
    uint64_t dptr = 0;
    ASSERT_EQ(cuda.memAlloc(&dptr, n), 0);
    ibv_mr *mr =
        ibv_reg_mr(pair.b.pd, reinterpret_cast<void *>(dptr), n,
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(mr, nullptr) << strerror(errno);
    roundTrip(pair, cuda, mr, dptr, n);
    ibv_dereg_mr(mr);
    cuda.memFree(dptr);
}

TEST(SimGpu, DmabufRegistrationOfDeviceMemory) {
    Cuda cuda;
    if (!cuda.open()) {
        GTEST_SKIP() << cuda.why;
    }
    if (cuda.getHandle == nullptr) {
        GTEST_SKIP() << "driver lacks cuMemGetHandleForAddressRange (CUDA >= 11.7 needed)";
    }
    QpPair pair;
    const size_t n = 2 << 20;  // dma-buf export wants page-aligned ranges
    uint64_t dptr = 0;
    ASSERT_EQ(cuda.memAlloc(&dptr, n), 0);
    int fd = -1;
    // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1
    const int rc = cuda.getHandle(&fd, dptr, n, 1, 0);
    if (rc != 0) {
        cuda.memFree(dptr);
        GTEST_SKIP() << "cuMemGetHandleForAddressRange failed (" << rc
                     << "): the GPU or driver does not export dma-bufs";
    }
    // The simulator reaches CUDA dma-buf memory through the iova when it is a device pointer
    // of this process (the exporter's fd itself cannot be mmap'd).
    ibv_mr *mr = ibv_reg_dmabuf_mr(
        pair.b.pd, 0, n, dptr, fd,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(mr, nullptr) << strerror(errno);
    roundTrip(pair, cuda, mr, dptr, n);
    ibv_dereg_mr(mr);
    close(fd);
    cuda.memFree(dptr);
}

}  // namespace
}  // namespace tensorlane::simhca::test
