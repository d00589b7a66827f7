// The shim's control connection to the sidecar: the SOCK_SEQPACKET socket, the greeting that
// brings the session segment and its two doorbells, and one call (a message and its reply,
// matched by sequence number) at a time. The socket's hang-up is how the shim learns that the
// sidecar went away, so whether the connection is dead is kept here too.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>

#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/ipc/status.hpp"

namespace tensorlane::shim {

using ipc::Code;

/// The header of a control message of `type` (its seq is set by ControlChannel::call()).
inline ipc::MsgHeader messageHeader(ipc::MsgType type) {
    return ipc::MsgHeader{ipc::kControlMagic, ipc::kControlVersion, static_cast<uint16_t>(type), 0};
}

class ControlChannel {
public:
    /// What the sidecar's greeting brings: its hello (strings NUL-terminated) and the session
    /// segment's fd with the two doorbells (client to sidecar, sidecar to client).
    struct Greeting {
        ipc::HelloMsg hello{};
        ipc::UniqueFd segment;
        ipc::UniqueFd to_sidecar;
        ipc::UniqueFd to_client;
    };

    /// Connects to the sidecar at `path` and reads its greeting; on failure tl_last_error says
    /// why.
    Code connect(const std::string &path, Greeting *out);

    /// One control call: send `msg` (with `send_fds`, at most ipc::kMaxFdsPerMessage), wait
    /// for the reply with the same sequence number. A reply's error text goes to
    /// tl_last_error.
    Code call(void *msg, size_t bytes, ipc::ReplyMsg *reply, ipc::UniqueFd *fd_out,
              std::string *text_out = nullptr, std::span<const int> send_fds = {});

    /// True once the connection is lost (markDead()).
    bool dead() const { return dead_.load(std::memory_order_acquire); }
    /// What markDead() was told first.
    const std::string &deadReason() const { return dead_reason_; }
    void markDead(const std::string &why);
    /// Whether the socket shows the sidecar's hang-up (one poll, no wait).
    bool hungUp() const;
    /// The socket, for a poll that also watches for the hang-up.
    int fd() const { return sock_.get(); }

private:
    ipc::UniqueFd sock_;
    std::atomic<bool> dead_{false};
    std::string dead_reason_;
    // One call at a time.
    std::mutex mu_;
    uint64_t seq_ = 1;
};

}  // namespace tensorlane::shim
