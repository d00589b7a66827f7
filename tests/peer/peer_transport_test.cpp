// The TCP transport between PeerManagers on 127.0.0.1: lookups, writes, notifications and
// their order, large striped writes, descriptors after connect, revocation.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "harness.hpp"
#include "tensorlane/sidecar/trace.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace tensorlane::peertest {
namespace {

/// Nodes over the transport under test: tcp, or verbs on the simulated HCA.
class PeerFixture {
protected:
    virtual ~PeerFixture() = default;
    virtual std::string transport() const = 0;

    /// Starts nodes named node-a, node-b, ... each listing all the others as peers.
    void startNodes(size_t n, const std::function<void(config::Config &)> &tweak = {}) {
        std::vector<uint16_t> ports;
        for (size_t i = 0; i < n; ++i) {
            ports.push_back(freePort());
        }
        for (size_t i = 0; i < n; ++i) {
            NodeOptions o;
            o.name = std::string("node-") + static_cast<char>('a' + i);
            o.port = ports[i];
            o.key_file = key_;
            for (size_t j = 0; j < n; ++j) {
                if (j != i) {
                    o.peers.emplace_back(std::string("node-") + static_cast<char>('a' + j),
                                         ports[j]);
                }
            }
            o.tweak = tweak;
            o.transport = transport();
            nodes_.push_back(std::make_unique<Node>(o));
            ASSERT_TRUE(nodes_.back()->ok()) << nodes_.back()->startStatus().message();
        }
    }
    Node &node(size_t i) { return *nodes_[i]; }

    /// What a test writes from and into: a region of node-a filled from `seed`, and one of
    /// node-b exposed as `name`, looked up from node-a.
    struct Linked {
        std::shared_ptr<Region> src, dst;
        RemoteRegion remote;
    };
    void link(size_t bytes, const std::string &name, uint64_t seed, Linked *out) {
        out->dst = node(1).addRegion(bytes, name);
        out->src = node(0).addRegion(bytes);
        fillRandom(out->src->base, bytes, seed);
        auto [ls, remote] = node(0).lookup("node-b", name);
        ASSERT_TRUE(ls.isOk()) << ls.message();
        out->remote = remote;
    }

    /// Posts `ops` from node-a to `l.remote` on node-b in one turn of a's loop (as the engine
    /// posts a request's parts), each from `l.src` with its peer, ids and regions filled in;
    /// their op ids in `*ids`. Stops at the first refusal.
    Status postAll(const Linked &l, std::vector<WriteOp> ops, std::vector<uint64_t> *ids) {
        Node &a = node(0);
        return a.call([&] {
            auto id = a.pm().peerByName("node-b");
            for (WriteOp &op : ops) {
                std::string why;
                if (!id || !a.pm().resolveRemote(*id, l.remote.id, &op.remote_region, &why)) {
                    return Status{Code::kNotFound, why};
                }
                op.op_id = nextOpId();
                op.peer = *id;
                op.src = l.src;
                op.dst_region = l.remote.id;
                if (Status st = a.transports().post(op); !st.isOk()) {
                    return st;
                }
                ids->push_back(op.op_id);
            }
            return Status::ok();
        });
    }

    /// Posts a silent scattered write of `ex` from node-a's `l.src` to `l.remote` on node-b
    /// (WriteOp::extents: a group's entries between two regions, as one op); its op id in
    /// `*op_id`.
    Status postScatter(const Linked &l, std::vector<sidecar::Extent> ex, uint64_t *op_id) {
        WriteOp op;
        op.silent = true;
        for (const auto &e : ex) {
            op.bytes += e.bytes;
        }
        op.extents = std::make_shared<const std::vector<sidecar::Extent>>(std::move(ex));
        std::vector<uint64_t> ids;
        const Status st = postAll(l, {std::move(op)}, &ids);
        *op_id = ids.empty() ? 0 : ids[0];
        return st;
    }

    /// Waits for each of node-a's writes `ops` to end, each kOk (`what` names them in a failure).
    void expectAllEndOk(const std::vector<uint64_t> &ops, const std::string &what) {
        for (uint64_t op : ops) {
            auto c = node(0).sink.completion(op, 10s);
            ASSERT_TRUE(c.has_value())
                << what << ": a write never ended\nwriter: " << node(0).statusJson()
                << "\ntarget: " << node(1).statusJson();
            EXPECT_EQ(c->code, Code::kOk) << c->reason;
        }
    }
    /// node-b was told of `n` writes, their immediates 0 to n - 1 in that order.
    void expectArrivalsInOrder(uint32_t n) {
        const auto arrivals = node(1).sink.arrivals();
        ASSERT_EQ(arrivals.size(), n);
        for (uint32_t i = 0; i < n; ++i) {
            EXPECT_EQ(arrivals[i].imm, i);
        }
    }

    TempDir dir_;
    std::string key_ = dir_.writeFile("peer.key", kSecret);
    std::vector<std::unique_ptr<Node>> nodes_;
};

/// What every transport must do: these run over tcp and over verbs.
class Peers : public PeerFixture, public ::testing::TestWithParam<std::string> {
protected:
    std::string transport() const override { return GetParam(); }
    void SetUp() override {
        if (GetParam() == "verbs") {
            ASSERT_TRUE(simulatedHcaLoaded())
                << "the verbs cases need the simulated HCA: run with LD_LIBRARY_PATH at its "
                   "directory (ctest sets it)";
        }
    }
};
INSTANTIATE_TEST_SUITE_P(Transports, Peers, ::testing::Values("tcp", "verbs"),
                         [](const auto &param_info) { return param_info.param; });

/// What only the tcp transport does (its data connections; a target that answers each write).
class PeerTcp : public PeerFixture, public ::testing::Test {
protected:
    std::string transport() const override { return "tcp"; }
};

/// Looks a region up until it is found: a region exposed after connecting reaches the peer
/// asynchronously.
std::pair<Status, RemoteRegion> lookupEventually(Node &n, const std::string &peer,
                                                 const std::string &name) {
    std::pair<Status, RemoteRegion> r;
    const auto deadline = std::chrono::steady_clock::now() + 3s;
    do {
        r = n.lookup(peer, name);
    } while (!r.first.isOk() && std::chrono::steady_clock::now() < deadline);
    return r;
}

TEST_P(Peers, LookupAndWriteDeliverRandomData) {
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    constexpr size_t kBytes = 1 << 20;
    auto dst = b.addRegion(kBytes, "recv");
    fillRandom(dst->base, kBytes, 1);
    std::vector<unsigned char> before(dst->base, dst->base + kBytes);
    auto src = a.addRegion(kBytes);
    fillRandom(src->base, kBytes, 2);

    auto [ls, remote] = a.lookup("node-b", "recv");
    ASSERT_TRUE(ls.isOk()) << ls.message();
    EXPECT_EQ(remote.bytes, kBytes);
    EXPECT_EQ(a.state("node-b"), PeerState::kUp);

    auto [ps, op] = a.post("node-b", src, 1000, remote.id, 5000, 300000, 0xabc);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto done = a.sink.completion(op, 5s);
    ASSERT_TRUE(done.has_value());
    EXPECT_EQ(done->code, Code::kOk) << done->reason;

    // tcp: the target acknowledges after it notified the owner, so the notification is there
    // when the write completes. verbs: the completion means the HCA placed the data (RC
    // acknowledges a WRITE once placed); the owner's notification follows on the target's
    // engine, moments later.
    ASSERT_TRUE(b.sink.waitFor(
        [](const std::vector<Event> &ev) {
            return std::count_if(ev.begin(), ev.end(), [](const Event &e) {
                       return e.kind == Event::Kind::kArrived;
                   }) >= 1;
        },
        5s));
    auto arrivals = b.sink.arrivals();
    ASSERT_EQ(arrivals.size(), 1u);
    EXPECT_EQ(arrivals[0].region, dst->id);
    EXPECT_EQ(arrivals[0].imm, 0xabcu);
    EXPECT_EQ(arrivals[0].offset, 5000u);
    EXPECT_EQ(arrivals[0].bytes, 300000u);
    EXPECT_EQ(arrivals[0].peer_name, "node-a");
    if (GetParam() == "tcp") {
        EXPECT_LT(arrivals[0].order, done->order);
    }

    EXPECT_EQ(0, std::memcmp(dst->base + 5000, src->base + 1000, 300000));
    EXPECT_EQ(0, std::memcmp(dst->base, before.data(), 5000));
    EXPECT_EQ(0, std::memcmp(dst->base + 305000, before.data() + 305000, kBytes - 305000));

    auto st = peerStatus(a, "node-b");
    EXPECT_EQ(st["state"], "up");
    EXPECT_EQ(st["transport"], GetParam());
    auto stb = peerStatus(b, "node-a");
    if (GetParam() == "tcp") {
        EXPECT_EQ(st["writes_sent"], 1);
        EXPECT_EQ(st["bytes_sent"], 300000);
        EXPECT_EQ(stb["writes_received"], 1);
        EXPECT_EQ(stb["bytes_received"], 300000);
    } else {
        EXPECT_EQ(st["send"]["writes_completed"], 1) << st.dump();
        EXPECT_EQ(st["send"]["qps"].size(), 2u);
        EXPECT_EQ(st["send"]["qps"][0]["state"], "RTS");
        EXPECT_EQ(st["send"]["traffic_class"], 106);
        EXPECT_EQ(stb["receive"]["writes_received"], 1) << stb.dump();
        EXPECT_EQ(stb["receive"]["bytes_received"], 300000);
    }
}

// A metrics scrape asks for the typed figures only (issue 20): the same numbers as a status
// report, without the transport's own detail object (for verbs, 13 sysfs reads a peer).
TEST_P(Peers, AScrapesReportHasTheTypedFiguresWithoutTheDetail) {
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    auto dst = b.addRegion(1 << 16, "recv");
    auto src = a.addRegion(1 << 16);
    auto [ls, remote] = a.lookup("node-b", "recv");
    ASSERT_TRUE(ls.isOk()) << ls.message();
    auto [ps, op] = a.post("node-b", src, 0, remote.id, 0, 1 << 16, 7);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    ASSERT_TRUE(a.sink.completion(op, 5s).has_value());
    auto of = [](const sidecar::PeersReport &r) {
        for (const auto &p : r.peers) {
            if (p.name == "node-b") {
                return p.transport;
            }
        }
        ADD_FAILURE() << "no node-b in the report";
        return sidecar::TransportPeerReport{};
    };
    const sidecar::TransportPeerReport full = of(a.report(sidecar::ReportDetail::kFull));
    const sidecar::TransportPeerReport typed = of(a.report(sidecar::ReportDetail::kTyped));
    ASSERT_NE(full.detail, nullptr);
    EXPECT_TRUE(full.detail->is_object());
    EXPECT_EQ(typed.detail, nullptr);
    EXPECT_EQ(typed.transport, GetParam());
    EXPECT_EQ(typed.in_flight, full.in_flight);
    EXPECT_EQ(typed.data_connections, full.data_connections);
    EXPECT_EQ(typed.work_requests, full.work_requests);
    EXPECT_EQ(typed.completion_errors, full.completion_errors);
    EXPECT_EQ(typed.send_qps.size(), full.send_qps.size());
    if (GetParam() == "verbs") {
        EXPECT_EQ(typed.send_qps.size(), 2u);
        EXPECT_GE(typed.work_requests, 1u);
    } else {
        EXPECT_GE(typed.data_connections, 1u);
    }
}

TEST_P(Peers, UnknownRegionNameIsNotFound) {
    startNodes(2);
    node(1).addRegion(4096, "there");
    auto [s, rr] = node(0).lookup("node-b", "not-there");
    EXPECT_EQ(s.code(), Code::kNotFound) << s.message();
    EXPECT_NE(s.message().find("not-there"), std::string::npos);
}

TEST_P(Peers, NotificationsArriveInSubmissionOrder) {
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    constexpr size_t kRegion = 64u << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kRegion, "recv", 3, &l));
    auto &[src, dst, remote] = l;

    // Small writes behind large ones (split into chunks over both connections) and the other
    // way round: the target must still notify in submission order.
    const uint64_t sizes[] = {64, 3u << 20, 4096, 65536, (3u << 20) / 2, 1, 200000};
    std::mt19937_64 rng(11);
    struct Posted {
        uint64_t op, off, bytes;
    };
    std::vector<Posted> posted;
    uint64_t off = 0;
    for (uint32_t i = 0; i < 150; ++i) {
        const uint64_t n = sizes[rng() % std::size(sizes)];
        if (off + n > kRegion) {
            break;
        }
        auto [ps, op] = a.post("node-b", src, off, remote.id, off, n, i);
        ASSERT_TRUE(ps.isOk()) << ps.message();
        posted.push_back({op, off, n});
        off += n;
    }
    ASSERT_TRUE(b.sink.waitFor(
        [&](const std::vector<Event> &evs) {
            size_t n = 0;
            for (auto &e : evs) {
                n += e.kind == Event::Kind::kArrived ? 1 : 0;
            }
            return n == posted.size();
        },
        20s))
        << b.sink.arrivals().size() << " of " << posted.size() << " arrived, "
        << a.sink.count(Event::Kind::kCompleted) << " completed\nwriter: " << a.statusJson()
        << "\ntarget: " << b.statusJson();
    auto arrivals = b.sink.arrivals();
    ASSERT_EQ(arrivals.size(), posted.size());
    for (size_t i = 0; i < arrivals.size(); ++i) {
        EXPECT_EQ(arrivals[i].imm, i);
        EXPECT_EQ(arrivals[i].offset, posted[i].off);
        EXPECT_EQ(arrivals[i].bytes, posted[i].bytes);
    }
    for (auto &p : posted) {
        auto c = a.sink.completion(p.op, 10s);
        ASSERT_TRUE(c.has_value());
        EXPECT_EQ(c->code, Code::kOk) << c->reason;
    }
    EXPECT_EQ(0, std::memcmp(dst->base, src->base, off));
    // Exactly once.
    EXPECT_EQ(a.sink.count(Event::Kind::kCompleted), posted.size());
}

TEST_F(PeerTcp, WritesBufferedWhenTheReadBudgetRunsOutAreStillRead) {
    // The receiver reads a data connection up to a budget per turn; a read from the socket also
    // fills the connection's 64 KiB buffer, so when the budget runs out the next frames may be
    // in that buffer with the socket empty, where epoll never reports them. They must be read
    // on the next turn anyway: here every turn's budget is 4 KiB, and after bursts of writes of
    // every size the sender falls silent. Before the fix the last writes of a burst waited
    // for more input that never came (2 of 200 runs of NotificationsArriveInSubmissionOrder
    // under load, with the 16 MiB budget: the last 1-byte write never arrived).
    struct BudgetGuard {
        BudgetGuard() { sidecar::TcpTransport::setReadBudgetForTests(4096); }
        ~BudgetGuard() { sidecar::TcpTransport::setReadBudgetForTests(0); }
    } guard;
    startNodes(2);
    Node &a = node(0);
    constexpr size_t kRegion = 8u << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kRegion, "recv", 5, &l));
    auto &[src, dst, remote] = l;
    const uint64_t sizes[] = {1, 64, 4096, 65536, 200000, 1u << 20};
    std::mt19937_64 rng(7);
    uint32_t imm = 0;
    for (int burst = 0; burst < 5; ++burst) {
        std::vector<uint64_t> ops;
        uint64_t off = 0;
        for (int i = 0; i < 40; ++i) {
            const uint64_t n = sizes[rng() % std::size(sizes)];
            if (off + n > kRegion) {
                break;
            }
            auto [ps, op] = a.post("node-b", src, off, remote.id, off, n, imm++);
            ASSERT_TRUE(ps.isOk()) << ps.message();
            ops.push_back(op);
            off += n;
        }
        ASSERT_NO_FATAL_FAILURE(expectAllEndOk(ops, "burst " + std::to_string(burst)));
        EXPECT_EQ(0, std::memcmp(dst->base, src->base, off));
    }
    expectArrivalsInOrder(imm);
}

TEST_F(PeerTcp, LargeWriteIsChunkedAcrossConnections) {
    startNodes(2, [](config::Config &c) {
        c.tcp.connections_per_peer = 4;
        c.tcp.chunk_bytes = 1u << 20;
    });
    Node &a = node(0);
    Node &b = node(1);
    constexpr size_t kBytes = 64u << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kBytes, "big", 4, &l));
    auto &[src, dst, remote] = l;

    const auto t0 = std::chrono::steady_clock::now();
    auto [ps, op] = a.post("node-b", src, 0, remote.id, 0, kBytes, 64);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto done = a.sink.completion(op, 20s);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(done.has_value());
    ASSERT_EQ(done->code, Code::kOk) << done->reason;
    EXPECT_EQ(0, std::memcmp(dst->base, src->base, kBytes));
    std::printf("64 MiB write over 4 connections: %.1f ms (%.2f GB/s, debug build)\n", secs * 1e3,
                kBytes / secs / 1e9);

    auto st = peerStatus(a, "node-b");
    EXPECT_EQ(st["control_connections"], 1);
    EXPECT_EQ(st["data_connections"], 4);
    ASSERT_EQ(st["data_bytes_sent"].size(), 4u);
    uint64_t total = 0;
    for (auto &n : st["data_bytes_sent"]) {
        // Chunks go to whichever connection has room: every one carries a share.
        EXPECT_GE(n.get<uint64_t>(), 1u << 20);
        total += n.get<uint64_t>();
    }
    EXPECT_GE(total, kBytes);
    EXPECT_LT(total, kBytes + (1u << 20));  // 64 chunks of framing and tags, no more
    EXPECT_EQ(peerStatus(b, "node-a")["data_connections"], 4);
}

// TENSORLANE_TCP_ACK_DELAY_US (an experiment's knob, docs/peers.md): the target holds its ACKs
// that long after the notifications, and the engine keeps turning until they are sent, so every
// write still ends: one at a time (each ACK alone, nothing else to wake the engine) and in a
// burst (many ACKs held together), every byte landed and every notification in order.
TEST_F(PeerTcp, AcksHeldByTheDelayKnobAllStillCome) {
    constexpr auto kDelay = std::chrono::microseconds(1000);
    ::setenv("TENSORLANE_TCP_ACK_DELAY_US", "1000", 1);
    startNodes(2);  // (the transports read it when they are made)
    ::unsetenv("TENSORLANE_TCP_ACK_DELAY_US");
    Node &a = node(0);
    Node &b = node(1);
    constexpr size_t kRegion = 1u << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kRegion, "recv", 6, &l));
    auto &[src, dst, remote] = l;
    uint32_t imm = 0;
    for (int i = 0; i < 20; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        auto [ps, op] = a.post("node-b", src, i * 4096, remote.id, i * 4096, 4096, imm++);
        ASSERT_TRUE(ps.isOk()) << ps.message();
        auto c = a.sink.completion(op, 10s);
        ASSERT_TRUE(c.has_value()) << "write " << i << " never ended\ntarget: " << b.statusJson();
        EXPECT_EQ(c->code, Code::kOk) << c->reason;
        // Its ACK left the target no sooner than the delay after the write arrived there.
        EXPECT_GE(std::chrono::steady_clock::now() - t0, kDelay);
    }
    std::vector<uint64_t> ops;
    for (uint64_t off = 20 * 4096; off + 8192 <= kRegion; off += 8192) {
        auto [ps, op] = a.post("node-b", src, off, remote.id, off, 8192, imm++);
        ASSERT_TRUE(ps.isOk()) << ps.message();
        ops.push_back(op);
    }
    ASSERT_NO_FATAL_FAILURE(expectAllEndOk(ops, "the burst"));
    EXPECT_EQ(0, std::memcmp(dst->base, src->base, kRegion));
    expectArrivalsInOrder(imm);
}

// TENSORLANE_TRACE_FILE (tensorlane/sidecar/trace.hpp): a write's steps at both ends, as
// tests/nccl/trace_steps.py reads them: posted, each chunk queued and sent, acknowledged at the
// writer; each chunk begun and checked, the write delivered at the target. (Both nodes run in
// this process, so their steps share one file.)
TEST_F(PeerTcp, TheStepTraceFollowsAWriteThroughBothEnds) {
    sidecar::stopTraceForTests();  // one started by an earlier test of this process
    ASSERT_FALSE(sidecar::tracing());
    const std::string prefix = dir_.path() + "/steps";
    ::setenv("TENSORLANE_TRACE_FILE", prefix.c_str(), 1);
    ASSERT_EQ(sidecar::startTrace("test"), prefix);
    ::unsetenv("TENSORLANE_TRACE_FILE");
    ASSERT_TRUE(sidecar::tracing());
    startNodes(2, [](config::Config &c) {
        c.tcp.connections_per_peer = 2;
        c.tcp.chunk_bytes = 256u << 10;
        c.tcp.tag_threads = 2;  // the workers' jobs are traced too
    });
    constexpr size_t kBytes = 1u << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kBytes, "traced", 9, &l));
    auto [ps, op] = node(0).post("node-b", l.src, 0, l.remote.id, 0, kBytes, 5);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto done = node(0).sink.completion(op, 10s);
    ASSERT_TRUE(done.has_value());
    ASSERT_EQ(done->code, Code::kOk) << done->reason;
    ASSERT_TRUE(sidecar::writeTrace());

    std::ifstream in(prefix + "." + std::to_string(::getpid()));
    ASSERT_TRUE(in.good());
    std::string line;
    unsigned long long seq = 0;
    std::map<std::string, int> steps;  // the write's steps, counted
    std::map<std::string, int> jobs;   // the tag workers' jobs of 256 KiB, by kind
    bool node_line = false;
    while (std::getline(in, line)) {
        double t = 0;
        char what[128] = {};
        unsigned long long s = 0, bytes = 0;
        node_line = node_line || line.find(" sidecar node test") != std::string::npos;
        char kind[16] = {};
        long long waited = -1, ran = -1;
        if (std::sscanf(line.c_str(), "%lf tag %15s len %llu waited %lld ran %lld", &t, kind,
                        &bytes, &waited, &ran) == 5 &&
            bytes == 256u << 10) {
            EXPECT_GE(waited, 0) << line;
            EXPECT_GE(ran, 0) << line;
            ++jobs[kind];
        }
        if (std::sscanf(line.c_str(), "%lf out node-b seq %llu post bytes %llu", &t, &s, &bytes) ==
                3 &&
            bytes == kBytes) {
            seq = s;
        }
        if (seq == 0) {
            continue;
        }
        const std::string ours = " seq " + std::to_string(seq) + " ";
        if (const size_t at = line.find(ours); at != std::string::npos) {
            std::sscanf(line.c_str() + at + ours.size(), "%127[a-z ]", what);
            std::string step = line.substr(line.find(' ') + 1, 3) + " " + what;
            while (!step.empty() && step.back() == ' ') {
                step.pop_back();
            }
            ++steps[step];
        }
    }
    EXPECT_TRUE(node_line);
    ASSERT_NE(seq, 0u) << "no post of the write";
    // 1 MiB in 256 KiB chunks: four of each chunk step, one of each write step.
    const std::map<std::string, int> want = {
        {"out post bytes", 1},    {"out chunk at", 4},       {"out chunk sent conn", 4},
        {"out acked code", 1},    {"in  chunk begun at", 4}, {"in  chunk checked len", 4},
        {"in  delivered code", 1}};
    EXPECT_EQ(steps, want);
    // Each chunk signed once at the writer and verified at the target, by a worker (one
    // process: both ends' jobs are in the one file). A verifying job that reads its socket may
    // run more than once (a run ends when the socket is empty), and sends may be jobs of their
    // own.
    EXPECT_EQ(jobs["sign"], 4);
    EXPECT_GE(jobs["verify"], 4);
    for (const auto &[kind, n] : jobs) {
        EXPECT_TRUE(kind == "sign" || kind == "verify" || kind == "send") << kind;
    }
}

// A mid-sized write alone on the link is cut into chunks of 32 KiB and more, two per connection,
// so that its stages overlap; one posted while another write is in flight goes whole (its
// stages overlap the other's, and each chunk costs hand-offs: docs/peers.md), one beside a
// message only is cut as if alone. Seen in the step trace's "chunk at" lines, and every byte
// lands either way.
TEST_F(PeerTcp, AWriteBesideAnotherGoesWholeAndALoneOneInChunks) {
    sidecar::stopTraceForTests();
    const std::string prefix = dir_.path() + "/cuts";
    ::setenv("TENSORLANE_TRACE_FILE", prefix.c_str(), 1);
    ASSERT_EQ(sidecar::startTrace("test"), prefix);
    ::unsetenv("TENSORLANE_TRACE_FILE");
    startNodes(2, [](config::Config &c) {
        c.tcp.connections_per_peer = 2;
        c.tcp.chunk_bytes = 1u << 20;
    });
    constexpr uint64_t kPart = 128u << 10;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(3 * kPart, "cuts", 11, &l));
    std::vector<uint64_t> ids;
    std::vector<WriteOp> two(2);
    two[1].src_offset = two[1].dst_offset = kPart;
    for (WriteOp &op : two) {
        op.bytes = kPart;
    }
    // Both in one turn of the loop: the second is posted while the first is in flight.
    ASSERT_TRUE(postAll(l, std::move(two), &ids).isOk());
    std::vector<WriteOp> third(1);
    third[0].src_offset = third[0].dst_offset = 2 * kPart;
    third[0].bytes = kPart;
    for (uint64_t id : ids) {
        auto done = node(0).sink.completion(id, 10s);
        ASSERT_TRUE(done.has_value());
        ASSERT_EQ(done->code, Code::kOk) << done->reason;
    }
    ids.clear();
    ASSERT_TRUE(postAll(l, std::move(third), &ids).isOk());  // alone: both have ended
    auto done = node(0).sink.completion(ids.at(0), 10s);
    ASSERT_TRUE(done.has_value());
    ASSERT_EQ(done->code, Code::kOk) << done->reason;
    // A message in flight (one small chunk, an NCCL CTS say) does not make a write busy.
    std::vector<WriteOp> beside_message(2);
    beside_message[0].message.assign(64, 0x5a);
    beside_message[1].bytes = kPart;
    ids.clear();
    ASSERT_TRUE(postAll(l, std::move(beside_message), &ids).isOk());
    for (uint64_t id : ids) {
        auto ended = node(0).sink.completion(id, 10s);
        ASSERT_TRUE(ended.has_value());
        ASSERT_EQ(ended->code, Code::kOk) << ended->reason;
    }
    EXPECT_EQ(0, std::memcmp(l.dst->base, l.src->base, 3 * kPart));
    ASSERT_TRUE(sidecar::writeTrace());

    std::ifstream in(prefix + "." + std::to_string(::getpid()));
    ASSERT_TRUE(in.good());
    std::string line;
    std::map<unsigned long long, std::vector<unsigned long long>> chunks;  // seq: lengths
    while (std::getline(in, line)) {
        double t = 0;
        unsigned long long seq = 0, at = 0, len = 0;
        if (std::sscanf(line.c_str(), "%lf out node-b seq %llu chunk at %llu len %llu", &t, &seq,
                        &at, &len) == 4) {
            chunks[seq].push_back(len);
        }
    }
    // Messages' chunks are not "chunk at" steps: the writes' four entries, in sequence order.
    ASSERT_EQ(chunks.size(), 4u);
    auto it = chunks.begin();
    const std::vector<unsigned long long> four(4, 32u << 10), whole{kPart};
    EXPECT_EQ(it->second, four) << "the first write, alone when posted";
    EXPECT_EQ((++it)->second, whole) << "the second, posted beside the first";
    EXPECT_EQ((++it)->second, four) << "the third, alone again";
    EXPECT_EQ((++it)->second, four) << "the fourth, beside a message only";
}

// A loop's turn says where its time went once it took at least its threshold, its phases in
// order; a shorter one says nothing, and nothing is timed while the trace is off.
TEST(StepTrace, ALongTurnSaysWhereItWent) {
    sidecar::stopTraceForTests();
    {
        sidecar::TurnTimer off("off", 0);
        off.mark("a");
    }
    TempDir dir;
    const std::string prefix = dir.path() + "/turns";
    ::setenv("TENSORLANE_TRACE_FILE", prefix.c_str(), 1);
    ASSERT_EQ(sidecar::startTrace("test"), prefix);
    ::unsetenv("TENSORLANE_TRACE_FILE");
    {
        sidecar::TurnTimer longer("longer", 2000);
        longer.mark("first");
        std::this_thread::sleep_for(3ms);
        longer.mark("second");
        longer.mark("third");
    }
    {
        sidecar::TurnTimer shorter("shorter", 1000000);
        shorter.mark("first");
    }
    ASSERT_TRUE(sidecar::writeTrace());
    std::ifstream in(prefix + "." + std::to_string(::getpid()));
    ASSERT_TRUE(in.good());
    std::string line;
    std::vector<std::string> turns;
    while (std::getline(in, line)) {
        if (line.find(" sidecar node ") == std::string::npos) {
            turns.push_back(line.substr(line.find(' ') + 1));
        }
    }
    ASSERT_EQ(turns.size(), 1u) << "only the long turn";
    unsigned long long total = 0, first = 0, second = 0, third = 0;
    ASSERT_EQ(std::sscanf(turns[0].c_str(), "longer us %llu first %llu second %llu third %llu",
                          &total, &first, &second, &third),
              4)
        << turns[0];
    EXPECT_GE(second, 3000u);
    EXPECT_GE(total, first + second + third);
    EXPECT_LT(first, 3000u);
}

// Small chunks cut in one pump ride the connection of the chunk before them
// (OutLink::roomyConnection): a tl_write_msg's data and its payload record (the data held for it,
// WriteOp::more), or a group's small entries, leave in one sendmsg and reach the target in one
// read, instead of one socket each (a 4 KiB message cost 4 us more a round trip on the GPU
// machine when its two chunks went to two connections). Big writes still spread over all of
// them (LargeWriteIsChunkedAcrossConnections).
TEST_F(PeerTcp, SmallWritesPostedTogetherShareOneConnectionAndBigOnesSpread) {
    startNodes(2, [](config::Config &c) { c.tcp.connections_per_peer = 2; });
    Node &a = node(0);
    constexpr size_t kBytes = 4u << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kBytes, "mixed", 5, &l));
    auto &[src, dst, remote] = l;
    const auto sent = [&a] {
        std::vector<uint64_t> v;
        const nlohmann::json st = peerStatus(a, "node-b");
        for (const auto &n : st["data_bytes_sent"]) {
            v.push_back(n.get<uint64_t>());
        }
        return v;
    };
    // Eight 4 KiB writes in one turn, all but the last marked `more`, as the engine posts a
    // request's parts.
    std::vector<WriteOp> ops(8);
    for (uint32_t i = 0; i < 8; ++i) {
        ops[i].src_offset = ops[i].dst_offset = i * 4096;
        ops[i].bytes = 4096;
        ops[i].imm = 100 + i;
        ops[i].more = i < 7;
    }
    std::vector<uint64_t> ids;
    const Status posted = postAll(l, std::move(ops), &ids);
    ASSERT_TRUE(posted.isOk()) << posted.message();
    for (uint64_t id : ids) {
        auto done = a.sink.completion(id, 5s);
        ASSERT_TRUE(done.has_value());
        ASSERT_EQ(done->code, Code::kOk) << done->reason;
    }
    const std::vector<uint64_t> small = sent();
    ASSERT_EQ(small.size(), 2u);
    // (A connection carries a few frames of its own: under 4 KiB, no write's chunk.)
    EXPECT_LT(std::min(small[0], small[1]), 4096u)
        << "eight 4 KiB writes went over both connections: " << small[0] << " and " << small[1];
    EXPECT_GE(small[0] + small[1], 8u * 4096);

    auto [ps, op] = a.post("node-b", src, 0, remote.id, 0, kBytes, 7);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto done = a.sink.completion(op, 10s);
    ASSERT_TRUE(done.has_value());
    ASSERT_EQ(done->code, Code::kOk) << done->reason;
    EXPECT_EQ(0, std::memcmp(dst->base, src->base, kBytes));
    const std::vector<uint64_t> all = sent();
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_GE(all[i] - small[i], 1u << 20) << "connection " << i << " took no share of 4 MiB";
    }
}

// WriteOp::more lets the tcp transport hold a write for the op that follows it in the same
// engine turn (a tl_write_msg's data waits for its payload record: one sendmsg for both). One
// whose follower never comes still goes, in the transport's next progress(), and the engine
// does not sleep meanwhile (arm()).
TEST_F(PeerTcp, AWriteHeldForAFollowerThatNeverComesStillGoes) {
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(4096, "held", 9, &l));
    WriteOp op;
    op.bytes = 4096;
    op.imm = 77;
    op.more = true;
    std::vector<uint64_t> ids;
    const Status st = postAll(l, {op}, &ids);
    ASSERT_TRUE(st.isOk()) << st.message();
    ASSERT_EQ(ids.size(), 1u);
    const uint64_t op_id = ids[0];
    auto done = a.sink.completion(op_id, 5s);
    ASSERT_TRUE(done.has_value()) << "a held write was never sent";
    EXPECT_EQ(done->code, Code::kOk) << done->reason;
    EXPECT_TRUE(b.sink.waitFor(
        [](const std::vector<Event> &ev) {
            return std::any_of(ev.begin(), ev.end(), [](const Event &e) {
                return e.kind == Event::Kind::kArrived && e.imm == 77;
            });
        },
        5s));
    EXPECT_EQ(0, std::memcmp(l.dst->base, l.src->base, 4096));
}

TEST_P(Peers, ExposeAfterConnectReachesThePeer) {
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    b.addRegion(4096, "early");
    ASSERT_TRUE(a.lookup("node-b", "early").first.isOk());

    auto late = b.addRegion(8192, "late");
    auto r = lookupEventually(a, "node-b", "late");
    ASSERT_TRUE(r.first.isOk()) << r.first.message();
    EXPECT_EQ(r.second.bytes, 8192u);

    auto src = a.addRegion(8192);
    fillRandom(src->base, 8192, 5);
    auto [ps, op] = a.post("node-b", src, 0, r.second.id, 0, 8192, 9);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto c = a.sink.completion(op, 5s);
    ASSERT_TRUE(c && c->code == Code::kOk);
    EXPECT_EQ(0, std::memcmp(late->base, src->base, 8192));
}

TEST_P(Peers, RevokedRegionRejectsWritesAndNothingIsWritten) {
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    auto victim = b.addRegion(65536, "victim");
    fillRandom(victim->base, 65536, 6);
    std::vector<unsigned char> before(victim->base, victim->base + 65536);
    auto src = a.addRegion(65536);
    fillRandom(src->base, 65536, 7);
    auto [ls, remote] = a.lookup("node-b", "victim");
    ASSERT_TRUE(ls.isOk());
    ASSERT_TRUE(a.remoteValid("node-b", remote.id));

    b.revoke(victim->id);
    const auto deadline = std::chrono::steady_clock::now() + 3s;
    while (a.remoteValid("node-b", remote.id) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(5ms);
    }
    EXPECT_FALSE(a.remoteValid("node-b", remote.id));
    // The engine fails at once on resolveRemote; a write that goes out anyway (with the region
    // id it had before) is refused: by the target itself (tcp), or by the writer's transport,
    // which the target told to stop using the region's key (verbs).
    const uint64_t op_id = nextOpId();
    Status direct;
    do {  // kAgain (a source still being registered) is posted again, as the engine does
        direct = a.call([&] {
            WriteOp op;
            op.op_id = op_id;
            op.peer = *a.pm().peerByName("node-b");
            op.src = src;
            op.dst_region = remote.id;
            op.remote_region = victim->id;
            op.bytes = 100;
            return a.transports().post(op);
        });
    } while (direct.code() == Code::kAgain);
    if (direct.isOk()) {
        auto done = a.sink.completion(op_id, 5s);
        ASSERT_TRUE(done.has_value());
        EXPECT_EQ(done->code, Code::kNotFound) << done->reason;
    } else {
        EXPECT_EQ(direct.code(), Code::kNotFound) << direct.message();
    }
    EXPECT_EQ(a.lookup("node-b", "victim").first.code(), Code::kNotFound);
    EXPECT_EQ(0, std::memcmp(victim->base, before.data(), before.size()));
}

TEST_F(PeerTcp, TagsOnWorkerThreadsDeliverEveryByteIntactAndInOrder) {
    // Both ends hand their big chunks' tags to two workers each: writes of every size, many in
    // flight at once over three connections, each lands intact and is notified in order.
    startNodes(2, [](config::Config &c) {
        c.tcp.connections_per_peer = 3;
        c.tcp.chunk_bytes = 256u << 10;
        c.tcp.tag_threads = 2;
    });
    Node &a = node(0);
    Node &b = node(1);
    constexpr size_t kBytes = 24u << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kBytes, "tagged", 21, &l));
    auto &[src, dst, remote] = l;
    // Sizes below, at and above the pool's threshold, and across chunk boundaries.
    const std::vector<size_t> sizes = {
        100,        65535,          65536 - 56, 65536,          300001,
        256u << 10, (1u << 20) + 7, 5u << 20,   (3u << 20) - 1, 12345};
    std::vector<uint64_t> ops;
    uint64_t at = 0;
    for (int round = 0; round < 2; ++round) {
        for (size_t i = 0; i < sizes.size(); ++i) {
            ASSERT_LE(at + sizes[i], kBytes);
            auto [ps, op] = a.post("node-b", src, at, remote.id, at, sizes[i],
                                   static_cast<uint32_t>(1000 + ops.size()));
            ASSERT_TRUE(ps.isOk()) << ps.message();
            ops.push_back(op);
            at += sizes[i];
        }
    }
    for (uint64_t op : ops) {
        auto done = a.sink.completion(op, 20s);
        ASSERT_TRUE(done.has_value());
        ASSERT_EQ(done->code, Code::kOk) << done->reason;
    }
    EXPECT_EQ(0, std::memcmp(dst->base, src->base, at));
    const auto arrivals = b.sink.arrivals();
    ASSERT_EQ(arrivals.size(), ops.size());
    for (size_t i = 0; i < arrivals.size(); ++i) {
        EXPECT_EQ(arrivals[i].imm, 1000 + i) << "notification " << i << " out of order";
    }
    auto sa = peerStatus(a, "node-b");
    auto sb = peerStatus(b, "node-a");
    EXPECT_EQ(sa["tag_threads"], 2);
    EXPECT_EQ(sb["tag_threads"], 2);
    // Chunks of 64 KiB and more went to the pool on both ends (signed at a, checked at b).
    EXPECT_GE(sa["tags_offloaded"].get<uint64_t>(), 20u);
    EXPECT_GE(sb["tags_offloaded"].get<uint64_t>(), 20u);
    // Chunks with more than 64 KiB past the first read went to b's workers whenever one of
    // its socket places was free (two workers: one place, three connections; the others are
    // read by the engine thread), and a's workers wrote chunks the same way. Neither does the
    // other side's part: a receives nothing, b sends only ACKs.
    EXPECT_GE(sb["chunks_read_by_tag_workers"].get<uint64_t>(), 1u);
    EXPECT_EQ(sa["chunks_read_by_tag_workers"].get<uint64_t>(), 0u);
    EXPECT_GE(sa["bytes_sent_by_tag_workers"].get<uint64_t>(), 1u << 20);
    EXPECT_EQ(sb["bytes_sent_by_tag_workers"].get<uint64_t>(), 0u);
}

TEST_F(PeerTcp, RevokingARegionWhileItsChunksAreCheckedKeepsTheSession) {
    // A region revoked while big chunks land in it and their tags are being checked on the
    // workers: the checks finish over the bytes as they landed (never over memory its owner has
    // taken back), so no good chunk fails its tag and the session stays up.
    startNodes(2, [](config::Config &c) {
        c.tcp.chunk_bytes = 1u << 20;
        c.tcp.tag_threads = 2;
    });
    Node &a = node(0);
    Node &b = node(1);
    constexpr size_t kBytes = 32u << 20;
    auto src = a.addRegion(kBytes);
    fillRandom(src->base, kBytes, 22);
    for (int round = 0; round < 6; ++round) {
        const std::string name = "doomed" + std::to_string(round);
        auto doomed = b.addRegion(kBytes, name);
        auto [ls, remote] = lookupEventually(a, "node-b", name);
        ASSERT_TRUE(ls.isOk()) << ls.message();
        auto [ps, op] = a.post("node-b", src, 0, remote.id, 0, kBytes, 7);
        ASSERT_TRUE(ps.isOk()) << ps.message();
        std::this_thread::sleep_for(std::chrono::milliseconds(1 + round * 2));
        b.revoke(doomed->id);
        // Its owner takes the memory back at once: a tag still being computed over it would now
        // fail.
        std::memset(doomed->base, 0xee, kBytes);
        auto done = a.sink.completion(op, 20s);
        ASSERT_TRUE(done.has_value());
        // Landed before the revocation (kOk) or refused (kNotFound); never a failed session.
        EXPECT_TRUE(done->code == Code::kOk || done->code == Code::kNotFound)
            << "round " << round << ": " << done->reason;
    }
    EXPECT_FALSE(peerLogHas({"authentication tag"}))
        << "a good chunk failed its tag after its region was revoked";
    // The same session still carries writes.
    auto keep = b.addRegion(1u << 20, "kept");
    auto [ls, remote] = lookupEventually(a, "node-b", "kept");
    ASSERT_TRUE(ls.isOk()) << ls.message();
    auto [ps, op] = a.post("node-b", src, 0, remote.id, 0, 1u << 20, 8);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto done = a.sink.completion(op, 10s);
    ASSERT_TRUE(done.has_value());
    EXPECT_EQ(done->code, Code::kOk) << done->reason;
    EXPECT_EQ(0, std::memcmp(keep->base, src->base, 1u << 20));
}

TEST_F(PeerTcp, AWriterChangingItsSourceMidWriteHurtsNoOtherWrite) {
    // A local client that keeps changing its source while its writes are on the way (which the
    // ABI leaves undefined for that write's bytes) must not take the session down with it: the
    // frames' tags are over the bytes as read once, so the innocent writes that share the
    // session all land intact, and the session stays up. With the tags on the engine thread and
    // on two workers.
    for (const uint32_t threads : {0u, 2u}) {
        SCOPED_TRACE("tag_threads " + std::to_string(threads));
        nodes_.clear();
        startNodes(2, [threads](config::Config &c) {
            c.tcp.tag_threads = threads;
            c.tcp.chunk_bytes = 256u << 10;
        });
        Node &a = node(0);
        constexpr size_t kBytes = 8u << 20;
        Linked messy, clean;
        ASSERT_NO_FATAL_FAILURE(link(kBytes, "messy" + std::to_string(threads), 31, &messy));
        ASSERT_NO_FATAL_FAILURE(link(kBytes, "clean" + std::to_string(threads), 32, &clean));
        // The scribbler is another process, as a client is: it shares the region's memory
        // (a memfd mapping) and nothing else (so ThreadSanitizer sees no race of this process).
        struct Child {
            pid_t pid = -1;
            void stop() {
                if (pid > 0) {
                    ::kill(pid, SIGKILL);
                    ::waitpid(pid, nullptr, 0);
                    pid = -1;
                }
            }
            ~Child() { stop(); }
        } scribbler;
        scribbler.pid = ::fork();
        ASSERT_GE(scribbler.pid, 0);
        if (scribbler.pid == 0) {
            auto *p = reinterpret_cast<volatile uint64_t *>(messy.src->base);
            const size_t words = kBytes / sizeof(uint64_t);
            for (uint64_t v = 1;; ++v) {
                for (size_t i = v % 512; i < words; i += 509) {
                    p[i] = p[i] + v;
                }
            }
        }
        // It runs once its first change is seen (word 1 changes on its first pass).
        const auto *seen = reinterpret_cast<volatile uint64_t *>(messy.src->base);
        const uint64_t before = seen[1];
        for (int i = 0; i < 50000 && seen[1] == before; ++i) {
            std::this_thread::sleep_for(100us);
        }
        ASSERT_NE(seen[1], before) << "the scribbler never ran";
        const size_t drops = peerLogCount({"authentication tag"});
        std::vector<uint64_t> messy_ops, clean_ops;
        // Rounds of one changing write and one innocent one side by side, until changed chunks
        // have arrived (a loaded machine may not schedule the scribbler at once).
        for (int round = 0; round < 30; ++round) {
            auto [ms, mop] = a.post("node-b", messy.src, 0, messy.remote.id, 0, kBytes, 1);
            ASSERT_TRUE(ms.isOk()) << ms.message();
            messy_ops.push_back(mop);
            auto [cs, cop] = a.post("node-b", clean.src, 0, clean.remote.id, 0, kBytes, 2);
            ASSERT_TRUE(cs.isOk()) << cs.message();
            clean_ops.push_back(cop);
            ASSERT_TRUE(a.sink.completion(mop, 30s).has_value()) << "a changed write never ended";
            ASSERT_TRUE(a.sink.completion(cop, 30s).has_value());
            if (round >= 2 &&
                peerStatus(node(1), "node-a")["chunks_data_changed"].get<uint64_t>() > 0) {
                break;
            }
        }
        scribbler.stop();
        for (uint64_t op : clean_ops) {
            auto done = a.sink.completion(op, 30s);
            ASSERT_TRUE(done.has_value());
            EXPECT_EQ(done->code, Code::kOk) << done->reason;
        }
        EXPECT_EQ(0, std::memcmp(clean.dst->base, clean.src->base, kBytes));
        EXPECT_EQ(peerStatus(a, "node-b")["state"], "up");
        EXPECT_EQ(peerLogCount({"authentication tag"}), drops)
            << "a writer's own buffer changes failed a frame's tag and dropped the session";
        // The changes did reach chunks on the way (else this test proved nothing).
        const uint64_t changed = peerStatus(node(1), "node-a")["chunks_data_changed"];
        EXPECT_GE(changed, 1u);
        // Every write ended exactly once; the changed ones failed, saying why, and only those
        // were not notified.
        size_t failed = 0;
        for (uint64_t op : messy_ops) {
            auto done = a.sink.completion(op, 1s);
            ASSERT_TRUE(done.has_value());
            if (done->code != Code::kOk) {
                ++failed;
                EXPECT_EQ(done->code, Code::kInvalid) << done->reason;
                EXPECT_NE(done->reason.find("did not match its tag"), std::string::npos);
            }
        }
        EXPECT_GE(failed, 1u);
        EXPECT_LE(failed, changed);
        EXPECT_EQ(a.sink.count(Event::Kind::kCompleted), messy_ops.size() + clean_ops.size());
        EXPECT_EQ(node(1).sink.count(Event::Kind::kArrived),
                  messy_ops.size() + clean_ops.size() - failed);
    }
}

TEST_F(PeerTcp, TargetRejectsWritesIntoRegionsItNoLongerExposes) {
    // The writer's descriptor is stale (the revocation has not reached it): the target itself
    // refuses the write, answers kNotFound, and writes nothing.
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    auto victim = b.addRegion(65536, "victim");
    fillRandom(victim->base, 65536, 8);
    std::vector<unsigned char> before(victim->base, victim->base + 65536);
    auto src = a.addRegion(65536);
    fillRandom(src->base, 65536, 9);
    auto [ls, remote] = a.lookup("node-b", "victim");
    ASSERT_TRUE(ls.isOk());
    // Removed from the table without telling the peers (as if the REGION_DEL were in flight).
    b.call([&] { return b.regions().remove(victim->id) != nullptr; });
    auto [ps, op] = a.post("node-b", src, 0, remote.id, 0, 65536, 1);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto c = a.sink.completion(op, 5s);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->code, Code::kNotFound) << c->reason;
    EXPECT_EQ(b.sink.count(Event::Kind::kArrived), 0u);
    EXPECT_EQ(0, std::memcmp(victim->base, before.data(), before.size()));

    // The session survives a rejected write: the next one to a live region succeeds.
    auto ok_dst = b.addRegion(4096, "alive");
    auto [ls2, remote2] = lookupEventually(a, "node-b", "alive");
    ASSERT_TRUE(ls2.isOk());
    auto [ps2, op2] = a.post("node-b", src, 0, remote2.id, 0, 4096, 2);
    ASSERT_TRUE(ps2.isOk());
    auto c2 = a.sink.completion(op2, 5s);
    ASSERT_TRUE(c2 && c2->code == Code::kOk);
    EXPECT_EQ(0, std::memcmp(ok_dst->base, src->base, 4096));
}

TEST_P(Peers, ThreeNodesWriteAllToAll) {
    startNodes(3);
    constexpr size_t kSlot = 1u << 20;
    std::vector<std::shared_ptr<Region>> inbox, outbox;
    for (size_t i = 0; i < 3; ++i) {
        inbox.push_back(node(i).addRegion(3 * kSlot, "inbox"));
        outbox.push_back(node(i).addRegion(kSlot));
        fillRandom(outbox[i]->base, kSlot, 100 + i);
    }
    std::vector<std::pair<size_t, uint64_t>> ops;
    for (size_t i = 0; i < 3; ++i) {
        for (size_t j = 0; j < 3; ++j) {
            if (i == j) {
                continue;
            }
            const std::string peer = std::string("node-") + static_cast<char>('a' + j);
            auto [ls, remote] = node(i).lookup(peer, "inbox");
            ASSERT_TRUE(ls.isOk()) << ls.message();
            auto [ps, op] = node(i).post(peer, outbox[i], 0, remote.id, i * kSlot, kSlot,
                                         static_cast<uint32_t>(i));
            ASSERT_TRUE(ps.isOk()) << ps.message();
            ops.emplace_back(i, op);
        }
    }
    for (auto &[i, op] : ops) {
        auto c = node(i).sink.completion(op, 10s);
        ASSERT_TRUE(c.has_value());
        EXPECT_EQ(c->code, Code::kOk) << c->reason;
    }
    for (size_t j = 0; j < 3; ++j) {
        // A writer's completion means its data is placed; the owner's notification follows (over
        // verbs, once the receiver polled the immediates), so wait for it.
        EXPECT_TRUE(node(j).sink.waitFor(
            [](const std::vector<Event> &ev) {
                return std::count_if(ev.begin(), ev.end(), [](const Event &e) {
                           return e.kind == Event::Kind::kArrived;
                       }) >= 2;
            },
            5s));
        auto arrivals = node(j).sink.arrivals();
        EXPECT_EQ(arrivals.size(), 2u);
        for (size_t i = 0; i < 3; ++i) {
            if (i != j) {
                EXPECT_EQ(0, std::memcmp(inbox[j]->base + i * kSlot, outbox[i]->base, kSlot));
                size_t from_i = 0;
                for (auto &e : arrivals) {
                    from_i += e.peer_name == std::string("node-") + static_cast<char>('a' + i);
                }
                EXPECT_EQ(from_i, 1u);
            }
        }
        EXPECT_EQ(node(j).sink.count(Event::Kind::kCompleted), 2u);
    }
}

TEST_P(Peers, ConnectEagerlyConnectsAtStart) {
    startNodes(2, [](config::Config &c) { c.node.connect_eagerly = true; });
    // Both directions come up with no lookup at all.
    ASSERT_TRUE(node(0).sink.waitFor(
        [](const std::vector<Event> &evs) {
            for (auto &e : evs) {
                if (e.kind == Event::Kind::kState && e.state == PeerState::kUp) {
                    return true;
                }
            }
            return false;
        },
        5s));
    ASSERT_TRUE(node(1).sink.waitFor(
        [](const std::vector<Event> &evs) {
            for (auto &e : evs) {
                if (e.kind == Event::Kind::kState && e.state == PeerState::kUp) {
                    return true;
                }
            }
            return false;
        },
        5s));
    EXPECT_EQ(node(0).state("node-b"), PeerState::kUp);
    EXPECT_EQ(node(1).state("node-a"), PeerState::kUp);
}

TEST_P(Peers, IdleManagerSleeps) {
    startNodes(2);
    node(1).addRegion(4096, "r");
    ASSERT_TRUE(node(0).lookup("node-b", "r").first.isOk());
    std::this_thread::sleep_for(300ms);
    const uint64_t before = node(0).wakeups();
    std::this_thread::sleep_for(1s);
    // Heartbeats both ways every 250 ms and their timers: a handful of wakeups, not a spin.
    EXPECT_LT(node(0).wakeups() - before, 40u);
}

}  // namespace
}  // namespace tensorlane::peertest

namespace tensorlane::peertest {
namespace {

using sidecar::kMaxMessageBytes;

std::vector<uint8_t> patterned(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) {
        v[i] = static_cast<uint8_t>(seed + i * 7);
    }
    return v;
}

TEST_P(Peers, SilentWritesAndMessagesKeepThePairsOrder) {
    // The engine's grouped writes and payloads stand on two things every transport does: a
    // silent write lands without a notification, and a message (bytes 0, up to
    // sidecar::kMaxMessageBytes of the engine's own) reaches the target after every write posted
    // before it has landed, verbatim.
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    constexpr size_t kRegion = 8u << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kRegion, "recv", 5, &l));
    auto &[src, dst, remote] = l;
    std::vector<unsigned char> before(dst->base, dst->base + kRegion);
    // At each message, whether the silent writes before it are in place.
    std::atomic<int> first_in_place{-1}, second_in_place{-1};
    b.sink.on_event = [&, d = dst, s = src](const Event &e) {
        if (e.kind != Event::Kind::kMessage) {
            return;
        }
        if (e.imm == 2) {
            first_in_place = std::memcmp(d->base, s->base, 3u << 20) == 0;
        } else if (e.imm == 5) {
            second_in_place = std::memcmp(d->base + (5u << 20), s->base + (5u << 20), 4096) == 0;
        }
    };
    const auto m1 = patterned(256, 1), m2 = patterned(sidecar::kMaxMessageBytes, 2),
               m3 = patterned(1, 3);
    std::vector<uint64_t> ops;
    auto post = [&](uint64_t off, uint64_t bytes, uint32_t imm, bool silent,
                    std::vector<uint8_t> msg) {
        auto [ps, op] = a.postOp("node-b", src, off, remote.id, off, bytes, imm, silent, msg);
        ASSERT_TRUE(ps.isOk()) << ps.message();
        ops.push_back(op);
    };
    ASSERT_NO_FATAL_FAILURE(post(0, 3u << 20, 1, true, {}));     // silent, striped
    ASSERT_NO_FATAL_FAILURE(post(100, 0, 2, false, m1));         // message after it
    ASSERT_NO_FATAL_FAILURE(post(4u << 20, 64, 3, false, {}));   // an ordinary write
    ASSERT_NO_FATAL_FAILURE(post(5u << 20, 4096, 4, true, {}));  // silent, small
    ASSERT_NO_FATAL_FAILURE(post(kRegion, 0, 5, false, m2));     // at the region's end
    ASSERT_NO_FATAL_FAILURE(post(7, 0, 6, false, m3));
    for (uint64_t op : ops) {
        auto c = a.sink.completion(op, 10s);
        ASSERT_TRUE(c.has_value()) << op;
        EXPECT_EQ(c->code, Code::kOk) << c->reason;
    }
    ASSERT_TRUE(b.sink.waitFor(
        [](const std::vector<Event> &ev) {
            return std::count_if(ev.begin(), ev.end(), [](const Event &e) {
                       return e.kind == Event::Kind::kMessage || e.kind == Event::Kind::kArrived;
                   }) >= 4;
        },
        5s));
    const auto got = b.sink.deliveries();
    ASSERT_EQ(got.size(), 4u) << "a silent write was notified, or a message lost";
    EXPECT_EQ(got[0].kind, Event::Kind::kMessage);
    EXPECT_EQ(got[0].imm, 2u);
    EXPECT_EQ(got[0].offset, 100u);
    EXPECT_EQ(got[0].message, m1);
    EXPECT_EQ(got[0].region, dst->id);
    EXPECT_EQ(got[0].peer_name, "node-a");
    EXPECT_EQ(got[1].kind, Event::Kind::kArrived);
    EXPECT_EQ(got[1].imm, 3u);
    EXPECT_EQ(got[2].kind, Event::Kind::kMessage);
    EXPECT_EQ(got[2].imm, 5u);
    EXPECT_EQ(got[2].offset, kRegion);
    EXPECT_EQ(got[2].message, m2);
    EXPECT_EQ(got[3].message, m3);
    EXPECT_EQ(first_in_place.load(), 1) << "the message came before the silent write landed";
    EXPECT_EQ(second_in_place.load(), 1);
    EXPECT_EQ(0, std::memcmp(dst->base, src->base, 3u << 20));
    EXPECT_EQ(0, std::memcmp(dst->base + (4u << 20), src->base + (4u << 20), 64));
    EXPECT_EQ(0, std::memcmp(dst->base + (5u << 20), src->base + (5u << 20), 4096));
    // A message writes no byte.
    EXPECT_EQ(0, std::memcmp(dst->base + (3u << 20), before.data() + (3u << 20), 1u << 20));
}

TEST_P(Peers, MessagesToRevokedRegionsOrPastTheEndFail) {
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(4096, "recv", 6, &l));
    auto &[src, dst, remote] = l;
    // Past the end, or too long: refused by the sender at once, or failed by the target.
    for (auto [off, len] :
         {std::pair<uint64_t, size_t>{4097, 8}, {0, sidecar::kMaxMessageBytes + 1}}) {
        auto [ps, op] = a.postOp("node-b", src, 0, remote.id, off, 0, 1, false, patterned(len, 1));
        if (ps.isOk()) {
            auto c = a.sink.completion(op, 10s);
            ASSERT_TRUE(c.has_value());
            EXPECT_NE(c->code, Code::kOk) << off << " " << len;
        }
    }
    b.revoke(dst->id);
    auto [ps, op] = a.postOp("node-b", src, 0, remote.id, 0, 0, 1, false, patterned(8, 1));
    if (ps.isOk()) {
        auto c = a.sink.completion(op, 10s);
        ASSERT_TRUE(c.has_value());
        EXPECT_EQ(c->code, Code::kNotFound) << c->reason;
    } else {
        EXPECT_EQ(ps.code(), Code::kNotFound) << ps.message();
    }
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(b.sink.deliveries().size(), 0u);
}

}  // namespace
}  // namespace tensorlane::peertest

namespace tensorlane::peertest {
namespace {

TEST_F(PeerTcp, AScatteredWriteLandsEachExtentAndOneOutsideTheRegionIsRefused) {
    // WriteOp::extents (a group's entries between two regions, as one op): each chunk says
    // where it lands; the target checks every one against the region.
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    constexpr size_t kRegion = 1 << 20;
    Linked l;
    ASSERT_NO_FATAL_FAILURE(link(kRegion, "recv", 9, &l));
    auto &[src, dst, remote] = l;
    std::vector<unsigned char> before(dst->base, dst->base + kRegion);
    auto postScatter = [&](std::vector<sidecar::Extent> ex) {
        uint64_t op_id = 0;
        Status st = PeerFixture::postScatter(l, std::move(ex), &op_id);
        EXPECT_TRUE(st.isOk()) << st.message();
        return op_id;
    };
    // 64 extents of 3000 bytes, landing in reverse order.
    std::vector<sidecar::Extent> ex;
    for (uint64_t i = 0; i < 64; ++i) {
        ex.push_back({i * 3000, (63 - i) * 3000, 3000});
    }
    auto c = a.sink.completion(postScatter(ex), 10s);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->code, Code::kOk) << c->reason;
    for (uint64_t i = 0; i < 64; ++i) {
        ASSERT_EQ(0, std::memcmp(dst->base + (63 - i) * 3000, src->base + i * 3000, 3000)) << i;
    }
    EXPECT_EQ(0,
              std::memcmp(dst->base + 64 * 3000, before.data() + 64 * 3000, kRegion - 64 * 3000));
    EXPECT_TRUE(b.sink.deliveries().empty()) << "a scattered write is silent";
    // An extent past the region's end: the target refuses the write; the bytes of the good
    // extent before it may land, but nothing lands outside.
    std::vector<unsigned char> now(dst->base, dst->base + kRegion);
    auto bad = a.sink.completion(postScatter({{0, 500000, 1000}, {1000, kRegion - 10, 1000}}), 10s);
    ASSERT_TRUE(bad.has_value());
    EXPECT_EQ(bad->code, Code::kNotFound) << bad->reason;
    EXPECT_EQ(0, std::memcmp(dst->base + kRegion - 10, now.data() + kRegion - 10, 10));
    EXPECT_EQ(peerStatus(a, "node-b")["state"], "up") << "the session survives";
}

// Small extents travel packed, several to a chunk behind a table (kChunkPacked); extents of
// 256 KiB and more go alone, one range a chunk, cut where they exceed a chunk. A write mixing
// them, in a shuffled order at the target, lands every byte where its extent says: with the
// tags checked on the engine thread, by tag workers (which land packed chunks themselves), and
// without tags (packed chunks are read into a buffer all the same).
class PeerTcpPacked : public PeerTcp {
protected:
    void mixedScatter(const std::function<void(config::Config &)> &tweak) {
        startNodes(2, tweak);
        Node &a = node(0);
        constexpr size_t kRegion = 8 << 20;
        Linked l;
        ASSERT_NO_FATAL_FAILURE(link(kRegion, "recv", 9, &l));
        auto &[src, dst, remote] = l;
        for (size_t i = 0; i < kRegion; ++i) {
            src->base[i] = static_cast<unsigned char>(i * 7 + i / 4093);
        }
        std::memset(dst->base, 0, kRegion);
        std::vector<uint64_t> sizes;
        for (int i = 0; i < 300; ++i) {
            sizes.push_back(1 + (i * 997) % 20000);  // small: packed
        }
        sizes.insert(sizes.begin() + 10, 300 << 10);       // alone
        sizes.insert(sizes.begin() + 150, (1 << 20) + 5);  // alone, cut in two
        sizes.push_back(70000);                            // the last, small: alone
        std::vector<sidecar::Extent> ex;
        uint64_t at = 0;
        for (uint64_t n : sizes) {
            ex.push_back({at, 0, n});
            at += n + 13;
        }
        // Targets: the same ranges in reverse order of the sources, 11 bytes apart.
        uint64_t put = 0;
        for (size_t i = ex.size(); i-- > 0;) {
            ex[i].dst_offset = put;
            put += ex[i].bytes + 11;
        }
        ASSERT_LE(at, kRegion);
        ASSERT_LE(put, kRegion);
        uint64_t op_id = 0;
        Status st = PeerFixture::postScatter(l, ex, &op_id);
        ASSERT_TRUE(st.isOk()) << st.message();
        auto c = a.sink.completion(op_id, 20s);
        ASSERT_TRUE(c.has_value());
        EXPECT_EQ(c->code, Code::kOk) << c->reason;
        std::vector<uint8_t> want(kRegion, 0);
        for (const auto &e : ex) {
            std::memcpy(want.data() + e.dst_offset, src->base + e.src_offset, e.bytes);
        }
        for (size_t i = 0; i < kRegion; ++i) {
            ASSERT_EQ(dst->base[i], want[i]) << "byte " << i;
        }
    }
};

TEST_F(PeerTcpPacked, AScatteredWriteOfMixedSizesPacksTheSmallExtentsAndLandsEveryByte) {
    mixedScatter({});
}

TEST_F(PeerTcpPacked, PackedChunksLandWhenTagWorkersCheckThem) {
    mixedScatter([](config::Config &c) { c.tcp.tag_threads = 2; });
}

TEST_F(PeerTcpPacked, PackedChunksLandWithoutTags) {
    mixedScatter([](config::Config &c) { c.security.tcp_integrity = config::TcpIntegrity::kNone; });
}

/// What only the verbs transport does (on the simulated HCA).
class PeerVerbs : public PeerFixture, public ::testing::Test {
protected:
    std::string transport() const override { return "verbs"; }
    void SetUp() override {
        ASSERT_TRUE(simulatedHcaLoaded())
            << "the verbs cases need the simulated HCA: run with LD_LIBRARY_PATH at its "
               "directory (ctest sets it)";
    }
};

// A receiving session torn down (a GID change, a failed channel, a peer's new session) takes its
// QPs to ERR at once. Until it did, they stayed RTS until destroyed at the end of the engine's
// next turn, after the one drain of their CQ: a write acknowledged in between told its writer OK
// and its owner nothing (the soak's "OK write never notified", a verbs pair, once). Here both
// engines stand still from the close on, so the writer has not heard of it (the close of the
// verbs channel waits in its socket) when it posts: the write can only meet the closed QPs, and
// must land no byte, end with an error and notify nobody.
TEST_F(PeerVerbs, AWriteReachingAClosedReceivingSessionIsRefusedAndLandsNothing) {
    startNodes(2);
    Node &a = node(0);
    Node &b = node(1);
    Linked l;
    link(8192, "recv", 7, &l);
    auto [s1, op1] = a.post("node-b", l.src, 0, l.remote.id, 0, 64, 1);
    ASSERT_TRUE(s1.isOk()) << s1.message();
    auto c1 = a.sink.completion(op1, 5s);
    ASSERT_TRUE(c1.has_value());
    ASSERT_EQ(c1->code, Code::kOk) << c1->reason;
    const auto hasArrival = [](const std::vector<Event> &ev, uint32_t imm) {
        return std::any_of(ev.begin(), ev.end(), [imm](const Event &e) {
            return e.kind == Event::Kind::kArrived && e.imm == imm;
        });
    };
    ASSERT_TRUE(
        b.sink.waitFor([&](const std::vector<Event> &ev) { return hasArrival(ev, 1); }, 5s));

    a.pause(true);
    b.pause(true);
    const bool closed = b.call([&b] {
        auto id = b.pm().peerByName("node-a");
        for (sidecar::Transport *t : b.transports().remote()) {
            if (id && std::string_view(t->name()) == "verbs") {
                t->closeSession(*id, sidecar::SessionSide::kIn, Code::kPeer, "closed by the test");
                return true;
            }
        }
        return false;
    });
    ASSERT_TRUE(closed) << "node-b has no verbs transport";
    const std::vector<unsigned char> before(l.dst->base, l.dst->base + 8192);

    auto [s2, op2] = a.post("node-b", l.src, 4096, l.remote.id, 4096, 512, 2);
    ASSERT_TRUE(s2.isOk()) << s2.message();
    // On the wire at once (the simulated HCA has threads of its own); an acknowledging QP would
    // have placed the bytes within a millisecond.
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(0, std::memcmp(l.dst->base, before.data(), before.size()))
        << "a write landed through a closed receiving session";
    a.pause(false);
    b.pause(false);
    auto c2 = a.sink.completion(op2, 10s);
    ASSERT_TRUE(c2.has_value()) << "the write never ended";
    EXPECT_NE(c2->code, Code::kOk) << c2->reason;
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(hasArrival(b.sink.events(), 2))
        << "node-b was told of a write its session had refused";
}

}  // namespace
}  // namespace tensorlane::peertest
