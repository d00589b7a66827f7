#include "metrics_server.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../logging.hpp"
#include "families.hpp"
#include "tensorlane/sidecar/metrics.hpp"

namespace tensorlane::sidecar {

namespace {

/// How long a scrape waits for the engine's snapshot. The engine answers within one loop turn
/// (microseconds when busy, at once when asleep); a longer wait means it is stuck, and the
/// scrape then says so (tensorlane_engine_up 0) instead of hanging Prometheus.
constexpr auto kSnapshotTimeout = std::chrono::milliseconds(1000);

/// The numeric address to bind: "127.0.0.1:9464". Names ("localhost") resolve to their first
/// address, so what is bound is exactly one address.
Status numericListen(const config::Endpoint &ep, std::string *out, sockaddr_storage *addr,
                     socklen_t *addr_len) {
    if (ep.host.find(':') != std::string::npos) {
        return {Code::kInvalid, "[metrics] listen = \"" + ep.text() +
                                    "\": the metrics endpoint has no IPv6; use an IPv4 address "
                                    "such as 127.0.0.1 or 0.0.0.0"};
    }
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo *res = nullptr;
    const std::string port = std::to_string(ep.port);
    if (int rc = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
        return {Code::kInvalid, "[metrics] listen = \"" + ep.text() + "\": cannot resolve '" +
                                    ep.host + "': " + ::gai_strerror(rc)};
    }
    char host[NI_MAXHOST];
    int rc =
        ::getnameinfo(res->ai_addr, res->ai_addrlen, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
    const bool v6 = res->ai_family == AF_INET6;
    std::memcpy(addr, res->ai_addr, std::min<size_t>(res->ai_addrlen, sizeof *addr));
    *addr_len = static_cast<socklen_t>(std::min<size_t>(res->ai_addrlen, sizeof *addr));
    ::freeaddrinfo(res);
    if (rc != 0) {
        return {Code::kInvalid, "[metrics] listen = \"" + ep.text() + "\": " + ::gai_strerror(rc)};
    }
    *out = v6 ? "[" + std::string(host) + "]:" + port : std::string(host) + ":" + port;
    return Status::ok();
}

}  // namespace

Status checkMetricsListen(const config::Config &cfg) {
    if (!cfg.metrics.listen) {
        return Status::ok();
    }
    std::string address;
    sockaddr_storage addr{};
    socklen_t len = 0;
    return numericListen(*cfg.metrics.listen, &address, &addr, &len);
}

/// What the endpoint's thread calls for each GET /metrics.
class MetricsCollector final : public prometheus::Collectable {
public:
    MetricsCollector(config::Config cfg, SysfsRoot root, std::shared_ptr<SnapshotChannel> ch)
        : cfg_(std::move(cfg)), root_(std::move(root)), channel_(std::move(ch)) {}

    std::vector<prometheus::MetricFamily> Collect() const override {
        // Nothing may escape into the HTTP loop: a scrape that goes wrong answers with less.
        try {
            const std::shared_ptr<const Snapshot> snap = channel_->request(kSnapshotTimeout);
            return buildFamilies(snap.get(), readNicCounters(cfg_, root_));
        } catch (const std::exception &e) {
            sidecarLogger("metrics")->warn("scrape failed: {}", e.what());
        } catch (...) {
            sidecarLogger("metrics")->warn("scrape failed");
        }
        try {
            return buildFamilies(nullptr, {});
        } catch (...) {
            return {};
        }
    }

private:
    const config::Config cfg_;
    const SysfsRoot root_;
    const std::shared_ptr<SnapshotChannel> channel_;
};

// ----- the HTTP loop

/// One thread, one epoll set: the listening socket, an eventfd to stop, and the connections.
class MetricsServer::Loop {
public:
    Loop(int listen_fd, std::shared_ptr<MetricsCollector> collector)
        : listen_(listen_fd), collector_(std::move(collector)) {}
    ~Loop();

    /// Starts the thread. kInternal with the reason when the epoll set cannot be made.
    Status start();

private:
    enum class Phase { kRequest, kAnswer };
    struct Conn {
        int fd = -1;
        uint32_t source = 0;  ///< the client's IPv4 address
        Phase phase = Phase::kRequest;
        int64_t accepted_ms = 0;
        int64_t deadline_ms = 0;
        std::string in;
        std::string out;
        size_t sent = 0;
    };

    void run();
    void accept(int64_t now);
    /// Reads what `c` sent; answers once its request is whole. False when it is done (closed).
    bool onReadable(Conn &c, int64_t now);
    /// Sends what is left of the answer. False when it is done (closed).
    bool onWritable(Conn &c, int64_t now);
    void answer(Conn &c, int64_t now);
    void close(int fd);
    /// Closes the oldest connection waiting for its request, of `source` (or of any source when
    /// `any`). False when none waits.
    bool closeOldestWaiting(uint32_t source, bool any);
    size_t waitingFrom(uint32_t source) const;
    static int64_t nowMs();

    const int listen_;
    std::shared_ptr<MetricsCollector> collector_;
    int ep_ = -1;
    int stop_ = -1;
    int64_t accept_paused_until_ms_ = 0;  ///< accept failed (EMFILE): listening again then
    std::unordered_map<int, Conn> conns_;
    std::thread thread_;
};

namespace {

constexpr uint64_t kListenToken = ~uint64_t{0};
constexpr uint64_t kStopToken = ~uint64_t{0} - 1;

/// The answer to everything but GET /metrics: a status line and a short text.
std::string errorAnswer(int status, std::string_view reason, std::string_view extra = {}) {
    const std::string body = std::to_string(status) + " " + std::string(reason) + "\n";
    return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) +
           "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n" + std::string(extra) + "Connection: close\r\n\r\n" +
           body;
}

}  // namespace

int64_t MetricsServer::Loop::nowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

Status MetricsServer::Loop::start() {
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    stop_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ep_ < 0 || stop_ < 0) {
        return {Code::kInternal,
                std::string("cannot make the metrics loop: ") + std::strerror(errno)};
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenToken;
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, listen_, &ev);
    ev.data.u64 = kStopToken;
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, stop_, &ev);
    // The thread inherits this thread's signal mask: block every signal while it is made, so
    // SIGTERM and SIGINT always reach the thread that stops the engine.
    sigset_t all, old;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &old);
    thread_ = std::thread([this] { run(); });
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    pthread_setname_np(thread_.native_handle(), "tl-metrics");
    return Status::ok();
}

MetricsServer::Loop::~Loop() {
    if (thread_.joinable()) {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(stop_, &one, sizeof one);
        thread_.join();  // a scrape in flight ends within the snapshot timeout
    }
    for (auto &[fd, c] : conns_) {
        ::close(fd);
    }
    for (int fd : {ep_, stop_, listen_}) {
        if (fd >= 0) {
            ::close(fd);
        }
    }
}

void MetricsServer::Loop::close(int fd) {
    ::epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    conns_.erase(fd);
}

size_t MetricsServer::Loop::waitingFrom(uint32_t source) const {
    size_t n = 0;
    for (const auto &[fd, c] : conns_) {
        n += c.phase == Phase::kRequest && c.source == source ? 1 : 0;
    }
    return n;
}

bool MetricsServer::Loop::closeOldestWaiting(uint32_t source, bool any) {
    const Conn *oldest = nullptr;
    for (const auto &[fd, c] : conns_) {
        if (c.phase == Phase::kRequest && (any || c.source == source) &&
            (oldest == nullptr || c.accepted_ms < oldest->accepted_ms)) {
            oldest = &c;
        }
    }
    if (oldest == nullptr) {
        return false;
    }
    close(oldest->fd);
    return true;
}

void MetricsServer::Loop::accept(int64_t now) {
    for (;;) {
        sockaddr_in peer{};
        socklen_t len = sizeof peer;
        const int fd = ::accept4(listen_, reinterpret_cast<sockaddr *>(&peer), &len,
                                 SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                // EMFILE and the like: the listener stays readable, so it is left alone for
                // 100 ms rather than spun on.
                epoll_event ev{};
                ev.data.u64 = kListenToken;
                ::epoll_ctl(ep_, EPOLL_CTL_MOD, listen_, &ev);
                accept_paused_until_ms_ = now + 100;
            }
            return;
        }
        const uint32_t source = peer.sin_addr.s_addr;
        // Before anyone is closed for room, what has come in is read: a client whose request is
        // already there is answered, not taken for a slow one.
        std::vector<int> waiting;
        for (const auto &[cfd, c] : conns_) {
            if (c.phase == Phase::kRequest) {
                waiting.push_back(cfd);
            }
        }
        if (waitingFrom(source) >= kConnectionsPerSource || conns_.size() >= kMaxConnections) {
            for (int cfd : waiting) {
                auto it = conns_.find(cfd);
                if (it != conns_.end() && !onReadable(it->second, now)) {
                    close(cfd);
                }
            }
        }
        while (waitingFrom(source) >= kConnectionsPerSource && closeOldestWaiting(source, false)) {
        }
        if (conns_.size() >= kMaxConnections && !closeOldestWaiting(0, true)) {
            ::close(fd);  // every connection is taking its answer: no room, none to make
            continue;
        }
        Conn c;
        c.fd = fd;
        c.source = source;
        c.accepted_ms = now;
        c.deadline_ms = now + kHeaderTimeoutMs;
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = static_cast<uint64_t>(fd);
        if (::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) != 0) {
            ::close(fd);
            continue;
        }
        conns_.emplace(fd, std::move(c));
    }
}

bool MetricsServer::Loop::onReadable(Conn &c, int64_t now) {
    if (c.phase != Phase::kRequest) {
        return true;  // the rest of what it sends is not read: one request per connection
    }
    char buf[4096];
    for (;;) {
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) {
            c.in.append(buf, static_cast<size_t>(n));
            if (c.in.find("\r\n\r\n") != std::string::npos || c.in.size() >= kMaxRequestBytes) {
                answer(c, now);
                return onWritable(c, now);
            }
            continue;
        }
        if (n == 0) {
            return false;  // it went before its request was whole
        }
        if (errno == EINTR) {
            continue;
        }
        return errno == EAGAIN || errno == EWOULDBLOCK;
    }
}

void MetricsServer::Loop::answer(Conn &c, int64_t now) {
    c.phase = Phase::kAnswer;
    c.deadline_ms = now + kSendTimeoutMs;
    const size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) {
        c.out = errorAnswer(431, "Request Header Fields Too Large");
        return;
    }
    // The request line: METHOD SP TARGET SP HTTP/1.x
    const std::string_view head(c.in.data(), end);
    const std::string_view line = head.substr(0, head.find("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
        line.find(' ', sp2 + 1) != std::string_view::npos) {
        c.out = errorAnswer(400, "Bad Request");
        return;
    }
    const std::string_view method = line.substr(0, sp1);
    const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string_view version = line.substr(sp2 + 1);
    if (version != "HTTP/1.1" && version != "HTTP/1.0") {
        c.out = errorAnswer(505, "HTTP Version Not Supported");
        return;
    }
    const bool head_only = method == "HEAD";
    if (method != "GET" && !head_only) {
        c.out = errorAnswer(405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
        return;
    }
    if (target.substr(0, target.find('?')) != "/metrics") {
        c.out = errorAnswer(404, "Not Found");
        return;
    }
    std::string body;
    try {
        body = prometheus::TextSerializer().Serialize(collector_->Collect());
    } catch (const std::exception &e) {
        sidecarLogger("metrics")->warn("scrape failed: {}", e.what());
        c.out = errorAnswer(500, "Internal Server Error");
        return;
    }
    c.out =
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    if (!head_only) {
        c.out += body;
    }
}

bool MetricsServer::Loop::onWritable(Conn &c, int64_t now) {
    (void)now;
    while (c.sent < c.out.size()) {
        const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) {
            c.sent += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            epoll_event ev{};
            ev.events = EPOLLOUT;
            ev.data.u64 = static_cast<uint64_t>(c.fd);
            ::epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev);
            return true;
        }
        return false;  // reset, or gone
    }
    ::shutdown(c.fd, SHUT_WR);
    return false;  // all of it went: closed (one request per connection)
}

void MetricsServer::Loop::run() {
    epoll_event evs[64];
    for (;;) {
        int64_t now = nowMs();
        int64_t next = now + 1000;
        for (const auto &[fd, c] : conns_) {
            next = std::min(next, c.deadline_ms);
        }
        if (accept_paused_until_ms_ != 0) {
            if (now >= accept_paused_until_ms_) {
                epoll_event ev{};
                ev.events = EPOLLIN;
                ev.data.u64 = kListenToken;
                ::epoll_ctl(ep_, EPOLL_CTL_MOD, listen_, &ev);
                accept_paused_until_ms_ = 0;
            } else {
                next = std::min(next, accept_paused_until_ms_);
            }
        }
        const int n =
            ::epoll_wait(ep_, evs, 64, static_cast<int>(std::max<int64_t>(0, next - now)));
        now = nowMs();
        for (int i = 0; i < n; ++i) {
            const uint64_t token = evs[i].data.u64;
            if (token == kStopToken) {
                return;
            }
            if (token == kListenToken) {
                accept(now);
                continue;
            }
            const int fd = static_cast<int>(token);
            auto it = conns_.find(fd);
            if (it == conns_.end()) {
                continue;  // closed for room earlier in this batch
            }
            Conn &c = it->second;
            bool open = true;
            if ((evs[i].events & (EPOLLERR | EPOLLHUP)) != 0) {
                open = false;
            } else if (c.phase == Phase::kRequest) {
                open = onReadable(c, now);
            } else if ((evs[i].events & EPOLLOUT) != 0) {
                open = onWritable(c, now);
            }
            if (!open) {
                close(fd);
            }
        }
        // Deadlines: a request not whole, or an answer not taken, in time.
        std::vector<int> late;
        for (const auto &[fd, c] : conns_) {
            if (now >= c.deadline_ms) {
                late.push_back(fd);
            }
        }
        for (int fd : late) {
            close(fd);
        }
    }
}

// ----- MetricsServer

std::unique_ptr<MetricsServer> MetricsServer::start(const config::Config &cfg, SysfsRoot root,
                                                    std::shared_ptr<SnapshotChannel> channel,
                                                    Status *error) {
    if (!cfg.metrics.listen) {
        *error = {Code::kInvalid, "[metrics] listen is not set"};
        return nullptr;
    }
    std::unique_ptr<MetricsServer> s(new MetricsServer());
    sockaddr_storage addr{};
    socklen_t addr_len = 0;
    if (Status st = numericListen(*cfg.metrics.listen, &s->address_, &addr, &addr_len);
        !st.isOk()) {
        *error = st;
        return nullptr;
    }
    const auto refuse = [&](const std::string &why) {
        *error = {Code::kInternal,
                  "cannot serve metrics on " + s->address_ + " ([metrics] listen): " + why};
    };
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        refuse(std::string("socket: ") + std::strerror(errno));
        return nullptr;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<const sockaddr *>(&addr), addr_len) != 0) {
        const int e = errno;
        ::close(fd);
        refuse("cannot bind to " + s->address_ + ": " + std::strerror(e));
        return nullptr;
    }
    if (::listen(fd, 128) != 0) {
        const int e = errno;
        ::close(fd);
        refuse(std::string("listen: ") + std::strerror(e));
        return nullptr;
    }
    s->collector_ = std::make_shared<MetricsCollector>(cfg, std::move(root), std::move(channel));
    s->loop_ = std::make_unique<Loop>(fd, s->collector_);
    if (Status st = s->loop_->start(); !st.isOk()) {
        refuse(st.message());
        return nullptr;
    }
    return s;
}

MetricsServer::~MetricsServer() = default;

}  // namespace tensorlane::sidecar
