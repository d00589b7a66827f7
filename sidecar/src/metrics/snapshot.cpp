#include "snapshot.hpp"

#include <algorithm>
#include <cstring>

#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::sidecar {

std::shared_ptr<SnapshotChannel> SnapshotChannel::create(Status *error) {
    std::shared_ptr<SnapshotChannel> ch(new SnapshotChannel());
    if (int rc = ipc::makeEventFd(&ch->fd_)) {
        *error = {Code::kInternal, std::string("metrics: eventfd: ") + std::strerror(rc)};
        return nullptr;
    }
    return ch;
}

std::shared_ptr<const Snapshot> SnapshotChannel::request(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (closed_) {
        return nullptr;
    }
    const uint64_t mine = ++requested_;
    // Ringing under the lock keeps the order simple; the eventfd write never blocks (the
    // counter cannot overflow with one increment per scrape).
    ipc::ring(fd_.get());
    if (!served_cv_.wait_for(lock, timeout, [&] { return closed_ || served_ >= mine; })) {
        return nullptr;
    }
    return closed_ ? nullptr : latest_;
}

void SnapshotChannel::serve(const std::function<Snapshot()> &build) {
    ipc::drain(fd_.get());
    uint64_t answering = 0;
    {
        std::lock_guard lock(mutex_);
        if (closed_ || requested_ == served_) {
            return;
        }
        answering = requested_;
    }
    // Built without the lock: a scrape arriving meanwhile rings again and is answered on a
    // later turn (or shares this one if it is answered first; both are fresh).
    auto snap = std::make_shared<const Snapshot>(build());
    {
        std::lock_guard lock(mutex_);
        latest_ = std::move(snap);
        served_ = std::max(served_, answering);
    }
    served_cv_.notify_all();
}

void SnapshotChannel::close() {
    {
        std::lock_guard lock(mutex_);
        closed_ = true;
        latest_.reset();
    }
    served_cv_.notify_all();
}

}  // namespace tensorlane::sidecar
