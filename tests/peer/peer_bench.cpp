// peer_bench: the TCP transport between two in-process PeerManagers on loopback, against the
// baselines of issue 4: a plain single TCP stream (bandwidth) and a plain TCP ping-pong (64-byte
// round trip). Not a test; run it from a release build:
//   build/release/tests/peer/peer_bench [--seconds S] [--busy]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"

using namespace tensorlane;
using namespace tensorlane::peertest;
using Clock = std::chrono::steady_clock;

namespace {

double g_seconds = 2.0;
bool g_busy = false;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ----- plain TCP baselines

struct Pair {
    int a = -1;
    int b = -1;
};

Pair tcpPair() {
    int l = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(l, reinterpret_cast<sockaddr *>(&sa), sizeof sa);
    socklen_t len = sizeof sa;
    ::getsockname(l, reinterpret_cast<sockaddr *>(&sa), &len);
    ::listen(l, 1);
    Pair p;
    p.a = ::socket(AF_INET, SOCK_STREAM, 0);
    ::connect(p.a, reinterpret_cast<sockaddr *>(&sa), sizeof sa);
    p.b = ::accept(l, nullptr, nullptr);
    ::close(l);
    int one = 1;
    ::setsockopt(p.a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(p.b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return p;
}

double plainStreamGBps(size_t block) {
    Pair p = tcpPair();
    std::vector<unsigned char> src(block), dst(block);
    fillRandom(src.data(), block, 1);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> received{0};
    std::thread rx([&] {
        while (true) {
            ssize_t r = ::recv(p.b, dst.data(), dst.size(), 0);
            if (r <= 0) {
                return;
            }
            received.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
        }
    });
    const auto t0 = Clock::now();
    while (since(t0) < g_seconds) {
        size_t off = 0;
        while (off < block) {
            ssize_t w = ::send(p.a, src.data() + off, block - off, 0);
            if (w <= 0) {
                break;
            }
            off += static_cast<size_t>(w);
        }
    }
    const double secs = since(t0);
    const uint64_t bytes = received.load();
    ::shutdown(p.a, SHUT_WR);
    rx.join();
    ::close(p.a);
    ::close(p.b);
    return bytes / secs / 1e9;
}

double plainPingPongUs() {
    Pair p = tcpPair();
    std::thread echo([&] {
        char buf[64];
        while (true) {
            size_t got = 0;
            while (got < 64) {
                ssize_t r = ::recv(p.b, buf + got, 64 - got, 0);
                if (r <= 0) {
                    return;
                }
                got += static_cast<size_t>(r);
            }
            ::send(p.b, buf, 64, 0);
        }
    });
    char buf[64] = {1};
    int iters = 0;
    const auto t0 = Clock::now();
    while (since(t0) < g_seconds) {
        ::send(p.a, buf, 64, 0);
        size_t got = 0;
        while (got < 64) {
            ssize_t r = ::recv(p.a, buf + got, 64 - got, 0);
            if (r <= 0) {
                break;
            }
            got += static_cast<size_t>(r);
        }
        ++iters;
    }
    const double us = since(t0) / iters * 1e6;
    ::shutdown(p.a, SHUT_RDWR);
    echo.join();
    ::close(p.a);
    ::close(p.b);
    return us;
}

// ----- through two PeerManagers

class CountingSink final : public sidecar::EventSink {
public:
    void completed(uint64_t, Code status, std::string_view reason) override {
        if (status != Code::kOk) {
            std::fprintf(stderr, "write failed: %.*s\n", static_cast<int>(reason.size()),
                         reason.data());
            failed = true;
        }
        ++completions;
    }
    void arrived(RegionId, uint32_t, uint64_t, uint64_t, std::string_view) override { ++arrivals; }
    void peerState(PeerId, PeerState, std::string_view) override {}
    uint64_t completions = 0;
    uint64_t arrivals = 0;
    bool failed = false;
};

/// One node's engine loop on its own thread, like the sidecar's: poll the wake fd (or spin).
struct Engine {
    config::Config cfg;
    sidecar::RegionTable regions;
    sidecar::TransportSet transports;  ///< before pm, which refers to it
    std::unique_ptr<sidecar::PeerManager> pm;
    CountingSink sink;
    std::atomic<bool> stop{false};

    /// The engine's turn: every transport, then the peer layer.
    size_t progress() {
        // No poll tells us which fds are readable: say all are (an epoll_wait each, as before).
        size_t n = 0;
        for (sidecar::Transport *t : transports.all()) {
            for (int fd : t->pollFds()) {
                t->readable(fd);
            }
            n += t->progress(sink);
            t->afterPublish();
        }
        pm->readable();
        return n + pm->progress(sink);
    }
    void wait() {
        if (g_busy) {
            return;
        }
        std::vector<pollfd> fds = {{pm->wakeFd(), POLLIN, 0}};
        bool armed = true;
        for (sidecar::Transport *t : transports.all()) {
            armed = t->arm() && armed;
            for (int fd : t->pollFds()) {
                fds.push_back({fd, POLLIN, 0});
            }
        }
        ::poll(fds.data(), fds.size(), armed ? 10 : 0);
    }
    void serve() {
        while (!stop.load(std::memory_order_relaxed)) {
            progress();
            wait();
        }
    }
    Status make() {
        Status err = sidecar::addRemoteTransports(cfg, regions, &transports);
        if (err.isOk()) {
            pm = sidecar::makePeerManager(cfg, regions, transports, &err);
        }
        return err;
    }
};

struct Setup {
    TempDir dir;
    Engine a;
    Engine b;
    std::shared_ptr<Region> src;
    std::shared_ptr<Region> dst;
    RemoteRegion remote;
    bool ok = false;

    explicit Setup(size_t bytes, uint32_t connections) {
        const std::string key = dir.writeFile("k", keyText('b'));
        const uint16_t pa = freePort(), pb = freePort();
        NodeOptions oa{"node-a", pa, key, {{"node-b", pb}}};
        NodeOptions ob{"node-b", pb, key, {{"node-a", pa}}};
        auto tweak = [connections](config::Config &c) {
            c.tcp.connections_per_peer = connections;
            c.tcp.peer_timeout_ms = 5000;
            c.tcp.keepalive_ms = 1000;
        };
        oa.tweak = tweak;
        ob.tweak = tweak;
        a.cfg = makeConfig(oa);
        b.cfg = makeConfig(ob);
        Status err = a.make();
        if (err.isOk()) {
            err = b.make();
        }
        if (!a.pm || !b.pm || !a.pm->start().isOk() || !b.pm->start().isOk()) {
            std::fprintf(stderr, "cannot start: %s\n", err.message().c_str());
            return;
        }
        src = makeHostRegion(bytes);
        fillRandom(src->base, bytes, 2);
        a.regions.add(src);
        dst = makeHostRegion(bytes);
        b.regions.add(dst);
        (void)b.regions.expose(dst->id, "dst");
        // Look up with both loops driven from here, before the threads start.
        bool done = false;
        Status st;
        a.pm->lookup(*a.pm->peerByName("node-b"), "dst", [&](Status s, RemoteRegion rr) {
            st = s;
            remote = rr;
            done = true;
        });
        const auto t0 = Clock::now();
        while (!done && since(t0) < 5) {
            a.progress();
            b.progress();
        }
        ok = done && st.isOk();
        if (!ok) {
            std::fprintf(stderr, "lookup failed: %s\n", st.message().c_str());
        }
    }

    sidecar::WriteOp op(uint64_t id, uint64_t bytes) {
        sidecar::WriteOp w;
        w.op_id = id;
        w.peer = 1;
        w.src = src;
        w.dst_region = remote.id;
        w.bytes = bytes;
        w.imm = static_cast<uint32_t>(id);
        return w;
    }
};

double peerWriteGBps(size_t bytes, uint32_t connections, int depth) {
    Setup s(bytes, connections);
    if (!s.ok) {
        return 0;
    }
    std::thread tb([&] { s.b.serve(); });
    uint64_t posted = 0;
    const auto t0 = Clock::now();
    while (since(t0) < g_seconds && !s.a.sink.failed) {
        while (posted - s.a.sink.completions < static_cast<uint64_t>(depth)) {
            if (!s.a.transports.post(s.op(posted + 1, bytes)).isOk()) {
                break;
            }
            ++posted;
        }
        s.a.progress();
        if (posted - s.a.sink.completions >= static_cast<uint64_t>(depth)) {
            s.a.wait();
        }
    }
    while (s.a.sink.completions < posted && !s.a.sink.failed) {
        s.a.progress();
        s.a.wait();
    }
    const double secs = since(t0);
    s.b.stop = true;
    tb.join();
    return static_cast<double>(s.a.sink.completions) * bytes / secs / 1e9;
}

/// Both engines driven from one thread: the CPU and syscall cost of the path, no wakeups.
double peerRoundTripOneThreadUs(size_t bytes) {
    Setup s(std::max<size_t>(bytes, 4096), 2);
    if (!s.ok) {
        return 0;
    }
    uint64_t n = 0;
    const auto t0 = Clock::now();
    while (since(t0) < g_seconds && !s.a.sink.failed) {
        if (!s.a.transports.post(s.op(n + 1, bytes)).isOk()) {
            break;
        }
        ++n;
        while (s.a.sink.completions < n && !s.a.sink.failed) {
            s.b.progress();
            s.a.progress();
        }
    }
    return since(t0) / static_cast<double>(n) * 1e6;
}

double peerRoundTripUs(size_t bytes) {
    Setup s(std::max<size_t>(bytes, 4096), 2);
    if (!s.ok) {
        return 0;
    }
    std::thread tb([&] { s.b.serve(); });
    uint64_t n = 0;
    const auto t0 = Clock::now();
    while (since(t0) < g_seconds && !s.a.sink.failed) {
        if (!s.a.transports.post(s.op(n + 1, bytes)).isOk()) {
            break;
        }
        ++n;
        while (s.a.sink.completions < n && !s.a.sink.failed) {
            s.a.progress();
            if (s.a.sink.completions < n) {
                s.a.wait();
            }
        }
    }
    const double us = since(t0) / static_cast<double>(n) * 1e6;
    s.b.stop = true;
    tb.join();
    return us;
}

}  // namespace

int main(int argc, char **argv) {
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            g_seconds = std::atof(argv[++i]);
        } else if (std::strcmp(argv[i], "--busy") == 0) {
            g_busy = true;
        }
    }
    // Connection messages would interleave with the table.
    spdlog::stderr_color_mt("tensorlane.sidecar.peer")->set_level(spdlog::level::warn);
    std::printf("mode: %s polling, %.1f s per figure, %u CPUs\n", g_busy ? "busy" : "event",
                g_seconds, std::thread::hardware_concurrency());
    const double pp = plainPingPongUs();
    const double rt = peerRoundTripUs(64);
    std::printf("64 B round trip: plain TCP ping-pong %.1f us, tensorlane write %.1f us (%.2fx)\n",
                pp, rt, rt / pp);
    std::printf("64 B round trip, both engines on one thread (no wakeups): %.1f us\n",
                peerRoundTripOneThreadUs(64));
    for (size_t mib : {4, 16, 64}) {
        const size_t bytes = mib << 20;
        const double plain = plainStreamGBps(bytes);
        for (uint32_t conns : {1u, 2u, 4u}) {
            const double ours = peerWriteGBps(bytes, conns, 4);
            std::printf(
                "%3zu MiB writes, %u connection(s): plain stream %.2f GB/s, tensorlane "
                "%.2f GB/s (%.0f%%)\n",
                mib, conns, plain, ours, 100.0 * ours / plain);
        }
    }
    return 0;
}
