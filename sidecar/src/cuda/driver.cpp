#include "cuda/driver.hpp"

#include <mutex>

#include "tensorlane/ipc/cuda_dl.hpp"

namespace tensorlane::sidecar {
namespace {

// The symbol cuda.h maps a name to: the argument is macro-expanded before it is stringised.
#define TL_SIDECAR_CUDA_SYMBOL_(x) #x
#define TL_SIDECAR_CUDA_SYMBOL(x) TL_SIDECAR_CUDA_SYMBOL_(x)

void load(CudaDriver *d) {
    void *lib = ipc::cudadl::openDriver(&d->why);
    if (lib == nullptr) {
        return;
    }
#define TL_SIDECAR_CUDA_LOAD(name)                                                  \
    if (!ipc::cudadl::bind(lib, TL_SIDECAR_CUDA_SYMBOL(name), &d->name, &d->why)) { \
        return;                                                                     \
    }
    TL_SIDECAR_CUDA_CALLS(TL_SIDECAR_CUDA_LOAD)
#undef TL_SIDECAR_CUDA_LOAD
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

}  // namespace tensorlane::sidecar
