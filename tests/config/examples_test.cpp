// The example files under config/examples: they parse, say what the demo relies on, and every
// prefix of them (what an editor saves half-way) gives errors, never a crash or an exception.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::allErrors;

const ParseOptions kNoKeyCheck{.check_key_file = false};

std::string example(const std::string &name) {
    return TENSORLANE_EXAMPLES_DIR "/" + name;
}

std::string readAll(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

TEST(ConfigExamples, SingleNodeParses) {
    const ParseResult r = parseFile(example("single-node.toml"), kNoKeyCheck);
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_TRUE(r.config->peers.empty());
    EXPECT_EQ(r.config->trafficClass(), 106);
    EXPECT_EQ(r.config->node.socket.rfind("/tmp/", 0), 0u);
}

TEST(ConfigExamples, TwoNodeParsesWithTrafficClass106) {
    const ParseResult r = parseFile(example("two-node.toml"), kNoKeyCheck);
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const Config &c = *r.config;
    EXPECT_EQ(c.trafficClass(), 106);
    EXPECT_EQ(c.node.name, "node-a");
    EXPECT_EQ(c.node.listen.text(), "127.0.0.1:18515");
    EXPECT_EQ(c.node.socket, "/tmp/tensorlane-node-a.sock");
    EXPECT_EQ(c.security.peer_key_file, "/tmp/tensorlane-demo/peer.key");
    ASSERT_EQ(c.peers.size(), 1u);
    EXPECT_EQ(c.peers[0].name, "node-b");
    EXPECT_EQ(c.peers[0].address.text(), "127.0.0.1:18516");
}

TEST(ConfigExamples, TwoNodeFilesMirrorEachOther) {
    const ParseResult a = parseFile(example("two-node.toml"), kNoKeyCheck);
    const ParseResult b = parseFile(example("two-node-b.toml"), kNoKeyCheck);
    ASSERT_TRUE(a.ok()) << allErrors(a);
    ASSERT_TRUE(b.ok()) << allErrors(b);
    EXPECT_EQ(b.config->trafficClass(), 106);
    ASSERT_EQ(b.config->peers.size(), 1u);
    EXPECT_EQ(a.config->peers[0].name, b.config->node.name);
    EXPECT_EQ(b.config->peers[0].name, a.config->node.name);
    EXPECT_EQ(a.config->peers[0].address.text(), b.config->node.listen.text());
    EXPECT_EQ(b.config->peers[0].address.text(), a.config->node.listen.text());
    EXPECT_NE(a.config->node.socket, b.config->node.socket);
    EXPECT_EQ(a.config->security.peer_key_file, b.config->security.peer_key_file);
}

TEST(ConfigExamples, TwoNodeDescribesTrafficClass106) {
    const ParseResult r = parseFile(example("two-node.toml"), kNoKeyCheck);
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const std::string text = describeText(*r.config, resolveTransport(*r.config));
    EXPECT_NE(text.find("traffic_class = 106 (dscp 26 << 2 | ecn 2)"), std::string::npos) << text;
}

TEST(ConfigExamples, RocePairIsARealPairNotLoopback) {
    for (const std::string name : {"roce-pair-a.toml", "roce-pair-b.toml"}) {
        SCOPED_TRACE(name);
        const ParseResult r = parseFile(example(name), kNoKeyCheck);
        ASSERT_TRUE(r.ok()) << allErrors(r);
        const Config &c = *r.config;
        EXPECT_EQ(c.trafficClass(), 106);
        // Where the installed unit and the shim look.
        EXPECT_EQ(c.node.socket, "/run/tensorlane/sidecar.sock");
        EXPECT_EQ(c.security.peer_key_file, "/etc/tensorlane/peer.key");
        // A named device and netdev, an address on the fabric: not 127.x, not a wildcard.
        EXPECT_EQ(c.fabric.device, "mlx5_0");
        EXPECT_NE(c.fabric.netdev, "auto");
        EXPECT_EQ(c.node.listen.host.rfind("127.", 0), std::string::npos) << c.node.listen.host;
        EXPECT_NE(c.node.listen.host, "0.0.0.0");
        ASSERT_EQ(c.peers.size(), 1u);
        EXPECT_EQ(c.peers[0].address.host.rfind("127.", 0), std::string::npos);
        EXPECT_FALSE(c.security.allowed_gids.empty());
    }
}

TEST(ConfigExamples, RocePairFilesAgreeWhereThePeersMust) {
    const ParseResult a = parseFile(example("roce-pair-a.toml"), kNoKeyCheck);
    const ParseResult b = parseFile(example("roce-pair-b.toml"), kNoKeyCheck);
    ASSERT_TRUE(a.ok()) << allErrors(a);
    ASSERT_TRUE(b.ok()) << allErrors(b);
    const Config &ca = *a.config, &cb = *b.config;
    EXPECT_EQ(ca.peers[0].name, cb.node.name);
    EXPECT_EQ(cb.peers[0].name, ca.node.name);
    EXPECT_EQ(ca.peers[0].address.text(), cb.node.listen.text());
    EXPECT_EQ(cb.peers[0].address.text(), ca.node.listen.text());
    EXPECT_EQ(ca.security.peer_key_file, cb.security.peer_key_file);
    EXPECT_EQ(ca.tcp.chunk_bytes, cb.tcp.chunk_bytes);
    EXPECT_EQ(ca.tcp.connections_per_peer, cb.tcp.connections_per_peer);
    EXPECT_EQ(ca.security.tcp_integrity, cb.security.tcp_integrity);
    // What the switches see must be the same from both ends.
    EXPECT_EQ(ca.fabric.dscp, cb.fabric.dscp);
    EXPECT_EQ(ca.fabric.ecn, cb.fabric.ecn);
    EXPECT_EQ(ca.fabric.pfc_priority, cb.fabric.pfc_priority);
    EXPECT_EQ(ca.fabric.trust, cb.fabric.trust);
    EXPECT_EQ(ca.fabric.mtu, cb.fabric.mtu);
}

TEST(ConfigExamples, RocePairIsCommentedLineByLine) {
    // Every line that sets a key says what it does on the same line.
    for (const std::string name : {"roce-pair-a.toml", "roce-pair-b.toml"}) {
        std::istringstream in(readAll(example(name)));
        std::string line;
        int n = 0, keys = 0;
        while (std::getline(in, line)) {
            ++n;
            const size_t first = line.find_first_not_of(' ');
            if (first == std::string::npos || line[first] == '#' || line[first] == '[') {
                continue;
            }
            ++keys;
            EXPECT_NE(line.find(" # "), std::string::npos) << name << ":" << n << ": " << line;
        }
        // Every key of every table is in the file.
        EXPECT_EQ(keys, 4 + 18 + 8 + 3 + 7 + 9 + 1 + 3) << name;
    }
}

TEST(ConfigExamples, EtcdClusterParses) {
    const ParseResult r = parseFile(example("etcd-cluster.toml"), kNoKeyCheck);
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const Config &c = *r.config;
    EXPECT_EQ(c.directory.kind, DirectoryKind::kEtcd);
    EXPECT_EQ(c.directory.prefix(), "/tensorlane/prod/");
    EXPECT_EQ(c.advertisedAddress().text(), "10.0.0.1:18515");
    EXPECT_TRUE(c.peers.empty());
    EXPECT_TRUE(c.hasPeers());
}

TEST(ConfigExamples, EveryPrefixParsesOrReportsErrors) {
    for (const std::string name : {"single-node.toml", "two-node.toml", "two-node-b.toml",
                                   "roce-pair-a.toml", "roce-pair-b.toml", "etcd-cluster.toml"}) {
        const std::string text = readAll(example(name));
        ASSERT_FALSE(text.empty()) << name;
        size_t failures = 0;
        for (size_t n = 0; n <= text.size(); ++n) {
            ParseResult r;
            ASSERT_NO_THROW(r = parseString(std::string_view(text).substr(0, n), name, kNoKeyCheck))
                << name << " prefix " << n;
            if (r.ok()) {
                continue;
            }
            ++failures;
            ASSERT_FALSE(r.errors.empty()) << name << " prefix " << n;
            for (const auto &e : r.errors) {
                ASSERT_FALSE(e.text().empty()) << name << " prefix " << n;
                ASSERT_EQ(e.text().rfind(name, 0), 0u) << e.text();
            }
        }
        // Cutting a file mid-key or mid-string must fail somewhere; the whole file must not.
        EXPECT_GT(failures, 0u) << name;
        EXPECT_TRUE(parseString(text, name, kNoKeyCheck).ok()) << name;
    }
}

}  // namespace
}  // namespace tensorlane::config
