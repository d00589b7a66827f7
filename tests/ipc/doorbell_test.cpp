// Unit tests of the eventfd doorbells.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::ipc {
namespace {

bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

TEST(Doorbell, EventFdIsNonBlockingAndCloexec) {
    UniqueFd fd;
    ASSERT_EQ(makeEventFd(&fd), 0);
    ASSERT_TRUE(fd);
    EXPECT_TRUE(::fcntl(fd.get(), F_GETFL) & O_NONBLOCK);
    EXPECT_TRUE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC);
    // Empty: a read does not block, it fails at once.
    uint64_t v = 0;
    EXPECT_EQ(::read(fd.get(), &v, sizeof(v)), -1);
    EXPECT_EQ(errno, EAGAIN);
}

TEST(Doorbell, RingWakesPollAndDrainResets) {
    UniqueFd fd;
    ASSERT_EQ(makeEventFd(&fd), 0);
    EXPECT_FALSE(readable(fd.get()));
    ring(fd.get());
    EXPECT_TRUE(readable(fd.get()));
    pollfd p{fd.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 1000), 1);  // a blocking poll returns at once too
    EXPECT_TRUE(p.revents & POLLIN);
    drain(fd.get());
    EXPECT_FALSE(readable(fd.get()));
    // Draining an empty doorbell is harmless and does not block.
    drain(fd.get());
    EXPECT_FALSE(readable(fd.get()));
    ring(fd.get());
    EXPECT_TRUE(readable(fd.get()));
}

TEST(Doorbell, ManyRingsCoalesce) {
    UniqueFd fd;
    ASSERT_EQ(makeEventFd(&fd), 0);
    for (int i = 0; i < 100000; ++i) {
        ring(fd.get());
    }
    uint64_t count = 0;
    ASSERT_EQ(::read(fd.get(), &count, sizeof(count)), 8);
    EXPECT_EQ(count, 100000u);
    EXPECT_FALSE(readable(fd.get()));
    // One drain after many rings clears them all.
    for (int i = 0; i < 1000; ++i) {
        ring(fd.get());
    }
    drain(fd.get());
    EXPECT_FALSE(readable(fd.get()));
}

TEST(Doorbell, RingOnSaturatedCounterDoesNotBlock) {
    UniqueFd fd;
    ASSERT_EQ(makeEventFd(&fd), 0);
    const uint64_t max = 0xfffffffffffffffeull;  // the largest value an eventfd holds
    ASSERT_EQ(::write(fd.get(), &max, sizeof(max)), 8);
    ::alarm(10);  // watchdog: a blocking write here would hang the test
    ring(fd.get());
    ring(fd.get());
    ::alarm(0);
    EXPECT_TRUE(readable(fd.get()));
    drain(fd.get());
    EXPECT_FALSE(readable(fd.get()));
}

TEST(Doorbell, RingAndDrainNeverBlockNorFailLoudly) {
    // A closed or invalid fd (a session torn down under us) is EBADF, nothing more.
    errno = 0;
    ring(-1);
    drain(-1);
    EXPECT_EQ(errno, EBADF);
    // A saturated counter: a blocking write would wait for a reader forever; ring() returns
    // (EAGAIN) and the pending wake-up is still there for the sleeper.
    UniqueFd fd;
    ASSERT_EQ(makeEventFd(&fd), 0);
    const uint64_t almost_full = 0xfffffffffffffffeull;
    ASSERT_EQ(::write(fd.get(), &almost_full, sizeof almost_full), 8);
    ring(fd.get());
    pollfd p{fd.get(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 1);
    // drain() resets it; draining an empty one returns at once (EAGAIN) instead of blocking.
    drain(fd.get());
    EXPECT_EQ(::poll(&p, 1, 0), 0);
    drain(fd.get());
    EXPECT_EQ(errno, EAGAIN);
}

}  // namespace
}  // namespace tensorlane::ipc
