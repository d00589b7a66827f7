// The async event queue of one context: ibv_get_async_event(3) reads from it, ibv_context's
// async_fd polls readable while it is not empty.
#pragma once

#include <infiniband/verbs.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>

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
    /// ibv_ack_async_event(3): the application is done with an event get() returned.
    void ack(const ibv_async_event &event);
    /// Before a QP, CQ or SRQ is destroyed, as the kernel does: its events not yet taken are
    /// dropped, and this waits until every event of it that get() returned has been acked (so
    /// no thread still reads the object through one). The kernel waits without end; this waits
    /// at most 5 s and says so on stderr, so a test that forgets an ack fails instead of hanging.
    void forget(const void *object);
    /// The QP, CQ or SRQ an event is about (ibv_async_event(3)), and its context; null for port
    /// and device events.
    static const void *objectOf(const ibv_async_event &event, ibv_context **context = nullptr);

private:
    EventFd fd_;
    std::mutex mutex_;
    std::condition_variable acked_;
    std::deque<ibv_async_event> events_;
    /// Events of each object returned by get() and not acked yet.
    std::unordered_map<const void *, int> unacked_;
};

}  // namespace tensorlane::simhca
