#include "cuda_driver.hpp"

#include <dlfcn.h>

namespace tensorlane::simhca {
namespace {

// From cuda.h (CUpointer_attribute, CUmemorytype); the values are part of the driver ABI.
constexpr int kAttrContext = 1;            // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kAttrMemoryType = 2;         // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttrDeviceOrdinal = 9;      // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned kMemoryTypeDevice = 2;  // CU_MEMORYTYPE_DEVICE

template <typename F>
void bind(void *lib, const char *name, F &out) {
    out = reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

CudaDriver &CudaDriver::instance() {
    static CudaDriver driver;
    return driver;
}

CudaDriver::CudaDriver() {
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
        return;
    }
    bind(lib_, "cuInit", cuInit_);
    bind(lib_, "cuPointerGetAttribute", cuPointerGetAttribute_);
    bind(lib_, "cuCtxPushCurrent_v2", cuCtxPushCurrent_);
    bind(lib_, "cuCtxPopCurrent_v2", cuCtxPopCurrent_);
    bind(lib_, "cuMemcpyHtoD_v2", cuMemcpyHtoD_);
    bind(lib_, "cuMemcpyDtoH_v2", cuMemcpyDtoH_);
    bind(lib_, "cuDeviceGet", cuDeviceGet_);
    bind(lib_, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain_);
    available_ = cuInit_ != nullptr && cuPointerGetAttribute_ != nullptr &&
                 cuCtxPushCurrent_ != nullptr && cuCtxPopCurrent_ != nullptr &&
                 cuMemcpyHtoD_ != nullptr && cuMemcpyDtoH_ != nullptr && cuInit_(0) == 0;
}

bool CudaDriver::isDevicePointer(uint64_t ptr, void **ctx_out) const {
    if (!available_) {
        return false;
    }
    unsigned type = 0;
    if (cuPointerGetAttribute_(&type, kAttrMemoryType, ptr) != 0 || type != kMemoryTypeDevice) {
        return false;
    }
    void *ctx = nullptr;
    if (cuPointerGetAttribute_(&ctx, kAttrContext, ptr) != 0) {
        return false;
    }
    if (ctx == nullptr) {
        // cuMemCreate memory mapped with cuMemMap: no context owns it; any context of its
        // device reaches it, and the primary one is what the mapper (the sidecar) uses. The
        // retain is taken once a device and never released (the simulator lives as long as
        // the process).
        int ordinal = -1;
        if (cuPointerGetAttribute_(&ordinal, kAttrDeviceOrdinal, ptr) != 0 || ordinal < 0 ||
            static_cast<size_t>(ordinal) >= primary_.size()) {
            return false;
        }
        std::lock_guard lock(primary_mu_);
        void *&p = primary_[static_cast<size_t>(ordinal)];
        int dev = 0;
        if (p == nullptr &&
            (cuDeviceGet_ == nullptr || cuDevicePrimaryCtxRetain_ == nullptr ||
             cuDeviceGet_(&dev, ordinal) != 0 || cuDevicePrimaryCtxRetain_(&p, dev) != 0)) {
            p = nullptr;
            return false;
        }
        ctx = p;
    }
    *ctx_out = ctx;
    return true;
}

bool CudaDriver::copyToDevice(void *ctx, uint64_t dst, const void *src, size_t n) const {
    // The engine thread has no current context; push the allocation's own for the copy.
    if (!available_ || cuCtxPushCurrent_(ctx) != 0) {
        return false;
    }
    const bool ok = cuMemcpyHtoD_(dst, src, n) == 0;
    void *popped = nullptr;
    cuCtxPopCurrent_(&popped);
    return ok;
}

bool CudaDriver::copyFromDevice(void *ctx, void *dst, uint64_t src, size_t n) const {
    if (!available_ || cuCtxPushCurrent_(ctx) != 0) {
        return false;
    }
    const bool ok = cuMemcpyDtoH_(dst, src, n) == 0;
    void *popped = nullptr;
    cuCtxPopCurrent_(&popped);
    return ok;
}

}  // namespace tensorlane::simhca
