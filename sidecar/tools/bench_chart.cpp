#include "bench_chart.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

extern char **environ;

namespace tensorlane::tools::bench {

namespace {

/// gnuplot gets this long to draw; a hung one is killed and the bench goes on without a chart.
constexpr auto kGnuplotTimeout = std::chrono::seconds(30);

/// A gnuplot single-quoted string: '' stands for one quote, nothing else is special.
std::string quoted(const std::string &s) {
    std::string out = "'";
    for (char c : s) {
        out += c;
        if (c == '\'') {
            out += '\'';
        }
    }
    return out + "'";
}

std::string value(std::optional<double> v) {
    if (!v || !std::isfinite(*v)) {
        return "NaN";
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", *v);
    return buf;
}

/// The executable `name` in $PATH, or empty.
std::string findInPath(const char *name) {
    const char *path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
    std::istringstream in(dirs);
    for (std::string dir; std::getline(in, dir, ':');) {
        const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
        if (::access(candidate.c_str(), X_OK) == 0) {
            return candidate;
        }
    }
    return {};
}

bool isPng(const std::string &path, std::string *why) {
    static constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    std::ifstream in(path, std::ios::binary);
    unsigned char head[8] = {};
    if (!in.read(reinterpret_cast<char *>(head), sizeof head)) {
        *why = "gnuplot wrote no PNG";
        return false;
    }
    if (std::memcmp(head, kSignature, sizeof head) != 0) {
        *why = "gnuplot's output is not a PNG";
        return false;
    }
    return true;
}

/// Runs `gnuplot` with `script` on its stdin; its stdout and stderr come back in *output.
/// False with the reason when it could not run, failed or took too long.
bool runGnuplot(const std::string &gnuplot, const std::string &script, std::string *output,
                std::string *why) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) {
        *why = std::string("pipe: ") + std::strerror(errno);
        return false;
    }
    if (::pipe2(out, O_CLOEXEC) != 0) {
        *why = std::string("pipe: ") + std::strerror(errno);
        ::close(in[0]);
        ::close(in[1]);
        return false;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, out[1], 2);
    char *argv[] = {const_cast<char *>("gnuplot"), nullptr};
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, gnuplot.c_str(), &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    if (rc != 0) {
        ::close(in[1]);
        ::close(out[0]);
        *why = "cannot run " + gnuplot + ": " + std::strerror(rc);
        return false;
    }
    // Feed the script and read what it says at the same time (poll), so neither side can fill a
    // pipe and wait on the other.
    size_t fed = 0;
    int to = in[1];
    const auto deadline = std::chrono::steady_clock::now() + kGnuplotTimeout;
    bool timed_out = false;
    for (;;) {
        if (to >= 0 && fed == script.size()) {
            ::close(to);
            to = -1;
        }
        pollfd p[2] = {{out[0], POLLIN, 0}, {to, POLLOUT, 0}};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        const int n = ::poll(p, to >= 0 ? 2 : 1, static_cast<int>(left));
        if (n < 0 && errno != EINTR) {
            break;
        }
        if (n <= 0) {
            continue;
        }
        if (to >= 0 && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            const ssize_t w = ::write(to, script.data() + fed, script.size() - fed);
            if (w > 0) {
                fed += static_cast<size_t>(w);
            } else if (w < 0 && errno != EINTR && errno != EAGAIN) {
                fed = script.size();  // gnuplot stopped reading (it failed; its output says why)
            }
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            char buf[4096];
            const ssize_t r = ::read(out[0], buf, sizeof buf);
            if (r > 0) {
                if (output->size() < 64 * 1024) {
                    output->append(buf, static_cast<size_t>(r));
                }
            } else if (r == 0 || errno != EINTR) {
                break;  // gnuplot closed its output: it is exiting
            }
        }
    }
    if (to >= 0) {
        ::close(to);
    }
    ::close(out[0]);
    if (timed_out) {
        ::kill(pid, SIGKILL);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (timed_out) {
        *why = "gnuplot took longer than 30 s and was stopped";
        return false;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        *why = "gnuplot failed";
        return false;
    }
    return true;
}

}  // namespace

std::string chartPath(const std::string &chart, const std::string &csv) {
    if (!chart.empty()) {
        return chart;
    }
    if (csv.empty() || csv == "-") {
        return {};
    }
    std::filesystem::path p(csv);
    if (p.extension() == ".csv") {
        p.replace_extension(".png");
        return p.string();
    }
    return csv + ".png";
}

std::string gnuplotScript(const std::string &png_path, const RunInfo &info,
                          const std::vector<SizeResult> &results) {
    const bool any_bw = std::any_of(results.begin(), results.end(), [](auto &r) { return r.bw; });
    const bool any_lat = std::any_of(results.begin(), results.end(), [](auto &r) { return r.lat; });
    const bool tcp_bw =
        std::any_of(results.begin(), results.end(), [](auto &r) { return r.tcp_bw; });
    const bool tcp_lat =
        std::any_of(results.begin(), results.end(), [](auto &r) { return r.tcp_lat; });
    const int panels = (any_bw ? 1 : 0) + (any_lat ? 1 : 0);

    std::ostringstream s;
    s << "set terminal pngcairo size " << (panels > 1 ? 1400 : 800)
      << ",560 enhanced font 'sans,10'\n";
    s << "set output " << quoted(png_path) << "\n";
    // Columns: bytes, bw, tcp bw, lat p50, lat p99, tcp p50, tcp p99 (NaN: not measured).
    s << "$data << EOD\n";
    for (const SizeResult &r : results) {
        s << r.bytes << " " << value(r.bw ? std::optional(r.bw->gbps()) : std::nullopt) << " "
          << value(r.tcp_bw ? std::optional(r.tcp_bw->gbps()) : std::nullopt) << " "
          << value(r.lat ? std::optional(r.lat->p50_us) : std::nullopt) << " "
          << value(r.lat ? std::optional(r.lat->p99_us) : std::nullopt) << " "
          << value(r.tcp_lat ? std::optional(r.tcp_lat->p50_us) : std::nullopt) << " "
          << value(r.tcp_lat ? std::optional(r.tcp_lat->p99_us) : std::nullopt) << "\n";
    }
    s << "EOD\n";
    std::string title = "tensorlane bench: " + info.local_node + " -> " + info.peer_node + " (" +
                        info.mode + "), " + info.date + ", " + info.host;
    // Enhanced text: _ and ^ would become sub/superscripts; a backslash (literal inside a
    // single-quoted string) makes them plain.
    std::string plain;
    for (char c : title) {
        if (c == '_' || c == '^' || c == '@' || c == '&' || c == '{' || c == '}' || c == '~') {
            plain += '\\';
        }
        plain += c;
    }
    s << "set multiplot layout 1," << std::max(panels, 1) << " title " << quoted(plain) << "\n";
    s << "set logscale x 2\nset format x '%.0b%B'\nset xlabel 'write size (bytes)'\n"
         "set grid\nset key top left\nset datafile missing 'NaN'\n";
    if (any_bw) {
        s << "set title 'write bandwidth'\nset ylabel 'GB/s'\nset yrange [0:*]\n";
        s << "plot $data using 1:2 with linespoints lw 2 pt 7 title 'through the sidecars'";
        if (tcp_bw) {
            s << ", $data using 1:3 with linespoints lw 2 pt 5 dt 2 title 'plain TCP (one stream)'";
        }
        s << "\n";
    }
    if (any_lat) {
        s << "set title 'round-trip latency'\nset ylabel 'microseconds'\n"
             "set logscale y 10\nset yrange [*:*]\n";
        s << "plot $data using 1:4 with linespoints lw 2 pt 7 title 'sidecars p50', "
             "$data using 1:5 with linespoints lw 1 pt 6 title 'sidecars p99'";
        if (tcp_lat) {
            s << ", $data using 1:6 with linespoints lw 2 pt 5 dt 2 title 'plain TCP p50', "
                 "$data using 1:7 with linespoints lw 1 pt 4 dt 2 title 'plain TCP p99'";
        }
        s << "\n";
    }
    s << "unset multiplot\nset output\n";
    return s.str();
}

ChartOutcome writeChart(const std::string &png_path, const RunInfo &info,
                        const std::vector<SizeResult> &results) {
    ChartOutcome o;
    if (std::none_of(results.begin(), results.end(), [](auto &r) { return r.bw || r.lat; })) {
        o.message = "no chart: nothing was measured";
        return o;
    }
    const std::string gnuplot = findInPath("gnuplot");
    if (gnuplot.empty()) {
        o.message =
            "no chart: gnuplot is not installed (apt-get install gnuplot-nox, or "
            "scripts/install-deps.sh); the numbers are in the table above";
        return o;
    }
    // A temporary name in the same directory: rename() then replaces the file whole.
    const std::string tmp = png_path + ".tmp." + std::to_string(::getpid());
    std::string output, why;
    if (!runGnuplot(gnuplot, gnuplotScript(tmp, info, results), &output, &why) ||
        !isPng(tmp, &why)) {
        ::unlink(tmp.c_str());
        while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) {
            output.pop_back();
        }
        o.message = "no chart: " + why + (output.empty() ? "" : ": " + output);
        return o;
    }
    if (::rename(tmp.c_str(), png_path.c_str()) != 0) {
        o.message = "no chart: cannot write " + png_path + ": " + std::strerror(errno);
        ::unlink(tmp.c_str());
        return o;
    }
    o.written = true;
    o.message = "chart: " + png_path;
    return o;
}

}  // namespace tensorlane::tools::bench
