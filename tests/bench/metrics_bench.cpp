// metrics_bench: what the Prometheus endpoint costs, against the same thing without it, in the
// same run (issue 12).
//
//   LocalWrite64/off        64-byte tl_write + tl_wait round trips through a real sidecar
//   LocalWrite64/on         the same with [metrics] listen set (every write timed) and a thread
//                           scraping /metrics every 100 ms meanwhile: p50/p99 (ns)
//   WriteStats/untimed/B    the counting the engine does per write with the endpoint off, in
//                           batches of B writes (items/s: writes)
//   WriteStats/timed/B      ... and on: a steady-clock read per batch at acceptance and at
//                           completion, and a histogram bucket per write
//   SnapshotHandOver        a scrape's request answered by another thread's serve(): the
//                           hand-over's own cost, not the engine's status document
//   Families/PEERS          buildFamilies + text serialisation of a snapshot with PEERS peers
//                           (the scraping thread's work, not the engine's)
//
// One sidecar at a time, busy polling (as ring_bench). Microbenchmarks need no sidecar.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <thread>

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

bool ok(benchmark::State &state, tl_status s, const char *what) {
    if (s != TL_OK) {
        state.SkipWithError(
            (std::string(what) + ": " + tl_status_str(s) + ": " + tl_last_error()).c_str());
        return false;
    }
    return true;
}

void localWrite64(benchmark::State &state, bool metrics) {
    std::unique_ptr<tlbench::Sidecar> sidecar;
    const uint16_t port = freePort();
    try {
        tlbench::SidecarOptions o;
        o.poll_mode = "busy";
        if (metrics) {
            o.extra = "[metrics]\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\n";
        }
        sidecar = std::make_unique<tlbench::Sidecar>(o);
    } catch (const std::exception &e) {
        state.SkipWithError(e.what());
        return;
    }
    tl_client *c = nullptr;
    if (!ok(state, tl_connect(sidecar->socket().c_str(), &c), "tl_connect")) {
        return;
    }
    std::unique_ptr<tl_client, void (*)(tl_client *)> guard(c, tl_disconnect);
    void *src = nullptr, *dst = nullptr;
    tl_region src_r = 0, dst_r = 0;
    tl_remote remote = 0;
    if (!ok(state, tl_alloc_host(c, 4096, &src, &src_r), "tl_alloc_host") ||
        !ok(state, tl_alloc_host(c, 4096, &dst, &dst_r), "tl_alloc_host") ||
        !ok(state, tl_expose(c, dst_r, "bench-dst"), "tl_expose") ||
        !ok(state, tl_lookup(c, tl_node_name(c), "bench-dst", &remote, nullptr), "tl_lookup")) {
        return;
    }
    std::atomic<bool> done{false};
    std::atomic<uint64_t> scrapes{0};
    std::thread scraper;
    if (metrics) {
        scraper = std::thread([&] {
            while (!done.load(std::memory_order_relaxed)) {
                if (scrapeOnce(port) > 0) {
                    scrapes.fetch_add(1, std::memory_order_relaxed);
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
        });
    }
    tl_notification note{};
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(state.max_iterations));
    uint32_t imm = 0;
    for (auto _ : state) {
        const auto t0 = Clock::now();
        tl_ticket t = 0;
        tl_status s = tl_write(c, src_r, 0, remote, 0, 64, ++imm, &t);
        if (s == TL_OK) {
            s = tl_wait(c, t, -1);
        }
        if (s == TL_OK) {
            s = tl_wait_notification(c, &note, -1);
        }
        if (!ok(state, s, "tl_write/tl_wait")) {
            break;
        }
        samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
    }
    done = true;
    if (scraper.joinable()) {
        scraper.join();
    }
    state.counters["p50_ns"] = tlbench::percentile(samples, 0.50);
    state.counters["p99_ns"] = tlbench::percentile(samples, 0.99);
    state.counters["scrapes"] = static_cast<double>(scrapes.load());
}

void writeStats(benchmark::State &state, bool timed) {
    // What the engine adds per write, in batches of `batch` (the requests one drain takes off
    // the rings, the completions one progress call reports): the acceptance stamp, then at the
    // end the counters and, timed, the bucket; with timing, one clock read per batch and phase.
    const auto batch = static_cast<size_t>(state.range(0));
    sc::EngineStats stats({"node-a", "node-b", "node-c", "node-d"});
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
        if (stats.timing()) {
            stats.invalidateClock();
        }
        for (size_t i = 0; i < batch; ++i) {
            stats.writeEnded(
                static_cast<uint32_t>(i & 3), tensorlane::ipc::Code::kOk, 4096,
                accepted[i] != 0 ? static_cast<uint64_t>(stats.now() - accepted[i]) : 0);
        }
    }
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * batch));
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
    std::string doc =
        R"({"node":"node-0","poll_mode":"busy","uptime_s":1,"clients":[],"regions":1,)"
        R"("registered_bytes":1,"limits":{},"counters":{},"peers":[)";
    std::vector<std::string> names{"node-0"};
    for (int i = 1; i <= peers; ++i) {
        names.push_back("node-" + std::to_string(i));
        doc += std::string(i > 1 ? "," : "") + R"({"name":"node-)" + std::to_string(i) +
               R"(","address":"10.0.0.1:18515","state":"up","transport":"verbs",)"
               R"("send":{"qps":[{"state":"RTS"},{"state":"RTS"}]},"receive":{"qps":[]}})";
    }
    s.status_json = doc + "]}";
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

}  // namespace

int main(int argc, char **argv) {
    ::signal(SIGPIPE, SIG_IGN);
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
                                 [](benchmark::State &s) { writeStats(s, false); })
        ->Arg(1)
        ->Arg(32);
    benchmark::RegisterBenchmark("WriteStats/timed",
                                 [](benchmark::State &s) { writeStats(s, true); })
        ->Arg(1)
        ->Arg(32);
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
