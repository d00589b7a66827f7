#include "async_event_queue.hpp"

#include <cerrno>

namespace tensorlane::simhca {

void AsyncEventQueue::push(const ibv_async_event &event) {
    {
        std::lock_guard lock(mutex_);
        events_.push_back(event);
    }
    // SYNC POINT: the event is queued before the count that lets a reader take it.
    fd_.post();
}

int AsyncEventQueue::get(ibv_async_event *out) {
    if (!fd_.take()) {
        return -1;  // errno from read(2): EAGAIN on a non-blocking fd
    }
    std::lock_guard lock(mutex_);
    if (events_.empty()) {
        errno = EAGAIN;
        return -1;
    }
    *out = events_.front();
    events_.pop_front();
    return 0;
}

}  // namespace tensorlane::simhca
