#include "cuda_probe.hpp"

#include <cstdint>
#include <mutex>
#include <string>

#include "tensorlane/cuda/driver.hpp"

namespace tensorlane::shim {
namespace {

// The two driver entry points we need, with the ABI of cuda.h (CUresult is an int enum,
// CUpointer_attribute CU_POINTER_ATTRIBUTE_MEMORY_TYPE is 2, CU_MEMORYTYPE_DEVICE is 2).
using CuInit = int (*)(unsigned);
using CuPointerGetAttribute = int (*)(void *, int, uintptr_t);
constexpr int kAttrMemoryType = 2;
constexpr unsigned kMemoryTypeDevice = 2;
#ifdef TENSORLANE_HAVE_CUDA
// Built with the toolkit: check the values we rely on against its header.
static_assert(kAttrMemoryType == CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
static_assert(kMemoryTypeDevice == CU_MEMORYTYPE_DEVICE);
static_assert(sizeof(CUresult) == sizeof(int));
#endif

// The two entry points, bound by hand from tensorlane::cuda's library: a build without the
// toolkit has no cuda.h to type its table with.
struct Driver {
    CuPointerGetAttribute get_attribute = nullptr;
    bool ok = false;
};

const Driver &driver() {
    static Driver d;
    static std::once_flag once;
    std::call_once(once, [] {
        void *lib = cuda::library().handle;
        if (!lib) {
            return;  // no driver: every pointer is a host pointer to us
        }
        std::string ignored;
        CuInit init = nullptr;
        (void)cuda::bind(lib, "cuInit", &init, &ignored);
        (void)cuda::bind(lib, "cuPointerGetAttribute", &d.get_attribute, &ignored);
        d.ok = init && d.get_attribute && init(0) == 0;
    });
    return d;
}

}  // namespace

PointerKind probePointer(const void *ptr) {
    const Driver &d = driver();
    if (!d.ok) {
        return PointerKind::kHost;
    }
    unsigned type = 0;
    int rc = d.get_attribute(&type, kAttrMemoryType, reinterpret_cast<uintptr_t>(ptr));
    if (rc != 0) {
        return PointerKind::kHost;  // CUDA_ERROR_INVALID_VALUE: not memory CUDA knows
    }
    return type == kMemoryTypeDevice ? PointerKind::kCudaDevice : PointerKind::kHost;
}

}  // namespace tensorlane::shim
