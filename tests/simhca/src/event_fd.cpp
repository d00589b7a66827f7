#include "event_fd.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace tensorlane::simhca {

EventFd::EventFd() : fd_(::eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC)) {}

EventFd::~EventFd() {
    if (fd_ >= 0) {
        ::close(fd_);
    }
}

void EventFd::post() const {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof(one));
}

bool EventFd::take() const {
    uint64_t v = 0;
    return ::read(fd_, &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v));
}

}  // namespace tensorlane::simhca
