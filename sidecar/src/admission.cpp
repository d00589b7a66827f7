#include "admission.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace tensorlane::sidecar {
namespace {

/// File descriptors this process has open now (/proc/self/fd); 0 when it cannot be read.
uint64_t openFds() {
    DIR *d = ::opendir("/proc/self/fd");
    if (d == nullptr) {
        return 0;
    }
    uint64_t n = 0;
    while (const dirent *e = ::readdir(d)) {
        n += e->d_name[0] != '.';
    }
    ::closedir(d);
    return n > 0 ? n - 1 : 0;  // less the directory's own fd
}

/// The fds one more session needs at most: its socket (already accepted), two eventfds and
/// the segment's memfd until the greeting has left.
constexpr uint64_t kSessionFds = 4;

}  // namespace

bool Admission::admit(const ipc::PeerCred &cred, size_t sessions, std::string *why) const {
    const auto &l = limits_;
    const auto u = sessions_of_uid_.find(cred.uid);
    const uint32_t of_uid = u == sessions_of_uid_.end() ? 0 : u->second;
    if (of_uid >= l.sessions_per_uid) {
        *why = "quota: uid " + std::to_string(cred.uid) + " holds " + std::to_string(of_uid) +
               " sessions, the most [limits] sessions_per_uid allows";
        return false;
    }
    // pid 0: a client in a pid namespace we cannot see into; its pid says nothing.
    if (cred.pid != 0) {
        const auto p = sessions_of_pid_.find(cred.pid);
        const uint32_t of_pid = p == sessions_of_pid_.end() ? 0 : p->second;
        if (of_pid >= l.sessions_per_pid) {
            *why = "quota: pid " + std::to_string(cred.pid) + " holds " + std::to_string(of_pid) +
                   " sessions, the most [limits] sessions_per_pid allows";
            return false;
        }
    }
    // A uid that holds a session already may not use the last fd_reserve fds: they are kept
    // so that another uid always gets in (and `tensorlane status` with it). Counted only for
    // such a uid, and only here, once per accept near the limit (/proc/self/fd).
    if (of_uid > 0 && l.fd_reserve > 0) {
        rlimit lim{};
        // Counted only when it could matter: what the sessions, the fds open at start and a
        // generous allowance for the transports may hold together comes near the limit.
        constexpr uint64_t kTransportAllowance = 4096;
        const uint64_t could_hold =
            (sessions + 1) * kSessionFds + fd_baseline_ + kTransportAllowance + l.fd_reserve;
        if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
            could_hold >= lim.rlim_cur) {
            const uint64_t open = openFds();
            const uint64_t left = lim.rlim_cur > open ? lim.rlim_cur - open : 0;
            if (left < kSessionFds + l.fd_reserve) {
                *why = "the sidecar has " + std::to_string(left) +
                       " file descriptors left, and [limits] fd_reserve = " +
                       std::to_string(l.fd_reserve) +
                       " of them are held back for uids with no "
                       "session yet (uid " +
                       std::to_string(cred.uid) + " holds " + std::to_string(of_uid) + ")";
                return false;
            }
        }
    }
    return true;
}

void Admission::takeFdBaseline() {
    fd_baseline_ = openFds();
}

bool Admission::allowed(const ipc::PeerCred &cred, int fd, std::string *why) const {
    if (cred.uid == 0 || cred.uid == ::geteuid()) {
        return true;
    }
    const auto &sec = security_;
    if (std::find(sec.allowed_uids.begin(), sec.allowed_uids.end(), cred.uid) !=
        sec.allowed_uids.end()) {
        return true;
    }
    if (!sec.allowed_gids.empty()) {
        // The primary gid and every supplementary group, as the kernel recorded them at
        // connect() (SO_PEERGROUPS), else as /proc/<pid>/status says now.
        std::vector<gid_t> groups;
        if (int rc = ipc::peerGroups(fd, cred.pid, &groups)) {
            *why = "cannot read the groups of pid " + std::to_string(cred.pid) + ": " +
                   std::strerror(rc);
            return false;
        }
        groups.push_back(cred.gid);
        for (gid_t g : groups) {
            if (std::find(sec.allowed_gids.begin(), sec.allowed_gids.end(), g) !=
                sec.allowed_gids.end()) {
                return true;
            }
        }
    }
    *why = "uid " + std::to_string(cred.uid) + " (gid " + std::to_string(cred.gid) +
           ", and its supplementary groups) is not allowed by the sidecar's [security] "
           "allowed_uids/allowed_gids";
    return false;
}

void Admission::opened(const ipc::PeerCred &cred) {
    ++sessions_of_uid_[cred.uid];
    ++sessions_of_pid_[cred.pid];
}

void Admission::closed(const ipc::PeerCred &cred) {
    if (auto u = sessions_of_uid_.find(cred.uid); u != sessions_of_uid_.end() && --u->second == 0) {
        sessions_of_uid_.erase(u);
    }
    if (auto p = sessions_of_pid_.find(cred.pid); p != sessions_of_pid_.end() && --p->second == 0) {
        sessions_of_pid_.erase(p);
    }
}

}  // namespace tensorlane::sidecar
