// tensorlane: the operator's command line (status, bench, diag).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench.hpp"
#include "diag_cmd.hpp"
#include "keygen_cmd.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/tensorlane.h"

namespace {

/// The socket to talk to: --socket, else the config's [node] socket, else the shim's default.
std::string resolveSocket(const std::string &socket, const std::string &config_path) {
    if (!socket.empty()) {
        return socket;
    }
    if (!config_path.empty()) {
        auto parsed = tensorlane::config::parseFile(config_path, {.check_key_file = false});
        if (parsed.ok()) {
            return parsed.config->node.socket;
        }
    }
    return {};
}

/// The verbs details of one peer: device, GID, and per direction the QPs with their states,
/// the traffic class and MTU, writes and errors; then the NIC's retransmission counters.
void printVerbsPeer(const nlohmann::json &p) {
    std::cout << "    " << p.value("device", "?") << " port " << p.value("port", 0)
              << ", GID index " << p.value("gid_index", 0) << " (" << p.value("gid", "?") << ")\n";
    for (const char *side : {"send", "receive"}) {
        if (!p.contains(side) || !p[side].is_object()) {
            continue;
        }
        const auto &s = p[side];
        std::cout << "    " << side << ": traffic class " << s.value("traffic_class", 0)
                  << ", path MTU " << s.value("path_mtu", 0) << ", QPs";
        for (const auto &q : s.value("qps", nlohmann::json::array())) {
            std::cout << " " << q.value("qpn", "?") << " " << q.value("state", "?");
        }
        if (std::string(side) == "send") {
            std::cout << "; " << s.value("writes_completed", 0) << " writes, "
                      << s.value("in_flight", 0) << " in flight, " << s.value("errors", 0)
                      << " errors\n";
        } else {
            std::cout << "; " << s.value("writes_received", 0) << " writes received, "
                      << s.value("dropped", 0) << " dropped\n";
        }
    }
    if (p.contains("nic_counters") && !p["nic_counters"].empty()) {
        std::cout << "    NIC counters:";
        for (const auto &[k, v] : p["nic_counters"].items()) {
            std::cout << " " << k << "=" << v;
        }
        std::cout << "\n";
    }
    if (!p.value("last_event", "").empty()) {
        std::cout << "    last async event: " << p.value("last_event", "") << " ("
                  << p.value("async_events", 0) << " in all)\n";
    }
}

int status(const std::string &socket, bool json) {
    tl_client *c = nullptr;
    tl_status s = tl_connect(socket.empty() ? nullptr : socket.c_str(), &c);
    if (s != TL_OK) {
        std::cerr << "tensorlane status: " << tl_status_str(s) << ": " << tl_last_error() << "\n";
        return 1;
    }
    std::string buf(1 << 16, '\0');
    size_t len = 0;
    s = tl_sidecar_status(c, buf.data(), buf.size(), &len);
    tl_disconnect(c);
    if (s != TL_OK) {
        std::cerr << "tensorlane status: " << tl_status_str(s) << ": " << tl_last_error() << "\n";
        return 1;
    }
    buf.resize(std::min(len, buf.size() - 1));
    if (json) {
        std::cout << buf << "\n";
        return 0;
    }
    auto j = nlohmann::json::parse(buf, nullptr, false);
    if (j.is_discarded()) {
        std::cout << buf << "\n";
        return 0;
    }
    std::cout << "node " << j.value("node", "?") << " (socket " << j.value("socket", "?")
              << ", poll mode " << j.value("poll_mode", "?") << ", up "
              << static_cast<int64_t>(j.value("uptime_s", 0.0)) << " s)\n";
    std::cout << "regions " << j.value("regions", 0) << ", registered bytes "
              << j.value("registered_bytes", 0) << "\n";
    std::cout << "clients:\n";
    for (const auto &cl : j["clients"]) {
        std::cout << "  session " << cl.value("session", 0) << " pid " << cl.value("pid", 0)
                  << " uid " << cl.value("uid", 0) << ": " << cl.value("regions", 0) << " regions, "
                  << cl.value("requests", 0) << " requests, " << cl.value("rejected", 0)
                  << " rejected, " << cl.value("bytes_written", 0) << " bytes written\n";
    }
    std::cout << "peers:\n";
    if (j["peers"].empty()) {
        std::cout << "  (none configured)\n";
    }
    for (const auto &p : j["peers"]) {
        std::cout << "  " << p.value("name", "?") << " " << p.value("address", "") << " "
                  << p.value("state", "?") << " via " << p.value("transport", "?") << "\n";
        if (p.value("transport", "") == "verbs") {
            printVerbsPeer(p);
        }
    }
    std::cout << "counters:\n";
    for (const auto &[k, v] : j["counters"].items()) {
        std::cout << "  " << k << " = " << v << "\n";
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    CLI::App app{"tensorlane: inspect and measure the tensorlane sidecars"};
    // At most one verb; none is answered below with the list of verbs (CLI11's own message,
    // "A subcommand is required", names none of them).
    app.require_subcommand(0, 1);
    app.footer("Run `tensorlane VERB --help` for what a verb takes.");

    std::string socket, config_path;
    bool json = false;
    auto *st = app.add_subcommand("status", "ask a running sidecar for its state and counters");
    st->add_option("--socket", socket, "the sidecar's socket (default: $TENSORLANE_SOCKET)");
    st->add_option("--config", config_path, "read the socket path from this config");
    st->add_flag("--json", json, "print JSON");

    std::function<int()> run_bench;
    tensorlane::tools::addBenchCommand(app, &run_bench);
    std::function<int()> run_diag;
    tensorlane::tools::addDiagCommand(app, &run_diag);
    tensorlane::tools::addKeygenCommand(app);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        // --help prints and exits 0; every usage error exits 2 (CLI11's own codes are > 100).
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (st->parsed()) {
        return status(resolveSocket(socket, config_path), json);
    }
    if (run_bench) {
        return run_bench();
    }
    if (run_diag) {
        return run_diag();
    }
    std::cerr << "tensorlane: a verb is required:";
    for (const CLI::App *sub : app.get_subcommands({})) {
        std::cerr << " " << sub->get_name();
    }
    std::cerr << "\nRun `tensorlane --help` or `tensorlane VERB --help` for more.\n";
    return 2;
}
