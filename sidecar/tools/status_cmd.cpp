#include "status_cmd.hpp"

#include <poll.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tensorlane/config/config.hpp"
#include "tensorlane/tensorlane.h"

namespace tensorlane::tools {

namespace {

using Json = nlohmann::json;

struct StatusOptions {
    std::string socket;
    std::string config_path;
    bool json = false;
    bool watch = false;
    double interval_s = 2.0;
    uint64_t count = 0;  ///< --watch: stop after this many refreshes; 0: until q or Ctrl-C
};

/// The socket to talk to: --socket, else the config's [node] socket, else the shim's default.
std::string resolveSocket(const std::string &socket, const std::string &config_path) {
    if (!socket.empty()) {
        return socket;
    }
    if (!config_path.empty()) {
        auto parsed = config::parseFile(config_path, {.check_key_file = false});
        if (parsed.ok()) {
            return parsed.config->node.socket;
        }
    }
    return {};
}

std::string wallClockText() {
    char buf[32];
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    ::localtime_r(&now, &tm);
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

struct ClientCloser {
    void operator()(tl_client *c) const { tl_disconnect(c); }
};
using ClientPtr = std::unique_ptr<tl_client, ClientCloser>;

/// One connection to the sidecar, made again after it failed (the sidecar restarted).
class StatusSource {
public:
    explicit StatusSource(std::string socket) : socket_(std::move(socket)) {}

    /// The status document's text; false with the reason in *error.
    bool fetch(std::string *out, std::string *error) {
        if (!client_) {
            tl_client *c = nullptr;
            tl_status s = tl_connect(socket_.empty() ? nullptr : socket_.c_str(), &c);
            if (s != TL_OK) {
                *error = std::string(tl_status_str(s)) + ": " + tl_last_error();
                return false;
            }
            client_.reset(c);
        }
        std::string buf(1 << 20, '\0');
        size_t len = 0;
        for (;;) {
            tl_status s = tl_sidecar_status(client_.get(), buf.data(), buf.size(), &len);
            if (s != TL_OK) {
                *error = std::string(tl_status_str(s)) + ": " + tl_last_error();
                client_.reset();
                return false;
            }
            if (len < buf.size()) {
                break;
            }
            buf.assign(len + 1, '\0');  // hundreds of peers: all of it, however long
        }
        buf.resize(len);
        *out = std::move(buf);
        return true;
    }

private:
    std::string socket_;
    ClientPtr client_;
};

/// A write rate in decimal units, as `tensorlane bench` prints them (GB/s is 1e9 bytes a
/// second), so that the two can be compared at a glance.
std::string humanRate(double b) {
    static constexpr const char *kUnits[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
    int u = 0;
    while (b >= 1000 && u < 4) {
        b /= 1000;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, kUnits[u]);
    return buf;
}

double num(const Json &j, const char *key) {
    auto it = j.is_object() ? j.find(key) : j.end();
    return j.is_object() && it != j.end() && it->is_number() ? it->get<double>() : 0;
}

std::string text(const Json &j, const char *key, const char *dflt = "?") {
    auto it = j.is_object() ? j.find(key) : j.end();
    return j.is_object() && it != j.end() && it->is_string() ? it->get<std::string>() : dflt;
}

/// How a peer's state reads for people: "down" of a peer no session was ever tried with is
/// "not connected yet" (sessions start at the first lookup or write, or at start with
/// connect_eagerly), and a failed one says why.
std::string peerStateText(const Json &p) {
    const std::string state = text(p, "state");
    const std::string why = text(p, "last_error", "");
    if (state == "down" && num(p, "failures") == 0 && why.empty()) {
        return "not connected yet (the first lookup or write connects)";
    }
    return why.empty() || state == "up" ? state : state + " (" + why + ")";
}

/// Bytes written per session at the previous refresh, for the rates.
using ClientBytes = std::map<uint64_t, double>;

ClientBytes clientBytes(const Json &j) {
    ClientBytes out;
    if (j.contains("clients") && j["clients"].is_array()) {
        for (const auto &c : j["clients"]) {
            out[static_cast<uint64_t>(num(c, "session"))] = num(c, "bytes_written");
        }
    }
    return out;
}

/// The verbs details of one peer: device, GID, and per direction the QPs with their states,
/// the traffic class and MTU, writes and errors; then the NIC's retransmission counters.
void formatVerbsPeer(std::ostringstream &os, const Json &p) {
    os << "    " << text(p, "device") << " port " << static_cast<int>(num(p, "port"))
       << ", GID index " << static_cast<int>(num(p, "gid_index")) << " (" << text(p, "gid")
       << ")\n";
    for (const char *side : {"send", "receive"}) {
        if (!p.contains(side) || !p[side].is_object()) {
            continue;
        }
        const Json &s = p[side];
        os << "    " << side << ": traffic class " << static_cast<int>(num(s, "traffic_class"))
           << ", path MTU " << static_cast<int>(num(s, "path_mtu")) << ", QPs";
        if (s.contains("qps") && s["qps"].is_array()) {
            for (const auto &q : s["qps"]) {
                os << " " << text(q, "qpn") << " " << text(q, "state");
            }
        }
        if (std::string(side) == "send") {
            os << "; " << static_cast<uint64_t>(num(s, "writes_completed")) << " writes, "
               << static_cast<uint64_t>(num(s, "in_flight")) << " in flight, "
               << static_cast<uint64_t>(num(s, "errors")) << " errors\n";
        } else {
            os << "; " << static_cast<uint64_t>(num(s, "writes_received")) << " writes received, "
               << static_cast<uint64_t>(num(s, "dropped")) << " dropped, "
               << static_cast<uint64_t>(num(s, "gdr_flushes")) << " GDR flushes\n";
        }
    }
    if (const auto forced = static_cast<uint64_t>(num(p, "revocations_forced")); forced != 0) {
        os << "    " << forced
           << " revocation(s) not confirmed in time: the key was revoked anyway\n";
    }
    if (p.contains("nic_counters") && p["nic_counters"].is_object() && !p["nic_counters"].empty()) {
        os << "    NIC counters:";
        for (const auto &[k, v] : p["nic_counters"].items()) {
            os << " " << k << "=" << v;
        }
        os << "\n";
    }
    if (!text(p, "last_event", "").empty()) {
        os << "    last async event: " << text(p, "last_event") << " ("
           << static_cast<uint64_t>(num(p, "async_events")) << " in all)\n";
    }
}

/// The status for people. With `prev` (the last refresh, `dt_s` ago) each client also shows
/// its write rate.
/// The cluster directory's lines (issue 23), kept apart from the rest of the layout: nothing
/// for a static ([[peers]]) node.
void formatDirectory(std::ostringstream &os, const Json &j) {
    if (!j.contains("directory") || !j["directory"].is_object()) {
        return;
    }
    const Json &d = j["directory"];
    if (text(d, "kind", "static") == "static") {
        return;
    }
    os << "directory: etcd " << text(d, "endpoint") << " cluster " << text(d, "cluster") << " "
       << text(d, "state") << (d.value("registered", false) ? ", registered" : ", not registered")
       << ", " << static_cast<uint64_t>(num(d, "nodes")) << " nodes, revision "
       << static_cast<uint64_t>(num(d, "revision")) << "\n";
    os << "  joined " << static_cast<uint64_t>(num(d, "joined")) << ", left "
       << static_cast<uint64_t>(num(d, "left")) << ", restarts "
       << static_cast<uint64_t>(num(d, "restarts")) << ", refused "
       << static_cast<uint64_t>(num(d, "refused")) << ", reconnects "
       << static_cast<uint64_t>(num(d, "reconnects")) << "\n";
    if (text(d, "state", "") == "down") {
        os << "  down for " << num(d, "down_for_s") << " s: " << text(d, "last_error", "") << "\n";
    }
    if (!text(d, "last_refusal", "").empty()) {
        os << "  last refusal: " << text(d, "last_refusal", "") << "\n";
    }
}

std::string formatStatus(const Json &j, const ClientBytes *prev, double dt_s) {
    std::ostringstream os;
    os << "node " << text(j, "node") << " (socket " << text(j, "socket") << ", poll mode "
       << text(j, "poll_mode") << ", up " << static_cast<int64_t>(num(j, "uptime_s")) << " s)\n";
    os << "regions " << static_cast<uint64_t>(num(j, "regions")) << ", registered bytes "
       << static_cast<uint64_t>(num(j, "registered_bytes")) << "\n";
    os << "clients:\n";
    const Json empty = Json::array();
    const Json &clients = j.contains("clients") && j["clients"].is_array() ? j["clients"] : empty;
    // This command is a client too; its own session is no news to the person who ran it.
    const auto self = static_cast<double>(::getpid());
    size_t shown = 0;
    for (const auto &cl : clients) {
        shown += num(cl, "pid") != self ? 1 : 0;
    }
    if (shown == 0) {
        os << "  (none connected)\n";
    }
    for (const auto &cl : clients) {
        if (num(cl, "pid") == self) {
            continue;
        }
        const auto session = static_cast<uint64_t>(num(cl, "session"));
        os << "  session " << session << " pid " << static_cast<int64_t>(num(cl, "pid")) << " uid "
           << static_cast<int64_t>(num(cl, "uid")) << ": "
           << static_cast<uint64_t>(num(cl, "regions")) << " regions, "
           << static_cast<uint64_t>(num(cl, "requests")) << " requests, "
           << static_cast<uint64_t>(num(cl, "rejected")) << " rejected, "
           << static_cast<uint64_t>(num(cl, "bytes_written")) << " bytes written";
        if (prev != nullptr && dt_s > 0) {
            auto it = prev->find(session);
            const double before = it == prev->end() ? 0 : it->second;
            const double rate = std::max(0.0, num(cl, "bytes_written") - before) / dt_s;
            os << ", " << humanRate(rate);
        }
        os << "\n";
    }
    os << "peers:\n";
    const Json &peers = j.contains("peers") && j["peers"].is_array() ? j["peers"] : empty;
    if (peers.empty()) {
        os << "  (none configured)\n";
    }
    for (const auto &p : peers) {
        os << "  " << text(p, "name") << " " << text(p, "address", "") << " via "
           << text(p, "transport") << ": " << peerStateText(p) << "\n";
        if (text(p, "transport", "") == "verbs") {
            formatVerbsPeer(os, p);
        }
    }
    formatDirectory(os, j);
    os << "counters:\n";
    if (j.contains("counters") && j["counters"].is_object()) {
        for (const auto &[k, v] : j["counters"].items()) {
            os << "  " << k << " = " << v << "\n";
        }
    }
    return os.str();
}

/// What --json prints when the sidecar cannot be asked: one object, as each refresh of
/// `--watch --json` does.
std::string unreachableJson(const std::string &error, const std::string &socket) {
    return Json{{"error", error},
                {"socket", socket.empty() ? "(default)" : socket},
                {"time", wallClockText()}}
        .dump();
}

int once(const StatusOptions &o, const std::string &socket) {
    StatusSource src(socket);
    std::string doc, error;
    if (!src.fetch(&doc, &error)) {
        if (o.json) {
            std::cout << unreachableJson(error, socket) << "\n";
        }
        std::cerr << "tensorlane status: " << error << "\n";
        return 1;
    }
    if (o.json) {
        std::cout << doc << "\n";
        return 0;
    }
    const Json j = Json::parse(doc, nullptr, false);
    std::cout << (j.is_object() ? formatStatus(j, nullptr, 0) : doc + "\n");
    return 0;
}

// ---- --watch ----

volatile sig_atomic_t g_stop = 0;

void onStopSignal(int) {
    g_stop = 1;
}

/// The terminal while watching: the alternate screen (as top), no cursor, keys read one at a
/// time without echo. Put back on every way out.
class TerminalGuard {
public:
    TerminalGuard(bool screen, bool keys) : screen_(screen) {
        if (keys && ::tcgetattr(0, &saved_) == 0) {
            termios raw = saved_;
            raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);  // ISIG stays: Ctrl-C works
            raw.c_cc[VMIN] = 0;
            raw.c_cc[VTIME] = 0;
            keys_ = ::tcsetattr(0, TCSANOW, &raw) == 0;
        }
        if (screen_) {
            std::fputs("\033[?1049h\033[?25l", stdout);
            std::fflush(stdout);
        }
    }
    ~TerminalGuard() {
        if (screen_) {
            std::fputs("\033[?25h\033[?1049l", stdout);
            std::fflush(stdout);
        }
        if (keys_) {
            ::tcsetattr(0, TCSANOW, &saved_);
        }
    }
    TerminalGuard(const TerminalGuard &) = delete;
    TerminalGuard &operator=(const TerminalGuard &) = delete;
    bool keys() const { return keys_; }

private:
    bool screen_;
    bool keys_ = false;
    termios saved_{};
};

/// Writes all of `s` to stdout; false when stdout is gone (a closed pipe).
bool emit(const std::string &s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    return std::fflush(stdout) == 0 && !std::ferror(stdout);
}

/// Waits up to `seconds` for q (true: quit) while watching the stop flag.
bool waitOrQuit(double seconds, bool keys) {
    using Clock = std::chrono::steady_clock;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (!g_stop) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
        if (left <= 0) {
            return false;
        }
        pollfd p{0, POLLIN, 0};
        const int n = ::poll(&p, keys ? 1 : 0, static_cast<int>(left));
        if (n > 0 && (p.revents & POLLIN)) {
            char c[64];
            const ssize_t r = ::read(0, c, sizeof c);
            for (ssize_t i = 0; i < r; ++i) {
                if (c[i] == 'q' || c[i] == 'Q') {
                    return true;
                }
            }
            if (r == 0) {
                keys = false;  // stdin closed: only signals end the watch now
            }
        } else if (n > 0) {
            keys = false;  // POLLHUP/POLLERR on stdin
        }
    }
    return true;
}

int watch(const StatusOptions &o, const std::string &socket) {
    struct sigaction sa {};
    sa.sa_handler = onStopSignal;  // no SA_RESTART: poll() returns at once with EINTR
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);  // a closed pipe is a write error, then a clean exit
    const bool tty = ::isatty(1) == 1;
    // On a terminal: redraw in place. Elsewhere (a pipe, a file, a log): successive snapshots,
    // each under a line with the time; with --json one object per line.
    const bool redraw = tty && !o.json;
    TerminalGuard term(redraw, redraw && ::isatty(0) == 1);

    StatusSource src(socket);
    bool last_ok = false;
    bool quit = false;  // q, Ctrl-C or SIGTERM
    ClientBytes prev;
    bool have_prev = false;
    auto prev_time = std::chrono::steady_clock::now();
    char interval[32];
    std::snprintf(interval, sizeof interval, "%g", o.interval_s);
    for (uint64_t n = 0; !g_stop && (o.count == 0 || n < o.count); ++n) {
        if (n > 0 && waitOrQuit(o.interval_s, term.keys())) {
            quit = true;
            break;
        }
        std::string doc, error;
        const bool ok = src.fetch(&doc, &error);
        last_ok = ok;
        const auto now = std::chrono::steady_clock::now();
        std::string out;
        if (o.json) {
            const Json j = ok ? Json::parse(doc, nullptr, false) : Json();
            out = ok && j.is_object()
                      ? j.dump() + "\n"
                      : unreachableJson(ok ? "unparsable status" : error, socket) + "\n";
        } else {
            std::string body;
            if (!ok) {
                body = "sidecar not reachable: " + error + " (retrying)\n";
                have_prev = false;
            } else if (const Json j = Json::parse(doc, nullptr, false); j.is_object()) {
                const double dt = std::chrono::duration<double>(now - prev_time).count();
                body = formatStatus(j, have_prev ? &prev : nullptr, dt);
                prev = clientBytes(j);
                have_prev = true;
            } else {
                body = doc + "\n";
            }
            prev_time = now;
            const std::string head = "tensorlane status, every " + std::string(interval) + " s, " +
                                     wallClockText() + (redraw ? " (q or Ctrl-C quits)" : "") +
                                     "\n";
            if (redraw) {
                // Home, each line cleared to its end, then the rest of the screen: no flicker.
                out = "\033[H";
                std::istringstream lines(head + body);
                for (std::string line; std::getline(lines, line);) {
                    out += line + "\033[K\n";
                }
                out += "\033[J";
            } else {
                out = (n > 0 ? "\n" : "") + head + body;
            }
        }
        if (!emit(out)) {
            return 0;  // the reader went away (| head): that is the end of the watch
        }
    }
    // --count N is a script's way to take N snapshots: as without --watch, it fails when the
    // last one could not reach the sidecar. q or Ctrl-C is a person ending it: 0.
    return o.count != 0 && !last_ok && !quit && !g_stop ? 1 : 0;
}

int runStatus(const StatusOptions &o) {
    const std::string socket = resolveSocket(o.socket, o.config_path);
    return o.watch ? watch(o, socket) : once(o, socket);
}

}  // namespace

void addStatusCommand(CLI::App &app, std::function<int()> *run) {
    auto o = std::make_shared<StatusOptions>();
    auto *st = app.add_subcommand(
        "status",
        "ask a running sidecar for its state and counters: clients, regions, registered bytes, "
        "peers with their state and transport");
    st->add_option("--socket", o->socket, "the sidecar's socket (default: $TENSORLANE_SOCKET)");
    st->add_option("--config", o->config_path, "read the socket path from this config");
    st->add_flag("--json", o->json, "print JSON (with --watch: one object per line)");
    auto *w = st->add_flag("--watch", o->watch,
                           "refresh like top until q or Ctrl-C; when stdout is not a terminal, "
                           "print one snapshot per refresh");
    st->add_option("--interval", o->interval_s, "--watch: seconds between refreshes")
        ->check(CLI::Range(0.1, 3600.0))
        ->needs(w)
        ->capture_default_str();
    st->add_option("--count", o->count, "--watch: stop after N refreshes (default: never)")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40))
        ->needs(w);
    st->footer(
        "Exit status: 0, or 1 when the sidecar cannot be reached (with --watch --count N: at "
        "the last refresh). With --json an unreachable sidecar is an object with \"error\".");
    st->callback([run, o] { *run = [o] { return runStatus(*o); }; });
}

}  // namespace tensorlane::tools
