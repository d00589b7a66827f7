#include "tensorlane/ipc/doorbell.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace tensorlane::ipc {

int makeEventFd(UniqueFd *out) {
    int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    out->reset(fd);
    return 0;
}

void ring(int event_fd) {
    uint64_t one = 1;
    // EAGAIN means the counter is saturated: the other side will wake anyway.
    [[maybe_unused]] ssize_t n = ::write(event_fd, &one, sizeof(one));
}

void drain(int event_fd) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(event_fd, &v, sizeof(v));
}

}  // namespace tensorlane::ipc
