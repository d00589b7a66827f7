// `tensorlane diag`'s peer probe: writes with immediate into each configured peer's
// "tensorlane.probe" region through the node's running sidecar, with their round trip; a peer
// that is down is a failing finding with a fix; no running sidecar is a warning. The probe
// region is the sidecar's own: a client cannot expose a name under "tensorlane.".
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "harness.hpp"
#include "tensorlane/tensorlane.hpp"

using namespace tltest;
using namespace std::chrono_literals;

namespace {

struct DiagRun {
    int status = -1;
    std::string out;
};

DiagRun diag(const std::string &config, const std::string &extra = "") {
    const std::string cmd =
        std::string(TENSORLANE_CLI_BIN) + " diag --json --config " + config + " " + extra;
    DiagRun r;
    FILE *p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
    if (p == nullptr) {
        return r;
    }
    std::array<char, 4096> buf{};
    size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) {
        r.out.append(buf.data(), n);
    }
    const int st = ::pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

/// The "peer" findings of a diag --json report.
std::vector<nlohmann::json> peerFindings(const std::string &out) {
    std::vector<nlohmann::json> v;
    auto j = nlohmann::json::parse(out, nullptr, false);
    if (j.is_discarded()) {
        return v;
    }
    for (auto &f : j["findings"]) {
        if (f.value("check", "") == "peer") {
            v.push_back(f);
        }
    }
    return v;
}

struct TcpPair {
    TcpPair() {
        writeFile(key, keyText('9'), 0600);
        const uint16_t pa = freePort(), pb = freePort();
        const std::string tcp =
            "keepalive_ms = 200\npeer_timeout_ms = 1500\nconnect_timeout_ms = 500\n"
            "reconnect_min_ms = 50\nreconnect_max_ms = 200\n";
        a = std::make_unique<Sidecar>(
            SidecarOptions{.name = "node-a",
                           .listen = "127.0.0.1:" + std::to_string(pa),
                           .peers = {{"node-b", "127.0.0.1:" + std::to_string(pb)}},
                           .key_file = key,
                           .tcp = tcp});
        b = std::make_unique<Sidecar>(
            SidecarOptions{.name = "node-b",
                           .listen = "127.0.0.1:" + std::to_string(pb),
                           .peers = {{"node-a", "127.0.0.1:" + std::to_string(pa)}},
                           .key_file = key,
                           .tcp = tcp});
    }
    TempDir dir;
    std::string key = dir.file("peer.key");
    std::unique_ptr<Sidecar> a, b;
};

}  // namespace

TEST(DiagProbe, ReachablePeerReportsItsRoundTrip) {
    TcpPair p;
    ASSERT_TRUE(p.a->ready() && p.b->ready()) << p.a->log();
    const DiagRun r = diag(p.a->configPath());
    const auto f = peerFindings(r.out);
    ASSERT_EQ(f.size(), 1u) << r.out;
    EXPECT_EQ(f[0].value("status", ""), "ok") << f[0].dump();
    const std::string detail = f[0].value("detail", "");
    EXPECT_NE(detail.find("peer node-b"), std::string::npos) << detail;
    EXPECT_NE(detail.find("round trip"), std::string::npos) << detail;
    EXPECT_NE(detail.find("over tcp"), std::string::npos) << detail;
    // The probes landed in node-b's probe region, and no client of node-b was told.
    auto cb = tensorlane::Client::connect(p.b->socket());
    ASSERT_TRUE(cb.ok());
    std::string buf(1 << 16, '\0');
    size_t len = 0;
    ASSERT_EQ(tl_sidecar_status(cb->get(), buf.data(), buf.size(), &len), TL_OK);
    buf.resize(len);
    auto st = nlohmann::json::parse(buf);
    EXPECT_EQ(st["counters"].value("probes_received", 0), 5) << st["counters"].dump();
    EXPECT_EQ(st["counters"].value("notifications_dropped", 0), 0);
    // Issue 24: at node-a they are probes, not the node's writes (nor, in the metrics, its
    // traffic to node-b).
    auto ca = tensorlane::Client::connect(p.a->socket());
    ASSERT_TRUE(ca.ok());
    buf.assign(1 << 16, '\0');
    ASSERT_EQ(tl_sidecar_status(ca->get(), buf.data(), buf.size(), &len), TL_OK);
    buf.resize(len);
    st = nlohmann::json::parse(buf);
    EXPECT_EQ(st["counters"].value("probes_sent", 0), 5) << st["counters"].dump();
    EXPECT_EQ(st["counters"].value("writes_remote", -1), 0) << st["counters"].dump();
}

TEST(DiagProbe, PeerThatIsDownFailsWithAFix) {
    TcpPair p;
    ASSERT_TRUE(p.a->ready() && p.b->ready());
    p.b->kill(SIGKILL);
    const DiagRun r = diag(p.a->configPath());
    EXPECT_EQ(r.status, 1) << r.out;  // a failing finding
    const auto f = peerFindings(r.out);
    ASSERT_EQ(f.size(), 1u) << r.out;
    EXPECT_EQ(f[0].value("status", ""), "fail") << f[0].dump();
    EXPECT_NE(f[0].value("detail", "").find("TL_EPEER"), std::string::npos) << f[0].dump();
    EXPECT_NE(f[0].value("fix", "").find("same key file"), std::string::npos) << f[0].dump();
    EXPECT_TRUE(p.a->alive());
}

TEST(DiagProbe, NoRunningSidecarIsAWarningAndNoProbeSkipsIt) {
    TcpPair p;
    ASSERT_TRUE(p.a->ready());
    const std::string config = p.a->configPath();
    p.a->kill(SIGTERM);
    const DiagRun r = diag(config);
    const auto f = peerFindings(r.out);
    ASSERT_EQ(f.size(), 1u) << r.out;
    EXPECT_EQ(f[0].value("status", ""), "warn") << f[0].dump();
    EXPECT_NE(f[0].value("detail", "").find("no sidecar answers"), std::string::npos);
    EXPECT_TRUE(peerFindings(diag(config, "--no-probe").out).empty());
}

TEST(DiagProbe, ClientsCannotExposeTheSidecarsOwnNames) {
    TcpPair p;
    ASSERT_TRUE(p.a->ready());
    auto c = tensorlane::Client::connect(p.a->socket());
    ASSERT_TRUE(c.ok());
    auto r = c->allocHost(4096);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(tl_expose(c->get(), r->id(), "tensorlane.probe"), TL_EINVAL);
    EXPECT_NE(std::string(tl_last_error()).find("sidecar's own"), std::string::npos)
        << tl_last_error();
    EXPECT_EQ(tl_expose(c->get(), r->id(), "tensorlane.other"), TL_EINVAL);
    EXPECT_EQ(tl_expose(c->get(), r->id(), "tensorlane-ok"), TL_OK) << tl_last_error();
}
