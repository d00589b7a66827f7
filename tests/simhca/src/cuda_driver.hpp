// The CUDA driver API, opened at run time with dlopen("libcuda.so.1") so that the simulator
// never links CUDA and loads on machines without a GPU. Used to tell device pointers from host
// pointers and to copy to and from device memory (the simulated HCA's "DMA").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace tensorlane::simhca {

/// The few driver calls the simulator needs; all return false when the driver is absent.
class CudaDriver {
public:
    /// The process-wide instance (the library is opened on first use).
    static CudaDriver &instance();
    /// Whether libcuda.so.1 loaded and cuInit succeeded.
    [[nodiscard]] bool available() const { return available_; }
    /// Whether ptr is device memory of a CUDA context in this process (an allocation of its
    /// own, an IPC import or a cuMemMap mapping): cuPointerGetAttribute(MEMORY_TYPE). VMM
    /// mappings belong to no context (CONTEXT answers NULL): their device's primary context
    /// copies them.
    [[nodiscard]] bool isDevicePointer(uint64_t ptr, void **ctx_out) const;
    /// Copies host bytes to device memory at dst, in ctx.
    [[nodiscard]] bool copyToDevice(void *ctx, uint64_t dst, const void *src, size_t n) const;
    /// Copies device memory at src to host bytes, in ctx.
    [[nodiscard]] bool copyFromDevice(void *ctx, void *dst, uint64_t src, size_t n) const;

private:
    CudaDriver();
    bool available_ = false;
    void *lib_ = nullptr;
    int (*cuInit_)(unsigned) = nullptr;
    int (*cuPointerGetAttribute_)(void *, int, uint64_t) = nullptr;
    int (*cuCtxPushCurrent_)(void *) = nullptr;
    int (*cuCtxPopCurrent_)(void **) = nullptr;
    int (*cuMemcpyHtoD_)(uint64_t, const void *, size_t) = nullptr;
    int (*cuMemcpyDtoH_)(void *, uint64_t, size_t) = nullptr;
    int (*cuDeviceGet_)(int *, int) = nullptr;
    int (*cuDevicePrimaryCtxRetain_)(void **, int) = nullptr;
    mutable std::mutex primary_mu_;
    mutable std::array<void *, 64> primary_{};  // primary contexts retained, by ordinal
};

}  // namespace tensorlane::simhca
