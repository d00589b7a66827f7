// A client that speaks the sidecar's socket and ring protocol by hand, so a test can lie to
// the sidecar (robustness tests, the GPU registration checks).
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/socket.hpp"

namespace tltest {

namespace ipc = tensorlane::ipc;

/// A client that speaks the protocol by hand, so it can lie.
struct RawClient {
    ipc::UniqueFd sock, to_sidecar, to_client, seg_fd;
    ipc::Mapping seg;
    uint64_t seq = 1;
    ipc::SegmentView view;
    ipc::SegmentGeometry geometry;
    int32_t hello_status = -1;
    uint64_t session_id = 0;

    bool connect(const std::string &path) {
        if (ipc::connectSeqpacket(path, &sock)) {
            return false;
        }
        ipc::HelloMsg hello{};
        ipc::UniqueFd fds[ipc::kMaxFdsPerMessage];
        size_t bytes = 0, nfds = 0;
        if (ipc::receiveMessage(sock.get(), &hello, sizeof(hello), &bytes, fds, &nfds)) {
            return false;
        }
        hello_status = hello.status;
        session_id = hello.session_id;
        if (hello.status != 0 || nfds != 3) {
            return false;
        }
        if (ipc::mapSegment(fds[0].get(), hello.segment_bytes, &seg) ||
            !ipc::validateSegment(seg.data(), seg.size(), &geometry)) {
            return false;
        }
        view = ipc::SegmentView::at(seg.data(), geometry);
        seg_fd = std::move(fds[0]);
        to_sidecar = std::move(fds[1]);
        to_client = std::move(fds[2]);
        return true;
    }
    /// One control call by hand: `msg` (its header's seq is set here) and the reply, with the
    /// fd it carried if any.
    /// `send_fds` travel with the message (SCM_RIGHTS), as a dma-buf fd does.
    template <class Msg>
    ipc::ReplyMsg call(Msg &msg, ipc::UniqueFd *fd = nullptr, std::span<const int> send_fds = {}) {
        msg.h = ipc::MsgHeader{ipc::kControlMagic, ipc::kControlVersion, msg.h.type, seq++};
        ipc::ReplyMsg reply{};
        reply.status = -1;
        if (ipc::sendMessage(sock.get(), &msg, sizeof(msg), send_fds) != 0) {
            return reply;
        }
        pollfd p{sock.get(), POLLIN, 0};
        if (::poll(&p, 1, 5000) <= 0) {
            return reply;
        }
        ipc::UniqueFd fds[ipc::kMaxFdsPerMessage];
        size_t got = 0, nfds = 0;
        alignas(8) unsigned char buf[ipc::kMaxControlMessage];
        if (ipc::receiveMessage(sock.get(), buf, sizeof(buf), &got, fds, &nfds) != 0 ||
            got < sizeof(reply)) {
            return reply;
        }
        std::memcpy(&reply, buf, sizeof(reply));
        if (fd != nullptr && nfds > 0) {
            *fd = std::move(fds[0]);
        }
        return reply;
    }
    /// tl_alloc_host by hand, keeping the buffer's fd: returns the region id (0 on failure).
    uint64_t allocHost(uint64_t bytes, ipc::UniqueFd *fd, ipc::Mapping *map) {
        ipc::AllocHostMsg m{};
        m.h.type = static_cast<uint16_t>(ipc::MsgType::kAllocHost);
        m.bytes = bytes;
        ipc::ReplyMsg r = call(m, fd);
        if (r.status != 0 || !*fd || ipc::mapSegment(fd->get(), r.value1, map) != 0) {
            return 0;
        }
        return r.value0;
    }
    /// tl_lookup by hand: the remote handle (0 on failure).
    uint64_t lookup(const char *peer, const char *name) {
        ipc::LookupMsg m{};
        m.h.type = static_cast<uint16_t>(ipc::MsgType::kLookup);
        ipc::copyName(m.peer, sizeof(m.peer), peer);
        ipc::copyName(m.name, sizeof(m.name), name);
        ipc::ReplyMsg r = call(m);
        return r.status == 0 ? r.value0 : 0;
    }
    void doorbell() {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(to_sidecar.get(), &one, sizeof(one));
    }
    /// True once the sidecar has closed our socket.
    bool hungUp(int timeout_ms) {
        pollfd p{sock.get(), POLLRDHUP, 0};
        return ::poll(&p, 1, timeout_ms) > 0 && (p.revents & (POLLHUP | POLLRDHUP));
    }
};

}  // namespace tltest
