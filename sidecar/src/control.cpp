// The client socket protocol: accepting workers (credentials, segment, doorbells) and the
// infrequent calls that travel over the socket (alloc, register, expose, lookup, status).
#include <dirent.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "engine_impl.hpp"
#include "tensorlane/ipc/doorbell.hpp"
#include "tensorlane/ipc/socket.hpp"
#include "tensorlane/sidecar/engine.hpp"

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

bool EngineImpl::admitSession(const ipc::PeerCred &cred, std::string *why) const {
    const auto &l = cfg_.limits;
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
        const uint64_t could_hold = (sessions_.size() + 1) * kSessionFds + fd_baseline_ +
                                    kTransportAllowance + l.fd_reserve;
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

bool EngineImpl::allowed(const ipc::PeerCred &cred, int fd, std::string *why) const {
    if (cred.uid == 0 || cred.uid == ::geteuid()) {
        return true;
    }
    const auto &sec = cfg_.security;
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

std::string EngineImpl::remotesQuotaText() const {
    return "tl_lookup: quota: this client holds " + std::to_string(cfg_.limits.regions) +
           " remote handles, the most [limits] regions allows";
}

Status EngineImpl::checkQuota(const Session &s, uint64_t new_bytes, bool new_mapping) const {
    const auto &l = cfg_.limits;
    if (regions_.countOfSession(s.id) >= l.regions) {
        return {Code::kNoMemory, "quota: this client holds " +
                                     std::to_string(regions_.countOfSession(s.id)) +
                                     " regions, the most [limits] regions allows"};
    }
    if (new_bytes > l.registered_bytes || s.host_bytes > l.registered_bytes - new_bytes) {
        return {Code::kNoMemory, "quota: " + std::to_string(new_bytes) +
                                     " more bytes would take "
                                     "this client past [limits] registered_bytes = " +
                                     config::formatBytes(l.registered_bytes) + " (it holds " +
                                     std::to_string(s.host_bytes) + ")"};
    }
    if (new_bytes > 0 &&
        (new_bytes > node_registered_cap_ || node_host_bytes_ > node_registered_cap_ - new_bytes)) {
        return {Code::kNoMemory, "quota: " + std::to_string(new_bytes) +
                                     " more bytes would take all clients together past [limits] "
                                     "node_registered_bytes = " +
                                     config::formatBytes(node_registered_cap_) + " (" +
                                     node_cap_source_ + "; they hold " +
                                     std::to_string(node_host_bytes_) + ")"};
    }
    if (new_mapping && mappings_ >= max_mappings_) {
        return {Code::kNoMemory,
                "the sidecar maps " + std::to_string(mappings_) +
                    " segments, the most vm.max_map_count leaves it room for; free some "
                    "buffers or raise vm.max_map_count"};
    }
    return Status::ok();
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

size_t EngineImpl::reapHungUp(const ipc::PeerCred &cred) {
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
        if (Session *s = findSession(id)) {
            closeSession(*s, "client hung up");
        }
        destroySession(id);  // reapSessions() finds it gone
    }
    return gone.size();
}

void EngineImpl::acceptClients() {
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
            ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listen_.get(), nullptr);
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
        if (!allowed(cred, fd.get(), &why)) {
            log_->warn("refused pid {} uid {} gid {}: {}", cred.pid, cred.uid, cred.gid, why);
            refuse(fd.get(), Code::kPermission, why);
            continue;
        }
        // A client that disconnected a moment ago may still be counted (its hang-up not yet
        // seen): at a cap, its hung-up sessions are reaped first, then it is asked again.
        bool admit = admitSession(cred, &why);
        if (!admit && reapHungUp(cred) != 0) {
            why.clear();
            admit = admitSession(cred, &why);
        }
        if (!admit) {
            log_->warn("refused pid {} uid {}: {}", cred.pid, cred.uid, why);
            ++counters_.session_cap_refusals;
            refuse(fd.get(), Code::kNoMemory, why);
            continue;
        }
        if (mappings_ >= max_mappings_) {
            log_->warn("refused pid {}: the sidecar maps {} segments already", cred.pid, mappings_);
            refuse(fd.get(), Code::kNoMemory,
                   "the sidecar has no room for another session (vm.max_map_count)");
            continue;
        }

        auto s = std::make_unique<Session>();
        s->id = next_session_++;
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
        ++mappings_;
        s->mappings = 1;
        ++counters_.sessions_accepted;
        ++sessions_of_uid_[cred.uid];
        ++sessions_of_pid_[cred.pid];
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
    // Only the registration of CUDA memory carries an fd (the allocation's dma-buf); anything
    // else with fds is refused, and the UniqueFds that received them close them.
    const bool may_carry_fd = static_cast<ipc::MsgType>(h.type) == ipc::MsgType::kRegister;
    if (nfds > (may_carry_fd ? 1u : 0u)) {
        reply(s, h.seq, Code::kInvalid, 0, 0, "unexpected file descriptors");
        return;
    }
    switch (static_cast<ipc::MsgType>(h.type)) {
        case ipc::MsgType::kAllocHost:
            return dispatch(s, h, msg, bytes, &EngineImpl::onAllocHost);
        case ipc::MsgType::kRegister: {
            ipc::RegisterMsg m;
            if (!readAs(msg, bytes, &m)) {
                reply(s, h.seq, Code::kInvalid, 0, 0, "register message has the wrong size");
                return;
            }
            if (m.kind == static_cast<uint32_t>(ipc::RegionKind::kCuda)) {
                return onRegisterCuda(s, m, nfds != 0 ? std::move(fds[0]) : ipc::UniqueFd());
            }
            if (nfds != 0) {
                reply(s, h.seq, Code::kInvalid, 0, 0, "unexpected file descriptors");
                return;
            }
            return onRegister(s, m);
        }
        case ipc::MsgType::kStreamSetup:
            if (bytes != sizeof(ipc::MsgHeader)) {
                reply(s, h.seq, Code::kInvalid, 0, 0, "stream setup message has the wrong size");
                return;
            }
            return onStreamSetup(s, h);
        case ipc::MsgType::kStreamSubscribe:
            return dispatch(s, h, msg, bytes, &EngineImpl::onStreamSubscribe);
        case ipc::MsgType::kStreamCredit:
            return dispatch(s, h, msg, bytes, &EngineImpl::onStreamCredit);
        case ipc::MsgType::kDeregister:
            return dispatch(s, h, msg, bytes, &EngineImpl::onDeregister);
        case ipc::MsgType::kExpose:
            return dispatch(s, h, msg, bytes, &EngineImpl::onExpose);
        case ipc::MsgType::kExposeAccess:
            return dispatch(s, h, msg, bytes, &EngineImpl::onExposeAccess);
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
    if (Status q = checkQuota(s, m.bytes, true); !q.isOk()) {
        ++counters_.quota_refusals;
        reply(s, m.h.seq, q.code(), 0, 0, "tl_alloc_host: " + q.message());
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
    r->kind = MemoryKind::kHost;
    // What was asked for, not the page-rounded mapping: the client, the peers and every bounds
    // check agree on one size.
    r->bytes = m.bytes;
    r->base = static_cast<unsigned char *>(seg.mapping.data());
    r->mapping = std::make_shared<ipc::Mapping>(std::move(seg.mapping));
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        reply(s, m.h.seq, st.code(), 0, 0, "tl_alloc_host: " + st.message());
        return;
    }
    RegionId id = regions_.add(r);
    s.host_bytes += r->bytes;
    node_host_bytes_ += r->bytes;
    ++s.mappings;
    ++mappings_;
    reply(s, m.h.seq, Code::kOk, id, r->bytes, "", seg.fd.get());
}

void EngineImpl::onRegister(Session &s, const ipc::RegisterMsg &m) {
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
    // A range of a buffer already counted: one more region, no more bytes or mappings.
    if (Status q = checkQuota(s, 0, false); !q.isOk()) {
        ++counters_.quota_refusals;
        reply(s, m.h.seq, q.code(), 0, 0, "tl_register: " + q.message());
        return;
    }
    auto r = std::make_shared<Region>();
    r->owner = s.id;
    r->parent = parent->id;
    r->kind = MemoryKind::kHost;
    r->base = parent->base + m.offset;
    r->bytes = m.bytes;
    r->mapping = parent->mapping;
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        reply(s, m.h.seq, st.code(), 0, 0, "tl_register: " + st.message());
        return;
    }
    RegionId id = regions_.add(r);
    reply(s, m.h.seq, Code::kOk, id, r->bytes, "");
}

void EngineImpl::onDeregister(Session &s, const ipc::DeregisterMsg &m) {
    // The client published its earlier writes in the ring before it sent this message: take
    // them first (past the in-flight cap if need be: at most one ring's worth), so they hold
    // the region and end normally instead of failing because a later call overtook them.
    while (!s.closing && drainSession(s, UINT64_MAX) != 0) {
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
    releaseRegion(r);
    reply(s, m.h.seq, Code::kOk, 0, 0, "");
}

namespace {

bool meets(const std::vector<uint32_t> &groups, const std::vector<uint32_t> &gids) {
    return std::any_of(gids.begin(), gids.end(), [&](uint32_t g) {
        return std::find(groups.begin(), groups.end(), g) != groups.end();
    });
}

}  // namespace

Status EngineImpl::checkReservedName(const Session &s, std::string_view name) const {
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

void EngineImpl::exposeRegion(Session &s, uint64_t seq, uint64_t region, const char *field,
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

void EngineImpl::onExpose(Session &s, const ipc::ExposeMsg &m) {
    // tl_expose: the default access, peers and the owner's uid (and root).
    exposeRegion(s, m.h.seq, m.region, m.name, RegionAccess{}, "tl_expose");
}

void EngineImpl::onExposeAccess(Session &s, const ipc::ExposeAccessMsg &m) {
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
                       const uint64_t handle =
                           cs->remoteHandle(RemoteRef{id, rr.id, rr.bytes}, cfg_.limits.regions);
                       if (handle == 0) {
                           reply(*cs, seq, Code::kNoMemory, 0, 0, remotesQuotaText());
                           return;
                       }
                       reply(*cs, seq, Code::kOk, handle, rr.bytes, "");
                   });
}

void EngineImpl::onStatus(Session &s, const ipc::StatusMsg &m) {
    // Root and the sidecar's own uid (the operators) see every client; anyone else only the
    // sessions of its own uid.
    const bool all = s.cred.uid == 0 || s.cred.uid == ::geteuid();
    std::string text = statusJson(all ? std::nullopt : std::optional<uid_t>(s.cred.uid));
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
