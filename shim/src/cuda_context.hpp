// The shim's use of CUDA contexts: the driver is tensorlane::cuda's table (libcuda opened at
// run time, cuda/include/tensorlane/cuda/driver.hpp); what is the shim's own is that it never
// creates a context, so it only borrows one the process already has. Without the CUDA toolkit
// at build time there is nothing here: every CUDA path answers TL_ECUDA ("built without
// CUDA").
#pragma once

#include "tensorlane/cuda/driver.hpp"

namespace tensorlane::shim {

#ifdef TENSORLANE_HAVE_CUDA

/// Some context of this process current for a scope: the current one, else an active primary
/// context (retained for the scope). ok() is false when the process has none: then nothing
/// context-bound can be done without creating one, which the shim never does.
class AnyContextGuard {
public:
    explicit AnyContextGuard(const cuda::Driver &d);
    ~AnyContextGuard();
    AnyContextGuard(const AnyContextGuard &) = delete;
    AnyContextGuard &operator=(const AnyContextGuard &) = delete;
    bool ok() const { return ctx_ != nullptr; }
    CUcontext context() const { return ctx_; }

private:
    const cuda::Driver &d_;
    CUcontext ctx_ = nullptr;
    CUdevice retained_ = -1;
    bool pushed_ = false;
};

/// True when the driver is loaded and this process already uses CUDA (someone called cuInit).
bool cudaInUse();

#endif  // TENSORLANE_HAVE_CUDA

}  // namespace tensorlane::shim
