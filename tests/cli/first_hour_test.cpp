// Issue 24, "first-hour frictions": what a new user meets before any sidecar runs. Each test is
// one friction, run the way that user ran it (the installed programs, their stdout and exit
// status), so that it comes back only with a failing test.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.hpp"

using namespace tltest;

namespace {

const std::string kFhCli = TENSORLANE_CLI_BIN;
const std::string kFhSidecar = TENSORLANE_SIDECAR_BIN;

/// A fresh directory for one test's files, removed after it.
class FirstHourDir {
public:
    FirstHourDir() {
        char tmpl[] = "/tmp/tl-first-hour-XXXXXX";
        const char *d = ::mkdtemp(tmpl);
        EXPECT_NE(d, nullptr);
        path_ = d != nullptr ? d : "/tmp";
        ::chmod(path_.c_str(), 0755);  // another uid (setpriv below) may look inside
    }
    ~FirstHourDir() { std::filesystem::remove_all(path_); }
    FirstHourDir(const FirstHourDir &) = delete;
    FirstHourDir &operator=(const FirstHourDir &) = delete;

    std::string write(const std::string &name, const std::string &text) const {
        const std::string p = path_ + "/" + name;
        std::ofstream(p) << text;
        return p;
    }
    const std::string &path() const { return path_; }

private:
    std::string path_;
};

bool hasText(const std::string &haystack, const std::string &needle) {
    return haystack.find(needle) != std::string::npos;
}

// ---- 2. --check-config FILE --json: one JSON document on stdout, errors included ----

TEST(FirstHourCheckConfig, JsonWithAWrongValueIsADocumentNamingTheKeyAndTheFix) {
    FirstHourDir dir;
    const std::string cfg = dir.write("bad.toml", "[node]\nname = \"a\"\n\n[fabric]\ndscp = 64\n");
    const CmdResult r = runCmd(kFhSidecar + " --check-config " + cfg + " --json", false);
    EXPECT_EQ(r.rc, 2);
    const auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "stdout is not one JSON document: '" << r.out << "'";
    EXPECT_EQ(j.value("ok", true), false);
    ASSERT_TRUE(j.contains("errors") && j["errors"].is_array() && j["errors"].size() == 1) << r.out;
    const auto &e = j["errors"][0];
    EXPECT_EQ(e.value("file", ""), cfg);
    EXPECT_EQ(e.value("line", 0), 5);
    EXPECT_EQ(e.value("column", 0), 8);
    EXPECT_EQ(e.value("key", ""), "fabric.dscp");
    EXPECT_TRUE(hasText(e.value("message", ""), "expected an integer 0-63, found 64")) << e;
    EXPECT_EQ(e.value("fix", ""), "set 'fabric.dscp' to an integer 0-63");
}

TEST(FirstHourCheckConfig, JsonWithBrokenTomlAndAnUnknownKey) {
    FirstHourDir dir;
    const std::string syntax = dir.write("syntax.toml", "[node\nname = \"a\"\n");
    CmdResult r = runCmd(kFhSidecar + " --check-config " + syntax + " --json", false);
    EXPECT_EQ(r.rc, 2);
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object() && j["errors"].size() == 1) << r.out;
    EXPECT_EQ(j["errors"][0].value("line", 0), 1);
    EXPECT_EQ(j["errors"][0].value("key", "?"), "");
    EXPECT_TRUE(hasText(j["errors"][0].value("fix", ""), "TOML syntax at line 1")) << j;

    const std::string unknown = dir.write("unknown.toml", "[node]\nname = \"a\"\nnmae = \"b\"\n");
    r = runCmd(kFhSidecar + " --check-config " + unknown + " --json", false);
    EXPECT_EQ(r.rc, 2);
    j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object() && j["errors"].size() == 1) << r.out;
    EXPECT_EQ(j["errors"][0].value("key", ""), "node.nmae");
    EXPECT_TRUE(hasText(j["errors"][0].value("fix", ""), "remove or rename 'node.nmae'")) << j;

    r = runCmd(kFhSidecar + " --check-config " + dir.path() + "/missing.toml --json", false);
    EXPECT_EQ(r.rc, 2);
    j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object() && j["errors"].size() == 1) << r.out;
    EXPECT_EQ(j["errors"][0].value("line", -1), 0);
}

TEST(FirstHourCheckConfig, JsonWithOnlyTheKeyFileWrongKeepsTheResolvedValues) {
    FirstHourDir dir;
    const std::string cfg = dir.write(
        "pair.toml",
        "[node]\nname = \"a\"\nlisten = \"127.0.0.1:18600\"\n[security]\n"
        "peer_key_file = \"" +
            dir.path() + "/no.key\"\n[[peers]]\nname = \"b\"\naddress = \"127.0.0.1:1\"\n");
    const CmdResult r = runCmd(kFhSidecar + " --check-config " + cfg + " --json", false);
    EXPECT_EQ(r.rc, 2);
    const auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j["derived"].value("traffic_class", 0), 106) << j;
    ASSERT_EQ(j["errors"].size(), 1u) << j;
    EXPECT_EQ(j["errors"][0].value("key", ""), "security.peer_key_file");
    EXPECT_TRUE(hasText(j["errors"][0].value("fix", ""), "tensorlane keygen")) << j;
}

TEST(FirstHourCheckConfig, JsonOfAGoodFileSaysOkWithNoErrors) {
    FirstHourDir dir;
    const std::string cfg = dir.write("single.toml", "[node]\nname = \"a\"\n");
    const CmdResult r = runCmd(kFhSidecar + " --check-config " + cfg + " --json", false);
    EXPECT_EQ(r.rc, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j.value("ok", false), true);
    EXPECT_TRUE(j["errors"].is_array() && j["errors"].empty()) << j;
}

// ---- 7. TL_ECONN and TL_EPERM name the next step ----

TEST(FirstHourConnect, NoSidecarSaysStartItOrNameItsSocket) {
    FirstHourDir dir;
    const CmdResult r = runCmd(kFhCli + " status --socket " + dir.path() + "/none.sock");
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(hasText(r.out, "TL_ECONN")) << r.out;
    EXPECT_TRUE(hasText(r.out, "start the sidecar")) << r.out;
    EXPECT_TRUE(hasText(r.out, "--socket PATH")) << r.out;
    EXPECT_TRUE(hasText(r.out, "--config FILE")) << r.out;

    // Without --socket: the default path, and that it was the default.
    const CmdResult d = runCmd("env -u TENSORLANE_SOCKET " + kFhCli + " status");
    if (!std::filesystem::exists("/run/tensorlane/sidecar.sock")) {
        EXPECT_EQ(d.rc, 1);
        EXPECT_TRUE(hasText(d.out, "/run/tensorlane/sidecar.sock")) << d.out;
        EXPECT_TRUE(hasText(d.out, "the default path")) << d.out;
    }
}

/// A listening (or, after close, a stale) unix socket at `path` with `mode`.
int firstHourListen(const std::string &path, mode_t mode) {
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    ::chmod(path.c_str(), mode);
    return fd;
}

TEST(FirstHourConnect, AStaleSocketSaysNoSidecarListens) {
    FirstHourDir dir;
    const std::string sock = dir.path() + "/stale.sock";
    ::close(firstHourListen(sock, 0666));  // the file stays: a sidecar that was killed
    const CmdResult r = runCmd(kFhCli + " status --socket " + sock);
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(hasText(r.out, "no sidecar listens")) << r.out;
    EXPECT_TRUE(hasText(r.out, "start the sidecar")) << r.out;
}

TEST(FirstHourConnect, ASocketThisUidMayNotOpenNamesAllowedUidsAndGids) {
    if (::geteuid() != 0 || ::access("/usr/bin/setpriv", X_OK) != 0) {
        GTEST_SKIP() << "needs root and setpriv to run the CLI as another uid";
    }
    FirstHourDir dir;
    const std::string sock = dir.path() + "/sidecar.sock";
    const int fd = firstHourListen(sock, 0600);  // owned by root: as the sidecar's socket is
    const CmdResult r = runCmd("setpriv --reuid=65534 --regid=65534 --clear-groups " + kFhCli +
                               " status --socket " + sock);
    ::close(fd);
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(hasText(r.out, "TL_EPERM")) << r.out;
    EXPECT_TRUE(hasText(r.out, "allowed_uids")) << r.out;
    EXPECT_TRUE(hasText(r.out, "allowed_gids")) << r.out;
}

}  // namespace
