// describeText and describeJson: every resolved value, derived values included.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::allErrors;
using testing::parse;

const char *const kDoc = R"(
[node]
name = "node-a"
listen = "127.0.0.1:18515"
socket = "/tmp/a.sock"
[security]
allowed_uids = [1000]
peer_key_file = "/tmp/k"
[[peers]]
name = "node-b"
address = "127.0.0.1:18516"
[[peers]]
name = "node-c"
address = "[::1]:18517"
)";

Config load(const std::string &text) {
    const ParseResult r = parse(text);
    EXPECT_TRUE(r.ok()) << allErrors(r);
    return r.config.value_or(Config{});
}

const TransportChoice kNoDevice{TransportKind::kTcp, "no RDMA device under /sys/class/infiniband"};

bool contains(const std::string &haystack, const std::string &needle) {
    return haystack.find(needle) != std::string::npos;
}

TEST(ConfigDescribe, TextShowsDerivedValues) {
    const std::string text = describeText(load(kDoc), kNoDevice);
    EXPECT_TRUE(contains(text, "traffic_class = 106 (dscp 26 << 2 | ecn 2)\n")) << text;
    EXPECT_TRUE(contains(text, "rc_timeout = 1.07 s (4.096 us * 2^18)\n")) << text;
    EXPECT_TRUE(
        contains(text, "transport = tcp (auto: no RDMA device under /sys/class/infiniband)\n"))
        << text;
    EXPECT_TRUE(contains(text, "gid_index = auto")) << text;
}

TEST(ConfigDescribe, TextShowsEveryTableAndPeer) {
    const std::string text = describeText(load(kDoc), kNoDevice);
    for (const char *needle : {"[node]\n",
                               "name = \"node-a\"\n",
                               "listen = \"127.0.0.1:18515\"\n",
                               "socket = \"/tmp/a.sock\"\n",
                               "connect_eagerly = false\n",
                               "[fabric]\n",
                               "device = \"auto\"\n",
                               "port = 1\n",
                               "netdev = \"auto\"\n",
                               "dscp = 26\n",
                               "ecn = true\n",
                               "pfc_priority = 3\n",
                               "trust = dscp\n",
                               "mtu = 4096",
                               "timeout = 18\n",
                               "retry_cnt = 7\n",
                               "rnr_retry = 7",
                               "min_rnr_timer = 12\n",
                               "qps_per_peer = 2\n",
                               "[tcp]\n",
                               "connections_per_peer = 2\n",
                               "chunk_bytes = 1048576\n",
                               "keepalive_ms = 1000\n",
                               "peer_timeout_ms = 5000\n",
                               "connect_timeout_ms = 2000\n",
                               "reconnect_min_ms = 100\n",
                               "reconnect_max_ms = 5000\n",
                               "[ipc]\n",
                               "ring_depth = 1024\n",
                               "poll_mode = auto (adaptive from 4 usable CPUs, else event; the "
                               "sidecar logs its choice)\n",
                               "spin_us = 50\n",
                               "[security]\n",
                               "allowed_uids = [1000]\n",
                               "allowed_gids = []",
                               "peer_key_file = \"/tmp/k\"\n",
                               "[[peers]]\nname = \"node-b\"\naddress = \"127.0.0.1:18516\"\n",
                               "[[peers]]\nname = \"node-c\"\naddress = \"[::1]:18517\""}) {
        EXPECT_TRUE(contains(text, needle)) << "missing: " << needle << "\n" << text;
    }
}

TEST(ConfigDescribe, TextWithoutEcnAndWithInfiniteTimeout) {
    const std::string text =
        describeText(load("[fabric]\necn = false\ntimeout = 0\ngid_index = 3\n"), kNoDevice);
    EXPECT_TRUE(contains(text, "traffic_class = 104 (dscp 26 << 2 | ecn 0)\n")) << text;
    EXPECT_TRUE(contains(text, "rc_timeout = infinite")) << text;
    EXPECT_TRUE(contains(text, "gid_index = 3\n")) << text;
    EXPECT_TRUE(contains(text, "peers: none")) << text;
}

TEST(ConfigDescribe, TextScalesTheTimeoutUnit) {
    EXPECT_TRUE(contains(describeText(load("[fabric]\ntimeout = 1\n"), kNoDevice),
                         "rc_timeout = 8.192 us (4.096 us * 2^1)"));
    EXPECT_TRUE(contains(describeText(load("[fabric]\ntimeout = 14\n"), kNoDevice),
                         "rc_timeout = 67.11 ms (4.096 us * 2^14)"));
}

TEST(ConfigDescribe, TextOfAnExplicitTransport) {
    const std::string text = describeText(load("[fabric]\ntransport = \"tcp\"\n"),
                                          {TransportKind::kTcp, "set in the file"});
    EXPECT_TRUE(contains(text, "transport = tcp (set in the file)\n")) << text;
}

TEST(ConfigDescribe, NeitherFormEndsWithANewline) {
    // --check-config ends the line itself.
    const Config c = load(kDoc);
    const std::string text = describeText(c, kNoDevice);
    const std::string json = describeJson(c, kNoDevice);
    ASSERT_FALSE(text.empty());
    ASSERT_FALSE(json.empty());
    EXPECT_NE(text.back(), '\n');
    EXPECT_EQ(json.back(), '}');
}

TEST(ConfigDescribe, JsonMirrorsTheTables) {
    const auto j = nlohmann::json::parse(describeJson(load(kDoc), kNoDevice));
    EXPECT_EQ(j["source"], "test.toml");
    EXPECT_EQ(j["node"]["name"], "node-a");
    EXPECT_EQ(j["node"]["listen"], "127.0.0.1:18515");
    EXPECT_EQ(j["node"]["socket"], "/tmp/a.sock");
    EXPECT_EQ(j["node"]["connect_eagerly"], false);
    EXPECT_EQ(j["fabric"]["transport"], "auto");
    EXPECT_EQ(j["fabric"]["gid_index"], "auto");
    EXPECT_EQ(j["fabric"]["dscp"], 26);
    EXPECT_EQ(j["fabric"]["ecn"], true);
    EXPECT_EQ(j["fabric"]["mtu"], 4096);
    EXPECT_EQ(j["fabric"]["trust"], "dscp");
    EXPECT_EQ(j["fabric"]["transports"], nlohmann::json::array({"verbs", "tcp"}));
    EXPECT_EQ(j["fabric"].size(), 19u);
    EXPECT_EQ(j["fabric"]["tclass_override"], "fail");
    EXPECT_EQ(j["security"]["tcp_integrity"], "mac");
    EXPECT_EQ(j["security"]["revoke_timeout_ms"], 1500);
    EXPECT_EQ(j["limits"]["registered_bytes"], uint64_t{64} << 30);
    EXPECT_EQ(j["limits"]["notification_backlog"], 65536);
    EXPECT_EQ(j["limits"]["sessions_per_uid"], 1024);
    EXPECT_EQ(j["limits"]["sessions_per_pid"], 256);
    EXPECT_EQ(j["limits"]["fd_reserve"], 256);
    EXPECT_EQ(j["limits"]["node_registered_bytes"], "auto");
    EXPECT_EQ(j["limits"]["in_flight"], 1024);
    EXPECT_EQ(j["metrics"]["listen"], "");
    EXPECT_EQ(j["tcp"]["chunk_bytes"], 1048576);
    EXPECT_EQ(j["tcp"].size(), 9u);
    EXPECT_EQ(j["tcp"]["tag_threads"], "auto");
    EXPECT_EQ(j["ipc"]["poll_mode"], "auto");
    EXPECT_EQ(j["ipc"].size(), 3u);
    EXPECT_EQ(j["security"]["allowed_uids"], nlohmann::json::array({1000}));
    EXPECT_EQ(j["security"]["allowed_gids"], nlohmann::json::array());
    EXPECT_EQ(j["security"]["peer_key_file"], "/tmp/k");
    ASSERT_EQ(j["peers"].size(), 2u);
    EXPECT_EQ(j["peers"][1]["name"], "node-c");
    EXPECT_EQ(j["peers"][1]["address"], "[::1]:18517");
}

TEST(ConfigDescribe, JsonDerivedValues) {
    const auto j = nlohmann::json::parse(describeJson(load(kDoc), kNoDevice));
    const auto &d = j["derived"];
    EXPECT_EQ(d["traffic_class"], 106);
    EXPECT_NEAR(d["rc_timeout_s"].get<double>(), 1.073741824, 1e-9);
    EXPECT_EQ(d["rc_timeout_infinite"], false);
    EXPECT_EQ(d["transport"], "tcp");
    EXPECT_EQ(d["transport_reason"], "no RDMA device under /sys/class/infiniband");
}

TEST(ConfigDescribe, JsonOfNumericGidAndInfiniteTimeout) {
    const auto j = nlohmann::json::parse(
        describeJson(load("[fabric]\ngid_index = 3\ntimeout = 0\necn = false\n"), kNoDevice));
    EXPECT_EQ(j["fabric"]["gid_index"], 3);
    EXPECT_EQ(j["derived"]["traffic_class"], 104);
    EXPECT_EQ(j["derived"]["rc_timeout_s"], 0.0);
    EXPECT_EQ(j["derived"]["rc_timeout_infinite"], true);
    EXPECT_EQ(j["peers"], nlohmann::json::array());
}

TEST(ConfigDescribe, JsonSurvivesBytesThatAreNotUtf8) {
    // A Config built in code is not checked; the dump must still be valid JSON.
    Config c;
    c.node.name = "bad\xff";
    EXPECT_TRUE(nlohmann::json::accept(describeJson(c, kNoDevice)));
}

}  // namespace
}  // namespace tensorlane::config
