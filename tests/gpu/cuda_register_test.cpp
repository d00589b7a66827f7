// GPU tier: tl_register of CUDA memory: a piece of an allocation (not at its start), a second
// piece without a new export, the bounds of the allocation, what CUDA memory cannot be shared,
// and tl_alloc_host page-locked for CUDA. Skips, with the reason, where there is no driver or
// GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "../sidecar/harness.hpp"
#include "../sidecar/raw_client.hpp"
#include "gpu_support.hpp"
#include "tensorlane/ipc/status.hpp"
#include "tensorlane/tensorlane.h"

#ifdef TENSORLANE_HAVE_CUDA

namespace {

namespace ipc = tensorlane::ipc;

class CudaRegister : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cuda.open()) {
            GTEST_SKIP() << cuda.why;
        }
    }
    tlgpu::Cuda cuda;
};

std::string statusOf(tl_client *c) {
    std::string buf(1 << 16, '\0');
    size_t len = 0;
    if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
        return "";
    }
    buf.resize(std::min(len, buf.size()));
    return buf;
}

TEST_F(CudaRegister, APieceOfAnAllocationRegistersAndASecondReusesTheExport) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK) << tl_last_error();
    CUdeviceptr block = 0;
    ASSERT_EQ(cuda.cuMemAlloc(&block, 4 << 20), CUDA_SUCCESS);
    tl_region a = 0, b = 0, bad = 0;
    ASSERT_EQ(tl_register(c, reinterpret_cast<void *>(block + 4096), 65536, &a), TL_OK)
        << tl_last_error();
    ASSERT_EQ(tl_register(c, reinterpret_cast<void *>(block + (1 << 20)), 1 << 20, &b), TL_OK)
        << tl_last_error();
    EXPECT_NE(a, b);
    // Past the end of the allocation: wrong on its face, refused by the shim.
    EXPECT_EQ(tl_register(c, reinterpret_cast<void *>(block + (4 << 20) - 4096), 8192, &bad),
              TL_EINVAL);
    EXPECT_NE(std::string(tl_last_error()).find("past the end"), std::string::npos)
        << tl_last_error();
    const std::string status = statusOf(c);
    EXPECT_NE(status.find("\"available\": true"), std::string::npos) << status;
    EXPECT_EQ(tl_deregister(c, a), TL_OK);
    EXPECT_EQ(tl_deregister(c, b), TL_OK);
    // Every region of the allocation is gone: the next registration exports it again.
    ASSERT_EQ(tl_register(c, reinterpret_cast<void *>(block), 4 << 20, &a), TL_OK)
        << tl_last_error();
    EXPECT_EQ(tl_deregister(c, a), TL_OK);
    tl_disconnect(c);
    cuda.cuMemFree(block);
}

/// The registration a shim would send for [offset, offset + bytes) of `block` (`alloc_bytes`
/// long), with the allocation's IPC handle; the claims are the test's to falsify.
ipc::RegisterMsg cudaRegistration(tlgpu::Cuda &cuda, CUdeviceptr block, uint64_t alloc_bytes,
                                  uint64_t offset, uint64_t bytes, uint64_t key) {
    ipc::RegisterMsg m{};
    m.h.type = static_cast<uint16_t>(ipc::MsgType::kRegister);
    m.kind = static_cast<uint32_t>(ipc::RegionKind::kCuda);
    m.flags = ipc::kRegisterDmabuf;
    m.parent = key;
    m.offset = offset;
    m.bytes = bytes;
    m.address = block + offset;
    m.alloc_bytes = alloc_bytes;
    m.alloc_address = block;
    CUipcMemHandle h{};
    EXPECT_EQ(cuda.cuIpcGetMemHandle(&h, block), CUDA_SUCCESS);
    std::memcpy(m.cuda_ipc_handle, h.reserved, sizeof(m.cuda_ipc_handle));
    CUdevice dev = 0;
    CUuuid uuid{};
    EXPECT_EQ(cuda.cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT_EQ(cuda.cuDeviceGetUuid(&uuid, dev), CUDA_SUCCESS);
    std::memcpy(m.device_uuid, uuid.bytes, sizeof(m.device_uuid));
    return m;
}

int dmabufOf(tlgpu::Cuda &cuda, CUdeviceptr base, uint64_t bytes) {
    int fd = -1;
    if (cuda.cuMemGetHandleForAddressRange(&fd, base, bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                           0) != CUDA_SUCCESS) {
        return -1;
    }
    return fd;
}

// A client that lies about its allocation (issue 19, item 3): a larger size than the real one,
// with a range past the real end, must be refused with TL_EINVAL by the sidecar's own check
// (its import's cuMemGetAddressRange; the dma-buf fd's size), never accepted and never copied.
// Before the check the sidecar trusted alloc_bytes: the first registration answered TL_OK.
TEST_F(CudaRegister, AClientLyingAboutItsAllocationIsRefused) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    constexpr uint64_t kReal = 2 << 20, kClaimed = 8 << 20;
    CUdeviceptr block = 0, small = 0;
    ASSERT_EQ(cuda.cuMemAlloc(&block, kReal), CUDA_SUCCESS);
    ASSERT_EQ(cuda.cuMemAlloc(&small, kReal), CUDA_SUCCESS);
    tltest::RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket())) << sc.log();

    // 1. A dma-buf of the whole (claimed) allocation cannot be had, so the liar sends the real
    // one: its size gives the lie away before anything is imported.
    {
        ipc::UniqueFd fd(dmabufOf(cuda, block, kReal));
        if (!fd) {
            GTEST_SKIP() << "cuMemGetHandleForAddressRange gave no dma-buf on this machine";
        }
        ipc::RegisterMsg m = cudaRegistration(cuda, block, kClaimed, 6 << 20, 1 << 20, 1);
        const int fds[] = {fd.get()};
        ipc::ReplyMsg r = raw.call(m, nullptr, fds);
        EXPECT_EQ(r.status, static_cast<int32_t>(ipc::Code::kInvalid)) << r.error;
        EXPECT_NE(std::string(r.error).find("dma-buf"), std::string::npos) << r.error;
    }
    // 2. A dma-buf fd as large as the claim (another, larger allocation's) with the small
    // allocation's IPC handle: the import itself is smaller than the claim.
    {
        CUdeviceptr big = 0;
        ASSERT_EQ(cuda.cuMemAlloc(&big, kClaimed), CUDA_SUCCESS);
        ipc::UniqueFd fd(dmabufOf(cuda, big, kClaimed));
        ASSERT_TRUE(fd);
        ipc::RegisterMsg m = cudaRegistration(cuda, small, kClaimed, 6 << 20, 1 << 20, 2);
        const int fds[] = {fd.get()};
        ipc::ReplyMsg r = raw.call(m, nullptr, fds);
        EXPECT_EQ(r.status, static_cast<int32_t>(ipc::Code::kInvalid)) << r.error;
        EXPECT_NE(std::string(r.error).find("import"), std::string::npos) << r.error;
        fd.reset();
        cuda.cuMemFree(big);
    }
    // 3. The truth is accepted, and a later range of the verified allocation is answered from
    // the verified import.
    {
        ipc::UniqueFd fd(dmabufOf(cuda, block, kReal));
        ASSERT_TRUE(fd);
        ipc::RegisterMsg m = cudaRegistration(cuda, block, kReal, 4096, 65536, 3);
        const int fds[] = {fd.get()};
        ipc::ReplyMsg r = raw.call(m, nullptr, fds);
        EXPECT_EQ(r.status, 0) << r.error;
        ipc::RegisterMsg again = cudaRegistration(cuda, block, kReal, 1 << 20, 1 << 20, 3);
        again.flags = ipc::kRegisterReuse;
        r = raw.call(again);
        EXPECT_EQ(r.status, 0) << r.error;
        // The same key with a grown claim is refused: the verified size is the bound.
        ipc::RegisterMsg grown = cudaRegistration(cuda, block, kClaimed, 6 << 20, 1 << 20, 3);
        grown.flags = ipc::kRegisterReuse;
        r = raw.call(grown);
        EXPECT_EQ(r.status, static_cast<int32_t>(ipc::Code::kInvalid)) << r.error;
    }
    // The sidecar is still serving.
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK) << tl_last_error();
    tl_region ok = 0;
    EXPECT_EQ(tl_register(c, reinterpret_cast<void *>(small), kReal, &ok), TL_OK)
        << tl_last_error();
    tl_disconnect(c);
    cuda.cuMemFree(small);
    cuda.cuMemFree(block);
}

TEST_F(CudaRegister, ManagedMemoryIsRefusedWithTheReason) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK);
    CUdeviceptr managed = 0;
    // 64 KiB: far below what the card has free (README of the device: never more).
    ASSERT_EQ(cuda.cuMemAllocManaged(&managed, 65536, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    tl_region r = 0;
    EXPECT_EQ(tl_register(c, reinterpret_cast<void *>(managed), 65536, &r), TL_ECUDA);
    EXPECT_NE(std::string(tl_last_error()).find("managed"), std::string::npos) << tl_last_error();
    tl_disconnect(c);
    cuda.cuMemFree(managed);
}

TEST_F(CudaRegister, AllocHostIsPageLockedForCuda) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK);
    void *p = nullptr;
    tl_region r = 0;
    ASSERT_EQ(tl_alloc_host(c, 1 << 20, &p, &r), TL_OK) << tl_last_error();
    unsigned flags = 0;
    // Only memory registered with (or allocated by) CUDA has host flags.
    EXPECT_EQ(cuda.cuMemHostGetFlags(&flags, p), CUDA_SUCCESS);
    EXPECT_EQ(tl_deregister(c, r), TL_OK);
    tl_disconnect(c);
}

}  // namespace

#else

TEST(CudaRegister, NeedsTheCudaToolkit) {
    GTEST_SKIP() << "built without the CUDA toolkit: no CUDA support to test";
}

#endif
