// A semaphore eventfd (eventfd(2) with EFD_SEMAPHORE): one count per queued event, so the fd
// polls readable exactly while events are queued, as the kernel's async and completion-event
// files do (ibv_get_async_event(3), ibv_get_cq_event(3)).
#pragma once

namespace tensorlane::simhca {

/// Owns one semaphore eventfd.
class EventFd {
public:
    /// A new semaphore eventfd (close-on-exec, blocking until the application says otherwise).
    EventFd();
    ~EventFd();
    EventFd(const EventFd &) = delete;
    EventFd &operator=(const EventFd &) = delete;

    /// The descriptor handed to the application (ibv_context::async_fd, ibv_comp_channel::fd).
    [[nodiscard]] int fd() const { return fd_; }
    /// Adds one count (an event was queued).
    void post() const;
    /// Takes one count, blocking unless the application set O_NONBLOCK on the fd; false (errno
    /// set: EAGAIN, EINTR) when none was taken.
    [[nodiscard]] bool take() const;

private:
    int fd_;
};

}  // namespace tensorlane::simhca
