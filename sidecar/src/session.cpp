#include "session.hpp"

#include <atomic>

#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::sidecar {

bool Session::complete(uint64_t ticket, Code status, uint64_t bytes) {
    ipc::Completion c{};
    c.ticket = ticket;
    c.status = static_cast<int32_t>(status);
    c.bytes = bytes;
    ++counters.completions;
    published = true;
    if (completion_backlog.empty() && completions.push(c)) {
        completions_dirty = true;
        return true;
    }
    completion_backlog.push_back(c);
    return completion_backlog.size() <= kMaxBacklog;
}

bool Session::notify(const ipc::Notification &n) {
    ++counters.notifications;
    published = true;
    if (notification_backlog.empty() && notifications.push(n)) {
        notifications_dirty = true;
        return true;
    }
    notification_backlog.push_back(n);
    return notification_backlog.size() <= kMaxBacklog;
}

size_t Session::flushBacklog() {
    size_t moved = 0;
    while (!completion_backlog.empty() && completions.push(completion_backlog.front())) {
        completion_backlog.pop_front();
        completions_dirty = true;
        ++moved;
    }
    while (!notification_backlog.empty() && notifications.push(notification_backlog.front())) {
        notification_backlog.pop_front();
        notifications_dirty = true;
        ++moved;
    }
    if (moved) {
        published = true;
    }
    return moved;
}

void Session::publish() {
    if (!published) {
        return;
    }
    published = false;
    // Only rings that changed. A client that scribbles on the heads it owns is caught when a
    // ring looks full, and here on the first and every kHeadCheckEvery-th publish: reading
    // the head line at every publish would pull it out of the client's cache, and the
    // client's next store to it would then wait for that line on its way to the next request.
    const bool check_heads = publishes++ % kHeadCheckEvery == 0;
    if (completions_dirty) {
        completions_dirty = false;
        completions.publish();
    }
    if (notifications_dirty) {
        notifications_dirty = false;
        notifications.publish();
    }
    if (check_heads) {
        completions.check();
        notifications.check();
    }
    // SYNC POINT: seq_cst fence between publishing the slots and reading client_waiting; the
    // client stores client_waiting, fences, then re-reads the slots before sleeping (Dekker),
    // so either it sees our entries or we see its flag and ring it.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (view.header->client_waiting.value.load(std::memory_order_relaxed) != 0) {
        ipc::ring(to_client.get());
    }
}

}  // namespace tensorlane::sidecar
