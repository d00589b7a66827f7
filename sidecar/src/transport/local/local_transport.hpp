// The local transport: both ends on this node. The sidecar copies directly between the two
// regions (memcpy for host regions). Small copies run inline on the engine thread; large ones
// on a copy thread so the engine keeps serving other clients. One FIFO keeps notifications of
// writes in submission order.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

class LocalTransport final : public Transport {
public:
    /// `node_name` is reported as the writer in notifications.
    LocalTransport(RegionTable &regions, std::string node_name);
    ~LocalTransport() override;

    const char *name() const override { return "local"; }
    Status connect(PeerId) override { return Status::ok(); }
    void disconnect(PeerId) override {}
    Status registerRegion(Region &) override { return Status::ok(); }
    void deregisterRegion(RegionId) override {}
    Status post(WriteOp op) override;
    size_t progress(EventSink &sink) override;
    int wakeFd() const override { return wake_.get(); }
    size_t inFlight() const override;

    /// Copies at or below this size run inline on the engine thread.
    static constexpr uint64_t kInlineBytes = 64 * 1024;

private:
    struct Done {
        uint64_t op_id;
        Code status;
        RegionId dst;
        uint32_t imm;
        uint64_t offset;
        uint64_t bytes;
        std::string reason;
    };
    Done execute(const WriteOp &op);
    void copyLoop();

    RegionTable &regions_;
    std::string node_name_;
    ipc::UniqueFd wake_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<WriteOp> queue_;    ///< waiting for the copy thread
    bool copying_ = false;         ///< the copy thread holds an op
    std::vector<Done> done_;       ///< finished, not yet reported
    std::vector<Done> reporting_;  ///< engine-thread scratch
    size_t in_flight_ = 0;
    bool stopping_ = false;
    std::thread worker_;
};

}  // namespace tensorlane::sidecar
