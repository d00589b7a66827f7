// A connected, non-blocking AF_UNIX stream pair for the unit tests of Connection: `ours` is
// handed to the connection (which closes it), `theirs` is the other end, closed here.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tensorlane::sidecar {

struct SocketPair {
    SocketPair() {
        int fds[2];
        EXPECT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds));
        ours = fds[0];
        theirs = fds[1];
    }
    ~SocketPair() {
        if (theirs >= 0) {
            ::close(theirs);
        }
    }
    SocketPair(const SocketPair &) = delete;
    SocketPair &operator=(const SocketPair &) = delete;
    int ours = -1;
    int theirs = -1;
};

}  // namespace tensorlane::sidecar
