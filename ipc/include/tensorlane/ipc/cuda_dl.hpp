// The CUDA driver opened at run time, as the shim and the sidecar both do: nothing in tensorlane
// links libcuda, so the same binaries run where there is no driver and say why. Each side keeps
// its own table of entry points (an X-macro list in its cuda driver header); this is the part
// they share: opening the library, binding one entry point, naming a CUresult.
#pragma once

#include <dlfcn.h>

#include <string>

namespace tensorlane::ipc::cudadl {

/// libcuda.so.1, or null with `*why` set. RTLD_LOCAL: the driver's symbols stay out of the
/// application's namespace; RTLD_NOW: a missing one is found here, not at the first call. Never
/// dlclose'd: the callers' tables point into it for the life of the process.
inline void *openDriver(std::string *why) {
    void *lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        *why = "no CUDA driver (libcuda.so.1) on this machine";
    }
    return lib;
}

/// Binds `*out` to `symbol` (the versioned name cuda.h maps the call to, e.g.
/// "cuMemGetAddressRange_v2"); false with `*why` set when the driver lacks it.
template <class Fn>
bool bind(void *lib, const char *symbol, Fn **out, std::string *why) {
    *out = reinterpret_cast<Fn *>(::dlsym(lib, symbol));
    if (*out == nullptr) {
        *why = std::string("the CUDA driver lacks ") + symbol +
               " (a driver older than the CUDA toolkit this was built with)";
        return false;
    }
    return true;
}

/// "CUDA_ERROR_X (text)" for `rc`, through the table's cuGetErrorName / cuGetErrorString when
/// it has them.
template <class Driver, class Result>
std::string errorText(const Driver &d, Result rc) {
    const char *name = nullptr;
    const char *text = nullptr;
    if (d.cuGetErrorName != nullptr) {
        d.cuGetErrorName(rc, &name);
    }
    if (d.cuGetErrorString != nullptr) {
        d.cuGetErrorString(rc, &text);
    }
    std::string out = name != nullptr ? name : "CUDA error " + std::to_string(rc);
    if (text != nullptr) {
        out += std::string(" (") + text + ")";
    }
    return out;
}

}  // namespace tensorlane::ipc::cudadl
