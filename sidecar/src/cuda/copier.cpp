#include "cuda/copier.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "cuda/runtime.hpp"

#ifdef TENSORLANE_HAVE_CUDA
#include "tensorlane/cuda/driver.hpp"
#endif

namespace tensorlane::sidecar {

CudaCopier::Mark CudaCopier::markFromEnv(Mark dflt) {
    const char *v = std::getenv("TENSORLANE_GPU_COPY_MARK");
    if (v == nullptr) {
        return dflt;
    }
    const std::string s = v;
    return s == "event"  ? Mark::kEvent
           : s == "flag" ? Mark::kFlag
           : s == "auto" ? Mark::kAuto
                         : dflt;
}

#ifdef TENSORLANE_HAVE_CUDA

namespace {
constexpr size_t kFlagBytes = 4096;  // one page: every lane's word, a cache line each
}

CudaCopier::~CudaCopier() {
    const cuda::Driver &d = cuda::driver();
    for (Copy &c : copies_) {
        if (c.event != nullptr) {
            cuda::ContextGuard g(d, static_cast<CUcontext>(c.ctx));
            d.cuEventDestroy(static_cast<CUevent>(c.event));
        }
    }
    for (Device &dev : devices_) {
        cuda::ContextGuard g(d, static_cast<CUcontext>(dev.ctx));
        for (void *s : dev.streams) {
            if (s != nullptr) {
                d.cuStreamDestroy(static_cast<CUstream>(s));
            }
        }
        if (dev.flags != nullptr) {
            d.cuMemHostUnregister(dev.flags);
            std::free(dev.flags);
        }
    }
}

void CudaCopier::bind(void *ctx) {
    if (ctx != current_) {
        cuda::driver().cuCtxSetCurrent(static_cast<CUcontext>(ctx));
        current_ = ctx;
    }
}

Status CudaCopier::makeFlags(Device &dev) {
    static_assert(kLanes * kFlagStride * sizeof(uint32_t) <= kFlagBytes);
    const cuda::Driver &d = cuda::driver();
    void *p = std::aligned_alloc(kFlagBytes, kFlagBytes);
    if (p == nullptr) {
        return {Code::kNoMemory, "no memory for the copy flags"};
    }
    auto *flags = static_cast<uint32_t *>(p);
    for (uint32_t i = 0; i < kFlagBytes / sizeof(uint32_t); ++i) {
        flags[i] = 0;
    }
    // Mapped for the GPU: cuStreamWriteValue32 stores into it over the bus.
    CUresult rc = d.cuMemHostRegister(p, kFlagBytes, CU_MEMHOSTREGISTER_DEVICEMAP);
    CUdeviceptr dev_ptr = 0;
    if (rc == CUDA_SUCCESS) {
        rc = d.cuMemHostGetDevicePointer(&dev_ptr, p, 0);
        if (rc != CUDA_SUCCESS) {
            d.cuMemHostUnregister(p);
        }
    }
    if (rc != CUDA_SUCCESS) {
        std::free(p);
        return {Code::kCuda, "cuMemHostRegister of the copy flags: " + d.errorText(rc)};
    }
    dev.flags = flags;
    dev.flags_device = static_cast<uint64_t>(dev_ptr);
    dev.issued.assign(kLanes, 0);
    return Status::ok();
}

uint32_t CudaCopier::takeCopy(Device &dev) {
    for (size_t k = free_.size(); k-- > 0;) {
        if (copies_[free_[k]].ctx == dev.ctx) {
            const uint32_t idx = free_[k];
            free_.erase(free_.begin() + static_cast<ptrdiff_t>(k));
            return idx;
        }
    }
    Copy c;
    c.ctx = dev.ctx;
    copies_.push_back(c);
    return static_cast<uint32_t>(copies_.size() - 1);
}

int CudaCopier::recordEvent(Copy &c, void *stream) {
    const cuda::Driver &d = cuda::driver();
    if (c.event == nullptr) {
        CUevent ev = nullptr;
        if (CUresult rc = d.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING); rc != CUDA_SUCCESS) {
            return rc;
        }
        c.event = ev;
    }
    c.flag = false;
    return d.cuEventRecord(static_cast<CUevent>(c.event), static_cast<CUstream>(stream));
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
    const bool flags = mark_ != Mark::kEvent;
    if (flags && dev.flags == nullptr && !dev.no_flags) {
        dev.no_flags = !makeFlags(dev).isOk();  // events then: slower to poll, as correct
    }
    lane %= kLanes;
    void *&stream = dev.streams[lane];
    if (stream == nullptr) {
        CUstream s = nullptr;
        // Non-blocking: never implicitly ordered behind the legacy default stream.
        if (CUresult rc = d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING); rc != CUDA_SUCCESS) {
            return {Code::kCuda, "cuStreamCreate: " + d.errorText(rc)};
        }
        stream = s;
    }
    if (handle == nullptr) {
        CUresult rc = d.cuMemcpyAsync(static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src),
                                      bytes, static_cast<CUstream>(stream));
        if (rc != CUDA_SUCCESS) {
            return {Code::kCuda,
                    "cuMemcpyAsync of " + std::to_string(bytes) + " bytes: " + d.errorText(rc)};
        }
        return Status::ok();
    }
    const uint32_t idx = takeCopy(dev);
    Copy &c = copies_[idx];
    CUresult rc = d.cuMemcpyAsync(static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src),
                                  bytes, static_cast<CUstream>(stream));
    const bool flag = flags && !dev.no_flags && (mark_ != Mark::kAuto || bytes < kEventFromBytes);
    if (rc == CUDA_SUCCESS && flag) {
        // The default flags: the stream fences the copy's writes (system scope) before this
        // store, so whoever sees the number sees the bytes in place.
        const uint32_t seq = dev.issued[lane] + 1;
        rc = d.cuStreamWriteValue32(static_cast<CUstream>(stream),
                                    dev.flags_device + sizeof(uint32_t) * kFlagStride * lane, seq,
                                    CU_STREAM_WRITE_VALUE_DEFAULT);
        if (rc == CUDA_SUCCESS) {
            dev.issued[lane] = seq;
            c.flag = true;
            c.device = static_cast<uint32_t>(ordinal);
            c.lane = lane;
            c.seq = seq;
            c.lagging = 0;
        } else {
            dev.no_flags = true;  // this stream refuses the store: events from now on
            rc = static_cast<CUresult>(recordEvent(c, stream));
        }
    } else if (rc == CUDA_SUCCESS) {
        rc = static_cast<CUresult>(recordEvent(c, stream));
    }
    if (rc != CUDA_SUCCESS) {
        free_.push_back(idx);
        return {Code::kCuda,
                "cuMemcpyAsync of " + std::to_string(bytes) + " bytes: " + d.errorText(rc)};
    }
    c.busy = true;
    *handle = idx;
    return Status::ok();
}

Status CudaCopier::poll(uint32_t handle) {
    if (handle >= copies_.size() || !copies_[handle].busy) {
        return {Code::kInternal, "poll of a copy that is not running"};
    }
    const cuda::Driver &d = cuda::driver();
    Copy &c = copies_[handle];
    CUresult rc = CUDA_SUCCESS;
    if (!c.flag) {
        bind(c.ctx);
        rc = d.cuEventQuery(static_cast<CUevent>(c.event));
        if (rc == CUDA_ERROR_NOT_READY) {
            return {Code::kAgain, ""};
        }
    } else {
        Device &dev = devices_[c.device];
        // SYNC POINT: acquire pairs with the stream's cuStreamWriteValue32, which fences the
        // copy's writes before it stores (__threadfence_system semantics). Cyclic comparison:
        // the word only grows, by one per copy on the lane.
        const uint32_t seen = std::atomic_ref<uint32_t>(dev.flags[kFlagStride * c.lane])
                                  .load(std::memory_order_acquire);
        if (static_cast<int32_t>(seen - c.seq) < 0) {
            if (++c.lagging % kQueryEvery != 0) {
                return {Code::kAgain, ""};
            }
            // Not there yet: is the stream still running, or did it fail? One that has finished
            // has run our store too, so the copy is done.
            bind(c.ctx);
            rc = d.cuStreamQuery(static_cast<CUstream>(dev.streams[c.lane]));
            if (rc == CUDA_ERROR_NOT_READY) {
                return {Code::kAgain, ""};
            }
        }
    }
    c.busy = false;
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
