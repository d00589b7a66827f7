// EtcdClient against a real etcd on loopback: keys (binary-safe), prefixes, leases and their
// expiry, watches from a revision, etcd going away, failover, interrupt.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "cluster/etcd_client.hpp"
#include "etcd_server.hpp"

namespace tensorlane::sidecar {
namespace {

using tensorlane::testing::EtcdServer;
using Clock = std::chrono::steady_clock;

class EtcdClientTest : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        if (EtcdServer::binary().empty()) {
            GTEST_SKIP() << "no etcd binary (apt-get install etcd-server)";
        }
        ASSERT_TRUE(etcd_.start(&why)) << why;
    }

    std::unique_ptr<EtcdClient> client(std::vector<std::string> endpoints = {},
                                       uint32_t timeout_ms = 2000) {
        EtcdOptions o;
        o.endpoints = endpoints.empty() ? std::vector<std::string>{etcd_.url()} : endpoints;
        o.request_timeout_ms = timeout_ms;
        Status st;
        auto c = EtcdClient::create(o, &st);
        EXPECT_TRUE(c) << st.message();
        return c;
    }

    EtcdServer etcd_;
};

TEST_F(EtcdClientTest, PutGetRemoveRoundTripBinarySafe) {
    auto c = client();
    const std::string value("a\0b\xff\n\"{}", 9);
    ASSERT_TRUE(c->put("/t/k", value).isOk());
    std::optional<EtcdKv> kv;
    int64_t rev = 0;
    ASSERT_TRUE(c->get("/t/k", &kv, &rev).isOk());
    ASSERT_TRUE(kv.has_value());
    EXPECT_EQ(kv->value, value);
    EXPECT_EQ(kv->key, "/t/k");
    EXPECT_GT(rev, 0);
    EXPECT_EQ(kv->mod_revision, rev);
    int64_t deleted = 0;
    ASSERT_TRUE(c->remove("/t/k", &deleted).isOk());
    EXPECT_EQ(deleted, 1);
    ASSERT_TRUE(c->get("/t/k", &kv).isOk());
    EXPECT_FALSE(kv.has_value());
}

TEST_F(EtcdClientTest, PrefixCoversOnlyItsKeys) {
    auto c = client();
    ASSERT_TRUE(c->put("/tensorlane/a/nodes/x", "1").isOk());
    ASSERT_TRUE(c->put("/tensorlane/a/nodes/y", "2").isOk());
    ASSERT_TRUE(c->put("/tensorlane/ab/nodes/x", "3").isOk());
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    ASSERT_TRUE(c->getPrefix("/tensorlane/a/", &kvs, &rev).isOk());
    ASSERT_EQ(kvs.size(), 2u);
    EXPECT_EQ(kvs[0].key, "/tensorlane/a/nodes/x");
    EXPECT_EQ(kvs[1].value, "2");
    int64_t deleted = 0;
    ASSERT_TRUE(c->removePrefix("/tensorlane/a/", &deleted).isOk());
    EXPECT_EQ(deleted, 2);
    ASSERT_TRUE(c->getPrefix("/tensorlane/ab/", &kvs, &rev).isOk());
    EXPECT_EQ(kvs.size(), 1u);
    EXPECT_EQ(etcdPrefixEnd("ab"), "ac");
}

TEST_F(EtcdClientTest, LeaseKeepsItsKeyUntilItExpires) {
    auto c = client();
    int64_t lease = 0;
    int64_t ttl = 0;
    ASSERT_TRUE(c->grantLease(2, &lease, &ttl).isOk());
    EXPECT_NE(lease, 0);
    EXPECT_GE(ttl, 2);
    ASSERT_TRUE(c->put("/t/leased", "v", lease).isOk());
    std::optional<EtcdKv> kv;
    // Kept alive past its TTL, it stays.
    for (int i = 0; i < 4; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(700));
        int64_t left = 0;
        ASSERT_TRUE(c->keepAlive(lease, &left).isOk());
        EXPECT_GT(left, 0);
    }
    ASSERT_TRUE(c->get("/t/leased", &kv).isOk());
    ASSERT_TRUE(kv.has_value());
    EXPECT_EQ(kv->lease, lease);
    // Left alone, it goes within its TTL (and a second for etcd's expiry sweep).
    const auto t0 = Clock::now();
    while (kv.has_value() && Clock::now() - t0 < std::chrono::seconds(6)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        ASSERT_TRUE(c->get("/t/leased", &kv).isOk());
    }
    EXPECT_FALSE(kv.has_value());
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(ttl * 1000 + 1500));
    int64_t left = 0;
    EXPECT_EQ(c->keepAlive(lease, &left).code(), Code::kNotFound);
}

TEST_F(EtcdClientTest, RevokeDeletesTheKeysAtOnce) {
    auto c = client();
    int64_t lease = 0;
    int64_t ttl = 0;
    ASSERT_TRUE(c->grantLease(30, &lease, &ttl).isOk());
    ASSERT_TRUE(c->put("/t/r", "v", lease).isOk());
    ASSERT_TRUE(c->revokeLease(lease).isOk());
    std::optional<EtcdKv> kv;
    ASSERT_TRUE(c->get("/t/r", &kv).isOk());
    EXPECT_FALSE(kv.has_value());
}

TEST_F(EtcdClientTest, WatchFromARevisionSeesPutsAndDeletes) {
    auto c = client();
    ASSERT_TRUE(c->put("/w/nodes/a", "1").isOk());
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    ASSERT_TRUE(c->getPrefix("/w/", &kvs, &rev).isOk());
    ASSERT_TRUE(c->put("/w/nodes/b", "2").isOk());  // after the listing: the watch must see it
    std::vector<EtcdEvent> seen;
    std::atomic<bool> created{false};
    auto watcher = client();
    std::thread t([&] {
        const Status s = watcher->watchPrefix(
            "/w/", rev + 1,
            [&](const std::vector<EtcdEvent> &evs, int64_t) {
                seen.insert(seen.end(), evs.begin(), evs.end());
                return seen.size() < 3;
            },
            [&] { created = true; });
        EXPECT_TRUE(s.isOk()) << s.message();
    });
    while (!created) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(c->put("/other/x", "no").isOk());
    ASSERT_TRUE(c->remove("/w/nodes/a").isOk());
    ASSERT_TRUE(c->put("/w/nodes/c", "3").isOk());
    t.join();
    ASSERT_EQ(seen.size(), 3u);
    EXPECT_EQ(seen[0].type, EtcdEvent::Type::kPut);
    EXPECT_EQ(seen[0].kv.key, "/w/nodes/b");
    EXPECT_EQ(seen[1].type, EtcdEvent::Type::kDelete);
    EXPECT_EQ(seen[1].kv.key, "/w/nodes/a");
    EXPECT_EQ(seen[2].kv.value, "3");
}

TEST_F(EtcdClientTest, WatchEndsWhenEtcdIsKilledAndCallsFailFast) {
    auto c = client({}, 500);
    std::atomic<bool> created{false};
    Status result;
    std::thread t([&] {
        result = c->watchPrefix(
            "/k/", 1, [](const std::vector<EtcdEvent> &, int64_t) { return true; },
            [&] { created = true; });
    });
    while (!created) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const auto t0 = Clock::now();
    etcd_.kill();
    t.join();
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
    EXPECT_EQ(result.code(), Code::kPeer) << result.message();
    const auto t1 = Clock::now();
    const Status s = c->put("/k/x", "v");
    EXPECT_EQ(s.code(), Code::kPeer);
    EXPECT_NE(s.message().find(etcd_.url()), std::string::npos) << s.message();
    EXPECT_LT(Clock::now() - t1, std::chrono::milliseconds(1500));
    // Back on the same data: the client carries on.
    std::string why;
    ASSERT_TRUE(etcd_.restart(&why)) << why;
    EXPECT_TRUE(c->put("/k/x", "v").isOk());
}

TEST_F(EtcdClientTest, FailsOverToTheNextEndpoint) {
    const std::string dead = "http://127.0.0.1:" + std::to_string(EtcdServer::freePort());
    auto c = client({dead, etcd_.url()}, 500);
    ASSERT_TRUE(c->put("/f/x", "v").isOk());
    EXPECT_EQ(c->endpoint(), etcd_.url());
}

TEST_F(EtcdClientTest, InterruptEndsAWatchAtOnce) {
    auto c = client();
    std::atomic<bool> created{false};
    Status result;
    std::thread t([&] {
        result = c->watchPrefix(
            "/i/", 1, [](const std::vector<EtcdEvent> &, int64_t) { return true; },
            [&] { created = true; });
    });
    while (!created) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const auto t0 = Clock::now();
    c->interrupt();
    t.join();
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(200));
    EXPECT_EQ(result.code(), Code::kConnection);
    EXPECT_EQ(c->put("/i/x", "v").code(), Code::kConnection);
}

}  // namespace
}  // namespace tensorlane::sidecar
