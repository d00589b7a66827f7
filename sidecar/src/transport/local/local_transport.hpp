// The local transport: both ends on this node. The sidecar copies directly between the two
// regions (memcpy for host regions; CUDA copies arrive with the GPU work) on a copy thread of
// its own, so a large write never holds the engine loop: other clients' rings, sockets and
// remote peers are served while it copies.
//
// The copy thread takes writes in 512 KiB slices, turn by turn over the writing sessions, so one
// session's gigabyte does not make another's 4 KiB wait for it; within one session writes finish
// in the order they were posted, so their notifications keep that order. Each finished write
// reports arrived() (the owner's notification) and then completed() (the writer's ticket),
// handed to the engine through a queue and an eventfd.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

class LocalTransport final : public Transport {
public:
    /// `node_name` is reported as the writer in notifications; at most `max_queued` writes wait
    /// or run at once (post() says kAgain beyond that).
    explicit LocalTransport(std::string node_name, size_t max_queued = kDefaultMaxQueued);
    ~LocalTransport() override;
    LocalTransport(const LocalTransport &) = delete;
    LocalTransport &operator=(const LocalTransport &) = delete;

    /// Creates the eventfd and starts the copy thread.
    Status start();

    const char *name() const override { return "local"; }
    Status connect(PeerId) override { return Status::ok(); }
    void disconnect(PeerId) override {}
    Status registerRegion(Region &) override { return Status::ok(); }
    void deregisterRegion(RegionId) override {}
    /// kInvalid without a resolved target; kAgain when max_queued writes are in the queue.
    Status post(const WriteOp &op) override;
    /// Reports the writes the copy thread finished.
    size_t progress(EventSink &sink) override;
    std::vector<int> pollFds() const override { return {wake_.get()}; }
    bool arm() override { return !done_ready_.load(std::memory_order_acquire); }
    size_t inFlight() const override { return in_flight_; }

    /// Bytes copied per turn of the copy thread before it looks at other sessions' writes.
    static constexpr uint64_t kSliceBytes = 512 * 1024;
    static constexpr size_t kDefaultMaxQueued = 1024;

private:
    struct Job {
        WriteOp op;
        uint64_t copied = 0;
    };
    struct Done {
        uint64_t op_id = 0;
        Code code = Code::kOk;
        const char *why = "";
        RegionId dst = 0;
        uint32_t imm = 0;
        uint64_t offset = 0;
        uint64_t bytes = 0;
    };

    void run();
    /// Copies one slice of `job`; true when the job is finished (into `*done`).
    bool step(Job &job, Done *done);

    const std::string node_name_;
    const size_t max_queued_;
    ipc::UniqueFd wake_;
    size_t in_flight_ = 0;  ///< engine thread only

    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    /// Waiting and running writes, per writing session (FIFO within one), taken in turn.
    std::map<SessionId, std::deque<Job>> jobs_;
    SessionId next_turn_ = 0;
    std::vector<Done> done_;
    std::atomic<bool> done_ready_{false};
    std::thread thread_;
};

}  // namespace tensorlane::sidecar
