// The local transport: both ends on this node. The sidecar copies directly between the two
// regions (memcpy for host regions), on the engine thread, in slices: a large write never holds
// the loop for longer than one slice, other clients are served between slices, and no thread
// hand-off sits between a request and its completion. One FIFO keeps notifications of writes in
// submission order.
#pragma once

#include <deque>
#include <string>

#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

class LocalTransport final : public Transport {
public:
    /// `node_name` is reported as the writer in notifications.
    LocalTransport(RegionTable &regions, std::string node_name);

    const char *name() const override { return "local"; }
    Status connect(PeerId) override { return Status::ok(); }
    void disconnect(PeerId) override {}
    Status registerRegion(Region &) override { return Status::ok(); }
    void deregisterRegion(RegionId) override {}
    Status post(WriteOp op) override;
    /// Copies at most kSliceBytes, then reports the writes that finished.
    size_t progress(EventSink &sink) override;
    size_t inFlight() const override { return queue_.size(); }

    /// Bytes copied per progress() call: bounds how long one large write delays the loop
    /// (about 20-50 us at memory bandwidth) while keeping the loop's overhead per byte small.
    static constexpr uint64_t kSliceBytes = 512 * 1024;

private:
    struct Pending {
        WriteOp op;
        std::shared_ptr<Region> dst;  ///< resolved when its first byte is copied
        uint64_t copied = 0;
    };

    RegionTable &regions_;
    std::string node_name_;
    std::deque<Pending> queue_;
};

}  // namespace tensorlane::sidecar
