#include "metrics_server.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <CivetServer.h>
#include <civetweb.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
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

/// civetweb's worker threads: scrapes served at once. Prometheus scrapes one at a time; the
/// rest are for a person with curl and a slow or hostile client.
constexpr const char *kThreads = "4";
/// A connection that sends no complete request in this time is closed (slow clients cannot
/// hold the workers); also bounds a write to a client that does not read.
constexpr const char *kRequestTimeoutMs = "5000";

/// What civetweb says while starting (why a bind failed), caught on the starting thread.
thread_local std::string *t_start_log = nullptr;

int onCivetLog(const struct mg_connection *, const char *message) {
    if (t_start_log != nullptr) {
        if (!t_start_log->empty()) {
            *t_start_log += "; ";
        }
        *t_start_log += message;
    } else {
        // Per-connection complaints (a hostile client) at debug only: a client must not be
        // able to fill the log.
        sidecarLogger("metrics")->debug("civetweb: {}", message);
    }
    return 1;  // handled: civetweb prints nothing to stderr itself
}

/// The numeric address civetweb binds to: "127.0.0.1:9464", "[::1]:9464". Names ("localhost")
/// resolve to their first address, so what is bound is exactly one address.
Status numericListen(const config::Endpoint &ep, std::string *out, sockaddr_storage *addr,
                     socklen_t *addr_len) {
    // Debian's libcivetweb1 is built without IPv6 (mg_check_feature(8) is 0): say so rather
    // than pass on civetweb's "invalid port spec".
    const bool civet_v6 = mg_check_feature(8) != 0;
    if (!civet_v6 && ep.host.find(':') != std::string::npos) {
        return {Code::kInvalid, "[metrics] listen = \"" + ep.text() +
                                    "\": this build's HTTP server (civetweb) has no IPv6; use an "
                                    "IPv4 address such as 127.0.0.1 or 0.0.0.0"};
    }
    addrinfo hints{};
    hints.ai_family = civet_v6 ? AF_UNSPEC : AF_INET;
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
    // A wildcard address is reached through loopback.
    if (!v6) {
        auto *a4 = reinterpret_cast<sockaddr_in *>(addr);
        if (a4->sin_addr.s_addr == htonl(INADDR_ANY)) {
            a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        }
    } else {
        auto *a6 = reinterpret_cast<sockaddr_in6 *>(addr);
        if (IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr)) {
            a6->sin6_addr = in6addr_loopback;
        }
    }
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

/// What the exposer calls for each GET /metrics, on one of civetweb's threads.
class MetricsCollector final : public prometheus::Collectable {
public:
    MetricsCollector(config::Config cfg, SysfsRoot root, std::shared_ptr<SnapshotChannel> ch)
        : cfg_(std::move(cfg)), root_(std::move(root)), channel_(std::move(ch)) {}

    std::vector<prometheus::MetricFamily> Collect() const override {
        // Nothing may escape into civetweb: a scrape that goes wrong answers with less.
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

std::unique_ptr<MetricsServer> MetricsServer::start(const config::Config &cfg, SysfsRoot root,
                                                    std::shared_ptr<SnapshotChannel> channel,
                                                    Status *error) {
    if (!cfg.metrics.listen) {
        *error = {Code::kInvalid, "[metrics] listen is not set"};
        return nullptr;
    }
    std::unique_ptr<MetricsServer> s(new MetricsServer());
    if (Status st = numericListen(*cfg.metrics.listen, &s->address_, &s->wake_addr_, &s->wake_len_);
        !st.isOk()) {
        *error = st;
        return nullptr;
    }
    s->collector_ = std::make_shared<MetricsCollector>(cfg, std::move(root), std::move(channel));

    CivetCallbacks callbacks;
    callbacks.log_message = onCivetLog;
    // No document_root: civetweb serves no files, only the handler below (anything else is a
    // 404). Keep-alive stays off (civetweb's default): one request per connection.
    std::vector<std::string> options = {"listening_ports", s->address_,          "num_threads",
                                        kThreads,          "request_timeout_ms", kRequestTimeoutMs};
    // civetweb's threads inherit this thread's signal mask: block every signal while they are
    // made, so SIGTERM and SIGINT always reach the thread that stops the engine.
    sigset_t all, old;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &old);
    std::string start_log;
    t_start_log = &start_log;
    try {
        s->exposer_ = std::make_unique<prometheus::Exposer>(options, &callbacks);
    } catch (const std::exception &e) {
        t_start_log = nullptr;
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
        *error = {Code::kInternal, "cannot serve metrics on " + s->address_ +
                                       " ([metrics] listen): " +
                                       (start_log.empty() ? std::string(e.what()) : start_log)};
        return nullptr;
    }
    t_start_log = nullptr;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    s->exposer_->RegisterCollectable(s->collector_, "/metrics");
    return s;
}

MetricsServer::~MetricsServer() {
    if (!exposer_) {
        return;  // never started (a failed start): nothing to stop, nobody to wake
    }
    // civetweb's accept loop sees its stop flag only when poll() returns, which it does every
    // 2 s (SOCKET_TIMEOUT_QUANTUM in civetweb 1.15) or on a new connection: connect to our own
    // listener while the exposer stops, so a sidecar stops in milliseconds, not seconds.
    std::atomic<bool> stopped{false};
    std::thread waker([&] {
        while (!stopped.load(std::memory_order_acquire)) {
            const int fd = ::socket(wake_addr_.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0) {
                (void)::connect(fd, reinterpret_cast<const sockaddr *>(&wake_addr_), wake_len_);
                ::close(fd);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    });
    exposer_.reset();  // joins civetweb's threads before the collector goes
    stopped.store(true, std::memory_order_release);
    waker.join();
}

}  // namespace tensorlane::sidecar
