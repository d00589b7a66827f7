#include "cuda_driver.hpp"

#ifdef TENSORLANE_HAVE_CUDA

#include <mutex>

#include "tensorlane/ipc/cuda_dl.hpp"

namespace tensorlane::shim {
namespace {

// The symbol cuda.h maps a name to ("cuMemGetAddressRange" -> "cuMemGetAddressRange_v2"): the
// argument is macro-expanded before it is stringised.
#define TL_SHIM_CUDA_SYMBOL_(x) #x
#define TL_SHIM_CUDA_SYMBOL(x) TL_SHIM_CUDA_SYMBOL_(x)

void load(CudaDriver *d) {
    void *lib = ipc::cudadl::openDriver(&d->why);
    if (lib == nullptr) {
        return;
    }
#define TL_SHIM_CUDA_LOAD(name)                                                  \
    if (!ipc::cudadl::bind(lib, TL_SHIM_CUDA_SYMBOL(name), &d->name, &d->why)) { \
        return;                                                                  \
    }
    TL_SHIM_CUDA_CALLS(TL_SHIM_CUDA_LOAD)
#undef TL_SHIM_CUDA_LOAD
    d->ok = true;
}

}  // namespace

std::string CudaDriver::errorText(CUresult rc) const {
    return ipc::cudadl::errorText(*this, rc);
}

const CudaDriver &cudaDriver() {
    static CudaDriver d;
    static std::once_flag once;
    std::call_once(once, [] { load(&d); });
    return d;
}

AnyContextGuard::AnyContextGuard(const CudaDriver &d) : d_(d) {
    if (!d_.ok) {
        return;
    }
    CUcontext ctx = nullptr;
    if (d_.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr) {
        ctx_ = ctx;  // already current: nothing to push
        return;
    }
    int n = 0;
    if (d_.cuDeviceGetCount(&n) != CUDA_SUCCESS) {
        return;
    }
    for (int i = 0; i < n; ++i) {
        CUdevice dev = 0;
        unsigned flags = 0;
        int active = 0;
        // Only a primary context something in this process already made: retaining an
        // inactive one would create it.
        if (d_.cuDeviceGet(&dev, i) == CUDA_SUCCESS &&
            d_.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && active != 0 &&
            d_.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS) {
            retained_ = dev;
            ctx_ = ctx;
            pushed_ = d_.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
            return;
        }
    }
}

AnyContextGuard::~AnyContextGuard() {
    if (pushed_) {
        CUcontext ignored = nullptr;
        d_.cuCtxPopCurrent(&ignored);
    }
    if (retained_ >= 0) {
        d_.cuDevicePrimaryCtxRelease(retained_);
    }
}

bool cudaInUse() {
    const CudaDriver &d = cudaDriver();
    if (!d.ok) {
        return false;
    }
    CUcontext ctx = nullptr;
    return d.cuCtxGetCurrent(&ctx) != CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace tensorlane::shim

#endif  // TENSORLANE_HAVE_CUDA
