#include "tensorlane/sidecar/engine.hpp"

#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cuda/import_checker.hpp"
#include "cuda/runtime.hpp"
#include "engine_impl.hpp"
#include "logging.hpp"
#include "metrics/metrics_server.hpp"
#include "tensorlane/ipc/doorbell.hpp"
#include "tensorlane/ipc/memory_limits.hpp"
#include "tensorlane/ipc/socket.hpp"

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

/// How many mappings the sidecar allows itself: vm.max_map_count less headroom for the
/// libraries, threads and transports (verbs and CUDA map too). Every session and every
/// tl_alloc_host buffer is one mapping, so without this one client could use them all up
/// and every later mmap of the process would fail.
uint64_t mappingBudget() {
    uint64_t max_map = 65530;  // the kernel's default
    std::ifstream in("/proc/sys/vm/max_map_count");
    if (in) {
        in >> max_map;
    }
    constexpr uint64_t kHeadroom = 4096;
    return max_map > 2 * kHeadroom ? max_map - kHeadroom : max_map / 2;
}

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

/// File descriptors this process has open now (/proc/self/fd); 0 when it cannot be read.
uint64_t countOpenFds() {
    std::error_code ec;
    uint64_t n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
        ++n;
    }
    return n;
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

}  // namespace

int addToEpoll(int epfd, int fd, uint32_t events, uint64_t tag) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    return ::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : errno;
}

EngineImpl::EngineImpl(const config::Config &cfg, std::vector<std::unique_ptr<Transport>> remote)
    : cfg_(cfg), log_(sidecarLogger()), stats_(peerNames(cfg)) {
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
    active_.clear();
    if (peers_) {
        peers_->stop();
    }
    peers_.reset();
    local_ = nullptr;
    transports_.clear();
    if (listen_) {
        ::unlink(cfg_.node.socket.c_str());
    }
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
    max_mappings_ = mappingBudget();
    const rlim_t fds = raiseFdLimit();
    // The node-wide cap on host buffers: all of them are charged to our memory cgroup (we back
    // them), so together they must leave the sidecar room to live.
    if (cfg_.limits.node_registered_bytes != 0) {
        node_registered_cap_ = cfg_.limits.node_registered_bytes;
        node_cap_source_ = "set";
    } else {
        const std::string root = ipc::memoryRoot();
        const uint64_t budget = ipc::memoryBudget(root);
        const ipc::CgroupMemory cg = ipc::readCgroupMemory(root);
        const bool by_cgroup = cg.version != 0 && cg.limit == budget;
        node_registered_cap_ =
            budget == UINT64_MAX
                ? cfg_.limits.registered_bytes
                : static_cast<uint64_t>(static_cast<unsigned __int128>(budget) *
                                        config::LimitsConfig::kAutoNodeRegisteredPercent / 100);
        node_cap_source_ =
            "auto: " + std::to_string(config::LimitsConfig::kAutoNodeRegisteredPercent) + "% of " +
            (budget == UINT64_MAX ? std::string("an unknown memory size (the per-client quota)")
             : by_cgroup          ? "the cgroup v" + std::to_string(cg.version) + " limit " +
                               config::formatBytes(budget)
                         : "MemTotal " + config::formatBytes(budget));
    }
    log_->info(
        "limits: host buffers of all clients up to {} ({}), {} per client; {} sessions "
        "per uid, {} per pid; {} file descriptors, {} held back for new uids",
        config::formatBytes(node_registered_cap_), node_cap_source_,
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
    } else if (!cfg_.peers.empty()) {
        if (Status st = addRemoteTransports(cfg_, regions_, &transports_); !st.isOk()) {
            return st;
        }
    }
    if (!cfg_.peers.empty()) {
        Status st;
        peers_ = makePeerManager(cfg_, regions_, transports_, &st);
        if (!peers_) {
            return st;
        }
    }
    return Status::ok();
}

Status EngineImpl::exposeProbeRegion() {
    ipc::SharedSegment seg;
    std::string error;
    if (ipc::createSegment(4096, ::getuid(), ::getgid(), &seg, &error)) {
        return {Code::kNoMemory, "the peer probe's region: " + error};
    }
    auto r = std::make_shared<Region>();
    r->owner = 0;  // no session: arrived() counts its notifications and tells no one
    r->kind = MemoryKind::kHost;
    r->bytes = 4096;
    r->base = static_cast<unsigned char *>(seg.mapping.data());
    r->mapping = std::make_shared<ipc::Mapping>(std::move(seg.mapping));
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        return st;
    }
    probe_region_ = regions_.add(r);
    return regions_.expose(probe_region_, kProbeRegionName);
}

Status EngineImpl::start() {
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
    unsigned mode = 0600;
    if (!sec.allowed_uids.empty() || sec.allowed_gids.size() > 1) {
        mode = 0666;
    } else if (sec.allowed_gids.size() == 1) {
        mode = 0660;
    }
    if (int rc = ipc::listenSeqpacket(path, mode, &listen_)) {
        return {Code::kInternal, "cannot listen on " + path + ": " + std::strerror(rc)};
    }
    if (mode == 0660 &&
        ::chown(path.c_str(), static_cast<uid_t>(-1), sec.allowed_gids.front()) != 0) {
        return {Code::kPermission, "cannot give " + path + " to group " +
                                       std::to_string(sec.allowed_gids.front()) +
                                       " ([security] allowed_gids): " + std::strerror(errno)};
    }
    if (int rc = addToEpoll(epoll_.get(), listen_.get(), EPOLLIN, kTagListen);
        rc || (rc = addToEpoll(epoll_.get(), stop_fd_.get(), EPOLLIN, kTagStop))) {
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
        if (Status st = exposeProbeRegion(); !st.isOk()) {
            return st;
        }
        Status st = peers_->start();
        if (!st.isOk()) {
            return st;
        }
        if (int rc = addToEpoll(epoll_.get(), peers_->wakeFd(), EPOLLIN, kTagPeers)) {
            return {Code::kInternal, std::string("epoll_ctl: ") + std::strerror(rc)};
        }
    }
    if (Status st = startMetrics(); !st.isOk()) {
        return st;
    }
    fd_baseline_ = countOpenFds();
    log_->info(
        "node {} serving workers on {} (mode {:04o}, poll mode {}, ring depth {}, in flight {}), "
        "{} peer(s)",
        cfg_.node.name, path, mode, config::toString(cfg_.ipc.poll_mode), cfg_.ipc.ring_depth,
        cfg_.limits.in_flight, cfg_.peers.size());
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
    snap.status_json = statusJson();
    snap.timing = stats_.timing();
    snap.rejected = stats_.rejectedByStatus();
    const auto &names = stats_.names();
    snap.peers.resize(names.size());
    for (size_t id = 0; id < names.size(); ++id) {
        snap.peers[id].name = names[id];
        snap.peers[id].local = id == kLocalPeer;
        snap.peers[id].stats = stats_.peers()[id];
    }
    for (const auto &[op_id, op] : ops_) {
        if (op.peer < snap.peers.size()) {
            ++snap.peers[op.peer].in_flight;
        }
    }
    for (const auto &[peer, q] : queues_) {
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
                acceptClients();
                ++work;
                break;
            case kTagStop:
                ipc::drain(stop_fd_.get());
                break;
            case kTagMetrics:
                metrics_channel_->serve([this] { return buildSnapshot(); });
                break;
            case kTagCudaCheck:
                finishCudaChecks();
                ++work;
                break;
            case kTagPeers:
                peers_->readable();  // its progress() this turn looks at its sockets
                break;
            case kTagTransport:
                // progress() runs every turn; a transport that looks at its fds only when
                // they are readable learns it here.
                if (const size_t t = (tag >> 32) & 0xffffff; t < transports_.all().size()) {
                    transports_.all()[t]->readable(static_cast<int>(tag & 0xffffffffu));
                }
                break;
            case kTagBell:
                if (Session *s = findSession(sid)) {
                    ipc::drain(s->to_sidecar.get());
                }
                break;
            case kTagSock:
                if (Session *s = findSession(sid)) {
                    if (events[i].events & EPOLLIN) {
                        readControl(*s);
                    }
                    if (!s->closing && (events[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))) {
                        closeSession(*s, "client hung up");
                    }
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
    // A GPU stream that is about to open a gate or take a hand-over is watched closely for a
    // while (the GPU cannot ring our doorbell); after that in 1 ms naps (run()).
    constexpr auto kStreamWatch = std::chrono::milliseconds(2);
    if (!stream_sessions_.empty() && streamsUrgent() &&
        std::chrono::steady_clock::now() - streams_moved_ < kStreamWatch) {
        return false;
    }
    // Work of our own first: queued writes a transport may take now, backlog a client has
    // made room for. A backlog that still does not fit is why we raise sidecar_sleeping on
    // that session too: the client rings to_sidecar after freeing slots (shim drainLocked).
    if (queued_ != 0 && pumpQueues() != 0) {
        return false;
    }
    for (Session *s : active_) {
        s->view.header->sidecar_sleeping.value.store(1, std::memory_order_relaxed);
    }
    // SYNC POINT: seq_cst fence between raising sidecar_sleeping and re-reading the request
    // slots and the completion heads; the client publishes its slots (or releases completion
    // slots), fences, then reads sidecar_sleeping (Dekker), so either we see its change here
    // or it sees our flag and rings to_sidecar.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (Session *s : active_) {
        if (s->closing) {
            continue;
        }
        const bool served = s->completion_backlog.size() < s->completions.depth() &&
                            s->in_flight < cfg_.limits.in_flight;
        if (served && s->requests.available() > 0) {
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
    for (Session *s : active_) {
        s->view.header->sidecar_sleeping.value.store(0, std::memory_order_relaxed);
    }
}

size_t EngineImpl::publishAll() {
    size_t moved = 0;
    for (Session *s : active_) {
        if (s->completions.corrupt() || s->notifications.corrupt()) {
            if (!s->closing) {
                log_->warn("session {} (pid {}): completion ring cursors corrupted; closing it",
                           s->id, s->cred.pid);
                closeSession(*s, "completion rings corrupted by the client");
            }
            continue;
        }
        if (!s->completion_backlog.empty() || !s->notification_backlog.empty()) {
            moved += s->flushBacklog();
        }
        s->publish();
    }
    return moved;
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
            int timeout = !stream_sessions_.empty() && streamsUrgent() ? 1 : kIdleTickMs;
            if (listen_paused_) {
                const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    listen_paused_until_ - Clock::now());
                timeout = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, timeout));
            }
            work += pollEvents(timeout);
            disarmSleep();
            woke_by_tick = last_poll_events_ == 0;
        } else if ((++iteration & 1023) == 0 || mode != config::PollMode::kBusy) {
            // Busy loops look at sockets every 1024 turns (tens of microseconds): control calls
            // are rare, requests not, and an epoll_wait costs as much as several round trips.
            work += pollEvents(0);
        }
        if (listen_paused_) {
            resumeListener();
        }
        work += drainRequests();
        work += pollStreams();
        work += progressTransports();
        work += pumpQueues();
        work += publishAll();
        stats_.timeEnded();  // the end stamp of the writes that ended this turn, once published
        if (!to_reap_.empty()) {
            reapSessions();
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
    running_ = false;
}

size_t EngineImpl::progressTransports() {
    size_t work = 0;
    for (Transport *t : transports_.all()) {
        in_local_progress_ = t == local_;
        work += t->progress(*this);
        in_local_progress_ = false;
        releaseHeldArrival(ipc::kWriterUidUnknown);  // none is left unless that order changed
    }
    if (peers_) {
        work += peers_->progress(*this);
    }
    return work;
}

void EngineImpl::resumeListener() {
    if (std::chrono::steady_clock::now() < listen_paused_until_) {
        return;
    }
    listen_paused_ = false;
    if (int rc = addToEpoll(epoll_.get(), listen_.get(), EPOLLIN, kTagListen)) {
        log_->error("cannot watch {} again: {}", cfg_.node.socket, std::strerror(rc));
        return;
    }
    acceptClients();
}

void EngineImpl::closeSession(Session &s, std::string reason) {
    if (s.closing) {
        return;
    }
    s.closing = true;
    s.close_reason = std::move(reason);
    to_reap_.push_back(s.id);
}

void EngineImpl::reapSessions() {
    std::vector<SessionId> ids;
    ids.swap(to_reap_);
    for (SessionId id : ids) {
        destroySession(id);
    }
}

void EngineImpl::destroySession(SessionId id) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
        return;
    }
    Session &s = *it->second;
    // Its writes still waiting for a transport are not sent for a client that is gone: they
    // end here (their completions find no session) and let go of the memory at once.
    size_t dropped = 0;
    if (queued_ != 0) {
        std::vector<uint64_t> ended;
        for (auto &[peer, q] : queues_) {
            for (auto qi = q.ops.begin(); qi != q.ops.end();) {
                auto op = ops_.find(qi->op_id);
                if (op != ops_.end() && op->second.session == id) {
                    ended.push_back(qi->op_id);
                    qi = q.ops.erase(qi);
                    --queued_;
                } else {
                    ++qi;
                }
            }
        }
        for (uint64_t op_id : ended) {
            completed(op_id, Code::kConnection, "the client is gone");
        }
        dropped = ended.size();
    }
    if (s.streams) {
        // Gated writes whose stream never reached them: they end like queued ones.
        for (WriteOp &op : s.streams->takeHeld()) {
            completed(op.op_id, Code::kConnection, "the client is gone");
            ++dropped;
        }
        --mappings_;  // the stream segment
    }
    size_t released = 0;
    for (auto &r : regions_.ofSession(id)) {
        releaseRegion(r);
        ++released;
    }
    --mappings_;  // the session segment
    if (auto u = sessions_of_uid_.find(s.cred.uid);
        u != sessions_of_uid_.end() && --u->second == 0) {
        sessions_of_uid_.erase(u);
    }
    if (auto p = sessions_of_pid_.find(s.cred.pid);
        p != sessions_of_pid_.end() && --p->second == 0) {
        sessions_of_pid_.erase(p);
    }
    log_->info(
        "session {} (pid {}, uid {}) closed: {}; released {} region(s), {} request(s) in "
        "flight, {} queued write(s) dropped",
        id, s.cred.pid, s.cred.uid, s.close_reason, released, s.in_flight, dropped);
    active_.erase(std::remove(active_.begin(), active_.end(), &s), active_.end());
    // Closing the fds removes them from epoll; the segment mapping goes with the session.
    // Writes still in flight keep their regions alive; their completions find no session.
    sessions_.erase(it);
}

void EngineImpl::releaseRegion(const std::shared_ptr<Region> &r) {
    bool was_exposed = !r->exposed_name.empty();
    if (!regions_.remove(r->id)) {
        return;  // already released (a range released with its buffer)
    }
    if (Session *s = findSession(r->owner);
        s != nullptr && r->parent == 0 && r->kind == MemoryKind::kHost) {
        s->host_bytes -= r->bytes;
        --s->mappings;
    }
    if (r->parent == 0 && r->kind == MemoryKind::kHost) {
        --mappings_;
        if (r->owner != 0) {
            node_host_bytes_ -= r->bytes;  // a client's tl_alloc_host buffer (onAllocHost)
        }
    }
    if (was_exposed && peers_) {
        peers_->regionRevoked(r->id);
    }
    if (Session *s = findSession(r->owner); s != nullptr && s->streams) {
        s->streams->regionReleased(r->id);  // its stream waits are released, never left hanging
    }
    // Transports let go of it once no write uses it any more (DESIGN.md: "deregistered only
    // after the work in flight on it has ended").
    if (r->users == 0) {
        retireRegion(r);
    } else {
        retiring_.emplace(r->id, r);
    }
    // Ranges registered inside a host buffer go with it.
    if (r->parent == 0) {
        for (auto &child : regions_.ofSession(r->owner)) {
            if (child->parent == r->id) {
                releaseRegion(child);
            }
        }
    }
}

void EngineImpl::retireRegion(const std::shared_ptr<Region> &r) {
    transports_.deregisterRegion(r->id);
}

void EngineImpl::dropUser(const std::shared_ptr<Region> &r) {
    if (!r || --r->users != 0 || !r->revoked.load(std::memory_order_relaxed)) {
        return;
    }
    if (auto it = retiring_.find(r->id); it != retiring_.end()) {
        retiring_.erase(it);
        retireRegion(r);
    }
}

void EngineImpl::completed(uint64_t op_id, Code status, std::string_view reason) {
    if (held_arrival_) {
        // The owner's notification first, as the transport reported it (DESIGN.md, data path).
        // Looked up apart: delivering it may close the owner's session.
        auto w = ops_.find(op_id);
        releaseHeldArrival(w != ops_.end() ? w->second.writer_uid : ipc::kWriterUidUnknown);
    }
    auto it = ops_.find(op_id);
    if (it == ops_.end()) {
        return;
    }
    PendingOp op = std::move(it->second);
    ops_.erase(it);
    // Counted whether or not the writer is still there: the peer saw the write either way.
    // Timed to the end of this turn, after its completions are published (run()).
    stats_.writeEndedSince(op.peer, status, op.bytes, op.accepted_ns);
    dropUser(op.src);
    dropUser(op.dst);
    Session *s = findSession(op.session);
    if (!s) {
        return;  // the writer is gone; nothing to tell
    }
    --s->in_flight;
    if (s->closing) {
        return;
    }
    if (status == Code::kOk) {
        s->counters.bytes_written += op.bytes;
    } else {
        log_->debug("session {} ticket {} failed: {} ({})", s->id, op.ticket, ipc::codeName(status),
                    reason);
    }
    completeOrClose(*s, op.ticket, status, op.bytes, op.slot);
}

void EngineImpl::releaseHeldArrival(uint32_t writer_uid) {
    if (!held_arrival_) {
        return;
    }
    HeldArrival a = std::move(*held_arrival_);
    held_arrival_.reset();
    notifyArrival(a.region, a.imm, a.offset, a.bytes, a.peer, writer_uid);
}

void EngineImpl::arrived(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                         std::string_view peer_name) {
    if (in_local_progress_) {
        // A local write: its completed() follows at once and names the writer.
        releaseHeldArrival(ipc::kWriterUidUnknown);
        held_arrival_ = HeldArrival{region, imm, offset, bytes, peer_name};
        return;
    }
    notifyArrival(region, imm, offset, bytes, peer_name, ipc::kWriterUidPeer);
}

void EngineImpl::notifyArrival(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                               std::string_view peer_name, uint32_t writer_uid) {
    if (region == probe_region_ && probe_region_ != 0) {
        ++counters_.probes_received;
        return;
    }
    stats_.received(peer_name, bytes);
    auto r = regions_.find(region);
    Session *s = r ? findSession(r->owner) : nullptr;
    if (!s || s->closing) {
        ++counters_.notifications_dropped;
        return;
    }
    if (s->streams && s->streams->divert(region, imm)) {
        ++counters_.notifications;  // counted for tl_stream_wait_notification's flag
        return;
    }
    ipc::Notification n{};
    n.region = region;
    n.offset = offset;
    n.bytes = bytes;
    n.imm = imm;
    n.writer_uid = writer_uid;
    std::string name(peer_name.substr(0, ipc::kPeerNameBytes - 1));
    std::memcpy(n.peer, name.data(), name.size());
    if (s->notify(n)) {
        ++counters_.notifications;
    } else {
        // Its backlog is full ([limits] notification_backlog): dropped and counted; the
        // writer's ticket still ends TL_OK (the data is in place).
        ++counters_.notifications_dropped;
    }
}

void EngineImpl::peerState(PeerId peer, PeerState state, std::string_view reason) {
    std::string name = peers_ ? peers_->peerName(peer) : std::to_string(peer);
    if (state == PeerState::kFailed) {
        log_->warn("peer {} failed: {}", name, reason);
    } else {
        log_->info("peer {} is {}{}{}", name, toString(state), reason.empty() ? "" : ": ", reason);
    }
}

std::string EngineImpl::statusJson(std::optional<uid_t> only_uid) const {
    using nlohmann::json;
    json j;
    j["node"] = cfg_.node.name;
    j["socket"] = cfg_.node.socket;
    j["poll_mode"] = config::toString(cfg_.ipc.poll_mode);
    j["uptime_s"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    json clients = json::array();
    for (const auto &[id, s] : sessions_) {
        if (only_uid && s->cred.uid != *only_uid) {
            continue;  // another user's: its pid, uid and counters are not ours to show
        }
        clients.push_back({{"session", id},
                           {"pid", s->cred.pid},
                           {"uid", s->cred.uid},
                           {"regions", regions_.ofSession(id).size()},
                           {"requests", s->counters.requests},
                           {"completions", s->counters.completions},
                           {"notifications", s->counters.notifications},
                           {"notifications_dropped", s->counters.notifications_dropped},
                           {"rejected", s->counters.rejected},
                           {"bytes_written", s->counters.bytes_written},
                           {"host_bytes", s->host_bytes},
                           {"in_flight", s->in_flight}});
    }
    j["clients"] = clients;
    j["clients_shown"] = only_uid ? "uid " + std::to_string(*only_uid) : std::string("all");
    // The clients' regions: the sidecar's own probe region (4 KiB) is not counted.
    const bool probe = probe_region_ != 0;
    j["regions"] = regions_.size() - (probe ? 1 : 0);
    {
        CudaRuntime &cuda = CudaRuntime::get();
        j["cuda"] = {{"available", cuda.available()},
                     {"devices", cuda.deviceCount()},
                     {"imports_open", cuda.openMappings()},
                     {"imports_opened", cuda.importsOpened()}};
        if (!cuda.available()) {
            j["cuda"]["why"] = cuda.why();
        }
    }
    j["registered_bytes"] = regions_.registeredBytes() - (probe ? 4096 : 0);
    j["limits"] = {{"regions", cfg_.limits.regions},
                   {"registered_bytes", cfg_.limits.registered_bytes},
                   {"node_registered_bytes", node_registered_cap_},
                   {"node_registered_bytes_source", node_cap_source_},
                   {"node_host_bytes", node_host_bytes_},
                   {"notification_backlog", cfg_.limits.notification_backlog},
                   {"sessions_per_uid", cfg_.limits.sessions_per_uid},
                   {"sessions_per_pid", cfg_.limits.sessions_per_pid},
                   {"fd_reserve", cfg_.limits.fd_reserve},
                   {"in_flight", cfg_.limits.in_flight},
                   {"mappings", mappings_},
                   {"max_mappings", max_mappings_}};
    j["counters"] = {{"sessions_accepted", counters_.sessions_accepted},
                     {"sessions_refused", counters_.sessions_refused},
                     {"writes_local", counters_.writes_local},
                     {"writes_local_inline", local_ ? local_->inlineWrites() : 0},
                     {"writes_local_gpu_inline", local_ ? local_->inlineGpuWrites() : 0},
                     {"writes_remote", counters_.writes_remote},
                     {"requests_rejected", counters_.requests_rejected},
                     {"notifications", counters_.notifications},
                     {"notifications_dropped", counters_.notifications_dropped},
                     {"probes_received", counters_.probes_received},
                     {"quota_refusals", counters_.quota_refusals},
                     {"session_cap_refusals", counters_.session_cap_refusals},
                     {"accept_pauses", counters_.accept_pauses},
                     {"late_wakeups", counters_.late_wakeups},
                     {"writes_queued", queued_},
                     {"writes_in_flight", ops_.size()}};
    json peers = json::array();
    if (peers_) {
        json pj = json::parse(peers_->statusJson(), nullptr, false);
        if (pj.is_object() && pj.contains("peers")) {
            peers = pj["peers"];
        }
    }
    j["peers"] = peers;
    return j.dump(2);
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
