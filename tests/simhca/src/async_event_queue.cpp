#include "async_event_queue.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>

namespace tensorlane::simhca {
const void *AsyncEventQueue::objectOf(const ibv_async_event &e, ibv_context **context) {
    const void *obj = nullptr;
    ibv_context *ctx = nullptr;
    switch (e.event_type) {
        case IBV_EVENT_CQ_ERR:
            obj = e.element.cq;
            ctx = e.element.cq != nullptr ? e.element.cq->context : nullptr;
            break;
        case IBV_EVENT_SRQ_ERR:
        case IBV_EVENT_SRQ_LIMIT_REACHED:
            obj = e.element.srq;
            ctx = e.element.srq != nullptr ? e.element.srq->context : nullptr;
            break;
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_COMM_EST:
        case IBV_EVENT_SQ_DRAINED:
        case IBV_EVENT_PATH_MIG:
        case IBV_EVENT_PATH_MIG_ERR:
        case IBV_EVENT_QP_LAST_WQE_REACHED:
            obj = e.element.qp;
            ctx = e.element.qp != nullptr ? e.element.qp->context : nullptr;
            break;
        default:
            break;
    }
    if (context != nullptr) {
        *context = ctx;
    }
    return obj;
}

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
    if (const void *obj = objectOf(*out)) {
        ++unacked_[obj];
    }
    return 0;
}

void AsyncEventQueue::ack(const ibv_async_event &event) {
    const void *obj = objectOf(event);
    if (obj == nullptr) {
        return;
    }
    std::lock_guard lock(mutex_);
    auto it = unacked_.find(obj);
    if (it != unacked_.end() && --it->second <= 0) {
        unacked_.erase(it);
        acked_.notify_all();
    }
}

void AsyncEventQueue::forget(const void *object) {
    std::unique_lock lock(mutex_);
    // The semaphore keeps the counts of dropped events: a later get() finds the queue empty
    // and answers EAGAIN, as for a spurious wake-up.
    std::erase_if(events_, [object](const ibv_async_event &e) { return objectOf(e) == object; });
    if (!acked_.wait_for(lock, std::chrono::seconds(5),
                         [&] { return unacked_.find(object) == unacked_.end(); })) {
        std::fprintf(stderr,
                     "simhca: destroying an object with async events not acknowledged after 5 s "
                     "(ibv_ack_async_event(3); the kernel would wait forever)\n");
        unacked_.erase(object);
    }
}

}  // namespace tensorlane::simhca
