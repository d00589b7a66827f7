// Asynchronous copies on the sidecar's own CUDA streams, for one thread (the local copy thread,
// the tcp stager; the thread is the copier's, so it leaves the context it used current): start()
// queues cuMemcpyAsync on a stream of the device and records an event behind it; poll() asks the
// event. Nothing here blocks on the GPU.
//
// Addresses are unified (UVA): device pointers of IPC imports, or host memory this process has
// page-locked (CudaRuntime::pinHost); the driver picks the copy's direction from them. Copies
// started on one (device, lane) run in the order they were started.
#pragma once

#include <cstdint>
#include <vector>

#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class CudaCopier {
public:
    /// Streams per device this copier may use (lane % kLanes).
    static constexpr uint32_t kLanes = 8;

    CudaCopier() = default;
    /// Destroys the streams and events (waits for nothing: call it once polls said done).
    ~CudaCopier();
    CudaCopier(const CudaCopier &) = delete;
    CudaCopier &operator=(const CudaCopier &) = delete;

    /// Queues dst <- src (`bytes`) on stream `lane` of device `ordinal` (created on first use).
    /// `*handle` names it for poll().
    Status start(int ordinal, uint32_t lane, uint64_t dst, uint64_t src, uint64_t bytes,
                 uint32_t *handle);
    /// kOk once the copy has finished (the handle is free again), kAgain while it runs, an
    /// error (kCuda, the handle freed) when it failed.
    Status poll(uint32_t handle);

private:
    struct Event {
        void *event = nullptr;  ///< CUevent
        void *ctx = nullptr;    ///< its context
        bool busy = false;
    };
    struct Device {
        void *ctx = nullptr;
        std::vector<void *> streams;  ///< CUstream per lane, created on first use
    };

    /// Makes `ctx` current on the (one) thread that uses this copier; it keeps it current
    /// between calls, which saves a push and a pop per copy and per poll on the latency path.
    void bind(void *ctx);

    std::vector<Device> devices_;
    std::vector<Event> events_;
    void *current_ = nullptr;
    std::vector<uint32_t> free_;  ///< indices into events_ not in use
};

}  // namespace tensorlane::sidecar
