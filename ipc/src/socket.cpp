#include "tensorlane/ipc/socket.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tensorlane::ipc {
namespace {

int fillAddress(const std::string &path, sockaddr_un *addr) {
    std::memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof(addr->sun_path)) {
        return ENAMETOOLONG;
    }
    std::memcpy(addr->sun_path, path.data(), path.size());
    return 0;
}

}  // namespace

int listenSeqpacket(const std::string &path, unsigned mode, UniqueFd *out) {
    sockaddr_un addr;
    if (int rc = fillAddress(path, &addr)) {
        return rc;
    }
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
        return errno;
    }
    // A socket file left by a sidecar that died is stale; anything else at that path is not ours.
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            return EEXIST;
        }
        // Stale means nobody listens (connect: ECONNREFUSED). A live socket belongs to a running
        // sidecar: unlinking it would silently cut that sidecar off from new clients.
        UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!probe) {
            return errno;
        }
        if (::connect(probe.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0 ||
            errno != ECONNREFUSED) {
            return EADDRINUSE;
        }
        ::unlink(path.c_str());
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
        return errno;
    }
    if (::chmod(path.c_str(), mode) != 0) {
        int err = errno;
        ::unlink(path.c_str());
        return err;
    }
    if (::listen(fd.get(), 128) != 0) {
        int err = errno;
        ::unlink(path.c_str());
        return err;
    }
    *out = std::move(fd);
    return 0;
}

int connectSeqpacket(const std::string &path, UniqueFd *out) {
    sockaddr_un addr;
    if (int rc = fillAddress(path, &addr)) {
        return rc;
    }
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!fd) {
        return errno;
    }
    if (::connect(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
        return errno;
    }
    *out = std::move(fd);
    return 0;
}

int acceptSeqpacket(int listen_fd, UniqueFd *out) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    out->reset(fd);
    return 0;
}

int peerCredentials(int fd, PeerCred *out) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        return errno;
    }
    out->pid = cred.pid;
    out->uid = cred.uid;
    out->gid = cred.gid;
    return 0;
}

int peerGroups(int fd, pid_t pid, std::vector<gid_t> *out) {
    out->clear();
#ifdef SO_PEERGROUPS
    std::vector<gid_t> groups(64);
    for (int attempt = 0; attempt < 2; ++attempt) {
        socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
            groups.resize(len / sizeof(gid_t));
            *out = std::move(groups);
            return 0;
        }
        if (errno != ERANGE) {
            break;
        }
        // ERANGE: `len` now holds the size needed.
        groups.resize(len / sizeof(gid_t) + 1);
    }
#endif
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    if (!in) {
        return ESRCH;
    }
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Groups:", 0) == 0) {
            std::istringstream fields(line.substr(7));
            unsigned long g = 0;
            while (fields >> g) {
                out->push_back(static_cast<gid_t>(g));
            }
            return 0;
        }
    }
    return ENOENT;
}

int sendMessage(int fd, const void *data, size_t bytes, std::span<const int> fds) {
    if (fds.size() > kMaxFdsPerMessage) {
        return EINVAL;
    }
    iovec iov{const_cast<void *>(data), bytes};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    if (!fds.empty()) {
        std::memset(control, 0, sizeof(control));
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
    }
    for (;;) {
        ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n >= 0) {
            return static_cast<size_t>(n) == bytes ? 0 : EMSGSIZE;
        }
        if (errno != EINTR) {
            return errno;
        }
    }
}

int receiveMessage(int fd, void *buf, size_t cap, size_t *bytes, UniqueFd *fds, size_t *nfds,
                   int flags) {
    *bytes = 0;
    if (nfds) {
        *nfds = 0;
    }
    iovec iov{buf, cap};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n;
    do {
        n = ::recvmsg(fd, &msg, flags | MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        return errno;
    }
    // Take ownership of every fd that came, whatever happens next, so none leaks.
    size_t got = 0;
    bool too_many = false;
    for (cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int rfd;
            std::memcpy(&rfd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (fds && got < kMaxFdsPerMessage) {
                fds[got++].reset(rfd);
            } else {
                ::close(rfd);
                too_many = true;
            }
        }
    }
    if (nfds) {
        *nfds = got;
    }
    if (n == 0) {
        return ECONNRESET;
    }
    *bytes = static_cast<size_t>(n);
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || too_many) {
        for (size_t i = 0; i < got; ++i) {
            fds[i].reset();
        }
        if (nfds) {
            *nfds = 0;
        }
        return EMSGSIZE;
    }
    return 0;
}

}  // namespace tensorlane::ipc
