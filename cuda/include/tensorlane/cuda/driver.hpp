// The CUDA driver API as tensorlane uses it, in the shim and in the sidecar alike:
// libcuda.so.1 opened at run time (dlopen), never linked, so libtensorlane.so and
// tensorlane-sidecar load on machines with no GPU or driver and say so clearly.
//
// One table of entry points, the union of what the shim and the sidecar call, loaded on first
// use, once, thread-safe. Loading never calls cuInit: a process that has not initialised CUDA
// itself holds no CUDA memory, and the shim must not give it a context (hundreds of MiB of GPU
// memory) it did not ask for; the sidecar calls cuInit itself. Each entry point is looked up
// under the versioned name that cuda.h maps its name to (cuMemGetAddressRange ->
// "cuMemGetAddressRange_v2"), so the pointer's type is the header's own prototype for that
// symbol.
//
// Without the CUDA toolkit at build time there is no cuda.h to type a table with: then only
// the library handle and bind() are here (the shim's pointer probe uses them), and every CUDA
// path of the shim and the sidecar says "built without CUDA".
#pragma once

#include <string>

#ifdef TENSORLANE_HAVE_CUDA
#include <cuda.h>
#endif

namespace tensorlane::cuda {

/// libcuda.so.1 as opened once for this process's tables.
struct Library {
    void *handle = nullptr;  ///< null: `why` says so
    std::string why;
};

/// Opens libcuda.so.1 on first use (thread-safe). RTLD_LOCAL: the driver's symbols stay out
/// of the application's namespace; RTLD_NOW: a missing one is found here, not at the first
/// call. Never dlclose'd: the tables point into it for the life of the process.
const Library &library();

/// The address of `name` in `lib`; null with `*why` set when the driver lacks it.
void *symbol(void *lib, const char *name, std::string *why);

/// Binds `*out` to `symbol` (the versioned name cuda.h maps the call to, e.g.
/// "cuMemGetAddressRange_v2"); false with `*why` set when the driver lacks it.
template <class Fn>
bool bind(void *lib, const char *name, Fn **out, std::string *why) {
    *out = reinterpret_cast<Fn *>(symbol(lib, name, why));
    return *out != nullptr;
}

#ifdef TENSORLANE_HAVE_CUDA

// The driver calls of tensorlane, one X(name) each: the sidecar's, then those only the shim
// makes.
#define TL_CUDA_DRIVER_CALLS(X)               \
    X(cuInit)                                 \
    X(cuGetErrorName)                         \
    X(cuGetErrorString)                       \
    X(cuDriverGetVersion)                     \
    X(cuDeviceGet)                            \
    X(cuDeviceGetCount)                       \
    X(cuDeviceGetUuid)                        \
    X(cuDeviceGetName)                        \
    X(cuDeviceGetAttribute)                   \
    X(cuDeviceCanAccessPeer)                  \
    X(cuDevicePrimaryCtxRetain)               \
    X(cuDevicePrimaryCtxRelease)              \
    X(cuCtxPushCurrent)                       \
    X(cuCtxSetCurrent)                        \
    X(cuCtxPopCurrent)                        \
    X(cuCtxEnablePeerAccess)                  \
    X(cuIpcOpenMemHandle)                     \
    X(cuIpcCloseMemHandle)                    \
    X(cuMemGetAddressRange)                   \
    X(cuMemImportFromShareableHandle)         \
    X(cuMemGetAllocationPropertiesFromHandle) \
    X(cuMemRelease)                           \
    X(cuMemAddressReserve)                    \
    X(cuMemAddressFree)                       \
    X(cuMemMap)                               \
    X(cuMemUnmap)                             \
    X(cuMemSetAccess)                         \
    X(cuMemHostRegister)                      \
    X(cuMemHostUnregister)                    \
    X(cuMemGetInfo)                           \
    X(cuStreamCreate)                         \
    X(cuStreamDestroy)                        \
    X(cuEventCreate)                          \
    X(cuEventDestroy)                         \
    X(cuEventRecord)                          \
    X(cuEventQuery)                           \
    X(cuStreamQuery)                          \
    X(cuMemcpyAsync)                          \
    X(cuDevicePrimaryCtxGetState)             \
    X(cuCtxGetCurrent)                        \
    X(cuPointerGetAttribute)                  \
    X(cuPointerGetAttributes)                 \
    X(cuIpcGetMemHandle)                      \
    X(cuMemGetHandleForAddressRange)          \
    X(cuMemRetainAllocationHandle)            \
    X(cuMemExportToShareableHandle)           \
    X(cuMemHostGetDevicePointer)              \
    X(cuStreamGetCtx)                         \
    X(cuStreamIsCapturing)                    \
    X(cuStreamWriteValue32)                   \
    X(cuStreamWaitValue32)

/// The loaded driver. `ok` false: `why` says what is missing (no libcuda, a symbol).
struct Driver {
#define TL_CUDA_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
    TL_CUDA_DRIVER_CALLS(TL_CUDA_DRIVER_MEMBER)
#undef TL_CUDA_DRIVER_MEMBER
    bool ok = false;
    std::string why;

    /// "CUDA_ERROR_INVALID_VALUE (invalid argument)" for a CUresult.
    std::string errorText(CUresult rc) const;
};

/// The process's driver table, loaded on first use (no cuInit); thread-safe.
const Driver &driver();

/// Whether a VMM allocation with these properties lives in host memory (cuMemCreate at
/// CU_MEM_LOCATION_TYPE_HOST, _HOST_NUMA or _HOST_NUMA_CURRENT): a CPU may touch it once mapped
/// for it; device memory it may not (docs/gpu.md, "VMM memory").
inline bool atHostLocation(const CUmemAllocationProp &prop) {
    return prop.location.type == CU_MEM_LOCATION_TYPE_HOST ||
           prop.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
           prop.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

/// Makes `ctx` current for a scope and restores the previous context (the device guard of
/// STYLE.md): a thread is never left with another current context.
class ContextGuard {
public:
    ContextGuard(const Driver &d, CUcontext ctx) : d_(d) {
        pushed_ = ctx != nullptr && d_.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
    }
    ~ContextGuard() {
        if (pushed_) {
            CUcontext ignored = nullptr;
            d_.cuCtxPopCurrent(&ignored);
        }
    }
    ContextGuard(const ContextGuard &) = delete;
    ContextGuard &operator=(const ContextGuard &) = delete;
    /// False when the context could not be made current (the calls that follow would fail).
    bool ok() const { return pushed_; }

private:
    const Driver &d_;
    bool pushed_ = false;
};

#endif  // TENSORLANE_HAVE_CUDA

}  // namespace tensorlane::cuda
