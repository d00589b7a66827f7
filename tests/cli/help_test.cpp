// Every verb of `tensorlane`: its --help describes that verb (not the program, not another
// verb), and no usage error answers with CLI11's "A subcommand is required". The verbs are
// read from `tensorlane --help`, so a verb added later is checked too.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_run.hpp"

using namespace tltest;

namespace {

const std::string kCli = TENSORLANE_CLI_BIN;

/// The verbs and their one-line descriptions, from the "Subcommands:" section of --help.
std::vector<std::pair<std::string, std::string>> verbs() {
    const CmdResult r = runCmd(kCli + " --help");
    EXPECT_EQ(r.rc, 0) << r.out;
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream in(r.out);
    bool in_section = false;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("Subcommands:", 0) == 0 || line.rfind("SUBCOMMANDS:", 0) == 0) {
            in_section = true;
            continue;
        }
        if (!in_section) {
            continue;
        }
        if (line.empty() || line[0] != ' ') {
            break;
        }
        std::istringstream f(line);
        std::string name;
        f >> name;
        std::string desc;
        std::getline(f, desc);
        desc.erase(0, desc.find_first_not_of(' '));
        out.emplace_back(name, desc);
    }
    return out;
}

TEST(CliHelp, EveryVerbsHelpDescribesThatVerb) {
    const auto all = verbs();
    std::vector<std::string> names;
    for (const auto &[name, desc] : all) {
        names.push_back(name);
    }
    // The ones that exist today; a new verb adds itself to the loop below.
    for (const char *v : {"status", "bench", "diag", "keygen"}) {
        EXPECT_NE(std::find(names.begin(), names.end(), v), names.end()) << v;
    }
    for (const auto &[name, desc] : all) {
        SCOPED_TRACE(name);
        ASSERT_GT(desc.size(), 20u) << "a description worth the name";
        const CmdResult r = runCmd(kCli + " " + name + " --help");
        EXPECT_EQ(r.rc, 0) << r.out;
        // CLI11 prints the verb's description first, then its usage line.
        EXPECT_EQ(r.out.rfind(desc, 0), 0u) << r.out;
        EXPECT_NE(r.out.find("Usage: " + kCli + " " + name), std::string::npos) << r.out;
        EXPECT_EQ(r.out.find("inspect and measure the tensorlane sidecars"), std::string::npos)
            << "the program's help instead of the verb's:\n"
            << r.out;
        for (const auto &[other, other_desc] : all) {
            if (other != name) {
                EXPECT_EQ(r.out.find(other_desc), std::string::npos) << other << ":\n" << r.out;
            }
        }
        // A usage error names what is wrong (the stray option, or first a required one the
        // verb misses), never "A subcommand is required".
        const CmdResult bad = runCmd(kCli + " " + name + " --no-such-option");
        EXPECT_EQ(bad.rc, 2) << bad.out;
        EXPECT_EQ(bad.out.find("A subcommand is required"), std::string::npos) << bad.out;
        EXPECT_TRUE(bad.out.find("--no-such-option") != std::string::npos ||
                    bad.out.find(" is required") != std::string::npos)
            << bad.out;
    }
}

TEST(CliHelp, VerbsGivenAreNeverASubcommandIsRequired) {
    for (const char *cmd : {" diag", " diag --config /nonexistent.toml", " diag --json", " keygen",
                            " status --interval 1", " bench --sizes"}) {
        const CmdResult r = runCmd(kCli + cmd);
        EXPECT_EQ(r.rc, 2) << cmd << ": " << r.out;
        EXPECT_EQ(r.out.find("A subcommand is required"), std::string::npos) << cmd << r.out;
    }
    // No verb at all: the list of verbs.
    const CmdResult none = runCmd(kCli);
    EXPECT_EQ(none.rc, 2);
    EXPECT_NE(none.out.find("a verb is required: status bench diag keygen"), std::string::npos)
        << none.out;
}

TEST(CliVersion, BothProgramsNameTheReleaseCommitAndWireProtocols) {
    for (const std::string &program : {kCli, std::string(TENSORLANE_SIDECAR_BIN)}) {
        SCOPED_TRACE(program);
        const CmdResult r = runCmd(program + " --version");
        EXPECT_EQ(r.rc, 0) << r.out;
        const std::string name = program.substr(program.rfind('/') + 1);
        EXPECT_EQ(r.out.rfind(name + " " + TENSORLANE_VERSION_STRING + " (commit ", 0), 0u)
            << r.out;
        // The commit of the tree it was built from, where git can tell it here (a copy of the
        // tree without .git, as on the GPU machine, says "unknown").
        const CmdResult head =
            runCmd("git -C '" TENSORLANE_SOURCE_DIR "' rev-parse --short=12 HEAD 2>/dev/null");
        if (head.rc == 0 && head.out.size() >= 12) {
            EXPECT_NE(r.out.find("(commit " + head.out.substr(0, 12)), std::string::npos) << r.out;
        }
        for (const char *part : {"wire protocols: peer 3, tcp transport 4, verbs transport 2, "
                                 "client control ",
                                 "ring segments ", "built with: verbs"}) {
            EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
        }
    }
}

}  // namespace
