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
using tensorlane::testing::haveOpenssl;
using tensorlane::testing::TestPki;
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

// ---- TLS and etcd authentication ([directory] ca_file, cert_file, key_file, username,
// password_file): against a real etcd serving TLS with certificates made here by openssl, and a
// real etcd with its user/role auth turned on.

std::unique_ptr<EtcdClient> makeClient(EtcdOptions o, Status *st) {
    o.request_timeout_ms = o.request_timeout_ms ? o.request_timeout_ms : 2000;
    return EtcdClient::create(std::move(o), st);
}

/// The first put on a fresh etcd may come before it elected itself: retried for a while.
Status putSoon(EtcdClient &c, const std::string &key, const std::string &value) {
    Status s;
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (!(s = c.put(key, value)).isOk() && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return s;
}

class EtcdTls : public ::testing::Test {
protected:
    void SetUp() override {
        if (EtcdServer::binary().empty()) {
            GTEST_SKIP() << "no etcd binary (apt-get install etcd-server)";
        }
        if (!haveOpenssl()) {
            GTEST_SKIP() << "no openssl program to make the test certificates (apt-get install "
                            "openssl)";
        }
        ASSERT_TRUE(pki_.ok()) << "openssl could not make the test certificates";
    }
    TestPki pki_;
    EtcdServer etcd_;
};

TEST_F(EtcdTls, TheCaFileVerifiesEtcdAndWithoutItNothingIsSent) {
    etcd_.useTls(pki_.file("server.pem"), pki_.file("server.key"));
    std::string why;
    ASSERT_TRUE(etcd_.start(&why)) << why;
    ASSERT_EQ(etcd_.url().rfind("https://", 0), 0u);
    Status st;
    EtcdOptions o;
    o.endpoints = {etcd_.url()};
    o.ca_file = pki_.file("ca.pem");
    auto c = makeClient(o, &st);
    ASSERT_TRUE(c) << st.message();
    ASSERT_TRUE(putSoon(*c, "/tls/x", "over tls").isOk());
    std::optional<EtcdKv> kv;
    ASSERT_TRUE(c->get("/tls/x", &kv).isOk());
    ASSERT_TRUE(kv.has_value());
    EXPECT_EQ(kv->value, "over tls");
    // Without the CA (the system's trust store does not know it) the certificate fails, and
    // the error says where.
    o.ca_file.clear();
    auto untrusting = makeClient(o, &st);
    ASSERT_TRUE(untrusting) << st.message();
    const Status refused = untrusting->put("/tls/y", "v");
    EXPECT_FALSE(refused.isOk());
    EXPECT_NE(refused.message().find(etcd_.url()), std::string::npos) << refused.message();
    // Plain http to a TLS port is no answer either.
    EtcdOptions plain;
    plain.endpoints = {"http://127.0.0.1:" + std::to_string(etcd_.port())};
    plain.request_timeout_ms = 1000;
    auto http = makeClient(plain, &st);
    ASSERT_TRUE(http) << st.message();
    EXPECT_FALSE(http->put("/tls/z", "v").isOk());
    std::optional<EtcdKv> none;
    ASSERT_TRUE(c->get("/tls/y", &none).isOk());
    EXPECT_FALSE(none.has_value()) << "a write without a verified server landed";
}

TEST_F(EtcdTls, ClientCertificatesWhereEtcdAsksForThem) {
    etcd_.useTls(pki_.file("server.pem"), pki_.file("server.key"), pki_.file("ca.pem"));
    std::string why;
    ASSERT_TRUE(etcd_.start(&why)) << why;
    Status st;
    EtcdOptions o;
    o.endpoints = {etcd_.url()};
    o.ca_file = pki_.file("ca.pem");
    o.cert_file = pki_.file("client.pem");
    o.key_file = pki_.file("client.key");
    auto c = makeClient(o, &st);
    ASSERT_TRUE(c) << st.message();
    ASSERT_TRUE(putSoon(*c, "/mtls/x", "v").isOk());
    o.cert_file.clear();
    o.key_file.clear();
    auto anonymous = makeClient(o, &st);
    ASSERT_TRUE(anonymous) << st.message();
    EXPECT_FALSE(anonymous->put("/mtls/y", "v").isOk()) << "etcd took a client without a cert";
}

TEST_F(EtcdClientTest, AuthUsesTheUserAndRefusesAWrongPassword) {
    // Auth on: a root user with the root role (what etcd requires), then auth/enable.
    ASSERT_TRUE(tensorlane::testing::enableRootAuth(etcd_.port(), "s3cret"));
    Status st;
    EtcdOptions o;
    o.endpoints = {etcd_.url()};
    o.username = "root";
    o.password = "s3cret";
    auto c = makeClient(o, &st);
    ASSERT_TRUE(c) << st.message();
    ASSERT_TRUE(c->put("/auth/x", "v").isOk());
    std::optional<EtcdKv> kv;
    ASSERT_TRUE(c->get("/auth/x", &kv).isOk());
    EXPECT_TRUE(kv.has_value());
    // A wrong password: refused, as a permission error that names the endpoint.
    o.password = "wrong";
    auto wrong = makeClient(o, &st);
    ASSERT_TRUE(wrong) << st.message();
    const Status refused = wrong->put("/auth/y", "v");
    EXPECT_EQ(refused.code(), Code::kPermission) << refused.message();
    // No credentials at all: refused too (etcd: user name is empty).
    auto none = client();
    EXPECT_FALSE(none->put("/auth/z", "v").isOk());
    std::optional<EtcdKv> absent;
    ASSERT_TRUE(c->get("/auth/y", &absent).isOk());
    EXPECT_FALSE(absent.has_value());
}

}  // namespace
}  // namespace tensorlane::sidecar
