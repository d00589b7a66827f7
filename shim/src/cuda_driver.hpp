// The CUDA driver API as the shim uses it: libcuda.so.1 opened at run time (dlopen), never
// linked, so libtensorlane.so loads on machines with no GPU or driver and says so clearly.
//
// Each entry point is looked up under the versioned name that cuda.h maps its name to
// (cuMemGetAddressRange -> "cuMemGetAddressRange_v2"), so the pointer's type is the header's
// own prototype for that symbol. Without the CUDA toolkit at build time there is no table:
// every CUDA path answers TL_ECUDA ("built without CUDA").
#pragma once

#include <string>

#ifdef TENSORLANE_HAVE_CUDA
#include <cuda.h>
#endif

namespace tensorlane::shim {

#ifdef TENSORLANE_HAVE_CUDA

// The driver calls of the shim, one X(name) each.
#define TL_SHIM_CUDA_CALLS(X)        \
    X(cuGetErrorName)                \
    X(cuGetErrorString)              \
    X(cuDeviceGet)                   \
    X(cuDeviceGetCount)              \
    X(cuDeviceGetUuid)               \
    X(cuDeviceGetAttribute)          \
    X(cuDevicePrimaryCtxGetState)    \
    X(cuDevicePrimaryCtxRetain)      \
    X(cuDevicePrimaryCtxRelease)     \
    X(cuCtxGetCurrent)               \
    X(cuCtxPushCurrent)              \
    X(cuCtxPopCurrent)               \
    X(cuPointerGetAttribute)         \
    X(cuPointerGetAttributes)        \
    X(cuMemGetAddressRange)          \
    X(cuIpcGetMemHandle)             \
    X(cuMemGetHandleForAddressRange) \
    X(cuMemHostRegister)             \
    X(cuMemHostUnregister)           \
    X(cuMemHostGetDevicePointer)     \
    X(cuStreamGetCtx)                \
    X(cuStreamIsCapturing)           \
    X(cuStreamWriteValue32)          \
    X(cuStreamWaitValue32)

/// The loaded driver. `ok` false: `why` says what is missing (no libcuda, no device, a symbol).
struct CudaDriver {
#define TL_SHIM_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
    TL_SHIM_CUDA_CALLS(TL_SHIM_CUDA_MEMBER)
#undef TL_SHIM_CUDA_MEMBER
    bool ok = false;
    std::string why;

    /// "CUDA_ERROR_INVALID_VALUE (invalid argument)" for a CUresult.
    std::string errorText(CUresult rc) const;
};

/// The process's driver table, loaded on first use; thread-safe. It never calls cuInit: a process
/// that has not initialised CUDA itself holds no CUDA memory, and the shim must not give it a
/// context (hundreds of MiB of GPU memory) it did not ask for.
const CudaDriver &cudaDriver();

/// Makes a context current for a scope and restores the previous one (the device guard of
/// STYLE.md): the shim never leaves the application's thread with another current context.
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

private:
    const CudaDriver &d_;
    bool pushed_ = false;
};

/// Some context of this process current for a scope: the current one, else an active primary
/// context (retained for the scope). ok() is false when the process has none: then nothing
/// context-bound can be done without creating one, which the shim never does.
class AnyContextGuard {
public:
    explicit AnyContextGuard(const CudaDriver &d);
    ~AnyContextGuard();
    AnyContextGuard(const AnyContextGuard &) = delete;
    AnyContextGuard &operator=(const AnyContextGuard &) = delete;
    bool ok() const { return ctx_ != nullptr; }
    CUcontext context() const { return ctx_; }

private:
    const CudaDriver &d_;
    CUcontext ctx_ = nullptr;
    CUdevice retained_ = -1;
    bool pushed_ = false;
};

/// True when the driver is loaded and this process already uses CUDA (someone called cuInit).
bool cudaInUse();

#endif  // TENSORLANE_HAVE_CUDA

}  // namespace tensorlane::shim
