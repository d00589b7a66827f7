#include "harness.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include <infiniband/verbs.h>

#include "../sidecar/free_port.hpp"
#include "tensorlane/ipc/shm.hpp"

namespace tensorlane::peertest {

namespace {

std::atomic<uint64_t> g_order{1};
std::atomic<uint64_t> g_op{1000};

std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> logRing() {
    // Installed on the peer logger before any node exists, so every message is captured; the
    // logger also keeps printing to stderr for people reading test output.
    static std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> ring = [] {
        auto r = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096);
        auto logger = spdlog::get("tensorlane.sidecar.peer");
        if (!logger) {
            logger = spdlog::stderr_color_mt("tensorlane.sidecar.peer");
        }
        logger->sinks().push_back(r);
        logger->set_level(spdlog::level::info);
        return r;
    }();
    return ring;
}

}  // namespace

uint64_t nextOpId() {
    return g_op.fetch_add(1);
}

std::vector<std::string> peerLogLines() {
    return logRing()->last_formatted();
}

size_t peerLogCount(const std::vector<std::string> &parts) {
    size_t n = 0;
    for (const auto &line : peerLogLines()) {
        n += std::all_of(parts.begin(), parts.end(),
                         [&](const std::string &p) { return line.find(p) != std::string::npos; })
                 ? 1
                 : 0;
    }
    return n;
}

bool peerLogHas(const std::vector<std::string> &parts) {
    return peerLogCount(parts) > 0;
}

uint16_t freePort() {
    return tltest::freePort();
}

TempDir::TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tl-peer-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
        throw std::runtime_error("mkdtemp failed");
    }
    path_ = tmpl;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

std::string TempDir::writeFile(const std::string &name, const std::string &content,
                               unsigned mode) const {
    const std::string p = path_ + "/" + name;
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0 ||
        ::write(fd, content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
        throw std::runtime_error("cannot write " + p);
    }
    ::fchmod(fd, mode);
    ::close(fd);
    return p;
}

// ----- sink

void RecordingSink::add(Event e) {
    e.order = g_order.fetch_add(1);
    e.at = std::chrono::steady_clock::now();
    if (on_event) {
        on_event(e);
    }
    {
        std::lock_guard lock(mu_);
        events_.push_back(std::move(e));
    }
    cv_.notify_all();
}

void RecordingSink::completed(uint64_t op_id, Code status, std::string_view reason) {
    Event e;
    e.kind = Event::Kind::kCompleted;
    e.op_id = op_id;
    e.code = status;
    e.reason = std::string(reason);
    add(std::move(e));
}

void RecordingSink::arrived(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                            std::string_view peer_name) {
    Event e;
    e.kind = Event::Kind::kArrived;
    e.region = region;
    e.imm = imm;
    e.offset = offset;
    e.bytes = bytes;
    e.peer_name = std::string(peer_name);
    add(std::move(e));
}

void RecordingSink::messageArrived(RegionId region, uint32_t imm, uint64_t offset,
                                   std::span<const uint8_t> message, std::string_view peer_name) {
    Event e;
    e.kind = Event::Kind::kMessage;
    e.region = region;
    e.imm = imm;
    e.offset = offset;
    e.message.assign(message.begin(), message.end());
    e.peer_name = std::string(peer_name);
    add(std::move(e));
}

void RecordingSink::peerState(PeerId peer, PeerState state, std::string_view reason) {
    Event e;
    e.kind = Event::Kind::kState;
    e.peer = peer;
    e.state = state;
    e.reason = std::string(reason);
    add(std::move(e));
}

bool RecordingSink::waitFor(const std::function<bool(const std::vector<Event> &)> &pred,
                            std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(events_); });
}

std::optional<Event> RecordingSink::completion(uint64_t op_id, std::chrono::milliseconds timeout) {
    std::optional<Event> out;
    waitFor(
        [&](const std::vector<Event> &evs) {
            for (const auto &e : evs) {
                if (e.kind == Event::Kind::kCompleted && e.op_id == op_id) {
                    out = e;
                    return true;
                }
            }
            return false;
        },
        timeout);
    return out;
}

std::vector<Event> RecordingSink::events() const {
    std::lock_guard lock(mu_);
    return events_;
}

std::vector<Event> RecordingSink::arrivals() const {
    std::vector<Event> out;
    for (auto &e : events()) {
        if (e.kind == Event::Kind::kArrived) {
            out.push_back(e);
        }
    }
    return out;
}

std::vector<Event> RecordingSink::deliveries() const {
    std::vector<Event> out;
    for (auto &e : events()) {
        if (e.kind == Event::Kind::kArrived || e.kind == Event::Kind::kMessage) {
            out.push_back(e);
        }
    }
    return out;
}

size_t RecordingSink::count(Event::Kind kind) const {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (const auto &e : events_) {
        n += e.kind == kind ? 1 : 0;
    }
    return n;
}

// ----- regions

std::shared_ptr<Region> makeHostRegion(size_t bytes) {
    ipc::SharedSegment seg;
    std::string error;
    if (ipc::createSegment(bytes, ::getuid(), ::getgid(), &seg, &error) != 0) {
        throw std::runtime_error("createSegment: " + error);
    }
    auto r = std::make_shared<Region>();
    r->base = static_cast<unsigned char *>(seg.mapping.data());
    r->bytes = bytes;
    r->mapping = std::make_shared<ipc::Mapping>(std::move(seg.mapping));
    return r;
}

void fillRandom(unsigned char *p, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    size_t i = 0;
    while (i < n) {
        uint64_t v = rng();
        for (int k = 0; k < 8 && i < n; ++k, ++i) {
            const unsigned char b = static_cast<unsigned char>(v >> (8 * k));
            p[i] = b == 0 ? 0x5a : b;
        }
    }
}

// ----- the simulated HCA

const std::string &simTree() {
    static const std::string root = [] {
        std::string dir =
            (std::filesystem::temp_directory_path() / ("tl-peer-sim-" + std::to_string(::getpid())))
                .string();
        std::filesystem::remove_all(dir);
        const unsigned pid = static_cast<unsigned>(::getpid());
        for (int i = 0; i < 8; ++i) {
            const std::string ip = "127." + std::to_string(1 + (pid >> 8) % 250) + "." +
                                   std::to_string(pid % 250) + "." + std::to_string(100 + i);
            const std::string cmd = std::string("bash '") + TENSORLANE_MKSYSFS + "' '" + dir +
                                    "' --dev sim" + std::to_string(i) + " --netdev tlp" +
                                    std::to_string(i) + " --ip " + ip + " --mtu 4200 >/dev/null";
            if (std::system(cmd.c_str()) != 0) {
                throw std::runtime_error("mksysfs.sh failed: " + cmd);
            }
        }
        ::setenv("TENSORLANE_SYSFS_ROOT", dir.c_str(), 1);
        // Removed at exit (a static's destructor would race the nodes' threads).
        std::atexit([] {
            std::error_code ec;
            const char *d = std::getenv("TENSORLANE_SYSFS_ROOT");
            if (d != nullptr) {
                std::filesystem::remove_all(d, ec);
            }
        });
        return dir;
    }();
    return root;
}

bool simulatedHcaLoaded() {
    (void)simTree();
    int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    bool sim = false;
    for (int i = 0; list != nullptr && i < n; ++i) {
        sim = sim || std::string(ibv_get_device_name(list[i])) == "sim0";
    }
    if (list != nullptr) {
        ibv_free_device_list(list);
    }
    return sim;
}

// ----- node

int nextSimDevice() {
    static std::atomic<int> next{0};
    (void)simTree();
    return next.fetch_add(1) % 8;
}

config::Config makeConfig(const NodeOptions &o) {
    config::Config cfg;
    cfg.source = "<peer test>";
    cfg.node.name = o.name;
    cfg.node.listen = config::Endpoint{o.listen_host, o.port};
    cfg.security.peer_key_file = o.key_file;
    cfg.tcp.connect_timeout_ms = 1000;
    cfg.tcp.peer_timeout_ms = 1500;
    cfg.tcp.keepalive_ms = 250;
    cfg.tcp.reconnect_min_ms = 50;
    cfg.tcp.reconnect_max_ms = 400;
    cfg.tcp.connections_per_peer = 2;
    cfg.tcp.chunk_bytes = 1u << 20;
    for (size_t i = 0; i < o.peers.size(); ++i) {
        config::PeerConfig pc;
        pc.name = o.peers[i].first;
        pc.address = config::Endpoint{i < o.peer_hosts.size() ? o.peer_hosts[i] : "127.0.0.1",
                                      o.peers[i].second};
        cfg.peers.push_back(pc);
    }
    if (o.transport == "verbs") {
        // A device of its own for every node, in turn (a test uses at most a few at once).
        const int dev = nextSimDevice();
        cfg.fabric.transport = config::TransportKind::kVerbs;
        cfg.fabric.device = "sim" + std::to_string(dev);
        cfg.fabric.netdev = "tlp" + std::to_string(dev);
        // Failures show within the tests' timeouts: 4.096 us * 2^14 = 67 ms a try, 3 tries.
        cfg.fabric.timeout = 14;
        cfg.fabric.retry_cnt = 3;
    }
    if (o.tweak) {
        o.tweak(cfg);
    }
    return cfg;
}

Node::Node(NodeOptions opts) : opts_(std::move(opts)) {
    (void)logRing();
    task_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    auto started = started_.get_future();
    thread_ = std::thread([this] { run(); });
    started.wait();
}

Node::~Node() {
    stop_.store(true);
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(task_fd_, &one, sizeof one);
    thread_.join();
    ::close(task_fd_);
}

void Node::submit(std::function<void()> task) {
    {
        std::lock_guard lock(mu_);
        tasks_.push_back(std::move(task));
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(task_fd_, &one, sizeof one);
}

void Node::run() {
    if (opts_.netns_fd >= 0 && ::setns(opts_.netns_fd, CLONE_NEWNET) != 0) {
        start_status_ = Status{Code::kPermission, std::string("setns: ") + std::strerror(errno)};
        started_.set_value();
        return;
    }
    // Built and started on this thread, as the engine does: sockets belong to its netns.
    const config::Config cfg = makeConfig(opts_);
    Status error = sidecar::addRemoteTransports(cfg, regions_, &transports_);
    if (error.isOk()) {
        pm_ = sidecar::makePeerManager(cfg, regions_, transports_, &error);
    }
    if (!pm_) {
        start_status_ = error;
    } else {
        start_status_ = pm_->start();
    }
    started_.set_value();
    if (!pm_ || !start_status_.isOk()) {
        while (!stop_.load()) {
            std::vector<std::function<void()>> tasks;
            {
                std::lock_guard lock(mu_);
                tasks.swap(tasks_);
            }
            for (auto &t : tasks) {
                t();
            }
            std::this_thread::sleep_for(5ms);
        }
        return;
    }
    while (!stop_.load()) {
        std::vector<std::function<void()>> tasks;
        {
            std::lock_guard lock(mu_);
            tasks.swap(tasks_);
        }
        for (auto &t : tasks) {
            t();
        }
        bool armed = true;
        if (!paused_.load()) {
            // The engine's turn: every transport, then the peer layer; arm before sleeping.
            for (sidecar::Transport *t : transports_.all()) {
                t->progress(sink);
            }
            pm_->progress(sink);
            for (sidecar::Transport *t : transports_.all()) {
                t->afterPublish();  // (the sink "publishes" as it goes)
            }
            for (sidecar::Transport *t : transports_.all()) {
                armed = t->arm() && armed;
            }
        }
        std::vector<pollfd> fds = {{task_fd_, POLLIN, 0}};
        if (!paused_.load()) {
            fds.push_back({pm_->wakeFd(), POLLIN, 0});
            for (sidecar::Transport *t : transports_.all()) {
                for (int fd : t->pollFds()) {
                    fds.push_back({fd, POLLIN, 0});
                }
            }
        }
        const int n = ::poll(fds.data(), fds.size(), armed ? 50 : 0);
        if (n > 0) {
            if (fds.size() > 1 && (fds[1].revents & POLLIN) != 0) {
                wakeups_.fetch_add(1);
                pm_->readable();
            }
            // As the engine does: tell each transport which of its fds are readable.
            size_t k = 2;
            for (sidecar::Transport *t : transports_.all()) {
                for (int fd : t->pollFds()) {
                    if (k < fds.size() && fds[k].fd == fd && (fds[k].revents & POLLIN) != 0) {
                        t->readable(fd);
                    }
                    ++k;
                }
            }
            uint64_t v = 0;
            [[maybe_unused]] ssize_t drained = ::read(task_fd_, &v, sizeof v);
        }
    }
    // Like the engine: stop on the engine thread, then destroy.
    std::vector<std::function<void()>> tasks;
    {
        std::lock_guard lock(mu_);
        tasks.swap(tasks_);
    }
    for (auto &t : tasks) {
        t();
    }
    pm_->stop();
    for (sidecar::Transport *t : transports_.all()) {
        t->progress(sink);
        t->afterPublish();
    }
    pm_->progress(sink);
    pm_.reset();
    transports_.clear();
}

std::shared_ptr<Region> Node::addRegion(size_t bytes, const std::string &name) {
    auto r = makeHostRegion(bytes);
    // On the loop thread: the table is the engine thread's (a session's snapshot reads it).
    call([&] { return regions_.add(r); });
    if (!name.empty()) {
        expose(r, name);
    }
    return r;
}

void Node::expose(const std::shared_ptr<Region> &r, const std::string &name) {
    call([&] {
        Status s = regions_.expose(r->id, name);
        if (s.isOk()) {
            pm_->regionExposed(*r);
        }
        return 0;
    });
}

void Node::exposeLocally(const std::shared_ptr<Region> &r, const std::string &name) {
    call([&] {
        sidecar::RegionAccess access;
        access.peers = false;
        return regions_.expose(r->id, name, access).isOk() ? 0 : 1;
    });
}

void Node::revoke(RegionId id) {
    call([&] {
        auto r = regions_.remove(id);
        if (r) {
            pm_->regionRevoked(id);
        }
        return 0;
    });
}

std::pair<Status, RemoteRegion> Node::lookup(const std::string &peer, const std::string &region,
                                             std::chrono::milliseconds timeout) {
    auto result = std::make_shared<std::promise<std::pair<Status, RemoteRegion>>>();
    auto fut = result->get_future();
    const bool known = call([&] {
        auto id = pm_->peerByName(peer);
        if (!id) {
            return false;
        }
        pm_->lookup(*id, region, [result](Status s, RemoteRegion rr) {
            result->set_value({std::move(s), rr});
        });
        return true;
    });
    if (!known) {
        return {Status{Code::kNotFound, "unknown peer " + peer}, {}};
    }
    if (fut.wait_for(timeout) != std::future_status::ready) {
        return {Status{Code::kTimedOut, "lookup callback never ran"}, {}};
    }
    return fut.get();
}

std::pair<Status, uint64_t> Node::post(const std::string &peer, const std::shared_ptr<Region> &src,
                                       uint64_t src_offset, RegionId remote, uint64_t dst_offset,
                                       uint64_t bytes, uint32_t imm) {
    return postOp(peer, src, src_offset, remote, dst_offset, bytes, imm, false, {});
}

std::pair<Status, uint64_t> Node::postOp(const std::string &peer,
                                         const std::shared_ptr<Region> &src, uint64_t src_offset,
                                         RegionId remote, uint64_t dst_offset, uint64_t bytes,
                                         uint32_t imm, bool silent, std::vector<uint8_t> message) {
    const uint64_t op_id = nextOpId();
    // kAgain ("full for now", "registering the source", "waiting for the key") is posted again
    // after the loop turned, as the engine's per-peer queue does.
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    for (;;) {
        Status s = call([&] {
            auto id = pm_->peerByName(peer);
            if (!id) {
                return Status{Code::kNotFound, "unknown peer"};
            }
            // What the engine does before posting: the handle becomes the peer's region id.
            WriteOp op;
            std::string why;
            if (!pm_->resolveRemote(*id, remote, &op.remote_region, &why)) {
                return Status{Code::kNotFound, "remote region not valid: " + why};
            }
            op.op_id = op_id;
            op.peer = *id;
            op.src = src;
            op.src_offset = src_offset;
            op.dst_region = remote;
            op.dst_offset = dst_offset;
            op.bytes = bytes;
            op.imm = imm;
            op.silent = silent;
            op.message = message;
            return transports_.post(op);
        });
        if (s.code() != Code::kAgain || std::chrono::steady_clock::now() >= deadline) {
            return {s, op_id};
        }
        std::this_thread::sleep_for(1ms);
    }
}

bool Node::remoteValid(const std::string &peer, RegionId remote) {
    return call([&] {
        auto id = pm_->peerByName(peer);
        return id && pm_->remoteValid(*id, remote);
    });
}

PeerState Node::state(const std::string &peer) {
    return call([&] {
        auto id = pm_->peerByName(peer);
        return id ? pm_->peerState(*id) : PeerState::kDown;
    });
}

std::string Node::statusJson() {
    return call([&] { return pm_->statusJson(); });
}

sidecar::PeersReport Node::report(sidecar::ReportDetail want) {
    return call([&] { return pm_->report(want); });
}

nlohmann::json peerStatus(Node &n, const std::string &peer) {
    auto j = nlohmann::json::parse(n.statusJson());
    for (auto &p : j["peers"]) {
        if (p["name"] == peer) {
            return p;
        }
    }
    return nullptr;
}

}  // namespace tensorlane::peertest
