// The transport seam with a transport the engine was given (tests/sidecar/loop_transport.hpp):
// two engines in this process, real clients, the peer layer bootstrapping and binding the loop
// transport as it does tcp and verbs. What the engine must hold whatever a transport does:
// backpressure (kAgain) loses and reorders nothing, a session the transport fails ends each of
// its writes once, a transport that reports a completion twice ends the write once.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "harness.hpp"
#include "inprocess.hpp"
#include "loop_transport.hpp"
#include "tensorlane/tensorlane.hpp"

using namespace tltest;

namespace {

/// node-a and node-b, each with only a loop transport on one fabric.
struct LoopPair {
    TempDir keys;
    std::string key = [this] {
        writeFile(keys.file("peer.key"), keyText('5'), 0600);
        return keys.file("peer.key");
    }();
    uint16_t pa = freePort(), pb = freePort();
    LoopFabric fabric;
    LoopTransport *ta = nullptr;
    LoopTransport *tb = nullptr;
    InProcessEngine a{options("node-a", pa, "node-b", pb, &ta)};
    InProcessEngine b{options("node-b", pb, "node-a", pa, &tb)};

    InProcessOptions options(const std::string &name, uint16_t port, const std::string &peer,
                             uint16_t peer_port, LoopTransport **made) {
        return InProcessOptions{
            .name = name,
            .listen_port = port,
            .peers = {{peer, "127.0.0.1:" + std::to_string(peer_port)}},
            .key_file = key,
            .tcp =
                "keepalive_ms = 200\npeer_timeout_ms = 15000\nconnect_timeout_ms = 1000\n"
                "reconnect_min_ms = 50\nreconnect_max_ms = 400",
            .transports = [this, name, made] {
                auto t = std::make_unique<LoopTransport>(fabric, name);
                *made = t.get();
                std::vector<std::unique_ptr<tensorlane::sidecar::Transport>> v;
                v.push_back(std::move(t));
                return v;
            }};
    }
};

/// An owner on node-b with an exposed 64 KiB region "t", a writer on node-a with a source
/// filled with a pattern, and node-a's handle to "t".
struct Exchange {
    explicit Exchange(LoopPair &p)
        : owner(tensorlane::Client::connect(p.b.socket())),
          writer(tensorlane::Client::connect(p.a.socket())) {
        if (!owner.ok() || !writer.ok()) {
            return;
        }
        auto d = owner->allocHost(kBytes);
        auto s = writer->allocHost(kBytes);
        if (!d.ok() || !s.ok() || !d->expose("t").ok()) {
            return;
        }
        dst.emplace(std::move(*d));
        src.emplace(std::move(*s));
        fillRandom(src->data(), kBytes, 3);
        tl_remote h = 0;
        uint64_t bytes = 0;
        if (lookupEventually(writer->get(), "node-b", "t", &h, &bytes) == TL_OK) {
            remote = tensorlane::Remote{h, bytes};
            ready = true;
        }
    }
    static constexpr uint64_t kBytes = 1 << 16;
    tensorlane::Result<tensorlane::Client> owner, writer;
    std::optional<tensorlane::Region> dst, src;
    tensorlane::Remote remote{};
    bool ready = false;
};

}  // namespace

TEST(TransportSeam, AGivenTransportCarriesWritesBetweenTwoEngines) {
    LoopPair p;
    ASSERT_TRUE(p.a.ok() && p.b.ok()) << p.a.error() << p.b.error();
    ASSERT_NE(p.ta, nullptr);
    Exchange x(p);
    ASSERT_TRUE(x.ready) << tl_last_error();
    auto t = x.writer->write(*x.src, 0, x.remote, 0, Exchange::kBytes, 41);
    ASSERT_TRUE(t.ok());
    ASSERT_EQ(t->wait(std::chrono::seconds(10)), TL_OK) << tl_last_error();
    auto n = x.owner->waitNotificationEx(std::chrono::seconds(5));
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(n->n.imm, 41u);
    EXPECT_EQ(n->n.bytes, Exchange::kBytes);
    EXPECT_EQ(std::string(n->n.peer), "node-a");
    EXPECT_EQ(n->writer_uid, TL_UID_PEER);
    EXPECT_EQ(std::memcmp(x.dst->data(), x.src->data(), Exchange::kBytes), 0);
    // The status names the transport the peer layer bound.
    const auto st = p.a.status();
    ASSERT_TRUE(st.is_object() && st.contains("peers")) << st.dump();
    EXPECT_NE(st["peers"].dump().find("\"loop\""), std::string::npos) << st["peers"].dump();
}

TEST(TransportSeam, BackpressureLosesAndReordersNothing) {
    LoopPair p;
    ASSERT_TRUE(p.a.ok() && p.b.ok()) << p.a.error() << p.b.error();
    Exchange x(p);
    ASSERT_TRUE(x.ready) << tl_last_error();
    p.ta->refuseNext(25);  // kAgain: the engine keeps each in the peer's queue, in order
    constexpr int kWrites = 12;
    std::vector<tensorlane::Ticket> tickets;
    for (int i = 0; i < kWrites; ++i) {
        auto t = x.writer->write(*x.src, uint64_t(i) * 1024, x.remote, uint64_t(i) * 1024, 1024,
                                 100 + i);
        ASSERT_TRUE(t.ok());
        tickets.push_back(std::move(*t));
    }
    for (auto &t : tickets) {
        EXPECT_EQ(t.wait(std::chrono::seconds(10)), TL_OK) << tl_last_error();
    }
    for (int i = 0; i < kWrites; ++i) {
        auto n = x.owner->waitNotification(std::chrono::seconds(5));
        ASSERT_TRUE(n.ok()) << i;
        EXPECT_EQ(n->imm, uint32_t(100 + i)) << "notifications out of posting order";
    }
    EXPECT_EQ(std::memcmp(x.dst->data(), x.src->data(), kWrites * 1024), 0);
    EXPECT_EQ(x.owner->waitNotification(std::chrono::milliseconds(100)).status(), TL_ETIMEDOUT);
}

TEST(TransportSeam, ASessionTheTransportFailsEndsEachOfItsWritesOnceAndComesBack) {
    LoopPair p;
    ASSERT_TRUE(p.a.ok() && p.b.ok()) << p.a.error() << p.b.error();
    Exchange x(p);
    ASSERT_TRUE(x.ready) << tl_last_error();
    p.ta->hold(true);  // taken by the transport, in flight, nothing copied yet
    std::vector<tensorlane::Ticket> tickets;
    for (int i = 0; i < 4; ++i) {
        auto t = x.writer->write(*x.src, 0, x.remote, 0, 4096, 7);
        ASSERT_TRUE(t.ok());
        tickets.push_back(std::move(*t));
    }
    ASSERT_TRUE(eventually([&] { return p.ta->held() == 4; })) << p.ta->held();
    p.ta->hold(false);  // later writes go at once; these four stay held until the session ends
    p.ta->failSessions();
    for (auto &t : tickets) {
        EXPECT_EQ(t.wait(std::chrono::seconds(10)), TL_EPEER) << tl_last_error();
        // Consumed: a second wait on the same ticket does not find it again.
        EXPECT_NE(t.wait(std::chrono::milliseconds(50)), TL_OK);
    }
    EXPECT_EQ(x.owner->waitNotification(std::chrono::milliseconds(200)).status(), TL_ETIMEDOUT)
        << "a failed write was notified";
    const auto *q = static_cast<const unsigned char *>(x.dst->data());
    EXPECT_EQ(std::count(q, q + 4096, 0), 4096) << "a failed write landed";
    // The peer layer reconnects and binds the transport again: writes work once more.
    ASSERT_TRUE(eventually(
        [&] {
            auto t = x.writer->write(*x.src, 0, x.remote, 0, 4096, 8);
            return t.ok() && t->wait(std::chrono::seconds(2)) == TL_OK;
        },
        std::chrono::seconds(15)))
        << tl_last_error();
    auto n = x.owner->waitNotification(std::chrono::seconds(5));
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(n->imm, 8u);
}

TEST(TransportSeam, ACompletionReportedTwiceEndsTheWriteOnce) {
    LoopPair p;
    ASSERT_TRUE(p.a.ok() && p.b.ok()) << p.a.error() << p.b.error();
    Exchange x(p);
    ASSERT_TRUE(x.ready) << tl_last_error();
    p.ta->duplicateCompletions(true);
    for (int round = 0; round < 3; ++round) {
        std::vector<tensorlane::Ticket> tickets;
        for (int i = 0; i < 8; ++i) {
            auto t = x.writer->write(*x.src, 0, x.remote, 0, 256, 50 + i);
            ASSERT_TRUE(t.ok());
            tickets.push_back(std::move(*t));
        }
        for (auto &t : tickets) {
            EXPECT_EQ(t.wait(std::chrono::seconds(10)), TL_OK) << tl_last_error();
        }
        for (int i = 0; i < 8; ++i) {
            auto n = x.owner->waitNotification(std::chrono::seconds(5));
            ASSERT_TRUE(n.ok());
            EXPECT_EQ(n->imm, uint32_t(50 + i));
        }
    }
    // Nothing is left counted in flight (a second completion would have released a user or a
    // slot that was not its own, or ended some other write).
    ASSERT_TRUE(eventually([&] { return p.a.counter("writes_in_flight") == 0; }))
        << p.a.status().dump();
    for (const auto &c : p.a.status()["clients"]) {
        EXPECT_EQ(c.value("in_flight", uint64_t{1}), 0u) << c.dump();
    }
    EXPECT_EQ(x.owner->waitNotification(std::chrono::milliseconds(100)).status(), TL_ETIMEDOUT);
}
