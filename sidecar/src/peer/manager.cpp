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
#include <nlohmann/json.hpp>
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

// The settings this implementation can honour; the config library checks the same ranges, but
// the manager may be handed a Config built in code.
Status checkConfig(const config::Config &cfg) {
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

}  // namespace

std::unique_ptr<PeerManager> makePeerManager(const config::Config &cfg, RegionTable &regions,
                                             Status *error) {
    auto fail = [&](Status s) -> std::unique_ptr<PeerManager> {
        if (error != nullptr) {
            *error = std::move(s);
        }
        return nullptr;
    };
    Status s = checkConfig(cfg);
    if (!s.isOk()) {
        return fail(std::move(s));
    }
    PeerKey key;
    // A node without peers needs no key: it neither listens nor connects.
    if (!cfg.peers.empty()) {
        s = PeerKey::fromFile(cfg.security.peer_key_file, &key);
        if (!s.isOk()) {
            return fail(std::move(s));
        }
    }
    auto pm = std::make_unique<PeerManagerImpl>(cfg, regions, key);
    s = pm->init();
    if (!s.isOk()) {
        return fail(std::move(s));
    }
    return pm;
}

PeerManagerImpl::PeerManagerImpl(const config::Config &cfg, RegionTable &regions, PeerKey key,
                                 PeerLimits limits)
    : cfg_(cfg), regions_(regions), key_(std::move(key)), limits_(limits), transport_(*this) {
    PeerId id = 1;
    for (const auto &pc : cfg_.peers) {
        Peer p;
        p.id = id++;
        p.name = pc.name;
        p.host = pc.address.host;
        p.port = pc.address.port;
        p.address = endpointText(pc.address);
        p.backoff_ms = cfg_.tcp.reconnect_min_ms;
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
    started_ = true;
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
    auto it = p.region_by_name.find(name);
    if (it == p.region_by_name.end()) {
        callbacks_.push_back(
            [done = std::move(done),
             msg = "peer '" + p.name + "' exposes no region named '" + name + "'"] {
                done(Status{Code::kNotFound, msg}, RemoteRegion{});
            });
        return;
    }
    const RegionDescriptor &d = p.regions.at(it->second);
    RemoteRegion rr;
    rr.id = handleFor(p, d.id);
    rr.bytes = d.bytes;
    callbacks_.push_back([done = std::move(done), rr] { done(Status::ok(), rr); });
}

uint64_t PeerManagerImpl::handleFor(const Peer &p, uint64_t remote_id) {
    auto key = std::make_pair(p.id, remote_id);
    auto it = handle_of_.find(key);
    if (it != handle_of_.end()) {
        return it->second;
    }
    const uint64_t h = next_handle_++;
    handles_.emplace(h, Handle{p.id, p.remote_incarnation, remote_id});
    handle_of_.emplace(key, h);
    return h;
}

void PeerManagerImpl::pruneHandles(PeerId peer) {
    // The old handles stay in handles_ (so a write through one says why it fails); only the
    // name-to-handle cache forgets them, so lookups hand out fresh ones.
    for (auto it = handle_of_.begin(); it != handle_of_.end();) {
        if (it->first.first == peer) {
            it = handle_of_.erase(it);
        } else {
            ++it;
        }
    }
}

bool PeerManagerImpl::remoteValid(PeerId peer, RegionId remote) const {
    auto it = handles_.find(remote);
    const Peer *p = peerOf(peer);
    if (it == handles_.end() || p == nullptr || it->second.peer != peer) {
        return false;
    }
    return it->second.incarnation == p->remote_incarnation &&
           p->regions.count(it->second.remote_id) != 0;
}

void PeerManagerImpl::regionExposed(const Region &r) {
    if (r.exposed_name.empty() || r.revoked.load(std::memory_order_acquire)) {
        return;
    }
    const auto payload = encodeRegionAdd(r.bytes, r.exposed_name);
    const int64_t now = monotonicMs();
    for (Peer &p : peers_) {
        if (p.in && p.in->control && p.in->control->isOpen()) {
            p.in->control->queueFrame(FrameType::kRegionAdd, r.id, payload);
            if (p.in->control->flush(now) != 0) {
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
            if (p.in->control->flush(now) != 0) {
                closeIn(p, "cannot send a region revocation", true);
            }
        }
    }
    signalWake();
}

// ----- the transport's entry points

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

void PeerManagerImpl::dropPeer(PeerId peer) {
    Peer *p = peerOf(peer);
    if (p == nullptr) {
        return;
    }
    p->wanted = false;
    p->attempt_scheduled = false;
    failOut(*p, "disconnected by the engine", false, monotonicMs());
    setState(*p, PeerState::kDown, "disconnected by the engine");
    signalWake();
}

Status PeerManagerImpl::postWrite(WriteOp op) {
    Peer *p = peerOf(op.peer);
    if (p == nullptr) {
        return {Code::kInvalid, "peer " + std::to_string(op.peer) + " is not a remote peer"};
    }
    if (!op.src || op.src->base == nullptr || !op.src->contains(op.src_offset, op.bytes)) {
        return {Code::kInvalid, "the source range is not readable memory of the source region"};
    }
    auto h = handles_.find(op.dst_region);
    if (h == handles_.end() || h->second.peer != op.peer) {
        return {Code::kNotFound, "no such remote region at peer '" + p->name + "'"};
    }
    if (p->state != PeerState::kUp || !p->out || !p->out->link) {
        return {Code::kPeer,
                "peer '" + p->name + "' is down: " +
                    (p->last_error.empty() ? std::string("not connected") : p->last_error)};
    }
    if (h->second.incarnation != p->remote_incarnation) {
        return {Code::kNotFound, "the remote region belongs to an earlier run of '" + p->name +
                                     "' (it restarted); look it up again"};
    }
    auto d = p->regions.find(h->second.remote_id);
    if (d == p->regions.end()) {
        return {Code::kNotFound, "peer '" + p->name + "' revoked the region"};
    }
    const uint64_t rbytes = d->second.bytes;
    if (op.bytes == 0 || op.dst_offset > rbytes || op.bytes > rbytes - op.dst_offset) {
        return {Code::kInvalid, "the write is out of the remote region's bounds"};
    }
    const uint64_t remote_id = h->second.remote_id;
    return p->out->link->post(std::move(op), remote_id, monotonicMs());
}

size_t PeerManagerImpl::writesInFlight() const {
    size_t n = completions_.size();
    for (const Peer &p : peers_) {
        if (p.out && p.out->link) {
            n += p.out->link->inFlight();
        }
    }
    return n;
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
    epoll_event evs[64];
    const int n = poller_.wait(evs, 64, 0);
    for (int i = 0; i < n; ++i) {
        dispatch(evs[i], now);
    }
    if (now >= next_deadline_) {
        runTimers(now);
    }
    size_t events = deliverArrivals(sink, now);
    events += drainQueues(sink);
    dead_out_.clear();
    dead_in_.clear();
    dead_conns_.clear();
    rearmTimer();
    in_progress_ = false;
    if (!completions_.empty() || !state_events_.empty() || !callbacks_.empty()) {
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
                    onResolved(r, now);
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
            onInDataEvent(*c, ev.events, now);
            break;
        case ConnRole::kOutControl:
            onOutControlEvent(*c, ev.events, now);
            break;
        case ConnRole::kOutData:
            onOutDataEvent(*c, ev.events, now);
            break;
    }
}

size_t PeerManagerImpl::deliverArrivals(EventSink &sink, int64_t now) {
    size_t n = 0;
    for (Peer &p : peers_) {
        if (!p.in || !p.in->link || !p.in->link->deliverable()) {
            continue;
        }
        InLink &link = *p.in->link;
        const uint64_t writes_before = link.writesReceived();
        const uint64_t bytes_before = link.bytesReceived();
        n += link.deliver(sink, *p.in->control);
        p.writes_received += link.writesReceived() - writes_before;
        p.bytes_received += link.bytesReceived() - bytes_before;
        // arrived() may have revoked regions or done anything else on this thread; the session
        // is still ours (closeIn only runs from this thread's handlers, not from the sink).
        if (p.in && p.in->control->flush(now) != 0) {
            closeIn(p, "cannot send acknowledgements", true);
        }
    }
    return n;
}

size_t PeerManagerImpl::drainQueues(EventSink &sink) {
    size_t n = 0;
    // Callbacks may post, look up or expose again; what they queue is taken in the next round.
    for (int round = 0; round < 4; ++round) {
        auto states = std::exchange(state_events_, {});
        auto completions = std::exchange(completions_, {});
        auto callbacks = std::exchange(callbacks_, {});
        if (states.empty() && completions.empty() && callbacks.empty()) {
            break;
        }
        for (const StateEvent &e : states) {
            sink.peerState(e.peer, e.state, e.reason);
        }
        for (const Completion &c : completions) {
            sink.completed(c.op_id, c.code, c.reason);
        }
        for (auto &cb : callbacks) {
            cb();
        }
        n += states.size() + completions.size() + callbacks.size();
    }
    return n;
}

void PeerManagerImpl::runTimers(int64_t now) {
    // Everything below that sets a deadline (a reconnect scheduled by failOut, a handshake
    // deadline set by startAttempt) lowers next_deadline_ through noteDeadline() or due().
    next_deadline_ = INT64_MAX;
    auto due = [this](int64_t at) { next_deadline_ = std::min(next_deadline_, at); };
    const int64_t timeout = cfg_.tcp.peer_timeout_ms;

    if (listen_paused_until_ != 0) {
        if (now >= listen_paused_until_) {
            listen_paused_until_ = 0;
            if (listener_) {
                poller_.add(listener_.get(), EPOLLIN, kTokenListen);
            }
        } else {
            due(listen_paused_until_);
        }
    }

    std::vector<uint64_t> expired;
    for (const auto &[token, pd] : pending_) {
        if (now >= pd.deadline_ms) {
            expired.push_back(token);
        } else {
            due(pd.deadline_ms);
        }
    }
    for (uint64_t token : expired) {
        auto it = pending_.find(token);
        const bool closing = it->second.closing;
        dropPending(token,
                    closing ? std::string("refused")
                            : "no complete handshake within " +
                                  std::to_string(cfg_.tcp.connect_timeout_ms) +
                                  " ms (half-open or slow connection)",
                    now);
    }

    for (Peer &p : peers_) {
        if (p.attempt_scheduled) {
            if (now >= p.next_attempt_ms) {
                startAttempt(p, now);
            } else {
                due(p.next_attempt_ms);
            }
        }
        if (p.out) {
            OutSession &s = *p.out;
            if (s.phase != OutSession::Phase::kUp) {
                if (now >= s.deadline_ms) {
                    failOut(p,
                            "no answer within " + std::to_string(cfg_.tcp.connect_timeout_ms) +
                                " ms while " +
                                (s.phase == OutSession::Phase::kResolving    ? "resolving"
                                 : s.phase == OutSession::Phase::kConnecting ? "connecting"
                                                                             : "authenticating"),
                            true, now);
                } else {
                    due(s.deadline_ms);
                }
            } else {
                Connection &ctl = *s.control;
                if (now - ctl.last_rx_ms >= timeout) {
                    failOut(p,
                            "nothing heard from the peer for " +
                                std::to_string(now - ctl.last_rx_ms) + " ms (peer_timeout_ms " +
                                std::to_string(timeout) + ")",
                            true, now);
                } else {
                    bool stalled = false;
                    for (OutData &d : s.data) {
                        if (d.conn->hasOutput()) {
                            if (now - d.conn->last_out_progress_ms >= timeout) {
                                stalled = true;
                            } else {
                                due(d.conn->last_out_progress_ms + timeout);
                            }
                        }
                    }
                    if (stalled) {
                        failOut(p,
                                "sending stalled for " + std::to_string(timeout) +
                                    " ms (the peer stopped reading)",
                                true, now);
                    } else {
                        if (now - ctl.last_tx_ms >= s.heartbeat_ms) {
                            ctl.queueFrame(FrameType::kHeartbeat, static_cast<uint64_t>(now));
                            if (int rc = ctl.flush(now); rc != 0) {
                                failOut(p, std::string("control connection: ") + std::strerror(rc),
                                        true, now);
                            }
                        }
                        if (p.out) {
                            due(ctl.last_tx_ms + s.heartbeat_ms);
                            due(ctl.last_rx_ms + timeout);
                        }
                    }
                }
            }
        }
        if (p.in) {
            Connection &ctl = *p.in->control;
            if (now - ctl.last_rx_ms >= timeout) {
                closeIn(p,
                        "nothing heard for " + std::to_string(now - ctl.last_rx_ms) +
                            " ms (peer_timeout_ms " + std::to_string(timeout) + ")",
                        true);
            } else {
                if (now - ctl.last_tx_ms >= p.in->heartbeat_ms) {
                    ctl.queueFrame(FrameType::kHeartbeat, static_cast<uint64_t>(now));
                    if (int rc = ctl.flush(now); rc != 0) {
                        closeIn(p, std::string("control connection: ") + std::strerror(rc), true);
                    }
                }
                if (p.in) {
                    due(ctl.last_tx_ms + p.in->heartbeat_ms);
                    due(ctl.last_rx_ms + timeout);
                }
            }
        }
        for (auto it = p.lookups.begin(); it != p.lookups.end();) {
            if (now >= it->deadline_ms) {
                callbacks_.push_back(
                    [done = std::move(it->done),
                     msg = "peer '" + p.name + "' (" + p.address + ") did not answer in time"] {
                        done(Status{Code::kPeer, msg}, RemoteRegion{});
                    });
                it = p.lookups.erase(it);
            } else {
                due(it->deadline_ms);
                ++it;
            }
        }
    }
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
    id.caps.chunk_bytes = cfg_.tcp.chunk_bytes;
    id.caps.connections = cfg_.tcp.connections_per_peer;
    id.caps.peer_timeout_ms = cfg_.tcp.peer_timeout_ms;
    id.caps.keepalive_ms = cfg_.tcp.keepalive_ms;
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

std::string PeerManagerImpl::statusJson() const {
    nlohmann::json peers = nlohmann::json::array();
    for (const Peer &p : peers_) {
        size_t conns = 0;
        size_t in_flight = 0;
        nlohmann::json data_bytes = nlohmann::json::array();
        if (p.out) {
            conns += p.out->control && p.out->control->isOpen() ? 1 : 0;
            for (const OutData &d : p.out->data) {
                conns += d.conn && d.conn->isOpen() ? 1 : 0;
                data_bytes.push_back(d.conn ? d.conn->bytes_out : 0);
            }
            in_flight = p.out->link ? p.out->link->inFlight() : 0;
        }
        if (p.in) {
            conns += p.in->control && p.in->control->isOpen() ? 1 : 0;
            for (const auto &c : p.in->data) {
                conns += c && c->isOpen() ? 1 : 0;
            }
        }
        nlohmann::json j;
        j["name"] = p.name;
        j["address"] = p.address;
        j["state"] = toString(p.state);
        j["transport"] = "tcp";
        j["connections"] = conns;
        j["writes_sent"] = p.writes_sent;
        j["writes_received"] = p.writes_received;
        j["bytes_sent"] = p.bytes_sent;
        j["bytes_received"] = p.bytes_received;
        j["failures"] = p.failures;
        j["last_error"] = p.last_error;
        j["in_flight"] = in_flight;
        j["remote_regions"] = p.regions.size();
        j["incarnation"] = p.remote_incarnation != 0 ? hex64(p.remote_incarnation) : "";
        j["inbound"] = p.in != nullptr;
        j["data_bytes_sent"] = std::move(data_bytes);  // per data connection of our session
        peers.push_back(std::move(j));
    }
    nlohmann::json out;
    out["peers"] = std::move(peers);
    nlohmann::json listener;
    listener["node"] = cfg_.node.name;
    listener["address"] = listen_address_;
    listener["incarnation"] = hex64(incarnation_);
    listener["pending_handshakes"] = pending_.size();
    listener["rejected"] = rejected_;
    listener["last_rejection"] = last_rejection_;
    out["listener"] = std::move(listener);
    return out.dump();
}

}  // namespace tensorlane::sidecar
