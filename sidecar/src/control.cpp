// The client socket protocol: accepting workers (credentials, segment, doorbells) and the
// infrequent calls that travel over the socket (alloc, register, expose, lookup, status).
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine_impl.hpp"
#include "tensorlane/ipc/doorbell.hpp"
#include "tensorlane/ipc/socket.hpp"

namespace tensorlane::sidecar {
namespace {

ipc::MsgHeader header(ipc::MsgType type, uint64_t seq) {
    return ipc::MsgHeader{ipc::kControlMagic, ipc::kControlVersion, static_cast<uint16_t>(type),
                          seq};
}

template <class T>
bool readAs(const unsigned char *msg, size_t bytes, T *out) {
    if (bytes != sizeof(T)) {
        return false;
    }
    std::memcpy(out, msg, sizeof(T));
    return true;
}

bool validName(const char *s) {
    for (; *s; ++s) {
        char c = *s;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-' || c == '/' || c == ':';
        if (!ok) {
            return false;
        }
    }
    return true;
}

}  // namespace

bool EngineImpl::allowed(const ipc::PeerCred &cred) const {
    if (cred.uid == 0 || cred.uid == ::geteuid()) {
        return true;
    }
    for (uint32_t uid : cfg_.security.allowed_uids) {
        if (uid == cred.uid) {
            return true;
        }
    }
    for (uint32_t gid : cfg_.security.allowed_gids) {
        if (gid == cred.gid) {
            return true;
        }
    }
    return false;
}

void EngineImpl::refuse(int fd, Code code, const std::string &why) {
    ipc::HelloMsg hello{};
    hello.h = header(ipc::MsgType::kHello, 0);
    hello.status = static_cast<int32_t>(code);
    ipc::copyName(hello.node_name, sizeof(hello.node_name), cfg_.node.name.c_str());
    ipc::copyName(hello.error, sizeof(hello.error), why.c_str());
    (void)ipc::sendMessage(fd, &hello, sizeof(hello));
    ++counters_.sessions_refused;
}

void EngineImpl::acceptClients() {
    for (;;) {
        ipc::UniqueFd fd;
        int rc = ipc::acceptSeqpacket(listen_.get(), &fd);
        if (rc == EAGAIN || rc == EWOULDBLOCK) {
            return;
        }
        if (rc) {
            // EMFILE and friends: log and stop accepting for this turn; nothing is lost.
            log_->error("accept on {}: {}", cfg_.node.socket, std::strerror(rc));
            return;
        }
        ipc::PeerCred cred;
        if (int err = ipc::peerCredentials(fd.get(), &cred)) {
            log_->warn("SO_PEERCRED: {}; refusing the connection", std::strerror(err));
            continue;
        }
        if (!allowed(cred)) {
            log_->warn("refused pid {} uid {} gid {}: not in [security] allowed_uids/gids",
                       cred.pid, cred.uid, cred.gid);
            refuse(fd.get(), Code::kPermission,
                   "uid " + std::to_string(cred.uid) + " gid " + std::to_string(cred.gid) +
                       " is not allowed by the sidecar's [security] allowed_uids/allowed_gids");
            continue;
        }

        auto s = std::make_unique<Session>();
        s->id = next_session_++;
        s->cred = cred;
        const auto geometry = ipc::SegmentGeometry::forDepth(cfg_.ipc.ring_depth);
        std::string error;
        int err = ipc::makeEventFd(&s->to_sidecar);
        if (!err) {
            err = ipc::makeEventFd(&s->to_client);
        }
        if (!err) {
            err = ipc::createSegment(geometry.total_bytes, cred.uid, cred.gid, &s->segment, &error);
        } else {
            error = std::string("eventfd: ") + std::strerror(err);
        }
        if (err) {
            log_->error("session for pid {}: {}", cred.pid, error);
            refuse(fd.get(), Code::kNoMemory, "sidecar could not create the session: " + error);
            continue;
        }
        void *base = s->segment.mapping.data();
        ipc::initSegment(base, geometry, s->id);
        s->view = ipc::SegmentView::at(base, geometry);
        s->requests = ipc::RingConsumer<ipc::Request>(s->view.request_ctl, s->view.requests,
                                                      geometry.request_depth);
        s->completions = ipc::RingProducer<ipc::Completion>(
            s->view.completion_ctl, s->view.completions, geometry.completion_depth);
        s->notifications = ipc::RingProducer<ipc::Notification>(
            s->view.notification_ctl, s->view.notifications, geometry.notification_depth);

        ipc::HelloMsg hello{};
        hello.h = header(ipc::MsgType::kHello, 0);
        hello.status = 0;
        hello.poll_mode = static_cast<uint32_t>(cfg_.ipc.poll_mode);
        hello.spin_us = cfg_.ipc.spin_us;
        hello.ring_depth = cfg_.ipc.ring_depth;
        hello.session_id = s->id;
        hello.segment_bytes = geometry.total_bytes;
        ipc::copyName(hello.node_name, sizeof(hello.node_name), cfg_.node.name.c_str());
        const int fds[3] = {s->segment.fd.get(), s->to_sidecar.get(), s->to_client.get()};
        if (int src = ipc::sendMessage(fd.get(), &hello, sizeof(hello), fds)) {
            log_->warn("pid {} left before its greeting: {}", cred.pid, std::strerror(src));
            continue;
        }
        // The client has its copy of the segment fd; ours is not needed past the mapping.
        s->segment.fd.reset();
        s->sock = std::move(fd);
        int e1 = 0, e2 = 0;
        {
            epoll_event ev{};
            ev.events = EPOLLIN | EPOLLRDHUP;
            ev.data.u64 = kTagSock | s->id;
            e1 = ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, s->sock.get(), &ev);
            ev.events = EPOLLIN;
            ev.data.u64 = kTagBell | s->id;
            e2 = ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, s->to_sidecar.get(), &ev);
        }
        if (e1 || e2) {
            log_->error("epoll_ctl for session {}: {}", s->id, std::strerror(errno));
            continue;
        }
        log_->info("session {} for pid {} uid {} ({} KiB segment, depth {})", s->id, cred.pid,
                   cred.uid, geometry.total_bytes / 1024, geometry.request_depth);
        ++counters_.sessions_accepted;
        active_.push_back(s.get());
        sessions_.emplace(s->id, std::move(s));
    }
}

void EngineImpl::readControl(Session &s) {
    alignas(8) unsigned char buf[1024];
    for (int i = 0; i < 64 && !s.closing; ++i) {
        size_t bytes = 0, nfds = 0;
        ipc::UniqueFd fds[ipc::kMaxFdsPerMessage];
        int rc =
            ipc::receiveMessage(s.sock.get(), buf, sizeof(buf), &bytes, fds, &nfds, MSG_DONTWAIT);
        if (rc == EAGAIN || rc == EWOULDBLOCK) {
            return;
        }
        if (rc == ECONNRESET) {
            closeSession(s, "client hung up");
            return;
        }
        if (rc == EMSGSIZE) {
            log_->warn("session {}: oversized control message dropped", s.id);
            reply(s, 0, Code::kInvalid, 0, 0, "control message too large");
            continue;
        }
        if (rc) {
            closeSession(s, std::string("socket error: ") + std::strerror(rc));
            return;
        }
        handleControl(s, buf, bytes, fds, nfds);
    }
}

void EngineImpl::reply(Session &s, uint64_t seq, Code status, uint64_t v0, uint64_t v1,
                       const std::string &error, int fd) {
    ipc::ReplyMsg r{};
    r.h = header(ipc::MsgType::kReply, seq);
    r.status = static_cast<int32_t>(status);
    r.value0 = v0;
    r.value1 = v1;
    ipc::copyName(r.error, sizeof(r.error), error.c_str());
    int fds[1] = {fd};
    int rc = ipc::sendMessage(s.sock.get(), &r, sizeof(r),
                              fd >= 0 ? std::span<const int>(fds, 1) : std::span<const int>());
    if (rc) {
        // A full socket buffer means the client stopped reading; it cannot be served.
        closeSession(s, std::string("cannot reply: ") + std::strerror(rc));
    }
}

void EngineImpl::handleControl(Session &s, const unsigned char *msg, size_t bytes,
                               ipc::UniqueFd * /*fds*/, size_t nfds) {
    ipc::MsgHeader h{};
    if (bytes < sizeof(h)) {
        reply(s, 0, Code::kInvalid, 0, 0, "control message shorter than its header");
        return;
    }
    std::memcpy(&h, msg, sizeof(h));
    if (h.magic != ipc::kControlMagic || h.version != ipc::kControlVersion) {
        log_->warn("session {}: control message with magic {:#x} version {} (want {:#x} v{})", s.id,
                   h.magic, h.version, ipc::kControlMagic, ipc::kControlVersion);
        reply(s, h.seq, Code::kInvalid, 0, 0, "control protocol mismatch");
        return;
    }
    if (nfds != 0) {
        // No client call passes fds yet (dma-buf arrives with the GPU issue); the UniqueFds
        // that received them close them.
        reply(s, h.seq, Code::kInvalid, 0, 0, "unexpected file descriptors");
        return;
    }
    switch (static_cast<ipc::MsgType>(h.type)) {
        case ipc::MsgType::kAllocHost:
            return dispatch(s, h, msg, bytes, &EngineImpl::onAllocHost);
        case ipc::MsgType::kRegister:
            return dispatch(s, h, msg, bytes, &EngineImpl::onRegister);
        case ipc::MsgType::kDeregister:
            return dispatch(s, h, msg, bytes, &EngineImpl::onDeregister);
        case ipc::MsgType::kExpose:
            return dispatch(s, h, msg, bytes, &EngineImpl::onExpose);
        case ipc::MsgType::kLookup:
            return dispatch(s, h, msg, bytes, &EngineImpl::onLookup);
        case ipc::MsgType::kStatus:
            return dispatch(s, h, msg, bytes, &EngineImpl::onStatus);
        default:
            reply(s, h.seq, Code::kInvalid, 0, 0,
                  "unknown control message type " + std::to_string(h.type));
            return;
    }
}

template <class Msg>
void EngineImpl::dispatch(Session &s, const ipc::MsgHeader &h, const unsigned char *msg,
                          size_t bytes, void (EngineImpl::*handler)(Session &, const Msg &)) {
    // Each message has one fixed size; copy it out of the datagram before looking at it.
    Msg m;
    if (!readAs(msg, bytes, &m)) {
        reply(s, h.seq, Code::kInvalid, 0, 0,
              "control message of type " + std::to_string(h.type) + " has the wrong size");
        return;
    }
    (this->*handler)(s, m);
}

void EngineImpl::onAllocHost(Session &s, const ipc::AllocHostMsg &m) {
    // Bound what one call may ask for; the kernel's shm limits bound the rest.
    constexpr uint64_t kMaxAlloc = uint64_t{1} << 40;
    if (m.bytes == 0 || m.bytes > kMaxAlloc) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0,
              "tl_alloc_host: size " + std::to_string(m.bytes) + " is out of range");
        return;
    }
    ipc::SharedSegment seg;
    std::string error;
    if (ipc::createSegment(m.bytes, s.cred.uid, s.cred.gid, &seg, &error)) {
        log_->warn("session {}: tl_alloc_host({}) failed: {}", s.id, m.bytes, error);
        reply(s, m.h.seq, Code::kNoMemory, 0, 0, "tl_alloc_host: " + error);
        return;
    }
    auto r = std::make_shared<Region>();
    r->owner = s.id;
    r->bytes = seg.mapping.size();
    r->base = static_cast<unsigned char *>(seg.mapping.data());
    r->mapping = std::make_shared<ipc::Mapping>(std::move(seg.mapping));
    RegionId id = regions_.add(r);
    reply(s, m.h.seq, Code::kOk, id, r->bytes, "", seg.fd.get());
}

void EngineImpl::onRegister(Session &s, const ipc::RegisterMsg &m) {
    if (m.kind == static_cast<uint32_t>(ipc::RegionKind::kCuda)) {
        reply(s, m.h.seq, Code::kCuda, 0, 0,
              "CUDA memory registration is not supported by this sidecar yet (host memory "
              "from tl_alloc_host only)");
        return;
    }
    if (m.kind != static_cast<uint32_t>(ipc::RegionKind::kHost)) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0, "unknown region kind " + std::to_string(m.kind));
        return;
    }
    auto parent = regions_.find(m.parent);
    if (!parent || parent->owner != s.id || parent->parent != 0) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0,
              "tl_register: host memory must lie in a buffer from tl_alloc_host");
        return;
    }
    if (!parent->contains(m.offset, m.bytes)) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0, "tl_register: range outside its buffer");
        return;
    }
    auto r = std::make_shared<Region>();
    r->owner = s.id;
    r->parent = parent->id;
    r->base = parent->base + m.offset;
    r->bytes = m.bytes;
    r->mapping = parent->mapping;
    RegionId id = regions_.add(r);
    reply(s, m.h.seq, Code::kOk, id, r->bytes, "");
}

void EngineImpl::onDeregister(Session &s, const ipc::DeregisterMsg &m) {
    auto r = regions_.find(m.region);
    if (!r || r->owner != s.id) {
        reply(s, m.h.seq, Code::kNotFound, 0, 0,
              "tl_deregister: no region " + std::to_string(m.region) + " of this client");
        return;
    }
    releaseRegion(r);
    reply(s, m.h.seq, Code::kOk, 0, 0, "");
}

void EngineImpl::onExpose(Session &s, const ipc::ExposeMsg &m) {
    const char *name = nullptr;
    if (!ipc::readName(m.name, sizeof(m.name), &name) || !validName(name)) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0,
              "tl_expose: a name is 1-63 characters of [A-Za-z0-9._-/:]");
        return;
    }
    auto r = regions_.find(m.region);
    if (!r || r->owner != s.id) {
        reply(s, m.h.seq, Code::kNotFound, 0, 0,
              "tl_expose: no region " + std::to_string(m.region) + " of this client");
        return;
    }
    Status st = regions_.expose(r->id, name);
    if (!st.isOk()) {
        reply(s, m.h.seq, st.code(), 0, 0, "tl_expose: " + st.message());
        return;
    }
    if (peers_) {
        peers_->regionExposed(*r);
    }
    reply(s, m.h.seq, Code::kOk, r->id, r->bytes, "");
}

void EngineImpl::onLookup(Session &s, const ipc::LookupMsg &m) {
    const char *peer = nullptr;
    const char *name = nullptr;
    if (!ipc::readName(m.peer, sizeof(m.peer), &peer) ||
        !ipc::readName(m.name, sizeof(m.name), &name)) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0, "tl_lookup: peer and name must be 1-63 bytes");
        return;
    }
    if (cfg_.node.name == peer) {
        auto r = regions_.findExposed(name);
        if (!r) {
            reply(s, m.h.seq, Code::kNotFound, 0, 0,
                  std::string("tl_lookup: nothing is exposed as '") + name + "' on " + peer);
            return;
        }
        uint64_t handle = s.next_remote++;
        s.remotes[handle] = RemoteRef{kLocalPeer, r->id, r->bytes};
        reply(s, m.h.seq, Code::kOk, handle, r->bytes, "");
        return;
    }
    std::optional<PeerId> pid = peers_ ? peers_->peerByName(peer) : std::nullopt;
    if (!pid) {
        reply(s, m.h.seq, Code::kNotFound, 0, 0,
              std::string("tl_lookup: '") + peer + "' is neither this node (" + cfg_.node.name +
                  ") nor a configured peer");
        return;
    }
    SessionId sid = s.id;
    uint64_t seq = m.h.seq;
    std::string region_name = name;
    peers_->lookup(*pid, region_name,
                   [this, sid, seq, id = *pid, region_name](Status st, RemoteRegion rr) {
                       Session *cs = findSession(sid);
                       if (!cs || cs->closing) {
                           return;
                       }
                       if (!st.isOk()) {
                           reply(*cs, seq, st.code(), 0, 0, "tl_lookup: " + st.message());
                           return;
                       }
                       uint64_t handle = cs->next_remote++;
                       cs->remotes[handle] = RemoteRef{id, rr.id, rr.bytes};
                       reply(*cs, seq, Code::kOk, handle, rr.bytes, "");
                   });
}

void EngineImpl::onStatus(Session &s, const ipc::StatusMsg &m) {
    std::string text = statusJson();
    if (text.size() > ipc::kMaxStatusText) {
        text.resize(ipc::kMaxStatusText);
    }
    std::string buf(sizeof(ipc::ReplyMsg) + text.size(), '\0');
    ipc::ReplyMsg r{};
    r.h = header(ipc::MsgType::kReply, m.h.seq);
    r.status = 0;
    r.value0 = text.size();
    std::memcpy(buf.data(), &r, sizeof(r));
    std::memcpy(buf.data() + sizeof(r), text.data(), text.size());
    if (int rc = ipc::sendMessage(s.sock.get(), buf.data(), buf.size())) {
        closeSession(s, std::string("cannot reply: ") + std::strerror(rc));
    }
}

}  // namespace tensorlane::sidecar
