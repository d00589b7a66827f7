#include "control_channel.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>
#include <string_view>

#include "last_error.hpp"
#include "tensorlane/ipc/socket.hpp"

namespace tensorlane::shim {
namespace {

/// How long a control call waits for its reply. Lookups may connect to a peer first.
constexpr int kControlTimeoutMs = 60000;

/// The next step after connect() to the sidecar's socket failed with `rc`: what a user who has
/// just started (or not yet started) a sidecar can do about it.
std::string connectHint(int rc) {
    switch (rc) {
        case ENOENT:
        case ENOTDIR:
            return "no socket there: start the sidecar (`tensorlane-sidecar --config FILE`, or "
                   "`systemctl start tensorlane-sidecar`), or name its [node] socket "
                   "($TENSORLANE_SOCKET; `tensorlane status --socket PATH` or --config FILE)";
        case ECONNREFUSED:
            return "the socket is there but no sidecar listens on it (it stopped): start the "
                   "sidecar again (`tensorlane-sidecar --config FILE`)";
        case EACCES:
        case EPERM:
            return "this uid may not open the socket: add it to the sidecar's [security] "
                   "allowed_uids (or one of its groups to allowed_gids) and restart the sidecar, "
                   "or run as the sidecar's uid or root";
        default:
            return {};
    }
}

}  // namespace

Code ControlChannel::connect(const std::string &path, Greeting *out) {
    if (int rc = ipc::connectSeqpacket(path, &sock_)) {
        const std::string hint = connectHint(rc);
        setLastErrorText("cannot connect to the sidecar at " + path + ": " + std::strerror(rc) +
                         (hint.empty() ? "" : "; " + hint));
        return (rc == EACCES || rc == EPERM) ? Code::kPermission : Code::kConnection;
    }
    pollfd p{sock_.get(), POLLIN, 0};
    if (::poll(&p, 1, kControlTimeoutMs) <= 0) {
        setLastErrorText("the sidecar at " + path + " did not greet us");
        return Code::kConnection;
    }
    ipc::HelloMsg &hello = out->hello;
    ipc::UniqueFd fds[ipc::kMaxFdsPerMessage];
    size_t bytes = 0, nfds = 0;
    int rc = ipc::receiveMessage(sock_.get(), &hello, sizeof(hello), &bytes, fds, &nfds);
    if (rc || bytes != sizeof(hello) || hello.h.magic != ipc::kControlMagic ||
        hello.h.version != ipc::kControlVersion ||
        hello.h.type != static_cast<uint16_t>(ipc::MsgType::kHello)) {
        setLastErrorText("bad greeting from the sidecar at " + path +
                         (rc ? std::string(": ") + std::strerror(rc) : std::string()));
        return Code::kConnection;
    }
    hello.error[sizeof(hello.error) - 1] = '\0';
    hello.node_name[sizeof(hello.node_name) - 1] = '\0';
    if (hello.status != 0) {
        const Code code = ipc::sanitizeCode(hello.status);
        // The sidecar's reason names the rule (allowed_uids/allowed_gids, a quota); the step
        // that lifts it is on this side's operator.
        const bool credentials =
            code == Code::kPermission &&
            std::string_view(hello.error).find("allowed_uids") != std::string_view::npos;
        setLastErrorText(std::string("the sidecar refused us: ") + hello.error +
                         (credentials ? "; add this uid to allowed_uids (or one of its groups "
                                        "to allowed_gids) in the sidecar's config and restart it"
                                      : ""));
        return code;
    }
    if (nfds != 3) {
        setLastErrorText("the sidecar's greeting carried " + std::to_string(nfds) + " fds, not 3");
        return Code::kConnection;
    }
    out->segment = std::move(fds[0]);
    out->to_sidecar = std::move(fds[1]);
    out->to_client = std::move(fds[2]);
    return Code::kOk;
}

Code ControlChannel::call(void *msg, size_t bytes, ipc::ReplyMsg *reply, ipc::UniqueFd *fd_out,
                          std::string *text_out, std::span<const int> send_fds) {
    std::lock_guard lock(mu_);
    if (dead_.load(std::memory_order_acquire)) {
        setLastErrorText("sidecar connection lost: " + dead_reason_);
        return Code::kConnection;
    }
    auto *h = static_cast<ipc::MsgHeader *>(msg);
    h->seq = seq_++;
    if (int rc = ipc::sendMessage(sock_.get(), msg, bytes, send_fds)) {
        markDead(std::string("send: ") + std::strerror(rc));
        setLastErrorText("sidecar connection lost: " + dead_reason_);
        return Code::kConnection;
    }
    std::string buf(ipc::kMaxControlMessage, '\0');
    for (;;) {
        pollfd p{sock_.get(), POLLIN, 0};
        int n = ::poll(&p, 1, kControlTimeoutMs);
        if (n == 0) {
            setLastErrorText("the sidecar did not answer in time");
            return Code::kTimedOut;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        size_t got = 0, nfds = 0;
        ipc::UniqueFd fds[ipc::kMaxFdsPerMessage];
        int rc = ipc::receiveMessage(sock_.get(), buf.data(), buf.size(), &got, fds, &nfds);
        if (rc) {
            markDead(rc == ECONNRESET ? "the sidecar closed the connection"
                                      : std::string("receive: ") + std::strerror(rc));
            setLastErrorText("sidecar connection lost: " + dead_reason_);
            return Code::kConnection;
        }
        if (got < sizeof(ipc::ReplyMsg)) {
            continue;  // not a reply; ignore
        }
        std::memcpy(reply, buf.data(), sizeof(*reply));
        if (reply->h.magic != ipc::kControlMagic ||
            reply->h.type != static_cast<uint16_t>(ipc::MsgType::kReply) ||
            reply->h.seq != h->seq) {
            continue;  // a stale reply (an earlier call timed out); ours follows
        }
        reply->error[sizeof(reply->error) - 1] = '\0';
        if (fd_out && nfds > 0) {
            *fd_out = std::move(fds[0]);
        }
        if (text_out) {
            size_t len = std::min<size_t>(reply->value0, got - sizeof(ipc::ReplyMsg));
            text_out->assign(buf.data() + sizeof(ipc::ReplyMsg), len);
        }
        Code c = ipc::sanitizeCode(reply->status);
        if (c != Code::kOk) {
            setLastErrorText(reply->error);
        }
        return c;
    }
}

void ControlChannel::markDead(const std::string &why) {
    // Called with the rings' lock held or from a control call; dead_ is atomic, the reason is
    // written once before it is set.
    if (!dead_.exchange(true)) {
        dead_reason_ = why;
    }
}

bool ControlChannel::hungUp() const {
    pollfd p{sock_.get(), POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

}  // namespace tensorlane::shim
