#include "cuda_context.hpp"

#ifdef TENSORLANE_HAVE_CUDA

namespace tensorlane::shim {

AnyContextGuard::AnyContextGuard(const cuda::Driver &d) : d_(d) {
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
    const cuda::Driver &d = cuda::driver();
    if (!d.ok) {
        return false;
    }
    CUcontext ctx = nullptr;
    return d.cuCtxGetCurrent(&ctx) != CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace tensorlane::shim

#endif  // TENSORLANE_HAVE_CUDA
