// Several sidecar processes as nodes on loopback (and in network namespaces), with worker
// processes: all-to-all writes, a bad key, hostile bootstrap connections, peers that die,
// restart, or lose their link.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <atomic>
#include <deque>
#include <memory>
#include <thread>

#include "harness.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/tensorlane.hpp"

using namespace tltest;
namespace ipc = tensorlane::ipc;

namespace {

/// N sidecars that all list each other as peers, sharing one key; over tcp, or over the verbs
/// transport on the simulated HCA (each node its own simulated device and loopback address).
class Cluster {
public:
    explicit Cluster(int n, const std::string &transport = "tcp",
                     const std::string &key_text = keyText('c'),
                     const std::string &poll_mode = "adaptive")
        : transport_(transport), poll_mode_(poll_mode) {
        key_ = dir_.file("peer.key");
        writeFile(key_, key_text, 0600);
        for (int i = 0; i < n; ++i) {
            names_.push_back(std::string("node-") + static_cast<char>('a' + i));
            ports_.push_back(freePort());
        }
        for (int i = 0; i < n; ++i) {
            nodes_.push_back(std::make_unique<Sidecar>(options(i)));
        }
    }
    SidecarOptions options(int i) const {
        SidecarOptions o;
        o.name = names_[i];
        o.listen = "127.0.0.1:" + std::to_string(ports_[i]);
        o.key_file = key_;
        o.tcp = kFastFailureTcp;
        o.transport = transport_;
        o.poll_mode = poll_mode_;
        o.rdma_ip = uniqueLoopback(10 + i);
        // Fast failure detection on verbs too: 4.096 us * 2^14 = 67 ms per try, 3 tries.
        o.fabric = "timeout = 14\nretry_cnt = 3\n";
        for (size_t j = 0; j < names_.size(); ++j) {
            if (static_cast<int>(j) != i) {
                o.peers.push_back({names_[j], "127.0.0.1:" + std::to_string(ports_[j])});
            }
        }
        return o;
    }
    Sidecar &node(int i) { return *nodes_[i]; }
    const std::string &name(int i) const { return names_[i]; }
    uint16_t port(int i) const { return ports_[i]; }
    int size() const { return static_cast<int>(nodes_.size()); }
    std::string logs() {
        std::string all;
        for (auto &n : nodes_) {
            all += n->log().substr(0, 6000);
        }
        return all;
    }

private:
    std::string transport_;
    std::string poll_mode_;
    TempDir dir_;
    std::string key_;
    std::vector<std::string> names_;
    std::vector<uint16_t> ports_;
    std::vector<std::unique_ptr<Sidecar>> nodes_;
};

/// Retries a lookup across nodes: the peer may still be connecting or its worker exposing.
tl_status lookupRemote(tl_client *c, const std::string &peer, const std::string &name,
                       tl_remote *out, uint64_t *bytes = nullptr,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        tl_status s = tl_lookup(c, peer.c_str(), name.c_str(), out, bytes);
        if (s == TL_OK || std::chrono::steady_clock::now() > end ||
            (s != TL_ENOENT && s != TL_EPEER)) {
            return s;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

/// The multi-node tests run over each transport.
class MultiNode : public ::testing::TestWithParam<std::string> {};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Transports, MultiNode, ::testing::Values("tcp", "verbs"),
                         [](const auto &param_info) { return param_info.param; });

TEST_P(MultiNode, ThreeNodesAllToAllExactlyOnce) {
    constexpr int kNodes = 3;
    constexpr size_t kSlot = 1 << 20;
    constexpr int kRounds = 20;
    // Slots per writer in each inbox, used in turn. A worker waits for two notifications a
    // round, so it can run up to two rounds ahead of the slowest reader: with fewer than four
    // slots a writer could overwrite a slot its reader is still checking.
    constexpr int kLanes = 4;
    Cluster cluster(kNodes, GetParam());
    for (int i = 0; i < kNodes; ++i) {
        ASSERT_TRUE(cluster.node(i).ready()) << cluster.node(i).log();
    }
    std::vector<pid_t> workers;
    for (int me = 0; me < kNodes; ++me) {
        workers.push_back(forkClient([&, me]() -> int {
            tl_client *c = nullptr;
            if (tl_connect(cluster.node(me).socket().c_str(), &c) != TL_OK) {
                return 1;
            }
            // Inbox: kLanes slots per writer node, taken in turn by round.
            void *inbox = nullptr, *src = nullptr;
            tl_region rin = 0, rsrc = 0;
            if (tl_alloc_host(c, kSlot * kNodes * kLanes, &inbox, &rin) != TL_OK ||
                tl_alloc_host(c, kSlot * kLanes, &src, &rsrc) != TL_OK) {
                return 2;
            }
            std::memset(inbox, 0, kSlot * kNodes * kLanes);
            if (tl_expose(c, rin, "inbox") != TL_OK) {
                return 3;
            }
            std::vector<tl_remote> remotes(kNodes);
            for (int p = 0; p < kNodes; ++p) {
                if (p != me && lookupRemote(c, cluster.name(p), "inbox", &remotes[p]) != TL_OK) {
                    std::fprintf(stderr, "lookup %d->%d: %s\n", me, p, tl_last_error());
                    return 4;
                }
            }
            std::vector<int> next_round(kNodes, 0);
            for (int round = 0; round < kRounds; ++round) {
                fillRandom(static_cast<char *>(src) + (round % kLanes) * kSlot, kSlot,
                           me * 1000 + round);
                std::vector<tl_ticket> tickets;
                for (int p = 0; p < kNodes; ++p) {
                    if (p == me) {
                        continue;
                    }
                    tl_ticket t = 0;
                    uint64_t off = (me * kLanes + round % kLanes) * kSlot;
                    if (tl_write(c, rsrc, (round % kLanes) * kSlot, remotes[p], off, kSlot,
                                 static_cast<uint32_t>(me << 16 | round), &t) != TL_OK) {
                        return 5;
                    }
                    tickets.push_back(t);
                }
                for (tl_ticket t : tickets) {
                    if (tl_wait(c, t, 20000) != TL_OK) {
                        std::fprintf(stderr, "wait: %s\n", tl_last_error());
                        return 6;
                    }
                    if (tl_wait(c, t, 0) != TL_ENOENT) {
                        return 7;  // a ticket ends exactly once
                    }
                }
                // One notification from each other node for this round.
                for (int k = 0; k < kNodes - 1; ++k) {
                    tl_notification n{};
                    if (tl_status ns = tl_wait_notification(c, &n, 20000); ns != TL_OK) {
                        std::fprintf(stderr, "wait_notification: %s: %s\n", tl_status_str(ns),
                                     tl_last_error());
                        return 8;
                    }
                    int from = static_cast<int>(n.imm >> 16);
                    int r = static_cast<int>(n.imm & 0xffff);
                    if (from < 0 || from >= kNodes || from == me || r != next_round[from] ||
                        cluster.name(from) != n.peer || n.bytes != kSlot) {
                        return 9;
                    }
                    ++next_round[from];
                    std::vector<unsigned char> expect(kSlot);
                    fillRandom(expect.data(), kSlot, from * 1000 + r);
                    if (std::memcmp(static_cast<char *>(inbox) + n.offset, expect.data(), kSlot) !=
                        0) {
                        std::fprintf(stderr, "node %d: data from %d round %d at %llu differs\n", me,
                                     from, r, static_cast<unsigned long long>(n.offset));
                        return 10;
                    }
                }
            }
            tl_notification extra{};
            if (tl_wait_notification(c, &extra, 300) != TL_ETIMEDOUT) {
                return 11;  // nothing beyond what was written
            }
            tl_disconnect(c);
            return 0;
        }));
    }
    for (pid_t p : workers) {
        EXPECT_EQ(waitChild(p), 0) << cluster.logs();
    }
    // The sessions really used the transport under test (verbs: RC QPs on the simulated HCA).
    for (int i = 0; i < kNodes; ++i) {
        EXPECT_TRUE(cluster.node(i).logHas(" over " + GetParam() + " (session"))
            << cluster.node(i).log().substr(0, 4000);
    }
}

// Busy mode arms no CQ and reads no completion channel (the verbs transport polls its CQs on
// every turn instead): every write still lands once, in order, intact, and completes, also the
// ones striped over both QPs, in both directions at once.
TEST(MultiNodeVerbs, BusyPollModeWritesLandOnceInOrderBothWays) {
    constexpr int kWrites = 48;
    constexpr uint64_t kSizes[] = {64, 4096, 300 * 1024};  // the last one is striped
    constexpr uint64_t kMax = 300 * 1024;
    constexpr int kWindow = 6;
    Cluster cluster(2, "verbs", keyText('c'), "busy");
    for (int i = 0; i < 2; ++i) {
        ASSERT_TRUE(cluster.node(i).ready()) << cluster.node(i).log();
    }
    std::vector<pid_t> workers;
    for (int me = 0; me < 2; ++me) {
        workers.push_back(forkClient([&, me]() -> int {
            tl_client *c = nullptr;
            if (tl_connect(cluster.node(me).socket().c_str(), &c) != TL_OK) {
                return 1;
            }
            // The inbox has a slot per write: nothing is overwritten before it is checked.
            void *inbox = nullptr, *src = nullptr;
            tl_region rin = 0, rsrc = 0;
            if (tl_alloc_host(c, kMax * kWrites, &inbox, &rin) != TL_OK ||
                tl_alloc_host(c, kMax * kWrites, &src, &rsrc) != TL_OK ||
                tl_expose(c, rin, "inbox") != TL_OK) {
                return 2;
            }
            for (int i = 0; i < kWrites; ++i) {
                fillRandom(static_cast<char *>(src) + i * kMax, kSizes[i % 3], me * 1000 + i);
            }
            tl_remote dst = 0;
            if (lookupRemote(c, cluster.name(1 - me), "inbox", &dst) != TL_OK) {
                return 3;
            }
            std::deque<tl_ticket> tickets;
            int received = 0;
            auto takeNotifications = [&](int timeout_ms) -> int {
                tl_notification n{};
                while (tl_wait_notification(c, &n, timeout_ms) == TL_OK) {
                    const int i = static_cast<int>(n.imm);
                    if (i != received || n.offset != static_cast<uint64_t>(i) * kMax ||
                        n.bytes != kSizes[i % 3] || n.peer != cluster.name(1 - me)) {
                        std::fprintf(stderr, "node %d: notification %d: imm %u, %llu bytes\n", me,
                                     received, n.imm, static_cast<unsigned long long>(n.bytes));
                        return 20;
                    }
                    std::vector<unsigned char> expect(n.bytes);
                    fillRandom(expect.data(), n.bytes, (1 - me) * 1000 + i);
                    if (std::memcmp(static_cast<char *>(inbox) + n.offset, expect.data(),
                                    n.bytes) != 0) {
                        return 21;
                    }
                    ++received;
                    timeout_ms = 0;
                }
                return 0;
            };
            for (int i = 0; i < kWrites; ++i) {
                while (tickets.size() >= kWindow) {
                    if (tl_wait(c, tickets.front(), 20000) != TL_OK) {
                        std::fprintf(stderr, "wait: %s\n", tl_last_error());
                        return 4;
                    }
                    tickets.pop_front();
                }
                tl_ticket t = 0;
                if (tl_write(c, rsrc, i * kMax, dst, i * kMax, kSizes[i % 3],
                             static_cast<uint32_t>(i), &t) != TL_OK) {
                    return 5;
                }
                tickets.push_back(t);
                if (int rc = takeNotifications(0); rc != 0) {
                    return rc;
                }
            }
            for (tl_ticket t : tickets) {
                if (tl_wait(c, t, 20000) != TL_OK) {
                    return 6;
                }
            }
            while (received < kWrites) {
                const int before = received;
                if (int rc = takeNotifications(20000); rc != 0) {
                    return rc;
                }
                if (received == before) {
                    std::fprintf(stderr, "node %d: %d of %d notifications\n", me, received,
                                 kWrites);
                    return 7;
                }
            }
            tl_notification extra{};
            if (tl_wait_notification(c, &extra, 300) != TL_ETIMEDOUT) {
                return 8;  // nothing beyond what was written
            }
            tl_disconnect(c);
            return 0;
        }));
    }
    for (pid_t p : workers) {
        EXPECT_EQ(waitChild(p), 0) << cluster.logs();
    }
    for (int i = 0; i < 2; ++i) {
        EXPECT_TRUE(cluster.node(i).logHas(" over verbs (session"))
            << cluster.node(i).log().substr(0, 4000);
    }
}

TEST(MultiNodeTcp, WrongKeyIsRefused) {
    TempDir dir;
    std::string key_a = dir.file("a.key"), key_b = dir.file("b.key");
    writeFile(key_a, keyText('a'), 0600);
    writeFile(key_b, keyText('b'), 0600);
    uint16_t pa = freePort(), pb = freePort();
    SidecarOptions a{.name = "node-a",
                     .listen = "127.0.0.1:" + std::to_string(pa),
                     .peers = {{"node-b", "127.0.0.1:" + std::to_string(pb)}},
                     .key_file = key_a,
                     .tcp = kFastFailureTcp};
    SidecarOptions b{.name = "node-b",
                     .listen = "127.0.0.1:" + std::to_string(pb),
                     .peers = {{"node-a", "127.0.0.1:" + std::to_string(pa)}},
                     .key_file = key_b,
                     .tcp = kFastFailureTcp};
    Sidecar sa(a), sb(b);
    ASSERT_TRUE(sa.ready() && sb.ready());
    auto cb = tensorlane::Client::connect(sb.socket());
    ASSERT_TRUE(cb.ok());
    auto region = cb->allocHost(4096);
    ASSERT_TRUE(region.ok() && region->expose("inbox").ok());
    auto ca = tensorlane::Client::connect(sa.socket());
    ASSERT_TRUE(ca.ok());
    tl_remote r = 0;
    tl_status s = tl_lookup(ca->get(), "node-b", "inbox", &r, nullptr);
    EXPECT_EQ(s, TL_EPEER) << tl_last_error();
    EXPECT_TRUE(sa.alive() && sb.alive());
    // Both ends say why (the sidecars log asynchronously: allow the line a moment).
    EXPECT_TRUE(sa.logHas("authentication failed") && sb.logHas("authentication failed"))
        << sa.log().substr(0, 3000) << sb.log().substr(0, 3000);
}

TEST_P(MultiNode, GarbageAndSlowBootstrapConnectionsAreDropped) {
    Cluster cluster(2, GetParam());
    ASSERT_TRUE(cluster.node(0).ready() && cluster.node(1).ready());
    auto connectTo = [&](uint16_t port) {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
        return fd;
    };
    // Random bytes, a half-open connection that says nothing, and a byte-per-200ms talker.
    std::vector<int> hostile;
    for (int i = 0; i < 5; ++i) {
        int fd = connectTo(cluster.port(1));
        unsigned char junk[4096];
        fillRandom(junk, sizeof(junk), i);
        [[maybe_unused]] ssize_t n = ::send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
        hostile.push_back(fd);
    }
    int silent = connectTo(cluster.port(1));
    int slow = connectTo(cluster.port(1));
    std::atomic<bool> slow_dropped{false};
    std::thread slow_talker([&] {
        for (int i = 0; i < 100; ++i) {
            char b = static_cast<char>(i);
            if (::send(slow, &b, 1, MSG_NOSIGNAL) < 0) {
                slow_dropped = true;
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
    });
    // Meanwhile the good peer works.
    {
        auto cb = tensorlane::Client::connect(cluster.node(1).socket());
        auto ca = tensorlane::Client::connect(cluster.node(0).socket());
        ASSERT_TRUE(ca.ok() && cb.ok());
        auto inbox = cb->allocHost(1 << 16);
        auto src = ca->allocHost(1 << 16);
        ASSERT_TRUE(inbox.ok() && src.ok() && inbox->expose("inbox").ok());
        tl_remote r = 0;
        ASSERT_EQ(lookupRemote(ca->get(), "node-b", "inbox", &r), TL_OK) << tl_last_error();
        fillRandom(src->data(), 1 << 16, 77);
        tl_ticket t = 0;
        ASSERT_EQ(tl_write(ca->get(), src->id(), 0, r, 0, 1 << 16, 5, &t), TL_OK);
        EXPECT_EQ(tl_wait(ca->get(), t, 10000), TL_OK) << tl_last_error();
        EXPECT_EQ(std::memcmp(src->data(), inbox->data(), 1 << 16), 0);
    }
    // Every hostile connection is closed by the sidecar within its handshake bound.
    auto closedByPeer = [](int fd) {
        char b;
        ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    };
    EXPECT_TRUE(eventually(
        [&] {
            for (int fd : hostile) {
                if (!closedByPeer(fd)) {
                    return false;
                }
            }
            return closedByPeer(silent);
        },
        std::chrono::seconds(15)));
    slow_talker.join();
    EXPECT_TRUE(slow_dropped.load() || closedByPeer(slow));
    for (int fd : hostile) {
        ::close(fd);
    }
    ::close(silent);
    ::close(slow);
    EXPECT_TRUE(cluster.node(1).alive());
}

TEST_P(MultiNode, PeerKilledAndRestartedDuringTraffic) {
    Cluster cluster(2, GetParam());
    ASSERT_TRUE(cluster.node(0).ready() && cluster.node(1).ready());
    // A receiver worker on node-b that (re)exposes its inbox whenever it can.
    auto startReceiver = [&] {
        return forkClient([&]() -> int {
            for (;;) {
                tl_client *c = nullptr;
                if (tl_connect(cluster.node(1).socket().c_str(), &c) != TL_OK) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    continue;
                }
                void *p = nullptr;
                tl_region r = 0;
                if (tl_alloc_host(c, 1 << 20, &p, &r) == TL_OK &&
                    tl_expose(c, r, "inbox") == TL_OK) {
                    tl_notification n;
                    while (tl_wait_notification(c, &n, 1000) != TL_ECONN) {
                    }
                }
                tl_disconnect(c);
            }
        });
    };
    pid_t receiver = startReceiver();
    auto ca = tensorlane::Client::connect(cluster.node(0).socket());
    ASSERT_TRUE(ca.ok());
    auto src = ca->allocHost(1 << 20);
    ASSERT_TRUE(src.ok());
    fillRandom(src->data(), 1 << 20, 1);
    tl_remote r = 0;
    ASSERT_EQ(lookupRemote(ca->get(), "node-b", "inbox", &r), TL_OK) << tl_last_error();
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(ca->get(), src->id(), 0, r, 0, 1 << 20, 1, &t), TL_OK);
    ASSERT_EQ(tl_wait(ca->get(), t, 10000), TL_OK) << tl_last_error();

    // Traffic in flight, then node-b dies.
    std::vector<tl_ticket> tickets;
    for (int i = 0; i < 16; ++i) {
        if (tl_write(ca->get(), src->id(), 0, r, 0, 1 << 20, i, &t) == TL_OK) {
            tickets.push_back(t);
        }
    }
    auto killed_at = std::chrono::steady_clock::now();
    cluster.node(1).kill(SIGKILL);
    int failed = 0, ok = 0;
    for (tl_ticket tk : tickets) {
        tl_status s = tl_wait(ca->get(), tk, 20000);
        ASSERT_TRUE(s == TL_OK || s == TL_EPEER) << tl_status_str(s);
        (s == TL_OK ? ok : failed)++;
    }
    auto took = std::chrono::steady_clock::now() - killed_at;
    EXPECT_LT(took, std::chrono::milliseconds(kPeerTimeoutMs + 1500));
    // New writes fail fast while it is down.
    auto t0 = std::chrono::steady_clock::now();
    tl_status s = tl_write(ca->get(), src->id(), 0, r, 0, 4096, 99, &t);
    if (s == TL_OK) {
        s = tl_wait(ca->get(), t, 20000);
    }
    EXPECT_TRUE(s == TL_EPEER || s == TL_ENOENT) << tl_status_str(s);
    EXPECT_LT(std::chrono::steady_clock::now() - t0,
              std::chrono::milliseconds(kPeerTimeoutMs + 500));

    // node-b comes back (a new process, new region ids); the worker on node-a is not restarted.
    cluster.node(1).start();
    ASSERT_TRUE(cluster.node(1).ready());
    bool succeeded = false;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!succeeded && std::chrono::steady_clock::now() < end) {
        tl_remote fresh = 0;
        if (lookupRemote(ca->get(), "node-b", "inbox", &fresh, nullptr, std::chrono::seconds(2)) ==
                TL_OK &&
            tl_write(ca->get(), src->id(), 0, fresh, 0, 1 << 20, 7, &t) == TL_OK &&
            tl_wait(ca->get(), t, 5000) == TL_OK) {
            succeeded = true;
        }
    }
    EXPECT_TRUE(succeeded) << cluster.logs();
    ::kill(receiver, SIGKILL);
    waitChild(receiver);
}

TEST_P(MultiNode, SidecarRestartWorkersReconnect) {
    Cluster cluster(2, GetParam());
    ASSERT_TRUE(cluster.node(0).ready() && cluster.node(1).ready());
    auto cb = tensorlane::Client::connect(cluster.node(1).socket());
    ASSERT_TRUE(cb.ok());
    auto inbox = cb->allocHost(1 << 16);
    ASSERT_TRUE(inbox.ok() && inbox->expose("inbox").ok());
    tl_client *ca = nullptr;
    ASSERT_EQ(tl_connect(cluster.node(0).socket().c_str(), &ca), TL_OK);
    // node-a restarts under its worker.
    cluster.node(0).kill(SIGKILL);
    tl_ticket t = 0;
    EXPECT_EQ(tl_nop(ca, &t) == TL_OK ? tl_wait(ca, t, 5000) : TL_ECONN, TL_ECONN);
    tl_disconnect(ca);
    cluster.node(0).start();
    ASSERT_TRUE(cluster.node(0).ready());
    // The worker connects again, registers again, and writes again.
    ASSERT_EQ(tl_connect(cluster.node(0).socket().c_str(), &ca), TL_OK);
    void *p = nullptr;
    tl_region src = 0;
    ASSERT_EQ(tl_alloc_host(ca, 1 << 16, &p, &src), TL_OK);
    fillRandom(p, 1 << 16, 9);
    tl_remote r = 0;
    ASSERT_EQ(lookupRemote(ca, "node-b", "inbox", &r), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_write(ca, src, 0, r, 0, 1 << 16, 3, &t), TL_OK);
    EXPECT_EQ(tl_wait(ca, t, 10000), TL_OK) << tl_last_error();
    EXPECT_EQ(std::memcmp(p, inbox->data(), 1 << 16), 0);
    tl_disconnect(ca);
}

TEST(MultiNodeTcp, VerbsByNameWithoutADeviceIsRefusedNotSilentlyReplaced) {
    // No RDMA device on this host (no TENSORLANE_SYSFS_ROOT tree): asking for verbs by name must
    // fail loudly at start, never fall back to tcp.
    SidecarOptions o{.name = "node-a",
                     .listen = "127.0.0.1:" + std::to_string(freePort()),
                     .peers = {{"node-b", "127.0.0.1:" + std::to_string(freePort())}},
                     .transport = "verbs"};
    Sidecar sc(o);
    EXPECT_FALSE(sc.ready());
    EXPECT_FALSE(sc.alive());
    EXPECT_TRUE(sc.logHas("transport = \"verbs\", but the fabric is unusable")) << sc.log();
}

namespace {

/// A memfd of `bytes` zeros, mapped: the stand-in for a device's dma-buf (the simulated HCA
/// registers memfd-backed dma-bufs as the kernel registers udmabufs).
struct MemfdBuffer {
    ipc::UniqueFd fd;
    void *map = MAP_FAILED;
    size_t bytes = 0;
    explicit MemfdBuffer(size_t n) : fd(::memfd_create("tl-dmabuf", MFD_CLOEXEC)), bytes(n) {
        if (fd && ::ftruncate(fd.get(), static_cast<off_t>(n)) == 0) {
            map = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
        }
    }
    ~MemfdBuffer() {
        if (map != MAP_FAILED) {
            ::munmap(map, bytes);
        }
    }
    bool ok() const { return map != MAP_FAILED; }
    unsigned char *data() const { return static_cast<unsigned char *>(map); }
};

}  // namespace

// tl_register_dmabuf (what NCCL's regMrDmaBuf hands a net plugin): the sidecar never maps the
// memory, so a write lands in it over verbs (the NIC registers the dma-buf) and nowhere else,
// and a write out of it leaves over verbs only; over tcp both fail with TL_ECUDA, and the
// memory is untouched.
TEST_P(MultiNode, DmabufRegionIsReachedByVerbsOnly) {
    const bool verbs = GetParam() == "verbs";
    Cluster cluster(2, GetParam());
    for (int i = 0; i < 2; ++i) {
        ASSERT_TRUE(cluster.node(i).ready()) << cluster.node(i).log();
    }
    constexpr size_t kBuf = 64 * 1024, kOffset = 4096 + 100, kRegion = 16384, kWrite = 8192;
    MemfdBuffer buf(kBuf);
    ASSERT_TRUE(buf.ok());
    fillRandom(buf.data() + kBuf - 4096, 4096, 77);  // the source of the outbound write
    auto ca = tensorlane::Client::connect(cluster.node(0).socket());
    auto cb = tensorlane::Client::connect(cluster.node(1).socket());
    ASSERT_TRUE(ca.ok() && cb.ok());
    tensorlane::Client &a = *ca, &b = *cb;
    auto in = a.registerDmabuf(buf.fd.get(), kOffset, kRegion);
    ASSERT_TRUE(in.ok()) << in.error().detail;
    EXPECT_EQ(in->data(), nullptr);
    ASSERT_TRUE(in->expose("dmabuf-in").ok());
    auto out = a.registerDmabuf(buf.fd.get(), kBuf - 4096, 4096);
    ASSERT_TRUE(out.ok()) << out.error().detail;
    auto src_r = b.allocHost(kWrite);
    ASSERT_TRUE(src_r.ok());
    tensorlane::Region &src = *src_r;
    fillRandom(src.data(), kWrite, 5);
    auto inbox_r = b.allocHost(4096);
    ASSERT_TRUE(inbox_r.ok());
    tensorlane::Region &inbox = *inbox_r;
    ASSERT_TRUE(inbox.expose("host-in").ok());

    tl_remote dst = 0;
    ASSERT_EQ(lookupRemote(b.get(), cluster.name(0), "dmabuf-in", &dst), TL_OK) << tl_last_error();
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(b.get(), src.id(), 0, dst, 100, kWrite, 7, &t), TL_OK);
    const tl_status landed = tl_wait(b.get(), t, 20000);
    std::vector<unsigned char> expect(kWrite);
    fillRandom(expect.data(), kWrite, 5);
    if (verbs) {
        ASSERT_EQ(landed, TL_OK) << tl_last_error() << cluster.logs();
        tl_notification n{};
        ASSERT_EQ(tl_wait_notification(a.get(), &n, 20000), TL_OK);
        EXPECT_EQ(n.imm, 7u);
        EXPECT_EQ(n.offset, 100u);
        EXPECT_EQ(n.bytes, kWrite);
        EXPECT_EQ(std::memcmp(buf.data() + kOffset + 100, expect.data(), kWrite), 0);
    } else {
        EXPECT_EQ(landed, TL_ECUDA) << tl_last_error();
    }
    // Not a byte outside the write (over tcp: not a byte at all).
    for (size_t i = 0; i < kBuf - 4096; ++i) {
        const bool written = verbs && i >= kOffset + 100 && i < kOffset + 100 + kWrite;
        if (!written) {
            ASSERT_EQ(buf.data()[i], 0) << "byte " << i;
        }
    }

    // Out of the dma-buf region, into a host region of the other node.
    tl_remote host_in = 0;
    ASSERT_EQ(lookupRemote(a.get(), cluster.name(1), "host-in", &host_in), TL_OK)
        << tl_last_error();
    ASSERT_EQ(tl_write(a.get(), out->id(), 0, host_in, 0, 4096, 8, &t), TL_OK);
    const tl_status sent = tl_wait(a.get(), t, 20000);
    if (verbs) {
        ASSERT_EQ(sent, TL_OK) << tl_last_error();
        EXPECT_EQ(std::memcmp(inbox.data(), buf.data() + kBuf - 4096, 4096), 0);
    } else {
        EXPECT_EQ(sent, TL_ECUDA) << tl_last_error();
        EXPECT_NE(std::string(tl_last_error()).find("only the verbs transport reaches"),
                  std::string::npos)
            << tl_last_error();
    }
}

// On one node the local transport copies through the sidecar's own mappings, which a dma-buf
// region does not have: writes into or out of it fail with TL_ECUDA, and bad registrations are
// refused with the reason. Its fd is the sidecar's until the region goes.
TEST(DmabufRegion, LocalWritesAndBadRangesAreRefused) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    // The harness's readiness probe must be gone before the baseline: only the keeper remains.
    auto keeper = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(keeper.ok());
    ASSERT_TRUE(eventually([&] { return clientCount(keeper->get()) == 1; }));
    const int fds_before = sc.openFds();
    {
        MemfdBuffer buf(8192);
        ASSERT_TRUE(buf.ok());
        auto cr = tensorlane::Client::connect(sc.socket());
        ASSERT_TRUE(cr.ok());
        tensorlane::Client &c = *cr;
        tl_region r = 0;
        EXPECT_EQ(tl_register_dmabuf(c.get(), -1, 0, 4096, &r), TL_EINVAL);
        EXPECT_EQ(tl_register_dmabuf(c.get(), buf.fd.get(), 0, 0, &r), TL_EINVAL);
        EXPECT_EQ(tl_register_dmabuf(c.get(), buf.fd.get(), UINT64_MAX - 10, 100, &r), TL_EINVAL);
        EXPECT_EQ(tl_register_dmabuf(c.get(), buf.fd.get(), 4096, 8192, &r), TL_EINVAL);
        EXPECT_NE(std::string(tl_last_error()).find("runs past the end of the 8192-byte dma-buf"),
                  std::string::npos)
            << tl_last_error();
        ipc::UniqueFd ev(::eventfd(0, EFD_CLOEXEC));
        EXPECT_EQ(tl_register_dmabuf(c.get(), ev.get(), 0, 4096, &r), TL_EINVAL);
        EXPECT_NE(std::string(tl_last_error()).find("no dma-buf"), std::string::npos)
            << tl_last_error();

        auto dm = c.registerDmabuf(buf.fd.get(), 0, 8192);
        ASSERT_TRUE(dm.ok()) << dm.error().detail;
        ASSERT_TRUE(dm->expose("dm").ok());
        auto host_r = c.allocHost(8192);
        ASSERT_TRUE(host_r.ok());
        tensorlane::Region &host = *host_r;
        fillRandom(host.data(), 8192, 3);
        ASSERT_TRUE(host.expose("host").ok());
        tl_remote to_dm = 0, to_host = 0;
        ASSERT_EQ(tl_lookup(c.get(), "node-a", "dm", &to_dm, nullptr), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_lookup(c.get(), "node-a", "host", &to_host, nullptr), TL_OK);
        tl_ticket t = 0;
        ASSERT_EQ(tl_write(c.get(), host.id(), 0, to_dm, 0, 4096, 1, &t), TL_OK);
        EXPECT_EQ(tl_wait(c.get(), t, 10000), TL_ECUDA) << tl_last_error();
        ASSERT_EQ(tl_write(c.get(), dm->id(), 0, to_host, 0, 4096, 2, &t), TL_OK);
        EXPECT_EQ(tl_wait(c.get(), t, 10000), TL_ECUDA) << tl_last_error();
        for (size_t i = 0; i < 8192; ++i) {
            ASSERT_EQ(buf.data()[i], 0) << "byte " << i;
        }
        std::vector<unsigned char> expect(8192);
        fillRandom(expect.data(), expect.size(), 3);
        EXPECT_EQ(std::memcmp(host.data(), expect.data(), expect.size()), 0);
    }
    // The client is gone: every fd it gave the sidecar is closed again.
    EXPECT_TRUE(eventually([&] { return sc.openFds() == fds_before; }))
        << sc.openFds() << " fds, " << fds_before << " before";
    EXPECT_TRUE(sc.alive());
}
