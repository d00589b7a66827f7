// The peer key file (tensorlane/config/key_file.hpp): the tensorlane-key-v1 format, reading it
// with its checks, writing it (`tensorlane keygen`), and the [security] peer_key_file check of
// the parser (ParseOptions::check_key_file), against files made with exact modes in a temporary
// directory.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tensorlane/config/key_file.hpp"
#include "test_util.hpp"

namespace tensorlane::config {
namespace {

using testing::allErrors;
using testing::onlyError;
using testing::TempDir;

const ParseOptions kCheck{.check_key_file = true};

/// A valid key file: the prefix, 64 hex digits, a newline.
const std::string kKey =
    "tensorlane-key-v1:00112233445566778899aabbccddeeff0123456789abcdef0f1e2d3c4b5a6978\n";

const std::string kPeer = "[[peers]]\nname = \"b\"\naddress = \"127.0.0.1:18516\"\n";

std::string docWithKey(const std::string &path) {
    return "[node]\nname = \"a\"\n[security]\npeer_key_file = \"" + path + "\"\n" + kPeer;
}

ParseResult parseWithKey(const std::string &path) {
    return parseString(docWithKey(path), "test.toml", kCheck);
}

TEST(ConfigKeyFile, Mode0600IsAccepted) {
    const TempDir dir;
    const ParseResult r = parseWithKey(dir.write("peer.key", kKey, 0600));
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigKeyFile, Mode0400IsAccepted) {
    const TempDir dir;
    const ParseResult r = parseWithKey(dir.write("peer.key", kKey, 0400));
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigKeyFile, GroupOrOtherAccessIsRejected) {
    const TempDir dir;
    for (const mode_t mode : {0640, 0604, 0620, 0602, 0660, 0644, 0666}) {
        SCOPED_TRACE(mode);
        const std::string path = dir.write("peer.key", kKey, mode);
        const Error e = onlyError(parseWithKey(path));
        EXPECT_EQ(e.key, "security.peer_key_file");
        // The position of the peer_key_file key.
        EXPECT_EQ(e.line, 4u);
        EXPECT_EQ(e.column, 1u);
        char mode_text[8];
        std::snprintf(mode_text, sizeof mode_text, "%04o", static_cast<unsigned>(mode));
        EXPECT_NE(e.found.find(std::string("mode ") + mode_text), std::string::npos) << e.found;
        EXPECT_NE(e.found.find(path), std::string::npos) << e.found;
        EXPECT_NE(e.found.find("chmod 600 " + path), std::string::npos) << e.found;
    }
}

TEST(ConfigKeyFile, ExecuteBitsAloneAreNotAccess) {
    // Only read and write by group/other leak or endanger the key.
    const TempDir dir;
    const ParseResult r = parseWithKey(dir.write("peer.key", kKey, 0711));
    EXPECT_TRUE(r.ok()) << allErrors(r);
}

TEST(ConfigKeyFile, MissingFileIsRejected) {
    const TempDir dir;
    const std::string path = (dir.path() / "absent.key").string();
    const Error e = onlyError(parseWithKey(path));
    EXPECT_EQ(e.key, "security.peer_key_file");
    EXPECT_EQ(e.line, 4u);
    EXPECT_EQ(e.found, "\"" + path + "\": no such file; make one with `tensorlane keygen " + path +
                           "` and copy it to every peer");
    EXPECT_NE(e.expected.find("tensorlane keygen"), std::string::npos) << e.expected;
}

TEST(ConfigKeyFile, BadFormatIsRejectedLikeTheSidecarsStart) {
    // --check-config reports a file the peer layer would refuse, in the same words.
    const TempDir dir;
    const std::string path = dir.write("peer.key", "0123456789abcdef0123456789abcdef\n", 0600);
    const Error e = onlyError(parseWithKey(path));
    EXPECT_EQ(e.key, "security.peer_key_file");
    EXPECT_EQ(e.line, 4u);
    KeyBytes bytes;
    const KeyFileResult direct = readKeyFile(path, &bytes);
    EXPECT_EQ(direct.problem, KeyFileResult::Problem::kFormat);
    EXPECT_EQ(e.found, "\"" + path + "\": " + direct.detail);
    EXPECT_NE(e.found.find("not a tensorlane key file"), std::string::npos) << e.found;
    EXPECT_NE(e.found.find("tensorlane keygen --force " + path), std::string::npos) << e.found;
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
    const Error e = onlyError(parseWithKey(dir.write("peer.key", kKey, 0200)));
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
    const ParseResult r = parseString(docWithKey(dir.write("peer.key", kKey, 0644)));
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

// --- the format ---

const std::string kHex = "00112233445566778899aabbccddeeff0123456789abcdef0f1e2d3c4b5a6978";

std::vector<uint8_t> bytesOf(const KeyBytes &k) {
    return {k.data(), k.data() + kKeyFileBytes};
}

TEST(KeyFileFormat, AcceptsTheLineWithOrWithoutANewline) {
    for (const std::string &text :
         {kKey, "tensorlane-key-v1:" + kHex, "tensorlane-key-v1:" + kHex + "\r\n"}) {
        KeyBytes k;
        const KeyFileResult r = parseKeyText(text, &k);
        ASSERT_TRUE(r.ok()) << r.detail;
        EXPECT_EQ(k.data()[0], 0x00);
        EXPECT_EQ(k.data()[1], 0x11);
        EXPECT_EQ(k.data()[15], 0xff);
        EXPECT_EQ(k.data()[31], 0x78);
    }
}

TEST(KeyFileFormat, UppercaseDigitsAreTheSameKey) {
    std::string upper = kHex;
    for (char &c : upper) {
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    KeyBytes a, b;
    ASSERT_TRUE(parseKeyText(kKey, &a).ok());
    ASSERT_TRUE(parseKeyText("tensorlane-key-v1:" + upper + "\n", &b).ok());
    EXPECT_EQ(bytesOf(a), bytesOf(b));
}

TEST(KeyFileFormat, FormatWritesWhatParseReads) {
    KeyBytes k;
    ASSERT_TRUE(parseKeyText("tensorlane-key-v1:" + kHex, &k).ok());
    EXPECT_EQ(formatKeyText(k), kKey);
}

TEST(KeyFileFormat, EverythingElseIsRefusedWithTheReason) {
    const std::string p = "tensorlane-key-v1:";
    struct Case {
        std::string text;
        std::string reason;
    };
    const std::vector<Case> cases = {
        {"", "empty"},
        // The format before v1: a raw secret, whitespace trimmed. No longer read.
        {"0123456789abcdef0123456789abcdef\n", "not a tensorlane key file"},
        {std::string("\x01\x02 \n\xff\x00", 6) + std::string(26, 'x'), "no longer read"},
        {" " + kKey, "not a tensorlane key file"},
        {"Tensorlane-key-v1:" + kHex, "not a tensorlane key file"},
        {"tensorlane-key-v2:" + kHex,
         "a tensorlane-key-v2 file; this version reads "
         "tensorlane-key-v1 files only"},
        {p + kHex.substr(0, 63) + "\n", "63 hex digits after tensorlane-key-v1:, 64 are needed"},
        {p, "0 hex digits"},
        {p + kHex + "0", "more than 64 hex digits"},
        {p + kHex.substr(0, 31) + "g" + kHex.substr(32), "character 50 of the line is 'g'"},
        {p + kHex.substr(0, 10) + " " + kHex.substr(10), "character 29 of the line is a space"},
        {p + kHex.substr(0, 10) + "\t" + kHex.substr(11), "is a tab, not a hex digit"},
        {p + kHex + " \n", "text after the key: a space after the 64 hex digits"},
        {p + kHex + "\n\n", "more than one line"},
        {kKey + kKey, "more than one line"},
        {p + kHex + "\r", "more than one line"},
        {p + kHex + std::string("\0", 1), "text after the key: byte 0x00"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.text);
        KeyBytes k;
        const KeyFileResult r = parseKeyText(c.text, &k);
        EXPECT_EQ(r.problem, KeyFileResult::Problem::kFormat);
        EXPECT_NE(r.detail.find(c.reason), std::string::npos) << r.detail;
        // No key material in messages (they go to logs): no run of the test key's digits.
        EXPECT_EQ(r.detail.find(kHex.substr(0, 8)), std::string::npos) << r.detail;
        EXPECT_EQ(r.detail.find(kHex.substr(40, 8)), std::string::npos) << r.detail;
    }
}

// --- reading a file ---

TEST(KeyFileRead, ReadsAKeyFile) {
    const TempDir dir;
    KeyBytes k;
    const KeyFileResult r = readKeyFile(dir.write("peer.key", kKey, 0600), &k);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(formatKeyText(k), kKey);
}

TEST(KeyFileRead, FollowsSymbolicLinksAsInASecretVolume) {
    // Kubernetes mounts a Secret's files as links into a ..data directory.
    const TempDir dir;
    const std::string target = dir.write("..data/peer.key", kKey, 0600);
    const std::string link = (dir.path() / "peer.key").string();
    ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
    KeyBytes k;
    const KeyFileResult r = readKeyFile(link, &k);
    EXPECT_TRUE(r.ok()) << r.detail;
}

TEST(KeyFileRead, ProblemsSayHowToFixThem) {
    const TempDir dir;
    KeyBytes k;
    const std::string absent = (dir.path() / "absent.key").string();
    KeyFileResult r = readKeyFile(absent, &k);
    EXPECT_EQ(r.problem, KeyFileResult::Problem::kAccess);
    EXPECT_NE(r.detail.find("tensorlane keygen " + absent + "`"), std::string::npos) << r.detail;

    const std::string open = dir.write("open.key", kKey, 0640);
    r = readKeyFile(open, &k);
    EXPECT_EQ(r.problem, KeyFileResult::Problem::kAccess);
    EXPECT_NE(r.detail.find("mode 0640"), std::string::npos) << r.detail;
    EXPECT_NE(r.detail.find("chmod 600 " + open), std::string::npos) << r.detail;

    const std::string old = dir.write("old.key", "an-old-style-raw-secret-0123456789\n", 0600);
    r = readKeyFile(old, &k);
    EXPECT_EQ(r.problem, KeyFileResult::Problem::kFormat);
    EXPECT_NE(r.detail.find("tensorlane keygen --force " + old + "`"), std::string::npos)
        << r.detail;
}

TEST(KeyFileRead, ALargeFileIsRefusedUnread) {
    const TempDir dir;
    KeyBytes k;
    const KeyFileResult r = readKeyFile(dir.write("big.key", std::string(5000, 'a'), 0600), &k);
    EXPECT_EQ(r.problem, KeyFileResult::Problem::kFormat);
    EXPECT_NE(r.detail.find("5000 bytes"), std::string::npos) << r.detail;
}

TEST(KeyFileRead, AFifoDoesNotBlock) {
    const TempDir dir;
    const std::string fifo = (dir.path() / "peer.key").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    KeyBytes k;
    const KeyFileResult r = readKeyFile(fifo, &k);
    EXPECT_EQ(r.problem, KeyFileResult::Problem::kAccess);
    EXPECT_NE(r.detail.find("not a regular file"), std::string::npos) << r.detail;
}

// --- writing one (tensorlane keygen) ---

std::string slurp(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

size_t entries(const std::filesystem::path &dir) {
    size_t n = 0;
    for ([[maybe_unused]] const auto &e : std::filesystem::directory_iterator(dir)) {
        ++n;
    }
    return n;
}

mode_t modeOf(const std::string &path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
}

TEST(KeyFileWrite, WritesAFreshKeyWithMode0600WhateverTheUmask) {
    const TempDir dir;
    std::vector<std::string> keys;
    for (const mode_t mask : {mode_t{0}, mode_t{022}, mode_t{0777}}) {
        const std::string path = (dir.path() / ("k" + std::to_string(mask))).string();
        const mode_t old = ::umask(mask);
        const std::string error = writeNewKeyFile(path, false);
        ::umask(old);
        ASSERT_EQ(error, "");
        EXPECT_EQ(modeOf(path), 0600u);
        const std::string text = slurp(path);
        ASSERT_EQ(text.size(), kKeyFilePrefix.size() + 64 + 1);
        EXPECT_EQ(text.rfind("tensorlane-key-v1:", 0), 0u);
        EXPECT_EQ(text.back(), '\n');
        EXPECT_EQ(text.find_first_not_of("0123456789abcdef", kKeyFilePrefix.size()), 82u);
        KeyBytes k;
        EXPECT_TRUE(readKeyFile(path, &k).ok());
        keys.push_back(text);
    }
    // Fresh randomness each time; and no temporary file left behind.
    EXPECT_NE(keys[0], keys[1]);
    EXPECT_NE(keys[1], keys[2]);
    EXPECT_EQ(entries(dir.path()), 3u);
}

TEST(KeyFileWrite, RefusesToReplaceAFileWithoutForce) {
    const TempDir dir;
    const std::string path = dir.write("peer.key", kKey, 0600);
    const std::string error = writeNewKeyFile(path, false);
    EXPECT_NE(error.find(path + " exists"), std::string::npos) << error;
    EXPECT_NE(error.find("tensorlane keygen --force " + path), std::string::npos) << error;
    EXPECT_EQ(slurp(path), kKey);
    EXPECT_EQ(entries(dir.path()), 1u);
}

TEST(KeyFileWrite, ForceReplacesTheFileWithAFresh0600One) {
    const TempDir dir;
    const std::string path = dir.write("peer.key", "old secret\n", 0644);
    ASSERT_EQ(writeNewKeyFile(path, true), "");
    EXPECT_NE(slurp(path), "old secret\n");
    EXPECT_EQ(modeOf(path), 0600u);
    KeyBytes k;
    EXPECT_TRUE(readKeyFile(path, &k).ok());
    EXPECT_EQ(entries(dir.path()), 1u);
}

TEST(KeyFileWrite, AMissingDirectoryIsNamed) {
    const TempDir dir;
    const std::string sub = (dir.path() / "etc-tensorlane").string();
    const std::string error = writeNewKeyFile(sub + "/peer.key", false);
    EXPECT_NE(error.find("the directory " + sub + " does not exist (mkdir -p " + sub + ")"),
              std::string::npos)
        << error;
}

TEST(KeyFileWrite, OfConcurrentWritersExactlyOneWins) {
    // The no-overwrite rule holds under a race: never two keys, never a torn file.
    const TempDir dir;
    const std::string path = (dir.path() / "peer.key").string();
    constexpr int kWriters = 8;
    std::vector<std::string> errors(kWriters);
    std::vector<std::thread> threads;
    for (int i = 0; i < kWriters; ++i) {
        threads.emplace_back([&, i] { errors[i] = writeNewKeyFile(path, false); });
    }
    for (auto &t : threads) {
        t.join();
    }
    int won = 0;
    for (const auto &e : errors) {
        if (e.empty()) {
            ++won;
        } else {
            EXPECT_NE(e.find("exists"), std::string::npos) << e;
        }
    }
    EXPECT_EQ(won, 1);
    KeyBytes k;
    EXPECT_TRUE(readKeyFile(path, &k).ok());
    EXPECT_EQ(entries(dir.path()), 1u);
}

TEST(ConfigKeyFile, PerPairKeyFilesAreCheckedAndTheSharedOneOnlyWhenUsed) {
    const TempDir dir;
    const std::string ab = dir.write("ab.key", kKey, 0600);
    const std::string open = dir.write("open.key", kKey, 0644);
    const std::string shared = (dir.path() / "missing.key").string();
    // Every peer has its own key: the (missing) shared one is not needed.
    const std::string doc =
        "[node]\nname = \"a\"\n[security]\npeer_key_file = \"" + shared +
        "\"\n[[peers]]\nname = \"b\"\naddress = \"127.0.0.1:1\"\nkey_file = \"" + ab + "\"\n";
    ParseResult r = parseString(doc, "test.toml", kCheck);
    ASSERT_TRUE(r.ok()) << allErrors(r);
    EXPECT_EQ(r.config->peers[0].key_file, ab);
    // A peer without one uses the shared key, which must then be there.
    r = parseString(doc + "[[peers]]\nname = \"c\"\naddress = \"127.0.0.1:2\"\n", "test.toml",
                    kCheck);
    Error e = onlyError(r);
    EXPECT_EQ(e.key, "security.peer_key_file");
    EXPECT_TRUE(r.errors.empty() || r.errors[0].found.find("missing.key") != std::string::npos);
    // A per-pair key file gets the same checks, named by its own key.
    const std::string bad =
        "[node]\nname = \"a\"\n[[peers]]\nname = \"b\"\naddress = "
        "\"127.0.0.1:1\"\nkey_file = \"" +
        open + "\"\n";
    e = onlyError(parseString(bad, "test.toml", kCheck));
    EXPECT_EQ(e.key, "peers[0].key_file");
    EXPECT_EQ(e.line, 6u);
    EXPECT_NE(e.found.find("open.key"), std::string::npos) << e.text();
    e =
        onlyError(parseString("[node]\nname = \"a\"\n[[peers]]\nname = \"b\"\naddress = "
                              "\"127.0.0.1:1\"\nkey_file = \"\"\n",
                              "test.toml", kCheck));
    EXPECT_EQ(e.key, "peers[0].key_file");
}

}  // namespace
}  // namespace tensorlane::config
