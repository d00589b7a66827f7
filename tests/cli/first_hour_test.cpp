// Issue 24, "first-hour frictions": what a new user meets before any sidecar runs. Each test is
// one friction, run the way that user ran it (the installed programs, their stdout and exit
// status), so that it comes back only with a failing test.
#include <gtest/gtest.h>
#include <sys/stat.h>
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

}  // namespace
