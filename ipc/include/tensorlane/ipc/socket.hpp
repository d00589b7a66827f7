// Unix SOCK_SEQPACKET helpers: listen, connect, send and receive one datagram with fds, peer
// credentials. All return 0 or a positive errno value (never throw).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::ipc {

/// A control message's fds: a VMM registration's pieces travel 32 to a message (control.hpp).
inline constexpr size_t kMaxFdsPerMessage = 32;

/// Credentials of the process at the other end of a Unix socket (SO_PEERCRED).
struct PeerCred {
    pid_t pid = 0;
    uid_t uid = 0;
    gid_t gid = 0;
};

/// Binds and listens on `path` (removing a stale socket file first), mode `mode`, non-blocking
/// and close-on-exec. Returns 0 or an errno value: EADDRINUSE when something still listens on
/// `path`, EEXIST when `path` is not a socket.
int listenSeqpacket(const std::string &path, unsigned mode, UniqueFd *out);
/// Connects to `path`; the fd is blocking and close-on-exec.
int connectSeqpacket(const std::string &path, UniqueFd *out);
/// Accepts one connection (non-blocking, close-on-exec). EAGAIN when none is pending.
int acceptSeqpacket(int listen_fd, UniqueFd *out);
/// Reads SO_PEERCRED.
int peerCredentials(int fd, PeerCred *out);
/// The supplementary groups of the process at the other end: SO_PEERGROUPS (Linux 4.13+: the
/// groups it had when it connected, so a process cannot swap them afterwards), else the Groups
/// line of /proc/<pid>/status. Returns 0 or an errno value.
int peerGroups(int fd, pid_t pid, std::vector<gid_t> *out);

/// Sends one datagram with up to kMaxFdsPerMessage fds. MSG_NOSIGNAL: a gone peer is EPIPE, not
/// a signal. Returns 0 or errno.
int sendMessage(int fd, const void *data, size_t bytes, std::span<const int> fds = {});

/// Receives one datagram into `buf`. `*bytes` gets its length; received fds are stored in `fds`
/// (closed by the caller's UniqueFds), `*nfds` their count. A truncated datagram or too many fds
/// is EMSGSIZE (the fds that came are closed). End of stream is ECONNRESET with *bytes = 0.
/// `flags` may hold MSG_DONTWAIT.
int receiveMessage(int fd, void *buf, size_t cap, size_t *bytes, UniqueFd *fds, size_t *nfds,
                   int flags = 0);

}  // namespace tensorlane::ipc
