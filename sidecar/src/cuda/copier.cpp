#include "cuda/copier.hpp"

#include "cuda/runtime.hpp"

#ifdef TENSORLANE_HAVE_CUDA
#include "tensorlane/cuda/driver.hpp"
#endif

namespace tensorlane::sidecar {

#ifdef TENSORLANE_HAVE_CUDA

CudaCopier::~CudaCopier() {
    const cuda::Driver &d = cuda::driver();
    for (Event &e : events_) {
        cuda::ContextGuard g(d, static_cast<CUcontext>(e.ctx));
        d.cuEventDestroy(static_cast<CUevent>(e.event));
    }
    for (Device &dev : devices_) {
        cuda::ContextGuard g(d, static_cast<CUcontext>(dev.ctx));
        for (void *s : dev.streams) {
            if (s != nullptr) {
                d.cuStreamDestroy(static_cast<CUstream>(s));
            }
        }
    }
}

void CudaCopier::bind(void *ctx) {
    if (ctx != current_) {
        cuda::driver().cuCtxSetCurrent(static_cast<CUcontext>(ctx));
        current_ = ctx;
    }
}

Status CudaCopier::start(int ordinal, uint32_t lane, uint64_t dst, uint64_t src, uint64_t bytes,
                         uint32_t *handle) {
    const cuda::Driver &d = cuda::driver();
    CudaRuntime &rt = CudaRuntime::get();
    if (ordinal < 0 || ordinal >= rt.deviceCount()) {
        return {Code::kCuda, "no CUDA device " + std::to_string(ordinal) + " in the sidecar"};
    }
    if (devices_.size() <= static_cast<size_t>(ordinal)) {
        devices_.resize(ordinal + 1);
    }
    Device &dev = devices_[ordinal];
    if (dev.ctx == nullptr) {
        if (Status st = rt.context(ordinal, &dev.ctx); !st.isOk()) {
            return st;
        }
        dev.streams.assign(kLanes, nullptr);
    }
    bind(dev.ctx);
    void *&stream = dev.streams[lane % kLanes];
    if (stream == nullptr) {
        CUstream s = nullptr;
        // Non-blocking: never implicitly ordered behind the legacy default stream.
        if (CUresult rc = d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING); rc != CUDA_SUCCESS) {
            return {Code::kCuda, "cuStreamCreate: " + d.errorText(rc)};
        }
        stream = s;
    }
    // An event of this device's context from the pool.
    uint32_t idx = UINT32_MAX;
    for (size_t k = free_.size(); k-- > 0;) {
        if (events_[free_[k]].ctx == dev.ctx) {
            idx = free_[k];
            free_.erase(free_.begin() + static_cast<ptrdiff_t>(k));
            break;
        }
    }
    if (idx == UINT32_MAX) {
        CUevent ev = nullptr;
        if (CUresult rc = d.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING); rc != CUDA_SUCCESS) {
            return {Code::kCuda, "cuEventCreate: " + d.errorText(rc)};
        }
        idx = static_cast<uint32_t>(events_.size());
        events_.push_back(Event{ev, dev.ctx, false});
    }
    Event &e = events_[idx];
    CUresult rc = d.cuMemcpyAsync(static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src),
                                  bytes, static_cast<CUstream>(stream));
    if (rc == CUDA_SUCCESS) {
        rc = d.cuEventRecord(static_cast<CUevent>(e.event), static_cast<CUstream>(stream));
    }
    if (rc != CUDA_SUCCESS) {
        free_.push_back(idx);
        return {Code::kCuda,
                "cuMemcpyAsync of " + std::to_string(bytes) + " bytes: " + d.errorText(rc)};
    }
    e.busy = true;
    *handle = idx;
    return Status::ok();
}

Status CudaCopier::poll(uint32_t handle) {
    if (handle >= events_.size() || !events_[handle].busy) {
        return {Code::kInternal, "poll of a copy that is not running"};
    }
    const cuda::Driver &d = cuda::driver();
    Event &e = events_[handle];
    bind(e.ctx);
    const CUresult rc = d.cuEventQuery(static_cast<CUevent>(e.event));
    if (rc == CUDA_ERROR_NOT_READY) {
        return {Code::kAgain, ""};
    }
    e.busy = false;
    free_.push_back(handle);
    if (rc != CUDA_SUCCESS) {
        return {Code::kCuda, "the copy failed on the GPU: " + d.errorText(rc)};
    }
    return Status::ok();
}

#else

CudaCopier::~CudaCopier() = default;
Status CudaCopier::start(int, uint32_t, uint64_t, uint64_t, uint64_t, uint32_t *) {
    return {Code::kCuda, CudaRuntime::get().why()};
}
Status CudaCopier::poll(uint32_t) {
    return {Code::kCuda, CudaRuntime::get().why()};
}

#endif

}  // namespace tensorlane::sidecar
