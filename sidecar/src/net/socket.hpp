// TCP socket helpers for the peer connections: addresses, non-blocking listen/connect/accept,
// and the socket options every peer connection gets. Functions return 0 or an errno value.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::sidecar {

/// An IPv4 or IPv6 socket address.
struct SockAddr {
    sockaddr_storage storage{};
    socklen_t len = 0;

    /// "1.2.3.4:5" or "[::1]:5".
    std::string text() const;
    uint16_t port() const;
};

/// Milliseconds on CLOCK_MONOTONIC (the clock timerfd deadlines use).
int64_t monotonicMs();

/// A socket call's errno in words; ECONNRESET (fill()'s end of stream too) reads "connection
/// closed by the peer".
std::string errnoText(int rc);

/// Parses a numeric IPv4/IPv6 host ("10.0.0.2", "::1", "[::1]") and a port. False for names.
bool parseNumericAddress(const std::string &host, uint16_t port, SockAddr *out);

/// Resolves `host` (a name or a literal) with getaddrinfo; blocking. Returns 0, or an EAI_*
/// value (negative) or errno; `*error` gets a reason.
int resolveAddress(const std::string &host, uint16_t port, bool passive, SockAddr *out,
                   std::string *error);

/// A non-blocking, close-on-exec listening socket with SO_REUSEADDR.
int listenTcp(const SockAddr &addr, int backlog, ipc::UniqueFd *out);

/// Starts a non-blocking connect. `*in_progress` is true when it completes later (wait for
/// writability, then connectResult()). With `source` (of the same family; its port 0), the
/// connection leaves from that local address.
int connectTcp(const SockAddr &addr, ipc::UniqueFd *out, bool *in_progress,
               const SockAddr *source = nullptr);

/// The outcome of a non-blocking connect (SO_ERROR): 0 or an errno value.
int connectResult(int fd);

/// Accepts one connection (non-blocking, close-on-exec). EAGAIN when none is pending.
int acceptTcp(int listen_fd, ipc::UniqueFd *out, SockAddr *peer);

/// TCP_NODELAY (small writes and acks must not wait for Nagle), TCP_USER_TIMEOUT (unacked data
/// fails the socket after `user_timeout_ms`) and TCP keepalive probing every `keepalive_ms`.
void tunePeerSocket(int fd, uint32_t user_timeout_ms, uint32_t keepalive_ms);

/// The address a socket is bound to.
int localAddress(int fd, SockAddr *out);

}  // namespace tensorlane::sidecar
