// The local transport: both ends on this node. The sidecar copies directly between the two
// regions on a copy thread of its own, so a large write never holds the engine loop: other
// clients' rings, sockets and remote peers are served while it copies.
//
// Host to host: memcpy, in 512 KiB slices, turn by turn over the writing sessions, so one
// session's gigabyte does not make another's 4 KiB wait for it. With a CUDA region at either
// end: cuMemcpyAsync on the sidecar's own streams (one lane per session, so sessions do not
// queue behind each other on the GPU), between the sidecar's IPC import of the device memory
// and its page-locked mapping of host memory (peer access over NVLink where two GPUs are
// involved); an event behind each copy says when it has finished, and only then does the write
// complete. Within one session writes finish in the order they were posted, so their
// notifications keep that order: a session's GPU copies queue on one stream back to back, and a
// host copy of that session starts only after its earlier GPU copies have finished.
//
// Each finished write reports arrived() (the owner's notification) and then completed() (the
// writer's ticket), handed to the engine through a queue; the eventfd is rung only when the
// engine may be asleep (it said so in arm()).
//
// Some writes skip the copy thread when the writing session has nothing on it (so its order
// holds): two hand-overs between threads cost more than a small copy (on the GPU machine about
// 3.5 us of a 4 KiB GPU write's 14, and half the bandwidth of 16 MiB ones two at a time; on a
// host with fewer cores than spinning threads a scheduler slice each). Host to host,
// kInlineBytes and less: copied by memcpy in post().
// GPU to GPU, of any size, both ends already imported: queued by the engine thread on a
// copier of its own (the copy is asynchronous: queueing it costs the same few microseconds
// whatever its size), polled by progress(). While such a session's GPU copies run
// there, its later writes that cannot go the same way wait in the engine's own queue and are
// handed on once they have finished; while it has writes on the copy thread, all its writes go
// there. So a session's writes run on one of the two threads at a time, in posting order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

class CudaCopier;

class LocalTransport final : public Transport {
public:
    /// `node_name` is reported as the writer in notifications; at most `max_queued` writes wait
    /// or run at once (post() says kAgain beyond that).
    explicit LocalTransport(std::string node_name, size_t max_queued = kDefaultMaxQueued);
    ~LocalTransport() override;
    LocalTransport(const LocalTransport &) = delete;
    LocalTransport &operator=(const LocalTransport &) = delete;

    /// How the copy thread waits for work (before start()): it spins `spin_us` after its last
    /// work before it sleeps (0: sleeps at once; `busy`: at least 500 us). The engine passes its
    /// own [ipc] poll mode, so writes that follow each other cost no wake-up.
    void setPolling(bool busy, uint32_t spin_us);
    /// Creates the eventfd and starts the copy thread.
    Status start();

    const char *name() const override { return "local"; }
    TransportCaps caps() const override {
        TransportCaps c;
        c.host_memory = true;
        c.cuda_memory = true;
        c.local = true;
        c.ordered = true;
        return c;
    }
    Status registerRegion(Region &) override { return Status::ok(); }
    /// Lets go of the page-locking of a host buffer (on the copy thread).
    void deregisterRegion(RegionId r) override;
    /// kInvalid without a resolved target; kAgain when max_queued writes are in the queue.
    Status post(const WriteOp &op) override;
    /// Reports the writes the copy thread finished.
    size_t progress(EventSink &sink) override;
    std::vector<int> pollFds() const override { return {wake_.get()}; }
    bool arm() override;

    /// Bytes copied per turn of the copy thread before it looks at other sessions' writes.
    static constexpr uint64_t kSliceBytes = 512 * 1024;
    static constexpr size_t kDefaultMaxQueued = 1024;
    /// GPU copies of one session queued on its stream at once.
    static constexpr size_t kMaxGpuInFlight = 64;
    /// Host writes up to this size may be copied on the engine thread (see above).
    static constexpr uint64_t kInlineBytes = 4096;
    /// Host writes copied on the engine thread so far (status, tests).
    uint64_t inlineWrites() const { return inline_writes_; }
    /// GPU writes queued by the engine thread so far (status, tests).
    uint64_t inlineGpuWrites() const { return inline_gpu_writes_; }

private:
    struct Pin;
    struct Job {
        WriteOp op;
        uint64_t copied = 0;           ///< host copies: bytes done
        bool gpu = false;              ///< a CUDA region at either end
        bool issued = false;           ///< GPU: queued on a stream (or failed: `error`)
        uint32_t handle = 0;           ///< GPU: the copier's handle
        Status error;                  ///< GPU: why it could not be queued
        std::shared_ptr<Pin> pins[2];  ///< host ends kept page-locked while the copy runs
    };
    struct Done {
        uint64_t op_id = 0;
        Code code = Code::kOk;
        std::string why;
        RegionId dst = 0;
        uint32_t imm = 0;
        uint64_t offset = 0;
        uint64_t bytes = 0;
        SessionId session = 0;  ///< the writer (set by the copy thread)
    };

    void run();
    /// One unit of work for every session (a slice, a GPU copy queued, GPU copies finished).
    /// True if anything moved.
    bool turn(std::vector<Done> *done);
    /// Copies one slice of a host job; true when it is finished (into `*done`).
    bool stepHost(Job &job, Done *done);
    /// Queues a GPU job's copy on `copier` (or records why not).
    void issueGpu(Job &job, CudaCopier &copier, uint32_t lane);
    /// Polls a queued GPU job: kAgain while it runs, else its Done (session set).
    bool pollGpu(Job &job, CudaCopier &copier, SessionId sid, Done *done);
    /// Stopping: waits for the GPU copies of `q` queued on `copier`, so no stream still writes
    /// into memory whose import goes away with us.
    static void waitQueued(const std::deque<Job> &q, CudaCopier &copier);
    /// The GPU job at its session's front has ended: its Done.
    Done finishGpu(Job &job, const Status &st);
    /// The unified address of `offset` in `r` for a CUDA copy (importing or page-locking it).
    Status addressOf(const Region &r, uint64_t offset, uint64_t *addr, std::shared_ptr<Pin> *pin);
    /// Checks made when a write starts; kOk or why it cannot.
    static Code startCheck(const WriteOp &op, const char **why);
    /// Engine thread: sends a posted (or held back) write of `sid` on its way: copied here,
    /// queued on the engine's copier, held back behind the engine's GPU copies, or handed to
    /// the copy thread.
    void route(SessionId sid, Job job);
    void handOver(SessionId sid, Job job);
    /// Engine thread: the engine's GPU copies that have finished, in order, into `*done`; then
    /// the writes held back behind them, once they all have.
    void progressOwn(std::vector<Done> *done);
    void publish(std::vector<Done> *done);

    const std::string node_name_;
    const size_t max_queued_;
    uint32_t spin_us_ = 0;
    ipc::UniqueFd wake_;
    size_t in_flight_ = 0;  ///< engine thread only
    // Engine thread only: writes copied in post(), reported by the next progress(); and how
    // many writes each session has on the copy thread.
    std::vector<Done> inline_done_;
    uint64_t inline_writes_ = 0;
    uint64_t inline_gpu_writes_ = 0;
    std::unordered_map<SessionId, uint32_t> handed_;
    struct Own {
        std::deque<Job> gpu;   ///< queued on own_copier_, in posting order
        std::deque<Job> held;  ///< posted behind them, not yet sent on
    };
    std::map<SessionId, Own> own_;  ///< sessions with GPU copies queued by the engine thread
    size_t own_gpu_ = 0;            ///< jobs in own_'s gpu queues
    struct CopierHolder;
    std::unique_ptr<CopierHolder> own_copier_;  ///< the engine thread's, made on first use

    // Shared between the engine thread (post, progress, deregisterRegion) and the copy thread.
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    bool sleeping_ = false;  ///< the copy thread waits on cv_
    std::vector<Job> incoming_;
    std::vector<RegionId> retired_;
    std::atomic<bool> has_incoming_{false};
    std::vector<Done> done_;
    std::atomic<bool> done_ready_{false};
    std::atomic<bool> armed_{false};  ///< the engine may sleep: ring the eventfd
    std::atomic<bool> rung_{false};   ///< the eventfd was rung and wants draining

    // The copy thread's own.
    std::map<SessionId, std::deque<Job>> jobs_;
    std::unordered_map<RegionId, std::shared_ptr<Pin>> pins_;  ///< by host buffer (root region)
    std::unique_ptr<CopierHolder> copier_;

    std::thread thread_;
};

}  // namespace tensorlane::sidecar
