// A loopback TCP port for a test to listen on, shared by the test harnesses.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <mutex>

namespace tltest {

/// A loopback TCP port that is free now and that this process has not been given recently. The
/// port of the probe socket is free again once it closes, and the kernel did hand it out again:
/// two nodes of one test then got one port (one listened, the other failed with EADDRINUSE and
/// its peer reached itself). The last 256 ports given are skipped. 0 if none can be had.
inline uint16_t freePort() {
    static std::mutex mu;
    static std::deque<uint16_t> recent;
    std::lock_guard lock(mu);
    for (int attempt = 0; attempt < 64; ++attempt) {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
            if (fd >= 0) {
                ::close(fd);
            }
            return 0;
        }
        socklen_t len = sizeof a;
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
        ::close(fd);
        const uint16_t port = ntohs(a.sin_port);
        if (std::find(recent.begin(), recent.end(), port) != recent.end()) {
            continue;
        }
        recent.push_back(port);
        if (recent.size() > 256) {
            recent.pop_front();
        }
        return port;
    }
    return 0;
}

}  // namespace tltest
