#include "peer/manager.hpp"

#include "tensorlane/ipc/doorbell.hpp"

#include <sodium.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

namespace tensorlane::sidecar {

namespace {

std::string endpointText(const config::Endpoint &e) {
    if (e.host.find(':') != std::string::npos && e.host.front() != '[') {
        return "[" + e.host + "]:" + std::to_string(e.port);
    }
    return e.host + ":" + std::to_string(e.port);
}

std::string hex64(uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

}  // namespace

Status checkPeerConfig(const config::Config &cfg) {
    const auto &t = cfg.tcp;
    auto bad = [](const std::string &what) { return Status{Code::kInvalid, what}; };
    if (cfg.node.name.empty() || cfg.node.name.size() > kMaxNodeNameBytes) {
        return bad("[node] name must be 1-" + std::to_string(kMaxNodeNameBytes) + " bytes");
    }
    if (t.connections_per_peer < 1 || t.connections_per_peer > 16) {
        return bad("[tcp] connections_per_peer must be 1-16, found " +
                   std::to_string(t.connections_per_peer));
    }
    if (t.chunk_bytes < 4096 || t.chunk_bytes > (64u << 20)) {
        return bad("[tcp] chunk_bytes must be 4 KiB - 64 MiB, found " +
                   std::to_string(t.chunk_bytes));
    }
    if (t.peer_timeout_ms < 100 || t.keepalive_ms == 0 || t.connect_timeout_ms == 0 ||
        t.reconnect_min_ms == 0 || t.reconnect_max_ms < t.reconnect_min_ms) {
        return bad(
            "[tcp] timeouts out of range (peer_timeout_ms >= 100, keepalive_ms, "
            "connect_timeout_ms, reconnect_min_ms > 0, reconnect_max_ms >= "
            "reconnect_min_ms)");
    }
    std::set<std::string> names;
    for (const auto &p : cfg.peers) {
        if (p.name.empty() || p.name.size() > kMaxNodeNameBytes) {
            return bad("[[peers]] name '" + p.name + "' must be 1-" +
                       std::to_string(kMaxNodeNameBytes) + " bytes");
        }
        if (p.name == cfg.node.name) {
            return bad("[[peers]] lists this node's own name '" + p.name + "'");
        }
        if (!names.insert(p.name).second) {
            return bad("[[peers]] lists '" + p.name + "' twice");
        }
        if (p.address.port == 0 || p.address.host.empty()) {
            return bad("[[peers]] '" + p.name + "' has no address");
        }
    }
    return Status::ok();
}

PeerManagerImpl::PeerManagerImpl(const config::Config &cfg, RegionTable &regions, PeerKey key,
                                 TransportSet &transports, PeerLimits limits)
    : cfg_(cfg),
      regions_(regions),
      key_(std::move(key)),
      limits_(limits),
      transports_(transports),
      directory_(cfg.limits.peer_regions) {
    for (Transport *t : transports_.remote()) {
        t->attach(*this);
    }
    PeerId id = 1;
    for (const auto &pc : cfg_.peers) {
        Peer p;
        p.id = id++;
        p.name = pc.name;
        p.host = pc.address.host;
        p.port = pc.address.port;
        p.address = endpointText(pc.address);
        p.key = key_;
        SockAddr literal;
        if (parseNumericAddress(p.host, p.port, &literal)) {
            p.numeric = true;
            p.hosts = {hostOf(literal)};
        }
        p.backoff_ms = cfg_.tcp.reconnect_min_ms;
        transports_.unbind(p.id, "peer '" + p.name + "' is down: not connected");
        peers_.push_back(std::move(p));
    }
}

PeerManagerImpl::~PeerManagerImpl() {
    stop();
    // Connections deregister from the poller when destroyed; make sure that happens while the
    // poller is still alive (members are destroyed in reverse order, the poller before these).
    peers_.clear();
    pending_.clear();
    dead_out_.clear();
    dead_in_.clear();
    dead_conns_.clear();
}

Status PeerManagerImpl::init() {
    if (sodium_init() < 0) {
        return {Code::kInternal, "libsodium failed to initialise"};
    }
    do {
        randombytes_buf(&incarnation_, sizeof incarnation_);
    } while (incarnation_ == 0);
    if (int rc = poller_.open(); rc != 0) {
        return {Code::kInternal, std::string("epoll_create1: ") + std::strerror(rc)};
    }
    int tfd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (tfd < 0) {
        return {Code::kInternal, std::string("timerfd_create: ") + std::strerror(errno)};
    }
    timer_.reset(tfd);
    int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(errno)};
    }
    wake_.reset(efd);
    resolver_ = std::make_unique<Resolver>();
    if (int rc = resolver_->open(); rc != 0) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
    }
    // The keys of pairs that have their own ([[peers]] key_file); the others keep the shared one.
    for (size_t i = 0; i < peers_.size(); ++i) {
        const std::string &file = cfg_.peers[i].key_file;
        if (!file.empty()) {
            if (Status s = PeerKey::fromFile(file, &peers_[i].key); !s.isOk()) {
                return {s.code(), "[[peers]] '" + peers_[i].name + "' key_file: " + s.message()};
            }
        }
    }
    poller_.add(timer_.get(), EPOLLIN, kTokenTimer);
    poller_.add(wake_.get(), EPOLLIN, kTokenWake);
    poller_.add(resolver_->fd(), EPOLLIN, kTokenResolver);
    return Status::ok();
}

Status PeerManagerImpl::start() {
    if (started_) {
        return Status::ok();
    }
    if (peers_.empty()) {
        peerLog().info("no [[peers]] configured: not listening for peers");
        started_ = true;
        return Status::ok();
    }
    SockAddr addr;
    std::string error;
    int rc = resolveAddress(cfg_.node.listen.host, cfg_.node.listen.port, true, &addr, &error);
    if (rc != 0) {
        return {Code::kInvalid, "[node] listen: " + error};
    }
    rc = listenTcp(addr, 128, &listener_);
    if (rc != 0) {
        return {Code::kPermission,
                "cannot listen for peers on " + addr.text() + ": " + std::strerror(rc)};
    }
    SockAddr bound;
    if (localAddress(listener_.get(), &bound) == 0) {
        listen_port_ = bound.port();
        listen_address_ = bound.text();
    }
    poller_.add(listener_.get(), EPOLLIN, kTokenListen);
    // Outgoing connections leave from a specific listen address (a wildcard one leaves the
    // choice to routing), so that peers see us come from the address they dial.
    if (const HostAddress h = hostOf(addr); !h.empty() && h.bytes != std::array<uint8_t, 16>{}) {
        SockAddr src = addr;
        if (src.storage.ss_family == AF_INET) {
            reinterpret_cast<sockaddr_in *>(&src.storage)->sin_port = 0;
        } else {
            reinterpret_cast<sockaddr_in6 *>(&src.storage)->sin6_port = 0;
        }
        bind_source_ = src;
    }
    started_ = true;
    // Where the peers given by name may connect from (the accept-side checks); resolved again
    // when a connection comes from an address no peer is known at.
    refreshPeerHosts(monotonicMs());
    peerLog().info("node '{}' listening for peers on {} (incarnation {}, {} peers configured)",
                   cfg_.node.name, listen_address_, hex64(incarnation_), peers_.size());
    if (cfg_.node.connect_eagerly) {
        for (Peer &p : peers_) {
            (void)ensureConnected(p.id);
        }
    }
    return Status::ok();
}

void PeerManagerImpl::stop() {
    if (stopped_) {
        return;
    }
    stopped_ = true;
    const int64_t now = monotonicMs();
    if (listener_) {
        poller_.remove(listener_.get());
        listener_.reset();
    }
    for (Peer &p : peers_) {
        p.wanted = false;
        p.attempt_scheduled = false;
        failOut(p, "the sidecar is stopping", false, now);
        closeIn(p, "the sidecar is stopping", false);
        for (PendingLookup &l : p.lookups) {
            callbacks_.push_back([done = std::move(l.done)] {
                done(Status{Code::kPeer, "the sidecar is stopping"}, RemoteRegion{});
            });
        }
        p.lookups.clear();
        if (p.state != PeerState::kDown) {
            setState(p, PeerState::kDown, "the sidecar is stopping");
        }
    }
    pending_.clear();
    pending_by_source_.clear();
    pending_unlisted_ = 0;
    // Joins the resolver thread.
    if (resolver_) {
        poller_.remove(resolver_->fd());
        resolver_.reset();
    }
    signalWake();
}

// ----- lookups and descriptors

std::optional<PeerId> PeerManagerImpl::peerByName(std::string_view name) const {
    for (const Peer &p : peers_) {
        if (p.name == name) {
            return p.id;
        }
    }
    return std::nullopt;
}

std::string PeerManagerImpl::peerName(PeerId id) const {
    const Peer *p = peerOf(id);
    return p != nullptr ? p->name : std::string();
}

PeerState PeerManagerImpl::peerState(PeerId id) const {
    const Peer *p = peerOf(id);
    return p != nullptr ? p->state : PeerState::kDown;
}

PeerManagerImpl::Peer *PeerManagerImpl::peerOf(PeerId id) {
    return id >= 1 && id <= peers_.size() ? &peers_[id - 1] : nullptr;
}

const PeerManagerImpl::Peer *PeerManagerImpl::peerOf(PeerId id) const {
    return id >= 1 && id <= peers_.size() ? &peers_[id - 1] : nullptr;
}

PeerManagerImpl::Peer *PeerManagerImpl::peerNamed(std::string_view name) {
    for (Peer &p : peers_) {
        if (p.name == name) {
            return &p;
        }
    }
    return nullptr;
}

void PeerManagerImpl::lookup(PeerId peer, const std::string &name,
                             std::function<void(Status, RemoteRegion)> done) {
    Peer *p = peerOf(peer);
    auto answer = [this, &done](Status s) {
        callbacks_.push_back([done = std::move(done), s = std::move(s)] { done(s, {}); });
        signalWake();
    };
    if (p == nullptr) {
        answer({Code::kNotFound, "no peer with id " + std::to_string(peer)});
        return;
    }
    if (stopped_) {
        answer({Code::kPeer, "the sidecar is stopping"});
        return;
    }
    if (p->state == PeerState::kUp) {
        resolveLookup(*p, name, std::move(done));
        signalWake();
        return;
    }
    if (p->state == PeerState::kFailed && p->attempt_scheduled) {
        // Fail fast while the peer is known to be down; reconnection goes on in the background.
        answer(
            {Code::kPeer, "peer '" + p->name + "' (" + p->address + ") is down: " + p->last_error});
        return;
    }
    const int64_t now = monotonicMs();
    // Bounded by the two phase deadlines of a connect attempt (TCP connect, then handshake).
    const int64_t deadline = now + 2 * static_cast<int64_t>(cfg_.tcp.connect_timeout_ms) + 100;
    p->lookups.push_back(PendingLookup{name, std::move(done), deadline});
    noteDeadline(deadline);
    (void)ensureConnected(peer);
}

void PeerManagerImpl::resolveLookup(Peer &p, const std::string &name,
                                    std::function<void(Status, RemoteRegion)> done) {
    std::optional<RemoteRegion> rr = directory_.lookup(p.id, name);
    if (!rr) {
        std::string msg = "peer '" + p.name + "' exposes no region named '" + name + "'";
        if (const uint64_t dropped = directory_.dropped(p.id); dropped != 0) {
            msg += " (it described " + std::to_string(dropped) +
                   " regions beyond [limits] peer_regions, which were ignored)";
        }
        callbacks_.push_back([done = std::move(done), msg = std::move(msg)] {
            done(Status{Code::kNotFound, msg}, RemoteRegion{});
        });
        return;
    }
    callbacks_.push_back([done = std::move(done), r = *rr] { done(Status::ok(), r); });
}

bool PeerManagerImpl::resolveRemote(PeerId peer, RegionId handle, uint64_t *remote_id,
                                    std::string *why) const {
    std::optional<RegionDirectory::Target> t = directory_.resolve(peer, handle, why);
    if (!t) {
        return false;
    }
    *remote_id = t->remote_id;
    return true;
}

void PeerManagerImpl::regionExposed(const Region &r) {
    if (r.exposed_name.empty() || r.revoked.load(std::memory_order_acquire)) {
        return;
    }
    const auto payload = encodeRegionAdd(r.bytes, r.exposed_name);
    const int64_t now = monotonicMs();
    std::shared_ptr<Region> shared = regions_.find(r.id);
    for (Peer &p : peers_) {
        if (p.in && p.in->control && p.in->control->isOpen()) {
            p.in->control->queueFrame(FrameType::kRegionAdd, r.id, payload);
            if (p.in->transport_open && shared) {
                p.in->transport->regionExposed(p.id, shared);
            }
            if (p.in && p.in->control->flush(now) != 0) {
                closeIn(p, "cannot send a region descriptor", true);
            }
        }
    }
    signalWake();
}

void PeerManagerImpl::regionRevoked(RegionId id) {
    const int64_t now = monotonicMs();
    for (Peer &p : peers_) {
        if (p.in && p.in->control && p.in->control->isOpen()) {
            p.in->control->queueFrame(FrameType::kRegionDel, id);
            if (p.in->transport_open) {
                p.in->transport->regionRevoked(p.id, id);
            }
            if (p.in && p.in->control->flush(now) != 0) {
                closeIn(p, "cannot send a region revocation", true);
            }
        }
    }
    signalWake();
}

Status PeerManagerImpl::ensureConnected(PeerId peer) {
    Peer *p = peerOf(peer);
    if (p == nullptr) {
        return {Code::kNotFound, "no peer with id " + std::to_string(peer)};
    }
    if (stopped_ || !started_) {
        return {Code::kPeer, "the peer manager is not running"};
    }
    p->wanted = true;
    if (!p->out && !p->attempt_scheduled) {
        startAttempt(*p, monotonicMs());
    }
    return Status::ok();
}

// ----- what the transport asks of us (TransportHost)

void PeerManagerImpl::openChannels(PeerId peer, uint32_t count) {
    Peer *p = peerOf(peer);
    if (p == nullptr || !p->out) {
        return;
    }
    OutSession &s = *p->out;
    const int64_t now = monotonicMs();
    s.extras.resize(count);
    for (uint32_t i = 0; i < count; ++i) {
        s.extras[i].hs = std::make_unique<ClientHandshake>(p->key, identity(), p->name,
                                                           LinkRole::kData, s.session_id, i);
        std::unique_ptr<Connection> c;
        if (!openConnection(*p, ConnRole::kOutData, i, now, &c)) {
            return;  // failOut ran
        }
        s.extras[i].conn = std::move(c);
    }
}

void PeerManagerImpl::sessionReady(PeerId peer) {
    Peer *p = peerOf(peer);
    if (p != nullptr && p->out && p->out->phase == OutSession::Phase::kOpening) {
        onUp(*p, monotonicMs());
    }
}

void PeerManagerImpl::failSession(PeerId peer, SessionSide side, const std::string &reason) {
    Peer *p = peerOf(peer);
    if (p == nullptr) {
        return;
    }
    if (side == SessionSide::kOut) {
        failOut(*p, reason, true, monotonicMs());
    } else {
        closeIn(*p, reason, true);
    }
}

SessionInfo PeerManagerImpl::sessionInfo(const Peer &p, uint64_t session_id, uint64_t incarnation,
                                         bool integrity) const {
    SessionInfo info;
    info.peer_name = p.name;
    info.session_id = session_id;
    info.incarnation = incarnation;
    info.integrity = integrity;
    return info;
}

void PeerManagerImpl::authenticate(Connection &c, const HandshakeOutcome &o, bool client) {
    if (o.integrity) {
        c.enableAuth(client ? o.c2s_key : o.s2c_key, client ? o.s2c_key : o.c2s_key);
    }
}

// ----- the loop

void PeerManagerImpl::signalWake() {
    if (in_progress_ || wake_signalled_ || !wake_) {
        return;
    }
    wake_signalled_ = true;
    ipc::ring(wake_.get());
}

void PeerManagerImpl::noteDeadline(int64_t at) {
    if (at < next_deadline_) {
        next_deadline_ = at;
    }
    if (!in_progress_) {
        rearmTimer();
    }
}

void PeerManagerImpl::rearmTimer() {
    if (next_deadline_ == armed_deadline_ || !timer_) {
        return;
    }
    itimerspec its{};
    if (next_deadline_ != INT64_MAX) {
        // An absolute CLOCK_MONOTONIC time: the same clock monotonicMs() reads. A zero value
        // would disarm, so a deadline already passed becomes 1 ns.
        const int64_t ms = std::max<int64_t>(next_deadline_, 0);
        its.it_value.tv_sec = ms / 1000;
        its.it_value.tv_nsec = (ms % 1000) * 1000000;
        if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) {
            its.it_value.tv_nsec = 1;
        }
    }
    ::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &its, nullptr);
    armed_deadline_ = next_deadline_;
}

size_t PeerManagerImpl::progress(EventSink &sink) {
    if (in_progress_) {
        return 0;
    }
    in_progress_ = true;
    const int64_t now = monotonicMs();
    // The sockets, timer and wake fds are looked at only when the engine saw this set
    // readable (readable(); in busy mode the engine looks every 1024 turns), so no turn pays an
    // epoll_wait for nothing. The transports' data is theirs, polled by the engine.
    if (poll_due_) {
        poll_due_ = false;
        epoll_event evs[64];
        const int n = poller_.wait(evs, 64, 0);
        for (int i = 0; i < n; ++i) {
            dispatch(evs[i], now);
        }
        poll_due_ = n == 64;  // more may wait
    }
    if (now >= next_deadline_) {
        runTimers(now);
    }
    size_t events = 0;
    // What was queued on control connections goes out in one send each.
    for (Peer &p : peers_) {
        if (p.in && p.in->control && p.in->control->hasOutput()) {
            if (int rc = p.in->control->flush(now); rc != 0) {
                closeIn(p, std::string("control connection: ") + std::strerror(rc), true);
            }
        }
        if (p.out && p.out->control && p.out->control->hasOutput()) {
            if (int rc = p.out->control->flush(now); rc != 0) {
                failOut(p, std::string("control connection: ") + std::strerror(rc), true, now);
            }
        }
    }
    events += drainQueues(sink);
    dead_out_.clear();
    dead_in_.clear();
    dead_conns_.clear();
    rearmTimer();
    in_progress_ = false;
    if (!state_events_.empty() || !callbacks_.empty()) {
        signalWake();
    }
    return events;
}

void PeerManagerImpl::dispatch(const epoll_event &ev, int64_t now) {
    switch (ev.data.u64) {
        case kTokenListen:
            acceptAll(now);
            return;
        case kTokenTimer: {
            uint64_t expirations = 0;
            [[maybe_unused]] ssize_t n = ::read(timer_.get(), &expirations, sizeof expirations);
            // The armed deadline fired; force a timer pass even if the clock read above is a hair
            // early.
            next_deadline_ = std::min(next_deadline_, now);
            armed_deadline_ = INT64_MAX;
            return;
        }
        case kTokenWake: {
            ipc::drain(wake_.get());
            wake_signalled_ = false;
            return;
        }
        case kTokenResolver:
            if (resolver_) {
                for (const auto &r : resolver_->take()) {
                    if ((r.tag & kHostsTag) != 0) {
                        onHostsResolved(r);
                    } else {
                        onResolved(r, now);
                    }
                }
            }
            return;
        default:
            break;
    }
    Connection *c = poller_.find(ev.data.u64);
    if (c == nullptr) {
        return;  // closed earlier in this batch
    }
    switch (c->role) {
        case ConnRole::kPendingIn:
            onPendingEvent(*c, ev.events, now);
            break;
        case ConnRole::kInControl:
            onInControlEvent(*c, ev.events, now);
            break;
        case ConnRole::kInData:
            break;  // data connections belong to the transport once authenticated
        case ConnRole::kOutControl:
            onOutControlEvent(*c, ev.events, now);
            break;
        case ConnRole::kOutData:
            onOutExtraEvent(*c, ev.events, now);
            break;
    }
}

size_t PeerManagerImpl::drainQueues(EventSink &sink) {
    size_t n = 0;
    // Callbacks may post, look up or expose again; what they queue is taken in the next round.
    for (int round = 0; round < 4; ++round) {
        auto states = std::exchange(state_events_, {});
        auto callbacks = std::exchange(callbacks_, {});
        if (states.empty() && callbacks.empty()) {
            break;
        }
        for (const StateEvent &e : states) {
            sink.peerState(e.peer, e.state, e.reason);
        }
        for (auto &cb : callbacks) {
            cb();
        }
        n += states.size() + callbacks.size();
    }
    return n;
}

// ----- helpers

void PeerManagerImpl::setState(Peer &p, PeerState s, const std::string &reason) {
    if (p.state == s) {
        return;
    }
    p.state = s;
    state_events_.push_back(StateEvent{p.id, s, reason});
    signalWake();
}

HandshakeIdentity PeerManagerImpl::identity() const {
    HandshakeIdentity id;
    id.name = cfg_.node.name;
    id.incarnation = incarnation_;
    id.caps.peer_timeout_ms = cfg_.tcp.peer_timeout_ms;
    id.caps.keepalive_ms = cfg_.tcp.keepalive_ms;
    id.caps.integrity = cfg_.security.tcp_integrity == config::TcpIntegrity::kMac ? 1 : 0;
    id.caps.transports = 0;
    for (const Transport *t : transports_.remote()) {
        if (t->available()) {
            id.caps.transports |= t->caps().wire_id;
        }
    }
    return id;
}

int64_t PeerManagerImpl::heartbeatInterval(const PeerCaps &remote) const {
    // Idle connections carry a heartbeat every keepalive_ms, and always often enough that the
    // other end hears several within its own peer_timeout_ms.
    int64_t hb = std::min<int64_t>(cfg_.tcp.keepalive_ms, remote.peer_timeout_ms / 4);
    return std::max<int64_t>(hb, 10);
}

void PeerManagerImpl::logDrop(const std::string &remote, const std::string &reason, int64_t now) {
    ++rejected_;
    last_rejection_ = remote + ": " + reason;
    uint64_t suppressed = 0;
    if (drop_log_.allow(now, &suppressed)) {
        if (suppressed > 0) {
            peerLog().warn("dropped peer connection from {}: {} ({} similar messages suppressed)",
                           remote, reason, suppressed);
        } else {
            peerLog().warn("dropped peer connection from {}: {}", remote, reason);
        }
    }
}

Transport *PeerManagerImpl::chooseTransport(const Peer &p, const PeerCaps &remote,
                                            std::string *why) {
    // Ours in preference order ([fabric] transports): the first this node can use now and the
    // peer announced. Never a silent fallback to one the file did not list.
    std::string skipped;  // for the log: why better ones were passed over
    std::string refused;  // for the error: why each one cannot be used
    for (Transport *t : transports_.remote()) {
        const std::string name = t->name();
        if (!t->available()) {
            skipped += (skipped.empty() ? "" : "; ") + ("this node's " + name) +
                       " transport is not usable now";
            refused += (refused.empty() ? "" : "; ") + ("this node cannot use " + name) +
                       " now (its device or port is not usable)";
            continue;
        }
        if ((remote.transports & t->caps().wire_id) == 0) {
            skipped += (skipped.empty() ? "" : "; ") + ("it offers no " + name) + " transport";
            refused += (refused.empty() ? "" : "; ") + ("peer '" + p.name) + "' cannot use " +
                       name + " (no such device there, or not in its [fabric] transports)";
            continue;
        }
        if (!skipped.empty()) {
            peerLog().info("peer '{}' uses {}: {}", p.name, name, skipped);
        }
        return t;
    }
    std::string listed;
    for (const std::string &n : config::transportPreference(cfg_.fabric)) {
        listed += (listed.empty() ? "\"" : ", \"") + n + "\"";
    }
    *why = (cfg_.fabric.transports.empty()
                ? "[fabric] transport = \"" + std::string(config::toString(cfg_.fabric.transport)) +
                      "\""
                : "[fabric] transports = [" + listed + "]") +
           ", but " + refused;
    return nullptr;
}

void PeerManagerImpl::disconnect(PeerId peer) {
    Peer *p = peerOf(peer);
    if (p == nullptr) {
        return;
    }
    p->wanted = false;
    p->attempt_scheduled = false;
    failOut(*p, "disconnected by the engine", false, monotonicMs());
    setState(*p, PeerState::kDown, "disconnected by the engine");
}

PeersReport PeerManagerImpl::report() const {
    PeersReport out;
    for (const Peer &p : peers_) {
        size_t conns = 0;
        if (p.out) {
            conns += p.out->control && p.out->control->isOpen() ? 1 : 0;
        }
        if (p.in) {
            conns += p.in->control && p.in->control->isOpen() ? 1 : 0;
        }
        const Transport *t = p.out && p.out->transport ? p.out->transport
                             : p.in && p.in->transport ? p.in->transport
                                                       : transports_.remote().front();
        PeerReport &r = out.peers.emplace_back();
        r.transport = t->peerReport(p.id);
        r.name = p.name;
        r.address = p.address;
        r.state = toString(p.state);
        r.control_connections = conns;
        r.failures = p.failures;
        r.last_error = p.last_error;
        r.remote_regions = directory_.regionCount(p.id);
        r.remote_regions_ignored = directory_.dropped(p.id);
        r.incarnation = p.remote_incarnation != 0 ? hex64(p.remote_incarnation) : "";
        r.inbound = p.in != nullptr;
        r.hosts = hostListText(p.hosts);
    }
    ListenerReport &l = out.listener;
    l.node = cfg_.node.name;
    l.address = listen_address_;
    l.incarnation = hex64(incarnation_);
    l.pending_handshakes = pending_.size();
    l.rejected = rejected_;
    l.last_rejection = last_rejection_;
    l.pending_unlisted = pending_unlisted_;
    l.unlisted_dropped = unlisted_dropped_;
    l.claims_refused = claims_refused_;
    l.handles = directory_.handleCount();
    l.handle_tombstones = directory_.tombstoneCount();
    return out;
}

std::unique_ptr<PeerManager> makePeerManager(const config::Config &cfg, RegionTable &regions,
                                             TransportSet &transports, Status *error) {
    auto fail = [&](Status s) -> std::unique_ptr<PeerManager> {
        if (error != nullptr) {
            *error = std::move(s);
        }
        return nullptr;
    };
    if (Status s = checkPeerConfig(cfg); !s.isOk()) {
        return fail(std::move(s));
    }
    if (!cfg.peers.empty() && transports.remote().empty()) {
        return fail({Code::kInvalid, "no transport to reach peers"});
    }
    PeerKey key;
    // A node without peers needs no key: it neither listens nor connects; nor does one whose
    // peers all have a key_file of their own (init() reads those).
    const bool shared_key_used = std::any_of(cfg.peers.begin(), cfg.peers.end(),
                                             [](const auto &p) { return p.key_file.empty(); });
    if (shared_key_used) {
        if (Status s = PeerKey::fromFile(cfg.security.peer_key_file, &key); !s.isOk()) {
            return fail(std::move(s));
        }
    }
    auto pm = std::make_unique<PeerManagerImpl>(cfg, regions, key, transports);
    if (Status s = pm->init(); !s.isOk()) {
        return fail(std::move(s));
    }
    return pm;
}

}  // namespace tensorlane::sidecar
