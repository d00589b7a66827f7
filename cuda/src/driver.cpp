#include "tensorlane/cuda/driver.hpp"

#include <dlfcn.h>

namespace tensorlane::cuda {
namespace {

Library open() {
    Library lib;
    lib.handle = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib.handle == nullptr) {
        lib.why = "no CUDA driver (libcuda.so.1) on this machine";
    }
    return lib;
}

}  // namespace

const Library &library() {
    static const Library lib = open();  // initialised once, thread-safe ([stmt.dcl])
    return lib;
}

void *symbol(void *lib, const char *name, std::string *why) {
    void *p = ::dlsym(lib, name);
    if (p == nullptr) {
        *why = std::string("the CUDA driver lacks ") + name +
               " (a driver older than the CUDA toolkit this was built with)";
    }
    return p;
}

#ifdef TENSORLANE_HAVE_CUDA

namespace {

// The symbol cuda.h maps a name to ("cuMemGetAddressRange" -> "cuMemGetAddressRange_v2"): the
// argument is macro-expanded before it is stringised.
#define TL_CUDA_DRIVER_SYMBOL_(x) #x
#define TL_CUDA_DRIVER_SYMBOL(x) TL_CUDA_DRIVER_SYMBOL_(x)

Driver load() {
    Driver d;
    const Library &lib = library();
    if (lib.handle == nullptr) {
        d.why = lib.why;
        return d;
    }
#define TL_CUDA_DRIVER_LOAD(name)                                          \
    if (!bind(lib.handle, TL_CUDA_DRIVER_SYMBOL(name), &d.name, &d.why)) { \
        return d;                                                          \
    }
    TL_CUDA_DRIVER_CALLS(TL_CUDA_DRIVER_LOAD)
#undef TL_CUDA_DRIVER_LOAD
    d.ok = true;
    return d;
}

}  // namespace

std::string Driver::errorText(CUresult rc) const {
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

const Driver &driver() {
    static const Driver d = load();  // initialised once, thread-safe ([stmt.dcl])
    return d;
}

#endif  // TENSORLANE_HAVE_CUDA

}  // namespace tensorlane::cuda
