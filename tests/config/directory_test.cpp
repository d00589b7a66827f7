// [directory]: the static default, an etcd directory's keys, ranges and cross rules, and what
// --check-config shows of it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::allErrors;
using testing::onlyError;
using testing::parse;

const std::string kEtcdNode =
    "[node]\nname = \"node-a\"\nlisten = \"127.0.0.1:18515\"\n"
    "[directory]\nkind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\ncluster = \"prod\"\n";

bool hasText(const std::string &text, const std::string &part) {
    return text.find(part) != std::string::npos;
}

TEST(ConfigDirectory, StaticByDefault) {
    const ParseResult r = parse("[node]\nname = \"a\"\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->directory.kind, DirectoryKind::kStatic);
    EXPECT_FALSE(r.config->hasPeers());
    const ParseResult s = parse("[directory]\nkind = \"static\"\n");
    ASSERT_TRUE(s.ok()) << allErrors(s);
    EXPECT_EQ(s.config->directory.kind, DirectoryKind::kStatic);
}

TEST(ConfigDirectory, EtcdParsesWithDefaults) {
    const ParseResult r = parse(kEtcdNode);
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const DirectoryConfig &d = r.config->directory;
    EXPECT_EQ(d.kind, DirectoryKind::kEtcd);
    ASSERT_EQ(d.endpoints.size(), 1u);
    EXPECT_EQ(d.endpoints[0], "http://127.0.0.1:2379");
    EXPECT_EQ(d.cluster, "prod");
    EXPECT_EQ(d.prefix(), "/tensorlane/prod/");
    EXPECT_EQ(d.lease_ttl_ms, 10000u);
    EXPECT_FALSE(d.advertise.has_value());
    EXPECT_EQ(r.config->advertisedAddress().text(), "127.0.0.1:18515");
    EXPECT_TRUE(r.config->hasPeers());
}

TEST(ConfigDirectory, EtcdTakesEveryKey) {
    const ParseResult r = parse(
        "[node]\nname = \"a\"\nlisten = \"0.0.0.0:1\"\n"
        "[directory]\nkind = \"etcd\"\n"
        "endpoints = [\"https://etcd-0.example:2379/\", \"https://[::1]:2379\"]\n"
        "cluster = \"c-1\"\nlease_ttl_ms = 3000\nadvertise = \"10.0.0.1:18515\"\n"
        "request_timeout_ms = 500\nreconnect_min_ms = 50\nreconnect_max_ms = 800\n"
        "ca_file = \"/ca\"\ncert_file = \"/cert\"\nkey_file = \"/key\"\n"
        "username = \"tl\"\npassword_file = \"/pw\"\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const DirectoryConfig &d = r.config->directory;
    ASSERT_EQ(d.endpoints.size(), 2u);
    EXPECT_EQ(d.endpoints[0], "https://etcd-0.example:2379");  // the trailing '/' dropped
    EXPECT_EQ(d.lease_ttl_ms, 3000u);
    EXPECT_EQ(r.config->advertisedAddress().text(), "10.0.0.1:18515");
    EXPECT_EQ(d.request_timeout_ms, 500u);
    EXPECT_EQ(d.reconnect_min_ms, 50u);
    EXPECT_EQ(d.reconnect_max_ms, 800u);
    EXPECT_EQ(d.cert_file, "/cert");
    EXPECT_EQ(d.username, "tl");
    EXPECT_EQ(d.password_file, "/pw");
}

TEST(ConfigDirectory, BadValuesNameTheirKey) {
    EXPECT_EQ(onlyError(parse("[directory]\nkind = \"zookeeper\"\n")).key, "directory.kind");
    EXPECT_EQ(onlyError(parse("[directory]\nkindd = \"etcd\"\n")).key, "directory.kindd");
    const std::string base = "[node]\nlisten = \"127.0.0.1:1\"\n[directory]\nkind = \"etcd\"\n";
    const std::string cluster = "cluster = \"c\"\n";
    EXPECT_EQ(onlyError(parse(base + cluster)).key, "directory.endpoints");
    EXPECT_EQ(onlyError(parse(base + cluster + "endpoints = []\n")).key, "directory.endpoints");
    for (const char *url : {"127.0.0.1:2379", "ftp://h:1", "http://h", "http://h:1/v3",
                            "http://u@h:1", "http://h:99999"}) {
        const Error e =
            onlyError(parse(base + cluster + "endpoints = [\"" + std::string(url) + "\"]\n"));
        EXPECT_EQ(e.key, "directory.endpoints[0]") << url;
    }
    const std::string ep = "endpoints = [\"http://127.0.0.1:2379\"]\n";
    EXPECT_EQ(onlyError(parse(base + ep)).key, "directory.cluster");
    EXPECT_EQ(onlyError(parse(base + ep + "cluster = \"a/b\"\n")).key, "directory.cluster");
    EXPECT_EQ(onlyError(parse(base + ep + cluster + "lease_ttl_ms = 1000\n")).key,
              "directory.lease_ttl_ms");
    EXPECT_EQ(onlyError(parse(base + ep + cluster +
                              "reconnect_min_ms = 900\n"
                              "reconnect_max_ms = 800\n"))
                  .key,
              "directory.reconnect_max_ms");
    EXPECT_EQ(onlyError(parse(base + ep + cluster + "advertise = \"0.0.0.0:1\"\n")).key,
              "directory.advertise");
}

TEST(ConfigDirectory, WildcardListenNeedsAdvertise) {
    const Error e =
        onlyError(parse("[node]\nlisten = \"0.0.0.0:18515\"\n[directory]\nkind = \"etcd\"\n"
                        "endpoints = [\"http://127.0.0.1:2379\"]\ncluster = \"c\"\n"));
    EXPECT_EQ(e.key, "directory.advertise");
    EXPECT_TRUE(hasText(e.text(), "wildcard")) << e.text();
}

TEST(ConfigDirectory, PairsOfKeysGoTogether) {
    const std::string base = kEtcdNode;
    const std::string https =
        "[node]\nlisten = \"127.0.0.1:1\"\n[directory]\nkind = \"etcd\"\n"
        "endpoints = [\"https://127.0.0.1:2379\"]\ncluster = \"c\"\n";
    EXPECT_EQ(onlyError(parse(https + "cert_file = \"/c\"\n")).key, "directory.key_file");
    EXPECT_EQ(onlyError(parse(https + "key_file = \"/k\"\n")).key, "directory.cert_file");
    EXPECT_EQ(onlyError(parse(base + "username = \"u\"\n")).key, "directory.password_file");
    EXPECT_EQ(onlyError(parse(base + "password_file = \"/p\"\n")).key, "directory.username");
    // TLS files with only http:// endpoints would be silently unused.
    EXPECT_EQ(onlyError(parse(base + "ca_file = \"/ca\"\n")).key, "directory.ca_file");
}

TEST(ConfigDirectory, EtcdKeysInAStaticDirectoryAreErrors) {
    const Error e = onlyError(parse("[directory]\nendpoints = [\"http://127.0.0.1:2379\"]\n"));
    EXPECT_EQ(e.key, "directory.endpoints");
    EXPECT_TRUE(hasText(e.text(), "kind = \"etcd\"")) << e.text();
}

TEST(ConfigDirectory, EtcdAndPeersDoNotMix) {
    const Error e = onlyError(
        parse(kEtcdNode + "[[peers]]\nname = \"node-b\"\naddress = \"127.0.0.1:18516\"\n"));
    EXPECT_EQ(e.key, "directory.kind");
}

TEST(ConfigDirectory, EtcdNeedsTheSharedKeyFile) {
    testing::TempDir dir;
    const ParseResult r = parseString(
        kEtcdNode + "[security]\npeer_key_file = \"" + dir.path().string() + "/missing.key\"\n",
        "test.toml", ParseOptions{.check_key_file = true});
    const Error e = onlyError(r);
    EXPECT_EQ(e.key, "security.peer_key_file");
}

TEST(ConfigDirectory, TlsFilesMustBeReadableWhenChecked) {
    testing::TempDir dir;
    const std::string text =
        "[node]\nlisten = \"127.0.0.1:1\"\n[directory]\nkind = \"etcd\"\n"
        "endpoints = [\"https://127.0.0.1:2379\"]\ncluster = \"c\"\nca_file = \"" +
        dir.path().string() + "/nope.pem\"\n";
    const ParseResult r = parseString(text, "test.toml", ParseOptions{.check_key_file = false});
    ASSERT_TRUE(r.ok()) << allErrors(r);
    // With the file checks on, the missing CA is reported (the key file too: it is missing).
    const ParseResult checked =
        parseString(text, "test.toml", ParseOptions{.check_key_file = true});
    ASSERT_FALSE(checked.ok());
    EXPECT_TRUE(hasText(allErrors(checked), "directory.ca_file")) << allErrors(checked);
}

TEST(ConfigDirectory, DescribeShowsIt) {
    const ParseResult r = parse(kEtcdNode + "lease_ttl_ms = 2500\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    const TransportChoice choice{TransportKind::kTcp, "set in the file"};
    const std::string text = describeText(*r.config, choice);
    EXPECT_TRUE(hasText(text, "[directory]\nkind = etcd\n")) << text;
    EXPECT_TRUE(hasText(text, "endpoints = [\"http://127.0.0.1:2379\"]")) << text;
    EXPECT_TRUE(hasText(text, "\"/tensorlane/prod/nodes/node-a\"")) << text;
    EXPECT_TRUE(hasText(text, "lease_ttl_ms = 2500 (etcd TTL 3 s)")) << text;
    EXPECT_TRUE(hasText(text, "advertise = \"127.0.0.1:18515\" ([node] listen)")) << text;
    EXPECT_TRUE(hasText(text, "# peers: learned from etcd")) << text;
    const auto j = nlohmann::json::parse(describeJson(*r.config, choice));
    EXPECT_EQ(j["directory"]["kind"], "etcd");
    EXPECT_EQ(j["directory"]["cluster"], "prod");
    EXPECT_EQ(j["directory"]["prefix"], "/tensorlane/prod/");
    EXPECT_EQ(j["directory"]["lease_ttl_ms"], 2500);
    const ParseResult s = parse("");
    const auto js = nlohmann::json::parse(describeJson(*s.config, choice));
    EXPECT_EQ(js["directory"]["kind"], "static");
    EXPECT_TRUE(hasText(describeText(*s.config, choice), "kind = static")) << text;
}

}  // namespace
}  // namespace tensorlane::config
