// A completion event channel (ibv_create_comp_channel(3)): its fd polls readable while CQ events
// are queued; ibv_get_cq_event() takes them in order.
#pragma once

#include <deque>
#include <mutex>

#include "event_fd.hpp"
#include "handles.hpp"

namespace tensorlane::simhca {

/// One completion channel.
class CompChannel {
public:
    /// A channel of ctx.
    explicit CompChannel(ibv_context *ctx);
    /// What the application holds.
    [[nodiscard]] ibv_comp_channel *ibv() { return &handle_.ibv; }
    /// The channel behind an ibv_comp_channel this library handed out.
    [[nodiscard]] static CompChannel *from(ibv_comp_channel *c) {
        return handleOf<ChannelHandle>(c)->self;
    }
    /// Queues a completion event for cq.
    void notify(SimCq *cq);
    /// Takes the oldest event (blocking as the fd's O_NONBLOCK says); nullptr with errno set.
    [[nodiscard]] SimCq *get();
    /// Drops the events of a CQ being destroyed (their counts stay: readers skip them).
    void forget(SimCq *cq);

private:
    EventFd fd_;
    std::mutex mutex_;
    std::deque<SimCq *> events_;
    ChannelHandle handle_{};
};

}  // namespace tensorlane::simhca
