// Doorbells: eventfds that wake a side sleeping in epoll/poll. The flags that say whether a ring
// is worth a syscall live in the segment header (DoorbellFlag).
#pragma once

#include <cstdint>

#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::ipc {

/// Creates a non-blocking, close-on-exec eventfd. Returns 0 or errno.
int makeEventFd(UniqueFd *out);
/// Adds one to the eventfd (wakes a poller). Never blocks; a saturated counter is fine.
void ring(int event_fd);
/// Resets the eventfd's counter to zero (after waking). Never blocks.
void drain(int event_fd);

}  // namespace tensorlane::ipc
