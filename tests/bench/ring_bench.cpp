// ring_bench: the single-node data path against its baselines, in the same run (issue 3).
//
//   RingNop                 tl_nop + tl_wait round trip through a real sidecar, both sides
//                           busy-polling: p50/p99 (ns) and ops/s
//   SeqpacketPingPong       the baseline: 64 bytes (one request entry) ping-pong over a
//                           SOCK_SEQPACKET pair to a forked, busy-polling echo process
//   RingRaw                 the floor: the same rings (ipc/spsc_ring.hpp) in a shared mapping,
//                           a no-op echoed by a forked process, no sidecar and no shim
//   RingNopBatch/N          N no-ops per tl_nop_batch, two batches in flight: ops/s
//   Memcpy/SIZE             the baseline: memcpy between two pre-faulted buffers
//   LocalWrite/MODE/SIZE    tl_write with two writes in flight (wait for the previous one) from one
//                           host region into another (exposed by
//                           the same client, found with tl_lookup of this node): bytes/s
//
// At most one sidecar runs at a time (a busy-polling one takes a whole core of the two this
// was written on); baselines run with no sidecar at all. scripts/bench.sh turns the JSON
// output into ratios.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>

#include "bench_support.hpp"
#include "tensorlane/ipc/layout.hpp"

namespace {

using Clock = std::chrono::steady_clock;

/// Keeps at most one sidecar process alive, in the poll mode the next benchmark asks for.
class Sidecars {
public:
    tlbench::Sidecar &get(const std::string &mode) {
        if (!current_ || current_->options().poll_mode != mode) {
            current_.reset();
            tlbench::SidecarOptions o;
            o.poll_mode = mode;
            current_ = std::make_unique<tlbench::Sidecar>(o);
        }
        return *current_;
    }
    void stopAll() { current_.reset(); }

private:
    std::unique_ptr<tlbench::Sidecar> current_;
};

Sidecars g_sidecars;

/// One shim connection, closed at scope exit.
class Client {
public:
    ~Client() { tl_disconnect(c_); }
    bool connect(benchmark::State &state, const std::string &mode) {
        try {
            const std::string &path = g_sidecars.get(mode).socket();
            if (tl_connect(path.c_str(), &c_) != TL_OK) {
                state.SkipWithError((std::string("tl_connect: ") + tl_last_error()).c_str());
                return false;
            }
        } catch (const std::exception &e) {
            state.SkipWithError(e.what());
            return false;
        }
        return true;
    }
    tl_client *get() const { return c_; }

private:
    tl_client *c_ = nullptr;
};

/// Reports a failed call and tells the caller to stop.
bool ok(benchmark::State &state, tl_status s, const char *what) {
    if (s == TL_OK) {
        return true;
    }
    std::string msg = std::string(what) + ": " + tl_status_str(s) + ": " + tl_last_error();
    state.SkipWithError(msg.c_str());
    return false;
}

double ns(Clock::duration d) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

void reportLatency(benchmark::State &state, std::vector<double> &samples) {
    state.counters["p50_ns"] = tlbench::percentile(samples, 0.50);
    state.counters["p99_ns"] = tlbench::percentile(samples, 0.99);
    state.counters["ops_per_s"] =
        benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

/// Bytes/s of the median sample (`samples` in ns per copy of `bytes`): robust against the
/// preemptions of a shared machine, where the mean (bytes_per_second) is not.
void reportBandwidthP50(benchmark::State &state, std::vector<double> &samples, size_t bytes) {
    if (double p50 = tlbench::percentile(samples, 0.5); p50 > 0) {
        state.counters["bytes_per_s_p50"] = static_cast<double>(bytes) * 1e9 / p50;
    }
}

/// Warms up with 10,000 round trips, then times one per benchmark iteration; a failed round
/// trip (the forked echo process died) ends the benchmark with an error.
template <class RoundTrip>
std::vector<double> timeRoundTrips(benchmark::State &state, RoundTrip &roundTrip) {
    std::vector<double> samples;
    for (int i = 0; i < 10000; ++i) {
        if (!roundTrip()) {
            state.SkipWithError("echo process failed");
            return samples;
        }
    }
    samples.reserve(static_cast<size_t>(state.max_iterations));
    for (auto _ : state) {
        auto t0 = Clock::now();
        if (!roundTrip()) {
            state.SkipWithError("echo process failed");
            break;
        }
        samples.push_back(ns(Clock::now() - t0));
    }
    return samples;
}

// ---- ring round trip ----

void ringNop(benchmark::State &state) {
    Client c;
    if (!c.connect(state, "busy")) {
        return;
    }
    tl_ticket t = 0;
    for (int i = 0; i < 10000; ++i) {  // warm caches, tables and the sidecar's loop
        if (!ok(state, tl_nop(c.get(), &t), "tl_nop") ||
            !ok(state, tl_wait(c.get(), t, -1), "tl_wait")) {
            return;
        }
    }
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(state.max_iterations));
    for (auto _ : state) {
        auto t0 = Clock::now();
        tl_status s = tl_nop(c.get(), &t);
        if (s == TL_OK) {
            s = tl_wait(c.get(), t, -1);
        }
        auto t1 = Clock::now();
        if (s != TL_OK) {
            ok(state, s, "tl_nop/tl_wait");
            break;
        }
        samples.push_back(ns(t1 - t0));
    }
    reportLatency(state, samples);
}

/// The baseline: 64-byte messages over SOCK_SEQPACKET to a forked echo process; both sides
/// spin on recv(MSG_DONTWAIT).
void seqpacketPingPong(benchmark::State &state) {
    g_sidecars.stopAll();
    constexpr size_t kBytes = 64;  // sizeof(ipc::Request)
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        state.SkipWithError(std::strerror(errno));
        return;
    }
    const pid_t child = tlbench::forkTied();
    if (child < 0) {
        state.SkipWithError(std::strerror(errno));
        ::close(sv[0]);
        ::close(sv[1]);
        return;
    }
    if (child == 0) {
        ::close(sv[0]);
        char buf[kBytes];
        for (;;) {
            ssize_t n = ::recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT);
            if (n > 0) {
                if (::send(sv[1], buf, static_cast<size_t>(n), 0) != n) {
                    ::_exit(2);
                }
            } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                ::_exit(0);  // the benchmark closed its end
            }
        }
    }
    ::close(sv[1]);
    char msg[kBytes] = {1};
    char back[kBytes];
    auto roundTrip = [&]() -> bool {
        if (::send(sv[0], msg, kBytes, 0) != static_cast<ssize_t>(kBytes)) {
            return false;
        }
        for (;;) {
            ssize_t n = ::recv(sv[0], back, kBytes, MSG_DONTWAIT);
            if (n == static_cast<ssize_t>(kBytes)) {
                return true;
            }
            if (n >= 0 || (errno != EAGAIN && errno != EINTR)) {
                return false;
            }
        }
    };
    std::vector<double> samples = timeRoundTrips(state, roundTrip);
    ::close(sv[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    reportLatency(state, samples);
}

/// Batches of no-ops, pipelined two deep like a perftest window: submit batch k+1 with one
/// tl_nop_batch call (one doorbell), then wait for every ticket of batch k, so the client's
/// waiting overlaps the sidecar's work.
void ringNopBatch(benchmark::State &state) {
    const auto batch = static_cast<size_t>(state.range(0));
    Client c;
    if (!c.connect(state, "busy")) {
        return;
    }
    std::vector<tl_ticket> tickets[2] = {std::vector<tl_ticket>(batch),
                                         std::vector<tl_ticket>(batch)};
    size_t cur = 0;
    if (tl_nop_batch(c.get(), batch, tickets[cur].data(), nullptr) != TL_OK) {
        state.SkipWithError("tl_nop_batch failed");
        return;
    }
    auto once = [&]() -> tl_status {
        if (tl_status s = tl_nop_batch(c.get(), batch, tickets[cur ^ 1].data(), nullptr)) {
            return s;
        }
        for (size_t i = 0; i < batch; ++i) {
            if (tl_status s = tl_wait(c.get(), tickets[cur][i], -1)) {
                return s;
            }
        }
        cur ^= 1;
        return TL_OK;
    };
    for (int i = 0; i < 100; ++i) {
        if (!ok(state, once(), "batch warm-up")) {
            return;
        }
    }
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(state.max_iterations));
    for (auto _ : state) {
        auto t0 = Clock::now();
        if (!ok(state, once(), "batch")) {
            break;
        }
        samples.push_back(ns(Clock::now() - t0));
    }
    const auto ops = static_cast<double>(state.iterations()) * static_cast<double>(batch);
    state.SetItemsProcessed(static_cast<int64_t>(ops));
    state.counters["ops_per_s"] = benchmark::Counter(ops, benchmark::Counter::kIsRate);
    // The rate of the median batch: what the path sustains when neither side is preempted (a
    // shared two-core machine preempts one of two spinning processes often).
    if (double p50 = tlbench::percentile(samples, 0.5); p50 > 0) {
        state.counters["ops_per_s_p50"] = static_cast<double>(batch) * 1e9 / p50;
    }
}

// ---- host-to-host bandwidth ----

/// Anonymous memory, written once so every page is faulted in before timing.
class Buffer {
public:
    explicit Buffer(size_t bytes) : bytes_(bytes) {
        p_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p_ == MAP_FAILED) {
            p_ = nullptr;
            return;
        }
        std::memset(p_, 0x5a, bytes);
    }
    ~Buffer() {
        if (p_) {
            ::munmap(p_, bytes_);
        }
    }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    void *data() const { return p_; }

private:
    void *p_ = nullptr;
    size_t bytes_;
};

void memcpyBaseline(benchmark::State &state) {
    g_sidecars.stopAll();
    const auto bytes = static_cast<size_t>(state.range(0));
    Buffer src(bytes), dst(bytes);
    if (!src.data() || !dst.data()) {
        state.SkipWithError("mmap failed");
        return;
    }
    // Small copies are timed in groups, so reading the clock does not weigh on the sample.
    const size_t group = std::max<size_t>(1, (size_t{256} << 10) / bytes);
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(state.max_iterations));
    for (auto _ : state) {
        auto t0 = Clock::now();
        for (size_t i = 0; i < group; ++i) {
            std::memcpy(dst.data(), src.data(), bytes);
            benchmark::DoNotOptimize(dst.data());
            benchmark::ClobberMemory();
        }
        samples.push_back(ns(Clock::now() - t0) / static_cast<double>(group));
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * group * bytes));
    reportBandwidthP50(state, samples, bytes);
}

void localWrite(benchmark::State &state, const std::string &mode) {
    const auto bytes = static_cast<size_t>(state.range(0));
    Client c;
    if (!c.connect(state, mode)) {
        return;
    }
    void *src = nullptr, *dst = nullptr;
    tl_region src_r = 0, dst_r = 0;
    if (!ok(state, tl_alloc_host(c.get(), bytes, &src, &src_r), "tl_alloc_host") ||
        !ok(state, tl_alloc_host(c.get(), bytes, &dst, &dst_r), "tl_alloc_host")) {
        return;
    }
    std::memset(src, 0x5a, bytes);  // fault every page in on our side
    std::memset(dst, 0, bytes);
    if (!ok(state, tl_expose(c.get(), dst_r, "bench-dst"), "tl_expose")) {
        return;
    }
    tl_remote remote = 0;
    if (!ok(state, tl_lookup(c.get(), tl_node_name(c.get()), "bench-dst", &remote, nullptr),
            "tl_lookup")) {
        return;
    }
    tl_notification note{};
    // Two writes in flight, as ib_write_bw keeps a window: each turn submits one write and
    // waits for the one before it, so a wake-up of the waiting client overlaps the next copy.
    tl_ticket prev = 0;
    auto once = [&](uint32_t imm) -> tl_status {
        tl_ticket t = 0;
        tl_status s = tl_write(c.get(), src_r, 0, remote, 0, bytes, imm, &t);
        if (s == TL_OK && prev != 0) {
            s = tl_wait(c.get(), prev, -1);
            if (s == TL_OK) {
                // The notification is in the ring before the completion; take it so nothing
                // piles up.
                s = tl_wait_notification(c.get(), &note, -1);
            }
        }
        prev = t;
        return s;
    };
    for (uint32_t i = 0; i < 2; ++i) {  // the sidecar faults its mapping of both buffers in
        if (!ok(state, once(i), "warm-up write")) {
            return;
        }
    }
    uint32_t imm = 0;
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(state.max_iterations));
    for (auto _ : state) {
        auto t0 = Clock::now();
        if (!ok(state, once(++imm), "tl_write/tl_wait")) {
            break;
        }
        samples.push_back(ns(Clock::now() - t0));
    }
    if (prev != 0 && tl_wait(c.get(), prev, -1) == TL_OK) {
        (void)tl_wait_notification(c.get(), &note, -1);
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
    reportBandwidthP50(state, samples, bytes);
}

/// The ring alone: what a round trip through a request and a completion ring costs with no
/// sidecar loop and no shim around it (the floor RingNop is compared with in docs/benchmarks.md).
void ringRaw(benchmark::State &state) {
    g_sidecars.stopAll();
    using namespace tensorlane::ipc;
    constexpr uint32_t kDepth = 1024;
    const SegmentGeometry g = SegmentGeometry::forDepth(kDepth);
    void *base =
        ::mmap(nullptr, g.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        state.SkipWithError(std::strerror(errno));
        return;
    }
    initSegment(base, g, 1);
    const SegmentView v = SegmentView::at(base, g);
    auto *stop = &v.header->client_waiting.value;  // unused by this test otherwise
    const pid_t child = tlbench::forkTied();
    if (child < 0) {
        state.SkipWithError(std::strerror(errno));
        ::munmap(base, g.total_bytes);
        return;
    }
    if (child == 0) {
        RingConsumer<Request> requests(v.request_ctl, v.requests, kDepth);
        RingProducer<Completion> completions(v.completion_ctl, v.completions, kDepth);
        while (stop->load(std::memory_order_relaxed) == 0) {
            const uint32_t n = requests.available();
            for (uint32_t i = 0; i < n; ++i) {
                const Request r = requests.read(i);
                Completion c{};
                c.ticket = r.ticket;
                if (!completions.push(c)) {
                    ::_exit(2);
                }
            }
            if (n) {
                requests.release(n);
                completions.publish();
            }
        }
        ::_exit(0);
    }
    RingProducer<Request> requests(v.request_ctl, v.requests, kDepth);
    RingConsumer<Completion> completions(v.completion_ctl, v.completions, kDepth);
    uint64_t ticket = 0;
    auto roundTrip = [&] {
        Request r{};
        r.op = static_cast<uint32_t>(Op::kNop);
        r.ticket = ++ticket;
        if (!requests.push(r)) {
            return false;
        }
        requests.publish();
        while (completions.available() == 0) {
        }
        const bool good = completions.read(0).ticket == ticket;
        completions.release(1);
        return good;
    };
    std::vector<double> samples = timeRoundTrips(state, roundTrip);
    stop->store(1, std::memory_order_relaxed);
    int st = 0;
    ::waitpid(child, &st, 0);
    ::munmap(base, g.total_bytes);
    reportLatency(state, samples);
}

void registerAll() {
    // Latency first: the socket baseline, then the ring.
    benchmark::RegisterBenchmark("SeqpacketPingPong", seqpacketPingPong)
        ->UseRealTime()
        ->Unit(benchmark::kNanosecond);
    benchmark::RegisterBenchmark("RingNop", ringNop)->UseRealTime()->Unit(benchmark::kNanosecond);
    benchmark::RegisterBenchmark("RingRaw", ringRaw)->UseRealTime()->Unit(benchmark::kNanosecond);
    benchmark::RegisterBenchmark("RingNopBatch", ringNopBatch)
        ->Arg(64)
        ->Arg(256)
        ->Arg(512)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    // Bandwidth: each size's baseline right before the sidecar's figures, so both see the same
    // moment of a noisy machine.
    for (int64_t bytes = 4 << 10; bytes <= (int64_t{256} << 20); bytes *= 4) {
        benchmark::RegisterBenchmark("Memcpy", memcpyBaseline)
            ->Arg(bytes)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
        for (const char *mode : {"busy", "adaptive"}) {
            benchmark::RegisterBenchmark(
                (std::string("LocalWrite/") + mode).c_str(),
                [m = std::string(mode)](benchmark::State &s) { localWrite(s, m); })
                ->Arg(bytes)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    ::signal(SIGPIPE, SIG_IGN);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
        return 1;
    }
    registerAll();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    g_sidecars.stopAll();
    return 0;
}
