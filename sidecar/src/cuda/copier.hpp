// Asynchronous copies on the sidecar's own CUDA streams, for one thread (the local copy thread,
// the local transport's engine-thread copies, the tcp stager; the thread is the copier's, so it
// leaves the context it used current): start() queues cuMemcpyAsync on a stream of the device
// and a completion mark behind it; poll() looks at the mark. Nothing here blocks on the GPU.
//
// Two kinds of mark:
// - kEvent: an event recorded behind each copy, asked with cuEventQuery (a driver call each
//   poll);
// - kFlag: cuStreamWriteValue32 of the copy's sequence number into a word of page-locked host
//   memory per stream, behind each copy (the stream runs it once the copy is done, after a
//   system-scope fence), so a poll is one load; copies on a stream finish in order, so one
//   word says which of them have. Where a word lags (every kQueryEvery-th poll of one that
//   has not finished), cuStreamQuery says whether the stream failed, so a broken context ends
//   the copies with its error instead of leaving them pending for ever. A device whose flag
//   words cannot be made, or whose stream refuses the store, falls back to events.
// - kAuto (the engine's GPU copies): kFlag for copies under kEventFromBytes, kEvent from
//   there on. The flag's barrier costs the GPU time in proportion to what the copy left to
//   fence: on an H100 a 16 MiB copy took 10.7 us with it against 8.6 us with an event, the same
//   in a bare cuMemcpyDtoDAsync loop without the sidecar (gpu_bench's CudaMemcpyD2D8Flag), while
//   for small copies the flag's one load beats an event's driver call on the latency path.
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
    /// How a copy says it has finished (above).
    enum class Mark { kEvent, kFlag, kAuto };
    /// kAuto: copies of this many bytes and more are marked by events.
    static constexpr uint64_t kEventFromBytes = 4ull << 20;
    /// TENSORLANE_GPU_COPY_MARK=auto|event|flag in the sidecar's environment, else
    /// `dflt`: an experiment's knob (docs/benchmarks.md, "GPU"), not a setting of the TOML.
    static Mark markFromEnv(Mark dflt);
    /// kFlag: polls of an unfinished copy between two cuStreamQuery calls.
    static constexpr uint32_t kQueryEvery = 256;

    explicit CudaCopier(Mark mark = Mark::kEvent) : mark_(mark) {}
    /// Destroys the streams, events and flag words (waits for nothing: call it once polls said
    /// done).
    ~CudaCopier();
    CudaCopier(const CudaCopier &) = delete;
    CudaCopier &operator=(const CudaCopier &) = delete;

    /// Queues dst <- src (`bytes`) on stream `lane` of device `ordinal` (created on first use).
    /// `*handle` names it for poll(). With `handle` null the copy gets no mark of its own: the
    /// next copy started on the same lane with a handle covers it (a stream runs in order), so
    /// a run of pieces costs one mark.
    Status start(int ordinal, uint32_t lane, uint64_t dst, uint64_t src, uint64_t bytes,
                 uint32_t *handle);
    /// kOk once the copy has finished (the handle is free again), kAgain while it runs, an
    /// error (kCuda, the handle freed) when it failed.
    Status poll(uint32_t handle);

private:
    struct Copy {
        void *event = nullptr;  ///< its CUevent, made when it is first marked by one
        void *ctx = nullptr;    ///< the context of its device
        bool flag = false;      ///< marked by a flag (else by its event)
        uint32_t device = 0;    ///< flag: the ordinal and lane it runs on, and its number there
        uint32_t lane = 0;
        uint32_t seq = 0;
        uint32_t lagging = 0;  ///< flag: polls that found it unfinished
        bool busy = false;
    };
    struct Device {
        void *ctx = nullptr;
        std::vector<void *> streams;   ///< CUstream per lane, created on first use
        std::vector<uint32_t> issued;  ///< kFlag: per lane, the number of the last copy started
        uint32_t *flags = nullptr;     ///< kFlag: per lane, kFlagStride words apart (host)
        uint64_t flags_device = 0;     ///< kFlag: their device address
        bool no_flags = false;         ///< kFlag: they failed here; events instead
    };
    /// Words between two lanes' flags: one cache line each.
    static constexpr uint32_t kFlagStride = 16;

    /// Makes `ctx` current on the (one) thread that uses this copier; it keeps it current
    /// between calls, which saves a push and a pop per copy and per poll on the latency path.
    void bind(void *ctx);
    /// kFlag: the device's flag words, page-locked and mapped for the GPU on first use.
    Status makeFlags(Device &dev);
    /// A free Copy of `dev`'s context.
    uint32_t takeCopy(Device &dev);
    /// Records `c`'s event on `stream` (making the event first).
    int recordEvent(Copy &c, void *stream);

    const Mark mark_;
    std::vector<Device> devices_;
    std::vector<Copy> copies_;
    void *current_ = nullptr;
    std::vector<uint32_t> free_;  ///< indices into copies_ not in use
};

}  // namespace tensorlane::sidecar
