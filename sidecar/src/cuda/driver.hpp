// The CUDA driver API as the sidecar uses it: libcuda.so.1 opened at run time (dlopen), never
// linked, so tensorlane-sidecar runs on machines with no GPU and says so clearly. Only the
// files of sidecar/src/cuda/ include this (and cuda.h); the rest of the sidecar sees the
// toolkit-free interfaces of runtime.hpp, import.hpp and copier.hpp.
//
// Each entry point is looked up under the versioned name cuda.h maps its name to, so the
// pointer's type is the header's own prototype for that symbol.
#pragma once

#ifndef TENSORLANE_HAVE_CUDA
#error "cuda/driver.hpp needs the CUDA toolkit's cuda.h"
#endif

#include <cuda.h>

#include <string>

namespace tensorlane::sidecar {

#define TL_SIDECAR_CUDA_CALLS(X) \
    X(cuInit)                    \
    X(cuGetErrorName)            \
    X(cuGetErrorString)          \
    X(cuDriverGetVersion)        \
    X(cuDeviceGet)               \
    X(cuDeviceGetCount)          \
    X(cuDeviceGetUuid)           \
    X(cuDeviceGetName)           \
    X(cuDeviceGetAttribute)      \
    X(cuDeviceCanAccessPeer)     \
    X(cuDevicePrimaryCtxRetain)  \
    X(cuDevicePrimaryCtxRelease) \
    X(cuCtxPushCurrent)          \
    X(cuCtxSetCurrent)           \
    X(cuCtxPopCurrent)           \
    X(cuCtxEnablePeerAccess)     \
    X(cuIpcOpenMemHandle)        \
    X(cuIpcCloseMemHandle)       \
    X(cuMemGetAddressRange)      \
    X(cuMemHostRegister)         \
    X(cuMemHostUnregister)       \
    X(cuMemGetInfo)              \
    X(cuStreamCreate)            \
    X(cuStreamDestroy)           \
    X(cuEventCreate)             \
    X(cuEventDestroy)            \
    X(cuEventRecord)             \
    X(cuEventQuery)              \
    X(cuMemcpyAsync)

/// The loaded driver. `ok` false: `why` says what is missing.
struct CudaDriver {
#define TL_SIDECAR_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
    TL_SIDECAR_CUDA_CALLS(TL_SIDECAR_CUDA_MEMBER)
#undef TL_SIDECAR_CUDA_MEMBER
    bool ok = false;
    std::string why;

    /// "CUDA_ERROR_INVALID_VALUE (invalid argument)".
    std::string errorText(CUresult rc) const;
};

/// Opens libcuda.so.1 and resolves every entry point (no cuInit). Thread-safe, once.
const CudaDriver &cudaDriver();

/// Makes `ctx` current for a scope and restores the previous context (the device guard).
class CudaContextGuard {
public:
    CudaContextGuard(const CudaDriver &d, CUcontext ctx) : d_(d) {
        pushed_ = ctx != nullptr && d_.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
    }
    ~CudaContextGuard() {
        if (pushed_) {
            CUcontext ignored = nullptr;
            d_.cuCtxPopCurrent(&ignored);
        }
    }
    CudaContextGuard(const CudaContextGuard &) = delete;
    CudaContextGuard &operator=(const CudaContextGuard &) = delete;
    /// False when the context could not be made current (the calls that follow would fail).
    bool ok() const { return pushed_; }

private:
    const CudaDriver &d_;
    bool pushed_ = false;
};

}  // namespace tensorlane::sidecar
