// A link cut between two nodes, each in its own network namespace joined by a veth pair that
// this test creates (and removes). Traffic goes only to addresses inside those namespaces.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "harness.hpp"
#include "tensorlane/tensorlane.hpp"
#include "veth.hpp"

using namespace tltest;

namespace {

/// Over tcp, and over the verbs transport on the simulated HCA (RoCEv2 packets on the veth).
class LinkCut : public ::testing::TestWithParam<std::string> {};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Transports, LinkCut, ::testing::Values("tcp", "verbs"),
                         [](const auto &param_info) { return param_info.param; });

TEST_P(LinkCut, InFlightWritesFailWithEpeerThenRecover) {
    VethPair net;
    if (!net.ok()) {
        GTEST_SKIP() << net.why();
    }
    TempDir dir;
    std::string key = dir.file("peer.key");
    writeFile(key, keyText('d'), 0600);
    const std::string tcp =
        "keepalive_ms = 200\npeer_timeout_ms = 1500\nconnect_timeout_ms = 1000\n"
        "reconnect_min_ms = 50\nreconnect_max_ms = 400\n";
    SidecarOptions a{.name = "node-a",
                     .listen = net.addressA() + ":18515",
                     .peers = {{"node-b", net.addressB() + ":18515"}},
                     .key_file = key,
                     .netns = net.nsA(),
                     .tcp = tcp,
                     .transport = GetParam(),
                     .rdma_ip = net.addressA(),
                     .rdma_netdev = net.vethA(),
                     .rdma_mtu = 1500,
                     .fabric = "timeout = 14\nretry_cnt = 3\n"};
    SidecarOptions b{.name = "node-b",
                     .listen = net.addressB() + ":18515",
                     .peers = {{"node-a", net.addressA() + ":18515"}},
                     .key_file = key,
                     .netns = net.nsB(),
                     .tcp = tcp,
                     .transport = GetParam(),
                     .rdma_ip = net.addressB(),
                     .rdma_netdev = net.vethB(),
                     .rdma_mtu = 1500,
                     .fabric = "timeout = 14\nretry_cnt = 3\n"};
    Sidecar sa(a), sb(b);
    ASSERT_TRUE(sa.ready()) << sa.log();
    ASSERT_TRUE(sb.ready()) << sb.log();

    auto cb = tensorlane::Client::connect(sb.socket());
    auto ca = tensorlane::Client::connect(sa.socket());
    ASSERT_TRUE(ca.ok() && cb.ok());
    constexpr size_t kBytes = 32 << 20;
    auto inbox = cb->allocHost(kBytes);
    auto src = ca->allocHost(kBytes);
    ASSERT_TRUE(inbox.ok() && src.ok() && inbox->expose("inbox").ok());
    fillRandom(src->data(), kBytes, 4);
    tl_remote r = 0;
    tl_status s = TL_EPEER;
    for (int i = 0; i < 100 && (s = tl_lookup(ca->get(), "node-b", "inbox", &r, nullptr)) != TL_OK;
         ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_EQ(s, TL_OK) << tl_last_error() << sa.log();
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(ca->get(), src->id(), 0, r, 0, kBytes, 1, &t), TL_OK);
    ASSERT_EQ(tl_wait(ca->get(), t, 20000), TL_OK) << tl_last_error() << sa.log() << sb.log();
    EXPECT_EQ(std::memcmp(src->data(), inbox->data(), kBytes), 0);

    // Cut the link, then write: node-a does not know yet (nothing has timed out), so the writes
    // are accepted and sit in flight on a dead path. Every one must fail with TL_EPEER within
    // peer_timeout_ms, whatever the timing (a write cannot win a race against the cut).
    ASSERT_TRUE(net.setLink(false));
    auto cut_at = std::chrono::steady_clock::now();
    std::vector<tl_ticket> tickets;
    for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(tl_write(ca->get(), src->id(), 0, r, 0, kBytes, 10 + i, &t), TL_OK)
            << tl_last_error();
        tickets.push_back(t);
    }
    int failed = 0;
    for (tl_ticket tk : tickets) {
        tl_status ws = tl_wait(ca->get(), tk, 30000);
        EXPECT_EQ(ws, TL_EPEER) << tl_status_str(ws);
        failed += ws == TL_EPEER;
    }
    auto took = std::chrono::steady_clock::now() - cut_at;
    EXPECT_EQ(failed, 8);
    EXPECT_LT(took, std::chrono::milliseconds(kPeerTimeoutMs + 1500))
        << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";

    // While down, new writes fail fast.
    auto t0 = std::chrono::steady_clock::now();
    s = tl_write(ca->get(), src->id(), 0, r, 0, 4096, 99, &t);
    if (s == TL_OK) {
        s = tl_wait(ca->get(), t, 30000);
    }
    EXPECT_EQ(s, TL_EPEER);
    EXPECT_LT(std::chrono::steady_clock::now() - t0,
              std::chrono::milliseconds(kPeerTimeoutMs + 500));

    // Restore: writes succeed again without restarting anything.
    ASSERT_TRUE(net.setLink(true));
    bool recovered = false;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!recovered && std::chrono::steady_clock::now() < end) {
        if (tl_write(ca->get(), src->id(), 0, r, 0, kBytes, 50, &t) == TL_OK &&
            tl_wait(ca->get(), t, 10000) == TL_OK) {
            recovered = true;
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    }
    EXPECT_TRUE(recovered) << sa.log().substr(0, 6000);
    EXPECT_TRUE(sa.alive() && sb.alive());
}
