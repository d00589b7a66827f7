#include "engine.hpp"

#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "device.hpp"
#include "endpoint.hpp"
#include "hw_counters.hpp"
#include "log.hpp"
#include "packet_parser.hpp"
#include "qp.hpp"
#include "sysfs_tree.hpp"

namespace tensorlane::simhca {
namespace {

constexpr int kRxBatch = 64;
constexpr size_t kRxBufferBytes = 9216;  // a 9000-byte jumbo frame's datagram fits
constexpr int64_t kCounterFlushNs = 100'000'000;
// Hosts with at least this many CPUs to run on get the polling window by default.
constexpr long kPollFromCpus = 8;
constexpr int64_t kDefaultPollNs = 50'000;

uint64_t routeKey(uint32_t ip, uint32_t qpn) {
    return (uint64_t{ip} << 24) | qpn;
}

// epoll tags: endpoints are named by their address, never by pointer, so an event that races
// with the endpoint's removal finds nothing instead of freed memory.
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kInotifyTag = 1ull << 63;
constexpr uint64_t kEndpointTag = 1ull << 62;

struct RxBuffers {
    std::unique_ptr<uint8_t[]> data{new uint8_t[kRxBatch * kRxBufferBytes]};
    mmsghdr msgs[kRxBatch]{};
    iovec iov[kRxBatch]{};
    sockaddr_in from[kRxBatch]{};
};

// QPs owing a coalesced ACK after the receive batch this thread is running.
thread_local std::vector<SimQp *> tl_acks;

RxBuffers &rxBuffers() {
    static thread_local RxBuffers buffers;
    return buffers;
}

// How long the engine keeps polling after traffic before it sleeps in epoll:
// TENSORLANE_SIMHCA_POLL_US, else 50 us on a host with 8 or more CPUs for this process and
// none below that (docs/simhca.md, "Speed").
int64_t pollWindowNs() {
    if (const char *v = getenv("TENSORLANE_SIMHCA_POLL_US"); v != nullptr && *v != '\0') {
        char *end = nullptr;
        const long us = std::strtol(v, &end, 10);
        if (end != nullptr && *end == '\0' && us >= 0 && us <= 1'000'000) {
            return int64_t{us} * 1000;
        }
        log(LogLevel::kWarn, "TENSORLANE_SIMHCA_POLL_US=%s is not 0..1000000; using the default",
            v);
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    const long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return cpus >= kPollFromCpus ? kDefaultPollNs : 0;
}

}  // namespace

Engine::Engine() : next_qpn_(0x11 + ((static_cast<uint32_t>(getpid()) & 0xfff) << 8)) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeTag;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    ev.data.u64 = kInotifyTag;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, inotify_fd_, &ev);
    thread_ = std::thread([this] { run(); });
    thread_id_ = thread_.get_id();
    // Writing the counters back is file I/O; it runs on its own thread at normal priority so
    // the engine never stalls a packet on it.
    housekeeper_ = std::thread([this] {
        std::unique_lock lock(housekeeping_mutex_);
        while (!housekeeping_cv_.wait_for(lock, std::chrono::nanoseconds(kCounterFlushNs),
                                          [this] { return stop_.load(); })) {
            flushCounters();
        }
    });
}

Engine::~Engine() {
    stop_.store(true);
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    thread_.join();
    {
        std::lock_guard lock(housekeeping_mutex_);
        housekeeping_cv_.notify_all();
    }
    housekeeper_.join();
    flushCounters();
    endpoints_.clear();
    close(inotify_fd_);
    close(wake_fd_);
    close(epoll_fd_);
}

uint32_t Engine::allocateQpn() {
    uint32_t qpn;
    do {
        qpn = next_qpn_.fetch_add(1) & 0xffffff;
    } while (qpn < 2);
    return qpn;
}

int Engine::addQp(SimQp *qp, SimDevice *dev) {
    std::lock_guard lock(map_mutex_);
    int &count = device_qps_[dev];
    if (count == 0) {
        // Every RoCE v2 GID holding an IPv4-mapped address is an endpoint of the port.
        const DeviceInfo info = dev->info();
        std::vector<uint32_t> opened;
        for (size_t p = 0; p < info.ports.size(); ++p) {
            for (const GidEntry &g : info.ports[p].gids) {
                const auto ip = g.ipv4();
                if (!g.roce_v2 || !ip || endpoints_.count(*ip) != 0) {
                    continue;
                }
                auto ep = std::make_unique<Endpoint>(dev, static_cast<uint8_t>(p + 1), *ip);
                if (const int err = ep->open(); err != 0) {
                    in_addr a{htonl(*ip)};
                    log(LogLevel::kError, "%s port %zu: cannot bind %s:4791 for RoCEv2: %s%s",
                        dev->name().c_str(), p + 1, inet_ntoa(a), strerror(err),
                        err == EADDRINUSE ? " (is another process using this simulated device?)"
                                          : "");
                    for (uint32_t o : opened) {
                        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, endpoints_[o]->fd(), nullptr);
                        endpoints_.erase(o);
                    }
                    device_qps_.erase(dev);
                    return err;
                }
                epoll_event ev{};
                ev.events = EPOLLIN;
                ev.data.u64 = kEndpointTag | *ip;
                epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ep->fd(), &ev);
                opened.push_back(*ip);
                endpoints_[*ip] = std::move(ep);
            }
        }
    }
    ++count;
    qps_.push_back(qp);
    return 0;
}

void Engine::removeQp(SimQp *qp, SimDevice *dev) {
    std::unique_lock life(lifetime_);
    std::lock_guard lock(map_mutex_);
    if (auto it = route_of_.find(qp); it != route_of_.end()) {
        routes_.erase(it->second);
        route_of_.erase(it);
    }
    std::erase(qps_, qp);
    auto it = device_qps_.find(dev);
    if (it != device_qps_.end() && --it->second == 0) {
        device_qps_.erase(it);
        for (auto e = endpoints_.begin(); e != endpoints_.end();) {
            if (e->second->device() == dev) {
                epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, e->second->fd(), nullptr);
                e = endpoints_.erase(e);
            } else {
                ++e;
            }
        }
    }
}

void Engine::bindQp(SimQp *qp, uint32_t local_ip) {
    std::lock_guard lock(map_mutex_);
    if (auto it = route_of_.find(qp); it != route_of_.end()) {
        routes_.erase(it->second);
    }
    const uint64_t key = routeKey(local_ip, qp->qpn());
    routes_[key] = qp;
    route_of_[qp] = key;
}

void Engine::unbindQp(SimQp *qp) {
    std::lock_guard lock(map_mutex_);
    if (auto it = route_of_.find(qp); it != route_of_.end()) {
        routes_.erase(it->second);
        route_of_.erase(it);
    }
}

void Engine::scheduleAck(SimQp *qp) {
    tl_acks.push_back(qp);
}

void Engine::flushAcks() {
    // ACK coalescing: one ACK per QP for everything this batch brought.
    for (size_t i = 0; i < tl_acks.size(); ++i) {
        tl_acks[i]->flushAck();
    }
    tl_acks.clear();
}

void Engine::wakeFor(int64_t deadline) {
    if (std::this_thread::get_id() == thread_id_) {
        return;  // the engine recomputes its timeout after every iteration
    }
    int64_t cur = next_wake_.load(std::memory_order_relaxed);
    if (cur != 0 && cur <= deadline) {
        return;
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void Engine::watchDevice(SimDevice *dev) {
    std::lock_guard lock(watch_mutex_);
    for (SimDevice *d : watched_) {
        if (d == dev) {
            return;
        }
    }
    watched_.push_back(dev);
    const DeviceInfo info = dev->info();
    for (size_t p = 0; p < info.ports.size(); ++p) {
        const std::string pdir = info.dir + "/ports/" + std::to_string(p + 1);
        const uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MODIFY | IN_CREATE | IN_DELETE;
        for (const std::string &dir : {pdir, pdir + "/gids"}) {
            const int wd = inotify_add_watch(inotify_fd_, dir.c_str(), mask);
            if (wd >= 0) {
                watches_[wd] = Watch{dev, static_cast<uint8_t>(p + 1)};
            }
        }
    }
}

void Engine::flushCounters() {
    std::lock_guard lock(watch_mutex_);
    for (SimDevice *d : watched_) {
        d->flushCounters();
    }
}

void Engine::handleInotify() {
    alignas(inotify_event) char buf[4096];
    std::vector<SimDevice *> changed;
    for (;;) {
        const ssize_t n = read(inotify_fd_, buf, sizeof(buf));
        if (n <= 0) {
            break;
        }
        for (ssize_t off = 0; off < n;) {
            const auto *e = reinterpret_cast<const inotify_event *>(buf + off);
            std::lock_guard lock(watch_mutex_);
            if (auto it = watches_.find(e->wd); it != watches_.end()) {
                if (std::find(changed.begin(), changed.end(), it->second.dev) == changed.end()) {
                    changed.push_back(it->second.dev);
                }
            }
            off += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
        }
    }
    const std::string root = sysfsRoot();
    for (SimDevice *dev : changed) {
        const DeviceInfo old = dev->info();
        auto fresh = loadDeviceInfo(root, dev->name());
        if (!fresh) {
            continue;
        }
        dev->setInfo(*fresh);
        for (size_t p = 0; p < old.ports.size() && p < fresh->ports.size(); ++p) {
            ibv_async_event ev{};
            ev.element.port_num = static_cast<int>(p + 1);
            const bool was_up = old.ports[p].state == IBV_PORT_ACTIVE;
            const bool is_up = fresh->ports[p].state == IBV_PORT_ACTIVE;
            if (was_up != is_up) {
                // The kernel raises these from the netdev's link events (ib_cache / roce_gid_mgmt).
                ev.event_type = is_up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR;
                dev->broadcastEvent(ev);
            }
            bool gids_changed = old.ports[p].gids.size() != fresh->ports[p].gids.size();
            for (size_t i = 0; !gids_changed && i < old.ports[p].gids.size(); ++i) {
                const GidEntry &a = old.ports[p].gids[i];
                const GidEntry &b = fresh->ports[p].gids[i];
                gids_changed = a.valid != b.valid || a.roce_v2 != b.roce_v2 ||
                               std::memcmp(a.gid.raw, b.gid.raw, 16) != 0;
            }
            if (gids_changed) {
                ev.event_type = IBV_EVENT_GID_CHANGE;
                dev->broadcastEvent(ev);
            }
        }
    }
}

void Engine::receiveBatch(Endpoint &ep) {
    RxBuffers &rx = rxBuffers();
    SimDevice *dev = ep.device();
    HwCounters *counters = dev->counters(ep.port());
    for (int round = 0; round < 8; ++round) {
        for (int i = 0; i < kRxBatch; ++i) {
            rx.iov[i] = iovec{rx.data.get() + i * kRxBufferBytes, kRxBufferBytes};
            rx.msgs[i].msg_hdr = msghdr{};
            rx.msgs[i].msg_hdr.msg_iov = &rx.iov[i];
            rx.msgs[i].msg_hdr.msg_iovlen = 1;
            rx.msgs[i].msg_hdr.msg_name = &rx.from[i];
            rx.msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
        }
        const int n = recvmmsg(ep.fd(), rx.msgs, kRxBatch, MSG_DONTWAIT, nullptr);
        if (n <= 0) {
            return;
        }
        const bool port_up = dev->portActive(ep.port());
        for (int i = 0; i < n; ++i) {
            if (!port_up) {
                counters->add(Counter::kSimRxDroppedPortDown);
                continue;
            }
            const size_t len = rx.msgs[i].msg_len;
            if (rx.msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
                counters->add(Counter::kSimRxMalformed);
                continue;
            }
            Ipv4UdpFlow flow;
            flow.src_ip = ntohl(rx.from[i].sin_addr.s_addr);
            flow.dst_ip = ep.ip();
            flow.src_port = ntohs(rx.from[i].sin_port);
            flow.dst_port = 4791;
            Packet pkt;
            const ParseResult r =
                parsePacket(rx.data.get() + i * kRxBufferBytes, len, flow, true, pkt);
            if (r == ParseResult::kBadIcrc) {
                counters->add(Counter::kRxIcrcEncapsulated);
                continue;
            }
            if (r != ParseResult::kOk) {
                counters->add(Counter::kSimRxMalformed);
                continue;
            }
            counters->add(Counter::kSimRxPackets);
            SimQp *qp = nullptr;
            {
                std::lock_guard lock(map_mutex_);
                auto it = routes_.find(routeKey(ep.ip(), pkt.bth.dest_qpn));
                if (it != routes_.end()) {
                    qp = it->second;
                }
            }
            if (qp == nullptr) {
                counters->add(Counter::kSimRxUnknownQp);
                continue;
            }
            qp->receive(pkt, flow.src_ip, flow.src_port);
        }
        if (n < kRxBatch) {
            return;
        }
    }
}

void Engine::runTimers(int64_t now) {
    {
        std::lock_guard lock(map_mutex_);
        timer_snapshot_ = qps_;
    }
    for (SimQp *qp : timer_snapshot_) {
        const int64_t d = qp->deadline();
        if (d != 0 && d <= now) {
            qp->onTimer(now);
        }
    }
}

void Engine::run() {
    // An HCA has its own processors; the engine stands in for them on the host's. Applications
    // that busy-poll (perftest, the sidecar's busy mode) would otherwise keep it off the CPU for
    // a scheduler slice (milliseconds) whenever cores are fewer than spinning threads. A
    // real-time priority lets it run as soon as a packet or timer wakes it; it blocks in
    // epoll_pwait2() when idle, so it cannot starve the host. Without CAP_SYS_NICE (or an
    // RLIMIT_RTPRIO) this fails and the engine runs at normal priority.
    if (const char *rt = getenv("TENSORLANE_SIMHCA_RT");
        rt == nullptr || std::strcmp(rt, "0") != 0) {
        sched_param param{};
        param.sched_priority = 1;
        if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &param) != 0) {
            log(LogLevel::kInfo, "engine runs without real-time priority (no CAP_SYS_NICE)");
        }
    }
    // An HCA also never sleeps between packets. With cores to spare, the engine keeps polling
    // for a short window after each packet or post, so a packet that comes back within it costs
    // no wake-up (a cross-CPU wake-up is most of a small message's latency otherwise). Idle, it
    // sleeps as before.
    const int64_t poll_ns = pollWindowNs();
    if (poll_ns > 0) {
        log(LogLevel::kInfo, "engine polls for %lld us after traffic before it sleeps",
            static_cast<long long>(poll_ns / 1000));
    }
    int64_t poll_until = 0;
    epoll_event events[16];
    while (!stop_.load()) {
        int64_t wake = nowNs() + 1'000'000'000;
        {
            std::lock_guard lock(map_mutex_);
            for (SimQp *qp : qps_) {
                const int64_t d = qp->deadline();
                if (d != 0 && d < wake) {
                    wake = d;
                }
            }
        }
        next_wake_.store(wake, std::memory_order_relaxed);
        const int64_t before = nowNs();
        const int64_t wait = before < poll_until ? 0 : std::max<int64_t>(0, wake - before);
        timespec ts{static_cast<time_t>(wait / 1'000'000'000),
                    static_cast<long>(wait % 1'000'000'000)};
        const int n = epoll_pwait2(epoll_fd_, events, 16, &ts, nullptr);
        next_wake_.store(0, std::memory_order_relaxed);
        std::shared_lock life(lifetime_);
        if (n > 0 && poll_ns > 0) {
            poll_until = nowNs() + poll_ns;  // traffic or a post: the answer comes soon
        }
        for (int i = 0; i < n; ++i) {
            const uint64_t tag = events[i].data.u64;
            if (tag == kWakeTag) {
                uint64_t v;
                [[maybe_unused]] ssize_t r = read(wake_fd_, &v, sizeof(v));
            } else if (tag == kInotifyTag) {
                handleInotify();
            } else {
                Endpoint *ep = nullptr;
                {
                    // SYNC POINT: found under map_mutex_, used under lifetime_ (shared), so it
                    // was fully built before and cannot be freed during the batch.
                    std::lock_guard lock(map_mutex_);
                    auto it = endpoints_.find(static_cast<uint32_t>(tag & 0xffffffffu));
                    if (it != endpoints_.end()) {
                        ep = it->second.get();
                    }
                }
                if (ep != nullptr) {
                    receiveBatch(*ep);
                }
            }
        }
        flushAcks();
        const int64_t now = nowNs();
        runTimers(now);
    }
}

}  // namespace tensorlane::simhca
