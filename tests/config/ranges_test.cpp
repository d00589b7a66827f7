// Every range rule: both valid edges parse, the first invalid value on each side fails, and the
// error names the key, line and column of the value.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::onlyError;
using testing::parse;

struct RangeCase {
    std::string table;     ///< "fabric"
    std::string key;       ///< "dscp"
    int64_t lo;            ///< lowest valid value
    int64_t hi;            ///< highest valid value
    std::string expected;  ///< Error::expected for an out-of-range value
    std::string extra;     ///< a line placed before the key (a cross rule's partner)
};

// gtest would print the struct as bytes in test names and failures.
void PrintTo(const RangeCase &c, std::ostream *os) {
    *os << c.table << "." << c.key;
}

std::string doc(const RangeCase &c, int64_t value) {
    std::string text = "[" + c.table + "]\n";
    if (!c.extra.empty()) {
        text += c.extra + "\n";
    }
    return text + c.key + " = " + std::to_string(value) + "\n";
}

class ConfigRangeEdges : public ::testing::TestWithParam<RangeCase> {};

TEST_P(ConfigRangeEdges, EdgesParse) {
    const RangeCase &c = GetParam();
    for (const int64_t v : {c.lo, c.hi}) {
        const ParseResult r = parse(doc(c, v));
        EXPECT_TRUE(r.ok()) << c.key << " = " << v << "\n" << testing::allErrors(r);
    }
}

TEST_P(ConfigRangeEdges, FirstInvalidOnEachSideFails) {
    const RangeCase &c = GetParam();
    const uint32_t line = c.extra.empty() ? 2 : 3;
    // The value starts after "key = ".
    const auto column = static_cast<uint32_t>(c.key.size() + 4);
    for (const int64_t v : {c.lo - 1, c.hi + 1}) {
        SCOPED_TRACE(c.key + " = " + std::to_string(v));
        const Error e = onlyError(parse(doc(c, v)));
        EXPECT_EQ(e.key, c.table + "." + c.key);
        EXPECT_EQ(e.line, line);
        EXPECT_EQ(e.column, column);
        EXPECT_EQ(e.expected, c.expected);
        EXPECT_EQ(e.found, std::to_string(v));
        EXPECT_EQ(e.file, "test.toml");
    }
}

std::string range(int64_t lo, int64_t hi) {
    return "an integer " + std::to_string(lo) + "-" + std::to_string(hi);
}

RangeCase plain(std::string table, std::string key, int64_t lo, int64_t hi,
                std::string extra = {}) {
    return {std::move(table), std::move(key), lo, hi, range(lo, hi), std::move(extra)};
}

INSTANTIATE_TEST_SUITE_P(
    Config, ConfigRangeEdges,
    ::testing::Values(
        plain("fabric", "port", 1, 255), plain("fabric", "dscp", 0, 63),
        plain("fabric", "pfc_priority", 0, 7), plain("fabric", "timeout", 0, 31),
        plain("fabric", "retry_cnt", 0, 7), plain("fabric", "rnr_retry", 0, 7),
        plain("fabric", "min_rnr_timer", 0, 31), plain("fabric", "qps_per_peer", 1, 64),
        RangeCase{"fabric", "gid_index", 0, 255, "\"auto\" or an integer 0-255", ""},
        RangeCase{"fabric", "mtu", 256, 4096, "one of 256, 512, 1024, 2048, 4096", ""},
        plain("tcp", "connections_per_peer", 1, 16), plain("tcp", "chunk_bytes", 4096, 67108864),
        plain("tcp", "keepalive_ms", 10, 60000), plain("tcp", "peer_timeout_ms", 100, 600000),
        plain("tcp", "connect_timeout_ms", 10, 60000),
        RangeCase{"tcp", "tag_threads", 0, 16, "\"auto\" or an integer 0-16", ""},
        // The cap must stay >= the start, so each edge is tried with the partner out of the way.
        plain("tcp", "reconnect_min_ms", 1, 60000, "reconnect_max_ms = 600000"),
        plain("tcp", "reconnect_max_ms", 1, 600000, "reconnect_min_ms = 1"),
        RangeCase{"ipc", "ring_depth", 16, 65536, "a power of two 16-65536", ""},
        plain("ipc", "spin_us", 0, 10000)),
    [](const ::testing::TestParamInfo<RangeCase> &param) {
        return param.param.table + "_" + param.param.key;
    });

TEST(ConfigRanges, DscpRejects64) {
    const Error e = onlyError(parse("[fabric]\ndscp = 64\n"));
    EXPECT_EQ(e.text(), "test.toml:2:8: key 'fabric.dscp': expected an integer 0-63, found 64");
}

TEST(ConfigRanges, DscpRejectsNegative) {
    const Error e = onlyError(parse("[fabric]\ndscp = -1\n"));
    EXPECT_EQ(e.text(), "test.toml:2:8: key 'fabric.dscp': expected an integer 0-63, found -1");
}

TEST(ConfigRanges, MtuRejectsValuesBetweenSizes) {
    for (const int v : {0, 255, 257, 1000, 1536, 3000, 4097, 8192, 9000}) {
        SCOPED_TRACE(v);
        const Error e = onlyError(parse("[fabric]\nmtu = " + std::to_string(v) + "\n"));
        EXPECT_EQ(e.key, "fabric.mtu");
    }
    for (const int v : {256, 512, 1024, 2048, 4096}) {
        const ParseResult r = parse("[fabric]\nmtu = " + std::to_string(v) + "\n");
        ASSERT_TRUE(r.ok()) << testing::allErrors(r);
        EXPECT_EQ(r.config->fabric.mtu, static_cast<uint32_t>(v));
    }
}

TEST(ConfigRanges, RingDepthMustBeAPowerOfTwo) {
    for (const int v : {17, 24, 1000, 1023, 1025, 65535}) {
        SCOPED_TRACE(v);
        const Error e = onlyError(parse("[ipc]\nring_depth = " + std::to_string(v) + "\n"));
        EXPECT_EQ(e.key, "ipc.ring_depth");
        EXPECT_EQ(e.expected, "a power of two 16-65536");
    }
    for (int v = 16; v <= 65536; v *= 2) {
        const ParseResult r = parse("[ipc]\nring_depth = " + std::to_string(v) + "\n");
        ASSERT_TRUE(r.ok()) << testing::allErrors(r);
        EXPECT_EQ(r.config->ipc.ring_depth, static_cast<uint32_t>(v));
    }
}

TEST(ConfigRanges, GidIndexAutoOrNumber) {
    ParseResult r = parse("[fabric]\ngid_index = \"auto\"\n");
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r.config->fabric.gid_index.has_value());
    r = parse("[fabric]\ngid_index = 3\n");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.config->fabric.gid_index, 3);
    r = parse("");
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r.config->fabric.gid_index.has_value());
    const Error e = onlyError(parse("[fabric]\ngid_index = \"x\"\n"));
    EXPECT_EQ(e.text(),
              "test.toml:2:13: key 'fabric.gid_index': expected \"auto\" or an integer 0-255, "
              "found string \"x\"");
    EXPECT_EQ(onlyError(parse("[fabric]\ngid_index = \"AUTO\"\n")).key, "fabric.gid_index");
    EXPECT_EQ(onlyError(parse("[fabric]\ngid_index = true\n")).found, "boolean true");
}

TEST(ConfigRanges, TagThreadsAutoOrNumber) {
    ParseResult r = parse("");
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r.config->tcp.tag_threads.has_value());
    r = parse("[tcp]\ntag_threads = \"auto\"\n");
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r.config->tcp.tag_threads.has_value());
    r = parse("[tcp]\ntag_threads = 0\n");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.config->tcp.tag_threads, 0u);
    const Error e = onlyError(parse("[tcp]\ntag_threads = \"many\"\n"));
    EXPECT_EQ(e.text(),
              "test.toml:2:15: key 'tcp.tag_threads': expected \"auto\" or an integer 0-16, "
              "found string \"many\"");
    EXPECT_EQ(onlyError(parse("[tcp]\ntag_threads = 2.5\n")).key, "tcp.tag_threads");
}

TEST(ConfigRanges, ReconnectMaxBelowMinIsAnError) {
    const Error e = onlyError(parse("[tcp]\nreconnect_min_ms = 500\nreconnect_max_ms = 400\n"));
    EXPECT_EQ(e.key, "tcp.reconnect_max_ms");
    EXPECT_EQ(e.line, 3u);
    EXPECT_EQ(e.column, 20u);
    EXPECT_EQ(e.found, "400");
    EXPECT_NE(e.expected.find("reconnect_min_ms (500)"), std::string::npos) << e.expected;
    // Equal is fine: a fixed backoff.
    EXPECT_TRUE(parse("[tcp]\nreconnect_min_ms = 500\nreconnect_max_ms = 500\n").ok());
}

TEST(ConfigRanges, ReconnectMinAboveDefaultMaxPointsAtMin) {
    // The cap is left at its default 5000, so the only key in the file is the one to blame.
    const Error e = onlyError(parse("[tcp]\nreconnect_min_ms = 6000\n"));
    EXPECT_EQ(e.key, "tcp.reconnect_min_ms");
    EXPECT_EQ(e.line, 2u);
    EXPECT_EQ(e.column, 20u);
    EXPECT_EQ(e.found, "6000");
    EXPECT_NE(e.expected.find("reconnect_max_ms (5000)"), std::string::npos) << e.expected;
}

TEST(ConfigRanges, UidAndGidEdges) {
    for (const std::string key : {"allowed_uids", "allowed_gids"}) {
        SCOPED_TRACE(key);
        const ParseResult r = parse("[security]\n" + key + " = [0, 1000, 4294967295]\n");
        ASSERT_TRUE(r.ok()) << testing::allErrors(r);
        const auto &ids = key == "allowed_uids" ? r.config->security.allowed_uids
                                                : r.config->security.allowed_gids;
        EXPECT_EQ(ids, (std::vector<uint32_t>{0, 1000, 4294967295u}));

        const Error low = onlyError(parse("[security]\n" + key + " = [-1]\n"));
        EXPECT_EQ(low.key, "security." + key + "[0]");
        EXPECT_EQ(low.line, 2u);
        EXPECT_EQ(low.column, key.size() + 5);
        EXPECT_EQ(low.found, "-1");
        const Error high = onlyError(parse("[security]\n" + key + " = [1, 4294967296]\n"));
        EXPECT_EQ(high.key, "security." + key + "[1]");
        EXPECT_EQ(high.column, key.size() + 8);
        EXPECT_EQ(high.expected, "an integer 0-4294967295");
        EXPECT_EQ(high.found, "4294967296");
    }
}

}  // namespace
}  // namespace tensorlane::config
