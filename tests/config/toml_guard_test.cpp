// The workaround for toml++ 3.3.0's broken whitespace lookup (config/src/toml_guard.cpp): the
// code points it mishandles are swapped before parsing and back after, so non-ASCII text works
// in strings, keys and comments, is an error elsewhere, and never reaches undefined behaviour.
#include <gtest/gtest.h>

#include <string>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::allErrors;
using testing::onlyError;
using testing::parse;

TEST(ConfigTomlGuard, NonAsciiInStringsAndCommentsIsFine) {
    const ParseResult r = parse(
        "# café — ünïcode in a comment\n"
        "[node]\n"
        "socket = \"/tmp/café.sock\"  # é\n"
        "[security]\n"
        "peer_key_file = '/etc/clé'\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->node.socket, "/tmp/café.sock");
    EXPECT_EQ(r.config->security.peer_key_file, "/etc/clé");
}

TEST(ConfigTomlGuard, NonAsciiInMultiLineStringsIsFine) {
    const ParseResult r = parse(
        "[security]\n"
        "peer_key_file = \"\"\"/k/é\\\"\"é\"\"\"\"  # ends with a quote; é\n"
        "[node]\n"
        "socket = '''/s/\\\né'''\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->security.peer_key_file, "/k/é\"\"é\"");
    EXPECT_EQ(r.config->node.socket, "/s/\\\né");
}

TEST(ConfigTomlGuard, ByteOrderMarkAtTheStartIsFine) {
    const ParseResult r = parse("\xEF\xBB\xBF[fabric]\ndscp = 10\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->fabric.dscp, 10);
}

TEST(ConfigTomlGuard, NonAsciiOutsideStringsIsAnErrorAtItsPosition) {
    // U+FEF9 after an array comma is what the fuzzer found first; U+00E9 is as bad.
    Error e = onlyError(parse("[security]\nallowed_uids = [0,\xEF\xBB\xB9 1]\n"));
    EXPECT_EQ(e.line, 2u);
    EXPECT_EQ(e.column, 19u);
    EXPECT_EQ(e.message.rfind("invalid TOML: ", 0), 0u) << e.message;
    e = onlyError(parse("[fabric]\ndscp = 1 é\n"));
    EXPECT_EQ(e.line, 2u);
    EXPECT_EQ(e.column, 10u);
    // The message shows the character of the file, not its stand-in.
    EXPECT_NE(e.message.find("saw 'é'"), std::string::npos) << e.message;
    e = onlyError(parse("é = 1\n"));
    EXPECT_EQ(e.line, 1u);
    EXPECT_EQ(e.column, 1u);
    e = onlyError(parse("[fabric]\ndscp = 1\xE2\x80\x80\n"));  // U+2000, a Unicode space
    EXPECT_NE(e.message.find("\\u2000"), std::string::npos) << e.message;
}

TEST(ConfigTomlGuard, ValueScanPastAQuoteIsAnError) {
    // toml++ reads "0\"é\"" as one number token and asks whether each character is whitespace.
    const Error e = onlyError(parse("[fabric]\ndscp = 0\"é\"\n"));
    EXPECT_EQ(e.line, 2u);
}

TEST(ConfigTomlGuard, LineEndingBackslashBeforeNonAsciiWorks) {
    // marzer/tomlplusplus#190: valid TOML on which toml++ 3.3.0 reaches __builtin_unreachable.
    const ParseResult r = parse("[security]\npeer_key_file = \"\"\"\\\n  \xC2\xA7/k\"\"\"\n");
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->security.peer_key_file, "\xC2\xA7/k");
}

TEST(ConfigTomlGuard, EscapedNonAsciiInMultiLineStringIsAnError) {
    const Error e = onlyError(parse("[security]\npeer_key_file = \"\"\"a\\é\"\"\"\n"));
    EXPECT_EQ(e.line, 2u);
    EXPECT_NE(e.message.find("'\\é'"), std::string::npos) << e.message;
}

TEST(ConfigTomlGuard, InvalidUtf8IsLeftToTheParser) {
    const Error e = onlyError(parse("[fabric]\ndscp = \xFF\n"));
    EXPECT_EQ(e.line, 2u);
    EXPECT_EQ(e.message.rfind("invalid TOML: ", 0), 0u) << e.message;
}

TEST(ConfigTomlGuard, NonAsciiQuotedKeyIsAnUnknownKey) {
    const Error e = onlyError(parse("[node]\n\"é\" = 1\n"));
    EXPECT_EQ(e.key, "node.\"é\"");
    EXPECT_EQ(e.found, "unknown key");
}

TEST(ConfigTomlGuard, EveryMishandledRangeRoundTrips) {
    for (const char *text : {"\xC2\xA1", "\xD2\x99", "\xE2\xB1\x9E", "\xE3\x80\x80", "\xE3\x81\x97",
                             "\xEF\xAC\xA6", "\xEF\xBB\xBE", "\xD0\x96\xE3\x80\x85\xEF\xBC\x81"}) {
        SCOPED_TRACE(text);
        const ParseResult r = parse(std::string("[security]\npeer_key_file = \"/") + text + "\"\n");
        ASSERT_TRUE(r.ok()) << allErrors(r);
        EXPECT_EQ(r.config->security.peer_key_file, std::string("/") + text);
    }
}

TEST(ConfigTomlGuard, PrivateUseStandInsAreRefusedOnlyWhenTheyWouldClash) {
    // U+F0001 alone is an ordinary character.
    const ParseResult alone = parse("[security]\npeer_key_file = \"/\xF3\xB0\x80\x81\"\n");
    ASSERT_TRUE(alone.ok()) << allErrors(alone);
    EXPECT_EQ(alone.config->security.peer_key_file, "/\xF3\xB0\x80\x81");
    // With a swapped character in the same file it would come back changed.
    Error e = onlyError(parse("[security]\npeer_key_file = \"/é\xF3\xB0\x80\x81\"\n"));
    EXPECT_EQ(e.line, 2u);
    EXPECT_EQ(e.column, 20u);
    EXPECT_NE(e.message.find("U+F0001"), std::string::npos) << e.message;
    e = onlyError(parse("[security]\npeer_key_file = \"/é\\U000F0001\"\n"));
    EXPECT_EQ(e.line, 0u);
    EXPECT_TRUE(parse("[security]\npeer_key_file = \"/\\U000F0001\"\n").ok());
}

}  // namespace
}  // namespace tensorlane::config
