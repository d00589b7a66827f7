#include "session.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

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

bool Session::pushNotification(ipc::Notification n, std::span<const uint8_t> payload) {
    n.dropped = dropped_pending;
    const uint64_t pos = notifications.tail();
    if (notifications.freeSlots() == 0) {
        return false;
    }
    // The slot is ours until we publish the entry at `pos` (the client released it, with the
    // payload it held, before the ring had room): the payload goes there first.
    n.payload_bytes =
        static_cast<uint16_t>(std::min<size_t>(payload.size(), ipc::kPayloadSlotBytes));
    if (n.payload_bytes != 0) {
        std::memcpy(view.payloads + (pos % notifications.depth()) * ipc::kPayloadSlotBytes,
                    payload.data(), n.payload_bytes);
    }
    if (!notifications.push(n)) {
        return false;
    }
    dropped_pending = 0;
    notifications_dirty = true;
    return true;
}

bool Session::notify(const ipc::Notification &n, std::span<const uint8_t> payload) {
    if (notification_backlog.empty() && pushNotification(n, payload)) {
        ++counters.notifications;
        published = true;
        return true;
    }
    if (notification_backlog.size() >= notification_bound) {
        // Other clients' writes fill this backlog: the target is never closed for them. The
        // data is in place; only the notice is lost, and the count says so.
        ++dropped_pending;
        ++counters.notifications_dropped;
        return false;
    }
    ++counters.notifications;
    published = true;
    notification_backlog.push_back(
        QueuedNotification{n, std::vector<uint8_t>(payload.begin(), payload.end())});
    return true;
}

size_t Session::flushBacklog() {
    size_t moved = 0;
    while (!completion_backlog.empty() && completions.push(completion_backlog.front())) {
        completion_backlog.pop_front();
        completions_dirty = true;
        ++moved;
    }
    while (!notification_backlog.empty() &&
           pushNotification(notification_backlog.front().n, notification_backlog.front().payload)) {
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
