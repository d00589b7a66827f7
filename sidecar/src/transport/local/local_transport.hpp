// The local transport: both ends on this node; the sidecar copies directly between the two
// regions. A write goes one of three ways, each a class of its own:
//
// - InlineHostCopies (inline_host_copies.hpp): host to host, 4 KiB and less, copied by memcpy
//   on the engine thread in post();
// - EngineGpuCopies (engine_gpu_copies.hpp): GPU to GPU of any size, both ends already
//   imported, queued on the GPU by the engine thread and polled by progress();
// - LocalCopyThread (copy_thread.hpp): everything else (large host copies in slices, turn by
//   turn over the sessions; CUDA copies with a host end, or whose ends are not imported yet),
//   on a thread of its own so a large write never holds the engine loop.
//
// The first two skip the hand-overs between threads, which cost more than a small copy or the
// queueing of an asynchronous one; they may be taken only when the writing session's order
// holds. This class is the router that keeps it, and the one completion queue:
//
// - A session's writes run on one of the paths at a time, in posting order, and end in that
//   order, so their notifications keep it. While a session has writes on the copy thread, all
//   its writes go there. While it has GPU copies queued by the engine thread, its later writes
//   that cannot go the same way (host ones, GPU ones not imported yet, or past
//   EngineGpuCopies::kMaxInFlight) are held here, in order, and sent on their way once those
//   copies have finished; the first of them may then queue on the engine's GPU copies again,
//   and those after it are held behind it once more. A host write is copied inline only when
//   the session has nothing on either of the other paths.
// - progress() reports, in this order: the writes copied inline before the engine's GPU copies
//   finished, the engine's GPU copies that finished, the writes copied inline on their way out
//   of the held queue, then the copy thread's. Each write ends with arrived() (the owner's
//   notification) and then completed() (the writer's ticket), as the engine requires.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorlane/sidecar/transport.hpp"
#include "transport/local/copy_thread.hpp"
#include "transport/local/engine_gpu_copies.hpp"
#include "transport/local/inline_host_copies.hpp"
#include "transport/local/local_job.hpp"

namespace tensorlane::sidecar {

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
    void setPolling(bool busy, uint32_t spin_us) { copy_thread_.setPolling(busy, spin_us); }
    /// Creates the eventfd and starts the copy thread.
    Status start() { return copy_thread_.start(); }

    const char *name() const override { return "local"; }
    TransportCaps caps() const override {
        TransportCaps c;
        c.host_memory = true;
        c.cuda_memory = true;
        c.local = true;
        c.ordered = true;
        c.scatter = true;
        return c;
    }
    Status registerRegion(Region &) override { return Status::ok(); }
    /// Lets go of the page-locking of a host buffer (on the copy thread).
    void deregisterRegion(RegionId r) override { copy_thread_.retire(r); }
    /// kInvalid without a resolved target; kAgain when max_queued writes are in the queue.
    Status post(const WriteOp &op) override;
    /// Reports the writes that ended, on every path.
    size_t progress(EventSink &sink) override;
    std::vector<int> pollFds() const override { return {copy_thread_.fd()}; }
    bool arm() override;

    static constexpr size_t kDefaultMaxQueued = 1024;
    /// Host writes copied on the engine thread so far (status, tests).
    uint64_t inlineWrites() const { return inline_.count(); }
    /// GPU writes queued by the engine thread so far (status, tests).
    uint64_t inlineGpuWrites() const { return gpu_.count(); }

private:
    /// Sends a posted (or held back) write of `sid` on its way: copied inline, queued on the
    /// engine's GPU copies, held back behind them, or handed to the copy thread.
    void route(SessionId sid, LocalJob job);
    /// Sends on the writes held behind the GPU copies of the `drained` sessions, in posting
    /// order.
    void release(const std::vector<SessionId> &drained);

    const std::string node_name_;
    const size_t max_queued_;
    InlineHostCopies inline_;
    LocalCopyThread copy_thread_;
    size_t in_flight_ = 0;
    /// Writes each session has on the copy thread.
    std::unordered_map<SessionId, uint32_t> handed_;
    /// Writes held behind a session's GPU copies on the engine thread, in posting order.
    std::map<SessionId, std::deque<LocalJob>> held_;
    std::vector<LocalDone> scratch_;  ///< progress()'s list, kept for its capacity
    std::vector<SessionId> drained_;  ///< progress()'s list, kept for its capacity
    // Destroyed in reverse: the engine's GPU copies are waited for first, the writes held
    // behind them dropped, then the copy thread stops (after waiting for its own).
    EngineGpuCopies gpu_;
};

}  // namespace tensorlane::sidecar
