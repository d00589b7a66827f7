// A minimal HTTP/1.1 client over a loopback TCP socket, for the metrics tests: GET with
// Connection: close, and raw bytes for the hostile-client tests. No library, so the tests see
// exactly what went over the wire.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace tltest {

struct HttpResponse {
    int status = 0;  ///< 0: no (parsable) response
    std::string headers;
    std::string body;
};

/// A connected socket to host:port, or -1.
inline int tcpConnect(const std::string &host, uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (fd < 0 || ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 ||
        ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        if (fd >= 0) {
            ::close(fd);
        }
        return -1;
    }
    return fd;
}

/// A socket connected to host:port from the local address `from` (another loopback address of
/// this host, say, to stand for another client), or -1.
inline int tcpConnectFrom(const std::string &from, const std::string &host, uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (fd < 0 || ::inet_pton(AF_INET, from.c_str(), &src.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr *>(&src), sizeof src) != 0 ||
        ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 ||
        ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        if (fd >= 0) {
            ::close(fd);
        }
        return -1;
    }
    return fd;
}

/// Whether the other end has closed `fd` (or reset it); false while it is open and silent.
inline bool closedByPeer(int fd) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) {
        return false;
    }
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/// Reads until the peer closes or `timeout` passes.
inline std::string readAll(int fd, std::chrono::milliseconds timeout) {
    std::string out;
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              end - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) {
            break;
        }
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(left)) <= 0) {
            break;
        }
        char buf[65536];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            break;
        }
        out.append(buf, static_cast<size_t>(n));
    }
    return out;
}

inline HttpResponse parseResponse(const std::string &raw) {
    HttpResponse r;
    const size_t end = raw.find("\r\n\r\n");
    if (raw.rfind("HTTP/1.", 0) != 0 || end == std::string::npos || raw.size() < 12) {
        return r;
    }
    r.status = std::atoi(raw.c_str() + 9);
    r.headers = raw.substr(0, end);
    r.body = raw.substr(end + 4);
    return r;
}

/// Sends `request` as is and reads the whole answer.
inline HttpResponse rawRequest(const std::string &host, uint16_t port, const std::string &request,
                               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const int fd = tcpConnect(host, port);
    if (fd < 0) {
        return {};
    }
    (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    HttpResponse r = parseResponse(readAll(fd, timeout));
    ::close(fd);
    return r;
}

inline HttpResponse httpGet(const std::string &host, uint16_t port, const std::string &target,
                            std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    return rawRequest(host, port,
                      "GET " + target + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) +
                          "\r\nConnection: close\r\n\r\n",
                      timeout);
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters stay).
inline std::string urlEncode(const std::string &s) {
    static const char *kHex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += kHex[c >> 4];
            out += kHex[c & 15];
        }
    }
    return out;
}

}  // namespace tltest
