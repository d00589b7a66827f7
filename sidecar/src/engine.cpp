// The engine's loop: every turn it polls its fds, drains the request rings, watches the stream
// gates, progresses the transports, posts queued writes and publishes the rings; when idle it
// sleeps on epoll (engine_impl.hpp says who does what).
#include "tensorlane/sidecar/engine.hpp"

#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cuda/runtime.hpp"
#include "engine_impl.hpp"
#include "epoll_tags.hpp"
#include "logging.hpp"
#include "metrics/metrics_server.hpp"
#include "net/cpus.hpp"
#include "net/socket.hpp"
#include "tensorlane/ipc/doorbell.hpp"
#include "tensorlane/sidecar/trace.hpp"

namespace tensorlane::sidecar {

const char *toString(PeerState s) {
    switch (s) {
        case PeerState::kDown:
            return "down";
        case PeerState::kConnecting:
            return "connecting";
        case PeerState::kUp:
            return "up";
        case PeerState::kFailed:
            return "failed";
    }
    return "unknown";
}

namespace {

/// Raises RLIMIT_NOFILE's soft limit to the hard one: every session costs three fds, and
/// [limits] fd_reserve holds some back for uids with no session yet. Returns the soft limit.
rlim_t raiseFdLimit() {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) {
        return 0;
    }
    if (lim.rlim_cur < lim.rlim_max) {
        rlimit raised{lim.rlim_max, lim.rlim_max};
        if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
            return raised.rlim_cur;
        }
    }
    return lim.rlim_cur;
}

/// The names of the peer ids, for the write counters: this node, then [[peers]] in order.
std::vector<std::string> peerNames(const config::Config &cfg) {
    std::vector<std::string> names{cfg.node.name};
    for (const auto &p : cfg.peers) {
        names.push_back(p.name);
    }
    return names;
}

/// How long the loop sleeps at most when idle: bounds the latency of timers and of noticing a
/// stop request even without a wake-up.
constexpr int kIdleTickMs = 200;
// A traced turn this long or longer is written down (TENSORLANE_TRACE_FILE).
constexpr uint32_t kTraceTurnUs = 20;

}  // namespace

int addToEpoll(int epfd, int fd, uint32_t events, uint64_t tag) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    return ::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : errno;
}

EngineImpl::EngineImpl(const config::Config &cfg, std::vector<std::unique_ptr<Transport>> remote)
    : cfg_(cfg), log_(sidecarLogger()), stats_(peerNames(cfg)) {
    // [ipc] poll_mode = "auto" becomes a mode before anything reads it (the transports, the
    // clients' hello): event on a host too small to spin, adaptive elsewhere.
    const CpuBudget cpus = usableCpus();
    poll_choice_ = config::resolvePollMode(cfg_.ipc.poll_mode, cpus.cpus, cpus.source);
    cfg_.ipc.poll_mode = poll_choice_.mode;
    given_remote_ = std::move(remote);
    stats_.setTiming(cfg_.metrics.listen.has_value());
}

EngineImpl::~EngineImpl() {
    // The metrics endpoint first: scrapes waiting for a snapshot give up at once, then its
    // threads are joined. Then sessions (they reference regions), transports, the socket file.
    if (metrics_channel_) {
        metrics_channel_->close();
    }
    metrics_.reset();
    sessions_.clear();
    directory_.reset();  // its threads first: they feed the peer layer
    if (peers_) {
        peers_->stop();
    }
    peers_.reset();
    local_ = nullptr;
    transports_.clear();
    // The parts go with the members (the control server removes the socket file).
}

Status EngineImpl::init() {
    started_ = std::chrono::steady_clock::now();
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_) {
        return {Code::kInternal, std::string("epoll_create1: ") + std::strerror(errno)};
    }
    if (int rc = ipc::makeEventFd(&stop_fd_)) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
    }
    NodeQuotas quotas = NodeQuotas::resolve(cfg_.limits);
    const rlim_t fds = raiseFdLimit();
    log_->info(
        "limits: host buffers of all clients up to {} ({}), {} per client; {} sessions "
        "per uid, {} per pid; {} file descriptors, {} held back for new uids",
        config::formatBytes(quotas.registered_cap), quotas.cap_source,
        config::formatBytes(cfg_.limits.registered_bytes), cfg_.limits.sessions_per_uid,
        cfg_.limits.sessions_per_pid, static_cast<uint64_t>(fds), cfg_.limits.fd_reserve);
    // The CUDA driver is initialised here, before serving (cuInit may take a while); contexts
    // and imports come later, on the transports' threads, when a GPU region first needs one.
    if (CudaRuntime &cuda = CudaRuntime::get(); cuda.available()) {
        std::string names;
        for (int i = 0; i < cuda.deviceCount(); ++i) {
            names += (i ? ", " : "") + cuda.deviceName(i);
        }
        log_->info("CUDA: {} device(s): {}", cuda.deviceCount(), names);
    } else {
        log_->info("CUDA memory cannot be registered: {}", cuda.why());
    }
    auto local = std::make_unique<LocalTransport>(cfg_.node.name);
    local->setPolling(cfg_.ipc.poll_mode == config::PollMode::kBusy,
                      cfg_.ipc.poll_mode == config::PollMode::kEvent ? 0 : cfg_.ipc.spin_us);
    if (Status st = local->start(); !st.isOk()) {
        return st;
    }
    local_ = local.get();
    transports_.add(std::move(local));
    if (!given_remote_.empty()) {
        for (auto &t : given_remote_) {
            if (!t->caps().remote) {
                return {Code::kInvalid,
                        std::string("transport '") + t->name() + "' carries no remote writes"};
            }
            transports_.add(std::move(t));
        }
        given_remote_.clear();
    } else if (cfg_.hasPeers()) {
        if (Status st = addRemoteTransports(cfg_, regions_, &transports_); !st.isOk()) {
            return st;
        }
    }
    if (cfg_.hasPeers()) {
        Status st;
        peers_ = makePeerManager(cfg_, regions_, transports_, &st);
        if (!peers_) {
            return st;
        }
    }
    region_lifecycle_.emplace(cfg_.limits, std::move(quotas), regions_, transports_, sessions_,
                              peers_.get(), counters_);
    pipeline_.emplace(cfg_.limits.in_flight, sessions_, regions_, *region_lifecycle_, transports_,
                      peers_.get(), stats_, counters_);
    control_.emplace(cfg_, epoll_.get(), sessions_, regions_, *region_lifecycle_, *pipeline_,
                     peers_.get(), counters_,
                     [this](std::optional<uid_t> only_uid) { return statusJson(only_uid); });
    return Status::ok();
}

Status EngineImpl::start() {
    if (Status st = control_->listen(); !st.isOk()) {
        return st;
    }
    if (int rc = addToEpoll(epoll_.get(), stop_fd_.get(), EPOLLIN, kTagStop)) {
        return {Code::kInternal, std::string("epoll_ctl: ") + std::strerror(rc)};
    }
    for (size_t i = 0; i < transports_.all().size(); ++i) {
        for (int fd : transports_.all()[i]->pollFds()) {
            const uint64_t tag = kTagTransport | uint64_t{i} << 32 | static_cast<uint32_t>(fd);
            if (int rc = addToEpoll(epoll_.get(), fd, EPOLLIN, tag)) {
                return {Code::kInternal, std::string("epoll_ctl: ") + std::strerror(rc)};
            }
        }
    }
    if (peers_) {
        if (Status st = region_lifecycle_->exposeProbe(); !st.isOk()) {
            return st;
        }
        Status st = peers_->start();
        if (!st.isOk()) {
            return st;
        }
        if (int rc = addToEpoll(epoll_.get(), peers_->wakeFd(), EPOLLIN, kTagPeers)) {
            return {Code::kInternal, std::string("epoll_ctl: ") + std::strerror(rc)};
        }
        if (cfg_.directory.kind == config::DirectoryKind::kEtcd) {
            std::vector<std::string> offered;
            for (const Transport *t : transports_.remote()) {
                if (t->available()) {
                    offered.emplace_back(t->name());
                }
            }
            directory_ = ClusterDirectory::start(cfg_, *peers_, offered, &st);
            if (!directory_) {
                return st;
            }
            if (int rc = addToEpoll(epoll_.get(), directory_->fd(), EPOLLIN, kTagDirectory)) {
                return {Code::kInternal, std::string("epoll_ctl: ") + std::strerror(rc)};
            }
        }
    }
    if (Status st = startMetrics(); !st.isOk()) {
        return st;
    }
    control_->takeFdBaseline();
    if (poll_choice_.warn) {
        log_->warn("[ipc] poll_mode {}: {}", config::toString(cfg_.ipc.poll_mode),
                   poll_choice_.reason);
    } else {
        log_->info("[ipc] poll_mode {}: {}", config::toString(cfg_.ipc.poll_mode),
                   poll_choice_.reason);
    }
    log_->info(
        "node {} serving workers on {} (mode {:04o}, poll mode {}, ring depth {}, in flight {}), "
        "{} peer(s)",
        cfg_.node.name, cfg_.node.socket, control_->socketMode(),
        config::toString(cfg_.ipc.poll_mode), cfg_.ipc.ring_depth, cfg_.limits.in_flight,
        cfg_.peers.size());
    return Status::ok();
}

Status EngineImpl::startMetrics() {
    if (!cfg_.metrics.listen) {
        return Status::ok();  // off by default
    }
    Status st;
    metrics_channel_ = SnapshotChannel::create(&st);
    if (!metrics_channel_) {
        return st;
    }
    if (int rc = addToEpoll(epoll_.get(), metrics_channel_->fd(), EPOLLIN, kTagMetrics)) {
        return {Code::kInternal, std::string("epoll_ctl: ") + std::strerror(rc)};
    }
    metrics_ = MetricsServer::start(cfg_, SysfsRoot::fromEnvironment(), metrics_channel_, &st);
    if (!metrics_) {
        return st;
    }
    log_->info("serving Prometheus metrics on http://{}/metrics (writes timed by the {} clock)",
               metrics_->address(), stats_.clock().name());
    return Status::ok();
}

Snapshot EngineImpl::buildSnapshot() const {
    Snapshot snap;
    snap.report = report(std::nullopt, ReportDetail::kTyped);  // the metrics read no detail
    snap.timing = stats_.timing();
    snap.rejected = stats_.rejectedByStatus();
    const auto &names = stats_.names();
    snap.peers.resize(names.size());
    for (size_t id = 0; id < names.size(); ++id) {
        snap.peers[id].name = names[id];
        snap.peers[id].local = id == kLocalPeer;
        snap.peers[id].stats = stats_.peers()[id];
    }
    for (const auto &[op_id, op] : pipeline_->ops()) {
        if (op.peer < snap.peers.size()) {
            ++snap.peers[op.peer].in_flight;
        }
    }
    for (const auto &[peer, q] : pipeline_->queues()) {
        if (peer < snap.peers.size()) {
            snap.peers[peer].queued += q.ops.size();
        }
    }
    return snap;
}

void EngineImpl::stop() {
    stopping_.store(true, std::memory_order_release);
    ipc::ring(stop_fd_.get());
}

size_t EngineImpl::pollEvents(int timeout_ms) {
    epoll_event events[64];
    int n = ::epoll_wait(epoll_.get(), events, 64, timeout_ms);
    last_poll_events_ = n > 0 ? static_cast<size_t>(n) : 0;
    if (n <= 0) {
        return 0;
    }
    size_t work = 0;
    for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        SessionId sid = tag & ~kTagMask;
        switch (tag & kTagMask) {
            case kTagListen:
                control_->acceptClients();
                ++work;
                break;
            case kTagStop:
                ipc::drain(stop_fd_.get());
                break;
            case kTagMetrics:
                metrics_channel_->serve([this] { return buildSnapshot(); });
                break;
            case kTagCudaCheck:
                control_->finishCudaChecks();
                ++work;
                break;
            case kTagPeers:
                peers_->readable();  // its progress() this turn looks at its sockets
                break;
            case kTagDirectory:
                work += directory_->apply();
                // Peers the directory added get their write counters.
                for (size_t id = stats_.names().size();; ++id) {
                    std::string name = peers_->peerName(static_cast<PeerId>(id));
                    if (name.empty()) {
                        break;
                    }
                    stats_.addPeer(id, std::move(name));
                }
                break;
            case kTagTransport:
                // progress() runs every turn; a transport that looks at its fds only when
                // they are readable learns it here.
                if (const size_t t = (tag >> 32) & 0xffffff; t < transports_.all().size()) {
                    transports_.all()[t]->readable(static_cast<int>(tag & 0xffffffffu));
                }
                break;
            case kTagBell:
                if (Session *s = sessions_.find(sid)) {
                    ipc::drain(s->to_sidecar.get());
                }
                break;
            case kTagSock:
                if (Session *s = sessions_.find(sid)) {
                    control_->socketEvent(*s, events[i].events);
                    ++work;
                }
                break;
            default:
                break;
        }
    }
    return work;
}

bool EngineImpl::armSleep() {
    // A GPU stream about to open a gate or take a hand-over is watched closely for a while
    // (it cannot ring our doorbell); after that in 1 ms naps (run()).
    if (pipeline_->watchingStreams()) {
        return false;
    }
    // Work of our own first: queued writes a transport may take now, backlog a client has
    // made room for. A backlog that still does not fit is why we raise sidecar_sleeping on
    // that session too: the client rings to_sidecar after freeing slots (shim drainLocked).
    if (pipeline_->queued() != 0 && pipeline_->pumpQueues() != 0) {
        return false;
    }
    for (Session *s : sessions_.active()) {
        s->view.header->sidecar_sleeping.value.store(1, std::memory_order_relaxed);
    }
    // SYNC POINT: seq_cst fence between raising sidecar_sleeping and re-reading the request
    // slots and the completion heads; the client publishes its slots (or releases completion
    // slots), fences, then reads sidecar_sleeping (Dekker), so either we see its change here
    // or it sees our flag and rings to_sidecar.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (Session *s : sessions_.active()) {
        if (s->closing) {
            continue;
        }
        if (pipeline_->served(*s) && s->requests.available() > 0) {
            return false;
        }
        if ((!s->completion_backlog.empty() || !s->notification_backlog.empty()) &&
            s->flushBacklog() != 0) {
            s->publish();
            return false;
        }
    }
    for (Transport *t : transports_.all()) {
        if (!t->arm()) {
            return false;
        }
    }
    return true;
}

void EngineImpl::disarmSleep() {
    for (Session *s : sessions_.active()) {
        s->view.header->sidecar_sleeping.value.store(0, std::memory_order_relaxed);
    }
}

void EngineImpl::run() {
    running_ = true;
    using Clock = std::chrono::steady_clock;
    const auto spin = std::chrono::microseconds(cfg_.ipc.spin_us);
    const auto mode = cfg_.ipc.poll_mode;
    auto last_work = Clock::now();
    uint32_t iteration = 0;
    while (!stopping_.load(std::memory_order_acquire)) {
        size_t work = 0;
        bool sleep = false;
        bool woke_by_tick = false;
        // Traced: a turn of kTraceTurnUs or more says where it went (docs/nccl.md, "Diagnosing
        // a hang"); "slept" is the epoll_wait of a sleeping engine.
        TurnTimer turn("turn", kTraceTurnUs);
        if (mode != config::PollMode::kBusy) {
            bool idle_long = mode == config::PollMode::kEvent || Clock::now() - last_work >= spin;
            if (idle_long) {
                sleep = armSleep();
                if (!sleep) {
                    disarmSleep();
                }
            }
        }
        if (sleep) {
            int timeout = pipeline_->msToNextDeadline(pipeline_->streamsUrgent() ? 1 : kIdleTickMs);
            if (control_->listenPaused()) {
                const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    control_->listenPausedUntil() - Clock::now());
                timeout = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, timeout));
            }
            work += pollEvents(timeout);
            turn.mark("slept");
            disarmSleep();
            woke_by_tick = last_poll_events_ == 0;
        } else if ((++iteration & 1023) == 0 || mode != config::PollMode::kBusy) {
            // Busy loops look at sockets every 1024 turns (tens of microseconds): control calls
            // are rare, requests not, and an epoll_wait costs as much as several round trips.
            work += pollEvents(0);
        }
        turn.mark("poll");
        if (control_->listenPaused()) {
            control_->resumeListener();
        }
        work += pipeline_->drainRequests();
        turn.mark("drain");
        work += pipeline_->pollStreams();
        work += progressTransports();
        turn.mark("transports");
        work += pipeline_->pollDeadlines();
        work += pipeline_->pumpQueues();
        turn.mark("queues");
        work += pipeline_->publishAll();
        turn.mark("publish");
        for (Transport *t : transports_.all()) {
            t->afterPublish();
        }
        turn.mark("after");
        stats_.timeEnded();  // the end stamp of the writes that ended this turn, once published
        if (sessions_.anyClosed()) {
            control_->reapClosed();
        }
        if (woke_by_tick && work != 0) {
            // Work was waiting but nothing woke us: a doorbell was lost somewhere. Counted (and
            // shown by `tensorlane status`) so that tests can prove it never happens.
            ++counters_.late_wakeups;
        }
        if (work && mode != config::PollMode::kBusy) {
            last_work = Clock::now();  // only the sleeping modes look at it
        }
    }
    if (directory_) {
        directory_->stop(true);  // a clean stop: our key goes from etcd now, not at lease expiry
    }
    running_ = false;
}

size_t EngineImpl::progressTransports() {
    size_t work = 0;
    for (Transport *t : transports_.all()) {
        // The local transport's arrivals wait for the completion that names their writer.
        pipeline_->beginProgress(t == local_);
        work += t->progress(*this);
        pipeline_->endProgress();
    }
    if (peers_) {
        work += peers_->progress(*this);
    }
    return work;
}

void EngineImpl::peerState(PeerId peer, PeerState state, std::string_view reason) {
    std::string name = peers_ ? peers_->peerName(peer) : std::to_string(peer);
    if (state == PeerState::kFailed) {
        const int64_t now = monotonicMs();
        auto [it, fresh] = failed_logged_.try_emplace(peer);
        FailedLog &f = it->second;
        if (fresh || f.reason != reason || now - f.at_ms >= kRepeatLogMs) {
            if (!fresh && f.reason == reason && f.repeats > 0) {
                log_->warn("peer {} failed: {} ({} more times in the last {} s)", name, reason,
                           f.repeats, (now - f.at_ms) / 1000);
            } else {
                log_->warn("peer {} failed: {}", name, reason);
            }
            f = FailedLog{std::string(reason), now, 0};
        } else {
            ++f.repeats;
            log_->debug("peer {} failed: {}", name, reason);
        }
    } else if (state == PeerState::kConnecting && failed_logged_.contains(peer)) {
        // A retry of a peer that keeps failing: its failures say enough.
        log_->debug("peer {} is {}: {}", name, toString(state), reason);
    } else {
        failed_logged_.erase(peer);
        log_->info("peer {} is {}{}{}", name, toString(state), reason.empty() ? "" : ": ", reason);
    }
}

void EngineImpl::inboundClosed(PeerId peer, std::string_view reason) {
    (void)reason;  // the peer layer logged it
    if (peers_) {
        pipeline_->inboundClosed(peers_->peerName(peer));
    }
}

EngineReport EngineImpl::report(std::optional<uid_t> only_uid, ReportDetail want) const {
    EngineReport r;
    r.node = cfg_.node.name;
    r.socket = cfg_.node.socket;
    r.poll_mode = config::toString(cfg_.ipc.poll_mode);
    r.poll_mode_reason = poll_choice_.reason;
    for (const Transport *t : transports_.all()) {
        const TransportCaps caps = t->caps();
        r.link_mbps = std::max(r.link_mbps, caps.link_mbps);
        if (r.nic_pci_path.empty()) {
            r.nic_pci_path = caps.nic_pci_path;
        }
    }
    r.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    for (const auto &[id, s] : sessions_) {
        if (only_uid && s->cred.uid != *only_uid) {
            continue;  // another user's: its pid, uid and counters are not ours to show
        }
        ClientReport &c = r.clients.emplace_back();
        c.session = id;
        c.pid = s->cred.pid;
        c.uid = s->cred.uid;
        c.regions = regions_.countOfSession(id);
        c.requests = s->counters.requests;
        c.completions = s->counters.completions;
        c.notifications = s->counters.notifications;
        c.notifications_dropped = s->counters.notifications_dropped;
        c.rejected = s->counters.rejected;
        c.bytes_written = s->counters.bytes_written;
        c.host_bytes = s->host_bytes;
        c.in_flight = s->in_flight;
    }
    r.clients_shown = only_uid ? "uid " + std::to_string(*only_uid) : std::string("all");
    // The clients' regions: the sidecar's own probe region (4 KiB) is not counted.
    const bool probe = region_lifecycle_->probeRegion() != 0;
    r.regions = regions_.size() - (probe ? 1 : 0);
    {
        CudaRuntime &cuda = CudaRuntime::get();
        r.cuda.available = cuda.available();
        r.cuda.devices = cuda.deviceCount();
        r.cuda.imports_open = cuda.openMappings();
        r.cuda.imports_opened = cuda.importsOpened();
        if (!r.cuda.available) {
            r.cuda.why = cuda.why();
        }
    }
    r.registered_bytes = regions_.registeredBytes() - (probe ? 4096 : 0);
    LimitsReport &l = r.limits;
    l.regions = cfg_.limits.regions;
    l.registered_bytes = cfg_.limits.registered_bytes;
    l.node_registered_bytes = region_lifecycle_->nodeRegisteredCap();
    l.node_registered_bytes_source = region_lifecycle_->nodeCapSource();
    l.node_host_bytes = region_lifecycle_->nodeHostBytes();
    l.notification_backlog = cfg_.limits.notification_backlog;
    l.sessions_per_uid = cfg_.limits.sessions_per_uid;
    l.sessions_per_pid = cfg_.limits.sessions_per_pid;
    l.fd_reserve = cfg_.limits.fd_reserve;
    l.in_flight = cfg_.limits.in_flight;
    l.mappings = region_lifecycle_->mappings();
    l.max_mappings = region_lifecycle_->maxMappings();
    EngineCountersReport &c = r.counters;
    c.sessions_accepted = counters_.sessions_accepted;
    c.sessions_refused = counters_.sessions_refused;
    c.writes_local = counters_.writes_local;
    c.writes_local_inline = local_ ? local_->inlineWrites() : 0;
    c.writes_local_gpu_inline = local_ ? local_->inlineGpuWrites() : 0;
    c.writes_remote = counters_.writes_remote;
    c.requests_rejected = counters_.requests_rejected;
    c.notifications = counters_.notifications;
    c.notifications_dropped = counters_.notifications_dropped;
    c.probes_received = counters_.probes_received;
    c.probes_sent = counters_.probes_sent;
    c.quota_refusals = counters_.quota_refusals;
    c.session_cap_refusals = counters_.session_cap_refusals;
    c.accept_pauses = counters_.accept_pauses;
    c.late_wakeups = counters_.late_wakeups;
    c.writes_queued = pipeline_->queued();
    c.writes_in_flight = pipeline_->inFlight();
    if (peers_) {
        r.peers = peers_->report(want).peers;
    }
    if (directory_) {
        r.directory = directory_->report();
    }
    return r;
}

std::string EngineImpl::statusJson(std::optional<uid_t> only_uid) const {
    return toJsonText(report(only_uid));
}

// ---- Engine (the public face) ----

Engine::Engine(std::unique_ptr<EngineImpl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::create(const config::Config &cfg, Status *error) {
    return create(cfg, error, {});
}

std::unique_ptr<Engine> Engine::create(const config::Config &cfg, Status *error,
                                       std::vector<std::unique_ptr<Transport>> remote) {
    auto impl = std::make_unique<EngineImpl>(cfg, std::move(remote));
    Status st = impl->init();
    if (!st.isOk()) {
        *error = st;
        return nullptr;
    }
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Status Engine::start() {
    return impl_->start();
}
void Engine::run() {
    impl_->run();
}
void Engine::stop() {
    impl_->stop();
}
std::string Engine::statusJson() const {
    return impl_->statusJson();
}

}  // namespace tensorlane::sidecar
