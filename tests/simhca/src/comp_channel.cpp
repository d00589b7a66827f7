#include "comp_channel.hpp"

#include <cerrno>

namespace tensorlane::simhca {

CompChannel::CompChannel(ibv_context *ctx) {
    handle_.self = this;
    handle_.ibv.context = ctx;
    handle_.ibv.fd = fd_.fd();
    handle_.ibv.refcnt = 0;
}

void CompChannel::notify(SimCq *cq) {
    {
        std::lock_guard lock(mutex_);
        events_.push_back(cq);
    }
    // SYNC POINT: queued before the count that lets ibv_get_cq_event() take it.
    fd_.post();
}

SimCq *CompChannel::get() {
    for (;;) {
        if (!fd_.take()) {
            return nullptr;
        }
        std::lock_guard lock(mutex_);
        if (events_.empty()) {
            errno = EAGAIN;
            return nullptr;
        }
        SimCq *cq = events_.front();
        events_.pop_front();
        if (cq != nullptr) {
            return cq;
        }
    }
}

void CompChannel::forget(SimCq *cq) {
    std::lock_guard lock(mutex_);
    for (SimCq *&e : events_) {
        if (e == cq) {
            e = nullptr;
        }
    }
}

}  // namespace tensorlane::simhca
