#include "cuda_memory.hpp"

#include <unistd.h>

#include <cstring>

#include "cuda_context.hpp"

namespace tensorlane::shim {

#ifdef TENSORLANE_HAVE_CUDA

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
    if (type != CU_MEMORYTYPE_DEVICE) {
        *why =
            "tl_register: page-locked host memory from CUDA (cudaMallocHost/cudaHostRegister) "
            "is not shared with the sidecar; use tl_alloc_host, which is pinned for CUDA";
        return CudaPointer::kRefused;
    }
    if (as_u32(5) == 0) {
        *why =
            "tl_register: this device memory cannot be exported with CUDA IPC (a cuMemCreate "
            "allocation? PyTorch: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)";
        return CudaPointer::kRefused;
    }
    CudaAllocation a;
    a.ordinal = static_cast<int>(as_u32(1));
    a.buffer_id = values[2];
    std::memcpy(&a.context, &values[4], sizeof(a.context));
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
    CUdevice dev = 0;
    CUuuid uuid{};
    if (d.cuDeviceGet(&dev, a.ordinal) != CUDA_SUCCESS ||
        d.cuDeviceGetUuid(&uuid, dev) != CUDA_SUCCESS) {
        *why = "tl_register: cannot read the UUID of CUDA device " + std::to_string(a.ordinal);
        return CudaPointer::kRefused;
    }
    std::memcpy(a.uuid.data(), uuid.bytes, a.uuid.size());
    *out = a;
    return CudaPointer::kDevice;
}

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
    // The dma-buf fd must be taken here, by the owner: the driver refuses it for an IPC-imported
    // pointer (DESIGN.md, data path step 2). Its range must be whole host pages.
    CUdevice dev = 0;
    int supported = 0;
    if (d.cuDeviceGet(&dev, a.ordinal) != CUDA_SUCCESS ||
        d.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) !=
            CUDA_SUCCESS ||
        supported == 0) {
        out->dmabuf_error = CUDA_ERROR_NOT_SUPPORTED;
        return ipc::Code::kOk;
    }
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t span = (a.bytes + page - 1) & ~(page - 1);
    int fd = -1;
    const CUresult rc =
        d.cuMemGetHandleForAddressRange(&fd, a.base, span, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (rc != CUDA_SUCCESS || fd < 0) {
        out->dmabuf_error = rc != CUDA_SUCCESS ? static_cast<int32_t>(rc) : CUDA_ERROR_UNKNOWN;
        return ipc::Code::kOk;
    }
    out->dmabuf.reset(fd);
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
bool pinHostForCuda(void *, size_t) {
    return false;
}
void unpinHostForCuda(void *) {}

#endif

}  // namespace tensorlane::shim
