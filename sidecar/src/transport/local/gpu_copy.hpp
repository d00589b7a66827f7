// The steps of a local write with a CUDA region at either end, shared by the two paths that
// queue such copies (the copy thread, copy_thread.hpp, and the engine thread's GPU copies,
// engine_gpu_copies.hpp): resolve both ends to unified addresses, queue cuMemcpyAsync with an
// event behind it on a CudaCopier, poll the event, and give the verdict.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>

#include "transport/local/local_job.hpp"

namespace tensorlane::sidecar {

class CudaCopier;

/// Host buffers page-locked for CUDA copies, by root region: each whole buffer is locked once,
/// on first use, so the copy engine reaches it directly instead of through the driver's bounce
/// buffers. One thread's (the copy thread's).
class HostPins {
public:
    /// The unified address of `offset` in host region `r`, locking its buffer on first use;
    /// `*pin` keeps it locked (and mapped) for as long as the copy holds it.
    Status addressOf(const Region &r, uint64_t offset, uint64_t *addr,
                     std::shared_ptr<LocalPin> *pin);
    /// Lets go of the lock of buffer `root` (copies still running hold their own reference).
    void release(RegionId root) { pins_.erase(root); }
    void clear() { pins_.clear(); }

private:
    std::unordered_map<RegionId, std::shared_ptr<LocalPin>> pins_;
};

/// Queues the copy of GPU `job` on stream `lane` of `copier` (or records in `job.error` why
/// not); `pins` resolves host ends (null: both ends are CUDA regions).
void issueGpuCopy(LocalJob &job, CudaCopier &copier, uint32_t lane, HostPins *pins);

/// Polls an issued GPU job of session `sid`: false while it runs, else true with its verdict.
bool pollGpuCopy(LocalJob &job, CudaCopier &copier, SessionId sid, LocalDone *done);

/// Stopping: waits for the GPU copies of `q` queued on `copier`, so no stream still writes into
/// memory whose import goes away with us.
void waitGpuCopies(const std::deque<LocalJob> &q, CudaCopier &copier);

}  // namespace tensorlane::sidecar
