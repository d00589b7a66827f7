// The local transport's third path: GPU-to-GPU writes whose two ends are already imported,
// queued by the engine thread itself on a copier of its own (cuMemcpyAsync and an event on one
// stream per session, as the copy thread's) and polled by progress(). Queueing an asynchronous
// copy costs the same few microseconds whatever its size, so this holds for every size; the
// hand-over to the copy thread and back would cost as much again (docs/gpu.md). The engine does
// not sleep while one of these runs (arm()).
//
// Engine thread only. The copier is made on first use, so a sidecar that never copies GPU
// memory here never loads the CUDA driver for it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "transport/local/local_job.hpp"

namespace tensorlane::sidecar {

class CudaCopier;

class EngineGpuCopies {
public:
    /// GPU copies of one session queued on its stream at once.
    static constexpr size_t kMaxInFlight = 64;

    EngineGpuCopies();
    /// Waits for the copies still queued (no stream may write into memory whose import goes
    /// away with us), then lets go of the copier.
    ~EngineGpuCopies();
    EngineGpuCopies(const EngineGpuCopies &) = delete;
    EngineGpuCopies &operator=(const EngineGpuCopies &) = delete;

    /// Whether `job` is one for this path: both ends CUDA regions already imported (an import
    /// may take milliseconds: the copy thread's).
    static bool fits(const LocalJob &job);
    /// Whether copies of session `sid` are queued here.
    bool busy(SessionId sid) const { return sessions_.contains(sid); }
    /// Whether session `sid` has kMaxInFlight copies queued here.
    bool full(SessionId sid) const;
    /// Whether any copy is queued here.
    bool idle() const { return queued_ == 0; }

    /// Queues the copy of `job` (fits()) of session `sid` behind its earlier ones.
    void start(LocalJob job, SessionId sid);
    /// Appends the copies that have finished, in order within each session; and the sessions
    /// that have nothing queued here any more to `*drained`, in session order.
    void poll(std::vector<LocalDone> *done, std::vector<SessionId> *drained);

    /// GPU writes queued here so far (status, tests).
    uint64_t count() const { return count_; }

private:
    std::map<SessionId, std::deque<LocalJob>> sessions_;  ///< queued, in posting order
    size_t queued_ = 0;                                   ///< jobs in sessions_
    uint64_t count_ = 0;
    std::unique_ptr<CudaCopier> copier_;
};

}  // namespace tensorlane::sidecar
