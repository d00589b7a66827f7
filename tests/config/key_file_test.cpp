// [security] peer_key_file checks (ParseOptions::check_key_file), against files made with exact
// modes in a temporary directory.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::allErrors;
using testing::onlyError;
using testing::TempDir;

const ParseOptions kCheck{.check_key_file = true};

const std::string kPeer = "[[peers]]\nname = \"b\"\naddress = \"127.0.0.1:18516\"\n";

std::string docWithKey(const std::string &path) {
    return "[node]\nname = \"a\"\n[security]\npeer_key_file = \"" + path + "\"\n" + kPeer;
}

ParseResult parseWithKey(const std::string &path) {
    return parseString(docWithKey(path), "test.toml", kCheck);
}

TEST(ConfigKeyFile, Mode0600IsAccepted) {
    const TempDir dir;
    const ParseResult r = parseWithKey(dir.write("peer.key", "secret", 0600));
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigKeyFile, Mode0400IsAccepted) {
    const TempDir dir;
    const ParseResult r = parseWithKey(dir.write("peer.key", "secret", 0400));
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigKeyFile, GroupOrOtherAccessIsRejected) {
    const TempDir dir;
    for (const mode_t mode : {0640, 0604, 0620, 0602, 0660, 0644, 0666}) {
        SCOPED_TRACE(mode);
        const std::string path = dir.write("peer.key", "secret", mode);
        const Error e = onlyError(parseWithKey(path));
        EXPECT_EQ(e.key, "security.peer_key_file");
        // The position of the peer_key_file key.
        EXPECT_EQ(e.line, 4u);
        EXPECT_EQ(e.column, 1u);
        char mode_text[8];
        std::snprintf(mode_text, sizeof mode_text, "%04o", static_cast<unsigned>(mode));
        EXPECT_NE(e.found.find(std::string("mode ") + mode_text), std::string::npos) << e.found;
        EXPECT_NE(e.found.find(path), std::string::npos) << e.found;
    }
}

TEST(ConfigKeyFile, ExecuteBitsAloneAreNotAccess) {
    // Only read and write by group/other leak or endanger the key.
    const TempDir dir;
    const ParseResult r = parseWithKey(dir.write("peer.key", "secret", 0711));
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigKeyFile, MissingFileIsRejected) {
    const TempDir dir;
    const std::string path = (dir.path() / "absent.key").string();
    const Error e = onlyError(parseWithKey(path));
    EXPECT_EQ(e.key, "security.peer_key_file");
    EXPECT_EQ(e.line, 4u);
    EXPECT_EQ(e.found, "\"" + path + "\": no such file");
}

TEST(ConfigKeyFile, DirectoryIsRejected) {
    const TempDir dir;
    const Error e = onlyError(parseWithKey(dir.path().string()));
    EXPECT_NE(e.found.find("not a regular file"), std::string::npos) << e.found;
}

TEST(ConfigKeyFile, UnreadableFileIsRejected) {
    if (::geteuid() == 0) {
        GTEST_SKIP() << "root reads any file; run as a normal user to test this";
    }
    const TempDir dir;
    const Error e = onlyError(parseWithKey(dir.write("peer.key", "secret", 0200)));
    EXPECT_NE(e.found.find("cannot be read"), std::string::npos) << e.found;
}

TEST(ConfigKeyFile, DefaultPathWithoutKeyHasNoPosition) {
    struct stat st {};
    if (::stat("/etc/tensorlane/peer.key", &st) == 0) {
        GTEST_SKIP() << "this host has /etc/tensorlane/peer.key";
    }
    const Error e = onlyError(parseString(kPeer, "test.toml", kCheck));
    EXPECT_EQ(e.key, "security.peer_key_file");
    EXPECT_EQ(e.line, 0u);
    EXPECT_EQ(e.column, 0u);
    EXPECT_EQ(e.text().rfind("test.toml: key 'security.peer_key_file': expected ", 0), 0u)
        << e.text();
}

TEST(ConfigKeyFile, NotNeededWithoutPeers) {
    const ParseResult r =
        parseString("[node]\nname = \"a\"\n[security]\npeer_key_file = \"/nonexistent/peer.key\"\n",
                    "test.toml", kCheck);
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigKeyFile, NotCheckedWhenTurnedOff) {
    const ParseResult r = parseString(docWithKey("/nonexistent/peer.key"), "test.toml",
                                      ParseOptions{.check_key_file = false});
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigKeyFile, CheckedByDefault) {
    const TempDir dir;
    const ParseResult r = parseString(docWithKey(dir.write("peer.key", "k", 0644)));
    EXPECT_FALSE(r.ok());
}

TEST(ConfigKeyFile, CollectedWithOtherErrors) {
    const TempDir dir;
    const ParseResult r = parseString(
        "[fabric]\ndscp = 64\n" + docWithKey((dir.path() / "absent").string()), "t", kCheck);
    ASSERT_EQ(r.errors.size(), 2u) << allErrors(r);
    EXPECT_EQ(r.errors[0].key, "fabric.dscp");
    EXPECT_EQ(r.errors[1].key, "security.peer_key_file");
}

TEST(ConfigParseFile, ReadsAFileAndNamesIt) {
    const TempDir dir;
    const std::string path = dir.write("tl.toml", "[fabric]\ndscp = 70\n");
    const ParseResult r = parseFile(path, ParseOptions{.check_key_file = false});
    const Error e = onlyError(r);
    EXPECT_EQ(e.file, path);
    EXPECT_EQ(e.text(), path + ":2:8: key 'fabric.dscp': expected an integer 0-63, found 70");
}

TEST(ConfigParseFile, SourceIsThePath) {
    const TempDir dir;
    const std::string path = dir.write("tl.toml", "");
    const ParseResult r = parseFile(path, ParseOptions{.check_key_file = false});
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->source, path);
}

TEST(ConfigParseFile, MissingFileIsOneError) {
    const ParseResult r = parseFile("/nonexistent/tl.toml");
    const Error e = onlyError(r);
    EXPECT_EQ(e.file, "/nonexistent/tl.toml");
    EXPECT_EQ(e.line, 0u);
    EXPECT_NE(e.text().find("cannot open"), std::string::npos) << e.text();
}

TEST(ConfigParseFile, DirectoryIsOneError) {
    const TempDir dir;
    const Error e = onlyError(parseFile(dir.path().string()));
    EXPECT_NE(e.text().find("directory"), std::string::npos) << e.text();
}

}  // namespace
}  // namespace tensorlane::config
