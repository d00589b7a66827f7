// The async event queue of one context: ibv_get_async_event(3) reads from it, ibv_context's
// async_fd polls readable while it is not empty.
#pragma once

#include <infiniband/verbs.h>

#include <deque>
#include <mutex>

#include "event_fd.hpp"

namespace tensorlane::simhca {

/// Events queued for one context.
class AsyncEventQueue {
public:
    /// The fd to hand out as async_fd.
    [[nodiscard]] int fd() const { return fd_.fd(); }
    /// Queues an event and makes the fd readable.
    void push(const ibv_async_event &event);
    /// Takes the oldest event, blocking as the fd's O_NONBLOCK flag says. Returns 0 or -1 with
    /// errno set, as ibv_get_async_event().
    [[nodiscard]] int get(ibv_async_event *out);

private:
    EventFd fd_;
    std::mutex mutex_;
    std::deque<ibv_async_event> events_;
};

}  // namespace tensorlane::simhca
