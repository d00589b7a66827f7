#include "cuda/runtime.hpp"

#include <pthread.h>

#ifdef TENSORLANE_HAVE_CUDA
#include "tensorlane/cuda/driver.hpp"
#endif

namespace tensorlane::sidecar {

CudaRuntime &CudaRuntime::get() {
    // Deliberately leaked: imports may be released by any thread until the process ends, and
    // the driver's own teardown at exit must not race a destructor of ours.
    static CudaRuntime *rt = new CudaRuntime();
    return *rt;
}

int CudaRuntime::ordinalOf(const CudaUuid &uuid) const {
    for (size_t i = 0; i < devices_.size(); ++i) {
        if (devices_[i].uuid == uuid) {
            return static_cast<int>(i);
        }
    }
    return -1;
}

std::string CudaRuntime::deviceName(int ordinal) const {
    if (ordinal < 0 || ordinal >= deviceCount()) {
        return "unknown device";
    }
    return devices_[ordinal].name + " (" + std::to_string(ordinal) + ")";
}

void CudaRuntime::defer(std::function<void()> fn) {
    std::lock_guard lock(rel_mu_);
    if (!rel_started_) {
        rel_started_ = true;
        // Detached: the runtime lives as long as the process (get()).
        std::thread([this] {
            pthread_setname_np(pthread_self(), "tl-cuda-release");
            releaseLoop();
        }).detach();
    }
    rel_queue_.push_back(std::move(fn));
    rel_cv_.notify_one();
}

void CudaRuntime::releaseLoop() {
    std::unique_lock lock(rel_mu_);
    for (;;) {
        rel_cv_.wait(lock, [this] { return !rel_queue_.empty(); });
        std::function<void()> fn = std::move(rel_queue_.front());
        rel_queue_.pop_front();
        lock.unlock();
        fn();
        fn = nullptr;  // what it captured (the last reference to a mapping) goes here, too
        lock.lock();
    }
}

#ifdef TENSORLANE_HAVE_CUDA

std::string CudaRuntime::errorText(int rc) {
    return cuda::driver().errorText(static_cast<CUresult>(rc));
}

CudaRuntime::CudaRuntime() {
    const cuda::Driver &d = cuda::driver();
    if (!d.ok) {
        why_ = d.why;
        return;
    }
    if (CUresult rc = d.cuInit(0); rc != CUDA_SUCCESS) {
        why_ = "cuInit: " + d.errorText(rc);
        return;
    }
    int n = 0;
    if (CUresult rc = d.cuDeviceGetCount(&n); rc != CUDA_SUCCESS || n == 0) {
        why_ = rc != CUDA_SUCCESS ? "cuDeviceGetCount: " + d.errorText(rc)
                                  : std::string("the CUDA driver sees no GPU");
        return;
    }
    for (int i = 0; i < n; ++i) {
        CUdevice dev = 0;
        CUuuid uuid{};
        char name[128] = {};
        Device entry;
        if (d.cuDeviceGet(&dev, i) == CUDA_SUCCESS &&
            d.cuDeviceGetUuid(&uuid, dev) == CUDA_SUCCESS) {
            std::copy(uuid.bytes, uuid.bytes + 16, entry.uuid.begin());
        }
        if (d.cuDeviceGetName(name, sizeof(name) - 1, dev) == CUDA_SUCCESS) {
            entry.name = name;
        }
        devices_.push_back(entry);
    }
    available_ = true;
}

Status CudaRuntime::context(int ordinal, void **ctx) {
    if (!available_) {
        return {Code::kCuda, why_};
    }
    if (ordinal < 0 || ordinal >= deviceCount()) {
        return {Code::kCuda, "no CUDA device " + std::to_string(ordinal) + " in the sidecar"};
    }
    const cuda::Driver &d = cuda::driver();
    std::lock_guard lock(ctx_mu_);
    Device &dev = devices_[ordinal];
    if (dev.ctx == nullptr) {
        CUdevice cu = 0;
        CUcontext c = nullptr;
        CUresult rc = d.cuDeviceGet(&cu, ordinal);
        if (rc == CUDA_SUCCESS) {
            rc = d.cuDevicePrimaryCtxRetain(&c, cu);
        }
        if (rc != CUDA_SUCCESS) {
            return {Code::kCuda,
                    "cuDevicePrimaryCtxRetain(" + deviceName(ordinal) + "): " + d.errorText(rc)};
        }
        dev.ctx = c;
        // Peer access both ways with every device already in use, so one copy can read one GPU
        // and write another (NVLink where there is one). Failure only makes such copies go
        // through host memory, so it is not an error.
        for (int j = 0; j < deviceCount(); ++j) {
            if (j == ordinal || devices_[j].ctx == nullptr) {
                continue;
            }
            CUdevice other = 0;
            int can = 0;
            if (d.cuDeviceGet(&other, j) != CUDA_SUCCESS ||
                d.cuDeviceCanAccessPeer(&can, cu, other) != CUDA_SUCCESS || can == 0) {
                continue;
            }
            {
                cuda::ContextGuard g(d, c);
                d.cuCtxEnablePeerAccess(static_cast<CUcontext>(devices_[j].ctx), 0);
            }
            {
                cuda::ContextGuard g(d, static_cast<CUcontext>(devices_[j].ctx));
                d.cuCtxEnablePeerAccess(c, 0);
            }
        }
    }
    *ctx = dev.ctx;
    return Status::ok();
}

Status CudaRuntime::openIpc(const CudaIpcHandle &handle, int ordinal, uint32_t uid,
                            std::shared_ptr<CudaIpcMapping> *out) {
    if (!available_) {
        return {Code::kCuda, why_};
    }
    std::lock_guard lock(ipc_mu_);
    auto it = imports_.find(handle);
    if (it != imports_.end()) {
        if (auto m = it->second.lock()) {
            if (m->uid() != uid) {
                return {Code::kPermission,
                        "this CUDA allocation was registered by a process of another user (uid " +
                            std::to_string(m->uid()) + "); the sidecar does not share it"};
            }
            *out = std::move(m);
            return Status::ok();
        }
    }
    void *ctx = nullptr;
    if (Status st = context(ordinal, &ctx); !st.isOk()) {
        return st;
    }
    const cuda::Driver &d = cuda::driver();
    CUipcMemHandle h{};
    std::copy(handle.begin(), handle.end(), h.reserved);
    CUdeviceptr base = 0;
    CUresult rc;
    {
        cuda::ContextGuard g(d, static_cast<CUcontext>(ctx));
        // Lazy peer access: a copy engine of another device may reach it later. If an earlier
        // import of the same handle is still being closed on the release thread, the driver
        // counts opens of one handle, so that close does not undo this open.
        rc = d.cuIpcOpenMemHandle(&base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    }
    if (rc != CUDA_SUCCESS) {
        return {Code::kCuda, "cuIpcOpenMemHandle on " + deviceName(ordinal) + ": " +
                                 d.errorText(rc) + " (is the owner alive, on this node?)"};
    }
    // The allocation's real size, from the driver's view of our own mapping: what a client says
    // of its allocation is checked against this, never trusted (docs/SECURITY.md).
    CUdeviceptr range_base = 0;
    size_t range_bytes = 0;
    {
        cuda::ContextGuard g(d, static_cast<CUcontext>(ctx));
        rc = d.cuMemGetAddressRange(&range_base, &range_bytes, base);
        if (rc != CUDA_SUCCESS || range_base != base) {
            d.cuIpcCloseMemHandle(base);
        }
    }
    if (rc != CUDA_SUCCESS) {
        return {Code::kCuda, "cuMemGetAddressRange of an imported allocation on " +
                                 deviceName(ordinal) + ": " + d.errorText(rc)};
    }
    if (range_base != base) {
        return {Code::kInvalid, "the imported CUDA allocation does not start at its mapping"};
    }
    auto m = std::make_shared<CudaIpcMapping>(handle, ordinal, ctx, static_cast<uint64_t>(base),
                                              static_cast<uint64_t>(range_bytes), uid);
    imports_[handle] = m;
    open_mappings_.fetch_add(1, std::memory_order_relaxed);
    imports_opened_.fetch_add(1, std::memory_order_relaxed);
    *out = std::move(m);
    return Status::ok();
}

void CudaRuntime::closeIpc(CudaIpcMapping *m) {
    const cuda::Driver &d = cuda::driver();
    {
        std::lock_guard lock(ipc_mu_);
        auto it = imports_.find(m->handle_);
        // A newer import of the same handle may have taken the entry meanwhile: leave it.
        if (it != imports_.end() && it->second.expired()) {
            imports_.erase(it);
        }
    }
    cuda::ContextGuard g(d, static_cast<CUcontext>(m->ctx_));
    d.cuIpcCloseMemHandle(static_cast<CUdeviceptr>(m->base_));
    open_mappings_.fetch_sub(1, std::memory_order_relaxed);
}

Status CudaRuntime::mapVmm(const std::vector<VmmPieceFd> &pieces, int ordinal, uint64_t span,
                           uint64_t hint, bool host, std::shared_ptr<void> *mapping,
                           uint64_t *base) {
    void *ctx = nullptr;
    if (Status st = context(ordinal, &ctx); !st.isOk()) {
        return st;
    }
    const cuda::Driver &d = cuda::driver();
    cuda::ContextGuard g(d, static_cast<CUcontext>(ctx));
    CUdeviceptr va = 0;
    // At the owner's address where it is free here (a hint the driver may ignore): peers and
    // the NIC then see one number for the memory, as for the owner's own MRs.
    CUresult reserved = d.cuMemAddressReserve(&va, span, 0, hint, 0);
    if (reserved != CUDA_SUCCESS && hint != 0) {
        reserved = d.cuMemAddressReserve(&va, span, 0, 0, 0);
    }
    if (CUresult rc = reserved; rc != CUDA_SUCCESS) {
        return {Code::kCuda, "cuMemAddressReserve(" + std::to_string(span) + " bytes) on " +
                                 deviceName(ordinal) + ": " + d.errorText(rc)};
    }
    size_t mapped = 0;       // pieces mapped so far
    bool host_numa = false;  // host pieces: made at a NUMA node (else CU_MEM_LOCATION_TYPE_HOST)
    const auto undo = [&] {
        for (size_t i = 0; i < mapped; ++i) {
            d.cuMemUnmap(va + pieces[i].offset, pieces[i].bytes);
        }
        d.cuMemAddressFree(va, span);
    };
    for (const VmmPieceFd &p : pieces) {
        const std::string which = "piece " + std::to_string(mapped) + " (" +
                                  std::to_string(p.bytes) + " bytes at " +
                                  std::to_string(p.offset) + ")";
        CUmemGenericAllocationHandle h = 0;
        CUresult rc = d.cuMemImportFromShareableHandle(
            &h, reinterpret_cast<void *>(static_cast<intptr_t>(p.fd.get())),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (rc != CUDA_SUCCESS) {
            undo();
            return {Code::kCuda, "the VMM " + which +
                                     " is not a CUDA allocation's fd "
                                     "(cuMemImportFromShareableHandle: " +
                                     d.errorText(rc) + ")"};
        }
        // Where the allocation lives decides who may touch it: the CPU may only be given host
        // memory (device memory read by a CPU pointer would fault the sidecar), and device
        // registrations stay device memory.
        CUmemAllocationProp prop{};
        rc = d.cuMemGetAllocationPropertiesFromHandle(&prop, h);
        const bool at_host = cuda::atHostLocation(prop);
        if (rc != CUDA_SUCCESS || at_host != host) {
            d.cuMemRelease(h);
            undo();
            return {
                rc != CUDA_SUCCESS ? Code::kCuda : Code::kInvalid,
                "the VMM " + which +
                    (rc != CUDA_SUCCESS
                         ? " has no readable properties (cuMemGetAllocationPropertiesFromHandle: " +
                               d.errorText(rc) + ")"
                         : std::string(host ? " is not host memory, and the registration "
                                              "says it is"
                                            : " is host memory, and the registration says "
                                              "it is device memory"))};
        }
        if (host) {
            host_numa = prop.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
        }
        rc = d.cuMemMap(va + p.offset, p.bytes, 0, h, 0);
        d.cuMemRelease(h);  // the mapping, if made, holds the memory from here
        if (rc != CUDA_SUCCESS) {
            undo();
            // The driver maps an allocation whole: a piece claimed larger or smaller than the
            // allocation behind its fd is refused here.
            const bool size = rc == CUDA_ERROR_NOT_SUPPORTED || rc == CUDA_ERROR_INVALID_VALUE;
            return {size ? Code::kInvalid : Code::kCuda,
                    "the VMM " + which + " cannot be mapped" +
                        (size ? std::string(": its allocation is not the size the client says")
                              : std::string()) +
                        " (cuMemMap: " + d.errorText(rc) + ")"};
        }
        ++mapped;
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = ordinal;
    if (host) {
        // This process's CPU (the id of a HOST_NUMA access is ignored: the CPU's own node).
        access.location.type =
            host_numa ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
        access.location.id = 0;
    }
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult rc = d.cuMemSetAccess(va, span, &access, 1); rc != CUDA_SUCCESS) {
        undo();
        return {Code::kCuda,
                std::string("cuMemSetAccess of a VMM registration ") +
                    (host ? "of host memory for the CPU" : "on " + deviceName(ordinal)) + ": " +
                    d.errorText(rc)};
    }
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    ranges.reserve(pieces.size());
    for (const VmmPieceFd &p : pieces) {
        ranges.emplace_back(p.offset, p.bytes);
    }
    open_mappings_.fetch_add(1, std::memory_order_relaxed);
    imports_opened_.fetch_add(1, std::memory_order_relaxed);
    *base = va;
    *mapping = std::shared_ptr<void>(reinterpret_cast<void *>(va),
                                     [this, ctx, span, ranges = std::move(ranges)](void *p) {
                                         const cuda::Driver &drv = cuda::driver();
                                         cuda::ContextGuard cg(drv, static_cast<CUcontext>(ctx));
                                         const auto at = reinterpret_cast<CUdeviceptr>(p);
                                         for (const auto &[offset, bytes] : ranges) {
                                             drv.cuMemUnmap(at + offset, bytes);
                                         }
                                         drv.cuMemAddressFree(at, span);
                                         open_mappings_.fetch_sub(1, std::memory_order_relaxed);
                                     });
    return Status::ok();
}

Status CudaRuntime::pinHost(void *base, size_t bytes, std::shared_ptr<void> *out) {
    void *ctx = nullptr;
    if (Status st = context(0, &ctx); !st.isOk()) {
        return st;
    }
    const cuda::Driver &d = cuda::driver();
    CUresult rc;
    {
        cuda::ContextGuard g(d, static_cast<CUcontext>(ctx));
        rc = d.cuMemHostRegister(base, bytes, CU_MEMHOSTREGISTER_PORTABLE);
    }
    if (rc != CUDA_SUCCESS) {
        return {Code::kCuda,
                "cuMemHostRegister(" + std::to_string(bytes) + " bytes): " + d.errorText(rc)};
    }
    *out = std::shared_ptr<void>(base, [ctx](void *p) {
        const cuda::Driver &drv = cuda::driver();
        cuda::ContextGuard g(drv, static_cast<CUcontext>(ctx));
        drv.cuMemHostUnregister(p);
    });
    return Status::ok();
}

#else  // built without the CUDA toolkit

std::string CudaRuntime::errorText(int rc) {
    return "CUDA error " + std::to_string(rc);
}

CudaRuntime::CudaRuntime() {
    why_ = "this sidecar was built without the CUDA toolkit";
}
Status CudaRuntime::context(int, void **) {
    return {Code::kCuda, why_};
}
Status CudaRuntime::openIpc(const CudaIpcHandle &, int, uint32_t,
                            std::shared_ptr<CudaIpcMapping> *) {
    return {Code::kCuda, why_};
}
void CudaRuntime::closeIpc(CudaIpcMapping *) {}
Status CudaRuntime::mapVmm(const std::vector<VmmPieceFd> &, int, uint64_t, uint64_t,
                           std::shared_ptr<void> *, uint64_t *) {
    return {Code::kCuda, why_};
}
Status CudaRuntime::pinHost(void *, size_t, std::shared_ptr<void> *) {
    return {Code::kCuda, why_};
}

#endif

CudaIpcMapping::~CudaIpcMapping() {
    CudaRuntime::get().closeIpc(this);
}

}  // namespace tensorlane::sidecar
