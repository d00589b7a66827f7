#include "cuda_memory.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "cuda_context.hpp"

namespace tensorlane::shim {

std::string hexAddress(uint64_t a) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(a));
    return buf;
}

#ifdef TENSORLANE_HAVE_CUDA

namespace {

/// Whether the VMM allocation `h` was made at a host location with a POSIX-fd handle type
/// (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA, as NCCL makes its host buffers): the
/// sidecar can import that and reach it with its CPU.
bool sharedHostAllocation(const cuda::Driver &d, CUmemGenericAllocationHandle h) {
    CUmemAllocationProp prop{};
    return d.cuMemGetAllocationPropertiesFromHandle(&prop, h) == CUDA_SUCCESS &&
           cuda::atHostLocation(prop) &&
           (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
}

/// The same for the allocation behind `ptr` (false where there is none).
bool vmmHostAllocation(const cuda::Driver &d, const void *ptr) {
    CUmemGenericAllocationHandle h = 0;
    if (d.cuMemRetainAllocationHandle(&h, const_cast<void *>(ptr)) != CUDA_SUCCESS) {
        return false;
    }
    const bool host = sharedHostAllocation(d, h);
    d.cuMemRelease(h);
    return host;
}

}  // namespace

CudaPointer probeCudaPointer(const void *ptr, CudaAllocation *out, std::string *why) {
    const cuda::Driver &d = cuda::driver();
    if (!d.ok || !cudaInUse()) {
        return CudaPointer::kNotCuda;  // no driver, or CUDA not used here: no CUDA memory
    }
    // One call for every attribute. Booleans are written as 32-bit ints; each value has a
    // zeroed 8-byte home so the width never matters.
    CUpointer_attribute attrs[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_BUFFER_ID,   CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_CONTEXT,     CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
    };
    constexpr unsigned kAttrs = sizeof(attrs) / sizeof(attrs[0]);
    uint64_t values[kAttrs] = {};
    void *data[kAttrs];
    for (unsigned i = 0; i < kAttrs; ++i) {
        data[i] = &values[i];
    }
    // Unlike cuPointerGetAttribute, this succeeds for memory CUDA does not know (memory type 0).
    const CUresult rc =
        d.cuPointerGetAttributes(kAttrs, attrs, data, reinterpret_cast<CUdeviceptr>(ptr));
    if (rc != CUDA_SUCCESS) {
        return CudaPointer::kNotCuda;
    }
    const auto as_u32 = [&](unsigned i) {
        uint32_t v = 0;
        std::memcpy(&v, &values[i], sizeof(v));
        return v;
    };
    const uint32_t type = as_u32(0);
    if (type == 0) {
        return CudaPointer::kNotCuda;
    }
    if (as_u32(3) != 0) {
        *why =
            "tl_register: CUDA managed memory (cudaMallocManaged) cannot be shared through "
            "CUDA IPC; use cudaMalloc/cuMemAlloc memory";
        return CudaPointer::kRefused;
    }
    if (type != CU_MEMORYTYPE_DEVICE && vmmHostAllocation(d, ptr)) {
        *out = CudaAllocation{};
        std::memcpy(&out->context, &values[4], sizeof(out->context));
        return CudaPointer::kVmmHost;
    }
    if (type != CU_MEMORYTYPE_DEVICE) {
        *why =
            "tl_register: page-locked host memory from CUDA (cudaMallocHost/cudaHostRegister) "
            "is not shared with the sidecar; use tl_alloc_host, which is pinned for CUDA";
        return CudaPointer::kRefused;
    }
    CudaAllocation a;
    a.ordinal = static_cast<int>(as_u32(1));
    a.buffer_id = values[2];
    std::memcpy(&a.context, &values[4], sizeof(a.context));
    CUdevice dev = 0;
    CUuuid uuid{};
    if (d.cuDeviceGet(&dev, a.ordinal) != CUDA_SUCCESS ||
        d.cuDeviceGetUuid(&uuid, dev) != CUDA_SUCCESS) {
        *why = "tl_register: cannot read the UUID of CUDA device " + std::to_string(a.ordinal);
        return CudaPointer::kRefused;
    }
    std::memcpy(a.uuid.data(), uuid.bytes, a.uuid.size());
    if (as_u32(5) == 0) {
        // No legacy IPC: memory mapped with the VMM calls has a physical allocation behind the
        // address, which cuMemRetainAllocationHandle finds (it fails for everything else).
        CUmemGenericAllocationHandle h = 0;
        if (d.cuMemRetainAllocationHandle(&h, const_cast<void *>(ptr)) == CUDA_SUCCESS) {
            const bool host = sharedHostAllocation(d, h);
            d.cuMemRelease(h);
            *out = a;
            return host ? CudaPointer::kVmmHost : CudaPointer::kVmm;
        }
        *why =
            "tl_register: this device memory can be exported neither with CUDA IPC nor as VMM "
            "memory (cuMemRetainAllocationHandle refused it)";
        return CudaPointer::kRefused;
    }
    CUdeviceptr base = 0;
    size_t bytes = 0;
    CUresult arc;
    {
        cuda::ContextGuard guard(d, static_cast<CUcontext>(a.context));
        arc = d.cuMemGetAddressRange(&base, &bytes, reinterpret_cast<CUdeviceptr>(ptr));
    }
    if (arc != CUDA_SUCCESS) {
        *why = "tl_register: cuMemGetAddressRange: " + d.errorText(arc);
        return CudaPointer::kRefused;
    }
    a.base = base;
    a.bytes = bytes;
    *out = a;
    return CudaPointer::kDevice;
}

namespace {

/// The dma-buf fd of [base, base + bytes rounded up to whole host pages) on device `ordinal`
/// (the current context's), or the CUresult that says why not. It must be taken here, by the
/// owner: the driver refuses it for an IPC-imported pointer (DESIGN.md, data path step 2).
int32_t takeDmabuf(const cuda::Driver &d, int ordinal, uint64_t base, uint64_t bytes,
                   ipc::UniqueFd *out) {
    CUdevice dev = 0;
    int supported = 0;
    if (d.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS ||
        d.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) !=
            CUDA_SUCCESS ||
        supported == 0) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t span = (bytes + page - 1) & ~(page - 1);
    int fd = -1;
    const CUresult rc =
        d.cuMemGetHandleForAddressRange(&fd, base, span, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (rc != CUDA_SUCCESS || fd < 0) {
        return rc != CUDA_SUCCESS ? static_cast<int32_t>(rc) : CUDA_ERROR_UNKNOWN;
    }
    out->reset(fd);
    return 0;
}

/// The allocation's context current for a scope, else any context of the process (VMM memory
/// belongs to no context, and its pointers may report none).
class AllocationContext {
public:
    AllocationContext(const cuda::Driver &d, void *ctx)
        : guard_(d, static_cast<CUcontext>(ctx)), any_(d) {}

private:
    cuda::ContextGuard guard_;
    AnyContextGuard any_;  ///< finds the one just pushed when there was one
};

}  // namespace

ipc::Code exportCudaAllocation(const CudaAllocation &a, CudaExport *out, std::string *why) {
    const cuda::Driver &d = cuda::driver();
    cuda::ContextGuard guard(d, static_cast<CUcontext>(a.context));
    CUipcMemHandle h{};
    if (CUresult rc = d.cuIpcGetMemHandle(&h, a.base); rc != CUDA_SUCCESS) {
        *why = "tl_register: cuIpcGetMemHandle: " + d.errorText(rc);
        return ipc::Code::kCuda;
    }
    static_assert(sizeof(h.reserved) == 64);
    std::memcpy(out->ipc_handle.data(), h.reserved, out->ipc_handle.size());
    out->dmabuf_error = takeDmabuf(d, a.ordinal, a.base, a.bytes, &out->dmabuf);
    return ipc::Code::kOk;
}

namespace {

/// The VMM mapping (one physical allocation) around `at`. cuMemGetAddressRange answers with
/// it for device memory; for host-located memory the driver (580, CUDA 13, seen on the GPU
/// machine with tests/gpu/probe/vmm_probe.c) answers with the allocation's size but a base of
/// 0, and the pointer's range attributes span the whole mapped range (every allocation mapped
/// side by side in the reservation). So where the first answer does not hold `at`, the mapping
/// is found by walking that range from its start, one allocation (its size) at a time. Every
/// answer is checked before it is used. False with `*why`.
bool vmmMappingAround(const cuda::Driver &d, uint64_t at, CUdeviceptr *base, size_t *bytes,
                      std::string *why) {
    const auto holds = [](uint64_t b, uint64_t n, uint64_t a) { return b <= a && a - b < n; };
    CUdeviceptr b = 0;
    size_t n = 0;
    const CUresult rc = d.cuMemGetAddressRange(&b, &n, at);
    if (rc == CUDA_SUCCESS && holds(b, n, at)) {
        *base = b;
        *bytes = n;
        return true;
    }
    if (rc != CUDA_SUCCESS) {
        *why = "cuMemGetAddressRange(" + hexAddress(at) + "): " + d.errorText(rc);
        return false;
    }
    unsigned long long start = 0;
    size_t size = 0;
    const CUresult r1 = d.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at);
    const CUresult r2 = d.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at);
    if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS || !holds(start, size, at)) {
        *why = "cuMemGetAddressRange(" + hexAddress(at) + ") gives [" + hexAddress(b) + ", +" +
               std::to_string(n) + "), and its range attributes " +
               (r1 == CUDA_SUCCESS && r2 == CUDA_SUCCESS
                    ? "[" + hexAddress(start) + ", +" + std::to_string(size) + ")"
                    : d.errorText(r1 != CUDA_SUCCESS ? r1 : r2));
        return false;
    }
    uint64_t p = start;
    for (size_t step = 0; step <= ipc::kMaxVmmPieces * 4 && holds(start, size, p); ++step) {
        CUdeviceptr pb = 0;
        size_t pn = 0;
        if (CUresult prc = d.cuMemGetAddressRange(&pb, &pn, p); prc != CUDA_SUCCESS || pn == 0) {
            *why = "the VMM range [" + hexAddress(start) + ", +" + std::to_string(size) +
                   ") has no allocation at " + hexAddress(p) +
                   " (cuMemGetAddressRange: " + d.errorText(prc) + ")";
            return false;
        }
        if (holds(p, pn, at)) {
            *base = p;
            *bytes = pn;
            return true;
        }
        p += pn;
    }
    *why = "no allocation of the VMM range [" + hexAddress(start) + ", +" + std::to_string(size) +
           ") holds " + hexAddress(at);
    return false;
}

}  // namespace

ipc::Code exportVmmRange(const CudaAllocation &a, uint64_t ptr, uint64_t bytes, VmmExport *out,
                         std::string *why) {
    const cuda::Driver &d = cuda::driver();
    AllocationContext ctx(d, a.context);
    // The pieces, from the one that holds `ptr` to the one that holds the range's last byte:
    // cuMemGetAddressRange of VMM memory answers with the one mapping (one physical
    // allocation) around an address, so the next piece starts where this one ends; an
    // address with nothing mapped ends the walk with an error.
    const uint64_t last = ptr + (bytes == 0 ? 0 : bytes - 1);
    uint64_t at = ptr;
    bool shareable = true;
    for (;;) {
        CUdeviceptr pbase = 0;
        size_t pbytes = 0;
        if (std::string whynot; !vmmMappingAround(d, at, &pbase, &pbytes, &whynot)) {
            *why = "tl_register: [" + hexAddress(ptr) + ", +" + std::to_string(bytes) +
                   ") is not all mapped VMM memory: " + whynot;
            return ipc::Code::kCuda;
        }
        if (out->pieces.empty()) {
            out->base = pbase;
        } else if (pbase != out->base + out->bytes || pbytes == 0) {
            *why = "tl_register: the VMM mapping around " + hexAddress(at) +
                   " does not follow the one before it";
            return ipc::Code::kCuda;
        }
        if (out->pieces.size() >= ipc::kMaxVmmPieces) {
            *why = "tl_register: the range spans more than " + std::to_string(ipc::kMaxVmmPieces) +
                   " VMM allocations";
            return ipc::Code::kCuda;
        }
        out->pieces.push_back({out->bytes, pbytes});
        out->bytes += pbytes;
        // Its fd, where the allocation was made with a POSIX-fd handle type.
        CUmemGenericAllocationHandle h = 0;
        if (shareable) {
            CUresult rc = d.cuMemRetainAllocationHandle(&h, reinterpret_cast<void *>(pbase));
            CUmemAllocationProp prop{};
            if (rc == CUDA_SUCCESS) {
                rc = d.cuMemGetAllocationPropertiesFromHandle(&prop, h);
            }
            int fd = -1;
            if (rc == CUDA_SUCCESS &&
                (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
                out->no_fd_reason =
                    "the cuMemCreate allocation was made without "
                    "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in requestedHandleTypes";
                shareable = false;
            } else if (rc == CUDA_SUCCESS) {
                rc = d.cuMemExportToShareableHandle(&fd, h,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            }
            if (h != 0) {
                d.cuMemRelease(h);  // the retain's reference; the mapping keeps its own
            }
            if (shareable && (rc != CUDA_SUCCESS || fd < 0)) {
                out->no_fd_reason = "cuMemExportToShareableHandle: " + d.errorText(rc);
                shareable = false;
            }
            if (shareable) {
                out->fds.emplace_back(fd);
            }
        }
        if (pbase + pbytes > last) {
            break;
        }
        at = pbase + pbytes;
    }
    if (!shareable) {
        out->fds.clear();
    }
    out->dmabuf_error = takeDmabuf(d, a.ordinal, out->base, out->bytes, &out->dmabuf);
    if (!shareable && !out->dmabuf) {
        *why = "tl_register: this VMM memory cannot be shared: " + out->no_fd_reason +
               ", and its dma-buf cannot be taken (cuMemGetHandleForAddressRange: " +
               d.errorText(static_cast<CUresult>(out->dmabuf_error)) + ")";
        return ipc::Code::kCuda;
    }
    return ipc::Code::kOk;
}

bool pinHostForCuda(void *base, size_t bytes) {
    const cuda::Driver &d = cuda::driver();
    if (!d.ok || !cudaInUse()) {
        return false;
    }
    AnyContextGuard ctx(d);
    // Portable: usable from every context of this process; device-mapped: kernels may read it.
    return ctx.ok() && d.cuMemHostRegister(base, bytes,
                                           CU_MEMHOSTREGISTER_PORTABLE |
                                               CU_MEMHOSTREGISTER_DEVICEMAP) == CUDA_SUCCESS;
}

void unpinHostForCuda(void *base) {
    const cuda::Driver &d = cuda::driver();
    if (d.ok) {
        AnyContextGuard ctx(d);
        if (ctx.ok()) {
            d.cuMemHostUnregister(base);
        }
    }
}

#else  // no CUDA toolkit at build time

CudaPointer probeCudaPointer(const void *, CudaAllocation *, std::string *) {
    return CudaPointer::kNotCuda;
}
ipc::Code exportCudaAllocation(const CudaAllocation &, CudaExport *, std::string *why) {
    *why = "this libtensorlane was built without the CUDA toolkit";
    return ipc::Code::kCuda;
}
ipc::Code exportVmmRange(const CudaAllocation &, uint64_t, uint64_t, VmmExport *,
                         std::string *why) {
    *why = "this libtensorlane was built without the CUDA toolkit";
    return ipc::Code::kCuda;
}
bool pinHostForCuda(void *, size_t) {
    return false;
}
void unpinHostForCuda(void *) {}

#endif

}  // namespace tensorlane::shim
