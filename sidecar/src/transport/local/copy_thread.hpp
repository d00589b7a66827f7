// The local transport's second path: a thread of its own, so a large write never holds the
// engine loop (other clients' rings, sockets and remote peers are served while it copies).
//
// Host to host: memcpy, in 512 KiB slices, turn by turn over the writing sessions, so one
// session's gigabyte does not make another's 4 KiB wait for it. With a CUDA region at either
// end: cuMemcpyAsync on the thread's own streams (one lane per session, so sessions do not
// queue behind each other on the GPU), between the sidecar's IPC import of the device memory
// and its page-locked mapping of host memory (peer access over NVLink where two GPUs are
// involved); an event behind each copy says when it has finished, and only then does the write
// end. Within one session writes end in the order they were handed over: its GPU copies queue
// on one stream back to back (up to kMaxGpuInFlight), and a host copy of it starts only after
// its earlier GPU copies have finished.
//
// The engine thread hands writes over and takes the ended ones back through a queue under a
// mutex; the eventfd (fd()) is rung only when the engine may be asleep (it said so in arm()).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "transport/local/gpu_copy.hpp"
#include "transport/local/local_job.hpp"

namespace tensorlane::sidecar {

class CudaCopier;

class LocalCopyThread {
public:
    /// GPU copies of one session queued on its stream at once.
    static constexpr size_t kMaxGpuInFlight = 64;

    LocalCopyThread();
    /// Stops the thread, after waiting for the GPU copies it queued.
    ~LocalCopyThread();
    LocalCopyThread(const LocalCopyThread &) = delete;
    LocalCopyThread &operator=(const LocalCopyThread &) = delete;

    /// How the thread waits for work (before start()): it spins `spin_us` after its last work
    /// before it sleeps (0: sleeps at once; `busy`: at least 500 us).
    void setPolling(bool busy, uint32_t spin_us);
    /// Creates the eventfd and starts the thread.
    Status start();
    /// Readable when ended writes wait and the engine had armed (engine thread: epoll).
    int fd() const { return wake_.get(); }

    // Engine thread only, below.
    /// Hands `job` of session `sid` over, behind the session's earlier ones.
    void hand(LocalJob job, SessionId sid);
    /// Lets go of the page-locking of host buffer `r`, on the thread.
    void retire(RegionId r);
    /// The engine is about to sleep: true unless ended writes already wait (then the engine
    /// polls again instead); from now on each new one rings fd().
    bool arm();
    /// The engine is awake (it stopped listening to fd()); appends the writes that ended, in the
    /// order they ended (so in handing-over order within a session).
    void take(std::vector<LocalDone> *out);

private:
    void run();
    /// One unit of work for every session (a slice, a GPU copy queued, GPU copies finished).
    /// True if anything moved.
    bool turn(std::vector<LocalDone> *done);
    /// Hands the writes that ended to the engine (and rings it when it armed).
    void publish(std::vector<LocalDone> *done);

    uint32_t spin_us_ = 0;
    ipc::UniqueFd wake_;

    // Shared between the engine thread and the copy thread.
    struct Incoming {
        LocalJob job;
        SessionId session = 0;
    };
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    bool sleeping_ = false;  ///< the copy thread waits on cv_
    std::vector<Incoming> incoming_;
    std::vector<RegionId> retired_;
    std::atomic<bool> has_incoming_{false};
    std::vector<LocalDone> done_;
    std::atomic<bool> done_ready_{false};
    std::atomic<bool> armed_{false};  ///< the engine may sleep: ring the eventfd
    std::atomic<bool> rung_{false};   ///< the eventfd was rung and wants draining

    // The copy thread's own.
    std::map<SessionId, std::deque<LocalJob>> jobs_;
    HostPins pins_;
    std::unique_ptr<CudaCopier> copier_;

    std::thread thread_;
};

}  // namespace tensorlane::sidecar
