// GPU tier: with a CUDA driver and a device, a device pointer handed to tl_register is
// recognised and refused with TL_ECUDA and a clear reason (GPU registration arrives with the GPU
// issue); host buffers keep working. Skips, with the reason, where there is no driver or GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "../sidecar/harness.hpp"
#include "tensorlane/tensorlane.hpp"

namespace {

/// The few driver calls the test needs, opened at run time like the shim does.
struct CudaDriver {
    using Init = int (*)(unsigned);
    using DeviceGetCount = int (*)(int *);
    using DeviceGet = int (*)(int *, int);
    using CtxCreate = int (*)(void **, unsigned, int);
    using MemAlloc = int (*)(uint64_t *, size_t);
    using MemFree = int (*)(uint64_t);
    Init init = nullptr;
    DeviceGetCount count = nullptr;
    DeviceGet get = nullptr;
    CtxCreate ctx_create = nullptr;
    MemAlloc alloc = nullptr;
    MemFree free = nullptr;
    std::string why;

    bool open() {
        void *lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            why = "no CUDA driver (libcuda.so.1) on this machine";
            return false;
        }
        init = reinterpret_cast<Init>(::dlsym(lib, "cuInit"));
        count = reinterpret_cast<DeviceGetCount>(::dlsym(lib, "cuDeviceGetCount"));
        get = reinterpret_cast<DeviceGet>(::dlsym(lib, "cuDeviceGet"));
        ctx_create = reinterpret_cast<CtxCreate>(::dlsym(lib, "cuCtxCreate_v2"));
        alloc = reinterpret_cast<MemAlloc>(::dlsym(lib, "cuMemAlloc_v2"));
        free = reinterpret_cast<MemFree>(::dlsym(lib, "cuMemFree_v2"));
        int n = 0;
        if (!init || !count || !get || !ctx_create || !alloc || !free || init(0) != 0 ||
            count(&n) != 0 || n == 0) {
            why = "the CUDA driver reports no usable GPU";
            return false;
        }
        return true;
    }
};

}  // namespace

TEST(CudaRegister, DevicePointerIsRefusedWithEcuda) {
    CudaDriver cuda;
    if (!cuda.open()) {
        GTEST_SKIP() << cuda.why;
    }
    int dev = 0;
    void *ctx = nullptr;
    ASSERT_EQ(cuda.get(&dev, 0), 0);
    ASSERT_EQ(cuda.ctx_create(&ctx, 0, dev), 0);
    uint64_t dptr = 0;
    ASSERT_EQ(cuda.alloc(&dptr, 1 << 20), 0);

    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    auto client = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(client.ok());
    tl_region r = 0;
    EXPECT_EQ(tl_register(client->get(), reinterpret_cast<void *>(dptr), 1 << 20, &r), TL_ECUDA);
    EXPECT_NE(std::string(tl_last_error()).find("CUDA"), std::string::npos) << tl_last_error();
    // Host memory still registers on the same client.
    auto host = client->allocHost(4096);
    EXPECT_TRUE(host.ok());
    cuda.free(dptr);
}
