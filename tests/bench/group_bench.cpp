// What a grouped write costs beyond its bytes (issue 21: "1,000 x 16 KiB entries vs one 16 MiB
// write, local and tcp; goal within 1.5x"), through real sidecars.
//
//   Group/TRANSPORT/entries:N/scattered:S   one tl_write_group of N entries (1000: of 16 KiB
//                             each, the figure; 16: of 1 MiB), scattered over the target
//                             region (S = 1) or in order (S = 0: the sidecar coalesces them),
//                             and one tl_write of 16 MiB, alternated in the same run; each
//                             iteration times both, from submission until the target's
//                             notification is in its hands. Counters: p50 of each, ratio_p50 =
//                             group / write, and per_byte_ratio (the same per byte moved: the
//                             1000-entry group moves 16,384,000 bytes, the write 16,777,216).
//
// TRANSPORT: local (writer and target clients of one sidecar) or tcp (two sidecars on
// loopback). Run: build/release/tests/bench/group_bench (docs/benchmarks.md).
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kBytes = 16u << 20;

/// A writer and a target client, on one node or two, with a 16 MiB source and target.
class Setup {
public:
    explicit Setup(const std::string &transport) {
        if (transport == "local") {
            tlbench::SidecarOptions o;
            o.listen = "127.0.0.1:" + std::to_string(tlbench::freePort());
            a_ = std::make_unique<tlbench::Sidecar>(o);
            peer_ = "node-a";
        } else {
            const int pa = tlbench::freePort(), pb = tlbench::freePort();
            tlbench::SidecarOptions oa, ob;
            oa.name = "node-a";
            oa.listen = "127.0.0.1:" + std::to_string(pa);
            oa.extra =
                "[fabric]\ntransport = \"tcp\"\n[[peers]]\nname = \"node-b\"\naddress = "
                "\"127.0.0.1:" +
                std::to_string(pb) + "\"\n";
            ob.name = "node-b";
            ob.listen = "127.0.0.1:" + std::to_string(pb);
            ob.extra =
                "[fabric]\ntransport = \"tcp\"\n[[peers]]\nname = \"node-a\"\naddress = "
                "\"127.0.0.1:" +
                std::to_string(pa) + "\"\n";
            a_ = std::make_unique<tlbench::Sidecar>(oa);
            b_ = std::make_unique<tlbench::Sidecar>(ob);
            peer_ = "node-b";
        }
        const std::string &target_sock = b_ ? b_->socket() : a_->socket();
        if (tl_connect(a_->socket().c_str(), &w_) != TL_OK ||
            tl_connect(target_sock.c_str(), &t_) != TL_OK) {
            throw std::runtime_error(std::string("tl_connect: ") + tl_last_error());
        }
        void *p = nullptr;
        if (tl_alloc_host(w_, kBytes, &p, &src_) != TL_OK ||
            tl_alloc_host(t_, kBytes, &p, &dst_) != TL_OK ||
            tl_expose(t_, dst_, "group-bench") != TL_OK) {
            throw std::runtime_error(std::string("setup: ") + tl_last_error());
        }
        const auto end = Clock::now() + std::chrono::seconds(20);
        tl_status s;
        while ((s = tl_lookup(w_, peer_.c_str(), "group-bench", &remote_, nullptr)) != TL_OK &&
               Clock::now() < end) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (s != TL_OK) {
            throw std::runtime_error(std::string("tl_lookup: ") + tl_last_error());
        }
    }
    ~Setup() {
        tl_disconnect(w_);
        tl_disconnect(t_);
    }
    /// One tl_write of all 16 MiB; ns until the target holds its notification.
    double write() {
        const auto t0 = Clock::now();
        tl_ticket t = 0;
        check(tl_write(w_, src_, 0, remote_, 0, kBytes, 1, &t), "tl_write");
        return finish(t0, t);
    }
    /// One group of `entries`; ns until the target holds its notification.
    double group(const std::vector<tl_group_entry> &entries) {
        const auto t0 = Clock::now();
        tl_send_opts o{};
        o.imm = 2;
        tl_ticket t = 0;
        check(tl_write_group(w_, entries.data(), entries.size(), &o, &t), "tl_write_group");
        return finish(t0, t);
    }
    std::vector<tl_group_entry> entries(size_t n, bool scattered) const {
        const uint64_t len = n == 1000 ? 16384 : kBytes / n;
        std::vector<tl_group_entry> e;
        for (size_t i = 0; i < n; ++i) {
            // Scattered at the target (a KV cache's free blocks), or in order (a run of them,
            // which the sidecar coalesces into one range).
            const size_t to = scattered ? (i * 7919) % n : i;
            e.push_back({src_, i * len, remote_, to * len, len});
        }
        return e;
    }

private:
    static void check(tl_status s, const char *what) {
        if (s != TL_OK) {
            throw std::runtime_error(std::string(what) + ": " + tl_last_error());
        }
    }
    double finish(Clock::time_point t0, tl_ticket t) {
        tl_message m;
        check(tl_wait_message(t_, &m, 20000), "tl_wait_message");
        check(tl_wait(w_, t, 20000), "tl_wait");
        return static_cast<double>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    }

    std::unique_ptr<tlbench::Sidecar> a_, b_;
    std::string peer_;
    tl_client *w_ = nullptr, *t_ = nullptr;
    tl_region src_ = 0, dst_ = 0;
    tl_remote remote_ = 0;
};

void Group(benchmark::State &state, const std::string &transport) {
    try {
        Setup s(transport);
        const auto entries = s.entries(static_cast<size_t>(state.range(0)), state.range(1) != 0);
        uint64_t group_bytes = 0;
        for (const auto &e : entries) {
            group_bytes += e.bytes;
        }
        for (int i = 0; i < 3; ++i) {  // warm-up: pages touched, connections up
            s.write();
            s.group(entries);
        }
        std::vector<double> w, g;
        for (auto _ : state) {
            w.push_back(s.write());
            g.push_back(s.group(entries));
        }
        const double wp = tlbench::percentile(w, 0.5), gp = tlbench::percentile(g, 0.5);
        state.counters["write_p50_us"] = wp / 1e3;
        state.counters["group_p50_us"] = gp / 1e3;
        state.counters["ratio_p50"] = wp > 0 ? gp / wp : 0;
        state.counters["per_byte_ratio"] =
            wp > 0 && group_bytes > 0
                ? (gp / static_cast<double>(group_bytes)) / (wp / static_cast<double>(kBytes))
                : 0;
        state.counters["group_GBps"] = gp > 0 ? static_cast<double>(group_bytes) / gp : 0;
    } catch (const std::exception &e) {
        state.SkipWithError(e.what());
    }
}

BENCHMARK_CAPTURE(Group, local, std::string("local"))
    ->ArgNames({"entries", "scattered"})
    ->Args({1000, 1})
    ->Args({1000, 0})
    ->Args({16, 1})
    ->Iterations(40)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Group, tcp, std::string("tcp"))
    ->ArgNames({"entries", "scattered"})
    ->Args({1000, 1})
    ->Args({1000, 0})
    ->Args({16, 1})
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
