#include "bench_tcp.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace tensorlane::tools::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x544c4248;  // "TLBH"
constexpr uint32_t kPingPong = 1;
constexpr uint32_t kStream = 2;

struct Hello {
    uint32_t magic;
    uint32_t mode;
    uint64_t bytes;
};

/// Sends all of `p`. False on a socket error or when interrupted.
bool sendAll(int fd, const void *p, size_t n) {
    auto *b = static_cast<const uint8_t *>(p);
    while (n > 0) {
        ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR && !interrupted()) {
                continue;
            }
            return false;
        }
        b += k;
        n -= static_cast<size_t>(k);
    }
    return true;
}

/// Receives exactly `n` bytes. False at end of stream, on an error or when interrupted.
bool recvAll(int fd, void *p, size_t n) {
    auto *b = static_cast<uint8_t *>(p);
    while (n > 0) {
        ssize_t k = ::recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR && !interrupted()) {
            continue;
        }
        if (k <= 0) {
            return false;
        }
        b += k;
        n -= static_cast<size_t>(k);
    }
    return true;
}

void noDelay(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void serveOne(int fd) {
    Hello h{};
    if (!recvAll(fd, &h, sizeof(h)) || h.magic != kMagic || h.bytes == 0 ||
        h.bytes > (uint64_t{1} << 32)) {
        return;
    }
    std::vector<uint8_t> buf(h.bytes);
    if (h.mode == kPingPong) {
        noDelay(fd);
        while (recvAll(fd, buf.data(), buf.size()) && sendAll(fd, buf.data(), buf.size())) {
        }
    } else if (h.mode == kStream) {
        uint64_t total = 0;
        for (;;) {
            ssize_t k = ::recv(fd, buf.data(), buf.size(), 0);
            if (k < 0 && errno == EINTR && !interrupted()) {
                continue;
            }
            if (k <= 0) {
                break;
            }
            total += static_cast<uint64_t>(k);
        }
        (void)sendAll(fd, &total, sizeof(total));
    }
}

}  // namespace

TcpBaseline TcpBaseline::start() {
    int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0) {
        throw BenchError(std::string("socket: ") + std::strerror(errno));
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(lfd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 || ::listen(lfd, 4) != 0 ||
        ::getsockname(lfd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
        int err = errno;
        ::close(lfd);
        throw BenchError(std::string("baseline server: ") + std::strerror(err));
    }
    TcpBaseline b;
    b.port_ = ntohs(a.sin_port);
    b.server_ = Child::fork([lfd] {
        while (!interrupted()) {
            int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) {
                continue;  // EINTR: the loop checks the flag
            }
            serveOne(fd);
            ::close(fd);
        }
        return 0;
    });
    ::close(lfd);
    return b;
}

int TcpBaseline::connectServer(uint32_t mode, uint64_t bytes) {
    if (!server_.running()) {
        throw BenchError("the TCP baseline server exited");
    }
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port_);
    Hello h{kMagic, mode, bytes};
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 ||
        !sendAll(fd, &h, sizeof(h))) {
        int err = errno;
        if (fd >= 0) {
            ::close(fd);
        }
        checkInterrupted();
        throw BenchError(std::string("cannot reach the TCP baseline server: ") +
                         std::strerror(err));
    }
    return fd;
}

void TcpBaseline::pingPong(uint64_t bytes, const Budget &budget, std::vector<double> *samples) {
    int fd = connectServer(kPingPong, bytes);
    noDelay(fd);
    std::vector<uint8_t> out(bytes, 0x5a), in(bytes);
    bool good = true;
    for (uint64_t i = 0; i < budget.warmup && good; ++i) {
        good = sendAll(fd, out.data(), bytes) && recvAll(fd, in.data(), bytes);
    }
    const auto start = Clock::now();
    const auto limit = std::chrono::duration<double>(budget.duration_s);
    for (uint64_t done = 0;
         good && done < budget.iters && (done < budget.min_iters || Clock::now() - start < limit);
         ++done) {
        auto t0 = Clock::now();
        good = sendAll(fd, out.data(), bytes) && recvAll(fd, in.data(), bytes);
        samples->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    ::close(fd);
    checkInterrupted();
    if (!good) {
        throw BenchError("TCP ping-pong baseline: the connection broke");
    }
}

Bandwidth TcpBaseline::stream(uint64_t bytes, const Budget &budget) {
    int fd = connectServer(kStream, bytes);
    std::vector<uint8_t> out(bytes, 0x5a);
    Bandwidth b;
    bool good = true;
    const auto start = Clock::now();
    const auto limit = std::chrono::duration<double>(budget.duration_s);
    while (good && (b.writes < budget.min_iters || Clock::now() - start < limit)) {
        good = sendAll(fd, out.data(), bytes);
        ++b.writes;
    }
    uint64_t received = 0;
    good = good && ::shutdown(fd, SHUT_WR) == 0 && recvAll(fd, &received, sizeof(received));
    b.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    ::close(fd);
    checkInterrupted();
    b.bytes = b.writes * bytes;
    if (!good || received != b.bytes) {
        throw BenchError("TCP stream baseline: the server received " + std::to_string(received) +
                         " of " + std::to_string(b.bytes) + " bytes");
    }
    return b;
}

}  // namespace tensorlane::tools::bench
