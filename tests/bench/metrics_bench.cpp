// metrics_bench: what the Prometheus endpoint costs, against the same thing without it, in the
// same run (issue 12).
//
//   LocalWrite64/off        64-byte tl_write + tl_wait round trips through a real sidecar
//   LocalWrite64/on         the same with [metrics] listen set (every write timed) and a thread
//                           scraping /metrics every 100 ms meanwhile: p50/p99 (ns)
//   WriteStats/untimed/B    the counting the engine does per write with the endpoint off, in
//                           batches of B writes (items/s: writes)
//   WriteStats/timed/B      ... and on: a WriteClock read per batch at acceptance and at the
//                           turn's end, and a histogram bucket per write (the TSC where usable)
//   WriteStats/timed_steady/B  the same on the steady clock (machines without a usable TSC)
//   WriteClock/tsc|steady   one clock read
//   Received                an arrival's count (the peer found by name)
//   SnapshotHandOver        a scrape's request answered by another thread's serve(): the
//                           hand-over's own cost, not the engine's status document
//   Families/PEERS          buildFamilies + text serialisation of a snapshot with PEERS peers
//                           (the scraping thread's work, not the engine's)
//
// One sidecar at a time, busy polling (as ring_bench). Microbenchmarks need no sidecar.
//
// `metrics_bench --alternate=ROUNDS [--writes=N] [--pin=C,S] [--baseline-sidecar=PATH]` runs
// no Google Benchmark: LocalWrite64 off and on in alternation (each sidecar started once, the
// others stopped while one is measured), ROUNDS rounds of N round trips each (default 5000),
// and prints the p50s and the on/off ratios; --pin=0,1 runs the client on CPU 0 and the
// sidecars on CPU 1; with --baseline-sidecar the same two with that binary too (another build
// of tensorlane-sidecar), in the same rotation.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sched.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.hpp"
#include "metrics/families.hpp"
#include "metrics/snapshot.hpp"
#include "metrics/write_stats.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace sc = tensorlane::sidecar;

/// A TCP port on 127.0.0.1 that was free a moment ago.
uint16_t freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

/// GET /metrics once; the bytes of the answer (0: failed).
size_t scrapeOnce(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    size_t got = 0;
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
        const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
        (void)::send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
        char buf[65536];
        for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
            got += static_cast<size_t>(n);
        }
    }
    if (fd >= 0) {
        ::close(fd);
    }
    return got;
}

/// One busy sidecar (with or without the metrics endpoint, scraped every 100 ms when with),
/// one client, a 64-byte source and an exposed 64-byte target of this node: what one
/// LocalWrite64 measurement needs.
class LocalWrite64Setup {
public:
    /// `binary`: the sidecar to run (empty: the one built with this benchmark). error() says
    /// why it is not usable.
    LocalWrite64Setup(bool metrics, const std::string &binary) : port_(freePort()) {
        try {
            tlbench::SidecarOptions o;
            o.poll_mode = "busy";
            o.binary = binary;
            o.listen = "127.0.0.1:" + std::to_string(freePort());  // several may be up at once
            if (metrics) {
                o.extra = "[metrics]\nlisten = \"127.0.0.1:" + std::to_string(port_) + "\"\n";
            }
            sidecar_ = std::make_unique<tlbench::Sidecar>(o);
        } catch (const std::exception &e) {
            error_ = e.what();
            return;
        }
        if (!check(tl_connect(sidecar_->socket().c_str(), &c_), "tl_connect")) {
            return;
        }
        void *src = nullptr, *dst = nullptr;
        tl_region dst_r = 0;
        if (!check(tl_alloc_host(c_, 4096, &src, &src_), "tl_alloc_host") ||
            !check(tl_alloc_host(c_, 4096, &dst, &dst_r), "tl_alloc_host") ||
            !check(tl_expose(c_, dst_r, "bench-dst"), "tl_expose") ||
            !check(tl_lookup(c_, tl_node_name(c_), "bench-dst", &remote_, nullptr), "tl_lookup")) {
            return;
        }
        if (metrics) {
            scraper_ = std::thread([this] {
                while (!done_.load(std::memory_order_relaxed)) {
                    if (scrapeOnce(port_) > 0) {
                        scrapes_.fetch_add(1, std::memory_order_relaxed);
                    }
                    std::this_thread::sleep_for(std::chrono::milliseconds(100));
                }
            });
        }
    }
    ~LocalWrite64Setup() {
        done_ = true;
        if (scraper_.joinable()) {
            scraper_.join();
        }
        if (c_ != nullptr) {
            tl_disconnect(c_);
        }
    }
    LocalWrite64Setup(const LocalWrite64Setup &) = delete;
    LocalWrite64Setup &operator=(const LocalWrite64Setup &) = delete;

    const std::string &error() const { return error_; }

    /// One round trip (tl_write, tl_wait, the notification), its nanoseconds; -1 on error.
    double roundTrip() {
        const auto t0 = Clock::now();
        tl_ticket t = 0;
        tl_status s = tl_write(c_, src_, 0, remote_, 0, 64, ++imm_, &t);
        if (s == TL_OK) {
            s = tl_wait(c_, t, -1);
        }
        if (s == TL_OK) {
            s = tl_wait_notification(c_, &note_, -1);
        }
        if (!check(s, "tl_write/tl_wait")) {
            return -1;
        }
        return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    }
    uint64_t scrapes() const { return scrapes_.load(); }

    /// Stops the sidecar (SIGSTOP: its busy loop leaves the CPUs to the one being measured)
    /// or lets it go on (SIGCONT).
    void pause() { ::kill(sidecar_->pid(), SIGSTOP); }
    void resume() { ::kill(sidecar_->pid(), SIGCONT); }
    pid_t sidecarPid() const { return sidecar_->pid(); }

private:
    bool check(tl_status s, const char *what) {
        if (s != TL_OK) {
            error_ = std::string(what) + ": " + tl_status_str(s) + ": " + tl_last_error();
            return false;
        }
        return true;
    }

    const uint16_t port_;
    std::string error_;
    std::unique_ptr<tlbench::Sidecar> sidecar_;
    tl_client *c_ = nullptr;
    tl_region src_ = 0;
    tl_remote remote_ = 0;
    tl_notification note_{};
    uint32_t imm_ = 0;
    std::atomic<bool> done_{false};
    std::atomic<uint64_t> scrapes_{0};
    std::thread scraper_;
};

void localWrite64(benchmark::State &state, bool metrics) {
    LocalWrite64Setup setup(metrics, "");
    if (!setup.error().empty()) {
        state.SkipWithError(setup.error().c_str());
        return;
    }
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(state.max_iterations));
    for (auto _ : state) {
        const double ns = setup.roundTrip();
        if (ns < 0) {
            state.SkipWithError(setup.error().c_str());
            break;
        }
        samples.push_back(ns);
    }
    state.counters["p50_ns"] = tlbench::percentile(samples, 0.50);
    state.counters["p99_ns"] = tlbench::percentile(samples, 0.99);
    state.counters["scrapes"] = static_cast<double>(setup.scrapes());
}

void writeStats(benchmark::State &state, bool timed, bool steady) {
    // What the engine adds per write, in batches of `batch` (the requests one drain takes off
    // the rings, the completions one turn ends): the acceptance stamp, then at the end the
    // counters and, timed, the end stamp and the bucket; one clock read per batch and phase.
    // `steady`: the steady clock instead of the TSC (what machines without a usable TSC pay).
    const auto batch = static_cast<size_t>(state.range(0));
    sc::EngineStats stats({"node-a", "node-b", "node-c", "node-d"});
    if (steady) {
        stats.setClock(sc::WriteClock{});
    }
    stats.setTiming(timed);
    std::vector<int64_t> accepted(batch);
    for (auto _ : state) {
        if (stats.timing()) {
            stats.invalidateClock();
        }
        for (size_t i = 0; i < batch; ++i) {
            accepted[i] = stats.timing() ? stats.now() : 0;
        }
        benchmark::DoNotOptimize(accepted.data());
        for (size_t i = 0; i < batch; ++i) {
            stats.writeEndedSince(static_cast<uint32_t>(i & 3), tensorlane::ipc::Code::kOk, 4096,
                                  accepted[i]);
        }
        stats.timeEnded();
    }
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * batch));
    state.SetLabel(stats.timing() ? stats.clock().name() : "untimed");
    benchmark::DoNotOptimize(stats.peers().data());
}

void clockRead(benchmark::State &state, bool tsc) {
    // Where the TSC is not usable (WriteClock::tscUsable), calibrated() is the steady clock:
    // measured all the same (the label says so), so the smoke run passes on any machine.
    const sc::WriteClock c = tsc ? sc::WriteClock::calibrated() : sc::WriteClock{};
    for (auto _ : state) {
        benchmark::DoNotOptimize(c.nowNs());
    }
    state.SetLabel(tsc && !c.usesTsc() ? "no usable TSC here: steady_clock" : c.name());
}

void received(benchmark::State &state) {
    // An arrival's count: local writes name this node, one after another.
    sc::EngineStats stats({"node-a", "node-b", "node-c", "node-d"});
    const std::string name = "node-a";
    for (auto _ : state) {
        stats.received(name, 64);
    }
    benchmark::DoNotOptimize(stats.peers().data());
}

void snapshotHandOver(benchmark::State &state) {
    sc::Status st;
    auto ch = sc::SnapshotChannel::create(&st);
    std::atomic<bool> done{false};
    // The engine's side: serve whenever the eventfd says a request waits.
    std::thread engine([&] {
        while (!done.load(std::memory_order_relaxed)) {
            pollfd p{ch->fd(), POLLIN, 0};
            if (::poll(&p, 1, 10) > 0) {
                ch->serve([] { return sc::Snapshot{}; });
            }
        }
    });
    for (auto _ : state) {
        benchmark::DoNotOptimize(ch->request(std::chrono::seconds(5)));
    }
    done = true;
    engine.join();
}

sc::Snapshot snapshotWith(int peers) {
    sc::Snapshot s;
    s.timing = true;
    s.report.node = "node-0";
    s.report.poll_mode = "busy";
    s.report.uptime_s = 1;
    s.report.regions = 1;
    s.report.registered_bytes = 1;
    std::vector<std::string> names{"node-0"};
    for (int i = 1; i <= peers; ++i) {
        names.push_back("node-" + std::to_string(i));
        sc::PeerReport &p = s.report.peers.emplace_back();
        p.name = names.back();
        p.address = "10.0.0.1:18515";
        p.state = "up";
        p.transport.transport = "verbs";
        p.transport.send_qps = {{1, "RTS"}, {2, "RTS"}};
    }
    sc::EngineStats stats(names);
    stats.setTiming(true);
    for (size_t p = 0; p < names.size(); ++p) {
        for (uint64_t l = 1000; l < 10'000'000'000; l *= 3) {
            stats.writeEnded(static_cast<uint32_t>(p), tensorlane::ipc::Code::kOk, 4096, l);
        }
    }
    for (size_t p = 0; p < names.size(); ++p) {
        sc::PeerSample ps;
        ps.name = names[p];
        ps.stats = stats.peers()[p];
        s.peers.push_back(ps);
    }
    return s;
}

void families(benchmark::State &state) {
    const sc::Snapshot snap = snapshotWith(static_cast<int>(state.range(0)));
    size_t bytes = 0;
    for (auto _ : state) {
        const std::string text =
            prometheus::TextSerializer().Serialize(sc::buildFamilies(&snap, {}));
        bytes = text.size();
        benchmark::DoNotOptimize(text.data());
    }
    state.counters["exposition_bytes"] = static_cast<double>(bytes);
}

/// Runs thread `tid` (0: the calling one) on `cpu` only.
bool pinThread(pid_t tid, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return ::sched_setaffinity(tid, sizeof set, &set) == 0;
}

/// Every thread of process `pid` on `cpu` only.
bool pinProcess(pid_t pid, int cpu) {
    std::error_code ec;
    bool all = true;
    for (const auto &task :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        all = pinThread(static_cast<pid_t>(std::stol(task.path().filename().string())), cpu) && all;
    }
    return all && !ec;
}

/// --alternate: LocalWrite64 off and on (and, with --baseline-sidecar, the same two with
/// another sidecar binary). Every configuration's sidecar is started once and stopped
/// (SIGSTOP) while another one is measured, so only one busy loop runs at a time; a round
/// measures each configuration for `writes` round trips, back to back, in an order that
/// rotates every round, so that the moods of a shared machine (which change over tens of
/// milliseconds and more) hit both sides of a ratio alike. Per round the p50 of each, and the
/// on/off ratio; at the end the medians over the rounds.
int alternate(int rounds, size_t writes, const std::string &baseline, int client_cpu,
              int sidecar_cpu) {
    if (client_cpu >= 0 && !pinThread(0, client_cpu)) {
        std::fprintf(stderr, "cannot pin this thread to CPU %d\n", client_cpu);
        return 1;
    }
    struct Config {
        std::string label;
        bool metrics;
        std::string binary;
        std::unique_ptr<LocalWrite64Setup> setup;
        std::vector<double> p50s;
    };
    std::vector<Config> configs;
    configs.push_back({"off", false, "", nullptr, {}});
    configs.push_back({"on", true, "", nullptr, {}});
    if (!baseline.empty()) {
        configs.push_back({"base-off", false, baseline, nullptr, {}});
        configs.push_back({"base-on", true, baseline, nullptr, {}});
    }
    for (Config &c : configs) {
        c.setup = std::make_unique<LocalWrite64Setup>(c.metrics, c.binary);
        if (!c.setup->error().empty()) {
            std::fprintf(stderr, "%s: %s\n", c.label.c_str(), c.setup->error().c_str());
            return 1;
        }
        if (sidecar_cpu >= 0 && !pinProcess(c.setup->sidecarPid(), sidecar_cpu)) {
            std::fprintf(stderr, "cannot pin the sidecar to CPU %d\n", sidecar_cpu);
            return 1;
        }
        c.setup->pause();
    }
    auto median = [](std::vector<double> v) { return tlbench::percentile(v, 0.5); };
    std::vector<double> ratio, base_ratio;
    std::vector<double> samples;
    samples.reserve(writes);
    std::printf("LocalWrite64 p50 (ns), %zu round trips per measurement, busy sidecars", writes);
    if (client_cpu >= 0) {
        std::printf(", client on CPU %d, sidecars on CPU %d", client_cpu, sidecar_cpu);
    }
    std::printf("\n");
    for (int r = 0; r < rounds; ++r) {
        std::printf("round %3d:", r + 1);
        for (size_t k = 0; k < configs.size(); ++k) {
            Config &c = configs[(k + static_cast<size_t>(r)) % configs.size()];
            c.setup->resume();
            samples.clear();
            for (size_t i = 0; i < writes + writes / 10; ++i) {
                const double ns = c.setup->roundTrip();
                if (ns < 0) {
                    std::fprintf(stderr, "\n%s: %s\n", c.label.c_str(), c.setup->error().c_str());
                    return 1;
                }
                if (i >= writes / 10) {  // the first tenth warms the resumed sidecar up
                    samples.push_back(ns);
                }
            }
            c.setup->pause();
            c.p50s.push_back(tlbench::percentile(samples, 0.5));
            std::printf("  %s %5.0f", c.label.c_str(), c.p50s.back());
        }
        ratio.push_back(configs[1].p50s.back() / configs[0].p50s.back());
        std::printf("  on/off %.3f", ratio.back());
        if (!baseline.empty()) {
            base_ratio.push_back(configs[3].p50s.back() / configs[2].p50s.back());
            std::printf("  base on/off %.3f", base_ratio.back());
        }
        std::printf("\n");
    }
    std::printf("median p50:");
    for (const Config &c : configs) {
        std::printf("  %s %.0f ns", c.label.c_str(), median(c.p50s));
    }
    std::printf("\nmedian on/off ratio: %.3f (ratio of the medians %.3f)\n", median(ratio),
                median(configs[1].p50s) / median(configs[0].p50s));
    if (!baseline.empty()) {
        std::printf("median base on/off ratio: %.3f (ratio of the medians %.3f)\n",
                    median(base_ratio), median(configs[3].p50s) / median(configs[2].p50s));
    }
    std::printf("scrapes of the \"on\" sidecar: %llu\n",
                static_cast<unsigned long long>(configs[1].setup->scrapes()));
    for (Config &c : configs) {
        c.setup->resume();  // SIGTERM must reach a running process at teardown
    }
    return 0;
}

/// Takes "--NAME=VALUE" out of argv (Google Benchmark refuses flags it does not know).
bool takeFlag(int *argc, char **argv, const std::string &name, std::string *value) {
    const std::string prefix = "--" + name + "=";
    for (int i = 1; i < *argc; ++i) {
        if (std::string(argv[i]).rfind(prefix, 0) == 0) {
            *value = argv[i] + prefix.size();
            for (int j = i; j + 1 < *argc; ++j) {
                argv[j] = argv[j + 1];
            }
            --*argc;
            return true;
        }
    }
    return false;
}

}  // namespace

int main(int argc, char **argv) {
    ::signal(SIGPIPE, SIG_IGN);
    std::string rounds, writes = "5000", baseline, pin;
    const bool alt = takeFlag(&argc, argv, "alternate", &rounds);
    takeFlag(&argc, argv, "writes", &writes);
    takeFlag(&argc, argv, "baseline-sidecar", &baseline);
    takeFlag(&argc, argv, "pin", &pin);
    if (alt) {
        int client_cpu = -1, sidecar_cpu = -1;
        if (!pin.empty() && std::sscanf(pin.c_str(), "%d,%d", &client_cpu, &sidecar_cpu) != 2) {
            std::fprintf(stderr, "--pin=CLIENT_CPU,SIDECAR_CPU, e.g. --pin=0,1\n");
            return 2;
        }
        return alternate(std::stoi(rounds), std::stoul(writes), baseline, client_cpu, sidecar_cpu);
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
        return 1;
    }
    benchmark::RegisterBenchmark("LocalWrite64/off",
                                 [](benchmark::State &s) { localWrite64(s, false); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("LocalWrite64/on",
                                 [](benchmark::State &s) { localWrite64(s, true); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("WriteStats/untimed",
                                 [](benchmark::State &s) { writeStats(s, false, false); })
        ->Arg(1)
        ->Arg(32);
    benchmark::RegisterBenchmark("WriteStats/timed",
                                 [](benchmark::State &s) { writeStats(s, true, false); })
        ->Arg(1)
        ->Arg(32);
    benchmark::RegisterBenchmark("WriteStats/timed_steady",
                                 [](benchmark::State &s) { writeStats(s, true, true); })
        ->Arg(1)
        ->Arg(32);
    benchmark::RegisterBenchmark("WriteClock/tsc", [](benchmark::State &s) { clockRead(s, true); });
    benchmark::RegisterBenchmark("WriteClock/steady",
                                 [](benchmark::State &s) { clockRead(s, false); });
    benchmark::RegisterBenchmark("Received", received);
    benchmark::RegisterBenchmark("SnapshotHandOver", snapshotHandOver)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("Families", families)
        ->Arg(8)
        ->Arg(256)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
