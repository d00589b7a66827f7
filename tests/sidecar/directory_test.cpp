// The etcd directory with real sidecars and a real etcd on loopback (docs/directory.md): join,
// leave, crash (lease expiry), restart with a new epoch, etcd killed under traffic, a node with
// another key refused, two clusters on one etcd; and a scale test of 200 registrations.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "../cluster/etcd_server.hpp"
#include "cluster/etcd_client.hpp"
#include "harness.hpp"
#include "status_json.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/tensorlane.hpp"

using namespace tltest;
using tensorlane::testing::EtcdServer;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kTtlMs = 2000;

class DirectoryTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (EtcdServer::binary().empty()) {
            GTEST_SKIP() << "no etcd binary (apt-get install etcd-server)";
        }
        std::string why;
        ASSERT_TRUE(etcd_.start(&why)) << why;
        key_ = dir_.file("peer.key");
        writeFile(key_, keyText('d'), 0600);
    }

    /// A node of `cluster` on this fixture's etcd, or on `url` with `more` [directory] lines.
    SidecarOptions node(const std::string &name, const std::string &cluster = "t",
                        const std::string &key = "", const std::string &url = "",
                        const std::string &more = "") {
        SidecarOptions o;
        o.name = name;
        o.listen = "127.0.0.1:" + std::to_string(freePort());
        o.key_file = key.empty() ? key_ : key;
        o.tcp = kFastFailureTcp;
        o.extra =
            "[directory]\nkind = \"etcd\"\nendpoints = [\"" + (url.empty() ? etcd_.url() : url) +
            "\"]\ncluster = \"" + cluster + "\"\nlease_ttl_ms = " + std::to_string(kTtlMs) +
            "\nrequest_timeout_ms = 500\nreconnect_min_ms = 50\nreconnect_max_ms = 400\n" + more;
        return o;
    }

    /// The whole status document (200 peers do not fit status_json.hpp's 64 KiB buffer).
    /// The CLI's output (stdout and stderr).
    static std::string runCli(const std::string &args) {
        std::string out;
        FILE *p = ::popen((std::string(TENSORLANE_CLI_BIN) + " " + args + " 2>&1").c_str(), "r");
        char buf[4096];
        for (size_t n; p != nullptr && (n = std::fread(buf, 1, sizeof buf, p)) > 0;) {
            out.append(buf, n);
        }
        if (p != nullptr) {
            ::pclose(p);
        }
        return out;
    }
    static nlohmann::json bigStatus(tl_client *c) {
        std::string buf(8 << 20, '\0');
        size_t len = 0;
        if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
            return nlohmann::json::object();
        }
        buf.resize(std::min(len, buf.size() - 1));
        auto j = nlohmann::json::parse(buf, nullptr, false);
        return j.is_object() ? j : nlohmann::json::object();
    }
    /// Waits up to 15 s for the directory's last_error to contain `what`, *out its last status.
    /// The client retries, and a loaded machine can time a try out before the refusal under
    /// test comes (the etcd request timeout is 500 ms here): the first error is not taken.
    static bool lastErrorSays(tl_client *c, const std::string &what, nlohmann::json *out) {
        return eventually(
            [&] {
                *out = directory(c);
                return out->value("last_error", "").find(what) != std::string::npos;
            },
            std::chrono::seconds(15));
    }
    /// The status document's "directory" object (its keys are sorted, so "directory", a flat
    /// object, comes before "peers" and is read without parsing every peer).
    static nlohmann::json directory(tl_client *c) {
        std::string buf(8 << 20, '\0');
        size_t len = 0;
        if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
            return nlohmann::json::object();
        }
        buf.resize(std::min(len, buf.size() - 1));
        const size_t at = buf.find("\"directory\":");
        const size_t end = at == std::string::npos ? at : buf.find('}', at);
        if (end == std::string::npos) {
            return nlohmann::json::object();
        }
        const size_t open = buf.find('{', at);
        auto j = nlohmann::json::parse(buf.substr(open, end + 1 - open), nullptr, false);
        return j.is_object() ? j : nlohmann::json::object();
    }
    static bool knows(tl_client *c, const std::string &peer) {
        const nlohmann::json j = bigStatus(c);
        for (const auto &p : j.value("peers", nlohmann::json::array())) {
            if (p.value("name", "") == peer) {
                return true;
            }
        }
        return false;
    }
    /// Looks `name` up at `peer` until it answers TL_OK (the peer may not have registered yet).
    static tl_status lookupSoon(tl_client *c, const std::string &peer, const std::string &name,
                                tl_remote *r) {
        tl_status st = TL_ENOENT;
        eventually(
            [&] { return (st = tl_lookup(c, peer.c_str(), name.c_str(), r, nullptr)) == TL_OK; },
            std::chrono::seconds(10));
        return st;
    }

    EtcdServer etcd_;
    TempDir dir_;
    std::string key_;
};

TEST_F(DirectoryTest, NodesJoinWriteAndLeaveOnACleanStop) {
    Sidecar a(node("node-a"));
    auto b = std::make_unique<Sidecar>(node("node-b"));
    ASSERT_TRUE(a.ready() && b->ready()) << a.log() << b->log();
    auto ca = tensorlane::Client::connect(a.socket());
    auto cb = tensorlane::Client::connect(b->socket());
    ASSERT_TRUE(ca.ok() && cb.ok());
    auto inbox = cb->allocHost(1 << 16);
    auto src = ca->allocHost(1 << 16);
    ASSERT_TRUE(inbox.ok() && src.ok() && inbox->expose("inbox").ok());
    tl_remote r = 0;
    ASSERT_EQ(lookupSoon(ca->get(), "node-b", "inbox", &r), TL_OK) << tl_last_error() << a.log();
    fillRandom(src->data(), 1 << 16, 5);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(ca->get(), src->id(), 0, r, 0, 1 << 16, 1, &t), TL_OK);
    EXPECT_EQ(tl_wait(ca->get(), t, 10000), TL_OK) << tl_last_error();
    EXPECT_EQ(std::memcmp(src->data(), inbox->data(), 1 << 16), 0);
    const nlohmann::json d = directory(ca->get());
    EXPECT_EQ(d.value("kind", ""), "etcd") << d.dump();
    EXPECT_EQ(d.value("state", ""), "up") << d.dump();
    EXPECT_TRUE(d.value("registered", false)) << d.dump();
    EXPECT_EQ(d.value("nodes", 0), 1) << d.dump();
    EXPECT_EQ(d.value("key", ""), "/tensorlane/t/nodes/node-a");
    // `tensorlane status` and `tensorlane diag` say it too.
    const std::string status = runCli("status --socket " + a.socket());
    EXPECT_NE(status.find("directory: etcd " + etcd_.url() + " cluster t up, registered, 1 nodes"),
              std::string::npos)
        << status;
    const std::string diag = runCli("diag --config " + a.configPath());
    EXPECT_NE(diag.find("cluster 't' up, registered, 1 nodes"), std::string::npos) << diag;

    // A clean stop deletes the key: node-a forgets node-b at once, well before the lease TTL.
    const auto t0 = Clock::now();
    b.reset();
    EXPECT_TRUE(eventually([&] { return !knows(ca->get(), "node-b"); }, std::chrono::seconds(5)));
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(kTtlMs));
    EXPECT_EQ(tl_write(ca->get(), src->id(), 0, r, 0, 64, 2, &t), TL_OK);
    EXPECT_NE(tl_wait(ca->get(), t, 5000), TL_OK);
    EXPECT_EQ(tl_lookup(ca->get(), "node-b", "inbox", &r, nullptr), TL_ENOENT);
    EXPECT_NE(std::string(tl_last_error()).find("left the cluster"), std::string::npos)
        << tl_last_error();
    EXPECT_TRUE(a.logHas("peer 'node-b' left the cluster"));
}

TEST_F(DirectoryTest, ACrashedNodeLeavesWithinTheLeaseTtl) {
    Sidecar a(node("node-a"));
    Sidecar b(node("node-b"));
    ASSERT_TRUE(a.ready() && b.ready());
    auto ca = tensorlane::Client::connect(a.socket());
    ASSERT_TRUE(ca.ok());
    ASSERT_TRUE(eventually([&] { return knows(ca->get(), "node-b"); }, std::chrono::seconds(10)));
    const auto t0 = Clock::now();
    b.kill(SIGKILL);
    ASSERT_TRUE(eventually([&] { return !knows(ca->get(), "node-b"); }, std::chrono::seconds(10)));
    const auto took = Clock::now() - t0;
    // etcd expires a lease at its TTL (rounded up to seconds) and sweeps every 500 ms.
    EXPECT_LT(took, std::chrono::milliseconds(kTtlMs + 1000));
    std::printf(
        "crash: node-b removed %lld ms after SIGKILL (lease TTL %d ms)\n",
        static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
        kTtlMs);
}

TEST_F(DirectoryTest, ARestartedNodeHasANewEpochAndOldHandlesFail) {
    Sidecar a(node("node-a"));
    SidecarOptions bo = node("node-b");
    auto b = std::make_unique<Sidecar>(bo);
    ASSERT_TRUE(a.ready() && b->ready());
    auto ca = tensorlane::Client::connect(a.socket());
    auto src = ca->allocHost(4096);
    tl_remote old_handle = 0;
    {
        auto cb = tensorlane::Client::connect(b->socket());
        auto inbox = cb->allocHost(4096);
        ASSERT_TRUE(inbox->expose("inbox").ok());
        ASSERT_EQ(lookupSoon(ca->get(), "node-b", "inbox", &old_handle), TL_OK) << tl_last_error();
        const std::string epoch = peerStatus(ca->get(), "node-b").value("incarnation", "");
        b->kill(SIGKILL);
        b = std::make_unique<Sidecar>(bo);  // same name and address, at once (the old lease lives)
        ASSERT_TRUE(b->ready());
    }
    auto cb = tensorlane::Client::connect(b->socket());
    auto inbox = cb->allocHost(4096);
    ASSERT_TRUE(inbox->expose("inbox").ok());
    ASSERT_TRUE(a.logHas("peer 'node-b' restarted (new epoch", std::chrono::seconds(10)))
        << a.log();
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(ca->get(), src->id(), 0, old_handle, 0, 64, 1, &t), TL_OK);
    EXPECT_EQ(tl_wait(ca->get(), t, 5000), TL_ENOENT) << tl_last_error();
    tl_remote fresh = 0;
    ASSERT_EQ(lookupSoon(ca->get(), "node-b", "inbox", &fresh), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_write(ca->get(), src->id(), 0, fresh, 0, 64, 2, &t), TL_OK);
    EXPECT_EQ(tl_wait(ca->get(), t, 10000), TL_OK) << tl_last_error();
    EXPECT_EQ(directory(ca->get()).value("restarts", 0), 1);
}

TEST_F(DirectoryTest, EtcdKilledUnderTrafficThenBack) {
    Sidecar a(node("node-a"));
    Sidecar b(node("node-b"));
    ASSERT_TRUE(a.ready() && b.ready());
    auto ca = tensorlane::Client::connect(a.socket());
    auto cb = tensorlane::Client::connect(b.socket());
    auto inbox = cb->allocHost(1 << 16);
    auto src = ca->allocHost(1 << 16);
    ASSERT_TRUE(inbox->expose("inbox").ok());
    tl_remote r = 0;
    ASSERT_EQ(lookupSoon(ca->get(), "node-b", "inbox", &r), TL_OK) << tl_last_error();
    std::atomic<bool> done{false};
    std::atomic<int> ok{0};
    std::atomic<int> failed{0};
    std::thread traffic([&] {
        for (uint32_t i = 0; !done; ++i) {
            tl_ticket t = 0;
            if (tl_write(ca->get(), src->id(), 0, r, 0, 1 << 16, i, &t) == TL_OK &&
                tl_wait(ca->get(), t, 5000) == TL_OK) {
                ++ok;
            } else {
                ++failed;
            }
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    etcd_.kill();
    // Down for longer than the lease TTL: nobody forgets anybody, the writes go on.
    ASSERT_TRUE(eventually([&] { return directory(ca->get()).value("state", "") == "down"; }));
    const int before = ok;
    std::this_thread::sleep_for(std::chrono::milliseconds(kTtlMs + 500));
    EXPECT_GT(ok - before, 10);
    EXPECT_TRUE(knows(ca->get(), "node-b"));
    tl_remote z = 0;
    EXPECT_EQ(tl_lookup(ca->get(), "node-z", "inbox", &z, nullptr), TL_EPEER);
    EXPECT_NE(std::string(tl_last_error()).find("directory is down"), std::string::npos)
        << tl_last_error();
    const nlohmann::json d = directory(ca->get());
    EXPECT_GT(d.value("down_for_s", 0.0), 0.0) << d.dump();
    EXPECT_FALSE(d.value("last_error", "").empty()) << d.dump();
    std::string why;
    ASSERT_TRUE(etcd_.restart(&why)) << why;
    ASSERT_TRUE(eventually([&] { return directory(ca->get()).value("state", "") == "up"; },
                           std::chrono::seconds(10)));
    // The leases expired while etcd was down: both nodes register again and stay peers.
    ASSERT_TRUE(eventually([&] { return directory(ca->get()).value("registered", false); },
                           std::chrono::seconds(10)));
    Sidecar c(node("node-c"));
    ASSERT_TRUE(c.ready());
    EXPECT_TRUE(eventually([&] { return knows(ca->get(), "node-c"); }, std::chrono::seconds(10)));
    EXPECT_TRUE(eventually([&] { return knows(ca->get(), "node-b"); }, std::chrono::seconds(10)));
    done = true;
    traffic.join();
    EXPECT_EQ(failed, 0);
    EXPECT_GT(directory(ca->get()).value("reconnects", 0), 0);
}

// [directory] ca_file and username/password_file with real sidecars: over TLS a node that
// trusts etcd's CA joins and one that does not stays out, saying why; with etcd's auth on, the
// right password registers and a wrong one is refused.
class DirectorySecured : public DirectoryTest {
protected:
    void SetUp() override {}  // each part starts its own etcd
};

TEST_F(DirectorySecured, NodesJoinOverTlsAndWithEtcdAuth) {
    using tensorlane::testing::TestPki;
    if (EtcdServer::binary().empty()) {
        GTEST_SKIP() << "no etcd binary (apt-get install etcd-server)";
    }
    if (!tensorlane::testing::haveOpenssl()) {
        GTEST_SKIP() << "no openssl program to make the test certificates (apt-get install "
                        "openssl)";
    }
    TestPki pki;
    ASSERT_TRUE(pki.ok());
    TempDir &dir = dir_;
    key_ = dir.file("peer.key");
    writeFile(key_, keyText('d'), 0600);
    auto node = [&](const std::string &name, const std::string &url, const std::string &more) {
        return DirectoryTest::node(name, "s", "", url, more);
    };
    {
        EtcdServer etcd;
        etcd.useTls(pki.file("server.pem"), pki.file("server.key"));
        std::string why;
        ASSERT_TRUE(etcd.start(&why)) << why;
        const std::string ca = "ca_file = \"" + pki.file("ca.pem") + "\"\n";
        Sidecar a(node("node-a", etcd.url(), ca));
        Sidecar b(node("node-b", etcd.url(), ca));
        Sidecar x(node("node-x", etcd.url(), ""));  // trusts the system's CAs only
        ASSERT_TRUE(a.ready() && b.ready() && x.ready()) << a.log() << x.log();
        auto ca_client = tensorlane::Client::connect(a.socket());
        ASSERT_TRUE(ca_client.ok());
        EXPECT_TRUE(
            eventually([&] { return knows(ca_client->get(), "node-b"); }, std::chrono::seconds(10)))
            << a.log();
        auto cx = tensorlane::Client::connect(x.socket());
        ASSERT_TRUE(cx.ok());
        nlohmann::json dx;
        // The refusal is the certificate's.
        EXPECT_TRUE(lastErrorSays(cx->get(), "SSL certificate problem", &dx)) << dx.dump();
        std::printf("node-x without the CA: %s\n", dx.dump().c_str());
        EXPECT_NE(dx.value("state", ""), "up") << dx.dump();
        EXPECT_NE(dx.value("last_error", "").find("SSL certificate problem"), std::string::npos);
        EXPECT_FALSE(dx.value("registered", true)) << dx.dump();
        EXPECT_FALSE(knows(ca_client->get(), "node-x"));
    }
    {
        EtcdServer etcd;
        std::string why;
        ASSERT_TRUE(etcd.start(&why)) << why;
        ASSERT_TRUE(tensorlane::testing::enableRootAuth(etcd.port(), "s3cret"));
        writeFile(dir.file("etcd.pw"), "s3cret\n", 0600);
        writeFile(dir.file("wrong.pw"), "guess\n", 0600);
        Sidecar a(node("node-a", etcd.url(),
                       "username = \"root\"\npassword_file = \"" + dir.file("etcd.pw") + "\"\n"));
        Sidecar b(node("node-b", etcd.url(),
                       "username = \"root\"\npassword_file = \"" + dir.file("etcd.pw") + "\"\n"));
        Sidecar w(node("node-w", etcd.url(),
                       "username = \"root\"\npassword_file = \"" + dir.file("wrong.pw") + "\"\n"));
        ASSERT_TRUE(a.ready() && b.ready() && w.ready()) << a.log() << w.log();
        auto ca_client = tensorlane::Client::connect(a.socket());
        ASSERT_TRUE(ca_client.ok());
        EXPECT_TRUE(
            eventually([&] { return knows(ca_client->get(), "node-b"); }, std::chrono::seconds(10)))
            << a.log();
        EXPECT_TRUE(directory(ca_client->get()).value("registered", false));
        auto cw = tensorlane::Client::connect(w.socket());
        ASSERT_TRUE(cw.ok());
        nlohmann::json dw;
        EXPECT_TRUE(lastErrorSays(cw->get(), "authentication failed", &dw)) << dw.dump();
        std::printf("node-w with a wrong password: %s\n", dw.dump().c_str());
        EXPECT_FALSE(dw.value("registered", true)) << dw.dump();
        EXPECT_NE(dw.value("last_error", "").find("authentication failed"), std::string::npos);
        EXPECT_FALSE(knows(ca_client->get(), "node-w"));
    }
}

TEST_F(DirectoryTest, ANodeWithAnotherKeyIsRefused) {
    const std::string other = dir_.file("other.key");
    writeFile(other, keyText('e'), 0600);
    Sidecar a(node("node-a"));
    Sidecar x(node("node-x", "t", other));
    ASSERT_TRUE(a.ready() && x.ready());
    auto ca = tensorlane::Client::connect(a.socket());
    ASSERT_TRUE(a.logHas("node 'node-x' is refused: it registered the key fingerprint",
                         std::chrono::seconds(10)))
        << a.log();
    EXPECT_FALSE(knows(ca->get(), "node-x"));
    tl_remote r = 0;
    EXPECT_EQ(tl_lookup(ca->get(), "node-x", "inbox", &r, nullptr), TL_ENOENT);
    EXPECT_NE(std::string(tl_last_error()).find("refused"), std::string::npos) << tl_last_error();
    EXPECT_EQ(directory(ca->get()).value("refused", 0), 1);
    // The key file itself never reaches etcd: only its fingerprint.
    EXPECT_EQ(a.log().find(keyText('d').substr(18, 64)), std::string::npos);
}

TEST_F(DirectoryTest, TwoClustersOnOneEtcdStayApart) {
    Sidecar a(node("node-a", "red"));
    Sidecar b(node("node-b", "blue"));
    Sidecar c(node("node-c", "red"));
    ASSERT_TRUE(a.ready() && b.ready() && c.ready());
    auto ca = tensorlane::Client::connect(a.socket());
    auto cb = tensorlane::Client::connect(b.socket());
    ASSERT_TRUE(eventually([&] { return knows(ca->get(), "node-c"); }, std::chrono::seconds(10)));
    EXPECT_FALSE(knows(ca->get(), "node-b"));
    EXPECT_EQ(directory(cb->get()).value("nodes", -1), 0);
    tl_remote r = 0;
    EXPECT_EQ(tl_lookup(cb->get(), "node-a", "x", &r, nullptr), TL_ENOENT);
    EXPECT_NE(std::string(tl_last_error()).find("not registered"), std::string::npos)
        << tl_last_error();
}

long rssKiB(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("VmRSS:", 0) == 0) {
            return std::stol(line.substr(6));
        }
    }
    return 0;
}

/// 200 nodes registered by the test (real etcd writes under real leases, as a node's registrar
/// makes them) and one real sidecar watching: how long it takes to learn them all, its memory,
/// and how long one change takes to reach it.
TEST_F(DirectoryTest, ScaleTwoHundredRegistrations) {
    using namespace tensorlane::sidecar;
    Sidecar a(node("node-a"));
    ASSERT_TRUE(a.ready());
    auto ca = tensorlane::Client::connect(a.socket());
    EtcdOptions o;
    o.endpoints = {etcd_.url()};
    Status st;
    auto etcd = EtcdClient::create(o, &st);
    ASSERT_TRUE(etcd) << st.message();
    // The sidecar's own record gives the cluster's key fingerprint.
    std::optional<EtcdKv> self;
    ASSERT_TRUE(eventually(
        [&] { return etcd->get("/tensorlane/t/nodes/node-a", &self).isOk() && self.has_value(); }));
    const auto fp_at = self->value.find("\"key_fingerprint\":\"") + 19;
    const std::string fingerprint = self->value.substr(fp_at, 32);
    int64_t lease = 0;
    int64_t ttl = 0;
    ASSERT_TRUE(etcd->grantLease(60, &lease, &ttl).isOk());
    const auto record = [&](int i, uint64_t epoch) {
        char e[20];
        std::snprintf(e, sizeof e, "%016llx", static_cast<unsigned long long>(epoch));
        return "{\"v\":1,\"name\":\"sim-" + std::to_string(i) +
               "\",\"address\":\"127.0.0.1:" + std::to_string(20000 + i) +
               "\",\"transports\":[{\"name\":\"tcp\",\"info\":{}}],\"key_fingerprint\":\"" +
               fingerprint + "\",\"epoch\":\"" + e + "\"}";
    };
    const long rss_before = rssKiB(a.pid());
    const auto t0 = Clock::now();
    for (int i = 0; i < 200; ++i) {
        ASSERT_TRUE(
            etcd->put("/tensorlane/t/nodes/sim-" + std::to_string(i), record(i, 1 + i), lease)
                .isOk());
    }
    const auto t_put = Clock::now();
    ASSERT_TRUE(eventually([&] { return directory(ca->get()).value("nodes", 0) == 200; },
                           std::chrono::seconds(30)))
        << directory(ca->get()).dump() << a.log().substr(0, 3000);
    const auto t_all = Clock::now();
    const long rss_after = rssKiB(a.pid());
    // The whole status document, in pages: every one of the 200 peers, and `tensorlane status
    // --json` the same (one control message holds 64 KiB, a few dozen peers).
    const nlohmann::json whole = bigStatus(ca->get());
    ASSERT_TRUE(whole.contains("peers")) << "the status document did not parse";
    EXPECT_EQ(whole["peers"].size(), 200u);
    const std::string cli = runCli("status --json --socket " + a.socket());
    const auto cli_doc = nlohmann::json::parse(cli, nullptr, false);
    ASSERT_TRUE(cli_doc.is_object()) << cli.substr(0, 300);
    EXPECT_EQ(cli_doc["peers"].size(), 200u);
    EXPECT_GT(cli.size(), tensorlane::ipc::kMaxStatusText);
    // One change at a time: a new node, then its deletion, each until the sidecar shows it.
    std::vector<double> latencies;
    for (int i = 0; i < 20; ++i) {
        const std::string name = "sim-x" + std::to_string(i);
        const auto p0 = Clock::now();
        ASSERT_TRUE(
            etcd->put("/tensorlane/t/nodes/" + name,
                      record(0, 1000 + i).replace(record(0, 1000 + i).find("sim-0"), 5, name),
                      lease)
                .isOk());
        ASSERT_TRUE(eventually([&] { return directory(ca->get()).value("nodes", 0) == 201; },
                               std::chrono::seconds(5)));
        latencies.push_back(std::chrono::duration<double, std::milli>(Clock::now() - p0).count());
        const auto d0 = Clock::now();
        ASSERT_TRUE(etcd->remove("/tensorlane/t/nodes/" + name).isOk());
        ASSERT_TRUE(eventually([&] { return directory(ca->get()).value("nodes", 0) == 200; },
                               std::chrono::seconds(5)));
        latencies.push_back(std::chrono::duration<double, std::milli>(Clock::now() - d0).count());
    }
    std::sort(latencies.begin(), latencies.end());
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    std::printf(
        "scale: 200 registrations put in %.0f ms; the sidecar knew all 200 %.0f ms after the "
        "first put (%.0f ms after the last); RSS %ld KiB -> %ld KiB (+%ld KiB, %.1f KiB a node); "
        "one change (put or delete, etcd write to status): median %.1f ms, max %.1f ms over %zu\n",
        ms(t_put - t0), ms(t_all - t0), ms(t_all - t_put), rss_before, rss_after,
        rss_after - rss_before, static_cast<double>(rss_after - rss_before) / 200.0,
        latencies[latencies.size() / 2], latencies.back(), latencies.size());
    EXPECT_LT(ms(t_all - t_put), 5000.0);
    EXPECT_LT(latencies[latencies.size() / 2], 200.0);
    ASSERT_TRUE(etcd->revokeLease(lease).isOk());
    EXPECT_TRUE(eventually([&] { return directory(ca->get()).value("nodes", -1) == 0; },
                           std::chrono::seconds(10)));
}

}  // namespace
