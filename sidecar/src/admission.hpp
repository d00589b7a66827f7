// Who may use the client socket, and how many sessions each may hold: the credential check
// (SO_PEERCRED, SO_PEERGROUPS against [security] allowed_uids/allowed_gids) and the session caps
// ([limits] sessions_per_uid, sessions_per_pid, fd_reserve). The control server asks it at every
// accept and tells it when a session opens and closes. Engine thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <unordered_map>

#include "tensorlane/config/config.hpp"
#include "tensorlane/ipc/socket.hpp"

namespace tensorlane::sidecar {

class Admission {
public:
    /// Both must outlive this object.
    Admission(const config::SecurityConfig &security, const config::LimitsConfig &limits)
        : security_(security), limits_(limits) {}

    /// Whether a client of `cred` on `fd` may use the socket; `*why` says why not.
    bool allowed(const ipc::PeerCred &cred, int fd, std::string *why) const;
    /// Whether a client of `cred` may have one more session, with `sessions` open now on the
    /// whole node ([limits] sessions_per_uid, sessions_per_pid, fd_reserve); `*why` says why not.
    bool admit(const ipc::PeerCred &cred, size_t sessions, std::string *why) const;
    /// A session of `cred` opened, or closed: counted against its uid and pid.
    void opened(const ipc::PeerCred &cred);
    void closed(const ipc::PeerCred &cred);
    /// Counts the fds open now as the sidecar's own (the fd_reserve estimate): called once it
    /// opened everything of its own, before the first client.
    void takeFdBaseline();

private:
    const config::SecurityConfig &security_;
    const config::LimitsConfig &limits_;
    /// Sessions held now by each uid and each pid.
    std::unordered_map<uid_t, uint32_t> sessions_of_uid_;
    std::unordered_map<pid_t, uint32_t> sessions_of_pid_;
    uint64_t fd_baseline_ = 0;
};

}  // namespace tensorlane::sidecar
