#include "peer/manager.hpp"

#include "tensorlane/ipc/doorbell.hpp"

#include <sodium.h>
#include <sys/eventfd.h>
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
      directory_(cfg.limits.peer_regions),
      listener_(cfg_, limits_, key_, regions_, transports_, poller_, kTokenListen, peers_, *this),
      dialer_(cfg_, transports_, directory_, poller_, peers_, *this),
      liveness_(cfg_, peers_, *this, listener_, dialer_) {
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
        peers_.add(std::move(p));
    }
}

PeerManagerImpl::~PeerManagerImpl() {
    stop();
    // Connections deregister from the poller when destroyed. The poller is declared before
    // every member that holds one, so it outlives them; they go here, in this order.
    peers_.clear();
    listener_.dropAllPending();
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
    if (Status s = liveness_.open(); !s.isOk()) {
        return s;
    }
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
        Peer &p = *peers_.byId(static_cast<PeerId>(i + 1));
        if (!file.empty()) {
            if (Status s = PeerKey::fromFile(file, &p.key); !s.isOk()) {
                return {s.code(), "[[peers]] '" + p.name + "' key_file: " + s.message()};
            }
        }
    }
    poller_.add(liveness_.timerFd(), EPOLLIN, kTokenTimer);
    poller_.add(wake_.get(), EPOLLIN, kTokenWake);
    poller_.add(resolver_->fd(), EPOLLIN, kTokenResolver);
    return Status::ok();
}

Status PeerManagerImpl::start() {
    if (started_) {
        return Status::ok();
    }
    if (!cfg_.hasPeers()) {
        peerLog().info("no [[peers]] configured: not listening for peers");
        started_ = true;
        return Status::ok();
    }
    SockAddr addr;
    if (Status s = listener_.start(&addr); !s.isOk()) {
        return s;
    }
    // Outgoing connections leave from a specific listen address (a wildcard one leaves the
    // choice to routing), so that peers see us come from the address they dial.
    dialer_.leaveFrom(addr);
    started_ = true;
    // Where the peers given by name may connect from (the accept-side checks); resolved again
    // when a connection comes from an address no peer is known at.
    listener_.refreshPeerHosts(monotonicMs());
    peerLog().info("node '{}' listening for peers on {} (incarnation {}, {} peers configured)",
                   cfg_.node.name, listener_.address(), hex64(incarnation_), peers_.size());
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
    listener_.stopListening();
    for (Peer &p : peers_) {
        p.wanted = false;
        p.attempt_scheduled = false;
        dialer_.failOut(p, "the sidecar is stopping", false, now);
        listener_.closeIn(p, "the sidecar is stopping", false);
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
    listener_.dropAllPending();
    // Joins the resolver thread.
    if (resolver_) {
        poller_.remove(resolver_->fd());
        resolver_.reset();
    }
    signalWake();
}

// ----- lookups and descriptors

std::optional<PeerId> PeerManagerImpl::peerByName(std::string_view name) const {
    const Peer *p = peers_.byName(name);
    return p != nullptr ? std::optional<PeerId>(p->id) : std::nullopt;
}

std::string PeerManagerImpl::peerName(PeerId id) const {
    const Peer *p = peers_.byId(id);
    return p != nullptr ? p->name : std::string();
}

PeerState PeerManagerImpl::peerState(PeerId id) const {
    const Peer *p = peers_.byId(id);
    return p != nullptr ? p->state : PeerState::kDown;
}

void PeerManagerImpl::lookup(PeerId peer, const std::string &name,
                             std::function<void(Status, RemoteRegion)> done) {
    Peer *p = peers_.byId(peer);
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
    const int64_t now = monotonicMs();
    if (p->state == PeerState::kFailed && p->attempt_scheduled) {
        // Fail fast while the reason is fresh (at most reconnect_min_ms old); reconnection goes
        // on in the background. An older reason may be stale (the peer restarted, its key was
        // fixed): the retry is pulled forward and this lookup waits for its fresh answer, so a
        // peer that came back is not reported down for the rest of a long backoff. At most one
        // attempt per reconnect_min_ms comes from lookups.
        if (now - p->last_failure_ms < static_cast<int64_t>(cfg_.tcp.reconnect_min_ms)) {
            answer({Code::kPeer,
                    "peer '" + p->name + "' (" + p->address + ") is down: " + p->last_error});
            return;
        }
        p->next_attempt_ms = now;
        noteDeadline(now);
    }
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

void PeerManagerImpl::answerLookups(Peer &p) {
    for (PendingLookup &l : p.lookups) {
        resolveLookup(p, l.name, std::move(l.done));
    }
    p.lookups.clear();
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
    listener_.regionExposed(r, monotonicMs());
    signalWake();
}

void PeerManagerImpl::regionRevoked(RegionId id) {
    listener_.regionRevoked(id, monotonicMs());
    signalWake();
}

Status PeerManagerImpl::ensureConnected(PeerId peer) {
    Peer *p = peers_.byId(peer);
    if (p == nullptr) {
        return {Code::kNotFound, "no peer with id " + std::to_string(peer)};
    }
    if (stopped_ || !started_) {
        return {Code::kPeer, "the peer manager is not running"};
    }
    p->wanted = true;
    if (!p->out && !p->attempt_scheduled) {
        dialer_.startAttempt(*p, monotonicMs());
    }
    return Status::ok();
}

// ----- what the transport asks of us (TransportHost)

void PeerManagerImpl::openChannels(PeerId peer, uint32_t count) {
    if (Peer *p = peers_.byId(peer); p != nullptr) {
        dialer_.openChannels(*p, count);
    }
}

void PeerManagerImpl::sessionReady(PeerId peer) {
    if (Peer *p = peers_.byId(peer); p != nullptr) {
        dialer_.sessionReady(*p, monotonicMs());
    }
}

void PeerManagerImpl::failSession(PeerId peer, SessionSide side, const std::string &reason) {
    Peer *p = peers_.byId(peer);
    if (p == nullptr) {
        return;
    }
    if (side == SessionSide::kOut) {
        dialer_.failOut(*p, reason, true, monotonicMs());
    } else {
        listener_.closeIn(*p, reason, true);
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
    liveness_.note(at);
    if (!in_progress_) {
        liveness_.rearm();
    }
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
    if (liveness_.due(now)) {
        liveness_.run(now);
    }
    size_t events = 0;
    // What was queued on control connections goes out in one send each.
    for (Peer &p : peers_) {
        if (p.in && p.in->control && p.in->control->hasOutput()) {
            if (int rc = p.in->control->flush(now); rc != 0) {
                listener_.closeIn(p, std::string("control connection: ") + std::strerror(rc), true);
            }
        }
        if (p.out && p.out->control && p.out->control->hasOutput()) {
            if (int rc = p.out->control->flush(now); rc != 0) {
                dialer_.failOut(p, std::string("control connection: ") + std::strerror(rc), true,
                                now);
            }
        }
    }
    events += drainQueues(sink);
    dead_out_.clear();
    dead_in_.clear();
    dead_conns_.clear();
    liveness_.rearm();
    in_progress_ = false;
    if (!state_events_.empty() || !callbacks_.empty()) {
        signalWake();
    }
    return events;
}

void PeerManagerImpl::dispatch(const epoll_event &ev, int64_t now) {
    switch (ev.data.u64) {
        case kTokenListen:
            listener_.acceptAll(now);
            return;
        case kTokenTimer:
            liveness_.fired(now);
            return;
        case kTokenWake: {
            ipc::drain(wake_.get());
            wake_signalled_ = false;
            return;
        }
        case kTokenResolver:
            if (resolver_) {
                for (const auto &r : resolver_->take()) {
                    if ((r.tag & PeerListener::kHostsTag) != 0) {
                        listener_.onHostsResolved(r);
                    } else {
                        dialer_.onResolved(r, now);
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
            listener_.onPendingEvent(*c, ev.events, now);
            break;
        case ConnRole::kInControl:
            listener_.onControlEvent(*c, ev.events, now);
            break;
        case ConnRole::kInData:
            break;  // data connections belong to the transport once authenticated
        case ConnRole::kOutControl:
            dialer_.onControlEvent(*c, ev.events, now);
            break;
        case ConnRole::kOutData:
            dialer_.onExtraEvent(*c, ev.events, now);
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
            if (e.inbound) {
                sink.inboundClosed(e.peer, e.reason);
            } else {
                sink.peerState(e.peer, e.state, e.reason);
            }
        }
        for (auto &cb : callbacks) {
            cb();
        }
        n += states.size() + callbacks.size();
    }
    return n;
}

// ----- helpers

void PeerManagerImpl::inboundClosed(Peer &p, const std::string &reason) {
    state_events_.push_back(StateEvent{p.id, p.state, reason, true});
    signalWake();
}

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

void PeerManagerImpl::disconnect(PeerId peer) {
    Peer *p = peers_.byId(peer);
    if (p == nullptr) {
        return;
    }
    p->wanted = false;
    p->attempt_scheduled = false;
    dialer_.failOut(*p, "disconnected by the engine", false, monotonicMs());
    setState(*p, PeerState::kDown, "disconnected by the engine");
}

// ----- peers of a cluster directory

Status PeerManagerImpl::addPeer(const DirectoryPeer &dp, PeerId *id) {
    if (dp.name == cfg_.node.name) {
        return {Code::kInvalid, "the directory's node '" + dp.name + "' is this node's name"};
    }
    if (dp.name.empty() || dp.name.size() > kMaxNodeNameBytes || dp.address.port == 0 ||
        dp.address.host.empty()) {
        return {Code::kInvalid, "the directory's node '" + dp.name + "' has no usable address"};
    }
    const int64_t now = monotonicMs();
    Peer *p = peers_.byNameAny(dp.name);
    if (p != nullptr && !p->dynamic) {
        return {Code::kInvalid, "the directory's node '" + dp.name + "' is a [[peers]] entry"};
    }
    const std::string address = endpointText(dp.address);
    if (p == nullptr) {
        Peer fresh;
        fresh.id = static_cast<PeerId>(peers_.size() + 1);
        fresh.name = dp.name;
        fresh.key = key_;
        fresh.backoff_ms = cfg_.tcp.reconnect_min_ms;
        fresh.dynamic = true;
        fresh.listed = false;
        transports_.unbind(fresh.id, "peer '" + fresh.name + "' is down: not connected");
        peers_.add(std::move(fresh));
        p = peers_.byId(static_cast<PeerId>(peers_.size()));
    }
    const bool restarted = p->epoch != 0 && dp.epoch != 0 && p->epoch != dp.epoch;
    const bool moved = p->address != address;
    if (restarted) {
        const std::string why =
            "peer '" + p->name + "' restarted (new epoch " + hex64(dp.epoch) + " in the directory)";
        peerLog().info("{}: its sessions and handles are dropped", why);
        dialer_.peerRestarted(*p, now);  // fails our session; a waiting reconnect goes now
        listener_.closeIn(*p, why, false);
        directory_.forget(p->id, "the region belongs to an earlier run of peer '" + p->name +
                                     "' (it restarted); look it up again");
    } else if (moved && p->out) {
        dialer_.failOut(*p, "peer '" + p->name + "' moved to " + address, p->wanted, now);
    }
    if (moved || !p->listed) {
        p->host = dp.address.host;
        p->port = dp.address.port;
        p->address = address;
        p->hosts.clear();
        p->numeric = false;
        p->hosts_resolving = false;
        SockAddr literal;
        if (parseNumericAddress(p->host, p->port, &literal)) {
            p->numeric = true;
            p->hosts = {hostOf(literal)};
        }
    }
    const bool joined = !p->listed;
    p->listed = true;
    p->epoch = dp.epoch;
    gone_.erase(p->name);
    if (joined) {
        peerLog().info("peer '{}' joined at {} (epoch {})", p->name, p->address, hex64(dp.epoch));
    }
    if (running() && !p->numeric) {
        listener_.refreshPeerHosts(now);
    }
    if (running() && cfg_.node.connect_eagerly) {
        (void)ensureConnected(p->id);
    }
    signalWake();
    *id = p->id;
    return Status::ok();
}

void PeerManagerImpl::removePeer(std::string_view name, const std::string &reason) {
    constexpr size_t kMaxGone = 4096;
    if (gone_.size() >= kMaxGone) {
        gone_.erase(gone_.begin());
    }
    gone_[std::string(name)] = reason;
    Peer *p = peers_.byName(name);
    if (p == nullptr || !p->dynamic) {
        return;
    }
    const int64_t now = monotonicMs();
    const std::string why = "peer '" + p->name + "' " + reason;
    peerLog().info("{}", why);
    p->listed = false;
    p->wanted = false;
    p->attempt_scheduled = false;
    dialer_.failOut(*p, why, false, now, true);
    listener_.closeIn(*p, why, false);
    for (PendingLookup &l : p->lookups) {
        callbacks_.push_back([done = std::move(l.done), why] {
            done(Status{Code::kPeer, why}, RemoteRegion{});
        });
    }
    p->lookups.clear();
    directory_.forget(p->id, why);
    p->hosts.clear();
    p->epoch = 0;
    p->remote_incarnation = 0;
    transports_.unbind(p->id, why);
    setState(*p, PeerState::kDown, why);
    signalWake();
}

void PeerManagerImpl::setUnknownPeerAnswer(Code code, std::string text) {
    unknown_answer_ = std::make_pair(code, std::move(text));
}

Status PeerManagerImpl::unknownPeer(std::string_view name) const {
    const std::string quoted = "'" + std::string(name) + "'";
    if (auto it = gone_.find(name); it != gone_.end()) {
        return {Code::kNotFound, "node " + quoted + " " + it->second};
    }
    if (unknown_answer_) {
        return {unknown_answer_->first, "node " + quoted + " " + unknown_answer_->second};
    }
    // A static peer list is fixed at start: such a name is wrong on its face (TL_EINVAL), and
    // a lookup loop that waits for a name to be exposed (TL_ENOENT) stops at once.
    return {Code::kInvalid,
            quoted + " is neither this node (" + cfg_.node.name +
                ") nor a configured peer; retrying cannot help: fix the name or "
                "add it under [[peers]] in " +
                (cfg_.source.empty() ? std::string("the sidecar's file") : cfg_.source)};
}

PeersReport PeerManagerImpl::report(ReportDetail want) const {
    PeersReport out;
    for (const Peer &p : peers_) {
        if (!p.listed) {
            continue;  // left the cluster
        }
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
        r.transport = t->peerReport(p.id, want);
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
    l.address = listener_.address();
    l.incarnation = hex64(incarnation_);
    l.pending_handshakes = listener_.pending().size();
    l.rejected = listener_.rejected();
    l.last_rejection = listener_.lastRejection();
    l.pending_unlisted = listener_.pendingUnlisted();
    l.unlisted_dropped = listener_.unlistedDropped();
    l.claims_refused = listener_.claimsRefused();
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
    if (cfg.hasPeers() && transports.remote().empty()) {
        return fail({Code::kInvalid, "no transport to reach peers"});
    }
    PeerKey key;
    // A node without peers needs no key: it neither listens nor connects; nor does one whose
    // peers all have a key_file of their own (init() reads those).
    // The peers of an etcd directory all use the shared key (its fingerprint is registered).
    const bool shared_key_used = cfg.directory.kind == config::DirectoryKind::kEtcd ||
                                 std::any_of(cfg.peers.begin(), cfg.peers.end(),
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
