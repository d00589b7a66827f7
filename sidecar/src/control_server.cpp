#include "control_server.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "epoll_tags.hpp"
#include "logging.hpp"
#include "region_lifecycle.hpp"
#include "request_pipeline.hpp"
#include "tensorlane/ipc/doorbell.hpp"
#include "tensorlane/ipc/socket.hpp"
#include "tensorlane/sidecar/engine.hpp"
#include "tensorlane/sidecar/peers.hpp"

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

ControlServer::ControlServer(const config::Config &cfg, int epoll_fd, SessionTable &sessions,
                             RegionTable &regions, RegionLifecycle &lifecycle,
                             RequestPipeline &pipeline, PeerManager *peers,
                             EngineCounters &counters, StatusText status)
    : cfg_(cfg),
      epoll_fd_(epoll_fd),
      sessions_(sessions),
      regions_(regions),
      lifecycle_(lifecycle),
      pipeline_(pipeline),
      peers_(peers),
      counters_(counters),
      status_(std::move(status)),
      log_(sidecarLogger()),
      admission_(cfg.security, cfg.limits),
      cuda_(epoll_fd, sessions, lifecycle,
            [this](Session &s, uint64_t seq, Code code, uint64_t v0, uint64_t v1,
                   const std::string &error) { reply(s, seq, code, v0, v1, error); }) {}

ControlServer::~ControlServer() {
    if (listen_) {
        ::unlink(cfg_.node.socket.c_str());
    }
}

Status ControlServer::listen() {
    const std::string &path = cfg_.node.socket;
    std::error_code ec;
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (!dir.empty() && !std::filesystem::exists(dir, ec)) {
        std::filesystem::create_directories(dir, ec);
        if (ec) {
            return {Code::kInternal, "cannot create " + dir.string() + ": " + ec.message()};
        }
    }
    // The socket's mode lets exactly the clients in through the file system that the
    // credential check (SO_PEERCRED, SO_PEERGROUPS) would allow, and no fewer: connecting to a
    // Unix socket needs write permission on it (unix(7)). Only root and our uid: 0600. One
    // allowed group: 0660 with that group. Other uids or several groups cannot be expressed in
    // one file mode: 0666, and the credential check alone decides (docs/security.md).
    const auto &sec = cfg_.security;
    mode_ = 0600;
    if (!sec.allowed_uids.empty() || sec.allowed_gids.size() > 1) {
        mode_ = 0666;
    } else if (sec.allowed_gids.size() == 1) {
        mode_ = 0660;
    }
    if (int rc = ipc::listenSeqpacket(path, mode_, &listen_)) {
        return {Code::kInternal, "cannot listen on " + path + ": " + std::strerror(rc)};
    }
    if (mode_ == 0660 &&
        ::chown(path.c_str(), static_cast<uid_t>(-1), sec.allowed_gids.front()) != 0) {
        return {Code::kPermission, "cannot give " + path + " to group " +
                                       std::to_string(sec.allowed_gids.front()) +
                                       " ([security] allowed_gids): " + std::strerror(errno)};
    }
    if (int rc = addToEpoll(epoll_fd_, listen_.get(), EPOLLIN, kTagListen)) {
        return {Code::kInternal, std::string("epoll_ctl: ") + std::strerror(rc)};
    }
    return Status::ok();
}

void ControlServer::resumeListener() {
    if (std::chrono::steady_clock::now() < listen_paused_until_) {
        return;
    }
    listen_paused_ = false;
    if (int rc = addToEpoll(epoll_fd_, listen_.get(), EPOLLIN, kTagListen)) {
        log_->error("cannot watch {} again: {}", cfg_.node.socket, std::strerror(rc));
        return;
    }
    acceptClients();
}

std::string ControlServer::remotesQuotaText() const {
    return "tl_lookup: quota: this client holds " + std::to_string(cfg_.limits.regions) +
           " remote handles, the most [limits] regions allows";
}

void ControlServer::refuse(int fd, Code code, const std::string &why) {
    ipc::HelloMsg hello{};
    hello.h = header(ipc::MsgType::kHello, 0);
    hello.status = static_cast<int32_t>(code);
    ipc::copyName(hello.node_name, sizeof(hello.node_name), cfg_.node.name.c_str());
    ipc::copyName(hello.error, sizeof(hello.error), why.c_str());
    (void)ipc::sendMessage(fd, &hello, sizeof(hello));
    ++counters_.sessions_refused;
}

size_t ControlServer::reapHungUp(const ipc::PeerCred &cred) {
    std::vector<SessionId> gone;
    for (const auto &[id, s] : sessions_) {
        if (s->cred.uid != cred.uid && (cred.pid == 0 || s->cred.pid != cred.pid)) {
            continue;
        }
        pollfd p{s->sock.get(), POLLRDHUP, 0};
        if (s->closing || (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP)) != 0)) {
            gone.push_back(id);
        }
    }
    for (SessionId id : gone) {
        if (Session *s = sessions_.find(id)) {
            sessions_.close(*s, "client hung up");
        }
        destroySession(id);  // reapClosed() finds it gone
    }
    return gone.size();
}

void ControlServer::acceptClients() {
    // A batch at a time: a client that connects in a tight loop must not keep the engine here,
    // away from its hang-ups (and every other client's requests).
    for (int batch = 0; batch < 64; ++batch) {
        ipc::UniqueFd fd;
        int rc = ipc::acceptSeqpacket(listen_.get(), &fd);
        if (rc == EAGAIN || rc == EWOULDBLOCK) {
            return;
        }
        if (rc == EINTR || rc == ECONNABORTED) {
            continue;
        }
        if (rc) {
            // EMFILE and friends leave the connection in the backlog and the socket readable:
            // stop watching it for a moment instead of spinning on it. Nothing is lost; the
            // clients wait in the backlog (or time out in tl_connect).
            log_->error("accept on {}: {}; not accepting workers for 100 ms", cfg_.node.socket,
                        std::strerror(rc));
            ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_.get(), nullptr);
            listen_paused_ = true;
            listen_paused_until_ =
                std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
            ++counters_.accept_pauses;
            return;
        }
        ipc::PeerCred cred;
        if (int err = ipc::peerCredentials(fd.get(), &cred)) {
            log_->warn("SO_PEERCRED: {}; refusing the connection", std::strerror(err));
            continue;
        }
        std::string why;
        if (!admission_.allowed(cred, fd.get(), &why)) {
            log_->warn("refused pid {} uid {} gid {}: {}", cred.pid, cred.uid, cred.gid, why);
            refuse(fd.get(), Code::kPermission, why);
            continue;
        }
        // A client that disconnected a moment ago may still be counted (its hang-up not yet
        // seen): at a cap, its hung-up sessions are reaped first, then it is asked again.
        bool admit = admission_.admit(cred, sessions_.size(), &why);
        if (!admit && reapHungUp(cred) != 0) {
            why.clear();
            admit = admission_.admit(cred, sessions_.size(), &why);
        }
        if (!admit) {
            log_->warn("refused pid {} uid {}: {}", cred.pid, cred.uid, why);
            ++counters_.session_cap_refusals;
            refuse(fd.get(), Code::kNoMemory, why);
            continue;
        }
        if (!lifecycle_.mappingRoom()) {
            log_->warn("refused pid {}: the sidecar maps {} segments already", cred.pid,
                       lifecycle_.mappings());
            refuse(fd.get(), Code::kNoMemory,
                   "the sidecar has no room for another session (vm.max_map_count)");
            continue;
        }

        auto s = std::make_unique<Session>();
        s->id = sessions_.nextId();
        s->cred = cred;
        {
            // For access lists with gids and reserved names. Unreadable: the primary gid only
            // (a gid list then matches less, never more).
            std::vector<gid_t> groups;
            if (int grc = ipc::peerGroups(fd.get(), cred.pid, &groups)) {
                log_->warn("groups of pid {}: {}; only its primary gid {} counts", cred.pid,
                           std::strerror(grc), cred.gid);
                groups.clear();
            }
            s->groups.assign(groups.begin(), groups.end());
            s->groups.push_back(cred.gid);
        }
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
        s->notification_bound = cfg_.limits.notification_backlog;

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
            e1 = ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, s->sock.get(), &ev);
            ev.events = EPOLLIN;
            ev.data.u64 = kTagBell | s->id;
            e2 = ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, s->to_sidecar.get(), &ev);
        }
        if (e1 || e2) {
            log_->error("epoll_ctl for session {}: {}", s->id, std::strerror(errno));
            continue;
        }
        log_->info("session {} for pid {} uid {} ({} KiB segment, depth {})", s->id, cred.pid,
                   cred.uid, geometry.total_bytes / 1024, geometry.request_depth);
        lifecycle_.mapped();
        s->mappings = 1;
        ++counters_.sessions_accepted;
        admission_.opened(cred);
        sessions_.add(std::move(s));
    }
}

void ControlServer::reapClosed() {
    for (SessionId id : sessions_.takeClosed()) {
        destroySession(id);
    }
}

void ControlServer::destroySession(SessionId id) {
    Session *found = sessions_.find(id);
    if (found == nullptr) {
        return;
    }
    Session &s = *found;
    // Its writes still waiting for a transport or a stream's gate are not sent for a client
    // that is gone: they end now and let go of the memory at once.
    const size_t dropped = pipeline_.dropSession(s);
    if (s.streams) {
        lifecycle_.unmapped();  // the stream segment
    }
    const size_t released = lifecycle_.releaseSession(id);
    lifecycle_.unmapped();  // the session segment
    admission_.closed(s.cred);
    log_->info(
        "session {} (pid {}, uid {}) closed: {}; released {} region(s), {} request(s) in "
        "flight, {} queued write(s) dropped",
        id, s.cred.pid, s.cred.uid, s.close_reason, released, s.in_flight, dropped);
    // Closing the fds removes them from epoll; the segment mapping goes with the session.
    // Writes still in flight keep their regions alive; their completions find no session.
    sessions_.erase(id);
}

void ControlServer::socketEvent(Session &s, uint32_t events) {
    if (events & EPOLLIN) {
        readControl(s);
    }
    if (!s.closing && (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))) {
        sessions_.close(s, "client hung up");
    }
}

void ControlServer::readControl(Session &s) {
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
            sessions_.close(s, "client hung up");
            return;
        }
        if (rc == EMSGSIZE) {
            // Cut to the buffer (or sent with more fds than allowed): refused, but its header
            // came whole, so the refusal names the call it answers, as every other one does (a
            // client takes a reply with another seq for a stale one and would wait it out).
            uint64_t seq = 0;
            if (bytes >= sizeof(ipc::MsgHeader)) {
                ipc::MsgHeader h{};
                std::memcpy(&h, buf, sizeof(h));
                seq = h.seq;
            }
            log_->warn("session {}: oversized control message dropped", s.id);
            reply(s, seq, Code::kInvalid, 0, 0, "control message too large");
            continue;
        }
        if (rc) {
            sessions_.close(s, std::string("socket error: ") + std::strerror(rc));
            return;
        }
        handleControl(s, buf, bytes, fds, nfds);
    }
}

void ControlServer::reply(Session &s, uint64_t seq, Code status, uint64_t v0, uint64_t v1,
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
        sessions_.close(s, std::string("cannot reply: ") + std::strerror(rc));
    }
}

void ControlServer::handleControl(Session &s, const unsigned char *msg, size_t bytes,
                                  ipc::UniqueFd *fds, size_t nfds) {
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
    // Only the registration of CUDA memory carries an fd (the allocation's dma-buf), and a VMM
    // registration's pieces one each; anything else with fds is refused, and the UniqueFds
    // that received them close them.
    const auto type = static_cast<ipc::MsgType>(h.type);
    const size_t max_fds = type == ipc::MsgType::kRegister    ? 1u
                           : type == ipc::MsgType::kVmmPieces ? ipc::kMaxVmmPiecesPerMessage
                                                              : 0u;
    if (nfds > max_fds) {
        reply(s, h.seq, Code::kInvalid, 0, 0, "unexpected file descriptors");
        return;
    }
    switch (static_cast<ipc::MsgType>(h.type)) {
        case ipc::MsgType::kAllocHost:
            return dispatch(s, h, msg, bytes, &ControlServer::onAllocHost);
        case ipc::MsgType::kRegister: {
            ipc::RegisterMsg m;
            if (!readAs(msg, bytes, &m)) {
                reply(s, h.seq, Code::kInvalid, 0, 0, "register message has the wrong size");
                return;
            }
            if (m.kind == static_cast<uint32_t>(ipc::RegionKind::kCuda)) {
                return cuda_.registerCuda(s, m, nfds != 0 ? std::move(fds[0]) : ipc::UniqueFd());
            }
            if (nfds != 0) {
                reply(s, h.seq, Code::kInvalid, 0, 0, "unexpected file descriptors");
                return;
            }
            return onRegister(s, m);
        }
        case ipc::MsgType::kVmmPieces: {
            ipc::VmmPiecesMsg m;
            if (!readAs(msg, bytes, &m)) {
                reply(s, h.seq, Code::kInvalid, 0, 0, "VMM pieces message has the wrong size");
                return;
            }
            return cuda_.stagePieces(s, m, fds, nfds);
        }
        case ipc::MsgType::kStreamSetup:
            if (bytes != sizeof(ipc::MsgHeader)) {
                reply(s, h.seq, Code::kInvalid, 0, 0, "stream setup message has the wrong size");
                return;
            }
            return onStreamSetup(s, h);
        case ipc::MsgType::kStreamSubscribe:
            return dispatch(s, h, msg, bytes, &ControlServer::onStreamSubscribe);
        case ipc::MsgType::kStreamCredit:
            return dispatch(s, h, msg, bytes, &ControlServer::onStreamCredit);
        case ipc::MsgType::kDeregister:
            return dispatch(s, h, msg, bytes, &ControlServer::onDeregister);
        case ipc::MsgType::kExpose:
            return dispatch(s, h, msg, bytes, &ControlServer::onExpose);
        case ipc::MsgType::kExposeAccess:
            return dispatch(s, h, msg, bytes, &ControlServer::onExposeAccess);
        case ipc::MsgType::kLookup:
            return dispatch(s, h, msg, bytes, &ControlServer::onLookup);
        case ipc::MsgType::kStatus:
            return dispatch(s, h, msg, bytes, &ControlServer::onStatus);
        default:
            reply(s, h.seq, Code::kInvalid, 0, 0,
                  "unknown control message type " + std::to_string(h.type));
            return;
    }
}

template <class Msg>
void ControlServer::dispatch(Session &s, const ipc::MsgHeader &h, const unsigned char *msg,
                             size_t bytes, void (ControlServer::*handler)(Session &, const Msg &)) {
    // Each message has one fixed size; copy it out of the datagram before looking at it.
    Msg m;
    if (!readAs(msg, bytes, &m)) {
        reply(s, h.seq, Code::kInvalid, 0, 0,
              "control message of type " + std::to_string(h.type) + " has the wrong size");
        return;
    }
    (this->*handler)(s, m);
}

void ControlServer::onAllocHost(Session &s, const ipc::AllocHostMsg &m) {
    // Bound what one call may ask for; the kernel's shm limits bound the rest.
    constexpr uint64_t kMaxAlloc = uint64_t{1} << 40;
    if (m.bytes == 0 || m.bytes > kMaxAlloc) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0,
              "tl_alloc_host: size " + std::to_string(m.bytes) + " is out of range");
        return;
    }
    RegionId id = 0;
    ipc::UniqueFd fd;
    if (Status st = lifecycle_.allocHost(s, m.bytes, &id, &fd); !st.isOk()) {
        reply(s, m.h.seq, st.code(), 0, 0, "tl_alloc_host: " + st.message());
        return;
    }
    // The client gets its copy of the segment's fd with the reply; ours closes here.
    reply(s, m.h.seq, Code::kOk, id, m.bytes, "", fd.get());
}

void ControlServer::onRegister(Session &s, const ipc::RegisterMsg &m) {
    if (m.kind != static_cast<uint32_t>(ipc::RegionKind::kHost)) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0, "unknown region kind " + std::to_string(m.kind));
        return;
    }
    RegionId id = 0;
    if (Status st = lifecycle_.addRange(s, m.parent, m.offset, m.bytes, &id); !st.isOk()) {
        reply(s, m.h.seq, st.code(), 0, 0, "tl_register: " + st.message());
        return;
    }
    reply(s, m.h.seq, Code::kOk, id, m.bytes, "");
}

void ControlServer::onDeregister(Session &s, const ipc::DeregisterMsg &m) {
    // The client published its earlier writes in the ring before it sent this message: take
    // them first (past the in-flight cap if need be: at most one ring's worth), so they hold
    // the region and end normally instead of failing because a later call overtook them.
    while (!s.closing && pipeline_.drainSession(s, UINT64_MAX) != 0) {
    }
    if (s.closing) {
        return;
    }
    auto r = regions_.find(m.region);
    if (!r || r->owner != s.id) {
        reply(s, m.h.seq, Code::kNotFound, 0, 0,
              "tl_deregister: no region " + std::to_string(m.region) + " of this client");
        return;
    }
    lifecycle_.release(r);
    reply(s, m.h.seq, Code::kOk, 0, 0, "");
}

namespace {

bool meets(const std::vector<uint32_t> &groups, const std::vector<uint32_t> &gids) {
    return std::any_of(gids.begin(), gids.end(), [&](uint32_t g) {
        return std::find(groups.begin(), groups.end(), g) != groups.end();
    });
}

}  // namespace

Status ControlServer::checkReservedName(const Session &s, std::string_view name) const {
    // The longest reserved prefix of the name decides ("kv." for uid 1000 and "kv.team2." for
    // uid 1001: uid 1001 may expose "kv.team2.x", uid 1000 may not).
    const config::ReservedName *match = nullptr;
    for (const auto &e : cfg_.security.reserved_names) {
        if (name.starts_with(e.prefix) && (!match || e.prefix.size() > match->prefix.size())) {
            match = &e;
        }
    }
    if (!match || s.cred.uid == 0 ||
        std::find(match->uids.begin(), match->uids.end(), s.cred.uid) != match->uids.end() ||
        meets(s.groups, match->gids)) {
        return Status::ok();
    }
    return {Code::kPermission,
            "names starting with '" + match->prefix +
                "' are reserved by the sidecar's [security] reserved_names for uids " +
                idList(match->uids) + ", gids " + idList(match->gids) + "; this client is uid " +
                std::to_string(s.cred.uid)};
}

void ControlServer::exposeRegion(Session &s, uint64_t seq, uint64_t region, const char *field,
                                 RegionAccess access, const char *call) {
    const std::string what = std::string(call) + ": ";
    const char *name = nullptr;
    if (!ipc::readName(field, ipc::kRegionNameBytes, &name) || !validName(name)) {
        reply(s, seq, Code::kInvalid, 0, 0, what + "a name is 1-63 characters of [A-Za-z0-9._-/:]");
        return;
    }
    if (std::string_view(name).starts_with(kReservedNamePrefix)) {
        reply(s, seq, Code::kInvalid, 0, 0,
              what + "names starting with '" + kReservedNamePrefix + "' are the sidecar's own");
        return;
    }
    if (Status st = checkReservedName(s, name); !st.isOk()) {
        log_->warn("session {} (pid {} uid {}): {} of '{}' refused: {}", s.id, s.cred.pid,
                   s.cred.uid, call, name, st.message());
        reply(s, seq, st.code(), 0, 0, what + st.message());
        return;
    }
    auto r = regions_.find(region);
    if (!r || r->owner != s.id) {
        reply(s, seq, Code::kNotFound, 0, 0,
              what + "no region " + std::to_string(region) + " of this client");
        return;
    }
    access.owner_uid = s.cred.uid;
    const bool peers = access.peers;
    Status st = regions_.expose(r->id, name, std::move(access));
    if (!st.isOk()) {
        reply(s, seq, st.code(), 0, 0, what + st.message());
        return;
    }
    // The one place that decides which names peers are offered (RegionTable::exposed() is
    // the other half: the bootstrap snapshot and the verbs MRs).
    if (peers_ && peers) {
        peers_->regionExposed(*r);
    }
    reply(s, seq, Code::kOk, r->id, r->bytes, "");
}

void ControlServer::onExpose(Session &s, const ipc::ExposeMsg &m) {
    // tl_expose: the default access, peers and the owner's uid (and root).
    exposeRegion(s, m.h.seq, m.region, m.name, RegionAccess{}, "tl_expose");
}

void ControlServer::onExposeAccess(Session &s, const ipc::ExposeAccessMsg &m) {
    if ((m.flags & ~ipc::kAccessFlagMask) != 0) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0,
              "tl_expose_access: unknown access flags " + std::to_string(m.flags) +
                  " (TL_ACCESS_PEERS | TL_ACCESS_LOCAL_ANY)");
        return;
    }
    if (m.n_uids > ipc::kMaxAccessIds || m.n_gids > ipc::kMaxAccessIds) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0,
              "tl_expose_access: an access list names at most " +
                  std::to_string(ipc::kMaxAccessIds) + " uids and " +
                  std::to_string(ipc::kMaxAccessIds) + " gids (got " + std::to_string(m.n_uids) +
                  " and " + std::to_string(m.n_gids) + ")");
        return;
    }
    RegionAccess access;
    access.peers = (m.flags & ipc::kAccessPeers) != 0;
    access.any_local = (m.flags & ipc::kAccessLocalAny) != 0;
    access.uids.assign(m.uids, m.uids + m.n_uids);
    access.gids.assign(m.gids, m.gids + m.n_gids);
    exposeRegion(s, m.h.seq, m.region, m.name, std::move(access), "tl_expose_access");
}

void ControlServer::onLookup(Session &s, const ipc::LookupMsg &m) {
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
        if (!r->access.allows(s.cred.uid, s.groups)) {
            reply(s, m.h.seq, Code::kPermission, 0, 0,
                  "tl_lookup: uid " + std::to_string(s.cred.uid) + " may not write '" + name +
                      "': its owner's access list allows " + r->access.describe() +
                      "; the owner grants more with tl_expose_access");
            return;
        }
        const uint64_t handle =
            s.remoteHandle(RemoteRef{kLocalPeer, r->id, r->bytes}, cfg_.limits.regions);
        if (handle == 0) {
            reply(s, m.h.seq, Code::kNoMemory, 0, 0, remotesQuotaText());
            return;
        }
        reply(s, m.h.seq, Code::kOk, handle, r->bytes, "");
        return;
    }
    std::optional<PeerId> pid = peers_ ? peers_->peerByName(peer) : std::nullopt;
    if (!pid) {
        if (peers_ == nullptr) {
            reply(s, m.h.seq, Code::kInvalid, 0, 0,
                  std::string("tl_lookup: '") + peer + "' is neither this node (" + cfg_.node.name +
                      ") nor a configured peer; retrying cannot help");
            return;
        }
        const Status why = peers_->unknownPeer(peer);
        reply(s, m.h.seq, why.code(), 0, 0, "tl_lookup: " + why.message());
        return;
    }
    SessionId sid = s.id;
    uint64_t seq = m.h.seq;
    std::string region_name = name;
    peers_->lookup(
        *pid, region_name, [this, sid, seq, id = *pid, region_name](Status st, RemoteRegion rr) {
            Session *cs = sessions_.find(sid);
            if (!cs || cs->closing) {
                return;
            }
            if (!st.isOk()) {
                reply(*cs, seq, st.code(), 0, 0, "tl_lookup: " + st.message());
                return;
            }
            const uint64_t handle =
                cs->remoteHandle(RemoteRef{id, rr.id, rr.bytes, region_name == kProbeRegionName},
                                 cfg_.limits.regions);
            if (handle == 0) {
                reply(*cs, seq, Code::kNoMemory, 0, 0, remotesQuotaText());
                return;
            }
            reply(*cs, seq, Code::kOk, handle, rr.bytes, "");
        });
}

void ControlServer::onStatus(Session &s, const ipc::StatusMsg &m) {
    // Root and the sidecar's own uid (the operators) see every client; anyone else only the
    // sessions of its own uid.
    const bool all = s.cred.uid == 0 || s.cred.uid == ::geteuid();
    if (m.page == 0) {
        // A fresh snapshot, which the later pages read: one consistent document whatever
        // happens between the calls (hundreds of peers take several pages).
        s.status_snapshot = status_(all ? std::nullopt : std::optional<uid_t>(s.cred.uid));
    }
    const std::string &doc = s.status_snapshot;
    const uint64_t from = uint64_t{m.page} * ipc::kMaxStatusText;
    if (m.page != 0 && (doc.empty() || from >= doc.size())) {
        reply(s, m.h.seq, Code::kInvalid, 0, doc.size(),
              "status page " + std::to_string(m.page) + " is past the document (" +
                  std::to_string(doc.size()) + " bytes; ask page 0 first)");
        return;
    }
    const size_t n = std::min<uint64_t>(ipc::kMaxStatusText, doc.size() - from);
    std::string buf(sizeof(ipc::ReplyMsg) + n, '\0');
    ipc::ReplyMsg r{};
    r.h = header(ipc::MsgType::kReply, m.h.seq);
    r.status = 0;
    r.value0 = n;
    r.value1 = doc.size();
    std::memcpy(buf.data(), &r, sizeof(r));
    std::memcpy(buf.data() + sizeof(r), doc.data() + from, n);
    if (from + n == doc.size()) {
        std::string().swap(s.status_snapshot);  // the last page: nothing kept
    }
    if (int rc = ipc::sendMessage(s.sock.get(), buf.data(), buf.size())) {
        sessions_.close(s, std::string("cannot reply: ") + std::strerror(rc));
    }
}

// ---- the stream-ordered calls (docs/gpu.md, "Stream-ordered writes")

void ControlServer::onStreamSetup(Session &s, const ipc::MsgHeader &h) {
    if (s.streams) {
        reply(s, h.seq, Code::kInvalid, 0, 0, "the stream segment exists already");
        return;
    }
    if (!lifecycle_.mappingRoom()) {
        reply(s, h.seq, Code::kNoMemory, 0, 0,
              "the sidecar has no room for another segment (vm.max_map_count)");
        return;
    }
    ipc::UniqueFd fd;
    std::string error;
    auto streams = SessionStreams::create(cfg_.ipc.ring_depth, s.cred.uid, s.cred.gid, &fd, &error);
    if (!streams) {
        log_->warn("session {}: no stream segment: {}", s.id, error);
        reply(s, h.seq, Code::kNoMemory, 0, 0, "stream segment: " + error);
        return;
    }
    const uint32_t slots = streams->ticketSlots();
    s.streams = std::move(streams);
    lifecycle_.mapped();
    pipeline_.addStreamSession(s.id);
    reply(s, h.seq, Code::kOk, slots, ipc::kStreamSubscriptions, "", fd.get());
}

void ControlServer::onStreamSubscribe(Session &s, const ipc::StreamSubscribeMsg &m) {
    auto r = regions_.find(m.region);
    if (!r || r->owner != s.id) {
        reply(s, m.h.seq, Code::kNotFound, 0, 0,
              "tl_stream_wait_notification: no region " + std::to_string(m.region) +
                  " of this client");
        return;
    }
    if (!s.streams) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0, "no stream segment (kStreamSetup first)");
        return;
    }
    uint32_t slot = 0;
    if (Status st = s.streams->subscribe(m.region, m.imm, &slot); !st.isOk()) {
        reply(s, m.h.seq, st.code(), 0, 0, "tl_stream_wait_notification: " + st.message());
        return;
    }
    // From now on notifications for the pair are counted here. Those still in our backlog
    // move to the count; those already in the ring are published before we answer, so the
    // client finds every earlier one when it drains the ring after our reply (and credits
    // them back with kStreamCredit).
    uint32_t backlog = 0;
    for (auto it = s.notification_backlog.begin(); it != s.notification_backlog.end();) {
        if (it->n.region == m.region && it->n.imm == m.imm) {
            it = s.notification_backlog.erase(it);
            ++backlog;
        } else {
            ++it;
        }
    }
    s.streams->credit(slot, backlog);
    s.publish();
    reply(s, m.h.seq, Code::kOk, slot, 0, "");
}

void ControlServer::onStreamCredit(Session &s, const ipc::StreamCreditMsg &m) {
    if (!s.streams) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0, "no stream segment");
        return;
    }
    s.streams->credit(m.slot, m.count);
    reply(s, m.h.seq, Code::kOk, 0, 0, "");
}

}  // namespace tensorlane::sidecar
