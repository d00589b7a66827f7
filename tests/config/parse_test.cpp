// Parsing rules other than numeric ranges: defaults, strings, enumerations, unknown keys, types,
// cross rules, error collection and the error text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::allErrors;
using testing::onlyError;
using testing::parse;

// ---- defaults -------------------------------------------------------------------------------

TEST(ConfigDefaults, EmptyFileGivesEveryDefault) {
    const ParseResult r = parse("");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const Config &c = *r.config;
    EXPECT_EQ(c.source, "test.toml");
    EXPECT_EQ(c.node.name, "node-a");
    EXPECT_EQ(c.node.listen.host, "0.0.0.0");
    EXPECT_EQ(c.node.listen.port, 18515);
    EXPECT_EQ(c.node.socket, "/run/tensorlane/sidecar.sock");
    EXPECT_FALSE(c.node.connect_eagerly);
    EXPECT_EQ(c.fabric.transport, TransportKind::kAuto);
    EXPECT_EQ(c.fabric.device, "auto");
    EXPECT_EQ(c.fabric.port, 1);
    EXPECT_EQ(c.fabric.netdev, "auto");
    EXPECT_FALSE(c.fabric.gid_index.has_value());
    EXPECT_EQ(c.fabric.dscp, 26);
    EXPECT_TRUE(c.fabric.ecn);
    EXPECT_EQ(c.fabric.pfc_priority, 3);
    EXPECT_EQ(c.fabric.trust, TrustMode::kDscp);
    EXPECT_EQ(c.fabric.mtu, 4096u);
    EXPECT_EQ(c.fabric.timeout, 18);
    EXPECT_EQ(c.fabric.retry_cnt, 7);
    EXPECT_EQ(c.fabric.rnr_retry, 7);
    EXPECT_EQ(c.fabric.min_rnr_timer, 12);
    EXPECT_EQ(c.fabric.qps_per_peer, 2u);
    EXPECT_EQ(c.tcp.connections_per_peer, 2u);
    EXPECT_EQ(c.tcp.chunk_bytes, 1u << 20);
    EXPECT_EQ(c.tcp.keepalive_ms, 1000u);
    EXPECT_EQ(c.tcp.peer_timeout_ms, 5000u);
    EXPECT_EQ(c.tcp.connect_timeout_ms, 2000u);
    EXPECT_EQ(c.tcp.reconnect_min_ms, 100u);
    EXPECT_EQ(c.tcp.reconnect_max_ms, 5000u);
    EXPECT_FALSE(c.tcp.tag_threads.has_value());
    EXPECT_EQ(c.ipc.ring_depth, 1024u);
    EXPECT_EQ(c.ipc.poll_mode, PollMode::kAuto);
    EXPECT_EQ(c.ipc.spin_us, 50u);
    EXPECT_TRUE(c.security.allowed_uids.empty());
    EXPECT_TRUE(c.security.allowed_gids.empty());
    EXPECT_EQ(c.security.peer_key_file, "/etc/tensorlane/peer.key");
    EXPECT_EQ(c.security.tcp_integrity, TcpIntegrity::kMac);
    EXPECT_EQ(c.fabric.tclass_override, TclassOverride::kFail);
    EXPECT_EQ(c.fabric.preflight, Preflight::kWarn);
    EXPECT_EQ(c.fabric.gdr_flush, GdrFlush::kAuto);
    EXPECT_EQ(c.limits.regions, 4096u);
    EXPECT_EQ(c.limits.registered_bytes, uint64_t{64} << 30);
    EXPECT_EQ(c.limits.in_flight, 1024u);
    EXPECT_EQ(c.limits.peer_regions, 65536u);
    EXPECT_EQ(c.limits.notification_backlog, 65536u);
    EXPECT_EQ(c.limits.sessions_per_uid, 1024u);
    EXPECT_EQ(c.limits.sessions_per_pid, 256u);
    EXPECT_EQ(c.limits.fd_reserve, 256u);
    EXPECT_EQ(c.limits.node_registered_bytes, 0u) << "auto";
    EXPECT_FALSE(c.metrics.listen.has_value());
    EXPECT_TRUE(c.peers.empty());
}

TEST(ConfigDefaults, EmptyTablesAreFine) {
    const ParseResult r = parse("[node]\n[fabric]\n[tcp]\n[ipc]\n[security]\n");
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigDefaults, CommentsAndWhitespaceOnlyAreFine) {
    EXPECT_TRUE(parse("# nothing here\n\n   \n").ok());
}

TEST(ConfigParse, EveryKeyIsRead) {
    const ParseResult r = parse(R"(
[node]
name = "n1"
listen = "10.0.0.1:2000"
socket = "/tmp/x.sock"
connect_eagerly = true
[fabric]
transport = "verbs"
device = "mlx5_1"
port = 2
netdev = "eth1"
gid_index = 5
dscp = 10
ecn = false
pfc_priority = 4
trust = "pcp"
mtu = 1024
timeout = 14
retry_cnt = 5
rnr_retry = 6
min_rnr_timer = 10
qps_per_peer = 8
tclass_override = "adopt"
preflight = "fail"
gdr_flush = "off"
[tcp]
connections_per_peer = 4
chunk_bytes = 65536
keepalive_ms = 200
peer_timeout_ms = 3000
connect_timeout_ms = 500
reconnect_min_ms = 50
reconnect_max_ms = 800
tag_threads = 3
[ipc]
ring_depth = 256
poll_mode = "event"
spin_us = 0
[security]
allowed_uids = [1000, 1001]
allowed_gids = [100]
peer_key_file = "/k"
tcp_integrity = "none"
[limits]
regions = 16
registered_bytes = "64GiB"
in_flight = 32
peer_regions = 100
[metrics]
listen = "127.0.0.1:9464"
[[peers]]
name = "n2"
address = "10.0.0.2:2000"
[[peers]]
name = "n3"
address = "[fe80::1%eth0]:2001"
)");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const Config &c = *r.config;
    EXPECT_EQ(c.node.name, "n1");
    EXPECT_EQ(c.node.listen.text(), "10.0.0.1:2000");
    EXPECT_EQ(c.node.socket, "/tmp/x.sock");
    EXPECT_TRUE(c.node.connect_eagerly);
    EXPECT_EQ(c.fabric.transport, TransportKind::kVerbs);
    EXPECT_EQ(c.fabric.device, "mlx5_1");
    EXPECT_EQ(c.fabric.port, 2);
    EXPECT_EQ(c.fabric.netdev, "eth1");
    EXPECT_EQ(c.fabric.gid_index, 5);
    EXPECT_EQ(c.fabric.dscp, 10);
    EXPECT_FALSE(c.fabric.ecn);
    EXPECT_EQ(c.fabric.pfc_priority, 4);
    EXPECT_EQ(c.fabric.trust, TrustMode::kPcp);
    EXPECT_EQ(c.fabric.mtu, 1024u);
    EXPECT_EQ(c.fabric.timeout, 14);
    EXPECT_EQ(c.fabric.retry_cnt, 5);
    EXPECT_EQ(c.fabric.rnr_retry, 6);
    EXPECT_EQ(c.fabric.min_rnr_timer, 10);
    EXPECT_EQ(c.fabric.qps_per_peer, 8u);
    EXPECT_EQ(c.fabric.tclass_override, TclassOverride::kAdopt);
    EXPECT_EQ(c.fabric.preflight, Preflight::kFail);
    EXPECT_EQ(c.fabric.gdr_flush, GdrFlush::kOff);
    EXPECT_EQ(c.security.tcp_integrity, TcpIntegrity::kNone);
    EXPECT_EQ(c.limits.regions, 16u);
    EXPECT_EQ(c.limits.registered_bytes, uint64_t{64} << 30);
    EXPECT_EQ(c.limits.in_flight, 32u);
    EXPECT_EQ(c.limits.peer_regions, 100u);
    ASSERT_TRUE(c.metrics.listen.has_value());
    EXPECT_EQ(c.metrics.listen->text(), "127.0.0.1:9464");
    EXPECT_EQ(c.tcp.connections_per_peer, 4u);
    EXPECT_EQ(c.tcp.chunk_bytes, 65536u);
    EXPECT_EQ(c.tcp.keepalive_ms, 200u);
    EXPECT_EQ(c.tcp.peer_timeout_ms, 3000u);
    EXPECT_EQ(c.tcp.connect_timeout_ms, 500u);
    EXPECT_EQ(c.tcp.reconnect_min_ms, 50u);
    EXPECT_EQ(c.tcp.reconnect_max_ms, 800u);
    EXPECT_EQ(c.tcp.tag_threads, 3u);
    EXPECT_EQ(c.ipc.ring_depth, 256u);
    EXPECT_EQ(c.ipc.poll_mode, PollMode::kEvent);
    EXPECT_EQ(c.ipc.spin_us, 0u);
    EXPECT_EQ(c.security.allowed_uids, (std::vector<uint32_t>{1000, 1001}));
    EXPECT_EQ(c.security.allowed_gids, (std::vector<uint32_t>{100}));
    EXPECT_EQ(c.security.peer_key_file, "/k");
    ASSERT_EQ(c.peers.size(), 2u);
    EXPECT_EQ(c.peers[0].name, "n2");
    EXPECT_EQ(c.peers[0].address.host, "10.0.0.2");
    EXPECT_EQ(c.peers[0].address.port, 2000);
    EXPECT_EQ(c.peers[1].address.host, "fe80::1%eth0");
    EXPECT_EQ(c.peers[1].address.text(), "[fe80::1%eth0]:2001");
    EXPECT_EQ(c.findPeer("n3"), &c.peers[1]);
    EXPECT_EQ(c.findPeer("n4"), nullptr);
}

TEST(ConfigParse, DottedKeysAndInlineTablesAreTheSameTables) {
    const ParseResult r = parse(
        "fabric.dscp = 10\n"
        "node = { name = \"x\" }\n"
        "peers = [ { name = \"y\", address = \"h:1\" } ]\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->fabric.dscp, 10);
    EXPECT_EQ(r.config->node.name, "x");
    ASSERT_EQ(r.config->peers.size(), 1u);
    EXPECT_EQ(r.config->peers[0].address.text(), "h:1");
}

// ---- strings --------------------------------------------------------------------------------

TEST(ConfigStrings, NodeNameCharactersAndLength) {
    for (const std::string &ok :
         std::vector<std::string>{"a", "node-a", "Node_1.rack2", std::string(63, 'x')}) {
        const ParseResult r = parse("[node]\nname = \"" + ok + "\"\n");
        ASSERT_TRUE(r.ok()) << ok << "\n" << allErrors(r);
        EXPECT_EQ(r.config->node.name, ok);
    }
    for (const std::string &bad :
         std::vector<std::string>{"", "node a", "node/a", "nöde", "a:b", std::string(64, 'x')}) {
        SCOPED_TRACE(bad);
        const Error e = onlyError(parse("[node]\nname = \"" + bad + "\"\n"));
        EXPECT_EQ(e.key, "node.name");
        EXPECT_EQ(e.line, 2u);
        EXPECT_EQ(e.column, 8u);
        EXPECT_EQ(e.expected, "a name of 1-63 characters [A-Za-z0-9._-]");
    }
}

TEST(ConfigStrings, ListenAcceptsHostPortAndBracketedIpv6) {
    struct Case {
        std::string text;
        std::string host;
        uint16_t port;
    };
    for (const Case &c :
         {Case{"0.0.0.0:1", "0.0.0.0", 1}, Case{"10.0.0.2:65535", "10.0.0.2", 65535},
          Case{"node-b.example:18515", "node-b.example", 18515}, Case{"[::1]:18515", "::1", 18515},
          Case{"[::]:1", "::", 1}, Case{"[::ffff:10.0.0.1]:80", "::ffff:10.0.0.1", 80}}) {
        const ParseResult r = parse("[node]\nlisten = \"" + c.text + "\"\n");
        ASSERT_TRUE(r.ok()) << c.text << "\n" << allErrors(r);
        EXPECT_EQ(r.config->node.listen.host, c.host);
        EXPECT_EQ(r.config->node.listen.port, c.port);
        EXPECT_EQ(r.config->node.listen.text(), c.text);
    }
}

TEST(ConfigStrings, ListenRejectsBadAddresses) {
    for (const std::string bad :
         {"",        "host",       "host:",   ":18515",   "host:0",  "host:65536", "host:123456",
          "host:-1", "host:+1",    "host:1a", "ho st:1",  " host:1", "host:1 ",    "::1:18515",
          "[::1]",   "[::1]18515", "[]:1",    "[host]:1", "[::1:1",  "a/b:1",      "host:١"}) {
        SCOPED_TRACE(bad);
        const Error e = onlyError(parse("[node]\nlisten = \"" + bad + "\"\n"));
        EXPECT_EQ(e.key, "node.listen");
        EXPECT_EQ(e.line, 2u);
        EXPECT_EQ(e.column, 10u);
        EXPECT_NE(e.expected.find("host:port"), std::string::npos);
    }
}

TEST(ConfigStrings, SocketMustBeAbsoluteAndFitSunPath) {
    const std::string longest = "/" + std::string(106, 's');  // 107 bytes + NUL = sun_path
    ASSERT_TRUE(parse("[node]\nsocket = \"" + longest + "\"\n").ok());
    ASSERT_TRUE(parse("[node]\nsocket = \"/a\"\n").ok());
    for (const std::string &bad : {longest + "s", std::string("relative.sock"), std::string()}) {
        SCOPED_TRACE(bad);
        const Error e = onlyError(parse("[node]\nsocket = \"" + bad + "\"\n"));
        EXPECT_EQ(e.key, "node.socket");
        EXPECT_EQ(e.column, 10u);
        EXPECT_EQ(e.expected, "an absolute path shorter than 108 bytes");
    }
    EXPECT_EQ(onlyError(parse("[node]\nsocket = \"/a\\u0000b\"\n")).key, "node.socket");
}

TEST(ConfigStrings, DeviceAndNetdevNames) {
    EXPECT_TRUE(parse("[fabric]\ndevice = \"mlx5_0\"\nnetdev = \"enp1s0f0np0\"\n").ok());
    EXPECT_TRUE(parse("[fabric]\nnetdev = \"" + std::string(15, 'e') + "\"\n").ok());
    EXPECT_EQ(onlyError(parse("[fabric]\nnetdev = \"" + std::string(16, 'e') + "\"\n")).key,
              "fabric.netdev");
    // The device name is a sysfs path component: nothing that could leave the directory.
    for (const std::string bad : {"", "..", ".", "../mlx5_0", "mlx5/0", "mlx 5"}) {
        SCOPED_TRACE(bad);
        EXPECT_EQ(onlyError(parse("[fabric]\ndevice = \"" + bad + "\"\n")).key, "fabric.device");
        EXPECT_EQ(onlyError(parse("[fabric]\nnetdev = \"" + bad + "\"\n")).key, "fabric.netdev");
    }
}

TEST(ConfigStrings, PeerKeyFileMustBeNonEmpty) {
    const Error e = onlyError(parse("[security]\npeer_key_file = \"\"\n"));
    EXPECT_EQ(e.key, "security.peer_key_file");
    EXPECT_EQ(e.column, 17u);
}

TEST(ConfigStrings, LongStringsAreCutInMessages) {
    const Error e = onlyError(parse("[node]\nname = \"" + std::string(5000, 'x') + " y\"\n"));
    EXPECT_LT(e.found.size(), 100u);
    EXPECT_EQ(e.found.substr(e.found.size() - 4), "\"...");
}

// ---- enumerations ---------------------------------------------------------------------------

TEST(ConfigEnums, TransportValues) {
    EXPECT_EQ(parse("[fabric]\ntransport = \"auto\"\n").config->fabric.transport,
              TransportKind::kAuto);
    EXPECT_EQ(parse("[fabric]\ntransport = \"verbs\"\n").config->fabric.transport,
              TransportKind::kVerbs);
    EXPECT_EQ(parse("[fabric]\ntransport = \"tcp\"\n").config->fabric.transport,
              TransportKind::kTcp);
    for (const std::string bad : {"Auto", "TCP", "rdma", "", " tcp"}) {
        SCOPED_TRACE(bad);
        const Error e = onlyError(parse("[fabric]\ntransport = \"" + bad + "\"\n"));
        EXPECT_EQ(e.key, "fabric.transport");
        EXPECT_EQ(e.line, 2u);
        EXPECT_EQ(e.column, 13u);
        EXPECT_EQ(e.expected, "one of \"auto\", \"verbs\", \"tcp\"");
        EXPECT_EQ(e.found, "\"" + bad + "\"");
    }
}

TEST(ConfigEnums, PollModeValues) {
    EXPECT_EQ(parse("[ipc]\npoll_mode = \"auto\"\n").config->ipc.poll_mode, PollMode::kAuto);
    EXPECT_EQ(parse("[ipc]\npoll_mode = \"busy\"\n").config->ipc.poll_mode, PollMode::kBusy);
    EXPECT_EQ(parse("[ipc]\npoll_mode = \"adaptive\"\n").config->ipc.poll_mode,
              PollMode::kAdaptive);
    EXPECT_EQ(parse("[ipc]\npoll_mode = \"event\"\n").config->ipc.poll_mode, PollMode::kEvent);
    const Error e = onlyError(parse("[ipc]\npoll_mode = \"spin\"\n"));
    EXPECT_EQ(e.text(),
              "test.toml:2:13: key 'ipc.poll_mode': expected one of \"auto\", \"busy\", "
              "\"adaptive\", \"event\", found \"spin\"");
}

// Issue 24: on 2 vCPUs the default (then adaptive) made a 64 B bench round trip ~90x a TCP
// ping-pong; auto sleeps at once there and spins only where CPUs can be spared.
TEST(ConfigEnums, AutoPollModeSpinsOnlyWhereCpusCanBeSpared) {
    const PollModeChoice small = resolvePollMode(PollMode::kAuto, 2, "affinity");
    EXPECT_EQ(small.mode, PollMode::kEvent);
    EXPECT_FALSE(small.warn);
    EXPECT_NE(small.reason.find("auto: only 2 usable CPUs (affinity)"), std::string::npos)
        << small.reason;
    const PollModeChoice three = resolvePollMode(PollMode::kAuto, 3, "cgroup cpu.max");
    EXPECT_EQ(three.mode, PollMode::kEvent);
    EXPECT_NE(three.reason.find("cgroup cpu.max"), std::string::npos) << three.reason;
    const PollModeChoice big = resolvePollMode(PollMode::kAuto, kAdaptiveMinCpus, "affinity");
    EXPECT_EQ(big.mode, PollMode::kAdaptive);
    EXPECT_NE(big.reason.find("auto: 4 usable CPUs"), std::string::npos) << big.reason;
    // An explicit mode is kept; a spinning one on a small host is kept with a warning.
    for (PollMode m : {PollMode::kBusy, PollMode::kAdaptive}) {
        const PollModeChoice c = resolvePollMode(m, 2, "affinity");
        EXPECT_EQ(c.mode, m);
        EXPECT_TRUE(c.warn);
        EXPECT_NE(c.reason.find("\"event\" or \"auto\" suits this host"), std::string::npos)
            << c.reason;
        EXPECT_FALSE(resolvePollMode(m, 16, "affinity").warn);
    }
    const PollModeChoice event = resolvePollMode(PollMode::kEvent, 1, "affinity");
    EXPECT_EQ(event.mode, PollMode::kEvent);
    EXPECT_FALSE(event.warn);
    EXPECT_EQ(event.reason, "set in the file");
}

TEST(ConfigEnums, TrustValues) {
    EXPECT_EQ(parse("[fabric]\ntrust = \"dscp\"\n").config->fabric.trust, TrustMode::kDscp);
    EXPECT_EQ(parse("[fabric]\ntrust = \"pcp\"\n").config->fabric.trust, TrustMode::kPcp);
    const Error e = onlyError(parse("[fabric]\ntrust = \"l3\"\n"));
    EXPECT_EQ(e.key, "fabric.trust");
    EXPECT_EQ(e.expected, "one of \"dscp\", \"pcp\"");
}

TEST(ConfigEnums, ToStringNamesMatchTheFile) {
    EXPECT_STREQ(toString(TransportKind::kAuto), "auto");
    EXPECT_STREQ(toString(TransportKind::kVerbs), "verbs");
    EXPECT_STREQ(toString(TransportKind::kTcp), "tcp");
    EXPECT_STREQ(toString(PollMode::kBusy), "busy");
    EXPECT_STREQ(toString(PollMode::kAdaptive), "adaptive");
    EXPECT_STREQ(toString(PollMode::kEvent), "event");
    EXPECT_STREQ(toString(PollMode::kAuto), "auto");
    EXPECT_STREQ(toString(TrustMode::kDscp), "dscp");
    EXPECT_STREQ(toString(TrustMode::kPcp), "pcp");
}

// ---- unknown keys ---------------------------------------------------------------------------

TEST(ConfigUnknownKeys, RejectedInEveryTable) {
    for (const std::string table : {"node", "fabric", "tcp", "ipc", "security"}) {
        SCOPED_TRACE(table);
        const Error e = onlyError(parse("[" + table + "]\nbogus = 1\n"));
        EXPECT_EQ(e.key, table + ".bogus");
        EXPECT_EQ(e.line, 2u);
        EXPECT_EQ(e.column, 1u);
        EXPECT_EQ(e.found, "unknown key");
        EXPECT_NE(e.expected.find("a key of [" + table + "]"), std::string::npos) << e.expected;
    }
}

TEST(ConfigUnknownKeys, RejectedInPeers) {
    const Error e = onlyError(parse("[[peers]]\nname = \"b\"\naddress = \"h:1\"\n  port = 5\n"));
    EXPECT_EQ(e.key, "peers[0].port");
    EXPECT_EQ(e.line, 4u);
    EXPECT_EQ(e.column, 3u);
}

TEST(ConfigUnknownKeys, RejectedAtTopLevel) {
    Error e = onlyError(parse("bogus = 1\n"));
    EXPECT_EQ(e.key, "bogus");
    EXPECT_EQ(e.line, 1u);
    EXPECT_EQ(e.column, 1u);
    EXPECT_EQ(e.found, "unknown key");

    e = onlyError(parse("# comment\n[telemetry]\nport = 9100\n"));
    EXPECT_EQ(e.key, "telemetry");
    EXPECT_EQ(e.line, 2u);
    EXPECT_NE(e.expected.find("node, fabric, tcp, ipc, security, limits, metrics, peers"),
              std::string::npos)
        << e.expected;
}

TEST(ConfigUnknownKeys, RejectedInNestedTables) {
    const Error e = onlyError(parse("[fabric.extra]\nx = 1\n"));
    EXPECT_EQ(e.key, "fabric.extra");
    EXPECT_EQ(e.line, 1u);
}

TEST(ConfigUnknownKeys, QuotedKeysAreShownQuoted) {
    // A quoted key may hold a newline or a dot; the error text must stay one unambiguous line.
    Error e = onlyError(parse("[fabric]\n\"a\\nb\" = 1\n"));
    EXPECT_EQ(e.key, "fabric.\"a\\x0Ab\"");
    EXPECT_EQ(e.text().find('\n'), std::string::npos) << e.text();
    e = onlyError(parse("[fabric]\n\"ds.cp\" = 1\n"));
    EXPECT_EQ(e.key, "fabric.\"ds.cp\"");
    e = onlyError(parse("\"\" = 1\n"));
    EXPECT_EQ(e.key, "\"\"");
}

TEST(ConfigUnknownKeys, SuggestsTheClosestKey) {
    const Error e = onlyError(parse("[fabric]\ndscpp = 26\n"));
    EXPECT_EQ(e.text(),
              "test.toml:2:1: key 'fabric.dscpp': expected a key of [fabric] (did you mean "
              "'fabric.dscp'?), found unknown key");
    EXPECT_NE(onlyError(parse("[fabrc]\n")).expected.find("did you mean 'fabric'?"),
              std::string::npos);
}

// ---- wrong types ----------------------------------------------------------------------------

TEST(ConfigTypes, StringWhereIntegerExpected) {
    const Error e = onlyError(parse("[fabric]\ndscp = \"x\"\n"));
    EXPECT_EQ(e.text(),
              "test.toml:2:8: key 'fabric.dscp': expected an integer 0-63, found string \"x\"");
}

TEST(ConfigTypes, EveryKindOfWrongValueIsNamed) {
    struct Case {
        std::string doc;
        std::string key;
        std::string found;
    };
    for (const Case &c : {
             Case{"[fabric]\ndscp = 26.0\n", "fabric.dscp", "float 26.0"},
             Case{"[fabric]\ndscp = true\n", "fabric.dscp", "boolean true"},
             Case{"[fabric]\ndscp = [26]\n", "fabric.dscp", "an array"},
             Case{"[fabric]\ndscp = {a = 1}\n", "fabric.dscp", "a table"},
             Case{"[fabric]\ndscp = 1979-05-27\n", "fabric.dscp", "date 1979-05-27"},
             Case{"[fabric]\necn = 1\n", "fabric.ecn", "integer 1"},
             Case{"[fabric]\necn = \"true\"\n", "fabric.ecn", "string \"true\""},
             Case{"[fabric]\ntransport = 1\n", "fabric.transport", "integer 1"},
             Case{"[node]\nname = 5\n", "node.name", "integer 5"},
             Case{"[node]\nlisten = 18515\n", "node.listen", "integer 18515"},
             Case{"[node]\nconnect_eagerly = \"yes\"\n", "node.connect_eagerly", "string \"yes\""},
             Case{"[security]\nallowed_uids = 0\n", "security.allowed_uids", "integer 0"},
             Case{"[security]\nallowed_uids = [\"root\"]\n", "security.allowed_uids[0]",
                  "string \"root\""},
             Case{"[security]\npeer_key_file = 1\n", "security.peer_key_file", "integer 1"},
             Case{"node = 5\n", "node", "integer 5"},
             Case{"fabric = \"fast\"\n", "fabric", "string \"fast\""},
             Case{"peers = 5\n", "peers", "integer 5"},
             Case{"peers = { name = \"b\" }\n", "peers", "a table"},
             Case{"peers = [1]\n", "peers[0]", "integer 1"},
         }) {
        SCOPED_TRACE(c.doc);
        const Error e = onlyError(parse(c.doc));
        EXPECT_EQ(e.key, c.key);
        EXPECT_EQ(e.found, c.found);
        EXPECT_NE(e.line, 0u);
    }
}

TEST(ConfigTypes, TableWhereTableExpectedNamesIt) {
    const Error e = onlyError(parse("node = 5\n"));
    EXPECT_EQ(e.text(), "test.toml:1:8: key 'node': expected a table ([node]), found integer 5");
}

// ---- peers and cross rules ------------------------------------------------------------------

TEST(ConfigPeers, NameAndAddressAreRequired) {
    const ParseResult r = parse("[[peers]]\nname = \"b\"\n[[peers]]\naddress = \"h:2\"\n");
    ASSERT_EQ(r.errors.size(), 2u) << allErrors(r);
    EXPECT_EQ(r.errors[0].key, "peers[0].address");
    EXPECT_EQ(r.errors[0].found, "no address key");
    EXPECT_EQ(r.errors[1].key, "peers[1].name");
    EXPECT_EQ(r.errors[1].found, "no name key");
    EXPECT_NE(r.errors[0].line, 0u);
    EXPECT_NE(r.errors[1].line, 0u);
}

TEST(ConfigPeers, PeerNameRules) {
    const Error e = onlyError(parse("[[peers]]\nname = \"bad name\"\naddress = \"h:1\"\n"));
    EXPECT_EQ(e.key, "peers[0].name");
    EXPECT_EQ(e.line, 2u);
    EXPECT_EQ(e.column, 8u);
}

TEST(ConfigPeers, PeerAddressRules) {
    const Error e = onlyError(parse("[[peers]]\nname = \"b\"\naddress = \"h:70000\"\n"));
    EXPECT_EQ(e.key, "peers[0].address");
    EXPECT_EQ(e.line, 3u);
    EXPECT_EQ(e.column, 11u);
    EXPECT_EQ(e.found, "\"h:70000\"");
}

TEST(ConfigCrossRules, DuplicatePeerNames) {
    const Error e =
        onlyError(parse("[[peers]]\nname = \"b\"\naddress = \"h:1\"\n[[peers]]\nname = "
                        "\"b\"\naddress = \"h:2\"\n"));
    EXPECT_EQ(e.key, "peers[1].name");
    EXPECT_EQ(e.line, 5u);
    EXPECT_EQ(e.column, 8u);
    EXPECT_EQ(e.found, "\"b\"");
    EXPECT_NE(e.expected.find("peers[0] at line 2"), std::string::npos) << e.expected;
}

TEST(ConfigCrossRules, DuplicatePeerAddresses) {
    const Error e =
        onlyError(parse("[[peers]]\nname = \"b\"\naddress = \"Host.example:1\"\n"
                        "[[peers]]\nname = \"c\"\naddress = \"host.EXAMPLE:1\"\n"));
    EXPECT_EQ(e.key, "peers[1].address");
    EXPECT_EQ(e.line, 6u);
    EXPECT_EQ(e.column, 11u);
    EXPECT_NE(e.expected.find("peers[0] at line 3"), std::string::npos) << e.expected;
    // Same host, other port: two sidecars on one host, as in the loopback demo.
    EXPECT_TRUE(parse("[[peers]]\nname = \"b\"\naddress = \"h:1\"\n"
                      "[[peers]]\nname = \"c\"\naddress = \"h:2\"\n")
                    .ok());
}

TEST(ConfigCrossRules, PeerNamedLikeThisNode) {
    Error e =
        onlyError(parse("[node]\nname = \"x\"\n[[peers]]\nname = \"x\"\naddress = \"h:1\"\n"));
    EXPECT_EQ(e.key, "peers[0].name");
    EXPECT_EQ(e.line, 4u);
    EXPECT_EQ(e.column, 8u);
    EXPECT_NE(e.expected.find("node.name = \"x\""), std::string::npos) << e.expected;
    // The default node name counts too.
    e = onlyError(parse("[[peers]]\nname = \"node-a\"\naddress = \"h:1\"\n"));
    EXPECT_EQ(e.key, "peers[0].name");
}

TEST(ConfigCrossRules, DuplicateTomlKeyIsReportedByTheParser) {
    const Error e = onlyError(parse("[fabric]\ndscp = 1\ndscp = 2\n"));
    EXPECT_EQ(e.line, 3u);
    EXPECT_NE(e.column, 0u);
    EXPECT_NE(e.message.find("dscp"), std::string::npos) << e.message;
    EXPECT_EQ(e.text().rfind("test.toml:3:", 0), 0u) << e.text();
}

TEST(ConfigCrossRules, DuplicateTableIsReportedByTheParser) {
    const Error e = onlyError(parse("[fabric]\ndscp = 1\n[fabric]\necn = true\n"));
    EXPECT_EQ(e.line, 3u);
    EXPECT_FALSE(e.message.empty());
}

// ---- error collection and text --------------------------------------------------------------

TEST(ConfigErrors, AllErrorsAreCollectedInFileOrder) {
    const ParseResult r = parse(R"([node]
name = "bad name"
listen = "nowhere"
[fabric]
dscp = 64
mtu = 1500
bogus = 1
[ipc]
ring_depth = 1000
poll_mode = "spin"
[security]
allowed_uids = [-1]
[[peers]]
name = "b"
address = "h:0"
)");
    EXPECT_FALSE(r.ok());
    EXPECT_FALSE(r.config.has_value());
    ASSERT_EQ(r.errors.size(), 9u) << allErrors(r);
    const char *keys[] = {
        "node.name",       "node.listen",    "fabric.dscp",   "fabric.mtu",
        "fabric.bogus",    "ipc.ring_depth", "ipc.poll_mode", "security.allowed_uids[0]",
        "peers[0].address"};
    const uint32_t lines[] = {2, 3, 5, 6, 7, 9, 10, 12, 15};
    for (size_t i = 0; i < r.errors.size(); ++i) {
        EXPECT_EQ(r.errors[i].key, keys[i]);
        EXPECT_EQ(r.errors[i].line, lines[i]) << r.errors[i].text();
    }
}

TEST(ConfigErrors, SyntaxErrorIsOneErrorWithItsPosition) {
    const ParseResult r = parse("[fabric]\ndscp = 26\necn = tru\nmtu = 1\n");
    const Error e = onlyError(r);
    EXPECT_EQ(e.line, 3u);
    EXPECT_GT(e.column, 0u);
    EXPECT_EQ(e.key, "");
    EXPECT_EQ(e.message.rfind("invalid TOML: ", 0), 0u) << e.message;
    EXPECT_EQ(e.text().rfind("test.toml:3:", 0), 0u) << e.text();
}

TEST(ConfigErrors, SyntaxErrorTextIsOneLine) {
    // toml++ quotes what it saw, and here that is "tru\n".
    const Error e = onlyError(parse("[fabric]\necn = tru\n"));
    EXPECT_EQ(e.text().find('\n'), std::string::npos) << e.text();
    EXPECT_NE(e.text().find("\\n"), std::string::npos) << e.text();
}

TEST(ConfigErrors, UnterminatedTableHeader) {
    const Error e = onlyError(parse("[fabric\n"));
    EXPECT_EQ(e.line, 1u);
    EXPECT_FALSE(e.text().empty());
}

TEST(ConfigErrors, InvalidUtf8IsASyntaxError) {
    const Error e = onlyError(parse("[node]\nname = \"\xff\xfe\"\n"));
    EXPECT_EQ(e.line, 2u);
    EXPECT_FALSE(e.message.empty());
}

TEST(ConfigErrors, TextWithPosition) {
    Error e;
    e.file = "a.toml";
    e.line = 3;
    e.column = 8;
    e.key = "fabric.dscp";
    e.expected = "an integer 0-63";
    e.found = "64";
    EXPECT_EQ(e.text(), "a.toml:3:8: key 'fabric.dscp': expected an integer 0-63, found 64");
}

TEST(ConfigErrors, TextWithoutPositionOmitsLineAndColumn) {
    Error e;
    e.file = "a.toml";
    e.key = "security.peer_key_file";
    e.expected = "a key file";
    e.found = "\"/k\": no such file";
    EXPECT_EQ(e.text(),
              "a.toml: key 'security.peer_key_file': expected a key file, found "
              "\"/k\": no such file");
}

TEST(ConfigErrors, TextOfAMessageError) {
    Error e;
    e.file = "a.toml";
    e.line = 1;
    e.column = 2;
    e.message = "invalid TOML: oops";
    EXPECT_EQ(e.text(), "a.toml:1:2: invalid TOML: oops");
}

TEST(ConfigErrors, SourceNameIsUsedInErrors) {
    const ParseResult r =
        parseString("[fabric]\ndscp = 99\n", "/etc/tl.toml", ParseOptions{.check_key_file = false});
    ASSERT_EQ(r.errors.size(), 1u);
    EXPECT_EQ(r.errors[0].text().rfind("/etc/tl.toml:2:8: ", 0), 0u);
    const ParseResult ok = parseString("", "<string>", ParseOptions{.check_key_file = false});
    EXPECT_EQ(ok.config->source, "<string>");
}

TEST(ConfigErrors, DefaultSourceNameIsString) {
    const ParseResult r = parseString("[fabric]\ndscp = 99\n");
    ASSERT_FALSE(r.errors.empty());
    EXPECT_EQ(r.errors[0].file, "<string>");
}

TEST(ConfigErrors, EmbeddedNulBytesDoNotCrash) {
    const std::string text("[fabric]\ndscp = 1\0\n", 19);
    const ParseResult r = parse(text);
    EXPECT_FALSE(r.ok());
    ASSERT_FALSE(r.errors.empty());
    EXPECT_FALSE(r.errors[0].text().empty());
}

// ---- derived values -------------------------------------------------------------------------

TEST(ConfigDerived, TrafficClassWithEcn) {
    EXPECT_EQ(parse("[fabric]\ndscp = 26\necn = true\n").config->trafficClass(), 106);
}

TEST(ConfigDerived, TrafficClassWithoutEcn) {
    EXPECT_EQ(parse("[fabric]\ndscp = 26\necn = false\n").config->trafficClass(), 104);
}

TEST(ConfigDerived, TrafficClassEdges) {
    EXPECT_EQ(parse("[fabric]\ndscp = 63\n").config->trafficClass(), 254);
    EXPECT_EQ(parse("[fabric]\ndscp = 0\necn = false\n").config->trafficClass(), 0);
}

TEST(ConfigDerived, RcTimeout) {
    Config c;
    c.fabric.timeout = 18;
    EXPECT_NEAR(c.rcTimeoutSeconds(), 1.073741824, 1e-12);
    c.fabric.timeout = 1;
    EXPECT_NEAR(c.rcTimeoutSeconds(), 8.192e-6, 1e-15);
    c.fabric.timeout = 31;
    EXPECT_NEAR(c.rcTimeoutSeconds(), 4.096e-6 * 2147483648.0, 1e-6);
    c.fabric.timeout = 0;  // infinite
    EXPECT_EQ(c.rcTimeoutSeconds(), 0.0);
}

TEST(ConfigDerived, EndpointText) {
    EXPECT_EQ((Endpoint{"10.0.0.2", 18515}).text(), "10.0.0.2:18515");
    EXPECT_EQ((Endpoint{"::1", 18515}).text(), "[::1]:18515");
}

TEST(ConfigLimits, RegisteredBytesTakesUnitsAndIntegers) {
    const auto bytes = [](const std::string &v) {
        const ParseResult r = parse("[limits]\nregistered_bytes = " + v + "\n");
        return r.ok() ? r.config->limits.registered_bytes : uint64_t{0};
    };
    EXPECT_EQ(bytes("\"1TiB\""), uint64_t{1} << 40);
    EXPECT_EQ(bytes("\"512 MiB\""), uint64_t{512} << 20);
    EXPECT_EQ(bytes("\"4k\""), 4096u);
    EXPECT_EQ(bytes("\"2g\""), uint64_t{2} << 30);
    EXPECT_EQ(bytes("1048576"), 1048576u);
    EXPECT_EQ(bytes("\"1PiB\""), uint64_t{1} << 50);
}

TEST(ConfigLimits, BadSizesNameWhatWasFound) {
    for (const char *v : {"\"1XiB\"", "\"\"", "\"-1MiB\"", "0", "-5", "4095", "\"2PiB\"",
                          "\"99999999999999999999\"", "\"16777216TiB\"", "1.5", "true"}) {
        const Error e = onlyError(parse(std::string("[limits]\nregistered_bytes = ") + v + "\n"));
        EXPECT_EQ(e.key, "limits.registered_bytes") << v;
        EXPECT_NE(e.expected.find("4KiB-1PiB"), std::string::npos) << v;
        EXPECT_FALSE(e.found.empty()) << v;
    }
}

TEST(ConfigLimits, CountsHaveRanges) {
    EXPECT_EQ(onlyError(parse("[limits]\nregions = 0\n")).key, "limits.regions");
    EXPECT_EQ(onlyError(parse("[limits]\nin_flight = 65537\n")).key, "limits.in_flight");
    EXPECT_EQ(onlyError(parse("[limits]\npeer_regions = 0\n")).key, "limits.peer_regions");
    EXPECT_EQ(onlyError(parse("[limits]\nnotification_backlog = 0\n")).key,
              "limits.notification_backlog");
    EXPECT_EQ(onlyError(parse("[limits]\nsessions_per_uid = 0\n")).key, "limits.sessions_per_uid");
    EXPECT_EQ(onlyError(parse("[limits]\nsessions_per_pid = 1048577\n")).key,
              "limits.sessions_per_pid");
    EXPECT_EQ(onlyError(parse("[limits]\nfd_reserve = 65537\n")).key, "limits.fd_reserve");
}

TEST(ConfigLimits, SessionAndNodeLimitsAreRead) {
    const ParseResult r = parse(
        "[limits]\nnotification_backlog = 64\nsessions_per_uid = 8\nsessions_per_pid = 2\n"
        "fd_reserve = 0\nnode_registered_bytes = \"16MiB\"\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->limits.notification_backlog, 64u);
    EXPECT_EQ(r.config->limits.sessions_per_uid, 8u);
    EXPECT_EQ(r.config->limits.sessions_per_pid, 2u);
    EXPECT_EQ(r.config->limits.fd_reserve, 0u);
    EXPECT_EQ(r.config->limits.node_registered_bytes, uint64_t{16} << 20);
    const ParseResult a = parse("[limits]\nnode_registered_bytes = \"auto\"\n");
    ASSERT_TRUE(a.ok()) << allErrors(a);
    EXPECT_EQ(a.config->limits.node_registered_bytes, 0u);
    // "auto" is for the node cap only; the per-client quota is a size.
    EXPECT_EQ(onlyError(parse("[limits]\nregistered_bytes = \"auto\"\n")).key,
              "limits.registered_bytes");
    const Error e = onlyError(parse("[limits]\nnode_registered_bytes = \"lots\"\n"));
    EXPECT_EQ(e.key, "limits.node_registered_bytes");
    EXPECT_NE(e.expected.find("auto"), std::string::npos) << e.expected;
}

TEST(ConfigMetrics, EmptyListenIsOffAndBadAddressesAreErrors) {
    const ParseResult off = parse("[metrics]\nlisten = \"\"\n");
    ASSERT_TRUE(off.ok()) << allErrors(off);
    EXPECT_FALSE(off.config->metrics.listen.has_value());
    EXPECT_EQ(onlyError(parse("[metrics]\nlisten = \"nope\"\n")).key, "metrics.listen");
    EXPECT_EQ(onlyError(parse("[metrics]\nlisten = 9464\n")).key, "metrics.listen");
}

TEST(ConfigEnums, NewFabricAndSecurityValues) {
    EXPECT_EQ(onlyError(parse("[fabric]\ntclass_override = \"ignore\"\n")).key,
              "fabric.tclass_override");
    EXPECT_EQ(onlyError(parse("[fabric]\npreflight = \"strict\"\n")).key, "fabric.preflight");
    EXPECT_EQ(onlyError(parse("[fabric]\ngdr_flush = true\n")).key, "fabric.gdr_flush");
    EXPECT_EQ(onlyError(parse("[security]\ntcp_integrity = \"hmac\"\n")).key,
              "security.tcp_integrity");
    EXPECT_EQ(formatBytes(uint64_t{1} << 40), "1TiB");
    EXPECT_EQ(formatBytes(4097), "4097");
    EXPECT_EQ(formatBytes(3u << 20), "3MiB");
}

TEST(ConfigSecurity, RevokeTimeoutHasADefaultAndARange) {
    auto d = parse("");
    ASSERT_TRUE(d.ok()) << allErrors(d);
    EXPECT_EQ(d.config->security.revoke_timeout_ms, 1500u);
    auto r = parse("[security]\nrevoke_timeout_ms = 250\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->security.revoke_timeout_ms, 250u);
    for (const char *bad : {"0", "9", "600001", "-1", "\"1s\""}) {
        const Error e =
            onlyError(parse(std::string("[security]\nrevoke_timeout_ms = ") + bad + "\n"));
        EXPECT_EQ(e.key, "security.revoke_timeout_ms") << bad;
        EXPECT_NE(e.expected.find("10-600000"), std::string::npos) << bad << ": " << e.expected;
    }
}

TEST(ConfigParse, PeerAdmissionSwitches) {
    const ParseResult d = parse("[node]\nname = \"a\"\n");
    ASSERT_TRUE(d.ok()) << allErrors(d);
    // Strict by default: only listed addresses reach the handshake, names bound to addresses.
    EXPECT_FALSE(d.config->security.allow_unlisted_peers);
    EXPECT_TRUE(d.config->security.verify_peer_address);
    const ParseResult r =
        parse("[security]\nallow_unlisted_peers = true\nverify_peer_address = false\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_TRUE(r.config->security.allow_unlisted_peers);
    EXPECT_FALSE(r.config->security.verify_peer_address);
    const Error e = onlyError(parse("[security]\nverify_peer_address = \"yes\"\n"));
    EXPECT_EQ(e.key, "security.verify_peer_address");
    EXPECT_EQ(onlyError(parse("[security]\nallow_unlisted_peers = 1\n")).key,
              "security.allow_unlisted_peers");
}

}  // namespace
}  // namespace tensorlane::config

namespace tensorlane::config {
namespace {

TEST(ConfigTransports, AnOrderedListSetsThePreferenceAndTheTransportKind) {
    EXPECT_EQ(transportPreference(parse("").config->fabric),
              (std::vector<std::string>{"verbs", "tcp"}));
    EXPECT_EQ(transportPreference(parse("[fabric]\ntransport = \"tcp\"\n").config->fabric),
              (std::vector<std::string>{"tcp"}));
    struct Case {
        std::string list;
        std::vector<std::string> order;
        TransportKind kind;
    };
    for (const Case &c : std::vector<Case>{
             {R"(["tcp", "verbs"])", {"tcp", "verbs"}, TransportKind::kAuto},
             {R"(["verbs"])", {"verbs"}, TransportKind::kVerbs},
             {R"(["tcp"])", {"tcp"}, TransportKind::kTcp},
         }) {
        SCOPED_TRACE(c.list);
        const ParseResult r = parse("[fabric]\ntransports = " + c.list + "\n");
        ASSERT_TRUE(r.ok()) << allErrors(r);
        EXPECT_EQ(transportPreference(r.config->fabric), c.order);
        EXPECT_EQ(r.config->fabric.transport, c.kind);
    }
}

TEST(ConfigTransports, BadListsAreRefusedNamingTheEntry) {
    struct Case {
        std::string text;
        std::string key;
        std::string expected_part;
    };
    for (const Case &c : std::vector<Case>{
             {"transports = []", "fabric.transports", "non-empty array"},
             {"transports = \"tcp\"", "fabric.transports", "non-empty array"},
             {"transports = [\"tcp\", \"rdma\"]", "fabric.transports[1]", "\"verbs\" or \"tcp\""},
             {"transports = [\"tcp\", 3]", "fabric.transports[1]", "\"verbs\" or \"tcp\""},
             {"transports = [\"tcp\", \"tcp\"]", "fabric.transports[1]", "not listed before"},
             {"transport = \"tcp\"\ntransports = [\"tcp\"]", "fabric.transports", "not both"},
         }) {
        SCOPED_TRACE(c.text);
        const Error e = onlyError(parse("[fabric]\n" + c.text + "\n"));
        EXPECT_EQ(e.key, c.key);
        EXPECT_NE(e.expected.find(c.expected_part), std::string::npos) << e.expected;
    }
}

}  // namespace
}  // namespace tensorlane::config
