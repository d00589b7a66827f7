// The Prometheus endpoint of the real tensorlane-sidecar binary: what it binds, what promtool
// says of its exposition, hostile HTTP clients, and a real Prometheus server scraping two
// nodes on the simulated HCA and answering queries with the numbers the test wrote.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "../cli/cli_run.hpp"
#include "../sidecar/harness.hpp"
#include "http_client.hpp"
#include "tensorlane/tensorlane.hpp"

using namespace tltest;

namespace {

std::string metricsToml(uint16_t port, const std::string &host = "127.0.0.1") {
    return "[metrics]\nlisten = \"" + host + ":" + std::to_string(port) + "\"\n";
}

/// The value of the sample `key` (name{labels} exactly as exposed) in an exposition, or nullopt.
std::optional<double> sampleValue(const std::string &text, const std::string &key) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 &&
            line[key.size()] == ' ') {
            return std::strtod(line.c_str() + key.size() + 1, nullptr);
        }
    }
    return std::nullopt;
}

HttpResponse scrape(uint16_t port) {
    return httpGet("127.0.0.1", port, "/metrics");
}

bool haveProgram(const char *name) {
    return std::system((std::string("command -v ") + name + " >/dev/null 2>&1").c_str()) == 0;
}

/// promtool check metrics on `text`: its exit status and output.
std::pair<int, std::string> promtoolCheck(const std::string &text, const TempDir &dir) {
    const std::string in = dir.file("exposition.txt");
    const std::string out = dir.file("promtool.out");
    writeFile(in, text);
    const int status =
        std::system(("promtool check metrics < '" + in + "' > '" + out + "' 2>&1").c_str());
    std::ifstream f(out);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1,
            std::string(std::istreambuf_iterator<char>(f), {})};
}

/// The TCP ports `pid` listens on, as "a.b.c.d:port" (IPv4) or "[v6]:port" (from /proc/net).
std::set<std::string> listeningSockets(pid_t pid) {
    std::set<std::string> inodes;
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    if (DIR *d = ::opendir(fd_dir.c_str())) {
        while (dirent *e = ::readdir(d)) {
            char target[128] = {};
            const std::string link = fd_dir + "/" + e->d_name;
            if (::readlink(link.c_str(), target, sizeof target - 1) > 0 &&
                std::strncmp(target, "socket:[", 8) == 0) {
                inodes.insert(std::string(target + 8, std::strlen(target + 8) - 1));
            }
        }
        ::closedir(d);
    }
    std::set<std::string> out;
    for (const char *table : {"tcp", "tcp6"}) {
        std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + table);
        std::string line;
        std::getline(in, line);  // header
        while (std::getline(in, line)) {
            std::istringstream f(line);
            std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
            f >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
            if (st != "0A" || inodes.count(inode) == 0) {
                continue;  // not LISTEN, or not this process's
            }
            const size_t colon = local.find(':');
            const unsigned port = std::stoul(local.substr(colon + 1), nullptr, 16);
            if (colon == 8) {
                const uint32_t a = std::stoul(local.substr(0, 8), nullptr, 16);  // host order
                char text[32];
                std::snprintf(text, sizeof text, "%u.%u.%u.%u:%u", a & 255, (a >> 8) & 255,
                              (a >> 16) & 255, a >> 24, port);
                out.insert(text);
            } else {
                out.insert("[" + local.substr(0, colon) + "]:" + std::to_string(port));
            }
        }
    }
    return out;
}

/// Writes `sizes` from `src` into `dst` one after another (each waited for); the bytes
/// written in all. (The client is borrowed: its regions must go before it.)
uint64_t writeAll(tensorlane::Client &client, const tensorlane::Region &src,
                  const tensorlane::Remote &dst, const std::vector<uint64_t> &sizes) {
    uint64_t total = 0;
    uint32_t imm = 0;
    for (uint64_t n : sizes) {
        auto t = client.write(src, 0, dst, 0, n, imm++);
        EXPECT_TRUE(t.ok()) << t.error().detail;
        if (!t.ok()) {
            return total;
        }
        EXPECT_EQ(t->wait(std::chrono::seconds(20)), TL_OK) << tl_last_error();
        total += n;
    }
    return total;
}

const std::vector<uint64_t> kSizes = {64, 4096, 1000, 65536, 1 << 20, 333, 12345, 1 << 18};

// ---- the endpoint of one sidecar ----

TEST(MetricsEndpoint, OffByDefault) {
    Sidecar sc;  // no [metrics], no peers: nothing to listen on over TCP
    ASSERT_TRUE(sc.ready()) << sc.log();
    EXPECT_TRUE(listeningSockets(sc.pid()).empty());
    EXPECT_EQ(sc.log().find("Prometheus"), std::string::npos) << sc.log();
}

TEST(MetricsEndpoint, BindsExactlyTheConfiguredAddress) {
    const uint16_t port = freePort();
    Sidecar sc(SidecarOptions{.extra = metricsToml(port)});
    ASSERT_TRUE(sc.ready()) << sc.log();
    // The one TCP socket it listens on (no peers, so no bootstrap port) is the metrics one.
    EXPECT_EQ(listeningSockets(sc.pid()),
              (std::set<std::string>{"127.0.0.1:" + std::to_string(port)}));
    EXPECT_TRUE(sc.logHas("serving Prometheus metrics on http://127.0.0.1:" + std::to_string(port) +
                          "/metrics"))
        << sc.log();
    EXPECT_EQ(scrape(port).status, 200);
    // Another loopback address of this host reaches nothing there.
    const int fd = tcpConnect("127.0.0.2", port);
    EXPECT_LT(fd, 0) << "127.0.0.2:" << port << " accepted a connection";
    if (fd >= 0) {
        ::close(fd);
    }
}

TEST(MetricsEndpoint, AddressInUseRefusesToStart) {
    // Someone already listens there: the sidecar must refuse to start and say where and why,
    // not run without the metrics it was asked for.
    const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(holder, 1), 0);
    socklen_t len = sizeof a;
    ::getsockname(holder, reinterpret_cast<sockaddr *>(&a), &len);
    const uint16_t port = ntohs(a.sin_port);
    Sidecar sc(SidecarOptions{.extra = metricsToml(port)});
    EXPECT_FALSE(sc.ready());
    EXPECT_FALSE(sc.alive());
    const std::string log = sc.log();
    EXPECT_NE(log.find("cannot serve metrics on 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("[metrics] listen"), std::string::npos) << log;
    ::close(holder);
}

TEST(MetricsEndpoint, AnAddressItCannotServeIsRefusedByCheckConfigAndStart) {
    // --check-config refuses (2) what the start refuses (1), with the same reason.
    struct Case {
        std::string listen;
        std::string reason;
    };
    const std::vector<Case> cases = {
        {"[::1]:9464", "has no IPv6; use an IPv4 address"},
        {"no-such-host.invalid:9464", "cannot resolve 'no-such-host.invalid'"},
        {"192.0.2.1:9464", "cannot bind to 192.0.2.1:9464"},  // TEST-NET-1: not this host's
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.listen);
        Sidecar sc(SidecarOptions{.extra = "[metrics]\nlisten = \"" + c.listen + "\"\n"});
        EXPECT_FALSE(sc.ready());
        EXPECT_NE(sc.log().find(c.reason), std::string::npos) << sc.log();
        const std::string cfg = sc.dir() + "/sidecar.toml";
        const CmdResult check =
            runCmd(std::string(TENSORLANE_SIDECAR_BIN) + " --check-config " + cfg);
        if (c.listen.rfind("192.0.2.1", 0) == 0) {
            EXPECT_EQ(check.rc, 0) << check.out;  // only binding tells; the start refuses it
        } else {
            EXPECT_EQ(check.rc, 2) << check.out;
            EXPECT_NE(check.out.find(c.reason), std::string::npos) << check.out;
        }
    }
}

TEST(MetricsEndpoint, LocalWritesAndPromtool) {
    const uint16_t port = freePort();
    Sidecar sc(SidecarOptions{.extra = metricsToml(port)});
    ASSERT_TRUE(sc.ready()) << sc.log();
    auto c = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(c.ok());
    auto inbox = c->allocHost(1 << 20);
    ASSERT_TRUE(inbox.ok() && inbox->expose("inbox").ok());
    auto src = c->allocHost(1 << 20);
    ASSERT_TRUE(src.ok());
    auto dst = c->lookup("node-a", "inbox");
    ASSERT_TRUE(dst.ok()) << dst.error().detail;
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t total = writeAll(*c, *src, *dst, kSizes);
    const double writing_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // A write wrong on its face (past the end) is refused by the shim in tl_write itself, so
    // the sidecar never sees it: its rejected counter (requests it refused) stays at 0.
    tl_ticket t = 0;
    EXPECT_EQ(tl_write(c->get(), src->id(), 0, dst->id, 1, 1 << 20, 0, &t), TL_EINVAL);

    const HttpResponse r = scrape(port);
    ASSERT_EQ(r.status, 200) << r.headers;
    EXPECT_NE(r.headers.find("Content-Type: text/plain"), std::string::npos) << r.headers;
    const std::string &m = r.body;
    EXPECT_EQ(sampleValue(m, "tensorlane_engine_up"), 1) << m;
    EXPECT_EQ(sampleValue(m, "tensorlane_peer_write_bytes_total{peer=\"node-a\"}"),
              static_cast<double>(total))
        << m;
    EXPECT_EQ(sampleValue(m, "tensorlane_peer_writes_total{peer=\"node-a\"}"),
              static_cast<double>(kSizes.size()));
    EXPECT_EQ(sampleValue(m, "tensorlane_peer_received_bytes_total{peer=\"node-a\"}"),
              static_cast<double>(total));
    EXPECT_EQ(sampleValue(m, "tensorlane_peer_write_latency_seconds_count{peer=\"node-a\"}"),
              static_cast<double>(kSizes.size()));
    // The writes ran one after another, so their engine-side latencies (on the TSC where it
    // is a clock) add up to less than the time the client spent writing them.
    const double latency_sum_s =
        sampleValue(m, "tensorlane_peer_write_latency_seconds_sum{peer=\"node-a\"}").value_or(0);
    EXPECT_GT(latency_sum_s, 0);
    EXPECT_LT(latency_sum_s, writing_s);
    EXPECT_EQ(
        sampleValue(m, "tensorlane_peer_write_errors_total{peer=\"node-a\",status=\"TL_EPEER\"}"),
        0);
    EXPECT_EQ(sampleValue(m, "tensorlane_requests_rejected_total{status=\"TL_EINVAL\"}"), 0);
    EXPECT_EQ(sampleValue(m, "tensorlane_clients"), 1);
    EXPECT_EQ(sampleValue(m, "tensorlane_regions"), 2);
    EXPECT_EQ(sampleValue(m, "tensorlane_registered_bytes"), 2.0 * (1 << 20));
    EXPECT_NE(m.find("tensorlane_info{node=\"node-a\",poll_mode=\"adaptive\""), std::string::npos);
    // No RDMA device on this host's (test) tree: no NIC families, and no peers: no peer state.
    EXPECT_EQ(m.find("tensorlane_rdma_hw_counters_total"), std::string::npos);

    if (!haveProgram("promtool")) {
        GTEST_SKIP() << "promtool is not installed (Debian package prometheus; "
                        "scripts/install-deps.sh installs it)";
    }
    TempDir dir;
    const auto [rc, out] = promtoolCheck(m, dir);
    EXPECT_EQ(rc, 0) << out << "\n" << m;
}

TEST(MetricsEndpoint, HostileHttpClients) {
    const uint16_t port = freePort();
    Sidecar sc(SidecarOptions{.extra = metricsToml(port)});
    ASSERT_TRUE(sc.ready()) << sc.log();
    const std::string host = "127.0.0.1";
    const std::string big(70000, 'a');
    std::string binary(4096, '\0');
    for (size_t i = 0; i < binary.size(); ++i) {
        binary[i] = static_cast<char>(i * 131 + 7);
    }
    const std::vector<std::string> requests = {
        "GARBAGE\r\n\r\n",
        binary,
        "GET /metrics HTTP/1.1\r\nX-Big: " + big + "\r\n\r\n",
        "GET /" + big + " HTTP/1.1\r\n\r\n",
        "GET /../../../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /metrics HTTP/9.9\r\n\r\n",
        "GET /metrics\r\n\r\n",
        "POST /metrics HTTP/1.1\r\nContent-Length: 100000000\r\n\r\nabc",
        "GET /metrics HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzzzz\r\n\r\n",
        "DELETE /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics?" + std::string(5000, '%') + " HTTP/1.1\r\n\r\n",
        "\r\n\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nHost: x\r\n" + std::string(2000, 'H') + ": y\r\n\r\n",
    };
    for (const std::string &req : requests) {
        const HttpResponse r = rawRequest(host, port, req, std::chrono::seconds(8));
        EXPECT_EQ(r.body.find("root:"), std::string::npos);  // no files are served
        EXPECT_TRUE(sc.alive()) << "after " << req.substr(0, 60) << "\n" << sc.log();
    }
    EXPECT_EQ(rawRequest(host, port, "GET /../../../../etc/passwd HTTP/1.1\r\n\r\n").status, 404);
    EXPECT_EQ(rawRequest(host, port, "GET /secret HTTP/1.1\r\n\r\n").status, 404);

    // Clients that ask and hang up without reading the answer: no SIGPIPE may reach the sidecar.
    for (int i = 0; i < 40; ++i) {
        const int fd = tcpConnect(host, port);
        ASSERT_GE(fd, 0);
        const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
        (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
        linger l{1, 0};  // close with a reset
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        ::close(fd);
    }

    // Slow clients hold connections open with half a request (slowloris); the engine does not
    // notice (its data path never waits on the endpoint), and scrapes are answered once
    // civetweb's request timeout frees its workers.
    std::vector<int> slow;
    for (int i = 0; i < 8; ++i) {
        const int fd = tcpConnect(host, port);
        if (fd >= 0) {
            (void)::send(fd, "GET /metrics HTTP/1.1\r\nX: ", 26, MSG_NOSIGNAL);
            slow.push_back(fd);
        }
    }
    {
        auto c = tensorlane::Client::connect(sc.socket());
        ASSERT_TRUE(c.ok());
        auto buf = c->allocHost(4096);
        ASSERT_TRUE(buf.ok() && buf->expose("b").ok());
        auto dst = c->lookup("node-a", "b");
        ASSERT_TRUE(dst.ok());
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 100; ++i) {
            auto t = c->write(*buf, 0, *dst, 0, 64, 0);
            ASSERT_TRUE(t.ok());
            ASSERT_EQ(t->wait(std::chrono::seconds(5)), TL_OK);
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
    }
    const HttpResponse during = httpGet(host, port, "/metrics", std::chrono::seconds(20));
    EXPECT_EQ(during.status, 200);
    for (int fd : slow) {
        ::close(fd);
    }

    // Many scrapes at once.
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
        threads.emplace_back([&] {
            for (int k = 0; k < 5; ++k) {
                const HttpResponse r = scrape(port);
                if (r.status == 200 && sampleValue(r.body, "tensorlane_engine_up") == 1) {
                    ++ok;
                }
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    EXPECT_EQ(ok, 40);
    ASSERT_TRUE(sc.alive()) << sc.log();
    const HttpResponse after = scrape(port);
    EXPECT_EQ(after.status, 200);
    EXPECT_EQ(sampleValue(after.body, "tensorlane_engine_up"), 1);
    EXPECT_EQ(sampleValue(after.body, "tensorlane_peer_write_bytes_total{peer=\"node-a\"}"), 6400);
}

TEST(MetricsEndpoint, SlowHeaderFloodNeitherDelaysAScrapeNorHoldsMoreThanItsShare) {
    // Slow-header clients (half a request line, then nothing) used to hold civetweb's four
    // workers for its 5 s request timeout each, in turn: 16 of them delayed a scrape by 18 s.
    const uint16_t port = freePort();
    Sidecar sc(SidecarOptions{.extra = metricsToml(port)});
    ASSERT_TRUE(sc.ready()) << sc.log();
    // 32 from the scraper's own address, 16 from another loopback address of this host.
    std::vector<int> slow;
    for (int i = 0; i < 48; ++i) {
        const int fd = tcpConnectFrom(i < 32 ? "127.0.0.1" : "127.0.0.2", "127.0.0.1", port);
        ASSERT_GE(fd, 0) << "connection " << i;
        (void)::send(fd, "GET /metr", 9, MSG_NOSIGNAL);
        slow.push_back(fd);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const HttpResponse r = httpGet("127.0.0.1", port, "/metrics", std::chrono::seconds(2));
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(r.status, 200) << "no answer within 2 s behind 48 slow-header connections";
    EXPECT_LT(took, std::chrono::seconds(2));
    EXPECT_EQ(sampleValue(r.body, "tensorlane_engine_up"), 1);
    // Each source keeps at most 8 connections waiting for their request (its oldest go first).
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    size_t open = 0;
    for (int fd : slow) {
        open += closedByPeer(fd) ? 0 : 1;
    }
    EXPECT_LE(open, 16u) << "slow connections held open";
    // None outlives the header timeout (2 s).
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    open = 0;
    for (int fd : slow) {
        open += closedByPeer(fd) ? 0 : 1;
    }
    EXPECT_EQ(open, 0u) << "slow connections outlived the header timeout";
    for (int fd : slow) {
        ::close(fd);
    }
    EXPECT_EQ(scrape(port).status, 200);
    EXPECT_TRUE(sc.alive()) << sc.log();
}

TEST(MetricsEndpoint, StopsPromptlyWithAScrapeInFlight) {
    const uint16_t port = freePort();
    auto sc = std::make_unique<Sidecar>(SidecarOptions{.extra = metricsToml(port)});
    ASSERT_TRUE(sc->ready()) << sc->log();
    std::vector<int> slow;
    for (int i = 0; i < 4; ++i) {
        const int fd = tcpConnect("127.0.0.1", port);
        if (fd >= 0) {
            (void)::send(fd, "GET /metr", 9, MSG_NOSIGNAL);
            slow.push_back(fd);
        }
    }
    const auto t0 = std::chrono::steady_clock::now();
    sc.reset();  // SIGTERM and wait
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
    for (int fd : slow) {
        ::close(fd);
    }
}

// ---- a real Prometheus server ----

/// `prometheus` on loopback with a generated config that scrapes `targets` every second; its
/// data in a temporary directory. Stopped (SIGTERM, then SIGKILL) when destroyed.
class PrometheusServer {
public:
    /// `targets`: {sidecar name, "127.0.0.1:port"}.
    explicit PrometheusServer(const std::vector<std::pair<std::string, std::string>> &targets) {
        port_ = freePort();
        std::string yml =
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: tensorlane\n    static_configs:\n";
        for (const auto &[name, addr] : targets) {
            yml += "      - targets: ['" + addr + "']\n        labels:\n          sidecar: '" +
                   name + "'\n";
        }
        writeFile(dir_.file("prometheus.yml"), yml);
        ::mkdir(dir_.file("data").c_str(), 0755);
        pid_ = ::fork();
        if (pid_ == 0) {
            const int fd =
                ::open(dir_.file("prometheus.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            ::dup2(fd, 1);
            ::dup2(fd, 2);
            const std::string cfg = "--config.file=" + dir_.file("prometheus.yml");
            const std::string data = "--storage.tsdb.path=" + dir_.file("data");
            const std::string web = "--web.listen-address=127.0.0.1:" + std::to_string(port_);
            ::execlp("prometheus", "prometheus", cfg.c_str(), data.c_str(), web.c_str(),
                     "--log.level=warn", static_cast<char *>(nullptr));
            ::_exit(127);
        }
        ready_ =
            eventually(
                [&] { return httpGet("127.0.0.1", port_, "/-/ready").status == 200 || !alive(); },
                std::chrono::seconds(25)) &&
            alive();
    }
    ~PrometheusServer() {
        if (pid_ > 0) {
            ::kill(pid_, SIGTERM);
            if (!eventually([&] { return ::waitpid(pid_, nullptr, WNOHANG) == pid_; },
                            std::chrono::seconds(5))) {
                ::kill(pid_, SIGKILL);
                ::waitpid(pid_, nullptr, 0);
            }
        }
    }
    PrometheusServer(const PrometheusServer &) = delete;
    PrometheusServer &operator=(const PrometheusServer &) = delete;

    bool ready() const { return ready_; }
    bool alive() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }
    std::string log() const {
        std::ifstream in(dir_.file("prometheus.log"));
        return std::string(std::istreambuf_iterator<char>(in), {});
    }

    /// The HTTP API's answer to an instant query: the values of the vector it returns (empty
    /// when it returns none or fails; `*raw` gets the body).
    std::vector<double> query(const std::string &expr, std::string *raw = nullptr) const {
        const HttpResponse r =
            httpGet("127.0.0.1", port_, "/api/v1/query?query=" + urlEncode(expr));
        if (raw != nullptr) {
            *raw = r.body;
        }
        std::vector<double> out;
        const auto j = nlohmann::json::parse(r.body, nullptr, false);
        if (r.status != 200 || !j.is_object() || j.value("status", "") != "success") {
            return out;
        }
        for (const auto &s : j["data"]["result"]) {
            out.push_back(std::stod(s["value"][1].get<std::string>()));
        }
        return out;
    }

    /// Polls `expr` until it returns exactly one value equal to `want` (scrapes are a second
    /// apart); the last answer's body in *raw.
    bool queryEventually(const std::string &expr, double want, std::string *raw) const {
        return eventually(
            [&] {
                const auto v = query(expr, raw);
                return v.size() == 1 && v[0] == want;
            },
            std::chrono::seconds(15));
    }

private:
    TempDir dir_;
    uint16_t port_ = 0;
    pid_t pid_ = -1;
    bool ready_ = false;
};

TEST(MetricsPrometheus, ScrapesTwoVerbsNodesAndAnswersWithTheirNumbers) {
    if (!haveProgram("prometheus")) {
        GTEST_SKIP() << "the prometheus server is not installed (Debian package prometheus; "
                        "scripts/install-deps.sh installs it)";
    }
    // Two nodes over the verbs transport on the simulated HCA (each its own device tree and
    // loopback address, which the simulated HCA's hw_counters live in), both with metrics on.
    TempDir keys;
    const std::string key = keys.file("peer.key");
    writeFile(key, keyText('e'), 0600);
    const uint16_t pa = freePort(), pb = freePort(), ma = freePort(), mb = freePort();
    auto options = [&](const std::string &me, uint16_t listen, const std::string &peer,
                       uint16_t peer_port, uint16_t metrics, int ip) {
        SidecarOptions o;
        o.name = me;
        o.listen = "127.0.0.1:" + std::to_string(listen);
        o.peers = {{peer, "127.0.0.1:" + std::to_string(peer_port)}};
        o.key_file = key;
        o.transport = "verbs";
        o.rdma_ip = uniqueLoopback(ip);
        o.fabric = "qps_per_peer = 2\n";
        o.extra = metricsToml(metrics);
        return o;
    };
    Sidecar a(options("node-a", pa, "node-b", pb, ma, 41));
    Sidecar b(options("node-b", pb, "node-a", pa, mb, 42));
    ASSERT_TRUE(a.treeOk() && b.treeOk());
    ASSERT_TRUE(a.ready()) << a.log();
    ASSERT_TRUE(b.ready()) << b.log();

    auto cb = tensorlane::Client::connect(b.socket());
    ASSERT_TRUE(cb.ok());
    auto inbox = cb->allocHost(1 << 20);
    ASSERT_TRUE(inbox.ok() && inbox->expose("inbox").ok());
    auto ca = tensorlane::Client::connect(a.socket());
    ASSERT_TRUE(ca.ok());
    auto src = ca->allocHost(1 << 20);
    ASSERT_TRUE(src.ok());
    std::optional<tensorlane::Remote> dst;
    ASSERT_TRUE(eventually(
        [&] {
            auto r = ca->lookup("node-b", "inbox");
            if (r.ok()) {
                dst = *r;
            }
            return r.ok();
        },
        std::chrono::seconds(20)))
        << a.log().substr(0, 4000);
    const uint64_t total = writeAll(*ca, *src, *dst, kSizes);
    ASSERT_TRUE(a.logHas(" over verbs (session")) << a.log().substr(0, 4000);

    PrometheusServer prom({{"node-a", "127.0.0.1:" + std::to_string(ma)},
                           {"node-b", "127.0.0.1:" + std::to_string(mb)}});
    ASSERT_TRUE(prom.ready()) << prom.log();
    std::string raw;
    // Both targets up (Prometheus's own view of the scrape).
    EXPECT_TRUE(prom.queryEventually("sum(up{job=\"tensorlane\"})", 2, &raw)) << raw;
    // What node-a wrote to node-b, as node-a counts it and as node-b counts what landed.
    EXPECT_TRUE(prom.queryEventually(
        "tensorlane_peer_write_bytes_total{sidecar=\"node-a\",peer=\"node-b\"}",
        static_cast<double>(total), &raw))
        << raw;
    EXPECT_TRUE(prom.queryEventually(
        "tensorlane_peer_received_bytes_total{sidecar=\"node-b\",peer=\"node-a\"}",
        static_cast<double>(total), &raw))
        << raw;
    EXPECT_TRUE(prom.queryEventually(
        "tensorlane_peer_write_latency_seconds_count{sidecar=\"node-a\",peer=\"node-b\"}",
        static_cast<double>(kSizes.size()), &raw))
        << raw;
    EXPECT_TRUE(prom.queryEventually("sum(tensorlane_peer_write_errors_total{sidecar=\"node-a\"})",
                                     0, &raw))
        << raw;
    // The peer's state, transport and QPs: two RC QPs to node-b in RTS.
    EXPECT_TRUE(prom.queryEventually(
        "tensorlane_peer_state{sidecar=\"node-a\",peer=\"node-b\",state=\"up\"}", 1, &raw))
        << raw;
    EXPECT_TRUE(prom.queryEventually(
        "tensorlane_peer_info{sidecar=\"node-a\",peer=\"node-b\",transport=\"verbs\"}", 1, &raw))
        << raw;
    EXPECT_TRUE(
        prom.queryEventually("tensorlane_peer_qps{sidecar=\"node-a\",peer=\"node-b\","
                             "direction=\"send\",state=\"RTS\"}",
                             2, &raw))
        << raw;
    EXPECT_TRUE(prom.queryEventually("tensorlane_clients{sidecar=\"node-b\"}", 1, &raw)) << raw;
    // The simulated HCA's hw_counters, read through node-b's sysfs root: the RDMA WRITEs it
    // received (one message per work request, so at least one per write).
    EXPECT_TRUE(eventually(
        [&] {
            const auto rx = prom.query(
                "tensorlane_rdma_hw_counters_total{sidecar=\"node-b\","
                "counter=\"rx_write_requests\"}",
                &raw);
            return rx.size() == 1 && rx[0] >= static_cast<double>(kSizes.size());
        },
        std::chrono::seconds(15)))
        << raw;
    EXPECT_TRUE(prom.queryEventually(
        "tensorlane_rdma_port_active{sidecar=\"node-a\",device=\"sim0\",port=\"1\"}", 1, &raw))
        << raw;
    EXPECT_TRUE(a.alive() && b.alive());
}

}  // namespace
