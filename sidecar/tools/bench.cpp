// `tensorlane bench`: write latency and bandwidth through two sidecars, like perftest's
// ib_write_lat / ib_write_bw, with plain-TCP baselines measured in the same run.
//
// Loopback (the default): two sidecar processes as two nodes on 127.0.0.1 (generated configs,
// free ports, a fresh 0600 key), a forked responder worker on node-b, and this process as the
// worker on node-a. Attached (--socket/--peer/--peer-socket): the same workers against sidecars
// that are already running.
//
// Latency is the full round trip: A writes `size` bytes with an immediate into B's exposed
// region; B's worker is notified and writes the same bytes back into A's region; the time
// runs until A is notified. Bandwidth keeps a window of writes in flight from A into B's region
// and counts completed writes (a write completes once its data is in place at B).
#include "bench.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "bench_chart.hpp"
#include "bench_env.hpp"
#include "bench_report.hpp"
#include "bench_responder.hpp"
#include "bench_tcp.hpp"
#include "tensorlane/tensorlane.h"

namespace tensorlane::tools {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

/// Everything `tensorlane bench` takes on its command line.
struct Options {
    bool loopback = false;
    std::string sidecar;
    std::string socket;
    std::string peer;
    std::string peer_socket;
    std::string sizes = "64-64M";
    std::string test = "all";
    uint64_t iters = 1000;
    double duration_s = 1.0;
    uint32_t window = 32;
    uint32_t connections = 0;
    std::string chunk;
    std::string integrity;
    std::string tag_threads;
    std::string poll_mode = "auto";
    int spin_us = -1;
    uint32_t rounds = 1;
    std::string log_level = "warn";
    bool no_baseline = false;
    std::string csv;
    std::string json;
    std::string transport = "tcp";
    std::string sysfs_root;  ///< verbs: the device tree (default $TENSORLANE_SYSFS_ROOT, /sys)
    std::string devices;     ///< verbs: "A,B", node-a's and node-b's devices (default: first two)
    uint32_t qps = 0;        ///< verbs: [fabric] qps_per_peer (0: the default)
    bool respond = false;    ///< only the responder worker, against --socket, for --peer
    std::string tag;         ///< region names of a two-host run: TAG-a and TAG-b
    std::string chart;       ///< the PNG; empty: beside the CSV (when there is one)
    bool no_chart = false;
};

/// The region names of a two-host run when --tag is not given.
constexpr const char *kDefaultTag = "tlbench";

/// The RDMA devices under `root`/class/infiniband, sorted by name.
std::vector<std::string> listDevices(const std::string &root) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator(root + "/class/infiniband", ec)) {
        out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

/// The two devices of a verbs loopback run: `--devices A,B`, else the first two in the tree.
std::pair<std::string, std::string> verbsDevices(const Options &o) {
    const std::vector<std::string> have = listDevices(o.sysfs_root);
    std::string a, b;
    if (!o.devices.empty()) {
        const size_t comma = o.devices.find(',');
        if (comma == std::string::npos || o.devices.find(',', comma + 1) != std::string::npos) {
            throw BenchError("--devices: two device names, node-a's and node-b's: \"sim0,sim1\"");
        }
        a = o.devices.substr(0, comma);
        b = o.devices.substr(comma + 1);
        if (a.empty() || b.empty() || a == b) {
            throw BenchError("--devices: two different device names, e.g. \"sim0,sim1\"");
        }
        for (const std::string &d : {a, b}) {
            if (std::find(have.begin(), have.end(), d) == have.end()) {
                throw BenchError("--devices: no " + o.sysfs_root + "/class/infiniband/" + d);
            }
        }
    } else {
        if (have.size() < 2) {
            throw BenchError("--transport verbs needs two RDMA devices (one per sidecar); " +
                             o.sysfs_root + "/class/infiniband has " + std::to_string(have.size()) +
                             " (simulated ones: tests/simhca/tools/mksysfs.sh, then "
                             "--sysfs-root or TENSORLANE_SYSFS_ROOT)");
        }
        a = have[0];
        b = have[1];
    }
    return {a, b};
}

/// At most this many bytes in flight in the bandwidth test (fewer writes for big sizes).
constexpr uint64_t kMaxBytesInFlight = 128ull << 20;
/// A single write or notification taking longer than this is a failure, not a slow result.
constexpr auto kOpTimeout = std::chrono::seconds(60);

// ---- this process: the worker on node-a ----

class Bench {
public:
    Bench(const Options &o, std::vector<uint64_t> sizes) : o_(o), sizes_(std::move(sizes)) {}
    ~Bench() {
        if (stamps_) {
            ::munmap(stamps_, sizeof(EchoStamp) * kStampSlots);
        }
    }
    Bench(const Bench &) = delete;
    Bench &operator=(const Bench &) = delete;
    int run();

private:
    void startLoopback();
    void connectWorkers();
    void checkResponder();
    void waitTicket(tl_ticket t);
    tl_notification waitNote();
    /// Appends `bytes`' round trips (and their splits) to `*into`.
    void latency(uint64_t bytes, LatencySamples *into);
    Bandwidth bandwidth(uint64_t bytes);
    std::string failureDetail();
    /// The next sequence number for an immediate (never kByeImm).
    uint32_t nextSeq() {
        seq_ = (seq_ + 1) & kSeqMask;
        if (seq_ == kByeImm) {
            seq_ = 0;
        }
        return seq_;
    }
    /// Tells a responder started on its own that the bench is over.
    void sayBye();

    const Options &o_;
    std::vector<uint64_t> sizes_;
    Budget budget_;

    // Members in creation order: destruction ends the workers before the sidecars, the
    // sidecars before their files go.
    std::optional<TempDir> dir_;
    std::optional<TcpBaseline> baseline_;
    std::string socket_a_, socket_b_, peer_name_;
    Child sidecar_a_, sidecar_b_;
    int ctl_ = -1;
    Child responder_;
    ClientPtr client_;
    void *src_ = nullptr;
    void *dst_ = nullptr;
    tl_region src_region_ = 0, dst_region_ = 0;
    tl_remote remote_ = 0;
    uint32_t seq_ = 0;
    EchoStamp *stamps_ = nullptr;
    std::string devices_;  ///< verbs loopback: "A,B"
    /// Attached without --peer-socket: the responder runs on the peer's host (--respond).
    bool remote_responder_ = false;
};

void Bench::startLoopback() {
    std::string exe = o_.sidecar.empty() ? selfDir() + "/tensorlane-sidecar" : o_.sidecar;
    if (::access(exe.c_str(), X_OK) != 0) {
        throw BenchError("cannot run " + exe + " (" + std::strerror(errno) +
                         "); point --sidecar at tensorlane-sidecar");
    }
    writeKeyFile(dir_->file("peer.key"));
    uint16_t port_a = freeLoopbackPort(), port_b = freeLoopbackPort();
    while (port_b == port_a) {
        port_b = freeLoopbackPort();
    }
    NodeSettings a;
    a.name = "node-a";
    a.listen_port = port_a;
    a.socket = socket_a_;
    a.key_file = dir_->file("peer.key");
    a.peer_name = "node-b";
    a.peer_port = port_b;
    a.connections = o_.connections;
    a.chunk_bytes = o_.chunk.empty() ? 0 : parseBytes(o_.chunk).value_or(0);
    a.poll_mode = o_.poll_mode;
    a.spin_us = o_.spin_us;
    a.integrity = o_.integrity;
    a.tag_threads = o_.tag_threads;
    a.transport = o_.transport;
    NodeSettings b = a;
    b.name = "node-b";
    b.listen_port = port_b;
    b.socket = socket_b_;
    b.peer_name = "node-a";
    b.peer_port = port_a;
    if (o_.transport == "verbs") {
        // Each sidecar opens its own device (a simulated device belongs to one process); the
        // library they load is whatever LD_LIBRARY_PATH says (the simulator's or rdma-core's),
        // the tree whatever TENSORLANE_SYSFS_ROOT says: the production binary, unchanged.
        std::tie(a.device, b.device) = verbsDevices(o_);
        a.qps_per_peer = b.qps_per_peer = o_.qps;
        if (::setenv("TENSORLANE_SYSFS_ROOT", o_.sysfs_root.c_str(), 1) != 0) {
            throw BenchError(std::string("setenv: ") + std::strerror(errno));
        }
        devices_ = a.device + "," + b.device;
    }
    writeNewFile(dir_->file("node-a.toml"), nodeToml(a), 0600);
    writeNewFile(dir_->file("node-b.toml"), nodeToml(b), 0600);
    sidecar_a_ =
        Child::exec({exe, "--config", dir_->file("node-a.toml"), "--log-level", o_.log_level},
                    dir_->file("node-a.log"));
    sidecar_b_ =
        Child::exec({exe, "--config", dir_->file("node-b.toml"), "--log-level", o_.log_level},
                    dir_->file("node-b.log"));
    if (!waitForSidecar(socket_a_, sidecar_a_, 10000) ||
        !waitForSidecar(socket_b_, sidecar_b_, 10000)) {
        checkInterrupted();
        throw BenchError("the sidecars did not start");
    }
}

std::pair<std::string, std::string> sidecarPollMode(tl_client *c) {
    std::string buf(1 << 20, '\0');
    size_t len = 0;
    if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
        return {"?", std::string("no status from the sidecar: ") + tl_last_error()};
    }
    buf.resize(std::min(len, buf.size() - 1));
    const auto j = nlohmann::json::parse(buf, nullptr, false);
    if (!j.is_object()) {
        return {"?", "the sidecar's status is not a JSON object"};
    }
    return {j.value("poll_mode", "?"), j.value("poll_mode_reason", "")};
}

void Bench::checkResponder() {
    checkInterrupted();
    if (remote_responder_) {
        return;  // on the other host; a write to it that fails says so
    }
    pollfd p{ctl_, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
        ReplyMsg r{};
        if (::recv(ctl_, &r, sizeof(r), MSG_DONTWAIT) == static_cast<ssize_t>(sizeof(r)) &&
            r.status != 0) {
            r.error[sizeof(r.error) - 1] = '\0';
            throw BenchError(r.error);
        }
    }
    if (!responder_.running()) {
        throw BenchError("the responder worker exited (status " +
                         std::to_string(responder_.exitStatus()) + ")");
    }
}

void Bench::connectWorkers() {
    tl_client *raw = nullptr;
    if (tl_connect(socket_a_.c_str(), &raw) != TL_OK) {
        throw BenchError(callError("tl_connect " + socket_a_));
    }
    client_.reset(raw);
    const uint64_t max = sizes_.back();
    if (tl_alloc_host(client_.get(), max, &src_, &src_region_) != TL_OK ||
        tl_alloc_host(client_.get(), max, &dst_, &dst_region_) != TL_OK) {
        throw BenchError(callError("tl_alloc_host"));
    }
    // Never zeros: a write that lands nowhere shows in the check.
    std::mt19937_64 rng(42);
    for (uint64_t i = 0; i + 8 <= max; i += 8) {
        uint64_t v = rng() | 1;
        std::memcpy(static_cast<uint8_t *>(src_) + i, &v, 8);
    }
    std::memset(static_cast<uint8_t *>(src_) + (max & ~uint64_t{7}), 0x5a, max & 7);
    std::memset(dst_, 0, max);
    const std::string tag = remote_responder_ ? (o_.tag.empty() ? std::string(kDefaultTag) : o_.tag)
                                              : "tlbench-" + std::to_string(::getpid());
    if (tl_expose(client_.get(), dst_region_, (tag + "-a").c_str()) != TL_OK) {
        throw BenchError(callError("tl_expose"));
    }
    if (remote_responder_) {
        // `tensorlane bench --respond` on the peer's host exposes TAG-b and looks up our TAG-a.
        if (tl_status s = lookupRetry(client_.get(), peer_name_, tag + "-b", &remote_,
                                      std::chrono::seconds(60));
            s != TL_OK) {
            throw BenchError("tl_lookup of " + tag + "-b on " + peer_name_ + ": " +
                             tl_status_str(s) + ": " + tl_last_error() +
                             " (is `tensorlane bench --respond` running there?)");
        }
        return;
    }
    SetupMsg setup{};
    copyName(setup.a_node, sizeof(setup.a_node), tl_node_name(client_.get()));
    copyName(setup.a_region, sizeof(setup.a_region), tag + "-a");
    copyName(setup.b_region, sizeof(setup.b_region), tag + "-b");
    setup.max_bytes = max;
    if (::send(ctl_, &setup, sizeof(setup), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(setup))) {
        throw BenchError("cannot reach the responder worker");
    }
    auto end = Clock::now() + std::chrono::seconds(60);
    for (;;) {
        checkInterrupted();
        pollfd p{ctl_, POLLIN, 0};
        if (::poll(&p, 1, 100) > 0) {
            ReplyMsg r{};
            if (::recv(ctl_, &r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r))) {
                throw BenchError("the responder worker exited during setup");
            }
            r.error[sizeof(r.error) - 1] = '\0';
            if (r.status != 0) {
                throw BenchError(r.error);
            }
            break;
        }
        if (!responder_.running() || Clock::now() > end) {
            throw BenchError("the responder worker did not get ready");
        }
    }
    if (tl_status s =
            lookupRetry(client_.get(), peer_name_, tag + "-b", &remote_, std::chrono::seconds(30));
        s != TL_OK) {
        throw BenchError("tl_lookup of " + tag + "-b on " + peer_name_ + ": " + tl_status_str(s) +
                         ": " + tl_last_error());
    }
}

void Bench::waitTicket(tl_ticket t) {
    auto end = Clock::now() + kOpTimeout;
    for (;;) {
        tl_status s = tl_wait(client_.get(), t, 100);
        if (s == TL_OK) {
            return;
        }
        if (s != TL_ETIMEDOUT) {
            throw BenchError(std::string("write failed: ") + tl_status_str(s) + ": " +
                             tl_last_error());
        }
        checkResponder();
        if (Clock::now() > end) {
            throw BenchError("a write did not complete within 60 s");
        }
    }
}

tl_notification Bench::waitNote() {
    auto end = Clock::now() + kOpTimeout;
    tl_notification n{};
    for (;;) {
        tl_status s = tl_wait_notification(client_.get(), &n, 100);
        if (s == TL_OK) {
            return n;
        }
        if (s != TL_ETIMEDOUT) {
            throw BenchError(std::string("tl_wait_notification: ") + tl_status_str(s) + ": " +
                             tl_last_error());
        }
        checkResponder();
        if (Clock::now() > end) {
            throw BenchError("the echo did not arrive within 60 s");
        }
    }
}

void Bench::latency(uint64_t bytes, LatencySamples *into) {
    auto roundTrip = [&]() {
        const uint32_t imm = kEchoBit | nextSeq();
        tl_ticket t = 0;
        if (tl_write(client_.get(), src_region_, 0, remote_, 0, bytes, imm, &t) != TL_OK) {
            throw BenchError(callError("tl_write"));
        }
        tl_notification n = waitNote();
        if (n.imm != imm || n.bytes != bytes || n.region != dst_region_) {
            throw BenchError("unexpected notification: imm " + std::to_string(n.imm) + ", bytes " +
                             std::to_string(n.bytes) + " (wanted imm " + std::to_string(imm) +
                             ", bytes " + std::to_string(bytes) + ")");
        }
        return t;
    };
    // One checked round trip: the echo must bring back exactly what we sent.
    std::memset(dst_, 0, bytes);
    std::vector<double> &samples = into->rtt;
    waitTicket(roundTrip());
    if (std::memcmp(dst_, src_, bytes) != 0) {
        throw BenchError("the echoed " + formatBytes(bytes) + " differ from what was written");
    }
    for (uint64_t i = 0; i < budget_.warmup; ++i) {
        waitTicket(roundTrip());
    }
    const auto start = Clock::now();
    const auto limit = std::chrono::duration<double>(budget_.duration_s);
    for (uint64_t done = 0;
         done < budget_.iters && (done < budget_.min_iters || Clock::now() - start < limit);
         ++done) {
        const int64_t t0 = nowNs();
        tl_ticket t = roundTrip();
        const int64_t t1 = nowNs();
        samples.push_back(static_cast<double>(t1 - t0) / 1e3);
        waitTicket(t);  // normally done already: B was notified before it wrote back
        const uint32_t imm = kEchoBit | (seq_ & kSeqMask);
        const EchoStamp &slot = stamps_[imm & (kStampSlots - 1)];
        // The responder stamps right after its tl_write returns, so its echo can reach us
        // first: wait a moment (outside the timed part) rather than keep only the round trips
        // in which it was not preempted there. SYNC POINT: acquire; pairs with the
        // responder's release store of imm.
        // (A responder on another host leaves no stamps.)
        const int64_t give_up = remote_responder_ ? 0 : nowNs() + 2'000'000;
        while (slot.imm.load(std::memory_order_acquire) != imm && nowNs() < give_up) {
            std::this_thread::yield();
        }
        if (slot.imm.load(std::memory_order_acquire) == imm) {
            into->a_to_b.push_back(static_cast<double>(slot.noted_ns - t0) / 1e3);
            into->b_turn.push_back(static_cast<double>(slot.posted_ns - slot.noted_ns) / 1e3);
            into->b_to_a.push_back(static_cast<double>(t1 - slot.posted_ns) / 1e3);
        }
    }
}

Bandwidth Bench::bandwidth(uint64_t bytes) {
    const uint64_t window =
        std::max<uint64_t>(1, std::min<uint64_t>(o_.window, kMaxBytesInFlight / bytes));
    std::deque<tl_ticket> inflight;
    auto post = [&]() -> bool {
        tl_ticket t = 0;
        tl_status s = tl_write(client_.get(), src_region_, 0, remote_, 0, bytes, nextSeq(), &t);
        if (s == TL_EAGAIN) {
            return false;
        }
        if (s != TL_OK) {
            throw BenchError(callError("tl_write"));
        }
        inflight.push_back(t);
        return true;
    };
    // Warm up: one window's worth, drained.
    for (uint64_t i = 0; i < window && post(); ++i) {
    }
    while (!inflight.empty()) {
        waitTicket(inflight.front());
        inflight.pop_front();
    }
    Bandwidth b;
    const auto start = Clock::now();
    const auto limit = std::chrono::duration<double>(budget_.duration_s);
    bool more = true;
    while (more || !inflight.empty()) {
        while (more && inflight.size() < window && post()) {
        }
        if (!inflight.empty()) {
            waitTicket(inflight.front());
            inflight.pop_front();
            ++b.writes;
        }
        more = b.writes + inflight.size() < budget_.min_iters || Clock::now() - start < limit;
    }
    b.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    b.bytes = b.writes * bytes;
    return b;
}

void Bench::sayBye() {
    tl_ticket t = 0;
    const uint64_t bytes = std::min<uint64_t>(64, sizes_.back());
    if (tl_write(client_.get(), src_region_, 0, remote_, 0, bytes, kByeImm, &t) == TL_OK) {
        waitTicket(t);
    }
}

std::string Bench::failureDetail() {
    if (!dir_) {
        return {};
    }
    std::string out;
    for (const char *node : {"node-a", "node-b"}) {
        std::string log = readFile(dir_->file(std::string(node) + ".log"));
        if (log.empty()) {
            continue;
        }
        // The last lines are the ones that say why.
        size_t pos = log.size();
        for (int lines = 0; lines < 15 && pos > 0; ++lines) {
            pos = log.rfind('\n', pos - 1);
            if (pos == std::string::npos) {
                pos = 0;
                break;
            }
        }
        out += "--- " + std::string(node) + " sidecar log (tail):\n" + log.substr(pos) + "\n";
    }
    return out;
}

/// The round with the median rate.
Bandwidth medianRound(std::vector<Bandwidth> rounds) {
    std::sort(rounds.begin(), rounds.end(),
              [](const Bandwidth &a, const Bandwidth &b) { return a.gbps() < b.gbps(); });
    return rounds[rounds.size() / 2];
}

std::string nowIso() {
    std::time_t t = std::time(nullptr);
    char buf[64];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
    return buf;
}

std::string hostInfo() {
    utsname u{};
    ::uname(&u);
    return std::string(u.nodename) + ", " + std::to_string(std::thread::hardware_concurrency()) +
           " CPUs, Linux " + u.release;
}

int Bench::run() {
    budget_.iters = o_.iters;
    budget_.duration_s = o_.duration_s;
    const bool do_lat = o_.test != "bw";
    const bool do_bw = o_.test != "lat";
    const bool loopback = o_.socket.empty();
    remote_responder_ = !loopback && o_.peer_socket.empty();

    try {
        if (loopback) {
            dir_.emplace();
            socket_a_ = dir_->file("node-a.sock");
            socket_b_ = dir_->file("node-b.sock");
            peer_name_ = "node-b";
        } else {
            socket_a_ = o_.socket;
            socket_b_ = o_.peer_socket;
            peer_name_ = o_.peer;
        }
        // Fork the helpers while this process is still single-threaded and holds no shim
        // connection (a forked child must not share our session).
        if (!o_.no_baseline) {
            baseline_.emplace(TcpBaseline::start());
        }
        void *stamps = ::mmap(nullptr, sizeof(EchoStamp) * kStampSlots, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (stamps == MAP_FAILED) {
            throw BenchError(std::string("mmap: ") + std::strerror(errno));
        }
        stamps_ = static_cast<EchoStamp *>(stamps);  // zero-filled: no slot matches yet
        if (!remote_responder_) {
            int sv[2];
            if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
                throw BenchError(std::string("socketpair: ") + std::strerror(errno));
            }
            ctl_ = sv[0];
            const std::string b_socket = socket_b_;
            responder_ = Child::fork([fd = sv[1], parent_fd = sv[0], b_socket, this] {
                ::close(parent_fd);
                return responderMain(fd, b_socket, stamps_);
            });
            ::close(sv[1]);
        }
        if (loopback) {
            startLoopback();
        }
        connectWorkers();

        RunInfo info;
        info.date = nowIso();
        info.host = hostInfo();
        info.mode = loopback ? "loopback" : remote_responder_ ? "two hosts" : "attached";
        info.transport = loopback ? o_.transport : "";
        info.devices = devices_;
        info.local_node = tl_node_name(client_.get());
        info.peer_node = peer_name_;
        info.connections = o_.connections;
        info.chunk_bytes = o_.chunk.empty() ? 0 : parseBytes(o_.chunk).value_or(0);
        if (loopback) {
            // What the sidecars made of it ("auto" is resolved for this host's CPUs), and why:
            // the first thing to look at when a round trip is milliseconds.
            std::tie(info.poll_mode, info.poll_mode_reason) = sidecarPollMode(client_.get());
        }
        info.spin_us = loopback ? o_.spin_us : -1;
        info.window = o_.window;
        info.iters = o_.iters;
        info.duration_s = o_.duration_s;
        info.rounds = o_.rounds;

        const size_t per_size = (do_lat ? 1 : 0) + (do_bw ? 1 : 0);
        Progress progress(sizes_.size() * per_size * (o_.no_baseline ? 1 : 2) * o_.rounds);
        std::vector<SizeResult> results;
        char line[256];
        for (uint64_t bytes : sizes_) {
            SizeResult r;
            r.bytes = bytes;
            const std::string sz = formatBytes(bytes);
            // Rounds alternate the sidecars and the baseline, so both see the same moments of
            // a noisy machine; latency pools the samples, bandwidth keeps the median round.
            LatencySamples lat, tcp_lat;
            std::vector<Bandwidth> bw, tcp_bw;
            for (uint32_t round = 1; round <= o_.rounds; ++round) {
                const std::string of = o_.rounds > 1 ? " (round " + std::to_string(round) + "/" +
                                                           std::to_string(o_.rounds) + ")"
                                                     : std::string();
                if (do_lat) {
                    progress.begin("latency " + sz + " through the sidecars" + of);
                    const size_t before = lat.rtt.size();
                    latency(bytes, &lat);
                    std::vector<double> part(lat.rtt.begin() + static_cast<ptrdiff_t>(before),
                                             lat.rtt.end());
                    const Latency l = Latency::of(part);
                    std::snprintf(line, sizeof(line),
                                  "latency %s via sidecars: p50 %.1f us, p99 %.1f us%s", sz.c_str(),
                                  l.p50_us, l.p99_us, of.c_str());
                    progress.done(line);
                    if (baseline_) {
                        progress.begin("latency " + sz + " plain TCP" + of);
                        std::vector<double> t;
                        baseline_->pingPong(bytes, budget_, &t);
                        tcp_lat.rtt.insert(tcp_lat.rtt.end(), t.begin(), t.end());
                        const Latency tl = Latency::of(t);
                        std::snprintf(line, sizeof(line),
                                      "latency %s plain TCP: p50 %.1f us, p99 %.1f us%s",
                                      sz.c_str(), tl.p50_us, tl.p99_us, of.c_str());
                        progress.done(line);
                    }
                }
                if (do_bw) {
                    progress.begin("bandwidth " + sz + " through the sidecars" + of);
                    bw.push_back(bandwidth(bytes));
                    std::snprintf(line, sizeof(line), "bandwidth %s via sidecars: %.3f GB/s%s",
                                  sz.c_str(), bw.back().gbps(), of.c_str());
                    progress.done(line);
                    if (baseline_) {
                        progress.begin("bandwidth " + sz + " plain TCP" + of);
                        tcp_bw.push_back(baseline_->stream(bytes, budget_));
                        std::snprintf(line, sizeof(line), "bandwidth %s plain TCP: %.3f GB/s%s",
                                      sz.c_str(), tcp_bw.back().gbps(), of.c_str());
                        progress.done(line);
                    }
                }
            }
            if (do_lat) {
                r.lat = Latency::of(lat);
                if (baseline_) {
                    r.tcp_lat = Latency::of(tcp_lat);
                }
            }
            if (do_bw) {
                r.bw = medianRound(bw);
                if (baseline_) {
                    r.tcp_bw = medianRound(tcp_bw);
                }
            }
            results.push_back(r);
        }
        progress.clear();

        // Let the responder finish (it drains its tickets), then tear down in order.
        if (remote_responder_) {
            sayBye();
        } else {
            ::shutdown(ctl_, SHUT_RDWR);
            responder_.waitExit(5000);
            responder_.stop();
        }
        client_.reset();

        const bool table_to_stderr = o_.csv == "-" || o_.json == "-";
        (table_to_stderr ? std::cerr : std::cout) << formatTable(info, results) << std::flush;
        if (!o_.csv.empty()) {
            writeOutput(o_.csv, formatCsv(results));
        }
        if (!o_.json.empty()) {
            writeOutput(o_.json, formatJson(info, results));
        }
        // The chart is a by-product: without gnuplot, or when it fails, the bench says why and
        // still succeeds (the table, CSV and JSON are the results).
        if (const std::string chart = o_.no_chart ? "" : chartPath(o_.chart, o_.csv);
            !chart.empty()) {
            (table_to_stderr ? std::cerr : std::cout)
                << "tensorlane bench: " << writeChart(chart, info, results).message << "\n"
                << std::flush;
        }
    } catch (const BenchError &e) {
        if (::isatty(2) == 1) {
            std::cerr << "\r\033[K";  // clear the progress bar
        }
        if (interrupted()) {
            std::cerr << "tensorlane bench: interrupted; cleaning up\n";
        } else {
            std::cerr << "tensorlane bench: " << e.what() << "\n" << failureDetail();
        }
        client_.reset();
        responder_.stop();
        sidecar_a_.stop();
        sidecar_b_.stop();
        if (ctl_ >= 0) {
            ::close(ctl_);
        }
        return interrupted() ? 130 : 1;
    }
    if (ctl_ >= 0) {
        ::close(ctl_);
    }
    return 0;
}

/// `tensorlane bench --respond`: the responder worker alone, for a bench on the peer's host.
int respond(const Options &o, uint64_t max_bytes) {
    const std::string tag = o.tag.empty() ? kDefaultTag : o.tag;
    if (tag.size() > 60) {
        std::cerr << "tensorlane bench: --tag: at most 60 characters\n";
        return 2;
    }
    SetupMsg setup{};
    copyName(setup.a_node, sizeof(setup.a_node), o.peer);
    copyName(setup.a_region, sizeof(setup.a_region), tag + "-a");
    copyName(setup.b_region, sizeof(setup.b_region), tag + "-b");
    setup.max_bytes = max_bytes;
    std::cerr << "tensorlane bench --respond: exposing " << tag << "-b (" << formatBytes(max_bytes)
              << ") on " << o.socket << ", waiting for " << tag << "-a of " << o.peer << "\n";
    const int rc = responderMain(-1, o.socket, nullptr, &setup);
    if (rc == 0 && !interrupted()) {
        std::cerr << "tensorlane bench --respond: the bench on " << o.peer << " is done\n";
    }
    return interrupted() ? 130 : rc;
}

int runBench(Options o) {
    installSignalHandlers();
    std::vector<uint64_t> sizes;
    try {
        const bool attached = !o.socket.empty() || !o.peer.empty() || !o.peer_socket.empty();
        if (attached && (o.socket.empty() || o.peer.empty())) {
            throw BenchError(
                "--socket and --peer go together (with --peer-socket when the peer's sidecar "
                "runs on this host; without it, `tensorlane bench --respond` runs on the peer's)");
        }
        if (o.respond && (!attached || !o.peer_socket.empty())) {
            throw BenchError(
                "--respond needs --socket (this host's sidecar) and --peer (the "
                "node that runs the bench), and no --peer-socket");
        }
        if (!o.tag.empty() && (!attached || !o.peer_socket.empty())) {
            throw BenchError(
                "--tag names the regions of a two-host run (--socket and --peer "
                "without --peer-socket, or --respond)");
        }
        if (attached && o.loopback) {
            throw BenchError("--loopback starts its own sidecars; leave out --socket/--peer");
        }
        if (attached && (o.connections || !o.chunk.empty() || !o.sidecar.empty() ||
                         o.spin_us >= 0 || !o.integrity.empty() || !o.tag_threads.empty())) {
            throw BenchError(
                "--connections, --chunk, --integrity, --tag-threads, --spin-us and --sidecar "
                "shape the "
                "sidecars --loopback "
                "starts; set "
                "them in the running sidecars' configs instead");
        }
        const bool verbs_opts = !o.sysfs_root.empty() || !o.devices.empty() || o.qps != 0;
        if (attached && (o.transport != "tcp" || verbs_opts)) {
            throw BenchError(
                "--transport, --sysfs-root, --devices and --qps shape the sidecars --loopback "
                "starts; set them in the running sidecars' configs instead");
        }
        if (o.transport != "verbs" && verbs_opts) {
            throw BenchError("--sysfs-root, --devices and --qps go with --transport verbs");
        }
        if (!o.chunk.empty()) {
            auto c = parseBytes(o.chunk);
            if (!c || *c < 4096 || *c > (64u << 20)) {
                throw BenchError("--chunk: 4K to 64M");
            }
        }
        sizes = parseSizes(o.sizes);
        if (o.transport == "verbs") {
            if (o.sysfs_root.empty()) {
                const char *env = std::getenv("TENSORLANE_SYSFS_ROOT");
                o.sysfs_root = env != nullptr && *env != '\0' ? env : "/sys";
            }
            (void)verbsDevices(o);  // a wrong tree or name fails here, before anything starts
        }
    } catch (const BenchError &e) {
        std::cerr << "tensorlane bench: " << e.what() << "\n";
        return 2;
    }
    if (o.respond) {
        return respond(o, sizes.back());
    }
    Bench b(o, std::move(sizes));
    return b.run();
}

}  // namespace
}  // namespace bench

void addBenchCommand(CLI::App &app, std::function<int()> *run) {
    auto opts = std::make_shared<bench::Options>();
    auto *b = app.add_subcommand(
        "bench",
        "write latency and bandwidth through two sidecars (like ib_write_lat / ib_write_bw), "
        "next to plain-TCP baselines measured in the same run");
    auto *lb = b->add_flag("--loopback", opts->loopback,
                           "start two sidecars as two nodes on 127.0.0.1 (the default)");
    b->add_option("--sidecar", opts->sidecar,
                  "the tensorlane-sidecar binary (default: next to this one)");
    auto *sock = b->add_option("--socket", opts->socket,
                               "bench against running sidecars: this node's socket");
    b->add_option("--peer", opts->peer, "with --socket: the peer node's name");
    b->add_option("--peer-socket", opts->peer_socket,
                  "with --socket: the peer sidecar's socket on this host (the responder worker "
                  "connects there); without it the responder is `tensorlane bench --respond` "
                  "on the peer's host");
    b->add_flag("--respond", opts->respond,
                "two hosts: run only the responder worker against --socket, for the bench that "
                "--peer runs (start it first; it exits when that bench is done)");
    b->add_option("--tag", opts->tag,
                  "two hosts: the regions are TAG-a and TAG-b, the same on both (default "
                  "tlbench)");
    lb->excludes(sock);
    b->add_option("--sizes", opts->sizes,
                  "sizes: a list (64,4K,1M) and/or ranges in powers of 4 (64-64M)")
        ->capture_default_str();
    b->add_option("--test", opts->test, "lat, bw or all")
        ->check(CLI::IsMember({"lat", "bw", "all"}))
        ->capture_default_str();
    b->add_option("--iters", opts->iters, "latency: round trips per size at most")
        ->check(CLI::Range(uint64_t{1}, uint64_t{100000000}))
        ->capture_default_str();
    b->add_option("--duration", opts->duration_s,
                  "seconds per measurement (latency: at most; bandwidth: this long)")
        ->check(CLI::Range(0.01, 3600.0))
        ->capture_default_str();
    b->add_option("--window", opts->window, "bandwidth: writes in flight")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    b->add_option("--connections", opts->connections,
                  "loopback: [tcp] connections_per_peer of the generated configs")
        ->check(CLI::Range(1, 16));
    b->add_option("--chunk", opts->chunk, "loopback: [tcp] chunk_bytes (4K-64M, e.g. 1M)");
    b->add_option("--integrity", opts->integrity,
                  "loopback: [security] tcp_integrity of both sidecars (mac, the default, or "
                  "none): measure what authenticating every frame costs")
        ->check(CLI::IsMember({"mac", "none"}));
    b->add_option("--tag-threads", opts->tag_threads,
                  "loopback: [tcp] tag_threads of both sidecars (auto, the default, or 0-16): "
                  "workers that compute the big chunks' frame tags off the engine thread")
        ->check(CLI::IsMember({"auto"}) | CLI::Range(0, 16));
    b->add_option("--poll-mode", opts->poll_mode,
                  "loopback: [ipc] poll_mode of both sidecars; auto picks event on a host with "
                  "fewer than 4 CPUs (spinning there takes the CPU the other side needs), else "
                  "adaptive; the report says which and why")
        ->check(CLI::IsMember({"auto", "busy", "adaptive", "event"}))
        ->capture_default_str();
    b->add_option("--spin-us", opts->spin_us,
                  "loopback: [ipc] spin_us (adaptive mode: spin this long before sleeping)")
        ->check(CLI::Range(0, 10000));
    b->add_option("--rounds", opts->rounds,
                  "measure each size this many times, alternating with the baseline (latency "
                  "pools the samples, bandwidth reports the median round)")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    b->add_option("--sidecar-log-level", opts->log_level, "loopback: the sidecars' --log-level")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
        ->capture_default_str();
    b->add_option("--transport", opts->transport,
                  "loopback: the sidecars' [fabric] transport; verbs gives each sidecar its own "
                  "RDMA device (the simulated HCA when LD_LIBRARY_PATH points at it)")
        ->check(CLI::IsMember({"tcp", "verbs"}))
        ->capture_default_str();
    b->add_option("--sysfs-root", opts->sysfs_root,
                  "verbs: the sysfs tree with the devices, passed to the sidecars as "
                  "TENSORLANE_SYSFS_ROOT (default: $TENSORLANE_SYSFS_ROOT, else /sys)");
    b->add_option("--devices", opts->devices,
                  "verbs: node-a's and node-b's [fabric] device, \"A,B\" (default: the first "
                  "two devices of the tree, by name)");
    b->add_option("--qps", opts->qps, "verbs: [fabric] qps_per_peer of both sidecars")
        ->check(CLI::Range(1, 16));
    b->add_flag("--no-baseline", opts->no_baseline, "skip the plain-TCP baselines");
    b->add_option("--csv", opts->csv, "write the results as CSV to FILE (- for stdout)");
    b->add_option("--json", opts->json, "write the results as JSON to FILE (- for stdout)");
    auto *chart = b->add_option(
        "--chart", opts->chart,
        "write a PNG chart of bandwidth and latency against size to FILE "
        "(gnuplot; default: beside --csv FILE, with .png for .csv: run.csv -> run.png)");
    b->add_flag("--no-chart", opts->no_chart, "no chart beside the CSV")->excludes(chart);
    b->callback([run, opts] { *run = [opts] { return bench::runBench(*opts); }; });
}

}  // namespace tensorlane::tools
