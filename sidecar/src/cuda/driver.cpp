#include "cuda/driver.hpp"

#include <dlfcn.h>

#include <mutex>

namespace tensorlane::sidecar {
namespace {

// The symbol cuda.h maps a name to: the argument is macro-expanded before it is stringised.
#define TL_SIDECAR_CUDA_SYMBOL_(x) #x
#define TL_SIDECAR_CUDA_SYMBOL(x) TL_SIDECAR_CUDA_SYMBOL_(x)

void load(CudaDriver *d) {
    void *lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        d->why = "no CUDA driver (libcuda.so.1) on this machine";
        return;
    }
#define TL_SIDECAR_CUDA_LOAD(name)                                                             \
    d->name = reinterpret_cast<decltype(d->name)>(::dlsym(lib, TL_SIDECAR_CUDA_SYMBOL(name))); \
    if (d->name == nullptr) {                                                                  \
        d->why = std::string("the CUDA driver lacks ") + TL_SIDECAR_CUDA_SYMBOL(name) +        \
                 " (a driver older than the toolkit this sidecar was built with)";             \
        return;                                                                                \
    }
    TL_SIDECAR_CUDA_CALLS(TL_SIDECAR_CUDA_LOAD)
#undef TL_SIDECAR_CUDA_LOAD
    // Never dlclose'd: this table points into it for the life of the process.
    d->ok = true;
}

}  // namespace

std::string CudaDriver::errorText(CUresult rc) const {
    const char *name = nullptr;
    const char *text = nullptr;
    if (cuGetErrorName != nullptr) {
        cuGetErrorName(rc, &name);
    }
    if (cuGetErrorString != nullptr) {
        cuGetErrorString(rc, &text);
    }
    std::string out = name != nullptr ? name : "CUDA error " + std::to_string(rc);
    if (text != nullptr) {
        out += std::string(" (") + text + ")";
    }
    return out;
}

const CudaDriver &cudaDriver() {
    static CudaDriver d;
    static std::once_flag once;
    std::call_once(once, [] { load(&d); });
    return d;
}

}  // namespace tensorlane::sidecar
