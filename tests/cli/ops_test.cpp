// `tensorlane status --watch` against a real sidecar (through a pipe and on a pseudo-terminal)
// and the PNG chart `tensorlane bench` writes beside its CSV with gnuplot.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "../sidecar/free_port.hpp"
#include "../sidecar/harness.hpp"
#include "cli_run.hpp"
#include "tensorlane/tensorlane.hpp"

using namespace tltest;

namespace {

const std::string kCli = TENSORLANE_CLI_BIN;

size_t countOf(const std::string &text, const std::string &what) {
    size_t n = 0;
    for (size_t pos = 0; (pos = text.find(what, pos)) != std::string::npos; pos += what.size()) {
        ++n;
    }
    return n;
}

/// Reads what is there on `fd` within `ms` (appended to *out); false at end of file.
bool readFor(int fd, int ms, std::string *out) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              end - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) {
            return true;
        }
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(left)) <= 0) {
            continue;
        }
        char buf[4096];
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) {
            return false;
        }
        out->append(buf, static_cast<size_t>(n));
    }
}

/// Waits for `pid` up to `timeout`; its exit status, or -1 (still running: killed), or
/// 128 + the signal that ended it.
int waitWithin(pid_t pid, std::chrono::milliseconds timeout) {
    int status = 0;
    const bool exited =
        eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, timeout);
    if (!exited) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(StatusWatch, PipedItPrintsSuccessiveSnapshots) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    const auto t0 = std::chrono::steady_clock::now();
    const CmdResult r = runCmd(
        kCli + " status --socket " + sc.socket() + " --watch --interval 0.3 --count 3", false);
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(countOf(r.out, "tensorlane status, every 0.3 s, "), 3u) << r.out;
    EXPECT_EQ(countOf(r.out, "node node-a (socket " + sc.socket()), 3u) << r.out;
    // Not a terminal: no screen control, only text.
    EXPECT_EQ(r.out.find('\033'), std::string::npos) << r.out;
    // Two waits between three refreshes.
    EXPECT_GE(took, std::chrono::milliseconds(550));
    // The watch's own connection is not shown (issue 24): no other client, none listed.
    EXPECT_EQ(countOf(r.out, "  session "), 0u) << r.out;
    EXPECT_EQ(countOf(r.out, "  (none connected)"), 3u) << r.out;
}

TEST(StatusWatch, JsonIsOneObjectPerLine) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    const CmdResult r = runCmd(
        kCli + " status --socket " + sc.socket() + " --watch --json --interval 0.2 --count 2",
        false);
    EXPECT_EQ(r.rc, 0) << r.out;
    std::istringstream in(r.out);
    int objects = 0;
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line, nullptr, false);
        ASSERT_TRUE(j.is_object()) << line;
        EXPECT_EQ(j.value("node", ""), "node-a");
        ++objects;
    }
    EXPECT_EQ(objects, 2) << r.out;
}

TEST(StatusWatch, SigintEndsItCleanly) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(out[1], 1);
        ::close(out[0]);
        ::execl(kCli.c_str(), "tensorlane", "status", "--socket", sc.socket().c_str(), "--watch",
                "--interval", "0.2", static_cast<char *>(nullptr));
        ::_exit(127);
    }
    ::close(out[1]);
    std::string text;
    ASSERT_TRUE(eventually(
        [&] {
            readFor(out[0], 50, &text);
            return countOf(text, "tensorlane status, every") >= 2;
        },
        std::chrono::seconds(10)))
        << text;
    ::kill(pid, SIGINT);
    EXPECT_EQ(waitWithin(pid, std::chrono::seconds(3)), 0) << text;
    ::close(out[0]);
}

TEST(StatusWatch, SidecarGoneIsShownAndRetried) {
    TempDir dir;
    const CmdResult r = runCmd(
        kCli + " status --socket " + dir.file("nobody.sock") + " --watch --interval 0.1 --count 2",
        false);
    // --count N ending on a refresh that reached nothing fails, as a single status does.
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_EQ(countOf(r.out, "sidecar not reachable: TL_ECONN"), 2u) << r.out;
    // Without --watch it is an error.
    EXPECT_EQ(runCmd(kCli + " status --socket " + dir.file("nobody.sock")).rc, 1);
}

// Issue 24: `status --json` and `status --watch --json` without a sidecar agree: JSON on stdout
// (an object with "error"), exit 1.
TEST(StatusJson, NoSidecarIsAJsonObjectAndExit1WithOrWithoutWatch) {
    TempDir dir;
    const std::string sock = dir.file("nobody.sock");
    for (const std::string args : {" --json", " --watch --json --interval 0.1 --count 2"}) {
        const CmdResult r = runCmd(kCli + " status --socket " + sock + args, false);
        EXPECT_EQ(r.rc, 1) << args << ": " << r.out;
        std::istringstream in(r.out);
        int objects = 0;
        for (std::string line; std::getline(in, line);) {
            const auto j = nlohmann::json::parse(line, nullptr, false);
            ASSERT_TRUE(j.is_object()) << args << ": " << line;
            EXPECT_NE(j.value("error", "").find("TL_ECONN"), std::string::npos) << line;
            EXPECT_EQ(j.value("socket", ""), sock);
            ++objects;
        }
        EXPECT_GE(objects, 1) << args << ": " << r.out;
    }
}

// Issue 24: a peer no session was tried with is "not connected yet", not "down"; the status
// command's own session is not listed among the clients.
TEST(StatusText, APeerNeverUsedIsNotConnectedYetAndItsOwnSessionIsLeftOut) {
    SidecarOptions o;
    o.listen = "127.0.0.1:" + std::to_string(freePort());
    o.peers = {{"node-b", "127.0.0.1:" + std::to_string(freePort())}};
    Sidecar sc(o);
    ASSERT_TRUE(sc.ready()) << sc.log();
    const CmdResult r = runCmd(kCli + " status --socket " + sc.socket(), false);
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("node-b " + o.peers[0].address + " via tcp: not connected yet"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find(" down"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("clients:\n  (none connected)\n"), std::string::npos) << r.out;
    EXPECT_EQ(countOf(r.out, "  session "), 0u) << r.out;
}

/// tl_lookup of `name` on `peer`: its status.
tl_status statusTestLookup(tl_client *c, const char *peer, const char *name) {
    tl_remote r = 0;
    return tl_lookup(c, peer, name, &r, nullptr);
}

// Issue 24: plain `status` says why a peer failed; once the peer is back (restarted with the
// right key) the next lookup gets a fresh answer, not the old authentication error for the rest
// of a long backoff, and the old reason is gone from status.
TEST(StatusText, AFailedPeerSaysWhyAndItsReasonIsNotKeptOnceItIsBack) {
    TempDir dir;
    const std::string key_a = dir.file("a.key"), key_b = dir.file("b.key");
    writeFile(key_a, keyText('a'), 0600);
    writeFile(key_b, keyText('b'), 0600);
    const uint16_t pa = freePort(), pb = freePort();
    // Backoff doubling from 300 ms to a minute: after a few failures the next retry is seconds
    // away, as on a node whose peer was down for a while.
    const std::string tcp =
        "connect_timeout_ms = 1000\nreconnect_min_ms = 300\n"
        "reconnect_max_ms = 60000\n";
    SidecarOptions a{.name = "node-a",
                     .listen = "127.0.0.1:" + std::to_string(pa),
                     .peers = {{"node-b", "127.0.0.1:" + std::to_string(pb)}},
                     .key_file = key_a,
                     .tcp = tcp};
    SidecarOptions b{.name = "node-b",
                     .listen = "127.0.0.1:" + std::to_string(pb),
                     .peers = {{"node-a", "127.0.0.1:" + std::to_string(pa)}},
                     .key_file = key_b,
                     .tcp = tcp};
    Sidecar sa(a);
    auto sb = std::make_unique<Sidecar>(b);
    ASSERT_TRUE(sa.ready() && sb->ready());
    tl_client *ca = nullptr;
    ASSERT_EQ(tl_connect(sa.socket().c_str(), &ca), TL_OK);
    EXPECT_EQ(statusTestLookup(ca, "node-b", "inbox"), TL_EPEER) << tl_last_error();

    // Failing on: wait for the fourth failure (the backoff is then at least 2.4 s).
    auto peerOf = [&] {
        const CmdResult r = runCmd(kCli + " status --json --socket " + sa.socket(), false);
        const auto j = nlohmann::json::parse(r.out, nullptr, false);
        return j.is_object() && j["peers"].is_array() && !j["peers"].empty() ? j["peers"][0]
                                                                             : nlohmann::json();
    };
    ASSERT_TRUE(
        eventually([&] { return peerOf().value("failures", 0) >= 4; }, std::chrono::seconds(15)))
        << peerOf();
    const CmdResult failed = runCmd(kCli + " status --socket " + sa.socket(), false);
    EXPECT_NE(failed.out.find("via tcp: failed ("), std::string::npos) << failed.out;
    EXPECT_NE(failed.out.find("authentication"), std::string::npos) << failed.out;

    // node-b comes back with the right key and something to find.
    sb.reset();
    b.key_file = key_a;
    sb = std::make_unique<Sidecar>(b);
    ASSERT_TRUE(sb->ready()) << sb->log();
    auto cb = tensorlane::Client::connect(sb->socket());
    ASSERT_TRUE(cb.ok());
    auto inbox = cb->allocHost(4096);
    ASSERT_TRUE(inbox.ok() && inbox->expose("inbox").ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the old reason is stale now

    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(statusTestLookup(ca, "node-b", "inbox"), TL_OK) << tl_last_error();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
    const nlohmann::json up = peerOf();
    EXPECT_EQ(up.value("state", ""), "up") << up;
    EXPECT_EQ(up.value("last_error", "?"), "") << up;
    const CmdResult now_up = runCmd(kCli + " status --socket " + sa.socket(), false);
    EXPECT_NE(now_up.out.find("via tcp: up\n"), std::string::npos) << now_up.out;
    tl_disconnect(ca);
}

TEST(StatusWatch, OnATerminalItRedrawsAndQuitsOnQ) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    int master = -1, slave = -1;
    winsize ws{40, 120, 0, 0};
    ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, &ws), 0);
    termios before{};
    ASSERT_EQ(::tcgetattr(slave, &before), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::close(master);
        ::setsid();
        ::ioctl(slave, TIOCSCTTY, 0);
        ::dup2(slave, 0);
        ::dup2(slave, 1);
        ::dup2(slave, 2);
        ::execl(kCli.c_str(), "tensorlane", "status", "--socket", sc.socket().c_str(), "--watch",
                "--interval", "0.2", static_cast<char *>(nullptr));
        ::_exit(127);
    }
    std::string screen;
    ASSERT_TRUE(eventually(
        [&] {
            readFor(master, 50, &screen);
            return countOf(screen, "\033[H") >= 3;
        },
        std::chrono::seconds(10)))
        << screen;
    // top's way: the alternate screen and no cursor while it runs; every refresh starts at the
    // top left and clears what the last one left below.
    EXPECT_EQ(screen.rfind("\033[?1049h\033[?25l", 0), 0u) << screen.substr(0, 80);
    EXPECT_GE(countOf(screen, "\033[J"), 3u);
    EXPECT_NE(screen.find("(q or Ctrl-C quits)"), std::string::npos);
    EXPECT_NE(screen.find("node node-a"), std::string::npos);
    // While it runs, keys are read one at a time without echo.
    termios during{};
    ASSERT_EQ(::tcgetattr(slave, &during), 0);
    EXPECT_EQ(during.c_lflag & (ICANON | ECHO), 0u);
    ASSERT_EQ(::write(master, "q", 1), 1);
    EXPECT_EQ(waitWithin(pid, std::chrono::seconds(3)), 0);
    readFor(master, 100, &screen);
    // The terminal is given back as it was: main screen, cursor, line mode and echo.
    const size_t restore = screen.rfind("\033[?25h\033[?1049l");
    EXPECT_NE(restore, std::string::npos);
    termios after{};
    ASSERT_EQ(::tcgetattr(slave, &after), 0);
    EXPECT_EQ(after.c_lflag & (ICANON | ECHO), before.c_lflag & (ICANON | ECHO));
    ::close(master);
    ::close(slave);
}

// ---- the bench's chart ----

bool haveGnuplot() {
    return std::system("command -v gnuplot >/dev/null 2>&1") == 0;
}

struct PngInfo {
    bool valid = false;
    uint32_t width = 0;
    uint32_t height = 0;
    uintmax_t bytes = 0;
};

/// The PNG signature and the IHDR chunk's size fields (PNG spec 11.2.2), and the file's size.
PngInfo readPng(const std::string &path) {
    PngInfo info;
    std::ifstream in(path, std::ios::binary);
    unsigned char h[24] = {};
    if (!in.read(reinterpret_cast<char *>(h), sizeof h)) {
        return info;
    }
    static const unsigned char kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    info.valid = std::memcmp(h, kSig, 8) == 0 && std::memcmp(h + 12, "IHDR", 4) == 0;
    info.width = (uint32_t{h[16]} << 24) | (uint32_t{h[17]} << 16) | (uint32_t{h[18]} << 8) | h[19];
    info.height =
        (uint32_t{h[20]} << 24) | (uint32_t{h[21]} << 16) | (uint32_t{h[22]} << 8) | h[23];
    info.bytes = std::filesystem::file_size(path);
    return info;
}

const std::string kQuickBench = " bench --sizes 64,64K --iters 20 --duration 0.05";

TEST(BenchChart, APngBesideTheCsv) {
    if (!haveGnuplot()) {
        GTEST_SKIP() << "gnuplot is not installed (Debian package gnuplot-nox; "
                        "scripts/install-deps.sh installs it)";
    }
    TempDir dir;
    const CmdResult r = runCmd(kCli + kQuickBench + " --csv " + dir.file("run.csv"));
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("tensorlane bench: chart: " + dir.file("run.png")), std::string::npos)
        << r.out;
    const PngInfo png = readPng(dir.file("run.png"));
    EXPECT_TRUE(png.valid);
    EXPECT_EQ(png.width, 1400u);  // two panels: bandwidth and latency
    EXPECT_EQ(png.height, 560u);
    EXPECT_GT(png.bytes, 20000u) << "a chart with axes, lines and labels, not an empty image";
    EXPECT_TRUE(std::filesystem::exists(dir.file("run.csv")));
    // Nothing else left behind (the temporary file was renamed).
    EXPECT_EQ(countEntries(dir.path()), 2);
}

TEST(BenchChart, ChartOptionLatencyOnly) {
    if (!haveGnuplot()) {
        GTEST_SKIP() << "gnuplot is not installed (Debian package gnuplot-nox)";
    }
    TempDir dir;
    const std::string chart = dir.file("it's lat.png");  // a quote in the name
    const CmdResult r =
        runCmd(kCli + kQuickBench + " --test lat --no-baseline --chart \"" + chart + "\"");
    ASSERT_EQ(r.rc, 0) << r.out;
    const PngInfo png = readPng(chart);
    EXPECT_TRUE(png.valid) << r.out;
    EXPECT_EQ(png.width, 800u);  // one panel
    EXPECT_GT(png.bytes, 10000u);
    // --no-chart: the CSV alone.
    const CmdResult none = runCmd(
        kCli + kQuickBench + " --test lat --no-baseline --no-chart --csv " + dir.file("quiet.csv"));
    EXPECT_EQ(none.rc, 0) << none.out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("quiet.png")));
}

TEST(BenchChart, WithoutGnuplotAMessageNotAFailure) {
    TempDir dir;
    // A PATH in which there is no gnuplot (an empty directory); the bench needs nothing else
    // from PATH (it starts the sidecar next to itself).
    const std::string bin = dir.file("bin");
    ::mkdir(bin.c_str(), 0755);
    const CmdResult r = runCmd("PATH=" + bin + " " + kCli + kQuickBench +
                               " --test lat --no-baseline --csv " + dir.file("r.csv"));
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("no chart: gnuplot is not installed (apt-get install gnuplot-nox"),
              std::string::npos)
        << r.out;
    EXPECT_TRUE(std::filesystem::exists(dir.file("r.csv")));
    EXPECT_FALSE(std::filesystem::exists(dir.file("r.png")));
}

TEST(BenchChart, AFailingGnuplotLeavesNoFile) {
    TempDir dir;
    const std::string bin = dir.file("bin");
    ::mkdir(bin.c_str(), 0755);
    // A gnuplot that reads its script and fails, as one without the pngcairo terminal would.
    writeFile(bin + "/gnuplot",
              "#!/bin/sh\ncat >/dev/null\necho 'unknown terminal pngcairo' >&2\nexit 1\n", 0755);
    const CmdResult r = runCmd("PATH=" + bin + ":/usr/bin:/bin " + kCli + kQuickBench +
                               " --test lat --no-baseline --csv " + dir.file("r.csv"));
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("no chart: gnuplot failed: unknown terminal pngcairo"), std::string::npos)
        << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("r.png")));
    EXPECT_EQ(countEntries(dir.path()), 2) << "r.csv and bin/ only";
}

}  // namespace
