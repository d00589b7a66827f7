// GPU tier: tl_register of CUDA memory: a piece of an allocation (not at its start), a second
// piece without a new export, the bounds of the allocation, what CUDA memory cannot be shared,
// and tl_alloc_host page-locked for CUDA. Skips, with the reason, where there is no driver or
// GPU.
#include <gtest/gtest.h>

#include <string>

#include "../sidecar/harness.hpp"
#include "gpu_support.hpp"
#include "tensorlane/tensorlane.h"

#ifdef TENSORLANE_HAVE_CUDA

namespace {

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
