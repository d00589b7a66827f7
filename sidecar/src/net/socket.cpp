#include "net/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tensorlane::sidecar {

std::string SockAddr::text() const {
    char host[INET6_ADDRSTRLEN] = {0};
    if (storage.ss_family == AF_INET) {
        const auto *a = reinterpret_cast<const sockaddr_in *>(&storage);
        ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
    }
    if (storage.ss_family == AF_INET6) {
        const auto *a = reinterpret_cast<const sockaddr_in6 *>(&storage);
        ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
    }
    return "<unknown address>";
}

uint16_t SockAddr::port() const {
    if (storage.ss_family == AF_INET) {
        return ntohs(reinterpret_cast<const sockaddr_in *>(&storage)->sin_port);
    }
    if (storage.ss_family == AF_INET6) {
        return ntohs(reinterpret_cast<const sockaddr_in6 *>(&storage)->sin6_port);
    }
    return 0;
}

std::string errnoText(int rc) {
    return rc == ECONNRESET ? std::string("connection closed by the peer")
                            : std::string(std::strerror(rc));
}

int64_t monotonicMs() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

bool parseNumericAddress(const std::string &host_in, uint16_t port, SockAddr *out) {
    std::string host = host_in;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
    }
    SockAddr a;
    auto *v4 = reinterpret_cast<sockaddr_in *>(&a.storage);
    if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        a.len = sizeof(sockaddr_in);
        *out = a;
        return true;
    }
    a = SockAddr{};
    auto *v6 = reinterpret_cast<sockaddr_in6 *>(&a.storage);
    if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        a.len = sizeof(sockaddr_in6);
        *out = a;
        return true;
    }
    return false;
}

int resolveAddress(const std::string &host, uint16_t port, bool passive, SockAddr *out,
                   std::string *error) {
    if (parseNumericAddress(host, port, out)) {
        return 0;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    addrinfo *res = nullptr;
    const std::string service = std::to_string(port);
    int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
    if (rc != 0) {
        *error = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
        return rc < 0 ? rc : -rc;
    }
    // Prefer IPv4: peer configs in the wild name dual-stack hosts whose sidecar listens on
    // 0.0.0.0.
    const addrinfo *pick = res;
    for (const addrinfo *p = res; p != nullptr; p = p->ai_next) {
        if (p->ai_family == AF_INET) {
            pick = p;
            break;
        }
    }
    SockAddr a;
    std::memcpy(&a.storage, pick->ai_addr, pick->ai_addrlen);
    a.len = pick->ai_addrlen;
    ::freeaddrinfo(res);
    *out = a;
    return 0;
}

int listenTcp(const SockAddr &addr, int backlog, ipc::UniqueFd *out) {
    ipc::UniqueFd fd(
        ::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP));
    if (!fd) {
        return errno;
    }
    // A restarted sidecar must be able to bind again while old connections sit in TIME_WAIT.
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr *>(&addr.storage), addr.len) != 0) {
        return errno;
    }
    if (::listen(fd.get(), backlog) != 0) {
        return errno;
    }
    *out = std::move(fd);
    return 0;
}

int connectTcp(const SockAddr &addr, ipc::UniqueFd *out, bool *in_progress,
               const SockAddr *source) {
    ipc::UniqueFd fd(
        ::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP));
    if (!fd) {
        return errno;
    }
    if (source != nullptr && source->storage.ss_family == addr.storage.ss_family) {
        // The port is picked at connect (IP_BIND_ADDRESS_NO_PORT), so binding first does not
        // use up the ephemeral ports of the address.
        int one = 1;
        ::setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
        if (::bind(fd.get(), reinterpret_cast<const sockaddr *>(&source->storage), source->len) !=
            0) {
            return errno;
        }
    }
    *in_progress = false;
    if (::connect(fd.get(), reinterpret_cast<const sockaddr *>(&addr.storage), addr.len) != 0) {
        if (errno != EINPROGRESS) {
            return errno;
        }
        *in_progress = true;
    }
    *out = std::move(fd);
    return 0;
}

int connectResult(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        return errno;
    }
    return err;
}

int acceptTcp(int listen_fd, ipc::UniqueFd *out, SockAddr *peer) {
    SockAddr a;
    a.len = sizeof a.storage;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr *>(&a.storage), &a.len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    out->reset(fd);
    *peer = a;
    return 0;
}

void tunePeerSocket(int fd, uint32_t user_timeout_ms, uint32_t keepalive_ms) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // tcp(7): TCP_USER_TIMEOUT bounds how long transmitted data may stay unacknowledged before
    // the kernel closes the connection; it also bounds keepalive probing.
    unsigned timeout = user_timeout_ms;
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof timeout);
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int secs = static_cast<int>((keepalive_ms + 999) / 1000);
    if (secs < 1) {
        secs = 1;
    }
    int count = 3;
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &secs, sizeof secs);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &secs, sizeof secs);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

int localAddress(int fd, SockAddr *out) {
    SockAddr a;
    a.len = sizeof a.storage;
    if (::getsockname(fd, reinterpret_cast<sockaddr *>(&a.storage), &a.len) != 0) {
        return errno;
    }
    *out = a;
    return 0;
}

}  // namespace tensorlane::sidecar
